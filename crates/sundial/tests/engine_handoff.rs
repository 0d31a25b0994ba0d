//! Hand-off (`engine::handoff`): a due task of a queue whose poll already waits is started by the
//! shard loop for that poll, in one claim, with the poll's worker recorded, and no `claim_ready`;
//! a start the store refuses (an exclusive key held) waits as any refused entry does and is then
//! readied, so the key still decides; a task started for a poll that went away is kept for the
//! next poll, not lost. A poll skips its look in the store while its queue is known to hold no
//! ready task, and looks again after anything could have readied one (`engine::looked`).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use common::*;
use sundial::{ExclusiveMode, ManualClock, Sundial, TaskSpec, TaskState};
use sundial_core::{ExecutionId, Task, TaskId, Timestamp};
use sundial_store::forwarding::Call;
use sundial_store::{
    ClaimOutcome, ClaimTarget, DueClaim, Fence, ReadyClaim, ReadyTaken, Store, StoreError,
    TransitionError,
};
use tokio::sync::Semaphore;

/// Counts `claim_ready` calls and the `Run` claims made for polls; while `hold` has no permit, a
/// claim for a poll waits for one (so a test can end the poll in between).
struct Watch {
    ready_claims: AtomicUsize,
    poll_starts: AtomicUsize,
    hold: Arc<Semaphore>,
    /// Plain `complete` calls and `complete_then_claim_ready` calls.
    completes: AtomicUsize,
    fused: AtomicUsize,
    /// While this has no permit, a plain `complete` waits for one.
    complete_hold: Arc<Semaphore>,
    /// `get` calls (the engine's reads of a task, and the test's own).
    gets: AtomicUsize,
    /// Claims for polls, to come, that commit and then answer an error (a connection that went
    /// down around the commit).
    lose_answers: AtomicUsize,
}

struct Hooks(Arc<Watch>);

#[async_trait]
impl Intercept for Hooks {
    fn enter(&self, call: Call) -> Option<Box<dyn Send>> {
        if call.method == "get" {
            self.0.gets.fetch_add(1, Ordering::SeqCst);
        }
        None
    }
    async fn claim_ready(
        &self,
        inner: &dyn Store,
        claim: ReadyClaim,
    ) -> Result<ReadyTaken, StoreError> {
        self.0.ready_claims.fetch_add(1, Ordering::SeqCst);
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
        self.0.completes.fetch_add(1, Ordering::SeqCst);
        drop(self.0.complete_hold.acquire().await);
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
        self.0.fused.fetch_add(1, Ordering::SeqCst);
        inner
            .complete_then_claim_ready(id, execution, now, result, claim)
            .await
    }

    async fn claim_due(
        &self,
        inner: &dyn Store,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let for_poll = claims.iter().any(|c| {
            matches!(
                c.target,
                ClaimTarget::Run {
                    worker: Some(_),
                    ..
                }
            )
        });
        if for_poll {
            self.0.poll_starts.fetch_add(1, Ordering::SeqCst);
            drop(self.0.hold.acquire().await);
            let lose = self
                .0
                .lose_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if lose {
                inner.claim_due(claims, now, fence).await?;
                return Err(StoreError::unavailable(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "the connection went down around the commit",
                )));
            }
        }
        inner.claim_due(claims, now, fence).await
    }
}

struct Setup {
    sundial: Sundial,
    clock: ManualClock,
    watch: Arc<Watch>,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let watch = Arc::new(Watch {
        ready_claims: AtomicUsize::new(0),
        poll_starts: AtomicUsize::new(0),
        hold: Arc::new(Semaphore::new(1)),
        completes: AtomicUsize::new(0),
        fused: AtomicUsize::new(0),
        complete_hold: Arc::new(Semaphore::new(1)),
        gets: AtomicUsize::new(0),
        lose_answers: AtomicUsize::new(0),
    });
    let store = Arc::new(common::intercept::sqlite(dir.path(), Hooks(watch.clone())));
    let (sundial, clock) = one_shard(store);
    Setup {
        sundial,
        clock,
        watch,
        _dir: dir,
    }
}

/// A poll of queue `q` as worker `name`, waiting up to 30 s; returns once it looked once and is
/// waiting (parked on the clock, `parked_before + 1` sleepers then).
async fn poll(s: &Setup, name: &str, parked_before: usize) -> tokio::task::JoinHandle<Vec<Task>> {
    let sundial = s.sundial.clone();
    let worker = Some(name.to_string());
    let h = tokio::spawn(async move {
        sundial
            .poll("q", worker, None, 1, Duration::from_secs(30))
            .await
            .unwrap()
    });
    parked(&s.clock, parked_before + 1).await;
    h
}

/// A poll of queue `q` as worker `name` that does not wait: what it took.
async fn poll_now(s: &Setup, name: &str) -> Vec<Task> {
    s.sundial
        .poll("q", Some(name.to_string()), None, 1, Duration::ZERO)
        .await
        .unwrap()
}

async fn answer(h: tokio::task::JoinHandle<Vec<Task>>) -> Vec<Task> {
    tokio::time::timeout(Duration::from_secs(10), h)
        .await
        .expect("the poll answered")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_task_is_started_for_the_waiting_poll_in_one_claim() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let first = poll(&s, "w1", 0).await;
    let second = poll(&s, "w2", 1).await;
    let looked = s.watch.ready_claims.load(Ordering::SeqCst);
    assert_eq!(
        looked, 1,
        "the first poll looked; the second knew the queue empty (see `poll_looks_*`)"
    );
    let id = s
        .sundial
        .schedule(
            TaskSpec::new("k")
                .queue("q")
                .delay(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    stepper.settle().await;
    // Due before the second poll's own look (it skipped its first, see `poll_looks_*`).
    s.clock.advance(Duration::from_millis(500));
    stepper.settle().await;
    let got = answer(first).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(got[0].state, TaskState::Running);
    assert_eq!(
        got[0].worker.as_deref(),
        Some("w1"),
        "the first poll waiting"
    );
    let stored = s.sundial.get(id).await.unwrap().unwrap();
    assert_eq!(stored.worker.as_deref(), Some("w1"));
    assert_eq!(stored.execution_id, got[0].execution_id);
    // A poll's lease is the task's timeout from its start.
    assert_eq!(
        stored.lease_expires_at,
        Some(Timestamp(
            s.sundial.clock().now().0 + stored.timeout_ms as i64
        ))
    );
    assert_eq!(s.watch.poll_starts.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.watch.ready_claims.load(Ordering::SeqCst),
        looked,
        "no claim of a ready task: the start was the delivery"
    );
    assert!(!second.is_finished(), "the other poll still waits");
    second.abort();
    s.sundial
        .complete(id, got[0].execution_id.unwrap(), None)
        .await
        .unwrap();
}

/// A start for a waiting poll whose claim committed but answered an error (the connection went
/// down around the commit) reaches a poll once the store answers again, not when its lease (the
/// task's timeout) ends and the reaper offers it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_claim_answer_was_lost_reaches_a_poll_when_the_store_answers_again() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let waiting = poll(&s, "w1", 0).await;
    s.watch.lose_answers.store(1, Ordering::SeqCst);
    let id = s
        .sundial
        .schedule(
            TaskSpec::new("k")
                .queue("q")
                .timeout(Duration::from_secs(3_600)),
        )
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(s.watch.lose_answers.load(Ordering::SeqCst), 0, "claimed");
    let stored = s.sundial.get(id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Running, "the claim committed");
    // The loop tries the store again after its backoff.
    s.clock.advance(Duration::from_millis(200));
    stepper.settle().await;
    let got = answer(waiting).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(
        got[0].execution_id, stored.execution_id,
        "the start that committed"
    );
    s.sundial
        .complete(id, got[0].execution_id.unwrap(), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_a_held_key_is_readied_and_waits_for_the_key() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let keyed = || {
        TaskSpec::new("k")
            .queue("q")
            .exclusive("account-7", ExclusiveMode::Wait)
    };
    let holder_poll = poll(&s, "w1", 0).await;
    let holder = s.sundial.schedule(keyed()).await.unwrap();
    stepper.settle().await;
    let held = answer(holder_poll).await;
    assert_eq!(held[0].id, holder);
    // The key is held: the next keyed task is not started for the waiting poll.
    let waiting = poll(&s, "w2", 0).await;
    let next = s.sundial.schedule(keyed()).await.unwrap();
    stepper.settle().await;
    for _ in 0..30 {
        assert!(!waiting.is_finished(), "started while its key was held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_ne!(
        s.sundial.get(next).await.unwrap().unwrap().state,
        TaskState::Running
    );
    // The holder finishes: the waiting poll gets the next one.
    s.sundial
        .complete(holder, held[0].execution_id.unwrap(), None)
        .await
        .unwrap();
    stepper.settle().await;
    let got = answer(waiting).await;
    assert_eq!(got[0].id, next);
    assert_eq!(got[0].state, TaskState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_for_a_poll_that_left_goes_to_the_next_poll() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let gone = poll(&s, "w1", 0).await;
    // The start for the poll waits until the poll has gone.
    let held = s.watch.hold.acquire().await.unwrap();
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q"))
        .await
        .unwrap();
    let end_the_poll = async {
        for _ in 0..1_000 {
            if s.watch.poll_starts.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(s.watch.poll_starts.load(Ordering::SeqCst), 1);
        gone.abort();
        assert!(gone.await.is_err(), "the poll was ended");
        drop(held);
    };
    tokio::join!(stepper.settle(), end_the_poll);
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Running
    );
    // The next poll gets it at once, without a claim.
    let before = s.watch.ready_claims.load(Ordering::SeqCst);
    let got = poll_now(&s, "w2").await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(s.watch.ready_claims.load(Ordering::SeqCst), before);
    s.sundial
        .complete(id, got[0].execution_id.unwrap(), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_looks_are_skipped_while_the_queue_is_known_empty_and_resume_after_a_change() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let claims = || s.watch.ready_claims.load(Ordering::SeqCst);
    let first = poll(&s, "w1", 0).await;
    assert_eq!(claims(), 1, "the first poll looked and found nothing");
    let second = poll(&s, "w2", 1).await;
    assert_eq!(
        claims(),
        1,
        "nothing changed since: the second poll waits at once"
    );
    // Unwoken, the poll that skipped looks within a second (a wake-up lost between nodes costs
    // no more), then waits again.
    s.clock.advance(Duration::from_millis(999));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(claims(), 1);
    s.clock.advance(Duration::from_millis(1));
    for _ in 0..1_000 {
        if claims() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(claims(), 2, "the skipped poll looked after a second");
    parked(&s.clock, 2).await;
    // Their waits end: each looks once more before it answers empty.
    s.clock.advance(Duration::from_secs(29));
    assert!(answer(first).await.is_empty());
    assert!(answer(second).await.is_empty());
    assert_eq!(claims(), 4);
    // A task readied with no poll waiting: the next poll looks at once and takes it, without
    // waiting on the clock.
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q"))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Ready
    );
    let sundial = s.sundial.clone();
    let got = answer(tokio::spawn(async move {
        sundial
            .poll("q", Some("w3".into()), None, 1, Duration::from_secs(30))
            .await
            .unwrap()
    }))
    .await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(claims(), 5);
    // It took what was there without finding the queue empty: the next poll looks too.
    let sundial = s.sundial.clone();
    let next = tokio::spawn(async move {
        sundial
            .poll("q", Some("w4".into()), None, 1, Duration::from_secs(30))
            .await
            .unwrap()
    });
    parked(&s.clock, 1).await;
    assert!(claims() >= 6, "the poll after a full batch looked");
    next.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_looks_resume_when_a_held_key_is_released() {
    // A ready task whose key a running task holds is not claimable; when the holder finishes,
    // a poll must look again even though no task was readied.
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let keyed = || {
        TaskSpec::new("k")
            .queue("q")
            .exclusive("account-9", ExclusiveMode::Wait)
    };
    let holder = s.sundial.schedule(keyed()).await.unwrap();
    stepper.settle().await;
    let held = poll_now(&s, "w1").await;
    assert_eq!(held[0].id, holder);
    // Found empty by a poll; no poll waits, so nothing is started for one.
    assert!(poll_now(&s, "w2").await.is_empty());
    s.sundial
        .complete(holder, held[0].execution_id.unwrap(), None)
        .await
        .unwrap();
    let before = s.watch.ready_claims.load(Ordering::SeqCst);
    let waiting = poll(&s, "w3", 0).await;
    assert_eq!(
        s.watch.ready_claims.load(Ordering::SeqCst),
        before + 1,
        "the release counts as a change: the poll looked"
    );
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_wake_up_that_reaches_a_handed_poll_is_passed_on() {
    // One turn meets two due tasks and one waiting poll: the first is started for that poll,
    // the second readied, and the readying's wake-up goes to the oldest waiter on the queue's
    // `Notify`, the very poll being handed its task. A second poll that began waiting while the
    // turn's claim ran must still be woken to claim the ready task. Whether the handed poll
    // sees its wake-up or its hand first is up to `select!`, so the case runs several times.
    let s = setup();
    let mut stepper = s.sundial.stepper();
    for round in 0..8 {
        let first = poll(&s, &format!("a{round}"), 0).await;
        let held = s.watch.hold.acquire().await.unwrap();
        let starts = s.watch.poll_starts.load(Ordering::SeqCst);
        let mut ids = Vec::new();
        for _ in 0..2 {
            ids.push(
                s.sundial
                    .schedule(TaskSpec::new("k").queue("q"))
                    .await
                    .unwrap(),
            );
        }
        let mut second = None;
        let start_second = async {
            for _ in 0..1_000 {
                if s.watch.poll_starts.load(Ordering::SeqCst) > starts {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert!(s.watch.poll_starts.load(Ordering::SeqCst) > starts);
            second = Some(poll(&s, &format!("b{round}"), 1).await);
            drop(held);
        };
        tokio::join!(stepper.settle(), start_second);
        let mut got: Vec<Task> = answer(first).await;
        assert_eq!(got.len(), 1, "round {round}");
        let second = second.unwrap();
        let late = tokio::time::timeout(Duration::from_secs(5), second).await;
        let Ok(late) = late else {
            panic!("round {round}: the second poll was not woken for the ready task");
        };
        got.extend(late.unwrap());
        let mut taken: Vec<_> = got.iter().map(|t| t.id).collect();
        taken.sort();
        ids.sort();
        assert_eq!(taken, ids, "round {round}");
        for t in got {
            s.sundial
                .complete(t.id, t.execution_id.unwrap(), None)
                .await
                .unwrap();
        }
    }
}

/// `done` carried by a poll of `q` as worker `w` for one task, waiting up to `wait`.
async fn carry(
    s: &Setup,
    done: sundial::Completion,
    wait: Duration,
) -> Result<(Task, Vec<Task>), sundial::Error> {
    s.sundial
        .complete_and_poll(done, "q", Some("w".into()), None, 1, wait)
        .await
}

/// A poll that carries its worker's completion (`Sundial::complete_and_poll`) records it with
/// its first claim, in one store call; where the poll does not claim at once (its queue known
/// empty, or paused), the completion is recorded on its own before the poll waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_carried_by_a_poll_is_recorded_with_its_first_claim() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            s.sundial
                .schedule(TaskSpec::new("k").queue("q"))
                .await
                .unwrap(),
        );
    }
    stepper.settle().await;
    let took = poll_now(&s, "w").await;
    assert_eq!(took[0].id, ids[0]);
    let done = |t: &Task, result| sundial::Completion {
        id: t.id,
        execution: t.execution_id.unwrap(),
        result,
    };
    // Recorded and the next task taken, in one call.
    let (completed, next) = carry(
        &s,
        done(&took[0], Some(serde_json::json!(1))),
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(completed.state, TaskState::Succeeded);
    assert_eq!(completed.result, Some(serde_json::json!(1)));
    assert_eq!(next[0].id, ids[1]);
    assert_eq!(s.watch.fused.load(Ordering::SeqCst), 1);
    assert_eq!(s.watch.completes.load(Ordering::SeqCst), 0);
    // A poll finds the queue empty; the next poll skips its look, so the completion it carries
    // is recorded on its own, before it waits.
    assert!(poll_now(&s, "w").await.is_empty());
    let waiting = {
        let sundial = s.sundial.clone();
        let d = done(&next[0], None);
        tokio::spawn(async move {
            sundial
                .complete_and_poll(d, "q", Some("w".into()), None, 1, Duration::from_secs(30))
                .await
                .unwrap()
        })
    };
    parked(&s.clock, 1).await;
    assert_eq!(s.watch.completes.load(Ordering::SeqCst), 1);
    assert_eq!(s.watch.fused.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.sundial.get(ids[1]).await.unwrap().unwrap().state,
        TaskState::Succeeded,
        "recorded while the poll still waits"
    );
    s.clock.advance(Duration::from_secs(30));
    let (completed, next) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the poll answered")
        .unwrap();
    assert_eq!(completed.id, ids[1]);
    assert!(next.is_empty());
    // A paused queue: recorded, nothing started.
    let third = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q"))
        .await
        .unwrap();
    stepper.settle().await;
    let took = poll_now(&s, "w").await;
    assert_eq!(took[0].id, third);
    let fourth = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q"))
        .await
        .unwrap();
    stepper.settle().await;
    s.sundial.pause_queue("q").await.unwrap();
    let (completed, next) = carry(&s, done(&took[0], None), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(completed.state, TaskState::Succeeded);
    assert!(next.is_empty(), "nothing of a paused queue starts");
    assert_eq!(
        s.sundial.get(fourth).await.unwrap().unwrap().state,
        TaskState::Ready
    );
    // A refused completion polls nothing.
    s.sundial.resume_queue("q").await.unwrap();
    let stale = sundial::Completion {
        id: fourth,
        execution: ExecutionId(uuid::Uuid::now_v7()),
        result: None,
    };
    let refused = carry(&s, stale, Duration::ZERO).await;
    assert!(
        matches!(
            refused,
            Err(sundial::Error::WrongState { .. } | sundial::Error::StaleExecution { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        s.sundial.get(fourth).await.unwrap().unwrap().state,
        TaskState::Ready
    );
}

/// A poll that skips its look and carries a completion waits among the hand-off waiters while
/// that completion commits: a task that comes due meanwhile is started for it, not readied for
/// lack of a waiting poll (which would cost a second commit and a later claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_is_handed_a_task_due_while_the_completion_it_carries_commits() {
    let s = setup();
    let (waiting, later, ready_claims) = handed_while_completing(&s, true).await;
    let (completed, next) = answer_carried(waiting).await.unwrap();
    assert_eq!(completed.state, TaskState::Succeeded);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].id, later);
    assert_eq!(
        s.watch.ready_claims.load(Ordering::SeqCst),
        ready_claims,
        "no claim of a ready task"
    );
}

/// The same with a completion the store refuses: the poll answers the refusal, and the task
/// started for it meanwhile goes to the queue's next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_handed_to_a_poll_whose_completion_is_refused_goes_to_the_next_poll() {
    let s = setup();
    let (waiting, later, _) = handed_while_completing(&s, false).await;
    let refused = answer_carried(waiting).await;
    assert!(
        matches!(
            refused,
            Err(sundial::Error::WrongState { .. } | sundial::Error::StaleExecution { .. })
        ),
        "{refused:?}"
    );
    let next = poll_now(&s, "w2").await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].id, later);
}

/// Takes a first task, finds the queue empty, then starts a poll that carries the first task's
/// completion (its own execution when `valid`, else a stale one) and holds that completion in the
/// store while a second task comes due. Checks the second task was started for the poll; returns
/// the poll, the second task and the count of ready claims before the poll.
async fn handed_while_completing(
    s: &Setup,
    valid: bool,
) -> (
    tokio::task::JoinHandle<Result<(Task, Vec<Task>), sundial::Error>>,
    TaskId,
    usize,
) {
    let mut stepper = s.sundial.stepper();
    let first = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q"))
        .await
        .unwrap();
    let later = s
        .sundial
        .schedule(
            TaskSpec::new("k")
                .queue("q")
                .run_at(T0.saturating_add(Duration::from_secs(1))),
        )
        .await
        .unwrap();
    stepper.settle().await;
    let took = poll_now(s, "w").await;
    assert_eq!(took[0].id, first);
    // The queue is known empty: the next poll skips its look.
    assert!(poll_now(s, "w").await.is_empty());
    let ready_claims = s.watch.ready_claims.load(Ordering::SeqCst);
    let held = s.watch.complete_hold.clone().acquire_owned().await.unwrap();
    let done = sundial::Completion {
        id: first,
        execution: if valid {
            took[0].execution_id.unwrap()
        } else {
            ExecutionId(uuid::Uuid::now_v7())
        },
        result: None,
    };
    let waiting = {
        let sundial = s.sundial.clone();
        tokio::spawn(async move {
            sundial
                .complete_and_poll(
                    done,
                    "q",
                    Some("w".into()),
                    None,
                    1,
                    Duration::from_secs(30),
                )
                .await
        })
    };
    for _ in 0..10_000 {
        if s.watch.completes.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        s.watch.completes.load(Ordering::SeqCst),
        1,
        "the completion is being recorded"
    );
    s.clock.advance(Duration::from_secs(1));
    stepper.settle().await;
    let stored = s.sundial.get(later).await.unwrap().unwrap();
    assert_eq!(
        stored.state,
        TaskState::Running,
        "started for the poll, not readied"
    );
    assert_eq!(stored.worker.as_deref(), Some("w"));
    assert_eq!(s.watch.poll_starts.load(Ordering::SeqCst), 1);
    drop(held);
    (waiting, later, ready_claims)
}

async fn answer_carried(
    h: tokio::task::JoinHandle<Result<(Task, Vec<Task>), sundial::Error>>,
) -> Result<(Task, Vec<Task>), sundial::Error> {
    tokio::time::timeout(Duration::from_secs(10), h)
        .await
        .expect("the poll answered")
        .unwrap()
}

/// Inside the hand-off lead: a task due this far ahead is started for a waiting poll at once.
fn within_the_lead() -> Duration {
    let lead = sundial::Config::default().hand_off_lead;
    assert!(
        lead >= Duration::from_millis(2),
        "the tests step the clock by 1 ms"
    );
    lead - Duration::from_millis(1)
}

/// A poll as worker `name` that waits, and a task due within the lead started ahead for it.
async fn started_ahead_for_a_poll(
    s: &Setup,
    stepper: &mut sundial::Stepper,
    name: &str,
) -> (tokio::task::JoinHandle<Vec<Task>>, sundial::TaskId) {
    let waiting = poll(s, name, 0).await;
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q").delay(within_the_lead()))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(s.watch.poll_starts.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Running,
        "started ahead for the poll"
    );
    (waiting, id)
}

/// Steps the clock past the poll's 30 s wait: it answers empty, and task `id` stays cancelled.
async fn ends_empty_and_cancelled(
    s: &Setup,
    poll: tokio::task::JoinHandle<Vec<Task>>,
    id: sundial::TaskId,
) {
    s.clock.advance(Duration::from_secs(30));
    assert!(answer(poll).await.is_empty());
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
}

/// Polls `q` for a while in real time, asserting that `h` has not answered.
async fn still_waiting(h: &tokio::task::JoinHandle<Vec<Task>>, why: &str) {
    for _ in 0..25 {
        assert!(!h.is_finished(), "{why}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_due_within_the_lead_is_started_ahead_and_answered_at_its_due_time() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let waiting = poll(&s, "w1", 0).await;
    let looked = s.watch.ready_claims.load(Ordering::SeqCst);
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q").delay(within_the_lead()))
        .await
        .unwrap();
    stepper.settle().await;
    // Started ahead, in one claim: recorded as started at its due time, not at the claim's.
    assert_eq!(s.watch.poll_starts.load(Ordering::SeqCst), 1);
    let stored = s.sundial.get(id).await.unwrap().unwrap();
    assert_eq!(stored.state, TaskState::Running);
    assert_eq!(stored.started_at, Some(stored.due_at));
    assert!(stored.due_at > s.sundial.clock().now());
    assert_eq!(
        stored.lease_expires_at,
        Some(Timestamp(stored.due_at.0 + stored.timeout_ms as i64)),
        "the lease counts from the start"
    );
    // The poll answers at the due time, never before.
    parked(&s.clock, 1).await;
    still_waiting(&waiting, "answered before the due time").await;
    s.clock
        .advance(within_the_lead() - Duration::from_millis(1));
    parked(&s.clock, 1).await;
    still_waiting(&waiting, "answered a millisecond before the due time").await;
    s.clock.advance(Duration::from_millis(1));
    let got = answer(waiting).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(got[0].execution_id, stored.execution_id);
    assert!(s.sundial.clock().now() >= stored.due_at);
    assert_eq!(
        s.watch.ready_claims.load(Ordering::SeqCst),
        looked,
        "no claim of a ready task: the start was the delivery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_while_it_waits_for_its_due_time_is_not_delivered() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let (waiting, id) = started_ahead_for_a_poll(&s, &mut stepper, "w1").await;
    parked(&s.clock, 1).await;
    // Cancelled before its due time: once the cancel returned, the task must not start.
    s.sundial.cancel(id).await.unwrap();
    s.clock.advance(within_the_lead());
    stepper.settle().await;
    still_waiting(&waiting, "the poll answered with a cancelled task").await;
    // The poll went on waiting and ends empty at its deadline.
    ends_empty_and_cancelled(&s, waiting, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_ahead_is_answered_unread_when_nothing_could_have_ended_it() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let (waiting, id) = started_ahead_for_a_poll(&s, &mut stepper, "w1").await;
    parked(&s.clock, 1).await;
    assert_eq!(
        reads_to_answer(&s, waiting, id).await,
        0,
        "no write but inserts, claims and attempts' own since the claim: nothing to read again"
    );
}

/// Steps the clock to the due time of task `id`, started ahead for `waiting`: the poll answers
/// with it. Returns how many reads of a task that took.
async fn reads_to_answer(
    s: &Setup,
    waiting: tokio::task::JoinHandle<Vec<Task>>,
    id: TaskId,
) -> usize {
    let gets = s.watch.gets.load(Ordering::SeqCst);
    s.clock.advance(within_the_lead());
    let got = answer(waiting).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    s.watch.gets.load(Ordering::SeqCst) - gets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_out_of_band_write_a_task_started_ahead_is_read_again_and_answered() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let (waiting, id) = started_ahead_for_a_poll(&s, &mut stepper, "w1").await;
    parked(&s.clock, 1).await;
    // A cancel of another task: it cannot end this one, but the engine cannot tell which.
    let other = s
        .sundial
        .schedule(
            TaskSpec::new("k")
                .queue("other")
                .delay(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    s.sundial.cancel(other).await.unwrap();
    assert_eq!(
        reads_to_answer(&s, waiting, id).await,
        1,
        "read again once before the answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_ahead_for_a_poll_that_left_goes_to_the_next_poll_at_its_due_time() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let (gone, id) = started_ahead_for_a_poll(&s, &mut stepper, "w1").await;
    // The poll waits for the due time with the task, and goes away.
    parked(&s.clock, 1).await;
    gone.abort();
    assert!(gone.await.is_err(), "the poll was ended");
    // The next poll takes the task kept for it, and answers at its due time, not before.
    let next = poll(&s, "w2", 0).await;
    still_waiting(&next, "the kept task was delivered before its due time").await;
    s.clock.advance(within_the_lead());
    let got = answer(next).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert!(s.sundial.clock().now() >= got[0].due_at);
    s.sundial
        .complete(id, got[0].execution_id.unwrap(), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_waiting_poll_nothing_is_started_or_readied_ahead() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q").delay(within_the_lead()))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    s.clock.advance(within_the_lead());
    stepper.settle().await;
    assert_eq!(
        s.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Ready
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_before_its_start_is_not_delivered_by_a_poll_that_takes_it_later() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let (gone, id) = started_ahead_for_a_poll(&s, &mut stepper, "w1").await;
    // The poll it was started for goes away (with the task handed or still on its way), the
    // task is cancelled before its due time, and the next poll comes after it.
    gone.abort();
    assert!(gone.await.is_err(), "the poll was ended");
    s.sundial.cancel(id).await.unwrap();
    s.clock
        .advance(within_the_lead() + Duration::from_millis(1));
    stepper.settle().await;
    let next = poll(&s, "w2", 0).await;
    still_waiting(
        &next,
        "a later poll answered with a task cancelled before its start",
    )
    .await;
    ends_empty_and_cancelled(&s, next, id).await;
}
