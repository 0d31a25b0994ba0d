//! Tasks: the filtered list, one task's page, its actions, bulk actions and the dead letters.
//!
//! The list takes exactly the query parameters of `GET /v1/tasks` and answers with the same call
//! ([`crate::api::query_tasks`]), so a filtered view is a URL to share and is served by the same
//! indexes. Bulk actions first show what a dry run counts, then act on the same filter.

use std::collections::BTreeMap;

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use sundial::{Task, TaskId, TaskState};

use super::fmt;
use super::{
    Chrome, Fields, PageRequest, UiError, UiState, Viewer, action_word, enc, error_page,
    page_or_error, page_request, perform, query_fields, render, see_other, viewer, with_notice,
};
use crate::ops::BulkRequest;
use crate::wire::StateView;

/// The filter fields of the task list, in the order the form shows them.
pub(crate) const FILTERS: [&str; 11] = [
    "queue",
    "kind",
    "state",
    "key",
    "key_prefix",
    "tag",
    "error_group",
    "due_after",
    "due_before",
    "created_after",
    "created_before",
];

/// One row of a task list.
pub(crate) struct TaskRow {
    pub id: String,
    pub short_id: String,
    pub queue: String,
    pub kind: String,
    pub state: &'static str,
    pub due: String,
    pub due_title: String,
    pub attempts: String,
    pub tags: String,
    pub key: String,
    pub error: String,
}

impl TaskRow {
    pub(crate) fn of(t: &Task, now: sundial::Timestamp) -> Self {
        let id = t.id.to_string();
        TaskRow {
            short_id: id.chars().skip(24).collect(),
            id,
            queue: t.queue.clone(),
            kind: t.kind.clone(),
            state: t.state.as_str(),
            due: fmt::relative(t.due_at, now),
            due_title: fmt::rfc3339(t.due_at),
            attempts: format!("{}/{}", t.attempt, t.max_attempts),
            tags: t
                .tags
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(" "),
            key: t.key.clone().unwrap_or_default(),
            error: t
                .last_error
                .as_deref()
                .map(fmt::first_line)
                .unwrap_or_default(),
        }
    }
}

/// The filter form's current values.
pub(crate) struct FilterForm {
    pub queue: String,
    pub kind: String,
    pub key: String,
    pub key_prefix: String,
    pub tag: String,
    pub error_group: String,
    pub due_after: String,
    pub due_before: String,
    pub created_after: String,
    pub created_before: String,
    pub internal: bool,
}

impl FilterForm {
    fn of(q: &Fields) -> Self {
        let g = |n: &str| q.get(n).unwrap_or_default();
        FilterForm {
            queue: g("queue"),
            kind: g("kind"),
            key: g("key"),
            key_prefix: g("key_prefix"),
            tag: q.all("tag").join(" "),
            error_group: g("error_group"),
            due_after: g("due_after"),
            due_before: g("due_before"),
            created_after: g("created_after"),
            created_before: g("created_before"),
            internal: q.get("internal").as_deref() == Some("true"),
        }
    }
}

/// The states for the state filter's options, the chosen one marked.
pub(crate) fn states(chosen: &str) -> Vec<(&'static str, bool)> {
    TaskState::ALL
        .iter()
        .map(|s| (s.as_str(), s.as_str() == chosen))
        .collect()
}

/// The query with the UI-only parameters left out and tags split (the form's tag field takes
/// several `k:v` separated by spaces; the API takes `tag` repeated); times typed as
/// `2026-12-01T10:00` or `2026-12-01 10:00` are read as UTC.
pub(crate) fn api_query(q: &Fields) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &q.0 {
        let Some(v) = Fields::value(k, v) else {
            continue;
        };
        if matches!(k.as_str(), "id" | "notice" | "action" | "csrf") {
            continue;
        }
        if k == "tag" {
            for t in v.split_whitespace() {
                out.append_pair("tag", t);
            }
        } else if k.ends_with("_after") || k.ends_with("_before") {
            out.append_pair(k, &lenient_time(v));
        } else {
            out.append_pair(k, v);
        }
    }
    out.finish()
}

/// `2026-12-01T10:00`, `2026-12-01 10:00`, `2026-12-01` → RFC 3339 in UTC; anything else as is.
pub(crate) fn lenient_time(v: &str) -> String {
    let v = v.trim().replace(' ', "T");
    let has_zone = v.ends_with('Z')
        || v.ends_with('z')
        || v.get(19..)
            .is_some_and(|rest| rest.contains('+') || rest.contains('-'));
    match v.len() {
        10 => format!("{v}T00:00:00Z"),
        16 if !has_zone => format!("{v}:00Z"),
        19 if !has_zone => format!("{v}Z"),
        _ => v,
    }
}

#[derive(Template)]
#[template(path = "ui/tasks.html")]
struct TasksPage {
    chrome: Chrome,
    f: FilterForm,
    states: Vec<(&'static str, bool)>,
    queues: Vec<String>,
    rows: Vec<TaskRow>,
    error: Option<String>,
    next: Option<String>,
    filtered: bool,
    bulk_query: String,
}

/// `GET /ui/tasks`.
pub(crate) async fn list(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/tasks", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    if let Some(id) = q.get("id") {
        return match id.parse::<TaskId>() {
            Ok(id) => see_other(&format!("/ui/tasks/{id}")),
            Err(_) => error_page(&v, UiError::not_found(format!("{id:?} is not a task id"))),
        };
    }
    let api = api_query(&q);
    let now = st.app.sundial.clock().now();
    let (rows, next, error) = match crate::api::query_tasks(&st.app, &v.ns, &api).await {
        Ok(page) => (
            page.tasks
                .iter()
                .filter_map(|t| v.ns.own(t.clone()))
                .map(|t| TaskRow::of(&t, now))
                .collect(),
            page.next_cursor.map(|c| {
                let rest = q.query_without(&["cursor", "notice"]);
                let sep = if rest.is_empty() { "" } else { "&" };
                format!("/ui/tasks?{rest}{sep}cursor={c}")
            }),
            None,
        ),
        Err(e) => (Vec::new(), None, Some(UiError::from(e).message)),
    };
    let queues = queue_names(&st, &v.ns).await;
    let bulk_query = q.query_without(&["cursor", "notice", "limit", "internal", "key"]);
    let t = TasksPage {
        chrome: Chrome::new(&v, "tasks", "Tasks").notice(q.get("notice")),
        f: FilterForm::of(&q),
        states: states(&q.get("state").unwrap_or_default()),
        queues,
        filtered: !bulk_query.is_empty(),
        bulk_query,
        rows,
        error: error.clone(),
        next,
    };
    let mut resp = render(&v, &t);
    if error.is_some() {
        *resp.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    }
    resp
}

/// The names of the queues that have tasks (from the maintained counters: no scan).
pub(crate) async fn queue_names(st: &UiState, ns: &crate::namespace::Ns) -> Vec<String> {
    let mut names: Vec<String> = st
        .app
        .sundial
        .counts()
        .await
        .map(|c| {
            c.into_iter()
                .filter_map(|c| ns.local(&c.queue).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.dedup();
    names
}

struct Entry {
    at: String,
    title: String,
    what: String,
    detail: String,
}

struct AttemptRow {
    seq: u64,
    worker: String,
    started: String,
    ended: String,
    outcome: String,
    duration: String,
    error: String,
}

#[derive(Template)]
#[template(path = "ui/task.html")]
struct TaskPage {
    chrome: Chrome,
    id: String,
    queue: String,
    queue_href: String,
    kind: String,
    state: &'static str,
    key: String,
    due: String,
    due_title: String,
    attempts: String,
    payload: String,
    result: Option<String>,
    last_error: Option<String>,
    tags: Vec<(String, String)>,
    target: Option<String>,
    worker: String,
    attempt_rows: Vec<AttemptRow>,
    attempts_total: u64,
    timeline: Vec<Entry>,
    can_cancel: bool,
    can_trigger: bool,
    can_retry: bool,
}

/// `GET /ui/tasks/{id}`.
pub(crate) async fn show(
    State(st): State<UiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let v = match viewer(&st, &headers, &format!("/ui/tasks/{id}")).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = query_fields(raw.as_deref());
    match task_page(&st, &v, &id, q.get("notice")).await {
        Ok(r) => r,
        Err(e) => error_page(&v, e),
    }
}

fn parse_id(id: &str) -> Result<TaskId, UiError> {
    id.parse::<TaskId>()
        .map_err(|_| UiError::not_found(format!("no such task: {id:?} is not a task id")))
}

async fn task_page(
    st: &UiState,
    v: &Viewer,
    id: &str,
    notice: Option<String>,
) -> Result<Response, UiError> {
    let id = parse_id(id)?;
    let s = &st.app.sundial;
    // The viewer's namespace's task only (another namespace's reads as missing).
    let task = s
        .get(id)
        .await?
        .and_then(|t| v.ns.own(t))
        .ok_or_else(|| UiError::not_found("no such task"))?;
    let history = s.attempts(id).await?;
    let now = s.clock().now();
    let mut timeline = vec![Entry {
        at: fmt::at(task.created_at),
        title: fmt::rfc3339(task.created_at),
        what: "created".into(),
        detail: format!("due {}", fmt::at(task.due_at)),
    }];
    let mut attempt_rows = Vec::new();
    for a in &history.attempts {
        timeline.push(Entry {
            at: fmt::at(a.started_at),
            title: fmt::rfc3339(a.started_at),
            what: format!("attempt {} started", a.seq),
            detail: a
                .worker
                .clone()
                .map(|w| format!("on worker {w}"))
                .unwrap_or_else(|| "in process".into()),
        });
        if let Some(end) = a.ended_at {
            let outcome = a.outcome.map(|o| o.as_str()).unwrap_or("ended");
            timeline.push(Entry {
                at: fmt::at(end),
                title: fmt::rfc3339(end),
                what: format!("attempt {} {outcome}", a.seq),
                detail: a.error.as_deref().map(fmt::first_line).unwrap_or_default(),
            });
        }
        attempt_rows.push(AttemptRow {
            seq: a.seq,
            worker: a.worker.clone().unwrap_or_else(|| "in process".into()),
            started: fmt::at(a.started_at),
            ended: a.ended_at.map(fmt::at).unwrap_or_else(|| "running".into()),
            outcome: a
                .outcome
                .map(|o| o.as_str().to_string())
                .unwrap_or_else(|| "running".into()),
            duration: a
                .duration_ms()
                .map(|ms| fmt::short(std::time::Duration::from_millis(ms)))
                .unwrap_or_default(),
            error: a.error.clone().unwrap_or_default(),
        });
    }
    if let Some(f) = task.finished_at {
        timeline.push(Entry {
            at: fmt::at(f),
            title: fmt::rfc3339(f),
            what: task.state.as_str().to_string(),
            detail: String::new(),
        });
    } else if task.state == TaskState::Scheduled {
        timeline.push(Entry {
            at: fmt::at(task.due_at),
            title: fmt::rfc3339(task.due_at),
            what: "due".into(),
            detail: fmt::relative(task.due_at, now),
        });
    }
    timeline.sort_by(|a, b| a.title.cmp(&b.title));
    let live = !task.state.is_terminal();
    let can = v.can_act();
    let t = TaskPage {
        chrome: Chrome::new(v, "tasks", format!("Task {}", task.id)).notice(notice),
        id: task.id.to_string(),
        queue_href: format!("/ui/tasks?queue={}", enc(&task.queue)),
        queue: task.queue.clone(),
        kind: task.kind.clone(),
        state: task.state.as_str(),
        key: task.key.clone().unwrap_or_default(),
        due: format!(
            "{} ({})",
            fmt::at(task.due_at),
            fmt::relative(task.due_at, now)
        ),
        due_title: fmt::rfc3339(task.due_at),
        attempts: format!("{} of {}", task.attempt, task.max_attempts),
        payload: fmt::json(&task.payload),
        result: task.result.as_ref().map(fmt::json),
        last_error: task.last_error.clone(),
        tags: task
            .tags
            .iter()
            .map(|(k, v)| {
                (
                    format!("{k}:{v}"),
                    format!("/ui/tasks?tag={}", enc(&format!("{k}:{v}"))),
                )
            })
            .collect(),
        target: task.target.as_ref().map(|t| {
            serde_json::to_value(crate::wire::TargetSpec::from_target(t.clone()))
                .map(|v| fmt::json(&v))
                .unwrap_or_default()
        }),
        worker: task.worker.clone().unwrap_or_default(),
        attempt_rows,
        attempts_total: history.total,
        timeline,
        can_cancel: can && live,
        can_trigger: can && task.state == TaskState::Scheduled,
        can_retry: can && matches!(task.state, TaskState::Dead | TaskState::Cancelled),
    };
    Ok(render(v, &t))
}

/// `POST /ui/tasks/{id}/{cancel|trigger|retry}`.
pub(crate) async fn act(
    State(st): State<UiState>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let route = format!("/ui/tasks/{{id}}/{}", route_word(&action));
    let st2 = st.clone();
    perform(
        &st,
        &headers,
        &body,
        route,
        Some(id.clone()),
        |v, f| async move { (None, task_action(&st2, &v, &id, &action, &f).await) },
    )
    .await
}

/// The action word for the audit record's route (only known ones, so a probe cannot write
/// arbitrary text into the log).
fn route_word(action: &str) -> &str {
    action_word(
        action,
        &[
            "cancel",
            "trigger",
            "retry",
            "pause",
            "resume",
            "unpause",
            "backfill",
            "edit",
            "signal",
            "terminate",
        ],
    )
}

async fn task_action(
    st: &UiState,
    v: &Viewer,
    id: &str,
    action: &str,
    f: &Fields,
) -> Result<Response, UiError> {
    let tid = parse_id(id)?;
    let s = &st.app.sundial;
    s.get(tid)
        .await?
        .and_then(|t| v.ns.own(t))
        .ok_or_else(|| UiError::not_found("no such task"))?;
    let notice = match action {
        "cancel" => match s.cancel(tid).await {
            Ok(_)
            | Err(sundial::Error::WrongState {
                state: TaskState::Cancelled,
            }) => "Cancelled.",
            Err(e) => return Err(e.into()),
        },
        "trigger" => {
            s.trigger(tid).await?;
            "Triggered: due now."
        }
        "retry" => {
            let run_at = match f.get("run_at") {
                Some(t) => Some(
                    crate::time::parse(&lenient_time(&t))
                        .map_err(|e| UiError::bad_request(format!("run_at: {e}")))?,
                ),
                None => None,
            };
            s.retry(tid, run_at).await?;
            "Scheduled again."
        }
        _ => return Err(UiError::not_found(format!("no such action: {action:?}"))),
    };
    Ok(see_other(&with_notice(&format!("/ui/tasks/{tid}"), notice)))
}

/// A bulk request from the list's filter fields.
fn bulk_request(q: &Fields) -> Result<BulkRequest, UiError> {
    let state = match q.get("state") {
        Some(s) => Some(
            serde_json::from_value::<StateView>(serde_json::Value::String(s.clone()))
                .map_err(|_| UiError::bad_request(format!("state: no such state {s:?}")))?,
        ),
        None => None,
    };
    let time = |n: &str| q.get(n).map(|t| lenient_time(&t));
    Ok(BulkRequest {
        queue: q.get("queue"),
        kind: q.get("kind"),
        state,
        key_prefix: q.get("key_prefix"),
        tag: q
            .all("tag")
            .iter()
            .flat_map(|t| t.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect(),
        error_group: q.get("error_group"),
        created_after: time("created_after"),
        created_before: time("created_before"),
        due_after: time("due_after"),
        due_before: time("due_before"),
        dry_run: None,
        run_at: None,
    })
}

#[derive(Template)]
#[template(path = "ui/bulk.html")]
struct BulkPage {
    chrome: Chrome,
    action: &'static str,
    matched: u64,
    filters: Vec<(String, String)>,
    back: String,
}

fn bulk_action(q: &Fields) -> Result<&'static str, UiError> {
    match q.get("action").as_deref() {
        Some("cancel") => Ok("cancel"),
        Some("retry") => Ok("retry"),
        _ => Err(UiError::bad_request("action must be cancel or retry")),
    }
}

async fn run_bulk(
    st: &UiState,
    ns: &crate::namespace::Ns,
    action: &str,
    q: &Fields,
    dry_run: bool,
) -> Result<sundial::BulkOutcome, UiError> {
    let req = bulk_request(q)?;
    let filter = req.filter(ns)?;
    let s = &st.app.sundial;
    Ok(if action == "cancel" {
        s.cancel_matching(filter, dry_run).await?
    } else {
        s.retry_matching(filter, None, dry_run).await?
    })
}

/// The filter fields of a bulk action, as (name, value) pairs for hidden inputs.
fn bulk_fields(q: &Fields) -> Vec<(String, String)> {
    q.0.iter()
        .filter(|(k, _)| FILTERS.contains(&k.as_str()) && k != "key")
        .filter_map(|(k, v)| Some((k.clone(), Fields::value(k, v)?.to_string())))
        .collect()
}

/// `GET /ui/tasks/bulk?action=…&<filter>`: how many tasks the action would change (a dry run).
pub(crate) async fn bulk_preview(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/tasks/bulk", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    let result = async {
        let action = bulk_action(&q)?;
        let out = run_bulk(&st, &v.ns, action, &q, true).await?;
        Ok::<_, UiError>(BulkPage {
            chrome: Chrome::new(&v, "tasks", format!("Bulk {action}")),
            action,
            matched: out.matched,
            filters: bulk_fields(&q),
            back: format!("/ui/tasks?{}", q.query_without(&["action", "notice"])),
        })
    }
    .await;
    match result {
        Ok(t) => render(&v, &t),
        Err(e) => error_page(&v, e),
    }
}

/// `POST /ui/tasks/bulk`: the action over the filter.
pub(crate) async fn bulk_apply(
    State(st): State<UiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let action = bulk_action(&Fields::parse(&body)).unwrap_or("{action}");
    let route = format!("/ui/tasks/bulk/{action}");
    let st2 = st.clone();
    perform(&st, &headers, &body, route, None, |v, q| async move {
        let result = async {
            let action = bulk_action(&q)?;
            let out = run_bulk(&st2, &v.ns, action, &q, false).await?;
            let done = if action == "cancel" {
                "Cancelled"
            } else {
                "Retried"
            };
            let back = format!(
                "/ui/tasks?{}",
                q.query_without(&["action", "csrf", "notice"])
            );
            Ok::<_, UiError>((
                format!("{} of {} tasks", out.changed, out.matched),
                see_other(&with_notice(
                    &back,
                    &format!("{done} {} of {} matching tasks.", out.changed, out.matched),
                )),
            ))
        }
        .await;
        match result {
            Ok((target, r)) => (Some(target), Ok(r)),
            Err(e) => (None, Err(e)),
        }
    })
    .await
}

struct DeadQueue {
    queue: String,
    count: u64,
    href: String,
    retry_href: String,
}

/// Error groups shown on the dead letters.
const GROUPS: usize = 100;

struct ErrorGroup {
    queue: String,
    queue_href: String,
    /// The group's tasks: the task list filtered by queue, state dead and error group.
    /// `None` (as `retry_href`) for tasks that died with no error recorded, which no filter
    /// names.
    list_href: Option<String>,
    /// The group's bulk retry (a dry run's count first, then the confirm form).
    retry_href: Option<String>,
    error: String,
    count: u64,
    example: String,
}

#[derive(Template)]
#[template(path = "ui/dead.html")]
struct DeadPage {
    chrome: Chrome,
    queue: String,
    queues: Vec<DeadQueue>,
    groups: Vec<ErrorGroup>,
    rows: Vec<TaskRow>,
    next: Option<String>,
    retry_href: String,
}

/// `GET /ui/dead?queue=&cursor=`: dead tasks by queue (from the counters), by queue and error
/// across the store (one aggregate query), and a page of them.
pub(crate) async fn dead(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/dead", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, dead_page(&st, &v, &q).await)
}

async fn dead_page(st: &UiState, v: &Viewer, q: &Fields) -> Result<Response, UiError> {
    let s = &st.app.sundial;
    let queue = q.get("queue").unwrap_or_default();
    let mut by_queue: BTreeMap<String, u64> = BTreeMap::new();
    for c in s.counts().await? {
        if c.state == TaskState::Dead
            && c.count > 0
            && let Some(local) = v.ns.local(&c.queue)
        {
            *by_queue.entry(local.to_string()).or_default() += c.count;
        }
    }
    let queues = by_queue
        .into_iter()
        .map(|(queue, count)| DeadQueue {
            href: format!("/ui/dead?queue={}", enc(&queue)),
            retry_href: format!(
                "/ui/tasks/bulk?action=retry&state=dead&queue={}",
                enc(&queue)
            ),
            queue,
            count,
        })
        .collect();
    let mut api = "state=dead&limit=100&internal=true".to_string();
    if !queue.is_empty() {
        api.push_str(&format!("&queue={}", enc(&queue)));
    }
    if let Some(c) = q.get("cursor") {
        api.push_str(&format!("&cursor={}", enc(&c)));
    }
    let page = crate::api::query_tasks(&st.app, &v.ns, &api).await?;
    let now = s.clock().now();
    // Across the namespace (or the queue): one aggregate over the index of dead tasks.
    let stored_queue = v.ns.given("queue", &queue)?;
    let groups = s
        .dead_groups(
            (!queue.is_empty()).then_some(stored_queue.as_str()),
            Some(v.ns.name()),
            GROUPS,
        )
        .await?
        .into_iter()
        .filter_map(|mut g| {
            g.queue = v.ns.local(&g.queue)?.to_string();
            Some(g)
        })
        .map(|g| {
            // Exactly the group: its queue, dead, and its error group (a blank group, which
            // the form fields cannot carry, gets no links).
            let filter = g
                .error
                .as_deref()
                .filter(|e| !e.trim().is_empty())
                .map(|e| format!("state=dead&queue={}&error_group={}", enc(&g.queue), enc(e)));
            ErrorGroup {
                list_href: filter.as_ref().map(|f| format!("/ui/tasks?{f}")),
                retry_href: filter.map(|f| format!("/ui/tasks/bulk?action=retry&{f}")),
                queue_href: format!("/ui/dead?queue={}", enc(&g.queue)),
                queue: g.queue,
                error: g.error.unwrap_or_else(|| "(no error recorded)".into()),
                count: g.count,
                example: g.newest.to_string(),
            }
        })
        .collect();
    let next = page.next_cursor.map(|c| {
        let qp = if queue.is_empty() {
            String::new()
        } else {
            format!("queue={}&", enc(&queue))
        };
        format!("/ui/dead?{qp}cursor={c}")
    });
    let retry_href = if queue.is_empty() {
        "/ui/tasks/bulk?action=retry&state=dead".to_string()
    } else {
        format!(
            "/ui/tasks/bulk?action=retry&state=dead&queue={}",
            enc(&queue)
        )
    };
    let t = DeadPage {
        chrome: Chrome::new(v, "dead", "Dead letters").notice(q.get("notice")),
        queue,
        queues,
        groups,
        rows: page
            .tasks
            .iter()
            .filter_map(|t| v.ns.own(t.clone()))
            .map(|t| TaskRow::of(&t, now))
            .collect(),
        next,
        retry_href,
    };
    Ok(render(v, &t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_times_are_read_as_utc() {
        assert_eq!(lenient_time("2026-12-01"), "2026-12-01T00:00:00Z");
        assert_eq!(lenient_time("2026-12-01 10:30"), "2026-12-01T10:30:00Z");
        assert_eq!(lenient_time("2026-12-01T10:30:05"), "2026-12-01T10:30:05Z");
        assert_eq!(
            lenient_time("2026-12-01T10:30:05+02:00"),
            "2026-12-01T10:30:05+02:00"
        );
    }

    #[test]
    fn the_api_query_drops_empty_and_ui_fields_and_splits_tags() {
        let q = Fields::parse(b"queue=emails&kind=&tag=a:1+b:2&notice=x&id=&state=dead");
        assert_eq!(api_query(&q), "queue=emails&tag=a%3A1&tag=b%3A2&state=dead");
    }

    #[test]
    fn an_error_group_keeps_its_spaces_in_the_query_and_the_bulk_fields() {
        let q = Fields::parse(b"queue=+emails+&error_group=+boom+&tag=+&state=dead");
        assert_eq!(api_query(&q), "queue=emails&error_group=+boom+&state=dead");
        assert_eq!(q.get("error_group").as_deref(), Some(" boom "));
        assert_eq!(
            bulk_fields(&q),
            vec![
                ("queue".to_string(), "emails".to_string()),
                ("error_group".to_string(), " boom ".to_string()),
                ("state".to_string(), "dead".to_string()),
            ]
        );
        let blank = Fields::parse(b"error_group=+++");
        assert_eq!(blank.get("error_group"), None);
        assert_eq!(api_query(&blank), "");
    }
}
