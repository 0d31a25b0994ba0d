//! Fault battery, case `pg_restart`: PostgreSQL crashes and comes back, three times, under load.
//!
//! The test starts a PostgreSQL instance of its own (`initdb` into a temporary directory, on a
//! free port of its own: never the shared server), runs `sundial server` on it with creates and
//! long-poll workers, and three times stops PostgreSQL with `pg_ctl -m immediate` (a crash: no
//! checkpoint, crash recovery at the next start), keeps it down 3 s and starts it again.
//!
//! What it proves:
//!
//! 1. **a clear answer during the outage**: every create sent while PostgreSQL is down is
//!    answered within 2 s, with `201` or `503` carrying `Retry-After`: never a hang, never `500`;
//! 2. **nothing acknowledged is lost**: every task whose create was answered `201` ends
//!    `succeeded`;
//! 3. **dispatch resumes**: every acknowledged task that fell due while PostgreSQL was down
//!    reached a worker within 5 s of PostgreSQL accepting connections again.
//!
//! Short form (CI): 30 creates/s, 1 s between outages (after the overdue tasks are out). Long form (`SUNDIAL_FAULTS_LONG=1`):
//! 200 creates/s, 5 s between outages. The PostgreSQL binaries are looked for under
//! `/usr/lib/postgresql/*/bin` (or `SUNDIAL_PG_BIN`); without them the test is skipped, unless
//! `SUNDIAL_REQUIRE_POSTGRES=1`. As root, PostgreSQL runs as the `postgres` user (`runuser`).
//! To look into a run: `FAULT_DEBUG=1` prints each outage's times, the latest receipts and the
//! server's log; `FAULT_RUST_LOG` sets the server's `RUST_LOG` (default `warn`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Launch, Server, now_ms, rfc3339_ms};
use rand::Rng;
use sundial_cli::Client;
use sundial_server::wire::{CreateTask, TaskView};
use tokio::task::JoinHandle;
use uuid::Uuid;

const QUEUE: &str = "pgrestart";
const OUTAGES: usize = 3;
const DOWN: Duration = Duration::from_secs(3);
/// A create during the outage must be answered within this.
const ANSWER_WITHIN_MS: i64 = 2_000;
/// Overdue tasks must reach a worker within this of PostgreSQL accepting connections again.
const RESUME_WITHIN_MS: i64 = 5_000;

// ---- A PostgreSQL instance of the test's own ------------------------------------------------------

/// The newest `/usr/lib/postgresql/*/bin` with `initdb`, or `SUNDIAL_PG_BIN`.
fn pg_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("SUNDIAL_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl Postgres {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs a PostgreSQL tool, as `postgres` when this process is root (PostgreSQL refuses root).
    fn tool(&self, name: &str, args: &[OsString]) -> std::process::Output {
        let exe = self.bin.join(name);
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.arg("-u").arg("postgres").arg("--").arg(exe);
            c
        } else {
            Command::new(exe)
        };
        let out = cmd
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {name}: {e}"));
        assert!(
            out.status.success(),
            "{name} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `initdb` into a fresh temporary directory and start on a free port. `None` (after saying
    /// so) when no PostgreSQL binaries are installed and the test may be skipped.
    fn start() -> Option<Postgres> {
        let Some(bin) = pg_bin() else {
            if common::pg::postgres_required() {
                panic!(
                    "no PostgreSQL binaries under /usr/lib/postgresql/*/bin (set SUNDIAL_PG_BIN)"
                );
            }
            eprintln!("skipped: no PostgreSQL binaries");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            let status = Command::new("chown")
                .arg("-R")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown the temporary directory");
        }
        // A free port: bound and released at once (PostgreSQL binds it a moment later).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = Postgres { bin, dir, port };
        pg.tool(
            "initdb",
            &[
                "-D".into(),
                pg.data().into(),
                "-U".into(),
                "postgres".into(),
                "--auth=trust".into(),
                "-E".into(),
                "UTF8".into(),
                "--no-sync".into(),
            ],
        );
        pg.pg_ctl_start();
        Some(pg)
    }

    fn pg_ctl_start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=60",
            self.port,
            self.dir.path().display()
        );
        self.tool(
            "pg_ctl",
            &[
                "-D".into(),
                self.data().into(),
                "-o".into(),
                opts.into(),
                "-l".into(),
                self.dir.path().join("postgres.log").into(),
                "-w".into(),
                "-t".into(),
                "60".into(),
                "start".into(),
            ],
        );
    }

    /// A crash: no shutdown checkpoint; the next start runs crash recovery.
    fn stop_immediate(&self) {
        self.tool(
            "pg_ctl",
            &[
                "-D".into(),
                self.data().into(),
                "-m".into(),
                "immediate".into(),
                "-w".into(),
                "stop".into(),
            ],
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Waits until a connection is accepted and a query answered; returns that moment.
    async fn wait_accepting(&self) -> i64 {
        let deadline = now_ms() + 60_000;
        loop {
            if let Ok((client, conn)) =
                tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await
            {
                let task = tokio::spawn(conn);
                let ok = client.simple_query("SELECT 1").await.is_ok();
                drop(client);
                let _ = task.await;
                if ok {
                    return now_ms();
                }
            }
            assert!(now_ms() < deadline, "PostgreSQL did not come back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new(if is_root() { "runuser" } else { "true" })
            .args(if is_root() {
                vec!["-u".into(), "postgres".into(), "--".into()]
            } else {
                Vec::<OsString>::new()
            })
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("-m")
            .arg("immediate")
            .arg("stop")
            .output();
    }
}

// ---- The load -------------------------------------------------------------------------------------

/// One create's answer.
#[derive(Debug, Clone)]
struct Answer {
    sent: i64,
    took: i64,
    /// HTTP status, or `None` when no answer came (connection error or the client's timeout).
    status: Option<u16>,
    retry_after: bool,
    /// Shown in the failure report (through `Debug`).
    #[allow(dead_code)]
    body: String,
}

#[derive(Default)]
struct Record {
    created: Mutex<HashMap<Uuid, i64>>,
    answers: Mutex<Vec<Answer>>,
    /// Task → first time a worker received it.
    received: Mutex<HashMap<Uuid, i64>>,
    completed: Mutex<HashMap<Uuid, usize>>,
}

fn creator(
    base: String,
    per_sec: u64,
    record: Arc<Record>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = sundial_cli::http_client_builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut inflight = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let run_at = now_ms() + rand::rng().random_range(200..=1_500);
            let req = CreateTask {
                queue: Some(QUEUE.into()),
                run_at: Some(sundial_server::time::format(
                    sundial::Timestamp::from_millis(run_at),
                )),
                timeout: Some("10s".into()),
                ..CreateTask::new("job")
            };
            let (http, url, record) = (http.clone(), format!("{base}/v1/tasks"), record.clone());
            inflight.push(tokio::spawn(async move {
                let sent = now_ms();
                let resp = http.post(&url).json(&req).send().await;
                let took = now_ms() - sent;
                let answer = match resp {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let retry_after = r.headers().contains_key("retry-after");
                        let body = r.text().await.unwrap_or_default();
                        if status == 201
                            && let Ok(t) = serde_json::from_str::<TaskView>(&body)
                        {
                            record
                                .created
                                .lock()
                                .unwrap()
                                .insert(t.id, rfc3339_ms(&t.run_at));
                        }
                        Answer {
                            sent,
                            took,
                            status: Some(status),
                            retry_after,
                            body,
                        }
                    }
                    Err(e) => Answer {
                        sent,
                        took,
                        status: None,
                        retry_after: false,
                        body: e.to_string(),
                    },
                };
                record.answers.lock().unwrap().push(answer);
            }));
            inflight.retain(|h: &JoinHandle<()>| !h.is_finished());
        }
        for h in inflight {
            let _ = h.await;
        }
    })
}

fn worker(
    client: Client,
    name: String,
    record: Arc<Record>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let polled = tokio::time::timeout(
                Duration::from_secs(4),
                client.poll(QUEUE, &name, 32, Duration::from_secs(1), None),
            )
            .await;
            let at = now_ms();
            let Ok(Ok(polled)) = polled else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            // Completes run beside the next poll, so the worker's own pace (one HTTP round trip
            // per complete) never holds back the next receipt: what is measured is dispatch.
            for t in polled.tasks {
                record.received.lock().unwrap().entry(t.id).or_insert(at);
                let (client, record) = (client.clone(), record.clone());
                tokio::spawn(async move {
                    // Complete, retrying through the outage; a 409 means another attempt has it.
                    for _ in 0..100 {
                        match client.complete(t.id, t.execution_id, None).await {
                            Ok(_) => {
                                *record.completed.lock().unwrap().entry(t.id).or_default() += 1;
                                break;
                            }
                            Err(e) if e.is_conflict() => break,
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                });
            }
        }
    })
}

// ---- The case -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_and_restart_gives_503_loses_nothing_and_dispatch_resumes() {
    let long = std::env::var("SUNDIAL_FAULTS_LONG").is_ok_and(|v| v == "1");
    let (per_sec, up) = if long {
        (200, Duration::from_secs(5))
    } else {
        (30, Duration::from_secs(1))
    };
    let Some(pg) = Postgres::start() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("server.log");
    let args: Vec<OsString> = [
        "--data-dir".to_string(),
        data.path().display().to_string(),
        "--database-url".to_string(),
        pg.url(),
        "--database-schema".to_string(),
        "fault".to_string(),
        "--node-id".to_string(),
        "n1".to_string(),
    ]
    .map(OsString::from)
    .to_vec();
    let launch = Launch {
        extra: Vec::new(),
        rust_log: Some(std::env::var("FAULT_RUST_LOG").unwrap_or_else(|_| "warn".into())),
        log: Some(log.clone()),
        ..Launch::default()
    };
    let server = Server::spawn(args, &launch, data.path());
    let record = Arc::new(Record::default());
    let stop_creating = Arc::new(AtomicBool::new(false));
    let stop_working = Arc::new(AtomicBool::new(false));
    let creator = creator(
        server.url.clone(),
        per_sec,
        record.clone(),
        stop_creating.clone(),
    );
    let workers: Vec<_> = (0..2)
        .map(|i| {
            worker(
                server.client(),
                format!("w{i}"),
                record.clone(),
                stop_working.clone(),
            )
        })
        .collect();

    tokio::time::sleep(up).await;
    // (stopped at, accepting again at)
    let mut outages: Vec<(i64, i64)> = Vec::new();
    for _ in 0..OUTAGES {
        let down_at = now_ms();
        tokio::task::block_in_place(|| pg.stop_immediate());
        tokio::time::sleep(DOWN).await;
        tokio::task::block_in_place(|| pg.pg_ctl_start());
        let back_at = pg.wait_accepting().await;
        outages.push((down_at, back_at));
        if std::env::var("FAULT_DEBUG").is_ok() {
            eprintln!("outage: down at {down_at}, accepting again at {back_at}");
        }
        // Until every acknowledged task due by now has reached a worker (or the bound passed).
        loop {
            let all = {
                let created = record.created.lock().unwrap();
                let received = record.received.lock().unwrap();
                created
                    .iter()
                    .all(|(id, due)| *due >= back_at || received.contains_key(id))
            };
            if all || now_ms() > back_at + RESUME_WITHIN_MS + 500 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(up).await;
    }
    stop_creating.store(true, Ordering::Relaxed);
    creator.await.unwrap();
    // Drain: every acknowledged task reaches a worker and completes.
    let deadline = now_ms() + 30_000;
    loop {
        let done = {
            let created = record.created.lock().unwrap();
            let completed = record.completed.lock().unwrap();
            created.keys().all(|id| completed.contains_key(id))
        };
        if done || now_ms() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_working.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }

    let created = record.created.lock().unwrap().clone();
    let answers = record.answers.lock().unwrap().clone();
    let received = record.received.lock().unwrap().clone();
    let completed = record.completed.lock().unwrap().clone();
    let client = server.client();
    let mut failures = Vec::new();

    // 1. During each outage (from the stop until PostgreSQL accepts again): 201, or 503 with
    //    Retry-After, within 2 s.
    let during = |a: &Answer| {
        outages
            .iter()
            .any(|(down, back)| a.sent + a.took >= *down && a.sent <= *back)
    };
    let in_outage: Vec<&Answer> = answers.iter().filter(|a| during(a)).collect();
    let unavailable = in_outage
        .iter()
        .filter(|a| a.status == Some(503) && a.retry_after)
        .count();
    let bad: Vec<&&Answer> = in_outage
        .iter()
        .filter(|a| {
            !(a.status == Some(201) || (a.status == Some(503) && a.retry_after))
                || a.took > ANSWER_WITHIN_MS
        })
        .collect();
    let slowest = in_outage.iter().map(|a| a.took).max().unwrap_or(0);
    if !bad.is_empty() {
        failures.push(format!(
            "{} creates during the outages were not answered 201 or 503 with Retry-After within \
             {ANSWER_WITHIN_MS} ms; first ones: {:?}",
            bad.len(),
            bad.iter().take(5).collect::<Vec<_>>()
        ));
    }
    let errors_outside: Vec<&Answer> = answers
        .iter()
        .filter(|a| !during(a) && a.status != Some(201))
        .collect();
    if !errors_outside.is_empty() {
        eprintln!("answers other than 201 outside the outages: {errors_outside:?}");
    }
    let errors_outside = errors_outside.len();
    // 2. Nothing acknowledged lost.
    let mut lost = Vec::new();
    for id in created.keys() {
        match client.get(&id.to_string()).await {
            Ok(t) if t.state == sundial_server::wire::StateView::Succeeded => {}
            other => lost.push((id, other.map(|t| t.state).map_err(|e| e.to_string()))),
        }
    }
    if !lost.is_empty() {
        failures.push(format!(
            "{} acknowledged tasks did not succeed: {:?}",
            lost.len(),
            lost.iter().take(5).collect::<Vec<_>>()
        ));
    }
    let twice = completed.values().filter(|n| **n > 1).count();
    if twice > 0 {
        failures.push(format!("{twice} tasks completed twice"));
    }
    // 3. Overdue tasks reach a worker within 5 s of PostgreSQL accepting again.
    let mut resume_ms: Vec<i64> = Vec::new();
    for (down, back) in &outages {
        let worst = created
            .iter()
            .filter(|(_, due)| **due >= *down && **due < *back)
            .filter_map(|(id, _)| received.get(id))
            .map(|at| at - back)
            .max();
        let never = created
            .iter()
            .filter(|(id, due)| **due >= *down && **due < *back && !received.contains_key(id))
            .count();
        if never > 0 {
            failures.push(format!("{never} overdue tasks never reached a worker"));
        }
        if std::env::var("FAULT_DEBUG").is_ok() {
            let mut late: Vec<(i64, i64, Uuid)> = created
                .iter()
                .filter(|(_, due)| **due >= *down && **due < *back)
                .filter_map(|(id, due)| received.get(id).map(|at| (at - back, *due, *id)))
                .collect();
            late.sort();
            eprintln!(
                "outage {down}..{back}: latest receipts {:?}",
                late.iter().rev().take(5).collect::<Vec<_>>()
            );
        }
        if let Some(w) = worst {
            resume_ms.push(w);
            if w > RESUME_WITHIN_MS {
                failures.push(format!(
                    "overdue tasks reached a worker {w} ms after PostgreSQL accepted connections"
                ));
            }
        }
    }
    if resume_ms.is_empty() {
        failures.push("no acknowledged task fell due during an outage".into());
    }
    let statuses = {
        let mut m: std::collections::BTreeMap<String, usize> = Default::default();
        for a in &in_outage {
            *m.entry(a.status.map_or("none".into(), |s| s.to_string()))
                .or_default() += 1;
        }
        m
    };
    if std::env::var("FAULT_DEBUG").is_ok() {
        eprintln!(
            "---- server log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    println!(
        "FAULT pg_restart: {OUTAGES} crashes of {} ms each; creates answered {} ({} acknowledged, \
         {errors_outside} errors outside the outages); during the outages {} creates by status \
         {statuses:?}, {unavailable} with 503 + Retry-After, slowest answer {slowest} ms (bound \
         {ANSWER_WITHIN_MS}); acknowledged lost {}; completed twice {twice}; overdue tasks reached a \
         worker at most {:?} ms after PostgreSQL accepted again (bound {RESUME_WITHIN_MS}); {}",
        DOWN.as_millis(),
        answers.len(),
        created.len(),
        in_outage.len(),
        lost.len(),
        resume_ms,
        if failures.is_empty() { "ok" } else { "FAILED" }
    );
    drop(server);
    assert!(failures.is_empty(), "{failures:#?}");
}
