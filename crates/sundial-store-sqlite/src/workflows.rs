//! [`WorkflowStore`] on SQLite: tables `workflow_runs`, `workflows`, `workflow_history` and
//! `workflow_markers` (schema migration 3).
//!
//! Every write runs as one job of the group-committing writer, so everything it does (events, the
//! run row, the tasks it inserts or cancels, the next run, the parent's events) commits or rolls
//! back together. Conditions are checked inside the job, on the row as it is in the transaction:
//! the writer is the only writer, so nothing can change between the check and the write.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sundial_core::{NewTask, RunId, Task, TaskId, Timestamp};
use sundial_store::{
    AppendOp, Appended, Committed, Fence, HistoryEvent, IdReusePolicy, Inserted, NewEvent, NewRun,
    ParentLink, StartedRun, StoreError, TerminateOp, Terminated, WorkflowFilter, WorkflowPage,
    WorkflowRun, WorkflowStatus, WorkflowStore, WorkflowStoreError, WorkflowTaskCommit,
    activity_queue, run_task_key_prefix, workflow_queue,
};

use crate::{SqliteStore, backend, insert_many, rows};

const RUN_COLUMNS: &str = "r.run_id, r.workflow_id, r.workflow_type, r.input, r.status, r.result, \
    r.error, r.history_len, r.pending_task, r.parent_run, r.parent_workflow, r.parent_cmd, \
    r.continued_from, r.continued_to, r.created_at, r.updated_at, r.closed_at";

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

fn run_id(b: &[u8]) -> Result<RunId, StoreError> {
    let bytes: [u8; 16] = b
        .try_into()
        .map_err(|_| corrupt("run id", format!("{} bytes, expected 16", b.len())))?;
    Ok(RunId::from_bytes(bytes))
}

fn opt_run_id(b: Option<Vec<u8>>) -> Result<Option<RunId>, StoreError> {
    b.map(|b| run_id(&b)).transpose()
}

fn opt_task_id(b: Option<Vec<u8>>) -> Result<Option<TaskId>, StoreError> {
    b.map(|b| rows::task_id(&b)).transpose()
}

fn run_from_row(r: &Row<'_>) -> Result<WorkflowRun, StoreError> {
    let id: Vec<u8> = r.get(0).map_err(backend)?;
    let status: String = r.get(4).map_err(backend)?;
    let parent_run: Option<Vec<u8>> = r.get(9).map_err(backend)?;
    let parent_workflow: Option<String> = r.get(10).map_err(backend)?;
    let parent_cmd: Option<i64> = r.get(11).map_err(backend)?;
    let parent = match (parent_run, parent_workflow, parent_cmd) {
        (Some(run), Some(workflow_id), Some(cmd)) => Some(ParentLink {
            run_id: run_id(&run)?,
            workflow_id,
            cmd: u32::try_from(cmd).map_err(|e| corrupt("parent cmd", e))?,
        }),
        (None, None, None) => None,
        _ => return Err(corrupt("parent link", "partially set")),
    };
    Ok(WorkflowRun {
        run_id: run_id(&id)?,
        workflow_id: r.get(1).map_err(backend)?,
        workflow_type: r.get(2).map_err(backend)?,
        input: r.get(3).map_err(backend)?,
        status: status
            .parse()
            .map_err(|e: String| corrupt("workflow status", e))?,
        result: r.get(5).map_err(backend)?,
        error: r.get(6).map_err(backend)?,
        history_len: r.get::<_, i64>(7).map_err(backend)?.max(0) as u64,
        pending_task: opt_task_id(r.get(8).map_err(backend)?)?,
        parent,
        continued_from: opt_run_id(r.get(12).map_err(backend)?)?,
        continued_to: opt_run_id(r.get(13).map_err(backend)?)?,
        created_at: Timestamp(r.get(14).map_err(backend)?),
        updated_at: Timestamp(r.get(15).map_err(backend)?),
        closed_at: r.get::<_, Option<i64>>(16).map_err(backend)?.map(Timestamp),
    })
}

fn load_run(conn: &Connection, id: RunId) -> Result<Option<WorkflowRun>, StoreError> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM workflow_runs r WHERE r.run_id = ?1");
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![id.as_bytes()], |r| Ok(run_from_row(r)))
        .optional()
        .map_err(backend)?
        .transpose()
}

fn must_load(conn: &Connection, id: RunId) -> Result<WorkflowRun, WorkflowStoreError> {
    load_run(conn, id)?.ok_or(WorkflowStoreError::NotFound)
}

fn load_current(conn: &Connection, workflow_id: &str) -> Result<Option<WorkflowRun>, StoreError> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM workflows w JOIN workflow_runs r ON r.run_id = w.run_id \
         WHERE w.workflow_id = ?1"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![workflow_id], |r| Ok(run_from_row(r)))
        .optional()
        .map_err(backend)?
        .transpose()
}

fn insert_events(
    conn: &Connection,
    run: RunId,
    from: u64,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO workflow_history (run_id, seq, at, event) VALUES (?1, ?2, ?3, ?4)",
        )
        .map_err(backend)?;
    for (i, e) in events.iter().enumerate() {
        let seq = i64::try_from(from + i as u64).map_err(|e| corrupt("event seq", e))?;
        stmt.execute(params![run.as_bytes(), seq, e.at.0, e.data])
            .map_err(backend)?;
    }
    Ok(())
}

fn insert_tasks(conn: &Connection, tasks: &[NewTask]) -> Result<Vec<Task>, StoreError> {
    insert_many(conn, tasks)?
        .into_iter()
        .map(|i| match i {
            Inserted::Created(t) => Ok(*t),
            Inserted::Duplicate { existing } => Err(StoreError::InternalKeyTaken { existing }),
        })
        .collect()
}

fn task_is_live(conn: &Connection, id: TaskId) -> Result<bool, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT 1 FROM tasks WHERE id = ?1 AND state IN ('scheduled', 'ready', 'running')",
        )
        .map_err(backend)?;
    Ok(stmt
        .query_row(params![id.as_bytes()], |_| Ok(()))
        .optional()
        .map_err(backend)?
        .is_some())
}

const CANCEL_REASON: &str = "cancelled by its workflow";

/// Cancels the given tasks where still live; returns those it cancelled.
fn cancel_ids(
    conn: &Connection,
    ids: &[TaskId],
    now: Timestamp,
) -> Result<Vec<TaskId>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "UPDATE tasks SET state = 'cancelled', updated_at = ?2, finished_at = ?2, \
             lease_expires_at = NULL, last_error = ?3 \
             WHERE id = ?1 AND state IN ('scheduled', 'ready', 'running')",
        )
        .map_err(backend)?;
    let mut out = Vec::new();
    for id in ids {
        if stmt
            .execute(params![id.as_bytes(), now.0, CANCEL_REASON])
            .map_err(backend)?
            > 0
        {
            out.push(*id);
        }
    }
    Ok(out)
}

/// Cancels every live task keyed under the run's prefix, in both workflow queues of the
/// namespace of `workflow_id` (the run's).
fn cancel_run_tasks(
    conn: &Connection,
    run: RunId,
    workflow_id: &str,
    now: Timestamp,
) -> Result<Vec<TaskId>, StoreError> {
    let ns = sundial_core::namespace::namespace_of(workflow_id);
    let lo = run_task_key_prefix(&run);
    // '/' + 1 = '0': every key starting with the prefix sorts in [lo, hi).
    let hi = format!("{}0", &lo[..lo.len() - 1]);
    let mut stmt = conn
        .prepare_cached(
            "UPDATE tasks SET state = 'cancelled', updated_at = ?4, finished_at = ?4, \
             lease_expires_at = NULL, last_error = ?5 \
             WHERE queue = ?1 AND key >= ?2 AND key < ?3 \
             AND state IN ('scheduled', 'ready', 'running') RETURNING id",
        )
        .map_err(backend)?;
    let mut out = Vec::new();
    for queue in [workflow_queue(ns), activity_queue(ns)] {
        let ids: Vec<Vec<u8>> = stmt
            .query_map(params![queue, lo, hi, now.0, CANCEL_REASON], |r| r.get(0))
            .map_err(backend)?
            .collect::<Result<_, _>>()
            .map_err(backend)?;
        for id in ids {
            out.push(rows::task_id(&id)?);
        }
    }
    Ok(out)
}

/// Inserts the run, its first event and first task, and points its workflow id at it.
fn create_run(conn: &Connection, run: NewRun) -> Result<StartedRun, StoreError> {
    let task = insert_tasks(conn, std::slice::from_ref(&run.first_task))?
        .pop()
        .ok_or(StoreError::NoRow {
            what: "task insert",
        })?;
    let (parent_run, parent_workflow, parent_cmd) = match &run.parent {
        Some(p) => (
            Some(p.run_id.as_bytes().to_vec()),
            Some(p.workflow_id.clone()),
            Some(i64::from(p.cmd)),
        ),
        None => (None, None, None),
    };
    conn.prepare_cached(
        "INSERT INTO workflow_runs (run_id, workflow_id, workflow_type, input, status, \
         history_len, pending_task, parent_run, parent_workflow, parent_cmd, continued_from, \
         created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'running', 1, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
    )
    .map_err(backend)?
    .execute(params![
        run.run_id.as_bytes(),
        run.workflow_id,
        run.workflow_type,
        run.input,
        task.id.as_bytes(),
        parent_run,
        parent_workflow,
        parent_cmd,
        run.continued_from.map(|r| r.as_bytes().to_vec()),
        run.now.0,
    ])
    .map_err(backend)?;
    insert_events(conn, run.run_id, 0, std::slice::from_ref(&run.started))?;
    conn.prepare_cached(
        "INSERT INTO workflows (workflow_id, run_id) VALUES (?1, ?2) \
         ON CONFLICT (workflow_id) DO UPDATE SET run_id = excluded.run_id",
    )
    .map_err(backend)?
    .execute(params![run.workflow_id, run.run_id.as_bytes()])
    .map_err(backend)?;
    let stored = load_run(conn, run.run_id)?.ok_or(StoreError::NoRow {
        what: "inserted run",
    })?;
    Ok(StartedRun { run: stored, task })
}

fn append_in(conn: &Connection, op: AppendOp) -> Result<Appended, WorkflowStoreError> {
    let run = must_load(conn, op.run_id)?;
    if run.status.is_closed() {
        return Err(WorkflowStoreError::NotRunning { status: run.status });
    }
    if let Some(marker) = &op.marker {
        let n = conn
            .prepare_cached(
                "INSERT INTO workflow_markers (run_id, marker) VALUES (?1, ?2) \
                 ON CONFLICT DO NOTHING",
            )
            .map_err(backend)?
            .execute(params![op.run_id.as_bytes(), marker])
            .map_err(backend)?;
        if n == 0 {
            return Err(WorkflowStoreError::Duplicate);
        }
    }
    insert_events(conn, op.run_id, run.history_len, &op.events)?;
    let pending_live = match run.pending_task {
        Some(t) => task_is_live(conn, t)?,
        None => false,
    };
    let task = if pending_live {
        None
    } else {
        insert_tasks(conn, std::slice::from_ref(&op.workflow_task))?.pop()
    };
    let new_len = run.history_len + op.events.len() as u64;
    conn.prepare_cached(
        "UPDATE workflow_runs SET history_len = ?2, pending_task = COALESCE(?3, pending_task), \
         updated_at = ?4 WHERE run_id = ?1",
    )
    .map_err(backend)?
    .execute(params![
        op.run_id.as_bytes(),
        new_len as i64,
        task.as_ref().map(|t| t.id.as_bytes().to_vec()),
        op.now.0
    ])
    .map_err(backend)?;
    Ok(Appended {
        run: must_load(conn, op.run_id)?,
        first_seq: run.history_len,
        task,
    })
}

/// A parent's append as part of a child's close: a parent that is gone or closed (or heard of
/// this already) is not an error.
fn append_parent(
    conn: &Connection,
    op: Option<AppendOp>,
) -> Result<Option<Appended>, WorkflowStoreError> {
    let Some(op) = op else { return Ok(None) };
    match append_in(conn, op) {
        Ok(a) => Ok(Some(a)),
        Err(
            WorkflowStoreError::NotFound
            | WorkflowStoreError::NotRunning { .. }
            | WorkflowStoreError::Duplicate,
        ) => Ok(None),
        Err(e) => Err(e),
    }
}

fn close_run(
    conn: &Connection,
    run: RunId,
    status: WorkflowStatus,
    result: Option<String>,
    error: Option<String>,
    continued_to: Option<RunId>,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE workflow_runs SET status = ?2, result = ?3, error = ?4, continued_to = ?5, \
         pending_task = NULL, closed_at = ?6, updated_at = ?6 WHERE run_id = ?1",
    )
    .map_err(backend)?
    .execute(params![
        run.as_bytes(),
        status.as_str(),
        result,
        error,
        continued_to.map(|r| r.as_bytes().to_vec()),
        now.0
    ])
    .map_err(backend)?;
    Ok(())
}

fn commit(conn: &Connection, op: WorkflowTaskCommit) -> Result<Committed, WorkflowStoreError> {
    let run = must_load(conn, op.run_id)?;
    if run.status.is_closed() {
        return Err(WorkflowStoreError::NotRunning { status: run.status });
    }
    if run.history_len != op.expect_len || run.pending_task != Some(op.expect_task) {
        return Err(WorkflowStoreError::Stale {
            history_len: run.history_len,
            pending_task: run.pending_task,
        });
    }
    insert_events(conn, op.run_id, run.history_len, &op.events)?;
    let tasks = insert_tasks(conn, &op.tasks)?;
    let mut cancelled = cancel_ids(conn, &op.cancel, op.now)?;
    let new_len = run.history_len + op.events.len() as u64;
    conn.prepare_cached(
        "UPDATE workflow_runs SET history_len = ?2, pending_task = NULL, updated_at = ?3 \
         WHERE run_id = ?1",
    )
    .map_err(backend)?
    .execute(params![op.run_id.as_bytes(), new_len as i64, op.now.0])
    .map_err(backend)?;
    let mut next_run = None;
    let mut parent = None;
    if let Some(close) = op.close {
        if !close.status.is_closed() {
            return Err(StoreError::CloseAsRunning.into());
        }
        cancelled.extend(cancel_run_tasks(conn, op.run_id, &run.workflow_id, op.now)?);
        let next_id = op.continue_as.as_ref().map(|n| n.run_id);
        close_run(
            conn,
            op.run_id,
            close.status,
            close.result,
            close.error,
            next_id,
            op.now,
        )?;
        if let Some(next) = op.continue_as {
            if next.workflow_id != run.workflow_id {
                return Err(StoreError::ContinueAsNewChangesId.into());
            }
            next_run = Some(create_run(conn, next)?);
        }
        parent = append_parent(conn, op.parent)?;
    }
    Ok(Committed {
        run: must_load(conn, op.run_id)?,
        tasks,
        cancelled,
        next_run,
        parent,
    })
}

fn terminate(conn: &Connection, op: TerminateOp) -> Result<Terminated, WorkflowStoreError> {
    let run = must_load(conn, op.run_id)?;
    if run.status.is_closed() {
        return Err(WorkflowStoreError::NotRunning { status: run.status });
    }
    insert_events(
        conn,
        op.run_id,
        run.history_len,
        std::slice::from_ref(&op.event),
    )?;
    conn.prepare_cached("UPDATE workflow_runs SET history_len = ?2 WHERE run_id = ?1")
        .map_err(backend)?
        .execute(params![op.run_id.as_bytes(), (run.history_len + 1) as i64])
        .map_err(backend)?;
    let mut cancelled = match run.pending_task {
        Some(t) => cancel_ids(conn, &[t], op.now)?,
        None => Vec::new(),
    };
    cancelled.extend(cancel_run_tasks(conn, op.run_id, &run.workflow_id, op.now)?);
    close_run(
        conn,
        op.run_id,
        WorkflowStatus::Terminated,
        None,
        Some(op.reason),
        None,
        op.now,
    )?;
    let parent = append_parent(conn, op.parent)?;
    Ok(Terminated {
        run: must_load(conn, op.run_id)?,
        cancelled,
        parent,
    })
}

/// Retention of closed runs: up to `limit` runs closed before `before`, oldest close first
/// (served by `workflow_runs_closed`), each with its history, markers and the workflow id's
/// pointer when it still names the run. Running runs have no `closed_at` and never match.
fn purge_closed(conn: &Connection, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
    let runs: Vec<(Vec<u8>, String)> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT run_id, workflow_id FROM workflow_runs INDEXED BY workflow_runs_closed \
                 WHERE closed_at IS NOT NULL AND closed_at < ?1 AND status <> 'running' \
                 ORDER BY closed_at LIMIT ?2",
            )
            .map_err(backend)?;
        let rows = stmt
            .query_map(
                params![before.0, i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(backend)?;
        rows.collect::<Result<_, _>>().map_err(backend)?
    };
    let mut deleted = 0u64;
    for (run, workflow_id) in &runs {
        for sql in [
            "DELETE FROM workflow_history WHERE run_id = ?1",
            "DELETE FROM workflow_markers WHERE run_id = ?1",
        ] {
            conn.prepare_cached(sql)
                .map_err(backend)?
                .execute(params![run])
                .map_err(backend)?;
        }
        conn.prepare_cached("DELETE FROM workflows WHERE workflow_id = ?1 AND run_id = ?2")
            .map_err(backend)?
            .execute(params![workflow_id, run])
            .map_err(backend)?;
        deleted += conn
            .prepare_cached(
                "DELETE FROM workflow_runs WHERE run_id = ?1 AND closed_at IS NOT NULL \
                 AND status <> 'running'",
            )
            .map_err(backend)?
            .execute(params![run])
            .map_err(backend)? as u64;
    }
    Ok(deleted)
}

#[async_trait]
impl WorkflowStore for SqliteStore {
    async fn start_run(
        &self,
        run: NewRun,
        reuse: IdReusePolicy,
    ) -> Result<StartedRun, WorkflowStoreError> {
        self.writer
            .write(move |conn| {
                if let Some(current) = load_current(conn, &run.workflow_id)? {
                    if !current.status.is_closed() {
                        return Err(WorkflowStoreError::AlreadyRunning {
                            run_id: current.run_id,
                        });
                    }
                    if !reuse.allows(current.status) {
                        return Err(WorkflowStoreError::AlreadyExists {
                            run_id: current.run_id,
                            status: current.status,
                        });
                    }
                }
                Ok(create_run(conn, run)?)
            })
            .await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<WorkflowRun>, StoreError> {
        self.read(move |conn| load_run(conn, run_id)).await
    }

    async fn current_run(&self, workflow_id: &str) -> Result<Option<WorkflowRun>, StoreError> {
        let id = workflow_id.to_string();
        self.read(move |conn| load_current(conn, &id)).await
    }

    async fn list_workflows(
        &self,
        filter: &WorkflowFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<WorkflowPage, StoreError> {
        let filter = filter.clone();
        let after = after.map(str::to_string);
        self.read(move |conn| {
            let sql = format!(
                "SELECT {RUN_COLUMNS} FROM workflows w JOIN workflow_runs r ON r.run_id = w.run_id \
                 WHERE (?1 IS NULL OR w.workflow_id > ?1) \
                 AND (?2 IS NULL OR r.workflow_type = ?2) AND (?3 IS NULL OR r.status = ?3) \
                 AND (?5 IS NULL OR substr(w.workflow_id, 1, length(?5)) = ?5) \
                 AND (NOT ?6 OR instr(w.workflow_id, char(31)) = 0) \
                 ORDER BY w.workflow_id LIMIT ?4"
            );
            // ?5: the namespace's stored prefix of ids (ASCII, so `length` counts its bytes);
            // ?6: the default namespace's, the ids without the separator (char 31).
            let prefix = filter.id_prefix();
            let default_only = filter.default_only();
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt
                .query(params![
                    after,
                    filter.workflow_type,
                    filter.status.map(|s| s.as_str()),
                    limit.saturating_add(1) as i64,
                    prefix,
                    default_only
                ])
                .map_err(backend)?;
            let mut runs = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                runs.push(run_from_row(r)?);
            }
            let next_cursor = if runs.len() > limit {
                runs.truncate(limit);
                runs.last().map(|r| r.workflow_id.clone())
            } else {
                None
            };
            Ok(WorkflowPage { runs, next_cursor })
        })
        .await
    }

    async fn history(
        &self,
        run_id: RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEvent>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT seq, at, event FROM workflow_history WHERE run_id = ?1 AND seq >= ?2 \
                     ORDER BY seq LIMIT ?3",
                )
                .map_err(backend)?;
            let mut rows = stmt
                .query(params![
                    run_id.as_bytes(),
                    i64::try_from(from).unwrap_or(i64::MAX),
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ])
                .map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                out.push(HistoryEvent {
                    seq: r.get::<_, i64>(0).map_err(backend)?.max(0) as u64,
                    at: Timestamp(r.get(1).map_err(backend)?),
                    data: r.get(2).map_err(backend)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn has_marker(&self, run_id: RunId, marker: &str) -> Result<bool, StoreError> {
        let marker = marker.to_string();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT 1 FROM workflow_markers WHERE run_id = ?1 AND marker = ?2")
                .map_err(backend)?;
            Ok(stmt
                .query_row(params![run_id.as_bytes(), marker], |_| Ok(()))
                .optional()
                .map_err(backend)?
                .is_some())
        })
        .await
    }

    async fn append(&self, op: AppendOp) -> Result<Appended, WorkflowStoreError> {
        self.writer.write(move |conn| append_in(conn, op)).await
    }

    async fn commit_workflow_task(
        &self,
        op: WorkflowTaskCommit,
    ) -> Result<Committed, WorkflowStoreError> {
        self.writer.write(move |conn| commit(conn, op)).await
    }

    async fn terminate(&self, op: TerminateOp) -> Result<Terminated, WorkflowStoreError> {
        self.writer.write(move |conn| terminate(conn, op)).await
    }

    async fn purge_closed_runs(
        &self,
        before: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        // No shard leases here (see `claim_due`): no fence is current.
        if let Some(f) = fence {
            return Err(StoreError::LeaseLost { shard: f.shard });
        }
        self.writer
            .write(move |conn| purge_closed(conn, before, limit))
            .await
    }
}
