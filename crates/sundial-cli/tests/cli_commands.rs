//! The `sundial task` and `sundial worker` commands against a running server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::process::Output;
use std::time::Duration;

use common::{BIN, Server, now_ms};
use serde_json::{Value, json};
use sundial_server::wire::{CreateTask, StateView};

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

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_commands_add_get_ls_cancel_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());

    let added = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "email.send",
                "--queue",
                "mail",
                "--key",
                "order-9",
                "--payload",
                r#"{"to":"x@example.com"}"#,
                "--delay",
                "1h",
                "--json",
            ],
        )
        .await,
    );
    let id = added["id"].as_str().unwrap().to_string();
    assert_eq!(added["state"], "scheduled");
    assert_eq!(added["payload"], json!({"to": "x@example.com"}));

    // Human output: a key/value listing for one task, a table for many.
    let got = sundial(&server, &["task", "get", &id]).await;
    assert!(got.status.success(), "{}", stderr(&got));
    let text = stdout(&got);
    assert!(text.contains(&id) && text.contains("email.send") && text.contains("scheduled"));
    assert!(text.contains("order-9"), "{text}");

    let other = json_out(
        &sundial(
            &server,
            &[
                "task",
                "add",
                "report",
                "--at",
                "2099-01-01T00:00:00Z",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(other["run_at"], "2099-01-01T00:00:00Z");
    let ls = sundial(&server, &["task", "ls"]).await;
    assert!(ls.status.success());
    let lines: Vec<String> = stdout(&ls).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("STATE"));
    assert!(lines[1].contains("report"), "newest first: {lines:?}");
    assert!(lines[2].contains("email.send"));
    let page = json_out(&sundial(&server, &["task", "ls", "--queue", "mail", "--json"]).await);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let paged = sundial(&server, &["task", "ls", "--limit", "1"]).await;
    assert!(
        stdout(&paged).contains("next cursor: "),
        "{}",
        stdout(&paged)
    );

    // A duplicate key is refused with the server's code and the holder's id, exit status 1.
    let dup = sundial(
        &server,
        &[
            "task",
            "add",
            "email.send",
            "--queue",
            "mail",
            "--key",
            "order-9",
        ],
    )
    .await;
    assert_eq!(dup.status.code(), Some(1));
    let err = stderr(&dup);
    assert!(
        err.contains("409") && err.contains("already_exists") && err.contains(&id),
        "{err}"
    );

    let trig = json_out(&sundial(&server, &["task", "trigger", &id, "--json"]).await);
    assert!(common::rfc3339_ms(trig["run_at"].as_str().unwrap()) <= now_ms());
    let other_id = other["id"].as_str().unwrap();
    let cancelled = json_out(&sundial(&server, &["task", "cancel", other_id, "--json"]).await);
    assert_eq!(cancelled["state"], "cancelled");
    // Cancel is idempotent; triggering a cancelled task is refused with `wrong_state`.
    let again = sundial(&server, &["task", "cancel", other_id]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let trig_cancelled = sundial(&server, &["task", "trigger", other_id]).await;
    assert_eq!(trig_cancelled.status.code(), Some(1));
    assert!(
        stderr(&trig_cancelled).contains("wrong_state"),
        "{}",
        stderr(&trig_cancelled)
    );

    // Bad input is refused by the server (422), not silently defaulted.
    let bad = sundial(&server, &["task", "add", "k", "--delay", "-5s"]).await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("422"), "{}", stderr(&bad));
    let missing = sundial(
        &server,
        &["task", "get", "01890000-0000-7000-8000-000000000000"],
    )
    .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("404"));
    assert_eq!(common::count(&server.client()).await, 2);
}

fn worker_cmd(
    server: &Server,
    queue: &str,
    extra: &[&str],
    command: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["worker", "--queue", queue, "--wait", "1s"])
        .args(extra)
        .arg("--")
        .args(command)
        .env("SUNDIAL_SERVER", &server.url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    cmd
}

async fn finish(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the worker finished")
        .expect("run the worker")
}

async fn wait_state(server: &Server, id: &str, state: StateView) -> sundial_server::wire::TaskView {
    let c = server.client();
    let give_up = now_ms() + 60_000;
    loop {
        let t = c.get(id).await.unwrap();
        if t.state == state {
            return t;
        }
        assert!(now_ms() < give_up, "task stayed {:?}", t.state);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_runs_the_command_once_per_task_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let c = server.client();
    let mut ids = Vec::new();
    for i in 0..3 {
        let t = c
            .create(&CreateTask {
                queue: Some("shell".into()),
                payload: Some(json!({"i": i})),
                ..CreateTask::new("echo")
            })
            .await
            .unwrap();
        ids.push(t.id.to_string());
    }
    let script = format!(
        r#"cat > "{dir}/$SUNDIAL_TASK_ID.json"; echo "$SUNDIAL_EXECUTION_ID $SUNDIAL_ATTEMPT" > "{dir}/$SUNDIAL_TASK_ID.env"; echo '{{"ok": true}}'"#,
        dir = out.path().display()
    );
    let o = finish(worker_cmd(
        &server,
        "shell",
        &["--max-tasks", "3", "--concurrency", "2"],
        &["sh", "-c", &script],
    ))
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    for (i, id) in ids.iter().enumerate() {
        let t = wait_state(&server, id, StateView::Succeeded).await;
        assert_eq!(t.result, Some(json!({"ok": true})));
        let input: Value =
            serde_json::from_slice(&std::fs::read(out.path().join(format!("{id}.json"))).unwrap())
                .unwrap();
        assert_eq!(input["id"], id.as_str());
        assert_eq!(input["payload"], json!({"i": i}));
        assert_eq!(input["kind"], "echo");
        let env = std::fs::read_to_string(out.path().join(format!("{id}.env"))).unwrap();
        assert_eq!(env.trim(), format!("{} 1", t.execution_id.unwrap()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_fails_with_the_tail_of_stderr_and_the_task_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let c = server.client();
    let t = c
        .create(&CreateTask {
            queue: Some("flaky".into()),
            max_attempts: Some(2),
            backoff: Some(sundial_server::wire::BackoffSpec {
                initial: Some("200ms".into()),
                factor: Some(1.0),
                max: Some("200ms".into()),
                jitter: Some(0.0),
            }),
            ..CreateTask::new("fails")
        })
        .await
        .unwrap();
    let script =
        r#"echo "noise that scrolls away" >&2; echo "attempt $SUNDIAL_ATTEMPT broke" >&2; exit 3"#;
    let o = finish(worker_cmd(
        &server,
        "flaky",
        &["--max-tasks", "2"],
        &["sh", "-c", script],
    ))
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let dead = wait_state(&server, &t.id.to_string(), StateView::Dead).await;
    assert_eq!(dead.attempt, 2);
    let err = dead.last_error.unwrap();
    assert!(
        err.contains("exit code 3") && err.contains("attempt 2 broke"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stops_the_command_when_the_task_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let marker_dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let c = server.client();
    // A six-second timeout makes the worker heartbeat every two seconds.
    let t = c
        .create(&CreateTask {
            queue: Some("long".into()),
            timeout: Some("6s".into()),
            ..CreateTask::new("sleepy")
        })
        .await
        .unwrap();
    let marker = marker_dir.path().join("finished");
    let script = format!("sleep 0.5; sleep 30; touch {}", marker.display());
    let worker = worker_cmd(
        &server,
        "long",
        &["--max-tasks", "1"],
        &["sh", "-c", &script],
    );
    let run = tokio::spawn(finish(worker));
    wait_state(&server, &t.id.to_string(), StateView::Running).await;
    c.cancel(&t.id.to_string()).await.unwrap();
    // The worker's next heartbeat gets 409: it kills the command and exits (--max-tasks 1)
    // long before the command would have finished.
    let o = run.await.unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no longer ours; stopping the command"),
        "{}",
        stderr(&o)
    );
    assert!(!marker.exists());
    let after = c.get(&t.id.to_string()).await.unwrap();
    assert_eq!(after.state, StateView::Cancelled);
    assert_eq!(after.result, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_kills_a_command_past_the_task_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let c = server.client();
    let t = c
        .create(&CreateTask {
            queue: Some("slow".into()),
            timeout: Some("2s".into()),
            max_attempts: Some(1),
            ..CreateTask::new("slow")
        })
        .await
        .unwrap();
    let o = finish(worker_cmd(
        &server,
        "slow",
        &["--max-tasks", "1"],
        &["sleep", "30"],
    ))
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let dead = wait_state(&server, &t.id.to_string(), StateView::Dead).await;
    assert!(dead.last_error.unwrap().contains("timeout"));
}

/// `sundial push secret …` acts on the namespace `--namespace` names: each namespace lists its
/// own secrets, and another namespace's secret cannot be revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_secrets_follow_the_namespace_flag() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let out = sundial(&server, &["namespace", "add", "acme"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let default = json_out(&sundial(&server, &["push", "secret", "add", "--json"]).await);
    let acme = json_out(
        &sundial(
            &server,
            &["push", "secret", "add", "--namespace", "acme", "--json"],
        )
        .await,
    );
    let ids = |v: &Value| -> Vec<Value> {
        v["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].clone())
            .collect()
    };
    let listed = json_out(&sundial(&server, &["push", "secret", "ls", "--json"]).await);
    assert_eq!(ids(&listed), vec![default["id"].clone()]);
    let listed = json_out(
        &sundial(
            &server,
            &["push", "secret", "ls", "--namespace", "acme", "--json"],
        )
        .await,
    );
    assert_eq!(ids(&listed), vec![acme["id"].clone()]);
    let acme_id = acme["id"].as_str().unwrap();
    let out = sundial(&server, &["push", "secret", "revoke", acme_id]).await;
    assert!(!out.status.success(), "another namespace's secret");
    let out = sundial(
        &server,
        &["push", "secret", "revoke", acme_id, "--namespace", "acme"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_flag_and_env_choose_where_commands_act() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let out = sundial(&server, &["namespace", "add", "acme"]).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let add = |ns: Option<&'static str>| {
        let mut args = vec![
            "task", "add", "k", "--queue", "mail", "--key", "same", "--delay", "1h", "--json",
        ];
        if let Some(ns) = ns {
            args.extend(["--namespace", ns]);
        }
        args
    };
    let in_default = json_out(&sundial(&server, &add(None)).await);
    let in_acme = json_out(&sundial(&server, &add(Some("acme"))).await);
    assert_ne!(
        in_default["id"], in_acme["id"],
        "the same key in two namespaces"
    );
    assert_eq!(in_acme["queue"], "mail");

    // SUNDIAL_NAMESPACE does what --namespace does.
    let listed = tokio::process::Command::new(BIN)
        .args(["task", "ls", "--json"])
        .env("SUNDIAL_SERVER", &server.url)
        .env("SUNDIAL_NAMESPACE", "acme")
        .output()
        .await
        .unwrap();
    let listed = json_out(&listed);
    let ids: Vec<&Value> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["id"])
        .collect();
    assert_eq!(ids, vec![&in_acme["id"]]);
    let listed = json_out(&sundial(&server, &["task", "ls", "--json"]).await);
    let ids: Vec<&Value> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["id"])
        .collect();
    assert_eq!(ids, vec![&in_default["id"]]);

    // Another namespace's task is not found; a namespace that does not exist is refused.
    let id = in_acme["id"].as_str().unwrap();
    let got = sundial(&server, &["task", "get", id]).await;
    assert!(!got.status.success());
    let got = sundial(&server, &["task", "get", id, "--namespace", "acme"]).await;
    assert!(got.status.success(), "{}", stderr(&got));
    let got = sundial(&server, &["task", "ls", "--namespace", "nowhere"]).await;
    assert!(!got.status.success());
    assert!(
        stderr(&got).contains("no such namespace"),
        "{}",
        stderr(&got)
    );

    // Metrics name the namespace in a label of its own, and the queue as the namespace knows it.
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
    let created = |ns: &str| {
        text.lines().any(|l| {
            l.starts_with("sundial_task_created_total{")
                && l.contains(&format!("namespace=\"{ns}\""))
                && l.contains("queue=\"mail\"")
        })
    };
    assert!(created("acme") && created("default"), "{text}");
    assert!(
        !text.contains('\u{1f}'),
        "no stored name leaks into a label"
    );
}
