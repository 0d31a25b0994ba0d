//! `sundial schedule ...`: recurring schedules on a running server (mirrors `/v1/schedules`).
//! Human output by default, the API's JSON with `--json`. Errors go to stderr with the server's
//! code (and field, for an invalid spec); the exit status is then 1.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sundial_cli::client::segment;
use sundial_server::ErrorBody;
use sundial_server::schedules::{BackfillResponse, FireList, FireView, ScheduleList, ScheduleView};

use crate::output;

#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    #[command(flatten)]
    credentials: sundial_cli::Credentials,
    #[command(flatten)]
    ns: sundial_cli::connect::NamespaceArg,
    /// Print the API's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: ScheduleCommand,
}

#[derive(Subcommand, Debug)]
enum ScheduleCommand {
    /// Create a schedule, e.g. `sundial schedule add report.build --id nightly-report --cron '0 10 * * *' --tz Asia/Shanghai`
    /// (the first argument is the kind of task each fire creates).
    Add(AddArgs),
    /// Change a schedule's fields (PATCH): only the flags given change; the schedule is re-armed.
    Update(UpdateArgs),
    /// List schedules (id order).
    Ls {
        /// Page size (1 to 1000).
        #[arg(long, short, default_value_t = 50)]
        limit: usize,
        /// Continue after a previous page (its `next cursor`).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one schedule with its next fire times and last fires.
    Get {
        /// The schedule's id.
        id: String,
    },
    /// Pause: fires are recorded as skipped until unpaused.
    Pause {
        /// The schedule's id.
        id: String,
        /// Why (kept on the schedule).
        #[arg(long, short)]
        note: Option<String>,
    },
    /// Unpause: fire again from the next fire time (the ones passed while paused stay skipped).
    Unpause {
        /// The schedule's id.
        id: String,
        /// Why (kept on the schedule).
        #[arg(long, short)]
        note: Option<String>,
    },
    /// Fire now (a fire of its own, besides the regular ones).
    Trigger {
        /// The schedule's id.
        id: String,
    },
    /// Fire every fire time in a past range, oldest first. By default every one of them runs,
    /// whatever the schedule's overlap policy (see --overlap).
    Backfill {
        /// The schedule's id.
        id: String,
        /// The first fire time covered (RFC 3339, e.g. 2030-01-01T00:00:00Z).
        #[arg(long)]
        from: String,
        /// The last fire time covered (RFC 3339, not in the future).
        #[arg(long)]
        to: String,
        /// The overlap rule between the backfilled fires: allow_all (default), skip,
        /// buffer_one, buffer_all or cancel_other.
        #[arg(long)]
        overlap: Option<String>,
    },
    /// List fires (fired, skipped, missed), newest first.
    Fires {
        /// The schedule's id.
        id: String,
        /// Page size (1 to 1000).
        #[arg(long, short, default_value_t = 50)]
        limit: usize,
    },
    /// Delete a schedule (tasks it created stay).
    Rm {
        /// The schedule's id.
        id: String,
    },
}

#[derive(Args, Debug)]
struct AddArgs {
    /// The kind of task each fire creates.
    kind: String,
    /// The schedule's id (default: a new UUID): letters, digits and `. _ : / -`.
    #[arg(long)]
    id: Option<String>,
    /// Create it paused (fires are recorded as skipped until unpaused).
    #[arg(long)]
    paused: bool,
    /// A note kept with the schedule (shown with its paused state).
    #[arg(long)]
    note: Option<String>,
    #[command(flatten)]
    fields: Fields,
}

#[derive(Args, Debug)]
struct UpdateArgs {
    /// The schedule's id.
    id: String,
    /// A new kind for the task each fire creates.
    #[arg(long)]
    kind: Option<String>,
    #[command(flatten)]
    fields: Fields,
}

/// The fields `add` sets and `update` changes.
#[derive(Args, Debug)]
struct Fields {
    /// A cron expression (5 fields, or 6 with seconds first; @daily, …).
    #[arg(long, conflicts_with = "every")]
    cron: Option<String>,
    /// A fixed interval: 15m, 1h30m.
    #[arg(long)]
    every: Option<String>,
    /// With --every: the instant the intervals count from (RFC 3339; default the Unix epoch).
    #[arg(long, requires = "every")]
    anchor: Option<String>,
    /// IANA time zone (default UTC).
    #[arg(long = "tz")]
    timezone: Option<String>,
    /// A local time that does not exist (DST gap): `shift` (default, fire at the transition) or
    /// `skip`.
    #[arg(long)]
    dst_skipped: Option<String>,
    /// A local time that happens twice (DST overlap): `first` (default), `last` or `both`.
    #[arg(long)]
    dst_repeated: Option<String>,
    /// When the previous fire's task is still live: skip (default), buffer_one, buffer_all,
    /// allow_all, cancel_other.
    #[arg(long)]
    overlap: Option<String>,
    /// Fires missed while everything was down run late if they are at most this old (default
    /// 1m); older ones are recorded as missed.
    #[arg(long)]
    catchup_window: Option<String>,
    /// Delay each fire by a stable random amount up to this (e.g. 30s), to spread load.
    #[arg(long)]
    jitter: Option<String>,
    /// No fires before this time (RFC 3339).
    #[arg(long)]
    start_at: Option<String>,
    /// No fires after this time (RFC 3339).
    #[arg(long)]
    end_at: Option<String>,
    /// The queue of the tasks (default `default`).
    #[arg(long)]
    queue: Option<String>,
    /// The payload of the tasks, as JSON.
    #[arg(long, short)]
    payload: Option<String>,
    /// Attempts per task, including the first (default 5).
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Priority of each fire's task, 0 to 9 (default 5; 9 the most urgent).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: Option<u8>,
    /// Time limit of one attempt of a task (default 5m).
    #[arg(long)]
    timeout: Option<String>,
    /// At most one task of this exclusive key runs at a time (each fire's own key is set by the
    /// schedule: `schedule:<id>@<fire time>`).
    #[arg(long, value_name = "KEY")]
    exclusive: Option<String>,
    /// A tag each fire's task carries, key:value (repeatable).
    #[arg(long, value_name = "KEY:VALUE")]
    tag: Vec<String>,
    /// Deliver each fire's task by calling this URL at its due time (push delivery) instead of
    /// a worker.
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

impl Fields {
    /// The request fields these flags set (the task template only when a task flag is given, or
    /// `kind` is).
    fn into_body(self, kind: Option<String>) -> anyhow::Result<Value> {
        let mut body = json!({});
        let payload: Option<Value> = self
            .payload
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .context("--payload is not JSON")?;
        let task_flag = kind.is_some()
            || self.queue.is_some()
            || payload.is_some()
            || self.max_attempts.is_some()
            || self.priority.is_some()
            || self.timeout.is_some()
            || self.exclusive.is_some()
            || !self.tag.is_empty()
            || self.target.is_some();
        if task_flag {
            let mut task = json!({});
            if let Some(k) = kind {
                task["kind"] = json!(k);
            }
            if let Some(q) = self.queue {
                task["queue"] = json!(q);
            }
            if let Some(p) = payload {
                task["payload"] = p;
            }
            if let Some(n) = self.max_attempts {
                task["max_attempts"] = json!(n);
            }
            if let Some(p) = self.priority {
                task["priority"] = json!(p);
            }
            if let Some(t) = self.timeout {
                task["timeout"] = json!(t);
            }
            if let Some(k) = self.exclusive {
                task["exclusive"] = json!({ "key": k });
            }
            if !self.tag.is_empty() {
                let mut tags = serde_json::Map::new();
                for t in &self.tag {
                    let Some((k, v)) = t.split_once(':') else {
                        anyhow::bail!("--tag takes key:value, got {t:?}");
                    };
                    tags.insert(k.to_string(), json!(v));
                }
                task["tags"] = Value::Object(tags);
            }
            if let Some(url) = self.target {
                let mut target = json!({ "url": url });
                if let Some(m) = self.target_method {
                    target["method"] = json!(m);
                }
                let mut headers = serde_json::Map::new();
                for h in &self.target_header {
                    let Some((k, v)) = h.split_once(':') else {
                        anyhow::bail!("--target-header takes name:value, got {h:?}");
                    };
                    headers.insert(k.trim().to_string(), json!(v.trim()));
                }
                if !headers.is_empty() {
                    target["headers"] = Value::Object(headers);
                }
                if let Some(t) = self.target_timeout {
                    target["timeout"] = json!(t);
                }
                task["target"] = target;
            }
            body["task"] = task;
        }
        for (k, v) in [
            ("cron", self.cron),
            ("every", self.every),
            ("anchor", self.anchor),
            ("timezone", self.timezone),
            ("overlap", self.overlap),
            ("catchup_window", self.catchup_window),
            ("jitter", self.jitter),
            ("start_at", self.start_at),
            ("end_at", self.end_at),
        ] {
            if let Some(v) = v {
                body[k] = json!(v);
            }
        }
        if self.dst_skipped.is_some() || self.dst_repeated.is_some() {
            let mut dst = json!({});
            if let Some(v) = self.dst_skipped {
                dst["skipped"] = json!(v);
            }
            if let Some(v) = self.dst_repeated {
                dst["repeated"] = json!(v);
            }
            body["dst"] = dst;
        }
        Ok(body)
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
    credentials: sundial_cli::Credentials,
}

impl Api {
    async fn send<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Result<T, (u16, ErrorBody)>> {
        let mut req = self.http.request(
            method,
            format!("{}{}", self.base, self.credentials.path(path)),
        );
        match body {
            Some(b) => req = req.json(&b),
            // A bodiless write still says it speaks JSON: the server refuses writes a browser
            // could send cross-site (see `sundial_server::guard`).
            None => req = req.header(reqwest::header::CONTENT_TYPE, "application/json"),
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
            Ok(e) => Ok(Err((status.as_u16(), e))),
            Err(_) => anyhow::bail!("{status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }
}

fn print_schedule(s: &ScheduleView) {
    let what = s
        .cron
        .as_ref()
        .map(|c| format!("cron {c:?}"))
        .or_else(|| s.every.as_ref().map(|e| format!("every {e}")))
        .unwrap_or_default();
    outln!("id        {}", s.id);
    outln!("spec      {what} in {}", s.timezone);
    outln!("task      {} (queue {})", s.task.kind, s.task.queue);
    outln!("overlap   {}", s.overlap);
    match &s.note {
        Some(n) => outln!("paused    {} ({n})", s.paused),
        None => outln!("paused    {}", s.paused),
    }
    outln!(
        "fires     {} fired, {} skipped, {} missed",
        s.counts.fired,
        s.counts.skipped,
        s.counts.missed
    );
    outln!("next      {}", s.next_fires.join(", "));
    if let Some(last) = &s.last_fires {
        for f in last {
            outln!("last      {} {} ({})", f.nominal_time, f.outcome, f.reason);
        }
    }
}

/// A table of fire records: time, outcome, reason, the task it created.
fn fire_table(fires: &[FireView]) -> String {
    let rows: Vec<Vec<String>> = fires
        .iter()
        .map(|f| {
            let time = match (&f.through, f.count) {
                (Some(t), n) if n > 1 => format!("{} … {t} (×{n})", f.nominal_time),
                _ => f.nominal_time.clone(),
            };
            vec![
                time,
                f.outcome.clone(),
                f.reason.clone(),
                f.task_id.map_or_else(|| "-".to_string(), |t| t.to_string()),
            ]
        })
        .collect();
    output::table(&["FIRE TIME", "OUTCOME", "REASON", "TASK"], &rows)
}

pub async fn run(mut args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    use reqwest::Method;
    let api = Api {
        http: args
            .credentials
            .http_builder()?
            .build()
            .context("cannot set up the HTTP client")?,
        base: args.server.trim_end_matches('/').to_string(),
        credentials: args.credentials.clone(),
    };
    let json_out = args.json;
    let fail = |(status, e): (u16, ErrorBody)| {
        output::report(status, &e, json_out);
        Ok(ExitCode::FAILURE)
    };
    let path = |id: &str, rest: &str| format!("/v1/schedules/{}{rest}", segment(id));
    match args.command {
        ScheduleCommand::Add(a) => {
            let mut body = a.fields.into_body(Some(a.kind))?;
            if let Some(id) = a.id {
                body["id"] = json!(id);
            }
            if a.paused {
                body["paused"] = json!(true);
            }
            if let Some(n) = a.note {
                body["note"] = json!(n);
            }
            match api
                .send::<Value>(Method::POST, "/v1/schedules", Some(body))
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Update(u) => {
            let body = u.fields.into_body(u.kind)?;
            if body.as_object().is_some_and(|o| o.is_empty()) {
                anyhow::bail!("nothing to change: give at least one flag (see --help)");
            }
            match api
                .send::<Value>(Method::PATCH, &path(&u.id, ""), Some(body))
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Ls { limit, cursor } => {
            let mut p = format!("/v1/schedules?limit={limit}");
            if let Some(c) = cursor {
                p.push_str(&format!("&cursor={}", segment(&c)));
            }
            match api.send::<Value>(Method::GET, &p, None).await? {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => {
                    let list: ScheduleList = serde_json::from_value(v)?;
                    let rows: Vec<Vec<String>> = list
                        .schedules
                        .iter()
                        .map(|s| {
                            vec![
                                s.id.clone(),
                                s.cron.clone().or(s.every.clone()).unwrap_or_default(),
                                s.timezone.clone(),
                                s.paused.to_string(),
                                s.next_fires.first().cloned().unwrap_or_else(|| "-".into()),
                            ]
                        })
                        .collect();
                    out!(
                        "{}",
                        output::table(&["ID", "SPEC", "TIMEZONE", "PAUSED", "NEXT"], &rows)
                    );
                    if let Some(c) = list.next_cursor {
                        outln!("next cursor: {c}");
                    }
                }
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Fires { id, limit } => {
            let p = path(&id, &format!("/fires?limit={limit}"));
            match api.send::<Value>(Method::GET, &p, None).await? {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => {
                    let list: FireList = serde_json::from_value(v)?;
                    out!("{}", fire_table(&list.fires));
                }
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Trigger { id } => {
            match api
                .send::<Value>(Method::POST, &path(&id, "/trigger"), None)
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => {
                    let f: FireView = serde_json::from_value(v)?;
                    out!("{}", fire_table(std::slice::from_ref(&f)));
                }
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Backfill {
            id,
            from,
            to,
            overlap,
        } => {
            let mut body = json!({"from": from, "to": to});
            if let Some(o) = overlap {
                body["overlap"] = json!(o);
            }
            match api
                .send::<Value>(Method::POST, &path(&id, "/backfill"), Some(body))
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => {
                    let b: BackfillResponse = serde_json::from_value(v)?;
                    out!("{}", fire_table(&b.fires));
                    if !b.already_recorded.is_empty() {
                        outln!(
                            "already recorded (left alone): {}",
                            b.already_recorded.join(", ")
                        );
                    }
                }
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Rm { id } => {
            match api
                .send::<Value>(Method::DELETE, &path(&id, ""), None)
                .await?
            {
                Ok(_) if json_out => output::print_json(&json!({"id": id, "deleted": true})),
                Ok(_) => outln!("deleted {id}"),
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Get { id } => {
            match api.send::<Value>(Method::GET, &path(&id, ""), None).await? {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Pause { id, note } => {
            let body = Some(json!({ "note": note }));
            match api
                .send::<Value>(Method::POST, &path(&id, "/pause"), body)
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return fail(e),
            }
        }
        ScheduleCommand::Unpause { id, note } => {
            let body = Some(json!({ "note": note }));
            match api
                .send::<Value>(Method::POST, &path(&id, "/unpause"), body)
                .await?
            {
                Ok(v) if json_out => output::print_json(&v),
                Ok(v) => print_schedule(&serde_json::from_value(v)?),
                Err(e) => return fail(e),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
