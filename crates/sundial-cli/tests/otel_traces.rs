//! Traces end to end: `sundial server --otlp-endpoint` exports its spans over OTLP/HTTP to a
//! receiver this test runs on loopback (the protobuf decoded with opentelemetry-proto), and one
//! trace follows a task from the create request that sent a `traceparent` through its fire, its
//! delivery (to a remote worker's poll, or to a push receiver by the in-process push handler)
//! and its completion, each span a child of the step before; `sundial worker` hands the
//! delivery's context to its command and sends it with the result.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use common::{BIN, Launch, Server, now_ms};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const WAITING_TRACE: &str = "9d2c4f0b7e6a41c3b5d8e1f20a3b4c5d";
const PUSH_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PUSH_CALLER_SPAN: &str = "b7ad6b7169203331";
const WORKER_SPAN: &str = "1111222233334444";
const CLI_OK_TRACE: &str = "5ce0e9a56015fec5aadfa328ae398115";
const CLI_FAIL_TRACE: &str = "6e0c63257de34c92bf9efcd03927272e";

#[derive(Debug, Clone)]
struct Span {
    trace: String,
    id: String,
    parent: String,
    name: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The loopback OTLP/HTTP receiver: every span of every export request.
async fn receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    async fn traces(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> &'static str {
        let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
        let mut out = spans.lock().unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Span {
                        trace: hex(&s.trace_id),
                        id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        name: s.name,
                    });
                }
            }
        }
        ""
    }
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(traces))
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, spans)
}

/// The headers of each call a push receiver got.
type Calls = Arc<Mutex<Vec<HashMap<String, String>>>>;

/// A push receiver recording each request's headers.
async fn sink() -> (String, Calls) {
    let calls: Calls = Arc::default();
    async fn hook(State(calls): State<Calls>, headers: HeaderMap) -> &'static str {
        calls.lock().unwrap().push(
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
        );
        "ok"
    }
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, calls)
}

/// `00-<trace>-<span>-01` split into (trace, span).
fn parts(traceparent: &str) -> (String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    assert_eq!(p[0], "00");
    (p[1].to_string(), p[2].to_string())
}

fn one<'a>(spans: &'a [Span], trace: &str, name: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace == trace && s.name == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} span in trace {trace}; spans: {spans:#?}"
    );
    found[0]
}

async fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(what, f, String::new).await
}

/// [`wait_for`], with `state` describing what was seen when it times out.
async fn wait_for_or<T>(
    what: &str,
    mut f: impl FnMut() -> Option<T>,
    state: impl Fn() -> String,
) -> T {
    let deadline = now_ms() + 15_000;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            now_ms() < deadline,
            "timed out waiting for {what}; {}",
            state()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `GET /v1/tasks/{id}`.
async fn get_task(http: &reqwest::Client, url: &str, id: &str) -> Value {
    http.get(format!("{url}/v1/tasks/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits (bounded) until the task `id` is in `state`.
async fn wait_for_state(http: &reqwest::Client, url: &str, id: &str, state: &str) {
    let deadline = now_ms() + 15_000;
    loop {
        let t = get_task(http, url, id).await;
        if t["state"] == state {
            return;
        }
        assert!(now_ms() < deadline, "task {id} did not become {state}: {t}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// When a worker task's poll comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerPoll {
    /// After the task is `ready` (the poll claims it from the ready tasks).
    AfterReady,
    /// Before the task is due (the poll waits; the shard loop starts the task for it).
    Waiting,
}

/// The span ids a worker task's answers carried.
struct WorkerSpans {
    create_span: String,
    deliver_span: String,
}

/// Creates a worker task in `trace` (the caller's span [`CALLER_SPAN`]), takes it with a poll
/// that comes as `when` says, and completes it from the worker's span [`WORKER_SPAN`].
async fn worker_task(
    http: &reqwest::Client,
    url: &str,
    trace: &str,
    when: WorkerPoll,
) -> WorkerSpans {
    let queue = format!("traced-{}", &trace[..8]);
    let mut body = json!({"kind": "traced", "queue": queue});
    if when == WorkerPoll::Waiting {
        body["delay"] = json!("1500ms");
    }
    let created: Value = http
        .post(format!("{url}/v1/tasks"))
        .header("traceparent", format!("00-{trace}-{CALLER_SPAN}-01"))
        .header("tracestate", "congo=t61rcWkgMzE")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stored = created["traceparent"].as_str().expect("stored traceparent");
    let (stored_trace, create_span) = parts(stored);
    assert_eq!(stored_trace, trace, "the caller's trace goes on");
    assert_ne!(
        create_span, CALLER_SPAN,
        "the create request's own span is stored"
    );
    assert_eq!(created["tracestate"], "congo=t61rcWkgMzE");
    let id = created["id"].as_str().unwrap().to_string();
    if when == WorkerPoll::AfterReady {
        wait_for_state(http, url, &id, "ready").await;
    }

    // The remote worker's poll answer carries the context of its delivery.
    let polled: Value = http
        .post(format!("{url}/v1/queues/{queue}/poll"))
        .json(&json!({"worker": "w1", "wait": "10s"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = &polled["tasks"][0];
    assert_eq!(task["id"], id.as_str(), "{polled}");
    let (poll_trace, deliver_span) =
        parts(task["traceparent"].as_str().expect("polled traceparent"));
    assert_eq!(poll_trace, trace);
    assert_ne!(deliver_span, create_span);
    assert_eq!(task["tracestate"], "congo=t61rcWkgMzE");
    // The worker ran it in a span of its own (a child of the delivery) and completes from there.
    let done = http
        .post(format!("{url}/v1/tasks/{id}/complete"))
        .header("traceparent", format!("00-{trace}-{WORKER_SPAN}-01"))
        .json(&json!({"execution_id": task["execution_id"]}))
        .send()
        .await
        .unwrap();
    assert!(done.status().is_success(), "{:?}", done.text().await);
    WorkerSpans {
        create_span,
        deliver_span,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_task_from_its_create_to_its_completion() {
    let (otlp, spans) = receiver().await;
    let (sink_addr, calls) = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::spawn(
        vec![
            "--data-dir".into(),
            dir.path().into(),
            "--otlp-endpoint".into(),
            otlp.clone().into(),
            "--push-allow".into(),
            sink_addr.clone().into(),
        ],
        &Launch::default(),
        dir.path(),
    );
    let http = sundial_cli::http_client_builder().build().unwrap();
    let url = server.url.clone();

    // A worker task that is ready before its poll comes, and one whose poll already waits when
    // it comes due (the shard loop starts it for that poll): both fire and deliver in the trace.
    let ready = worker_task(&http, &url, CALLER_TRACE, WorkerPoll::AfterReady).await;
    let waiting = worker_task(&http, &url, WAITING_TRACE, WorkerPoll::Waiting).await;

    // A push task: the in-process push handler calls the receiver within the trace.
    let pushed: Value = http
        .post(format!("{url}/v1/tasks"))
        .header(
            "traceparent",
            format!("00-{PUSH_TRACE}-{PUSH_CALLER_SPAN}-01"),
        )
        .json(&json!({"kind": "hook", "target": {"url": format!("http://{sink_addr}/hook")}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (_, push_create_span) = parts(pushed["traceparent"].as_str().unwrap());
    let push_id = pushed["id"].as_str().unwrap().to_string();
    let headers = wait_for("the push call", || calls.lock().unwrap().first().cloned()).await;
    let (push_trace, push_parent) = parts(&headers["traceparent"]);
    assert_eq!(
        push_trace, PUSH_TRACE,
        "the receiver is called within the trace"
    );
    wait_for_state(&http, &url, &push_id, "succeeded").await;

    // A clean stop exports what is still queued.
    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let spans = wait_for_or(
        "the spans",
        || {
            let s = spans.lock().unwrap().clone();
            let names = |t: &str| s.iter().filter(|x| x.trace == t).count();
            (names(CALLER_TRACE) >= 4 && names(WAITING_TRACE) >= 4 && names(PUSH_TRACE) >= 4)
                .then_some(s)
        },
        || format!("spans received: {:#?}", spans.lock().unwrap()),
    )
    .await;

    // The worker tasks: create ← caller; fire and deliver ← create; complete ← the worker's span.
    for (trace, seen) in [(CALLER_TRACE, &ready), (WAITING_TRACE, &waiting)] {
        let create = one(&spans, trace, "sundial.task.create");
        assert_eq!(create.parent, CALLER_SPAN);
        assert_eq!(create.id, seen.create_span);
        let fire = one(&spans, trace, "sundial.task.fire");
        assert_eq!(fire.parent, seen.create_span);
        let deliver = one(&spans, trace, "sundial.task.deliver");
        assert_eq!(deliver.parent, seen.create_span);
        assert_eq!(
            deliver.id, seen.deliver_span,
            "the worker got the delivery's context"
        );
        let complete = one(&spans, trace, "sundial.task.complete");
        assert_eq!(complete.parent, WORKER_SPAN);
    }

    // The push task: create ← caller; fire ← create; run ← fire; the call and the result ← run.
    let create = one(&spans, PUSH_TRACE, "sundial.task.create");
    assert_eq!(create.parent, PUSH_CALLER_SPAN);
    assert_eq!(create.id, push_create_span);
    let fire = one(&spans, PUSH_TRACE, "sundial.task.fire");
    assert_eq!(fire.parent, create.id);
    let run = one(&spans, PUSH_TRACE, "sundial.task.run");
    assert_eq!(run.parent, fire.id);
    assert_eq!(push_parent, run.id, "the receiver's parent is the run span");
    let complete = one(&spans, PUSH_TRACE, "sundial.task.complete");
    assert_eq!(complete.parent, run.id);
    for s in spans.iter().filter(|s| s.name.starts_with("sundial.task.")) {
        assert!(
            [CALLER_TRACE, WAITING_TRACE, PUSH_TRACE].contains(&s.trace.as_str()),
            "a task span outside the three traces: {s:?}"
        );
    }
}

/// Runs `sundial worker` on `queue` for `tasks` tasks. Its command prints the `TRACEPARENT` it
/// was given (`unset` for none) and fails for a kind other than `ok`; the worker itself runs
/// with a `TRACEPARENT` of its own, which must reach no command.
async fn cli_worker(url: &str, queue: &str, tasks: u32) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(BIN)
            .args(["worker", "--queue", queue, "--wait", "1s", "--max-tasks"])
            .arg(tasks.to_string())
            .args(["--", "sh", "-c"])
            .arg(r#"printf %s "${TRACEPARENT-unset}"; [ "$SUNDIAL_TASK_KIND" = ok ]"#)
            .env("SUNDIAL_SERVER", url)
            .env("RUST_LOG", "warn")
            .env(
                "TRACEPARENT",
                format!("00-{PUSH_TRACE}-{PUSH_CALLER_SPAN}-01"),
            )
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the worker finished")
    .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `sundial worker`: the command gets the delivery's context as `TRACEPARENT`, and the worker's
/// complete or fail is the delivery's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_worker_runs_its_command_in_the_delivery_and_reports_from_it() {
    let (otlp, spans) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::spawn(
        vec![
            "--data-dir".into(),
            dir.path().into(),
            "--otlp-endpoint".into(),
            otlp.into(),
        ],
        &Launch::default(),
        dir.path(),
    );
    let http = sundial_cli::http_client_builder().build().unwrap();
    let url = server.url.clone();
    let create = |kind: &'static str, trace: Option<&'static str>| {
        let mut req = http
            .post(format!("{url}/v1/tasks"))
            .json(&json!({"kind": kind, "queue": "cli", "max_attempts": 1}));
        if let Some(t) = trace {
            req = req.header("traceparent", format!("00-{t}-{CALLER_SPAN}-01"));
        }
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["id"].as_str().unwrap().to_string()
        }
    };
    let ok = create("ok", Some(CLI_OK_TRACE)).await;
    let bad = create("bad", Some(CLI_FAIL_TRACE)).await;
    let plain = create("ok", None).await;

    cli_worker(&url, "cli", 3).await;

    let get = |id: String| {
        let req = http.get(format!("{url}/v1/tasks/{id}"));
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let ok = get(ok).await;
    assert_eq!(ok["state"], "succeeded", "{ok}");
    let (seen_trace, seen_span) = parts(ok["result"].as_str().expect("the command's TRACEPARENT"));
    assert_eq!(seen_trace, CLI_OK_TRACE);
    assert_eq!(get(bad).await["state"], "dead");
    // With traces exported a task created without a context starts a trace of its own: its
    // command gets that one, never the worker's.
    let plain = get(plain).await;
    let (own, _) = parts(plain["traceparent"].as_str().unwrap());
    let (given, _) = parts(plain["result"].as_str().unwrap());
    assert_eq!(given, own, "{plain}");

    let status = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let spans = wait_for("the spans", || {
        let s = spans.lock().unwrap().clone();
        let has = |t: &str, n: &str| s.iter().any(|x| x.trace == t && x.name == n);
        (has(CLI_OK_TRACE, "sundial.task.complete") && has(CLI_FAIL_TRACE, "sundial.task.fail"))
            .then_some(s)
    })
    .await;
    let deliver = one(&spans, CLI_OK_TRACE, "sundial.task.deliver");
    assert_eq!(
        seen_span, deliver.id,
        "the command got the delivery's context"
    );
    let complete = one(&spans, CLI_OK_TRACE, "sundial.task.complete");
    assert_eq!(
        complete.parent, deliver.id,
        "the complete is the delivery's child"
    );
    let deliver = one(&spans, CLI_FAIL_TRACE, "sundial.task.deliver");
    let fail = one(&spans, CLI_FAIL_TRACE, "sundial.task.fail");
    assert_eq!(fail.parent, deliver.id, "the fail is the delivery's child");
}

/// Without `--otlp-endpoint` nothing is exported, and the caller's context is stored and handed
/// on unchanged; a malformed `traceparent` is ignored (the task is created without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_the_context_passes_through_and_bad_headers_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let http = sundial_cli::http_client_builder().build().unwrap();
    let url = &server.url;
    let sent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let created: Value = http
        .post(format!("{url}/v1/tasks"))
        .header("traceparent", &sent)
        .json(&json!({"kind": "k", "queue": "plain"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(created["traceparent"], sent.as_str());
    assert!(created.get("tracestate").is_none());
    let polled: Value = http
        .post(format!("{url}/v1/queues/plain/poll"))
        .json(&json!({"worker": "w", "wait": "5s"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(polled["tasks"][0]["traceparent"], sent.as_str());

    // `sundial worker` hands a traced task's context to its command unchanged, and none of its
    // own to an untraced task's.
    let mut ids = Vec::new();
    for trace in [Some(sent.as_str()), None] {
        let mut req = http
            .post(format!("{url}/v1/tasks"))
            .json(&json!({"kind": "ok", "queue": "plain-cli"}));
        if let Some(t) = trace {
            req = req.header("traceparent", t);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    cli_worker(url, "plain-cli", 2).await;
    let mut results = Vec::new();
    for id in &ids {
        let t = get_task(&http, url, id).await;
        results.push(t["result"].clone());
    }
    assert_eq!(results, [json!(sent), json!("unset")]);

    for bad in [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "garbage",
    ] {
        let resp = http
            .post(format!("{url}/v1/tasks:batch"))
            .header("traceparent", bad)
            .header("tracestate", "a=b")
            .json(&json!({"tasks": [{"kind": "k", "queue": "bad"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            201,
            "a malformed traceparent never fails a create"
        );
        let body: Value = resp.json().await.unwrap();
        let id = body["results"][0]["id"].as_str().unwrap();
        let t: Value = http
            .get(format!("{url}/v1/tasks/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(t.get("traceparent").is_none(), "{bad}: {t}");
        assert!(t.get("tracestate").is_none(), "{bad}: {t}");
    }
}
