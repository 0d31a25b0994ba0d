//! Exclusive keys in `wait` mode: a task refused as busy runs as soon as the holder finishes,
//! even when the holder finishes in the instant between the refusal and the waiter's
//! registration (the race is forced by a store wrapper that lets the holder finish before it
//! answers the waiter's claim). The clock never moves, so the engine's 1 s fallback retry cannot
//! hide a lost hand-over.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use sundial::{
    ExclusiveMode, ManualClock, Store, StoreError, Sundial, Task, TaskContext, TaskId, TaskSpec,
    TaskState, Timestamp,
};
use sundial_store::{ClaimOutcome, DueClaim, Fence};
use tokio::sync::watch;

/// A due claim that comes back `Busy` is held until the holder has finished and its release has
/// run, then answered.
struct HandOverRace {
    /// Lets the holder's handler return.
    go: watch::Sender<bool>,
    holder: Mutex<Option<TaskId>>,
}

#[async_trait]
impl Intercept for HandOverRace {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let out = inner.claim_due(claims, now, fence).await?;
        let holder = *self.holder.lock().unwrap();
        if let Some(holder) = holder
            && out.iter().any(|o| matches!(o, ClaimOutcome::Busy { .. }))
        {
            self.go.send_replace(true);
            for _ in 0..500 {
                if inner.get(holder).await?.map(|t| t.state) == Some(TaskState::Succeeded) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The engine releases the key right after the holder's completion is stored.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(out)
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
    let (go, go_rx) = watch::channel(false);
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        HandOverRace {
            go,
            holder: Mutex::new(None),
        },
    ));
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let sundial = Sundial::builder()
        .clock(Arc::new(clock))
        .with_store(store.clone())
        .expect("a valid config");
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
    *store.hooks.holder.lock().unwrap() = Some(holder);
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
