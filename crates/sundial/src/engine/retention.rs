//! Retention: finished tasks and schedule fire records are deleted once older than their
//! retention (`Config::retention`, with per-queue overrides for tasks from the
//! queue settings), in small batches on a task of its own, off the shard loops' path.
//!
//! Tasks are deleted per shard by the shard's owner: every shard on a single node; on several
//! nodes each node deletes only the tasks of the shards it holds, under their fences (a write
//! refused as `LeaseLost` deletes nothing). Fire records carry no shard: the node that holds
//! shard 0 deletes them. (Closed workflow runs are not deleted yet.) A live task is never deleted: the store's delete is
//! conditional on a terminal state and on `finished_at` past the cutoff.
//!
//! Deleted rows' pages are reused by later writes (SQLite keeps freed pages on its freelist and
//! fills them first; PostgreSQL's autovacuum marks dead rows' space reusable), so the database
//! levels off at about what the retention window holds.

use std::sync::Arc;
use std::time::Duration;

use sundial_core::Timestamp;
use sundial_store::{RetentionRules, ScheduleStore, StoreError};

use super::Engine;

/// What retention deleted in one round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub tasks: u64,
    pub fires: u64,
}

/// Most batches of each kind one round deletes before it waits for the next interval.
const MAX_BATCHES: usize = 20;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        schedules: Option<&Arc<dyn ScheduleStore>>,
    ) -> Result<Purged, StoreError> {
        let batch = self.config.retention.batch.max(1);
        let rules = self.retention_rules().await?;
        let mut out = Purged::default();
        for _ in 0..MAX_BATCHES {
            let n = self
                .placement
                .purge_tasks(&self.store, &rules, now, batch)
                .await?;
            out.tasks += n;
            if n < batch as u64 {
                break;
            }
            tokio::task::yield_now().await;
        }
        if !self.placement.runs_shard_zero() {
            return Ok(out);
        }
        let r = &self.config.retention;
        if let Some(s) = schedules {
            let before = now.saturating_sub(r.schedule_fires);
            for _ in 0..MAX_BATCHES {
                let n = s.purge_fires(before, batch).await?;
                out.fires += n;
                if n < batch as u64 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        Ok(out)
    }
}

/// Runs a retention round every `Config::retention.interval` on the engine's clock until
/// shutdown.
pub(crate) async fn drive(engine: Arc<Engine>, schedules: Option<Arc<dyn ScheduleStore>>) {
    let mut stopping = engine.stopping_rx();
    loop {
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
        match engine.purge_round(now, schedules.as_ref()).await {
            Ok(p) => {
                metrics::counter!("sundial_retention_deleted_total", "what" => "tasks")
                    .increment(p.tasks);
                metrics::counter!("sundial_retention_deleted_total", "what" => "schedule_fires")
                    .increment(p.fires);
            }
            Err(e) => tracing::warn!(error = %e, "retention round failed; trying again later"),
        }
    }
}
