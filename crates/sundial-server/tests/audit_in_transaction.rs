//! A write request's audit record commits in the request's own transaction: a create, a poll
//! that claims and a complete each cost one durable write, record included, and no separate
//! append; a request whose writes change nothing (a duplicate, a refusal) gets its record
//! appended after the answer, with the answer's status. The access store is wrapped to count
//! the appends the access layer makes on its own, and the amends: a record written with the
//! request's write says what the answer says, so it needs no second write. On PostgreSQL every
//! write route is walked: operator, schedule, workflow, push-secret and admin writes commit their
//! record with the action too.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use sundial::{Sundial, Timestamp};
use sundial_core::TokenId;
use sundial_server::{ServerConfig, router};
use sundial_store::{
    AccessStore, AuditFilter, AuditPage, AuditRecord, Namespace, NamespaceError, NewAuditRecord,
    NewToken, StoreError, TokenRecord,
};
use sundial_store_sqlite::{SqliteOptions, SqliteStore};
use tower::ServiceExt;

/// A store's access tables, counting the appends made outside a request's write and the
/// amends of records that a write carried (each one more durable write for the request).
struct CountingAccess<S = SqliteStore> {
    inner: Arc<S>,
    appends: AtomicUsize,
    amends: AtomicUsize,
}

impl<S> CountingAccess<S> {
    fn new(inner: Arc<S>) -> Self {
        CountingAccess {
            inner,
            appends: AtomicUsize::new(0),
            amends: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl<S: AccessStore> AccessStore for CountingAccess<S> {
    async fn create_token(&self, token: NewToken) -> Result<TokenRecord, StoreError> {
        self.inner.create_token(token).await
    }
    async fn create_first_token(&self, token: NewToken) -> Result<Option<TokenRecord>, StoreError> {
        self.inner.create_first_token(token).await
    }
    async fn get_token(&self, id: TokenId) -> Result<Option<TokenRecord>, StoreError> {
        self.inner.get_token(id).await
    }
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.inner.list_tokens().await
    }
    async fn any_tokens(&self) -> Result<bool, StoreError> {
        self.inner.any_tokens().await
    }
    async fn revoke_token(
        &self,
        id: TokenId,
        now: Timestamp,
    ) -> Result<Option<TokenRecord>, StoreError> {
        self.inner.revoke_token(id, now).await
    }
    async fn create_namespace(&self, ns: Namespace) -> Result<Namespace, NamespaceError> {
        self.inner.create_namespace(ns).await
    }
    async fn get_namespace(&self, name: &str) -> Result<Option<Namespace>, StoreError> {
        self.inner.get_namespace(name).await
    }
    async fn list_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        self.inner.list_namespaces().await
    }
    async fn append_audit(&self, records: Vec<NewAuditRecord>) -> Result<(), StoreError> {
        self.appends.fetch_add(1, Ordering::SeqCst);
        self.inner.append_audit(records).await
    }
    async fn amend_audit(
        &self,
        seq: i64,
        status: u16,
        target: Option<String>,
    ) -> Result<(), StoreError> {
        self.amends.fetch_add(1, Ordering::SeqCst);
        self.inner.amend_audit(seq, status, target).await
    }
    async fn list_audit(
        &self,
        filter: &AuditFilter,
        limit: usize,
    ) -> Result<AuditPage, StoreError> {
        self.inner.list_audit(filter, limit).await
    }
    async fn purge_audit(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_audit(before, limit).await
    }
}

async fn call(app: &axum::Router, method: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    call_as(app, None, method, uri, body).await
}

/// [`call`] with `Authorization: Bearer <token>` when a token is given.
async fn call_as(
    app: &axum::Router,
    token: Option<&str>,
    method: &str,
    uri: &str,
    body: Value,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Body::from(body.to_string())).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn newest(access: &dyn AccessStore) -> AuditRecord {
    access
        .list_audit(&AuditFilter::default(), 1)
        .await
        .unwrap()
        .records
        .pop()
        .expect("a record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_requests_commit_their_audit_record_with_their_action() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap());
    let access = Arc::new(CountingAccess::new(store.clone()));
    let sundial = Sundial::builder()
        .access_store(access.clone())
        .with_store(store.clone())
        .unwrap();
    let running = sundial.start();
    let app = router(sundial.clone(), ServerConfig::default());
    let appends = || access.appends.load(Ordering::SeqCst);
    let amends = || access.amends.load(Ordering::SeqCst);

    // A create: one write, its record inside, naming the task.
    let (status, task) = call(
        &app,
        "POST",
        "/v1/tasks",
        json!({"queue": "audited", "kind": "k", "key": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    assert_eq!(appends(), 0, "the create's record rode with the insert");
    assert_eq!(
        amends(),
        0,
        "the create's record was written as answered (201)"
    );
    let r = newest(&*access).await;
    assert_eq!(
        (
            r.record.action.as_str(),
            r.record.status,
            r.record.target.as_deref()
        ),
        ("POST /v1/tasks", 201, Some(id.as_str()))
    );

    // A duplicate writes nothing: its record is appended with the answer's status.
    let (status, _) = call(
        &app,
        "POST",
        "/v1/tasks",
        json!({"queue": "audited", "kind": "k", "key": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(appends(), 1);
    assert_eq!(newest(&*access).await.record.status, 409);

    // A worker's poll that claims, then its complete: each one write, record inside.
    let (status, polled) = call(
        &app,
        "POST",
        "/v1/queues/audited/poll",
        json!({"worker": "w", "max": 1, "wait": "5s"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{polled}");
    let exec = polled["tasks"][0]["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a claimed task: {polled}"))
        .to_string();
    assert_eq!(appends(), 1, "the poll's record rode with its claim");
    let (status, body) = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        json!({"execution_id": exec}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(appends(), 1, "the complete's record rode with it");
    assert_eq!(
        amends(),
        0,
        "the poll's and the complete's records needed no second write"
    );
    let r = newest(&*access).await;
    assert_eq!(
        (
            r.record.action.as_str(),
            r.record.status,
            r.record.target.as_deref()
        ),
        ("POST /v1/tasks/{id}/complete", 200, Some(id.as_str()))
    );

    // A refused cancel (the task has finished) changes nothing: appended, status 409.
    let (status, _) = call(&app, "POST", &format!("/v1/tasks/{id}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(appends(), 2);
    assert_eq!(newest(&*access).await.record.status, 409);

    // Every request has exactly one record.
    let all = access
        .list_audit(&AuditFilter::default(), 100)
        .await
        .unwrap();
    assert_eq!(all.records.len(), 5, "{:?}", all.records);
    running.shutdown(std::time::Duration::from_secs(1)).await;
}

/// Every write route on PostgreSQL: each successful write commits its record in its own
/// transaction (no append by the access layer), and every request has exactly one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_route_on_postgres_commits_its_record_with_its_action() {
    use sundial_store::{PushSecretStore, ScheduleStore, WorkflowStore};
    use sundial_store_postgres::testkit::{TestSchema, database_url};
    use sundial_store_postgres::{PostgresOptions, PostgresStore};

    let Some(url) = database_url() else { return };
    let guard = TestSchema::new(&url);
    let store = Arc::new(
        PostgresStore::connect(
            &url,
            PostgresOptions {
                schema: guard.schema.clone(),
                pool_size: 4,
                ..PostgresOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let access = Arc::new(CountingAccess::new(store.clone()));
    let schedules: Arc<dyn ScheduleStore> = store.clone();
    let workflows: Arc<dyn WorkflowStore> = store.clone();
    let push: Arc<dyn PushSecretStore> = store.clone();
    let sundial = Sundial::builder()
        .access_store(access.clone())
        .schedule_store(schedules)
        .workflow_store(workflows)
        .push_secret_store(push)
        .with_store(store.clone())
        .unwrap();
    let running = sundial.start();
    let app = router(sundial.clone(), ServerConfig::default());
    let mut requests = 0usize;
    // The first token (auth is off until one exists): the admin the rest runs as.
    let (status, admin) = call(
        &app,
        "POST",
        "/v1/tokens",
        json!({"name": "admin", "scope": "admin"}),
    )
    .await;
    requests += 1;
    assert_eq!(status, StatusCode::CREATED, "{admin}");
    assert_eq!(access.appends.load(Ordering::SeqCst), 0);
    let admin = admin["token"].as_str().unwrap().to_string();
    // `method path body` must succeed with its own write carrying the record.
    macro_rules! write_ok {
        ($method:expr, $path:expr, $body:expr) => {{
            let path: &str = &$path;
            let (status, body) = call_as(&app, Some(&admin), $method, path, $body).await;
            requests += 1;
            assert!(status.is_success(), "{} {path}: {status} {body}", $method);
            assert_eq!(
                access.appends.load(Ordering::SeqCst),
                0,
                "{} {path}: its record was appended on its own, not with its write",
                $method
            );
            assert_eq!(
                access.amends.load(Ordering::SeqCst),
                0,
                "{} {path}: its record was written, then amended by a second write",
                $method
            );
            let r = newest(&*access).await;
            assert_eq!(r.record.status, status.as_u16(), "{} {path}", $method);
            body
        }};
    }

    // Admin: a namespace and a token, then the token's revoke.
    write_ok!("POST", "/v1/namespaces", json!({"name": "acme"}));
    let token = write_ok!(
        "POST",
        "/v1/tokens",
        json!({"name": "ci", "scope": "reader"})
    );
    let token_id = token["id"].as_str().unwrap().to_string();
    write_ok!("POST", format!("/v1/tokens/{token_id}/revoke"), json!({}));

    // Queue settings and pause.
    write_ok!(
        "PUT",
        "/v1/queues/ops",
        json!({"retention": {"succeeded": "1h"}})
    );
    write_ok!("POST", "/v1/queues/ops/pause", json!({}));
    write_ok!("POST", "/v1/queues/ops/resume", json!({}));

    // Tasks: a create, its trigger, cancel and retry; a batch, its bulk cancel and bulk retry.
    let task = write_ok!(
        "POST",
        "/v1/tasks",
        json!({"queue": "ops", "kind": "k", "delay": "1h"})
    );
    let id = task["id"].as_str().unwrap().to_string();
    write_ok!("POST", format!("/v1/tasks/{id}/trigger"), json!({}));
    write_ok!("POST", format!("/v1/tasks/{id}/cancel"), json!({}));
    write_ok!("POST", format!("/v1/tasks/{id}/retry"), json!({}));
    write_ok!(
        "POST",
        "/v1/tasks:batch",
        json!({"tasks": [
            {"queue": "bulk", "kind": "k", "delay": "1h"},
            {"queue": "bulk", "kind": "k", "delay": "1h"}
        ]})
    );
    write_ok!("POST", "/v1/tasks:cancel", json!({"queue": "bulk"}));
    write_ok!("POST", "/v1/tasks:retry", json!({"queue": "bulk"}));

    // A worker: poll, heartbeat, fail.
    write_ok!("POST", "/v1/tasks", json!({"queue": "work", "kind": "k"}));
    let polled = write_ok!(
        "POST",
        "/v1/queues/work/poll",
        json!({"worker": "w", "max": 1, "wait": "5s"})
    );
    let claimed = &polled["tasks"][0];
    let (work_id, exec) = (
        claimed["id"].as_str().unwrap().to_string(),
        claimed["execution_id"].as_str().unwrap().to_string(),
    );
    write_ok!(
        "POST",
        format!("/v1/tasks/{work_id}/heartbeat"),
        json!({"execution_id": exec})
    );
    write_ok!(
        "POST",
        format!("/v1/tasks/{work_id}/fail"),
        json!({"execution_id": exec, "error": "boom", "retryable": false})
    );

    // Schedules.
    write_ok!(
        "POST",
        "/v1/schedules",
        json!({"id": "nightly", "every": "1h", "task": {"kind": "report"}})
    );
    write_ok!("PATCH", "/v1/schedules/nightly", json!({"every": "2h"}));
    write_ok!("POST", "/v1/schedules/nightly/pause", json!({}));
    write_ok!("POST", "/v1/schedules/nightly/unpause", json!({}));
    write_ok!("POST", "/v1/schedules/nightly/trigger", json!({}));
    write_ok!(
        "POST",
        "/v1/schedules/nightly/backfill",
        json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T04:00:00Z"})
    );
    write_ok!("DELETE", "/v1/schedules/nightly", json!({}));

    // Workflows (a type this process does not run: the run is stored and waits).
    write_ok!(
        "POST",
        "/v1/workflows",
        json!({"type": "order", "id": "o-1", "input": {}})
    );
    write_ok!(
        "POST",
        "/v1/workflows/o-1/signals/paid",
        json!({"input": {"amount": 5}})
    );
    write_ok!(
        "POST",
        "/v1/workflows/o-1/terminate",
        json!({"reason": "test"})
    );
    write_ok!(
        "POST",
        "/v1/workflows",
        json!({"type": "order", "id": "o-2", "input": {}})
    );
    write_ok!(
        "POST",
        "/v1/workflows/o-2/cancel",
        json!({"reason": "test"})
    );

    // Push secrets: a rotation, then the old secret's removal.
    let first = write_ok!("POST", "/v1/push/secrets", json!({}));
    write_ok!("POST", "/v1/push/secrets:rotate", json!({}));
    let first_id = first["id"].as_str().unwrap().to_string();
    write_ok!("DELETE", format!("/v1/push/secrets/{first_id}"), json!({}));

    let all = access
        .list_audit(&AuditFilter::default(), 1_000)
        .await
        .unwrap();
    assert_eq!(
        all.records.len(),
        requests,
        "one record a request: {:?}",
        all.records
    );
    running.shutdown(std::time::Duration::from_secs(1)).await;
    drop(guard);
}
