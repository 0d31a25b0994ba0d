//! Fault battery, clock jumps (embedded store): the node's wall clock jumps 10 minutes forward,
//! then back, through the `Clock` the engine runs on, with in-process handlers and a polling
//! worker on the same store.
//!
//! It proves, and fails otherwise:
//! - after the forward jump, every task that the jump made due starts (none is left waiting for
//!   the time it would have been due before the jump), within the idle interval and a margin;
//! - after the backward jump, nothing starts before its due time by the node's clock: the tasks
//!   due between the two readings wait for the clock to get there again, and claims are decided
//!   on the clock's present reading, not on anything remembered from the jump;
//! - nothing is stuck: a task created after the backward jump runs on time, and once the clock
//!   reaches the later tasks' due times, they run.
//!
//! Two clocks take the jumps. A `ManualClock` (`set`): deterministic, it wakes every sleeper
//! whose deadline its new reading passed. And the system clock shifted by an offset
//! (`OffsetClock` over `SystemClock`): its sleeps are tokio timers armed for a duration, which do
//! not notice a step of the clock while they sleep, exactly as with a real wall clock that is
//! stepped (an NTP correction, an operator's `date -s`). The short form and the long form are the
//! same (a few seconds).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sundial::clock::OffsetClock;
use sundial::{
    Clock, Config, ManualClock, Sundial, SystemClock, TaskContext, TaskId, TaskSpec, Timestamp,
};

const MIN: i64 = 60_000;
const JUMP: i64 = 10 * MIN;
/// How long (real time) a task may take to start once the clock says it is due.
const START_BOUND: Duration = Duration::from_millis(4_000);

/// A clock the test can jump, and let real or simulated time pass on.
trait Jumper: Send + Sync {
    fn clock(&self) -> Arc<dyn Clock>;
    /// Steps the clock by `ms` (either way).
    fn jump(&self, ms: i64);
    /// Lets `d` pass on the clock.
    async fn pass(&self, d: Duration);
    fn name(&self) -> &'static str;
    /// The engine's idle interval for this clock.
    fn idle(&self) -> Duration;
}

struct Manual(ManualClock);

impl Jumper for Manual {
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(self.0.clone())
    }
    fn jump(&self, ms: i64) {
        self.0.set(Timestamp(self.0.now().0 + ms));
    }
    async fn pass(&self, d: Duration) {
        // In small steps, with real yields, so loops woken on the way get to run.
        let steps = (d.as_millis() / 100).max(1) as u32;
        for _ in 0..steps {
            self.0.advance(d / steps);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    fn name(&self) -> &'static str {
        "manual"
    }
    /// Short, so that the backstop rescan is checked too.
    fn idle(&self) -> Duration {
        Duration::from_millis(800)
    }
}

struct Wall(Arc<OffsetClock>);

impl Jumper for Wall {
    fn clock(&self) -> Arc<dyn Clock> {
        self.0.clone()
    }
    fn jump(&self, ms: i64) {
        self.0.set_offset_ms(self.0.offset_ms() + ms);
    }
    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    fn name(&self) -> &'static str {
        "wall"
    }
    /// The default (30 s): a start within seconds of a jump is then not the idle backstop's doing.
    fn idle(&self) -> Duration {
        Config::default().idle_interval
    }
}

#[derive(Debug, Clone, Copy)]
struct Start {
    at: Timestamp,
    due: Timestamp,
    /// Real (system clock) time of the start, for latencies.
    real: i64,
}

#[derive(Default)]
struct Starts(Mutex<HashMap<TaskId, Vec<Start>>>);

impl Starts {
    fn record(&self, id: TaskId, s: Start) {
        self.0.lock().unwrap().entry(id).or_default().push(s);
    }
    fn get(&self, id: TaskId) -> Option<Start> {
        self.0
            .lock()
            .unwrap()
            .get(&id)
            .and_then(|v| v.first().copied())
    }
    fn all(&self) -> Vec<(TaskId, Start)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(id, v)| v.iter().map(|s| (*id, *s)))
            .collect()
    }
}

fn real_now() -> i64 {
    SystemClock.now().0
}

/// Waits (bounded, real time) until every task of `ids` started; their first starts.
async fn wait_started(starts: &Starts, ids: &[TaskId], what: String) -> Vec<Start> {
    let from = real_now();
    loop {
        if ids.iter().all(|id| starts.get(*id).is_some()) {
            return ids.iter().map(|id| starts.get(*id).unwrap()).collect();
        }
        assert!(
            real_now() - from < START_BOUND.as_millis() as i64,
            "{what}: not started within {START_BOUND:?}: {:?}",
            ids.iter()
                .filter(|id| starts.get(**id).is_none())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The latest real start among `starts`, in ms after `since`.
fn latest_after(starts: &[Start], since: i64) -> i64 {
    starts.iter().map(|s| s.real - since).max().unwrap_or(0)
}

async fn scenario(j: impl Jumper + 'static) -> String {
    let dir = tempfile::tempdir().unwrap();
    let clock = j.clock();
    let s = Sundial::builder()
        .config(Config {
            idle_interval: j.idle(),
            ..Config::default()
        })
        .clock(clock.clone())
        .open(dir.path())
        .await
        .unwrap();
    let starts = Arc::new(Starts::default());
    {
        let (starts, clock) = (starts.clone(), clock.clone());
        s.register("inproc", move |ctx: TaskContext| {
            starts.record(
                ctx.task.id,
                Start {
                    at: clock.now(),
                    due: ctx.task.due_at,
                    real: real_now(),
                },
            );
            async { Ok::<(), sundial::HandlerError>(()) }
        });
    }
    let running = s.start();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (s, starts, clock, stop) = (s.clone(), starts.clone(), clock.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Ends with the engine (a poll after shutdown is refused).
                let Ok(got) = s
                    .poll(
                        "remote",
                        Some("w".into()),
                        None,
                        10,
                        Duration::from_millis(200),
                    )
                    .await
                else {
                    break;
                };
                for t in got {
                    starts.record(
                        t.id,
                        Start {
                            at: clock.now(),
                            due: t.due_at,
                            real: real_now(),
                        },
                    );
                    s.complete(t.id, t.execution_id.unwrap(), None)
                        .await
                        .unwrap();
                }
            }
        })
    };

    let t0 = clock.now();
    let at = |ms: i64| Timestamp(t0.0 + ms);
    let inproc = |ms: i64| TaskSpec::new("inproc").run_at(at(ms));
    let remote = |ms: i64| TaskSpec::new("remote").queue("remote").run_at(at(ms));
    let mut ids = HashMap::new();
    for (name, spec) in [
        ("in-1s", inproc(1_000)),
        ("in-5m", inproc(5 * MIN)),
        ("in-9m", inproc(9 * MIN)),
        ("in-11m", inproc(11 * MIN)),
        ("in-15m", inproc(15 * MIN)),
        ("re-5m", remote(5 * MIN)),
        ("re-11m", remote(11 * MIN)),
    ] {
        ids.insert(name, s.schedule(spec).await.unwrap());
    }
    j.pass(Duration::from_millis(1_500)).await;
    wait_started(
        &starts,
        &[ids["in-1s"]],
        format!("{}: before any jump", j.name()),
    )
    .await;

    // Forward: what the jump made due starts.
    let jumped = real_now();
    j.jump(JUMP);
    let forward_ms = latest_after(
        &wait_started(
            &starts,
            &[ids["in-5m"], ids["in-9m"], ids["re-5m"]],
            format!("{}: after the forward jump", j.name()),
        )
        .await,
        jumped,
    );

    // Back: nothing due later than the present reading starts; a new task runs on time.
    j.jump(-JUMP);
    let back_at = clock.now();
    let fresh_in = s.schedule(inproc_at(back_at, 1_000)).await.unwrap();
    let fresh_re = s
        .schedule(
            TaskSpec::new("remote")
                .queue("remote")
                .run_at(Timestamp(back_at.0 + 1_000)),
        )
        .await
        .unwrap();
    // One inserted behind the engine's back (no notification), due behind the window's cursor,
    // which the forward jump carried 10 minutes out: only a rescan from the front of its shard
    // finds it. Its shard's next turn (woken here by a task scheduled into the same shard) must
    // see that the backstop it armed before the step is 10 minutes away, and rescan.
    let hidden = if j.idle() < Duration::from_secs(5) {
        let cfg = s.config().clone();
        let new = inproc_at(back_at, 1_000)
            .key("hidden")
            .validate(
                TaskId(uuid::Uuid::now_v7()),
                back_at,
                cfg.shard_count,
                &cfg.limits,
            )
            .unwrap();
        let (id, shard) = (new.id, new.shard);
        s.store().insert(vec![new]).await.unwrap();
        let companion = (0..)
            .map(|i| inproc_at(back_at, 1_000).key(format!("companion-{i}")))
            .find(|spec| {
                spec.clone()
                    .validate(
                        TaskId(uuid::Uuid::now_v7()),
                        back_at,
                        cfg.shard_count,
                        &cfg.limits,
                    )
                    .is_ok_and(|t| t.shard == shard)
            })
            .unwrap();
        Some((id, s.schedule(companion).await.unwrap()))
    } else {
        None
    };
    j.pass(Duration::from_millis(1_500)).await;
    if let Some((id, companion)) = hidden {
        wait_started(
            &starts,
            &[id, companion],
            format!(
                "{}: found by the backstop after the backward jump",
                j.name()
            ),
        )
        .await;
    }
    let fresh_late_ms = wait_started(
        &starts,
        &[fresh_in, fresh_re],
        format!("{}: after the backward jump", j.name()),
    )
    .await
    .iter()
    .map(|st| st.at.0 - st.due.0)
    .max()
    .unwrap_or(0);
    for name in ["in-11m", "in-15m", "re-11m"] {
        assert!(
            starts.get(ids[name]).is_none(),
            "{name} started after the backward jump, at {}",
            clock.now()
        );
    }

    // The clock reaches the later due times again: they run.
    let jumped = real_now();
    j.jump(at(11 * MIN + 500).0 - clock.now().0);
    let later_ms = latest_after(
        &wait_started(
            &starts,
            &[ids["in-11m"], ids["re-11m"]],
            format!("{}: once the clock reached them", j.name()),
        )
        .await,
        jumped,
    );
    assert!(starts.get(ids["in-15m"]).is_none());
    j.jump(at(15 * MIN + 500).0 - clock.now().0);
    wait_started(&starts, &[ids["in-15m"]], format!("{}: the last", j.name())).await;

    // Shutting the engine down ends the worker's waiting poll (on the manual clock its wait
    // would never run out).
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    running.shutdown(Duration::from_secs(1)).await;
    worker.await.unwrap();

    let all = starts.all();
    let early: Vec<_> = all.iter().filter(|(_, st)| st.at < st.due).collect();
    assert!(early.is_empty(), "started before due: {early:?}");
    let twice = all.len() - starts.0.lock().unwrap().len();
    assert_eq!(twice, 0, "a task started twice");
    assert_eq!(all.len(), 9 + 2 * usize::from(hidden.is_some()));
    format!(
        "{}: {} starts, 0 early, 0 twice; forward +10m: due tasks started {forward_ms} ms after the jump; \
         back -10m: later tasks waited, new tasks started {fresh_late_ms} ms after due by the node's clock; \
         clock back at the later due times: started {later_ms} ms after (idle interval {} ms)",
        j.name(),
        all.len(),
        j.idle().as_millis()
    )
}

fn inproc_at(base: Timestamp, ms: i64) -> TaskSpec {
    TaskSpec::new("inproc").run_at(Timestamp(base.0 + ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_jumps() {
    let bound = Duration::from_secs(60);
    let manual = tokio::time::timeout(bound, scenario(Manual(ManualClock::new(SystemClock.now()))))
        .await
        .expect("the manual-clock scenario finished");
    let wall = tokio::time::timeout(
        bound,
        scenario(Wall(Arc::new(OffsetClock::new(Arc::new(SystemClock), 0)))),
    )
    .await
    .expect("the wall-clock scenario finished");
    println!("FAULT clock_jumps: {manual} | {wall}");
}
