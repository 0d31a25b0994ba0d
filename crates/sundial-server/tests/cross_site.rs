//! No cross-site writes: every write route listed in `/openapi.json` refuses the content types a
//! browser may send without a preflight (and a bodiless write that carries neither JSON nor an
//! `Authorization` header) with `415`, and nothing is stored.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::ServerConfig;
use tower::ServiceExt;

/// A body that the route would accept (where it creates something), else `{}`.
fn good_body(method: &str, path: &str) -> Value {
    match (method, path) {
        ("post", "/v1/tasks") => json!({"kind": "k", "queue": "q"}),
        ("post", "/v1/tasks:batch") => json!({"tasks": [{"kind": "k"}]}),
        ("post", "/v1/schedules") => json!({"id": "s1", "every": "1h", "task": {"kind": "x"}}),
        ("post", "/v1/workflows") => json!({"type": "order", "id": "o-1"}),
        _ => json!({}),
    }
}

/// Every (method, path) of the document except reads, with its parameters filled in.
fn write_routes() -> Vec<(String, String, String)> {
    let doc = serde_json::to_value(sundial_server::openapi()).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            if matches!(method.as_str(), "get" | "head" | "options") {
                continue;
            }
            let concrete = path
                .replace("{id}", "0190a4c8-0000-7000-8000-000000000000")
                .replace("{task}", "0190a4c8-0000-7000-8000-000000000000")
                .replace("{queue}", "q")
                .replace("{name}", "sig");
            assert!(!concrete.contains('{'), "a parameter to fill in: {path}");
            out.push((method.clone(), path.clone(), concrete));
        }
    }
    assert!(
        out.len() >= 20,
        "the document lists the write routes: {out:?}"
    );
    out
}

async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method.to_ascii_uppercase().as_str())
        .uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn stored(app: &axum::Router) -> (usize, usize, usize) {
    let mut n = Vec::new();
    for (path, field) in [
        ("/v1/tasks", "tasks"),
        ("/v1/schedules", "schedules"),
        ("/v1/workflows", "workflows"),
    ] {
        let (st, b) = send(app, "get", path, &[], None).await;
        assert_eq!(st, StatusCode::OK, "{path}: {b}");
        n.push(b[field].as_array().map(Vec::len).expect(field));
    }
    (n[0], n[1], n[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_json_are_415_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(sundial, ServerConfig::default());
    let routes = write_routes();

    for (method, path, uri) in &routes {
        let body = good_body(method, path).to_string();
        for ct in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=----x",
        ] {
            let (st, b) = send(
                &app,
                method,
                uri,
                &[("content-type", ct)],
                Some(body.clone()),
            )
            .await;
            assert_eq!(
                st,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{method} {path} as {ct}: {b}"
            );
            assert_eq!(b["error"]["code"], "unsupported_media_type");
        }
        // A bodiless write as a page's fetch() would send it: no content type, no credentials.
        let (st, b) = send(&app, method, uri, &[], None).await;
        assert_eq!(
            st,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method} {path} bare: {b}"
        );
        // A body with no content type at all is refused too.
        let (st, _) = send(&app, method, uri, &[], Some(body.clone())).await;
        assert_eq!(
            st,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method} {path} untyped body"
        );
    }
    assert_eq!(
        stored(&app).await,
        (0, 0, 0),
        "a refused write stored something"
    );

    // The same bodies as JSON are accepted: the refusals above were the content type's doing.
    for (method, path) in [
        ("post", "/v1/tasks"),
        ("post", "/v1/schedules"),
        ("post", "/v1/workflows"),
    ] {
        let (st, b) = send(
            &app,
            method,
            path,
            &[("content-type", "application/json; charset=utf-8")],
            Some(good_body(method, path).to_string()),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{path}: {b}");
    }
    let (tasks, schedules, workflows) = stored(&app).await;
    assert!(tasks >= 1 && schedules == 1 && workflows == 1);

    // A bodiless write passes the guard with JSON's content type, or with an Authorization
    // header (a browser must ask before sending one, and this server never answers a preflight).
    let (_, t) = send(
        &app,
        "post",
        "/v1/tasks",
        &[("content-type", "application/json")],
        Some(json!({"kind": "k", "delay": "1h"}).to_string()),
    )
    .await;
    let id = t["id"].as_str().unwrap().to_string();
    let (st, b) = send(&app, "post", &format!("/v1/tasks/{id}/trigger"), &[], None).await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{b}");
    let (st, b) = send(
        &app,
        "post",
        &format!("/v1/tasks/{id}/trigger"),
        &[("authorization", "Bearer x")],
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (st, b) = send(
        &app,
        "post",
        &format!("/v1/tasks/{id}/cancel"),
        &[("content-type", "application/json")],
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["state"], "cancelled");
}

/// A method a route does not have is `405` with an `Allow` header naming the ones it has, whatever
/// the request carries: a bodiless `TRACE` with neither JSON nor a token is not a cross-site write
/// to refuse with `415`, it is a method the route lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_a_route_lacks_are_405_with_allow() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(sundial, ServerConfig::default());
    let doc = serde_json::to_value(sundial_server::openapi()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let has: Vec<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|m| m.to_ascii_uppercase())
            .collect();
        let concrete = path
            .replace("{id}", "0190a4c8-0000-7000-8000-000000000000")
            .replace("{task}", "0190a4c8-0000-7000-8000-000000000000")
            .replace("{queue}", "q")
            .replace("{name}", "sig");
        for method in ["TRACE", "GET", "POST", "PUT", "PATCH", "DELETE"] {
            if has.iter().any(|m| m == method) {
                continue;
            }
            for headers in [&[][..], &[("content-type", "application/json")][..]] {
                let mut req = Request::builder().method(method).uri(&concrete);
                for (k, v) in headers {
                    req = req.header(*k, *v);
                }
                let resp = app
                    .clone()
                    .oneshot(req.body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                assert_eq!(
                    resp.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} {headers:?}"
                );
                let allow = resp.headers()["allow"].to_str().unwrap().to_string();
                for m in &has {
                    assert!(allow.split(',').any(|a| a == m), "{path}: {allow}");
                }
                let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(body["error"]["code"], "method_not_allowed", "{path}");
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked}");
}
