//! Wire types of the v1 API: what requests carry and responses return.
//!
//! Requests refuse unknown fields (`deny_unknown_fields`): a misspelt `delya` is a `422`, never a
//! task that silently runs now. Responses are open for extension: clients (including this crate's
//! own CLI) ignore fields they do not know. Durations are strings (`"30s"`, see
//! [`crate::duration`]); times are RFC 3339 strings (see [`crate::time`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sundial::{Backoff, ExclusiveMode, Priority, PushMethod, Target, Task, TaskSpec, TaskState};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::duration::{self, WireDuration};
use crate::error::ApiError;
use crate::time;

/// A task to create. Neither `run_at` nor `delay` means now; giving both is an error.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// Queue name (default `"default"`): letters, digits and `. _ : / -`, at most 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// What the task is, for handlers and workers (same characters as a queue name).
    pub kind: String,
    /// Business key: at most one live (not finished) task per queue and key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Idempotency key (single creates only; at most 256 bytes): a retry with the same key and
    /// body answers `200` with the task the first request created, for as long as that task is
    /// live and for the server's idempotency window (default 24 h) after it finished; the same
    /// key with another body answers `409 idempotency_conflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Revision of the intent under `idempotency_key` (default 0): the same version is a repeat;
    /// a higher one is accepted as a new task; a lower one is a conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_version: Option<u64>,
    /// Any JSON value (default `null`), at most 256 KiB serialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// When the task is due, RFC 3339 with an offset. A time in the past means now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime, example = "2030-01-02T03:04:05Z")]
    pub run_at: Option<String>,
    /// Due after this delay from now: `"1500ms"`, `"30s"`, `"5m"`, `"3d"`, `"1h30m"`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    #[schema(example = "30s")]
    pub delay: Option<String>,
    /// Attempts including the first (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Delay between attempts (default: 5 s × 5 per attempt, capped at 1 h, 20 % jitter).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub backoff: Option<BackoffSpec>,
    /// Time limit of one attempt, and a worker's lease (default `"5m"`; 1 ms to 7 days).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    #[schema(example = "5m")]
    pub timeout: Option<String>,
    /// Mutual exclusion: at most one running task per exclusive key.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub exclusive: Option<ExclusiveSpec>,
    /// A group limit: at most `limit` tasks with this `key` run at once, across queues and
    /// nodes; a task over the limit waits (scheduled) and starts as others finish. `exclusive` is
    /// the case `limit: 1`; a task takes one or the other.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub concurrency: Option<ConcurrencySpec>,
    /// A rate limit: at most `limit` starts per `per` for the tasks with this rate `key` (across
    /// queues and nodes), or for this queue's rate-limited tasks when `key` is left out; starts
    /// are spaced evenly (`per / limit` apart), never a burst of the period's allowance. A task
    /// over the limit waits (scheduled) for its turn; a worker queue's task becomes ready at its
    /// turn and a worker's poll takes it only at the key's next take turn, so workers that come
    /// back to a pile of ready tasks still start them one interval apart.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub rate: Option<RateSpec>,
    /// String tags for search (`GET /v1/tasks?tag=key:value`): at most 16, keys and values
    /// checked like `key`; a tag key may not contain `:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// Deliver by an HTTP call at the due time instead of a worker or handler: Sundial calls the
    /// URL with the payload as the JSON body, signed (Standard Webhooks), and retries it with
    /// the backoff.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub target: Option<TargetSpec>,
    /// 0 to 9 (default 5; 9 the most urgent). Among tasks due together, higher priority starts
    /// first; a task is served as if due `(priority - 5)` minutes earlier, so urgent work due
    /// more than nine minutes after a task no longer passes it. Never makes a task start early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 9, example = 7)]
    pub priority: Option<u8>,
    /// Admit at most one task per queue and throttle `key` per `per`, measured from the admitted
    /// task's create: a create inside that period stores nothing and answers `200` with the
    /// admitted task, whatever its body. Single creates only (`POST /v1/tasks`); not with
    /// `idempotency_key`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub throttle: Option<ThrottleSpec>,
    /// Keep at most one pending task per queue and debounce `key`: while a task of the key is
    /// scheduled and not yet started, a create stores nothing and replaces that task's payload
    /// and due time (due `delay` from now, but never later than `max_wait` after the pending
    /// task's create) and answers `200` with it; otherwise the task is stored, due `delay` from
    /// now (`201`). Single creates only; not with `run_at`, `delay`, `throttle` or
    /// `idempotency_key`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::extract::opt_object_only"
    )]
    pub debounce: Option<DebounceSpec>,
}

/// A debounce on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebounceSpec {
    /// What is debounced: checked like `key` (a document, a user's pending notification).
    #[schema(example = "reindex:doc-42")]
    pub key: String,
    /// How long after the latest create the task is due, 0 to 366 days: `"30s"`, `"5m"`.
    #[serde(deserialize_with = "crate::duration::required")]
    #[schema(example = "30s")]
    pub delay: String,
    /// The longest a pending task is put off, from its first create: at least `delay`, at most
    /// 366 days (default: no bound).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    #[schema(example = "5m")]
    pub max_wait: Option<String>,
}

impl DebounceSpec {
    /// The library's debounce.
    pub fn into_debounce(self) -> Result<sundial::Debounce, ApiError> {
        let mut d =
            sundial::Debounce::new(self.key, parse_duration("debounce.delay", &self.delay)?);
        if let Some(w) = self.max_wait {
            d = d.max_wait(parse_duration("debounce.max_wait", &w)?);
        }
        Ok(d)
    }
}

/// A throttle on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ThrottleSpec {
    /// What is throttled: checked like `key` (an account, a recipient, an event).
    #[schema(example = "digest:user-42")]
    pub key: String,
    /// The period, 1 ms to 366 days: `"1h"`, `"10m"`.
    #[serde(deserialize_with = "crate::duration::required")]
    #[schema(example = "1h")]
    pub per: String,
}

impl ThrottleSpec {
    /// The library's throttle.
    pub fn into_throttle(self) -> Result<sundial::Throttle, ApiError> {
        Ok(sundial::Throttle::new(
            self.key,
            parse_duration("throttle.per", &self.per)?,
        ))
    }
}

/// A push target on the wire.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// `http` or `https` URL without credentials. Private, loopback and link-local addresses
    /// are refused at delivery unless the server allows them (`--push-allow`).
    #[schema(example = "https://example.com/hooks/reminder")]
    pub url: String,
    /// `POST` (default), `PUT`, `PATCH`, `DELETE` or `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Extra request headers (the signature, content and connection headers are Sundial's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Time limit of one call (default `"30s"`, at most the task's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "10s")]
    pub timeout: Option<String>,
    /// 4xx statuses (other than 410 and 429) to retry instead of ending the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_statuses: Option<Vec<u16>>,
}

impl TargetSpec {
    pub fn into_target(self) -> Result<Target, ApiError> {
        let mut t = Target::new(self.url);
        if let Some(m) = self.method {
            t = t.method(match m.to_ascii_uppercase().as_str() {
                "POST" => PushMethod::Post,
                "PUT" => PushMethod::Put,
                "PATCH" => PushMethod::Patch,
                "DELETE" => PushMethod::Delete,
                "GET" => PushMethod::Get,
                _ => {
                    return Err(ApiError::invalid(
                        "target.method",
                        format!("method {m:?} is not one of POST, PUT, PATCH, DELETE, GET"),
                    ));
                }
            });
        }
        if let Some(h) = self.headers {
            t.headers = h;
        }
        if let Some(d) = self.timeout {
            t = t.timeout(parse_duration("target.timeout", &d)?);
        }
        if let Some(s) = self.retry_statuses {
            t = t.retry_statuses(s);
        }
        Ok(t)
    }

    pub fn from_target(t: Target) -> Self {
        TargetSpec {
            url: t.url,
            method: Some(t.method.as_str().to_string()),
            headers: (!t.headers.is_empty()).then_some(t.headers),
            timeout: t
                .timeout_ms
                .map(|ms| WireDuration(Duration::from_millis(ms)).to_string()),
            retry_statuses: (!t.retry_statuses.is_empty()).then_some(t.retry_statuses),
        }
    }
}

/// Retry backoff; omitted fields take their defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackoffSpec {
    /// Delay after the first failed attempt (default `"5s"`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub initial: Option<String>,
    /// Growth per attempt, 1 to 100 (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// Longest delay (default `"1h"`): not below `initial`, at most ten years.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub max: Option<String>,
    /// Fraction of each delay randomised away, 0 to 1 (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExclusiveSpec {
    pub key: String,
    /// `wait` (default): start once the holder finishes; `skip`: end `cancelled` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ExclusiveModeView>,
}

/// A group limit on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// The group: checked like `key` (a tenant, an endpoint, an account).
    #[schema(example = "tenant:acme")]
    pub key: String,
    /// How many of the group's tasks may run at once, 1 to 10,000.
    #[schema(minimum = 1, maximum = 10000, example = 5)]
    pub limit: u32,
}

/// A rate limit on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    /// What is limited, checked like `key` (an API, a customer); left out: the task's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "smtp:mailgun")]
    pub key: Option<String>,
    /// Starts per `per`, 1 to 10,000, and at most one per millisecond of `per`.
    #[schema(minimum = 1, maximum = 10000, example = 100)]
    pub limit: u32,
    /// The period, 1 ms to 366 days: `"1s"`, `"1m"`, `"1h"`.
    #[serde(deserialize_with = "crate::duration::required")]
    #[schema(example = "1m")]
    pub per: String,
}

impl RateSpec {
    fn from_rate(r: sundial::RateLimit) -> Self {
        RateSpec {
            key: r.key,
            limit: r.limit,
            per: WireDuration(Duration::from_millis(r.per_ms)).to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExclusiveModeView {
    Wait,
    Skip,
}

fn parse_duration(field: &str, s: &str) -> Result<Duration, ApiError> {
    duration::parse(s).map_err(|e| ApiError::invalid(field, e.to_string()))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl CreateTask {
    /// A task of `kind` with every other field left to its default.
    pub fn new(kind: impl Into<String>) -> Self {
        CreateTask {
            kind: kind.into(),
            ..CreateTask::default()
        }
    }

    /// Turns the wire form into a library spec. Field rules that the library checks (names, key
    /// characters, limits) are left to it; this checks what only the wire has (duration and time
    /// syntax, `run_at` with `delay`).
    pub fn into_spec(self) -> Result<TaskSpec, ApiError> {
        let mut spec = TaskSpec::new(self.kind);
        if let Some(q) = self.queue {
            spec = spec.queue(q);
        }
        if let Some(k) = self.key {
            spec = spec.key(k);
        }
        if let Some(p) = self.payload {
            spec = spec.payload(p);
        }
        match (self.run_at, self.delay) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "delay",
                    "give either run_at or delay, not both",
                ));
            }
            (Some(at), None) => {
                let t = time::parse(&at).map_err(|e| ApiError::invalid("run_at", e))?;
                spec = spec.run_at(t);
            }
            (None, Some(d)) => spec = spec.delay(parse_duration("delay", &d)?),
            (None, None) => {}
        }
        if let Some(n) = self.max_attempts {
            spec = spec.max_attempts(n);
        }
        if let Some(b) = self.backoff {
            let mut backoff = Backoff::default();
            if let Some(i) = b.initial {
                backoff.initial_ms = ms(parse_duration("backoff.initial", &i)?);
                // A short initial delay with the default cap still makes sense; a long one must
                // not be refused only because the default cap is smaller.
                backoff.max_ms = backoff.max_ms.max(backoff.initial_ms);
            }
            if let Some(f) = b.factor {
                backoff.factor = f;
            }
            if let Some(m) = b.max {
                backoff.max_ms = ms(parse_duration("backoff.max", &m)?);
            }
            if let Some(j) = b.jitter {
                backoff.jitter = j;
            }
            spec = spec.backoff(backoff);
        }
        if let Some(t) = self.timeout {
            spec = spec.timeout(parse_duration("timeout", &t)?);
        }
        if let Some(ex) = self.exclusive {
            let mode = match ex.mode.unwrap_or(ExclusiveModeView::Wait) {
                ExclusiveModeView::Wait => ExclusiveMode::Wait,
                ExclusiveModeView::Skip => ExclusiveMode::Skip,
            };
            spec = spec.exclusive(ex.key, mode);
        }
        if let Some(c) = self.concurrency {
            if spec.exclusive.is_some() {
                return Err(ApiError::invalid(
                    "concurrency",
                    "give either exclusive or concurrency, not both (exclusive is a limit of 1)",
                ));
            }
            spec = spec.concurrency(c.key, c.limit);
        }
        if let Some(r) = self.rate {
            spec = spec.rate(r.key, r.limit, parse_duration("rate.per", &r.per)?);
        }
        if let Some(tags) = self.tags {
            spec = spec.tags(tags);
        }
        if let Some(t) = self.target {
            spec = spec.target(t.into_target()?);
        }
        if let Some(p) = self.priority {
            spec = spec.priority(
                Priority::new(p).map_err(|e| ApiError::invalid("priority", e.to_string()))?,
            );
        }
        Ok(spec)
    }
}

/// Many tasks, stored in one transaction.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub tasks: Vec<CreateTask>,
}

/// One result per item of a batch, in order.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BatchResponse {
    pub results: Vec<BatchItem>,
}

/// `created` with the new task's id, state and due time (the rest is what the request said; `GET`
/// it for everything), or `duplicate` with the live task that holds the key (nothing stored for
/// that item).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BatchItem {
    Created {
        id: Uuid,
        state: StateView,
        #[schema(format = DateTime)]
        run_at: String,
    },
    Duplicate {
        existing_id: Uuid,
    },
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StateView {
    Scheduled,
    Ready,
    Running,
    Succeeded,
    Dead,
    Cancelled,
}

impl From<TaskState> for StateView {
    fn from(s: TaskState) -> Self {
        match s {
            TaskState::Scheduled => StateView::Scheduled,
            TaskState::Ready => StateView::Ready,
            TaskState::Running => StateView::Running,
            TaskState::Succeeded => StateView::Succeeded,
            TaskState::Dead => StateView::Dead,
            TaskState::Cancelled => StateView::Cancelled,
        }
    }
}

impl StateView {
    pub fn as_str(&self) -> &'static str {
        match self {
            StateView::Scheduled => "scheduled",
            StateView::Ready => "ready",
            StateView::Running => "running",
            StateView::Succeeded => "succeeded",
            StateView::Dead => "dead",
            StateView::Cancelled => "cancelled",
        }
    }
}

/// The backoff a task retries with.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct BackoffView {
    pub initial: String,
    pub factor: f64,
    pub max: String,
    pub jitter: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ExclusiveView {
    pub key: String,
    pub mode: ExclusiveModeView,
}

/// A task as stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TaskView {
    pub id: Uuid,
    pub queue: String,
    pub kind: String,
    pub key: Option<String>,
    pub payload: serde_json::Value,
    pub state: StateView,
    /// When the task is (or was last) due.
    #[schema(format = DateTime)]
    pub run_at: String,
    /// Attempts started so far.
    pub attempt: u32,
    pub max_attempts: u32,
    pub backoff: BackoffView,
    pub timeout: String,
    /// Its exclusive key (a group limit of 1).
    pub exclusive: Option<ExclusiveView>,
    /// Its group limit, when above 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,
    /// Its rate limit (see `CreateTask.rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateSpec>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// 0 to 9, 9 the most urgent (see `CreateTask.priority`).
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// The HTTP call that delivers it, for a push task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetSpec>,
    /// The W3C trace context it carries (from the request that created it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// The current (or last) attempt's execution id.
    pub execution_id: Option<Uuid>,
    #[schema(format = DateTime)]
    pub lease_expires_at: Option<String>,
    /// The worker that took the current (or last) attempt.
    pub worker: Option<String>,
    pub last_error: Option<String>,
    pub result: Option<serde_json::Value>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
}

fn default_priority() -> u8 {
    Priority::DEFAULT.get()
}

impl From<Task> for TaskView {
    fn from(t: Task) -> Self {
        let backoff = BackoffView {
            initial: WireDuration(Duration::from_millis(t.backoff.initial_ms)).to_string(),
            factor: t.backoff.factor,
            max: WireDuration(Duration::from_millis(t.backoff.max_ms)).to_string(),
            jitter: t.backoff.jitter,
        };
        let timeout = WireDuration(t.timeout()).to_string();
        TaskView {
            id: t.id.0,
            queue: t.queue,
            kind: t.kind,
            key: t.key,
            payload: t.payload,
            state: t.state.into(),
            run_at: time::format(t.due_at),
            attempt: t.attempt,
            max_attempts: t.max_attempts,
            backoff,
            timeout,
            concurrency: t
                .exclusive
                .as_ref()
                .filter(|e| e.limit > 1)
                .map(|e| ConcurrencySpec {
                    key: e.key.clone(),
                    limit: e.limit,
                }),
            rate: t.rate.map(RateSpec::from_rate),
            exclusive: t.exclusive.filter(|e| e.limit == 1).map(|e| ExclusiveView {
                key: e.key,
                mode: match e.mode {
                    ExclusiveMode::Wait => ExclusiveModeView::Wait,
                    ExclusiveMode::Skip => ExclusiveModeView::Skip,
                },
            }),
            tags: t.tags,
            priority: t.priority.get(),
            target: t.target.map(TargetSpec::from_target),
            traceparent: t.trace.as_ref().map(|c| c.traceparent().to_string()),
            tracestate: t
                .trace
                .as_ref()
                .and_then(|c| c.tracestate())
                .map(str::to_string),
            execution_id: t.execution_id.map(|e| e.0),
            lease_expires_at: t.lease_expires_at.map(time::format),
            worker: t.worker,
            last_error: t.last_error,
            result: t.result,
            created_at: time::format(t.created_at),
            updated_at: time::format(t.updated_at),
            started_at: t.started_at.map(time::format),
            finished_at: t.finished_at.map(time::format),
        }
    }
}

/// Filters and paging for `GET /v1/tasks`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams, PartialEq)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this queue (Sundial's own `sundial.…` queues included when named).
    pub queue: Option<String>,
    pub kind: Option<String>,
    /// `scheduled`, `ready`, `running`, `succeeded`, `dead` or `cancelled`.
    pub state: Option<String>,
    pub key: Option<String>,
    /// Keys starting with this.
    pub key_prefix: Option<String>,
    /// `key:value`; repeat for several (all must match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tag: Vec<String>,
    /// Tasks whose last error's group is this: the first line of `last_error`, cut at 200
    /// characters, as the dead letters group dead tasks. With `state=dead` and `queue` it is one
    /// dead-letter group. One line, 1 to 200 characters.
    #[param(min_length = 1, max_length = 200)]
    pub error_group: Option<String>,
    /// Due at or after this time (RFC 3339).
    pub due_after: Option<String>,
    /// Due before this time (RFC 3339).
    pub due_before: Option<String>,
    /// Created at or after this time (RFC 3339).
    pub created_after: Option<String>,
    /// Created before this time (RFC 3339).
    pub created_before: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Without `queue`: also list the tasks of Sundial's own queues (`sundial.schedules`,
    /// `sundial.workflows`, `sundial.activities`, …). Default `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal: Option<bool>,
}

/// A page of tasks, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TaskList {
    pub tasks: Vec<TaskView>,
    /// Pass as `cursor` for the next page; `null` on the last page. A page that stopped at its
    /// bound of visited candidates has one even with fewer than `limit` tasks, or none.
    pub next_cursor: Option<String>,
}

/// A worker asks for tasks of a queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PollRequest {
    /// The worker's name, recorded on the tasks it takes.
    pub worker: String,
    /// Most tasks to take (default 1; larger values are capped by the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// How long to hold the request open when nothing is ready (default `"30s"`; capped by the
    /// server's `--max-poll-wait`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::duration::opt"
    )]
    pub wait: Option<String>,
    /// Only tasks of these kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<String>>,
    /// The worker's previous task, succeeded: recorded first (as `POST /v1/tasks/{id}/complete`),
    /// and the poll's first claim commits with it. When the completion is refused, the request
    /// answers with that refusal and polls nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<PollCompletion>,
}

/// A completion carried by a poll (`PollRequest::complete`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PollCompletion {
    /// The task that succeeded.
    pub task_id: Uuid,
    pub execution_id: Uuid,
    /// Any JSON value, kept on the task (at most 256 KiB serialised).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// Tasks handed to a worker; empty when nothing became ready during the wait.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PollResponse {
    pub tasks: Vec<PolledTask>,
    /// The task the request's `complete` recorded as succeeded (only with `complete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<TaskView>,
}

/// A task a worker now runs. Every later call about it must present `execution_id`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PolledTask {
    pub id: Uuid,
    pub queue: String,
    pub kind: String,
    pub key: Option<String>,
    pub payload: serde_json::Value,
    /// This attempt's number, from 1.
    pub attempt: u32,
    pub max_attempts: u32,
    pub execution_id: Uuid,
    /// Heartbeat before this, or the task goes back to `scheduled`.
    #[schema(format = DateTime)]
    pub lease_expires_at: String,
    #[schema(format = DateTime)]
    pub run_at: String,
    /// The attempt's time limit; a heartbeat extends the lease by this much.
    pub timeout: String,
    /// The W3C trace context to run the attempt in, for a task created with one (the context of
    /// its delivery to this worker): send it as the `traceparent` of the worker's own span and
    /// of the complete or fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl PolledTask {
    /// The worker's view of a task it now runs (`None` if the task holds no attempt).
    pub fn from_task(t: Task) -> Option<Self> {
        let timeout = WireDuration(t.timeout()).to_string();
        Some(PolledTask {
            id: t.id.0,
            queue: t.queue,
            kind: t.kind,
            key: t.key,
            payload: t.payload,
            attempt: t.attempt,
            max_attempts: t.max_attempts,
            execution_id: t.execution_id?.0,
            lease_expires_at: time::format(t.lease_expires_at?),
            run_at: time::format(t.due_at),
            timeout,
            traceparent: t.trace.as_ref().map(|c| c.traceparent().to_string()),
            tracestate: t
                .trace
                .as_ref()
                .and_then(|c| c.tracestate())
                .map(str::to_string),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    pub execution_id: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    pub execution_id: Uuid,
    /// Any JSON value, kept on the task (at most 256 KiB serialised).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub execution_id: Uuid,
    /// Why the attempt failed; kept in `last_error` (longer than 16 KiB is cut, keeping the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `false` sends the task to `dead` now; default `true` (retry while attempts remain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Health {
    /// `ok`, or `degraded` when something keeps the store's writes from succeeding.
    pub status: String,
    /// What is wrong, when `degraded` (for example `disk full: …`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sundial::{Due, Timestamp};

    #[test]
    fn defaults_leave_the_library_defaults() {
        let spec = CreateTask::new("k").into_spec().unwrap();
        assert_eq!(spec, TaskSpec::new("k"));
    }

    #[test]
    fn maps_every_field() {
        let wire: CreateTask = serde_json::from_value(serde_json::json!({
            "queue": "q", "kind": "k", "key": "a b", "payload": {"x": 1},
            "delay": "1m30s", "max_attempts": 3,
            "backoff": {"initial": "100ms", "factor": 2.0, "max": "1s", "jitter": 0.0},
            "timeout": "10s", "exclusive": {"key": "lock", "mode": "skip"}, "priority": 8
        }))
        .unwrap();
        let spec = wire.into_spec().unwrap();
        assert_eq!(spec.queue, "q");
        assert_eq!(spec.key.as_deref(), Some("a b"));
        assert_eq!(spec.payload, serde_json::json!({"x": 1}));
        assert_eq!(spec.due, Due::After(Duration::from_secs(90)));
        assert_eq!(spec.max_attempts, 3);
        assert_eq!(spec.backoff.initial_ms, 100);
        assert_eq!(spec.backoff.max_ms, 1_000);
        assert_eq!(spec.timeout, Duration::from_secs(10));
        assert_eq!(
            spec.exclusive.map(|e| (e.key, e.mode)),
            Some(("lock".to_string(), ExclusiveMode::Skip))
        );
        assert_eq!(spec.priority, Priority::new(8).unwrap());
    }

    #[test]
    fn a_priority_above_nine_is_refused_naming_the_field() {
        let mut w = CreateTask::new("k");
        w.priority = Some(10);
        let e = w.into_spec().unwrap_err();
        assert_eq!(e.status.as_u16(), 422);
        assert_eq!(e.detail.field.as_deref(), Some("priority"));
    }

    #[test]
    fn run_at_and_delay_conflict() {
        let mut w = CreateTask::new("k");
        w.run_at = Some("2030-01-01T00:00:00Z".into());
        assert_eq!(
            w.clone().into_spec().unwrap().due,
            Due::At(Timestamp::from_millis(1_893_456_000_000))
        );
        w.delay = Some("1s".into());
        let e = w.into_spec().unwrap_err();
        assert_eq!(e.status.as_u16(), 422);
    }

    #[test]
    fn bad_durations_name_the_field() {
        let mut w = CreateTask::new("k");
        w.delay = Some("-5s".into());
        assert_eq!(
            w.into_spec().unwrap_err().detail.field.as_deref(),
            Some("delay")
        );
        let mut w = CreateTask::new("k");
        w.backoff = Some(BackoffSpec {
            max: Some("soon".into()),
            ..BackoffSpec::default()
        });
        assert_eq!(
            w.into_spec().unwrap_err().detail.field.as_deref(),
            Some("backoff.max")
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<CreateTask>(r#"{"kind":"k","delya":"5s"}"#).is_err());
        assert!(
            serde_json::from_str::<CreateTask>(r#"{"kind":"k","backoff":{"inital":"1s"}}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<PollRequest>(r#"{"worker":"w","wiat":"1s"}"#).is_err());
    }
}
