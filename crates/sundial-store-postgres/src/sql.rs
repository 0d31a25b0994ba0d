//! Every statement the store runs, written once per store with the schema name filled in.
//!
//! No statement reads a clock (`now()`, `CURRENT_TIMESTAMP`, `clock_timestamp()`): every time is
//! a parameter handed in by the caller, so the engine's clock alone decides what is due. The one
//! exceptions are [`ClusterSql::database_time`], which only reports the database's clock for the
//! engine's skew check at start, and `Sql::tasks_statistics` (the age of the last analyze, for
//! `statistics.rs`); neither decides anything about a task.
//!
//! Every statement is planned once per connection, generically (`plan_cache_mode`, see
//! `PostgresStore::connect`), and often while `tasks` is still empty and has no statistics. On
//! such a table every partial index looks as cheap as a primary-key lookup, so a plan may read
//! all of one state's rows to find the few it was given. The statements that lock rows with
//! `SKIP LOCKED` and then update them therefore update by the locked row's `ctid` (a TID scan,
//! cheaper than any index scan whatever the statistics say), besides its id and condition. The
//! `ctid` is given twice: as a join clause (the plan when the locked rows look few) and as
//! `ctid = ANY (ARRAY(…))` (when a `LIMIT $n`, estimated at a tenth of the candidates, makes
//! them look many: a join would then hash them against a read of the whole table). A
//! row whose locked version is newer than the statement's snapshot is then not updated, which
//! those statements already allow for (a row locked elsewhere is left out the same way); the
//! statements that wait for their locks keep their plain join. `statistics.rs` keeps the
//! statistics that the other statements' plans rely on.

use sundial_store::{ACTIVITY_QUEUE, WORKFLOW_QUEUE};

use crate::rows::task_columns;
use crate::schema::{RANK_SQL, SchemaName};

/// Live states: the ones that hold a business key.
const LIVE: &str = "('scheduled', 'ready', 'running')";

/// A task's (`t`) take key, `sundial_core::RateLimit::take_key` in SQL (`rate` holds the limit as
/// JSON); checked against the Rust one by this module's tests.
pub(crate) const TAKE_KEY_SQL: &str = "(chr(31) || 'take' || chr(31) || COALESCE(t.rate::jsonb->>'key', \
    chr(31) || 'queue' || chr(31) || t.queue))";

/// `sundial_store::error_group` of `last_error` in SQL: its first line, at most
/// `sundial_store::ERROR_GROUP_CHARS` characters; the expression of the index
/// `tasks_dead_error` (migration 14).
pub(crate) const ERROR_GROUP_SQL: &str = "left(split_part(last_error, E'\\n', 1), 200)";

pub(crate) struct Sql {
    pub tasks: String,
    /// What `statistics.rs` decides on: seconds since `tasks` was last analyzed (NULL: never),
    /// the planner's row count, rows changed since, and the rows it holds up to `FIRST_ROWS`.
    pub tasks_statistics: String,
    pub analyze_tasks: String,
    pub get: String,
    pub state_of: String,
    pub insert: String,
    pub holders: String,
    pub scan_due_from_start: String,
    pub scan_due_after: String,
    pub next_due_from_start: String,
    pub next_due_after: String,
    pub exclusive_keys_of: String,
    pub lock_keys: String,
    /// The next allowed start of each rate limit key in `$1`.
    pub rate_next: String,
    /// Records the next allowed start (`$2`) of each rate limit key (`$1`).
    pub rate_taken: String,
    pub lock_claimable: String,
    /// `lock_claimable` limited to one shard (`$3`): a fenced claim covers its shard only.
    pub lock_claimable_in_shard: String,
    pub running_keys: String,
    /// How many tasks of each queue in `$1` run.
    pub running_queues: String,
    /// A queue's (`$1`) concurrency limit, with its advisory lock (`$2`, `$3`) taken first; no
    /// row for a queue without a limit (and then no lock).
    pub lock_queue_limit: String,
    pub ready_claimed: String,
    /// The readies of a whole group of `claim_due` calls in one statement (`readier.rs`): `$1`
    /// ids, each with its call's `$2` now and `$3` fence shard (null: unfenced); a task is
    /// readied when it is scheduled, due by its call's now and of its call's shard.
    pub ready_each: String,
    pub start_claimed: String,
    /// `claim_due` of starts in one statement, for tasks without an exclusive key or a rate
    /// limit in queues without a limit: `$1` ids (in id order), `$2` execution ids, `$3` leases,
    /// `$4` now, `$5` workers, `$6` the fence's shard (or null), `$7` its `range_id`, then a
    /// request's audit record (zero or one) as [`crate::access::audit_group_sql`]`(8)`. Answers
    /// the started tasks (one row of nulls when none), whether the fence held and the record's
    /// `seq`.
    pub start_plain: String,
    pub skip_claimed: String,
    /// Indexed by `kinds filter as usize * 2 + after cursor as usize`.
    pub ready_candidates: [String; 4],
    pub try_lock_keys: String,
    /// The earliest take turn (`$2` on) of the ready rate-limited tasks of queue `$1` that
    /// `ready_candidates` leaves out for it.
    pub next_take_turn: String,
    pub start_ready: String,
    /// A claim's common case in one statement (`claimer.rs`): unless queue `$1` has a
    /// concurrency limit, locks the `$2` first ready tasks by rank (of kinds `$6` in the second
    /// variant), starts those with neither an exclusive key nor a rate limit under the
    /// execution ids `$3` and workers `$5` at `$4`, and inserts the audit records (see
    /// `access::audit_group_sql`; `link` is the first execution id of the record's call) of
    /// the calls that took a task. One row per task started (or one row of `NULL` task
    /// columns), each ending with: whether the queue is limited (nothing done), how many
    /// candidates were passed over for their key or rate limit, the records' `seq`s.
    pub claim_plain: [String; 2],
    pub heartbeat: String,
    pub complete: String,
    /// `complete` for several attempts at once, each row with its own condition and time
    /// (see `completer.rs`).
    pub complete_many: String,
    /// `complete_many` that also inserts the audit records (`$5` on, see
    /// `access::audit_group_sql`) of the calls it completed, all in one statement; each row
    /// ends with the `seq`s of the records inserted, in order.
    pub complete_many_audited: String,
    /// `$3`: the retry time, taken while attempts remain (`NULL` or none left: dead).
    pub fail: String,
    /// The running attempt `($1, $2)`, for a failure's backoff.
    pub running_attempt: String,
    pub cancel: String,
    pub trigger: String,
    pub expire_leases: String,
    /// `expire_leases` limited to one shard (`$3`), for the shard's owner.
    pub expire_leases_in_shard: String,
    pub next_lease_expiry: String,
    pub next_lease_expiry_in_shard: String,
    pub fold_counts: String,
    pub insert_tags: String,
    pub count_by_state: String,
    /// The dead tasks by queue and error group, over `tasks_dead_error` (`$1` a queue or NULL,
    /// `$2` the limit).
    pub dead_groups: String,
    /// The task columns qualified with `t.`, for `list`.
    pub columns: String,
    pub cluster: ClusterSql,
    pub schedules: ScheduleSql,
    pub workflows: WorkflowSql,
    pub push: crate::push::PushSql,
}

/// Membership, shard leases, wake-ups (see `cluster.rs`).
pub(crate) struct ClusterSql {
    pub shard_count_propose: String,
    pub shard_count: String,
    pub heartbeat: String,
    pub leave: String,
    /// Every node row, by name (operators' read).
    pub members: String,
    /// Every shard lease row, by shard (operators' read).
    pub leases: String,
    pub acquire: String,
    /// `acquire` for several shards in one statement (rows in shard order).
    pub acquire_many: String,
    pub release: String,
    /// Reads the shard's fencing number and holds a share lock on its lease row until the
    /// transaction ends: a takeover (an `UPDATE` of the row) waits for the fenced write, or the
    /// fenced write, coming second, reads the new `range_id`.
    pub fence: String,
    /// [`Self::fence`]'s share lock on several shards' lease rows, taken in shard order (the
    /// order `acquire_many` locks them in), so a transaction fencing several shards cannot
    /// deadlock with a node renewing its leases. Answers each locked shard with its
    /// `range_id`, so the fences are checked without a statement each.
    pub lock_fences: String,
    pub notify: String,
    pub database_time: String,
}

/// Schedules and their fire records (see `schedules.rs`).
pub(crate) struct ScheduleSql {
    pub get: String,
    /// Schedules by id, each with its last task's id, state and attempt (after the columns).
    pub for_fire: String,
    /// How many columns a schedule row has.
    pub columns: usize,
    /// Armed schedules whose armed tick is gone or terminal.
    pub stranded: String,
    pub lock: String,
    pub create: String,
    pub list: String,
    /// Schedules whose id from character `$5` on contains `$3` (and paused as `$4`, when not
    /// NULL) after `$1` and, when `$6` is not NULL, before it; with `$7`, only ids without the
    /// namespace separator (the default namespace's).
    pub search: String,
    pub set_arm: String,
    pub update_def: String,
    pub after_fire: String,
    pub set_paused: String,
    pub delete: String,
    pub delete_fires: String,
    pub cancel_tick: String,
    pub existing_fires: String,
    pub insert_fires: String,
    pub list_fires: String,
}

/// Workflow runs, their histories and markers (see `workflows.rs`).
pub(crate) struct WorkflowSql {
    pub get: String,
    /// The run row, locked until the transaction ends.
    pub lock: String,
    pub current: String,
    /// Claims the workflow id for a new run when it has none (`RETURNING` nothing otherwise).
    pub claim_id: String,
    /// The workflow id's row, locked, with its current run's status.
    pub lock_id: String,
    pub point_id: String,
    pub insert_run: String,
    pub insert_events: String,
    pub history: String,
    pub has_marker: String,
    pub insert_marker: String,
    pub task_is_live: String,
    pub set_len: String,
    pub close: String,
    pub cancel_ids: String,
    pub cancel_run_tasks: String,
    /// `cancel_run_tasks` in the workflow queues `$4`, `$5` (a namespace other than the default).
    pub cancel_run_tasks_in: String,
    pub list: String,
    /// Retention: up to `$2` runs closed before `$1` with their histories, markers and ids'
    /// pointers; rows another writer holds are skipped (`SKIP LOCKED`), locked in the order of
    /// the other writes (run row, then the workflow id's row).
    pub purge_closed: String,
}

/// The columns of `workflow_runs` (alias `r`), in the order `workflows::run_from_row` reads them.
pub(crate) const RUN_COLUMNS: &str = "r.run_id, r.workflow_id, r.workflow_type, r.input, \
    r.status, r.result, r.error, r.history_len, r.pending_task, r.parent_run, r.parent_workflow, \
    r.parent_cmd, r.continued_from, r.continued_to, r.created_at, r.updated_at, r.closed_at";

/// Why the tasks a workflow gives up (or leaves behind when it closes) were cancelled.
const WORKFLOW_CANCEL_REASON: &str = "cancelled by its workflow";

impl WorkflowSql {
    fn new(s: &str) -> Self {
        let rc = RUN_COLUMNS;
        let runs = format!("{s}.workflow_runs");
        let ids = format!("{s}.workflows");
        let history = format!("{s}.workflow_history");
        let markers = format!("{s}.workflow_markers");
        let tasks = format!("{s}.tasks");
        let why = WORKFLOW_CANCEL_REASON;
        WorkflowSql {
            get: format!("SELECT {rc} FROM {runs} r WHERE r.run_id = $1"),
            lock: format!("SELECT {rc} FROM {runs} r WHERE r.run_id = $1 FOR UPDATE"),
            current: format!(
                "SELECT {rc} FROM {ids} w JOIN {runs} r ON r.run_id = w.run_id \
                 WHERE w.workflow_id = $1"
            ),
            claim_id: format!(
                "INSERT INTO {ids} (workflow_id, run_id) VALUES ($1, $2) \
                 ON CONFLICT (workflow_id) DO NOTHING RETURNING run_id"
            ),
            lock_id: format!(
                "SELECT r.run_id, r.status FROM {ids} w JOIN {runs} r ON r.run_id = w.run_id \
                 WHERE w.workflow_id = $1 FOR UPDATE OF w"
            ),
            point_id: format!("UPDATE {ids} SET run_id = $2 WHERE workflow_id = $1"),
            insert_run: format!(
                "INSERT INTO {runs} (run_id, workflow_id, workflow_type, input, status, \
                 history_len, pending_task, parent_run, parent_workflow, parent_cmd, \
                 continued_from, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, 'running', 1, $5, $6, $7, $8, $9, $10, $10)"
            ),
            insert_events: format!(
                "INSERT INTO {history} (run_id, seq, at, event) \
                 SELECT $1::uuid, $2::bigint + u.ord - 1, u.at, u.event \
                 FROM unnest($3::bigint[], $4::text[]) WITH ORDINALITY AS u(at, event, ord)"
            ),
            history: format!(
                "SELECT seq, at, event FROM {history} WHERE run_id = $1 AND seq >= $2 \
                 ORDER BY seq LIMIT $3"
            ),
            has_marker: format!("SELECT 1 FROM {markers} WHERE run_id = $1 AND marker = $2"),
            insert_marker: format!(
                "INSERT INTO {markers} (run_id, marker) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING RETURNING marker"
            ),
            task_is_live: format!("SELECT 1 FROM {tasks} WHERE id = $1 AND state IN {LIVE}"),
            // `$3` NULL keeps the pending task; `$5` says whether to clear it.
            set_len: format!(
                "UPDATE {runs} SET history_len = $2, \
                 pending_task = CASE WHEN $5::boolean THEN NULL \
                                     ELSE COALESCE($3::uuid, pending_task) END, \
                 updated_at = $4 WHERE run_id = $1"
            ),
            close: format!(
                "UPDATE {runs} SET status = $2, result = $3, error = $4, continued_to = $5, \
                 pending_task = NULL, closed_at = $6, updated_at = $6 WHERE run_id = $1"
            ),
            purge_closed: format!(
                "WITH gone AS (SELECT run_id, workflow_id FROM {runs} \
                 WHERE closed_at IS NOT NULL AND closed_at < $1 AND status <> 'running' \
                 ORDER BY closed_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
                 h AS (DELETE FROM {history} WHERE run_id IN (SELECT run_id FROM gone)), \
                 m AS (DELETE FROM {markers} WHERE run_id IN (SELECT run_id FROM gone)), \
                 w AS (DELETE FROM {ids} i USING gone g \
                       WHERE i.workflow_id = g.workflow_id AND i.run_id = g.run_id) \
                 DELETE FROM {runs} r USING gone g WHERE r.run_id = g.run_id"
            ),
            cancel_ids: format!(
                "UPDATE {tasks} SET state = 'cancelled', updated_at = $2, finished_at = $2, \
                 lease_expires_at = NULL, last_error = '{why}' \
                 WHERE id = ANY($1::uuid[]) AND state IN {LIVE} RETURNING id"
            ),
            // Every live task keyed under the run's prefix, in both workflow queues: keys in
            // [`$1`, `$2`) compared byte by byte (`~>=~`, `~<~`: no collation), which the
            // partial index `tasks_workflow_key` (migration 5) serves; its predicate is
            // repeated here word for word, so the planner can use it.
            cancel_run_tasks: format!(
                "UPDATE {tasks} SET state = 'cancelled', updated_at = $3, finished_at = $3, \
                 lease_expires_at = NULL, last_error = '{why}' \
                 WHERE queue IN ('{WORKFLOW_QUEUE}', '{ACTIVITY_QUEUE}') AND key IS NOT NULL \
                 AND state IN {LIVE} AND key ~>=~ $1 AND key ~<~ $2 RETURNING id"
            ),
            // The same in a namespace's workflow queues ($4, $5; see
            // `sundial_core::namespace`), which the partial index above does not cover: the
            // index of keys `tasks_key_id` (`text_pattern_ops`) serves the key range.
            cancel_run_tasks_in: format!(
                "UPDATE {tasks} SET state = 'cancelled', updated_at = $3, finished_at = $3, \
                 lease_expires_at = NULL, last_error = '{why}' \
                 WHERE queue IN ($4, $5) AND key IS NOT NULL \
                 AND state IN {LIVE} AND key ~>=~ $1 AND key ~<~ $2 RETURNING id"
            ),
            list: format!(
                "SELECT {rc} FROM {ids} w JOIN {runs} r ON r.run_id = w.run_id \
                 WHERE ($1::text IS NULL OR w.workflow_id > $1::text) \
                 AND ($2::text IS NULL OR r.workflow_type = $2::text) \
                 AND ($3::text IS NULL OR r.status = $3::text) \
                 AND ($5::text IS NULL OR starts_with(w.workflow_id, $5::text)) \
                 AND (NOT $6::boolean OR strpos(w.workflow_id, chr(31)) = 0) \
                 ORDER BY w.workflow_id LIMIT $4"
            ),
        }
    }
}

/// The columns of `schedules`, in the order `schedules::schedule_from_row` reads them.
const SCHEDULE_COLUMNS: &str = "id, def, paused, note, next_fire_at, armed_tick, last_task, \
    last_fire_at, fired, skipped, missed, created_at, updated_at";

/// The columns of `schedule_fires`, in the order `schedules::fire_from_row` reads them.
const FIRE_COLUMNS: &str =
    "schedule_id, nominal_at, outcome, reason, task_id, count, through, recorded_at";

impl ClusterSql {
    fn new(s: &str) -> Self {
        ClusterSql {
            shard_count_propose: format!(
                "INSERT INTO {s}.cluster_meta (singleton, shard_count) VALUES (true, $1) \
                 ON CONFLICT (singleton) DO NOTHING"
            ),
            shard_count: format!("SELECT shard_count FROM {s}.cluster_meta WHERE singleton"),
            // The row written by this statement is not in its own snapshot: it is returned by
            // the insert and added to the others.
            heartbeat: format!(
                "WITH me AS (INSERT INTO {s}.nodes AS n (node, heartbeat_at) VALUES ($1, $2) \
                     ON CONFLICT (node) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at \
                     RETURNING n.node, n.heartbeat_at) \
                 SELECT node, heartbeat_at FROM me WHERE heartbeat_at >= $3 \
                 UNION ALL \
                 SELECT node, heartbeat_at FROM {s}.nodes WHERE heartbeat_at >= $3 AND node <> $1 \
                 ORDER BY 1"
            ),
            leave: format!("DELETE FROM {s}.nodes WHERE node = $1"),
            members: format!(
                "SELECT node, heartbeat_at FROM {s}.nodes ORDER BY node COLLATE \"C\""
            ),
            leases: format!(
                "SELECT shard, owner, expires_at, range_id FROM {s}.shard_leases ORDER BY shard"
            ),
            // One statement decides: a new row, or an update whose WHERE is evaluated on the
            // latest version of the row under its lock (so of two acquirers one wins). The
            // fencing number moves whenever the holder changes (a released lease has no holder,
            // so even its previous owner gets a new number).
            acquire: format!(
                "INSERT INTO {s}.shard_leases AS l (shard, owner, expires_at, range_id) \
                 VALUES ($1, $2, $4, 1) \
                 ON CONFLICT (shard) DO UPDATE SET owner = EXCLUDED.owner, \
                 expires_at = EXCLUDED.expires_at, \
                 range_id = CASE WHEN l.owner = EXCLUDED.owner THEN l.range_id \
                                 ELSE l.range_id + 1 END \
                 WHERE l.owner IS NULL OR l.owner = EXCLUDED.owner OR l.expires_at < $3 \
                 RETURNING l.range_id"
            ),
            // The same decision per row; rows are written in shard order, so two nodes
            // acquiring overlapping sets wait for each other in one order only.
            acquire_many: format!(
                "INSERT INTO {s}.shard_leases AS l (shard, owner, expires_at, range_id) \
                 SELECT u.shard, $2::text, $4::bigint, 1 \
                 FROM unnest($1::bigint[]) AS u(shard) ORDER BY u.shard \
                 ON CONFLICT (shard) DO UPDATE SET owner = EXCLUDED.owner, \
                 expires_at = EXCLUDED.expires_at, \
                 range_id = CASE WHEN l.owner = EXCLUDED.owner THEN l.range_id \
                                 ELSE l.range_id + 1 END \
                 WHERE l.owner IS NULL OR l.owner = EXCLUDED.owner OR l.expires_at < $3::bigint \
                 RETURNING l.shard, l.range_id"
            ),
            // Bumping the number on release kills the released fence at once: a write still
            // in flight with it either committed before (the release waited for its share lock)
            // or is refused.
            release: format!(
                "UPDATE {s}.shard_leases SET owner = NULL, expires_at = 0, range_id = range_id + 1 \
                 WHERE shard = $1 AND owner = $2 AND range_id = $3"
            ),
            fence: format!("SELECT range_id FROM {s}.shard_leases WHERE shard = $1 FOR SHARE"),
            lock_fences: format!(
                "SELECT shard, range_id FROM {s}.shard_leases WHERE shard = ANY($1::bigint[]) \
                 ORDER BY shard FOR SHARE"
            ),
            notify: "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p".to_string(),
            database_time: "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                .to_string(),
        }
    }
}

impl ScheduleSql {
    fn new(s: &str) -> Self {
        let sc = SCHEDULE_COLUMNS;
        let scs = sc
            .split(", ")
            .map(|c| format!("s.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let fc = FIRE_COLUMNS;
        let schedules = format!("{s}.schedules");
        let fires = format!("{s}.schedule_fires");
        ScheduleSql {
            get: format!("SELECT {sc} FROM {schedules} WHERE id = $1"),
            for_fire: format!(
                "SELECT {scs}, t.id, t.state, t.attempt FROM {schedules} s \
                 LEFT JOIN {s}.tasks t ON t.id = s.last_task WHERE s.id = ANY($1::text[])"
            ),
            columns: sc.split(", ").count(),
            stranded: {
                let cols = &scs;
                format!(
                    "SELECT {cols} FROM {schedules} s LEFT JOIN {s}.tasks t ON t.id = s.armed_tick \
                     WHERE s.id > $1 AND s.armed_tick IS NOT NULL \
                     AND (t.id IS NULL OR t.state IN ('succeeded', 'dead', 'cancelled')) \
                     ORDER BY s.id LIMIT $2"
                )
            },
            lock: format!("SELECT {sc} FROM {schedules} WHERE id = $1 FOR UPDATE"),
            create: format!(
                "INSERT INTO {schedules} (id, def, paused, note, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (id) DO NOTHING RETURNING {sc}"
            ),
            list: format!("SELECT {sc} FROM {schedules} WHERE id > $1 ORDER BY id LIMIT $2"),
            // `strpos` compares bytes (case-sensitive), as `str::contains` does, in the id as
            // its namespace knows it (`substr` from $5); the walk of the primary key (ids
            // `COLLATE "C"`: byte order), within the namespace's range of ids ($1, $6), stops at
            // the limit's matches. The default namespace's ids have no chr(31).
            search: format!(
                "SELECT {sc} FROM {schedules} WHERE id > $1 \
                 AND ($6::text IS NULL OR id < $6) AND strpos(substr(id, $5), $3) > 0 \
                 AND ($4::boolean IS NULL OR paused = $4) \
                 AND (NOT $7::boolean OR strpos(id, chr(31)) = 0) ORDER BY id LIMIT $2"
            ),
            set_arm: format!(
                "UPDATE {schedules} SET next_fire_at = $2, armed_tick = $3 WHERE id = $1 \
                 RETURNING {sc}"
            ),
            update_def: format!(
                "UPDATE {schedules} SET def = $2, updated_at = $3, \
                 next_fire_at = CASE WHEN $4::boolean THEN $5::bigint ELSE next_fire_at END, \
                 armed_tick = CASE WHEN $4::boolean THEN $6::uuid ELSE armed_tick END \
                 WHERE id = $1 RETURNING {sc}"
            ),
            after_fire: format!(
                "UPDATE {schedules} SET fired = fired + $2, skipped = skipped + $3, \
                 missed = missed + $4, last_task = COALESCE($5::uuid, last_task), \
                 last_fire_at = GREATEST(last_fire_at, $6::bigint), updated_at = $7, \
                 next_fire_at = CASE WHEN $8::boolean THEN $9::bigint ELSE next_fire_at END, \
                 armed_tick = CASE WHEN $8::boolean THEN $10::uuid ELSE armed_tick END \
                 WHERE id = $1 RETURNING {sc}"
            ),
            set_paused: format!(
                "UPDATE {schedules} SET paused = $2, note = $3, updated_at = $4 WHERE id = $1 \
                 RETURNING {sc}"
            ),
            delete: format!("DELETE FROM {schedules} WHERE id = $1 RETURNING armed_tick"),
            delete_fires: format!("DELETE FROM {fires} WHERE schedule_id = $1"),
            cancel_tick: format!(
                "UPDATE {s}.tasks SET state = 'cancelled', updated_at = $2, finished_at = $2, \
                 last_error = 'superseded: the schedule was re-armed or removed' \
                 WHERE id = $1 AND state = 'scheduled'"
            ),
            existing_fires: format!(
                "SELECT {fc} FROM {fires} WHERE schedule_id = $1 AND nominal_at = ANY($2::bigint[])"
            ),
            insert_fires: format!(
                "INSERT INTO {fires} (schedule_id, nominal_at, outcome, reason, task_id, count, \
                 through, recorded_at) \
                 SELECT $1::text, u.nominal_at, u.outcome, u.reason, u.task_id, u.count, u.through, \
                 $8::bigint \
                 FROM unnest($2::bigint[], $3::text[], $4::text[], $5::uuid[], $6::bigint[], \
                 $7::bigint[]) AS u(nominal_at, outcome, reason, task_id, count, through) \
                 ORDER BY u.nominal_at"
            ),
            list_fires: format!(
                "SELECT {fc} FROM {fires} WHERE schedule_id = $1 AND nominal_at < $2 \
                 ORDER BY nominal_at DESC LIMIT $3"
            ),
        }
    }
}

impl Sql {
    pub fn new(schema: &SchemaName) -> Self {
        let s = &schema.ident;
        let tasks = format!("{s}.tasks");
        let c = task_columns("t");
        // A failure's retry time: `$3` while attempts remain, else `NULL` (dead).
        let retry_at = "(CASE WHEN t.attempt < t.max_attempts THEN $3::bigint END)";
        // Completes the attempts `($1, $2)` with result `$3` at `$4`, each row on its own
        // condition. Never waits for a row: rows locked elsewhere are left to a call of their
        // own. The lock names no state: `state = 'running'` there let a generic plan planned
        // while few tasks ran read every running task (`tasks_state_id`) per call; without
        // it only the primary key finds the rows, and the update checks the state.
        let complete_many = format!(
            "WITH u AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bigint[]) \
                 AS u(id, execution_id, result, now)), \
             l AS (SELECT t.id, t.ctid AS tid FROM {tasks} t JOIN u ON t.id = u.id \
                 WHERE t.id = ANY ($1::uuid[]) AND t.execution_id = u.execution_id \
                 ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) \
             UPDATE {tasks} t SET state = 'succeeded', result = u.result, \
             updated_at = u.now, finished_at = u.now, lease_expires_at = NULL \
             FROM u, l \
             WHERE t.ctid = ANY (ARRAY(SELECT tid FROM l)) AND t.ctid = l.tid AND t.id = l.id \
             AND t.id = u.id AND t.state = 'running' \
             AND t.execution_id = u.execution_id"
        );
        // Fewer running tasks than `t`'s group limit hold its exclusive key.
        let free = format!(
            "(t.exclusive_key IS NULL OR (SELECT count(*) FROM {tasks} r \
             WHERE r.state = 'running' AND r.exclusive_key = t.exclusive_key) < t.exclusive_limit)"
        );
        let ready_candidates =
            [(false, false), (false, true), (true, false), (true, true)].map(|(kinds, after)| {
                format!(
                    "SELECT t.id, t.exclusive_key, {RANK_SQL}, t.rate FROM {tasks} t \
                     WHERE t.state = 'ready' AND t.queue = $1 \
                     AND (t.exclusive_key IS NULL OR (NOT (t.exclusive_key = ANY($2::text[])) \
                          AND (SELECT count(*) FROM {tasks} r WHERE r.state = 'running' \
                               AND r.exclusive_key = t.exclusive_key) < t.exclusive_limit)) \
                     AND (t.rate IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.rate_limits rl \
                          WHERE rl.key = {TAKE_KEY_SQL} AND rl.next_at > ${now})) \
                     {kinds} {after} \
                     ORDER BY {RANK_SQL}, t.id LIMIT $3 FOR UPDATE OF t SKIP LOCKED",
                    now = 4 + usize::from(kinds) + 2 * usize::from(after),
                    kinds = if kinds {
                        "AND t.kind = ANY($4::text[])"
                    } else {
                        ""
                    },
                    after = match (kinds, after) {
                        (_, false) => "",
                        (false, true) => "AND ((t.due_at - (t.priority - 5) * 60000), t.id) > ($4::bigint, $5::uuid)",
                        (true, true) => "AND ((t.due_at - (t.priority - 5) * 60000), t.id) > ($5::bigint, $6::uuid)",
                    },
                )
            });
        // Running tasks whose lease ended before `$1` (at most `$2`, `shard_filter` may narrow
        // them): back to scheduled, or dead when no attempt is left. Rows another transaction
        // holds are skipped (the next round takes them), so reapers never wait for each other.
        let expire_leases = |shard_filter: &str| {
            format!(
                "WITH expired AS (SELECT id FROM {tasks} \
                     WHERE state = 'running' AND lease_expires_at < $1 {shard_filter} \
                     ORDER BY lease_expires_at, id LIMIT $2), \
                 locked AS (SELECT t.id, t.ctid AS tid FROM {tasks} t \
                     WHERE t.id IN (SELECT id FROM expired) \
                     AND t.state = 'running' AND t.lease_expires_at < $1 \
                     ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) \
                 UPDATE {tasks} t SET \
                 state = CASE WHEN t.attempt < t.max_attempts THEN 'scheduled' ELSE 'dead' END, \
                 due_at = CASE WHEN t.attempt < t.max_attempts THEN $1::bigint ELSE t.due_at END, \
                 finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE $1::bigint END, \
                 last_error = 'lease expired: the attempt neither finished nor heartbeated in time', \
                 lease_expires_at = NULL, updated_at = $1 \
                 FROM locked WHERE t.ctid = ANY (ARRAY(SELECT tid FROM locked)) \
                 AND t.ctid = locked.tid AND t.id = locked.id RETURNING {c}"
            )
        };
        Sql {
            get: format!("SELECT {c} FROM {tasks} t WHERE t.id = $1"),
            state_of: format!("SELECT state FROM {tasks} WHERE id = $1"),
            insert: format!(
                "INSERT INTO {tasks} AS t (id, shard, queue, kind, key, payload, due_at, state, \
                 attempt, max_attempts, backoff, timeout_ms, exclusive_key, exclusive_mode, \
                 created_at, updated_at, tags, target, traceparent, tracestate, priority, \
                 exclusive_limit, rate) \
                 SELECT u.id, u.shard, u.queue, u.kind, u.key, u.payload, u.due_at, 'scheduled', 0, \
                 u.max_attempts, u.backoff, u.timeout_ms, u.exclusive_key, u.exclusive_mode, \
                 u.created_at, u.created_at, u.tags, u.target, u.traceparent, u.tracestate, \
                 u.priority, u.exclusive_limit, u.rate \
                 FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
                 $6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::bigint[], $11::text[], \
                 $12::text[], $13::bigint[], $14::bigint[], $15::text[], $16::text[], \
                 $17::text[], $18::text[], $19::smallint[], $20::int4[], $21::text[]) \
                 AS u(id, shard, queue, kind, key, payload, due_at, max_attempts, backoff, \
                 timeout_ms, exclusive_key, exclusive_mode, created_at, ord, tags, target, \
                 traceparent, tracestate, priority, exclusive_limit, rate) \
                 ORDER BY u.queue, u.key, u.ord \
                 ON CONFLICT (queue, key) WHERE key IS NOT NULL AND state IN {LIVE} DO NOTHING \
                 RETURNING {c}"
            ),
            holders: format!(
                "SELECT t.queue, t.key, t.id FROM {tasks} t \
                 JOIN unnest($1::text[], $2::text[]) AS u(queue, key) \
                 ON t.queue = u.queue AND t.key = u.key \
                 WHERE t.key IS NOT NULL AND t.state IN {LIVE}"
            ),
            scan_due_from_start: format!(
                "SELECT t.due_at, t.id, t.queue, t.kind, t.timeout_ms, t.target::json ->> 'url', \
                 t.priority FROM {tasks} t \
                 WHERE t.state = 'scheduled' AND t.shard = $1 AND t.due_at <= $2 \
                 ORDER BY t.due_at, t.id LIMIT $3"
            ),
            scan_due_after: format!(
                "SELECT t.due_at, t.id, t.queue, t.kind, t.timeout_ms, t.target::json ->> 'url', \
                 t.priority FROM {tasks} t \
                 WHERE t.state = 'scheduled' AND t.shard = $1 AND t.due_at <= $2 \
                 AND (t.due_at, t.id) > ($3::bigint, $4::uuid) \
                 ORDER BY t.due_at, t.id LIMIT $5"
            ),
            next_due_from_start: format!(
                "SELECT t.due_at FROM {tasks} t WHERE t.state = 'scheduled' AND t.shard = $1 \
                 ORDER BY t.due_at, t.id LIMIT 1"
            ),
            next_due_after: format!(
                "SELECT t.due_at FROM {tasks} t WHERE t.state = 'scheduled' AND t.shard = $1 \
                 AND (t.due_at, t.id) > ($2::bigint, $3::uuid) ORDER BY t.due_at, t.id LIMIT 1"
            ),
            exclusive_keys_of: format!(
                "SELECT DISTINCT exclusive_key FROM {tasks} \
                 WHERE id = ANY($1::uuid[]) AND exclusive_key IS NOT NULL"
            ),
            lock_keys: "SELECT pg_advisory_xact_lock($1::int4, k) FROM unnest($2::int4[]) AS k"
                .to_string(),
            rate_next: format!(
                "SELECT key, next_at FROM {s}.rate_limits WHERE key = ANY($1::text[])"
            ),
            rate_taken: format!(
                "INSERT INTO {s}.rate_limits (key, next_at) \
                 SELECT * FROM unnest($1::text[], $2::bigint[]) \
                 ON CONFLICT (key) DO UPDATE SET next_at = excluded.next_at"
            ),
            // Column 6: the queue's concurrency limit (`QueueConfig::concurrency`), if any.
            lock_claimable: format!(
                "SELECT t.id, t.exclusive_key, t.exclusive_mode, t.exclusive_limit, t.queue, t.rate, \
                 (q.config::jsonb->>'concurrency')::int4 \
                 FROM {tasks} t LEFT JOIN {s}.queue_settings q ON q.queue = t.queue \
                 WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $2 \
                 ORDER BY t.id FOR UPDATE OF t"
            ),
            lock_claimable_in_shard: format!(
                "SELECT t.id, t.exclusive_key, t.exclusive_mode, t.exclusive_limit, t.queue, t.rate, \
                 (q.config::jsonb->>'concurrency')::int4 \
                 FROM {tasks} t LEFT JOIN {s}.queue_settings q ON q.queue = t.queue \
                 WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $2 \
                 AND t.shard = $3 ORDER BY t.id FOR UPDATE OF t"
            ),
            running_queues: format!(
                "SELECT queue, count(*) FROM {tasks} \
                 WHERE state = 'running' AND queue = ANY($1::text[]) GROUP BY queue"
            ),
            lock_queue_limit: format!(
                "SELECT l.lim FROM (SELECT (config::jsonb->>'concurrency')::int4 AS lim \
                     FROM {s}.queue_settings WHERE queue = $1) l, \
                 LATERAL (SELECT pg_advisory_xact_lock($2::int4, $3::int4) WHERE l.lim IS NOT NULL) x"
            ),
            running_keys: format!(
                "SELECT exclusive_key, count(*) FROM {tasks} \
                 WHERE state = 'running' AND exclusive_key = ANY($1::text[]) \
                 GROUP BY exclusive_key"
            ),
            // No key check here: `Ready` claims take no key locks, so a holder committed since
            // the decision could otherwise turn a decided `Readied` into a refusal, and a ready
            // task holds no key anyway (`claim_ready` checks again before it starts).
            ready_claimed: format!(
                "UPDATE {tasks} t SET state = 'ready', updated_at = $2 \
                 WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $2 \
                 RETURNING {c}"
            ),
            // `t.id = ANY ($1)` beside the join: the primary key finds the rows whatever a
            // generic plan makes of the unnest's row count.
            ready_each: format!(
                "UPDATE {tasks} t SET state = 'ready', updated_at = u.now \
                 FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS u(id, now, shard) \
                 WHERE t.id = ANY ($1::uuid[]) AND t.id = u.id AND t.state = 'scheduled' \
                 AND t.due_at <= u.now AND (u.shard IS NULL OR t.shard = u.shard) \
                 RETURNING {c}"
            ),
            start_claimed: format!(
                "UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                 execution_id = u.execution_id, lease_expires_at = u.lease_until, \
                 started_at = $4, updated_at = $4, worker = u.worker \
                 FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $5::text[]) \
                 AS u(id, execution_id, lease_until, worker) \
                 WHERE t.id = u.id AND t.state = 'scheduled' AND t.due_at <= $4 AND {free} \
                 RETURNING {c}"
            ),
            start_plain: format!(
                "WITH fence AS (SELECT 1 FROM {s}.shard_leases \
                     WHERE $6::bigint IS NOT NULL AND shard = $6 AND range_id = $7 FOR SHARE), \
                 cand AS (SELECT t.id FROM {tasks} t \
                     WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $4 \
                     AND t.exclusive_key IS NULL AND t.rate IS NULL \
                     AND ($6::bigint IS NULL OR (t.shard = $6 AND EXISTS (SELECT 1 FROM fence))) \
                     AND NOT EXISTS (SELECT 1 FROM {s}.queue_settings q WHERE q.queue = t.queue \
                         AND (q.config::jsonb->>'concurrency') IS NOT NULL) \
                     ORDER BY t.id FOR UPDATE OF t), \
                 started AS (UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                     execution_id = u.execution_id, lease_expires_at = u.lease_until, \
                     started_at = $4, updated_at = $4, worker = u.worker \
                     FROM cand JOIN unnest($1::uuid[], $2::uuid[], $3::bigint[], $5::text[]) \
                     AS u(id, execution_id, lease_until, worker) ON u.id = cand.id \
                     WHERE t.id = cand.id RETURNING {c}), \
                 aud AS (INSERT INTO {s}.audit_log ({cols}) SELECT {cols} FROM {group} \
                     WHERE EXISTS (SELECT 1 FROM started) ORDER BY a.ord RETURNING seq) \
                 SELECT started.*, ($6::bigint IS NULL OR EXISTS (SELECT 1 FROM fence)), \
                     (SELECT array_agg(seq ORDER BY seq) FROM aud) \
                 FROM (SELECT 1) one LEFT JOIN started ON true",
                cols = crate::access::AUDIT_INSERT_COLUMNS,
                group = crate::access::audit_group_sql(8),
            ),
            skip_claimed: format!(
                "UPDATE {tasks} t SET state = 'cancelled', updated_at = $3, finished_at = $3, \
                 last_error = u.reason \
                 FROM unnest($1::uuid[], $2::text[]) AS u(id, reason) \
                 WHERE t.id = u.id AND t.state = 'scheduled' RETURNING {c}"
            ),
            ready_candidates,
            next_take_turn: format!(
                "SELECT min(rl.next_at) FROM {tasks} t JOIN {s}.rate_limits rl \
                 ON rl.key = {TAKE_KEY_SQL} \
                 WHERE t.state = 'ready' AND t.queue = $1 AND t.rate IS NOT NULL \
                 AND rl.next_at > $2"
            ),
            try_lock_keys: "SELECT u.key FROM unnest($2::text[], $3::int4[]) AS u(key, lock) \
                 WHERE pg_try_advisory_xact_lock($1::int4, u.lock)"
                .to_string(),
            claim_plain: [false, true].map(|kinds| {
                format!(
                    "WITH lim AS (SELECT 1 FROM {s}.queue_settings \
                         WHERE queue = $1 AND (config::jsonb->>'concurrency') IS NOT NULL), \
                     cand AS (SELECT t.id, t.ctid AS tid, \
                         (t.exclusive_key IS NULL AND t.rate IS NULL) AS plain \
                         FROM {tasks} t WHERE t.state = 'ready' AND t.queue = $1 {kinds} \
                         AND NOT EXISTS (SELECT 1 FROM lim) \
                         ORDER BY {RANK_SQL}, t.id LIMIT $2 FOR UPDATE OF t SKIP LOCKED), \
                     pick AS (SELECT id, tid, row_number() OVER (ORDER BY id) AS n \
                         FROM cand WHERE plain), \
                     started AS (UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                         execution_id = ($3::uuid[])[pick.n::int4], \
                         lease_expires_at = GREATEST($4::bigint, t.due_at) + t.timeout_ms, \
                         started_at = GREATEST($4::bigint, t.due_at), \
                         updated_at = GREATEST($4::bigint, t.due_at), \
                         worker = ($5::text[])[pick.n::int4] \
                         FROM pick WHERE t.ctid = ANY (ARRAY(SELECT tid FROM pick)) \
                         AND t.ctid = pick.tid AND t.id = pick.id \
                         AND t.state = 'ready' RETURNING {c}), \
                     aud AS (INSERT INTO {s}.audit_log ({cols}) SELECT {cols} FROM {group} \
                         WHERE a.link IN (SELECT execution_id FROM started) \
                         ORDER BY a.ord RETURNING seq) \
                     SELECT started.*, EXISTS (SELECT 1 FROM lim), \
                         (SELECT count(*) FROM cand WHERE NOT plain), \
                         (SELECT array_agg(seq ORDER BY seq) FROM aud) \
                     FROM (SELECT 1) one LEFT JOIN started ON true",
                    kinds = if kinds {
                        "AND t.kind = ANY($6::text[])"
                    } else {
                        ""
                    },
                    cols = crate::access::AUDIT_INSERT_COLUMNS,
                    group = crate::access::audit_group_sql(if kinds { 7 } else { 6 }),
                )
            }),
            start_ready: format!(
                "WITH pick AS (SELECT t.id, row_number() OVER (ORDER BY t.id) AS n FROM {tasks} t \
                     WHERE t.id = ANY($1::uuid[]) AND t.state = 'ready' AND {free}) \
                 UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                 execution_id = ($2::uuid[])[pick.n::int4], \
                 lease_expires_at = GREATEST($3::bigint, t.due_at) + t.timeout_ms, \
                 started_at = GREATEST($3::bigint, t.due_at), updated_at = GREATEST($3::bigint, t.due_at), \
                 worker = ($4::text[])[pick.n::int4] \
                 FROM pick WHERE t.id = pick.id RETURNING {c}"
            ),
            heartbeat: format!(
                "UPDATE {tasks} t SET \
                 lease_expires_at = GREATEST(t.lease_expires_at, $3::bigint + t.timeout_ms), \
                 updated_at = $3 \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            complete: format!(
                "UPDATE {tasks} t SET state = 'succeeded', result = $3, updated_at = $4, \
                 finished_at = $4, lease_expires_at = NULL \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            // Never waits for a row: rows locked elsewhere are left to a call of their own.
            complete_many: format!("{complete_many} RETURNING {c}"),
            complete_many_audited: format!(
                "WITH done AS ({complete_many} RETURNING {c}), \
                 aud AS (INSERT INTO {s}.audit_log ({cols}) SELECT {cols} FROM {group} \
                     WHERE a.link IN (SELECT id FROM done) ORDER BY a.ord RETURNING seq) \
                 SELECT done.*, (SELECT array_agg(seq ORDER BY seq) FROM aud) FROM done",
                cols = crate::access::AUDIT_INSERT_COLUMNS,
                group = crate::access::audit_group_sql(5),
            ),
            fail: format!(
                "UPDATE {tasks} t SET \
                 state = CASE WHEN {retry_at} IS NULL THEN 'dead' ELSE 'scheduled' END, \
                 due_at = COALESCE({retry_at}, t.due_at), last_error = $4, updated_at = $5, \
                 finished_at = CASE WHEN {retry_at} IS NULL THEN $5::bigint ELSE NULL END, \
                 lease_expires_at = NULL \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            running_attempt: format!(
                "SELECT {c} FROM {tasks} t WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2"
            ),
            cancel: format!(
                "UPDATE {tasks} t SET state = 'cancelled', updated_at = $2, finished_at = $2, \
                 lease_expires_at = NULL WHERE t.id = $1 AND t.state IN {LIVE} RETURNING {c}"
            ),
            trigger: format!(
                "UPDATE {tasks} t SET due_at = LEAST(t.due_at, $2::bigint), updated_at = $2 \
                 WHERE t.id = $1 AND t.state = 'scheduled' RETURNING {c}"
            ),
            expire_leases: expire_leases(""),
            expire_leases_in_shard: expire_leases("AND shard = $3"),
            next_lease_expiry: format!(
                "SELECT min(lease_expires_at) FROM {tasks} WHERE state = 'running'"
            ),
            next_lease_expiry_in_shard: format!(
                "SELECT min(lease_expires_at) FROM {tasks} WHERE state = 'running' AND shard = $1"
            ),
            fold_counts: format!(
                "WITH gone AS (SELECT c.queue, c.state, c.stripe FROM {s}.task_counts c \
                     WHERE c.stripe <> 0 AND NOT EXISTS \
                     (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = c.stripe) \
                     FOR UPDATE OF c SKIP LOCKED), \
                 taken AS (DELETE FROM {s}.task_counts c USING gone g \
                     WHERE c.queue = g.queue AND c.state = g.state AND c.stripe = g.stripe \
                     RETURNING c.queue, c.state, c.n) \
                 INSERT INTO {s}.task_counts AS c (queue, state, stripe, n) \
                 SELECT queue, state, 0, sum(n) FROM taken GROUP BY queue, state \
                 ORDER BY queue, state \
                 ON CONFLICT (queue, state, stripe) DO UPDATE SET n = c.n + EXCLUDED.n"
            ),
            count_by_state: format!(
                "SELECT queue, state, sum(n)::bigint FROM {s}.task_counts \
                 GROUP BY queue, state HAVING sum(n) <> 0 ORDER BY queue, state"
            ),
            dead_groups: format!(
                "SELECT queue, g, n, newest FROM (SELECT queue, {g} AS g, count(*)::bigint AS n, \
                 max(id::text COLLATE \"C\")::uuid AS newest \
                 FROM {tasks} WHERE state = 'dead' AND ($1::text IS NULL OR queue = $1) \
                 AND ($3::text IS NULL OR starts_with(queue, $3)) \
                 AND (NOT $4::bool OR strpos(queue, chr(31)) = 0) \
                 GROUP BY queue, {g}) d \
                 ORDER BY n DESC, queue COLLATE \"C\", g IS NOT NULL, g COLLATE \"C\" LIMIT $2",
                g = ERROR_GROUP_SQL
            ),
            insert_tags: format!(
                "INSERT INTO {s}.task_tags (key, value, task_id) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[])"
            ),
            columns: c,
            tasks_statistics: format!(
                "SELECT EXTRACT(EPOCH FROM now() - GREATEST(st.last_analyze, st.last_autoanalyze))::float8, \
                 c.reltuples::float8, COALESCE(st.n_mod_since_analyze, 0)::int8, \
                 (SELECT count(*) FROM (SELECT 1 FROM {tasks} LIMIT {first}) f)::int8 \
                 FROM pg_class c LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid \
                 WHERE c.oid = '{tasks}'::regclass",
                first = crate::statistics::FIRST_ROWS,
            ),
            analyze_tasks: format!("ANALYZE {tasks}"),
            tasks,
            cluster: ClusterSql::new(s),
            schedules: ScheduleSql::new(s),
            workflows: WorkflowSql::new(s),
            push: crate::push::PushSql::new(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TAKE_KEY_SQL;
    use sundial_core::RateLimit;

    #[tokio::test]
    async fn the_take_key_in_sql_is_the_rust_one() {
        let Some(url) = crate::testkit::database_url() else {
            return;
        };
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(conn);
        for key in [Some("acme:smtp".to_string()), None] {
            let rate = RateLimit {
                key,
                limit: 3,
                per_ms: 1_000,
            };
            let json = serde_json::to_string(&rate).expect("encode");
            let row = client
                .query_one(
                    &format!(
                        "SELECT {TAKE_KEY_SQL} FROM (VALUES ($1::text, $2::text)) AS t(rate, queue)"
                    ),
                    &[&json, &"mail"],
                )
                .await
                .expect("query");
            let in_sql: String = row.get(0);
            assert_eq!(in_sql, rate.take_key("mail"), "{json}");
        }
    }
}
