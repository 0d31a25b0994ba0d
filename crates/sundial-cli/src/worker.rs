//! `sundial worker --queue Q -- CMD ARGS...`: a ready-made remote worker.
//!
//! It long-polls `Q` for as many tasks as it has free slots (`--concurrency`), and runs `CMD` once
//! per task with the task's JSON (as the poll returned it) on stdin and `SUNDIAL_TASK_ID`,
//! `SUNDIAL_EXECUTION_ID`, `SUNDIAL_ATTEMPT`, `SUNDIAL_TASK_KIND`, `SUNDIAL_QUEUE` in its
//! environment (and, for a traced task, `TRACEPARENT` and `TRACESTATE`: the W3C context of its
//! delivery, which the worker also sends with the complete or fail so that the result joins the
//! task's trace). While the command runs it heartbeats (every third of the task's timeout, between
//! 100 ms and 30 s); when the command exits 0 the task is completed (with stdout as the result:
//! its JSON when it is JSON, else its text), otherwise failed with the tail of stderr, and retried
//! by the server according to the task's backoff. A command still running at the task's timeout is
//! killed and the attempt failed.
//!
//! A `409` on a heartbeat means the attempt no longer owns the task (its lease was lost, or it was
//! cancelled): the command is killed and nothing is reported. On SIGTERM or Ctrl-C the worker stops
//! polling and waits up to `--shutdown-grace` for running commands.

use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sundial_cli::{Client, ClientError};
use sundial_server::wire::PolledTask;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

fn parse_duration(s: &str) -> Result<Duration, String> {
    sundial_server::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    #[command(flatten)]
    credentials: sundial_cli::Credentials,
    #[command(flatten)]
    ns: sundial_cli::connect::NamespaceArg,
    /// The queue to take tasks from.
    #[arg(long, short)]
    queue: String,
    /// Commands run at the same time.
    #[arg(long, short, default_value_t = 1)]
    concurrency: usize,
    /// Only tasks of this kind (repeat for several).
    #[arg(long = "kind")]
    kinds: Vec<String>,
    /// Name recorded on the tasks this worker takes (default `worker-PID`).
    #[arg(long)]
    name: Option<String>,
    /// How long one poll waits for tasks.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    wait: Duration,
    /// Exit after handling this many tasks.
    #[arg(long)]
    max_tasks: Option<u64>,
    /// On SIGTERM or Ctrl-C, how long running commands may take to finish before they are killed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// Bytes of stderr kept for the failure message.
const STDERR_TAIL: usize = 4 * 1024;
/// Bytes of stdout kept for the result.
const STDOUT_TAIL: usize = 64 * 1024;

/// The long help of `sundial worker`: the contract between the worker and its command.
pub const LONG_HELP: &str = "\
The command runs once per task taken from the queue:

stdin        the whole polled task as one JSON object, not only the payload:
             {\"id\", \"queue\", \"kind\", \"key\", \"payload\", \"attempt\", \"max_attempts\",
              \"execution_id\", \"lease_expires_at\", \"run_at\", \"timeout\"}
             (read the payload with e.g. `jq .payload`)
environment  SUNDIAL_TASK_ID, SUNDIAL_EXECUTION_ID, SUNDIAL_ATTEMPT (from 1),
             SUNDIAL_TASK_KIND, SUNDIAL_QUEUE, besides the worker's own environment;
             for a task created with a W3C traceparent, TRACEPARENT (and TRACESTATE): the
             context of its delivery, for the command's own spans. The worker sends it
             with the complete or fail, so the result is recorded in the same trace
exit 0       the task is completed; stdout becomes its result (its JSON if it is JSON, else
             the text; empty stdout is no result). stderr is logged.
exit non-0   the attempt fails with the tail of stderr as the error; the server retries it
             with the task's backoff while attempts remain, then the task is dead
timeout      a command still running at the task's timeout is killed (SIGKILL) and the
             attempt fails
409          the task was cancelled or the lease lost: the command is killed, nothing is
             reported

While a command runs the worker heartbeats every third of the task's timeout. On SIGTERM or
Ctrl-C it stops polling and waits up to --shutdown-grace for running commands, then kills them
(their tasks run again once their leases end).

The worker exits 0 after --max-tasks tasks or a signal, and 1 when the command cannot be
run at all or the server refuses its polls.";

/// Checks at start that `program` can be run: a path must be an executable file, a bare name
/// must be found on `PATH`. Without this a typo would fail every task it takes until each is
/// dead.
fn check_program(program: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let p = std::path::Path::new(program);
        if !p.exists() {
            anyhow::bail!("the command {program:?} does not exist");
        }
        if !executable(p) {
            anyhow::bail!("the command {program:?} is not an executable file (chmod +x?)");
        }
        return Ok(());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|dir| executable(&dir.join(program))) {
        return Ok(());
    }
    anyhow::bail!("the command {program:?} is not found on PATH")
}

pub async fn run(mut args: WorkerArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    if let Some(program) = args.command.first() {
        check_program(program)?;
    }
    let client = Client::with_credentials(&args.server, &args.credentials)
        .context("cannot build the HTTP client")?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let command = Arc::new(args.command.clone());
    let kinds = (!args.kinds.is_empty()).then(|| args.kinds.clone());
    let slots = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let (stop_tx, mut stop) = watch::channel(false);
    tokio::spawn(async move {
        crate::server::wait_for_signal().await;
        let _ = stop_tx.send(true);
    });
    tracing::info!(queue = %args.queue, worker = %name, server = %client.base(), "worker started");

    let mut running: JoinSet<()> = JoinSet::new();
    let mut remaining = args.max_tasks;
    let mut backoff = Duration::from_millis(500);
    loop {
        while running.try_join_next().is_some() {}
        if remaining == Some(0) {
            break;
        }
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => p.context("worker slots closed")?,
            _ = stop.wait_for(|v| *v) => break,
        };
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        if let Some(r) = remaining {
            permits.truncate(usize::try_from(r).unwrap_or(usize::MAX).max(1));
        }
        let poll = client.poll(
            &args.queue,
            &name,
            u32::try_from(permits.len()).unwrap_or(u32::MAX),
            args.wait,
            kinds.clone(),
        );
        let polled = tokio::select! {
            r = poll => r,
            _ = stop.wait_for(|v| *v) => break,
        };
        match polled {
            Ok(resp) => {
                backoff = Duration::from_millis(500);
                for task in resp.tasks {
                    let Some(permit) = permits.pop() else {
                        // The server never hands out more than asked; be safe anyway.
                        tracing::warn!(id = %task.id, "more tasks than slots; running it anyway");
                        tracing::info!(id = %task.id, kind = %task.kind, attempt = task.attempt, "running");
                        running.spawn(run_task(client.clone(), command.clone(), task, None));
                        continue;
                    };
                    if let Some(r) = remaining.as_mut() {
                        *r = r.saturating_sub(1);
                    }
                    tracing::info!(id = %task.id, kind = %task.kind, attempt = task.attempt, "running");
                    running.spawn(run_task(
                        client.clone(),
                        command.clone(),
                        task,
                        Some(permit),
                    ));
                }
            }
            Err(e) => {
                if let Some(status) = e.status()
                    && status.is_client_error()
                {
                    // A request the server refuses (bad queue name, ...) will not get better.
                    return Err(anyhow::anyhow!("the server refused the poll: {e}"));
                }
                tracing::warn!(error = %e, retry_in = ?backoff, "poll failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|v| *v) => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }

    if !running.is_empty() {
        tracing::info!(
            running = running.len(),
            "waiting for running commands to finish"
        );
    }
    let drained = tokio::time::timeout(args.shutdown_grace, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "commands still running after the grace period; killing them (their tasks will be retried)"
        );
        running.abort_all();
        while running.join_next().await.is_some() {}
    }
    tracing::info!("worker stopped");
    Ok(ExitCode::SUCCESS)
}

enum Outcome {
    Exited(std::io::Result<ExitStatus>),
    TimedOut(Duration),
    Lost,
}

async fn run_task(
    client: Client,
    command: Arc<Vec<String>>,
    task: PolledTask,
    permit: Option<OwnedSemaphorePermit>,
) {
    let _permit = permit;
    let id = task.id;
    let execution = task.execution_id;
    let timeout = parse_duration(&task.timeout).unwrap_or(Duration::from_secs(300));
    let Some((program, args)) = command.split_first() else {
        return;
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("SUNDIAL_TASK_ID", id.to_string())
        .env("SUNDIAL_EXECUTION_ID", execution.to_string())
        .env("SUNDIAL_ATTEMPT", task.attempt.to_string())
        .env("SUNDIAL_TASK_KIND", &task.kind)
        .env("SUNDIAL_QUEUE", &task.queue);
    // The names OpenTelemetry gives trace context carried in the environment. A worker run from
    // a traced process must not hand that process's context to an untraced task.
    for (name, value) in [
        ("TRACEPARENT", &task.traceparent),
        ("TRACESTATE", &task.tracestate),
    ] {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let spawned = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            report_failure(&client, &task, format!("cannot start {program:?}: {e}")).await;
            return;
        }
    };
    let input = serde_json::to_vec(&task).unwrap_or_default();
    if let Some(mut stdin) = child.stdin.take() {
        tokio::spawn(async move {
            // A command that does not read its stdin is fine: ignore a broken pipe.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        });
    }
    let stdout = child
        .stdout
        .take()
        .map(|o| tokio::spawn(read_tail(o, STDOUT_TAIL)));
    let stderr = child
        .stderr
        .take()
        .map(|e| tokio::spawn(read_tail(e, STDERR_TAIL)));

    let every = (timeout / 3).clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut heartbeat = tokio::time::interval(every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.tick().await; // the first tick is immediate
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let outcome = loop {
        tokio::select! {
            status = child.wait() => break Outcome::Exited(status),
            _ = heartbeat.tick() => match client.heartbeat(id, execution).await {
                Ok(_) => {}
                Err(e) if e.is_conflict() || e.is_not_found() => {
                    tracing::warn!(%id, error = %e, "the task is no longer ours; stopping the command");
                    let _ = child.kill().await;
                    break Outcome::Lost;
                }
                Err(e) => tracing::warn!(%id, error = %e, "heartbeat failed"),
            },
            _ = &mut deadline => {
                let _ = child.kill().await;
                break Outcome::TimedOut(timeout);
            }
        }
    };
    let out = collect(stdout).await;
    let err = collect(stderr).await;
    match outcome {
        Outcome::Lost => {}
        Outcome::Exited(Ok(status)) if status.success() => {
            let said = String::from_utf8_lossy(&err);
            let said = said.trim();
            if !said.is_empty() {
                tracing::info!(%id, stderr = %said, "the command wrote to stderr");
            }
            let text = String::from_utf8_lossy(&out);
            let trimmed = text.trim();
            let result = if trimmed.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_str(trimmed)
                        .unwrap_or_else(|_| serde_json::Value::String(trimmed.to_string())),
                )
            };
            report(id, "complete", || {
                client.complete_in_trace(id, execution, result.clone(), task.traceparent.as_deref())
            })
            .await;
        }
        Outcome::Exited(Ok(status)) => {
            let how = match status.code() {
                Some(c) => format!("exit code {c}"),
                None => format!("{status}"),
            };
            let tail = String::from_utf8_lossy(&err).trim().to_string();
            let msg = if tail.is_empty() {
                format!("command failed with {how}")
            } else {
                format!("command failed with {how}: {tail}")
            };
            report_failure(&client, &task, msg).await;
        }
        Outcome::Exited(Err(e)) => {
            report_failure(&client, &task, format!("cannot wait for the command: {e}")).await;
        }
        Outcome::TimedOut(t) => {
            report_failure(
                &client,
                &task,
                format!(
                    "command killed after the task's timeout of {}",
                    sundial_server::duration::format(t)
                ),
            )
            .await;
        }
    }
}

async fn report_failure(client: &Client, task: &PolledTask, message: String) {
    tracing::warn!(id = %task.id, error = %message, "attempt failed");
    let (id, execution) = (task.id, task.execution_id);
    report(id, "fail", || {
        client.fail_in_trace(
            id,
            execution,
            message.clone(),
            true,
            task.traceparent.as_deref(),
        )
    })
    .await;
}

/// Sends a result, retrying transport errors a few times; a `409` means the attempt lost the
/// task (nothing to do).
async fn report<F, Fut>(id: uuid::Uuid, what: &str, send: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<sundial_server::wire::TaskView, ClientError>>,
{
    let mut wait = Duration::from_millis(200);
    for attempt in 1..=5 {
        match send().await {
            Ok(t) => {
                tracing::info!(%id, state = t.state.as_str(), "{what} recorded");
                return;
            }
            Err(e) if e.is_conflict() || e.is_not_found() => {
                tracing::warn!(%id, error = %e, "{what} not recorded: the task is no longer ours");
                return;
            }
            Err(e) if e.status().is_some() => {
                tracing::error!(%id, error = %e, "{what} refused");
                return;
            }
            Err(e) => {
                tracing::warn!(%id, error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
    tracing::error!(%id, "{what} could not be sent; the lease will expire and the task run again");
}

async fn collect(reader: Option<tokio::task::JoinHandle<Vec<u8>>>) -> Vec<u8> {
    let Some(h) = reader else {
        return Vec::new();
    };
    // A grandchild may keep the pipe open after the command exits: do not wait for it long.
    match tokio::time::timeout(Duration::from_secs(2), h).await {
        Ok(Ok(v)) => v,
        _ => Vec::new(),
    }
}

/// Reads `r` to the end, keeping only the last `max` bytes.
async fn read_tail(mut r: impl AsyncRead + Unpin, max: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > 2 * max {
                    buf.drain(..buf.len() - max);
                }
            }
        }
    }
    if buf.len() > max {
        buf.drain(..buf.len() - max);
    }
    buf
}
