//! Fires on a manual clock: on time and never early, one task per fire carrying the schedule and
//! the nominal time, the next fire armed, jitter, start and end, pause and unpause, trigger now.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::Timestamp;
use sundial_schedules::{FireKey, FireOutcome, FireReason, ScheduleSpec, Schedules};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_each_minute_once_and_never_early() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    let s = create(&h, "m", def("* * * * *")).await;
    assert_eq!(s.next_fire_at, Some(M1));
    settle(&h).await;
    h.clock.advance(Duration::from_millis(39_999));
    settle(&h).await;
    jobs.none().await;
    advance(&h, Duration::from_millis(1)).await;
    let r = jobs.next().await;
    assert_eq!(r.nominal, M1);
    assert!(r.at >= M1, "started before its fire time");
    let task = h.sundial.get(r.task).await.unwrap().unwrap();
    assert_eq!(
        FireKey::parse(task.key.as_deref().unwrap()),
        Some(FireKey {
            schedule_id: sid("m"),
            nominal: M1
        })
    );
    for i in 1..=3u64 {
        advance(&h, MIN).await;
        assert_eq!(jobs.next().await.nominal, at(M1, MIN * i as u32));
    }
    jobs.none().await;
    let f = wait_fires(&h, "m", 4).await;
    assert_eq!(f.len(), 4);
    assert!(
        f.iter()
            .all(|r| r.outcome == FireOutcome::Fired && r.reason == FireReason::Schedule)
    );
    let s = h.schedules.get(&sid("m")).await.unwrap().unwrap();
    assert_eq!(s.counts.fired, 4);
    assert_eq!(s.next_fire_at, Some(at(M1, MIN * 4)));
    assert_eq!(
        h.schedules.upcoming(&s, 3),
        vec![at(M1, MIN * 4), at(M1, MIN * 5), at(M1, MIN * 6)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jitter_delays_within_bounds_and_start_end_bound_fires() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    let d = def("* * * * *")
        .jitter(Duration::from_secs(20))
        .start_at(at(M1, MIN))
        .end_at(at(M1, MIN * 2));
    create(&h, "j", d.clone()).await;
    advance(&h, Duration::from_secs(40) + MIN + Duration::from_secs(21)).await;
    let r = jobs.next().await;
    assert_eq!(r.nominal, at(M1, MIN), "start_at holds back the first fire");
    let jitter = d.jitter_for(&sid("j"), r.nominal);
    assert!(
        r.at >= at(r.nominal, jitter),
        "not before its jittered time"
    );
    advance(&h, MIN).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN * 2));
    advance(&h, MIN * 3).await;
    jobs.none().await;
    let s = h.schedules.get(&sid("j")).await.unwrap().unwrap();
    assert_eq!(s.next_fire_at, None, "ended after end_at");
    assert_eq!(s.counts.fired, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_fires_are_recorded_as_skipped_until_unpaused() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    create(&h, "p", def("* * * * *")).await;
    let p = h
        .schedules
        .pause(&sid("p"), Some("db migration".into()))
        .await
        .unwrap();
    assert!(p.paused);
    assert_eq!(p.note.as_deref(), Some("db migration"));
    advance(&h, Duration::from_secs(40) + MIN).await;
    jobs.none().await;
    let f = wait_fires(&h, "p", 2).await;
    assert_eq!(
        outcomes(&f),
        vec![(FireOutcome::Skipped, FireReason::Paused); 2]
    );
    let u = h
        .schedules
        .unpause(&sid("p"), Some("done".into()))
        .await
        .unwrap();
    assert_eq!(u.note.as_deref(), Some("done"));
    advance(&h, MIN).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN * 2));
    let s = h.schedules.get(&sid("p")).await.unwrap().unwrap();
    assert_eq!((s.counts.skipped, s.counts.fired), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_fires_now_without_touching_the_armed_fire() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    create(&h, "t", def("0 0 * * *")).await;
    let before = h.schedules.get(&sid("t")).await.unwrap().unwrap();
    let r = h.schedules.trigger(&sid("t")).await.unwrap();
    assert_eq!(
        (r.outcome, r.reason, r.nominal),
        (FireOutcome::Fired, FireReason::Trigger, T0)
    );
    let run = jobs.next().await;
    assert_eq!(run.nominal, T0);
    let after = h.schedules.get(&sid("t")).await.unwrap().unwrap();
    assert_eq!(after.armed_tick, before.armed_tick);
    assert_eq!(after.next_fire_at, before.next_fire_at);
    assert!(
        h.schedules
            .trigger(&sid("nope"))
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_rearms_and_delete_stops() {
    let h = harness().await;
    let mut jobs = jobs(&h, true);
    create(&h, "u", def("0 0 * * *")).await;
    let s = h
        .schedules
        .update(&sid("u"), def("* * * * *"))
        .await
        .unwrap();
    assert_eq!(s.next_fire_at, Some(M1));
    advance(&h, Duration::from_secs(40)).await;
    assert_eq!(jobs.next().await.nominal, M1);
    h.schedules.delete(&sid("u")).await.unwrap();
    advance(&h, MIN * 2).await;
    jobs.none().await;
    assert!(h.schedules.get(&sid("u")).await.unwrap().is_none());
    assert!(
        h.schedules
            .delete(&sid("u"))
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_definitions_are_refused_with_field_and_reason() {
    let h = harness().await;
    let cases = [
        (def("0 0 0 30 2 *"), "cron"),
        (def("61 * * * * *"), "cron"),
        (
            def("* * * * *").jitter(Duration::from_secs(3 * 86_400)),
            "jitter",
        ),
        (
            sundial_schedules::ScheduleDef::new(
                ScheduleSpec::cron("* * * * *").timezone("Nowhere/Atlantis"),
                sundial_schedules::TaskTemplate::new("job"),
            ),
            "timezone",
        ),
    ];
    for (d, field) in cases {
        match h
            .schedules
            .create(sundial_schedules::CreateSchedule::new(d))
            .await
        {
            Err(sundial_schedules::Error::Invalid(e)) => assert_eq!(e.field(), field, "{e}"),
            other => panic!("expected {field} to be refused, got {other:?}"),
        }
    }
    let page = h.schedules.list(None, 10).await.unwrap();
    assert!(page.schedules.is_empty(), "nothing stored");
    create(&h, "dup", def("* * * * *")).await;
    let again = h
        .schedules
        .create(sundial_schedules::CreateSchedule::new(def("* * * * *")).id(sid("dup")))
        .await;
    assert!(matches!(
        again,
        Err(sundial_schedules::Error::AlreadyExists)
    ));
}

#[test]
fn preview_lists_fire_times_without_storing() {
    let spec = ScheduleSpec::cron("0 10 * * *").timezone("Asia/Shanghai");
    let from = Timestamp(1_704_067_200_000); // 2024-01-01T00:00:00Z = 08:00 in Shanghai
    let fires = Schedules::preview(&spec, from, 3).unwrap();
    let day = 86_400_000;
    let first = from.0 + 2 * 3_600_000;
    assert_eq!(
        fires,
        vec![
            Timestamp(first),
            Timestamp(first + day),
            Timestamp(first + 2 * day)
        ]
    );
    assert_eq!(
        Schedules::preview(&spec, Timestamp(first), 1).unwrap(),
        vec![Timestamp(first)],
        "at or after `from`"
    );
    assert_eq!(Schedules::preview(&spec, from, 1_000).unwrap().len(), 1_000);
    assert_eq!(
        Schedules::preview(&spec, from, 1_001).unwrap_err().field(),
        "count"
    );
    assert_eq!(
        Schedules::preview(&spec, from, 0).unwrap_err().field(),
        "count"
    );
}

/// Counts the `complete` calls that reach the task store.
struct CountCompletes(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl sundial_store::forwarding::Hooks for CountCompletes {
    fn enter(&self, call: sundial_store::forwarding::Call) -> Option<Box<dyn Send>> {
        if call.method == "complete" {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        None
    }
}

/// A tick's success commits with its fire: the tick ends `succeeded` at the fire's time, and
/// the only `complete` that reaches the task store is the fire's task's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_completes_in_its_fire_transaction() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(
        sundial_store_sqlite::SqliteStore::open_dir(
            dir.path(),
            sundial_store_sqlite::SqliteOptions::default(),
        )
        .unwrap(),
    );
    let completes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::new(sundial_store::forwarding::Forwarding::new(
        sqlite.clone(),
        CountCompletes(completes.clone()),
    ));
    let clock = sundial::ManualClock::new(T0);
    let sundial = sundial::Sundial::builder()
        .clock(Arc::new(clock.clone()))
        .with_store(counted)
        .unwrap();
    let schedules = Schedules::with_store(&sundial, sqlite);
    let h = start(Harness::new(sundial, schedules, clock, dir));
    let mut jobs = jobs(&h, true);
    let s = create(&h, "m", def("* * * * *")).await;
    let tick = s.armed_tick.unwrap();
    settle(&h).await;
    advance(&h, M1.since(T0)).await;
    let r = jobs.next().await;
    assert_eq!(r.nominal, M1);
    settle(&h).await;
    let fired = h.sundial.get(tick).await.unwrap().unwrap();
    assert_eq!(fired.state, sundial::TaskState::Succeeded, "{fired:?}");
    let record = wait_fires(&h, "m", 1).await;
    assert_eq!(fired.finished_at, Some(record[0].recorded_at));
    assert_eq!(
        h.sundial.get(r.task).await.unwrap().unwrap().state,
        sundial::TaskState::Succeeded
    );
    assert_eq!(
        completes.load(Ordering::SeqCst),
        1,
        "the job's complete only: the tick's success was written by its fire"
    );
}
