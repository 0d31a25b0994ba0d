//! `sundial workflow ...`: durable workflows on a running server (mirrors `/v1/workflows`).
//! Human output by default, the API's JSON with `--json` (for `signal` and `cancel`, whose answer
//! is an empty `202`, a small object saying what was accepted). Errors go to stderr with the HTTP
//! status and the server's code (and field, for invalid input); the exit status is then 1.
//!
//! Workflow ids may contain `/` (child workflows): they are percent-encoded in paths.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sundial_cli::client::segment;
use sundial_server::ErrorBody;
use sundial_server::workflows::{StartResponse, WorkflowList, WorkflowView};

use crate::output;

#[derive(Args, Debug)]
pub struct WorkflowArgs {
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
    command: WorkflowCommand,
}

#[derive(Subcommand, Debug)]
enum WorkflowCommand {
    /// Start a run: `sundial workflow start order --id order-9 --input '{"amount": 5}'`.
    Start {
        /// The workflow type (workers run the code registered for it).
        workflow_type: String,
        /// The workflow id (default: the new run's id).
        #[arg(long)]
        id: Option<String>,
        /// The input, as JSON.
        #[arg(long, short)]
        input: Option<String>,
        /// When the id's last run is closed: allow_duplicate (default),
        /// allow_duplicate_failed_only or reject_duplicate.
        #[arg(long)]
        id_reuse: Option<String>,
    },
    /// Send a signal to a running workflow.
    Signal {
        id: String,
        /// The signal's name.
        name: String,
        /// The signal's input, as JSON.
        #[arg(long, short)]
        input: Option<String>,
    },
    /// Ask a running workflow to cancel (its code decides how: compensation runs).
    Cancel {
        id: String,
        #[arg(long, short)]
        reason: Option<String>,
    },
    /// End a running workflow now, without running its code.
    Terminate {
        id: String,
        #[arg(long, short)]
        reason: Option<String>,
    },
    /// Show a workflow's current run: status, result or error.
    Get { id: String },
    /// List workflows (their current runs), in id order.
    Ls {
        /// Only this workflow type.
        #[arg(long = "type")]
        workflow_type: Option<String>,
        /// Only this status: running, completed, failed, cancelled, terminated,
        /// continued_as_new.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, short, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show the event history of a workflow's current run.
    History { id: String },
}

fn parse_json_arg(flag: &str, s: Option<&str>) -> anyhow::Result<Option<Value>> {
    s.map(serde_json::from_str)
        .transpose()
        .with_context(|| format!("{flag} is not JSON"))
}

struct Api {
    http: reqwest::Client,
    base: String,
    credentials: sundial_cli::Credentials,
}

impl Api {
    /// The response's JSON (`null` for an empty body), or the server's error.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Result<Value, (StatusCode, ErrorBody)>> {
        let mut req = self
            .http
            .request(
                method,
                format!("{}{}", self.base, self.credentials.path(path)),
            )
            .query(query);
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
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(Ok(Value::Null));
            }
            return Ok(Ok(serde_json::from_slice(&bytes).with_context(|| {
                format!("unexpected response: {}", String::from_utf8_lossy(&bytes))
            })?));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Ok(Err((status, e))),
            Err(_) => anyhow::bail!("{status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }
}

/// Prints the server's error (naming the workflow id on a `404`); the exit status is 1.
fn report(status: StatusCode, e: ErrorBody, id: Option<&str>, json: bool) -> ExitCode {
    let mut e = e;
    if let Some(id) = id
        && status == StatusCode::NOT_FOUND
        && !json
    {
        e.error.message = format!("{}: {id:?}", e.error.message);
    }
    output::report(status.as_u16(), &e, json);
    ExitCode::FAILURE
}

fn show(v: &Value) {
    if let Ok(s) = serde_json::to_string_pretty(v) {
        outln!("{s}");
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds), or the number as it is.
fn time_ms(ms: Option<i64>) -> String {
    match ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()) {
        Some(t) => format!("{t:.3}"),
        None => ms.map_or_else(|| "-".to_string(), |ms| ms.to_string()),
    }
}

fn print_workflow(w: &WorkflowView) {
    outln!("id              {}", w.id);
    outln!("run             {}", w.run_id);
    outln!("type            {}", w.workflow_type);
    outln!("status          {}", w.status);
    if let Some(r) = &w.result {
        outln!("result          {r}");
    }
    if let Some(e) = &w.error {
        outln!("error           {e}");
    }
    outln!("history         {} events", w.history_length);
    if let Some(p) = &w.parent_id {
        outln!("parent          {p}");
    }
    if let Some(r) = &w.continued_from {
        outln!("continued from  {r}");
    }
    if let Some(r) = &w.continued_to {
        outln!("continued to    {r}");
    }
    outln!("created         {}", w.created_at);
    outln!("updated         {}", w.updated_at);
    if let Some(c) = &w.closed_at {
        outln!("closed          {c}");
    }
}

fn print_list(list: &WorkflowList) {
    outln!(
        "{:<36} {:<20} {:<17} {:>7}  CREATED",
        "ID",
        "TYPE",
        "STATUS",
        "EVENTS"
    );
    for w in &list.workflows {
        outln!(
            "{:<36} {:<20} {:<17} {:>7}  {}",
            w.id,
            w.workflow_type,
            w.status,
            w.history_length,
            w.created_at
        );
    }
    if let Some(c) = &list.next_cursor {
        outln!("next cursor: {c}");
    }
}

/// One line per event: number, time, type, and the event's other fields as JSON.
fn print_history(v: &Value) {
    if let (Some(id), Some(run)) = (v["workflow_id"].as_str(), v["run_id"].as_str()) {
        outln!("workflow {id}, run {run}");
    }
    outln!("{:>5}  {:<24}  {:<26} DETAILS", "SEQ", "TIME", "TYPE");
    let events = v["events"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for e in events {
        let mut rest = e.as_object().cloned().unwrap_or_default();
        let seq = rest
            .remove("seq")
            .map_or_else(|| "?".to_string(), |s| s.to_string());
        let at = rest.remove("at").and_then(|a| a.as_i64());
        let kind = rest
            .remove("type")
            .and_then(|t| t.as_str().map(str::to_string))
            .unwrap_or_else(|| "?".to_string());
        let details = if rest.is_empty() {
            String::new()
        } else {
            Value::Object(rest).to_string()
        };
        let line = format!("{seq:>5}  {:<24}  {kind:<26} {details}", time_ms(at));
        outln!("{}", line.trim_end());
    }
}

pub async fn run(mut args: WorkflowArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    let api = Api {
        http: args
            .credentials
            .http_builder()?
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .context("cannot set up the HTTP client")?,
        base: args.server.trim_end_matches('/').to_string(),
        credentials: args.credentials.clone(),
    };
    let json_out = args.json;
    match args.command {
        WorkflowCommand::Start {
            workflow_type,
            id,
            input,
            id_reuse,
        } => {
            let mut body = json!({ "type": workflow_type });
            if let Some(i) = parse_json_arg("--input", input.as_deref())? {
                body["input"] = i;
            }
            if let Some(id) = id {
                body["id"] = json!(id);
            }
            if let Some(r) = id_reuse {
                body["id_reuse"] = json!(r);
            }
            match api
                .send(Method::POST, "/v1/workflows", &[], Some(body))
                .await?
            {
                Ok(v) if json_out => show(&v),
                Ok(v) => {
                    let s: StartResponse =
                        serde_json::from_value(v).context("unexpected response")?;
                    outln!("started {} (run {}, {})", s.id, s.run_id, s.status);
                }
                Err((status, e)) => return Ok(report(status, e, None, json_out)),
            }
        }
        WorkflowCommand::Signal { id, name, input } => {
            let mut body = json!({});
            if let Some(i) = parse_json_arg("--input", input.as_deref())? {
                body["input"] = i;
            }
            let path = format!("/v1/workflows/{}/signals/{}", segment(&id), segment(&name));
            match api.send(Method::POST, &path, &[], Some(body)).await? {
                Ok(_) if json_out => show(&json!({"id": id, "signal": name, "accepted": true})),
                Ok(_) => outln!("signal {name} sent to {id}"),
                Err((status, e)) => return Ok(report(status, e, Some(&id), json_out)),
            }
        }
        WorkflowCommand::Cancel { id, reason } => {
            let path = format!("/v1/workflows/{}/cancel", segment(&id));
            match api
                .send(Method::POST, &path, &[], Some(json!({ "reason": reason })))
                .await?
            {
                Ok(_) if json_out => show(&json!({"id": id, "cancel_requested": true})),
                Ok(_) => outln!("cancel requested for {id}"),
                Err((status, e)) => return Ok(report(status, e, Some(&id), json_out)),
            }
        }
        WorkflowCommand::Terminate { id, reason } => {
            let path = format!("/v1/workflows/{}/terminate", segment(&id));
            match api
                .send(Method::POST, &path, &[], Some(json!({ "reason": reason })))
                .await?
            {
                Ok(v) if json_out => show(&v),
                Ok(v) => print_workflow(&serde_json::from_value(v).context("unexpected response")?),
                Err((status, e)) => return Ok(report(status, e, Some(&id), json_out)),
            }
        }
        WorkflowCommand::Get { id } => {
            let path = format!("/v1/workflows/{}", segment(&id));
            match api.send(Method::GET, &path, &[], None).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => print_workflow(&serde_json::from_value(v).context("unexpected response")?),
                Err((status, e)) => return Ok(report(status, e, Some(&id), json_out)),
            }
        }
        WorkflowCommand::Ls {
            workflow_type,
            status,
            limit,
            cursor,
        } => {
            let mut query = vec![("limit", limit.to_string())];
            for (k, v) in [
                ("type", workflow_type),
                ("status", status),
                ("cursor", cursor),
            ] {
                if let Some(v) = v {
                    query.push((k, v));
                }
            }
            match api.send(Method::GET, "/v1/workflows", &query, None).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => print_list(&serde_json::from_value(v).context("unexpected response")?),
                Err((status, e)) => return Ok(report(status, e, None, json_out)),
            }
        }
        WorkflowCommand::History { id } => {
            let path = format!("/v1/workflows/{}/history", segment(&id));
            match api.send(Method::GET, &path, &[], None).await? {
                Ok(v) if json_out => show(&v),
                Ok(v) => print_history(&v),
                Err((status, e)) => return Ok(report(status, e, Some(&id), json_out)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
