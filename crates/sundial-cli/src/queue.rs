//! `sundial queue ...`: list queues with their counts and lateness, pause and resume them, set
//! their settings (retention overrides, a default push target, a concurrency limit), list the
//! workers that polled,
//! and show the nodes sharing the store with their shards, on a running server.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use sundial_cli::{Client, ClientError};
use sundial_server::ops::{ClusterStatus, QueueSettingsView, QueueView, RetentionView, WorkerList};

#[derive(Args, Debug)]
pub struct QueueArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    #[command(flatten)]
    credentials: sundial_cli::Credentials,
    #[command(flatten)]
    ns: sundial_cli::connect::NamespaceArg,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: QueueCommand,
}

#[derive(Subcommand, Debug)]
enum QueueCommand {
    /// Every queue: counts by state, the oldest overdue task's lateness, paused or not.
    Ls,
    /// One queue.
    Get { queue: String },
    /// The workers that polled the server's node in the last 15 minutes, by name and queue.
    Workers,
    /// The nodes sharing the store (PostgreSQL): last heartbeat and the shards each holds.
    Nodes,
    /// Stop starting the queue's tasks (durable; creates are still accepted).
    Pause { queue: String },
    /// Start the queue's waiting tasks again, in due order.
    Resume { queue: String },
    /// Replace the queue's settings: retention of finished tasks (e.g. 1d, 12h; unset ones
    /// follow the server's defaults), the default push target and the concurrency limit (none
    /// unless given).
    Set {
        queue: String,
        /// At most this many of the queue's tasks run at once, on every node together
        /// (handlers, push deliveries and workers alike); 1 to 10000.
        #[arg(long)]
        concurrency: Option<u32>,
        #[arg(long)]
        retention_succeeded: Option<String>,
        #[arg(long)]
        retention_cancelled: Option<String>,
        #[arg(long)]
        retention_dead: Option<String>,
        /// Deliver the queue's tasks that have no target of their own by calling this URL.
        #[arg(long)]
        target: Option<String>,
        /// The push call's method (default POST).
        #[arg(long, requires = "target")]
        target_method: Option<String>,
        /// A push call header, name:value (repeatable).
        #[arg(long, requires = "target")]
        target_header: Vec<String>,
        /// The push call's time limit (default 30s).
        #[arg(long, requires = "target")]
        target_timeout: Option<String>,
    },
}

pub async fn run(mut args: QueueArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    let client = Client::with_credentials(&args.server, &args.credentials)
        .context("cannot build the HTTP client")?;
    let json = args.json;
    let result: Result<(), ClientError> = match args.command {
        QueueCommand::Ls => client.queues().await.map(|l| {
            if json {
                crate::task::print_json(&l);
            } else {
                out!("{}", queue_table(&l.queues));
            }
        }),
        QueueCommand::Get { queue } => client.queue(&queue).await.map(|q| show(&q, json)),
        QueueCommand::Workers => client.workers().await.map(|l| {
            if json {
                crate::task::print_json(&l);
            } else {
                out!("{}", worker_table(&l));
            }
        }),
        QueueCommand::Nodes => client.cluster().await.map(|c| {
            if json {
                crate::task::print_json(&c);
            } else {
                out!("{}", node_table(&c));
            }
        }),
        QueueCommand::Pause { queue } => client.pause_queue(&queue).await.map(|q| show(&q, json)),
        QueueCommand::Resume { queue } => client.resume_queue(&queue).await.map(|q| show(&q, json)),
        QueueCommand::Set {
            queue,
            concurrency,
            retention_succeeded,
            retention_cancelled,
            retention_dead,
            target,
            target_method,
            target_header,
            target_timeout,
        } => {
            let mut headers = std::collections::BTreeMap::new();
            for h in &target_header {
                let Some((k, v)) = h.split_once(':') else {
                    anyhow::bail!("--target-header takes name:value, got {h:?}");
                };
                headers.insert(k.trim().to_string(), v.trim().to_string());
            }
            let settings = QueueSettingsView {
                retention: RetentionView {
                    succeeded: retention_succeeded,
                    cancelled: retention_cancelled,
                    dead: retention_dead,
                },
                target: target.map(|url| sundial_server::wire::TargetSpec {
                    url,
                    method: target_method,
                    headers: (!headers.is_empty()).then_some(headers),
                    timeout: target_timeout,
                    retry_statuses: None,
                }),
                concurrency,
            };
            client
                .set_queue(&queue, &settings)
                .await
                .map(|q| show(&q, json))
        }
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            crate::task::report(&e, json);
            Ok(ExitCode::FAILURE)
        }
    }
}

fn count(q: &QueueView, state: &str) -> u64 {
    q.counts.get(state).copied().unwrap_or(0)
}

fn show(q: &QueueView, json: bool) {
    if json {
        crate::task::print_json(q);
        return;
    }
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
    let r = &q.settings.retention;
    let rows: Vec<(&str, String)> = vec![
        ("queue", q.queue.clone()),
        ("paused", if q.paused { "yes" } else { "no" }.to_string()),
        ("changed at", dash(&q.paused_changed_at)),
        (
            "counts",
            [
                "scheduled",
                "ready",
                "running",
                "succeeded",
                "dead",
                "cancelled",
            ]
            .iter()
            .map(|s| format!("{s} {}", count(q, s)))
            .collect::<Vec<_>>()
            .join(", "),
        ),
        ("oldest due", dash(&q.oldest_overdue_at)),
        ("lateness", dash(&q.lateness)),
        ("rate limited", q.rate_limited.to_string()),
        (
            "concurrency",
            q.settings
                .concurrency
                .map(|n| format!("at most {n} running"))
                .unwrap_or_else(|| "no limit".to_string()),
        ),
        (
            "retention",
            format!(
                "succeeded {}, cancelled {}, dead {}",
                r.succeeded.as_deref().unwrap_or("default"),
                r.cancelled.as_deref().unwrap_or("default"),
                r.dead.as_deref().unwrap_or("default"),
            ),
        ),
        (
            "target",
            q.settings
                .target
                .as_ref()
                .map(|t| format!("{} {}", t.method.as_deref().unwrap_or("POST"), t.url))
                .unwrap_or_else(|| "-".to_string()),
        ),
    ];
    for (k, v) in rows {
        outln!("{k:<11} {v}");
    }
}

/// A fixed-width table of queues.
pub fn queue_table(queues: &[QueueView]) -> String {
    let mut out = format!(
        "{:<24} {:<7} {:>10} {:>8} {:>8} {:>10} {:>8} {:>10}  LATENESS\n",
        "QUEUE", "PAUSED", "SCHEDULED", "READY", "RUNNING", "SUCCEEDED", "DEAD", "CANCELLED"
    );
    for q in queues {
        out.push_str(&format!(
            "{:<24} {:<7} {:>10} {:>8} {:>8} {:>10} {:>8} {:>10}  {}\n",
            q.queue,
            if q.paused { "yes" } else { "no" },
            count(q, "scheduled"),
            count(q, "ready"),
            count(q, "running"),
            count(q, "succeeded"),
            count(q, "dead"),
            count(q, "cancelled"),
            q.lateness.as_deref().unwrap_or("-"),
        ));
    }
    out
}

/// A fixed-width table of the workers seen.
pub fn worker_table(l: &WorkerList) -> String {
    let mut out = format!(
        "{:<24} {:<24} {:<24} {:>8}\n",
        "WORKER", "QUEUE", "LAST SEEN", "POLLS"
    );
    for w in &l.workers {
        out.push_str(&format!(
            "{:<24} {:<24} {:<24} {:>8}\n",
            w.worker.as_deref().unwrap_or("-"),
            w.queue,
            w.last_seen_at,
            w.polls
        ));
    }
    out
}

/// The nodes and their shards, or a line saying there is one node.
pub fn node_table(c: &ClusterStatus) -> String {
    if !c.clustered {
        return format!("single node: it runs all {} shards\n", c.shard_count);
    }
    let mut out = format!(
        "{:<32} {:<5} {:<24}  SHARDS\n",
        "NODE", "LIVE", "LAST HEARTBEAT"
    );
    for n in &c.nodes {
        out.push_str(&format!(
            "{:<32} {:<5} {:<24}  {}\n",
            n.node,
            if n.live { "yes" } else { "no" },
            n.last_heartbeat_at.as_deref().unwrap_or("-"),
            shard_list(&n.shards)
        ));
    }
    if !c.unowned_shards.is_empty() {
        out.push_str(&format!(
            "unowned shards: {}\n",
            shard_list(&c.unowned_shards)
        ));
    }
    out
}

fn shard_list(shards: &[u32]) -> String {
    if shards.is_empty() {
        return "-".to_string();
    }
    shards
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
