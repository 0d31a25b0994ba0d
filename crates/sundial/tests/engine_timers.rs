//! Due-time behaviour on a manual clock, the engine stepped: never early, due order, notify pulls
//! the gate in.

mod common;

use std::time::Duration;

use common::*;
use sundial::{TaskSpec, Timestamp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_early_then_on_time() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_secs(60)))
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(59_999));
    stepper.settle().await;
    no_run(&mut runs).await;
    h.clock.advance(Duration::from_millis(1));
    stepper.settle().await;
    let r = next_run(&mut runs).await;
    assert_eq!(r.id, id);
    assert!(r.at >= r.due, "started {:?} before due {:?}", r.at, r.due);
    assert_eq!(r.due, Timestamp(T0.0 + 60_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_in_due_order() {
    let cfg = sundial::Config {
        shard_count: 1,
        default_concurrency: 1,
        ..Default::default()
    };
    let h = harness_with(cfg).await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let mut ids = Vec::new();
    for secs in [50u64, 10, 40, 20, 30] {
        let id = h
            .sundial
            .schedule(TaskSpec::new("k").delay(Duration::from_secs(secs)))
            .await
            .unwrap();
        ids.push((secs, id));
    }
    ids.sort();
    stepper.settle().await;
    h.clock.advance(Duration::from_secs(100));
    stepper.settle().await;
    for (_, id) in ids {
        assert_eq!(next_run(&mut runs).await.id, id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_task_pulls_the_gate_in() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    h.sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    stepper.settle().await;
    let early = h
        .sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_secs(10)))
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_secs(10));
    stepper.settle().await;
    assert_eq!(next_run(&mut runs).await.id, early);
    no_run(&mut runs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_beyond_the_lookahead_are_found_later() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_secs(86_400)))
        .await
        .unwrap();
    stepper.settle().await;
    // Move in steps, as real time would, across many idle intervals.
    for _ in 0..48 {
        h.clock.advance(Duration::from_secs(1_800));
        stepper.settle().await;
    }
    let r = next_run(&mut runs).await;
    assert_eq!(r.id, id);
    assert!(r.at >= r.due);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_before_start_runs_after_start() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let id = h.sundial.schedule(TaskSpec::new("k")).await.unwrap();
    let _engine = h.sundial.start();
    assert_eq!(next_run(&mut runs).await.id, id);
}

/// A task written beyond what the window covers, due within the look-ahead of a later turn that
/// does not refill: the loop arms its gate for the refill that brings the task in, not for now
/// (which made the production loop turn back to back, reading the store each time, until the
/// refill), and the task still runs on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_window_waits_for_its_refill_not_for_now() {
    let cfg = sundial::Config {
        shard_count: 1,
        ..Default::default()
    };
    let h = harness_with(cfg).await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    // The first turn scans up to T0 + the look-ahead (5 s).
    stepper.settle().await;
    let id = h
        .sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_secs(6)))
        .await
        .unwrap();
    // T0 + 1 s: the task (due at T0 + 6 s) is within the look-ahead, but the window refills only
    // at T0 + 2.5 s (halfway through what it covers).
    h.clock.advance(Duration::from_secs(1));
    let next = stepper.turn().await;
    assert!(
        next > sundial::Clock::now(&h.clock),
        "the loop wants a turn again at once: {next:?}"
    );
    h.clock.advance(Duration::from_secs(5));
    stepper.settle().await;
    let r = next_run(&mut runs).await;
    assert_eq!((r.id, r.due), (id, Timestamp(T0.0 + 6_000)));
    assert!(r.at >= r.due);
}
