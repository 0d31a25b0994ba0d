//! Plain data passed across the [`crate::Store`] trait.

use sundial_core::{Backoff, ExecutionId, NewTask, Priority, Task, TaskId, TaskState, Timestamp};

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
    /// For a push task: its destination (`host:port`, see [`sundial_core::authority`]), by which
    /// the engine limits concurrent calls per receiver. `None` for handler and worker tasks.
    pub push_host: Option<String>,
    /// Its order among due entries that compete for the same slots (`sundial_core::priority`).
    pub priority: Priority,
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

/// A create that carries an idempotency key ([`crate::Store::insert_idempotent`]).
///
/// The key is remembered per queue with the request's `fingerprint` and `version` and the task it
/// created, for as long as that task is live and for `remember_ms` after it finished (a task no
/// longer stored is forgotten with it).
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotentCreate {
    pub task: NewTask,
    pub key: String,
    pub version: u64,
    /// A digest of the request (everything but the key and version): a retry of the same request
    /// has the same one.
    pub fingerprint: String,
    /// How long the record answers for the key.
    pub remember: Remember,
    pub now: Timestamp,
}

/// A create under a debounce key ([`crate::Store::insert_debounced`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DebouncedCreate {
    /// The task to store when the queue has no pending task of the key; its payload and due
    /// time otherwise replace the pending one's.
    pub task: NewTask,
    pub key: String,
    /// The pending task's due time is never moved past its create plus this.
    pub max_wait_ms: Option<u64>,
    pub now: Timestamp,
}

/// What became of a [`DebouncedCreate`].
#[derive(Debug, Clone, PartialEq)]
pub enum DebounceOutcome {
    /// No pending task of the key: this one was stored.
    Created(Box<Task>),
    /// The pending task of the key took the payload and the due time (capped by its
    /// `max_wait`); nothing new was stored.
    Replaced(Box<Task>),
    /// A live task of the queue holds the task's `key`: nothing stored.
    Duplicate { existing: TaskId },
}

/// The due time a debounced create gives the pending task created at `pending_created_at`: the
/// new create's, but never past that create plus `max_wait_ms`.
pub fn debounced_due(
    new_due: Timestamp,
    pending_created_at: Timestamp,
    max_wait_ms: Option<u64>,
) -> Timestamp {
    match max_wait_ms {
        Some(ms) => Timestamp(
            new_due.0.min(
                pending_created_at
                    .0
                    .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)),
            ),
        ),
        None => new_due,
    }
}

/// How long an idempotency record answers for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remember {
    /// While the task is live, and this many milliseconds after it finished (idempotency keys).
    AfterFinish { ms: u64 },
    /// This many milliseconds after the record was made, whatever became of the task since
    /// (throttles: one admitted task per key per period).
    AfterCreate { ms: u64 },
}

/// What became of an [`IdempotentCreate`].
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotentOutcome {
    /// Stored (no remembered use of the key, an expired one, or a higher version).
    Created(Box<Task>),
    /// The same key, version and fingerprint are remembered: nothing stored; the task the first
    /// request created.
    Repeat(Box<Task>),
    /// The key is remembered with the same version and another fingerprint, or with a higher
    /// version: nothing stored.
    Conflict { existing: TaskId, version: u64 },
    /// A live task of the queue holds the task's `key`: nothing stored.
    Duplicate { existing: TaskId },
}

/// How a remembered idempotency key answers a new request with `version` and `fingerprint`;
/// `remembered` is the record (version, fingerprint, task) and its task as stored, if it still
/// counts (live, or finished less than `remember_ms` ago). Both backends decide with this.
pub fn idempotency_decision(
    remembered: Option<(u64, &str, &Task)>,
    version: u64,
    fingerprint: &str,
) -> IdempotencyDecision {
    match remembered {
        None => IdempotencyDecision::Insert,
        Some((v, fp, task)) if v == version && fp == fingerprint => {
            IdempotencyDecision::Answer(IdempotentOutcome::Repeat(Box::new(task.clone())))
        }
        Some((v, _, _)) if version > v => IdempotencyDecision::Insert,
        Some((v, _, task)) => IdempotencyDecision::Answer(IdempotentOutcome::Conflict {
            existing: task.id,
            version: v,
        }),
    }
}

/// Whether a key remembered since `recorded_at` for `task` still counts at `now`.
pub fn idempotency_remembered(
    task: &Task,
    recorded_at: Timestamp,
    remember: Remember,
    now: Timestamp,
) -> bool {
    let after = |t: Timestamp, ms: u64| t.0.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
    match remember {
        Remember::AfterCreate { ms } => after(recorded_at, ms) > now.0,
        Remember::AfterFinish { ms } => match task.finished_at {
            Some(f) if task.state.is_terminal() => after(f, ms) > now.0,
            _ => true,
        },
    }
}

/// See [`idempotency_decision`].
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyDecision {
    /// Insert the task and remember the key for it.
    Insert,
    /// Answer this, storing nothing.
    Answer(IdempotentOutcome),
}

/// Where a due task goes when claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimTarget {
    /// Start an attempt now: an in-process handler is waiting for it (`worker` none), or a
    /// remote worker's poll is (`worker` the name the poll gave, recorded as a poll's claim
    /// records it).
    Run {
        execution: ExecutionId,
        lease_until: Timestamp,
        worker: Option<String>,
    },
    /// Make it available to workers that poll its queue.
    Ready,
}

#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Its rate limit's key started a task less than the limit's interval ago: still
    /// `scheduled`; the key allows the next start at `until`, and one per `interval_ms` after.
    RateLimited {
        key: String,
        until: Timestamp,
        interval_ms: u64,
    },
    /// Its queue's concurrency limit (`QueueConfig::concurrency`) is reached: as many of the
    /// queue's tasks run as it allows, on every node together. Still `scheduled`.
    QueueFull { queue: String },
    /// Its exclusive key is held and its mode is `skip`: now `cancelled`.
    Skipped(Box<Task>),
    /// Not scheduled any more, or not yet due (cancelled, already taken, moved later).
    NotClaimable,
}

/// What a failed attempt asks for; the store decides with the task's own attempt count,
/// `max_attempts` and backoff, read in the same write, so a caller never reads the task first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retry {
    /// Not retryable: `dead`.
    Never,
    /// Retry at this time while attempts remain, else `dead` (an attempt interrupted by shutdown
    /// retries at once; a caller that holds the task may decide the backoff itself).
    At(Timestamp),
    /// Retry after the task's backoff for this attempt while attempts remain, else `dead`.
    /// `draw` (0..=1) is the random draw for the backoff's jitter.
    Backoff { draw: f64 },
    /// Retry after this delay (a receiver's `Retry-After`) instead of the backoff's, but never
    /// later than the backoff's cap, while attempts remain, else `dead`.
    After { delay_ms: u64 },
}

impl Retry {
    /// When the task runs again after failing attempt `task.attempt`, or `None` for `dead`.
    pub fn retry_at(&self, task: &Task, now: Timestamp) -> Option<Timestamp> {
        self.decide(task.attempt, task.max_attempts, &task.backoff, now)
    }

    /// [`Retry::retry_at`] from the columns it needs.
    pub fn decide(
        &self,
        attempt: u32,
        max_attempts: u32,
        backoff: &Backoff,
        now: Timestamp,
    ) -> Option<Timestamp> {
        if attempt >= max_attempts {
            return None;
        }
        match *self {
            Retry::Never => None,
            Retry::At(t) => Some(t),
            Retry::Backoff { draw } => Some(now.saturating_add(backoff.delay(attempt, draw))),
            Retry::After { delay_ms } => Some(now.saturating_add(
                std::time::Duration::from_millis(delay_ms.min(backoff.max_ms)),
            )),
        }
    }
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

/// What a worker's claim took ([`crate::Store::claim_ready`]).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ReadyTaken {
    /// The tasks claimed, in the order they were taken.
    pub tasks: Vec<Task>,
    /// When ready tasks passed over for their rate limit's turn may be taken: the earliest turn
    /// among them (`None`: none was passed over). A poll that took nothing waits until then.
    pub next_turn: Option<Timestamp>,
}

impl ReadyTaken {
    pub fn new(tasks: Vec<Task>, next_turn: Option<Timestamp>) -> Self {
        Self { tasks, next_turn }
    }
}

/// Filter for listing tasks (and for bulk actions). Every field narrows; all must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub queue: Option<String>,
    pub kind: Option<String>,
    pub state: Option<TaskState>,
    pub key: Option<String>,
    /// Keys starting with this (byte order).
    pub key_prefix: Option<String>,
    /// Tags the task must carry, each `(key, value)`.
    pub tags: Vec<(String, String)>,
    /// Tasks whose last error falls in this dead-letter group: [`error_group`] of `last_error`
    /// equals it (tasks without an error never match). With `state` dead and a `queue` this is
    /// one row of [`DeadGroup`]s, served by the stores' index of dead tasks by queue and group;
    /// otherwise it narrows what the other filters select.
    pub error_group: Option<String>,
    /// `due_at >= due_after`.
    pub due_after: Option<Timestamp>,
    /// `due_at < due_before`.
    pub due_before: Option<Timestamp>,
    /// `created_at >= created_after`.
    pub created_after: Option<Timestamp>,
    /// `created_at < created_before`.
    pub created_before: Option<Timestamp>,
    /// Only tasks with an id strictly smaller (older) than this: the pagination cursor.
    pub before: Option<TaskId>,
    /// Leave out tasks of Sundial's own queues (names starting with
    /// `sundial_core::INTERNAL_QUEUE_PREFIX`, `sundial.`).
    pub exclude_internal: bool,
    /// Only tasks of this namespace (by their stored queue name, see `sundial_core::namespace`).
    pub namespace: Option<String>,
}

impl TaskFilter {
    /// Whether `task` matches (the cursor included): the reference the stores' queries follow.
    pub fn matches(&self, task: &Task) -> bool {
        self.queue.as_ref().is_none_or(|q| &task.queue == q)
            && self.kind.as_ref().is_none_or(|k| &task.kind == k)
            && self.state.is_none_or(|s| task.state == s)
            && self
                .key
                .as_ref()
                .is_none_or(|k| task.key.as_ref() == Some(k))
            && self
                .key_prefix
                .as_ref()
                .is_none_or(|p| task.key.as_ref().is_some_and(|k| k.starts_with(p.as_str())))
            && self.tags.iter().all(|(k, v)| task.tags.get(k) == Some(v))
            && self.error_group.as_ref().is_none_or(|g| {
                task.last_error
                    .as_deref()
                    .is_some_and(|e| error_group(e) == *g)
            })
            && self.due_after.is_none_or(|t| task.due_at >= t)
            && self.due_before.is_none_or(|t| task.due_at < t)
            && self.created_after.is_none_or(|t| task.created_at >= t)
            && self.created_before.is_none_or(|t| task.created_at < t)
            && self.before.is_none_or(|b| task.id < b)
            && !(self.exclude_internal && sundial_core::is_internal_queue(&task.queue))
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| sundial_core::namespace::belongs(ns, &task.queue))
    }
}

/// How many candidate rows one page of [`crate::Store::list`] (or batch of
/// [`crate::Store::select`]) may visit: the rows its driving index yields below the cursor, each
/// checked against the rest of the filter.
///
/// A page costs at most this many index entries and row reads, whatever the filter and however
/// many tasks are stored, instead of walking one filter's rows until the page fills (half a
/// million rows, minutes, for two filters of 10,000,000 tasks that never match together). 2,000
/// rows read by primary key are a few milliseconds from a warm cache and stay well inside a 50 ms
/// page on a small machine when part of them comes from disk; a larger budget saves round trips
/// only for filters whose matches are sparse, which page on with a cursor anyway.
pub const LIST_VISIT_BUDGET: usize = 2_000;

/// The index a page of [`crate::Store::list`] reads its candidates from, newest id first below
/// the cursor, at most [`LIST_VISIT_BUDGET`] of them; every other filter is checked on those
/// rows. Both stores choose it the same way ([`TaskFilter::list_driver`]), by which filters are
/// given, never by statistics: each is an index whose order, after its equality columns, is the
/// id, so a page reads exactly its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListDriver {
    /// `key`: `tasks_key_id (key, id)`.
    Key,
    /// The first tag: `task_tags (key, value, task_id)`.
    Tag,
    /// `queue`, `state` dead and `error_group`: `tasks_dead_error (queue, group, id)`.
    DeadGroup,
    /// `queue` and `state`: `tasks_queue_state_id (queue, state, id)`.
    QueueState,
    /// `queue`: `tasks_queue_id (queue, id)`.
    Queue,
    /// `kind`: `tasks_kind_id (kind, id)`.
    Kind,
    /// `state`: `tasks_state_id (state, id)`.
    State,
    /// None of the above (time ranges, namespace, internal queues, or nothing): the primary key.
    Id,
}

impl TaskFilter {
    /// Which index drives a page of this filter, in this order of preference: `key`, the first
    /// tag, a dead-letter group, `queue` with `state`, `queue`, `kind`, `state`, the id.
    pub fn list_driver(&self) -> ListDriver {
        if self.key.is_some() {
            ListDriver::Key
        } else if !self.tags.is_empty() {
            ListDriver::Tag
        } else if self.queue.is_some()
            && self.state == Some(TaskState::Dead)
            && self.error_group.is_some()
        {
            ListDriver::DeadGroup
        } else if self.queue.is_some() && self.state.is_some() {
            ListDriver::QueueState
        } else if self.queue.is_some() {
            ListDriver::Queue
        } else if self.kind.is_some() {
            ListDriver::Kind
        } else if self.state.is_some() {
            ListDriver::State
        } else {
            ListDriver::Id
        }
    }

    /// Whether a page first probes the key index for `key_prefix`: a prefix is a range of keys,
    /// not in id order, so its candidates are taken from the key index only when the range (below
    /// the cursor) holds at most [`LIST_VISIT_BUDGET`] keys, all read and put in id order; a
    /// larger range is left to [`TaskFilter::list_driver`]'s index and checked on its rows. The
    /// probe reads at most one more key than the budget.
    pub fn probes_key_prefix(&self) -> bool {
        self.key_prefix.is_some()
            && !matches!(
                self.list_driver(),
                ListDriver::Key | ListDriver::Tag | ListDriver::DeadGroup
            )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskPage {
    /// The matches found, newest first: `limit` at most, and possibly fewer (even none) when the
    /// page stopped at [`LIST_VISIT_BUDGET`] candidates.
    pub tasks: Vec<Task>,
    /// Pass as `before` to get the next page; `None` when this page is the last. A page that
    /// visited its budget without filling carries the oldest id it visited, so a page with fewer
    /// than `limit` tasks (or none) may still have a cursor: only `None` means the end.
    pub next_cursor: Option<TaskId>,
}

/// The cursor of a page (see [`TaskPage::next_cursor`]), as both stores decide it: `found`
/// matches were read (`limit + 1` asked for) and `last_kept` is the oldest of the first `limit`;
/// the driving index yielded `visited` candidates below the cursor, the oldest `oldest_visited`,
/// of a `budget` at most.
pub fn page_cursor(
    found: usize,
    limit: usize,
    last_kept: Option<TaskId>,
    visited: usize,
    budget: usize,
    oldest_visited: Option<TaskId>,
) -> Option<TaskId> {
    if found > limit {
        last_kept
    } else if visited >= budget {
        // The candidates ran out before the page filled: everything down to the oldest visited
        // was checked, the next page continues below it.
        oldest_visited
    } else {
        None
    }
}

/// How many characters of a dead task's error name its dead-letter group (see [`error_group`]).
pub const ERROR_GROUP_CHARS: usize = 200;

/// The group a dead task's last error puts it in on the dead letters: the error's first line,
/// cut at [`ERROR_GROUP_CHARS`] characters, so that errors differing only in a trace or a long
/// tail land together. The stores compute the same in SQL (and index it).
pub fn error_group(error: &str) -> String {
    error
        .split('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .take(ERROR_GROUP_CHARS)
        .collect()
}

/// Which dead tasks [`crate::Store::dead_groups`] groups: every field given must hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadGroupFilter<'a> {
    /// Only this queue's (its stored name).
    pub queue: Option<&'a str>,
    /// Only the queues of this namespace, by their stored names (see `sundial_core::namespace`):
    /// the default namespace's are the names without the separator.
    pub namespace: Option<&'a str>,
}

impl<'a> DeadGroupFilter<'a> {
    /// Every dead task of `queue` (a stored name).
    pub fn queue(queue: &'a str) -> Self {
        DeadGroupFilter {
            queue: Some(queue),
            namespace: None,
        }
    }

    /// The stored-name prefix of the namespace's queues, and whether only names without a
    /// namespace part (the default namespace's) count: what the stores' queries test.
    pub fn namespace_test(&self) -> (Option<String>, bool) {
        match self.namespace {
            None => (None, false),
            Some(ns) => match sundial_core::namespace::stored_prefix(ns) {
                Some(prefix) => (Some(prefix), false),
                None => (None, true),
            },
        }
    }
}

/// The dead tasks of one queue whose last errors fall in one group ([`error_group`]): a row of
/// the dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadGroup {
    pub queue: String,
    /// The group's error ([`error_group`] of the last error); `None` for tasks that died with
    /// no error recorded.
    pub error: Option<String>,
    pub count: u64,
    /// The group's newest task (largest id), to show as an example.
    pub newest: TaskId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    pub queue: String,
    pub state: TaskState,
    pub count: u64,
}
