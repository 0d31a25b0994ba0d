//! Pausing a queue: nothing of it starts (in-process handlers and worker polls alike) while due
//! tasks wait visibly, creates are still accepted, other queues run on, the pause survives a
//! restart, and on resume the waiting tasks start in due order (one shard here: each shard starts
//! its own in due order). Driven by a stepped engine on a
//! manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sundial::{Config, ManualClock, Sundial, TaskSpec, TaskState};

fn one_at_a_time() -> Config {
    let mut c = Config {
        shard_count: 1,
        ..Config::default()
    };
    c.queue_concurrency.insert("held".into(), 1);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_holds_its_tasks_and_resumes_in_due_order() {
    let h = harness_with(one_at_a_time()).await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    h.sundial.pause_queue("held").await.unwrap();

    // Created while paused, due in the past, now and soon, in scrambled order.
    let mut ids = Vec::new();
    for offset in [300i64, -500, 100, 0, -200] {
        let t = T0.saturating_add(Duration::from_millis(0));
        let due = sundial::Timestamp(t.0 + offset);
        let id = h
            .sundial
            .schedule(TaskSpec::new("k").queue("held").run_at(due))
            .await
            .unwrap();
        ids.push((due, id));
    }
    let other = h
        .sundial
        .schedule(TaskSpec::new("k").queue("free"))
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(2));
    stepper.settle().await;
    // The other queue runs; the paused one waits, visible as due and late.
    let r = next_run(&mut runs).await;
    assert_eq!(r.id, other);
    no_run(&mut runs).await;
    for (_, id) in &ids {
        let t = h.sundial.get(*id).await.unwrap().unwrap();
        assert_eq!(t.state, TaskState::Scheduled, "held back: {t:?}");
    }
    let q = h.sundial.queue("held").await.unwrap().unwrap();
    assert!(q.paused);
    assert_eq!(q.counts[&TaskState::Scheduled], 5);
    assert_eq!(q.lateness, Some(Duration::from_millis(2_500)));
    // A worker polling the paused queue gets nothing either (its tasks are never readied, and
    // a poll does not claim while paused).
    let polled = h
        .sundial
        .poll("held", Some("w".into()), None, 10, Duration::ZERO)
        .await
        .unwrap();
    assert!(polled.is_empty());

    // More time passes: still nothing.
    h.clock.advance(Duration::from_secs(60));
    stepper.settle().await;
    no_run(&mut runs).await;

    h.sundial.resume_queue("held").await.unwrap();
    let mut order = Vec::new();
    for _ in 0..ids.len() {
        stepper.settle().await;
        order.push(next_run(&mut runs).await.id);
    }
    let mut expected = ids.clone();
    expected.sort();
    let expected: Vec<_> = expected.into_iter().map(|(_, id)| id).collect();
    assert_eq!(order, expected, "in due order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let open = || async {
        Sundial::builder()
            .config(one_at_a_time())
            .clock(Arc::new(clock.clone()))
            .open(dir.path())
            .await
            .unwrap()
    };
    let id = {
        let s = open().await;
        s.pause_queue("held").await.unwrap();
        s.schedule(TaskSpec::new("k").queue("held")).await.unwrap()
    };
    // A new process: it reads the pause before its first claim.
    let s = open().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    s.register("k", move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(ctx.task.id);
            Ok::<(), sundial::HandlerError>(())
        }
    });
    let mut stepper = s.stepper();
    clock.advance(Duration::from_secs(5));
    stepper.settle().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), rx.recv())
            .await
            .is_err(),
        "nothing of the paused queue started"
    );
    assert_eq!(
        s.get(id).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    s.resume_queue("held").await.unwrap();
    stepper.settle().await;
    let ran = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap();
    assert_eq!(ran, Some(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_wakes_a_waiting_poller() {
    let h = harness().await;
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(TaskSpec::new("remote").queue("held"))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Ready
    );
    h.sundial.pause_queue("held").await.unwrap();
    let poller = {
        let s = h.sundial.clone();
        tokio::spawn(async move {
            s.poll(
                "held",
                Some("w".into()),
                None,
                1,
                Duration::from_secs(3_600),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !poller.is_finished(),
        "a ready task of a paused queue is not handed out"
    );
    h.sundial.resume_queue("held").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), poller)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
}
