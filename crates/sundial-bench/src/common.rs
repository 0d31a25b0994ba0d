//! Pieces every benchmark shares: where the data lives, how the instance is opened, wall-time
//! measurement, memory readings, histogram summaries and the far-future preload.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::Rng;
use sundial::{
    Clock, Config, Durability, Scheduled, SqliteOptions, SqliteStore, Sundial, TaskSpec, TaskState,
    Timestamp,
};

/// Options every subcommand takes.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Data directory for the store. Default: a fresh temporary directory, removed afterwards.
    /// Reusing a directory keeps earlier preloads (only the missing pending tasks are added).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Shards of the due index (fixed for a data directory once created).
    #[arg(long, global = true, default_value_t = 4)]
    pub shards: u32,
    /// Commit durability: `full` fsyncs every group commit (the default), `normal` only at
    /// checkpoints (survives kill -9, not power loss).
    #[arg(long, global = true, value_enum, default_value_t = DurabilityArg::Full)]
    pub durability: DurabilityArg,
    /// PostgreSQL instead of the embedded store (`idle` only): the engine joins the database as
    /// the single node of a cluster, in `--database-schema`. Example:
    /// postgres://postgres@127.0.0.1:5432/test
    #[arg(long, global = true)]
    pub database_url: Option<String>,
    /// The schema on `--database-url` (created if missing, kept afterwards like `--data-dir`, so
    /// a later run reuses its preload; drop it by hand when done).
    #[arg(long, global = true, default_value = "sundial_bench")]
    pub database_schema: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    Full,
    Normal,
}

/// The data directory for one run; a temporary one is deleted on drop.
pub struct DataDir {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl DataDir {
    pub fn new(common: &Common) -> Result<Self> {
        match &common.data_dir {
            Some(p) => {
                std::fs::create_dir_all(p).with_context(|| format!("create {}", p.display()))?;
                Ok(DataDir {
                    path: p.clone(),
                    _temp: None,
                })
            }
            None => {
                // Next to the workspace's other scratch files rather than tmpfs, so that fsync is
                // real: the numbers are about a disk-backed store.
                let t = tempfile::Builder::new()
                    .prefix("sundial-bench-")
                    .tempdir_in(std::env::temp_dir())
                    .context("create temporary data directory")?;
                Ok(DataDir {
                    path: t.path().to_path_buf(),
                    _temp: Some(t),
                })
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Common {
    pub fn config(&self) -> Config {
        Config {
            shard_count: self.shards,
            ..Config::default()
        }
    }

    pub fn sqlite_options(&self) -> SqliteOptions {
        SqliteOptions {
            durability: match self.durability {
                DurabilityArg::Full => Durability::Full,
                DurabilityArg::Normal => Durability::Normal,
            },
            ..SqliteOptions::default()
        }
    }

    /// Opens the embedded store directly (for wrapping it).
    pub fn open_store(&self, dir: &Path) -> Result<SqliteStore> {
        SqliteStore::open_dir(dir, self.sqlite_options()).context("open sqlite store")
    }

    /// Opens a Sundial with the real system clock: on the embedded store in `dir`, or, with
    /// `--database-url`, as the one node of a cluster on PostgreSQL (schema
    /// `--database-schema`); with what measures the store's size on disk.
    pub async fn open_any(
        &self,
        dir: &Path,
        config: Config,
        node: &str,
    ) -> Result<(Sundial, StoreSize)> {
        let Some(url) = &self.database_url else {
            return Ok((
                self.open(dir, config).await?,
                StoreSize::Sqlite(dir.to_path_buf()),
            ));
        };
        let store = Arc::new(
            sundial_store_postgres::PostgresStore::connect(
                url,
                sundial_store_postgres::PostgresOptions {
                    schema: self.database_schema.clone(),
                    ..sundial_store_postgres::PostgresOptions::default()
                },
            )
            .await
            .context("connect to PostgreSQL")?,
        );
        let sundial = Sundial::builder()
            .config(config)
            .join_cluster(store.clone(), store, node)
            .await
            .context("join the cluster")?;
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .context("connect to PostgreSQL for size readings")?;
        tokio::spawn(conn);
        Ok((
            sundial,
            StoreSize::Postgres {
                client,
                schema: self.database_schema.clone(),
            },
        ))
    }

    /// Opens a Sundial on `dir` with the real system clock.
    pub async fn open(&self, dir: &Path, config: Config) -> Result<Sundial> {
        Sundial::builder()
            .config(config)
            .sqlite_options(self.sqlite_options())
            .open(dir)
            .await
            .context("open sundial")
    }
}

/// Where a benchmark's store keeps its data, to read its size.
pub enum StoreSize {
    /// `sundial.db` and its WAL in this directory.
    Sqlite(PathBuf),
    /// Every table of the schema with its indexes and TOAST (`pg_total_relation_size`).
    Postgres {
        client: tokio_postgres::Client,
        schema: String,
    },
}

impl StoreSize {
    pub async fn bytes(&self) -> Result<u64> {
        match self {
            StoreSize::Sqlite(dir) => Ok(crate::ops::db_bytes(dir)),
            StoreSize::Postgres { client, schema } => {
                let row = client
                    .query_one(
                        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint \
                         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE n.nspname = $1 AND c.relkind = 'r'",
                        &[schema],
                    )
                    .await
                    .context("read the schema's size")?;
                Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
            }
        }
    }
}

/// Wall time for measuring the benchmark itself (call latency, phase durations). Due decisions
/// never use it: they go through the engine's clock.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)] // measuring elapsed wall time is the benchmark's job
    pub fn start() -> Self {
        Stopwatch(Instant::now())
    }
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// The disk's durable-write latency in `dir`: 200 appends of 4 KiB, each followed by an fsync
/// (what one group commit costs at least). Printed with the results because it bounds them: a claim
/// is durable before its handler starts.
pub fn print_fsync_probe(dir: &Path) -> Result<()> {
    use std::io::Write;
    let path = dir.join("fsync-probe.tmp");
    let mut f = std::fs::File::create(&path).context("create fsync probe file")?;
    let mut h = histogram();
    let block = [0u8; 4096];
    for _ in 0..200 {
        f.write_all(&block)?;
        let w = Stopwatch::start();
        f.sync_data()?;
        h.saturating_record(w.elapsed().as_micros() as u64);
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    println!(
        "  disk fsync (4 KiB append): {}",
        summary(&h, "ms", 1_000.0)
    );
    Ok(())
}

/// Resident memory figures of this process, from /proc/self/status, in MiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    pub current_mib: f64,
    pub peak_mib: f64,
}

pub fn rss() -> Rss {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Rss::default();
    };
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    };
    Rss {
        current_mib: field("VmRSS:"),
        peak_mib: field("VmHWM:"),
    }
}

/// CPU time (user + system, seconds) used so far by this process, and by its threads whose name
/// starts with `thread_prefix` (Linux; clock ticks of 10 ms). Zero where `/proc` is missing.
pub fn cpu_seconds(thread_prefix: &str) -> (f64, f64) {
    fn ticks(stat: &str) -> f64 {
        // Fields after the command name (which is in parentheses and may hold spaces).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
        n(11) + n(12)
    }
    let total = std::fs::read_to_string("/proc/self/stat")
        .map(|s| ticks(&s))
        .unwrap_or(0.0);
    let mut threads = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.starts_with(thread_prefix)
                && let Ok(stat) = std::fs::read_to_string(t.path().join("stat"))
            {
                threads += ticks(&stat);
            }
        }
    }
    (total / 100.0, threads / 100.0)
}

/// The system's load averages (1, 5, 15 minutes) as `/proc/loadavg` has them, or `unknown`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

pub fn print_rss(label: &str) -> Rss {
    let r = rss();
    println!(
        "  memory {label}: rss {:.1} MiB, peak rss (VmHWM) {:.1} MiB",
        r.current_mib, r.peak_mib
    );
    r
}

pub fn histogram() -> Histogram<u64> {
    // Values from 1 to one hour (in whatever unit the caller records), three significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures are valid"))
    })
}

/// `p50 … max` of a histogram, formatted with a unit.
pub fn summary(h: &Histogram<u64>, unit: &str, scale: f64) -> String {
    let v = |q: f64| h.value_at_quantile(q) as f64 / scale;
    format!(
        "n={} p50={:.2}{unit} p90={:.2}{unit} p99={:.2}{unit} p99.9={:.2}{unit} max={:.2}{unit} mean={:.2}{unit}",
        h.len(),
        v(0.50),
        v(0.90),
        v(0.99),
        v(0.999),
        h.max() as f64 / scale,
        h.mean() / scale,
    )
}

/// The queue and kind of the preloaded far-future tasks.
pub const PENDING_QUEUE: &str = "pending";
pub const PENDING_KIND: &str = "bench.pending";
const DAY_MS: i64 = 86_400_000;

/// In which order the preload's due times come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreloadOrder {
    /// Uniformly random over the 24 hours: every insert lands at a random place in the due index
    /// (realistic, and the expensive case for a B-tree: one dirty page per row).
    Random,
    /// Evenly spread and ascending: inserts append to the due index (much faster to set up; the
    /// index ends up denser, which only helps the measured phase a little).
    Ascending,
}

/// Makes sure `count` tasks are pending in [`PENDING_QUEUE`], due between 24 and 48 hours from now,
/// inserted with batched schedules from `callers` concurrent callers. Tasks left by an earlier run
/// in the same data directory count; only the difference is added.
pub async fn preload(
    sundial: &Sundial,
    count: u64,
    batch: usize,
    callers: usize,
    order: PreloadOrder,
) -> Result<()> {
    let existing: u64 = sundial
        .counts()
        .await?
        .iter()
        .filter(|c| c.queue == PENDING_QUEUE && c.state == TaskState::Scheduled)
        .map(|c| c.count)
        .sum();
    if existing >= count {
        println!("  preload: {existing} pending tasks already present, none added");
        return Ok(());
    }
    let missing = (count - existing) as usize;
    let watch = Stopwatch::start();
    let next = Arc::new(AtomicUsize::new(0));
    let batch = batch.max(1);
    let mut workers = Vec::new();
    for _ in 0..callers.max(1) {
        let sundial = sundial.clone();
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            let now = sundial.clock().now();
            loop {
                let start = next.fetch_add(batch, Ordering::Relaxed);
                if start >= missing {
                    return Ok::<(), anyhow::Error>(());
                }
                let n = batch.min(missing - start);
                let specs: Vec<TaskSpec> = {
                    let mut rng = rand::rng();
                    (start..start + n)
                        .map(|i| {
                            let ahead = match order {
                                PreloadOrder::Random => rng.random_range(DAY_MS..2 * DAY_MS),
                                PreloadOrder::Ascending => {
                                    DAY_MS + (i as f64 / missing as f64 * DAY_MS as f64) as i64
                                }
                            };
                            TaskSpec::new(PENDING_KIND)
                                .queue(PENDING_QUEUE)
                                .run_at(Timestamp(now.0 + ahead))
                        })
                        .collect()
                };
                let out = sundial.schedule_many(specs).await?;
                if out.iter().any(|s| !matches!(s, Scheduled::Created(_))) {
                    bail!("preload: unexpected duplicate");
                }
                let done = start + n;
                let step = (missing / 10).max(100_000);
                if done / step != start / step {
                    eprintln!(
                        "  preload: {done}/{missing} in {:.1}s",
                        watch.elapsed().as_secs_f64()
                    );
                }
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let secs = watch.elapsed().as_secs_f64();
    println!(
        "  preload: added {missing} pending tasks (24-48 h ahead, {order:?} order, {batch} per call) in {secs:.1}s ({:.0} tasks/s); {} in total",
        missing as f64 / secs,
        existing + missing as u64
    );
    Ok(())
}

/// Sleeps until `t` on the given clock.
pub async fn sleep_until(clock: &Arc<dyn Clock>, t: Timestamp) {
    clock.sleep_until(t).await
}
