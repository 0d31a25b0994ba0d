//! The tick handler: what happens when a schedule's armed tick comes due. See the crate
//! documentation for the protocol; this module decides (catch-up, pause, overlap) and hands the
//! store one [`FireOp`] per tick, many ticks' ops in one [`ScheduleStore::fire_many`]: ticks that
//! come due together wait for the batcher, which reads their schedules in one read and fires
//! them in one call.
//!
//! [`ScheduleStore::fire_many`]: sundial_store::ScheduleStore::fire_many

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::json;
use sundial::{Backoff, HandlerError, Task, TaskId, TaskSpec, Timestamp};
use sundial_core::schedule::{OverlapPolicy, ScheduleDef, ScheduleId};
use sundial_store::{
    Arm, ArmChange, FireApplied, FireOp, FireOutcome, FireReason, FireResult, LastTask, NewFire,
    Schedule, ScheduleError, TICK_KIND, TICK_QUEUE,
};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Error, Inner, MISSED_INDIVIDUALLY, MISSED_WALK_LIMIT};

/// A tick's own attempt limit: a tick that keeps failing (the store is down) keeps retrying,
/// backing off to a minute.
const TICK_ATTEMPTS: u32 = 1_000;
const TICK_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads a tick's payload: `{"schedule": id, "nominal": ms}`.
fn parse_tick(payload: &serde_json::Value) -> Option<(ScheduleId, Timestamp)> {
    let id = ScheduleId::new(payload.get("schedule")?.as_str()?).ok()?;
    let nominal = Timestamp(payload.get("nominal")?.as_i64()?);
    Some((id, nominal))
}

fn retryable(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::retryable(e.to_string())
}

/// Most ticks fired by one batch (one read, one `fire_many`).
const MAX_BATCH: usize = 512;
/// Batches in flight at once: while one batch's writes wait for their commit, the next one
/// reads and decides.
const BATCHES_IN_FLIGHT: usize = 2;

/// How a tick's run ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TickEnd {
    /// Its fire recorded the tick's success in the fire's own transaction
    /// ([`FireOp::complete_tick`]): nothing is left to write.
    CompletedByFire,
    /// Done (superseded, refused as stale, or deleted meanwhile): the caller records the tick's
    /// success as for any task.
    ToComplete,
}

/// A tick waiting for its batch.
pub(crate) struct TickRequest {
    tick: Task,
    reply: oneshot::Sender<Result<TickEnd, HandlerError>>,
}

/// Collects the ticks that wait (those that came due together) into batches, up to
/// [`BATCHES_IN_FLIGHT`] at a time. Ends when the runner is dropped.
async fn batch_loop(inner: Weak<Inner>, mut rx: mpsc::UnboundedReceiver<TickRequest>) {
    let permits = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            inner.fire_batch(batch).await;
            drop(permit);
        });
    }
}

impl Inner {
    /// The tick that arms the fire at `nominal`: due at `nominal` plus the fire's jitter.
    pub(crate) fn arm(
        &self,
        id: &ScheduleId,
        def: &ScheduleDef,
        nominal: Timestamp,
        now: Timestamp,
    ) -> Result<Arm, Error> {
        let cfg = self.sundial.config();
        // A fire time already past (catching up after downtime) is armed due now, not in the
        // past: catch-up ticks then take their turn among the ticks due now instead of all going
        // ahead of them, so on-time fires of other schedules wait for one round of catch-up at
        // most, not for all of it (`tests/fault_catchup_storm.rs`). Never earlier than the fire
        // time plus its jitter.
        let due = nominal.saturating_add(def.jitter_for(id, nominal)).max(now);
        let tick = TaskSpec::new(TICK_KIND)
            .queue(TICK_QUEUE)
            .payload(json!({"schedule": id.as_str(), "nominal": nominal.0}))
            .run_at(due)
            .max_attempts(TICK_ATTEMPTS)
            .backoff(Backoff::exponential(
                Duration::from_secs(1),
                2.0,
                Duration::from_secs(60),
            ))
            .timeout(TICK_TIMEOUT)
            .validate(
                TaskId(uuid::Uuid::now_v7()),
                now,
                cfg.shard_count,
                &cfg.limits,
            )?;
        Ok(Arm { nominal, tick })
    }

    fn arm_change(
        &self,
        id: &ScheduleId,
        def: &ScheduleDef,
        next: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<ArmChange, Error> {
        Ok(match next {
            Some(n) => ArmChange::arm(self.arm(id, def, n, now)?),
            None => ArmChange::Disarm,
        })
    }

    /// What the fire at `nominal` does: skipped (paused, for scheduled fires; overlap) or fired
    /// with a new task. `last` is the state of the schedule's previous fire's task, read before
    /// (`None`: there is none). `cancel_other` cancels the previous task here, before the fire
    /// commits.
    pub(crate) async fn decide(
        &self,
        schedule: &Schedule,
        last: Option<LastTask>,
        nominal: Timestamp,
        reason: FireReason,
        now: Timestamp,
    ) -> Result<NewFire, Error> {
        if reason == FireReason::Schedule && schedule.paused {
            return Ok(NewFire::skipped(nominal, FireReason::Paused));
        }
        let def = &schedule.def;
        let live = last.filter(|t| !t.state.is_terminal());
        match (def.overlap, live) {
            (OverlapPolicy::Skip, Some(_)) => {
                return Ok(NewFire::skipped(nominal, FireReason::Overlap));
            }
            // A created task that has not started yet is the buffer: it is full.
            (OverlapPolicy::BufferOne, Some(t)) if t.attempt == 0 => {
                return Ok(NewFire::skipped(nominal, FireReason::Overlap));
            }
            (OverlapPolicy::CancelOther, Some(t)) => match self.sundial.cancel(t.id).await {
                Ok(_) | Err(sundial::Error::WrongState { .. } | sundial::Error::NotFound) => {}
                Err(e) => return Err(e.into()),
            },
            _ => {}
        }
        let cfg = self.sundial.config();
        let task = def.task_for(
            &schedule.id,
            TaskId(uuid::Uuid::now_v7()),
            nominal,
            now,
            cfg.shard_count,
            &cfg.limits,
        )?;
        Ok(NewFire::fired(nominal, reason, task))
    }

    /// The state of the schedule's previous fire's task, read now (for fires outside the tick
    /// path: trigger, backfill, re-arming).
    pub(crate) async fn last_task(&self, schedule: &Schedule) -> Result<Option<LastTask>, Error> {
        Ok(match schedule.last_task {
            Some(id) => self.sundial.get(id).await?.as_ref().map(LastTask::of),
            None => None,
        })
    }

    /// Runs one tick (as claimed: its execution id is the attempt its fire completes): hands
    /// it to the batcher, which fires it together with the other ticks that are due, and waits
    /// for its answer.
    pub(crate) async fn on_tick(self: &Arc<Self>, tick: &Task) -> Result<TickEnd, HandlerError> {
        let (reply, answer) = oneshot::channel();
        let queue = self.batcher.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(batch_loop(Arc::downgrade(self), rx));
            tx
        });
        let request = TickRequest {
            tick: tick.clone(),
            reply,
        };
        if let Err(mpsc::error::SendError(request)) = queue.send(request) {
            // The batcher is gone (its runtime ended): fire this tick alone.
            self.fire_batch(vec![request]).await;
        }
        answer
            .await
            .unwrap_or_else(|_| Err(HandlerError::retryable("tick batch interrupted")))
    }

    /// Fires a batch of due ticks: one read of their schedules (with their previous tasks), the
    /// decisions, then one [`ScheduleStore::fire_many`] (each op conditional on its tick still
    /// being the armed one), and an answer to each tick.
    pub(crate) async fn fire_batch(&self, batch: Vec<TickRequest>) {
        let mut parsed = Vec::with_capacity(batch.len());
        for req in batch {
            match parse_tick(&req.tick.payload) {
                Some((id, nominal)) => parsed.push((req, id, nominal)),
                None => {
                    tracing::warn!(tick = %req.tick.id, "schedule tick with an unreadable payload; dropped");
                    let _ = req.reply.send(Ok(TickEnd::ToComplete));
                }
            }
        }
        if parsed.is_empty() {
            return;
        }
        let ids: Vec<ScheduleId> = parsed
            .iter()
            .map(|(_, id, _)| id.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let loaded: HashMap<ScheduleId, (Schedule, Option<LastTask>)> =
            match self.store.schedules_for_fire(&ids).await {
                Ok(v) => v.into_iter().map(|(s, l)| (s.id.clone(), (s, l))).collect(),
                Err(e) => {
                    for (req, ..) in parsed {
                        let _ = req.reply.send(Err(retryable(&e)));
                    }
                    return;
                }
            };
        let now = self.sundial.clock().now();
        let mut ops = Vec::with_capacity(parsed.len());
        let mut waiting = Vec::with_capacity(parsed.len());
        for (req, id, nominal) in parsed {
            let Some((schedule, last)) = loaded.get(&id) else {
                let _ = req.reply.send(Ok(TickEnd::ToComplete)); // deleted
                continue;
            };
            if schedule.armed_tick != Some(req.tick.id) {
                // Superseded, or this tick already fired and its run's result was lost after
                // the commit (so the engine may not have heard of what that commit inserted).
                self.renotify(schedule).await;
                let _ = req.reply.send(Ok(TickEnd::ToComplete));
                continue;
            }
            match self.plan(schedule, *last, req.tick.id, nominal, now).await {
                Ok(mut op) => {
                    // The tick's own success commits with its fire.
                    op.complete_tick = req.tick.execution_id;
                    ops.push(op);
                    waiting.push((req, id));
                }
                Err(e) => {
                    let _ = req.reply.send(Err(retryable(e)));
                }
            }
        }
        if ops.is_empty() {
            return;
        }
        let results = self.store.fire_many(ops).await;
        for ((req, id), r) in waiting.into_iter().zip(results) {
            let answer = match r {
                Ok(applied) => {
                    self.after_fire(&applied, now);
                    Ok(if applied.tick_completed {
                        TickEnd::CompletedByFire
                    } else {
                        TickEnd::ToComplete
                    })
                }
                Err(ScheduleError::StaleTick { .. } | ScheduleError::NotFound) => {
                    Ok(TickEnd::ToComplete)
                }
                Err(ScheduleError::AlreadyExists) => Ok(TickEnd::ToComplete),
                Err(e) => self.after_uncertain_fire(&id, req.tick.id, e).await,
            };
            let _ = req.reply.send(answer);
        }
    }

    /// What the armed tick `tick` of `schedule`, for the fire at `nominal`, writes: the fire (or
    /// the missed fires, when it runs too late), the next tick, conditional on `tick` still
    /// being the armed one.
    pub(crate) async fn plan(
        &self,
        schedule: &Schedule,
        last: Option<LastTask>,
        tick: TaskId,
        nominal: Timestamp,
        now: Timestamp,
    ) -> Result<FireOp, Error> {
        let id = &schedule.id;
        let def = &schedule.def;
        let spec = match self.validate(def) {
            Ok(s) => s,
            Err(e) => {
                // A definition stored by another version that this one refuses: stop rather than
                // guess, and say so.
                tracing::error!(schedule = %id, error = %e, "schedule definition no longer valid; disarmed");
                return Ok(FireOp {
                    schedule_id: id.clone(),
                    expect_armed: Some(tick),
                    complete_tick: None,
                    fires: Vec::new(),
                    arm: ArmChange::Disarm,
                    now,
                });
            }
        };
        let window = def.catchup();
        let late = |n: Timestamp| now.since(n.saturating_add(def.jitter_for(id, n))) > window;

        let mut fires = Vec::new();
        let next = if late(nominal) {
            // Noticed too late: this fire and every later one that is as late are missed (or
            // skipped, while paused), oldest first; arm the first one still inside the window.
            let (outcome, reason) = if schedule.paused {
                (FireOutcome::Skipped, FireReason::Paused)
            } else {
                (FireOutcome::Missed, FireReason::OutsideCatchupWindow)
            };
            let record = |n: Timestamp, count: u64, through: Option<Timestamp>| NewFire {
                nominal: n,
                outcome,
                reason,
                task: None,
                count,
                through,
            };
            let mut cursor = Some(nominal);
            let mut walked = 0usize;
            let mut run: Option<(Timestamp, u64, Timestamp)> = None;
            while let Some(n) = cursor {
                if !late(n) || walked >= MISSED_WALK_LIMIT {
                    break;
                }
                if fires.len() < MISSED_INDIVIDUALLY {
                    fires.push(record(n, 1, None));
                } else {
                    run = Some(match run {
                        None => (n, 1, n),
                        Some((first, c, _)) => (first, c + 1, n),
                    });
                }
                walked += 1;
                cursor = def.next_nominal_after(&spec, n);
            }
            if let Some((first, count, last)) = run {
                fires.push(record(first, count, Some(last)));
            }
            cursor
        } else {
            fires.push(
                self.decide(schedule, last, nominal, FireReason::Schedule, now)
                    .await?,
            );
            def.next_nominal_after(&spec, nominal)
        };
        let arm = self.arm_change(id, def, next, now)?;
        Ok(FireOp {
            schedule_id: id.clone(),
            expect_armed: Some(tick),
            complete_tick: None,
            fires,
            arm,
            now,
        })
    }

    /// A fire that failed may still have committed (the answer was lost after the commit), and
    /// then it recorded the tick's success too, so no retry of the tick would come to tell the
    /// engine about what the fire inserted. Read the schedule again: when `tick` is no longer
    /// its armed tick the fire went through, and the engine hears of its tasks now; else the
    /// tick fails and is retried as before.
    async fn after_uncertain_fire(
        &self,
        id: &ScheduleId,
        tick: TaskId,
        error: ScheduleError,
    ) -> Result<TickEnd, HandlerError> {
        match self.store.get_schedule(id).await {
            Ok(Some(s)) if s.armed_tick != Some(tick) => {
                self.renotify(&s).await;
                Ok(TickEnd::ToComplete)
            }
            Ok(None) => Ok(TickEnd::ToComplete),
            _ => Err(retryable(error)),
        }
    }

    /// Tells the engine again about a schedule's armed tick and latest task: after a fire whose
    /// commit went through but whose run failed before it could notify, they would otherwise wait
    /// for the shard's idle rescan.
    async fn renotify(&self, schedule: &Schedule) {
        for id in [schedule.armed_tick, schedule.last_task]
            .into_iter()
            .flatten()
        {
            if let Ok(Some(t)) = self.sundial.get(id).await {
                self.sundial.notify_task(&t);
            }
        }
    }

    /// Tells the engine about what the fire inserted, and counts it.
    pub(crate) fn after_fire(&self, applied: &FireApplied, now: Timestamp) {
        for r in &applied.fires {
            if let FireResult::Recorded { record, task } = r {
                metrics::counter!(
                    "sundial_schedule_fires_total",
                    "outcome" => record.outcome.as_str(),
                    "reason" => record.reason.as_str()
                )
                .increment(record.count);
                if let Some(t) = task {
                    metrics::counter!("sundial_task_created_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                        .increment(1);
                    self.sundial.notify_task(t);
                    if record.reason == FireReason::Schedule {
                        let due = applied
                            .schedule
                            .def
                            .jitter_for(&applied.schedule.id, record.nominal);
                        metrics::histogram!("sundial_schedule_fire_lateness_seconds")
                            .record(now.since(record.nominal.saturating_add(due)).as_secs_f64());
                    }
                }
            }
        }
        if let Some(t) = &applied.tick {
            self.sundial.notify_task(t);
        }
    }
}
