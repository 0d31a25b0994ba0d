//! Crash test: a child process schedules thousands of tasks and is killed with SIGKILL at a random
//! moment; the parent reopens the store and checks that every task whose `schedule` returned is
//! there and runs, none before its due time, and no execution id runs twice.
//!
//! The child is this same test binary, re-executed with `SUNDIAL_CRASH_CHILD` set so that the test
//! [`crash_child`] runs its child body (without the variable it returns at once). The child prints
//! `SUNDIAL-ID <uuid>` on stdout, flushed, right after a `schedule` call returned `Ok`: each printed
//! id is a promise the store must keep. The parent kills the child 200–1500 ms after its first
//! acknowledged schedule, so the kill lands in the middle of a stream of group commits.
//!
//! Both sides use the real [`SystemClock`]: due times set by the child are compared with start times
//! read by the parent on the same wall clock.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use sundial::{Config, ExecutionId, Scheduled, Sundial, TaskId, TaskSpec, Timestamp};

const CHILD_ENV: &str = "SUNDIAL_CRASH_CHILD";
const ID_MARK: &str = "SUNDIAL-ID ";
/// Concurrent scheduling tasks in the child; even ones schedule one at a time, odd ones in batches.
const PRODUCERS: usize = 8;
/// Upper bound on what one producer schedules, so a child that is never killed still stops.
const PER_PRODUCER: usize = 5_000;

/// Writes one whole line to the real stdout (not libtest's capture) and flushes it.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    // A newline first: libtest may have left "test crash_child ... " on the current line.
    let _ = out.write_all(format!("\n{line}\n").as_bytes());
    let _ = out.flush();
}

/// The child's body: runs only when re-executed by [`kill9_loses_nothing_and_never_fires_early`].
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let sundial = Sundial::open(&dir).await.expect("open store in child");
        let mut producers = Vec::new();
        for p in 0..PRODUCERS {
            let sundial = sundial.clone();
            producers.push(tokio::spawn(async move { produce(sundial, p).await }));
        }
        for p in producers {
            p.await.expect("producer");
        }
        // Everything scheduled: wait to be killed.
        std::future::pending::<()>().await;
    });
}

/// A mix of due times: a third due immediately, the rest 0–3 s ahead; some with a business key.
fn spec(p: usize, n: usize) -> TaskSpec {
    let mut rng = rand::rng();
    let mut s = TaskSpec::new("crash.record").payload(serde_json::json!({"p": p, "n": n}));
    if rng.random_range(0..3) != 0 {
        s = s.delay(Duration::from_millis(rng.random_range(0..=3_000)));
    }
    if n.is_multiple_of(4) {
        s = s.key(format!("p{p}-n{n}"));
    }
    s
}

async fn produce(sundial: Sundial, p: usize) {
    let mut n = 0;
    while n < PER_PRODUCER {
        if p.is_multiple_of(2) {
            let id = sundial.schedule(spec(p, n)).await.expect("schedule");
            emit(&format!("{ID_MARK}{id}"));
            n += 1;
        } else {
            let size = rand::rng().random_range(1..=64).min(PER_PRODUCER - n);
            let specs = (n..n + size).map(|i| spec(p, i)).collect();
            let out = sundial.schedule_many(specs).await.expect("schedule_many");
            let mut lines = String::new();
            for s in out {
                match s {
                    Scheduled::Created(t) => lines.push_str(&format!("\n{ID_MARK}{}", t.id)),
                    Scheduled::Duplicate { existing } => panic!("unexpected duplicate {existing}"),
                }
            }
            emit(lines.trim_start());
            n += size;
        }
    }
}

/// What the parent's handler saw of one run.
#[derive(Debug, Clone, Copy)]
struct Run {
    execution: ExecutionId,
    started: Timestamp,
    due: Timestamp,
}

#[derive(Default)]
struct Recorder {
    runs: Mutex<HashMap<TaskId, Vec<Run>>>,
}

#[test]
fn kill9_loses_nothing_and_never_fires_early() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // We are the child; only `crash_child` runs there.
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");

    // Read the child's output on a thread; only whole lines (ending in '\n') count.
    let (first_tx, first_rx) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut ids: Vec<TaskId> = Vec::new();
        let mut partial = 0usize;
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if buf.last() != Some(&b'\n') {
                partial += 1; // Cut by the kill: its schedule may or may not have been printed.
                break;
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end();
            if let Some(pos) = line.find(ID_MARK) {
                let id: TaskId = line[pos + ID_MARK.len()..]
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("bad id line {line:?}: {e}"));
                ids.push(id);
                if ids.len() == 1 {
                    let _ = first_tx.send(());
                }
            }
        }
        (ids, partial)
    });

    // The random moment is counted from the first acknowledged schedule, so that a slow start on
    // a loaded machine does not turn the test into "killed before it did anything".
    first_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("child acknowledged no schedule within 120 s");
    let delay = Duration::from_millis(rand::rng().random_range(200..=1_500));
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the child"); // `Child::kill` sends SIGKILL on Unix.
    let status = child.wait().expect("reap child");
    let (printed, partial) = reader.join().expect("reader thread");
    println!(
        "child killed after {} ms ({status}); {} ids printed, {} cut line(s)",
        delay.as_millis(),
        printed.len(),
        partial
    );
    assert!(
        !printed.is_empty(),
        "the child printed no ids before the kill"
    );
    let unique: HashSet<TaskId> = printed.iter().copied().collect();
    assert_eq!(unique.len(), printed.len(), "the child printed an id twice");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(check_after_restart(dir.path(), unique));
}

async fn check_after_restart(dir: &std::path::Path, printed: HashSet<TaskId>) {
    let sundial = Sundial::builder()
        .config(Config::default())
        .open(dir)
        .await
        .expect("reopen store after kill -9");

    // Every acknowledged task is in the store.
    let mut missing = Vec::new();
    for id in &printed {
        if sundial.get(*id).await.expect("get").is_none() {
            missing.push(*id);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged tasks are missing after kill -9, e.g. {:?}",
        missing.len(),
        printed.len(),
        &missing[..missing.len().min(5)]
    );

    let rec = Arc::new(Recorder::default());
    {
        let rec = rec.clone();
        let clock = sundial.clock().clone();
        sundial.register("crash.record", move |ctx: sundial::TaskContext| {
            let started = clock.now();
            let run = Run {
                execution: ctx.execution_id,
                started,
                due: ctx.task.due_at,
            };
            if let Ok(mut runs) = rec.runs.lock() {
                runs.entry(ctx.task.id).or_default().push(run);
            }
            async move { Ok::<(), sundial::HandlerError>(()) }
        });
    }
    let engine = sundial.start();

    // Bounded real-time wait until every acknowledged task has run. Generous for a loaded machine.
    let all_ran = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let done = rec
                .runs
                .lock()
                .map(|r| printed.iter().filter(|id| r.contains_key(id)).count())
                .unwrap_or(0);
            if done == printed.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    // Let the tasks the child stored but had no time to print run too (they were due within 3 s),
    // so the report covers them; then stop.
    let scheduled_left = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let left: u64 = sundial
                .counts()
                .await
                .expect("counts")
                .iter()
                .filter(|c| !c.state.is_terminal())
                .map(|c| c.count)
                .sum();
            if left == 0 {
                return 0;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or(u64::MAX);
    engine.shutdown(Duration::from_secs(10)).await;

    let runs = rec.runs.lock().expect("runs").clone();
    let not_run: Vec<&TaskId> = printed.iter().filter(|id| !runs.contains_key(id)).collect();
    assert!(
        all_ran.is_ok() && not_run.is_empty(),
        "{} of {} acknowledged tasks did not run within the wait, e.g. {:?}",
        not_run.len(),
        printed.len(),
        &not_run[..not_run.len().min(5)]
    );

    let mut early = Vec::new();
    let mut executions = HashSet::new();
    let mut repeated_executions = 0usize;
    let mut total_runs = 0usize;
    let mut max_late_ms = 0i64;
    for (id, rs) in &runs {
        for r in rs {
            total_runs += 1;
            if r.started < r.due {
                early.push((*id, r.due, r.started));
            }
            max_late_ms = max_late_ms.max(r.started.0 - r.due.0);
            if !executions.insert(r.execution) {
                repeated_executions += 1;
            }
        }
    }
    let unprinted = runs.keys().filter(|id| !printed.contains(id)).count();
    let ran_twice = runs.values().filter(|v| v.len() > 1).count();
    println!(
        "after restart: {} acknowledged tasks all present and run; {} stored-but-unacknowledged \
         tasks also ran; {} runs in total, {} tasks ran more than once, max lateness {} ms, \
         non-terminal left: {}",
        printed.len(),
        unprinted,
        total_runs,
        ran_twice,
        max_late_ms,
        if scheduled_left == u64::MAX {
            "unknown (timed out)".to_string()
        } else {
            scheduled_left.to_string()
        }
    );
    assert!(
        early.is_empty(),
        "{} runs started before their due time, e.g. {:?}",
        early.len(),
        &early[..early.len().min(5)]
    );
    assert_eq!(repeated_executions, 0, "an execution id ran twice");
}
