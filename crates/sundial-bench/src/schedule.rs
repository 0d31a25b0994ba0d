//! Schedule throughput: tasks stored durably per second, one task per call from many concurrent
//! callers, and in batches. Every call returns only once its tasks are committed (group commit with
//! the configured durability), so this is durable throughput.
//!
//! Due times are uniformly random over the next 1–25 hours, like real timers (a random key in the
//! due index costs more than an appended one). The engine runs, but nothing comes due.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use sundial::{Sundial, TaskSpec};

use crate::common::{Common, DataDir, Stopwatch, histogram, print_rss, summary};

#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    /// Tasks scheduled one per call.
    #[arg(long, default_value_t = 100_000)]
    pub single: usize,
    /// Concurrent callers for one-per-call scheduling.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Batches scheduled (each one `schedule_many` call).
    #[arg(long, default_value_t = 300)]
    pub batches: usize,
    /// Tasks per batch.
    #[arg(long, default_value_t = 1_000)]
    pub batch_size: usize,
    /// Concurrent callers for batched scheduling.
    #[arg(long, default_value_t = 4)]
    pub batch_callers: usize,
}

fn spec(rng: &mut impl Rng) -> TaskSpec {
    TaskSpec::new("bench.sched")
        .queue("sched")
        .delay(Duration::from_millis(
            rng.random_range(3_600_000..90_000_000),
        ))
}

pub async fn run(common: &Common, args: &ScheduleArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "schedule: data dir {}, durability {:?}, shards {}",
        dir.path().display(),
        common.durability,
        common.shards
    );
    crate::common::print_fsync_probe(dir.path())?;
    let sundial = common.open(dir.path(), common.config()).await?;
    let engine = sundial.start();

    if args.single > 0 {
        let (secs, h) = single(&sundial, args.single, args.callers).await?;
        println!(
            "  one at a time, {} callers: {} tasks in {:.2}s = {:.0} tasks/s",
            args.callers,
            args.single,
            secs,
            args.single as f64 / secs
        );
        println!("    call latency: {}", summary(&h, "ms", 1_000.0));
    }
    if args.batches > 0 {
        let (secs, h) =
            batched(&sundial, args.batches, args.batch_size, args.batch_callers).await?;
        let n = args.batches * args.batch_size;
        println!(
            "  batched, {} per call, {} callers: {} tasks in {:.2}s = {:.0} tasks/s",
            args.batch_size,
            args.batch_callers,
            n,
            secs,
            n as f64 / secs
        );
        println!("    call latency: {}", summary(&h, "ms", 1_000.0));
    }
    print_rss("at the end");
    engine.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// `n` tasks, one per call, from `callers` concurrent tasks. Returns seconds and call latency (µs).
async fn single(sundial: &Sundial, n: usize, callers: usize) -> Result<(f64, Histogram<u64>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let watch = Stopwatch::start();
    let mut workers = Vec::new();
    for _ in 0..callers.max(1) {
        let sundial = sundial.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut h = histogram();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let s = spec(&mut rand::rng());
                let call = Stopwatch::start();
                sundial.schedule(s).await?;
                h.saturating_record(call.elapsed().as_micros() as u64);
            }
            Ok::<_, anyhow::Error>(h)
        }));
    }
    let mut all = histogram();
    for w in workers {
        all.add(w.await??)?;
    }
    Ok((watch.elapsed().as_secs_f64(), all))
}

/// `batches` calls of `size` tasks each, from `callers` concurrent tasks.
async fn batched(
    sundial: &Sundial,
    batches: usize,
    size: usize,
    callers: usize,
) -> Result<(f64, Histogram<u64>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let watch = Stopwatch::start();
    let mut workers = Vec::new();
    for _ in 0..callers.max(1) {
        let sundial = sundial.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let mut h = histogram();
            while next.fetch_add(1, Ordering::Relaxed) < batches {
                let specs: Vec<TaskSpec> = {
                    let mut rng = rand::rng();
                    (0..size).map(|_| spec(&mut rng)).collect()
                };
                let call = Stopwatch::start();
                sundial.schedule_many(specs).await?;
                h.saturating_record(call.elapsed().as_micros() as u64);
            }
            Ok::<_, anyhow::Error>(h)
        }));
    }
    let mut all = histogram();
    for w in workers {
        all.add(w.await??)?;
    }
    Ok((watch.elapsed().as_secs_f64(), all))
}
