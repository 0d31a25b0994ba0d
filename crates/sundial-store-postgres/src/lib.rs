//! # sundial-store-postgres
//!
//! Sundial's store on PostgreSQL, for several nodes that share one database. It implements
//! [`sundial_store::Store`], [`sundial_store::ScheduleStore`] and
//! [`sundial_store::WorkflowStore`] with the same semantics as the
//! embedded SQLite store and passes the same conformance suites, and
//! [`sundial_store::Cluster`]: membership, shard leases with fencing, fenced owner writes and
//! wake-ups between nodes.
//!
//! ## Schema
//!
//! Everything lives in one PostgreSQL schema (default `sundial`, see
//! [`PostgresOptions::schema`]); every statement names it explicitly rather than relying on a
//! connection's `search_path`, so no pooled connection carries state that could be lost or wrong.
//! Migrations are numbered and recorded in `<schema>.schema_migrations (version, name)`; they run
//! at [`PostgresStore::connect`] in one transaction under a transaction-scoped advisory lock, so
//! nodes starting together queue on the lock and migrate once, and a schema newer than this build
//! is refused ([`PostgresError::TooNew`]) without being touched.
//!
//! - **`tasks`**: one row per task. `id` and `execution_id` are `uuid`; every time is a `bigint`
//!   of milliseconds since the epoch, exactly as handed in (SQL never calls `now()`: the engine's
//!   clock is the only clock). `state` is `text` with a `CHECK` on the six states. `payload`,
//!   `result` and `backoff` are JSON kept as `text`: what the trait is given is stored byte for
//!   byte and read back with `serde_json`, as in SQLite. (`jsonb` would re-render numbers and
//!   reorder keys, and refuses a `\u0000` escape that is valid JSON; the store never looks inside
//!   a payload, so it gains nothing from parsing one.) `CHECK`s also keep an exclusive key paired
//!   with its mode and a running task with an execution id and a lease.
//! - **`tasks_due (shard, due_at, id) WHERE state = 'scheduled'`**: the persisted timers. Only
//!   scheduled rows are in it, so a scan from the front of a shard reads due work, not history;
//!   `scan_due`/`next_due` page through it with a row comparison `(due_at, id) > (…)`.
//! - **`tasks_live_key (queue, key)`**, `UNIQUE` over live states (`scheduled`, `ready`,
//!   `running`): business-key uniqueness enforced by the database, atomically with the insert.
//!   `insert` names it as the arbiter of `ON CONFLICT … DO NOTHING`, so a taken key skips only
//!   that task (the holder is then looked up in the same transaction) while a reused *id* still
//!   fails the whole batch.
//! - **`tasks_ready (queue, rank, id) WHERE state = 'ready'`** (rank: `schema::RANK_SQL`, the
//!   due time moved by the priority, migration 16): the worker queue `claim_ready` walks in rank
//!   order with `FOR UPDATE SKIP LOCKED`.
//! - **`tasks_lease (lease_expires_at) WHERE state = 'running'`**: the reaper's view.
//! - **`tasks_shard_lease (shard, lease_expires_at) WHERE state = 'running'`** (migration 2): a
//!   shard owner's reaper view (`expire_leases` and `next_lease_expiry` of one shard).
//! - **`tasks_running_exclusive (exclusive_key) WHERE state = 'running' AND exclusive_key IS NOT
//!   NULL`**: the "how many running tasks hold this exclusive key?" probe (a task starts only
//!   while fewer than its `exclusive_limit` do: 1 for an exclusive key, N for a group limit).
//! - **`tasks_queue_id (queue, id)`**: listing a queue newest first.
//! - **`task_counts (queue, state, stripe, n)`**: per-(queue, state) counters kept by
//!   statement-level triggers (with transition tables: one upsert per statement, not per row),
//!   so `count_by_state` never scans `tasks`. A single counter row per (queue, state) would be
//!   written by every transaction and serialise them all on its row lock until commit; so each
//!   backend adds to its own stripe (`pg_backend_pid()`), and no two transactions ever wait for
//!   each other on a counter. `count_by_state` sums the stripes, after folding the stripes of
//!   backends that no longer exist into stripe 0 (with `SKIP LOCKED`, so it waits for nobody).
//!
//! All state changes are single conditional `UPDATE … WHERE state = … [AND execution_id = …]
//! RETURNING …` statements. Concurrent `complete` calls share one such statement (`completer.rs`:
//! `UPDATE … FROM unnest(…)`, every row with its own condition and time, the calls' audit
//! records inserted by the same statement), so a busy store pays one statement and one commit
//! for a group of completions rather than one each; concurrent worker claims likewise
//! (`claimer.rs`). Every task row carries its `shard`, so the shard-lease check of a
//! fenced write runs in the same transaction as the write it guards.
//!
//! Several nodes (migration 2, `cluster.rs`):
//!
//! - **`cluster_meta (singleton, shard_count)`**: one row, written by the first
//!   `shard_count(proposed)` (`INSERT … ON CONFLICT DO NOTHING`) and never changed; every later
//!   call, from any node, reads the stored number.
//! - **`nodes (node, heartbeat_at)`**: one row per node, upserted by each heartbeat; the live set
//!   is the nodes heard from at or after the caller's cutoff. `leave` deletes the row.
//! - **`shard_leases (shard, owner, expires_at, range_id)`**: one row per shard once it has been
//!   acquired. `acquire_shard` is one upsert whose `ON CONFLICT … DO UPDATE … WHERE` takes the
//!   row when it has no owner, the owner is the caller (renewal), or `expires_at < now`;
//!   PostgreSQL evaluates that condition on the newest row version under the row lock, so of
//!   concurrent acquirers exactly one wins. `range_id`, the fencing number, stays on renewal and
//!   increases whenever the owner changes. `release_shard` (owner and `range_id` must match)
//!   clears the owner and increases `range_id` at once, so a released fence is dead even before
//!   anyone takes the shard, and whoever takes it next, its previous owner included, gets a
//!   higher number.
//!
//! Schedules (migration 3, `schedules.rs`): **`schedules`** (the definition as JSON text, pause
//! state and note, the armed tick and its nominal time, the last task and fire, counters per
//! outcome) and **`schedule_fires (schedule_id, nominal_at)`** primary key, ids `COLLATE "C"` so
//! they list in byte order as in SQLite. Each write is one transaction that first locks the
//! schedule's row, so the writes of one schedule are serialised and of several fires of one armed
//! tick exactly one commits; the fire's task and the next tick are inserted in the same
//! transaction.
//!
//! Workflows (migration 4, `workflows.rs`): **`workflow_runs`** (one row per run: status,
//! result, history length, the pending workflow task, parent and continue-as-new links),
//! **`workflows (workflow_id → run_id)`** (each workflow id's current run; ids `COLLATE "C"`, so
//! they list in byte order), **`workflow_history (run_id, seq)`** (the append-only event log, JSON
//! text) and **`workflow_markers (run_id, marker)`** (marked appends happen at most once). Each
//! write is one transaction that first locks the run's row (or, to start a run, its workflow
//! id's row), checks its conditions on it and writes events, tasks, cancellations, the next run
//! and the parent's events together. Closing a run cancels the live tasks keyed under
//! `wf:<run id>/` through **`tasks_workflow_key (key text_pattern_ops)`** (migration 5, partial:
//! live keyed tasks of the two workflow queues), a byte-order range that no collation changes.
//!
//! ## Concurrency
//!
//! Transactions run at `READ COMMITTED`. Claims lock rows before deciding, so no two callers can
//! take one task; they never wait in a way that can form a cycle:
//!
//! - **`claim_due`** first takes a transaction-scoped advisory lock on every exclusive key of its
//!   `Run` claims, in sorted lock order, then locks the claimable rows (`scheduled`, due) in id
//!   order with `FOR UPDATE`, counts the running tasks of each of their exclusive keys (a fresh
//!   snapshot, taken after the locks), decides every claim in the order given (so with a limit of
//!   one the first of two tasks with one key starts and the second is `Busy`; with a limit of N
//!   the key's running count plus this call's starts never passes N), and applies the decisions
//!   with conditional set-based updates. A call of starts only first starts, in one statement
//!   (`start_plain`), the tasks without a key, a rate limit or a limited queue, locking their
//!   rows in id order; the rest then go the way just described.
//! - **`claim_ready`** pages through `tasks_ready` in rank order with `FOR UPDATE SKIP LOCKED`,
//!   never waiting for a row; for exclusive keys it uses `pg_try_advisory_xact_lock`, so it never
//!   waits for a key either: a key another transaction is claiming right now is busy for this
//!   call. At most one task per exclusive key starts per call.
//! - Two transactions starting tasks with the same exclusive key therefore hold the same advisory
//!   lock in turn, and the later one sees the earlier one's running task (its statement snapshot
//!   is taken after the lock, which is released only once the earlier commit is visible).
//! - `insert` writes its rows in `(queue, key)` order, so two batches waiting for each other's
//!   keys cannot deadlock; `expire_leases` locks in id order with `SKIP LOCKED`; the counter
//!   triggers only touch the writing backend's own stripe.
//!
//! ## Fencing
//!
//! A shard owner's writes (`claim_due`, `expire_leases` with a fence) are one transaction:
//!
//! ```text
//! BEGIN
//! SELECT range_id FROM <schema>.shard_leases WHERE shard = $1 FOR SHARE
//!   -- not the fence's range_id (or no row): ROLLBACK, StoreError::LeaseLost, nothing written
//! … the same statements as claim_due / expire_leases, limited to tasks of that shard …
//! COMMIT
//! ```
//!
//! The share lock is held to the end. A takeover (or release) updates the lease row, so it
//! either waits until this transaction has committed, or commits first, in which case the
//! `FOR SHARE` read (at `READ COMMITTED` it reads the newest committed version of a row it
//! locks) sees the new `range_id` and the write is refused. Either way no write carrying an old
//! fence commits after the new owner got its number. Fenced writes of one shard take share locks
//! only, so they never wait for each other on the lease row; an acquirer waiting for them holds
//! nothing else, so it cannot close a cycle. A fenced claim of a task in another shard is
//! `NotClaimable`: a fence covers its own shard only.
//!
//! ## Wake-ups
//!
//! `publish` sends `pg_notify` on one channel per schema, `sundial_<schema>` (shortened with a
//! hash past PostgreSQL's 63-byte identifier limit), from a pooled connection and outside any
//! task write (a notifying commit takes a database-wide lock). Each payload holds several
//! wake-ups, one JSON array per line, and stays under 7,900 bytes (PostgreSQL's limit is 8,000);
//! larger batches are split. `subscribe` opens a dedicated connection, outside the pool, that
//! LISTENs; a task forwards parsed wake-ups into the returned stream (dropping them, with a
//! warning, if the consumer falls 8,192 behind), pings the connection every 15 s and reconnects
//! with backoff (100 ms doubling to 5 s) when it is lost. Wake-ups are best effort: a gap costs
//! latency, the shard loops' idle backstop rescans. A subscriber also receives the wake-ups its
//! own store published (harmless duplicates).
//!
//! This crate is the only one in the workspace that depends on tokio-postgres. It never reads a
//! clock: every time it writes was handed to it. The one statement that reads the database's
//! clock is `Cluster::database_time` (`clock_timestamp()`), which only reports it for the
//! engine's skew check and decides nothing.

mod access;
mod claimer;
mod cluster;
mod completer;
mod inserter;
mod lanes;
mod ops;
mod push;
mod readier;
mod rows;
mod schedules;
mod schema;
mod sql;
pub mod statistics;
#[cfg(feature = "testkit")]
pub mod testkit;
mod workflows;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, PoolError, Runtime};
use sundial_core::{ExclusiveMode, ExecutionId, NewTask, Priority, Task, TaskId, Timestamp};
use sundial_store::audit_scope::{self, PendingAudit};
use sundial_store::{
    AttemptHistory, ClaimOutcome, ClaimTarget, DeadGroup, DeadGroupFilter, DebounceOutcome,
    DebouncedCreate, DueClaim, DueEntry, DueKey, Fence, IdempotencyDecision, IdempotentCreate,
    IdempotentOutcome, Inserted, LIST_VISIT_BUDGET, QueueConfig, QueueSettings, ReadyClaim,
    ReadyTaken, RetentionRules, Retry, SelectPage, StateCount, Store, StoreError, TaskFilter,
    TaskPage, TransitionError, debounced_due, idempotency_decision, idempotency_remembered,
    page_cursor,
};
use thiserror::Error;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use rows::{col, task_from_row, tasks_from_rows};
use schema::{EXCLUSIVE_LOCK_CLASS, SchemaName};
use sql::Sql;

pub use schema::CURRENT_VERSION as SCHEMA_VERSION;

/// Errors from connecting (operations report [`StoreError`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PostgresError {
    #[error("invalid database url: {0}")]
    Url(String),
    #[error("invalid schema name {name:?}: {reason}")]
    SchemaName { name: String, reason: &'static str },
    #[error("cannot set up the connection pool: {0}")]
    Pool(String),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error(
        "database schema version {found} is newer than this build supports ({supported}); upgrade Sundial"
    )]
    TooNew { found: i64, supported: i64 },
}

impl From<PoolError> for PostgresError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => PostgresError::Postgres(e),
            other => PostgresError::Pool(other.to_string()),
        }
    }
}

impl From<PostgresError> for StoreError {
    fn from(e: PostgresError) -> Self {
        match e {
            PostgresError::Postgres(e) => pg(e),
            other => StoreError::backend(other),
        }
    }
}

/// Whether `e` says the database cannot be reached for now rather than that the statement
/// failed: the connection broke or could not be made (I/O, closed), or the server is shutting
/// down, starting up or out of connections (SQLSTATE class 08, 57P01–57P03, 53300).
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300")
        }
        // No SQLSTATE: a client-side failure. I/O below it means the connection.
        None => {
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                if s.is::<std::io::Error>() {
                    return true;
                }
                source = s.source();
            }
            false
        }
    }
}

fn pg(e: tokio_postgres::Error) -> StoreError {
    if is_unavailable(&e) {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
    }
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Closed => StoreError::Closed,
        PoolError::Backend(e) => pg(e),
        PoolError::Timeout(_) => StoreError::unavailable(sundial_store::Reason(
            "no database connection could be had in time",
        )),
        other => StoreError::backend(PostgresError::Pool(other.to_string())),
    }
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// The PostgreSQL schema that holds Sundial's tables; created if missing. Lower-case letters,
    /// digits and `_`.
    pub schema: String,
    /// Most connections kept open.
    pub pool_size: usize,
    /// Longest wait for a free connection (and for a new one to be established). Past it the
    /// call fails with `StoreError::Unavailable` (HTTP 503), so that while the database is down
    /// or overloaded callers get an answer instead of waiting.
    pub acquire_timeout: Duration,
    /// How long one of this store's sessions may sit idle inside an open transaction before
    /// PostgreSQL ends it (`idle_in_transaction_session_timeout`), rolling the transaction back
    /// and releasing its locks. The store's transactions never wait for anything of the caller's
    /// between statements, so only a stalled process gets there: one stopped (SIGSTOP, a VM
    /// pause) inside a fenced write would otherwise keep the share lock on its shard's lease row
    /// and block every takeover of that shard, and the acquiring node's whole membership round,
    /// for as long as the stop lasts. Keep it below the shard-lease TTL, so that the lock is gone
    /// before the lease ends (`sundial server` uses half the TTL). `None` keeps the server's
    /// setting.
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Attempts kept per task (the latest); older ones are dropped as new ones start, while the
    /// total keeps counting. Written at connect, so the last node to start sets it for all.
    pub attempts_kept: u32,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            schema: "sundial".to_string(),
            pool_size: 16,
            acquire_timeout: Duration::from_secs(2),
            idle_in_transaction_timeout: Some(Duration::from_secs(5)),
            attempts_kept: 100,
        }
    }
}

/// The PostgreSQL store. Cheap to clone; clones share one connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    schema: SchemaName,
    sql: std::sync::Arc<Sql>,
    ops: std::sync::Arc<ops::OpsSql>,
    /// How to open a connection outside the pool (the LISTEN connection of `subscribe`).
    config: tokio_postgres::Config,
    /// The LISTEN/NOTIFY channel of this schema.
    channel: String,
    /// Completions waiting to share a statement (see `completer.rs`).
    completer: completer::SharedCompleter,
    /// Worker claims waiting to share a transaction (see `claimer.rs`).
    claimer: claimer::SharedClaimer,
    /// Inserts waiting to share a transaction (see `inserter.rs`).
    inserter: inserter::SharedInserter,
    /// `claim_due` calls that only ready tasks, waiting to share a transaction (`readier.rs`).
    readier: readier::SharedReadier,
    /// When the store next looks at `tasks`'s planner statistics (`statistics.rs`).
    statistics: std::sync::Arc<statistics::StatisticsUpkeep>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.schema.name)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (a `postgres://` URL or a `key=value` string), creates
    /// the schema if it is missing and migrates it. TLS is not supported yet.
    pub async fn connect(url: &str, opts: PostgresOptions) -> Result<Self, PostgresError> {
        let schema = SchemaName::parse(&opts.schema)?;
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| {
                // The parser's message never contains the password.
                PostgresError::Url(e.to_string())
            })?;
        if config.get_application_name().is_none() {
            config.application_name("sundial");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(opts.acquire_timeout);
        }
        // Appended to any `options` the URL gives; the later setting of one name wins.
        let mut options = config
            .get_options()
            .map(str::trim)
            .unwrap_or_default()
            .to_string();
        if let Some(idle) = opts.idle_in_transaction_timeout {
            let ms = idle.as_millis().max(1);
            options.push_str(&format!(" -c idle_in_transaction_session_timeout={ms}"));
        }
        // Each prepared statement is planned once per connection, not at every execution: the
        // store's own statements have one good plan whatever their parameters, and PostgreSQL's
        // default (a fresh plan per call while it judges the generic one costlier) spent a third
        // of the database's CPU per delivered task on planning (BENCHMARKS.md, "Planned once").
        // The operator's filtered reads, whose best plan does depend on which filters are set,
        // are planned per call (`query_planned_per_call`). A URL that sets `plan_cache_mode`
        // itself keeps its setting.
        if !options.contains("plan_cache_mode") {
            options.push_str(" -c plan_cache_mode=force_generic_plan");
        }
        let options = options.trim();
        if !options.is_empty() {
            config.options(options);
        }
        let manager = Manager::from_config(config.clone(), NoTls, ManagerConfig::default());
        let pool = Pool::builder(manager)
            .max_size(opts.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(opts.acquire_timeout))
            .create_timeout(Some(opts.acquire_timeout))
            .build()
            .map_err(|e| PostgresError::Pool(e.to_string()))?;
        let mut client = pool.get().await?;
        schema::migrate(&mut client, &schema).await?;
        let store = PostgresStore {
            sql: std::sync::Arc::new(Sql::new(&schema)),
            ops: std::sync::Arc::new(ops::OpsSql::new(&schema.ident)),
            pool,
            channel: schema.channel(),
            schema,
            config,
            completer: Default::default(),
            claimer: Default::default(),
            inserter: Default::default(),
            readier: Default::default(),
            statistics: Default::default(),
        };
        // Counter stripes of backends that are gone (earlier runs) fold into one.
        client.execute(&store.sql.fold_counts, &[]).await?;
        client
            .execute(
                &store.ops.set_attempts_kept,
                &[&i64::from(opts.attempts_kept.max(1))],
            )
            .await?;
        drop(client);
        Ok(store)
    }

    /// The schema this store works in.
    pub fn schema(&self) -> &str {
        &self.schema.name
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Runs `UPDATE … RETURNING <task>` for one task and decodes the row, if any.
    async fn update_one(
        &self,
        client: &impl GenericClient,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Task>, StoreError> {
        query_opt(client, sql, params)
            .await?
            .map(|r| task_from_row(&r))
            .transpose()
    }

    async fn state_of(
        &self,
        client: &impl GenericClient,
        id: &Uuid,
    ) -> Result<Option<sundial_core::TaskState>, StoreError> {
        let row = query_opt(client, &self.sql.state_of, &[id]).await?;
        match row {
            None => Ok(None),
            Some(r) => {
                let s: String = col(&r, 0)?;
                rows::parse_state(&s).map(Some)
            }
        }
    }

    /// Why a conditional update on an attempt touched nothing.
    async fn attempt_refusal(&self, client: &impl GenericClient, id: &Uuid) -> TransitionError {
        match self.state_of(client, id).await {
            Ok(None) => TransitionError::NotFound,
            Ok(Some(state)) => TransitionError::StaleExecution { state },
            Err(e) => e.into(),
        }
    }

    /// Why a conditional update on a task's state touched nothing.
    async fn state_refusal(&self, client: &impl GenericClient, id: &Uuid) -> TransitionError {
        match self.state_of(client, id).await {
            Ok(None) => TransitionError::NotFound,
            Ok(Some(state)) => TransitionError::WrongState { state },
            Err(e) => e.into(),
        }
    }

    /// Runs an attempt write (heartbeat, complete, fail): the updated row, or why it was refused.
    async fn attempt_write(
        &self,
        sql: &str,
        id: TaskId,
        params: &[&(dyn ToSql + Sync)],
        audit: Option<PendingAudit>,
    ) -> Result<Task, TransitionError> {
        self.audited_update(sql, id, params, audit, Refusal::Attempt)
            .await
    }

    /// One conditional `UPDATE … RETURNING <task>`: the row, or why it was refused. With a
    /// request's audit record (see [`sundial_store::audit_scope`]), the update and the record
    /// commit in one transaction; without one the update commits on its own.
    async fn audited_update(
        &self,
        sql: &str,
        id: TaskId,
        params: &[&(dyn ToSql + Sync)],
        audit: Option<PendingAudit>,
        refusal: Refusal,
    ) -> Result<Task, TransitionError> {
        let mut client = self.client().await?;
        let Some(audit) = audit else {
            return match self.update_one(&client, sql, params).await? {
                Some(t) => Ok(t),
                None => Err(self.refusal(&client, &id.0, refusal).await),
            };
        };
        let tx = client.transaction().await.map_err(pg)?;
        match self.update_one(&tx, sql, params).await? {
            Some(t) => {
                let seq = self.insert_audit_in(&tx, audit.record()).await?;
                tx.commit().await.map_err(pg)?;
                audit.written(seq);
                Ok(t)
            }
            // Dropping the transaction rolls it back: nothing changed, the record stays pending.
            None => Err(self.refusal(&tx, &id.0, refusal).await),
        }
    }

    async fn refusal(
        &self,
        client: &impl GenericClient,
        id: &Uuid,
        refusal: Refusal,
    ) -> TransitionError {
        match refusal {
            Refusal::Attempt => self.attempt_refusal(client, id).await,
            Refusal::State => self.state_refusal(client, id).await,
        }
    }

    /// The claim of a group of polls (`claimer.rs`) in `tx`, which the caller commits: up to
    /// one task per execution id, each started under its execution id for its worker.
    pub(crate) async fn claim_ready_in(
        &self,
        tx: &impl GenericClient,
        claim: &claimer::ReadyGroup,
    ) -> Result<ReadyTaken, StoreError> {
        let want = claim.execution_ids.len();
        if want == 0 {
            return Ok(ReadyTaken::default());
        }
        // A limited queue: take its lock (so starts of it everywhere are serialised), then start
        // no more than its free places.
        let lock = schema::exclusive_lock_key(&self.schema, &claim.queue);
        let limit = query(
            tx,
            &self.sql.lock_queue_limit,
            &[&claim.queue, &schema::QUEUE_LOCK_CLASS, &lock],
        )
        .await?
        .first()
        .map(|r| col::<i32>(r, 0))
        .transpose()?;
        let want = match limit {
            Some(limit) => {
                let running: i64 =
                    query(tx, &self.sql.running_queues, &[&vec![claim.queue.clone()]])
                        .await?
                        .first()
                        .map(|r| col(r, 1))
                        .transpose()?
                        .unwrap_or(0);
                want.min(usize::try_from((i64::from(limit) - running).max(0)).unwrap_or(0))
            }
            None => want,
        };
        let kinds: Option<Vec<&str>> = claim
            .kinds
            .as_ref()
            .map(|k| k.iter().map(String::as_str).collect());
        // Keys this call passes over from now on: started by it (one task per key) or being
        // claimed by another transaction at this moment.
        let mut passed: Vec<String> = Vec::new();
        // Keys whose advisory lock this transaction holds.
        let mut held: HashSet<String> = HashSet::new();
        // Rate limit keys' take turns: the query leaves out keys whose turn has not come; a key
        // is then taken under its advisory lock (tried, never waited for), read again under it.
        let mut turns = TakeTurns::new(claim.now);
        // Candidates by rank (the due time moved by the priority) and id.
        let mut after: Option<(i64, Uuid)> = None;
        let mut out: Vec<Task> = Vec::with_capacity(want);
        let now = claim.now.0;
        while out.len() < want {
            let room = limit_param(want - out.len());
            let variant = usize::from(kinds.is_some()) * 2 + usize::from(after.is_some());
            let sql = &self.sql.ready_candidates[variant];
            let rows = match (&kinds, &after) {
                (None, None) => query(tx, sql, &[&claim.queue, &passed, &room, &now]).await?,
                (None, Some((r, a))) => {
                    query(tx, sql, &[&claim.queue, &passed, &room, r, a, &now]).await?
                }
                (Some(k), None) => query(tx, sql, &[&claim.queue, &passed, &room, k, &now]).await?,
                (Some(k), Some((r, a))) => {
                    query(tx, sql, &[&claim.queue, &passed, &room, k, r, a, &now]).await?
                }
            };
            let Some(last) = rows.last() else {
                break;
            };
            after = Some((col(last, 2)?, col(last, 0)?));
            let mut candidates: Vec<(Uuid, Option<String>)> = Vec::with_capacity(rows.len());
            for r in &rows {
                let id: Uuid = col(r, 0)?;
                if let Some(rate) = col::<Option<String>>(r, 3)? {
                    let rate: sundial_core::RateLimit = serde_json::from_str(&rate)
                        .map_err(|e| StoreError::corrupt_from("rate", e))?;
                    if !self
                        .take_turn_open(tx, &mut turns, id, &rate, &claim.queue)
                        .await?
                    {
                        continue;
                    }
                }
                candidates.push((id, col(r, 1)?));
            }
            // Try (never wait for) the locks of keys not yet held.
            let mut to_lock: Vec<String> = candidates
                .iter()
                .filter_map(|(_, k)| k.clone())
                .filter(|k| !held.contains(k))
                .collect();
            to_lock.sort_unstable();
            to_lock.dedup();
            if !to_lock.is_empty() {
                let locks: Vec<i32> = to_lock
                    .iter()
                    .map(|k| schema::exclusive_lock_key(&self.schema, k))
                    .collect();
                let got: HashSet<String> = query(
                    tx,
                    &self.sql.try_lock_keys,
                    &[&EXCLUSIVE_LOCK_CLASS, &to_lock, &locks],
                )
                .await?
                .iter()
                .map(|r| col(r, 0))
                .collect::<Result<_, _>>()?;
                for k in to_lock {
                    if got.contains(&k) {
                        held.insert(k);
                    } else {
                        passed.push(k);
                    }
                }
            }
            // At most one task per key; keyless tasks always.
            let mut pick: Vec<Uuid> = Vec::with_capacity(candidates.len());
            for (id, key) in candidates {
                match key {
                    None => pick.push(id),
                    Some(k) => {
                        if held.contains(&k) && !passed.contains(&k) {
                            passed.push(k);
                            pick.push(id);
                        }
                    }
                }
            }
            if pick.is_empty() {
                continue;
            }
            let rest = &claim.execution_ids[out.len()..];
            let workers = &claim.workers[out.len()..];
            let rows = query(
                tx,
                &self.sql.start_ready,
                &[&pick, &rest, &claim.now.0, &workers],
            )
            .await?;
            let mut started = tasks_from_rows(&rows)?;
            started.sort_by_key(|t| t.id);
            turns.settle(&started);
            out.extend(started);
        }
        if out.len() < want && turns.next_turn().is_none() {
            // Tasks the candidates left out for their take turn: when the first of them comes.
            let turn: Option<i64> = query(tx, &self.sql.next_take_turn, &[&claim.queue, &now])
                .await?
                .first()
                .map(|r| col(r, 0))
                .transpose()?
                .flatten();
            if let Some(turn) = turn {
                turns.pass(turn);
            }
        }
        let taken = turns.taken();
        if !taken.is_empty() {
            let (keys, nexts): (Vec<String>, Vec<i64>) = taken.into_iter().unzip();
            query(tx, &self.sql.rate_taken, &[&keys, &nexts]).await?;
        }
        // In the order they were taken (a page's update returns its rows in id order).
        out.sort_by_key(|t| (t.priority.rank(t.due_at), t.id));
        Ok(ReadyTaken::new(out, turns.next_turn()))
    }

    /// Whether the ready task `id`, under `rate`, may be taken by this claim now: its take key's
    /// lock is tried (never waited for: a key another claim holds is passed over), its turn read
    /// under the lock, and at most one task per key is picked per page.
    async fn take_turn_open(
        &self,
        tx: &impl GenericClient,
        turns: &mut TakeTurns,
        id: Uuid,
        rate: &sundial_core::RateLimit,
        queue: &str,
    ) -> Result<bool, StoreError> {
        let key = rate.take_key(queue);
        let interval = i64::try_from(rate.interval_ms()).unwrap_or(i64::MAX);
        if !turns.held.contains_key(&key) && !turns.busy.contains(&key) {
            let lock = schema::exclusive_lock_key(&self.schema, &key);
            let got = !query(
                tx,
                &self.sql.try_lock_keys,
                &[&schema::RATE_LOCK_CLASS, &vec![key.clone()], &vec![lock]],
            )
            .await?
            .is_empty();
            if got {
                let next = query(tx, &self.sql.rate_next, &[&vec![key.clone()]])
                    .await?
                    .first()
                    .map(|r| col::<i64>(r, 1))
                    .transpose()?
                    .unwrap_or(i64::MIN);
                turns.held.insert(key.clone(), next);
            } else {
                turns.busy.insert(key.clone());
            }
        }
        Ok(turns.pick(id, key, interval))
    }

    /// Takes the transaction advisory locks of `keys` in lock class `class` (exclusive keys,
    /// rate limit keys), in sorted lock order (so two callers never wait for each other
    /// crosswise).
    async fn lock_keys(
        &self,
        client: &impl GenericClient,
        class: i32,
        keys: &[String],
    ) -> Result<(), StoreError> {
        let mut locks: Vec<i32> = keys
            .iter()
            .map(|k| schema::exclusive_lock_key(&self.schema, k))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        if locks.is_empty() {
            return Ok(());
        }
        let stmt = client
            .prepare_cached(&self.sql.lock_keys)
            .await
            .map_err(pg)?;
        client.execute(&stmt, &[&class, &locks]).await.map_err(pg)?;
        Ok(())
    }

    /// [`Store::insert`] inside the caller's transaction (which it must not commit on `Err`).
    pub(crate) async fn insert_in(
        &self,
        tx: &impl GenericClient,
        tasks: &[NewTask],
    ) -> Result<Vec<Inserted>, StoreError> {
        let mut out: Vec<Option<Inserted>> = vec![None; tasks.len()];
        for _ in 0..INSERT_ROUNDS {
            let pending: Vec<usize> = (0..tasks.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<&NewTask> = pending.iter().map(|&i| &tasks[i]).collect();
            let settled = self.insert_round(tx, &batch).await?;
            for (i, s) in pending.into_iter().zip(settled) {
                out[i] = s;
            }
        }
        out.into_iter()
            .zip(tasks)
            .map(|(o, t)| o.ok_or(StoreError::KeyContended { id: t.id }))
            .collect()
    }

    /// [`Store::claim_due`] inside the caller's transaction, limited to the tasks of `shard`
    /// when given (the others are `NotClaimable`). The caller commits.
    pub(crate) async fn claim_due_in(
        &self,
        tx: &impl GenericClient,
        claims: &[DueClaim],
        now: Timestamp,
        shard: Option<u32>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }

        // 1. Serialise starts per exclusive key: lock the keys of the tasks this call may start
        //    (keys never change, so reading them unlocked is enough), in sorted order.
        let run_ids: Vec<Uuid> = claims
            .iter()
            .filter(|c| matches!(c.target, ClaimTarget::Run { .. }))
            .map(|c| c.id.0)
            .collect();
        if !run_ids.is_empty() {
            let keys: Vec<String> = query(tx, &self.sql.exclusive_keys_of, &[&run_ids])
                .await?
                .iter()
                .map(|r| col(r, 0))
                .collect::<Result<_, _>>()?;
            self.lock_keys(tx, EXCLUSIVE_LOCK_CLASS, &keys).await?;
        }

        // 2. Lock the claimable rows (scheduled and due), in id order.
        let all_ids: Vec<Uuid> = claims.iter().map(|c| c.id.0).collect();
        let mut available: HashMap<Uuid, Option<(String, ExclusiveMode, i64)>> = HashMap::new();
        let claimable = match shard {
            None => query(tx, &self.sql.lock_claimable, &[&all_ids, &now.0]).await?,
            Some(shard) => {
                let shard = i64::from(shard);
                query(
                    tx,
                    &self.sql.lock_claimable_in_shard,
                    &[&all_ids, &now.0, &shard],
                )
                .await?
            }
        };
        // The rate limit key and interval of each claimable task that has one.
        let mut rated: HashMap<Uuid, (String, i64)> = HashMap::new();
        // The queue and its concurrency limit of each claimable start in a limited queue.
        let mut queue_limited: HashMap<Uuid, (String, i64)> = HashMap::new();
        let starts: HashSet<Uuid> = run_ids.iter().copied().collect();
        for r in claimable {
            let id: Uuid = col(&r, 0)?;
            if let Some(lim) = col::<Option<i32>>(&r, 6)?
                && starts.contains(&id)
            {
                queue_limited.insert(id, (col(&r, 4)?, i64::from(lim)));
            }
            let key: Option<String> = col(&r, 1)?;
            let mode: Option<String> = col(&r, 2)?;
            let limit = i64::from(col::<i32>(&r, 3)?);
            if let Some(rate) = col::<Option<String>>(&r, 5)? {
                let queue: String = col(&r, 4)?;
                let rate: sundial_core::RateLimit =
                    serde_json::from_str(&rate).map_err(|e| StoreError::corrupt_from("rate", e))?;
                let interval = i64::try_from(rate.interval_ms()).unwrap_or(i64::MAX);
                rated.insert(id, (rate.store_key(&queue), interval));
            }
            let exclusive = match (key, mode) {
                (Some(k), Some(m)) => Some((k, rows::parse_mode(&m)?, limit)),
                (Some(_), None) => {
                    return Err(StoreError::corrupt(format!(
                        "task {id}: exclusive key without a mode"
                    )));
                }
                (None, _) => None,
            };
            available.insert(id, exclusive);
        }

        // 3. How many running tasks hold each of their exclusive keys (a snapshot taken after
        //    the locks: every earlier start of a locked key is committed and visible).
        let mut keys: Vec<String> = available
            .values()
            .flatten()
            .map(|(k, _, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut running: HashMap<String, i64> = HashMap::new();
        if !keys.is_empty() {
            for r in query(tx, &self.sql.running_keys, &[&keys]).await? {
                running.insert(col(&r, 0)?, col(&r, 1)?);
            }
        }

        // 3a. Serialise starts per limited queue (after the row locks, as for rate keys below;
        //     `claim_ready` takes a queue's lock before anything else), then count what runs.
        let mut limited_queues: Vec<String> =
            queue_limited.values().map(|(q, _)| q.clone()).collect();
        limited_queues.sort_unstable();
        limited_queues.dedup();
        let mut running_in_queue: HashMap<String, i64> = HashMap::new();
        if !limited_queues.is_empty() {
            self.lock_keys(tx, schema::QUEUE_LOCK_CLASS, &limited_queues)
                .await?;
            for r in query(tx, &self.sql.running_queues, &[&limited_queues]).await? {
                running_in_queue.insert(col(&r, 0)?, col(&r, 1)?);
            }
        }

        // 3b. Serialise starts per rate limit key (after the row locks: a holder of a rate
        //     lock waits for nothing but its commit, so no cycle forms), then read when each key
        //     may start next.
        let mut rate_keys: Vec<String> = rated.values().map(|(k, _)| k.clone()).collect();
        rate_keys.sort_unstable();
        rate_keys.dedup();
        let mut rate_next: HashMap<String, i64> = HashMap::new();
        if !rate_keys.is_empty() {
            self.lock_keys(tx, schema::RATE_LOCK_CLASS, &rate_keys)
                .await?;
            for r in query(tx, &self.sql.rate_next, &[&rate_keys]).await? {
                rate_next.insert(col(&r, 0)?, col(&r, 1)?);
            }
        }
        let mut rate_taken: HashMap<String, i64> = HashMap::new();

        // 4. Decide each claim in the order given, as if they ran one after another.
        let plans: Vec<Plan> = claims
            .iter()
            .map(|c| {
                let Some(exclusive) = available.get(&c.id.0) else {
                    return Plan::NotClaimable;
                };
                let limited = queue_limited.get(&c.id.0);
                if let Some((queue, limit)) = limited
                    && running_in_queue.get(queue).copied().unwrap_or(0) >= *limit
                {
                    return Plan::QueueFull(queue.clone());
                }
                if let Some((key, mode, limit)) = exclusive
                    && running.get(key).copied().unwrap_or(0) >= *limit
                {
                    return match mode {
                        ExclusiveMode::Wait => Plan::Busy(key.clone()),
                        ExclusiveMode::Skip => {
                            let key = key.clone();
                            available.remove(&c.id.0);
                            Plan::Skip(key)
                        }
                    };
                }
                if let Some((key, interval)) = rated.get(&c.id.0) {
                    let next = rate_next.get(key).copied().unwrap_or(i64::MIN);
                    if next > now.0 {
                        return Plan::RateLimited(key.clone(), Timestamp(next), *interval);
                    }
                    let after = now.0.saturating_add(*interval);
                    rate_next.insert(key.clone(), after);
                    rate_taken.insert(key.clone(), after);
                }
                let plan = match &c.target {
                    ClaimTarget::Run {
                        execution,
                        lease_until,
                        worker,
                    } => {
                        if let Some((key, _, _)) = exclusive {
                            *running.entry(key.clone()).or_insert(0) += 1;
                        }
                        if let Some((queue, _)) = limited {
                            *running_in_queue.entry(queue.clone()).or_insert(0) += 1;
                        }
                        Plan::Start {
                            execution: *execution,
                            lease_until: *lease_until,
                            worker: worker.clone(),
                        }
                    }
                    ClaimTarget::Ready => Plan::Ready,
                };
                available.remove(&c.id.0);
                plan
            })
            .collect();

        // 5. Apply, each a conditional update: readies (they hold no key), starts, skips.
        let mut ready_ids = Vec::new();
        let (mut start_ids, mut start_execs, mut start_leases, mut start_workers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut skip_ids, mut skip_reasons) = (Vec::new(), Vec::new());
        for (c, plan) in claims.iter().zip(&plans) {
            match plan {
                Plan::Ready => ready_ids.push(c.id.0),
                Plan::Start {
                    execution,
                    lease_until,
                    worker,
                } => {
                    start_ids.push(c.id.0);
                    start_execs.push(execution.0);
                    start_leases.push(lease_until.0);
                    start_workers.push(worker.as_deref());
                }
                Plan::Skip(key) => {
                    skip_ids.push(c.id.0);
                    skip_reasons.push(format!(
                        "skipped: exclusive key {key:?} was held by a running task"
                    ));
                }
                Plan::NotClaimable | Plan::Busy(_) | Plan::QueueFull(_) | Plan::RateLimited(..) => {
                }
            }
        }
        if !rate_taken.is_empty() {
            let (keys, nexts): (Vec<String>, Vec<i64>) = rate_taken.into_iter().unzip();
            query(tx, &self.sql.rate_taken, &[&keys, &nexts]).await?;
        }
        let mut changed: HashMap<Uuid, Task> = HashMap::new();
        if !ready_ids.is_empty() {
            for r in query(tx, &self.sql.ready_claimed, &[&ready_ids, &now.0]).await? {
                let t = task_from_row(&r)?;
                changed.insert(t.id.0, t);
            }
        }
        if !start_ids.is_empty() {
            for r in query(
                tx,
                &self.sql.start_claimed,
                &[
                    &start_ids,
                    &start_execs,
                    &start_leases,
                    &now.0,
                    &start_workers,
                ],
            )
            .await?
            {
                let t = task_from_row(&r)?;
                changed.insert(t.id.0, t);
            }
        }
        if !skip_ids.is_empty() {
            for r in query(
                tx,
                &self.sql.skip_claimed,
                &[&skip_ids, &skip_reasons, &now.0],
            )
            .await?
            {
                let t = task_from_row(&r)?;
                changed.insert(t.id.0, t);
            }
        }
        Ok(claims
            .iter()
            .zip(plans)
            .map(|(c, plan)| match plan {
                Plan::NotClaimable => ClaimOutcome::NotClaimable,
                Plan::Busy(exclusive_key) => ClaimOutcome::Busy { exclusive_key },
                Plan::QueueFull(queue) => ClaimOutcome::QueueFull { queue },
                Plan::RateLimited(key, until, interval) => ClaimOutcome::RateLimited {
                    key,
                    until,
                    interval_ms: u64::try_from(interval).unwrap_or(1),
                },
                Plan::Start { execution, .. } => match changed.remove(&c.id.0) {
                    Some(t) if t.execution_id == Some(execution) => {
                        ClaimOutcome::Started(Box::new(t))
                    }
                    _ => ClaimOutcome::NotClaimable,
                },
                Plan::Ready => changed
                    .remove(&c.id.0)
                    .map(|t| ClaimOutcome::Readied(Box::new(t)))
                    .unwrap_or(ClaimOutcome::NotClaimable),
                Plan::Skip(_) => changed
                    .remove(&c.id.0)
                    .map(|t| ClaimOutcome::Skipped(Box::new(t)))
                    .unwrap_or(ClaimOutcome::NotClaimable),
            })
            .collect())
    }

    /// [`Store::expire_leases`] on `client` (a transaction or not), limited to the tasks of
    /// `shard` when given.
    pub(crate) async fn expire_leases_in(
        &self,
        client: &impl GenericClient,
        now: Timestamp,
        limit: usize,
        shard: Option<u32>,
    ) -> Result<Vec<Task>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = limit_param(limit);
        let rows = match shard {
            None => query(client, &self.sql.expire_leases, &[&now.0, &limit]).await?,
            Some(shard) => {
                let shard = i64::from(shard);
                query(
                    client,
                    &self.sql.expire_leases_in_shard,
                    &[&now.0, &limit, &shard],
                )
                .await?
            }
        };
        let mut out = tasks_from_rows(&rows)?;
        out.sort_by_key(|t| t.id);
        Ok(out)
    }

    /// Inserts `tasks` (one round) and returns, per task, `Some` when it was settled (created, or
    /// a duplicate of a live holder) and `None` when its key's holder vanished before it could be
    /// named (to be tried again).
    async fn insert_round(
        &self,
        client: &impl GenericClient,
        tasks: &[&NewTask],
    ) -> Result<Vec<Option<Inserted>>, StoreError> {
        let arrays = TaskArrays::new(tasks)?;
        let rows = query(client, &self.sql.insert, &arrays.params()).await?;
        let mut made: HashMap<Uuid, Task> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let t = task_from_row(r)?;
            made.insert(t.id.0, t);
        }
        let tags = TagArrays::of(made.values().map(|t| (t.id, &t.tags)));
        if !tags.is_empty() {
            query(client, &self.sql.insert_tags, &tags.params()).await?;
        }
        // Tasks not created: their key is taken. Name the holders (committed ones, or earlier
        // tasks of this batch), seen by a fresh snapshot in the same transaction.
        let (mut hq, mut hk) = (Vec::new(), Vec::new());
        for t in tasks {
            if !made.contains_key(&t.id.0) {
                match &t.key {
                    Some(k) => {
                        hq.push(t.queue.as_str());
                        hk.push(k.as_str());
                    }
                    None => {
                        return Err(StoreError::InsertUndecided { id: t.id });
                    }
                }
            }
        }
        let mut holders: HashMap<(String, String), Uuid> = HashMap::new();
        if !hq.is_empty() {
            for r in query(client, &self.sql.holders, &[&hq, &hk]).await? {
                holders.insert((col(&r, 0)?, col(&r, 1)?), col(&r, 2)?);
            }
        }
        Ok(tasks
            .iter()
            .map(|t| match made.remove(&t.id.0) {
                Some(task) => Some(Inserted::Created(Box::new(task))),
                None => t.key.as_ref().and_then(|k| {
                    holders
                        .get(&(t.queue.clone(), k.clone()))
                        .map(|h| Inserted::Duplicate {
                            existing: TaskId(*h),
                        })
                }),
            })
            .collect())
    }
}

/// The columns of tasks to insert, one array each, for [`Sql::insert`]'s `unnest`.
pub(crate) struct TaskArrays<'a> {
    ids: Vec<Uuid>,
    shards: Vec<i64>,
    queues: Vec<&'a str>,
    kinds: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    payloads: Vec<&'a str>,
    dues: Vec<i64>,
    max_attempts: Vec<i64>,
    backoffs: Vec<String>,
    timeouts: Vec<i64>,
    ex_keys: Vec<Option<&'a str>>,
    ex_modes: Vec<Option<&'static str>>,
    created: Vec<i64>,
    ords: Vec<i64>,
    tags: Vec<Option<String>>,
    targets: Vec<Option<String>>,
    traceparents: Vec<Option<&'a str>>,
    tracestates: Vec<Option<&'a str>>,
    priorities: Vec<i16>,
    group_limits: Vec<i32>,
    rates: Vec<Option<String>>,
}

impl<'a> TaskArrays<'a> {
    pub(crate) fn new(tasks: &[&'a NewTask]) -> Result<Self, StoreError> {
        let n = tasks.len();
        let mut a = TaskArrays {
            ids: Vec::with_capacity(n),
            shards: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            dues: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            backoffs: Vec::with_capacity(n),
            timeouts: Vec::with_capacity(n),
            ex_keys: Vec::with_capacity(n),
            ex_modes: Vec::with_capacity(n),
            created: Vec::with_capacity(n),
            ords: Vec::with_capacity(n),
            tags: Vec::with_capacity(n),
            targets: Vec::with_capacity(n),
            traceparents: Vec::with_capacity(n),
            tracestates: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            group_limits: Vec::with_capacity(n),
            rates: Vec::with_capacity(n),
        };
        for (i, t) in tasks.iter().enumerate() {
            a.rates.push(
                t.rate
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::encode("rate", e))?,
            );
            a.priorities.push(i16::from(t.priority.get()));
            a.group_limits.push(
                t.exclusive
                    .as_ref()
                    .map_or(1, |e| i32::try_from(e.limit).unwrap_or(i32::MAX)),
            );
            a.traceparents
                .push(t.trace.as_ref().map(|c| c.traceparent()));
            a.tracestates
                .push(t.trace.as_ref().and_then(|c| c.tracestate()));
            a.tags.push(if t.tags.is_empty() {
                None
            } else {
                Some(serde_json::to_string(&t.tags).map_err(|e| StoreError::encode("tags", e))?)
            });
            a.ids.push(t.id.0);
            a.shards.push(i64::from(t.shard));
            a.queues.push(t.queue.as_str());
            a.kinds.push(t.kind.as_str());
            a.keys.push(t.key.as_deref());
            a.payloads.push(t.payload.as_str());
            a.dues.push(t.due_at.0);
            a.max_attempts.push(i64::from(t.max_attempts));
            a.backoffs.push(
                serde_json::to_string(&t.backoff).map_err(|e| StoreError::encode("backoff", e))?,
            );
            a.timeouts.push(
                i64::try_from(t.timeout_ms).map_err(|_| StoreError::TooLarge {
                    what: "timeout in ms",
                    value: u128::from(t.timeout_ms),
                })?,
            );
            a.ex_keys.push(t.exclusive.as_ref().map(|e| e.key.as_str()));
            a.ex_modes
                .push(t.exclusive.as_ref().map(|e| rows::mode_str(e.mode)));
            a.created.push(t.created_at.0);
            a.ords.push(i as i64);
            a.targets.push(
                t.target
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::encode("target", e))?,
            );
        }
        Ok(a)
    }

    /// The 21 parameters, in [`Sql::insert`]'s order.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 21] {
        [
            &self.ids,
            &self.shards,
            &self.queues,
            &self.kinds,
            &self.keys,
            &self.payloads,
            &self.dues,
            &self.max_attempts,
            &self.backoffs,
            &self.timeouts,
            &self.ex_keys,
            &self.ex_modes,
            &self.created,
            &self.ords,
            &self.tags,
            &self.targets,
            &self.traceparents,
            &self.tracestates,
            &self.priorities,
            &self.group_limits,
            &self.rates,
        ]
    }
}

/// Tasks' tags, one row per tag, for [`Sql::insert_tags`]'s `unnest`.
pub(crate) struct TagArrays<'a> {
    keys: Vec<&'a str>,
    values: Vec<&'a str>,
    ids: Vec<Uuid>,
}

impl<'a> TagArrays<'a> {
    pub(crate) fn of(tasks: impl Iterator<Item = (TaskId, &'a sundial_core::Tags)>) -> Self {
        let mut a = TagArrays {
            keys: Vec::new(),
            values: Vec::new(),
            ids: Vec::new(),
        };
        for (id, tags) in tasks {
            for (k, v) in tags {
                a.keys.push(k);
                a.values.push(v);
                a.ids.push(id.0);
            }
        }
        a
    }

    pub(crate) fn of_tasks(tasks: &'a [NewTask]) -> Self {
        Self::of(tasks.iter().map(|t| (t.id, &t.tags)))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The three parameters, in [`Sql::insert_tags`]'s order.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 3] {
        [&self.keys, &self.values, &self.ids]
    }
}

async fn query(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let stmt = client.prepare_cached(sql).await.map_err(pg)?;
    client.query(&stmt, params).await.map_err(pg)
}

/// [`query`] with a plan made for these parameters (`plan_cache_mode = force_custom_plan`, for
/// this one transaction): for the operator's reads whose filters are optional (`$1 IS NULL OR
/// …`) or whose ranges decide the index, where the connection's plan made once would not fit
/// every call. Costs three more round trips, so the engine's statements never use it.
async fn query_planned_per_call(
    client: &mut deadpool_postgres::Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    tx.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan")
        .await
        .map_err(pg)?;
    let rows = query(&tx, sql, params).await?;
    tx.commit().await.map_err(pg)?;
    Ok(rows)
}

async fn query_one(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, StoreError> {
    let stmt = client.prepare_cached(sql).await.map_err(pg)?;
    client.query_one(&stmt, params).await.map_err(pg)
}

async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    let stmt = client.prepare_cached(sql).await.map_err(pg)?;
    client.query_opt(&stmt, params).await.map_err(pg)
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn due_entry(r: &Row) -> Result<DueEntry, StoreError> {
    let timeout: i64 = col(r, 4)?;
    Ok(DueEntry {
        key: DueKey {
            due_at: Timestamp(col(r, 0)?),
            id: TaskId(col(r, 1)?),
        },
        queue: col(r, 2)?,
        kind: col(r, 3)?,
        timeout_ms: u64::try_from(timeout)
            .map_err(|_| StoreError::corrupt(format!("timeout_ms {timeout} is negative")))?,
        push_host: col::<Option<String>>(r, 5)?.and_then(|u| sundial_core::authority(&u)),
        priority: Priority::from_stored(i64::from(col::<i16>(r, 6)?)),
    })
}

impl PostgresStore {
    /// Whether `claims` are all starts of distinct tasks (what [`Self::start_plain`] takes).
    fn starts_only(&self, claims: &[DueClaim]) -> bool {
        let mut ids = HashSet::with_capacity(claims.len());
        !claims.is_empty()
            && claims
                .iter()
                .all(|c| matches!(c.target, ClaimTarget::Run { .. }) && ids.insert(c.id))
    }

    /// Starts the claimed tasks that have neither an exclusive key nor a rate limit, in queues
    /// without a limit, in one statement (`sql.start_plain`), with `audit`'s record when one
    /// started: the tasks started by id, and the record's `seq` when it went in. The others are
    /// left as they were, for the full claim.
    async fn start_plain(
        &self,
        claims: &[DueClaim],
        now: Timestamp,
        fence: Option<Fence>,
        audit: Option<&PendingAudit>,
    ) -> Result<(HashMap<Uuid, Task>, Option<i64>), StoreError> {
        let mut runs: Vec<(Uuid, Uuid, i64, Option<&str>)> = claims
            .iter()
            .filter_map(|c| match &c.target {
                ClaimTarget::Run {
                    execution,
                    lease_until,
                    worker,
                } => Some((c.id.0, execution.0, lease_until.0, worker.as_deref())),
                ClaimTarget::Ready => None,
            })
            .collect();
        runs.sort_unstable_by_key(|r| r.0);
        let ids: Vec<Uuid> = runs.iter().map(|r| r.0).collect();
        let execs: Vec<Uuid> = runs.iter().map(|r| r.1).collect();
        let leases: Vec<i64> = runs.iter().map(|r| r.2).collect();
        let workers: Vec<Option<&str>> = runs.iter().map(|r| r.3).collect();
        let shard = fence.map(|f| i64::from(f.shard));
        let range_id = fence.map(|f| f.range_id);
        let linked: Vec<(Uuid, &sundial_store::NewAuditRecord)> = audit
            .map(|a| (Uuid::nil(), a.record()))
            .into_iter()
            .collect();
        let arrays = crate::access::AuditArrays::new(&linked);
        let mut params: Vec<&(dyn ToSql + Sync)> =
            vec![&ids, &execs, &leases, &now.0, &workers, &shard, &range_id];
        params.extend(arrays.params());
        let client = self.client().await?;
        let rows = query(&client, &self.sql.start_plain, &params).await?;
        let Some(first) = rows.first() else {
            return Err(StoreError::corrupt("the plain start returned no row"));
        };
        let n = first.len();
        let fence_held: bool = col(first, n - 2)?;
        if let (false, Some(f)) = (fence_held, fence) {
            return Err(StoreError::LeaseLost { shard: f.shard });
        }
        let seqs: Vec<i64> = col::<Option<Vec<i64>>>(first, n - 1)?.unwrap_or_default();
        let mut started = HashMap::with_capacity(rows.len());
        for r in &rows {
            if col::<Option<Uuid>>(r, 0)?.is_some() {
                let t = task_from_row(r)?;
                started.insert(t.id.0, t);
            }
        }
        Ok((started, seqs.first().copied()))
    }

    /// The outcomes of `all` in order: `Started` for what the plain start took (when its
    /// execution id is the claim's), else the full claim's outcome for `rest` (the claims it was
    /// given, in order).
    fn merge_started(
        all: &[DueClaim],
        mut started: HashMap<Uuid, Task>,
        rest_outcomes: Vec<ClaimOutcome>,
        rest: &[DueClaim],
    ) -> Vec<ClaimOutcome> {
        let mut rest_outcomes: HashMap<Uuid, ClaimOutcome> =
            rest.iter().map(|c| c.id.0).zip(rest_outcomes).collect();
        all.iter()
            .map(|c| match started.remove(&c.id.0) {
                Some(t) => match &c.target {
                    ClaimTarget::Run { execution, .. } if t.execution_id == Some(*execution) => {
                        ClaimOutcome::Started(Box::new(t))
                    }
                    _ => ClaimOutcome::NotClaimable,
                },
                None => rest_outcomes
                    .remove(&c.id.0)
                    .unwrap_or(ClaimOutcome::NotClaimable),
            })
            .collect()
    }
}

/// What `claim_due` decided for one claim, before applying it.
enum Plan {
    NotClaimable,
    Busy(String),
    /// The queue's concurrency limit is reached.
    QueueFull(String),
    /// The rate limit key, when it allows the next start, and the interval between starts.
    RateLimited(String, Timestamp, i64),
    Start {
        execution: ExecutionId,
        lease_until: Timestamp,
        worker: Option<String>,
    },
    Ready,
    Skip(String),
}

/// How many times `insert` retries a task whose key's holder finished between the conflict and
/// the lookup of its id. Each retry needs another task to finish at exactly that moment.
const INSERT_ROUNDS: usize = 8;

/// What a conditional update that touched nothing is asked about.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// An attempt write (heartbeat, complete, fail): not found, or not this execution's.
    Attempt,
    /// A state change (cancel, trigger): not found, or in the wrong state.
    State,
}

/// The rate limit take turns of one worker claim (`RateLimit::take_key`, see `claim_ready`).
struct TakeTurns {
    now: i64,
    /// Keys whose lock this claim holds, with their next take turn as read under it (and moved
    /// by this claim's takes).
    held: HashMap<String, i64>,
    /// Keys whose lock another claim holds: passed over for this claim.
    busy: HashSet<String>,
    /// The tasks of the current page picked under a key, with the key's interval.
    picked: HashMap<Uuid, (String, i64)>,
    /// Turns this claim took: each key's next turn.
    taken: HashMap<String, i64>,
    /// The earliest turn of a key this claim passed over.
    passed: Option<i64>,
}

impl TakeTurns {
    fn new(now: Timestamp) -> Self {
        Self {
            now: now.0,
            held: HashMap::new(),
            busy: HashSet::new(),
            picked: HashMap::new(),
            taken: HashMap::new(),
            passed: None,
        }
    }

    fn pass(&mut self, turn: i64) {
        self.passed = Some(self.passed.map_or(turn, |p| p.min(turn)));
    }

    /// Whether `id` may be taken under `key` now (its lock already tried); picks it if so.
    fn pick(&mut self, id: Uuid, key: String, interval: i64) -> bool {
        let soon = self.now.saturating_add(interval);
        let Some(next) = self.held.get(&key).copied() else {
            // Another claim is taking under the key this moment.
            self.pass(soon);
            return false;
        };
        if next > self.now {
            self.pass(next);
            return false;
        }
        if self.picked.values().any(|(k, _)| *k == key) {
            self.pass(soon);
            return false;
        }
        self.picked.insert(id, (key, interval));
        true
    }

    /// After a page's update: the picks that started move their key's turn one interval past
    /// their start; the others leave it open.
    fn settle(&mut self, started: &[Task]) {
        for t in started {
            if let Some((key, interval)) = self.picked.remove(&t.id.0) {
                let next = t
                    .started_at
                    .map_or(self.now, |s| s.0)
                    .saturating_add(interval);
                self.held.insert(key.clone(), next);
                self.taken.insert(key, next);
            }
        }
        self.picked.clear();
    }

    fn taken(&mut self) -> HashMap<String, i64> {
        std::mem::take(&mut self.taken)
    }

    fn next_turn(&self) -> Option<Timestamp> {
        self.passed.map(Timestamp)
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let created = tasks.iter().map(|t| t.created_at).max();
        if let Some(now) = created {
            self.keep_statistics_in_the_background(now);
        }
        self.insert_grouped(tasks).await
    }

    async fn insert_debounced(&self, c: DebouncedCreate) -> Result<DebounceOutcome, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Calls with one key queue here until the first commits; then they see its task.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 8))",
            &[&c.task.queue, &c.key],
        )
        .await
        .map_err(pg)?;
        let s = &self.schema.ident;
        // Locked: a claim that took the row first makes it no longer pending here (the
        // condition is checked again on the row it committed), and one that comes later waits
        // for the new due time.
        let pending = tx
            .query_opt(
                &format!(
                    "SELECT id, created_at FROM {s}.tasks WHERE queue = $1 AND debounce_key = $2 \
                     AND state = 'scheduled' AND attempt = 0 FOR UPDATE"
                ),
                &[&c.task.queue, &c.key],
            )
            .await
            .map_err(pg)?;
        let out = match pending {
            Some(r) => {
                let id: uuid::Uuid = col(&r, 0)?;
                let created_at = Timestamp(col(&r, 1)?);
                let due = debounced_due(c.task.due_at, created_at, c.max_wait_ms);
                tx.execute(
                    &format!(
                        "UPDATE {s}.tasks SET payload = $2, due_at = $3, updated_at = $4 \
                         WHERE id = $1"
                    ),
                    &[&id, &c.task.payload, &due.0, &c.now.0],
                )
                .await
                .map_err(pg)?;
                let task = query_opt(&tx, &self.sql.get, &[&id])
                    .await?
                    .map(|r| task_from_row(&r))
                    .transpose()?
                    .ok_or(StoreError::NoRow {
                        what: "debounced task",
                    })?;
                DebounceOutcome::Replaced(Box::new(task))
            }
            None => match self
                .insert_in(&tx, std::slice::from_ref(&c.task))
                .await?
                .pop()
            {
                Some(Inserted::Created(t)) => {
                    tx.execute(
                        &format!("UPDATE {s}.tasks SET debounce_key = $2 WHERE id = $1"),
                        &[&t.id.0, &c.key],
                    )
                    .await
                    .map_err(pg)?;
                    DebounceOutcome::Created(t)
                }
                Some(Inserted::Duplicate { existing }) => DebounceOutcome::Duplicate { existing },
                None => return Err(StoreError::NoRow { what: "insert" }),
            },
        };
        let audit = match audit {
            Some(a) if !matches!(out, DebounceOutcome::Duplicate { .. }) => {
                let seq = self.insert_audit_in(&tx, a.record()).await?;
                Some((a, seq))
            }
            _ => None,
        };
        tx.commit().await.map_err(pg)?;
        if let Some((a, seq)) = audit {
            a.written(seq);
        }
        Ok(out)
    }

    async fn insert_idempotent(
        &self,
        c: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Calls with one key queue here until the first commits; then they see its record.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 7))",
            &[&c.task.queue, &c.key],
        )
        .await
        .map_err(pg)?;
        let s = &self.schema.ident;
        let record = tx
            .query_opt(
                &format!(
                    "SELECT version, fingerprint, task_id, created_at FROM {s}.idempotency \
                     WHERE queue = $1 AND key = $2"
                ),
                &[&c.task.queue, &c.key],
            )
            .await
            .map_err(pg)?;
        let remembered = match record {
            Some(r) => {
                let v: i64 = col(&r, 0)?;
                let fp: String = col(&r, 1)?;
                let id: uuid::Uuid = col(&r, 2)?;
                let recorded_at = Timestamp(col(&r, 3)?);
                query_opt(&tx, &self.sql.get, &[&id])
                    .await?
                    .map(|r| task_from_row(&r))
                    .transpose()?
                    .filter(|t| idempotency_remembered(t, recorded_at, c.remember, c.now))
                    .map(|t| (v as u64, fp, t))
            }
            None => None,
        };
        let decision = idempotency_decision(
            remembered.as_ref().map(|(v, fp, t)| (*v, fp.as_str(), t)),
            c.version,
            &c.fingerprint,
        );
        if let IdempotencyDecision::Answer(a) = decision {
            return Ok(a);
        }
        let out = match self
            .insert_in(&tx, std::slice::from_ref(&c.task))
            .await?
            .pop()
        {
            Some(Inserted::Created(t)) => {
                tx.execute(
                    &format!(
                        "INSERT INTO {s}.idempotency \
                         (queue, key, version, fingerprint, task_id, created_at) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (queue, key) DO UPDATE SET \
                         version = EXCLUDED.version, fingerprint = EXCLUDED.fingerprint, \
                         task_id = EXCLUDED.task_id, created_at = EXCLUDED.created_at"
                    ),
                    &[
                        &c.task.queue,
                        &c.key,
                        &(c.version as i64),
                        &c.fingerprint,
                        &t.id.0,
                        &c.now.0,
                    ],
                )
                .await
                .map_err(pg)?;
                IdempotentOutcome::Created(t)
            }
            Some(Inserted::Duplicate { existing }) => IdempotentOutcome::Duplicate { existing },
            None => return Err(StoreError::NoRow { what: "insert" }),
        };
        let audit = match audit {
            Some(a) if matches!(out, IdempotentOutcome::Created(_)) => {
                let seq = self.insert_audit_in(&tx, a.record()).await?;
                Some((a, seq))
            }
            _ => None,
        };
        tx.commit().await.map_err(pg)?;
        if let Some((a, seq)) = audit {
            a.written(seq);
        }
        Ok(out)
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        let client = self.client().await?;
        query_opt(&client, &self.sql.get, &[&id.0])
            .await?
            .map(|r| task_from_row(&r))
            .transpose()
    }

    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError> {
        // One row more than asked for tells whether another page follows.
        let found = self
            .list_filtered(
                filter,
                &self.sql.columns,
                limit.saturating_add(1),
                LIST_VISIT_BUDGET,
            )
            .await?;
        let mut tasks = tasks_from_rows(&found.rows)?;
        let n = tasks.len();
        tasks.truncate(limit);
        let next_cursor = page_cursor(
            n,
            limit,
            tasks.last().map(|t| t.id),
            found.visited,
            LIST_VISIT_BUDGET,
            found.oldest,
        );
        Ok(TaskPage { tasks, next_cursor })
    }

    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let audit = audit_scope::claim_pending();
        self.audited_update(
            &self.sql.cancel,
            id,
            &[&id.0, &now.0],
            audit,
            Refusal::State,
        )
        .await
    }

    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let audit = audit_scope::claim_pending();
        self.audited_update(
            &self.sql.trigger,
            id,
            &[&id.0, &now.0],
            audit,
            Refusal::State,
        )
        .await
    }

    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError> {
        let client = self.client().await?;
        let shard = i64::from(shard);
        let limit = limit_param(limit);
        let rows = match after {
            None => {
                query(
                    &client,
                    &self.sql.scan_due_from_start,
                    &[&shard, &until.0, &limit],
                )
                .await?
            }
            Some(k) => {
                query(
                    &client,
                    &self.sql.scan_due_after,
                    &[&shard, &until.0, &k.due_at.0, &k.id.0, &limit],
                )
                .await?
            }
        };
        rows.iter().map(due_entry).collect()
    }

    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError> {
        let client = self.client().await?;
        let shard = i64::from(shard);
        let row = match after {
            None => query_opt(&client, &self.sql.next_due_from_start, &[&shard]).await?,
            Some(k) => {
                query_opt(
                    &client,
                    &self.sql.next_due_after,
                    &[&shard, &k.due_at.0, &k.id.0],
                )
                .await?
            }
        };
        row.map(|r| col::<i64>(&r, 0).map(Timestamp)).transpose()
    }

    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        // Unfenced and empty: nothing to do. Fenced and empty still checks the fence.
        if claims.is_empty() && fence.is_none() {
            return Ok(Vec::new());
        }
        self.keep_statistics_in_the_background(now);
        if !claims.is_empty()
            && claims.len() <= readier::MAX_GROUPED_CALL
            && claims.iter().all(|c| c.target == ClaimTarget::Ready)
        {
            return self.claim_due_ready_grouped(claims, now, fence).await;
        }
        // A claim made for a waiting poll runs in the poll request's audit scope: the record
        // commits with the starts.
        let mut audit = audit_scope::claim_pending();
        let mut claims = claims;
        let mut started: HashMap<Uuid, Task> = HashMap::new();
        // The call's claims, kept only when the plain start took some of them.
        let mut all: Vec<DueClaim> = Vec::new();
        if self.starts_only(&claims) {
            // Starts of plain tasks in one statement; the full claim below only for what it left.
            let (s, written) = self
                .start_plain(&claims, now, fence, audit.as_ref())
                .await?;
            started = s;
            if let (Some(seq), Some(a)) = (written, audit.take()) {
                a.written(seq);
            }
            if !started.is_empty() {
                all = std::mem::take(&mut claims);
                claims = all
                    .iter()
                    .filter(|c| !started.contains_key(&c.id.0))
                    .cloned()
                    .collect();
                if claims.is_empty() {
                    // The plain start took every claim (and checked the fence).
                    return Ok(Self::merge_started(&all, started, Vec::new(), &[]));
                }
            }
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        if let Some(f) = fence {
            self.check_fence(&tx, f).await?;
        }
        let out = self
            .claim_due_in(&tx, &claims, now, fence.map(|f| f.shard))
            .await?;
        let changed = out.iter().any(|o| {
            matches!(
                o,
                ClaimOutcome::Started(_) | ClaimOutcome::Readied(_) | ClaimOutcome::Skipped(_)
            )
        });
        let seq = match &audit {
            Some(a) if changed => Some(self.insert_audit_in(&tx, a.record()).await?),
            _ => None,
        };
        tx.commit().await.map_err(pg)?;
        if let (Some(a), Some(seq)) = (audit, seq) {
            a.written(seq);
        }
        if started.is_empty() {
            return Ok(out);
        }
        Ok(Self::merge_started(&all, started, out, &claims))
    }

    async fn claim_ready(&self, claim: ReadyClaim) -> Result<ReadyTaken, StoreError> {
        if claim.execution_ids.is_empty() || claim.kinds.as_ref().is_some_and(|k| k.is_empty()) {
            return Ok(ReadyTaken::default());
        }
        self.claim_ready_grouped(claim).await
    }

    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        let audit = audit_scope::claim_pending();
        self.attempt_write(
            &self.sql.heartbeat,
            id,
            &[&id.0, &execution.0, &now.0],
            audit,
        )
        .await
    }

    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        self.complete_grouped(id, execution, now, result).await
    }

    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry: Retry,
    ) -> Result<Task, TransitionError> {
        let audit = audit_scope::claim_pending();
        let retry_at = match retry {
            Retry::Never => None,
            // The update itself checks that attempts remain.
            Retry::At(t) => Some(t),
            // The backoff needs the attempt's row. Read without a lock: while the execution id
            // matches, the attempt count and backoff cannot change, and the update below is
            // conditional on that execution id.
            Retry::Backoff { .. } | Retry::After { .. } => {
                let client = self.client().await?;
                let current = query_opt(&client, &self.sql.running_attempt, &[&id.0, &execution.0])
                    .await?
                    .map(|r| task_from_row(&r))
                    .transpose()?;
                match current {
                    Some(t) => retry.retry_at(&t, now),
                    None => return Err(self.attempt_refusal(&client, &id.0).await),
                }
            }
        };
        self.attempt_write(
            &self.sql.fail,
            id,
            &[&id.0, &execution.0, &retry_at.map(|t| t.0), &error, &now.0],
            audit,
        )
        .await
    }

    async fn expire_leases(
        &self,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<Task>, StoreError> {
        let Some(f) = fence else {
            let client = self.client().await?;
            return self.expire_leases_in(&client, now, limit, None).await;
        };
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        self.check_fence(&tx, f).await?;
        let out = self
            .expire_leases_in(&tx, now, limit, Some(f.shard))
            .await?;
        tx.commit().await.map_err(pg)?;
        Ok(out)
    }

    async fn next_lease_expiry(&self, shard: Option<u32>) -> Result<Option<Timestamp>, StoreError> {
        let client = self.client().await?;
        let rows = match shard {
            None => query(&client, &self.sql.next_lease_expiry, &[]).await?,
            Some(shard) => {
                query(
                    &client,
                    &self.sql.next_lease_expiry_in_shard,
                    &[&i64::from(shard)],
                )
                .await?
            }
        };
        match rows.first() {
            None => Ok(None),
            Some(r) => Ok(col::<Option<i64>>(r, 0)?.map(Timestamp)),
        }
    }

    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError> {
        let client = self.client().await?;
        // Keep the counter table small: stripes of backends that are gone fold into one.
        if let Err(e) = query(&client, &self.sql.fold_counts, &[]).await {
            tracing::warn!(error = %e, "folding task counter stripes failed");
        }
        let rows = query(&client, &self.sql.count_by_state, &[]).await?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, 1)?;
                let n: i64 = col(r, 2)?;
                Ok(StateCount {
                    queue: col(r, 0)?,
                    state: rows::parse_state(&state)?,
                    count: u64::try_from(n)
                        .map_err(|_| StoreError::corrupt(format!("negative task count {n}")))?,
                })
            })
            .collect()
    }

    async fn dead_groups(
        &self,
        filter: DeadGroupFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeadGroup>, StoreError> {
        let (prefix, default_only) = filter.namespace_test();
        let mut client = self.client().await?;
        let rows = query_planned_per_call(
            &mut client,
            &self.sql.dead_groups,
            &[&filter.queue, &limit_param(limit), &prefix, &default_only],
        )
        .await?;
        rows.iter()
            .map(|r| {
                let n: i64 = col(r, 2)?;
                let newest: uuid::Uuid = col(r, 3)?;
                Ok(DeadGroup {
                    queue: col(r, 0)?,
                    error: col(r, 1)?,
                    count: u64::try_from(n)
                        .map_err(|_| StoreError::corrupt(format!("negative task count {n}")))?,
                    newest: TaskId(newest),
                })
            })
            .collect()
    }

    async fn queue_settings(&self, queue: &str) -> Result<Option<QueueSettings>, StoreError> {
        self.ops_queue_settings(queue).await
    }

    async fn list_queue_settings(&self) -> Result<Vec<QueueSettings>, StoreError> {
        self.ops_list_queue_settings().await
    }

    async fn put_queue_config(
        &self,
        queue: &str,
        config: QueueConfig,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        self.ops_put_queue_config(queue, &config, now).await
    }

    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        self.ops_set_queue_paused(queue, paused, now).await
    }

    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        self.ops_earliest_waiting(queue).await
    }

    async fn count_rate_limited(&self, queue: &str, now: Timestamp) -> Result<u64, StoreError> {
        self.ops_count_rate_limited(queue, now).await
    }

    async fn attempts(&self, id: TaskId) -> Result<Option<AttemptHistory>, StoreError> {
        self.ops_attempts(id).await
    }

    async fn record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: sundial_store::AttemptResponse,
    ) -> Result<bool, StoreError> {
        self.ops_record_attempt_response(id, execution, response)
            .await
    }

    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.ops_retry(id, due_at, now).await
    }

    async fn select(&self, filter: &TaskFilter, limit: usize) -> Result<SelectPage, StoreError> {
        self.ops_select(filter, limit).await
    }

    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        self.ops_cancel_many(ids, now).await
    }

    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        self.ops_retry_many(ids, due_at, now).await
    }

    async fn purge_tasks(
        &self,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let Some(f) = fence else {
            return self.purge_tasks_in(&client, None, rules, now, limit).await;
        };
        let tx = client.transaction().await.map_err(pg)?;
        self.check_fence(&tx, f).await?;
        let n = self
            .purge_tasks_in(&tx, Some(f.shard), rules, now, limit)
            .await?;
        tx.commit().await.map_err(pg)?;
        Ok(n)
    }
}

/// A store on `url` in `schema` with a pool of one connection, for tests that hold that
/// connection to make calls queue.
#[cfg(test)]
pub(crate) async fn connect_with_one_connection(url: &str, schema: &str) -> PostgresStore {
    let opts = PostgresOptions {
        schema: schema.to_string(),
        pool_size: 1,
        ..PostgresOptions::default()
    };
    PostgresStore::connect(url, opts).await.expect("connect")
}

/// Runs `calls`, each in a task of its own, while the store's one connection (see
/// [`connect_with_one_connection`]) is held, so that they queue up behind it; lets it go after
/// 200 ms and returns their outputs in order (for tests of the grouping lanes).
#[cfg(test)]
pub(crate) async fn run_queued<F>(store: &PostgresStore, calls: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let held = store.client().await.expect("client");
    let tasks: Vec<_> = calls.into_iter().map(tokio::spawn).collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(held);
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("join"));
    }
    out
}

/// Runs `callers` tasks that each make `rounds` calls one after another, each call as soon as
/// the one before was answered (`call(store, caller)`; for tests of the grouping lanes' gather).
#[cfg(test)]
pub(crate) async fn run_closed_loop<F, Fut>(
    store: &PostgresStore,
    callers: usize,
    rounds: usize,
    call: F,
) where
    F: Fn(PostgresStore, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (store, call) = (store.clone(), call.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    call(store.clone(), caller).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("join");
    }
}

/// The transaction id (`xmin`) that wrote the row of `table` whose `column` is `value` (for
/// tests of what commits together).
#[cfg(test)]
pub(crate) async fn xmin(
    store: &PostgresStore,
    table: &str,
    column: &str,
    value: &(dyn ToSql + Sync),
) -> String {
    let client = store.client().await.expect("client");
    let sql = format!(
        "SELECT xmin::text FROM {}.{table} WHERE {column} = $1",
        store.schema.ident
    );
    client.query_one(&sql, &[value]).await.expect("xmin").get(0)
}

/// Inserts a task of each of `specs`, due at `now`; their ids in order (for tests).
#[cfg(test)]
pub(crate) async fn insert_due(
    store: &PostgresStore,
    specs: Vec<sundial_core::TaskSpec>,
    now: Timestamp,
) -> Vec<TaskId> {
    let tasks: Vec<_> = specs
        .into_iter()
        .map(|s| {
            s.run_at(now)
                .validate(
                    TaskId(Uuid::now_v7()),
                    now,
                    16,
                    &sundial_core::Limits::default(),
                )
                .expect("valid")
        })
        .collect();
    let ids = tasks.iter().map(|t| t.id).collect();
    store.insert(tasks).await.expect("insert");
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts made for a waiting poll: a task without a key, limit or rate starts in one
    /// statement that commits the poll's audit record too; a keyed one goes through the full
    /// claim, in a transaction of its own; both record the poll's worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plain_start_is_one_statement_with_the_requests_record() {
        use sundial_store::audit_scope::{AuditScope, AuditWrite};
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let ids = insert_due(
            &store,
            vec![
                sundial_core::TaskSpec::new("k").queue("q"),
                sundial_core::TaskSpec::new("k")
                    .queue("q")
                    .exclusive("acct", sundial_core::ExclusiveMode::Wait),
            ],
            now,
        )
        .await;
        let run = |id: TaskId| DueClaim {
            id,
            target: ClaimTarget::Run {
                execution: ExecutionId(Uuid::now_v7()),
                lease_until: Timestamp(now.0 + 60_000),
                worker: Some("w-1".into()),
            },
        };
        let scope = AuditScope::new(sundial_store::NewAuditRecord {
            at: now,
            actor_id: None,
            actor: "local".into(),
            namespace: "default".into(),
            action: "POST /v1/queues/{queue}/poll".into(),
            target: None,
            status: 200,
            request_id: "req-1".into(),
        });
        let out = scope
            .run(store.claim_due(vec![run(ids[1]), run(ids[0])], now, None))
            .await
            .expect("claim_due");
        for (o, id) in out.iter().zip([ids[1], ids[0]]) {
            assert!(
                matches!(o, ClaimOutcome::Started(t) if t.id == id && t.worker.as_deref() == Some("w-1")),
                "{o:?}"
            );
        }
        let AuditWrite::Written { seq } = scope.write() else {
            panic!("the start carried the record: {:?}", scope.write());
        };
        let plain = xmin(&store, "tasks", "id", &ids[0].0).await;
        assert_eq!(plain, xmin(&store, "audit_log", "seq", &seq).await);
        assert_ne!(plain, xmin(&store, "tasks", "id", &ids[1].0).await);
    }

    async fn plan_cache_mode(client: &impl GenericClient) -> String {
        query(client, "SELECT current_setting('plan_cache_mode')", &[])
            .await
            .expect("read the setting")[0]
            .get(0)
    }

    /// The store's connections plan each statement once; the operator's filtered reads are
    /// planned per call for that one transaction only; a URL's own `plan_cache_mode` stays.
    #[tokio::test]
    async fn statements_are_planned_once_and_filtered_reads_per_call() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = connect_with_one_connection(&test.url, &test.schema).await;
        let mut client = store.client().await.expect("client");
        assert_eq!(plan_cache_mode(&client).await, "force_generic_plan");
        let rows = query_planned_per_call(
            &mut client,
            "SELECT current_setting('plan_cache_mode')",
            &[],
        )
        .await
        .expect("query");
        assert_eq!(rows[0].get::<_, String>(0), "force_custom_plan");
        assert_eq!(plan_cache_mode(&client).await, "force_generic_plan");
        drop(client);
        drop(store);

        let separator = if test.url.contains('?') { '&' } else { '?' };
        let url = format!("{}{separator}options=-c%20plan_cache_mode%3Dauto", test.url);
        let store = connect_with_one_connection(&url, &test.schema).await;
        let client = store.client().await.expect("client");
        assert_eq!(plan_cache_mode(&client).await, "auto");
    }
}
