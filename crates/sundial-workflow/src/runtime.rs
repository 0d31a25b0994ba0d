//! The workflow runtime: the in-process handlers of the kernel tasks that drive workflows, and
//! how a workflow task's output becomes one store commit.
//!
//! | kernel task | queue | kind | does |
//! |---|---|---|---|
//! | workflow task | `sundial.workflows` | `workflow/<type>` | replay, then commit the new commands |
//! | timer | `sundial.workflows` | `sundial.workflow.timer` | append `timer_fired` |
//! | activity | `sundial.activities` | `activity/<name>` | run the activity, append its result |
//! | child start/cancel | `sundial.workflows` | `sundial.workflow.child` | start (or cancel) a child run |
//!
//! Timers, activities and child starts carry the key `wf:<run id>/<what>/<command>`: at most one
//! live task per step, and closing a run cancels whatever it left outstanding.
//!
//! **At most one recorded result per step.** A timer's or activity's append carries the marker
//! `timer:<cmd>` / `activity:<cmd>`, unique per run in the store: a second append (a retried
//! task whose first append committed) is refused. An activity whose marker exists is not run
//! again: once its completion is recorded, a step never runs twice.
//!
//! **Activity attempts.** The kernel task gets ten attempts more than the activity's policy
//! allows. An attempt past the policy's last one does not run the activity: it records the
//! failure (with the kernel's last error, e.g. a timeout or a lease expiry after a crash), so the
//! workflow always hears the end of an activity even when its last attempt never returned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Value, json};
use sundial::{
    Backoff, ExecutionId, HandlerError, Sundial, Task, TaskContext, TaskId, TaskSpec, Timestamp,
};
use sundial_core::{NewTask, RunId, ValidationError, namespace};
use sundial_store::{
    ACTIVITY_KIND_PREFIX, AppendOp, CHILD_KIND, Committed, IdReusePolicy, NewEvent, NewRun,
    ParentLink, RunClose, TIMER_KIND, WORKFLOW_KIND_PREFIX, WorkflowRun, WorkflowStatus,
    WorkflowStore, WorkflowStoreError, WorkflowTaskCommit, activity_queue, run_task_key_prefix,
    workflow_queue,
};
use tokio::sync::watch;

use crate::activity::{ActivityContext, ActivityFn};
use crate::event::{Event, WorkflowEvent};
use crate::history_cache::HistoryCache;
use crate::replay::{self, ReplayError, RunInfo, WorkflowFn};
use crate::{Error, WorkflowConfig};

/// Workflow tasks retry for a long time (a store outage, an unregistered type), backing off to
/// a minute.
const WORKFLOW_TASK_ATTEMPTS: u32 = 1_000;
/// How often one workflow task replays again because the history changed under it.
const STALE_RETRIES: usize = 64;
/// Extra kernel attempts of an activity, to report its failure (see the module docs).
const REPORT_ATTEMPTS: u32 = 10;
/// Events read per history page.
const HISTORY_PAGE: usize = 10_000;

pub(crate) struct Inner {
    pub sundial: Sundial,
    pub store: Arc<dyn WorkflowStore>,
    /// Histories of open runs between their workflow tasks (a cache; see `history_cache`).
    pub histories: HistoryCache,
    pub config: WorkflowConfig,
    pub workflows: RwLock<HashMap<String, WorkflowFn>>,
    pub activities: RwLock<HashMap<String, ActivityFn>>,
    /// In-process activity attempts, to interrupt when the workflow cancels them.
    pub running: Mutex<HashMap<TaskId, watch::Sender<bool>>>,
    /// The push handler that calls the targets of activities that name one
    /// (`Workflows::push_handler`).
    pub push: RwLock<Option<Arc<dyn sundial::Handler>>>,
}

fn retryable(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::retryable(e.to_string())
}

fn backoff() -> Backoff {
    Backoff::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(60))
}

fn json_text(v: &impl serde::Serialize) -> String {
    // Events and values built here always serialise; a failure would be a bug, reported in-band.
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The parts of a timer's, activity's or child task's payload that name its step.
struct Step {
    run: RunId,
    workflow_type: String,
    cmd: u32,
}

fn parse_step(p: &Value) -> Option<Step> {
    Some(Step {
        run: p.get("run")?.as_str()?.parse().ok()?,
        workflow_type: p.get("type")?.as_str()?.to_string(),
        cmd: u32::try_from(p.get("cmd")?.as_u64()?).ok()?,
    })
}

impl Inner {
    pub fn now(&self) -> Timestamp {
        self.sundial.clock().now()
    }

    fn validate(
        &self,
        spec: TaskSpec,
        id: TaskId,
        now: Timestamp,
    ) -> Result<NewTask, ValidationError> {
        let cfg = self.sundial.config();
        spec.validate(id, now, cfg.shard_count, &cfg.limits)
    }

    /// A workflow task of `run`, a run of namespace `ns` (in that namespace's workflow queue).
    pub fn workflow_task(
        &self,
        run: RunId,
        workflow_type: &str,
        ns: &str,
        now: Timestamp,
    ) -> Result<NewTask, ValidationError> {
        let spec = TaskSpec::new(format!("{WORKFLOW_KIND_PREFIX}{workflow_type}"))
            .queue(workflow_queue(ns))
            .payload(json!({"run": run.to_string(), "type": workflow_type}))
            .max_attempts(WORKFLOW_TASK_ATTEMPTS)
            .backoff(backoff())
            .timeout(self.config.workflow_task_timeout);
        self.validate(spec, TaskId(uuid::Uuid::now_v7()), now)
    }

    /// A new run (its first event and first workflow task).
    #[allow(clippy::too_many_arguments)]
    pub fn new_run(
        &self,
        workflow_id: &str,
        run_id: RunId,
        workflow_type: &str,
        input: Value,
        parent: Option<ParentLink>,
        continued_from: Option<RunId>,
        now: Timestamp,
    ) -> Result<NewRun, ValidationError> {
        let started = Event::WorkflowStarted {
            workflow_type: workflow_type.to_string(),
            input: input.clone(),
            continued_from,
            parent_workflow_id: parent.as_ref().map(|p| p.workflow_id.clone()),
            seed: run_id.as_uuid().as_u64_pair().1,
        };
        Ok(NewRun {
            workflow_id: workflow_id.to_string(),
            run_id,
            workflow_type: workflow_type.to_string(),
            input: json_text(&input),
            parent,
            continued_from,
            started: NewEvent {
                at: now,
                data: json_text(&started),
            },
            first_task: self.workflow_task(
                run_id,
                workflow_type,
                namespace::namespace_of(workflow_id),
                now,
            )?,
            now,
        })
    }

    pub fn workflow_fn(&self, workflow_type: &str) -> Option<WorkflowFn> {
        self.workflows
            .read()
            .ok()
            .and_then(|w| w.get(workflow_type).cloned())
    }

    fn activity_fn(&self, name: &str) -> Option<ActivityFn> {
        self.activities
            .read()
            .ok()
            .and_then(|a| a.get(name).cloned())
    }

    /// Tells the engine about tasks a workflow write inserted and interrupts in-process
    /// activities it cancelled.
    pub fn after_write(&self, inserted: &[&Task], cancelled: &[TaskId]) {
        for t in inserted {
            self.sundial.notify_task(t);
        }
        if cancelled.is_empty() {
            return;
        }
        if let Ok(running) = self.running.lock() {
            for id in cancelled {
                if let Some(tx) = running.get(id) {
                    tx.send_replace(true);
                }
            }
        }
    }

    pub fn after_commit(&self, c: &Committed) {
        let mut inserted: Vec<&Task> = c.tasks.iter().collect();
        if let Some(n) = &c.next_run {
            inserted.push(&n.task);
        }
        if let Some(t) = c.parent.as_ref().and_then(|p| p.task.as_ref()) {
            inserted.push(t);
        }
        self.after_write(&inserted, &c.cancelled);
        if c.run.status.is_closed() {
            self.histories.forget(c.run.run_id);
            metrics::counter!("sundial_workflow_closed_total", "status" => c.run.status.as_str())
                .increment(1);
        }
    }

    /// Events for a parent run, about its child's close. `None` when the parent is gone.
    pub async fn parent_append(
        &self,
        link: &ParentLink,
        event: Event,
        now: Timestamp,
    ) -> Result<Option<AppendOp>, Error> {
        let Some(parent) = self.store.get_run(link.run_id).await? else {
            return Ok(None);
        };
        Ok(Some(AppendOp {
            run_id: link.run_id,
            events: vec![NewEvent {
                at: now,
                data: json_text(&event),
            }],
            marker: Some(format!("child:{}", link.cmd)),
            workflow_task: self.workflow_task(
                link.run_id,
                &parent.workflow_type,
                namespace::namespace_of(&parent.workflow_id),
                now,
            )?,
            now,
        }))
    }

    /// Appends one event from outside the workflow code to `run`, a run of namespace `ns`; a
    /// closed or unknown run, or a marker seen before, is not an error here.
    pub(crate) async fn append_marked(
        &self,
        run: RunId,
        workflow_type: &str,
        ns: &str,
        event: Event,
        marker: Option<String>,
    ) -> Result<(), HandlerError> {
        let now = self.now();
        let op = AppendOp {
            run_id: run,
            events: vec![NewEvent {
                at: now,
                data: json_text(&event),
            }],
            marker,
            workflow_task: self
                .workflow_task(run, workflow_type, ns, now)
                .map_err(retryable)?,
            now,
        };
        match self.store.append(op).await {
            Ok(a) => {
                if let Some(t) = &a.task {
                    self.sundial.notify_task(t);
                }
                Ok(())
            }
            Err(
                WorkflowStoreError::NotRunning { .. }
                | WorkflowStoreError::NotFound
                | WorkflowStoreError::Duplicate,
            ) => Ok(()),
            Err(e) => Err(retryable(e)),
        }
    }

    pub async fn load_history(&self, run: RunId) -> Result<Vec<WorkflowEvent>, Error> {
        self.load_history_after(run, Vec::new()).await
    }

    /// The run's whole history, reading from the store only what comes after `known` (a prefix
    /// of it, such as a cached history). A prefix that does not line up with the store's
    /// sequence numbers is dropped and the whole history read again.
    pub async fn load_history_after(
        &self,
        run: RunId,
        known: Vec<WorkflowEvent>,
    ) -> Result<Vec<WorkflowEvent>, Error> {
        let lined_up = known.iter().enumerate().all(|(i, e)| e.seq == i as u64);
        let mut out = if lined_up { known } else { Vec::new() };
        loop {
            let from = out.len() as u64;
            let page = self.store.history(run, from, HISTORY_PAGE).await?;
            if from > 0 && page.first().is_some_and(|e| e.seq != from) {
                // The prefix does not continue where the store does: read everything.
                out.clear();
                continue;
            }
            let n = page.len();
            for e in &page {
                out.push(WorkflowEvent::decode(e).map_err(|err| {
                    Error::Corrupt(format!("event {} of run {run}: {err}", e.seq))
                })?);
            }
            if n < HISTORY_PAGE {
                return Ok(out);
            }
        }
    }

    // ---- workflow tasks ---------------------------------------------------------------------

    pub async fn on_workflow_task(&self, task: &Task) -> Result<(), HandlerError> {
        let Some(run_id) = task
            .payload
            .get("run")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<RunId>().ok())
        else {
            tracing::warn!(task = %task.id, "workflow task with an unreadable payload; dropped");
            return Ok(());
        };
        for _ in 0..STALE_RETRIES {
            let Some(run) = self.store.get_run(run_id).await.map_err(retryable)? else {
                return Ok(());
            };
            if run.status.is_closed() || run.pending_task != Some(task.id) {
                return Ok(()); // done, or superseded by a newer workflow task
            }
            let Some(workflow) = self.workflow_fn(&run.workflow_type) else {
                return Err(retryable(format!(
                    "no workflow registered for type {:?} in this process",
                    run.workflow_type
                )));
            };
            let now = self.now();
            let cached = self.histories.take(run_id);
            let commit = match self.load_history_after(run_id, cached).await {
                Ok(history) => {
                    let len = history.len() as u64;
                    if len >= self.config.history_warn_events {
                        tracing::warn!(
                            workflow_id = %run.workflow_id, run_id = %run_id, events = len,
                            "workflow history is large; consider continue-as-new"
                        );
                    }
                    let info = RunInfo {
                        workflow_id: run.workflow_id.clone(),
                        run_id: Some(run_id),
                        suggest_continue_after: self.config.history_warn_events,
                    };
                    let replayed = tokio::task::spawn_blocking(move || {
                        let r = replay::replay(&workflow, &history, info, now);
                        (r, history)
                    })
                    .await
                    .map_err(|e| ReplayError::Panicked(e.to_string()))
                    .and_then(|(r, history)| {
                        // Kept for the run's next workflow task unless the run ends here.
                        if matches!(&r, Ok(r) if !r.finished) {
                            self.histories.put(run_id, history);
                        }
                        r
                    });
                    match replayed {
                        Ok(r) => match self
                            .build_commit(&run, task.id, len, r.new_commands, now)
                            .await
                        {
                            Ok(c) => c,
                            Err(e) => self
                                .failure_commit(&run, task.id, len, e.to_string(), now)
                                .await
                                .map_err(retryable)?,
                        },
                        Err(e) => {
                            tracing::error!(
                                workflow_id = %run.workflow_id, run_id = %run_id, error = %e,
                                "workflow task failed the run"
                            );
                            self.failure_commit(&run, task.id, len, e.to_string(), now)
                                .await
                                .map_err(retryable)?
                        }
                    }
                }
                Err(Error::Corrupt(e)) => self
                    .failure_commit(&run, task.id, run.history_len, e, now)
                    .await
                    .map_err(retryable)?,
                Err(e) => return Err(retryable(e)),
            };
            match self.store.commit_workflow_task(commit).await {
                Ok(c) => {
                    self.after_commit(&c);
                    metrics::counter!("sundial_workflow_tasks_total").increment(1);
                    return Ok(());
                }
                Err(WorkflowStoreError::Stale { .. }) => {
                    metrics::counter!("sundial_workflow_tasks_stale_total").increment(1);
                    continue;
                }
                Err(WorkflowStoreError::NotRunning { .. } | WorkflowStoreError::NotFound) => {
                    return Ok(());
                }
                Err(e) => return Err(retryable(e)),
            }
        }
        Err(retryable(
            "the run's history kept changing; trying again later",
        ))
    }

    /// A commit that records `error` and fails the run.
    pub(crate) async fn failure_commit(
        &self,
        run: &WorkflowRun,
        task: TaskId,
        expect_len: u64,
        error: String,
        now: Timestamp,
    ) -> Result<WorkflowTaskCommit, Error> {
        let events = [
            Event::WorkflowTaskCompleted {
                continue_as_new_suggested: false,
            },
            Event::WorkflowFailed {
                error: error.clone(),
            },
        ];
        let parent = match &run.parent {
            Some(link) => {
                self.parent_append(
                    link,
                    Event::ChildClosed {
                        cmd: link.cmd,
                        status: WorkflowStatus::Failed.as_str().into(),
                        result: None,
                        error: Some(error.clone()),
                    },
                    now,
                )
                .await?
            }
            None => None,
        };
        Ok(WorkflowTaskCommit {
            run_id: run.run_id,
            expect_len,
            expect_task: task,
            events: events
                .iter()
                .map(|e| NewEvent {
                    at: now,
                    data: json_text(e),
                })
                .collect(),
            tasks: Vec::new(),
            cancel: Vec::new(),
            close: Some(RunClose {
                status: WorkflowStatus::Failed,
                result: None,
                error: Some(error),
            }),
            continue_as: None,
            parent,
            now,
        })
    }

    /// Turns a workflow task's new commands into one commit.
    pub(crate) async fn build_commit(
        &self,
        run: &WorkflowRun,
        task: TaskId,
        expect_len: u64,
        commands: Vec<Event>,
        now: Timestamp,
    ) -> Result<WorkflowTaskCommit, Error> {
        let prefix = run_task_key_prefix(&run.run_id);
        // The run's namespace (its workflow id's): its timers, activities and child starts go to
        // that namespace's queues, and the children it names are that namespace's workflows.
        let ns = namespace::namespace_of(&run.workflow_id);
        let child_id = |id: &str| -> Result<String, Error> {
            if id.contains(namespace::SEPARATOR) {
                return Err(Error::Invalid {
                    field: "child",
                    reason: format!("child workflow id {id:?}: control characters are not allowed"),
                });
            }
            Ok(namespace::qualify(ns, id))
        };
        let step = |cmd: u32| json!({"run": run.run_id.to_string(), "type": run.workflow_type, "cmd": cmd});
        let mut tasks = Vec::new();
        let mut cancel = Vec::new();
        let mut close = None;
        let mut continue_as = None;
        for c in &commands {
            match c {
                Event::ActivityScheduled {
                    cmd,
                    name,
                    input,
                    task,
                    max_attempts,
                    timeout_ms,
                    backoff,
                    target,
                } => {
                    let limit = self.sundial.config().limits.max_attempts;
                    let attempts = max_attempts.saturating_add(REPORT_ATTEMPTS).min(limit);
                    let mut payload = step(*cmd);
                    payload["name"] = json!(name);
                    payload["input"] = input.clone();
                    payload["max_attempts"] = json!(max_attempts);
                    let spec = TaskSpec::new(format!("{ACTIVITY_KIND_PREFIX}{name}"))
                        .queue(activity_queue(ns))
                        .key(format!("{prefix}act/{cmd}"))
                        .payload(payload)
                        .max_attempts(attempts)
                        .backoff(backoff.clone())
                        .timeout(Duration::from_millis(*timeout_ms));
                    // With a target the engine hands each attempt to the push handler (under
                    // its receiver's slots), which `Workflows::push_handler` wraps.
                    let spec = match target {
                        Some(t) => spec.target(t.clone()),
                        None => spec,
                    };
                    tasks.push(
                        self.validate(spec, *task, now)
                            .map_err(|e| Error::Invalid {
                                field: "activity",
                                reason: format!("activity {name:?}: {e}"),
                            })?,
                    );
                }
                Event::TimerStarted { cmd, fire_at, task } => {
                    let spec = TaskSpec::new(TIMER_KIND)
                        .queue(workflow_queue(ns))
                        .key(format!("{prefix}timer/{cmd}"))
                        .payload(step(*cmd))
                        .run_at(*fire_at)
                        .max_attempts(WORKFLOW_TASK_ATTEMPTS)
                        .backoff(backoff())
                        .timeout(self.config.workflow_task_timeout);
                    tasks.push(self.validate(spec, *task, now)?);
                }
                Event::ChildStartRequested {
                    cmd,
                    workflow_type,
                    workflow_id,
                    input,
                    task,
                } => {
                    let mut payload = step(*cmd);
                    payload["action"] = json!("start");
                    payload["parent_workflow_id"] = json!(run.workflow_id);
                    payload["child_type"] = json!(workflow_type);
                    payload["child_id"] = json!(child_id(workflow_id)?);
                    payload["input"] = input.clone();
                    let spec = TaskSpec::new(CHILD_KIND)
                        .queue(workflow_queue(ns))
                        .key(format!("{prefix}child/{cmd}"))
                        .payload(payload)
                        .max_attempts(WORKFLOW_TASK_ATTEMPTS)
                        .backoff(backoff())
                        .timeout(self.config.workflow_task_timeout);
                    tasks.push(
                        self.validate(spec, *task, now)
                            .map_err(|e| Error::Invalid {
                                field: "child",
                                reason: format!("child workflow {workflow_id:?}: {e}"),
                            })?,
                    );
                }
                Event::ChildCancelRequested {
                    cmd,
                    workflow_id,
                    task,
                } => {
                    // No key: it must survive the parent's own close in this very commit.
                    let mut payload = step(*cmd);
                    payload["action"] = json!("cancel");
                    payload["child_id"] = json!(child_id(workflow_id)?);
                    let spec = TaskSpec::new(CHILD_KIND)
                        .queue(workflow_queue(ns))
                        .payload(payload)
                        .max_attempts(WORKFLOW_TASK_ATTEMPTS)
                        .backoff(backoff())
                        .timeout(self.config.workflow_task_timeout);
                    tasks.push(self.validate(spec, *task, now)?);
                }
                Event::ActivityCancelRequested { task, .. }
                | Event::TimerCancelled { task, .. } => cancel.push(*task),
                Event::WorkflowCompleted { result } => {
                    close = Some(RunClose {
                        status: WorkflowStatus::Completed,
                        result: Some(json_text(result)),
                        error: None,
                    })
                }
                Event::WorkflowFailed { error } => {
                    close = Some(RunClose {
                        status: WorkflowStatus::Failed,
                        result: None,
                        error: Some(error.clone()),
                    })
                }
                Event::WorkflowCancelled { error } => {
                    close = Some(RunClose {
                        status: WorkflowStatus::Cancelled,
                        result: None,
                        error: Some(error.clone()),
                    })
                }
                Event::WorkflowContinuedAsNew { new_run_id, input } => {
                    close = Some(RunClose {
                        status: WorkflowStatus::ContinuedAsNew,
                        result: None,
                        error: None,
                    });
                    continue_as = Some(self.new_run(
                        &run.workflow_id,
                        *new_run_id,
                        &run.workflow_type,
                        input.clone(),
                        run.parent.clone(),
                        Some(run.run_id),
                        now,
                    )?);
                }
                Event::SideEffect { .. } | Event::Patched { .. } => {}
                other => {
                    return Err(Error::Corrupt(format!(
                        "{} is not a command",
                        other.type_name()
                    )));
                }
            }
        }
        // A child that closed for good tells its parent, in the same transaction.
        let parent = match (&close, &run.parent) {
            (Some(c), Some(link)) if c.status != WorkflowStatus::ContinuedAsNew => {
                let event = Event::ChildClosed {
                    cmd: link.cmd,
                    status: c.status.as_str().into(),
                    result: c
                        .result
                        .as_deref()
                        .and_then(|r| serde_json::from_str(r).ok()),
                    error: c.error.clone(),
                };
                self.parent_append(link, event, now).await?
            }
            _ => None,
        };
        let mut events = Vec::with_capacity(commands.len() + 1);
        events.push(NewEvent {
            at: now,
            data: json_text(&Event::WorkflowTaskCompleted {
                continue_as_new_suggested: expect_len >= self.config.history_warn_events,
            }),
        });
        events.extend(commands.iter().map(|c| NewEvent {
            at: now,
            data: json_text(c),
        }));
        Ok(WorkflowTaskCommit {
            run_id: run.run_id,
            expect_len,
            expect_task: task,
            events,
            tasks,
            cancel,
            close,
            continue_as,
            parent,
            now,
        })
    }

    // ---- timers -----------------------------------------------------------------------------

    pub async fn on_timer(&self, task: &Task) -> Result<(), HandlerError> {
        let Some(s) = parse_step(&task.payload) else {
            tracing::warn!(task = %task.id, "workflow timer with an unreadable payload; dropped");
            return Ok(());
        };
        self.append_marked(
            s.run,
            &s.workflow_type,
            namespace::namespace_of(&task.queue),
            Event::TimerFired { cmd: s.cmd },
            Some(format!("timer:{}", s.cmd)),
        )
        .await
    }

    // ---- activities -------------------------------------------------------------------------

    pub async fn on_activity(&self, ctx: TaskContext) -> Result<(), HandlerError> {
        let task = ctx.task;
        let Some(s) = parse_step(&task.payload) else {
            tracing::warn!(task = %task.id, "activity with an unreadable payload; dropped");
            return Ok(());
        };
        let name = task
            .payload
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let max_attempts = task
            .payload
            .get("max_attempts")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1);
        let input = task.payload.get("input").cloned().unwrap_or(Value::Null);
        let marker = format!("activity:{}", s.cmd);
        // Recorded before (an earlier attempt's append committed): never run the step again.
        if self
            .store
            .has_marker(s.run, &marker)
            .await
            .map_err(retryable)?
        {
            return Ok(());
        }
        if task.attempt > max_attempts {
            let error = task
                .last_error
                .clone()
                .unwrap_or_else(|| "the last attempt did not finish".into());
            return self
                .append_marked(
                    s.run,
                    &s.workflow_type,
                    namespace::namespace_of(&task.queue),
                    Event::ActivityFailed {
                        cmd: s.cmd,
                        error,
                        attempts: max_attempts,
                    },
                    Some(marker),
                )
                .await;
        }
        if task.target.is_some() {
            return self
                .push_activity(ctx.execution_id, &task, &s, input, marker, max_attempts)
                .await;
        }
        let Some(f) = self.activity_fn(&name) else {
            return Err(retryable(format!(
                "no activity registered for {name:?} in this process"
            )));
        };
        let (tx, rx) = watch::channel(false);
        if let Ok(mut running) = self.running.lock() {
            running.insert(task.id, tx);
        }
        let actx = ActivityContext {
            task: task.clone(),
            execution: ctx.execution_id,
            run_id: s.run,
            cmd: s.cmd,
            sundial: self.sundial.clone(),
            cancel: rx.clone(),
        };
        let probe = actx.clone();
        let out = tokio::select! {
            r = f(actx, input) => Some(r),
            _ = probe.cancelled() => None,
        };
        if let Ok(mut running) = self.running.lock() {
            running.remove(&task.id);
        }
        let event = match out {
            // Cancelled by the workflow: the kernel task is cancelled already.
            None => return Ok(()),
            Some(Ok(result)) => Event::ActivityCompleted { cmd: s.cmd, result },
            Some(Err(e)) if !e.retryable || task.attempt >= max_attempts => Event::ActivityFailed {
                cmd: s.cmd,
                error: e.message,
                attempts: task.attempt,
            },
            Some(Err(e)) => return Err(e),
        };
        self.append_marked(
            s.run,
            &s.workflow_type,
            namespace::namespace_of(&task.queue),
            event,
            Some(marker),
        )
        .await
    }

    /// An attempt of an activity with an HTTP target: the push handler calls it with the
    /// activity's input as the body; a 2xx answer's body is the result, failures follow the
    /// activity's retry policy like an activity function's errors.
    async fn push_activity(
        &self,
        execution: ExecutionId,
        task: &Task,
        s: &Step,
        input: Value,
        marker: String,
        max_attempts: u32,
    ) -> Result<(), HandlerError> {
        let push = self.push.read().ok().and_then(|p| p.clone());
        let Some(push) = push else {
            return Err(retryable("push delivery is not enabled in this process"));
        };
        let mut call = task.clone();
        call.payload = input;
        let out = push
            .call(TaskContext {
                task: call,
                execution_id: execution,
                slots: Default::default(),
                answer: Default::default(),
                recorded: Default::default(),
            })
            .await;
        let event = match out {
            Ok(result) => Event::ActivityCompleted {
                cmd: s.cmd,
                result: result
                    .and_then(|r| r.get("body").cloned())
                    .unwrap_or(Value::Null),
            },
            Err(e) if !e.retryable || task.attempt >= max_attempts => Event::ActivityFailed {
                cmd: s.cmd,
                error: e.message,
                attempts: task.attempt,
            },
            Err(e) => return Err(e),
        };
        self.append_marked(
            s.run,
            &s.workflow_type,
            namespace::namespace_of(&task.queue),
            event,
            Some(marker),
        )
        .await
    }

    // ---- child workflows --------------------------------------------------------------------

    pub async fn on_child(&self, task: &Task) -> Result<(), HandlerError> {
        let p = &task.payload;
        let (Some(s), Some(child_id)) = (
            parse_step(p),
            p.get("child_id")
                .and_then(Value::as_str)
                .map(str::to_string),
        ) else {
            tracing::warn!(task = %task.id, "child task with an unreadable payload; dropped");
            return Ok(());
        };
        let link_matches = |r: &WorkflowRun| {
            r.parent
                .as_ref()
                .is_some_and(|l| l.run_id == s.run && l.cmd == s.cmd)
        };
        if p.get("action").and_then(Value::as_str) == Some("cancel") {
            let Some(child) = self.store.current_run(&child_id).await.map_err(retryable)? else {
                return Ok(());
            };
            if child.status.is_closed() || !link_matches(&child) {
                return Ok(());
            }
            return self
                .append_marked(
                    child.run_id,
                    &child.workflow_type,
                    namespace::namespace_of(&child.workflow_id),
                    Event::CancelRequested {
                        reason: Some("the parent workflow cancelled it".into()),
                    },
                    Some("cancel".into()),
                )
                .await;
        }
        let marker = format!("child-start:{}", s.cmd);
        if self
            .store
            .has_marker(s.run, &marker)
            .await
            .map_err(retryable)?
        {
            return Ok(());
        }
        let child_type = p
            .get("child_type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let parent_workflow_id = p
            .get("parent_workflow_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let input = p.get("input").cloned().unwrap_or(Value::Null);
        let existing = self.store.current_run(&child_id).await.map_err(retryable)?;
        let event = match existing {
            // An earlier attempt started it.
            Some(r) if link_matches(&r) => Event::ChildStarted {
                cmd: s.cmd,
                run_id: r.run_id,
            },
            _ => {
                let now = self.now();
                let link = ParentLink {
                    run_id: s.run,
                    workflow_id: parent_workflow_id,
                    cmd: s.cmd,
                };
                match self.new_run(
                    &child_id,
                    RunId(uuid::Uuid::now_v7()),
                    &child_type,
                    input,
                    Some(link),
                    None,
                    now,
                ) {
                    Err(e) => Event::ChildStartFailed {
                        cmd: s.cmd,
                        error: e.to_string(),
                    },
                    Ok(new_run) => match self
                        .store
                        .start_run(new_run, IdReusePolicy::AllowDuplicate)
                        .await
                    {
                        Ok(started) => {
                            self.sundial.notify_task(&started.task);
                            Event::ChildStarted {
                                cmd: s.cmd,
                                run_id: started.run.run_id,
                            }
                        }
                        Err(
                            e @ (WorkflowStoreError::AlreadyRunning { .. }
                            | WorkflowStoreError::AlreadyExists { .. }),
                        ) => Event::ChildStartFailed {
                            cmd: s.cmd,
                            error: e.to_string(),
                        },
                        Err(e) => return Err(retryable(e)),
                    },
                }
            }
        };
        self.append_marked(
            s.run,
            &s.workflow_type,
            namespace::namespace_of(&task.queue),
            event,
            Some(marker),
        )
        .await
    }
}
