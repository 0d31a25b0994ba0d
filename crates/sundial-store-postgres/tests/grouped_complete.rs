//! Concurrent `complete` calls share statements (and so commits), and each call's outcome is
//! still what its own conditional update would have given: the right attempt succeeds, a stale
//! execution id or an unknown task is refused, and of two calls for one attempt one succeeds.
//!
//! The transactions are counted by a trigger in the test schema that records, for every row
//! that becomes `succeeded`, the transaction that made it so.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::time::Duration;

use sundial_core::{ExecutionId, Limits, TaskId, TaskSpec, TaskState, Timestamp};
use sundial_store::{ReadyClaim, Store, TransitionError};

mod common;

use common::{fresh_postgres, raw_client};

fn exec() -> ExecutionId {
    ExecutionId(uuid::Uuid::now_v7())
}

/// Inserts `n` ready-to-claim tasks of queue `q` and claims them all (running).
async fn running(store: &dyn Store, n: usize) -> Vec<sundial_core::Task> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            TaskSpec::new("k")
                .queue("q")
                .run_at(Timestamp(0))
                .validate(
                    TaskId(uuid::Uuid::now_v7()),
                    Timestamp(0),
                    4,
                    &Limits::default(),
                )
                .unwrap()
        })
        .collect();
    store.insert(tasks.clone()).await.unwrap();
    let claims: Vec<_> = tasks
        .iter()
        .map(|t| sundial_store::DueClaim {
            id: t.id,
            target: sundial_store::ClaimTarget::Ready,
        })
        .collect();
    store.claim_due(claims, Timestamp(10), None).await.unwrap();
    let got = store
        .claim_ready(ReadyClaim {
            queue: "q".to_string(),
            kinds: None,
            execution_ids: (0..n).map(|_| exec()).collect(),
            worker: None,
            now: Timestamp(20),
        })
        .await
        .unwrap()
        .tasks;
    assert_eq!(got.len(), n);
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completes_share_transactions() {
    let Some((store, guard)) = fresh_postgres().await else {
        return;
    };
    let audit = raw_client(&guard.url).await;
    let s = &guard.schema;
    audit
        .batch_execute(&format!(
            "CREATE TABLE \"{s}\".completed_in (id uuid, xid bigint);
             CREATE FUNCTION \"{s}\".note_completed() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.state = 'succeeded' AND OLD.state <> 'succeeded' THEN
                 INSERT INTO \"{s}\".completed_in VALUES (NEW.id, txid_current());
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER note_completed AFTER UPDATE ON \"{s}\".tasks
               FOR EACH ROW EXECUTE FUNCTION \"{s}\".note_completed();"
        ))
        .await
        .unwrap();
    let n = 64;
    let tasks = running(store.as_ref(), n).await;
    let calls = tasks.iter().map(|t| {
        store.complete(
            t.id,
            t.execution_id.unwrap(),
            Timestamp(30),
            Some(format!("{{\"n\":\"{}\"}}", t.id)),
        )
    });
    let out = futures::future::join_all(calls).await;
    for (t, r) in tasks.iter().zip(out) {
        let done = r.unwrap();
        assert_eq!(done.id, t.id);
        assert_eq!(done.state, TaskState::Succeeded);
        assert_eq!(
            done.result,
            Some(serde_json::json!({"n": t.id.to_string()}))
        );
        assert_eq!(done.finished_at, Some(Timestamp(30)));
    }
    let row = audit
        .query_one(
            &format!("SELECT count(*), count(DISTINCT xid) FROM \"{s}\".completed_in"),
            &[],
        )
        .await
        .unwrap();
    let (rows, xacts): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(rows, n as i64);
    // One statement per call would be 64 transactions.
    assert!(
        xacts <= 8,
        "{xacts} transactions for {n} concurrent completes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_of_a_group_gets_its_own_outcome() {
    let Some((store, _guard)) = fresh_postgres().await else {
        return;
    };
    let tasks = running(store.as_ref(), 3).await;
    let (a, b, c) = (&tasks[0], &tasks[1], &tasks[2]);
    let unknown = TaskId(uuid::Uuid::now_v7());
    let out = futures::future::join_all(vec![
        // A stale execution id first, then the right one: the right one succeeds.
        store.complete(a.id, exec(), Timestamp(30), None),
        store.complete(
            a.id,
            a.execution_id.unwrap(),
            Timestamp(30),
            Some("1".into()),
        ),
        // Two calls for one attempt: exactly one succeeds, with its own result.
        store.complete(
            b.id,
            b.execution_id.unwrap(),
            Timestamp(30),
            Some("2".into()),
        ),
        store.complete(
            b.id,
            b.execution_id.unwrap(),
            Timestamp(31),
            Some("3".into()),
        ),
        store.complete(unknown, exec(), Timestamp(30), None),
        store.complete(c.id, c.execution_id.unwrap(), Timestamp(30), None),
    ])
    .await;
    let mut out = out.into_iter();
    assert!(matches!(
        out.next().unwrap(),
        Err(TransitionError::StaleExecution {
            state: TaskState::Running | TaskState::Succeeded
        })
    ));
    assert_eq!(
        out.next().unwrap().unwrap().result,
        Some(serde_json::json!(1))
    );
    let (b1, b2) = (out.next().unwrap(), out.next().unwrap());
    match (&b1, &b2) {
        (Ok(t), Err(TransitionError::StaleExecution { state })) => {
            assert_eq!(t.result, Some(serde_json::json!(2)));
            assert_eq!(*state, TaskState::Succeeded);
        }
        (Err(TransitionError::StaleExecution { state }), Ok(t)) => {
            assert_eq!(t.result, Some(serde_json::json!(3)));
            assert_eq!(*state, TaskState::Succeeded);
        }
        other => panic!("expected one success and one refusal: {other:?}"),
    }
    let stored = store.get(b.id).await.unwrap().unwrap();
    assert_eq!(
        stored.result,
        b1.ok().or(b2.ok()).and_then(|t| t.result),
        "the result stored is the one the succeeding call was told"
    );
    assert!(matches!(
        out.next().unwrap(),
        Err(TransitionError::NotFound)
    ));
    assert_eq!(out.next().unwrap().unwrap().state, TaskState::Succeeded);
    // A lone call still runs at once.
    let lone = running(store.as_ref(), 1).await;
    let t = tokio::time::timeout(
        Duration::from_secs(10),
        store.complete(
            lone[0].id,
            lone[0].execution_id.unwrap(),
            Timestamp(40),
            None,
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(t.state, TaskState::Succeeded);
}

/// The group never waits for a row another transaction holds (so it cannot take part in a
/// deadlock): the other calls of the group finish while that one waits for the lock, alone, and
/// succeeds once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_row_does_not_hold_up_its_group() {
    let Some((store, guard)) = fresh_postgres().await else {
        return;
    };
    let tasks = running(store.as_ref(), 4).await;
    let mut locker = raw_client(&guard.url).await;
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        &format!(
            "SELECT 1 FROM \"{}\".tasks WHERE id = $1 FOR UPDATE",
            guard.schema
        ),
        &[&tasks[0].id.0],
    )
    .await
    .unwrap();
    let calls: Vec<_> = tasks
        .iter()
        .map(|t| {
            let (store, id, exec) = (store.clone(), t.id, t.execution_id.unwrap());
            tokio::spawn(async move { store.complete(id, exec, Timestamp(30), None).await })
        })
        .collect();
    let mut calls = calls.into_iter();
    let locked = calls.next().unwrap();
    for h in calls {
        let t = tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("the unlocked rows complete while one row is locked")
            .unwrap()
            .unwrap();
        assert_eq!(t.state, TaskState::Succeeded);
    }
    assert!(
        !locked.is_finished(),
        "the locked row's call waits for the lock"
    );
    tx.commit().await.unwrap();
    let t = tokio::time::timeout(Duration::from_secs(10), locked)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(t.state, TaskState::Succeeded);
}

/// Audited completes that share a statement each commit their own request's record, in the
/// transaction that completed their task, and each request learns its record's `seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audited_completes_of_a_group_each_commit_their_own_record() {
    use sundial_store::NewAuditRecord;
    use sundial_store::audit_scope::{AuditScope, AuditWrite};

    let Some((store, guard)) = fresh_postgres().await else {
        return;
    };
    let raw = raw_client(&guard.url).await;
    let s = &guard.schema;
    let n = 32;
    let tasks = running(store.as_ref(), n).await;
    let scopes: Vec<AuditScope> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            AuditScope::new(NewAuditRecord {
                at: Timestamp(30 + i as i64),
                actor_id: None,
                actor: format!("worker-{i}"),
                namespace: "default".to_string(),
                action: "POST /v1/tasks/{id}/complete".to_string(),
                target: Some(t.id.to_string()),
                status: 200,
                request_id: format!("req-{i}"),
            })
        })
        .collect();
    let calls = tasks.iter().zip(&scopes).map(|(t, scope)| {
        let store = store.clone();
        let (id, exec) = (t.id, t.execution_id.unwrap());
        scope.run(async move { store.complete(id, exec, Timestamp(30), None).await })
    });
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.unwrap().state, TaskState::Succeeded);
    }
    let rows = raw
        .query(
            &format!(
                "SELECT a.seq, a.actor, a.request_id, a.target, a.xmin::text, t.xmin::text \
                 FROM \"{s}\".audit_log a JOIN \"{s}\".tasks t ON t.id::text = a.target"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), n, "one record per completed request");
    let mut xacts = std::collections::HashSet::new();
    for (scope, t) in scopes.iter().zip(&tasks) {
        let AuditWrite::Written { seq } = scope.write() else {
            panic!("the completion carried the record: {:?}", scope.write());
        };
        let row = rows
            .iter()
            .find(|r| r.get::<_, i64>(0) == seq)
            .unwrap_or_else(|| panic!("no record {seq}"));
        let want = scope.record();
        assert_eq!(row.get::<_, String>(1), want.actor);
        assert_eq!(row.get::<_, String>(2), want.request_id);
        assert_eq!(row.get::<_, String>(3), t.id.to_string());
        let (record_xact, task_xact): (String, String) = (row.get(4), row.get(5));
        assert_eq!(
            record_xact, task_xact,
            "the record commits with its completion"
        );
        xacts.insert(record_xact);
    }
    assert!(
        xacts.len() <= 8,
        "{} transactions for {n} concurrent completes",
        xacts.len()
    );
}
