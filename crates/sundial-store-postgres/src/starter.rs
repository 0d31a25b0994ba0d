//! Group starts: the plain starts of concurrent `claim_due` calls share one statement.
//!
//! A shard loop that hands a due task to a waiting poll starts it (`scheduled → running`) with
//! `start_plain`: one statement and one commit for the tasks without an exclusive key or a rate
//! limit, in queues without a limit. With tasks coming due one at a time across many shards,
//! each loop starts about one task per statement, and at 1,000 tasks a second those statements
//! are half of what the database does (BENCHMARKS.md, "Where PostgreSQL's time goes in the
//! lateness row"). So such a call queues in one lane (`lanes.rs`), and the lane's group starts
//! the claims of every queued call in one statement (`start_plain_group` in `sql.rs`): each
//! claim is started only when its own call's fence holds, the rows are locked in one id order,
//! the fences in shard order (the order a node renewing its leases locks them in), and the
//! record of each call that started a task commits with it. Nothing waits for company: an idle
//! store's call runs at once, as a group of one.
//!
//! Each call gets what `start_plain` would have given it alone: the tasks started under its
//! execution ids and its record's `seq`, or `LeaseLost` when its fence did not hold (then
//! nothing of it was started). What a call's plain start left (keys, rate limits, limited
//! queues) goes on to the full claim in the call's own transaction, as before. Should the
//! group's statement fail, each call runs again on its own, so one call's error is never
//! another's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sundial_core::{Task, Timestamp};
use sundial_store::{ClaimTarget, DueClaim, Fence, NewAuditRecord, StoreError};
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::PostgresStore;
use crate::access::AuditArrays;
use crate::lanes::{self, GroupCall, Lanes};
use crate::rows::{col, task_from_row};

/// Most claims one group starts (a call with more still runs, alone).
pub(crate) const MAX_GROUP_CLAIMS: usize = 1024;

/// What a plain start gave one call: the tasks started (by id) and its record's `seq` when the
/// record went in.
pub(crate) type PlainStarts = (HashMap<Uuid, Task>, Option<i64>);

pub(crate) struct Call {
    claims: Vec<DueClaim>,
    now: Timestamp,
    fence: Option<Fence>,
    /// The request's record, inserted when the call started a task; the caller keeps the
    /// claim on it and marks it written with the `seq` answered.
    audit: Option<NewAuditRecord>,
    reply: oneshot::Sender<Result<PlainStarts, StoreError>>,
}

/// The plain starts waiting for a group (one lane), shared by the clones of one store.
pub(crate) type SharedStarter = Arc<Lanes<(), Call>>;

impl GroupCall for Call {
    type Answer = PlainStarts;
    const WORK: &'static str = "start group";

    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl std::future::Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send {
        store.start_together(group)
    }

    fn into_reply(self) -> oneshot::Sender<Result<PlainStarts, StoreError>> {
        self.reply
    }
}

/// One claim of a group: the row it names and what starting it writes.
struct Row<'a> {
    id: Uuid,
    execution: Uuid,
    lease_until: i64,
    worker: Option<&'a str>,
    fence: Option<Fence>,
    call: Uuid,
}

impl PostgresStore {
    /// The plain start of `claims` (all starts of distinct tasks) through the group starter:
    /// what [`PostgresStore::start_plain`] does for one call.
    pub(crate) async fn start_plain_grouped(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
        audit: Option<NewAuditRecord>,
    ) -> Result<PlainStarts, StoreError> {
        lanes::submit(
            self,
            &self.starter,
            (),
            |reply| Call {
                claims,
                now,
                fence,
                audit,
                reply,
            },
            MAX_GROUP_CLAIMS,
            |c| c.claims.len(),
        )
        .await
    }

    /// Starts the plain claims of every call of `group` in one statement and answers each call;
    /// on failure nothing is answered and the calls come back with the error.
    async fn start_together(&self, group: Vec<Call>) -> Result<(), (StoreError, Vec<Call>)> {
        let done = self.start_group_statement(&group).await;
        let (mut started, held, seqs) = match done {
            Ok(d) => d,
            Err(e) => return Err((e, group)),
        };
        for (i, call) in group.into_iter().enumerate() {
            let answer = match call.fence {
                Some(f) if !held.contains(&(i64::from(f.shard), f.range_id)) => {
                    Err(StoreError::LeaseLost { shard: f.shard })
                }
                _ => Ok((
                    started.remove(&i).unwrap_or_default(),
                    seqs.get(&i).copied(),
                )),
            };
            let _ = call.reply.send(answer);
        }
        Ok(())
    }

    /// The group's statement: the tasks started by call (index), the fences that held and the
    /// records' `seq`s by call.
    #[allow(clippy::type_complexity)]
    async fn start_group_statement(
        &self,
        group: &[Call],
    ) -> Result<
        (
            HashMap<usize, HashMap<Uuid, Task>>,
            HashSet<(i64, i64)>,
            HashMap<usize, i64>,
        ),
        StoreError,
    > {
        let mut rows: Vec<Row<'_>> = Vec::new();
        // A call is named by its first execution id; each task started goes to the call whose
        // execution id it was started under.
        let mut call_of_execution: HashMap<Uuid, usize> = HashMap::new();
        let mut linked: Vec<(Uuid, &NewAuditRecord)> = Vec::new();
        let mut audited: Vec<usize> = Vec::new();
        for (i, call) in group.iter().enumerate() {
            let mut key = None;
            for c in &call.claims {
                if let ClaimTarget::Run {
                    execution,
                    lease_until,
                    worker,
                } = &c.target
                {
                    let k = *key.get_or_insert(execution.0);
                    call_of_execution.insert(execution.0, i);
                    rows.push(Row {
                        id: c.id.0,
                        execution: execution.0,
                        lease_until: lease_until.0,
                        worker: worker.as_deref(),
                        fence: call.fence,
                        call: k,
                    });
                }
            }
            if let (Some(k), Some(a)) = (key, &call.audit) {
                linked.push((k, a));
                audited.push(i);
            }
        }
        rows.sort_unstable_by_key(|r| r.id);
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let execs: Vec<Uuid> = rows.iter().map(|r| r.execution).collect();
        let leases: Vec<i64> = rows.iter().map(|r| r.lease_until).collect();
        let workers: Vec<Option<&str>> = rows.iter().map(|r| r.worker).collect();
        let shards: Vec<Option<i64>> = rows
            .iter()
            .map(|r| r.fence.map(|f| i64::from(f.shard)))
            .collect();
        let ranges: Vec<Option<i64>> = rows.iter().map(|r| r.fence.map(|f| f.range_id)).collect();
        let calls: Vec<Uuid> = rows.iter().map(|r| r.call).collect();
        // The group starts at the latest `now` of its calls, a time every one of them has
        // reached.
        let now = group.iter().map(|c| c.now.0).max().unwrap_or(i64::MIN);
        let arrays = AuditArrays::new(&linked);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &ids, &execs, &leases, &now, &workers, &shards, &ranges, &calls,
        ];
        params.extend(arrays.params());
        let client = self.client().await?;
        let result = crate::query(&client, &self.sql.start_plain_group, &params).await?;
        let Some(first) = result.first() else {
            return Err(StoreError::corrupt("the group start returned no row"));
        };
        let n = first.len();
        let held_shards: Vec<i64> = col::<Option<Vec<i64>>>(first, n - 3)?.unwrap_or_default();
        let held_ranges: Vec<i64> = col::<Option<Vec<i64>>>(first, n - 2)?.unwrap_or_default();
        let seqs: Vec<i64> = col::<Option<Vec<i64>>>(first, n - 1)?.unwrap_or_default();
        let mut started: HashMap<usize, HashMap<Uuid, Task>> = HashMap::new();
        let mut calls_started: HashSet<usize> = HashSet::new();
        for r in &result {
            if col::<Option<Uuid>>(r, 0)?.is_none() {
                continue;
            }
            let t = task_from_row(r)?;
            let Some(&i) = t.execution_id.and_then(|e| call_of_execution.get(&e.0)) else {
                return Err(StoreError::corrupt(
                    "the group start started a task under no call's execution id",
                ));
            };
            calls_started.insert(i);
            started.entry(i).or_default().insert(t.id.0, t);
        }
        // The records went in for the calls that started a task, in call order.
        let audited: Vec<usize> = audited
            .into_iter()
            .filter(|i| calls_started.contains(i))
            .collect();
        let seqs = lanes::pair_audit_seqs("start group", audited, seqs)
            .into_iter()
            .collect();
        let held = held_shards.into_iter().zip(held_ranges).collect();
        Ok((started, held, seqs))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sundial_core::{ExecutionId, TaskId, TaskSpec, TaskState};
    use sundial_store::{ClaimOutcome, Cluster, Store};

    use super::*;
    use crate::testkit;

    const NOW: Timestamp = Timestamp(1_700_000_000_000);

    fn start(id: TaskId, worker: &str) -> Vec<DueClaim> {
        vec![DueClaim {
            id,
            target: ClaimTarget::Run {
                execution: ExecutionId(Uuid::now_v7()),
                lease_until: Timestamp(NOW.0 + 30_000),
                worker: Some(worker.to_string()),
            },
        }]
    }

    /// Plain starts that arrive while one is under way share a statement; each call gets its
    /// own task, started under its own execution id, and a call whose fence does not hold
    /// (shard `lost`, or a stale `range_id`) gets `LeaseLost` and starts nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_starts_share_a_statement_and_a_lost_fence_fails_only_its_call() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let ids = crate::insert_due(
            &store,
            (0..200).map(|_| TaskSpec::new("k").queue("q")).collect(),
            NOW,
        )
        .await;
        let mut of_shard = std::collections::HashMap::new();
        for id in &ids {
            let t = store.get(*id).await.expect("get").expect("task");
            of_shard.entry(t.shard).or_insert(*id);
        }
        let fences = store
            .acquire_shards(&[1, 2, 3], "node", NOW, Timestamp(NOW.0 + 60_000))
            .await
            .expect("acquire");
        let [Some(f1), Some(f2), Some(f3)] = fences[..] else {
            panic!("{fences:?}");
        };
        let stale = Fence {
            range_id: f3.range_id + 1,
            ..f3
        };
        // Unfenced, shard 1, shard 2, shard 3 with a stale range, and two more unfenced.
        let unfenced: Vec<TaskId> = ids
            .iter()
            .copied()
            .filter(|id| ![1, 2, 3].iter().any(|s| of_shard.get(s) == Some(id)))
            .take(3)
            .collect();
        let plan: Vec<(TaskId, Option<Fence>)> = vec![
            (unfenced[0], None),
            (of_shard[&1], Some(f1)),
            (of_shard[&2], Some(f2)),
            (of_shard[&3], Some(stale)),
            (unfenced[1], None),
            (unfenced[2], None),
        ];
        let calls = plan
            .iter()
            .enumerate()
            .map(|(i, &(id, fence))| {
                let store = store.clone();
                async move {
                    let claims = start(id, &format!("w{i}"));
                    let out = store.claim_due(claims.clone(), NOW, fence).await;
                    (claims, out)
                }
            })
            .collect();
        let before = store.starter.groups();
        let out = crate::run_queued(&store, calls).await;
        let groups = store.starter.groups() - before;
        let mut xacts = HashSet::new();
        for (i, ((claims, out), (id, _))) in out.into_iter().zip(&plan).enumerate() {
            let t = store.get(*id).await.expect("get").expect("task");
            if i == 3 {
                assert!(
                    matches!(out, Err(StoreError::LeaseLost { shard: 3 })),
                    "{out:?}"
                );
                assert_eq!(t.state, TaskState::Scheduled);
                continue;
            }
            let ClaimTarget::Run { execution, .. } = &claims[0].target else {
                unreachable!()
            };
            let out = out.expect("claim_due");
            assert!(
                matches!(&out[..], [ClaimOutcome::Started(s)] if s.id == *id && s.execution_id == Some(*execution)),
                "{out:?}"
            );
            assert_eq!(t.state, TaskState::Running);
            assert_eq!(t.worker.as_deref(), Some(format!("w{i}").as_str()));
            xacts.insert(crate::xmin(&store, "tasks", "id", &id.0).await);
        }
        assert!(groups <= 2, "6 calls took {groups} groups");
        assert!(
            xacts.len() <= 2,
            "5 starts took {} transactions",
            xacts.len()
        );
    }
}
