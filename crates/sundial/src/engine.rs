//! The engine: turns persisted due times into handler runs and worker deliveries.
//!
//! One *shard loop* per shard owns that shard's [`Window`] and its *gate*: a single resettable
//! alarm (a [`Clock::sleep_until`] re-armed each turn) set to the earliest moment worth looking at:
//! the first entry in the window, the next refill of the look-ahead, or the idle backstop. Writes
//! that make a task scheduled (create, retry, trigger, lease expiry, a released exclusive key) send
//! the shard a [`DueEntry`] through [`Engine::notify_due`]; if it lies inside what the window covers
//! it is added at once, and if it is earlier than the gate the gate is pulled in. The gate never
//! moves later while an earlier due time is known.
//!
//! A turn of the loop: take notifications; refill the window from the store when the look-ahead
//! has moved past the cursor (one range scan, bounded by the window's room); take what is due
//! (`due_at <= now` on the engine's clock) and claim it in one batch. A claimed task either starts
//! on an in-process handler (when one is registered for its kind and its queue has a free
//! concurrency permit) or becomes `ready` for workers that poll its queue.
//!
//! When the window is empty the loop asks the store for the single earliest due time after the
//! cursor and sleeps until that minus the look-ahead, or until the backstop when there is none.
//! The backstop comes once every idle interval (with jitter), busy or not: the next refill then
//! starts from the front of the shard, which finds any task a notification failed to announce
//! (between nodes, wake-ups are best effort).
//!
//! This module never decides *whether* a state change is allowed: every change is a conditional
//! update in the store, and a refused one (cancelled meanwhile, already taken) is simply dropped.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::FutureExt;
use rand::Rng;
use sundial_core::{Clock, ExecutionId, Task, TaskId, TaskState, Timestamp};
use sundial_store::{
    ClaimOutcome, ClaimTarget, DueClaim, DueEntry, DueKey, Fence, ReadyClaim, Store, StoreError,
    Wakeup,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

use crate::Error;
use crate::cluster::ClusterNode;
use crate::config::Config;
use crate::handler::{Handler, HandlerError, TaskContext};
use crate::window::{Meta, Window};

/// Shared state of one engine (one per [`crate::Sundial`]).
pub(crate) struct Engine {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    handlers: RwLock<HashMap<String, Arc<dyn Handler>>>,
    queues: Mutex<HashMap<String, Arc<QueueState>>>,
    shards: Vec<ShardSignal>,
    /// Bumped whenever a concurrency permit is released, so starved shards look again.
    permits_released: watch::Sender<u64>,
    /// Tasks waiting for an exclusive key, by key.
    exclusive_waiting: Mutex<HashMap<String, Vec<(u32, DueEntry)>>>,
    /// Bumped by every release of an exclusive key, before its waiters are taken. A claim refused
    /// as busy compares it with its value from before the claim: a release in between may have
    /// found no waiter to wake, so the refused task looks again at once.
    exclusive_releases: AtomicU64,
    reaper: ReaperSignal,
    in_flight: AtomicUsize,
    drained: Notify,
    /// Set when shutdown begins: no new work is taken.
    stopping: watch::Sender<bool>,
    /// Set when the shutdown deadline passes: running handlers are interrupted.
    aborting: watch::Sender<bool>,
    started: AtomicBool,
    /// Set when several nodes share the store: this node's membership and shard leases.
    pub(crate) cluster: Option<ClusterNode>,
}

struct QueueState {
    permits: Arc<Semaphore>,
    /// Pollers that take any kind of the queue wait here. Tasks becoming ready wake *one* of
    /// them (`notify_one`); a poller that took a full batch passes the wake-up on, and one that
    /// is dropped after being woken hands it to the next waiter (tokio's `Notify` does that), so
    /// a batch of ready tasks costs one claim, not one per waiting poller.
    ready: Notify,
    /// Pollers restricted to some kinds wait here and are all woken: a wake-up cannot be aimed
    /// at the poller whose kinds match.
    ready_filtered: Notify,
}

struct ShardSignal {
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
        cluster: Option<ClusterNode>,
    ) -> Arc<Self> {
        let single = cluster.is_none();
        let shards = (0..config.shard_count.max(1))
            .map(|_| ShardSignal {
                inbox: Mutex::new(Vec::new()),
                wake: Notify::new(),
                covered_until: AtomicI64::new(i64::MIN),
                gate: AtomicI64::new(i64::MIN),
                local: AtomicBool::new(single),
                lease_until: AtomicI64::new(if single { i64::MAX } else { i64::MIN }),
            })
            .collect();
        Arc::new(Engine {
            store,
            clock,
            config,
            handlers: RwLock::new(HashMap::new()),
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
            drained: Notify::new(),
            stopping: watch::channel(false).0,
            aborting: watch::channel(false).0,
            started: AtomicBool::new(false),
            cluster,
        })
    }

    pub fn register(&self, kind: String, handler: Arc<dyn Handler>) {
        if let Ok(mut h) = self.handlers.write() {
            h.insert(kind, handler);
        }
    }

    fn handler(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.read().ok().and_then(|h| h.get(kind).cloned())
    }

    fn has_handler(&self, kind: &str) -> bool {
        self.handlers
            .read()
            .map(|h| h.contains_key(kind))
            .unwrap_or(false)
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
                })
            })
            .clone()
    }

    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Tells the owning shard that a task is (now) scheduled at `entry.key.due_at`.
    pub fn notify_due(&self, shard: u32, entry: DueEntry) {
        let Some(s) = self.shards.get(shard as usize) else {
            return;
        };
        // A task due later than the owner's next backstop rescan plus its look-ahead needs no
        // wake-up: that rescan (from the front of the shard, at most one idle interval away)
        // finds it before it is due, and a shard's next owner scans it from the front anyway.
        let far = self
            .clock
            .now()
            .saturating_add(self.config.idle_interval)
            .saturating_add(self.config.lookahead);
        let worth_publishing = entry.key.due_at <= far;
        if !s.local.load(Ordering::Acquire) {
            if let Some(c) = &self.cluster
                && worth_publishing
            {
                c.publish(Wakeup::Due { shard, entry });
            }
            return;
        }
        if let Some(c) = &self.cluster {
            // This node runs the shard as far as it knows. That knowledge is only as good as its
            // lease: once the lease may have ended (this process was paused, or its renewals
            // failed), another node may have taken the shard without this one having noticed
            // yet, and its own loop can no longer claim anything there. Tell the others too, so
            // the real owner hears of the task now rather than at its idle backstop (a duplicate
            // is harmless). While the lease holds with a margin (a third of the TTL, far beyond
            // the nodes' clock differences), no other node can have acquired the shard, so any
            // later owner acquires after this task was committed and finds it by its first scan.
            let margin = (c.lease_ttl.as_millis() / 3) as i64;
            let until = s.lease_until.load(Ordering::Acquire);
            if worth_publishing && self.clock.now().0 >= until.saturating_sub(margin) {
                c.publish(Wakeup::Due {
                    shard,
                    entry: entry.clone(),
                });
            }
        }
        self.notify_local(shard, entry);
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
                },
            ),
            TaskState::Ready => self.ready_changed(&task.queue),
            _ => {}
        }
    }

    /// Tasks of `queue` became ready: wake pollers here and on other nodes (when there are
    /// others: a node that found itself alone at its last heartbeat publishes nothing, and
    /// announces every queue it knows once its next heartbeat, a third of the lease TTL later,
    /// finds another node).
    pub(crate) fn ready_changed(&self, queue: &str) {
        self.wake_pollers(queue);
        if let Some(c) = &self.cluster
            && !c.is_alone()
        {
            c.publish(Wakeup::Ready {
                queue: queue.to_string(),
            });
        }
    }

    /// Wakes one waiting poller of `queue` that takes any kind (it passes the wake-up on when
    /// it took a full batch) and every poller restricted to some kinds.
    pub(crate) fn wake_pollers(&self, queue: &str) {
        let q = self.queue(queue);
        q.ready.notify_one();
        q.ready_filtered.notify_waiters();
    }

    /// The queues this engine has seen (polled, readied or run).
    pub(crate) fn queue_names(&self) -> Vec<String> {
        self.queues
            .lock()
            .map(|q| q.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Records that this node's lease on `shard` holds until `until` (cluster mode).
    pub(crate) fn set_lease_until(&self, shard: u32, until: Timestamp) {
        if let Some(s) = self.shards.get(shard as usize) {
            s.lease_until.store(until.0, Ordering::Release);
        }
    }

    /// Marks whether this process runs `shard`'s loop (cluster mode).
    pub(crate) fn set_local(&self, shard: u32, local: bool) {
        if let Some(s) = self.shards.get(shard as usize) {
            s.local.store(local, Ordering::Release);
            if !local {
                s.covered_until.store(i64::MIN, Ordering::Release);
                if let Ok(mut inbox) = s.inbox.lock() {
                    inbox.clear();
                }
            }
        }
    }

    pub(crate) fn stopping_rx(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Starts shard loops and the reaper (and, with several nodes, the membership loop that
    /// decides which shard loops run here). Idempotent.
    pub fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        if self.started.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        let mut tasks = Vec::new();
        if self.cluster.is_some() {
            tasks.extend(crate::cluster::start(self.clone()));
        } else {
            let (_keep, stop) = watch::channel(false);
            for shard in 0..self.shards.len() as u32 {
                let engine = self.clone();
                let stop = stop.clone();
                tasks.push(tokio::spawn(async move {
                    engine.shard_loop(shard, None, stop).await
                }));
            }
            // Each loop holds a receiver; the sender may go: `changed()` then reports an error,
            // which the loops treat as "never".
        }
        let engine = self.clone();
        tasks.push(tokio::spawn(async move { engine.reaper_loop().await }));
        tasks
    }

    fn idle_deadline(&self, now: Timestamp) -> Timestamp {
        let idle = self.config.idle_interval.as_millis() as f64;
        let cut = rand::rng().random_range(0.0..0.1) * idle;
        Timestamp(now.0 + (idle - cut).max(1.0) as i64)
    }

    /// Runs one shard until shutdown, until `stop` turns true, or (with a fence) until the shard's
    /// lease is lost.
    pub(crate) async fn shard_loop(
        self: Arc<Self>,
        shard: u32,
        fence: Option<Fence>,
        mut stop: watch::Receiver<bool>,
    ) {
        let signal = &self.shards[shard as usize];
        let mut window = Window::new(self.config.window_capacity);
        let mut names: HashSet<Arc<str>> = HashSet::new();
        let mut intern = move |s: &str| -> Arc<str> {
            if let Some(a) = names.get(s) {
                return a.clone();
            }
            let a: Arc<str> = Arc::from(s);
            names.insert(a.clone());
            a
        };
        let mut stopping = self.stopping.subscribe();
        let mut permits = self.permits_released.subscribe();
        let lookahead = self.config.lookahead;
        let shard_label = shard.to_string();
        let mut backoff = Duration::from_millis(50);
        // The backstop: once every idle interval (with jitter) the next refill starts from the
        // front of the shard and so finds any task whose notification was lost (between nodes,
        // wake-ups are best effort). It runs whether or not the window is empty: a steady load
        // keeps the window busy and would otherwise hide such a task behind the cursor for as
        // long as the load lasts.
        let mut rescan_at = self.idle_deadline(self.clock.now());

        loop {
            if *stopping.borrow() || *stop.borrow() {
                break;
            }
            // While the loop is busy, any notification must wake it again: the gate it is about
            // to arm may be computed from reads that missed the notified write.
            signal.gate.store(i64::MAX, Ordering::Release);
            // 1. Notifications.
            let inbox: Vec<DueEntry> = signal
                .inbox
                .lock()
                .map(|mut v| std::mem::take(&mut *v))
                .unwrap_or_default();
            for e in inbox {
                window.insert(e.key, meta_of(&e, &mut intern));
            }

            // 2. Refill the look-ahead (from the front of the shard when the backstop is due).
            let now = self.clock.now();
            if now >= rescan_at {
                window.reset_cursor();
                signal.covered_until.store(i64::MIN, Ordering::Release);
                rescan_at = self.idle_deadline(now);
            }
            let horizon = now.saturating_add(lookahead);
            if window.needs_refill(now, lookahead) {
                let limit = window.room();
                // Writes that commit while the scan runs may be missing from its snapshot: route
                // their notifications into the inbox, which is read after the scan.
                signal.covered_until.store(horizon.0, Ordering::Release);
                metrics::counter!("sundial_store_scans_total", "shard" => shard_label.clone())
                    .increment(1);
                match self
                    .store
                    .scan_due(shard, window.cursor(), horizon, limit)
                    .await
                {
                    Ok(rows) => {
                        window.absorb_scan(rows, horizon, limit, &mut intern);
                        backoff = Duration::from_millis(50);
                    }
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "scan failed; retrying");
                        self.pause(backoff, &mut stopping).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
                let covered = window.cursor().map_or(i64::MIN, |c| c.due_at.0);
                signal.covered_until.store(covered, Ordering::Release);
            }
            // Anything that arrived while scanning.
            let late: Vec<DueEntry> = signal
                .inbox
                .lock()
                .map(|mut v| std::mem::take(&mut *v))
                .unwrap_or_default();
            for e in late {
                window.insert(e.key, meta_of(&e, &mut intern));
            }

            // 3. Fire what is due.
            let now = self.clock.now();
            let (starved, lost) = self.fire_due(shard, fence, &mut window, now).await;
            if lost {
                tracing::warn!(shard, "shard lease lost; this node stops running the shard");
                break;
            }
            metrics::gauge!("sundial_window_size", "shard" => shard_label.clone())
                .set(window.len() as f64);

            // 4. Arm the gate: the earliest entry, the next refill, or the idle backstop.
            let now = self.clock.now();
            let first = if starved {
                window.first_due_after(now)
            } else {
                window.first_due()
            };
            let mut gate = first.unwrap_or(Timestamp::MAX);
            if window.is_empty() {
                match self.store.next_due(shard, window.cursor()).await {
                    Ok(Some(t))
                        if Timestamp(t.0.saturating_sub(lookahead.as_millis() as i64))
                            < rescan_at =>
                    {
                        gate = Timestamp(t.0 - lookahead.as_millis() as i64).max(now);
                    }
                    Ok(_) => gate = rescan_at,
                    Err(e) => {
                        tracing::warn!(shard, error = %e, "next_due failed");
                        gate = now.saturating_add(Duration::from_secs(1));
                    }
                }
            } else if let Some(refill) = window.refill_at(lookahead) {
                gate = gate.min(refill.max(Timestamp(now.0 + 1)));
            }
            gate = gate.min(rescan_at);
            signal.gate.store(gate.0, Ordering::Release);
            if gate <= now && !starved {
                continue;
            }
            permits.borrow_and_update();
            let sleep = self.clock.sleep_until(gate);
            tokio::select! {
                _ = sleep => {}
                _ = signal.wake.notified() => {}
                _ = permits.changed(), if starved => {}
                _ = stopping.changed() => {}
                _ = changed_or_never(&mut stop) => {}
            }
        }
    }

    async fn pause(&self, d: Duration, stopping: &mut watch::Receiver<bool>) {
        let deadline = self.clock.now().saturating_add(d);
        tokio::select! {
            _ = self.clock.sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
    }

    /// Claims and dispatches every due entry it can. Returns whether some due entries had to stay
    /// because their queue had no free concurrency permit, and whether the shard's lease was lost.
    async fn fire_due(
        self: &Arc<Self>,
        shard: u32,
        fence: Option<Fence>,
        window: &mut Window,
        now: Timestamp,
    ) -> (bool, bool) {
        let mut starved = false;
        let mut starved_queues: HashSet<Arc<str>> = HashSet::new();
        let mut batch: Vec<(DueKey, Meta, DueClaim, Option<OwnedSemaphorePermit>)> = Vec::new();
        // Bounded walk: entries of starved queues are skipped, but not without limit.
        for (key, meta) in window
            .due(now)
            .take(self.config.claim_batch.saturating_mul(4))
        {
            if batch.len() >= self.config.claim_batch {
                break;
            }
            if starved_queues.contains(&meta.queue) {
                continue;
            }
            if self.has_handler(&meta.kind) {
                let q = self.queue(&meta.queue);
                match q.permits.clone().try_acquire_owned() {
                    Ok(p) => {
                        let execution = ExecutionId(uuid::Uuid::now_v7());
                        batch.push((
                            *key,
                            meta.clone(),
                            DueClaim {
                                id: key.id,
                                target: ClaimTarget::Run {
                                    execution,
                                    lease_until: now
                                        .saturating_add(Duration::from_millis(meta.timeout_ms))
                                        .saturating_add(self.config.lease_grace),
                                },
                            },
                            Some(p),
                        ));
                    }
                    Err(_) => {
                        starved = true;
                        starved_queues.insert(meta.queue.clone());
                    }
                }
            } else {
                batch.push((
                    *key,
                    meta.clone(),
                    DueClaim {
                        id: key.id,
                        target: ClaimTarget::Ready,
                    },
                    None,
                ));
            }
        }
        if batch.is_empty() {
            return (starved, false);
        }
        let claims: Vec<DueClaim> = batch.iter().map(|b| b.2).collect();
        for (key, ..) in &batch {
            window.remove(key);
        }
        let releases_before = self.exclusive_releases.load(Ordering::SeqCst);
        let claimed = match (fence, &self.cluster) {
            (Some(f), Some(c)) => c.cluster.claim_due_fenced(f, claims, now).await,
            _ => self.store.claim_due(claims, now).await,
        };
        let outcomes = match claimed {
            Ok(o) => o,
            Err(StoreError::LeaseLost { .. }) => return (starved, true),
            Err(e) => {
                tracing::warn!(error = %e, "claim failed; entries stay in the window");
                for (key, meta, ..) in batch {
                    window.insert(key, meta);
                }
                return (starved, false);
            }
        };
        let mut readied_queues: HashSet<Arc<str>> = HashSet::new();
        for ((key, meta, _claim, permit), outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                ClaimOutcome::Started(task) => {
                    if let Some(until) = task.lease_expires_at {
                        self.lease_granted(until);
                    }
                    if let Some(p) = permit {
                        self.spawn_run(*task, p);
                    }
                }
                ClaimOutcome::Readied(task) => {
                    metrics::histogram!("sundial_fire_lateness_seconds", "queue" => task.queue.clone(), "target" => "ready")
                        .record(now.since(task.due_at).as_secs_f64());
                    readied_queues.insert(meta.queue.clone());
                }
                ClaimOutcome::Busy { exclusive_key } => {
                    let entry = DueEntry {
                        key,
                        queue: meta.queue.to_string(),
                        kind: meta.kind.to_string(),
                        timeout_ms: meta.timeout_ms,
                    };
                    if let Ok(mut w) = self.exclusive_waiting.lock() {
                        w.entry(exclusive_key).or_default().push((shard, entry));
                    }
                    // A release since the claim began may have missed this waiter: look again
                    // now. Otherwise the release wakes it; the 1 s retry is a backstop only.
                    let released =
                        self.exclusive_releases.load(Ordering::SeqCst) != releases_before;
                    let retry = DueKey {
                        due_at: if released {
                            now
                        } else {
                            now.saturating_add(Duration::from_secs(1))
                        },
                        id: key.id,
                    };
                    window.insert(retry, meta);
                }
                ClaimOutcome::Skipped(task) => {
                    tracing::debug!(id = %task.id, "skipped: exclusive key busy");
                }
                ClaimOutcome::NotClaimable => {}
            }
        }
        for q in readied_queues {
            self.ready_changed(&q);
        }
        (starved, false)
    }

    fn spawn_run(self: &Arc<Self>, task: Task, permit: OwnedSemaphorePermit) {
        let Some(execution) = task.execution_id else {
            return;
        };
        let Some(handler) = self.handler(&task.kind) else {
            return;
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        tokio::spawn(async move {
            let started = engine.clock.now();
            metrics::histogram!("sundial_fire_lateness_seconds", "queue" => task.queue.clone(), "target" => "handler")
                .record(started.since(task.due_at).as_secs_f64());
            let deadline = started.saturating_add(task.timeout());
            let ctx = TaskContext {
                task: task.clone(),
                execution_id: execution,
            };
            let mut aborting = engine.aborting.subscribe();
            let run = std::panic::AssertUnwindSafe(handler.call(ctx)).catch_unwind();
            let outcome: Result<Option<serde_json::Value>, HandlerError> = tokio::select! {
                r = run => match r {
                    Ok(r) => r,
                    Err(_) => Err(HandlerError::retryable("handler panicked")),
                },
                _ = engine.clock.sleep_until(deadline) => Err(HandlerError::retryable(format!(
                    "timed out after {}ms", task.timeout_ms
                ))),
                _ = wait_true(&mut aborting) => Err(HandlerError::retryable("interrupted by shutdown")),
            };
            let finished = engine.clock.now();
            metrics::histogram!("sundial_task_duration_seconds", "kind" => task.kind.clone())
                .record(finished.since(started).as_secs_f64());
            let interrupted = *engine.aborting.borrow();
            // The concurrency limit bounds handler runs, not the bookkeeping after them: hand the
            // permit on before recording the result. Holding it through that write would tie
            // fire throughput to write latency (at most `permits / write latency` tasks a second,
            // which a busy disk or CPU pushes below the due rate, so lateness snowballs).
            drop(permit);
            engine
                .permits_released
                .send_modify(|v| *v = v.wrapping_add(1));
            let res = match outcome {
                Ok(result) => engine
                    .complete(task.id, execution, result)
                    .await
                    .map(|_| ()),
                Err(e) => engine
                    .fail(&task, execution, e.message, e.retryable, interrupted)
                    .await
                    .map(|_| ()),
            };
            if let Err(e) = res {
                tracing::debug!(id = %task.id, error = %e, "result not recorded");
            }
            if engine.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                engine.drained.notify_waiters();
            }
        });
    }

    /// Records success of an attempt (in-process or remote).
    pub async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        result: Option<serde_json::Value>,
    ) -> Result<Task, Error> {
        let result = result.map(|v| v.to_string());
        let now = self.clock.now();
        let t = self.store.complete(id, execution, now, result).await?;
        self.release_exclusive(&t);
        Ok(t)
    }

    /// Records failure of an attempt: retry with backoff while attempts remain and the error is
    /// retryable, else `dead`. `immediate` retries at once (shutdown interrupted the attempt).
    pub async fn fail(
        &self,
        task: &Task,
        execution: ExecutionId,
        error: String,
        retryable: bool,
        immediate: bool,
    ) -> Result<Task, Error> {
        let now = self.clock.now();
        let retry_at = if retryable && task.attempt < task.max_attempts {
            if immediate {
                Some(now)
            } else {
                let r: f64 = rand::rng().random();
                Some(now.saturating_add(task.backoff.delay(task.attempt, r)))
            }
        } else {
            None
        };
        let t = self
            .store
            .fail(task.id, execution, now, error, retry_at)
            .await?;
        match t.state {
            TaskState::Dead => {
                metrics::counter!("sundial_tasks_dead_total", "kind" => t.kind.clone()).increment(1)
            }
            _ => {
                metrics::counter!("sundial_task_retries_total", "kind" => t.kind.clone(), "attempt" => t.attempt.to_string())
                    .increment(1)
            }
        }
        metrics::counter!("sundial_task_failures_total", "kind" => t.kind.clone(), "attempt" => t.attempt.to_string())
            .increment(1);
        self.notify_task(&t);
        self.release_exclusive(&t);
        Ok(t)
    }

    /// A task holding an exclusive key stopped running: wake the tasks waiting for that key.
    pub fn release_exclusive(&self, task: &Task) {
        let Some(ex) = &task.exclusive else {
            return;
        };
        self.exclusive_releases.fetch_add(1, Ordering::SeqCst);
        let waiting = self
            .exclusive_waiting
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&ex.key))
            .unwrap_or_default();
        for (shard, e) in waiting {
            if let Some(s) = self.shards.get(shard as usize) {
                if let Ok(mut inbox) = s.inbox.lock() {
                    inbox.push(e);
                }
                s.wake.notify_one();
            }
        }
    }

    async fn reaper_loop(self: Arc<Self>) {
        let mut stopping = self.stopping.subscribe();
        loop {
            if *stopping.borrow() {
                break;
            }
            // As in the shard loop: while busy, any new lease must wake the reaper again.
            self.reaper.gate.store(i64::MAX, Ordering::Release);
            let now = self.clock.now();
            let expired = match &self.cluster {
                Some(c) => c.expire_owned(now, 1_000).await,
                None => self.store.expire_leases(now, 1_000).await,
            };
            match expired {
                Ok(expired) => {
                    for t in &expired {
                        metrics::counter!("sundial_lease_expiries_total", "queue" => t.queue.clone())
                            .increment(1);
                        tracing::info!(id = %t.id, state = %t.state, "lease expired");
                        self.notify_task(t);
                        self.release_exclusive(t);
                    }
                    if expired.len() == 1_000 {
                        continue;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "lease expiry failed"),
            }
            let mut gate = self.idle_deadline(now);
            let next = match &self.cluster {
                Some(c) => c.next_owned_lease_expiry().await,
                None => self.store.next_lease_expiry().await,
            };
            if let Ok(Some(t)) = next {
                gate = gate.min(Timestamp(t.0 + 1));
            }
            self.reaper.gate.store(gate.0, Ordering::Release);
            tokio::select! {
                _ = self.clock.sleep_until(gate) => {}
                _ = self.reaper.wake.notified() => {}
                _ = stopping.changed() => {}
            }
        }
    }

    /// A lease was granted until `until`: make sure the reaper looks by then.
    fn lease_granted(&self, until: Timestamp) {
        if until.0 < self.reaper.gate.load(Ordering::Acquire) {
            self.reaper.wake.notify_one();
        }
    }

    // ---- Worker protocol -------------------------------------------------------------------

    /// Waits up to `wait` for ready tasks of `queue` and claims up to `max` of them.
    pub async fn poll(
        &self,
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
        let deadline = start.saturating_add(wait);
        let mut stopping = self.stopping.subscribe();
        let ready = if kinds.is_some() {
            &q.ready_filtered
        } else {
            &q.ready
        };
        loop {
            // Register interest before looking, so a task readied in between is not missed.
            let notified = ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = self.clock.now();
            let claim = ReadyClaim {
                queue: queue.to_string(),
                kinds: kinds.clone(),
                execution_ids: (0..max)
                    .map(|_| ExecutionId(uuid::Uuid::now_v7()))
                    .collect(),
                worker: worker.clone(),
                now,
            };
            let tasks = self.claim_ready(claim).await?;
            if tasks.len() >= max && kinds.is_none() {
                // A full batch: more may be ready; the next waiting poller looks.
                q.ready.notify_one();
            }
            if !tasks.is_empty() {
                metrics::histogram!("sundial_poll_wait_seconds", "queue" => queue.to_string())
                    .record(now.since(start).as_secs_f64());
                return Ok(tasks);
            }
            if now >= deadline || self.is_stopping() {
                return Ok(Vec::new());
            }
            tokio::select! {
                _ = notified => {}
                _ = self.clock.sleep_until(deadline) => {}
                _ = stopping.changed() => {}
            }
        }
    }

    async fn claim_ready(&self, claim: ReadyClaim) -> Result<Vec<Task>, Error> {
        let tasks = self.store.claim_ready(claim).await?;
        for t in &tasks {
            if let Some(until) = t.lease_expires_at {
                self.lease_granted(until);
            }
            if let Some(s) = t.started_at {
                metrics::histogram!("sundial_dispatch_wait_seconds", "queue" => t.queue.clone())
                    .record(s.since(t.due_at).as_secs_f64());
            }
        }
        Ok(tasks)
    }

    pub async fn heartbeat(&self, id: TaskId, execution: ExecutionId) -> Result<Task, Error> {
        let now = self.clock.now();
        let task = self.store.get(id).await?.ok_or(Error::NotFound)?;
        let until = now.saturating_add(task.timeout());
        let t = self.store.heartbeat(id, execution, now, until).await?;
        Ok(t)
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

fn meta_of(e: &DueEntry, intern: &mut impl FnMut(&str) -> Arc<str>) -> Meta {
    Meta {
        queue: intern(&e.queue),
        kind: intern(&e.kind),
        timeout_ms: e.timeout_ms,
    }
}
