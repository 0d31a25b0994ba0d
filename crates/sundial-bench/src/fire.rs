//! Fire lateness: how long after its due time a task's handler starts, while tasks come due at a
//! steady rate and many more wait far in the future.
//!
//! Lateness is read inside the (no-op) handler as the engine's clock minus the task's `due_at`, in
//! whole milliseconds (the clock's resolution). The load: a producer schedules each second's tasks
//! `--lead-ms` before that second starts, in batches, with due times spread evenly over the second.
//! Before the load, `--pending` tasks are stored 24–48 hours ahead with batched schedules; memory is
//! read after that preload and after the run, so one can see whether it grows with the pending count.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use hdrhistogram::Histogram;
use sundial::{Config, Sundial, TaskSpec, Timestamp};

use crate::common::{
    Common, DataDir, PreloadOrder, Stopwatch, histogram, preload, print_rss, sleep_until, summary,
};
use crate::counting::counting_store;

#[derive(Debug, Clone, Args)]
pub struct FireArgs {
    /// Tasks coming due per second.
    #[arg(long, default_value_t = 5_000)]
    pub rate: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Tasks pending far in the future (24-48 h) during the run, e.g. 10000, 1000000, 10000000.
    #[arg(long, default_value_t = 1_000_000)]
    pub pending: u64,
    /// How long before its second the load's tasks are scheduled.
    #[arg(long, default_value_t = 3_000)]
    pub lead_ms: i64,
    /// Tasks per schedule call of the load.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Tasks per schedule call of the preload.
    #[arg(long, default_value_t = 1_000)]
    pub preload_batch: usize,
    /// Order of the preload's due times.
    #[arg(long, value_enum, default_value_t = PreloadOrder::Random)]
    pub preload_order: PreloadOrder,
    /// Concurrent in-process handler runs (the engine's per-queue limit).
    #[arg(long, default_value_t = Config::default().default_concurrency)]
    pub concurrency: usize,
    /// Flow controls on every task of the load, none of them binding, to see what checking
    /// them costs: `priority` (0-9 in turn), `group` (one of 100 group keys, limit 1,000),
    /// `rate` (one of 100 rate keys, 1,000 per second each), `all` (the three), `queue` (the
    /// load's queue limited to 10,000 running at once).
    #[arg(long, value_enum, default_value_t = Controls::None)]
    pub controls: Controls,
    /// How long before its due time an in-process run is claimed (`--run-claim-lead`), ms.
    #[arg(long, default_value_t = Config::default().run_claim_lead.as_millis() as u64)]
    pub run_claim_lead_ms: u64,
}

/// The flow controls the fire load's tasks carry (`--controls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Controls {
    None,
    Priority,
    Group,
    Rate,
    All,
    Queue,
}

impl Controls {
    /// Task `i` of the load with the controls on.
    fn apply(self, spec: TaskSpec, i: i64) -> TaskSpec {
        let (priority, group, rate) = match self {
            Controls::None | Controls::Queue => (false, false, false),
            Controls::Priority => (true, false, false),
            Controls::Group => (false, true, false),
            Controls::Rate => (false, false, true),
            Controls::All => (true, true, true),
        };
        let mut spec = spec;
        if priority && let Ok(p) = sundial::Priority::new((i % 10) as u8) {
            spec = spec.priority(p);
        }
        if group {
            spec = spec.concurrency(format!("group-{}", i % 100), 1_000);
        }
        if rate {
            spec = spec.rate(
                Some(format!("rate-{}", i % 100)),
                1_000,
                Duration::from_secs(1),
            );
        }
        spec
    }
}

struct Stats {
    /// (whole run, current reporting interval), lateness in ms.
    hist: Mutex<(Histogram<u64>, Histogram<u64>)>,
    /// Breakdown (ms): due → the claim's `now` (the task's `started_at`), and that → handler start.
    parts: Mutex<(Histogram<u64>, Histogram<u64>)>,
    fired: AtomicU64,
    early: AtomicU64,
    worst_early_ms: AtomicI64,
}

pub async fn run(common: &Common, args: &FireArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "fire: {} tasks/s for {}s with {} pending, controls {:?}; data dir {}, durability {:?}, shards {}, concurrency {}",
        args.rate,
        args.secs,
        args.pending,
        args.controls,
        dir.path().display(),
        common.durability,
        common.shards,
        args.concurrency
    );
    let config = Config {
        default_concurrency: args.concurrency,
        run_claim_lead: std::time::Duration::from_millis(args.run_claim_lead_ms),
        ..common.config()
    };
    crate::common::print_fsync_probe(dir.path())?;
    let store = common.open_store(dir.path())?;
    let (counted, counting) = counting_store(Arc::new(store), common.shards);
    let sundial = Sundial::builder().config(config).with_store(counted)?;
    if args.controls == Controls::Queue {
        sundial
            .configure_queue(
                "fire",
                sundial::QueueConfig {
                    concurrency: Some(sundial::QueueConfig::MAX_CONCURRENCY),
                    ..sundial::QueueConfig::default()
                },
            )
            .await?;
    }
    print_rss("after open");
    preload(
        &sundial,
        args.pending,
        args.preload_batch,
        4,
        args.preload_order,
    )
    .await?;
    let after_preload = print_rss("after preload");
    counting.reset();

    let stats = Arc::new(Stats {
        hist: Mutex::new((histogram(), histogram())),
        parts: Mutex::new((histogram(), histogram())),
        fired: AtomicU64::new(0),
        early: AtomicU64::new(0),
        worst_early_ms: AtomicI64::new(0),
    });
    {
        let stats = stats.clone();
        let clock = sundial.clock().clone();
        sundial.register("bench.noop", move |ctx: sundial::TaskContext| {
            let now = clock.now();
            let late = now.0 - ctx.task.due_at.0;
            if let (Some(claimed), Ok(mut p)) = (ctx.task.started_at, stats.parts.lock()) {
                p.0.saturating_record((claimed.0 - ctx.task.due_at.0).max(0) as u64);
                p.1.saturating_record((now.0 - claimed.0).max(0) as u64);
            }
            if late < 0 {
                stats.early.fetch_add(1, Ordering::Relaxed);
                stats.worst_early_ms.fetch_min(late, Ordering::Relaxed);
            } else if let Ok(mut h) = stats.hist.lock() {
                h.0.saturating_record(late as u64);
                h.1.saturating_record(late as u64);
            }
            stats.fired.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), sundial::HandlerError>(()) }
        });
    }
    let engine = sundial.start();
    let cpu_before = crate::common::cpu_seconds("sundial-sqlite");

    let clock = sundial.clock().clone();
    let total = args.rate * args.secs;
    let base = clock.now().0 + args.lead_ms + 1_000;
    let producer = {
        let sundial = sundial.clone();
        let clock = clock.clone();
        let (rate, secs, lead, batch) = (args.rate, args.secs, args.lead_ms, args.batch.max(1));
        let controls = args.controls;
        tokio::spawn(async move {
            // Smallest margin between a second's scheduling finishing and its first due time.
            let mut min_margin = i64::MAX;
            for k in 0..secs as i64 {
                let second = base + k * 1_000;
                sleep_until(&clock, Timestamp(second - lead)).await;
                let dues: Vec<Timestamp> = (0..rate as i64)
                    .map(|i| Timestamp(second + i * 1_000 / rate as i64))
                    .collect();
                for (c, chunk) in dues.chunks(batch).enumerate() {
                    let specs = chunk
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            let n = k * rate as i64 + (c * batch + i) as i64;
                            controls.apply(TaskSpec::new("bench.noop").queue("fire").run_at(*t), n)
                        })
                        .collect();
                    sundial.schedule_many(specs).await?;
                }
                min_margin = min_margin.min(second - clock.now().0);
            }
            Ok::<i64, anyhow::Error>(min_margin)
        })
    };

    // Report every 5 s while waiting for every task to fire.
    let watch = Stopwatch::start();
    let give_up = Timestamp(base + args.secs as i64 * 1_000 + 60_000);
    let mut last = 0;
    loop {
        let tick = Timestamp(clock.now().0 + 5_000);
        tokio::time::sleep(Duration::from_millis(200)).await;
        while clock.now() < tick && stats.fired.load(Ordering::Relaxed) < total {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let fired = stats.fired.load(Ordering::Relaxed);
        let interval = match stats.hist.lock() {
            Ok(mut h) => {
                let s = format!("p99 {}ms max {}ms", h.1.value_at_quantile(0.99), h.1.max());
                h.1.reset();
                s
            }
            Err(_) => String::new(),
        };
        eprintln!(
            "  [{:>5.1}s] fired {fired}/{total} (+{}), interval lateness {interval}",
            watch.elapsed().as_secs_f64(),
            fired - last
        );
        last = fired;
        if fired >= total {
            break;
        }
        if clock.now() > give_up {
            bail!("only {fired} of {total} tasks fired within 60 s after the last was due");
        }
    }
    let min_margin = producer.await??;
    let cpu_after = crate::common::cpu_seconds("sundial-sqlite");
    let after_run = print_rss("after the run");
    engine.shutdown(Duration::from_secs(5)).await;

    let h = stats
        .hist
        .lock()
        .map(|h| h.0.clone())
        .unwrap_or_else(|_| histogram());
    println!(
        "  scheduled each second's tasks at least {min_margin} ms before they were due{}",
        if min_margin < 0 {
            " (NEGATIVE: the producer fell behind; lateness includes its delay)"
        } else {
            ""
        }
    );
    println!("  fire lateness: {}", summary(&h, "ms", 1.0));
    let fired = stats.fired.load(Ordering::Relaxed).max(1) as f64;
    println!(
        "  cpu per task (create and fire; process / SQLite threads): {:.1} / {:.1} us",
        (cpu_after.0 - cpu_before.0) * 1e6 / fired,
        (cpu_after.1 - cpu_before.1) * 1e6 / fired
    );
    if let Ok(p) = stats.parts.lock() {
        println!("    due -> claim issued:    {}", summary(&p.0, "ms", 1.0));
        println!("    claim -> handler start: {}", summary(&p.1, "ms", 1.0));
    }
    println!("  store call latency during the load:");
    for (m, h) in counting.latencies() {
        println!("    {:<18} {}", m.name(), summary(&h, "ms", 1_000.0));
    }
    let early = stats.early.load(Ordering::Relaxed);
    if early > 0 {
        println!(
            "  EARLY STARTS: {early} (worst {} ms before due)",
            stats.worst_early_ms.load(Ordering::Relaxed)
        );
    } else {
        println!("  early starts: 0");
    }
    println!(
        "  memory: rss after preload {:.1} MiB, after the run {:.1} MiB, peak {:.1} MiB",
        after_preload.current_mib, after_run.current_mib, after_run.peak_mib
    );
    Ok(())
}
