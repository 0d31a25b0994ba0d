//! Several nodes on one store, driven by a manual clock: shards split by rendezvous, a node that
//! stops heartbeating loses its shards to the others within the lease TTL, a stale owner's claims
//! are refused, and a node whose clock is too far off refuses to join.
//!
//! The cluster here is an in-memory model of the protocol over a shared SQLite store (the fence
//! check and the claim are not one transaction in it; the PostgreSQL implementation makes them
//! one, and its own tests check that). What is tested is the node side: the engine's ownership loop.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::{Intercept, Intercepted};
use common::*;
use futures::stream::BoxStream;
use sundial::{Clock, Config, ManualClock, Sundial, TaskSpec, TaskState, Timestamp};
use sundial_store::{
    ClaimOutcome, Cluster, ClusterState, DueClaim, Fence, Member, ShardLease, Store, StoreError,
    Wakeup,
};

#[derive(Default)]
struct Model {
    shard_count: Option<u32>,
    nodes: BTreeMap<String, Timestamp>,
    leases: HashMap<u32, (String, Timestamp, i64)>,
    subscribers: Vec<futures::channel::mpsc::UnboundedSender<Wakeup>>,
    refused: u64,
    /// While set and true, new subscriptions wait (as a LISTEN connection that is slow to come
    /// up would).
    hold_subscriptions: Option<tokio::sync::watch::Receiver<bool>>,
}

struct MemoryCluster {
    store: Arc<dyn Store>,
    clock: ManualClock,
    /// How far the database's clock is ahead of the manual clock, as this node measures it.
    skew_ms: Arc<AtomicI64>,
    model: Arc<Mutex<Model>>,
    /// While true, every call from this node waits, as a SIGSTOPped process's would.
    paused: tokio::sync::watch::Receiver<bool>,
    /// While true, the wake-ups this node publishes are lost (as when a node dies between its
    /// commit and its notification, or a LISTEN connection drops).
    lose_wakeups: Arc<std::sync::atomic::AtomicBool>,
    calls: Arc<Calls>,
}

/// What one node asked of the cluster.
#[derive(Default)]
struct Calls {
    acquire_one: AtomicUsize,
    acquire_many: AtomicUsize,
    published: Mutex<Vec<Wakeup>>,
}

impl MemoryCluster {
    async fn gate(&self) {
        let mut p = self.paused.clone();
        while *p.borrow_and_update() {
            if p.changed().await.is_err() {
                return;
            }
        }
    }

    fn acquire(&self, shard: u32, node: &str, now: Timestamp, until: Timestamp) -> Option<Fence> {
        let mut m = self.model.lock().unwrap();
        let entry = m.leases.get(&shard).cloned();
        let range_id = match entry {
            None => 1,
            Some((owner, _, range)) if owner == node => range,
            Some((_, expires, range)) if expires < now => range + 1,
            Some(_) => return None,
        };
        m.leases.insert(shard, (node.to_string(), until, range_id));
        Some(Fence { shard, range_id })
    }

    fn check(&self, fence: Fence) -> Result<(), StoreError> {
        let mut m = self.model.lock().unwrap();
        match m.leases.get(&fence.shard) {
            Some((_, _, range)) if *range == fence.range_id => Ok(()),
            _ => {
                m.refused += 1;
                Err(StoreError::LeaseLost { shard: fence.shard })
            }
        }
    }
}

/// The store side of a node: the shared store, with the owner writes checked against the model's
/// fences (the fence check and the write are not one transaction here; see the module doc).
struct Fenced(Arc<MemoryCluster>);

#[async_trait]
impl Intercept for Fenced {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let Some(fence) = fence else {
            return inner.claim_due(claims, now, None).await;
        };
        self.0.gate().await;
        self.0.check(fence)?;
        inner.claim_due(claims, now, None).await
    }
    async fn expire_leases(
        &self,
        inner: &dyn Store,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<sundial::Task>, StoreError> {
        if let Some(fence) = fence {
            self.0.gate().await;
            self.0.check(fence)?;
        }
        // The model expires all shards' leases; fine for these tests (one reaper is enough).
        inner.expire_leases(now, limit, None).await
    }
    async fn purge_tasks(
        &self,
        inner: &dyn Store,
        rules: &sundial::RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        if let Some(fence) = fence {
            self.0.gate().await;
            self.0.check(fence)?;
        }
        inner.purge_tasks(rules, now, limit, None).await
    }
    async fn next_lease_expiry(
        &self,
        inner: &dyn Store,
        _shard: Option<u32>,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.0.gate().await;
        inner.next_lease_expiry(None).await
    }
}

/// The node's store: `c.store` with owner writes fenced by `c`'s model.
fn node_store(c: &Arc<MemoryCluster>) -> Arc<dyn Store> {
    Arc::new(Intercepted::new(c.store.clone(), Fenced(c.clone())))
}

#[async_trait]
impl Cluster for MemoryCluster {
    async fn shard_count(&self, proposed: u32) -> Result<u32, StoreError> {
        self.gate().await;
        Ok(*self
            .model
            .lock()
            .unwrap()
            .shard_count
            .get_or_insert(proposed))
    }
    async fn cluster_state(&self) -> Result<ClusterState, StoreError> {
        self.gate().await;
        let m = self.model.lock().unwrap();
        let mut leases: Vec<ShardLease> = m
            .leases
            .iter()
            .map(|(shard, (owner, until, range_id))| ShardLease {
                shard: *shard,
                owner: Some(owner.clone()),
                expires_at: *until,
                range_id: *range_id,
            })
            .collect();
        leases.sort_by_key(|l| l.shard);
        Ok(ClusterState {
            members: m
                .nodes
                .iter()
                .map(|(node, t)| Member {
                    node: node.clone(),
                    last_seen: *t,
                })
                .collect(),
            leases,
        })
    }
    async fn heartbeat(
        &self,
        node: &str,
        now: Timestamp,
        live_since: Timestamp,
    ) -> Result<Vec<Member>, StoreError> {
        self.gate().await;
        let mut m = self.model.lock().unwrap();
        m.nodes.insert(node.to_string(), now);
        Ok(m.nodes
            .iter()
            .filter(|(_, t)| **t >= live_since)
            .map(|(n, t)| Member {
                node: n.clone(),
                last_seen: *t,
            })
            .collect())
    }
    async fn leave(&self, node: &str) -> Result<(), StoreError> {
        self.gate().await;
        self.model.lock().unwrap().nodes.remove(node);
        Ok(())
    }
    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Fence>, StoreError> {
        self.gate().await;
        self.calls.acquire_one.fetch_add(1, Ordering::SeqCst);
        Ok(self.acquire(shard, node, now, until))
    }
    async fn acquire_shards(
        &self,
        shards: &[u32],
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<Option<Fence>>, StoreError> {
        self.gate().await;
        self.calls.acquire_many.fetch_add(1, Ordering::SeqCst);
        Ok(shards
            .iter()
            .map(|s| self.acquire(*s, node, now, until))
            .collect())
    }
    async fn release_shard(&self, fence: Fence, node: &str) -> Result<(), StoreError> {
        self.gate().await;
        let mut m = self.model.lock().unwrap();
        if let Some((owner, expires, range)) = m.leases.get_mut(&fence.shard)
            && owner == node
            && *range == fence.range_id
        {
            *expires = Timestamp(i64::MIN);
        }
        Ok(())
    }
    async fn publish(&self, wakeups: Vec<Wakeup>) -> Result<(), StoreError> {
        self.gate().await;
        self.calls
            .published
            .lock()
            .unwrap()
            .extend(wakeups.iter().cloned());
        if self.lose_wakeups.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let mut m = self.model.lock().unwrap();
        m.subscribers
            .retain(|s| wakeups.iter().all(|w| s.unbounded_send(w.clone()).is_ok()));
        Ok(())
    }
    async fn subscribe(&self) -> Result<BoxStream<'static, Wakeup>, StoreError> {
        self.gate().await;
        let hold = self.model.lock().unwrap().hold_subscriptions.clone();
        if let Some(mut hold) = hold {
            while *hold.borrow_and_update() {
                if hold.changed().await.is_err() {
                    break;
                }
            }
        }
        let (tx, rx) = futures::channel::mpsc::unbounded();
        self.model.lock().unwrap().subscribers.push(tx);
        Ok(Box::pin(rx))
    }
    async fn database_time(&self) -> Result<Timestamp, StoreError> {
        self.gate().await;
        Ok(Timestamp(
            self.clock.now().0 + self.skew_ms.load(Ordering::SeqCst),
        ))
    }
}

struct Cluster3 {
    nodes: Vec<(Sundial, sundial::Running)>,
    pause: Vec<tokio::sync::watch::Sender<bool>>,
    lose: Vec<Arc<std::sync::atomic::AtomicBool>>,
    skew: Vec<Arc<AtomicI64>>,
    calls: Vec<Arc<Calls>>,
    clock: ManualClock,
    model: Arc<Mutex<Model>>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

fn config() -> Config {
    Config {
        shard_count: 16,
        shard_lease_ttl: Duration::from_secs(9),
        ..Default::default()
    }
}

async fn cluster(n: usize) -> Cluster3 {
    cluster_with(n, config()).await
}

async fn cluster_with(n: usize, config: Config) -> Cluster3 {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store: Arc<dyn Store> = Arc::new(
        sundial::SqliteStore::open_dir(dir.path(), sundial::SqliteOptions::default()).unwrap(),
    );
    let model = Arc::new(Mutex::new(Model::default()));
    let mut nodes = Vec::new();
    let mut pause = Vec::new();
    let lose: Vec<Arc<std::sync::atomic::AtomicBool>> = (0..n).map(|_| Arc::default()).collect();
    let skew: Vec<Arc<AtomicI64>> = (0..n).map(|_| Arc::default()).collect();
    let calls: Vec<Arc<Calls>> = (0..n).map(|_| Arc::default()).collect();
    for (i, lose_wakeups) in lose.iter().enumerate() {
        let (ptx, prx) = tokio::sync::watch::channel(false);
        pause.push(ptx);
        let c = Arc::new(MemoryCluster {
            store: store.clone(),
            clock: clock.clone(),
            skew_ms: skew[i].clone(),
            model: model.clone(),
            paused: prx,
            lose_wakeups: lose_wakeups.clone(),
            calls: calls[i].clone(),
        });
        let s = Sundial::builder()
            .config(config.clone())
            .clock(Arc::new(clock.clone()))
            .join_cluster(node_store(&c), c, format!("node-{i}"))
            .await
            .unwrap();
        let running = s.start();
        nodes.push((s, running));
    }
    Cluster3 {
        nodes,
        pause,
        lose,
        skew,
        calls,
        clock,
        model,
        store,
        _dir: dir,
    }
}

/// Advances the manual clock in small steps so every loop gets to run.
async fn run_for(clock: &ManualClock, total: Duration) {
    run_for_pacing(clock, total, Duration::from_millis(20)).await;
}

/// [`run_for`] giving the nodes' background loops `real` of real time per 500 ms step.
async fn run_for_pacing(clock: &ManualClock, total: Duration, real: Duration) {
    let step = Duration::from_millis(500);
    let mut done = Duration::ZERO;
    while done < total {
        clock.advance(step);
        done += step;
        tokio::time::sleep(real).await;
    }
}

/// Waits until every node runs some shards and all 16 are run.
async fn wait_balanced(c: &Cluster3) {
    for _ in 0..200 {
        let owned: Vec<usize> = c
            .nodes
            .iter()
            .map(|(s, _)| s.owned_shards().len())
            .collect();
        if owned.iter().sum::<usize>() == 16 && owned.iter().all(|n| *n > 0) {
            return;
        }
        run_for(&c.clock, Duration::from_millis(500)).await;
    }
    panic!("shards never spread over the nodes");
}

async fn wait_owned(c: &Cluster3, expected_total: usize) {
    for _ in 0..200 {
        let total: usize = c.nodes.iter().map(|(s, _)| s.owned_shards().len()).sum();
        if total == expected_total {
            return;
        }
        run_for(&c.clock, Duration::from_millis(500)).await;
    }
    panic!("shards never settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_split_and_every_task_runs_once() {
    let c = cluster(3).await;
    wait_balanced(&c).await;
    let mut seen = Vec::new();
    for (s, _) in &c.nodes {
        let owned = s.owned_shards();
        for sh in &owned {
            assert!(!seen.contains(sh), "shard {sh} owned twice");
        }
        seen.extend(owned);
    }
    assert_eq!(seen.len(), 16);
    // Tasks created through any node run once, on whichever node owns their shard.
    let runs = Arc::new(Mutex::new(Vec::new()));
    for (i, (s, _)) in c.nodes.iter().enumerate() {
        let runs = runs.clone();
        s.register("k", move |ctx: sundial::TaskContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((i, ctx.task.id));
                Ok::<(), String>(())
            }
        });
    }
    let mut ids = Vec::new();
    for n in 0..60 {
        let (s, _) = &c.nodes[n % 3];
        ids.push(
            s.schedule(TaskSpec::new("k").delay(Duration::from_secs(2)))
                .await
                .unwrap(),
        );
    }
    run_for(&c.clock, Duration::from_secs(3)).await;
    for id in &ids {
        wait_state(&c.nodes[0].0, *id, TaskState::Succeeded).await;
    }
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), ids.len(), "each task ran exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_loses_its_shards_and_its_stale_claims_are_refused() {
    let c = cluster(3).await;
    wait_balanced(&c).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    for (i, (s, _)) in c.nodes.iter().enumerate() {
        let runs = runs.clone();
        s.register("k", move |ctx: sundial::TaskContext| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((i, ctx.task.id));
                Ok::<(), String>(())
            }
        });
    }
    // The node with the most shards goes silent; tasks are created through another one.
    let victim = (0..3)
        .max_by_key(|i| c.nodes[*i].0.owned_shards().len())
        .unwrap();
    let via = (victim + 1) % 3;
    let held = c.nodes[victim].0.owned_shards();
    assert!(!held.is_empty());
    let stale: Vec<Fence> = {
        let m = c.model.lock().unwrap();
        held.iter()
            .map(|s| Fence {
                shard: *s,
                range_id: m.leases[s].2,
            })
            .collect()
    };
    // SIGSTOP the victim: none of its calls to the cluster go through.
    c.pause[victim].send_replace(true);
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(
            c.nodes[via]
                .0
                .schedule(TaskSpec::new("k").delay(Duration::from_secs(1)))
                .await
                .unwrap(),
        );
    }
    // Past the lease TTL the two others take node 2's shards over and run everything.
    run_for(&c.clock, Duration::from_secs(15)).await;
    for id in &ids {
        wait_state(&c.nodes[via].0, *id, TaskState::Succeeded).await;
    }
    let taken: Vec<u32> = (0..3)
        .filter(|i| *i != victim)
        .flat_map(|i| c.nodes[i].0.owned_shards())
        .collect();
    for s in &held {
        assert!(taken.contains(s), "shard {s} not taken over");
    }
    // SIGCONT: whatever node 2 was about to write under its old fences is refused.
    c.pause[victim].send_replace(false);
    run_for(&c.clock, Duration::from_secs(10)).await;
    wait_owned(&c, 16).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs.len(),
        ids.len(),
        "each task ran exactly once: {runs:?}"
    );
    assert!(
        runs.iter().all(|(node, _)| *node != victim),
        "the paused node ran a task"
    );
    for id in &ids {
        let t = c.store.get(*id).await.unwrap().unwrap();
        assert_eq!(t.attempt, 1);
    }
    // A write under any of the victim's old fences is refused and changes nothing.
    let (_p, unpaused) = tokio::sync::watch::channel(false);
    let probe = Arc::new(MemoryCluster {
        store: c.store.clone(),
        clock: c.clock.clone(),
        skew_ms: Default::default(),
        model: c.model.clone(),
        paused: unpaused,
        lose_wakeups: Default::default(),
        calls: Default::default(),
    });
    let probe = node_store(&probe);
    for f in stale {
        let r = probe.claim_due(vec![], c.clock.now(), Some(f)).await;
        assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    }
}

/// A node whose leases ended while it was paused still believes it owns its shards until its
/// next membership round or refused claim. A task created through it in that time, for one of
/// those shards, must still reach the shard's new owner at once: the stale node must not keep the
/// wake-up to itself (its own loop can no longer claim anything), or the new owner would find the
/// task only at its idle backstop (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_through_a_node_with_stale_leases_reaches_the_new_owner_on_time() {
    let c = cluster(3).await;
    wait_balanced(&c).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    for (i, (s, _)) in c.nodes.iter().enumerate() {
        let runs = runs.clone();
        let clock = c.clock.clone();
        s.register("k", move |ctx: sundial::TaskContext| {
            let runs = runs.clone();
            let at = clock.now();
            async move {
                runs.lock().unwrap().push((i, ctx.task.id, at));
                Ok::<(), String>(())
            }
        });
    }
    let victim = (0..3)
        .max_by_key(|i| c.nodes[*i].0.owned_shards().len())
        .unwrap();
    let held = c.nodes[victim].0.owned_shards();
    let stale_shard = held[0];
    let stale_range = c.model.lock().unwrap().leases[&stale_shard].2;
    // Its calls to the cluster hang (as a stopped process's would); past the TTL the others take
    // its shards over. Its engine still believes it runs them.
    c.pause[victim].send_replace(true);
    run_for(&c.clock, Duration::from_secs(15)).await;
    let new_owner = (0..3)
        .find(|i| *i != victim && c.nodes[*i].0.owned_shards().contains(&stale_shard))
        .expect("the shard was taken over");
    assert_eq!(
        c.nodes[victim].0.owned_shards(),
        held,
        "the victim does not know yet"
    );
    // A task for that shard is created through the victim (its store writes still work here).
    let key = (0..)
        .map(|n| format!("stale-{n}"))
        .find(|k| {
            sundial_core::shard_for("default", Some(k), &sundial::TaskId(uuid::Uuid::nil()), 16)
                == stale_shard
        })
        .unwrap();
    let task = c.nodes[victim]
        .0
        .schedule_task(TaskSpec::new("k").key(key).delay(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(task.shard, stale_shard);
    // The victim resumes; within a few seconds (far less than the 30 s idle backstop) the task
    // has run, on the new owner.
    c.pause[victim].send_replace(false);
    run_for(&c.clock, Duration::from_secs(5)).await;
    let state = c.store.get(task.id).await.unwrap().unwrap().state;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        state,
        TaskState::Succeeded,
        "not run 4 s after it was due; runs {runs:?}"
    );
    assert_eq!(runs.len(), 1, "{runs:?}");
    // On a node that owned the shard then: the new owner, or the victim once it has taken the
    // shard back under a new fence (rendezvous gives it back; the hand-over can be quicker than
    // the task's delay), never the victim under its stale fence.
    if runs[0].0 != new_owner {
        let lease = c.model.lock().unwrap().leases[&stale_shard].clone();
        assert!(
            lease.2 > stale_range && lease.0 == format!("node-{}", runs[0].0),
            "ran on node {} (new owner {new_owner}) whose lease {lease:?} is not newer than the stale range {stale_range}",
            runs[0].0
        );
    }
    assert!(runs[0].2 >= task.due_at);
}

/// Wake-ups between nodes are best effort: one can be lost (its node died between the commit and
/// the notification, a LISTEN connection dropped). The shard's owner must then still find the
/// task by its periodic rescan from the front of the shard, within the idle interval, also while
/// other tasks keep its window busy: the backstop cannot wait for an empty window, or a steady
/// load would hide the task for as long as it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wake_up_costs_at_most_the_idle_interval_even_under_steady_load() {
    let c = cluster(2).await;
    wait_balanced(&c).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    for (i, (s, _)) in c.nodes.iter().enumerate() {
        let runs = runs.clone();
        let clock = c.clock.clone();
        s.register("k", move |ctx: sundial::TaskContext| {
            let runs = runs.clone();
            let at = clock.now();
            async move {
                runs.lock().unwrap().push((i, ctx.task.id, at));
                Ok::<(), String>(())
            }
        });
    }
    let shard = c.nodes[0].0.owned_shards()[0];
    let (owner, other) = (0, 1);
    let keys = (0..).map(|n| format!("k-{n}")).filter(move |k| {
        sundial_core::shard_for("default", Some(k), &sundial::TaskId(uuid::Uuid::nil()), 16)
            == shard
    });
    let mut keys = keys.into_iter();
    // A steady load in that shard through its owner keeps the owner's window from emptying.
    let mut load = Vec::new();
    let mut lost = None;
    for step in 0..100 {
        load.push(
            c.nodes[owner]
                .0
                .schedule(
                    TaskSpec::new("k")
                        .key(keys.next().unwrap())
                        .delay(Duration::from_secs(2)),
                )
                .await
                .unwrap(),
        );
        if step == 4 {
            // This one's wake-up, from the other node, is lost.
            c.lose[other].store(true, std::sync::atomic::Ordering::SeqCst);
            let t = c.nodes[other]
                .0
                .schedule_task(
                    TaskSpec::new("k")
                        .key(keys.next().unwrap())
                        .delay(Duration::from_secs(1)),
                )
                .await
                .unwrap();
            assert_eq!(t.shard, shard);
            lost = Some(t);
        }
        run_for(&c.clock, Duration::from_millis(500)).await;
    }
    let lost = lost.unwrap();
    let ran: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, id, _)| *id == lost.id)
        .copied()
        .collect();
    assert_eq!(
        ran.len(),
        1,
        "the task whose wake-up was lost did not run within 47 s of its due time"
    );
    let late = ran[0].2.0 - lost.due_at.0;
    let idle = Config::default().idle_interval.as_millis() as i64;
    assert!(
        late <= idle + 2_000,
        "ran {late} ms late (idle interval {idle} ms)"
    );
    assert!(ran[0].0 == owner && late >= 0);
    for id in &load[..load.len() - 5] {
        assert_eq!(
            c.store.get(*id).await.unwrap().unwrap().state,
            TaskState::Succeeded
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_far_off_clock_refuses_to_join() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store: Arc<dyn Store> = Arc::new(
        sundial::SqliteStore::open_dir(dir.path(), sundial::SqliteOptions::default()).unwrap(),
    );
    let (_p, paused) = tokio::sync::watch::channel(false);
    let c = Arc::new(MemoryCluster {
        store: store.clone(),
        clock: clock.clone(),
        skew_ms: Arc::new(AtomicI64::new(5_000)),
        model: Arc::new(Mutex::new(Model::default())),
        paused: paused.clone(),
        lose_wakeups: Default::default(),
        calls: Default::default(),
    });
    let r = Sundial::builder()
        .config(config())
        .clock(Arc::new(clock.clone()))
        .join_cluster(node_store(&c), c.clone(), "n")
        .await;
    assert!(matches!(r, Err(sundial::Error::ClockSkew { .. })));
    // Within the limit it joins and runs on the database's time.
    let near = Arc::new(MemoryCluster {
        store: store.clone(),
        clock: clock.clone(),
        skew_ms: Arc::new(AtomicI64::new(700)),
        model: Arc::new(Mutex::new(Model::default())),
        paused,
        lose_wakeups: Default::default(),
        calls: Default::default(),
    });
    let s = Sundial::builder()
        .config(config())
        .clock(Arc::new(clock.clone()))
        .join_cluster(node_store(&near), near, "n")
        .await
        .unwrap();
    let lag = Timestamp(T0.0 + 700).0 - s.clock().now().0;
    assert!((0..=2).contains(&lag), "runs {lag} ms behind the database");
}

/// A node renews all its shard leases with one cluster call per membership round, not one per
/// shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_renews_all_its_leases_with_one_call_per_round() {
    let c = cluster(1).await;
    wait_owned(&c, 16).await;
    let calls = &c.calls[0];
    let (one, many) = (
        calls.acquire_one.load(Ordering::SeqCst),
        calls.acquire_many.load(Ordering::SeqCst),
    );
    // Three membership rounds (a third of the 9 s TTL each).
    run_for(&c.clock, Duration::from_secs(9)).await;
    let rounds = calls.acquire_many.load(Ordering::SeqCst) - many;
    assert!((2..=5).contains(&rounds), "{rounds} renewal calls");
    assert_eq!(
        calls.acquire_one.load(Ordering::SeqCst),
        one,
        "no per-shard calls"
    );
    assert_eq!(c.nodes[0].0.owned_shards().len(), 16, "the leases held");
}

/// A task created through a node that does not run its shard is announced to the owner only
/// when it is due before the owner's next backstop rescan plus the look-ahead; a later one is
/// not announced, and the owner still runs it on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_for_tasks_due_after_the_next_rescan_are_not_published() {
    let c = cluster(2).await;
    wait_balanced(&c).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    for (s, _) in &c.nodes {
        let runs = runs.clone();
        let clock = c.clock.clone();
        s.register("k", move |ctx: sundial::TaskContext| {
            let runs = runs.clone();
            let at = clock.now();
            async move {
                runs.lock()
                    .unwrap()
                    .push((ctx.task.id, ctx.task.due_at, at));
                Ok::<(), String>(())
            }
        });
    }
    let (creator, _) = &c.nodes[0];
    let mine = creator.owned_shards();
    let published = |c: &Cluster3| -> Vec<sundial::TaskId> {
        c.calls[0]
            .published
            .lock()
            .unwrap()
            .iter()
            .filter_map(|w| match w {
                Wakeup::Due { entry, .. } => Some(entry.key.id),
                Wakeup::Ready { .. } | Wakeup::Released { .. } | Wakeup::Membership => None,
            })
            .collect()
    };
    let before = published(&c).len();
    let mut near = Vec::new();
    let mut far = Vec::new();
    for _ in 0..40 {
        let t = creator
            .schedule_task(TaskSpec::new("k").delay(Duration::from_secs(2)))
            .await
            .unwrap();
        if !mine.contains(&t.shard) {
            near.push(t.id);
        }
        // Idle interval 30 s plus look-ahead 5 s: two minutes is well past both.
        let t = creator
            .schedule_task(TaskSpec::new("k").delay(Duration::from_secs(120)))
            .await
            .unwrap();
        if !mine.contains(&t.shard) {
            far.push(t.id);
        }
    }
    assert!(!near.is_empty() && !far.is_empty());
    // The publisher loop sends in batches: wait for the near ones; the far ones would have gone
    // in the same batches.
    until("the near tasks are announced", || {
        let sent = published(&c);
        near.iter().all(|id| sent[before..].contains(id))
    })
    .await;
    let sent = published(&c);
    let sent = &sent[before..];
    for id in &near {
        assert!(
            sent.contains(id),
            "a task due soon is announced to its owner"
        );
    }
    for id in &far {
        assert!(
            !sent.contains(id),
            "a task due after the next rescan is not"
        );
    }
    // Fast up to shortly before the far tasks are due, then slowly: the lateness asserted below
    // is the engine's, not the test racing the clock ahead of loops that run in real time (a
    // rescan and a claim in a debug build can take several 20 ms steps).
    run_for(&c.clock, Duration::from_secs(115)).await;
    run_for_pacing(
        &c.clock,
        Duration::from_secs(10),
        Duration::from_millis(150),
    )
    .await;
    for id in &far {
        wait_state(&c.nodes[1].0, *id, TaskState::Succeeded).await;
    }
    for (id, due, at) in runs.lock().unwrap().iter() {
        if far.contains(id) {
            assert!(at >= due, "never early");
            assert!(at.0 - due.0 <= 1_000, "ran {} ms late", at.0 - due.0);
        }
    }
}

/// A node measures its clock against the database's again while it runs: within the limit its
/// engine follows the new offset; beyond it the node hands its shards back and leaves, and it
/// rejoins once its clock is within the limit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_re_measures_its_clock_and_leaves_while_too_far_off() {
    let config = Config {
        clock_check_interval: Duration::from_secs(5),
        ..config()
    };
    let c = cluster_with(2, config).await;
    wait_balanced(&c).await;
    let node0 = &c.nodes[0].0;
    assert!(!node0.owned_shards().is_empty());
    let lag = |s: &Sundial, skew: i64| c.clock.now().0 + skew - s.clock().now().0;
    assert!((0..=2).contains(&lag(node0, 0)));
    // The database's clock moves 800 ms ahead of this node's: the engine follows.
    c.skew[0].store(800, Ordering::SeqCst);
    run_for(&c.clock, Duration::from_secs(6)).await;
    assert!((0..=2).contains(&lag(node0, 800)), "{} ms", lag(node0, 800));
    // 5 s off, beyond the 2 s limit: the node hands its shards back; the other runs them all.
    c.skew[0].store(5_000, Ordering::SeqCst);
    let mut left = false;
    for _ in 0..60 {
        run_for(&c.clock, Duration::from_millis(500)).await;
        if node0.owned_shards().is_empty() && c.nodes[1].0.owned_shards().len() == 16 {
            left = true;
            break;
        }
    }
    assert!(
        left,
        "the node with the far-off clock left and the other took over"
    );
    assert!(
        !c.model.lock().unwrap().nodes.contains_key("node-0"),
        "it left the membership"
    );
    // A task due now still runs (on the other node).
    let ran = Arc::new(AtomicUsize::new(0));
    for (s, _) in &c.nodes {
        let ran = ran.clone();
        s.register("k", move |_ctx: sundial::TaskContext| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        });
    }
    let id = node0.schedule(TaskSpec::new("k")).await.unwrap();
    run_for(&c.clock, Duration::from_secs(1)).await;
    wait_state(node0, id, TaskState::Succeeded).await;
    // Back within the limit: it rejoins and gets shards again.
    c.skew[0].store(0, Ordering::SeqCst);
    let mut back = false;
    for _ in 0..60 {
        run_for(&c.clock, Duration::from_millis(500)).await;
        if !node0.owned_shards().is_empty() {
            back = true;
            break;
        }
    }
    assert!(back, "the node rejoined");
    assert!((0..=2).contains(&lag(node0, 0)));
    wait_owned(&c, 16).await;
}

/// Ready wake-ups go to other nodes only when there are other nodes; a node that was alone
/// announces its queues when another one turns up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_alone_publishes_no_ready_wake_ups() {
    let readies = |c: &Cluster3, i: usize| {
        c.calls[i]
            .published
            .lock()
            .unwrap()
            .iter()
            .filter(|w| matches!(w, Wakeup::Ready { .. }))
            .count()
    };
    let alone = cluster(1).await;
    wait_owned(&alone, 16).await;
    // No handler for the kind: the task becomes ready for workers.
    let id = alone.nodes[0]
        .0
        .schedule(TaskSpec::new("remote"))
        .await
        .unwrap();
    run_for(&alone.clock, Duration::from_secs(1)).await;
    wait_state(&alone.nodes[0].0, id, TaskState::Ready).await;
    // An absence has no event to wait for: watch the publisher for a short while.
    tokio::time::sleep(ABSENCE_WATCH).await;
    assert_eq!(readies(&alone, 0), 0);
    // Another node turns up: the lone node's next heartbeat tells it about the queue whose
    // ready work it did not announce.
    alone
        .model
        .lock()
        .unwrap()
        .nodes
        .insert("newcomer".to_string(), alone.clock.now());
    run_for(&alone.clock, Duration::from_secs(4)).await;
    until("the newcomer hears of the ready queue", || {
        alone.calls[0]
            .published
            .lock()
            .unwrap()
            .iter()
            .any(|w| matches!(w, Wakeup::Ready { queue } if queue == "default"))
    })
    .await;

    let two = cluster(2).await;
    wait_balanced(&two).await;
    run_for(&two.clock, Duration::from_secs(4)).await;
    let id = two.nodes[0]
        .0
        .schedule(TaskSpec::new("remote"))
        .await
        .unwrap();
    run_for(&two.clock, Duration::from_secs(1)).await;
    wait_state(&two.nodes[0].0, id, TaskState::Ready).await;
    until("the other node's pollers are told", || {
        readies(&two, 0) + readies(&two, 1) > 0
    })
    .await;
}

/// How long a check that something is not published watches for it (real time: the loops here
/// are the cluster's own background tasks).
const ABSENCE_WATCH: Duration = Duration::from_millis(150);

/// Waits (bounded, real time) until `cond` holds: the cluster's background loops act on their
/// own, so a test waits for what it expects them to do.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting: {what}");
}

/// Advances the clock by `step` and lets the loops run.
async fn tick(clock: &ManualClock, step: Duration) {
    clock.advance(step);
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// Steps the clock until node `i` heartbeats again (and lets its turn finish); returns the time
/// of that heartbeat.
async fn until_heartbeat(c: &Cluster3, i: usize) -> Timestamp {
    let name = format!("node-{i}");
    let last = || c.model.lock().unwrap().nodes.get(&name).copied();
    let before = last();
    for _ in 0..200 {
        tick(&c.clock, Duration::from_millis(100)).await;
        if let Some(t) = last()
            && Some(t) != before
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return t;
        }
    }
    panic!("{name} never heartbeated");
}

/// A node dies; 2 s later, before its leases end, another stops too (both SIGSTOP-like: every
/// call waits). The dead node's shards that rendezvous over the two others gives the stopped one
/// must not wait for the stopped node's own lapse: the third node takes every shard of the dead
/// one within the lease TTL (plus a step of the clock) of the dead node's last heartbeat.
/// Before, it took them only after the stopped node lapsed too (its last heartbeat plus the TTL),
/// found at the survivor's next turn: up to the TTL plus 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_right_after_another_died_does_not_hold_up_the_dead_ones_shards() {
    let c = cluster(3).await;
    wait_balanced(&c).await;
    let names: Vec<String> = (0..3).map(|i| format!("node-{i}")).collect();
    // A dead node `a` and a stopped node `b` such that rendezvous over {b, survivor} gives `b`
    // some of `a`'s shards: the case that used to wait.
    let (a, b, survivor) = [
        (0, 1, 2),
        (0, 2, 1),
        (1, 0, 2),
        (1, 2, 0),
        (2, 0, 1),
        (2, 1, 0),
    ]
    .into_iter()
    .find(|(a, b, s)| {
        let pair = vec![names[*b].clone(), names[*s].clone()];
        c.nodes[*a]
            .0
            .owned_shards()
            .iter()
            .any(|sh| sundial_core::rendezvous_owner(*sh, &pair) == Some(names[*b].as_str()))
    })
    .expect("some pair inherits a shard");
    let held = c.nodes[a].0.owned_shards();
    let died = until_heartbeat(&c, a).await;
    c.pause[a].send_replace(true);
    for _ in 0..20 {
        tick(&c.clock, Duration::from_millis(100)).await;
    }
    until_heartbeat(&c, b).await;
    c.pause[b].send_replace(true);
    let ttl = config().shard_lease_ttl;
    let mut taken_at = None;
    for _ in 0..200 {
        tick(&c.clock, Duration::from_millis(100)).await;
        let owned = c.nodes[survivor].0.owned_shards();
        if held.iter().all(|s| owned.contains(s)) {
            taken_at = Some(c.clock.now());
            break;
        }
    }
    let taken_at = taken_at.expect("the survivor never took the dead node's shards");
    let after = taken_at.since(died);
    assert!(
        after <= ttl + Duration::from_millis(500),
        "the dead node's shards {held:?} were taken {after:?} after its last heartbeat (TTL {ttl:?})"
    );
    c.pause[a].send_replace(false);
    c.pause[b].send_replace(false);
}

/// A node that shuts down cleanly tells the others as it leaves: they take its shards at once,
/// not at their next turn (up to a third of the lease TTL later). The clock stands still
/// throughout, so only that wake-up can move the survivor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_hands_its_shards_over_without_waiting_for_the_others_next_turn() {
    let mut c = cluster(2).await;
    wait_balanced(&c).await;
    let before = c.nodes[0].0.owned_shards().len();
    assert!(before < 16, "both nodes run shards");
    let (_leaving, running) = c.nodes.remove(1);
    running.shutdown(Duration::from_secs(5)).await;
    // Real time only: the manual clock is not advanced.
    let mut owned = 0;
    for _ in 0..250 {
        owned = c.nodes[0].0.owned_shards().len();
        if owned == 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        owned, 16,
        "the survivor took the leaving node's shards without its clock moving"
    );
}

/// A node that joins announces itself, so the nodes already running hand over its share at once
/// rather than at their next turn. The clock stands still after the newcomer's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_gets_its_share_without_waiting_for_the_others_next_turn() {
    let c = cluster(1).await;
    wait_owned(&c, 16).await;
    // The membership model of the first node, shared with a second one joining now.
    let lose = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (_ptx, prx) = tokio::sync::watch::channel(false);
    let mc = Arc::new(MemoryCluster {
        store: c.store.clone(),
        clock: c.clock.clone(),
        skew_ms: Arc::default(),
        model: c.model.clone(),
        paused: prx,
        lose_wakeups: lose,
        calls: Arc::default(),
    });
    let newcomer = Sundial::builder()
        .config(config())
        .clock(Arc::new(c.clock.clone()))
        .join_cluster(node_store(&mc), mc, "node-1".to_string())
        .await
        .unwrap();
    let running = newcomer.start();
    let mut owned = (0, 0);
    for _ in 0..250 {
        owned = (
            c.nodes[0].0.owned_shards().len(),
            newcomer.owned_shards().len(),
        );
        if owned.1 > 0 && owned.0 + owned.1 == 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        owned.1 > 0 && owned.0 + owned.1 == 16,
        "the newcomer got its share without the clock moving: {owned:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A newcomer announces itself only once it listens for wake-ups: the others answer its
/// announcement by handing its share over and saying so, and a newcomer that was not yet
/// listening would miss that and wait for its next turn (a third of the TTL; here, with the
/// clock standing still, forever). Its subscription is held back until after its first turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_that_listens_late_still_gets_its_share() {
    let c = cluster(1).await;
    wait_owned(&c, 16).await;
    let (hold, held) = tokio::sync::watch::channel(true);
    c.model.lock().unwrap().hold_subscriptions = Some(held);
    let (_ptx, prx) = tokio::sync::watch::channel(false);
    let mc = Arc::new(MemoryCluster {
        store: c.store.clone(),
        clock: c.clock.clone(),
        skew_ms: Arc::default(),
        model: c.model.clone(),
        paused: prx,
        lose_wakeups: Arc::default(),
        calls: Arc::default(),
    });
    let newcomer = Sundial::builder()
        .config(config())
        .clock(Arc::new(c.clock.clone()))
        .join_cluster(node_store(&mc), mc, "node-1".to_string())
        .await
        .unwrap();
    let running = newcomer.start();
    // Its first turn (a heartbeat: it is a member) happens while it cannot hear anything yet.
    for _ in 0..250 {
        if c.model.lock().unwrap().nodes.contains_key("node-1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.model.lock().unwrap().nodes.contains_key("node-1"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    hold.send_replace(false);
    let mut owned = (0, 0);
    for _ in 0..250 {
        owned = (
            c.nodes[0].0.owned_shards().len(),
            newcomer.owned_shards().len(),
        );
        if owned.1 > 0 && owned.0 + owned.1 == 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        owned.1 > 0 && owned.0 + owned.1 == 16,
        "the newcomer got its share once it listened, without the clock moving: {owned:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
}

/// A place of a group freed on one node reaches a task waiting for it on another node at once,
/// not at the waiter's 1 s backstop retry: the clock moves less than 1 s from the waiter's
/// refusal on, so only the release told between the nodes can start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_freed_on_one_node_starts_a_waiter_on_another_at_once() {
    let c = cluster(2).await;
    wait_balanced(&c).await;
    // Heartbeats on both sides, so neither node thinks itself alone.
    run_for(&c.clock, Duration::from_secs(4)).await;
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    let (started_tx, mut started) =
        tokio::sync::mpsc::unbounded_channel::<(usize, sundial::TaskId)>();
    for (i, (s, _)) in c.nodes.iter().enumerate() {
        let (finish, started_tx) = (finish.clone(), started_tx.clone());
        s.register("g", move |ctx: sundial::TaskContext| {
            let (finish, started_tx) = (finish.clone(), started_tx.clone());
            async move {
                let _ = started_tx.send((i, ctx.task.id));
                if let Ok(permit) = finish.acquire().await {
                    permit.forget();
                }
                Ok::<(), String>(())
            }
        });
    }
    // A business key on a shard of node `i` (the shard follows the queue and key).
    let key_on = |i: usize| -> String {
        let owned = c.nodes[i].0.owned_shards();
        (0..10_000)
            .map(|n| format!("k{n}"))
            .find(|k| {
                owned.contains(&sundial_core::shard_for(
                    "default",
                    Some(k),
                    &sundial::TaskId(uuid::Uuid::nil()),
                    16,
                ))
            })
            .unwrap()
    };
    let spec = |key: String| {
        TaskSpec::new("g")
            .key(key)
            .run_at(c.clock.now())
            .concurrency("acct", 1)
    };
    // Runs until the next start, moving the clock 10 ms at a time but never by `budget` in
    // all: less than the waiter's 1 s backstop.
    async fn next_start(
        clock: &ManualClock,
        started: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, sundial::TaskId)>,
        budget: Duration,
    ) -> Option<(usize, sundial::TaskId)> {
        let mut moved = Duration::ZERO;
        loop {
            if let Ok(got) = tokio::time::timeout(Duration::from_millis(20), started.recv()).await {
                return got;
            }
            if moved >= budget {
                return None;
            }
            clock.advance(Duration::from_millis(10));
            moved += Duration::from_millis(10);
        }
    }
    let holder = c.nodes[0].0.schedule(spec(key_on(0))).await.unwrap();
    let got = next_start(&c.clock, &mut started, Duration::from_millis(300)).await;
    assert_eq!(
        got,
        Some((0, holder)),
        "the holder runs on its shard's node"
    );
    // Refused for the group's one place, the waiter waits on node 1.
    let waiter = c.nodes[1].0.schedule(spec(key_on(1))).await.unwrap();
    let got = next_start(&c.clock, &mut started, Duration::from_millis(200)).await;
    assert_eq!(
        got, None,
        "a second task of the group started while the first ran"
    );
    finish.add_permits(1);
    let got = next_start(&c.clock, &mut started, Duration::from_millis(400)).await;
    assert_eq!(
        got,
        Some((1, waiter)),
        "the waiter on the other node starts when the place frees, before its backstop retry"
    );
    finish.add_permits(1);
    wait_state(&c.nodes[0].0, waiter, TaskState::Succeeded).await;
}
