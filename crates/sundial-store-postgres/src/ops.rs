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
    Attempt, AttemptHistory, AttemptOutcome, AttemptResponse, LIST_VISIT_BUDGET, ListDriver,
    QueueConfig, QueueSettings, RetentionRules, SelectPage, Selected, StoreError, TaskFilter,
    TransitionError, page_cursor, prefix_upper_bound,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::rows::{self, col, task_from_row, tasks_from_rows};
use crate::{PostgresStore, limit_param, pg, query, query_opt, query_planned_per_call};

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
    pub count_rate_limited: String,
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
            // Deletes through the locked rows' `ctid` (see `sql.rs`): planned generically, a
            // join on ids could read every finished task of the partial index per call.
            format!(
                "WITH l AS (SELECT id, ctid AS tid FROM {tasks} \
                     WHERE queue = $1 AND state = $2 AND finished_at < $3 {shard} \
                     AND state IN {TERMINAL} LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {tasks} t USING l \
                 WHERE t.ctid = ANY (ARRAY(SELECT tid FROM l)) AND t.ctid = l.tid \
                 AND t.id = l.id AND t.state IN {TERMINAL}"
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
            count_rate_limited: format!(
                "SELECT count(*) FROM {tasks} t WHERE t.queue = $1 AND t.rate IS NOT NULL \
                 AND ((t.state = 'scheduled' AND t.due_at <= $2) \
                      OR (t.state = 'ready' AND EXISTS (SELECT 1 FROM {s}.rate_limits rl \
                          WHERE rl.key = {take} AND rl.next_at > $2)))",
                take = crate::sql::TAKE_KEY_SQL,
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

/// Positional parameters of a statement being built.
#[derive(Default)]
struct Args(Vec<Box<dyn ToSql + Sync + Send>>);

impl Args {
    /// Adds `v` and answers its placeholder (`$n`).
    fn add(&mut self, v: Box<dyn ToSql + Sync + Send>) -> String {
        self.0.push(v);
        format!("${}", self.0.len())
    }
}

/// The candidates of a page: `SELECT <id> AS id … ORDER BY <id> DESC LIMIT <budget>` from the
/// driving index of `driver` (see [`ListDriver`]), below the cursor, with only the conditions
/// that index serves.
///
/// A driving state is compared with `(SELECT $n::text)`, a value the planner only learns when
/// the statement runs: a known terminal state would let it prove the predicate of the partial
/// index `tasks_finished (queue, state, shard, finished_at)` and read every task of that state
/// from it, to sort them by id, where the budget wants the first of `(state, id)` in order.
fn driver_sql(
    tasks: &str,
    tags_table: &str,
    filter: &TaskFilter,
    driver: ListDriver,
    budget: &str,
    args: &mut Args,
) -> String {
    let (from, idcol, mut conds) = match driver {
        ListDriver::Tag => {
            let mut conds = String::new();
            if let Some((k, v)) = filter.tags.first() {
                let k = args.add(Box::new(k.clone()));
                let v = args.add(Box::new(v.clone()));
                conds = format!(" AND g.key = {k} AND g.value = {v}");
            }
            (format!("{tags_table} g"), "g.task_id", conds)
        }
        _ => (format!("{tasks} d"), "d.id", String::new()),
    };
    let mut order = "";
    match driver {
        ListDriver::Key => {
            if let Some(k) = &filter.key {
                let k = args.add(Box::new(k.clone()));
                conds.push_str(&format!(" AND d.key IS NOT NULL AND d.key = {k}"));
            }
        }
        ListDriver::DeadGroup => {
            // The partial index `tasks_dead_error (queue, <group>, id) WHERE state = 'dead'`:
            // its predicate is implied by a literal, not by a parameter of a cached plan.
            let q = args.add(Box::new(filter.queue.clone()));
            let g = args.add(Box::new(filter.error_group.clone()));
            conds.push_str(&format!(
                " AND d.queue = {q} AND d.state = 'dead' AND {} = {g}",
                crate::sql::ERROR_GROUP_SQL
            ));
        }
        ListDriver::QueueState | ListDriver::Queue => {
            let q = args.add(Box::new(filter.queue.clone()));
            conds.push_str(&format!(" AND d.queue = {q}"));
            if driver == ListDriver::QueueState
                && let Some(st) = filter.state
            {
                let st = args.add(Box::new(st.as_str()));
                conds.push_str(&format!(" AND d.state = (SELECT {st}::text)"));
                order = "d.state DESC, ";
            }
        }
        ListDriver::Kind => {
            let k = args.add(Box::new(filter.kind.clone()));
            conds.push_str(&format!(" AND d.kind = {k}"));
        }
        ListDriver::State => {
            if let Some(st) = filter.state {
                // Bounds, not an equality: an equality makes `state` a constant of the order,
                // and the planner may then walk the primary key and filter. With `ORDER BY
                // state, id` only `tasks_state_id` gives the order without a sort.
                let st = args.add(Box::new(st.as_str()));
                conds.push_str(&format!(
                    " AND d.state >= (SELECT {st}::text) AND d.state <= (SELECT {st}::text)"
                ));
                order = "d.state DESC, ";
            }
        }
        ListDriver::Tag | ListDriver::Id => {}
    }
    if let Some(b) = filter.before {
        let b = args.add(Box::new(b.0));
        conds.push_str(&format!(" AND {idcol} < {b}"));
    }
    format!(
        "SELECT {idcol} AS id FROM {from} WHERE true{conds} ORDER BY {order}{idcol} DESC LIMIT {budget}"
    )
}

/// Every condition of `filter` but the cursor, on `t` (the task row of a candidate).
fn conditions(tags_table: &str, filter: &TaskFilter, args: &mut Args) -> String {
    let mut sql = String::new();
    for (k, v) in &filter.tags {
        let k = args.add(Box::new(k.clone()));
        let v = args.add(Box::new(v.clone()));
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM {tags_table} h WHERE h.key = {k} AND h.value = {v} \
             AND h.task_id = t.id)"
        ));
    }
    if let Some(q) = &filter.queue {
        let q = args.add(Box::new(q.clone()));
        sql.push_str(&format!(" AND t.queue = {q}"));
    }
    if let Some(k) = &filter.kind {
        let k = args.add(Box::new(k.clone()));
        sql.push_str(&format!(" AND t.kind = {k}"));
    }
    if let Some(st) = filter.state {
        // The states are a closed set of plain words.
        sql.push_str(&format!(" AND t.state = '{}'", st.as_str()));
    }
    if let Some(k) = &filter.key {
        let k = args.add(Box::new(k.clone()));
        sql.push_str(&format!(" AND t.key = {k}"));
    }
    if let Some(p) = &filter.key_prefix {
        // Byte-order comparisons (no collation), which `tasks_key_id (key text_pattern_ops)`
        // serves; its predicate is implied.
        let lo = args.add(Box::new(p.clone()));
        sql.push_str(&format!(" AND t.key IS NOT NULL AND t.key ~>=~ {lo}"));
        if let Some(upper) = prefix_upper_bound(p) {
            let hi = args.add(Box::new(upper));
            sql.push_str(&format!(" AND t.key ~<~ {hi}"));
        }
    }
    if let Some(g) = &filter.error_group {
        let g = args.add(Box::new(g.clone()));
        sql.push_str(&format!(" AND {} = {g}", crate::sql::ERROR_GROUP_SQL));
    }
    let ranges = [
        (filter.due_after, "t.due_at >="),
        (filter.due_before, "t.due_at <"),
        (filter.created_after, "t.created_at >="),
        (filter.created_before, "t.created_at <"),
    ];
    for (t, cmp) in ranges {
        if let Some(t) = t {
            let t = args.add(Box::new(t.0));
            sql.push_str(&format!(" AND {cmp} {t}"));
        }
    }
    if filter.exclude_internal {
        // `starts_with` is exact (no LIKE wildcards, whatever the collation).
        let p = args.add(Box::new(sundial_core::INTERNAL_QUEUE_PREFIX));
        sql.push_str(&format!(" AND NOT starts_with(t.queue, {p})"));
    }
    if let Some(ns) = &filter.namespace {
        match sundial_core::namespace::stored_prefix(ns) {
            Some(prefix) => {
                let p = args.add(Box::new(prefix));
                sql.push_str(&format!(" AND starts_with(t.queue, {p})"));
            }
            // The default namespace's names are those without the separator (chr(31)).
            None => sql.push_str(" AND strpos(t.queue, chr(31)) = 0"),
        }
    }
    sql
}

/// The query behind `list` and `select`: `columns` (qualified `t.`) of at most `limit` tasks
/// matching `filter`, newest id first, found among at most `budget` candidates of the driving
/// index ([`TaskFilter::list_driver`]), followed by two columns: how many candidates were
/// visited and the oldest of them (the same on every row; one row of NULL task columns when
/// nothing matched).
///
/// The candidates are an ordered, limited subquery holding only the driving index's conditions,
/// so a page that fills early joins only the rows it returns; the other filters apply to the
/// joined task rows. A `key_prefix` without a better driver first probes `tasks_key_id` for at
/// most `budget + 1` keys of the range ([`TaskFilter::probes_key_prefix`]): a range that fits
/// the budget is the candidate set, a larger one leaves the candidates to the driver.
pub(crate) fn filtered(
    tasks: &str,
    tags_table: &str,
    filter: &TaskFilter,
    columns: &str,
    limit: usize,
    budget: usize,
) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut args = Args::default();
    let b = args.add(Box::new(limit_param(budget)));
    let driver = driver_sql(
        tasks,
        tags_table,
        filter,
        filter.list_driver(),
        &b,
        &mut args,
    );
    let (with, candidates) = match &filter.key_prefix {
        Some(p) if filter.probes_key_prefix() => {
            let lo = args.add(Box::new(p.clone()));
            let mut probe =
                format!("SELECT d.id FROM {tasks} d WHERE d.key IS NOT NULL AND d.key ~>=~ {lo}");
            if let Some(upper) = prefix_upper_bound(p) {
                let hi = args.add(Box::new(upper));
                probe.push_str(&format!(" AND d.key ~<~ {hi}"));
            }
            if let Some(before) = filter.before {
                let c = args.add(Box::new(before.0));
                probe.push_str(&format!(" AND d.id < {c}"));
            }
            let b1 = args.add(Box::new(limit_param(budget.saturating_add(1))));
            // `ORDER BY key USING ~<~` is the order of `tasks_key_id`, which the probe walks.
            (
                format!("WITH k AS MATERIALIZED ({probe} ORDER BY d.key USING ~<~ LIMIT {b1}) "),
                format!(
                    "SELECT id FROM k WHERE (SELECT count(*) FROM k) <= {b} \
                     UNION ALL SELECT f.id FROM ({driver}) f \
                     WHERE (SELECT count(*) FROM k) > {b}"
                ),
            )
        }
        _ => (String::new(), driver),
    };
    let conds = conditions(tags_table, filter, &mut args);
    let lim = args.add(Box::new(limit_param(limit)));
    let sql = format!(
        "{with}SELECT p.*, v.visited, v.oldest FROM \
         (SELECT count(*) AS visited, (array_agg(c0.id ORDER BY c0.id))[1] AS oldest \
          FROM ({candidates}) c0) v \
         LEFT JOIN (SELECT x.* FROM ({candidates}) c CROSS JOIN LATERAL \
          (SELECT {columns} FROM {tasks} t WHERE t.id = c.id{conds} LIMIT 1) x \
          ORDER BY c.id DESC LIMIT {lim}) p ON true \
         ORDER BY p.id DESC"
    );
    (sql, args.0)
}

/// A page's rows as [`filtered`] returns them: the task rows (none when nothing matched), and
/// how many candidates were visited, the oldest of them.
pub(crate) struct Filtered {
    pub rows: Vec<Row>,
    pub visited: usize,
    pub oldest: Option<TaskId>,
}

impl Filtered {
    fn from_rows(rows: Vec<Row>) -> Result<Self, StoreError> {
        let (visited, oldest) = match rows.first() {
            Some(r) => {
                let n = r.len();
                let visited: i64 = col(r, n.saturating_sub(2))?;
                let oldest: Option<Uuid> = col(r, n.saturating_sub(1))?;
                (
                    usize::try_from(visited).unwrap_or(usize::MAX),
                    oldest.map(TaskId),
                )
            }
            None => (0, None),
        };
        // The one row of an empty page has no task: its id column is NULL.
        let mut tasks = Vec::with_capacity(rows.len());
        for r in rows {
            if col::<Option<Uuid>>(&r, 0)?.is_some() {
                tasks.push(r);
            }
        }
        Ok(Filtered {
            rows: tasks,
            visited,
            oldest,
        })
    }
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
        budget: usize,
    ) -> Result<Filtered, StoreError> {
        let tags = format!("{}.task_tags", self.schema.ident);
        let (sql, args) = filtered(&self.sql.tasks, &tags, filter, columns, limit, budget);
        let mut client = self.client().await?;
        Filtered::from_rows(query_planned_per_call(&mut client, &sql, &params(&args)).await?)
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
            LIST_VISIT_BUDGET,
        );
        let mut client = self.client().await?;
        let rows = query_planned_per_call(
            &mut client,
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
    ) -> Result<SelectPage, StoreError> {
        // One row more than asked for tells whether another batch follows.
        let found = self
            .list_filtered(
                filter,
                "t.id, t.state",
                limit.saturating_add(1),
                LIST_VISIT_BUDGET,
            )
            .await?;
        let mut selected = found
            .rows
            .iter()
            .map(|r| {
                let state: String = col(r, 1)?;
                Ok(Selected {
                    id: TaskId(col(r, 0)?),
                    state: rows::parse_state(&state)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let n = selected.len();
        selected.truncate(limit);
        let next_cursor = page_cursor(
            n,
            limit,
            selected.last().map(|s| s.id),
            found.visited,
            LIST_VISIT_BUDGET,
            found.oldest,
        );
        Ok(SelectPage {
            selected,
            next_cursor,
        })
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

    pub(crate) async fn ops_count_rate_limited(
        &self,
        queue: &str,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let rows = query(&client, &self.ops.count_rate_limited, &[&queue, &now.0]).await?;
        match rows.first() {
            None => Ok(0),
            Some(r) => Ok(u64::try_from(col::<i64>(r, 0)?).unwrap_or(0)),
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
