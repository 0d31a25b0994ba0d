//! Opening the embedded store: the shard count it records and adopts, the lock that keeps a second
//! opener out, data written before a migration read after it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::path::Path;

use sundial_core::{Limits, NewTask, TaskId, TaskSpec, Timestamp};
use sundial_store::{PushSecretStore, Store};
use sundial_store_sqlite::{ShardCountOrigin, SqliteError, SqliteOptions, SqliteStore};

const NOW: Timestamp = Timestamp(1_700_000_000_000);

fn opts(shards: u32) -> SqliteOptions {
    SqliteOptions {
        shard_count: shards,
        ..SqliteOptions::default()
    }
}

fn open(dir: &Path, shards: u32) -> SqliteStore {
    SqliteStore::open_dir(dir, opts(shards)).expect("open store")
}

fn task(i: usize, keyed: bool, shards: u32) -> NewTask {
    let spec = TaskSpec::new("k").payload(serde_json::json!(i));
    let spec = if keyed {
        spec.key(format!("key-{i}"))
    } else {
        spec
    };
    spec.validate(
        TaskId(uuid::Uuid::now_v7()),
        NOW,
        shards,
        &Limits::default(),
    )
    .expect("valid")
}

fn insert(store: &SqliteStore, tasks: Vec<NewTask>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(store.insert(tasks)).expect("insert");
}

/// Makes the database look as a build before the shard count was recorded left it: version 3,
/// without what migrations 4 (the store's facts), 5 (operations), 6 (push delivery), 7 (fire
/// retention), 8 (idempotency), 9 (access), 10 (workflow run retention), 11 (push attempts'
/// answers: dropped with `task_attempts`), 12 (trace context), 14 (the namespace of push
/// secrets: dropped with `push_secrets`), 15 (priorities), 16 (group limits), 17 (debounce)
/// and 18 (rate limits) added. (Migration 19 dropped two indexes that migration 5 added.)
fn forget_shard_count(dir: &Path) {
    let conn = rusqlite::Connection::open(dir.join("sundial.db")).unwrap();
    conn.execute_batch(
        "DROP TABLE store_meta;
         DROP TRIGGER task_tags_delete; DROP TRIGGER task_attempts_start;
         DROP TRIGGER task_attempts_end; DROP TRIGGER task_attempts_delete;
         DROP TABLE task_tags; DROP TABLE queue_settings; DROP TABLE store_settings;
         DROP TABLE task_attempts;
         DROP INDEX tasks_queue_state_id; DROP INDEX tasks_state_id; DROP INDEX tasks_kind_id;
         DROP INDEX tasks_key_id;
         DROP INDEX tasks_waiting; DROP INDEX tasks_finished;
         ALTER TABLE tasks DROP COLUMN tags;
         DROP TABLE push_secrets; ALTER TABLE tasks DROP COLUMN target;
         DROP INDEX schedule_fires_recorded;
         DROP TABLE idempotency;
         DROP TABLE api_tokens; DROP TABLE namespaces; DROP TABLE audit_log;
         DROP INDEX workflow_runs_closed;
         ALTER TABLE tasks DROP COLUMN traceparent; ALTER TABLE tasks DROP COLUMN tracestate;
         DROP INDEX tasks_dead_error;
         DROP INDEX tasks_ready; ALTER TABLE tasks DROP COLUMN priority;
         CREATE INDEX tasks_ready ON tasks (queue, id) WHERE state = 'ready';
         ALTER TABLE tasks DROP COLUMN exclusive_limit;
         DROP INDEX tasks_debounce; ALTER TABLE tasks DROP COLUMN debounce_key;
         DROP TABLE rate_limits; DROP INDEX tasks_rate_limited;
         ALTER TABLE tasks DROP COLUMN rate;
         PRAGMA user_version = 3;",
    )
    .unwrap();
}

#[test]
fn a_new_store_records_the_proposed_count_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16);
    assert_eq!(s.shards().count, 16);
    assert_eq!(s.shards().origin, ShardCountOrigin::Created);
    drop(s);
    for proposed in [4, 16, 64] {
        let s = open(dir.path(), proposed);
        assert_eq!(s.shards().count, 16, "proposed {proposed}");
        assert_eq!(s.shards().origin, ShardCountOrigin::Recorded);
    }
}

#[test]
fn an_older_store_gets_the_count_its_rows_were_written_with() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16);
    insert(&s, (0..60).map(|i| task(i, i % 2 == 0, 16)).collect());
    drop(s);
    for proposed in [4, 16, 32] {
        forget_shard_count(dir.path());
        let s = open(dir.path(), proposed);
        assert_eq!(s.shards().count, 16, "proposed {proposed}");
        assert_eq!(s.shards().origin, ShardCountOrigin::DerivedFromRows);
        drop(s);
        let s = open(dir.path(), proposed);
        assert_eq!(s.shards().count, 16);
        assert_eq!(s.shards().origin, ShardCountOrigin::Recorded);
    }
}

#[test]
fn an_older_store_without_tasks_takes_the_proposed_count() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 16));
    forget_shard_count(dir.path());
    let s = open(dir.path(), 8);
    assert_eq!(s.shards().count, 8);
    assert_eq!(s.shards().origin, ShardCountOrigin::Created);
}

#[test]
fn rows_written_with_several_counts_all_stay_in_running_shards() {
    // What the defect left behind: a store opened with 16 shards, then with 4.
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), 16);
    let mut tasks: Vec<NewTask> = (0..40).map(|i| task(i, true, 16)).collect();
    tasks.extend((40..80).map(|i| task(i, true, 4)));
    let highest = tasks.iter().map(|t| t.shard).max().unwrap();
    insert(&s, tasks);
    drop(s);
    forget_shard_count(dir.path());
    let s = open(dir.path(), 4);
    assert_eq!(s.shards().origin, ShardCountOrigin::DerivedFromRows);
    assert!(
        s.shards().count > highest,
        "count {} leaves shard {highest} unrun",
        s.shards().count
    );
}

#[test]
fn a_second_opener_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path(), 4);
    let clone = first.clone();
    drop(first);
    // A clone keeps the store (and its lock) alive.
    match SqliteStore::open_dir(dir.path(), opts(4)) {
        Err(SqliteError::InUse(holder)) => {
            assert_eq!(holder.pid, Some(std::process::id()));
            assert_eq!(
                holder.to_string(),
                format!(
                    "data directory {} is in use by pid {}",
                    dir.path().display(),
                    std::process::id()
                )
            );
        }
        Err(other) => panic!("expected InUse, got {other}"),
        Ok(_) => panic!("a second opener must be refused"),
    }
    drop(clone);
    // Released with the last clone.
    let again = open(dir.path(), 4);
    assert_eq!(again.shards().count, 4);
}

/// Push secrets stored before they had a namespace (version 13) are the default namespace's
/// after the migration, and still sign there; no other namespace sees them.
#[test]
fn push_secrets_older_than_namespaces_are_the_default_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), 4));
    let conn = rusqlite::Connection::open(dir.path().join("sundial.db")).unwrap();
    conn.execute_batch(
        "DROP INDEX push_secrets_namespace;
         ALTER TABLE push_secrets DROP COLUMN namespace;
         INSERT INTO push_secrets (id, secret, created_at, expires_at)
             VALUES ('ps_old', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 5, NULL);
         DROP INDEX tasks_ready; ALTER TABLE tasks DROP COLUMN priority;
         CREATE INDEX tasks_ready ON tasks (queue, id) WHERE state = 'ready';
         ALTER TABLE tasks DROP COLUMN exclusive_limit;
         DROP INDEX tasks_debounce; ALTER TABLE tasks DROP COLUMN debounce_key;
         DROP TABLE rate_limits; DROP INDEX tasks_rate_limited;
         ALTER TABLE tasks DROP COLUMN rate;
         PRAGMA user_version = 13;",
    )
    .unwrap();
    drop(conn);
    let store = open(dir.path(), 4);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let default = rt.block_on(store.push_secrets("default")).unwrap();
    assert_eq!(default.len(), 1);
    assert_eq!(default[0].id, "ps_old");
    assert_eq!(default[0].namespace, "default");
    assert!(default[0].is_active(NOW));
    assert!(rt.block_on(store.push_secrets("acme")).unwrap().is_empty());
}

/// The SQLite this store is built with keeps no memory-usage statistics (the workspace's
/// `.cargo/config.toml` builds it with `SQLITE_DEFAULT_MEMSTATUS=0`): with them on, every SQLite
/// allocation takes a global mutex, which cost the schedules burst 8 % of its writer time.
#[test]
fn the_bundled_sqlite_keeps_no_memory_statistics() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
    let options: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "compile options: {options:?}"
    );
}
