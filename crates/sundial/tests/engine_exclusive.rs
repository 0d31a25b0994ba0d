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

/// A group limit (`concurrency: {key, limit}`): at most `limit` tasks of the key run at once,
/// counted by the handler itself; the others wait and start one by one as runs finish, earliest
/// due first. The clock never moves, so only the hand-over on a finish can start a waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_limit_is_never_exceeded_and_waiters_start_in_due_order() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LIMIT: u32 = 3;
    const TASKS: u64 = 8;
    let h = common::harness().await;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<TaskId>();
    {
        let (running, most, finish) = (running.clone(), most.clone(), finish.clone());
        h.sundial.register("g", move |ctx: TaskContext| {
            let (running, most, finish) = (running.clone(), most.clone(), finish.clone());
            let started_tx = started_tx.clone();
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let _ = started_tx.send(ctx.task.id);
                if let Ok(permit) = finish.acquire().await {
                    permit.forget();
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        });
    }
    // Created latest-due first, so creation order (and id order) is the reverse of due order.
    let mut by_due: Vec<(Timestamp, TaskId)> = Vec::new();
    for i in (0..TASKS).rev() {
        let due = Timestamp(common::T0.0 - 60_000 + i as i64 * 1_000);
        let id = h
            .sundial
            .schedule(TaskSpec::new("g").run_at(due).concurrency("acct", LIMIT))
            .await
            .unwrap();
        by_due.push((due, id));
    }
    by_due.sort();
    let due_order: Vec<TaskId> = by_due.iter().map(|(_, id)| *id).collect();
    let engine = h.sundial.start();

    // All are due at once: while the group has room, any of them may take it (shard loops
    // claim side by side).
    let mut begun: Vec<TaskId> = Vec::new();
    for _ in 0..LIMIT {
        begun.push(recv(&mut started).await.expect("a start within 10 s"));
    }
    // Nothing more starts while the group is full.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), started.recv())
            .await
            .is_err(),
        "a fourth task started while {LIMIT} ran"
    );
    // Each finish frees one place, which goes to the earliest due of the waiters.
    for _ in LIMIT as u64..TASKS {
        let next = due_order
            .iter()
            .find(|id| !begun.contains(id))
            .copied()
            .expect("a waiter is left");
        finish.add_permits(1);
        let got = recv(&mut started)
            .await
            .expect("a waiter starts after a finish");
        assert_eq!(got, next, "waiters start in due order");
        begun.push(got);
        assert!(most.load(Ordering::SeqCst) <= LIMIT as usize);
    }
    finish.add_permits(LIMIT as usize);
    for id in &due_order {
        let t = wait_state(&h.sundial, *id, TaskState::Succeeded).await;
        assert!(t.is_some(), "task {id} finished");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT as usize,
        "the group ran {LIMIT} at once, never more"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

async fn recv(rx: &mut tokio::sync::mpsc::UnboundedReceiver<TaskId>) -> Option<TaskId> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .ok()
        .flatten()
}
