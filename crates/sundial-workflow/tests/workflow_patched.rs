//! Versioning with `patched`: code changed while a run is in flight replays the old run's history
//! on its old branch and runs new runs on the new one; the same change made without `patched` is
//! reported as non-deterministic at the event it contradicts.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Log, harness, result};
use serde_json::json;
use sundial_workflow::{
    ActivityError, Event, ReplayError, WorkflowContext, WorkflowError, WorkflowStatus, Workflows,
    replay_history,
};

const HOUR: Duration = Duration::from_secs(3600);

async fn v1(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    let _: () = ctx.activity("a", &()).await?;
    ctx.sleep(HOUR).await?;
    let _: () = ctx.activity("b", &()).await?;
    Ok("v1".into())
}

async fn v2(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    if ctx.patched("use-a2") {
        let _: () = ctx.activity("a2", &()).await?;
    } else {
        let _: () = ctx.activity("a", &()).await?;
    }
    ctx.sleep(HOUR).await?;
    let _: () = ctx.activity("b", &()).await?;
    Ok(if ctx.patched("use-a2") { "v2" } else { "v1" }.into())
}

/// v2 without the patch guard.
async fn v2_naive(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    let _: () = ctx.activity("a2", &()).await?;
    ctx.sleep(HOUR).await?;
    let _: () = ctx.activity("b", &()).await?;
    Ok("v2".into())
}

fn activities(w: &Workflows, log: &Log) {
    for name in ["a", "a2", "b"] {
        let log = log.clone();
        w.register_activity(name, move |ctx, ()| {
            log.push(format!("{name} {}", ctx.run_id()));
            std::future::ready(Ok::<_, ActivityError>(()))
        })
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patched_lets_old_histories_replay() {
    let log = Log::default();
    let h = harness(|w| {
        w.register("order", v1).unwrap();
        activities(w, &log);
    })
    .await;
    let old = h.start("order", "old", json!(null)).await;
    h.wait_events("old", "timer_started", 1).await;

    // Deploy v2 while `old` sleeps; start a new run on it.
    h.workflows.register("order", v2).unwrap();
    let new = h.start("order", "new", json!(null)).await;
    h.wait_events("new", "timer_started", 1).await;
    assert!(h.types("new").await.contains(&"patched"));

    // The naive change cannot replay the old run's history: it names the event it contradicts.
    let history = h.workflows.history(old.run_id).await.unwrap();
    let scheduled_a = history
        .iter()
        .find(|e| matches!(&e.event, Event::ActivityScheduled { name, .. } if name == "a"))
        .unwrap()
        .seq;
    match replay_history(v2_naive, &history) {
        Err(ReplayError::NonDeterminism { seq, message }) => {
            assert_eq!(seq, scheduled_a);
            assert!(message.contains("activity \"a\""), "{message}");
            assert!(message.contains("activity \"a2\""), "{message}");
        }
        other => panic!("expected non-determinism, got {other:?}"),
    }
    // v2 replays it on the old branch.
    let replayed = replay_history(v2, &history).unwrap();
    assert!(!replayed.finished);

    h.advance(HOUR).await;
    let old_done = h.wait_status("old", WorkflowStatus::Completed).await;
    let new_done = h.wait_status("new", WorkflowStatus::Completed).await;
    assert_eq!(result(&old_done), json!("v1"));
    assert_eq!(result(&new_done), json!("v2"));
    let mut runs = log.all();
    runs.sort();
    let mut expected = vec![
        format!("a {}", old.run_id),
        format!("b {}", old.run_id),
        format!("a2 {}", new.run_id),
        format!("b {}", new.run_id),
    ];
    expected.sort();
    assert_eq!(runs, expected);
}

/// A run whose code turns non-deterministic fails with the event and the mismatch named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_deterministic_change_fails_the_run_naming_the_event() {
    let log = Log::default();
    let h = harness(|w| {
        w.register("order", v1).unwrap();
        activities(w, &log);
    })
    .await;
    h.start("order", "x", json!(null)).await;
    h.wait_events("x", "timer_started", 1).await;
    h.workflows.register("order", v2_naive).unwrap();
    h.advance(HOUR).await;
    let failed = h.wait_status("x", WorkflowStatus::Failed).await;
    let error = failed.error.unwrap();
    assert!(
        error.starts_with("non-deterministic workflow at event 2:"),
        "{error}"
    );
    assert!(error.contains("activity \"a\" (command 0)"), "{error}");
    assert!(error.contains("activity \"a2\" (command 0)"), "{error}");
    // The activity b never ran.
    assert_eq!(log.all().len(), 1);
}
