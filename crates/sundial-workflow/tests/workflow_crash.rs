//! Crash test: a child process runs workflows (activities, durable sleeps, signals with timeouts)
//! and is killed with SIGKILL at random moments, again and again; a last child runs until every
//! workflow has completed. Then the parent checks that
//!
//! - every workflow completed with the result its input determines, and
//! - no activity step ran again once its completion had been recorded: for every step, the
//!   execution whose result the history holds is the last execution of that step that started
//!   (activities append `START <workflow> <step> <execution>` to a log before doing anything).
//!
//! The child is this same test binary, re-executed with `SUNDIAL_WF_CRASH_CHILD` set (as in the
//! engine's crash test). Both use the real clock; timeouts and leases are short so that work a
//! killed child left running is recovered within seconds. `SUNDIAL_WF_CRASH_N` sets the number
//! of workflows (default 200) and `SUNDIAL_WF_CRASH_KILLS` the number of kills (default 6).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sundial::{Config, Sundial};
use sundial_workflow::{
    ActivityError, Event, IdReusePolicy, RetryPolicy, StartWorkflow, WorkflowConfig,
    WorkflowContext, WorkflowError, WorkflowFilter, WorkflowStatus, Workflows,
};

const CHILD_ENV: &str = "SUNDIAL_WF_CRASH_CHILD";
const READY: &str = "SUNDIAL-WF-READY";
const ALL_DONE: &str = "SUNDIAL-WF-ALL-COMPLETED";

fn count() -> u64 {
    std::env::var("SUNDIAL_WF_CRASH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn kills() -> usize {
    std::env::var("SUNDIAL_WF_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Out {
    value: u64,
    exec: String,
}

/// Even workflows get a `bump` signal (and wait an hour for it); odd ones never do (and give up
/// after 300 ms). Result: `(10n + 1) + (10n + 2) + (n if even)`.
async fn crash_wf(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    let a: Out = ctx
        .activity("step", &(n, 1))
        .timeout(Duration::from_secs(2))
        .retry(RetryPolicy::fixed(20, Duration::from_millis(100)))
        .await?;
    ctx.sleep(Duration::from_millis(200 + (n % 5) * 100))
        .await?;
    let wait = if n.is_multiple_of(2) {
        Duration::from_secs(3600)
    } else {
        Duration::from_millis(300)
    };
    let bump = ctx.signal::<u64>("bump").timeout(wait).await?;
    let b: Out = ctx
        .activity("step", &(n, 2))
        .timeout(Duration::from_secs(2))
        .retry(RetryPolicy::fixed(20, Duration::from_millis(100)))
        .await?;
    Ok(a.value + b.value + bump.unwrap_or(0))
}

fn expected(n: u64) -> u64 {
    (10 * n + 1) + (10 * n + 2) + if n.is_multiple_of(2) { n } else { 0 }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("\n{line}\n").as_bytes());
    let _ = out.flush();
}

async fn open(dir: &Path) -> (Sundial, Workflows) {
    let config = Config {
        lease_grace: Duration::from_millis(500),
        idle_interval: Duration::from_secs(2),
        ..Config::default()
    };
    let sundial = Sundial::builder().config(config).open(dir).await.unwrap();
    let workflows = Workflows::attach_with(
        &sundial,
        WorkflowConfig {
            workflow_task_timeout: Duration::from_secs(3),
            ..WorkflowConfig::default()
        },
    )
    .unwrap();
    (sundial, workflows)
}

/// The child's body: runs only when re-executed by [`kill9_workflows_complete_exactly`].
#[test]
fn workflow_crash_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (sundial, workflows) = open(&dir).await;
        workflows.register("crash", crash_wf).unwrap();
        let log_path = dir.join("activities.log");
        workflows
            .register_activity("step", move |ctx, (n, step): (u64, u64)| {
                let log_path = log_path.clone();
                async move {
                    let exec = ctx.execution_id().to_string();
                    let line = format!("START w{n} {step} {exec}\n");
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log_path)
                        .map_err(|e| ActivityError::retryable(e.to_string()))?;
                    f.write_all(line.as_bytes())
                        .map_err(|e| ActivityError::retryable(e.to_string()))?;
                    let pause = rand::rng().random_range(0..30);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    Ok::<_, ActivityError>(Out {
                        value: 10 * n + step,
                        exec,
                    })
                }
            })
            .unwrap();
        let _running = sundial.start();
        emit(READY);
        let n = count();
        for i in 0..n {
            let id = format!("w{i}");
            match workflows
                .start(
                    StartWorkflow::new("crash", json!(i))
                        .id(&id)
                        .id_reuse(IdReusePolicy::RejectDuplicate),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_conflict() => {}
                Err(e) => panic!("start {id}: {e}"),
            }
            if i.is_multiple_of(2) {
                let run = workflows.get(&id).await.unwrap().unwrap();
                let history = workflows.history(run.run_id).await.unwrap();
                let signalled = history
                    .iter()
                    .any(|e| matches!(e.event, Event::SignalReceived { .. }));
                if !signalled && !run.status.is_closed() {
                    workflows.signal(&id, "bump", json!(i)).await.unwrap();
                }
            }
        }
        loop {
            let done = completed(&workflows).await;
            if done == n as usize {
                emit(ALL_DONE);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        std::future::pending::<()>().await;
    });
}

async fn completed(workflows: &Workflows) -> usize {
    let filter = WorkflowFilter {
        status: Some(WorkflowStatus::Completed),
        ..WorkflowFilter::default()
    };
    let mut n = 0;
    let mut after: Option<String> = None;
    loop {
        let page = workflows
            .list(&filter, after.as_deref(), 1_000)
            .await
            .unwrap();
        n += page.runs.len();
        match page.next_cursor {
            Some(c) => after = Some(c),
            None => return n,
        }
    }
}

/// Spawns the child and waits for its engine to be up.
fn spawn(dir: &Path) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "workflow_crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

#[allow(clippy::disallowed_methods)] // real-time deadline for a real child process
fn wait_for(rx: &std::sync::mpsc::Receiver<String>, mark: &str, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.trim() == mark => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // real-time deadlines for a real child process
fn kill9_workflows_complete_exactly() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rng();
    for round in 0..kills() {
        let (mut child, rx) = spawn(dir.path());
        assert!(
            wait_for(&rx, READY, Duration::from_secs(60)),
            "round {round}: child did not start"
        );
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1_500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let (mut child, rx) = spawn(dir.path());
    let finished = wait_for(&rx, ALL_DONE, Duration::from_secs(240));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(finished, "the last child did not complete every workflow");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_sundial, workflows) = open(dir.path()).await;
        // The execution whose result each step's history recorded.
        let mut recorded: HashMap<(String, u64), String> = HashMap::new();
        for n in 0..count() {
            let id = format!("w{n}");
            let run = workflows.get(&id).await.unwrap().unwrap();
            assert_eq!(run.status, WorkflowStatus::Completed, "{id}: {run:?}");
            let result: u64 = serde_json::from_str(run.result.as_deref().unwrap()).unwrap();
            assert_eq!(result, expected(n), "{id}");
            let history = workflows.history(run.run_id).await.unwrap();
            let mut step_of_cmd = HashMap::new();
            for e in &history {
                match &e.event {
                    Event::ActivityScheduled { cmd, input, .. } => {
                        step_of_cmd.insert(*cmd, input[1].as_u64().unwrap());
                    }
                    Event::ActivityCompleted { cmd, result } => {
                        let out: Out = serde_json::from_value(result.clone()).unwrap();
                        let step = step_of_cmd[cmd];
                        assert!(
                            recorded.insert((id.clone(), step), out.exec).is_none(),
                            "{id} step {step} completed twice"
                        );
                    }
                    _ => {}
                }
            }
        }
        // The last start of every step is the recorded one.
        let log = std::fs::read_to_string(dir.path().join("activities.log")).unwrap();
        let mut last: HashMap<(String, u64), String> = HashMap::new();
        let mut starts = 0;
        for line in log.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if parts.len() != 4 || parts[0] != "START" {
                continue;
            }
            starts += 1;
            last.insert(
                (parts[1].to_string(), parts[2].parse().unwrap()),
                parts[3].to_string(),
            );
        }
        assert_eq!(recorded.len(), 2 * count() as usize);
        for (step, exec) in &recorded {
            assert_eq!(
                last.get(step),
                Some(exec),
                "step {step:?} started again after its completion was recorded"
            );
        }
        eprintln!(
            "{} workflows, {} kills: {} activity starts for {} steps",
            count(),
            kills(),
            starts,
            recorded.len()
        );
    });
}
