//! Deterministic replay: runs a workflow function from the start against its history.
//!
//! The executor is single-threaded and synchronous: it polls the workflow's future with its own
//! waker and never hands it to tokio. Everything the future awaits comes from the
//! [`WorkflowContext`] and is answered from one shared [`Machine`]:
//!
//! 1. Inputs recorded from outside (activity results, timers fired, signals, cancel requests) are
//!    *applied* in history order: they resolve the awaited calls they answer and wake them.
//! 2. At each workflow-task marker the future is polled until it stops making progress
//!    (*quiescence*: a poll that did not wake it again). Every command it issues on the way is
//!    matched, in order, against the commands recorded after that marker. A different command,
//!    an extra one, or a recorded one that is never issued is **non-determinism**: replay stops
//!    with an error naming the event number and both sides.
//! 3. After the last event the workflow runs *live*: it is polled to quiescence once more and the
//!    commands it issues now are the workflow task's output, to be recorded.
//!
//! Because the inputs between two markers are applied together, exactly as the original workflow
//! task saw them, every replay reaches the same states in the same order. `now()` is the time of
//! the current marker (or of the live task); random numbers come from a generator seeded by the
//! history's first event. Nothing here reads a clock or a random source.
//!
//! Cost: replay is linear in the history length and runs on the calling thread (a workflow task
//! handler). There is no cache of live workflow instances: every workflow task replays, so a
//! sleeping workflow holds no memory at all.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use serde_json::Value;
use sundial_core::{RunId, TaskId, Timestamp};
use thiserror::Error;
use uuid::Uuid;

use crate::WorkflowContext;
use crate::error::{ErrorKind, WorkflowError};
use crate::event::{Event, Role, WorkflowEvent};

/// A workflow function with its types erased: input and output are JSON.
pub(crate) type WorkflowFn = Arc<
    dyn Fn(
            WorkflowContext,
            Value,
        ) -> Pin<Box<dyn Future<Output = Result<Value, WorkflowError>> + Send>>
        + Send
        + Sync,
>;

/// Why a history could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplayError {
    /// The workflow code asked for something else than the history holds at `seq`.
    #[error("non-deterministic workflow at event {seq}: {message}")]
    NonDeterminism { seq: u64, message: String },
    /// The workflow code panicked.
    #[error("workflow panicked: {0}")]
    Panicked(String),
    /// The history is not a well-formed history.
    #[error("history cannot be replayed: {0}")]
    BadHistory(String),
}

impl ReplayError {
    /// The event a non-determinism error is about.
    pub fn event_seq(&self) -> Option<u64> {
        match self {
            ReplayError::NonDeterminism { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

/// What a replay produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// Commands issued after the end of the history (what a workflow task records). Empty when
    /// replaying a complete history of a closed run.
    pub new_commands: Vec<Event>,
    /// Whether the workflow function returned (in the history or in the live part).
    pub finished: bool,
}

/// Who the replayed run is.
#[derive(Debug, Clone)]
pub(crate) struct RunInfo {
    pub workflow_id: String,
    pub run_id: Option<RunId>,
    /// History length from which [`WorkflowContext::continue_as_new_suggested`] says yes.
    pub suggest_continue_after: u64,
}

impl Default for RunInfo {
    fn default() -> Self {
        RunInfo {
            workflow_id: String::new(),
            run_id: None,
            suggest_continue_after: u64::MAX,
        }
    }
}

/// The shared state between the executor and the workflow's awaited calls.
pub(crate) struct Machine {
    pub info: RunInfo,
    pub workflow_type: String,
    pub now: Timestamp,
    /// Replaying a recorded workflow task (its commands are in `expected`), not running live.
    pub replaying: bool,
    expected: VecDeque<(u64, Event)>,
    /// What follows the current recorded group, for error messages.
    group_end: Option<(u64, String)>,
    pub new_commands: Vec<Event>,
    next_cmd: u32,
    results: HashMap<u32, Result<Value, WorkflowError>>,
    names: HashMap<u32, String>,
    signals: HashMap<String, VecDeque<Value>>,
    /// Ordered: futures are woken in waiter order, so combinators that poll in wake order
    /// (`FuturesUnordered`) poll the same way on every replay.
    wakers: BTreeMap<u64, Waker>,
    next_waiter: u64,
    pub cancel_requested: bool,
    interrupted: HashSet<u64>,
    patches: HashMap<String, bool>,
    rng: u64,
    /// The history length the current workflow task started from: the number of its marker
    /// while replaying (what the original task saw), the whole history when live.
    pub history_len: u64,
    /// The whole history's length.
    total_len: u64,
    /// What `continue_as_new_suggested()` answers: recorded in each workflow task's marker.
    pub suggest_continue: bool,
    pub error: Option<ReplayError>,
    /// Set while the executor drops the workflow: drops then issue no commands.
    pub closing: bool,
    pub child_runs: HashMap<u32, RunId>,
}

impl Machine {
    fn new(info: RunInfo, workflow_type: String, seed: u64, history_len: u64) -> Self {
        Machine {
            info,
            workflow_type,
            now: Timestamp(0),
            replaying: false,
            expected: VecDeque::new(),
            group_end: None,
            new_commands: Vec::new(),
            next_cmd: 0,
            results: HashMap::new(),
            names: HashMap::new(),
            signals: HashMap::new(),
            wakers: BTreeMap::new(),
            next_waiter: 0,
            cancel_requested: false,
            interrupted: HashSet::new(),
            patches: HashMap::new(),
            rng: seed,
            history_len,
            total_len: history_len,
            suggest_continue: false,
            error: None,
            closing: false,
            child_runs: HashMap::new(),
        }
    }

    pub fn alloc_cmd(&mut self) -> u32 {
        let c = self.next_cmd;
        self.next_cmd = self.next_cmd.wrapping_add(1);
        c
    }

    pub fn alloc_waiter(&mut self) -> u64 {
        let w = self.next_waiter;
        self.next_waiter += 1;
        w
    }

    /// An id for something the live workflow task creates (recorded in its event; replay reads
    /// the recorded one instead).
    pub fn fresh_task_id(&self) -> TaskId {
        if self.replaying {
            TaskId::MIN
        } else {
            TaskId(Uuid::now_v7())
        }
    }

    pub fn fresh_run_id(&self) -> RunId {
        if self.replaying {
            RunId::MIN
        } else {
            RunId(Uuid::now_v7())
        }
    }

    /// Records a command: while replaying, checks it against the next recorded command and
    /// returns the recorded one; live, appends it to the new commands. `None` after (or on)
    /// non-determinism.
    pub fn issue(&mut self, ev: Event) -> Option<Event> {
        if self.error.is_some() {
            return None;
        }
        if !self.replaying {
            self.note(&ev);
            self.new_commands.push(ev.clone());
            return Some(ev);
        }
        match self.expected.pop_front() {
            Some((_, recorded)) if Event::same_command(&recorded, &ev) => {
                self.note(&recorded);
                Some(recorded)
            }
            Some((seq, recorded)) => {
                self.error = Some(ReplayError::NonDeterminism {
                    seq,
                    message: format!(
                        "the history has {} but the workflow issued {}",
                        recorded.describe(),
                        ev.describe()
                    ),
                });
                None
            }
            None => {
                let (seq, what) = match &self.group_end {
                    Some((seq, what)) => (*seq, format!("{what} next")),
                    None => (self.total_len, "nothing more".to_string()),
                };
                self.error = Some(ReplayError::NonDeterminism {
                    seq,
                    message: format!(
                        "the workflow issued {} where the history has {what} (the workflow task \
                         recorded fewer commands)",
                        ev.describe()
                    ),
                });
                None
            }
        }
    }

    fn note(&mut self, ev: &Event) {
        match ev {
            Event::ActivityScheduled { cmd, name, .. } => {
                self.names.insert(*cmd, format!("activity {name:?}"));
            }
            Event::ChildStartRequested {
                cmd, workflow_type, ..
            } => {
                self.names
                    .insert(*cmd, format!("child workflow {workflow_type:?}"));
            }
            _ => {}
        }
    }

    pub fn register(&mut self, waiter: u64, waker: &Waker) {
        match self.wakers.get_mut(&waiter) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => *w = waker.clone(),
            None => {
                self.wakers.insert(waiter, waker.clone());
            }
        }
    }

    pub fn unregister(&mut self, waiter: u64) {
        self.wakers.remove(&waiter);
    }

    pub fn take_result(&mut self, cmd: u32) -> Option<Result<Value, WorkflowError>> {
        self.results.remove(&cmd)
    }

    pub fn has_result(&self, cmd: u32) -> bool {
        self.results.contains_key(&cmd)
    }

    /// Whether a cancel request reached this waiter while it was waiting.
    pub fn is_interrupted(&self, waiter: u64) -> bool {
        self.interrupted.contains(&waiter)
    }

    pub fn pop_signal(&mut self, name: &str) -> Option<Value> {
        self.signals.get_mut(name).and_then(VecDeque::pop_front)
    }

    pub fn patched(&mut self, id: &str) -> bool {
        if let Some(v) = self.patches.get(id) {
            return *v;
        }
        let v = if self.replaying {
            let recorded = matches!(
                self.expected.front(),
                Some((_, Event::Patched { id: p })) if p == id
            );
            if recorded {
                self.expected.pop_front();
            }
            recorded
        } else {
            self.issue(Event::Patched { id: id.to_string() }).is_some()
        };
        self.patches.insert(id.to_string(), v);
        v
    }

    /// splitmix64: small, fast, and the same everywhere.
    pub fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn wake_all(&mut self) {
        for w in self.wakers.values() {
            w.wake_by_ref();
        }
    }

    fn apply(&mut self, ev: &Event) -> Result<(), ReplayError> {
        match ev {
            Event::ActivityCompleted { cmd, result } => {
                self.results.insert(*cmd, Ok(result.clone()));
            }
            Event::ActivityFailed {
                cmd,
                error,
                attempts,
            } => {
                let what = self
                    .names
                    .get(cmd)
                    .cloned()
                    .unwrap_or_else(|| format!("activity command {cmd}"));
                self.results.insert(
                    *cmd,
                    Err(WorkflowError::new(
                        ErrorKind::ActivityFailed,
                        format!("{what} failed after {attempts} attempt(s): {error}"),
                    )),
                );
            }
            Event::TimerFired { cmd } => {
                self.results.insert(*cmd, Ok(Value::Null));
            }
            Event::SignalReceived { name, input } => {
                self.signals
                    .entry(name.clone())
                    .or_default()
                    .push_back(input.clone());
            }
            Event::CancelRequested { .. } => {
                self.cancel_requested = true;
                self.interrupted.extend(self.wakers.keys().copied());
            }
            Event::ChildStarted { cmd, run_id } => {
                self.child_runs.insert(*cmd, *run_id);
            }
            Event::ChildStartFailed { cmd, error } => {
                self.results.insert(
                    *cmd,
                    Err(WorkflowError::new(
                        ErrorKind::ChildFailed,
                        format!("child workflow could not start: {error}"),
                    )),
                );
            }
            Event::ChildClosed {
                cmd,
                status,
                result,
                error,
            } => {
                let r = if status == "completed" {
                    Ok(result.clone().unwrap_or(Value::Null))
                } else {
                    let what = self
                        .names
                        .get(cmd)
                        .cloned()
                        .unwrap_or_else(|| format!("child command {cmd}"));
                    let kind = if status == "cancelled" {
                        ErrorKind::Cancelled
                    } else {
                        ErrorKind::ChildFailed
                    };
                    Err(WorkflowError::new(
                        kind,
                        format!(
                            "{what} {status}: {}",
                            error.as_deref().unwrap_or("no reason given")
                        ),
                    ))
                };
                self.results.insert(*cmd, r);
            }
            Event::WorkflowTerminated { .. } => {}
            other => {
                return Err(ReplayError::BadHistory(format!(
                    "{} is not an input",
                    other.type_name()
                )));
            }
        }
        self.wake_all();
        Ok(())
    }

    fn close_command(&self, out: Result<Value, WorkflowError>) -> Event {
        match out {
            Ok(result) => Event::WorkflowCompleted { result },
            Err(e) if e.kind() == ErrorKind::ContinueAsNew => Event::WorkflowContinuedAsNew {
                new_run_id: self.fresh_run_id(),
                input: e.next_input().cloned().unwrap_or(Value::Null),
            },
            Err(e) if e.is_cancelled() => Event::WorkflowCancelled {
                error: e.message().to_string(),
            },
            Err(e) => Event::WorkflowFailed {
                error: e.message().to_string(),
            },
        }
    }
}

/// Locks the machine; a poisoned lock (a panic elsewhere) is still usable: the machine's state
/// changes are single steps.
pub(crate) fn lock(m: &Mutex<Machine>) -> MutexGuard<'_, Machine> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls after which a workflow that is still woken on every poll is declared stuck.
const MAX_POLLS_PER_STEP: usize = 100_000;

type WorkflowFuture = Pin<Box<dyn Future<Output = Result<Value, WorkflowError>> + Send>>;

struct Executor {
    ctx: WorkflowContext,
    fut: Option<WorkflowFuture>,
    flag: Arc<Flag>,
    waker: Waker,
}

impl Executor {
    /// Polls until the workflow stops making progress. Returns whether it finished.
    fn settle(&mut self) -> Result<bool, ReplayError> {
        let Some(fut) = self.fut.as_mut() else {
            return Ok(true);
        };
        let mut cx = Context::from_waker(&self.waker);
        for _ in 0..MAX_POLLS_PER_STEP {
            self.flag.0.store(false, Ordering::SeqCst);
            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)));
            match polled {
                Err(panic) => return Err(ReplayError::Panicked(panic_message(panic.as_ref()))),
                Ok(Poll::Ready(out)) => {
                    self.fut = None;
                    let mut m = self.ctx.machine();
                    let close = m.close_command(out);
                    m.issue(close);
                    return Ok(true);
                }
                Ok(Poll::Pending) => {
                    if self.ctx.machine().error.is_some() || !self.flag.0.load(Ordering::SeqCst) {
                        return Ok(false);
                    }
                }
            }
        }
        Err(ReplayError::BadHistory(
            "the workflow never settles: it is woken again on every poll".into(),
        ))
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Replays `history` with `workflow` and runs it live at `now` past the end of it.
pub(crate) fn replay(
    workflow: &WorkflowFn,
    history: &[WorkflowEvent],
    info: RunInfo,
    now: Timestamp,
) -> Result<Replayed, ReplayError> {
    let Some(first) = history.first() else {
        return Err(ReplayError::BadHistory("the history is empty".into()));
    };
    let Event::WorkflowStarted {
        workflow_type,
        input,
        seed,
        ..
    } = &first.event
    else {
        return Err(ReplayError::BadHistory(
            "event 0 is not workflow_started".into(),
        ));
    };
    let machine = Machine::new(info, workflow_type.clone(), *seed, history.len() as u64);
    let ctx = WorkflowContext::new(Arc::new(Mutex::new(machine)));
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let mut exec = Executor {
        fut: Some(workflow(ctx.clone(), input.clone())),
        ctx,
        waker: Waker::from(flag.clone()),
        flag,
    };
    let outcome = drive(&mut exec, history, now);
    // Dropping the workflow is not the workflow giving up on anything: no commands.
    exec.ctx.machine().closing = true;
    exec.fut = None;
    let finished = outcome?;
    let mut m = exec.ctx.machine();
    if let Some(e) = m.error.take() {
        return Err(e);
    }
    Ok(Replayed {
        new_commands: std::mem::take(&mut m.new_commands),
        finished,
    })
}

fn drive(
    exec: &mut Executor,
    history: &[WorkflowEvent],
    now: Timestamp,
) -> Result<bool, ReplayError> {
    let mut finished = false;
    let n = history.len();
    let mut i = 1;
    while i < n {
        let e = &history[i];
        if e.seq != i as u64 {
            return Err(ReplayError::BadHistory(format!(
                "event {i} carries number {}",
                e.seq
            )));
        }
        match e.event.role() {
            Role::Start => {
                return Err(ReplayError::BadHistory(format!(
                    "event {i}: a second workflow_started"
                )));
            }
            Role::Command => {
                return Err(ReplayError::BadHistory(format!(
                    "event {i}: {} outside a workflow task",
                    e.event.type_name()
                )));
            }
            Role::Input => {
                exec.ctx.machine().apply(&e.event)?;
                i += 1;
            }
            Role::Marker => {
                let mut j = i + 1;
                let mut expected = VecDeque::new();
                while j < n && history[j].event.role() == Role::Command {
                    expected.push_back((history[j].seq, history[j].event.clone()));
                    j += 1;
                }
                {
                    let mut m = exec.ctx.machine();
                    m.now = e.at;
                    m.history_len = e.seq;
                    m.suggest_continue = matches!(
                        e.event,
                        Event::WorkflowTaskCompleted {
                            continue_as_new_suggested: true
                        }
                    );
                    m.replaying = true;
                    m.expected = expected;
                    m.group_end = history.get(j).map(|h| (h.seq, h.event.describe()));
                }
                if !finished {
                    finished = exec.settle()?;
                }
                let mut m = exec.ctx.machine();
                if let Some(err) = m.error.take() {
                    return Err(err);
                }
                if let Some((seq, ev)) = m.expected.front() {
                    return Err(ReplayError::NonDeterminism {
                        seq: *seq,
                        message: format!(
                            "the history has {} but the workflow did not issue it",
                            ev.describe()
                        ),
                    });
                }
                i = j;
            }
        }
    }
    {
        let mut m = exec.ctx.machine();
        m.replaying = false;
        m.now = now;
        m.history_len = n as u64;
        m.suggest_continue = m.history_len >= m.info.suggest_continue_after;
        m.expected.clear();
        m.group_end = None;
    }
    if !finished {
        finished = exec.settle()?;
    }
    Ok(finished)
}
