//! Retention through the facade: finished tasks go once their retention (per state, or the
//! queue's override) has passed; live tasks never do, however old; the counters follow; and the
//! engine's own retention task deletes on its interval. Manual clock, stepped engine.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::{Config, QueueConfig, Retention, RetentionOverride, TaskSpec, TaskState};

const HOUR: Duration = Duration::from_secs(3_600);

fn config() -> Config {
    Config {
        retention: Retention {
            succeeded: HOUR,
            cancelled: HOUR,
            dead: 10 * HOUR,
            interval: Duration::from_secs(1),
            batch: 2,
            ..Retention::default()
        },
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_finished_tasks_and_never_a_live_one() {
    let h = harness_with(config()).await;
    let s = &h.sundial;
    let _runs = record(&h, "ok", |_| Ok(()));
    let _fails = record(&h, "bad", |_| Err("boom".into()));
    let mut stepper = s.stepper();
    s.configure_queue(
        "short",
        QueueConfig {
            retention: RetentionOverride {
                succeeded_ms: Some(60_000),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let done: Vec<_> = futures::future::join_all((0..5).map(|_| s.schedule(TaskSpec::new("ok"))))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let short = s
        .schedule(TaskSpec::new("ok").queue("short"))
        .await
        .unwrap();
    let dead = s
        .schedule(TaskSpec::new("bad").max_attempts(1))
        .await
        .unwrap();
    let cancelled = s.schedule(TaskSpec::new("ok").delay(HOUR)).await.unwrap();
    s.cancel(cancelled).await.unwrap();
    // Live ones: far in the future, and due now but waiting for a worker.
    let later = s
        .schedule(TaskSpec::new("ok").delay(1_000 * HOUR))
        .await
        .unwrap();
    let waiting = s.schedule(TaskSpec::new("remote")).await.unwrap();
    stepper.settle().await;
    for id in &done {
        wait_state(s, *id, TaskState::Succeeded).await;
    }
    wait_state(s, dead, TaskState::Dead).await;
    wait_state(s, waiting, TaskState::Ready).await;

    // Nothing is old enough yet.
    assert_eq!(s.run_retention().await.unwrap().tasks, 0);
    // After a minute the short queue's task goes.
    h.clock.advance(Duration::from_secs(61));
    assert_eq!(s.run_retention().await.unwrap().tasks, 1);
    assert!(s.get(short).await.unwrap().is_none());
    // After an hour: the succeeded and cancelled ones, in batches of 2.
    h.clock.advance(HOUR);
    assert_eq!(s.run_retention().await.unwrap().tasks, 6);
    for id in done.iter().chain([&cancelled]) {
        assert!(s.get(*id).await.unwrap().is_none());
    }
    assert_eq!(s.get(dead).await.unwrap().unwrap().state, TaskState::Dead);
    // After ten hours: the dead one. Then a thousand hours: the live ones are all still there.
    h.clock.advance(10 * HOUR);
    assert_eq!(s.run_retention().await.unwrap().tasks, 1);
    h.clock.advance(2_000 * HOUR);
    assert_eq!(s.run_retention().await.unwrap().tasks, 0);
    assert!(!s.get(later).await.unwrap().unwrap().state.is_terminal());
    assert_eq!(
        s.get(waiting).await.unwrap().unwrap().state,
        TaskState::Ready
    );
    // The counters follow the deletions.
    let counts = s.counts().await.unwrap();
    let total: u64 = counts.iter().map(|c| c.count).sum();
    assert_eq!(total, 2, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_deletes_on_its_interval() {
    let h = harness_with(config()).await;
    let s = &h.sundial;
    let id = s.schedule(TaskSpec::new("ok").delay(HOUR)).await.unwrap();
    s.cancel(id).await.unwrap();
    let running = s.start();
    h.clock.advance(2 * HOUR);
    // The retention task sleeps on the engine's clock: step it past its interval.
    let mut gone = false;
    for _ in 0..200 {
        h.clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
        if s.get(id).await.unwrap().is_none() {
            gone = true;
            break;
        }
    }
    assert!(
        gone,
        "the engine's retention task deleted the cancelled task"
    );
    running.shutdown(Duration::from_secs(1)).await;
}

/// Closed workflow runs go with their histories once `Retention::workflow_runs` has passed
/// since they closed, a running run never does; audit records go after `Retention::audit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_closed_workflow_runs_and_old_audit_records() {
    use sundial::TaskId;
    use sundial_core::RunId;
    use sundial_store::{IdReusePolicy, NewAuditRecord, NewEvent, NewRun, TerminateOp};
    let h = harness_with(Config {
        retention: Retention {
            workflow_runs: HOUR,
            audit: 10 * HOUR,
            ..config().retention
        },
        ..Config::default()
    })
    .await;
    let s = &h.sundial;
    let w = s.workflow_store().unwrap().clone();
    let audit = s.access_store().unwrap().clone();
    let now = || sundial::Clock::now(&h.clock);
    let start = |id: &str| NewRun {
        workflow_id: id.to_string(),
        run_id: RunId(uuid::Uuid::now_v7()),
        workflow_type: "order".into(),
        input: "{}".into(),
        parent: None,
        continued_from: None,
        started: NewEvent {
            at: now(),
            data: "{}".into(),
        },
        first_task: TaskSpec::new("workflow/order")
            .queue(sundial_store::WORKFLOW_QUEUE)
            .validate(TaskId(uuid::Uuid::now_v7()), now(), 4, &Default::default())
            .unwrap(),
        now: now(),
    };
    let (closed, open) = (start("closed"), start("open"));
    for r in [&closed, &open] {
        w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
            .await
            .unwrap();
    }
    w.terminate(TerminateOp {
        run_id: closed.run_id,
        event: NewEvent {
            at: now(),
            data: "{}".into(),
        },
        reason: "done".into(),
        parent: None,
        now: now(),
    })
    .await
    .unwrap();
    let record = |n: u32| NewAuditRecord {
        at: now(),
        actor_id: None,
        actor: "local".into(),
        namespace: "default".into(),
        action: "POST /v1/tasks".into(),
        target: None,
        status: 201,
        request_id: format!("r{n}"),
    };
    audit
        .append_audit(vec![record(1), record(2), record(3)])
        .await
        .unwrap();

    let p = s.run_retention().await.unwrap();
    assert_eq!((p.workflow_runs, p.audit), (0, 0));
    h.clock.advance(HOUR + Duration::from_secs(1));
    let p = s.run_retention().await.unwrap();
    assert_eq!((p.workflow_runs, p.audit), (1, 0));
    assert!(w.get_run(closed.run_id).await.unwrap().is_none());
    assert!(w.history(closed.run_id, 0, 10).await.unwrap().is_empty());
    h.clock.advance(10 * HOUR);
    let p = s.run_retention().await.unwrap();
    // Batches of 2: both batches in one round.
    assert_eq!((p.workflow_runs, p.audit), (0, 3));
    h.clock.advance(2_000 * HOUR);
    assert_eq!(s.run_retention().await.unwrap().workflow_runs, 0);
    let run = w.get_run(open.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, sundial_store::WorkflowStatus::Running);
}

/// A shutdown that begins before the engine's tasks first ran ends them all: the retention
/// task reads the stop rather than waiting for a change it was made too late to see. On one
/// thread the spawned tasks run only once the shutdown awaits them, and the clock stands still,
/// so a task that waits for the change never ends.
#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_right_after_the_start_ends_the_retention_task() {
    let h = harness_with(Config::default()).await;
    assert!(Config::default().retention.enabled);
    let running = h.sundial.start();
    tokio::time::timeout(
        Duration::from_secs(10),
        running.shutdown(Duration::from_secs(5)),
    )
    .await
    .expect("the shutdown ended");
}
