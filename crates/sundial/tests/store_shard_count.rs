//! The embedded store keeps the shard count it was created with: reopening it with another
//! `Config::shard_count` adopts the stored count (with a warning), so no task is left in a shard
//! that no loop runs. A store written by a build that did not record the count gets one derived
//! from its rows.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sundial::{Config, ManualClock, Sundial, TaskSpec};

async fn open(dir: &std::path::Path, clock: &ManualClock, shards: u32) -> Sundial {
    Sundial::builder()
        .config(Config {
            shard_count: shards,
            ..Config::default()
        })
        .clock(Arc::new(clock.clone()))
        .open(dir)
        .await
        .expect("open")
}

async fn schedule_keyed(s: &Sundial, n: usize) -> Vec<sundial::TaskId> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            s.schedule(
                TaskSpec::new("k")
                    .key(format!("task-{i}"))
                    .delay(Duration::from_secs(4)),
            )
            .await
            .expect("schedule"),
        );
    }
    ids
}

/// Steps the engine of `s` past the tasks' due time and waits until all `n` ran.
async fn all_run(s: &Sundial, clock: &ManualClock, n: usize) {
    let h = Harness {
        sundial: s.clone(),
        clock: clock.clone(),
        dir: tempfile::tempdir().expect("tempdir"),
    };
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = s.stepper();
    stepper.settle().await;
    clock.advance(Duration::from_secs(6));
    // Every shard loop turns (the stepper has one per stored shard), so every task runs.
    stepper.settle().await;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n {
        let r = tokio::time::timeout(Duration::from_secs(10), runs.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} tasks ran", seen.len()))
            .expect("channel open");
        seen.insert(r.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_with_fewer_shards_strands_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    {
        let s = open(dir.path(), &clock, 16).await;
        assert_eq!(s.config().shard_count, 16);
        schedule_keyed(&s, 40).await;
    }
    let s = open(dir.path(), &clock, 4).await;
    assert_eq!(s.config().shard_count, 16, "the stored count wins");
    all_run(&s, &clock, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_with_more_shards_keeps_the_stored_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    {
        let s = open(dir.path(), &clock, 4).await;
        schedule_keyed(&s, 40).await;
    }
    let s = open(dir.path(), &clock, 32).await;
    assert_eq!(s.config().shard_count, 4);
    // New tasks go to the stored count's shards too.
    schedule_keyed(&s, 0).await;
    let more: Vec<_> = {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(
                s.schedule(
                    TaskSpec::new("k")
                        .key(format!("more-{i}"))
                        .delay(Duration::from_secs(4)),
                )
                .await
                .expect("schedule"),
            );
        }
        v
    };
    for id in &more {
        let t = s.get(*id).await.expect("get").expect("stored");
        assert!(t.shard < 4, "shard {} of a 4-shard store", t.shard);
    }
    all_run(&s, &clock, 50).await;
}
