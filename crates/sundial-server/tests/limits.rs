//! Limits against abuse, through the router: a caller holding its cap of long polls gets `429`
//! with `Retry-After` for one more (another caller is unaffected), a body that does not arrive in
//! time is `408`, and a body over the limit is `413`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::ServerConfig;
use sundial_server::access::AccessConfig;
use tower::ServiceExt;

async fn send(
    app: &axum::Router,
    uri: &str,
    token: Option<&str>,
    body: Body,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let mut req = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

async fn token(sundial: &Sundial, name: &str) -> String {
    let (new, issued) = sundial_server::admin::new_token(
        sundial_server::admin::CreateToken {
            name: name.into(),
            scope: "worker".into(),
            namespace: None,
            expires_in: None,
        },
        sundial.clock().now(),
    )
    .unwrap();
    sundial
        .access_store()
        .unwrap()
        .create_token(new)
        .await
        .unwrap();
    issued.token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_long_poll_cap_gets_429_and_others_still_poll() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let a = token(&sundial, "a").await;
    let b = token(&sundial, "b").await;
    let app = sundial_server::router(
        sundial.clone(),
        ServerConfig {
            access: AccessConfig {
                max_polls_per_caller: 2,
                ..AccessConfig::default()
            },
            ..ServerConfig::default()
        },
    );
    let _running = sundial.start();
    let poll = |wait: &str| Body::from(json!({"worker": "w", "wait": wait}).to_string());
    let mut held = Vec::new();
    for _ in 0..2 {
        let app = app.clone();
        let a = a.clone();
        let body = poll("3s");
        held.push(tokio::spawn(async move {
            send(&app, "/v1/queues/q/poll", Some(&a), body).await.0
        }));
    }
    // Let both polls start waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, body, headers) = send(&app, "/v1/queues/q/poll", Some(&a), poll("0s")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_polls");
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    let (st, body, _) = send(&app, "/v1/queues/q/poll", Some(&b), poll("0s")).await;
    assert_eq!(st, StatusCode::OK, "another token is not limited: {body}");
    for h in held {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    // The slots were given back.
    let (st, _, _) = send(&app, "/v1/queues/q/poll", Some(&a), poll("0s")).await;
    assert_eq!(st, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_408_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(
        sundial.clone(),
        ServerConfig {
            access: AccessConfig {
                body_read_timeout: Duration::from_millis(300),
                ..AccessConfig::default()
            },
            ..ServerConfig::default()
        },
    );
    // Half a body, then nothing.
    let stream =
        futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"{\"kind\":"))])
            .chain(futures::stream::pending());
    let (st, body, _) = send(&app, "/v1/tasks", None, Body::from_stream(stream)).await;
    assert_eq!(st, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert!(
        sundial
            .list(Default::default(), 10)
            .await
            .unwrap()
            .tasks
            .is_empty()
    );

    let big = "x".repeat(2 * 1024 * 1024);
    let (st, _, _) = send(
        &app,
        "/v1/tasks",
        None,
        Body::from(json!({"kind": "k", "payload": big}).to_string()),
    )
    .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
}
