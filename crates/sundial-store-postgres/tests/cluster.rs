//! `Cluster` on PostgreSQL: the shard count set once, membership, shard leases and their fencing
//! numbers, fenced writes refused with `LeaseLost` (and writing nothing), wake-ups between
//! stores over LISTEN/NOTIFY, and the database's clock.
//!
//! The environment rules (`SUNDIAL_TEST_DATABASE_URL`, skipping, `SUNDIAL_REQUIRE_POSTGRES=1`) and
//! the fresh schemas are described in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use sundial_core::{ExecutionId, Limits, NewTask, TaskId, TaskSpec, TaskState, Timestamp};
use sundial_store::{
    ClaimOutcome, ClaimTarget, Cluster, DueClaim, DueEntry, DueKey, Fence, Inserted, Store,
    StoreError, Wakeup,
};
use sundial_store_postgres::PostgresStore;

mod common;

use common::{TestSchema, connect, fresh_postgres, raw_client};

const SHARDS: u32 = 4;

/// A second store (its own pool: another node) on the same schema.
async fn another_node(guard: &TestSchema) -> Arc<PostgresStore> {
    Arc::new(connect(&guard.url, &guard.schema).await.unwrap())
}

fn new_task(due: i64) -> NewTask {
    TaskSpec::new("k")
        .run_at(Timestamp(due))
        .validate(
            TaskId(uuid::Uuid::now_v7()),
            Timestamp(0),
            SHARDS,
            &Limits::default(),
        )
        .unwrap()
}

/// Inserts a task due at `due` whose shard is `shard`.
async fn task_in_shard(store: &PostgresStore, shard: u32, due: i64) -> TaskId {
    loop {
        let t = new_task(due);
        if t.shard == shard {
            let id = t.id;
            let out = store.insert(vec![t]).await.unwrap();
            assert!(matches!(out[0], Inserted::Created(_)));
            return id;
        }
    }
}

fn run(id: TaskId, lease_until: i64) -> DueClaim {
    DueClaim {
        id,
        target: ClaimTarget::Run {
            execution: ExecutionId(uuid::Uuid::new_v4()),
            lease_until: Timestamp(lease_until),
            worker: None,
        },
    }
}

async fn state(store: &PostgresStore, id: TaskId) -> TaskState {
    store.get(id).await.unwrap().unwrap().state
}

/// The next wake-up, failing the test after 10 s.
async fn next(stream: &mut BoxStream<'static, Wakeup>) -> Wakeup {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a wake-up within 10 s")
        .expect("the stream stays open")
}

fn due(shard: u32, due_at: i64) -> Wakeup {
    Wakeup::Due {
        shard,
        entry: DueEntry {
            push_host: None,
            priority: sundial_core::Priority::DEFAULT,
            key: DueKey {
                due_at: Timestamp(due_at),
                id: TaskId(uuid::Uuid::now_v7()),
            },
            queue: "default".to_string(),
            kind: "email.send".to_string(),
            timeout_ms: 30_000,
        },
    }
}

/// The first proposal sets the shard count; later ones (any node, any number) get it back, and
/// nodes proposing at the same moment all agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_count_is_set_once() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let nodes: Vec<_> = {
        let mut v = vec![a];
        for _ in 0..3 {
            v.push(another_node(&guard).await);
        }
        v
    };
    let proposals: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let n = n.clone();
            tokio::spawn(async move { n.shard_count(8 * (i as u32 + 1)).await.unwrap() })
        })
        .collect();
    let mut got = Vec::new();
    for p in proposals {
        got.push(p.await.unwrap());
    }
    let first = got[0];
    assert!([8, 16, 24, 32].contains(&first));
    assert!(got.iter().all(|n| *n == first), "{got:?}");
    assert_eq!(nodes[0].shard_count(1).await.unwrap(), first);
    assert_eq!(
        another_node(&guard).await.shard_count(64).await.unwrap(),
        first
    );
    assert!(nodes[0].shard_count(0).await.is_err());
}

/// Heartbeats record each node's time; the live set is the nodes heard from at or after the
/// cutoff, sorted, including the caller; a node that leaves is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_the_live_set() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    // `Store` has a `heartbeat` too (an attempt's): name the trait.
    let beat = |node: &'static str, now, live_since| {
        let s = s.clone();
        async move {
            Cluster::heartbeat(&*s, node, now, live_since)
                .await
                .map(|v| v.into_iter().map(|m| m.node).collect::<Vec<_>>())
        }
    };
    // Each member comes with its last heartbeat's time.
    assert_eq!(
        Cluster::heartbeat(&*s, "z", t(900), t(0)).await.unwrap(),
        [sundial_store::Member {
            node: "z".into(),
            last_seen: t(900)
        }]
    );
    s.leave("z").await.unwrap();
    assert_eq!(beat("b", t(1_000), t(0)).await.unwrap(), ["b"]);
    assert_eq!(beat("a", t(2_000), t(1_500)).await.unwrap(), ["a"]);
    assert_eq!(beat("b", t(2_500), t(1_500)).await.unwrap(), ["a", "b"]);
    assert_eq!(
        beat("c", t(3_000), t(2_000)).await.unwrap(),
        ["a", "b", "c"],
        "a heartbeat exactly at the cutoff is live"
    );
    assert_eq!(beat("c", t(4_000), t(2_001)).await.unwrap(), ["b", "c"]);
    s.leave("b").await.unwrap();
    s.leave("nobody").await.unwrap();
    assert_eq!(beat("a", t(4_100), t(0)).await.unwrap(), ["a", "c"]);
}

/// `cluster_state` reads every node row by name and every lease row by shard as they stand:
/// heartbeats, holders, expiries and fencing numbers, a released lease without an owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_state_reads_the_membership_and_the_leases() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    assert_eq!(
        s.cluster_state().await.unwrap(),
        sundial_store::ClusterState::default()
    );
    Cluster::heartbeat(&*s, "b", t(1_000), t(0)).await.unwrap();
    Cluster::heartbeat(&*s, "a", t(2_000), t(0)).await.unwrap();
    let a0 = s
        .acquire_shard(0, "a", t(2_000), t(12_000))
        .await
        .unwrap()
        .unwrap();
    let b1 = s
        .acquire_shard(1, "b", t(1_000), t(11_000))
        .await
        .unwrap()
        .unwrap();
    s.release_shard(b1, "b").await.unwrap();
    let state = s.cluster_state().await.unwrap();
    assert_eq!(
        state.members,
        vec![
            sundial_store::Member {
                node: "a".into(),
                last_seen: t(2_000)
            },
            sundial_store::Member {
                node: "b".into(),
                last_seen: t(1_000)
            },
        ]
    );
    assert_eq!(
        state.leases,
        vec![
            sundial_store::ShardLease {
                shard: 0,
                owner: Some("a".into()),
                expires_at: t(12_000),
                range_id: a0.range_id,
            },
            sundial_store::ShardLease {
                shard: 1,
                owner: None,
                expires_at: t(0),
                range_id: b1.range_id + 1,
            },
        ]
    );
}

/// Acquire a free shard, renew it (same fence), be refused while another node holds it (also at
/// the exact expiry), take it over after expiry (higher fence); shards are independent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_and_take_over() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    let a1 = s.acquire_shard(0, "a", t(1_000), t(2_000)).await.unwrap();
    let a1 = a1.expect("a free shard is taken");
    assert_eq!(a1.shard, 0);
    assert_eq!(
        s.acquire_shard(0, "b", t(1_500), t(2_500)).await.unwrap(),
        None
    );
    let renewed = s.acquire_shard(0, "a", t(1_800), t(2_800)).await.unwrap();
    assert_eq!(renewed, Some(a1), "renewal keeps the fencing number");
    assert_eq!(
        s.acquire_shard(0, "b", t(2_800), t(3_800)).await.unwrap(),
        None,
        "a lease is valid through its expiry"
    );
    let b1 = s.acquire_shard(0, "b", t(2_801), t(3_801)).await.unwrap();
    let b1 = b1.expect("an expired lease is taken over");
    assert!(b1.range_id > a1.range_id, "{b1:?} after {a1:?}");
    assert_eq!(
        s.acquire_shard(0, "a", t(2_900), t(3_900)).await.unwrap(),
        None
    );
    // Renewing an expired lease nobody took keeps the number too.
    let b2 = s.acquire_shard(0, "b", t(5_000), t(6_000)).await.unwrap();
    assert_eq!(b2, Some(b1));
    // Another shard is its own lease.
    let other = s.acquire_shard(1, "a", t(5_000), t(6_000)).await.unwrap();
    assert_eq!(other.map(|f| f.shard), Some(1));
}

/// A released shard can be taken at once, with a higher fence, by another node or by its
/// previous owner; a release with a stale fence or by another node changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_then_another_takes_it() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    let a = s
        .acquire_shard(2, "a", t(1_000), t(10_000))
        .await
        .unwrap()
        .unwrap();
    s.release_shard(a, "b").await.unwrap();
    s.release_shard(
        Fence {
            shard: 2,
            range_id: a.range_id + 1,
        },
        "a",
    )
    .await
    .unwrap();
    assert_eq!(
        s.acquire_shard(2, "b", t(2_000), t(12_000)).await.unwrap(),
        None,
        "the wrong releases left a's lease alone"
    );
    s.release_shard(a, "a").await.unwrap();
    let b = s
        .acquire_shard(2, "b", t(2_000), t(12_000))
        .await
        .unwrap()
        .expect("a released shard is free before its old expiry");
    assert!(b.range_id > a.range_id);
    s.release_shard(b, "b").await.unwrap();
    let b2 = s
        .acquire_shard(2, "b", t(3_000), t(13_000))
        .await
        .unwrap()
        .unwrap();
    assert!(
        b2.range_id > b.range_id,
        "the previous owner gets a new fence after releasing"
    );
    // The released fence is dead even though nobody else holds the shard.
    let id = task_in_shard(&s, 2, 0).await;
    let r = s.claim_due(vec![run(id, 60_000)], t(4_000), Some(b)).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost { shard: 2 })),
        "{r:?}"
    );
}

/// A claim under a fence that was taken over is refused with `LeaseLost` and writes nothing;
/// under the current fence it succeeds; a fence only covers its own shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fenced_claim_is_refused_and_changes_nothing() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let b = another_node(&guard).await;
    let t = Timestamp;
    let shard = 3;
    let id = task_in_shard(&a, shard, 500).await;
    let other = task_in_shard(&a, 1, 500).await;
    let fa = a
        .acquire_shard(shard, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    let fb = b
        .acquire_shard(shard, "b", t(2_001), t(3_000))
        .await
        .unwrap()
        .unwrap();

    let r = a.claim_due(vec![run(id, 90_000)], t(2_500), Some(fa)).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost { shard: 3 })),
        "{r:?}"
    );
    let task = a.get(id).await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Scheduled);
    assert_eq!((task.attempt, task.execution_id), (0, None));
    let r = a.claim_due(vec![], t(2_500), Some(fa)).await;
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");

    // A fence for a shard that has no lease row at all.
    let none = Fence {
        shard: 0,
        range_id: 1,
    };
    let r = a
        .claim_due(vec![run(id, 90_000)], t(2_500), Some(none))
        .await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost { shard: 0 })),
        "{r:?}"
    );

    // The current owner claims; a task of another shard is not its to claim.
    let out = b
        .claim_due(
            vec![run(id, 90_000), run(other, 90_000)],
            t(2_500),
            Some(fb),
        )
        .await
        .unwrap();
    assert!(
        matches!(&out[0], ClaimOutcome::Started(t) if t.id == id),
        "{out:?}"
    );
    assert_eq!(out[1], ClaimOutcome::NotClaimable);
    assert_eq!(state(&a, other).await, TaskState::Scheduled);
}

/// A fenced claim that runs while a takeover of its shard is in flight waits for it and then
/// sees the new fencing number: refused, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_claim_waits_for_a_takeover_and_sees_it() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    let shard = 1;
    let id = task_in_shard(&a, shard, 0).await;
    let fa = a
        .acquire_shard(shard, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    // Another node's takeover, held open in a transaction of its own.
    let mut raw = raw_client(&guard.url).await;
    let tx = raw.transaction().await.unwrap();
    tx.execute(
        &format!(
            "UPDATE \"{}\".shard_leases SET owner = 'b', range_id = range_id + 1, \
             expires_at = 9000 WHERE shard = $1",
            guard.schema
        ),
        &[&i64::from(shard)],
    )
    .await
    .unwrap();
    let claim = {
        let a = a.clone();
        tokio::spawn(async move { a.claim_due(vec![run(id, 90_000)], t(1_500), Some(fa)).await })
    };
    // The claim blocks on the lease row for as long as the takeover is open.
    let watcher = raw_client(&guard.url).await;
    let fence_read = format!("%\"{}\".shard_leases%FOR SHARE%", guard.schema);
    let mut waiting = false;
    for _ in 0..200 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&fence_read],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(waiting, "the fenced claim waits for the takeover");
    assert!(!claim.is_finished());
    tx.commit().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), claim)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    assert_eq!(state(&a, id).await, TaskState::Scheduled);
}

/// A node stopped (SIGSTOP, a stall) in the middle of a fenced write keeps its transaction open,
/// and with it the share lock on its shard's lease row: without more, every takeover of that
/// shard (and the acquiring node's membership round) would wait for as long as the stop lasts.
/// The store's sessions end themselves when idle inside a transaction for longer than
/// `idle_in_transaction_timeout`, so PostgreSQL rolls the stalled write back, releases its locks,
/// and the takeover goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_fenced_write_does_not_hold_up_a_takeover() {
    let Some(url) = common::database_url() else {
        return;
    };
    let guard = TestSchema::new(&url);
    let t = Timestamp;
    let shard = 2;
    let stall = Duration::from_secs(6);
    // Node "a" runs on a runtime of its own, on a thread the test stops as SIGSTOP would.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (claim_tx, claim_rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    let node_a = {
        let url = format!(
            "{url}{}application_name=stalled_a",
            if url.contains('?') { '&' } else { '?' }
        );
        let schema = guard.schema.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let a = PostgresStore::connect(
                    &url,
                    sundial_store_postgres::PostgresOptions {
                        schema,
                        pool_size: 2,
                        idle_in_transaction_timeout: Some(Duration::from_secs(1)),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
                let fence = a
                    .acquire_shard(shard, "a", t(1_000), t(2_000))
                    .await
                    .unwrap()
                    .unwrap();
                let id = task_in_shard(&a, shard, 0).await;
                ready_tx.send((fence, id)).unwrap();
                claim_rx.await.unwrap();
                // A readying claim: a transaction. (A start of a task without a key, limit or
                // rate is one statement, which the server commits as soon as the row is free,
                // while the fence still holds, so it cannot be left open by a stop.)
                let ready = DueClaim {
                    id,
                    target: ClaimTarget::Ready,
                };
                let claim =
                    tokio::spawn(
                        async move { a.claim_due(vec![ready], t(1_500), Some(fence)).await },
                    );
                stop_rx.await.unwrap();
                // SIGSTOP: nothing of this node runs, its connections are not read.
                stopped_tx.send(()).unwrap();
                std::thread::sleep(stall);
                claim.await.unwrap()
            })
        })
    };
    let (fence, id) = ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    // The task row is locked elsewhere, so a's fenced claim (which has read its fence `FOR
    // SHARE`) waits on it.
    let mut raw = raw_client(&guard.url).await;
    let tx = raw.transaction().await.unwrap();
    tx.execute(
        &format!(
            "SELECT 1 FROM \"{}\".tasks WHERE id = $1 FOR UPDATE",
            guard.schema
        ),
        &[&id.0],
    )
    .await
    .unwrap();
    claim_tx.send(()).unwrap();
    let watcher = raw_client(&guard.url).await;
    let mut waiting = false;
    for _ in 0..200 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'stalled_a' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(waiting, "a's fenced claim waits for the task row");
    // a stops; then the row is released, a's statement completes, and its session sits idle in
    // the transaction, holding the lease row.
    stop_tx.send(()).unwrap();
    stopped_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    tx.rollback().await.unwrap();
    // b takes the shard over once a's lease has ended, well before a resumes.
    let b = another_node(&guard).await;
    let took = tokio::time::timeout(
        stall - Duration::from_secs(2),
        b.acquire_shard(shard, "b", t(2_001), t(3_001)),
    )
    .await
    .expect("the takeover waited for the stopped node")
    .unwrap()
    .expect("the shard is free to take");
    assert!(took.range_id > fence.range_id);
    // When a resumes, its write was rolled back: an error, and the task is untouched.
    let claimed = tokio::task::spawn_blocking(move || node_a.join().unwrap())
        .await
        .unwrap();
    assert!(claimed.is_err(), "{claimed:?}");
    assert_eq!(state(&b, id).await, TaskState::Scheduled);
}

/// Expiring leases under a stale fence is refused and changes nothing; under the current fence
/// it expires the shard's overdue attempts only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fenced_expire_changes_nothing() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let b = another_node(&guard).await;
    let t = Timestamp;
    let shard = 2;
    let id = task_in_shard(&a, shard, 0).await;
    let other = task_in_shard(&a, 0, 0).await;
    let started = a
        .claim_due(vec![run(id, 1_200), run(other, 1_100)], t(1_000), None)
        .await
        .unwrap();
    assert!(
        started
            .iter()
            .all(|o| matches!(o, ClaimOutcome::Started(_)))
    );
    assert_eq!(
        a.next_lease_expiry(Some(shard)).await.unwrap(),
        Some(t(1_200))
    );
    assert_eq!(a.next_lease_expiry(Some(0)).await.unwrap(), Some(t(1_100)));
    assert_eq!(a.next_lease_expiry(Some(3)).await.unwrap(), None);

    let fa = a
        .acquire_shard(shard, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    let fb = b
        .acquire_shard(shard, "b", t(2_001), t(4_000))
        .await
        .unwrap()
        .unwrap();
    let r = a.expire_leases(t(3_000), 10, Some(fa)).await;
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    let task = a.get(id).await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Running);
    assert_eq!(task.lease_expires_at, Some(t(1_200)));

    let expired = b.expire_leases(t(3_000), 10, Some(fb)).await.unwrap();
    assert_eq!(expired.iter().map(|t| t.id).collect::<Vec<_>>(), [id]);
    assert_eq!(expired[0].state, TaskState::Scheduled);
    assert_eq!(
        state(&a, other).await,
        TaskState::Running,
        "another shard's attempt is not this owner's to expire"
    );
    assert_eq!(a.next_lease_expiry(Some(shard)).await.unwrap(), None);
}

/// Many nodes acquiring one free shard at the same moment: exactly one gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquirers_one_wins() {
    let Some((first, guard)) = fresh_postgres().await else {
        return;
    };
    let mut nodes = vec![first];
    for _ in 0..5 {
        nodes.push(another_node(&guard).await);
    }
    for shard in 0..8u32 {
        let barrier = Arc::new(tokio::sync::Barrier::new(nodes.len() * 2));
        let mut handles = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            for j in 0..2 {
                let (n, barrier) = (n.clone(), barrier.clone());
                let name = format!("node-{i}-{j}");
                handles.push(tokio::spawn(async move {
                    barrier.wait().await;
                    n.acquire_shard(shard, &name, Timestamp(1_000), Timestamp(5_000))
                        .await
                        .unwrap()
                        .map(|f| (name, f))
                }));
            }
        }
        let mut winners = Vec::new();
        for h in handles {
            if let Some(w) = h.await.unwrap() {
                winners.push(w);
            }
        }
        assert_eq!(winners.len(), 1, "shard {shard}: {winners:?}");
        assert_eq!(winners[0].1.range_id, 1);
    }
}

/// Wake-ups of both kinds published by one node arrive at another's subscription, in order; a
/// large batch arrives whole (split over several notifications); a deployment in another
/// schema hears nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_subscribe_between_nodes() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let b = another_node(&guard).await;
    let mut from_a = b.subscribe().await.unwrap();
    let sent = vec![
        due(3, 1_700_000_000_000),
        Wakeup::Ready {
            queue: "emails".to_string(),
        },
    ];
    a.publish(sent.clone()).await.unwrap();
    assert_eq!(next(&mut from_a).await, sent[0]);
    assert_eq!(next(&mut from_a).await, sent[1]);

    let many: Vec<Wakeup> = (0..500).map(|i| due(i % 7, i64::from(i))).collect();
    a.publish(many.clone()).await.unwrap();
    for w in &many {
        assert_eq!(&next(&mut from_a).await, w);
    }
    a.publish(Vec::new()).await.unwrap();

    // Another schema: its own channel.
    let Some((elsewhere, _guard2)) = fresh_postgres().await else {
        return;
    };
    let mut there = elsewhere.subscribe().await.unwrap();
    let stray = due(0, 1);
    a.publish(vec![stray.clone()]).await.unwrap();
    let marker = Wakeup::Ready {
        queue: "marker".to_string(),
    };
    elsewhere.publish(vec![marker.clone()]).await.unwrap();
    assert_eq!(next(&mut there).await, marker);
    assert_eq!(next(&mut from_a).await, stray);
}

/// The subscription survives its connection being killed: it reconnects by itself and later
/// wake-ups arrive (those sent during the gap may be lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_reconnects_after_its_connection_dies() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let mut sub = a.subscribe().await.unwrap();
    let raw = raw_client(&guard.url).await;
    let listen = format!("LISTEN \"sundial_{}\"", guard.schema);
    let killed: i64 = raw
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1",
            &[&listen],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the listening connection was found and killed");
    let probe = Wakeup::Ready {
        queue: "after".to_string(),
    };
    let mut received = false;
    for _ in 0..100 {
        a.publish(vec![probe.clone()]).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
            Ok(Some(w)) => {
                assert_eq!(w, probe);
                received = true;
                break;
            }
            Ok(None) => panic!("the stream ended"),
            Err(_) => {}
        }
    }
    assert!(received, "wake-ups arrive again after a reconnect");
}

/// The database's clock agrees with this machine's (same host) to well within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // comparing against the wall clock is the point
async fn database_time_is_close_to_wall_time() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let before = wall();
    let db = s.database_time().await.unwrap().0;
    let after = wall();
    assert!(
        db >= before - 1_000 && db <= after + 1_000,
        "database {db}, wall {before}..{after}"
    );
}

/// `acquire_shards` answers shard by shard exactly as `acquire_shard` would, in one statement:
/// free shards are taken, its own renewed (same fence), another node's valid lease refused, an
/// expired one taken over (higher fence), and the answers come in the order asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_shards_at_once() {
    let Some((s, _guard)) = fresh_postgres().await else {
        return;
    };
    let t = Timestamp;
    let b0 = s
        .acquire_shard(0, "b", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    let b1 = s
        .acquire_shard(1, "b", t(1_000), t(5_000))
        .await
        .unwrap()
        .unwrap();
    let a2 = s
        .acquire_shard(2, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    // At 3,000: shard 0 is b's but expired, 1 is b's and valid, 2 is a's own, 3 was never taken.
    let got = s
        .acquire_shards(&[3, 2, 1, 0], "a", t(3_000), t(4_000))
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].map(|f| (f.shard, f.range_id)), Some((3, 1)));
    assert_eq!(got[1], Some(a2), "renewal keeps the fencing number");
    assert_eq!(got[2], None, "b's valid lease is refused");
    let taken = got[3].expect("an expired lease is taken over");
    assert_eq!(taken.shard, 0);
    assert!(taken.range_id > b0.range_id);
    // The renewal holds: b cannot take shard 2 before 4,000, and its own shard 1 is untouched.
    assert_eq!(
        s.acquire_shard(2, "b", t(3_500), t(4_500)).await.unwrap(),
        None
    );
    assert_eq!(
        s.acquire_shard(1, "b", t(3_500), t(5_500)).await.unwrap(),
        Some(b1)
    );
    assert!(
        s.acquire_shards(&[], "a", t(3_000), t(4_000))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Retention under a fence: a stale owner deletes nothing (`LeaseLost`); the current owner
/// deletes the expired finished tasks of its own shard only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fenced_purge_is_refused_and_deletes_nothing() {
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let b = another_node(&guard).await;
    let t = Timestamp;
    let shard = 1;
    let mine = task_in_shard(&a, shard, 0).await;
    let theirs = task_in_shard(&a, 2, 0).await;
    a.cancel(mine, t(100)).await.unwrap();
    a.cancel(theirs, t(100)).await.unwrap();
    let rules = sundial_store::RetentionRules {
        succeeded_ms: 10,
        cancelled_ms: 10,
        dead_ms: 10,
        queues: Default::default(),
    };
    let fa = a
        .acquire_shard(shard, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    let fb = b
        .acquire_shard(shard, "b", t(2_001), t(4_000))
        .await
        .unwrap()
        .unwrap();
    let r = a.purge_tasks(&rules, t(3_000), 10, Some(fa)).await;
    assert!(matches!(r, Err(StoreError::LeaseLost { .. })), "{r:?}");
    assert!(a.get(mine).await.unwrap().is_some(), "nothing deleted");
    assert_eq!(
        b.purge_tasks(&rules, t(3_000), 10, Some(fb)).await.unwrap(),
        1
    );
    assert!(a.get(mine).await.unwrap().is_none());
    assert!(
        a.get(theirs).await.unwrap().is_some(),
        "another shard's task is not this owner's to delete"
    );
}

/// Retention of closed workflow runs under shard 0's fence: a stale holder deletes nothing
/// (`LeaseLost`); the current holder deletes the closed run and never the running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fenced_workflow_purge_is_refused_and_deletes_nothing() {
    use sundial_core::RunId;
    use sundial_store::{IdReusePolicy, NewEvent, NewRun, TerminateOp, WorkflowStore};
    let Some((a, guard)) = fresh_postgres().await else {
        return;
    };
    let b = another_node(&guard).await;
    let t = Timestamp;
    let start = |id: &str| {
        let run_id = RunId(uuid::Uuid::now_v7());
        NewRun {
            workflow_id: id.to_string(),
            run_id,
            workflow_type: "order".into(),
            input: "{}".into(),
            parent: None,
            continued_from: None,
            started: NewEvent {
                at: t(0),
                data: "{}".into(),
            },
            first_task: TaskSpec::new("workflow/order")
                .queue(sundial_store::WORKFLOW_QUEUE)
                .validate(
                    TaskId(uuid::Uuid::now_v7()),
                    t(0),
                    SHARDS,
                    &Limits::default(),
                )
                .unwrap(),
            now: t(0),
        }
    };
    let closed = start("closed");
    let open = start("open");
    a.start_run(closed.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .unwrap();
    a.start_run(open.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .unwrap();
    a.terminate(TerminateOp {
        run_id: closed.run_id,
        event: NewEvent {
            at: t(100),
            data: "{}".into(),
        },
        reason: "done".into(),
        parent: None,
        now: t(100),
    })
    .await
    .unwrap();
    let fa = a
        .acquire_shard(0, "a", t(1_000), t(2_000))
        .await
        .unwrap()
        .unwrap();
    let fb = b
        .acquire_shard(0, "b", t(2_001), t(4_000))
        .await
        .unwrap()
        .unwrap();
    let r = a.purge_closed_runs(t(3_000), 10, Some(fa)).await;
    assert!(
        matches!(r, Err(StoreError::LeaseLost { shard: 0 })),
        "{r:?}"
    );
    assert!(
        a.get_run(closed.run_id).await.unwrap().is_some(),
        "nothing deleted"
    );
    assert_eq!(
        b.purge_closed_runs(t(3_000), 10, Some(fb)).await.unwrap(),
        1
    );
    assert!(a.get_run(closed.run_id).await.unwrap().is_none());
    assert!(
        a.get_run(open.run_id).await.unwrap().is_some(),
        "a running run stays"
    );
    assert_eq!(
        b.purge_closed_runs(Timestamp::MAX, 10, Some(fb))
            .await
            .unwrap(),
        0
    );
}
