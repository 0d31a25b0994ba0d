//! The workflows API (v1), over [`sundial_workflow::Workflows`].
//!
//! ```text
//! POST /v1/workflows                        {type, id?, input?, id_reuse?}   201 {id, run_id, status} | 409 422
//! GET  /v1/workflows?type=&status=&limit=&cursor=   current runs, in id order  200 {workflows, next_cursor} | 422
//! GET  /v1/workflows/{id}                   the current run                  200 | 404
//! POST /v1/workflows/{id}/signals/{name}    {input?}                         202 | 404 409 422
//! POST /v1/workflows/{id}/cancel            {reason?}                        202 | 404 409
//! POST /v1/workflows/{id}/terminate         {reason?}                        200 | 404 409
//! GET  /v1/workflows/{id}/history           {workflow_id, run_id, events}    200 | 404
//! ```
//!
//! `status` is one of `running`, `completed`, `failed`, `cancelled`, `terminated`,
//! `continued_as_new`; `id_reuse` one of `allow_duplicate` (default),
//! `allow_duplicate_failed_only`, `reject_duplicate`. Errors are as in the task API; conflicts
//! are `409` with code `already_exists` (the id is running, `existing_id` its run; or the id
//! reuse policy refuses a new run) or `wrong_state` (+ `state`).
//! Workflow ids that contain `/` (child workflows) are percent-encoded in paths. Workflow tasks
//! and activities run where their type and name are registered: [`crate::router`] attaches its
//! own [`Workflows`] (timers and child starts run in the server); an embedding program that runs
//! workflows in-process registers them on its own `Workflows::attach(&sundial)`, which shares the
//! engine and the store with the router's. Types and names registered nowhere in the server
//! wait as `ready` kernel tasks for remote workers, which claim them with the remote-mode routes
//! (protocol in [`sundial_workflow::remote`]; client `sundial_workflow::remote::RemoteWorker`):
//!
//! ```text
//! POST /v1/workflow-tasks/poll                  {worker, types, max?, wait_ms?|wait?}   200 {tasks}
//! POST /v1/workflow-tasks/{task}/complete       {execution_id, expect_len, commands | error}
//!                                               200 {status: committed | dropped | stale, task?}
//! POST /v1/workflow-activities/poll             {worker, names, max?, wait_ms?|wait?}   200 {tasks}
//! POST /v1/workflow-activities/{task}/complete  {execution_id, result?}           200 | 409
//! POST /v1/workflow-activities/{task}/fail      {execution_id, error, retryable?} 200 | 409
//! ```
//!
//! Every route is described in `/openapi.json` (tags `workflows` and `workflow workers`).
//!
//! Under `/v1/namespaces/{ns}/…` every route is namespace `ns`'s (see [`crate::namespace`]): a
//! workflow id is the namespace's own (stored qualified), its workflow tasks, timers, child
//! starts and activities are in the namespace's workflow queues, so the worker polls hand out
//! the namespace's only, and the children a worker's commands start are the namespace's
//! workflows. Another namespace's workflow, workflow task or activity answers `404`, as one that
//! does not exist. Responses show workflow ids as the namespace knows them.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sundial_workflow::remote::{
    ActivityTaskView, CompleteActivity, CompleteWorkflowTask, FailActivity, PollActivities,
    PollWorkflowTasks, WorkflowTaskOutcome, WorkflowTaskView,
};
use sundial_workflow::{
    Error, IdReusePolicy, StartWorkflow, WorkflowFilter, WorkflowRun, WorkflowStatus, Workflows,
};
use sundial_workflow::{Event, WorkflowEvent};

use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiQuery, parse_json};
use crate::namespace::Ns;
use crate::time;

/// The workflow routes and their OpenAPI description.
fn api() -> OpenApiRouter<Workflows> {
    OpenApiRouter::new()
        .routes(routes!(start, list))
        .routes(routes!(get_one))
        .routes(routes!(signal))
        .routes(routes!(cancel))
        .routes(routes!(terminate))
        .routes(routes!(history))
        .routes(routes!(poll_workflow_tasks))
        .routes(routes!(complete_workflow_task))
        .routes(routes!(poll_activities))
        .routes(routes!(complete_activity))
        .routes(routes!(fail_activity))
}

/// The workflow routes, with their own state. Merged into [`crate::router`].
pub fn router(workflows: Workflows, body_limit: usize) -> Router {
    let (router, _) = api().split_for_parts();
    router
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(workflows)
}

/// The OpenAPI description of the workflow routes (merged into `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

// ---- Wire types ---------------------------------------------------------------------------------

/// `POST /v1/workflows`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    #[serde(rename = "type")]
    pub workflow_type: String,
    /// Default: the new run's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_reuse: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct StartResponse {
    pub id: String,
    pub run_id: uuid::Uuid,
    pub status: String,
}

/// `POST /v1/workflows/{id}/signals/{name}` (an empty body is no input).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

/// `POST /v1/workflows/{id}/cancel` and `/terminate` (an empty body is no reason).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasonRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A workflow's current run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct WorkflowView {
    pub id: String,
    pub run_id: uuid::Uuid,
    #[serde(rename = "type")]
    pub workflow_type: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub history_length: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_from: Option<uuid::Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_to: Option<uuid::Uuid>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct WorkflowList {
    pub workflows: Vec<WorkflowView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub workflow_type: Option<String>,
    /// `running`, `completed`, `failed`, `cancelled`, `terminated` or `continued_as_new`.
    pub status: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

// ---- Conversions --------------------------------------------------------------------------------

pub(crate) fn api_error(e: Error) -> ApiError {
    match e {
        Error::Invalid { field, reason } => ApiError::invalid(field, reason),
        Error::NotFound => ApiError::not_found("no such workflow"),
        Error::AlreadyRunning { run_id } => {
            let mut e = ApiError::new(
                StatusCode::CONFLICT,
                "already_exists",
                format!("the workflow is already running (run {run_id})"),
            );
            e.detail.existing_id = Some(run_id.0);
            e
        }
        e @ Error::AlreadyExists { .. } => {
            ApiError::new(StatusCode::CONFLICT, "already_exists", e.to_string())
        }
        Error::NotRunning { status } => {
            let mut e = ApiError::new(
                StatusCode::CONFLICT,
                "wrong_state",
                format!("the workflow is {status}"),
            );
            e.detail.state = Some(status.as_str().to_string());
            e
        }
        Error::Unsupported => ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "this store does not support workflows",
        ),
        Error::Sundial(e) => e.into(),
        Error::Store(e) => sundial::Error::Store(e).into(),
        e @ (Error::Corrupt(_) | Error::KeptContinuing | Error::ActivityNotRecorded { .. }) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        }
    }
}

/// A workflow id as its namespace knows it (the handlers only ever load their own namespace's
/// workflows, and a workflow's parent is of its namespace).
fn local(stored: &str) -> String {
    sundial_core::namespace::local(stored).to_string()
}

/// The stored id of workflow `id` of namespace `ns`; `None` for an id holding the separator
/// (which would name another namespace's workflow).
fn stored_id(ns: &Ns, id: &str) -> Result<String, ApiError> {
    ns.qualify_given(id)
        .ok_or_else(|| ApiError::not_found("no such workflow"))
}

/// History events as the namespace knows them: a run's start names its parent by the parent's
/// stored id. (Commands name children as the workflow code did.)
fn local_events(events: &mut [WorkflowEvent]) {
    for e in events {
        if let Event::WorkflowStarted {
            parent_workflow_id: Some(p),
            ..
        } = &mut e.event
        {
            *p = local(p);
        }
    }
}

/// A claimed workflow task as the worker's namespace knows it.
fn local_task(mut v: WorkflowTaskView) -> WorkflowTaskView {
    v.workflow_id = local(&v.workflow_id);
    local_events(&mut v.history);
    v
}

/// Another namespace's kernel task (workflow task or activity) answers a worker's call as one
/// that does not exist would.
async fn own_kernel_task(
    workflows: &Workflows,
    ns: &Ns,
    id: sundial::TaskId,
) -> Result<(), ApiError> {
    match workflows.sundial().get(id).await? {
        Some(t) if !ns.owns(&t.queue) => Err(sundial::Error::NotFound.into()),
        _ => Ok(()),
    }
}

fn view(r: &WorkflowRun) -> WorkflowView {
    WorkflowView {
        id: local(&r.workflow_id),
        run_id: *r.run_id.as_uuid(),
        workflow_type: r.workflow_type.clone(),
        status: r.status.as_str().to_string(),
        result: r
            .result
            .as_deref()
            .map(|s| serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))),
        error: r.error.clone(),
        history_length: r.history_len,
        parent_id: r.parent.as_ref().map(|p| local(&p.workflow_id)),
        continued_from: r.continued_from.map(|id| *id.as_uuid()),
        continued_to: r.continued_to.map(|id| *id.as_uuid()),
        created_at: time::format(r.created_at),
        updated_at: time::format(r.updated_at),
        closed_at: r.closed_at.map(time::format),
    }
}

/// An optional JSON body: empty (or blank), or `null`, is the default.
fn optional_body<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) || body.trim_ascii() == b"null" {
        return Ok(T::default());
    }
    parse_json(body)
}

// ---- Handlers -----------------------------------------------------------------------------------

#[utoipa::path(
    post, path = "/v1/workflows", tag = "workflows",
    operation_id = "start_workflow",
    request_body = StartRequest,
    responses(
        (status = 201, description = "Started: run row, first event and first workflow task stored", body = StartResponse),
        (status = 400, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`already_exists`: the id is running (`existing_id` is its run) or the id reuse policy refuses a new run", body = ErrorBody),
        (status = 422, description = "Invalid; nothing stored", body = ErrorBody),
    )
)]
pub async fn start(
    State(workflows): State<Workflows>,
    ns: Ns,
    ApiJson(r): ApiJson<StartRequest>,
) -> Result<Response, ApiError> {
    let id_reuse = match r.id_reuse.as_deref() {
        None => IdReusePolicy::default(),
        Some(s) => IdReusePolicy::parse(s).ok_or_else(|| {
            ApiError::invalid(
                "id_reuse",
                "must be allow_duplicate, allow_duplicate_failed_only or reject_duplicate",
            )
        })?,
    };
    let mut req =
        StartWorkflow::new(r.workflow_type, r.input.unwrap_or(Value::Null)).id_reuse(id_reuse);
    req.workflow_id = r.id;
    let run = workflows
        .start_in(ns.name(), req)
        .await
        .map_err(api_error)?;
    Ok((
        StatusCode::CREATED,
        Json(StartResponse {
            id: local(&run.workflow_id),
            run_id: *run.run_id.as_uuid(),
            status: run.status.as_str().to_string(),
        }),
    )
        .into_response())
}

#[utoipa::path(
    get, path = "/v1/workflows", tag = "workflows",
    operation_id = "list_workflows",
    params(ListQuery),
    responses(
        (status = 200, description = "Current runs in workflow id order", body = WorkflowList),
        (status = 422, description = "Unknown parameter or bad value", body = ErrorBody),
    )
)]
pub async fn list(
    State(workflows): State<Workflows>,
    ns: Ns,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<WorkflowList>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let status = q
        .status
        .as_deref()
        .map(|s| {
            s.parse::<WorkflowStatus>()
                .map_err(|e| ApiError::invalid("status", e))
        })
        .transpose()?;
    let filter = WorkflowFilter {
        workflow_type: q.workflow_type,
        status,
        namespace: Some(ns.name().to_string()),
    };
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            ns.qualify_given(c)
                .ok_or_else(|| ApiError::invalid("cursor", "not a cursor of this list"))
        })
        .transpose()?;
    let page = workflows
        .list(&filter, after.as_deref(), limit)
        .await
        .map_err(api_error)?;
    Ok(Json(WorkflowList {
        workflows: page.runs.iter().map(view).collect(),
        next_cursor: page.next_cursor.map(|c| local(&c)),
    }))
}

/// Workflow `id` of namespace `ns` (its current run): `404` when there is none.
async fn load(workflows: &Workflows, ns: &Ns, id: &str) -> Result<WorkflowRun, ApiError> {
    workflows
        .get(&stored_id(ns, id)?)
        .await
        .map_err(api_error)?
        .ok_or_else(|| ApiError::not_found("no such workflow"))
}

#[utoipa::path(
    get, path = "/v1/workflows/{id}", tag = "workflows",
    operation_id = "get_workflow",
    params(("id" = String, Path, description = "Workflow id (percent-encoded)")),
    responses(
        (status = 200, description = "The current run", body = WorkflowView),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub async fn get_one(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(view(&load(&workflows, &ns, &id).await?)))
}

#[utoipa::path(
    post, path = "/v1/workflows/{id}/signals/{name}", tag = "workflows",
    operation_id = "signal_workflow",
    params(("id" = String, Path, description = "Workflow id (percent-encoded)"), ("name" = String, Path, description = "Signal name: 1 to 100 bytes of UTF-8, no control characters, no whitespace at either end")),
    request_body(content = Option<SignalRequest>, description = "Optional input (an empty body is none)"),
    responses(
        (status = 202, description = "Recorded in the history"),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow is not running (`wrong_state`)", body = ErrorBody),
        (status = 422, description = "Invalid", body = ErrorBody),
    )
)]
pub async fn signal(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path((id, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let r: SignalRequest = optional_body(&body)?;
    workflows
        .signal(&stored_id(&ns, &id)?, &name, r.input.unwrap_or(Value::Null))
        .await
        .map_err(api_error)?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[utoipa::path(
    post, path = "/v1/workflows/{id}/cancel", tag = "workflows",
    operation_id = "cancel_workflow",
    params(("id" = String, Path, description = "Workflow id (percent-encoded)")),
    request_body(content = Option<ReasonRequest>, description = "Optional reason"),
    responses(
        (status = 202, description = "Cancel requested: the workflow sees it and may compensate"),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow is not running", body = ErrorBody),
    )
)]
pub async fn cancel(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let r: ReasonRequest = optional_body(&body)?;
    workflows
        .cancel(&stored_id(&ns, &id)?, r.reason)
        .await
        .map_err(api_error)?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[utoipa::path(
    post, path = "/v1/workflows/{id}/terminate", tag = "workflows",
    operation_id = "terminate_workflow",
    params(("id" = String, Path, description = "Workflow id (percent-encoded)")),
    request_body(content = Option<ReasonRequest>, description = "Optional reason"),
    responses(
        (status = 200, description = "Closed without running workflow code", body = WorkflowView),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow is not running", body = ErrorBody),
    )
)]
pub async fn terminate(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<WorkflowView>, ApiError> {
    let r: ReasonRequest = optional_body(&body)?;
    let reason = r
        .reason
        .unwrap_or_else(|| "terminated over HTTP".to_string());
    let run = workflows
        .terminate(&stored_id(&ns, &id)?, &reason)
        .await
        .map_err(api_error)?;
    Ok(Json(view(&run)))
}

#[utoipa::path(
    get, path = "/v1/workflows/{id}/history", tag = "workflows",
    operation_id = "workflow_history",
    params(("id" = String, Path, description = "Workflow id (percent-encoded)")),
    responses(
        (status = 200, description = "The current run's history, oldest event first", body = WorkflowHistory),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub async fn history(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<WorkflowHistory>, ApiError> {
    let run = load(&workflows, &ns, &id).await?;
    let mut events = workflows.history(run.run_id).await.map_err(api_error)?;
    local_events(&mut events);
    Ok(Json(WorkflowHistory {
        workflow_id: local(&run.workflow_id),
        run_id: run.run_id.0,
        events,
    }))
}

/// `GET /v1/workflows/{id}/history`: a run's events, as its workers replay them.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowHistory {
    pub workflow_id: String,
    pub run_id: uuid::Uuid,
    /// Numbered from 0; event 0 is `workflow_started`.
    pub events: Vec<WorkflowEvent>,
}

/// `POST /v1/workflow-tasks/poll`: the claimed workflow tasks (none when the wait ran out).
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowTaskList {
    pub tasks: Vec<WorkflowTaskView>,
}

/// `POST /v1/workflow-activities/poll`: the claimed activity attempts (none when the wait ran
/// out).
#[derive(Debug, Serialize, ToSchema)]
pub struct ActivityTaskList {
    pub tasks: Vec<ActivityTaskView>,
}

/// The answer to an activity's completion or failure.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActivityRecorded {
    pub status: ActivityRecordedStatus,
}

/// Always `recorded`: the result or the failure is in the history (a failure is retried while
/// the activity's policy has attempts left).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActivityRecordedStatus {
    Recorded,
}

impl ActivityRecorded {
    const RECORDED: ActivityRecorded = ActivityRecorded {
        status: ActivityRecordedStatus::Recorded,
    };
}

// ---- Remote workers -----------------------------------------------------------------------------

/// The request bodies of the workflow worker protocol as the document describes them: the wire
/// forms of `sundial_workflow::remote`'s types (which the handlers parse; the workflow crate has
/// no OpenAPI dependency). `wire_forms_match_the_protocol` keeps the two in step.
pub mod protocol_doc {
    use utoipa::ToSchema;

    /// `POST /v1/workflow-tasks/poll`.
    #[derive(serde::Serialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct PollWorkflowTasks {
        /// The worker's name.
        pub worker: String,
        /// Workflow types this worker has code for (at least one).
        #[schema(min_items = 1)]
        pub types: Vec<String>,
        /// Most tasks to take (default 1; capped at 64).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max: Option<u32>,
        /// How long to wait for a task when none is ready (default 0; capped at 30 s): a number
        /// of milliseconds (`20000`) or a duration string (`"20s"`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub wait_ms: Option<u64>,
        /// The same as a duration string only, as the task API's poll takes it (`"20s"`); not
        /// with `wait_ms`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub wait: Option<String>,
    }

    /// `POST /v1/workflow-activities/poll`.
    #[derive(serde::Serialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct PollActivities {
        /// The worker's name.
        pub worker: String,
        /// Activity names this worker has code for (at least one).
        #[schema(min_items = 1)]
        pub names: Vec<String>,
        /// Most tasks to take (default 1; capped at 64).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max: Option<u32>,
        /// How long to wait when none is ready (default 0; capped at 30 s): a number of
        /// milliseconds (`20000`) or a duration string (`"20s"`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub wait_ms: Option<u64>,
        /// The same as a duration string only (`"20s"`); not with `wait_ms`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub wait: Option<String>,
    }

    /// `POST /v1/workflow-activities/{task}/complete`.
    #[derive(serde::Serialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct CompleteActivity {
        /// The attempt's execution id, from the poll.
        pub execution_id: uuid::Uuid,
        /// The activity's result, any JSON (default `null`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub result: Option<serde_json::Value>,
    }

    /// `POST /v1/workflow-activities/{task}/fail`.
    #[derive(serde::Serialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct FailActivity {
        /// The attempt's execution id, from the poll.
        pub execution_id: uuid::Uuid,
        /// Why it failed.
        pub error: String,
        /// Default `true`: retried while the activity's policy has attempts left.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub retryable: Option<bool>,
    }
}

fn task_id(raw: &str) -> Result<sundial::TaskId, ApiError> {
    raw.parse::<uuid::Uuid>()
        .map(sundial::TaskId)
        .map_err(|_| ApiError::invalid("task", "must be a task id (UUID)"))
}

#[utoipa::path(
    post, path = "/v1/workflow-tasks/poll", tag = "workflow workers",
    operation_id = "poll_workflow_tasks",
    request_body = protocol_doc::PollWorkflowTasks,
    responses(
        (status = 200, description = "Claimed workflow tasks with their histories", body = WorkflowTaskList),
        (status = 422, description = "Invalid", body = ErrorBody),
    )
)]
pub async fn poll_workflow_tasks(
    State(workflows): State<Workflows>,
    ns: Ns,
    ApiJson(r): ApiJson<PollWorkflowTasks>,
) -> Result<Json<WorkflowTaskList>, ApiError> {
    let tasks: Vec<WorkflowTaskView> = workflows
        .poll_workflow_tasks_in(ns.name(), r)
        .await
        .map_err(api_error)?
        .into_iter()
        .map(local_task)
        .collect();
    Ok(Json(WorkflowTaskList { tasks }))
}

#[utoipa::path(
    post, path = "/v1/workflow-tasks/{task}/complete", tag = "workflow workers",
    operation_id = "complete_workflow_task",
    params(("task" = uuid::Uuid, Path, description = "The claimed kernel task")),
    request_body(content = CompleteWorkflowTask, description = "The commands the workflow issued after replaying `expect_len` events, or the error that stopped the replay"),
    responses(
        (status = 200, description = "`committed`; `dropped` (the run closed or has a newer workflow task: nothing recorded); or `stale` with the grown history to replay and answer again", body = WorkflowTaskOutcome),
        (status = 409, description = "Stale execution", body = ErrorBody),
        (status = 422, description = "Invalid", body = ErrorBody),
    )
)]
pub async fn complete_workflow_task(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(task): Path<String>,
    ApiJson(r): ApiJson<CompleteWorkflowTask>,
) -> Result<Response, ApiError> {
    let id = task_id(&task)?;
    own_kernel_task(&workflows, &ns, id).await?;
    let outcome = match workflows
        .complete_workflow_task(id, r)
        .await
        .map_err(api_error)?
    {
        WorkflowTaskOutcome::Stale { task } => WorkflowTaskOutcome::Stale {
            task: Box::new(local_task(*task)),
        },
        other => other,
    };
    Ok(Json(outcome).into_response())
}

#[utoipa::path(
    post, path = "/v1/workflow-activities/poll", tag = "workflow workers",
    operation_id = "poll_workflow_activities",
    request_body = protocol_doc::PollActivities,
    responses(
        (status = 200, description = "Claimed activity attempts", body = ActivityTaskList),
        (status = 422, description = "Invalid", body = ErrorBody),
    )
)]
pub async fn poll_activities(
    State(workflows): State<Workflows>,
    ns: Ns,
    ApiJson(r): ApiJson<PollActivities>,
) -> Result<Json<ActivityTaskList>, ApiError> {
    let tasks = workflows
        .poll_activities_in(ns.name(), r)
        .await
        .map_err(api_error)?;
    Ok(Json(ActivityTaskList { tasks }))
}

#[utoipa::path(
    post, path = "/v1/workflow-activities/{task}/complete", tag = "workflow workers",
    operation_id = "complete_workflow_activity",
    params(("task" = uuid::Uuid, Path, description = "The claimed kernel task")),
    request_body = protocol_doc::CompleteActivity,
    responses(
        (status = 200, description = "The result is in the history", body = ActivityRecorded),
        (status = 409, description = "Stale execution", body = ErrorBody),
    )
)]
pub async fn complete_activity(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(task): Path<String>,
    ApiJson(r): ApiJson<CompleteActivity>,
) -> Result<Json<ActivityRecorded>, ApiError> {
    let id = task_id(&task)?;
    own_kernel_task(&workflows, &ns, id).await?;
    workflows
        .finish_activity(id, r.execution_id, Ok(r.result))
        .await
        .map_err(api_error)?;
    Ok(Json(ActivityRecorded::RECORDED))
}

#[utoipa::path(
    post, path = "/v1/workflow-activities/{task}/fail", tag = "workflow workers",
    operation_id = "fail_workflow_activity",
    params(("task" = uuid::Uuid, Path, description = "The claimed kernel task")),
    request_body = protocol_doc::FailActivity,
    responses(
        (status = 200, description = "The failure is in the history (retried while the policy has attempts left)", body = ActivityRecorded),
        (status = 409, description = "Stale execution", body = ErrorBody),
    )
)]
pub async fn fail_activity(
    State(workflows): State<Workflows>,
    ns: Ns,
    Path(task): Path<String>,
    ApiJson(r): ApiJson<FailActivity>,
) -> Result<Json<ActivityRecorded>, ApiError> {
    let id = task_id(&task)?;
    own_kernel_task(&workflows, &ns, id).await?;
    workflows
        .finish_activity(
            id,
            r.execution_id,
            Err((r.error, r.retryable.unwrap_or(true))),
        )
        .await
        .map_err(api_error)?;
    Ok(Json(ActivityRecorded::RECORDED))
}

#[cfg(test)]
mod protocol_doc_tests {
    use super::protocol_doc;
    use sundial_workflow::remote;

    /// The documented bodies serialise to JSON the protocol's own types read, and back.
    #[test]
    fn wire_forms_match_the_protocol() {
        let id = uuid::Uuid::nil();
        let poll = protocol_doc::PollWorkflowTasks {
            worker: "w".into(),
            types: vec!["order".into()],
            max: Some(2),
            wait_ms: Some(100),
            wait: None,
        };
        let v = serde_json::to_value(&poll).unwrap();
        let back: remote::PollWorkflowTasks = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), v);
        let apoll = protocol_doc::PollActivities {
            worker: "w".into(),
            names: vec!["charge".into()],
            max: Some(2),
            wait_ms: None,
            wait: Some("100ms".into()),
        };
        let v = serde_json::to_value(&apoll).unwrap();
        let back: remote::PollActivities = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), v);
        let done = protocol_doc::CompleteActivity {
            execution_id: id,
            result: Some(serde_json::json!({"a": 1})),
        };
        let v = serde_json::to_value(&done).unwrap();
        let back: remote::CompleteActivity = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), v);
        let fail = protocol_doc::FailActivity {
            execution_id: id,
            error: "e".into(),
            retryable: Some(false),
        };
        let v = serde_json::to_value(&fail).unwrap();
        let back: remote::FailActivity = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), v);
        // Every field the protocol's types have is documented, and no other.
        let doc = crate::openapi();
        let schemas = &doc.components.as_ref().unwrap().schemas;
        // (Both waits set, which a request may not do, so that every field is serialised.)
        let full_poll = protocol_doc::PollWorkflowTasks {
            wait: Some("1s".into()),
            ..poll
        };
        let full_apoll = protocol_doc::PollActivities {
            wait_ms: Some(1),
            ..apoll
        };
        for (name, v) in [
            (
                "PollWorkflowTasks",
                serde_json::to_value(&full_poll).unwrap(),
            ),
            ("PollActivities", serde_json::to_value(&full_apoll).unwrap()),
            ("FailActivity", serde_json::to_value(&fail).unwrap()),
        ] {
            let s = serde_json::to_value(&schemas[name]).unwrap();
            let props: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
            let mut fields: Vec<&String> = v.as_object().unwrap().keys().collect();
            fields.sort();
            let mut props = props;
            props.sort();
            assert_eq!(props, fields, "{name}");
        }
    }
}
