//! Durable sleep on the manual clock: a 30-day sleep completes without real waiting, never early,
//! and while asleep the workflow is rows, not memory: no workflow task pending, nothing in flight,
//! one scheduled timer task.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{DAY, T0, harness, result};
use serde_json::json;
use sundial::{TaskFilter, TaskState};
use sundial_workflow::{WorkflowContext, WorkflowError, WorkflowStatus};

async fn sleeper(ctx: WorkflowContext, days: u64) -> Result<serde_json::Value, WorkflowError> {
    let start = ctx.now();
    ctx.sleep(Duration::from_secs(days * 86_400)).await?;
    Ok(json!({"slept_ms": ctx.now().0 - start.0}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // measures that the test itself took no real time
async fn thirty_day_sleep_completes_without_real_waiting() {
    let real = Instant::now();
    let h = harness(|w| w.register("sleeper", sleeper).unwrap()).await;
    let started = h.start("sleeper", "s1", json!(30)).await;
    assert_eq!(started.status, WorkflowStatus::Running);
    h.wait_events("s1", "timer_started", 1).await;

    // Asleep: the run waits for nothing in memory; one timer row is scheduled for day 30.
    let run = h.run("s1").await;
    assert_eq!(run.pending_task, None);
    assert_eq!(h.sundial.in_flight(), 0);
    let scheduled = h
        .sundial
        .list(
            TaskFilter {
                state: Some(TaskState::Scheduled),
                ..TaskFilter::default()
            },
            10,
        )
        .await
        .unwrap()
        .tasks;
    assert_eq!(scheduled.len(), 1, "{scheduled:?}");
    assert_eq!(scheduled[0].kind, "sundial.workflow.timer");
    assert_eq!(scheduled[0].due_at, T0.saturating_add(30 * DAY));

    // Never early.
    h.advance(30 * DAY - Duration::from_secs(1)).await;
    assert_eq!(h.run("s1").await.status, WorkflowStatus::Running);
    h.advance(Duration::from_secs(1)).await;
    let done = h.wait_status("s1", WorkflowStatus::Completed).await;
    assert_eq!(
        result(&done),
        json!({"slept_ms": (30 * DAY).as_millis() as i64})
    );
    assert_eq!(
        h.types("s1").await,
        [
            "workflow_started",
            "workflow_task_completed",
            "timer_started",
            "timer_fired",
            "workflow_task_completed",
            "workflow_completed"
        ]
    );
    assert!(real.elapsed() < Duration::from_secs(20));
}

/// Many sleepers cost one timer row each and wake in order of their due times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sleepers_wake_on_their_day() {
    let h = harness(|w| w.register("sleeper", sleeper).unwrap()).await;
    for d in 1..=5u64 {
        h.start("sleeper", &format!("d{d}"), json!(d)).await;
    }
    for d in 1..=5u64 {
        h.wait_events(&format!("d{d}"), "timer_started", 1).await;
    }
    for d in 1..=5u64 {
        h.advance(DAY).await;
        h.wait_status(&format!("d{d}"), WorkflowStatus::Completed)
            .await;
        for later in d + 1..=5 {
            assert_eq!(
                h.run(&format!("d{later}")).await.status,
                WorkflowStatus::Running
            );
        }
    }
}
