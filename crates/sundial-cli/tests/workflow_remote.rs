//! Remote mode end to end: the real `sundial` binary keeps all workflow state; workflow code and
//! activities run in `RemoteWorker`s in this test process, over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::Server;
use serde_json::{Value, json};
use sundial_workflow::remote::{RemoteActivityContext, RemoteWorker};
use sundial_workflow::{ActivityError, RetryPolicy, WorkflowContext, WorkflowError};
use tokio::sync::mpsc;

/// activity `hello` -> durable sleep 1 s -> signal `go` (60 s timeout) -> result.
async fn greet(ctx: WorkflowContext, name: String) -> Result<Value, WorkflowError> {
    let greeting: String = ctx
        .activity("hello", &name)
        .retry(RetryPolicy::fixed(3, Duration::from_millis(200)))
        .timeout(Duration::from_secs(2))
        .await?;
    ctx.sleep(Duration::from_secs(1)).await?;
    let go: Option<String> = ctx.signal("go").timeout(Duration::from_secs(60)).await?;
    Ok(json!({"greeting": greeting, "signal": go}))
}

fn worker(url: &str, hello_attempts: Arc<AtomicU32>) -> RemoteWorker {
    let mut w = RemoteWorker::new(url);
    w.register("greet", greet).unwrap();
    w.register_activity("hello", move |ctx: RemoteActivityContext, name: String| {
        let n = hello_attempts.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ActivityError>(format!("hello, {name} (attempt {})", ctx.attempt()))
        }
    })
    .unwrap();
    w
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let resp = sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get(url: &str) -> Value {
    sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

/// Waits until the history holds an event of type `t` (up to about two minutes: a claim lost
/// with a killed worker waits for its lease).
async fn wait_for_event(url: &str, id: &str, t: &str) {
    for _ in 0..2_400 {
        if history_types(url, id).await.iter().any(|x| x == t) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {t} in the history of {id}");
}

/// Waits until `f` says yes about the workflow's view (up to about two minutes).
async fn wait_for(url: &str, id: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let mut tries = 0;
    loop {
        let v = get(&format!("{url}/v1/workflows/{id}")).await;
        if f(&v) {
            return v;
        }
        tries += 1;
        assert!(tries < 2_400, "timed out waiting for {what}: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn history_types(url: &str, id: &str) -> Vec<String> {
    let h = get(&format!("{url}/v1/workflows/{id}/history")).await;
    h["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remote_worker_runs_activity_sleep_and_signal() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.clone();

    // Started before any worker: the server has no code for `greet`, so the run waits.
    let (status, started) = post(
        &format!("{url}/v1/workflows"),
        json!({"type": "greet", "id": "g-1", "input": "ada"}),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(history_types(&url, "g-1").await, vec!["workflow_started"]);

    let attempts = Arc::new(AtomicU32::new(0));
    let running = tokio::spawn(worker(&url, attempts.clone()).run());

    // The worker ran the first workflow task, the activity, and armed the timer.
    wait_for_event(&url, "g-1", "timer_started").await;
    let (status, body) = post(
        &format!("{url}/v1/workflows/g-1/signals/go"),
        json!({"input": "now"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");

    let done = wait_for(&url, "g-1", "completion", |v| v["status"] != "running").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"],
        json!({"greeting": "hello, ada (attempt 1)", "signal": "now"})
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let types = history_types(&url, "g-1").await;
    for t in [
        "activity_scheduled",
        "activity_completed",
        "timer_fired",
        "signal_received",
        "workflow_completed",
    ] {
        assert!(types.contains(&t.to_string()), "{t} missing from {types:?}");
    }
    running.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_worker_continues_a_run_the_first_one_started() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.clone();

    // Worker A runs the first workflow task, then hangs in the activity and dies mid-attempt.
    let (claimed_tx, mut claimed_rx) = mpsc::unbounded_channel::<u32>();
    let mut a = RemoteWorker::new(&url).worker_name("worker-a");
    a.register("greet", greet).unwrap();
    a.register_activity("hello", move |ctx: RemoteActivityContext, _name: String| {
        let tx = claimed_tx.clone();
        async move {
            let _ = tx.send(ctx.attempt());
            std::future::pending::<()>().await;
            Ok::<String, ActivityError>(String::new())
        }
    })
    .unwrap();
    let worker_a = tokio::spawn(a.run());

    let (status, started) = post(
        &format!("{url}/v1/workflows"),
        json!({"type": "greet", "id": "g-2", "input": "bob"}),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    let attempt = tokio::time::timeout(Duration::from_secs(30), claimed_rx.recv())
        .await
        .expect("worker A claimed the activity")
        .expect("channel open");
    assert_eq!(attempt, 1);
    worker_a.abort(); // killed mid-activity: its attempt's lease (2 s) must expire
    let _ = worker_a.await;

    // Worker B knows nothing of the run: it continues it from the server's history.
    let attempts = Arc::new(AtomicU32::new(0));
    let worker_b = tokio::spawn(worker(&url, attempts.clone()).worker_name("worker-b").run());
    wait_for_event(&url, "g-2", "timer_started").await;
    let (status, body) = post(
        &format!("{url}/v1/workflows/g-2/signals/go"),
        json!({"input": "b"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let done = wait_for(&url, "g-2", "completion", |v| v["status"] != "running").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"],
        json!({"greeting": "hello, bob (attempt 2)", "signal": "b"})
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    worker_b.abort();
}

/// A worker running changed code for an old run reports the replay's non-determinism, and the
/// server fails the run with it (as in library mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_with_changed_code_fails_the_run_as_non_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.clone();

    let worker_a = tokio::spawn(worker(&url, Arc::new(AtomicU32::new(0))).run());
    let (status, started) = post(
        &format!("{url}/v1/workflows"),
        json!({"type": "greet", "id": "g-3", "input": "cy"}),
    )
    .await;
    assert_eq!(status, 201, "{started}");
    wait_for_event(&url, "g-3", "timer_started").await;
    worker_a.abort();
    let _ = worker_a.await;

    // The new code calls another activity first.
    let mut b = RemoteWorker::new(&url);
    b.register("greet", |ctx: WorkflowContext, name: String| async move {
        let v: String = ctx.activity("bonjour", &name).await?;
        Ok::<_, WorkflowError>(v)
    })
    .unwrap();
    let worker_b = tokio::spawn(b.run());
    let (status, body) = post(
        &format!("{url}/v1/workflows/g-3/signals/go"),
        json!({"input": "x"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let done = wait_for(&url, "g-3", "the failure", |v| v["status"] != "running").await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = done["error"].as_str().unwrap_or_default();
    assert!(error.contains("non-deterministic"), "{error}");
    worker_b.abort();
}

/// Many runs at once through one worker: every one completes with its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_worker_serves_many_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.clone();
    let attempts = Arc::new(AtomicU32::new(0));
    let running = tokio::spawn(worker(&url, attempts.clone()).run());
    let n = 25;
    for i in 0..n {
        let (status, body) = post(
            &format!("{url}/v1/workflows"),
            json!({"type": "greet", "id": format!("m-{i}"), "input": format!("n{i}")}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    for i in 0..n {
        // Signals arriving before the workflow waits are buffered.
        let (status, body) = post(
            &format!("{url}/v1/workflows/m-{i}/signals/go"),
            json!({"input": format!("s{i}")}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    for i in 0..n {
        let id = format!("m-{i}");
        let done = wait_for(&url, &id, "completion", |v| v["status"] != "running").await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(
            done["result"],
            json!({"greeting": format!("hello, n{i} (attempt 1)"), "signal": format!("s{i}")})
        );
    }
    assert_eq!(attempts.load(Ordering::SeqCst), n);
    running.abort();
}

/// A worker of one namespace serves that namespace's runs and leaves another namespace's alone:
/// the same workflow id in `acme` and in `default`, one worker for `acme`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespaced_worker_serves_its_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.clone();
    let (status, body) = post(&format!("{url}/v1/namespaces"), json!({"name": "acme"})).await;
    assert_eq!(status, 201, "{body}");
    let acme = format!("{url}/v1/namespaces/acme");
    for start in [format!("{acme}/workflows"), format!("{url}/v1/workflows")] {
        let (status, body) = post(
            &start,
            json!({"type": "greet", "id": "g-1", "input": "ada"}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let attempts = Arc::new(AtomicU32::new(0));
    let w = worker(&url, attempts.clone()).namespace("acme").unwrap();
    let running = tokio::spawn(w.run());
    let (status, body) = post(
        &format!("{acme}/workflows/g-1/signals/go"),
        json!({"input": "now"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let mut tries = 0;
    let done = loop {
        let v = get(&format!("{acme}/workflows/g-1")).await;
        if v["status"] != "running" {
            break v;
        }
        tries += 1;
        assert!(tries < 2_400, "acme's run did not finish: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    // The default namespace's run of the same id was never picked up.
    assert_eq!(history_types(&url, "g-1").await, vec!["workflow_started"]);
    running.abort();
}
