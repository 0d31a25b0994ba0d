//! The engine: turns persisted due times into handler runs and worker deliveries.
//!
//! This module holds what the parts share: the handlers, the queues (concurrency permits and the
//! pollers' wake-ups), one [`ShardSignal`] per shard (its inbox of notifications, its gate, what
//! its window covers), the exclusive-key waiters, and the [`Placement`] that says where shards run.
//! The parts live in modules of their own:
//!
//! - [`shard`]: the [`shard::ShardLoop`], one per shard run here, whose turn refills the
//!   look-ahead window, claims what is due and answers when to look next; its supervisor and the
//!   thin task that drives it.
//! - [`ahead`]: claims of runs ahead of their due time, which a shard loop sends off without
//!   waiting for them.
//! - [`run`]: in-process handler runs, `complete`, `fail`, exclusive-key hand-over.
//! - [`reaper`]: running attempts whose lease ended.
//! - [`poll`]: the worker protocol (long-poll claims, heartbeats).
//! - [`retention`]: deleting finished tasks, fire records and closed workflow runs past their
//!   retention, in small batches on a task of its own.
//! - [`pause`]: paused queues (held back by the shard loops and pollers) and queues with a
//!   concurrency limit, read from the store.
//! - [`step`]: [`crate::Stepper`], which turns every loop on the caller's clock instead of tasks.
//!
//! Writes that make a task scheduled (create, retry, trigger, lease expiry, a released exclusive
//! key) send the shard a [`DueEntry`] through [`Engine::notify_due`]; if it lies inside what the
//! window covers it goes to the inbox, and if it is earlier than the gate the gate is pulled in.
//! The gate never moves later while an earlier due time is known.
//!
//! This module never decides *whether* a state change is allowed: every change is a conditional
//! update in the store, and a refused one (cancelled meanwhile, already taken) is simply dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::Rng;
use sundial_core::{Clock, Task, TaskState, Timestamp};
use sundial_store::{DueEntry, DueKey, Fence, Store, Wakeup};
use tokio::sync::{Notify, Semaphore, watch};

use crate::cluster::ShardHost;
use crate::config::Config;
use crate::handler::Handler;
pub(crate) use crate::placement::{ClaimError, LeaseLost, Owner, Placement};

mod ahead;
pub(crate) mod handoff;
mod line;
mod looked;
pub(crate) mod pause;
pub(crate) mod poll;
pub(crate) mod reaper;
pub(crate) mod retention;
mod run;
pub(crate) mod seen;
pub(crate) mod shard;
pub(crate) mod step;

/// Shared state of one engine (one per [`crate::Sundial`]).
pub(crate) struct Engine {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    handlers: RwLock<HashMap<String, Arc<dyn Handler>>>,
    /// Runs every task that carries a push target (set by `sundial-push`); without it push
    /// tasks become ready for workers like tasks of a kind with no handler.
    push_handler: RwLock<Option<Arc<dyn Handler>>>,
    /// The node's push call slots (`Config::push_concurrency`).
    push_permits: Arc<Semaphore>,
    /// Per receiver (`host:port`), `Config::push_host_concurrency` slots each.
    push_hosts: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
    queues: Mutex<HashMap<String, Arc<QueueState>>>,
    shards: Vec<ShardSignal>,
    /// Bumped whenever a concurrency permit is released, so starved shards look again.
    permits_released: watch::Sender<u64>,
    /// Tasks waiting for a place: of an exclusive key or group, or of their queue's limit.
    exclusive_waiting: Mutex<HashMap<WaitFor, WaitLine>>,
    /// Bumped by every release of a place (exclusive key, group, limited queue) that found no
    /// waiter to hand it to, and by a raised queue limit. A claim refused for want of a place
    /// compares it with its value from before the claim: a release in between may have freed a
    /// place nobody was handed, so the refused task looks again at once. (A release that woke a
    /// waiter handed its place on; the refused task waits in line.)
    exclusive_releases: AtomicU64,
    reaper: ReaperSignal,
    in_flight: AtomicUsize,
    /// Polls waiting among their queue's hand-off waiters: while there are none, the shard
    /// loops do not wake early for a start ahead (`Config::hand_off_lead`).
    pub(crate) polls_waiting: AtomicUsize,
    /// Runs claimed ahead that wait for their due time before calling their handler (a stepped
    /// test does not wait for those whose time is still ahead: see `step`).
    pub(crate) runs_waiting_due: run::RunsWaitingDue,
    drained: Notify,
    /// Set when shutdown begins: no new work is taken.
    stopping: watch::Sender<bool>,
    /// Set when the shutdown deadline passes: running handlers are interrupted.
    aborting: watch::Sender<bool>,
    started: AtomicBool,
    /// Where shards run: here, all of them, or those this node leases from a cluster.
    pub(crate) placement: Placement,
    /// Queues whose tasks are held back (see [`pause`]).
    pub(crate) paused: pause::PausedQueues,
    /// The workers that polled this node (see [`seen`]).
    pub(crate) seen: seen::SeenWorkers,
}

/// What a start refused for want of a place waits for: a place of an exclusive key or group
/// (`ClaimOutcome::Busy`), or under the queue's concurrency limit (`ClaimOutcome::QueueFull`).
/// The store's type, as a release is also told to the other nodes (`Wakeup::Released`).
pub(crate) use sundial_store::Place as WaitFor;

/// The most waiting pollers one readiness wakes (each takes at least one task; a poller that
/// took a full batch wakes the next).
const POLLERS_WOKEN_AT_ONCE: usize = 64;

/// How many of a line's best-ranked waiters retry on their own every second.
pub(crate) const WAIT_FRONT: usize = 8;

/// The starts waiting for one [`WaitFor`], in line: by rank (the due time moved by the
/// priority), then due key. Registering, finding the front and taking the best are logarithmic,
/// so a line of tens of thousands costs no more per refusal than a short one.
#[derive(Default)]
pub(crate) struct WaitLine {
    line: std::collections::BTreeMap<(i64, DueKey), (u32, DueEntry)>,
    ranks: HashMap<sundial_core::TaskId, (i64, DueKey)>,
}

impl WaitLine {
    /// Registers `entry` of `shard` (once: a refused-again entry keeps its place) and answers
    /// whether it is among the line's [`WAIT_FRONT`] best.
    pub(crate) fn register(&mut self, shard: u32, entry: DueEntry) -> bool {
        let place = (entry.priority.rank(entry.key.due_at), entry.key);
        if self.ranks.insert(entry.key.id, place).is_none() {
            self.line.insert(place, (shard, entry));
        }
        self.line.range(..place).take(WAIT_FRONT).count() < WAIT_FRONT
    }

    /// Takes the best-ranked waiter.
    pub(crate) fn take_best(&mut self) -> Option<(u32, DueEntry)> {
        let (_, (shard, entry)) = self.line.pop_first()?;
        self.ranks.remove(&entry.key.id);
        Some((shard, entry))
    }

    /// Takes a waiter out of line (it started another way: its own retry).
    pub(crate) fn remove(&mut self, id: sundial_core::TaskId) {
        if let Some(place) = self.ranks.remove(&id) {
            self.line.remove(&place);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.line.is_empty()
    }

    /// The rank of the best-ranked waiter.
    pub(crate) fn best_rank(&self) -> Option<i64> {
        self.line.first_key_value().map(|((rank, _), _)| *rank)
    }
}

pub(crate) struct QueueState {
    permits: Arc<Semaphore>,
    /// Pollers that take any kind of the queue wait here. Tasks becoming ready wake *one* of
    /// them (`notify_one`); a poller that took a full batch passes the wake-up on, and one that
    /// is dropped after being woken hands it to the next waiter (tokio's `Notify` does that), so
    /// a batch of ready tasks costs one claim, not one per waiting poller.
    ready: Notify,
    /// Pollers restricted to some kinds wait here and are all woken: a wake-up cannot be aimed
    /// at the poller whose kinds match.
    ready_filtered: Notify,
    /// The best-ranked entry each shard loop holds back for want of a permit, so that a freed
    /// permit goes to the best-ranked waiter of any shard (see [`line`]).
    line: line::Line,
    /// Polls (of any kind) that found nothing and wait to be handed a task a shard loop starts
    /// for them (see [`handoff`]).
    waiters: handoff::Waiters,
    /// Whether the queue was found without ready tasks since anything last made one ready (see
    /// [`looked`]).
    looked: looked::Looked,
}

pub(crate) struct ShardSignal {
    inbox: Mutex<Vec<DueEntry>>,
    wake: Notify,
    /// Entries with a due time at or before this go straight into the window (see `Window`).
    covered_until: AtomicI64,
    /// When the loop's gate will open next.
    gate: AtomicI64,
    /// Whether this process runs the shard's loop (always, on a single node).
    local: AtomicBool,
    /// With several nodes: until when (engine clock) this node's lease on the shard is known to
    /// hold, from its last acquisition or renewal. Past that, `local` may be stale.
    lease_until: AtomicI64,
    /// Set when a queue is resumed: the loop's next turn scans from the front (the queue's due
    /// entries were dropped from the window while it was paused).
    rescan: AtomicBool,
}

struct ReaperSignal {
    wake: Notify,
    gate: AtomicI64,
}

impl Engine {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: Config,
        placement: Placement,
    ) -> Arc<Self> {
        let single = placement.is_single();
        let shards = (0..config.shard_count)
            .map(|_| ShardSignal {
                inbox: Mutex::new(Vec::new()),
                wake: Notify::new(),
                covered_until: AtomicI64::new(i64::MIN),
                gate: AtomicI64::new(i64::MIN),
                local: AtomicBool::new(single),
                lease_until: AtomicI64::new(if single { i64::MAX } else { i64::MIN }),
                rescan: AtomicBool::new(false),
            })
            .collect();
        let push_permits = Arc::new(Semaphore::new(config.push_concurrency));
        Arc::new(Engine {
            store,
            clock,
            config,
            handlers: RwLock::new(HashMap::new()),
            push_handler: RwLock::new(None),
            push_permits,
            push_hosts: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            shards,
            permits_released: watch::channel(0).0,
            exclusive_waiting: Mutex::new(HashMap::new()),
            exclusive_releases: AtomicU64::new(0),
            reaper: ReaperSignal {
                wake: Notify::new(),
                gate: AtomicI64::new(i64::MIN),
            },
            in_flight: AtomicUsize::new(0),
            polls_waiting: AtomicUsize::new(0),
            runs_waiting_due: run::RunsWaitingDue::default(),
            drained: Notify::new(),
            stopping: watch::channel(false).0,
            aborting: watch::channel(false).0,
            started: AtomicBool::new(false),
            placement,
            paused: pause::PausedQueues::default(),
            seen: seen::SeenWorkers::default(),
        })
    }

    pub fn register(&self, kind: String, handler: Arc<dyn Handler>) {
        if let Ok(mut h) = self.handlers.write() {
            h.insert(kind, handler);
        }
    }

    pub fn set_push_handler(&self, handler: Arc<dyn Handler>) {
        if let Ok(mut h) = self.push_handler.write() {
            *h = Some(handler);
        }
    }

    fn push_handler(&self) -> Option<Arc<dyn Handler>> {
        self.push_handler.read().ok().and_then(|h| h.clone())
    }

    pub(crate) fn push_permits(&self) -> Arc<Semaphore> {
        self.push_permits.clone()
    }

    /// Starved shard loops look again: a permit or slot was released, or the line of a queue
    /// (see [`line`]) changed.
    fn wake_starved(&self) {
        self.permits_released
            .send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A push slot taken outside the shard loops was released: loops starved of one look again.
    pub(crate) fn push_slot_released(&self) {
        self.permits_released
            .send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The call slots of one push receiver.
    pub(crate) fn push_host(&self, host: &Arc<str>) -> Arc<Semaphore> {
        let mut hosts = match self.push_hosts.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        hosts
            .entry(host.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.push_host_concurrency)))
            .clone()
    }

    fn handler(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.read().ok().and_then(|h| h.get(kind).cloned())
    }

    fn queue(&self, name: &str) -> Arc<QueueState> {
        let mut queues = match self.queues.lock() {
            Ok(q) => q,
            Err(p) => p.into_inner(),
        };
        queues
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(QueueState {
                    permits: Arc::new(Semaphore::new(self.config.concurrency(name))),
                    ready: Notify::new(),
                    ready_filtered: Notify::new(),
                    line: line::Line::default(),
                    waiters: handoff::Waiters::default(),
                    looked: looked::Looked::default(),
                })
            })
            .clone()
    }

    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Tells the owning shard that a task is (now) scheduled at `entry.key.due_at` (and, through
    /// the placement, other nodes that may run it).
    pub fn notify_due(&self, shard: u32, entry: DueEntry) {
        let Some(s) = self.shards.get(shard as usize) else {
            return;
        };
        let now = self.clock.now();
        let publish_horizon = now
            .saturating_add(self.config.idle_interval)
            .saturating_add(self.config.lookahead);
        let local = self.placement.due_written(
            shard,
            &entry,
            s.local.load(Ordering::Acquire),
            s.lease_until.load(Ordering::Acquire),
            now,
            publish_horizon,
        );
        if local {
            self.notify_local(shard, entry);
        }
    }

    /// A wake-up for a shard this process runs (ignored when it does not run it).
    pub(crate) fn notify_local(&self, shard: u32, entry: DueEntry) {
        let Some(s) = self.shards.get(shard as usize) else {
            return;
        };
        if !s.local.load(Ordering::Acquire) {
            return;
        }
        let due = entry.key.due_at.0;
        if due <= s.covered_until.load(Ordering::Acquire) {
            if let Ok(mut inbox) = s.inbox.lock() {
                inbox.push(entry);
            }
            s.wake.notify_one();
        } else if due < s.gate.load(Ordering::Acquire) {
            // Beyond what the window covers, but earlier than the gate: pull the gate in.
            s.wake.notify_one();
        }
    }

    pub fn notify_task(&self, task: &Task) {
        match task.state {
            TaskState::Scheduled => self.notify_due(
                task.shard,
                DueEntry {
                    key: DueKey {
                        due_at: task.due_at,
                        id: task.id,
                    },
                    queue: task.queue.clone(),
                    kind: task.kind.clone(),
                    timeout_ms: task.timeout_ms,
                    push_host: task
                        .target
                        .as_ref()
                        .and_then(|t| sundial_core::authority(&t.url)),
                    priority: task.priority,
                },
            ),
            TaskState::Ready => self.ready_changed(&task.queue),
            _ => {}
        }
    }

    /// Tasks of `queue` became ready: wake pollers here and (through the placement) on other
    /// nodes.
    pub(crate) fn ready_changed(&self, queue: &str) {
        self.ready_changed_by(queue, 1);
    }

    /// `n` tasks of `queue` became ready: wake up to `n` waiting pollers here, so they claim side
    /// by side rather than one after another, and (through the placement) pollers on other
    /// nodes.
    pub(crate) fn ready_changed_by(&self, queue: &str, n: usize) {
        self.wake_pollers(queue, n);
        self.placement.ready_written(queue);
    }

    /// Wakes up to `n` (at most [`POLLERS_WOKEN_AT_ONCE`]) waiting pollers of `queue` that take
    /// any kind (each passes the wake-up on when it took a full batch) and every poller
    /// restricted to some kinds.
    pub(crate) fn wake_pollers(&self, queue: &str, n: usize) {
        let q = self.queue(queue);
        q.looked.changed();
        // Each call wakes one waiting poller; with none waiting, the first leaves a permit for
        // the next to wait and the rest do nothing.
        for _ in 0..n.clamp(1, POLLERS_WOKEN_AT_ONCE) {
            q.ready.notify_one();
        }
        q.ready_filtered.notify_waiters();
    }

    /// Claims due tasks as `owner`, through the placement.
    pub(crate) async fn claim(
        &self,
        owner: Owner,
        claims: Vec<sundial_store::DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<sundial_store::ClaimOutcome>, ClaimError> {
        self.placement.claim(&self.store, owner, claims, now).await
    }

    pub(crate) fn stopping_rx(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Starts the shard loops and the reaper (on several nodes, the membership loop that decides
    /// which shard loops run here). Idempotent; refused (empty) once a [`crate::Stepper`] took
    /// the loops.
    pub fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        if self.started.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        let mut tasks = Vec::new();
        // Every node reports every shard (0 here; a running shard loop adds 1), so that
        // `max by (shard)` over the nodes reads 0 for a shard no node runs.
        for shard in 0..self.shards.len() {
            metrics::gauge!("sundial_shard_owned", "shard" => shard.to_string()).set(0.0);
        }
        crate::series::register_engine_metrics(self.shards.len());
        crate::series::register_queue_metrics(sundial_core::TaskSpec::DEFAULT_QUEUE);
        match &self.placement {
            Placement::Cluster(node) => {
                let host: Arc<dyn ShardHost> = self.clone();
                tasks.extend(crate::cluster::start(node.clone(), host));
            }
            Placement::Single => {
                let (_keep, stop) = watch::channel(false);
                for shard in 0..self.shards.len() as u32 {
                    // Each loop holds a receiver; the sender may go: `changed()` then reports an
                    // error, which the loops treat as "never".
                    tasks.push(tokio::spawn(shard::drive(
                        self.clone(),
                        shard,
                        Owner::Sole,
                        stop.clone(),
                    )));
                }
            }
        }
        tasks.push(tokio::spawn(reaper::drive(self.clone())));
        tasks.push(tokio::spawn(pause::drive(self.clone())));
        tasks
    }

    /// Marks the engine started without spawning anything: the caller turns the loops itself.
    /// Answers `false` when it was already started.
    pub(crate) fn take_loops(&self) -> bool {
        !self.started.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn idle_deadline(&self, now: Timestamp) -> Timestamp {
        let idle = self.config.idle_interval.as_millis() as f64;
        let cut = rand::rng().random_range(0.0..0.1) * idle;
        Timestamp(now.0 + (idle - cut).max(1.0) as i64)
    }

    /// Waits until no handler is running or `deadline` passes; then interrupts the rest.
    pub async fn drain(&self, deadline: Duration) {
        let until = self.clock.now().saturating_add(deadline);
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = self.clock.sleep_until(until) => break,
            }
        }
        self.aborting.send_replace(true);
        // Interrupted runs record their interruption quickly; give them a moment (real time: this
        // bounds how long a process takes to exit, it decides nothing about tasks).
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let notified = self.drained.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }

    pub fn begin_stop(&self) {
        self.stopping.send_replace(true);
        for q in self
            .queues
            .lock()
            .map(|q| q.values().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            q.ready.notify_waiters();
            q.ready_filtered.notify_waiters();
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// Completes when the value changes; never, if the sender is gone.
async fn changed_or_never(rx: &mut watch::Receiver<bool>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn wait_true(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl ShardHost for Engine {
    fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
    fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }
    fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }
    fn queue_names(&self) -> Vec<String> {
        self.queues
            .lock()
            .map(|q| q.keys().cloned().collect())
            .unwrap_or_default()
    }
    fn run_shard(
        self: Arc<Self>,
        shard: u32,
        fence: Fence,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        if let Some(s) = self.shards.get(shard as usize) {
            s.local.store(true, Ordering::Release);
        }
        // Attempts of the shard's previous owner may have passed their leases already.
        self.reaper.wake.notify_one();
        tokio::spawn(shard::drive(self, shard, Owner::Fenced(fence), stop))
    }
    fn shard_left(&self, shard: u32) {
        if let Some(s) = self.shards.get(shard as usize) {
            s.local.store(false, Ordering::Release);
            s.covered_until.store(i64::MIN, Ordering::Release);
            if let Ok(mut inbox) = s.inbox.lock() {
                inbox.clear();
            }
        }
    }
    fn set_lease_until(&self, shard: u32, until: Timestamp) {
        if let Some(s) = self.shards.get(shard as usize) {
            s.lease_until.store(until.0, Ordering::Release);
        }
    }
    fn deliver(&self, wakeup: Wakeup) {
        match wakeup {
            Wakeup::Due { shard, entry } => self.notify_local(shard, entry),
            Wakeup::Ready { queue } => self.wake_pollers(&queue, 1),
            Wakeup::Released { place, handed } => self.released_elsewhere(&place, handed),
            // Handled by the membership loop (the subscriber hands it there).
            Wakeup::Membership => {}
        }
    }
}
