//! The embedded store's data directory seen from the real binary: the shard count is the store's
//! (a restart with another `--shards` is told so and strands nothing), and one directory serves
//! one server at a time (a second is refused naming the first's pid; a `kill -9` frees it).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::HashSet;
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, Launch, Server, now_ms};
use sundial_server::wire::CreateTask;

fn start(dir: &std::path::Path, shards: &str, log: Option<std::path::PathBuf>) -> Server {
    let args: Vec<OsString> = vec![
        "--data-dir".into(),
        dir.into(),
        "--shards".into(),
        shards.into(),
    ];
    let launch = Launch {
        log,
        ..Launch::default()
    };
    Server::spawn(args, &launch, dir)
}

/// The reproduction: 40 keyed tasks on 16 shards, a restart with 4: every task is
/// delivered (before the fix, those hashed to shards 4–15 stayed `scheduled` for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_fewer_shards_delivers_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "16", None);
    let client = server.client();
    let mut due_at = std::collections::HashMap::new();
    for i in 0..40 {
        let t = client
            .create(&CreateTask {
                queue: Some("reshard".into()),
                key: Some(format!("k-{i}")),
                delay: Some("2s".into()),
                ..CreateTask::new("job")
            })
            .await
            .unwrap();
        due_at.insert(t.id, common::rfc3339_ms(&t.run_at));
    }
    let due = due_at.values().copied().max().unwrap();
    server.terminate(Duration::from_secs(20));

    let log = dir.path().join("second.log");
    let server = start(dir.path(), "4", Some(log.clone()));
    let client = server.client();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("has 16 shards") && text.contains("the requested 4 is ignored"),
        "the start says the flag is ignored: {text}"
    );

    let mut seen = HashSet::new();
    let give_up = due + 30_000;
    while seen.len() < 40 {
        assert!(
            now_ms() < give_up,
            "only {} of 40 tasks delivered after the restart",
            seen.len()
        );
        let got = client
            .poll("reshard", "w", 100, Duration::from_secs(1), None)
            .await
            .unwrap();
        for t in got.tasks {
            assert!(now_ms() >= due_at[&t.id], "delivered early");
            seen.insert(t.id);
        }
    }
}

/// A second server on a directory in use exits at once with "data directory D is in use by pid
/// N"; after the first is killed with SIGKILL, the directory opens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path(), "16", None);
    let out = Command::new(BIN)
        .arg("server")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run a second server");
    assert!(!out.status.success(), "the second server must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "data directory {} is in use by pid {}",
        dir.path().display(),
        first.pid()
    );
    assert!(stderr.contains(&expected), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "it never listened: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );

    first.kill9();
    let second = start(dir.path(), "16", None);
    second
        .client()
        .get(&uuid::Uuid::now_v7().to_string())
        .await
        .unwrap_err();
}
