//! The access store conformance suite (feature `testkit`): what every [`AccessStore`] must do.
//!
//! ```ignore
//! async fn fresh() -> Option<(Arc<MyStore>, Guard)> { … }
//! sundial_store::access_store_conformance!(fresh);
//! ```
//!
//! The factory returns a [`Fixture`]: `Arc<S>`, `(Arc<S>, guard)` or an `Option` of
//! either (`None` skips the check, for backends that need an outside service).

use std::sync::Arc;

use sundial_core::{TaskId, Timestamp, TokenId};
use uuid::Uuid;

use crate::audit_scope::{self, AuditScope, AuditWrite};
use crate::testkit::{Fixture, at, due_task, in_audit_scope, make_ready, ready_claim};
use crate::{
    AccessStore, AuditFilter, Namespace, NamespaceError, NewAuditRecord, NewToken, Scope, Store,
    TransitionError,
};

/// A backend that keeps tasks and the audit log in one database (so a task write can carry its
/// request's audit record).
pub trait AuditedFixture {
    fn stores(&self) -> (Arc<dyn Store>, Arc<dyn AccessStore>);
}

/// Every [`Fixture`] whose store is both.
impl<F: Fixture> AuditedFixture for F
where
    F::Store: Store + AccessStore + Sized,
{
    fn stores(&self) -> (Arc<dyn Store>, Arc<dyn AccessStore>) {
        match self.store() {
            Some(s) => (s.clone(), s.clone()),
            None => panic!("a skipped fixture has no store (check `Fixture::store` first)"),
        }
    }
}

/// Runs every access store check against stores made by `$factory`.
#[macro_export]
macro_rules! access_store_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::access_testkit::$check(store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::access_store_conformance!(@checks ($factory)
            access_tokens_round_trip_and_revoke
            access_first_token_only_into_an_empty_store
            access_namespaces_are_unique
            access_audit_appends_pages_filters_and_purges
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn access_audit_rides_with_the_request_write() {
            let fixture = ($factory)().await;
            if $crate::testkit::Fixture::store(&fixture).is_none() {
                return;
            }
            let (tasks, access) = $crate::access_testkit::AuditedFixture::stores(&fixture);
            $crate::access_testkit::access_audit_rides_with_the_request_write(tasks, access).await;
            drop(fixture);
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn access_audit_rides_with_operator_and_admin_writes() {
            let fixture = ($factory)().await;
            if $crate::testkit::Fixture::store(&fixture).is_none() {
                return;
            }
            let (tasks, access) = $crate::access_testkit::AuditedFixture::stores(&fixture);
            $crate::access_testkit::access_audit_rides_with_operator_and_admin_writes(tasks, access)
                .await;
            drop(fixture);
        }
    };
}

fn token(name: &str, scope: Scope, namespace: Option<&str>, at: i64) -> NewToken {
    let mut hash = [0u8; 32];
    for (i, b) in hash.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(name.len() as u8);
    }
    NewToken {
        id: TokenId(Uuid::new_v4()),
        name: name.to_string(),
        scope,
        namespace: namespace.map(str::to_string),
        secret_hash: hash,
        created_at: Timestamp(at),
        expires_at: Some(Timestamp(at + 1_000)),
    }
}

/// `create_first_token` stores into an empty store only, and of many concurrent calls exactly one
/// stores; later ones (a revoked token counts) store nothing.
pub async fn access_first_token_only_into_an_empty_store(s: Arc<dyn AccessStore>) {
    // Polled together: on a database each call runs on its own connection, interleaved.
    let calls = (0..8).map(|i| {
        let s = s.clone();
        let t = token(&format!("first-{i}"), Scope::Admin, None, 10 + i);
        async move { s.create_first_token(t).await }
    });
    let mut stored = Vec::new();
    for r in futures::future::join_all(calls).await {
        if let Some(t) = r.expect("the store answers") {
            stored.push(t);
        }
    }
    assert_eq!(stored.len(), 1, "exactly one first token: {stored:?}");
    let listed = s.list_tokens().await.expect("the store answers");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, stored[0].id);
    assert_eq!(listed[0].scope, Scope::Admin);
    assert_eq!(listed[0].secret_hash, stored[0].secret_hash);

    // The same token again (a restart with the same setting): nothing stored, no error.
    let again = NewToken {
        id: stored[0].id,
        name: stored[0].name.clone(),
        scope: Scope::Admin,
        namespace: None,
        secret_hash: stored[0].secret_hash,
        created_at: Timestamp(99),
        expires_at: None,
    };
    assert_eq!(
        s.create_first_token(again)
            .await
            .expect("the store answers"),
        None
    );
    // A revoked token still counts.
    s.revoke_token(stored[0].id, Timestamp(100))
        .await
        .expect("the store answers");
    let late = token("late", Scope::Admin, None, 200);
    assert_eq!(
        s.create_first_token(late).await.expect("the store answers"),
        None
    );
    assert_eq!(s.list_tokens().await.expect("the store answers").len(), 1);
}

pub async fn access_tokens_round_trip_and_revoke(s: Arc<dyn AccessStore>) {
    assert!(
        !s.any_tokens().await.expect("the store answers"),
        "a fresh store has no tokens"
    );
    assert!(s.list_tokens().await.expect("the store answers").is_empty());
    let a = token("ci", Scope::Producer, Some("team-a"), 10);
    let b = NewToken {
        expires_at: None,
        ..token("ops", Scope::Admin, None, 20)
    };
    let got = s.create_token(a.clone()).await.expect("the store answers");
    assert_eq!(got.id, a.id);
    assert_eq!(got.name, "ci");
    assert_eq!(got.scope, Scope::Producer);
    assert_eq!(got.namespace.as_deref(), Some("team-a"));
    assert_eq!(got.secret_hash, a.secret_hash);
    assert_eq!(got.expires_at, Some(Timestamp(1_010)));
    assert_eq!(got.revoked_at, None);
    s.create_token(b.clone()).await.expect("the store answers");
    assert!(
        s.create_token(b.clone()).await.is_err(),
        "a repeated id is refused"
    );
    assert!(s.any_tokens().await.expect("the store answers"));

    let fetched = s
        .get_token(b.id)
        .await
        .expect("the store answers")
        .expect("the store answers");
    assert_eq!(fetched.namespace, None);
    assert_eq!(fetched.expires_at, None);
    assert_eq!(fetched.scope, Scope::Admin);
    assert!(fetched.is_live_at(Timestamp(i64::MAX - 1)));
    assert!(
        s.get_token(TokenId(Uuid::new_v4()))
            .await
            .expect("the store answers")
            .is_none()
    );
    let listed: Vec<String> = s
        .list_tokens()
        .await
        .expect("the store answers")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(listed, ["ci", "ops"], "oldest first");

    assert!(got.is_live_at(Timestamp(1_009)));
    assert!(!got.is_live_at(Timestamp(1_010)), "expired at expires_at");
    let revoked = s
        .revoke_token(a.id, Timestamp(50))
        .await
        .expect("the store answers")
        .expect("the store answers");
    assert_eq!(revoked.revoked_at, Some(Timestamp(50)));
    assert!(!revoked.is_live_at(Timestamp(51)));
    let again = s
        .revoke_token(a.id, Timestamp(60))
        .await
        .expect("the store answers")
        .expect("the store answers");
    assert_eq!(
        again.revoked_at,
        Some(Timestamp(50)),
        "the first time stays"
    );
    assert_eq!(
        s.get_token(a.id)
            .await
            .expect("the store answers")
            .expect("the store answers")
            .revoked_at,
        Some(Timestamp(50))
    );
    assert!(
        s.revoke_token(TokenId(Uuid::new_v4()), Timestamp(1))
            .await
            .expect("the store answers")
            .is_none()
    );
    assert!(
        s.any_tokens().await.expect("the store answers"),
        "revoked tokens still count"
    );
}

pub async fn access_namespaces_are_unique(s: Arc<dyn AccessStore>) {
    assert!(
        s.list_namespaces()
            .await
            .expect("the store answers")
            .is_empty()
    );
    let a = Namespace {
        name: "team-b".into(),
        max_live_tasks: Some(100),
        max_creates_per_second: Some(5),
        created_at: Timestamp(3),
    };
    let b = Namespace {
        name: "team-a".into(),
        max_live_tasks: None,
        max_creates_per_second: None,
        created_at: Timestamp(4),
    };
    assert_eq!(
        s.create_namespace(a.clone())
            .await
            .expect("the store answers"),
        a
    );
    s.create_namespace(b.clone())
        .await
        .expect("the store answers");
    assert!(matches!(
        s.create_namespace(a.clone()).await,
        Err(NamespaceError::AlreadyExists)
    ));
    assert_eq!(
        s.get_namespace("team-b").await.expect("the store answers"),
        Some(a.clone())
    );
    assert_eq!(
        s.get_namespace("nope").await.expect("the store answers"),
        None
    );
    assert_eq!(
        s.list_namespaces().await.expect("the store answers"),
        vec![b, a],
        "by name"
    );
}

fn audit(at: i64, actor: &str, ns: &str, action: &str, target: Option<&str>) -> NewAuditRecord {
    NewAuditRecord {
        at: Timestamp(at),
        actor_id: (actor != "local").then(|| TokenId(Uuid::from_u128(at as u128 + 1))),
        actor: actor.to_string(),
        namespace: ns.to_string(),
        action: action.to_string(),
        target: target.map(str::to_string),
        status: if at % 2 == 0 { 200 } else { 403 },
        request_id: format!("req-{at}"),
    }
}

pub async fn access_audit_appends_pages_filters_and_purges(s: Arc<dyn AccessStore>) {
    let empty = s
        .list_audit(&AuditFilter::default(), 10)
        .await
        .expect("the store answers");
    assert!(empty.records.is_empty() && empty.next_cursor.is_none());
    let first = vec![
        audit(1, "local", "default", "POST /v1/tasks", Some("t1")),
        audit(2, "ci", "team-a", "POST /v1/tasks/{id}/cancel", Some("t1")),
    ];
    s.append_audit(first.clone())
        .await
        .expect("the store answers");
    s.append_audit(vec![
        audit(3, "ci", "team-a", "POST /v1/tasks", None),
        audit(
            4,
            "ops",
            "default",
            "POST /v1/tasks/{id}/cancel",
            Some("t2"),
        ),
        audit(5, "ops", "team-a", "DELETE /v1/schedules/{id}", Some("s")),
    ])
    .await
    .expect("the store answers");
    s.append_audit(Vec::new()).await.expect("the store answers");

    let all = s
        .list_audit(&AuditFilter::default(), 100)
        .await
        .expect("the store answers");
    let ats: Vec<i64> = all.records.iter().map(|r| r.record.at.0).collect();
    assert_eq!(ats, [5, 4, 3, 2, 1], "newest first");
    assert!(all.records.windows(2).all(|w| w[0].seq > w[1].seq));
    assert_eq!(all.records[4].record, first[0], "a record round-trips");
    assert_eq!(all.records[3].record, first[1]);
    assert_eq!(all.next_cursor, None);

    // Pages.
    let p1 = s
        .list_audit(&AuditFilter::default(), 2)
        .await
        .expect("the store answers");
    assert_eq!(p1.records.len(), 2);
    let p2 = s
        .list_audit(
            &AuditFilter {
                before: p1.next_cursor,
                ..AuditFilter::default()
            },
            2,
        )
        .await
        .expect("the store answers");
    let p3 = s
        .list_audit(
            &AuditFilter {
                before: p2.next_cursor,
                ..AuditFilter::default()
            },
            2,
        )
        .await
        .expect("the store answers");
    let paged: Vec<i64> = [p1.records, p2.records, p3.records.clone()]
        .concat()
        .iter()
        .map(|r| r.record.at.0)
        .collect();
    assert_eq!(paged, [5, 4, 3, 2, 1]);
    assert_eq!(p3.next_cursor, None);

    // Filters.
    let by = |f: AuditFilter| {
        let s = s.clone();
        async move {
            s.list_audit(&f, 100)
                .await
                .expect("the store answers")
                .records
                .iter()
                .map(|r| r.record.at.0)
                .collect::<Vec<_>>()
        }
    };
    let ns = |n: &str| AuditFilter {
        namespace: Some(n.into()),
        ..AuditFilter::default()
    };
    assert_eq!(by(ns("team-a")).await, [5, 3, 2]);
    let actor = |a: String| AuditFilter {
        actor: Some(a),
        ..AuditFilter::default()
    };
    assert_eq!(by(actor("ops".into())).await, [5, 4]);
    assert_eq!(
        by(actor(Uuid::from_u128(3).to_string())).await,
        [2],
        "an actor is also found by token id"
    );
    assert_eq!(
        by(AuditFilter {
            action: Some("POST /v1/tasks/{id}/cancel".into()),
            ..AuditFilter::default()
        })
        .await,
        [4, 2]
    );
    assert_eq!(
        by(AuditFilter {
            target: Some("t1".into()),
            namespace: Some("team-a".into()),
            ..AuditFilter::default()
        })
        .await,
        [2]
    );

    // Purge by age, bounded.
    assert_eq!(
        s.purge_audit(Timestamp(4), 2)
            .await
            .expect("the store answers"),
        2
    );
    assert_eq!(
        s.purge_audit(Timestamp(4), 100)
            .await
            .expect("the store answers"),
        1
    );
    assert_eq!(
        by(AuditFilter::default()).await,
        [5, 4],
        "older records went"
    );
}

/// Every audit record, oldest first.
async fn audit_log(s: &dyn AccessStore) -> Vec<crate::AuditRecord> {
    let mut page = s
        .list_audit(&AuditFilter::default(), 1_000)
        .await
        .expect("the store answers");
    page.records.reverse();
    page.records
}

/// A request's audit record commits with the request's own write (see [`crate::audit_scope`]):
/// a write that changes something carries it, once; one that changes nothing leaves it pending;
/// the record can be amended once the answer is known.
pub async fn access_audit_rides_with_the_request_write(
    tasks: Arc<dyn Store>,
    access: Arc<dyn AccessStore>,
) {
    let t0 = at(1_000);
    // Outside a scope a write carries nothing.
    let plain = due_task("audited", "k", 0);
    tasks.insert(vec![plain.clone()]).await.expect("insert");
    assert!(audit_log(&*access).await.is_empty(), "no scope, no record");

    // A create: the record, with the target named before the write, commits with the task.
    let scope = AuditScope::new(audit(5, "local", "default", "POST /v1/tasks", None));
    let created = due_task("audited", "k", 0);
    let id = created.id;
    scope
        .run(async {
            audit_scope::name_target(id.to_string());
            tasks.insert(vec![created]).await.expect("insert");
            // A second write of the same request does not write a second record.
            tasks.cancel(plain.id, t0).await.expect("cancel");
        })
        .await;
    let AuditWrite::Written { seq } = scope.write() else {
        panic!("the insert carried the record: {:?}", scope.write());
    };
    let log = audit_log(&*access).await;
    assert_eq!(log.len(), 1, "exactly one record: {log:?}");
    assert_eq!(log[0].seq, seq);
    assert_eq!(
        log[0].record.target.as_deref(),
        Some(id.to_string().as_str())
    );
    assert_eq!(
        log[0].record,
        scope.record(),
        "the record as the scope holds it"
    );

    // A write that changes nothing (a refusal) leaves the record pending for the caller.
    let refused = AuditScope::new(audit(
        6,
        "local",
        "default",
        "POST /v1/tasks/{id}/cancel",
        None,
    ));
    refused
        .run(async {
            let r = tasks.cancel(plain.id, t0).await;
            assert!(
                matches!(r, Err(TransitionError::WrongState { .. })),
                "cancelled already: {r:?}"
            );
        })
        .await;
    assert_eq!(refused.write(), AuditWrite::Pending);
    assert_eq!(
        audit_log(&*access).await.len(),
        1,
        "nothing written for a refusal"
    );

    // A worker's poll and complete each carry their own request's record.
    make_ready(&*tasks, id, t0).await;
    let poll = AuditScope::new(audit(
        7,
        "w",
        "default",
        "POST /v1/queues/{queue}/poll",
        None,
    ));
    let claimed = poll
        .run(async {
            tasks
                .claim_ready(ready_claim("audited", 1, "w", t0))
                .await
                .expect("claim_ready")
                .tasks
        })
        .await;
    assert_eq!(claimed.len(), 1);
    assert!(
        matches!(poll.write(), AuditWrite::Written { .. }),
        "{:?}",
        poll.write()
    );
    let exec = claimed[0]
        .execution_id
        .expect("a running task has an execution");
    let hb = AuditScope::new(audit(
        8,
        "w",
        "default",
        "POST /v1/tasks/{id}/heartbeat",
        None,
    ));
    hb.run(async {
        tasks
            .heartbeat(id, exec, at(1_001))
            .await
            .expect("heartbeat")
    })
    .await;
    assert!(
        matches!(hb.write(), AuditWrite::Written { .. }),
        "{:?}",
        hb.write()
    );
    let done = AuditScope::new(audit(
        9,
        "w",
        "default",
        "POST /v1/tasks/{id}/complete",
        None,
    ));
    done.run(async {
        tasks
            .complete(id, exec, at(1_002), None)
            .await
            .expect("complete")
    })
    .await;
    let AuditWrite::Written { seq: done_seq } = done.write() else {
        panic!("the complete carried the record: {:?}", done.write());
    };
    // A stale complete changes nothing: pending.
    let stale = AuditScope::new(audit(
        10,
        "w",
        "default",
        "POST /v1/tasks/{id}/complete",
        None,
    ));
    stale
        .run(async {
            let r = tasks.complete(id, exec, at(1_003), None).await;
            assert!(r.is_err(), "completed already: {r:?}");
        })
        .await;
    assert_eq!(stale.write(), AuditWrite::Pending);
    assert_eq!(audit_log(&*access).await.len(), 4);

    // The answer differed from what was written: the record is amended in place.
    access
        .amend_audit(done_seq, 409, Some("other".into()))
        .await
        .expect("amend");
    let log = audit_log(&*access).await;
    let amended = log.iter().find(|r| r.seq == done_seq).expect("the record");
    assert_eq!(amended.record.status, 409);
    assert_eq!(amended.record.target.as_deref(), Some("other"));
    assert_eq!(amended.record.action, "POST /v1/tasks/{id}/complete");
    // Amending a record that does not exist is not an error.
    access
        .amend_audit(i64::MAX, 200, None)
        .await
        .expect("amend of nothing");
}

/// Asserts that a scoped write carried its request's record into its own commit, and that the
/// record is in the log.
async fn assert_carried(access: &dyn AccessStore, action: &str, write: AuditWrite) {
    let AuditWrite::Written { seq } = write else {
        panic!("{action}: its write did not carry the record: {write:?}");
    };
    let log = audit_log(access).await;
    let found = log.iter().find(|r| r.seq == seq);
    assert_eq!(
        found.map(|r| r.record.action.as_str()),
        Some(action),
        "{action}: record {seq} in the log: {log:?}"
    );
}

/// The operator's and the admin's writes (queue settings and pause, retries, bulk changes,
/// tokens and namespaces) each commit their request's audit record with the write itself, so
/// there is no action without its record; a write that changes nothing (a refusal, an empty
/// batch, a duplicate) leaves the record pending for the caller.
pub async fn access_audit_rides_with_operator_and_admin_writes(
    tasks: Arc<dyn Store>,
    access: Arc<dyn AccessStore>,
) {
    let t0 = at(1_000);
    let action = "PUT /v1/queues/{queue}";
    let (r, w) = in_audit_scope(
        action,
        tasks.put_queue_config("ops-audited", crate::QueueConfig::default(), t0),
    )
    .await;
    r.expect("put_queue_config");
    assert_carried(&*access, action, w).await;

    let action = "POST /v1/queues/{queue}/pause";
    let (r, w) = in_audit_scope(action, tasks.set_queue_paused("ops-audited", true, t0)).await;
    r.expect("set_queue_paused");
    assert_carried(&*access, action, w).await;

    // Retry: a cancelled task becomes due again, carrying the record; a second retry of the same
    // (now live) task is refused and leaves the record pending.
    let one = due_task("ops-audited", "k", 0);
    let one_id = one.id;
    tasks.insert(vec![one]).await.expect("insert");
    tasks.cancel(one_id, t0).await.expect("cancel");
    let action = "POST /v1/tasks/{id}/retry";
    let (r, w) = in_audit_scope(action, tasks.retry(one_id, t0, t0)).await;
    r.expect("retry");
    assert_carried(&*access, action, w).await;
    let (r, w) = in_audit_scope(action, tasks.retry(one_id, t0, t0)).await;
    assert!(r.is_err(), "a live task is not retried: {r:?}");
    assert_eq!(w, AuditWrite::Pending, "a refused retry writes no record");

    // Bulk: a batch that changes something carries the record; one that changes nothing does not.
    let many: Vec<_> = (0..3).map(|_| due_task("ops-audited", "k", 0)).collect();
    let ids: Vec<TaskId> = many.iter().map(|t| t.id).collect();
    tasks.insert(many).await.expect("insert");
    let action = "POST /v1/tasks/cancel";
    let (r, w) = in_audit_scope(action, tasks.cancel_many(ids.clone(), t0)).await;
    assert_eq!(r.expect("cancel_many").len(), 3);
    assert_carried(&*access, action, w).await;
    let (r, w) = in_audit_scope(action, tasks.cancel_many(ids.clone(), t0)).await;
    assert!(r.expect("cancel_many").is_empty(), "cancelled already");
    assert_eq!(
        w,
        AuditWrite::Pending,
        "a batch that changed nothing writes no record"
    );
    let action = "POST /v1/tasks/retry";
    let (r, w) = in_audit_scope(action, tasks.retry_many(ids.clone(), t0, t0)).await;
    assert_eq!(r.expect("retry_many").len(), 3);
    assert_carried(&*access, action, w).await;
    let (r, w) = in_audit_scope(action, tasks.retry_many(ids, t0, t0)).await;
    assert!(r.expect("retry_many").is_empty(), "live again already");
    assert_eq!(w, AuditWrite::Pending);

    // Tokens and namespaces.
    let action = "POST /v1/tokens";
    let t = token("audited", Scope::Reader, None, 1_000);
    let token_id = t.id;
    let (r, w) = in_audit_scope(action, access.create_token(t)).await;
    r.expect("create_token");
    assert_carried(&*access, action, w).await;
    let action = "POST /v1/tokens/{id}/revoke";
    let (r, w) = in_audit_scope(action, access.revoke_token(token_id, t0)).await;
    assert!(r.expect("revoke_token").is_some());
    assert_carried(&*access, action, w).await;
    let (r, w) = in_audit_scope(action, access.revoke_token(TokenId(Uuid::new_v4()), t0)).await;
    assert!(r.expect("revoke_token").is_none(), "no such token");
    assert_eq!(w, AuditWrite::Pending, "revoking nothing writes no record");
    let action = "POST /v1/namespaces";
    let ns = Namespace {
        name: "audited".into(),
        max_live_tasks: None,
        max_creates_per_second: None,
        created_at: t0,
    };
    let (r, w) = in_audit_scope(action, access.create_namespace(ns.clone())).await;
    r.expect("create_namespace");
    assert_carried(&*access, action, w).await;
    let (r, w) = in_audit_scope(action, access.create_namespace(ns)).await;
    assert!(
        matches!(r, Err(NamespaceError::AlreadyExists)),
        "a second create is refused: {r:?}"
    );
    assert_eq!(w, AuditWrite::Pending, "a refused create writes no record");
}
