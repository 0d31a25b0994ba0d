//! What the router tests share: one JSON call through the router, served in-process.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // test helpers; not every test uses each

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

/// `method path` with a JSON body (or none, still saying it speaks JSON): the status, the body
/// as JSON (`null` when it is not) and the headers.
pub async fn call_with_headers(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value, HeaderMap) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(match body {
            Some(b) => Body::from(b.to_string()),
            None => Body::empty(),
        })
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

/// [`call_with_headers`] without the headers.
pub async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (status, body, _) = call_with_headers(app, method, path, body).await;
    (status, body)
}

/// The first admin token, written straight into the store as `sundial token create --bootstrap`
/// makes it.
pub async fn root_token(sundial: &sundial::Sundial) -> String {
    let store = sundial.access_store().unwrap().clone();
    let (new, issued) = sundial_server::admin::new_token(
        sundial_server::admin::CreateToken {
            name: "root".into(),
            scope: "admin".into(),
            namespace: None,
            expires_in: None,
        },
        sundial.clock().now(),
    )
    .unwrap();
    store.create_token(new).await.unwrap();
    issued.token
}
