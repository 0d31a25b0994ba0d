//! A store that fails (the database is down) makes a shard loop back off, never spin, and the
//! backoff is capped so dispatch resumes soon after the store answers again: a claim that fails
//! keeps its entries in the window and is retried after a pause that doubles up to one second.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use common::{T0, next_run};
use sundial::{Store, StoreError, TaskSpec, Timestamp};
use sundial_store::{ClaimOutcome, DueClaim, Fence};

/// Fails every due claim while `down` is set.
#[derive(Default)]
struct Outage {
    down: AtomicBool,
    refused: AtomicUsize,
}

#[async_trait]
impl Intercept for Outage {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::unavailable(sundial_store::Reason(
                "injected outage",
            )));
        }
        inner.claim_due(claims, now, fence).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_claim_backs_off_up_to_a_second_and_dispatch_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::intercept::sqlite(dir.path(), Outage::default()));
    store.hooks.down.store(true, Ordering::SeqCst);
    let (sundial, clock, mut runs) = common::one_shard_recording(store.clone());
    let mut stepper = sundial.stepper();
    let id = sundial.schedule(TaskSpec::new("k")).await.unwrap();

    // The claim fails: the loop asks for its next turn later, not at once (it would spin).
    let next = stepper.turn().await;
    assert_eq!(store.hooks.refused.load(Ordering::SeqCst), 1);
    assert!(
        next > T0,
        "a failed claim is retried after a pause, not at once"
    );

    // The pause doubles while the store keeps failing, and never passes a second.
    let mut pauses = Vec::new();
    let mut at = next;
    for _ in 0..12 {
        clock.set(at);
        let next = stepper.turn().await;
        pauses.push(next.0 - at.0);
        at = next;
    }
    assert!(
        pauses.windows(2).all(|w| w[1] >= w[0]),
        "the pause grows: {pauses:?}"
    );
    assert_eq!(
        *pauses.last().unwrap(),
        1_000,
        "capped at a second: {pauses:?}"
    );
    assert!(pauses.iter().all(|p| *p <= 1_000), "{pauses:?}");
    assert!(
        runs.try_recv().is_err(),
        "nothing ran while the store failed"
    );

    // The store answers again: the next try, at most a second later, claims and runs the task.
    store.hooks.down.store(false, Ordering::SeqCst);
    clock.set(at);
    stepper.settle().await;
    let r = next_run(&mut runs).await;
    assert_eq!(r.id, id);
    sundial.start().shutdown(Duration::from_secs(1)).await;
}
