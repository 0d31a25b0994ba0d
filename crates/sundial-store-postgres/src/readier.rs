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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sundial_core::{Task, Timestamp};
use sundial_store::{ClaimOutcome, DueClaim, Fence, StoreError};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::PostgresStore;
use crate::lanes::{self, GroupCall, Lanes};
use crate::rows::{col, task_from_row};

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
            // The rows the group locked when none has an exclusive key or a rate limit: then
            // one statement readies them all.
            let mut plain: Option<HashSet<Uuid>> = None;
            // Whether every call's fence was checked against the lease rows the group locked.
            let mut fences_checked = false;
            if group.len() > 1 {
                // The calls' fences, share-locked in shard order first: checked call by call,
                // they would be locked in the calls' order, and a node renewing its leases
                // (which locks them in shard order) could then wait for one this group holds
                // while the group waits for one it renewed, a deadlock (BENCHMARKS.md, "a
                // deadlock between grouped fences and lease renewal"). The same read checks
                // every call's fence, where a statement per call did.
                let mut shards: Vec<i64> = group
                    .iter()
                    .filter_map(|c| c.fence.map(|f| i64::from(f.shard)))
                    .collect();
                shards.sort_unstable();
                shards.dedup();
                if !shards.is_empty() {
                    let mut ranges = HashMap::with_capacity(shards.len());
                    for r in crate::query(&tx, &self.sql.cluster.lock_fences, &[&shards]).await? {
                        ranges.insert(col::<i64>(&r, 0)?, col::<i64>(&r, 1)?);
                    }
                    for f in group.iter().filter_map(|c| c.fence) {
                        if ranges.get(&i64::from(f.shard)) != Some(&f.range_id) {
                            return Err(StoreError::LeaseLost { shard: f.shard });
                        }
                    }
                }
                fences_checked = true;
                // Every row any call may claim, locked in one id order first.
                let mut ids: Vec<Uuid> = group
                    .iter()
                    .flat_map(|c| c.claims.iter().map(|d| d.id.0))
                    .collect();
                ids.sort_unstable();
                let claims = ids.len();
                ids.dedup();
                let latest = group.iter().map(|c| c.now.0).max().unwrap_or(i64::MIN);
                let locked = crate::query(&tx, &self.sql.lock_claimable, &[&ids, &latest]).await?;
                plain = plain_rows(&locked, ids.len() == claims)?;
            }
            let outcomes = match plain {
                Some(locked) => self.ready_each_in(&tx, &group, &locked).await?,
                None => {
                    let mut outcomes = Vec::with_capacity(group.len());
                    for call in &group {
                        if let Some(f) = call.fence.filter(|_| !fences_checked) {
                            self.check_fence(&tx, f).await?;
                        }
                        outcomes.push(
                            self.claim_due_in(
                                &tx,
                                &call.claims,
                                call.now,
                                call.fence.map(|f| f.shard),
                            )
                            .await?,
                        );
                    }
                    outcomes
                }
            };
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

    /// The calls of a group whose locked rows (`locked`) are all plain, decided together: each
    /// claim is readied when its row is locked, due by its call's `now` and of its call's
    /// shard, exactly what `claim_due_in` decides for it alone (a plain task holds no key and
    /// no rate limit, so no claim's outcome depends on another's). One `UPDATE` for the whole
    /// group, where the calls one by one took a row-locking read and an update each.
    async fn ready_each_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        group: &[Call],
        locked: &HashSet<Uuid>,
    ) -> Result<Vec<Vec<ClaimOutcome>>, StoreError> {
        let (mut ids, mut nows, mut shards) = (Vec::new(), Vec::new(), Vec::new());
        for call in group {
            for claim in call.claims.iter().filter(|c| locked.contains(&c.id.0)) {
                ids.push(claim.id.0);
                nows.push(call.now.0);
                shards.push(call.fence.map(|f| i64::from(f.shard)));
            }
        }
        let mut readied: HashMap<Uuid, Task> = HashMap::new();
        if !ids.is_empty() {
            for r in crate::query(tx, &self.sql.ready_each, &[&ids, &nows, &shards]).await? {
                let t = task_from_row(&r)?;
                readied.insert(t.id.0, t);
            }
        }
        Ok(group
            .iter()
            .map(|call| {
                call.claims
                    .iter()
                    .map(|c| match readied.remove(&c.id.0) {
                        Some(t) => ClaimOutcome::Readied(Box::new(t)),
                        None => ClaimOutcome::NotClaimable,
                    })
                    .collect()
            })
            .collect())
    }
}

/// The ids of `locked` (rows of `lock_claimable`) when the group may be readied in one
/// statement: no claim named twice (`distinct`) and no locked task with an exclusive key or a
/// rate limit (their readies can be refused by the calls before them). `None` otherwise.
fn plain_rows(
    locked: &[tokio_postgres::Row],
    distinct: bool,
) -> Result<Option<HashSet<Uuid>>, StoreError> {
    if !distinct {
        return Ok(None);
    }
    let mut ids = HashSet::with_capacity(locked.len());
    for r in locked {
        let key: Option<String> = col(r, 1)?;
        let rate: Option<String> = col(r, 5)?;
        if key.is_some() || rate.is_some() {
            return Ok(None);
        }
        ids.insert(col(r, 0)?);
    }
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {

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

    /// Counts the `UPDATE` statements on `tasks` from here on (a statement trigger of the
    /// test's own): [`updates`] reads the count.
    async fn count_updates(store: &PostgresStore) {
        let s = &store.schema.ident;
        let client = store.client().await.expect("client");
        client
            .batch_execute(&format!(
                "CREATE TABLE {s}.update_statements (n bigint NOT NULL); \
                 INSERT INTO {s}.update_statements VALUES (0); \
                 CREATE FUNCTION {s}.count_update() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN UPDATE {s}.update_statements SET n = n + 1; RETURN NULL; END $$; \
                 CREATE TRIGGER count_update AFTER UPDATE ON {s}.tasks \
                 FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_update()"
            ))
            .await
            .expect("count updates");
    }

    async fn updates(store: &PostgresStore) -> i64 {
        let client = store.client().await.expect("client");
        let sql = format!("SELECT n FROM {}.update_statements", store.schema.ident);
        client.query_one(&sql, &[]).await.expect("updates").get(0)
    }

    /// A group of calls whose tasks hold no exclusive key and no rate limit is readied by one
    /// statement, not one per call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_of_plain_calls_is_readied_by_one_statement() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let ids = scheduled(&store, 8, now).await;
        count_updates(&store).await;
        let out = queued_calls(&store, &ids, &[], now).await;
        for (out, id) in out.into_iter().zip(&ids) {
            let out = out.expect("claim_due");
            assert!(
                matches!(&out[..], [ClaimOutcome::Readied(t)] if t.id == *id),
                "{out:?}"
            );
        }
        let n = updates(&store).await;
        assert!(n <= 2, "8 calls in at most 2 groups took {n} updates");
    }

    /// In a group readied together, each claim is decided by its own call's time and fence: a
    /// task not yet due by its call's time, or of a shard other than its call's fence, stays
    /// scheduled, while the same group readies the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_readied_together_keeps_each_calls_time_and_shard() {
        use sundial_store::Cluster;
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let later = Timestamp(now.0 + 1_000);
        let fences = store
            .acquire_shards(&[2], "node", now, Timestamp(now.0 + 60_000))
            .await
            .expect("acquire");
        let Some(f2) = fences[0] else {
            panic!("{fences:?}");
        };
        let due_later = scheduled(&store, 2, later).await;
        let mut of_shard = HashMap::new();
        for id in scheduled(&store, 200, now).await {
            let t = store.get(id).await.expect("get").expect("task");
            of_shard.entry(t.shard).or_insert(id);
        }
        let (in2, in5) = (of_shard[&2], of_shard[&5]);
        // (task, the call's time, its fence, readied?)
        let cases = [
            (due_later[0], now, None, false),
            (due_later[1], Timestamp(later.0 + 1), None, true),
            (in5, now, Some(f2), false),
            (in2, now, Some(f2), true),
        ];
        count_updates(&store).await;
        let calls = cases
            .iter()
            .map(|&(id, at, fence, _)| {
                let store = store.clone();
                async move { store.claim_due(ready(id), at, fence).await }
            })
            .collect();
        let out = crate::run_queued(&store, calls).await;
        for ((id, _, _, readied), out) in cases.iter().zip(out) {
            let out = out.expect("claim_due");
            let t = store.get(*id).await.expect("get").expect("task");
            if *readied {
                assert!(matches!(&out[..], [ClaimOutcome::Readied(_)]), "{out:?}");
                assert_eq!(t.state, sundial_core::TaskState::Ready);
            } else {
                assert!(matches!(&out[..], [ClaimOutcome::NotClaimable]), "{out:?}");
                assert_eq!(t.state, sundial_core::TaskState::Scheduled);
            }
        }
        assert!(updates(&store).await <= 2, "readied in groups");
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
