//! The `error_group` filter over HTTP: `GET /v1/tasks`, `POST /v1/tasks:retry` and
//! `POST /v1/tasks:cancel` (dry runs included) select exactly the tasks whose last error's first
//! line is the value, as the dead letters group them, and a value no group can have is a `422`
//! naming the field.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};
use tower::ServiceExt;

async fn call(app: &axum::Router, method: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path);
    let body = if body.is_null() {
        Body::empty()
    } else {
        req = req.header("content-type", "application/json");
        Body::from(body.to_string())
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn ok(app: &axum::Router, method: &str, path: &str, body: Value) -> Value {
    let (st, b) = call(app, method, path, body).await;
    assert!(st.is_success(), "{method} {path}: {st} {b}");
    b
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The ids listed by `GET /v1/tasks?{query}`, sorted.
async fn listed(app: &axum::Router, query: &str) -> Vec<String> {
    let b = ok(
        app,
        "GET",
        &format!("/v1/tasks?{query}&limit=1000"),
        Value::Null,
    )
    .await;
    let mut ids: Vec<String> = b["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn bulk_actions_and_the_list_take_exactly_one_error_group() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());

    // Queue `mail`: 3 die of "smtp 550" (each with its own trace), 2 of "timeout", 1 of
    // "smtp 550 later" (another group, of which "smtp 550" is a prefix); 2 fail with "smtp 550"
    // and are scheduled again (attempts left). Queue `other`: 1 dies of "smtp 550".
    let plan: [(&str, &str, bool); 9] = [
        ("mail", "smtp 550\n  at send (1)", false),
        ("mail", "smtp 550\n  at send (2)", false),
        ("mail", "smtp 550", false),
        ("mail", "timeout", false),
        ("mail", "timeout\nafter 30s", false),
        ("mail", "smtp 550 later", false),
        ("mail", "smtp 550\nwill retry", true),
        ("mail", "smtp 550", true),
        ("other", "smtp 550\n  at send (3)", false),
    ];
    let mut ids = Vec::new();
    for (queue, _, retryable) in plan {
        let t = ok(
            &app,
            "POST",
            "/v1/tasks",
            json!({"kind": "send", "queue": queue, "max_attempts": if retryable { 5 } else { 1 }}),
        )
        .await;
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    sundial.stepper().settle().await;
    for queue in ["mail", "other"] {
        let got = ok(
            &app,
            "POST",
            &format!("/v1/queues/{queue}/poll"),
            json!({"worker": "w", "max": 100, "wait": "0s"}),
        )
        .await;
        for t in got["tasks"].as_array().unwrap() {
            let id = t["id"].as_str().unwrap();
            let i = ids.iter().position(|x| x == id).unwrap();
            let (_, error, retryable) = plan[i];
            ok(
                &app,
                "POST",
                &format!("/v1/tasks/{id}/fail"),
                json!({"execution_id": t["execution_id"], "error": error, "retryable": retryable}),
            )
            .await;
        }
    }
    let pick = |is: &[usize]| {
        let mut v: Vec<String> = is.iter().map(|i| ids[*i].clone()).collect();
        v.sort();
        v
    };
    let smtp = format!("error_group={}", enc("smtp 550"));

    // The list: the group in one queue's dead letters, in every state, across queues.
    assert_eq!(
        listed(&app, &format!("queue=mail&state=dead&{smtp}")).await,
        pick(&[0, 1, 2])
    );
    assert_eq!(
        listed(&app, &format!("queue=mail&{smtp}")).await,
        pick(&[0, 1, 2, 6, 7])
    );
    assert_eq!(
        listed(&app, &format!("state=dead&{smtp}")).await,
        pick(&[0, 1, 2, 8])
    );
    assert_eq!(
        listed(&app, "queue=mail&state=dead&error_group=timeout").await,
        pick(&[3, 4])
    );
    assert!(listed(&app, "queue=mail&error_group=smtp").await.is_empty());

    // A dry run counts the group, and only it; the retry then revives only it.
    let body =
        json!({"queue": "mail", "state": "dead", "error_group": "smtp 550", "dry_run": true});
    let b = ok(&app, "POST", "/v1/tasks:retry", body).await;
    assert_eq!(b, json!({"matched": 3, "changed": 0, "dry_run": true}));
    assert_eq!(
        listed(&app, "state=dead").await.len(),
        7,
        "a dry run changes nothing"
    );
    let body = json!({"queue": "mail", "state": "dead", "error_group": "smtp 550"});
    let b = ok(&app, "POST", "/v1/tasks:retry", body).await;
    assert_eq!(b, json!({"matched": 3, "changed": 3, "dry_run": false}));
    assert_eq!(listed(&app, "state=dead").await, pick(&[3, 4, 5, 8]));

    // Cancel: the group's live tasks of the queue (the three retried and the two waiting).
    let body = json!({"queue": "mail", "error_group": "smtp 550", "dry_run": true});
    let b = ok(&app, "POST", "/v1/tasks:cancel", body).await;
    assert_eq!(b["matched"], 5, "{b}");
    // An error group alone is a filter: the one task of `other` is dead, so nothing to cancel.
    let body = json!({"error_group": "smtp 550"});
    let b = ok(&app, "POST", "/v1/tasks:cancel", body).await;
    assert_eq!(b, json!({"matched": 5, "changed": 5, "dry_run": false}));
    assert_eq!(
        listed(&app, "state=cancelled").await,
        pick(&[0, 1, 2, 6, 7])
    );
    assert_eq!(listed(&app, "state=dead").await, pick(&[3, 4, 5, 8]));

    // Values no group can have are refused, naming the field, in the list and the bodies.
    let long = "é".repeat(201);
    for bad in ["", "smtp 550\nat send", long.as_str()] {
        let (st, b) = call(
            &app,
            "GET",
            &format!("/v1/tasks?error_group={}", enc(bad)),
            Value::Null,
        )
        .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {b}");
        assert_eq!(b["error"]["field"], "error_group", "{b}");
        for route in ["/v1/tasks:retry", "/v1/tasks:cancel"] {
            let (st, b) = call(&app, "POST", route, json!({"error_group": bad})).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{route} {bad:?}: {b}");
            assert_eq!(b["error"]["field"], "error_group", "{b}");
        }
    }
    let (_, b) = call(
        &app,
        "GET",
        &format!("/v1/tasks?error_group={}", enc(&long)),
        Value::Null,
    )
    .await;
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 200 characters"),
        "{b}"
    );
    // 200 characters (not bytes) is the bound.
    let (st, b) = call(
        &app,
        "GET",
        &format!("/v1/tasks?error_group={}", enc(&"é".repeat(200))),
        Value::Null,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
}
