//! In-process handlers: the code an application registers for a task kind, and what it is given.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use sundial_core::{ExecutionId, Task};
use sundial_store::AttemptResponse;

/// What a handler sees of the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The task as claimed (state `running`, `attempt` counting this one).
    pub task: Task,
    /// This attempt's id. Effects keyed by it happen once even when a task runs more than once.
    pub execution_id: ExecutionId,
    /// The concurrency slots this run holds (see [`RunSlots`]).
    pub slots: RunSlots,
    /// Where a push handler leaves the receiver's answer for the engine to keep on the attempt
    /// beside its outcome (see [`AttemptAnswer`]).
    pub answer: AttemptAnswer,
    /// Where a handler that recorded its attempt's success itself says so (see
    /// [`SuccessRecorded`]).
    pub recorded: SuccessRecorded,
}

impl TaskContext {
    pub fn payload(&self) -> &serde_json::Value {
        &self.task.payload
    }
    pub fn attempt(&self) -> u32 {
        self.task.attempt
    }
    /// The W3C trace context this run continues, for a task created with one: the context of its
    /// `sundial.task.run` span when an OpenTelemetry layer is installed (the handler also runs
    /// inside that span, so its own `tracing` spans are children of it), else the task's stored
    /// context. Pass [`sundial_core::TraceContext::traceparent`] on in outgoing calls.
    pub fn trace(&self) -> Option<&sundial_core::TraceContext> {
        self.task.trace.as_ref()
    }
}

/// Where a handler says that it recorded its attempt's success itself, in the transaction of
/// its own work (a schedule's tick completes in its fire's transaction through
/// `FireOp::complete_tick`), so the engine does not write it a second time: the engine then
/// counts the success and hands on the places the attempt held, and writes nothing. Read only
/// when the handler returns `Ok`. A context made elsewhere has no engine behind it:
/// [`SuccessRecorded::note`] answers `false` and the caller records the success as usual.
#[derive(Clone, Default)]
pub struct SuccessRecorded(Option<Arc<AtomicBool>>);

impl fmt::Debug for SuccessRecorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SuccessRecorded")
            .field("read_by_engine", &self.0.is_some())
            .field("noted", &self.noted())
            .finish()
    }
}

impl SuccessRecorded {
    /// A flag the engine reads after the handler returns.
    pub(crate) fn read_by_engine() -> Self {
        SuccessRecorded(Some(Arc::default()))
    }

    /// Notes that this attempt's success is recorded already. `false` when no engine reads the
    /// note (the caller must record the success itself).
    pub fn note(&self) -> bool {
        match &self.0 {
            None => false,
            Some(flag) => {
                flag.store(true, Ordering::SeqCst);
                true
            }
        }
    }

    /// Whether the handler noted it.
    pub(crate) fn noted(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// Where a push handler leaves its attempt's HTTP answer (status code, content type). When the
/// engine runs the handler it keeps the answer on the attempt in a write it issues together
/// with the attempt's outcome, so both reach the store in one group commit instead of two
/// commits one after the other. A context made elsewhere (a workflow activity calling the push
/// handler itself) has no engine behind it: [`AttemptAnswer::hand_over`] gives the answer back
/// and the handler keeps it itself.
#[derive(Clone, Default)]
pub struct AttemptAnswer(Option<Arc<Mutex<Option<AttemptResponse>>>>);

impl fmt::Debug for AttemptAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptAnswer")
            .field("kept_by_engine", &self.0.is_some())
            .finish()
    }
}

impl AttemptAnswer {
    /// A slot the engine reads after the handler returns.
    pub(crate) fn kept_by_engine() -> Self {
        AttemptAnswer(Some(Arc::default()))
    }

    /// Leaves `answer` for the engine; `Some(answer)` back when no engine keeps answers for this
    /// run, for the caller to keep itself.
    pub fn hand_over(&self, answer: AttemptResponse) -> Option<AttemptResponse> {
        match &self.0 {
            None => Some(answer),
            Some(slot) => {
                let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
                *s = Some(answer);
                None
            }
        }
    }

    /// What the handler left, once.
    pub(crate) fn take(&self) -> Option<AttemptResponse> {
        let slot = self.0.as_ref()?;
        slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The concurrency slots an in-process run holds: its queue's permit or, for a push task, its
/// receiver's call slot and one of the node's push slots. The engine releases them when the
/// handler returns, before it records the attempt's outcome. A handler whose work is done before
/// it returns (a push call that has its answer and only keeps it on the attempt) may release
/// them earlier with [`RunSlots::release`], so the next due task does not wait for that
/// bookkeeping. Empty (releasing nothing) for runs the engine does not limit.
#[derive(Clone, Default)]
pub struct RunSlots(Option<Arc<SlotsInner>>);

struct SlotsInner {
    permits: Mutex<Vec<tokio::sync::OwnedSemaphorePermit>>,
    on_release: Box<dyn Fn() + Send + Sync>,
}

impl RunSlots {
    /// Slots holding `permits`; `on_release` runs once, when they are released.
    pub(crate) fn new(
        permits: Vec<tokio::sync::OwnedSemaphorePermit>,
        on_release: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        RunSlots(Some(Arc::new(SlotsInner {
            permits: Mutex::new(permits),
            on_release: Box::new(on_release),
        })))
    }

    /// Releases the slots now (idempotent): the engine may start the next task that waits for
    /// them while this handler finishes.
    pub fn release(&self) {
        let Some(inner) = &self.0 else {
            return;
        };
        let permits = match inner.permits.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        if !permits.is_empty() {
            drop(permits);
            (inner.on_release)();
        }
    }

    /// Whether slots are still held.
    pub fn held(&self) -> bool {
        self.0.as_ref().is_some_and(|i| match i.permits.lock() {
            Ok(p) => !p.is_empty(),
            Err(p) => !p.into_inner().is_empty(),
        })
    }
}

impl fmt::Debug for RunSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunSlots")
            .field("held", &self.held())
            .finish()
    }
}

/// Why a handler run failed. Retryable by default; [`HandlerError::permanent`] sends the task
/// straight to `dead`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub message: String,
    pub retryable: bool,
    /// The next attempt no sooner than this (instead of the task's backoff delay, and never
    /// beyond the backoff's cap): a push receiver's `Retry-After`.
    pub retry_after: Option<std::time::Duration>,
}

impl HandlerError {
    pub fn retryable(message: impl Into<String>) -> Self {
        HandlerError {
            message: message.into(),
            retryable: true,
            retry_after: None,
        }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        HandlerError {
            message: message.into(),
            retryable: false,
            retry_after: None,
        }
    }
    /// Asks for the next attempt after `delay` instead of the backoff's delay (capped by the
    /// backoff's maximum).
    pub fn retry_after(mut self, delay: std::time::Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for HandlerError {
    fn from(s: String) -> Self {
        HandlerError::retryable(s)
    }
}
impl From<&str> for HandlerError {
    fn from(s: &str) -> Self {
        HandlerError::retryable(s)
    }
}
impl From<Box<dyn std::error::Error + Send + Sync>> for HandlerError {
    fn from(e: Box<dyn std::error::Error + Send + Sync>) -> Self {
        HandlerError::retryable(e.to_string())
    }
}
impl From<std::io::Error> for HandlerError {
    fn from(e: std::io::Error) -> Self {
        HandlerError::retryable(e.to_string())
    }
}
impl From<serde_json::Error> for HandlerError {
    fn from(e: serde_json::Error) -> Self {
        HandlerError::retryable(e.to_string())
    }
}

pub type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<Option<serde_json::Value>, HandlerError>> + Send>>;

/// Something that runs tasks of one kind. Implemented for async closures
/// `Fn(TaskContext) -> impl Future<Output = Result<T, E>>` where `T: Serialize` (kept as the task's
/// result; `()` keeps none) and `E: Into<HandlerError>`.
pub trait Handler: Send + Sync + 'static {
    fn call(&self, ctx: TaskContext) -> HandlerFuture;

    /// Whether the engine may claim this handler's tasks a little before their due time
    /// (`Config::run_claim_lead`; the handler is still called at the due time, never before).
    /// A task claimed ahead is `running` from its claim, so a process that dies before calling
    /// the handler leaves it to the reaper at the end of its lease (the task's timeout). A
    /// handler whose tasks must come back sooner than that after a crash answers `false`, and
    /// its tasks are claimed when due, as before the lead. [`ClaimedWhenDue`] wraps a handler
    /// that way.
    fn claim_ahead(&self) -> bool {
        true
    }
}

/// A handler whose tasks are claimed only when due (see [`Handler::claim_ahead`]).
pub struct ClaimedWhenDue<H>(pub H);

impl<H: Handler> Handler for ClaimedWhenDue<H> {
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        self.0.call(ctx)
    }

    fn claim_ahead(&self) -> bool {
        false
    }
}

impl<F, Fut, T, E> Handler for F
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize,
    E: Into<HandlerError>,
{
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        let fut = (self)(ctx);
        Box::pin(async move {
            match fut.await {
                Ok(v) => match serde_json::to_value(v) {
                    Ok(serde_json::Value::Null) => Ok(None),
                    Ok(v) => Ok(Some(v)),
                    Err(e) => Err(HandlerError::permanent(format!(
                        "handler result is not serialisable: {e}"
                    ))),
                },
                Err(e) => Err(e.into()),
            }
        })
    }
}
