//! Every statement the store runs, written once per store with the schema name filled in.
//!
//! No statement reads a clock (`now()`, `CURRENT_TIMESTAMP`, `clock_timestamp()`): every time is
//! a parameter handed in by the caller, so the engine's clock alone decides what is due.

use crate::rows::task_columns;
use crate::schema::SchemaName;

/// Live states: the ones that hold a business key.
const LIVE: &str = "('scheduled', 'ready', 'running')";

pub(crate) struct Sql {
    pub tasks: String,
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
    pub lock_claimable: String,
    pub running_keys: String,
    pub ready_claimed: String,
    pub start_claimed: String,
    pub skip_claimed: String,
    /// Indexed by `kinds filter as usize * 2 + after cursor as usize`.
    pub ready_candidates: [String; 4],
    pub try_lock_keys: String,
    pub start_ready: String,
    pub heartbeat: String,
    pub complete: String,
    pub fail: String,
    pub cancel: String,
    pub trigger: String,
    pub expire_leases: String,
    pub next_lease_expiry: String,
    pub fold_counts: String,
    pub count_by_state: String,
    /// The task columns qualified with `t.`, for `list`.
    pub columns: String,
}

impl Sql {
    pub fn new(schema: &SchemaName) -> Self {
        let s = &schema.ident;
        let tasks = format!("{s}.tasks");
        let c = task_columns("t");
        // No running task holds the exclusive key of `t`.
        let free = format!(
            "(t.exclusive_key IS NULL OR NOT EXISTS (SELECT 1 FROM {tasks} r \
             WHERE r.state = 'running' AND r.exclusive_key = t.exclusive_key))"
        );
        let ready_candidates =
            [(false, false), (false, true), (true, false), (true, true)].map(|(kinds, after)| {
                format!(
                    "SELECT t.id, t.exclusive_key FROM {tasks} t \
                     WHERE t.state = 'ready' AND t.queue = $1 \
                     AND (t.exclusive_key IS NULL OR (NOT (t.exclusive_key = ANY($2::text[])) \
                          AND NOT EXISTS (SELECT 1 FROM {tasks} r WHERE r.state = 'running' \
                                          AND r.exclusive_key = t.exclusive_key))) \
                     {kinds} {after} \
                     ORDER BY t.id LIMIT $3 FOR UPDATE OF t SKIP LOCKED",
                    kinds = if kinds {
                        "AND t.kind = ANY($4::text[])"
                    } else {
                        ""
                    },
                    after = match (kinds, after) {
                        (_, false) => "",
                        (false, true) => "AND t.id > $4::uuid",
                        (true, true) => "AND t.id > $5::uuid",
                    },
                )
            });
        Sql {
            get: format!("SELECT {c} FROM {tasks} t WHERE t.id = $1"),
            state_of: format!("SELECT state FROM {tasks} WHERE id = $1"),
            insert: format!(
                "INSERT INTO {tasks} AS t (id, shard, queue, kind, key, payload, due_at, state, \
                 attempt, max_attempts, backoff, timeout_ms, exclusive_key, exclusive_mode, \
                 created_at, updated_at) \
                 SELECT u.id, u.shard, u.queue, u.kind, u.key, u.payload, u.due_at, 'scheduled', 0, \
                 u.max_attempts, u.backoff, u.timeout_ms, u.exclusive_key, u.exclusive_mode, \
                 u.created_at, u.created_at \
                 FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[], \
                 $6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::bigint[], $11::text[], \
                 $12::text[], $13::bigint[], $14::bigint[]) \
                 AS u(id, shard, queue, kind, key, payload, due_at, max_attempts, backoff, \
                 timeout_ms, exclusive_key, exclusive_mode, created_at, ord) \
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
                "SELECT t.due_at, t.id, t.queue, t.kind, t.timeout_ms FROM {tasks} t \
                 WHERE t.state = 'scheduled' AND t.shard = $1 AND t.due_at <= $2 \
                 ORDER BY t.due_at, t.id LIMIT $3"
            ),
            scan_due_after: format!(
                "SELECT t.due_at, t.id, t.queue, t.kind, t.timeout_ms FROM {tasks} t \
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
            lock_claimable: format!(
                "SELECT t.id, t.exclusive_key, t.exclusive_mode FROM {tasks} t \
                 WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $2 \
                 ORDER BY t.id FOR UPDATE OF t"
            ),
            running_keys: format!(
                "SELECT DISTINCT exclusive_key FROM {tasks} \
                 WHERE state = 'running' AND exclusive_key = ANY($1::text[])"
            ),
            // No key check here: `Ready` claims take no key locks, so a holder committed since
            // the decision could otherwise turn a decided `Readied` into a refusal, and a ready
            // task holds no key anyway (`claim_ready` checks again before it starts).
            ready_claimed: format!(
                "UPDATE {tasks} t SET state = 'ready', updated_at = $2 \
                 WHERE t.id = ANY($1::uuid[]) AND t.state = 'scheduled' AND t.due_at <= $2 \
                 RETURNING {c}"
            ),
            start_claimed: format!(
                "UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                 execution_id = u.execution_id, lease_expires_at = u.lease_until, \
                 started_at = $4, updated_at = $4, worker = NULL \
                 FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) \
                 AS u(id, execution_id, lease_until) \
                 WHERE t.id = u.id AND t.state = 'scheduled' AND t.due_at <= $4 AND {free} \
                 RETURNING {c}"
            ),
            skip_claimed: format!(
                "UPDATE {tasks} t SET state = 'cancelled', updated_at = $3, finished_at = $3, \
                 last_error = u.reason \
                 FROM unnest($1::uuid[], $2::text[]) AS u(id, reason) \
                 WHERE t.id = u.id AND t.state = 'scheduled' RETURNING {c}"
            ),
            ready_candidates,
            try_lock_keys: "SELECT u.key FROM unnest($2::text[], $3::int4[]) AS u(key, lock) \
                 WHERE pg_try_advisory_xact_lock($1::int4, u.lock)"
                .to_string(),
            start_ready: format!(
                "WITH pick AS (SELECT t.id, row_number() OVER (ORDER BY t.id) AS n FROM {tasks} t \
                     WHERE t.id = ANY($1::uuid[]) AND t.state = 'ready' AND {free}) \
                 UPDATE {tasks} t SET state = 'running', attempt = t.attempt + 1, \
                 execution_id = ($2::uuid[])[pick.n::int4], \
                 lease_expires_at = $3::bigint + t.timeout_ms, started_at = $3, updated_at = $3, \
                 worker = $4 \
                 FROM pick WHERE t.id = pick.id RETURNING {c}"
            ),
            heartbeat: format!(
                "UPDATE {tasks} t SET lease_expires_at = GREATEST(t.lease_expires_at, $3::bigint), \
                 updated_at = $4 \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            complete: format!(
                "UPDATE {tasks} t SET state = 'succeeded', result = $3, updated_at = $4, \
                 finished_at = $4, lease_expires_at = NULL \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            fail: format!(
                "UPDATE {tasks} t SET \
                 state = CASE WHEN $3::bigint IS NULL THEN 'dead' ELSE 'scheduled' END, \
                 due_at = COALESCE($3::bigint, t.due_at), last_error = $4, updated_at = $5, \
                 finished_at = CASE WHEN $3::bigint IS NULL THEN $5::bigint ELSE NULL END, \
                 lease_expires_at = NULL \
                 WHERE t.id = $1 AND t.state = 'running' AND t.execution_id = $2 RETURNING {c}"
            ),
            cancel: format!(
                "UPDATE {tasks} t SET state = 'cancelled', updated_at = $2, finished_at = $2, \
                 lease_expires_at = NULL WHERE t.id = $1 AND t.state IN {LIVE} RETURNING {c}"
            ),
            trigger: format!(
                "UPDATE {tasks} t SET due_at = LEAST(t.due_at, $2::bigint), updated_at = $2 \
                 WHERE t.id = $1 AND t.state = 'scheduled' RETURNING {c}"
            ),
            expire_leases: format!(
                "WITH expired AS (SELECT id FROM {tasks} \
                     WHERE state = 'running' AND lease_expires_at < $1 \
                     ORDER BY lease_expires_at, id LIMIT $2), \
                 locked AS (SELECT t.id FROM {tasks} t \
                     WHERE t.id IN (SELECT id FROM expired) \
                     AND t.state = 'running' AND t.lease_expires_at < $1 \
                     ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) \
                 UPDATE {tasks} t SET \
                 state = CASE WHEN t.attempt < t.max_attempts THEN 'scheduled' ELSE 'dead' END, \
                 due_at = CASE WHEN t.attempt < t.max_attempts THEN $1::bigint ELSE t.due_at END, \
                 finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE $1::bigint END, \
                 last_error = 'lease expired: the attempt neither finished nor heartbeated in time', \
                 lease_expires_at = NULL, updated_at = $1 \
                 FROM locked WHERE t.id = locked.id RETURNING {c}"
            ),
            next_lease_expiry: format!(
                "SELECT min(lease_expires_at) FROM {tasks} WHERE state = 'running'"
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
            columns: c,
            tasks,
        }
    }
}
