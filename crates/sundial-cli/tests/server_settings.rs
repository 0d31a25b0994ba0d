//! `sundial server` refuses contradictory settings at start: it exits with status 2 and a message
//! that names them, before it binds, opens or creates anything.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_sundial");

fn refused(extra: &[&str], names: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
    for name in names {
        assert!(stderr.contains(name), "{extra:?} names {name}: {stderr}");
    }
    assert!(!data.exists(), "{extra:?}: nothing is created");
}

#[test]
fn contradictory_settings_stop_the_server_naming_them() {
    refused(&["--shards", "0"], &["shard_count"]);
    refused(&["--max-poll-wait", "0s"], &["max_poll_wait"]);
    refused(&["--shard-lease-ttl", "2ms"], &["shard_lease_ttl"]);
    refused(
        &["--push-concurrency", "4", "--push-host-concurrency", "8"],
        &["push_host_concurrency", "push_concurrency"],
    );
    refused(&["--max-batch", "0"], &["max_batch_items"]);
    refused(&["--max-polls-per-token", "0"], &["max_polls_per_caller"]);
}

#[test]
fn a_node_push_cap_below_the_default_receiver_slots_lowers_them_instead_of_refusing() {
    // The receiver default (512) is no setting of the user's: a smaller node cap alone is valid.
    let dir = tempfile::tempdir().unwrap();
    // The server checks its settings before it binds: printing its address means they passed.
    let server = common::Server::start_with(dir.path(), &["--push-concurrency", "100"]);
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
}
