//! The schedule store conformance suite against the SQLite backend, and the schedule tables
//! surviving a reopen.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use sundial_core::Timestamp;
use sundial_core::schedule::{ScheduleDef, ScheduleId, ScheduleSpec, TaskTemplate};
use sundial_store::{NewSchedule, ScheduleStore};
use sundial_store_sqlite::{SqliteOptions, SqliteStore};
use tempfile::TempDir;

async fn fresh() -> (Arc<SqliteStore>, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open store");
    (Arc::new(store), dir)
}

sundial_store::schedule_store_conformance!(fresh);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let id = ScheduleId::new("kept").unwrap();
    let def = ScheduleDef::new(
        ScheduleSpec::cron("0 10 * * *").timezone("Asia/Shanghai"),
        TaskTemplate::new("report"),
    );
    {
        let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap();
        store
            .create_schedule(NewSchedule {
                id: id.clone(),
                def: def.clone(),
                paused: true,
                note: Some("n".into()),
                arm: None,
                now: Timestamp(5),
            })
            .await
            .unwrap();
    }
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap();
    let got = store.get_schedule(&id).await.unwrap().unwrap();
    assert_eq!(got.def, def);
    assert!(got.paused);
    assert_eq!(got.note.as_deref(), Some("n"));
}
