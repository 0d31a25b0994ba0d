//! # sundial-store
//!
//! The storage seam. [`Store`] is everything the engine asks of a database; each backend
//! (`sundial-store-sqlite`, later PostgreSQL) implements it and passes the shared conformance suite
//! in [`testkit`] (feature `testkit`).
//!
//! The store is the source of truth. Every state change it performs is one conditional update on
//! the expected state (and, for an attempt, its execution id): a caller never reads a row and then
//! writes on the strength of what it read. Time is always a parameter (`now`): a backend never reads
//! a clock of its own, so the engine's [`sundial_core::Clock`] decides what is due.
//!
//! **API Boundary:** this crate defines types and the trait only; it does no I/O itself.

mod access;
#[cfg(feature = "testkit")]
pub mod access_testkit;
pub mod audit_scope;
mod cluster;
mod error;
#[cfg(feature = "testkit")]
pub mod forwarding;
#[cfg(feature = "testkit")]
pub mod model_testkit;
mod ops;
#[cfg(feature = "testkit")]
pub mod ops_testkit;
#[cfg(feature = "testkit")]
pub mod plan_testkit;
mod push;
#[cfg(feature = "testkit")]
pub mod push_testkit;
#[cfg(feature = "testkit")]
pub mod schedule_testkit;
mod schedules;
#[cfg(feature = "testkit")]
pub mod testkit;
mod types;
#[cfg(feature = "testkit")]
pub mod workflow_testkit;
mod workflows;

use async_trait::async_trait;
use sundial_core::{ExecutionId, NewTask, Task, TaskId, Timestamp};

pub use access::{
    AccessStore, AuditFilter, AuditPage, AuditRecord, Namespace, NamespaceError, NewAuditRecord,
    NewToken, Scope, TokenRecord,
};
pub use cluster::{Cluster, ClusterState, Fence, Member, Place, ShardLease, Wakeup};

pub use error::{Reason, StoreError, TransitionError};
pub use ops::{
    Attempt, AttemptHistory, AttemptOutcome, AttemptResponse, LEASE_EXPIRED_ERROR, QueueConfig,
    QueueSettings, RetentionOverride, RetentionRules, SelectPage, Selected, prefix_upper_bound,
};
pub use push::{PushSecret, PushSecretStore};
pub use schedules::{
    Arm, ArmChange, FireApplied, FireCounts, FireOp, FireOutcome, FirePage, FireReason, FireRecord,
    FireResult, LastTask, NewFire, NewSchedule, Schedule, ScheduleError, ScheduleFilter,
    SchedulePage, ScheduleStore, TICK_KIND, TICK_QUEUE, TickCompletions,
};
pub use types::{
    ClaimOutcome, ClaimTarget, DeadGroup, DeadGroupFilter, DebounceOutcome, DebouncedCreate,
    DueClaim, DueEntry, DueKey, ERROR_GROUP_CHARS, IdempotencyDecision, IdempotentCreate,
    IdempotentOutcome, Inserted, LIST_VISIT_BUDGET, ListDriver, ReadyClaim, ReadyTaken, Remember,
    Retry, StateCount, TaskFilter, TaskPage, debounced_due, error_group, idempotency_decision,
    idempotency_remembered, page_cursor,
};
pub use workflows::{
    ACTIVITY_KIND_PREFIX, ACTIVITY_QUEUE, AppendOp, Appended, CHILD_KIND, Committed, HistoryEvent,
    IdReusePolicy, NewEvent, NewRun, ParentLink, RunClose, StartedRun, TIMER_KIND, TerminateOp,
    Terminated, WORKFLOW_KIND_PREFIX, WORKFLOW_QUEUE, WorkflowFilter, WorkflowPage, WorkflowRun,
    WorkflowStatus, WorkflowStore, WorkflowStoreError, WorkflowTaskCommit, activity_queue,
    run_task_key_prefix, workflow_queue,
};

/// What the engine needs from a database.
///
/// Methods that change state return the row as it is after the change. Methods that may refuse a
/// transition return [`TransitionError`], which says exactly why (unknown task, wrong state, stale
/// execution id).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts every task, atomically: when this returns `Ok`, all of them are durable. A task
    /// whose `(queue, key)` is held by a live (non-terminal) task is not inserted; its slot in the
    /// result names the holder instead. On `Err` nothing was inserted.
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError>;

    /// Inserts one task under an idempotency key, in one transaction with the key's record (see
    /// [`IdempotentCreate`]): a repeat of a remembered request answers its task and stores
    /// nothing; the same key and version with another request, or an older version, is a
    /// conflict; a newer version, or a key not (or no longer) remembered, inserts the task (as
    /// [`Store::insert`] does) and remembers the key for it. Concurrent calls with one key are
    /// serialised: exactly one of them inserts.
    async fn insert_idempotent(
        &self,
        create: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError>;

    /// Stores `create.task`, or, when the queue has a pending task of `create.key` (scheduled
    /// and never started), gives that task the payload and the due time (see
    /// [`debounced_due`]) instead. Concurrent calls with one key are serialised: at most one
    /// pending task per queue and key.
    async fn insert_debounced(
        &self,
        create: DebouncedCreate,
    ) -> Result<DebounceOutcome, StoreError>;

    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError>;

    /// Tasks matching `filter`, newest first (by id), `limit` at most, strictly older than
    /// `filter.before` when set.
    ///
    /// A page visits at most [`LIST_VISIT_BUDGET`] candidates: the rows of one driving index,
    /// chosen by which filters are given, newest first below the cursor; the other filters are
    /// checked on those rows. When the candidates run out before `limit` matches are found, the
    /// page holds the matches found (possibly none) and `next_cursor` is the oldest id visited, so
    /// that following cursors still yields every match exactly once, in order. A page with fewer
    /// than `limit` tasks may therefore carry a cursor; only `None` means no more matches.
    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError>;

    /// Any non-terminal state → `cancelled`. Terminal → `WrongState`.
    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError>;

    /// `scheduled` → `scheduled` with `due_at = now`. Any other state → `WrongState`.
    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError>;

    /// Scheduled tasks of `shard` with `due_at <= until`, in `(due_at, id)` order, strictly after
    /// `after` when given, at most `limit`.
    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError>;

    /// The earliest due time among scheduled tasks of `shard` strictly after `after`.
    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError>;

    /// Takes due tasks: each claim succeeds only if the task is still `scheduled` with
    /// `due_at <= now` (and, for exclusive tasks, no task with its exclusive key is running).
    /// One outcome per claim, in order.
    ///
    /// With a `fence` (a shard owner's write, several nodes), the claim is refused as a whole with
    /// [`StoreError::LeaseLost`], nothing written, unless the fence is still the shard's current
    /// one, checked in the claim's own transaction; claims of tasks of other shards are
    /// `NotClaimable`. A store that grants no leases (no [`Cluster`]) refuses every fence.
    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Moves up to `claim.execution_ids.len()` `ready` tasks of `queue` (of the given kinds, when
    /// given) to `running`, oldest id first, skipping tasks whose exclusive key is busy. A claimed
    /// task starts at `claim.now`, or at its due time when that is later (a task readied after
    /// the caller read its clock, the claim having queued behind the readying write: the start
    /// happens after the readying, which was at or past the due time), and its lease ends at that
    /// start plus the task's own timeout. So no task is recorded as started before it was due.
    ///
    /// A task with a rate limit is taken only at its key's take turn (`RateLimit::take_key`,
    /// spaced by the limit's interval across every caller and node), so workers that come back
    /// to a pile of ready tasks still start them one interval apart; one passed over for its
    /// turn is named by [`ReadyTaken::next_turn`].
    async fn claim_ready(&self, claim: ReadyClaim) -> Result<ReadyTaken, StoreError>;

    /// Extends the lease of a running attempt to `now` plus the task's own timeout (never
    /// shortening it).
    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
    ) -> Result<Task, TransitionError>;

    /// `running` (with this execution id) → `succeeded`.
    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError>;

    /// [`Store::complete`], then, only if the completion was recorded, [`Store::claim_ready`]
    /// for the worker's next tasks. A backend that can commits both together (one durable commit
    /// for a worker's whole turn); this default makes the two calls in order. A refused
    /// completion claims nothing; a failed claim after a recorded completion is a
    /// [`TransitionError::Store`] whether or not the completion committed (the worker retries
    /// it: a repeated completion of the same attempt is answered as the first).
    async fn complete_then_claim_ready(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
        claim: ReadyClaim,
    ) -> Result<(Task, ReadyTaken), TransitionError> {
        let done = self.complete(id, execution, now, result).await?;
        let taken = self.claim_ready(claim).await?;
        Ok((done, taken))
    }

    /// `running` (with this execution id) → `scheduled` again or → `dead`, as `retry` decides
    /// from the task's own attempt count and backoff, read in the same write (see [`Retry`]).
    /// The error is kept in `last_error` either way.
    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry: Retry,
    ) -> Result<Task, TransitionError>;

    /// Running tasks whose lease ended before `now`: back to `scheduled` (due now) when attempts
    /// remain, else `dead`. At most `limit`; returns the changed rows. With a `fence`, only the
    /// fenced shard's tasks, refused with [`StoreError::LeaseLost`] (nothing written) unless the
    /// fence is current, as for [`Store::claim_due`].
    async fn expire_leases(
        &self,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<Task>, StoreError>;

    /// The earliest lease expiry among running tasks (of `shard`, when given).
    async fn next_lease_expiry(&self, shard: Option<u32>) -> Result<Option<Timestamp>, StoreError>;

    /// How many tasks each queue has in each state, from maintained counters (never a scan).
    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError>;

    // ---- Operations: queues, attempts, bulk actions, retention --------------------------------

    /// The dead tasks grouped by queue and error group ([`error_group`] of the last error),
    /// the largest groups first (ties by queue, then error, no error first), at most `limit`
    /// groups, of the tasks `filter` selects. One aggregate over an index of the dead tasks by
    /// `(queue, error group)`, never a read of the task rows.
    async fn dead_groups(
        &self,
        filter: DeadGroupFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeadGroup>, StoreError>;

    /// The stored settings of `queue`, if it has any.
    async fn queue_settings(&self, queue: &str) -> Result<Option<QueueSettings>, StoreError>;

    /// Every queue with stored settings, by name.
    async fn list_queue_settings(&self) -> Result<Vec<QueueSettings>, StoreError>;

    /// Sets `queue`'s configuration (creating its settings row; the pause state is kept).
    async fn put_queue_config(
        &self,
        queue: &str,
        config: QueueConfig,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError>;

    /// Pauses or resumes `queue` (creating its settings row). Idempotent: the change time moves
    /// only when the state changes.
    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError>;

    /// The earliest due time among `queue`'s tasks waiting to start (`scheduled` or `ready`).
    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError>;

    /// How many of `queue`'s tasks with a rate limit wait for their limit's turn at `now`: those
    /// due and still `scheduled` (and, for a moment, any not claimed yet), and the `ready` ones
    /// whose take turn (`RateLimit::take_key`) has not come.
    async fn count_rate_limited(&self, queue: &str, now: Timestamp) -> Result<u64, StoreError>;

    /// The kept attempts of a task, oldest first, and its total attempt count. `None` for an
    /// unknown task.
    async fn attempts(&self, id: TaskId) -> Result<Option<AttemptHistory>, StoreError>;

    /// Keeps the HTTP answer of the attempt of `id` that ran under `execution` on that attempt
    /// (running or ended). Answers whether such an attempt is kept.
    async fn record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: AttemptResponse,
    ) -> Result<bool, StoreError>;

    /// `dead` or `cancelled` → `scheduled` due at `due_at`, attempts starting over (`attempt`
    /// = 0); the id, the attempt history and `last_error` stay. Live → `WrongState`. A task whose
    /// `(queue, key)` another live task holds now → `KeyTaken`.
    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError>;

    /// Ids (with states) matching `filter` (its `before` is the cursor), newest first, at most
    /// `limit`: the batches of a bulk action. Served by the same indexes and bounded by the same
    /// [`LIST_VISIT_BUDGET`] as [`Store::list`]: a batch may hold fewer than `limit` ids, or none,
    /// and still carry a cursor; the selection ends only when `next_cursor` is `None`.
    async fn select(&self, filter: &TaskFilter, limit: usize) -> Result<SelectPage, StoreError>;

    /// Cancels those of `ids` that are live, in one transaction; returns the cancelled rows.
    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError>;

    /// [`Store::retry`] for those of `ids` that are `dead` or `cancelled` and whose key is free,
    /// in one transaction; returns the retried rows.
    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError>;

    /// Deletes up to `limit` finished tasks whose retention under `rules` has passed at `now`,
    /// with their tags and attempts. Never a live task. With a `fence`, only the fenced shard's
    /// tasks, refused with [`StoreError::LeaseLost`] (nothing deleted) unless the fence is
    /// current, as for [`Store::claim_due`].
    async fn purge_tasks(
        &self,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError>;
    /// A condition that keeps the store's writes from succeeding now, as its last writes found it
    /// (the disk is full), for health reports; `None` when its last writes went through. Never
    /// touches the database. Backends that cannot tell keep the default.
    fn condition(&self) -> Option<String> {
        None
    }
    /// Where this store's count of out-of-band writes stands ([`OutOfBandMark`]), or `None`
    /// when it cannot tell: another process may write the same data (PostgreSQL), or the
    /// backend does not count. Never touches the database.
    fn out_of_band_mark(&self) -> Option<OutOfBandMark> {
        None
    }
}

/// A count of the committed writes through one store that could end a started task other than
/// by its own attempt: everything but inserts, claims, and an attempt's own heartbeat,
/// completion and failure (cancels, triggers, retries, purges, lease expiry, schedule and
/// workflow writes, …). It moves before such a write's call returns. Two equal marks, one read
/// before a claim was asked for and one after, tell that no such write committed in between,
/// so a task that claim started is still started under its execution without reading it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBandMark(pub u64);

impl OutOfBandMark {
    /// Whether the mark read `before` a claim is still the one read `now`: `false` when either
    /// is missing (the store cannot tell).
    pub fn unmoved(before: Option<Self>, now: Option<Self>) -> bool {
        before.is_some() && before == now
    }
}
