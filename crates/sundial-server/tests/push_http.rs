//! Push delivery over HTTP: targets on tasks and schedule templates (validated, nothing stored on
//! bad input), the signing secret routes, and a task delivered through the router's executor to
//! a loopback sink allowed by the server's push policy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};
use tower::ServiceExt;

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
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
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn config(allow: &[String]) -> ServerConfig {
    let mut c = ServerConfig::default();
    c.push.client.policy = sundial_push::AddressPolicy::parse(allow).unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), config(&[]));
    for (target, field) in [
        (json!({"url": "ftp://example.com/"}), "target.url"),
        (json!({"url": "https://u:p@example.com/"}), "target.url"),
        (
            json!({"url": "https://example.com/", "method": "TRACE"}),
            "target.method",
        ),
        (
            json!({"url": "https://example.com/", "timeout": "soon"}),
            "target.timeout",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"Host": "x"}}),
            "target.headers",
        ),
        (
            json!({"url": "https://example.com/", "retry_statuses": [410]}),
            "target.retry_statuses",
        ),
    ] {
        let (s, b) = call(
            &app,
            "POST",
            "/v1/tasks",
            Some(json!({"kind": "k", "target": target})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert_eq!(b["error"]["field"], field, "{b}");
    }
    let (s, b) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({"kind": "k", "target": {"url": "https://example.com/", "bogus": 1}})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (_, list) = call(&app, "GET", "/v1/tasks", None).await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 0, "nothing stored");

    // A schedule's template takes a target too, checked the same way.
    let (s, b) = call(
        &app,
        "POST",
        "/v1/schedules",
        Some(json!({
            "id": "bad", "every": "1h", "task": {"kind": "k", "target": {"url": "gopher://x/"}}
        })),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, b) = call(
        &app,
        "POST",
        "/v1/schedules",
        Some(json!({
            "id": "good", "every": "1h",
            "task": {"kind": "k", "target": {"url": "https://example.com/tick", "timeout": "5s"}}
        })),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["task"]["target"]["url"], "https://example.com/tick");
    assert_eq!(b["task"]["target"]["timeout"], "5s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_added_rotated_listed_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), config(&[]));
    let (s, first) = call(&app, "POST", "/v1/push/secrets", Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let full = first["secret"].as_str().unwrap();
    assert!(full.starts_with("whsec_") && full.len() > 30, "{full}");
    let (s, b) = call(
        &app,
        "POST",
        "/v1/push/secrets",
        Some(json!({"secret": "whsec_short"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, second) = call(
        &app,
        "POST",
        "/v1/push/secrets:rotate",
        Some(json!({"overlap": "1h"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{second}");
    let (s, list) = call(&app, "GET", "/v1/push/secrets", None).await;
    assert_eq!(s, StatusCode::OK);
    let secrets = list["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 2);
    assert!(
        secrets.iter().all(|s| s["active"] == true),
        "both sign during the overlap"
    );
    assert!(secrets[0]["expires_at"].is_string());
    assert!(
        secrets
            .iter()
            .all(|s| s["secret"].as_str().unwrap().ends_with('…')),
        "masked"
    );
    let id = first["id"].as_str().unwrap();
    let (s, after) = call(&app, "DELETE", &format!("/v1/push/secrets/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(after["secrets"][0]["active"], false);
    let (s, _) = call(&app, "DELETE", "/v1/push/secrets/ps_nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// A loopback sink that answers every request 204 and sends its text (head and body) on.
async fn sink() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = Vec::new();
                loop {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some(i) = text.find("\r\n\r\n") {
                        let len: usize = text[..i]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if got.len() >= i + 4 + len {
                            let _ = tx.send(text);
                            let _ = sock
                                .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                                .await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_a_target_is_delivered_through_the_router() {
    let (addr, mut rx) = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), config(&[addr.to_string()]));
    let running = sundial.start();
    let (s, _) = call(&app, "POST", "/v1/push/secrets", Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, task) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({
            "kind": "reminder", "payload": {"n": 1}, "delay": "200ms",
            "target": {"url": format!("http://{addr}/in"), "headers": {"X-Tenant": "acme"}}
        })),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    assert_eq!(task["target"]["url"], format!("http://{addr}/in"));
    assert_eq!(task["target"]["headers"]["x-tenant"], "acme");
    let req = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(req.starts_with("POST /in HTTP/1.1"), "{req}");
    assert!(req.contains("webhook-signature: v1,"), "{req}");
    assert!(req.ends_with(r#"{"n":1}"#), "{req}");
    let id = task["id"].as_str().unwrap();
    let mut done = Value::Null;
    for _ in 0..200 {
        let (_, t) = call(&app, "GET", &format!("/v1/tasks/{id}"), None).await;
        if t["state"] == "succeeded" {
            done = t;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done["result"]["status"], 204, "{done}");
    running.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_default_target_over_http() {
    let (addr, mut rx) = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let mut cfg = config(&[addr.to_string()]);
    cfg.queue_push.refresh = Duration::from_millis(100);
    let app = router(sundial.clone(), cfg);
    let running = sundial.start();
    // Validated like a task's target: the error names the field, nothing is stored.
    for (target, field) in [
        (json!({"url": "ftp://example.com/"}), "target.url"),
        (
            json!({"url": "https://example.com/", "method": "TRACE"}),
            "target.method",
        ),
        (
            json!({"url": "https://example.com/", "headers": {"webhook-id": "x"}}),
            "target.headers",
        ),
    ] {
        let (s, body) = call(
            &app,
            "PUT",
            "/v1/queues/hooks",
            Some(json!({"target": target})),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let (s, _) = call(&app, "GET", "/v1/queues/hooks", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing stored");

    let (s, _) = call(&app, "POST", "/v1/push/secrets", Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED);
    let url = format!("http://{addr}/q");
    let (s, q) = call(
        &app,
        "PUT",
        "/v1/queues/hooks",
        Some(json!({"target": {"url": url, "headers": {"X-Team": "a"}, "timeout": "5s"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{q}");
    assert_eq!(q["settings"]["target"]["url"], url);
    assert_eq!(q["settings"]["target"]["headers"]["x-team"], "a");
    let (_, list) = call(&app, "GET", "/v1/queues", None).await;
    let listed = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "hooks")
        .cloned()
        .unwrap();
    assert_eq!(listed["settings"]["target"]["timeout"], "5s", "{listed}");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (s, task) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({"kind": "remind", "queue": "hooks", "payload": {"n": 2}, "delay": "200ms"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    assert!(task.get("target").is_none_or(Value::is_null), "{task}");
    let req = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(req.starts_with("POST /q HTTP/1.1"), "{req}");
    assert!(req.contains("x-team: a"), "{req}");
    assert!(req.ends_with(r#"{"n":2}"#), "{req}");
    let id = task["id"].as_str().unwrap();
    let mut attempts = Value::Null;
    for _ in 0..200 {
        let (_, a) = call(&app, "GET", &format!("/v1/tasks/{id}/attempts"), None).await;
        if a["attempts"][0]["outcome"] == "succeeded" {
            attempts = a;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(attempts["attempts"][0]["status_code"], 204, "{attempts}");
    assert_eq!(
        attempts["attempts"][0]["worker"], "sundial-push",
        "{attempts}"
    );
    assert!(
        attempts["attempts"][0]["duration_ms"].is_u64(),
        "{attempts}"
    );
    running.shutdown(Duration::from_secs(1)).await;
}
