//! [`Forwarding`]: a [`Store`] for tests and benchmarks that forwards every call to another store
//! and lets [`Hooks`] step in: count or time each call ([`Hooks::enter`]), or replace any one call
//! (hold a claim back to force a race, check a fence against a model, inject a panic or an error).
//! Every hook defaults to plain forwarding, so a wrapper names only what it changes, and a new
//! `Store` method needs one forwarding default here rather than one in every wrapper.

use std::sync::Arc;

use async_trait::async_trait;
use sundial_core::{ExecutionId, NewTask, Task, TaskId, Timestamp};

use crate::{
    AttemptHistory, ClaimOutcome, DeadGroup, DeadGroupFilter, DebounceOutcome, DebouncedCreate,
    DueClaim, DueEntry, DueKey, Fence, IdempotentCreate, IdempotentOutcome, Inserted, QueueConfig,
    QueueSettings, ReadyClaim, ReadyTaken, RetentionRules, Retry, SelectPage, StateCount, Store,
    StoreError, TaskFilter, TaskPage, TransitionError,
};

/// One forwarded call, as [`Hooks::enter`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The `Store` method's name (`"claim_due"`, …).
    pub method: &'static str,
    /// The shard the call names, for the methods that name one.
    pub shard: Option<u32>,
}

/// What a wrapper does around the calls it forwards; every method defaults to forwarding.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// Called before each call; what it returns is dropped when the call has returned (a timer).
    fn enter(&self, _call: Call) -> Option<Box<dyn Send>> {
        None
    }
    async fn insert(
        &self,
        inner: &dyn Store,
        tasks: Vec<NewTask>,
    ) -> Result<Vec<Inserted>, StoreError> {
        inner.insert(tasks).await
    }
    async fn insert_idempotent(
        &self,
        inner: &dyn Store,
        create: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError> {
        inner.insert_idempotent(create).await
    }
    async fn insert_debounced(
        &self,
        inner: &dyn Store,
        create: DebouncedCreate,
    ) -> Result<DebounceOutcome, StoreError> {
        inner.insert_debounced(create).await
    }
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        inner.claim_due(claims, now, fence).await
    }
    async fn claim_ready(
        &self,
        inner: &dyn Store,
        claim: ReadyClaim,
    ) -> Result<ReadyTaken, StoreError> {
        inner.claim_ready(claim).await
    }
    async fn complete(
        &self,
        inner: &dyn Store,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        inner.complete(id, execution, now, result).await
    }
    async fn complete_then_claim_ready(
        &self,
        inner: &dyn Store,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
        claim: ReadyClaim,
    ) -> Result<(Task, ReadyTaken), TransitionError> {
        inner
            .complete_then_claim_ready(id, execution, now, result, claim)
            .await
    }
    async fn fail(
        &self,
        inner: &dyn Store,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry: Retry,
    ) -> Result<Task, TransitionError> {
        inner.fail(id, execution, now, error, retry).await
    }
    async fn expire_leases(
        &self,
        inner: &dyn Store,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<Task>, StoreError> {
        inner.expire_leases(now, limit, fence).await
    }
    async fn purge_tasks(
        &self,
        inner: &dyn Store,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        inner.purge_tasks(rules, now, limit, fence).await
    }
    async fn next_lease_expiry(
        &self,
        inner: &dyn Store,
        shard: Option<u32>,
    ) -> Result<Option<Timestamp>, StoreError> {
        inner.next_lease_expiry(shard).await
    }
}

/// `inner` with `hooks` stepping into its calls.
pub struct Forwarding<H> {
    pub inner: Arc<dyn Store>,
    pub hooks: H,
}

impl<H> Forwarding<H> {
    pub fn new(inner: Arc<dyn Store>, hooks: H) -> Self {
        Forwarding { inner, hooks }
    }
}

impl<H: Hooks> Forwarding<H> {
    fn enter(&self, method: &'static str, shard: Option<u32>) -> Option<Box<dyn Send>> {
        self.hooks.enter(Call { method, shard })
    }
}

#[async_trait]
impl<H: Hooks> Store for Forwarding<H> {
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError> {
        let _g = self.enter("insert", None);
        self.hooks.insert(&*self.inner, tasks).await
    }
    async fn insert_idempotent(
        &self,
        create: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError> {
        let _g = self.enter("insert_idempotent", None);
        self.hooks.insert_idempotent(&*self.inner, create).await
    }
    async fn insert_debounced(
        &self,
        create: DebouncedCreate,
    ) -> Result<DebounceOutcome, StoreError> {
        let _g = self.enter("insert_debounced", None);
        self.hooks.insert_debounced(&*self.inner, create).await
    }
    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        let _g = self.enter("get", None);
        self.inner.get(id).await
    }
    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError> {
        let _g = self.enter("list", None);
        self.inner.list(filter, limit).await
    }
    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let _g = self.enter("cancel", None);
        self.inner.cancel(id, now).await
    }
    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        let _g = self.enter("trigger", None);
        self.inner.trigger(id, now).await
    }
    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError> {
        let _g = self.enter("scan_due", Some(shard));
        self.inner.scan_due(shard, after, until, limit).await
    }
    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError> {
        let _g = self.enter("next_due", Some(shard));
        self.inner.next_due(shard, after).await
    }
    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let _g = self.enter("claim_due", fence.map(|f| f.shard));
        self.hooks.claim_due(&*self.inner, claims, now, fence).await
    }
    async fn claim_ready(&self, claim: ReadyClaim) -> Result<ReadyTaken, StoreError> {
        let _g = self.enter("claim_ready", None);
        self.hooks.claim_ready(&*self.inner, claim).await
    }
    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        let _g = self.enter("heartbeat", None);
        self.inner.heartbeat(id, execution, now).await
    }
    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        let _g = self.enter("complete", None);
        self.hooks
            .complete(&*self.inner, id, execution, now, result)
            .await
    }
    async fn complete_then_claim_ready(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
        claim: ReadyClaim,
    ) -> Result<(Task, ReadyTaken), TransitionError> {
        let _g = self.enter("complete_then_claim_ready", None);
        self.hooks
            .complete_then_claim_ready(&*self.inner, id, execution, now, result, claim)
            .await
    }
    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry: Retry,
    ) -> Result<Task, TransitionError> {
        let _g = self.enter("fail", None);
        self.hooks
            .fail(&*self.inner, id, execution, now, error, retry)
            .await
    }
    async fn expire_leases(
        &self,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<Task>, StoreError> {
        let _g = self.enter("expire_leases", fence.map(|f| f.shard));
        self.hooks
            .expire_leases(&*self.inner, now, limit, fence)
            .await
    }
    async fn next_lease_expiry(&self, shard: Option<u32>) -> Result<Option<Timestamp>, StoreError> {
        let _g = self.enter("next_lease_expiry", shard);
        self.hooks.next_lease_expiry(&*self.inner, shard).await
    }
    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError> {
        let _g = self.enter("count_by_state", None);
        self.inner.count_by_state().await
    }
    fn condition(&self) -> Option<String> {
        self.inner.condition()
    }
    fn out_of_band_mark(&self) -> Option<crate::OutOfBandMark> {
        self.inner.out_of_band_mark()
    }
    async fn dead_groups(
        &self,
        filter: DeadGroupFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeadGroup>, StoreError> {
        let _g = self.enter("dead_groups", None);
        self.inner.dead_groups(filter, limit).await
    }
    async fn queue_settings(&self, queue: &str) -> Result<Option<QueueSettings>, StoreError> {
        let _g = self.enter("queue_settings", None);
        self.inner.queue_settings(queue).await
    }
    async fn list_queue_settings(&self) -> Result<Vec<QueueSettings>, StoreError> {
        let _g = self.enter("list_queue_settings", None);
        self.inner.list_queue_settings().await
    }
    async fn put_queue_config(
        &self,
        queue: &str,
        config: QueueConfig,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let _g = self.enter("put_queue_config", None);
        self.inner.put_queue_config(queue, config, now).await
    }
    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let _g = self.enter("set_queue_paused", None);
        self.inner.set_queue_paused(queue, paused, now).await
    }
    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        let _g = self.enter("earliest_waiting", None);
        self.inner.earliest_waiting(queue).await
    }
    async fn count_rate_limited(&self, queue: &str, now: Timestamp) -> Result<u64, StoreError> {
        let _g = self.enter("count_rate_limited", None);
        self.inner.count_rate_limited(queue, now).await
    }
    async fn attempts(&self, id: TaskId) -> Result<Option<AttemptHistory>, StoreError> {
        let _g = self.enter("attempts", None);
        self.inner.attempts(id).await
    }
    async fn record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: crate::AttemptResponse,
    ) -> Result<bool, StoreError> {
        let _g = self.enter("record_attempt_response", None);
        self.inner
            .record_attempt_response(id, execution, response)
            .await
    }
    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        let _g = self.enter("retry", None);
        self.inner.retry(id, due_at, now).await
    }
    async fn select(&self, filter: &TaskFilter, limit: usize) -> Result<SelectPage, StoreError> {
        let _g = self.enter("select", None);
        self.inner.select(filter, limit).await
    }
    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        let _g = self.enter("cancel_many", None);
        self.inner.cancel_many(ids, now).await
    }
    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        let _g = self.enter("retry_many", None);
        self.inner.retry_many(ids, due_at, now).await
    }
    async fn purge_tasks(
        &self,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        let _g = self.enter("purge_tasks", fence.map(|f| f.shard));
        self.hooks
            .purge_tasks(self.inner.as_ref(), rules, now, limit, fence)
            .await
    }
}
