//! The task model: a task's fields, its states and the legal moves between them, the specification
//! a caller hands in, and the validation that turns a specification into a row ready to store.
//!
//! ```text
//!              trigger (due = now)
//!               ┌──────┐
//!               ▼      │
//!  create ─▶ scheduled ─┴─▶ ready ─▶ running ─▶ succeeded
//!               ▲  ▲                  │  │
//!               │  └── fail (retry) ──┘  └──▶ dead (attempts exhausted / not retryable)
//!               └───── lease expired ────┘
//!  scheduled | ready | running ─▶ cancelled
//! ```
//!
//! A due task goes `scheduled → running` directly when an in-process handler takes it, and
//! `scheduled → ready` when it waits for a worker. `succeeded`, `dead` and `cancelled` are terminal:
//! nothing moves a task out of them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::namespace;
use crate::{
    Backoff, ExecutionId, Priority, Target, TaskId, Timestamp, TraceContext, ValidationError,
};

/// Queues whose name starts with this are Sundial's own (schedule ticks `sundial.schedules`,
/// workflow tasks `sundial.workflows`, activities `sundial.activities`, timers, child starts):
/// listings and metrics leave them out unless asked.
pub const INTERNAL_QUEUE_PREFIX: &str = "sundial.";

/// Whether `queue` is one of Sundial's own (see [`INTERNAL_QUEUE_PREFIX`]).
pub fn is_internal_queue(queue: &str) -> bool {
    queue.starts_with(INTERNAL_QUEUE_PREFIX)
}

/// Where a task is in its life. Ordered as listed (life order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for its due time.
    Scheduled,
    /// Due, waiting for a worker to take it.
    Ready,
    /// An attempt is under way (it holds a lease and an execution id).
    Running,
    /// An attempt finished successfully. Terminal.
    Succeeded,
    /// The last attempt failed (or a failure was not retryable). Terminal; kept for inspection.
    Dead,
    /// Cancelled before it finished. Terminal.
    Cancelled,
}

impl TaskState {
    pub const ALL: [TaskState; 6] = [
        TaskState::Scheduled,
        TaskState::Ready,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Dead,
        TaskState::Cancelled,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Ready => "ready",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
        }
    }

    /// Terminal states never change again.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Dead | TaskState::Cancelled
        )
    }

    /// Whether the state machine allows `self → to`.
    pub fn can_move_to(&self, to: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (self, to),
            (Scheduled, Ready)
                | (Scheduled, Running)
                | (Scheduled, Scheduled) // trigger: due time moves to now
                | (Ready, Running)
                | (Running, Succeeded)
                | (Running, Scheduled) // retry, lease expiry
                | (Running, Dead)
                | (Scheduled, Cancelled)
                | (Ready, Cancelled)
                | (Running, Cancelled)
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| ValidationError::OutOfRange {
                field: "state",
                reason: format!(
                    "unknown state {s:?}; expected one of scheduled, ready, running, succeeded, dead, cancelled"
                ),
            })
    }
}

/// What to do when a task's exclusive key is held by a running task at its due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExclusiveMode {
    /// Wait: start as soon as the running holder finishes.
    Wait,
    /// Skip: do not run at all; the task ends `cancelled` with the reason in `last_error`.
    Skip,
}

/// A rate limit: at most `limit` starts per `per_ms` for the tasks that share its key (the
/// queue's own limit when `key` is `None`), across nodes, spaced evenly: two starts under one
/// key are at least [`RateLimit::interval_ms`] apart, so any window of `per_ms` holds at most
/// `limit` of them and no period's allowance comes as a burst. The limit of the task about to
/// start decides.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub limit: u32,
    pub per_ms: u64,
}

impl RateLimit {
    /// The largest `limit` accepted.
    pub const MAX_LIMIT: u32 = 10_000;
    /// The longest period accepted (366 days).
    pub const MAX_PER_MS: u64 = 366 * 24 * 3600 * 1000;
    /// The prefix of a queue's own rate key: a control character, which keys may not contain,
    /// so it never meets a client's key.
    const QUEUE_PREFIX: &'static str = "\u{1f}queue\u{1f}";
    /// The prefix of a key's take slot (see [`RateLimit::take_key`]).
    const TAKE_PREFIX: &'static str = "\u{1f}take\u{1f}";

    /// Least milliseconds between two starts under the key: `per_ms / limit`, rounded up.
    pub fn interval_ms(&self) -> u64 {
        self.per_ms.div_ceil(u64::from(self.limit.max(1))).max(1)
    }

    /// The key the store spaces starts under, for a task of `queue`.
    pub fn store_key(&self, queue: &str) -> String {
        match &self.key {
            Some(k) => k.clone(),
            None => format!("{}{queue}", Self::QUEUE_PREFIX),
        }
    }

    /// The key the store spaces a worker queue's takes under (a worker's poll claiming a ready
    /// task), for a task of `queue`: apart from [`RateLimit::store_key`], which spaces the
    /// readying, so a take right after its own task's readying is not refused. Both begin with a
    /// control character, which client keys may not contain, so neither meets a client's key.
    pub fn take_key(&self, queue: &str) -> String {
        format!("{}{}", Self::TAKE_PREFIX, self.store_key(queue))
    }

    fn validate(&self, limits: &Limits) -> Result<(), ValidationError> {
        if let Some(k) = &self.key {
            if !namespace::has_valid_namespace(k) {
                return Err(ValidationError::BadCharacters {
                    field: "rate.key",
                    reason: "the namespace part is not a namespace name",
                });
            }
            check_key("rate.key", namespace::local(k), limits.max_key_len)?;
        }
        if !(1..=Self::MAX_LIMIT).contains(&self.limit) {
            return Err(ValidationError::OutOfRange {
                field: "rate.limit",
                reason: format!("must be between 1 and {}", Self::MAX_LIMIT),
            });
        }
        if !(1..=Self::MAX_PER_MS).contains(&self.per_ms) {
            return Err(ValidationError::OutOfRange {
                field: "rate.per",
                reason: "must be between 1ms and 366 days".into(),
            });
        }
        if u64::from(self.limit) > self.per_ms {
            return Err(ValidationError::OutOfRange {
                field: "rate.limit",
                reason: format!(
                    "at most one start per millisecond: a period of {} ms takes a limit of at most {}",
                    self.per_ms, self.per_ms
                ),
            });
        }
        Ok(())
    }
}

/// A group limit: at most `limit` running tasks per key, across queues and nodes (an exclusive
/// key is the case `limit = 1`). The limit of the task about to start decides: it starts only
/// while fewer than its `limit` tasks with its key run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exclusive {
    pub key: String,
    pub mode: ExclusiveMode,
    /// How many tasks with this key may run at once (1 to [`Exclusive::MAX_LIMIT`]; default 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub limit: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Exclusive {
    /// The largest group limit a task may carry.
    pub const MAX_LIMIT: u32 = 10_000;
}

/// When a task is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// As soon as possible.
    Now,
    /// At an absolute time (a time in the past means now).
    At(Timestamp),
    /// After a delay from the moment the task is accepted.
    After(Duration),
}

/// Limits on what a task may carry. The defaults suit most deployments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_name_len: usize,
    pub max_key_len: usize,
    pub max_payload_bytes: usize,
    pub max_attempts: u32,
    pub max_timeout: Duration,
    /// Most tag pairs on one task.
    pub max_tags: usize,
}

/// A task's tags: string keys and values, for search (`tag=k:v`). Kept in key order.
pub type Tags = BTreeMap<String, String>;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_name_len: 128,
            max_key_len: 256,
            max_payload_bytes: 256 * 1024,
            max_attempts: 1_000,
            max_timeout: Duration::from_secs(7 * 24 * 3600),
            max_tags: 16,
        }
    }
}

/// What a caller asks for: a builder with sensible defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub queue: String,
    pub kind: String,
    pub key: Option<String>,
    pub payload: serde_json::Value,
    pub due: Due,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub timeout: Duration,
    pub exclusive: Option<Exclusive>,
    /// At most so many starts per period under a key (see [`RateLimit`]).
    pub rate: Option<RateLimit>,
    /// Order among due tasks (see [`crate::priority`]); never makes a task start early.
    pub priority: Priority,
    pub tags: Tags,
    /// Deliver by an HTTP call instead of a handler or worker (`sundial-push`).
    pub target: Option<Target>,
    /// The W3C trace context of the request that created it, continued by every step that runs it.
    pub trace: Option<TraceContext>,
}

impl TaskSpec {
    /// The queue used when none is given.
    pub const DEFAULT_QUEUE: &'static str = "default";
    /// Attempts (first run included) when none is given.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
    /// Per-attempt time limit when none is given.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// The same task in namespace `ns`: its queue, key and exclusive key are qualified (see
    /// [`crate::namespace`]). A no-op for the default namespace.
    pub fn in_namespace(mut self, ns: &str) -> Self {
        if ns != namespace::DEFAULT_NAMESPACE {
            self.queue = namespace::qualify(ns, &self.queue);
            self.key = self.key.map(|k| namespace::qualify(ns, &k));
            if let Some(ex) = &mut self.exclusive {
                ex.key = namespace::qualify(ns, &ex.key);
            }
            if let Some(key) = self.rate.as_mut().and_then(|r| r.key.as_mut()) {
                *key = namespace::qualify(ns, key);
            }
        }
        self
    }

    pub fn new(kind: impl Into<String>) -> Self {
        TaskSpec {
            queue: Self::DEFAULT_QUEUE.to_string(),
            kind: kind.into(),
            key: None,
            payload: serde_json::Value::Null,
            due: Due::Now,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            timeout: Self::DEFAULT_TIMEOUT,
            exclusive: None,
            rate: None,
            priority: Priority::DEFAULT,
            tags: Tags::new(),
            target: None,
            trace: None,
        }
    }
    /// Carries `trace` (the creating request's W3C trace context) to the steps that run the task.
    pub fn trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }
    /// Delivers the task by calling `target` at its due time.
    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }
    /// Business key: at most one live (not terminal) task per `(queue, key)`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }
    pub fn delay(mut self, delay: Duration) -> Self {
        self.due = Due::After(delay);
        self
    }
    pub fn run_at(mut self, at: Timestamp) -> Self {
        self.due = Due::At(at);
        self
    }
    /// Order among due tasks: 0..=9, 9 the most urgent (see [`crate::priority`]).
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Adds (or replaces) one tag.
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }
    pub fn tags(mut self, tags: Tags) -> Self {
        self.tags = tags;
        self
    }
    pub fn exclusive(mut self, key: impl Into<String>, mode: ExclusiveMode) -> Self {
        self.exclusive = Some(Exclusive {
            key: key.into(),
            mode,
            limit: 1,
        });
        self
    }
    /// A group limit: at most `limit` tasks with `key` run at once, across queues and nodes;
    /// a task over the limit waits for one to finish (`limit = 1` is an exclusive key).
    pub fn concurrency(mut self, key: impl Into<String>, limit: u32) -> Self {
        self.exclusive = Some(Exclusive {
            key: key.into(),
            mode: ExclusiveMode::Wait,
            limit,
        });
        self
    }

    /// A rate limit: at most `limit` starts per `per`, evenly spaced, for the tasks with the
    /// rate `key` (across queues and nodes), or for the queue's tasks when `key` is `None`.
    pub fn rate(mut self, key: Option<String>, limit: u32, per: Duration) -> Self {
        self.rate = Some(RateLimit {
            key,
            limit,
            per_ms: u64::try_from(per.as_millis()).unwrap_or(u64::MAX),
        });
        self
    }

    /// Checks every field and resolves the due time against `now`. On success the result is a
    /// complete row; on failure nothing about the spec is kept anywhere.
    pub fn validate(
        self,
        id: TaskId,
        now: Timestamp,
        shard_count: u32,
        limits: &Limits,
    ) -> Result<NewTask, ValidationError> {
        // Queue, key and exclusive key may carry a namespace (see [`crate::namespace`]); the
        // limits apply to the name as its namespace knows it.
        for (field, v) in [("queue", Some(&self.queue)), ("key", self.key.as_ref())]
            .into_iter()
            .chain([("exclusive", self.exclusive.as_ref().map(|e| &e.key))])
        {
            if let Some(v) = v
                && !namespace::has_valid_namespace(v)
            {
                return Err(ValidationError::BadCharacters {
                    field,
                    reason: "the namespace part is not a namespace name",
                });
            }
        }
        check_name("queue", namespace::local(&self.queue), limits.max_name_len)?;
        check_name("kind", &self.kind, limits.max_name_len)?;
        if let Some(key) = &self.key {
            check_key("key", namespace::local(key), limits.max_key_len)?;
        }
        if let Some(ex) = &self.exclusive {
            check_key("exclusive", namespace::local(&ex.key), limits.max_key_len)?;
            if !(1..=Exclusive::MAX_LIMIT).contains(&ex.limit) {
                return Err(ValidationError::OutOfRange {
                    field: "concurrency.limit",
                    reason: format!("must be between 1 and {}", Exclusive::MAX_LIMIT),
                });
            }
        }
        if let Some(rate) = &self.rate {
            rate.validate(limits)?;
        }
        check_tags(&self.tags, limits)?;
        let payload =
            serde_json::to_string(&self.payload).map_err(|_| ValidationError::OutOfRange {
                field: "payload",
                reason: "not serialisable as JSON".into(),
            })?;
        if payload.len() > limits.max_payload_bytes {
            return Err(ValidationError::PayloadTooLarge {
                len: payload.len(),
                max: limits.max_payload_bytes,
            });
        }
        let due_at = match self.due {
            Due::Now => now,
            Due::At(t) => {
                if !t.is_in_range() {
                    return Err(ValidationError::OutOfRange {
                        field: "run_at",
                        reason: "must be between 1970-01-01 and 9999-12-31".into(),
                    });
                }
                t
            }
            Due::After(d) => {
                let t = now.saturating_add(d);
                if !t.is_in_range() {
                    return Err(ValidationError::OutOfRange {
                        field: "delay",
                        reason: "the due time would fall after 9999-12-31".into(),
                    });
                }
                t
            }
        };
        if self.max_attempts == 0 {
            return Err(ValidationError::OutOfRange {
                field: "max_attempts",
                reason: "must be at least 1".into(),
            });
        }
        if self.max_attempts > limits.max_attempts {
            return Err(ValidationError::OutOfRange {
                field: "max_attempts",
                reason: format!("must be at most {}", limits.max_attempts),
            });
        }
        self.backoff.validate()?;
        if self.timeout < Duration::from_millis(1) || self.timeout > limits.max_timeout {
            return Err(ValidationError::OutOfRange {
                field: "timeout",
                reason: format!("must be between 1ms and {}s", limits.max_timeout.as_secs()),
            });
        }
        let target = match self.target {
            Some(t) => Some(t.validate(self.timeout)?),
            None => None,
        };
        let shard = crate::shard_for(&self.queue, self.key.as_deref(), &id, shard_count);
        Ok(NewTask {
            id,
            shard,
            queue: self.queue,
            kind: self.kind,
            key: self.key,
            payload,
            due_at,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            exclusive: self.exclusive,
            rate: self.rate,
            priority: self.priority,
            tags: self.tags,
            target,
            trace: self.trace,
            created_at: now,
        })
    }
}

/// Queue and kind names: 1..=max bytes of `[A-Za-z0-9._:/-]`, starting with a letter or digit.
fn check_name(field: &'static str, v: &str, max: usize) -> Result<(), ValidationError> {
    if v.is_empty() {
        return Err(ValidationError::Empty { field });
    }
    if v.len() > max {
        return Err(ValidationError::TooLong {
            field,
            len: v.len(),
            max,
        });
    }
    let first_ok = v.as_bytes()[0].is_ascii_alphanumeric();
    let rest_ok = v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    if !first_ok || !rest_ok {
        return Err(ValidationError::BadCharacters {
            field,
            reason: "use letters, digits and . _ : / - (starting with a letter or digit)",
        });
    }
    Ok(())
}

/// Tags: at most `limits.max_tags` pairs; each key and value is checked like a task key. A tag
/// key may not contain `:` (the filter form is `key:value`).
pub fn check_tags(tags: &Tags, limits: &Limits) -> Result<(), ValidationError> {
    if tags.len() > limits.max_tags {
        return Err(ValidationError::OutOfRange {
            field: "tags",
            reason: format!("at most {} tags; {} given", limits.max_tags, tags.len()),
        });
    }
    for (k, v) in tags {
        check_key("tags", k, limits.max_key_len)?;
        check_key("tags", v, limits.max_key_len)?;
        if k.contains(':') {
            return Err(ValidationError::BadCharacters {
                field: "tags",
                reason: "a tag key may not contain ':'",
            });
        }
    }
    Ok(())
}

/// Keys: 1..=max bytes of UTF-8 without control characters and without leading/trailing space.
pub fn check_key(field: &'static str, v: &str, max: usize) -> Result<(), ValidationError> {
    if v.is_empty() {
        return Err(ValidationError::Empty { field });
    }
    if v.len() > max {
        return Err(ValidationError::TooLong {
            field,
            len: v.len(),
            max,
        });
    }
    if v.chars().any(char::is_control) {
        return Err(ValidationError::BadCharacters {
            field,
            reason: "control characters are not allowed",
        });
    }
    if v.trim() != v {
        return Err(ValidationError::BadCharacters {
            field,
            reason: "leading or trailing whitespace is not allowed",
        });
    }
    Ok(())
}

/// A validated task, ready to be inserted. Its payload is already serialised JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub id: TaskId,
    pub shard: u32,
    pub queue: String,
    pub kind: String,
    pub key: Option<String>,
    pub payload: String,
    pub due_at: Timestamp,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub timeout_ms: u64,
    pub exclusive: Option<Exclusive>,
    pub rate: Option<RateLimit>,
    pub priority: Priority,
    pub tags: Tags,
    pub target: Option<Target>,
    pub trace: Option<TraceContext>,
    pub created_at: Timestamp,
}

/// A stored task, as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub shard: u32,
    pub queue: String,
    pub kind: String,
    pub key: Option<String>,
    pub payload: serde_json::Value,
    pub due_at: Timestamp,
    pub state: TaskState,
    /// Attempts started so far (0 until the first start).
    pub attempt: u32,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub timeout_ms: u64,
    pub exclusive: Option<Exclusive>,
    /// At most so many starts per period under a key (see [`RateLimit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// Order among due tasks (see [`crate::priority`]).
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub tags: Tags,
    /// The current (or last) attempt's fencing token.
    pub execution_id: Option<ExecutionId>,
    pub lease_expires_at: Option<Timestamp>,
    pub worker: Option<String>,
    pub last_error: Option<String>,
    pub result: Option<serde_json::Value>,
    /// The HTTP call that delivers it, when it is a push task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// The W3C trace context it carries: as stored, the creating request's; in a handler's
    /// [`Task`] or a poll's answer, the context of the step that handed it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
}

impl Task {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// When the task became due: its due time, or its creation when it was created already due
    /// (a `run_at` in the past runs at once and is not late by the gap). A retry's due time is
    /// after the creation, so for a retry this is when the retry became due. Lateness is measured
    /// from here.
    pub fn became_due_at(&self) -> Timestamp {
        self.due_at.max(self.created_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> TaskId {
        TaskId::from_bytes([3; 16])
    }

    fn ok(spec: TaskSpec) -> NewTask {
        spec.validate(id(), Timestamp(1_000), 4, &Limits::default())
            .expect("valid")
    }

    fn err(spec: TaskSpec) -> ValidationError {
        spec.validate(id(), Timestamp(1_000), 4, &Limits::default())
            .expect_err("invalid")
    }

    #[test]
    fn resolves_due_times() {
        assert_eq!(ok(TaskSpec::new("k")).due_at, Timestamp(1_000));
        assert_eq!(
            ok(TaskSpec::new("k").delay(Duration::from_millis(250))).due_at,
            Timestamp(1_250)
        );
        assert_eq!(
            ok(TaskSpec::new("k").run_at(Timestamp(5))).due_at,
            Timestamp(5)
        );
    }

    #[test]
    fn defaults() {
        let t = ok(TaskSpec::new("k"));
        assert_eq!(t.queue, "default");
        assert_eq!(t.max_attempts, 5);
        assert_eq!(t.backoff, Backoff::default());
        assert_eq!(t.payload, "null");
        assert!(t.shard < 4);
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(err(TaskSpec::new("")).field(), Some("kind"));
        assert_eq!(err(TaskSpec::new("a".repeat(129))).field(), Some("kind"));
        assert_eq!(err(TaskSpec::new("k").queue("")).field(), Some("queue"));
        assert_eq!(err(TaskSpec::new("k").queue("a b")).field(), Some("queue"));
        assert_eq!(err(TaskSpec::new("k").key("")).field(), Some("key"));
        assert_eq!(err(TaskSpec::new("k").key("a\u{0}b")).field(), Some("key"));
        assert_eq!(
            err(TaskSpec::new("k").key("x".repeat(257))).field(),
            Some("key")
        );
        assert_eq!(
            err(TaskSpec::new("k").max_attempts(0)).field(),
            Some("max_attempts")
        );
        assert_eq!(
            err(TaskSpec::new("k").run_at(Timestamp(-1))).field(),
            Some("run_at")
        );
        assert_eq!(
            err(TaskSpec::new("k").run_at(Timestamp(Timestamp::MAX.0 + 1))).field(),
            Some("run_at")
        );
        assert_eq!(
            err(TaskSpec::new("k").delay(Duration::from_secs(400 * 365 * 86_400 * 100))).field(),
            Some("delay")
        );
        assert_eq!(
            err(TaskSpec::new("k").timeout(Duration::ZERO)).field(),
            Some("timeout")
        );
        let big = serde_json::Value::String("x".repeat(256 * 1024));
        assert!(matches!(
            err(TaskSpec::new("k").payload(big)),
            ValidationError::PayloadTooLarge { .. }
        ));
    }

    #[test]
    fn validates_tags() {
        let t = ok(TaskSpec::new("k").tag("env", "prod").tag("team", "a b"));
        assert_eq!(t.tags.get("env").map(String::as_str), Some("prod"));
        assert_eq!(err(TaskSpec::new("k").tag("", "x")).field(), Some("tags"));
        assert_eq!(err(TaskSpec::new("k").tag("a", "")).field(), Some("tags"));
        assert_eq!(
            err(TaskSpec::new("k").tag("a:b", "x")).field(),
            Some("tags")
        );
        assert_eq!(err(TaskSpec::new("k").tag("a", " x")).field(), Some("tags"));
        assert_eq!(
            err(TaskSpec::new("k").tag("a", "x".repeat(257))).field(),
            Some("tags")
        );
        let mut spec = TaskSpec::new("k");
        for i in 0..17 {
            spec = spec.tag(format!("t{i}"), "v");
        }
        assert_eq!(err(spec).field(), Some("tags"));
    }

    #[test]
    fn terminal_states_are_final() {
        for from in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in TaskState::ALL {
                assert!(!from.can_move_to(to), "{from} -> {to}");
            }
        }
        assert!(TaskState::Running.can_move_to(TaskState::Scheduled));
        assert!(!TaskState::Ready.can_move_to(TaskState::Succeeded));
    }

    #[test]
    fn state_names_round_trip() {
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>().unwrap(), s);
        }
        assert!("nope".parse::<TaskState>().is_err());
    }
}
