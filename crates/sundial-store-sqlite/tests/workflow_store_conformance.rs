//! The workflow store conformance suite against the SQLite backend, and workflow tables
//! surviving a reopen.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use sundial_core::{Limits, RunId, TaskId, TaskSpec, Timestamp};
use sundial_store::{IdReusePolicy, NewEvent, NewRun, WORKFLOW_QUEUE, WorkflowStore};
use sundial_store_sqlite::{SqliteOptions, SqliteStore};
use tempfile::TempDir;

async fn fresh() -> (Arc<SqliteStore>, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).expect("open store");
    (Arc::new(store), dir)
}

sundial_store::workflow_store_conformance!(fresh);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let run_id = RunId(uuid::Uuid::new_v4());
    {
        let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap();
        let task = TaskSpec::new("workflow/order")
            .queue(WORKFLOW_QUEUE)
            .validate(
                TaskId(uuid::Uuid::new_v4()),
                Timestamp(5),
                4,
                &Limits::default(),
            )
            .unwrap();
        store
            .start_run(
                NewRun {
                    workflow_id: "kept".into(),
                    run_id,
                    workflow_type: "order".into(),
                    input: "{}".into(),
                    parent: None,
                    continued_from: None,
                    started: NewEvent {
                        at: Timestamp(5),
                        data: r#"{"type":"started"}"#.into(),
                    },
                    first_task: task,
                    now: Timestamp(5),
                },
                IdReusePolicy::AllowDuplicate,
            )
            .await
            .unwrap();
    }
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap();
    let run = store.current_run("kept").await.unwrap().unwrap();
    assert_eq!(run.run_id, run_id);
    let h = store.history(run_id, 0, 10).await.unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].data, r#"{"type":"started"}"#);
}
