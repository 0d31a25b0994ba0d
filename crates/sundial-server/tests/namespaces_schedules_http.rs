//! Schedules are per namespace: the same schedule id in two namespaces is two schedules; a
//! namespace's schedule fires tasks into that namespace's queues; lists and every by-id route
//! see only the namespace's own schedules (another's is `404`, like one that does not exist); and
//! responses show ids and queues as the namespace knows them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use common::call;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sundial::{ManualClock, Sundial, Timestamp};
use sundial_server::{ServerConfig, router};

/// 2024-01-01T00:00:00Z.
const T0: Timestamp = Timestamp(1_704_067_200_000);

fn schedule_ids(list: &Value) -> Vec<String> {
    list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

fn task_ids(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_belong_to_one_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let sundial = Sundial::builder()
        .clock(clock.clone())
        .open(dir.path())
        .await
        .unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");

    // The same id in both namespaces: two schedules, each with its own task template.
    let body = |kind: &str| {
        json!({"id": "nightly", "every": "1h", "overlap": "buffer_all",
               "task": {"kind": kind, "queue": "reports"}})
    };
    let (st, d) = call(&app, "POST", "/v1/schedules", Some(body("d-report"))).await;
    assert_eq!(st, StatusCode::CREATED, "{d}");
    let (st, a) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules",
        Some(body("a-report")),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "the id is the namespace's own: {a}"
    );
    assert_eq!(
        a["id"], "nightly",
        "ids are shown as the namespace knows them"
    );
    assert_eq!(a["task"]["queue"], "reports", "{a}");
    let (st, b) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules",
        Some(body("x")),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "within one namespace the id holds: {b}"
    );
    let (_, d) = call(&app, "GET", "/v1/schedules/nightly", None).await;
    assert_eq!(d["task"]["kind"], "d-report", "{d}");
    let (_, a) = call(&app, "GET", "/v1/namespaces/acme/schedules/nightly", None).await;
    assert_eq!(a["task"]["kind"], "a-report", "{a}");
    assert_eq!(a["id"], "nightly");

    // One more of each namespace's own, and one without an id (a fresh id of acme's).
    let only = |id: &str| json!({"id": id, "every": "1h", "task": {"kind": "k"}});
    let (st, _) = call(&app, "POST", "/v1/schedules", Some(only("d-only"))).await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules",
        Some(only("a-only")),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, fresh) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules",
        Some(json!({"every": "1h", "task": {"kind": "k"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{fresh}");
    let fresh_id = fresh["id"].as_str().unwrap().to_string();
    assert!(uuid::Uuid::parse_str(&fresh_id).is_ok(), "{fresh_id}");
    let (st, _) = call(
        &app,
        "GET",
        &format!("/v1/namespaces/acme/schedules/{fresh_id}"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = call(&app, "GET", &format!("/v1/schedules/{fresh_id}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Schedule ticks share one internal queue, but each is its schedule's namespace's: the
    // default namespace's internal tasks name only its own schedules (acme's are not even
    // reachable by id), and acme sees none of default's.
    let (st, internal) = call(&app, "GET", "/v1/tasks?internal=true&limit=100", None).await;
    assert_eq!(st, StatusCode::OK, "{internal}");
    let mut ticked: Vec<String> = internal["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "sundial.schedule.tick")
        .map(|t| t["payload"]["schedule"].as_str().unwrap().to_string())
        .collect();
    ticked.sort();
    assert_eq!(ticked, ["d-only", "nightly"], "{internal}");
    let sundial_store = sundial.schedule_store().unwrap().clone();
    let acme_nightly = sundial_core::schedule::ScheduleId::new(sundial_core::namespace::qualify(
        "acme", "nightly",
    ))
    .unwrap();
    let acme_tick = sundial_store
        .get_schedule(&acme_nightly)
        .await
        .unwrap()
        .unwrap()
        .armed_tick
        .expect("acme's nightly is armed");
    let (st, _) = call(&app, "GET", &format!("/v1/tasks/{acme_tick}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "another namespace's tick");

    // Lists are per namespace, a page at a time too (the cursor as the namespace knows it).
    let (_, list) = call(&app, "GET", "/v1/schedules", None).await;
    assert_eq!(schedule_ids(&list), ["d-only", "nightly"], "{list}");
    let mut want = vec![
        "a-only".to_string(),
        "nightly".to_string(),
        fresh_id.clone(),
    ];
    want.sort();
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/schedules", None).await;
    assert_eq!(schedule_ids(&list), want, "{list}");
    let mut paged = Vec::new();
    let mut path = "/v1/namespaces/acme/schedules?limit=1".to_string();
    loop {
        let (st, page) = call(&app, "GET", &path, None).await;
        assert_eq!(st, StatusCode::OK, "{page}");
        paged.extend(schedule_ids(&page));
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert!(!c.contains('\u{1f}'), "{c:?}");
                path = format!("/v1/namespaces/acme/schedules?limit=1&cursor={c}");
            }
            None => break,
        }
    }
    assert_eq!(paged, want);

    // Another namespace's schedule is not there, whatever the route; nor is one named with a
    // namespace part (the separator percent-encoded).
    let backfill = json!({"from": "2023-12-31T22:00:00Z", "to": "2024-01-01T00:00:00Z"});
    for (prefix, id) in [
        ("/v1", "a-only"),
        ("/v1", "acme%1Fa-only"),
        ("/v1", "acme%1Fnightly"),
        ("/v1/namespaces/acme", "d-only"),
        ("/v1/namespaces/acme", "acme%1Fa-only"),
    ] {
        for (method, tail, body) in [
            ("GET", "", None),
            ("PATCH", "", Some(json!({"jitter": "1s"}))),
            ("DELETE", "", None),
            ("POST", "/pause", None),
            ("POST", "/unpause", None),
            ("POST", "/trigger", None),
            ("POST", "/backfill", Some(backfill.clone())),
            ("GET", "/fires", None),
        ] {
            let path = format!("{prefix}/schedules/{id}{tail}");
            let (st, b) = call(&app, method, &path, body).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path}: {b}");
            assert_eq!(b["error"]["message"], "no such schedule", "{method} {path}");
        }
    }
    // A namespace part in a new id is refused, not stored as another namespace's schedule.
    let (st, b) = call(
        &app,
        "POST",
        "/v1/schedules",
        Some(json!({"id": "acme\u{1f}sneaky", "every": "1h", "task": {"kind": "k"}})),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    // So is one in the task template's queue or exclusive key: no fire lands in acme's queues.
    for task in [
        json!({"kind": "k", "queue": "acme\u{1f}reports"}),
        json!({"kind": "k", "exclusive": {"key": "acme\u{1f}one"}}),
    ] {
        let (st, b) = call(
            &app,
            "POST",
            "/v1/schedules",
            Some(json!({"id": "sneaky", "every": "1h", "task": task})),
        )
        .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{task}: {b}");
    }
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/schedules", None).await;
    assert_eq!(schedule_ids(&list), want, "{list}");

    // A fire of acme's schedule makes a task in acme's queue, shown as acme knows it.
    let (st, fire) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules/nightly/trigger",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{fire}");
    let a_task = fire["task_id"].as_str().unwrap().to_string();
    let (st, t) = call(
        &app,
        "GET",
        &format!("/v1/namespaces/acme/tasks/{a_task}"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(t["queue"], "reports", "{t}");
    assert_eq!(t["kind"], "a-report");
    assert_eq!(t["key"], "schedule:nightly@2024-01-01T00:00:00Z", "{t}");
    assert_eq!(t["exclusive"]["key"], "schedule:nightly", "{t}");
    let (st, _) = call(&app, "GET", &format!("/v1/tasks/{a_task}"), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/tasks?queue=reports", None).await;
    assert_eq!(task_ids(&list), vec![a_task.clone()], "{list}");
    let (_, list) = call(&app, "GET", "/v1/tasks?queue=reports", None).await;
    assert!(task_ids(&list).is_empty(), "{list}");
    // The default namespace's schedule of the same id fires into its own queue, at the same
    // nominal time: the fire keys and the exclusive keys of the two never meet.
    let (st, fire) = call(&app, "POST", "/v1/schedules/nightly/trigger", None).await;
    assert_eq!(st, StatusCode::OK, "{fire}");
    let d_task = fire["task_id"].as_str().unwrap().to_string();
    let (_, t) = call(&app, "GET", &format!("/v1/tasks/{d_task}"), None).await;
    assert_eq!(
        (t["queue"].as_str(), t["kind"].as_str()),
        (Some("reports"), Some("d-report"))
    );
    assert_eq!(t["key"], "schedule:nightly@2024-01-01T00:00:00Z");
    assert_eq!(
        t["state"], "scheduled",
        "not held by acme's exclusive key: {t}"
    );
    let (_, list) = call(&app, "GET", "/v1/tasks?queue=reports", None).await;
    assert_eq!(task_ids(&list), vec![d_task.clone()], "{list}");

    // Fires, backfill, pause and patch act on the namespace's own schedule.
    let (_, fires) = call(
        &app,
        "GET",
        "/v1/namespaces/acme/schedules/nightly/fires",
        None,
    )
    .await;
    assert_eq!(fires["fires"].as_array().unwrap().len(), 1, "{fires}");
    assert_eq!(fires["fires"][0]["task_id"], a_task.as_str());
    let (st, bf) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules/nightly/backfill",
        Some(json!({"from": "2023-12-31T22:00:00Z", "to": "2023-12-31T23:00:00Z"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{bf}");
    assert_eq!(bf["fires"].as_array().unwrap().len(), 2, "{bf}");
    for f in bf["fires"].as_array().unwrap() {
        let id = f["task_id"].as_str().unwrap();
        let (st, t) = call(
            &app,
            "GET",
            &format!("/v1/namespaces/acme/tasks/{id}"),
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{t}");
        assert_eq!(t["queue"], "reports");
    }
    let (st, p) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules/nightly/pause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert_eq!(p["paused"], true);
    assert_eq!(p["id"], "nightly");
    let (_, d) = call(&app, "GET", "/v1/schedules/nightly", None).await;
    assert_eq!(d["paused"], false, "the default namespace's runs on: {d}");
    let (_, d) = call(&app, "GET", "/v1/schedules/nightly/fires", None).await;
    assert_eq!(d["fires"].as_array().unwrap().len(), 1, "{d}");
    let (st, p) = call(
        &app,
        "PATCH",
        "/v1/namespaces/acme/schedules/nightly",
        Some(json!({"overlap": "allow_all", "task": {"kind": "a-report", "queue": "other"}})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{p}");
    assert_eq!(p["task"]["queue"], "other", "{p}");
    // (A later fire time: the one at T0 was recorded already.)
    clock.advance(std::time::Duration::from_secs(60));
    let (_, fire) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules/nightly/trigger",
        None,
    )
    .await;
    let moved = fire["task_id"].as_str().unwrap();
    let (_, list) = call(&app, "GET", "/v1/namespaces/acme/tasks?queue=other", None).await;
    assert_eq!(task_ids(&list), [moved.to_string()], "{list}");
    let (_, list) = call(&app, "GET", "/v1/tasks?queue=other", None).await;
    assert!(task_ids(&list).is_empty(), "{list}");
    let (st, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules/nightly/unpause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);

    // Preview needs no schedule; it answers in a namespace too.
    let (st, pv) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/schedules:preview",
        Some(json!({"every": "1h", "from": "2024-01-01T00:00:00Z", "count": 2})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{pv}");
    assert_eq!(pv["fires"].as_array().unwrap().len(), 2);

    // Deleting acme's schedule leaves the default namespace's of the same id.
    let (st, _) = call(
        &app,
        "DELETE",
        "/v1/namespaces/acme/schedules/nightly",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = call(&app, "GET", "/v1/namespaces/acme/schedules/nightly", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, d) = call(&app, "GET", "/v1/schedules/nightly", None).await;
    assert_eq!(st, StatusCode::OK, "{d}");
}
