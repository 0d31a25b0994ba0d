//! Claims ahead that a shard loop does not wait for.
//!
//! A run claimed ahead of its due time (an in-process handler's within `Config::run_claim_lead`,
//! a push call's within `Config::push_claim_lead`) has until that time for its claim to commit.
//! When the turn waited for such a claim, one claim stuck behind a long write (the embedded
//! store's one writer taking a 1,000-task insert) held the whole loop: entries coming within the
//! lead meanwhile were claimed only when it returned, by then too late for their own claim to
//! commit before they were due. So, on one node, a turn sends a claim whose entries all start
//! after `now` off on a task of its own ([`ClaimsAhead::send`]) and goes on: the next turn's
//! claims queue behind the same write instead of behind the turn, and commit with it.
//!
//! What such a claim started runs from its task (the runs wait for their due time, as any run
//! claimed ahead). What it did not start (refused for a place, a rate limit, or a store error)
//! comes back to the loop, which takes it at its next turn ([`ClaimsAhead::take_returned`]), as
//! if its own claim had answered so; the shard's wake-up brings that turn. A claim in flight
//! counts as a run in flight, so a draining engine and a stepped test wait for it.
//!
//! While a claim is in flight, its tasks are still scheduled in the store: a notification or a
//! scan can bring one back into the window. The turn leaves such an entry out
//! ([`ClaimsAhead::in_flight_ids`]): the claim in flight starts it or brings it back, so a second
//! claim of it would only race the first (and, with the first held in the store, win).
//!
//! This module never decides what to claim or whether a claim is allowed: the turn chooses the
//! entries, and the store decides each start.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sundial_core::{TaskId, Timestamp};
use sundial_store::{ClaimOutcome, DueClaim, OutOfBandMark};
use tokio::sync::Notify;

use super::shard::Pending;
use super::{ClaimError, Engine, Owner};
use crate::trace::{self, Step};

/// Most claims one loop leaves in flight; beyond them the turn waits for its claim again. A
/// store that stopped answering so holds a bounded number of tasks, not one per turn.
pub(super) const MOST_IN_FLIGHT: usize = 16;

/// What a claim sent off brought back for the loop.
pub(super) enum Returned {
    /// Entries the store did not start, with its answer for each, and the exclusive-key release
    /// count read before the claim was asked for.
    Refused {
        claimed: Vec<(Pending, ClaimOutcome)>,
        releases_before: u64,
    },
    /// The claim failed: its entries go back into the window.
    Failed(Vec<Pending>),
}

#[derive(Default)]
struct Shared {
    in_flight: AtomicUsize,
    answered: Notify,
    returned: Mutex<Vec<Returned>>,
    /// The tasks of the claims in flight.
    ids: Mutex<HashSet<TaskId>>,
}

/// One loop's claims in flight (see the module documentation).
pub(super) struct ClaimsAhead {
    owner: Owner,
    shard: u32,
    shared: Arc<Shared>,
}

impl ClaimsAhead {
    /// The claims of the loop of `shard`, made as `owner`.
    pub(super) fn new(owner: Owner, shard: u32) -> Self {
        ClaimsAhead {
            owner,
            shard,
            shared: Arc::default(),
        }
    }

    /// Whether another claim may be sent off.
    pub(super) fn has_room(&self) -> bool {
        self.shared.in_flight.load(Ordering::Acquire) < MOST_IN_FLIGHT
    }

    /// Sends off the claims of `group` (each with its run), starting at `at`: what they start
    /// runs, the rest comes back.
    pub(super) fn send(
        &self,
        engine: &Arc<Engine>,
        group: Vec<Pending>,
        at: Timestamp,
        mark: Option<OutOfBandMark>,
        releases_before: u64,
    ) {
        let claims: Vec<DueClaim> = group.iter().map(|b| b.claim.clone()).collect();
        let ids: Vec<TaskId> = claims.iter().map(|c| c.id).collect();
        let (owner, shard) = (self.owner, self.shard);
        let shared = self.shared.clone();
        if let Ok(mut in_flight) = shared.ids.lock() {
            in_flight.extend(ids.iter().copied());
        }
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        engine.in_flight.fetch_add(1, Ordering::SeqCst);
        let engine = engine.clone();
        tokio::spawn(async move {
            let answer = engine.claim(owner, claims, at).await;
            let back = match answer {
                Ok(outcomes) => {
                    let mut refused = Vec::new();
                    for (b, outcome) in group.into_iter().zip(outcomes) {
                        match outcome {
                            ClaimOutcome::Started(task) => start(&engine, b, *task, mark),
                            other => refused.push((b, other)),
                        }
                    }
                    (!refused.is_empty()).then_some(Returned::Refused {
                        claimed: refused,
                        releases_before,
                    })
                }
                Err(ClaimError::Store(e)) => {
                    tracing::warn!(shard, error = %e, "claim ahead failed; entries stay in the window");
                    Some(Returned::Failed(group))
                }
                Err(ClaimError::LeaseLost) => {
                    // Only a fenced claim is refused so, and claims are sent off on one node
                    // only: the loop's own next claim finds the lease lost and ends it.
                    Some(Returned::Failed(group))
                }
            };
            // Out of flight before anything comes back: the turn that takes it back claims its
            // entries again.
            if let Ok(mut in_flight) = shared.ids.lock() {
                for id in &ids {
                    in_flight.remove(id);
                }
            }
            if let Some(back) = back {
                if let Ok(mut r) = shared.returned.lock() {
                    r.push(back);
                }
                if let Some(s) = engine.shards.get(shard as usize) {
                    s.wake.notify_one();
                }
            }
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            shared.answered.notify_waiters();
            engine.in_flight.fetch_sub(1, Ordering::SeqCst);
            // Whatever the count now (the runs this claim started may be waiting for their due
            // time), a stepped test waiting for it looks again.
            engine.drained.notify_waiters();
        });
    }

    /// The tasks of the claims in flight (empty, without a lock, when none is).
    pub(super) fn in_flight_ids(&self) -> HashSet<TaskId> {
        if self.shared.in_flight.load(Ordering::Acquire) == 0 {
            return HashSet::new();
        }
        self.shared
            .ids
            .lock()
            .map(|ids| ids.clone())
            .unwrap_or_default()
    }

    /// What the claims sent off brought back since the last call.
    pub(super) fn take_returned(&self) -> Vec<Returned> {
        self.shared
            .returned
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }

    /// Whether a claim sent off brought something back not taken yet.
    pub(super) fn has_returned(&self) -> bool {
        self.shared
            .returned
            .lock()
            .map(|r| !r.is_empty())
            .unwrap_or(false)
    }

    /// Waits until every claim sent off has answered.
    pub(super) async fn answered(&self) {
        loop {
            let notified = self.shared.answered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Runs what a claim sent off started, as the turn's dispatch does for its own claims.
fn start(engine: &Arc<Engine>, b: Pending, task: sundial_core::Task, mark: Option<OutOfBandMark>) {
    engine.left_line(&task);
    if let Some(until) = task.lease_expires_at {
        engine.lease_granted(until);
    }
    if let Some((handler, permit)) = b.run {
        let fire = trace::task_span(Step::Fire, &task);
        engine.spawn_run(task, handler, permit, fire, mark);
    }
}
