//! Operator routes: queues (overview, settings, pause and resume), a task's attempts, retrying
//! dead or cancelled tasks, and bulk cancel and retry over a filter.
//!
//! ```text
//! GET  /v1/queues                 every queue: counts, oldest overdue lateness, paused   200
//! GET  /v1/queues/{queue}         one queue                                               200 | 404
//! PUT  /v1/queues/{queue}         set the queue's settings (retention, default target)    200 | 422
//! POST /v1/queues/{queue}/pause   no task of the queue starts until resumed               200
//! POST /v1/queues/{queue}/resume  waiting tasks start again, in due order                 200
//! GET  /v1/tasks/{id}/attempts    the kept attempts, oldest first, and the total          200 | 404
//! POST /v1/tasks/{id}/retry       dead or cancelled → scheduled (now or `run_at`)         200 | 404 409
//! POST /v1/tasks:cancel           cancel every live task matching a filter                200 | 422
//! POST /v1/tasks:retry            retry every dead or cancelled task matching a filter    200 | 422
//! GET  /v1/workers                the workers that polled this node recently, by queue    200
//! GET  /v1/cluster                the nodes, their heartbeats and shards (several nodes)  200
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use sundial::{
    Attempt, AttemptOutcome, QueueConfig, QueueInfo, QueueSettings, RetentionOverride, TaskId,
    TaskState, Timestamp,
};
use sundial_store::TaskFilter;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::AppState;
use crate::duration::{self, WireDuration};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, parse_json};
use crate::namespace::Ns;
use crate::time;
use crate::wire::{StateView, TargetSpec, TaskView};

/// A queue as an operator sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct QueueView {
    pub queue: String,
    /// While paused nothing of the queue starts; creates are still accepted.
    pub paused: bool,
    /// When the queue was last paused or resumed.
    #[schema(format = DateTime)]
    pub paused_changed_at: Option<String>,
    /// Tasks per state (from maintained counters).
    pub counts: BTreeMap<String, u64>,
    /// Due time of the oldest task that is due but has not started.
    #[schema(format = DateTime)]
    pub oldest_overdue_at: Option<String>,
    /// How late that task is now (`"1500ms"`).
    pub lateness: Option<String>,
    /// The lateness in milliseconds, for dashboards.
    pub lateness_ms: Option<u64>,
    /// Due tasks with a rate limit (`CreateTask.rate`) that have not started: waiting for their
    /// limit's turn.
    #[serde(default)]
    pub rate_limited: u64,
    pub settings: QueueSettingsView,
}

/// A queue's settings. Absent retention fields take the server's defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueueSettingsView {
    #[serde(default, deserialize_with = "crate::extract::object_only")]
    pub retention: RetentionView,
    /// The queue's default push target, validated like a task's. Tasks of the queue created
    /// without a target (whose kind has no in-process handler) are delivered to it; it is read
    /// at delivery, so a change reaches the tasks already waiting, and removing it leaves them
    /// `ready` for workers. Sundial's own queues (`sundial.*`) take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetSpec>,
    /// At most this many of the queue's tasks run at once, on every node together: in-process
    /// handlers, push deliveries and worker polls alike (absent: no limit). Due tasks over the
    /// limit wait, in due order, and start as running ones finish; a poll takes no more than
    /// the free places. Lowering it stops nothing that runs. Sundial's own queues take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10000)]
    pub concurrency: Option<u32>,
}

/// How long finished tasks of the queue are kept (durations such as `"7d"`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetentionView {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct QueueList {
    pub queues: Vec<QueueView>,
}

fn duration_view(ms: Option<u64>) -> Option<String> {
    ms.map(|ms| WireDuration(Duration::from_millis(ms)).to_string())
}

fn settings_view(s: Option<&QueueSettings>) -> QueueSettingsView {
    let r = s.map(|s| s.config.retention.clone()).unwrap_or_default();
    QueueSettingsView {
        target: s
            .and_then(|s| s.config.target.clone())
            .map(TargetSpec::from_target),
        retention: RetentionView {
            succeeded: duration_view(r.succeeded_ms),
            cancelled: duration_view(r.cancelled_ms),
            dead: duration_view(r.dead_ms),
        },
        concurrency: s.and_then(|s| s.config.concurrency),
    }
}

impl From<QueueInfo> for QueueView {
    fn from(q: QueueInfo) -> Self {
        QueueView {
            paused: q.paused,
            paused_changed_at: q
                .settings
                .as_ref()
                .and_then(|s| s.paused_changed_at)
                .map(time::format),
            counts: q
                .counts
                .iter()
                .map(|(s, n)| (s.as_str().to_string(), *n))
                .collect(),
            oldest_overdue_at: q.oldest_overdue_at.map(time::format),
            lateness: q.lateness.map(|d| WireDuration(d).to_string()),
            lateness_ms: q
                .lateness
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            settings: settings_view(q.settings.as_ref()),
            rate_limited: q.rate_limited,
            queue: q.queue,
        }
    }
}

/// An attempt of a task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AttemptView {
    /// 1 for the first attempt; keeps counting across retries.
    pub seq: u64,
    pub execution_id: Option<Uuid>,
    /// The worker that ran it; `null` for an in-process handler.
    pub worker: Option<String>,
    #[schema(format = DateTime)]
    pub started_at: String,
    #[schema(format = DateTime)]
    pub ended_at: Option<String>,
    /// `succeeded`, `failed`, `lease_expired`, `cancelled`; `null` while it runs.
    pub outcome: Option<String>,
    pub error: Option<String>,
    pub duration_ms: Option<u64>,
    /// The HTTP status the push receiver answered (push attempts that got an answer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// The content type of that answer, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        AttemptView {
            seq: a.seq,
            execution_id: a.execution_id.map(|e| e.0),
            worker: a.worker.clone(),
            started_at: time::format(a.started_at),
            ended_at: a.ended_at.map(time::format),
            outcome: a.outcome.map(|o: AttemptOutcome| o.as_str().to_string()),
            duration_ms: a.duration_ms(),
            error: a.error,
            status_code: a.status_code,
            content_type: a.content_type,
        }
    }
}

/// The kept attempts of a task, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AttemptList {
    pub attempts: Vec<AttemptView>,
    /// Attempts the task has had in all (older ones beyond the kept number are dropped).
    pub total: u64,
}

/// When to run a retried task; an empty body means now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    /// RFC 3339; a time in the past means now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
}

/// Which tasks a bulk action applies to. At least one filter field is required.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// `key:value` tags, all of which must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tag: Vec<String>,
    /// Tasks whose last error's group is this: the first line of `last_error`, cut at 200
    /// characters, exactly as the dead letters group dead tasks. With `state` `dead` and a
    /// `queue` it is one dead-letter group. One line, 1 to 200 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub error_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub created_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub created_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub due_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub due_before: Option<String>,
    /// Only count what would change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// For `tasks:retry`: when the retried tasks are due (default now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
}

/// What a bulk action found and changed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BulkResponse {
    /// Matching tasks the action applies to (live ones for cancel; dead or cancelled for retry).
    pub matched: u64,
    /// Tasks changed (0 for a dry run).
    pub changed: u64,
    pub dry_run: bool,
}

fn parse_time(field: &str, v: Option<&str>) -> Result<Option<Timestamp>, ApiError> {
    v.map(|s| time::parse(s).map_err(|e| ApiError::invalid(field, e)))
        .transpose()
}

/// `key:value` tag filters.
pub fn parse_tags(raw: &[String]) -> Result<Vec<(String, String)>, ApiError> {
    raw.iter()
        .map(|t| match t.split_once(':') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(ApiError::invalid(
                "tag",
                format!("a tag filter is key:value; got {t:?}"),
            )),
        })
        .collect()
}

/// The filter fields shared by `GET /v1/tasks` and the bulk actions.
#[derive(Default)]
pub struct FilterFields<'a> {
    pub queue: Option<String>,
    pub kind: Option<String>,
    pub state: Option<TaskState>,
    pub key: Option<String>,
    pub key_prefix: Option<String>,
    pub tag: &'a [String],
    pub error_group: Option<String>,
    pub due_after: Option<&'a str>,
    pub due_before: Option<&'a str>,
    pub created_after: Option<&'a str>,
    pub created_before: Option<&'a str>,
}

/// The store filter of namespace `ns` for what a request asked: its queue and keys qualified,
/// and only the namespace's tasks.
pub fn task_filter(ns: &Ns, f: FilterFields<'_>) -> Result<TaskFilter, ApiError> {
    if f.key_prefix.as_deref() == Some("") {
        return Err(ApiError::invalid(
            "key_prefix",
            "key_prefix must not be empty",
        ));
    }
    if let Some(g) = &f.error_group {
        check_error_group(g)?;
    }
    Ok(TaskFilter {
        // Without a queue, Sundial's own queues (schedule ticks, workflow steps) are left out:
        // a bulk cancel of "everything scheduled" must not silently stop every schedule.
        exclude_internal: f.queue.is_none(),
        namespace: Some(ns.name().to_string()),
        queue: f.queue.map(|q| ns.given("queue", &q)).transpose()?,
        kind: f.kind,
        state: f.state,
        key: f.key.map(|k| ns.given("key", &k)).transpose()?,
        key_prefix: f
            .key_prefix
            .map(|p| ns.given("key_prefix", &p))
            .transpose()?,
        tags: parse_tags(f.tag)?,
        error_group: f.error_group,
        due_after: parse_time("due_after", f.due_after)?,
        due_before: parse_time("due_before", f.due_before)?,
        created_after: parse_time("created_after", f.created_after)?,
        created_before: parse_time("created_before", f.created_before)?,
        before: None,
    })
}

/// An error group filter can only match what [`sundial_store::error_group`] makes of an error:
/// one line of at most [`sundial_store::ERROR_GROUP_CHARS`] characters. Anything else would
/// silently match nothing, so it is refused.
pub(crate) fn check_error_group(g: &str) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::invalid("error_group", m));
    if g.is_empty() {
        return bad("error_group must not be empty".into());
    }
    if g.contains('\n') {
        return bad(
            "error_group is one line (the first line of a task's last error); it has a line break"
                .into(),
        );
    }
    let chars = g.chars().count();
    if chars > sundial_store::ERROR_GROUP_CHARS {
        return bad(format!(
            "error_group is at most {} characters (a task's last error is grouped by its first \
             {} characters); got {chars}",
            sundial_store::ERROR_GROUP_CHARS,
            sundial_store::ERROR_GROUP_CHARS
        ));
    }
    Ok(())
}

fn state_of(v: StateView) -> TaskState {
    match v {
        StateView::Scheduled => TaskState::Scheduled,
        StateView::Ready => TaskState::Ready,
        StateView::Running => TaskState::Running,
        StateView::Succeeded => TaskState::Succeeded,
        StateView::Dead => TaskState::Dead,
        StateView::Cancelled => TaskState::Cancelled,
    }
}

impl BulkRequest {
    pub(crate) fn filter(&self, ns: &Ns) -> Result<TaskFilter, ApiError> {
        let filter = task_filter(
            ns,
            FilterFields {
                queue: self.queue.clone(),
                kind: self.kind.clone(),
                state: self.state.map(state_of),
                key: None,
                key_prefix: self.key_prefix.clone(),
                tag: &self.tag,
                error_group: self.error_group.clone(),
                due_after: self.due_after.as_deref(),
                due_before: self.due_before.as_deref(),
                created_after: self.created_after.as_deref(),
                created_before: self.created_before.as_deref(),
            },
        )?;
        // Leaving out the internal queues is not a filter the caller chose: a body with no
        // filter is still refused rather than acting on every user task.
        let chosen = TaskFilter {
            exclude_internal: false,
            namespace: None,
            ..filter.clone()
        };
        if chosen == TaskFilter::default() {
            return Err(ApiError::invalid(
                "queue",
                "a bulk action needs at least one filter (queue, kind, state, key_prefix, tag, \
                 error_group, created or due range)",
            ));
        }
        Ok(filter)
    }
}

fn not_found_queue(queue: &str) -> ApiError {
    ApiError::not_found(format!(
        "no such queue: {queue:?} has no tasks and no settings"
    ))
}

/// A worker that polled a queue of this node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerView {
    /// The name the worker polled with (`worker` in the poll body); absent when it gave none.
    pub worker: Option<String>,
    pub queue: String,
    /// When its last poll of the queue began.
    #[schema(format = DateTime)]
    pub last_seen_at: String,
    /// Its polls of the queue since this node started remembering it.
    pub polls: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerList {
    /// The most recent first. Per node and in memory: a worker polling another node is in that
    /// node's list, and a restart forgets; at most 1,000 worker and queue pairs are kept (the
    /// one seen longest ago makes room).
    pub workers: Vec<WorkerView>,
}

/// The workers that polled this node in the last 15 minutes.
#[utoipa::path(
    get, path = "/v1/workers", tag = "queues",
    responses((status = 200, description = "Workers by name and queue, the most recent first", body = WorkerList))
)]
pub async fn list_workers(
    State(st): State<AppState>,
    ns: Ns,
) -> Result<Json<WorkerList>, ApiError> {
    Ok(Json(workers_seen(&st.sundial, &ns)))
}

/// How far back "recently" reaches for the workers seen.
pub const WORKERS_RECENT: Duration = Duration::from_secs(15 * 60);

/// The workers that polled this node within [`WORKERS_RECENT`].
pub fn workers_seen(s: &sundial::Sundial, ns: &Ns) -> WorkerList {
    let since = s.clock().now().0 - WORKERS_RECENT.as_millis() as i64;
    WorkerList {
        workers: s
            .workers_seen(Timestamp(since))
            .into_iter()
            .filter_map(|w| {
                let queue = ns.local(&w.queue)?.to_string();
                Some((w, queue))
            })
            .map(|(w, queue)| WorkerView {
                worker: w.worker,
                queue,
                last_seen_at: time::format(w.last_seen),
                polls: w.polls,
            })
            .collect(),
    }
}

/// A node of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct NodeStatusView {
    pub node: String,
    /// Its last heartbeat; absent when it has left the membership but a lease of its has not
    /// ended yet.
    #[schema(format = DateTime)]
    pub last_heartbeat_at: Option<String>,
    /// Heard from within the shard-lease TTL.
    pub live: bool,
    /// The shards whose lease it holds now.
    pub shards: Vec<u32>,
}

/// The membership and the shard leases, as the store records them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ClusterStatus {
    /// `false` on a single node (which runs every shard; `nodes` is then empty).
    pub clustered: bool,
    /// The node that answered.
    pub node: Option<String>,
    pub shard_count: u32,
    /// Every node with a membership row or a lease not yet ended, by name.
    pub nodes: Vec<NodeStatusView>,
    /// Shards that no node holds now (free, released or expired).
    pub unowned_shards: Vec<u32>,
}

/// The nodes sharing the store, their last heartbeats and the shards each holds.
#[utoipa::path(
    get, path = "/v1/cluster", tag = "queues",
    responses((status = 200, description = "The cluster's nodes and shards (`clustered: false` on a single node)", body = ClusterStatus))
)]
pub async fn cluster_status(State(st): State<AppState>) -> Result<Json<ClusterStatus>, ApiError> {
    Ok(Json(cluster_of(&st.sundial).await?))
}

/// [`ClusterStatus`] of `s` (one read of the membership and lease tables on several nodes).
pub async fn cluster_of(s: &sundial::Sundial) -> Result<ClusterStatus, ApiError> {
    Ok(match s.cluster_view().await? {
        None => ClusterStatus {
            clustered: false,
            node: None,
            shard_count: s.config().shard_count,
            nodes: Vec::new(),
            unowned_shards: Vec::new(),
        },
        Some(v) => ClusterStatus {
            clustered: true,
            node: Some(v.node),
            shard_count: v.shard_count,
            nodes: v
                .nodes
                .into_iter()
                .map(|n| NodeStatusView {
                    node: n.node,
                    last_heartbeat_at: n.last_seen.map(time::format),
                    live: n.live,
                    shards: n.shards,
                })
                .collect(),
            unowned_shards: v.unowned,
        },
    })
}

/// List every queue.
#[utoipa::path(
    get, path = "/v1/queues", tag = "queues",
    responses((status = 200, description = "Every queue that has tasks or settings", body = QueueList))
)]
pub async fn list_queues(State(st): State<AppState>, ns: Ns) -> Result<Json<QueueList>, ApiError> {
    let queues = st.sundial.queues().await?;
    Ok(Json(QueueList {
        queues: queues
            .into_iter()
            .filter_map(|q| own_queue(&ns, q))
            .map(QueueView::from)
            .collect(),
    }))
}

/// A queue as namespace `ns` sees it; `None` when it is another namespace's.
fn own_queue(ns: &Ns, mut q: QueueInfo) -> Option<QueueInfo> {
    q.queue = ns.local(&q.queue)?.to_string();
    Some(q)
}

/// One queue.
#[utoipa::path(
    get, path = "/v1/queues/{queue}", tag = "queues",
    params(("queue" = String, Path, description = "Queue name")),
    responses(
        (status = 200, description = "The queue", body = QueueView),
        (status = 404, description = "No tasks and no settings", body = ErrorBody),
    )
)]
pub async fn get_queue(
    State(st): State<AppState>,
    ns: Ns,
    Path(queue): Path<String>,
) -> Result<Json<QueueView>, ApiError> {
    queue_view(&st, &ns, &queue).await
}

async fn queue_view(st: &AppState, ns: &Ns, queue: &str) -> Result<Json<QueueView>, ApiError> {
    let q = st
        .sundial
        .queue(&ns.given("queue", queue)?)
        .await?
        .and_then(|q| own_queue(ns, q))
        .ok_or_else(|| not_found_queue(queue))?;
    Ok(Json(q.into()))
}

pub(crate) fn retention_ms(field: &str, v: Option<&str>) -> Result<Option<u64>, ApiError> {
    v.map(|s| {
        duration::parse(s)
            .map_err(|e| ApiError::invalid(field, e.to_string()))
            .and_then(|d| {
                if d < Duration::from_secs(1) {
                    Err(ApiError::invalid(field, "a retention is at least 1s"))
                } else {
                    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                }
            })
    })
    .transpose()
}

/// Set a queue's settings: retention overrides per finished state (absent: the server's
/// defaults), a default push target and a concurrency limit (cluster-wide). The whole settings
/// object is replaced; the pause state is not part of it.
#[utoipa::path(
    put, path = "/v1/queues/{queue}", tag = "queues",
    params(("queue" = String, Path, description = "Queue name")),
    request_body = QueueSettingsView,
    responses(
        (status = 200, description = "The queue with its new settings", body = QueueView),
        (status = 422, description = "Invalid name or setting", body = ErrorBody),
    )
)]
pub async fn put_queue(
    State(st): State<AppState>,
    ns: Ns,
    Path(queue): Path<String>,
    ApiJson(body): ApiJson<QueueSettingsView>,
) -> Result<Json<QueueView>, ApiError> {
    let r = &body.retention;
    // A target or a limit is checked by the kernel, and its error names its own field.
    let own_fields_checked = body.target.is_some() || body.concurrency.is_some();
    let config = QueueConfig {
        retention: RetentionOverride {
            succeeded_ms: retention_ms("retention.succeeded", r.succeeded.as_deref())?,
            cancelled_ms: retention_ms("retention.cancelled", r.cancelled.as_deref())?,
            dead_ms: retention_ms("retention.dead", r.dead.as_deref())?,
        },
        target: body.target.map(TargetSpec::into_target).transpose()?,
        concurrency: body.concurrency,
    };
    st.sundial
        .configure_queue(&ns.given("queue", &queue)?, config)
        .await
        .map_err(|e| match e {
            e @ sundial::Error::Invalid(_) if own_fields_checked => ApiError::from(e),
            e => ApiError::from(e).with_field("queue"),
        })?;
    queue_view(&st, &ns, &queue).await
}

/// Pause a queue: no task of it starts (in-process or worker) until it is resumed; creates are
/// still accepted and due tasks wait, visible as due. Durable; holds on every node.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/pause", tag = "queues",
    params(("queue" = String, Path, description = "Queue name")),
    responses(
        (status = 200, description = "Paused", body = QueueView),
        (status = 422, description = "Invalid queue name", body = ErrorBody),
    )
)]
pub async fn pause_queue(
    State(st): State<AppState>,
    ns: Ns,
    Path(queue): Path<String>,
) -> Result<Json<QueueView>, ApiError> {
    st.sundial
        .pause_queue(&ns.given("queue", &queue)?)
        .await
        .map_err(|e| ApiError::from(e).with_field("queue"))?;
    queue_view(&st, &ns, &queue).await
}

/// Resume a paused queue: its waiting tasks start in due order.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/resume", tag = "queues",
    params(("queue" = String, Path, description = "Queue name")),
    responses(
        (status = 200, description = "Resumed", body = QueueView),
        (status = 422, description = "Invalid queue name", body = ErrorBody),
    )
)]
pub async fn resume_queue(
    State(st): State<AppState>,
    ns: Ns,
    Path(queue): Path<String>,
) -> Result<Json<QueueView>, ApiError> {
    st.sundial
        .resume_queue(&ns.given("queue", &queue)?)
        .await
        .map_err(|e| ApiError::from(e).with_field("queue"))?;
    queue_view(&st, &ns, &queue).await
}

fn parse_id(raw: &str) -> Result<TaskId, ApiError> {
    raw.parse::<TaskId>()
        .map_err(|_| ApiError::not_found(format!("no such task: {raw:?} is not a task id")))
}

/// A task's attempts, oldest first: start, worker, end, outcome, error, duration.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/attempts", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The kept attempts and the total", body = AttemptList),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
pub async fn task_attempts(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let id = parse_id(&id)?;
    crate::api::owned_task(&st, &ns, id).await?;
    let h = st.sundial.attempts(id).await?;
    Ok(Json(AttemptList {
        attempts: h.attempts.into_iter().map(AttemptView::from).collect(),
        total: h.total,
    }))
}

/// Retry a dead or cancelled task: `scheduled` again (now, or at `run_at`), attempts starting
/// over; it keeps its id and attempt history. The body is optional.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/retry", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    request_body(content = RetryRequest, description = "Optional"),
    responses(
        (status = 200, description = "Scheduled again", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is live (`state`), or its key is held by a live task (`existing_id`)", body = ErrorBody),
        (status = 422, description = "Invalid run_at", body = ErrorBody),
    )
)]
pub async fn retry_task(
    State(st): State<AppState>,
    ns: Ns,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<TaskView>, ApiError> {
    let id = parse_id(&id)?;
    crate::api::owned_task(&st, &ns, id).await?;
    let req: RetryRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RetryRequest::default()
    } else {
        parse_json(&body)?
    };
    let run_at = parse_time("run_at", req.run_at.as_deref())?;
    let task = st.sundial.retry(id, run_at).await?;
    Ok(Json(crate::api::view(&ns, task)?))
}

/// Cancel every live task matching the filter, in bounded batches. `dry_run` only counts.
#[utoipa::path(
    post, path = "/v1/tasks:cancel", tag = "tasks",
    request_body = BulkRequest,
    responses(
        (status = 200, description = "How many matched and changed", body = BulkResponse),
        (status = 422, description = "No filter, or an invalid one", body = ErrorBody),
    )
)]
pub async fn cancel_matching(
    State(st): State<AppState>,
    ns: Ns,
    ApiJson(body): ApiJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    if body.run_at.is_some() {
        return Err(ApiError::invalid(
            "run_at",
            "run_at applies to tasks:retry only",
        ));
    }
    let filter = body.filter(&ns)?;
    let dry_run = body.dry_run.unwrap_or(false);
    let out = st.sundial.cancel_matching(filter, dry_run).await?;
    Ok(Json(BulkResponse {
        matched: out.matched,
        changed: out.changed,
        dry_run,
    }))
}

/// Retry every dead or cancelled task matching the filter (now, or at `run_at`), in bounded
/// batches. Tasks whose key a live task holds are left alone. `dry_run` only counts.
#[utoipa::path(
    post, path = "/v1/tasks:retry", tag = "tasks",
    request_body = BulkRequest,
    responses(
        (status = 200, description = "How many matched and changed", body = BulkResponse),
        (status = 422, description = "No filter, or an invalid one", body = ErrorBody),
    )
)]
pub async fn retry_matching(
    State(st): State<AppState>,
    ns: Ns,
    ApiJson(body): ApiJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    let filter = body.filter(&ns)?;
    let run_at = parse_time("run_at", body.run_at.as_deref())?;
    let dry_run = body.dry_run.unwrap_or(false);
    let out = st.sundial.retry_matching(filter, run_at, dry_run).await?;
    Ok(Json(BulkResponse {
        matched: out.matched,
        changed: out.changed,
        dry_run,
    }))
}
