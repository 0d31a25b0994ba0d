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

/// The workspace's own packages and, for each, the workspace packages it names as normal
/// (non-dev, non-build) dependencies.
fn workspace_edges(meta: &serde_json::Value) -> BTreeSet<(String, String)> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let packages: Vec<&serde_json::Value> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| members.contains(p["id"].as_str().unwrap()))
        .collect();
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let mut edges = BTreeSet::new();
    for p in &packages {
        for d in p["dependencies"].as_array().unwrap() {
            let name = d["name"].as_str().unwrap();
            if d["kind"].is_null() && names.contains(name) {
                edges.insert((p["name"].as_str().unwrap().to_string(), name.to_string()));
            }
        }
    }
    edges
}

/// Direct normal dependencies of workspace package `krate`.
fn direct_deps(meta: &serde_json::Value, krate: &str) -> BTreeSet<String> {
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == krate && p["source"].is_null())
        .unwrap()["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// ARCHITECTURE.md's code map lists every crate edge, and nothing else: the block between the
/// `crate-edges` markers, one `crate ─▶ dep, dep` line per crate.
#[test]
fn the_code_map_lists_every_crate_edge() {
    let meta = metadata();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ARCHITECTURE.md"
    ))
    .unwrap();
    let start = doc
        .find("<!-- crate-edges")
        .expect("ARCHITECTURE.md has the crate-edges block");
    let end = doc[start..].find("<!-- /crate-edges -->").unwrap() + start;
    let mut documented = BTreeSet::new();
    let mut crates_listed = BTreeSet::new();
    for line in doc[start..end].lines() {
        let Some((from, to)) = line.split_once('─') else {
            continue;
        };
        let from = from.trim().to_string();
        let to = to.trim_start_matches(['─', '▶']).trim();
        crates_listed.insert(from.clone());
        if to == "(none)" {
            continue;
        }
        for dep in to.split(',') {
            documented.insert((from.clone(), dep.trim().to_string()));
        }
    }
    let actual = workspace_edges(&meta);
    let missing: Vec<_> = actual.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md's crate edges differ from Cargo.toml: missing {missing:?}, not real {stale:?}"
    );
    let members: BTreeSet<String> = actual.iter().map(|(a, _)| a.clone()).collect();
    for m in members {
        assert!(crates_listed.contains(&m), "{m} is not in the code map");
    }
}

/// The database driver and the benchmark histograms stay where the code map says: tokio-postgres
/// under the PostgreSQL store (and the benchmarks, which make and drop schemas), hdrhistogram in
/// the benchmarks only. The CLI in particular no longer carries either.
#[test]
fn tokio_postgres_and_hdrhistogram_stay_where_the_map_says() {
    let meta = metadata();
    let members: Vec<String> = workspace_edges(&meta)
        .into_iter()
        .flat_map(|(a, b)| [a, b])
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for m in &members {
        let deps = direct_deps(&meta, m);
        if deps.contains("tokio-postgres") {
            assert!(
                ["sundial-store-postgres", "sundial-bench"].contains(&m.as_str()),
                "{m} depends on tokio-postgres directly"
            );
        }
        if deps.contains("hdrhistogram") {
            assert_eq!(m, "sundial-bench", "{m} depends on hdrhistogram");
        }
    }
    let engine = closure(&meta, "sundial");
    assert!(
        !engine.contains("tokio-postgres"),
        "the engine links tokio-postgres"
    );
}

/// The engine and the cluster code meet only through the `ShardHost` trait and the placement:
/// `cluster.rs` never names the engine's modules, so there is no import cycle.
#[test]
fn the_cluster_side_never_reaches_into_the_engine() {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/cluster.rs")).unwrap();
    assert!(
        !src.contains("crate::engine") && !src.contains("super::engine"),
        "cluster.rs imports the engine"
    );
}
