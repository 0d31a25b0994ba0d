//! Test helpers: an engine with the schedules runner on a temporary store, driven by a manual
//! clock, and a job handler that records runs and can hold them open.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sundial::{Config, ManualClock, Running, Sundial, Task, TaskId, TaskState, Timestamp};
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
    Harness {
        sundial,
        schedules,
        clock,
        dir,
        running: None,
    }
}

pub fn start(mut h: Harness) -> Harness {
    h.running = Some(h.sundial.start());
    h
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
    pub running: Arc<AtomicUsize>,
    pub max_running: Arc<AtomicUsize>,
}

impl Jobs {
    /// Runs finish at once (`true`) or wait until opened.
    pub fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }
    pub async fn next(&mut self) -> Run {
        tokio::time::timeout(Duration::from_secs(10), self.runs.recv())
            .await
            .expect("a run within 10s")
            .expect("channel open")
    }
    pub async fn none(&mut self) {
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(200), self.runs.recv()).await
        {
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
    let running = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let (r, m) = (running.clone(), max_running.clone());
    h.sundial.register("job", move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        let mut gate = gate.subscribe();
        let at = sundial::Clock::now(&clock);
        let (r, m) = (r.clone(), m.clone());
        async move {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let key = ctx.task.key.clone().unwrap_or_default();
            let nominal = FireKey::parse(&key)
                .map(|k| k.nominal)
                .unwrap_or(Timestamp(-1));
            let _ = tx.send(Run {
                task: ctx.task.id,
                nominal,
                at,
            });
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
    }
}

/// Lets the engine settle on the current time.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(60)).await;
}

/// Moves the clock forward in steps of at most a second (as real time would) and lets the engine
/// catch up after each.
pub async fn advance(h: &Harness, d: Duration) {
    let mut left = d;
    while left > Duration::ZERO {
        let step = left.min(Duration::from_secs(1));
        h.clock.advance(step);
        left -= step;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    settle().await;
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
    for _ in 0..500 {
        let f = fires(h, id).await;
        if f.len() >= n {
            return f;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "schedule {id} did not reach {n} fires: {:?}",
        fires(h, id).await
    );
}

pub fn outcomes(f: &[FireRecord]) -> Vec<(FireOutcome, FireReason)> {
    f.iter().map(|r| (r.outcome, r.reason)).collect()
}

/// Waits (bounded) until the task reaches `state`.
pub async fn wait_state(h: &Harness, id: TaskId, state: TaskState) -> Task {
    for _ in 0..500 {
        if let Some(t) = h.sundial.get(id).await.unwrap()
            && t.state == state
        {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "task {id} did not reach {state}: {:?}",
        h.sundial.get(id).await
    );
}

pub fn at(base: Timestamp, d: Duration) -> Timestamp {
    base.saturating_add(d)
}
