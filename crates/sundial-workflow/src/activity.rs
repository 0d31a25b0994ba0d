//! Activities: the steps of a workflow that do I/O. Each scheduled activity is a kernel task
//! (queue [`ACTIVITY_QUEUE`](sundial_store::ACTIVITY_QUEUE), kind `activity/<name>`), so it gets
//! the kernel's timeouts, leases, retries with backoff and crash recovery. An activity runs at
//! least once per attempt it needs; its result is recorded in the workflow's history at most
//! once, and once recorded the activity is never run again for that step.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sundial::{Backoff, ExecutionId, HandlerError, Sundial, Task};
use sundial_core::RunId;
use tokio::sync::watch;

/// Why an activity attempt failed: retryable (the default) or permanent.
pub type ActivityError = HandlerError;

/// How often and how patiently an activity is attempted.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included (at least 1).
    pub max_attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    /// Five attempts, 1 s apart and doubling, up to a minute (20 % jitter).
    fn default() -> Self {
        RetryPolicy::exponential(5)
    }
}

impl RetryPolicy {
    /// `max_attempts` attempts, 1 s apart and doubling, up to a minute (20 % jitter).
    pub fn exponential(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(60)),
        }
    }
    /// `max_attempts` attempts, `delay` apart.
    pub fn fixed(max_attempts: u32, delay: Duration) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::fixed(delay),
        }
    }
    /// One attempt only.
    pub fn none() -> Self {
        RetryPolicy::fixed(1, Duration::from_secs(1))
    }
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

/// What an activity function is given.
#[derive(Clone)]
pub struct ActivityContext {
    pub(crate) task: Task,
    pub(crate) execution: ExecutionId,
    pub(crate) run_id: RunId,
    pub(crate) cmd: u32,
    pub(crate) sundial: Sundial,
    pub(crate) cancel: watch::Receiver<bool>,
}

impl ActivityContext {
    /// The workflow run that scheduled this activity.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }
    /// The activity's command number in its run: `(run_id, cmd)` names the step.
    pub fn cmd(&self) -> u32 {
        self.cmd
    }
    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.task.attempt
    }
    /// This attempt's id. Effects keyed by it happen once even when an attempt is retried.
    pub fn execution_id(&self) -> ExecutionId {
        self.execution
    }
    /// The kernel task behind the activity.
    pub fn task(&self) -> &Task {
        &self.task
    }
    /// Extends this attempt's lease by its timeout. Fails (permanently) when the activity was
    /// cancelled or the attempt no longer owns the task.
    pub async fn heartbeat(&self) -> Result<(), ActivityError> {
        if self.is_cancelled() {
            return Err(ActivityError::permanent("activity cancelled"));
        }
        match self.sundial.heartbeat(self.task.id, self.execution).await {
            Ok(_) => Ok(()),
            Err(e @ (sundial::Error::StaleExecution { .. } | sundial::Error::NotFound)) => Err(
                ActivityError::permanent(format!("activity no longer owned: {e}")),
            ),
            Err(e) => Err(ActivityError::retryable(e.to_string())),
        }
    }
    /// Whether the workflow cancelled this activity (in-process attempts are also interrupted).
    pub fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }
    /// Completes when the workflow cancels this activity.
    pub async fn cancelled(&self) {
        let mut rx = self.cancel.clone();
        loop {
            if *rx.borrow_and_update() {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

pub(crate) type ActivityFuture = Pin<Box<dyn Future<Output = Result<Value, ActivityError>> + Send>>;

/// An activity function with its types erased.
pub(crate) type ActivityFn = Arc<dyn Fn(ActivityContext, Value) -> ActivityFuture + Send + Sync>;

pub(crate) fn erase<I, O, F, Fut>(f: F) -> ActivityFn
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + 'static,
    F: Fn(ActivityContext, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ActivityError>> + Send + 'static,
{
    Arc::new(
        move |ctx: ActivityContext, input: Value| -> ActivityFuture {
            match serde_json::from_value::<I>(input) {
                Ok(input) => {
                    let fut = f(ctx, input);
                    Box::pin(async move {
                        let out = fut.await?;
                        serde_json::to_value(out).map_err(|e| {
                            ActivityError::permanent(format!(
                                "activity result is not serialisable: {e}"
                            ))
                        })
                    })
                }
                Err(e) => Box::pin(async move {
                    Err(ActivityError::permanent(format!(
                        "activity input is not of the expected type: {e}"
                    )))
                }),
            }
        },
    )
}
