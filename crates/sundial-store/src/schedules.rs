//! The schedule storage seam: [`ScheduleStore`], separate from [`crate::Store`] so that a backend
//! can add schedules independently (conformance: [`crate::schedule_store_conformance!`]).
//!
//! A schedule is *armed* by one kernel task, its *tick*: an ordinary task row (queue
//! [`TICK_QUEUE`], kind [`TICK_KIND`]) due at the next fire time, so the engine's timers wake the
//! runner and nothing polls. The schedule row remembers which tick is armed and for which nominal
//! time. [`ScheduleStore::fire`] does everything one fire needs in **one transaction**: record the
//! fire (unique per schedule and nominal time; a repeat is a no-op), insert the fire's task, and arm
//! the next tick, conditional on the tick that fired still being the armed one. A crash before the
//! commit leaves the tick to run again; a crash after it leaves a stale tick whose fire is refused.
//! Either way a fire is neither lost nor doubled.

use async_trait::async_trait;
use sundial_core::schedule::{ScheduleDef, ScheduleId};
use sundial_core::{ExecutionId, NewTask, Task, TaskId, TaskState, Timestamp};
use thiserror::Error;

use crate::StoreError;

/// The queue of schedule ticks (handled in-process by the schedules runner).
pub const TICK_QUEUE: &str = "sundial.schedules";
/// The kind of schedule ticks.
pub const TICK_KIND: &str = "sundial.schedule.tick";

/// How a fire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FireOutcome {
    /// A task was created.
    Fired,
    /// Deliberately not run (paused, overlap).
    Skipped,
    /// Not run because it was noticed too late (outside the catch-up window).
    Missed,
}

impl FireOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            FireOutcome::Fired => "fired",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Missed => "missed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            FireOutcome::Fired,
            FireOutcome::Skipped,
            FireOutcome::Missed,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// Why a fire ended as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FireReason {
    /// Fired at its time (or late, inside the catch-up window).
    Schedule,
    /// Fired by "trigger now".
    Trigger,
    /// Fired by a backfill over a past range.
    Backfill,
    /// Skipped: the previous fire's task had not finished (overlap policy).
    Overlap,
    /// Skipped: the schedule was paused.
    Paused,
    /// Missed: noticed after the catch-up window had passed (the process was down).
    OutsideCatchupWindow,
}

impl FireReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FireReason::Schedule => "schedule",
            FireReason::Trigger => "trigger",
            FireReason::Backfill => "backfill",
            FireReason::Overlap => "overlap",
            FireReason::Paused => "paused",
            FireReason::OutsideCatchupWindow => "outside_catchup_window",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            FireReason::Schedule,
            FireReason::Trigger,
            FireReason::Backfill,
            FireReason::Overlap,
            FireReason::Paused,
            FireReason::OutsideCatchupWindow,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// Fires per outcome, kept on the schedule row (no scans).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FireCounts {
    pub fired: u64,
    pub skipped: u64,
    pub missed: u64,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub id: ScheduleId,
    pub def: ScheduleDef,
    pub paused: bool,
    /// Why it was paused or unpaused, as given.
    pub note: Option<String>,
    /// The nominal time of the armed fire; `None` when nothing is armed (ended).
    pub next_fire_at: Option<Timestamp>,
    /// The tick task armed for `next_fire_at`.
    pub armed_tick: Option<TaskId>,
    /// The task of the latest fire that created one (overlap decisions look at it).
    pub last_task: Option<TaskId>,
    /// The nominal time of the latest recorded fire of any outcome.
    pub last_fire_at: Option<Timestamp>,
    pub counts: FireCounts,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// The state of a schedule's previous fire's task, as overlap decisions need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastTask {
    pub id: TaskId,
    pub state: TaskState,
    /// Attempts started so far (0: created, never started).
    pub attempt: u32,
}

impl LastTask {
    pub fn of(task: &Task) -> Self {
        LastTask {
            id: task.id,
            state: task.state,
            attempt: task.attempt,
        }
    }
}

/// The tick that arms a schedule's next fire.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    pub nominal: Timestamp,
    /// A task of queue [`TICK_QUEUE`] and kind [`TICK_KIND`], due when the fire should happen.
    pub tick: NewTask,
}

/// What a write does to a schedule's armed tick. Replacing or removing an armed tick cancels it
/// when it is still `scheduled` (a tick that is running is the one firing and is left alone).
#[derive(Debug, Clone, PartialEq)]
pub enum ArmChange {
    Keep,
    Disarm,
    Arm(Box<Arm>),
}

impl ArmChange {
    pub fn arm(arm: Arm) -> Self {
        ArmChange::Arm(Box::new(arm))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    pub id: ScheduleId,
    pub def: ScheduleDef,
    pub paused: bool,
    pub note: Option<String>,
    pub arm: Option<Arm>,
    pub now: Timestamp,
}

/// One fire to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewFire {
    pub nominal: Timestamp,
    pub outcome: FireOutcome,
    pub reason: FireReason,
    /// The task to create (only with [`FireOutcome::Fired`]).
    pub task: Option<NewTask>,
    /// How many fire times this record stands for (1, or more for a collapsed run of missed
    /// fires from `nominal` through `through`).
    pub count: u64,
    pub through: Option<Timestamp>,
}

impl NewFire {
    pub fn fired(nominal: Timestamp, reason: FireReason, task: NewTask) -> Self {
        NewFire {
            nominal,
            outcome: FireOutcome::Fired,
            reason,
            task: Some(task),
            count: 1,
            through: None,
        }
    }
    pub fn skipped(nominal: Timestamp, reason: FireReason) -> Self {
        NewFire {
            nominal,
            outcome: FireOutcome::Skipped,
            reason,
            task: None,
            count: 1,
            through: None,
        }
    }
    pub fn missed(nominal: Timestamp, count: u64, through: Option<Timestamp>) -> Self {
        NewFire {
            nominal,
            outcome: FireOutcome::Missed,
            reason: FireReason::OutsideCatchupWindow,
            task: None,
            count,
            through,
        }
    }
}

/// A stored fire.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRecord {
    pub schedule_id: ScheduleId,
    pub nominal: Timestamp,
    pub outcome: FireOutcome,
    pub reason: FireReason,
    pub task_id: Option<TaskId>,
    pub count: u64,
    pub through: Option<Timestamp>,
    pub recorded_at: Timestamp,
}

/// Everything one fire (or a batch of fires of one schedule) writes, in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct FireOp {
    pub schedule_id: ScheduleId,
    /// When set, nothing happens unless this is the schedule's armed tick (the tick that fired):
    /// a tick that fires twice (its first run's result was lost) is refused the second time.
    pub expect_armed: Option<TaskId>,
    /// When set (with `expect_armed`, the tick that is firing): that tick's attempt under this
    /// execution is recorded `succeeded` in the same transaction, as
    /// [`Store::complete`](crate::Store::complete) would record it (no result), so the tick's
    /// run costs no write of its own. A tick no longer running under this execution (its lease
    /// expired and it was taken again) is left as it is and the op still applies;
    /// [`FireApplied::tick_completed`] says which happened.
    pub complete_tick: Option<ExecutionId>,
    /// Recorded in order; one that exists already (same schedule and nominal time) is left as it
    /// is and its task is not created.
    pub fires: Vec<NewFire>,
    pub arm: ArmChange,
    pub now: Timestamp,
}

/// The ticks a backend's fire job records as succeeded after its ops ([`FireOp::complete_tick`]),
/// written together rather than one statement per op: which op asked for which tick, grouped by
/// the ops' times (one group in practice: a batch's ops share the runner's time), and the
/// answers set from the ticks the backend recorded.
#[derive(Debug, Default)]
pub struct TickCompletions {
    /// Per op in order, the tick it asked to record.
    tick_of: Vec<Option<TaskId>>,
    /// The ticks to record, by the time to record them at.
    by_time: Vec<(Timestamp, Vec<(TaskId, ExecutionId)>)>,
}

impl TickCompletions {
    /// Notes the next op (applied or refused): `tick` is the tick it asks to record at `now`.
    pub fn push(&mut self, now: Timestamp, tick: Option<(TaskId, ExecutionId)>) {
        if let Some(t) = tick {
            match self.by_time.iter_mut().find(|(at, _)| *at == now) {
                Some((_, ticks)) => ticks.push(t),
                None => self.by_time.push((now, vec![t])),
            }
        }
        self.tick_of.push(tick.map(|(id, _)| id));
    }

    /// The ticks to record, each group with its time.
    pub fn groups(&self) -> &[(Timestamp, Vec<(TaskId, ExecutionId)>)] {
        &self.by_time
    }

    /// Sets each applied op's [`FireApplied::tick_completed`] from `done`, the ticks recorded.
    pub fn answer(
        self,
        out: &mut [Result<FireApplied, ScheduleError>],
        done: &std::collections::HashSet<TaskId>,
    ) {
        for (r, tick) in out.iter_mut().zip(self.tick_of) {
            if let (Ok(applied), Some(tick)) = (r, tick) {
                applied.tick_completed = done.contains(&tick);
            }
        }
    }
}

/// What became of one [`NewFire`].
#[derive(Debug, Clone, PartialEq)]
pub enum FireResult {
    Recorded {
        record: FireRecord,
        /// The task created for it. A live task holding the fire's key already (never expected)
        /// is linked instead and not returned.
        task: Option<Box<Task>>,
    },
    /// A fire with this nominal time was recorded before: nothing changed.
    AlreadyRecorded(FireRecord),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FireApplied {
    pub schedule: Schedule,
    pub fires: Vec<FireResult>,
    /// The tick armed by this op, if it armed one.
    pub tick: Option<Box<Task>>,
    /// Whether the op recorded the firing tick's attempt as `succeeded`
    /// ([`FireOp::complete_tick`]).
    pub tick_completed: bool,
}

/// Which schedules [`ScheduleStore::search_schedules`] returns: every field given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduleFilter {
    /// Only schedules whose id contains this, byte for byte (empty: every id). With a
    /// `namespace`, the id as that namespace knows it (without its namespace part).
    pub id_contains: String,
    /// Only schedules paused (`true`) or not (`false`).
    pub paused: Option<bool>,
    /// Only schedules of this namespace, by their stored id (see `sundial_core::namespace`): the
    /// default namespace's are the ids without the separator.
    pub namespace: Option<String>,
}

impl ScheduleFilter {
    /// Whether `s` is one the filter keeps (the reference the backends' queries follow).
    pub fn matches(&self, s: &Schedule) -> bool {
        let id = s.id.as_str();
        let in_ns = self
            .namespace
            .as_ref()
            .is_none_or(|ns| sundial_core::namespace::belongs(ns, id));
        let searched = match &self.namespace {
            Some(_) => sundial_core::namespace::local(id),
            None => id,
        };
        in_ns
            && searched.contains(self.id_contains.as_str())
            && self.paused.is_none_or(|p| s.paused == p)
    }

    /// The range of stored ids the namespace's schedules lie in, for a backend's query: ids
    /// greater than the first and, when given, less than the second. A namespace other than the
    /// default one is one contiguous run of ids (all start with its stored prefix; ids compare
    /// byte by byte), so a walk in id order can start and stop at it; the default namespace's
    /// ids are spread out (the backend filters them by the absent separator).
    pub fn id_range(&self, after: Option<&ScheduleId>) -> (String, Option<String>) {
        let after = after.map_or("", |a| a.as_str()).to_string();
        match self
            .namespace
            .as_deref()
            .and_then(sundial_core::namespace::stored_prefix)
        {
            Some(prefix) => {
                // Every id of the namespace is longer than its prefix, so greater than it; and
                // less than the prefix with its last byte (the separator) raised by one.
                let mut end = prefix.clone();
                end.pop();
                end.push(char::from(sundial_core::namespace::SEPARATOR as u8 + 1));
                (after.max(prefix), Some(end))
            }
            None => (after, None),
        }
    }

    /// How many characters of a stored id precede the part [`ScheduleFilter::id_contains`] is
    /// looked for in (the namespace's stored prefix; namespace names are ASCII).
    pub fn searched_from(&self) -> usize {
        self.namespace
            .as_deref()
            .and_then(sundial_core::namespace::stored_prefix)
            .map_or(0, |p| p.len())
    }

    /// Whether only the default namespace's schedules (ids without the separator) are kept.
    pub fn default_only(&self) -> bool {
        self.namespace.as_deref() == Some(sundial_core::namespace::DEFAULT_NAMESPACE)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SchedulePage {
    pub schedules: Vec<Schedule>,
    /// Pass as `after` for the next page; `None` on the last.
    pub next_cursor: Option<ScheduleId>,
}

impl SchedulePage {
    /// The page of at most `limit` schedules from rows read with `LIMIT limit + 1`: an extra
    /// row only says that a next page exists, and the cursor is the last schedule kept.
    pub fn from_overfetched(mut schedules: Vec<Schedule>, limit: usize) -> Self {
        let next_cursor = if schedules.len() > limit {
            schedules.truncate(limit);
            schedules.last().map(|s| s.id.clone())
        } else {
            None
        };
        SchedulePage {
            schedules,
            next_cursor,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FirePage {
    pub fires: Vec<FireRecord>,
    /// Pass as `before` for the next page; `None` on the last.
    pub next_cursor: Option<Timestamp>,
}

/// Why a schedule write did not happen.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum ScheduleError {
    #[error("no such schedule")]
    NotFound,
    #[error("a schedule with this id exists")]
    AlreadyExists,
    /// [`FireOp::expect_armed`] did not match: another tick is armed now (or none).
    #[error("stale tick: the schedule has moved on")]
    StaleTick { armed: Option<TaskId> },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Schedules, their fires, and the atomic fire operation. Time is always a parameter.
#[async_trait]
pub trait ScheduleStore: Send + Sync + 'static {
    /// Stores a new schedule and, when given, its first tick, atomically.
    async fn create_schedule(
        &self,
        schedule: NewSchedule,
    ) -> Result<(Schedule, Option<Task>), ScheduleError>;

    async fn get_schedule(&self, id: &ScheduleId) -> Result<Option<Schedule>, StoreError>;

    /// Schedules in id order, strictly after `after` when given, at most `limit`.
    async fn list_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError>;

    /// The schedules `filter` keeps ([`ScheduleFilter::matches`]: of one namespace, whose id
    /// contains a fragment, paused or not), in id order strictly after `after`, at most `limit`:
    /// a namespace's list and the search by a fragment of the id. One statement that stops at
    /// `limit` matches; no index serves a substring, so it walks the ids until then (within the
    /// namespace's range of ids, [`ScheduleFilter::id_range`], for a namespace other than the
    /// default one). The default pages through [`ScheduleStore::list_schedules`] (the reference
    /// the backends' queries follow); backends override it with one query.
    async fn search_schedules(
        &self,
        filter: &ScheduleFilter,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let mut after = after.cloned();
        let mut found = Vec::new();
        loop {
            let page = self.list_schedules(after.as_ref(), 500).await?;
            for s in page.schedules {
                if filter.matches(&s) {
                    found.push(s);
                    if found.len() > limit {
                        return Ok(SchedulePage::from_overfetched(found, limit));
                    }
                }
            }
            match page.next_cursor {
                Some(c) => after = Some(c),
                None => return Ok(SchedulePage::from_overfetched(found, limit)),
            }
        }
    }

    /// Replaces the definition and changes the arming, atomically.
    async fn update_schedule(
        &self,
        id: &ScheduleId,
        def: ScheduleDef,
        arm: ArmChange,
        now: Timestamp,
    ) -> Result<(Schedule, Option<Task>), ScheduleError>;

    /// Pauses or unpauses with a note (the tick stays armed: fires while paused are recorded as
    /// skipped).
    async fn set_paused(
        &self,
        id: &ScheduleId,
        paused: bool,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<Schedule, ScheduleError>;

    /// Deletes the schedule and its fire records and cancels its armed tick if still scheduled.
    /// Tasks already created by its fires are left alone.
    async fn delete_schedule(&self, id: &ScheduleId, now: Timestamp) -> Result<(), ScheduleError>;

    /// Records fires, creates their tasks and changes the arming in one transaction.
    async fn fire(&self, op: FireOp) -> Result<FireApplied, ScheduleError>;

    /// Several [`fire`](ScheduleStore::fire) ops (of different schedules, typically the ticks
    /// that came due together), each exactly as `fire` would apply it, answered in op order.
    /// Each op stands alone: one that is refused (stale, not found) or fails leaves no trace and
    /// does not affect the others. A backend commits them together where it can (one
    /// transaction, one fsync); the default applies them one after another.
    async fn fire_many(&self, ops: Vec<FireOp>) -> Vec<Result<FireApplied, ScheduleError>> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(self.fire(op).await);
        }
        out
    }

    /// What the runner reads before firing the ticks of `ids`: each schedule that exists (in any
    /// order) with the state of its previous fire's task (`last_task`; `None` when it has none or
    /// the task row is gone), read together in one snapshot.
    async fn schedules_for_fire(
        &self,
        ids: &[ScheduleId],
    ) -> Result<Vec<(Schedule, Option<LastTask>)>, StoreError>;

    /// Schedules that are armed (`next_fire_at` set) but whose armed tick is no longer live:
    /// its task row is gone or terminal (cancelled through the task API, dead, or completed
    /// without having fired). Nothing would ever fire them again; the runner re-arms them. In id
    /// order, strictly after `after` when given, at most `limit`.
    async fn stranded_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError>;

    /// Fire records of a schedule, newest nominal time first, strictly before `before` when
    /// given, at most `limit`.
    async fn list_fires(
        &self,
        id: &ScheduleId,
        before: Option<Timestamp>,
        limit: usize,
    ) -> Result<FirePage, StoreError>;

    /// Deletes up to `limit` fire records recorded before `before` (retention); the schedules'
    /// counters, which are kept on the schedule rows, do not change. Returns how many went.
    async fn purge_fires(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError>;
}
