//! Operator features end to end against the real `sundial` binary, on both backends: tags and
//! search, queues (overview, settings, pause), attempts, retrying dead letters, bulk cancel and
//! retry. Also the CLI commands for each.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::process::Output;
use std::time::Duration;

use common::{BIN, Backend, Server, Storage};
use serde_json::{Value, json};
use sundial_server::wire::{CreateTask, ListQuery, StateView};

async fn send(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let http = sundial_cli::http_client_builder().build().unwrap();
    let mut req = match method {
        "GET" => http.get(url),
        "POST" => http.post(url),
        "PUT" => http.put(url),
        m => panic!("method {m}"),
    };
    req = req.header("content-type", "application/json");
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn sundial(server: &Server, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("SUNDIAL_SERVER", &server.url)
        .env("RUST_LOG", "warn")
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the command finished")
        .expect("run sundial")
}

fn json_out(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

async fn tags_are_stored_returned_and_searched(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = &server.url;
    let (status, a) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "delay": "1h", "tags": {"tenant": "acme", "tier": "gold"}})),
    )
    .await;
    assert_eq!(status, 201, "{a}");
    assert_eq!(a["tags"], json!({"tenant": "acme", "tier": "gold"}));
    let (_, b) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "delay": "1h", "tags": {"tenant": "acme"}})),
    )
    .await;
    let (_, plain) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "key": "order-7"})),
    )
    .await;
    assert_eq!(plain["tags"], json!({}));
    let (status, got) = send(
        "GET",
        &format!("{u}/v1/tasks/{}", a["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got["tags"], a["tags"]);

    let (status, page) = send("GET", &format!("{u}/v1/tasks?tag=tenant:acme"), None).await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![b["id"].as_str().unwrap(), a["id"].as_str().unwrap()]
    );
    let (_, page) = send(
        "GET",
        &format!("{u}/v1/tasks?tag=tenant:acme&tag=tier:gold"),
        None,
    )
    .await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let listed = c
        .list(&ListQuery {
            tag: vec!["tenant:acme".into(), "tier:gold".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 1);
    let listed = c
        .list(&ListQuery {
            key_prefix: Some("order-".into()),
            due_before: Some("2099-01-01T00:00:00Z".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.tasks.len(), 1);
    assert_eq!(listed.tasks[0].key.as_deref(), Some("order-7"));

    // Bad input: a clear error, nothing stored.
    for (query, field) in [
        ("tag=novalue", "tag"),
        ("due_after=yesterday", "due_after"),
        ("created_before=x", "created_before"),
    ] {
        let (status, body) = send("GET", &format!("{u}/v1/tasks?{query}"), None).await;
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("t{i}"), json!("v"))).collect();
    for tags in [json!(many), json!({"a:b": "c"}), json!({"a": ""})] {
        let (status, body) = send(
            "POST",
            &format!("{u}/v1/tasks"),
            Some(json!({"kind": "k", "tags": tags})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], "tags", "{body}");
    }
    assert_eq!(common::count(&c).await, 3);

    // The CLI: add with tags, list by tag.
    let added = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "k",
                "--tag",
                "tenant:beta",
                "--delay",
                "1h",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(added["tags"], json!({"tenant": "beta"}));
    let listed =
        json_out(&sundial(&server, &["task", "ls", "--tag", "tenant:beta", "--json"]).await);
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);
}

async fn priorities_are_stored_returned_bounded_and_polled_in_order(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = &server.url;
    // Stored and returned; the default is 5.
    let (status, urgent) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "delay": "1h", "priority": 8})),
    )
    .await;
    assert_eq!(status, 201, "{urgent}");
    assert_eq!(urgent["priority"], 8);
    let got = c.get(urgent["id"].as_str().unwrap()).await.unwrap();
    assert_eq!(got.priority, 8);
    let (_, plain) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "delay": "1h"})),
    )
    .await;
    assert_eq!(plain["priority"], 5);

    // Bad input: a clear error, nothing stored.
    for bad in [json!(10), json!(-1), json!(300), json!("high")] {
        let (status, body) = send(
            "POST",
            &format!("{u}/v1/tasks"),
            Some(json!({"kind": "k", "priority": bad})),
        )
        .await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("priority"),
            "{body}"
        );
    }
    assert_eq!(common::count(&c).await, 2);

    // The CLI: --priority, bounded before anything is sent.
    let added = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "k",
                "--priority",
                "9",
                "--delay",
                "1h",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(added["priority"], 9);
    let refused = sundial(&server, &["task", "add", "k", "--priority", "12"]).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("priority"));
    assert_eq!(common::count(&c).await, 3);

    // Due together: a worker's polls take the higher priority first, whatever the creation order.
    let mut ids = Vec::new();
    for p in [2, 5, 9] {
        let (status, t) = send(
            "POST",
            &format!("{u}/v1/tasks"),
            Some(json!({"kind": "k", "queue": "prio", "priority": p})),
        )
        .await;
        assert_eq!(status, 201, "{t}");
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    // Bounded: 30 s in all.
    let mut ready = 0;
    for _ in 0..1_500 {
        ready = c
            .list(&ListQuery {
                queue: Some("prio".into()),
                state: Some("ready".into()),
                ..Default::default()
            })
            .await
            .unwrap()
            .tasks
            .len();
        if ready == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready, 3, "the tasks did not become ready");
    let mut order = Vec::new();
    for _ in 0..3 {
        let got = c
            .poll("prio", "w", 1, Duration::from_secs(1), None)
            .await
            .unwrap();
        assert_eq!(got.tasks.len(), 1);
        order.push(got.tasks[0].id.to_string());
    }
    assert_eq!(order, vec![ids[2].clone(), ids[1].clone(), ids[0].clone()]);
}

async fn group_limits_are_stored_bounded_and_hold_for_worker_polls(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = &server.url;
    // Bad input: a clear error, nothing stored.
    for bad in [
        json!({"kind": "k", "concurrency": {"key": "acct", "limit": 0}}),
        json!({"kind": "k", "concurrency": {"key": "acct", "limit": 10001}}),
        json!({"kind": "k", "concurrency": {"key": "", "limit": 2}}),
        json!({"kind": "k", "concurrency": {"limit": 2}}),
        json!({"kind": "k", "concurrency": {"key": "acct", "limit": 2},
               "exclusive": {"key": "acct"}}),
    ] {
        let (status, body) = send("POST", &format!("{u}/v1/tasks"), Some(bad.clone())).await;
        assert_eq!(status, 422, "{bad}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("concurrency") || message.contains("exclusive"),
            "{bad}: {body}"
        );
    }
    assert_eq!(common::count(&c).await, 0);

    // Stored and returned.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, t) = send(
            "POST",
            &format!("{u}/v1/tasks"),
            Some(json!({"kind": "k", "queue": "grp",
                        "concurrency": {"key": "acct", "limit": 2}})),
        )
        .await;
        assert_eq!(status, 201, "{t}");
        assert_eq!(t["concurrency"], json!({"key": "acct", "limit": 2}), "{t}");
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    let (_, got) = send("GET", &format!("{u}/v1/tasks/{}", ids[0]), None).await;
    assert_eq!(got["concurrency"]["limit"], 2, "{got}");

    // The CLI: both flags or neither, bounded before anything is sent.
    let added = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "k",
                "--concurrency-key",
                "acct",
                "--concurrency-limit",
                "4",
                "--delay",
                "1h",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(added["concurrency"], json!({"key": "acct", "limit": 4}));
    for args in [
        &["task", "add", "k", "--concurrency-key", "acct"][..],
        &[
            "task",
            "add",
            "k",
            "--concurrency-key",
            "acct",
            "--concurrency-limit",
            "0",
        ][..],
    ] {
        let refused = sundial(&server, args).await;
        assert!(!refused.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("concurrency"));
    }
    assert_eq!(common::count(&c).await, 4);

    // Worker polls: two of the group at once, the third after one finishes. Bounded: 30 s.
    let mut taken = Vec::new();
    for _ in 0..1_500 {
        let got = c
            .poll("grp", "w", 10, Duration::from_millis(20), None)
            .await
            .unwrap();
        taken.extend(got.tasks);
        if taken.len() >= 2 {
            break;
        }
    }
    assert_eq!(taken.len(), 2, "two of the group run at once");
    let more = c
        .poll("grp", "w", 10, Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(more.tasks.is_empty(), "a third ran while two did");
    c.complete(taken[0].id, taken[0].execution_id, None)
        .await
        .unwrap();
    let mut third = Vec::new();
    for _ in 0..100 {
        third = c
            .poll("grp", "w", 10, Duration::from_millis(300), None)
            .await
            .unwrap()
            .tasks;
        if !third.is_empty() {
            break;
        }
    }
    assert_eq!(third.len(), 1, "the third starts once one finished");
}

async fn queues_show_counts_and_pause_is_durable(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let mut server = Server::start_on(&storage);
    let u = server.url.clone();
    let c = server.client();
    for _ in 0..3 {
        let mut t = CreateTask::new("k");
        t.queue = Some("mail".into());
        c.create(&t).await.unwrap();
    }
    let (status, list) = send("GET", &format!("{u}/v1/queues"), None).await;
    assert_eq!(status, 200, "{list}");
    let mail = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "mail")
        .cloned()
        .expect("mail is listed");
    assert_eq!(mail["paused"], false);
    // No worker polls `mail`: the three are due and waiting (ready), with a lateness.
    let ready_or_scheduled =
        mail["counts"]["scheduled"].as_u64().unwrap() + mail["counts"]["ready"].as_u64().unwrap();
    assert_eq!(ready_or_scheduled, 3, "{mail}");
    assert!(mail["lateness_ms"].is_u64(), "{mail}");

    let (status, body) = send("GET", &format!("{u}/v1/queues/nowhere"), None).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = send("POST", &format!("{u}/v1/queues/bad%20name/pause"), None).await;
    assert_eq!(status, 422, "{body}");

    let (status, paused) = send("POST", &format!("{u}/v1/queues/mail/pause"), None).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"], true);
    let (status, set) = send(
        "PUT",
        &format!("{u}/v1/queues/mail"),
        Some(json!({"retention": {"succeeded": "1h", "dead": "3d"}})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["paused"], true, "settings keep the pause");
    assert_eq!(set["settings"]["retention"]["succeeded"], "1h");
    assert_eq!(set["settings"]["retention"]["dead"], "3d");
    let (status, body) = send(
        "PUT",
        &format!("{u}/v1/queues/mail"),
        Some(json!({"retention": {"succeeded": "soon"}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = send(
        "PUT",
        &format!("{u}/v1/queues/mail"),
        Some(json!({"retentoin": {}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");

    // Durable: still paused (with its settings) after a restart.
    server.terminate(Duration::from_secs(20));
    let server = Server::start_on(&storage);
    let (_, q) = send("GET", &format!("{}/v1/queues/mail", server.url), None).await;
    assert_eq!(q["paused"], true, "{q}");
    assert_eq!(q["settings"]["retention"]["succeeded"], "1h");

    // The CLI: resume, show, list.
    let resumed = json_out(&sundial(&server, &["queue", "resume", "mail", "--json"]).await);
    assert_eq!(resumed["paused"], false);
    let table = sundial(&server, &["queue", "ls"]).await;
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(text.contains("mail") && text.contains("PAUSED"), "{text}");
    let paused = json_out(&sundial(&server, &["queue", "pause", "mail", "--json"]).await);
    assert_eq!(paused["paused"], true);
    let set = json_out(
        &sundial(
            &server,
            &[
                "queue",
                "set",
                "mail",
                "--retention-cancelled",
                "2d",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(set["settings"]["retention"]["cancelled"], "2d");
    assert_eq!(
        set["settings"]["retention"].get("succeeded"),
        None,
        "set replaces the settings"
    );
    // A default push target from the command line (shown by `queue get`; replaced by the next
    // `set` like the rest of the settings).
    let set = json_out(
        &sundial(
            &server,
            &[
                "queue",
                "set",
                "mail",
                "--target",
                "https://hooks.example.com/mail",
                "--target-header",
                "x-team: a",
                "--target-timeout",
                "5s",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(
        set["settings"]["target"]["url"],
        "https://hooks.example.com/mail"
    );
    assert_eq!(set["settings"]["target"]["headers"]["x-team"], "a");
    assert_eq!(set["settings"]["target"]["timeout"], "5s");
    let got = json_out(&sundial(&server, &["queue", "get", "mail", "--json"]).await);
    assert_eq!(got["settings"]["target"], set["settings"]["target"]);

    // A concurrency limit: in range only, never on Sundial's own queues; a refused one leaves
    // the settings as they were.
    for bad in [json!({"concurrency": 0}), json!({"concurrency": 10_001})] {
        let (status, body) =
            send("PUT", &format!("{}/v1/queues/mail", server.url), Some(bad)).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], "concurrency", "{body}");
    }
    let (status, body) = send(
        "PUT",
        &format!("{}/v1/queues/sundial.schedules", server.url),
        Some(json!({"concurrency": 2})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "concurrency", "{body}");
    let (_, q) = send("GET", &format!("{}/v1/queues/mail", server.url), None).await;
    assert_eq!(q["settings"]["target"], set["settings"]["target"], "{q}");
    assert_eq!(q["settings"].get("concurrency"), None, "{q}");
    let set = json_out(
        &sundial(
            &server,
            &["queue", "set", "mail", "--concurrency", "4", "--json"],
        )
        .await,
    );
    assert_eq!(set["settings"]["concurrency"], 4, "{set}");
    let shown = sundial(&server, &["queue", "get", "mail"]).await;
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("concurrency") && l.ends_with("at most 4 running")),
        "{text}"
    );
}

async fn dead_tasks_retry_with_their_attempts(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let u = server.url.clone();
    let c = server.client();
    let mut t = CreateTask::new("k");
    t.queue = Some("jobs".into());
    t.max_attempts = Some(1);
    let created = c.create(&t).await.unwrap();
    let id = created.id.to_string();
    let polled = c
        .poll("jobs", "w-1", 1, Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!(polled.tasks.len(), 1);
    let dead = c
        .fail(
            polled.tasks[0].id,
            polled.tasks[0].execution_id,
            "no route".into(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(dead.state, StateView::Dead);

    let (status, attempts) = send("GET", &format!("{u}/v1/tasks/{id}/attempts"), None).await;
    assert_eq!(status, 200, "{attempts}");
    assert_eq!(attempts["total"], 1);
    let a = &attempts["attempts"][0];
    assert_eq!(a["seq"], 1);
    assert_eq!(a["worker"], "w-1");
    assert_eq!(a["outcome"], "failed");
    assert_eq!(a["error"], "no route");
    assert!(a["duration_ms"].is_u64());

    let (status, body) = send("POST", &format!("{u}/v1/tasks/{id}/retry"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["state"], "scheduled");
    assert_eq!(body["attempt"], 0);
    assert_eq!(body["last_error"], "no route");
    let (status, body) = send("POST", &format!("{u}/v1/tasks/{id}/retry"), Some(json!({}))).await;
    assert_eq!(status, 409, "a live task: {body}");
    assert_eq!(body["error"]["code"], "wrong_state");
    let (status, _) = send(
        "POST",
        &format!("{u}/v1/tasks/{}/retry", uuid::Uuid::nil()),
        None,
    )
    .await;
    assert_eq!(status, 404);

    // It runs again; the history keeps both attempts.
    let polled = c
        .poll("jobs", "w-2", 1, Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!(polled.tasks.len(), 1);
    assert_eq!(polled.tasks[0].attempt, 1);
    c.complete(polled.tasks[0].id, polled.tasks[0].execution_id, None)
        .await
        .unwrap();
    let history = json_out(&sundial(&server, &["task", "attempts", &id, "--json"]).await);
    assert_eq!(history["total"], 2);
    assert_eq!(history["attempts"][1]["outcome"], "succeeded");
    assert_eq!(history["attempts"][1]["worker"], "w-2");

    // A retry at a later time, through the CLI.
    let mut t = CreateTask::new("k");
    t.queue = Some("jobs".into());
    t.delay = Some("1h".into());
    let later = c.create(&t).await.unwrap();
    c.cancel(&later.id.to_string()).await.unwrap();
    let retried = json_out(
        &sundial(
            &server,
            &[
                "task",
                "retry",
                &later.id.to_string(),
                "--at",
                "2099-01-01T00:00:00Z",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(retried["state"], "scheduled");
    assert_eq!(retried["run_at"], "2099-01-01T00:00:00Z");
}

async fn bulk_cancel_and_retry_count_and_change(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let u = server.url.clone();
    let c = server.client();
    let n = 1_234;
    let tasks: Vec<CreateTask> = (0..n)
        .map(|i| {
            let mut t = CreateTask::new("k");
            t.queue = Some("bulk".into());
            t.delay = Some("1h".into());
            t.key = Some(format!("b-{i}"));
            t
        })
        .collect();
    for chunk in tasks.chunks(1_000) {
        c.create_batch(&sundial_server::wire::CreateBatch {
            tasks: chunk.to_vec(),
        })
        .await
        .unwrap();
    }
    let mut other = CreateTask::new("k");
    other.queue = Some("other".into());
    other.delay = Some("1h".into());
    c.create(&other).await.unwrap();

    let (status, body) = send("POST", &format!("{u}/v1/tasks:cancel"), Some(json!({}))).await;
    assert_eq!(status, 422, "no filter: {body}");
    let (status, dry) = send(
        "POST",
        &format!("{u}/v1/tasks:cancel"),
        Some(json!({"queue": "bulk", "dry_run": true})),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry, json!({"matched": n, "changed": 0, "dry_run": true}));
    let (status, done) = send(
        "POST",
        &format!("{u}/v1/tasks:cancel"),
        Some(json!({"queue": "bulk", "key_prefix": "b-"})),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["changed"], n);
    let (_, again) = send(
        "POST",
        &format!("{u}/v1/tasks:cancel"),
        Some(json!({"queue": "bulk"})),
    )
    .await;
    assert_eq!(again["changed"], 0, "nothing live is left");
    let (_, other_q) = send("GET", &format!("{u}/v1/queues/other"), None).await;
    assert_eq!(other_q["counts"]["cancelled"], 0);

    let dry = json_out(
        &sundial(
            &server,
            &[
                "task",
                "retry-all",
                "--queue",
                "bulk",
                "--state",
                "cancelled",
                "--dry-run",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(dry["matched"], n);
    let done =
        json_out(&sundial(&server, &["task", "retry-all", "--queue", "bulk", "--json"]).await);
    assert_eq!(done["changed"], n);
    let (_, q) = send("GET", &format!("{u}/v1/queues/bulk"), None).await;
    assert_eq!(q["counts"]["cancelled"], 0, "{q}");
    let cancelled = json_out(
        &sundial(
            &server,
            &["task", "cancel-all", "--queue", "bulk", "--json"],
        )
        .await,
    );
    assert_eq!(cancelled["changed"], n);
}

/// `task ls --error-group`, `task retry-all --error-group` and `task cancel-all --error-group`
/// act on exactly one error group: the dead letters' group of a queue with `--state dead`.
async fn error_group_flags_select_one_dead_letter_group(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let errors = ["quota exceeded\nretry in 1h", "quota exceeded", "bad input"];
    for _ in errors {
        let mut t = CreateTask::new("k");
        t.queue = Some("groups".into());
        t.max_attempts = Some(1);
        c.create(&t).await.unwrap();
    }
    let mut failed = 0;
    while failed < errors.len() {
        let got = c
            .poll("groups", "w", 10, std::time::Duration::from_secs(5), None)
            .await
            .unwrap();
        for t in got.tasks {
            c.fail(t.id, t.execution_id, errors[failed].to_string(), false)
                .await
                .unwrap();
            failed += 1;
        }
    }
    let group = [
        "--queue",
        "groups",
        "--state",
        "dead",
        "--error-group",
        "quota exceeded",
        "--json",
    ];
    let ls = json_out(&sundial(&server, &[&["task", "ls"][..], &group].concat()).await);
    assert_eq!(ls["tasks"].as_array().unwrap().len(), 2, "{ls}");
    let dry = json_out(
        &sundial(
            &server,
            &[&["task", "retry-all", "--dry-run"][..], &group].concat(),
        )
        .await,
    );
    assert_eq!(dry["matched"], 2, "{dry}");
    let done = json_out(&sundial(&server, &[&["task", "retry-all"][..], &group].concat()).await);
    assert_eq!(done["changed"], 2, "{done}");
    let (_, q) = send("GET", &format!("{}/v1/queues/groups", server.url), None).await;
    assert_eq!(q["counts"]["dead"], 1, "the other group stays dead: {q}");
    let cancelled = json_out(
        &sundial(
            &server,
            &[
                "task",
                "cancel-all",
                "--error-group",
                "quota exceeded",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(cancelled["changed"], 2, "{cancelled}");
}

/// Two `sundial server` nodes on one PostgreSQL schema: a pause made through one holds on the
/// other within a second (nothing of the queue is readied or handed to a worker on either node),
/// and a resume through the other lets the tasks go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_on_every_node() {
    let Some(storage) = Storage::new(Backend::Postgres) else {
        return;
    };
    let pg = storage.pg.as_ref().unwrap();
    let node = |id: &str| {
        let args: Vec<std::ffi::OsString> = [
            "--data-dir",
            &storage.dir.path().display().to_string(),
            "--database-url",
            &pg.url,
            "--database-schema",
            &pg.schema,
            "--node-id",
            id,
            "--shards",
            "8",
            "--shard-lease-ttl",
            "3s",
        ]
        .map(std::ffi::OsString::from)
        .to_vec();
        Server::spawn(args, &common::Launch::default(), storage.dir.path())
    };
    let a = node("a");
    let b = node("b");
    let (ca, cb) = (a.client(), b.client());
    let (status, body) = send("POST", &format!("{}/v1/queues/held/pause", a.url), None).await;
    assert_eq!(status, 200, "{body}");
    // Within a second every node holds the pause.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut ids = Vec::new();
    for i in 0..16 {
        let mut t = CreateTask::new("remote");
        t.queue = Some("held".into());
        t.key = Some(format!("h-{i}"));
        let c = if i % 2 == 0 { &ca } else { &cb };
        ids.push(c.create(&t).await.unwrap().id);
    }
    // Nothing is handed out by either node for two seconds, and every task stays scheduled.
    let (pa, pb) = tokio::join!(
        ca.poll("held", "wa", 16, Duration::from_secs(2), None),
        cb.poll("held", "wb", 16, Duration::from_secs(2), None),
    );
    assert!(
        pa.unwrap().tasks.is_empty(),
        "node a handed out a paused task"
    );
    assert!(
        pb.unwrap().tasks.is_empty(),
        "node b handed out a paused task"
    );
    for id in &ids {
        let t = cb.get(&id.to_string()).await.unwrap();
        assert_eq!(t.state, StateView::Scheduled, "{t:?}");
    }
    let (_, q) = send("GET", &format!("{}/v1/queues/held", b.url), None).await;
    assert_eq!(q["paused"], true, "{q}");
    assert_eq!(q["counts"]["scheduled"], 16, "{q}");
    assert!(q["lateness_ms"].as_u64().unwrap() >= 1_000, "{q}");

    // Resumed through the other node: the tasks go to the workers of both.
    let (status, _) = send("POST", &format!("{}/v1/queues/held/resume", b.url), None).await;
    assert_eq!(status, 200);
    let mut got = std::collections::HashSet::new();
    // Bounded: 30 rounds of two 300 ms polls.
    for _ in 0..30 {
        if got.len() == ids.len() {
            break;
        }
        for c in [&ca, &cb] {
            let r = c
                .poll("held", "w", 16, Duration::from_millis(300), None)
                .await
                .unwrap();
            got.extend(r.tasks.iter().map(|t| t.id));
        }
    }
    assert_eq!(
        got.len(),
        ids.len(),
        "every task was handed out after the resume"
    );

    // The nodes and their shards, through the API, the CLI and the overview; and the workers
    // each node saw.
    let nodes = json_out(&sundial(&a, &["queue", "nodes", "--json"]).await);
    assert_eq!(nodes["clustered"], true, "{nodes}");
    assert_eq!(nodes["node"], "a", "{nodes}");
    let listed: Vec<&str> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["a", "b"], "{nodes}");
    let held: usize = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["shards"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        held + nodes["unowned_shards"].as_array().unwrap().len(),
        8,
        "{nodes}"
    );
    let table = sundial(&b, &["queue", "nodes"]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("LAST HEARTBEAT") && table.contains("yes"),
        "{table}"
    );
    let workers = json_out(&sundial(&a, &["queue", "workers", "--json"]).await);
    let seen: Vec<(&str, &str)> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["worker"].as_str().unwrap(), w["queue"].as_str().unwrap()))
        .collect();
    assert!(
        seen.contains(&("wa", "held")) && seen.contains(&("w", "held")),
        "{workers}"
    );
    assert!(
        !seen.contains(&("wb", "held")),
        "b's pollers are b's: {workers}"
    );
    let http = sundial_cli::http_client_builder().build().unwrap();
    let page = http
        .get(format!("{}/ui", a.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Nodes and the shards they hold"), "{page}");
    assert!(
        page.contains("(this node)") && page.contains(">b<"),
        "{page}"
    );
    assert!(page.contains(">wa<"), "{page}");
}

/// Every push action from the command line: the signing secrets (add, ls, rotate, revoke), a
/// task with a target, a schedule whose tasks have one (a queue's default target is above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_commands() {
    let Some(storage) = Storage::new(Backend::Embedded) else {
        return;
    };
    let server = Server::start_on(&storage);
    let added = json_out(&sundial(&server, &["push", "secret", "add", "--json"]).await);
    let first = added["id"].as_str().expect("id").to_string();
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let listed = json_out(&sundial(&server, &["push", "secret", "ls", "--json"]).await);
    assert_eq!(listed["secrets"][0]["id"], json!(first));
    assert_eq!(listed["secrets"][0]["active"], json!(true));
    let rotated = json_out(
        &sundial(
            &server,
            &["push", "secret", "rotate", "--overlap", "0s", "--json"],
        )
        .await,
    );
    let second = rotated["id"].as_str().expect("id").to_string();
    let listed = json_out(&sundial(&server, &["push", "secret", "ls", "--json"]).await);
    let active = |l: &Value, id: &str| {
        l["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .map(|s| s["active"].clone())
    };
    assert_eq!(active(&listed, &first), Some(json!(false)));
    assert_eq!(active(&listed, &second), Some(json!(true)));
    let revoked =
        json_out(&sundial(&server, &["push", "secret", "revoke", &second, "--json"]).await);
    assert_eq!(active(&revoked, &second), Some(json!(false)));

    let task = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "invoice.remind",
                "--delay",
                "1h",
                "--target",
                "https://hooks.example.com/remind",
                "--target-header",
                "x-tenant: acme",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(task["target"]["url"], "https://hooks.example.com/remind");
    assert_eq!(task["target"]["headers"]["x-tenant"], "acme");

    let schedule = json_out(
        &sundial(
            &server,
            &[
                "schedule",
                "add",
                "report.daily",
                "--cron",
                "0 9 * * *",
                "--target",
                "https://hooks.example.com/report",
                "--target-method",
                "PUT",
                "--target-timeout",
                "10s",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(
        schedule["task"]["target"]["url"],
        "https://hooks.example.com/report"
    );
    assert_eq!(schedule["task"]["target"]["method"], "PUT");
    assert_eq!(schedule["task"]["target"]["timeout"], "10s");
}

async fn throttles_admit_one_task_per_period_and_answer_it(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = server.url.clone();
    // Bad input: a clear error naming the field, nothing stored.
    for (bad, field) in [
        (
            json!({"kind": "k", "throttle": {"key": "", "per": "1h"}}),
            "throttle.key",
        ),
        (
            json!({"kind": "k", "throttle": {"key": "a", "per": "0s"}}),
            "throttle.per",
        ),
        (
            json!({"kind": "k", "throttle": {"key": "a", "per": "5 minutes"}}),
            "throttle.per",
        ),
        (json!({"kind": "k", "throttle": {"key": "a"}}), "throttle"),
        (
            json!({"kind": "k", "throttle": {"key": "a", "per": "1h"}, "idempotency_key": "i"}),
            "throttle",
        ),
    ] {
        let (status, body) = send("POST", &format!("{u}/v1/tasks"), Some(bad.clone())).await;
        assert_eq!(status, 422, "{bad}: {body}");
        let named = body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_string()
            + body["error"]["message"].as_str().unwrap_or_default();
        assert!(named.contains(field), "{bad}: {body}");
    }
    let (status, body) = send(
        "POST",
        &format!("{u}/v1/tasks:batch"),
        Some(json!({"tasks": [{"kind": "k", "throttle": {"key": "a", "per": "1h"}}]})),
    )
    .await;
    assert_eq!(status, 422, "a batch takes no throttle: {body}");
    let (status, body) = send(
        "POST",
        &format!("{u}/v1/schedules"),
        Some(json!({"id": "s", "every": "1h",
                    "task": {"kind": "k", "throttle": {"key": "a", "per": "1h"}}})),
    )
    .await;
    assert_eq!(status, 422, "a template takes no throttle: {body}");
    assert_eq!(common::count(&c).await, 0);

    // 100 creates at once: one 201, the rest 200 with the admitted task.
    let creates = (0..100).map(|n| {
        let u = u.clone();
        tokio::spawn(async move {
            send(
                "POST",
                &format!("{u}/v1/tasks"),
                Some(json!({"kind": "digest", "queue": "mail", "delay": "1h",
                            "payload": {"n": n},
                            "throttle": {"key": "user-42", "per": "10m"}})),
            )
            .await
        })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap());
    }
    let admitted: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
    assert_eq!(admitted.len(), 1, "{answers:?}");
    let id = admitted[0].1["id"].as_str().unwrap().to_string();
    for (status, t) in &answers {
        assert!(*status == 201 || *status == 200, "{status}: {t}");
        assert_eq!(t["id"], id.as_str(), "{t}");
    }
    assert_eq!(common::count(&c).await, 1);

    // The CLI: both flags, and a throttled repeat prints the admitted task.
    let cli = |key: &'static str| {
        let server = &server;
        async move {
            json_out(
                &sundial(
                    server,
                    &[
                        "task",
                        "add",
                        "digest",
                        "-q",
                        "mail",
                        "--throttle-key",
                        key,
                        "--throttle-per",
                        "10m",
                        "--json",
                    ],
                )
                .await,
            )
        }
    };
    assert_eq!(cli("user-42").await["id"], id.as_str());
    assert_ne!(cli("user-7").await["id"], id.as_str());
    let refused = sundial(&server, &["task", "add", "k", "--throttle-key", "a"]).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("throttle"));
    assert_eq!(common::count(&c).await, 2);
}

async fn debounces_keep_one_pending_task_per_key(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = server.url.clone();
    // Bad input: a clear error naming the field, nothing stored.
    for (bad, field) in [
        (
            json!({"kind": "k", "debounce": {"key": "", "delay": "30s"}}),
            "debounce.key",
        ),
        (
            json!({"kind": "k", "debounce": {"key": "a", "delay": "5 minutes"}}),
            "debounce.delay",
        ),
        (
            json!({"kind": "k", "debounce": {"key": "a", "delay": "30s", "max_wait": "10s"}}),
            "debounce.max_wait",
        ),
        (json!({"kind": "k", "debounce": {"key": "a"}}), "debounce"),
        (
            json!({"kind": "k", "debounce": {"key": "a", "delay": "30s"}, "delay": "1m"}),
            "debounce",
        ),
        (
            json!({"kind": "k", "debounce": {"key": "a", "delay": "30s"},
                   "throttle": {"key": "a", "per": "1h"}}),
            "debounce",
        ),
        (
            json!({"kind": "k", "debounce": {"key": "a", "delay": "30s"}, "idempotency_key": "i"}),
            "debounce",
        ),
    ] {
        let (status, body) = send("POST", &format!("{u}/v1/tasks"), Some(bad.clone())).await;
        assert_eq!(status, 422, "{bad}: {body}");
        let named = body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_string()
            + body["error"]["message"].as_str().unwrap_or_default();
        assert!(named.contains(field), "{bad}: {body}");
    }
    let (status, body) = send(
        "POST",
        &format!("{u}/v1/tasks:batch"),
        Some(json!({"tasks": [{"kind": "k", "debounce": {"key": "a", "delay": "1s"}}]})),
    )
    .await;
    assert_eq!(status, 422, "a batch takes no debounce: {body}");
    let (status, body) = send(
        "POST",
        &format!("{u}/v1/schedules"),
        Some(json!({"id": "s", "every": "1h",
                    "task": {"kind": "k", "debounce": {"key": "a", "delay": "1s"}}})),
    )
    .await;
    assert_eq!(status, 422, "a template takes no debounce: {body}");
    assert_eq!(common::count(&c).await, 0);

    // 100 creates at once: one 201, the rest 200 with the same pending task.
    let creates = (0..100).map(|n| {
        let u = u.clone();
        tokio::spawn(async move {
            send(
                "POST",
                &format!("{u}/v1/tasks"),
                Some(
                    json!({"kind": "reindex", "queue": "search", "payload": {"n": n},
                            "debounce": {"key": "doc-42", "delay": "1h", "max_wait": "2h"}}),
                ),
            )
            .await
        })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap());
    }
    let stored: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
    assert_eq!(stored.len(), 1, "{answers:?}");
    let id = stored[0].1["id"].as_str().unwrap().to_string();
    for (status, t) in &answers {
        assert!(*status == 201 || *status == 200, "{status}: {t}");
        assert_eq!(t["id"], id.as_str(), "{t}");
    }
    assert_eq!(common::count(&c).await, 1);

    // The CLI: a debounced create replaces the pending task's payload and prints it.
    let out = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "reindex",
                "-q",
                "search",
                "--payload",
                r#"{"n": "cli"}"#,
                "--debounce-key",
                "doc-42",
                "--debounce-delay",
                "1h",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(out["id"], id.as_str());
    assert_eq!(out["payload"], json!({"n": "cli"}));
    let refused = sundial(
        &server,
        &["task", "add", "k", "--debounce-key", "a", "--delay", "1s"],
    )
    .await;
    assert!(!refused.status.success());
    assert_eq!(common::count(&c).await, 1);
}

async fn rate_limits_are_stored_bounded_and_space_worker_starts(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let u = server.url.clone();
    // Bad input: a clear error naming the field, nothing stored.
    for (bad, field) in [
        (
            json!({"kind": "k", "rate": {"limit": 0, "per": "1s"}}),
            "rate.limit",
        ),
        (
            json!({"kind": "k", "rate": {"limit": 10001, "per": "1h"}}),
            "rate.limit",
        ),
        (
            json!({"kind": "k", "rate": {"limit": 100, "per": "50ms"}}),
            "rate.limit",
        ),
        (
            json!({"kind": "k", "rate": {"limit": 1, "per": "0s"}}),
            "rate.per",
        ),
        (
            json!({"kind": "k", "rate": {"limit": 1, "per": "400d"}}),
            "rate.per",
        ),
        (
            json!({"kind": "k", "rate": {"key": " a", "limit": 1, "per": "1s"}}),
            "rate.key",
        ),
        (json!({"kind": "k", "rate": {"limit": 1}}), "rate"),
    ] {
        let (status, body) = send("POST", &format!("{u}/v1/tasks"), Some(bad.clone())).await;
        assert_eq!(status, 422, "{bad}: {body}");
        let named = body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_string()
            + body["error"]["message"].as_str().unwrap_or_default();
        assert!(named.contains(field), "{bad}: {body}");
    }
    assert_eq!(common::count(&c).await, 0);

    // Stored and shown; the CLI takes the same.
    let (status, t) = send(
        "POST",
        &format!("{u}/v1/tasks"),
        Some(json!({"kind": "k", "queue": "later", "delay": "1h",
                    "rate": {"key": "smtp", "limit": 30, "per": "1m"}})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    assert_eq!(t["rate"], json!({"key": "smtp", "limit": 30, "per": "1m"}));
    let cli = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "k",
                "-q",
                "later",
                "--delay",
                "1h",
                "--rate-limit",
                "5",
                "--rate-per",
                "1s",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(cli["rate"], json!({"limit": 5, "per": "1s"}));
    let shown = sundial(&server, &["queue", "get", "later"]).await;
    assert!(shown.status.success());
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("rate limited") && l.ends_with(" 0")),
        "{shown}"
    );

    // Worker polls: 5 tasks due now under a limit of 4 per second (one per 250 ms) become
    // ready one at a time, so the last starts at least 1 s after the first was created; while
    // they wait the queue shows them as rate limited.
    const N: usize = 5;
    let began = sundial::Clock::now(&sundial::SystemClock);
    for n in 0..N {
        let (status, t) = send(
            "POST",
            &format!("{u}/v1/tasks"),
            Some(json!({"kind": "k", "queue": "rl", "payload": {"n": n},
                        "rate": {"key": "api", "limit": 4, "per": "1s"}})),
        )
        .await;
        assert_eq!(status, 201, "{t}");
    }
    let mut saw_waiting = false;
    let mut taken = Vec::new();
    for _ in 0..300 {
        if !saw_waiting {
            saw_waiting = c.queue("rl").await.unwrap().rate_limited > 0;
        }
        let got = c
            .poll("rl", "w", 10, Duration::from_millis(50), None)
            .await
            .unwrap();
        for t in got.tasks {
            c.complete(t.id, t.execution_id, None).await.unwrap();
            taken.push(t);
        }
        if taken.len() == N {
            break;
        }
    }
    assert_eq!(taken.len(), N, "every task ran");
    assert!(saw_waiting, "the queue showed tasks waiting for the limit");
    // The last became ready at least 4 intervals after the first, which became ready after
    // `began` (read on the clock the server reads).
    let took = sundial::Clock::now(&sundial::SystemClock).0 - began.0;
    assert!(took >= 1_000, "5 starts at 4/s took {took} ms");
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(super::Backend::Embedded).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await
            }
        }
    )*};
}

both_backends!(
    tags_are_stored_returned_and_searched,
    priorities_are_stored_returned_bounded_and_polled_in_order,
    group_limits_are_stored_bounded_and_hold_for_worker_polls,
    throttles_admit_one_task_per_period_and_answer_it,
    debounces_keep_one_pending_task_per_key,
    rate_limits_are_stored_bounded_and_space_worker_starts,
    queues_show_counts_and_pause_is_durable,
    dead_tasks_retry_with_their_attempts,
    bulk_cancel_and_retry_count_and_change,
    error_group_flags_select_one_dead_letter_group,
);
