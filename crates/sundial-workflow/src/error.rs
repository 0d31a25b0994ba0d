//! Errors: [`WorkflowError`] is what workflow code sees and returns; [`Error`] is what the
//! management API ([`crate::Workflows`]) fails with.

use std::fmt;

use serde_json::Value;
use sundial::{StoreError, ValidationError};
use sundial_core::RunId;
use sundial_store::{WorkflowStatus, WorkflowStoreError};
use thiserror::Error;

/// What kind of [`WorkflowError`] this is. Open for new kinds: match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The workflow (or a step of it) failed.
    Failed,
    /// Cancelled: a cancel request interrupted an await, or the workflow gave up on purpose.
    Cancelled,
    /// An activity failed after its last attempt (or with a permanent error).
    ActivityFailed,
    /// A child workflow did not complete.
    ChildFailed,
    /// Not an error: the workflow asks to continue as a new run (see
    /// [`WorkflowError::continue_as_new`]).
    ContinueAsNew,
}

/// An error inside workflow code: returned by awaited calls on the
/// [`WorkflowContext`](crate::WorkflowContext) and by the workflow function itself.
///
/// A workflow that returns `Err` ends `failed`, or `cancelled` when the error
/// [`is_cancelled`](WorkflowError::is_cancelled), or continues as a new run for
/// [`WorkflowError::continue_as_new`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowError {
    kind: ErrorKind,
    message: String,
    /// The input of the next run, for continue-as-new.
    next_input: Option<Value>,
}

impl WorkflowError {
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Failed, message)
    }
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Cancelled, message)
    }
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        WorkflowError {
            kind,
            message: message.into(),
            next_input: None,
        }
    }
    /// Ends this run and starts the next run of the same workflow id with `input`, atomically.
    /// Return it from the workflow function: `return Err(WorkflowError::continue_as_new(&state))`.
    pub fn continue_as_new(input: &impl serde::Serialize) -> Self {
        match serde_json::to_value(input) {
            Ok(v) => WorkflowError {
                kind: ErrorKind::ContinueAsNew,
                message: "continued as new".into(),
                next_input: Some(v),
            },
            Err(e) => Self::failed(format!("continue-as-new input is not serialisable: {e}")),
        }
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    pub fn is_cancelled(&self) -> bool {
        self.kind == ErrorKind::Cancelled
    }
    pub fn is_activity_failure(&self) -> bool {
        self.kind == ErrorKind::ActivityFailed
    }
    pub(crate) fn next_input(&self) -> Option<&Value> {
        self.next_input.as_ref()
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkflowError {}

impl From<serde_json::Error> for WorkflowError {
    fn from(e: serde_json::Error) -> Self {
        WorkflowError::failed(format!("JSON: {e}"))
    }
}

impl From<String> for WorkflowError {
    fn from(s: String) -> Self {
        WorkflowError::failed(s)
    }
}

impl From<&str> for WorkflowError {
    fn from(s: &str) -> Self {
        WorkflowError::failed(s)
    }
}

/// Everything a [`crate::Workflows`] call can fail with.
#[derive(Debug, Error)]
pub enum Error {
    /// The request was refused; nothing was stored.
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("no such workflow")]
    NotFound,
    /// A run of this workflow id is running.
    #[error("workflow is already running (run {run_id})")]
    AlreadyRunning { run_id: RunId },
    /// The id reuse policy refuses a new run.
    #[error(
        "workflow id already used by run {run_id} ({status}); the id reuse policy refuses a new run"
    )]
    AlreadyExists {
        run_id: RunId,
        status: WorkflowStatus,
    },
    /// The workflow is closed.
    #[error("workflow is {status}")]
    NotRunning { status: WorkflowStatus },
    /// The store has no workflow tables (see `Sundial::workflow_store`).
    #[error("this store does not support workflows")]
    Unsupported,
    /// A stored event could not be read.
    #[error("stored history is corrupt: {0}")]
    Corrupt(String),
    /// An append from outside found the workflow continued as new every time it tried (eight
    /// runs in a row): nothing was appended.
    #[error("the workflow kept continuing as new; nothing was appended")]
    KeptContinuing,
    /// A remote activity's result could not be recorded in its run's history.
    #[error("the activity's result was not recorded: {reason}")]
    ActivityNotRecorded { reason: String },
    #[error(transparent)]
    Sundial(#[from] sundial::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound)
    }
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::AlreadyRunning { .. } | Error::AlreadyExists { .. } | Error::NotRunning { .. }
        )
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid { .. })
    }
}

impl From<WorkflowStoreError> for Error {
    fn from(e: WorkflowStoreError) -> Self {
        match e {
            WorkflowStoreError::NotFound => Error::NotFound,
            WorkflowStoreError::AlreadyRunning { run_id } => Error::AlreadyRunning { run_id },
            WorkflowStoreError::AlreadyExists { run_id, status } => {
                Error::AlreadyExists { run_id, status }
            }
            WorkflowStoreError::NotRunning { status } => Error::NotRunning { status },
            // Only workflow tasks and marked appends meet these; the public API never should.
            e @ (WorkflowStoreError::Stale { .. } | WorkflowStoreError::Duplicate) => {
                Error::Store(StoreError::backend(e))
            }
            WorkflowStoreError::Store(s) => Error::Store(s),
            other => Error::Store(StoreError::backend(other)),
        }
    }
}

impl From<ValidationError> for Error {
    fn from(e: ValidationError) -> Self {
        Error::Invalid {
            field: e.field().unwrap_or("input"),
            reason: e.to_string(),
        }
    }
}
