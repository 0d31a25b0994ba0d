//! The workflows API through the router (no network): start, get, list, signal, cancel,
//! terminate and history, the error statuses, a workflow run to completion over HTTP, and the
//! wait forms of the worker polls (milliseconds, or a duration string as the task API takes).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use sundial::{ManualClock, Sundial, Timestamp};
use sundial_server::ServerConfig;
use sundial_workflow::{WorkflowContext, WorkflowError, Workflows};
use tower::ServiceExt;

/// 2024-01-01T00:00:00Z.
const T0: Timestamp = Timestamp(1_704_067_200_000);

async fn open(dir: &tempfile::TempDir) -> Sundial {
    Sundial::builder()
        .clock(Arc::new(ManualClock::new(T0)))
        .open(dir.path())
        .await
        .unwrap()
}

async fn call(
    app: &axum::Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(match body {
            Some(b) => Body::from(b.to_string()),
            None => Body::empty(),
        })
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    (status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_management_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let app = sundial_server::router(open(&dir).await, ServerConfig::default());

    // A type this process does not run: the run is stored and waits for a worker.
    let (st, b) = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(json!({"type": "order", "id": "o-1", "input": {"amount": 5}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["id"], "o-1");
    assert_eq!(b["status"], "running");
    let run_id = b["run_id"].as_str().unwrap().to_string();

    let (st, b) = call(&app, Method::GET, "/v1/workflows/o-1", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(b["type"], "order");
    assert_eq!(b["run_id"], json!(run_id));
    assert_eq!(b["status"], "running");
    assert!(b.get("result").is_none());

    let (st, b) = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(json!({"type": "order", "id": "o-1"})),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(b["error"]["code"], "already_exists");

    for (body, field) in [
        (
            json!({"type": "order", "id_reuse": "sometimes"}),
            "id_reuse",
        ),
        (json!({"type": "bad type"}), "type"),
        (json!({"type": "order", "colour": "red"}), "colour"),
    ] {
        let (st, b) = call(&app, Method::POST, "/v1/workflows", Some(body)).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert_eq!(b["error"]["code"], "invalid");
        assert!(b["error"]["field"].as_str().unwrap().contains(field), "{b}");
    }

    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/workflows/o-1/signals/paid",
        Some(json!({"input": {"amount": 5}})),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (st, _) = call(&app, Method::POST, "/v1/workflows/o-1/signals/poke", None).await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/workflows/o-1/cancel",
        Some(json!({"reason": "changed my mind"})),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED);

    let (st, b) = call(&app, Method::GET, "/v1/workflows/o-1/history", None).await;
    assert_eq!(st, StatusCode::OK);
    let types: Vec<&str> = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "workflow_started",
            "signal_received",
            "signal_received",
            "cancel_requested"
        ]
    );
    assert_eq!(b["events"][1]["input"], json!({"amount": 5}));

    let (st, b) = call(&app, Method::POST, "/v1/workflows/o-1/terminate", None).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "terminated");
    assert_eq!(b["error"], "terminated over HTTP");

    let (st, b) = call(&app, Method::POST, "/v1/workflows/o-1/signals/paid", None).await;
    assert_eq!(st, StatusCode::CONFLICT);
    assert_eq!(b["error"]["code"], "wrong_state");
    assert_eq!(b["error"]["state"], "terminated");

    call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(json!({"type": "ship", "id": "s-1"})),
    )
    .await;
    let (st, b) = call(&app, Method::GET, "/v1/workflows?status=terminated", None).await;
    assert_eq!(st, StatusCode::OK);
    let ids: Vec<&str> = b["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["o-1"]);
    let (_, b) = call(&app, Method::GET, "/v1/workflows?limit=1", None).await;
    assert_eq!(b["workflows"][0]["id"], "o-1");
    assert_eq!(b["next_cursor"], "o-1");
    let (_, b) = call(&app, Method::GET, "/v1/workflows?limit=1&cursor=o-1", None).await;
    assert_eq!(b["workflows"][0]["id"], "s-1");
    assert!(b.get("next_cursor").is_none());
    let (st, _) = call(
        &app,
        Method::GET,
        "/v1/workflows?type=ship&status=running",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);

    let (st, b) = call(&app, Method::GET, "/v1/workflows?status=sleeping", None).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["error"]["field"], "status");
    let (st, b) = call(&app, Method::GET, "/v1/workflows/nope", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(b["error"]["code"], "not_found");
    let (st, _) = call(&app, Method::POST, "/v1/workflows/nope/cancel", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = call(&app, Method::GET, "/v1/workflows/nope/history", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_runs_to_completion_over_http() {
    async fn greet(ctx: WorkflowContext, greeting: String) -> Result<String, WorkflowError> {
        let name: String = ctx.signal("name").await?;
        Ok(format!("{greeting}, {name}"))
    }
    let dir = tempfile::tempdir().unwrap();
    let sundial = open(&dir).await;
    let workflows = Workflows::attach(&sundial).unwrap();
    workflows.register("greet", greet).unwrap();
    let app = sundial_server::workflows::router(workflows, 1 << 20);
    let _running = sundial.start();

    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(json!({"type": "greet", "id": "g/1", "input": "hello"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/workflows/g%2F1/signals/name",
        Some(json!({"input": "bob"})),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let mut last = Value::Null;
    for _ in 0..500 {
        let (_, b) = call(&app, Method::GET, "/v1/workflows/g%2F1", None).await;
        if b["status"] == "completed" {
            last = b;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(last["result"], json!("hello, bob"), "{last}");
    assert!(last["closed_at"].as_str().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_polls_take_a_wait_in_milliseconds_or_as_a_duration_string() {
    let dir = tempfile::tempdir().unwrap();
    let app = sundial_server::router(open(&dir).await, ServerConfig::default());
    // (Waits of zero: the engine runs on a manual clock, which nothing here moves.)
    for (path, names) in [
        ("/v1/workflow-tasks/poll", "types"),
        ("/v1/workflow-activities/poll", "names"),
    ] {
        for wait in [
            json!({"wait_ms": 0}),
            json!({"wait_ms": "0s"}),
            json!({"wait_ms": "0ms"}),
            json!({"wait": "0s"}),
            json!({"wait": "0ms"}),
        ] {
            let mut body = json!({"worker": "w", names: ["t"]});
            body.as_object_mut()
                .unwrap()
                .extend(wait.as_object().unwrap().clone());
            let (st, b) = call(&app, Method::POST, path, Some(body.clone())).await;
            assert_eq!(st, StatusCode::OK, "{path} {body}: {b}");
            assert_eq!(b["tasks"], json!([]), "{b}");
        }
        for (wait, field, says) in [
            (json!({"wait_ms": 1, "wait": "1ms"}), "wait", "not both"),
            (json!({"wait": "5"}), "wait", "missing unit"),
            (json!({"wait": 5}), "wait", "300s"),
            (
                json!({"wait_ms": "5 s"}),
                "wait_ms",
                "spaces are not allowed",
            ),
            (json!({"wait_ms": -1}), "wait_ms", "negative"),
        ] {
            let mut body = json!({"worker": "w", names: ["t"]});
            body.as_object_mut()
                .unwrap()
                .extend(wait.as_object().unwrap().clone());
            let (st, b) = call(&app, Method::POST, path, Some(body.clone())).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {b}");
            let text = b.to_string();
            assert!(
                text.contains(field) && text.contains(says),
                "{path} {body}: {b}"
            );
        }
    }
}
