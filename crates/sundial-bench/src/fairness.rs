//! Fairness between namespaces: one namespace's burst beside another's steady trickle.
//!
//! Namespace A stores `--burst` tasks due within one second; namespace B stores `--b-burst`
//! tasks due in that same second and then `--b-rate` per second for `--secs` seconds. Both run
//! in-process handlers that take `--work-ms` each (a tokio sleep, so the CPU stays with the
//! engine), under the engine's per-queue concurrency. Reported: B's lateness (handler start −
//! due) p50/p99/max, A's drain rate (A's tasks / (its last start − its first start)), and
//! starts before their due time (must be 0). `--b-burst 0 --b-rate 0` measures A alone;
//! `--a-limit N` puts a queue limit of N on A's queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use hdrhistogram::Histogram;
use sundial::{Sundial, TaskSpec, Timestamp};

use crate::common::{Common, DataDir, histogram, loadavg, sleep_until, summary};

#[derive(Debug, Clone, Args)]
pub struct FairnessArgs {
    /// Namespace A's tasks, all due within one second.
    #[arg(long, default_value_t = 20_000)]
    pub burst: u64,
    /// Namespace B's tasks due in that same second.
    #[arg(long, default_value_t = 100)]
    pub b_burst: u64,
    /// Namespace B's tasks per second after that second.
    #[arg(long, default_value_t = 10)]
    pub b_rate: u64,
    /// Seconds of B's steady tasks.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// How long each handler run takes, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub work_ms: u64,
    /// How long before the burst's second everything is stored.
    #[arg(long, default_value_t = 10_000)]
    pub lead_ms: i64,
    /// A concurrency limit on A's queue (`PUT /v1/queues/{queue}` `concurrency`): at most this
    /// many of A's tasks run at once.
    #[arg(long)]
    pub a_limit: Option<u32>,
}

struct Side {
    fired: AtomicU64,
    first_start: AtomicU64,
    last_start: AtomicU64,
}

impl Default for Side {
    fn default() -> Self {
        Side {
            fired: AtomicU64::new(0),
            first_start: AtomicU64::new(u64::MAX),
            last_start: AtomicU64::new(0),
        }
    }
}

pub async fn run(common: &Common, args: &FairnessArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "fairness: A {} due in one second; B {} in that second then {}/s for {} s; {} ms per run; \
         shards {}, durability {:?}; load {}",
        args.burst,
        args.b_burst,
        args.b_rate,
        args.secs,
        args.work_ms,
        common.shards,
        common.durability,
        loadavg()
    );
    let store = common.open_store(dir.path())?;
    let sundial = Sundial::builder()
        .config(common.config())
        .with_store(Arc::new(store))?;
    if let Some(limit) = args.a_limit {
        sundial
            .configure_queue(
                "a\u{1f}work",
                sundial::QueueConfig {
                    concurrency: Some(limit),
                    ..sundial::QueueConfig::default()
                },
            )
            .await?;
        println!("  A's queue limited to {limit} running at once");
    }
    let clock = sundial.clock().clone();
    let base = clock.now().0 + args.lead_ms;

    let a = Arc::new(Side::default());
    let b = Arc::new(Side::default());
    let b_late: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(histogram()));
    let early = Arc::new(AtomicU64::new(0));
    for (kind, side) in [("bench.a", a.clone()), ("bench.b", b.clone())] {
        let clock = clock.clone();
        let late = (kind == "bench.b").then(|| b_late.clone());
        let early = early.clone();
        let work = Duration::from_millis(args.work_ms);
        sundial.register(kind, move |ctx: sundial::TaskContext| {
            let now = clock.now();
            let lateness = now.0 - ctx.task.due_at.0;
            if lateness < 0 {
                early.fetch_add(1, Ordering::Relaxed);
            } else if let Some(h) = &late
                && let Ok(mut h) = h.lock()
            {
                h.saturating_record(lateness as u64);
            }
            side.fired.fetch_add(1, Ordering::Relaxed);
            let at = u64::try_from(now.0).unwrap_or(0);
            side.first_start.fetch_min(at, Ordering::Relaxed);
            side.last_start.fetch_max(at, Ordering::Relaxed);
            async move {
                tokio::time::sleep(work).await;
                Ok::<(), sundial::HandlerError>(())
            }
        });
    }

    // Everything is stored before the engine starts: A's burst and B's tasks of that second,
    // spread evenly over it, and B's later tasks one per 1/b_rate s.
    let spread = |n: u64, i: u64| Timestamp(base + (i * 1_000 / n.max(1)) as i64);
    let mut specs: Vec<TaskSpec> = (0..args.burst)
        .map(|i| {
            TaskSpec::new("bench.a")
                .queue("a\u{1f}work")
                .run_at(spread(args.burst, i))
        })
        .collect();
    for i in 0..args.b_burst {
        specs.push(
            TaskSpec::new("bench.b")
                .queue("b\u{1f}work")
                .run_at(spread(args.b_burst, i)),
        );
    }
    let steady = args.b_rate * args.secs;
    for i in 0..steady {
        let due = base + 1_000 + (i * 1_000 / args.b_rate.max(1)) as i64;
        specs.push(
            TaskSpec::new("bench.b")
                .queue("b\u{1f}work")
                .run_at(Timestamp(due)),
        );
    }
    for chunk in specs.chunks(1_000) {
        sundial.schedule_many(chunk.to_vec()).await?;
    }
    let stored_at = clock.now().0;
    if stored_at > base {
        println!(
            "  WARNING: storing took until {} ms after the burst's first due time (raise --lead-ms)",
            stored_at - base
        );
    }
    let engine = sundial.start();
    let cpu_before = crate::common::cpu_seconds("sundial-sqlite");
    let total_b = args.b_burst + steady;
    let give_up = Timestamp(base + 1_000 + args.secs as i64 * 1_000 + 120_000);
    loop {
        sleep_until(&clock, Timestamp(clock.now().0 + 200)).await;
        let (fa, fb) = (
            a.fired.load(Ordering::Relaxed),
            b.fired.load(Ordering::Relaxed),
        );
        if fa >= args.burst && fb >= total_b {
            break;
        }
        if clock.now() > give_up {
            bail!("only {fa} of A's and {fb} of B's tasks ran within 120 s");
        }
    }
    let cpu_after = crate::common::cpu_seconds("sundial-sqlite");
    engine.shutdown(Duration::from_secs(5)).await;

    let first = a.first_start.load(Ordering::Relaxed) as i64;
    let last = a.last_start.load(Ordering::Relaxed) as i64;
    let drain = if last > first {
        (args.burst.saturating_sub(1)) as f64 * 1_000.0 / (last - first) as f64
    } else {
        0.0
    };
    println!(
        "  A: {} tasks; first start {} ms after the first due time, last {} ms: {:.0} tasks/s \
         between them",
        args.burst,
        first - base,
        last - base,
        drain
    );
    if let Ok(h) = b_late.lock() {
        println!("  B lateness: {}", summary(&h, "ms", 1.0));
    }
    let runs = (args.burst + total_b).max(1) as f64;
    println!(
        "  cpu per task run (process / SQLite threads): {:.1} / {:.1} us",
        (cpu_after.0 - cpu_before.0) * 1e6 / runs,
        (cpu_after.1 - cpu_before.1) * 1e6 / runs
    );
    println!("  early starts: {}", early.load(Ordering::Relaxed));
    println!("  load after: {}", loadavg());
    Ok(())
}
