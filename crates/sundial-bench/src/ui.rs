//! `sundial-bench ui`: every web UI page's time with a big store (by default 1,000,000 tasks and
//! 10,000 schedules), served in-process by the router the binary serves (no socket, auth off),
//! so the figure is the page's own work: its store queries and its rendering. The pages include
//! the overview (queues, lateness, the workers seen: the dead tasks below are polled by a named
//! worker), the dead letters grouped by queue and error across every dead task (whose errors
//! share a first line and differ after it, as traces do), and the schedule search by an id
//! fragment that matches one schedule, every one, or none.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Args;
use sundial::{TaskSpec, Timestamp};
use sundial_schedules::{
    CreateSchedule, ScheduleDef, ScheduleId, ScheduleSpec, Schedules, TaskTemplate,
};
use tower::ServiceExt;

use crate::common::{Common, DataDir, Stopwatch, histogram, summary};

#[derive(Debug, Clone, Args)]
pub struct UiArgs {
    /// Tasks stored (spread over queues, kinds and tags, due 1 to 2 days ahead).
    #[arg(long, default_value_t = 1_000_000)]
    pub tasks: u64,
    /// Schedules stored.
    #[arg(long, default_value_t = 10_000)]
    pub schedules: u64,
    /// Dead tasks among them (each run to its end through the worker protocol).
    #[arg(long, default_value_t = 1_000)]
    pub dead: u64,
    /// Requests per page.
    #[arg(long, default_value_t = 30)]
    pub runs: usize,
    /// The limit every page must stay under (p99).
    #[arg(long, default_value_t = 100)]
    pub limit_ms: u64,
}

const HOUR_MS: i64 = 3_600_000;

async fn get(app: &axum::Router, path: &str) -> Result<(StatusCode, String)> {
    let req = Request::builder().uri(path).body(Body::empty())?;
    let resp = app.clone().oneshot(req).await?;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The embedded store in `dir`, or with `--database-url` one node on PostgreSQL with its
/// schedule, workflow, push secret and access tables (as `sundial server` opens it), so that the overview shows the
/// nodes and their shards and every page runs PostgreSQL's queries.
async fn open(common: &Common, dir: &DataDir) -> Result<sundial::Sundial> {
    let Some(url) = &common.database_url else {
        return common.open(dir.path(), common.config()).await;
    };
    let store = std::sync::Arc::new(
        sundial_store_postgres::PostgresStore::connect(
            url,
            sundial_store_postgres::PostgresOptions {
                schema: common.database_schema.clone(),
                ..sundial_store_postgres::PostgresOptions::default()
            },
        )
        .await
        .context("connect to PostgreSQL")?,
    );
    sundial::Sundial::builder()
        .config(common.config())
        .schedule_store(store.clone())
        .workflow_store(store.clone())
        .push_secret_store(store.clone())
        .access_store(store.clone())
        .join_cluster(store.clone(), store, "ui-bench")
        .await
        .context("join the cluster")
}

pub async fn run(common: &Common, args: &UiArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    println!(
        "ui: {} tasks ({} dead), {} schedules; {} requests per page; data dir {}",
        args.tasks,
        args.dead,
        args.schedules,
        args.runs,
        dir.path().display()
    );
    let s = open(common, &dir).await?;
    let app = sundial_server::router(s.clone(), sundial_server::ServerConfig::default());
    let schedules = Schedules::attach(&s).context("schedules")?;
    let running = s.start();
    let watch = Stopwatch::start();

    // Tasks: queue-0..queue-19, kinds, two tags, due 1 to 2 days ahead.
    let stored: u64 = s.counts().await?.iter().map(|c| c.count).sum();
    let start = s.clock().now();
    let mut i = stored;
    while i < args.tasks {
        let n = (args.tasks - i).min(1_000);
        let specs = (i..i + n)
            .map(|k| {
                TaskSpec::new(format!("kind-{}", k % 13))
                    .queue(format!("queue-{}", k % 20))
                    .key(format!("order-{k}"))
                    .tag("tenant", format!("t{}", k % 997))
                    .tag("batch", format!("b{}", k / 100_000))
                    .run_at(Timestamp(
                        start.0 + 24 * HOUR_MS + (k as i64 % (24 * HOUR_MS)),
                    ))
            })
            .collect();
        s.schedule_many(specs).await?;
        i += n;
        if i % 200_000 < n {
            eprintln!(
                "  tasks: {i}/{} in {:.0}s",
                args.tasks,
                watch.elapsed().as_secs_f64()
            );
        }
    }
    // Dead tasks, through the worker protocol: poll, then fail without retry.
    let dead_now: u64 = s
        .counts()
        .await?
        .iter()
        .filter(|c| c.state == sundial::TaskState::Dead)
        .map(|c| c.count)
        .sum();
    if dead_now < args.dead {
        let specs = (dead_now..args.dead)
            .map(|k| {
                TaskSpec::new("charge")
                    .queue("payments")
                    .max_attempts(1)
                    .payload(serde_json::json!({"n": k}))
            })
            .collect::<Vec<_>>();
        for chunk in specs.chunks(500) {
            s.schedule_many(chunk.to_vec()).await?;
        }
        let mut failed = dead_now;
        while failed < args.dead {
            let got = s
                .poll(
                    "payments",
                    Some("bench".into()),
                    None,
                    100,
                    Duration::from_secs(5),
                )
                .await?;
            if got.is_empty() {
                bail!("no payments task became ready");
            }
            for t in got {
                let exec = t
                    .execution_id
                    .context("a polled task has an execution id")?;
                // Seven groups by first line; every error differs after it.
                let error = format!("card declined: code {}\nrequest {failed}", failed % 7);
                s.fail(t.id, exec, error, false).await?;
                failed += 1;
            }
        }
    }
    // Schedules: 64 concurrent creators (ids a reused data directory has already are kept).
    {
        let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut workers = Vec::new();
        for _ in 0..64 {
            let schedules = schedules.clone();
            let next = next.clone();
            let total = args.schedules;
            workers.push(tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= total {
                        return Ok::<(), anyhow::Error>(());
                    }
                    let id = ScheduleId::new(format!("tenant-{k:05}-nightly-sync"))?;
                    let def = ScheduleDef::new(
                        ScheduleSpec::cron(format!("{} {} * * *", k % 60, k % 24)),
                        TaskTemplate::new("sync").queue(format!("sync-{}", k % 10)),
                    );
                    match schedules.create(CreateSchedule::new(def).id(id)).await {
                        Ok(_) | Err(sundial_schedules::Error::AlreadyExists) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }));
        }
        for w in workers {
            w.await??;
        }
    }
    println!("  filled in {:.1}s", watch.elapsed().as_secs_f64());

    let (_, tasks_page) = get(&app, "/ui/tasks?queue=queue-3").await?;
    let task_id = tasks_page
        .split("/ui/tasks/")
        .filter_map(|r| r.get(..36))
        .find(|id| id.parse::<sundial::TaskId>().is_ok())
        .context("a task id on the tasks page")?
        .to_string();
    let last = args.schedules.saturating_sub(1);
    let pages = [
        "/ui".to_string(),
        "/ui/tasks".to_string(),
        "/ui/tasks?queue=queue-3".to_string(),
        "/ui/tasks?queue=queue-3&state=scheduled&kind=kind-5".to_string(),
        "/ui/tasks?tag=tenant:t7".to_string(),
        "/ui/tasks?key=order-12345".to_string(),
        "/ui/tasks?state=dead".to_string(),
        format!("/ui/tasks/{task_id}"),
        "/ui/tasks/bulk?action=retry&state=dead&queue=payments".to_string(),
        "/ui/dead".to_string(),
        "/ui/dead?queue=payments".to_string(),
        "/ui/schedules".to_string(),
        format!("/ui/schedules?q={:05}", last),
        "/ui/schedules?q=no-such-fragment".to_string(),
        "/ui/schedules?q=nightly&paused=false".to_string(),
        "/ui/schedules?paused=true".to_string(),
        format!("/ui/schedule?id=tenant-{last:05}-nightly-sync"),
        "/ui/workflows".to_string(),
        "/ui/audit".to_string(),
    ];
    let mut worst = 0u64;
    println!("  {:<58} latency", "page");
    for p in &pages {
        let (status, _) = get(&app, p).await?;
        if !status.is_success() {
            bail!("{p}: {status}");
        }
        let mut h = histogram();
        for _ in 0..args.runs {
            let w = Stopwatch::start();
            get(&app, p).await?;
            h.record(w.elapsed().as_micros() as u64)?;
        }
        worst = worst.max(h.value_at_quantile(0.99) / 1_000);
        println!("  {p:<58} {}", summary(&h, "ms", 1_000.0));
    }
    let verdict = if worst < args.limit_ms {
        "PASS"
    } else {
        "FAIL"
    };
    println!(
        "  {verdict}: the slowest page's p99 is {worst} ms (limit {} ms)",
        args.limit_ms
    );
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
