//! # sundial
//!
//! A durable clock for applications: delayed tasks that run at the right moment even if every
//! process dies in between. This crate is what applications depend on: the [`Sundial`] facade over
//! the engine (shard loops, look-ahead windows, claims, handler runs, the lease reaper and the
//! worker protocol) and the embedded SQLite store.
//!
//! ```no_run
//! # async fn example() -> Result<(), sundial::Error> {
//! use std::time::Duration;
//! use sundial::{Sundial, TaskSpec};
//!
//! let sundial = Sundial::open("./sundial-data").await?;
//! sundial.register("order.close", |task: sundial::TaskContext| async move {
//!     println!("closing {}", task.payload());
//!     Ok::<(), sundial::HandlerError>(())
//! });
//! let id = sundial
//!     .schedule(
//!         TaskSpec::new("order.close")
//!             .key("order-123")
//!             .payload(serde_json::json!({"order": 123}))
//!             .delay(Duration::from_secs(30 * 60)),
//!     )
//!     .await?;
//! sundial.cancel(id).await?;
//! let running = sundial.start();
//! running.shutdown(Duration::from_secs(10)).await;
//! # Ok(()) }
//! ```
//!
//! **Architecture Invariant:** the engine decides *when* to look; the store decides *whether* a
//! change happens (every change is conditional). The engine's memory is bounded by its windows,
//! never by the number of pending tasks.

pub mod clock;
mod cluster;
mod config;
mod engine;
mod error;
mod handler;
mod ops;
mod placement;
mod series;
pub mod trace;
mod window;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sundial_store::Inserted;

pub use clock::SystemClock;
pub use cluster::{ClusterView, NodeView};
pub use config::{Config, ConfigError, MIN_SHARD_LEASE_TTL, Retention};
pub use engine::poll::Completion;
pub use engine::retention::Purged;
pub use engine::seen::{MAX_SEEN, WorkerSeen};
pub use engine::step::Stepper;
pub use error::Error;
pub use handler::{
    AttemptAnswer, ClaimedWhenDue, Handler, HandlerError, HandlerFuture, RunSlots, SuccessRecorded,
    TaskContext,
};
pub use ops::{BULK_BATCH, BulkOutcome, QueueInfo};
pub use series::register_queue_metrics;
pub use sundial_core::Tags;
pub use sundial_core::{
    Backoff, Clock, Due, Exclusive, ExclusiveMode, ExecutionId, INTERNAL_QUEUE_PREFIX, Limits,
    ManualClock, Priority, PushMethod, RateLimit, Target, Task, TaskId, TaskSpec, TaskState,
    Timestamp, TokenId, TraceContext, ValidationError, is_internal_queue,
};
pub use sundial_store::{
    AccessStore, Attempt, AttemptHistory, AttemptOutcome, AttemptResponse, Cluster, PushSecret,
    PushSecretStore, QueueConfig, QueueSettings, RetentionOverride, RetentionRules, ScheduleStore,
    StateCount, Store, StoreError, TaskFilter, TaskPage, WorkflowStore,
};
/// The access store's rows (tokens), for programs that write the first token themselves.
pub use sundial_store::{NewToken, Scope, TokenRecord};
pub use sundial_store_sqlite::{Durability, SqliteOptions, SqliteStore};

use engine::Engine;

/// Result of scheduling one task of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Scheduled {
    Created(Box<Task>),
    /// A live task of the same queue already holds the key; this item was not stored.
    Duplicate {
        existing: TaskId,
    },
}

/// A Sundial instance: a store, a clock and the engine that connects them.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Sundial {
    engine: Arc<Engine>,
    /// The store's schedule tables, when the backend has them (see `sundial-schedules`).
    schedule_store: Option<Arc<dyn ScheduleStore>>,
    /// The store's workflow tables, when the backend has them (see `sundial-workflow`).
    workflow_store: Option<Arc<dyn WorkflowStore>>,
    /// The store's push signing secrets, when the backend has them (see `sundial-push`).
    push_secret_store: Option<Arc<dyn PushSecretStore>>,
    /// The store's tokens, namespaces and audit log, when the backend has them (the server).
    access_store: Option<Arc<dyn AccessStore>>,
}

/// Builds a [`Sundial`] with a chosen store, clock and configuration.
pub struct Builder {
    config: Config,
    clock: Arc<dyn Clock>,
    sqlite: SqliteOptions,
    schedule_store: Option<Arc<dyn ScheduleStore>>,
    workflow_store: Option<Arc<dyn WorkflowStore>>,
    /// The store's push signing secrets, when the backend has them (see `sundial-push`).
    push_secret_store: Option<Arc<dyn PushSecretStore>>,
    access_store: Option<Arc<dyn AccessStore>>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            config: Config::default(),
            clock: Arc::new(SystemClock),
            sqlite: SqliteOptions::default(),
            schedule_store: None,
            workflow_store: None,
            push_secret_store: None,
            access_store: None,
        }
    }
}

impl Builder {
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    pub fn sqlite_options(mut self, opts: SqliteOptions) -> Self {
        self.sqlite = opts;
        self
    }
    /// The schedule tables to hand to layers above (`sundial-schedules`), for a store passed
    /// with [`Builder::with_store`]. [`Builder::open`] sets the embedded store's own.
    pub fn schedule_store(mut self, store: Arc<dyn ScheduleStore>) -> Self {
        self.schedule_store = Some(store);
        self
    }
    /// The workflow tables to hand to `sundial-workflow`, for a store passed with
    /// [`Builder::with_store`]. [`Builder::open`] sets the embedded store's own.
    /// The push signing secrets to hand to `sundial-push`, for a store passed with
    /// [`Builder::with_store`]. [`Builder::open`] sets the embedded store's own.
    pub fn push_secret_store(mut self, store: Arc<dyn PushSecretStore>) -> Self {
        self.push_secret_store = Some(store);
        self
    }
    pub fn workflow_store(mut self, store: Arc<dyn WorkflowStore>) -> Self {
        self.workflow_store = Some(store);
        self
    }
    /// The token, namespace and audit tables to hand to the server, for a store passed with
    /// [`Builder::with_store`]. [`Builder::open`] sets the embedded store's own.
    pub fn access_store(mut self, store: Arc<dyn AccessStore>) -> Self {
        self.access_store = Some(store);
        self
    }
    /// Opens (creating if needed) the embedded store in directory `dir`.
    ///
    /// The shard count is the store's: a new store records `Config::shard_count`, an existing
    /// one keeps the count it was created with (one derived from its rows, for a store of a
    /// build that did not record it). A configured count that differs is ignored with a warning,
    /// and [`Sundial::config`] shows the count in force. Refused while another process (or
    /// another open store in this one) has the directory open.
    pub async fn open(mut self, dir: impl AsRef<Path>) -> Result<Sundial, Error> {
        self.config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let opts = SqliteOptions {
            shard_count: self.config.shard_count,
            ..self.sqlite.clone()
        };
        let at = dir.clone();
        let store = tokio::task::spawn_blocking(move || SqliteStore::open_dir(&at, opts))
            .await
            .map_err(|e| Error::Store(StoreError::backend(e)))??;
        let shards = store.shards();
        if shards.origin == sundial_store_sqlite::ShardCountOrigin::DerivedFromRows {
            tracing::warn!(
                data_dir = %dir.display(),
                shards = shards.count,
                "the store did not record its shard count (an older build wrote it); derived {} from its tasks and recorded it",
                shards.count
            );
        }
        if shards.count != self.config.shard_count {
            tracing::warn!(
                data_dir = %dir.display(),
                stored = shards.count,
                requested = self.config.shard_count,
                "the store in {} has {} shards, fixed when it was created; the requested {} is ignored",
                dir.display(),
                shards.count,
                self.config.shard_count
            );
            self.config.shard_count = shards.count;
        }
        let store = Arc::new(store);
        let schedules: Arc<dyn ScheduleStore> = store.clone();
        let workflows: Arc<dyn WorkflowStore> = store.clone();
        let push: Arc<dyn PushSecretStore> = store.clone();
        let access: Arc<dyn AccessStore> = store.clone();
        self.schedule_store(schedules)
            .workflow_store(workflows)
            .push_secret_store(push)
            .access_store(access)
            .with_store(store)
    }
    /// Uses an already opened store (any backend), on a single node that runs every shard.
    /// Refuses a [`Config`] that does not [validate](Config::validate).
    pub fn with_store(self, store: Arc<dyn Store>) -> Result<Sundial, Error> {
        self.config.validate()?;
        Ok(Sundial {
            engine: Engine::new(store, self.clock, self.config, placement::Placement::Single),
            schedule_store: self.schedule_store,
            workflow_store: self.workflow_store,
            push_secret_store: self.push_secret_store,
            access_store: self.access_store,
        })
    }

    /// Joins a cluster of nodes sharing `store` (PostgreSQL): this node runs the shards that
    /// rendezvous hashing over the live nodes gives it, under fenced leases.
    ///
    /// Before anything runs, this reads the stored shard count (the first node sets it from
    /// `Config::shard_count`) and measures the node's clock against the database's: beyond
    /// `Config::max_clock_skew` it refuses with [`Error::ClockSkew`]; within it, the engine runs on
    /// the database's time (see [`clock::OffsetClock`]), so all nodes decide "due" on one clock.
    /// The node measures again every `Config::clock_check_interval` under the same limit.
    pub async fn join_cluster(
        mut self,
        store: Arc<dyn Store>,
        cluster: Arc<dyn Cluster>,
        node: impl Into<String>,
    ) -> Result<Sundial, Error> {
        self.config.validate()?;
        let node = node.into();
        let stored = cluster.shard_count(self.config.shard_count).await?;
        if stored != self.config.shard_count {
            tracing::warn!(
                stored,
                requested = self.config.shard_count,
                "the database has {stored} shards, fixed when it was first used; the requested {} is ignored",
                self.config.shard_count
            );
        }
        self.config.shard_count = stored;
        let offset = cluster::measure_offset(cluster.as_ref(), self.clock.as_ref()).await?;
        let skew = offset.unsigned_abs();
        if skew > self.config.max_clock_skew.as_millis() as u64 {
            return Err(Error::ClockSkew {
                skew_ms: offset,
                limit_ms: self.config.max_clock_skew.as_millis() as u64,
            });
        }
        if skew > cluster::WARN_SKEW_MS {
            tracing::warn!(
                offset_ms = offset,
                "this node's clock differs from the database's; running on the database's time"
            );
        }
        let offset_clock = Arc::new(clock::OffsetClock::new(self.clock, offset));
        let node = cluster::ClusterNode::new(cluster, node, &self.config, offset_clock.clone());
        let clock: Arc<dyn Clock> = offset_clock;
        Ok(Sundial {
            engine: Engine::new(
                store,
                clock,
                self.config,
                placement::Placement::Cluster(Arc::new(node)),
            ),
            schedule_store: self.schedule_store,
            workflow_store: self.workflow_store,
            push_secret_store: self.push_secret_store,
            access_store: self.access_store,
        })
    }
}

impl Sundial {
    /// Opens the embedded store in `dir` with default settings and the system clock.
    pub async fn open(dir: impl AsRef<Path>) -> Result<Self, Error> {
        Builder::default().open(dir).await
    }

    pub fn builder() -> Builder {
        Builder::default()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.engine.clock
    }

    pub fn config(&self) -> &Config {
        &self.engine.config
    }

    /// What keeps the store's writes from succeeding now (its disk is full), as its last writes
    /// found it; `None` when they went through. Never touches the database.
    pub fn store_condition(&self) -> Option<String> {
        self.engine.store.condition()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.engine.store
    }

    /// The store's schedule tables, when it has them: set by [`Builder::open`] (the embedded
    /// store) or [`Builder::schedule_store`]. Used by `sundial-schedules`.
    pub fn schedule_store(&self) -> Option<&Arc<dyn ScheduleStore>> {
        self.schedule_store.as_ref()
    }

    /// The store's workflow tables, when it has them: set by [`Builder::open`] (the embedded
    /// store) or [`Builder::workflow_store`]. Used by `sundial-workflow`.
    pub fn workflow_store(&self) -> Option<&Arc<dyn WorkflowStore>> {
        self.workflow_store.as_ref()
    }

    /// The store's push signing secrets, when it has them: set by [`Builder::open`] (the
    /// embedded store) or [`Builder::push_secret_store`]. Used by `sundial-push`.
    pub fn push_secret_store(&self) -> Option<&Arc<dyn PushSecretStore>> {
        self.push_secret_store.as_ref()
    }

    /// Sets the handler of every task that carries a push target (`sundial-push` installs its
    /// executor here). Its runs are limited per receiver and per node
    /// (`Config::push_host_concurrency`, `Config::push_concurrency`) instead of by queue. Without
    /// one, push tasks become ready for workers like tasks of a kind with no handler.
    pub fn set_push_handler(&self, handler: Arc<dyn Handler>) {
        self.engine.set_push_handler(handler);
    }

    /// The store's tokens, namespaces and audit log, when it has them: set by [`Builder::open`]
    /// (the embedded store) or [`Builder::access_store`]. Used by `sundial-server`.
    pub fn access_store(&self) -> Option<&Arc<dyn AccessStore>> {
        self.access_store.as_ref()
    }

    /// Tells the engine about a task that a layer above inserted through its own store operation
    /// (for example a schedule's fire, which inserts its task and its next tick in one
    /// transaction): a scheduled task wakes its shard's gate when it is due earlier than the
    /// gate, a ready one wakes the workers polling its queue. [`Sundial::schedule`] does this
    /// itself; a task inserted behind the engine's back without this call is still found, but
    /// only by the shard's idle rescan.
    pub fn notify_task(&self, task: &Task) {
        self.engine.notify_task(task);
    }

    /// Registers the in-process handler for tasks of `kind`. Due tasks of a kind with no handler
    /// become `ready` for workers polling their queue (and wait there, visible, until one does).
    pub fn register(&self, kind: impl Into<String>, handler: impl Handler) {
        self.engine.register(kind.into(), Arc::new(handler));
    }

    /// Stores one task durably and returns its id. A live task holding the same `(queue, key)`
    /// yields [`Error::Duplicate`] with its id; nothing new is stored.
    pub async fn schedule(&self, spec: TaskSpec) -> Result<TaskId, Error> {
        self.schedule_task(spec).await.map(|t| t.id)
    }

    /// Like [`Sundial::schedule`], returning the stored task.
    pub async fn schedule_task(&self, spec: TaskSpec) -> Result<Task, Error> {
        let mut out = self.schedule_many(vec![spec]).await.map_err(|e| match e {
            Error::InvalidBatchItem { error, .. } => Error::Invalid(error),
            e => e,
        })?;
        match out.pop() {
            Some(Scheduled::Created(t)) => Ok(*t),
            Some(Scheduled::Duplicate { existing }) => Err(Error::Duplicate { existing }),
            None => Err(Error::Store(StoreError::NoRow { what: "insert" })),
        }
    }

    /// Like [`Sundial::schedule_task`], under an idempotency key: a client that cannot tell
    /// whether its create went through (a timeout, a `503` for a connection lost mid-commit)
    /// retries with the same key and gets the task the first call created, never a second one.
    ///
    /// The key is remembered per queue, with a digest of `spec` and the version, for as long as
    /// the task is live and for [`Config::idempotency_window`] after it finished. The same key,
    /// version and spec answer the original task (`repeat: true`; nothing stored); the same key
    /// and version with another spec, or an older version, is [`Error::IdempotencyConflict`]; a
    /// newer version is a new revision of the same intent and is stored. Concurrent calls with
    /// one key: exactly one stores.
    pub async fn create_idempotent(
        &self,
        spec: TaskSpec,
        idempotency: Idempotency,
    ) -> Result<Created, Error> {
        if self.engine.is_stopping() {
            return Err(Error::ShuttingDown);
        }
        idempotency.validate()?;
        let fingerprint = spec_fingerprint(&spec);
        let (task, now) = self.single_create(spec)?;
        let create = sundial_store::IdempotentCreate {
            task,
            key: idempotency.key,
            version: idempotency.version,
            fingerprint,
            remember: sundial_store::Remember::AfterFinish {
                ms: u64::try_from(self.engine.config.idempotency_window.as_millis())
                    .unwrap_or(u64::MAX),
            },
            now,
        };
        self.finish_idempotent(create).await
    }

    /// The task a single create (idempotent, throttled or debounced) stores, validated at the
    /// clock's now (returned too) with the current trace context; the request's audit record
    /// names it.
    fn single_create(&self, spec: TaskSpec) -> Result<(sundial_core::NewTask, Timestamp), Error> {
        let spec = with_current_trace(spec, &mut None);
        let now = self.engine.clock.now();
        let cfg = &self.engine.config;
        let task = spec.validate(
            TaskId(uuid::Uuid::now_v7()),
            now,
            cfg.shard_count,
            &cfg.limits,
        )?;
        sundial_store::audit_scope::name_target(task.id.to_string());
        Ok((task, now))
    }

    /// Counts a task the store just created and tells the engine of it.
    fn stored(&self, t: &Task) {
        metrics::counter!("sundial_task_created_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
            .increment(1);
        self.engine.notify_task(t);
    }

    /// Stores an idempotent or throttled create and tells the engine of the task.
    async fn finish_idempotent(
        &self,
        create: sundial_store::IdempotentCreate,
    ) -> Result<Created, Error> {
        match self.engine.store.insert_idempotent(create).await? {
            sundial_store::IdempotentOutcome::Created(t) => {
                self.stored(&t);
                Ok(Created {
                    task: *t,
                    repeat: false,
                })
            }
            sundial_store::IdempotentOutcome::Repeat(t) => {
                // The first call may have committed without getting to notify the engine (its
                // answer was lost): notify now, or the task would wait for the idle rescan.
                if t.state == TaskState::Scheduled {
                    self.engine.notify_task(&t);
                }
                Ok(Created {
                    task: *t,
                    repeat: true,
                })
            }
            sundial_store::IdempotentOutcome::Conflict { existing, version } => {
                Err(Error::IdempotencyConflict { existing, version })
            }
            sundial_store::IdempotentOutcome::Duplicate { existing } => {
                Err(Error::Duplicate { existing })
            }
        }
    }

    /// Like [`Sundial::schedule_task`], under a throttle: at most one task per queue and
    /// throttle key is admitted per `throttle.per`, measured from the admitted one's create.
    /// A create inside that period stores nothing and answers the admitted task
    /// (`repeat: true`), whatever its payload, and whatever became of that task since.
    /// Concurrent creates with one key, on any number of nodes: exactly one is admitted.
    pub async fn create_throttled(
        &self,
        spec: TaskSpec,
        throttle: Throttle,
    ) -> Result<Created, Error> {
        if self.engine.is_stopping() {
            return Err(Error::ShuttingDown);
        }
        throttle.validate()?;
        let (task, now) = self.single_create(spec)?;
        let create = sundial_store::IdempotentCreate {
            task,
            key: throttle.record_key(),
            version: 0,
            fingerprint: Throttle::FINGERPRINT.to_string(),
            remember: sundial_store::Remember::AfterCreate {
                ms: u64::try_from(throttle.per.as_millis()).unwrap_or(u64::MAX),
            },
            now,
        };
        self.finish_idempotent(create).await
    }

    /// Like [`Sundial::schedule_task`], under a debounce key: while the queue holds a pending
    /// task of `debounce.key` (scheduled, never started), the create stores nothing and replaces
    /// that task's payload and due time instead: due `debounce.delay` from now, but never past
    /// the pending task's create plus `debounce.max_wait`. Without a pending task of the key, the
    /// task is stored, due `debounce.delay` from now. A spec with a due time of its own is
    /// refused (the delay is the due time). Concurrent creates with one key, on any number of
    /// nodes: one task stays pending.
    pub async fn create_debounced(
        &self,
        spec: TaskSpec,
        debounce: Debounce,
    ) -> Result<Debounced, Error> {
        if self.engine.is_stopping() {
            return Err(Error::ShuttingDown);
        }
        debounce.validate()?;
        if spec.due != Due::Now {
            return Err(Error::Invalid(ValidationError::Conflict(
                "a debounced create takes its due time from debounce.delay: run_at and delay are not allowed",
            )));
        }
        let (task, now) = self.single_create(spec.delay(debounce.delay))?;
        let create = sundial_store::DebouncedCreate {
            task,
            key: debounce.key,
            max_wait_ms: debounce
                .max_wait
                .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            now,
        };
        match self.engine.store.insert_debounced(create).await? {
            sundial_store::DebounceOutcome::Created(t) => {
                self.stored(&t);
                Ok(Debounced {
                    task: *t,
                    replaced: false,
                })
            }
            sundial_store::DebounceOutcome::Replaced(t) => {
                metrics::counter!("sundial_task_debounced_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                    .increment(1);
                // The engine's timer still holds the old due time, which finds nothing due
                // when it passes; this one starts the task.
                self.engine.notify_task(&t);
                Ok(Debounced {
                    task: *t,
                    replaced: true,
                })
            }
            sundial_store::DebounceOutcome::Duplicate { existing } => {
                Err(Error::Duplicate { existing })
            }
        }
    }

    /// Stores many tasks in one transaction. Any invalid item rejects the whole batch (the error
    /// names its index) and nothing is stored. Key conflicts are reported per item.
    pub async fn schedule_many(&self, specs: Vec<TaskSpec>) -> Result<Vec<Scheduled>, Error> {
        if self.engine.is_stopping() {
            return Err(Error::ShuttingDown);
        }
        let now = self.engine.clock.now();
        let cfg = &self.engine.config;
        let mut rows = Vec::with_capacity(specs.len());
        let mut current = None;
        for (index, spec) in specs.into_iter().enumerate() {
            let id = TaskId(uuid::Uuid::now_v7());
            let row = with_current_trace(spec, &mut current)
                .validate(id, now, cfg.shard_count, &cfg.limits)
                .map_err(|error| Error::InvalidBatchItem { index, error })?;
            rows.push(row);
        }
        // A request that creates one task names it in its audit record, which the insert
        // commits (see `sundial_store::audit_scope`).
        if let [only] = rows.as_slice() {
            sundial_store::audit_scope::name_target(only.id.to_string());
        }
        let inserted = self.engine.store.insert(rows).await?;
        let mut out = Vec::with_capacity(inserted.len());
        for i in inserted {
            match i {
                Inserted::Created(t) => {
                    metrics::counter!("sundial_task_created_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                        .increment(1);
                    self.engine.notify_task(&t);
                    out.push(Scheduled::Created(t));
                }
                Inserted::Duplicate { existing } => out.push(Scheduled::Duplicate { existing }),
            }
        }
        Ok(out)
    }

    pub async fn get(&self, id: TaskId) -> Result<Option<Task>, Error> {
        Ok(self.engine.store.get(id).await?)
    }

    /// Lists tasks newest first; pass the page's `next_cursor` as `filter.before` for the next.
    /// A page visits at most [`sundial_store::LIST_VISIT_BUDGET`] candidates, so it may hold fewer
    /// than `limit` tasks (even none) and still carry a cursor: only `None` means the end.
    pub async fn list(&self, filter: TaskFilter, limit: usize) -> Result<TaskPage, Error> {
        Ok(self
            .engine
            .store
            .list(&filter, limit.clamp(1, 1_000))
            .await?)
    }

    /// Cancels a task that has not finished. Once this returns, the task never starts a new
    /// attempt; a running attempt loses its execution id (its result will be refused).
    pub async fn cancel(&self, id: TaskId) -> Result<Task, Error> {
        let now = self.engine.clock.now();
        let t = self.engine.store.cancel(id, now).await?;
        metrics::counter!("sundial_task_cancelled_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string()).increment(1);
        self.engine.release_exclusive(&t);
        Ok(t)
    }

    /// Makes a scheduled task due now.
    pub async fn trigger(&self, id: TaskId) -> Result<Task, Error> {
        let now = self.engine.clock.now();
        let t = self.engine.store.trigger(id, now).await?;
        self.engine.notify_task(&t);
        Ok(t)
    }

    /// Counts of tasks per queue and state.
    pub async fn counts(&self) -> Result<Vec<StateCount>, Error> {
        Ok(self.engine.store.count_by_state().await?)
    }

    // ---- Worker protocol (remote workers; see sundial-server) ---------------------------------

    /// Waits up to `wait` for ready tasks of `queue` and hands out up to `max`, each `running` under
    /// a fresh execution id with a lease of its own timeout. A traced task's `trace` is the context
    /// of its delivery (the `sundial.task.deliver` span when an OpenTelemetry layer is installed,
    /// else the stored context): the worker continues the trace from there.
    pub async fn poll(
        &self,
        queue: &str,
        worker: Option<String>,
        kinds: Option<Vec<String>>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Task>, Error> {
        self.engine.poll(queue, worker, kinds, max, wait).await
    }

    /// Records a successful attempt (as [`Sundial::complete`]), then polls (as
    /// [`Sundial::poll`]): a worker's whole turn in one call, whose first claim commits together
    /// with the completion. A refused completion is the answer, and nothing is polled; a
    /// completion already recorded for this very attempt (a retry of a call whose answer was
    /// lost) counts as recorded.
    pub async fn complete_and_poll(
        &self,
        done: Completion,
        queue: &str,
        worker: Option<String>,
        kinds: Option<Vec<String>>,
        max: usize,
        wait: Duration,
    ) -> Result<(Task, Vec<Task>), Error> {
        let (id, execution) = (done.id, done.execution);
        match self
            .engine
            .complete_and_poll(done, queue, worker.clone(), kinds.clone(), max, wait)
            .await
        {
            Err(e @ (Error::WrongState { .. } | Error::StaleExecution { .. })) => {
                match self.engine.store.get(id).await? {
                    Some(t)
                        if t.state == TaskState::Succeeded && t.execution_id == Some(execution) =>
                    {
                        let tasks = self.engine.poll(queue, worker, kinds, max, wait).await?;
                        Ok((t, tasks))
                    }
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// Extends a running attempt's lease by its timeout.
    pub async fn heartbeat(&self, id: TaskId, execution: ExecutionId) -> Result<Task, Error> {
        self.engine.heartbeat(id, execution).await
    }

    /// Records a successful attempt.
    pub async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        result: Option<serde_json::Value>,
    ) -> Result<Task, Error> {
        // No read first: the store's update is conditional on `running` with this execution id
        // and says why it refused (unknown task, or the state the attempt lost to).
        match self.engine.complete(id, execution, result).await {
            // A retry of a complete whose first call committed but whose answer was lost (a
            // connection broken mid-commit): the task succeeded with this very attempt. Answer
            // as the first call would have; nothing is applied twice.
            Err(e @ (Error::WrongState { .. } | Error::StaleExecution { .. })) => {
                match self.engine.store.get(id).await? {
                    Some(t)
                        if t.state == TaskState::Succeeded && t.execution_id == Some(execution) =>
                    {
                        Ok(t)
                    }
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// Records a failed attempt: retried with the task's backoff while attempts remain and
    /// `retryable`, otherwise `dead`.
    pub async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        error: String,
        retryable: bool,
    ) -> Result<Task, Error> {
        // No read first: the store decides the retry from the attempt's own row, in the
        // conditional update on `running` with this execution id.
        self.engine
            .fail(id, execution, error, retryable, false, None)
            .await
    }

    /// [`Sundial::fail`] with a handler's error: its `retry_after` (a push receiver's
    /// `Retry-After`) replaces the backoff delay, within the backoff's cap.
    pub async fn fail_with(
        &self,
        id: TaskId,
        execution: ExecutionId,
        error: HandlerError,
    ) -> Result<Task, Error> {
        self.engine
            .fail(
                id,
                execution,
                error.message,
                error.retryable,
                false,
                error.retry_after,
            )
            .await
    }

    /// Waits for a call slot of the push receiver `host` (`host:port`) and one of the node's push
    /// slots: the limits the engine applies to push tasks (`Config::push_host_concurrency`,
    /// `Config::push_concurrency`), for calls a layer above makes itself (a queue's default
    /// target). Dropping the slot releases both and wakes shard loops waiting for one.
    pub async fn push_slot(&self, host: &str) -> Result<PushSlot, Error> {
        let host_slots = self.engine.push_host(&Arc::from(host));
        let closed = |_| Error::ShuttingDown;
        let host_permit = host_slots.acquire_owned().await.map_err(closed)?;
        let node_permit = self
            .engine
            .push_permits()
            .acquire_owned()
            .await
            .map_err(closed)?;
        Ok(PushSlot {
            _permits: [host_permit, node_permit],
            engine: self.engine.clone(),
        })
    }

    /// Whether the engine is shutting down (loops of layers above stop taking work).
    pub fn is_stopping(&self) -> bool {
        self.engine.is_stopping()
    }

    /// [`Sundial::push_slot`] without waiting: `None` when either limit is reached.
    pub fn try_push_slot(&self, host: &str) -> Option<PushSlot> {
        let host_permit = self
            .engine
            .push_host(&Arc::from(host))
            .try_acquire_owned()
            .ok()?;
        let node_permit = self.engine.push_permits().try_acquire_owned().ok()?;
        Some(PushSlot {
            _permits: [host_permit, node_permit],
            engine: self.engine.clone(),
        })
    }

    /// Takes the engine's loops (shard loops and reaper) to turn them by hand on the engine's
    /// clock instead of running them as tasks: for tests on a [`ManualClock`], which then step
    /// exactly what the engine does at each time (see [`Stepper`]). After this, [`Sundial::start`]
    /// starts nothing (its [`Running::shutdown`] still stops handler runs). On several nodes the
    /// shard loops belong to the membership loop and only the reaper is stepped.
    pub fn stepper(&self) -> Stepper {
        Stepper::new(self.engine.clone())
    }

    /// Starts the engine (shard loops and lease reaper) on the current tokio runtime.
    pub fn start(&self) -> Running {
        let mut tasks = self.engine.start();
        if !tasks.is_empty() && self.engine.config.retention.enabled {
            tasks.push(tokio::spawn(engine::retention::drive(
                self.engine.clone(),
                self.retained_stores(),
            )));
        }
        Running {
            engine: self.engine.clone(),
            tasks,
        }
    }

    fn retained_stores(&self) -> engine::retention::RetainedStores {
        engine::retention::RetainedStores {
            schedules: self.schedule_store.clone(),
            workflows: self.workflow_store.clone(),
            access: self.access_store.clone(),
        }
    }

    /// With several nodes: the shards this node runs now (empty on a single node).
    pub fn owned_shards(&self) -> Vec<u32> {
        self.engine.placement.owned_shards()
    }

    /// With several nodes: every node of the membership with its last heartbeat and the shards
    /// it holds, and the shards nobody holds, as the store records them now (one read of the
    /// membership and lease tables). `None` on a single node.
    pub async fn cluster_view(&self) -> Result<Option<ClusterView>, Error> {
        Ok(self
            .engine
            .placement
            .cluster_view(self.engine.config.shard_count)
            .await?)
    }

    /// The workers that polled this node at or after `since` (by name and queue, with their
    /// last poll's time), the most recent first; at most [`MAX_SEEN`] pairs are remembered.
    pub fn workers_seen(&self, since: Timestamp) -> Vec<WorkerSeen> {
        self.engine.seen.since(since)
    }

    /// Handler runs under way in this process.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
}

/// A push call slot (see [`Sundial::push_slot`]): one of the receiver's and one of the node's.
pub struct PushSlot {
    _permits: [tokio::sync::OwnedSemaphorePermit; 2],
    engine: Arc<Engine>,
}

impl Drop for PushSlot {
    fn drop(&mut self) {
        self.engine.push_slot_released();
    }
}

/// The running engine. [`Running::shutdown`] stops it gracefully.
pub struct Running {
    engine: Arc<Engine>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops taking new work, lets running handlers finish for up to `deadline`, then interrupts
    /// the rest (their tasks are rescheduled to run again at once). Returns how many were
    /// interrupted.
    pub async fn shutdown(self, deadline: Duration) -> usize {
        self.engine.begin_stop();
        for t in self.tasks {
            // The loops catch their own panics (see `engine::shard::Supervised`); one that still
            // ended in a panic is reported, not dropped.
            if let Err(e) = t.await
                && e.is_panic()
            {
                tracing::error!(error = %e, "an engine task panicked");
            }
        }
        self.engine.drain(deadline).await;
        self.engine.in_flight()
    }
}

/// An idempotency key for a create ([`Sundial::create_idempotent`]): at most 256 bytes, with an
/// optional version (default 0) by which a newer revision of the same intent gets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    pub version: u64,
}

impl Idempotency {
    /// Longest key accepted, in bytes.
    pub const MAX_KEY_BYTES: usize = 256;

    pub fn new(key: impl Into<String>) -> Self {
        Idempotency {
            key: key.into(),
            version: 0,
        }
    }

    pub fn version(mut self, version: u64) -> Self {
        self.version = version;
        self
    }

    fn validate(&self) -> Result<(), ValidationError> {
        // The key may carry a namespace (see `sundial_core::namespace`); the rules apply to the
        // key as its namespace knows it.
        let key = sundial_core::namespace::local(&self.key);
        if key.is_empty() {
            return Err(ValidationError::Empty {
                field: "idempotency_key",
            });
        }
        if key.len() > Self::MAX_KEY_BYTES {
            return Err(ValidationError::TooLong {
                field: "idempotency_key",
                len: key.len(),
                max: Self::MAX_KEY_BYTES,
            });
        }
        if key.chars().any(char::is_control)
            || !sundial_core::namespace::has_valid_namespace(&self.key)
        {
            return Err(ValidationError::BadCharacters {
                field: "idempotency_key",
                reason: "control characters are not allowed",
            });
        }
        Ok(())
    }
}

/// A throttle for a create ([`Sundial::create_throttled`]): at most one task per queue and `key`
/// is admitted per `per`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    pub key: String,
    pub per: Duration,
}

impl Throttle {
    /// Longest key accepted, in bytes.
    pub const MAX_KEY_BYTES: usize = 256;
    /// Longest period accepted.
    pub const MAX_PER: Duration = Duration::from_secs(366 * 24 * 3600);
    /// Every create under a throttle asks the same thing: whatever its body, it is answered
    /// with the admitted task.
    const FINGERPRINT: &'static str = "throttle";

    pub fn new(key: impl Into<String>, per: Duration) -> Self {
        Throttle {
            key: key.into(),
            per,
        }
    }

    /// The key of the throttle's record among the queue's idempotency keys: the separator is a
    /// control character, which idempotency keys may not contain, so the two never meet.
    fn record_key(&self) -> String {
        format!("\u{1f}throttle\u{1f}{}", self.key)
    }

    fn validate(&self) -> Result<(), ValidationError> {
        sundial_core::task::check_key("throttle.key", &self.key, Self::MAX_KEY_BYTES)?;
        if self.per < Duration::from_millis(1) || self.per > Self::MAX_PER {
            return Err(ValidationError::OutOfRange {
                field: "throttle.per",
                reason: "must be between 1ms and 366 days".into(),
            });
        }
        Ok(())
    }
}

/// A debounce for a create ([`Sundial::create_debounced`]): the queue keeps at most one pending
/// task per `key`, due `delay` after the latest create, and never later than `max_wait` after
/// the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    pub key: String,
    pub delay: Duration,
    pub max_wait: Option<Duration>,
}

impl Debounce {
    /// Longest key accepted, in bytes.
    pub const MAX_KEY_BYTES: usize = 256;
    /// Longest delay and longest wait accepted.
    pub const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

    pub fn new(key: impl Into<String>, delay: Duration) -> Self {
        Debounce {
            key: key.into(),
            delay,
            max_wait: None,
        }
    }

    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    fn validate(&self) -> Result<(), ValidationError> {
        sundial_core::task::check_key("debounce.key", &self.key, Self::MAX_KEY_BYTES)?;
        if self.delay > Self::MAX_DELAY {
            return Err(ValidationError::OutOfRange {
                field: "debounce.delay",
                reason: "must be at most 366 days".into(),
            });
        }
        if let Some(w) = self.max_wait
            && (w < self.delay || w > Self::MAX_DELAY)
        {
            return Err(ValidationError::OutOfRange {
                field: "debounce.max_wait",
                reason: "must be at least debounce.delay and at most 366 days".into(),
            });
        }
        Ok(())
    }
}

/// What [`Sundial::create_debounced`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Debounced {
    pub task: Task,
    /// A pending task of the key took this create's payload and due time: `task` is that task,
    /// and nothing new was stored.
    pub replaced: bool,
}

/// What [`Sundial::create_idempotent`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    pub task: Task,
    /// The key was remembered for this very request: `task` is the one the first call created,
    /// and nothing was stored now.
    pub repeat: bool,
}

/// A spec without a trace context of its own takes the current span's, when that span belongs to
/// an OpenTelemetry trace: a task created inside a traced request or job continues its trace.
/// `current` caches the lookup across a batch.
fn with_current_trace(spec: TaskSpec, current: &mut Option<Option<TraceContext>>) -> TaskSpec {
    if spec.trace.is_some() {
        return spec;
    }
    let trace = current
        .get_or_insert_with(|| trace::span_trace(&tracing::Span::current()))
        .clone();
    spec.trace(trace)
}

/// A digest of everything a create asks for (not the idempotency key and version): equal for a
/// retry of the same request, different for any other. FNV-1a (128 bits) over a canonical JSON
/// form (object keys sorted): stable across builds, as it is stored.
fn spec_fingerprint(spec: &TaskSpec) -> String {
    let due = match spec.due {
        Due::Now => serde_json::json!("now"),
        Due::At(t) => serde_json::json!({"at": t.0}),
        Due::After(d) => serde_json::json!({"after_ms": d.as_millis() as u64}),
    };
    let mut canonical = serde_json::json!({
        "queue": spec.queue,
        "kind": spec.kind,
        "key": spec.key,
        "payload": spec.payload,
        "due": due,
        "max_attempts": spec.max_attempts,
        "backoff": serde_json::to_value(&spec.backoff).unwrap_or_default(),
        "timeout_ms": spec.timeout.as_millis() as u64,
        "exclusive": serde_json::to_value(&spec.exclusive).unwrap_or_default(),
        "tags": serde_json::to_value(&spec.tags).unwrap_or_default(),
        "target": serde_json::to_value(&spec.target).unwrap_or_default(),
    });
    // Added only when it is not the default, so fingerprints stored before priorities existed
    // still match their retries.
    if spec.priority != sundial_core::Priority::DEFAULT {
        canonical["priority"] = serde_json::json!(spec.priority.get());
    }
    if let Some(rate) = &spec.rate {
        canonical["rate"] = serde_json::to_value(rate).unwrap_or_default();
    }
    let canonical = canonical.to_string();
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for b in canonical.as_bytes() {
        h ^= u128::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("fnv128:{h:032x}")
}
