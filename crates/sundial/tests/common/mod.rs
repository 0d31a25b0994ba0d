//! Test helpers: an engine on a temporary store driven by a manual clock.
#![allow(dead_code)]

pub mod intercept;

use std::sync::Arc;
use std::time::Duration;

use sundial::{Config, ManualClock, Sundial, Task, TaskId, TaskState, Timestamp};
use tokio::sync::mpsc;

pub const T0: Timestamp = Timestamp(1_700_000_000_000);

pub struct Harness {
    pub sundial: Sundial,
    pub clock: ManualClock,
    pub dir: tempfile::TempDir,
}

pub async fn harness() -> Harness {
    harness_with(Config::default()).await
}

pub async fn harness_with(config: Config) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(config)
        .clock(Arc::new(clock.clone()))
        .open(dir.path())
        .await
        .expect("open");
    Harness {
        sundial,
        clock,
        dir,
    }
}

/// A one-shard engine over `store` on a manual clock at [`T0`].
pub fn one_shard(store: Arc<dyn sundial::Store>) -> (Sundial, ManualClock) {
    one_shard_with(store, Config::default())
}

/// [`one_shard`] with `config` (its shard count set to one).
pub fn one_shard_with(store: Arc<dyn sundial::Store>, config: Config) -> (Sundial, ManualClock) {
    let clock = ManualClock::new(T0);
    let sundial = Sundial::builder()
        .config(Config {
            shard_count: 1,
            ..config
        })
        .clock(Arc::new(clock.clone()))
        .with_store(store)
        .expect("a valid config");
    (sundial, clock)
}

/// A one-shard engine (with `config`) on a manual clock at [`T0`] over the embedded store in a
/// fresh directory, its calls going through `hooks`: the harness, and the store, whose hooks the
/// test can reach.
pub fn intercepted<H>(hooks: H, config: Config) -> (Harness, Arc<intercept::Intercepted<H>>)
where
    intercept::Intercepted<H>: sundial::Store,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(intercept::sqlite(dir.path(), hooks));
    let (sundial, clock) = one_shard_with(store.clone(), config);
    (
        Harness {
            sundial,
            clock,
            dir,
        },
        store,
    )
}

/// A one-shard engine over `store` on a manual clock at [`T0`], with a handler for kind `k` that
/// records each run (its due time as `at` and `due`) on the returned channel.
pub fn one_shard_recording(
    store: Arc<dyn sundial::Store>,
) -> (Sundial, ManualClock, mpsc::UnboundedReceiver<Run>) {
    let (sundial, clock) = one_shard(store);
    let (tx, runs) = mpsc::unbounded_channel();
    sundial.register("k", move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(Run {
                id: ctx.task.id,
                attempt: ctx.task.attempt,
                at: ctx.task.due_at,
                due: ctx.task.due_at,
            });
            Ok::<(), sundial::HandlerError>(())
        }
    });
    (sundial, clock, runs)
}

/// What a recording handler saw.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: TaskId,
    pub attempt: u32,
    pub at: Timestamp,
    pub due: Timestamp,
}

/// Registers a handler for `kind` that records each run (with the clock's time) and then returns
/// what `outcome` says for that attempt.
pub fn record(
    h: &Harness,
    kind: &str,
    outcome: impl Fn(u32) -> Result<(), String> + Send + Sync + 'static,
) -> mpsc::UnboundedReceiver<Run> {
    let (tx, rx) = mpsc::unbounded_channel();
    let clock = h.clock.clone();
    let outcome = Arc::new(outcome);
    h.sundial.register(kind, move |ctx: sundial::TaskContext| {
        let tx = tx.clone();
        let at = sundial::Clock::now(&clock);
        let outcome = outcome.clone();
        async move {
            let _ = tx.send(Run {
                id: ctx.task.id,
                attempt: ctx.task.attempt,
                at,
                due: ctx.task.due_at,
            });
            outcome(ctx.task.attempt).map_err(sundial::HandlerError::retryable)
        }
    });
    rx
}

/// Waits (a bounded real-time wait) for the next run.
pub async fn next_run(rx: &mut mpsc::UnboundedReceiver<Run>) -> Run {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a run within 10s")
        .expect("channel open")
}

/// Asserts that no run arrives within a short real-time wait.
pub async fn no_run(rx: &mut mpsc::UnboundedReceiver<Run>) {
    if let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(150), rx.recv()).await {
        panic!("unexpected run: {r:?}");
    }
}

/// Waits (bounded) until the task reaches `state`.
pub async fn wait_state(s: &Sundial, id: TaskId, state: TaskState) -> Task {
    for _ in 0..1_000 {
        if let Some(t) = s.get(id).await.expect("get")
            && t.state == state
        {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = s.get(id).await.expect("get");
    panic!("task {id} did not reach {state}: {t:?}");
}

/// Waits (bounded) until at least `n` sleepers are parked on the manual clock: with a stepped
/// engine nothing else sleeps on it, so this says a long poll (or a shutdown's deadline) is
/// armed.
pub async fn parked(clock: &ManualClock, n: usize) {
    for _ in 0..10_000 {
        if clock.sleepers() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "{n} sleepers did not park on the clock: {}",
        clock.sleepers()
    );
}
