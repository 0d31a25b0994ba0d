//! A crash between firing and arming can neither lose nor duplicate a fire: firing and arming are
//! one transaction, so the only crashes left are before it (the tick runs again and fires) and
//! after it (the tick runs again and is refused as stale). Both are injected through a schedule
//! store wrapper; the last test kills a whole engine (its runtime) right after the commit and
//! carries on with a fresh process-like instance on the same data directory.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Driver, M1, MIN, T0, at, def, jobs};
use sundial::{ManualClock, StoreError, Sundial, Timestamp};
use sundial_core::schedule::ScheduleId;
use sundial_schedules::{CreateSchedule, FireOutcome, Schedules};
use sundial_store::{
    ArmChange, FireApplied, FireOp, FirePage, LastTask, NewSchedule, Schedule, ScheduleError,
    SchedulePage, ScheduleStore,
};
use sundial_store_sqlite::{SqliteOptions, SqliteStore};

enum Fault {
    /// Refuse the next fire before it reaches the database.
    Before,
    /// Commit the next fire, then report a failure (the tick's run "dies" after the commit).
    After,
    /// Commit the next fire, say so, then never return (the process is about to be killed).
    HangAfter(std::sync::mpsc::Sender<()>),
}

struct Faulty {
    inner: Arc<SqliteStore>,
    fault: Mutex<Option<Fault>>,
}

#[async_trait]
impl ScheduleStore for Faulty {
    async fn create_schedule(
        &self,
        s: NewSchedule,
    ) -> Result<(Schedule, Option<sundial::Task>), ScheduleError> {
        self.inner.create_schedule(s).await
    }
    async fn get_schedule(&self, id: &ScheduleId) -> Result<Option<Schedule>, StoreError> {
        self.inner.get_schedule(id).await
    }
    async fn schedules_for_fire(
        &self,
        ids: &[ScheduleId],
    ) -> Result<Vec<(Schedule, Option<LastTask>)>, StoreError> {
        self.inner.schedules_for_fire(ids).await
    }
    async fn stranded_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        self.inner.stranded_schedules(after, limit).await
    }
    async fn list_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        self.inner.list_schedules(after, limit).await
    }
    async fn update_schedule(
        &self,
        id: &ScheduleId,
        def: sundial_core::schedule::ScheduleDef,
        arm: ArmChange,
        now: Timestamp,
    ) -> Result<(Schedule, Option<sundial::Task>), ScheduleError> {
        self.inner.update_schedule(id, def, arm, now).await
    }
    async fn set_paused(
        &self,
        id: &ScheduleId,
        paused: bool,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<Schedule, ScheduleError> {
        self.inner.set_paused(id, paused, note, now).await
    }
    async fn delete_schedule(&self, id: &ScheduleId, now: Timestamp) -> Result<(), ScheduleError> {
        self.inner.delete_schedule(id, now).await
    }
    async fn fire(&self, op: FireOp) -> Result<FireApplied, ScheduleError> {
        let fault = self.fault.lock().unwrap().take();
        let injected =
            || ScheduleError::Store(StoreError::backend(std::io::Error::other("injected fault")));
        match fault {
            None => self.inner.fire(op).await,
            Some(Fault::Before) => Err(injected()),
            Some(Fault::After) => {
                self.inner.fire(op).await?;
                Err(injected())
            }
            Some(Fault::HangAfter(done)) => {
                self.inner.fire(op).await?;
                let _ = done.send(());
                std::future::pending().await
            }
        }
    }
    async fn list_fires(
        &self,
        id: &ScheduleId,
        before: Option<Timestamp>,
        limit: usize,
    ) -> Result<FirePage, StoreError> {
        self.inner.list_fires(id, before, limit).await
    }
    async fn purge_fires(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_fires(before, limit).await
    }
}

struct Instance {
    sundial: Sundial,
    schedules: Schedules,
    faulty: Arc<Faulty>,
}

fn instance(dir: &std::path::Path, clock: &ManualClock) -> Instance {
    let store = Arc::new(SqliteStore::open_dir(dir, SqliteOptions::default()).unwrap());
    let faulty = Arc::new(Faulty {
        inner: store.clone(),
        fault: Mutex::new(None),
    });
    let sundial = Sundial::builder()
        .clock(Arc::new(clock.clone()))
        .schedule_store(faulty.clone())
        .with_store(store)
        .expect("a valid config");
    let schedules = Schedules::attach(&sundial).unwrap();
    Instance {
        sundial,
        schedules,
        faulty,
    }
}

/// Moves the clock in half-second steps, settling the engine after each.
async fn advance(clock: &ManualClock, driver: &Driver, d: Duration) {
    common::advance_by(clock, driver, d, Duration::from_millis(500)).await;
}

async fn fire_nominals(s: &Schedules, id: &ScheduleId) -> Vec<(Timestamp, FireOutcome)> {
    let mut f: Vec<_> = s
        .fires(id, None, 100)
        .await
        .unwrap()
        .fires
        .into_iter()
        .map(|r| (r.nominal, r.outcome))
        .collect();
    f.reverse();
    f
}

async fn crash_around_the_commit(fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let i = instance(dir.path(), &clock);
    let h = common::start(common::Harness::new(
        i.sundial.clone(),
        i.schedules.clone(),
        clock.clone(),
        dir,
    ));
    let mut jobs = jobs(&h, true);
    let id = ScheduleId::new("c").unwrap();
    i.schedules
        .create(CreateSchedule::new(def("* * * * *")).id(id.clone()))
        .await
        .unwrap();
    *i.faulty.fault.lock().unwrap() = Some(fault);
    advance(&clock, &h.driver, Duration::from_secs(40)).await;
    // The tick's first run failed; its retry comes after a backoff of about a second.
    advance(&clock, &h.driver, Duration::from_secs(3)).await;
    assert_eq!(jobs.next().await.nominal, M1);
    jobs.none().await;
    assert_eq!(
        fire_nominals(&i.schedules, &id).await,
        vec![(M1, FireOutcome::Fired)]
    );
    let s = i.schedules.get(&id).await.unwrap().unwrap();
    assert_eq!(s.next_fire_at, Some(at(M1, MIN)), "the next fire is armed");
    advance(&clock, &h.driver, MIN).await;
    assert_eq!(jobs.next().await.nominal, at(M1, MIN));
    jobs.none().await;
    assert_eq!(
        fire_nominals(&i.schedules, &id).await,
        vec![(M1, FireOutcome::Fired), (at(M1, MIN), FireOutcome::Fired)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_before_the_commit_fires_on_retry() {
    crash_around_the_commit(Fault::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_after_the_commit_is_not_fired_twice() {
    crash_around_the_commit(Fault::After).await;
}

/// The database files of `dir` as they are now, copied to a new directory (SQLite rebuilds the
/// WAL index from the log on open).
fn crashed_copy(dir: &std::path::Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for name in ["sundial.db", "sundial.db-wal"] {
        let from = dir.join(name);
        if from.exists() {
            std::fs::copy(&from, copy.path().join(name)).unwrap();
        }
    }
    copy
}

/// Instance A fires and commits, then its whole runtime is dropped (every task of the engine
/// gone mid-handler, like `kill -9`). Instance B opens the same directory: the tick ended with
/// the fire A committed (nothing for the reaper to hand back), and the fire A committed, and the
/// one A armed, each run exactly once.
#[test]
fn killed_right_after_the_commit_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let id = ScheduleId::new("k").unwrap();
    let rt_a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let first_tick = rt_a.block_on(async {
        let a = instance(dir.path(), &clock);
        let (done, committed) = std::sync::mpsc::channel();
        *a.faulty.fault.lock().unwrap() = Some(Fault::HangAfter(done));
        a.sundial
            .register("job", |_ctx: sundial::TaskContext| async move {
                // A's workers never get to run the fire's task: the crash comes first.
                std::future::pending::<Result<(), sundial::HandlerError>>().await
            });
        let first_tick = a
            .schedules
            .create(CreateSchedule::new(def("* * * * *")).id(id.clone()))
            .await
            .unwrap()
            .armed_tick
            .unwrap();
        // One turn at M1 claims the tick, whose run commits the fire and then never returns
        // (settling would wait for it).
        let mut stepper = a.sundial.stepper();
        clock.advance(Duration::from_secs(40));
        stepper.turn().await;
        committed
            .recv_timeout(Duration::from_secs(10))
            .expect("A committed its fire");
        // Like a killed process, A never shuts down.
        std::mem::forget(stepper);
        first_tick
    });
    rt_a.shutdown_background(); // kill: nothing of A runs any more
    // A's leaked engine still holds its store, and with it the data directory's lock, which a
    // real kill would have released: B opens a copy of the files as A left them on disk.
    let dir = crashed_copy(dir.path());

    let rt_b = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt_b.block_on(async {
        let b = instance(dir.path(), &clock);
        let h = common::start(common::Harness::new(
            b.sundial.clone(),
            b.schedules.clone(),
            clock.clone(),
            tempfile::tempdir().unwrap(),
        ));
        let mut jobs = jobs(&h, true);
        h.driver.settle().await;
        // The fire A committed is a task due at M1: B runs it once.
        assert_eq!(jobs.next().await.nominal, M1);
        // The tick's success committed with its fire: its dead run leaves nothing running.
        assert_eq!(
            b.sundial.get(first_tick).await.unwrap().unwrap().state,
            sundial::TaskState::Succeeded
        );
        // Past what would have been the dead tick's lease (its 60 s timeout and the engine's
        // grace): the fire A armed comes due and runs, once.
        advance(&clock, &h.driver, Duration::from_secs(70)).await;
        assert_eq!(jobs.next().await.nominal, at(M1, MIN));
        jobs.none().await;
        assert_eq!(
            fire_nominals(&b.schedules, &id).await,
            vec![(M1, FireOutcome::Fired), (at(M1, MIN), FireOutcome::Fired)]
        );
        let s = b.schedules.get(&id).await.unwrap().unwrap();
        assert_eq!(s.counts.fired, 2);
        assert_eq!(s.next_fire_at, Some(at(M1, MIN * 2)));
    });
    rt_b.shutdown_background();
}
