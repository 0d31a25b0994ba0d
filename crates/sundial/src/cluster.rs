//! The node side of several nodes sharing one store (see `sundial_store::Cluster` for the
//! protocol and ARCHITECTURE.md, "Several nodes").
//!
//! A node runs three background loops besides the engine's reaper:
//!
//! - **membership**: every third of the shard-lease TTL it heartbeats, reads the live nodes,
//!   computes which shards rendezvous hashing gives it, releases the shards it should no longer
//!   own (stopping their loops first), and acquires or renews the ones it should (starting a shard
//!   loop, with the lease's fence, for each newly acquired one). A renewal that fails means the
//!   shard was lost: its loop stops. On shutdown it releases everything and leaves, so the others
//!   take over without waiting for the TTL.
//! - **publisher**: batches this node's wake-ups (a due time for a shard run elsewhere, tasks made
//!   ready) and sends them through the store, outside any task transaction.
//! - **subscriber**: hands other nodes' wake-ups to the local shard loops and pollers, and a
//!   membership wake-up (a node joined or left) to the membership loop, which then turns at once.
//!   A node announces itself after its first heartbeat, a hand-over after releasing the shards
//!   another should run, and its leave after releasing everything, so a clean shutdown hands its
//!   shards over within one look instead of at the others' next turn (up to a third of the TTL
//!   later), and a newcomer gets its share as soon.
//!
//! Fail-over is bounded by the lease TTL plus one look: the membership loop does not only turn
//! every third of the TTL, it also wakes at the instant another node's last heartbeat plus the
//! TTL passes (that node then leaves the live set and its leases, renewed with the same `now`,
//! have ended), so the shards of a node that stopped are taken as soon as they are free. And a
//! node that has missed its heartbeats for half the TTL is *suspect*: rendezvous still counts it
//! (it may only be slow), but the shards rendezvous would give it that have no valid lease (their
//! owner died or let them go) are taken by the others meanwhile, since a node that does not
//! heartbeat does not acquire either. Without that, a node stopped just after another died sat
//! on the dead node's shards until its own lapse, one TTL later. A suspect node that heartbeats
//! again gets those shards back by the usual hand-over.
//!
//! The membership loop also measures the node's clock against the database's again every
//! `Config::clock_check_interval`, with the rules of the first measurement at join: within
//! `Config::max_clock_skew` the engine's correction follows the new offset (with a warning past
//! 50 ms); beyond it the node hands its shards back and leaves the membership (so rendezvous
//! gives its shards to the others), and rejoins once a later measurement is within the limit.
//!
//! Shard loops on a node are fenced: their claims carry the shard's fence, and a claim refused with
//! `LeaseLost` stops the loop. Nothing here decides whether a write is allowed; the store does.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use sundial_core::{Clock, Task, Timestamp, rendezvous_owner};
use sundial_store::{Cluster, Fence, Member, Store, StoreError, Wakeup};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::OffsetClock;

/// What the membership loops need of the engine they place shards for. The engine implements
/// it; this module never names the engine, so the dependency points one way.
pub(crate) trait ShardHost: Send + Sync + 'static {
    fn clock(&self) -> &Arc<dyn Clock>;
    /// Turns true when shutdown begins.
    fn stopping(&self) -> watch::Receiver<bool>;
    fn shard_count(&self) -> u32;
    /// The queues this node has seen (for the ready wake-ups owed to a newcomer).
    fn queue_names(&self) -> Vec<String>;
    /// Marks `shard` as run here and starts its loop under `fence`, until `stop` turns true or
    /// the fence is refused.
    fn run_shard(
        self: Arc<Self>,
        shard: u32,
        fence: Fence,
        stop: watch::Receiver<bool>,
    ) -> JoinHandle<()>;
    /// Marks `shard` as no longer run here (its loop has stopped).
    fn shard_left(&self, shard: u32);
    /// Records that this node's lease on `shard` holds until `until`.
    fn set_lease_until(&self, shard: u32, until: Timestamp);
    /// Hands another node's wake-up to the local shard loop or pollers.
    fn deliver(&self, wakeup: Wakeup);
}

/// The cluster as the store records it, seen from one node at one time (see
/// `Sundial::cluster_view`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The node asking.
    pub node: String,
    pub shard_count: u32,
    /// When the view was read (the node's clock, corrected to the database's).
    pub now: Timestamp,
    /// Every node with a membership row or a valid lease, by name.
    pub nodes: Vec<NodeView>,
    /// Shards without a valid lease now (free, released or expired): no node runs them until
    /// one acquires them.
    pub unowned: Vec<u32>,
}

/// One node of a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub node: String,
    /// Its last heartbeat (`None`: it has left the membership but still holds a lease).
    pub last_seen: Option<Timestamp>,
    /// Heard from within the shard-lease TTL.
    pub live: bool,
    /// The shards whose lease it holds and that have not ended, in order.
    pub shards: Vec<u32>,
}

/// Builds the [`ClusterView`] of `state` for `me` at `now`.
pub(crate) fn cluster_view(
    state: &sundial_store::ClusterState,
    me: &str,
    shard_count: u32,
    now: Timestamp,
    ttl: Duration,
) -> ClusterView {
    let ttl_ms = ttl.as_millis() as i64;
    let mut nodes: std::collections::BTreeMap<String, NodeView> = state
        .members
        .iter()
        .map(|m| {
            (
                m.node.clone(),
                NodeView {
                    node: m.node.clone(),
                    last_seen: Some(m.last_seen),
                    live: now.0.saturating_sub(m.last_seen.0) <= ttl_ms,
                    shards: Vec::new(),
                },
            )
        })
        .collect();
    let mut owned = HashSet::new();
    for l in &state.leases {
        let Some(owner) = l.owner.as_ref().filter(|_| l.expires_at >= now) else {
            continue;
        };
        owned.insert(l.shard);
        nodes
            .entry(owner.clone())
            .or_insert_with(|| NodeView {
                node: owner.clone(),
                last_seen: None,
                live: false,
                shards: Vec::new(),
            })
            .shards
            .push(l.shard);
    }
    let mut nodes: Vec<NodeView> = nodes.into_values().collect();
    for n in &mut nodes {
        n.shards.sort_unstable();
    }
    ClusterView {
        node: me.to_string(),
        shard_count,
        now,
        nodes,
        unowned: (0..shard_count).filter(|s| !owned.contains(s)).collect(),
    }
}

/// Offsets beyond this are logged as a warning (at join and at every later check).
pub(crate) const WARN_SKEW_MS: u64 = 50;

/// The conservative offset of the database's clock from `clock` (see [`OffsetClock::estimate`]).
pub(crate) async fn measure_offset(
    cluster: &dyn Cluster,
    clock: &dyn Clock,
) -> Result<i64, StoreError> {
    let before = clock.now();
    let db = cluster.database_time().await?;
    let after = clock.now();
    Ok(OffsetClock::estimate(before, db, after))
}

/// How the membership loop sees the others after a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    /// Every node heard from within the TTL (this one included), sorted: rendezvous is over these.
    pub live: Vec<String>,
    /// The live nodes that are not suspect (heard from within half the TTL), this one included.
    pub fresh: Vec<String>,
    /// The next instant at which the view changes by time alone: a node's lapse (last heartbeat
    /// plus the TTL: it leaves the live set and its leases have ended), or a node that has missed
    /// a heartbeat turning suspect.
    pub next_change: Option<Timestamp>,
}

/// Classifies `members` (from [`Cluster::heartbeat`]) as `me` sees them at `now`.
pub(crate) fn view(members: &[Member], me: &str, now: Timestamp, ttl: Duration) -> View {
    let ttl_ms = ttl.as_millis() as i64;
    // Heartbeats come every third of the TTL: a node not heard from for 40 % of it missed one.
    let late_ms = ttl_ms * 2 / 5;
    let suspect_ms = ttl_ms / 2;
    let mut next: Option<Timestamp> = None;
    let mut at = |t: Timestamp| next = Some(next.map_or(t, |n| n.min(t)));
    let mut fresh = Vec::new();
    for m in members {
        if m.node == me {
            fresh.push(m.node.clone());
            continue;
        }
        let age = now.0 - m.last_seen.0;
        at(Timestamp(m.last_seen.0 + ttl_ms + 1));
        if age <= suspect_ms {
            fresh.push(m.node.clone());
            if age > late_ms {
                at(Timestamp(m.last_seen.0 + suspect_ms + 1));
            }
        }
    }
    View {
        live: members.iter().map(|m| m.node.clone()).collect(),
        fresh,
        next_change: next,
    }
}

/// This node's place in a cluster.
pub(crate) struct ClusterNode {
    pub cluster: Arc<dyn Cluster>,
    pub node: String,
    pub lease_ttl: Duration,
    /// The engine's clock: the wall clock corrected by the measured offset to the database's.
    clock: Arc<OffsetClock>,
    max_skew: Duration,
    clock_check_interval: Duration,
    /// Whether the last heartbeat found this node the only live one: then nobody else has
    /// pollers to wake, and ready wake-ups are not published.
    alone: AtomicBool,
    owned: Mutex<HashMap<u32, OwnedShard>>,
    outbox: mpsc::UnboundedSender<Wakeup>,
    outbox_rx: Mutex<Option<mpsc::UnboundedReceiver<Wakeup>>>,
    /// Another node joined or left ([`Wakeup::Membership`]): the membership loop turns now.
    look_again: tokio::sync::Notify,
    /// Whether the subscriber loop listens for wake-ups: this node announces itself only then,
    /// or it would miss the others' answer (the hand-over of its share).
    listening: AtomicBool,
}

struct OwnedShard {
    fence: Fence,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

impl ClusterNode {
    pub fn new(
        cluster: Arc<dyn Cluster>,
        node: String,
        config: &crate::Config,
        clock: Arc<OffsetClock>,
    ) -> Self {
        let (outbox, rx) = mpsc::unbounded_channel();
        ClusterNode {
            cluster,
            node,
            lease_ttl: config.shard_lease_ttl,
            clock,
            max_skew: config.max_clock_skew,
            clock_check_interval: config.clock_check_interval,
            alone: AtomicBool::new(false),
            owned: Mutex::new(HashMap::new()),
            outbox,
            outbox_rx: Mutex::new(Some(rx)),
            look_again: tokio::sync::Notify::new(),
            listening: AtomicBool::new(false),
        }
    }

    /// Queues a wake-up for other nodes.
    pub fn publish(&self, w: Wakeup) {
        let _ = self.outbox.send(w);
    }

    /// Whether the last heartbeat found no other live node.
    pub fn is_alone(&self) -> bool {
        self.alone.load(Ordering::Acquire)
    }

    /// Measures the clock against the database's again. Within the limit the correction takes
    /// the new offset and this returns `true`; beyond it nothing changes and it returns `false`.
    async fn check_clock(&self) -> Result<bool, StoreError> {
        let offset = measure_offset(self.cluster.as_ref(), self.clock.inner().as_ref()).await?;
        let skew = offset.unsigned_abs();
        if skew > self.max_skew.as_millis() as u64 {
            tracing::error!(
                offset_ms = offset,
                limit_ms = self.max_skew.as_millis() as u64,
                "this node's clock differs from the database's beyond the limit: handing its \
                 shards back and leaving until it is within the limit (fix the clock: NTP)"
            );
            return Ok(false);
        }
        let old = self.clock.offset_ms();
        if skew > WARN_SKEW_MS {
            tracing::warn!(
                offset_ms = offset,
                previous_ms = old,
                "this node's clock differs from the database's; running on the database's time"
            );
        } else if offset != old {
            tracing::debug!(
                offset_ms = offset,
                previous_ms = old,
                "clock offset re-measured"
            );
        }
        self.clock.set_offset_ms(offset);
        Ok(true)
    }

    fn fences(&self) -> Vec<Fence> {
        self.owned
            .lock()
            .map(|o| o.values().map(|s| s.fence).collect())
            .unwrap_or_default()
    }

    /// The fence of `shard` while this node holds it.
    pub fn fence_of(&self, shard: u32) -> Option<Fence> {
        self.fences().into_iter().find(|f| f.shard == shard)
    }

    /// The shards this node runs now.
    pub fn owned_shards(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.fences().iter().map(|f| f.shard).collect();
        v.sort_unstable();
        v
    }

    /// The membership and the leases as the store records them, seen from this node now.
    pub async fn view(&self, shard_count: u32) -> Result<ClusterView, StoreError> {
        let state = self.cluster.cluster_state().await?;
        Ok(cluster_view(
            &state,
            &self.node,
            shard_count,
            self.clock.now(),
            self.lease_ttl,
        ))
    }

    /// Expires task leases in the shards this node owns (fenced, shard by shard).
    pub async fn expire_owned(
        &self,
        store: &dyn Store,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        let mut out = Vec::new();
        for f in self.fences() {
            match store.expire_leases(now, limit, Some(f)).await {
                Ok(mut v) => out.append(&mut v),
                Err(StoreError::LeaseLost { shard }) => {
                    tracing::warn!(shard, "lease lost while expiring task leases")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Retention: deletes expired finished tasks of the shards this node owns (fenced, shard by
    /// shard, up to `limit` in all). A shard whose lease was lost meanwhile deletes nothing.
    pub async fn purge_owned(
        &self,
        store: &dyn Store,
        rules: &sundial_store::RetentionRules,
        now: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0u64;
        for f in self.fences() {
            let left = limit.saturating_sub(usize::try_from(deleted).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            match store.purge_tasks(rules, now, left, Some(f)).await {
                Ok(n) => deleted += n,
                Err(StoreError::LeaseLost { shard }) => {
                    tracing::warn!(shard, "lease lost while deleting finished tasks")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// The earliest task lease expiry in the shards this node owns.
    pub async fn next_owned_lease_expiry(
        &self,
        store: &dyn Store,
    ) -> Result<Option<Timestamp>, StoreError> {
        let mut next: Option<Timestamp> = None;
        for f in self.fences() {
            if let Some(t) = store.next_lease_expiry(Some(f.shard)).await? {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        Ok(next)
    }
}

/// Starts the membership, publisher and subscriber loops.
pub(crate) fn start(node: Arc<ClusterNode>, host: Arc<dyn ShardHost>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    let (n, h) = (node.clone(), host.clone());
    tasks.push(tokio::spawn(async move { membership_loop(h, &n).await }));
    let (n, h) = (node.clone(), host.clone());
    tasks.push(tokio::spawn(async move { publisher_loop(h, &n).await }));
    tasks.push(tokio::spawn(
        async move { subscriber_loop(host, &node).await },
    ));
    tasks
}

async fn membership_loop(engine: Arc<dyn ShardHost>, node: &ClusterNode) {
    let mut stopping = engine.stopping();
    let ttl = node.lease_ttl;
    let ttl_ms = ttl.as_millis() as i64;
    let mut next_clock_check = engine
        .clock()
        .now()
        .saturating_add(node.clock_check_interval);
    // Set while the clock is beyond the limit: the node has left and runs no shard.
    let mut refused = false;
    // When the others' heartbeats say the view changes next (see `view`).
    let mut next_change: Option<Timestamp> = None;
    // Whether the others were told that this node joined (after its first heartbeat).
    let mut announced = false;
    loop {
        if *stopping.borrow() {
            break;
        }
        let now = engine.clock().now();
        if now >= next_clock_check {
            match node.check_clock().await {
                Ok(true) => {
                    if refused {
                        tracing::info!("clock within the limit again; rejoining");
                    }
                    refused = false;
                }
                Ok(false) => {
                    if !refused {
                        hand_back(&engine, node).await;
                    }
                    refused = true;
                    // Rejoining is announced again.
                    announced = false;
                }
                Err(e) => tracing::warn!(error = %e, "clock check failed"),
            }
            // From the engine's clock after the check (the offset may have moved).
            next_clock_check = engine
                .clock()
                .now()
                .saturating_add(node.clock_check_interval);
        }
        let now = engine.clock().now();
        let waiting = if refused {
            false
        } else {
            match node
                .cluster
                .heartbeat(&node.node, now, Timestamp(now.0 - ttl_ms))
                .await
            {
                Ok(members) => {
                    if !announced && node.listening.load(Ordering::Acquire) {
                        // The others hand over this node's share at their next look: make it now.
                        // Only once this node listens, or it would miss their hand-over wake-up
                        // (the subscriber loop makes this loop turn when it starts listening).
                        node.publish(Wakeup::Membership);
                        announced = true;
                    }
                    let view = view(&members, &node.node, now, ttl);
                    next_change = view.next_change;
                    let live = &view.live;
                    let alone = live.len() == 1 && live[0] == node.node;
                    let was_alone = node.alone.swap(alone, Ordering::AcqRel);
                    if was_alone && !alone {
                        // Ready wake-ups went nowhere while this node was alone: tell the
                        // newcomers' pollers about every queue that may have ready work.
                        for queue in engine.queue_names() {
                            node.publish(Wakeup::Ready { queue });
                        }
                    }
                    rebalance(&engine, node, &view, now).await
                }
                Err(e) => {
                    next_change = None;
                    tracing::warn!(error = %e, "node heartbeat failed");
                    node.alone.store(false, Ordering::Release);
                    false
                }
            }
        };
        let third = ttl_ms / 3;
        let jitter = rand::rng().random_range(0..=third / 10 + 1);
        // While a shard this node should own is still held by its previous owner (which hands it
        // over on its own next turn), look again soon rather than a third of the TTL later: a
        // shard without a running loop fires nothing.
        let pause = if waiting {
            third.min(250)
        } else {
            third - jitter
        };
        let mut next = Timestamp(now.0 + pause);
        if let Some(change) = next_change {
            // A little after the change, never in a tight loop.
            next = next.min(change.max(Timestamp(now.0 + 20)));
        }
        tokio::select! {
            _ = engine.clock().sleep_until(next) => {}
            _ = node.look_again.notified() => {}
            _ = stopping.changed() => {}
        }
    }
    // Clean exit: stop the loops, hand the shards back, leave.
    if !refused {
        hand_back(&engine, node).await;
    }
}

/// Stops every shard loop of this node, releases the shards and leaves the membership.
async fn hand_back(engine: &Arc<dyn ShardHost>, node: &ClusterNode) {
    node.alone.store(false, Ordering::Release);
    let owned: Vec<(u32, OwnedShard)> = node
        .owned
        .lock()
        .map(|mut o| o.drain().collect())
        .unwrap_or_default();
    for (shard, s) in owned {
        s.stop.send_replace(true);
        let _ = s.handle.await;
        engine.shard_left(shard);
        if let Err(e) = node.cluster.release_shard(s.fence, &node.node).await {
            tracing::warn!(shard, error = %e, "release failed");
        }
    }
    if let Err(e) = node.cluster.leave(&node.node).await {
        tracing::warn!(error = %e, "leave failed");
    }
    // Sent directly: the publisher loop stops with the engine. Without it the others would take
    // the released shards only at their next turn, up to a third of the lease TTL later.
    if let Err(e) = node.cluster.publish(vec![Wakeup::Membership]).await {
        tracing::debug!(error = %e, "publishing the leave failed (costs fail-over time only)");
    }
}

/// Releases and acquires shards to match rendezvous over the live nodes, and takes what rendezvous
/// over the fresh ones adds if it is free (a suspect node's share: see the module doc). Returns
/// whether some shard rendezvous over the live nodes gives this node is still held by another.
async fn rebalance(
    engine: &Arc<dyn ShardHost>,
    node: &ClusterNode,
    view: &View,
    now: Timestamp,
) -> bool {
    let mut waiting = false;
    let until = now.saturating_add(node.lease_ttl);
    let mine = |set: &[String]| -> HashSet<u32> {
        (0..engine.shard_count())
            .filter(|s| rendezvous_owner(*s, set) == Some(node.node.as_str()))
            .collect()
    };
    let owed = mine(&view.live);
    // Removing nodes from rendezvous only moves their shards: this is a superset of `owed`.
    let wanted: HashSet<u32> = if view.fresh.len() < view.live.len() {
        mine(&view.fresh)
    } else {
        owed.clone()
    };
    // Give up what another node should have (or whose loop ended: lease lost).
    let held: Vec<u32> = node
        .owned
        .lock()
        .map(|o| o.keys().copied().collect())
        .unwrap_or_default();
    let mut handed_over = false;
    for shard in held {
        let finished = node
            .owned
            .lock()
            .map(|o| o.get(&shard).is_some_and(|s| s.handle.is_finished()))
            .unwrap_or(false);
        if wanted.contains(&shard) && !finished {
            continue;
        }
        let Some(s) = node.owned.lock().ok().and_then(|mut o| o.remove(&shard)) else {
            continue;
        };
        s.stop.send_replace(true);
        let _ = s.handle.await;
        engine.shard_left(shard);
        if !finished {
            tracing::info!(shard, "handing shard over");
            match node.cluster.release_shard(s.fence, &node.node).await {
                Ok(()) => handed_over = true,
                Err(e) => tracing::warn!(shard, error = %e, "release failed"),
            }
        }
    }
    if handed_over {
        // The node waiting for these shards takes them at its next look: make that now.
        node.publish(Wakeup::Membership);
    }
    // Take or renew what rendezvous gives this node: one call for all of them.
    let mut wanted: Vec<u32> = wanted.into_iter().collect();
    wanted.sort_unstable();
    if wanted.is_empty() {
        return waiting;
    }
    let fences = match node
        .cluster
        .acquire_shards(&wanted, &node.node, now, until)
        .await
    {
        Ok(f) if f.len() == wanted.len() => f,
        Ok(f) => {
            tracing::warn!(
                asked = wanted.len(),
                answered = f.len(),
                "acquire answered for the wrong number of shards"
            );
            return waiting;
        }
        Err(e) => {
            tracing::warn!(error = %e, "acquire failed");
            return waiting;
        }
    };
    for (shard, fence) in wanted.into_iter().zip(fences) {
        match fence {
            Some(fence) => {
                engine.set_lease_until(shard, until);
                let mut owned = match node.owned.lock() {
                    Ok(o) => o,
                    Err(p) => p.into_inner(),
                };
                let same = owned.get(&shard).is_some_and(|s| s.fence == fence);
                if same {
                    continue;
                }
                if let Some(old) = owned.remove(&shard) {
                    old.stop.send_replace(true);
                }
                let (stop, stop_rx) = watch::channel(false);
                // (Starting the loop also wakes the reaper: attempts of the shard's previous
                // owner may have passed their leases already.)
                let handle = engine.clone().run_shard(shard, fence, stop_rx);
                tracing::info!(
                    shard,
                    range_id = fence.range_id,
                    suspect_share = !owed.contains(&shard),
                    "shard acquired"
                );
                owned.insert(
                    shard,
                    OwnedShard {
                        fence,
                        stop,
                        handle,
                    },
                );
            }
            None => {
                // Another live node still holds it; it will hand it over or its lease will end.
                // (A suspect node's share is only taken when free: no need to look again soon.)
                waiting |= owed.contains(&shard);
                let lost = node.owned.lock().ok().and_then(|mut o| o.remove(&shard));
                if let Some(s) = lost {
                    tracing::warn!(shard, "shard lease lost");
                    s.stop.send_replace(true);
                    engine.shard_left(shard);
                }
            }
        }
    }
    waiting
}

async fn publisher_loop(engine: Arc<dyn ShardHost>, node: &ClusterNode) {
    let Some(mut rx) = node.outbox_rx.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    let mut stopping = engine.stopping();
    loop {
        // A shutdown that began before this task first ran is no change to wait for.
        if *stopping.borrow() {
            break;
        }
        let first = tokio::select! {
            w = rx.recv() => w,
            _ = stopping.changed() => None,
        };
        let Some(first) = first else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < 512 {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        // Coalesce: one ready wake-up per queue.
        let mut queues = HashSet::new();
        let mut membership = false;
        batch.retain(|w| match w {
            Wakeup::Ready { queue } => queues.insert(queue.clone()),
            Wakeup::Due { .. } | Wakeup::Released { .. } => true,
            Wakeup::Membership => !std::mem::replace(&mut membership, true),
        });
        if let Err(e) = node.cluster.publish(batch).await {
            tracing::debug!(error = %e, "publish failed (costs latency only)");
        }
    }
}

async fn subscriber_loop(engine: Arc<dyn ShardHost>, node: &ClusterNode) {
    let mut stopping = engine.stopping();
    let mut stream = loop {
        match node.cluster.subscribe().await {
            Ok(s) => {
                node.listening.store(true, Ordering::Release);
                // The membership loop announces this node now that it can hear the answer.
                node.look_again.notify_one();
                break s;
            }
            Err(e) => {
                tracing::warn!(error = %e, "subscribe failed; retrying");
                let until = engine.clock().now().saturating_add(Duration::from_secs(1));
                tokio::select! {
                    _ = engine.clock().sleep_until(until) => {}
                    _ = stopping.changed() => return,
                }
            }
        }
    };
    loop {
        // As in the publisher loop: a shutdown that began before this task first ran.
        if *stopping.borrow() {
            break;
        }
        let next = tokio::select! {
            w = stream.next() => w,
            _ = stopping.changed() => None,
        };
        match next {
            Some(Wakeup::Membership) => node.look_again.notify_one(),
            Some(w) => engine.deliver(w),
            None => break,
        }
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;
    use sundial_store::{ClusterState, ShardLease};

    #[test]
    fn the_view_names_each_nodes_valid_leases_and_the_unowned_shards() {
        let lease = |shard, owner: Option<&str>, until| ShardLease {
            shard,
            owner: owner.map(str::to_string),
            expires_at: Timestamp(until),
            range_id: 1,
        };
        let state = ClusterState {
            members: vec![
                Member {
                    node: "a".into(),
                    last_seen: Timestamp(9_000),
                },
                Member {
                    node: "b".into(),
                    last_seen: Timestamp(1_000),
                },
            ],
            leases: vec![
                lease(0, Some("a"), 20_000),
                lease(1, Some("b"), 5_000),
                lease(2, None, 0),
                lease(3, Some("gone"), 20_000),
                lease(4, Some("a"), 20_000),
            ],
        };
        let v = cluster_view(&state, "a", 6, Timestamp(10_000), Duration::from_secs(5));
        assert_eq!(v.node, "a");
        let rows: Vec<_> = v
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.last_seen, n.live, n.shards.clone()))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("a", Some(Timestamp(9_000)), true, vec![0, 4]),
                ("b", Some(Timestamp(1_000)), false, vec![]),
                ("gone", None, false, vec![3]),
            ]
        );
        assert_eq!(v.unowned, vec![1, 2, 5], "expired, released, never leased");
    }
}
