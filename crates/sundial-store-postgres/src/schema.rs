//! The schema, its numbered migrations, and the runner that applies them.
//!
//! Every object lives in one PostgreSQL schema whose name is configurable
//! ([`crate::PostgresOptions::schema`]), so several Sundial deployments (or test runs) can share a
//! database. The runner works in one transaction: it takes a transaction-scoped advisory lock
//! derived from the schema name, creates the schema if it is missing, reads the versions recorded
//! in `<schema>.schema_migrations`, refuses a schema newer than this build, applies the missing
//! migrations in order and records them, then commits. Nodes that start together therefore queue
//! on the lock and the later ones find nothing left to do; a runner that fails leaves nothing
//! behind (DDL is transactional in PostgreSQL).
//!
//! SQL text is schema-qualified rather than relying on a per-connection `search_path`: a pooled
//! connection carries no state that could be lost (a reconnect, a transaction-mode pooler) or
//! point at the wrong schema, and every statement names exactly the table it touches. The schema
//! name is validated (lower-case letters, digits and `_`) and always quoted, so it can be
//! interpolated safely.

use deadpool_postgres::GenericClient;

use crate::PostgresError;

/// The advisory-lock class (first key of the two-key form) of the migration lock. The second key
/// is a hash of the schema name, so deployments in different schemas do not wait for each other.
pub(crate) const MIGRATION_LOCK_CLASS: i32 = 0x5355_4e44; // "SUND"
/// The advisory-lock class of exclusive keys (see `claim_due` and `claim_ready`).
pub(crate) const EXCLUSIVE_LOCK_CLASS: i32 = 0x5355_4e58; // "SUNX"
/// The advisory-lock class of rate limit keys (see `claim_due`).
pub(crate) const RATE_LOCK_CLASS: i32 = 0x5355_4e52; // "SUNR"
/// The advisory-lock class of queues with a concurrency limit (see `claim_due` and
/// `claim_ready`): every start of such a queue's tasks holds it until its commit.
pub(crate) const QUEUE_LOCK_CLASS: i32 = 0x5355_4e51; // "SUNQ"

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`).
const MAX_IDENTIFIER_LEN: usize = 63;

/// One numbered migration. `{schema}` in the SQL stands for the quoted schema name.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "tasks, indexes and counters",
        sql: r#"
CREATE TABLE {schema}.tasks (
    id               uuid   NOT NULL PRIMARY KEY,
    shard            bigint NOT NULL CHECK (shard >= 0),
    queue            text   NOT NULL,
    kind             text   NOT NULL,
    key              text,
    payload          text   NOT NULL,
    due_at           bigint NOT NULL,
    state            text   NOT NULL CHECK (state IN
                         ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled')),
    attempt          bigint NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     bigint NOT NULL CHECK (max_attempts >= 1),
    backoff          text   NOT NULL,
    timeout_ms       bigint NOT NULL CHECK (timeout_ms >= 0),
    exclusive_key    text,
    exclusive_mode   text   CHECK (exclusive_mode IN ('wait', 'skip')),
    execution_id     uuid,
    lease_expires_at bigint,
    worker           text,
    last_error       text,
    result           text,
    created_at       bigint NOT NULL,
    updated_at       bigint NOT NULL,
    started_at       bigint,
    finished_at      bigint,
    CONSTRAINT tasks_exclusive_pair CHECK ((exclusive_key IS NULL) = (exclusive_mode IS NULL)),
    CONSTRAINT tasks_running_attempt CHECK
        (state <> 'running' OR (execution_id IS NOT NULL AND lease_expires_at IS NOT NULL))
);

CREATE INDEX tasks_due ON {schema}.tasks (shard, due_at, id) WHERE state = 'scheduled';
CREATE UNIQUE INDEX tasks_live_key ON {schema}.tasks (queue, key)
    WHERE key IS NOT NULL AND state IN ('scheduled', 'ready', 'running');
CREATE INDEX tasks_ready ON {schema}.tasks (queue, id) WHERE state = 'ready';
CREATE INDEX tasks_lease ON {schema}.tasks (lease_expires_at) WHERE state = 'running';
CREATE INDEX tasks_running_exclusive ON {schema}.tasks (exclusive_key)
    WHERE state = 'running' AND exclusive_key IS NOT NULL;
CREATE INDEX tasks_queue_id ON {schema}.tasks (queue, id);

CREATE TABLE {schema}.task_counts (
    queue  text    NOT NULL,
    state  text    NOT NULL,
    stripe integer NOT NULL,
    n      bigint  NOT NULL,
    PRIMARY KEY (queue, state, stripe)
);

CREATE FUNCTION {schema}.task_counts_after_insert() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO {schema}.task_counts AS c (queue, state, stripe, n)
    SELECT queue, state, pg_backend_pid(), count(*) FROM new_rows
    GROUP BY queue, state ORDER BY queue, state
    ON CONFLICT (queue, state, stripe) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$fn$;

CREATE FUNCTION {schema}.task_counts_after_update() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO {schema}.task_counts AS c (queue, state, stripe, n)
    SELECT queue, state, pg_backend_pid(), sum(d) FROM (
        SELECT o.queue, o.state, -1 AS d
            FROM old_rows o JOIN new_rows w ON w.id = o.id WHERE o.state <> w.state
        UNION ALL
        SELECT w.queue, w.state, 1 AS d
            FROM old_rows o JOIN new_rows w ON w.id = o.id WHERE o.state <> w.state
    ) moves
    GROUP BY queue, state HAVING sum(d) <> 0 ORDER BY queue, state
    ON CONFLICT (queue, state, stripe) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$fn$;

CREATE FUNCTION {schema}.task_counts_after_delete() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO {schema}.task_counts AS c (queue, state, stripe, n)
    SELECT queue, state, pg_backend_pid(), -count(*) FROM old_rows
    GROUP BY queue, state ORDER BY queue, state
    ON CONFLICT (queue, state, stripe) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER task_counts_insert AFTER INSERT ON {schema}.tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.task_counts_after_insert();
CREATE TRIGGER task_counts_update AFTER UPDATE ON {schema}.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.task_counts_after_update();
CREATE TRIGGER task_counts_delete AFTER DELETE ON {schema}.tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.task_counts_after_delete();
"#,
    },
    Migration {
        version: 2,
        name: "cluster: membership, shard leases, per-shard lease index",
        sql: r#"
CREATE TABLE {schema}.cluster_meta (
    singleton   boolean NOT NULL PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_count bigint  NOT NULL CHECK (shard_count >= 1)
);

CREATE TABLE {schema}.nodes (
    node         text   NOT NULL PRIMARY KEY,
    heartbeat_at bigint NOT NULL
);

CREATE TABLE {schema}.shard_leases (
    shard      bigint NOT NULL PRIMARY KEY CHECK (shard >= 0),
    owner      text,
    expires_at bigint NOT NULL,
    range_id   bigint NOT NULL CHECK (range_id >= 1)
);

CREATE INDEX tasks_shard_lease ON {schema}.tasks (shard, lease_expires_at)
    WHERE state = 'running';
"#,
    },
    Migration {
        version: 3,
        name: "schedules and their fire records",
        sql: r#"
CREATE TABLE {schema}.schedules (
    id           text COLLATE "C" NOT NULL PRIMARY KEY,
    def          text    NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    note         text,
    next_fire_at bigint,
    armed_tick   uuid,
    last_task    uuid,
    last_fire_at bigint,
    fired        bigint  NOT NULL DEFAULT 0 CHECK (fired >= 0),
    skipped      bigint  NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    missed       bigint  NOT NULL DEFAULT 0 CHECK (missed >= 0),
    created_at   bigint  NOT NULL,
    updated_at   bigint  NOT NULL
);

CREATE TABLE {schema}.schedule_fires (
    schedule_id text COLLATE "C" NOT NULL,
    nominal_at  bigint NOT NULL,
    outcome     text   NOT NULL CHECK (outcome IN ('fired', 'skipped', 'missed')),
    reason      text   NOT NULL,
    task_id     uuid,
    count       bigint NOT NULL DEFAULT 1 CHECK (count >= 1),
    through     bigint,
    recorded_at bigint NOT NULL,
    PRIMARY KEY (schedule_id, nominal_at)
);
"#,
    },
    Migration {
        version: 4,
        name: "workflow runs, histories and append markers",
        sql: r#"
CREATE TABLE {schema}.workflow_runs (
    run_id          uuid   NOT NULL PRIMARY KEY,
    workflow_id     text COLLATE "C" NOT NULL,
    workflow_type   text   NOT NULL,
    input           text   NOT NULL,
    status          text   NOT NULL CHECK (status IN ('running', 'completed', 'failed',
                        'cancelled', 'terminated', 'continued_as_new')),
    result          text,
    error           text,
    history_len     bigint NOT NULL CHECK (history_len >= 0),
    pending_task    uuid,
    parent_run      uuid,
    parent_workflow text COLLATE "C",
    parent_cmd      bigint CHECK (parent_cmd >= 0),
    continued_from  uuid,
    continued_to    uuid,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL,
    closed_at       bigint,
    CONSTRAINT workflow_runs_parent_link CHECK
        ((parent_run IS NULL) = (parent_workflow IS NULL)
         AND (parent_run IS NULL) = (parent_cmd IS NULL))
);
CREATE INDEX workflow_runs_by_workflow ON {schema}.workflow_runs (workflow_id, created_at);

CREATE TABLE {schema}.workflows (
    workflow_id text COLLATE "C" NOT NULL PRIMARY KEY,
    run_id      uuid NOT NULL
);

CREATE TABLE {schema}.workflow_history (
    run_id uuid   NOT NULL,
    seq    bigint NOT NULL CHECK (seq >= 0),
    at     bigint NOT NULL,
    event  text   NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE {schema}.workflow_markers (
    run_id uuid NOT NULL,
    marker text NOT NULL,
    PRIMARY KEY (run_id, marker)
);
"#,
    },
    Migration {
        version: 5,
        name: "index of live workflow-owned tasks by key, in byte order",
        sql: r#"
CREATE INDEX tasks_workflow_key ON {schema}.tasks (key text_pattern_ops)
    WHERE queue IN ('sundial.workflows', 'sundial.activities') AND key IS NOT NULL
    AND state IN ('scheduled', 'ready', 'running');
"#,
    },
    Migration {
        version: 6,
        name: "tags, search indexes, queue settings, attempts, retention",
        sql: r#"
ALTER TABLE {schema}.tasks ADD COLUMN tags text;

CREATE TABLE {schema}.task_tags (
    key     text COLLATE "C" NOT NULL,
    value   text COLLATE "C" NOT NULL,
    task_id uuid NOT NULL REFERENCES {schema}.tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (key, value, task_id)
);
CREATE INDEX task_tags_task ON {schema}.task_tags (task_id);

CREATE INDEX tasks_queue_state_id ON {schema}.tasks (queue, state, id);
CREATE INDEX tasks_state_id ON {schema}.tasks (state, id);
CREATE INDEX tasks_kind_id ON {schema}.tasks (kind, id);
CREATE INDEX tasks_key_id ON {schema}.tasks (key text_pattern_ops, id) WHERE key IS NOT NULL;
CREATE INDEX tasks_due_at ON {schema}.tasks (due_at);
CREATE INDEX tasks_created_at ON {schema}.tasks (created_at);
CREATE INDEX tasks_waiting ON {schema}.tasks (queue, due_at)
    WHERE state IN ('scheduled', 'ready');
CREATE INDEX tasks_finished ON {schema}.tasks (queue, state, shard, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

CREATE TABLE {schema}.queue_settings (
    queue             text COLLATE "C" NOT NULL PRIMARY KEY,
    paused            boolean NOT NULL DEFAULT false,
    paused_changed_at bigint,
    config            text    NOT NULL DEFAULT '{}',
    updated_at        bigint  NOT NULL
);

CREATE TABLE {schema}.store_settings (
    name  text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO {schema}.store_settings (name, value) VALUES ('attempts_kept', 100);

CREATE TABLE {schema}.task_attempts (
    task_id      uuid   NOT NULL REFERENCES {schema}.tasks (id) ON DELETE CASCADE,
    seq          bigint NOT NULL CHECK (seq >= 1),
    execution_id uuid,
    worker       text,
    started_at   bigint NOT NULL,
    ended_at     bigint,
    outcome      text CHECK (outcome IN ('succeeded', 'failed', 'lease_expired', 'cancelled')),
    error        text,
    PRIMARY KEY (task_id, seq)
);

-- One statement's attempts: ends first (of rows that left `running`), then starts (of rows that
-- entered it), then the oldest beyond `attempts_kept` go. A row's writes are serialised by its
-- row lock, so `max(seq) + 1` is never taken twice.
CREATE FUNCTION {schema}.task_attempts_after_update() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    kept bigint;
BEGIN
    UPDATE {schema}.task_attempts a SET ended_at = w.updated_at,
        outcome = CASE
            WHEN w.state = 'succeeded' THEN 'succeeded'
            WHEN w.state = 'cancelled' THEN 'cancelled'
            WHEN w.last_error = 'lease expired: the attempt neither finished nor heartbeated in time'
                THEN 'lease_expired'
            ELSE 'failed' END,
        error = CASE WHEN w.state IN ('scheduled', 'dead') THEN w.last_error END
    FROM old_rows o JOIN new_rows w ON w.id = o.id
    WHERE o.state = 'running' AND w.state <> 'running' AND a.task_id = w.id
    AND a.seq = (SELECT max(b.seq) FROM {schema}.task_attempts b WHERE b.task_id = w.id);

    INSERT INTO {schema}.task_attempts (task_id, seq, execution_id, worker, started_at)
    SELECT w.id,
           COALESCE((SELECT max(b.seq) FROM {schema}.task_attempts b WHERE b.task_id = w.id), 0) + 1,
           w.execution_id, w.worker, COALESCE(w.started_at, w.updated_at)
    FROM old_rows o JOIN new_rows w ON w.id = o.id
    WHERE w.state = 'running' AND o.state <> 'running'
    ORDER BY w.id;

    SELECT value INTO kept FROM {schema}.store_settings WHERE name = 'attempts_kept';
    DELETE FROM {schema}.task_attempts a
    USING old_rows o JOIN new_rows w ON w.id = o.id
    WHERE w.state = 'running' AND o.state <> 'running' AND a.task_id = w.id
    AND a.seq <= (SELECT max(b.seq) FROM {schema}.task_attempts b WHERE b.task_id = w.id) - kept;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER task_attempts_update AFTER UPDATE ON {schema}.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.task_attempts_after_update();
"#,
    },
    Migration {
        version: 7,
        name: "push delivery: task targets and signing secrets",
        sql: r#"
ALTER TABLE {schema}.tasks ADD COLUMN target text;

CREATE TABLE {schema}.push_secrets (
    id         text   NOT NULL PRIMARY KEY COLLATE "C",
    secret     text   NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint
);
"#,
    },
    Migration {
        version: 8,
        name: "retention of schedule fire records",
        sql: r#"
CREATE INDEX schedule_fires_recorded ON {schema}.schedule_fires (recorded_at);
"#,
    },
    Migration {
        version: 9,
        name: "idempotency keys of creates",
        sql: r#"
CREATE TABLE {schema}.idempotency (
    queue       text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    version     bigint NOT NULL,
    fingerprint text NOT NULL,
    task_id     uuid NOT NULL,
    created_at  bigint NOT NULL,
    PRIMARY KEY (queue, key)
);
"#,
    },
    Migration {
        version: 10,
        name: "API tokens, namespaces and the audit log",
        sql: r#"
CREATE TABLE {schema}.api_tokens (
    id          uuid   NOT NULL PRIMARY KEY,
    name        text   NOT NULL,
    scope       text   NOT NULL,
    namespace   text,
    secret_hash bytea  NOT NULL,
    created_at  bigint NOT NULL,
    expires_at  bigint,
    revoked_at  bigint
);

CREATE TABLE {schema}.namespaces (
    name                   text COLLATE "C" NOT NULL PRIMARY KEY,
    max_live_tasks         bigint,
    max_creates_per_second bigint,
    created_at             bigint NOT NULL
);

CREATE TABLE {schema}.audit_log (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         bigint NOT NULL,
    actor_id   uuid,
    actor      text   NOT NULL,
    namespace  text   NOT NULL,
    action     text   NOT NULL,
    target     text,
    request_id text   NOT NULL,
    status     integer NOT NULL
);
CREATE INDEX audit_log_at ON {schema}.audit_log (at);
CREATE INDEX audit_log_target ON {schema}.audit_log (target, seq) WHERE target IS NOT NULL;
"#,
    },
    Migration {
        version: 11,
        name: "retention of closed workflow runs",
        sql: r#"
CREATE INDEX workflow_runs_closed ON {schema}.workflow_runs (closed_at)
    WHERE closed_at IS NOT NULL;
"#,
    },
    Migration {
        version: 12,
        name: "the HTTP answer of push attempts",
        sql: r#"
ALTER TABLE {schema}.task_attempts ADD COLUMN status_code integer;
ALTER TABLE {schema}.task_attempts ADD COLUMN content_type text;
"#,
    },
    Migration {
        version: 13,
        name: "trace context of tasks",
        sql: r#"
ALTER TABLE {schema}.tasks ADD COLUMN traceparent text;
ALTER TABLE {schema}.tasks ADD COLUMN tracestate text;
"#,
    },
    Migration {
        version: 14,
        name: "the dead letters by queue and error group",
        // The error group is `sundial_store::error_group`: the error's first line, at most 200
        // characters. `sql::ERROR_GROUP_SQL` repeats the expression for the queries.
        sql: r#"
CREATE INDEX tasks_dead_error ON {schema}.tasks
    (queue, (left(split_part(last_error, E'\n', 1), 200)), id) WHERE state = 'dead';
"#,
    },
    Migration {
        version: 15,
        name: "push secrets per namespace",
        // Every secret stored before is the default namespace's.
        sql: r#"
ALTER TABLE {schema}.push_secrets
    ADD COLUMN namespace text COLLATE "C" NOT NULL DEFAULT 'default';
CREATE INDEX push_secrets_namespace ON {schema}.push_secrets (namespace, created_at, id);
"#,
    },
    Migration {
        version: 16,
        name: "task priorities",
        // Ready tasks are taken by rank: the due time moved by the priority's credit
        // (`sundial_core::priority`; `RANK_SQL` repeats the expression for the queries).
        sql: r#"
ALTER TABLE {schema}.tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9);
DROP INDEX {schema}.tasks_ready;
CREATE INDEX tasks_ready ON {schema}.tasks (queue, (due_at - (priority - 5) * 60000), id)
    WHERE state = 'ready';
"#,
    },
    Migration {
        version: 17,
        name: "group limits",
        // At most `exclusive_limit` running tasks per exclusive key (1: an exclusive key).
        sql: r#"
ALTER TABLE {schema}.tasks
    ADD COLUMN exclusive_limit integer NOT NULL DEFAULT 1
    CHECK (exclusive_limit BETWEEN 1 AND 10000);
"#,
    },
    Migration {
        version: 18,
        name: "debounce keys",
        // A queue's pending task of a debounce key (`Store::insert_debounced`), found by the
        // index over the tasks that carry one and have not started.
        sql: r#"
ALTER TABLE {schema}.tasks ADD COLUMN debounce_key text COLLATE "C";
CREATE INDEX tasks_debounce ON {schema}.tasks (queue, debounce_key)
    WHERE debounce_key IS NOT NULL AND state = 'scheduled' AND attempt = 0;
"#,
    },
    Migration {
        version: 19,
        name: "rate limits",
        // A task's rate limit (`sundial_core::RateLimit` as JSON, NULL for none), and per key
        // the earliest time the next start may happen.
        sql: r#"
ALTER TABLE {schema}.tasks ADD COLUMN rate text;
CREATE INDEX tasks_rate_limited ON {schema}.tasks (queue, due_at)
    WHERE rate IS NOT NULL AND state = 'scheduled';
CREATE TABLE {schema}.rate_limits (
    key     text COLLATE "C" PRIMARY KEY,
    next_at bigint NOT NULL
);
"#,
    },
    Migration {
        version: 20,
        name: "attempts recorded per row that enters or leaves running",
        // The same records as version 6's statement trigger, which ran four queries over its
        // transition tables after every `UPDATE` of tasks, heartbeats and batches of
        // `scheduled -> ready` included: a third of the database's CPU per delivered task
        // (BENCHMARKS.md, "The attempt trigger"). This one is called, by the trigger's `WHEN`
        // (checked without calling any function), only for a row whose state enters or leaves
        // `running`, and does one lookup and one write; the trim reads its setting only when an
        // earlier attempt exists.
        sql: r#"
DROP TRIGGER IF EXISTS task_attempts_update ON {schema}.tasks;
DROP FUNCTION IF EXISTS {schema}.task_attempts_after_update();

CREATE FUNCTION {schema}.task_attempt_of_row() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    last_seq bigint;
BEGIN
    SELECT max(a.seq) INTO last_seq FROM {schema}.task_attempts a WHERE a.task_id = NEW.id;
    IF OLD.state = 'running' THEN
        UPDATE {schema}.task_attempts a SET ended_at = NEW.updated_at,
            outcome = CASE
                WHEN NEW.state = 'succeeded' THEN 'succeeded'
                WHEN NEW.state = 'cancelled' THEN 'cancelled'
                WHEN NEW.last_error = 'lease expired: the attempt neither finished nor heartbeated in time'
                    THEN 'lease_expired'
                ELSE 'failed' END,
            error = CASE WHEN NEW.state IN ('scheduled', 'dead') THEN NEW.last_error END
        WHERE a.task_id = NEW.id AND a.seq = last_seq;
    ELSE
        last_seq := COALESCE(last_seq, 0) + 1;
        INSERT INTO {schema}.task_attempts (task_id, seq, execution_id, worker, started_at)
        VALUES (NEW.id, last_seq, NEW.execution_id, NEW.worker,
                COALESCE(NEW.started_at, NEW.updated_at));
        IF last_seq > 1 THEN
            DELETE FROM {schema}.task_attempts a WHERE a.task_id = NEW.id
            AND a.seq <= last_seq
                - (SELECT s.value FROM {schema}.store_settings s WHERE s.name = 'attempts_kept');
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER task_attempt_of_row AFTER UPDATE ON {schema}.tasks FOR EACH ROW
    WHEN (OLD.state <> NEW.state AND (OLD.state = 'running' OR NEW.state = 'running'))
    EXECUTE FUNCTION {schema}.task_attempt_of_row();
"#,
    },
    Migration {
        version: 21,
        name: "no due-time and creation-time indexes of tasks",
        // No query reads them: a page of `list` is driven by the index its other filters name
        // (`sundial_store::ListDriver`), or by the primary key, and checks time ranges on the
        // rows it visits. Every task insert, and every update that changes an indexed column
        // (each change of state: no heap-only update), wrote an entry into both.
        sql: r#"
DROP INDEX IF EXISTS {schema}.tasks_due_at;
DROP INDEX IF EXISTS {schema}.tasks_created_at;
"#,
    },
];

/// A task's place in line among ready tasks (`sundial_core::Priority::rank`), as the
/// `tasks_ready` index has it.
pub const RANK_SQL: &str = "(due_at - (priority - 5) * 60000)";

/// The schema version this build writes (the highest migration it knows).
pub const CURRENT_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// A validated schema name and its quoted form for SQL text.
#[derive(Debug, Clone)]
pub(crate) struct SchemaName {
    pub name: String,
    /// `"name"`: safe to interpolate (the name was validated, and quoting keeps it literal).
    pub ident: String,
}

impl SchemaName {
    /// Accepts 1..=63 bytes of `[a-z0-9_]`, starting with a letter or `_`, not starting with
    /// `pg_` (reserved by PostgreSQL). Upper case is refused rather than folded, so the name in
    /// the configuration is the name in the catalog.
    pub fn parse(name: &str) -> Result<Self, PostgresError> {
        let bad = |reason: &'static str| PostgresError::SchemaName {
            name: name.to_string(),
            reason,
        };
        if name.is_empty() || name.len() > 63 {
            return Err(bad("must be 1 to 63 bytes long"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad("use lower-case letters, digits and _"));
        }
        if name.as_bytes()[0].is_ascii_digit() {
            return Err(bad("must start with a letter or _"));
        }
        if name.starts_with("pg_") {
            return Err(bad("names starting with pg_ are reserved by PostgreSQL"));
        }
        Ok(SchemaName {
            name: name.to_string(),
            ident: format!("\"{name}\""),
        })
    }

    /// The second key of the migration lock.
    pub fn lock_key(&self) -> i32 {
        fnv32(&[self.name.as_bytes()])
    }

    /// The LISTEN/NOTIFY channel of this deployment: `sundial_<schema>`, or, when that would
    /// pass PostgreSQL's 63-byte identifier limit (a longer channel name is an error in
    /// `pg_notify` and silently truncated by `LISTEN`), `sundial_` with the first 46 bytes of the
    /// schema name and a hash of all of it. Only `[a-z0-9_]`, so it can be quoted as is.
    pub fn channel(&self) -> String {
        let full = format!("sundial_{}", self.name);
        if full.len() <= MAX_IDENTIFIER_LEN {
            return full;
        }
        let hash = u32::from_ne_bytes(fnv32(&[self.name.as_bytes()]).to_ne_bytes());
        // The name is ASCII, so any byte index is a character boundary.
        format!("sundial_{}_{hash:08x}", &self.name[..46])
    }
}

/// The second key of an exclusive key's advisory lock: a hash of the schema and the key, so that
/// deployments in different schemas never contend. A collision only serialises two claims that
/// did not need it; it never lets two holders of one key run.
pub(crate) fn exclusive_lock_key(schema: &SchemaName, key: &str) -> i32 {
    fnv32(&[schema.name.as_bytes(), &[0xff], key.as_bytes()])
}

/// FNV-1a, 32 bits, over the concatenated parts: stable across processes and versions, which
/// matters because every node must derive the same lock for the same key.
fn fnv32(parts: &[&[u8]]) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for part in parts {
        for b in *part {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// Brings the schema up to [`CURRENT_VERSION`], or refuses it when it is newer. Runs in one
/// transaction under the migration lock.
pub(crate) async fn migrate(
    client: &mut deadpool_postgres::Client,
    schema: &SchemaName,
) -> Result<(), PostgresError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1::int4, $2::int4)",
        &[&MIGRATION_LOCK_CLASS, &schema.lock_key()],
    )
    .await?;
    let exists = tx
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
            &[&schema.name],
        )
        .await?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {}", schema.ident))
            .await?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {}.schema_migrations (\
             version integer NOT NULL PRIMARY KEY, \
             name    text    NOT NULL)",
        schema.ident
    ))
    .await?;
    let found: Option<i32> = tx
        .query_one(
            &format!(
                "SELECT max(version) FROM {}.schema_migrations",
                schema.ident
            ),
            &[],
        )
        .await?
        .try_get(0)?;
    let found = found.unwrap_or(0);
    if found > CURRENT_VERSION {
        // Dropping the transaction rolls it back: nothing is changed.
        return Err(PostgresError::TooNew {
            found: i64::from(found),
            supported: i64::from(CURRENT_VERSION),
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        tracing::info!(schema = %schema.name, version = m.version, name = m.name, "applying migration");
        tx.batch_execute(&m.sql.replace("{schema}", &schema.ident))
            .await?;
        tx.execute(
            &format!(
                "INSERT INTO {}.schema_migrations (version, name) VALUES ($1, $2)",
                schema.ident
            ),
            &[&m.version, &m.name],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_index_is_the_claims_rank_and_the_cores_rule() {
        let m = MIGRATIONS.iter().find(|m| m.version == 16).unwrap();
        assert!(m.sql.contains(RANK_SQL));
        let step = sundial_core::Priority::STEP_MS.to_string();
        let default = sundial_core::Priority::DEFAULT.get().to_string();
        assert!(RANK_SQL.contains(&format!("(priority - {default}) * {step}")));
    }

    #[test]
    fn schema_names() {
        assert_eq!(SchemaName::parse("sundial").unwrap().ident, "\"sundial\"");
        assert!(SchemaName::parse("_t_1").is_ok());
        for bad in [
            "",
            "Sundial",
            "a-b",
            "1abc",
            "pg_x",
            "a\"b",
            "a b",
            &"a".repeat(64),
        ] {
            assert!(SchemaName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lock_keys_are_stable_and_separate_schemas() {
        let a = SchemaName::parse("a").unwrap();
        let b = SchemaName::parse("b").unwrap();
        assert_eq!(exclusive_lock_key(&a, "k"), exclusive_lock_key(&a, "k"));
        assert_ne!(exclusive_lock_key(&a, "k"), exclusive_lock_key(&b, "k"));
        // Changing the hash would let nodes of two versions lock different keys for one key.
        assert_eq!(fnv32(&[b"sundial"]), fnv32(&[b"sun", b"dial"]));
        assert_eq!(fnv32(&[b""]), 0x811c_9dc5_u32 as i32);
        assert_eq!(fnv32(&[b"a"]), 0xe40c_292c_u32 as i32);
    }

    #[test]
    fn channels_fit_the_identifier_limit() {
        assert_eq!(
            SchemaName::parse("sundial").unwrap().channel(),
            "sundial_sundial"
        );
        let long = "a".repeat(55);
        assert_eq!(
            SchemaName::parse(&long).unwrap().channel(),
            format!("sundial_{long}")
        );
        let longest_a = SchemaName::parse(&"a".repeat(63)).unwrap().channel();
        let longest_b = SchemaName::parse(&format!("{}b", "a".repeat(62)))
            .unwrap()
            .channel();
        assert_eq!(longest_a.len(), MAX_IDENTIFIER_LEN);
        assert_eq!(longest_b.len(), MAX_IDENTIFIER_LEN);
        assert_ne!(
            longest_a, longest_b,
            "long names that share a prefix differ"
        );
    }

    #[test]
    fn the_workflow_key_index_names_the_workflow_queues() {
        // `cancel_run_tasks` repeats this predicate with the constants; they must agree.
        let queues = format!(
            "queue IN ('{}', '{}')",
            sundial_store::WORKFLOW_QUEUE,
            sundial_store::ACTIVITY_QUEUE
        );
        assert!(MIGRATIONS[4].sql.contains(&queues));
    }

    #[test]
    fn the_attempt_triggers_know_the_lease_expiry_error() {
        for version in [6, 20] {
            let m = MIGRATIONS
                .iter()
                .find(|m| m.version == version)
                .map(|m| m.sql);
            assert!(
                m.is_some_and(|sql| sql.contains(sundial_store::LEASE_EXPIRED_ERROR)),
                "migration {version}"
            );
        }
    }

    #[test]
    fn the_dead_letter_index_is_the_queries_expression() {
        let m = MIGRATIONS.iter().find(|m| m.version == 14).map(|m| m.sql);
        assert!(m.is_some_and(|sql| sql.contains(crate::sql::ERROR_GROUP_SQL)));
    }

    #[test]
    fn migrations_are_numbered_in_order() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1);
        }
    }
}
