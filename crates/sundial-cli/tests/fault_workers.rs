//! Fault battery, case `workers`: remote workers that die, stop, crash on a task, or run long, on
//! one `sundial server` (embedded store), with the real `sundial worker` processes (each in a
//! process group of its own, so a kill takes its command too) and, where the CLI worker cannot
//! play the part, the test itself speaking the worker protocol.
//!
//! What it proves (the four run side by side, each on a queue of its own):
//!
//! 1. **killed mid-task**: a worker SIGKILLed while its command runs: the task is offered again
//!    only after the attempt's lease ended, as attempt 2, and succeeds once;
//! 2. **stopped past its lease**: a worker SIGSTOPped while its command runs, past the lease,
//!    then continued: another worker ran attempt 2 meanwhile; the stopped worker's write is
//!    refused with `409` (its log says so); and a completion sent by a protocol worker after its
//!    lease ended gets `409` too; each task succeeds exactly once, with attempt 2's result;
//! 3. **poison task**: the task's command kills its worker every time: the task is claimed
//!    exactly `max_attempts` times (never more), then it is `dead` with the lease-expiry error;
//! 4. **slow but alive**: a protocol worker heartbeats for three times the task's timeout and
//!    then completes: the task is never offered to anyone else meanwhile (a second poller gets
//!    nothing) and succeeds as attempt 1.
//!
//! The sizes are the same in the short and the long form (`SUNDIAL_FAULTS_LONG=1` only repeats
//! the run three times).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{BIN, Server, now_ms, rfc3339_ms};
use sundial_cli::Client;
use sundial_server::wire::{CreateTask, StateView, TaskView};

/// A `sundial worker` process in a process group of its own.
struct Worker {
    child: Option<Child>,
    log: PathBuf,
}

impl Worker {
    fn start(server: &str, queue: &str, log: PathBuf, script: &str) -> Worker {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(BIN)
            .args([
                "worker", "--server", server, "--queue", queue, "--wait", "1s",
            ])
            .args(["--", "sh", "-c", script])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .process_group(0)
            .spawn()
            .expect("start sundial worker");
        Worker {
            child: Some(child),
            log,
        }
    }

    fn pgid(&self) -> i32 {
        i32::try_from(self.child.as_ref().expect("running").id()).unwrap()
    }

    /// Sends `signal` to the worker and its command.
    fn signal_group(&self, signal: i32) {
        // SAFETY: kill(2) on the process group of a child this test started and has not reaped.
        let rc = unsafe { libc::kill(-self.pgid(), signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Sends `signal` to the worker process only (its command keeps running).
    fn signal(&self, signal: i32) {
        // SAFETY: as above, the worker process itself.
        let rc = unsafe { libc::kill(self.pgid(), signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_some(),
            None => true,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: as above.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

async fn create(client: &Client, queue: &str, timeout: &str, max_attempts: u32) -> TaskView {
    client
        .create(&CreateTask {
            queue: Some(queue.into()),
            timeout: Some(timeout.into()),
            max_attempts: Some(max_attempts),
            // Retries at once: the point is when a task is offered again, not the backoff.
            backoff: Some(sundial_server::wire::BackoffSpec {
                initial: Some("1ms".into()),
                max: Some("1ms".into()),
                factor: None,
                jitter: None,
            }),
            ..CreateTask::new("job")
        })
        .await
        .expect("create")
}

async fn get(client: &Client, t: &TaskView) -> TaskView {
    client.get(&t.id.to_string()).await.expect("get")
}

/// Polls the task every 20 ms until `cond` holds (or `within` passes: then panics with `what`).
async fn wait_until(
    client: &Client,
    t: &TaskView,
    within: Duration,
    what: &str,
    cond: impl Fn(&TaskView) -> bool,
) -> TaskView {
    let deadline = now_ms() + within.as_millis() as i64;
    loop {
        let v = get(client, t).await;
        if cond(&v) {
            return v;
        }
        assert!(now_ms() < deadline, "{what}: the task is {v:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn attempts_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.attempts"))
}

fn attempts_seen(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Case 1, a worker killed mid-task. Returns the ms from the lease's end to attempt 2's start.
async fn killed_mid_task(server: &Server, dir: &Path) -> i64 {
    let client = server.client();
    let seen = attempts_file(dir, "killed");
    let t = create(&client, "killed", "2s", 5).await;
    // Attempt 1 hangs (and is killed with its worker); later attempts succeed.
    let script = format!(
        "echo $SUNDIAL_ATTEMPT >> {f}; if [ $SUNDIAL_ATTEMPT = 1 ]; then sleep 30; fi; echo ok",
        f = seen.display()
    );
    let mut a = Worker::start(&server.url, "killed", dir.join("killed-a.log"), &script);
    let running = wait_until(
        &client,
        &t,
        Duration::from_secs(20),
        "attempt 1 runs",
        |v| v.state == StateView::Running && attempts_seen(&seen) == [1],
    )
    .await;
    a.signal_group(libc::SIGKILL);
    let killed_at = now_ms();
    assert!(wait_exit(&mut a).await, "the killed worker is gone");
    // The lease it was last granted (a heartbeat may have extended it just before the kill).
    let lease_end = rfc3339_ms(get(&client, &t).await.lease_expires_at.as_deref().unwrap());
    assert!(lease_end >= rfc3339_ms(running.lease_expires_at.as_deref().unwrap()));
    let _b = Worker::start(&server.url, "killed", dir.join("killed-b.log"), &script);
    let done = wait_until(
        &client,
        &t,
        Duration::from_secs(20),
        "attempt 2 succeeds",
        |v| v.state == StateView::Succeeded,
    )
    .await;
    let started2 = rfc3339_ms(done.started_at.as_deref().unwrap());
    assert_eq!(
        done.attempt, 2,
        "the re-offer counted as attempt 2: {done:?}"
    );
    assert_eq!(attempts_seen(&seen), [1, 2]);
    assert!(
        started2 > lease_end,
        "attempt 2 started at {started2}, before attempt 1's lease ended at {lease_end}"
    );
    assert!(killed_at <= lease_end + 50);
    started2 - lease_end
}

async fn wait_exit(w: &mut Worker) -> bool {
    for _ in 0..250 {
        if w.has_exited() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Case 2, a worker stopped past its lease, then continued. Returns whether the stopped CLI
/// worker was refused, and the late protocol completion's status.
async fn stopped_past_lease(server: &Server, dir: &Path) -> (bool, u16) {
    let client = server.client();
    let seen = attempts_file(dir, "stopped");
    let t = create(&client, "stopped", "1s", 5).await;
    // Each attempt prints its number as its result; attempt 1 after 1.5 s, past its lease while
    // its worker is stopped (the command itself is not, and finishes meanwhile).
    let script = format!(
        "echo $SUNDIAL_ATTEMPT >> {f}; if [ $SUNDIAL_ATTEMPT = 1 ]; then sleep 1.5; fi; \
         echo $SUNDIAL_ATTEMPT",
        f = seen.display()
    );
    let a = Worker::start(&server.url, "stopped", dir.join("stopped-a.log"), &script);
    wait_until(
        &client,
        &t,
        Duration::from_secs(20),
        "attempt 1 runs",
        |v| v.state == StateView::Running && attempts_seen(&seen) == [1],
    )
    .await;
    a.signal(libc::SIGSTOP);
    // Another worker takes attempt 2 once attempt 1's lease is over, and completes it.
    let _b = Worker::start(&server.url, "stopped", dir.join("stopped-b.log"), &script);
    let done = wait_until(
        &client,
        &t,
        Duration::from_secs(20),
        "attempt 2 succeeds",
        |v| v.state == StateView::Succeeded,
    )
    .await;
    a.signal(libc::SIGCONT);
    // The continued worker's next write (a heartbeat or its completion) is refused.
    let deadline = now_ms() + 10_000;
    let refused = loop {
        let log = a.log_text();
        if log.contains("no longer ours") {
            break true;
        }
        if now_ms() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = get(&client, &t).await;
    assert_eq!(after.state, StateView::Succeeded);
    assert_eq!(after.attempt, 2);
    assert_eq!(after.execution_id, done.execution_id, "completed once");
    assert_eq!(
        after.result,
        Some(serde_json::json!(2)),
        "attempt 2's result"
    );

    // The same at the protocol level: a completion sent after the lease ended gets 409.
    let t2 = create(&client, "stopped-protocol", "500ms", 5).await;
    let mut polled = Vec::new();
    for _ in 0..50 {
        polled = client
            .poll("stopped-protocol", "late", 1, Duration::from_secs(1), None)
            .await
            .unwrap()
            .tasks;
        if !polled.is_empty() {
            break;
        }
    }
    let first = polled.pop().expect("polled attempt 1");
    // "Stopped" past the lease; another worker takes and completes attempt 2.
    let mut second = None;
    for _ in 0..50 {
        let p = client
            .poll("stopped-protocol", "other", 1, Duration::from_secs(1), None)
            .await
            .unwrap();
        if let Some(x) = p.tasks.into_iter().next() {
            second = Some(x);
            break;
        }
    }
    let second = second.expect("attempt 2 offered after the lease");
    assert_eq!(second.attempt, 2);
    client
        .complete(
            second.id,
            second.execution_id,
            Some(serde_json::json!("second")),
        )
        .await
        .unwrap();
    let late = client
        .complete(
            first.id,
            first.execution_id,
            Some(serde_json::json!("first")),
        )
        .await
        .expect_err("the stale completion is refused");
    let status = late.status().map_or(0, |s| s.as_u16());
    let v = get(&client, &t2).await;
    assert_eq!(v.result, Some(serde_json::json!("second")));
    (refused, status)
}

/// Case 3, a poison task whose command kills its worker every time. Returns the claims seen and
/// the final error.
async fn poison(server: &Server, dir: &Path) -> (Vec<u32>, String) {
    let client = server.client();
    let seen = attempts_file(dir, "poison");
    let max_attempts = 3;
    let t = create(&client, "poison", "500ms", max_attempts).await;
    // The command kills its own worker (its parent's parent is the worker: sh -c runs it).
    let script = format!(
        "echo $SUNDIAL_ATTEMPT >> {f}; kill -9 $PPID",
        f = seen.display()
    );
    let deadline = now_ms() + 30_000;
    let mut n = 0;
    let dead = loop {
        let v = get(&client, &t).await;
        if v.state == StateView::Dead {
            break v;
        }
        assert!(now_ms() < deadline, "the poison task never died: {v:?}");
        // A worker restarted after each crash, as a supervisor would.
        n += 1;
        let mut w = Worker::start(
            &server.url,
            "poison",
            dir.join(format!("poison-{n}.log")),
            &script,
        );
        let until = now_ms() + 3_000;
        while !w.has_exited() && now_ms() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // Whatever worker is still polling must not get it again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let claims = attempts_seen(&seen);
    assert_eq!(
        claims,
        (1..=max_attempts).collect::<Vec<_>>(),
        "claimed exactly max_attempts times"
    );
    assert_eq!(dead.attempt, max_attempts);
    let error = dead.last_error.clone().unwrap_or_default();
    assert!(error.contains("lease"), "dead with the error: {dead:?}");
    (claims, error)
}

/// Case 4, a slow task that heartbeats for 3× its timeout. Returns the heartbeats and the polls
/// of the other worker (all empty).
async fn slow_but_alive(server: &Server) -> (usize, usize) {
    let client = server.client();
    let t = create(&client, "slow", "1s", 5).await;
    let mut got = Vec::new();
    for _ in 0..50 {
        got = client
            .poll("slow", "slow-worker", 1, Duration::from_secs(1), None)
            .await
            .unwrap()
            .tasks;
        if !got.is_empty() {
            break;
        }
    }
    let task = got.pop().expect("polled");
    assert_eq!(task.id, t.id);
    // Meanwhile another worker polls the queue the whole time.
    let other = server.client();
    let thief = tokio::spawn(async move {
        let mut empty = 0;
        let until = now_ms() + 3_000;
        while now_ms() < until {
            let p = other
                .poll("slow", "thief", 1, Duration::from_millis(300), None)
                .await
                .unwrap();
            assert!(p.tasks.is_empty(), "the slow task was offered again: {p:?}");
            empty += 1;
        }
        empty
    });
    let mut beats = 0;
    let until = now_ms() + 3_000;
    while now_ms() < until {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.heartbeat(task.id, task.execution_id).await.unwrap();
        beats += 1;
    }
    let empty = thief.await.unwrap();
    client
        .complete(task.id, task.execution_id, None)
        .await
        .unwrap();
    let v = get(&client, &t).await;
    assert_eq!(v.state, StateView::Succeeded);
    assert_eq!(v.attempt, 1, "never re-offered");
    (beats, empty)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_die_stop_crash_or_run_long() {
    let runs = if std::env::var("SUNDIAL_FAULTS_LONG").is_ok_and(|v| v == "1") {
        3
    } else {
        1
    };
    for _ in 0..runs {
        let data = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(data.path());
        let (killed, stopped, poisoned, slow) = tokio::join!(
            killed_mid_task(&server, dir.path()),
            stopped_past_lease(&server, dir.path()),
            poison(&server, dir.path()),
            slow_but_alive(&server),
        );
        let (refused, late_status) = stopped;
        assert!(
            refused,
            "the continued worker's write was not refused with 409"
        );
        assert_eq!(late_status, 409, "a completion after the lease gets 409");
        println!(
            "FAULT workers: killed mid-task: attempt 2 started {killed} ms after attempt 1's lease \
             ended; stopped past its lease: the continued worker refused with 409 {refused}, a late \
             completion answered {late_status}, completed once with attempt 2's result; poison: \
             claimed {:?} (max_attempts 3), then dead with {:?}; slow: {} heartbeats over 3x its \
             1 s timeout, {} polls by another worker got nothing, succeeded as attempt 1; ok",
            poisoned.0, poisoned.1, slow.0, slow.1
        );
    }
}
