//! The workflow worker protocol and the history are typed in `/openapi.json`, and what the server
//! answers conforms to those types: a remote worker's whole round (poll a workflow task, answer
//! with commands, poll the activity, complete and fail it, a stale answer, the history) with every
//! request body and every answer checked against the document's schemas by a JSON Schema
//! validator (`jsonschema`, draft 2020-12, the dialect of OpenAPI 3.1).
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::ServerConfig;

mod common;
use common::call;

/// The document the server serves, and a validator for one of its component schemas.
struct Doc(Value);

impl Doc {
    async fn load(app: &axum::Router) -> Doc {
        let (st, doc) = call(app, "GET", "/openapi.json", None).await;
        assert_eq!(st, StatusCode::OK);
        Doc(doc)
    }

    /// The schema of the operation's `status` answer (`request` false) or of its request body.
    fn schema(&self, path: &str, method: &str, status: Option<u16>) -> Value {
        let op = &self.0["paths"][path][method];
        let content = match status {
            Some(s) => &op["responses"][s.to_string()]["content"]["application/json"],
            None => &op["requestBody"]["content"]["application/json"],
        };
        let schema = content["schema"].clone();
        assert!(
            schema.is_object() && schema != json!({"type": "object"}),
            "{method} {path} {status:?} is untyped: {schema}"
        );
        schema
    }

    /// Fails, naming every violation, unless `value` conforms to `schema` (with the document's
    /// components for its `$ref`s).
    fn check(&self, what: &str, schema: &Value, value: &Value) {
        let mut root = schema.clone();
        root["components"] = self.0["components"].clone();
        let validator = jsonschema::validator_for(&root).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{what}: {errors:#?}\nin {value:#}");
    }

    /// Checks the request body against the document, sends it, checks the answer.
    async fn exchange(
        &self,
        app: &axum::Router,
        path: &str,
        template: &str,
        body: Value,
        want: StatusCode,
    ) -> Value {
        self.check(
            &format!("request of {template}"),
            &self.schema(template, "post", None),
            &body,
        );
        let (st, answer) = call(app, "POST", path, Some(body)).await;
        assert_eq!(st, want, "{path}: {answer}");
        self.check(
            &format!("answer of {template}"),
            &self.schema(template, "post", Some(want.as_u16())),
            &answer,
        );
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_workers_round_conforms_to_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(sundial.clone(), ServerConfig::default());
    let engine = sundial.start();
    let doc = Doc::load(&app).await;

    // A workflow of a type no code in the server runs: its tasks wait for remote workers.
    let (st, started) = call(
        &app,
        "POST",
        "/v1/workflows",
        Some(json!({"type": "order", "id": "o-1", "input": {"sku": "a"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{started}");

    let poll = json!({"worker": "w", "types": ["order"], "max": 4, "wait": "1s"});
    let tasks = poll_until_some(&doc, &app, "/v1/workflow-tasks/poll", poll).await;
    let wt = &tasks["tasks"][0];
    assert_eq!(wt["run_id"], started["run_id"], "{tasks}");
    assert_eq!(wt["history"][0]["type"], "workflow_started", "{wt}");
    let task_id = wt["task_id"].as_str().unwrap().to_string();
    let complete_path = format!("/v1/workflow-tasks/{task_id}/complete");
    let complete_template = "/v1/workflow-tasks/{task}/complete";

    // A signal grows the history: an answer to the old length is stale, with the new history.
    let (st, b) = call(
        &app,
        "POST",
        "/v1/workflows/o-1/signals/go",
        Some(json!({"input": 7})),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{b}");
    let backoff = json!({"initial_ms": 50, "factor": 1.0, "max_ms": 50, "jitter": 0.0});
    let commands = json!([
        {"type": "activity_scheduled", "cmd": 0, "name": "charge", "input": {"n": 1},
         "task": uuid::Uuid::now_v7(), "max_attempts": 2, "timeout_ms": 30000,
         "backoff": backoff},
        {"type": "timer_started", "cmd": 1, "fire_at": sundial.clock().now().0 + 3_600_000,
         "task": uuid::Uuid::now_v7()},
        {"type": "side_effect", "cmd": 2, "value": [1, 2]},
        {"type": "patched", "id": "v2"},
    ]);
    let stale = doc
        .exchange(
            &app,
            &complete_path,
            complete_template,
            json!({"execution_id": wt["execution_id"], "expect_len": 1, "commands": commands}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(stale["status"], "stale", "{stale}");
    let grown = &stale["task"];
    assert_eq!(grown["history"][1]["type"], "signal_received", "{stale}");

    let committed = doc
        .exchange(
            &app,
            &complete_path,
            complete_template,
            json!({"execution_id": grown["execution_id"],
                   "expect_len": grown["history"].as_array().unwrap().len(),
                   "commands": commands}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(committed["status"], "committed", "{committed}");

    // The activity: its first attempt fails (retryable), the second completes.
    let apoll = json!({"worker": "w", "names": ["charge"], "max": 4, "wait": "1s"});
    let acts = poll_until_some(&doc, &app, "/v1/workflow-activities/poll", apoll.clone()).await;
    let act = &acts["tasks"][0];
    assert_eq!(act["name"], "charge", "{acts}");
    let act_id = act["task_id"].as_str().unwrap().to_string();
    let failed = doc
        .exchange(
            &app,
            &format!("/v1/workflow-activities/{act_id}/fail"),
            "/v1/workflow-activities/{task}/fail",
            json!({"execution_id": act["execution_id"], "error": "card declined", "retryable": true}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(failed, json!({"status": "recorded"}));

    // The retry is due after the backoff (50 ms).
    let again = poll_until_some(&doc, &app, "/v1/workflow-activities/poll", apoll).await;
    let retry = &again["tasks"][0];
    assert_eq!(retry["attempt"], 2, "{again}");
    let done = doc
        .exchange(
            &app,
            &format!("/v1/workflow-activities/{act_id}/complete"),
            "/v1/workflow-activities/{task}/complete",
            json!({"execution_id": retry["execution_id"], "result": {"charged": true}}),
            StatusCode::OK,
        )
        .await;
    assert_eq!(done, json!({"status": "recorded"}));

    // The history, with the commands, the signal and the activity's result.
    let (st, history) = call(&app, "GET", "/v1/workflows/o-1/history", None).await;
    assert_eq!(st, StatusCode::OK, "{history}");
    doc.check(
        "the history",
        &doc.schema_get("/v1/workflows/{id}/history"),
        &history,
    );
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    for t in [
        "workflow_started",
        "signal_received",
        "workflow_task_completed",
        "activity_scheduled",
        "timer_started",
        "side_effect",
        "patched",
        "activity_completed",
    ] {
        assert!(types.contains(&t), "{t} in {types:?}");
    }

    // A terminated run's history has its closing event, in the document too.
    let (st, b) = call(
        &app,
        "POST",
        "/v1/workflows/o-1/terminate",
        Some(json!({"reason": "done here"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (_, history) = call(&app, "GET", "/v1/workflows/o-1/history", None).await;
    doc.check(
        "the closed history",
        &doc.schema_get("/v1/workflows/{id}/history"),
        &history,
    );
    assert_eq!(
        history["events"].as_array().unwrap().last().unwrap()["type"],
        "workflow_terminated"
    );

    // What the document refuses, the validator refuses too (the check is not vacuous).
    let schema = doc.schema(complete_template, "post", None);
    let mut root = schema.clone();
    root["components"] = doc.0["components"].clone();
    let validator = jsonschema::validator_for(&root).unwrap();
    for bad in [
        json!({"execution_id": wt["execution_id"], "expect_len": 1, "commands": [{"type": "no_such_event"}]}),
        json!({"execution_id": wt["execution_id"], "expect_len": 1, "commands": [{"type": "side_effect"}]}),
        json!({"execution_id": wt["execution_id"]}),
        json!({"execution_id": wt["execution_id"], "expect_len": 1, "extra": true}),
    ] {
        assert!(!validator.is_valid(&bad), "{bad}");
    }
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

/// Polls (each request and answer checked against the document) until a task comes.
async fn poll_until_some(doc: &Doc, app: &axum::Router, path: &str, body: Value) -> Value {
    for _ in 0..30 {
        let answer = doc
            .exchange(app, path, path, body.clone(), StatusCode::OK)
            .await;
        if answer["tasks"].as_array().is_some_and(|t| !t.is_empty()) {
            return answer;
        }
    }
    panic!("{path}: no task in 30 polls");
}

impl Doc {
    fn schema_get(&self, path: &str) -> Value {
        let schema = self.0["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]
            .clone();
        assert!(
            schema.is_object() && schema != json!({"type": "object"}),
            "GET {path} is untyped: {schema}"
        );
        schema
    }
}
