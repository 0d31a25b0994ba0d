//! The operator's side of the embedded store: queue settings and pause, attempt history, bulk
//! selections and changes, and retention (migration 4).
//!
//! Every write here runs in the writer's group commit like any other; bulk changes and purges
//! take bounded batches, so none holds the writer for long.

use rusqlite::{Connection, OptionalExtension, params};
use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::{
    Attempt, AttemptHistory, AttemptOutcome, AttemptResponse, DeadGroup, LIST_VISIT_BUDGET,
    QueueConfig, QueueSettings, RetentionRules, SelectPage, Selected, StoreError, TaskFilter,
    TransitionError, page_cursor,
};

use crate::rows::{self, TASK_COLUMNS};
use crate::{backend, run_filtered, state_of, update_returning};

const QUEUE_COLUMNS: &str = "queue, paused, paused_changed_at, config, updated_at";

fn queue_from_row(r: &rusqlite::Row<'_>) -> Result<QueueSettings, StoreError> {
    let config: String = r.get(3).map_err(backend)?;
    Ok(QueueSettings {
        queue: r.get(0).map_err(backend)?,
        paused: r.get::<_, i64>(1).map_err(backend)? != 0,
        paused_changed_at: r.get::<_, Option<i64>>(2).map_err(backend)?.map(Timestamp),
        config: serde_json::from_str(&config)
            .map_err(|e| StoreError::corrupt_from("queue config", e))?,
        updated_at: Timestamp(r.get(4).map_err(backend)?),
    })
}

pub(crate) fn queue_settings(
    conn: &Connection,
    queue: &str,
) -> Result<Option<QueueSettings>, StoreError> {
    let sql = format!("SELECT {QUEUE_COLUMNS} FROM queue_settings WHERE queue = ?1");
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let row = stmt
        .query_row(params![queue], |r| Ok(queue_from_row(r)))
        .optional()
        .map_err(backend)?;
    row.transpose()
}

pub(crate) fn list_queue_settings(conn: &Connection) -> Result<Vec<QueueSettings>, StoreError> {
    let sql = format!("SELECT {QUEUE_COLUMNS} FROM queue_settings ORDER BY queue");
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let mut rows = stmt.query([]).map_err(backend)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(backend)? {
        out.push(queue_from_row(r)?);
    }
    Ok(out)
}

pub(crate) fn put_queue_config(
    conn: &Connection,
    queue: &str,
    config: &QueueConfig,
    now: Timestamp,
) -> Result<QueueSettings, StoreError> {
    let json =
        serde_json::to_string(config).map_err(|e| StoreError::encode("queue settings", e))?;
    let sql = format!(
        "INSERT INTO queue_settings (queue, config, updated_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (queue) DO UPDATE SET config = excluded.config, \
         updated_at = excluded.updated_at RETURNING {QUEUE_COLUMNS}"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![queue, json, now.0], |r| Ok(queue_from_row(r)))
        .map_err(backend)?
}

pub(crate) fn set_queue_paused(
    conn: &Connection,
    queue: &str,
    paused: bool,
    now: Timestamp,
) -> Result<QueueSettings, StoreError> {
    let sql = format!(
        "INSERT INTO queue_settings (queue, paused, paused_changed_at, updated_at) \
         VALUES (?1, ?2, ?3, ?3) \
         ON CONFLICT (queue) DO UPDATE SET \
         paused_changed_at = CASE WHEN paused = excluded.paused THEN paused_changed_at \
                                  ELSE excluded.paused_changed_at END, \
         updated_at = CASE WHEN paused = excluded.paused THEN updated_at \
                           ELSE excluded.updated_at END, \
         paused = excluded.paused RETURNING {QUEUE_COLUMNS}"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![queue, i64::from(paused), now.0], |r| {
        Ok(queue_from_row(r))
    })
    .map_err(backend)?
}

pub(crate) fn earliest_waiting(
    conn: &Connection,
    queue: &str,
) -> Result<Option<Timestamp>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT MIN(due_at) FROM tasks INDEXED BY tasks_waiting \
             WHERE queue = ?1 AND state IN ('scheduled', 'ready')",
        )
        .map_err(backend)?;
    let t: Option<i64> = stmt
        .query_row(params![queue], |r| r.get(0))
        .map_err(backend)?;
    Ok(t.map(Timestamp))
}

pub(crate) fn attempts(
    conn: &Connection,
    id: &TaskId,
) -> Result<Option<AttemptHistory>, StoreError> {
    if state_of(conn, id)?.is_none() {
        return Ok(None);
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, execution_id, worker, started_at, ended_at, outcome, error, \
             status_code, content_type FROM task_attempts WHERE task_id = ?1 ORDER BY seq",
        )
        .map_err(backend)?;
    let mut rows = stmt.query(params![id.as_bytes()]).map_err(backend)?;
    let mut attempts = Vec::new();
    while let Some(r) = rows.next().map_err(backend)? {
        let exec: Option<Vec<u8>> = r.get(1).map_err(backend)?;
        let outcome: Option<String> = r.get(5).map_err(backend)?;
        attempts.push(Attempt {
            task_id: *id,
            seq: r.get::<_, i64>(0).map_err(backend)? as u64,
            execution_id: exec
                .map(|b| {
                    <[u8; 16]>::try_from(b.as_slice())
                        .map(ExecutionId::from_bytes)
                        .map_err(|_| StoreError::corrupt("attempt execution id"))
                })
                .transpose()?,
            worker: r.get(2).map_err(backend)?,
            started_at: Timestamp(r.get(3).map_err(backend)?),
            ended_at: r.get::<_, Option<i64>>(4).map_err(backend)?.map(Timestamp),
            outcome: outcome
                .map(|o| {
                    AttemptOutcome::parse(&o)
                        .ok_or_else(|| StoreError::corrupt(format!("attempt outcome {o:?}")))
                })
                .transpose()?,
            error: r.get(6).map_err(backend)?,
            status_code: r
                .get::<_, Option<i64>>(7)
                .map_err(backend)?
                .map(|c| {
                    u16::try_from(c)
                        .map_err(|_| StoreError::corrupt(format!("attempt status code {c}")))
                })
                .transpose()?,
            content_type: r.get(8).map_err(backend)?,
        });
    }
    let total = attempts.last().map(|a| a.seq).unwrap_or(0);
    Ok(Some(AttemptHistory { attempts, total }))
}

pub(crate) fn record_attempt_response(
    conn: &Connection,
    id: &TaskId,
    execution: &ExecutionId,
    response: &AttemptResponse,
) -> Result<bool, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "UPDATE task_attempts SET status_code = ?3, content_type = ?4 \
             WHERE task_id = ?1 AND execution_id = ?2",
        )
        .map_err(backend)?;
    let n = stmt
        .execute(params![
            id.as_bytes(),
            execution.as_bytes(),
            i64::from(response.status_code),
            response.content_type
        ])
        .map_err(backend)?;
    Ok(n > 0)
}

/// `dead`/`cancelled` → `scheduled`; `None` when the row is not in such a state or its key is
/// taken (the caller finds out which).
fn retry_one(
    conn: &Connection,
    id: &TaskId,
    due_at: Timestamp,
    now: Timestamp,
) -> Result<Option<Task>, StoreError> {
    // A key held by another live task would break `tasks_live_key`; such a task stays where it
    // is rather than fail the statement.
    let sql = format!(
        "UPDATE tasks SET state = 'scheduled', due_at = ?2, attempt = 0, execution_id = NULL, \
         lease_expires_at = NULL, worker = NULL, result = NULL, started_at = NULL, \
         finished_at = NULL, updated_at = ?3 \
         WHERE id = ?1 AND state IN ('dead', 'cancelled') AND (key IS NULL OR NOT EXISTS \
         (SELECT 1 FROM tasks o WHERE o.queue = tasks.queue AND o.key = tasks.key \
          AND o.state IN ('scheduled', 'ready', 'running'))) \
         RETURNING {TASK_COLUMNS}"
    );
    update_returning(conn, &sql, &[&id.as_bytes().as_slice(), &due_at.0, &now.0])
}

pub(crate) fn retry(
    conn: &Connection,
    id: &TaskId,
    due_at: Timestamp,
    now: Timestamp,
) -> Result<Task, TransitionError> {
    if let Some(t) = retry_one(conn, id, due_at, now)? {
        return Ok(t);
    }
    let Some(task) = crate::get_task(conn, id)? else {
        return Err(TransitionError::NotFound);
    };
    if !matches!(task.state, TaskState::Dead | TaskState::Cancelled) {
        return Err(TransitionError::WrongState { state: task.state });
    }
    let holder: Option<Vec<u8>> = conn
        .query_row(
            "SELECT id FROM tasks WHERE queue = ?1 AND key = ?2 \
             AND state IN ('scheduled', 'ready', 'running')",
            params![task.queue, task.key],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
    match holder {
        Some(b) => Err(TransitionError::KeyTaken {
            existing: rows::task_id(&b)?,
        }),
        None => Err(StoreError::RetryRefused { id: *id }.into()),
    }
}

pub(crate) fn retry_many(
    conn: &Connection,
    ids: &[TaskId],
    due_at: Timestamp,
    now: Timestamp,
) -> Result<Vec<Task>, StoreError> {
    let mut out = Vec::new();
    for id in ids {
        if let Some(t) = retry_one(conn, id, due_at, now)? {
            out.push(t);
        }
    }
    Ok(out)
}

pub(crate) fn cancel_many(
    conn: &Connection,
    ids: &[TaskId],
    now: Timestamp,
) -> Result<Vec<Task>, StoreError> {
    let sql = format!(
        "UPDATE tasks SET state = 'cancelled', updated_at = ?2, finished_at = ?2, \
         lease_expires_at = NULL \
         WHERE id = ?1 AND state IN ('scheduled', 'ready', 'running') \
         RETURNING {TASK_COLUMNS}"
    );
    let mut out = Vec::new();
    for id in ids {
        if let Some(t) = update_returning(conn, &sql, &[&id.as_bytes().as_slice(), &now.0])? {
            out.push(t);
        }
    }
    Ok(out)
}

pub(crate) fn select(
    conn: &Connection,
    filter: &TaskFilter,
    limit: usize,
) -> Result<SelectPage, StoreError> {
    // One row more than asked for tells whether another batch follows.
    let (mut selected, visited, oldest) = run_filtered(
        conn,
        filter,
        "t.id, t.state",
        limit.saturating_add(1),
        LIST_VISIT_BUDGET,
        |r| {
            let id: Vec<u8> = r.get(0).map_err(backend)?;
            let state: String = r.get(1).map_err(backend)?;
            Ok(Selected {
                id: rows::task_id(&id)?,
                state: rows::parse_state(&state)?,
            })
        },
    )?;
    let n = selected.len();
    selected.truncate(limit);
    let next_cursor = page_cursor(
        n,
        limit,
        selected.last().map(|s| s.id),
        visited,
        LIST_VISIT_BUDGET,
        oldest,
    );
    Ok(SelectPage {
        selected,
        next_cursor,
    })
}

/// Queues that have tasks in some terminal state, from the counters.
fn queues_with_finished(conn: &Connection) -> Result<Vec<(String, TaskState)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT queue, state FROM task_counts WHERE n > 0 \
             AND state IN ('succeeded', 'dead', 'cancelled') ORDER BY queue, state",
        )
        .map_err(backend)?;
    let mut rows = stmt.query([]).map_err(backend)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(backend)? {
        let state: String = r.get(1).map_err(backend)?;
        out.push((r.get(0).map_err(backend)?, rows::parse_state(&state)?));
    }
    Ok(out)
}

/// Deletes up to `limit` expired finished tasks: per queue and terminal state, the rows of
/// `tasks_finished` before that pair's cutoff. A live row is never in that index, and the delete
/// repeats the terminal-state condition.
pub(crate) fn purge_tasks(
    conn: &Connection,
    shard: Option<u32>,
    rules: &RetentionRules,
    now: Timestamp,
    limit: usize,
) -> Result<u64, StoreError> {
    let mut left = limit;
    let mut deleted = 0u64;
    for (queue, state) in queues_with_finished(conn)? {
        if left == 0 {
            break;
        }
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
        // Finished strictly before the cutoff (`finished_at + keep <= now` is expired).
        let cutoff = now
            .0
            .saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX))
            + 1;
        let n = match shard {
            None => conn
                .prepare_cached(
                    "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_finished \
                     WHERE queue = ?1 AND state = ?2 AND finished_at < ?3 \
                     AND state IN ('succeeded', 'dead', 'cancelled') LIMIT ?4) \
                     AND state IN ('succeeded', 'dead', 'cancelled')",
                )
                .map_err(backend)?
                .execute(params![queue, state.as_str(), cutoff, left as i64])
                .map_err(backend)?,
            Some(shard) => conn
                .prepare_cached(
                    "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_finished \
                     WHERE queue = ?1 AND state = ?2 AND shard = ?5 AND finished_at < ?3 \
                     AND state IN ('succeeded', 'dead', 'cancelled') LIMIT ?4) \
                     AND state IN ('succeeded', 'dead', 'cancelled')",
                )
                .map_err(backend)?
                .execute(params![queue, state.as_str(), cutoff, left as i64, shard])
                .map_err(backend)?,
        };
        deleted += n as u64;
        left = left.saturating_sub(n);
    }
    Ok(deleted)
}

/// [`sundial_store::error_group`] of `last_error` in SQL: its first line, at most
/// [`sundial_store::ERROR_GROUP_CHARS`] characters. The expression of the index
/// `tasks_dead_error` (migration 13), repeated here to the letter so that queries use it.
pub(crate) const ERROR_GROUP_SQL: &str = "substr(last_error, 1, CASE WHEN instr(last_error, char(10)) > 0 THEN min(instr(last_error, char(10)) - 1, 200) ELSE 200 END)";

/// [`sundial_store::Store::dead_groups`]: one aggregate over the partial index
/// `tasks_dead_error` (named, so a plan that would read the table fails instead).
pub(crate) fn dead_groups(
    conn: &Connection,
    queue: Option<&str>,
    prefix: Option<&str>,
    default_only: bool,
    limit: usize,
) -> Result<Vec<DeadGroup>, StoreError> {
    // The namespace test as the task list makes it: an exact prefix, or no separator (char 31).
    let sql = format!(
        "SELECT queue, {g} AS g, count(*) AS n, max(id) FROM tasks INDEXED BY tasks_dead_error \
         WHERE state = 'dead' AND (?1 IS NULL OR queue = ?1) \
         AND (?3 IS NULL OR substr(queue, 1, length(?3)) = ?3) \
         AND (NOT ?4 OR instr(queue, char(31)) = 0) GROUP BY queue, {g} \
         ORDER BY n DESC, queue, g IS NOT NULL, g LIMIT ?2",
        g = ERROR_GROUP_SQL
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let mut found = stmt
        .query(params![
            queue,
            limit.min(i64::MAX as usize) as i64,
            prefix,
            default_only
        ])
        .map_err(backend)?;
    let mut out = Vec::new();
    while let Some(r) = found.next().map_err(backend)? {
        let newest: Vec<u8> = r.get(3).map_err(backend)?;
        out.push(DeadGroup {
            queue: r.get(0).map_err(backend)?,
            error: r.get(1).map_err(backend)?,
            count: r.get::<_, i64>(2).map_err(backend)? as u64,
            newest: rows::task_id(&newest)?,
        });
    }
    Ok(out)
}
