//! Rate limits in the engine: tasks that share a rate key start at most `limit` times in any
//! window of `per`, evenly spaced, across shards, and never before they are due; tasks without
//! a limit are not held back. Driven by a stepped engine on a manual clock; the handler records
//! each start's time.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::{Clock, TaskSpec, Timestamp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_is_never_exceeded_in_any_window() {
    const TASKS: usize = 20;
    let h = harness().await;
    let mut runs = record(&h, "call", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let s = &h.sundial;
    // 5 per second: one start per 200 ms. Due over the first half second, in several queues
    // (so in several shards) under one key.
    let mut limited = Vec::new();
    for i in 0..TASKS {
        let due = Timestamp(T0.0 + (i as i64 % 5) * 100);
        let spec = TaskSpec::new("call")
            .queue(format!("q{}", i % 4))
            .run_at(due)
            .rate(Some("api".into()), 5, Duration::from_secs(1));
        limited.push(s.schedule(spec).await.unwrap());
    }
    let free = s
        .schedule(TaskSpec::new("call").queue("q0").run_at(T0))
        .await
        .unwrap();

    let mut starts: Vec<Timestamp> = Vec::new();
    let mut free_started = None;
    for _ in 0..1_000 {
        stepper.settle().await;
        while let Ok(r) = runs.try_recv() {
            assert!(r.at >= r.due, "started early: {r:?}");
            if r.id == free {
                free_started = Some(r.at);
            } else {
                starts.push(r.at);
            }
        }
        if starts.len() == TASKS {
            break;
        }
        h.clock.advance(Duration::from_millis(10));
    }
    assert_eq!(starts.len(), TASKS, "every limited task ran: {starts:?}");
    assert_eq!(
        free_started,
        Some(T0),
        "a task without a limit is not held back"
    );
    starts.sort();
    for pair in starts.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= 200,
            "two starts closer than the interval: {starts:?}"
        );
    }
    for (i, a) in starts.iter().enumerate() {
        let in_window = starts[i..].iter().filter(|b| b.0 < a.0 + 1_000).count();
        assert!(
            in_window <= 5,
            "{in_window} starts in the second from {a:?}: {starts:?}"
        );
    }
    // Spaced, not starved: the 20th start comes about 19 intervals after the first.
    let span = starts[TASKS - 1].0 - starts[0].0;
    assert!(span < 19 * 200 + 1_000, "took {span} ms: {starts:?}");
    for id in limited {
        wait_state(s, id, sundial::TaskState::Succeeded).await;
    }
}

/// Waits (bounded, real time) until the poll has answered or is parked on the clock waiting.
async fn answered_or_parked(
    clock: &sundial::ManualClock,
    poll: &tokio::task::JoinHandle<Vec<sundial::Task>>,
) {
    for _ in 0..10_000 {
        if poll.is_finished() || clock.sleepers() >= 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the poll neither answered nor waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_back_from_away_take_rate_limited_tasks_one_turn_apart() {
    const TASKS: usize = 5;
    let h = harness().await;
    let mut stepper = h.sundial.stepper();
    let s = &h.sundial;
    // A worker queue (no handler for the kind), 5 starts a second: one per 200 ms.
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        let spec = TaskSpec::new("mail.send").queue("mail").run_at(T0).rate(
            None,
            5,
            Duration::from_secs(1),
        );
        ids.push(s.schedule(spec).await.unwrap());
    }
    // No worker for 2 s: every task becomes ready at its readying turn.
    for _ in 0..200 {
        stepper.settle().await;
        h.clock.advance(Duration::from_millis(10));
    }
    stepper.settle().await;
    for id in &ids {
        wait_state(s, *id, sundial::TaskState::Ready).await;
    }
    // A worker comes back and polls for up to 10 at a time, one poll after another.
    let back = h.clock.now();
    let mut starts: Vec<Timestamp> = Vec::new();
    while starts.len() < TASKS {
        let sundial = s.clone();
        let poll = tokio::spawn(async move {
            sundial
                .poll("mail", None, None, 10, Duration::from_secs(30))
                .await
                .unwrap()
        });
        for _ in 0..1_000 {
            answered_or_parked(&h.clock, &poll).await;
            if poll.is_finished() {
                break;
            }
            h.clock.advance(Duration::from_millis(10));
            stepper.settle().await;
        }
        let got = poll.await.unwrap();
        assert_eq!(
            got.len(),
            1,
            "one task per turn, however many are ready: {got:?}"
        );
        starts.push(got[0].started_at.unwrap());
    }
    assert_eq!(starts[0], back, "the first is taken at once");
    for pair in starts.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            (200..=210).contains(&gap),
            "takes {gap} ms apart, not one turn (200 ms): {starts:?}"
        );
    }
}
