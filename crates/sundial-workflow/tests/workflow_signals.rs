//! Signals with a timeout, on the manual clock: a signal sent before the workflow waits is
//! buffered (no timer is even started), one sent during the wait wins and cancels the timer, and
//! after the timeout the wait yields `None` and the closed workflow refuses further signals.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{MIN, harness, result};
use serde_json::json;
use sundial::TaskState;
use sundial_workflow::{Event, WorkflowContext, WorkflowError, WorkflowStatus};

/// Sleeps a minute, then waits up to `timeout_min` minutes for `paid`.
async fn payment(ctx: WorkflowContext, timeout_min: u64) -> Result<String, WorkflowError> {
    ctx.sleep(MIN).await?;
    match ctx
        .signal::<u32>("paid")
        .timeout(Duration::from_secs(timeout_min * 60))
        .await?
    {
        Some(amount) => Ok(format!("paid {amount}")),
        None => Ok("timed out".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_before_the_wait_is_buffered() {
    let h = harness(|w| w.register("payment", payment).unwrap()).await;
    h.start("payment", "p", json!(30)).await;
    h.wait_events("p", "timer_started", 1).await;
    h.workflows.signal("p", "paid", json!(5)).await.unwrap();
    h.wait_events("p", "workflow_task_completed", 2).await;
    h.advance(MIN).await;
    let done = h.wait_status("p", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!("paid 5"));
    let types = h.types("p").await;
    assert_eq!(
        types.iter().filter(|t| **t == "timer_started").count(),
        1,
        "a buffered signal needs no timeout timer: {types:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_during_the_wait_wins_and_cancels_the_timer() {
    let h = harness(|w| w.register("payment", payment).unwrap()).await;
    h.start("payment", "p", json!(30)).await;
    h.wait_events("p", "timer_started", 1).await;
    h.advance(MIN).await;
    h.wait_events("p", "timer_started", 2).await;
    h.advance(10 * MIN).await;
    assert_eq!(h.run("p").await.status, WorkflowStatus::Running);
    h.workflows.signal("p", "paid", json!(7)).await.unwrap();
    let done = h.wait_status("p", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!("paid 7"));
    // The 30-minute timeout timer was cancelled, in the history and in the kernel.
    let history = h.history("p").await;
    let timeout_task = history
        .iter()
        .filter_map(|e| match &e.event {
            Event::TimerStarted { cmd: 1, task, .. } => Some(*task),
            _ => None,
        })
        .next()
        .unwrap();
    assert!(
        history
            .iter()
            .any(|e| matches!(e.event, Event::TimerCancelled { cmd: 1, .. }))
    );
    let t = h.sundial.get(timeout_task).await.unwrap().unwrap();
    assert_eq!(t.state, TaskState::Cancelled);
    // Nothing fires later.
    h.advance(60 * MIN).await;
    assert_eq!(h.run("p").await.status, WorkflowStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_after_the_timeout_is_too_late() {
    let h = harness(|w| w.register("payment", payment).unwrap()).await;
    h.start("payment", "p", json!(30)).await;
    h.wait_events("p", "timer_started", 1).await;
    h.advance(MIN).await;
    h.wait_events("p", "timer_started", 2).await;
    h.advance(30 * MIN - Duration::from_millis(1)).await;
    assert_eq!(h.run("p").await.status, WorkflowStatus::Running);
    h.advance(Duration::from_millis(1)).await;
    let done = h.wait_status("p", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!("timed out"));
    let err = h.workflows.signal("p", "paid", json!(9)).await.unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
}

/// Signals of one name are delivered in order, each once; other names are kept apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_buffered_in_order() {
    async fn collect(ctx: WorkflowContext, n: usize) -> Result<Vec<String>, WorkflowError> {
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(ctx.signal::<String>("item").await?);
        }
        let other: String = ctx.signal("other").await?;
        got.push(other);
        Ok(got)
    }
    let h = harness(|w| w.register("collect", collect).unwrap()).await;
    h.start("collect", "c", json!(3)).await;
    h.workflows.signal("c", "other", json!("o")).await.unwrap();
    for s in ["a", "b", "c"] {
        h.workflows.signal("c", "item", json!(s)).await.unwrap();
    }
    let done = h.wait_status("c", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!(["a", "b", "c", "o"]));
    let err = h
        .workflows
        .signal("nope", "item", json!(1))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
}
