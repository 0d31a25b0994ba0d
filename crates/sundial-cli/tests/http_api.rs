//! End-to-end tests of the v1 HTTP API against the real `sundial` binary, on both backends: each
//! test body is one function taking a [`Backend`], run by two `#[test]`s, `<name>::embedded` and
//! `<name>::postgres` (see `both_backends!` at the end). The PostgreSQL ones use a fresh schema
//! each and are skipped without `SUNDIAL_TEST_DATABASE_URL` (see `common/pg.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::time::Duration;

use common::{Backend, Server, Storage, all_tasks, count, now_ms, rfc3339_ms};
use serde_json::{Value, json};
use sundial_server::wire::{BatchItem, CreateBatch, CreateTask, ListQuery, StateView};

async fn raw(method: &str, url: &str, body: Option<Vec<u8>>) -> (u16, Value) {
    let http = sundial_cli::http_client_builder().build().unwrap();
    let mut req = match method {
        "GET" => http.get(url),
        "POST" => http.post(url),
        "DELETE" => http.delete(url),
        m => panic!("method {m}"),
    };
    if method != "GET" {
        req = req.header("content-type", "application/json");
    }
    if let Some(b) = body {
        req = req.body(b);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    raw("POST", url, Some(body.to_string().into_bytes())).await
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<none>")
}

async fn create_get_and_list_round_trip(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();

    let before = now_ms();
    let (status, body) = post(
        &format!("{}/v1/tasks", server.url),
        json!({"queue": "mail", "kind": "email.send", "key": "order-1",
               "payload": {"to": "a@example.com"}, "delay": "1h",
               "max_attempts": 3, "timeout": "30s"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "scheduled");
    assert_eq!(body["queue"], "mail");
    assert_eq!(body["kind"], "email.send");
    assert_eq!(body["key"], "order-1");
    assert_eq!(body["payload"], json!({"to": "a@example.com"}));
    assert_eq!(body["attempt"], 0);
    assert_eq!(body["max_attempts"], 3);
    assert_eq!(body["timeout"], "30s");
    let run_at = rfc3339_ms(body["run_at"].as_str().unwrap());
    let created_at = rfc3339_ms(body["created_at"].as_str().unwrap());
    assert_eq!(
        run_at - created_at,
        3_600_000,
        "delay applied to the server's now"
    );
    assert!(created_at >= before - backend.server_clock_lag_ms());
    assert!(run_at <= now_ms() + 3_600_000);

    let id = body["id"].as_str().unwrap();
    let got = c.get(id).await.unwrap();
    assert_eq!(serde_json::to_value(&got).unwrap(), body);

    // run_at given as an absolute time with an offset.
    let (status, body) = post(
        &format!("{}/v1/tasks", server.url),
        json!({"kind": "report", "run_at": "2099-01-02T05:04:05.250+02:00"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["run_at"], "2099-01-02T03:04:05.250Z");
    assert_eq!(body["queue"], "default");
    assert_eq!(body["payload"], Value::Null);

    let all = all_tasks(&c).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].kind, "report", "newest first");
}

async fn long_poll_waits_delivers_when_due_and_complete_records_the_result(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();

    // Nothing ready: the poll answers empty after its wait.
    let empty = c
        .poll("jobs", "w1", 5, Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(empty.tasks.is_empty());

    // A poll that is already waiting gets a task created later, once it is due.
    let poller = {
        let c = c.clone();
        tokio::spawn(async move { c.poll("jobs", "w1", 5, Duration::from_secs(30), None).await })
    };
    let mut req = CreateTask::new("resize");
    req.queue = Some("jobs".into());
    req.delay = Some("700ms".into());
    req.payload = Some(json!({"image": 7}));
    let created = c.create(&req).await.unwrap();
    let run_at = rfc3339_ms(&created.run_at);
    let polled = poller.await.unwrap().unwrap();
    let received = now_ms();
    assert_eq!(polled.tasks.len(), 1);
    let t = &polled.tasks[0];
    assert_eq!(t.id, created.id);
    assert_eq!(t.kind, "resize");
    assert_eq!(t.payload, json!({"image": 7}));
    assert_eq!(t.attempt, 1);
    assert!(received >= run_at, "delivered before its run_at");
    assert!(rfc3339_ms(&t.lease_expires_at) > run_at);

    let running = c.get(&t.id.to_string()).await.unwrap();
    assert_eq!(running.state, StateView::Running);
    assert_eq!(running.worker.as_deref(), Some("w1"));
    assert!(rfc3339_ms(running.started_at.as_deref().unwrap()) >= run_at);

    let hb = c.heartbeat(t.id, t.execution_id).await.unwrap();
    assert_eq!(hb.state, StateView::Running);

    let done = c
        .complete(t.id, t.execution_id, Some(json!({"thumb": "7.png"})))
        .await
        .unwrap();
    assert_eq!(done.state, StateView::Succeeded);
    assert_eq!(done.result, Some(json!({"thumb": "7.png"})));
    assert!(done.finished_at.is_some());

    // A retried complete of the attempt that committed answers the task as it is (applied once:
    // the result stays the first one); the attempt is over, so a heartbeat is stale.
    let again = c.complete(t.id, t.execution_id, None).await.unwrap();
    assert_eq!(again.state, StateView::Succeeded);
    assert_eq!(again.result, Some(json!({"thumb": "7.png"})));
    let hb = c.heartbeat(t.id, t.execution_id).await.unwrap_err();
    assert!(hb.is_conflict(), "{hb}");
    assert_eq!(
        c.get(&t.id.to_string()).await.unwrap().result,
        Some(json!({"thumb": "7.png"}))
    );
}

/// A poll that carries the worker's previous completion records it, then hands out the next
/// task; a refused completion (stale, unknown, too large) is the answer and nothing is taken.
async fn a_poll_records_the_completion_it_carries_before_it_takes(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let poll_url = format!("{}/v1/queues/jobs/poll", server.url);
    let mut req = CreateTask::new("step");
    req.queue = Some("jobs".into());
    let first = c.create(&req).await.unwrap();
    let second = c.create(&req).await.unwrap();
    let got = c
        .poll("jobs", "w1", 1, Duration::from_secs(10), None)
        .await
        .unwrap();
    assert_eq!(got.tasks.len(), 1);
    let t = &got.tasks[0];
    assert_eq!(t.id, first.id);
    assert!(got.completed.is_none());

    // Refused completions: answered as `complete` would be, and the second task stays ready.
    let stale = uuid::Uuid::now_v7();
    let (status, body) = post(
        &poll_url,
        json!({"worker": "w1", "wait": "100ms",
               "complete": {"task_id": t.id, "execution_id": stale}}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["field"], "complete.task_id", "{body}");
    let (status, body) = post(
        &poll_url,
        json!({"worker": "w1", "wait": "100ms",
               "complete": {"task_id": uuid::Uuid::now_v7(), "execution_id": t.execution_id}}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let huge = "x".repeat(300 * 1024);
    let (status, body) = post(
        &poll_url,
        json!({"worker": "w1", "wait": "100ms",
               "complete": {"task_id": t.id, "execution_id": t.execution_id, "result": huge}}),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    let (status, body) = post(
        &poll_url,
        json!({"worker": "w1", "complete": {"task_id": t.id}}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        c.get(&first.id.to_string()).await.unwrap().state,
        StateView::Running
    );
    assert_eq!(
        c.get(&second.id.to_string()).await.unwrap().state,
        StateView::Ready
    );

    // `task`'s attempt completed with `result` by a poll of `jobs` waiting up to `wait`.
    let carry = |task: &sundial_server::wire::PolledTask, result, wait| {
        let (c, id, execution) = (c.clone(), task.id, task.execution_id);
        async move {
            c.complete_and_poll(id, execution, result, "jobs", "w1", 1, wait)
                .await
                .unwrap()
        }
    };
    // The completion is recorded and the next task handed out in the same answer.
    let next = carry(t, Some(json!({"n": 1})), Duration::from_secs(10)).await;
    let done = next.completed.expect("the completed task");
    assert_eq!(done.id, first.id);
    assert_eq!(done.state, StateView::Succeeded);
    assert_eq!(done.result, Some(json!({"n": 1})));
    assert_eq!(next.tasks.len(), 1);
    let u = &next.tasks[0];
    assert_eq!(u.id, second.id);
    let stored = c.get(&first.id.to_string()).await.unwrap();
    assert_eq!(stored.state, StateView::Succeeded);
    assert_eq!(stored.result, Some(json!({"n": 1})));
    assert_eq!(
        c.get(&second.id.to_string()).await.unwrap().state,
        StateView::Running
    );

    // A retry of a call whose answer was lost: the completion counts as recorded (the result
    // stays the first one), and the poll goes on (nothing left: empty after its wait).
    let again = carry(t, None, Duration::from_millis(200)).await;
    assert_eq!(
        again.completed.expect("completed").result,
        Some(json!({"n": 1}))
    );
    assert!(again.tasks.is_empty());
    // The last task completes with a poll that finds nothing.
    let last = carry(u, None, Duration::from_millis(200)).await;
    assert_eq!(
        last.completed.expect("completed").state,
        StateView::Succeeded
    );
    assert!(last.tasks.is_empty());
}

async fn fail_retries_with_backoff_then_goes_dead(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();

    let created = c
        .create(&CreateTask {
            queue: Some("flaky".into()),
            max_attempts: Some(2),
            backoff: Some(sundial_server::wire::BackoffSpec {
                initial: Some("300ms".into()),
                factor: Some(1.0),
                max: Some("300ms".into()),
                jitter: Some(0.0),
            }),
            ..CreateTask::new("call")
        })
        .await
        .unwrap();
    let id = created.id.to_string();

    let first = c
        .poll("flaky", "w", 1, Duration::from_secs(30), None)
        .await
        .unwrap()
        .tasks
        .remove(0);
    assert_eq!(first.attempt, 1);
    let failed_at = now_ms();
    let after = c
        .fail(first.id, first.execution_id, "boom 1".into(), true)
        .await
        .unwrap();
    assert_eq!(after.state, StateView::Scheduled);
    assert_eq!(after.attempt, 1);
    assert_eq!(after.last_error.as_deref(), Some("boom 1"));
    assert!(
        rfc3339_ms(&after.run_at) >= rfc3339_ms(&after.updated_at) + 300,
        "backoff applied to the server's now"
    );
    assert!(rfc3339_ms(&after.updated_at) >= failed_at - backend.server_clock_lag_ms());

    // The old execution is stale: a late heartbeat or result is refused.
    assert!(
        c.heartbeat(first.id, first.execution_id)
            .await
            .unwrap_err()
            .is_conflict()
    );

    let second = c
        .poll("flaky", "w", 1, Duration::from_secs(30), None)
        .await
        .unwrap()
        .tasks
        .remove(0);
    assert_eq!(second.id, first.id);
    assert_eq!(second.attempt, 2);
    assert_ne!(second.execution_id, first.execution_id);
    assert!(now_ms() >= rfc3339_ms(&after.run_at));
    let dead = c
        .fail(second.id, second.execution_id, "boom 2".into(), true)
        .await
        .unwrap();
    assert_eq!(dead.state, StateView::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("boom 2"));
    assert_eq!(c.get(&id).await.unwrap().state, StateView::Dead);

    // retryable: false goes dead at once even with attempts left.
    let t = c
        .create(&CreateTask {
            queue: Some("flaky".into()),
            ..CreateTask::new("call")
        })
        .await
        .unwrap();
    let p = c
        .poll("flaky", "w", 1, Duration::from_secs(30), None)
        .await
        .unwrap()
        .tasks
        .remove(0);
    assert_eq!(p.id, t.id);
    let d = c
        .fail(p.id, p.execution_id, "permanent".into(), false)
        .await
        .unwrap();
    assert_eq!(d.state, StateView::Dead);
}

async fn cancel_and_trigger(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let later = |q: &str| CreateTask {
        queue: Some(q.into()),
        delay: Some("1h".into()),
        ..CreateTask::new("later")
    };

    // Trigger: a task due in an hour becomes due now and is delivered.
    let t = c.create(&later("trig")).await.unwrap();
    let before = now_ms();
    let trig = c.trigger(&t.id.to_string()).await.unwrap();
    assert_eq!(trig.state, StateView::Scheduled);
    assert!(rfc3339_ms(&trig.run_at) <= now_ms());
    assert_eq!(trig.run_at, trig.updated_at, "due at the server's now");
    assert!(rfc3339_ms(&trig.run_at) >= before - backend.server_clock_lag_ms());
    let p = c
        .poll("trig", "w", 1, Duration::from_secs(30), None)
        .await
        .unwrap();
    assert_eq!(p.tasks.len(), 1);
    assert_eq!(p.tasks[0].id, t.id);
    // Not scheduled any more: 409.
    let e = c.trigger(&t.id.to_string()).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");

    // Cancel a running task: its worker's next heartbeat is refused, and so is its result.
    let cancelled = c.cancel(&t.id.to_string()).await.unwrap();
    assert_eq!(cancelled.state, StateView::Cancelled);
    let hb = c
        .heartbeat(p.tasks[0].id, p.tasks[0].execution_id)
        .await
        .unwrap_err();
    assert!(hb.is_conflict(), "{hb}");
    let done = c
        .complete(p.tasks[0].id, p.tasks[0].execution_id, None)
        .await
        .unwrap_err();
    assert!(done.is_conflict(), "{done}");

    // Cancel a scheduled task; a second cancel answers the same (idempotent) and changes nothing.
    let s = c.create(&later("canc")).await.unwrap();
    let n = count(&c).await;
    let first = c.cancel(&s.id.to_string()).await.unwrap();
    assert_eq!(first.state, StateView::Cancelled);
    let second = c.cancel(&s.id.to_string()).await.unwrap();
    assert_eq!(second, first);
    let e = c.trigger(&s.id.to_string()).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert_eq!(count(&c).await, n);
    assert_eq!(
        c.get(&s.id.to_string()).await.unwrap().state,
        StateView::Cancelled
    );
    // A cancelled task is never delivered.
    let p = c
        .poll("canc", "w", 1, Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(p.tasks.is_empty());

    // A cancelled key is free again.
    let mut keyed = later("canc");
    keyed.key = Some("k".into());
    let k1 = c.create(&keyed).await.unwrap();
    assert!(c.create(&keyed).await.unwrap_err().is_conflict());
    c.cancel(&k1.id.to_string()).await.unwrap();
    let k2 = c.create(&keyed).await.unwrap();
    assert_ne!(k1.id, k2.id);
}

/// Every refused request is answered with the documented status and code, and stores nothing.
async fn rejected_requests_store_nothing(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let url = |p: &str| format!("{}{}", server.url, p);

    let holder = c
        .create(&CreateTask {
            key: Some("held".into()),
            delay: Some("1h".into()),
            ..CreateTask::new("k")
        })
        .await
        .unwrap();
    let baseline = count(&c).await;
    assert_eq!(baseline, 1);

    let big_payload = json!({"kind": "k", "payload": "x".repeat(300 * 1024)});
    // Just over the 1 MiB body limit: small enough that the client finishes sending before the
    // server answers 413 and closes.
    let huge_body = json!({"kind": "k", "payload": "x".repeat(1024 * 1024 + 1024)});
    let mut too_many = Vec::new();
    for _ in 0..1_001 {
        too_many.push(json!({"kind": "k"}));
    }
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("/v1/tasks", b"{\"kind\": ".to_vec(), 400, "malformed"),
        ("/v1/tasks", b"not json".to_vec(), 400, "malformed"),
        ("/v1/tasks", b"".to_vec(), 400, "malformed"),
        (
            "/v1/tasks",
            br#"{"kind":"k"} {}"#.to_vec(),
            400,
            "malformed",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","delya":"5s"}"#.to_vec(),
            422,
            "invalid",
        ),
        ("/v1/tasks", br#"{"queue":"q"}"#.to_vec(), 422, "invalid"),
        ("/v1/tasks", br#"[]"#.to_vec(), 422, "invalid"),
        ("/v1/tasks", br#"{"kind":""}"#.to_vec(), 422, "invalid"),
        (
            "/v1/tasks",
            br#"{"kind":"has space"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","queue":"-x"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","key":"a\u0007b"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","key":" padded"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","delay":"-5s"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","delay":"5"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","delay":5}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","delay":"1s","run_at":"2030-01-01T00:00:00Z"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","run_at":"tomorrow"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","run_at":"1960-01-01T00:00:00Z"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","max_attempts":0}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","max_attempts":-1}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","timeout":"0s"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","backoff":{"inital":"1s"}}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","backoff":{"factor":0.5}}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","exclusive":{"key":"x","mode":"sometimes"}}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks",
            big_payload.to_string().into_bytes(),
            413,
            "too_large",
        ),
        (
            "/v1/tasks",
            huge_body.to_string().into_bytes(),
            413,
            "too_large",
        ),
        (
            "/v1/tasks",
            br#"{"kind":"k","key":"held"}"#.to_vec(),
            409,
            "already_exists",
        ),
        (
            "/v1/tasks:batch",
            br#"{"tasks":[{"kind":"a"},{"kind":"b"},{"kind":"c","delay":"-1s"}]}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks:batch",
            br#"{"tasks":[{"kind":"a"},{"kind":"b"},{"kind":"c","typo":1}]}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks:batch",
            br#"{"tasks":[{"kind":"a"},{"kind":"b"},{"kind":""}]}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks:batch",
            br#"{"tasks":[{"kind":"a"}],"atomic":true}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/tasks:batch",
            br#"{"tasks":[{"kind":"a"}"#.to_vec(),
            400,
            "malformed",
        ),
        (
            "/v1/tasks:batch",
            json!({"tasks": too_many}).to_string().into_bytes(),
            413,
            "too_large",
        ),
        (
            "/v1/tasks:batch",
            json!({"tasks": [{"kind": "a"}, {"kind": "b", "payload": "x".repeat(300 * 1024)}]})
                .to_string()
                .into_bytes(),
            413,
            "too_large",
        ),
        (
            "/v1/queues/q/poll",
            br#"{"worker":"w","wiat":"1s"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/queues/q/poll",
            br#"{"worker":"w","max":0}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/queues/q/poll",
            br#"{"worker":"w","wait":"soon"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/queues/q/poll",
            br#"{"wait":"1s"}"#.to_vec(),
            422,
            "invalid",
        ),
        (
            "/v1/queues/bad%20queue/poll",
            br#"{"worker":"w"}"#.to_vec(),
            422,
            "invalid",
        ),
    ];
    for (path, body, status, want) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (got, resp) = raw("POST", &url(path), Some(body)).await;
        assert_eq!(got, status, "{path} {shown}: {resp}");
        assert_eq!(code(&resp), want, "{path} {shown}: {resp}");
        assert!(
            resp["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert_eq!(count(&c).await, baseline, "{path} {shown} stored something");
    }

    // The 409 names the holder.
    let (_, resp) = post(&url("/v1/tasks"), json!({"kind": "k", "key": "held"})).await;
    assert_eq!(resp["error"]["existing_id"], holder.id.to_string());
    // Batch errors name the index of the bad item.
    let (_, resp) = post(
        &url("/v1/tasks:batch"),
        json!({"tasks": [{"kind": "a"}, {"kind": "b"}, {"kind": "c", "delay": "-1s"}]}),
    )
    .await;
    assert_eq!(resp["error"]["index"], 2, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tasks[2]")
    );
    let (_, resp) = post(
        &url("/v1/tasks:batch"),
        json!({"tasks": [{"kind": "a"}, {"kind": "b", "colour": "red"}]}),
    )
    .await;
    assert_eq!(resp["error"]["index"], 1, "{resp}");

    // Unknown ids and routes: 404. Bad query strings: 422.
    let missing = "01890000-0000-7000-8000-000000000000";
    for (method, path) in [
        ("GET", format!("/v1/tasks/{missing}")),
        ("GET", "/v1/tasks/not-an-id".to_string()),
        ("POST", format!("/v1/tasks/{missing}/cancel")),
        ("POST", format!("/v1/tasks/{missing}/trigger")),
        ("GET", "/v1/nothing".to_string()),
    ] {
        let (got, resp) = raw(method, &url(&path), None).await;
        assert_eq!(got, 404, "{method} {path}: {resp}");
        assert_eq!(code(&resp), "not_found");
    }
    let exec = json!({"execution_id": "01890000-0000-7000-8000-000000000001"});
    for path in ["heartbeat", "complete", "fail"] {
        let (got, resp) = post(&url(&format!("/v1/tasks/{missing}/{path}")), exec.clone()).await;
        assert_eq!(got, 404, "{path}: {resp}");
    }
    // A known task that is not running: the execution id is stale.
    for path in ["heartbeat", "complete", "fail"] {
        let (got, resp) = post(
            &url(&format!("/v1/tasks/{}/{path}", holder.id)),
            exec.clone(),
        )
        .await;
        assert_eq!(got, 409, "{path}: {resp}");
        assert_eq!(code(&resp), "stale_execution");
    }
    for q in [
        "limt=5",
        "limit=0",
        "limit=1001",
        "limit=abc",
        "state=sleeping",
        "cursor=zzz",
    ] {
        let (got, resp) = raw("GET", &url(&format!("/v1/tasks?{q}")), None).await;
        assert_eq!(got, 422, "{q}: {resp}");
    }
    let (got, _) = raw("DELETE", &url("/v1/tasks"), None).await;
    assert_eq!(got, 405);
    assert_eq!(count(&c).await, baseline);
    assert_eq!(
        c.get(&holder.id.to_string()).await.unwrap().state,
        StateView::Scheduled
    );
}

async fn batch_creates_in_order_and_reports_duplicates_per_item(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    c.create(&CreateTask {
        key: Some("taken".into()),
        delay: Some("1h".into()),
        ..CreateTask::new("k")
    })
    .await
    .unwrap();
    let batch = CreateBatch {
        tasks: vec![
            CreateTask::new("a"),
            CreateTask {
                key: Some("taken".into()),
                ..CreateTask::new("b")
            },
            CreateTask {
                key: Some("fresh".into()),
                delay: Some("1h".into()),
                ..CreateTask::new("c")
            },
            CreateTask {
                key: Some("fresh".into()),
                ..CreateTask::new("d")
            },
        ],
    };
    let resp = c.create_batch(&batch).await.unwrap();
    assert_eq!(resp.results.len(), 4);
    let kinds: Vec<String> = resp
        .results
        .iter()
        .map(|r| match r {
            BatchItem::Created { state, .. } => state.as_str().to_string(),
            BatchItem::Duplicate { .. } => "dup".into(),
        })
        .collect();
    assert_eq!(kinds, ["scheduled", "dup", "scheduled", "dup"]);
    let fresh_id = match &resp.results[2] {
        BatchItem::Created { id, .. } => *id,
        _ => unreachable!(),
    };
    match &resp.results[3] {
        BatchItem::Duplicate { existing_id } => assert_eq!(*existing_id, fresh_id),
        other => panic!("{other:?}"),
    }
    for (i, kind) in [(0, "a"), (2, "c")] {
        let BatchItem::Created { id, run_at, .. } = &resp.results[i] else {
            panic!("item {i} not created");
        };
        let t = c.get(&id.to_string()).await.unwrap();
        assert_eq!(t.kind, kind);
        assert_eq!(&t.run_at, run_at);
    }
    assert_eq!(count(&c).await, 3);
}

async fn list_paginates_newest_first_with_filters(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let tasks: Vec<CreateTask> = (0..25)
        .map(|i| CreateTask {
            queue: Some(if i % 2 == 0 { "even" } else { "odd" }.into()),
            key: Some(format!("k{i}")),
            delay: Some("1h".into()),
            ..CreateTask::new(if i % 5 == 0 { "five" } else { "other" })
        })
        .collect();
    let created: Vec<uuid::Uuid> = c
        .create_batch(&CreateBatch { tasks })
        .await
        .unwrap()
        .results
        .into_iter()
        .map(|r| match r {
            BatchItem::Created { id, .. } => id,
            other => panic!("{other:?}"),
        })
        .collect();

    let mut seen = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = c
            .list(&ListQuery {
                limit: Some(10),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        pages += 1;
        assert!(page.tasks.len() <= 10);
        seen.extend(page.tasks.iter().map(|t| t.id));
        match page.next_cursor {
            Some(cur) if !page.tasks.is_empty() => cursor = Some(cur),
            _ => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    let mut expected = created.clone();
    expected.reverse();
    assert_eq!(seen, expected, "every task once, newest first");

    let even = c
        .list(&ListQuery {
            queue: Some("even".into()),
            limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(even.tasks.len(), 13);
    assert!(even.tasks.iter().all(|t| t.queue == "even"));
    let five = c
        .list(&ListQuery {
            kind: Some("five".into()),
            state: Some("scheduled".into()),
            limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(five.tasks.len(), 5);
    let keyed = c
        .list(&ListQuery {
            key: Some("k7".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(keyed.tasks.len(), 1);
    assert_eq!(keyed.tasks[0].id, created[7]);
    let none = c
        .list(&ListQuery {
            state: Some("succeeded".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.tasks.is_empty());
    assert_eq!(none.next_cursor, None);
}

async fn health_metrics_and_openapi(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let (status, body) = raw("GET", &format!("{}/healthz", server.url), None).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));

    c.create(&CreateTask {
        queue: Some("metered".into()),
        delay: Some("1h".into()),
        ..CreateTask::new("k")
    })
    .await
    .unwrap();
    let text = sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"sundial_tasks{namespace="default",queue="metered",state="scheduled"} 1"#),
        "{text}"
    );
    assert!(text.contains("sundial_task_created_total"), "{text}");

    let (status, doc) = raw("GET", &format!("{}/openapi.json", server.url), None).await;
    assert_eq!(status, 200);
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/tasks",
        "/v1/tasks:batch",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/cancel",
        "/v1/tasks/{id}/trigger",
        "/v1/queues/{queue}/poll",
        "/v1/tasks/{id}/heartbeat",
        "/v1/tasks/{id}/complete",
        "/v1/tasks/{id}/fail",
        "/healthz",
        "/metrics",
        "/v1/schedules",
        "/v1/schedules/{id}/fires",
        "/v1/workflows",
        "/v1/workflows/{id}/history",
    ] {
        assert!(
            paths.contains_key(p),
            "{p} missing from the OpenAPI document"
        );
    }
    assert!(doc["components"]["schemas"]["CreateTask"].is_object());
}

/// Health is not queued behind task work: it answers while many long-polls are held open and
/// creates are streaming in.
async fn healthz_answers_while_task_endpoints_are_busy(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let c = server.client();
    let mut polls = Vec::new();
    for i in 0..64 {
        let c = c.clone();
        polls.push(tokio::spawn(async move {
            c.poll(&format!("idle{i}"), "w", 1, Duration::from_secs(20), None)
                .await
        }));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut creators = Vec::new();
    for _ in 0..16 {
        let c = c.clone();
        let stop = stop.clone();
        creators.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 2_000 {
                let _ = c
                    .create(&CreateTask {
                        delay: Some("1h".into()),
                        ..CreateTask::new("load")
                    })
                    .await;
                n += 1;
            }
        }));
    }
    let http = sundial_cli::http_client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for _ in 0..20 {
        let r = http
            .get(format!("{}/healthz", server.url))
            .send()
            .await
            .expect("healthz answers under load");
        assert_eq!(r.status().as_u16(), 200);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for cr in creators {
        cr.await.unwrap();
    }
    drop(polls);
}

async fn sigterm_ends_waiting_polls_and_exits_cleanly(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let mut server = Server::start_on(&storage);
    let c = server.client();
    let t = c
        .create(&CreateTask {
            delay: Some("1h".into()),
            ..CreateTask::new("survivor")
        })
        .await
        .unwrap();
    let poller = {
        let c = c.clone();
        tokio::spawn(async move { c.poll("idle", "w", 1, Duration::from_secs(50), None).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = tokio::task::spawn_blocking(move || {
        let s = server.terminate(Duration::from_secs(30));
        (s, server)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "exit status {:?}", status.0);
    let polled = poller.await.unwrap();
    // The waiting poll was answered (empty) or its connection closed; either way it did not hang.
    if let Ok(p) = polled {
        assert!(p.tasks.is_empty());
    }
    // The data survives a restart.
    let server = Server::start_on(&storage);
    let got = server.client().get(&t.id.to_string()).await.unwrap();
    assert_eq!(got.state, StateView::Scheduled);
    assert_eq!(got.kind, "survivor");
}

/// Two tests per body: `<name>::embedded` and `<name>::postgres`.
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
    create_get_and_list_round_trip,
    long_poll_waits_delivers_when_due_and_complete_records_the_result,
    a_poll_records_the_completion_it_carries_before_it_takes,
    fail_retries_with_backoff_then_goes_dead,
    cancel_and_trigger,
    rejected_requests_store_nothing,
    batch_creates_in_order_and_reports_duplicates_per_item,
    list_paginates_newest_first_with_filters,
    health_metrics_and_openapi,
    healthz_answers_while_task_endpoints_are_busy,
    sigterm_ends_waiting_polls_and_exits_cleanly,
);
