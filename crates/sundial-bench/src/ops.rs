//! Operations benchmarks: retention keeping the database's size level under a steady load, and
//! the latency of filtered list pages with many tasks stored.
//!
//! `retention`: tasks are created at `--rate` per second (batches every 100 ms, due at once), run by
//! a no-op handler and succeed; retention deletes succeeded tasks `--retention-secs` after they
//! finished. Every `--sample-secs` the run prints the database's size on disk (`sundial.db` plus
//! its WAL) and the task counts. With a retention much shorter than the run the size must level
//! off after about one retention, not grow with the run.
//!
//! `list`: `--tasks` tasks are stored (far in the future, spread over queues, kinds and tags, with
//! keys), then each filter combination of `GET /v1/tasks` is asked `--rounds` times for a page of
//! `--limit`; the latency of each is reported (p50, p99, max).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use sundial::{Config, Retention, Sundial, TaskFilter, TaskSpec, TaskState, Timestamp};

use crate::common::{Common, DataDir, Stopwatch, histogram, summary};

#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Tasks created (and run) per second.
    #[arg(long, default_value_t = 1_000)]
    pub rate: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 600)]
    pub secs: u64,
    /// Retention of succeeded tasks, in seconds.
    #[arg(long, default_value_t = 60)]
    pub retention_secs: u64,
    /// Seconds between size samples.
    #[arg(long, default_value_t = 30)]
    pub sample_secs: u64,
}

fn db_bytes(dir: &Path) -> u64 {
    ["sundial.db", "sundial.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

async fn counts_line(s: &Sundial) -> Result<String> {
    let mut by: std::collections::BTreeMap<TaskState, u64> = Default::default();
    for c in s.counts().await? {
        *by.entry(c.state).or_default() += c.count;
    }
    Ok(by
        .iter()
        .map(|(st, n)| format!("{st} {n}"))
        .collect::<Vec<_>>()
        .join(", "))
}

pub async fn retention(common: &Common, args: &RetentionArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "retention: {} tasks/s for {}s, succeeded kept {}s, size sampled every {}s; data dir {}",
        args.rate,
        args.secs,
        args.retention_secs,
        args.sample_secs,
        dir.path().display()
    );
    let config = Config {
        retention: Retention {
            succeeded: Duration::from_secs(args.retention_secs),
            interval: Duration::from_secs(1),
            ..Retention::default()
        },
        ..common.config()
    };
    let s = common.open(dir.path(), config).await?;
    s.register("bench.retained", |_t: sundial::TaskContext| async {
        Ok::<(), sundial::HandlerError>(())
    });
    let running = s.start();
    let watch = Stopwatch::start();
    let per_tick = (args.rate / 10).max(1) as usize;
    let mut created = 0u64;
    let mut next_sample = Duration::from_secs(args.sample_secs.max(1));
    let mut samples: Vec<(u64, u64)> = vec![(0, db_bytes(dir.path()))];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while watch.elapsed() < Duration::from_secs(args.secs) {
        tick.tick().await;
        let specs = (0..per_tick)
            .map(|_| TaskSpec::new("bench.retained"))
            .collect();
        created += s.schedule_many(specs).await?.len() as u64;
        if watch.elapsed() >= next_sample {
            let bytes = db_bytes(dir.path());
            let t = next_sample.as_secs();
            samples.push((t, bytes));
            println!(
                "  t={t:>4}s size={:>8.1} MiB created={created} ({})",
                mib(bytes),
                counts_line(&s).await?
            );
            next_sample += Duration::from_secs(args.sample_secs.max(1));
        }
    }
    running.shutdown(Duration::from_secs(10)).await;
    // Level: the largest size after two retentions against the size at two retentions.
    let settle = 2 * args.retention_secs;
    let base = samples.iter().find(|(t, _)| *t >= settle).map(|(_, b)| *b);
    let last = samples.last().map(|(_, b)| *b).unwrap_or(0);
    let max_after = samples
        .iter()
        .filter(|(t, _)| *t >= settle)
        .map(|(_, b)| *b)
        .max();
    match (base, max_after) {
        (Some(base), Some(max_after)) => println!(
            "  after {settle}s: {:.1} MiB; largest later {:.1} MiB; last {:.1} MiB ({:+.1}% from {settle}s)",
            mib(base),
            mib(max_after),
            mib(last),
            (last as f64 / base as f64 - 1.0) * 100.0
        ),
        _ => println!(
            "  run shorter than two retentions: last {:.1} MiB",
            mib(last)
        ),
    }
    Ok(())
}

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Tasks stored (far in the future).
    #[arg(long, default_value_t = 10_000_000)]
    pub tasks: u64,
    /// Queues, kinds and tag values the tasks are spread over.
    #[arg(long, default_value_t = 20)]
    pub spread: u64,
    /// Page size.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Pages asked per filter.
    #[arg(long, default_value_t = 200)]
    pub rounds: usize,
    /// Tasks per schedule call of the preload.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
}

const HOUR_MS: i64 = 3_600_000;

pub async fn list(common: &Common, args: &ListArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "list: {} tasks over {} queues/kinds/tags, pages of {}; data dir {}",
        args.tasks,
        args.spread,
        args.limit,
        dir.path().display()
    );
    let s = common.open(dir.path(), common.config()).await?;
    let stored: u64 = s.counts().await?.iter().map(|c| c.count).sum();
    let start = s.clock().now();
    let watch = Stopwatch::start();
    let mut i = stored;
    while i < args.tasks {
        let n = (args.tasks - i).min(args.batch as u64);
        let specs = (i..i + n)
            .map(|k| {
                let g = k % args.spread;
                TaskSpec::new(format!("kind-{}", (k / 7) % args.spread))
                    .queue(format!("queue-{g}"))
                    .key(format!("order-{k}"))
                    .tag("tenant", format!("t{}", (k / 3) % args.spread))
                    .tag("batch", format!("b{}", k / 100_000))
                    .run_at(Timestamp(
                        start.0 + 24 * HOUR_MS + (k as i64 % (24 * HOUR_MS)),
                    ))
            })
            .collect();
        s.schedule_many(specs).await?;
        i += n;
        if i % 500_000 < n {
            eprintln!(
                "  preload: {i}/{} in {:.0}s",
                args.tasks,
                watch.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "  stored {} tasks ({} added in {:.1}s)",
        args.tasks.max(stored),
        args.tasks.saturating_sub(stored),
        watch.elapsed().as_secs_f64()
    );
    let now = s.clock().now();
    let f = TaskFilter::default;
    let day = Timestamp(now.0 + 24 * HOUR_MS);
    let filters: Vec<(&str, TaskFilter)> = vec![
        ("none", f()),
        (
            "queue",
            TaskFilter {
                queue: Some("queue-3".into()),
                ..f()
            },
        ),
        (
            "queue+state",
            TaskFilter {
                queue: Some("queue-3".into()),
                state: Some(TaskState::Scheduled),
                ..f()
            },
        ),
        (
            "state=dead (none)",
            TaskFilter {
                state: Some(TaskState::Dead),
                ..f()
            },
        ),
        (
            "kind",
            TaskFilter {
                kind: Some("kind-5".into()),
                ..f()
            },
        ),
        (
            "key",
            TaskFilter {
                key: Some("order-12345".into()),
                ..f()
            },
        ),
        (
            "key_prefix",
            TaskFilter {
                key_prefix: Some("order-1234".into()),
                ..f()
            },
        ),
        (
            "tag",
            TaskFilter {
                tags: vec![("tenant".into(), "t7".into())],
                ..f()
            },
        ),
        (
            "tag+tag+queue",
            TaskFilter {
                tags: vec![
                    ("tenant".into(), "t7".into()),
                    ("batch".into(), "b1".into()),
                ],
                queue: Some("queue-1".into()),
                ..f()
            },
        ),
        (
            "due range (1 min)",
            TaskFilter {
                due_after: Some(Timestamp(day.0 + HOUR_MS)),
                due_before: Some(Timestamp(day.0 + HOUR_MS + 60_000)),
                ..f()
            },
        ),
        (
            "queue+due range",
            TaskFilter {
                queue: Some("queue-2".into()),
                due_after: Some(Timestamp(day.0 + HOUR_MS)),
                due_before: Some(Timestamp(day.0 + 2 * HOUR_MS)),
                ..f()
            },
        ),
        (
            "created range",
            TaskFilter {
                created_after: Some(start),
                created_before: Some(Timestamp(start.0 + 1_000)),
                ..f()
            },
        ),
    ];
    for (name, filter) in filters {
        let mut h = histogram();
        let mut rows = 0;
        for round in 0..args.rounds {
            let page_filter = filter.clone();
            let w = Stopwatch::start();
            let page = s.list(page_filter, args.limit).await?;
            h.saturating_record(w.elapsed().as_micros() as u64);
            if round == 0 {
                rows = page.tasks.len();
            }
        }
        println!("  {name:<20} rows={rows:<4} {}", summary(&h, "ms", 1_000.0));
    }
    Ok(())
}
