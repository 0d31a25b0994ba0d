//! The access store conformance suite (tokens, namespaces, audit log) against the SQLite backend.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use sundial_store_sqlite::{SqliteOptions, SqliteStore};
use tempfile::TempDir;

async fn fresh() -> (Arc<SqliteStore>, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open store");
    (Arc::new(store), dir)
}

sundial_store::access_store_conformance!(fresh);
