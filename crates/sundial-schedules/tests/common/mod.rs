//! Test helpers: an engine with the schedules runner on a temporary store, driven by a manual
//! clock, and a job handler that records runs and can hold them open.
//!
//! The engine's loops are not started: a [`Driver`] turns them with the engine's
//! [`Stepper`] (`settle`), so nothing waits for real time but handler runs, by event. The one
//! thing the stepper does not drive is the runner's sweep for stranded schedules (`rearm.rs`), a
//! task of its own that sleeps on the manual clock; the tests of it poll, bounded, for what it
//! did.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sundial::{Config, ManualClock, Running, Stepper, Sundial, Task, TaskId, TaskState, Timestamp};
use sundial_schedules::{
    CreateSchedule, FireKey, FireOutcome, FireReason, FireRecord, Schedule, ScheduleDef,
    ScheduleId, ScheduleSpec, Schedules, TaskTemplate,
};
use tokio::sync::{mpsc, watch};

/// 2023-11-14T22:13:20Z: 20 seconds past a minute.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);
/// The first whole minute after `T0`.
pub const M1: Timestamp = Timestamp(1_700_000_040_000);
pub const MIN: Duration = Duration::from_secs(60);

pub struct Harness {
    pub sundial: Sundial,
    pub schedules: Schedules,
    pub clock: ManualClock,
    pub dir: tempfile::TempDir,
    pub running: Option<Running>,
    pub driver: Driver,
}

/// Turns the engine's loops (once the harness is started) and knows how many job runs the
/// `job` handler holds open, which settling does not wait for.
#[derive(Clone, Default)]
pub struct Driver {
    stepper: Arc<tokio::sync::Mutex<Option<Stepper>>>,
    held: Arc<AtomicUsize>,
}

/// Most rounds a wait for the engine takes, each a settle and a millisecond's pause (a bound on
/// a test that went wrong).
const ROUNDS: usize = 10_000;

impl Driver {
    /// Steps `sundial`'s engine from now on.
    pub fn step(&self, sundial: &Sundial) {
        let stepper = sundial.stepper();
        *self.stepper.try_lock().expect("not settling") = Some(stepper);
    }

    /// Turns the loops until nothing is left to do at the clock's time but the held job runs
    /// (nothing while the engine is not started).
    pub async fn settle(&self) {
        let held = self.held.clone();
        if let Some(s) = self.stepper.lock().await.as_mut() {
            s.settle_holding(move || held.load(Ordering::SeqCst)).await;
        }
    }

    /// Settles until `check` says yes (bounded); for what settling alone cannot make true at
    /// once (the sweep's work, done by a task of its own).
    pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
        &self,
        what: &str,
        mut check: impl FnMut() -> F,
    ) -> T {
        for _ in 0..ROUNDS {
            self.settle().await;
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("{what}: not within {ROUNDS} settles");
    }
}

pub async fn harness() -> Harness {
    let h = stopped().await;
    start(h)
}

/// A harness whose engine is not started yet (to simulate downtime).
pub async fn stopped() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(Config::default())
        .clock(Arc::new(clock.clone()))
        .open(dir.path())
        .await
        .unwrap();
    let schedules = Schedules::attach(&sundial).unwrap();
    Harness::new(sundial, schedules, clock, dir)
}

/// Starts the harness: its engine is stepped from now on.
pub fn start(mut h: Harness) -> Harness {
    h.driver.step(&h.sundial);
    h.running = Some(h.sundial.start());
    h
}

impl Harness {
    /// A harness over an engine that is not started yet.
    pub fn new(
        sundial: Sundial,
        schedules: Schedules,
        clock: ManualClock,
        dir: tempfile::TempDir,
    ) -> Harness {
        Harness {
            sundial,
            schedules,
            clock,
            dir,
            running: None,
            driver: Driver::default(),
        }
    }
}

pub fn def(expr: &str) -> ScheduleDef {
    ScheduleDef::new(ScheduleSpec::cron(expr), TaskTemplate::new("job"))
}

pub async fn create(h: &Harness, id: &str, def: ScheduleDef) -> Schedule {
    h.schedules
        .create(CreateSchedule::new(def).id(ScheduleId::new(id).unwrap()))
        .await
        .unwrap()
}

pub fn sid(id: &str) -> ScheduleId {
    ScheduleId::new(id).unwrap()
}

/// What the job handler saw.
#[derive(Debug, Clone)]
pub struct Run {
    pub task: TaskId,
    pub nominal: Timestamp,
    pub at: Timestamp,
}

pub struct Jobs {
    pub runs: mpsc::UnboundedReceiver<Run>,
    open: watch::Sender<bool>,
    /// Runs waiting at the gate now (the driver's held count).
    pub running: Arc<AtomicUsize>,
    pub max_running: Arc<AtomicUsize>,
    driver: Driver,
}

impl Jobs {
    /// Runs finish at once (`true`) or wait until opened.
    pub fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }
    /// The next run, settling the engine until there is one (bounded).
    pub async fn next(&mut self) -> Run {
        for _ in 0..ROUNDS {
            if let Ok(r) = self.runs.try_recv() {
                return r;
            }
            self.driver.settle().await;
            if let Ok(r) = self.runs.try_recv() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("no run within {ROUNDS} settles");
    }
    /// Settles the engine and asserts that no run started.
    pub async fn none(&mut self) {
        self.driver.settle().await;
        if let Ok(r) = self.runs.try_recv() {
            panic!("unexpected run: {r:?}");
        }
    }
}

/// Registers the `job` handler: records each run (with the clock's time and the nominal time
/// read from the task's key), then waits until the gate is open.
pub fn jobs(h: &Harness, open: bool) -> Jobs {
    let (tx, rx) = mpsc::unbounded_channel();
    let (open_tx, _) = watch::channel(open);
    let gate = open_tx.clone();
    let clock = h.clock.clone();
    let running = h.driver.held.clone();
    let max_running = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), max_running.clone());
    h.sundial.register("job", move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        let mut gate = gate.subscribe();
        let at = sundial::Clock::now(&clock);
        let (r, m) = (r.clone(), m.clone());
        async move {
            let key = ctx.task.key.clone().unwrap_or_default();
            let nominal = FireKey::parse(&key)
                .map(|k| k.nominal)
                .unwrap_or(Timestamp(-1));
            let _ = tx.send(Run {
                task: ctx.task.id,
                nominal,
                at,
            });
            // Counted as held only once it has been sent: a settled engine has sent every run.
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let _ = gate.wait_for(|o| *o).await;
            r.fetch_sub(1, Ordering::SeqCst);
            Ok::<(), sundial::HandlerError>(())
        }
    });
    Jobs {
        runs: rx,
        open: open_tx,
        running,
        max_running,
        driver: h.driver.clone(),
    }
}

/// Lets the engine settle on the current time (see [`Driver::settle`]).
pub async fn settle(h: &Harness) {
    h.driver.settle().await;
}

/// Moves the clock forward in steps of at most a second (as real time would) and settles the
/// engine after each.
pub async fn advance(h: &Harness, d: Duration) {
    advance_by(&h.clock, &h.driver, d, Duration::from_secs(1)).await;
}

/// Moves `clock` forward by `d` in steps of at most `step`, settling after each.
pub async fn advance_by(clock: &ManualClock, driver: &Driver, d: Duration, step: Duration) {
    let mut left = d;
    while left > Duration::ZERO {
        let s = left.min(step);
        clock.advance(s);
        left -= s;
        driver.settle().await;
    }
}

/// Fire records oldest first.
pub async fn fires(h: &Harness, id: &str) -> Vec<FireRecord> {
    let mut all = h
        .schedules
        .fires(&sid(id), None, 1_000)
        .await
        .unwrap()
        .fires;
    all.reverse();
    all
}

/// Waits (bounded) until the schedule has at least `n` fire records; returns them oldest first.
pub async fn wait_fires(h: &Harness, id: &str, n: usize) -> Vec<FireRecord> {
    h.driver
        .until(&format!("schedule {id} reaching {n} fires"), || async {
            let f = fires(h, id).await;
            (f.len() >= n).then_some(f)
        })
        .await
}

pub fn outcomes(f: &[FireRecord]) -> Vec<(FireOutcome, FireReason)> {
    f.iter().map(|r| (r.outcome, r.reason)).collect()
}

/// Waits (bounded) until the task reaches `state`.
pub async fn wait_state(h: &Harness, id: TaskId, state: TaskState) -> Task {
    h.driver
        .until(&format!("task {id} reaching {state}"), || async {
            h.sundial
                .get(id)
                .await
                .unwrap()
                .filter(|t| t.state == state)
        })
        .await
}

pub fn at(base: Timestamp, d: Duration) -> Timestamp {
    base.saturating_add(d)
}
