//! Namespaces keep teams apart: the same queue names, keys and idempotency keys in two
//! namespaces are two sets of objects; lists, polls, queue controls and bulk actions see only
//! their namespace; another namespace's task reads as `404`, like one that does not exist; and
//! paths without a namespace are the `default` namespace, as before namespaces existed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use common::call_with_headers as call;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::{ServerConfig, router};

fn ids(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_share_names_but_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    let engine = sundial.start();

    // A namespace must exist before it is used.
    let (st, b, _) = call(&app, "GET", "/v1/namespaces/acme/tasks", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{b}");
    assert_eq!(b["error"]["code"], "not_found");
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces",
        Some(json!({"name": "acme"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");

    // The same queue, key and idempotency key in both namespaces: two tasks each.
    let task = json!({"kind": "send", "queue": "emails", "key": "k1", "tags": {"team": "x"}});
    let (st, d, _) = call(&app, "POST", "/v1/tasks", Some(task.clone())).await;
    assert_eq!(st, StatusCode::CREATED, "{d}");
    let (st, a, headers) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(task.clone()),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "the key is the namespace's own: {a}"
    );
    assert_eq!(
        a["queue"], "emails",
        "names are shown as the namespace knows them"
    );
    assert_eq!(a["key"], "k1");
    let a_id = a["id"].as_str().unwrap().to_string();
    let d_id = d["id"].as_str().unwrap().to_string();
    assert_eq!(
        headers.get("location").unwrap().to_str().unwrap(),
        format!("/v1/namespaces/acme/tasks/{a_id}")
    );
    // Within one namespace the key still holds.
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(task.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{b}");
    assert_eq!(b["error"]["existing_id"], a_id.as_str());
    let idem = json!({"kind": "send", "queue": "emails", "idempotency_key": "order-1"});
    let (st, i1, _) = call(&app, "POST", "/v1/tasks", Some(idem.clone())).await;
    assert_eq!(st, StatusCode::CREATED, "{i1}");
    let (st, i2, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(idem.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{i2}");
    assert_ne!(i1["id"], i2["id"]);
    let (st, i3, _) = call(&app, "POST", "/v1/namespaces/acme/tasks", Some(idem)).await;
    assert_eq!(st, StatusCode::OK, "a repeat within the namespace: {i3}");
    assert_eq!(i3["id"], i2["id"]);

    // Lists see their own namespace only, with or without filters.
    let (_, list, _) = call(&app, "GET", "/v1/tasks?queue=emails", None).await;
    let default_ids = ids(&list);
    assert!(
        default_ids.contains(&d_id) && !default_ids.contains(&a_id),
        "{list}"
    );
    let (_, list, _) = call(&app, "GET", "/v1/namespaces/acme/tasks", None).await;
    let acme_ids = ids(&list);
    assert_eq!(acme_ids.len(), 2, "{list}");
    assert!(
        acme_ids.contains(&a_id) && !acme_ids.contains(&d_id),
        "{list}"
    );
    let (_, list, _) = call(&app, "GET", "/v1/tasks?tag=team:x", None).await;
    assert_eq!(ids(&list), vec![d_id.clone()]);
    let (_, list, _) = call(&app, "GET", "/v1/namespaces/acme/tasks?key_prefix=k", None).await;
    assert_eq!(ids(&list), vec![a_id.clone()]);

    // Another namespace's task is not there, whatever the route.
    for (method, path) in [
        ("GET", format!("/v1/tasks/{a_id}")),
        ("GET", format!("/v1/tasks/{a_id}/attempts")),
        ("POST", format!("/v1/tasks/{a_id}/cancel")),
        ("POST", format!("/v1/tasks/{a_id}/trigger")),
        ("POST", format!("/v1/tasks/{a_id}/retry")),
        ("GET", format!("/v1/namespaces/acme/tasks/{d_id}")),
        ("POST", format!("/v1/namespaces/acme/tasks/{d_id}/cancel")),
    ] {
        let (st, b, _) = call(&app, method, &path, None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path}: {b}");
        assert_eq!(b["error"]["message"], "no such task", "{method} {path}");
    }
    let (st, b, _) = call(
        &app,
        "GET",
        &format!("/v1/namespaces/acme/tasks/{a_id}"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");

    // A pause is the namespace's: the default namespace's queue of the same name runs on.
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/queues/emails/pause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["queue"], "emails");
    assert_eq!(b["paused"], true);
    let (_, b, _) = call(&app, "GET", "/v1/queues/emails", None).await;
    assert_eq!(b["paused"], false, "{b}");
    let (_, b, _) = call(&app, "GET", "/v1/namespaces/acme/queues", None).await;
    let names: Vec<&str> = b["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["emails"], "{b}");

    // A poll of the default namespace's queue gets its tasks only.
    let poll = json!({"worker": "w", "max": 10, "wait": "2s"});
    let (st, b, _) = call(&app, "POST", "/v1/queues/emails/poll", Some(poll.clone())).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let polled: Vec<&str> = b["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(
        !polled.is_empty() && !polled.contains(&a_id.as_str()),
        "{b}"
    );
    // The paused namespace's queue hands out nothing; resumed, it hands out its own.
    let short = json!({"worker": "w", "max": 10, "wait": "0s"});
    let (_, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/queues/emails/poll",
        Some(short),
    )
    .await;
    assert_eq!(b["tasks"].as_array().unwrap().len(), 0, "{b}");
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/queues/emails/resume",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (_, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/queues/emails/poll",
        Some(poll),
    )
    .await;
    let got = b["tasks"].as_array().unwrap();
    assert!(!got.is_empty(), "{b}");
    let mine = got
        .iter()
        .find(|t| t["id"] == a_id.as_str())
        .expect("acme's task");
    assert_eq!(mine["queue"], "emails", "{mine}");
    let exec = mine["execution_id"].as_str().unwrap().to_string();
    // Completing it through the default namespace with a wrong execution id: as if absent.
    let (st, b, _) = call(
        &app,
        "POST",
        &format!("/v1/tasks/{a_id}/complete"),
        Some(json!({"execution_id": uuid::Uuid::nil()})),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{b}");
    let (st, b, _) = call(
        &app,
        "POST",
        &format!("/v1/namespaces/acme/tasks/{a_id}/complete"),
        Some(json!({"execution_id": exec})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["state"], "succeeded");
    assert_eq!(b["queue"], "emails");

    // A bulk action acts on its namespace only.
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({"kind": "later", "queue": "q2", "delay": "1h"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        Some(json!({"kind": "later", "queue": "q2", "delay": "1h"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks:cancel",
        Some(json!({"queue": "q2"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["changed"], 1, "{b}");
    let (_, list, _) = call(&app, "GET", "/v1/tasks?queue=q2&state=scheduled", None).await;
    assert_eq!(
        ids(&list).len(),
        1,
        "the default namespace's task stays: {list}"
    );

    // A name holding the separator would be another namespace's stored name: refused, and
    // nothing of acme's is reached through the default namespace.
    let sneaky = "acme\u{1f}emails";
    for body in [
        json!({"kind": "k", "queue": sneaky}),
        json!({"kind": "k", "key": "acme\u{1f}k1"}),
        json!({"kind": "k", "idempotency_key": "acme\u{1f}order-1"}),
        // Sundial's own kinds act on what their payload names (a tick fires the schedule it
        // names, in whichever namespace): no client creates one.
        json!({"kind": "sundial.schedule.tick", "queue": "sundial.schedules", "payload": {"schedule": "x"}}),
        json!({"kind": "k", "queue": "sundial.workflows"}),
    ] {
        let (st, b, _) = call(&app, "POST", "/v1/tasks", Some(body.clone())).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {b}");
    }
    for (method, path) in [
        ("POST", "/v1/queues/acme%1Femails/poll"),
        ("POST", "/v1/queues/sundial.schedules/poll"),
        ("POST", "/v1/queues/acme%1Femails/pause"),
        ("GET", "/v1/queues/acme%1Femails"),
        ("GET", "/v1/tasks?queue=acme%1Femails"),
    ] {
        let body = (method == "POST").then(|| json!({"worker": "w", "wait": "0s"}));
        let body = if path.ends_with("/poll") { body } else { None };
        let (st, b, _) = call(&app, method, path, body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{method} {path}: {b}");
    }

    // The routes all namespaces share are not a namespace's.
    for path in [
        "/v1/namespaces/acme/tokens",
        "/v1/namespaces/acme/audit",
        "/v1/namespaces/acme/namespaces",
    ] {
        let (st, b, _) = call(&app, "GET", path, None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}: {b}");
    }
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_over_its_quota_gets_429_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());
    for body in [
        json!({"name": "capped", "max_live_tasks": 3}),
        json!({"name": "limited", "max_creates_per_second": 5}),
    ] {
        let (st, b, _) = call(&app, "POST", "/v1/namespaces", Some(body)).await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
    }
    let later = json!({"kind": "k", "delay": "1h"});

    // Most live tasks: three fit, the fourth is refused and not stored.
    for _ in 0..3 {
        let (st, b, _) = call(
            &app,
            "POST",
            "/v1/namespaces/capped/tasks",
            Some(later.clone()),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
    }
    let (st, b, headers) = call(
        &app,
        "POST",
        "/v1/namespaces/capped/tasks",
        Some(later.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{b}");
    assert_eq!(b["error"]["code"], "quota");
    assert!(headers.get("retry-after").is_some());
    let batch = json!({"tasks": [later.clone()]});
    let (st, _, _) = call(
        &app,
        "POST",
        "/v1/namespaces/capped/tasks:batch",
        Some(batch),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    let (_, list, _) = call(&app, "GET", "/v1/namespaces/capped/tasks", None).await;
    assert_eq!(ids(&list).len(), 3, "nothing stored over the quota");

    // Most creates per second: a batch of five spends the allowance; the next create waits.
    let five = json!({"tasks": vec![later.clone(); 5]});
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/namespaces/limited/tasks:batch",
        Some(five),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let (st, b, headers) = call(
        &app,
        "POST",
        "/v1/namespaces/limited/tasks",
        Some(later.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{b}");
    assert_eq!(headers.get("retry-after").unwrap(), "1");

    // Other namespaces are not held back: while the limited namespace is refused over and
    // over, a default task due now still reaches a worker within its poll.
    let engine = sundial.start();
    let (st, due, _) = call(
        &app,
        "POST",
        "/v1/tasks",
        Some(json!({"kind": "now", "queue": "fast"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let hammer = {
        let app = app.clone();
        let later = later.clone();
        tokio::spawn(async move {
            let mut refused = 0;
            for _ in 0..200 {
                let (st, _, _) = call(
                    &app,
                    "POST",
                    "/v1/namespaces/limited/tasks",
                    Some(later.clone()),
                )
                .await;
                if st == StatusCode::TOO_MANY_REQUESTS {
                    refused += 1;
                }
            }
            refused
        })
    };
    let (st, b, _) = call(
        &app,
        "POST",
        "/v1/queues/fast/poll",
        Some(json!({"worker": "w", "wait": "5s"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(b["tasks"][0]["id"], due["id"], "{b}");
    assert!(
        hammer.await.unwrap() > 150,
        "the limited namespace stayed limited"
    );
    for _ in 0..20 {
        let (st, b, _) = call(&app, "POST", "/v1/tasks", Some(later.clone())).await;
        assert_eq!(st, StatusCode::CREATED, "{b}");
    }
    engine.shutdown(std::time::Duration::from_secs(5)).await;
}
