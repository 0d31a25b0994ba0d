//! Activities and compensation: retries with backoff on the manual clock, and a saga whose later
//! step fails runs its compensation (plain code after the error) exactly once.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Held, Log, harness, result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sundial_workflow::{
    ActivityError, RetryPolicy, WorkflowContext, WorkflowError, WorkflowStatus,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: String,
    amount: u64,
}

async fn saga(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
    let _: () = ctx.activity("reserve", &order).await?;
    match ctx
        .activity::<_, String>("charge", &order)
        .retry(RetryPolicy::fixed(3, Duration::from_secs(1)))
        .await
    {
        Ok(receipt) => Ok(receipt),
        Err(e) => {
            let _: () = ctx.activity("release", &order).await?;
            Err(WorkflowError::failed(format!("compensated: {e}")))
        }
    }
}

/// Registers the saga and its activities. `charge` fails permanently for amounts over 100, and
/// otherwise fails (retryably) on attempts below `succeed_on`.
fn setup(log: Log, succeed_on: u32) -> impl FnOnce(&sundial_workflow::Workflows) {
    move |w| {
        w.register("saga", saga).unwrap();
        let l = log.clone();
        w.register_activity("reserve", move |_ctx, o: Order| {
            let l = l.clone();
            async move {
                l.push(format!("reserve {}", o.id));
                Ok::<_, ActivityError>(())
            }
        })
        .unwrap();
        let l = log.clone();
        w.register_activity("charge", move |ctx, o: Order| {
            let l = l.clone();
            async move {
                l.push(format!("charge {} #{}", o.id, ctx.attempt()));
                if o.amount > 100 {
                    return Err(ActivityError::permanent("card declined"));
                }
                if ctx.attempt() < succeed_on {
                    return Err(ActivityError::retryable("gateway timeout"));
                }
                Ok(format!("receipt {}", o.id))
            }
        })
        .unwrap();
        let l = log;
        w.register_activity("release", move |_ctx, o: Order| {
            let l = l.clone();
            async move {
                l.push(format!("release {}", o.id));
                Ok::<_, ActivityError>(())
            }
        })
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_activity_succeeds_on_its_third_attempt() {
    let log = Log::default();
    let h = harness(setup(log.clone(), 3)).await;
    h.start("saga", "o1", json!({"id": "o1", "amount": 10}))
        .await;
    let done = h
        .advance_until("o1", Duration::from_secs(1), WorkflowStatus::Completed)
        .await;
    assert_eq!(result(&done), json!("receipt o1"));
    assert_eq!(
        log.all(),
        ["reserve o1", "charge o1 #1", "charge o1 #2", "charge o1 #3"]
    );
    // One activity_completed per step, whatever the attempts.
    let types = h.types("o1").await;
    assert_eq!(
        types.iter().filter(|t| **t == "activity_completed").count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_step_runs_the_compensation() {
    let log = Log::default();
    let h = harness(setup(log.clone(), 1)).await;
    h.start("saga", "o2", json!({"id": "o2", "amount": 500}))
        .await;
    let done = h.wait_status("o2", WorkflowStatus::Failed).await;
    let error = done.error.unwrap();
    assert!(error.contains("compensated"), "{error}");
    assert!(error.contains("\"charge\""), "{error}");
    assert!(error.contains("card declined"), "{error}");
    assert_eq!(log.all(), ["reserve o2", "charge o2 #1", "release o2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_run_the_compensation() {
    let log = Log::default();
    let h = harness(setup(log.clone(), 99)).await;
    h.start("saga", "o3", json!({"id": "o3", "amount": 10}))
        .await;
    let done = h
        .advance_until("o3", Duration::from_secs(1), WorkflowStatus::Failed)
        .await;
    let error = done.error.unwrap();
    assert!(error.contains("after 3 attempt(s)"), "{error}");
    assert!(error.contains("gateway timeout"), "{error}");
    assert_eq!(
        log.all(),
        [
            "reserve o3",
            "charge o3 #1",
            "charge o3 #2",
            "charge o3 #3",
            "release o3"
        ]
    );
}

/// An attempt that runs past its timeout counts as failed; after the last one the workflow
/// hears of the failure (the kernel's error), even though that attempt never returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_last_attempt_is_reported() {
    async fn wf(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
        match ctx
            .activity::<_, ()>("hang", &())
            .retry(RetryPolicy::fixed(2, Duration::from_secs(1)))
            .timeout(Duration::from_secs(5))
            .await
        {
            Ok(()) => Ok("finished".into()),
            Err(e) => Ok(format!("gave up: {e}")),
        }
    }
    let log = Log::default();
    let l = log.clone();
    let held = Held::default();
    let hold = held.clone();
    let h = harness(move |w| {
        w.register("wf", wf).unwrap();
        w.register_activity("hang", move |ctx, ()| {
            let l = l.clone();
            let hold = hold.hold();
            async move {
                let _hold = hold;
                l.push(format!("hang #{}", ctx.attempt()));
                std::future::pending::<()>().await;
                Ok::<_, ActivityError>(())
            }
        })
        .unwrap();
    })
    .await
    .holding(&held);
    h.start("wf", "t", json!(null)).await;
    for attempt in 1..=2 {
        h.until("the attempt hanging", || async {
            (held.count() == 1 && log.all().len() >= attempt).then_some(())
        })
        .await;
        assert_eq!(log.all().len(), attempt);
        // Past the attempt's timeout (once its run has ended), then past the retry delay.
        h.clock.advance(Duration::from_secs(5));
        h.until("the attempt timed out", || async {
            (held.count() == 0).then_some(())
        })
        .await;
        h.advance(Duration::from_secs(1)).await;
    }
    let done = h.wait_status("t", WorkflowStatus::Completed).await;
    let r = result(&done);
    let text = r.as_str().unwrap();
    assert!(text.starts_with("gave up"), "{text}");
    assert!(text.contains("timed out"), "{text}");
    assert_eq!(log.all(), ["hang #1", "hang #2"]);
}
