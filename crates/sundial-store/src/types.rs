//! Plain data passed across the [`crate::Store`] trait.

use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};

/// Position in a shard's due index: `(due_at, id)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DueKey {
    pub due_at: Timestamp,
    pub id: TaskId,
}

/// One scheduled task as the engine's look-ahead window needs it: no payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueEntry {
    pub key: DueKey,
    pub queue: String,
    pub kind: String,
    /// The task's per-attempt timeout, so that a claim can set the attempt's lease.
    pub timeout_ms: u64,
}

/// Result of inserting one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    Created(Box<Task>),
    /// A live task of the same queue already holds the key; nothing was stored.
    Duplicate {
        existing: TaskId,
    },
}

/// Where a due task goes when claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimTarget {
    /// Start an attempt now (an in-process handler is waiting for it).
    Run {
        execution: ExecutionId,
        lease_until: Timestamp,
    },
    /// Make it available to workers that poll its queue.
    Ready,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueClaim {
    pub id: TaskId,
    pub target: ClaimTarget,
}

/// What became of one [`DueClaim`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Now `running` with the claim's execution id.
    Started(Box<Task>),
    /// Now `ready`.
    Readied(Box<Task>),
    /// Its exclusive key is held by a running task and its mode is `wait`: still `scheduled`.
    Busy { exclusive_key: String },
    /// Its exclusive key is held and its mode is `skip`: now `cancelled`.
    Skipped(Box<Task>),
    /// Not scheduled any more, or not yet due (cancelled, already taken, moved later).
    NotClaimable,
}

/// A worker's request for ready tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyClaim {
    pub queue: String,
    /// Only these kinds, when given.
    pub kinds: Option<Vec<String>>,
    /// One fresh execution id per task wanted; their number is the batch size.
    pub execution_ids: Vec<ExecutionId>,
    pub worker: Option<String>,
    /// Each claimed task's lease ends at `now` plus its own timeout.
    pub now: Timestamp,
}

/// Filter for listing tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub queue: Option<String>,
    pub kind: Option<String>,
    pub state: Option<TaskState>,
    pub key: Option<String>,
    /// Only tasks with an id strictly smaller (older) than this: the pagination cursor.
    pub before: Option<TaskId>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Pass as `before` to get the next page; `None` when this page is the last.
    pub next_cursor: Option<TaskId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    pub queue: String,
    pub state: TaskState,
    pub count: u64,
}
