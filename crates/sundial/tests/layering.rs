//! Layering is enforced, not hoped for: the pure crates must not pull in a runtime, a database
//! driver or a web framework, and only the SQLite store crate may depend on rusqlite.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata json")
}

/// Every package reachable from `root` through normal (non-dev) dependencies.
fn closure(meta: &serde_json::Value, root: &str) -> BTreeSet<String> {
    let packages = meta["packages"].as_array().expect("packages");
    let name_of: HashMap<&str, &str> = packages
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes = meta["resolve"]["nodes"].as_array().expect("nodes");
    let by_id: HashMap<&str, &serde_json::Value> = nodes
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root_id = packages
        .iter()
        .find(|p| p["name"] == root)
        .and_then(|p| p["id"].as_str())
        .expect("root package");
    let mut seen = BTreeSet::new();
    let mut stack = vec![root_id];
    while let Some(id) = stack.pop() {
        if !seen.insert(name_of[id].to_string()) && id != root_id {
            continue;
        }
        for dep in by_id[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    seen
}

const IO_CRATES: [&str; 7] = [
    "tokio",
    "rusqlite",
    "tokio-postgres",
    "axum",
    "hyper",
    "reqwest",
    "rustls",
];

#[test]
fn pure_crates_do_no_io() {
    let meta = metadata();
    for krate in ["sundial-core", "sundial-store"] {
        let deps = closure(&meta, krate);
        for bad in IO_CRATES {
            assert!(!deps.contains(bad), "{krate} depends on {bad}: {deps:?}");
        }
    }
}

#[test]
fn only_the_sqlite_store_links_sqlite() {
    let meta = metadata();
    let deps = closure(&meta, "sundial-store-sqlite");
    assert!(deps.contains("rusqlite"));
    let engine_direct: Vec<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sundial")
        .unwrap()["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!engine_direct.contains(&"rusqlite".to_string()));
}

/// Push delivery sits above the engine: the engine and the pure crates never reach the HTTP
/// client, and the push crate never reaches the server.
#[test]
fn push_delivery_sits_between_the_engine_and_the_server() {
    let meta = metadata();
    for krate in ["sundial-core", "sundial-store", "sundial"] {
        let deps = closure(&meta, krate);
        assert!(
            !deps.contains("sundial-push"),
            "{krate} depends on sundial-push"
        );
        assert!(!deps.contains("reqwest"), "{krate} depends on reqwest");
    }
    let push = closure(&meta, "sundial-push");
    assert!(push.contains("sundial"));
    for above in ["sundial-server", "sundial-cli", "axum"] {
        assert!(!push.contains(above), "sundial-push depends on {above}");
    }
}
