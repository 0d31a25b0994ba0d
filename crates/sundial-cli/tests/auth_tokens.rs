//! Tokens end to end with the real binary: the bootstrap of the first admin token (`token create
//! --bootstrap`, and `SUNDIAL_BOOTSTRAP_TOKEN` at server start, once across nodes starting
//! together), `sundial token create|ls|revoke`, the auth rule (on once a token exists), and a
//! revocation refused on every node of a PostgreSQL cluster within a second.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::ffi::OsString;
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
    // The table has a header line, like the other `ls` commands.
    let (ok, table, err) = sundial(&["token", "ls"], &env);
    assert!(ok, "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "NAME", "SCOPE", "NAMESPACE", "STATE", "EXPIRES"],
        "{table}"
    );
    assert!(
        lines[2].starts_with(&id) && lines[2].contains("dash") && lines[2].contains("live"),
        "{table}"
    );
    let (ok, _, err) = sundial(
        &["namespace", "add", "team-a", "--max-live-tasks", "5"],
        &env,
    );
    assert!(ok, "{err}");
    let (ok, table, err) = sundial(&["namespace", "ls"], &env);
    assert!(ok, "{err}");
    assert!(table.starts_with("NAME "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("team-a") && l.contains('5')),
        "{table}"
    );
    // Push commands send the token too.
    let (ok, _, err) = sundial(&["push", "secret", "ls"], &env);
    assert!(ok, "{err}");

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

/// A fresh token string of the issued form (what an operator puts in `SUNDIAL_BOOTSTRAP_TOKEN`).
fn fresh_token() -> String {
    sundial_server::access::IssuedToken::generate().token
}

fn with_bootstrap(token: &str) -> Launch {
    Launch {
        env: vec![(
            OsString::from("SUNDIAL_BOOTSTRAP_TOKEN"),
            OsString::from(token),
        )],
        ..Launch::default()
    }
}

async fn bootstrap_from_the_environment_on(backend: Backend) {
    let Some(storage) = Storage::new(backend) else {
        return;
    };
    let root = fresh_token();
    let mut server = Server::launch(&storage, &with_bootstrap(&root));
    let s = server.url.clone();
    // The token exists: auth is on (loopback too), and it is an admin token.
    assert_eq!(get(&format!("{s}/v1/tasks"), None).await.0, 401);
    assert_eq!(get(&format!("{s}/v1/tasks"), Some(&root)).await.0, 200);
    let (st, list) = get(&format!("{s}/v1/tokens"), Some(&root)).await;
    assert_eq!(st, 200, "{list}");
    let tokens = list["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 1, "{list}");
    assert_eq!(tokens[0]["name"], "bootstrap");
    assert_eq!(tokens[0]["scope"], "admin");
    assert!(!list.to_string().contains(&root[36..]), "never the secret");
    server.terminate(Duration::from_secs(30));

    // A restart with the variable still set (or set to another token): ignored, still one token.
    let other = fresh_token();
    let server = Server::launch(&storage, &with_bootstrap(&other));
    let s = server.url.clone();
    assert_eq!(get(&format!("{s}/v1/tasks"), Some(&other)).await.0, 401);
    assert_eq!(get(&format!("{s}/v1/tasks"), Some(&root)).await.0, 200);
    let (_, list) = get(&format!("{s}/v1/tokens"), Some(&root)).await;
    assert_eq!(list["tokens"].as_array().unwrap().len(), 1, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stores_a_bootstrap_token_from_the_environment_once() {
    bootstrap_from_the_environment_on(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stores_a_bootstrap_token_from_the_environment_once_on_postgres() {
    bootstrap_from_the_environment_on(Backend::Postgres).await;
}

/// Nodes starting together on one PostgreSQL, each with its own bootstrap token: exactly one of
/// the tokens is stored, and it works on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_store_one_bootstrap_token() {
    let Some(storage) = Storage::new(Backend::Postgres) else {
        return;
    };
    let tokens: Vec<String> = (0..3).map(|_| fresh_token()).collect();
    let servers: Vec<Server> = std::thread::scope(|scope| {
        let started: Vec<_> = tokens
            .iter()
            .map(|t| {
                let storage = &storage;
                scope.spawn(move || Server::launch(storage, &with_bootstrap(t)))
            })
            .collect();
        started.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut working = Vec::new();
    for t in &tokens {
        if get(&format!("{}/v1/tasks", servers[0].url), Some(t))
            .await
            .0
            == 200
        {
            working.push(t.clone());
        }
    }
    assert_eq!(working.len(), 1, "exactly one bootstrap token is stored");
    for node in &servers {
        assert_eq!(
            get(&format!("{}/v1/tasks", node.url), Some(&working[0]))
                .await
                .0,
            200
        );
        let (_, list) = get(&format!("{}/v1/tokens", node.url), Some(&working[0])).await;
        assert_eq!(list["tokens"].as_array().unwrap().len(), 1, "{list}");
    }
}

#[test]
fn a_malformed_bootstrap_token_stops_the_server_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let secret_looking = "sdl_0123456789abcdef";
    let out = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("SUNDIAL_BOOTSTRAP_TOKEN", secret_looking)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SUNDIAL_BOOTSTRAP_TOKEN is not a Sundial token"),
        "{err}"
    );
    assert!(
        !err.contains(secret_looking),
        "the value is not echoed: {err}"
    );
    assert!(!data.exists(), "nothing was created");
}
