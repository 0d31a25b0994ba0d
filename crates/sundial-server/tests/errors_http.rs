//! Errors a new user meets, over HTTP: each says what is wrong and how to write it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};
use tower::ServiceExt;

async fn call(app: &axum::Router, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn errors_name_the_field_and_the_form() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());

    let (st, b) = call(
        &app,
        "POST",
        "/v1/tasks",
        r#"{"kind":"k","delay":"5 minutes"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "delay");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spaces are not allowed"),
        "{b}"
    );

    let (st, b) = call(&app, "POST", "/v1/tasks", r#"{"kind":"k","delay":300}"#).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "delay");
    assert!(
        b["error"]["message"].as_str().unwrap().contains("\"300s\""),
        "{b}"
    );

    let (st, b) = call(&app, "POST", "/v1/tasks", r#"{"queue":"q"}"#).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "kind", "{b}");

    let (st, b) = call(&app, "POST", "/v1/queues/q/poll", r#"{}"#).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "worker", "{b}");

    let (st, b) = call(&app, "POST", "/v1/tasks:batch", r#"[{"kind":"k"}]"#).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    let m = b["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("not an array") && m.contains(r#"{"tasks": [...]}"#),
        "{b}"
    );

    // serde reads a struct from an array of its fields: `[null, null]` would pass as an empty
    // rotation, and as a queue's retention with nothing set. Both are refused.
    let (st, b) = call(&app, "POST", "/v1/push/secrets:rotate", "[null, null]").await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (st, b) = call(
        &app,
        "PUT",
        "/v1/queues/q",
        r#"{"retention": [null, null]}"#,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(b["error"]["field"], "retention", "{b}");
    let (st, b) = call(
        &app,
        "PUT",
        "/v1/queues/q",
        r#"{"retention": {"dead": "3d"}}"#,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");

    // A duplicate key: the one code for "already exists".
    let (st, _) = call(
        &app,
        "POST",
        "/v1/tasks",
        r#"{"kind":"k","key":"a","delay":"1h"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, b) = call(
        &app,
        "POST",
        "/v1/tasks",
        r#"{"kind":"k","key":"a","delay":"1h"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(b["error"]["code"], "already_exists");
    assert!(b["error"]["existing_id"].is_string());

    // Completing with an execution id that never owned the task.
    let (_, t) = call(&app, "POST", "/v1/tasks", r#"{"kind":"k","delay":"1h"}"#).await;
    let id = t["id"].as_str().unwrap();
    let body = json!({"execution_id": "01890000-0000-7000-8000-000000000000"}).to_string();
    let (st, b) = call(&app, "POST", &format!("/v1/tasks/{id}/complete"), &body).await;
    assert_eq!(st, StatusCode::CONFLICT);
    let m = b["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("does not match the task's current attempt"),
        "{b}"
    );
    assert!(!m.contains("no longer owns"), "{b}");

    // Trigger of a finished task reads as a sentence.
    let (st, _) = call(&app, "POST", &format!("/v1/tasks/{id}/cancel"), "{}").await;
    assert_eq!(st, StatusCode::OK);
    let (st, again) = call(&app, "POST", &format!("/v1/tasks/{id}/cancel"), "{}").await;
    assert_eq!(st, StatusCode::OK, "cancel is idempotent: {again}");
    assert_eq!(again["state"], "cancelled");
    let (st, b) = call(&app, "POST", &format!("/v1/tasks/{id}/trigger"), "{}").await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(b["error"]["message"], "the task has been cancelled");

    // Cron: the allowed range is named.
    let (st, b) = call(
        &app,
        "POST",
        "/v1/schedules:preview",
        r#"{"cron":"0 25 * * *","from":"2030-01-01T00:00:00Z"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        b["error"]["message"].as_str().unwrap().contains("0-23"),
        "{b}"
    );
    let (st, b) = call(
        &app,
        "POST",
        "/v1/schedules:preview",
        r#"{"cron":"0 2 * * *"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "from", "{b}");
}

#[tokio::test]
async fn optional_bodies_take_null_as_none() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    let (st, _) = call(
        &app,
        "POST",
        "/v1/schedules",
        r#"{"id":"s","every":"1h","task":{"kind":"k"}}"#,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, b) = call(&app, "POST", "/v1/schedules/s/pause", "null").await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["paused"], true);
}

#[test]
fn the_document_lists_the_shared_error_answers() {
    let doc = serde_json::to_value(sundial_server::openapi()).unwrap();
    let create = &doc["paths"]["/v1/tasks"]["post"]["responses"];
    for status in ["400", "405", "413", "422", "503"] {
        assert!(create[status].is_object(), "POST /v1/tasks lacks {status}");
    }
    let get = &doc["paths"]["/v1/tasks/{id}"]["get"]["responses"];
    for status in ["404", "405", "503"] {
        assert!(
            get[status].is_object(),
            "GET /v1/tasks/{{id}} lacks {status}"
        );
    }
    // A payload is any JSON value, `null` included.
    let payload = &doc["components"]["schemas"]["TaskView"]["properties"]["payload"];
    assert!(payload.get("type").is_none(), "{payload}");
}
