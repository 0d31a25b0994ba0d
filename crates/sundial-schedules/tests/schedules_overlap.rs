//! Overlap policies, judged from the previous fire's task, on a manual clock: the job handler
//! holds its runs open so that the next fire finds the previous one still running.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use sundial::TaskState;
use sundial_schedules::{FireOutcome, FireReason, OverlapPolicy};

const FIRED: (FireOutcome, FireReason) = (FireOutcome::Fired, FireReason::Schedule);
const SKIPPED: (FireOutcome, FireReason) = (FireOutcome::Skipped, FireReason::Overlap);

/// Creates an every-minute schedule with `policy`, lets the first fire start and hold, then
/// lets two more fire times pass while it is still running.
async fn three_fires_while_the_first_runs(policy: OverlapPolicy) -> (Harness, Jobs) {
    let h = harness().await;
    let mut jobs = jobs(&h, false);
    create(&h, "o", def("* * * * *").overlap(policy)).await;
    advance(&h, Duration::from_secs(40)).await;
    assert_eq!(jobs.next().await.nominal, M1);
    advance(&h, MIN).await;
    wait_fires(&h, "o", 2).await;
    advance(&h, MIN).await;
    wait_fires(&h, "o", 3).await;
    (h, jobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_records_overlapping_fires_as_skipped() {
    let (h, mut jobs) = three_fires_while_the_first_runs(OverlapPolicy::Skip).await;
    jobs.none().await;
    assert_eq!(
        outcomes(&fires(&h, "o").await),
        vec![FIRED, SKIPPED, SKIPPED]
    );
    jobs.set_open(true);
    advance(&h, MIN).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN * 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_one_keeps_one_fire_for_after_the_running_one() {
    let (h, mut jobs) = three_fires_while_the_first_runs(OverlapPolicy::BufferOne).await;
    jobs.none().await;
    assert_eq!(outcomes(&fires(&h, "o").await), vec![FIRED, FIRED, SKIPPED]);
    jobs.set_open(true);
    // The buffered fire starts once the first stops running (no clock movement needed).
    let r = jobs.next().await;
    assert_eq!(r.nominal, at(M1, MIN));
    jobs.none().await;
    assert_eq!(jobs.max_running.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_all_runs_every_fire_one_after_another() {
    let (h, mut jobs) = three_fires_while_the_first_runs(OverlapPolicy::BufferAll).await;
    jobs.none().await;
    assert_eq!(outcomes(&fires(&h, "o").await), vec![FIRED, FIRED, FIRED]);
    jobs.set_open(true);
    let mut nominals = vec![jobs.next().await.nominal, jobs.next().await.nominal];
    nominals.sort();
    assert_eq!(nominals, vec![at(M1, MIN), at(M1, MIN * 2)]);
    assert_eq!(
        jobs.max_running.load(Ordering::SeqCst),
        1,
        "never two at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_all_runs_fires_side_by_side() {
    let (h, mut jobs) = three_fires_while_the_first_runs(OverlapPolicy::AllowAll).await;
    assert_eq!(outcomes(&fires(&h, "o").await), vec![FIRED, FIRED, FIRED]);
    let mut nominals = vec![jobs.next().await.nominal, jobs.next().await.nominal];
    nominals.sort();
    assert_eq!(nominals, vec![at(M1, MIN), at(M1, MIN * 2)]);
    assert_eq!(jobs.running.load(Ordering::SeqCst), 3);
    jobs.set_open(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_other_cancels_the_running_fire_first() {
    let h = harness().await;
    let mut jobs = jobs(&h, false);
    create(
        &h,
        "o",
        def("* * * * *").overlap(OverlapPolicy::CancelOther),
    )
    .await;
    advance(&h, Duration::from_secs(40)).await;
    let first = jobs.next().await;
    advance(&h, MIN).await;
    let second = jobs.next().await;
    assert_eq!(second.nominal, at(M1, MIN));
    wait_state(&h, first.task, TaskState::Cancelled).await;
    assert_eq!(outcomes(&fires(&h, "o").await), vec![FIRED, FIRED]);
    jobs.set_open(true);
}
