//! Backfill over a past range: each fire time once, oldest first, every one run by default or
//! following the overlap policy it is given; a second backfill of the same range changes nothing.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::Timestamp;
use sundial_schedules::{FireOutcome, FireReason, OverlapPolicy};

const HOUR: i64 = 3_600_000;

fn hour_floor(t: Timestamp) -> Timestamp {
    Timestamp(t.0 - t.0.rem_euclid(HOUR))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_fires_each_past_time_once() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    create(&h, "b", def("0 * * * *").overlap(OverlapPolicy::AllowAll)).await;
    let from = Timestamp(T0.0 - 3 * HOUR);
    let out = h
        .schedules
        .backfill(&sid("b"), from, T0, None)
        .await
        .unwrap();
    let want: Vec<Timestamp> = (0..3)
        .map(|i| Timestamp(hour_floor(from).0 + (i + 1) * HOUR))
        .collect();
    let got: Vec<Timestamp> = out.recorded.iter().map(|r| r.nominal).collect();
    assert_eq!(got, want, "oldest first");
    assert!(
        out.recorded
            .iter()
            .all(|r| (r.outcome, r.reason) == (FireOutcome::Fired, FireReason::Backfill))
    );
    let mut ran = vec![
        jobs.next().await.nominal,
        jobs.next().await.nominal,
        jobs.next().await.nominal,
    ];
    ran.sort();
    assert_eq!(ran, want);
    let again = h
        .schedules
        .backfill(&sid("b"), from, T0, None)
        .await
        .unwrap();
    assert!(again.recorded.is_empty());
    assert_eq!(again.already_recorded, want);
    jobs.none().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_runs_every_fire_by_default_whatever_the_schedules_overlap() {
    let h = harness().await;
    let mut jobs = jobs(&h, false);
    create(&h, "b", def("0 * * * *")).await; // overlap skip
    let from = Timestamp(T0.0 - 3 * HOUR);
    let out = h
        .schedules
        .backfill(&sid("b"), from, T0, None)
        .await
        .unwrap();
    assert_eq!(out.recorded.len(), 3);
    assert!(
        out.recorded
            .iter()
            .all(|r| (r.outcome, r.reason) == (FireOutcome::Fired, FireReason::Backfill)),
        "{:?}",
        out.recorded
    );
    // The schedule's own policy is unchanged.
    let s = h.schedules.get(&sid("b")).await.unwrap().unwrap();
    assert_eq!(s.def.overlap, OverlapPolicy::Skip);
    jobs.set_open(true);
    for _ in 0..3 {
        jobs.next().await;
    }
    jobs.none().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_follows_the_overlap_policy_it_is_given() {
    let h = harness().await;
    let mut jobs = jobs(&h, false);
    create(&h, "b", def("0 * * * *").overlap(OverlapPolicy::AllowAll)).await;
    let from = Timestamp(T0.0 - 3 * HOUR);
    let out = h
        .schedules
        .backfill(&sid("b"), from, T0, Some(OverlapPolicy::Skip))
        .await
        .unwrap();
    let kinds: Vec<_> = out.recorded.iter().map(|r| (r.outcome, r.reason)).collect();
    assert_eq!(
        kinds,
        vec![
            (FireOutcome::Fired, FireReason::Backfill),
            (FireOutcome::Skipped, FireReason::Overlap),
            (FireOutcome::Skipped, FireReason::Overlap),
        ],
        "the first backfilled task is still in progress when the next comes"
    );
    jobs.next().await;
    jobs.none().await;
    jobs.set_open(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_refuses_the_future_and_huge_ranges() {
    let h = harness().await;
    create(&h, "b", def("* * * * * *")).await;
    let future = h
        .schedules
        .backfill(&sid("b"), T0, at(T0, Duration::from_secs(60)), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&future, sundial_schedules::Error::Invalid(e) if e.field() == "to"),
        "{future:?}"
    );
    let huge = h
        .schedules
        .backfill(&sid("b"), Timestamp(T0.0 - 2 * HOUR), T0, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&huge, sundial_schedules::Error::Invalid(e) if e.field() == "to"),
        "{huge:?}"
    );
    assert!(fires(&h, "b").await.is_empty(), "nothing recorded");
}
