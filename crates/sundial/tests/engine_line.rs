//! The line of a queue's handler slots across shard loops (`engine::line`) under a backlog: a
//! loop that finds many slots free takes all but one for each other loop whose waiting entry
//! ranks ahead, so a backlogged queue is claimed in batches, not one task per claim.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use common::*;
use sundial::{Config, ManualClock, Sundial, TaskSpec, TaskState};
use sundial_core::Timestamp;
use sundial_store::{ClaimOutcome, DueClaim, Fence, Store, StoreError};
use tokio::sync::Semaphore;

/// Counts `claim_due` calls and the claims in them.
#[derive(Default)]
struct Claims {
    calls: AtomicUsize,
    claims: AtomicUsize,
}

struct Count(Arc<Claims>);

#[async_trait]
impl Intercept for Count {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        self.0.claims.fetch_add(claims.len(), Ordering::SeqCst);
        inner.claim_due(claims, now, fence).await
    }
}

const SLOTS: usize = 16;
const BACKLOG: usize = 320;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlogged_queue_is_claimed_in_batches_across_shard_loops() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(Claims::default());
    let store = Arc::new(common::intercept::sqlite(dir.path(), Count(claims.clone())));
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(Config {
            shard_count: 4,
            default_concurrency: SLOTS,
            ..Config::default()
        })
        .clock(Arc::new(clock.clone()))
        .with_store(store)
        .unwrap();
    // Handlers hold their slot until the gate opens.
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let (g, h) = (gate.clone(), held.clone());
    sundial.register("p", move |_ctx: sundial::TaskContext| {
        let (g, h) = (g.clone(), h.clone());
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            drop(g.acquire().await);
            h.fetch_sub(1, Ordering::SeqCst);
            Ok::<(), String>(())
        }
    });
    let due = Timestamp(T0.0 + 1_000);
    let mut ids = Vec::new();
    for _ in 0..SLOTS + BACKLOG {
        ids.push(
            sundial
                .schedule(TaskSpec::new("p").run_at(due))
                .await
                .unwrap(),
        );
    }
    let mut stepper = sundial.stepper();
    clock.advance(Duration::from_secs(1));
    let holding = || held.load(Ordering::SeqCst);
    while holding() < SLOTS {
        stepper.settle_holding(holding).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Every slot is held and each loop waits in line with its best entry.
    let calls_before = claims.calls.load(Ordering::SeqCst);
    gate.add_permits(100_000);
    for id in &ids {
        while sundial.get(*id).await.unwrap().unwrap().state != TaskState::Succeeded {
            stepper.settle().await;
        }
    }
    let calls = claims.calls.load(Ordering::SeqCst) - calls_before;
    // Slots free up a claim's worth at a time; a loop takes them but one for each other loop
    // whose best entry ranks ahead (three at most), so a claim carries several tasks. Leaving
    // every free slot to a better-ranked waiter took one task per claim here.
    assert!(
        calls * 3 <= BACKLOG,
        "{calls} claims for a backlog of {BACKLOG} tasks"
    );
}
