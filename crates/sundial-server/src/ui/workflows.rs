//! Workflows: the list by type and status, a run's page (its history as a timeline, what it
//! waits for: activities, timers; the signals it got; its result or error) and signal, cancel,
//! terminate, of the viewer's namespace (ids shown as the namespace knows them).

use std::collections::BTreeMap;

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;
use sundial_workflow::{Event, WorkflowFilter, WorkflowRun, WorkflowStatus, Workflows};

use super::fmt;
use super::{
    Chrome, Fields, PageRequest, UiError, UiState, Viewer, action_word, enc, page_or_error,
    page_request, perform, render, see_other, with_notice,
};
use crate::workflows::api_error;

fn workflows(st: &UiState) -> Result<&Workflows, UiError> {
    st.workflows
        .as_ref()
        .ok_or_else(|| UiError::not_found("this store does not keep workflows"))
}

struct Row {
    id: String,
    href: String,
    workflow_type: String,
    status: &'static str,
    events: u64,
    created: String,
    closed: String,
}

#[derive(Template)]
#[template(path = "ui/workflows.html")]
struct ListPage {
    chrome: Chrome,
    workflow_type: String,
    statuses: Vec<(&'static str, bool)>,
    rows: Vec<Row>,
    next: Option<String>,
}

/// `GET /ui/workflows?type=&status=&cursor=`.
pub(crate) async fn list(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/workflows", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, list_page(&st, &v, &q).await)
}

async fn list_page(st: &UiState, v: &Viewer, q: &Fields) -> Result<Response, UiError> {
    let wf = workflows(st)?;
    let status = match q.get("status") {
        Some(s) => Some(
            s.parse::<WorkflowStatus>()
                .map_err(|e| UiError::bad_request(format!("status: {e}")))?,
        ),
        None => None,
    };
    let filter = WorkflowFilter {
        workflow_type: q.get("type"),
        status,
        namespace: Some(v.ns.name().to_string()),
    };
    let cursor = q
        .get("cursor")
        .map(|c| v.ns.given("cursor", &c))
        .transpose()?;
    let page = wf
        .list(&filter, cursor.as_deref(), 50)
        .await
        .map_err(api_error)?;
    let next = page.next_cursor.map(|c| {
        let rest = q.query_without(&["cursor", "notice"]);
        let sep = if rest.is_empty() { "" } else { "&" };
        format!("/ui/workflows?{rest}{sep}cursor={}", enc(local(&c)))
    });
    let t = ListPage {
        chrome: Chrome::new(v, "workflows", "Workflows").notice(q.get("notice")),
        workflow_type: q.get("type").unwrap_or_default(),
        statuses: WorkflowStatus::ALL
            .iter()
            .map(|s| (s.as_str(), Some(s.as_str()) == q.get("status").as_deref()))
            .collect(),
        rows: page
            .runs
            .iter()
            .map(|r| Row {
                id: local(&r.workflow_id).to_string(),
                href: format!("/ui/workflow?id={}", enc(local(&r.workflow_id))),
                workflow_type: r.workflow_type.clone(),
                status: r.status.as_str(),
                events: r.history_len,
                created: fmt::at(r.created_at),
                closed: r.closed_at.map(fmt::at).unwrap_or_default(),
            })
            .collect(),
        next,
    };
    Ok(render(v, &t))
}

struct EventRow {
    seq: u64,
    at: String,
    kind: String,
    class: &'static str,
    detail: String,
}

struct Pending {
    what: String,
    detail: String,
    task: String,
}

#[derive(Template)]
#[template(path = "ui/workflow.html")]
struct RunPage {
    chrome: Chrome,
    id: String,
    run_id: String,
    workflow_type: String,
    status: &'static str,
    running: bool,
    input: String,
    result: Option<String>,
    error: Option<String>,
    parent: String,
    parent_href: String,
    created: String,
    closed: String,
    events: Vec<EventRow>,
    activities: Vec<Pending>,
    timers: Vec<Pending>,
    signals: Vec<Pending>,
}

/// `GET /ui/workflow?id=`.
pub(crate) async fn show(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/workflow", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, run_page(&st, &v, &q).await)
}

fn pretty_text(json_text: &str) -> String {
    serde_json::from_str::<Value>(json_text)
        .map(|v| fmt::json(&v))
        .unwrap_or_else(|_| json_text.to_string())
}

/// The event's name and what to show of it (the JSON form without the tag).
fn describe(e: &Event) -> (String, &'static str, String) {
    let v = serde_json::to_value(e).unwrap_or(Value::Null);
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("event")
        .to_string();
    let detail = match v {
        Value::Object(mut m) => {
            m.remove("type");
            if m.is_empty() {
                String::new()
            } else {
                Value::Object(m).to_string()
            }
        }
        _ => String::new(),
    };
    let class = match e {
        Event::WorkflowCompleted { .. } => "ok",
        Event::WorkflowFailed { .. }
        | Event::WorkflowCancelled { .. }
        | Event::WorkflowTerminated { .. }
        | Event::ActivityFailed { .. }
        | Event::ChildStartFailed { .. } => "bad",
        Event::WorkflowTaskCompleted { .. } => "marker",
        Event::SignalReceived { .. } | Event::CancelRequested { .. } => "input",
        _ => "",
    };
    (kind, class, detail)
}

/// A stored workflow id as the viewer's namespace knows it.
fn local(stored: &str) -> &str {
    sundial_core::namespace::local(stored)
}

/// The stored id of the viewer's namespace's workflow `id` (`404` for one naming another
/// namespace's).
fn stored(v: &Viewer, id: &str) -> Result<String, UiError> {
    v.ns.qualify_given(id)
        .ok_or_else(|| UiError::not_found("no such workflow"))
}

async fn run_page(st: &UiState, v: &Viewer, q: &Fields) -> Result<Response, UiError> {
    let wf = workflows(st)?;
    let id = q
        .get("id")
        .ok_or_else(|| UiError::bad_request("id is required"))?;
    let run: WorkflowRun = wf
        .get(&stored(v, &id)?)
        .await
        .map_err(api_error)?
        .ok_or_else(|| UiError::not_found("no such workflow"))?;
    let history = wf.history(run.run_id).await.map_err(api_error)?;
    let mut activities: BTreeMap<u32, Pending> = BTreeMap::new();
    let mut timers: BTreeMap<u32, Pending> = BTreeMap::new();
    let mut signals = Vec::new();
    let mut events = Vec::with_capacity(history.len());
    for e in &history {
        match &e.event {
            Event::ActivityScheduled {
                cmd,
                name,
                task,
                max_attempts,
                ..
            } => {
                activities.insert(
                    *cmd,
                    Pending {
                        what: name.clone(),
                        detail: format!("up to {max_attempts} attempts, since {}", fmt::at(e.at)),
                        task: task.to_string(),
                    },
                );
            }
            Event::ActivityCompleted { cmd, .. }
            | Event::ActivityFailed { cmd, .. }
            | Event::ActivityCancelRequested { cmd, .. } => {
                activities.remove(cmd);
            }
            Event::TimerStarted { cmd, fire_at, task } => {
                timers.insert(
                    *cmd,
                    Pending {
                        what: format!("timer {cmd}"),
                        detail: format!("fires at {}", fmt::at(*fire_at)),
                        task: task.to_string(),
                    },
                );
            }
            Event::TimerFired { cmd } | Event::TimerCancelled { cmd, .. } => {
                timers.remove(cmd);
            }
            Event::SignalReceived { name, input } => signals.push(Pending {
                what: name.clone(),
                detail: format!("{} at {}", input, fmt::at(e.at)),
                task: String::new(),
            }),
            _ => {}
        }
        let (kind, class, detail) = describe(&e.event);
        events.push(EventRow {
            seq: e.seq,
            at: fmt::at(e.at),
            kind,
            class,
            detail,
        });
    }
    let running = run.status == WorkflowStatus::Running;
    let t = RunPage {
        chrome: Chrome::new(
            v,
            "workflows",
            format!("Workflow {}", local(&run.workflow_id)),
        )
        .notice(q.get("notice")),
        id: local(&run.workflow_id).to_string(),
        run_id: run.run_id.to_string(),
        workflow_type: run.workflow_type.clone(),
        status: run.status.as_str(),
        running,
        input: pretty_text(&run.input),
        result: run.result.as_deref().map(pretty_text),
        error: run.error.clone(),
        parent: run
            .parent
            .as_ref()
            .map(|p| local(&p.workflow_id).to_string())
            .unwrap_or_default(),
        parent_href: run
            .parent
            .as_ref()
            .map(|p| format!("/ui/workflow?id={}", enc(local(&p.workflow_id))))
            .unwrap_or_default(),
        created: fmt::at(run.created_at),
        closed: run.closed_at.map(fmt::at).unwrap_or_default(),
        events,
        activities: if running {
            activities.into_values().collect()
        } else {
            Vec::new()
        },
        timers: if running {
            timers.into_values().collect()
        } else {
            Vec::new()
        },
        signals,
    };
    Ok(render(v, &t))
}

/// `POST /ui/workflow/{signal|cancel|terminate}` (the workflow's `id` in the form).
pub(crate) async fn act(
    State(st): State<UiState>,
    headers: HeaderMap,
    Path(action): Path<String>,
    body: Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    let route = format!(
        "/ui/workflow/{}",
        action_word(&action, &["signal", "cancel", "terminate"])
    );
    let st2 = st.clone();
    perform(
        &st,
        &headers,
        &body,
        route,
        fields.get("id"),
        |v, f| async move { (None, workflow_action(&st2, &v, &action, &f).await) },
    )
    .await
}

async fn workflow_action(
    st: &UiState,
    v: &Viewer,
    action: &str,
    f: &Fields,
) -> Result<Response, UiError> {
    let wf = workflows(st)?;
    let id = f
        .get("id")
        .ok_or_else(|| UiError::bad_request("id is required"))?;
    let stored_id = stored(v, &id)?;
    let notice = match action {
        "signal" => {
            let name = f
                .get("name")
                .ok_or_else(|| UiError::bad_request("the signal's name is required"))?;
            let input = match f.get("input") {
                Some(text) => serde_json::from_str::<Value>(&text)
                    .map_err(|e| UiError::bad_request(format!("input is not JSON: {e}")))?,
                None => Value::Null,
            };
            wf.signal(&stored_id, &name, input)
                .await
                .map_err(api_error)?;
            format!("Signal {name} sent.")
        }
        "cancel" => {
            wf.cancel(&stored_id, f.get("reason"))
                .await
                .map_err(api_error)?;
            "Cancel requested: the workflow sees it and may compensate.".to_string()
        }
        "terminate" => {
            let reason = f
                .get("reason")
                .unwrap_or_else(|| "terminated from the web UI".to_string());
            wf.terminate(&stored_id, &reason).await.map_err(api_error)?;
            "Terminated.".to_string()
        }
        _ => return Err(UiError::not_found(format!("no such action: {action:?}"))),
    };
    Ok(see_other(&with_notice(
        &format!("/ui/workflow?id={}", enc(&id)),
        &notice,
    )))
}
