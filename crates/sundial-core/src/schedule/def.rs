//! A schedule's definition: when it fires ([`ScheduleSpec`]), what each fire creates
//! ([`TaskTemplate`]), and the policies that decide what happens around a fire (overlap, catch-up,
//! jitter, start and end). Everything here is pure: the runner in `sundial-schedules` reads the
//! clock and the store, and asks these functions what to do.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{CompiledSpec, ScheduleSpec, SpecError, SpecErrorKind};
use crate::task::{Exclusive, ExclusiveMode, Limits, NewTask, TaskSpec};
use crate::{Backoff, TaskId, Timestamp, ValidationError};

/// The catch-up window when none is given: fires missed by at most this much still run.
pub const DEFAULT_CATCHUP_WINDOW: Duration = Duration::from_secs(60);
/// The longest schedule id, in bytes.
pub const MAX_SCHEDULE_ID_LEN: usize = 128;

/// Identifies a schedule: chosen by the caller or generated (a UUIDv7). 1 to 128 bytes of
/// `[A-Za-z0-9._:/-]`, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ScheduleId(String);

impl ScheduleId {
    pub fn new(id: impl Into<String>) -> Result<Self, SpecError> {
        let id = id.into();
        let bad = |reason: &str| Err(SpecError::new("id", SpecErrorKind::Invalid, reason));
        // An id may carry a namespace (see `crate::namespace`); the rules apply to the id as its
        // namespace knows it.
        if !crate::namespace::has_valid_namespace(&id) {
            return bad("the namespace part is not a namespace name");
        }
        let local = crate::namespace::local(&id);
        if local.is_empty() {
            return bad("must not be empty");
        }
        if local.len() > MAX_SCHEDULE_ID_LEN {
            return bad("is longer than 128 bytes");
        }
        let first_ok = local.as_bytes()[0].is_ascii_alphanumeric();
        let rest_ok = local
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
        if !first_ok || !rest_ok {
            return bad("use letters, digits and . _ : / - (starting with a letter or digit)");
        }
        Ok(ScheduleId(id))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ScheduleId {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        ScheduleId::new(s)
    }
}

/// What to do when a fire comes while the previous fire's task has not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Do not fire; record the fire as skipped (reason `overlap`).
    #[default]
    Skip,
    /// Fire into a buffer of one: the task starts when the previous one stops running. A fire
    /// that finds the buffer full is skipped.
    BufferOne,
    /// Fire every time; the tasks run one after another.
    BufferAll,
    /// Fire every time; tasks may run at the same time.
    AllowAll,
    /// Cancel the previous task, then fire.
    CancelOther,
}

impl OverlapPolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::BufferOne => "buffer_one",
            OverlapPolicy::BufferAll => "buffer_all",
            OverlapPolicy::AllowAll => "allow_all",
            OverlapPolicy::CancelOther => "cancel_other",
        }
    }
    /// Whether tasks of this policy run one at a time (through the schedule's exclusive key).
    pub fn is_buffered(&self) -> bool {
        matches!(self, OverlapPolicy::BufferOne | OverlapPolicy::BufferAll)
    }
}

impl FromStr for OverlapPolicy {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        [
            OverlapPolicy::Skip,
            OverlapPolicy::BufferOne,
            OverlapPolicy::BufferAll,
            OverlapPolicy::AllowAll,
            OverlapPolicy::CancelOther,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| {
            SpecError::new(
                "overlap",
                SpecErrorKind::Invalid,
                format!(
                    "unknown policy {s:?}; expected skip, buffer_one, buffer_all, allow_all or cancel_other"
                ),
            )
        })
    }
}

/// What each fire creates: a task of this shape, keyed by the schedule and the nominal time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskTemplate {
    #[serde(default = "default_queue")]
    pub queue: String,
    pub kind: String,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Mutual exclusion with other tasks. Not allowed with the buffered overlap policies, which
    /// use the schedule's own exclusive key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<Exclusive>,
    /// Deliver each fire's task by this HTTP call (see `sundial-push`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::Target>,
    /// The tags each fire's task carries (checked against [`Limits`] when the task is made).
    #[serde(default, skip_serializing_if = "crate::Tags::is_empty")]
    pub tags: crate::Tags,
    /// The priority each fire's task carries (see [`crate::priority`]).
    #[serde(default, skip_serializing_if = "crate::Priority::is_default")]
    pub priority: crate::Priority,
}

fn default_queue() -> String {
    TaskSpec::DEFAULT_QUEUE.to_string()
}
fn default_attempts() -> u32 {
    TaskSpec::DEFAULT_MAX_ATTEMPTS
}
fn default_timeout_ms() -> u64 {
    TaskSpec::DEFAULT_TIMEOUT.as_millis() as u64
}

impl TaskTemplate {
    pub fn new(kind: impl Into<String>) -> Self {
        TaskTemplate {
            queue: default_queue(),
            kind: kind.into(),
            payload: serde_json::Value::Null,
            max_attempts: default_attempts(),
            backoff: Backoff::default(),
            timeout_ms: default_timeout_ms(),
            exclusive: None,
            target: None,
            tags: crate::Tags::new(),
            priority: crate::Priority::DEFAULT,
        }
    }
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self
    }
    /// The same template in namespace `ns`: its queue and exclusive key are qualified (see
    /// [`crate::namespace`]), as [`TaskSpec::in_namespace`] does for a task. A no-op for the
    /// default namespace.
    pub fn in_namespace(mut self, ns: &str) -> Self {
        if ns != crate::namespace::DEFAULT_NAMESPACE {
            self.queue = crate::namespace::qualify(ns, &self.queue);
            if let Some(ex) = &mut self.exclusive {
                ex.key = crate::namespace::qualify(ns, &ex.key);
            }
        }
        self
    }
}

/// A schedule as its owner defines it. [`ScheduleDef::validate`] checks every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDef {
    pub spec: ScheduleSpec,
    #[serde(default)]
    pub overlap: OverlapPolicy,
    /// Fires missed by at most this much (after downtime) still run, once each, oldest first;
    /// older ones are recorded as missed.
    #[serde(default = "default_catchup_ms")]
    pub catchup_window_ms: u64,
    /// Each fire is delayed by a deterministic amount in `[0, jitter]` derived from the schedule
    /// id and the nominal time, so that schedules sharing a fire time spread out.
    #[serde(default)]
    pub jitter_ms: u64,
    /// No fire before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Timestamp>,
    /// No fire after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Timestamp>,
    pub task: TaskTemplate,
}

fn default_catchup_ms() -> u64 {
    DEFAULT_CATCHUP_WINDOW.as_millis() as u64
}

impl ScheduleDef {
    /// A definition with the default policies (overlap skip, catch-up 1 minute, no jitter).
    pub fn new(spec: ScheduleSpec, task: TaskTemplate) -> Self {
        ScheduleDef {
            spec,
            overlap: OverlapPolicy::default(),
            catchup_window_ms: default_catchup_ms(),
            jitter_ms: 0,
            start_at: None,
            end_at: None,
            task,
        }
    }
    pub fn overlap(mut self, overlap: OverlapPolicy) -> Self {
        self.overlap = overlap;
        self
    }
    pub fn catchup_window(mut self, window: Duration) -> Self {
        self.catchup_window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        self
    }
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter_ms = u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX);
        self
    }
    pub fn start_at(mut self, t: Timestamp) -> Self {
        self.start_at = Some(t);
        self
    }
    pub fn end_at(mut self, t: Timestamp) -> Self {
        self.end_at = Some(t);
        self
    }

    /// The catch-up window as a duration.
    pub fn catchup(&self) -> Duration {
        Duration::from_millis(self.catchup_window_ms)
    }

    /// Checks every field: the spec, the policies, and the task template (as a task of this
    /// schedule would be checked). Errors name the field (`cron`, `jitter`, `task.kind`, …).
    pub fn validate(&self, limits: &Limits) -> Result<CompiledSpec, SpecError> {
        self.validate_with(limits, ScheduleSpec::compile)
    }

    /// [`ScheduleDef::validate`] with the spec compiled by `compile` (a caller that keeps
    /// compiled specs of definitions it validates again and again hands in a cached one).
    pub fn validate_with(
        &self,
        limits: &Limits,
        compile: impl FnOnce(&ScheduleSpec) -> Result<CompiledSpec, SpecError>,
    ) -> Result<CompiledSpec, SpecError> {
        let compiled = compile(&self.spec)?;
        const DAY_MS: u64 = 86_400_000;
        if self.catchup_window_ms > 365 * DAY_MS {
            return Err(SpecError::new(
                "catchup_window",
                SpecErrorKind::OutOfRange,
                "must be at most 365 days",
            ));
        }
        if self.jitter_ms > DAY_MS {
            return Err(SpecError::new(
                "jitter",
                SpecErrorKind::OutOfRange,
                "must be at most 1 day",
            ));
        }
        for (field, t) in [("start_at", self.start_at), ("end_at", self.end_at)] {
            if t.is_some_and(|t| !t.is_in_range()) {
                return Err(SpecError::new(
                    field,
                    SpecErrorKind::OutOfRange,
                    "must be between 1970-01-01 and 9999-12-31",
                ));
            }
        }
        if let (Some(s), Some(e)) = (self.start_at, self.end_at)
            && e < s
        {
            return Err(SpecError::new(
                "end_at",
                SpecErrorKind::Conflict,
                "must not be before start_at",
            ));
        }
        if self.overlap.is_buffered() && self.task.exclusive.is_some() {
            return Err(SpecError::new(
                "task.exclusive",
                SpecErrorKind::Conflict,
                "cannot be combined with overlap buffer_one or buffer_all, which use the schedule's own exclusive key",
            ));
        }
        let probe = ScheduleId(String::from("probe"));
        self.task_for(&probe, TaskId::MIN, Timestamp(0), Timestamp(0), 1, limits)
            .map_err(|e| {
                let field = format!("task.{}", e.field().unwrap_or("spec"));
                SpecError::new(field, SpecErrorKind::Invalid, e.to_string())
            })?;
        Ok(compiled)
    }

    /// The first nominal fire time strictly after `t` within `[start_at, end_at]`.
    pub fn next_nominal_after(&self, spec: &CompiledSpec, t: Timestamp) -> Option<Timestamp> {
        let from = match self.start_at {
            Some(s) if s.0 - 1 > t.0 => Timestamp(s.0 - 1),
            _ => t,
        };
        let next = spec.next_fire_after(from)?;
        match self.end_at {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// How much a fire at `nominal` is delayed: a value in `[0, jitter]` that depends only on
    /// the schedule and the nominal time (so re-arming after a crash picks the same moment).
    pub fn jitter_for(&self, id: &ScheduleId, nominal: Timestamp) -> Duration {
        if self.jitter_ms == 0 {
            return Duration::ZERO;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.as_str().bytes().chain(nominal.0.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Finalise (FNV's low bits are weak for short inputs).
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        Duration::from_millis(h % (self.jitter_ms + 1))
    }

    /// The task of the fire at `nominal`, due at `due`. Its key is [`FireKey`]'s; buffered
    /// overlap policies run the schedule's tasks one at a time through the exclusive key
    /// `schedule:<id>` (mode wait). Both keys are in the schedule id's namespace (see
    /// [`crate::namespace`]); the queue is the template's, qualified when it was stored.
    pub fn task_for(
        &self,
        id: &ScheduleId,
        task_id: TaskId,
        nominal: Timestamp,
        due: Timestamp,
        shard_count: u32,
        limits: &Limits,
    ) -> Result<NewTask, ValidationError> {
        let t = &self.task;
        let mut spec = TaskSpec::new(t.kind.clone())
            .queue(t.queue.clone())
            .key(FireKey::format(id, nominal))
            .payload(t.payload.clone())
            .run_at(due)
            .max_attempts(t.max_attempts)
            .backoff(t.backoff.clone())
            .timeout(Duration::from_millis(t.timeout_ms));
        spec.exclusive = if self.overlap.is_buffered() {
            Some(Exclusive {
                key: {
                    let (ns, local) = crate::namespace::split(id.as_str());
                    crate::namespace::qualify(ns, &format!("schedule:{local}"))
                },
                mode: ExclusiveMode::Wait,
                limit: 1,
            })
        } else {
            t.exclusive.clone()
        };
        spec.target = t.target.clone();
        spec.tags = t.tags.clone();
        spec.priority = t.priority;
        spec.validate(task_id, due, shard_count, limits)
    }
}

/// The key of a task created by a schedule: `schedule:<id>@<nominal time, RFC 3339 UTC>`, for
/// example `schedule:nightly@2024-03-10T07:00:00Z`. This is how a task carries its schedule id and
/// nominal fire time: [`FireKey::parse`] reads them back (a handler can call it on
/// `task.key`). The key also keeps a second live task for the same fire out of the queue.
///
/// A schedule of a namespace other than the default one makes the key in its namespace: the
/// stored key is the namespace's qualified `schedule:<id>@…` (see [`crate::namespace`]), so its
/// clients see `schedule:<id>@…` with the id as they know it, and [`FireKey::parse`] of the
/// stored key gives back the stored (qualified) schedule id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireKey {
    pub schedule_id: ScheduleId,
    pub nominal: Timestamp,
}

impl FireKey {
    pub fn format(id: &ScheduleId, nominal: Timestamp) -> String {
        let (ns, id) = crate::namespace::split(id.as_str());
        let key = match super::to_jiff(nominal) {
            Some(t) => format!("schedule:{id}@{t}"),
            None => format!("schedule:{id}@{}ms", nominal.0),
        };
        crate::namespace::qualify(ns, &key)
    }

    /// Reads a key made by [`FireKey::format`]; `None` for any other key.
    pub fn parse(key: &str) -> Option<FireKey> {
        if !crate::namespace::has_valid_namespace(key) {
            return None;
        }
        let (ns, key) = crate::namespace::split(key);
        let rest = key.strip_prefix("schedule:")?;
        let (id, at) = rest.rsplit_once('@')?;
        let nominal = match at.strip_suffix("ms") {
            Some(ms) => Timestamp(ms.parse().ok()?),
            None => super::from_jiff(at.parse::<jiff::Timestamp>().ok()?),
        };
        Some(FireKey {
            schedule_id: ScheduleId::new(crate::namespace::qualify(ns, id)).ok()?,
            nominal,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> ScheduleDef {
        ScheduleDef::new(ScheduleSpec::cron("0 * * * *"), TaskTemplate::new("report"))
    }

    #[test]
    fn fire_keys_round_trip() {
        let id = ScheduleId::new("nightly/eu-1").unwrap();
        for nominal in [Timestamp(1_710_054_000_000), Timestamp(1_710_054_000_250)] {
            let key = FireKey::format(&id, nominal);
            assert!(
                key.starts_with("schedule:nightly/eu-1@2024-03-10T07:00:00"),
                "{key}"
            );
            assert_eq!(
                FireKey::parse(&key),
                Some(FireKey {
                    schedule_id: id.clone(),
                    nominal
                })
            );
        }
        assert_eq!(FireKey::parse("order-123"), None);
        assert_eq!(FireKey::parse("schedule:x@yesterday"), None);
    }

    #[test]
    fn jitter_is_deterministic_and_bounded() {
        let d = def().jitter(Duration::from_secs(10));
        let id = ScheduleId::new("a").unwrap();
        let mut seen = std::collections::HashSet::new();
        for n in 0..200 {
            let j = d.jitter_for(&id, Timestamp(n * 60_000));
            assert!(j <= Duration::from_secs(10));
            assert_eq!(j, d.jitter_for(&id, Timestamp(n * 60_000)));
            seen.insert(j);
        }
        assert!(seen.len() > 100, "jitter should spread: {}", seen.len());
        assert_eq!(def().jitter_for(&id, Timestamp(0)), Duration::ZERO);
    }

    #[test]
    fn start_and_end_bound_the_nominal_times() {
        let d = def()
            .start_at(Timestamp(10 * 3_600_000))
            .end_at(Timestamp(12 * 3_600_000));
        let spec = d.validate(&Limits::default()).unwrap();
        assert_eq!(
            d.next_nominal_after(&spec, Timestamp(0)),
            Some(Timestamp(10 * 3_600_000)),
            "start_at itself is a fire time"
        );
        assert_eq!(
            d.next_nominal_after(&spec, Timestamp(11 * 3_600_000)),
            Some(Timestamp(12 * 3_600_000)),
            "end_at itself is a fire time"
        );
        assert_eq!(d.next_nominal_after(&spec, Timestamp(12 * 3_600_000)), None);
    }

    #[test]
    fn validation_names_fields() {
        let l = Limits::default();
        let e = def()
            .end_at(Timestamp(1))
            .start_at(Timestamp(2))
            .validate(&l);
        assert_eq!(e.unwrap_err().field(), "end_at");
        let e = def().jitter(Duration::from_secs(2 * 86_400)).validate(&l);
        assert_eq!(e.unwrap_err().field(), "jitter");
        let mut d = def();
        d.task.kind = String::new();
        assert_eq!(d.validate(&l).unwrap_err().field(), "task.kind");
        let mut d = def().overlap(OverlapPolicy::BufferAll);
        d.task.exclusive = Some(Exclusive {
            key: "k".into(),
            mode: ExclusiveMode::Skip,
            limit: 1,
        });
        assert_eq!(d.validate(&l).unwrap_err().field(), "task.exclusive");
        assert!(ScheduleId::new("").is_err());
        assert!(ScheduleId::new("a b").is_err());
        assert!(
            ScheduleId::new("a@b").is_err(),
            "@ separates the id in fire keys"
        );
        assert!("buffer_one".parse::<OverlapPolicy>().is_ok());
        assert!("sometimes".parse::<OverlapPolicy>().is_err());
    }

    #[test]
    fn buffered_tasks_share_the_schedule_exclusive_key() {
        let d = def().overlap(OverlapPolicy::BufferOne);
        let id = ScheduleId::new("s1").unwrap();
        let t = d
            .task_for(
                &id,
                TaskId::MIN,
                Timestamp(0),
                Timestamp(5),
                4,
                &Limits::default(),
            )
            .unwrap();
        assert_eq!(t.exclusive.unwrap().key, "schedule:s1");
        assert_eq!(t.due_at, Timestamp(5));
        assert_eq!(t.key.as_deref(), Some("schedule:s1@1970-01-01T00:00:00Z"));
    }

    #[test]
    fn a_fire_task_carries_the_template_tags_and_priority_within_the_limits() {
        let mut d = def();
        d.task.tags = [("team".to_string(), "ops".to_string())].into();
        d.task.priority = crate::Priority::new(8).unwrap();
        let id = ScheduleId::new("s1").unwrap();
        let t = d
            .task_for(
                &id,
                TaskId::MIN,
                Timestamp(0),
                Timestamp(5),
                4,
                &Limits::default(),
            )
            .unwrap();
        assert_eq!(t.tags, d.task.tags);
        assert_eq!(t.priority, d.task.priority);
        // The stored form reads back, and a template stored before tags existed reads as none.
        let back: TaskTemplate =
            serde_json::from_value(serde_json::to_value(&d.task).unwrap()).unwrap();
        assert_eq!(back, d.task);
        let old: TaskTemplate = serde_json::from_value(serde_json::json!({"kind": "k"})).unwrap();
        assert!(old.tags.is_empty());
        assert_eq!(old.priority, crate::Priority::DEFAULT);
        // Too many tags are refused when the fire's task is made, as for any task.
        d.task.tags = (0..100)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(
            d.task_for(
                &id,
                TaskId::MIN,
                Timestamp(0),
                Timestamp(5),
                4,
                &Limits::default()
            )
            .is_err()
        );
    }

    #[test]
    fn a_namespaced_schedule_makes_its_tasks_in_its_namespace() {
        use crate::namespace::{local, qualify};
        let mut d = def().overlap(OverlapPolicy::BufferOne);
        d.task = TaskTemplate::new("report")
            .queue("reports")
            .in_namespace("acme");
        assert_eq!(d.task.queue, qualify("acme", "reports"));
        let id = ScheduleId::new(qualify("acme", "s1")).unwrap();
        let t = d
            .task_for(
                &id,
                TaskId::MIN,
                Timestamp(0),
                Timestamp(5),
                4,
                &Limits::default(),
            )
            .unwrap();
        assert_eq!(t.queue, qualify("acme", "reports"));
        let key = t.key.clone().unwrap();
        assert_eq!(key, qualify("acme", "schedule:s1@1970-01-01T00:00:00Z"));
        assert_eq!(local(&key), "schedule:s1@1970-01-01T00:00:00Z");
        assert_eq!(t.exclusive.unwrap().key, qualify("acme", "schedule:s1"));
        // The stored key reads back as the stored id; the key as acme knows it as acme's id.
        assert_eq!(FireKey::parse(&key).unwrap().schedule_id, id);
        assert_eq!(
            FireKey::parse(local(&key)).unwrap().schedule_id.as_str(),
            "s1"
        );
        // A template's own exclusive key is qualified too.
        let mut tpl = TaskTemplate::new("k");
        tpl.exclusive = Some(Exclusive {
            key: "one".into(),
            mode: ExclusiveMode::Wait,
            limit: 1,
        });
        assert_eq!(
            tpl.in_namespace("acme").exclusive.unwrap().key,
            qualify("acme", "one")
        );
        assert_eq!(
            TaskTemplate::new("k").in_namespace("default").queue,
            "default"
        );
    }
}
