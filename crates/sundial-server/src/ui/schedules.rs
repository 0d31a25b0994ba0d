//! Schedules: search by a fragment of the id, filter paused, one schedule's next fires in its
//! time zone (offset changes marked), its fire records, and pause, unpause (one or many),
//! trigger, backfill and edit.
//!
//! The list, and a search, is one `ScheduleStore::search_schedules` query of the viewer's
//! namespace's schedules, which walks the ids in id
//! order (the primary key) inside the database and stops at a page of matches: no index serves a
//! substring, so a search that matches little walks every id, in SQL (`sundial-bench ui`
//! measures it at 10,000 schedules).

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use sundial_schedules::{Recurrence, Schedule, ScheduleFilter, ScheduleId, Schedules};

use super::fmt;
use super::tasks::lenient_time;
use super::{
    Chrome, Fields, PageRequest, UiError, UiState, Viewer, action_word, enc, page_or_error,
    page_request, perform, render, see_other, with_notice,
};
use crate::schedules::{ScheduleRequest, api_error};

/// Schedules per page.
const PAGE: usize = 50;

fn schedules(st: &UiState) -> Result<&Schedules, UiError> {
    st.schedules
        .as_ref()
        .ok_or_else(|| UiError::not_found("this store does not keep schedules"))
}

fn zone(name: &str) -> Option<jiff::tz::TimeZone> {
    jiff::tz::TimeZone::get(name).ok()
}

/// A time in `tz`: `2026-03-29 03:00:00 CEST (+02:00)`, and its offset.
fn in_zone(t: sundial::Timestamp, tz: Option<&jiff::tz::TimeZone>) -> (String, String) {
    let Some(tz) = tz else {
        return (fmt::at(t), "+00:00".into());
    };
    match jiff::Timestamp::from_millisecond(t.0) {
        Ok(ts) => {
            let z = ts.to_zoned(tz.clone());
            (
                z.strftime("%Y-%m-%d %H:%M:%S %Z (%:z)").to_string(),
                z.strftime("%:z").to_string(),
            )
        }
        Err(_) => (fmt::at(t), "+00:00".into()),
    }
}

fn recurrence(s: &Schedule) -> String {
    match &s.def.spec.recurrence {
        Recurrence::Cron(c) => format!("cron {c}"),
        Recurrence::Every { period_ms, .. } => format!(
            "every {}",
            crate::duration::format(std::time::Duration::from_millis(*period_ms))
        ),
    }
}

struct Row {
    id: String,
    href: String,
    recurrence: String,
    timezone: String,
    paused: bool,
    next: String,
    queue: String,
    kind: String,
    fired: u64,
    skipped: u64,
    missed: u64,
}

/// A stored name (schedule id, queue) as the viewer's namespace knows it.
fn local(name: &str) -> &str {
    sundial_core::namespace::local(name)
}

fn row(s: &Schedule) -> Row {
    let tz = zone(&s.def.spec.timezone);
    Row {
        id: local(s.id.as_str()).to_string(),
        href: format!("/ui/schedule?id={}", enc(local(s.id.as_str()))),
        recurrence: recurrence(s),
        timezone: s.def.spec.timezone.clone(),
        paused: s.paused,
        next: s
            .next_fire_at
            .map(|t| in_zone(t, tz.as_ref()).0)
            .unwrap_or_else(|| "ended".into()),
        queue: local(&s.def.task.queue).to_string(),
        kind: s.def.task.kind.clone(),
        fired: s.counts.fired,
        skipped: s.counts.skipped,
        missed: s.counts.missed,
    }
}

#[derive(Template)]
#[template(path = "ui/schedules.html")]
struct ListPage {
    chrome: Chrome,
    q: String,
    paused: String,
    rows: Vec<Row>,
    next: Option<String>,
    here: String,
}

/// `GET /ui/schedules?q=&paused=&cursor=`.
pub(crate) async fn list(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, here } =
        match page_request(&st, &headers, "/ui/schedules", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, list_page(&st, &v, &q, here).await)
}

async fn list_page(
    st: &UiState,
    v: &Viewer,
    q: &Fields,
    here: String,
) -> Result<Response, UiError> {
    let schedules = schedules(st)?;
    let fragment = q.get("q").unwrap_or_default();
    let paused = match q.get("paused").as_deref() {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    };
    let after = match q.get("cursor") {
        Some(c) => Some(
            ScheduleId::new(v.ns.given("cursor", &c)?)
                .map_err(|e| UiError::bad_request(format!("cursor: {}", e.reason())))?,
        ),
        None => None,
    };
    // One store query: the walk in id order that stops at a page of matches, in the viewer's
    // namespace.
    let filter = ScheduleFilter {
        id_contains: fragment.clone(),
        paused,
        namespace: Some(v.ns.name().to_string()),
    };
    let page = schedules
        .search(&filter, after.as_ref(), PAGE)
        .await
        .map_err(api_error)?;
    let found: Vec<Schedule> = page.schedules;
    let next = page.next_cursor;
    let next = next.map(|c| {
        let rest = q.query_without(&["cursor", "notice"]);
        let sep = if rest.is_empty() { "" } else { "&" };
        format!("/ui/schedules?{rest}{sep}cursor={}", enc(local(c.as_str())))
    });
    let t = ListPage {
        chrome: Chrome::new(v, "schedules", "Schedules").notice(q.get("notice")),
        q: fragment,
        paused: q.get("paused").unwrap_or_default(),
        rows: found.iter().map(row).collect(),
        next,
        here,
    };
    Ok(render(v, &t))
}

struct Upcoming {
    at: String,
    utc: String,
    change: Option<String>,
}

struct FireRow {
    nominal: String,
    outcome: String,
    reason: String,
    task: Option<String>,
    count: u64,
    through: String,
    recorded: String,
}

#[derive(Template)]
#[template(path = "ui/schedule.html")]
struct SchedulePage {
    chrome: Chrome,
    id: String,
    recurrence: String,
    timezone: String,
    dst: String,
    overlap: String,
    catchup_window: String,
    jitter: String,
    paused: bool,
    note: String,
    queue: String,
    kind: String,
    payload: String,
    fired: u64,
    skipped: u64,
    missed: u64,
    upcoming: Vec<Upcoming>,
    fires: Vec<FireRow>,
    more_fires: Option<String>,
    cron: String,
    every: String,
    tasks_href: String,
    backfill_to: String,
}

/// `GET /ui/schedule?id=&before=`.
pub(crate) async fn show(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/schedule", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, schedule_page(&st, &v, &q).await)
}

/// The viewer's namespace's schedule `id` (as the namespace knows it).
async fn load(schedules: &Schedules, v: &Viewer, id: &str) -> Result<Schedule, UiError> {
    let stored =
        v.ns.qualify_given(id)
            .ok_or_else(|| UiError::not_found("no such schedule"))?;
    let sid = ScheduleId::new(stored).map_err(|_| UiError::not_found("no such schedule"))?;
    schedules
        .get(&sid)
        .await
        .map_err(api_error)?
        .ok_or_else(|| UiError::not_found("no such schedule"))
}

async fn schedule_page(st: &UiState, v: &Viewer, q: &Fields) -> Result<Response, UiError> {
    let schedules = schedules(st)?;
    let id = q
        .get("id")
        .ok_or_else(|| UiError::bad_request("id is required"))?;
    let s = load(schedules, v, &id).await?;
    let tz = zone(&s.def.spec.timezone);
    let now = st.app.sundial.clock().now();
    // The next 10 fires in the schedule's zone; a fire whose offset differs from the one before
    // it (or, for the first, from now's) comes after a transition (DST or another change).
    let (_, mut prev_offset) = in_zone(now, tz.as_ref());
    let upcoming = schedules
        .upcoming(&s, 10)
        .into_iter()
        .map(|t| {
            let (at, offset) = in_zone(t, tz.as_ref());
            let change = (offset != prev_offset)
                .then(|| format!("offset changes {prev_offset} → {offset} before this fire (DST)"));
            prev_offset = offset;
            Upcoming {
                at,
                utc: fmt::at(t),
                change,
            }
        })
        .collect();
    let before = match q.get("before") {
        Some(b) => {
            Some(crate::time::parse(&b).map_err(|e| UiError::bad_request(format!("before: {e}")))?)
        }
        None => None,
    };
    let page = schedules
        .fires(&s.id, before, 50)
        .await
        .map_err(api_error)?;
    let fires = page
        .fires
        .iter()
        .map(|f| FireRow {
            nominal: in_zone(f.nominal, tz.as_ref()).0,
            outcome: f.outcome.as_str().to_string(),
            reason: f.reason.as_str().to_string(),
            task: f.task_id.map(|t| t.to_string()),
            count: f.count,
            through: f
                .through
                .map(|t| in_zone(t, tz.as_ref()).0)
                .unwrap_or_default(),
            recorded: fmt::at(f.recorded_at),
        })
        .collect();
    let more_fires = page.next_cursor.map(|c| {
        format!(
            "/ui/schedule?id={}&before={}",
            enc(local(s.id.as_str())),
            enc(&crate::time::format(c))
        )
    });
    let (cron, every) = match &s.def.spec.recurrence {
        Recurrence::Cron(c) => (c.clone(), String::new()),
        Recurrence::Every { period_ms, .. } => (
            String::new(),
            crate::duration::format(std::time::Duration::from_millis(*period_ms)),
        ),
    };
    let d = &s.def;
    let t = SchedulePage {
        chrome: Chrome::new(v, "schedules", format!("Schedule {}", local(s.id.as_str())))
            .notice(q.get("notice")),
        id: local(s.id.as_str()).to_string(),
        recurrence: recurrence(&s),
        timezone: d.spec.timezone.clone(),
        dst: format!(
            "skipped times: {}; repeated times: {}",
            d.spec.dst.skipped, d.spec.dst.repeated
        ),
        overlap: d.overlap.as_str().to_string(),
        catchup_window: crate::duration::format(std::time::Duration::from_millis(
            d.catchup_window_ms,
        )),
        jitter: crate::duration::format(std::time::Duration::from_millis(d.jitter_ms)),
        paused: s.paused,
        note: s.note.clone().unwrap_or_default(),
        queue: local(&d.task.queue).to_string(),
        kind: d.task.kind.clone(),
        payload: fmt::json(&d.task.payload),
        fired: s.counts.fired,
        skipped: s.counts.skipped,
        missed: s.counts.missed,
        upcoming,
        fires,
        more_fires,
        cron,
        every,
        tasks_href: format!(
            "/ui/tasks?queue={}&key_prefix={}",
            enc(local(&d.task.queue)),
            enc(&format!("schedule:{}@", local(s.id.as_str())))
        ),
        backfill_to: crate::time::format(now),
    };
    Ok(render(v, &t))
}

/// `POST /ui/schedule/{pause|unpause|trigger|backfill|edit}` (the schedule's `id` in the form).
pub(crate) async fn act(
    State(st): State<UiState>,
    headers: HeaderMap,
    Path(action): Path<String>,
    body: Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    let route = format!(
        "/ui/schedule/{}",
        action_word(
            &action,
            &["pause", "unpause", "trigger", "backfill", "edit"]
        )
    );
    let st2 = st.clone();
    perform(
        &st,
        &headers,
        &body,
        route,
        fields.get("id"),
        |v, f| async move { (None, schedule_action(&st2, &v, &action, &f).await) },
    )
    .await
}

async fn schedule_action(
    st: &UiState,
    v: &Viewer,
    action: &str,
    f: &Fields,
) -> Result<Response, UiError> {
    let schedules = schedules(st)?;
    let id = f
        .get("id")
        .ok_or_else(|| UiError::bad_request("id is required"))?;
    let s = load(schedules, v, &id).await?;
    let notice = match action {
        "pause" => {
            schedules
                .pause(&s.id, f.get("note"))
                .await
                .map_err(api_error)?;
            "Paused: its fire times pass recorded as skipped.".to_string()
        }
        "unpause" => {
            schedules
                .unpause(&s.id, f.get("note"))
                .await
                .map_err(api_error)?;
            "Unpaused.".to_string()
        }
        "trigger" => {
            let fire = schedules.trigger(&s.id).await.map_err(api_error)?;
            format!("Fired now ({}).", fire.outcome.as_str())
        }
        "backfill" => {
            let time = |n: &str| -> Result<sundial::Timestamp, UiError> {
                let raw = f
                    .get(n)
                    .ok_or_else(|| UiError::bad_request(format!("{n} is required")))?;
                crate::time::parse(&lenient_time(&raw))
                    .map_err(|e| UiError::bad_request(format!("{n}: {e}")))
            };
            let overlap = match f.get("overlap") {
                Some(o) => Some(
                    o.parse::<sundial_schedules::OverlapPolicy>()
                        .map_err(|e| UiError::bad_request(format!("overlap: {}", e.reason())))?,
                ),
                None => None,
            };
            let out = schedules
                .backfill(&s.id, time("from")?, time("to")?, overlap)
                .await
                .map_err(api_error)?;
            format!(
                "Backfilled {} fire times ({} were recorded before).",
                out.recorded.len(),
                out.already_recorded.len()
            )
        }
        "edit" => {
            let req = ScheduleRequest {
                cron: f.get("cron"),
                every: f.get("every"),
                timezone: f.get("timezone"),
                overlap: f.get("overlap"),
                catchup_window: f.get("catchup_window"),
                jitter: f.get("jitter"),
                ..ScheduleRequest::default()
            };
            let mut def = s.def.clone();
            crate::schedules::apply(&v.ns, &mut def, req)?;
            schedules.update(&s.id, def).await.map_err(api_error)?;
            "Saved and re-armed.".to_string()
        }
        _ => return Err(UiError::not_found(format!("no such action: {action:?}"))),
    };
    Ok(see_other(&with_notice(
        &format!("/ui/schedule?id={}", enc(local(s.id.as_str()))),
        &notice,
    )))
}

/// `POST /ui/schedules/bulk`: pause or unpause every checked schedule.
pub(crate) async fn bulk(State(st): State<UiState>, headers: HeaderMap, body: Bytes) -> Response {
    let fields = Fields::parse(&body);
    let action = fields.get("action").unwrap_or_default();
    let word = action_word(&action, &["pause", "unpause"]);
    let st2 = st.clone();
    perform(
        &st,
        &headers,
        &body,
        format!("/ui/schedules/bulk/{word}"),
        None,
        |v, f| async move {
            let r = async {
                let schedules = schedules(&st2)?;
                let pause = match f.get("action").as_deref() {
                    Some("pause") => true,
                    Some("unpause") => false,
                    _ => return Err(UiError::bad_request("action must be pause or unpause")),
                };
                let ids = f.all("id");
                if ids.is_empty() {
                    return Err(UiError::bad_request("no schedule was selected"));
                }
                let mut n = 0;
                for id in &ids {
                    let s = load(schedules, &v, id).await?;
                    if pause {
                        schedules.pause(&s.id, f.get("note")).await
                    } else {
                        schedules.unpause(&s.id, f.get("note")).await
                    }
                    .map_err(api_error)?;
                    n += 1;
                }
                let back = match f.get("back") {
                    Some(b) if b.starts_with("/ui/schedules") => b,
                    _ => "/ui/schedules".to_string(),
                };
                let done = if pause { "Paused" } else { "Unpaused" };
                Ok((
                    n,
                    see_other(&with_notice(&back, &format!("{done} {n} schedules."))),
                ))
            }
            .await;
            match r {
                Ok((n, resp)) => (Some(format!("{n} schedules")), Ok(resp)),
                Err(e) => (None, Err(e)),
            }
        },
    )
    .await
}
