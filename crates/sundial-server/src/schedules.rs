//! The schedules API (v1), over [`sundial_schedules::Schedules`].
//!
//! ```text
//! POST   /v1/schedules                 create                                   201 | 400 409 422
//! GET    /v1/schedules?limit=&cursor=  list, in id order                        200
//! GET    /v1/schedules/{id}            one, with next 5 fire times, last fires  200 | 404
//! PATCH  /v1/schedules/{id}            change fields (re-arms)                  200 | 404 422
//! DELETE /v1/schedules/{id}            delete (its tasks stay)                  204 | 404
//! POST   /v1/schedules/{id}/pause      {note?}                                  200 | 404
//! POST   /v1/schedules/{id}/unpause    {note?}                                  200 | 404
//! POST   /v1/schedules/{id}/trigger    fire now                                 200 | 404
//! POST   /v1/schedules/{id}/backfill   {from, to, overlap?}                     200 | 404 422
//! GET    /v1/schedules/{id}/fires?limit=&before=   fired, skipped, missed       200 | 404
//! POST   /v1/schedules:preview         {cron|every, anchor?, timezone?, dst?, from, count}  200 | 422
//! ```
//!
//! Requests refuse unknown fields; an invalid spec is `422` with the field (`cron`, `timezone`,
//! `dst.skipped`, `task.kind`, …) and the reason. Times are RFC 3339; durations are strings
//! (`"15m"`). Fire times in responses are UTC. Every route is described in `/openapi.json` (tag
//! `schedules`).
//!
//! Under `/v1/namespaces/{ns}/…` every route is namespace `ns`'s (see [`crate::namespace`]): a
//! schedule id is the namespace's own (stored qualified), its task template's queue and
//! exclusive key are qualified, so its fires create tasks in the namespace's queues, and the list
//! and every by-id route see only the namespace's schedules (another's is `404`, as one that
//! does not exist). Responses show ids and queues as the namespace knows them.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sundial::{Task, TaskSpec, Timestamp};
use sundial_schedules::{
    Backfill, CreateSchedule, DstPolicy, Error, FireRecord, OverlapPolicy, Recurrence,
    RepeatedTime, Schedule, ScheduleDef, ScheduleFilter, ScheduleId, ScheduleSpec, Schedules,
    SkippedTime, TaskTemplate,
};

use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiQuery, parse_json};
use crate::namespace::Ns;
use crate::wire::CreateTask;
use crate::{duration, time};

/// The schedule routes and their OpenAPI description.
fn api() -> OpenApiRouter<Schedules> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(preview))
        .routes(routes!(get_one, patch, delete))
        .routes(routes!(pause))
        .routes(routes!(unpause))
        .routes(routes!(trigger))
        .routes(routes!(backfill))
        .routes(routes!(fires))
}

/// The schedule routes, with their own state. Merged into [`crate::router`].
pub fn router(schedules: Schedules, body_limit: usize) -> Router {
    let (router, _) = api().split_for_parts();
    router
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(schedules)
}

/// The OpenAPI description of the schedule routes (merged into `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

// ---- Wire types ---------------------------------------------------------------------------------

/// DST policy on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DstWire {
    /// `shift` (default) or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// `first` (default), `last` or `both`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated: Option<String>,
}

/// `POST /v1/schedules` (and, with every field optional, `PATCH`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// A fixed interval: `"15m"`, `"1h30m"` (1 s to 36,500 days).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub every: Option<String>,
    /// Aligns `every` (RFC 3339; default the Unix epoch). Only with `every`, which a change of
    /// a schedule names again when it gives an `anchor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<DstWire>,
    /// `skip` (default), `buffer_one`, `buffer_all`, `allow_all`, `cancel_other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// Default `"1m"`, at most 365 days.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub catchup_window: Option<String>,
    /// Delays each fire by an amount from 0 to this, derived from the schedule and the fire time
    /// (at most 1 day).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub jitter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The task each fire creates: like `POST /v1/tasks` without `key`, `run_at` and `delay`
    /// (the schedule sets them) and without `idempotency_key` and `idempotency_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<CreateTask>,
}

/// `POST /v1/schedules:preview`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub every: Option<String>,
    /// Aligns `every` (RFC 3339; default the Unix epoch). Only with `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<DstWire>,
    /// RFC 3339; fire times at or after it.
    pub from: String,
    /// 1 to 1,000 (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PreviewResponse {
    pub fires: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// RFC 3339: the first fire time covered (inclusive).
    pub from: String,
    /// RFC 3339, not in the future and not before `from`: the last fire time covered
    /// (inclusive). The range holds at most 1,000 fire times.
    pub to: String,
    /// The overlap rule between the backfilled fires: default `allow_all` (every fire time in
    /// the range runs, whatever the schedule's own `overlap`); `skip`, `buffer_one`,
    /// `buffer_all`, `cancel_other` as for a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BackfillResponse {
    pub fires: Vec<FireView>,
    /// Fire times in the range that were recorded before (left alone).
    pub already_recorded: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FireView {
    pub nominal_time: String,
    /// `fired`, `skipped` or `missed`.
    pub outcome: String,
    /// `schedule`, `trigger`, `backfill`, `overlap`, `paused`, `outside_catchup_window`.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<uuid::Uuid>,
    /// How many fire times this record stands for (a collapsed run of missed fires).
    pub count: u64,
    /// The last fire time of a collapsed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<String>,
    pub recorded_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CountsView {
    pub fired: u64,
    pub skipped: u64,
    pub missed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct TaskTemplateView {
    pub queue: String,
    pub kind: String,
    pub payload: serde_json::Value,
    pub max_attempts: u32,
    pub timeout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::wire::TargetSpec>,
    /// The tags each fire's task carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The priority each fire's task carries (0 to 9, default 5).
    #[serde(default = "default_priority")]
    pub priority: u8,
}

fn default_priority() -> u8 {
    sundial::Priority::DEFAULT.get()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ScheduleView {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub every: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<String>,
    pub timezone: String,
    pub dst: DstWire,
    pub overlap: String,
    pub catchup_window: String,
    pub jitter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub task: TaskTemplateView,
    /// The next fire times (up to 5), UTC; empty once the schedule has ended.
    pub next_fires: Vec<String>,
    /// The latest fire records (up to 5), newest first. Only on `GET /v1/schedules/{id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fires: Option<Vec<FireView>>,
    pub counts: CountsView,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct FireList {
    pub fires: Vec<FireView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FiresQuery {
    /// Page size, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// RFC 3339: only fire times before it (`next_cursor` of the previous page).
    pub before: Option<String>,
}

// ---- Conversions --------------------------------------------------------------------------------

pub(crate) fn api_error(e: Error) -> ApiError {
    match e {
        Error::Invalid(s) => ApiError::invalid(s.field(), s.to_string()),
        Error::NotFound => ApiError::not_found("no such schedule"),
        Error::AlreadyExists => ApiError::new(
            StatusCode::CONFLICT,
            "already_exists",
            "a schedule with this id exists",
        ),
        Error::Unsupported => ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "this store does not support schedules",
        ),
        Error::Sundial(e) => e.into(),
        Error::Store(e) => sundial::Error::Store(e).into(),
    }
}

fn parse_time(field: &str, s: &str) -> Result<Timestamp, ApiError> {
    time::parse(s).map_err(|e| ApiError::invalid(field, e))
}

fn parse_duration(field: &str, s: &str) -> Result<Duration, ApiError> {
    duration::parse(s).map_err(|e| ApiError::invalid(field, e.to_string()))
}

/// The stored id of schedule `s` of namespace `ns` (see [`crate::namespace`]).
fn schedule_id(ns: &Ns, s: &str) -> Result<ScheduleId, ApiError> {
    let stored = ns
        .qualify_given(s)
        .ok_or_else(|| ApiError::invalid("id", "control characters are not allowed".to_string()))?;
    ScheduleId::new(stored).map_err(|e| ApiError::invalid("id", e.reason().to_string()))
}

fn dst(w: Option<DstWire>, base: DstPolicy) -> Result<DstPolicy, ApiError> {
    let Some(w) = w else { return Ok(base) };
    let skipped = match w.skipped {
        Some(s) => s
            .parse::<SkippedTime>()
            .map_err(|e| ApiError::invalid("dst.skipped", e.to_string()))?,
        None => base.skipped,
    };
    let repeated = match w.repeated {
        Some(s) => s
            .parse::<RepeatedTime>()
            .map_err(|e| ApiError::invalid("dst.repeated", e.to_string()))?,
        None => base.repeated,
    };
    Ok(DstPolicy { skipped, repeated })
}

/// The recurrence of a request, or `None` when it names none.
fn recurrence(
    cron: Option<String>,
    every: Option<String>,
    anchor: Option<String>,
) -> Result<Option<Recurrence>, ApiError> {
    match (cron, every) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "every",
            "give either cron or every, not both",
        )),
        (Some(c), None) => {
            if anchor.is_some() {
                return Err(ApiError::invalid("anchor", "anchor applies to every only"));
            }
            Ok(Some(Recurrence::Cron(c)))
        }
        (None, Some(e)) => {
            let period = parse_duration("every", &e)?;
            let anchor = anchor.map(|a| parse_time("anchor", &a)).transpose()?;
            Ok(Some(Recurrence::Every {
                period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
                anchor,
            }))
        }
        (None, None) if anchor.is_some() => {
            Err(ApiError::invalid("anchor", "anchor applies to every only"))
        }
        (None, None) => Ok(None),
    }
}

/// The template of a request's `task` in namespace `ns` (queue and exclusive key qualified).
fn template(ns: &Ns, task: CreateTask) -> Result<TaskTemplate, ApiError> {
    for (field, set) in [
        ("task.key", task.key.is_some()),
        ("task.run_at", task.run_at.is_some()),
        ("task.delay", task.delay.is_some()),
    ] {
        if set {
            return Err(ApiError::invalid(
                field,
                format!("{field} is set by the schedule for each fire"),
            ));
        }
    }
    // Each fire's key is the schedule's own (id and nominal time), so a template has no use for
    // an idempotency key; refused rather than dropped, like the fields above.
    for (field, set) in [
        ("task.idempotency_key", task.idempotency_key.is_some()),
        (
            "task.idempotency_version",
            task.idempotency_version.is_some(),
        ),
        ("task.throttle", task.throttle.is_some()),
        ("task.debounce", task.debounce.is_some()),
    ] {
        if set {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{field} is taken on single creates (POST /v1/tasks) only; each fire is \
                     keyed by the schedule and its nominal time"
                ),
            ));
        }
    }
    let spec: TaskSpec = task.into_spec().map_err(|mut e| {
        e.detail.field = e.detail.field.take().map(|f| format!("task.{f}"));
        e
    })?;
    crate::namespace::check_kind_given("task.kind", &spec.kind)?;
    crate::namespace::check_queue_given("task.queue", &spec.queue)?;
    // A name with a namespace part of its own would be another namespace's (in the default
    // namespace, whose names are stored as given).
    for (field, name) in [
        ("task.queue", Some(&spec.queue)),
        ("task.exclusive", spec.exclusive.as_ref().map(|e| &e.key)),
    ] {
        if name.is_some_and(|n| n.contains(sundial_core::namespace::SEPARATOR)) {
            return Err(ApiError::invalid(
                field,
                "control characters are not allowed",
            ));
        }
    }
    let template = TaskTemplate {
        queue: spec.queue,
        kind: spec.kind,
        payload: spec.payload,
        max_attempts: spec.max_attempts,
        backoff: spec.backoff,
        timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
        exclusive: spec.exclusive,
        target: spec.target,
        tags: spec.tags,
        priority: spec.priority,
    };
    Ok(template.in_namespace(ns.name()))
}

/// Applies the fields a request sets onto `def` (a fresh definition for `POST`, the stored one for
/// `PATCH`) of a schedule of namespace `ns`.
pub(crate) fn apply(ns: &Ns, def: &mut ScheduleDef, r: ScheduleRequest) -> Result<(), ApiError> {
    if let Some(rec) = recurrence(r.cron, r.every, r.anchor)? {
        def.spec.recurrence = rec;
    }
    if let Some(tz) = r.timezone {
        def.spec.timezone = tz;
    }
    def.spec.dst = dst(r.dst, def.spec.dst)?;
    if let Some(o) = r.overlap {
        def.overlap = o
            .parse::<OverlapPolicy>()
            .map_err(|e| ApiError::invalid("overlap", e.reason().to_string()))?;
    }
    if let Some(w) = r.catchup_window {
        def.catchup_window_ms = duration_ms(parse_duration("catchup_window", &w)?);
    }
    if let Some(j) = r.jitter {
        def.jitter_ms = duration_ms(parse_duration("jitter", &j)?);
    }
    if let Some(s) = r.start_at {
        def.start_at = Some(parse_time("start_at", &s)?);
    }
    if let Some(e) = r.end_at {
        def.end_at = Some(parse_time("end_at", &e)?);
    }
    if let Some(t) = r.task {
        def.task = template(ns, t)?;
    }
    Ok(())
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn fire_view(f: &FireRecord) -> FireView {
    FireView {
        nominal_time: time::format(f.nominal),
        outcome: f.outcome.as_str().to_string(),
        reason: f.reason.as_str().to_string(),
        task_id: f.task_id.map(|t| t.0),
        count: f.count,
        through: f.through.map(time::format),
        recorded_at: time::format(f.recorded_at),
    }
}

/// A schedule as its namespace sees it (id and queue without the namespace part; the handlers
/// only ever load their own namespace's schedules).
fn view(schedules: &Schedules, s: &Schedule, last: Option<Vec<FireView>>) -> ScheduleView {
    let d = &s.def;
    let (cron, every, anchor) = match &d.spec.recurrence {
        Recurrence::Cron(c) => (Some(c.clone()), None, None),
        Recurrence::Every { period_ms, anchor } => (
            None,
            Some(duration::format(Duration::from_millis(*period_ms))),
            anchor.map(time::format),
        ),
    };
    ScheduleView {
        id: sundial_core::namespace::local(s.id.as_str()).to_string(),
        cron,
        every,
        anchor,
        timezone: d.spec.timezone.clone(),
        dst: DstWire {
            skipped: Some(d.spec.dst.skipped.to_string()),
            repeated: Some(d.spec.dst.repeated.to_string()),
        },
        overlap: d.overlap.as_str().to_string(),
        catchup_window: duration::format(Duration::from_millis(d.catchup_window_ms)),
        jitter: duration::format(Duration::from_millis(d.jitter_ms)),
        start_at: d.start_at.map(time::format),
        end_at: d.end_at.map(time::format),
        paused: s.paused,
        note: s.note.clone(),
        task: TaskTemplateView {
            queue: sundial_core::namespace::local(&d.task.queue).to_string(),
            kind: d.task.kind.clone(),
            payload: d.task.payload.clone(),
            max_attempts: d.task.max_attempts,
            timeout: duration::format(Duration::from_millis(d.task.timeout_ms)),
            target: d
                .task
                .target
                .clone()
                .map(crate::wire::TargetSpec::from_target),
            tags: d.task.tags.clone(),
            priority: d.task.priority.get(),
        },
        next_fires: schedules
            .upcoming(s, 5)
            .into_iter()
            .map(time::format)
            .collect(),
        last_fires: last,
        counts: CountsView {
            fired: s.counts.fired,
            skipped: s.counts.skipped,
            missed: s.counts.missed,
        },
        created_at: time::format(s.created_at),
        updated_at: time::format(s.updated_at),
    }
}

async fn full_view(schedules: &Schedules, s: &Schedule) -> Result<ScheduleView, ApiError> {
    let last = schedules
        .fires(&s.id, None, 5)
        .await
        .map_err(api_error)?
        .fires
        .iter()
        .map(fire_view)
        .collect();
    Ok(view(schedules, s, Some(last)))
}

// ---- Handlers -----------------------------------------------------------------------------------

/// The optional `{note}` body of pause and unpause (an empty body, or `null`, is no note).
fn note(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) || body.trim_ascii() == b"null" {
        return Ok(None);
    }
    Ok(parse_json::<NoteRequest>(body)?.note)
}

#[utoipa::path(
    post, path = "/v1/schedules", tag = "schedules",
    operation_id = "create_schedule",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Stored and armed", body = ScheduleView),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "A schedule with this id exists", body = ErrorBody),
        (status = 422, description = "Invalid spec or task (names the field and reason); nothing stored", body = ErrorBody),
    )
)]
pub async fn create(
    State(schedules): State<Schedules>,
    ns: Ns,
    ApiJson(r): ApiJson<ScheduleRequest>,
) -> Result<Response, ApiError> {
    if r.cron.is_none() && r.every.is_none() {
        return Err(ApiError::invalid("cron", "give cron or every"));
    }
    let Some(task) = r.task.clone() else {
        return Err(ApiError::invalid(
            "task",
            "the task each fire creates is required",
        ));
    };
    let id = match r.id.as_deref() {
        Some(id) => Some(schedule_id(&ns, id)?),
        // A fresh id of this namespace (the default namespace's are made by `create`).
        None if !ns.is_default() => Some(schedule_id(&ns, &uuid::Uuid::now_v7().to_string())?),
        None => None,
    };
    let paused = r.paused.unwrap_or(false);
    let note = r.note.clone();
    let mut def = ScheduleDef::new(ScheduleSpec::cron("* * * * *"), template(&ns, task)?);
    apply(&ns, &mut def, r)?;
    let s = schedules
        .create(CreateSchedule {
            id,
            def,
            paused,
            note,
        })
        .await
        .map_err(api_error)?;
    Ok((StatusCode::CREATED, Json(full_view(&schedules, &s).await?)).into_response())
}

#[utoipa::path(
    get, path = "/v1/schedules", tag = "schedules",
    operation_id = "list_schedules",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of schedules in id order", body = ScheduleList),
        (status = 422, description = "Unknown parameter or bad value", body = ErrorBody),
    )
)]
pub async fn list(
    State(schedules): State<Schedules>,
    ns: Ns,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<ScheduleList>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let after = q
        .cursor
        .as_deref()
        .map(|c| schedule_id(&ns, c))
        .transpose()?;
    let filter = ScheduleFilter {
        namespace: Some(ns.name().to_string()),
        ..ScheduleFilter::default()
    };
    let page = schedules
        .search(&filter, after.as_ref(), limit)
        .await
        .map_err(api_error)?;
    Ok(Json(ScheduleList {
        schedules: page
            .schedules
            .iter()
            .map(|s| view(&schedules, s, None))
            .collect(),
        next_cursor: page
            .next_cursor
            .map(|c| sundial_core::namespace::local(c.as_str()).to_string()),
    }))
}

/// Schedule `id` of namespace `ns`: `404` when there is none (another namespace's schedule of
/// the same id is another schedule, and one named with a namespace part is never found).
async fn load(schedules: &Schedules, ns: &Ns, id: &str) -> Result<Schedule, ApiError> {
    let id = ns
        .qualify_given(id)
        .and_then(|stored| ScheduleId::new(stored).ok())
        .ok_or_else(|| ApiError::not_found("no such schedule"))?;
    schedules
        .get(&id)
        .await
        .map_err(api_error)?
        .ok_or_else(|| ApiError::not_found("no such schedule"))
}

#[utoipa::path(
    get, path = "/v1/schedules/{id}", tag = "schedules",
    operation_id = "get_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    responses(
        (status = 200, description = "The schedule with its next 5 fire times and last fires", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
pub async fn get_one(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    let s = load(&schedules, &ns, &id).await?;
    Ok(Json(full_view(&schedules, &s).await?))
}

#[utoipa::path(
    patch, path = "/v1/schedules/{id}", tag = "schedules",
    operation_id = "update_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    request_body(content = ScheduleRequest, description = "The fields to change (every field optional; `id`, `paused` and `note` refused)"),
    responses(
        (status = 200, description = "Changed and re-armed", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "Invalid; nothing changed", body = ErrorBody),
    )
)]
pub async fn patch(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
    ApiJson(r): ApiJson<ScheduleRequest>,
) -> Result<Json<ScheduleView>, ApiError> {
    if r.id.is_some() {
        return Err(ApiError::invalid("id", "a schedule's id cannot change"));
    }
    if r.paused.is_some() || r.note.is_some() {
        return Err(ApiError::invalid(
            "paused",
            "use POST /v1/schedules/{id}/pause or /unpause",
        ));
    }
    let current = load(&schedules, &ns, &id).await?;
    let mut def = current.def.clone();
    apply(&ns, &mut def, r)?;
    let s = schedules
        .update(&current.id, def)
        .await
        .map_err(api_error)?;
    Ok(Json(full_view(&schedules, &s).await?))
}

#[utoipa::path(
    delete, path = "/v1/schedules/{id}", tag = "schedules",
    operation_id = "delete_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    responses(
        (status = 204, description = "Deleted; tasks it created stay"),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
pub async fn delete(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = load(&schedules, &ns, &id).await?;
    schedules.delete(&s.id).await.map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(
    post, path = "/v1/schedules/{id}/pause", tag = "schedules",
    operation_id = "pause_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    request_body(content = Option<NoteRequest>, description = "Optional note (an empty body is none)"),
    responses(
        (status = 200, description = "Paused: fire times pass recorded as skipped (`paused`)", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
pub async fn pause(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<ScheduleView>, ApiError> {
    let note = note(&body)?;
    let s = load(&schedules, &ns, &id).await?;
    let s = schedules.pause(&s.id, note).await.map_err(api_error)?;
    Ok(Json(full_view(&schedules, &s).await?))
}

#[utoipa::path(
    post, path = "/v1/schedules/{id}/unpause", tag = "schedules",
    operation_id = "unpause_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    request_body(content = Option<NoteRequest>, description = "Optional note (an empty body is none)"),
    responses(
        (status = 200, description = "Firing again from the next fire time", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
pub async fn unpause(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<ScheduleView>, ApiError> {
    let note = note(&body)?;
    let s = load(&schedules, &ns, &id).await?;
    let s = schedules.unpause(&s.id, note).await.map_err(api_error)?;
    Ok(Json(full_view(&schedules, &s).await?))
}

#[utoipa::path(
    post, path = "/v1/schedules/{id}/trigger", tag = "schedules",
    operation_id = "trigger_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    responses(
        (status = 200, description = "Fired now (the fire record)", body = FireView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
pub async fn trigger(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<FireView>, ApiError> {
    let s = load(&schedules, &ns, &id).await?;
    let f = schedules.trigger(&s.id).await.map_err(api_error)?;
    Ok(Json(fire_view(&f)))
}

#[utoipa::path(
    post, path = "/v1/schedules/{id}/backfill", tag = "schedules",
    operation_id = "backfill_schedule",
    params(("id" = String, Path, description = "Schedule id")),
    request_body = BackfillRequest,
    responses(
        (status = 200, description = "The fire times in the range, fired now (all of them unless `overlap` says otherwise)", body = BackfillResponse),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "Bad range", body = ErrorBody),
    )
)]
pub async fn backfill(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
    ApiJson(r): ApiJson<BackfillRequest>,
) -> Result<Json<BackfillResponse>, ApiError> {
    let from = parse_time("from", &r.from)?;
    let to = parse_time("to", &r.to)?;
    let overlap = r
        .overlap
        .map(|o| {
            o.parse::<OverlapPolicy>()
                .map_err(|e| ApiError::invalid("overlap", e.reason().to_string()))
        })
        .transpose()?;
    let s = load(&schedules, &ns, &id).await?;
    let Backfill {
        recorded,
        already_recorded,
    } = schedules
        .backfill(&s.id, from, to, overlap)
        .await
        .map_err(api_error)?;
    Ok(Json(BackfillResponse {
        fires: recorded.iter().map(fire_view).collect(),
        already_recorded: already_recorded.into_iter().map(time::format).collect(),
    }))
}

#[utoipa::path(
    get, path = "/v1/schedules/{id}/fires", tag = "schedules",
    operation_id = "list_schedule_fires",
    params(("id" = String, Path, description = "Schedule id"), FiresQuery),
    responses(
        (status = 200, description = "Fired, skipped and missed fire times with reasons, newest first", body = FireList),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "Unknown parameter or bad value", body = ErrorBody),
    )
)]
pub async fn fires(
    State(schedules): State<Schedules>,
    ns: Ns,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<FiresQuery>,
) -> Result<Json<FireList>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let before = q
        .before
        .as_deref()
        .map(|b| parse_time("before", b))
        .transpose()?;
    let s = load(&schedules, &ns, &id).await?;
    let page = schedules
        .fires(&s.id, before, limit)
        .await
        .map_err(api_error)?;
    Ok(Json(FireList {
        fires: page.fires.iter().map(fire_view).collect(),
        next_cursor: page.next_cursor.map(time::format),
    }))
}

#[utoipa::path(
    post, path = "/v1/schedules:preview", tag = "schedules",
    operation_id = "preview_schedule",
    request_body = PreviewRequest,
    responses(
        (status = 200, description = "The next fire times in UTC; nothing is saved", body = PreviewResponse),
        (status = 422, description = "Invalid spec (names the field and reason)", body = ErrorBody),
    )
)]
pub async fn preview(
    ApiJson(r): ApiJson<PreviewRequest>,
) -> Result<Json<PreviewResponse>, ApiError> {
    let Some(recurrence) = recurrence(r.cron, r.every, r.anchor)? else {
        return Err(ApiError::invalid("cron", "give cron or every"));
    };
    let spec = ScheduleSpec {
        recurrence,
        timezone: r.timezone.unwrap_or_else(|| "UTC".to_string()),
        dst: dst(r.dst, DstPolicy::default())?,
    };
    let from = parse_time("from", &r.from)?;
    let fires = Schedules::preview(&spec, from, r.count.unwrap_or(10))
        .map_err(|e| api_error(Error::Invalid(e)))?;
    Ok(Json(PreviewResponse {
        fires: fires.into_iter().map(time::format).collect(),
    }))
}

/// The task a fire created (for tests and clients that follow `task_id`).
pub async fn fire_task(schedules: &Schedules, id: uuid::Uuid) -> Result<Option<Task>, Error> {
    schedules.task(sundial::TaskId(id)).await
}
