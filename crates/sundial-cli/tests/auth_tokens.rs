//! Tokens end to end with the real binary: the bootstrap of the first admin token, `sundial token
//! create|ls|revoke`, the auth rule (on once a token exists), and a revocation refused on every
//! node of a PostgreSQL cluster within a second.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Backend, Launch, Server, Storage};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sundial");

/// Runs `sundial ARGS…`; returns (exit ok, stdout, stderr).
fn sundial(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("SUNDIAL_TOKEN")
        .envs(envs.iter().copied())
        .output()
        .expect("run sundial");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn get(url: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = sundial_cli::http_client_builder().build().unwrap().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, v)
}

fn bootstrap_args(storage: &Storage) -> Vec<String> {
    let mut a = vec![
        "token".to_string(),
        "create".into(),
        "--bootstrap".into(),
        "--name".into(),
        "root".into(),
        "--scope".into(),
        "admin".into(),
        "--data-dir".into(),
        storage.dir.path().display().to_string(),
    ];
    if let Some(pg) = &storage.pg {
        a.extend([
            "--database-url".into(),
            pg.url.clone(),
            "--database-schema".into(),
            pg.schema.clone(),
        ]);
    }
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_then_tokens_through_the_cli() {
    let storage = Storage::new(Backend::Embedded).unwrap();
    // Before any token: loopback, auth off.
    let args = bootstrap_args(&storage);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, root, err) = sundial(&args, &[]);
    assert!(ok, "{err}");
    let root = root.trim().to_string();
    assert!(root.starts_with("sdl_"), "{root}");
    let (ok, _, err) = sundial(&args, &[]);
    assert!(!ok, "a second bootstrap is refused");
    assert!(err.contains("tokens exist"), "{err}");

    let server = Server::start_on(&storage);
    let s = server.url.as_str();
    // A token exists: auth is on, on loopback too.
    let (st, _) = get(&format!("{s}/v1/tasks"), None).await;
    assert_eq!(st, 401);
    let (st, _) = get(&format!("{s}/healthz"), None).await;
    assert_eq!(st, 200);
    let (st, _) = get(&format!("{s}/v1/tasks"), Some(&root)).await;
    assert_eq!(st, 200);

    let env = [("SUNDIAL_SERVER", s), ("SUNDIAL_TOKEN", root.as_str())];
    let (ok, reader, err) = sundial(
        &["token", "create", "--name", "dash", "--scope", "reader"],
        &env,
    );
    assert!(ok, "{err}");
    let reader = reader.trim().to_string();
    let (ok, listed, err) = sundial(&["token", "ls", "--json"], &env);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let tokens = listed["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2);
    assert!(!listed.to_string().contains(&reader[4..]), "never a secret");
    let id = tokens[1]["id"].as_str().unwrap().to_string();

    // The reader reads, and may not write.
    let (ok, _, err) = sundial(
        &["task", "ls"],
        &[("SUNDIAL_SERVER", s), ("SUNDIAL_TOKEN", &reader)],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = sundial(
        &["task", "add", "k"],
        &[("SUNDIAL_SERVER", s), ("SUNDIAL_TOKEN", &reader)],
    );
    assert!(!ok);
    assert!(err.contains("forbidden"), "{err}");
    let (ok, _, err) = sundial(&["task", "ls"], &[("SUNDIAL_SERVER", s)]);
    assert!(!ok);
    assert!(err.contains("unauthenticated"), "{err}");

    let (ok, _, err) = sundial(&["token", "revoke", &id], &env);
    assert!(ok, "{err}");
    let (st, body) = get(&format!("{s}/v1/tasks"), Some(&reader)).await;
    assert_eq!(
        st, 401,
        "revoked on the node that revoked it at once: {body}"
    );

    // The audit log names who did what.
    let (ok, out, err) = sundial(
        &["audit", "--json", "--action", "POST /v1/tokens/{id}/revoke"],
        &env,
    );
    assert!(ok, "{err}");
    let audit: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(audit["records"][0]["actor"], "root");
    assert_eq!(audit["records"][0]["target"], json!(id));
    assert_eq!(audit["records"][0]["status"], 200);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_on_every_node_within_a_second() {
    let Some(storage) = Storage::new(Backend::Postgres) else {
        return;
    };
    let args = bootstrap_args(&storage);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, root, err) = sundial(&args, &[]);
    assert!(ok, "{err}");
    let root = root.trim().to_string();
    let launch = Launch {
        extra: vec!["--auth".into(), "required".into()],
        ..Launch::default()
    };
    let a = Server::launch(&storage, &launch);
    let b = Server::launch(&storage, &launch);
    let env = [
        ("SUNDIAL_SERVER", a.url.as_str()),
        ("SUNDIAL_TOKEN", root.as_str()),
    ];
    let (ok, out, err) = sundial(
        &[
            "token", "create", "--name", "ci", "--scope", "producer", "--json",
        ],
        &env,
    );
    assert!(ok, "{err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    for node in [&a, &b] {
        let (st, _) = get(&format!("{}/v1/tasks", node.url), Some(&token)).await;
        assert_eq!(st, 200, "the new token works on every node");
    }
    let revoked_at = common::now_ms();
    let (ok, _, err) = sundial(&["token", "revoke", &id], &env);
    assert!(ok, "{err}");
    let mut refused = [None, None];
    while refused.iter().any(Option::is_none) && common::now_ms() - revoked_at < 5_000 {
        for (i, node) in [&a, &b].iter().enumerate() {
            if refused[i].is_none() {
                let (st, _) = get(&format!("{}/v1/tasks", node.url), Some(&token)).await;
                if st == 401 {
                    refused[i] = Some(common::now_ms() - revoked_at);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, r) in refused.iter().enumerate() {
        let r = r.unwrap_or_else(|| panic!("node {i} still accepts the revoked token"));
        assert!(r <= 1_000, "node {i} took {r} ms");
    }
    println!("revocation refused on both nodes after {refused:?} ms");
    drop((a, b));
}

/// A bootstrap on a data directory that does not exist yet creates the store: with the server's
/// shard count (16, or --shards), which the store keeps for good. It used to get the library's
/// default, so the server started on it warned that its 16 shards were ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_creates_the_store_with_the_servers_shard_count() {
    for (extra, want) in [(None, 16), (Some("8"), 8)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let data_s = data.to_str().unwrap();
        let mut args = vec![
            "token",
            "create",
            "--bootstrap",
            "--name",
            "root",
            "--scope",
            "admin",
            "--data-dir",
            data_s,
        ];
        if let Some(n) = extra {
            args.extend(["--shards", n]);
        }
        let (ok, _, err) = sundial(&args, &[]);
        assert!(ok, "{err}");
        let store = sundial::Sundial::open(&data).await.unwrap();
        assert_eq!(store.config().shard_count, want, "{extra:?}");
    }
}
