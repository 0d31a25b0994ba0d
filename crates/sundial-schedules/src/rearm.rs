//! Re-arming stranded schedules: a schedule whose armed tick is no longer live (cancelled through
//! the task API, dead after its attempts, finished without firing, or gone) would never fire
//! again, since only its tick fires it. The runner looks for such schedules when it starts and
//! then once every idle interval of the engine (its backstop), and repairs each with the same
//! conditional fire operation a tick uses, expecting the dead tick to be the armed one: a schedule
//! that was re-armed meanwhile (an update, another node's sweep) is left alone.
//!
//! This module never fires a schedule early: a stranded tick whose fire time is still ahead is
//! replaced by a fresh tick for the same fire time; one whose time has come is fired (or recorded
//! missed) exactly as its tick would have been, late.

use std::sync::{Arc, Weak};

use sundial::Timestamp;
use sundial_core::schedule::ScheduleId;
use sundial_store::{ArmChange, FireOp, Schedule, ScheduleError};

use crate::{Error, Inner};

/// Schedules read per page of the sweep.
const PAGE: usize = 500;

impl Inner {
    /// Re-arms every stranded schedule. Returns how many it repaired.
    pub(crate) async fn rearm_stranded(&self) -> Result<usize, Error> {
        let mut repaired = 0;
        let mut after: Option<ScheduleId> = None;
        loop {
            let page = self.store.stranded_schedules(after.as_ref(), PAGE).await?;
            for schedule in &page.schedules {
                match self.rearm(schedule).await {
                    Ok(true) => repaired += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(schedule = %schedule.id, error = %e, "re-arming failed; the next sweep tries again");
                    }
                }
            }
            match page.next_cursor {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        if repaired > 0 {
            metrics::counter!("sundial_schedule_rearmed_total").increment(repaired as u64);
        }
        Ok(repaired)
    }

    /// Re-arms one stranded schedule; `false` when it had moved on meanwhile.
    async fn rearm(&self, schedule: &Schedule) -> Result<bool, Error> {
        let (Some(dead), Some(nominal)) = (schedule.armed_tick, schedule.next_fire_at) else {
            return Ok(false);
        };
        let now = self.sundial.clock().now();
        let due = nominal.saturating_add(schedule.def.jitter_for(&schedule.id, nominal));
        let op = if due > now {
            // Not due yet: a fresh tick for the same fire time.
            FireOp {
                schedule_id: schedule.id.clone(),
                expect_armed: Some(dead),
                complete_tick: None,
                fires: Vec::new(),
                arm: ArmChange::arm(self.arm(&schedule.id, &schedule.def, nominal, now)?),
                now,
            }
        } else {
            // Due or past: what the tick would have done, late (catch-up applies).
            let last = self.last_task(schedule).await?;
            self.plan(schedule, last, dead, nominal, now).await?
        };
        match self.store.fire(op).await {
            Ok(applied) => {
                tracing::info!(schedule = %schedule.id, tick = %dead, "schedule's armed tick was not live; re-armed");
                self.after_fire(&applied, now);
                Ok(true)
            }
            Err(ScheduleError::StaleTick { .. } | ScheduleError::NotFound) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The sweep: now, then once every idle interval of the engine (on its clock). Ends when the
/// runner is dropped.
pub(crate) async fn sweep_loop(inner: Weak<Inner>) {
    loop {
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if let Err(e) = inner.rearm_stranded().await {
                tracing::warn!(error = %e, "looking for stranded schedules failed");
            }
            let clock = inner.sundial.clock().clone();
            let at = clock
                .now()
                .saturating_add(inner.sundial.config().idle_interval);
            (clock, at)
        };
        let (clock, at): (Arc<dyn sundial::Clock>, Timestamp) = next;
        clock.sleep_until(at).await;
    }
}
