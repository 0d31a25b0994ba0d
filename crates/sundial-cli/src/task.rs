//! `sundial task ...`: create, inspect, cancel and trigger tasks on a running server. Human tables
//! by default, JSON (the API's own) with `--json`. Errors go to stderr with the server's code and
//! the exit status is 1.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use sundial_cli::{Client, ClientError};
use sundial_server::wire::{CreateTask, ListQuery, TaskView};

#[derive(Args, Debug)]
pub struct TaskArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: TaskCommand,
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Create a task.
    Add(AddArgs),
    /// Show one task.
    Get { id: String },
    /// List tasks, newest first.
    Ls(LsArgs),
    /// Cancel a task that has not finished.
    Cancel { id: String },
    /// Make a scheduled task due now.
    Trigger { id: String },
}

#[derive(Args, Debug)]
struct AddArgs {
    /// What the task is (workers and handlers pick tasks by kind).
    kind: String,
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
    /// Time limit of one attempt (a worker's lease).
    #[arg(long)]
    timeout: Option<String>,
}

#[derive(Args, Debug)]
struct LsArgs {
    #[arg(long, short)]
    queue: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    /// scheduled, ready, running, succeeded, dead or cancelled.
    #[arg(long, short)]
    state: Option<String>,
    #[arg(long, short)]
    key: Option<String>,
    /// Page size (1 to 1000).
    #[arg(long, short, default_value_t = 50)]
    limit: usize,
    /// Continue after a previous page (its `next cursor`).
    #[arg(long)]
    cursor: Option<String>,
}

pub async fn run(args: TaskArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&args.server).context("cannot build the HTTP client")?;
    let json = args.json;
    let result = match args.command {
        TaskCommand::Add(a) => {
            let payload = match a.payload {
                Some(p) => Some(serde_json::from_str(&p).context("--payload is not valid JSON")?),
                None => None,
            };
            let req = CreateTask {
                queue: a.queue,
                key: a.key,
                payload,
                delay: a.delay,
                run_at: a.at,
                max_attempts: a.max_attempts,
                timeout: a.timeout,
                ..CreateTask::new(a.kind)
            };
            client.create(&req).await.map(|t| show_task(&t, json))
        }
        TaskCommand::Get { id } => client.get(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Cancel { id } => client.cancel(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Trigger { id } => client.trigger(&id).await.map(|t| show_task(&t, json)),
        TaskCommand::Ls(l) => {
            let q = ListQuery {
                queue: l.queue,
                kind: l.kind,
                state: l.state,
                key: l.key,
                limit: Some(l.limit),
                cursor: l.cursor,
            };
            client.list(&q).await.map(|page| {
                if json {
                    print_json(&page);
                } else {
                    print!("{}", task_table(&page.tasks));
                    if let Some(c) = page.next_cursor {
                        println!("next cursor: {c}");
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

fn report(e: &ClientError, json: bool) {
    match e {
        ClientError::Api { body, .. } if json => {
            eprintln!(
                "{}",
                serde_json::to_string(body).unwrap_or_else(|_| e.to_string())
            );
        }
        ClientError::Api { status, body } => {
            let mut line = format!(
                "error: {} {}: {}",
                status.as_u16(),
                body.error.code,
                body.error.message
            );
            if let Some(id) = body.error.existing_id {
                line.push_str(&format!(" (existing task: {id})"));
            }
            eprintln!("{line}");
        }
        other => eprintln!("error: {other}"),
    }
}

fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
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
        ("timeout", t.timeout.clone()),
        ("payload", t.payload.to_string()),
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
        println!("{k:<12} {v}");
    }
}

/// A fixed-width table of tasks.
pub fn task_table(tasks: &[TaskView]) -> String {
    let header = ["ID", "QUEUE", "KIND", "STATE", "RUN AT", "ATTEMPT", "KEY"];
    let rows: Vec<[String; 7]> = tasks
        .iter()
        .map(|t| {
            [
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
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for r in &rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}
