//! The shared store conformance suite against the SQLite backend, plus what only SQLite has: data
//! on disk that outlives the process's handle, and the schema version check.

use std::path::Path;
use std::sync::Arc;

use sundial_core::{ExclusiveMode, Limits, TaskId, TaskSpec, TaskState, Timestamp};
use sundial_store::{ClaimOutcome, ClaimTarget, DueClaim, Inserted, Store, TaskFilter};
use sundial_store_sqlite::{SCHEMA_VERSION, SqliteError, SqliteOptions, SqliteStore};
use tempfile::TempDir;

/// A fresh store in its own temporary directory; the directory goes when the check is over.
async fn fresh_store() -> (Arc<dyn Store>, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open store");
    (Arc::new(store), dir)
}

sundial_store::store_conformance!(fresh_store);

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open_dir(dir, SqliteOptions::default()).expect("open store")
}

fn task_id(n: u8) -> TaskId {
    TaskId::from_bytes([n; 16])
}

/// Every task, with its state, lease and result, is still there after the store is closed (every
/// handle dropped) and opened again on the same directory; the reopened store carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopening() {
    let dir = tempfile::tempdir().expect("temp dir");
    let now = Timestamp(1_700_000_000_000);
    let later = Timestamp(now.0 + 60_000);
    let spec = |kind: &str| TaskSpec::new(kind).queue("durable");
    let new = |spec: TaskSpec, n: u8| {
        spec.validate(task_id(n), now, 4, &Limits::default())
            .expect("valid")
    };

    let (before, next_due, next_lease, counts) = {
        let store = open(dir.path());
        let clone = store.clone();
        let inserted = clone
            .insert(vec![
                new(
                    spec("scheduled")
                        .key("k")
                        .payload(serde_json::json!({"a": [1, 2]})),
                    1,
                ),
                new(spec("running").exclusive("x", ExclusiveMode::Wait), 2),
                new(spec("done"), 3),
                new(spec("later").run_at(later), 4),
            ])
            .await
            .expect("insert");
        assert!(inserted.iter().all(|r| matches!(r, Inserted::Created(_))));
        let exec = |n: u8| sundial_core::ExecutionId::from_bytes([n; 16]);
        let out = store
            .claim_due(
                vec![
                    DueClaim {
                        id: task_id(2),
                        target: ClaimTarget::Run {
                            execution: exec(2),
                            lease_until: later,
                            worker: None,
                        },
                    },
                    DueClaim {
                        id: task_id(3),
                        target: ClaimTarget::Run {
                            execution: exec(3),
                            lease_until: later,
                            worker: None,
                        },
                    },
                ],
                now,
                None,
            )
            .await
            .expect("claim_due");
        assert!(out.iter().all(|o| matches!(o, ClaimOutcome::Started(_))));
        store
            .complete(task_id(3), exec(3), now, Some("{\"ok\":true}".into()))
            .await
            .expect("complete");
        let page = store.list(&TaskFilter::default(), 10).await.expect("list");
        let shard = page
            .tasks
            .iter()
            .find(|t| t.id == task_id(4))
            .expect("task 4")
            .shard;
        let next_due = store.next_due(shard, None).await.expect("next_due");
        let next_lease = store
            .next_lease_expiry(None)
            .await
            .expect("next_lease_expiry");
        let counts = store.count_by_state().await.expect("count_by_state");
        (page.tasks, next_due, next_lease, counts)
        // `store` and `clone` are dropped here: the writer stops and the connections close.
    };
    assert_eq!(before.len(), 4);

    let store = open(dir.path());
    let after = store
        .list(&TaskFilter::default(), 10)
        .await
        .expect("list")
        .tasks;
    assert_eq!(after, before);
    let shard = after[0].shard;
    assert_eq!(after[0].id, task_id(4));
    assert_eq!(
        store.next_due(shard, None).await.expect("next_due"),
        next_due
    );
    assert_eq!(
        store
            .next_lease_expiry(None)
            .await
            .expect("next_lease_expiry"),
        next_lease
    );
    assert_eq!(
        store.count_by_state().await.expect("count_by_state"),
        counts
    );
    // Keys and state transitions work as before.
    let dup = new(spec("again").key("k"), 5);
    assert_eq!(
        store.insert(vec![dup]).await.expect("insert"),
        vec![Inserted::Duplicate {
            existing: task_id(1)
        }]
    );
    let done = store.get(task_id(3)).await.expect("get").expect("task 3");
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, Some(serde_json::json!({"ok": true})));
    let cancelled = store.cancel(task_id(2), later).await.expect("cancel");
    assert_eq!(cancelled.state, TaskState::Cancelled);
}

/// A database whose `user_version` is newer than this build's schema is refused, and left as it was.
#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sundial.db");
    let newer = SCHEMA_VERSION + 1;
    {
        let conn = rusqlite::Connection::open(&path).expect("open db");
        conn.pragma_update(None, "user_version", newer)
            .expect("set user_version");
    }
    match SqliteStore::open_dir(dir.path(), SqliteOptions::default()) {
        Err(SqliteError::TooNew { found, supported }) => {
            assert_eq!(found, newer);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        Err(other) => panic!("expected TooNew, got {other}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
    let conn = rusqlite::Connection::open(&path).expect("open db");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, newer, "the refused database is not touched");
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'tasks'",
            [],
            |r| r.get(0),
        )
        .expect("sqlite_master");
    assert_eq!(tables, 0, "no migration ran");
}

/// A database at the current version opens again without migrating twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_schema_reopens() {
    let dir = tempfile::tempdir().expect("temp dir");
    drop(open(dir.path()));
    drop(open(dir.path()));
    let conn = rusqlite::Connection::open(dir.path().join("sundial.db")).expect("open db");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
}

mod push_secrets {
    use std::sync::Arc;

    use sundial_store_sqlite::{SqliteOptions, SqliteStore};
    use tempfile::TempDir;

    async fn fresh() -> (Arc<SqliteStore>, TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open");
        (Arc::new(store), dir)
    }

    sundial_store::push_store_conformance!(fresh);
}
