//! The schedules API through the router (no network): create, get with next fire times, list,
//! patch, pause/unpause, trigger, backfill, fires, delete, preview, and 422s that name the field.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use sundial::{ManualClock, Sundial, Timestamp};
use sundial_server::ServerConfig;
use tower::ServiceExt;

/// 2024-01-01T00:00:00Z.
const T0: Timestamp = Timestamp(1_704_067_200_000);

async fn app() -> (axum::Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::builder()
        .clock(Arc::new(ManualClock::new(T0)))
        .open(dir.path())
        .await
        .unwrap();
    (
        sundial_server::router(sundial, ServerConfig::default()),
        dir,
    )
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
async fn schedule_lifecycle_over_http() {
    let (app, _dir) = app().await;
    let (st, s) = call(
        &app,
        Method::POST,
        "/v1/schedules",
        Some(json!({
            "id": "daily-report",
            "cron": "0 10 * * *",
            "timezone": "Asia/Shanghai",
            "dst": {"skipped": "skip"},
            "overlap": "buffer_one",
            "catchup_window": "5m",
            "task": {"kind": "report", "payload": {"to": "ops"}, "max_attempts": 3}
        })),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{s}");
    assert_eq!(s["id"], "daily-report");
    assert_eq!(s["overlap"], "buffer_one");
    assert_eq!(s["dst"], json!({"skipped": "skip", "repeated": "first"}));
    assert_eq!(
        s["next_fires"],
        json!([
            "2024-01-01T02:00:00Z",
            "2024-01-02T02:00:00Z",
            "2024-01-03T02:00:00Z",
            "2024-01-04T02:00:00Z",
            "2024-01-05T02:00:00Z"
        ])
    );
    assert_eq!(s["counts"], json!({"fired": 0, "skipped": 0, "missed": 0}));

    let (st, dup) = call(
        &app,
        Method::POST,
        "/v1/schedules",
        Some(json!({"id": "daily-report", "every": "1h", "task": {"kind": "x"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{dup}");

    let (st, t) = call(
        &app,
        Method::POST,
        "/v1/schedules/daily-report/trigger",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(
        (t["outcome"].as_str(), t["reason"].as_str()),
        (Some("fired"), Some("trigger"))
    );
    assert_eq!(t["nominal_time"], "2024-01-01T00:00:00Z");

    let (st, p) = call(
        &app,
        Method::POST,
        "/v1/schedules/daily-report/pause",
        Some(json!({"note": "holiday"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert_eq!(
        (p["paused"].as_bool(), p["note"].as_str()),
        (Some(true), Some("holiday"))
    );
    let (st, u) = call(
        &app,
        Method::POST,
        "/v1/schedules/daily-report/unpause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{u}");
    assert_eq!(u["paused"], false);

    let (st, b) = call(
        &app,
        Method::POST,
        "/v1/schedules/daily-report/backfill",
        Some(json!({"from": "2023-12-29T00:00:00Z", "to": "2023-12-31T23:00:00Z"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let nominals: Vec<&str> = b["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["nominal_time"].as_str().unwrap())
        .collect();
    assert_eq!(
        nominals,
        vec![
            "2023-12-29T02:00:00Z",
            "2023-12-30T02:00:00Z",
            "2023-12-31T02:00:00Z"
        ]
    );

    let (st, f) = call(
        &app,
        Method::GET,
        "/v1/schedules/daily-report/fires?limit=2",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{f}");
    assert_eq!(f["fires"].as_array().unwrap().len(), 2);
    assert_eq!(
        f["fires"][0]["nominal_time"], "2024-01-01T00:00:00Z",
        "newest first"
    );
    let cursor = f["next_cursor"].as_str().unwrap().to_string();
    let (_, f2) = call(
        &app,
        Method::GET,
        &format!("/v1/schedules/daily-report/fires?before={cursor}"),
        None,
    )
    .await;
    assert_eq!(f2["fires"].as_array().unwrap().len(), 2);

    let (st, g) = call(&app, Method::GET, "/v1/schedules/daily-report", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(g["last_fires"].as_array().unwrap().len(), 4);
    assert_eq!(
        g["counts"]["fired"].as_u64().unwrap() + g["counts"]["skipped"].as_u64().unwrap(),
        4
    );

    let (st, p) = call(
        &app,
        Method::PATCH,
        "/v1/schedules/daily-report",
        Some(json!({"every": "15m"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert_eq!(p["every"], "15m");
    assert!(p.get("cron").is_none());
    assert_eq!(p["next_fires"][0], "2024-01-01T00:15:00Z");

    // A template's task takes no idempotency key (each fire's key is the schedule's own); a
    // change that sets one is refused and leaves the schedule as it was.
    let (st, e) = call(
        &app,
        Method::PATCH,
        "/v1/schedules/daily-report",
        Some(json!({"every": "20m", "task": {"kind": "report", "idempotency_key": "x"}})),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["field"], "task.idempotency_key", "{e}");
    let (_, g) = call(&app, Method::GET, "/v1/schedules/daily-report", None).await;
    assert_eq!(g["every"], "15m", "{g}");

    let (st, l) = call(&app, Method::GET, "/v1/schedules?limit=10", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(l["schedules"].as_array().unwrap().len(), 1);

    let (st, _) = call(&app, Method::DELETE, "/v1/schedules/daily-report", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, e) = call(&app, Method::GET, "/v1/schedules/daily-report", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_422_with_field_and_reason() {
    let (app, _dir) = app().await;
    let task = json!({"kind": "k"});
    let cases = [
        (
            json!({"cron": "0 0 0 30 2 *", "task": task}),
            "cron",
            "never fire",
        ),
        (
            json!({"cron": "61 * * * * *", "task": task}),
            "cron",
            "second field",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Base", "task": task}),
            "timezone",
            "unknown time zone",
        ),
        (
            json!({"cron": "* * * * *", "dst": {"skipped": "later"}, "task": task}),
            "dst.skipped",
            "shift",
        ),
        (
            json!({"cron": "* * * * *", "overlap": "sometimes", "task": task}),
            "overlap",
            "buffer_one",
        ),
        (
            json!({"cron": "* * * * *", "every": "1m", "task": task}),
            "every",
            "not both",
        ),
        (json!({"every": "0s", "task": task}), "every", "between"),
        (
            json!({"cron": "* * * * *", "task": {"kind": ""}}),
            "task.kind",
            "empty",
        ),
        (
            json!({"cron": "* * * * *", "task": {"kind": "k", "key": "x"}}),
            "task.key",
            "set by the schedule",
        ),
        (
            json!({"cron": "* * * * *", "task": {"kind": "k", "idempotency_key": "x"}}),
            "task.idempotency_key",
            "single creates",
        ),
        (
            json!({"cron": "* * * * *", "task": {"kind": "k", "idempotency_version": 2}}),
            "task.idempotency_version",
            "single creates",
        ),
        (json!({"cron": "* * * * *"}), "task", "required"),
        (
            json!({"cron": "* * * * *", "task": task, "colour": "red"}),
            "colour",
            "",
        ),
    ];
    for (body, field, reason) in cases {
        let (st, e) = call(&app, Method::POST, "/v1/schedules", Some(body.clone())).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body} → {e}");
        assert_eq!(e["error"]["code"], "invalid", "{e}");
        assert_eq!(e["error"]["field"], field, "{body} → {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(reason),
            "{body} → {e}"
        );
    }
    let (_, l) = call(&app, Method::GET, "/v1/schedules", None).await;
    assert!(
        l["schedules"].as_array().unwrap().is_empty(),
        "nothing stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_saves_nothing() {
    let (app, _dir) = app().await;
    let (st, p) = call(
        &app,
        Method::POST,
        "/v1/schedules:preview",
        Some(json!({"cron": "30 2 * * *", "timezone": "America/New_York", "from": "2024-03-09T12:00:00Z", "count": 2})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{p}");
    // 02:30 does not exist on 2024-03-10 in New York: shifted to 03:00 EDT (07:00Z).
    assert_eq!(
        p["fires"],
        json!(["2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z"])
    );
    let (st, e) = call(
        &app,
        Method::POST,
        "/v1/schedules:preview",
        Some(json!({"every": "1m", "from": "2024-01-01T00:00:00Z", "count": 1001})),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(e["error"]["field"], "count");
    let (_, l) = call(&app, Method::GET, "/v1/schedules", None).await;
    assert!(l["schedules"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_tags_each_fire_task() {
    let (app, _dir) = app().await;
    let (st, s) = call(
        &app,
        Method::POST,
        "/v1/schedules",
        Some(json!({
            "id": "tagged",
            "every": "1h",
            "task": {"kind": "report", "tags": {"team": "ops"}}
        })),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{s}");
    assert_eq!(s["task"]["tags"], json!({"team": "ops"}), "{s}");
    let (st, t) = call(&app, Method::POST, "/v1/schedules/tagged/trigger", None).await;
    assert_eq!(st, StatusCode::OK, "{t}");
    let id = t["task_id"].as_str().unwrap();
    let (st, task) = call(&app, Method::GET, &format!("/v1/tasks/{id}"), None).await;
    assert_eq!(st, StatusCode::OK, "{task}");
    assert_eq!(task["tags"], json!({"team": "ops"}), "{task}");
    let (_, found) = call(&app, Method::GET, "/v1/tasks?tag=team:ops", None).await;
    assert_eq!(found["tasks"].as_array().unwrap().len(), 1, "{found}");
}
