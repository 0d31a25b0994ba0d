//! Group claims: concurrent `claim_ready` calls for one queue share one claim.
//!
//! Every worker poll that finds tasks ready is a claim: it looks up the queue's limit, picks
//! candidates by rank, starts them, records the request and commits (a WAL flush). With many
//! workers each taking one task per poll, the database spends its time on that per-claim work,
//! once per task. So a call does not run its claim itself: it queues it under its queue and
//! kinds filter, and whichever call finds no group of that queue under way spawns one (a task of
//! its own, so a caller that gives up waiting cancels nothing). The group takes every call
//! queued (up to [`MAX_GROUP_TASKS`] tasks wanted in all) and runs *one* claim for all of them:
//! the wanted counts add up, each call brings its own execution ids and worker name, and each
//! task started goes to the call whose execution id it was started under. Calls that arrive
//! meanwhile form the next group. Nothing waits for company: an idle store's call runs at once,
//! as a group of one.
//!
//! A group claim is one statement in the common case (`claim_plain` in `sql.rs`, one round trip
//! and one commit): when the queue has no concurrency limit, it locks the first ready tasks by
//! rank, starts those without an exclusive key or rate limit, and inserts the audit records of
//! the calls that took one. Only when it passed over candidates for their key or rate limit and
//! tasks are still wanted, or the queue is limited, does the full claim run, in a transaction
//! of its own, for the execution ids still unused (`claim_ready_in` in `lib.rs`): it takes the
//! queue's lock, tries the keys' locks and takes rate-limit turns. Both take candidates in rank
//! order, so together they start what the full claim alone would have.
//!
//! The rules of a claim hold for the group as they hold for one call: the queue's concurrency
//! limit, one start per exclusive key within its group limit, rate-limit take turns, rank order.
//! The group claims at the latest `now` of its calls, a time every one of them has reached. The
//! audit record of each call that took a task commits with the claim that gave it. Should a
//! group's statement or transaction fail, each call not yet served is claimed again on its own,
//! so one call's error is never another's.
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

use tokio_postgres::types::ToSql;

use crate::PostgresStore;
use crate::access::AuditArrays;
use crate::lanes::{self, GroupCall, Lanes};
use crate::rows::{col, task_from_row};

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
    const GATHER: std::time::Duration = lanes::CALLERS_BACK;

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

    /// Claims for `group` and answers each call with its tasks: first the common case in one
    /// statement (`claim_plain`), then, only when that left tasks wanted and passed over
    /// candidates with an exclusive key or a rate limit (or the queue is limited), the full
    /// claim in a transaction for what is still wanted. On failure the calls not yet answered
    /// come back with the error.
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
        let mut answers = Answers::new(group);
        let plain = match self.claim_plain(&claim, &answers.calls).await {
            Ok(p) => p,
            Err(e) => return Err((e, answers.into_calls())),
        };
        let started = plain.tasks.len();
        for t in plain.tasks {
            answers.take(&owner, t);
        }
        for (i, seq) in plain.written {
            answers.written(i, seq);
        }
        if started == wanted || (!plain.limited && plain.passed_over == 0) {
            answers.send(None);
            return Ok(());
        }
        // What is still wanted, by the full claim: the execution ids not used yet, and the
        // records of the calls that took nothing so far.
        let rest = ReadyGroup {
            queue: claim.queue,
            kinds: claim.kinds,
            execution_ids: claim.execution_ids[started..].to_vec(),
            workers: claim.workers[started..].to_vec(),
            now: claim.now,
        };
        let committed = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(crate::pg)?;
            let taken = self.claim_ready_in(&tx, &rest).await?;
            let mut took = vec![false; answers.calls.len()];
            for t in &taken.tasks {
                if let Some(i) = t.execution_id.and_then(|e| owner.get(&e.0)) {
                    took[*i] = true;
                }
            }
            let audits = answers
                .calls
                .iter()
                .enumerate()
                // A call that took a task in the first statement has its record in already.
                .filter(|(i, _)| took[*i] && answers.tasks[*i].is_empty())
                .filter_map(|(i, c)| c.audit.as_ref().map(|a| (i, a)))
                .collect();
            let seqs = lanes::insert_group_audits(self, &tx, audits).await?;
            tx.commit().await.map_err(crate::pg)?;
            Ok::<_, StoreError>((taken, seqs))
        }
        .await;
        let (taken, seqs) = match committed {
            Ok(done) => done,
            // The calls the first statement served keep what it committed; the others come
            // back with the error.
            Err(e) => return answers.fail_unserved(e),
        };
        for t in taken.tasks {
            answers.take(&owner, t);
        }
        for (i, seq) in seqs {
            answers.written(i, seq);
        }
        answers.send(taken.next_turn);
        Ok(())
    }

    /// The first statement of a group claim (`claim_plain`, see `sql.rs`).
    async fn claim_plain(&self, claim: &ReadyGroup, calls: &[Call]) -> Result<Plain, StoreError> {
        // Each call's record is linked to its first execution id: the statement uses the ids
        // in order, so a call took a task exactly when its first id was used.
        let mut first = 0usize;
        let mut linked: Vec<(Uuid, &sundial_store::NewAuditRecord)> = Vec::new();
        let mut audited: Vec<usize> = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            if let (Some(a), Some(e)) = (c.audit.as_ref(), claim.execution_ids.get(first)) {
                linked.push((*e, a.record()));
                audited.push(i);
            }
            first += c.claim.execution_ids.len();
        }
        let audits = AuditArrays::new(&linked);
        let want = crate::limit_param(claim.execution_ids.len());
        let kinds: Option<Vec<&str>> = claim
            .kinds
            .as_ref()
            .map(|k| k.iter().map(String::as_str).collect());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &claim.queue,
            &want,
            &claim.execution_ids,
            &claim.now.0,
            &claim.workers,
        ];
        if let Some(k) = &kinds {
            params.push(k);
        }
        params.extend(audits.params());
        let sql = &self.sql.claim_plain[usize::from(kinds.is_some())];
        let client = self.client().await?;
        let rows = crate::query(&client, sql, &params).await?;
        let Some(first_row) = rows.first() else {
            return Err(StoreError::corrupt("the plain claim returned no row"));
        };
        let n = first_row.len();
        let limited: bool = col(first_row, n - 3)?;
        let passed_over: i64 = col(first_row, n - 2)?;
        let seqs: Vec<i64> = col::<Option<Vec<i64>>>(first_row, n - 1)?.unwrap_or_default();
        let mut tasks = Vec::with_capacity(rows.len());
        for r in &rows {
            if col::<Option<Uuid>>(r, 0)?.is_some() {
                tasks.push(task_from_row(r)?);
            }
        }
        // The calls whose record went in: those that took a task, in call order.
        let used: std::collections::HashSet<Uuid> = tasks
            .iter()
            .filter_map(|t| t.execution_id.map(|e| e.0))
            .collect();
        let audited: Vec<usize> = audited
            .into_iter()
            .zip(&linked)
            .filter(|(_, (link, _))| used.contains(link))
            .map(|(i, _)| i)
            .collect();
        Ok(Plain {
            tasks,
            limited,
            passed_over,
            written: lanes::pair_audit_seqs("claim group", audited, seqs),
        })
    }
}

/// What the first statement of a group claim did.
struct Plain {
    /// The tasks it started.
    tasks: Vec<Task>,
    /// The queue has a concurrency limit: it did nothing.
    limited: bool,
    /// Candidates it passed over for their exclusive key or rate limit.
    passed_over: i64,
    /// The calls (by index) whose audit record it inserted, with the record's `seq`.
    written: Vec<(usize, i64)>,
}

/// A group's calls with the tasks each has taken so far and its record's `seq`.
struct Answers {
    calls: Vec<Call>,
    tasks: Vec<Vec<Task>>,
    seqs: HashMap<usize, i64>,
}

impl Answers {
    fn new(calls: Vec<Call>) -> Self {
        let tasks = calls.iter().map(|_| Vec::new()).collect();
        Answers {
            calls,
            tasks,
            seqs: HashMap::new(),
        }
    }

    fn into_calls(self) -> Vec<Call> {
        self.calls
    }

    /// `t` goes to the call whose execution id it was started under.
    fn take(&mut self, owner: &HashMap<Uuid, usize>, t: Task) {
        match t.execution_id.and_then(|e| owner.get(&e.0)) {
            Some(&i) => self.tasks[i].push(t),
            // Every start takes one of the group's execution ids.
            None => tracing::error!(task = %t.id, "a claimed task without a caller's execution id"),
        }
    }

    fn written(&mut self, call: usize, seq: i64) {
        self.seqs.insert(call, seq);
    }

    /// Answers every call: its tasks (in rank order) and its record's `seq`, if written.
    fn send(self, next_turn: Option<Timestamp>) {
        for ((i, mut call), mut tasks) in self.calls.into_iter().enumerate().zip(self.tasks) {
            if let (Some(a), Some(seq)) = (call.audit.take(), self.seqs.get(&i)) {
                a.written(*seq);
            }
            tasks.sort_by_key(|t| (t.priority.rank(t.due_at), t.id));
            let _ = call.reply.send(Ok(ReadyTaken::new(tasks, next_turn)));
        }
    }

    /// Answers the calls that took a task already with what they took; the others come back
    /// with `e`.
    fn fail_unserved(self, e: StoreError) -> Result<(), (StoreError, Vec<Call>)> {
        let mut unserved = Vec::new();
        for ((i, mut call), tasks) in self.calls.into_iter().enumerate().zip(self.tasks) {
            if tasks.is_empty() {
                unserved.push(call);
                continue;
            }
            if let (Some(a), Some(seq)) = (call.audit.take(), self.seqs.get(&i)) {
                a.written(*seq);
            }
            let _ = call.reply.send(Ok(ReadyTaken::new(tasks, None)));
        }
        if unserved.is_empty() {
            Ok(())
        } else {
            Err((e, unserved))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sundial_core::{ExecutionId, TaskId, TaskSpec};
    use sundial_store::{ClaimTarget, DueClaim, Store};

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
        let ids = ready(
            &store,
            (0..8).map(|_| TaskSpec::new("k").queue("q")).collect(),
            now,
        )
        .await;

        // The pool's one connection is held: the first group waits for it, the rest queue.
        let groups_before = store.claimer.groups();
        let calls = (0..8)
            .map(|i| {
                let store = store.clone();
                let claim = one_task_poll(i, now);
                async move { (claim.clone(), store.claim_ready(claim).await) }
            })
            .collect();
        let answers = crate::run_queued(&store, calls).await;
        let mut seen = HashSet::new();
        for (claim, taken) in answers {
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

    /// Workers that poll again as soon as answered are gathered into one group per round, not
    /// two cohorts taking turns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_coming_back_are_gathered_into_one_group() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        const WORKERS: usize = 4;
        const ROUNDS: usize = 10;
        ready(
            &store,
            (0..WORKERS * ROUNDS)
                .map(|_| TaskSpec::new("k").queue("q"))
                .collect(),
            now,
        )
        .await;
        let before = store.claimer.groups();
        crate::run_closed_loop(&store, WORKERS, ROUNDS, move |store, i| async move {
            let taken = store.claim_ready(one_task_poll(i, now)).await;
            assert_eq!(taken.expect("claim_ready").tasks.len(), 1);
        })
        .await;
        let groups = store.claimer.groups() - before;
        // Two cohorts take two groups a round (20 here); gathered, one a round after the first
        // two or three groups.
        assert!(
            groups <= (ROUNDS + ROUNDS / 2) as u64,
            "{WORKERS} workers × {ROUNDS} polls took {groups} groups"
        );
    }

    /// Makes `specs` ready in their queue at `now`; their ids in order.
    async fn ready(store: &PostgresStore, specs: Vec<TaskSpec>, now: Timestamp) -> Vec<TaskId> {
        let ids = crate::insert_due(store, specs, now).await;
        let claims = ids
            .iter()
            .map(|&id| DueClaim {
                id,
                target: ClaimTarget::Ready,
            })
            .collect();
        store.claim_due(claims, now, None).await.expect("claim_due");
        ids
    }

    /// Worker `w{i}`'s poll of queue `q` for one task.
    fn one_task_poll(i: usize, now: Timestamp) -> ReadyClaim {
        ReadyClaim {
            queue: "q".into(),
            kinds: None,
            execution_ids: vec![ExecutionId(Uuid::now_v7())],
            worker: Some(format!("w{i}")),
            now,
        }
    }

    fn poll_record(i: usize) -> sundial_store::NewAuditRecord {
        sundial_store::NewAuditRecord {
            at: Timestamp(1_700_000_000_000),
            actor_id: None,
            actor: format!("worker-{i}"),
            namespace: "default".into(),
            action: "POST /v1/queues/{queue}/poll".into(),
            target: None,
            status: 200,
            request_id: format!("req-{i}"),
        }
    }

    /// Polls of a queue without limits, keys or rate limits are claimed by one statement per
    /// group, and each poll's audit record commits in the transaction that started its task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plain_group_claim_commits_each_polls_record_with_its_task() {
        use sundial_store::audit_scope::{AuditScope, AuditWrite};
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        ready(
            &store,
            (0..8).map(|_| TaskSpec::new("k").queue("q")).collect(),
            now,
        )
        .await;
        let calls = (0..8)
            .map(|i| {
                let store = store.clone();
                let claim = one_task_poll(i, now);
                let scope = AuditScope::new(poll_record(i));
                async move {
                    let taken = scope.run(store.claim_ready(claim)).await;
                    (scope, taken)
                }
            })
            .collect();
        let answers = crate::run_queued(&store, calls).await;
        let mut xacts = HashSet::new();
        for (scope, taken) in answers {
            let taken = taken.expect("claim_ready").tasks;
            assert_eq!(taken.len(), 1);
            let AuditWrite::Written { seq } = scope.write() else {
                panic!("the claim carried the record: {:?}", scope.write());
            };
            let record_xact = crate::xmin(&store, "audit_log", "seq", &seq).await;
            let task_xact = crate::xmin(&store, "tasks", "id", &taken[0].id.0).await;
            assert_eq!(record_xact, task_xact, "the record commits with the start");
            xacts.insert(task_xact);
        }
        assert!(
            xacts.len() <= 2,
            "8 polls took {} transactions",
            xacts.len()
        );
    }

    /// A claim whose first candidates by rank hold exclusive keys passes them over in its first
    /// statement and takes them in the full claim: what it takes is still the first tasks by
    /// rank whose key is free, and its request's record is written once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keyed_candidates_are_taken_in_rank_order_after_the_plain_statement() {
        use sundial_core::{ExclusiveMode, Priority};
        use sundial_store::AccessStore;
        use sundial_store::audit_scope::{AuditScope, AuditWrite};
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let now = Timestamp(1_700_000_000_000);
        let high = Priority::new(9).expect("priority");
        // A running holder of key `b`.
        let holder = ready(
            &store,
            vec![
                TaskSpec::new("k")
                    .queue("q")
                    .exclusive("b", ExclusiveMode::Wait),
            ],
            now,
        )
        .await;
        let claim = |n: usize| ReadyClaim {
            queue: "q".into(),
            kinds: None,
            execution_ids: (0..n).map(|_| ExecutionId(Uuid::now_v7())).collect(),
            worker: Some("w".into()),
            now,
        };
        let took = store.claim_ready(claim(1)).await.expect("claim").tasks;
        assert_eq!(took.iter().map(|t| t.id).collect::<Vec<_>>(), holder);
        // First by rank: `b` (its key runs: it is not readied) and `a` (free), then two without
        // a key. The plain statement passes `a` over; the full claim takes it.
        let ids = ready(
            &store,
            vec![
                TaskSpec::new("k")
                    .queue("q")
                    .priority(high)
                    .exclusive("b", ExclusiveMode::Wait),
                TaskSpec::new("k")
                    .queue("q")
                    .priority(high)
                    .exclusive("a", ExclusiveMode::Wait),
                TaskSpec::new("k").queue("q"),
                TaskSpec::new("k").queue("q"),
            ],
            now,
        )
        .await;
        let scope = AuditScope::new(poll_record(0));
        let took = scope
            .run(store.claim_ready(claim(2)))
            .await
            .expect("claim")
            .tasks;
        let mut took: Vec<TaskId> = took.iter().map(|t| t.id).collect();
        took.sort();
        let mut want = vec![ids[1], ids[2]];
        want.sort();
        assert_eq!(took, want, "a's task and the first task without a key");
        assert!(
            matches!(scope.write(), AuditWrite::Written { .. }),
            "{:?}",
            scope.write()
        );
        let log = store
            .list_audit(&sundial_store::AuditFilter::default(), 10)
            .await
            .expect("audit");
        assert_eq!(
            log.records.len(),
            1,
            "one record for one poll: {:?}",
            log.records
        );
    }
}
