//! `sundial task ...`: create, inspect, cancel, trigger and retry tasks on a running server, one
//! at a time or every task a filter matches, and show a task's attempts. Human tables
//! by default, JSON (the API's own) with `--json`. Errors go to stderr with the server's code and
//! the exit status is 1.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use sundial_cli::{Client, ClientError};
use sundial_server::ops::{AttemptList, BulkRequest, BulkResponse};
use sundial_server::wire::{
    BackoffSpec, CreateTask, ExclusiveModeView, ExclusiveSpec, ListQuery, StateView, TaskView,
};

use crate::output;

#[derive(Args, Debug)]
pub struct TaskArgs {
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
    command: TaskCommand,
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Create a task.
    Add(Box<AddArgs>),
    /// Show one task.
    Get {
        /// The task's id.
        id: String,
    },
    /// List tasks, newest first (Sundial's own `sundial.…` queues only with --all or --queue).
    Ls(LsArgs),
    /// Cancel a task that has not finished (a task already cancelled is not an error).
    Cancel {
        /// The task's id.
        id: String,
    },
    /// Make a scheduled task due now.
    Trigger {
        /// The task's id.
        id: String,
    },
    /// Show a task's attempts, oldest first.
    Attempts {
        /// The task's id.
        id: String,
    },
    /// Make a dead or cancelled task scheduled again (attempts start over).
    Retry {
        /// The task's id.
        id: String,
        /// Due at this time (RFC 3339) instead of now.
        #[arg(long)]
        at: Option<String>,
    },
    /// Cancel every live task matching a filter.
    CancelAll(BulkArgs),
    /// Retry every dead or cancelled task matching a filter.
    RetryAll {
        #[command(flatten)]
        filter: BulkArgs,
        /// Due at this time (RFC 3339) instead of now.
        #[arg(long)]
        at: Option<String>,
    },
}

/// The filter of a bulk action (at least one is required) and `--dry-run`.
#[derive(Args, Debug)]
struct BulkArgs {
    #[arg(long, short)]
    queue: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    /// scheduled, ready, running, succeeded, dead or cancelled.
    #[arg(long, short, value_parser = parse_state)]
    state: Option<StateView>,
    #[arg(long)]
    key_prefix: Option<String>,
    /// key:value (repeatable; all must match).
    #[arg(long)]
    tag: Vec<String>,
    /// Only tasks whose last error's first line (at most 200 characters) is this: one group of
    /// the dead letters with --state dead and --queue.
    #[arg(long)]
    error_group: Option<String>,
    #[arg(long)]
    created_after: Option<String>,
    #[arg(long)]
    created_before: Option<String>,
    #[arg(long)]
    due_after: Option<String>,
    #[arg(long)]
    due_before: Option<String>,
    /// Only count what would change.
    #[arg(long)]
    dry_run: bool,
}

fn parse_state(s: &str) -> Result<StateView, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| "expected scheduled, ready, running, succeeded, dead or cancelled".to_string())
}

impl BulkArgs {
    fn request(self, run_at: Option<String>) -> BulkRequest {
        BulkRequest {
            queue: self.queue,
            kind: self.kind,
            state: self.state,
            key_prefix: self.key_prefix,
            tag: self.tag,
            error_group: self.error_group,
            created_after: self.created_after,
            created_before: self.created_before,
            due_after: self.due_after,
            due_before: self.due_before,
            dry_run: Some(self.dry_run),
            run_at,
        }
    }
}

#[derive(Args, Debug)]
struct AddArgs {
    /// What the task is (workers and handlers pick tasks by kind).
    kind: String,
    /// The queue (default `default`); workers poll a queue.
    #[arg(long, short)]
    queue: Option<String>,
    /// Business key: at most one live task per queue and key.
    #[arg(long, short)]
    key: Option<String>,
    /// The payload, as JSON (e.g. '{"order": 123}').
    #[arg(long, short)]
    payload: Option<String>,
    /// Due after this delay: 1500ms, 30s, 5m, 3d, 1h30m.
    #[arg(long, short, conflicts_with = "at", allow_hyphen_values = true)]
    delay: Option<String>,
    /// Due at this time (RFC 3339, e.g. 2030-01-02T03:04:05Z).
    #[arg(long)]
    at: Option<String>,
    /// Attempts including the first.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// A group limit: at most --concurrency-limit tasks with this key run at once.
    #[arg(long, requires = "concurrency_limit", conflicts_with = "exclusive")]
    concurrency_key: Option<String>,
    /// How many tasks with --concurrency-key may run at once (1 to 10,000).
    #[arg(long, requires = "concurrency_key", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency_limit: Option<u32>,
    /// A rate limit: at most this many starts per --rate-per (1 to 10,000), evenly spaced, for
    /// the tasks with --rate-key (or this queue's rate-limited tasks without it).
    #[arg(long, requires = "rate_per", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rate_limit: Option<u32>,
    /// The period of --rate-limit, e.g. 1m.
    #[arg(long, requires = "rate_limit", value_name = "DURATION")]
    rate_per: Option<String>,
    /// The key --rate-limit counts starts under (default: the queue).
    #[arg(long, requires = "rate_limit")]
    rate_key: Option<String>,
    /// Admit at most one task per queue and this key per --throttle-per; a create inside the
    /// period stores nothing and prints the admitted task.
    #[arg(long, requires = "throttle_per", conflicts_with = "idempotency_key")]
    throttle_key: Option<String>,
    /// The period of --throttle-key, e.g. 1h.
    #[arg(long, requires = "throttle_key", value_name = "DURATION")]
    throttle_per: Option<String>,
    /// Keep one pending task per queue and this key: while one is scheduled and not started,
    /// a create replaces its payload and due time (--debounce-delay from now) and prints it.
    #[arg(
        long,
        requires = "debounce_delay",
        conflicts_with_all = ["idempotency_key", "throttle_key", "delay", "at"]
    )]
    debounce_key: Option<String>,
    /// How long after the latest create a debounced task is due, e.g. 30s.
    #[arg(long, requires = "debounce_key", value_name = "DURATION")]
    debounce_delay: Option<String>,
    /// The longest a debounced task is put off from its first create, e.g. 5m.
    #[arg(long, requires = "debounce_key", value_name = "DURATION")]
    debounce_max_wait: Option<String>,
    /// 0 to 9 (default 5; 9 the most urgent): among tasks due together, higher starts first.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: Option<u8>,
    /// Time limit of one attempt (a worker's lease), e.g. 30s (default 5m).
    #[arg(long)]
    timeout: Option<String>,
    /// A tag, key:value (repeatable).
    #[arg(long)]
    tag: Vec<String>,
    /// Delay after the first failed attempt, e.g. 10s (default 5s).
    #[arg(long, value_name = "DURATION")]
    backoff_initial: Option<String>,
    /// Growth of the delay per attempt, 1 to 100 (default 5).
    #[arg(long, value_name = "FACTOR")]
    backoff_factor: Option<f64>,
    /// Longest delay between attempts, e.g. 10m (default 1h).
    #[arg(long, value_name = "DURATION")]
    backoff_max: Option<String>,
    /// Fraction of each delay randomised away, 0 to 1 (default 0.2).
    #[arg(long, value_name = "FRACTION")]
    backoff_jitter: Option<f64>,
    /// Mutual exclusion: at most one running task holds this key at a time.
    #[arg(long, value_name = "KEY")]
    exclusive: Option<String>,
    /// Idempotency key: running the same command again (same key and arguments) answers the
    /// task the first run created instead of creating another, also after it finished (within
    /// the server's idempotency window, 24 h by default).
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Revision of the intent under --idempotency-key (default 0): a higher one creates a new
    /// task; a lower one is refused.
    #[arg(long, value_name = "N", requires = "idempotency_key")]
    idempotency_version: Option<u64>,
    /// With --exclusive, when the key is held: `wait` (default) until it is free, or `skip`
    /// (end `cancelled`).
    #[arg(long, value_enum, requires = "exclusive")]
    exclusive_mode: Option<ModeArg>,
    /// Print only the new task's id (for scripts).
    #[arg(long)]
    quiet: bool,
    /// Deliver by calling this URL at the due time (push delivery) instead of a worker.
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
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ModeArg {
    Wait,
    Skip,
}

#[derive(Args, Debug)]
struct LsArgs {
    /// Only this queue.
    #[arg(long, short)]
    queue: Option<String>,
    /// Only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// scheduled, ready, running, succeeded, dead or cancelled.
    #[arg(long, short)]
    state: Option<String>,
    /// Only tasks with this key.
    #[arg(long, short)]
    key: Option<String>,
    /// Keys starting with this.
    #[arg(long)]
    key_prefix: Option<String>,
    /// key:value (repeatable; all must match).
    #[arg(long)]
    tag: Vec<String>,
    /// Only tasks whose last error's first line (at most 200 characters) is this, as the dead
    /// letters group them.
    #[arg(long)]
    error_group: Option<String>,
    /// Due at or after this time (RFC 3339).
    #[arg(long)]
    due_after: Option<String>,
    /// Due before this time (RFC 3339).
    #[arg(long)]
    due_before: Option<String>,
    /// Created at or after this time (RFC 3339).
    #[arg(long)]
    created_after: Option<String>,
    /// Created before this time (RFC 3339).
    #[arg(long)]
    created_before: Option<String>,
    /// Also Sundial's own queues (`sundial.schedules`, `sundial.workflows`, …).
    #[arg(long, short)]
    all: bool,
    /// Page size (1 to 1000).
    #[arg(long, short, default_value_t = 50)]
    limit: usize,
    /// Continue after a previous page (its `next cursor`).
    #[arg(long)]
    cursor: Option<String>,
}

pub async fn run(mut args: TaskArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    let client = Client::with_credentials(&args.server, &args.credentials)
        .context("cannot build the HTTP client")?;
    let json = args.json;
    let result = match args.command {
        TaskCommand::Add(a) => {
            let a = *a;
            let payload = match a.payload {
                Some(p) => Some(serde_json::from_str(&p).context("--payload is not valid JSON")?),
                None => None,
            };
            let mut tags = std::collections::BTreeMap::new();
            for t in &a.tag {
                let Some((k, v)) = t.split_once(':') else {
                    anyhow::bail!("--tag takes key:value, got {t:?}");
                };
                tags.insert(k.to_string(), v.to_string());
            }
            let backoff = (a.backoff_initial.is_some()
                || a.backoff_factor.is_some()
                || a.backoff_max.is_some()
                || a.backoff_jitter.is_some())
            .then_some(BackoffSpec {
                initial: a.backoff_initial,
                factor: a.backoff_factor,
                max: a.backoff_max,
                jitter: a.backoff_jitter,
            });
            let exclusive = a.exclusive.map(|key| ExclusiveSpec {
                key,
                mode: a.exclusive_mode.map(|m| match m {
                    ModeArg::Wait => ExclusiveModeView::Wait,
                    ModeArg::Skip => ExclusiveModeView::Skip,
                }),
            });
            let mut headers = std::collections::BTreeMap::new();
            for h in &a.target_header {
                let Some((k, v)) = h.split_once(':') else {
                    anyhow::bail!("--target-header takes name:value, got {h:?}");
                };
                headers.insert(k.trim().to_string(), v.trim().to_string());
            }
            let target = a.target.map(|url| sundial_server::wire::TargetSpec {
                url,
                method: a.target_method,
                headers: (!headers.is_empty()).then_some(headers),
                timeout: a.target_timeout,
                retry_statuses: None,
            });
            let req = CreateTask {
                target,
                tags: (!tags.is_empty()).then_some(tags),
                queue: a.queue,
                key: a.key,
                payload,
                delay: a.delay,
                run_at: a.at,
                max_attempts: a.max_attempts,
                priority: a.priority,
                concurrency: a
                    .concurrency_key
                    .zip(a.concurrency_limit)
                    .map(|(key, limit)| sundial_server::wire::ConcurrencySpec { key, limit }),
                rate: a.rate_limit.zip(a.rate_per).map(|(limit, per)| {
                    sundial_server::wire::RateSpec {
                        key: a.rate_key,
                        limit,
                        per,
                    }
                }),
                throttle: a
                    .throttle_key
                    .zip(a.throttle_per)
                    .map(|(key, per)| sundial_server::wire::ThrottleSpec { key, per }),
                debounce: a.debounce_key.zip(a.debounce_delay).map(|(key, delay)| {
                    sundial_server::wire::DebounceSpec {
                        key,
                        delay,
                        max_wait: a.debounce_max_wait,
                    }
                }),
                timeout: a.timeout,
                backoff,
                exclusive,
                idempotency_key: a.idempotency_key,
                idempotency_version: a.idempotency_version,
                ..CreateTask::new(a.kind)
            };
            let quiet = a.quiet;
            client.create(&req).await.map(|t| {
                if quiet {
                    outln!("{}", t.id);
                } else {
                    show_task(&t, json)
                }
            })
        }
        TaskCommand::Get { id } => client.get(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Cancel { id } => client.cancel(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Trigger { id } => client.trigger(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Attempts { id } => client.attempts(&id).await.map(|a| show_attempts(&a, json)),
        TaskCommand::Retry { id, at } => client.retry(&id, at).await.map(|t| show_task(&t, json)),
        TaskCommand::CancelAll(f) => client
            .cancel_matching(&f.request(None))
            .await
            .map(|r| show_bulk("cancelled", &r, json)),
        TaskCommand::RetryAll { filter, at } => client
            .retry_matching(&filter.request(at))
            .await
            .map(|r| show_bulk("retried", &r, json)),
        TaskCommand::Ls(l) => {
            let q = ListQuery {
                queue: l.queue,
                kind: l.kind,
                state: l.state,
                key: l.key,
                key_prefix: l.key_prefix,
                tag: l.tag,
                error_group: l.error_group,
                due_after: l.due_after,
                due_before: l.due_before,
                created_after: l.created_after,
                created_before: l.created_before,
                limit: Some(l.limit),
                cursor: l.cursor,
                internal: l.all.then_some(true),
            };
            client.list(&q).await.map(|page| {
                if json {
                    print_json(&page);
                } else {
                    out!("{}", task_table(&page.tasks));
                    if let Some(c) = page.next_cursor {
                        // A page stops after a bounded number of candidates, so it may be
                        // short, even empty, and still have more behind it.
                        if page.tasks.is_empty() {
                            outln!("no matching tasks in this stretch; older ones may match");
                        }
                        outln!("next cursor: {c}");
                    }
                }
            })
        }
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            report(&e, json);
            Ok(ExitCode::FAILURE)
        }
    }
}

pub fn report(e: &ClientError, json: bool) {
    match e {
        ClientError::Api { status, body } => output::report(status.as_u16(), body, json),
        other => eprintln!("error: {}", error_chain(other)),
    }
}

/// An error and its sources on one line (`cannot reach the server: error sending request …:
/// invalid peer certificate: UnknownIssuer`): the cause of a transport error is in its sources.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line
}

pub fn print_json<T: serde::Serialize>(v: &T) {
    output::print_json(v)
}

fn show_bulk(verb: &str, r: &BulkResponse, json: bool) {
    if json {
        print_json(r);
    } else if r.dry_run {
        outln!("{} matching (dry run, nothing changed)", r.matched);
    } else {
        outln!("{} {verb} ({} matching)", r.changed, r.matched);
    }
}

fn show_attempts(a: &AttemptList, json: bool) {
    if json {
        print_json(a);
        return;
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
    outln!(
        "{:<5} {:<26} {:<14} {:<10} {:<12} ERROR",
        "SEQ",
        "STARTED AT",
        "OUTCOME",
        "DURATION",
        "WORKER"
    );
    for t in &a.attempts {
        outln!(
            "{:<5} {:<26} {:<14} {:<10} {:<12} {}",
            t.seq,
            t.started_at,
            t.outcome.clone().unwrap_or_else(|| "running".to_string()),
            t.duration_ms
                .map(|d| format!("{d}ms"))
                .unwrap_or_else(|| "-".to_string()),
            opt(&t.worker),
            opt(&t.error),
        );
    }
    if a.total > a.attempts.len() as u64 {
        outln!(
            "({} attempts in all; the oldest are no longer kept)",
            a.total
        );
    }
}

fn show_task(t: &TaskView, json: bool) {
    if json {
        print_json(t);
        return;
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
    let rows: Vec<(&str, String)> = vec![
        ("id", t.id.to_string()),
        ("queue", t.queue.clone()),
        ("kind", t.kind.clone()),
        ("key", opt(&t.key)),
        ("state", t.state.as_str().to_string()),
        ("run at", t.run_at.clone()),
        ("attempt", format!("{}/{}", t.attempt, t.max_attempts)),
        ("priority", t.priority.to_string()),
        (
            "group limit",
            t.concurrency
                .as_ref()
                .map(|c| format!("{} (at most {})", c.key, c.limit))
                .unwrap_or_else(|| "-".to_string()),
        ),
        (
            "rate limit",
            t.rate
                .as_ref()
                .map(|r| {
                    format!(
                        "{} per {} ({})",
                        r.limit,
                        r.per,
                        r.key.as_deref().unwrap_or("the queue")
                    )
                })
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("timeout", t.timeout.clone()),
        ("payload", t.payload.to_string()),
        (
            "tags",
            if t.tags.is_empty() {
                "-".to_string()
            } else {
                t.tags
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ),
        ("worker", opt(&t.worker)),
        ("last error", opt(&t.last_error)),
        (
            "result",
            t.result
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".to_string()),
        ),
        ("created at", t.created_at.clone()),
        ("started at", opt(&t.started_at)),
        ("finished at", opt(&t.finished_at)),
    ];
    for (k, v) in rows {
        outln!("{k:<12} {v}");
    }
}

/// A table of tasks.
pub fn task_table(tasks: &[TaskView]) -> String {
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.queue.clone(),
                t.kind.clone(),
                t.state.as_str().to_string(),
                t.run_at.clone(),
                format!("{}/{}", t.attempt, t.max_attempts),
                t.key.clone().unwrap_or_else(|| "-".to_string()),
            ]
        })
        .collect();
    output::table(
        &["ID", "QUEUE", "KIND", "STATE", "RUN AT", "ATTEMPT", "KEY"],
        &rows,
    )
}
