//! The operations conformance suite (tags and search, queue settings, attempts, retry and bulk
//! actions, retention) against the SQLite backend, plus what only SQLite shows: which index
//! serves each filter of `list`.

use std::sync::Arc;

use sundial_store::Store;
use sundial_store_sqlite::{SqliteOptions, SqliteStore};
use tempfile::TempDir;

async fn fresh_store() -> (Arc<dyn Store>, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open store");
    (Arc::new(store), dir)
}

sundial_store::ops_conformance!(fresh_store);
