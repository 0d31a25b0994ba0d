//! Catch-up after downtime, on a manual clock: the engine is started only after the clock has
//! moved past fire times. Inside the catch-up window each missed fire runs once, oldest first;
//! outside it they are recorded as missed with their nominal times, and nothing storms.
//!
//! Catch-up fires follow the overlap policy like any other (with the default `skip`, a catch-up
//! fire that finds the previous one still running is skipped); these tests use `allow_all` so
//! that every fire inside the window runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial_schedules::{FireOutcome, FireReason, MISSED_INDIVIDUALLY, OverlapPolicy, ScheduleDef};

fn every(expr: &str) -> ScheduleDef {
    def(expr).overlap(OverlapPolicy::AllowAll)
}

/// Every 10 seconds: fire times at T0+10s, +20s, …
const EVERY_10S: &str = "*/10 * * * * *";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_missed_inside_the_window_run_once_each_oldest_first() {
    let h = stopped().await;
    let mut jobs = jobs(&h, true);
    create(&h, "c", every(EVERY_10S)).await;
    h.clock.advance(Duration::from_secs(45)); // down: 4 fire times pass
    let h = start(h);
    let mut nominals = Vec::new();
    for _ in 0..4 {
        nominals.push(jobs.next().await.nominal);
    }
    nominals.sort();
    let want: Vec<_> = (1..=4)
        .map(|i| at(T0, Duration::from_secs(10 * i)))
        .collect();
    assert_eq!(nominals, want, "each once");
    jobs.none().await;
    let f = wait_fires(&h, "c", 4).await;
    assert!(f.iter().all(|r| r.outcome == FireOutcome::Fired));
    let recorded: Vec<_> = f.iter().map(|r| r.recorded_at).collect();
    assert!(
        recorded.windows(2).all(|w| w[0] <= w[1]),
        "fired oldest first"
    );
    advance(&h, Duration::from_secs(5)).await;
    assert_eq!(jobs.next().await.nominal, at(T0, Duration::from_secs(50)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_missed_outside_the_window_are_recorded_not_run() {
    let h = stopped().await;
    let mut jobs = jobs(&h, true);
    create(&h, "c", every(EVERY_10S)).await;
    // Down for 5 minutes: fire times +10s … +300s. Those more than 1 minute late are missed.
    h.clock.set(at(T0, Duration::from_secs(305)));
    let h = start(h);
    let mut ran = Vec::new();
    for _ in 0..6 {
        ran.push(jobs.next().await.nominal);
    }
    jobs.none().await;
    ran.sort();
    let want: Vec<_> = (25..=30)
        .map(|i| at(T0, Duration::from_secs(10 * i)))
        .collect();
    assert_eq!(ran, want, "only the fires inside the window run");
    let f = wait_fires(&h, "c", 30).await;
    let missed: Vec<_> = f
        .iter()
        .filter(|r| r.outcome == FireOutcome::Missed)
        .collect();
    assert_eq!(missed.len(), 24);
    assert!(
        missed
            .iter()
            .all(|r| r.reason == FireReason::OutsideCatchupWindow)
    );
    let nominals: Vec<_> = missed.iter().map(|r| r.nominal).collect();
    let want: Vec<_> = (1..=24)
        .map(|i| at(T0, Duration::from_secs(10 * i)))
        .collect();
    assert_eq!(nominals, want, "each missed fire time is listed");
    let s = h.schedules.get(&sid("c")).await.unwrap().unwrap();
    assert_eq!((s.counts.missed, s.counts.fired), (24, 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_outage_is_recorded_in_bounded_records() {
    let h = stopped().await;
    let mut jobs = jobs(&h, true);
    create(&h, "c", every("* * * * * *")).await; // every second
    h.clock.set(at(T0, Duration::from_secs(3_600))); // down an hour: 3,600 fire times
    let h = start(h);
    for _ in 0..61 {
        jobs.next().await; // the last minute's fires run (exactly a minute late is inside)
    }
    let f = wait_fires(&h, "c", MISSED_INDIVIDUALLY + 1 + 61).await;
    let missed: Vec<_> = f
        .iter()
        .filter(|r| r.outcome == FireOutcome::Missed)
        .collect();
    assert_eq!(
        missed.len(),
        MISSED_INDIVIDUALLY + 1,
        "the rest is one record"
    );
    let total: u64 = missed.iter().map(|r| r.count).sum();
    assert_eq!(total, 3_600 - 61);
    let last = missed.last().unwrap();
    assert_eq!(
        last.nominal,
        at(T0, Duration::from_secs(MISSED_INDIVIDUALLY as u64 + 1))
    );
    assert_eq!(last.through, Some(at(T0, Duration::from_secs(3_539))));
    let s = h.schedules.get(&sid("c")).await.unwrap().unwrap();
    assert_eq!((s.counts.missed, s.counts.fired), (3_539, 61));
}
