//! Storage errors. [`StoreError`] is what any operation can hit (the database failed, the store was
//! closed); [`TransitionError`] adds the ways a state change can be refused.

use sundial_core::{TaskId, TaskState};
use thiserror::Error;

/// The database could not do what was asked.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The backend reported an error (I/O, constraint, SQL).
    #[error("store backend error: {0}")]
    Backend(String),
    /// A stored row could not be decoded: the data is not what this version expects.
    #[error("stored data is corrupt or from an incompatible version: {0}")]
    Corrupt(String),
    /// The store has been closed or its worker stopped.
    #[error("store is closed")]
    Closed,
    /// The database cannot be reached for now (it is down or restarting, a connection broke, no
    /// connection could be had in time). Nothing of the call was applied, or (a connection lost
    /// mid-commit) it is unknown whether it was: retry later, and make the retry safe to repeat.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The store's disk is full: nothing of the call was applied (or, for a write that shared a
    /// commit with the one that hit the limit, it is unknown whether it was). Reads keep working;
    /// writes succeed again once space is freed.
    #[error("the store's disk is full: {0}")]
    Full(String),
    /// A write under a shard lease was refused because the lease is held by another owner.
    #[error("lease lost: shard {shard} is owned elsewhere")]
    LeaseLost { shard: u32 },
}

/// A state change that did not happen, and why.
#[derive(Debug, Clone, Error)]
pub enum TransitionError {
    #[error("no such task")]
    NotFound,
    /// The task is not in a state that allows this change.
    #[error("task is {state}")]
    WrongState { state: TaskState },
    /// The execution id does not match the task's current attempt (lease lost, cancelled, retried).
    #[error("stale execution: the task is {state} and no longer belongs to this attempt")]
    StaleExecution { state: TaskState },
    /// A retried task's `(queue, key)` is held by another live task now.
    #[error("the key is held by live task {existing}")]
    KeyTaken { existing: TaskId },
    #[error(transparent)]
    Store(#[from] StoreError),
}
