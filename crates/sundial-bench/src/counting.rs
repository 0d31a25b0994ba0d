//! A [`Store`] that forwards every call to another store and counts it: per method, and per shard
//! for the methods that name a shard, with each call's latency. Used by the idle benchmark to see
//! how often the engine asks the store anything while nothing is due, and by the fire benchmark to
//! see where lateness comes from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{Stopwatch, histogram};
use async_trait::async_trait;
use futures::stream::BoxStream;
use hdrhistogram::Histogram;
use sundial_core::{ExecutionId, NewTask, Task, TaskId, Timestamp};
use sundial_store::{
    ClaimOutcome, Cluster, DueClaim, DueEntry, DueKey, Fence, Inserted, Member, ReadyClaim,
    StateCount, Store, StoreError, TaskFilter, TaskPage, TransitionError, Wakeup,
};

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
    ClaimDueFenced,
    ExpireLeasesFenced,
    NextLeaseExpiryIn,
    Publish,
    Subscribe,
    DatabaseTime,
}

impl Method {
    pub const ALL: [Method; 27] = [
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
        Method::ClaimDueFenced,
        Method::ExpireLeasesFenced,
        Method::NextLeaseExpiryIn,
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
            Method::ClaimDueFenced => "claim_due_fenced",
            Method::ExpireLeasesFenced => "expire_leases_fenced",
            Method::NextLeaseExpiryIn => "next_lease_expiry_in",
            Method::Publish => "publish",
            Method::Subscribe => "subscribe",
            Method::DatabaseTime => "database_time",
        }
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
            | Method::NextLeaseExpiryIn
            | Method::Subscribe
            | Method::DatabaseTime => Access::Read,
            _ => Access::Write,
        }
    }
}

/// Counts of one snapshot: `(method, shard)` → calls; `shard` is `None` for methods without one.
pub type Counts = BTreeMap<(Method, Option<u32>), u64>;

pub struct CountingStore {
    inner: Arc<dyn Store>,
    /// The same store's `Cluster` side, when it has one (PostgreSQL).
    cluster: Option<Arc<dyn Cluster>>,
    /// One counter per method and shard (index `shards` for calls without a shard).
    counters: Vec<Vec<AtomicU64>>,
    /// Call latency per method, in microseconds.
    latency: Vec<Mutex<Histogram<u64>>>,
    shards: u32,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>, shards: u32) -> Self {
        let counters = Method::ALL
            .iter()
            .map(|_| (0..=shards).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let latency = Method::ALL
            .iter()
            .map(|_| Mutex::new(histogram()))
            .collect();
        CountingStore {
            inner,
            cluster: None,
            counters,
            latency,
            shards,
        }
    }

    /// Also counts the calls of several nodes' protocol, forwarded to `cluster` (the same
    /// store's `Cluster` side).
    pub fn with_cluster(mut self, cluster: Arc<dyn Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    fn cluster(&self) -> Result<&Arc<dyn Cluster>, StoreError> {
        self.cluster
            .as_ref()
            .ok_or_else(|| StoreError::Backend("not a cluster store".to_string()))
    }

    /// Counts a call now and returns what records its latency when dropped.
    fn count(&self, m: Method, shard: Option<u32>) -> Timing<'_> {
        let slot = shard.map(|s| s.min(self.shards)).unwrap_or(self.shards) as usize;
        if let Some(c) = self.counters.get(m as usize).and_then(|v| v.get(slot)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Timing {
            hist: &self.latency[m as usize],
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
struct Timing<'a> {
    hist: &'a Mutex<Histogram<u64>>,
    watch: Stopwatch,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        if let Ok(mut h) = self.hist.lock() {
            h.saturating_record(self.watch.elapsed().as_micros() as u64);
        }
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError> {
        let _t = self.count(Method::Insert, None);
        self.inner.insert(tasks).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        let _t = self.count(Method::Get, None);
        self.inner.get(id).await
    }

    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError> {
        let _t = self.count(Method::List, None);
        self.inner.list(filter, limit).await
    }

    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let _t = self.count(Method::Cancel, None);
        self.inner.cancel(id, now).await
    }

    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let _t = self.count(Method::Trigger, None);
        self.inner.trigger(id, now).await
    }

    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError> {
        let _t = self.count(Method::ScanDue, Some(shard));
        self.inner.scan_due(shard, after, until, limit).await
    }

    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError> {
        let _t = self.count(Method::NextDue, Some(shard));
        self.inner.next_due(shard, after).await
    }

    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let _t = self.count(Method::ClaimDue, None);
        self.inner.claim_due(claims, now).await
    }

    async fn claim_ready(&self, claim: ReadyClaim) -> Result<Vec<Task>, StoreError> {
        let _t = self.count(Method::ClaimReady, None);
        self.inner.claim_ready(claim).await
    }

    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        lease_until: Timestamp,
    ) -> Result<Task, TransitionError> {
        let _t = self.count(Method::Heartbeat, None);
        self.inner.heartbeat(id, execution, now, lease_until).await
    }

    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        let _t = self.count(Method::Complete, None);
        self.inner.complete(id, execution, now, result).await
    }

    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry_at: Option<Timestamp>,
    ) -> Result<Task, TransitionError> {
        let _t = self.count(Method::Fail, None);
        self.inner.fail(id, execution, now, error, retry_at).await
    }

    async fn expire_leases(&self, now: Timestamp, limit: usize) -> Result<Vec<Task>, StoreError> {
        let _t = self.count(Method::ExpireLeases, None);
        self.inner.expire_leases(now, limit).await
    }

    async fn next_lease_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        let _t = self.count(Method::NextLeaseExpiry, None);
        self.inner.next_lease_expiry().await
    }

    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError> {
        let _t = self.count(Method::CountByState, None);
        self.inner.count_by_state().await
    }
    async fn queue_settings(
        &self,
        queue: &str,
    ) -> Result<Option<sundial_store::QueueSettings>, StoreError> {
        self.inner.queue_settings(queue).await
    }
    async fn list_queue_settings(&self) -> Result<Vec<sundial_store::QueueSettings>, StoreError> {
        self.inner.list_queue_settings().await
    }
    async fn put_queue_config(
        &self,
        queue: &str,
        config: sundial_store::QueueConfig,
        now: Timestamp,
    ) -> Result<sundial_store::QueueSettings, StoreError> {
        self.inner.put_queue_config(queue, config, now).await
    }
    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<sundial_store::QueueSettings, StoreError> {
        self.inner.set_queue_paused(queue, paused, now).await
    }
    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        self.inner.earliest_waiting(queue).await
    }
    async fn attempts(
        &self,
        id: TaskId,
    ) -> Result<Option<sundial_store::AttemptHistory>, StoreError> {
        self.inner.attempts(id).await
    }
    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.inner.retry(id, due_at, now).await
    }
    async fn select(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<Vec<sundial_store::Selected>, StoreError> {
        self.inner.select(filter, limit).await
    }
    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        self.inner.cancel_many(ids, now).await
    }
    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        self.inner.retry_many(ids, due_at, now).await
    }
    async fn purge_tasks(
        &self,
        shard: Option<u32>,
        rules: &sundial_store::RetentionRules,
        now: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.purge_tasks(shard, rules, now, limit).await
    }
}

#[async_trait]
impl Cluster for CountingStore {
    async fn shard_count(&self, proposed: u32) -> Result<u32, StoreError> {
        let _t = self.count(Method::ShardCount, None);
        self.cluster()?.shard_count(proposed).await
    }

    async fn heartbeat(
        &self,
        node: &str,
        now: Timestamp,
        live_since: Timestamp,
    ) -> Result<Vec<Member>, StoreError> {
        let _t = self.count(Method::NodeHeartbeat, None);
        Cluster::heartbeat(&**self.cluster()?, node, now, live_since).await
    }

    async fn leave(&self, node: &str) -> Result<(), StoreError> {
        let _t = self.count(Method::Leave, None);
        self.cluster()?.leave(node).await
    }

    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Fence>, StoreError> {
        let _t = self.count(Method::AcquireShard, Some(shard));
        self.cluster()?.acquire_shard(shard, node, now, until).await
    }

    async fn acquire_shards(
        &self,
        shards: &[u32],
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<Option<Fence>>, StoreError> {
        let _t = self.count(Method::AcquireShards, None);
        self.cluster()?
            .acquire_shards(shards, node, now, until)
            .await
    }

    async fn release_shard(&self, fence: Fence, node: &str) -> Result<(), StoreError> {
        let _t = self.count(Method::ReleaseShard, Some(fence.shard));
        self.cluster()?.release_shard(fence, node).await
    }

    async fn claim_due_fenced(
        &self,
        fence: Fence,
        claims: Vec<DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let _t = self.count(Method::ClaimDueFenced, Some(fence.shard));
        self.cluster()?.claim_due_fenced(fence, claims, now).await
    }

    async fn expire_leases_fenced(
        &self,
        fence: Fence,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        let _t = self.count(Method::ExpireLeasesFenced, Some(fence.shard));
        self.cluster()?
            .expire_leases_fenced(fence, now, limit)
            .await
    }

    async fn next_lease_expiry_in(&self, shard: u32) -> Result<Option<Timestamp>, StoreError> {
        let _t = self.count(Method::NextLeaseExpiryIn, Some(shard));
        self.cluster()?.next_lease_expiry_in(shard).await
    }

    async fn publish(&self, wakeups: Vec<Wakeup>) -> Result<(), StoreError> {
        let _t = self.count(Method::Publish, None);
        self.cluster()?.publish(wakeups).await
    }

    async fn subscribe(&self) -> Result<BoxStream<'static, Wakeup>, StoreError> {
        let _t = self.count(Method::Subscribe, None);
        self.cluster()?.subscribe().await
    }

    async fn database_time(&self) -> Result<Timestamp, StoreError> {
        let _t = self.count(Method::DatabaseTime, None);
        self.cluster()?.database_time().await
    }
}
