//! Counting every store call: per method, and per shard for the methods that name a shard, with
//! each call's latency. The store side is the test kit's forwarding store with the [`Counting`]
//! hook; the cluster side (several nodes) is [`CountingCluster`]. Used by the idle benchmark to see
//! how often the engine asks the store anything while nothing is due, and by the fire benchmark to
//! see where lateness comes from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{Stopwatch, histogram};
use async_trait::async_trait;
use futures::stream::BoxStream;
use hdrhistogram::Histogram;
use sundial_core::Timestamp;
use sundial_store::forwarding::{Call, Forwarding, Hooks};
use sundial_store::{Cluster, ClusterState, Fence, Member, Store, StoreError, Wakeup};

/// Whether a method only reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Insert,
    Get,
    List,
    Cancel,
    Trigger,
    ScanDue,
    NextDue,
    ClaimDue,
    ClaimReady,
    Heartbeat,
    Complete,
    Fail,
    ExpireLeases,
    NextLeaseExpiry,
    CountByState,
    // Several nodes (`Cluster`), when the wrapped store is one.
    ShardCount,
    NodeHeartbeat,
    Leave,
    AcquireShard,
    AcquireShards,
    ReleaseShard,
    Publish,
    Subscribe,
    DatabaseTime,
}

impl Method {
    pub const ALL: [Method; 24] = [
        Method::Insert,
        Method::Get,
        Method::List,
        Method::Cancel,
        Method::Trigger,
        Method::ScanDue,
        Method::NextDue,
        Method::ClaimDue,
        Method::ClaimReady,
        Method::Heartbeat,
        Method::Complete,
        Method::Fail,
        Method::ExpireLeases,
        Method::NextLeaseExpiry,
        Method::CountByState,
        Method::ShardCount,
        Method::NodeHeartbeat,
        Method::Leave,
        Method::AcquireShard,
        Method::AcquireShards,
        Method::ReleaseShard,
        Method::Publish,
        Method::Subscribe,
        Method::DatabaseTime,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Method::Insert => "insert",
            Method::Get => "get",
            Method::List => "list",
            Method::Cancel => "cancel",
            Method::Trigger => "trigger",
            Method::ScanDue => "scan_due",
            Method::NextDue => "next_due",
            Method::ClaimDue => "claim_due",
            Method::ClaimReady => "claim_ready",
            Method::Heartbeat => "heartbeat",
            Method::Complete => "complete",
            Method::Fail => "fail",
            Method::ExpireLeases => "expire_leases",
            Method::NextLeaseExpiry => "next_lease_expiry",
            Method::CountByState => "count_by_state",
            Method::ShardCount => "shard_count",
            Method::NodeHeartbeat => "node_heartbeat",
            Method::Leave => "leave",
            Method::AcquireShard => "acquire_shard",
            Method::AcquireShards => "acquire_shards",
            Method::ReleaseShard => "release_shard",
            Method::Publish => "publish",
            Method::Subscribe => "subscribe",
            Method::DatabaseTime => "database_time",
        }
    }

    /// The method a forwarded store call names.
    fn of_store_call(name: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.name() == name)
    }

    pub fn access(&self) -> Access {
        match self {
            Method::Get
            | Method::List
            | Method::ScanDue
            | Method::NextDue
            | Method::NextLeaseExpiry
            | Method::CountByState
            | Method::ShardCount
            | Method::Subscribe
            | Method::DatabaseTime => Access::Read,
            _ => Access::Write,
        }
    }
}

/// Counts of one snapshot: `(method, shard)` → calls; `shard` is `None` for methods without one.
pub type Counts = BTreeMap<(Method, Option<u32>), u64>;

/// The counters and latency histograms shared by a counting store and its cluster side.
pub struct Counter {
    /// One counter per method and shard (index `shards` for calls without a shard).
    counters: Vec<Vec<AtomicU64>>,
    /// Call latency per method, in microseconds.
    latency: Vec<Mutex<Histogram<u64>>>,
    shards: u32,
}

/// A store that forwards to another and counts every call.
pub type CountingStore = Forwarding<Counting>;

/// The forwarding hook that counts.
pub struct Counting(pub Arc<Counter>);

impl Hooks for Counting {
    fn enter(&self, call: Call) -> Option<Box<dyn Send>> {
        let m = Method::of_store_call(call.method)?;
        Some(Box::new(self.0.count(m, call.shard)))
    }
}

/// `inner`, counted into a fresh [`Counter`] (returned beside it).
pub fn counting_store(inner: Arc<dyn Store>, shards: u32) -> (Arc<CountingStore>, Arc<Counter>) {
    let counter = Arc::new(Counter::new(shards));
    (
        Arc::new(Forwarding::new(inner, Counting(counter.clone()))),
        counter,
    )
}

impl Counter {
    pub fn new(shards: u32) -> Self {
        let counters = Method::ALL
            .iter()
            .map(|_| (0..=shards).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let latency = Method::ALL
            .iter()
            .map(|_| Mutex::new(histogram()))
            .collect();
        Counter {
            counters,
            latency,
            shards,
        }
    }

    /// Counts a call now and returns what records its latency when dropped.
    fn count(self: &Arc<Self>, m: Method, shard: Option<u32>) -> Timing {
        let slot = shard.map(|s| s.min(self.shards)).unwrap_or(self.shards) as usize;
        if let Some(c) = self.counters.get(m as usize).and_then(|v| v.get(slot)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Timing {
            counter: self.clone(),
            method: m,
            watch: Stopwatch::start(),
        }
    }

    pub fn reset(&self) {
        for v in &self.counters {
            for c in v {
                c.store(0, Ordering::Relaxed);
            }
        }
        for h in &self.latency {
            if let Ok(mut h) = h.lock() {
                h.reset();
            }
        }
    }

    /// Latency (µs) of every method called since the last reset.
    pub fn latencies(&self) -> Vec<(Method, Histogram<u64>)> {
        Method::ALL
            .iter()
            .filter_map(|m| {
                let h = self.latency[*m as usize].lock().ok()?.clone();
                (!h.is_empty()).then_some((*m, h))
            })
            .collect()
    }

    pub fn snapshot(&self) -> Counts {
        let mut out = Counts::new();
        for m in Method::ALL {
            for (slot, c) in self.counters[m as usize].iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    let shard = (slot < self.shards as usize).then_some(slot as u32);
                    out.insert((m, shard), n);
                }
            }
        }
        out
    }
}

/// Records the time from its creation to its drop (the end of the forwarded call).
struct Timing {
    counter: Arc<Counter>,
    method: Method,
    watch: Stopwatch,
}

impl Drop for Timing {
    fn drop(&mut self) {
        if let Ok(mut h) = self.counter.latency[self.method as usize].lock() {
            h.saturating_record(self.watch.elapsed().as_micros() as u64);
        }
    }
}

/// The cluster side of a counted store: forwards to `inner` and counts into `counter`.
pub struct CountingCluster {
    pub inner: Arc<dyn Cluster>,
    pub counter: Arc<Counter>,
}

impl CountingCluster {
    fn count(&self, m: Method, shard: Option<u32>) -> Timing {
        self.counter.count(m, shard)
    }
}

#[async_trait]
impl Cluster for CountingCluster {
    async fn shard_count(&self, proposed: u32) -> Result<u32, StoreError> {
        let _t = self.count(Method::ShardCount, None);
        self.inner.shard_count(proposed).await
    }

    async fn cluster_state(&self) -> Result<ClusterState, StoreError> {
        // Operators' read: not a call the engine makes, so not counted.
        self.inner.cluster_state().await
    }

    async fn heartbeat(
        &self,
        node: &str,
        now: Timestamp,
        live_since: Timestamp,
    ) -> Result<Vec<Member>, StoreError> {
        let _t = self.count(Method::NodeHeartbeat, None);
        Cluster::heartbeat(&*self.inner, node, now, live_since).await
    }

    async fn leave(&self, node: &str) -> Result<(), StoreError> {
        let _t = self.count(Method::Leave, None);
        self.inner.leave(node).await
    }

    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Fence>, StoreError> {
        let _t = self.count(Method::AcquireShard, Some(shard));
        self.inner.acquire_shard(shard, node, now, until).await
    }

    async fn acquire_shards(
        &self,
        shards: &[u32],
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<Option<Fence>>, StoreError> {
        let _t = self.count(Method::AcquireShards, None);
        self.inner.acquire_shards(shards, node, now, until).await
    }

    async fn release_shard(&self, fence: Fence, node: &str) -> Result<(), StoreError> {
        let _t = self.count(Method::ReleaseShard, Some(fence.shard));
        self.inner.release_shard(fence, node).await
    }

    async fn publish(&self, wakeups: Vec<Wakeup>) -> Result<(), StoreError> {
        let _t = self.count(Method::Publish, None);
        self.inner.publish(wakeups).await
    }

    async fn subscribe(&self) -> Result<BoxStream<'static, Wakeup>, StoreError> {
        let _t = self.count(Method::Subscribe, None);
        self.inner.subscribe().await
    }

    async fn database_time(&self) -> Result<Timestamp, StoreError> {
        let _t = self.count(Method::DatabaseTime, None);
        self.inner.database_time().await
    }
}
