//! In-process runs claimed ahead (`Config::run_claim_lead`): a task due within the lead is
//! claimed at once, recorded as started at its due time, and its handler is called at that time,
//! never before; a task cancelled while it waits is never called. With a zero lead nothing is
//! claimed before it is due.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::intercept::Intercept;
use common::*;
use sundial::{Clock, Config, TaskSpec, TaskState, Timestamp};
use sundial_store::forwarding::Call;

/// Inside the default run lead.
fn within_the_lead() -> Duration {
    let lead = Config::default().run_claim_lead;
    assert!(
        lead >= Duration::from_millis(2),
        "the tests step the clock by 1 ms"
    );
    lead - Duration::from_millis(1)
}

/// A task of kind `k` due within the lead, scheduled and the loops settled before its due time:
/// the stored task.
async fn scheduled_within_the_lead(h: &Harness, stepper: &mut sundial::Stepper) -> sundial::Task {
    let id = h
        .sundial
        .schedule(TaskSpec::new("k").delay(within_the_lead()))
        .await
        .unwrap();
    stepper.settle().await;
    h.sundial.get(id).await.unwrap().unwrap()
}

/// [`scheduled_within_the_lead`], claimed ahead (`running` before its due time).
async fn claimed_ahead(h: &Harness, stepper: &mut sundial::Stepper) -> sundial::Task {
    let stored = scheduled_within_the_lead(h, stepper).await;
    assert_eq!(stored.state, TaskState::Running, "claimed ahead");
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_due_within_the_lead_is_claimed_at_once_and_runs_at_its_due_time() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let stored = claimed_ahead(&h, &mut stepper).await;
    let id = stored.id;
    assert_eq!(stored.started_at, Some(stored.due_at));
    assert!(stored.due_at > h.clock.now());
    no_run(&mut runs).await;
    h.clock
        .advance(within_the_lead() - Duration::from_millis(1));
    stepper.settle().await;
    no_run(&mut runs).await;
    h.clock.advance(Duration::from_millis(1));
    stepper.settle().await;
    let run = next_run(&mut runs).await;
    assert_eq!(run.id, id);
    assert!(run.at >= run.due, "started early: {run:?}");
    assert_eq!(run.at, stored.due_at);
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_cancelled_while_it_waits_for_its_due_time_is_never_run() {
    let h = harness().await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = claimed_ahead(&h, &mut stepper).await.id;
    h.sundial.cancel(id).await.unwrap();
    h.clock.advance(within_the_lead());
    stepper.settle().await;
    no_run(&mut runs).await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Cancelled
    );
}

/// Counts the engine's (and the test's) reads of one task.
struct CountGets(Arc<AtomicUsize>);

impl Intercept for CountGets {
    fn enter(&self, call: Call) -> Option<Box<dyn Send>> {
        if call.method == "get" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        None
    }
}

/// A one-shard engine over the embedded store, counting `get` calls.
fn counting_gets() -> (Harness, Arc<AtomicUsize>) {
    let dir = tempfile::tempdir().unwrap();
    let gets = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        CountGets(gets.clone()),
    ));
    let (sundial, clock) = one_shard(store);
    (
        Harness {
            sundial,
            clock,
            dir,
        },
        gets,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_claimed_ahead_is_not_read_again_when_nothing_could_have_ended_it() {
    let (h, gets) = counting_gets();
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = claimed_ahead(&h, &mut stepper).await.id;
    let reads = reads_to_run(&h, &mut stepper, &mut runs, &gets, id).await;
    assert_eq!(reads, 0, "run without a read");
}

/// Steps the clock to the due time of task `id`, claimed ahead: its handler runs. Returns how
/// many reads of a task that took.
async fn reads_to_run(
    h: &Harness,
    stepper: &mut sundial::Stepper,
    runs: &mut tokio::sync::mpsc::UnboundedReceiver<Run>,
    gets: &AtomicUsize,
    id: sundial::TaskId,
) -> usize {
    let before = gets.load(Ordering::SeqCst);
    h.clock.advance(within_the_lead());
    stepper.settle().await;
    assert_eq!(next_run(runs).await.id, id);
    gets.load(Ordering::SeqCst) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_out_of_band_write_a_run_claimed_ahead_is_read_again_and_runs() {
    let (h, gets) = counting_gets();
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = claimed_ahead(&h, &mut stepper).await.id;
    let other = h
        .sundial
        .schedule(TaskSpec::new("other").delay(Duration::from_secs(60)))
        .await
        .unwrap();
    h.sundial.cancel(other).await.unwrap();
    let reads = reads_to_run(&h, &mut stepper, &mut runs, &gets, id).await;
    assert_eq!(reads, 1, "read once first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_lead_nothing_is_claimed_before_it_is_due() {
    let h = harness_with(Config {
        run_claim_lead: Duration::ZERO,
        ..Config::default()
    })
    .await;
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(TaskSpec::new("k").delay(Duration::from_millis(5)))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(
        h.sundial.get(id).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    h.clock.advance(Duration::from_millis(5));
    stepper.settle().await;
    assert_eq!(next_run(&mut runs).await.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_opts_out_has_its_tasks_claimed_when_due() {
    let h = harness().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let clock = h.clock.clone();
    h.sundial.register(
        "k",
        sundial::ClaimedWhenDue(move |ctx: sundial::TaskContext| {
            let _ = tx.send((ctx.task.id, clock.now()));
            async { Ok::<(), sundial::HandlerError>(()) }
        }),
    );
    let mut stepper = h.sundial.stepper();
    let stored = scheduled_within_the_lead(&h, &mut stepper).await;
    let id = stored.id;
    assert_eq!(stored.state, TaskState::Scheduled, "not claimed ahead");
    h.clock.advance(within_the_lead());
    stepper.settle().await;
    let (ran, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ran, id);
    assert_eq!(at, stored.due_at);
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
}

/// Holds the first `claim_due` back until let go, and counts the calls and the claims of each
/// task.
struct HoldFirstClaim {
    calls: Arc<AtomicUsize>,
    go: tokio::sync::watch::Receiver<bool>,
    claims_of: Arc<std::sync::Mutex<std::collections::HashMap<sundial::TaskId, usize>>>,
}

impl HoldFirstClaim {
    fn new(go: tokio::sync::watch::Receiver<bool>) -> Self {
        HoldFirstClaim {
            calls: Arc::default(),
            go,
            claims_of: Arc::default(),
        }
    }
}

#[async_trait::async_trait]
impl Intercept for HoldFirstClaim {
    async fn claim_due(
        &self,
        inner: &dyn sundial::Store,
        claims: Vec<sundial_store::DueClaim>,
        now: sundial::Timestamp,
        fence: Option<sundial_store::Fence>,
    ) -> Result<Vec<sundial_store::ClaimOutcome>, sundial::StoreError> {
        if let Ok(mut of) = self.claims_of.lock() {
            for c in &claims {
                *of.entry(c.id).or_default() += 1;
            }
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut go = self.go.clone();
            let _ = go.wait_for(|g| *g).await;
        }
        inner.claim_due(claims, now, fence).await
    }
}

/// Waits (a bounded real-time wait) until `n` is at least `at_least`; answers whether it got there.
async fn reaches(n: &AtomicUsize, at_least: usize) -> bool {
    for _ in 0..500 {
        if n.load(Ordering::SeqCst) >= at_least {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// The embedded store's one writer can hold a claim behind a long write (a large insert). A
/// claim ahead has until its tasks' due time to commit, and the loop does not wait for it: a
/// task coming within the lead meanwhile is claimed at once, not after the held claim returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_ahead_held_in_the_store_does_not_hold_the_next_one_back() {
    let (go, held) = tokio::sync::watch::channel(false);
    let (h, store) = intercepted(HoldFirstClaim::new(held), Config::default());
    let calls = store.hooks.calls.clone();
    let mut runs = record(&h, "k", |_| Ok(()));
    let running = h.sundial.start();
    let lead = Config::default().run_claim_lead;
    let first = h
        .sundial
        .schedule(TaskSpec::new("k").delay(lead / 3))
        .await
        .unwrap();
    assert!(reaches(&calls, 1).await, "the first claim is asked for");
    let second = h
        .sundial
        .schedule(TaskSpec::new("k").delay(lead * 2 / 3))
        .await
        .unwrap();
    assert!(
        reaches(&calls, 2).await,
        "the second task is claimed while the first claim is held"
    );
    // Claimed ahead, while the first claim is still held.
    wait_state(&h.sundial, second, TaskState::Running).await;
    assert_eq!(
        h.sundial.get(first).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    no_run(&mut runs).await;
    go.send_replace(true);
    wait_state(&h.sundial, first, TaskState::Running).await;
    no_run(&mut runs).await;
    for id in [first, second] {
        let due = h.sundial.get(id).await.unwrap().unwrap().due_at;
        h.clock.set(due);
        let run = next_run(&mut runs).await;
        assert_eq!(run.id, id);
        assert_eq!(run.at, due, "runs at its due time");
    }
    running.shutdown(Duration::from_secs(5)).await;
}

/// A task whose claim ahead is held in the store is still scheduled there, so a scan brings it
/// back into the window: the loop does not claim it a second time while the first claim is in
/// flight, and it runs once, at its due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_claim_ahead_is_in_flight_is_not_claimed_again() {
    let (go, held) = tokio::sync::watch::channel(false);
    let (h, store) = intercepted(HoldFirstClaim::new(held), Config::default());
    let (calls, claims_of) = (store.hooks.calls.clone(), store.hooks.claims_of.clone());
    let mut runs = record(&h, "k", |_| Ok(()));
    let running = h.sundial.start();
    let lead = Config::default().run_claim_lead;
    let first = h
        .sundial
        .schedule(TaskSpec::new("k").delay(lead / 3))
        .await
        .unwrap();
    assert!(reaches(&calls, 1).await, "the claim ahead is asked for");
    // A resumed queue makes the next turn scan the shard from the front, where it finds the
    // first task still scheduled; the turn that claims the second task comes at or after it.
    h.sundial.pause_queue("other").await.unwrap();
    h.sundial.resume_queue("other").await.unwrap();
    let second = h
        .sundial
        .schedule(TaskSpec::new("k").delay(lead * 2 / 3))
        .await
        .unwrap();
    wait_state(&h.sundial, second, TaskState::Running).await;
    assert_eq!(
        h.sundial.get(first).await.unwrap().unwrap().state,
        TaskState::Scheduled,
        "the held claim has not committed, and no other claim started the task"
    );
    assert_eq!(claims_of.lock().unwrap().get(&first), Some(&1));
    go.send_replace(true);
    wait_state(&h.sundial, first, TaskState::Running).await;
    for id in [first, second] {
        let due = h.sundial.get(id).await.unwrap().unwrap().due_at;
        h.clock.set(due);
        let run = next_run(&mut runs).await;
        assert_eq!(run.id, id);
        assert_eq!(run.attempt, 1);
        assert_eq!(run.at, due, "runs at its due time");
    }
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        claims_of.lock().unwrap().get(&first),
        Some(&1),
        "claimed once"
    );
}

/// Settles while the runs counted in `holding` are held open.
async fn settle_holding(stepper: &mut sundial::Stepper, holding: &Arc<AtomicUsize>) {
    let holding = holding.clone();
    stepper
        .settle_holding(move || holding.load(Ordering::SeqCst))
        .await;
}

/// What a claim ahead does not start comes back to its loop: a task refused for an exclusive
/// key held by a running task waits for the key, and runs when the holder finishes, at its own
/// due time (the clock never moves past it, so the 1 s retry cannot hide a lost refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_refused_by_a_claim_ahead_waits_for_its_key_and_runs_when_it_is_free() {
    let h = harness().await;
    let (release, released) = tokio::sync::watch::channel(false);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let clock = h.clock.clone();
    let holding = Arc::new(AtomicUsize::new(0));
    let held = holding.clone();
    h.sundial.register("k", move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        let at = clock.now();
        let mut released = released.clone();
        let held = held.clone();
        async move {
            let _ = tx.send((ctx.task.id, at));
            if ctx.task.payload["hold"] == true {
                held.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|r| *r).await;
                held.fetch_sub(1, Ordering::SeqCst);
            }
            Ok::<(), sundial::HandlerError>(())
        }
    });
    let mut stepper = h.sundial.stepper();
    let exclusive = |spec: TaskSpec| spec.exclusive("one-at-a-time", sundial::ExclusiveMode::Wait);
    let holder = h
        .sundial
        .schedule(exclusive(TaskSpec::new("k")).payload(serde_json::json!({"hold": true})))
        .await
        .unwrap();
    settle_holding(&mut stepper, &holding).await;
    let (ran, _) = rx.recv().await.unwrap();
    assert_eq!(ran, holder);
    let waiter = h
        .sundial
        .schedule(exclusive(TaskSpec::new("k")).delay(within_the_lead()))
        .await
        .unwrap();
    settle_holding(&mut stepper, &holding).await;
    assert_eq!(
        h.sundial.get(waiter).await.unwrap().unwrap().state,
        TaskState::Scheduled,
        "refused: the key is held"
    );
    release.send_replace(true);
    wait_state(&h.sundial, holder, TaskState::Succeeded).await;
    stepper.settle().await;
    let due = h.sundial.get(waiter).await.unwrap().unwrap().due_at;
    h.clock.set(due);
    stepper.settle().await;
    let (ran, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ran, waiter);
    assert_eq!(at, due, "runs at its due time");
    wait_state(&h.sundial, waiter, TaskState::Succeeded).await;
}

/// A loop takes a turn a run lead early only for a task whose handler takes claims ahead: a task
/// for workers (no in-process handler) gets no turn then, only at its due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_turns_a_run_lead_early_only_for_tasks_claimed_ahead() {
    let h = harness_with(Config {
        shard_count: 1,
        ..Config::default()
    })
    .await;
    let _runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let lead = Config::default().run_claim_lead;
    let due = h.clock.now().saturating_add(lead * 3);
    h.sundial
        .schedule(TaskSpec::new("for-workers").run_at(due))
        .await
        .unwrap();
    let next = stepper.settle().await;
    assert_eq!(next, due, "no turn a run lead early for a worker's task");
    let later = due.saturating_add(Duration::from_millis(1));
    h.sundial
        .schedule(TaskSpec::new("k").run_at(later))
        .await
        .unwrap();
    let next = stepper.settle().await;
    assert_eq!(
        next,
        Timestamp(later.0 - lead.as_millis() as i64),
        "a turn a run lead early for a task claimed ahead"
    );
}

/// A run claimed ahead whose claim committed but answered an error runs at its due time once
/// the store answers again, not when its lease (the task's timeout) ends and the reaper offers
/// it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_claimed_ahead_whose_claim_answer_was_lost_runs_at_its_due_time() {
    let (h, _store) = intercepted(
        common::intercept::LoseFirstRunAnswer::new(),
        Config::default(),
    );
    let mut runs = record(&h, "k", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(
            TaskSpec::new("k")
                .delay(within_the_lead())
                .timeout(Duration::from_secs(3_600)),
        )
        .await
        .unwrap();
    stepper.settle().await;
    let stored = h.sundial.get(id).await.unwrap().unwrap();
    assert_eq!(
        stored.state,
        TaskState::Running,
        "the claim ahead committed"
    );
    no_run(&mut runs).await;
    // The loop tries the store again after its backoff, past the due time.
    h.clock.advance(Duration::from_millis(200));
    stepper.settle().await;
    let run = next_run(&mut runs).await;
    assert_eq!(run.id, id);
    assert_eq!(run.attempt, 1, "run under the claim's execution");
    assert!(run.at >= run.due, "started early: {run:?}");
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
    no_run(&mut runs).await;
}
