//! Push delivery: how late Sundial's HTTP calls reach a receiver, how many calls a second it
//! sustains, and whether a slow receiver holds a fast one back.
//!
//! The receivers are sinks in this process on loopback (allowed through the push policy, as
//! `--push-allow 127.0.0.1:PORT` would), speaking HTTP/1.1 with keep-alive. Each task's payload
//! carries its due time; a sink records *receive time − due time* (wall clock, microseconds) when
//! a request's body has arrived, before it answers. Three phases, each on a fresh store:
//!
//! 1. `lateness`: `--rate` calls/s for `--secs` seconds to a fast sink (200 at once), due times
//!    spread evenly over each second and scheduled `--lead-ms` ahead: lateness p50/p99/max.
//! 2. `throughput`: `--burst` tasks all due at one moment: calls/s from that moment to the last
//!    receipt, and how many connections the sink saw (keep-alive reuses them).
//! 3. `slow`: `--fast-rate` calls/s to the fast sink for `--secs`, alone, then beside
//!    `--slow-rate` calls/s to a second fast sink (the control: the same call volume), then beside
//!    `--slow-rate` calls/s to a receiver that takes 1 s per call: the fast sink's p99 each way.
//!    The slowness itself holds nothing back when the last two agree.
//!
//! Every phase also gives the process's CPU time per call (user + system,
//! from `/proc/self/stat`, sink and producer included), beside the wall-clock figures.
//!
//! The summary is one JSON object on stdout (progress goes to stderr).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use sundial::{Config, Sundial, Target, TaskSpec, Timestamp};
use sundial_core::namespace::DEFAULT_NAMESPACE;
use sundial_push::{AddressPolicy, ClientConfig, PushConfig, PushExecutor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::{Common, DataDir, Stopwatch, cpu_seconds, histogram, sleep_until};

#[derive(Debug, Clone, Args)]
pub struct PushArgs {
    /// Calls per second of the lateness phase.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Seconds of load of the lateness and slow-receiver phases.
    #[arg(long, default_value_t = 30)]
    pub secs: u64,
    /// How long before its second each second's tasks are scheduled.
    #[arg(long, default_value_t = 2_000)]
    pub lead_ms: i64,
    /// Tasks per schedule call.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Tasks of the throughput phase, all due at one moment.
    #[arg(long, default_value_t = 50_000)]
    pub burst: u64,
    /// Calls per second to the fast receiver in the slow-receiver phase.
    #[arg(long, default_value_t = 500)]
    pub fast_rate: u64,
    /// Calls per second to the slow receiver (1 s per call) in the slow-receiver phase.
    #[arg(long, default_value_t = 200)]
    pub slow_rate: u64,
    /// The engine's calls in flight per receiver (`--push-host-concurrency`).
    #[arg(long, default_value_t = Config::default().push_host_concurrency)]
    pub host_concurrency: usize,
    /// The engine's calls in flight per node (`--push-concurrency`).
    #[arg(long, default_value_t = Config::default().push_concurrency)]
    pub concurrency: usize,
    /// How long before its due time a push task is claimed (`--push-claim-lead`), ms.
    #[arg(long, default_value_t = Config::default().push_claim_lead.as_millis() as u64)]
    pub claim_lead_ms: u64,
    /// Run only these phases (comma separated: lateness, throughput, slow).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lateness,throughput,slow"
    )]
    pub phases: Vec<String>,
}

/// The sinks' receive times are wall-clock readings compared with due times (which are on the
/// engine's system clock): the measurement, not a decision.
#[allow(clippy::disallowed_methods)]
fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// What one sink saw.
struct SinkStats {
    /// Receive time − due time, microseconds (late receipts).
    late_us: Mutex<Histogram<u64>>,
    received: AtomicU64,
    early: AtomicU64,
    connections: AtomicUsize,
    last_us: AtomicU64,
}

struct Sink {
    port: u16,
    stats: Arc<SinkStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    async fn start(delay: Duration) -> Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind sink")?;
        let port = listener.local_addr()?.port();
        let stats = Arc::new(SinkStats {
            late_us: Mutex::new(histogram()),
            received: AtomicU64::new(0),
            early: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            last_us: AtomicU64::new(0),
        });
        let s = stats.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                s.connections.fetch_add(1, Ordering::Relaxed);
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &s, delay).await;
                });
            }
        });
        Ok(Sink { port, stats, task })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn received(&self) -> u64 {
        self.stats.received.load(Ordering::Relaxed)
    }

    fn summary(&self) -> Value {
        let h = self
            .stats
            .late_us
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| histogram());
        let ms = |v: u64| v as f64 / 1_000.0;
        json!({
            "received": self.received(),
            "early": self.stats.early.load(Ordering::Relaxed),
            "connections": self.stats.connections.load(Ordering::Relaxed),
            "lateness_ms": {
                "p50": ms(h.value_at_quantile(0.50)),
                "p90": ms(h.value_at_quantile(0.90)),
                "p99": ms(h.value_at_quantile(0.99)),
                "p999": ms(h.value_at_quantile(0.999)),
                "max": ms(h.max()),
                "mean": h.mean() / 1_000.0,
            },
        })
    }
}

/// HTTP/1.1 with keep-alive: read a request (head, then `content-length` bytes), record it,
/// wait `delay`, answer 200 with an empty body, and read the next one on the same connection.
async fn serve(mut stream: TcpStream, s: &SinkStats, delay: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut chunk = [0u8; 8 * 1024];
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let at = wall_us();
        let body: Vec<u8> = buf[head_end..head_end + len].to_vec();
        buf.drain(..head_end + len);
        if let Some(due_ms) = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("due").and_then(Value::as_i64))
        {
            let late = at - due_ms * 1_000;
            if late < 0 {
                s.early.fetch_add(1, Ordering::Relaxed);
            } else if let Ok(mut h) = s.late_us.lock() {
                h.saturating_record(late as u64);
            }
        }
        s.received.fetch_add(1, Ordering::Relaxed);
        s.last_us.fetch_max(at.max(0) as u64, Ordering::Relaxed);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await?;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A fresh Sundial on its own data directory with push delivery to the given sinks only.
async fn open(common: &Common, args: &PushArgs, sinks: &[&Sink]) -> Result<(Sundial, DataDir)> {
    let dir = DataDir::new(common)?;
    // A phase's tasks would meet an earlier phase's in a reused directory: each gets its own.
    let sub = dir.path().join(format!("push-{}", wall_us()));
    std::fs::create_dir_all(&sub)?;
    let config = Config {
        push_host_concurrency: args.host_concurrency,
        push_concurrency: args.concurrency,
        push_claim_lead: Duration::from_millis(args.claim_lead_ms),
        ..common.config()
    };
    let sundial = common.open(&sub, config).await?;
    let allow: Vec<String> = sinks
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let exec = PushExecutor::new(
        PushConfig {
            client: ClientConfig {
                policy: AddressPolicy::parse(&allow).context("push policy")?,
                // As `sundial server` does: as many kept-alive connections as receiver slots.
                pool_max_idle_per_host: args.host_concurrency,
                ..ClientConfig::default()
            },
            ..PushConfig::default()
        },
        sundial
            .push_secret_store()
            .context("the store keeps no push secrets")?
            .clone(),
        sundial.clock().clone(),
    )?;
    exec.add_secret(DEFAULT_NAMESPACE, None, None).await?;
    sundial.set_push_handler(exec.handler(&sundial));
    Ok((sundial, dir))
}

/// Schedules `rate` calls a second to each `(url, rate)` for `secs` seconds from `base`, each
/// second's tasks `lead_ms` ahead; answers the smallest margin left before a second began.
async fn produce(
    sundial: &Sundial,
    streams: &[(String, u64)],
    base: i64,
    secs: u64,
    lead_ms: i64,
    batch: usize,
) -> Result<i64> {
    let clock = sundial.clock().clone();
    let mut min_margin = i64::MAX;
    for k in 0..secs as i64 {
        let second = base + k * 1_000;
        sleep_until(&clock, Timestamp(second - lead_ms)).await;
        let mut specs = Vec::new();
        for (url, rate) in streams {
            for i in 0..*rate as i64 {
                let due = second + i * 1_000 / (*rate).max(1) as i64;
                specs.push(
                    TaskSpec::new("bench.push")
                        .queue("push")
                        .run_at(Timestamp(due))
                        .payload(json!({ "due": due }))
                        .target(Target::new(url.clone())),
                );
            }
        }
        let mut specs = specs.into_iter().peekable();
        while specs.peek().is_some() {
            let chunk: Vec<TaskSpec> = specs.by_ref().take(batch.max(1)).collect();
            sundial.schedule_many(chunk).await?;
        }
        min_margin = min_margin.min(second - clock.now().0);
    }
    Ok(min_margin)
}

/// Process CPU time (user + system, all threads: engine, SQLite writer, HTTP client, and the
/// in-process sink and producer) over a phase, per call: a figure a busy machine does not skew the
/// way it skews wall-clock times. Linux `/proc/self/stat`, 10 ms ticks (so meaningful over runs
/// of many calls); the SQLite writer and checkpoint threads are also shown alone.
struct CpuMeter {
    process: f64,
    sqlite: f64,
}

impl CpuMeter {
    fn start() -> Self {
        let (process, sqlite) = cpu_seconds("sundial-sqlite");
        CpuMeter { process, sqlite }
    }

    fn per_call(&self, calls: u64) -> Value {
        let (process, sqlite) = cpu_seconds("sundial-sqlite");
        let (p, w) = (process - self.process, sqlite - self.sqlite);
        let per = |s: f64| s * 1e6 / calls.max(1) as f64;
        eprintln!(
            "  cpu: {p:.2}s process ({:.1} us/call), {w:.2}s SQLite threads ({:.1} us/call)",
            per(p),
            per(w)
        );
        json!({
            "process_seconds": p,
            "process_us_per_call": per(p),
            "sqlite_threads_seconds": w,
            "sqlite_threads_us_per_call": per(w),
        })
    }
}

/// Waits (bounded) until no handler run is under way, so outcome writes are counted.
async fn wait_idle(sundial: &Sundial) {
    let start = Stopwatch::start();
    while sundial.in_flight() > 0 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_received(sink: &Sink, n: u64, limit: Duration, label: &str) -> Result<()> {
    let start = Stopwatch::start();
    let mut last_report = Duration::ZERO;
    while sink.received() < n {
        if start.elapsed() > limit {
            bail!("{label}: only {} of {n} calls arrived", sink.received());
        }
        if start.elapsed() >= last_report + Duration::from_secs(5) {
            eprintln!("  {label}: {}/{n} received", sink.received());
            last_report = start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn lateness(common: &Common, args: &PushArgs) -> Result<Value> {
    let sink = Sink::start(Duration::ZERO).await?;
    let (sundial, _dir) = open(common, args, &[&sink]).await?;
    let running = sundial.start();
    eprintln!("push lateness: {} calls/s for {}s", args.rate, args.secs);
    let base = sundial.clock().now().0 + args.lead_ms + 1_000;
    let streams = [(sink.url(), args.rate)];
    let cpu = CpuMeter::start();
    let margin = produce(
        &sundial,
        &streams,
        base,
        args.secs,
        args.lead_ms,
        args.batch,
    )
    .await?;
    wait_received(
        &sink,
        args.rate * args.secs,
        Duration::from_secs(120),
        "lateness",
    )
    .await?;
    // Outcomes still being written count too.
    wait_idle(&sundial).await;
    let cpu = cpu.per_call(args.rate * args.secs);
    running.shutdown(Duration::from_secs(5)).await;
    Ok(json!({
        "rate": args.rate,
        "secs": args.secs,
        "claim_lead_ms": args.claim_lead_ms,
        "producer_min_margin_ms": margin,
        "sink": sink.summary(),
        "cpu": cpu,
    }))
}

async fn throughput(common: &Common, args: &PushArgs) -> Result<Value> {
    let sink = Sink::start(Duration::ZERO).await?;
    let (sundial, _dir) = open(common, args, &[&sink]).await?;
    eprintln!("push throughput: {} calls due at one moment", args.burst);
    // Stored before the engine runs, all due at `due`, so the engine sees one backlog.
    let due = sundial.clock().now().0;
    let mut left = args.burst;
    while left > 0 {
        let n = left.min(args.batch.max(1) as u64);
        let specs = (0..n)
            .map(|_| {
                TaskSpec::new("bench.push")
                    .queue("push")
                    .run_at(Timestamp(due))
                    .payload(json!({ "due": due }))
                    .target(Target::new(sink.url()))
            })
            .collect();
        sundial.schedule_many(specs).await?;
        left -= n;
    }
    let started_us = wall_us();
    let cpu = CpuMeter::start();
    let running = sundial.start();
    wait_received(&sink, args.burst, Duration::from_secs(600), "throughput").await?;
    let last_us = sink.stats.last_us.load(Ordering::Relaxed) as i64;
    wait_idle(&sundial).await;
    let cpu = cpu.per_call(args.burst);
    running.shutdown(Duration::from_secs(5)).await;
    let secs = ((last_us - started_us).max(1)) as f64 / 1e6;
    Ok(json!({
        "calls": args.burst,
        "seconds": secs,
        "calls_per_second": args.burst as f64 / secs,
        "connections": sink.stats.connections.load(Ordering::Relaxed),
        "host_concurrency": args.host_concurrency,
        "cpu": cpu,
    }))
}

/// What the fast receiver's calls share the node with in the slow-receiver phase.
#[derive(Clone, Copy)]
enum Neighbour {
    /// Nothing: the fast receiver's calls alone.
    None,
    /// `--slow-rate` calls/s to a second receiver that answers at once: the control, the same
    /// call volume without the slowness.
    Fast,
    /// `--slow-rate` calls/s to a receiver that takes 1 s per call.
    Slow,
}

async fn fast_beside(common: &Common, args: &PushArgs, neighbour: Neighbour) -> Result<Value> {
    let fast = Sink::start(Duration::ZERO).await?;
    let other = Sink::start(match neighbour {
        Neighbour::Slow => Duration::from_secs(1),
        Neighbour::None | Neighbour::Fast => Duration::ZERO,
    })
    .await?;
    let (sundial, _dir) = open(common, args, &[&fast, &other]).await?;
    let running = sundial.start();
    let cpu = CpuMeter::start();
    eprintln!(
        "push slow receiver: {} calls/s to the fast receiver{}",
        args.fast_rate,
        match neighbour {
            Neighbour::None => ", alone".to_string(),
            Neighbour::Fast => format!(", {} calls/s to a second fast one", args.slow_rate),
            Neighbour::Slow => format!(", {} calls/s to one taking 1 s per call", args.slow_rate),
        }
    );
    let mut streams = vec![(fast.url(), args.fast_rate)];
    if !matches!(neighbour, Neighbour::None) {
        streams.push((other.url(), args.slow_rate));
    }
    let base = sundial.clock().now().0 + args.lead_ms + 1_000;
    let margin = produce(
        &sundial,
        &streams,
        base,
        args.secs,
        args.lead_ms,
        args.batch,
    )
    .await?;
    wait_received(
        &fast,
        args.fast_rate * args.secs,
        Duration::from_secs(120),
        "fast receiver",
    )
    .await?;
    // The other receiver's backlog is not waited for: a slow one drains at its slots' pace.
    let calls = fast.received() + other.received();
    let cpu = cpu.per_call(calls);
    running.shutdown(Duration::from_secs(2)).await;
    Ok(json!({
        "producer_min_margin_ms": margin,
        "fast": fast.summary(),
        "other_received": other.received(),
        "cpu": cpu,
    }))
}

pub async fn run(common: &Common, args: &PushArgs) -> Result<()> {
    let mut out = serde_json::Map::new();
    out.insert("benchmark".into(), json!("push"));
    out.insert("shards".into(), json!(common.shards));
    out.insert(
        "durability".into(),
        json!(format!("{:?}", common.durability)),
    );
    out.insert("loadavg".into(), json!(crate::common::loadavg()));
    let wants = |p: &str| args.phases.iter().any(|x| x == p);
    if wants("lateness") {
        out.insert("lateness".into(), lateness(common, args).await?);
    }
    if wants("throughput") {
        out.insert("throughput".into(), throughput(common, args).await?);
    }
    if wants("slow") {
        let alone = fast_beside(common, args, Neighbour::None).await?;
        let control = fast_beside(common, args, Neighbour::Fast).await?;
        let beside = fast_beside(common, args, Neighbour::Slow).await?;
        out.insert(
            "slow_receiver".into(),
            json!({
                "fast_rate": args.fast_rate,
                "slow_rate": args.slow_rate,
                "secs": args.secs,
                "alone": alone,
                "beside_fast": control,
                "beside_slow": beside,
            }),
        );
    }
    println!("{}", serde_json::to_string_pretty(&Value::Object(out))?);
    Ok(())
}
