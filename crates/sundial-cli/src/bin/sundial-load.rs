//! `sundial-load`: HTTP load generator for a Sundial server.
//!
//! ```text
//! cargo build --release -p sundial-cli
//! target/release/sundial-load                 # all scenarios, each on a fresh server it starts
//! target/release/sundial-load single --duration 20s
//! target/release/sundial-load --server http://127.0.0.1:7373 lateness --rate 2000
//! target/release/sundial-load --server-args "--durability normal" lateness
//! ```
//!
//! Scenarios:
//! - `single`: creates one task per request from `--connections` (64) concurrent connections;
//!   reports creates/s and request latency. Due times are random over the next 1–25 hours (as in
//!   the kernel benchmark), so nothing comes due during the run.
//! - `batch`: creates `--batch-size` (500) tasks per `POST /v1/tasks:batch` from `--connections`
//!   (8) connections; reports tasks/s.
//! - `lateness`: schedules `--rate` (2,000) tasks/s for `--duration` (10 s), each due shortly
//!   after it is created, while `--workers` (4) long-poll workers take them and complete them;
//!   reports fire lateness (time the worker received the task minus its `run_at`) p50/p99/max.
//!
//! Without `--server` it starts `sundial server` (the binary next to this one) on a fresh
//! temporary data directory per scenario, and removes it afterwards. The load generator shares the
//! machine with the server: on a small machine its own CPU use is part of the result.
#![allow(clippy::disallowed_methods)] // a load generator measures real time: Instant/SystemTime

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// A running server; without it, a fresh server is started per scenario.
    #[arg(long, global = true)]
    server: Option<String>,
    /// Extra arguments for the server this starts (e.g. `--durability normal`).
    #[arg(long, global = true, allow_hyphen_values = true)]
    server_args: Option<String>,
    /// Due times of the create scenarios: `random` over the next 1–25 hours (a random key in the
    /// store's due index, like real timers), or `append`: all one day ahead (keys arrive in order).
    #[arg(long, global = true, value_enum, default_value_t = DueOrder::Random)]
    due: DueOrder,
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
    /// Every scenario with its defaults.
    All,
    /// One task per request.
    Single {
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        duration: Duration,
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
    /// Fire lateness of tasks delivered to long-poll workers.
    Lateness {
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
            Scenario::Single {
                connections: 64,
                duration: Duration::from_secs(15),
            },
            Scenario::Batch {
                connections: 8,
                batch_size: 500,
                duration: Duration::from_secs(15),
            },
            Scenario::Lateness {
                rate: 2_000,
                duration: Duration::from_secs(15),
                workers: 4,
                lead: Duration::from_secs(1),
            },
        ],
        s => vec![s],
    };
    for s in scenarios {
        let spawned = match &args.server {
            Some(_) => None,
            None => Some(SpawnedServer::start(
                args.server_args.as_deref().unwrap_or(""),
            )?),
        };
        let url = match (&args.server, &spawned) {
            (Some(u), _) => u.clone(),
            (None, Some(s)) => s.url.clone(),
            (None, None) => bail!("no server"),
        };
        let client = Client::new(&url).context("client")?;
        rt.block_on(async {
            match s {
                Scenario::Single {
                    connections,
                    duration,
                } => single(&client, connections, duration, args.due).await,
                Scenario::Batch {
                    connections,
                    batch_size,
                    duration,
                } => batch(&client, connections, batch_size, duration, args.due).await,
                Scenario::Lateness {
                    rate,
                    duration,
                    workers,
                    lead,
                } => lateness(&client, rate, duration, workers, lead).await,
                Scenario::All => Ok(()),
            }
        })?;
        drop(spawned);
    }
    Ok(())
}

struct SpawnedServer {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl SpawnedServer {
    fn start(extra: &str) -> anyhow::Result<Self> {
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
            .args(extra.split_whitespace())
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

async fn single(
    client: &Client,
    connections: usize,
    duration: Duration,
    due: DueOrder,
) -> anyhow::Result<()> {
    println!(
        "\n== single: one task per request, {connections} connections, {duration:?}, due times {due:?}"
    );
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, ok, errors, latencies) = (
            client.clone(),
            ok.clone(),
            errors.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = hist();
            let mut n = 0u64;
            let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (c as u64 + 1);
            while Instant::now() < end {
                let req = CreateTask {
                    queue: Some("bench".into()),
                    payload: Some(serde_json::json!({"c": c, "n": n})),
                    delay: Some(random_delay(&mut seed, due)),
                    ..CreateTask::new("bench.single")
                };
                n += 1;
                let t0 = Instant::now();
                match client.create(&req).await {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        let _ = local.record(t0.elapsed().as_micros() as u64);
                    }
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("create failed: {e}");
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
    let elapsed = start.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    let l = latencies.lock().await;
    println!(
        "created {ok} in {elapsed:.1}s = {:.0} creates/s; errors {}; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ok as f64 / elapsed,
        errors.load(Ordering::Relaxed),
        ms(l.value_at_quantile(0.5)),
        ms(l.value_at_quantile(0.99)),
        ms(l.max()),
    );
    Ok(())
}

async fn batch(
    client: &Client,
    connections: usize,
    batch_size: usize,
    duration: Duration,
    due: DueOrder,
) -> anyhow::Result<()> {
    println!(
        "\n== batch: {batch_size} tasks per request, {connections} connections, {duration:?}, due times {due:?}"
    );
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(hist()));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, ok, errors, latencies) = (
            client.clone(),
            ok.clone(),
            errors.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = hist();
            let mut n = 0u64;
            let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (c as u64 + 1);
            while Instant::now() < end {
                let tasks = (0..batch_size)
                    .map(|i| CreateTask {
                        queue: Some("bench".into()),
                        payload: Some(serde_json::json!({"c": c, "n": n, "i": i})),
                        delay: Some(random_delay(&mut seed, due)),
                        ..CreateTask::new("bench.batch")
                    })
                    .collect();
                n += 1;
                let t0 = Instant::now();
                match client.create_batch(&CreateBatch { tasks }).await {
                    Ok(r) => {
                        ok.fetch_add(r.results.len() as u64, Ordering::Relaxed);
                        let _ = local.record(t0.elapsed().as_micros() as u64);
                    }
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("batch failed: {e}");
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
    let elapsed = start.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    let l = latencies.lock().await;
    println!(
        "created {ok} in {elapsed:.1}s = {:.0} tasks/s; failed requests {}; request latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ok as f64 / elapsed,
        errors.load(Ordering::Relaxed),
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

async fn lateness(
    client: &Client,
    rate: u64,
    duration: Duration,
    workers: usize,
    lead: Duration,
) -> anyhow::Result<()> {
    let total = rate * duration.as_secs().max(1);
    println!(
        "\n== lateness: {rate} tasks/s due for {duration:?} ({total} tasks), {workers} long-poll workers, created {lead:?} ahead"
    );
    // Tasks are created in batches of one tick's worth (every 10 ms), `lead` before they are due.
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let first_due_us = wall_us() + lead.as_micros() as i64 + 500_000;
    let lateness = Arc::new(Mutex::new(hist()));
    let early = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let queue = "lateness";

    let mut pollers = Vec::new();
    for w in 0..workers {
        let (client, lateness, early, received, done) = (
            client.clone(),
            lateness.clone(),
            early.clone(),
            received.clone(),
            done.clone(),
        );
        pollers.push(tokio::spawn(async move {
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
        let client = client.clone();
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
    let give_up = last_due_us + 30_000_000;
    while received.load(Ordering::Relaxed) < ticks * per_tick && wall_us() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done.store(true, Ordering::Relaxed);
    for p in pollers {
        p.await?;
    }
    let l = lateness.lock().await;
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
