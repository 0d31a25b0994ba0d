//! Group completion: concurrent `complete` calls of one store share one statement.
//!
//! Each `complete` is one conditional update (`running` with this execution id → `succeeded`).
//! Run one by one, every call is its own statement, its own commit (a WAL flush) and its own run
//! of the counter trigger; under load the database spends most of its time on that per-statement
//! work. So a call does not run its update itself: it queues it, and whichever call finds no
//! batch under way spawns one (a task of its own, so a caller that gives up waiting cancels
//! nothing). The batch takes everything queued (at most [`MAX_BATCH`]), runs *one*
//! `UPDATE … FROM unnest(…)` with each row's own condition (inserting, in the same statement,
//! the audit records of the calls it completed), and answers every caller; calls that
//! arrive meanwhile form the next batch (`lanes.rs`). Nothing waits for company: an idle store's call runs at
//! once, as a group of one.
//!
//! Every row keeps its own condition, so the outcome of each call is what its single update would
//! have been, and of two calls for one attempt at most one succeeds. The group never waits for a
//! row lock: it locks its rows with `SKIP LOCKED`, so it cannot take part in a deadlock (other
//! writers lock several task rows in orders of their own, closing a workflow run for one). A
//! call whose row it did not update (refused, or locked by someone else at that moment) then
//! runs on its own, as before grouping, which waits for the lock and says why it is refused.
//! Should the grouped statement fail, each call of the batch is retried on its own, so one
//! call's error is never another's.

use std::collections::HashMap;
use std::sync::Arc;

use sundial_core::{ExecutionId, Task, TaskId, Timestamp};
use sundial_store::TransitionError;
use sundial_store::audit_scope::PendingAudit;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::PostgresStore;
use crate::lanes::Lanes;
use crate::rows::tasks_from_rows;

/// Most completions one statement carries.
pub(crate) const MAX_BATCH: usize = 512;

pub(crate) struct Completion {
    pub id: TaskId,
    pub execution: ExecutionId,
    pub now: Timestamp,
    pub result: Option<String>,
    /// The request's audit record, committed with the completion (see
    /// [`sundial_store::audit_scope`]); claimed on the caller's task, since the batch runs on
    /// another.
    pub audit: Option<PendingAudit>,
    pub reply: oneshot::Sender<Result<Task, TransitionError>>,
}

/// The completions waiting for a batch (one lane), shared by the clones of one store.
pub(crate) type Completer = Lanes<(), Completion>;

impl PostgresStore {
    /// [`sundial_store::Store::complete`] through the group completer.
    pub(crate) async fn complete_grouped(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        let (reply, rx) = oneshot::channel();
        let c = Completion {
            id,
            execution,
            now,
            result,
            audit: sundial_store::audit_scope::claim_pending(),
            reply,
        };
        if self.completer.push((), c) {
            let store = self.clone();
            tokio::spawn(async move { store.run_completions().await });
        }
        match rx.await {
            Ok(r) => r,
            // The batch task ended without answering (its runtime shut down): whether the
            // update committed is unknown, exactly as for a connection lost mid-statement.
            Err(_) => Err(TransitionError::Store(
                sundial_store::StoreError::NoAnswer {
                    what: "completion batch",
                },
            )),
        }
    }

    async fn run_completions(self) {
        while let Some(batch) = self.completer.take(&(), MAX_BATCH, |_| 1) {
            self.complete_batch(batch).await;
        }
    }

    async fn complete_batch(&self, batch: Vec<Completion>) {
        // A lone call goes through the group statement too: it never waits for a lock, so the
        // loop never blocks, and while it runs the next calls queue up into a group.
        // One call per task in the statement: a second call for the same task runs on its own
        // afterwards, so each call's outcome (and the result written) is what its own update,
        // run one after the other, would have given.
        let mut seen = std::collections::HashSet::new();
        let (batch, later): (Vec<Completion>, Vec<Completion>) =
            batch.into_iter().partition(|c| seen.insert(c.id));
        self.complete_together(batch, later).await;
    }

    /// Completes calls for distinct tasks with one statement; `later` (second calls for a task of
    /// `batch`) run on their own once it is done.
    async fn complete_together(&self, batch: Vec<Completion>, later: Vec<Completion>) {
        // Lock rows in id order, as every multi-row write here does.
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_by_key(|&i| batch[i].id);
        let ids: Vec<Uuid> = order.iter().map(|&i| batch[i].id.0).collect();
        let execs: Vec<Uuid> = order.iter().map(|&i| batch[i].execution.0).collect();
        let results: Vec<Option<&str>> =
            order.iter().map(|&i| batch[i].result.as_deref()).collect();
        let nows: Vec<i64> = order.iter().map(|&i| batch[i].now.0).collect();
        let audited = batch.iter().any(|c| c.audit.is_some());
        let grouped = async {
            let client = self.client().await?;
            if !audited {
                let rows = crate::query(
                    &client,
                    &self.sql.complete_many,
                    &[&ids, &execs, &results, &nows],
                )
                .await?;
                return Ok((tasks_from_rows(&rows)?, HashMap::new()));
            }
            // The audit records of the calls the statement completes go in with it, in the
            // same statement (so they commit together, in one round trip).
            let linked: Vec<(Uuid, &sundial_store::NewAuditRecord)> = batch
                .iter()
                .filter_map(|c| c.audit.as_ref().map(|a| (c.id.0, a.record())))
                .collect();
            let audits = crate::access::AuditArrays::new(&linked);
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                vec![&ids, &execs, &results, &nows];
            params.extend(audits.params());
            let rows = crate::query(&client, &self.sql.complete_many_audited, &params).await?;
            let done = tasks_from_rows(&rows)?;
            let seqs: Vec<i64> = match rows.first() {
                Some(r) => {
                    crate::rows::col::<Option<Vec<i64>>>(r, r.len() - 1)?.unwrap_or_default()
                }
                None => Vec::new(),
            };
            let completed: std::collections::HashSet<Uuid> = done.iter().map(|t| t.id.0).collect();
            let carried: Vec<TaskId> = linked
                .iter()
                .filter(|(id, _)| completed.contains(id))
                .map(|(id, _)| TaskId(*id))
                .collect();
            let seqs: HashMap<TaskId, i64> =
                crate::lanes::pair_audit_seqs("completion group", carried, seqs)
                    .into_iter()
                    .collect();
            Ok::<_, sundial_store::StoreError>((done, seqs))
        }
        .await;
        let (done, seqs) = match grouped {
            Ok(done) => done,
            Err(e) => {
                tracing::debug!(error = %e, n = batch.len(), "grouped complete failed; one by one");
                for c in batch.into_iter().chain(later) {
                    self.complete_alone(c);
                }
                return;
            }
        };
        let mut done: HashMap<Uuid, Task> = done.into_iter().map(|t| (t.id.0, t)).collect();
        let mut rest = Vec::new();
        for mut c in batch {
            match done.remove(&c.id.0) {
                Some(t) => {
                    if let (Some(a), Some(seq)) = (c.audit.take(), seqs.get(&c.id)) {
                        a.written(*seq);
                    }
                    let _ = c.reply.send(Ok(t));
                }
                None => rest.push(c),
            }
        }
        // Not updated by the group: refused, or locked by another transaction at that moment
        // (the group skips locked rows). Each runs on its own, which waits for the lock and
        // says exactly why it is refused, if it is.
        for c in rest.into_iter().chain(later) {
            self.complete_alone(c);
        }
    }

    /// Runs one call on its own, in a task of its own: it may wait for a row lock, and the
    /// queue behind it must not.
    fn complete_alone(&self, c: Completion) {
        let store = self.clone();
        tokio::spawn(async move {
            let r = store
                .complete_one(c.id, c.execution, c.now, c.result, c.audit)
                .await;
            let _ = c.reply.send(r);
        });
    }

    /// One completion, as its own statement.
    async fn complete_one(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
        audit: Option<PendingAudit>,
    ) -> Result<Task, TransitionError> {
        self.attempt_write(
            &self.sql.complete,
            id,
            &[&id.0, &execution.0, &result, &now.0],
            audit,
        )
        .await
    }
}

/// Shared between clones of a store.
pub(crate) type SharedCompleter = Arc<Completer>;
