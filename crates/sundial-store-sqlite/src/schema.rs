//! The on-disk schema and its migrations.
//!
//! Migrations are numbered SQL scripts applied in order inside one transaction each; the number of
//! the last one applied is kept in SQLite's `user_version`. A database written by a newer Sundial
//! (a higher `user_version` than this build knows) is refused rather than guessed at.
//!
//! Layout (see ARCHITECTURE.md, "Embedded store"):
//! - `tasks`: one row per task. `id` is the 16-byte UUIDv7. Times are integer milliseconds.
//! - `tasks_due (shard, due_at, id) WHERE state = 'scheduled'`: the persisted timers. Only
//!   scheduled rows are in it, so fired and finished tasks leave it and a scan from the front of a
//!   shard reads due work, not history.
//! - `tasks_live_key (queue, key)`, unique over live states: business-key uniqueness enforced by
//!   the database itself, atomically with the insert.
//! - `tasks_ready`, `tasks_lease`, `tasks_running_exclusive`: the worker queue, the reaper's view
//!   and the mutual-exclusion check, each a small partial index.
//! - `task_counts`: per (queue, state) counters kept by triggers, so metrics never scan `tasks`.
//! - `schedules` (migration 2): one row per schedule. `def` is the `ScheduleDef` as JSON; the row
//!   keeps the armed tick and its nominal time (`next_fire_at`, `armed_tick`), the latest fire's
//!   task, and per-outcome fire counters.
//! - `schedule_fires` (migration 2): one row per recorded fire, primary key
//!   `(schedule_id, nominal_at)`: a fire is recorded at most once, by the database itself.
//! - `workflow_runs` (migration 3): one row per workflow run (status, result, history length, the
//!   pending workflow task, parent and continue-as-new links). `workflows (workflow_id → run_id)`
//!   points at each workflow id's current run. `workflow_history (run_id, seq)` is the append-only
//!   event log (JSON text). `workflow_markers (run_id, marker)` makes marked appends (a timer
//!   firing, an activity's result) happen at most once.
//! - `store_meta (name → value)` (migration 4): facts about the store itself; `shard_count` is
//!   the shard count, recorded when the store is created (see `shards.rs`).
//! - Migration 5 (operations): `tasks.tags` (the tags as a JSON object) and `task_tags (key,
//!   value, task_id)`, the tag index; the search indexes behind every filter of `list`
//!   (`tasks_queue_state_id`, `tasks_state_id`, `tasks_kind_id`, `tasks_key_id`, and
//!   `tasks_due_at` and `tasks_created_at`, which migration 19 drops again: no query read them);
//!   `tasks_waiting (queue, due_at)` over scheduled and ready rows (a queue's
//!   oldest waiting task); `tasks_finished (queue, state, shard, finished_at)` over terminal rows
//!   (retention); `queue_settings` (pause and configuration per queue); `task_attempts (task_id,
//!   seq)`, one row per attempt, written by triggers as a task enters and leaves `running` and
//!   bounded to the latest `store_settings.attempts_kept` per task.
//! - Migration 7: `schedule_fires_recorded (recorded_at)`, the retention of fire records.
//! - Migration 10: `workflow_runs_closed (closed_at)` over closed runs, the retention of closed
//!   runs and their histories.
//! - `tasks.target` and `push_secrets` (migration 6): a push task's HTTP target as JSON, and the
//!   signing secrets of push delivery with their expiry (a rotation sets the previous ones').
//! - `tasks.traceparent`, `tasks.tracestate` (migration 12): the W3C trace context of the request
//!   that created the task, continued by the steps that run it (NULL when it came with none).
//! - `push_secrets.namespace` (migration 14): the namespace whose calls a secret signs
//!   (`'default'` for the secrets stored before it), and `push_secrets_namespace (namespace,
//!   created_at, id)`, one namespace's secrets in list order.

use rusqlite::Connection;

use crate::SqliteError;

const MIGRATIONS: &[&str] = &[
    // 1: tasks and their indexes.
    r#"
CREATE TABLE tasks (
    id               BLOB    NOT NULL PRIMARY KEY,
    shard            INTEGER NOT NULL,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    key              TEXT,
    payload          TEXT    NOT NULL,
    due_at           INTEGER NOT NULL,
    state            TEXT    NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    backoff          TEXT    NOT NULL,
    timeout_ms       INTEGER NOT NULL,
    exclusive_key    TEXT,
    exclusive_mode   TEXT,
    execution_id     BLOB,
    lease_expires_at INTEGER,
    worker           TEXT,
    last_error       TEXT,
    result           TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER
);
CREATE INDEX tasks_due ON tasks (shard, due_at, id) WHERE state = 'scheduled';
CREATE UNIQUE INDEX tasks_live_key ON tasks (queue, key)
    WHERE key IS NOT NULL AND state IN ('scheduled', 'ready', 'running');
CREATE INDEX tasks_ready ON tasks (queue, id) WHERE state = 'ready';
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE state = 'running';
CREATE INDEX tasks_running_exclusive ON tasks (exclusive_key)
    WHERE state = 'running' AND exclusive_key IS NOT NULL;
CREATE INDEX tasks_queue_id ON tasks (queue, id);

CREATE TABLE task_counts (
    queue TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;
CREATE TRIGGER task_counts_insert AFTER INSERT ON tasks BEGIN
    INSERT INTO task_counts (queue, state, n) VALUES (NEW.queue, NEW.state, 1)
        ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER task_counts_update AFTER UPDATE OF state ON tasks
    WHEN OLD.state <> NEW.state BEGIN
    UPDATE task_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
    INSERT INTO task_counts (queue, state, n) VALUES (NEW.queue, NEW.state, 1)
        ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER task_counts_delete AFTER DELETE ON tasks BEGIN
    UPDATE task_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
END;
"#,
    // 2: schedules and their fire records.
    r#"
CREATE TABLE schedules (
    id           TEXT    NOT NULL PRIMARY KEY,
    def          TEXT    NOT NULL,
    paused       INTEGER NOT NULL DEFAULT 0,
    note         TEXT,
    next_fire_at INTEGER,
    armed_tick   BLOB,
    last_task    BLOB,
    last_fire_at INTEGER,
    fired        INTEGER NOT NULL DEFAULT 0,
    skipped      INTEGER NOT NULL DEFAULT 0,
    missed       INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE schedule_fires (
    schedule_id TEXT    NOT NULL,
    nominal_at  INTEGER NOT NULL,
    outcome     TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    task_id     BLOB,
    count       INTEGER NOT NULL DEFAULT 1,
    through     INTEGER,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, nominal_at)
) WITHOUT ROWID;
"#,
    // 3: workflow runs, their histories and append markers.
    r#"
CREATE TABLE workflow_runs (
    run_id          BLOB    NOT NULL PRIMARY KEY,
    workflow_id     TEXT    NOT NULL,
    workflow_type   TEXT    NOT NULL,
    input           TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    result          TEXT,
    error           TEXT,
    history_len     INTEGER NOT NULL,
    pending_task    BLOB,
    parent_run      BLOB,
    parent_workflow TEXT,
    parent_cmd      INTEGER,
    continued_from  BLOB,
    continued_to    BLOB,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    closed_at       INTEGER
) WITHOUT ROWID;
CREATE INDEX workflow_runs_by_workflow ON workflow_runs (workflow_id, created_at);

CREATE TABLE workflows (
    workflow_id TEXT NOT NULL PRIMARY KEY,
    run_id      BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE workflow_history (
    run_id BLOB    NOT NULL,
    seq    INTEGER NOT NULL,
    at     INTEGER NOT NULL,
    event  TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE workflow_markers (
    run_id BLOB NOT NULL,
    marker TEXT NOT NULL,
    PRIMARY KEY (run_id, marker)
) WITHOUT ROWID;
"#,
    // 4: facts about the store itself (its shard count).
    r#"
CREATE TABLE store_meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"#,
    // 5: tags, search indexes, queue settings, attempts, retention.
    r#"
ALTER TABLE tasks ADD COLUMN tags TEXT;

CREATE TABLE task_tags (
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    task_id BLOB NOT NULL,
    PRIMARY KEY (key, value, task_id)
) WITHOUT ROWID;
CREATE INDEX task_tags_task ON task_tags (task_id);
CREATE TRIGGER task_tags_delete AFTER DELETE ON tasks WHEN OLD.tags IS NOT NULL BEGIN
    DELETE FROM task_tags WHERE task_id = OLD.id;
END;

CREATE INDEX tasks_queue_state_id ON tasks (queue, state, id);
CREATE INDEX tasks_state_id ON tasks (state, id);
CREATE INDEX tasks_kind_id ON tasks (kind, id);
CREATE INDEX tasks_key_id ON tasks (key, id) WHERE key IS NOT NULL;
CREATE INDEX tasks_due_at ON tasks (due_at);
CREATE INDEX tasks_created_at ON tasks (created_at);
CREATE INDEX tasks_waiting ON tasks (queue, due_at) WHERE state IN ('scheduled', 'ready');
CREATE INDEX tasks_finished ON tasks (queue, state, shard, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

CREATE TABLE queue_settings (
    queue             TEXT    NOT NULL PRIMARY KEY,
    paused            INTEGER NOT NULL DEFAULT 0,
    paused_changed_at INTEGER,
    config            TEXT    NOT NULL DEFAULT '{}',
    updated_at        INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE store_settings (
    name  TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO store_settings (name, value) VALUES ('attempts_kept', 100);

CREATE TABLE task_attempts (
    task_id      BLOB    NOT NULL,
    seq          INTEGER NOT NULL,
    execution_id BLOB,
    worker       TEXT,
    started_at   INTEGER NOT NULL,
    ended_at     INTEGER,
    outcome      TEXT,
    error        TEXT,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
CREATE TRIGGER task_attempts_start AFTER UPDATE OF state ON tasks
    WHEN NEW.state = 'running' AND OLD.state <> 'running' BEGIN
    INSERT INTO task_attempts (task_id, seq, execution_id, worker, started_at)
        VALUES (NEW.id,
                COALESCE((SELECT MAX(seq) FROM task_attempts WHERE task_id = NEW.id), 0) + 1,
                NEW.execution_id, NEW.worker, COALESCE(NEW.started_at, NEW.updated_at));
    DELETE FROM task_attempts WHERE task_id = NEW.id
        AND seq <= (SELECT MAX(seq) FROM task_attempts WHERE task_id = NEW.id)
                   - (SELECT value FROM store_settings WHERE name = 'attempts_kept');
END;
CREATE TRIGGER task_attempts_end AFTER UPDATE OF state ON tasks
    WHEN OLD.state = 'running' AND NEW.state <> 'running' BEGIN
    UPDATE task_attempts SET ended_at = NEW.updated_at,
        outcome = CASE
            WHEN NEW.state = 'succeeded' THEN 'succeeded'
            WHEN NEW.state = 'cancelled' THEN 'cancelled'
            WHEN NEW.last_error = 'lease expired: the attempt neither finished nor heartbeated in time'
                THEN 'lease_expired'
            ELSE 'failed' END,
        error = CASE WHEN NEW.state IN ('scheduled', 'dead') THEN NEW.last_error END
        WHERE task_id = NEW.id
        AND seq = (SELECT MAX(seq) FROM task_attempts WHERE task_id = NEW.id);
END;
CREATE TRIGGER task_attempts_delete AFTER DELETE ON tasks BEGIN
    DELETE FROM task_attempts WHERE task_id = OLD.id;
END;
"#,
    // 6: push delivery. A task's HTTP target (JSON, NULL for handler and worker tasks) and the
    // signing secrets (`whsec_…`); a secret signs while `expires_at` is NULL or in the future.
    r#"
ALTER TABLE tasks ADD COLUMN target TEXT;

CREATE TABLE push_secrets (
    id         TEXT    NOT NULL PRIMARY KEY,
    secret     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
"#,
    // 7: retention of schedule fire records (by the time they were recorded).
    r#"
CREATE INDEX schedule_fires_recorded ON schedule_fires (recorded_at);
"#,
    // 8: idempotency keys of creates (per queue), with the request's fingerprint and version and
    // the task the key created.
    r#"
CREATE TABLE idempotency (
    queue       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    fingerprint TEXT    NOT NULL,
    task_id     BLOB    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (queue, key)
) WITHOUT ROWID;
"#,
    // 9: API tokens, namespaces and the audit log (`access.rs`).
    r#"
CREATE TABLE api_tokens (
    id          BLOB    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    namespace   TEXT,
    secret_hash BLOB    NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    revoked_at  INTEGER
) WITHOUT ROWID;

CREATE TABLE namespaces (
    name                   TEXT    NOT NULL PRIMARY KEY,
    max_live_tasks         INTEGER,
    max_creates_per_second INTEGER,
    created_at             INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE audit_log (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    actor_id   BLOB,
    actor      TEXT    NOT NULL,
    namespace  TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    target     TEXT,
    request_id TEXT    NOT NULL,
    status     INTEGER NOT NULL
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_target ON audit_log (target, seq) WHERE target IS NOT NULL;
"#,
    // 10: retention of closed workflow runs (by the time they closed).
    r#"
CREATE INDEX workflow_runs_closed ON workflow_runs (closed_at) WHERE closed_at IS NOT NULL;
"#,
    // 11: the HTTP answer of push attempts (status code and content type).
    r#"
ALTER TABLE task_attempts ADD COLUMN status_code INTEGER;
ALTER TABLE task_attempts ADD COLUMN content_type TEXT;
"#,
    // 12: the W3C trace context a task carries from the request that created it (NULL: none).
    r#"
ALTER TABLE tasks ADD COLUMN traceparent TEXT;
ALTER TABLE tasks ADD COLUMN tracestate TEXT;
"#,
    // 13: the dead letters by queue and error group (the error's first line, at most 200
    // characters: `sundial_store::error_group`). `ops::ERROR_GROUP_SQL` repeats the expression,
    // which a query must do to the letter for SQLite to use the index.
    r#"
CREATE INDEX tasks_dead_error ON tasks (queue, substr(last_error, 1, CASE WHEN instr(last_error, char(10)) > 0 THEN min(instr(last_error, char(10)) - 1, 200) ELSE 200 END), id)
    WHERE state = 'dead';
"#,
    // 14: push secrets per namespace; every secret stored before is the default namespace's.
    r#"
ALTER TABLE push_secrets ADD COLUMN namespace TEXT NOT NULL DEFAULT 'default';
CREATE INDEX push_secrets_namespace ON push_secrets (namespace, created_at, id);
"#,
    // 15: task priorities (`sundial_core::priority`): ready tasks are taken by rank, the due time
    // moved by the priority's credit (`RANK_SQL`, which a query repeats to the letter).
    r#"
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9);
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (queue, (due_at - (priority - 5) * 60000), id) WHERE state = 'ready';
"#,
    // 16: group limits: at most `exclusive_limit` running tasks per exclusive key (1: an
    // exclusive key, as before).
    r#"
ALTER TABLE tasks ADD COLUMN exclusive_limit INTEGER NOT NULL DEFAULT 1 CHECK (exclusive_limit BETWEEN 1 AND 10000);
"#,
    // 17: debounce keys (`Store::insert_debounced`): a queue's pending task of a key is found
    // by the index, over the tasks that carry one and have not started.
    r#"
ALTER TABLE tasks ADD COLUMN debounce_key TEXT;
CREATE INDEX tasks_debounce ON tasks (queue, debounce_key)
    WHERE debounce_key IS NOT NULL AND state = 'scheduled' AND attempt = 0;
"#,
    // 18: rate limits: a task's limit (`sundial_core::RateLimit` as JSON, NULL for none), the
    // index that counts a queue's due tasks waiting for theirs, and per key the earliest time
    // the next start may happen.
    r#"
ALTER TABLE tasks ADD COLUMN rate TEXT;
CREATE INDEX tasks_rate_limited ON tasks (queue, due_at)
    WHERE rate IS NOT NULL AND state = 'scheduled';
CREATE TABLE rate_limits (
    key     TEXT PRIMARY KEY,
    next_at INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    // 19: no index of tasks by due time or by creation time. No query reads them: a page of
    // `list` is driven by the index its other filters name (`sundial_store::ListDriver`), or by
    // the primary key, and checks time ranges on the rows it visits; every insert wrote both.
    r#"
DROP INDEX IF EXISTS tasks_due_at;
DROP INDEX IF EXISTS tasks_created_at;
"#,
];

/// A task's place in line among ready tasks (`sundial_core::Priority::rank`), as the
/// `tasks_ready` index has it.
pub const RANK_SQL: &str = "(due_at - (priority - 5) * 60000)";

/// The schema version this build writes.
pub const CURRENT_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database up to [`CURRENT_VERSION`].
pub fn migrate(conn: &mut Connection) -> Result<(), SqliteError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > CURRENT_VERSION {
        return Err(SqliteError::TooNew {
            found: version,
            supported: CURRENT_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_attempt_trigger_knows_the_lease_expiry_error() {
        assert!(super::MIGRATIONS[4].contains(sundial_store::LEASE_EXPIRED_ERROR));
    }

    #[test]
    fn the_dead_letter_index_is_the_queries_expression() {
        assert!(super::MIGRATIONS[12].contains(crate::ops::ERROR_GROUP_SQL));
        assert!(
            crate::ops::ERROR_GROUP_SQL.contains(&sundial_store::ERROR_GROUP_CHARS.to_string())
        );
    }

    #[test]
    fn the_ready_index_is_the_claims_rank_and_the_cores_rule() {
        assert!(super::MIGRATIONS[14].contains(super::RANK_SQL));
        let step = sundial_core::Priority::STEP_MS.to_string();
        let default = sundial_core::Priority::DEFAULT.get().to_string();
        assert!(super::RANK_SQL.contains(&format!("(priority - {default}) * {step}")));
    }
}
