//! # sundial-schedules
//!
//! Recurring schedules on top of the Sundial engine: cron (with seconds, IANA time zones and DST
//! policies) and fixed intervals, each fire creating one task, with overlap and catch-up policies,
//! jitter, start and end times, pause with a note, trigger now, backfill and preview.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use sundial::Sundial;
//! use sundial_schedules::{CreateSchedule, ScheduleDef, ScheduleSpec, Schedules, TaskTemplate};
//!
//! let sundial = Sundial::open("./sundial-data").await?;
//! let schedules = Schedules::attach(&sundial)?; // before start: registers the tick handler
//! let running = sundial.start();
//! schedules.recover().await?;
//! let def = ScheduleDef::new(
//!     ScheduleSpec::cron("0 10 * * *").timezone("Asia/Shanghai"),
//!     TaskTemplate::new("report.daily"),
//! );
//! let s = schedules.create(CreateSchedule::new(def)).await?;
//! println!("next at {:?}", s.next_fire_at);
//! # Ok(()) }
//! ```
//!
//! ## How a schedule fires (no polling)
//!
//! A schedule is armed by one *tick*: an ordinary kernel task (queue
//! [`TICK_QUEUE`](sundial_store::TICK_QUEUE), kind [`TICK_KIND`](sundial_store::TICK_KIND)) due at
//! the next nominal fire time plus its jitter. The engine's shard loops wake for it like for any
//! task, and run it on this crate's in-process handler, which performs the store's atomic
//! [`fire`](sundial_store::ScheduleStore::fire): record the fire, create its task, arm the next
//! tick and record the tick's own success, all in one transaction and only if this tick is still
//! the armed one (the handler then tells the engine, through `TaskContext::recorded`, that the
//! tick's success is written). 100,000 schedules
//! are 100,000 rows and 100,000 scheduled ticks, never 100,000 timers. Ticks that come due
//! together are fired in batches: one read of their schedules, one
//! [`fire_many`](sundial_store::ScheduleStore::fire_many) in which each tick's op is applied as
//! `fire` would apply it, on its own.
//!
//! - **Exactly once.** The fire record is unique per (schedule, nominal time), and the operation
//!   is conditional on the armed tick. A crash before its commit leaves the tick to run again (its
//!   lease expires, the reaper reschedules it); after it the tick has ended with its fire, and a
//!   second run of it (one that took the tick again after its lease ran out, before the commit)
//!   is refused as stale. A fire is neither lost nor doubled.
//! - **The fire's task** has the key `schedule:<id>@<nominal RFC 3339>`
//!   ([`FireKey`](sundial_core::schedule::FireKey)), which carries the schedule id and the nominal
//!   time; it is due when the tick ran.
//! - **Overlap** is judged from the previous fire's task (the schedule's `last_task`): it is
//!   still in progress while it is not terminal (scheduled for a retry counts). `skip` records
//!   the fire as skipped; `buffer_one` and `buffer_all` create it with the exclusive key
//!   `schedule:<id>` (mode wait) so it starts when the previous one stops running (`buffer_one`
//!   skips when a created task has not started yet); `allow_all` always creates; `cancel_other`
//!   cancels the previous task first.
//! - **Catch-up.** A tick that runs more than the catch-up window after its due time (the process
//!   was down) records its fire, and every later fire time that is equally late, as *missed*,
//!   oldest first, and arms the first fire time still inside the window: those then run once
//!   each, one after another (one fire per transaction: no storm). At most
//!   [`MISSED_INDIVIDUALLY`] missed fires are recorded one by one per tick; the rest of the run
//!   is one record with a count, and a tick walks at most [`MISSED_WALK_LIMIT`] fire times
//!   before handing the rest to a follow-up tick.
//! - **Pause** keeps the tick chain going: fires while paused are recorded as skipped (paused).
//!   **Trigger** and **backfill** fire outside the chain (they never touch the armed tick) and
//!   follow the overlap policy; a nominal time already recorded is left alone.
//! - **Re-arming.** A schedule whose armed tick is no longer live (cancelled through the task
//!   API, dead, gone) is found by a sweep (when attached, in [`Schedules::recover`], then every
//!   idle interval of the engine) and re-armed: a fresh tick for the same fire time, or, when
//!   that time has passed, the fire its tick would have made, late (catch-up applies).
//!
//! **API Boundary:** this crate talks to the engine only through the [`Sundial`] facade
//! (`register`, `get`, `cancel`, `notify_task`, `poll`, `complete`, `clock`, `config`) and to
//! storage only through [`ScheduleStore`].

mod error;
mod rearm;
mod tick;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sundial::{HandlerError, Sundial, Task, TaskId, Timestamp};
use sundial_core::schedule::SpecErrorKind;
use sundial_store::{ArmChange, FireOp, FireResult, NewSchedule, ScheduleStore};
use tick::TickEnd;
use tokio::sync::mpsc;

pub use error::Error;
pub use sundial_core::schedule::{
    CompiledSpec, DstPolicy, FireKey, OverlapPolicy, Recurrence, RepeatedTime, ScheduleDef,
    ScheduleId, ScheduleSpec, SkippedTime, SpecError, TaskTemplate,
};
pub use sundial_store::{
    FireCounts, FireOutcome, FirePage, FireReason, FireRecord, Schedule, ScheduleFilter,
    SchedulePage, TICK_KIND, TICK_QUEUE,
};

/// Most fire times one preview returns.
pub const MAX_PREVIEW: usize = 1_000;
/// Most fire times one backfill covers.
pub const MAX_BACKFILL: usize = 1_000;
/// Missed fires recorded one by one per tick; the rest of a run is collapsed into one record.
pub const MISSED_INDIVIDUALLY: usize = 100;
/// Most missed fire times one tick walks before a follow-up tick takes over.
pub const MISSED_WALK_LIMIT: usize = 100_000;

/// What [`Schedules::create`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSchedule {
    /// Chosen by the caller, or a fresh UUIDv7 when `None`.
    pub id: Option<ScheduleId>,
    pub def: ScheduleDef,
    pub paused: bool,
    pub note: Option<String>,
}

impl CreateSchedule {
    pub fn new(def: ScheduleDef) -> Self {
        CreateSchedule {
            id: None,
            def,
            paused: false,
            note: None,
        }
    }
    pub fn id(mut self, id: ScheduleId) -> Self {
        self.id = Some(id);
        self
    }
    pub fn paused(mut self, note: Option<String>) -> Self {
        self.paused = true;
        self.note = note;
        self
    }
}

/// What a backfill did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backfill {
    /// Fire times in the range, oldest first, as recorded now.
    pub recorded: Vec<FireRecord>,
    /// Fire times in the range that had been recorded before (left alone).
    pub already_recorded: Vec<Timestamp>,
}

/// The schedules runner and API. Cheap to clone.
#[derive(Clone)]
pub struct Schedules {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) sundial: Sundial,
    pub(crate) store: Arc<dyn ScheduleStore>,
    /// Where ticks wait for their batch (the batcher starts with the first tick).
    pub(crate) batcher: OnceLock<mpsc::UnboundedSender<tick::TickRequest>>,
    /// Compiled specs by spec: compiling a cron expression costs far more than evaluating it,
    /// and many schedules share an expression. Bounded by [`COMPILED_CACHE`] (cleared when
    /// full); only a cache, the definitions stay in the store.
    pub(crate) compiled: Mutex<HashMap<ScheduleSpec, CompiledSpec>>,
}

/// Most compiled specs kept in [`Inner::compiled`].
const COMPILED_CACHE: usize = 4_096;

impl Inner {
    /// `def` validated as [`ScheduleDef::validate`] does, with its spec compiled once and kept.
    pub(crate) fn validate(&self, def: &ScheduleDef) -> Result<CompiledSpec, SpecError> {
        let limits = &self.sundial.config().limits;
        def.validate_with(limits, |spec| {
            if let Some(c) = self.compiled.lock().ok().and_then(|m| m.get(spec).cloned()) {
                return Ok(c);
            }
            let c = spec.compile()?;
            if let Ok(mut m) = self.compiled.lock() {
                if m.len() >= COMPILED_CACHE {
                    m.clear();
                }
                m.insert(spec.clone(), c.clone());
            }
            Ok(c)
        })
    }
}

impl Schedules {
    /// Uses the schedule tables of `sundial`'s store and registers the tick handler. Call it
    /// before [`Sundial::start`], so that no tick is claimed without a handler.
    pub fn attach(sundial: &Sundial) -> Result<Self, Error> {
        let store = sundial
            .schedule_store()
            .cloned()
            .ok_or(Error::Unsupported)?;
        Ok(Self::with_store(sundial, store))
    }

    /// Like [`Schedules::attach`] with an explicit schedule store.
    pub fn with_store(sundial: &Sundial, store: Arc<dyn ScheduleStore>) -> Self {
        let inner = Arc::new(Inner {
            sundial: sundial.clone(),
            store,
            batcher: OnceLock::new(),
            compiled: Mutex::new(HashMap::new()),
        });
        let handler = inner.clone();
        // Ticks are claimed when due, not ahead (`Handler::claim_ahead`): a tick claimed ahead
        // by a process that then dies would hold its schedule until the tick's lease ends (its
        // 60 s timeout); claimed when due, that window is the tick's own run. Claiming ticks
        // ahead made no difference to a minute's burst (BENCHMARKS.md, "Claims ahead of the
        // due time").
        sundial.register(
            TICK_KIND,
            sundial::ClaimedWhenDue(move |ctx: sundial::TaskContext| {
                let inner = handler.clone();
                async move {
                    if inner.on_tick(&ctx.task).await? == TickEnd::CompletedByFire {
                        // The fire's transaction recorded the tick's success: the engine writes
                        // nothing more for it.
                        ctx.recorded.note();
                    }
                    Ok::<(), HandlerError>(())
                }
            }),
        );
        // Re-arming stranded schedules (see `rearm.rs`): now and on every idle interval. Outside
        // a runtime there is nothing to run it on; `recover` then does it once.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(rearm::sweep_loop(Arc::downgrade(&inner)));
        }
        Schedules { inner }
    }

    /// Re-arms stranded schedules (armed with a tick that is no longer live), then runs ticks
    /// that became `ready` while no tick handler was registered (a process that started the
    /// engine before attaching, or an older binary). Call after [`Sundial::start`]. Returns how
    /// many schedules it re-armed and ticks it ran.
    pub async fn recover(&self) -> Result<usize, Error> {
        let mut n = self.inner.rearm_stranded().await?;
        loop {
            let ticks = self
                .inner
                .sundial
                .poll(
                    TICK_QUEUE,
                    Some("sundial-schedules".into()),
                    Some(vec![TICK_KIND.to_string()]),
                    64,
                    Duration::ZERO,
                )
                .await?;
            if ticks.is_empty() {
                return Ok(n);
            }
            for t in ticks {
                let Some(exec) = t.execution_id else { continue };
                match self.inner.on_tick(&t).await {
                    Ok(TickEnd::CompletedByFire) => {}
                    Ok(TickEnd::ToComplete) => {
                        self.inner.sundial.complete(t.id, exec, None).await?;
                    }
                    Err(e) => {
                        self.inner.sundial.fail(t.id, exec, e.message, true).await?;
                    }
                }
                n += 1;
            }
        }
    }

    /// Validates and stores a schedule and arms its first fire (strictly after now, not before
    /// `start_at`). A schedule whose `end_at` has passed is stored without a fire.
    pub async fn create(&self, req: CreateSchedule) -> Result<Schedule, Error> {
        let inner = &self.inner;
        let spec = inner.validate(&req.def)?;
        let id = match req.id {
            Some(id) => id,
            None => ScheduleId::new(uuid::Uuid::now_v7().to_string())?,
        };
        let now = inner.sundial.clock().now();
        let first = req.def.next_nominal_after(&spec, now);
        let arm = match first {
            Some(n) => Some(inner.arm(&id, &req.def, n, now)?),
            None => None,
        };
        let (schedule, tick) = inner
            .store
            .create_schedule(NewSchedule {
                id,
                def: req.def,
                paused: req.paused,
                note: req.note,
                arm,
                now,
            })
            .await?;
        if let Some(t) = tick {
            inner.sundial.notify_task(&t);
        }
        Ok(schedule)
    }

    pub async fn get(&self, id: &ScheduleId) -> Result<Option<Schedule>, Error> {
        Ok(self.inner.store.get_schedule(id).await?)
    }

    /// Schedules in id order after `after`, at most `limit` (1 to 1,000).
    pub async fn list(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, Error> {
        Ok(self
            .inner
            .store
            .list_schedules(after, limit.clamp(1, 1_000))
            .await?)
    }

    /// The schedules `filter` keeps (of one namespace, whose id contains a fragment, paused or
    /// not), in id order after `after`, at most `limit` (1 to 1,000): one store query.
    pub async fn search(
        &self,
        filter: &ScheduleFilter,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, Error> {
        Ok(self
            .inner
            .store
            .search_schedules(filter, after, limit.clamp(1, 1_000))
            .await?)
    }

    /// Replaces the definition and re-arms: the next fire is the first fire time of the new
    /// definition strictly after now. The pause state is kept.
    pub async fn update(&self, id: &ScheduleId, def: ScheduleDef) -> Result<Schedule, Error> {
        let inner = &self.inner;
        let spec = inner.validate(&def)?;
        let now = inner.sundial.clock().now();
        let arm = match def.next_nominal_after(&spec, now) {
            Some(n) => ArmChange::arm(inner.arm(id, &def, n, now)?),
            None => ArmChange::Disarm,
        };
        let (schedule, tick) = inner.store.update_schedule(id, def, arm, now).await?;
        if let Some(t) = tick {
            inner.sundial.notify_task(&t);
        }
        Ok(schedule)
    }

    /// Deletes the schedule and its fire records; tasks it created are left alone.
    pub async fn delete(&self, id: &ScheduleId) -> Result<(), Error> {
        let now = self.inner.sundial.clock().now();
        Ok(self.inner.store.delete_schedule(id, now).await?)
    }

    /// Pauses: fires while paused are recorded as skipped (reason `paused`).
    pub async fn pause(&self, id: &ScheduleId, note: Option<String>) -> Result<Schedule, Error> {
        let now = self.inner.sundial.clock().now();
        Ok(self.inner.store.set_paused(id, true, note, now).await?)
    }

    pub async fn unpause(&self, id: &ScheduleId, note: Option<String>) -> Result<Schedule, Error> {
        let now = self.inner.sundial.clock().now();
        Ok(self.inner.store.set_paused(id, false, note, now).await?)
    }

    /// Fires now (nominal time = now), following the overlap policy, whether or not the schedule
    /// is paused. The armed fire is not affected.
    pub async fn trigger(&self, id: &ScheduleId) -> Result<FireRecord, Error> {
        let inner = &self.inner;
        let schedule = inner.store.get_schedule(id).await?.ok_or(Error::NotFound)?;
        let now = inner.sundial.clock().now();
        let fire = inner
            .decide(
                &schedule,
                inner.last_task(&schedule).await?,
                now,
                FireReason::Trigger,
                now,
            )
            .await?;
        let applied = inner
            .store
            .fire(FireOp {
                schedule_id: id.clone(),
                expect_armed: None,
                complete_tick: None,
                fires: vec![fire],
                arm: ArmChange::Keep,
                now,
            })
            .await?;
        inner.after_fire(&applied, now);
        applied
            .fires
            .into_iter()
            .next()
            .map(|r| match r {
                FireResult::Recorded { record, .. } | FireResult::AlreadyRecorded(record) => record,
            })
            .ok_or_else(|| Error::Store(sundial::StoreError::NoRow { what: "a fire" }))
    }

    /// Fires every fire time of the schedule in `[from, to]` (which must not lie in the future),
    /// oldest first, one after another; fire times recorded before are left alone. At most
    /// [`MAX_BACKFILL`] fire times. Start and end times and the pause state do not apply: a
    /// backfill is an explicit request.
    ///
    /// A backfill has its own overlap rule, `overlap`: `None` runs every backfilled fire
    /// ([`OverlapPolicy::AllowAll`]), since the fires of a backfill come one right after the
    /// other and under the schedule's own `skip` all but the first would be skipped as
    /// overlapping. `Some(policy)` applies that policy between the backfilled fires (and the
    /// schedule's task still in progress, if any).
    pub async fn backfill(
        &self,
        id: &ScheduleId,
        from: Timestamp,
        to: Timestamp,
        overlap: Option<OverlapPolicy>,
    ) -> Result<Backfill, Error> {
        let overlap = overlap.unwrap_or(OverlapPolicy::AllowAll);
        let inner = &self.inner;
        let schedule = inner.store.get_schedule(id).await?.ok_or(Error::NotFound)?;
        let spec = inner.validate(&schedule.def)?;
        let now = inner.sundial.clock().now();
        if to > now {
            return Err(Error::Invalid(SpecError::new(
                "to",
                SpecErrorKind::OutOfRange,
                "a backfill covers the past: `to` must not be after now",
            )));
        }
        if to < from {
            return Err(Error::Invalid(SpecError::new(
                "to",
                SpecErrorKind::Conflict,
                "must not be before `from`",
            )));
        }
        let times: Vec<Timestamp> = spec
            .fires_after(Timestamp(from.0.saturating_sub(1)))
            .take_while(|t| *t <= to)
            .take(MAX_BACKFILL + 1)
            .collect();
        if times.len() > MAX_BACKFILL {
            return Err(Error::Invalid(SpecError::new(
                "to",
                SpecErrorKind::OutOfRange,
                format!(
                    "the range holds more than {MAX_BACKFILL} fire times; backfill it in parts"
                ),
            )));
        }
        let mut out = Backfill::default();
        for nominal in times {
            // Re-read: the previous fire of this backfill changed `last_task`.
            let mut schedule = inner.store.get_schedule(id).await?.ok_or(Error::NotFound)?;
            schedule.def.overlap = overlap;
            let now = inner.sundial.clock().now();
            let fire = inner
                .decide(
                    &schedule,
                    inner.last_task(&schedule).await?,
                    nominal,
                    FireReason::Backfill,
                    now,
                )
                .await?;
            let applied = inner
                .store
                .fire(FireOp {
                    schedule_id: id.clone(),
                    expect_armed: None,
                    complete_tick: None,
                    fires: vec![fire],
                    arm: ArmChange::Keep,
                    now,
                })
                .await?;
            inner.after_fire(&applied, now);
            for r in applied.fires {
                match r {
                    FireResult::Recorded { record, .. } => out.recorded.push(record),
                    FireResult::AlreadyRecorded(r) => out.already_recorded.push(r.nominal),
                }
            }
        }
        Ok(out)
    }

    /// Fire records, newest first (pass the page's cursor as `before` for the next page).
    pub async fn fires(
        &self,
        id: &ScheduleId,
        before: Option<Timestamp>,
        limit: usize,
    ) -> Result<FirePage, Error> {
        Ok(self
            .inner
            .store
            .list_fires(id, before, limit.clamp(1, 1_000))
            .await?)
    }

    /// The next `n` nominal fire times of a stored schedule, starting with the armed one (empty
    /// once it has ended).
    pub fn upcoming(&self, schedule: &Schedule, n: usize) -> Vec<Timestamp> {
        let Some(first) = schedule.next_fire_at else {
            return Vec::new();
        };
        let Ok(spec) = self.inner.validate(&schedule.def) else {
            return vec![first];
        };
        let mut out = vec![first];
        while out.len() < n {
            match out
                .last()
                .and_then(|t| schedule.def.next_nominal_after(&spec, *t))
            {
                Some(t) => out.push(t),
                None => break,
            }
        }
        out.truncate(n);
        out
    }

    /// The first `count` (at most [`MAX_PREVIEW`]) fire times of `spec` at or after `from`,
    /// without storing anything.
    pub fn preview(
        spec: &ScheduleSpec,
        from: Timestamp,
        count: usize,
    ) -> Result<Vec<Timestamp>, SpecError> {
        if count == 0 || count > MAX_PREVIEW {
            return Err(SpecError::new(
                "count",
                SpecErrorKind::OutOfRange,
                format!("must be between 1 and {MAX_PREVIEW}"),
            ));
        }
        let compiled = spec.compile()?;
        Ok(compiled
            .fires_after(Timestamp(from.0.saturating_sub(1)))
            .take(count)
            .collect())
    }

    /// The task a fire created, when it still exists.
    pub async fn task(&self, id: TaskId) -> Result<Option<Task>, Error> {
        Ok(self.inner.sundial.get(id).await?)
    }
}
