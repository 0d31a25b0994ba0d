//! Push delivery over HTTP: targets on tasks and schedule templates (validated, nothing stored on
//! bad input), the signing secret routes, and a task delivered through the router's executor to
//! a loopback sink allowed by the server's push policy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use common::call;

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};

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
    // An overlap that would end past the year 9999 is refused, nothing stored.
    let (s, b) = call(
        &app,
        "POST",
        "/v1/push/secrets:rotate",
        Some(json!({"overlap": "88000000d"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(b.to_string().contains("overlap"), "{b}");
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

/// One request the sink received: its headers (names lower-cased) and body.
struct Received {
    path: String,
    headers: std::collections::HashMap<String, String>,
    body: String,
}

fn parse_request(text: &str) -> Received {
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let path = lines.next().unwrap().split(' ').nth(1).unwrap().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Received {
        path,
        headers,
        body: body.to_string(),
    }
}

impl Received {
    /// The `v1,` signatures of the call.
    fn signatures(&self) -> Vec<String> {
        self.headers
            .get("webhook-signature")
            .map(|s| s.split(' ').map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Whether `secret` signed the call.
    fn signed_by(&self, secret: &str) -> bool {
        let key = sundial_push::SigningKey::parse(secret).unwrap();
        let ts: i64 = self.headers["webhook-timestamp"].parse().unwrap();
        let want = key.sign(&self.headers["webhook-id"], ts, self.body.as_bytes());
        self.signatures().contains(&want)
    }
}

async fn next_call(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Received {
    let text = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    parse_request(&text)
}

fn ids(list: &Value) -> Vec<String> {
    list["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// Secrets are per namespace: `/v1/namespaces/acme/push/secrets…` adds, lists, rotates and
/// revokes acme's secrets only (another namespace's id is 404), and a task of acme is signed
/// with acme's secret and not default's, a default task with default's and not acme's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_and_signatures_are_per_namespace() {
    let (addr, mut rx) = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), config(&[addr.to_string()]));
    let running = sundial.start();
    let (s, b) = call(
        &app,
        "POST",
        "/v1/namespaces",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    let (s, default) = call(&app, "POST", "/v1/push/secrets", Some(json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{default}");
    let (s, acme) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/push/secrets",
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{acme}");
    let (d_id, d_secret) = (
        default["id"].as_str().unwrap(),
        default["secret"].as_str().unwrap(),
    );
    let (a_id, a_secret) = (
        acme["id"].as_str().unwrap(),
        acme["secret"].as_str().unwrap(),
    );
    assert_ne!(d_secret, a_secret);

    // Each namespace lists its own; another namespace's id is not found, and stays active.
    let (_, list) = call(&app, "GET", "/v1/push/secrets", None).await;
    assert_eq!(ids(&list), vec![d_id.to_string()]);
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/push/secrets", None).await;
    assert_eq!(ids(&list), vec![a_id.to_string()]);
    let (s, _) = call(&app, "DELETE", &format!("/v1/push/secrets/{a_id}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = call(
        &app,
        "DELETE",
        &format!("/v1/namespaces/acme/push/secrets/{d_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/push/secrets", None).await;
    assert_eq!(list["secrets"][0]["active"], true);
    let (_, list) = call(&app, "GET", "/v1/push/secrets", None).await;
    assert_eq!(list["secrets"][0]["active"], true);

    // Delivery: acme's task with acme's secret only, default's with default's only.
    let task = |path: &str| {
        json!({
            "kind": "k", "payload": {"p": path},
            "target": {"url": format!("http://{addr}{path}")}
        })
    };
    let (s, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(task("/acme")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let r = next_call(&mut rx).await;
    assert_eq!(r.path, "/acme");
    assert_eq!(r.signatures().len(), 1, "{:?}", r.headers);
    assert!(r.signed_by(a_secret), "acme's secret signs acme's task");
    assert!(!r.signed_by(d_secret), "default's secret does not");

    let (s, b) = call(&app, "POST", "/v1/tasks", Some(task("/default"))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let r = next_call(&mut rx).await;
    assert_eq!(r.path, "/default");
    assert_eq!(r.signatures().len(), 1, "{:?}", r.headers);
    assert!(
        r.signed_by(d_secret),
        "default's secret signs default's task"
    );
    assert!(!r.signed_by(a_secret), "acme's secret does not");

    // A rotation in acme expires acme's old secret after the overlap, not default's.
    let (s, acme2) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/push/secrets:rotate",
        Some(json!({"overlap": "1h"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{acme2}");
    let a2_secret = acme2["secret"].as_str().unwrap();
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/push/secrets", None).await;
    let secrets = list["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 2);
    assert!(secrets[0]["expires_at"].is_string(), "{list}");
    assert!(secrets[1]["expires_at"].is_null(), "{list}");
    let (_, list) = call(&app, "GET", "/v1/push/secrets", None).await;
    assert_eq!(ids(&list), vec![d_id.to_string()]);
    assert!(list["secrets"][0]["expires_at"].is_null(), "{list}");
    let (s, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(task("/acme2")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let r = next_call(&mut rx).await;
    assert_eq!(r.path, "/acme2");
    assert_eq!(r.signatures().len(), 2, "{:?}", r.headers);
    assert!(r.signed_by(a_secret) && r.signed_by(a2_secret));
    assert!(!r.signed_by(d_secret));

    // Revoking within acme works on acme's own id.
    let (s, after) = call(
        &app,
        "DELETE",
        &format!("/v1/namespaces/acme/push/secrets/{a_id}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{after}");
    assert_eq!(after["secrets"][0]["active"], false);
    assert_eq!(ids(&after).len(), 2);
    running.shutdown(Duration::from_secs(1)).await;
}
