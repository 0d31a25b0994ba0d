//! Retention: finished tasks, schedule fire records, closed workflow runs (with their
//! histories) and audit records are deleted once older than their retention
//! (`Config::retention`, with per-queue overrides for tasks from the queue settings), in small
//! batches on a task of its own, off the shard loops' path.
//!
//! Tasks are deleted per shard by the shard's owner: every shard on a single node; on several
//! nodes each node deletes only the tasks of the shards it holds, under their fences (a write
//! refused as `LeaseLost` deletes nothing). Fire records, workflow runs and audit records carry
//! no shard: the node that holds shard 0 deletes them, workflow runs under shard 0's fence. A
//! live task is never deleted: the store's delete is conditional on a terminal state and on
//! `finished_at` past the cutoff; nor is a running workflow run (conditional on `closed_at`).
//!
//! Deleted rows' pages are reused by later writes (SQLite keeps freed pages on its freelist and
//! fills them first; PostgreSQL's autovacuum marks dead rows' space reusable), so the database
//! levels off at about what the retention window holds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sundial_core::Timestamp;
use sundial_store::{AccessStore, RetentionRules, ScheduleStore, StoreError, WorkflowStore};

use super::Engine;

/// What retention deleted in one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub tasks: u64,
    pub fires: u64,
    /// Closed workflow runs (each with its history).
    pub workflow_runs: u64,
    pub audit: u64,
}

/// The stores besides the task store whose rows retention deletes (each optional: an embedder
/// may have given the engine a store without them).
#[derive(Clone, Default)]
pub(crate) struct RetainedStores {
    pub schedules: Option<Arc<dyn ScheduleStore>>,
    pub workflows: Option<Arc<dyn WorkflowStore>>,
    pub access: Option<Arc<dyn AccessStore>>,
}

/// Most batches of each kind one round deletes before it waits for the next interval.
const MAX_BATCHES: usize = 20;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Up to `MAX_BATCHES` calls of `delete(batch)`, stopping at the first short one.
async fn in_batches<F, Fut>(batch: usize, mut delete: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let mut total = 0;
    for _ in 0..MAX_BATCHES {
        let n = delete().await?;
        total += n;
        if n < batch as u64 {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(total)
}

impl Engine {
    async fn retention_rules(&self) -> Result<RetentionRules, StoreError> {
        let r = &self.config.retention;
        let queues = self
            .store
            .list_queue_settings()
            .await?
            .into_iter()
            .filter(|s| !s.config.retention.is_empty())
            .map(|s| (s.queue, s.config.retention))
            .collect();
        Ok(RetentionRules {
            succeeded_ms: ms(r.succeeded),
            cancelled_ms: ms(r.cancelled),
            dead_ms: ms(r.dead),
            queues,
        })
    }

    /// One retention round at `now`: up to `MAX_BATCHES` batches of each kind.
    pub(crate) async fn purge_round(
        &self,
        now: Timestamp,
        stores: &RetainedStores,
    ) -> Result<Purged, StoreError> {
        let batch = self.config.retention.batch;
        let rules = self.retention_rules().await?;
        let mut out = Purged {
            tasks: in_batches(batch, || {
                self.placement.purge_tasks(&self.store, &rules, now, batch)
            })
            .await?,
            ..Purged::default()
        };
        let Some(fence) = self.placement.shard_zero_fence() else {
            return Ok(out);
        };
        let r = &self.config.retention;
        if let Some(s) = &stores.schedules {
            let before = now.saturating_sub(r.schedule_fires);
            out.fires = in_batches(batch, || s.purge_fires(before, batch)).await?;
        }
        if let Some(w) = &stores.workflows {
            let before = now.saturating_sub(r.workflow_runs);
            out.workflow_runs =
                match in_batches(batch, || w.purge_closed_runs(before, batch, fence)).await {
                    Ok(n) => n,
                    // Shard 0 moved to another node meanwhile: it deletes them now.
                    Err(StoreError::LeaseLost { shard }) => {
                        tracing::warn!(shard, "lease lost while deleting closed workflow runs");
                        0
                    }
                    Err(e) => return Err(e),
                };
        }
        if let Some(a) = &stores.access {
            let before = now.saturating_sub(r.audit);
            out.audit = in_batches(batch, || a.purge_audit(before, batch)).await?;
        }
        Ok(out)
    }
}

/// Runs a retention round every `Config::retention.interval` on the engine's clock until
/// shutdown.
pub(crate) async fn drive(engine: Arc<Engine>, stores: RetainedStores) {
    let mut stopping = engine.stopping_rx();
    loop {
        // Before waiting: a shutdown that began before this task first ran is no change to
        // wait for (the receiver was made after it), only a value to read.
        if *stopping.borrow() {
            break;
        }
        let next = engine
            .clock
            .now()
            .saturating_add(engine.config.retention.interval);
        tokio::select! {
            _ = engine.clock.sleep_until(next) => {}
            _ = stopping.changed() => {}
        }
        if *stopping.borrow() {
            break;
        }
        let now = engine.clock.now();
        match engine.purge_round(now, &stores).await {
            Ok(p) => {
                for (what, n) in [
                    ("tasks", p.tasks),
                    ("schedule_fires", p.fires),
                    ("workflow_runs", p.workflow_runs),
                    ("audit", p.audit),
                ] {
                    metrics::counter!("sundial_retention_deleted_total", "what" => what)
                        .increment(n);
                }
            }
            Err(e) => tracing::warn!(error = %e, "retention round failed; trying again later"),
        }
    }
}
