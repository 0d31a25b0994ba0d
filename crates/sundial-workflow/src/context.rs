//! The workflow context: everything workflow code may await, and nothing else.
//!
//! Workflow code must be deterministic: given the same history it must issue the same commands in
//! the same order. So it reads time with [`WorkflowContext::now`], draws random numbers with
//! [`WorkflowContext::random_u64`], does I/O only in activities, records anything else
//! non-deterministic with [`WorkflowContext::side_effect`], and awaits only the futures this
//! module returns (and combinations of them: [`race`], `futures::join!`,
//! `futures::select_biased!`; not `futures::select!`, which picks among ready branches at
//! random). Awaiting anything else (a tokio timer, a channel) blocks the workflow task for good.
//!
//! **Cancellation.** When the workflow is asked to cancel, every call it is awaiting at that moment
//! (activity, timer, signal, child) returns an error for which
//! [`WorkflowError::is_cancelled`] is true, and the activity, timer or child behind it is cancelled.
//! Calls made afterwards run normally, so compensation is plain code after the error.
//!
//! **Dropping a call** that was issued (say, the losing side of a [`race`]) cancels what is
//! behind it: an activity task is cancelled (a running in-process attempt is interrupted), a
//! timer is removed.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

pub use futures::future::Either;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sundial_core::{RunId, TaskId, Timestamp};
use uuid::Uuid;

use crate::activity::RetryPolicy;
use crate::error::WorkflowError;
use crate::event::Event;
use crate::replay::{Machine, lock};

/// What a workflow function is given: its identity, deterministic time and randomness, and the
/// calls that make up its progress. Cheap to clone; clones share the run.
#[derive(Clone)]
pub struct WorkflowContext {
    m: Arc<Mutex<Machine>>,
}

fn cancelled(what: &str) -> WorkflowError {
    WorkflowError::cancelled(format!(
        "{what} cancelled: the workflow was asked to cancel"
    ))
}

fn decode<T: DeserializeOwned>(v: Value, what: &str) -> Result<T, WorkflowError> {
    serde_json::from_value(v)
        .map_err(|e| WorkflowError::failed(format!("{what} is not of the expected type: {e}")))
}

impl WorkflowContext {
    pub(crate) fn new(m: Arc<Mutex<Machine>>) -> Self {
        WorkflowContext { m }
    }

    pub(crate) fn machine(&self) -> MutexGuard<'_, Machine> {
        lock(&self.m)
    }

    pub fn workflow_id(&self) -> String {
        self.machine().info.workflow_id.clone()
    }

    /// This run's id (nil when replaying a bare history).
    pub fn run_id(&self) -> RunId {
        self.machine().info.run_id.unwrap_or(RunId::MIN)
    }

    pub fn workflow_type(&self) -> String {
        self.machine().workflow_type.clone()
    }

    /// The current time as the workflow sees it: the time of the workflow task it is running in.
    /// The same on every replay.
    pub fn now(&self) -> Timestamp {
        self.machine().now
    }

    /// Whether this code is being replayed from history (as opposed to running for the first
    /// time). Useful to silence logs; never branch workflow logic on it.
    pub fn is_replaying(&self) -> bool {
        self.machine().replaying
    }

    /// The number of events in the history when the current workflow task started (the same
    /// on every replay).
    pub fn history_length(&self) -> u64 {
        self.machine().history_len
    }

    /// Whether the history has grown large enough that a long-running loop should
    /// [`continue as new`](WorkflowError::continue_as_new).
    /// The answer is recorded with each workflow task, so replays see the same answer even when
    /// the threshold ([`WorkflowConfig::history_warn_events`](crate::WorkflowConfig)) changed.
    pub fn continue_as_new_suggested(&self) -> bool {
        self.machine().suggest_continue
    }

    /// Whether the workflow has been asked to cancel.
    pub fn is_cancel_requested(&self) -> bool {
        self.machine().cancel_requested
    }

    /// A random number, the same on every replay.
    pub fn random_u64(&self) -> u64 {
        self.machine().next_random()
    }

    /// A random number in `[0, 1)`, the same on every replay.
    pub fn random_f64(&self) -> f64 {
        (self.random_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A random (version 4) UUID, the same on every replay.
    pub fn uuid(&self) -> Uuid {
        let (hi, lo) = {
            let mut m = self.machine();
            (m.next_random(), m.next_random())
        };
        uuid::Builder::from_random_bytes(((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes())
            .into_uuid()
    }

    /// Runs `f` once and records its result; replays return the recorded result without running
    /// `f`. For small non-deterministic values (an id from elsewhere, a configuration read).
    pub fn side_effect<T, F>(&self, f: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> T,
    {
        let replaying = self.machine().replaying;
        let value = if replaying {
            Value::Null
        } else {
            serde_json::to_value(f()).map_err(|e| {
                WorkflowError::failed(format!("side effect value is not serialisable: {e}"))
            })?
        };
        let recorded = {
            let mut m = self.machine();
            let cmd = m.alloc_cmd();
            m.issue(Event::SideEffect { cmd, value })
        };
        match recorded {
            Some(Event::SideEffect { value, .. }) => decode(value, "the recorded side effect"),
            _ => Err(WorkflowError::failed(
                "side effect does not match the history",
            )),
        }
    }

    /// Versioning: whether this point of the workflow runs the code introduced by change `id`.
    ///
    /// True when running live (and recorded as a marker), true when replaying a history that
    /// recorded the marker here, false when replaying a history written before the change. Keep
    /// the old branch until no run that started before the change is left.
    pub fn patched(&self, id: &str) -> bool {
        self.machine().patched(id)
    }

    /// Schedules the activity `name` with `input` and waits for its result. Configure with
    /// [`ActivityCall::retry`] and [`ActivityCall::timeout`] before awaiting.
    pub fn activity<I, O>(&self, name: &str, input: &I) -> ActivityCall<O>
    where
        I: Serialize + ?Sized,
        O: DeserializeOwned,
    {
        let waiter = self.machine().alloc_waiter();
        ActivityCall {
            ctx: self.clone(),
            name: name.to_string(),
            input: serde_json::to_value(input).map_err(|e| e.to_string()),
            retry: RetryPolicy::default(),
            timeout: sundial::TaskSpec::DEFAULT_TIMEOUT,
            target: None,
            state: CallState::Init,
            waiter,
            _out: PhantomData,
        }
    }

    /// A durable timer: completes once `duration` has passed on the engine's clock, across
    /// restarts. While it waits the workflow holds no memory, no task and no thread: it is a row.
    pub fn sleep(&self, duration: Duration) -> Timer {
        let waiter = self.machine().alloc_waiter();
        Timer {
            ctx: self.clone(),
            duration,
            state: CallState::Init,
            waiter,
        }
    }

    /// The same as [`WorkflowContext::sleep`].
    pub fn timer(&self, duration: Duration) -> Timer {
        self.sleep(duration)
    }

    /// Waits for the next signal called `name` (signals that arrived earlier are buffered, in
    /// order). [`SignalWait::timeout`] gives up after a while.
    pub fn signal<T: DeserializeOwned>(&self, name: &str) -> SignalWait<T> {
        let waiter = self.machine().alloc_waiter();
        SignalWait {
            ctx: self.clone(),
            name: name.to_string(),
            waiter,
            done: false,
            _out: PhantomData,
        }
    }

    /// Starts a child workflow of `workflow_type` and waits for its result. Its workflow id is
    /// `<this workflow id>/<command number>` unless set with [`ChildCall::id`].
    pub fn child<I, O>(&self, workflow_type: &str, input: &I) -> ChildCall<O>
    where
        I: Serialize + ?Sized,
        O: DeserializeOwned,
    {
        let waiter = self.machine().alloc_waiter();
        ChildCall {
            ctx: self.clone(),
            workflow_type: workflow_type.to_string(),
            workflow_id: None,
            input: serde_json::to_value(input).map_err(|e| e.to_string()),
            state: ChildState::Init,
            waiter,
            _out: PhantomData,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum CallState {
    Init,
    Issued { cmd: u32, task: TaskId },
    Done,
}

/// An activity call: a future of the activity's result.
#[must_use = "an activity call does nothing unless awaited"]
pub struct ActivityCall<O> {
    ctx: WorkflowContext,
    name: String,
    input: Result<Value, String>,
    retry: RetryPolicy,
    timeout: Duration,
    target: Option<sundial_core::Target>,
    state: CallState,
    waiter: u64,
    _out: PhantomData<fn() -> O>,
}

impl<O> ActivityCall<O> {
    /// Makes the activity an HTTP call: Sundial calls `target` (signed, like a push task; the
    /// input is the JSON body) instead of running activity code, under the retry policy and
    /// timeout given here (the call's own timeout is at most the activity's). A 2xx answer's
    /// body is the result (JSON when it is JSON, else a string); 429, 5xx and connection errors
    /// are retried while the policy allows; other 4xx fail the activity.
    pub fn target(mut self, target: sundial_core::Target) -> Self {
        self.target = Some(target);
        self
    }
    /// Attempts and backoff (default: [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// Time limit of one attempt (default five minutes). An attempt that runs longer is
    /// abandoned and counts as a failed attempt.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl<O: DeserializeOwned> Future for ActivityCall<O> {
    type Output = Result<O, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut m = this.ctx.machine();
        if let CallState::Init = this.state {
            let input = match &this.input {
                Ok(v) => v.clone(),
                Err(e) => {
                    this.state = CallState::Done;
                    return Poll::Ready(Err(WorkflowError::failed(format!(
                        "input of activity {:?} is not serialisable: {e}",
                        this.name
                    ))));
                }
            };
            let cmd = m.alloc_cmd();
            let ev = Event::ActivityScheduled {
                cmd,
                name: this.name.clone(),
                input,
                task: m.fresh_task_id(),
                max_attempts: this.retry.max_attempts,
                timeout_ms: u64::try_from(this.timeout.as_millis()).unwrap_or(u64::MAX),
                backoff: this.retry.backoff.clone(),
                target: this.target.clone(),
            };
            match m.issue(ev) {
                Some(Event::ActivityScheduled { task, .. }) => {
                    this.state = CallState::Issued { cmd, task }
                }
                _ => {
                    this.state = CallState::Done;
                    return Poll::Pending;
                }
            }
        }
        let CallState::Issued { cmd, task } = this.state else {
            return Poll::Pending;
        };
        if let Some(r) = m.take_result(cmd) {
            m.unregister(this.waiter);
            this.state = CallState::Done;
            drop(m);
            return Poll::Ready(r.and_then(|v| decode(v, &format!("result of {:?}", this.name))));
        }
        if m.is_interrupted(this.waiter) {
            m.unregister(this.waiter);
            m.issue(Event::ActivityCancelRequested { cmd, task });
            this.state = CallState::Done;
            return Poll::Ready(Err(cancelled(&format!("activity {:?}", this.name))));
        }
        m.register(this.waiter, cx.waker());
        Poll::Pending
    }
}

impl<O> Drop for ActivityCall<O> {
    fn drop(&mut self) {
        if let CallState::Issued { cmd, task } = self.state {
            let mut m = self.ctx.machine();
            m.unregister(self.waiter);
            if !m.closing && !m.has_result(cmd) {
                m.issue(Event::ActivityCancelRequested { cmd, task });
            }
        }
    }
}

/// A durable timer: a future that completes when its time has come.
#[must_use = "a timer does nothing unless awaited"]
pub struct Timer {
    ctx: WorkflowContext,
    duration: Duration,
    state: CallState,
    waiter: u64,
}

impl Future for Timer {
    type Output = Result<(), WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut m = this.ctx.machine();
        if let CallState::Init = this.state {
            if this.duration.is_zero() {
                this.state = CallState::Done;
                return Poll::Ready(Ok(()));
            }
            let cmd = m.alloc_cmd();
            let ev = Event::TimerStarted {
                cmd,
                fire_at: m.now.saturating_add(this.duration),
                task: m.fresh_task_id(),
            };
            match m.issue(ev) {
                Some(Event::TimerStarted { task, .. }) => {
                    this.state = CallState::Issued { cmd, task }
                }
                _ => {
                    this.state = CallState::Done;
                    return Poll::Pending;
                }
            }
        }
        let CallState::Issued { cmd, task } = this.state else {
            return Poll::Pending;
        };
        if m.take_result(cmd).is_some() {
            m.unregister(this.waiter);
            this.state = CallState::Done;
            return Poll::Ready(Ok(()));
        }
        if m.is_interrupted(this.waiter) {
            m.unregister(this.waiter);
            m.issue(Event::TimerCancelled { cmd, task });
            this.state = CallState::Done;
            return Poll::Ready(Err(cancelled("timer")));
        }
        m.register(this.waiter, cx.waker());
        Poll::Pending
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let CallState::Issued { cmd, task } = self.state {
            let mut m = self.ctx.machine();
            m.unregister(self.waiter);
            if !m.closing && !m.has_result(cmd) {
                m.issue(Event::TimerCancelled { cmd, task });
            }
        }
    }
}

/// Waits for a signal.
#[must_use = "a signal wait does nothing unless awaited"]
pub struct SignalWait<T> {
    ctx: WorkflowContext,
    name: String,
    waiter: u64,
    done: bool,
    _out: PhantomData<fn() -> T>,
}

impl<T> SignalWait<T> {
    /// Gives up after `duration` (a durable timer): the result is `None` when no signal came in
    /// time. A signal already buffered is returned at once, without a timer.
    pub fn timeout(self, duration: Duration) -> SignalTimeout<T> {
        let ctx = self.ctx.clone();
        let name = self.name.clone();
        let waiter = self.waiter;
        SignalTimeout {
            ctx,
            name,
            duration,
            timer: None,
            waiter,
            done: false,
            _out: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Future for SignalWait<T> {
    type Output = Result<T, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.done {
            return Poll::Pending;
        }
        let mut m = this.ctx.machine();
        if let Some(v) = m.pop_signal(&this.name) {
            m.unregister(this.waiter);
            this.done = true;
            drop(m);
            return Poll::Ready(decode(v, &format!("signal {:?}", this.name)));
        }
        if m.is_interrupted(this.waiter) {
            m.unregister(this.waiter);
            this.done = true;
            return Poll::Ready(Err(cancelled(&format!("wait for signal {:?}", this.name))));
        }
        m.register(this.waiter, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for SignalWait<T> {
    fn drop(&mut self) {
        self.ctx.machine().unregister(self.waiter);
    }
}

/// Waits for a signal for a limited time.
#[must_use = "a signal wait does nothing unless awaited"]
pub struct SignalTimeout<T> {
    ctx: WorkflowContext,
    name: String,
    duration: Duration,
    timer: Option<Timer>,
    waiter: u64,
    done: bool,
    _out: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Future for SignalTimeout<T> {
    type Output = Result<Option<T>, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.done {
            return Poll::Pending;
        }
        let signal = {
            let mut m = this.ctx.machine();
            match m.pop_signal(&this.name) {
                Some(v) => Some(Ok(v)),
                None if m.is_interrupted(this.waiter) => Some(Err(())),
                None => None,
            }
        };
        match signal {
            Some(Ok(v)) => {
                this.done = true;
                this.ctx.machine().unregister(this.waiter);
                this.timer = None; // cancels the timer if it was started
                return Poll::Ready(decode(v, &format!("signal {:?}", this.name)).map(Some));
            }
            Some(Err(())) => {
                this.done = true;
                this.ctx.machine().unregister(this.waiter);
                this.timer = None;
                return Poll::Ready(Err(cancelled(&format!("wait for signal {:?}", this.name))));
            }
            None => {}
        }
        let timer = this
            .timer
            .get_or_insert_with(|| this.ctx.sleep(this.duration));
        match Pin::new(timer).poll(cx) {
            Poll::Ready(r) => {
                this.done = true;
                this.ctx.machine().unregister(this.waiter);
                this.timer = None;
                Poll::Ready(r.map(|()| None))
            }
            Poll::Pending => {
                this.ctx.machine().register(this.waiter, cx.waker());
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for SignalTimeout<T> {
    fn drop(&mut self) {
        self.ctx.machine().unregister(self.waiter);
    }
}

#[derive(Debug, Clone)]
enum ChildState {
    Init,
    Issued { cmd: u32, workflow_id: String },
    Done,
}

/// A child workflow call: a future of the child's result.
#[must_use = "a child workflow call does nothing unless awaited"]
pub struct ChildCall<O> {
    ctx: WorkflowContext,
    workflow_type: String,
    workflow_id: Option<String>,
    input: Result<Value, String>,
    state: ChildState,
    waiter: u64,
    _out: PhantomData<fn() -> O>,
}

impl<O> ChildCall<O> {
    /// The child's workflow id (default `<parent workflow id>/<command number>`).
    pub fn id(mut self, workflow_id: impl Into<String>) -> Self {
        self.workflow_id = Some(workflow_id.into());
        self
    }
}

impl<O: DeserializeOwned> Future for ChildCall<O> {
    type Output = Result<O, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut m = this.ctx.machine();
        if let ChildState::Init = this.state {
            let input = match &this.input {
                Ok(v) => v.clone(),
                Err(e) => {
                    this.state = ChildState::Done;
                    return Poll::Ready(Err(WorkflowError::failed(format!(
                        "input of child workflow {:?} is not serialisable: {e}",
                        this.workflow_type
                    ))));
                }
            };
            let cmd = m.alloc_cmd();
            let workflow_id = this
                .workflow_id
                .clone()
                .unwrap_or_else(|| format!("{}/{cmd}", m.info.workflow_id));
            let ev = Event::ChildStartRequested {
                cmd,
                workflow_type: this.workflow_type.clone(),
                workflow_id,
                input,
                task: m.fresh_task_id(),
            };
            match m.issue(ev) {
                Some(Event::ChildStartRequested { workflow_id, .. }) => {
                    this.state = ChildState::Issued { cmd, workflow_id }
                }
                _ => {
                    this.state = ChildState::Done;
                    return Poll::Pending;
                }
            }
        }
        let ChildState::Issued { cmd, workflow_id } = this.state.clone() else {
            return Poll::Pending;
        };
        if let Some(r) = m.take_result(cmd) {
            m.unregister(this.waiter);
            this.state = ChildState::Done;
            drop(m);
            return Poll::Ready(
                r.and_then(|v| decode(v, &format!("result of child workflow {workflow_id:?}"))),
            );
        }
        if m.is_interrupted(this.waiter) {
            m.unregister(this.waiter);
            let task = m.fresh_task_id();
            m.issue(Event::ChildCancelRequested {
                cmd,
                workflow_id: workflow_id.clone(),
                task,
            });
            this.state = ChildState::Done;
            return Poll::Ready(Err(cancelled(&format!("child workflow {workflow_id:?}"))));
        }
        m.register(this.waiter, cx.waker());
        Poll::Pending
    }
}

impl<O> Drop for ChildCall<O> {
    fn drop(&mut self) {
        if let ChildState::Issued { cmd, workflow_id } = self.state.clone() {
            let mut m = self.ctx.machine();
            m.unregister(self.waiter);
            if !m.closing && !m.has_result(cmd) {
                let task = m.fresh_task_id();
                m.issue(Event::ChildCancelRequested {
                    cmd,
                    workflow_id,
                    task,
                });
            }
        }
    }
}

/// Races two workflow futures: the first to finish wins, the other is dropped (and what it was
/// waiting for is cancelled). `a` is polled first, so when both are ready at once `a` wins, on
/// every replay alike.
pub async fn race<A, B>(a: A, b: B) -> Either<A::Output, B::Output>
where
    A: Future,
    B: Future,
{
    let a = std::pin::pin!(a);
    let b = std::pin::pin!(b);
    match futures::future::select(a, b).await {
        Either::Left((x, _)) => Either::Left(x),
        Either::Right((y, _)) => Either::Right(y),
    }
}
