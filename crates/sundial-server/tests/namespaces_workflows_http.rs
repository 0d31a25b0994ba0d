//! Workflows are per namespace: the same workflow id in two namespaces is two workflows; lists
//! and every by-id route see only the namespace's own (another's is `404`, like one that does
//! not exist); a remote workflow worker polling a namespace's queues gets that namespace's
//! workflow tasks and activities only, and the commands it sends (activities, children) stay in
//! that namespace; responses show workflow ids as the namespace knows them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use common::call;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};

fn workflow_ids(list: &Value) -> Vec<String> {
    list["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect()
}

/// Polls `path` until it hands out `n` tasks (the engine makes them ready), and returns them.
async fn poll_n(app: &axum::Router, path: &str, body: Value, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    for _ in 0..50 {
        let (st, b) = call(app, "POST", path, Some(body.clone())).await;
        assert_eq!(st, StatusCode::OK, "{path}: {b}");
        got.extend(b["tasks"].as_array().unwrap().iter().cloned());
        if got.len() >= n {
            break;
        }
    }
    assert_eq!(got.len(), n, "{path}: {got:?}");
    got
}

async fn state_of(app: &axum::Router, path: &str) -> Value {
    let (st, b) = call(app, "GET", path, None).await;
    assert_eq!(st, StatusCode::OK, "{path}: {b}");
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_belong_to_one_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    let engine = sundial.start();
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");

    // The same id in both namespaces: two workflows.
    let start = |id: &str| json!({"type": "order", "id": id, "id_reuse": "reject_duplicate"});
    let (st, d) = call(&app, "POST", "/v1/workflows", Some(start("o-1"))).await;
    assert_eq!(st, StatusCode::CREATED, "{d}");
    let (st, a) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/workflows",
        Some(start("o-1")),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "the id is the namespace's own: {a}"
    );
    assert_eq!(a["id"], "o-1", "ids are shown as the namespace knows them");
    assert_ne!(a["run_id"], d["run_id"]);
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/workflows",
        Some(start("o-1")),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "within one namespace the id holds: {b}"
    );
    let (st, fresh) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/workflows",
        Some(json!({"type": "other"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{fresh}");
    assert_eq!(
        fresh["id"], fresh["run_id"],
        "the default id is the run's: {fresh}"
    );
    let fresh_id = fresh["id"].as_str().unwrap().to_string();
    let (st, b) = call(
        &app,
        "POST",
        "/v1/workflows",
        Some(json!({"type": "order", "id": "acme\u{1f}sneaky"})),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a namespace part is refused: {b}"
    );

    let a_view = state_of(&app, "/v1/namespaces/acme/workflows/o-1").await;
    assert_eq!(a_view["run_id"], a["run_id"]);
    assert_eq!(a_view["id"], "o-1");
    let d_view = state_of(&app, "/v1/workflows/o-1").await;
    assert_eq!(d_view["run_id"], d["run_id"]);

    // Lists are per namespace, a page at a time too.
    let (_, list) = call(&app, "GET", "/v1/workflows", None).await;
    assert_eq!(workflow_ids(&list), ["o-1"], "{list}");
    let mut want = vec!["o-1".to_string(), fresh_id.clone()];
    want.sort();
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/workflows", None).await;
    assert_eq!(workflow_ids(&list), want, "{list}");
    // The runs' own kernel tasks (keyed by run id, in acme's workflow queue) are acme's to see.
    let (_, internal) = call(
        &app,
        "GET",
        "/v1/namespaces/acme/tasks?internal=true&queue=sundial.workflows",
        None,
    )
    .await;
    assert!(
        !internal["tasks"].as_array().unwrap().is_empty(),
        "{internal}"
    );
    let (_, p1) = call(&app, "GET", "/v1/namespaces/acme/workflows?limit=1", None).await;
    let cursor = p1["next_cursor"].as_str().unwrap().to_string();
    assert!(!cursor.contains('\u{1f}'), "{cursor:?}");
    let (_, p2) = call(
        &app,
        "GET",
        &format!("/v1/namespaces/acme/workflows?limit=1&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(
        [workflow_ids(&p1), workflow_ids(&p2)].concat(),
        want,
        "{p1} {p2}"
    );

    // Another namespace's workflow is not there, whatever the route.
    for (prefix, id) in [
        ("/v1", fresh_id.as_str()),
        ("/v1", "acme%1Fo-1"),
        ("/v1/namespaces/acme", "acme%1Fo-1"),
    ] {
        for (method, tail) in [
            ("GET", ""),
            ("GET", "/history"),
            ("POST", "/signals/go"),
            ("POST", "/cancel"),
            ("POST", "/terminate"),
        ] {
            let path = format!("{prefix}/workflows/{id}{tail}");
            let (st, b) = call(&app, method, &path, None).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path}: {b}");
            assert_eq!(b["error"]["message"], "no such workflow", "{method} {path}");
        }
    }

    // A worker polling the default namespace's workflow queue gets its workflow task only; one
    // polling acme's gets acme's.
    let poll = json!({"worker": "w", "types": ["order"], "max": 10, "wait": "1s"});
    let d_tasks = poll_n(&app, "/v1/workflow-tasks/poll", poll.clone(), 1).await;
    assert_eq!(d_tasks[0]["run_id"], d["run_id"], "{d_tasks:?}");
    let a_tasks = poll_n(
        &app,
        "/v1/namespaces/acme/workflow-tasks/poll",
        poll.clone(),
        1,
    )
    .await;
    let wt = &a_tasks[0];
    assert_eq!(wt["run_id"], a["run_id"], "{wt}");
    assert_eq!(wt["workflow_id"], "o-1", "{wt}");
    let (_, b) = call(
        &app,
        "POST",
        "/v1/workflow-tasks/poll",
        Some(json!({"worker": "w", "types": ["order", "other"], "wait": "0s"})),
    )
    .await;
    assert_eq!(b["tasks"], json!([]), "acme's are not the default's: {b}");

    // acme's worker answers with an activity and a child workflow: both stay in acme.
    let task_id = wt["task_id"].as_str().unwrap().to_string();
    let backoff = serde_json::to_value(sundial::Backoff::default()).unwrap();
    let answer = json!({
        "execution_id": wt["execution_id"],
        "expect_len": wt["history"].as_array().unwrap().len(),
        "commands": [
            {"type": "activity_scheduled", "cmd": 0, "name": "charge", "input": {"n": 1},
             "task": uuid::Uuid::now_v7(), "max_attempts": 1, "timeout_ms": 30000,
             "backoff": backoff},
            {"type": "child_start_requested", "cmd": 1, "workflow_type": "ship",
             "workflow_id": "o-1/ship", "input": null, "task": uuid::Uuid::now_v7()},
        ],
    });
    // Not through the default namespace: as if the task did not exist.
    let (st, b) = call(
        &app,
        "POST",
        &format!("/v1/workflow-tasks/{task_id}/complete"),
        Some(answer.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{b}");
    let (st, b) = call(
        &app,
        "POST",
        &format!("/v1/namespaces/acme/workflow-tasks/{task_id}/complete"),
        Some(answer),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "committed", "{b}");

    // The activity waits in acme's activity queue only.
    let apoll = json!({"worker": "w", "names": ["charge"], "max": 10, "wait": "1s"});
    let (_, b) = call(
        &app,
        "POST",
        "/v1/workflow-activities/poll",
        Some(json!({"worker": "w", "names": ["charge"], "wait": "300ms"})),
    )
    .await;
    assert_eq!(b["tasks"], json!([]), "{b}");
    let acts = poll_n(
        &app,
        "/v1/namespaces/acme/workflow-activities/poll",
        apoll,
        1,
    )
    .await;
    let act = &acts[0];
    assert_eq!(act["run_id"], a["run_id"], "{act}");
    let act_id = act["task_id"].as_str().unwrap().to_string();
    let done = json!({"execution_id": act["execution_id"], "result": "charged"});
    for (tail, body) in [
        ("complete", done.clone()),
        (
            "fail",
            json!({"execution_id": act["execution_id"], "error": "x"}),
        ),
    ] {
        let path = format!("/v1/workflow-activities/{act_id}/{tail}");
        let (st, b) = call(&app, "POST", &path, Some(body)).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}: {b}");
    }
    let (st, b) = call(
        &app,
        "POST",
        &format!("/v1/namespaces/acme/workflow-activities/{act_id}/complete"),
        Some(done),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");

    // The child is acme's workflow (started in the server), named as acme's worker named it.
    let mut child = Value::Null;
    for _ in 0..100 {
        let (st, b) = call(
            &app,
            "GET",
            "/v1/namespaces/acme/workflows/o-1%2Fship",
            None,
        )
        .await;
        if st == StatusCode::OK {
            child = b;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(child["id"], "o-1/ship", "{child}");
    assert_eq!(child["parent_id"], "o-1", "{child}");
    let (st, _) = call(&app, "GET", "/v1/workflows/o-1%2Fship", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Its workflow task is in acme's queue: the default namespace's worker does not get it.
    let (_, b) = call(
        &app,
        "POST",
        "/v1/workflow-tasks/poll",
        Some(json!({"worker": "w", "types": ["ship"], "wait": "300ms"})),
    )
    .await;
    assert_eq!(b["tasks"], json!([]), "{b}");
    let ship = poll_n(
        &app,
        "/v1/namespaces/acme/workflow-tasks/poll",
        json!({"worker": "w", "types": ["ship"], "wait": "1s"}),
        1,
    )
    .await;
    assert_eq!(ship[0]["workflow_id"], "o-1/ship");
    let started = &ship[0]["history"][0];
    assert_eq!(started["parent_workflow_id"], "o-1", "{started}");
    let (_, h) = call(
        &app,
        "GET",
        "/v1/namespaces/acme/workflows/o-1%2Fship/history",
        None,
    )
    .await;
    assert_eq!(h["workflow_id"], "o-1/ship", "{h}");
    assert_eq!(h["events"][0]["parent_workflow_id"], "o-1", "{h}");

    // Signal, cancel and terminate act on the namespace's own workflow of that id.
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/workflows/o-1/signals/go",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{b}");
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/workflows/o-1/terminate",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "terminated");
    assert_eq!(b["id"], "o-1");
    let d_view = state_of(&app, "/v1/workflows/o-1").await;
    assert_eq!(
        d_view["status"], "running",
        "the default namespace's runs on: {d_view}"
    );
    let (st, b) = call(&app, "POST", "/v1/workflows/o-1/cancel", None).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{b}");
    let (_, h) = call(&app, "GET", "/v1/workflows/o-1/history", None).await;
    let kinds: Vec<&str> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(!kinds.contains(&"signal_received"), "{kinds:?}");
    assert!(kinds.contains(&"cancel_requested"), "{kinds:?}");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}
