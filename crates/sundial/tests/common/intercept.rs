//! A store for tests that forwards every call to a real store and lets the test step into the
//! two claims (count them, or hold one back to force a race).

use std::sync::Arc;

use async_trait::async_trait;
use sundial_core::{ExecutionId, NewTask, Task, TaskId, Timestamp};
use sundial_store::{
    ClaimOutcome, DueClaim, DueEntry, DueKey, Inserted, ReadyClaim, StateCount, Store, StoreError,
    TaskFilter, TaskPage, TransitionError,
};

/// What a test does around the claims; by default it only forwards.
#[async_trait]
pub trait Intercept: Send + Sync + 'static {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        inner.claim_due(claims, now).await
    }
    async fn claim_ready(
        &self,
        inner: &dyn Store,
        claim: ReadyClaim,
    ) -> Result<Vec<Task>, StoreError> {
        inner.claim_ready(claim).await
    }
}

/// `inner` with `hooks` stepping into its claims.
pub struct Intercepted<I> {
    pub inner: Arc<dyn Store>,
    pub hooks: I,
}

impl<I> Intercepted<I> {
    /// Over a fresh embedded store in `dir`.
    pub fn sqlite(dir: &std::path::Path, hooks: I) -> Self {
        let inner: Arc<dyn Store> = Arc::new(
            sundial::SqliteStore::open_dir(dir, sundial::SqliteOptions::default())
                .expect("open the embedded store"),
        );
        Intercepted { inner, hooks }
    }
}

#[async_trait]
impl<I: Intercept> Store for Intercepted<I> {
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
        self.hooks.claim_due(&*self.inner, claims, now).await
    }
    async fn claim_ready(&self, claim: ReadyClaim) -> Result<Vec<Task>, StoreError> {
        self.hooks.claim_ready(&*self.inner, claim).await
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
    async fn queue_settings(
        &self,
        queue: &str,
    ) -> Result<Option<sundial_store::QueueSettings>, StoreError> {
        self.inner.queue_settings(queue).await
    }
    async fn list_queue_settings(&self) -> Result<Vec<sundial_store::QueueSettings>, StoreError> {
        self.inner.list_queue_settings().await
    }
    async fn put_queue_config(
        &self,
        queue: &str,
        config: sundial_store::QueueConfig,
        now: Timestamp,
    ) -> Result<sundial_store::QueueSettings, StoreError> {
        self.inner.put_queue_config(queue, config, now).await
    }
    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<sundial_store::QueueSettings, StoreError> {
        self.inner.set_queue_paused(queue, paused, now).await
    }
    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        self.inner.earliest_waiting(queue).await
    }
    async fn attempts(
        &self,
        id: TaskId,
    ) -> Result<Option<sundial_store::AttemptHistory>, StoreError> {
        self.inner.attempts(id).await
    }
    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.inner.retry(id, due_at, now).await
    }
    async fn select(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<Vec<sundial_store::Selected>, StoreError> {
        self.inner.select(filter, limit).await
    }
    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        self.inner.cancel_many(ids, now).await
    }
    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        self.inner.retry_many(ids, due_at, now).await
    }
    async fn purge_tasks(
        &self,
        shard: Option<u32>,
        rules: &sundial_store::RetentionRules,
        now: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.purge_tasks(shard, rules, now, limit).await
    }
}
