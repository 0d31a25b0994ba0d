//! Cancellation on the manual clock: during a sleep (the timer is removed) and during an activity
//! (the running in-process attempt is interrupted and its kernel task cancelled); in both the
//! workflow's compensation runs and the run ends `cancelled`. Terminate ends a run without
//! running workflow code.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{DAY, Held, Log, harness};
use serde_json::json;
use sundial::TaskState;
use sundial_workflow::{ActivityError, Event, WorkflowContext, WorkflowError, WorkflowStatus};

async fn undo_on_cancel(ctx: &WorkflowContext, e: WorkflowError) -> WorkflowError {
    if e.is_cancelled()
        && ctx.is_cancel_requested()
        && let Err(u) = ctx.activity::<_, ()>("undo", &()).await
    {
        return u;
    }
    e
}

async fn sleepy(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    match ctx.sleep(7 * DAY).await {
        Ok(()) => Ok("woke".into()),
        Err(e) => Err(undo_on_cancel(&ctx, e).await),
    }
}

async fn busy(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    match ctx.activity::<_, String>("slow", &()).await {
        Ok(s) => Ok(s),
        Err(e) => Err(undo_on_cancel(&ctx, e).await),
    }
}

fn undo(
    log: &Log,
) -> impl Fn(sundial_workflow::ActivityContext, ()) -> std::future::Ready<Result<(), ActivityError>>
+ Send
+ Sync
+ 'static {
    let log = log.clone();
    move |_ctx, ()| {
        log.push("undo");
        std::future::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_sleep_removes_the_timer_and_compensates() {
    let log = Log::default();
    let h = harness(|w| {
        w.register("sleepy", sleepy).unwrap();
        w.register_activity("undo", undo(&log)).unwrap();
    })
    .await;
    h.start("sleepy", "s", json!(null)).await;
    h.wait_events("s", "timer_started", 1).await;
    h.workflows
        .cancel("s", Some("customer asked".into()))
        .await
        .unwrap();
    // Asking twice is a no-op.
    h.workflows.cancel("s", None).await.unwrap();
    let done = h.wait_status("s", WorkflowStatus::Cancelled).await;
    assert!(done.error.unwrap().contains("timer cancelled"));
    assert_eq!(log.all(), ["undo"]);
    let history = h.history("s").await;
    let timer = history
        .iter()
        .find_map(|e| match &e.event {
            Event::TimerStarted { task, .. } => Some(*task),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        h.sundial.get(timer).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    let types: Vec<&str> = history.iter().map(|e| e.event.type_name()).collect();
    assert_eq!(
        types.iter().filter(|t| **t == "cancel_requested").count(),
        1
    );
    assert!(types.contains(&"timer_cancelled"), "{types:?}");
    assert_eq!(types.last(), Some(&"workflow_cancelled"));
    // A closed workflow cannot be cancelled again.
    assert!(
        h.workflows
            .cancel("s", None)
            .await
            .unwrap_err()
            .is_conflict()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_activity_interrupts_it_and_compensates() {
    let log = Log::default();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let interrupted = Arc::new(AtomicBool::new(false));
    let seen = interrupted.clone();
    let held = Held::default();
    let hold = held.clone();
    let h = harness(|w| {
        w.register("busy", busy).unwrap();
        w.register_activity("undo", undo(&log)).unwrap();
        w.register_activity("slow", move |_ctx, ()| {
            let started = started_tx.clone();
            let seen = seen.clone();
            let hold = hold.hold();
            async move {
                let _hold = hold;
                struct Guard(Arc<AtomicBool>);
                impl Drop for Guard {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let _guard = Guard(seen);
                let _ = started.send(());
                std::future::pending::<()>().await;
                Ok::<_, ActivityError>("never".to_string())
            }
        })
        .unwrap();
    })
    .await
    .holding(&held);
    h.start("busy", "b", json!(null)).await;
    h.until("the activity started", || {
        std::future::ready(started_rx.try_recv().ok())
    })
    .await;
    assert!(!interrupted.load(Ordering::SeqCst));
    h.workflows.cancel("b", None).await.unwrap();
    let done = h.wait_status("b", WorkflowStatus::Cancelled).await;
    assert!(done.error.unwrap().contains("activity \"slow\" cancelled"));
    assert!(
        interrupted.load(Ordering::SeqCst),
        "the attempt was not interrupted"
    );
    assert_eq!(log.all(), ["undo"]);
    let history = h.history("b").await;
    let slow = history
        .iter()
        .find_map(|e| match &e.event {
            Event::ActivityScheduled { name, task, .. } if name == "slow" => Some(*task),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        h.sundial.get(slow).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
    assert!(
        history
            .iter()
            .any(|e| matches!(e.event, Event::ActivityCancelRequested { cmd: 0, .. }))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_runs_no_workflow_code() {
    let log = Log::default();
    let h = harness(|w| {
        w.register("sleepy", sleepy).unwrap();
        w.register_activity("undo", undo(&log)).unwrap();
    })
    .await;
    h.start("sleepy", "t", json!(null)).await;
    h.wait_events("t", "timer_started", 1).await;
    let run = h.workflows.terminate("t", "operator").await.unwrap();
    assert_eq!(run.status, WorkflowStatus::Terminated);
    assert_eq!(run.error.as_deref(), Some("operator"));
    h.advance(8 * DAY).await;
    assert!(log.all().is_empty());
    assert_eq!(h.types("t").await.last(), Some(&"workflow_terminated"));
    let err = h.workflows.terminate("t", "again").await.unwrap_err();
    assert!(err.is_conflict());
}
