//! The shard loop: one per shard this process runs, owning the shard's [`Window`] and its gate.
//!
//! [`ShardLoop::turn`] is one turn, at a time the caller gives: take notifications into the
//! window; refill the look-ahead when it has moved past the cursor (one range scan, bounded by the
//! window's room; from the front of the shard when the idle backstop is due); claim what is due in
//! one batch; and answer when the loop wants to look next (the earliest entry, the next refill or
//! the backstop). The turn never sleeps. In production [`drive`] runs turns in a thin task that
//! sleeps on the engine's clock until the answer, a notification, a released permit or a stop;
//! tests step the turns themselves on a manual clock (see [`crate::Stepper`]).
//!
//! [`Supervised`] wraps a loop so that a panic inside a turn (in any code the turn runs: the store,
//! the window) does not stop the shard until the process restarts: the panic is logged at error
//! level, counted in `sundial_shard_loop_restarts_total`, and a fresh loop (empty window, scanning
//! from the front) resumes after a backoff on the engine's clock.
//!
//! This module never decides *whether* a claim is allowed: the store does, conditionally, and a
//! refused claim is dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use sundial_core::{ExecutionId, Priority, Timestamp};
use sundial_store::{ClaimOutcome, ClaimTarget, DueClaim, DueEntry, DueKey, OutOfBandMark};

use crate::trace::{self, Step};
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::ahead::{ClaimsAhead, Returned};
use super::handoff::Started;
use super::{Engine, LeaseLost, Owner, QueueState, WaitFor, changed_or_never};
use crate::handler::Handler;
use crate::window::{Lane, Meta, Window};

/// First pause after a failed store call or a panic; doubled on each repeat up to its cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest pause between tries while the store fails (a scan, a claim, the paused queues).
/// It bounds how late dispatch resumes once the database is back: a loop that backed off for
/// longer would leave overdue tasks waiting that long after the outage ended. One try a second
/// per shard while the database is down is cheap.
const STORE_BACKOFF_CAP: Duration = Duration::from_secs(1);
/// How long a loop starved only of push slots gathers released slots before its next turn.
const PUSH_SLOT_GATHER: Duration = Duration::from_millis(2);
const RESTART_BACKOFF_CAP: Duration = Duration::from_secs(30);

/// One shard's loop state. Dropping it loses nothing: the window is a cache of the store.
pub(crate) struct ShardLoop {
    engine: Arc<Engine>,
    shard: u32,
    owner: Owner,
    window: Window,
    names: HashSet<Arc<str>>,
    /// Queue state by interned queue name, so a batch takes the engine's queue lock only for a
    /// queue this loop has not met yet.
    queues: HashMap<Arc<str>, Arc<QueueState>>,
    /// Starts for waiting polls whose claim failed without an answer (the connection went
    /// down around its commit): see [`ShardLoop::recover_doubtful`].
    doubtful: Vec<DoubtfulStart>,
    shard_label: String,
    /// The backstop: once every idle interval (with jitter) the next refill starts from the front
    /// of the shard and so finds any task whose notification was lost (between nodes, wake-ups are
    /// best effort). It runs whether or not the window is empty: a steady load keeps the window
    /// busy and would otherwise hide such a task behind the cursor for as long as the load lasts.
    rescan_at: Timestamp,
    /// The pause before the next try after a failed store call; back to [`FIRST_BACKOFF`] after
    /// a call that succeeds.
    store_backoff: Duration,
    /// Which permits the last turn left due entries waiting for.
    starved: Starved,
    /// The queues in whose line (see `super::line`) this loop holds a waiting entry.
    in_line: HashSet<Arc<str>>,
    /// Per rate limit key, the latest time this loop offered one of its refused entries for
    /// (see [`ShardLoop::rate_slot`]).
    rate_slots: HashMap<String, Timestamp>,
    /// Entries whose start for a waiting poll was refused: readied instead from now on.
    no_hand: HashSet<sundial_core::TaskId>,
    /// Claims ahead of the due time this loop sent off without waiting (see `super::ahead`).
    ahead: ClaimsAhead,
}

impl Drop for ShardLoop {
    /// A stopped loop waits for nothing: its places in line go, and the others look again.
    fn drop(&mut self) {
        let mut left = false;
        for q in &self.in_line {
            if let Some(state) = self.queues.get(q) {
                left |= state.line.leave(self.shard);
            }
        }
        if left {
            self.engine.wake_starved();
        }
    }
}

/// The permits a turn left due entries waiting for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Starved {
    /// A queue's (an in-process handler's concurrency).
    pub(crate) queue: bool,
    /// A push receiver's slots or the node's push slots.
    pub(crate) push: bool,
}

impl Starved {
    fn any(self) -> bool {
        self.queue || self.push
    }

    fn or(self, other: Starved) -> Starved {
        Starved {
            queue: self.queue || other.queue,
            push: self.push || other.push,
        }
    }

    /// How long a loop left in this state gathers released permits before its next turn. A
    /// full receiver's slots come back one answer at a time: gathered for a moment, one turn
    /// claims many of them instead of one turn (a walk of the window and a store write) per
    /// slot, which at hundreds of answers a second took the CPU that other receivers' calls
    /// needed. Never while a queue waits: a worker's next task is claimed at once.
    fn gather_after_release(self) -> Option<Duration> {
        (self.push && !self.queue).then_some(PUSH_SLOT_GATHER)
    }
}

impl ShardLoop {
    pub(crate) fn new(engine: Arc<Engine>, shard: u32, owner: Owner) -> Self {
        let rescan_at = engine.idle_deadline(engine.clock.now());
        if let Some(s) = engine.shards.get(shard as usize) {
            // A fresh window covers nothing yet.
            s.covered_until.store(i64::MIN, Ordering::Release);
        }
        ShardLoop {
            window: Window::new(engine.config.window_capacity),
            engine,
            shard,
            owner,
            names: HashSet::new(),
            queues: HashMap::new(),
            doubtful: Vec::new(),
            shard_label: shard.to_string(),
            rescan_at,
            store_backoff: FIRST_BACKOFF,
            starved: Starved::default(),
            in_line: HashSet::new(),
            rate_slots: HashMap::new(),
            no_hand: HashSet::new(),
            ahead: ClaimsAhead::new(owner, shard),
        }
    }

    /// Whether the last turn left due entries waiting for a concurrency permit: the driver then
    /// also wakes when a permit is released.
    pub(crate) fn starved(&self) -> bool {
        self.starved.any()
    }

    /// Which permits the last turn left due entries waiting for.
    pub(crate) fn starved_of(&self) -> Starved {
        self.starved
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        intern(&mut self.names, s)
    }

    fn take_inbox(&mut self) {
        let inbox: Vec<DueEntry> = self.engine.shards[self.shard as usize]
            .inbox
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        for e in inbox {
            let meta = Meta {
                queue: self.intern(&e.queue),
                kind: self.intern(&e.kind),
                timeout_ms: e.timeout_ms,
                push_host: e.push_host.as_deref().map(|h| self.intern(h)),
                priority: e.priority,
            };
            self.window.insert(e.key, meta);
        }
    }

    /// One turn at `now`: returns when the loop wants its next turn (at or before `now`: at once),
    /// or [`LeaseLost`] when a fenced claim was refused and the loop must end.
    pub(crate) async fn turn(&mut self, now: Timestamp) -> Result<Timestamp, LeaseLost> {
        let engine = self.engine.clone();
        let signal = &engine.shards[self.shard as usize];
        let lookahead = engine.config.lookahead;
        // While the loop is busy, any notification must wake it again: the gate it is about to
        // arm may be computed from reads that missed the notified write.
        signal.gate.store(i64::MAX, Ordering::Release);
        // 0. The paused queues, read from the store before anything is claimed (a restarted
        //    process holds a pause from its first turn).
        if !engine.paused.loaded()
            && let Err(e) = engine.refresh_paused().await
        {
            tracing::warn!(shard = self.shard, error = %e, "reading the paused queues failed; retrying");
            let retry = self.backoff_from(now);
            signal.gate.store(retry.0, Ordering::Release);
            return Ok(retry);
        }
        // 1. Notifications, and what the claims sent off ahead did not start.
        self.take_inbox();
        if self.take_returned(now) {
            self.starved = Starved::default();
            let retry = self.backoff_from(now);
            signal.gate.store(retry.0, Ordering::Release);
            return Ok(retry);
        }

        // 2. Refill the look-ahead (from the front of the shard when the backstop is due, or
        //    when a queue was resumed). A backstop further away than one idle interval was armed
        //    before the clock stepped back: it is due now, or the step would postpone it by its
        //    size.
        let stepped_back = self.rescan_at > now.saturating_add(engine.config.idle_interval);
        if signal.rescan.swap(false, Ordering::AcqRel) || now >= self.rescan_at || stepped_back {
            self.window.reset_cursor();
            signal.covered_until.store(i64::MIN, Ordering::Release);
            self.rescan_at = engine.idle_deadline(now);
        }
        let horizon = now.saturating_add(lookahead);
        if self.window.needs_refill(now, lookahead) {
            let limit = self.window.room();
            // Writes that commit while the scan runs may be missing from its snapshot: route their
            // notifications into the inbox, which is read after the scan.
            signal.covered_until.store(horizon.0, Ordering::Release);
            metrics::counter!("sundial_store_scans_total", "shard" => self.shard_label.clone())
                .increment(1);
            match engine
                .store
                .scan_due(self.shard, self.window.cursor(), horizon, limit)
                .await
            {
                Ok(rows) => {
                    let names = &mut self.names;
                    self.window
                        .absorb_scan(rows, horizon, limit, &mut |s| intern(names, s));
                }
                Err(e) => {
                    tracing::warn!(shard = self.shard, error = %e, "scan failed; retrying");
                    let retry = self.backoff_from(now);
                    signal.gate.store(retry.0, Ordering::Release);
                    return Ok(retry);
                }
            }
            let covered = self.window.cursor().map_or(i64::MIN, |c| c.due_at.0);
            signal.covered_until.store(covered, Ordering::Release);
        }
        // Anything that arrived while scanning.
        self.take_inbox();
        // Starts whose claim failed without an answer: the store answers again.
        let doubtful_waiting = if self.doubtful.is_empty() {
            Starved::default()
        } else {
            self.recover_doubtful(now).await
        };

        // 3. Claim what is due (push tasks up to their claim lead ahead, and tasks for waiting
        //    polls up to the hand-off lead ahead).
        // With several nodes only push tasks are claimed ahead: a due claim is otherwise never
        // written before its due time by the database's clock (`tests/cluster_nodes_pg.rs`).
        let single = engine.placement.is_single();
        let leads = Leads {
            push: self.push_lead(),
            hand: if single {
                self.hand_lead()
            } else {
                Duration::ZERO
            },
            run: if single {
                engine.config.run_claim_lead.min(lookahead)
            } else {
                Duration::ZERO
            },
        };
        let claimed = match self.claim_due(now, leads).await? {
            ClaimPass::Done(claimed) => {
                self.store_backoff = FIRST_BACKOFF;
                claimed
            }
            ClaimPass::StoreFailed => {
                // The entries stay in the window; try again after the backoff, never at once (a
                // claim that fails at once again would spin while the database is down).
                self.starved = Starved::default();
                let retry = self.backoff_from(now);
                signal.gate.store(retry.0, Ordering::Release);
                return Ok(retry);
            }
        };
        self.starved = claimed.starved.or(doubtful_waiting);
        metrics::gauge!("sundial_shard_window_tasks", "shard" => self.shard_label.clone())
            .set(self.window.len() as f64);

        // 4. Arm the gate: the earliest entry (a push task: its lead before that), the next
        //    refill, or the idle backstop.
        let first = if self.starved.any() {
            self.window.first_due_after(now)
        } else {
            self.window.first_due()
        };
        let mut gate = first.unwrap_or(Timestamp::MAX);
        // A start ahead for a poll is worth an early turn only while some poll waits.
        let hand = if engine.polls_waiting.load(Ordering::Relaxed) > 0 {
            leads.hand
        } else {
            Duration::ZERO
        };
        for (lead, taker) in [
            (leads.push, LeadTaker::Push),
            (hand, LeadTaker::Poll),
            (leads.run, LeadTaker::Run),
        ] {
            if lead.is_zero() {
                continue;
            }
            if claimed.full {
                // The batch filled up: more may be claimable now.
                gate = now;
            } else if let Some(next) =
                self.window
                    .first_due_after_where(now.saturating_add(lead), LEAD_LOOKS, |meta| {
                        self.takes_lead(taker, meta)
                    })
            {
                // Entries due within the lead that are still here are not push tasks or found
                // no poll (they wait for their own due time, `first`), or wait for a slot
                // (`starved`).
                gate = gate.min(Timestamp(next.0.saturating_sub(lead.as_millis() as i64)));
            }
        }
        if self.window.is_empty() {
            match engine
                .store
                .next_due(self.shard, self.window.cursor())
                .await
            {
                Ok(Some(t))
                    if Timestamp(t.0.saturating_sub(lookahead.as_millis() as i64))
                        < self.rescan_at =>
                {
                    // Not before the window's next refill: only a scan brings the task in, and
                    // a turn before it finds nothing new (armed at once, the loop would spin
                    // until the refill).
                    let enters = Timestamp(t.0 - lookahead.as_millis() as i64);
                    let refill = self.window.refill_at(lookahead).unwrap_or(enters);
                    gate = enters.max(refill).max(now);
                }
                Ok(_) => gate = self.rescan_at,
                Err(e) => {
                    tracing::warn!(shard = self.shard, error = %e, "next_due failed");
                    gate = now.saturating_add(Duration::from_secs(1));
                }
            }
        } else if let Some(refill) = self.window.refill_at(lookahead) {
            gate = gate.min(refill.max(Timestamp(now.0 + 1)));
        }
        gate = gate.min(self.rescan_at);
        signal.gate.store(gate.0, Ordering::Release);
        Ok(gate)
    }

    /// Looks again at the starts whose claim failed without an answer, the turn's own and those
    /// claimed ahead (`super::ahead`). A claim whose connection went down around its commit may
    /// have committed: its task then runs under the execution the loop asked for, and nobody was
    /// told. Found so, a start for a poll is kept for the next poll of its queue (as a start
    /// whose poll had gone, see `handoff`) and a waiting poll is woken; an in-process run is run
    /// once a permit of its queue is free, a push call once a slot of its receiver and one of the
    /// node's push slots are (either waits for its due time if claimed ahead). So none waits out
    /// its lease (the task's timeout) for the reaper. One that did not commit is still
    /// scheduled, in the window, and claimed as any other. A read that fails keeps the rest for
    /// the next turn. Answers which permits the ones kept for later wait for (the driver then
    /// wakes when one is released).
    async fn recover_doubtful(&mut self, now: Timestamp) -> Starved {
        let engine = self.engine.clone();
        let mut later = Vec::new();
        let mut waiting = Starved::default();
        while let Some(d) = self.doubtful.pop() {
            let task = match engine.store.get(d.id).await {
                Ok(task) => task,
                Err(e) => {
                    tracing::debug!(shard = self.shard, error = %e, "reading a doubtful start failed; later");
                    later.push(d);
                    later.append(&mut self.doubtful);
                    break;
                }
            };
            let Some(task) = task.filter(|t| {
                t.state == sundial_core::TaskState::Running && t.execution_id == Some(d.execution)
            }) else {
                continue;
            };
            let q = self
                .queues
                .entry(d.queue.clone())
                .or_insert_with(|| engine.queue(&d.queue))
                .clone();
            // The slots its run needs, taken before the task is handed on; none free: later.
            let run = match &d.runner {
                DoubtfulRunner::Poll => None,
                DoubtfulRunner::InProcess(h) => match q.permits.clone().try_acquire_owned() {
                    Ok(permit) => Some((h.clone(), vec![permit])),
                    Err(_) => {
                        waiting.queue = true;
                        later.push(d);
                        continue;
                    }
                },
                DoubtfulRunner::Push { host, handler } => {
                    let host_permit = engine.push_host(host).try_acquire_owned();
                    let node_permit = engine.push_permits.clone().try_acquire_owned();
                    match (host_permit, node_permit) {
                        (Ok(host_permit), Ok(node_permit)) => {
                            Some((handler.clone(), vec![host_permit, node_permit]))
                        }
                        _ => {
                            waiting.push = true;
                            later.push(d);
                            continue;
                        }
                    }
                }
            };
            tracing::info!(shard = self.shard, id = %d.id, "a start committed though its claim failed; taken up again");
            engine.left_line(&task);
            if let Some(until) = task.lease_expires_at {
                engine.lease_granted(until);
            }
            match run {
                None => {
                    q.waiters.keep_unclaimed(vec![Started {
                        task,
                        claimed_at: now,
                        mark: None,
                    }]);
                    engine.wake_pollers(&d.queue, 1);
                }
                Some((handler, permits)) => {
                    // A run claimed ahead waits for its due time in `spawn_run`, as any other.
                    let fire = trace::task_span(Step::Fire, &task);
                    engine.spawn_run(task, handler, permits, fire, None);
                }
            }
        }
        self.doubtful = later;
        waiting
    }

    /// Takes back what the claims sent off ahead did not start (see `super::ahead`): refused
    /// entries as the turn's own claims' ([`ShardLoop::dispatch`]), failed ones into the window.
    /// Answers whether a claim failed (the turn then backs off, as after its own failed claim).
    /// A failed claim's starts are looked at again as the turn's own ([`DoubtfulStart`]).
    fn take_returned(&mut self, now: Timestamp) -> bool {
        let mut failed = false;
        for back in self.ahead.take_returned() {
            match back {
                Returned::Refused {
                    claimed,
                    releases_before,
                } => self.dispatch(claimed, now, releases_before, Hands::default(), None),
                Returned::Failed(group) => {
                    failed = true;
                    for b in group {
                        if let Some(d) = DoubtfulStart::of(&b) {
                            self.doubtful.push(d);
                        }
                        self.window.insert(b.key, b.meta);
                    }
                }
            }
        }
        failed
    }

    /// Waits until the claims this loop sent off ahead have answered, and answers whether they
    /// brought back something for the next turn.
    pub(crate) async fn claims_ahead_answered(&self) -> bool {
        self.ahead.answered().await;
        self.ahead.has_returned()
    }

    /// Whether an entry is claimed within the lead of `taker`: a push task within the push lead;
    /// a task without an in-process handler within the hand-off lead; a task whose handler
    /// takes claims ahead within the run lead. Only those are worth a turn that lead early.
    fn takes_lead(&self, taker: LeadTaker, meta: &Meta) -> bool {
        if meta.push_host.is_some() {
            return taker == LeadTaker::Push;
        }
        let handler = self.engine.handler(&meta.kind);
        match taker {
            LeadTaker::Push => false,
            LeadTaker::Poll => handler.is_none(),
            LeadTaker::Run => handler.is_some_and(|h| h.claim_ahead()),
        }
    }

    /// When to try the store again after a failed call at `now`; doubles the next pause.
    fn backoff_from(&mut self, now: Timestamp) -> Timestamp {
        let retry = now.saturating_add(self.store_backoff);
        self.store_backoff = (self.store_backoff * 2).min(STORE_BACKOFF_CAP);
        retry
    }

    /// How long before their due time push tasks are claimed: the configured lead when push
    /// delivery runs in this process (bounded by the look-ahead), else zero.
    fn push_lead(&self) -> Duration {
        if self.engine.push_handler().is_some() {
            self.engine
                .config
                .push_claim_lead
                .min(self.engine.config.lookahead)
        } else {
            Duration::ZERO
        }
    }

    /// How long before their due time tasks are started for waiting polls: the configured lead
    /// when hand-off is on (bounded by the look-ahead), else zero.
    fn hand_lead(&self) -> Duration {
        if self.engine.config.hand_off_to_polls {
            self.engine
                .config
                .hand_off_lead
                .min(self.engine.config.lookahead)
        } else {
            Duration::ZERO
        }
    }

    /// Claims and dispatches every due entry it can: entries due by `now`, push entries due by
    /// `now + leads.push` (their runs wait for the due time before calling), and entries due by
    /// `now + leads.hand` for which a poll waits (the poll answers at the due time).
    async fn claim_due(&mut self, now: Timestamp, leads: Leads) -> Result<ClaimPass, LeaseLost> {
        let engine = self.engine.clone();
        let mut starved = Starved::default();
        let mut starved_queues: HashSet<Arc<str>> = HashSet::new();
        // Resolved once per batch: the handler of each kind met and the state of each queue.
        let mut handlers: HashMap<Arc<str>, Option<Arc<dyn Handler>>> = HashMap::new();
        let mut push_handler: Option<Option<Arc<dyn Handler>>> = None;
        let mut full_hosts: HashSet<Arc<str>> = HashSet::new();
        let mut push_full = false;
        let mut batch: Vec<Pending> = Vec::new();
        // The polls this turn starts tasks for.
        let mut hands = Hands::default();
        let claim_batch = engine.config.claim_batch;
        let paused = engine.paused.snapshot();
        let mut held_back: Vec<DueKey> = Vec::new();
        // Entries whose claim ahead is still in flight came back through a notification or a
        // scan: that claim starts them or brings them back (see `super::ahead`).
        let claiming_ahead = self.ahead.in_flight_ids();
        let mut in_flight: Vec<DueKey> = Vec::new();
        // Entries of receivers found full, to be parked in their lanes (see `window`).
        let mut to_park: Vec<DueKey> = Vec::new();
        let until = now.saturating_add(leads.push.max(leads.hand).max(leads.run));
        let push_until = now.saturating_add(leads.push);
        let hand_until = now.saturating_add(leads.hand);
        let run_until = now.saturating_add(leads.run);
        // First the parked entries of receivers and queues with free slots, from the front of
        // each lane: one more than there are free slots, whose failed acquire marks the receiver
        // or queue full again. A lane without a free slot is not read at all.
        let mut from_lanes: Vec<(DueKey, Meta)> = Vec::new();
        for (lane, entries) in self.window.lanes(until) {
            let free = match lane {
                Lane::Push(host) => engine.push_host(host).available_permits(),
                Lane::Queue(queue) => self
                    .queues
                    .entry(queue.clone())
                    .or_insert_with(|| engine.queue(queue))
                    .permits
                    .available_permits(),
            };
            if free == 0 {
                match lane {
                    Lane::Push(_) => starved.push = true,
                    Lane::Queue(queue) => {
                        starved.queue = true;
                        starved_queues.insert(queue.clone());
                    }
                }
                continue;
            }
            from_lanes.extend(
                entries
                    .take(free.min(claim_batch).saturating_add(1))
                    .map(|(k, m)| (*k, m.clone())),
            );
        }
        // Then a bounded walk of the other entries: entries of starved queues are skipped, but
        // not without limit; entries of full receivers are skipped once and then parked.
        let mut full = false;
        // Whether a free queue permit was left to another loop's better-ranked entry.
        let mut deferred = false;
        let mut candidates: Vec<(bool, (&DueKey, &Meta))> = from_lanes
            .iter()
            .map(|(k, m)| (true, (k, m)))
            .chain(
                self.window
                    .due(until)
                    .take(claim_batch.saturating_mul(4))
                    .map(|e| (false, e)),
            )
            .collect();
        // The higher priority first (`sundial_core::priority`: the due time moved by the
        // priority's credit), parked or walked; entries of the default priority keep due order.
        // Parked entries first otherwise: each lane's front is its queue's or receiver's
        // earliest.
        if candidates
            .iter()
            .any(|(_, (_, m))| m.priority != Priority::DEFAULT)
        {
            candidates.sort_by_key(|(_, (k, m))| (m.priority.rank(k.due_at), k.due_at, k.id));
        }
        for (parked, (key, meta)) in candidates {
            if batch.len() >= claim_batch {
                full = true;
                break;
            }
            // Within a lead but not yet due: push tasks are claimed ahead within theirs, tasks
            // of in-process handlers within the run lead, and tasks for waiting polls within
            // the hand-off lead (below, where the handler or the poll is found).
            let ahead = key.due_at > now;
            if ahead
                && if meta.push_host.is_some() {
                    key.due_at > push_until
                } else {
                    key.due_at > hand_until && key.due_at > run_until
                }
            {
                continue;
            }
            if !claiming_ahead.is_empty() && claiming_ahead.contains(&key.id) {
                in_flight.push(*key);
                continue;
            }
            if !paused.is_empty() && paused.contains(&*meta.queue) {
                // Stays scheduled in the store; a resume rescans the shard from the front.
                held_back.push(*key);
                continue;
            }
            if starved_queues.contains(&meta.queue) {
                if !parked && meta.push_host.is_none() {
                    to_park.push(*key);
                }
                continue;
            }
            // A task claimed ahead runs from its due time: its lease counts from then.
            let run = RunClaim {
                execution: ExecutionId(uuid::Uuid::now_v7()),
                lease_until: now
                    .max(key.due_at)
                    .saturating_add(Duration::from_millis(meta.timeout_ms))
                    .saturating_add(engine.config.lease_grace),
            };
            // A push task runs on the push handler under its receiver's slot and one of the
            // node's push slots (not its queue's permits): a receiver that is slow or down holds
            // only its own slots, and its other due tasks stay here while others' go out.
            let push = match &meta.push_host {
                Some(host) => push_handler
                    .get_or_insert_with(|| engine.push_handler())
                    .as_ref()
                    .map(|h| (host, h)),
                None => None,
            };
            if ahead && push.is_none() && meta.push_host.is_some() {
                // A push task without a push handler here is readied at its due time.
                continue;
            }
            if let Some((host, handler)) = push {
                if full_hosts.contains(host) {
                    starved.push = true;
                    if !parked {
                        to_park.push(*key);
                    }
                    continue;
                }
                if push_full {
                    starved.push = true;
                    continue;
                }
                let host_slots = engine.push_host(host);
                let Ok(host_permit) = host_slots.try_acquire_owned() else {
                    starved.push = true;
                    full_hosts.insert(host.clone());
                    if !parked {
                        to_park.push(*key);
                    }
                    continue;
                };
                let Ok(node_permit) = engine.push_permits.clone().try_acquire_owned() else {
                    starved.push = true;
                    push_full = true;
                    continue;
                };
                batch.push(Pending {
                    key: *key,
                    meta: meta.clone(),
                    claim: run.claim(key.id),
                    starts_at: now.max(key.due_at),
                    run: Some((handler.clone(), vec![host_permit, node_permit])),
                    hand: None,
                });
                continue;
            }
            let handler = handlers
                .entry(meta.kind.clone())
                .or_insert_with(|| engine.handler(&meta.kind))
                .clone();
            if ahead
                && match &handler {
                    // A handler that opted out of claims ahead waits for the due time.
                    Some(h) => !h.claim_ahead() || key.due_at > run_until,
                    None => key.due_at > hand_until,
                }
            {
                continue;
            }
            let Some(handler) = handler else {
                // A poll of the queue is waiting: start the task for it (see `handoff`), unless
                // a start was refused for this entry before; else ready it for the next poll.
                // Ahead of its due time only the former: nothing is readied early.
                let q = self
                    .queues
                    .entry(meta.queue.clone())
                    .or_insert_with(|| engine.queue(&meta.queue));
                let hand = if !engine.config.hand_off_to_polls || self.no_hand.contains(&key.id) {
                    None
                } else {
                    hands.place(&meta.queue, q)
                };
                let starts_at = now.max(key.due_at);
                let target = match hand {
                    Some(h) => ClaimTarget::Run {
                        execution: ExecutionId(uuid::Uuid::now_v7()),
                        lease_until: starts_at
                            .saturating_add(Duration::from_millis(meta.timeout_ms)),
                        worker: hands.waiters[h].worker.clone(),
                    },
                    None if ahead => continue,
                    None => ClaimTarget::Ready,
                };
                batch.push(Pending {
                    key: *key,
                    meta: meta.clone(),
                    claim: DueClaim { id: key.id, target },
                    starts_at,
                    run: None,
                    hand,
                });
                continue;
            };
            let q = self
                .queues
                .entry(meta.queue.clone())
                .or_insert_with(|| engine.queue(&meta.queue));
            // One free permit is left to each other loop whose waiting entry ranks ahead of this
            // one (see `line`).
            let place = (meta.priority.rank(key.due_at), key.id);
            let ahead = q.line.ahead_of(self.shard, place);
            let free = q.permits.available_permits();
            let permit = if ahead > 0 && free <= ahead {
                deferred |= free > 0;
                None
            } else {
                q.permits.clone().try_acquire_owned().ok()
            };
            match permit {
                Some(permit) => {
                    batch.push(Pending {
                        key: *key,
                        meta: meta.clone(),
                        claim: run.claim(key.id),
                        starts_at: now.max(key.due_at),
                        run: Some((handler, vec![permit])),
                        hand: None,
                    });
                }
                None => {
                    starved.queue = true;
                    starved_queues.insert(meta.queue.clone());
                    q.line.wait(self.shard, place);
                    // Out of the walk until the queue has a free permit (see `window`).
                    if !parked {
                        to_park.push(*key);
                    }
                }
            }
        }
        // Places in line this pass did not renew go (the entry was started, or is gone); the
        // loops deferred to, or behind a place that went, look again. A pass cut short by a full
        // batch keeps the places it did not reach.
        let mut line_changed = deferred;
        let held = std::mem::take(&mut self.in_line);
        for q in held {
            if starved_queues.contains(&q) {
                continue;
            }
            if full {
                self.in_line.insert(q);
            } else if let Some(state) = self.queues.get(&q) {
                line_changed |= state.line.leave(self.shard);
            }
        }
        self.in_line.extend(starved_queues.iter().cloned());
        if line_changed {
            engine.wake_starved();
        }
        for key in held_back.iter().chain(&in_flight) {
            self.window.remove(key);
        }
        for key in &to_park {
            self.window.park(key);
        }
        if batch.is_empty() {
            return Ok(ClaimPass::Done(Claimed { starved, full }));
        }
        for b in &batch {
            self.window.remove(&b.key);
        }
        // One store call per start time: the entries due by now start now; a push task claimed
        // ahead starts (is recorded as started, and is called) at its due time, which the store
        // checks against and records. The calls run together (one group commit, typically).
        // A poll's starts are a call of their own, inside the poll's audit scope, so that the
        // claim commits the poll request's record.
        let mut groups: BTreeMap<(Timestamp, Option<usize>), Vec<Pending>> = BTreeMap::new();
        for b in batch {
            groups.entry((b.starts_at, b.hand)).or_default().push(b);
        }
        let releases_before = engine.exclusive_releases.load(Ordering::SeqCst);
        // Read before the claims are asked for: the same mark at a start claimed ahead tells
        // that nothing could have ended the task since (`Started::unchanged_since_claim`).
        let mark = engine.store.out_of_band_mark();
        // On one node, a claim of runs that all start after `now` is sent off, and the turn goes
        // on without it (see `super::ahead`): its runs have until their due time.
        if engine.placement.is_single() {
            let ahead: Vec<(Timestamp, Option<usize>)> = groups
                .iter()
                .filter(|((at, hand), group)| {
                    *at > now && hand.is_none() && group.iter().all(|b| b.run.is_some())
                })
                .map(|(k, _)| *k)
                .collect();
            for key in ahead {
                if !self.ahead.has_room() {
                    break;
                }
                if let Some(group) = groups.remove(&key) {
                    self.ahead
                        .send(&engine, group, key.0, mark, releases_before);
                }
            }
        }
        let answers = futures::future::join_all(groups.iter().map(|((at, hand), group)| {
            let claims: Vec<DueClaim> = group.iter().map(|b| b.claim.clone()).collect();
            let scope = hand.and_then(|h| hands.waiters[h].scope.clone());
            let call = engine.claim(self.owner, claims, *at);
            async move {
                match scope {
                    Some(scope) => scope.run(call).await,
                    None => call.await,
                }
            }
        }))
        .await;
        let mut claimed: Vec<(Pending, ClaimOutcome)> = Vec::new();
        let mut lease_lost = false;
        let mut store_failed = false;
        for ((_, group), answer) in groups.into_iter().zip(answers) {
            match answer {
                Ok(outcomes) => claimed.extend(group.into_iter().zip(outcomes)),
                Err(super::ClaimError::LeaseLost) => lease_lost = true,
                Err(super::ClaimError::Store(e)) => {
                    tracing::warn!(shard = self.shard, error = %e, "claim failed; entries stay in the window");
                    store_failed = true;
                    for b in group {
                        if let Some(d) = DoubtfulStart::of(&b) {
                            self.doubtful.push(d);
                        }
                        self.window.insert(b.key, b.meta);
                    }
                }
            }
        }
        // What the calls that went through started runs (its attempts are durable), whatever
        // became of the others.
        self.dispatch(claimed, now, releases_before, hands, mark);
        if lease_lost {
            return Err(LeaseLost);
        }
        if store_failed {
            return Ok(ClaimPass::StoreFailed);
        }
        Ok(ClaimPass::Done(Claimed { starved, full }))
    }

    /// Runs what a claim started, wakes the pollers of what it readied, and keeps what waits
    /// for an exclusive key.
    fn dispatch(
        &mut self,
        claimed: Vec<(Pending, ClaimOutcome)>,
        now: Timestamp,
        releases_before: u64,
        hands: Hands,
        mark: Option<OutOfBandMark>,
    ) {
        let engine = self.engine.clone();
        // Tasks readied per queue: as many waiting pollers are woken.
        let mut readied_queues: HashMap<Arc<str>, usize> = HashMap::new();
        // Tasks started for each poll of `hands`.
        let mut handed: Vec<Vec<Started>> = (0..hands.waiters.len()).map(|_| Vec::new()).collect();
        if self.no_hand.len() > NO_HAND_PRUNE_AT {
            self.no_hand.clear();
        }
        // Whether a refused start gave back the permits taken for it.
        let mut permits_unused = false;
        for (b, outcome) in claimed {
            if !matches!(outcome, ClaimOutcome::Started(_))
                && b.run.as_ref().is_some_and(|(_, p)| !p.is_empty())
            {
                permits_unused = true;
            }
            if b.hand.is_some() && !matches!(outcome, ClaimOutcome::Started(_)) {
                // A start for a poll refused (an exclusive key, the queue's limit, a rate
                // limit): the entry waits as any refused entry does, and is readied rather than
                // started for a poll when it comes round again, so the polls' claims decide.
                self.no_hand.insert(b.key.id);
            }
            match outcome {
                ClaimOutcome::Started(task) => {
                    engine.left_line(&task);
                    self.no_hand.remove(&task.id);
                    if let Some(until) = task.lease_expires_at {
                        engine.lease_granted(until);
                    }
                    if let Some(h) = b.hand {
                        // Started for a waiting poll: the fire is one point of the trace, as
                        // for a readied task; the poll's answer delivers it.
                        drop(trace::task_span(Step::Fire, &task).entered());
                        // Started ahead: the poll counts its lateness when it answers.
                        if task.started_at.is_none_or(|at| at <= now) {
                            metrics::histogram!("sundial_fire_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(&task.queue).to_string(), "queue" => sundial_core::namespace::local(&task.queue).to_string(), "target" => "poll")
                                .record(now.since(task.became_due_at()).as_secs_f64());
                        }
                        if let Some(tasks) = handed.get_mut(h) {
                            tasks.push(Started {
                                task: *task,
                                claimed_at: now,
                                mark,
                            });
                        }
                        continue;
                    }
                    if let Some((handler, permit)) = b.run {
                        let fire = trace::task_span(Step::Fire, &task);
                        engine.spawn_run(*task, handler, permit, fire, mark);
                    }
                }
                ClaimOutcome::Readied(task) => {
                    engine.left_line(&task);
                    // Ready for workers: the fire is one point of the trace; the poll that takes
                    // the task delivers it (`sundial.task.deliver`).
                    drop(trace::task_span(Step::Fire, &task).entered());
                    metrics::histogram!("sundial_fire_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(&task.queue).to_string(), "queue" => sundial_core::namespace::local(&task.queue).to_string(), "target" => "ready")
                        .record(now.since(task.became_due_at()).as_secs_f64());
                    *readied_queues.entry(b.meta.queue.clone()).or_default() += 1;
                }
                ClaimOutcome::Busy { exclusive_key } => {
                    self.wait_for_place(b, WaitFor::Group(exclusive_key), now, releases_before);
                }
                ClaimOutcome::QueueFull { queue } => {
                    metrics::counter!("sundial_queue_limited_total", "namespace" => sundial_core::namespace::namespace_of(&queue).to_string(), "queue" => sundial_core::namespace::local(&queue).to_string())
                        .increment(1);
                    self.wait_for_place(b, WaitFor::Queue(queue), now, releases_before);
                }
                ClaimOutcome::RateLimited {
                    key,
                    until,
                    interval_ms,
                } => {
                    metrics::counter!("sundial_rate_limited_total", "namespace" => sundial_core::namespace::namespace_of(&b.meta.queue).to_string(), "queue" => sundial_core::namespace::local(&b.meta.queue).to_string())
                        .increment(1);
                    let slot = self.rate_slot(key, until, interval_ms, now);
                    self.window.insert(
                        DueKey {
                            due_at: slot,
                            id: b.key.id,
                        },
                        b.meta,
                    );
                }
                ClaimOutcome::Skipped(task) => {
                    tracing::debug!(id = %task.id, "skipped: exclusive key busy");
                }
                ClaimOutcome::NotClaimable => {}
            }
        }
        // A permit taken for a start the store refused (a task another claim had started, as
        // when a notification brought back an entry the scan had already claimed) goes back
        // unused, with no run to announce it: entries that found its queue full in this turn,
        // here or in another loop, look again.
        if permits_unused {
            engine.wake_starved();
        }
        for (q, n) in readied_queues {
            engine.ready_changed_by(&q, n);
        }
        // Each poll gets what was started for it; a poll that got nothing looks again (its
        // waiter dropped), and what a poll that is gone was handed waits for the next poll.
        for ((queue, waiter), tasks) in hands.queues.into_iter().zip(hands.waiters).zip(handed) {
            if tasks.is_empty() {
                continue;
            }
            if let Err(back) = waiter.hand(tasks) {
                let q = engine.queue(&queue);
                q.waiters.keep_unclaimed(back);
                q.ready.notify_one();
            }
        }
    }
}

/// Above this many entries, the set of entries not to start for a poll is cleared (an entry
/// left in it is only readied rather than started for a poll: never wrong, only slower).
const NO_HAND_PRUNE_AT: usize = 4_096;

/// The polls one turn starts tasks for (see `handoff`): each taken from its queue's waiters
/// when the turn meets a due task of that queue and the polls taken so far are full.
#[derive(Default)]
struct Hands {
    waiters: Vec<super::handoff::Waiter>,
    /// The queue of each of `waiters`.
    queues: Vec<Arc<str>>,
    /// Per queue, the last poll taken and how many more tasks it takes.
    open: HashMap<Arc<str>, (usize, usize)>,
}

impl Hands {
    /// The poll (an index into `waiters`) a due task of `queue` is started for, if one waits.
    fn place(&mut self, queue: &Arc<str>, state: &QueueState) -> Option<usize> {
        if let Some((at, room)) = self.open.get_mut(queue)
            && *room > 0
        {
            *room -= 1;
            return Some(*at);
        }
        let waiter = state.waiters.take()?;
        let at = self.waiters.len();
        self.open.insert(queue.clone(), (at, waiter.max - 1));
        self.waiters.push(waiter);
        self.queues.push(queue.clone());
        Some(at)
    }
}

impl ShardLoop {
    /// Keeps an entry whose start was refused for want of a place (of a group key, or of its
    /// queue's limit) until a release hands it back, or for the 1 s backstop retry.
    fn wait_for_place(
        &mut self,
        b: Pending,
        wait_for: WaitFor,
        now: Timestamp,
        releases_before: u64,
    ) {
        let engine = self.engine.clone();
        let entry = DueEntry {
            key: b.key,
            queue: b.meta.queue.to_string(),
            kind: b.meta.kind.to_string(),
            timeout_ms: b.meta.timeout_ms,
            push_host: b.meta.push_host.as_deref().map(str::to_string),
            priority: b.meta.priority,
        };
        // Registered, then the release counter read, under the waiters' lock: a release either
        // finds this waiter in line (and may hand it the place) or has bumped the counter.
        let (front, released) = match engine.exclusive_waiting.lock() {
            Ok(mut w) => {
                let front = w.entry(wait_for).or_default().register(self.shard, entry);
                (
                    front,
                    engine.exclusive_releases.load(Ordering::SeqCst) != releases_before,
                )
            }
            Err(_) => (true, true),
        };
        // A place freed since the claim began and handed to nobody: look again now, with the
        // due key, so waiters start in due order. Otherwise a finish hands the place over; the
        // front of the line also retries every second on its own (the backstop for a place
        // freed on another node, or handed to a task that is gone), the rest of a long line
        // every 30 s, so a backlog behind a small limit is not claimed over and over.
        let retry = if released {
            b.key
        } else {
            let backstop = if front {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(30)
            };
            DueKey {
                due_at: now.saturating_add(backstop),
                id: b.key.id,
            }
        };
        self.window.insert(retry, b.meta);
    }
}

impl ShardLoop {
    /// When an entry refused by the rate limit `key` (next start allowed at `until`, then one
    /// per `interval_ms`) is offered again: the key's next start this loop has not offered to
    /// another of its entries yet. Refused entries so take successive starts, one claim each,
    /// instead of all asking for the same one. A start offered to an entry that is then not
    /// taken (cancelled, or another node's) only makes the next entry's come later; it never
    /// lets one start early, as the store decides every start.
    fn rate_slot(
        &mut self,
        key: String,
        until: Timestamp,
        interval_ms: u64,
        now: Timestamp,
    ) -> Timestamp {
        if self.rate_slots.len() > 4_096 {
            self.rate_slots.retain(|_, at| *at > now);
        }
        let interval = Duration::from_millis(interval_ms.max(1));
        let slot = match self.rate_slots.get(&key) {
            Some(last) if *last >= until => last.saturating_add(interval),
            _ => until,
        };
        self.rate_slots.insert(key, slot);
        slot
    }
}

/// What one claim pass of a turn came to.
enum ClaimPass {
    /// The claims went through (or nothing was due).
    Done(Claimed),
    /// The store refused a claim with an error: its entries stay in the window (what the
    /// turn's other claim calls started runs).
    StoreFailed,
}

/// What a turn's claim left behind.
struct Claimed {
    /// Due entries stayed because their queue (or push receiver) had no free permit.
    starved: Starved,
    /// The batch filled up before the due entries ran out.
    full: bool,
}

/// One due entry on its way into a claim.
/// The execution id and lease of a `Run` claim.
struct RunClaim {
    execution: ExecutionId,
    lease_until: Timestamp,
}

impl RunClaim {
    fn claim(&self, id: sundial_core::TaskId) -> DueClaim {
        DueClaim {
            id,
            target: ClaimTarget::Run {
                execution: self.execution,
                lease_until: self.lease_until,
                worker: None,
            },
        }
    }
}

/// Who a lead is for (see [`ShardLoop::takes_lead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeadTaker {
    Push,
    Poll,
    Run,
}

/// How many entries past a lead a turn looks at for one that lead applies to, when it arms its
/// gate. An entry beyond them that the lead applies to gets no early turn of its own until the
/// entries before it are gone; it is then claimed at a later turn (at worst at its due time).
const LEAD_LOOKS: usize = 8;

/// How far ahead of their due time a turn claims: push tasks (`Config::push_claim_lead`), tasks
/// for waiting polls (`Config::hand_off_lead`) and tasks of in-process handlers
/// (`Config::run_claim_lead`), each zero when off.
#[derive(Debug, Clone, Copy)]
struct Leads {
    push: Duration,
    hand: Duration,
    run: Duration,
}

/// A start whose claim failed without an answer: for a waiting poll, an in-process run or a
/// push call, claimed by the turn or ahead of its due time.
struct DoubtfulStart {
    id: sundial_core::TaskId,
    execution: ExecutionId,
    queue: Arc<str>,
    runner: DoubtfulRunner,
}

/// Who runs a [`DoubtfulStart`] found committed.
enum DoubtfulRunner {
    /// The next poll of its queue.
    Poll,
    /// An in-process handler, under a permit of its queue.
    InProcess(Arc<dyn Handler>),
    /// The push handler, under a slot of its receiver and one of the node's push slots.
    Push {
        host: Arc<str>,
        handler: Arc<dyn Handler>,
    },
}

impl DoubtfulStart {
    /// The start `b` asked for, when it is one the loop can take up again: a `Run` claim for a
    /// poll, an in-process run or a push call.
    fn of(b: &Pending) -> Option<Self> {
        let ClaimTarget::Run { execution, .. } = &b.claim.target else {
            return None;
        };
        let runner = match (b.hand, &b.run, &b.meta.push_host) {
            (Some(_), _, _) => DoubtfulRunner::Poll,
            (None, Some((handler, _)), None) => DoubtfulRunner::InProcess(handler.clone()),
            (None, Some((handler, _)), Some(host)) => DoubtfulRunner::Push {
                host: host.clone(),
                handler: handler.clone(),
            },
            (None, None, _) => return None,
        };
        Some(DoubtfulStart {
            id: b.key.id,
            execution: *execution,
            queue: b.meta.queue.clone(),
            runner,
        })
    }
}

pub(super) struct Pending {
    key: DueKey,
    meta: Meta,
    pub(super) claim: DueClaim,
    /// When the attempt starts: now, or the due time of a task claimed ahead (for a push call or
    /// a waiting poll).
    starts_at: Timestamp,
    /// For a `Run` claim: the handler resolved for the batch and the queue permit taken for it.
    pub(super) run: Option<(Arc<dyn Handler>, Vec<OwnedSemaphorePermit>)>,
    /// For a `Run` claim made for a waiting poll: which of the turn's [`Hands`].
    hand: Option<usize>,
}

fn intern(names: &mut HashSet<Arc<str>>, s: &str) -> Arc<str> {
    if let Some(a) = names.get(s) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(s);
    names.insert(a.clone());
    a
}

/// A shard loop under supervision: a panic inside a turn replaces the loop by a fresh one that
/// resumes after a backoff (on the engine's clock), instead of ending the shard.
pub(crate) struct Supervised {
    inner: ShardLoop,
    restarts: u64,
    backoff: Duration,
    resume_at: Option<Timestamp>,
}

impl Supervised {
    pub(crate) fn new(inner: ShardLoop) -> Self {
        Supervised {
            inner,
            restarts: 0,
            backoff: FIRST_BACKOFF,
            resume_at: None,
        }
    }

    /// How often this loop was restarted after a panic.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts
    }

    pub(crate) fn starved(&self) -> bool {
        self.resume_at.is_none() && self.inner.starved()
    }

    /// Which permits the last turn left due entries waiting for (none while a restart waits).
    pub(crate) fn starved_of(&self) -> Starved {
        if self.resume_at.is_none() {
            self.inner.starved_of()
        } else {
            Starved::default()
        }
    }

    /// [`ShardLoop::claims_ahead_answered`].
    pub(crate) async fn claims_ahead_answered(&self) -> bool {
        self.inner.claims_ahead_answered().await
    }

    /// [`ShardLoop::turn`], or (while a restart waits for its backoff) the time it resumes.
    pub(crate) async fn turn(&mut self, now: Timestamp) -> Result<Timestamp, LeaseLost> {
        if let Some(at) = self.resume_at {
            if now < at {
                return Ok(at);
            }
            self.resume_at = None;
        }
        match std::panic::AssertUnwindSafe(self.inner.turn(now))
            .catch_unwind()
            .await
        {
            Ok(next) => {
                self.backoff = FIRST_BACKOFF;
                next
            }
            Err(panic) => {
                let shard = self.inner.shard;
                self.restarts += 1;
                let at = now.saturating_add(self.backoff);
                tracing::error!(
                    shard,
                    panic = panic_message(&*panic),
                    restarts = self.restarts,
                    backoff_ms = self.backoff.as_millis() as u64,
                    "shard loop panicked; restarting it after the backoff"
                );
                metrics::counter!("sundial_shard_loop_restarts_total", "shard" => shard.to_string())
                    .increment(1);
                let engine = self.inner.engine.clone();
                let owner = self.inner.owner;
                self.inner = ShardLoop::new(engine.clone(), shard, owner);
                self.backoff = (self.backoff * 2).min(RESTART_BACKOFF_CAP);
                self.resume_at = Some(at);
                engine.shards[shard as usize]
                    .gate
                    .store(at.0, Ordering::Release);
                Ok(at)
            }
        }
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Decrements the gauge when dropped (the loop ended, however it ended).
fn decrement_on_drop(gauge: metrics::Gauge) -> impl Drop {
    struct Decrement(metrics::Gauge);
    impl Drop for Decrement {
        fn drop(&mut self) {
            self.0.decrement(1.0);
        }
    }
    Decrement(gauge)
}

/// The production driver of one shard loop: turns, then sleeps on the engine's clock until the
/// turn's answer, a notification, a released permit (when starved), shutdown, or `stop`. Ends at
/// shutdown, when `stop` turns true, or when the shard's lease is lost.
pub(crate) async fn drive(
    engine: Arc<Engine>,
    shard: u32,
    owner: Owner,
    mut stop: watch::Receiver<bool>,
) {
    let mut stopping = engine.stopping_rx();
    let mut permits = engine.permits_released.subscribe();
    let mut looped = Supervised::new(ShardLoop::new(engine.clone(), shard, owner));
    let signal = &engine.shards[shard as usize];
    // Loops of this shard running here: 1 while this node owns it (an increment, not a set, so a
    // loop ending after its successor started cannot hide the successor).
    let owned = metrics::gauge!("sundial_shard_owned", "shard" => shard.to_string());
    owned.increment(1.0);
    let _owned = decrement_on_drop(owned);
    loop {
        if *stopping.borrow() || *stop.borrow() {
            break;
        }
        let now = engine.clock.now();
        // Releases are marked seen before the turn looks at the permits, never after it: a
        // permit released while the turn runs, after it found a queue full, must wake the loop
        // (marked after, that release was lost, and the entry waited for the next one).
        permits.borrow_and_update();
        let gate = match looped.turn(now).await {
            Ok(gate) => gate,
            Err(LeaseLost) => {
                tracing::warn!(shard, "shard lease lost; this node stops running the shard");
                break;
            }
        };
        let starved = looped.starved();
        if gate <= now && !starved {
            continue;
        }
        let slot_freed = tokio::select! {
            _ = engine.clock.sleep_until(gate) => false,
            _ = signal.wake.notified() => false,
            _ = permits.changed(), if starved => true,
            _ = stopping.changed() => false,
            _ = changed_or_never(&mut stop) => false,
        };
        if slot_freed && let Some(pause) = looped.starved_of().gather_after_release() {
            // A pause, not a due decision: the tokio timer, not the engine clock (push tasks
            // are claimed a lead ahead, so a pause this short does not make their calls late).
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stopping.changed() => {}
                _ = changed_or_never(&mut stop) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loop_starved_of_push_slots_alone_gathers_released_ones() {
        let push = Starved {
            queue: false,
            push: true,
        };
        assert_eq!(push.gather_after_release(), Some(PUSH_SLOT_GATHER));
        for s in [
            Starved::default(),
            Starved {
                queue: true,
                push: false,
            },
            Starved {
                queue: true,
                push: true,
            },
        ] {
            assert_eq!(s.gather_after_release(), None, "{s:?}");
        }
        assert!(PUSH_SLOT_GATHER < crate::Config::default().push_claim_lead / 10);
    }
}
