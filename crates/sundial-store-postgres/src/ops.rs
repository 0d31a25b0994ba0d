//! The operator's side of the PostgreSQL store: queue settings and pause, attempt history, bulk
//! selections and changes, and retention (migration 6).
//!
//! Multi-row changes lock their rows in id order (`FOR UPDATE`), the order `claim_due` locks in,
//! so they cannot close a deadlock with the engine's claims; purges take `SKIP LOCKED` and wait
//! for nobody.

use deadpool_postgres::GenericClient;
use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::audit_scope;
use sundial_store::{
    Attempt, AttemptHistory, AttemptOutcome, AttemptResponse, QueueConfig, QueueSettings,
    RetentionRules, Selected, StoreError, TaskFilter, TransitionError, prefix_upper_bound,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::rows::{self, col, task_from_row, tasks_from_rows};
use crate::{PostgresStore, limit_param, pg, query, query_opt};

/// Live states: the ones that hold a business key.
const LIVE: &str = "('scheduled', 'ready', 'running')";
const TERMINAL: &str = "('succeeded', 'dead', 'cancelled')";
const QUEUE_COLUMNS: &str = "queue, paused, paused_changed_at, config, updated_at";

/// The statements of this module, with the schema filled in.
pub(crate) struct OpsSql {
    pub queue_get: String,
    pub queue_list: String,
    pub queue_put: String,
    pub queue_pause: String,
    pub earliest_waiting: String,
    pub attempts: String,
    pub attempt_response: String,
    pub exists: String,
    pub retry: String,
    pub retry_many: String,
    pub holder: String,
    pub cancel_many: String,
    pub finished_queues: String,
    pub purge: String,
    pub purge_in_shard: String,
    pub set_attempts_kept: String,
}

impl OpsSql {
    pub fn new(s: &str) -> Self {
        let tasks = format!("{s}.tasks");
        let q = format!("{s}.queue_settings");
        let c = rows::task_columns("t");
        let revive = "state = 'scheduled', due_at = $2, attempt = 0, execution_id = NULL, \
             lease_expires_at = NULL, worker = NULL, result = NULL, started_at = NULL, \
             finished_at = NULL, updated_at = $3";
        let key_free = format!(
            "(t.key IS NULL OR NOT EXISTS (SELECT 1 FROM {tasks} o WHERE o.queue = t.queue \
             AND o.key = t.key AND o.state IN {LIVE}))"
        );
        let purge = |shard: &str| {
            format!(
                "DELETE FROM {tasks} t WHERE t.id IN (SELECT id FROM {tasks} \
                 WHERE queue = $1 AND state = $2 AND finished_at < $3 {shard} \
                 AND state IN {TERMINAL} LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 AND t.state IN {TERMINAL}"
            )
        };
        OpsSql {
            queue_get: format!("SELECT {QUEUE_COLUMNS} FROM {q} WHERE queue = $1"),
            queue_list: format!("SELECT {QUEUE_COLUMNS} FROM {q} ORDER BY queue"),
            queue_put: format!(
                "INSERT INTO {q} AS x (queue, config, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (queue) DO UPDATE SET config = EXCLUDED.config, \
                 updated_at = EXCLUDED.updated_at RETURNING {QUEUE_COLUMNS}"
            ),
            queue_pause: format!(
                "INSERT INTO {q} AS x (queue, paused, paused_changed_at, updated_at) \
                 VALUES ($1, $2, $3, $3) \
                 ON CONFLICT (queue) DO UPDATE SET \
                 paused_changed_at = CASE WHEN x.paused = EXCLUDED.paused \
                     THEN x.paused_changed_at ELSE EXCLUDED.paused_changed_at END, \
                 updated_at = CASE WHEN x.paused = EXCLUDED.paused \
                     THEN x.updated_at ELSE EXCLUDED.updated_at END, \
                 paused = EXCLUDED.paused RETURNING {QUEUE_COLUMNS}"
            ),
            earliest_waiting: format!(
                "SELECT min(due_at) FROM {tasks} WHERE queue = $1 \
                 AND state IN ('scheduled', 'ready')"
            ),
            attempts: format!(
                "SELECT seq, execution_id, worker, started_at, ended_at, outcome, error, \
                 status_code, content_type FROM {s}.task_attempts WHERE task_id = $1 ORDER BY seq"
            ),
            attempt_response: format!(
                "UPDATE {s}.task_attempts SET status_code = $3, content_type = $4 \
                 WHERE task_id = $1 AND execution_id = $2"
            ),
            exists: format!("SELECT state FROM {tasks} WHERE id = $1"),
            retry: format!(
                "UPDATE {tasks} t SET {revive} WHERE t.id = $1 AND t.state IN ('dead', 'cancelled') \
                 AND {key_free} RETURNING {c}"
            ),
            retry_many: format!(
                "WITH l AS (SELECT id FROM {tasks} WHERE id = ANY($1::uuid[]) \
                     AND state IN ('dead', 'cancelled') ORDER BY id FOR UPDATE) \
                 UPDATE {tasks} t SET {revive} FROM l WHERE t.id = l.id \
                 AND t.state IN ('dead', 'cancelled') AND {key_free} RETURNING {c}"
            ),
            holder: format!(
                "SELECT id FROM {tasks} WHERE queue = $1 AND key = $2 AND state IN {LIVE}"
            ),
            cancel_many: format!(
                "WITH l AS (SELECT id FROM {tasks} WHERE id = ANY($1::uuid[]) \
                     AND state IN {LIVE} ORDER BY id FOR UPDATE) \
                 UPDATE {tasks} t SET state = 'cancelled', updated_at = $2, finished_at = $2, \
                 lease_expires_at = NULL FROM l WHERE t.id = l.id AND t.state IN {LIVE} \
                 RETURNING {c}"
            ),
            finished_queues: format!(
                "SELECT queue, state FROM {s}.task_counts WHERE state IN {TERMINAL} \
                 GROUP BY queue, state HAVING sum(n) > 0 ORDER BY queue, state"
            ),
            purge: purge(""),
            purge_in_shard: purge("AND shard = $5"),
            set_attempts_kept: format!(
                "UPDATE {s}.store_settings SET value = $1 WHERE name = 'attempts_kept'"
            ),
        }
    }
}

fn queue_from_row(r: &Row) -> Result<QueueSettings, StoreError> {
    let config: String = col(r, 3)?;
    Ok(QueueSettings {
        queue: col(r, 0)?,
        paused: col(r, 1)?,
        paused_changed_at: col::<Option<i64>>(r, 2)?.map(Timestamp),
        config: serde_json::from_str(&config)
            .map_err(|e| StoreError::corrupt_from("queue config", e))?,
        updated_at: Timestamp(col(r, 4)?),
    })
}

/// The `WHERE … ORDER BY … LIMIT` query behind `list` and `select`: `columns` (qualified `t.`)
/// of tasks matching `filter`, newest id first. With tags the first tag drives through
/// `task_tags (key, value, task_id)`; otherwise the planner picks among the search indexes.
/// A `json` value as its text (the binary form of `json` is the text itself).
struct JsonText(String);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        _ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(JsonText(std::str::from_utf8(raw)?.to_string()))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::JSON
    }
}

pub(crate) fn filtered(
    tasks: &str,
    tags_table: &str,
    filter: &TaskFilter,
    columns: &str,
    limit: usize,
) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut args: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut sql;
    let mut push = |sql: &mut String, cond: &str, v: Box<dyn ToSql + Sync + Send>| {
        args.push(v);
        sql.push_str(&cond.replace('$', &format!("${}", args.len())));
    };
    let order;
    match filter.tags.split_first() {
        Some(((k, v), rest)) => {
            sql = format!(
                "SELECT {columns} FROM {tags_table} g JOIN {tasks} t ON t.id = g.task_id \
                 WHERE true"
            );
            push(&mut sql, " AND g.key = $", Box::new(k.clone()));
            push(&mut sql, " AND g.value = $", Box::new(v.clone()));
            if let Some(b) = filter.before {
                push(&mut sql, " AND g.task_id < $", Box::new(b.0));
            }
            for (k, v) in rest {
                push(
                    &mut sql,
                    &format!(" AND EXISTS (SELECT 1 FROM {tags_table} h WHERE h.key = $"),
                    Box::new(k.clone()),
                );
                push(
                    &mut sql,
                    " AND h.value = $ AND h.task_id = t.id)",
                    Box::new(v.clone()),
                );
            }
            order = "g.task_id";
        }
        None => {
            sql = format!("SELECT {columns} FROM {tasks} t WHERE true");
            if let Some(b) = filter.before {
                push(&mut sql, " AND t.id < $", Box::new(b.0));
            }
            order = "t.id";
        }
    }
    if let Some(q) = &filter.queue {
        push(&mut sql, " AND t.queue = $", Box::new(q.clone()));
    }
    if let Some(k) = &filter.kind {
        push(&mut sql, " AND t.kind = $", Box::new(k.clone()));
    }
    match filter.state {
        // With an error group, the state is written into the statement: a partial index's
        // predicate (`tasks_dead_error` is `WHERE state = 'dead'`) is implied by a literal, not
        // by a parameter of a cached generic plan. The states are a closed set of plain words.
        Some(st) if filter.error_group.is_some() => {
            sql.push_str(&format!(" AND t.state = '{}'", st.as_str()));
        }
        Some(st) => push(&mut sql, " AND t.state = $", Box::new(st.as_str())),
        None => {}
    }
    if let Some(k) = &filter.key {
        push(&mut sql, " AND t.key = $", Box::new(k.clone()));
    }
    if let Some(p) = &filter.key_prefix {
        // Byte-order comparisons (no collation), which `tasks_key_id (key text_pattern_ops)`
        // serves; its predicate is implied.
        push(
            &mut sql,
            " AND t.key IS NOT NULL AND t.key ~>=~ $",
            Box::new(p.clone()),
        );
        if let Some(upper) = prefix_upper_bound(p) {
            push(&mut sql, " AND t.key ~<~ $", Box::new(upper));
        }
    }
    if let Some(g) = &filter.error_group {
        // The expression of the partial index `tasks_dead_error (queue, <group>, id) WHERE
        // state = 'dead'`, so a dead-letter group (state dead, a queue and the group) reads
        // exactly its rows from it.
        push(
            &mut sql,
            &format!(" AND {} = $", crate::sql::ERROR_GROUP_SQL),
            Box::new(g.clone()),
        );
    }
    if let Some(t) = filter.due_after {
        push(&mut sql, " AND t.due_at >= $", Box::new(t.0));
    }
    if let Some(t) = filter.due_before {
        push(&mut sql, " AND t.due_at < $", Box::new(t.0));
    }
    if let Some(t) = filter.created_after {
        push(&mut sql, " AND t.created_at >= $", Box::new(t.0));
    }
    if let Some(t) = filter.created_before {
        push(&mut sql, " AND t.created_at < $", Box::new(t.0));
    }
    if filter.exclude_internal {
        // `starts_with` is exact (no LIKE wildcards, whatever the collation).
        push(
            &mut sql,
            " AND NOT starts_with(t.queue, $)",
            Box::new(sundial_core::INTERNAL_QUEUE_PREFIX),
        );
    }
    if let Some(ns) = &filter.namespace {
        match sundial_core::namespace::stored_prefix(ns) {
            Some(prefix) => push(&mut sql, " AND starts_with(t.queue, $)", Box::new(prefix)),
            // The default namespace's names are those without the separator (chr(31)).
            None => sql.push_str(" AND strpos(t.queue, chr(31)) = 0"),
        }
    }
    push(
        &mut sql,
        &format!(" ORDER BY {order} DESC LIMIT $"),
        Box::new(limit_param(limit)),
    );
    (sql, args)
}

fn params(args: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// Whether a backend error is a unique violation (a key taken between check and write).
fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

impl PostgresStore {
    pub(crate) async fn list_filtered(
        &self,
        filter: &TaskFilter,
        columns: &str,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let tags = format!("{}.task_tags", self.schema.ident);
        let (sql, args) = filtered(&self.sql.tasks, &tags, filter, columns, limit);
        let client = self.client().await?;
        query(&client, &sql, &params(&args)).await
    }

    /// The plan PostgreSQL chooses for a page of `list` with `filter` (`EXPLAIN (FORMAT JSON)`
    /// of the very statement `list` runs, with its parameters), as JSON text. For checking that
    /// every filter is served by an index (`tests/list_plans.rs`) and for operators.
    pub async fn explain_list(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<String, StoreError> {
        let tags = format!("{}.task_tags", self.schema.ident);
        let (sql, args) = filtered(
            &self.sql.tasks,
            &tags,
            filter,
            &self.sql.columns,
            limit.saturating_add(1),
        );
        let client = self.client().await?;
        let rows = query(
            &client,
            &format!("EXPLAIN (FORMAT JSON) {sql}"),
            &params(&args),
        )
        .await?;
        let mut out = String::new();
        for r in &rows {
            let line: JsonText = col(r, 0)?;
            out.push_str(&line.0);
        }
        Ok(out)
    }

    pub(crate) async fn ops_select(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<Vec<Selected>, StoreError> {
        let rows = self.list_filtered(filter, "t.id, t.state", limit).await?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, 1)?;
                Ok(Selected {
                    id: TaskId(col(r, 0)?),
                    state: rows::parse_state(&state)?,
                })
            })
            .collect()
    }

    pub(crate) async fn ops_queue_settings(
        &self,
        queue: &str,
    ) -> Result<Option<QueueSettings>, StoreError> {
        let client = self.client().await?;
        query_opt(&client, &self.ops.queue_get, &[&queue])
            .await?
            .map(|r| queue_from_row(&r))
            .transpose()
    }

    pub(crate) async fn ops_list_queue_settings(&self) -> Result<Vec<QueueSettings>, StoreError> {
        let client = self.client().await?;
        query(&client, &self.ops.queue_list, &[])
            .await?
            .iter()
            .map(queue_from_row)
            .collect()
    }

    pub(crate) async fn ops_put_queue_config(
        &self,
        queue: &str,
        config: &QueueConfig,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let json =
            serde_json::to_string(config).map_err(|e| StoreError::encode("queue settings", e))?;
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let rows = query(&tx, &self.ops.queue_put, &[&queue, &json, &now.0]).await?;
        let r = rows.first().ok_or(StoreError::NoRow {
            what: "queue settings upsert",
        })?;
        let settings = queue_from_row(r)?;
        self.commit_audited(tx, audit).await?;
        Ok(settings)
    }

    pub(crate) async fn ops_set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let rows = query(&tx, &self.ops.queue_pause, &[&queue, &paused, &now.0]).await?;
        let r = rows.first().ok_or(StoreError::NoRow {
            what: "queue pause upsert",
        })?;
        let settings = queue_from_row(r)?;
        self.commit_audited(tx, audit).await?;
        Ok(settings)
    }

    pub(crate) async fn ops_earliest_waiting(
        &self,
        queue: &str,
    ) -> Result<Option<Timestamp>, StoreError> {
        let client = self.client().await?;
        let rows = query(&client, &self.ops.earliest_waiting, &[&queue]).await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => Ok(col::<Option<i64>>(r, 0)?.map(Timestamp)),
        }
    }

    pub(crate) async fn ops_attempts(
        &self,
        id: TaskId,
    ) -> Result<Option<AttemptHistory>, StoreError> {
        let client = self.client().await?;
        if query_opt(&client, &self.ops.exists, &[&id.0])
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let rows = query(&client, &self.ops.attempts, &[&id.0]).await?;
        let mut attempts = Vec::with_capacity(rows.len());
        for r in &rows {
            let seq: i64 = col(r, 0)?;
            let outcome: Option<String> = col(r, 5)?;
            attempts.push(Attempt {
                task_id: id,
                seq: u64::try_from(seq)
                    .map_err(|_| StoreError::corrupt(format!("attempt seq {seq}")))?,
                execution_id: col::<Option<Uuid>>(r, 1)?.map(ExecutionId),
                worker: col(r, 2)?,
                started_at: Timestamp(col(r, 3)?),
                ended_at: col::<Option<i64>>(r, 4)?.map(Timestamp),
                outcome: outcome
                    .map(|o| {
                        AttemptOutcome::parse(&o)
                            .ok_or_else(|| StoreError::corrupt(format!("attempt outcome {o:?}")))
                    })
                    .transpose()?,
                error: col(r, 6)?,
                status_code: col::<Option<i32>>(r, 7)?
                    .map(|c| {
                        u16::try_from(c)
                            .map_err(|_| StoreError::corrupt(format!("attempt status code {c}")))
                    })
                    .transpose()?,
                content_type: col(r, 8)?,
            });
        }
        let total = attempts.last().map(|a| a.seq).unwrap_or(0);
        Ok(Some(AttemptHistory { attempts, total }))
    }

    pub(crate) async fn ops_record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: AttemptResponse,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&self.ops.attempt_response)
            .await
            .map_err(pg)?;
        let n = client
            .execute(
                &stmt,
                &[
                    &id.0,
                    &execution.0,
                    &i32::from(response.status_code),
                    &response.content_type,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(n > 0)
    }

    pub(crate) async fn ops_retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        {
            let tx = client.transaction().await.map_err(pg)?;
            let stmt = tx.prepare_cached(&self.ops.retry).await.map_err(pg)?;
            match tx.query_opt(&stmt, &[&id.0, &due_at.0, &now.0]).await {
                Ok(Some(r)) => {
                    let task = task_from_row(&r)?;
                    self.commit_audited(tx, audit).await?;
                    return Ok(task);
                }
                // Nothing changed (the transaction rolls back as it drops; after a unique
                // violation it could run nothing more): the refusal is read outside it.
                Ok(None) => {}
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(pg(e).into()),
            }
        }
        let Some(task) = self.task_in(&client, id).await? else {
            return Err(TransitionError::NotFound);
        };
        if !matches!(task.state, TaskState::Dead | TaskState::Cancelled) {
            return Err(TransitionError::WrongState { state: task.state });
        }
        match query_opt(&client, &self.ops.holder, &[&task.queue, &task.key]).await? {
            Some(r) => Err(TransitionError::KeyTaken {
                existing: TaskId(col(&r, 0)?),
            }),
            None => Err(StoreError::RetryRefused { id }.into()),
        }
    }

    async fn task_in(
        &self,
        client: &impl GenericClient,
        id: TaskId,
    ) -> Result<Option<Task>, StoreError> {
        query_opt(client, &self.sql.get, &[&id.0])
            .await?
            .map(|r| task_from_row(&r))
            .transpose()
    }

    pub(crate) async fn ops_retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let uuids: Vec<Uuid> = ids.iter().map(|i| i.0).collect();
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let stmt = tx.prepare_cached(&self.ops.retry_many).await.map_err(pg)?;
        match tx.query(&stmt, &[&uuids, &due_at.0, &now.0]).await {
            Ok(rows) => {
                let tasks = tasks_from_rows(&rows)?;
                // A batch that changed nothing leaves the record pending.
                let audit = audit.filter(|_| !tasks.is_empty());
                self.commit_audited(tx, audit).await?;
                Ok(tasks)
            }
            // Two of the batch share a key, or a holder appeared meanwhile: one at a time, each
            // skipped when its key is taken (the first retry that changes something carries the
            // request's record).
            Err(e) if is_unique_violation(&e) => {
                drop(tx);
                drop(audit);
                drop(client);
                let mut out = Vec::new();
                for id in ids {
                    match self.ops_retry(id, due_at, now).await {
                        Ok(t) => out.push(t),
                        Err(TransitionError::Store(e)) => return Err(e),
                        Err(_) => {}
                    }
                }
                Ok(out)
            }
            Err(e) => Err(pg(e)),
        }
    }

    pub(crate) async fn ops_cancel_many(
        &self,
        ids: Vec<TaskId>,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let uuids: Vec<Uuid> = ids.iter().map(|i| i.0).collect();
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let rows = query(&tx, &self.ops.cancel_many, &[&uuids, &now.0]).await?;
        let tasks = tasks_from_rows(&rows)?;
        // A batch that changed nothing leaves the record pending.
        let audit = audit.filter(|_| !tasks.is_empty());
        self.commit_audited(tx, audit).await?;
        Ok(tasks)
    }

    /// [`sundial_store::Store::purge_tasks`] on `client` (a plain connection, or the caller's
    /// fenced transaction).
    pub(crate) async fn purge_tasks_in(
        &self,
        client: &impl GenericClient,
        shard: Option<u32>,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let pairs = query(client, &self.ops.finished_queues, &[]).await?;
        let mut left = limit;
        let mut deleted = 0u64;
        for r in &pairs {
            if left == 0 {
                break;
            }
            let queue: String = col(r, 0)?;
            let state: String = col(r, 1)?;
            let state = rows::parse_state(&state)?;
            let keep = rules
                .queues
                .get(&queue)
                .and_then(|o| match state {
                    TaskState::Succeeded => o.succeeded_ms,
                    TaskState::Cancelled => o.cancelled_ms,
                    TaskState::Dead => o.dead_ms,
                    _ => None,
                })
                .or(rules.default_for(state));
            let Some(keep) = keep else { continue };
            let cutoff = now
                .0
                .saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX))
                + 1;
            let lim = limit_param(left);
            let n = match shard {
                None => {
                    let stmt = client.prepare_cached(&self.ops.purge).await.map_err(pg)?;
                    client
                        .execute(&stmt, &[&queue, &state.as_str(), &cutoff, &lim])
                        .await
                        .map_err(pg)?
                }
                Some(shard) => {
                    let shard = i64::from(shard);
                    let stmt = client
                        .prepare_cached(&self.ops.purge_in_shard)
                        .await
                        .map_err(pg)?;
                    client
                        .execute(&stmt, &[&queue, &state.as_str(), &cutoff, &lim, &shard])
                        .await
                        .map_err(pg)?
                }
            };
            deleted += n;
            left = left.saturating_sub(usize::try_from(n).unwrap_or(usize::MAX));
        }
        Ok(deleted)
    }
}
