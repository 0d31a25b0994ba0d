//! Exclusive keys in `wait` mode: a task refused as busy runs as soon as the holder finishes,
//! even when the holder finishes in the instant between the refusal and the waiter's
//! registration (the race is forced by a store wrapper that lets the holder finish before it
//! answers the waiter's claim). The clock never moves, so the engine's 1 s fallback retry cannot
//! hide a lost hand-over.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sundial::{
    ExclusiveMode, ExecutionId, ManualClock, SqliteOptions, SqliteStore, StateCount, Store,
    StoreError, Sundial, Task, TaskContext, TaskFilter, TaskId, TaskPage, TaskSpec, TaskState,
    Timestamp,
};
use sundial_core::NewTask;
use sundial_store::{
    ClaimOutcome, DueClaim, DueEntry, DueKey, Inserted, ReadyClaim, TransitionError,
};
use tokio::sync::watch;

/// The embedded store; a due claim that comes back `Busy` is held until the holder has finished
/// and its release has run, then answered.
struct HandOverRace {
    inner: Arc<SqliteStore>,
    /// Lets the holder's handler return.
    go: watch::Sender<bool>,
    holder: Mutex<Option<TaskId>>,
}

#[async_trait]
impl Store for HandOverRace {
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError> {
        self.inner.insert(tasks).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        self.inner.get(id).await
    }
    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError> {
        self.inner.list(filter, limit).await
    }
    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        self.inner.cancel(id, now).await
    }
    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        self.inner.trigger(id, now).await
    }
    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError> {
        self.inner.scan_due(shard, after, until, limit).await
    }
    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.inner.next_due(shard, after).await
    }
    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let out = self.inner.claim_due(claims, now).await?;
        let holder = *self.holder.lock().unwrap();
        if let Some(holder) = holder
            && out.iter().any(|o| matches!(o, ClaimOutcome::Busy { .. }))
        {
            self.go.send_replace(true);
            for _ in 0..500 {
                if self.inner.get(holder).await?.map(|t| t.state) == Some(TaskState::Succeeded) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The engine releases the key right after the holder's completion is stored.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(out)
    }
    async fn claim_ready(&self, claim: ReadyClaim) -> Result<Vec<Task>, StoreError> {
        self.inner.claim_ready(claim).await
    }
    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        lease_until: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.inner.heartbeat(id, execution, now, lease_until).await
    }
    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        self.inner.complete(id, execution, now, result).await
    }
    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry_at: Option<Timestamp>,
    ) -> Result<Task, TransitionError> {
        self.inner.fail(id, execution, now, error, retry_at).await
    }
    async fn expire_leases(&self, now: Timestamp, limit: usize) -> Result<Vec<Task>, StoreError> {
        self.inner.expire_leases(now, limit).await
    }
    async fn next_lease_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.inner.next_lease_expiry().await
    }
    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError> {
        self.inner.count_by_state().await
    }
}

async fn wait_state(sundial: &Sundial, id: TaskId, state: TaskState) -> Option<Task> {
    for _ in 0..500 {
        let t = sundial.get(id).await.unwrap().unwrap();
        if t.state == state {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_refused_just_before_the_holder_finishes_still_runs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let inner = Arc::new(SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap());
    let (go, go_rx) = watch::channel(false);
    let store = Arc::new(HandOverRace {
        inner,
        go,
        holder: Mutex::new(None),
    });
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let sundial = Sundial::builder()
        .clock(Arc::new(clock))
        .with_store(store.clone());
    sundial.register("x", move |_ctx: TaskContext| {
        let mut go = go_rx.clone();
        async move {
            while !*go.borrow_and_update() {
                if go.changed().await.is_err() {
                    break;
                }
            }
            Ok::<(), String>(())
        }
    });
    let running = sundial.start();
    let holder = sundial
        .schedule(TaskSpec::new("x").exclusive("acct", ExclusiveMode::Wait))
        .await
        .unwrap();
    assert!(
        wait_state(&sundial, holder, TaskState::Running)
            .await
            .is_some()
    );
    *store.holder.lock().unwrap() = Some(holder);
    let waiter = sundial
        .schedule(TaskSpec::new("x").exclusive("acct", ExclusiveMode::Wait))
        .await
        .unwrap();
    assert!(
        wait_state(&sundial, holder, TaskState::Succeeded)
            .await
            .is_some()
    );
    let t = wait_state(&sundial, waiter, TaskState::Succeeded).await;
    assert!(
        t.is_some(),
        "the waiter was refused as busy while the holder finished, and never ran on a clock that \
         does not move: {:?}",
        sundial.get(waiter).await.unwrap()
    );
    running.shutdown(Duration::from_secs(5)).await;
}
