//! `sundial schedule ...`: recurring schedules on a running server (mirrors `/v1/schedules`).
//! Human output by default, the API's JSON with `--json`. Errors go to stderr with the server's
//! code (and field, for an invalid spec); the exit status is then 1.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sundial_server::ErrorBody;
use sundial_server::schedules::{FireList, ScheduleList, ScheduleView};

#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    /// Print the API's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Subcommand, Debug)]
enum ScheduleCommand {
    /// Create a schedule: `sundial schedule add report --cron '0 10 * * *' --tz Asia/Shanghai`.
    Add(AddArgs),
    /// List schedules (id order).
    Ls {
        #[arg(long, short, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one schedule with its next fire times and last fires.
    Get { id: String },
    /// Pause: fires are recorded as skipped until unpaused.
    Pause {
        id: String,
        #[arg(long, short)]
        note: Option<String>,
    },
    /// Unpause: fire again from the next fire time (the ones passed while paused stay skipped).
    Unpause {
        id: String,
        #[arg(long, short)]
        note: Option<String>,
    },
    /// Fire now.
    Trigger { id: String },
    /// Fire every fire time in a past range (RFC 3339 times).
    Backfill {
        id: String,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
    },
    /// List fires (fired, skipped, missed), newest first.
    Fires {
        id: String,
        #[arg(long, short, default_value_t = 50)]
        limit: usize,
    },
    /// Delete a schedule (tasks it created stay).
    Rm { id: String },
}

#[derive(Args, Debug)]
struct AddArgs {
    /// The kind of task each fire creates.
    kind: String,
    #[arg(long)]
    id: Option<String>,
    /// A cron expression (5 fields, or 6 with seconds first; @daily, …).
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    cron: Option<String>,
    /// A fixed interval: 15m, 1h30m.
    #[arg(long)]
    every: Option<String>,
    /// IANA time zone (default UTC).
    #[arg(long = "tz")]
    timezone: Option<String>,
    /// skip, buffer_one, buffer_all, allow_all, cancel_other.
    #[arg(long)]
    overlap: Option<String>,
    #[arg(long)]
    queue: Option<String>,
    /// The payload, as JSON.
    #[arg(long, short)]
    payload: Option<String>,
    #[arg(long)]
    jitter: Option<String>,
    #[arg(long)]
    paused: bool,
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn send<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Result<T, ErrorBody>> {
        let mut req = self.http.request(method, format!("{}{}", self.base, path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("cannot read the response")?;
        if status.is_success() {
            let text = if bytes.is_empty() {
                &b"null"[..]
            } else {
                &bytes[..]
            };
            return Ok(Ok(serde_json::from_slice(text).with_context(|| {
                format!("unexpected response: {}", String::from_utf8_lossy(&bytes))
            })?));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Ok(Err(e)),
            Err(_) => anyhow::bail!("{status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }
}

fn report(e: ErrorBody) -> ExitCode {
    let d = e.error;
    match d.field {
        Some(f) if !d.message.starts_with(&format!("{f}:")) => {
            eprintln!("error ({}): {f}: {}", d.code, d.message)
        }
        _ => eprintln!("error ({}): {}", d.code, d.message),
    }
    ExitCode::FAILURE
}

fn print_schedule(s: &ScheduleView) {
    let what = s
        .cron
        .as_ref()
        .map(|c| format!("cron {c:?}"))
        .or_else(|| s.every.as_ref().map(|e| format!("every {e}")))
        .unwrap_or_default();
    println!("id        {}", s.id);
    println!("spec      {what} in {}", s.timezone);
    println!("task      {} (queue {})", s.task.kind, s.task.queue);
    println!("overlap   {}", s.overlap);
    match &s.note {
        Some(n) => println!("paused    {} ({n})", s.paused),
        None => println!("paused    {}", s.paused),
    }
    println!(
        "fires     {} fired, {} skipped, {} missed",
        s.counts.fired, s.counts.skipped, s.counts.missed
    );
    println!("next      {}", s.next_fires.join(", "));
    if let Some(last) = &s.last_fires {
        for f in last {
            println!("last      {} {} ({})", f.nominal_time, f.outcome, f.reason);
        }
    }
}

pub async fn run(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    use reqwest::Method;
    let api = Api {
        http: reqwest::Client::new(),
        base: args.server.trim_end_matches('/').to_string(),
    };
    let json_out = args.json;
    let show = |v: &Value| {
        if let Ok(s) = serde_json::to_string_pretty(v) {
            println!("{s}");
        }
    };
    match args.command {
        ScheduleCommand::Add(a) => {
            let payload: Option<Value> = a
                .payload
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .context("--payload is not JSON")?;
            let mut task = json!({"kind": a.kind});
            if let Some(q) = a.queue {
                task["queue"] = json!(q);
            }
            if let Some(p) = payload {
                task["payload"] = p;
            }
            let mut body = json!({"task": task});
            for (k, v) in [
                ("id", a.id),
                ("cron", a.cron),
                ("every", a.every),
                ("timezone", a.timezone),
                ("overlap", a.overlap),
                ("jitter", a.jitter),
            ] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            if a.paused {
                body["paused"] = json!(true);
            }
            match api
                .send::<Value>(Method::POST, "/v1/schedules", Some(body))
                .await?
            {
                Ok(v) if json_out => show(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return Ok(report(e)),
            }
        }
        ScheduleCommand::Ls { limit, cursor } => {
            let mut path = format!("/v1/schedules?limit={limit}");
            if let Some(c) = cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            match api.send::<Value>(Method::GET, &path, None).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => {
                    let list: ScheduleList = serde_json::from_value(v)?;
                    println!(
                        "{:<28} {:<24} {:<20} {:<7} NEXT",
                        "ID", "SPEC", "TIMEZONE", "PAUSED"
                    );
                    for s in &list.schedules {
                        let spec = s.cron.clone().or(s.every.clone()).unwrap_or_default();
                        let next = s.next_fires.first().cloned().unwrap_or_else(|| "-".into());
                        println!(
                            "{:<28} {:<24} {:<20} {:<7} {next}",
                            s.id, spec, s.timezone, s.paused
                        );
                    }
                    if let Some(c) = list.next_cursor {
                        println!("next cursor: {c}");
                    }
                }
                Err(e) => return Ok(report(e)),
            }
        }
        ScheduleCommand::Fires { id, limit } => {
            let path = format!("/v1/schedules/{id}/fires?limit={limit}");
            match api.send::<Value>(Method::GET, &path, None).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => {
                    let list: FireList = serde_json::from_value(v)?;
                    for f in list.fires {
                        let count = if f.count > 1 {
                            format!(" ×{}", f.count)
                        } else {
                            String::new()
                        };
                        println!("{} {:<8} {}{count}", f.nominal_time, f.outcome, f.reason);
                    }
                }
                Err(e) => return Ok(report(e)),
            }
        }
        ScheduleCommand::Rm { id } => {
            match api
                .send::<Value>(Method::DELETE, &format!("/v1/schedules/{id}"), None)
                .await?
            {
                Ok(_) => println!("deleted {id}"),
                Err(e) => return Ok(report(e)),
            }
        }
        command => {
            let (method, path, body) = match command {
                ScheduleCommand::Get { id } => (Method::GET, format!("/v1/schedules/{id}"), None),
                ScheduleCommand::Pause { id, note } => (
                    Method::POST,
                    format!("/v1/schedules/{id}/pause"),
                    Some(json!({"note": note})),
                ),
                ScheduleCommand::Unpause { id, note } => (
                    Method::POST,
                    format!("/v1/schedules/{id}/unpause"),
                    Some(json!({"note": note})),
                ),
                ScheduleCommand::Trigger { id } => {
                    (Method::POST, format!("/v1/schedules/{id}/trigger"), None)
                }
                ScheduleCommand::Backfill { id, from, to } => (
                    Method::POST,
                    format!("/v1/schedules/{id}/backfill"),
                    Some(json!({"from": from, "to": to})),
                ),
                _ => unreachable!("handled above"),
            };
            match api.send::<Value>(method, &path, body).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => match serde_json::from_value::<ScheduleView>(v.clone()) {
                    Ok(s) => print_schedule(&s),
                    Err(_) => show(&v),
                },
                Err(e) => return Ok(report(e)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
