//! The router as a library: served in-process (no socket), with configurations the binary does
//! not use by default.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use common::call;

use axum::http::StatusCode;
use serde_json::json;
use sundial::Sundial;
use sundial_server::{ServerConfig, router};

#[tokio::test]
async fn limits_come_from_the_config_and_metrics_need_a_handle() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(
        sundial.clone(),
        ServerConfig {
            max_batch_items: 2,
            max_batch_body_bytes: 4 * 1024,
            max_body_bytes: 2 * 1024,
            ..ServerConfig::default()
        },
    );

    let (status, body) = call(&app, "POST", "/v1/tasks", Some(json!({"kind": "k"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The batch route has its own (larger) body limit and an item limit.
    let three = json!({"tasks": [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}]});
    let (status, body) = call(&app, "POST", "/v1/tasks:batch", Some(three)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let pad = "x".repeat(3 * 1024);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/tasks:batch",
        Some(json!({"tasks": [{"kind": "a", "payload": pad}]})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "3 KiB fits the batch limit: {body}"
    );
    let (status, _) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({"kind": "a", "payload": pad})),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "3 KiB is over the single limit"
    );
    let (status, _) = call(
        &app,
        "POST",
        "/v1/tasks:batch",
        Some(json!({"tasks": [{"kind": "a", "payload": "x".repeat(5 * 1024)}]})),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // No Prometheus handle given: /metrics says so.
    let (status, body) = call(&app, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");

    let page = sundial.list(Default::default(), 100).await.unwrap();
    assert_eq!(
        page.tasks.len(),
        2,
        "only the two accepted requests stored tasks"
    );
}

#[tokio::test]
async fn poll_wait_is_capped_by_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::builder()
        .config(sundial::Config {
            max_poll_wait: std::time::Duration::from_millis(200),
            ..sundial::Config::default()
        })
        .open(dir.path())
        .await
        .unwrap();
    let running = sundial.start();
    let app = router(
        sundial.clone(),
        ServerConfig {
            default_poll_wait: std::time::Duration::from_millis(100),
            ..ServerConfig::default()
        },
    );
    // Asks for an hour; the cap answers (empty) long before. The outer timeout only bounds the
    // test if the cap were ignored.
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        call(
            &app,
            "POST",
            "/v1/queues/q/poll",
            Some(json!({"worker": "w", "wait": "1h"})),
        ),
    )
    .await
    .expect("the capped poll answered");
    assert_eq!(r.0, StatusCode::OK);
    assert_eq!(r.1, json!({"tasks": []}));
    running.shutdown(std::time::Duration::from_secs(5)).await;
}

#[test]
fn openapi_document_describes_every_route() {
    let doc = serde_json::to_value(sundial_server::openapi()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/tasks",
        "/v1/tasks:batch",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/cancel",
        "/v1/tasks/{id}/trigger",
        "/v1/queues/{queue}/poll",
        "/v1/tasks/{id}/heartbeat",
        "/v1/tasks/{id}/complete",
        "/v1/tasks/{id}/fail",
        "/healthz",
        "/metrics",
        "/v1/schedules",
        "/v1/schedules:preview",
        "/v1/schedules/{id}",
        "/v1/schedules/{id}/pause",
        "/v1/schedules/{id}/unpause",
        "/v1/schedules/{id}/trigger",
        "/v1/schedules/{id}/backfill",
        "/v1/schedules/{id}/fires",
        "/v1/workflows",
        "/v1/workflows/{id}",
        "/v1/workflows/{id}/signals/{name}",
        "/v1/workflows/{id}/cancel",
        "/v1/workflows/{id}/terminate",
        "/v1/workflows/{id}/history",
        "/v1/workflow-tasks/poll",
        "/v1/workflow-tasks/{task}/complete",
        "/v1/workflow-activities/poll",
        "/v1/workflow-activities/{task}/complete",
        "/v1/workflow-activities/{task}/fail",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    for (p, methods) in [
        ("/v1/schedules", &["get", "post"][..]),
        ("/v1/schedules/{id}", &["get", "patch", "delete"][..]),
        ("/v1/workflows", &["get", "post"][..]),
    ] {
        for m in methods {
            assert!(doc["paths"][p][m].is_object(), "{m} {p} missing");
        }
    }
    assert!(doc["paths"]["/v1/workflows"]["get"]["parameters"].is_array());
    // Operation ids name operations across the whole document, so they must be unique.
    let mut ids = std::collections::HashSet::new();
    for (path, ops) in paths {
        for (method, op) in ops.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            assert!(
                ids.insert(id.clone()),
                "{method} {path}: operationId {id:?} repeats"
            );
        }
    }
    assert!(doc["paths"]["/v1/schedules/{id}/fires"]["get"]["parameters"].is_array());
    assert!(doc["paths"]["/v1/tasks:batch"]["post"].is_object());
    assert!(doc["paths"]["/v1/tasks"]["get"]["parameters"].is_array());
    for schema in [
        "CreateTask",
        "TaskView",
        "PollRequest",
        "ErrorBody",
        "BatchItem",
        "ScheduleRequest",
        "ScheduleView",
        "PreviewRequest",
        "FireList",
        "StartRequest",
        "WorkflowView",
        "WorkflowList",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
}

/// Creates with an idempotency key: a retry with the same key and body answers 200 with the
/// original task; another body answers 409 `idempotency_conflict`; a higher version is a new
/// task; a batch item with a key is refused (single creates only).
#[tokio::test]
async fn idempotent_creates_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    let body = json!({"kind": "ship", "payload": {"order": 17}, "delay": "1h",
                      "idempotency_key": "order-17"});
    let (status, first) = call(&app, "POST", "/v1/tasks", Some(body.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = call(&app, "POST", "/v1/tasks", Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"], "the original task");
    let mut other = body.clone();
    other["payload"] = json!({"order": 18});
    let (status, err) = call(&app, "POST", "/v1/tasks", Some(other)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["error"]["code"], "idempotency_conflict");
    assert_eq!(err["error"]["existing_id"], first["id"]);
    let mut v1 = body.clone();
    v1["idempotency_version"] = json!(1);
    let (status, newer) = call(&app, "POST", "/v1/tasks", Some(v1)).await;
    assert_eq!(status, StatusCode::CREATED, "{newer}");
    assert_ne!(newer["id"], first["id"]);
    let (status, err) = call(&app, "POST", "/v1/tasks", Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT, "an older version: {err}");
    let batch = json!({"tasks": [{"kind": "a"}, {"kind": "b", "idempotency_key": "x"}]});
    let (status, err) = call(&app, "POST", "/v1/tasks:batch", Some(batch)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(err["error"]["index"], 1);
}
