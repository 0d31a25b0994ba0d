//! A shard loop that panics is restarted (with backoff on the engine's clock) instead of leaving
//! its shard dead until the process restarts: a store wrapper panics once inside a claim, and the
//! task that claim was for still runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use common::{T0, next_run};
use sundial::{Config, ManualClock, Store, StoreError, Sundial, TaskContext, TaskSpec, Timestamp};
use sundial_store::{ClaimOutcome, DueClaim, Fence};
use tokio::sync::mpsc;

/// Panics on the first due claim, forwards every later one.
struct PanicOnce {
    panicked: AtomicBool,
}

#[async_trait]
impl Intercept for PanicOnce {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("injected panic inside a claim");
        }
        inner.claim_due(claims, now, fence).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_loop_that_panics_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        PanicOnce {
            panicked: AtomicBool::new(false),
        },
    ));
    let (sundial, clock, mut runs) = common::one_shard_recording(store.clone());
    let mut stepper = sundial.stepper();
    let id = sundial.schedule(TaskSpec::new("k")).await.unwrap();
    // The first turn claims the task and the claim panics: the turn reports it and the loop is
    // restarted after its backoff, on the engine's clock.
    let next = stepper.turn().await;
    assert!(store.hooks.panicked.load(Ordering::SeqCst), "the claim ran");
    assert_eq!(stepper.restarts(), 1, "the panic counted as a restart");
    assert!(next > T0, "the restart waits for its backoff");
    // Before the backoff ends the fresh loop does nothing.
    assert_eq!(stepper.turn().await, next);
    assert!(runs.try_recv().is_err());
    clock.set(next);
    stepper.settle().await;
    let r = next_run(&mut runs).await;
    assert_eq!(r.id, id);
    assert_eq!(stepper.restarts(), 1);
    sundial.start().shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_engine_restarts_a_panicked_shard_loop() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        PanicOnce {
            panicked: AtomicBool::new(false),
        },
    ));
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(Config {
            shard_count: 1,
            ..Config::default()
        })
        .clock(Arc::new(clock.clone()))
        .with_store(store.clone())
        .expect("a valid config");
    let (tx, mut runs) = mpsc::unbounded_channel();
    sundial.register("k", move |ctx: TaskContext| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(ctx.task.id);
            Ok::<(), sundial::HandlerError>(())
        }
    });
    let running = sundial.start();
    let id = sundial.schedule(TaskSpec::new("k")).await.unwrap();
    // Wait (bounded, real time) for the panic, then move the engine's clock past any backoff.
    for _ in 0..500 {
        if store.hooks.panicked.load(Ordering::SeqCst) {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(store.hooks.panicked.load(Ordering::SeqCst), "the claim ran");
    let got = loop {
        clock.advance(Duration::from_secs(1));
        match tokio::time::timeout(Duration::from_millis(100), runs.recv()).await {
            Ok(got) => break got,
            Err(_) if clock_passed(&clock, Duration::from_secs(30)) => {
                panic!("the shard loop was not restarted")
            }
            Err(_) => {}
        }
    };
    assert_eq!(got, Some(id));
    running.shutdown(Duration::from_secs(1)).await;
}

fn clock_passed(clock: &ManualClock, d: Duration) -> bool {
    sundial::Clock::now(clock) > T0.saturating_add(d)
}
