//! Test helpers: an engine with the workflow runtime on a temporary store, driven by a manual
//! clock. Time only moves when a test moves it, and the engine's loops are not started: the
//! harness turns them with the engine's [`Stepper`] and waits for handler runs by event, so
//! nothing waits for real time. A test whose activity hangs on purpose says so with [`Held`],
//! which settling does not wait for.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sundial::{
    Config, ManualClock, Retention, Running, Stepper, Sundial, TaskFilter, TaskState, Timestamp,
};
use sundial_workflow::{
    StartWorkflow, WorkflowConfig, WorkflowEvent, WorkflowRun, WorkflowStatus, Workflows,
};

/// 2023-11-14T22:13:20Z.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);
pub const MIN: Duration = Duration::from_secs(60);
pub const DAY: Duration = Duration::from_secs(86_400);

pub struct Harness {
    pub sundial: Sundial,
    pub workflows: Workflows,
    pub clock: ManualClock,
    pub dir: tempfile::TempDir,
    pub running: Option<Running>,
    stepper: tokio::sync::Mutex<Stepper>,
    held: Held,
}

/// How many runs a test's handlers hold open on purpose (an activity that hangs until it is
/// timed out or cancelled): settling does not wait for them.
#[derive(Clone, Default)]
pub struct Held(Arc<AtomicUsize>);

impl Held {
    /// Counts one held run until the guard is dropped (with the run's future).
    pub fn hold(&self) -> HoldGuard {
        self.0.fetch_add(1, Ordering::SeqCst);
        HoldGuard(self.0.clone())
    }
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

pub struct HoldGuard(Arc<AtomicUsize>);

impl Drop for HoldGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Most rounds a wait for the engine takes, each a settle and a millisecond's pause (a bound on
/// a test that went wrong).
const ROUNDS: usize = 10_000;

/// A started engine with the workflow runtime; `setup` registers workflows and activities
/// before the engine starts.
pub async fn harness(setup: impl FnOnce(&Workflows)) -> Harness {
    harness_with(WorkflowConfig::default(), setup).await
}

pub async fn harness_with(config: WorkflowConfig, setup: impl FnOnce(&Workflows)) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    // These tests move the clock on by days and then read closed runs' histories, so retention
    // (which deletes runs 7 days after they close) is off here; it has tests of its own
    // (`crates/sundial/tests/retention.rs`, the stores' conformance suites).
    let engine = Config {
        retention: Retention {
            enabled: false,
            ..Retention::default()
        },
        ..Config::default()
    };
    let sundial = Sundial::builder()
        .config(engine)
        .clock(Arc::new(clock.clone()))
        .open(dir.path())
        .await
        .unwrap();
    let workflows = Workflows::attach_with(&sundial, config).unwrap();
    setup(&workflows);
    let stepper = tokio::sync::Mutex::new(sundial.stepper());
    let running = Some(sundial.start());
    Harness {
        sundial,
        workflows,
        clock,
        dir,
        running,
        stepper,
        held: Held::default(),
    }
}

impl Harness {
    /// Settling does not wait for the runs `held` counts.
    pub fn holding(mut self, held: &Held) -> Self {
        self.held = held.clone();
        self
    }

    /// Turns the engine's loops until nothing is left to do at the clock's time but held runs.
    pub async fn settle(&self) {
        let held = self.held.clone();
        self.stepper
            .lock()
            .await
            .settle_holding(move || held.count())
            .await;
    }

    /// Settles until `check` says yes (bounded). Settling makes most states true at once; the
    /// loop is for what a handler run does after its result is recorded (a child workflow's
    /// parent woken, an interrupted attempt's future dropped).
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

    pub async fn start(
        &self,
        workflow_type: &str,
        id: &str,
        input: serde_json::Value,
    ) -> WorkflowRun {
        self.workflows
            .start(StartWorkflow::new(workflow_type, input).id(id))
            .await
            .unwrap()
    }

    pub async fn run(&self, id: &str) -> WorkflowRun {
        self.workflows.get(id).await.unwrap().unwrap()
    }

    pub async fn history(&self, id: &str) -> Vec<WorkflowEvent> {
        let run = self.run(id).await;
        self.workflows.history(run.run_id).await.unwrap()
    }

    /// Event types of the current run's history (empty while the workflow does not exist).
    pub async fn types(&self, id: &str) -> Vec<&'static str> {
        let Some(run) = self.workflows.get(id).await.unwrap() else {
            return Vec::new();
        };
        self.workflows
            .history(run.run_id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.event.type_name())
            .collect()
    }

    /// Settles (bounded) until the current run has reached `status`.
    pub async fn wait_status(&self, id: &str, status: WorkflowStatus) -> WorkflowRun {
        for _ in 0..ROUNDS {
            self.settle().await;
            if let Some(r) = self.workflows.get(id).await.unwrap()
                && r.status == status
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let r = self.workflows.get(id).await.unwrap();
        let h = match &r {
            Some(r) => self.workflows.history(r.run_id).await.unwrap(),
            None => Vec::new(),
        };
        panic!("workflow {id} did not reach {status}: {r:?}\nhistory: {h:#?}");
    }

    /// Settles until the current run's history holds at least `n` events of type `ty` and no
    /// workflow task is pending or running: the workflow is blocked, waiting for the outside.
    pub async fn wait_events(&self, id: &str, ty: &str, n: usize) {
        for _ in 0..ROUNDS {
            self.settle().await;
            let types = self.types(id).await;
            let pending = self
                .workflows
                .get(id)
                .await
                .unwrap()
                .map(|r| r.pending_task);
            if types.iter().filter(|t| **t == ty).count() >= n
                && pending == Some(None)
                && self.quiet().await
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!(
            "workflow {id} did not reach {n} {ty} events: {:?}",
            self.types(id).await
        );
    }

    /// Whether no kernel task of the workflow queues is running (nothing in flight).
    pub async fn quiet(&self) -> bool {
        self.sundial.in_flight() == 0
            && self
                .sundial
                .list(
                    TaskFilter {
                        state: Some(TaskState::Running),
                        ..TaskFilter::default()
                    },
                    10,
                )
                .await
                .unwrap()
                .tasks
                .is_empty()
    }

    /// Moves the clock forward and settles the engine.
    pub async fn advance(&self, d: Duration) {
        self.clock.advance(d);
        self.settle().await;
    }

    /// Moves the clock in steps of `step`, settling after each, until the workflow reaches
    /// `status` (bounded).
    pub async fn advance_until(
        &self,
        id: &str,
        step: Duration,
        status: WorkflowStatus,
    ) -> WorkflowRun {
        for _ in 0..200 {
            self.settle().await;
            if let Some(r) = self.workflows.get(id).await.unwrap()
                && r.status == status
            {
                return r;
            }
            if self.quiet().await {
                self.clock.advance(step);
            }
        }
        self.wait_status(id, status).await
    }
}

/// A shared log of what activities did.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().unwrap().push(s.into());
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

pub fn result(run: &WorkflowRun) -> serde_json::Value {
    serde_json::from_str(run.result.as_deref().unwrap_or("null")).unwrap()
}
