//! The tick handler: what happens when a schedule's armed tick comes due. See the crate
//! documentation for the protocol; this module decides (catch-up, pause, overlap) and hands one
//! [`FireOp`] to the store.

use std::time::Duration;

use serde_json::json;
use sundial::{Backoff, HandlerError, Task, TaskId, TaskSpec, Timestamp};
use sundial_core::schedule::{OverlapPolicy, ScheduleDef, ScheduleId};
use sundial_store::{
    Arm, ArmChange, FireApplied, FireOp, FireOutcome, FireReason, FireResult, NewFire, Schedule,
    ScheduleError, TICK_KIND, TICK_QUEUE,
};

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
        let due = nominal.saturating_add(def.jitter_for(id, nominal));
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
    /// with a new task. `cancel_other` cancels the previous task here, before the fire commits.
    pub(crate) async fn decide(
        &self,
        schedule: &Schedule,
        nominal: Timestamp,
        reason: FireReason,
        now: Timestamp,
    ) -> Result<NewFire, Error> {
        if reason == FireReason::Schedule && schedule.paused {
            return Ok(NewFire::skipped(nominal, FireReason::Paused));
        }
        let def = &schedule.def;
        let previous = match schedule.last_task {
            Some(id) => self.sundial.get(id).await?,
            None => None,
        };
        let live = previous.as_ref().filter(|t| !t.state.is_terminal());
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

    /// Runs one tick.
    pub(crate) async fn on_tick(&self, tick: &Task) -> Result<(), HandlerError> {
        let Some((id, nominal)) = parse_tick(&tick.payload) else {
            tracing::warn!(tick = %tick.id, "schedule tick with an unreadable payload; dropped");
            return Ok(());
        };
        let Some(schedule) = self.store.get_schedule(&id).await.map_err(retryable)? else {
            return Ok(()); // deleted
        };
        if schedule.armed_tick != Some(tick.id) {
            // Superseded, or this tick already fired and its run's result was lost after the
            // commit (so the engine may not have heard of what that commit inserted).
            self.renotify(&schedule).await;
            return Ok(());
        }
        let def = &schedule.def;
        let spec = match def.validate(&self.sundial.config().limits) {
            Ok(s) => s,
            Err(e) => {
                // A definition stored by another version that this one refuses: stop rather than
                // guess, and say so.
                tracing::error!(schedule = %id, error = %e, "schedule definition no longer valid; disarmed");
                let op = FireOp {
                    schedule_id: id,
                    expect_armed: Some(tick.id),
                    fires: Vec::new(),
                    arm: ArmChange::Disarm,
                    now: self.sundial.clock().now(),
                };
                return match self.store.fire(op).await {
                    Ok(_) | Err(ScheduleError::StaleTick { .. } | ScheduleError::NotFound) => {
                        Ok(())
                    }
                    Err(e) => Err(retryable(e)),
                };
            }
        };
        let now = self.sundial.clock().now();
        let window = def.catchup();
        let late = |n: Timestamp| now.since(n.saturating_add(def.jitter_for(&id, n))) > window;

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
                self.decide(&schedule, nominal, FireReason::Schedule, now)
                    .await
                    .map_err(retryable)?,
            );
            def.next_nominal_after(&spec, nominal)
        };
        let arm = self.arm_change(&id, def, next, now).map_err(retryable)?;
        let op = FireOp {
            schedule_id: id,
            expect_armed: Some(tick.id),
            fires,
            arm,
            now,
        };
        match self.store.fire(op).await {
            Ok(applied) => {
                self.after_fire(&applied, now);
                Ok(())
            }
            Err(ScheduleError::StaleTick { .. } | ScheduleError::NotFound) => Ok(()),
            Err(ScheduleError::AlreadyExists) => Ok(()),
            Err(ScheduleError::Store(e)) => Err(retryable(e)),
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
