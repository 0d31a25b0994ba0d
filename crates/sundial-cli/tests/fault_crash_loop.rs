//! Fault battery, crash loop (embedded store): the real `sundial server` is killed with SIGKILL
//! at random moments while clients create tasks (single creates and batches), long-poll workers
//! take and complete them, and a recurring schedule fires every second through the server's
//! in-process schedule runner; after each kill a new server is started on the same data
//! directory at once.
//!
//! It proves, and fails otherwise:
//! - the store opens after every kill (each restart prints its address);
//! - no acknowledged task is lost: every task whose create was answered `201`/`200` ends
//!   `succeeded`;
//! - nothing starts early: every delivery to a worker, and every task's recorded start, is at or
//!   after its due time (the due time travels in the payload, so tasks whose create was in flight
//!   at a kill are checked too); no schedule fire is delivered before its nominal time;
//! - overdue tasks start promptly: every acknowledged task due before a restart accepted
//!   connections, and not yet delivered at the kill, is delivered within 5 s of that moment
//!   (tasks whose poll answer was lost at the kill have started already; they come back after
//!   their lease and are counted apart);
//! - execution ids are never reused, and each schedule fire (nominal time) has one task.
//!
//! Short form (CI): 3 kills 2–3 s apart at about 100 creates/s. Long form
//! (`SUNDIAL_FAULTS_LONG=1`): 10 kills 5–15 s apart at about 200 creates/s.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use common::{Launch, Server, now_ms, rfc3339_ms};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sundial_cli::Client;
use sundial_server::wire::{BatchItem, CreateBatch, CreateTask, StateView};

const QUEUE: &str = "crashloop";
const SCHEDULE_QUEUE: &str = "crashloop.sched";
const CREATORS: usize = 4;
const WORKERS: usize = 4;
const BATCH: usize = 5;
/// Overdue tasks must start within this long of the restart accepting connections.
const OVERDUE_LIMIT_MS: i64 = 5_000;
/// A task's timeout, which is its lease with a worker: a task whose poll answer was lost at a
/// kill comes back after it.
const TASK_TIMEOUT: &str = "2s";

struct Form {
    kills: usize,
    gap_ms: (u64, u64),
    creates_per_s: u64,
}

fn form() -> (Form, &'static str) {
    if std::env::var_os("SUNDIAL_FAULTS_LONG").is_some_and(|v| v == "1") {
        (
            Form {
                kills: 10,
                gap_ms: (5_000, 15_000),
                creates_per_s: 200,
            },
            "long",
        )
    } else {
        (
            Form {
                kills: 3,
                gap_ms: (2_000, 3_000),
                creates_per_s: 100,
            },
            "short",
        )
    }
}

#[derive(Default)]
struct Record {
    /// Acknowledged tasks and their due times.
    acked: HashMap<uuid::Uuid, i64>,
    acked_single: usize,
    acked_batched: usize,
    /// First delivery of each task to a worker here (test clock) and its attempt number.
    first_delivery: HashMap<uuid::Uuid, (i64, u32)>,
    deliveries: usize,
    executions: HashSet<uuid::Uuid>,
    reused_executions: usize,
    early: Vec<String>,
    /// Schedule fires: nominal time → task ids delivered for it.
    fires: HashMap<i64, HashSet<uuid::Uuid>>,
    fire_delivered: HashMap<i64, i64>,
}

struct Shared {
    client: RwLock<Option<Client>>,
    record: Mutex<Record>,
    stop_creating: AtomicBool,
    stop_working: AtomicBool,
    issued: AtomicU64,
}

impl Shared {
    fn client(&self) -> Option<Client> {
        self.client.read().unwrap().clone()
    }
}

fn launch(dir: &std::path::Path, log: &std::path::Path) -> Server {
    let args: Vec<OsString> = vec![
        "--data-dir".into(),
        dir.into(),
        "--shards".into(),
        "16".into(),
        "--max-poll-wait".into(),
        "2s".into(),
    ];
    Server::spawn(
        args,
        &Launch {
            log: Some(log.to_path_buf()),
            ..Launch::default()
        },
        dir,
    )
}

fn task(n: u64, due: i64) -> CreateTask {
    CreateTask {
        queue: Some(QUEUE.into()),
        payload: Some(json!({ "n": n, "due": due })),
        run_at: Some(sundial_server::time::format(
            sundial::Timestamp::from_millis(due),
        )),
        timeout: Some(TASK_TIMEOUT.into()),
        max_attempts: Some(50),
        ..CreateTask::new("crash.job")
    }
}

async fn creator(shared: Arc<Shared>, per_s: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Alternate single creates and batches: (1 + BATCH) tasks per two requests.
    let requests_per_s = (per_s * 2 / (1 + BATCH as u64)).max(1);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / requests_per_s));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut single = true;
    while !shared.stop_creating.load(Ordering::Relaxed) {
        tick.tick().await;
        let Some(client) = shared.client() else {
            continue;
        };
        let now = now_ms();
        if single {
            let n = shared.issued.fetch_add(1, Ordering::Relaxed);
            let due = now + rng.random_range(0..3_000);
            // An error leaves the create's fate unknown (the server may have died after the
            // commit): not acknowledged, but still checked for earliness if it is delivered.
            if let Ok(t) = client.create(&task(n, due)).await {
                let mut r = shared.record.lock().unwrap();
                r.acked.insert(t.id, due);
                r.acked_single += 1;
            }
        } else {
            let items: Vec<(u64, i64)> = (0..BATCH)
                .map(|_| {
                    (
                        shared.issued.fetch_add(1, Ordering::Relaxed),
                        now + rng.random_range(0..3_000),
                    )
                })
                .collect();
            let batch = CreateBatch {
                tasks: items.iter().map(|(n, due)| task(*n, *due)).collect(),
            };
            if let Ok(resp) = client.create_batch(&batch).await {
                let mut r = shared.record.lock().unwrap();
                for (item, (_, due)) in resp.results.iter().zip(&items) {
                    if let BatchItem::Created { id, .. } = item {
                        r.acked.insert(*id, *due);
                        r.acked_batched += 1;
                    }
                }
            }
        }
        single = !single;
    }
}

async fn worker(shared: Arc<Shared>, name: String, queue: &'static str) {
    while !shared.stop_working.load(Ordering::Relaxed) {
        let Some(client) = shared.client() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let polled = match client
            .poll(queue, &name, 50, Duration::from_secs(1), None)
            .await
        {
            Ok(p) => p,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let at = now_ms();
        {
            let mut r = shared.record.lock().unwrap();
            for t in &polled.tasks {
                r.deliveries += 1;
                if !r.executions.insert(t.execution_id) {
                    r.reused_executions += 1;
                }
                if queue == QUEUE {
                    let due = t.payload["due"].as_i64().unwrap_or(i64::MAX);
                    if at < due {
                        r.early
                            .push(format!("task {} delivered at {at}, due {due}", t.id));
                    }
                    r.first_delivery.entry(t.id).or_insert((at, t.attempt));
                } else {
                    // A schedule fire's key is `schedule:<id>@<nominal RFC 3339>`.
                    let key = t.key.clone().unwrap_or_default();
                    let nominal = key
                        .rsplit_once('@')
                        .map(|(_, n)| rfc3339_ms(n))
                        .unwrap_or(i64::MAX);
                    if at < nominal {
                        r.early.push(format!("fire {key} delivered at {at}"));
                    }
                    r.fires.entry(nominal).or_default().insert(t.id);
                    r.fire_delivered.entry(nominal).or_insert(at);
                }
            }
        }
        for t in polled.tasks {
            // A failed complete (the server died) leaves the attempt to its lease.
            let _ = client.complete(t.id, t.execution_id, None).await;
        }
    }
}

/// One kill and restart, as the checks need it.
struct Restart {
    killed_at: i64,
    accepting_at: i64,
    /// Acknowledged, due before `accepting_at`, not delivered at the kill.
    overdue: Vec<(uuid::Uuid, i64)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop() {
    let (form, form_name) = form();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("servers.log");
    let data = dir.path().join("data");
    let started = now_ms();
    let mut server = {
        let (data, log) = (data.clone(), log.clone());
        tokio::task::spawn_blocking(move || launch(&data, &log))
            .await
            .unwrap()
    };
    let shared = Arc::new(Shared {
        client: RwLock::new(Some(server.client())),
        record: Mutex::default(),
        stop_creating: AtomicBool::new(false),
        stop_working: AtomicBool::new(false),
        issued: AtomicU64::new(0),
    });

    // The in-process part: a schedule firing every second, its ticks run by the server's
    // schedule runner; its fires go to a worker like any task.
    let resp = sundial_cli::http_client_builder()
        .build()
        .unwrap()
        .post(format!("{}/v1/schedules", server.url))
        .json(&json!({
            "id": "crash-every-second",
            "every": "1s",
            "overlap": "allow_all",
            "catchup_window": "1m",
            "task": {"kind": "crash.fire", "queue": SCHEDULE_QUEUE, "timeout": TASK_TIMEOUT}
        }))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "schedule: {}", resp.status());

    let mut tasks = Vec::new();
    for c in 0..CREATORS {
        tasks.push(tokio::spawn(creator(
            shared.clone(),
            form.creates_per_s / CREATORS as u64,
            0x5eed + c as u64,
        )));
    }
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        workers.push(tokio::spawn(worker(shared.clone(), format!("w{w}"), QUEUE)));
    }
    workers.push(tokio::spawn(worker(
        shared.clone(),
        "fires".into(),
        SCHEDULE_QUEUE,
    )));

    let mut rng = StdRng::seed_from_u64(now_ms() as u64);
    let mut restarts: Vec<Restart> = Vec::new();
    let mut restart_ms = Vec::new();
    for _ in 0..form.kills {
        let gap = rng.random_range(form.gap_ms.0..=form.gap_ms.1);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        server.kill9();
        let killed_at = now_ms();
        *shared.client.write().unwrap() = None;
        let delivered_at_kill: HashSet<uuid::Uuid> = shared
            .record
            .lock()
            .unwrap()
            .first_delivery
            .keys()
            .copied()
            .collect();
        // The store must open after every kill: `launch` fails the test otherwise.
        server = {
            let (data, log) = (data.clone(), log.clone());
            tokio::task::spawn_blocking(move || launch(&data, &log))
                .await
                .unwrap()
        };
        let accepting_at = now_ms();
        restart_ms.push(accepting_at - killed_at);
        *shared.client.write().unwrap() = Some(server.client());
        let overdue = shared
            .record
            .lock()
            .unwrap()
            .acked
            .iter()
            .filter(|(id, due)| **due < accepting_at && !delivered_at_kill.contains(id))
            .map(|(id, due)| (*id, *due))
            .collect();
        restarts.push(Restart {
            killed_at,
            accepting_at,
            overdue,
        });
    }
    // A last stretch under load after the final restart, then drain.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    shared.stop_creating.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let last_due = shared
        .record
        .lock()
        .unwrap()
        .acked
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    let client = server.client();
    let give_up = last_due.max(now_ms()) + 30_000;
    let mut final_view;
    loop {
        final_view = common::all_tasks(&client).await;
        let acked = shared.record.lock().unwrap().acked.clone();
        let done = final_view
            .iter()
            .filter(|t| t.queue == QUEUE && t.state == StateView::Succeeded)
            .filter(|t| acked.contains_key(&t.id))
            .count();
        if done == acked.len() || now_ms() > give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    shared.stop_working.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }

    // The checks.
    let r = shared.record.lock().unwrap();
    let by_id: HashMap<uuid::Uuid, &sundial_server::wire::TaskView> =
        final_view.iter().map(|t| (t.id, t)).collect();
    let lost: Vec<_> = r
        .acked
        .keys()
        .filter(|id| {
            by_id
                .get(id)
                .is_none_or(|t| t.state != StateView::Succeeded)
        })
        .collect();
    let mut early = r.early.clone();
    for t in final_view.iter().filter(|t| t.queue == QUEUE) {
        let due = t.payload["due"].as_i64().unwrap_or(i64::MAX);
        if let Some(s) = t.started_at.as_deref()
            && rfc3339_ms(s) < due
        {
            early.push(format!("task {} recorded started {s}, due {due}", t.id));
        }
    }
    let mut overdue_total = 0;
    let mut in_flight_at_kill = 0;
    let mut worst_overdue_ms = 0;
    let mut worst_in_flight_ms = 0;
    let mut slow = Vec::new();
    for (i, restart) in restarts.iter().enumerate() {
        // The window a restart is judged over ends at the next kill (or the end).
        let window_end = restarts.get(i + 1).map_or(i64::MAX, |n| n.killed_at);
        for (id, due) in &restart.overdue {
            overdue_total += 1;
            let limit = restart.accepting_at.max(*due) + OVERDUE_LIMIT_MS;
            match r.first_delivery.get(id) {
                // First seen at a later attempt: an earlier one was claimed for a poll whose
                // answer the kill lost, so the task had started before the kill; it comes back
                // once that attempt's lease ends.
                Some((at, attempt)) if *attempt > 1 => {
                    in_flight_at_kill += 1;
                    worst_in_flight_ms = worst_in_flight_ms.max(at - restart.accepting_at);
                }
                Some((at, _)) if *at <= window_end => {
                    worst_overdue_ms = worst_overdue_ms.max(at - restart.accepting_at);
                    if *at > limit {
                        slow.push(format!(
                            "{id}: due {due}, delivered {} ms after the restart",
                            at - restart.accepting_at
                        ));
                    }
                }
                _ if window_end >= limit => {
                    slow.push(format!("{id}: due {due}, not delivered within the window"));
                }
                // The next kill came first: judged by the next restart.
                _ => {}
            }
        }
    }
    let dup_fires = r.fires.values().filter(|ids| ids.len() > 1).count();
    let last_accept = restarts.last().map_or(started, |x| x.accepting_at);
    let fires_after_last = r
        .fire_delivered
        .keys()
        .filter(|nominal| **nominal >= last_accept)
        .count();
    restart_ms.sort();
    let elapsed_s = (now_ms() - started) as f64 / 1000.0;
    println!(
        "FAULT crash_loop: form={form_name} kills={} elapsed={elapsed_s:.1}s acked={} (single {}, batched {}) issued={} \
         delivered={} lost={} early={} reused_execution_ids={} overdue_at_restart={overdue_total} \
         worst_overdue_start_ms={worst_overdue_ms} (limit {OVERDUE_LIMIT_MS}) in_flight_at_kill={in_flight_at_kill} \
         (back after their lease, worst {worst_in_flight_ms} ms) \
         restart_ms_median={} restart_ms_max={} schedule_fires={} duplicate_fires={dup_fires} fires_after_last_restart={fires_after_last}",
        form.kills,
        r.acked.len(),
        r.acked_single,
        r.acked_batched,
        shared.issued.load(Ordering::Relaxed),
        r.first_delivery.len(),
        lost.len(),
        early.len(),
        r.reused_executions,
        restart_ms.get(restart_ms.len() / 2).copied().unwrap_or(0),
        restart_ms.last().copied().unwrap_or(0),
        r.fires.len(),
    );
    let tail = |v: &[String]| v.iter().take(5).cloned().collect::<Vec<_>>().join("; ");
    assert!(r.acked.len() > 100, "too few creates went through");
    assert!(
        lost.is_empty(),
        "{} acknowledged tasks lost: {:?}",
        lost.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
    assert!(early.is_empty(), "started early: {}", tail(&early));
    assert_eq!(r.reused_executions, 0, "execution ids reused");
    assert!(
        slow.is_empty(),
        "{} overdue tasks slow after a restart: {}",
        slow.len(),
        tail(&slow)
    );
    assert_eq!(dup_fires, 0, "a schedule fire had two tasks");
    assert!(
        fires_after_last > 0,
        "the schedule did not fire after the last restart"
    );
}
