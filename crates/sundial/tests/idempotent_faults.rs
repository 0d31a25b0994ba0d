//! Ambiguous commits: a store wrapper that, for a few percent of calls, commits and then answers
//! an error (the answer lost, as when a connection drops mid-commit), or answers an error without
//! committing. Clients that retry creates with the same idempotency key get the original task,
//! never a second one; a retried complete is applied once and answers the task.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use rand::{Rng, SeedableRng};
use sundial::{Error, Idempotency, ManualClock, StoreError, Sundial, TaskSpec, TaskState};
use sundial_core::{ExecutionId, Task, TaskId, Timestamp};
use sundial_store::forwarding::{Forwarding, Hooks};
use sundial_store::{IdempotentCreate, IdempotentOutcome, Store, TransitionError};

/// Percent of calls that commit and then fail, and that fail without committing.
const COMMIT_THEN_FAIL: u32 = 5;
const FAIL_BEFORE: u32 = 5;

struct Flaky {
    rng: Mutex<rand::rngs::StdRng>,
    committed_then_failed: AtomicUsize,
    failed_before: AtomicUsize,
}

enum Fate {
    FailBefore,
    CommitThenFail,
    Pass,
}

impl Flaky {
    fn fate(&self) -> Fate {
        let roll = self.rng.lock().unwrap().random_range(0..100);
        if roll < FAIL_BEFORE {
            self.failed_before.fetch_add(1, Ordering::SeqCst);
            Fate::FailBefore
        } else if roll < FAIL_BEFORE + COMMIT_THEN_FAIL {
            self.committed_then_failed.fetch_add(1, Ordering::SeqCst);
            Fate::CommitThenFail
        } else {
            Fate::Pass
        }
    }
}

fn lost() -> StoreError {
    StoreError::unavailable(sundial_store::Reason("injected: the connection broke"))
}

#[async_trait]
impl Hooks for Flaky {
    async fn insert_idempotent(
        &self,
        inner: &dyn Store,
        create: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError> {
        match self.fate() {
            Fate::FailBefore => Err(lost()),
            Fate::CommitThenFail => {
                inner.insert_idempotent(create).await?;
                Err(lost())
            }
            Fate::Pass => inner.insert_idempotent(create).await,
        }
    }
    async fn complete(
        &self,
        inner: &dyn Store,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        match self.fate() {
            Fate::FailBefore => Err(lost().into()),
            Fate::CommitThenFail => {
                inner.complete(id, execution, now, result).await?;
                Err(lost().into())
            }
            Fate::Pass => inner.complete(id, execution, now, result).await,
        }
    }
}

fn unavailable(e: &Error) -> bool {
    matches!(e, Error::Store(StoreError::Unavailable { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_creates_and_completes_under_ambiguous_commits_apply_once() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn Store> = Arc::new(
        sundial::SqliteStore::open_dir(dir.path(), sundial::SqliteOptions::default()).unwrap(),
    );
    let hooks = Flaky {
        rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(7)),
        committed_then_failed: AtomicUsize::new(0),
        failed_before: AtomicUsize::new(0),
    };
    let store = Arc::new(Forwarding::new(inner.clone(), hooks));
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .clock(Arc::new(clock.clone()))
        .with_store(store.clone())
        .expect("a valid config");
    let _running = sundial.start();
    const ORDERS: usize = 300;
    // Create every order, retrying each until it is answered.
    let mut created: HashMap<usize, TaskId> = HashMap::new();
    let mut create_retries = 0;
    for n in 0..ORDERS {
        let spec = || {
            TaskSpec::new("ship")
                .queue("orders")
                .payload(serde_json::json!({"order": n}))
        };
        loop {
            match sundial
                .create_idempotent(spec(), Idempotency::new(format!("order-{n}")))
                .await
            {
                Ok(c) => {
                    if let Some(first) = created.insert(n, c.task.id) {
                        assert_eq!(first, c.task.id);
                    }
                    break;
                }
                Err(e) if unavailable(&e) => create_retries += 1,
                Err(e) => panic!("create {n}: {e}"),
            }
        }
    }
    // Work them off: poll, complete, retrying each complete until it is answered.
    let mut completed: HashMap<TaskId, usize> = HashMap::new();
    let mut complete_retries = 0;
    let deadline = std::time::Duration::from_secs(60);
    let started = sundial::Clock::now(&sundial::SystemClock);
    while completed.len() < ORDERS {
        assert!(
            sundial::Clock::now(&sundial::SystemClock).since(started) < deadline,
            "only {} of {ORDERS} completed within a minute",
            completed.len()
        );
        let got = match sundial
            .poll("orders", Some("w".into()), None, 50, Duration::ZERO)
            .await
        {
            Ok(g) => g,
            Err(e) if unavailable(&e) => continue,
            Err(e) => panic!("poll: {e}"),
        };
        for t in got {
            let exec = t.execution_id.unwrap();
            loop {
                match sundial.complete(t.id, exec, None).await {
                    Ok(done) => {
                        assert_eq!(done.state, TaskState::Succeeded);
                        *completed.entry(t.id).or_default() += 1;
                        break;
                    }
                    Err(e) if unavailable(&e) => complete_retries += 1,
                    Err(e) => panic!("complete {}: {e}", t.id),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // One task per order, each succeeded once, as attempt 1.
    let all = inner
        .list(&sundial_store::TaskFilter::default(), 10_000)
        .await
        .unwrap()
        .tasks;
    let mut per_order: HashMap<i64, Vec<&Task>> = HashMap::new();
    for t in &all {
        per_order
            .entry(t.payload["order"].as_i64().unwrap())
            .or_default()
            .push(t);
    }
    assert_eq!(all.len(), ORDERS, "one task per order, never a second");
    for (order, tasks) in &per_order {
        assert_eq!(tasks.len(), 1, "order {order}");
        assert_eq!(tasks[0].id, created[&(*order as usize)]);
        assert_eq!(tasks[0].state, TaskState::Succeeded);
        assert_eq!(tasks[0].attempt, 1, "completed once, never re-run");
    }
    assert!(completed.values().all(|n| *n == 1));
    let h = &store.hooks;
    let (ctf, fb) = (
        h.committed_then_failed.load(Ordering::SeqCst),
        h.failed_before.load(Ordering::SeqCst),
    );
    assert!(ctf > 0 && fb > 0, "faults were injected: {ctf} {fb}");
    println!(
        "ambiguous commits: {ORDERS} orders, {ctf} calls committed then failed, {fb} failed \
         before committing; {create_retries} create retries and {complete_retries} complete \
         retries; {} tasks stored, each completed once",
        all.len()
    );
}
