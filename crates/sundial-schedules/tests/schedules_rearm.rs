//! A schedule whose armed tick stops being live (cancelled through the task API) is re-armed by
//! the runner's sweep, which runs every idle interval of the engine (30 s by default): it keeps
//! firing, never early, and each fire still happens once.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::TaskState;
use sundial_schedules::{FireOutcome, FireReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_tick_is_rearmed_for_the_same_fire_time() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    let s = create(&h, "c", def("* * * * *")).await;
    assert_eq!(s.next_fire_at, Some(M1));
    let tick = s.armed_tick.unwrap();
    h.sundial.cancel(tick).await.unwrap();
    settle(&h).await;
    // The sweep at T0 + 30 s finds the schedule stranded and arms a fresh tick for M1.
    advance(&h, Duration::from_secs(39)).await;
    jobs.none().await;
    // The sweep is a task of its own (not stepped): wait, bounded, for its new tick.
    let s = h
        .driver
        .until("the sweep re-arming the schedule", || async {
            let s = h.schedules.get(&sid("c")).await.unwrap().unwrap();
            (s.armed_tick != Some(tick)).then_some(s)
        })
        .await;
    assert_eq!(s.next_fire_at, Some(M1), "the same fire time");
    let fresh = s.armed_tick.unwrap();
    assert_eq!(
        h.sundial.get(fresh).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    advance(&h, Duration::from_secs(1)).await;
    let r = jobs.next().await;
    assert_eq!(r.nominal, M1);
    assert!(r.at >= M1, "started before its fire time");
    advance(&h, MIN).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN));
    jobs.none().await;
    let f = wait_fires(&h, "c", 2).await;
    assert_eq!(
        outcomes(&f),
        vec![
            (FireOutcome::Fired, FireReason::Schedule),
            (FireOutcome::Fired, FireReason::Schedule)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_cancelled_then_found_after_its_time_fires_late_once() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    let s = create(&h, "late", def("* * * * *")).await;
    // Past the first sweep (T0 + 30 s), before M1 (T0 + 40 s): cancel the armed tick.
    advance(&h, Duration::from_secs(35)).await;
    h.sundial.cancel(s.armed_tick.unwrap()).await.unwrap();
    advance(&h, Duration::from_secs(10)).await;
    jobs.none().await; // M1 passed with nothing armed
    // The sweep at about T0 + 60 s: M1 is 20 s late, inside the 1-minute catch-up window.
    advance(&h, Duration::from_secs(20)).await;
    let r = jobs.next().await;
    assert_eq!(r.nominal, M1);
    jobs.none().await;
    let s = h.schedules.get(&sid("late")).await.unwrap().unwrap();
    assert_eq!(s.next_fire_at, Some(at(M1, MIN)));
    advance(&h, Duration::from_secs(35)).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN));
    jobs.none().await;
    let f = wait_fires(&h, "late", 2).await;
    assert_eq!(f.len(), 2);
    assert_eq!(s.counts.fired, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_rearms_stranded_schedules() {
    let h = stopped().await;
    let s = create(&h, "r", def("* * * * *")).await;
    h.sundial.cancel(s.armed_tick.unwrap()).await.unwrap();
    let h = start(h);
    assert_eq!(h.schedules.recover().await.unwrap(), 1);
    let s2 = h.schedules.get(&sid("r")).await.unwrap().unwrap();
    assert_eq!(s2.next_fire_at, Some(M1));
    assert_ne!(s2.armed_tick, s.armed_tick);
    assert_eq!(
        h.schedules.recover().await.unwrap(),
        0,
        "nothing left to repair"
    );
}
