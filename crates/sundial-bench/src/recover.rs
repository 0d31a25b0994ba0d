//! Recovery after `kill -9`: a child process (this binary, `recover-child`) stores `--tasks` tasks
//! due about two seconds ahead and reports when they are durable; once they are all overdue the
//! parent kills it with SIGKILL, reopens the store, starts the engine with a no-op handler and
//! measures how long until every task has run and its success is recorded.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use sundial::{Clock, Config, TaskSpec, TaskState, Timestamp};

use crate::common::{Common, DataDir, Stopwatch, print_rss, sleep_until};

#[derive(Debug, Clone, Args)]
pub struct RecoverArgs {
    /// Tasks stored by the child, all overdue when the parent reopens the store.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: u64,
    /// How far ahead the child schedules them.
    #[arg(long, default_value_t = 2_000)]
    pub due_in_ms: i64,
    /// Concurrent in-process handler runs after the restart (the engine's per-queue limit).
    #[arg(long, default_value_t = Config::default().default_concurrency)]
    pub concurrency: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub tasks: u64,
    #[arg(long)]
    pub due_in_ms: i64,
}

const KIND: &str = "bench.recover";

/// The child: store the tasks, say so, and wait for the kill.
pub async fn child(common: &Common, args: &ChildArgs) -> Result<()> {
    let sundial = common.open(&args.dir, common.config()).await?;
    let due = Timestamp(sundial.clock().now().0 + args.due_in_ms);
    let mut left = args.tasks as usize;
    while left > 0 {
        let n = left.min(1_000);
        let specs = (0..n)
            .map(|_| TaskSpec::new(KIND).queue("recover").run_at(due))
            .collect();
        sundial.schedule_many(specs).await?;
        left -= n;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "STORED {}", due.0)?;
    out.flush()?;
    drop(out);
    std::future::pending::<()>().await;
    Ok(())
}

pub async fn run(common: &Common, args: &RecoverArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "recover: {} tasks; data dir {}, durability {:?}, shards {}, concurrency {}",
        args.tasks,
        dir.path().display(),
        common.durability,
        common.shards,
        args.concurrency
    );
    crate::common::print_fsync_probe(dir.path())?;
    let exe = std::env::current_exe().context("current exe")?;
    let durability = match common.durability {
        crate::common::DurabilityArg::Full => "full",
        crate::common::DurabilityArg::Normal => "normal",
    };
    let mut child = Command::new(exe)
        .arg("recover-child")
        .arg("--dir")
        .arg(dir.path())
        .args(["--tasks", &args.tasks.to_string()])
        .args(["--due-in-ms", &args.due_in_ms.to_string()])
        .args(["--shards", &common.shards.to_string()])
        .args(["--durability", durability])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawn child")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let watch = Stopwatch::start();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    let Some(due) = line
        .trim()
        .strip_prefix("STORED ")
        .and_then(|t| t.parse::<i64>().ok())
    else {
        let _ = child.kill();
        bail!("child did not report its tasks stored: {line:?}");
    };
    println!(
        "  child stored {} tasks in {:.2}s",
        args.tasks,
        watch.elapsed().as_secs_f64()
    );
    let clock: Arc<dyn Clock> = Arc::new(sundial::SystemClock);
    sleep_until(&clock, Timestamp(due + 100)).await;
    child.kill().context("SIGKILL child")?;
    let status = child.wait()?;
    println!("  child killed ({status}) with every task overdue");

    let watch = Stopwatch::start();
    let config = Config {
        default_concurrency: args.concurrency,
        ..common.config()
    };
    let sundial = common.open(dir.path(), config).await?;
    let opened = watch.elapsed();
    let ran = Arc::new(AtomicU64::new(0));
    {
        let ran = ran.clone();
        sundial.register(KIND, move |_ctx: sundial::TaskContext| {
            ran.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), sundial::HandlerError>(()) }
        });
    }
    let engine = sundial.start();
    let mut all_started = None;
    let mut last_report = 0u64;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = ran.load(Ordering::Relaxed);
        if all_started.is_none() && n >= args.tasks {
            all_started = Some(watch.elapsed());
        }
        if all_started.is_some() {
            let succeeded: u64 = sundial
                .counts()
                .await?
                .iter()
                .filter(|c| c.queue == "recover" && c.state == TaskState::Succeeded)
                .map(|c| c.count)
                .sum();
            if succeeded >= args.tasks {
                break;
            }
        }
        let secs = watch.elapsed().as_secs();
        if secs >= last_report + 5 {
            last_report = secs;
            eprintln!("  [{secs}s] {n} handler runs started");
        }
        if secs > 600 {
            bail!("only {n} of {} ran within 600 s", args.tasks);
        }
    }
    let done = watch.elapsed();
    let started = all_started.unwrap_or(done);
    print_rss("at the end");
    engine.shutdown(Duration::from_secs(5)).await;
    println!(
        "  reopen (open + migrate check): {:.3}s; all {} handler runs started after {:.2}s; all recorded succeeded after {:.2}s = {:.0} tasks/s",
        opened.as_secs_f64(),
        args.tasks,
        started.as_secs_f64(),
        done.as_secs_f64(),
        args.tasks as f64 / done.as_secs_f64()
    );
    Ok(())
}
