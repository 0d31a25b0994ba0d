//! Group inserts: concurrent `insert` calls of one store share one transaction.
//!
//! A single create through the API is one `insert` call: a transaction with its multi-row
//! statement, the counter trigger and a commit (a WAL flush), for one task. Many producers
//! creating one task each make the database do that per-transaction work once per task. So a
//! call queues its tasks, and whichever call finds no group under way spawns one (a task of its
//! own, so a caller that gives up waiting cancels nothing). The group takes the calls queued (up
//! to [`MAX_GROUP_TASKS`] tasks in all, at least one call) and inserts all their tasks with one
//! `insert_in`, in call order, in one transaction; each call gets the outcomes of its own tasks.
//! Calls that arrive meanwhile form the next group; an idle store's call runs at once, alone.
//!
//! Each call is what it was alone: its tasks are stored together or not at all, and key
//! conflicts are reported per task (a key taken by an earlier call of the group is a `Duplicate`
//! naming that call's task, as if the calls had run one after the other). The audit record of
//! each call that created a task commits with the group. Should the group's transaction fail
//! (a reused id fails the whole statement), each of its calls is inserted again on its own, so
//! one call's error is never another's.

use std::sync::Arc;

use sundial_core::NewTask;
use sundial_store::audit_scope::PendingAudit;
use sundial_store::{Inserted, StoreError};
use tokio::sync::oneshot;

use crate::PostgresStore;
use crate::lanes::{self, GroupCall, Lanes};

/// Most tasks one group inserts (a call with more still runs, alone).
pub(crate) const MAX_GROUP_TASKS: usize = 1000;

pub(crate) struct Call {
    tasks: Vec<NewTask>,
    /// The request's audit record, committed with the insert when it created a task (see
    /// [`sundial_store::audit_scope`]); claimed on the caller's task, since the group runs on
    /// another.
    audit: Option<PendingAudit>,
    reply: oneshot::Sender<Result<Vec<Inserted>, StoreError>>,
}

/// The calls waiting for a group (one lane), shared by the clones of one store.
pub(crate) type Inserter = Lanes<(), Call>;

/// Shared between clones of a store.
pub(crate) type SharedInserter = Arc<Inserter>;

impl GroupCall for Call {
    type Answer = Vec<Inserted>;
    const WORK: &'static str = "insert group";
    const GATHER: std::time::Duration = lanes::CALLERS_BACK;

    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl std::future::Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send {
        store.insert_together(group)
    }

    fn into_reply(self) -> oneshot::Sender<Result<Vec<Inserted>, StoreError>> {
        self.reply
    }
}

impl PostgresStore {
    /// [`sundial_store::Store::insert`] through the group inserter.
    pub(crate) async fn insert_grouped(
        &self,
        tasks: Vec<NewTask>,
    ) -> Result<Vec<Inserted>, StoreError> {
        let audit = sundial_store::audit_scope::claim_pending();
        lanes::submit(
            self,
            &self.inserter,
            (),
            |reply| Call {
                tasks,
                audit,
                reply,
            },
            MAX_GROUP_TASKS,
            |c| c.tasks.len(),
        )
        .await
    }

    /// Inserts the tasks of `group` in one transaction and answers each call with its own
    /// outcomes; on failure nothing is answered and the calls come back with the error.
    async fn insert_together(&self, group: Vec<Call>) -> Result<(), (StoreError, Vec<Call>)> {
        let joined: Vec<NewTask>;
        let tasks: &[NewTask] = match group.as_slice() {
            [only] => &only.tasks,
            _ => {
                joined = group.iter().flat_map(|c| c.tasks.iter().cloned()).collect();
                &joined
            }
        };
        let committed = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(crate::pg)?;
            let out = self.insert_in(&tx, tasks).await?;
            // Which calls created a task, by their share of `out`.
            let mut created = Vec::with_capacity(group.len());
            let mut at = 0;
            for call in &group {
                let mine = &out[at..at + call.tasks.len()];
                created.push(mine.iter().any(|i| matches!(i, Inserted::Created(_))));
                at += call.tasks.len();
            }
            let audits = group
                .iter()
                .enumerate()
                .filter(|(i, _)| created[*i])
                .filter_map(|(i, c)| c.audit.as_ref().map(|a| (i, a)))
                .collect();
            let seqs = lanes::insert_group_audits(self, &tx, audits).await?;
            tx.commit().await.map_err(crate::pg)?;
            Ok::<_, StoreError>((out, seqs))
        }
        .await;
        let (out, seqs) = match committed {
            Ok(done) => done,
            Err(e) => return Err((e, group)),
        };
        let mut out = out.into_iter();
        for (i, mut call) in group.into_iter().enumerate() {
            let mine: Vec<Inserted> = out.by_ref().take(call.tasks.len()).collect();
            if let (Some(a), Some(seq)) = (call.audit.take(), seqs.get(&i)) {
                a.written(*seq);
            }
            let _ = call.reply.send(Ok(mine));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sundial_core::{Limits, TaskId, TaskSpec, Timestamp};
    use sundial_store::Store;
    use uuid::Uuid;

    use super::*;
    use crate::testkit;

    const NOW: Timestamp = Timestamp(1_700_000_000_000);

    fn task(key: Option<&str>) -> NewTask {
        let mut spec = TaskSpec::new("k").queue("q").run_at(NOW);
        if let Some(k) = key {
            spec = spec.key(k);
        }
        spec.validate(TaskId(Uuid::now_v7()), NOW, 16, &Limits::default())
            .expect("valid")
    }

    /// Runs the calls concurrently while the pool's connection is held, then lets them go.
    async fn insert_behind_a_held_connection(
        store: &PostgresStore,
        calls: Vec<Vec<NewTask>>,
    ) -> Vec<Result<Vec<Inserted>, StoreError>> {
        let held = store.client().await.expect("client");
        let running: Vec<_> = calls
            .into_iter()
            .map(|tasks| {
                let store = store.clone();
                tokio::spawn(async move { store.insert(tasks).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        drop(held);
        let mut out = Vec::new();
        for r in running {
            out.push(r.await.expect("join"));
        }
        out
    }

    /// Creates waiting behind an insert share one transaction; each call gets the outcomes of
    /// its own tasks, a key an earlier call of the group took is that call's task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn creates_waiting_behind_an_insert_share_one_transaction() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let mut calls: Vec<Vec<NewTask>> = (0..6).map(|_| vec![task(None)]).collect();
        calls.push(vec![task(Some("one")), task(None)]);
        calls.push(vec![task(Some("one"))]);
        let ids: Vec<Vec<TaskId>> = calls
            .iter()
            .map(|c| c.iter().map(|t| t.id).collect())
            .collect();
        let before = store.inserter.groups();
        let out = insert_behind_a_held_connection(&store, calls).await;
        let groups = store.inserter.groups() - before;
        assert!(
            groups <= crate::lanes::IN_FLIGHT as u64 + 1,
            "8 creates took {groups} transactions"
        );
        let mut keyed = Vec::new();
        for (mine, got) in ids.iter().zip(out) {
            let got = got.expect("insert");
            assert_eq!(got.len(), mine.len());
            for (id, i) in mine.iter().zip(got) {
                match i {
                    Inserted::Created(t) => assert_eq!(t.id, *id),
                    Inserted::Duplicate { existing } => keyed.push((*id, existing)),
                }
            }
        }
        // Of the two calls with key "one", the first in the group created it.
        assert_eq!(keyed.len(), 1, "{keyed:?}");
        let (dup, existing) = keyed[0];
        assert_ne!(dup, existing);
        assert!(store.get(existing).await.expect("get").is_some());
        assert!(store.get(dup).await.expect("get").is_none());
    }

    /// A call that fails the group's statement (a reused id) fails alone; the others are stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_group_is_inserted_call_by_call() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let reused = task(None);
        store.insert(vec![reused.clone()]).await.expect("insert");
        let good: Vec<NewTask> = (0..4).map(|_| task(None)).collect();
        let mut calls: Vec<Vec<NewTask>> = good.iter().map(|t| vec![t.clone()]).collect();
        calls.insert(2, vec![reused]);
        let out = insert_behind_a_held_connection(&store, calls).await;
        assert!(out[2].is_err(), "{:?}", out[2]);
        for (i, r) in out.iter().enumerate().filter(|(i, _)| *i != 2) {
            assert!(
                matches!(r.as_deref(), Ok([Inserted::Created(_)])),
                "call {i}: {r:?}"
            );
        }
        for t in good {
            assert!(store.get(t.id).await.expect("get").is_some());
        }
    }

    /// Callers that each create again as soon as answered are gathered into one group per
    /// round, not two cohorts taking turns (each waiting for the other's group before its own).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_coming_back_are_gathered_into_one_group() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        const CALLERS: usize = 4;
        const ROUNDS: usize = 10;
        let before = store.inserter.groups();
        crate::run_closed_loop(&store, CALLERS, ROUNDS, |store, _| async move {
            store.insert(vec![task(None)]).await.expect("insert");
        })
        .await;
        let groups = store.inserter.groups() - before;
        // Two cohorts take two groups a round (20 here); gathered, one a round after the first
        // two or three groups.
        assert!(
            groups <= (ROUNDS + ROUNDS / 2) as u64,
            "{CALLERS} callers × {ROUNDS} creates took {groups} groups"
        );
    }
}
