//! [`Stepper`]: the engine's loops without their tasks, turned by the caller on its own clock.
//!
//! In production each shard loop and the reaper run in a thin task that sleeps on the engine's
//! clock until the loop's answer (see [`super::shard::drive`]). A test on a `ManualClock` instead
//! takes the loops with [`crate::Sundial::stepper`], moves the clock and turns them: what a turn
//! does at a given time is then exactly determined, and nothing waits for a real-time sleep.
//! Handler runs still run as tasks of their own (they are the application's code);
//! [`Stepper::settle`] waits for them by event, not by time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sundial_core::Timestamp;

use super::reaper::Reaper;
use super::shard::{ShardLoop, Supervised};
use super::{Engine, Owner, Placement};

/// Turns the engine's loops on demand (see the module documentation). Created by
/// [`crate::Sundial::stepper`]; the engine is then not started by [`crate::Sundial::start`] (which
/// still serves `Running::shutdown`).
pub struct Stepper {
    engine: Arc<Engine>,
    loops: Vec<Option<Supervised>>,
    reaper: Reaper,
}

/// Longest [`Stepper::settle`] waits for handler runs to finish (real time, a bound on a test
/// that went wrong; a run that is meant to hang makes settle return at this bound).
const RUNS_BOUND: Duration = Duration::from_secs(10);

/// Most rounds of turns one settle takes (a bound on a loop that keeps wanting a turn now).
const MAX_ROUNDS: usize = 100_000;

/// How often [`Stepper::settle_holding`] looks at the held count again while runs are held.
const HELD_RECHECK: Duration = Duration::from_millis(1);

impl Stepper {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        let taken = engine.take_loops();
        let loops = if taken && matches!(engine.placement, Placement::Single) {
            (0..engine.shards.len() as u32)
                .map(|shard| {
                    Some(Supervised::new(ShardLoop::new(
                        engine.clone(),
                        shard,
                        Owner::Sole,
                    )))
                })
                .collect()
        } else {
            // Already started (the tasks own the loops), or several nodes (the membership loop
            // does): nothing to step.
            Vec::new()
        };
        Stepper {
            reaper: Reaper::new(engine.clone()),
            engine,
            loops,
        }
    }

    /// One turn of every shard loop and of the reaper at the clock's current time. Returns the
    /// earliest time any of them wants its next turn.
    pub async fn turn(&mut self) -> Timestamp {
        let now = self.engine.clock.now();
        let mut next = self.reaper.turn(now).await;
        for slot in &mut self.loops {
            let Some(l) = slot else {
                continue;
            };
            match l.turn(now).await {
                Ok(t) => next = next.min(t),
                Err(_) => {
                    *slot = None;
                    continue;
                }
            }
            // A stepped turn ends when its claims have answered, those it sent off ahead too
            // (`super::ahead`); what they brought back wants the next turn at once.
            if l.claims_ahead_answered().await {
                next = next.min(now);
            }
        }
        next
    }

    /// Turns until nothing is left to do at the clock's current time: after each round of turns it
    /// waits (by event) for the handler runs under way to record their results, whose retries or
    /// released keys may need another turn. Returns the earliest next wake.
    pub async fn settle(&mut self) -> Timestamp {
        self.settle_runs(None).await
    }

    /// Like [`Stepper::settle`], for a test whose handler holds some runs open on purpose (until
    /// the test lets them go): `held` says how many runs are held now, and runs count as done
    /// once no more than that many are in flight. Runs that a handler holds are therefore not
    /// waited for, while ticks, retries and the runs that do finish are.
    pub async fn settle_holding(&mut self, held: impl Fn() -> usize) -> Timestamp {
        self.settle_runs(Some(&held)).await
    }

    async fn settle_runs(&mut self, held: Option<&dyn Fn() -> usize>) -> Timestamp {
        // A bound on a test that went wrong (a loop that keeps wanting a turn now).
        for _ in 0..MAX_ROUNDS {
            let now = self.engine.clock.now();
            // A run that ends while the turn looks may free its slot after the turn found none
            // and be gone before `wait_runs` looks: the released slot, as the driver's wake-up
            // on it in production, asks for one more turn.
            let released = *self.engine.permits_released.borrow();
            let next = self.turn().await;
            let runs = self.wait_runs(held).await;
            let inbox = self
                .engine
                .shards
                .iter()
                .any(|s| s.inbox.lock().map(|i| !i.is_empty()).unwrap_or(false));
            let freed = *self.engine.permits_released.borrow() != released;
            match runs {
                Runs::StillRunning => return next,
                Runs::None if next > now && !inbox && !freed => return next,
                _ => {}
            }
        }
        self.engine.clock.now()
    }

    /// Waits (bounded) until no handler run is in flight but the `held` ones. Without `held` it
    /// waits for the engine's drained event; a held count can rise without an event (a run
    /// reaching its hold), so with one it also looks again every millisecond.
    async fn wait_runs(&self, held: Option<&dyn Fn() -> usize>) -> Runs {
        let mut any = false;
        let waited = tokio::time::timeout(RUNS_BOUND, async {
            loop {
                let notified = self.engine.drained.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                // Runs claimed ahead that wait on the clock for a due time still ahead are not
                // waited for: only the test's next step of the clock lets them go. One whose
                // time has come is, though it may not have woken yet.
                let ahead = self.engine.runs_waiting_due.after(self.engine.clock.now());
                let holding = held.map_or(0, |h| h()) + ahead;
                if self.engine.in_flight.load(Ordering::SeqCst) <= holding {
                    return;
                }
                any = true;
                if held.is_none() && ahead == 0 {
                    notified.await;
                } else {
                    let _ = tokio::time::timeout(HELD_RECHECK, notified).await;
                }
            }
        })
        .await;
        match (waited, any) {
            (Err(_), _) => Runs::StillRunning,
            (Ok(()), true) => Runs::Finished,
            (Ok(()), false) => Runs::None,
        }
    }

    /// How often shard loops and the reaper were restarted after a panic.
    pub fn restarts(&self) -> u64 {
        self.loops
            .iter()
            .flatten()
            .map(|l| l.restarts())
            .sum::<u64>()
            + self.reaper.restarts()
    }
}

enum Runs {
    /// None was in flight.
    None,
    /// Some were, and all recorded their results.
    Finished,
    /// Some still run at the bound (a handler meant to hang, or waiting for the clock).
    StillRunning,
}
