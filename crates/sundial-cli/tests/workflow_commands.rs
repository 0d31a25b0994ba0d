//! The `sundial workflow` commands against a running server, on both stores: each body runs as
//! `<name>::embedded` and `<name>::postgres` (a fresh schema; skipped without
//! `SUNDIAL_TEST_DATABASE_URL`, see `common/pg.rs`).
//!
//! The first two run no workflow code (no worker registers a type), so they check what needs
//! none: a start creates a run whose first workflow task waits, signals and cancel requests are
//! recorded in its history, terminate closes it, the id reuse policies, listing and errors. The
//! last one adds a `RemoteWorker` in this process: what the CLI starts, signals and cancels runs
//! to its end (an activity, a durable sleep, a signal; a cancel during a wait).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{BIN, Backend, Server, Storage};
use serde_json::{Value, json};
use sundial_workflow::remote::{RemoteActivityContext, RemoteWorker};
use sundial_workflow::{ActivityError, RetryPolicy, WorkflowContext, WorkflowError};

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

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok_text(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", stderr(o));
    stdout(o)
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// Exit status 1 and every `needle` in stderr.
fn refused(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}", stdout(o));
    let err = stderr(o);
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err:?}");
    }
}

fn event_types(history: &Value) -> Vec<String> {
    history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

async fn start_signal_cancel_terminate(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);

    // Start: with an id (one with a '/', as child workflow ids have) and without one.
    let started = json_out(
        &sundial(
            &server,
            &[
                "workflow",
                "start",
                "order",
                "--id",
                "order/9",
                "--input",
                r#"{"amount": 5}"#,
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(started["id"], "order/9");
    assert_eq!(started["status"], "running");
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let text = ok_text(&sundial(&server, &["workflow", "start", "ship"]).await);
    assert!(
        text.starts_with("started ") && text.contains("running"),
        "{text}"
    );

    // A running id refuses another start.
    let again = sundial(&server, &["workflow", "start", "order", "--id", "order/9"]).await;
    refused(&again, &["409", "already_exists", &run_id]);

    // Get: the API's view, or a key/value listing.
    let got = json_out(&sundial(&server, &["workflow", "get", "order/9", "--json"]).await);
    assert_eq!(got["run_id"], run_id.as_str());
    assert_eq!(got["type"], "order");
    assert_eq!(got["status"], "running");
    assert_eq!(got["history_length"], 1);
    let text = ok_text(&sundial(&server, &["workflow", "get", "order/9"]).await);
    assert!(
        text.contains("order/9") && text.contains(&run_id) && text.contains("running"),
        "{text}"
    );

    // Signals are accepted and recorded, with their input.
    let text = ok_text(
        &sundial(
            &server,
            &[
                "workflow",
                "signal",
                "order/9",
                "paid",
                "--input",
                r#"{"ok": true}"#,
            ],
        )
        .await,
    );
    assert!(text.contains("signal paid sent to order/9"), "{text}");
    let accepted = json_out(
        &sundial(
            &server,
            &["workflow", "signal", "order/9", "note", "--json"],
        )
        .await,
    );
    assert_eq!(accepted["accepted"], true);
    let history = json_out(&sundial(&server, &["workflow", "history", "order/9", "--json"]).await);
    assert_eq!(history["workflow_id"], "order/9");
    assert_eq!(history["run_id"], run_id.as_str());
    assert_eq!(
        event_types(&history),
        ["workflow_started", "signal_received", "signal_received"]
    );
    assert_eq!(history["events"][0]["input"], json!({"amount": 5}));
    assert_eq!(history["events"][1]["name"], "paid");
    assert_eq!(history["events"][1]["input"], json!({"ok": true}));
    let text = ok_text(&sundial(&server, &["workflow", "history", "order/9"]).await);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains(&run_id), "{text}");
    assert!(
        lines[1].contains("SEQ") && lines[1].contains("TYPE"),
        "{text}"
    );
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[2].contains("workflow_started"), "{text}");
    assert!(
        lines[3].contains("signal_received") && lines[3].contains("paid"),
        "{text}"
    );

    // List: a table, JSON, filters, pages, and a bad filter refused by the server.
    let list = json_out(&sundial(&server, &["workflow", "ls", "--json"]).await);
    assert_eq!(list["workflows"].as_array().unwrap().len(), 2);
    let orders = json_out(
        &sundial(
            &server,
            &[
                "workflow", "ls", "--type", "order", "--status", "running", "--json",
            ],
        )
        .await,
    );
    let ids: Vec<&str> = orders["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["order/9"]);
    let text = ok_text(&sundial(&server, &["workflow", "ls"]).await);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("STATUS"));
    assert!(text.contains("order/9") && text.contains("ship"), "{text}");
    let paged = ok_text(&sundial(&server, &["workflow", "ls", "--limit", "1"]).await);
    assert!(paged.contains("next cursor: "), "{paged}");
    let bad = sundial(&server, &["workflow", "ls", "--status", "sleeping"]).await;
    refused(&bad, &["422", "invalid", "status"]);

    // Cancel is a request the workflow's code answers: recorded, the run still running here.
    let text = ok_text(
        &sundial(
            &server,
            &["workflow", "cancel", "order/9", "--reason", "customer"],
        )
        .await,
    );
    assert!(text.contains("cancel requested for order/9"), "{text}");
    let history = json_out(&sundial(&server, &["workflow", "history", "order/9", "--json"]).await);
    assert_eq!(
        event_types(&history).last().map(String::as_str),
        Some("cancel_requested")
    );

    // Terminate closes the run at once.
    let t = json_out(
        &sundial(
            &server,
            &[
                "workflow",
                "terminate",
                "order/9",
                "--reason",
                "operator",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(t["status"], "terminated");
    assert_eq!(t["error"], "operator");
    let text = ok_text(&sundial(&server, &["workflow", "get", "order/9"]).await);
    assert!(
        text.contains("terminated") && text.contains("operator") && text.contains("closed"),
        "{text}"
    );
    let got = json_out(&sundial(&server, &["workflow", "get", "order/9", "--json"]).await);
    assert!(got["closed_at"].is_string());
    let stopped = json_out(
        &sundial(
            &server,
            &["workflow", "ls", "--status", "terminated", "--json"],
        )
        .await,
    );
    assert_eq!(stopped["workflows"].as_array().unwrap().len(), 1);

    // A closed run takes no signal, cancel or terminate.
    for args in [
        &["workflow", "signal", "order/9", "paid"][..],
        &["workflow", "cancel", "order/9"][..],
        &["workflow", "terminate", "order/9"][..],
    ] {
        refused(&sundial(&server, args).await, &["409", "wrong_state"]);
    }

    // The id reuse policy decides whether a closed id starts again.
    let reject = sundial(
        &server,
        &[
            "workflow",
            "start",
            "order",
            "--id",
            "order/9",
            "--id-reuse",
            "reject_duplicate",
        ],
    )
    .await;
    refused(&reject, &["409", "already_exists"]);
    let bad_policy = sundial(
        &server,
        &[
            "workflow",
            "start",
            "order",
            "--id",
            "order/9",
            "--id-reuse",
            "sometimes",
        ],
    )
    .await;
    refused(&bad_policy, &["422", "id_reuse"]);
    let second = json_out(
        &sundial(
            &server,
            &[
                "workflow",
                "start",
                "order",
                "--id",
                "order/9",
                "--id-reuse",
                "allow_duplicate_failed_only",
                "--json",
            ],
        )
        .await,
    );
    assert_ne!(second["run_id"], run_id.as_str());
    let got = json_out(&sundial(&server, &["workflow", "get", "order/9", "--json"]).await);
    assert_eq!(got["run_id"], second["run_id"]);
    assert_eq!(got["status"], "running");
    assert_eq!(got["history_length"], 1);
}

async fn unknown_ids_and_bad_input_are_errors(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    for args in [
        &["workflow", "get", "nope"][..],
        &["workflow", "history", "nope"][..],
        &["workflow", "signal", "nope", "paid"][..],
        &["workflow", "cancel", "nope"][..],
        &["workflow", "terminate", "nope"][..],
    ] {
        let o = sundial(&server, args).await;
        refused(&o, &["error: 404 not_found: ", "\"nope\""]);
        assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
    }
    // With --json the error is the server's body, as for every command.
    let o = sundial(&server, &["workflow", "get", "nope", "--json"]).await;
    refused(&o, &[r#""code":"not_found""#]);
    assert!(stdout(&o).is_empty());
    let o = sundial(
        &server,
        &["workflow", "start", "order", "--input", "{not json"],
    )
    .await;
    refused(&o, &["--input is not JSON"]);
    let o = sundial(
        &server,
        &["workflow", "signal", "x", "paid", "--input", "{"],
    )
    .await;
    refused(&o, &["--input is not JSON"]);
    let empty = json_out(&sundial(&server, &["workflow", "ls", "--json"]).await);
    assert_eq!(empty["workflows"], json!([]));
    // Nothing was started by the refused commands.
    let o = sundial(&server, &["workflow", "ls"]).await;
    assert_eq!(ok_text(&o).lines().count(), 1);
    // No server there: a clear error, exit status 1.
    let o = tokio::process::Command::new(BIN)
        .args(["workflow", "get", "x", "--server", "http://127.0.0.1:1"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    refused(&o, &["cannot reach http://127.0.0.1:1"]);
}

/// activity `hello` -> durable sleep 1 s -> signal `go` (60 s timeout) -> result.
async fn greet(ctx: WorkflowContext, name: String) -> Result<Value, WorkflowError> {
    let greeting: String = ctx
        .activity("hello", &name)
        .retry(RetryPolicy::fixed(3, Duration::from_millis(200)))
        .timeout(Duration::from_secs(5))
        .await?;
    ctx.sleep(Duration::from_secs(1)).await?;
    let go: Option<String> = ctx.signal("go").timeout(Duration::from_secs(60)).await?;
    Ok(json!({"greeting": greeting, "signal": go}))
}

/// Polls `sundial workflow get ID --json` until `done` says yes (at most 60 s).
async fn wait_for(server: &Server, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..600 {
        let v = json_out(&sundial(server, &["workflow", "get", id, "--json"]).await);
        if done(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// How many events of type `event` the history of `id` holds.
async fn history_count(server: &Server, id: &str, event: &str) -> usize {
    let h = json_out(&sundial(server, &["workflow", "history", id, "--json"]).await);
    event_types(&h).iter().filter(|t| *t == event).count()
}

/// Waits until the history of `id` holds `n` events of type `event` (at most 60 s).
async fn wait_events(server: &Server, id: &str, event: &str, n: usize) {
    for _ in 0..600 {
        if history_count(server, id, event).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{id}: fewer than {n} {event} events after 60 s");
}

async fn a_remote_worker_runs_what_the_cli_starts(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let server = Server::start_on(&storage);
    let attempts = Arc::new(AtomicU32::new(0));
    let mut worker = RemoteWorker::new(&server.url);
    worker.register("greet", greet).unwrap();
    let counter = attempts.clone();
    worker
        .register_activity("hello", move |ctx: RemoteActivityContext, name: String| {
            let n = counter.clone();
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ActivityError>(format!("hello, {name} (attempt {})", ctx.attempt()))
            }
        })
        .unwrap();
    let running = tokio::spawn(worker.run());

    for id in ["g/1", "g/2"] {
        json_out(
            &sundial(
                &server,
                &[
                    "workflow", "start", "greet", "--id", id, "--input", r#""ada""#, "--json",
                ],
            )
            .await,
        );
    }
    // Both ran their activity, slept, and now wait for the signal: the second timer is the
    // signal's timeout (a cancel request before that would find no call to interrupt).
    for id in ["g/1", "g/2"] {
        wait_events(&server, id, "timer_started", 2).await;
    }
    ok_text(
        &sundial(
            &server,
            &["workflow", "signal", "g/1", "go", "--input", r#""now""#],
        )
        .await,
    );
    let done = wait_for(&server, "g/1", "completion", |v| v["status"] != "running").await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"],
        json!({"greeting": "hello, ada (attempt 1)", "signal": "now"})
    );
    let text = ok_text(&sundial(&server, &["workflow", "get", "g/1"]).await);
    assert!(
        text.contains("completed") && text.contains("hello, ada"),
        "{text}"
    );
    let h = json_out(&sundial(&server, &["workflow", "history", "g/1", "--json"]).await);
    let types = event_types(&h);
    for t in [
        "activity_completed",
        "timer_fired",
        "signal_received",
        "workflow_completed",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} missing from {types:?}");
    }

    // A cancel request interrupts the wait: the run ends cancelled.
    ok_text(
        &sundial(
            &server,
            &["workflow", "cancel", "g/2", "--reason", "no longer needed"],
        )
        .await,
    );
    let done = wait_for(&server, "g/2", "the cancel", |v| v["status"] != "running").await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one activity run per workflow"
    );
    let listed =
        json_out(&sundial(&server, &["workflow", "ls", "--type", "greet", "--json"]).await);
    let statuses: Vec<&str> = listed["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["completed", "cancelled"]);
    running.abort();
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
    start_signal_cancel_terminate,
    unknown_ids_and_bad_input_are_errors,
    a_remote_worker_runs_what_the_cli_starts,
);
