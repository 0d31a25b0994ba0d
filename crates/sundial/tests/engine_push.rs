//! Push tasks in the engine, on a manual clock, the engine stepped: claimed up to the claim lead
//! before their due time but run (called) at the due time, never before; a run that releases its
//! slots early lets the next call to the same receiver start while it finishes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sundial::{Config, Target, TaskSpec, TaskState};
use tokio::sync::{Notify, mpsc};

/// Sets a push handler that reports each call (with the clock's time) and then, when
/// `release_then_hold`, releases its slots and waits for `hold` before it returns.
fn push_handler(
    h: &Harness,
    release_then_hold: Option<Arc<Notify>>,
) -> mpsc::UnboundedReceiver<Run> {
    let (tx, rx) = mpsc::unbounded_channel();
    let clock = h.clock.clone();
    h.sundial
        .set_push_handler(Arc::new(move |ctx: sundial::TaskContext| {
            let tx = tx.clone();
            let at = sundial::Clock::now(&clock);
            let hold = release_then_hold.clone();
            async move {
                let _ = tx.send(Run {
                    id: ctx.task.id,
                    attempt: ctx.task.attempt,
                    at,
                    due: ctx.task.due_at,
                });
                if let Some(hold) = hold {
                    ctx.slots.release();
                    assert!(!ctx.slots.held());
                    hold.notified().await;
                }
                Ok::<(), sundial::HandlerError>(())
            }
        }));
    rx
}

fn push_spec(delay: Duration) -> TaskSpec {
    TaskSpec::new("hook")
        .delay(delay)
        .target(Target::new("http://127.0.0.1:9/hook"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_task_is_claimed_within_its_lead_and_called_at_its_due_time() {
    let h = harness_with(Config {
        push_claim_lead: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    let mut calls = push_handler(&h, None);
    let mut plain = record(&h, "plain", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(push_spec(Duration::from_secs(60)))
        .await
        .unwrap();
    let other = h
        .sundial
        .schedule(TaskSpec::new("plain").delay(Duration::from_secs(60)))
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(59_899));
    stepper.settle().await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    // Within the lead: the attempt is recorded as started, the call waits for the due time (its
    // run sleeps on the clock). One turn: settling would wait for that run.
    h.clock.advance(Duration::from_millis(50));
    stepper.turn().await;
    let running = wait_state(&h.sundial, id, TaskState::Running).await;
    assert_eq!(running.attempt, 1);
    assert_eq!(
        running.started_at,
        Some(running.due_at),
        "recorded as starting at its due time"
    );
    let lease = running.lease_expires_at.expect("lease");
    assert!(
        lease.0 >= running.due_at.0 + running.timeout_ms as i64,
        "the lease counts from the due time"
    );
    parked(&h.clock, 1).await;
    no_run(&mut calls).await;
    // A task without a target is not claimed ahead.
    assert_eq!(
        h.sundial.get(other).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    no_run(&mut plain).await;
    h.clock.advance(Duration::from_millis(51));
    stepper.settle().await;
    let r = next_run(&mut calls).await;
    assert_eq!(r.id, id);
    assert!(r.at >= r.due, "called {:?} before due {:?}", r.at, r.due);
    assert_eq!(next_run(&mut plain).await.id, other);
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_lead_a_push_task_is_claimed_at_its_due_time() {
    let h = harness_with(Config {
        push_claim_lead: Duration::ZERO,
        ..Config::default()
    })
    .await;
    let mut calls = push_handler(&h, None);
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(push_spec(Duration::from_secs(60)))
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(59_999));
    stepper.settle().await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    h.clock.advance(Duration::from_millis(1));
    stepper.settle().await;
    assert_eq!(next_run(&mut calls).await.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_slots_let_the_next_call_to_the_receiver_start() {
    // One slot per receiver: the second call can start only once the first released it.
    let h = harness_with(Config {
        push_host_concurrency: 1,
        ..Config::default()
    })
    .await;
    let hold = Arc::new(Notify::new());
    let mut calls = push_handler(&h, Some(hold.clone()));
    let mut stepper = h.sundial.stepper();
    let a = h
        .sundial
        .schedule(push_spec(Duration::from_secs(10)))
        .await
        .unwrap();
    let b = h
        .sundial
        .schedule(push_spec(Duration::from_secs(10)))
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_secs(10));
    // The handlers hang: one turn each (settling would wait for them). The first turn claims
    // one task (one slot); the second claims the other only if the first run released its slot
    // while its handler still runs.
    stepper.turn().await;
    let first = next_run(&mut calls).await.id;
    stepper.turn().await;
    let mut seen = vec![first, next_run(&mut calls).await.id];
    seen.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(seen, want);
    hold.notify_waiters();
}

/// Notes whether the outcome's write (`complete`) was issued while the answer's write
/// (`record_attempt_response`) was still in flight.
#[derive(Default)]
struct Overlap {
    answer_in_flight: Arc<std::sync::atomic::AtomicBool>,
    outcome_during_answer: Arc<std::sync::atomic::AtomicBool>,
}

struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl sundial_store::forwarding::Hooks for Overlap {
    fn enter(&self, call: sundial_store::forwarding::Call) -> Option<Box<dyn Send>> {
        use std::sync::atomic::Ordering::SeqCst;
        match call.method {
            "record_attempt_response" => {
                self.answer_in_flight.store(true, SeqCst);
                Some(Box::new(ClearOnDrop(self.answer_in_flight.clone())))
            }
            "complete" => {
                if self.answer_in_flight.load(SeqCst) {
                    self.outcome_during_answer.store(true, SeqCst);
                }
                None
            }
            _ => None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_answer_is_written_together_with_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = sundial_store_sqlite::SqliteStore::open_dir(
        dir.path(),
        sundial_store_sqlite::SqliteOptions::default(),
    )
    .unwrap();
    let hooks = Overlap::default();
    let overlapped = hooks.outcome_during_answer.clone();
    let store = Arc::new(sundial_store::forwarding::Forwarding::new(
        Arc::new(sqlite),
        hooks,
    ));
    let (sundial, _clock, _runs) = one_shard_recording(store);
    sundial.set_push_handler(Arc::new(|ctx: sundial::TaskContext| async move {
        let kept_here = ctx.answer.hand_over(sundial_store::AttemptResponse {
            status_code: 201,
            content_type: Some("application/json".into()),
        });
        assert!(
            kept_here.is_none(),
            "the engine keeps the answer of its runs"
        );
        Ok::<(), sundial::HandlerError>(())
    }));
    let mut stepper = sundial.stepper();
    let id = sundial.schedule(push_spec(Duration::ZERO)).await.unwrap();
    stepper.settle().await;
    assert_eq!(
        sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Succeeded
    );
    let history = sundial.attempts(id).await.unwrap();
    assert_eq!(history.attempts.len(), 1);
    assert_eq!(
        history.attempts[0].status_code,
        Some(201),
        "the answer is kept"
    );
    assert!(
        overlapped.load(std::sync::atomic::Ordering::SeqCst),
        "the outcome was written only after the answer's write returned"
    );
}

#[test]
fn a_context_without_an_engine_gives_the_answer_back() {
    let answer = sundial::AttemptAnswer::default();
    let back = answer.hand_over(sundial_store::AttemptResponse {
        status_code: 200,
        content_type: None,
    });
    assert_eq!(back.map(|r| r.status_code), Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_receiver_backlog_longer_than_a_walk_does_not_hold_back_other_receivers() {
    // One slot per receiver and a walk of 4 × 4 entries per turn; the slow receiver never
    // answers, and 40 of its calls are due before the fast receiver's one.
    let h = harness_with(Config {
        shard_count: 1,
        push_host_concurrency: 1,
        claim_batch: 4,
        ..Config::default()
    })
    .await;
    let (tx, mut fast_calls) = mpsc::unbounded_channel();
    // Whether the slow receiver answers; a watch, so a call cannot miss the release between
    // reading the flag and starting to wait (a `Notify` it reached late would hang it forever).
    let (answering, answering_rx) = tokio::sync::watch::channel(false);
    h.sundial
        .set_push_handler(Arc::new(move |ctx: sundial::TaskContext| {
            let tx = tx.clone();
            let mut answering = answering_rx.clone();
            async move {
                let url = ctx.task.target.as_ref().map(|t| t.url.clone());
                if url.as_deref() == Some("http://127.0.0.1:9/slow") {
                    let _ = answering.wait_for(|a| *a).await;
                } else {
                    let _ = tx.send(ctx.task.id);
                }
                Ok::<(), sundial::HandlerError>(())
            }
        }));
    let mut stepper = h.sundial.stepper();
    let slow: Vec<TaskSpec> = (0..40)
        .map(|_| {
            TaskSpec::new("hook")
                .delay(Duration::from_secs(10))
                .target(Target::new("http://127.0.0.1:9/slow"))
        })
        .collect();
    let slow: Vec<sundial::TaskId> = h
        .sundial
        .schedule_many(slow)
        .await
        .unwrap()
        .into_iter()
        .map(|s| match s {
            sundial::Scheduled::Created(t) => t.id,
            sundial::Scheduled::Duplicate { existing } => existing,
        })
        .collect();
    let fast = h
        .sundial
        .schedule(
            TaskSpec::new("hook")
                .delay(Duration::from_millis(10_001))
                .target(Target::new("http://127.0.0.1:10/fast")),
        )
        .await
        .unwrap();
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(10_001));
    // The slow receiver's one run hangs, so the loop is stepped turn by turn.
    for _ in 0..4 {
        stepper.turn().await;
    }
    assert_eq!(next_run_id(&mut fast_calls).await, fast);
    wait_state(&h.sundial, fast, TaskState::Succeeded).await;
    // The receiver answers again: every parked call is made, none lost.
    answering.send_replace(true);
    stepper.settle().await;
    for id in slow {
        wait_state(&h.sundial, id, TaskState::Succeeded).await;
    }
}

async fn next_run_id(rx: &mut mpsc::UnboundedReceiver<sundial::TaskId>) -> sundial::TaskId {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the fast receiver was called")
        .expect("channel open")
}

/// A push call whose claim committed but answered an error is made once the store answers
/// again, not when its lease (the task's timeout) ends and the reaper offers it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_start_whose_claim_answer_was_lost_is_called_when_the_store_answers_again() {
    let (h, _store) = intercepted(
        common::intercept::LoseFirstRunAnswer::new(),
        Config::default(),
    );
    let mut calls = push_handler(&h, None);
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(push_spec(Duration::ZERO).timeout(Duration::from_secs(3_600)))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Running,
        "the claim committed"
    );
    no_run(&mut calls).await;
    // The loop tries the store again after its backoff.
    h.clock.advance(Duration::from_millis(200));
    stepper.settle().await;
    let call = next_run(&mut calls).await;
    assert_eq!(call.id, id);
    assert_eq!(call.attempt, 1, "called under the claim's execution");
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
    no_run(&mut calls).await;
}
