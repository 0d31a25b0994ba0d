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
use sundial::{Config, Retention, Sundial, TaskFilter, TaskId, TaskSpec, TaskState, Timestamp};

use crate::common::{Common, DataDir, Stopwatch, histogram};

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

pub(crate) fn db_bytes(dir: &Path) -> u64 {
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
    eprintln!(
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
    let (s, size) = common
        .open_any(dir.path(), config, "bench-retention")
        .await?;
    s.register("bench.retained", |_t: sundial::TaskContext| async {
        Ok::<(), sundial::HandlerError>(())
    });
    let running = s.start();
    let watch = Stopwatch::start();
    let per_tick = (args.rate / 10).max(1) as usize;
    let mut created = 0u64;
    let mut next_sample = Duration::from_secs(args.sample_secs.max(1));
    let mut samples: Vec<(u64, u64)> = vec![(0, size.bytes().await?)];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while watch.elapsed() < Duration::from_secs(args.secs) {
        tick.tick().await;
        let specs = (0..per_tick)
            .map(|_| TaskSpec::new("bench.retained"))
            .collect();
        created += s.schedule_many(specs).await?.len() as u64;
        if watch.elapsed() >= next_sample {
            let bytes = size.bytes().await?;
            let t = next_sample.as_secs();
            samples.push((t, bytes));
            eprintln!(
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
    let growth = base.map(|b| last as f64 / b as f64 - 1.0);
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "retention",
            "store": if common.database_url.is_some() { "postgres" } else { "sqlite" },
            "rate_per_second": args.rate,
            "secs": args.secs,
            "retention_secs": args.retention_secs,
            "created": created,
            "samples": samples
                .iter()
                .map(|(t, b)| serde_json::json!({"t_secs": t, "bytes": b, "mib": mib(*b)}))
                .collect::<Vec<_>>(),
            "settled_at_secs": settle,
            "bytes_at_settle": base,
            "largest_after_settle": max_after,
            "last_bytes": last,
            "growth_after_settle": growth,
        })
    );
    Ok(())
}

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Tasks stored (far in the future). A reused store (`--data-dir`, or the same
    /// `--database-url`/`--database-schema`) keeps what an earlier run stored and only the
    /// missing tasks are added.
    #[arg(long, default_value_t = 10_000_000)]
    pub tasks: u64,
    /// Queues, kinds and tag values the tasks are spread over.
    #[arg(long, default_value_t = 20)]
    pub spread: u64,
    /// Page size.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Pages asked per filter combination.
    #[arg(long, default_value_t = 50)]
    pub rounds: usize,
    /// Tasks per store insert of the fill (one transaction each). Default: 50,000 on the
    /// embedded store, 10,000 on PostgreSQL.
    #[arg(long)]
    pub batch: Option<usize>,
}

const HOUR_MS: i64 = 3_600_000;

/// The filters of `GET /v1/tasks` the benchmark combines (every subset of them is asked).
const FILTERS: [&str; 7] = [
    "queue",
    "kind",
    "state",
    "key_prefix",
    "tag",
    "due",
    "created",
];

fn combination(bits: u32, start: Timestamp, day: Timestamp) -> (String, TaskFilter) {
    let mut f = TaskFilter::default();
    let mut name = Vec::new();
    for (i, what) in FILTERS.iter().enumerate() {
        if bits & (1 << i) == 0 {
            continue;
        }
        name.push(*what);
        match *what {
            "queue" => f.queue = Some("queue-3".into()),
            "kind" => f.kind = Some("kind-5".into()),
            "state" => f.state = Some(TaskState::Scheduled),
            "key_prefix" => f.key_prefix = Some("order-1234".into()),
            "tag" => f.tags = vec![("tenant".into(), "t7".into())],
            "due" => {
                f.due_after = Some(Timestamp(day.0 + HOUR_MS));
                f.due_before = Some(Timestamp(day.0 + 2 * HOUR_MS));
            }
            _ => {
                f.created_after = Some(start);
                f.created_before = Some(Timestamp(start.0 + 60_000));
            }
        }
    }
    f.exclude_internal = f.queue.is_none();
    let name = if name.is_empty() {
        "none".to_string()
    } else {
        name.join("+")
    };
    (name, f)
}

pub async fn list(common: &Common, args: &ListArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    let (s, _size) = common
        .open_any(dir.path(), common.config(), "bench-list")
        .await?;
    let batch = args
        .batch
        .unwrap_or(if common.database_url.is_some() {
            10_000
        } else {
            50_000
        })
        .max(1);
    eprintln!(
        "list: {} tasks over {} queues/kinds/tags, pages of {}, {} pages per combination",
        args.tasks, args.spread, args.limit, args.rounds
    );
    let stored: u64 = s.counts().await?.iter().map(|c| c.count).sum();
    let start = s.clock().now();
    let shards = s.config().shard_count;
    let limits = s.config().limits.clone();
    let store = s.store().clone();
    let watch = Stopwatch::start();
    let mut i = stored;
    while i < args.tasks {
        let n = (args.tasks - i).min(batch as u64);
        let now = s.clock().now();
        let tasks = (i..i + n)
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
                    .validate(TaskId(uuid::Uuid::now_v7()), now, shards, &limits)
            })
            .collect::<Result<Vec<_>, _>>()?;
        store.insert(tasks).await?;
        i += n;
        eprintln!(
            "  fill: {i}/{} in {:.0}s",
            args.tasks,
            watch.elapsed().as_secs_f64()
        );
    }
    let added = args.tasks.saturating_sub(stored);
    let fill_secs = watch.elapsed().as_secs_f64();
    let now = s.clock().now();
    let day = Timestamp(now.0 + 24 * HOUR_MS);
    let mut results = Vec::new();
    for bits in 0..(1u32 << FILTERS.len()) {
        let (name, filter) = combination(bits, start, day);
        let mut h = histogram();
        let mut rows = 0;
        for round in 0..args.rounds {
            let w = Stopwatch::start();
            let page = s.list(filter.clone(), args.limit).await?;
            h.saturating_record(w.elapsed().as_micros() as u64);
            if round == 0 {
                rows = page.tasks.len();
            }
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1_000.0;
        let line = serde_json::json!({
            "filter": name,
            "rows": rows,
            "p50_ms": ms(0.5),
            "p99_ms": ms(0.99),
            "max_ms": h.max() as f64 / 1_000.0,
        });
        eprintln!("  {line}");
        results.push(line);
    }
    let worst = results
        .iter()
        .filter_map(|r| r["p99_ms"].as_f64())
        .fold(0.0, f64::max);
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "list",
            "store": if common.database_url.is_some() { "postgres" } else { "sqlite" },
            "tasks": args.tasks.max(stored),
            "added": added,
            "fill_secs": fill_secs,
            "limit": args.limit,
            "rounds": args.rounds,
            "worst_p99_ms": worst,
            "combinations": results,
        })
    );
    Ok(())
}
