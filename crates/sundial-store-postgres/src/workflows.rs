//! [`WorkflowStore`] on PostgreSQL: tables `workflow_runs`, `workflows`, `workflow_history` and
//! `workflow_markers` (migration 4), with the semantics of the SQLite implementation.
//!
//! Every write is one transaction, and every write that depends on a run's current row (`append`,
//! `commit_workflow_task`, `terminate`) first locks that row (`SELECT … FOR UPDATE`): the writes
//! of one run are serialised, and each checks its conditions (running, history length, pending
//! task) on the row its predecessor committed. `start_run` locks the workflow id's row in
//! `workflows` instead (or claims it with `INSERT … ON CONFLICT DO NOTHING`, which waits for a
//! concurrent claimer and then sees its row), so of two starts of one id one wins and the other
//! sees a running run. Events, tasks, cancellations, the next run and the parent's events are
//! written in the same transaction; an error anywhere rolls all of it back.
//!
//! Lock order: a run's row, then (on continue-as-new) its workflow id's row, then (a child's
//! close) its parent's run row. Parents never lock their children's rows, and `start_run` locks
//! the id's row but never a run row, so no two writes wait for each other crosswise.

use std::collections::HashSet;

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use sundial_core::{NewTask, RunId, Task, TaskId, Timestamp};
use sundial_store::audit_scope;
use sundial_store::{
    AppendOp, Appended, Committed, Fence, HistoryEvent, IdReusePolicy, Inserted, NewEvent, NewRun,
    ParentLink, StartedRun, StoreError, TerminateOp, Terminated, WorkflowFilter, WorkflowPage,
    WorkflowRun, WorkflowStatus, WorkflowStore, WorkflowStoreError, WorkflowTaskCommit,
    activity_queue, run_task_key_prefix, workflow_queue,
};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::rows::col;
use crate::{PostgresStore, limit_param, pg, query, query_opt, query_planned_per_call};

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

fn count(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(what, format!("{v} is negative")))
}

fn seq_param(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::TooLarge {
        what: "event number",
        value: u128::from(v),
    })
}

fn run_from_row(r: &Row) -> Result<WorkflowRun, StoreError> {
    let status: String = col(r, 4)?;
    let parent_run: Option<Uuid> = col(r, 9)?;
    let parent_workflow: Option<String> = col(r, 10)?;
    let parent_cmd: Option<i64> = col(r, 11)?;
    let parent = match (parent_run, parent_workflow, parent_cmd) {
        (Some(run), Some(workflow_id), Some(cmd)) => Some(ParentLink {
            run_id: RunId(run),
            workflow_id,
            cmd: u32::try_from(cmd).map_err(|e| corrupt("parent cmd", e))?,
        }),
        (None, None, None) => None,
        _ => return Err(corrupt("parent link", "partially set")),
    };
    Ok(WorkflowRun {
        run_id: RunId(col(r, 0)?),
        workflow_id: col(r, 1)?,
        workflow_type: col(r, 2)?,
        input: col(r, 3)?,
        status: status
            .parse()
            .map_err(|e: String| corrupt("workflow status", e))?,
        result: col(r, 5)?,
        error: col(r, 6)?,
        history_len: count(col(r, 7)?, "history length")?,
        pending_task: col::<Option<Uuid>>(r, 8)?.map(TaskId),
        parent,
        continued_from: col::<Option<Uuid>>(r, 12)?.map(RunId),
        continued_to: col::<Option<Uuid>>(r, 13)?.map(RunId),
        created_at: Timestamp(col(r, 14)?),
        updated_at: Timestamp(col(r, 15)?),
        closed_at: col::<Option<i64>>(r, 16)?.map(Timestamp),
    })
}

impl PostgresStore {
    async fn load_run(
        &self,
        client: &impl GenericClient,
        id: RunId,
    ) -> Result<Option<WorkflowRun>, StoreError> {
        query_opt(client, &self.sql.workflows.get, &[&id.0])
            .await?
            .map(|r| run_from_row(&r))
            .transpose()
    }

    /// The run's row, locked until the transaction ends.
    async fn lock_run(
        &self,
        tx: &impl GenericClient,
        id: RunId,
    ) -> Result<WorkflowRun, WorkflowStoreError> {
        match query_opt(tx, &self.sql.workflows.lock, &[&id.0]).await? {
            Some(r) => Ok(run_from_row(&r)?),
            None => Err(WorkflowStoreError::NotFound),
        }
    }

    async fn reload_run(
        &self,
        tx: &impl GenericClient,
        id: RunId,
    ) -> Result<WorkflowRun, StoreError> {
        self.load_run(tx, id).await?.ok_or(StoreError::NoRow {
            what: "the run in its own transaction",
        })
    }

    async fn insert_events(
        &self,
        tx: &impl GenericClient,
        run: RunId,
        from: u64,
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let ats: Vec<i64> = events.iter().map(|e| e.at.0).collect();
        let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
        query(
            tx,
            &self.sql.workflows.insert_events,
            &[&run.0, &seq_param(from)?, &ats, &data],
        )
        .await?;
        Ok(())
    }

    /// Inserts workflow-owned tasks; a live task holding one's key is an error (the whole
    /// transaction then rolls back).
    async fn insert_owned(
        &self,
        tx: &impl GenericClient,
        tasks: &[NewTask],
    ) -> Result<Vec<Task>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        self.insert_in(tx, tasks)
            .await?
            .into_iter()
            .map(|i| match i {
                Inserted::Created(t) => Ok(*t),
                Inserted::Duplicate { existing } => Err(StoreError::InternalKeyTaken { existing }),
            })
            .collect()
    }

    /// Cancels the given tasks where still live; returns those it cancelled, in the given order.
    async fn cancel_ids(
        &self,
        tx: &impl GenericClient,
        ids: &[TaskId],
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let uuids: Vec<Uuid> = ids.iter().map(|t| t.0).collect();
        let mut done: HashSet<Uuid> = HashSet::new();
        for r in query(tx, &self.sql.workflows.cancel_ids, &[&uuids, &now.0]).await? {
            done.insert(col(&r, 0)?);
        }
        let mut out = Vec::with_capacity(done.len());
        for id in ids {
            if done.remove(&id.0) {
                out.push(*id);
            }
        }
        Ok(out)
    }

    /// Cancels every live task keyed under the run's prefix, in both workflow queues of the
    /// namespace of `workflow_id` (the run's).
    async fn cancel_run_tasks(
        &self,
        tx: &impl GenericClient,
        run: RunId,
        workflow_id: &str,
        now: Timestamp,
    ) -> Result<Vec<TaskId>, StoreError> {
        let lo = run_task_key_prefix(&run);
        // '/' + 1 = '0': in byte order, every key starting with the prefix is in [lo, hi).
        let hi = format!("{}0", lo.trim_end_matches('/'));
        let ns = sundial_core::namespace::namespace_of(workflow_id);
        let rows = if ns == sundial_core::namespace::DEFAULT_NAMESPACE {
            query(
                tx,
                &self.sql.workflows.cancel_run_tasks,
                &[&lo, &hi, &now.0],
            )
            .await?
        } else {
            query(
                tx,
                &self.sql.workflows.cancel_run_tasks_in,
                &[&lo, &hi, &now.0, &workflow_queue(ns), &activity_queue(ns)],
            )
            .await?
        };
        let mut out: Vec<TaskId> = rows
            .iter()
            .map(|r| col::<Uuid>(r, 0).map(TaskId))
            .collect::<Result<_, _>>()?;
        out.sort();
        Ok(out)
    }

    async fn set_len(
        &self,
        tx: &impl GenericClient,
        run: RunId,
        len: u64,
        pending: Option<TaskId>,
        clear_pending: bool,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        query(
            tx,
            &self.sql.workflows.set_len,
            &[
                &run.0,
                &seq_param(len)?,
                &pending.map(|t| t.0),
                &now.0,
                &clear_pending,
            ],
        )
        .await?;
        Ok(())
    }

    /// Inserts the run, its first event and first task. The caller has pointed (or points) its
    /// workflow id at it.
    async fn create_run(
        &self,
        tx: &impl GenericClient,
        run: NewRun,
    ) -> Result<StartedRun, StoreError> {
        let task = self
            .insert_owned(tx, std::slice::from_ref(&run.first_task))
            .await?
            .pop()
            .ok_or(StoreError::NoRow {
                what: "task insert",
            })?;
        let (parent_run, parent_workflow, parent_cmd) = match &run.parent {
            Some(p) => (
                Some(p.run_id.0),
                Some(p.workflow_id.as_str()),
                Some(i64::from(p.cmd)),
            ),
            None => (None, None, None),
        };
        query(
            tx,
            &self.sql.workflows.insert_run,
            &[
                &run.run_id.0,
                &run.workflow_id,
                &run.workflow_type,
                &run.input,
                &task.id.0,
                &parent_run,
                &parent_workflow,
                &parent_cmd,
                &run.continued_from.map(|r| r.0),
                &run.now.0,
            ],
        )
        .await?;
        self.insert_events(tx, run.run_id, 0, std::slice::from_ref(&run.started))
            .await?;
        let stored = self.reload_run(tx, run.run_id).await?;
        Ok(StartedRun { run: stored, task })
    }

    /// Makes `run`'s workflow id name it: claims the id when it is new, otherwise locks its row,
    /// checks the current run against `reuse` (`None`: continue-as-new, whose caller holds the
    /// current run) and points the id at the new run.
    async fn claim_workflow_id(
        &self,
        tx: &impl GenericClient,
        workflow_id: &str,
        run: RunId,
        reuse: Option<IdReusePolicy>,
    ) -> Result<(), WorkflowStoreError> {
        let sql = &self.sql.workflows;
        if query_opt(tx, &sql.claim_id, &[&workflow_id, &run.0])
            .await?
            .is_some()
        {
            return Ok(());
        }
        let Some(row) = query_opt(tx, &sql.lock_id, &[&workflow_id]).await? else {
            return Err(StoreError::WorkflowIdWithoutRun {
                workflow_id: workflow_id.to_string(),
            }
            .into());
        };
        if let Some(reuse) = reuse {
            let current = RunId(col(&row, 0)?);
            let status: String = col(&row, 1)?;
            let status: WorkflowStatus = status
                .parse()
                .map_err(|e: String| corrupt("workflow status", e))?;
            if !status.is_closed() {
                return Err(WorkflowStoreError::AlreadyRunning { run_id: current });
            }
            if !reuse.allows(status) {
                return Err(WorkflowStoreError::AlreadyExists {
                    run_id: current,
                    status,
                });
            }
        }
        query(tx, &sql.point_id, &[&workflow_id, &run.0]).await?;
        Ok(())
    }

    async fn append_in(
        &self,
        tx: &impl GenericClient,
        op: AppendOp,
    ) -> Result<Appended, WorkflowStoreError> {
        let run = self.lock_run(tx, op.run_id).await?;
        if run.status.is_closed() {
            return Err(WorkflowStoreError::NotRunning { status: run.status });
        }
        if let Some(marker) = &op.marker
            && query_opt(
                tx,
                &self.sql.workflows.insert_marker,
                &[&op.run_id.0, marker],
            )
            .await?
            .is_none()
        {
            return Err(WorkflowStoreError::Duplicate);
        }
        self.insert_events(tx, op.run_id, run.history_len, &op.events)
            .await?;
        let pending_live = match run.pending_task {
            Some(t) => query_opt(tx, &self.sql.workflows.task_is_live, &[&t.0])
                .await?
                .is_some(),
            None => false,
        };
        let task = if pending_live {
            None
        } else {
            self.insert_owned(tx, std::slice::from_ref(&op.workflow_task))
                .await?
                .pop()
        };
        let new_len = run.history_len + op.events.len() as u64;
        self.set_len(
            tx,
            op.run_id,
            new_len,
            task.as_ref().map(|t| t.id),
            false,
            op.now,
        )
        .await?;
        Ok(Appended {
            run: self.reload_run(tx, op.run_id).await?,
            first_seq: run.history_len,
            task,
        })
    }

    /// A parent's append as part of a child's close: a parent that is gone or closed (or heard
    /// of this already) is not an error. Those refusals are found before anything is written
    /// (the marker insert that finds a duplicate writes nothing), so the transaction goes on.
    async fn append_parent(
        &self,
        tx: &impl GenericClient,
        op: Option<AppendOp>,
    ) -> Result<Option<Appended>, WorkflowStoreError> {
        let Some(op) = op else { return Ok(None) };
        match self.append_in(tx, op).await {
            Ok(a) => Ok(Some(a)),
            Err(
                WorkflowStoreError::NotFound
                | WorkflowStoreError::NotRunning { .. }
                | WorkflowStoreError::Duplicate,
            ) => Ok(None),
            Err(e) => Err(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn close_run(
        &self,
        tx: &impl GenericClient,
        run: RunId,
        status: WorkflowStatus,
        result: Option<String>,
        error: Option<String>,
        continued_to: Option<RunId>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        query(
            tx,
            &self.sql.workflows.close,
            &[
                &run.0,
                &status.as_str(),
                &result,
                &error,
                &continued_to.map(|r| r.0),
                &now.0,
            ],
        )
        .await?;
        Ok(())
    }

    async fn commit_in(
        &self,
        tx: &impl GenericClient,
        op: WorkflowTaskCommit,
    ) -> Result<Committed, WorkflowStoreError> {
        let run = self.lock_run(tx, op.run_id).await?;
        if run.status.is_closed() {
            return Err(WorkflowStoreError::NotRunning { status: run.status });
        }
        if run.history_len != op.expect_len || run.pending_task != Some(op.expect_task) {
            return Err(WorkflowStoreError::Stale {
                history_len: run.history_len,
                pending_task: run.pending_task,
            });
        }
        if let Some(close) = &op.close
            && !close.status.is_closed()
        {
            return Err(StoreError::CloseAsRunning.into());
        }
        if let Some(next) = &op.continue_as
            && next.workflow_id != run.workflow_id
        {
            return Err(StoreError::ContinueAsNewChangesId.into());
        }
        self.insert_events(tx, op.run_id, run.history_len, &op.events)
            .await?;
        let tasks = self.insert_owned(tx, &op.tasks).await?;
        let mut cancelled = self.cancel_ids(tx, &op.cancel, op.now).await?;
        let new_len = run.history_len + op.events.len() as u64;
        self.set_len(tx, op.run_id, new_len, None, true, op.now)
            .await?;
        let mut next_run = None;
        let mut parent = None;
        if let Some(close) = op.close {
            cancelled.extend(
                self.cancel_run_tasks(tx, op.run_id, &run.workflow_id, op.now)
                    .await?,
            );
            let next_id = op.continue_as.as_ref().map(|n| n.run_id);
            self.close_run(
                tx,
                op.run_id,
                close.status,
                close.result,
                close.error,
                next_id,
                op.now,
            )
            .await?;
            if let Some(next) = op.continue_as {
                self.claim_workflow_id(tx, &next.workflow_id, next.run_id, None)
                    .await?;
                next_run = Some(self.create_run(tx, next).await?);
            }
            parent = self.append_parent(tx, op.parent).await?;
        }
        Ok(Committed {
            run: self.reload_run(tx, op.run_id).await?,
            tasks,
            cancelled,
            next_run,
            parent,
        })
    }

    async fn terminate_in(
        &self,
        tx: &impl GenericClient,
        op: TerminateOp,
    ) -> Result<Terminated, WorkflowStoreError> {
        let run = self.lock_run(tx, op.run_id).await?;
        if run.status.is_closed() {
            return Err(WorkflowStoreError::NotRunning { status: run.status });
        }
        self.insert_events(
            tx,
            op.run_id,
            run.history_len,
            std::slice::from_ref(&op.event),
        )
        .await?;
        self.set_len(tx, op.run_id, run.history_len + 1, None, false, op.now)
            .await?;
        let mut cancelled = match run.pending_task {
            Some(t) => self.cancel_ids(tx, &[t], op.now).await?,
            None => Vec::new(),
        };
        cancelled.extend(
            self.cancel_run_tasks(tx, op.run_id, &run.workflow_id, op.now)
                .await?,
        );
        self.close_run(
            tx,
            op.run_id,
            WorkflowStatus::Terminated,
            None,
            Some(op.reason),
            None,
            op.now,
        )
        .await?;
        let parent = self.append_parent(tx, op.parent).await?;
        Ok(Terminated {
            run: self.reload_run(tx, op.run_id).await?,
            cancelled,
            parent,
        })
    }
}

#[async_trait]
impl WorkflowStore for PostgresStore {
    async fn start_run(
        &self,
        run: NewRun,
        reuse: IdReusePolicy,
    ) -> Result<StartedRun, WorkflowStoreError> {
        // Every answer but an error changed the run: it carries the request's record.
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        self.claim_workflow_id(&tx, &run.workflow_id, run.run_id, Some(reuse))
            .await?;
        let started = self.create_run(&tx, run).await?;
        self.commit_audited(tx, audit).await?;
        Ok(started)
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<WorkflowRun>, StoreError> {
        let client = self.client().await?;
        self.load_run(&client, run_id).await
    }

    async fn current_run(&self, workflow_id: &str) -> Result<Option<WorkflowRun>, StoreError> {
        let client = self.client().await?;
        query_opt(&client, &self.sql.workflows.current, &[&workflow_id])
            .await?
            .map(|r| run_from_row(&r))
            .transpose()
    }

    async fn list_workflows(
        &self,
        filter: &WorkflowFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<WorkflowPage, StoreError> {
        let mut client = self.client().await?;
        let rows = query_planned_per_call(
            &mut client,
            &self.sql.workflows.list,
            &[
                &after,
                &filter.workflow_type.as_deref(),
                &filter.status.map(|s| s.as_str()),
                &limit_param(limit.saturating_add(1)),
                &filter.id_prefix(),
                &filter.default_only(),
            ],
        )
        .await?;
        let mut runs = rows
            .iter()
            .map(run_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(|r| r.workflow_id.clone())
        } else {
            None
        };
        Ok(WorkflowPage { runs, next_cursor })
    }

    async fn history(
        &self,
        run_id: RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEvent>, StoreError> {
        let client = self.client().await?;
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        let rows = query(
            &client,
            &self.sql.workflows.history,
            &[&run_id.0, &from, &limit_param(limit)],
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(HistoryEvent {
                    seq: count(col(r, 0)?, "event number")?,
                    at: Timestamp(col(r, 1)?),
                    data: col(r, 2)?,
                })
            })
            .collect()
    }

    async fn has_marker(&self, run_id: RunId, marker: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(query_opt(
            &client,
            &self.sql.workflows.has_marker,
            &[&run_id.0, &marker],
        )
        .await?
        .is_some())
    }

    async fn append(&self, op: AppendOp) -> Result<Appended, WorkflowStoreError> {
        // Every answer but an error changed the run: it carries the request's record.
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let appended = self.append_in(&tx, op).await?;
        self.commit_audited(tx, audit).await?;
        Ok(appended)
    }

    async fn commit_workflow_task(
        &self,
        op: WorkflowTaskCommit,
    ) -> Result<Committed, WorkflowStoreError> {
        // Every answer but an error changed the run: it carries the request's record.
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let committed = self.commit_in(&tx, op).await?;
        self.commit_audited(tx, audit).await?;
        Ok(committed)
    }

    async fn terminate(&self, op: TerminateOp) -> Result<Terminated, WorkflowStoreError> {
        // Every answer but an error changed the run: it carries the request's record.
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let terminated = self.terminate_in(&tx, op).await?;
        self.commit_audited(tx, audit).await?;
        Ok(terminated)
    }

    async fn purge_closed_runs(
        &self,
        before: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        if let Some(f) = fence {
            self.check_fence(&tx, f).await?;
        }
        let stmt = tx
            .prepare_cached(&self.sql.workflows.purge_closed)
            .await
            .map_err(pg)?;
        let n = tx
            .execute(&stmt, &[&before.0, &limit_param(limit)])
            .await
            .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(n)
    }
}
