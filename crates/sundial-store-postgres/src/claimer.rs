//! Group claims: concurrent `claim_ready` calls for one queue share one transaction.
//!
//! Every worker poll that finds tasks ready is a claim: a transaction that looks up the queue's
//! limit, picks candidates by rank, starts them and commits (a WAL flush). With many workers each
//! taking one task per poll, the database spends its time on that per-transaction work, once per
//! task. So a call does not run its claim itself: it queues it under its queue and kinds filter,
//! and whichever call finds no group of that queue under way spawns one (a task of its own, so a
//! caller that gives up waiting cancels nothing). The group takes every call queued (up to
//! [`MAX_GROUP_TASKS`] tasks wanted in all) and runs *one* claim for all of them: the wanted
//! counts add up, each call brings its own execution ids and worker name, and each task started
//! goes to the call whose execution id it was started under. Calls that arrive meanwhile form the
//! next group. Nothing waits for company: an idle store's call runs at once, as a group of one.
//!
//! The rules of a claim hold for the group as they hold for one call: the queue's concurrency
//! limit, one start per exclusive key within its group limit, rate-limit take turns, rank order.
//! The group claims at the latest `now` of its calls, a time every one of them has reached. The
//! audit record of each call that took a task commits with the claim. Should the group's
//! transaction fail, each of its calls is claimed again on its own, so one call's error is never
//! another's.
//!
//! A caller that is gone when its answer comes (its request dropped) leaves its tasks `running`
//! until their leases end, exactly as a poll dropped after its own claim committed did before.

use std::collections::HashMap;
use std::sync::Arc;

use sundial_core::{Task, Timestamp};
use sundial_store::audit_scope::PendingAudit;
use sundial_store::{ReadyClaim, ReadyTaken, StoreError};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::PostgresStore;
use crate::lanes::{self, GroupCall, Lanes};

/// Most tasks one group claim asks for (a call that wants more still runs, alone).
pub(crate) const MAX_GROUP_TASKS: usize = 1024;

/// The claim a group makes: the calls' execution ids, one after the other, each with the worker
/// of its call.
pub(crate) struct ReadyGroup {
    pub queue: String,
    pub kinds: Option<Vec<String>>,
    pub execution_ids: Vec<Uuid>,
    /// The worker of each execution id's call (same length).
    pub workers: Vec<Option<String>>,
    pub now: Timestamp,
}

/// Calls that may share a claim: one queue, one kinds filter.
pub(crate) type LaneKey = (String, Option<Vec<String>>);

pub(crate) struct Call {
    claim: ReadyClaim,
    /// The request's audit record, committed with the claim when it took a task (see
    /// [`sundial_store::audit_scope`]); claimed on the caller's task, since the group runs on
    /// another.
    audit: Option<PendingAudit>,
    reply: oneshot::Sender<Result<ReadyTaken, StoreError>>,
}

/// The calls waiting for a group, per queue and kinds filter, shared by the clones of one store.
pub(crate) type Claimer = Lanes<LaneKey, Call>;

/// Shared between clones of a store.
pub(crate) type SharedClaimer = Arc<Claimer>;

impl GroupCall for Call {
    type Answer = ReadyTaken;
    const WORK: &'static str = "claim group";

    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl std::future::Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send {
        store.claim_together(group)
    }

    fn into_reply(self) -> oneshot::Sender<Result<ReadyTaken, StoreError>> {
        self.reply
    }
}

impl PostgresStore {
    /// [`sundial_store::Store::claim_ready`] through the group claimer.
    pub(crate) async fn claim_ready_grouped(
        &self,
        claim: ReadyClaim,
    ) -> Result<ReadyTaken, StoreError> {
        let key = (claim.queue.clone(), claim.kinds.clone());
        let audit = sundial_store::audit_scope::claim_pending();
        lanes::submit(
            self,
            &self.claimer,
            key,
            |reply| Call {
                claim,
                audit,
                reply,
            },
            MAX_GROUP_TASKS,
            |c| c.claim.execution_ids.len(),
        )
        .await
    }

    /// Claims for `group` in one transaction and answers each call with its tasks; on failure
    /// nothing is answered and the calls come back with the error.
    async fn claim_together(&self, group: Vec<Call>) -> Result<(), (StoreError, Vec<Call>)> {
        let wanted: usize = group.iter().map(|c| c.claim.execution_ids.len()).sum();
        let mut claim = ReadyGroup {
            queue: group[0].claim.queue.clone(),
            kinds: group[0].claim.kinds.clone(),
            execution_ids: Vec::with_capacity(wanted),
            workers: Vec::with_capacity(wanted),
            now: Timestamp(i64::MIN),
        };
        // Which call each execution id belongs to.
        let mut owner: HashMap<Uuid, usize> = HashMap::with_capacity(wanted);
        for (i, call) in group.iter().enumerate() {
            for e in &call.claim.execution_ids {
                claim.execution_ids.push(e.0);
                claim.workers.push(call.claim.worker.clone());
                owner.insert(e.0, i);
            }
            claim.now = claim.now.max(call.claim.now);
        }
        let committed = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(crate::pg)?;
            let taken = self.claim_ready_in(&tx, &claim).await?;
            let mut took = vec![false; group.len()];
            for t in &taken.tasks {
                if let Some(i) = t.execution_id.and_then(|e| owner.get(&e.0)) {
                    took[*i] = true;
                }
            }
            let audits = group
                .iter()
                .enumerate()
                .filter(|(i, _)| took[*i])
                .filter_map(|(i, c)| c.audit.as_ref().map(|a| (i, a)))
                .collect();
            let seqs = lanes::insert_group_audits(self, &tx, audits).await?;
            tx.commit().await.map_err(crate::pg)?;
            Ok::<_, StoreError>((taken, seqs))
        }
        .await;
        let (taken, seqs) = match committed {
            Ok(done) => done,
            Err(e) => return Err((e, group)),
        };
        let mut tasks: Vec<Vec<Task>> = group.iter().map(|_| Vec::new()).collect();
        for t in taken.tasks {
            match t.execution_id.and_then(|e| owner.get(&e.0)) {
                Some(&i) => tasks[i].push(t),
                // Every start takes one of the group's execution ids.
                None => {
                    tracing::error!(task = %t.id, "a claimed task without a caller's execution id")
                }
            }
        }
        for ((i, mut call), tasks) in group.into_iter().enumerate().zip(tasks) {
            if let (Some(a), Some(seq)) = (call.audit.take(), seqs.get(&i)) {
                a.written(*seq);
            }
            let _ = call.reply.send(Ok(ReadyTaken::new(tasks, taken.next_turn)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sundial_core::{ExecutionId, Limits, TaskId, TaskSpec};
    use sundial_store::{ClaimOutcome, ClaimTarget, DueClaim, Store};

    use super::*;
    use crate::testkit;

    /// Polls that arrive while a claim of their queue is under way are claimed together, in one
    /// transaction, and each gets tasks under its own execution ids and worker name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_waiting_behind_a_claim_are_claimed_together() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                TaskSpec::new("k")
                    .queue("q")
                    .run_at(now)
                    .validate(TaskId(Uuid::now_v7()), now, 16, &Limits::default())
                    .expect("valid")
            })
            .collect();
        let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
        store.insert(tasks).await.expect("insert");
        let claims = ids
            .iter()
            .map(|&id| DueClaim {
                id,
                target: ClaimTarget::Ready,
            })
            .collect();
        let readied = store.claim_due(claims, now, None).await.expect("claim_due");
        assert!(
            readied
                .iter()
                .all(|o| matches!(o, ClaimOutcome::Readied(_)))
        );

        // The pool's one connection is held: the first group waits for it, the rest queue.
        let held = store.client().await.expect("client");
        let groups_before = store.claimer.groups();
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                let claim = ReadyClaim {
                    queue: "q".into(),
                    kinds: None,
                    execution_ids: vec![ExecutionId(Uuid::now_v7())],
                    worker: Some(format!("w{i}")),
                    now,
                };
                tokio::spawn(async move { (claim.clone(), store.claim_ready(claim).await) })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        drop(held);
        let mut seen = HashSet::new();
        for call in calls {
            let (claim, taken) = call.await.expect("join");
            let taken = taken.expect("claim_ready").tasks;
            assert_eq!(taken.len(), 1, "{claim:?}");
            let t = &taken[0];
            assert!(seen.insert(t.id), "task {} handed out twice", t.id);
            assert_eq!(t.execution_id, Some(claim.execution_ids[0]));
            assert_eq!(t.worker, claim.worker);
        }
        assert_eq!(seen, ids.into_iter().collect::<HashSet<_>>());
        let groups = store.claimer.groups() - groups_before;
        assert!(
            groups <= crate::lanes::IN_FLIGHT as u64 + 1,
            "8 polls took {groups} claims"
        );
    }
}
