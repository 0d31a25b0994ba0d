//! Plain data of the operator's side of the [`crate::Store`] trait: queue settings and pause,
//! attempt history, bulk actions and retention.
//!
//! Nothing here does I/O; the backends store and read these types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sundial_core::{ExecutionId, Target, TaskId, TaskState, Timestamp};

/// Per-queue retention overrides, in milliseconds after a task finished. `None` falls back to
/// the server-wide default for that state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetentionOverride {
    pub succeeded_ms: Option<u64>,
    pub cancelled_ms: Option<u64>,
    pub dead_ms: Option<u64>,
}

impl RetentionOverride {
    pub fn is_empty(&self) -> bool {
        self.succeeded_ms.is_none() && self.cancelled_ms.is_none() && self.dead_ms.is_none()
    }
}

/// What `PUT /v1/queues/{queue}` sets: the queue's configuration. Stored as JSON text, so a new
/// field (with a serde default) needs no migration. Pause is not part of it (see
/// [`QueueSettings::paused`]): it has its own calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueConfig {
    pub retention: RetentionOverride,
    /// The queue's default push target: tasks of the queue created without a target of their
    /// own (and whose kind has no in-process handler) are delivered to it. Read at delivery, so
    /// a change reaches the tasks already waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// At most this many of the queue's tasks run at once, on every node together: in-process
    /// handlers, push deliveries and worker polls alike. The store checks it at every start
    /// (`ClaimOutcome::QueueFull`, and `claim_ready` takes no more than the free places).
    /// Lowering it stops nothing that runs; new starts wait until fewer run than it allows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

impl QueueConfig {
    /// The largest `concurrency` a queue may have.
    pub const MAX_CONCURRENCY: u32 = 10_000;
}

/// A queue's stored settings. A queue that was never configured nor paused has none (the
/// defaults apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    pub queue: String,
    /// While `true`, no task of the queue starts (in-process or worker).
    pub paused: bool,
    /// When the pause state last changed.
    pub paused_changed_at: Option<Timestamp>,
    pub config: QueueConfig,
    pub updated_at: Timestamp,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    /// Failed with an error (it is in [`Attempt::error`]); retried or dead.
    Failed,
    /// Neither finished nor heartbeated before its lease ended.
    LeaseExpired,
    /// The task was cancelled while the attempt ran.
    Cancelled,
}

impl AttemptOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::LeaseExpired => "lease_expired",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            AttemptOutcome::Succeeded,
            AttemptOutcome::Failed,
            AttemptOutcome::LeaseExpired,
            AttemptOutcome::Cancelled,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// The `last_error` a lease expiry writes; the attempt history recognises expiries by it.
pub const LEASE_EXPIRED_ERROR: &str =
    "lease expired: the attempt neither finished nor heartbeated in time";

/// One attempt of a task, as the store recorded it when the task entered and left `running`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub task_id: TaskId,
    /// 1 for the first attempt ever; keeps counting across retries of a dead task.
    pub seq: u64,
    pub execution_id: Option<ExecutionId>,
    /// The worker that claimed it; `None` for an in-process handler.
    pub worker: Option<String>,
    pub started_at: Timestamp,
    pub ended_at: Option<Timestamp>,
    /// `None` while the attempt runs.
    pub outcome: Option<AttemptOutcome>,
    pub error: Option<String>,
    /// The HTTP status a push attempt's receiver answered (none for handler and worker attempts,
    /// and for push attempts that got no answer: a timeout or a connection error).
    pub status_code: Option<u16>,
    /// The content type of that answer, when it named one.
    pub content_type: Option<String>,
}

/// The answer a push attempt got, kept on its attempt ([`crate::Store::record_attempt_response`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResponse {
    pub status_code: u16,
    pub content_type: Option<String>,
}

impl Attempt {
    pub fn duration_ms(&self) -> Option<u64> {
        self.ended_at
            .map(|e| u64::try_from(e.0.saturating_sub(self.started_at.0)).unwrap_or(0))
    }
}

/// The kept attempts of a task (oldest first) and how many it has had in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptHistory {
    pub attempts: Vec<Attempt>,
    /// Every attempt the task has started, including those no longer kept.
    pub total: u64,
}

/// A task id selected by a bulk action's filter, with its state when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selected {
    pub id: TaskId,
    pub state: TaskState,
}

/// A batch of [`crate::Store::select`]: like a [`crate::TaskPage`] of ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectPage {
    pub selected: Vec<Selected>,
    /// Pass as `before` for the next batch; `None` when no more tasks match. Set also on a short
    /// (even empty) batch that stopped at [`crate::LIST_VISIT_BUDGET`] candidates.
    pub next_cursor: Option<TaskId>,
}

/// How long finished tasks are kept, in milliseconds after they finished, per state, with
/// per-queue overrides. Applied by [`crate::Store::purge_tasks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRules {
    pub succeeded_ms: u64,
    pub cancelled_ms: u64,
    pub dead_ms: u64,
    pub queues: BTreeMap<String, RetentionOverride>,
}

impl RetentionRules {
    /// `(queue, state, keep ms)` for every override that differs from the defaults.
    pub fn overrides(&self) -> Vec<(&str, TaskState, u64)> {
        let mut out = Vec::new();
        for (q, o) in &self.queues {
            for (state, v) in [
                (TaskState::Succeeded, o.succeeded_ms),
                (TaskState::Cancelled, o.cancelled_ms),
                (TaskState::Dead, o.dead_ms),
            ] {
                if let Some(v) = v {
                    out.push((q.as_str(), state, v));
                }
            }
        }
        out
    }

    pub fn default_for(&self, state: TaskState) -> Option<u64> {
        match state {
            TaskState::Succeeded => Some(self.succeeded_ms),
            TaskState::Cancelled => Some(self.cancelled_ms),
            TaskState::Dead => Some(self.dead_ms),
            _ => None,
        }
    }

    /// Whether a task of `queue` in `state` that finished at `finished_at` is past its
    /// retention at `now`. Live states never are.
    pub fn expired(
        &self,
        queue: &str,
        state: TaskState,
        finished_at: Timestamp,
        now: Timestamp,
    ) -> bool {
        let Some(default) = self.default_for(state) else {
            return false;
        };
        let o = self.queues.get(queue);
        let keep = match state {
            TaskState::Succeeded => o.and_then(|o| o.succeeded_ms),
            TaskState::Cancelled => o.and_then(|o| o.cancelled_ms),
            TaskState::Dead => o.and_then(|o| o.dead_ms),
            _ => None,
        }
        .unwrap_or(default);
        finished_at
            .0
            .saturating_add(i64::try_from(keep).unwrap_or(i64::MAX))
            <= now.0
    }
}

/// The smallest string greater than every string that starts with `prefix`, in byte (= code
/// point) order; `None` when there is none (the prefix is all `char::MAX`). Lets a prefix filter
/// be an index range `key >= prefix AND key < upper`.
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_bounds() {
        assert_eq!(prefix_upper_bound("ab").as_deref(), Some("ac"));
        assert_eq!(
            prefix_upper_bound("a\u{D7FF}").as_deref(),
            Some("a\u{E000}")
        );
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        let upper = prefix_upper_bound("order-").unwrap();
        for k in ["order-", "order-1", "order-\u{10FFFF}\u{10FFFF}"] {
            assert!(k >= "order-" && k < upper.as_str(), "{k}");
        }
        assert!("order." >= upper.as_str());
    }

    #[test]
    fn retention_applies_overrides_per_state() {
        let mut queues = BTreeMap::new();
        queues.insert(
            "q".to_string(),
            RetentionOverride {
                dead_ms: Some(10),
                ..Default::default()
            },
        );
        let r = RetentionRules {
            succeeded_ms: 100,
            cancelled_ms: 100,
            dead_ms: 1_000,
            queues,
        };
        assert!(r.expired("q", TaskState::Dead, Timestamp(0), Timestamp(10)));
        assert!(!r.expired("other", TaskState::Dead, Timestamp(0), Timestamp(10)));
        assert!(r.expired("q", TaskState::Succeeded, Timestamp(0), Timestamp(100)));
        assert!(!r.expired("q", TaskState::Succeeded, Timestamp(0), Timestamp(99)));
        for live in [TaskState::Scheduled, TaskState::Ready, TaskState::Running] {
            assert!(!r.expired("q", live, Timestamp(0), Timestamp::MAX));
        }
    }
}
