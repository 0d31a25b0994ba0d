//! The reaper: running attempts whose lease ended (the process that ran them died, a worker
//! vanished) go back to `scheduled` (due now) or to `dead`, through the placement (on several
//! nodes only the shards this node owns, under their fences).
//!
//! As with the shard loop, [`Reaper::turn`] is one turn at a given time that answers when to look
//! next (the earliest lease expiry, or the idle backstop); [`drive`] runs turns in a thin task,
//! tests step them. A panic inside a turn is caught, logged and counted, and the reaper resumes
//! after a backoff. Never decides whether a lease ended: the store's update is conditional.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use sundial_core::Timestamp;

use super::Engine;
use super::shard::panic_message;

/// Most leases expired per store call; a full answer makes the reaper look again at once.
const EXPIRE_BATCH: usize = 1_000;

pub(crate) struct Reaper {
    engine: Arc<Engine>,
    restarts: u64,
}

impl Reaper {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Reaper {
            engine,
            restarts: 0,
        }
    }

    pub(crate) fn restarts(&self) -> u64 {
        self.restarts
    }

    /// One turn at `now` (panics caught): answers when to look next.
    pub(crate) async fn turn(&mut self, now: Timestamp) -> Timestamp {
        match std::panic::AssertUnwindSafe(self.turn_inner(now))
            .catch_unwind()
            .await
        {
            Ok(next) => next,
            Err(panic) => {
                self.restarts += 1;
                tracing::error!(
                    panic = panic_message(&*panic),
                    restarts = self.restarts,
                    "reaper panicked; resuming after a backoff"
                );
                metrics::counter!("sundial_reaper_restarts_total").increment(1);
                now.saturating_add(Duration::from_secs(1))
            }
        }
    }

    async fn turn_inner(&mut self, now: Timestamp) -> Timestamp {
        let engine = &self.engine;
        // As in the shard loop: while busy, any new lease must wake the reaper again.
        engine.reaper.gate.store(i64::MAX, Ordering::Release);
        match engine
            .placement
            .expire_leases(&engine.store, now, EXPIRE_BATCH)
            .await
        {
            Ok(expired) => {
                for t in &expired {
                    metrics::counter!("sundial_lease_expiries_total", "namespace" => sundial_core::namespace::namespace_of(&t.queue).to_string(), "queue" => sundial_core::namespace::local(&t.queue).to_string())
                        .increment(1);
                    tracing::info!(id = %t.id, state = %t.state, "lease expired");
                    engine.notify_task(t);
                    engine.release_exclusive(t);
                }
                if expired.len() == EXPIRE_BATCH {
                    return now;
                }
            }
            Err(e) => tracing::warn!(error = %e, "lease expiry failed"),
        }
        let mut gate = engine.idle_deadline(now);
        if let Ok(Some(t)) = engine.placement.next_lease_expiry(&engine.store).await {
            gate = gate.min(Timestamp(t.0.saturating_add(1)));
        }
        engine.reaper.gate.store(gate.0, Ordering::Release);
        gate
    }
}

impl Engine {
    /// A lease was granted until `until`: make sure the reaper looks by then.
    pub(super) fn lease_granted(&self, until: Timestamp) {
        if until.0 < self.reaper.gate.load(Ordering::Acquire) {
            self.reaper.wake.notify_one();
        }
    }
}

/// The production driver of the reaper, until shutdown.
pub(crate) async fn drive(engine: Arc<Engine>) {
    let mut stopping = engine.stopping_rx();
    let mut reaper = Reaper::new(engine.clone());
    loop {
        if *stopping.borrow() {
            break;
        }
        let now = engine.clock.now();
        let gate = reaper.turn(now).await;
        if gate <= now {
            continue;
        }
        tokio::select! {
            _ = engine.clock.sleep_until(gate) => {}
            _ = engine.reaper.wake.notified() => {}
            _ = stopping.changed() => {}
        }
    }
}
