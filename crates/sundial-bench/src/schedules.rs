//! `sundial-bench schedules`: many schedules firing every minute (`* * * * *`) on the embedded
//! store with the real clock. Reports how fast the schedules were created, then for each measured
//! minute how long the burst of fires took (fires/s), the lateness of each fire's task start
//! behind its nominal time (p50 … max), and the process's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sundial::{TaskContext, Timestamp};
use sundial_schedules::{
    CreateSchedule, FireKey, ScheduleDef, ScheduleId, ScheduleSpec, Schedules, TICK_QUEUE,
    TaskTemplate,
};

use crate::common::{
    Common, DataDir, Stopwatch, cpu_seconds, histogram, print_rss, sleep_until, summary,
};

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// Schedules to create, each firing every minute.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Minutes to measure after the first full minute.
    #[arg(long, default_value_t = 3)]
    pub minutes: u32,
    /// Concurrent callers creating schedules.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    /// Concurrent ticks (and fire tasks) in process.
    #[arg(long, default_value_t = 1_024)]
    pub concurrency: usize,
}

const KIND: &str = "bench.schedule";
const QUEUE: &str = "bench-schedules";

pub async fn run(common: &Common, args: &SchedulesArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    let mut config = common.config();
    config
        .queue_concurrency
        .insert(TICK_QUEUE.to_string(), args.concurrency);
    config
        .queue_concurrency
        .insert(QUEUE.to_string(), args.concurrency);
    let sundial = common.open(dir.path(), config).await?;
    let schedules = Schedules::attach(&sundial).context("attach schedules")?;
    let lateness = Arc::new(Mutex::new(histogram()));
    let fired = Arc::new(AtomicU64::new(0));
    {
        let (lateness, fired, clock) = (lateness.clone(), fired.clone(), sundial.clock().clone());
        sundial.register(KIND, move |ctx: TaskContext| {
            let now = clock.now();
            let nominal = ctx
                .task
                .key
                .as_deref()
                .and_then(FireKey::parse)
                .map(|k| k.nominal);
            if let (Some(n), Ok(mut h)) = (nominal, lateness.lock()) {
                let _ = h.record(u64::try_from(now.0 - n.0).unwrap_or(0).max(1));
            }
            fired.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), sundial::HandlerError>(()) }
        });
    }
    let running = sundial.start();
    println!(
        "schedules: {} schedules `* * * * *`, {} callers, concurrency {}",
        args.count, args.callers, args.concurrency
    );

    let sw = Stopwatch::start();
    let next = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for _ in 0..args.callers {
        let (schedules, next, count) = (schedules.clone(), next.clone(), args.count);
        callers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let def = ScheduleDef::new(
                    ScheduleSpec::cron("* * * * *"),
                    TaskTemplate::new(KIND).queue(QUEUE),
                );
                let id = ScheduleId::new(format!("s{i:07}"))?;
                match schedules.create(CreateSchedule::new(def).id(id)).await {
                    Ok(_) | Err(sundial_schedules::Error::AlreadyExists) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    for c in callers {
        c.await??;
    }
    let took = sw.elapsed();
    println!(
        "  created in {:.1}s ({:.0} schedules/s)",
        took.as_secs_f64(),
        args.count as f64 / took.as_secs_f64()
    );
    print_rss("after creating");

    let clock = sundial.clock().clone();
    let minute = |t: Timestamp| Timestamp((t.0.div_euclid(60_000) + 1) * 60_000);
    // Skip the first (possibly partial) minute.
    let mut boundary = minute(clock.now());
    sleep_until(&clock, boundary).await;
    boundary = minute(clock.now());
    for m in 0..args.minutes {
        sleep_until(&clock, Timestamp(boundary.0 - 1_000)).await;
        if let Ok(mut h) = lateness.lock() {
            h.reset();
        }
        let start = fired.load(Ordering::Relaxed);
        let cpu_before = cpu_seconds("sundial-sqlite");
        let target = start + args.count;
        let deadline = Timestamp(boundary.0 + 59_000);
        while fired.load(Ordering::Relaxed) < target && clock.now() < deadline {
            sleep_until(&clock, Timestamp(clock.now().0 + 100)).await;
        }
        let done = clock.now();
        let n = fired.load(Ordering::Relaxed) - start;
        let span = Duration::from_millis(u64::try_from(done.0 - boundary.0).unwrap_or(1).max(1));
        let h = lateness
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| histogram());
        println!(
            "  minute {}: {n} fires in {:.2}s after the minute ({:.0} fires/s); lateness {}",
            m + 1,
            span.as_secs_f64(),
            n as f64 / span.as_secs_f64(),
            summary(&h, "ms", 1.0)
        );
        let cpu_after = cpu_seconds("sundial-sqlite");
        println!(
            "  cpu during the minute's fires: process {:.1}s, SQLite writer and checkpoint threads {:.1}s",
            cpu_after.0 - cpu_before.0,
            cpu_after.1 - cpu_before.1
        );
        print_rss(&format!("minute {}", m + 1));
        println!("  load average: {}", crate::common::loadavg());
        boundary = Timestamp(boundary.0 + 60_000);
    }
    // What every schedule recorded over the whole run (fires before the measured minutes
    // included): a fire that ran too late for the catch-up window is recorded missed.
    let (mut fired_total, mut skipped, mut missed) = (0u64, 0u64, 0u64);
    let mut after: Option<ScheduleId> = None;
    loop {
        let page = schedules.list(after.as_ref(), 1_000).await?;
        for s in &page.schedules {
            fired_total += s.counts.fired;
            skipped += s.counts.skipped;
            missed += s.counts.missed;
        }
        match page.next_cursor {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    println!(
        "  fire records over the run: {fired_total} fired, {skipped} skipped, {missed} missed"
    );
    println!("  load average: {}", crate::common::loadavg());
    running.shutdown(Duration::from_secs(10)).await;
    Ok(())
}
