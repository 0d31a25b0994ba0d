//! A queue's concurrency limit (`QueueConfig::concurrency`): at most that many of the queue's
//! tasks run at once, counted by the handler itself; the others wait and start one by one as
//! runs finish, earliest due first; a worker's poll takes no more than the free places and is
//! answered when one frees. The clock never moves, so only the hand-over on a finish can start
//! a waiter (the 1 s backstop retry never comes).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use sundial::{
    ManualClock, QueueConfig, Store, StoreError, Sundial, TaskContext, TaskId, TaskSpec, TaskState,
    Timestamp,
};
use sundial_store::{ClaimOutcome, DueClaim, Fence};

fn limited(n: u32) -> QueueConfig {
    QueueConfig {
        concurrency: Some(n),
        ..QueueConfig::default()
    }
}

async fn recv(rx: &mut tokio::sync::mpsc::UnboundedReceiver<TaskId>) -> Option<TaskId> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_limit_is_never_exceeded_and_waiters_start_in_due_order() {
    const LIMIT: u32 = 3;
    const TASKS: u64 = 8;
    let h = common::harness().await;
    h.sundial
        .configure_queue("limited", limited(LIMIT))
        .await
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<TaskId>();
    {
        let (running, most, finish) = (running.clone(), most.clone(), finish.clone());
        h.sundial.register("q", move |ctx: TaskContext| {
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
            .schedule(TaskSpec::new("q").queue("limited").run_at(due))
            .await
            .unwrap();
        by_due.push((due, id));
    }
    by_due.sort();
    let due_order: Vec<TaskId> = by_due.iter().map(|(_, id)| *id).collect();
    // Another queue's task runs beside the full one.
    h.sundial
        .register("f", |_ctx: TaskContext| async { Ok::<(), String>(()) });
    let free = h
        .sundial
        .schedule(TaskSpec::new("f").queue("free"))
        .await
        .unwrap();
    let engine = h.sundial.start();

    let mut begun: Vec<TaskId> = Vec::new();
    for _ in 0..LIMIT {
        begun.push(recv(&mut started).await.expect("a start within 10 s"));
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), started.recv())
            .await
            .is_err(),
        "a fourth task of the queue started while {LIMIT} ran"
    );
    // The other queue's task runs while the limited queue is full.
    common::wait_state(&h.sundial, free, TaskState::Succeeded).await;
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
        common::wait_state(&h.sundial, *id, TaskState::Succeeded).await;
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT as usize,
        "the queue ran {LIMIT} at once, never more"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_takes_no_more_than_the_free_places_and_is_answered_when_one_frees() {
    let h = common::harness().await;
    h.sundial
        .configure_queue("workers", limited(2))
        .await
        .unwrap();
    for _ in 0..5 {
        h.sundial
            .schedule(TaskSpec::new("remote").queue("workers"))
            .await
            .unwrap();
    }
    let engine = h.sundial.start();
    let mut first = Vec::new();
    for _ in 0..500 {
        first.extend(
            h.sundial
                .poll("workers", Some("w".into()), None, 5, Duration::ZERO)
                .await
                .unwrap(),
        );
        if !first.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Readied in whatever order the shard loops reach them; a poll takes what is ready and
    // fits. Top up to the limit.
    for _ in 0..500 {
        if first.len() >= 2 {
            break;
        }
        first.extend(
            h.sundial
                .poll("workers", Some("w".into()), None, 5, Duration::ZERO)
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(first.len(), 2, "a poll for 5 takes the 2 free places");

    // A poll now waits (the clock does not move, so its deadline never comes) until a finish
    // frees a place.
    let s = h.sundial.clone();
    let waiting = tokio::spawn(async move {
        s.poll(
            "workers",
            Some("w2".into()),
            None,
            5,
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a full queue answers no poll");
    let t = &first[0];
    h.sundial
        .complete(t.id, t.execution_id.unwrap(), None)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting poll is answered after the finish")
        .unwrap();
    assert_eq!(got.len(), 1, "one place was freed");

    // Removing the limit frees the rest for the next poll.
    h.sundial
        .configure_queue("workers", QueueConfig::default())
        .await
        .unwrap();
    let rest = h
        .sundial
        .poll("workers", Some("w".into()), None, 5, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(rest.len(), 2);
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_limit_out_of_range_or_on_an_own_queue_is_refused_and_nothing_is_stored() {
    let h = common::harness().await;
    for n in [0, QueueConfig::MAX_CONCURRENCY + 1] {
        let e = h
            .sundial
            .configure_queue("q", limited(n))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("concurrency"), "{e}");
    }
    let e = h
        .sundial
        .configure_queue("sundial.schedules", limited(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("own queues"), "{e}");
    assert!(h.sundial.queue("q").await.unwrap().is_none());
}

/// Counts the starts the store refused for the queue's limit.
#[derive(Default)]
struct CountRefusals {
    refused: AtomicUsize,
}

#[async_trait]
impl Intercept for CountRefusals {
    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let out = inner.claim_due(claims, now, fence).await?;
        let refused = out
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::QueueFull { .. }))
            .count();
        self.refused.fetch_add(refused, Ordering::SeqCst);
        Ok(out)
    }
}

/// An engine on a fresh embedded store that counts refused starts, on a manual clock at
/// [`common::T0`], with `queue` limited to `limit` running at once.
struct Counted {
    sundial: Sundial,
    clock: ManualClock,
    store: Arc<common::intercept::Intercepted<CountRefusals>>,
    _dir: tempfile::TempDir,
}

async fn counted(queue: &str, limit: u32) -> Counted {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        CountRefusals::default(),
    ));
    let clock = ManualClock::new(common::T0);
    let sundial = Sundial::builder()
        .clock(Arc::new(clock.clone()))
        .with_store(store.clone())
        .expect("a valid config");
    sundial
        .configure_queue(queue, limited(limit))
        .await
        .unwrap();
    Counted {
        sundial,
        clock,
        store,
        _dir: dir,
    }
}

/// A backlog behind a small limit is handed over place by place: a start refused for the limit
/// waits for a finish to hand it the place (or for the backstop), and is not claimed again at
/// every finish of another task. With 200 tasks behind a limit of 2, each refused about once,
/// not once per finish (which would be thousands of refused claims). The clock never moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_behind_a_limit_is_not_claimed_again_at_every_finish() {
    const TASKS: usize = 200;
    // The data directory (`_dir`) lives as long as the test.
    let Counted {
        sundial,
        store,
        _dir,
        ..
    } = counted("small", 2).await;
    let done = Arc::new(AtomicUsize::new(0));
    {
        let done = done.clone();
        sundial.register("s", move |_ctx: TaskContext| {
            let done = done.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        });
    }
    let specs = (0..TASKS)
        .map(|_| TaskSpec::new("s").queue("small"))
        .collect::<Vec<_>>();
    sundial.schedule_many(specs).await.unwrap();
    let engine = sundial.start();
    for _ in 0..3_000 {
        if done.load(Ordering::SeqCst) >= TASKS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(done.load(Ordering::SeqCst), TASKS, "every task ran");
    let refused = store.hooks.refused.load(Ordering::SeqCst);
    assert!(
        refused <= 3 * TASKS,
        "{refused} starts refused for {TASKS} tasks behind the limit"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Waiting starts are handed the place by finishes; the 1 s retry (for a place freed on
/// another node, or a hand-over whose task is gone) is kept for the front of the line only.
/// With 100 tasks behind one running task, each second of the clock retries a few, not all 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_front_of_a_long_line_retries_every_second() {
    const TASKS: usize = 100;
    let Counted {
        sundial,
        clock,
        store,
        _dir,
    } = counted("line", 1).await;
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    {
        let finish = finish.clone();
        sundial.register("l", move |_ctx: TaskContext| {
            let finish = finish.clone();
            async move {
                if let Ok(permit) = finish.acquire().await {
                    permit.forget();
                }
                Ok::<(), String>(())
            }
        });
    }
    let specs = (0..TASKS)
        .map(|_| TaskSpec::new("l").queue("line"))
        .collect::<Vec<_>>();
    sundial.schedule_many(specs).await.unwrap();
    let engine = sundial.start();
    let refused = || store.hooks.refused.load(Ordering::SeqCst);
    for _ in 0..1_000 {
        if refused() >= TASKS - 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(refused(), TASKS - 1, "each waiting task was refused once");
    for _ in 0..3 {
        clock.advance(Duration::from_millis(1_100));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let retried = refused() - (TASKS - 1);
    assert!(
        retried <= 3 * 16,
        "{retried} retries in 3 s of 99 waiting tasks"
    );
    assert!(retried >= 1, "the front of the line still retries");
    finish.add_permits(TASKS);
    engine.shutdown(Duration::from_secs(5)).await;
}
