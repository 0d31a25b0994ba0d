//! `sundial-bench workflows`: durable workflows on the embedded store with the real clock.
//!
//! Three measurements, each printed as a distribution:
//!
//! - **starts and steps**: `--starts` workflows of type `steps`, each running `--steps` no-op
//!   activities one after the other, started by `--callers` concurrent callers. It reports the
//!   start calls' latency and rate (a start is durable before it returns: run row, first event,
//!   first workflow task), then how long until every workflow completed, as workflows/s and
//!   steps/s (one step = one activity scheduled, run and its result recorded, plus the workflow
//!   task that reacts to it).
//! - **replay cost against history length**: one workflow of type `wide` per length, running
//!   rounds of (up to 10) parallel activities until its history holds about that many events; then the whole
//!   recorded history is loaded from the store and replayed `--replays` times each, as every
//!   workflow task of that run does, and both times are reported per length (replay also per event).
//! - **one long workflow**: `--long` sequential activities in one run, timed per tenth of its
//!   steps, so a step that gets dearer as the history grows shows (`--history-cache-events 0`
//!   turns the runtime's history cache off for comparison).
//! - **memory while asleep**: `--asleep` workflows of type `sleeper` each start a 30-day durable
//!   sleep. Once all are asleep this process shuts down, and a fresh process (this binary,
//!   `workflows-asleep-child`) opens the same store with the workflow runtime registered, starts
//!   the engine and reports its memory and what is in flight: the sleepers are rows, not memory.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::future::join_all;
use serde_json::json;
use sundial::{Sundial, TaskState};
use sundial_store::{ACTIVITY_QUEUE, WORKFLOW_QUEUE};
use sundial_workflow::{
    ActivityError, StartWorkflow, WorkflowConfig, WorkflowContext, WorkflowError, WorkflowFilter,
    WorkflowStatus, Workflows,
};

use crate::common::{Common, DataDir, Stopwatch, histogram, print_rss, summary};

#[derive(Debug, Args)]
pub struct WorkflowsArgs {
    /// Workflows started for the starts/steps measurement (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub starts: u64,
    /// Activities each of those workflows runs, one after the other.
    #[arg(long, default_value_t = 3)]
    pub steps: u32,
    /// Concurrent callers starting workflows.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Concurrent in-process workflow tasks and activities (per queue).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// History lengths (events) to measure replay at, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    pub replay_lengths: Vec<u64>,
    /// Replays timed per history length (0 skips the replay measurement).
    #[arg(long, default_value_t = 50)]
    pub replays: u32,
    /// Sequential activities of the one long workflow (0 skips it): how a workflow task's cost
    /// grows with its history.
    #[arg(long, default_value_t = 2_000)]
    pub long: u32,
    /// Workflows put to sleep for 30 days for the memory measurement (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    pub asleep: u64,
    /// History events the runtime keeps decoded between workflow tasks (0: read the whole
    /// history from the store for every workflow task).
    #[arg(long, default_value_t = WorkflowConfig::default().history_cache_events)]
    pub history_cache_events: usize,
}

#[derive(Debug, Clone, Args)]
pub struct AsleepChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// Seconds to run before reporting.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
}

const STEPS: &str = "steps";
const WIDE: &str = "wide";
const SLEEPER: &str = "sleeper";
const NOOP: &str = "noop";
const THIRTY_DAYS: Duration = Duration::from_secs(30 * 86_400);

async fn steps(ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
    let mut sum = 0u32;
    for i in 0..n {
        let v: u32 = ctx.activity(NOOP, &i).await?;
        sum = sum.wrapping_add(v);
    }
    Ok(sum)
}

/// `[rounds, width]`: `rounds` times, `width` activities in parallel.
async fn wide(ctx: WorkflowContext, shape: (u32, u32)) -> Result<u32, WorkflowError> {
    let (rounds, width) = shape;
    let mut sum = 0u32;
    for _ in 0..rounds {
        let calls = (0..width).map(|i| ctx.activity::<_, u32>(NOOP, &i));
        for v in join_all(calls).await {
            sum = sum.wrapping_add(v?);
        }
    }
    Ok(sum)
}

async fn sleeper(ctx: WorkflowContext, _input: serde_json::Value) -> Result<(), WorkflowError> {
    ctx.sleep(THIRTY_DAYS).await?;
    Ok(())
}

/// Registers the benchmark's workflows and its one activity; `steps_done` counts activity runs.
fn register(workflows: &Workflows, steps_done: Arc<AtomicU64>) -> Result<()> {
    workflows.register(STEPS, steps)?;
    workflows.register(WIDE, wide)?;
    workflows.register(SLEEPER, sleeper)?;
    workflows.register_activity(NOOP, move |_ctx, i: u32| {
        steps_done.fetch_add(1, Ordering::Relaxed);
        async move { Ok::<u32, ActivityError>(i) }
    })?;
    Ok(())
}

fn config(common: &Common, concurrency: usize) -> sundial::Config {
    let mut config = common.config();
    for q in [WORKFLOW_QUEUE, ACTIVITY_QUEUE] {
        config.queue_concurrency.insert(q.to_string(), concurrency);
    }
    config
}

/// Kernel tasks of the workflow and activity queues: `(scheduled, ready or running)`. Durable
/// timers are scheduled tasks of the workflow queue, so a workflow asleep counts as scheduled.
async fn workflow_queue_tasks(sundial: &Sundial) -> Result<(u64, u64)> {
    let (mut scheduled, mut active) = (0, 0);
    for c in sundial.counts().await? {
        if c.queue != WORKFLOW_QUEUE && c.queue != ACTIVITY_QUEUE {
            continue;
        }
        match c.state {
            TaskState::Scheduled => scheduled += c.count,
            TaskState::Ready | TaskState::Running => active += c.count,
            _ => {}
        }
    }
    Ok((scheduled, active))
}

/// How many workflows of `workflow_type` have `status` (pages through the list).
async fn count_status(
    workflows: &Workflows,
    workflow_type: &str,
    status: WorkflowStatus,
) -> Result<u64> {
    let filter = WorkflowFilter {
        workflow_type: Some(workflow_type.to_string()),
        status: Some(status),
        ..WorkflowFilter::default()
    };
    let mut n = 0u64;
    let mut after: Option<String> = None;
    loop {
        let page = workflows.list(&filter, after.as_deref(), 1_000).await?;
        n += page.runs.len() as u64;
        match page.next_cursor {
            Some(c) => after = Some(c),
            None => return Ok(n),
        }
    }
}

/// Starts `count` workflows from `callers` callers; returns the start latency histogram (µs)
/// and the wall time of the whole phase.
async fn start_many(
    workflows: &Workflows,
    count: u64,
    callers: usize,
    workflow_type: &'static str,
    prefix: &'static str,
    input: serde_json::Value,
) -> Result<(hdrhistogram::Histogram<u64>, Duration)> {
    let latency = Arc::new(Mutex::new(histogram()));
    let next = Arc::new(AtomicU64::new(0));
    let sw = Stopwatch::start();
    let mut tasks = Vec::new();
    for _ in 0..callers.max(1) {
        let (workflows, next, latency, input) = (
            workflows.clone(),
            next.clone(),
            latency.clone(),
            input.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let call = Stopwatch::start();
                workflows
                    .start(
                        StartWorkflow::new(workflow_type, input.clone())
                            .id(format!("{prefix}{i:07}")),
                    )
                    .await?;
                if let Ok(mut h) = latency.lock() {
                    h.saturating_record(call.elapsed().as_micros() as u64);
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = sw.elapsed();
    let h = latency
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| histogram());
    Ok((h, took))
}

/// Waits (bounded) until the workflow and activity queues hold exactly `timers` scheduled tasks
/// (the durable timers of sleeping workflows) and nothing ready or running: every workflow has
/// finished or is asleep.
async fn drain(sundial: &Sundial, timers: u64, limit: Duration) -> Result<Duration> {
    let sw = Stopwatch::start();
    loop {
        if workflow_queue_tasks(sundial).await? == (timers, 0) {
            return Ok(sw.elapsed());
        }
        if sw.elapsed() > limit {
            bail!("workflows did not finish within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn run(common: &Common, args: &WorkflowsArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "workflows: data dir {}, durability {:?}, shards {}, concurrency {} per queue",
        dir.path().display(),
        common.durability,
        common.shards,
        args.concurrency
    );
    crate::common::print_fsync_probe(dir.path())?;
    let sundial = common
        .open(dir.path(), config(common, args.concurrency))
        .await?;
    let workflows = Workflows::attach_with(
        &sundial,
        WorkflowConfig {
            history_cache_events: args.history_cache_events,
            ..WorkflowConfig::default()
        },
    )
    .context("attach workflows")?;
    let steps_done = Arc::new(AtomicU64::new(0));
    register(&workflows, steps_done.clone())?;
    let running = sundial.start();

    if args.starts > 0 {
        starts_and_steps(&sundial, &workflows, args, &steps_done).await?;
    }
    if args.long > 0 {
        long_run(&sundial, &workflows, args, &steps_done).await?;
    }
    if args.replays > 0 && !args.replay_lengths.is_empty() {
        replay_cost(&sundial, &workflows, args).await?;
    }
    let asleep = args.asleep > 0;
    if asleep {
        put_to_sleep(&sundial, &workflows, args).await?;
    }
    running.shutdown(Duration::from_secs(10)).await;
    drop(workflows);
    drop(sundial);
    if asleep {
        asleep_in_fresh_process(common, &dir, args.asleep)?;
    }
    Ok(())
}

async fn starts_and_steps(
    sundial: &Sundial,
    workflows: &Workflows,
    args: &WorkflowsArgs,
    steps_done: &AtomicU64,
) -> Result<()> {
    println!(
        "  starts: {} workflows of {} sequential activities, {} callers",
        args.starts, args.steps, args.callers
    );
    let before = steps_done.load(Ordering::Relaxed);
    let sw = Stopwatch::start();
    let (h, took) = start_many(
        workflows,
        args.starts,
        args.callers,
        STEPS,
        "steps-",
        json!(args.steps),
    )
    .await?;
    println!(
        "    start calls: {:.0} starts/s ({} in {:.2}s); latency {}",
        args.starts as f64 / took.as_secs_f64(),
        args.starts,
        took.as_secs_f64(),
        summary(&h, "ms", 1_000.0)
    );
    drain(sundial, 0, Duration::from_secs(1_800)).await?;
    let total = sw.elapsed();
    let completed = count_status(workflows, STEPS, WorkflowStatus::Completed).await?;
    let steps = steps_done.load(Ordering::Relaxed) - before;
    println!(
        "    all done {:.2}s after the first start: {completed} completed ({:.0} workflows/s), {steps} activity runs ({:.0} steps/s)",
        total.as_secs_f64(),
        completed as f64 / total.as_secs_f64(),
        steps as f64 / total.as_secs_f64(),
    );
    if completed != args.starts {
        bail!("{completed} of {} workflows completed", args.starts);
    }
    print_rss("after starts and steps");
    Ok(())
}

async fn long_run(
    sundial: &Sundial,
    workflows: &Workflows,
    args: &WorkflowsArgs,
    steps_done: &AtomicU64,
) -> Result<()> {
    println!(
        "  long: one workflow of {} sequential activities (history cache {} events)",
        args.long, args.history_cache_events
    );
    let before = steps_done.load(Ordering::Relaxed);
    let sw = Stopwatch::start();
    workflows
        .start(StartWorkflow::new(STEPS, json!(args.long)).id("long"))
        .await?;
    // The time of every 10% of the steps, to show whether a step gets dearer as the history grows.
    let tenth = u64::from(args.long).div_ceil(10).max(1);
    let mut marks = Vec::new();
    loop {
        let done = steps_done.load(Ordering::Relaxed) - before;
        while marks.len() < 10 && done >= tenth * (marks.len() as u64 + 1) {
            marks.push(sw.elapsed());
        }
        if workflow_queue_tasks(sundial).await? == (0, 0) && done >= u64::from(args.long) {
            break;
        }
        if sw.elapsed() > Duration::from_secs(1_800) {
            bail!("the long workflow did not finish within 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let total = sw.elapsed();
    let run = workflows.get("long").await?.context("long run")?;
    if run.status != WorkflowStatus::Completed {
        bail!("long: {:?} ({:?})", run.status, run.error);
    }
    let per_step = |i: usize| {
        let start = if i == 0 { Duration::ZERO } else { marks[i - 1] };
        (marks[i].saturating_sub(start)).as_secs_f64() * 1e3 / tenth as f64
    };
    if marks.len() == 10 {
        println!(
            "    {:.2}s, {:.0} steps/s, {} events; ms per step in the first tenth {:.2}, in the last tenth {:.2} ({:.2}x)",
            total.as_secs_f64(),
            f64::from(args.long) / total.as_secs_f64(),
            run.history_len,
            per_step(0),
            per_step(9),
            per_step(9) / per_step(0).max(1e-9)
        );
    }
    Ok(())
}

async fn replay_cost(sundial: &Sundial, workflows: &Workflows, args: &WorkflowsArgs) -> Result<()> {
    println!(
        "  replay: whole recorded histories, {} replays each",
        args.replays
    );
    let mut rows = BTreeMap::new();
    for &target in &args.replay_lengths {
        // Rounds of up to 10 parallel activities; a short history gets one narrow round.
        let width = (target.saturating_sub(3) / 2).clamp(1, 10);
        let rounds = (target.saturating_sub(3) / (1 + 2 * width)).max(1);
        let id = format!("wide-{target}");
        workflows
            .start(StartWorkflow::new(WIDE, json!([rounds, width])).id(id.clone()))
            .await?;
        drain(sundial, 0, Duration::from_secs(1_800)).await?;
        let run = workflows.get(&id).await?.context("wide run")?;
        if run.status != WorkflowStatus::Completed {
            bail!("{id}: {:?} ({:?})", run.status, run.error);
        }
        let mut load = histogram();
        for _ in 0..args.replays {
            let sw = Stopwatch::start();
            workflows.history(run.run_id).await?;
            load.saturating_record(sw.elapsed().as_nanos().max(1) as u64);
        }
        let history = workflows.history(run.run_id).await?;
        let now = history
            .last()
            .map(|e| e.at)
            .unwrap_or(sundial::Timestamp(0));
        let mut h = histogram();
        for _ in 0..args.replays {
            let sw = Stopwatch::start();
            let out = workflows.replay(&run, &history, now)?;
            h.saturating_record(sw.elapsed().as_nanos().max(1) as u64);
            if !out.finished || !out.new_commands.is_empty() {
                bail!("{id}: replay of the complete history did not finish cleanly");
            }
        }
        let events = history.len() as u64;
        println!(
            "    {events} events ({rounds} rounds × {width} activities): replay {}; {:.2} µs/event at p50",
            summary(&h, "µs", 1_000.0),
            h.value_at_quantile(0.5) as f64 / 1_000.0 / events as f64,
        );
        println!(
            "    {events} events: loading the history from the store {}",
            summary(&load, "µs", 1_000.0)
        );
        rows.insert(events, h.value_at_quantile(0.5));
    }
    // Replay time per event at the shortest and the longest history: equal means linear.
    if let (Some((&e0, &t0)), Some((&e1, &t1))) = (rows.first_key_value(), rows.last_key_value())
        && e1 > e0
    {
        let (p0, p1) = (t0 as f64 / e0 as f64, t1 as f64 / e1 as f64);
        println!(
            "    per event at p50: {:.3} µs at {e0} events, {:.3} µs at {e1} events ({:.0}x the events, {:.2}x the cost per event)",
            p0 / 1_000.0,
            p1 / 1_000.0,
            e1 as f64 / e0 as f64,
            p1 / p0
        );
    }
    Ok(())
}

async fn put_to_sleep(
    sundial: &Sundial,
    workflows: &Workflows,
    args: &WorkflowsArgs,
) -> Result<()> {
    println!("  asleep: {} workflows each sleeping 30 days", args.asleep);
    let sw = Stopwatch::start();
    let (h, took) = start_many(
        workflows,
        args.asleep,
        args.callers,
        SLEEPER,
        "sleeper-",
        json!(null),
    )
    .await?;
    println!(
        "    start calls: {:.0} starts/s; latency {}",
        args.asleep as f64 / took.as_secs_f64(),
        summary(&h, "ms", 1_000.0)
    );
    // Asleep = no workflow task left; every run waits on its timer row.
    drain(sundial, args.asleep, Duration::from_secs(1_800)).await?;
    println!(
        "    all {} asleep {:.1}s after the first start",
        args.asleep,
        sw.elapsed().as_secs_f64()
    );
    print_rss("in the process that started them");
    Ok(())
}

/// Runs the child on the same data directory and prints what it reports.
fn asleep_in_fresh_process(common: &Common, dir: &DataDir, expect: u64) -> Result<()> {
    let exe = std::env::current_exe().context("current exe")?;
    let durability = match common.durability {
        crate::common::DurabilityArg::Full => "full",
        crate::common::DurabilityArg::Normal => "normal",
    };
    let mut child = Command::new(exe)
        .arg("--shards")
        .arg(common.shards.to_string())
        .arg("--durability")
        .arg(durability)
        .arg("workflows-asleep-child")
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawn the asleep child")?;
    let out = child.stdout.take().context("child stdout")?;
    let mut timers = None;
    for line in BufReader::new(out).lines() {
        let line = line?;
        println!("    fresh process: {line}");
        if let Some(n) = line.strip_prefix("timers scheduled: ") {
            timers = n
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok());
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("asleep child failed: {status}");
    }
    if timers.is_none_or(|n| n < expect) {
        bail!("the fresh process found {timers:?} timers, expected at least {expect}");
    }
    Ok(())
}

/// The fresh process: open the store, register the runtime, start the engine, run `secs`, report.
pub async fn asleep_child(common: &Common, args: &AsleepChildArgs) -> Result<()> {
    let sw = Stopwatch::start();
    let sundial = common.open(&args.dir, config(common, 256)).await?;
    let workflows = Workflows::attach(&sundial).context("attach workflows")?;
    register(&workflows, Arc::new(AtomicU64::new(0)))?;
    let running = sundial.start();
    println!(
        "opened and started in {:.0} ms",
        sw.elapsed().as_secs_f64() * 1e3
    );
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    let (timers, active) = workflow_queue_tasks(&sundial).await?;
    let running_runs = count_status(&workflows, SLEEPER, WorkflowStatus::Running).await?;
    println!(
        "timers scheduled: {timers}; sleeper runs running: {running_runs}; in flight: {}; workflow tasks and activities ready or running: {active}",
        sundial.in_flight(),
    );
    print_rss(&format!("after {} s with the engine running", args.secs));
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
