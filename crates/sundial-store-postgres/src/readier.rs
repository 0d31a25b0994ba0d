//! Group readying: concurrent `claim_due` calls that only make tasks ready share one transaction.
//!
//! A shard loop whose due tasks go to remote workers claims them `scheduled → ready`. With tasks
//! coming due one at a time across many shards, each loop wakes for about one task and claims
//! it in a transaction of its own (`BEGIN`, the shard's fence, the row locks, the update,
//! `COMMIT`): at 1,000 tasks a second that is 1,000 commits a second, and the commits are what
//! the database cannot keep up with (BENCHMARKS.md, "Why lateness did not move"). So such a call
//! queues in one lane (`lanes.rs`), and the lane's group runs every queued call in one
//! transaction: each call's fence checked, each call's claims decided by `claim_due_in` exactly
//! as its own transaction would have, one commit for all. Nothing waits for company: an idle
//! store's call runs at once, as a group of one.
//!
//! Only small calls are grouped (at most [`MAX_GROUPED_CALL`] claims): a larger one pays its
//! commit over many tasks already, and large calls of several shard loops (a burst coming due)
//! ready faster side by side, each on its own connection, than one after another in a lane.
//! Only calls whose every claim targets `ready` are grouped. A call that starts tasks takes
//! exclusive-key and queue locks, which it must take in one sorted order; it runs alone, as
//! before. Before the calls run, the group locks every claimable row of all of them in one id
//! order, as a single call does for its own rows, so a group waits for row locks in the order
//! anyone else does; and the group share-locks the lease rows of the calls' fences in shard order
//! before any call checks its fence, the order a node renewing its leases locks them in. Should
//! the group fail (a fence lost, a deadlock the database broke), each
//! call runs again on its own, so one call's error is never another's.

use std::sync::Arc;

use sundial_core::Timestamp;
use sundial_store::{ClaimOutcome, DueClaim, Fence, StoreError};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::PostgresStore;
use crate::lanes::{self, GroupCall, Lanes};

/// Most claims of a call that is grouped; a larger call runs on its own.
pub(crate) const MAX_GROUPED_CALL: usize = 16;

/// Most claims one group carries (a call with more still runs, alone).
pub(crate) const MAX_GROUP_CLAIMS: usize = 1024;

pub(crate) struct Call {
    claims: Vec<DueClaim>,
    now: Timestamp,
    fence: Option<Fence>,
    reply: oneshot::Sender<Result<Vec<ClaimOutcome>, StoreError>>,
}

/// The readying calls waiting for a group (one lane), shared by the clones of one store.
pub(crate) type SharedReadier = Arc<Lanes<(), Call>>;

impl GroupCall for Call {
    type Answer = Vec<ClaimOutcome>;
    const WORK: &'static str = "ready group";

    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl std::future::Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send {
        store.ready_together(group)
    }

    fn into_reply(self) -> oneshot::Sender<Result<Vec<ClaimOutcome>, StoreError>> {
        self.reply
    }
}

impl PostgresStore {
    /// [`sundial_store::Store::claim_due`] through the group readier, for `claims` that all
    /// target `ready` (at least one).
    pub(crate) async fn claim_due_ready_grouped(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        lanes::submit(
            self,
            &self.readier,
            (),
            |reply| Call {
                claims,
                now,
                fence,
                reply,
            },
            MAX_GROUP_CLAIMS,
            |c| c.claims.len(),
        )
        .await
    }

    /// Runs every call of `group` in one transaction and answers each with its outcomes; on
    /// failure nothing is answered and the calls come back with the error.
    async fn ready_together(&self, group: Vec<Call>) -> Result<(), (StoreError, Vec<Call>)> {
        let done = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(crate::pg)?;
            if group.len() > 1 {
                // The calls' fences, share-locked in shard order first: checked call by call,
                // they would be locked in the calls' order, and a node renewing its leases
                // (which locks them in shard order) could then wait for one this group holds
                // while the group waits for one it renewed, a deadlock (BENCHMARKS.md, "a
                // deadlock between grouped fences and lease renewal").
                let mut shards: Vec<i64> = group
                    .iter()
                    .filter_map(|c| c.fence.map(|f| i64::from(f.shard)))
                    .collect();
                shards.sort_unstable();
                shards.dedup();
                if shards.len() > 1 {
                    crate::query(&tx, &self.sql.cluster.lock_fences, &[&shards]).await?;
                }
                // Every row any call may claim, locked in one id order first.
                let mut ids: Vec<Uuid> = group
                    .iter()
                    .flat_map(|c| c.claims.iter().map(|d| d.id.0))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                let latest = group.iter().map(|c| c.now.0).max().unwrap_or(i64::MIN);
                crate::query(&tx, &self.sql.lock_claimable, &[&ids, &latest]).await?;
            }
            let mut outcomes = Vec::with_capacity(group.len());
            for call in &group {
                if let Some(f) = call.fence {
                    self.check_fence(&tx, f).await?;
                }
                outcomes.push(
                    self.claim_due_in(&tx, &call.claims, call.now, call.fence.map(|f| f.shard))
                        .await?,
                );
            }
            tx.commit().await.map_err(crate::pg)?;
            Ok::<_, StoreError>(outcomes)
        }
        .await;
        let outcomes = match done {
            Ok(o) => o,
            Err(e) => return Err((e, group)),
        };
        for (call, out) in group.into_iter().zip(outcomes) {
            let _ = call.reply.send(Ok(out));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sundial_core::{TaskId, TaskSpec};
    use sundial_store::{ClaimTarget, Store};

    use super::*;
    use crate::testkit;

    async fn scheduled(store: &PostgresStore, n: usize, now: Timestamp) -> Vec<TaskId> {
        crate::insert_due(
            store,
            (0..n).map(|_| TaskSpec::new("k").queue("q")).collect(),
            now,
        )
        .await
    }

    fn ready(id: TaskId) -> Vec<DueClaim> {
        vec![DueClaim {
            id,
            target: ClaimTarget::Ready,
        }]
    }

    /// `claim_due` of one task each for `ids`, all queued while the store's one connection is
    /// held; `fenced` names the calls given a lost fence (no lease of shard 9 exists).
    async fn queued_calls(
        store: &PostgresStore,
        ids: &[TaskId],
        fenced: &[usize],
        now: Timestamp,
    ) -> Vec<Result<Vec<ClaimOutcome>, StoreError>> {
        let calls = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let store = store.clone();
                let fence = fenced.contains(&i).then_some(Fence {
                    shard: 9,
                    range_id: 1,
                });
                async move { store.claim_due(ready(id), now, fence).await }
            })
            .collect();
        crate::run_queued(store, calls).await
    }

    async fn xmin(store: &PostgresStore, id: TaskId) -> String {
        crate::xmin(store, "tasks", "id", &id.0).await
    }

    /// Readying calls that arrive while one is under way share a transaction, and each gets
    /// its own outcomes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readying_calls_share_a_transaction() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let ids = scheduled(&store, 8, now).await;
        let out = queued_calls(&store, &ids, &[], now).await;
        let mut xacts = HashSet::new();
        for (out, id) in out.into_iter().zip(&ids) {
            let out = out.expect("claim_due");
            assert!(
                matches!(&out[..], [ClaimOutcome::Readied(t)] if t.id == *id),
                "{out:?}"
            );
            xacts.insert(xmin(&store, *id).await);
        }
        assert!(
            xacts.len() <= 2,
            "8 calls took {} transactions",
            xacts.len()
        );
    }

    /// A call whose fence is lost fails alone: the others of its group are readied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_fence_fails_only_its_own_call() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let ids = scheduled(&store, 4, now).await;
        let out = queued_calls(&store, &ids, &[2], now).await;
        for (i, (out, id)) in out.into_iter().zip(&ids).enumerate() {
            let t = store.get(*id).await.expect("get").expect("task");
            if i == 2 {
                assert!(
                    matches!(out, Err(StoreError::LeaseLost { shard: 9 })),
                    "{out:?}"
                );
                assert_eq!(t.state, sundial_core::TaskState::Scheduled);
            } else {
                assert!(
                    matches!(out.as_deref(), Ok([ClaimOutcome::Readied(_)])),
                    "{out:?}"
                );
                assert_eq!(t.state, sundial_core::TaskState::Ready);
            }
        }
    }

    /// Waits (up to 5 s) until `n` backends of the test database wait for a lock.
    async fn lock_waiters(client: &tokio_postgres::Client, n: i64) {
        for _ in 0..500 {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity");
            if row.get::<_, i64>(0) >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{n} lock waiters never showed");
    }

    /// A group whose calls fence two shards, in the order the calls came (shard 5, then 2),
    /// beside a node renewing both leases (which locks them in shard order): the group takes
    /// its fences in shard order too, so neither waits for the other in a cycle. (Checked call
    /// by call, the group held shard 5's lease row and waited for shard 2's, which the renewal
    /// held while it waited for shard 5's: PostgreSQL broke the deadlock by failing one of
    /// them, here the renewal, whose `deadlock_timeout` is the shorter.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_fences_do_not_deadlock_with_a_lease_renewal() {
        use sundial_store::Cluster;
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let sep = if test.url.contains('?') { '&' } else { '?' };
        let renewing = crate::connect_with_one_connection(
            &format!("{}{sep}options=-c%20deadlock_timeout%3D100", test.url),
            &test.schema,
        )
        .await;
        let now = Timestamp(1_700_000_000_000);
        let until = Timestamp(now.0 + 60_000);
        let fences = store
            .acquire_shards(&[2, 5], "node", now, until)
            .await
            .expect("acquire");
        let (Some(f2), Some(f5)) = (fences[0], fences[1]) else {
            panic!("{fences:?}");
        };
        // A task of shard 5, one of shard 2, and one more for the call that runs first.
        let ids = scheduled(&store, 200, now).await;
        let mut of_shard = std::collections::HashMap::new();
        for id in &ids {
            let t = store.get(*id).await.expect("get").expect("task");
            of_shard.entry(t.shard).or_insert(*id);
        }
        let (in2, in5) = (of_shard[&2], of_shard[&5]);
        let first = *ids
            .iter()
            .find(|id| **id != in2 && **id != in5)
            .expect("a third");

        let (raw, conn) = tokio_postgres::connect(&test.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        // Shard 2's lease row is held, so the renewal waits there, holding nothing yet.
        raw.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {}.shard_leases WHERE shard = 2 FOR UPDATE",
            store.schema.ident
        ))
        .await
        .expect("hold shard 2");
        let renewal = tokio::spawn(async move {
            renewing
                .acquire_shards(&[2, 5], "node", now, Timestamp(until.0 + 1))
                .await
        });
        lock_waiters(&raw, 1).await;
        // The group: a first call runs alone; the two fenced calls queue behind it, shard 5's
        // first.
        let held = store.client().await.expect("client");
        let call = |id: TaskId, fence: Option<Fence>| {
            let store = store.clone();
            tokio::spawn(async move { store.claim_due(ready(id), now, fence).await })
        };
        let mut calls = Vec::new();
        for (id, fence) in [(first, None), (in5, Some(f5)), (in2, Some(f2))] {
            calls.push(call(id, fence));
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        drop(held);
        lock_waiters(&raw, 2).await;
        raw.batch_execute("COMMIT").await.expect("commit");
        let renewed = renewal.await.expect("join");
        assert!(renewed.is_ok(), "the renewal failed: {renewed:?}");
        for c in calls {
            let out = c.await.expect("join").expect("claim_due");
            assert!(matches!(&out[..], [ClaimOutcome::Readied(_)]), "{out:?}");
        }
    }

    /// A call with more claims than [`MAX_GROUPED_CALL`] runs on its own, beside the lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_call_is_not_grouped() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let ids = scheduled(&store, MAX_GROUPED_CALL + 1, now).await;
        let before = store.readier.groups();
        let claims: Vec<DueClaim> = ids.iter().flat_map(|&id| ready(id)).collect();
        let out = store.claim_due(claims, now, None).await.expect("claim_due");
        assert!(out.iter().all(|o| matches!(o, ClaimOutcome::Readied(_))));
        assert_eq!(store.readier.groups(), before, "no group ran");
        let small: Vec<TaskId> = scheduled(&store, 1, now).await;
        store
            .claim_due(ready(small[0]), now, None)
            .await
            .expect("claim_due");
        assert_eq!(
            store.readier.groups(),
            before + 1,
            "a small call is grouped"
        );
    }
}
