//! What a new user trips over in the CLI: one error format, scripts' `--quiet`, task flags the
//! API has, internal queues hidden, idempotent cancel, queue names with `/`, a worker command that
//! does not exist, and the schedule commands' tables and flags.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Output;
use std::time::Duration;

use common::{BIN, Server};
use serde_json::{Value, json};
use sundial_server::wire::{CreateTask, ExclusiveModeView, StateView};

async fn sundial(server: &Server, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("SUNDIAL_SERVER", &server.url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
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

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}{}", stderr(o), stdout(o));
    stdout(o)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_print_in_one_form_across_commands() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let cases: [&[&str]; 3] = [
        &["task", "get", "01890000-0000-7000-8000-000000000000"],
        &["schedule", "get", "nope"],
        &["workflow", "get", "nope"],
    ];
    for args in cases {
        let o = sundial(&server, args).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert!(err.starts_with("error: 404 not_found: "), "{args:?}: {err}");
    }
    let o = sundial(&server, &["schedule", "add", "k", "--cron", "0 25 * * *"]).await;
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.starts_with("error: 422 invalid: cron: "), "{err}");
    assert!(err.contains("0-23"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_add_sets_backoff_and_exclusive_and_quiet_prints_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let out = ok(&sundial(
        &server,
        &[
            "task",
            "add",
            "report.build",
            "--delay",
            "1h",
            "--backoff-initial",
            "2s",
            "--backoff-factor",
            "3",
            "--backoff-max",
            "1m",
            "--backoff-jitter",
            "0",
            "--exclusive",
            "reports",
            "--exclusive-mode",
            "skip",
            "--quiet",
        ],
    )
    .await);
    let id = out.trim();
    assert_eq!(out.lines().count(), 1, "{out}");
    let t = server.client().get(id).await.unwrap();
    assert_eq!(
        (
            t.backoff.initial.as_str(),
            t.backoff.factor,
            t.backoff.max.as_str(),
            t.backoff.jitter
        ),
        ("2s", 3.0, "1m", 0.0)
    );
    let ex = t.exclusive.unwrap();
    assert_eq!(
        (ex.key.as_str(), ex.mode),
        ("reports", ExclusiveModeView::Skip)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_queues_are_hidden_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let c = server.client();
    let mine = c.create(&CreateTask::new("mine")).await.unwrap();
    // A schedule's tick lives in `sundial.schedules`.
    ok(&sundial(
        &server,
        &["schedule", "add", "job", "--id", "s1", "--every", "1h"],
    )
    .await);

    let ls = ok(&sundial(&server, &["task", "ls"]).await);
    assert!(ls.contains(&mine.id.to_string()), "{ls}");
    assert!(!ls.contains("sundial.schedules"), "{ls}");
    let all = ok(&sundial(&server, &["task", "ls", "--all"]).await);
    assert!(all.contains("sundial.schedules"), "{all}");
    let named = ok(&sundial(&server, &["task", "ls", "--queue", "sundial.schedules"]).await);
    assert!(named.contains("sundial.schedules"), "{named}");

    // The API's default is the same.
    let page = c.list(&Default::default()).await.unwrap();
    assert!(page.tasks.iter().all(|t| !t.queue.starts_with("sundial.")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_cancelled_task_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let t = server
        .client()
        .create(&CreateTask {
            delay: Some("1h".into()),
            ..CreateTask::new("k")
        })
        .await
        .unwrap();
    let id = t.id.to_string();
    ok(&sundial(&server, &["task", "cancel", &id]).await);
    let again = ok(&sundial(&server, &["task", "cancel", &id, "--json"]).await);
    let v: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(v["state"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_polls_a_queue_whose_name_has_a_slash() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let t = server
        .client()
        .create(&CreateTask {
            queue: Some("team/b".into()),
            ..CreateTask::new("k")
        })
        .await
        .unwrap();
    let o = sundial(
        &server,
        &[
            "worker",
            "--queue",
            "team/b",
            "--wait",
            "1s",
            "--max-tasks",
            "1",
            "--",
            "true",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let done = server.client().get(&t.id.to_string()).await.unwrap();
    assert_eq!(done.state, StateView::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_refuses_a_command_that_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let t = server.client().create(&CreateTask::new("k")).await.unwrap();
    for (cmd, says) in [
        ("./no-such-script.sh", "does not exist"),
        ("no-such-program-anywhere", "not found on PATH"),
    ] {
        let o = sundial(&server, &["worker", "--queue", "default", "--", cmd]).await;
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
    // Nothing was taken.
    let still = server.client().get(&t.id.to_string()).await.unwrap();
    assert_eq!(still.attempt, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_commands_take_every_field_and_print_tables() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    ok(&sundial(
        &server,
        &[
            "schedule",
            "add",
            "report.build",
            "--id",
            "nightly-report",
            "--cron",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--dst-skipped",
            "skip",
            "--dst-repeated",
            "both",
            "--catchup-window",
            "10m",
            "--start-at",
            "2020-01-01T00:00:00Z",
            "--end-at",
            "2100-01-01T00:00:00Z",
            "--max-attempts",
            "2",
            "--timeout",
            "30s",
            "--queue",
            "reports",
            "--tag",
            "team:ops",
        ],
    )
    .await);
    let v: Value = serde_json::from_str(&ok(&sundial(
        &server,
        &["schedule", "get", "nightly-report", "--json"],
    )
    .await))
    .unwrap();
    assert_eq!(v["dst"], json!({"skipped": "skip", "repeated": "both"}));
    assert_eq!(v["catchup_window"], "10m");
    assert_eq!(v["start_at"], "2020-01-01T00:00:00Z");
    assert_eq!(v["task"]["max_attempts"], 2);
    assert_eq!(v["task"]["timeout"], "30s");
    assert_eq!(v["task"]["kind"], "report.build");
    assert_eq!(v["task"]["tags"], json!({"team": "ops"}));

    // update: only what is given changes.
    ok(&sundial(
        &server,
        &[
            "schedule",
            "update",
            "nightly-report",
            "--cron",
            "0 3 * * *",
            "--jitter",
            "5s",
        ],
    )
    .await);
    let v: Value = serde_json::from_str(&ok(&sundial(
        &server,
        &["schedule", "get", "nightly-report", "--json"],
    )
    .await))
    .unwrap();
    assert_eq!(
        (v["cron"].as_str(), v["jitter"].as_str()),
        (Some("0 3 * * *"), Some("5s"))
    );
    assert_eq!(v["task"]["queue"], "reports");

    // A schedule with a UUID id keeps the table's columns apart.
    ok(&sundial(&server, &["schedule", "add", "tick", "--every", "1h"]).await);
    let ls = ok(&sundial(&server, &["schedule", "ls"]).await);
    let header = ls.lines().next().unwrap();
    let spec_col = header.find("SPEC").unwrap();
    for line in ls.lines().skip(1) {
        assert_eq!(&line[spec_col - 2..spec_col], "  ", "{ls}");
    }

    let trig = ok(&sundial(&server, &["schedule", "trigger", "nightly-report"]).await);
    assert!(trig.starts_with("FIRE TIME"), "{trig}");
    assert!(trig.contains("fired") && trig.contains("trigger"), "{trig}");

    let bf = ok(&sundial(
        &server,
        &[
            "schedule",
            "backfill",
            "nightly-report",
            "--from",
            "2024-01-01T00:00:00Z",
            "--to",
            "2024-01-03T23:00:00Z",
        ],
    )
    .await);
    assert!(bf.starts_with("FIRE TIME"), "{bf}");
    // Every backfilled fire runs by default, though the schedule's overlap is `skip`.
    assert_eq!(bf.matches("backfill").count(), 3, "{bf}");
    assert!(!bf.contains("skipped"), "{bf}");
}

/// `sundial task ls | head -1`: the reader goes away before the command writes. The command ends
/// quietly with 141 (128 + SIGPIPE, what a shell reports for a tool SIGPIPE ended), no panic
/// message, whatever it was printing (a table, JSON, one line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_commands_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for i in 0..3 {
        ok(&sundial(&server, &["task", "add", &format!("k{i}"), "--quiet"]).await);
    }
    let cases: [&[&str]; 5] = [
        &["task", "ls"],
        &["task", "ls", "--json"],
        &["queue", "ls"],
        &["schedule", "ls"],
        &["task", "add", "k", "--quiet"],
    ];
    for args in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        // Spawned, not `output()`: tokio's `output()` would replace stdout with a pipe of its own.
        let child = tokio::process::Command::new(BIN)
            .args(args)
            .env("SUNDIAL_SERVER", &server.url)
            .env("RUST_LOG", "warn")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run sundial");
        let out = child.wait_with_output();
        let o = tokio::time::timeout(Duration::from_secs(60), out)
            .await
            .expect("the command finished")
            .expect("wait for sundial");
        assert_eq!(o.status.code(), Some(141), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
}
