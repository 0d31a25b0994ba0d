//! The workflow storage seam: [`WorkflowStore`], separate from [`crate::Store`] so that a backend
//! can add workflows independently (conformance: [`crate::workflow_store_conformance!`]).
//!
//! A workflow *run* is a row (its status, result, the length of its history, and the workflow task
//! it is waiting for) plus an append-only *history*: events numbered `0, 1, 2, …` per run. Events
//! are opaque JSON text here; `sundial-workflow` gives them meaning. Everything that drives a run
//! is an ordinary kernel task in the `tasks` table:
//!
//! - the **workflow task** (queue [`WORKFLOW_QUEUE`], kind [`WORKFLOW_KIND_PREFIX`]`<type>`), which
//!   replays the history and records what the workflow does next. At most one is *pending* per
//!   run: the run row names it (`pending_task`).
//! - **timers** (queue [`WORKFLOW_QUEUE`], kind [`TIMER_KIND`]) and **activities** (queue
//!   [`ACTIVITY_QUEUE`], kind [`ACTIVITY_KIND_PREFIX`]`<name>`), keyed under
//!   [`run_task_key_prefix`] so that closing a run can cancel whatever it left outstanding.
//!
//! Three writes do everything, each in **one transaction**:
//!
//! - [`WorkflowStore::start_run`]: the run row, its first event and its first workflow task.
//! - [`WorkflowStore::append`]: events from outside the workflow (a signal, a cancel request, a
//!   timer that fired, an activity's result) and, when no workflow task is pending, a new one.
//!   An optional *marker* (unique per run) makes a repeated append a no-op.
//! - [`WorkflowStore::commit_workflow_task`]: a workflow task's new events, the tasks it starts,
//!   the tasks it cancels, the run's new status, and (on continue-as-new) the next run, all
//!   **conditional on the history length the task replayed and on the task still being the
//!   pending one**: a stale workflow task writes nothing.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use sundial_core::{NewTask, RunId, Task, TaskId, Timestamp};
use thiserror::Error;

use crate::{Fence, StoreError};

/// The queue of workflow tasks and workflow timers.
pub const WORKFLOW_QUEUE: &str = "sundial.workflows";
/// The queue of activities.
pub const ACTIVITY_QUEUE: &str = "sundial.activities";
/// Kind of a workflow task: this prefix and the workflow type.
pub const WORKFLOW_KIND_PREFIX: &str = "workflow/";
/// Kind of an activity task: this prefix and the activity name.
pub const ACTIVITY_KIND_PREFIX: &str = "activity/";
/// Kind of a workflow timer.
pub const TIMER_KIND: &str = "sundial.workflow.timer";
/// Kind of the task that starts a child workflow.
pub const CHILD_KIND: &str = "sundial.workflow.child";

/// The queue of the workflow tasks, timers and child starts of namespace `ns`'s workflows:
/// [`WORKFLOW_QUEUE`], qualified (see `sundial_core::namespace`; unchanged for the default
/// namespace). A workflow's namespace is its workflow id's.
pub fn workflow_queue(ns: &str) -> String {
    sundial_core::namespace::qualify(ns, WORKFLOW_QUEUE)
}

/// The queue of the activities of namespace `ns`'s workflows: [`ACTIVITY_QUEUE`], qualified.
pub fn activity_queue(ns: &str) -> String {
    sundial_core::namespace::qualify(ns, ACTIVITY_QUEUE)
}

/// The key prefix of the timer, activity and child-start tasks of a run: `wf:<run id>/`.
pub fn run_task_key_prefix(run: &RunId) -> String {
    format!("wf:{run}/")
}

/// Where a run is in its life. Everything but `Running` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkflowStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    Terminated,
    ContinuedAsNew,
}

impl WorkflowStatus {
    pub const ALL: [WorkflowStatus; 6] = [
        WorkflowStatus::Running,
        WorkflowStatus::Completed,
        WorkflowStatus::Failed,
        WorkflowStatus::Cancelled,
        WorkflowStatus::Terminated,
        WorkflowStatus::ContinuedAsNew,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            WorkflowStatus::Running => "running",
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "cancelled",
            WorkflowStatus::Terminated => "terminated",
            WorkflowStatus::ContinuedAsNew => "continued_as_new",
        }
    }

    pub fn is_closed(&self) -> bool {
        !matches!(self, WorkflowStatus::Running)
    }
}

impl fmt::Display for WorkflowStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkflowStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkflowStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workflow status {s:?}; expected one of running, completed, failed, \
                     cancelled, terminated, continued_as_new"
                )
            })
    }
}

/// A child run's link to the parent run that started it (and the parent's command number for
/// it), so the child's close can be reported to the parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLink {
    pub run_id: RunId,
    pub workflow_id: String,
    pub cmd: u32,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRun {
    pub workflow_id: String,
    pub run_id: RunId,
    pub workflow_type: String,
    /// The input, as JSON text.
    pub input: String,
    pub status: WorkflowStatus,
    /// The result (JSON text) of a completed run.
    pub result: Option<String>,
    /// Why a run failed, was cancelled or was terminated.
    pub error: Option<String>,
    /// Number of events in the history; the next event's number.
    pub history_len: u64,
    /// The workflow task this run waits for, if any.
    pub pending_task: Option<TaskId>,
    pub parent: Option<ParentLink>,
    /// The run this one continues (continue-as-new).
    pub continued_from: Option<RunId>,
    /// The run that continues this one.
    pub continued_to: Option<RunId>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub closed_at: Option<Timestamp>,
}

/// One event to append: its JSON text and the time it is recorded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub at: Timestamp,
    pub data: String,
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    pub seq: u64,
    pub at: Timestamp,
    pub data: String,
}

/// Whether a workflow id whose current run is closed may be started again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IdReusePolicy {
    /// Always (after the current run closed).
    #[default]
    AllowDuplicate,
    /// Only when the current run did not complete (failed, cancelled, terminated).
    AllowDuplicateFailedOnly,
    /// Never: a workflow id names one run chain forever.
    RejectDuplicate,
}

impl IdReusePolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            IdReusePolicy::AllowDuplicate => "allow_duplicate",
            IdReusePolicy::AllowDuplicateFailedOnly => "allow_duplicate_failed_only",
            IdReusePolicy::RejectDuplicate => "reject_duplicate",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            IdReusePolicy::AllowDuplicate,
            IdReusePolicy::AllowDuplicateFailedOnly,
            IdReusePolicy::RejectDuplicate,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
    /// Whether a new run may follow a closed run that ended with `status`.
    pub fn allows(&self, status: WorkflowStatus) -> bool {
        match self {
            IdReusePolicy::AllowDuplicate => true,
            IdReusePolicy::AllowDuplicateFailedOnly => matches!(
                status,
                WorkflowStatus::Failed | WorkflowStatus::Cancelled | WorkflowStatus::Terminated
            ),
            IdReusePolicy::RejectDuplicate => false,
        }
    }
}

/// A run to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub workflow_id: String,
    pub run_id: RunId,
    pub workflow_type: String,
    /// JSON text.
    pub input: String,
    pub parent: Option<ParentLink>,
    pub continued_from: Option<RunId>,
    /// Event 0 of its history.
    pub started: NewEvent,
    /// Its first workflow task (becomes the pending one).
    pub first_task: NewTask,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StartedRun {
    pub run: WorkflowRun,
    pub task: Task,
}

/// Events from outside a run's workflow code.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendOp {
    pub run_id: RunId,
    pub events: Vec<NewEvent>,
    /// When set, the append happens only if no append with this marker happened to this run
    /// before ([`WorkflowStoreError::Duplicate`] otherwise, and nothing is written).
    pub marker: Option<String>,
    /// Inserted and made the pending workflow task when the run has none that is still live.
    pub workflow_task: NewTask,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    pub run: WorkflowRun,
    /// The number of the first appended event.
    pub first_seq: u64,
    /// The workflow task inserted by this append, if one was.
    pub task: Option<Task>,
}

/// How a workflow task closes its run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunClose {
    /// Anything but `Running`.
    pub status: WorkflowStatus,
    pub result: Option<String>,
    pub error: Option<String>,
}

/// What one workflow task records.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowTaskCommit {
    pub run_id: RunId,
    /// The history length the task replayed: the commit happens only if it is still the length.
    pub expect_len: u64,
    /// The workflow task committing: it must still be the run's pending one.
    pub expect_task: TaskId,
    /// Appended from `expect_len` on.
    pub events: Vec<NewEvent>,
    /// Timers, activities and child starts (already carrying their run key).
    pub tasks: Vec<NewTask>,
    /// Tasks to cancel where still live (timers and activities the workflow gave up on).
    pub cancel: Vec<TaskId>,
    /// Closes the run: every live task under its key prefix is then cancelled too.
    pub close: Option<RunClose>,
    /// Continue-as-new: the next run of the same workflow id.
    pub continue_as: Option<NewRun>,
    /// Events for the parent run (a child's close). A parent that is gone or closed is ignored.
    pub parent: Option<AppendOp>,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    pub run: WorkflowRun,
    /// The tasks inserted.
    pub tasks: Vec<Task>,
    /// The tasks that this commit moved to `cancelled`.
    pub cancelled: Vec<TaskId>,
    pub next_run: Option<StartedRun>,
    pub parent: Option<Appended>,
}

/// Ends a run from outside (terminate): no workflow code runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TerminateOp {
    pub run_id: RunId,
    pub event: NewEvent,
    pub reason: String,
    pub parent: Option<AppendOp>,
    pub now: Timestamp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    pub run: WorkflowRun,
    pub cancelled: Vec<TaskId>,
    pub parent: Option<Appended>,
}

/// Filter for listing workflows (their current runs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowFilter {
    pub workflow_type: Option<String>,
    pub status: Option<WorkflowStatus>,
    /// Only workflows of this namespace, by their stored workflow id (see
    /// `sundial_core::namespace`): the default namespace's are the ids without the separator.
    pub namespace: Option<String>,
}

impl WorkflowFilter {
    /// Whether the current run `r` is one the filter keeps (the reference the backends' queries
    /// follow).
    pub fn matches(&self, r: &WorkflowRun) -> bool {
        self.workflow_type
            .as_ref()
            .is_none_or(|t| &r.workflow_type == t)
            && self.status.is_none_or(|s| r.status == s)
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| sundial_core::namespace::belongs(ns, &r.workflow_id))
    }

    /// The namespace's stored prefix of workflow ids, for a backend's query: `Some` for a
    /// namespace other than the default one.
    pub fn id_prefix(&self) -> Option<String> {
        self.namespace
            .as_deref()
            .and_then(sundial_core::namespace::stored_prefix)
    }

    /// Whether only the default namespace's workflows (ids without the separator) are kept.
    pub fn default_only(&self) -> bool {
        self.namespace.as_deref() == Some(sundial_core::namespace::DEFAULT_NAMESPACE)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowPage {
    /// The current run of each workflow id, in workflow id order.
    pub runs: Vec<WorkflowRun>,
    /// Pass as `after` for the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// Why a workflow write did not happen.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum WorkflowStoreError {
    #[error("no such workflow run")]
    NotFound,
    /// A run of this workflow id is running.
    #[error("workflow is already running (run {run_id})")]
    AlreadyRunning { run_id: RunId },
    /// The id reuse policy refuses a new run after the current one.
    #[error(
        "workflow id already used by run {run_id} ({status}) and the id reuse policy refuses a new run"
    )]
    AlreadyExists {
        run_id: RunId,
        status: WorkflowStatus,
    },
    /// The run is closed.
    #[error("workflow run is {status}")]
    NotRunning { status: WorkflowStatus },
    /// The workflow task replayed an older history, or is no longer the pending one.
    #[error("stale workflow task: history has {history_len} events")]
    Stale {
        history_len: u64,
        pending_task: Option<TaskId>,
    },
    /// An append with this marker happened before.
    #[error("already appended")]
    Duplicate,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Workflow runs, their histories and the atomic operations on them. Time is always a parameter.
#[async_trait]
pub trait WorkflowStore: Send + Sync + 'static {
    /// Creates a run with its first event and first workflow task, and makes it the workflow
    /// id's current run. Refused while a run of the id is running, or when `reuse` refuses.
    async fn start_run(
        &self,
        run: NewRun,
        reuse: IdReusePolicy,
    ) -> Result<StartedRun, WorkflowStoreError>;

    async fn get_run(&self, run_id: RunId) -> Result<Option<WorkflowRun>, StoreError>;

    /// The workflow id's current (latest) run.
    async fn current_run(&self, workflow_id: &str) -> Result<Option<WorkflowRun>, StoreError>;

    /// Current runs in workflow id order, strictly after `after` when given, at most `limit`.
    async fn list_workflows(
        &self,
        filter: &WorkflowFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<WorkflowPage, StoreError>;

    /// Events of a run with `seq >= from`, in order, at most `limit`.
    async fn history(
        &self,
        run_id: RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEvent>, StoreError>;

    /// Whether an append with this marker happened to the run.
    async fn has_marker(&self, run_id: RunId, marker: &str) -> Result<bool, StoreError>;

    /// Appends events to a running run and makes sure a workflow task is pending.
    async fn append(&self, op: AppendOp) -> Result<Appended, WorkflowStoreError>;

    /// Records a workflow task's outcome (see [`WorkflowTaskCommit`]).
    async fn commit_workflow_task(
        &self,
        op: WorkflowTaskCommit,
    ) -> Result<Committed, WorkflowStoreError>;

    /// Terminates a running run: appends the event, cancels its pending workflow task and every
    /// live task under its key prefix, and reports to the parent.
    async fn terminate(&self, op: TerminateOp) -> Result<Terminated, WorkflowStoreError>;

    /// Retention: deletes up to `limit` runs that closed before `before` (oldest close first),
    /// each with its history and markers, and the workflow id's pointer when the run is still
    /// its current one. A running run is never deleted; neither are its tasks (finished tasks
    /// have their own retention). With `fence` (several nodes: the holder of shard 0 deletes),
    /// nothing is deleted and [`StoreError::LeaseLost`] is returned unless the fence is current,
    /// checked in the same transaction; a store without shard leases refuses every fence.
    async fn purge_closed_runs(
        &self,
        before: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError>;
}
