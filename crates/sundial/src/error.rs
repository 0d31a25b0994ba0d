//! The library's error type.

use sundial_core::{TaskId, TaskState, ValidationError};
use sundial_store::{StoreError, TransitionError};
use thiserror::Error;

/// Everything a [`crate::Sundial`] call can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The task specification was refused; nothing was stored.
    #[error("invalid task: {0}")]
    Invalid(#[from] ValidationError),
    /// One item of a batch was refused; nothing of the batch was stored.
    #[error("invalid task at index {index}: {error}")]
    InvalidBatchItem {
        index: usize,
        error: ValidationError,
    },
    /// A live task of the same queue already holds this key; nothing new was stored.
    #[error("a live task already holds this key: {existing}")]
    Duplicate { existing: TaskId },
    /// The idempotency key is remembered for another request (the same version with another
    /// body, or a newer version): nothing was stored.
    #[error(
        "the idempotency key is remembered for another request (version {version}, task {existing})"
    )]
    IdempotencyConflict { existing: TaskId, version: u64 },
    #[error("no such task")]
    NotFound,
    /// The task's state does not allow the operation (e.g. cancelling a finished task).
    #[error("task is {state}")]
    WrongState { state: TaskState },
    /// The execution id no longer owns the task (lease lost, cancelled, retried): stop working on it.
    #[error("stale execution: the task is {state}")]
    StaleExecution { state: TaskState },
    /// The engine is shutting down or stopped.
    #[error("sundial is shutting down")]
    ShuttingDown,
    /// This node's clock is too far from the database's to join the cluster safely.
    #[error(
        "this node's clock differs from the database's by {skew_ms} ms (limit {limit_ms} ms): fix the clock (NTP) before starting"
    )]
    ClockSkew { skew_ms: i64, limit_ms: u64 },
    /// The configuration cannot work; nothing was opened.
    #[error("invalid configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the embedded store: {0}")]
    Open(#[from] sundial_store_sqlite::SqliteError),
}

impl From<TransitionError> for Error {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::NotFound => Error::NotFound,
            TransitionError::WrongState { state } => Error::WrongState { state },
            TransitionError::StaleExecution { state } => Error::StaleExecution { state },
            TransitionError::KeyTaken { existing } => Error::Duplicate { existing },
            TransitionError::Store(s) => Error::Store(s),
            // A refusal this build does not know by name: kept whole as the source.
            other => Error::Store(StoreError::backend(other)),
        }
    }
}

impl Error {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound)
    }
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Duplicate { .. }
                | Error::IdempotencyConflict { .. }
                | Error::WrongState { .. }
                | Error::StaleExecution { .. }
        )
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid(_) | Error::InvalidBatchItem { .. })
    }
}
