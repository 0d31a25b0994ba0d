//! `sundial-bench`: measures Sundial's kernel on the embedded store with the real system clock.
//!
//! ```text
//! sundial-bench schedule   # durable schedules/s, one per call (64 callers) and batched
//! sundial-bench fire       # fire lateness at 5,000 tasks/s with 1,000,000 pending; memory
//! sundial-bench idle       # store reads per minute per shard while idle with 1,000,000 pending
//! sundial-bench recover    # seconds from reopening after kill -9 until 100,000 overdue tasks ran
//! sundial-bench schedules  # 100,000 schedules firing every minute: fires/s, lateness, memory
//! sundial-bench workflows  # workflow starts/s, steps/s, replay cost, memory with 100,000 asleep
//! sundial-bench retention  # 1,000 tasks/s for 10 min with a 1-minute retention: size every 30 s
//! sundial-bench list       # filtered list pages with 10,000,000 tasks stored: latency per filter
//! sundial-bench ui         # every web UI page's latency with 1,000,000 tasks and 10,000 schedules
//! sundial-bench push       # push calls to loopback sinks: lateness at 2,000/s, calls/s, a slow receiver
//! ```
//!
//! Build in release (`cargo build --release -p sundial-bench`); `bench/kernel.sh` runs the set
//! with the figures the kernel issue asks for. See BENCHMARKS.md.

mod common;
mod counting;
mod fairness;
mod fire;
mod idle;
mod ops;
mod push;
mod recover;
mod schedule;
mod schedules;
mod ui;
mod workflows;

use anyhow::Result;
use clap::{Parser, Subcommand};

use common::Common;

#[derive(Debug, Parser)]
#[command(name = "sundial-bench", about = "Benchmarks of Sundial's kernel")]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Schedule throughput and call latency: one per call from many callers, and batched.
    Schedule(schedule::ScheduleArgs),
    /// Fire lateness at a steady rate with many tasks pending far ahead; memory.
    Fire(fire::FireArgs),
    /// One namespace's burst beside another's trickle: the trickle's lateness, the burst's
    /// drain rate.
    Fairness(fairness::FairnessArgs),
    /// Store reads per minute while idle with many tasks pending a day ahead.
    Idle(idle::IdleArgs),
    /// Time from reopening after kill -9 until every overdue task has run.
    Recover(recover::RecoverArgs),
    /// Many schedules firing every minute: fires/s, lateness and memory.
    Schedules(schedules::SchedulesArgs),
    /// Durable workflows: starts/s, steps/s, replay cost against history length, memory asleep.
    Workflows(workflows::WorkflowsArgs),
    /// Retention under load: the database's size over time with a short retention.
    Retention(ops::RetentionArgs),
    /// Filtered list pages with many tasks stored: latency per filter combination.
    List(ops::ListArgs),
    /// Every web UI page's latency with a big store (in-process router).
    Ui(ui::UiArgs),
    /// Push delivery to loopback sinks: lateness, sustained calls/s, a slow receiver beside a
    /// fast one (JSON on stdout).
    Push(push::PushArgs),
    /// (internal) the fresh process `workflows` measures the sleepers' memory in.
    #[command(hide = true)]
    WorkflowsAsleepChild(workflows::AsleepChildArgs),
    /// (internal) the process `recover` kills.
    #[command(hide = true)]
    RecoverChild(recover::ChildArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // As the server does: timer ticks just after the wall clock's milliseconds.
    sundial::clock::align_timer_ticks();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match &cli.command {
            Cmd::Schedule(a) => schedule::run(&cli.common, a).await,
            Cmd::Fire(a) => fire::run(&cli.common, a).await,
            Cmd::Fairness(a) => fairness::run(&cli.common, a).await,
            Cmd::Idle(a) => idle::run(&cli.common, a).await,
            Cmd::Recover(a) => recover::run(&cli.common, a).await,
            Cmd::Schedules(a) => schedules::run(&cli.common, a).await,
            Cmd::Workflows(a) => workflows::run(&cli.common, a).await,
            Cmd::Retention(a) => ops::retention(&cli.common, a).await,
            Cmd::Ui(a) => ui::run(&cli.common, a).await,
            Cmd::List(a) => ops::list(&cli.common, a).await,
            Cmd::Push(a) => push::run(&cli.common, a).await,
            Cmd::WorkflowsAsleepChild(a) => workflows::asleep_child(&cli.common, a).await,
            Cmd::RecoverChild(a) => recover::child(&cli.common, a).await,
        }
    })
}
