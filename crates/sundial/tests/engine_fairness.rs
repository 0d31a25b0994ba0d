//! Fairness between queues (and so between namespaces): a queue whose in-process permits are
//! all taken parks its due entries, so its backlog, however long, holds back neither the walk
//! of another queue's due entries nor their starts; once a permit frees, the parked queue goes
//! on in due order. Driven by a stepped engine on a manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sundial::{Config, TaskContext, TaskId, TaskSpec, Timestamp};
use tokio::sync::{Semaphore, mpsc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_one_namespace_does_not_hold_back_another() {
    // Namespace a's queue runs 2 at a time; a walk reaches 4 × 4 entries per turn; a's 60 tasks
    // are due before b's one, and a's runs hang until released.
    let mut config = Config {
        shard_count: 1,
        claim_batch: 4,
        ..Config::default()
    };
    config.queue_concurrency.insert("a\u{1f}work".into(), 2);
    let h = harness_with(config).await;
    let release = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel::<(TaskId, String)>();
    {
        let release = release.clone();
        h.sundial.register("job", move |ctx: TaskContext| {
            let (tx, release) = (tx.clone(), release.clone());
            async move {
                let _ = tx.send((ctx.task.id, ctx.task.queue.clone()));
                if ctx.task.queue.starts_with('a')
                    && let Ok(p) = release.acquire().await
                {
                    p.forget();
                }
                Ok::<(), String>(())
            }
        });
    }
    let mut stepper = h.sundial.stepper();
    let mut a_ids = Vec::new();
    for i in 0..60 {
        let spec = TaskSpec::new("job")
            .queue("a\u{1f}work")
            .run_at(Timestamp(T0.0 + 1_000 + i));
        a_ids.push(h.sundial.schedule(spec).await.unwrap());
    }
    let b = h
        .sundial
        .schedule(
            TaskSpec::new("job")
                .queue("b\u{1f}work")
                .run_at(Timestamp(T0.0 + 1_100)),
        )
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(1_200));
    for _ in 0..4 {
        stepper.turn().await;
    }
    // Two of a's run (and hang); b's, due after every one of a's, starts anyway.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let got = tokio::time::timeout(Duration::from_secs(10), started.recv())
            .await
            .expect("a start within 10 s")
            .expect("open");
        seen.push(got);
    }
    assert!(seen.iter().any(|(id, _)| *id == b), "b started: {seen:?}");
    assert_eq!(seen.iter().filter(|(_, q)| q.starts_with('a')).count(), 2);
    // a goes on in due order as its runs finish.
    let mut a_started: Vec<TaskId> = seen
        .iter()
        .filter(|(_, q)| q.starts_with('a'))
        .map(|(id, _)| *id)
        .collect();
    for _ in 2..a_ids.len() {
        release.add_permits(1);
        let next = loop {
            stepper.turn().await;
            if let Ok(Some((id, _))) =
                tokio::time::timeout(Duration::from_millis(50), started.recv()).await
            {
                break id;
            }
        };
        a_started.push(next);
    }
    release.add_permits(a_ids.len());
    let mut sorted = a_started.clone();
    sorted.sort_by_key(|id| a_ids.iter().position(|a| a == id));
    assert_eq!(a_started.len(), a_ids.len());
    assert_eq!(
        &a_started[2..],
        &sorted[2..],
        "a's waiting tasks start in due order"
    );
    stepper.settle().await;
}
