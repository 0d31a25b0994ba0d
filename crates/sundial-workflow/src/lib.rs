//! # sundial-workflow
//!
//! Durable workflows on top of the Sundial engine: ordinary async Rust whose progress is an
//! append-only event history. When the process dies, another one replays the history to the same
//! point and carries on. Waiting costs a row: a workflow asleep for 30 days holds no memory, no
//! tokio task and no timer, only its run row, its history and one scheduled kernel task.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use sundial::Sundial;
//! use sundial_workflow::{RetryPolicy, StartWorkflow, WorkflowContext, WorkflowError, Workflows};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: String, amount: u64 }
//!
//! async fn order(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
//!     let receipt: String = ctx
//!         .activity("charge", &order)
//!         .retry(RetryPolicy::exponential(5))
//!         .await?;
//!     match ctx.signal::<bool>("paid").timeout(Duration::from_secs(30 * 60)).await? {
//!         Some(_) => {}
//!         None => {
//!             let _: () = ctx.activity("release_stock", &order).await?; // compensation
//!             return Err(WorkflowError::cancelled("payment timeout"));
//!         }
//!     }
//!     ctx.sleep(Duration::from_secs(7 * 24 * 3600)).await?; // durable
//!     ctx.activity("notify", &receipt).await
//! }
//!
//! let sundial = Sundial::open("./sundial-data").await?;
//! let workflows = Workflows::attach(&sundial)?;
//! workflows.register("order", order)?;
//! workflows.register_activity("charge", |_ctx, o: Order| async move {
//!     Ok::<_, sundial_workflow::ActivityError>(format!("receipt for {}", o.id))
//! })?;
//! # workflows.register_activity("release_stock", |_ctx, _o: Order| async move { Ok::<_, sundial_workflow::ActivityError>(()) })?;
//! # workflows.register_activity("notify", |_ctx, r: String| async move { Ok::<_, sundial_workflow::ActivityError>(r) })?;
//! let _running = sundial.start();
//! workflows
//!     .start(StartWorkflow::new("order", serde_json::json!({"id": "o-1", "amount": 5})).id("o-1"))
//!     .await?;
//! workflows.signal("o-1", "paid", serde_json::json!(true)).await?;
//! # Ok(()) }
//! ```
//!
//! ## How a run makes progress
//!
//! Everything that drives a run is a kernel task, handled in-process by this crate's handlers
//! (registered on the [`Sundial`] by [`Workflows::attach`], [`Workflows::register`] and
//! [`Workflows::register_activity`]):
//!
//! - A **workflow task** replays the run's history from the start (see [`replay`]), lets the
//!   workflow run until it blocks on something the history does not answer yet, and records the
//!   commands it issued with one [`WorkflowStore::commit_workflow_task`]: the new events, the
//!   timers and activities it starts (as kernel tasks), the ones it cancels, and the run's status,
//!   in one transaction **conditional on the history length it replayed**. A stale workflow task
//!   (a signal arrived meanwhile) writes nothing and replays again.
//! - A **timer** is a kernel task due at its fire time; when it runs it appends `timer_fired`.
//! - An **activity** is a kernel task of kind `activity/<name>` with the activity's retry policy
//!   and timeout; its last attempt appends `activity_completed` or `activity_failed`.
//! - Anything appended from outside (those, signals, cancel requests) schedules a workflow task
//!   when none is pending.
//!
//! ## Remote mode
//!
//! The same workflow functions can run in a separate worker process connected to a
//! `sundial server` (feature `remote`, `remote::RemoteWorker`): the worker long-polls
//! workflow tasks and activities over HTTP, replays the history it receives with the same
//! executor, and answers with the new commands; the server records them with the same
//! [`WorkflowStore::commit_workflow_task`]. See [`remote`] for the protocol.
//!
//! **Architecture Invariant:** the history is the truth; no state survives a workflow task in
//! memory. **API Boundary:** this crate reaches the engine only through the [`Sundial`] facade
//! (`register`, `notify_task`, `heartbeat`, `poll`, `complete`, `fail`, `get`, `clock`, `config`) and
//! storage only through [`WorkflowStore`].

mod activity;
mod context;
mod error;
pub mod event;
mod history_cache;
pub mod remote;
pub mod replay;
mod runtime;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sundial::{Sundial, Task, TaskContext, Timestamp};
use sundial_core::RunId;
use sundial_store::{
    ACTIVITY_KIND_PREFIX, ACTIVITY_QUEUE, AppendOp, CHILD_KIND, NewEvent, TIMER_KIND, TerminateOp,
    WORKFLOW_KIND_PREFIX, WORKFLOW_QUEUE, WorkflowStoreError,
};

pub use activity::{ActivityContext, ActivityError, RetryPolicy};
pub use context::{
    ActivityCall, ChildCall, Either, SignalTimeout, SignalWait, Timer, WorkflowContext, race,
};
pub use error::{Error, ErrorKind, WorkflowError};
pub use event::{Event, WorkflowEvent};
pub use replay::{ReplayError, Replayed};
pub use sundial_store::{
    IdReusePolicy, WorkflowFilter, WorkflowPage, WorkflowRun, WorkflowStatus, WorkflowStore,
};

use replay::{RunInfo, WorkflowFn};
use runtime::Inner;

/// A workflow function with its types erased: input decoded from JSON, result encoded to JSON.
pub(crate) fn erase_workflow<I, O, F, Fut>(f: F) -> WorkflowFn
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + 'static,
    F: Fn(WorkflowContext, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
{
    Arc::new(move |ctx: WorkflowContext, input: Value| {
        let decoded = serde_json::from_value::<I>(input);
        match decoded {
            Ok(input) => {
                let fut = f(ctx, input);
                Box::pin(async move {
                    let out = fut.await?;
                    serde_json::to_value(out).map_err(|e| {
                        WorkflowError::failed(format!("workflow result is not serialisable: {e}"))
                    })
                })
            }
            Err(e) => Box::pin(async move {
                Err(WorkflowError::failed(format!(
                    "workflow input is not of the expected type: {e}"
                )))
            }),
        }
    })
}

/// Settings of the workflow runtime.
#[derive(Debug, Clone)]
pub struct WorkflowConfig {
    /// History length from which a workflow task logs a warning and
    /// [`WorkflowContext::continue_as_new_suggested`] says yes.
    pub history_warn_events: u64,
    /// Time limit of one workflow task (replay and commit).
    pub workflow_task_timeout: Duration,
    /// Decoded history events kept in memory across workflow tasks of open runs (in all), so that
    /// a workflow task reads only the events appended since the previous one; 0 turns the cache
    /// off. The store stays the truth: a miss reads the whole history.
    pub history_cache_events: usize,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        WorkflowConfig {
            history_warn_events: 10_000,
            workflow_task_timeout: Duration::from_secs(60),
            history_cache_events: 200_000,
        }
    }
}

/// What [`Workflows::start`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct StartWorkflow {
    pub workflow_type: String,
    /// Chosen by the caller, or the new run's id when `None`.
    pub workflow_id: Option<String>,
    pub input: Value,
    pub id_reuse: IdReusePolicy,
}

impl StartWorkflow {
    pub fn new(workflow_type: impl Into<String>, input: Value) -> Self {
        StartWorkflow {
            workflow_type: workflow_type.into(),
            workflow_id: None,
            input,
            id_reuse: IdReusePolicy::default(),
        }
    }
    pub fn id(mut self, workflow_id: impl Into<String>) -> Self {
        self.workflow_id = Some(workflow_id.into());
        self
    }
    pub fn id_reuse(mut self, policy: IdReusePolicy) -> Self {
        self.id_reuse = policy;
        self
    }
}

/// Longest workflow type and activity name (the kernel kind adds a prefix; kinds are at most
/// 128 bytes).
pub const MAX_NAME_LEN: usize = 100;
/// Longest workflow id.
pub const MAX_WORKFLOW_ID_LEN: usize = 200;

fn check_name(field: &'static str, v: &str) -> Result<(), Error> {
    let ok_chars = v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    let first_ok = v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    if v.is_empty() || v.len() > MAX_NAME_LEN || !ok_chars || !first_ok {
        return Err(Error::Invalid {
            field,
            reason: format!(
                "must be 1 to {MAX_NAME_LEN} bytes of letters, digits and . _ : / -, starting \
                 with a letter or digit"
            ),
        });
    }
    Ok(())
}

fn check_text(field: &'static str, v: &str, max: usize) -> Result<(), Error> {
    if v.is_empty() || v.len() > max {
        return Err(Error::Invalid {
            field,
            reason: format!("must be 1 to {max} bytes long"),
        });
    }
    if v.chars().any(char::is_control) || v.trim() != v {
        return Err(Error::Invalid {
            field,
            reason: "no control characters and no leading or trailing whitespace".into(),
        });
    }
    Ok(())
}

/// Checks a workflow id: 1 to [`MAX_WORKFLOW_ID_LEN`] bytes, no control characters and no
/// leading or trailing whitespace. The id may carry a namespace (see `sundial_core::namespace`):
/// the rules apply to the id as its namespace knows it.
fn check_workflow_id(field: &'static str, id: &str) -> Result<(), Error> {
    if !sundial_core::namespace::has_valid_namespace(id) {
        return Err(Error::Invalid {
            field,
            reason: "the namespace part is not a namespace name".into(),
        });
    }
    check_text(
        field,
        sundial_core::namespace::local(id),
        MAX_WORKFLOW_ID_LEN,
    )
}

/// The workflow runtime and management API. Cheap to clone.
#[derive(Clone)]
pub struct Workflows {
    inner: Arc<Inner>,
}

impl Workflows {
    /// Uses the workflow tables of `sundial`'s store and registers the timer and child handlers.
    /// Register workflows and activities, then call [`Sundial::start`].
    pub fn attach(sundial: &Sundial) -> Result<Self, Error> {
        Self::attach_with(sundial, WorkflowConfig::default())
    }

    pub fn attach_with(sundial: &Sundial, config: WorkflowConfig) -> Result<Self, Error> {
        let store = sundial
            .workflow_store()
            .cloned()
            .ok_or(Error::Unsupported)?;
        let inner = Arc::new(Inner {
            sundial: sundial.clone(),
            store,
            histories: history_cache::HistoryCache::new(config.history_cache_events),
            config,
            workflows: RwLock::new(HashMap::new()),
            activities: RwLock::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            push: RwLock::new(None),
        });
        let i = inner.clone();
        sundial.register(TIMER_KIND, move |ctx: TaskContext| {
            let i = i.clone();
            async move { i.on_timer(&ctx.task).await }
        });
        let i = inner.clone();
        sundial.register(CHILD_KIND, move |ctx: TaskContext| {
            let i = i.clone();
            async move { i.on_child(&ctx.task).await }
        });
        Ok(Workflows { inner })
    }

    /// Wraps the push handler `push` (the one that calls task targets) so that activities with
    /// an HTTP target record their result in their workflow's history; give the returned
    /// handler to [`Sundial::set_push_handler`]. Other push tasks go to `push` unchanged.
    pub fn push_handler(&self, push: Arc<dyn sundial::Handler>) -> Arc<dyn sundial::Handler> {
        if let Ok(mut p) = self.inner.push.write() {
            *p = Some(push.clone());
        }
        let i = self.inner.clone();
        Arc::new(move |ctx: TaskContext| {
            let i = i.clone();
            let push = push.clone();
            async move {
                // (An activity of any namespace: its queue is the namespace's activity queue.)
                if sundial_core::namespace::local(&ctx.task.queue) == ACTIVITY_QUEUE
                    && ctx.task.kind.starts_with(ACTIVITY_KIND_PREFIX)
                {
                    i.on_activity(ctx).await.map(|()| None)
                } else {
                    push.call(ctx).await
                }
            }
        })
    }

    /// Registers (or replaces) the workflow function for `workflow_type`. Its input is decoded
    /// from the start request's JSON; its result is stored as JSON.
    pub fn register<I, O, F, Fut>(&self, workflow_type: &str, f: F) -> Result<(), Error>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + 'static,
        F: Fn(WorkflowContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        check_name("workflow type", workflow_type)?;
        let erased = erase_workflow(f);
        if let Ok(mut w) = self.inner.workflows.write() {
            w.insert(workflow_type.to_string(), erased);
        }
        let i = self.inner.clone();
        self.inner.sundial.register(
            format!("{WORKFLOW_KIND_PREFIX}{workflow_type}"),
            move |ctx: TaskContext| {
                let i = i.clone();
                async move { i.on_workflow_task(&ctx.task).await }
            },
        );
        Ok(())
    }

    /// Registers (or replaces) the activity function `name`. Activity names follow the same
    /// rules as workflow types.
    pub fn register_activity<I, O, F, Fut>(&self, name: &str, f: F) -> Result<(), Error>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + 'static,
        F: Fn(ActivityContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ActivityError>> + Send + 'static,
    {
        check_name("activity name", name)?;
        if let Ok(mut a) = self.inner.activities.write() {
            a.insert(name.to_string(), activity::erase(f));
        }
        let i = self.inner.clone();
        self.inner.sundial.register(
            format!("{ACTIVITY_KIND_PREFIX}{name}"),
            move |ctx: TaskContext| {
                let i = i.clone();
                async move { i.on_activity(ctx).await }
            },
        );
        Ok(())
    }

    /// Runs workflow tasks, timers, child starts and activities that became `ready` while their
    /// handler was not registered (an engine started before registering). Call after
    /// [`Sundial::start`] and the registrations. Returns how many it ran.
    pub async fn recover(&self) -> Result<usize, Error> {
        let mut kinds: Vec<String> = vec![TIMER_KIND.into(), CHILD_KIND.into()];
        if let Ok(w) = self.inner.workflows.read() {
            kinds.extend(w.keys().map(|t| format!("{WORKFLOW_KIND_PREFIX}{t}")));
        }
        let activities: Vec<String> = self
            .inner
            .activities
            .read()
            .map(|a| {
                a.keys()
                    .map(|n| format!("{ACTIVITY_KIND_PREFIX}{n}"))
                    .collect()
            })
            .unwrap_or_default();
        let mut n = 0;
        for (queue, kinds) in [(WORKFLOW_QUEUE, kinds), (ACTIVITY_QUEUE, activities)] {
            if kinds.is_empty() {
                continue;
            }
            loop {
                let tasks = self
                    .inner
                    .sundial
                    .poll(
                        queue,
                        Some("sundial-workflow".into()),
                        Some(kinds.clone()),
                        64,
                        Duration::ZERO,
                    )
                    .await?;
                if tasks.is_empty() {
                    break;
                }
                for t in tasks {
                    self.run_recovered(t).await?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    async fn run_recovered(&self, t: Task) -> Result<(), Error> {
        let Some(exec) = t.execution_id else {
            return Ok(());
        };
        let i = &self.inner;
        let out = if t.kind == TIMER_KIND {
            i.on_timer(&t).await
        } else if t.kind == CHILD_KIND {
            i.on_child(&t).await
        } else if t.kind.starts_with(WORKFLOW_KIND_PREFIX) {
            i.on_workflow_task(&t).await
        } else {
            i.on_activity(TaskContext {
                task: t.clone(),
                execution_id: exec,
                slots: Default::default(),
                answer: Default::default(),
                recorded: Default::default(),
            })
            .await
        };
        let done = match out {
            Ok(()) => i.sundial.complete(t.id, exec, None).await,
            Err(e) => i.sundial.fail(t.id, exec, e.message, e.retryable).await,
        };
        match done {
            Ok(_) | Err(sundial::Error::StaleExecution { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Starts a run. Refused while a run of the same workflow id is running, or when the id
    /// reuse policy refuses to follow the closed one.
    pub async fn start(&self, req: StartWorkflow) -> Result<WorkflowRun, Error> {
        self.start_in(sundial_core::namespace::DEFAULT_NAMESPACE, req)
            .await
    }

    /// Starts a run of a workflow of namespace `ns` (see `sundial_core::namespace`): the
    /// request's workflow id (or the new run's id) is the namespace's, stored qualified, and the
    /// run's workflow tasks, timers, activities and children are in that namespace's queues.
    /// The returned run carries the stored id.
    pub async fn start_in(&self, ns: &str, req: StartWorkflow) -> Result<WorkflowRun, Error> {
        check_name("type", &req.workflow_type)?;
        let run_id = RunId(uuid::Uuid::now_v7());
        let local = req.workflow_id.unwrap_or_else(|| run_id.to_string());
        if local.contains(sundial_core::namespace::SEPARATOR) {
            return Err(Error::Invalid {
                field: "id",
                reason: "no control characters and no leading or trailing whitespace".into(),
            });
        }
        let workflow_id = sundial_core::namespace::qualify(ns, &local);
        check_workflow_id("id", &workflow_id)?;
        self.check_size("input", &req.input)?;
        let now = self.inner.now();
        let run = self.inner.new_run(
            &workflow_id,
            run_id,
            &req.workflow_type,
            req.input,
            None,
            None,
            now,
        )?;
        let started = self.inner.store.start_run(run, req.id_reuse).await?;
        self.inner.sundial.notify_task(&started.task);
        metrics::counter!("sundial_workflow_started_total").increment(1);
        Ok(started.run)
    }

    fn check_size(&self, field: &'static str, v: &Value) -> Result<(), Error> {
        let max = self.inner.sundial.config().limits.max_payload_bytes;
        let len = serde_json::to_string(v)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        if len > max {
            return Err(Error::Invalid {
                field,
                reason: format!("is {len} bytes; the limit is {max}"),
            });
        }
        Ok(())
    }

    /// Appends an event to the workflow's current run (following continue-as-new).
    async fn append_current(
        &self,
        workflow_id: &str,
        event: &Event,
        marker: Option<&str>,
    ) -> Result<(), Error> {
        let data = serde_json::to_string(event)
            .map_err(|e| Error::Corrupt(format!("event not serialisable: {e}")))?;
        for _ in 0..8 {
            let run = self
                .inner
                .store
                .current_run(workflow_id)
                .await?
                .ok_or(Error::NotFound)?;
            if run.status.is_closed() {
                return Err(Error::NotRunning { status: run.status });
            }
            let now = self.inner.now();
            let op = AppendOp {
                run_id: run.run_id,
                events: vec![NewEvent {
                    at: now,
                    data: data.clone(),
                }],
                marker: marker.map(str::to_string),
                workflow_task: self.inner.workflow_task(
                    run.run_id,
                    &run.workflow_type,
                    sundial_core::namespace::namespace_of(&run.workflow_id),
                    now,
                )?,
                now,
            };
            match self.inner.store.append(op).await {
                Ok(a) => {
                    if let Some(t) = &a.task {
                        self.inner.sundial.notify_task(t);
                    }
                    return Ok(());
                }
                Err(WorkflowStoreError::Duplicate) => return Ok(()),
                // Closed meanwhile: a continued run takes it, anything else is final.
                Err(WorkflowStoreError::NotRunning {
                    status: sundial_store::WorkflowStatus::ContinuedAsNew,
                }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::KeptContinuing)
    }

    /// Sends signal `name` with `input` to the workflow's current run. Signals are buffered in
    /// order until the workflow waits for them.
    pub async fn signal(&self, workflow_id: &str, name: &str, input: Value) -> Result<(), Error> {
        check_text("signal", name, MAX_NAME_LEN)?;
        self.check_size("input", &input)?;
        self.append_current(
            workflow_id,
            &Event::SignalReceived {
                name: name.to_string(),
                input,
            },
            None,
        )
        .await
    }

    /// Asks the workflow to cancel: what it is awaiting returns a cancellation error (and the
    /// activity or timer behind it is cancelled); the workflow decides what to do (compensate,
    /// then return). Asking again is a no-op.
    pub async fn cancel(&self, workflow_id: &str, reason: Option<String>) -> Result<(), Error> {
        self.append_current(
            workflow_id,
            &Event::CancelRequested { reason },
            Some("cancel"),
        )
        .await
    }

    /// Ends the workflow's current run at once, without running any workflow code: its pending
    /// workflow task, timers and activities are cancelled (in-process attempts interrupted).
    pub async fn terminate(&self, workflow_id: &str, reason: &str) -> Result<WorkflowRun, Error> {
        let run = self
            .inner
            .store
            .current_run(workflow_id)
            .await?
            .ok_or(Error::NotFound)?;
        if run.status.is_closed() {
            return Err(Error::NotRunning { status: run.status });
        }
        let now = self.inner.now();
        let event = Event::WorkflowTerminated {
            reason: reason.to_string(),
        };
        let parent = match &run.parent {
            Some(link) => {
                self.inner
                    .parent_append(
                        link,
                        Event::ChildClosed {
                            cmd: link.cmd,
                            status: WorkflowStatus::Terminated.as_str().into(),
                            result: None,
                            error: Some(reason.to_string()),
                        },
                        now,
                    )
                    .await?
            }
            None => None,
        };
        let t = self
            .inner
            .store
            .terminate(TerminateOp {
                run_id: run.run_id,
                event: NewEvent {
                    at: now,
                    data: serde_json::to_string(&event)
                        .map_err(|e| Error::Corrupt(e.to_string()))?,
                },
                reason: reason.to_string(),
                parent,
                now,
            })
            .await?;
        self.inner.histories.forget(run.run_id);
        let inserted: Vec<&Task> = t.parent.iter().filter_map(|p| p.task.as_ref()).collect();
        self.inner.after_write(&inserted, &t.cancelled);
        Ok(t.run)
    }

    /// The workflow's current run.
    pub async fn get(&self, workflow_id: &str) -> Result<Option<WorkflowRun>, Error> {
        Ok(self.inner.store.current_run(workflow_id).await?)
    }

    pub async fn get_run(&self, run_id: RunId) -> Result<Option<WorkflowRun>, Error> {
        Ok(self.inner.store.get_run(run_id).await?)
    }

    /// Workflows (their current runs) in workflow id order after `after`, at most `limit`
    /// (1 to 1,000).
    pub async fn list(
        &self,
        filter: &WorkflowFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<WorkflowPage, Error> {
        Ok(self
            .inner
            .store
            .list_workflows(filter, after, limit.clamp(1, 1_000))
            .await?)
    }

    /// A run's whole history.
    pub async fn history(&self, run_id: RunId) -> Result<Vec<WorkflowEvent>, Error> {
        self.inner.load_history(run_id).await
    }

    /// The current run's history as JSON: `{"workflow_id", "run_id", "events": [...]}`.
    pub async fn history_json(&self, workflow_id: &str) -> Result<Value, Error> {
        let run = self.get(workflow_id).await?.ok_or(Error::NotFound)?;
        let events = self.history(run.run_id).await?;
        Ok(json!({
            "workflow_id": run.workflow_id,
            "run_id": run.run_id,
            "events": events,
        }))
    }

    /// Replays `history` with the workflow registered for its type, as a workflow task would
    /// (at `now`), without writing anything.
    pub fn replay(
        &self,
        run: &WorkflowRun,
        history: &[WorkflowEvent],
        now: Timestamp,
    ) -> Result<Replayed, Error> {
        let workflow =
            self.inner
                .workflow_fn(&run.workflow_type)
                .ok_or_else(|| Error::Invalid {
                    field: "type",
                    reason: format!("no workflow registered for {:?}", run.workflow_type),
                })?;
        let info = RunInfo {
            workflow_id: run.workflow_id.clone(),
            run_id: Some(run.run_id),
            suggest_continue_after: self.inner.config.history_warn_events,
        };
        replay::replay(&workflow, history, info, now).map_err(|e| Error::Invalid {
            field: "history",
            reason: e.to_string(),
        })
    }

    pub fn sundial(&self) -> &Sundial {
        &self.inner.sundial
    }
}

/// Replays a recorded history against `workflow` without any store: the replay test harness.
///
/// Every command the workflow issues while the history lasts must be the recorded one; for a
/// complete history of a closed run, [`Replayed::new_commands`] is then empty and
/// [`Replayed::finished`] true. A changed workflow yields [`ReplayError::NonDeterminism`] naming
/// the first event that no longer matches.
pub fn replay_history<I, O, F, Fut>(
    workflow: F,
    history: &[WorkflowEvent],
) -> Result<Replayed, ReplayError>
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + 'static,
    F: Fn(WorkflowContext, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
{
    let erased: WorkflowFn = Arc::new(move |ctx: WorkflowContext, input: Value| {
        match serde_json::from_value::<I>(input) {
            Ok(input) => {
                let fut = workflow(ctx, input);
                Box::pin(async move {
                    let out = fut.await?;
                    Ok(serde_json::to_value(out)?)
                })
            }
            Err(e) => Box::pin(async move { Err(WorkflowError::from(e)) }),
        }
    });
    let now = history.last().map_or(Timestamp(0), |e| e.at);
    replay::replay(&erased, history, RunInfo::default(), now)
}
