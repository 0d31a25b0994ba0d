//! Remote mode: workflow code running in a worker process connected to a `sundial server`.
//!
//! The server keeps all state; a remote worker only computes. Two kinds of kernel tasks reach
//! remote workers, both through workflow-specific endpoints (the server has no in-process
//! handler for the types and names it has no code for, so the kernel leaves their tasks `ready`
//! for pollers):
//!
//! ```text
//! POST /v1/workflow-tasks/poll              {worker, types, max?, wait_ms?}        200 {tasks: [WorkflowTaskView]}
//! POST /v1/workflow-tasks/{task}/complete   {execution_id, expect_len, commands}  200 {status: committed|dropped}
//!                                           | {execution_id, expect_len, error}   | {status: stale, task: WorkflowTaskView}
//! POST /v1/workflow-activities/poll         {worker, names, max?, wait_ms?}        200 {tasks: [ActivityTaskView]}
//! POST /v1/workflow-activities/{task}/complete {execution_id, result?}            200 | 409 stale execution
//! POST /v1/workflow-activities/{task}/fail  {execution_id, error, retryable?}     200 | 409 stale execution
//! POST /v1/tasks/{task}/heartbeat           {execution_id}  (the task API's, for long activities)
//! ```
//!
//! - **Workflow tasks.** Polling claims kernel tasks of kind `workflow/<type>` for the given
//!   types and answers each with the run's whole history and the server's `now`. The worker
//!   replays it with the same executor as library mode ([`crate::replay`]) and sends the new
//!   commands back with the history length it replayed; the server turns them into the same
//!   atomic commit the in-process runtime uses ([`WorkflowStore::commit_workflow_task`],
//!   conditional on that length). When a signal or an activity result arrived meanwhile the
//!   commit is stale: the server answers `stale` with the fresh history, under the same claim,
//!   and the worker replays again. A replay that fails (non-determinism) is sent as `error`, and
//!   fails the run as in-process. Workflow tasks the server finds closed or superseded are
//!   finished on the server and never reach the worker.
//! - **Activities.** Polling claims kernel tasks of kind `activity/<name>`. Steps already
//!   recorded, and attempts past the activity's retry policy (which only report the failure),
//!   are handled on the server. The worker runs the activity and reports its result or error;
//!   the server appends `activity_completed` / `activity_failed` (marked, so at most once) and
//!   finishes the kernel attempt, or lets the kernel retry a retryable error while the policy
//!   has attempts left. A cancelled activity's report is refused as a stale execution.
//!
//! Since every claim is an ordinary kernel lease, a worker that dies mid-task only delays the
//! run: the lease expires and any worker polling the same type continues from the history.
//!
//! The server side of this protocol is [`Workflows::poll_workflow_tasks`],
//! [`Workflows::complete_workflow_task`], [`Workflows::poll_activities`] and
//! [`Workflows::finish_activity`]; the client side is `RemoteWorker` (feature `remote`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sundial::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_core::RunId;
use sundial_store::{ACTIVITY_KIND_PREFIX, WORKFLOW_KIND_PREFIX};
use sundial_store::{WorkflowRun, WorkflowStoreError};

use crate::event::{Event, WorkflowEvent};
use crate::{Error, Workflows, check_name};

#[cfg(feature = "remote")]
mod client;
#[cfg(feature = "remote")]
pub use client::{RemoteActivityContext, RemoteError, RemoteWorker};

/// Most tasks one poll returns.
pub const MAX_POLL: u32 = 64;
/// Longest long-poll wait.
pub const MAX_WAIT_MS: u64 = 30_000;

// ---- Wire types ---------------------------------------------------------------------------------

/// `POST /v1/workflow-tasks/poll`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PollWorkflowTasks {
    pub worker: String,
    /// Workflow types this worker has code for.
    pub types: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// How long to wait for a task when none is ready (at most 30 s): milliseconds (`20000`)
    /// or a duration string (`"20s"`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "sundial_core::duration::opt_millis"
    )]
    pub wait_ms: Option<u64>,
    /// The same as a duration string, as the task API's poll takes it (`"20s"`); not with
    /// `wait_ms`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "sundial_core::duration::opt"
    )]
    pub wait: Option<String>,
}

/// A claimed workflow task: what to replay.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowTaskView {
    pub task_id: uuid::Uuid,
    pub execution_id: uuid::Uuid,
    pub workflow_id: String,
    pub run_id: uuid::Uuid,
    #[serde(rename = "type")]
    pub workflow_type: String,
    /// The run's whole history; its length is the `expect_len` of the answer.
    pub history: Vec<WorkflowEvent>,
    /// The server's time for this workflow task (what `ctx.now()` returns in the live part).
    pub now: Timestamp,
    /// History length from which `continue_as_new_suggested` says yes.
    pub suggest_continue_after: u64,
}

/// `POST /v1/workflow-tasks/{task}/complete`: the new commands, or why the replay failed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteWorkflowTask {
    pub execution_id: uuid::Uuid,
    pub expect_len: u64,
    #[serde(default)]
    pub commands: Vec<Event>,
    /// Set when the replay failed (e.g. non-determinism): the run fails with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to a workflow task's completion.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum WorkflowTaskOutcome {
    /// Recorded.
    Committed,
    /// The run is closed or has a newer workflow task; nothing was recorded, nothing to do.
    Dropped,
    /// The history grew meanwhile: replay this (same claim) and answer again.
    Stale { task: Box<WorkflowTaskView> },
}

/// `POST /v1/workflow-activities/poll`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PollActivities {
    pub worker: String,
    /// Activity names this worker has code for.
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// As [`PollWorkflowTasks::wait_ms`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "sundial_core::duration::opt_millis"
    )]
    pub wait_ms: Option<u64>,
    /// As [`PollWorkflowTasks::wait`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "sundial_core::duration::opt"
    )]
    pub wait: Option<String>,
}

/// A claimed activity attempt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActivityTaskView {
    pub task_id: uuid::Uuid,
    pub execution_id: uuid::Uuid,
    pub run_id: uuid::Uuid,
    #[serde(rename = "type")]
    pub workflow_type: String,
    pub cmd: u32,
    pub name: String,
    pub input: Value,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The activity's retry policy's attempts.
    pub max_attempts: u32,
    pub timeout_ms: u64,
}

/// `POST /v1/workflow-activities/{task}/complete`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompleteActivity {
    pub execution_id: uuid::Uuid,
    #[serde(default)]
    pub result: Value,
}

/// `POST /v1/workflow-activities/{task}/fail`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FailActivity {
    pub execution_id: uuid::Uuid,
    pub error: String,
    /// Default true: retried while the activity's policy has attempts left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

fn check_poll(
    field: &'static str,
    names: &[String],
    max: Option<u32>,
    wait_ms: Option<u64>,
    wait: Option<&str>,
) -> Result<(usize, Duration), Error> {
    if names.is_empty() {
        return Err(Error::Invalid {
            field,
            reason: "must not be empty".into(),
        });
    }
    for n in names {
        check_name(field, n)?;
    }
    let max = max.unwrap_or(1).clamp(1, MAX_POLL) as usize;
    let wait_ms = match (wait_ms, wait) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid {
                field: "wait",
                reason: "give either wait or wait_ms, not both".into(),
            });
        }
        (Some(ms), None) => ms,
        (None, Some(w)) => {
            let d = sundial_core::duration::parse(w).map_err(|e| Error::Invalid {
                field: "wait",
                reason: e.to_string(),
            })?;
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
        }
        (None, None) => 0,
    };
    let wait = Duration::from_millis(wait_ms.min(MAX_WAIT_MS));
    Ok((max, wait))
}

fn run_of(task: &Task) -> Option<RunId> {
    task.payload
        .get("run")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<RunId>().ok())
}

impl Workflows {
    // ---- workflow tasks ---------------------------------------------------------------------

    /// Claims up to `max` workflow tasks of `types` for a remote worker, waiting up to
    /// `wait_ms` for one (see the module docs).
    pub async fn poll_workflow_tasks(
        &self,
        req: PollWorkflowTasks,
    ) -> Result<Vec<WorkflowTaskView>, Error> {
        self.poll_workflow_tasks_in(sundial_core::namespace::DEFAULT_NAMESPACE, req)
            .await
    }

    /// [`Workflows::poll_workflow_tasks`] of the workflows of namespace `ns` (their workflow
    /// queue; see `sundial_core::namespace`). The views carry stored workflow ids.
    pub async fn poll_workflow_tasks_in(
        &self,
        ns: &str,
        req: PollWorkflowTasks,
    ) -> Result<Vec<WorkflowTaskView>, Error> {
        let (max, wait) = check_poll(
            "types",
            &req.types,
            req.max,
            req.wait_ms,
            req.wait.as_deref(),
        )?;
        let kinds: Vec<String> = req
            .types
            .iter()
            .map(|t| format!("{WORKFLOW_KIND_PREFIX}{t}"))
            .collect();
        let tasks = self
            .inner
            .sundial
            .poll(
                &sundial_store::workflow_queue(ns),
                Some(req.worker),
                Some(kinds),
                max,
                wait,
            )
            .await?;
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let Some(exec) = t.execution_id else { continue };
            match self.workflow_task_view(&t, exec).await {
                Ok(Some(v)) => out.push(v),
                Ok(None) => self.finish_kernel(t.id, exec).await,
                Err(e) => {
                    tracing::warn!(task = %t.id, error = %e, "cannot hand out a workflow task");
                    let _ = self
                        .inner
                        .sundial
                        .fail(t.id, exec, e.to_string(), true)
                        .await;
                }
            }
        }
        Ok(out)
    }

    /// The run and history behind a claimed workflow task; `None` when there is nothing to do
    /// (unreadable payload, run closed, or a newer workflow task pending).
    async fn workflow_task_view(
        &self,
        task: &Task,
        exec: ExecutionId,
    ) -> Result<Option<WorkflowTaskView>, Error> {
        let Some(run_id) = run_of(task) else {
            tracing::warn!(task = %task.id, "workflow task with an unreadable payload; dropped");
            return Ok(None);
        };
        let Some(run) = self.live_run(run_id, task.id).await? else {
            return Ok(None);
        };
        let history = match self.inner.load_history(run_id).await {
            Ok(h) => h,
            Err(Error::Corrupt(e)) => {
                // As in-process: a history that cannot be read fails the run.
                let now = self.inner.now();
                let commit = self
                    .inner
                    .failure_commit(&run, task.id, run.history_len, e, now)
                    .await?;
                if let Ok(c) = self.inner.store.commit_workflow_task(commit).await {
                    self.inner.after_commit(&c);
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        Ok(Some(WorkflowTaskView {
            task_id: task.id.0,
            execution_id: exec.0,
            workflow_id: run.workflow_id,
            run_id: run_id.0,
            workflow_type: run.workflow_type,
            history,
            now: self.inner.now(),
            suggest_continue_after: self.inner.config.history_warn_events,
        }))
    }

    /// The run, while it is open and `task` is its pending workflow task.
    async fn live_run(&self, run_id: RunId, task: TaskId) -> Result<Option<WorkflowRun>, Error> {
        Ok(self
            .inner
            .store
            .get_run(run_id)
            .await?
            .filter(|r| !r.status.is_closed() && r.pending_task == Some(task)))
    }

    /// Ends a kernel attempt that needs no more work; a lost claim is not an error here.
    async fn finish_kernel(&self, id: TaskId, exec: ExecutionId) {
        if let Err(e) = self.inner.sundial.complete(id, exec, None).await {
            tracing::debug!(task = %id, error = %e, "could not complete a workflow kernel task");
        }
    }

    /// The kernel task, while `exec` still owns it.
    async fn owned(&self, id: TaskId, exec: ExecutionId) -> Result<Task, Error> {
        let task = self
            .inner
            .sundial
            .get(id)
            .await?
            .ok_or(sundial::Error::NotFound)?;
        if task.state != TaskState::Running || task.execution_id != Some(exec) {
            return Err(sundial::Error::StaleExecution { state: task.state }.into());
        }
        Ok(task)
    }

    /// Records a remote worker's answer to a workflow task with the same commit as the
    /// in-process runtime (see the module docs).
    pub async fn complete_workflow_task(
        &self,
        task_id: TaskId,
        req: CompleteWorkflowTask,
    ) -> Result<WorkflowTaskOutcome, Error> {
        let exec = ExecutionId(req.execution_id);
        let task = self.owned(task_id, exec).await?;
        if !task.kind.starts_with(WORKFLOW_KIND_PREFIX) {
            return Err(Error::Invalid {
                field: "task",
                reason: "not a workflow task".into(),
            });
        }
        let Some(run_id) = run_of(&task) else {
            self.finish_kernel(task_id, exec).await;
            return Ok(WorkflowTaskOutcome::Dropped);
        };
        let Some(run) = self.live_run(run_id, task_id).await? else {
            self.finish_kernel(task_id, exec).await;
            return Ok(WorkflowTaskOutcome::Dropped);
        };
        let now = self.inner.now();
        let commit = match req.error {
            Some(error) => {
                tracing::error!(
                    workflow_id = %run.workflow_id, run_id = %run_id, error = %error,
                    "remote workflow task failed the run"
                );
                self.inner
                    .failure_commit(&run, task_id, req.expect_len, error, now)
                    .await?
            }
            None => match self
                .inner
                .build_commit(&run, task_id, req.expect_len, req.commands, now)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    self.inner
                        .failure_commit(&run, task_id, req.expect_len, e.to_string(), now)
                        .await?
                }
            },
        };
        match self.inner.store.commit_workflow_task(commit).await {
            Ok(c) => {
                self.inner.after_commit(&c);
                metrics::counter!("sundial_workflow_tasks_total").increment(1);
                self.finish_kernel(task_id, exec).await;
                Ok(WorkflowTaskOutcome::Committed)
            }
            Err(WorkflowStoreError::Stale { .. }) => {
                metrics::counter!("sundial_workflow_tasks_stale_total").increment(1);
                match self.workflow_task_view(&task, exec).await? {
                    Some(v) => Ok(WorkflowTaskOutcome::Stale { task: Box::new(v) }),
                    None => {
                        self.finish_kernel(task_id, exec).await;
                        Ok(WorkflowTaskOutcome::Dropped)
                    }
                }
            }
            Err(WorkflowStoreError::NotRunning { .. } | WorkflowStoreError::NotFound) => {
                self.finish_kernel(task_id, exec).await;
                Ok(WorkflowTaskOutcome::Dropped)
            }
            Err(e) => Err(e.into()),
        }
    }

    // ---- activities -------------------------------------------------------------------------

    /// Claims up to `max` activity attempts of `names` for a remote worker (see the module
    /// docs).
    pub async fn poll_activities(
        &self,
        req: PollActivities,
    ) -> Result<Vec<ActivityTaskView>, Error> {
        self.poll_activities_in(sundial_core::namespace::DEFAULT_NAMESPACE, req)
            .await
    }

    /// [`Workflows::poll_activities`] of the workflows of namespace `ns` (their activity
    /// queue; see `sundial_core::namespace`).
    pub async fn poll_activities_in(
        &self,
        ns: &str,
        req: PollActivities,
    ) -> Result<Vec<ActivityTaskView>, Error> {
        let (max, wait) = check_poll(
            "names",
            &req.names,
            req.max,
            req.wait_ms,
            req.wait.as_deref(),
        )?;
        let kinds: Vec<String> = req
            .names
            .iter()
            .map(|n| format!("{ACTIVITY_KIND_PREFIX}{n}"))
            .collect();
        let tasks = self
            .inner
            .sundial
            .poll(
                &sundial_store::activity_queue(ns),
                Some(req.worker),
                Some(kinds),
                max,
                wait,
            )
            .await?;
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let Some(exec) = t.execution_id else { continue };
            let step = activity_step(&t);
            let recorded = match &step {
                Some(s) => self
                    .inner
                    .store
                    .has_marker(RunId(s.run_id), &format!("activity:{}", s.cmd))
                    .await
                    .map_err(Error::from)?,
                None => true,
            };
            let Some(view) = step.filter(|_| !recorded) else {
                // Unreadable, or recorded before: never run the step again.
                self.finish_kernel(t.id, exec).await;
                continue;
            };
            if t.attempt > view.max_attempts {
                // Past the policy's last attempt: report the kernel's last error, as in-process.
                let error = t
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "the last attempt did not finish".into());
                let event = Event::ActivityFailed {
                    cmd: view.cmd,
                    error,
                    attempts: view.max_attempts,
                };
                self.record_activity(&t, &view, exec, event).await?;
                continue;
            }
            out.push(view);
        }
        Ok(out)
    }

    async fn record_activity(
        &self,
        task: &Task,
        view: &ActivityTaskView,
        exec: ExecutionId,
        event: Event,
    ) -> Result<(), Error> {
        self.inner
            .append_marked(
                RunId(view.run_id),
                &view.workflow_type,
                sundial_core::namespace::namespace_of(&task.queue),
                event,
                Some(format!("activity:{}", view.cmd)),
            )
            .await
            .map_err(|e| Error::ActivityNotRecorded { reason: e.message })?;
        self.inner.sundial.complete(task.id, exec, None).await?;
        Ok(())
    }

    /// Records a remote activity attempt's outcome: `Ok(result)`, or `Err((error, retryable))`.
    pub async fn finish_activity(
        &self,
        task_id: TaskId,
        execution_id: uuid::Uuid,
        outcome: Result<Value, (String, bool)>,
    ) -> Result<(), Error> {
        let exec = ExecutionId(execution_id);
        let task = self.owned(task_id, exec).await?;
        let Some(view) = activity_step(&task) else {
            return Err(Error::Invalid {
                field: "task",
                reason: "not a workflow activity".into(),
            });
        };
        let event = match outcome {
            Ok(result) => Event::ActivityCompleted {
                cmd: view.cmd,
                result,
            },
            Err((error, retryable)) if retryable && task.attempt < view.max_attempts => {
                self.inner.sundial.fail(task_id, exec, error, true).await?;
                return Ok(());
            }
            Err((error, _)) => Event::ActivityFailed {
                cmd: view.cmd,
                error,
                attempts: task.attempt,
            },
        };
        self.record_activity(&task, &view, exec, event).await
    }
}

/// The step a kernel activity task runs, as a worker sees it.
fn activity_step(t: &Task) -> Option<ActivityTaskView> {
    let p = &t.payload;
    Some(ActivityTaskView {
        task_id: t.id.0,
        execution_id: t.execution_id?.0,
        run_id: p.get("run")?.as_str()?.parse().ok()?,
        workflow_type: p.get("type")?.as_str()?.to_string(),
        cmd: u32::try_from(p.get("cmd")?.as_u64()?).ok()?,
        name: p.get("name")?.as_str()?.to_string(),
        input: p.get("input").cloned().unwrap_or(Value::Null),
        attempt: t.attempt,
        max_attempts: p
            .get("max_attempts")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1),
        timeout_ms: t.timeout_ms,
    })
}
