//! The worker protocol's engine side: long-polls that wait for ready tasks of a queue and claim
//! them (one waiting poller woken per task readied, passed on after a full batch; a poll that found
//! only tasks waiting for their rate limit's take turn looks again at that turn), and heartbeats.
//! A poll that takes any kind also waits among its queue's [`super::handoff`] waiters, so that a
//! shard loop can start a task that comes due straight for it.
//!
//! Never decides whether a claim is allowed: `claim_ready` is conditional in the store.

use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use sundial_core::{ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::{ReadyClaim, ReadyTaken};

use super::handoff::{Registration, Started};
use super::{Engine, QueueState};
use crate::Error;
use crate::trace::{self, Step};

/// A poll woken this long after its deadline claims nothing more (see `Engine::poll`).
const POLL_OVERSLEEP_MS: i64 = 250;
/// A poll that skipped its look (see `looked`) looks within this long even if nothing wakes it:
/// the bound on what a wake-up lost between nodes costs it, as for the other waiters' own
/// retries.
const SKIPPED_LOOK_WITHIN: Duration = Duration::from_secs(1);

/// A worker's successful attempt, recorded by its next poll before that poll claims
/// ([`Engine::complete_and_poll`]).
#[derive(Debug, Clone)]
pub struct Completion {
    pub id: TaskId,
    pub execution: ExecutionId,
    pub result: Option<serde_json::Value>,
}

/// A poll counted in [`Engine::polls_waiting`] while this lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Tasks started for a poll and not yet answered (waiting for their due time, or for the
/// completion the poll carries to be recorded); whatever is still here when this is dropped (the
/// poll gone, or a write or read failed) is kept for the queue's next poll.
struct Held<'a> {
    tasks: Vec<Started>,
    q: &'a QueueState,
}

/// A poll's place among its queue's hand-off waiters. Were the poll dropped while it waits, what
/// a shard loop had already handed it (sent, not yet received) is kept for the next poll, not
/// left in the dropped channel until the tasks' leases end.
struct Waiting<'a> {
    reg: Option<Registration>,
    q: &'a QueueState,
}

impl Waiting<'_> {
    /// Ends the wait: what was handed to this poll.
    fn withdraw(mut self) -> Vec<Started> {
        self.reg
            .take()
            .map_or_else(Vec::new, |reg| self.q.waiters.withdraw(reg))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(reg) = self.reg.take() {
            // What was handed meanwhile is kept for the next poll, as `Held` keeps it.
            drop(Held {
                tasks: self.q.waiters.withdraw(reg),
                q: self.q,
            });
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.tasks.is_empty() {
            self.q
                .waiters
                .keep_unclaimed(std::mem::take(&mut self.tasks));
            self.q.ready.notify_one();
        }
    }
}

/// The completion a poll carries: pending until the poll records it (with its first claim, or
/// on its own when it does not claim at once), then the task as recorded.
enum Carried {
    Pending(Completion),
    Recorded(Box<Task>),
}

impl Engine {
    /// Waits up to `wait` for ready tasks of `queue` and claims up to `max` of them.
    pub async fn poll(
        &self,
        queue: &str,
        worker: Option<String>,
        kinds: Option<Vec<String>>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Task>, Error> {
        self.poll_after(None, queue, worker, kinds, max, wait).await
    }

    /// Records `done` (as [`Engine::complete`]), then polls as [`Engine::poll`]. The poll's first
    /// claim commits with the completion (`Store::complete_then_claim_ready`), so a worker's turn
    /// (its result in, its next task out) costs one durable commit. A refused completion polls
    /// nothing.
    pub async fn complete_and_poll(
        &self,
        done: Completion,
        queue: &str,
        worker: Option<String>,
        kinds: Option<Vec<String>>,
        max: usize,
        wait: Duration,
    ) -> Result<(Task, Vec<Task>), Error> {
        let mut carried = Carried::Pending(done);
        let tasks = self
            .poll_after(Some(&mut carried), queue, worker, kinds, max, wait)
            .await?;
        match carried {
            Carried::Recorded(t) => Ok((*t, tasks)),
            // Every path of `poll_after` records the completion before it answers; were one not
            // to, it is recorded now.
            Carried::Pending(c) => Ok((self.complete(c.id, c.execution, c.result).await?, tasks)),
        }
    }

    /// Records the carried completion on its own, if it is still pending.
    async fn record_carried(&self, carried: &mut Option<&mut Carried>) -> Result<(), Error> {
        if let Some(c) = carried.as_deref_mut()
            && let Carried::Pending(done) = c
        {
            let result = done.result.as_ref().map(|v| v.to_string());
            let t = self
                .complete_stored(done.id, done.execution, result)
                .await?;
            *c = Carried::Recorded(Box::new(t));
        }
        Ok(())
    }

    /// A poll that first records the completion it carries, if any (see [`Carried`]).
    async fn poll_after(
        &self,
        mut carried: Option<&mut Carried>,
        queue: &str,
        worker: Option<String>,
        kinds: Option<Vec<String>>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Task>, Error> {
        let max = max.clamp(1, self.config.max_poll_batch);
        let wait = wait.min(self.config.max_poll_wait);
        let q = self.queue(queue);
        let start = self.clock.now();
        self.seen.record(worker.as_deref(), queue, start);
        let deadline = start.saturating_add(wait);
        let mut stopping = self.stopping.subscribe();
        let ready = if kinds.is_some() {
            &q.ready_filtered
        } else {
            &q.ready
        };
        if !self.paused.loaded() {
            self.refresh_paused().await?;
        }
        // Polls that take any kind wait to be handed a task a shard loop starts for them (see
        // `handoff`); the claim made for one commits this request's audit record.
        let audit = sundial_store::audit_scope::current();
        // A poll of any kind skips its first look when the queue was found empty and nothing
        // changed since (see `looked`); a wake-up or the end of its wait makes it look.
        let mut first = kinds.is_none() && self.config.hand_off_to_polls;
        loop {
            // Register interest before looking, so a task readied in between is not missed.
            let notified = ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = self.clock.now();
            if self.is_paused(queue) {
                // Nothing of a paused queue starts; a resume wakes this poller.
                self.record_carried(&mut carried).await?;
                if now >= deadline || self.is_stopping() {
                    return Ok(Vec::new());
                }
                tokio::select! {
                    _ = notified => {}
                    _ = self.clock.sleep_until(deadline) => {}
                    _ = stopping.changed() => {}
                }
                continue;
            }
            // Tasks started for a poll that was gone when they were handed come first.
            let kept = q.waiters.take_unclaimed(max, now);
            if !kept.is_empty() {
                // Kept for the next poll, as they were, should this fail or the poll be dropped.
                let held = Held { tasks: kept, q: &q };
                self.record_carried(&mut carried).await?;
                // Some may have been started ahead for a poll that went away.
                let mut kept = self.at_their_start(held).await?;
                if kept.is_empty() {
                    continue;
                }
                self.delivered(&mut kept);
                return Ok(kept);
            }
            let before = q.looked.before();
            let skip = std::mem::take(&mut first) && before.known_empty && now < deadline;
            // A poll that skips its look waits among the hand-off waiters from here on: a task
            // that comes due while the completion it carries commits is started for it, instead
            // of being readied for lack of a waiting poll. (A poll that claims does not: it
            // could then take more than `max`.)
            let mut waiting_early = None;
            let (tasks, next_turn) = if skip {
                waiting_early = Some(Waiting {
                    reg: Some(q.waiters.register(worker.clone(), max, audit.clone())),
                    q: &q,
                });
                self.record_carried(&mut carried).await?;
                metrics::counter!("sundial_poll_looks_skipped_total", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string())
                    .increment(1);
                (Vec::new(), None)
            } else {
                let claim = ReadyClaim {
                    queue: queue.to_string(),
                    kinds: kinds.clone(),
                    execution_ids: (0..max)
                        .map(|_| ExecutionId(uuid::Uuid::now_v7()))
                        .collect(),
                    worker: worker.clone(),
                    now,
                };
                let pending = match carried.as_deref() {
                    Some(Carried::Pending(c)) => {
                        Some((c.id, c.execution, c.result.as_ref().map(|v| v.to_string())))
                    }
                    _ => None,
                };
                let (tasks, next_turn) = match pending {
                    None => self.claim_ready(claim).await?,
                    Some((id, execution, result)) => {
                        let (t, taken) = self
                            .store
                            .complete_then_claim_ready(id, execution, now, result, claim)
                            .await?;
                        self.succeeded(&t);
                        if let Some(c) = carried.as_deref_mut() {
                            *c = Carried::Recorded(Box::new(t));
                        }
                        let ReadyTaken {
                            mut tasks,
                            next_turn,
                            ..
                        } = taken;
                        self.delivered(&mut tasks);
                        (tasks, next_turn)
                    }
                };
                if tasks.is_empty() && next_turn.is_none() && kinds.is_none() {
                    q.looked.found_empty(before);
                }
                (tasks, next_turn)
            };
            if next_turn.is_some() {
                metrics::counter!("sundial_rate_limited_total", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string())
                    .increment(1);
            }
            if (tasks.len() >= max || (next_turn.is_some() && !tasks.is_empty())) && kinds.is_none()
            {
                // A full batch: more may be ready; the next waiting poller looks. Or tasks were
                // passed over for their rate limit's turn: the next waiting poller waits for it.
                q.ready.notify_one();
            }
            if !tasks.is_empty() {
                metrics::histogram!("sundial_poll_wait_seconds", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string())
                    .record(now.since(start).as_secs_f64());
                return Ok(tasks);
            }
            if now >= deadline || self.is_stopping() {
                return Ok(Vec::new());
            }
            // A ready task passed over for its rate limit's turn: look again at that turn.
            let mut wake = next_turn.map_or(deadline, |turn| turn.min(deadline));
            if skip {
                wake = wake.min(now.saturating_add(SKIPPED_LOOK_WITHIN));
            }
            let mut waiting = waiting_early.or_else(|| {
                (kinds.is_none() && self.config.hand_off_to_polls).then(|| Waiting {
                    reg: Some(q.waiters.register(worker.clone(), max, audit.clone())),
                    q: &q,
                })
            });
            let counted = waiting.as_ref().map(|_| Counted::new(&self.polls_waiting));
            let mut handed = None;
            // Whether this poll took a wake-up meant for a claim of a ready task.
            let mut woken = false;
            if let Some(reg) = waiting.as_mut().and_then(|w| w.reg.as_mut()) {
                tokio::select! {
                    h = reg.handed() => handed = h,
                    _ = notified => woken = true,
                    _ = self.clock.sleep_until(wake) => {}
                    _ = stopping.changed() => {}
                }
            } else {
                tokio::select! {
                    _ = notified => {}
                    _ = self.clock.sleep_until(wake) => {}
                    _ = stopping.changed() => {}
                }
            }
            drop(counted);
            // What a shard loop handed over, including what it sent while this poll was woken
            // otherwise.
            let tasks = match (handed, waiting) {
                (Some(tasks), _) => tasks,
                (None, Some(waiting)) => waiting.withdraw(),
                (None, None) => Vec::new(),
            };
            let held = Held { tasks, q: &q };
            if woken && !held.tasks.is_empty() {
                // Woken for a ready task but answering with what was handed, without a claim:
                // the wake-up goes on to the next waiting poll. A turn that hands some due
                // tasks and readies the rest wakes the oldest waiters, the polls it hands to.
                q.ready.notify_one();
            }
            // Woken well past the deadline: the process was stopped (SIGSTOP, a stall) while the
            // poll waited, and its caller has most likely given up. Tasks claimed now would sit
            // `running` for a worker that never sees them until their lease (the task's timeout)
            // ends: answer empty instead, without claiming (and keep what was handed for the
            // next poll).
            if self.clock.now().0 > deadline.0 + POLL_OVERSLEEP_MS {
                // `held` keeps them.
                return Ok(Vec::new());
            }
            if !held.tasks.is_empty() {
                let mut tasks = self.at_their_start(held).await?;
                if tasks.is_empty() {
                    // Every task started ahead for it ended before its due time: look again.
                    continue;
                }
                self.delivered(&mut tasks);
                metrics::histogram!("sundial_poll_wait_seconds", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string())
                    .record(self.clock.now().since(start).as_secs_f64());
                return Ok(tasks);
            }
        }
    }

    /// Tasks handed to a poll, at their start: a task started ahead of its due time
    /// (`Config::hand_off_lead`) is answered at that time, never before, and only after it was
    /// read again and found still running under the execution handed, so that a cancel that
    /// returned before its start is honoured (also when the poll got it after that time). The
    /// read is spared when the store's out-of-band mark has not moved since before the claim:
    /// then nothing that could end the task has committed. Were
    /// the poll dropped, or the read to fail, while tasks wait here, `held` keeps them for the
    /// queue's next poll.
    async fn at_their_start(&self, mut held: Held<'_>) -> Result<Vec<Task>, Error> {
        let Some(start) = held
            .tasks
            .iter()
            .filter(|s| s.ahead())
            .filter_map(|s| s.task.started_at)
            .max()
        else {
            return Ok(std::mem::take(&mut held.tasks)
                .into_iter()
                .map(|s| s.task)
                .collect());
        };
        let now = self.clock.now();
        if start > now {
            // Bounded by the lead, should the clock have stepped back since the start.
            self.clock
                .sleep_until_on_time(start.min(now.saturating_add(self.config.hand_off_lead)))
                .await;
        }
        let mut still = Vec::with_capacity(held.tasks.len());
        // Read after the wait: a cancel that returned before the start has moved it.
        let mark = self.store.out_of_band_mark();
        for s in &held.tasks {
            if !s.ahead() {
                still.push(true);
                continue;
            }
            let t = &s.task;
            if s.unchanged_since_claim(mark) {
                still.push(true);
            } else {
                let stored = self.store.get(t.id).await?;
                still.push(stored.is_some_and(|s| {
                    s.state == TaskState::Running && s.execution_id == t.execution_id
                }));
            }
            metrics::histogram!("sundial_fire_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string(), "target" => "poll")
                .record(self.clock.now().since(t.became_due_at()).as_secs_f64());
        }
        let tasks = std::mem::take(&mut held.tasks);
        Ok(tasks
            .into_iter()
            .zip(still)
            .filter_map(|(s, keep)| keep.then_some(s.task))
            .collect())
    }

    /// Claims for a poll: the tasks taken, and when a rate limit's next turn lets more be taken.
    async fn claim_ready(
        &self,
        claim: ReadyClaim,
    ) -> Result<(Vec<Task>, Option<Timestamp>), Error> {
        let ReadyTaken {
            mut tasks,
            next_turn,
            ..
        } = self.store.claim_ready(claim).await?;
        self.delivered(&mut tasks);
        Ok((tasks, next_turn))
    }

    /// Prepares tasks started for a poll for its answer: the trace handed on, the lease known to
    /// the reaper, the wait from due to start counted.
    fn delivered(&self, tasks: &mut [Task]) {
        for t in tasks {
            if t.trace.is_some() {
                // The worker continues the trace from its delivery.
                let deliver = trace::task_span(Step::Deliver, t);
                t.trace = trace::handed_on(&deliver, t.trace.as_ref());
            }
            if let Some(until) = t.lease_expires_at {
                self.lease_granted(until);
            }
            if let Some(s) = t.started_at {
                metrics::histogram!("sundial_dispatch_wait_seconds", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                    .record(s.since(t.became_due_at()).as_secs_f64());
            }
        }
    }

    /// Extends a running attempt's lease by the task's own timeout (the store has it; nothing is
    /// read first).
    pub async fn heartbeat(&self, id: TaskId, execution: ExecutionId) -> Result<Task, Error> {
        let now = self.clock.now();
        Ok(self.store.heartbeat(id, execution, now).await?)
    }
}
