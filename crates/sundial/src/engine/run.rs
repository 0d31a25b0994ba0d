//! Handler runs and the results of attempts: an in-process run under its queue permit, with its
//! timeout and the shutdown interruption; `complete` and `fail` (shared with remote workers); and
//! the hand-over of freed places (exclusive keys and groups, limited queues) to the tasks waiting
//! for them.
//!
//! Never decides whether a result is accepted: the store's update is conditional on the attempt's
//! execution id, and a refused result is reported, not forced.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use rand::Rng;
use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::{DueEntry, OutOfBandMark, Retry};
use tokio::sync::OwnedSemaphorePermit;

use tracing::Instrument;

use super::{Engine, WaitFor, WaitLine, wait_true};
use crate::Error;
use crate::handler::{
    AttemptAnswer, Handler, HandlerError, RunSlots, SuccessRecorded, TaskContext,
};
use crate::trace::{self, Step};

/// Runs claimed ahead that wait on the clock for their start, counted by that start. A stepped
/// test waits for a run whose start the clock has reached (it is about to call its handler),
/// and not for one whose start is still ahead: only the test's next step of the clock lets
/// that one go.
#[derive(Default)]
pub(crate) struct RunsWaitingDue(Mutex<BTreeMap<Timestamp, usize>>);

impl RunsWaitingDue {
    fn enter(&self, start: Timestamp) -> WaitingDue<'_> {
        *self.lock().entry(start).or_default() += 1;
        WaitingDue { runs: self, start }
    }

    /// How many wait for a start later than `now`.
    pub(crate) fn after(&self, now: Timestamp) -> usize {
        self.lock()
            .range((std::ops::Bound::Excluded(now), std::ops::Bound::Unbounded))
            .map(|(_, n)| n)
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Timestamp, usize>> {
        // The map is a count of waits; a panic elsewhere leaves it consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One run counted in [`RunsWaitingDue`] while this lives.
struct WaitingDue<'a> {
    runs: &'a RunsWaitingDue,
    start: Timestamp,
}

impl Drop for WaitingDue<'_> {
    fn drop(&mut self) {
        let mut map = self.runs.lock();
        if let Some(n) = map.get_mut(&self.start) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.start);
            }
        }
    }
}

impl Engine {
    /// Runs a started task on its handler (resolved with the claim's batch) under the permits
    /// taken for it (its queue's; for a push task, its receiver's and the node's push slot), and
    /// records the result. A traced task runs inside a `sundial.task.run` span, a child of its
    /// `fire` span, and its handler sees that span's context in `ctx.task.trace`.
    pub(super) fn spawn_run(
        self: &Arc<Self>,
        mut task: Task,
        handler: Arc<dyn Handler>,
        permit: Vec<OwnedSemaphorePermit>,
        fire: tracing::Span,
        mark: Option<OutOfBandMark>,
    ) {
        let Some(execution) = task.execution_id else {
            return;
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        let run_span = trace::child_span(Step::Run, &task, &fire);
        drop(fire);
        if task.trace.is_some() {
            task.trace = trace::handed_on(&run_span, task.trace.as_ref());
        }
        let release = engine.clone();
        let slots = RunSlots::new(permit, move || {
            release
                .permits_released
                .send_modify(|v| *v = v.wrapping_add(1));
        });
        let run = async move {
            let mut aborting = engine.aborting.subscribe();
            // A task may be claimed a little before it is due (`Config::push_claim_lead`,
            // `Config::run_claim_lead`): its attempt is durable before the handler runs, and the
            // handler still runs at the due time, never before.
            // The wait is bounded by the lead, should the clock have stepped back since the claim.
            let now = engine.clock.now();
            let lead = engine
                .config
                .push_claim_lead
                .max(engine.config.run_claim_lead);
            // The recorded start: the due time, or later (a rate limit's turn).
            let starts = task
                .started_at
                .map_or(task.due_at, |at| at.max(task.due_at));
            let due = starts.min(now.saturating_add(lead));
            let ahead = now < due;
            let woke_early = ahead && {
                let _waiting = engine.runs_waiting_due.enter(due);
                // A stepped test waiting for this run to finish stops waiting for it now.
                engine.drained.notify_waiters();
                tokio::select! {
                    _ = engine.clock.sleep_until_on_time(due) => false,
                    _ = wait_true(&mut aborting) => true,
                }
            };
            if ahead && !woke_early && !engine.still_started(&task, execution, mark).await {
                // Cancelled (or otherwise ended) while it waited for its due time: the handler
                // is never called, and there is no result to record.
                slots.release();
                if engine.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                    engine.drained.notify_waiters();
                }
                return;
            }
            let started = engine.clock.now();
            metrics::histogram!("sundial_fire_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(&task.queue).to_string(), "queue" => sundial_core::namespace::local(&task.queue).to_string(), "target" => "handler")
                .record(started.since(task.became_due_at()).as_secs_f64());
            let deadline = started.saturating_add(task.timeout());
            let answer = AttemptAnswer::kept_by_engine();
            let recorded = SuccessRecorded::read_by_engine();
            let ctx = TaskContext {
                task: task.clone(),
                execution_id: execution,
                slots: slots.clone(),
                answer: answer.clone(),
                recorded: recorded.clone(),
            };
            let outcome: Result<Option<serde_json::Value>, HandlerError> = if woke_early {
                // Shutdown came before the due time: the handler never ran.
                Err(HandlerError::retryable("interrupted by shutdown"))
            } else {
                let run = std::panic::AssertUnwindSafe(handler.call(ctx)).catch_unwind();
                tokio::select! {
                    r = run => match r {
                        Ok(r) => r,
                        Err(_) => Err(HandlerError::retryable("handler panicked")),
                    },
                    _ = engine.clock.sleep_until(deadline) => Err(HandlerError::retryable(format!(
                        "timed out after {}ms", task.timeout_ms
                    ))),
                    _ = wait_true(&mut aborting) => Err(HandlerError::retryable("interrupted by shutdown")),
                }
            };
            let finished = engine.clock.now();
            metrics::histogram!("sundial_task_duration_seconds", "namespace" => sundial_core::namespace::namespace_of(&task.queue).to_string(), "queue" => sundial_core::namespace::local(&task.queue).to_string())
                .record(finished.since(started).as_secs_f64());
            let interrupted = *engine.aborting.borrow();
            // The concurrency limit bounds handler runs, not the bookkeeping after them: hand the
            // permit on before recording the result. Holding it through that write would tie
            // fire throughput to write latency (at most `permits / write latency` tasks a second,
            // which a busy disk or CPU pushes below the due rate, so lateness snowballs).
            // (A handler may have released them already: see `RunSlots`.)
            slots.release();
            // A push call's answer is kept beside the outcome: both writes are issued together
            // (the answer's first), so they share one group commit rather than wait for two.
            let keep_answer = async {
                if let Some(r) = answer.take()
                    && let Err(e) = engine
                        .store
                        .record_attempt_response(task.id, execution, r)
                        .await
                {
                    tracing::warn!(task = %task.id, error = %e, "cannot keep the push answer on its attempt");
                }
            };
            let record_outcome = async {
                match outcome {
                    Ok(_) if recorded.noted() => {
                        // The handler's own transaction recorded the success: count it and
                        // hand on the places the attempt held, and write nothing.
                        let span =
                            trace::child_span(Step::Complete, &task, &tracing::Span::current());
                        drop(span.entered());
                        engine.succeeded(&task);
                        Ok(())
                    }
                    Ok(result) => {
                        let span =
                            trace::child_span(Step::Complete, &task, &tracing::Span::current());
                        engine
                            .complete(task.id, execution, result)
                            .instrument(span)
                            .await
                            .map(|_| ())
                    }
                    Err(e) => {
                        let span = trace::child_span(Step::Fail, &task, &tracing::Span::current());
                        engine
                            .fail(
                                task.id,
                                execution,
                                e.message,
                                e.retryable,
                                interrupted,
                                e.retry_after,
                            )
                            .instrument(span)
                            .await
                            .map(|_| ())
                    }
                }
            };
            let ((), res) = tokio::join!(keep_answer, record_outcome);
            if let Err(e) = res {
                tracing::debug!(id = %task.id, error = %e, "result not recorded");
            }
            if engine.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                engine.drained.notify_waiters();
            }
        };
        tokio::spawn(run.instrument(run_span));
    }

    /// Whether a task claimed ahead of its due time is still `running` under `execution` when
    /// it comes due: a cancel that returned while it waited must keep its handler from being
    /// called. Yes without a read when the store's out-of-band mark is still `mark`, read
    /// before the claim was asked for. A failed read answers no (the attempt's lease ending
    /// hands the task on, as for any attempt whose runner went away).
    async fn still_started(
        &self,
        task: &Task,
        execution: ExecutionId,
        mark: Option<OutOfBandMark>,
    ) -> bool {
        if OutOfBandMark::unmoved(mark, self.store.out_of_band_mark()) {
            return true;
        }
        match self.store.get(task.id).await {
            Ok(Some(t)) => t.state == TaskState::Running && t.execution_id == Some(execution),
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(id = %task.id, error = %e, "cannot read a task claimed ahead again; it is left to its lease");
                false
            }
        }
    }

    /// Records success of an attempt (in-process or remote).
    pub async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        result: Option<serde_json::Value>,
    ) -> Result<Task, Error> {
        self.complete_stored(id, execution, result.map(|v| v.to_string()))
            .await
    }

    /// [`Engine::complete`] with the result already serialised.
    pub(crate) async fn complete_stored(
        &self,
        id: TaskId,
        execution: ExecutionId,
        result: Option<String>,
    ) -> Result<Task, Error> {
        let now = self.clock.now();
        let t = self.store.complete(id, execution, now, result).await?;
        self.succeeded(&t);
        Ok(t)
    }

    /// What follows a recorded completion of a remote attempt: counted, and its exclusive key's
    /// place passed on.
    pub(crate) fn succeeded(&self, t: &Task) {
        metrics::counter!("sundial_task_succeeded_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string()).increment(1);
        self.release_exclusive(t);
    }

    /// Records failure of an attempt: retry with the task's backoff while attempts remain and the
    /// error is retryable, else `dead`. `immediate` retries at once (shutdown interrupted the
    /// attempt). The store decides from the attempt's own row, so nothing is read first.
    pub async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        error: String,
        retryable: bool,
        immediate: bool,
        retry_after: Option<std::time::Duration>,
    ) -> Result<Task, Error> {
        let now = self.clock.now();
        let retry = match (retryable, immediate, retry_after) {
            (false, _, _) => Retry::Never,
            (true, true, _) => Retry::At(now),
            (true, false, Some(after)) => Retry::After {
                delay_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            },
            (true, false, None) => Retry::Backoff {
                draw: rand::rng().random(),
            },
        };
        let t = self.store.fail(id, execution, now, error, retry).await?;
        match t.state {
            TaskState::Dead => {
                metrics::counter!("sundial_task_dead_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                    .increment(1)
            }
            _ => metrics::counter!("sundial_task_retries_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                .increment(1),
        }
        metrics::counter!("sundial_task_failures_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string()).increment(1);
        self.notify_task(&t);
        self.release_exclusive(&t);
        Ok(t)
    }

    /// A task stopped running (or will never run): when it held a place of an exclusive key or
    /// group, or of a queue with a concurrency limit, one place is free, so wake the
    /// best-ranked task waiting for it here (the earliest due, moved by its priority), tell the
    /// other nodes (whose best waiter takes it when it ranks before the one woken here, see
    /// [`Engine::released_elsewhere`]), and for a limited queue let its pollers look again (on
    /// every node, through the placement). The other waiters stay registered for the next
    /// release; each also retries on its own within 1 s, the backstop for a wake that finds its
    /// task gone or a wake-up between nodes that was lost.
    pub fn release_exclusive(&self, task: &Task) {
        let queue_limited = self.paused.is_limited(&task.queue);
        if let Some(ex) = &task.exclusive {
            // A ready task of the queue may have waited for this key: polls look again.
            self.queue(&task.queue).looked.changed();
            self.release_place(WaitFor::Group(ex.key.clone()));
        }
        if queue_limited {
            self.release_place(WaitFor::Queue(task.queue.clone()));
            self.ready_changed(&task.queue);
        }
    }

    /// One place of `place` freed on this node: handed to the best waiter here, and offered to
    /// the other nodes' waiters that rank before it.
    fn release_place(&self, place: WaitFor) {
        let handed = self
            .wake_waiters(&place, 1)
            .first()
            .map(|(_, e)| e.priority.rank(e.key.due_at));
        self.placement.place_released(place, handed);
    }

    /// Another node freed a place of `place` and handed it to its waiter ranked `handed` (`None`:
    /// to nobody). The best waiter here takes it when it ranks before that one; when nobody was
    /// handed it and nobody waits here, a claim refused meanwhile looks again at once (as after
    /// a local release).
    pub(crate) fn released_elsewhere(&self, place: &WaitFor, handed: Option<i64>) {
        // A ready task held back for this place may be claimable now: polls look again (a
        // key's queue is not known here, so every queue's do).
        match place {
            WaitFor::Queue(q) => self.queue(q).looked.changed(),
            WaitFor::Group(_) => {
                if let Ok(queues) = self.queues.lock() {
                    for q in queues.values() {
                        q.looked.changed();
                    }
                }
            }
        }
        if let Some(handed) = handed {
            let best = self
                .exclusive_waiting
                .lock()
                .ok()
                .and_then(|w| w.get(place).and_then(WaitLine::best_rank));
            if best.is_none_or(|rank| rank >= handed) {
                return;
            }
        }
        self.wake_waiters(place, 1);
    }

    /// A task that may have waited in line started (by its own retry rather than a hand-over):
    /// it leaves the line, so no later release hands its place to a task that already runs.
    pub(crate) fn left_line(&self, task: &Task) {
        let queue_limited = self.paused.is_limited(&task.queue);
        if task.exclusive.is_none() && !queue_limited {
            return;
        }
        let Ok(mut w) = self.exclusive_waiting.lock() else {
            return;
        };
        if w.is_empty() {
            return;
        }
        let mut lines = Vec::with_capacity(2);
        if let Some(ex) = &task.exclusive {
            lines.push(WaitFor::Group(ex.key.clone()));
        }
        if queue_limited {
            lines.push(WaitFor::Queue(task.queue.clone()));
        }
        for what in lines {
            if let Some(line) = w.get_mut(&what) {
                line.remove(task.id);
                if line.is_empty() {
                    w.remove(&what);
                }
            }
        }
    }

    /// Wakes every start waiting for a place in `queue` (its limit was raised or removed).
    pub(crate) fn wake_queue_waiters(&self, queue: &str) {
        self.exclusive_releases.fetch_add(1, Ordering::SeqCst);
        self.wake_waiters(&WaitFor::Queue(queue.to_string()), usize::MAX);
    }

    /// Hands up to `n` of the best-ranked waiters for `what` back to their shards. When there
    /// are none, the freed place goes to whoever claims next: the release counter tells a claim
    /// refused meanwhile to look again at once.
    fn wake_waiters(&self, what: &WaitFor, n: usize) -> Vec<(u32, DueEntry)> {
        let waiting: Vec<(u32, DueEntry)> = match self.exclusive_waiting.lock() {
            Ok(mut w) => {
                let mut woken = Vec::new();
                if let Some(line) = w.get_mut(what) {
                    while woken.len() < n {
                        let Some(best) = line.take_best() else {
                            break;
                        };
                        woken.push(best);
                    }
                    if line.is_empty() {
                        w.remove(what);
                    }
                }
                if woken.is_empty() {
                    // Bumped under the lock, so a refused claim registering after this release
                    // sees it (it reads the counter after registering, under the same lock).
                    self.exclusive_releases.fetch_add(1, Ordering::SeqCst);
                }
                woken
            }
            Err(_) => {
                self.exclusive_releases.fetch_add(1, Ordering::SeqCst);
                Vec::new()
            }
        };
        for (shard, e) in &waiting {
            if let Some(s) = self.shards.get(*shard as usize) {
                if let Ok(mut inbox) = s.inbox.lock() {
                    inbox.push(e.clone());
                }
                s.wake.notify_one();
            }
        }
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_waiting_for_its_start_counts_until_the_clock_reaches_it() {
        let runs = RunsWaitingDue::default();
        let start = Timestamp(1_000);
        let first = runs.enter(start);
        let second = runs.enter(start);
        let later = runs.enter(Timestamp(2_000));
        assert_eq!(runs.after(Timestamp(999)), 3);
        // At its start a run is about to call its handler, though it may not have woken yet:
        // a stepped test waits for it.
        assert_eq!(runs.after(start), 1);
        drop(first);
        assert_eq!(runs.after(Timestamp(999)), 2);
        drop(second);
        drop(later);
        assert_eq!(runs.after(Timestamp(0)), 0);
        assert!(runs.lock().is_empty(), "no entry is left behind");
    }
}
