//! The operator's calls of the facade: queues (overview, settings, pause), attempt history,
//! retrying dead or cancelled tasks, bulk cancel and retry over a filter.
//!
//! Bulk actions walk the filter's matches newest first in bounded batches: each batch is one
//! short store transaction (a select of ids, then one conditional update of the eligible ones),
//! and the walk yields between batches, so a call over a million tasks neither holds a long
//! transaction nor keeps the shard loops from claiming.
//!
//! **Architecture Invariant:** every change here is a conditional store update (`cancel_many`
//! only touches live rows, `retry_many` only dead or cancelled ones whose key is free); a task
//! that changed between the select and the update is left alone, never forced.

use std::collections::BTreeMap;
use std::time::Duration;

use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::{
    AttemptHistory, AttemptResponse, DeadGroup, QueueConfig, QueueSettings, TaskFilter,
};

use crate::engine::retention::Purged;
use crate::{Error, Sundial};

/// Tasks selected per batch of a bulk action.
pub const BULK_BATCH: usize = 500;

/// Tasks changed per write of a bulk action (one transaction each): the writes that fire
/// tasks queue behind at most this many rows' work.
pub const BULK_WRITE: usize = 100;

/// One queue as an operator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInfo {
    pub queue: String,
    /// Tasks per state (every state present, zeros included), from the maintained counters.
    pub counts: BTreeMap<TaskState, u64>,
    pub paused: bool,
    /// The due time of the queue's oldest task that is due and has not started (scheduled or
    /// ready), when there is one.
    pub oldest_overdue_at: Option<Timestamp>,
    /// How late that task is now.
    pub lateness: Option<Duration>,
    /// Stored settings, when the queue was ever configured or paused.
    pub settings: Option<QueueSettings>,
    /// Due tasks with a rate limit that have not started: waiting for their limit's turn.
    pub rate_limited: u64,
}

/// What a bulk action found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkOutcome {
    /// Matching tasks in a state the action applies to (what a dry run reports).
    pub matched: u64,
    /// Tasks the action changed (0 for a dry run).
    pub changed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BulkAction {
    Cancel,
    Retry { due_at: Timestamp },
}

impl Sundial {
    /// The dead tasks grouped by queue and error group (the last error's first line, at most
    /// 200 characters), the largest groups first, at most `limit` groups (of `queue`, when
    /// given) and of `namespace` (when given): one aggregate query over an index of the dead
    /// tasks.
    pub async fn dead_groups(
        &self,
        queue: Option<&str>,
        namespace: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadGroup>, Error> {
        let filter = sundial_store::DeadGroupFilter { queue, namespace };
        Ok(self.engine.store.dead_groups(filter, limit).await?)
    }

    /// Every queue that has tasks or stored settings, by name.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, Error> {
        let store = &self.engine.store;
        let counts = store.count_by_state().await?;
        let settings = store.list_queue_settings().await?;
        let mut names: Vec<String> = counts
            .iter()
            .map(|c| c.queue.clone())
            .chain(settings.iter().map(|s| s.queue.clone()))
            .collect();
        names.sort();
        names.dedup();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let mut by_state: BTreeMap<TaskState, u64> =
                TaskState::ALL.into_iter().map(|s| (s, 0)).collect();
            for c in counts.iter().filter(|c| c.queue == name) {
                by_state.insert(c.state, c.count);
            }
            let s = settings.iter().find(|s| s.queue == name).cloned();
            out.push(self.queue_info(name, by_state, s).await?);
        }
        Ok(out)
    }

    /// One queue; `None` when it has neither tasks nor stored settings.
    pub async fn queue(&self, queue: &str) -> Result<Option<QueueInfo>, Error> {
        let store = &self.engine.store;
        let counts = store.count_by_state().await?;
        let settings = store.queue_settings(queue).await?;
        let mut by_state: BTreeMap<TaskState, u64> =
            TaskState::ALL.into_iter().map(|s| (s, 0)).collect();
        let mut any = false;
        for c in counts.iter().filter(|c| c.queue == queue) {
            by_state.insert(c.state, c.count);
            any |= c.count > 0;
        }
        if !any && settings.is_none() {
            return Ok(None);
        }
        Ok(Some(
            self.queue_info(queue.to_string(), by_state, settings)
                .await?,
        ))
    }

    async fn queue_info(
        &self,
        queue: String,
        counts: BTreeMap<TaskState, u64>,
        settings: Option<QueueSettings>,
    ) -> Result<QueueInfo, Error> {
        let now = self.engine.clock.now();
        let waiting = counts.get(&TaskState::Scheduled).copied().unwrap_or(0)
            + counts.get(&TaskState::Ready).copied().unwrap_or(0);
        let oldest = if waiting > 0 {
            self.engine.store.earliest_waiting(&queue).await?
        } else {
            None
        };
        let oldest_overdue_at = oldest.filter(|t| *t <= now);
        let rate_limited = if oldest_overdue_at.is_some() {
            self.engine.store.count_rate_limited(&queue, now).await?
        } else {
            0
        };
        Ok(QueueInfo {
            rate_limited,
            paused: settings.as_ref().is_some_and(|s| s.paused),
            lateness: oldest_overdue_at.map(|t| now.since(t)),
            oldest_overdue_at,
            counts,
            settings,
            queue,
        })
    }

    /// Sets a queue's configuration (its pause state is kept). A concurrency limit holds on
    /// every node at once (the store checks it at each start); a start refused by it on another
    /// node looks again when a place frees there, or within 1 s.
    pub async fn configure_queue(
        &self,
        queue: &str,
        config: QueueConfig,
    ) -> Result<QueueSettings, Error> {
        self.check_queue_name(queue)?;
        let mut config = config;
        // Sundial's own queues (schedule ticks, workflow steps) are never pushed anywhere.
        if config.target.is_some() && sundial_core::is_internal_queue(queue) {
            return Err(Error::Invalid(sundial_core::ValidationError::OutOfRange {
                field: "target",
                reason: format!("{queue:?} is one of Sundial's own queues and takes no target"),
            }));
        }
        if let Some(limit) = config.concurrency {
            if sundial_core::is_internal_queue(queue) {
                return Err(Error::Invalid(sundial_core::ValidationError::OutOfRange {
                    field: "concurrency",
                    reason: format!(
                        "{queue:?} is one of Sundial's own queues and takes no concurrency limit"
                    ),
                }));
            }
            if !(1..=QueueConfig::MAX_CONCURRENCY).contains(&limit) {
                return Err(Error::Invalid(sundial_core::ValidationError::OutOfRange {
                    field: "concurrency",
                    reason: format!("must be between 1 and {}", QueueConfig::MAX_CONCURRENCY),
                }));
            }
        }
        // A queue's default target is checked exactly like a task's (its call timeout is bounded
        // by each task's own timeout at delivery).
        config.target = config
            .target
            .map(|t| t.validate(self.engine.config.limits.max_timeout))
            .transpose()
            .map_err(Error::Invalid)?;
        let now = self.engine.clock.now();
        let settings = self
            .engine
            .store
            .put_queue_config(queue, config, now)
            .await?;
        self.engine
            .set_limited(queue, settings.config.concurrency.is_some());
        Ok(settings)
    }

    /// Pauses a queue, durably: from now on no task of it starts here (in-process handlers and
    /// workers alike), and on other nodes within `Config::pause_refresh`. Creates are still
    /// accepted; due tasks wait, visible as due. Running attempts finish.
    pub async fn pause_queue(&self, queue: &str) -> Result<QueueSettings, Error> {
        self.check_queue_name(queue)?;
        let now = self.engine.clock.now();
        let s = self.engine.store.set_queue_paused(queue, true, now).await?;
        self.engine.set_paused(queue, true);
        Ok(s)
    }

    /// Resumes a paused queue: its waiting tasks start in due order (on other nodes within
    /// `Config::pause_refresh`).
    pub async fn resume_queue(&self, queue: &str) -> Result<QueueSettings, Error> {
        self.check_queue_name(queue)?;
        let now = self.engine.clock.now();
        let s = self
            .engine
            .store
            .set_queue_paused(queue, false, now)
            .await?;
        self.engine.set_paused(queue, false);
        Ok(s)
    }

    fn check_queue_name(&self, queue: &str) -> Result<(), Error> {
        let limits = &self.engine.config.limits;
        sundial_core::TaskSpec::new("probe")
            .queue(queue)
            .validate(TaskId::MIN, Timestamp::MIN, 1, limits)
            .map(|_| ())
            .map_err(Error::Invalid)
    }

    /// One retention round now (the engine runs one every `Config::retention.interval`): deletes
    /// finished tasks, fire records, closed workflow runs and audit records past their
    /// retention, in batches, never a live task nor a running workflow run.
    pub async fn run_retention(&self) -> Result<Purged, Error> {
        let now = self.engine.clock.now();
        Ok(self
            .engine
            .purge_round(now, &self.retained_stores())
            .await?)
    }

    /// A task's kept attempts (oldest first) and its total attempt count.
    pub async fn attempts(&self, id: TaskId) -> Result<AttemptHistory, Error> {
        self.engine.store.attempts(id).await?.ok_or(Error::NotFound)
    }

    /// Keeps a push attempt's HTTP answer (status code, content type) on the attempt that ran
    /// under `execution`. Answers whether that attempt is kept.
    pub async fn record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: AttemptResponse,
    ) -> Result<bool, Error> {
        Ok(self
            .engine
            .store
            .record_attempt_response(id, execution, response)
            .await?)
    }

    /// Makes a dead or cancelled task scheduled again, due at `run_at` (now when `None` or past),
    /// its attempts starting over; it keeps its id, `last_error` and attempt history. A live
    /// task is [`Error::WrongState`]; one whose key another live task holds now is
    /// [`Error::Duplicate`].
    pub async fn retry(&self, id: TaskId, run_at: Option<Timestamp>) -> Result<Task, Error> {
        let now = self.engine.clock.now();
        let due_at = self.retry_due(run_at, now)?;
        let t = self.engine.store.retry(id, due_at, now).await?;
        self.engine.notify_task(&t);
        Ok(t)
    }

    fn retry_due(&self, run_at: Option<Timestamp>, now: Timestamp) -> Result<Timestamp, Error> {
        match run_at {
            None => Ok(now),
            Some(t) if !t.is_in_range() => {
                Err(Error::Invalid(sundial_core::ValidationError::OutOfRange {
                    field: "run_at",
                    reason: "must be between 1970-01-01 and 9999-12-31".into(),
                }))
            }
            Some(t) => Ok(t.max(now)),
        }
    }

    /// Cancels every live task matching `filter`, in batches; `dry_run` only counts them.
    pub async fn cancel_matching(
        &self,
        filter: TaskFilter,
        dry_run: bool,
    ) -> Result<BulkOutcome, Error> {
        self.bulk(filter, dry_run, BulkAction::Cancel).await
    }

    /// Retries every dead or cancelled task matching `filter` (due at `run_at`, or now), in
    /// batches; `dry_run` only counts them. Tasks whose key a live task holds are left alone.
    pub async fn retry_matching(
        &self,
        filter: TaskFilter,
        run_at: Option<Timestamp>,
        dry_run: bool,
    ) -> Result<BulkOutcome, Error> {
        let due_at = self.retry_due(run_at, self.engine.clock.now())?;
        self.bulk(filter, dry_run, BulkAction::Retry { due_at })
            .await
    }

    async fn bulk(
        &self,
        filter: TaskFilter,
        dry_run: bool,
        action: BulkAction,
    ) -> Result<BulkOutcome, Error> {
        let store = &self.engine.store;
        let mut out = BulkOutcome::default();
        let mut cursor = filter.before;
        loop {
            let page = store
                .select(
                    &TaskFilter {
                        before: cursor,
                        ..filter.clone()
                    },
                    BULK_BATCH,
                )
                .await?;
            let eligible: Vec<TaskId> = page
                .selected
                .iter()
                .filter(|s| match action {
                    BulkAction::Cancel => !s.state.is_terminal(),
                    BulkAction::Retry { .. } => {
                        matches!(s.state, TaskState::Dead | TaskState::Cancelled)
                    }
                })
                .map(|s| s.id)
                .collect();
            out.matched += eligible.len() as u64;
            for chunk in eligible.chunks(BULK_WRITE) {
                if dry_run {
                    break;
                }
                let now = self.engine.clock.now();
                let ids = chunk.to_vec();
                let changed = match action {
                    BulkAction::Cancel => store.cancel_many(ids, now).await?,
                    BulkAction::Retry { due_at } => {
                        store.retry_many(ids, due_at.max(now), now).await?
                    }
                };
                for t in &changed {
                    match action {
                        BulkAction::Cancel => {
                            metrics::counter!("sundial_task_cancelled_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                                .increment(1);
                            self.engine.release_exclusive(t)
                        }
                        BulkAction::Retry { .. } => self.engine.notify_task(t),
                    }
                }
                out.changed += changed.len() as u64;
                // Pace: rest as long as the write took, so the bulk action holds the store's
                // writer at most half the time and the writes that fire tasks keep their pace
                // (no rest on a clock that does not move, as in stepped tests).
                let took = self.engine.clock.now().0.saturating_sub(now.0);
                if took > 0 {
                    tokio::time::sleep(Duration::from_millis(took.unsigned_abs())).await;
                }
            }
            // A batch may be short, even empty, and still carry a cursor: it stopped at the
            // store's visit budget. Only the end of the cursors ends the selection.
            let Some(next) = page.next_cursor else { break };
            cursor = Some(next);
            // Let the shard loops and other requests in between batches.
            tokio::task::yield_now().await;
        }
        Ok(out)
    }
}
