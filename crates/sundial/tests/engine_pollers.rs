//! Long-poll wake-ups: tasks becoming ready wake one waiting poller per task (each passes the
//! wake-up on when it took a full batch), not every poller of the queue; pollers restricted to
//! some kinds are all woken. Counted on a store that records how often `claim_ready` is called.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::intercept::Intercept;
use common::*;
use sundial::{Config, ManualClock, Sundial, TaskSpec};
use sundial_core::{Task, Timestamp};
use sundial_store::{ReadyClaim, ReadyTaken, Store, StoreError};

/// Counts `claim_ready` calls, and how many are under way at once. While `gather` is set, a
/// call waits (up to 300 ms, real time) for that many to be under way, so calls made side by
/// side are seen together.
struct CountReadyClaims(Arc<AtomicUsize>, Arc<InFlight>);

#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
    gather: AtomicUsize,
}

#[async_trait]
impl Intercept for CountReadyClaims {
    async fn claim_ready(
        &self,
        inner: &dyn Store,
        claim: ReadyClaim,
    ) -> Result<ReadyTaken, StoreError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let f = &self.1;
        let now = f.now.fetch_add(1, Ordering::SeqCst) + 1;
        f.most.fetch_max(now, Ordering::SeqCst);
        let gather = f.gather.load(Ordering::SeqCst);
        for _ in 0..60 {
            if f.now.load(Ordering::SeqCst) >= gather {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let out = inner.claim_ready(claim).await;
        f.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

struct Setup {
    sundial: Sundial,
    clock: ManualClock,
    claims: Arc<AtomicUsize>,
    in_flight: Arc<InFlight>,
    _dir: tempfile::TempDir,
}

/// The wake-ups of pollers waiting for ready tasks: with hand-off off, every due task is readied
/// and claimed by a poll (with it on, a waiting poll is handed the task instead: see
/// `engine_handoff.rs`), as on a node whose polls wait for tasks another node readied.
fn setup() -> Setup {
    setup_with(Config::default())
}

fn setup_with(config: Config) -> Setup {
    let config = Config {
        hand_off_to_polls: false,
        ..config
    };
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(InFlight::default());
    let store = Arc::new(common::intercept::sqlite(
        dir.path(),
        CountReadyClaims(claims.clone(), in_flight.clone()),
    ));
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(config)
        .clock(Arc::new(clock.clone()))
        .with_store(store)
        .expect("a valid config");
    Setup {
        sundial,
        clock,
        claims,
        in_flight,
        _dir: dir,
    }
}

/// How many 5 ms looks the checks that something does not happen take (real time, 150 ms in
/// all: an absence has no event to wait for).
const WATCH: usize = 30;

/// Asserts that `claim_ready` is called no more than `at_most` times in all during [`WATCH`].
async fn claims_stay_at_most(s: &Setup, at_most: usize) {
    for _ in 0..WATCH {
        let n = s.claims.load(Ordering::SeqCst);
        assert!(n <= at_most, "{n} claims, expected at most {at_most}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts that none of `waiting` returns during [`WATCH`].
async fn still_waiting(waiting: &[tokio::task::JoinHandle<Vec<Task>>]) {
    for _ in 0..WATCH {
        assert!(
            waiting.iter().all(|h| !h.is_finished()),
            "a poller returned"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts `n` pollers on `queue` (each taking up to `max`, of `kinds` when given) and waits
/// until every one has made its first claim and is parked on the clock (the engine is stepped,
/// so nothing else sleeps on it).
async fn pollers(
    s: &Setup,
    n: usize,
    max: usize,
    kinds: Option<Vec<String>>,
) -> Vec<tokio::task::JoinHandle<Vec<Task>>> {
    let before = s.claims.load(Ordering::SeqCst);
    let parked_before = s.clock.sleepers();
    let handles = (0..n)
        .map(|_| {
            let sundial = s.sundial.clone();
            let kinds = kinds.clone();
            tokio::spawn(async move {
                sundial
                    .poll("q", None, kinds, max, Duration::from_secs(30))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for _ in 0..500 {
        if s.claims.load(Ordering::SeqCst) >= before + n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.claims.load(Ordering::SeqCst), before + n);
    parked(&s.clock, parked_before + n).await;
    handles
}

/// Schedules `n` tasks of queue `q` due together 1 s on, then steps the clock there: with one
/// shard they become ready in one claim.
async fn ready_together(s: &Setup, stepper: &mut sundial::Stepper, n: usize) {
    let due = Timestamp(T0.0 + 1_000);
    let specs = (0..n)
        .map(|_| TaskSpec::new("w").queue("q").run_at(due))
        .collect();
    s.sundial.schedule_many(specs).await.unwrap();
    stepper.settle().await;
    s.clock.advance(Duration::from_secs(1));
    stepper.settle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_wakes_one_waiting_poller_not_all_of_them() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    // Each takes up to two, so the one woken takes less than a full batch and wakes no other.
    let mut waiting = pollers(&s, 8, 2, None).await;
    let before = s.claims.load(Ordering::SeqCst);
    let id = s
        .sundial
        .schedule(TaskSpec::new("w").queue("q"))
        .await
        .unwrap();
    stepper.settle().await;
    // Exactly one poller returns with the task.
    let mut got = None;
    for _ in 0..1_000 {
        if let Some(i) = waiting.iter().position(|h| h.is_finished()) {
            got = Some(waiting.swap_remove(i).await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got = got.expect("a poller got the task");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    // One claim for one ready task (before, every waiting poller claimed: eight).
    claims_stay_at_most(&s, before + 1).await;
    assert_eq!(s.claims.load(Ordering::SeqCst) - before, 1);
    still_waiting(&waiting).await;
    for h in waiting {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poller_that_took_a_full_batch_wakes_the_next() {
    // One shard, and six tasks due at one moment: they become ready in one claim.
    let s = setup_with(Config {
        shard_count: 1,
        ..Config::default()
    });
    let mut stepper = s.sundial.stepper();
    let waiting = pollers(&s, 3, 2, None).await;
    ready_together(&s, &mut stepper, 6).await;
    // Three pollers taking two each all get theirs: the first woken took a full batch and woke
    // the next, and so on.
    let mut total = 0;
    for h in waiting {
        let got = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .expect("every poller is woken in turn")
            .unwrap();
        assert_eq!(got.len(), 2);
        total += got.len();
    }
    assert_eq!(total, 6);
}

/// Tasks readied together wake as many waiting pollers at once, which claim side by side: a
/// poller taking one task per poll does not wait for the one woken before it to finish its
/// claim (each a durable write) before it is woken in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_readied_together_wake_as_many_pollers_at_once() {
    const READIED: usize = 3;
    let s = setup_with(Config {
        shard_count: 1,
        ..Config::default()
    });
    let mut stepper = s.sundial.stepper();
    let waiting = pollers(&s, READIED + 2, 1, None).await;
    s.in_flight.most.store(0, Ordering::SeqCst);
    s.in_flight.gather.store(READIED, Ordering::SeqCst);
    ready_together(&s, &mut stepper, READIED).await;
    let mut got = 0;
    for _ in 0..1_000 {
        got = waiting.iter().filter(|h| h.is_finished()).count();
        if got >= READIED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(got, READIED, "each readied task went to a poller");
    assert_eq!(
        s.in_flight.most.load(Ordering::SeqCst),
        READIED,
        "the woken pollers claimed side by side"
    );
    for h in waiting {
        h.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_restricted_to_kinds_are_all_woken() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let mut a = pollers(&s, 2, 1, Some(vec!["a".to_string()])).await;
    let b = pollers(&s, 1, 1, Some(vec!["b".to_string()])).await;
    let id = s
        .sundial
        .schedule(TaskSpec::new("b").queue("q"))
        .await
        .unwrap();
    stepper.settle().await;
    let got = tokio::time::timeout(Duration::from_secs(10), b.into_iter().next().unwrap())
        .await
        .expect("the poller of kind b is woken")
        .unwrap();
    assert_eq!(got[0].id, id);
    still_waiting(&a).await;
    for h in a.drain(..) {
        h.abort();
    }
}

/// A poll woken long after its deadline (its process was stopped, SIGSTOP or a stall, while it
/// waited) answers empty without claiming: its caller has given up by then, and a task claimed
/// for it would sit `running`, seen by no worker, until its lease (the task's timeout) ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_woken_long_past_its_deadline_claims_nothing() {
    let s = setup();
    let mut stepper = s.sundial.stepper();
    let mut waiting = pollers(&s, 1, 8, None).await;
    let before = s.claims.load(Ordering::SeqCst);
    // Work that falls due while the process is "stopped".
    let id = s
        .sundial
        .schedule(TaskSpec::new("k").queue("q").delay(Duration::from_secs(40)))
        .await
        .unwrap();
    // The stop ends 60 s in: the poll's 30 s deadline passed long ago.
    s.clock.advance(Duration::from_secs(60));
    stepper.settle().await;
    let got = waiting.pop().unwrap().await.unwrap();
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(
        s.claims.load(Ordering::SeqCst),
        before,
        "the overslept poll claimed again"
    );
    // The task is left for the next poll.
    let next = s
        .sundial
        .poll("q", None, None, 8, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(next.iter().map(|t| t.id).collect::<Vec<_>>(), [id]);
}
