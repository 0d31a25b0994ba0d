//! The history cache: a workflow task reads from the store only the events appended since its
//! run's previous workflow task, so a run of n sequential steps reads O(n) events in all instead
//! of O(n²); with the cache off (or after a miss) the whole history is read, with the same
//! result. A counting wrapper around the embedded store's workflow tables measures the reads.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sundial::{ManualClock, SqliteOptions, SqliteStore, StoreError, Sundial, Timestamp};
use sundial_core::RunId;
use sundial_store::{
    AppendOp, Appended, Committed, HistoryEvent, IdReusePolicy, NewRun, StartedRun, TerminateOp,
    Terminated, WorkflowFilter, WorkflowPage, WorkflowRun, WorkflowStore, WorkflowStoreError,
    WorkflowTaskCommit,
};
use sundial_workflow::{
    ActivityError, StartWorkflow, WorkflowConfig, WorkflowContext, WorkflowError, WorkflowStatus,
    Workflows,
};

/// The embedded store's workflow tables, counting the history events read.
struct Counting {
    inner: Arc<SqliteStore>,
    events_read: AtomicU64,
}

#[async_trait]
impl WorkflowStore for Counting {
    async fn start_run(
        &self,
        run: NewRun,
        reuse: IdReusePolicy,
    ) -> Result<StartedRun, WorkflowStoreError> {
        self.inner.start_run(run, reuse).await
    }
    async fn get_run(&self, run_id: RunId) -> Result<Option<WorkflowRun>, StoreError> {
        self.inner.get_run(run_id).await
    }
    async fn current_run(&self, workflow_id: &str) -> Result<Option<WorkflowRun>, StoreError> {
        self.inner.current_run(workflow_id).await
    }
    async fn list_workflows(
        &self,
        filter: &WorkflowFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<WorkflowPage, StoreError> {
        self.inner.list_workflows(filter, after, limit).await
    }
    async fn history(
        &self,
        run_id: RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<HistoryEvent>, StoreError> {
        let page = self.inner.history(run_id, from, limit).await?;
        self.events_read
            .fetch_add(page.len() as u64, Ordering::Relaxed);
        Ok(page)
    }
    async fn has_marker(&self, run_id: RunId, marker: &str) -> Result<bool, StoreError> {
        self.inner.has_marker(run_id, marker).await
    }
    async fn append(&self, op: AppendOp) -> Result<Appended, WorkflowStoreError> {
        self.inner.append(op).await
    }
    async fn commit_workflow_task(
        &self,
        op: WorkflowTaskCommit,
    ) -> Result<Committed, WorkflowStoreError> {
        self.inner.commit_workflow_task(op).await
    }
    async fn terminate(&self, op: TerminateOp) -> Result<Terminated, WorkflowStoreError> {
        self.inner.terminate(op).await
    }

    async fn purge_closed_runs(
        &self,
        before: Timestamp,
        limit: usize,
        fence: Option<sundial_store::Fence>,
    ) -> Result<u64, StoreError> {
        self.inner.purge_closed_runs(before, limit, fence).await
    }
}

const STEPS: u32 = 30;

async fn sequential(ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
    let mut sum = 0;
    for i in 0..n {
        let v: u32 = ctx.activity("double", &i).await?;
        sum += v;
    }
    Ok(sum)
}

/// Runs one workflow of [`STEPS`] sequential activities to completion; returns its history
/// length, the events its workflow tasks read from the store, and its result.
async fn run_steps(cache_events: usize) -> (u64, u64, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap());
    let counting = Arc::new(Counting {
        inner: store.clone(),
        events_read: AtomicU64::new(0),
    });
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let sundial = Sundial::builder()
        .clock(Arc::new(clock))
        .workflow_store(counting.clone())
        .with_store(store)
        .expect("a valid config");
    let config = WorkflowConfig {
        history_cache_events: cache_events,
        ..WorkflowConfig::default()
    };
    let workflows = Workflows::attach_with(&sundial, config).unwrap();
    workflows.register("sequential", sequential).unwrap();
    workflows
        .register_activity("double", |_ctx, i: u32| async move {
            Ok::<u32, ActivityError>(2 * i)
        })
        .unwrap();
    let mut stepper = sundial.stepper();
    let running = sundial.start();
    workflows
        .start(StartWorkflow::new("sequential", json!(STEPS)).id("w"))
        .await
        .unwrap();
    // Each settle runs the workflow task and the activity it schedules; a bound on a test that
    // went wrong.
    let mut done = None;
    for _ in 0..(4 * STEPS + 10) {
        stepper.settle().await;
        let r = workflows.get("w").await.unwrap().unwrap();
        if r.status.is_closed() {
            done = Some(r);
            break;
        }
    }
    let run = done.expect("the workflow finished");
    assert_eq!(run.status, WorkflowStatus::Completed, "{run:?}");
    let read = counting.events_read.load(Ordering::Relaxed);
    running.shutdown(Duration::from_secs(5)).await;
    let result = serde_json::from_str(run.result.as_deref().unwrap()).unwrap();
    (run.history_len, read, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_tasks_read_only_new_events_with_the_cache() {
    let (len, read, result) = run_steps(WorkflowConfig::default().history_cache_events).await;
    assert_eq!(result, json!((0..STEPS).map(|i| 2 * i).sum::<u32>()));
    // Each event is read about once: by the workflow task after it was appended.
    assert!(
        read <= len + STEPS as u64,
        "with the cache, {read} events read for a history of {len}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cache_every_workflow_task_reads_the_whole_history() {
    let (len, read, result) = run_steps(0).await;
    assert_eq!(result, json!((0..STEPS).map(|i| 2 * i).sum::<u32>()));
    // STEPS + 1 workflow tasks, each reading everything so far: quadratic.
    assert!(
        read > 5 * len,
        "without the cache, {read} events read for a history of {len}"
    );
}
