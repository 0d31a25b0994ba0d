//! Storage errors. [`StoreError`] is what any operation can hit (the database failed, the store was
//! closed, a write could not be decided); [`TransitionError`] adds the ways a state change can be
//! refused.
//!
//! Errors that come from the database driver keep it as their [`source`](std::error::Error::source)
//! ([`StoreError::Backend`]); the cases a backend decides itself are variants of their own, so a
//! caller matches on them instead of on text. Both enums are `#[non_exhaustive]`: a backend may
//! learn a new way to fail without breaking its callers.

use std::sync::Arc;

use sundial_core::{TaskId, TaskState};
use thiserror::Error;

/// The driver's own error, kept as the source of [`StoreError::Backend`]. Shared (`Arc`), not
/// boxed, because one failed group commit answers every write of its batch with the same error.
pub type BackendError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// The database could not do what was asked.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend's driver reported an error (I/O, constraint, SQL, a worker thread that died);
    /// the driver's error is the source.
    #[error("store backend error: {}", with_causes(.0))]
    Backend(#[source] BackendError),
    /// A write batch failed at one of its steps (begin, savepoint, commit); the driver's error is
    /// the source. Nothing of the batch was applied.
    #[error("the write batch failed at {step}: {source}")]
    WriteBatch {
        step: &'static str,
        #[source]
        source: BackendError,
    },
    /// The database rolled a whole write batch back by itself (SQLite does on some errors):
    /// nothing of the batch was applied.
    #[error("the database rolled the write batch back")]
    BatchRolledBack,
    /// A value could not be encoded for storage (JSON of a task's tags, backoff, target, a
    /// schedule's definition, …); the encoder's error is the source.
    #[error("cannot encode the {what} for storage: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: BackendError,
    },
    /// A number does not fit the column that stores it.
    #[error("the {what} {value} is too large to store")]
    TooLarge { what: &'static str, value: u128 },
    /// A statement that must answer a row answered none (an insert or upsert that returned
    /// nothing, a row that vanished inside its own transaction).
    #[error("the database answered no row for {what}")]
    NoRow { what: &'static str },
    /// A task id of the batch is already in use: nothing of the batch was inserted.
    #[error("duplicate task id {id}")]
    DuplicateId { id: TaskId },
    /// A key Sundial inserts under itself (a schedule's tick, a workflow's task) is held by a
    /// live task.
    #[error("the key of an internal task is held by live task {existing}")]
    InternalKeyTaken { existing: TaskId },
    /// The live holder of a task's key kept changing while the insert looked for it: nothing of
    /// the batch was inserted, and a retry may succeed.
    #[error("the key of task {id} kept changing hands; nothing was inserted")]
    KeyContended { id: TaskId },
    /// An insert neither stored a task nor named the holder of its key.
    #[error("task {id} was neither inserted nor refused")]
    InsertUndecided { id: TaskId },
    /// An operator's retry of a finished task changed nothing, for no reason the store can name.
    #[error("task {id} could not be retried")]
    RetryRefused { id: TaskId },
    /// A shard count of zero was proposed.
    #[error("the shard count must be at least 1")]
    ZeroShards,
    /// A workflow id is recorded as taken but names no run.
    #[error("workflow id {workflow_id:?} is taken but names no run")]
    WorkflowIdWithoutRun { workflow_id: String },
    /// A workflow task asked to close its run with the status `running`.
    #[error("a run cannot close as running")]
    CloseAsRunning,
    /// A continue-as-new named another workflow id than the run it continues.
    #[error("continue-as-new must keep the workflow id")]
    ContinueAsNewChangesId,
    /// A grouped write's worker ended without answering (its runtime shut down): whether the
    /// write committed is unknown, as for a connection lost mid-statement.
    #[error("the {what} ended without an answer")]
    NoAnswer { what: &'static str },
    /// A stored row could not be decoded: the data is not what this version expects. `what`
    /// names the value (a column, a JSON field, a count out of range); the decoder's error, when
    /// there is one, is the source.
    #[error("stored data is corrupt or from an incompatible version: {what}{}", because(.source))]
    Corrupt {
        what: String,
        #[source]
        source: Option<BackendError>,
    },
    /// The store has been closed or its worker stopped.
    #[error("store is closed")]
    Closed,
    /// The database cannot be reached for now (it is down or restarting, a connection broke, no
    /// connection could be had in time). Nothing of the call was applied, or (a connection lost
    /// mid-commit) it is unknown whether it was: retry later, and make the retry safe to repeat.
    /// The driver's error (or a [`Reason`] the store names itself) is the source.
    #[error("the database is unavailable: {source}")]
    Unavailable {
        #[source]
        source: BackendError,
    },
    /// The store's disk is full: nothing of the call was applied (or, for a write that shared a
    /// commit with the one that hit the limit, it is unknown whether it was). Reads keep working;
    /// writes succeed again once space is freed.
    /// `step` names the batch step that hit the limit when it was not a statement of its own
    /// (a commit); the driver's error (or a [`Reason`]) is the source.
    #[error("the store's disk is full: {}{source}", step_of(.step))]
    Full {
        step: Option<&'static str>,
        #[source]
        source: BackendError,
    },
    /// A write under a shard lease was refused because the lease is held by another owner.
    #[error("lease lost: shard {shard} is owned elsewhere")]
    LeaseLost { shard: u32 },
}

/// A cause the store names itself, kept as the source of an error where no driver error is at
/// hand (no connection could be had in time, the database rolled a batch back for a full disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct Reason(pub &'static str);

/// `e`'s message followed by its causes' (a driver's "db error" says nothing without them:
/// "db error: deadlock detected" does), each once.
fn with_causes(e: &BackendError) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cause = c.source();
    }
    out
}

fn because(source: &Option<BackendError>) -> String {
    source
        .as_ref()
        .map(|s| format!(": {s}"))
        .unwrap_or_default()
}

fn step_of(step: &Option<&'static str>) -> String {
    step.map(|s| format!("{s}: ")).unwrap_or_default()
}

impl StoreError {
    /// `e` (the driver's error, or a [`Reason`]) as [`StoreError::Unavailable`], keeping it as
    /// the source.
    pub fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Unavailable {
            source: Arc::new(e),
        }
    }

    /// `e` as [`StoreError::Full`] for a statement that hit the limit, keeping it as the source.
    pub fn full(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Full {
            step: None,
            source: Arc::new(e),
        }
    }

    /// `e` as [`StoreError::Full`] for the batch step `step` (a commit) that hit the limit.
    pub fn full_at(step: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Full {
            step: Some(step),
            source: Arc::new(e),
        }
    }

    /// [`StoreError::Corrupt`] for the value `what`, with no decoder error to keep.
    pub fn corrupt(what: impl Into<String>) -> Self {
        StoreError::Corrupt {
            what: what.into(),
            source: None,
        }
    }

    /// [`StoreError::Corrupt`] for the value `what`, keeping the decoder's error `e` as the
    /// source.
    pub fn corrupt_from(
        what: impl Into<String>,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Corrupt {
            what: what.into(),
            source: Some(Arc::new(e)),
        }
    }

    /// `e` as [`StoreError::Backend`], keeping it as the source.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend(Arc::new(e))
    }

    /// `e`, the encoder's error for `what`, as [`StoreError::Encode`].
    pub fn encode(what: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Encode {
            what,
            source: Arc::new(e),
        }
    }
}

/// A state change that did not happen, and why.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_backend_error_keeps_its_source() {
        let io = std::io::Error::other("disk on fire");
        let e = StoreError::backend(io);
        let source = e.source().expect("the driver's error is the source");
        assert_eq!(source.to_string(), "disk on fire");
        assert_eq!(e.to_string(), "store backend error: disk on fire");
        let t = TransitionError::from(e.clone());
        assert!(t.source().is_some() || t.to_string().contains("disk on fire"));
    }

    /// A driver's error whose message says only its kind ("db error") shows its cause too.
    #[test]
    fn a_backend_error_says_its_cause() {
        #[derive(Debug, Error)]
        #[error("db error")]
        struct Driver(#[source] std::io::Error);
        let e = StoreError::backend(Driver(std::io::Error::other("deadlock detected")));
        assert_eq!(
            e.to_string(),
            "store backend error: db error: deadlock detected"
        );
    }

    #[test]
    fn an_unavailable_database_keeps_its_source() {
        let e = StoreError::unavailable(std::io::Error::other("connection refused"));
        let source = e.source().expect("the driver's error is the source");
        assert_eq!(source.to_string(), "connection refused");
        assert_eq!(
            e.to_string(),
            "the database is unavailable: connection refused"
        );
        let e = StoreError::unavailable(Reason("no connection in time"));
        assert_eq!(
            e.source().expect("the reason").to_string(),
            "no connection in time"
        );
    }

    #[test]
    fn a_full_disk_keeps_its_source_and_names_the_step() {
        let e = StoreError::full(std::io::Error::other("database or disk is full"));
        assert_eq!(
            e.source().expect("the driver's error").to_string(),
            "database or disk is full"
        );
        assert_eq!(
            e.to_string(),
            "the store's disk is full: database or disk is full"
        );
        let e = StoreError::full_at("commit failed", std::io::Error::other("disk full"));
        assert!(e.source().is_some());
        assert_eq!(
            e.to_string(),
            "the store's disk is full: commit failed: disk full"
        );
    }

    #[test]
    fn a_corrupt_value_is_named_and_keeps_the_decoder_error() {
        let bad = serde_json::from_str::<u8>("x").expect_err("not json");
        let e = StoreError::corrupt_from("tags", bad);
        assert!(e.source().is_some());
        assert!(
            e.to_string()
                .starts_with("stored data is corrupt or from an incompatible version: tags: "),
            "{e}"
        );
        let e = StoreError::corrupt("shard 70000 out of range");
        assert!(e.source().is_none());
        assert_eq!(
            e.to_string(),
            "stored data is corrupt or from an incompatible version: shard 70000 out of range"
        );
        assert!(
            matches!(e, StoreError::Corrupt { ref what, .. } if what == "shard 70000 out of range")
        );
    }

    #[test]
    fn an_encode_error_names_what_and_keeps_its_source() {
        let bad = serde_json::from_str::<u8>("x").expect_err("not json");
        let e = StoreError::encode("tags", bad);
        assert!(e.to_string().starts_with("cannot encode the tags"));
        assert!(e.source().is_some());
    }
}
