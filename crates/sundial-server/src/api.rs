//! The v1 handlers. Each one validates its request completely before it calls the library, so a
//! refused request changes nothing; the library then does every state change as one conditional
//! update in the store.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sundial::trace::Step;
use sundial::{ExecutionId, Scheduled, TaskId, TaskSpec, TaskState, Timestamp};

use tracing::Instrument;

use crate::AppState;
use crate::duration;
use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiJson;
use crate::namespace::Ns;
use crate::quota::Quota;
use crate::trace::{self as tracectx, TraceHeaders};
use crate::wire::{
    BatchItem, BatchResponse, CompleteRequest, CreateBatch, CreateTask, FailRequest, Health,
    HeartbeatRequest, ListQuery, PollRequest, PollResponse, PolledTask, TaskList, TaskView,
};

/// Longest `last_error` kept from a worker's `fail` (the end of the text is kept).
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

fn parse_id(raw: &str) -> Result<TaskId, ApiError> {
    // An id that is not a UUID names no task: 404, like any other unknown id.
    raw.parse::<TaskId>()
        .map_err(|_| ApiError::not_found(format!("no such task: {raw:?} is not a task id")))
}

/// The task `id` as namespace `ns` sees it: `404` when it does not exist or is another
/// namespace's (the same answer, so that no namespace learns of another's tasks).
pub(crate) async fn owned_task(
    st: &AppState,
    ns: &Ns,
    id: TaskId,
) -> Result<sundial::Task, ApiError> {
    st.sundial
        .get(id)
        .await?
        .and_then(|t| ns.own(t))
        .ok_or_else(|| ApiError::not_found("no such task"))
}

/// A task namespace `ns` acted on, as it sees it (`404` when it is another namespace's).
pub(crate) fn view(ns: &Ns, task: sundial::Task) -> Result<TaskView, ApiError> {
    ns.own(task)
        .map(TaskView::from)
        .ok_or_else(|| ApiError::not_found("no such task"))
}

/// A worker's call (heartbeat, complete, fail) that the store refused: another namespace's task
/// reads as `404`, like a task that does not exist; anything else is the store's answer.
async fn worker_refusal(st: &AppState, ns: &Ns, id: TaskId, e: sundial::Error) -> ApiError {
    match st.sundial.get(id).await {
        Ok(Some(t)) if !ns.owns(&t.queue) => ApiError::not_found("no such task"),
        _ => e.into(),
    }
}

fn created(ns: &Ns, task: sundial::Task) -> Result<Response, ApiError> {
    let location = HeaderValue::from_str(&ns.path(&format!("/v1/tasks/{}", task.id)));
    let target = crate::access::AuditTarget(task.id.to_string());
    let mut resp = (StatusCode::CREATED, Json(view(ns, task)?)).into_response();
    if let Ok(v) = location {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.extensions_mut().insert(target);
    Ok(resp)
}

/// Create a task.
#[utoipa::path(
    post, path = "/v1/tasks", tag = "tasks",
    params(
        ("traceparent" = Option<String>, Header, description = "W3C trace context: the task carries it (continued by the span of this request) to every step that runs it; a malformed value is ignored"),
        ("tracestate" = Option<String>, Header, description = "W3C vendor trace state, kept beside a valid traceparent"),
    ),
    request_body = CreateTask,
    responses(
        (status = 201, description = "Stored durably", body = TaskView),
        (status = 200, description = "A repeat of an earlier create with the same idempotency key, version and body, or a create inside the period of a throttle: the task the first (admitted) create made, nothing new stored", body = TaskView),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "A live task of the queue holds the key (`existing_id`); nothing stored", body = ErrorBody),
        (status = 429, description = "Over the namespace's quota of live tasks or creates per second (`quota`, with `Retry-After`); nothing stored", body = ErrorBody),
        (status = 413, description = "Body or payload over the limit", body = ErrorBody),
        (status = 422, description = "Invalid (unknown field, bad value)", body = ErrorBody),
    )
)]
pub async fn create_task(
    State(st): State<AppState>,
    ns: Ns,
    quota: Quota,
    TraceHeaders(incoming): TraceHeaders,
    ApiJson(body): ApiJson<CreateTask>,
) -> Result<Response, ApiError> {
    let idempotency = match body.idempotency_key.as_deref() {
        Some(k) => Some(
            sundial::Idempotency::new(ns.given("idempotency_key", k)?)
                .version(body.idempotency_version.unwrap_or(0)),
        ),
        None => None,
    };
    if idempotency.is_none() && body.idempotency_version.is_some() {
        return Err(ApiError::invalid(
            "idempotency_version",
            "idempotency_version needs an idempotency_key",
        ));
    }
    let throttle = match body.throttle.clone() {
        Some(_) if idempotency.is_some() => {
            return Err(ApiError::invalid(
                "throttle",
                "give either throttle or idempotency_key, not both (a throttled create is \
                 answered with the admitted task already)",
            ));
        }
        Some(t) => Some(t.into_throttle()?),
        None => None,
    };
    let debounce = match body.debounce.clone() {
        Some(_) if idempotency.is_some() || throttle.is_some() => {
            return Err(ApiError::invalid(
                "debounce",
                "give debounce alone, without throttle or idempotency_key (a debounced create \
                 answers the pending task of its key already)",
            ));
        }
        Some(_) if body.run_at.is_some() || body.delay.is_some() => {
            return Err(ApiError::invalid(
                "debounce",
                "a debounced task is due debounce.delay after its latest create: leave out \
                 run_at and delay",
            ));
        }
        Some(d) => Some(d.into_debounce()?),
        None => None,
    };
    if let Err(over) = st.quotas.admit(&st.sundial, &ns, &quota, 1).await {
        return Ok(over);
    }
    let span = tracectx::create_span(incoming.as_ref(), 1);
    let spec = ns.spec(
        body.into_spec()?
            .trace(tracectx::stored_context(&span, incoming.as_ref())),
    )?;
    if let Some(d) = debounce {
        let out = st
            .sundial
            .create_debounced(spec, d)
            .instrument(span)
            .await?;
        if !out.replaced {
            return created(&ns, out.task);
        }
        let target = crate::access::AuditTarget(out.task.id.to_string());
        let mut resp = (StatusCode::OK, Json(view(&ns, out.task)?)).into_response();
        resp.extensions_mut().insert(target);
        return Ok(resp);
    }
    let c = match (idempotency, throttle) {
        (None, None) => {
            return created(&ns, st.sundial.schedule_task(spec).instrument(span).await?);
        }
        (Some(i), _) => {
            st.sundial
                .create_idempotent(spec, i)
                .instrument(span)
                .await?
        }
        (None, Some(t)) => {
            st.sundial
                .create_throttled(spec, t)
                .instrument(span)
                .await?
        }
    };
    if c.repeat {
        let target = crate::access::AuditTarget(c.task.id.to_string());
        let mut resp = (StatusCode::OK, Json(view(&ns, c.task)?)).into_response();
        resp.extensions_mut().insert(target);
        Ok(resp)
    } else {
        created(&ns, c.task)
    }
}

/// Create many tasks in one transaction.
///
/// Any invalid item refuses the whole batch (the error names its `index`). An item whose key is
/// held by a live task is reported as `duplicate` and not stored; the others are.
#[utoipa::path(
    post, path = "/v1/tasks:batch", tag = "tasks",
    params(
        ("traceparent" = Option<String>, Header, description = "W3C trace context: every task of the batch carries it (continued by the span of this request) to every step that runs it; a malformed value is ignored"),
        ("tracestate" = Option<String>, Header, description = "W3C vendor trace state, kept beside a valid traceparent"),
    ),
    request_body = CreateBatch,
    responses(
        (status = 201, description = "One result per item, in order", body = BatchResponse),
        (status = 429, description = "Over the namespace's quota of live tasks or creates per second (`quota`, with `Retry-After`); nothing stored", body = ErrorBody),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 413, description = "Too many items, body or a payload over the limit", body = ErrorBody),
        (status = 422, description = "An invalid item (its `index` is given); nothing stored", body = ErrorBody),
    )
)]
pub async fn create_batch(
    State(st): State<AppState>,
    ns: Ns,
    quota: Quota,
    TraceHeaders(incoming): TraceHeaders,
    body: Result<ApiJson<CreateBatch>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(body) = body.map_err(|mut e| {
        if e.detail.message.contains("not an array") {
            e.detail
                .message
                .push_str("; send a batch as {\"tasks\": [...]}");
        }
        e
    })?;
    if body.tasks.len() > st.config.max_batch_items {
        return Err(ApiError::too_large(format!(
            "a batch holds at most {} tasks; this one has {}",
            st.config.max_batch_items,
            body.tasks.len()
        ))
        .with_field("tasks"));
    }
    if let Some(i) = body
        .tasks
        .iter()
        .position(|t| t.idempotency_key.is_some() || t.idempotency_version.is_some())
    {
        return Err(ApiError::invalid(
            "idempotency_key",
            "idempotency keys are taken on single creates (POST /v1/tasks) only",
        )
        .at_index(i));
    }
    if let Some(i) = body.tasks.iter().position(|t| t.throttle.is_some()) {
        return Err(ApiError::invalid(
            "throttle",
            "throttles are taken on single creates (POST /v1/tasks) only",
        )
        .at_index(i));
    }
    if let Some(i) = body.tasks.iter().position(|t| t.debounce.is_some()) {
        return Err(ApiError::invalid(
            "debounce",
            "debounces are taken on single creates (POST /v1/tasks) only",
        )
        .at_index(i));
    }
    let span = tracectx::create_span(incoming.as_ref(), body.tasks.len());
    let stored = tracectx::stored_context(&span, incoming.as_ref());
    let specs = body
        .tasks
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.into_spec()
                .and_then(|s| ns.spec(s.trace(stored.clone())))
                .map_err(|e| e.at_index(i))
        })
        .collect::<Result<Vec<TaskSpec>, ApiError>>()?;
    if let Err(over) = st.quotas.admit(&st.sundial, &ns, &quota, specs.len()).await {
        return Ok(over);
    }
    let results: Vec<BatchItem> = st
        .sundial
        .schedule_many(specs)
        .instrument(span)
        .await?
        .into_iter()
        .map(|r| match r {
            Scheduled::Created(t) => BatchItem::Created {
                id: t.id.0,
                state: t.state.into(),
                run_at: crate::time::format(t.due_at),
            },
            Scheduled::Duplicate { existing } => BatchItem::Duplicate {
                existing_id: existing.0,
            },
        })
        .collect();
    // A batch that created one task names it, as a single create does.
    let target = match results.as_slice() {
        [BatchItem::Created { id, .. }] => Some(crate::access::AuditTarget(id.to_string())),
        _ => None,
    };
    let mut resp = (StatusCode::CREATED, Json(BatchResponse { results })).into_response();
    if let Some(t) = target {
        resp.extensions_mut().insert(t);
    }
    Ok(resp)
}

/// Get a task.
#[utoipa::path(
    get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
pub async fn get_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    let task = owned_task(&st, &ns, id).await?;
    Ok(Json(TaskView::from(task)))
}

/// List tasks, newest first, a page at a time.
///
/// A page visits a bounded number of candidate tasks (2,000, read from the index of one of the
/// filters): when they run out before `limit` matches are found, the page holds the matches
/// found, possibly none, and a `next_cursor` to continue below them. A short or empty page may
/// therefore have a cursor; only `next_cursor: null` means no more matches.
#[utoipa::path(
    get, path = "/v1/tasks", tag = "tasks",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of tasks: at most `limit`, possibly fewer (even none) with a `next_cursor` when the page stopped at its bound of visited candidates", body = TaskList),
        (status = 422, description = "Unknown parameter or bad value", body = ErrorBody),
    )
)]
pub async fn list_tasks(
    State(st): State<AppState>,
    ns: Ns,
    RawQuery(raw): RawQuery,
) -> Result<Json<TaskList>, ApiError> {
    let page = query_tasks(&st, &ns, raw.as_deref().unwrap_or("")).await?;
    Ok(Json(TaskList {
        tasks: page
            .tasks
            .into_iter()
            .filter_map(|t| ns.own(t))
            .map(TaskView::from)
            .collect(),
        next_cursor: page.next_cursor.map(|c| c.to_string()),
    }))
}

/// One page of `GET /v1/tasks?…` (the query string as sent): what the list route and the web
/// UI's task list both answer with.
pub(crate) async fn query_tasks(
    st: &AppState,
    ns: &Ns,
    raw: &str,
) -> Result<sundial::TaskPage, ApiError> {
    let q = parse_list_query(raw)?;
    let state = match q.state.as_deref() {
        Some(s) => Some(
            s.parse::<TaskState>()
                .map_err(|e| ApiError::invalid("state", e.to_string()))?,
        ),
        None => None,
    };
    let limit = q.limit.unwrap_or(50);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let before = match q.cursor.as_deref() {
        Some(c) => Some(
            c.parse::<TaskId>()
                .map_err(|_| ApiError::invalid("cursor", "not a cursor from a previous page"))?,
        ),
        None => None,
    };
    let mut filter = crate::ops::task_filter(
        ns,
        crate::ops::FilterFields {
            queue: q.queue.clone(),
            kind: q.kind.clone(),
            state,
            key: q.key.clone(),
            key_prefix: q.key_prefix.clone(),
            tag: &q.tag,
            error_group: q.error_group.clone(),
            due_after: q.due_after.as_deref(),
            due_before: q.due_before.as_deref(),
            created_after: q.created_after.as_deref(),
            created_before: q.created_before.as_deref(),
        },
    )?;
    filter.before = before;
    // Sundial's own queues (schedule ticks, workflow steps) would flood a listing of "my tasks":
    // they are left out unless asked for, by name or with `internal=true`.
    filter.exclude_internal = q.queue.is_none() && !q.internal.unwrap_or(false);
    Ok(st.sundial.list(filter, limit).await?)
}

/// The list query: `tag` may repeat (collected here); every other parameter at most once and
/// known (`422` otherwise).
fn parse_list_query(raw: &str) -> Result<ListQuery, ApiError> {
    let mut tags = Vec::new();
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        if k == "tag" {
            tags.push(v.into_owned());
        } else {
            rest.append_pair(&k, &v);
        }
    }
    let mut q: ListQuery = serde_urlencoded::from_str(&rest.finish())
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string()))?;
    q.tag = tags;
    Ok(q)
}

/// Cancel a task that has not finished. Once this returns it never starts a new attempt.
///
/// Idempotent: cancelling a task that is already `cancelled` answers `200` with the task, so a
/// retried request succeeds. A task that finished otherwise (`succeeded`, `dead`) is a `409`.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "Cancelled (now, or before)", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Already finished otherwise: `succeeded` or `dead` (`state`)", body = ErrorBody),
    )
)]
pub async fn cancel_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    owned_task(&st, &ns, id).await?;
    match st.sundial.cancel(id).await {
        Ok(task) => Ok(Json(view(&ns, task)?)),
        Err(sundial::Error::WrongState {
            state: TaskState::Cancelled,
        }) => Ok(Json(TaskView::from(owned_task(&st, &ns, id).await?))),
        Err(e) => Err(e.into()),
    }
}

/// Make a scheduled task due now.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/trigger", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "Due now", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not scheduled (`state`)", body = ErrorBody),
    )
)]
pub async fn trigger_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    owned_task(&st, &ns, id).await?;
    let task = st.sundial.trigger(id).await?;
    Ok(Json(view(&ns, task)?))
}

fn check_worker_name(w: &str) -> Result<(), ApiError> {
    if w.is_empty() || w.len() > 128 || w.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "worker",
            "worker must be 1 to 128 bytes without control characters",
        ));
    }
    Ok(())
}

fn check_queue_name(st: &AppState, queue: &str) -> Result<(), ApiError> {
    // The library's own rules for queue names, applied through a throwaway spec.
    let limits = &st.sundial.config().limits;
    match TaskSpec::new("probe")
        .queue(queue)
        .validate(TaskId::MIN, Timestamp::MIN, 1, limits)
    {
        Ok(_) => Ok(()),
        Err(e) => Err(ApiError::from(e).with_field("queue")),
    }
}

/// Long-poll a queue for ready tasks.
///
/// Holds the request open up to `wait` until tasks are ready, then hands out up to `max` of them,
/// each `running` under a fresh `execution_id` with a lease of the task's timeout. Answers with an
/// empty list when nothing became ready in time (or the server is stopping).
///
/// With `complete`, the worker's previous task is first recorded as succeeded (as
/// `POST /v1/tasks/{id}/complete` would) and the poll's first claim commits with it: a worker's
/// whole turn in one request and one durable commit. A refused completion is the answer (`404`,
/// `409`, `413`) and nothing is polled.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/poll", tag = "workers",
    params(("queue" = String, Path, description = "Queue name")),
    request_body = PollRequest,
    responses(
        (status = 200, description = "Tasks now running for this worker (maybe none), and the task `complete` recorded", body = PollResponse),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 404, description = "`complete`: no such task; nothing polled", body = ErrorBody),
        (status = 409, description = "`complete`: stale execution, the result was not recorded; nothing polled", body = ErrorBody),
        (status = 413, description = "`complete`: result over the limit; nothing polled", body = ErrorBody),
        (status = 422, description = "Invalid request", body = ErrorBody),
    )
)]
pub async fn poll_queue(
    State(st): State<AppState>,
    ns: Ns,
    Path(queue): Path<String>,
    ApiJson(body): ApiJson<PollRequest>,
) -> Result<Json<PollResponse>, ApiError> {
    check_queue_name(&st, &queue)?;
    crate::namespace::check_queue_given("queue", &queue)?;
    check_worker_name(&body.worker)?;
    let max = match body.max {
        None => 1,
        Some(0) => return Err(ApiError::invalid("max", "max must be at least 1")),
        Some(n) => (n as usize).min(st.sundial.config().max_poll_batch),
    };
    let wait = match body.wait.as_deref() {
        None => st.config.default_poll_wait,
        Some(w) => duration::parse(w).map_err(|e| ApiError::invalid("wait", e.to_string()))?,
    }
    .min(st.sundial.config().max_poll_wait);
    if body.kinds.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::invalid(
            "kinds",
            "kinds must not be empty when given",
        ));
    }
    let queue = ns.given("queue", &queue)?;
    let (completed, tasks) = match body.complete {
        None => (
            None,
            st.sundial
                .poll(&queue, Some(body.worker), body.kinds, max, wait)
                .await?,
        ),
        Some(c) => {
            check_result_size(&st, c.result.as_ref(), "complete.result")?;
            let id = TaskId(c.task_id);
            let done = sundial::Completion {
                id,
                execution: execution(c.execution_id),
                result: c.result,
            };
            match st
                .sundial
                .complete_and_poll(done, &queue, Some(body.worker), body.kinds, max, wait)
                .await
            {
                Ok((task, tasks)) => {
                    record_duration(&task);
                    (Some(worker_view(task)), tasks)
                }
                Err(e) => {
                    return Err(worker_refusal(&st, &ns, id, e)
                        .await
                        .with_field("complete.task_id"));
                }
            }
        }
    };
    Ok(Json(PollResponse {
        tasks: tasks
            .into_iter()
            .filter_map(|t| ns.own(t))
            .filter_map(PolledTask::from_task)
            .collect(),
        completed,
    }))
}

/// Refuses a result over the payload limit, naming `field`.
fn check_result_size(
    st: &AppState,
    result: Option<&serde_json::Value>,
    field: &str,
) -> Result<(), ApiError> {
    if let Some(r) = result {
        let len = serde_json::to_string(r).map(|s| s.len()).unwrap_or(0);
        let max = st.sundial.config().limits.max_payload_bytes;
        if len > max {
            return Err(
                ApiError::too_large(format!("result is {len} bytes; the limit is {max}"))
                    .with_field(field),
            );
        }
    }
    Ok(())
}

fn execution(id: uuid::Uuid) -> ExecutionId {
    ExecutionId(id)
}

/// Extend a running attempt's lease by the task's timeout.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/heartbeat", tag = "workers",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "Lease extended (`lease_expires_at`)", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Stale execution: stop working on the task", body = ErrorBody),
    )
)]
pub async fn heartbeat_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<HeartbeatRequest>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    let task = match st.sundial.heartbeat(id, execution(body.execution_id)).await {
        Ok(t) => t,
        Err(e) => return Err(worker_refusal(&st, &ns, id, e).await),
    };
    Ok(Json(worker_view(task)))
}

/// The task a worker's call changed, as its namespace sees it. The call was fenced by the
/// attempt's execution id, which only a poll of the task's own queue hands out.
fn worker_view(mut task: sundial::Task) -> TaskView {
    task.queue = sundial_core::namespace::local(&task.queue).to_string();
    task.key = task
        .key
        .map(|k| sundial_core::namespace::local(&k).to_string());
    if let Some(ex) = &mut task.exclusive {
        ex.key = sundial_core::namespace::local(&ex.key).to_string();
    }
    TaskView::from(task)
}

/// Record a successful attempt.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/complete", tag = "workers",
    params(
        ("id" = uuid::Uuid, Path, description = "Task id"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the worker's run: this request's span is its child"),
    ),
    request_body = CompleteRequest,
    responses(
        (status = 200, description = "Succeeded", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Stale execution: the result was not recorded", body = ErrorBody),
        (status = 413, description = "Result over the limit", body = ErrorBody),
    )
)]
pub async fn complete_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
    TraceHeaders(incoming): TraceHeaders,
    ApiJson(body): ApiJson<CompleteRequest>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    check_result_size(&st, body.result.as_ref(), "result")?;
    let complete = st
        .sundial
        .complete(id, execution(body.execution_id), body.result);
    let done = match tracectx::result_span(Step::Complete, incoming.as_ref()) {
        Some(span) => complete.instrument(span).await,
        None => {
            let done = complete.await;
            if let Ok(task) = &done {
                tracectx::record_result_point(Step::Complete, task);
            }
            done
        }
    };
    let task = match done {
        Ok(t) => t,
        Err(e) => return Err(worker_refusal(&st, &ns, id, e).await),
    };
    record_duration(&task);
    Ok(Json(worker_view(task)))
}

/// A remote attempt ended: record how long it ran (the engine records in-process runs itself).
fn record_duration(task: &sundial::Task) {
    if let Some(started) = task.started_at {
        metrics::histogram!("sundial_task_duration_seconds", "namespace" => sundial_core::namespace::namespace_of(&task.queue).to_string(), "queue" => sundial_core::namespace::local(&task.queue).to_string())
            .record(task.updated_at.since(started).as_secs_f64());
    }
}

/// Keeps the last `max` bytes of `s` (on a character boundary).
fn tail(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

/// Record a failed attempt: retried with the task's backoff while attempts remain (and
/// `retryable`), else `dead`.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/fail", tag = "workers",
    params(
        ("id" = uuid::Uuid, Path, description = "Task id"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context of the worker's run: this request's span is its child"),
    ),
    request_body = FailRequest,
    responses(
        (status = 200, description = "Rescheduled or dead", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Stale execution: the failure was not recorded", body = ErrorBody),
    )
)]
pub async fn fail_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
    TraceHeaders(incoming): TraceHeaders,
    ApiJson(body): ApiJson<FailRequest>,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    let error = tail(
        body.error.unwrap_or_else(|| "failed".to_string()),
        MAX_ERROR_BYTES,
    );
    let fail = st.sundial.fail(
        id,
        execution(body.execution_id),
        error,
        body.retryable.unwrap_or(true),
    );
    let done = match tracectx::result_span(Step::Fail, incoming.as_ref()) {
        Some(span) => fail.instrument(span).await,
        None => {
            let done = fail.await;
            if let Ok(task) = &done {
                tracectx::record_result_point(Step::Fail, task);
            }
            done
        }
    };
    let task = match done {
        Ok(t) => t,
        Err(e) => return Err(worker_refusal(&st, &ns, id, e).await),
    };
    record_duration(&task);
    Ok(Json(worker_view(task)))
}

/// Liveness, and what keeps the store's writes from succeeding (`degraded` with `problems`: its
/// disk is full), as its last writes found it. Never touches the store, so it answers while the
/// task endpoints are saturated; `200` either way, since reads are still served.
#[utoipa::path(
    get, path = "/healthz", tag = "service",
    responses((status = 200, description = "The process is serving: `ok`, or `degraded` with the problems", body = Health))
)]
pub async fn healthz(State(st): State<AppState>) -> Json<Health> {
    let problems: Vec<String> = st.sundial.store_condition().into_iter().collect();
    Json(Health {
        status: if problems.is_empty() {
            "ok"
        } else {
            "degraded"
        }
        .to_string(),
        problems,
    })
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(
    get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain"),
        (status = 404, description = "Metrics are not enabled in this embedding", body = ErrorBody),
    )
)]
pub async fn metrics(State(st): State<AppState>) -> Result<Response, ApiError> {
    let Some(handle) = st.config.prometheus.clone() else {
        return Err(ApiError::not_found(
            "metrics are not enabled (no Prometheus recorder was given)",
        ));
    };
    match st.sundial.counts().await {
        Ok(counts) => st.gauges.record(&counts, st.config.internal_queue_metrics),
        Err(e) => tracing::warn!(error = %e, "counting tasks for /metrics failed"),
    }
    match st.sundial.queues().await {
        Ok(queues) => st.gauges.record_queues(&queues),
        Err(e) => tracing::warn!(error = %e, "reading queues for /metrics failed"),
    }
    crate::process_collector().collect();
    let body = handle.render();
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response())
}

/// The wait a poll uses when it names none.
pub const DEFAULT_POLL_WAIT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        assert_eq!(tail("abc".into(), 5), "abc");
        assert_eq!(tail("abcdef".into(), 3), "…def");
        let s = "ééé".to_string(); // 6 bytes
        assert_eq!(tail(s, 3), "…é");
    }
}
