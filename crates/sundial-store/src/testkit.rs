//! The store conformance suite (feature `testkit`): behaviour every backend must show.
//!
//! Each check is a public async function that takes a fresh, empty store and panics when the store
//! misbehaves. Checks only call the [`Store`] trait: they need no async runtime of their own and read
//! no clock (every `now` is an explicit [`Timestamp`]). A backend runs the whole suite from its
//! test crate with [`store_conformance!`](crate::store_conformance), which expands to one
//! `#[tokio::test]` per check:
//!
//! ```ignore
//! async fn fresh_store() -> (Arc<dyn Store>, tempfile::TempDir) {
//!     let dir = tempfile::tempdir().expect("temp dir");
//!     let store = MyStore::open(dir.path()).expect("open");
//!     (Arc::new(store), dir)
//! }
//!
//! sundial_store::store_conformance!(fresh_store);
//! ```
//!
//! The factory returns a [`Fixture`]: the store alone, or the store with a guard (a temporary
//! directory, a scratch schema) that is dropped once the check is over, or `None` when the backend
//! needs a service this environment lacks (the check then passes without running).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use serde_json::json;
use sundial_core::{
    Backoff, Exclusive, ExclusiveMode, ExecutionId, Limits, NewTask, Priority, PushMethod, Target,
    Task, TaskId, TaskSpec, TaskState, Timestamp, TraceContext,
};
use uuid::Uuid;

use crate::Retry;
use crate::{
    ClaimOutcome, ClaimTarget, DebounceOutcome, DebouncedCreate, DueClaim, DueEntry, DueKey,
    IdempotentCreate, IdempotentOutcome, Inserted, ReadyClaim, ReadyTaken, Remember, Store,
    TaskFilter, TaskPage, TransitionError,
};

/// What a conformance factory hands back, for every suite of this crate: the store under test
/// (`Arc<S>`), alone or with a guard that must live as long as the store is used (dropped after
/// the check, after the store), or an `Option` of either. `None` skips the check: for backends
/// that need an outside service (a database server) which this environment does not provide; the
/// factory says why before returning `None`.
///
/// `S` is the backend's store type (or `dyn Store`); what a suite needs of it ([`Store`],
/// [`ScheduleStore`](crate::ScheduleStore), …) is asked where its checks take the store.
pub trait Fixture {
    type Store: ?Sized;

    /// The store under test, or `None` when the check is to pass without running.
    fn store(&self) -> Option<&Arc<Self::Store>>;
}

impl<S: ?Sized> Fixture for Arc<S> {
    type Store = S;
    fn store(&self) -> Option<&Arc<S>> {
        Some(self)
    }
}

impl<S: ?Sized, G> Fixture for (Arc<S>, G) {
    type Store = S;
    fn store(&self) -> Option<&Arc<S>> {
        Some(&self.0)
    }
}

impl<F: Fixture> Fixture for Option<F> {
    type Store = F::Store;
    fn store(&self) -> Option<&Arc<F::Store>> {
        self.as_ref().and_then(Fixture::store)
    }
}

/// Expands to one `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per conformance
/// check, each with a fresh store from `factory`: an async fn or closure taking no arguments and
/// returning a [`Fixture`](crate::testkit::Fixture) (`Arc<S>`, or `(Arc<S>, guard)`, or an
/// `Option` of either: `None` skips the check).
///
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features. The tests are
/// named after the checks; invoke the macro inside a module to run the suite more than once (for
/// example with different store options).
#[macro_export]
macro_rules! store_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::testkit::$check(store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::store_conformance!(@checks ($factory)
            insert_then_get_round_trips_every_field
            trace_context_stays_through_every_state_change
            insert_batch_returns_results_in_order
            insert_batch_is_atomic
            duplicate_live_key_is_refused
            duplicate_key_within_one_batch_is_refused
            idempotent_create_repeats_conflicts_and_versions
            idempotency_is_remembered_until_the_window_after_the_task_finished
            a_throttle_record_answers_for_its_period_after_it_was_made
            a_debounced_create_replaces_the_pending_task_of_its_key
            concurrent_debounced_creates_leave_one_pending_task
            same_key_in_another_queue_is_allowed
            key_is_released_when_holder_is_terminal
            scan_due_returns_due_scheduled_tasks_of_shard_in_order
            scan_due_pages_with_after_and_limit
            next_due_is_earliest_scheduled_after_cursor
            claim_due_never_claims_before_due
            claim_due_run_starts_an_attempt
            claim_due_ready_makes_task_ready
            claim_due_answers_each_claim_in_order
            claim_due_of_cancelled_task_is_not_claimable
            claim_due_is_exclusive_under_concurrency
            exclusive_key_starts_once_under_concurrency
            group_limit_is_never_exceeded_under_concurrency
            queue_limit_is_never_exceeded_under_concurrency
            a_rate_limit_spaces_starts_by_its_interval
            a_rate_limit_holds_under_concurrent_claims
            a_rate_limit_spaces_worker_takes
            a_rate_limit_spaces_worker_takes_under_concurrent_polls
            exclusive_wait_is_busy_while_key_runs
            exclusive_skip_is_cancelled_while_key_runs
            claim_ready_takes_ready_tasks_in_id_order
            claim_ready_takes_ready_tasks_by_priority_rank
            claim_ready_respects_kinds_filter
            claim_ready_respects_batch_size
            claim_ready_skips_busy_exclusive_keys
            claim_ready_never_returns_a_task_twice_under_concurrency
            claim_ready_never_starts_a_task_before_its_due_time
            a_completion_then_claim_records_then_takes_and_a_refused_one_takes_nothing
            heartbeat_extends_lease
            stale_execution_is_refused
            unknown_task_is_not_found
            complete_stores_result_and_is_terminal
            fail_with_retry_reschedules
            fail_without_retry_is_dead
            fail_retry_follows_the_tasks_backoff_and_attempts
            fenced_owner_writes_need_a_current_fence
            next_lease_expiry_of_one_shard
            cancel_from_live_states
            cancel_from_terminal_is_wrong_state
            the_out_of_band_mark_moves_only_with_writes_that_can_end_a_started_task
            trigger_moves_due_to_now_for_scheduled_only
            expire_leases_reschedules_or_kills
            expire_leases_honours_limit
            next_lease_expiry_is_earliest_running_lease
            count_by_state_follows_transitions
            dead_groups_count_every_dead_task_by_queue_and_error
            list_filters_newest_first
            list_can_leave_out_internal_queues
            list_selects_one_namespace
            list_paginates_without_gaps_or_duplicates
            list_pages_visit_a_bounded_number_of_rows
            terminal_states_never_change
        );
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Shards the suite's tasks are spread over.
pub(crate) const SHARDS: u32 = 4;
/// The suite's origin of time (2023-11-14T22:13:20Z); every `now` is an offset from it.
pub(crate) const T0: i64 = 1_700_000_000_000;
/// A lease length, in milliseconds.
pub(crate) const LEASE: i64 = 30_000;

/// `T0 + ms`.
pub(crate) fn at(ms: i64) -> Timestamp {
    Timestamp(T0 + ms)
}

static ID_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A fresh task id, UUIDv7-shaped: a process-wide counter in the time field makes ids created later
/// sort higher (so "oldest first" and "newest first" are predictable), and random bits after it keep
/// ids unique across processes sharing one database.
pub(crate) fn task_id() -> TaskId {
    let n = ID_SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let mut random = [0u8; 10];
    random.copy_from_slice(&Uuid::new_v4().as_bytes()[6..]);
    TaskId(uuid::Builder::from_unix_timestamp_millis(T0 as u64 + n, &random).into_uuid())
}

pub(crate) fn execution_id() -> ExecutionId {
    ExecutionId(Uuid::new_v4())
}

/// A validated task with a fresh id.
pub(crate) fn make(spec: TaskSpec, now: Timestamp) -> NewTask {
    spec.validate(task_id(), now, SHARDS, &Limits::default())
        .expect("the conformance suite's specs are valid")
}

/// A validated task (without a key) whose fresh id places it on `shard`.
pub(crate) fn make_on_shard(spec: TaskSpec, now: Timestamp, shard: u32) -> NewTask {
    assert!(spec.key.is_none(), "a keyed task's shard follows its key");
    for _ in 0..10_000 {
        let t = make(spec.clone(), now);
        if t.shard == shard {
            return t;
        }
    }
    panic!("no id found for shard {shard}");
}

/// A task of kind `kind` in `queue`, due `due` ms after `T0`, created at `T0`.
pub(crate) fn due_task(queue: &str, kind: &str, due: i64) -> NewTask {
    make(TaskSpec::new(kind).queue(queue).run_at(at(due)), at(0))
}

/// Runs `write` inside a fresh request scope (see [`crate::audit_scope`]) whose record is
/// `action`'s: what `write` returned, and where the record stands after.
pub(crate) async fn in_audit_scope<F: Future>(
    action: &str,
    write: F,
) -> (F::Output, crate::audit_scope::AuditWrite) {
    let scope = crate::audit_scope::AuditScope::new(crate::NewAuditRecord {
        at: at(0),
        actor_id: None,
        actor: "local".into(),
        namespace: "default".into(),
        action: action.into(),
        target: None,
        status: 200,
        request_id: format!("req-{action}"),
    });
    let out = scope.run(write).await;
    (out, scope.write())
}

pub(crate) async fn insert(s: &dyn Store, t: NewTask) -> Task {
    let id = t.id;
    let mut out = s.insert(vec![t]).await.expect("insert");
    assert_eq!(out.len(), 1, "one result per inserted task");
    match out.pop() {
        Some(Inserted::Created(t)) => {
            assert_eq!(t.id, id, "insert returned another task");
            *t
        }
        other => panic!("expected the task to be created, got {other:?}"),
    }
}

async fn insert_all(s: &dyn Store, tasks: Vec<NewTask>) -> Vec<Task> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(insert(s, t).await);
    }
    out
}

pub(crate) async fn get(s: &dyn Store, id: TaskId) -> Task {
    s.get(id)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("task {id} should exist"))
}

pub(crate) async fn claim(
    s: &dyn Store,
    id: TaskId,
    target: ClaimTarget,
    now: Timestamp,
) -> ClaimOutcome {
    let mut out = s
        .claim_due(vec![DueClaim { id, target }], now, None)
        .await
        .expect("claim_due");
    assert_eq!(out.len(), 1, "one outcome per claim");
    out.pop().expect("one outcome")
}

pub(crate) fn run_target(execution: ExecutionId, lease_until: Timestamp) -> ClaimTarget {
    ClaimTarget::Run {
        execution,
        lease_until,
        worker: None,
    }
}

/// Claims a due task with a `Run` target (lease until `lease_until`) and expects it to start.
pub(crate) async fn start_with_lease(
    s: &dyn Store,
    id: TaskId,
    now: Timestamp,
    lease_until: Timestamp,
) -> (ExecutionId, Task) {
    let exec = execution_id();
    match claim(s, id, run_target(exec, lease_until), now).await {
        ClaimOutcome::Started(t) => (exec, *t),
        other => panic!("expected task {id} to start at {now}, got {other:?}"),
    }
}

/// Claims a due task with a `Run` target and a lease of [`LEASE`], and expects it to start.
pub(crate) async fn start(s: &dyn Store, id: TaskId, now: Timestamp) -> (ExecutionId, Task) {
    start_with_lease(s, id, now, Timestamp(now.0 + LEASE)).await
}

/// Claims a due task with a `Ready` target and expects it to become ready.
pub(crate) async fn make_ready(s: &dyn Store, id: TaskId, now: Timestamp) -> Task {
    match claim(s, id, ClaimTarget::Ready, now).await {
        ClaimOutcome::Readied(t) => *t,
        other => panic!("expected task {id} to become ready at {now}, got {other:?}"),
    }
}

pub(crate) fn ready_claim(queue: &str, batch: usize, worker: &str, now: Timestamp) -> ReadyClaim {
    ReadyClaim {
        queue: queue.to_string(),
        kinds: None,
        execution_ids: (0..batch).map(|_| execution_id()).collect(),
        worker: Some(worker.to_string()),
        now,
    }
}

pub(crate) fn ids(tasks: &[Task]) -> Vec<TaskId> {
    tasks.iter().map(|t| t.id).collect()
}

fn assert_not_found<T: Debug>(r: Result<T, TransitionError>, what: &str) {
    match r {
        Err(TransitionError::NotFound) => {}
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

fn assert_wrong_state<T: Debug>(r: Result<T, TransitionError>, state: TaskState, what: &str) {
    match r {
        Err(TransitionError::WrongState { state: s }) if s == state => {}
        other => panic!("{what}: expected WrongState {{ state: {state} }}, got {other:?}"),
    }
}

fn assert_stale<T: Debug>(r: Result<T, TransitionError>, state: TaskState, what: &str) {
    match r {
        Err(TransitionError::StaleExecution { state: s }) if s == state => {}
        other => panic!("{what}: expected StaleExecution {{ state: {state} }}, got {other:?}"),
    }
}

fn assert_not_claimable(outcome: ClaimOutcome, what: &str) {
    assert!(
        matches!(outcome, ClaimOutcome::NotClaimable),
        "{what}: expected NotClaimable, got {outcome:?}"
    );
}

/// Every attempt write with `exec` is refused as stale with `state`.
async fn assert_attempt_writes_stale(
    s: &dyn Store,
    id: TaskId,
    exec: ExecutionId,
    state: TaskState,
    now: Timestamp,
) {
    let lease = Timestamp(now.0 + LEASE);
    assert_stale(s.heartbeat(id, exec, now).await, state, "heartbeat");
    assert_stale(
        s.complete(id, exec, now, Some("1".into())).await,
        state,
        "complete",
    );
    assert_stale(
        s.fail(id, exec, now, "late".into(), Retry::At(lease)).await,
        state,
        "fail with retry",
    );
    assert_stale(
        s.fail(id, exec, now, "late".into(), Retry::Never).await,
        state,
        "fail without retry",
    );
}

/// The store's counts as a map, with zero counts dropped; each `(queue, state)` at most once.
pub(crate) async fn counts(s: &dyn Store) -> HashMap<(String, TaskState), u64> {
    let mut out = HashMap::new();
    for c in s.count_by_state().await.expect("count_by_state") {
        let key = (c.queue.clone(), c.state);
        assert!(
            !out.contains_key(&key),
            "count_by_state reported {}/{} twice",
            c.queue,
            c.state
        );
        if c.count > 0 {
            out.insert(key, c.count);
        }
    }
    out
}

/// The counts the given tasks (read back from the store) add up to.
async fn counts_of(s: &dyn Store, all: &[TaskId]) -> HashMap<(String, TaskState), u64> {
    let mut out = HashMap::new();
    for id in all {
        let t = get(s, *id).await;
        *out.entry((t.queue, t.state)).or_insert(0) += 1;
    }
    out
}

fn count_map(entries: &[(&str, TaskState, u64)]) -> HashMap<(String, TaskState), u64> {
    entries
        .iter()
        .map(|(q, st, n)| ((q.to_string(), *st), *n))
        .collect()
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Drives all futures at once and returns their outputs in order. The store's own threads or
/// connections do the work in parallel; this only keeps several requests in flight together.
async fn join_all<T>(futures: Vec<BoxFuture<'_, T>>) -> Vec<T> {
    let mut futures: Vec<Option<BoxFuture<'_, T>>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (slot, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Insert and get
// ---------------------------------------------------------------------------------------------

/// `insert` then `get` returns every field as given, with the defaults of a fresh task (scheduled,
/// no attempt yet, no lease, no result); an unknown id reads as `None`.
pub async fn insert_then_get_round_trips_every_field(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = at(0);
    let payload = json!({
        "to": "ada@example.com",
        "n": 42,
        "big": u64::MAX,
        "ratio": 1.5,
        "tags": ["a", "ß", "✓", "日本"],
        "nested": {"ok": true, "none": null, "empty": {}},
    });
    let backoff = Backoff {
        initial_ms: 250,
        factor: 3.0,
        max_ms: 60_000,
        jitter: 0.1,
    };
    let mut full = make(
        TaskSpec::new("email.send")
            .queue("mail")
            .key("order-17 / ü")
            .payload(payload.clone())
            .run_at(at(90_000))
            .max_attempts(7)
            .backoff(backoff.clone())
            .timeout(Duration::from_secs(90))
            .concurrency("mailbox:ada", 3)
            .rate(Some("smtp ü".into()), 30, Duration::from_secs(60))
            .priority(Priority::new(8).expect("a priority"))
            .tag("tenant", "ada ü")
            .tag("tier", "gold")
            .target(
                Target::new("https://hooks.example.com/in?b=1&c=ü")
                    .method(PushMethod::Put)
                    .header("X-Tenant", "acme")
                    .timeout(Duration::from_secs(5))
                    .retry_statuses(vec![409, 404]),
            )
            .trace(TraceContext::parse(
                TRACEPARENT,
                Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
            )),
        now,
    );
    // A group limit of 3 in the mode that skips (the builder's `concurrency` waits).
    if let Some(ex) = &mut full.exclusive {
        ex.mode = ExclusiveMode::Skip;
    }
    let expected = Task {
        id: full.id,
        shard: full.shard,
        queue: "mail".into(),
        kind: "email.send".into(),
        key: Some("order-17 / ü".into()),
        payload,
        due_at: at(90_000),
        state: TaskState::Scheduled,
        attempt: 0,
        max_attempts: 7,
        backoff,
        timeout_ms: 90_000,
        exclusive: Some(Exclusive {
            key: "mailbox:ada".into(),
            mode: ExclusiveMode::Skip,
            limit: 3,
        }),
        rate: Some(sundial_core::RateLimit {
            key: Some("smtp ü".into()),
            limit: 30,
            per_ms: 60_000,
        }),
        priority: Priority::new(8).expect("a priority"),
        tags: [("tenant", "ada ü"), ("tier", "gold")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        execution_id: None,
        lease_expires_at: None,
        worker: None,
        last_error: None,
        result: None,
        target: Some(Target {
            url: "https://hooks.example.com/in?b=1&c=ü".into(),
            method: PushMethod::Put,
            headers: [("x-tenant".to_string(), "acme".to_string())].into(),
            timeout_ms: Some(5_000),
            retry_statuses: vec![404, 409],
        }),
        trace: TraceContext::parse(TRACEPARENT, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")),
        created_at: now,
        updated_at: now,
        started_at: None,
        finished_at: None,
    };
    assert_eq!(insert(s, full.clone()).await, expected, "insert's answer");
    assert_eq!(get(s, full.id).await, expected, "get after insert");

    // Defaults: no key, no exclusivity, a null payload, due now.
    let minimal = make(TaskSpec::new("noop"), at(5));
    let expected_minimal = Task {
        id: minimal.id,
        shard: minimal.shard,
        queue: TaskSpec::DEFAULT_QUEUE.into(),
        kind: "noop".into(),
        key: None,
        payload: serde_json::Value::Null,
        due_at: at(5),
        state: TaskState::Scheduled,
        attempt: 0,
        max_attempts: TaskSpec::DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff::default(),
        timeout_ms: 300_000,
        exclusive: None,
        rate: None,
        priority: Priority::DEFAULT,
        tags: Default::default(),
        execution_id: None,
        lease_expires_at: None,
        worker: None,
        last_error: None,
        result: None,
        target: None,
        trace: None,
        created_at: at(5),
        updated_at: at(5),
        started_at: None,
        finished_at: None,
    };
    assert_eq!(insert(s, minimal.clone()).await, expected_minimal);
    assert_eq!(get(s, minimal.id).await, expected_minimal);

    // The other exclusive mode, a fixed backoff and a due time in the past.
    let waiting = make(
        TaskSpec::new("report")
            .payload(json!("just a string"))
            .run_at(Timestamp::MIN)
            .backoff(Backoff::fixed(Duration::from_millis(1_500)))
            .exclusive("reports", ExclusiveMode::Wait),
        now,
    );
    let stored = insert(s, waiting.clone()).await;
    assert_eq!(stored.due_at, Timestamp::MIN);
    assert_eq!(stored.payload, json!("just a string"));
    assert_eq!(stored.backoff, Backoff::fixed(Duration::from_millis(1_500)));
    assert_eq!(
        stored.exclusive,
        Some(Exclusive {
            key: "reports".into(),
            mode: ExclusiveMode::Wait,
            limit: 1,
        })
    );
    assert_eq!(get(s, waiting.id).await, stored);

    assert!(
        s.get(task_id()).await.expect("get").is_none(),
        "an unknown id reads as None"
    );
}

/// A batch insert answers one result per task, in the order given (not id order), and stores every
/// created task; an empty batch does nothing.
pub async fn insert_batch_returns_results_in_order(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = at(0);
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| make(TaskSpec::new("batch").payload(json!({ "i": i })), now))
        .collect();
    let given: Vec<NewTask> = [3, 0, 4, 1, 2].iter().map(|&i| tasks[i].clone()).collect();
    let out = s.insert(given.clone()).await.expect("insert");
    assert_eq!(out.len(), given.len(), "one result per task");
    for (result, t) in out.iter().zip(&given) {
        match result {
            Inserted::Created(created) => {
                assert_eq!(created.id, t.id, "results are in the order given");
                assert_eq!(created.payload.to_string(), t.payload);
                assert_eq!(&get(s, t.id).await, created.as_ref());
            }
            other => panic!("expected Created for {}, got {other:?}", t.id),
        }
    }
    assert!(
        s.insert(Vec::new()).await.expect("empty insert").is_empty(),
        "an empty batch has no results"
    );
    assert_eq!(
        counts(s).await,
        count_map(&[("default", TaskState::Scheduled, 5)])
    );
}

/// A batch that fails (one of its ids is already stored, or appears twice in it) inserts none of its
/// tasks, leaves the stored task with that id as it was, and keeps none of the batch's keys.
pub async fn insert_batch_is_atomic(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = at(0);
    let existing = insert(s, make(TaskSpec::new("a").payload(json!(1)), now)).await;

    let keyed = make(TaskSpec::new("b").queue("q").key("kb"), now);
    let plain = make(TaskSpec::new("c"), now);
    let mut clash = make(TaskSpec::new("d").payload(json!("other")), now);
    clash.id = existing.id;
    let res = s.insert(vec![keyed.clone(), clash, plain.clone()]).await;
    assert!(
        res.is_err(),
        "a batch reusing a stored id must fail, got {res:?}"
    );
    assert!(
        s.get(keyed.id).await.expect("get").is_none(),
        "nothing of a failed batch is kept"
    );
    assert!(
        s.get(plain.id).await.expect("get").is_none(),
        "nothing of a failed batch is kept"
    );
    assert_eq!(
        get(s, existing.id).await,
        existing,
        "the stored task is untouched"
    );

    let first = make(TaskSpec::new("e"), now);
    let mut twin = make(TaskSpec::new("f"), now);
    twin.id = first.id;
    let other = make(TaskSpec::new("g").queue("q").key("kg"), now);
    let res = s.insert(vec![other.clone(), first.clone(), twin]).await;
    assert!(
        res.is_err(),
        "a batch with one id twice must fail, got {res:?}"
    );
    assert!(s.get(other.id).await.expect("get").is_none());
    assert!(s.get(first.id).await.expect("get").is_none());

    // The failed batches' keys were never taken.
    insert(s, keyed).await;
    insert(s, other).await;
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("default", TaskState::Scheduled, 1),
            ("q", TaskState::Scheduled, 2),
        ])
    );
}

/// A task whose `(queue, key)` is held by a live task (scheduled, ready or running) is not stored:
/// its result is `Duplicate` naming the holder.
pub async fn duplicate_live_key_is_refused(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let holder = insert(s, make(TaskSpec::new("k").queue("q").key("K"), at(0))).await;
    for phase in [TaskState::Scheduled, TaskState::Ready, TaskState::Running] {
        match phase {
            TaskState::Ready => {
                make_ready(s, holder.id, at(1)).await;
            }
            TaskState::Running => {
                let got = s
                    .claim_ready(ready_claim("q", 1, "w", at(2)))
                    .await
                    .expect("claim_ready")
                    .tasks;
                assert_eq!(ids(&got), vec![holder.id]);
            }
            _ => {}
        }
        assert_eq!(get(s, holder.id).await.state, phase);
        let dup = make(
            TaskSpec::new("another-kind")
                .queue("q")
                .key("K")
                .payload(json!(2)),
            at(3),
        );
        let out = s.insert(vec![dup.clone()]).await.expect("insert");
        assert_eq!(
            out,
            vec![Inserted::Duplicate {
                existing: holder.id
            }],
            "while the holder is {phase}"
        );
        assert!(
            s.get(dup.id).await.expect("get").is_none(),
            "a duplicate is not stored"
        );
    }
    assert_eq!(counts(s).await, count_map(&[("q", TaskState::Running, 1)]));
}

/// Within one batch the first task with a key is created and later ones with the same
/// `(queue, key)` come back as duplicates of it; the rest of the batch is unaffected.
pub async fn duplicate_key_within_one_batch_is_refused(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = at(0);
    let a = make(TaskSpec::new("k").queue("q").key("K"), now);
    let b = make(TaskSpec::new("k").queue("q").key("L"), now);
    let c = make(TaskSpec::new("k").queue("q").key("K"), now);
    let d = make(TaskSpec::new("k").queue("q"), now);
    let e = make(TaskSpec::new("k").queue("q").key("K"), now);
    let out = s
        .insert(vec![a.clone(), b.clone(), c.clone(), d.clone(), e.clone()])
        .await
        .expect("insert");
    assert_eq!(out.len(), 5);
    assert!(
        matches!(&out[0], Inserted::Created(t) if t.id == a.id),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(&out[1], Inserted::Created(t) if t.id == b.id),
        "{:?}",
        out[1]
    );
    assert_eq!(out[2], Inserted::Duplicate { existing: a.id });
    assert!(
        matches!(&out[3], Inserted::Created(t) if t.id == d.id),
        "{:?}",
        out[3]
    );
    assert_eq!(out[4], Inserted::Duplicate { existing: a.id });
    assert!(s.get(c.id).await.expect("get").is_none());
    assert!(s.get(e.id).await.expect("get").is_none());
    assert_eq!(
        counts(s).await,
        count_map(&[("q", TaskState::Scheduled, 3)])
    );
}

/// The same key is independent in different queues, in separate inserts and within one batch.
pub async fn same_key_in_another_queue_is_allowed(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = at(0);
    insert(s, make(TaskSpec::new("k").queue("q1").key("K"), now)).await;
    insert(s, make(TaskSpec::new("k").queue("q2").key("K"), now)).await;
    let out = s
        .insert(vec![
            make(TaskSpec::new("k").queue("q3").key("K"), now),
            make(TaskSpec::new("k").queue("q4").key("K"), now),
        ])
        .await
        .expect("insert");
    assert!(
        out.iter().all(|r| matches!(r, Inserted::Created(_))),
        "{out:?}"
    );
    let page = s
        .list(
            &TaskFilter {
                key: Some("K".into()),
                ..TaskFilter::default()
            },
            10,
        )
        .await
        .expect("list");
    assert_eq!(page.tasks.len(), 4);
}

/// Once the holder of a key is terminal (cancelled, succeeded or dead) the key can be used again in
/// its queue, and the new task is then the holder.
pub async fn key_is_released_when_holder_is_terminal(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let keyed = |now| make(TaskSpec::new("k").queue("q").key("K"), now);

    let h1 = insert(s, keyed(at(0))).await;
    s.cancel(h1.id, at(1)).await.expect("cancel");

    let h2 = insert(s, keyed(at(2))).await;
    let (e2, _) = start(s, h2.id, at(2)).await;
    s.complete(h2.id, e2, at(3), None).await.expect("complete");

    let h3 = insert(s, keyed(at(4))).await;
    let (e3, _) = start(s, h3.id, at(4)).await;
    s.fail(h3.id, e3, at(5), "boom".into(), Retry::Never)
        .await
        .expect("fail");

    let h4 = insert(s, keyed(at(6))).await;
    let dup = keyed(at(7));
    assert_eq!(
        s.insert(vec![dup]).await.expect("insert"),
        vec![Inserted::Duplicate { existing: h4.id }]
    );
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("q", TaskState::Cancelled, 1),
            ("q", TaskState::Succeeded, 1),
            ("q", TaskState::Dead, 1),
            ("q", TaskState::Scheduled, 1),
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// The due index
// ---------------------------------------------------------------------------------------------

fn due_entry(t: &Task) -> DueEntry {
    DueEntry {
        key: DueKey {
            due_at: t.due_at,
            id: t.id,
        },
        queue: t.queue.clone(),
        kind: t.kind.clone(),
        timeout_ms: t.timeout_ms,
        push_host: t
            .target
            .as_ref()
            .and_then(|x| sundial_core::authority(&x.url)),
        priority: t.priority,
    }
}

/// `scan_due` lists the `scheduled` tasks of one shard with `due_at <= until` (inclusive), in
/// `(due_at, id)` order, with their queue and kind; other shards, later tasks and tasks that are
/// ready, running or cancelled are left out.
pub async fn scan_due_returns_due_scheduled_tasks_of_shard_in_order(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let shard = 1;
    let on = |queue: &str, kind: &str, due: i64, shard: u32| {
        make_on_shard(
            TaskSpec::new(kind).queue(queue).run_at(at(due)),
            at(0),
            shard,
        )
    };
    // Made in an order where ids do not follow due times.
    let late = on("scan", "late", 30, shard);
    let edge = on("scan", "edge", 20, shard);
    let b10 = on("scan", "b", 10, shard);
    let a10 = on("scan", "a", 10, shard);
    let early = on("scan-other", "x", 5, shard);
    let readied = on("scan", "readied", 15, shard);
    let running = on("scan", "running", 8, shard);
    let cancelled = on("scan", "cancelled", 12, shard);
    let past = on("scan", "past", -1_000, shard);
    let elsewhere = on("scan", "elsewhere", 5, 2);
    let all = vec![
        a10.clone(),
        readied.clone(),
        late.clone(),
        past.clone(),
        elsewhere.clone(),
        running.clone(),
        edge.clone(),
        cancelled.clone(),
        early.clone(),
        b10.clone(),
    ];
    let out = s.insert(all).await.expect("insert");
    assert!(out.iter().all(|r| matches!(r, Inserted::Created(_))));
    make_ready(s, readied.id, at(15)).await;
    start(s, running.id, at(8)).await;
    s.cancel(cancelled.id, at(1)).await.expect("cancel");

    let mut expected = Vec::new();
    for t in [&past, &early, &b10, &a10, &edge] {
        expected.push(due_entry(&get(s, t.id).await));
    }
    expected.sort_by_key(|e| e.key);
    let got = s
        .scan_due(shard, None, at(20), 100)
        .await
        .expect("scan_due");
    assert_eq!(got, expected);

    let got = s.scan_due(2, None, at(20), 100).await.expect("scan_due");
    assert_eq!(got, vec![due_entry(&get(s, elsewhere.id).await)]);
    assert!(
        s.scan_due(shard, None, at(-1_001), 100)
            .await
            .expect("scan_due")
            .is_empty(),
        "nothing is due before the earliest due time"
    );
    assert!(
        s.scan_due(3, None, at(1_000), 100)
            .await
            .expect("scan_due")
            .is_empty(),
        "an empty shard has nothing due"
    );
    let got = s
        .scan_due(shard, None, at(1_000), 100)
        .await
        .expect("scan_due");
    assert_eq!(got.len(), 6, "with a later bound, the late task is due too");
    assert_eq!(got[5].key.id, late.id);
}

/// `scan_due` continues strictly after the `after` cursor (also between tasks due at the same time)
/// and returns at most `limit` entries; paging with the last key as cursor visits each due task once.
pub async fn scan_due_pages_with_after_and_limit(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let dues = [3, 1, 3, 2, 3, 5, 1, 4];
    let tasks: Vec<NewTask> = dues
        .iter()
        .map(|d| make_on_shard(TaskSpec::new("page").run_at(at(*d)), at(0), 0))
        .collect();
    insert_all(s, tasks).await;
    let until = at(10);
    let full = s.scan_due(0, None, until, 100).await.expect("scan_due");
    assert_eq!(full.len(), dues.len());
    assert!(
        full.windows(2).all(|w| w[0].key < w[1].key),
        "entries are in strictly increasing (due_at, id) order"
    );

    assert_eq!(
        s.scan_due(0, None, until, 3).await.expect("scan_due"),
        full[..3].to_vec()
    );
    assert!(
        s.scan_due(0, None, until, 0)
            .await
            .expect("scan_due")
            .is_empty()
    );

    let mut paged = Vec::new();
    let mut after = None;
    let mut sizes = Vec::new();
    loop {
        let page = s.scan_due(0, after, until, 3).await.expect("scan_due");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        sizes.push(page.len());
        after = page.last().map(|e| e.key);
        paged.extend(page);
        assert!(sizes.len() <= dues.len(), "paging does not end");
    }
    assert_eq!(paged, full);
    assert_eq!(sizes, vec![3, 3, 2]);

    // A cursor between two tasks due at the same time.
    let i = (0..full.len() - 1)
        .find(|&i| full[i].key.due_at == full[i + 1].key.due_at)
        .expect("two tasks share a due time");
    assert_eq!(
        s.scan_due(0, Some(full[i].key), until, 100)
            .await
            .expect("scan_due"),
        full[i + 1..].to_vec()
    );
    // Cursors that are not task keys.
    let from_three: Vec<DueEntry> = full
        .iter()
        .filter(|e| e.key.due_at >= at(3))
        .cloned()
        .collect();
    let low = DueKey {
        due_at: at(3),
        id: TaskId::MIN,
    };
    assert_eq!(
        s.scan_due(0, Some(low), until, 100)
            .await
            .expect("scan_due"),
        from_three
    );
    let high = DueKey {
        due_at: at(3),
        id: TaskId::MAX,
    };
    let after_three: Vec<DueEntry> = full
        .iter()
        .filter(|e| e.key.due_at > at(3))
        .cloned()
        .collect();
    assert_eq!(
        s.scan_due(0, Some(high), until, 100)
            .await
            .expect("scan_due"),
        after_three
    );
    // `until` still applies after a cursor.
    assert_eq!(
        s.scan_due(0, Some(low), at(3), 100)
            .await
            .expect("scan_due"),
        full.iter()
            .filter(|e| e.key.due_at == at(3))
            .cloned()
            .collect::<Vec<_>>()
    );
}

/// `next_due` is the earliest due time among scheduled tasks of the shard strictly after the cursor,
/// however far ahead; other shards and tasks that are not scheduled do not count.
pub async fn next_due_is_earliest_scheduled_after_cursor(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.next_due(0, None).await.expect("next_due"), None);
    let on0 = |due: i64| make_on_shard(TaskSpec::new("n").run_at(at(due)), at(0), 0);
    let far_due = 10 * 365 * 86_400_000;
    let a = insert(s, on0(50)).await;
    let b = insert(s, on0(20)).await;
    let c = insert(s, on0(20)).await;
    let far = insert(s, on0(far_due)).await;
    let readied = insert(s, on0(5)).await;
    make_ready(s, readied.id, at(5)).await;
    let running = insert(s, on0(6)).await;
    start(s, running.id, at(6)).await;
    insert(s, make_on_shard(TaskSpec::new("n").run_at(at(1)), at(0), 1)).await;

    assert_eq!(s.next_due(0, None).await.expect("next_due"), Some(at(20)));
    let mut keys: Vec<DueKey> = [&a, &b, &c, &far]
        .iter()
        .map(|t| DueKey {
            due_at: t.due_at,
            id: t.id,
        })
        .collect();
    keys.sort();
    let expect = [Some(at(20)), Some(at(50)), Some(at(far_due)), None];
    for (key, want) in keys.iter().zip(expect) {
        assert_eq!(
            s.next_due(0, Some(*key)).await.expect("next_due"),
            want,
            "after {key:?}"
        );
    }
    assert_eq!(s.next_due(1, None).await.expect("next_due"), Some(at(1)));
    assert_eq!(s.next_due(2, None).await.expect("next_due"), None);

    for t in [&a, &b, &c] {
        s.cancel(t.id, at(7)).await.expect("cancel");
    }
    assert_eq!(
        s.next_due(0, None).await.expect("next_due"),
        Some(at(far_due))
    );
}

// ---------------------------------------------------------------------------------------------
// Claiming due tasks
// ---------------------------------------------------------------------------------------------

/// A claim succeeds only once `due_at <= now`: before that, either target is `NotClaimable` and the
/// task is unchanged.
pub async fn claim_due_never_claims_before_due(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 100)).await;
    let exec = execution_id();
    assert_not_claimable(
        claim(s, t.id, run_target(exec, at(99 + LEASE)), at(99)).await,
        "run claim before due",
    );
    assert_not_claimable(
        claim(s, t.id, ClaimTarget::Ready, at(99)).await,
        "ready claim before due",
    );
    assert_not_claimable(
        claim(s, t.id, run_target(exec, at(LEASE)), at(0)).await,
        "run claim long before due",
    );
    assert_eq!(get(s, t.id).await, t, "a refused claim changes nothing");
    let (_, started) = start(s, t.id, at(100)).await;
    assert_eq!(started.attempt, 1, "due_at == now is due");
}

/// A `Run` claim moves a due task to `running` with attempt + 1, the claim's execution id and lease,
/// `started_at = updated_at = now`, and nothing else changed; a second claim is `NotClaimable`; after
/// a retry the next claim is attempt 2 with its own execution id.
pub async fn claim_due_run_starts_an_attempt(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(
        s,
        make(TaskSpec::new("k").queue("q").max_attempts(3), at(0)),
    )
    .await;
    let exec = execution_id();
    let outcome = claim(s, t.id, run_target(exec, at(10 + LEASE)), at(10)).await;
    let expected = Task {
        state: TaskState::Running,
        attempt: 1,
        execution_id: Some(exec),
        lease_expires_at: Some(at(10 + LEASE)),
        started_at: Some(at(10)),
        updated_at: at(10),
        ..t.clone()
    };
    match outcome {
        ClaimOutcome::Started(got) => assert_eq!(*got, expected),
        other => panic!("expected Started, got {other:?}"),
    }
    assert_eq!(get(s, t.id).await, expected);

    assert_not_claimable(
        claim(s, t.id, run_target(execution_id(), at(11 + LEASE)), at(11)).await,
        "second run claim",
    );
    assert_not_claimable(
        claim(s, t.id, ClaimTarget::Ready, at(11)).await,
        "ready claim of a running task",
    );
    assert_eq!(get(s, t.id).await, expected);

    s.fail(t.id, exec, at(20), "try again".into(), Retry::At(at(30)))
        .await
        .expect("fail");
    let (exec2, again) = start(s, t.id, at(30)).await;
    assert_ne!(exec2, exec);
    assert_eq!(again.attempt, 2);
    assert_eq!(again.execution_id, Some(exec2));
    assert_eq!(again.started_at, Some(at(30)));
    assert_eq!(again.state, TaskState::Running);

    // A start made for a waiting poll names the poll's worker, as a poll's claim does.
    s.fail(t.id, exec2, at(40), "again".into(), Retry::At(at(50)))
        .await
        .expect("fail");
    let for_poll = ClaimTarget::Run {
        execution: execution_id(),
        lease_until: at(50 + LEASE),
        worker: Some("w-7".into()),
    };
    match claim(s, t.id, for_poll, at(50)).await {
        ClaimOutcome::Started(got) => assert_eq!(got.worker.as_deref(), Some("w-7")),
        other => panic!("expected Started, got {other:?}"),
    }
    assert_eq!(get(s, t.id).await.worker.as_deref(), Some("w-7"));
}

/// A `Ready` claim moves a due task to `ready` without starting an attempt; it leaves the due index,
/// a second claim is `NotClaimable`, and a worker can then take it.
pub async fn claim_due_ready_makes_task_ready(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 0)).await;
    let got = make_ready(s, t.id, at(5)).await;
    let expected = Task {
        state: TaskState::Ready,
        updated_at: at(5),
        ..t.clone()
    };
    assert_eq!(got, expected);
    assert_eq!(get(s, t.id).await, expected);
    assert!(
        s.scan_due(t.shard, None, at(1_000), 10)
            .await
            .expect("scan_due")
            .is_empty(),
        "a ready task is not in the due index"
    );
    assert_eq!(s.next_due(t.shard, None).await.expect("next_due"), None);
    assert_not_claimable(
        claim(s, t.id, ClaimTarget::Ready, at(6)).await,
        "second ready claim",
    );
    assert_not_claimable(
        claim(s, t.id, run_target(execution_id(), at(6 + LEASE)), at(6)).await,
        "run claim of a ready task",
    );
    let taken = s
        .claim_ready(ready_claim("q", 1, "w", at(7)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&taken), vec![t.id]);
    assert_eq!(taken[0].attempt, 1);
}

/// `claim_due` answers every claim of a batch, in order: due tasks are taken, while tasks not yet
/// due, cancelled, unknown or already taken earlier in the same batch are `NotClaimable`.
pub async fn claim_due_answers_each_claim_in_order(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let a = insert(s, due_task("q", "a", 0)).await;
    let b = insert(s, due_task("q", "b", 500)).await;
    let c = insert(s, due_task("q", "c", 0)).await;
    s.cancel(c.id, at(1)).await.expect("cancel");
    let d = insert(s, due_task("q", "d", 0)).await;
    let (ea, ea2) = (execution_id(), execution_id());
    let lease = at(10 + LEASE);
    let claims = vec![
        DueClaim {
            id: a.id,
            target: run_target(ea, lease),
        },
        DueClaim {
            id: b.id,
            target: run_target(execution_id(), lease),
        },
        DueClaim {
            id: c.id,
            target: run_target(execution_id(), lease),
        },
        DueClaim {
            id: d.id,
            target: ClaimTarget::Ready,
        },
        DueClaim {
            id: task_id(),
            target: ClaimTarget::Ready,
        },
        DueClaim {
            id: a.id,
            target: run_target(ea2, lease),
        },
    ];
    let out = s.claim_due(claims, at(10), None).await.expect("claim_due");
    assert_eq!(out.len(), 6, "one outcome per claim: {out:?}");
    assert!(
        matches!(&out[0], ClaimOutcome::Started(t) if t.id == a.id && t.execution_id == Some(ea)),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(out[1], ClaimOutcome::NotClaimable),
        "not due: {:?}",
        out[1]
    );
    assert!(
        matches!(out[2], ClaimOutcome::NotClaimable),
        "cancelled: {:?}",
        out[2]
    );
    assert!(
        matches!(&out[3], ClaimOutcome::Readied(t) if t.id == d.id),
        "{:?}",
        out[3]
    );
    assert!(
        matches!(out[4], ClaimOutcome::NotClaimable),
        "unknown: {:?}",
        out[4]
    );
    assert!(
        matches!(out[5], ClaimOutcome::NotClaimable),
        "taken: {:?}",
        out[5]
    );
    assert_eq!(get(s, a.id).await.execution_id, Some(ea));
    assert_eq!(get(s, b.id).await, b);
    assert!(
        s.claim_due(Vec::new(), at(10), None)
            .await
            .expect("claim_due")
            .is_empty()
    );
}

/// A cancelled task is `NotClaimable` for either target, however long past due, and stays cancelled.
pub async fn claim_due_of_cancelled_task_is_not_claimable(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 0)).await;
    let cancelled = s.cancel(t.id, at(1)).await.expect("cancel");
    assert_not_claimable(
        claim(
            s,
            t.id,
            run_target(execution_id(), at(1_000 + LEASE)),
            at(1_000),
        )
        .await,
        "run claim of a cancelled task",
    );
    assert_not_claimable(
        claim(s, t.id, ClaimTarget::Ready, at(1_000)).await,
        "ready claim of a cancelled task",
    );
    assert_eq!(get(s, t.id).await, cancelled);
}

/// Concurrent claims of one due task: exactly one starts it, the others are `NotClaimable`, and the
/// task carries the winner's execution id.
pub async fn claim_due_is_exclusive_under_concurrency(store: Arc<dyn Store>) {
    let s = store.as_ref();
    for round in 0..8 {
        let t = insert(s, due_task("q", "race", 0)).await;
        let execs: Vec<ExecutionId> = (0..4).map(|_| execution_id()).collect();
        let now = at(10 + round);
        let futures = execs
            .iter()
            .map(|e| {
                s.claim_due(
                    vec![DueClaim {
                        id: t.id,
                        target: run_target(*e, Timestamp(now.0 + LEASE)),
                    }],
                    now,
                    None,
                )
            })
            .collect();
        let outcomes = join_all(futures).await;
        let mut winners = Vec::new();
        for (exec, out) in execs.iter().zip(outcomes) {
            let mut out = out.expect("claim_due");
            assert_eq!(out.len(), 1);
            match out.pop().expect("one outcome") {
                ClaimOutcome::Started(started) => {
                    assert_eq!(started.execution_id, Some(*exec));
                    winners.push(*exec);
                }
                ClaimOutcome::NotClaimable => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one concurrent claim wins");
        let stored = get(s, t.id).await;
        assert_eq!(stored.execution_id, Some(winners[0]));
        assert_eq!(stored.attempt, 1);
    }
}

/// Concurrent calls that could start *different* tasks sharing an exclusive key (`claim_due`
/// batches naming two keys in opposite orders, single claims, and `claim_ready` calls, all at
/// once) start exactly one task per key; the other due tasks are `Busy` and stay scheduled, and no
/// call fails.
pub async fn exclusive_key_starts_once_under_concurrency(store: Arc<dyn Store>) {
    let s = store.as_ref();
    for round in 0..6 {
        let queue = format!("excl-{round}");
        let (k1, k2) = (format!("A{round}"), format!("B{round}"));
        let excl = |key: &str| {
            make(
                TaskSpec::new("k")
                    .queue(queue.as_str())
                    .exclusive(key, ExclusiveMode::Wait),
                at(0),
            )
        };
        let now = at(10 + round);
        let (mut due1, mut due2) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            due1.push(insert(s, excl(&k1)).await.id);
            due2.push(insert(s, excl(&k2)).await.id);
        }
        for key in [&k1, &k2] {
            for _ in 0..2 {
                let t = insert(s, excl(key)).await;
                make_ready(s, t.id, now).await;
            }
        }
        let run = |id: TaskId| DueClaim {
            id,
            target: run_target(execution_id(), Timestamp(now.0 + LEASE)),
        };
        let batches = [
            vec![run(due1[0]), run(due2[0]), run(due1[1])],
            vec![run(due2[1]), run(due1[2]), run(due2[2])],
            vec![run(due1[3])],
            vec![run(due2[3])],
        ];
        let mut due_calls: Vec<BoxFuture<'_, _>> = Vec::new();
        for b in &batches {
            due_calls.push(s.claim_due(b.clone(), now, None));
        }
        let ready_calls: Vec<BoxFuture<'_, _>> = (0..2)
            .map(|i| s.claim_ready(ready_claim(&queue, 4, &format!("w{i}"), now)))
            .collect();
        let (due_out, ready_out) = poll_fn_join(join_all(due_calls), join_all(ready_calls)).await;
        let mut started: Vec<TaskId> = Vec::new();
        for (batch, out) in batches.iter().zip(due_out) {
            let out = out.expect("claim_due");
            assert_eq!(out.len(), batch.len(), "one outcome per claim");
            for (claim, outcome) in batch.iter().zip(out) {
                match outcome {
                    ClaimOutcome::Started(t) => {
                        assert_eq!(t.id, claim.id);
                        started.push(t.id);
                    }
                    ClaimOutcome::Busy { exclusive_key } => {
                        assert!(exclusive_key == k1 || exclusive_key == k2);
                        assert_eq!(get(s, claim.id).await.state, TaskState::Scheduled);
                    }
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
        }
        for out in ready_out {
            started.extend(ids(&out.expect("claim_ready").tasks));
        }
        let running = s
            .list(
                &TaskFilter {
                    queue: Some(queue.clone()),
                    state: Some(TaskState::Running),
                    ..TaskFilter::default()
                },
                100,
            )
            .await
            .expect("list")
            .tasks;
        let mut started_sorted = started.clone();
        started_sorted.sort();
        let mut running_ids = ids(&running);
        running_ids.sort();
        assert_eq!(started_sorted, running_ids, "every start is reported once");
        for key in [&k1, &k2] {
            let holders = running
                .iter()
                .filter(|t| t.exclusive.as_ref().is_some_and(|e| &e.key == key))
                .count();
            assert_eq!(holders, 1, "round {round}: tasks running with key {key}");
        }
    }
}

/// How many tasks of `queue` run.
async fn running_in(s: &dyn Store, queue: &str) -> usize {
    s.list(
        &TaskFilter {
            queue: Some(queue.to_string()),
            state: Some(TaskState::Running),
            ..TaskFilter::default()
        },
        100,
    )
    .await
    .expect("list")
    .tasks
    .len()
}

/// A group limit of 3 (`TaskSpec::concurrency`): concurrent `claim_due` batches and
/// `claim_ready` calls start exactly 3 tasks with the key; the other due tasks are `Busy` and stay
/// scheduled. When one of the 3 finishes, the next claim starts one more, and only one.
pub async fn group_limit_is_never_exceeded_under_concurrency(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let queue = "group-limit";
    let group = |s: &str| make(TaskSpec::new("k").queue(queue).concurrency(s, 3), at(0));
    let now = at(10);
    let mut due = Vec::new();
    for _ in 0..9 {
        due.push(insert(s, group("G")).await.id);
    }
    for _ in 0..2 {
        let t = insert(s, group("G")).await;
        make_ready(s, t.id, now).await;
    }
    let run = |id: TaskId| DueClaim {
        id,
        target: run_target(execution_id(), Timestamp(now.0 + LEASE)),
    };
    let batches: Vec<Vec<DueClaim>> = due[..9]
        .chunks(3)
        .map(|c| c.iter().copied().map(run).collect())
        .collect();
    let mut due_calls: Vec<BoxFuture<'_, _>> = Vec::new();
    for b in &batches {
        due_calls.push(s.claim_due(b.clone(), now, None));
    }
    let ready_calls: Vec<BoxFuture<'_, _>> = (0..2)
        .map(|i| s.claim_ready(ready_claim(queue, 4, &format!("w{i}"), now)))
        .collect();
    let (due_out, ready_out) = poll_fn_join(join_all(due_calls), join_all(ready_calls)).await;
    let mut started: Vec<Task> = Vec::new();
    let mut busy: Vec<TaskId> = Vec::new();
    for (batch, out) in batches.iter().zip(due_out) {
        for (claim, outcome) in batch.iter().zip(out.expect("claim_due")) {
            match outcome {
                ClaimOutcome::Started(t) => started.push(*t),
                ClaimOutcome::Busy { exclusive_key } => {
                    assert_eq!(exclusive_key, "G");
                    assert_eq!(get(s, claim.id).await.state, TaskState::Scheduled);
                    busy.push(claim.id);
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }
    for out in ready_out {
        started.extend(out.expect("claim_ready").tasks);
    }
    assert_eq!(started.len(), 3, "started {:?}", ids(&started));
    assert_eq!(running_in(s, queue).await, 3);
    let first = &started[0];
    let exec = first.execution_id.expect("an execution");
    s.complete(first.id, exec, at(11), None)
        .await
        .expect("complete");
    let again = s
        .claim_due(busy.iter().copied().map(run).collect(), at(11), None)
        .await
        .expect("claim_due");
    let now_started = again
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Started(_)))
        .count();
    assert_eq!(now_started, 1, "{again:?}");
    assert_eq!(running_in(s, queue).await, 3);
}

/// A queue limit of 3 (`QueueConfig::concurrency`): concurrent `claim_due` batches and
/// `claim_ready` calls start exactly 3 of the queue's tasks; the other due starts are
/// `QueueFull` and stay scheduled, while readying is not limited (a ready task runs nothing).
/// When one of the 3 finishes, the next claim starts one more, and only one; another queue's
/// tasks are not held back; a removed limit frees the rest.
pub async fn queue_limit_is_never_exceeded_under_concurrency(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let queue = "queue-limit";
    let limited = crate::QueueConfig {
        concurrency: Some(3),
        ..crate::QueueConfig::default()
    };
    s.put_queue_config(queue, limited, at(0))
        .await
        .expect("configure");
    let plain = || make(TaskSpec::new("k").queue(queue), at(0));
    let now = at(10);
    let mut due = Vec::new();
    for _ in 0..9 {
        due.push(insert(s, plain()).await.id);
    }
    let mut ready = Vec::new();
    for _ in 0..2 {
        let t = insert(s, plain()).await;
        make_ready(s, t.id, now).await;
        ready.push(t.id);
    }
    let other = insert(s, make(TaskSpec::new("k").queue("queue-free"), at(0)))
        .await
        .id;
    let run = |id: TaskId| DueClaim {
        id,
        target: run_target(execution_id(), Timestamp(now.0 + LEASE)),
    };
    let batches: Vec<Vec<DueClaim>> = due[..9]
        .chunks(3)
        .map(|c| c.iter().copied().map(run).collect())
        .collect();
    let mut due_calls: Vec<BoxFuture<'_, _>> = Vec::new();
    for b in &batches {
        due_calls.push(s.claim_due(b.clone(), now, None));
    }
    let ready_calls: Vec<BoxFuture<'_, _>> = (0..2)
        .map(|i| s.claim_ready(ready_claim(queue, 4, &format!("w{i}"), now)))
        .collect();
    let (due_out, ready_out) = poll_fn_join(join_all(due_calls), join_all(ready_calls)).await;
    let mut started: Vec<Task> = Vec::new();
    let mut full: Vec<TaskId> = Vec::new();
    for (batch, out) in batches.iter().zip(due_out) {
        for (claim, outcome) in batch.iter().zip(out.expect("claim_due")) {
            match outcome {
                ClaimOutcome::Started(t) => started.push(*t),
                ClaimOutcome::QueueFull { queue: q } => {
                    assert_eq!(q, queue);
                    assert_eq!(get(s, claim.id).await.state, TaskState::Scheduled);
                    full.push(claim.id);
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }
    for out in ready_out {
        started.extend(out.expect("claim_ready").tasks);
    }
    assert_eq!(started.len(), 3, "started {:?}", ids(&started));
    assert_eq!(running_in(s, queue).await, 3);

    // Another queue's start and a readying are not held back.
    let out = s
        .claim_due(
            vec![
                run(other),
                DueClaim {
                    id: full[0],
                    target: ClaimTarget::Ready,
                },
            ],
            now,
            None,
        )
        .await
        .expect("claim_due");
    assert!(matches!(out[0], ClaimOutcome::Started(_)), "{out:?}");
    assert!(matches!(out[1], ClaimOutcome::Readied(_)), "{out:?}");
    let full = &full[1..];
    assert!(
        s.claim_ready(ready_claim(queue, 4, "w", now))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty(),
        "a full queue starts nothing for a worker"
    );

    // One finishes: one more starts, and only one.
    let first = &started[0];
    let exec = first.execution_id.expect("an execution");
    s.complete(first.id, exec, at(11), None)
        .await
        .expect("complete");
    let again = s
        .claim_due(full.iter().copied().map(run).collect(), at(11), None)
        .await
        .expect("claim_due");
    let now_started = again
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Started(_)))
        .count();
    assert_eq!(now_started, 1, "{again:?}");
    assert_eq!(running_in(s, queue).await, 3);
    let second = &started[1];
    s.complete(
        second.id,
        second.execution_id.expect("an execution"),
        at(12),
        None,
    )
    .await
    .expect("complete");
    let polled = s
        .claim_ready(ready_claim(queue, 4, "w", at(12)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(polled.len(), 1, "a worker takes the one free place");
    assert_eq!(running_in(s, queue).await, 3);

    // Without the limit, the rest start.
    s.put_queue_config(queue, crate::QueueConfig::default(), at(13))
        .await
        .expect("configure");
    let rest = s
        .claim_due(full.iter().copied().map(run).collect(), at(13), None)
        .await
        .expect("claim_due");
    assert!(
        rest.iter()
            .all(|o| matches!(o, ClaimOutcome::Started(_) | ClaimOutcome::NotClaimable)),
        "{rest:?}"
    );
    assert_eq!(running_in(s, queue).await, 3 + full.len() - 1);
}

/// A rate limit (2 per second: one start per 500 ms) lets one of its key's due tasks start
/// (or become ready) and refuses the others with the time of the next start, until then; a
/// task without a rate key counts under its queue's own limit, apart from other queues.
pub async fn a_rate_limit_spaces_starts_by_its_interval(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let rated = |key: Option<&str>, queue: &str| {
        make(
            TaskSpec::new("k").queue(queue).rate(
                key.map(str::to_string),
                2,
                Duration::from_secs(1),
            ),
            at(0),
        )
    };
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            insert(s, rated(Some("api"), if i % 2 == 0 { "ra" } else { "rb" }))
                .await
                .id,
        );
    }
    let run = |id: TaskId, now: Timestamp| DueClaim {
        id,
        target: run_target(execution_id(), Timestamp(now.0 + LEASE)),
    };
    let out = s
        .claim_due(
            ids.iter().map(|id| run(*id, at(10))).collect(),
            at(10),
            None,
        )
        .await
        .expect("claim_due");
    assert!(matches!(out[0], ClaimOutcome::Started(_)), "{out:?}");
    for o in &out[1..] {
        match o {
            ClaimOutcome::RateLimited {
                key,
                until,
                interval_ms,
            } => {
                assert_eq!(key, "api");
                assert_eq!(*until, at(510));
                assert_eq!(*interval_ms, 500);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    for id in &ids[1..] {
        assert_eq!(get(s, *id).await.state, TaskState::Scheduled);
    }
    // Waiting for the limit, per queue: ra holds ids 0 (started) and 2, rb 1 and 3.
    assert_eq!(s.count_rate_limited("ra", at(10)).await.expect("count"), 1);
    assert_eq!(s.count_rate_limited("rb", at(10)).await.expect("count"), 2);
    assert_eq!(
        s.count_rate_limited("rb", Timestamp(-1))
            .await
            .expect("count"),
        0
    );
    // Not before the interval has passed.
    let out = s
        .claim_due(vec![run(ids[1], at(509))], at(509), None)
        .await
        .expect("claim_due");
    assert!(
        matches!(out[0], ClaimOutcome::RateLimited { .. }),
        "{out:?}"
    );
    // Then one more, as a ready claim (a worker queue's task counts when it becomes ready).
    let out = s
        .claim_due(
            vec![
                DueClaim {
                    id: ids[1],
                    target: ClaimTarget::Ready,
                },
                run(ids[2], at(510)),
            ],
            at(510),
            None,
        )
        .await
        .expect("claim_due");
    assert!(matches!(out[0], ClaimOutcome::Readied(_)), "{out:?}");
    assert!(
        matches!(&out[1], ClaimOutcome::RateLimited { until, .. } if *until == at(1_010)),
        "{out:?}"
    );

    // Without a key, each queue has a limit of its own.
    let qa = insert(s, rated(None, "ra")).await.id;
    let qa2 = insert(s, rated(None, "ra")).await.id;
    let qb = insert(s, rated(None, "rb")).await.id;
    let out = s
        .claim_due(
            vec![run(qa, at(600)), run(qa2, at(600)), run(qb, at(600))],
            at(600),
            None,
        )
        .await
        .expect("claim_due");
    assert!(matches!(out[0], ClaimOutcome::Started(_)), "{out:?}");
    assert!(
        matches!(out[1], ClaimOutcome::RateLimited { .. }),
        "{out:?}"
    );
    assert!(matches!(out[2], ClaimOutcome::Started(_)), "{out:?}");
}

/// Claims racing for one rate limit key's due tasks: one start per interval, whichever call
/// wins, and the others refused.
pub async fn a_rate_limit_holds_under_concurrent_claims(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut ids = Vec::new();
    for _ in 0..12 {
        let t = make(
            TaskSpec::new("k").queue("rate-race").rate(
                Some("race".into()),
                10,
                Duration::from_secs(1),
            ),
            at(0),
        );
        ids.push(insert(s, t).await.id);
    }
    let now = at(10);
    let batches: Vec<Vec<DueClaim>> = ids
        .chunks(3)
        .map(|c| {
            c.iter()
                .map(|id| DueClaim {
                    id: *id,
                    target: run_target(execution_id(), Timestamp(now.0 + LEASE)),
                })
                .collect()
        })
        .collect();
    let calls: Vec<BoxFuture<'_, _>> = batches
        .iter()
        .map(|b| s.claim_due(b.clone(), now, None))
        .collect();
    let mut started = 0;
    let mut limited = 0;
    for out in join_all(calls).await {
        for o in out.expect("claim_due") {
            match o {
                ClaimOutcome::Started(_) => started += 1,
                ClaimOutcome::RateLimited { until, .. } => {
                    assert_eq!(until, at(110));
                    limited += 1;
                }
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }
    assert_eq!((started, limited), (1, 11));
}

/// Readies `n` tasks of worker queue `queue` under a rate limit of 10 a second (one turn every
/// 100 ms, the queue's own key), one readying turn apart from `at(0)` on, as the shard loop
/// would; then no worker has taken any of them.
async fn ready_rated(s: &dyn Store, queue: &str, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let t = make(
            TaskSpec::new("k")
                .queue(queue)
                .rate(None, 10, Duration::from_secs(1)),
            at(0),
        );
        ids.push(insert(s, t).await.id);
    }
    for (i, id) in ids.iter().enumerate() {
        let now = at(100 * i as i64);
        let out = s
            .claim_due(
                vec![DueClaim {
                    id: *id,
                    target: ClaimTarget::Ready,
                }],
                now,
                None,
            )
            .await
            .expect("claim_due");
        assert!(matches!(out[0], ClaimOutcome::Readied(_)), "{out:?}");
    }
    ids
}

/// Workers that were away find a queue's rate-limited tasks ready, all readied at their turns;
/// their polls still take them one turn apart, never the pile at once, and a ready task
/// without a limit is not held back by them.
pub async fn a_rate_limit_spaces_worker_takes(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let rated = ready_rated(s, "rate-take", 4).await;
    let free = insert(s, due_task("rate-take", "k", 0)).await;
    make_ready(s, free.id, at(1)).await;
    let back = at(10_000);
    let first = s
        .claim_ready(ready_claim("rate-take", 4, "w", back))
        .await
        .expect("claim_ready");
    let mut taken = ids(&first.tasks);
    taken.sort();
    let mut want = vec![rated[0], free.id];
    want.sort();
    assert_eq!(taken, want, "one rated task, and the one without a limit");
    assert_eq!(
        first.next_turn,
        Some(at(10_100)),
        "the next take one interval on"
    );
    assert_eq!(
        s.count_rate_limited("rate-take", at(10_099))
            .await
            .expect("count"),
        3
    );
    let early = s
        .claim_ready(ready_claim("rate-take", 4, "w", at(10_099)))
        .await
        .expect("claim_ready");
    assert!(early.tasks.is_empty(), "not before the turn: {early:?}");
    assert_eq!(early.next_turn, Some(at(10_100)));
    for (i, id) in rated[1..].iter().enumerate() {
        let now = at(10_100 + 100 * i as i64);
        let got = s
            .claim_ready(ready_claim("rate-take", 4, "w", now))
            .await
            .expect("claim_ready");
        assert_eq!(ids(&got.tasks), vec![*id], "one per turn, in order");
        assert_eq!(got.tasks[0].started_at, Some(now));
    }
    assert_eq!(
        s.count_rate_limited("rate-take", at(10_400))
            .await
            .expect("count"),
        0
    );
    // Nothing passed over: no turn to wait for.
    let none = s
        .claim_ready(ready_claim("rate-take", 4, "w", at(20_000)))
        .await
        .expect("claim_ready");
    assert_eq!(none, ReadyTaken::default());
}

/// Concurrent polls at one moment take one rate-limited task between them.
pub async fn a_rate_limit_spaces_worker_takes_under_concurrent_polls(store: Arc<dyn Store>) {
    let s = store.as_ref();
    ready_rated(s, "rate-poll-race", 6).await;
    let now = at(10_000);
    let calls: Vec<BoxFuture<'_, _>> = (0..8)
        .map(|i| s.claim_ready(ready_claim("rate-poll-race", 2, &format!("w{i}"), now)))
        .collect();
    let mut taken = 0;
    for out in join_all(calls).await {
        let out = out.expect("claim_ready");
        taken += out.tasks.len();
        // A poll that saw the tasks passes them over until the next turn; one that found them
        // locked by another poll's claim at that moment may not have seen them at all.
        assert!(out.next_turn.is_none_or(|t| t > now), "{out:?}");
    }
    assert_eq!(taken, 1);
}

/// Drives two futures at once.
async fn poll_fn_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let (mut ra, mut rb) = (None, None);
    poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (
        ra.expect("first future completed"),
        rb.expect("second future completed"),
    )
}

/// While a task with exclusive key X runs, a due `wait`-mode task with key X (in any queue, for
/// either target) is `Busy` and stays scheduled; other keys and non-exclusive tasks are unaffected;
/// a ready (not running) task does not hold its key; within one batch the first task with a key
/// starts and the next is `Busy`; once the holder finishes the waiting task can start.
pub async fn exclusive_wait_is_busy_while_key_runs(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let excl = |queue: &str, key: &str| {
        make(
            TaskSpec::new("k")
                .queue(queue)
                .exclusive(key, ExclusiveMode::Wait),
            at(0),
        )
    };
    let holder = insert(s, excl("a", "X")).await;
    let (he, _) = start(s, holder.id, at(0)).await;

    let waiting = insert(s, excl("b", "X")).await;
    for target in [
        run_target(execution_id(), at(1 + LEASE)),
        ClaimTarget::Ready,
    ] {
        match claim(s, waiting.id, target, at(1)).await {
            ClaimOutcome::Busy { exclusive_key } => assert_eq!(exclusive_key, "X"),
            other => panic!("expected Busy, got {other:?}"),
        }
    }
    assert_eq!(
        get(s, waiting.id).await,
        waiting,
        "a busy task stays as it was"
    );
    assert_eq!(
        s.next_due(waiting.shard, None).await.expect("next_due"),
        Some(waiting.due_at),
        "a busy task stays in the due index"
    );

    let other_key = insert(s, excl("b", "Y")).await;
    start(s, other_key.id, at(1)).await;
    let plain = insert(s, make(TaskSpec::new("k").queue("a"), at(0))).await;
    start(s, plain.id, at(1)).await;

    s.complete(holder.id, he, at(2), None)
        .await
        .expect("complete");
    let (_, started) = start(s, waiting.id, at(3)).await;
    assert_eq!(started.attempt, 1);

    // Two tasks with one key in one batch.
    let p = insert(s, excl("c", "Z")).await;
    let q = insert(s, excl("c", "Z")).await;
    let out = s
        .claim_due(
            vec![
                DueClaim {
                    id: p.id,
                    target: run_target(execution_id(), at(4 + LEASE)),
                },
                DueClaim {
                    id: q.id,
                    target: run_target(execution_id(), at(4 + LEASE)),
                },
            ],
            at(4),
            None,
        )
        .await
        .expect("claim_due");
    assert!(
        matches!(&out[0], ClaimOutcome::Started(t) if t.id == p.id),
        "{:?}",
        out[0]
    );
    assert_eq!(
        out[1],
        ClaimOutcome::Busy {
            exclusive_key: "Z".into()
        }
    );
    assert_eq!(get(s, q.id).await.state, TaskState::Scheduled);

    // A ready task does not hold its key.
    let r1 = insert(s, excl("d", "V")).await;
    make_ready(s, r1.id, at(5)).await;
    let r2 = insert(s, excl("d", "V")).await;
    start(s, r2.id, at(5)).await;
    assert!(
        s.claim_ready(ready_claim("d", 1, "w", at(6)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty(),
        "the ready task's key is now held by the running one"
    );
    assert_eq!(get(s, r1.id).await.state, TaskState::Ready);
}

/// While a task with exclusive key X runs, a due `skip`-mode task with key X is `Skipped` (for
/// either target): cancelled with the reason in `last_error`, no attempt made, its business key
/// freed; with the key free a skip-mode task starts normally.
pub async fn exclusive_skip_is_cancelled_while_key_runs(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let holder = insert(
        s,
        make(
            TaskSpec::new("k").exclusive("X", ExclusiveMode::Wait),
            at(0),
        ),
    )
    .await;
    let (he, _) = start(s, holder.id, at(0)).await;
    let skip = |key: &str| {
        make(
            TaskSpec::new("k")
                .queue("s")
                .key(key)
                .exclusive("X", ExclusiveMode::Skip),
            at(0),
        )
    };

    let s1 = insert(s, skip("b1")).await;
    let skipped = match claim(s, s1.id, run_target(execution_id(), at(1 + LEASE)), at(1)).await {
        ClaimOutcome::Skipped(t) => *t,
        other => panic!("expected Skipped, got {other:?}"),
    };
    assert_eq!(skipped.id, s1.id);
    assert_eq!(skipped.state, TaskState::Cancelled);
    assert_eq!(skipped.attempt, 0, "a skipped task made no attempt");
    assert_eq!(skipped.execution_id, None);
    assert_eq!(skipped.updated_at, at(1));
    assert!(
        skipped.last_error.as_deref().is_some_and(|e| !e.is_empty()),
        "the reason is kept: {:?}",
        skipped.last_error
    );
    assert_eq!(get(s, s1.id).await, skipped);
    assert_not_claimable(
        claim(s, s1.id, ClaimTarget::Ready, at(2)).await,
        "claim of a skipped task",
    );
    assert_wrong_state(s.cancel(s1.id, at(2)).await, TaskState::Cancelled, "cancel");
    // Its business key is free again.
    let again = insert(s, skip("b1")).await;

    let s2 = insert(s, skip("b2")).await;
    match claim(s, s2.id, ClaimTarget::Ready, at(2)).await {
        ClaimOutcome::Skipped(t) => assert_eq!(t.state, TaskState::Cancelled),
        other => panic!("expected Skipped, got {other:?}"),
    }

    s.complete(holder.id, he, at(3), None)
        .await
        .expect("complete");
    let (_, started) = start(s, again.id, at(4)).await;
    assert_eq!(started.state, TaskState::Running);
    assert_eq!(started.last_error, None);
}

// ---------------------------------------------------------------------------------------------
// Claiming ready tasks
// ---------------------------------------------------------------------------------------------

/// `claim_ready` starts ready tasks of the requested queue, oldest id first, each with one of the
/// request's execution ids, its worker and lease; tasks of other queues and tasks not ready are left
/// alone, and a task is never handed out by two calls.
/// A W3C `traceparent` the suite's traced tasks carry.
pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A task's trace context is written once, with the task, and every later state change keeps it:
/// readied, claimed by a worker, failed and retried, claimed to run in-process, completed.
pub async fn trace_context_stays_through_every_state_change(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let trace = TraceContext::parse(TRACEPARENT, Some("vendor=v1"));
    assert!(trace.is_some());
    let t = insert(
        s,
        make(
            TaskSpec::new("traced")
                .queue("traced")
                .run_at(at(0))
                .trace(trace.clone()),
            at(0),
        ),
    )
    .await;
    assert_eq!(t.trace, trace, "insert's answer");
    let ready = make_ready(s, t.id, at(1)).await;
    assert_eq!(ready.trace, trace, "readied");
    let got = s
        .claim_ready(ready_claim("traced", 1, "w", at(2)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].trace, trace, "claimed by a worker");
    let exec = got[0].execution_id.expect("running");
    let failed = s
        .fail(t.id, exec, at(3), "again".into(), Retry::At(at(3)))
        .await
        .expect("fail");
    assert_eq!(failed.state, TaskState::Scheduled);
    assert_eq!(failed.trace, trace, "failed and rescheduled");
    let (exec, running) = start(s, t.id, at(4)).await;
    assert_eq!(running.trace, trace, "claimed to run");
    let done = s.complete(t.id, exec, at(5), None).await.expect("complete");
    assert_eq!(done.trace, trace, "completed");
    assert_eq!(get(s, t.id).await.trace, trace, "read back");
    // A task without one stays without one.
    let plain = insert(s, make(TaskSpec::new("plain").run_at(at(0)), at(0))).await;
    assert_eq!(plain.trace, None);
    assert_eq!(get(s, plain.id).await.trace, None);
}

pub async fn claim_ready_takes_ready_tasks_in_id_order(store: Arc<dyn Store>) {
    let s = store.as_ref();
    // Each with its own timeout: a claimed task's lease is `now` plus its timeout.
    let rs: Vec<Task> = insert_all(
        s,
        (0..5)
            .map(|i| {
                make(
                    TaskSpec::new("k")
                        .queue("work")
                        .timeout(Duration::from_millis(1_000 * (i + 1))),
                    at(0),
                )
            })
            .collect(),
    )
    .await;
    for (i, n) in [3usize, 1, 4, 0, 2].into_iter().enumerate() {
        make_ready(s, rs[n].id, at(i as i64)).await;
    }
    let scheduled = insert(s, due_task("work", "k", 0)).await;
    let far = insert(s, due_task("work", "k", 1_000_000)).await;
    let elsewhere = insert(s, due_task("elsewhere", "k", 0)).await;
    make_ready(s, elsewhere.id, at(5)).await;

    let first = ready_claim("work", 3, "worker-1", at(10));
    let got = s
        .claim_ready(first.clone())
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&got), ids(&rs[..3]), "oldest ids first");
    let mut used = HashSet::new();
    for t in &got {
        assert_eq!(t.state, TaskState::Running);
        assert_eq!(t.attempt, 1);
        assert_eq!(t.worker.as_deref(), Some("worker-1"));
        assert_eq!(
            t.lease_expires_at,
            Some(Timestamp(at(10).0 + t.timeout_ms as i64)),
            "lease = now + the task's own timeout"
        );
        assert_eq!(t.started_at, Some(at(10)));
        assert_eq!(t.updated_at, at(10));
        let exec = t.execution_id.expect("a running task has an execution id");
        assert!(
            first.execution_ids.contains(&exec),
            "execution id from the request"
        );
        assert!(used.insert(exec), "each task gets its own execution id");
        assert_eq!(&get(s, t.id).await, t);
    }

    let second = s
        .claim_ready(ready_claim("work", 3, "worker-2", at(11)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&second), ids(&rs[3..]), "only the tasks not yet taken");
    assert!(
        s.claim_ready(ready_claim("work", 3, "worker-3", at(12)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    assert!(
        s.claim_ready(ready_claim("nowhere", 3, "worker-3", at(12)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    assert_eq!(get(s, scheduled.id).await, scheduled);
    assert_eq!(get(s, far.id).await, far);
    assert_eq!(get(s, elsewhere.id).await.state, TaskState::Ready);
}

/// `claim_ready` takes ready tasks by rank (`sundial_core::priority`): among tasks due together
/// the higher priority first, whatever their ids; a task due more than the credit earlier still
/// goes before later urgent work; equal ranks in id order; paging by rank reaches them all.
pub async fn claim_ready_takes_ready_tasks_by_priority_rank(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let step = Priority::STEP_MS;
    let p = |n: u8| Priority::new(n).expect("a priority");
    // (due time, priority), inserted in this order (so ids ascend in it).
    let shape: [(i64, u8); 7] = [
        (10 * step, 5),     // 0: rank 10 steps
        (10 * step, 9),     // 1: rank 6 steps
        (10 * step, 0),     // 2: rank 15 steps
        (0, 0),             // 3: rank 5 steps: older low work before later urgent work
        (10 * step, 9),     // 4: rank 6 steps, after 1 (id)
        (10 * step + 1, 5), // 5: rank 10 steps + 1
        (10 * step, 7),     // 6: rank 8 steps
    ];
    let rs: Vec<Task> = insert_all(
        s,
        shape
            .iter()
            .map(|&(due, prio)| {
                make(
                    TaskSpec::new("k")
                        .queue("work")
                        .run_at(Timestamp(due))
                        .priority(p(prio)),
                    at(0),
                )
            })
            .collect(),
    )
    .await;
    for t in &rs {
        make_ready(s, t.id, Timestamp(11 * step)).await;
    }
    let want: Vec<TaskId> = [3usize, 1, 4, 6, 0, 5, 2]
        .into_iter()
        .map(|i| rs[i].id)
        .collect();
    let mut got = Vec::new();
    // Batches of two: each claim pages past what the last one took.
    for round in 0..4 {
        let batch = s
            .claim_ready(ready_claim("work", 2, "w", Timestamp(11 * step + round)))
            .await
            .expect("claim_ready")
            .tasks;
        for t in &batch {
            assert!(t.started_at >= Some(t.due_at), "never before its due time");
        }
        got.extend(ids(&batch));
    }
    assert_eq!(got, want, "by rank, then id");
    assert_eq!(get(s, rs[1].id).await.priority, p(9));
}

/// `claim_ready` never records a start before the task's due time. A poll's `now` is read before
/// its claim reaches the store, and the task may have been readied in between (the claim queued
/// behind the readying write): the start is then the due time (it happened after the readying,
/// which was at or past it), and the lease runs from there for the task's whole timeout.
pub async fn claim_ready_never_starts_a_task_before_its_due_time(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 100)).await;
    make_ready(s, t.id, at(100)).await;
    let got = s
        .claim_ready(ready_claim("q", 5, "w", at(90)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&got), vec![t.id]);
    assert_eq!(got[0].started_at, Some(at(100)), "started at its due time");
    assert_eq!(got[0].lease_expires_at, Some(at(100 + t.timeout_ms as i64)));
    assert_eq!(&get(s, t.id).await, &got[0]);
    // A claim whose `now` is later keeps it.
    let u = insert(s, due_task("q", "k", 100)).await;
    make_ready(s, u.id, at(100)).await;
    let got = s
        .claim_ready(ready_claim("q", 5, "w", at(150)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(got[0].started_at, Some(at(150)));
    assert_eq!(got[0].lease_expires_at, Some(at(150 + u.timeout_ms as i64)));
}

/// With `kinds`, `claim_ready` takes only tasks of those kinds (still oldest first); an empty kind
/// list takes nothing.
pub async fn claim_ready_respects_kinds_filter(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut by_kind: HashMap<&str, Vec<TaskId>> = HashMap::new();
    for kind in ["a", "b", "c", "a", "b"] {
        let t = insert(s, due_task("q", kind, 0)).await;
        make_ready(s, t.id, at(1)).await;
        by_kind.entry(kind).or_default().push(t.id);
    }
    let with_kinds = |kinds: &[&str], now| ReadyClaim {
        kinds: Some(kinds.iter().map(|k| k.to_string()).collect()),
        ..ready_claim("q", 5, "w", now)
    };
    assert!(
        s.claim_ready(with_kinds(&[], at(2)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty(),
        "an empty kind list takes nothing"
    );
    assert!(
        s.claim_ready(with_kinds(&["zzz"], at(2)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    let got = s
        .claim_ready(with_kinds(&["a", "c"], at(3)))
        .await
        .expect("claim_ready")
        .tasks;
    let mut expected = by_kind["a"].clone();
    expected.extend(&by_kind["c"]);
    expected.sort();
    assert_eq!(ids(&got), expected);
    for id in &by_kind["b"] {
        assert_eq!(get(s, *id).await.state, TaskState::Ready);
    }
    let rest = s
        .claim_ready(ready_claim("q", 5, "w", at(4)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&rest), by_kind["b"]);
}

/// `claim_ready` takes at most as many tasks as execution ids were given; with none it takes nothing.
pub async fn claim_ready_respects_batch_size(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let tasks = insert_all(s, (0..6).map(|_| due_task("q", "k", 0)).collect()).await;
    for t in &tasks {
        make_ready(s, t.id, at(1)).await;
    }
    assert!(
        s.claim_ready(ready_claim("q", 0, "w", at(2)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    assert_eq!(counts(s).await, count_map(&[("q", TaskState::Ready, 6)]));
    let mut taken = Vec::new();
    for (batch, want) in [(2, 2), (1, 1), (10, 3), (4, 0)] {
        let got = s
            .claim_ready(ready_claim("q", batch, "w", at(3)))
            .await
            .expect("claim_ready")
            .tasks;
        assert_eq!(got.len(), want, "batch of {batch}");
        taken.extend(ids(&got));
    }
    assert_eq!(taken, ids(&tasks));
}

/// `complete_then_claim_ready` records the completion, then claims as `claim_ready` does (here
/// a task of the completed task's exclusive key, which only the completion frees); a refused
/// completion (a stale execution, an unknown task) claims nothing and changes nothing.
pub async fn a_completion_then_claim_records_then_takes_and_a_refused_one_takes_nothing(
    store: Arc<dyn Store>,
) {
    let s = store.as_ref();
    let keyed = |n: &str| {
        make(
            TaskSpec::new(n)
                .queue("q")
                .run_at(at(0))
                .exclusive("k", ExclusiveMode::Wait),
            at(0),
        )
    };
    let first = insert(s, keyed("first")).await;
    let next = insert(s, keyed("next")).await;
    make_ready(s, next.id, at(1)).await;
    let (exec, _) = start(s, first.id, at(2)).await;
    // The key is held: a plain claim takes nothing.
    assert!(
        s.claim_ready(ready_claim("q", 1, "w", at(3)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    // A stale execution: refused, nothing claimed.
    let stale = ExecutionId(Uuid::now_v7());
    let refused = s
        .complete_then_claim_ready(
            first.id,
            stale,
            at(4),
            None,
            ready_claim("q", 1, "w", at(4)),
        )
        .await;
    assert!(
        matches!(refused, Err(TransitionError::StaleExecution { .. })),
        "{refused:?}"
    );
    let unknown = s
        .complete_then_claim_ready(
            TaskId(Uuid::now_v7()),
            exec,
            at(4),
            None,
            ready_claim("q", 1, "w", at(4)),
        )
        .await;
    assert!(
        matches!(unknown, Err(TransitionError::NotFound)),
        "{unknown:?}"
    );
    assert_eq!(get(s, first.id).await.state, TaskState::Running);
    assert_eq!(get(s, next.id).await.state, TaskState::Ready);
    // The right one: recorded, and the task its key freed is taken.
    let (done, taken) = s
        .complete_then_claim_ready(
            first.id,
            exec,
            at(5),
            Some(json!({"ok": true}).to_string()),
            ready_claim("q", 1, "w", at(5)),
        )
        .await
        .expect("complete_then_claim_ready");
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, Some(json!({"ok": true})));
    assert_eq!(&get(s, first.id).await, &done);
    assert_eq!(ids(&taken.tasks), vec![next.id]);
    assert_eq!(taken.tasks[0].state, TaskState::Running);
    assert_eq!(taken.tasks[0].started_at, Some(at(5)));
    assert_eq!(&get(s, next.id).await, &taken.tasks[0]);
}

/// `claim_ready` passes over ready tasks whose exclusive key is held by a running task (or by a task
/// it started earlier in the same call), however many come first, and those stay ready.
pub async fn claim_ready_skips_busy_exclusive_keys(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let excl = |queue: &str, key: &str| {
        make(
            TaskSpec::new("k")
                .queue(queue)
                .exclusive(key, ExclusiveMode::Wait),
            at(0),
        )
    };
    let holder = insert(s, excl("holders", "X")).await;
    let blocked = insert_all(s, (0..40).map(|_| excl("w", "X")).collect()).await;
    for t in &blocked {
        make_ready(s, t.id, at(1)).await;
    }
    let (he, _) = start(s, holder.id, at(2)).await;
    let free = insert(s, make(TaskSpec::new("k").queue("w"), at(0))).await;
    make_ready(s, free.id, at(2)).await;

    let got = s
        .claim_ready(ready_claim("w", 1, "w", at(3)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(
        ids(&got),
        vec![free.id],
        "the free task is found behind the blocked ones"
    );
    assert!(
        s.claim_ready(ready_claim("w", 3, "w", at(3)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("holders", TaskState::Running, 1),
            ("w", TaskState::Ready, 40),
            ("w", TaskState::Running, 1),
        ])
    );

    s.complete(holder.id, he, at(4), None)
        .await
        .expect("complete");
    let got = s
        .claim_ready(ready_claim("w", 3, "w", at(5)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(
        ids(&got),
        vec![blocked[0].id],
        "only one task per exclusive key starts, the oldest"
    );

    // Within one call: the second task with key G waits for the first.
    let g1 = insert(s, excl("w", "G")).await;
    let g2 = insert(s, excl("w", "G")).await;
    let f2 = insert(s, make(TaskSpec::new("k").queue("w"), at(0))).await;
    let f3 = insert(s, make(TaskSpec::new("k").queue("w"), at(0))).await;
    for t in [&g1, &g2, &f2, &f3] {
        make_ready(s, t.id, at(6)).await;
    }
    let got = s
        .claim_ready(ready_claim("w", 3, "w", at(7)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&got), vec![g1.id, f2.id, f3.id]);
    assert_eq!(get(s, g2.id).await.state, TaskState::Ready);
    assert_eq!(get(s, blocked[1].id).await.state, TaskState::Ready);
}

/// Several workers claiming one queue at once never receive the same task, each task carries the
/// execution id of the call that received it, and every ready task is handed out exactly once.
pub async fn claim_ready_never_returns_a_task_twice_under_concurrency(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let tasks = insert_all(s, (0..20).map(|_| due_task("q", "k", 0)).collect()).await;
    for t in &tasks {
        make_ready(s, t.id, at(1)).await;
    }
    let claims: Vec<ReadyClaim> = (0..4)
        .map(|i| ready_claim("q", 4, &format!("worker-{i}"), at(2)))
        .collect();
    let futures = claims.iter().map(|c| s.claim_ready(c.clone())).collect();
    let results = join_all(futures).await;
    let mut seen = HashSet::new();
    for (c, got) in claims.iter().zip(results) {
        let got = got.expect("claim_ready").tasks;
        assert!(got.len() <= 4);
        for t in got {
            assert!(seen.insert(t.id), "task {} handed out twice", t.id);
            let exec = t.execution_id.expect("execution id");
            assert!(c.execution_ids.contains(&exec));
            assert_eq!(t.worker, c.worker);
            assert_eq!(get(s, t.id).await.execution_id, Some(exec));
        }
    }
    let rest = s
        .claim_ready(ready_claim("q", 20, "last", at(3)))
        .await
        .expect("claim_ready")
        .tasks;
    for t in rest {
        assert!(seen.insert(t.id), "task {} handed out twice", t.id);
    }
    let all: HashSet<TaskId> = ids(&tasks).into_iter().collect();
    assert_eq!(seen, all, "every ready task is handed out once");
}

// ---------------------------------------------------------------------------------------------
// Attempts: heartbeat, complete, fail
// ---------------------------------------------------------------------------------------------

/// A heartbeat with the current execution id moves the lease to `now` plus the task's own
/// timeout (never earlier than it was), sets `updated_at` and leaves the attempt running.
pub async fn heartbeat_extends_lease(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(
        s,
        make(
            TaskSpec::new("k")
                .queue("q")
                .run_at(at(0))
                .timeout(Duration::from_millis(2 * LEASE as u64)),
            at(0),
        ),
    )
    .await;
    let (exec, started) = start(s, t.id, at(0)).await;
    let beat = s.heartbeat(t.id, exec, at(10)).await.expect("heartbeat");
    let expected = Task {
        lease_expires_at: Some(at(10 + 2 * LEASE)),
        updated_at: at(10),
        ..started
    };
    assert_eq!(beat, expected);
    assert_eq!(get(s, t.id).await, expected);
    assert_eq!(
        s.next_lease_expiry(None).await.expect("next_lease_expiry"),
        Some(at(10 + 2 * LEASE))
    );
    // Nothing expires before the new lease ends.
    assert!(
        s.expire_leases(at(LEASE + 1), 10, None)
            .await
            .expect("expire_leases")
            .is_empty()
    );
    // A heartbeat never shortens a longer lease (the default timeout is 300 s).
    let long = insert(s, due_task("q", "k", 0)).await;
    let (el, _) = start_with_lease(s, long.id, at(0), at(1_000_000)).await;
    let beat = s.heartbeat(long.id, el, at(10)).await.expect("heartbeat");
    assert_eq!(beat.lease_expires_at, Some(at(1_000_000)));
}

/// `heartbeat`, `complete` and `fail` with an execution id that is not the task's current attempt
/// are refused with `StaleExecution` carrying the task's state, and change nothing: for a task that
/// never started, for a foreign id, and for the previous attempt's id after a retry.
pub async fn stale_execution_is_refused(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 0)).await;
    assert_attempt_writes_stale(s, t.id, execution_id(), TaskState::Scheduled, at(1)).await;
    assert_eq!(get(s, t.id).await, t);

    let (e1, running) = start(s, t.id, at(2)).await;
    assert_attempt_writes_stale(s, t.id, execution_id(), TaskState::Running, at(3)).await;
    assert_eq!(get(s, t.id).await, running);

    s.fail(t.id, e1, at(4), "retry".into(), Retry::At(at(50)))
        .await
        .expect("fail");
    let retrying = get(s, t.id).await;
    assert_attempt_writes_stale(s, t.id, e1, TaskState::Scheduled, at(5)).await;
    assert_eq!(get(s, t.id).await, retrying);

    let (e2, second) = start(s, t.id, at(50)).await;
    assert_attempt_writes_stale(s, t.id, e1, TaskState::Running, at(51)).await;
    assert_eq!(get(s, t.id).await, second);
    s.complete(t.id, e2, at(52), None)
        .await
        .expect("the current attempt still completes");
}

/// Every state change on an id the store does not know is `NotFound`.
pub async fn unknown_task_is_not_found(store: Arc<dyn Store>) {
    let s = store.as_ref();
    insert(s, due_task("q", "k", 0)).await;
    let id = task_id();
    let exec = execution_id();
    assert_not_found(s.heartbeat(id, exec, at(1)).await, "heartbeat");
    assert_not_found(s.complete(id, exec, at(1), None).await, "complete");
    assert_not_found(
        s.fail(id, exec, at(1), "x".into(), Retry::At(at(2))).await,
        "fail with retry",
    );
    assert_not_found(
        s.fail(id, exec, at(1), "x".into(), Retry::Never).await,
        "fail",
    );
    assert_not_found(s.cancel(id, at(1)).await, "cancel");
    assert_not_found(s.trigger(id, at(1)).await, "trigger");
    assert!(s.get(id).await.expect("get").is_none());
}

/// `complete` with the current execution id ends the task `succeeded` with its result (JSON text,
/// read back as JSON) and `finished_at`; the task leaves the lease view and cannot complete again.
pub async fn complete_stores_result_and_is_terminal(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 0)).await;
    let (exec, _) = start(s, t.id, at(0)).await;
    let done = s
        .complete(
            t.id,
            exec,
            at(5),
            Some(r#"{"sent":true,"id":"m-1","n":[1,2]}"#.into()),
        )
        .await
        .expect("complete");
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(
        done.result,
        Some(json!({"sent": true, "id": "m-1", "n": [1, 2]}))
    );
    assert_eq!(done.finished_at, Some(at(5)));
    assert_eq!(done.updated_at, at(5));
    assert_eq!(done.attempt, 1);
    assert_eq!(done.execution_id, Some(exec));
    assert_eq!(done.last_error, None);
    assert_eq!(get(s, t.id).await, done);
    assert_eq!(
        s.next_lease_expiry(None).await.expect("next_lease_expiry"),
        None
    );
    assert!(
        s.expire_leases(at(10 * LEASE), 10, None)
            .await
            .expect("expire_leases")
            .is_empty()
    );
    assert_stale(
        s.complete(t.id, exec, at(6), None).await,
        TaskState::Succeeded,
        "second complete",
    );
    assert_eq!(get(s, t.id).await, done);

    let u = insert(s, due_task("q", "k", 0)).await;
    let (exec, _) = start(s, u.id, at(0)).await;
    let done = s.complete(u.id, exec, at(7), None).await.expect("complete");
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, None);
}

/// `fail` with `retry_at` puts the task back to `scheduled` due at `retry_at`, with the error in
/// `last_error` and the attempt count kept; it is not claimable before `retry_at`, and the next
/// claim is attempt 2.
pub async fn fail_with_retry_reschedules(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, make(TaskSpec::new("k").max_attempts(3), at(0))).await;
    let (e1, _) = start(s, t.id, at(0)).await;
    let failed = s
        .fail(
            t.id,
            e1,
            at(100),
            "connection refused".into(),
            Retry::At(at(5_000)),
        )
        .await
        .expect("fail");
    assert_eq!(failed.state, TaskState::Scheduled);
    assert_eq!(failed.due_at, at(5_000));
    assert_eq!(failed.last_error.as_deref(), Some("connection refused"));
    assert_eq!(failed.attempt, 1);
    assert_eq!(failed.updated_at, at(100));
    assert_eq!(failed.finished_at, None, "a retrying task is not finished");
    assert_eq!(get(s, t.id).await, failed);

    assert!(
        s.scan_due(t.shard, None, at(4_999), 10)
            .await
            .expect("scan_due")
            .is_empty()
    );
    assert_eq!(
        s.scan_due(t.shard, None, at(5_000), 10)
            .await
            .expect("scan_due"),
        vec![due_entry(&failed)]
    );
    assert_eq!(
        s.next_due(t.shard, None).await.expect("next_due"),
        Some(at(5_000))
    );
    assert_eq!(
        s.next_lease_expiry(None).await.expect("next_lease_expiry"),
        None
    );

    assert_not_claimable(
        claim(
            s,
            t.id,
            run_target(execution_id(), at(4_999 + LEASE)),
            at(4_999),
        )
        .await,
        "claim before retry_at",
    );
    let (e2, again) = start(s, t.id, at(5_000)).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(again.execution_id, Some(e2));
}

/// `fail` without `retry_at` ends the task `dead` with the error kept and `finished_at` set; it is
/// never due or leased again.
pub async fn fail_without_retry_is_dead(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, due_task("q", "k", 0)).await;
    let (exec, _) = start(s, t.id, at(0)).await;
    let dead = s
        .fail(t.id, exec, at(10), "bad input".into(), Retry::Never)
        .await
        .expect("fail");
    assert_eq!(dead.state, TaskState::Dead);
    assert_eq!(dead.last_error.as_deref(), Some("bad input"));
    assert_eq!(dead.finished_at, Some(at(10)));
    assert_eq!(dead.updated_at, at(10));
    assert_eq!(dead.attempt, 1);
    assert_eq!(get(s, t.id).await, dead);
    assert!(
        s.scan_due(t.shard, None, Timestamp::MAX, 10)
            .await
            .expect("scan_due")
            .is_empty()
    );
    assert_eq!(s.next_due(t.shard, None).await.expect("next_due"), None);
    assert_eq!(
        s.next_lease_expiry(None).await.expect("next_lease_expiry"),
        None
    );
    assert_not_claimable(
        claim(s, t.id, ClaimTarget::Ready, at(11)).await,
        "claim of a dead task",
    );
}

// ---------------------------------------------------------------------------------------------
// Cancel and trigger
// ---------------------------------------------------------------------------------------------

/// `cancel` ends a scheduled, ready or running task `cancelled` (with `updated_at = now`); it is then
/// never due, ready or leased again, and the cancelled attempt's execution id is stale.
/// A backend that gives an out-of-band mark ([`Store::out_of_band_mark`]) keeps it through
/// inserts, claims (due and ready) and an attempt's own heartbeat, completion and failure, and
/// moves it with a cancel before the cancel returns; a cancel that changed nothing leaves it. A
/// backend that gives none is not checked.
pub async fn the_out_of_band_mark_moves_only_with_writes_that_can_end_a_started_task(
    store: Arc<dyn Store>,
) {
    let s = store.as_ref();
    let Some(start_mark) = s.out_of_band_mark() else {
        return;
    };
    let mark = || s.out_of_band_mark().expect("a mark, as at the start");
    let done = insert(s, due_task("q", "k", 0)).await;
    let failed = insert(s, due_task("q", "k", 0)).await;
    let readied = insert(s, due_task("q", "k", 0)).await;
    let pending = insert(s, due_task("q", "k", 60_000)).await;
    let (exec, _) = start(s, done.id, at(1)).await;
    s.heartbeat(done.id, exec, at(2)).await.expect("heartbeat");
    s.complete(done.id, exec, at(3), None)
        .await
        .expect("complete");
    let (exec, _) = start(s, failed.id, at(1)).await;
    s.fail(failed.id, exec, at(3), "boom".into(), Retry::At(at(1_000)))
        .await
        .expect("fail");
    make_ready(s, readied.id, at(1)).await;
    let taken = s
        .claim_ready(ready_claim("q", 1, "w", at(4)))
        .await
        .expect("claim_ready");
    assert_eq!(taken.tasks.len(), 1, "the ready task was claimed");
    assert_eq!(mark(), start_mark, "in-band writes leave the mark");

    assert!(s.cancel(task_id(), at(5)).await.is_err(), "no such task");
    assert_eq!(
        mark(),
        start_mark,
        "a write that changed nothing leaves the mark"
    );

    s.cancel(pending.id, at(6)).await.expect("cancel");
    assert_ne!(
        mark(),
        start_mark,
        "a cancel moves the mark before it returns"
    );
}

pub async fn cancel_from_live_states(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let sched = insert(s, due_task("q", "k", 1_000)).await;
    let rdy = insert(s, due_task("q", "k", 0)).await;
    make_ready(s, rdy.id, at(1)).await;
    let run = insert(s, due_task("q", "k", 0)).await;
    let (exec, _) = start(s, run.id, at(1)).await;

    for (t, from) in [
        (&sched, TaskState::Scheduled),
        (&rdy, TaskState::Ready),
        (&run, TaskState::Running),
    ] {
        let c = s.cancel(t.id, at(10)).await.expect("cancel");
        assert_eq!(c.state, TaskState::Cancelled, "cancel from {from}");
        assert_eq!(c.updated_at, at(10));
        assert_eq!(get(s, t.id).await, c);
    }
    assert_attempt_writes_stale(s, run.id, exec, TaskState::Cancelled, at(11)).await;
    for shard in 0..SHARDS {
        assert!(
            s.scan_due(shard, None, Timestamp::MAX, 10)
                .await
                .expect("scan_due")
                .is_empty()
        );
        assert_eq!(s.next_due(shard, None).await.expect("next_due"), None);
    }
    assert!(
        s.claim_ready(ready_claim("q", 5, "w", at(12)))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    assert_eq!(
        s.next_lease_expiry(None).await.expect("next_lease_expiry"),
        None
    );
    assert!(
        s.expire_leases(at(10 * LEASE), 10, None)
            .await
            .expect("expire_leases")
            .is_empty()
    );
    assert_eq!(
        counts(s).await,
        count_map(&[("q", TaskState::Cancelled, 3)])
    );
}

/// `cancel` on a terminal task (succeeded, dead, cancelled) is `WrongState` with that state and
/// changes nothing.
pub async fn cancel_from_terminal_is_wrong_state(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let ok = insert(s, due_task("q", "k", 0)).await;
    let (e, _) = start(s, ok.id, at(0)).await;
    s.complete(ok.id, e, at(1), None).await.expect("complete");
    let dead = insert(s, due_task("q", "k", 0)).await;
    let (e, _) = start(s, dead.id, at(0)).await;
    s.fail(dead.id, e, at(1), "x".into(), Retry::Never)
        .await
        .expect("fail");
    let gone = insert(s, due_task("q", "k", 0)).await;
    s.cancel(gone.id, at(1)).await.expect("cancel");

    for (id, state) in [
        (ok.id, TaskState::Succeeded),
        (dead.id, TaskState::Dead),
        (gone.id, TaskState::Cancelled),
    ] {
        let before = get(s, id).await;
        assert_wrong_state(
            s.cancel(id, at(2)).await,
            state,
            "cancel of a terminal task",
        );
        assert_eq!(get(s, id).await, before);
    }
}

/// `trigger` moves a scheduled task's due time to `now` (never later than it was: an overdue task
/// keeps its due time) and leaves it scheduled; on a ready, running or terminal task it is
/// `WrongState` with that state.
pub async fn trigger_moves_due_to_now_for_scheduled_only(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let future = insert(s, due_task("q", "k", 10_000)).await;
    let triggered = s.trigger(future.id, at(100)).await.expect("trigger");
    assert_eq!(triggered.state, TaskState::Scheduled);
    assert_eq!(triggered.due_at, at(100));
    assert_eq!(triggered.attempt, 0);
    assert_eq!(get(s, future.id).await, triggered);
    assert_eq!(
        s.scan_due(future.shard, None, at(100), 10)
            .await
            .expect("scan_due"),
        vec![due_entry(&triggered)]
    );

    let overdue = insert(s, due_task("q", "k", 50)).await;
    let t = s.trigger(overdue.id, at(100)).await.expect("trigger");
    assert_eq!(t.state, TaskState::Scheduled);
    assert_eq!(t.due_at, at(50), "trigger never moves a due time later");
    assert_eq!(get(s, overdue.id).await.due_at, at(50));

    let rdy = insert(s, due_task("q", "k", 0)).await;
    make_ready(s, rdy.id, at(1)).await;
    let (exec, _) = start(s, future.id, at(100)).await;
    let done = insert(s, due_task("q", "k", 0)).await;
    let (e, _) = start(s, done.id, at(1)).await;
    s.complete(done.id, e, at(2), None).await.expect("complete");
    let gone = insert(s, due_task("q", "k", 5_000)).await;
    s.cancel(gone.id, at(2)).await.expect("cancel");

    for (id, state) in [
        (rdy.id, TaskState::Ready),
        (future.id, TaskState::Running),
        (done.id, TaskState::Succeeded),
        (gone.id, TaskState::Cancelled),
    ] {
        let before = get(s, id).await;
        assert_wrong_state(s.trigger(id, at(200)).await, state, "trigger");
        assert_eq!(
            get(s, id).await,
            before,
            "a refused trigger changes nothing"
        );
    }
    s.complete(future.id, exec, at(201), None)
        .await
        .expect("the running attempt is unaffected");
}

// ---------------------------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------------------------

/// `expire_leases` takes running tasks whose lease ended before `now` back to `scheduled`, due `now`,
/// when attempts remain, or to `dead` when they do not; a lease ending at or after `now`, and tasks
/// not running, are untouched; the expired attempt's execution id is stale.
pub async fn expire_leases_reschedules_or_kills(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let with_attempts = |n: u32| make(TaskSpec::new("k").queue("q").max_attempts(n), at(0));
    let retry = insert(s, with_attempts(3)).await;
    let (e_retry, _) = start_with_lease(s, retry.id, at(0), at(1_000)).await;
    let last = insert(s, with_attempts(1)).await;
    let (e_last, _) = start_with_lease(s, last.id, at(0), at(1_000)).await;
    let later = insert(s, with_attempts(3)).await;
    start_with_lease(s, later.id, at(0), at(5_000)).await;
    let edge = insert(s, with_attempts(3)).await;
    start_with_lease(s, edge.id, at(0), at(2_000)).await;
    let sched = insert(s, with_attempts(3)).await;
    let rdy = insert(s, with_attempts(3)).await;
    make_ready(s, rdy.id, at(0)).await;

    let untouched = [
        get(s, later.id).await,
        get(s, edge.id).await,
        get(s, sched.id).await,
        get(s, rdy.id).await,
    ];
    let now = at(2_000);
    let out = s
        .expire_leases(now, 100, None)
        .await
        .expect("expire_leases");
    let got: HashSet<TaskId> = ids(&out).into_iter().collect();
    assert_eq!(got, HashSet::from([retry.id, last.id]));
    for t in &out {
        assert_eq!(&get(s, t.id).await, t, "returns the rows as changed");
        assert_eq!(t.updated_at, now);
        assert_eq!(t.attempt, 1);
        if t.id == retry.id {
            assert_eq!(t.state, TaskState::Scheduled);
            assert_eq!(t.due_at, now, "due again right away");
            assert_eq!(t.finished_at, None);
        } else {
            assert_eq!(t.state, TaskState::Dead, "attempts exhausted");
            assert_eq!(t.finished_at, Some(now));
        }
    }
    for t in &untouched {
        assert_eq!(&get(s, t.id).await, t);
    }
    assert_stale(
        s.complete(retry.id, e_retry, at(2_001), None).await,
        TaskState::Scheduled,
        "complete after lease expiry",
    );
    assert_stale(
        s.heartbeat(last.id, e_last, at(2_001)).await,
        TaskState::Dead,
        "heartbeat after lease expiry",
    );
    assert!(
        s.expire_leases(now, 100, None)
            .await
            .expect("expire_leases")
            .is_empty(),
        "nothing expires twice"
    );
    let (_, again) = start(s, retry.id, now).await;
    assert_eq!(again.attempt, 2);
}

/// `expire_leases` changes at most `limit` tasks per call; repeated calls drain the rest, each task
/// once.
pub async fn expire_leases_honours_limit(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut all = HashSet::new();
    for lease in [100, 300, 200, 500, 400] {
        let t = insert(s, due_task("q", "k", 0)).await;
        start_with_lease(s, t.id, at(0), at(lease)).await;
        all.insert(t.id);
    }
    let mut seen = HashSet::new();
    for want in [2, 2, 1, 0] {
        let out = s
            .expire_leases(at(1_000), 2, None)
            .await
            .expect("expire_leases");
        assert_eq!(out.len(), want);
        for t in out {
            assert!(seen.insert(t.id), "task {} expired twice", t.id);
            assert_eq!(t.state, TaskState::Scheduled);
        }
    }
    assert_eq!(seen, all);
}

/// `next_lease_expiry` is the earliest lease among running tasks, following starts, heartbeats and
/// finishes; `None` when nothing runs.
pub async fn next_lease_expiry_is_earliest_running_lease(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let lease = move || async move { s.next_lease_expiry(None).await.expect("next_lease_expiry") };
    assert_eq!(lease().await, None);
    insert(s, due_task("q", "k", 0)).await;
    let rdy = insert(s, due_task("q", "k", 0)).await;
    make_ready(s, rdy.id, at(0)).await;
    assert_eq!(lease().await, None, "only running tasks have leases");

    let a = insert(s, due_task("q", "k", 0)).await;
    let (ea, _) = start_with_lease(s, a.id, at(0), at(500)).await;
    assert_eq!(lease().await, Some(at(500)));
    // A heartbeat extends the lease by the task's own timeout.
    let b = insert(
        s,
        make(
            TaskSpec::new("k")
                .queue("q")
                .run_at(at(0))
                .timeout(Duration::from_millis(800)),
            at(0),
        ),
    )
    .await;
    let (eb, _) = start_with_lease(s, b.id, at(0), at(300)).await;
    assert_eq!(lease().await, Some(at(300)));
    s.heartbeat(b.id, eb, at(100)).await.expect("heartbeat");
    assert_eq!(lease().await, Some(at(500)));
    s.complete(a.id, ea, at(200), None).await.expect("complete");
    assert_eq!(lease().await, Some(at(900)));
    s.fail(b.id, eb, at(300), "x".into(), Retry::Never)
        .await
        .expect("fail");
    assert_eq!(lease().await, None);
}

// ---------------------------------------------------------------------------------------------
// Counting and listing
// ---------------------------------------------------------------------------------------------

/// `dead_groups` counts every dead task (and only dead ones) by queue and error group (the
/// error's first line, at most 200 characters, counted in characters), largest first, ties by
/// queue then error; names each group's newest task; honours the queue, the namespace and the
/// limit; and follows a retry out of the dead state.
pub async fn dead_groups_count_every_dead_task_by_queue_and_error(store: Arc<dyn Store>) {
    let s = store.as_ref();
    async fn dead(s: &dyn Store, queue: &str, error: &str) -> Task {
        let t = insert(s, due_task(queue, "k", 0)).await;
        let (exec, _) = start(s, t.id, at(0)).await;
        let d = s
            .fail(t.id, exec, at(10), error.to_string(), Retry::Never)
            .await
            .expect("fail");
        assert_eq!(d.state, TaskState::Dead);
        d
    }
    let long_x = "x".repeat(250);
    let long_x2 = format!("{}y", "x".repeat(200));
    let accents = "é".repeat(250);
    let a1 = dead(s, "a", "boom\ntrace 1").await;
    let _a2 = dead(s, "a", "boom\ntrace 2").await;
    let a_other = dead(s, "a", "other").await;
    let _b1 = dead(s, "b", &long_x).await;
    let b_acc = dead(s, "b", &accents).await;
    let b2 = dead(s, "b", &long_x2).await;
    let a3 = dead(s, "a", "boom").await;
    // Not dead: a failure with a retry left, a cancelled task.
    let t = insert(s, due_task("a", "k", 0)).await;
    let (exec, _) = start(s, t.id, at(0)).await;
    s.fail(t.id, exec, at(10), "boom".into(), Retry::At(at(1_000)))
        .await
        .expect("fail with retry");
    let c = insert(s, due_task("a", "k", 0)).await;
    s.cancel(c.id, at(5)).await.expect("cancel");

    let row = |q: &str, e: &str, n: u64, newest: TaskId| crate::DeadGroup {
        queue: q.to_string(),
        error: Some(e.to_string()),
        count: n,
        newest,
    };
    let all = s
        .dead_groups(crate::DeadGroupFilter::default(), 100)
        .await
        .expect("dead_groups");
    let x200 = "x".repeat(200);
    let acc200 = "é".repeat(200);
    assert_eq!(crate::error_group(&long_x), x200);
    assert_eq!(crate::error_group(&accents), acc200);
    assert_eq!(
        all,
        vec![
            row("a", "boom", 3, a3.id),
            row("b", &x200, 2, b2.id),
            row("a", "other", 1, a_other.id),
            row("b", &acc200, 1, b_acc.id),
        ]
    );
    assert_eq!(
        s.dead_groups(crate::DeadGroupFilter::default(), 2)
            .await
            .expect("dead_groups"),
        all[..2].to_vec()
    );
    assert_eq!(
        s.dead_groups(crate::DeadGroupFilter::queue("b"), 100)
            .await
            .expect("dead_groups"),
        vec![all[1].clone(), all[3].clone()]
    );
    assert!(
        s.dead_groups(crate::DeadGroupFilter::queue("none"), 100)
            .await
            .expect("dead_groups")
            .is_empty()
    );
    // A namespace's groups: only its queues (by stored name); the default namespace's are the
    // names without a namespace part.
    let acme_q = sundial_core::namespace::qualify("acme", "a");
    let acme = dead(s, &acme_q, "boom").await;
    let in_ns = |ns: &'static str| crate::DeadGroupFilter {
        queue: None,
        namespace: Some(ns),
    };
    assert_eq!(
        s.dead_groups(in_ns("acme"), 100)
            .await
            .expect("dead_groups"),
        vec![row(&acme_q, "boom", 1, acme.id)]
    );
    assert_eq!(
        s.dead_groups(in_ns("default"), 100)
            .await
            .expect("dead_groups"),
        all,
        "the default namespace's groups leave acme's out"
    );
    assert!(
        s.dead_groups(in_ns("other"), 100)
            .await
            .expect("dead_groups")
            .is_empty()
    );
    // A retried task leaves its group; the group's newest is recomputed.
    s.retry(a3.id, at(2_000), at(20)).await.expect("retry");
    let after = s
        .dead_groups(crate::DeadGroupFilter::queue("a"), 100)
        .await
        .expect("dead_groups");
    assert_eq!(after[0].count, 2);
    assert!(after[0].newest > a1.id);
    assert_ne!(after[0].newest, a3.id);
}

/// `count_by_state` counts tasks per queue and state, and the counts follow every transition
/// (duplicates and refused changes count nothing); states without tasks may be left out or be zero.
pub async fn count_by_state_follows_transitions(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert!(counts(s).await.is_empty(), "an empty store counts nothing");
    let mut all = Vec::new();
    let alpha = insert_all(
        s,
        (0..4)
            .map(|i| {
                make(
                    TaskSpec::new("k").queue("alpha").key(format!("a{i}")),
                    at(0),
                )
            })
            .collect(),
    )
    .await;
    let beta = insert_all(s, (0..3).map(|_| due_task("beta", "k", 0)).collect()).await;
    all.extend(ids(&alpha));
    all.extend(ids(&beta));
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("alpha", TaskState::Scheduled, 4),
            ("beta", TaskState::Scheduled, 3),
        ])
    );

    let dup = make(TaskSpec::new("k").queue("alpha").key("a0"), at(1));
    assert!(matches!(
        s.insert(vec![dup]).await.expect("insert")[0],
        Inserted::Duplicate { .. }
    ));
    assert_eq!(counts(s).await, counts_of(s, &all).await);

    make_ready(s, alpha[0].id, at(1)).await;
    let (e1, _) = start(s, alpha[1].id, at(1)).await;
    let (e2, _) = start(s, beta[0].id, at(1)).await;
    assert_eq!(counts(s).await, counts_of(s, &all).await);

    s.complete(alpha[1].id, e1, at(2), None)
        .await
        .expect("complete");
    s.fail(beta[0].id, e2, at(2), "x".into(), Retry::At(at(3)))
        .await
        .expect("fail");
    s.cancel(alpha[2].id, at(2)).await.expect("cancel");
    assert_eq!(counts(s).await, counts_of(s, &all).await);

    let _ = s.cancel(alpha[2].id, at(3)).await;
    let _ = s.complete(alpha[1].id, e1, at(3), None).await;
    assert_eq!(counts(s).await, counts_of(s, &all).await);

    start_with_lease(s, beta[0].id, at(3), at(4)).await;
    let taken = s
        .claim_ready(ready_claim("alpha", 5, "w", at(3)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&taken), vec![alpha[0].id]);
    s.expire_leases(at(5), 10, None)
        .await
        .expect("expire_leases");
    assert_eq!(counts(s).await, counts_of(s, &all).await);
    let (e4, _) = start(s, beta[1].id, at(6)).await;
    s.fail(beta[1].id, e4, at(7), "x".into(), Retry::Never)
        .await
        .expect("fail");
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("alpha", TaskState::Running, 1),
            ("alpha", TaskState::Succeeded, 1),
            ("alpha", TaskState::Cancelled, 1),
            ("alpha", TaskState::Scheduled, 1),
            ("beta", TaskState::Scheduled, 2),
            ("beta", TaskState::Dead, 1),
        ])
    );
    assert_eq!(counts(s).await, counts_of(s, &all).await);
}

fn matches_filter(f: &TaskFilter, t: &Task) -> bool {
    f.matches(t)
}

/// `exclude_internal` leaves out exactly the queues named `sundial.…` (case matters; `_` and
/// `%` are not wildcards), with the other filters and paging as usual.
pub async fn list_can_leave_out_internal_queues(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut kept = Vec::new();
    for queue in [
        "sundial.schedules",
        "sundial.workflow.timer",
        "sundial.activities",
    ] {
        insert(s, make(TaskSpec::new("k").queue(queue), at(0))).await;
    }
    for queue in [
        "default",
        "Sundial.x",
        "sundialx",
        "sundial_x",
        "team/sundial.x",
    ] {
        kept.push(
            insert(s, make(TaskSpec::new("k").queue(queue), at(0)))
                .await
                .id,
        );
    }
    kept.reverse();
    let filter = TaskFilter {
        exclude_internal: true,
        ..TaskFilter::default()
    };
    let page = s.list(&filter, 100).await.expect("list");
    assert_eq!(ids(&page.tasks), kept);
    let first = s.list(&filter, 2).await.expect("list");
    assert_eq!(ids(&first.tasks), kept[..2].to_vec());
    let rest = s
        .list(
            &TaskFilter {
                before: first.next_cursor,
                ..filter.clone()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(ids(&rest.tasks), kept[2..].to_vec());
    let all = s.list(&TaskFilter::default(), 100).await.expect("list");
    assert_eq!(all.tasks.len(), 8);
    // With another filter too.
    let mut with_kind = filter.clone();
    with_kind.kind = Some("k".into());
    assert_eq!(
        ids(&s.list(&with_kind, 100).await.expect("list").tasks),
        kept
    );
}

/// `namespace` selects exactly one namespace's tasks by their stored queue names (see
/// `sundial_core::namespace`): the default namespace's are those without the separator, and a
/// namespace whose name is another's prefix, or holds `_` (a LIKE wildcard), selects only its
/// own. Keys of the same text in two namespaces are two keys.
pub async fn list_selects_one_namespace(store: Arc<dyn Store>) {
    use sundial_core::namespace::qualify;
    let s = store.as_ref();
    let mut by_ns: std::collections::BTreeMap<&str, Vec<TaskId>> = Default::default();
    for (ns, queue) in [
        ("default", "emails"),
        ("default", "team/emails"),
        ("acme", "emails"),
        ("acme", "other"),
        ("acm", "emails"),
        ("a_me", "emails"),
        ("abme", "emails"),
    ] {
        // The same key text in every namespace (and so, within one, one key per queue name).
        let spec = TaskSpec::new("k")
            .queue(queue)
            .key(format!("key-{queue}"))
            .in_namespace(ns);
        let t = insert(s, make(spec, at(0))).await;
        assert_eq!(t.queue, qualify(ns, queue));
        by_ns.entry(ns).or_default().push(t.id);
    }
    for (ns, mut want) in by_ns {
        want.reverse();
        let filter = TaskFilter {
            namespace: Some(ns.to_string()),
            ..TaskFilter::default()
        };
        let page = s.list(&filter, 100).await.expect("list");
        assert_eq!(ids(&page.tasks), want, "namespace {ns}");
        assert!(page.tasks.iter().all(|t| filter.matches(t)));
        // With a queue too: the qualified queue of that namespace only.
        let q = TaskFilter {
            queue: Some(qualify(ns, "emails")),
            ..filter.clone()
        };
        assert_eq!(s.list(&q, 100).await.expect("list").tasks.len(), 1, "{ns}");
    }
    let none = TaskFilter {
        namespace: Some("nowhere".into()),
        ..TaskFilter::default()
    };
    assert!(s.list(&none, 100).await.expect("list").tasks.is_empty());
}

/// `list` returns exactly the tasks matching every given filter field (queue, kind, state, key and
/// the `before` cursor), newest id first, as `get` reads them.
pub async fn list_filters_newest_first(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let spec = |queue: &str, kind: &str| TaskSpec::new(kind).queue(queue);
    let t1 = insert(s, make(spec("q1", "a").key("k1"), at(0))).await;
    let t2 = insert(s, make(spec("q1", "b"), at(0))).await;
    let t3 = insert(s, make(spec("q2", "a").key("k1"), at(0))).await;
    let t4 = insert(s, make(spec("q2", "b").key("k2"), at(0))).await;
    let t5 = insert(s, make(spec("q1", "a").key("k2"), at(0))).await;
    let t6 = insert(s, make(spec("q1", "a"), at(0))).await;
    let t7 = insert(s, make(spec("q2", "a").key("k3"), at(0))).await;
    make_ready(s, t2.id, at(1)).await;
    start(s, t3.id, at(1)).await;
    s.cancel(t4.id, at(1)).await.expect("cancel");
    let (e5, _) = start(s, t5.id, at(1)).await;
    s.complete(t5.id, e5, at(2), None).await.expect("complete");
    // A second live holder of k2 in q1, now that t5 is done.
    let t8 = insert(s, make(spec("q1", "b").key("k2"), at(2))).await;

    let mut all = Vec::new();
    for t in [&t1, &t2, &t3, &t4, &t5, &t6, &t7, &t8] {
        all.push(get(s, t.id).await);
    }
    let f = TaskFilter::default;
    let filters = vec![
        f(),
        TaskFilter {
            queue: Some("q1".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("q2".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("nowhere".into()),
            ..f()
        },
        TaskFilter {
            kind: Some("a".into()),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Scheduled),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Ready),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Running),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Succeeded),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Cancelled),
            ..f()
        },
        TaskFilter {
            state: Some(TaskState::Dead),
            ..f()
        },
        TaskFilter {
            key: Some("k1".into()),
            ..f()
        },
        TaskFilter {
            key: Some("k2".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("q1".into()),
            kind: Some("a".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("q1".into()),
            key: Some("k2".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("q2".into()),
            state: Some(TaskState::Scheduled),
            ..f()
        },
        TaskFilter {
            before: Some(t4.id),
            ..f()
        },
        TaskFilter {
            before: Some(TaskId::MAX),
            ..f()
        },
        TaskFilter {
            before: Some(t1.id),
            ..f()
        },
        TaskFilter {
            queue: Some("q1".into()),
            before: Some(t6.id),
            ..f()
        },
        TaskFilter {
            queue: Some("q1".into()),
            kind: Some("a".into()),
            state: Some(TaskState::Scheduled),
            key: Some("k1".into()),
            before: Some(t8.id),
            ..f()
        },
    ];
    for filter in filters {
        let mut expected: Vec<Task> = all
            .iter()
            .filter(|t| matches_filter(&filter, t))
            .cloned()
            .collect();
        expected.sort_by_key(|t| std::cmp::Reverse(t.id));
        let page = s.list(&filter, 100).await.expect("list");
        assert_eq!(ids(&page.tasks), ids(&expected), "filter {filter:?}");
        assert_eq!(page.tasks, expected, "filter {filter:?}");
        assert_eq!(
            page.next_cursor, None,
            "everything fit in one page: {filter:?}"
        );
    }
}

/// Paging `list` with `next_cursor` as `before` visits every matching task exactly once, newest
/// first, in pages of at most `limit`; `next_cursor` is `None` on the last page (also when that page
/// is exactly full) and, with far fewer tasks than the visit budget, a page with a cursor is
/// never empty.
pub async fn list_paginates_without_gaps_or_duplicates(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut expected = Vec::new();
    for i in 0..7 {
        expected.push(insert(s, due_task("pages", "k", i)).await.id);
        if i % 2 == 0 {
            insert(s, due_task("noise", "k", i)).await;
        }
    }
    expected.reverse();
    let filter = TaskFilter {
        queue: Some("pages".into()),
        ..TaskFilter::default()
    };
    for limit in [1, 2, 3, 6, 7, 8, 100] {
        let mut seen = Vec::new();
        let mut before = None;
        let mut pages = 0;
        loop {
            let page = s
                .list(
                    &TaskFilter {
                        before,
                        ..filter.clone()
                    },
                    limit,
                )
                .await
                .expect("list");
            pages += 1;
            assert!(page.tasks.len() <= limit, "limit {limit}: page too large");
            assert!(!page.tasks.is_empty(), "limit {limit}: empty page {pages}");
            seen.extend(ids(&page.tasks));
            match page.next_cursor {
                Some(c) => before = Some(c),
                None => break,
            }
            assert!(
                pages <= expected.len(),
                "limit {limit}: paging does not end"
            );
        }
        assert_eq!(seen, expected, "limit {limit}");
        assert_eq!(
            pages,
            expected.len().div_ceil(limit),
            "limit {limit}: page count"
        );
    }

    // Filters apply on every page; tasks changing state between pages move out of a state filter.
    let scheduled = TaskFilter {
        queue: Some("pages".into()),
        state: Some(TaskState::Scheduled),
        ..TaskFilter::default()
    };
    let first = s.list(&scheduled, 3).await.expect("list");
    assert_eq!(ids(&first.tasks), expected[..3].to_vec());
    s.cancel(expected[4], at(10)).await.expect("cancel");
    let second = s
        .list(
            &TaskFilter {
                before: first.next_cursor,
                ..scheduled.clone()
            },
            3,
        )
        .await
        .expect("list");
    assert_eq!(
        ids(&second.tasks),
        vec![expected[3], expected[5], expected[6]]
    );
    assert_eq!(second.next_cursor, None);
}

/// Follows `filter`'s cursors from the start in pages of `limit`: every task seen, in order, and
/// the pages. Each page holds at most `limit` tasks, all matching; the paging ends.
async fn follow_pages(
    s: &dyn Store,
    filter: &TaskFilter,
    limit: usize,
) -> (Vec<TaskId>, Vec<TaskPage>) {
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut before = filter.before;
    loop {
        let page = s
            .list(
                &TaskFilter {
                    before,
                    ..filter.clone()
                },
                limit,
            )
            .await
            .expect("list");
        assert!(page.tasks.len() <= limit, "{filter:?}: page too large");
        assert!(
            page.tasks.iter().all(|t| filter.matches(t)),
            "{filter:?}: a task that does not match"
        );
        seen.extend(ids(&page.tasks));
        let next = page.next_cursor;
        pages.push(page);
        match next {
            Some(c) => {
                assert!(
                    before.is_none_or(|b| c < b),
                    "{filter:?}: the cursor must move on"
                );
                before = Some(c);
            }
            None => break,
        }
        assert!(pages.len() <= 10_000, "{filter:?}: paging does not end");
    }
    (seen, pages)
}

/// A page visits at most [`crate::LIST_VISIT_BUDGET`] candidates of its driving index: with more
/// tasks than that, two filters that match few tasks together (the one match the oldest task, or
/// none) answer a first page that stopped short, with no task and a cursor; following the
/// cursors yields exactly the tasks [`TaskFilter::matches`] selects, newest first, each once,
/// for every kind of driver (queue, queue and state, kind, tag, key prefix probed or not, the id).
pub async fn list_pages_visit_a_bounded_number_of_rows(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let budget = crate::LIST_VISIT_BUDGET;
    let n = budget + budget / 4;
    let mut news = Vec::with_capacity(n);
    for i in 0..n {
        // Nine in ten tasks are in `qa`, all of kind `common` but the oldest: `qa` + `rare`
        // is the oldest task alone, `qb` + `common` is nothing.
        let (queue, kind) = match i {
            0 => ("qa", "rare"),
            _ if i % 10 == 9 => ("qb", "rare"),
            _ => ("qa", "common"),
        };
        // A few keys of their own prefix; the others share a prefix wider than the budget.
        let key = if i % 500 == 3 {
            format!("narrow-{i:05}")
        } else {
            format!("wide-{i:05}")
        };
        let mut spec = TaskSpec::new(kind).queue(queue).key(key);
        if i % 7 == 0 {
            spec = spec.tag("env", "x");
        }
        news.push(make(spec, at(i64::try_from(i).unwrap_or(i64::MAX))));
    }
    let mut all = Vec::with_capacity(n);
    for chunk in news.chunks(250) {
        for r in s.insert(chunk.to_vec()).await.expect("insert") {
            match r {
                Inserted::Created(t) => all.push(*t),
                other => panic!("expected the task to be created, got {other:?}"),
            }
        }
    }
    all.sort_by_key(|t| std::cmp::Reverse(t.id));
    let oldest = all.last().map(|t| t.id).expect("tasks");

    let f = TaskFilter::default;
    let rare_in_qa = TaskFilter {
        queue: Some("qa".into()),
        kind: Some("rare".into()),
        ..f()
    };
    let first = s.list(&rare_in_qa, 10).await.expect("list");
    assert!(
        first.tasks.is_empty(),
        "the only match lies beyond the budget: {:?}",
        ids(&first.tasks)
    );
    assert!(
        first.next_cursor.is_some(),
        "a short page that stopped at the budget has a cursor"
    );
    let (seen, _) = follow_pages(s, &rare_in_qa, 10).await;
    assert_eq!(seen, vec![oldest]);

    let filters = vec![
        rare_in_qa.clone(),
        TaskFilter {
            queue: Some("qb".into()),
            kind: Some("common".into()),
            ..f()
        },
        TaskFilter {
            queue: Some("qa".into()),
            state: Some(TaskState::Scheduled),
            kind: Some("rare".into()),
            ..f()
        },
        TaskFilter {
            kind: Some("rare".into()),
            ..f()
        },
        TaskFilter {
            kind: Some("common".into()),
            created_before: Some(at(40)),
            ..f()
        },
        TaskFilter {
            tags: vec![("env".into(), "x".into())],
            queue: Some("qb".into()),
            ..f()
        },
        TaskFilter {
            key_prefix: Some("narrow-".into()),
            ..f()
        },
        TaskFilter {
            key_prefix: Some("narrow-".into()),
            queue: Some("qa".into()),
            ..f()
        },
        TaskFilter {
            key_prefix: Some("wide-".into()),
            kind: Some("rare".into()),
            ..f()
        },
        TaskFilter {
            key_prefix: Some("wide-0000".into()),
            ..f()
        },
        TaskFilter {
            created_before: Some(at(5)),
            ..f()
        },
        TaskFilter {
            created_after: Some(at(i64::try_from(n).unwrap_or(i64::MAX) - 5)),
            exclude_internal: true,
            ..f()
        },
        f(),
    ];
    for filter in &filters {
        let expected: Vec<TaskId> = all
            .iter()
            .filter(|t| filter.matches(t))
            .map(|t| t.id)
            .collect();
        for limit in [7, 100] {
            let (seen, _) = follow_pages(s, filter, limit).await;
            assert_eq!(seen, expected, "limit {limit}: {filter:?}");
        }
    }
    // A prefix whose keys fit the budget is read from the key index: its matches come in one
    // page, however far apart.
    let narrow = TaskFilter {
        key_prefix: Some("narrow-".into()),
        ..f()
    };
    let page = s.list(&narrow, 100).await.expect("list");
    assert_eq!(page.tasks.len(), n.div_ceil(500));
    assert_eq!(page.next_cursor, None);
}

// ---------------------------------------------------------------------------------------------
// Terminal states
// ---------------------------------------------------------------------------------------------

/// A terminal task never changes again: attempt writes are `StaleExecution`, `cancel` and `trigger`
/// are `WrongState`, claims are `NotClaimable`, leases do not expire and workers never receive it;
/// its row stays exactly as it was.
pub async fn terminal_states_never_change(store: Arc<dyn Store>) {
    let s = store.as_ref();
    // Succeeded.
    let ok = insert(s, due_task("q", "k", 0)).await;
    let (e_ok, _) = start(s, ok.id, at(0)).await;
    s.complete(ok.id, e_ok, at(1), Some("true".into()))
        .await
        .expect("complete");
    // Dead.
    let dead = insert(s, due_task("q", "k", 0)).await;
    let (e_dead, _) = start(s, dead.id, at(0)).await;
    s.fail(dead.id, e_dead, at(1), "x".into(), Retry::Never)
        .await
        .expect("fail");
    // Cancelled while running, with a lease that has long ended.
    let gone = insert(s, due_task("q", "k", 0)).await;
    let (e_gone, _) = start_with_lease(s, gone.id, at(0), at(10)).await;
    s.cancel(gone.id, at(1)).await.expect("cancel");
    // Cancelled while ready.
    let gone_ready = insert(s, due_task("q", "k", 0)).await;
    make_ready(s, gone_ready.id, at(0)).await;
    s.cancel(gone_ready.id, at(1)).await.expect("cancel");

    let cases = [
        (ok.id, e_ok, TaskState::Succeeded),
        (dead.id, e_dead, TaskState::Dead),
        (gone.id, e_gone, TaskState::Cancelled),
        (gone_ready.id, execution_id(), TaskState::Cancelled),
    ];
    let mut before = Vec::new();
    for (id, _, _) in &cases {
        before.push(get(s, *id).await);
    }
    let later = at(100_000);
    for (id, exec, state) in cases {
        assert_attempt_writes_stale(s, id, exec, state, later).await;
        assert_wrong_state(s.cancel(id, later).await, state, "cancel");
        assert_wrong_state(s.trigger(id, later).await, state, "trigger");
        assert_not_claimable(
            claim(s, id, run_target(execution_id(), at(200_000)), later).await,
            "run claim",
        );
        assert_not_claimable(claim(s, id, ClaimTarget::Ready, later).await, "ready claim");
    }
    assert!(
        s.expire_leases(later, 100, None)
            .await
            .expect("expire_leases")
            .is_empty()
    );
    assert!(
        s.claim_ready(ready_claim("q", 10, "w", later))
            .await
            .expect("claim_ready")
            .tasks
            .is_empty()
    );
    for t in &before {
        assert_eq!(&get(s, t.id).await, t, "a terminal task never changes");
    }
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("q", TaskState::Succeeded, 1),
            ("q", TaskState::Dead, 1),
            ("q", TaskState::Cancelled, 2),
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// The store decides retries and leases from the row; owner writes carry their fence
// ---------------------------------------------------------------------------------------------

/// `fail` with [`Retry::Backoff`] reschedules after the task's own backoff for the attempt while
/// attempts remain and makes it `dead` once they are used up; [`Retry::At`] is refused the same
/// way on the last attempt; the caller never reads the task first.
pub async fn fail_retry_follows_the_tasks_backoff_and_attempts(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(
        s,
        make(
            TaskSpec::new("k")
                .queue("q")
                .run_at(at(0))
                .max_attempts(2)
                .backoff(Backoff::exponential(
                    Duration::from_millis(1_000),
                    3.0,
                    Duration::from_secs(60),
                )),
            at(0),
        ),
    )
    .await;
    let (e1, _) = start(s, t.id, at(0)).await;
    // Attempt 1, jitter 20 % with a draw of 0.5: 1,000 ms × 0.9.
    let failed = s
        .fail(
            t.id,
            e1,
            at(10),
            "first".into(),
            Retry::Backoff { draw: 0.5 },
        )
        .await
        .expect("fail");
    assert_eq!(failed.state, TaskState::Scheduled);
    assert_eq!(failed.due_at, at(10 + 900));
    assert_eq!(failed.last_error.as_deref(), Some("first"));
    let (e2, _) = start(s, t.id, at(910)).await;
    let dead = s
        .fail(
            t.id,
            e2,
            at(920),
            "second".into(),
            Retry::Backoff { draw: 0.5 },
        )
        .await
        .expect("fail");
    assert_eq!(dead.state, TaskState::Dead, "attempts used up");
    assert_eq!(dead.finished_at, Some(at(920)));

    let u = insert(
        s,
        make(
            TaskSpec::new("k").queue("q").run_at(at(0)).max_attempts(1),
            at(0),
        ),
    )
    .await;
    let (eu, _) = start(s, u.id, at(0)).await;
    let dead = s
        .fail(u.id, eu, at(5), "only".into(), Retry::At(at(6)))
        .await
        .expect("fail");
    assert_eq!(
        dead.state,
        TaskState::Dead,
        "no attempt left for a retry at a time"
    );
    // A stale execution id is refused, whatever the retry.
    assert_stale(
        s.fail(u.id, eu, at(7), "late".into(), Retry::Backoff { draw: 0.0 })
            .await,
        TaskState::Dead,
        "fail with backoff",
    );
}

/// A fence the store never granted is refused, nothing written: `claim_due` and
/// `expire_leases` answer `LeaseLost` and the tasks keep their state. (A store without shard
/// leases grants none; a cluster store's own tests check the granted and stolen cases.)
pub async fn fenced_owner_writes_need_a_current_fence(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(
        s,
        make_on_shard(TaskSpec::new("k").queue("q").run_at(at(0)), at(0), 1),
    )
    .await;
    let fence = crate::Fence {
        shard: 1,
        range_id: 987_654,
    };
    let r = s
        .claim_due(
            vec![DueClaim {
                id: t.id,
                target: ClaimTarget::Ready,
            }],
            at(10),
            Some(fence),
        )
        .await;
    assert!(
        matches!(r, Err(crate::StoreError::LeaseLost { shard: 1 })),
        "fenced claim: {r:?}"
    );
    assert_eq!(
        get(s, t.id).await.state,
        TaskState::Scheduled,
        "nothing claimed"
    );
    let r = s.claim_due(Vec::new(), at(10), Some(fence)).await;
    assert!(
        matches!(r, Err(crate::StoreError::LeaseLost { .. })),
        "an empty fenced claim still checks the fence: {r:?}"
    );
    let running = insert(
        s,
        make_on_shard(TaskSpec::new("k").queue("q").run_at(at(0)), at(0), 1),
    )
    .await;
    start_with_lease(s, running.id, at(0), at(5)).await;
    let r = s.expire_leases(at(100), 10, Some(fence)).await;
    assert!(
        matches!(r, Err(crate::StoreError::LeaseLost { shard: 1 })),
        "fenced expiry: {r:?}"
    );
    assert_eq!(
        get(s, running.id).await.state,
        TaskState::Running,
        "nothing expired"
    );
}

/// `next_lease_expiry(Some(shard))` looks at that shard's running tasks only.
pub async fn next_lease_expiry_of_one_shard(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let a = insert(
        s,
        make_on_shard(TaskSpec::new("k").queue("q").run_at(at(0)), at(0), 0),
    )
    .await;
    let b = insert(
        s,
        make_on_shard(TaskSpec::new("k").queue("q").run_at(at(0)), at(0), 1),
    )
    .await;
    start_with_lease(s, a.id, at(0), at(100)).await;
    start_with_lease(s, b.id, at(0), at(200)).await;
    let next = |shard| async move { s.next_lease_expiry(shard).await.expect("next_lease_expiry") };
    assert_eq!(next(None).await, Some(at(100)));
    assert_eq!(next(Some(0)).await, Some(at(100)));
    assert_eq!(next(Some(1)).await, Some(at(200)));
    assert_eq!(next(Some(2)).await, None);
}

/// An idempotent create, by `key` and `version`, of `spec` at `now` (fingerprint `fp`), kept
/// `remember_ms` after its task finishes.
fn idem(spec: TaskSpec, key: &str, version: u64, fp: &str, now: Timestamp) -> IdempotentCreate {
    IdempotentCreate {
        task: make(spec, now),
        key: key.to_string(),
        version,
        fingerprint: fp.to_string(),
        remember: Remember::AfterFinish { ms: 1_000 },
        now,
    }
}

/// A repeat (same key, version and fingerprint) answers the first task and stores nothing; the
/// same key and version with another fingerprint, or an older version, is a conflict; a newer
/// version stores a new task; keys are per queue.
pub async fn idempotent_create_repeats_conflicts_and_versions(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let spec = || TaskSpec::new("k").queue("q").payload(json!({"n": 1}));
    let first = match s
        .insert_idempotent(idem(spec(), "K", 0, "A", at(0)))
        .await
        .expect("first")
    {
        IdempotentOutcome::Created(t) => *t,
        other => panic!("expected created, got {other:?}"),
    };
    let again = idem(spec(), "K", 0, "A", at(1));
    let again_id = again.task.id;
    match s.insert_idempotent(again).await.expect("repeat") {
        IdempotentOutcome::Repeat(t) => assert_eq!(t.id, first.id, "the first request's task"),
        other => panic!("expected a repeat, got {other:?}"),
    }
    assert!(
        s.get(again_id).await.expect("get").is_none(),
        "a repeat stores nothing"
    );
    let other = idem(spec(), "K", 0, "B", at(2));
    let other_id = other.task.id;
    assert_eq!(
        s.insert_idempotent(other).await.expect("conflict"),
        IdempotentOutcome::Conflict {
            existing: first.id,
            version: 0
        },
        "same key and version, another request"
    );
    assert!(s.get(other_id).await.expect("get").is_none());
    let v2 = match s
        .insert_idempotent(idem(spec(), "K", 2, "C", at(3)))
        .await
        .expect("newer version")
    {
        IdempotentOutcome::Created(t) => *t,
        other => panic!("a newer version is stored, got {other:?}"),
    };
    assert_ne!(v2.id, first.id);
    assert_eq!(
        s.insert_idempotent(idem(spec(), "K", 1, "C", at(4)))
            .await
            .expect("older version"),
        IdempotentOutcome::Conflict {
            existing: v2.id,
            version: 2
        },
        "an older version than the remembered one"
    );
    match s
        .insert_idempotent(idem(spec(), "K", 2, "C", at(5)))
        .await
        .expect("repeat of v2")
    {
        IdempotentOutcome::Repeat(t) => assert_eq!(t.id, v2.id),
        other => panic!("expected a repeat of version 2, got {other:?}"),
    }
    // Another queue, the same key: its own record.
    let elsewhere = TaskSpec::new("k").queue("q2").payload(json!({"n": 1}));
    assert!(matches!(
        s.insert_idempotent(idem(elsewhere, "K", 0, "A", at(6)))
            .await
            .expect("other queue"),
        IdempotentOutcome::Created(_)
    ));
    assert_eq!(
        counts(s).await,
        count_map(&[
            ("q", TaskState::Scheduled, 2),
            ("q2", TaskState::Scheduled, 1)
        ])
    );
}

/// A key is remembered while its task is live, and for `remember_ms` after it finished; then a
/// create with it stores a new task. A task key held by a live task still wins (`Duplicate`).
pub async fn idempotency_is_remembered_until_the_window_after_the_task_finished(
    store: Arc<dyn Store>,
) {
    let s = store.as_ref();
    let spec = || TaskSpec::new("k").queue("q");
    let first = match s
        .insert_idempotent(idem(spec(), "K", 0, "A", at(0)))
        .await
        .expect("first")
    {
        IdempotentOutcome::Created(t) => *t,
        other => panic!("expected created, got {other:?}"),
    };
    let (exec, _) = start(s, first.id, at(10)).await;
    // Live (running) long after any window: still a repeat.
    assert!(matches!(
        s.insert_idempotent(idem(spec(), "K", 0, "A", at(5_000)))
            .await
            .expect("live"),
        IdempotentOutcome::Repeat(_)
    ));
    s.complete(first.id, exec, at(6_000), None)
        .await
        .expect("complete");
    assert!(
        matches!(
            s.insert_idempotent(idem(spec(), "K", 0, "A", at(6_999)))
                .await
                .expect("inside"),
            IdempotentOutcome::Repeat(_)
        ),
        "inside the window after it finished"
    );
    match s
        .insert_idempotent(idem(spec(), "K", 0, "A", at(7_000)))
        .await
        .expect("after")
    {
        IdempotentOutcome::Created(t) => assert_ne!(t.id, first.id),
        other => panic!("after the window a new task is stored, got {other:?}"),
    }
    // A live holder of the task key refuses the create, idempotent or not.
    let keyed = || TaskSpec::new("k").queue("q").key("B");
    let holder = insert(s, make(keyed(), at(8_000))).await;
    assert_eq!(
        s.insert_idempotent(idem(keyed(), "K2", 0, "A", at(8_001)))
            .await
            .expect("duplicate"),
        IdempotentOutcome::Duplicate {
            existing: holder.id
        }
    );
}

/// A record kept `AfterCreate` answers with its task for that long after it was made, even after
/// the task finished, and no longer: then the next create is stored and remembered in turn.
pub async fn a_throttle_record_answers_for_its_period_after_it_was_made(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let create = |n: i64| IdempotentCreate {
        remember: Remember::AfterCreate { ms: 1_000 },
        ..idem(TaskSpec::new("k").queue("q"), "T", 0, "throttle", at(n))
    };
    let admitted = match s.insert_idempotent(create(0)).await.expect("first") {
        IdempotentOutcome::Created(t) => *t,
        other => panic!("expected created, got {other:?}"),
    };
    let (exec, _) = start(s, admitted.id, at(10)).await;
    s.complete(admitted.id, exec, at(20), None)
        .await
        .expect("complete");
    match s.insert_idempotent(create(999)).await.expect("inside") {
        IdempotentOutcome::Repeat(t) => assert_eq!(t.id, admitted.id, "the admitted task"),
        other => panic!("inside the period the admitted task answers, got {other:?}"),
    }
    let next = match s.insert_idempotent(create(1_000)).await.expect("after") {
        IdempotentOutcome::Created(t) => *t,
        other => panic!("after the period a new task is stored, got {other:?}"),
    };
    assert_ne!(next.id, admitted.id);
    match s
        .insert_idempotent(create(1_999))
        .await
        .expect("second period")
    {
        IdempotentOutcome::Repeat(t) => assert_eq!(t.id, next.id, "measured from the new record"),
        other => panic!("expected the second admitted task, got {other:?}"),
    }
}

/// A debounced create of `payload` at `now`, due `delay_ms` later, under key `D` of queue `q`.
fn debounced(payload: i64, now: i64, delay_ms: u64, max_wait_ms: Option<u64>) -> DebouncedCreate {
    DebouncedCreate {
        task: make(
            TaskSpec::new("k")
                .queue("q")
                .payload(json!({ "n": payload }))
                .delay(std::time::Duration::from_millis(delay_ms)),
            at(now),
        ),
        key: "D".to_string(),
        max_wait_ms,
        now: at(now),
    }
}

/// The pending task of a debounce key takes each later create's payload and due time (never
/// past its create plus `max_wait`), and a claim at its old due time finds it not due; once it
/// has started, the next create stores a new task. Keys are per queue.
pub async fn a_debounced_create_replaces_the_pending_task_of_its_key(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let first = match s
        .insert_debounced(debounced(1, 0, 1_000, Some(1_500)))
        .await
        .expect("first")
    {
        DebounceOutcome::Created(t) => *t,
        other => panic!("expected created, got {other:?}"),
    };
    assert_eq!(first.due_at, at(1_000));
    let second = debounced(2, 500, 1_000, Some(1_500));
    let second_id = second.task.id;
    let moved = match s.insert_debounced(second).await.expect("second") {
        DebounceOutcome::Replaced(t) => *t,
        other => panic!("expected the pending task replaced, got {other:?}"),
    };
    assert_eq!(moved.id, first.id);
    assert_eq!(moved.payload, json!({"n": 2}));
    assert_eq!(moved.due_at, at(1_500), "now + delay");
    assert!(
        s.get(second_id).await.expect("get").is_none(),
        "nothing new stored"
    );
    assert_not_claimable(
        claim(s, first.id, ClaimTarget::Ready, at(1_000)).await,
        "a claim at the old due time",
    );
    let capped = match s
        .insert_debounced(debounced(3, 1_000, 1_000, Some(1_500)))
        .await
        .expect("third")
    {
        DebounceOutcome::Replaced(t) => *t,
        other => panic!("expected replaced, got {other:?}"),
    };
    assert_eq!(
        capped.due_at,
        at(1_500),
        "never past the first create + max_wait"
    );
    assert_eq!(capped.created_at, first.created_at);
    // Another queue: its own pending task.
    let mut elsewhere = debounced(4, 1_100, 1_000, None);
    elsewhere.task.queue = "q2".to_string();
    assert!(matches!(
        s.insert_debounced(elsewhere).await.expect("other queue"),
        DebounceOutcome::Created(_)
    ));
    // Started: no longer pending, so the next create is a new task.
    start(s, first.id, at(1_500)).await;
    match s
        .insert_debounced(debounced(5, 1_600, 1_000, None))
        .await
        .expect("after the start")
    {
        DebounceOutcome::Created(t) => {
            assert_ne!(t.id, first.id);
            assert_eq!(t.due_at, at(2_600));
        }
        other => panic!("expected a new task, got {other:?}"),
    }
}

/// Concurrent debounced creates with one key leave exactly one pending task, with one of their
/// payloads.
pub async fn concurrent_debounced_creates_leave_one_pending_task(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let calls: Vec<BoxFuture<'_, _>> = (0..40)
        .map(|n| s.insert_debounced(debounced(n, n, 10_000, None)))
        .collect();
    let outcomes = join_all(calls).await;
    let mut created = Vec::new();
    let mut replaced = Vec::new();
    for o in outcomes {
        match o.expect("debounced create") {
            DebounceOutcome::Created(t) => created.push(t.id),
            DebounceOutcome::Replaced(t) => replaced.push(t.id),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one stored");
    assert!(replaced.iter().all(|id| *id == created[0]));
    assert_eq!(
        counts(s).await,
        count_map(&[("q", TaskState::Scheduled, 1)]),
        "one pending task"
    );
}
