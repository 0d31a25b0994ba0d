//! `sundial-load`: HTTP load generator for a Sundial server.
//!
//! ```text
//! cargo build --release -p sundial-cli -p sundial-bench
//! target/release/sundial-load lateness                  # the latency targets' scenarios
//! target/release/sundial-load drain --workers 10
//! target/release/sundial-load single
//! target/release/sundial-load --database-url postgres://postgres@127.0.0.1:5432/test lateness
//! target/release/sundial-load --json-out results.jsonl lateness   # also append the JSON line
//! ```
//!
//! The scenarios of the latency targets (the workloads peer job systems were measured with):
//! - `lateness`: `--tasks` (20,000) tasks created in batches of `--batch` (1,000) with `run_at`
//!   uniform over `--from`..`--to` (10–30 s) ahead, while `--workers` (10) workers each poll with
//!   `max: 1` and complete each task before polling again; lateness = the time a worker receives
//!   the task minus its `run_at`. `--pending` more tasks wait a day ahead during the run (the
//!   pending-count axis); the fire rate is `--tasks / (--to - --from)`.
//! - `drain`: `--tasks` (20,000) tasks due now created with no worker running, then `--workers`
//!   (10) workers as above start; rate = tasks / (last receive - first receive).
//!   With `--complete-with-poll` the workers of both complete each task with their next poll
//!   (the poll request's `complete`): one request and one durable commit per task.
//! - `single`: `--producers` (10) concurrent producers, one `POST /v1/tasks` each in a loop, for
//!   `--duration` (15 s) or until `--tasks` creates in all; creates/s and request latency.
//!
//! Older scenarios kept for the figures measured with them: `batch` (many tasks per request),
//! `paced` (a steady rate due shortly after creation, workers taking up to 256 per poll) and
//! `fires` (many tasks due at one moment). Each scenario prints one JSON line (`{"scenario": …}`)
//! with its counts, rate and latency percentiles in ms; `--json-out FILE` appends it to FILE,
//! which `bench/plot.py` draws.
//!
//! Without `--server` it starts `sundial server` (the binary next to this one, so build
//! `sundial-cli` with it) on a fresh temporary data directory per scenario, and removes it
//! afterwards. With `--database-url` the servers it starts run on PostgreSQL instead, in a fresh
//! schema per scenario (dropped afterwards), and `--nodes N` starts N of them on that schema: one
//! cluster. The scenarios then spread their connections, batches and workers round-robin over the
//! nodes. After each scenario it prints the servers' memory (VmRSS, VmHWM) and the load average.
//! The load generator shares the machine with the servers: on a small machine its own CPU use is
//! part of the result.
#![allow(clippy::disallowed_methods)] // a load generator measures real time: Instant/SystemTime

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use sundial_cli::Client;
use sundial_server::wire::{CreateBatch, CreateTask};
use tokio::sync::Mutex;

fn parse_duration(s: &str) -> Result<Duration, String> {
    sundial_server::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(Parser)]
#[command(name = "sundial-load", about = "HTTP load generator for Sundial")]
struct Args {
    /// A running server (or several nodes of one cluster, comma-separated); without it, fresh
    /// servers are started per scenario.
    #[arg(long, global = true)]
    server: Option<String>,
    /// Start the servers on this PostgreSQL (a fresh schema per scenario, dropped afterwards)
    /// instead of the embedded store.
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// How many servers to start on the schema (needs `--database-url` for more than one).
    #[arg(long, global = true, default_value_t = 1)]
    nodes: usize,
    /// Extra arguments for the server this starts (e.g. `--durability normal`).
    #[arg(long, global = true, allow_hyphen_values = true)]
    server_args: Option<String>,
    /// Due times of the create scenarios: `random` over the next 1–25 hours (a random key in the
    /// store's due index, like real timers), or `append`: all one day ahead (keys arrive in order).
    #[arg(long, global = true, value_enum, default_value_t = DueOrder::Random)]
    due: DueOrder,
    /// Also append each scenario's JSON line to this file.
    #[arg(long, global = true)]
    json_out: Option<PathBuf>,
    /// Workers of `lateness` and `drain` complete each task with their next poll (the poll's
    /// `complete`), one request per task instead of two.
    #[arg(long, global = true)]
    complete_with_poll: bool,
    #[command(subcommand)]
    scenario: Option<Scenario>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DueOrder {
    Random,
    Append,
}

#[derive(Subcommand, Clone)]
enum Scenario {
    /// `lateness`, `drain` and `single` with their defaults.
    All,
    /// Fire lateness: tasks due 10–30 s ahead, workers taking one task per poll.
    Lateness {
        #[arg(long, default_value_t = 20_000)]
        tasks: u64,
        /// Tasks per create request.
        #[arg(long, default_value_t = 1_000)]
        batch: usize,
        /// The `run_at` window: uniform from this far ahead…
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        from: Duration,
        /// …to this far ahead.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        to: Duration,
        #[arg(long, default_value_t = 10)]
        workers: usize,
        /// Tasks waiting a day ahead during the run (created first, in batches).
        #[arg(long, default_value_t = 0)]
        pending: u64,
    },
    /// Drain: tasks due now created with no worker, then workers taking one task per poll.
    Drain {
        #[arg(long, default_value_t = 20_000)]
        tasks: u64,
        #[arg(long, default_value_t = 10)]
        workers: usize,
        /// Tasks per create request.
        #[arg(long, default_value_t = 1_000)]
        batch: usize,
    },
    /// One task per request from concurrent producers.
    Single {
        #[arg(long, alias = "connections", default_value_t = 10)]
        producers: usize,
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: Duration,
        /// Stop after this many creates in all (0: run for the whole duration).
        #[arg(long, default_value_t = 0)]
        tasks: u64,
    },
    /// Many tasks per request.
    Batch {
        #[arg(long, default_value_t = 8)]
        connections: usize,
        #[arg(long, default_value_t = 500)]
        batch_size: usize,
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: Duration,
    },
    /// A steady rate of tasks due shortly after creation, workers taking up to 256 per poll.
    Paced {
        /// Tasks due per second.
        #[arg(long, default_value_t = 2_000)]
        rate: u64,
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: Duration,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// How long before its due time each task is created.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        lead: Duration,
    },
    /// Fires/s: many tasks due at one moment, drained by long-poll workers.
    Fires {
        /// Tasks, all due at the same moment.
        #[arg(long, default_value_t = 50_000)]
        count: u64,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// How long after the start the tasks are due (they must all be created by then).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        lead: Duration,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("runtime")?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("machine: {cores} cores (server and load generator share them)");
    let scenarios = match args.scenario.clone().unwrap_or(Scenario::All) {
        Scenario::All => vec![
            Scenario::Lateness {
                tasks: 20_000,
                batch: 1_000,
                from: Duration::from_secs(10),
                to: Duration::from_secs(30),
                workers: 10,
                pending: 0,
            },
            Scenario::Drain {
                tasks: 20_000,
                workers: 10,
                batch: 1_000,
            },
            Scenario::Single {
                producers: 10,
                duration: Duration::from_secs(15),
                tasks: 0,
            },
        ],
        s => vec![s],
    };
    if args.nodes == 0 || (args.nodes > 1 && args.database_url.is_none() && args.server.is_none()) {
        bail!("--nodes above 1 needs --database-url (nodes share the work through PostgreSQL)");
    }
    for (n, s) in scenarios.into_iter().enumerate() {
        let fleet = match &args.server {
            Some(_) => None,
            None => Some(Fleet::start(&rt, &args, n)?),
        };
        let urls: Vec<String> = match (&args.server, &fleet) {
            (Some(u), _) => u.split(',').map(|u| u.trim().to_string()).collect(),
            (None, Some(f)) => f.servers.iter().map(|s| s.url.clone()).collect(),
            (None, None) => bail!("no server"),
        };
        let clients = urls
            .iter()
            .map(|u| Client::new(u).context("client"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        println!(
            "\nservers: {} ({}); load average before: {}",
            urls.len(),
            match (&args.database_url, &fleet) {
                (Some(_), Some(f)) => format!(
                    "PostgreSQL, schema {}",
                    f.schema.as_ref().map_or("?", |s| s.name.as_str())
                ),
                (None, Some(_)) => "embedded store".to_string(),
                (_, None) => "given with --server".to_string(),
            },
            loadavg()
        );
        let commits_before = match &args.database_url {
            Some(url) => rt.block_on(commits(url)).ok(),
            None => None,
        };
        let scenario_start = Instant::now();
        let store = match (&args.server, &args.database_url) {
            (Some(_), _) => "given",
            (None, Some(_)) => "postgres",
            (None, None) => "embedded",
        };
        let report = Report {
            store,
            nodes: urls.len(),
            json_out: args.json_out.clone(),
            complete_with_poll: args.complete_with_poll,
        };
        let result = rt.block_on(async {
            match s {
                Scenario::Lateness {
                    tasks,
                    batch,
                    from,
                    to,
                    workers,
                    pending,
                } => {
                    lateness_window(
                        &clients,
                        &report,
                        LatenessArgs {
                            tasks,
                            batch,
                            from,
                            to,
                            workers,
                            pending,
                        },
                    )
                    .await
                }
                Scenario::Drain {
                    tasks,
                    workers,
                    batch,
                } => drain(&clients, &report, tasks, workers, batch).await,
                Scenario::Single {
                    producers,
                    duration,
                    tasks,
                } => single(&clients, &report, producers, duration, tasks, args.due).await,
                Scenario::Batch {
                    connections,
                    batch_size,
                    duration,
                } => batch(&clients, connections, batch_size, duration, args.due).await,
                Scenario::Paced {
                    rate,
                    duration,
                    workers,
                    lead,
                } => lateness(&clients, rate, duration, workers, lead).await,
                Scenario::Fires {
                    count,
                    workers,
                    lead,
                } => fires(&clients, count, workers, lead).await,
                Scenario::All => Ok(()),
            }
        });
        println!("load average after: {}", loadavg());
        if let (Some(url), Some(before)) = (&args.database_url, commits_before)
            && let Ok(after) = rt.block_on(commits(url))
        {
            let secs = scenario_start.elapsed().as_secs_f64();
            println!(
                "database: {} commits in {secs:.1}s = {:.0}/s (the whole database's, so other clients' too)",
                after - before,
                (after - before) as f64 / secs
            );
        }
        if let Some(f) = fleet {
            f.print_memory();
            f.stop(&rt);
        }
        result?;
    }
    Ok(())
}

/// `/proc/loadavg`'s 1, 5 and 15 minute figures.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_string())
}

/// The servers one scenario runs against, and the PostgreSQL schema they share.
struct Fleet {
    servers: Vec<SpawnedServer>,
    schema: Option<PgSchema>,
}

struct PgSchema {
    url: String,
    name: String,
}

impl Fleet {
    /// Starts `--nodes` servers (on a fresh schema with `--database-url`) and, on PostgreSQL,
    /// waits until they have taken every shard between them.
    fn start(rt: &tokio::runtime::Runtime, args: &Args, scenario: usize) -> anyhow::Result<Fleet> {
        let extra = args.server_args.as_deref().unwrap_or("");
        let schema = args.database_url.as_ref().map(|url| PgSchema {
            url: url.clone(),
            name: format!("sundial_load_{}_{scenario}", std::process::id()),
        });
        let mut fleet = Fleet {
            servers: Vec::new(),
            schema,
        };
        for i in 0..args.nodes {
            let mut node_args: Vec<String> = extra.split_whitespace().map(str::to_string).collect();
            if let Some(s) = &fleet.schema {
                node_args.extend([
                    "--database-url".to_string(),
                    s.url.clone(),
                    "--database-schema".to_string(),
                    s.name.clone(),
                    "--node-id".to_string(),
                    format!("load-{}", i + 1),
                ]);
            }
            // On failure `fleet` is dropped: the servers started so far are killed.
            fleet.servers.push(SpawnedServer::start(&node_args)?);
        }
        if let Some(s) = &fleet.schema {
            rt.block_on(wait_for_shards(s, args.nodes))?;
        }
        Ok(fleet)
    }

    fn print_memory(&self) {
        for (i, s) in self.servers.iter().enumerate() {
            let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id()))
                .unwrap_or_default();
            let field = |name: &str| -> String {
                status
                    .lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
                    .map_or("?".to_string(), |kb| format!("{:.1}", kb / 1024.0))
            };
            // User and system CPU since the server started (`/proc/PID/stat` fields 14 and 15,
            // in clock ticks of 1/100 s on Linux), a figure the machine's other work moves less
            // than wall-clock time.
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", s.child.id())).unwrap_or_default();
            let ticks: Vec<f64> = stat
                .rsplit_once(')')
                .map(|(_, rest)| {
                    rest.split_whitespace()
                        .skip(11)
                        .take(2)
                        .filter_map(|v| v.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            let cpu = match ticks.as_slice() {
                [u, s] => format!("{:.2} s user + {:.2} s system", u / 100.0, s / 100.0),
                _ => "?".to_string(),
            };
            println!(
                "server {}: rss {} MiB, peak rss (VmHWM) {} MiB, cpu {cpu}",
                i + 1,
                field("VmRSS:"),
                field("VmHWM:")
            );
        }
    }

    /// Stops the servers, then drops the schema.
    fn stop(mut self, rt: &tokio::runtime::Runtime) {
        self.servers.clear();
        if let Some(s) = self.schema.take() {
            let dropped = rt.block_on(async {
                let client = pg_connect(&s.url).await?;
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", s.name))
                    .await
                    .context("drop the schema")
            });
            if let Err(e) = dropped {
                eprintln!("could not drop schema {}: {e:#}", s.name);
            }
        }
    }
}

async fn pg_connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connect to PostgreSQL")?;
    tokio::spawn(conn);
    Ok(client)
}

/// Transactions committed in the current database so far (`pg_stat_database`).
async fn commits(url: &str) -> anyhow::Result<i64> {
    let client = pg_connect(url).await?;
    let row = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .context("read pg_stat_database")?;
    Ok(row.get(0))
}

/// Waits (at most a minute) until every shard has an owner and every node owns some.
async fn wait_for_shards(s: &PgSchema, nodes: usize) -> anyhow::Result<()> {
    let client = pg_connect(&s.url).await?;
    let sql = format!(
        "SELECT (SELECT shard_count FROM \"{0}\".cluster_meta), \
         count(*) FILTER (WHERE owner IS NOT NULL), count(DISTINCT owner) \
         FROM \"{0}\".shard_leases",
        s.name
    );
    let start = Instant::now();
    loop {
        let row = client
            .query_one(&sql, &[])
            .await
            .context("read the shard leases")?;
        let (shards, owned, owners): (Option<i64>, i64, i64) = (row.get(0), row.get(1), row.get(2));
        if shards == Some(owned) && owners == nodes as i64 {
            println!(
                "{nodes} node(s) own all {owned} shards after {:.1}s",
                start.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("after 60 s, {owned} of {shards:?} shards owned by {owners} of {nodes} nodes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct SpawnedServer {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl SpawnedServer {
    fn start(extra: &[String]) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("current_exe")?;
        let bin = exe.with_file_name("sundial");
        let dir = std::env::temp_dir().join(format!(
            "sundial-load-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let mut child = Command::new(&bin)
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().context("server exited")?.context("read")?;
        std::thread::spawn(move || for _ in lines {});
        let url = line
            .strip_prefix("sundial listening on ")
            .context("unexpected server output")?
            .trim()
            .to_string();
        Ok(SpawnedServer { child, url, dir })
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A due time uniformly over the next 1–25 hours, like real timers (and like the kernel
/// benchmark): a random key in the due index costs the store more than an appended one.
fn random_delay(seed: &mut u64, due: DueOrder) -> String {
    if due == DueOrder::Append {
        return "1d".to_string();
    }
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    format!("{}ms", 3_600_000 + *seed % 86_400_000)
}

fn hist() -> Histogram<u64> {
    // Constant, valid bounds: 1 µs to 10 min at 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn ms(us: u64) -> f64 {
    us as f64 / 1_000.0
}

/// What the producers of a create scenario did.
struct Produced {
    /// Tasks created.
    ok: u64,
    /// Requests that failed.
    errors: u64,
    seconds: f64,
    /// Request latencies (µs).
    latency: Histogram<u64>,
}

/// Runs `connections` producers, spread round-robin over `clients`, until `duration` has passed
/// or `cap` requests (0: no cap) have started. Each request is what `request(client, producer, n,
/// seed)` returns (`n` counts the producer's requests, `seed` is its own random state); it answers
/// how many tasks it created, and its latency is recorded. The first three failures are printed,
/// prefixed with `what`.
async fn produce<F, Fut>(
    clients: &[Client],
    connections: usize,
    duration: Duration,
    cap: u64,
    what: &'static str,
    request: F,
) -> anyhow::Result<Produced>
where
    F: Fn(&Client, usize, u64, &mut u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send,
{
    let started = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, ok, errors, latencies, started, request) = (
            clients[c % clients.len()].clone(),
            ok.clone(),
            errors.clone(),
            latencies.clone(),
            started.clone(),
            request.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = hist();
            let mut n = 0u64;
            let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (c as u64 + 1);
            while Instant::now() < end {
                if cap > 0 && started.fetch_add(1, Ordering::Relaxed) >= cap {
                    break;
                }
                let call = request(&client, c, n, &mut seed);
                n += 1;
                let t0 = Instant::now();
                match call.await {
                    Ok(created) => {
                        ok.fetch_add(created, Ordering::Relaxed);
                        let _ = local.record(t0.elapsed().as_micros() as u64);
                    }
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("{what} failed: {e}");
                        }
                    }
                }
            }
            let _ = latencies.lock().await.add(&local);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let latency = latencies.lock().await.clone();
    Ok(Produced {
        ok: ok.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        seconds,
        latency,
    })
}

async fn single(
    clients: &[Client],
    report: &Report,
    connections: usize,
    duration: Duration,
    cap: u64,
    due: DueOrder,
) -> anyhow::Result<()> {
    println!(
        "\n== single: one task per request, {connections} producers over {} node(s), {duration:?}, due times {due:?}",
        clients.len()
    );
    let p = produce(
        clients,
        connections,
        duration,
        cap,
        "create",
        move |client, c, n, seed| {
            let req = CreateTask {
                queue: Some("bench".into()),
                payload: Some(serde_json::json!({"c": c, "n": n})),
                delay: Some(random_delay(seed, due)),
                ..CreateTask::new("bench.single")
            };
            let client = client.clone();
            async move {
                client.create(&req).await?;
                Ok(1)
            }
        },
    )
    .await?;
    let (ok, elapsed, l) = (p.ok, p.seconds, &p.latency);
    println!(
        "created {ok} in {elapsed:.1}s = {:.0} creates/s; errors {}; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ok as f64 / elapsed,
        p.errors,
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.99)),
        ms(l.max()),
    );
    report.emit(serde_json::json!({
        "scenario": "single",
        "producers": connections,
        "created": ok,
        "errors": p.errors,
        "seconds": elapsed,
        "rate_per_s": ok as f64 / elapsed,
        "latency_ms": percentiles(l),
    }))
}

async fn batch(
    clients: &[Client],
    connections: usize,
    batch_size: usize,
    duration: Duration,
    due: DueOrder,
) -> anyhow::Result<()> {
    println!(
        "\n== batch: {batch_size} tasks per request, {connections} connections over {} node(s), {duration:?}, due times {due:?}",
        clients.len()
    );
    let p = produce(
        clients,
        connections,
        duration,
        0,
        "batch",
        move |client, c, n, seed| {
            let tasks = (0..batch_size)
                .map(|i| CreateTask {
                    queue: Some("bench".into()),
                    payload: Some(serde_json::json!({"c": c, "n": n, "i": i})),
                    delay: Some(random_delay(seed, due)),
                    ..CreateTask::new("bench.batch")
                })
                .collect();
            let client = client.clone();
            async move {
                let r = client.create_batch(&CreateBatch { tasks }).await?;
                Ok(r.results.len() as u64)
            }
        },
    )
    .await?;
    let (ok, elapsed, l) = (p.ok, p.seconds, &p.latency);
    println!(
        "created {ok} in {elapsed:.1}s = {:.0} tasks/s; failed requests {}; request latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ok as f64 / elapsed,
        p.errors,
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.99)),
        ms(l.max()),
    );
    Ok(())
}

fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Long-poll workers on a queue, spread round-robin over the nodes, that complete every task they
/// get (each with its own request) and record when they got it against its `run_at`.
struct Pollers {
    handles: Vec<tokio::task::JoinHandle<()>>,
    lateness: Arc<Mutex<Histogram<u64>>>,
    early: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    /// Wall clock (µs) of the latest delivery.
    last_us: Arc<AtomicI64>,
    done: Arc<AtomicBool>,
}

impl Pollers {
    fn start(clients: &[Client], workers: usize, queue: &'static str) -> Pollers {
        let p = Pollers {
            handles: Vec::new(),
            lateness: Arc::new(Mutex::new(hist())),
            early: Arc::new(AtomicU64::new(0)),
            received: Arc::new(AtomicU64::new(0)),
            last_us: Arc::new(AtomicI64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
        };
        let mut handles = Vec::new();
        for w in 0..workers {
            let (client, lateness, early, received, last_us, done) = (
                clients[w % clients.len()].clone(),
                p.lateness.clone(),
                p.early.clone(),
                p.received.clone(),
                p.last_us.clone(),
                p.done.clone(),
            );
            handles.push(tokio::spawn(async move {
                let name = format!("load-{w}");
                let completes = Arc::new(tokio::sync::Semaphore::new(64));
                let mut local = hist();
                while !done.load(Ordering::Relaxed) {
                    let polled = match client
                        .poll(queue, &name, 256, Duration::from_secs(1), None)
                        .await
                    {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("poll failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let now = wall_us();
                    if !polled.tasks.is_empty() {
                        last_us.fetch_max(now, Ordering::Relaxed);
                    }
                    for t in polled.tasks {
                        let due_us = sundial_server::time::parse(&t.run_at)
                            .map(|ts| ts.as_millis() * 1_000)
                            .unwrap_or(now);
                        let late = now - due_us;
                        if late < 0 {
                            early.fetch_add(1, Ordering::Relaxed);
                        } else {
                            let _ = local.record((late as u64).max(1));
                        }
                        received.fetch_add(1, Ordering::Relaxed);
                        let Ok(permit) = completes.clone().acquire_owned().await else {
                            break;
                        };
                        let client = client.clone();
                        tokio::spawn(async move {
                            let _ = client.complete(t.id, t.execution_id, None).await;
                            drop(permit);
                        });
                    }
                }
                let _ = lateness.lock().await.add(&local);
            }));
        }
        Pollers { handles, ..p }
    }

    /// Waits until `expected` tasks were delivered or the wall clock passes `give_up_us`, then
    /// stops the workers.
    async fn finish(self, expected: u64, give_up_us: i64) -> anyhow::Result<Histogram<u64>> {
        while self.received.load(Ordering::Relaxed) < expected && wall_us() < give_up_us {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.done.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.await?;
        }
        Ok(self.lateness.lock().await.clone())
    }
}

async fn lateness(
    clients: &[Client],
    rate: u64,
    duration: Duration,
    workers: usize,
    lead: Duration,
) -> anyhow::Result<()> {
    let total = rate * duration.as_secs().max(1);
    println!(
        "\n== lateness: {rate} tasks/s due for {duration:?} ({total} tasks), {workers} long-poll workers over {} node(s), created {lead:?} ahead",
        clients.len()
    );
    // Tasks are created in batches of one tick's worth (every 10 ms), `lead` before they are due,
    // round-robin over the nodes.
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let first_due_us = wall_us() + lead.as_micros() as i64 + 500_000;
    let queue = "lateness";
    let pollers = Pollers::start(clients, workers, queue);

    // Producer: paced by the wall clock.
    let start = Instant::now();
    let ticks = total / per_tick;
    let mut create_errors = 0u64;
    for k in 0..ticks {
        let due0 = first_due_us + (k as i64) * tick.as_micros() as i64;
        let send_at_us = due0 - lead.as_micros() as i64;
        let wait = send_at_us - wall_us();
        if wait > 0 {
            tokio::time::sleep(Duration::from_micros(wait as u64)).await;
        }
        let tasks = (0..per_tick)
            .map(|i| {
                let due_us = due0 + (i as i64) * (tick.as_micros() as i64) / per_tick as i64;
                CreateTask {
                    queue: Some(queue.into()),
                    run_at: Some(sundial_server::time::format(
                        sundial::Timestamp::from_millis(due_us / 1_000),
                    )),
                    ..CreateTask::new("bench.fire")
                }
            })
            .collect();
        let client = clients[k as usize % clients.len()].clone();
        // Fire and forget, so that a slow create does not delay the next tick.
        let h = tokio::spawn(async move { client.create_batch(&CreateBatch { tasks }).await });
        if k % 100 == 99 {
            // Keep an eye on errors without holding up the pace.
            if let Ok(Err(e)) = h.await {
                create_errors += 1;
                eprintln!("create failed: {e}");
            }
        }
    }
    // Wait for the last tasks to come due and be delivered.
    let last_due_us = first_due_us + (ticks as i64) * tick.as_micros() as i64;
    let early = pollers.early.clone();
    let received = pollers.received.clone();
    let l = pollers
        .finish(ticks * per_tick, last_due_us + 30_000_000)
        .await?;
    let got = received.load(Ordering::Relaxed);
    println!(
        "delivered {got}/{} over {:.1}s; lateness p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms; early {}; create errors (sampled) {create_errors}",
        ticks * per_tick,
        start.elapsed().as_secs_f64(),
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.99)),
        ms(l.value_at_quantile(0.999)),
        ms(l.max()),
        early.load(Ordering::Relaxed),
    );
    Ok(())
}

/// Fires/s: `count` tasks all due at one moment, `lead` after the start (created before that in
/// batches of 500 from 8 connections, round-robin over the nodes), drained by `workers` long-poll
/// workers that complete each one. The rate is the tasks delivered divided by the time from the
/// due moment to the last delivery.
async fn fires(
    clients: &[Client],
    count: u64,
    workers: usize,
    lead: Duration,
) -> anyhow::Result<()> {
    println!(
        "\n== fires: {count} tasks all due {lead:?} after the start, {workers} long-poll workers over {} node(s)",
        clients.len()
    );
    let due_ms = (wall_us() + lead.as_micros() as i64) / 1_000;
    let queue = "fires";
    let batch = 500u64;
    let next = Arc::new(AtomicU64::new(0));
    let created = Arc::new(AtomicU64::new(0));
    let mut creators = Vec::new();
    for c in 0..8 {
        let (client, next, created) = (
            clients[c % clients.len()].clone(),
            next.clone(),
            created.clone(),
        );
        creators.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= count {
                    return;
                }
                let n = batch.min(count - from);
                let tasks = (0..n)
                    .map(|_| CreateTask {
                        queue: Some(queue.into()),
                        run_at: Some(sundial_server::time::format(
                            sundial::Timestamp::from_millis(due_ms),
                        )),
                        ..CreateTask::new("bench.fires")
                    })
                    .collect();
                match client.create_batch(&CreateBatch { tasks }).await {
                    Ok(r) => {
                        created.fetch_add(r.results.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("create failed: {e}"),
                }
            }
        }));
    }
    let pollers = Pollers::start(clients, workers, queue);
    for c in creators {
        c.await?;
    }
    let created = created.load(Ordering::Relaxed);
    let ready_us = wall_us();
    if ready_us > due_ms * 1_000 {
        println!(
            "warning: creating took {:.1} s past the due moment; raise --lead",
            (ready_us - due_ms * 1_000) as f64 / 1e6
        );
    }
    let (received, last_us, early) = (
        pollers.received.clone(),
        pollers.last_us.clone(),
        pollers.early.clone(),
    );
    let l = pollers
        .finish(created, due_ms * 1_000 + 300_000_000)
        .await?;
    let got = received.load(Ordering::Relaxed);
    let secs = (last_us.load(Ordering::Relaxed) - due_ms * 1_000) as f64 / 1e6;
    println!(
        "created {created}; delivered {got} in {secs:.2}s after the due moment = {:.0} fires/s; lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; early {}",
        got as f64 / secs.max(1e-3),
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.99)),
        ms(l.max()),
        early.load(Ordering::Relaxed),
    );
    Ok(())
}

/// Where a scenario's JSON line goes: stdout always, and `--json-out` when given.
struct Report {
    store: &'static str,
    nodes: usize,
    json_out: Option<PathBuf>,
    /// Workers complete with their next poll (`--complete-with-poll`).
    complete_with_poll: bool,
}

impl Report {
    fn emit(&self, mut line: serde_json::Value) -> anyhow::Result<()> {
        if let Some(o) = line.as_object_mut() {
            o.insert("store".into(), self.store.into());
            o.insert("nodes".into(), self.nodes.into());
            if self.complete_with_poll {
                o.insert("complete_with_poll".into(), true.into());
            }
            o.insert("load_average".into(), loadavg().into());
        }
        let text = line.to_string();
        println!("{text}");
        if let Some(path) = &self.json_out {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open {}", path.display()))?;
            writeln!(f, "{text}").with_context(|| format!("write {}", path.display()))?;
        }
        Ok(())
    }
}

/// p50/p90/p99/max of a histogram of µs, in ms.
fn percentiles(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "p50": ms(h.value_at_quantile(0.5)),
        "p90": ms(h.value_at_quantile(0.9)),
        "p99": ms(h.value_at_quantile(0.99)),
        "max": ms(h.max()),
    })
}

/// Creates `total` tasks of `queue` in batches of `batch` (8 requests at once, round-robin over
/// the nodes), each due at `due_ms(i)`. Answers how many were created.
async fn create_all(
    clients: &[Client],
    queue: &'static str,
    total: u64,
    batch: usize,
    due_ms: Arc<dyn Fn(u64) -> i64 + Send + Sync>,
) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let created = Arc::new(AtomicU64::new(0));
    let batch = batch.max(1) as u64;
    let mut creators = Vec::new();
    for c in 0..8 {
        let (client, next, created, due_ms) = (
            clients[c % clients.len()].clone(),
            next.clone(),
            created.clone(),
            due_ms.clone(),
        );
        creators.push(tokio::spawn(async move {
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= total {
                    return;
                }
                let tasks = (from..total.min(from + batch))
                    .map(|i| CreateTask {
                        queue: Some(queue.into()),
                        run_at: Some(sundial_server::time::format(
                            sundial::Timestamp::from_millis(due_ms(i)),
                        )),
                        ..CreateTask::new("bench.load")
                    })
                    .collect();
                match client.create_batch(&CreateBatch { tasks }).await {
                    Ok(r) => {
                        created.fetch_add(r.results.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("create failed: {e}"),
                }
            }
        }));
    }
    for c in creators {
        let _ = c.await;
    }
    created.load(Ordering::Relaxed)
}

/// Workers as the peers' benchmarks run them: each polls with `max: 1` and completes its task
/// before it polls again (with `fused`, in the same request as that poll). Records lateness
/// (receipt − `run_at`) and the first and last receipt.
struct OneByOne {
    handles: Vec<tokio::task::JoinHandle<()>>,
    lateness: Arc<Mutex<Histogram<u64>>>,
    early: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    first_us: Arc<AtomicI64>,
    last_us: Arc<AtomicI64>,
    done: Arc<AtomicBool>,
}

impl OneByOne {
    fn start(clients: &[Client], workers: usize, queue: &'static str, fused: bool) -> OneByOne {
        let mut p = OneByOne {
            handles: Vec::new(),
            lateness: Arc::new(Mutex::new(hist())),
            early: Arc::new(AtomicU64::new(0)),
            received: Arc::new(AtomicU64::new(0)),
            first_us: Arc::new(AtomicI64::new(i64::MAX)),
            last_us: Arc::new(AtomicI64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
        };
        for w in 0..workers {
            let (client, lateness, early, received, first_us, last_us, done) = (
                clients[w % clients.len()].clone(),
                p.lateness.clone(),
                p.early.clone(),
                p.received.clone(),
                p.first_us.clone(),
                p.last_us.clone(),
                p.done.clone(),
            );
            p.handles.push(tokio::spawn(async move {
                let name = format!("load-{w}");
                let mut local = hist();
                // The task run last, completed with the next poll (`fused`).
                let mut ran: Option<(uuid::Uuid, uuid::Uuid)> = None;
                while !done.load(Ordering::Relaxed) {
                    let wait = Duration::from_secs(1);
                    let answer = match ran.take() {
                        Some((id, execution)) => {
                            client
                                .complete_and_poll(id, execution, None, queue, &name, 1, wait)
                                .await
                        }
                        None => client.poll(queue, &name, 1, wait, None).await,
                    };
                    let polled = match answer {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("poll failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let now = wall_us();
                    for t in polled.tasks {
                        first_us.fetch_min(now, Ordering::Relaxed);
                        last_us.fetch_max(now, Ordering::Relaxed);
                        let due_us = sundial_server::time::parse(&t.run_at)
                            .map(|ts| ts.as_millis() * 1_000)
                            .unwrap_or(now);
                        let late = now - due_us;
                        if late < 0 {
                            early.fetch_add(1, Ordering::Relaxed);
                        } else {
                            let _ = local.record((late as u64).max(1));
                        }
                        received.fetch_add(1, Ordering::Relaxed);
                        if fused && ran.is_none() {
                            ran = Some((t.id, t.execution_id));
                        } else if let Err(e) = client.complete(t.id, t.execution_id, None).await {
                            eprintln!("complete failed: {e}");
                        }
                    }
                }
                if let Some((id, execution)) = ran
                    && let Err(e) = client.complete(id, execution, None).await
                {
                    eprintln!("complete failed: {e}");
                }
                let _ = lateness.lock().await.add(&local);
            }));
        }
        p
    }

    /// Waits until `expected` tasks were received or the wall clock passes `give_up_us`, then
    /// stops the workers.
    async fn finish(self, expected: u64, give_up_us: i64) -> anyhow::Result<Histogram<u64>> {
        while self.received.load(Ordering::Relaxed) < expected && wall_us() < give_up_us {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.done.store(true, Ordering::Relaxed);
        for h in self.handles {
            h.await?;
        }
        Ok(self.lateness.lock().await.clone())
    }
}

struct LatenessArgs {
    tasks: u64,
    batch: usize,
    from: Duration,
    to: Duration,
    workers: usize,
    pending: u64,
}

/// The issue's lateness workload: `tasks` tasks created in batches with `run_at` uniform over
/// `from..to` ahead, `workers` workers taking one task per poll.
async fn lateness_window(
    clients: &[Client],
    report: &Report,
    a: LatenessArgs,
) -> anyhow::Result<()> {
    if a.to <= a.from {
        bail!("--to must be later than --from");
    }
    println!(
        "\n== lateness: {} tasks in batches of {}, run_at uniform {:?}..{:?} ahead, {} workers (max 1 per poll) over {} node(s), {} pending a day ahead",
        a.tasks,
        a.batch,
        a.from,
        a.to,
        a.workers,
        clients.len(),
        a.pending
    );
    if a.pending > 0 {
        let day_ms = wall_us() / 1_000 + 86_400_000;
        let n = create_all(
            clients,
            "pending",
            a.pending,
            a.batch,
            Arc::new(move |_| day_ms),
        )
        .await;
        println!("{n} pending tasks stored a day ahead");
    }
    let workers = OneByOne::start(clients, a.workers, "lateness", report.complete_with_poll);
    let start_ms = wall_us() / 1_000;
    let (from_ms, span_ms) = (
        a.from.as_millis() as i64,
        (a.to - a.from).as_millis() as i64,
    );
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let dues: Arc<Vec<i64>> = Arc::new(
        (0..a.tasks)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                start_ms + from_ms + (seed % span_ms.max(1) as u64) as i64
            })
            .collect(),
    );
    let d = dues.clone();
    let created = create_all(
        clients,
        "lateness",
        a.tasks,
        a.batch,
        Arc::new(move |i| d[i as usize]),
    )
    .await;
    let created_in = wall_us() / 1_000 - start_ms;
    if created_in > from_ms {
        println!("warning: creating took {created_in} ms, past the window's start");
    }
    let (early, received) = (workers.early.clone(), workers.received.clone());
    let last_due_us = (start_ms + from_ms + span_ms) * 1_000;
    let l = workers.finish(created, last_due_us + 60_000_000).await?;
    let got = received.load(Ordering::Relaxed);
    let rate = a.tasks as f64 / (span_ms as f64 / 1_000.0);
    println!(
        "delivered {got}/{created}; lateness p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms; early {}; fire rate {rate:.0}/s",
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.9)),
        ms(l.value_at_quantile(0.99)),
        ms(l.max()),
        early.load(Ordering::Relaxed),
    );
    report.emit(serde_json::json!({
        "scenario": "lateness",
        "tasks": a.tasks,
        "created": created,
        "received": got,
        "early": early.load(Ordering::Relaxed),
        "workers": a.workers,
        "pending": a.pending,
        "window_s": [a.from.as_secs_f64(), a.to.as_secs_f64()],
        "fire_rate_per_s": rate,
        "lateness_ms": percentiles(&l),
    }))
}

/// The issue's drain workload: `tasks` due now, created with no worker running; then `workers`
/// workers (one task per poll); rate = tasks / (last receipt − first receipt).
async fn drain(
    clients: &[Client],
    report: &Report,
    tasks: u64,
    workers: usize,
    batch: usize,
) -> anyhow::Result<()> {
    println!(
        "\n== drain: {tasks} tasks due now, then {workers} workers (max 1 per poll) over {} node(s)",
        clients.len()
    );
    let now_ms = wall_us() / 1_000;
    let created = create_all(clients, "drain", tasks, batch, Arc::new(move |_| now_ms)).await;
    println!("{created} tasks created; starting the workers");
    let w = OneByOne::start(clients, workers, "drain", report.complete_with_poll);
    let (received, first, last, early) = (
        w.received.clone(),
        w.first_us.clone(),
        w.last_us.clone(),
        w.early.clone(),
    );
    let l = w.finish(created, wall_us() + 600_000_000).await?;
    let got = received.load(Ordering::Relaxed);
    let secs = (last.load(Ordering::Relaxed) - first.load(Ordering::Relaxed)) as f64 / 1e6;
    let rate = got as f64 / secs.max(1e-3);
    println!("received {got}/{created} in {secs:.2}s between first and last = {rate:.0} tasks/s");
    report.emit(serde_json::json!({
        "scenario": "drain",
        "tasks": tasks,
        "created": created,
        "received": got,
        "early": early.load(Ordering::Relaxed),
        "workers": workers,
        "seconds": secs,
        "rate_per_s": rate,
        "lateness_ms": percentiles(&l),
    }))
}
