//! [`ScheduleStore`] on PostgreSQL: tables `schedules` and `schedule_fires` (migration 3), with
//! the semantics of the SQLite implementation.
//!
//! Every write is one transaction. Writes that depend on a schedule's current row (`fire`,
//! `update_schedule`, `delete_schedule`) first lock that row (`SELECT … FOR UPDATE`, or the
//! `DELETE` itself), so the writes of one schedule run one after another and each sees the row
//! its predecessor committed: of several fires of one armed tick, one commits and the others find
//! another tick armed (`StaleTick`). Fire records are only ever written under that lock, so
//! "is this nominal time recorded?" is answered by a read inside it; the primary key
//! `(schedule_id, nominal_at)` would refuse a second record even so (the whole op would roll
//! back, and the tick run again). The fire's task and the next tick are inserted with
//! [`PostgresStore::insert_in`] in the same transaction, so everything an op writes commits or
//! rolls back together. Schedule ids are `text COLLATE "C"`: listed in byte order, as in SQLite.
//! `fire_many` runs its ops in transactions of up to `FIRE_CHUNK` ops, sorted by schedule id (rows
//! locked in one order, so concurrent batches cannot deadlock), each op inside a savepoint.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use sundial_core::schedule::{ScheduleDef, ScheduleId};
use sundial_core::{ExecutionId, NewTask, Task, TaskId, Timestamp};
use sundial_store::audit_scope;
use sundial_store::{
    ArmChange, FireApplied, FireCounts, FireOp, FireOutcome, FirePage, FireReason, FireRecord,
    FireResult, Inserted, LastTask, NewSchedule, Schedule, ScheduleError, ScheduleFilter,
    SchedulePage, ScheduleStore, StoreError, TickCompletions,
};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::rows::{col, col_u32, parse_state};
use crate::{PostgresStore, limit_param, pg, query, query_opt, query_planned_per_call};

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

fn schedule_id(s: String) -> Result<ScheduleId, StoreError> {
    ScheduleId::new(s).map_err(|e| corrupt("schedule id", e))
}

fn count(r: &Row, idx: usize, what: &str) -> Result<u64, StoreError> {
    let n: i64 = col(r, idx)?;
    u64::try_from(n).map_err(|_| corrupt(what, format!("{n} is negative")))
}

fn schedule_from_row(r: &Row) -> Result<Schedule, StoreError> {
    let def: String = col(r, 1)?;
    let def: ScheduleDef = serde_json::from_str(&def).map_err(|e| corrupt("schedule def", e))?;
    Ok(Schedule {
        id: schedule_id(col(r, 0)?)?,
        def,
        paused: col(r, 2)?,
        note: col(r, 3)?,
        next_fire_at: col::<Option<i64>>(r, 4)?.map(Timestamp),
        armed_tick: col::<Option<Uuid>>(r, 5)?.map(TaskId),
        last_task: col::<Option<Uuid>>(r, 6)?.map(TaskId),
        last_fire_at: col::<Option<i64>>(r, 7)?.map(Timestamp),
        counts: FireCounts {
            fired: count(r, 8, "fired")?,
            skipped: count(r, 9, "skipped")?,
            missed: count(r, 10, "missed")?,
        },
        created_at: Timestamp(col(r, 11)?),
        updated_at: Timestamp(col(r, 12)?),
    })
}

fn fire_from_row(r: &Row) -> Result<FireRecord, StoreError> {
    let outcome: String = col(r, 2)?;
    let reason: String = col(r, 3)?;
    Ok(FireRecord {
        schedule_id: schedule_id(col(r, 0)?)?,
        nominal: Timestamp(col(r, 1)?),
        outcome: FireOutcome::parse(&outcome).ok_or_else(|| corrupt("fire outcome", &outcome))?,
        reason: FireReason::parse(&reason).ok_or_else(|| corrupt("fire reason", &reason))?,
        task_id: col::<Option<Uuid>>(r, 4)?.map(TaskId),
        count: count(r, 5, "fire count")?,
        through: col::<Option<i64>>(r, 6)?.map(Timestamp),
        recorded_at: Timestamp(col(r, 7)?),
    })
}

fn def_json(def: &ScheduleDef) -> Result<String, StoreError> {
    serde_json::to_string(def).map_err(|e| StoreError::encode("schedule definition", e))
}

/// What an [`ArmChange`] did: the new `(next_fire_at, armed_tick)` to store (`None`: keep), and
/// the tick it inserted.
struct Armed {
    set: Option<(Option<i64>, Option<Uuid>)>,
    tick: Option<Task>,
}

/// Where the result of one [`sundial_store::NewFire`] comes from.
enum Slot {
    /// Recorded by an earlier op.
    Existing(FireRecord),
    /// Recorded by this op: index into its new fires.
    New(usize),
    /// A repeat, within this op, of the new fire at this index.
    Repeat(usize),
}

impl PostgresStore {
    /// Inserts one task in `tx`; a live task holding its key is an error (ticks have no key).
    async fn insert_tick(
        &self,
        tx: &impl GenericClient,
        tick: &NewTask,
    ) -> Result<Task, StoreError> {
        match self.insert_in(tx, std::slice::from_ref(tick)).await?.pop() {
            Some(Inserted::Created(t)) => Ok(*t),
            Some(Inserted::Duplicate { existing }) => {
                Err(StoreError::InternalKeyTaken { existing })
            }
            None => Err(StoreError::NoRow {
                what: "tick insert",
            }),
        }
    }

    /// Cancels a superseded tick, unless it already left `scheduled` (a running tick is the one
    /// firing; it finishes on its own).
    async fn cancel_tick(
        &self,
        tx: &impl GenericClient,
        tick: TaskId,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        query(tx, &self.sql.schedules.cancel_tick, &[&tick.0, &now.0]).await?;
        Ok(())
    }

    async fn apply_arm(
        &self,
        tx: &impl GenericClient,
        current: Option<TaskId>,
        arm: ArmChange,
        now: Timestamp,
    ) -> Result<Armed, StoreError> {
        match arm {
            ArmChange::Keep => Ok(Armed {
                set: None,
                tick: None,
            }),
            ArmChange::Disarm => {
                if let Some(t) = current {
                    self.cancel_tick(tx, t, now).await?;
                }
                Ok(Armed {
                    set: Some((None, None)),
                    tick: None,
                })
            }
            ArmChange::Arm(a) => {
                if let Some(t) = current
                    && t != a.tick.id
                {
                    self.cancel_tick(tx, t, now).await?;
                }
                let tick = self.insert_tick(tx, &a.tick).await?;
                Ok(Armed {
                    set: Some((Some(a.nominal.0), Some(tick.id.0))),
                    tick: Some(tick),
                })
            }
        }
    }

    /// Locks the schedule's row for the rest of the transaction and returns it.
    async fn lock_schedule(
        &self,
        tx: &impl GenericClient,
        id: &ScheduleId,
    ) -> Result<Schedule, ScheduleError> {
        match query_opt(tx, &self.sql.schedules.lock, &[&id.as_str()]).await? {
            Some(r) => Ok(schedule_from_row(&r)?),
            None => Err(ScheduleError::NotFound),
        }
    }

    /// One fire op and its tick's success ([`FireOp::complete_tick`]), in `tx`.
    async fn fire_in(
        &self,
        tx: &impl GenericClient,
        op: FireOp,
    ) -> Result<FireApplied, ScheduleError> {
        let now = op.now;
        let (mut applied, tick) = self.fire_op(tx, op).await?;
        if let Some(tick) = tick {
            applied.tick_completed = !self.complete_ticks(tx, &[tick], now).await?.is_empty();
        }
        Ok(applied)
    }

    /// Records the success of running ticks (id, execution) at `now`, as `complete` would, in
    /// one statement (a fire chunk's ticks together, after its ops: schedule rows, then tick
    /// rows, the order every writer of both takes). Returns the ticks it recorded; one no
    /// longer running under its execution is left alone.
    async fn complete_ticks(
        &self,
        tx: &impl GenericClient,
        ticks: &[(TaskId, ExecutionId)],
        now: Timestamp,
    ) -> Result<HashSet<TaskId>, StoreError> {
        if ticks.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = format!(
            "UPDATE {s}.tasks t SET state = 'succeeded', result = NULL, updated_at = $3, \
             finished_at = $3, lease_expires_at = NULL \
             FROM unnest($1::uuid[], $2::uuid[]) AS c(id, execution) \
             WHERE t.id = c.id AND t.state = 'running' AND t.execution_id = c.execution \
             RETURNING t.id",
            s = self.schema.ident
        );
        let ids: Vec<Uuid> = ticks.iter().map(|(t, _)| t.0).collect();
        let executions: Vec<Uuid> = ticks.iter().map(|(_, e)| e.0).collect();
        query(tx, &sql, &[&ids, &executions, &now.0])
            .await?
            .iter()
            .map(|r| col::<Uuid>(r, 0).map(TaskId))
            .collect()
    }

    /// One fire op, without its tick's success: the tick to record as succeeded, when the op
    /// asks for it, comes back for the caller to write ([`Self::complete_ticks`]).
    #[allow(clippy::type_complexity)]
    async fn fire_op(
        &self,
        tx: &impl GenericClient,
        op: FireOp,
    ) -> Result<(FireApplied, Option<(TaskId, ExecutionId)>), ScheduleError> {
        let sql = &self.sql.schedules;
        let id = op.schedule_id.as_str();
        let current = self.lock_schedule(tx, &op.schedule_id).await?;
        if let Some(expect) = op.expect_armed
            && current.armed_tick != Some(expect)
        {
            return Err(ScheduleError::StaleTick {
                armed: current.armed_tick,
            });
        }
        let complete_tick = op.expect_armed.zip(op.complete_tick);

        // Which fires are recorded already (under the row lock, nobody else records any).
        let nominals: Vec<i64> = op.fires.iter().map(|f| f.nominal.0).collect();
        let mut existing: HashMap<i64, FireRecord> = HashMap::new();
        if !nominals.is_empty() {
            for r in query(tx, &sql.existing_fires, &[&id, &nominals]).await? {
                let f = fire_from_row(&r)?;
                existing.insert(f.nominal.0, f);
            }
        }
        let mut slots = Vec::with_capacity(op.fires.len());
        let mut new_fires = Vec::new();
        let mut new_at: HashMap<i64, usize> = HashMap::new();
        for f in op.fires {
            let n = f.nominal.0;
            if let Some(r) = existing.get(&n) {
                slots.push(Slot::Existing(r.clone()));
            } else if let Some(&i) = new_at.get(&n) {
                slots.push(Slot::Repeat(i));
            } else {
                new_at.insert(n, new_fires.len());
                slots.push(Slot::New(new_fires.len()));
                new_fires.push(f);
            }
        }

        // Their tasks, in one insert.
        let mut tasks: Vec<NewTask> = Vec::new();
        let mut task_of: Vec<Option<usize>> = Vec::with_capacity(new_fires.len());
        for f in &mut new_fires {
            task_of.push(f.task.take().map(|t| {
                tasks.push(t);
                tasks.len() - 1
            }));
        }
        let mut inserted: Vec<Option<Inserted>> = if tasks.is_empty() {
            Vec::new()
        } else {
            self.insert_in(tx, &tasks)
                .await?
                .into_iter()
                .map(Some)
                .collect()
        };

        // Their records, in one insert.
        let (mut fired, mut skipped, mut missed) = (0i64, 0i64, 0i64);
        let mut last_task: Option<TaskId> = None;
        let mut last_fire: Option<i64> = None;
        let mut records: Vec<(FireRecord, Option<Box<Task>>)> = Vec::with_capacity(new_fires.len());
        for (f, t) in new_fires.iter().zip(&task_of) {
            let (task_id, task) = match t.and_then(|i| inserted[i].take()) {
                Some(Inserted::Created(t)) => (Some(t.id), Some(t)),
                Some(Inserted::Duplicate { existing }) => (Some(existing), None),
                None => (None, None),
            };
            let n = i64::try_from(f.count.max(1)).unwrap_or(i64::MAX);
            match f.outcome {
                FireOutcome::Fired => fired = fired.saturating_add(n),
                FireOutcome::Skipped => skipped = skipped.saturating_add(n),
                FireOutcome::Missed => missed = missed.saturating_add(n),
            }
            if task_id.is_some() {
                last_task = task_id;
            }
            let latest = f.through.unwrap_or(f.nominal).0;
            last_fire = Some(last_fire.map_or(latest, |l| l.max(latest)));
            records.push((
                FireRecord {
                    schedule_id: op.schedule_id.clone(),
                    nominal: f.nominal,
                    outcome: f.outcome,
                    reason: f.reason,
                    task_id,
                    count: n as u64,
                    through: f.through,
                    recorded_at: op.now,
                },
                task,
            ));
        }
        if !records.is_empty() {
            let nominal: Vec<i64> = records.iter().map(|(r, _)| r.nominal.0).collect();
            let outcome: Vec<&str> = records.iter().map(|(r, _)| r.outcome.as_str()).collect();
            let reason: Vec<&str> = records.iter().map(|(r, _)| r.reason.as_str()).collect();
            let task_id: Vec<Option<Uuid>> = records
                .iter()
                .map(|(r, _)| r.task_id.map(|t| t.0))
                .collect();
            let counts: Vec<i64> = records
                .iter()
                .map(|(r, _)| i64::try_from(r.count).unwrap_or(i64::MAX))
                .collect();
            let through: Vec<Option<i64>> = records
                .iter()
                .map(|(r, _)| r.through.map(|t| t.0))
                .collect();
            query(
                tx,
                &sql.insert_fires,
                &[
                    &id, &nominal, &outcome, &reason, &task_id, &counts, &through, &op.now.0,
                ],
            )
            .await?;
        }

        let armed = self
            .apply_arm(tx, current.armed_tick, op.arm, op.now)
            .await?;
        let (set, next, tick) = match armed.set {
            Some((next, tick)) => (true, next, tick),
            None => (false, None, None),
        };
        let row = query_opt(
            tx,
            &sql.after_fire,
            &[
                &id,
                &fired,
                &skipped,
                &missed,
                &last_task.map(|t| t.0),
                &last_fire,
                &op.now.0,
                &set,
                &next,
                &tick,
            ],
        )
        .await?
        .ok_or(ScheduleError::NotFound)?;
        let schedule = schedule_from_row(&row)?;

        let fires = slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Existing(r) => FireResult::AlreadyRecorded(r),
                Slot::New(i) => FireResult::Recorded {
                    record: records[i].0.clone(),
                    task: records[i].1.take(),
                },
                Slot::Repeat(i) => FireResult::AlreadyRecorded(records[i].0.clone()),
            })
            .collect();
        Ok((
            FireApplied {
                schedule,
                fires,
                tick: armed.tick.map(Box::new),
                tick_completed: false,
            },
            complete_tick,
        ))
    }
}

/// Fire ops per transaction in [`ScheduleStore::fire_many`]: bounds how long one transaction
/// holds its schedule rows locked.
const FIRE_CHUNK: usize = 64;

impl PostgresStore {
    /// `ops` (sorted by schedule id) in one transaction, each inside its own savepoint. `Err`:
    /// the transaction did not start or commit, so none of them happened.
    async fn fire_chunk(
        &self,
        ops: Vec<FireOp>,
    ) -> Result<Vec<Result<FireApplied, ScheduleError>>, ScheduleError> {
        let mut client = self.client().await?;
        let mut tx = client.transaction().await.map_err(pg)?;
        let mut out = Vec::with_capacity(ops.len());
        let mut ticks = TickCompletions::default();
        for op in ops {
            let now = op.now;
            let sp = tx.savepoint("fire").await.map_err(pg)?;
            let r = match self.fire_op(&sp, op).await {
                Ok((applied, tick)) => match sp.commit().await {
                    Ok(()) => {
                        ticks.push(now, tick);
                        Ok(applied)
                    }
                    Err(e) => {
                        ticks.push(now, None);
                        Err(pg(e).into())
                    }
                },
                Err(e) => {
                    sp.rollback().await.map_err(pg)?;
                    ticks.push(now, None);
                    Err(e)
                }
            };
            out.push(r);
        }
        // The ticks' successes, together after the ops.
        let mut done = HashSet::new();
        for (now, group) in ticks.groups() {
            done.extend(self.complete_ticks(&tx, group, *now).await?);
        }
        ticks.answer(&mut out, &done);
        tx.commit().await.map_err(pg)?;
        Ok(out)
    }
}

impl PostgresStore {
    /// Schedules in id order after `after` from `sql` (parameters: after, limit), one page.
    async fn schedule_page(
        &self,
        sql: &str,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let after = after.map_or("", |a| a.as_str());
        let client = self.client().await?;
        let rows = query(
            &client,
            sql,
            &[&after, &limit_param(limit.saturating_add(1))],
        )
        .await?;
        let schedules = rows
            .iter()
            .map(schedule_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SchedulePage::from_overfetched(schedules, limit))
    }
}

#[async_trait]
impl ScheduleStore for PostgresStore {
    async fn create_schedule(
        &self,
        s: NewSchedule,
    ) -> Result<(Schedule, Option<Task>), ScheduleError> {
        let def = def_json(&s.def)?;
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let id = s.id.as_str();
        let Some(row) = query_opt(
            &tx,
            &self.sql.schedules.create,
            &[&id, &def, &s.paused, &s.note, &s.now.0],
        )
        .await?
        else {
            return Err(ScheduleError::AlreadyExists);
        };
        let mut schedule = schedule_from_row(&row)?;
        let arm = s.arm.map_or(ArmChange::Keep, ArmChange::arm);
        let armed = self.apply_arm(&tx, None, arm, s.now).await?;
        if let Some((next, tick)) = armed.set {
            let row = query_opt(&tx, &self.sql.schedules.set_arm, &[&id, &next, &tick])
                .await?
                .ok_or(ScheduleError::NotFound)?;
            schedule = schedule_from_row(&row)?;
        }
        self.commit_audited(tx, audit).await?;
        Ok((schedule, armed.tick))
    }

    async fn get_schedule(&self, id: &ScheduleId) -> Result<Option<Schedule>, StoreError> {
        let client = self.client().await?;
        query_opt(&client, &self.sql.schedules.get, &[&id.as_str()])
            .await?
            .map(|r| schedule_from_row(&r))
            .transpose()
    }

    async fn list_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        self.schedule_page(&self.sql.schedules.list, after, limit)
            .await
    }

    async fn search_schedules(
        &self,
        filter: &ScheduleFilter,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let (after, end) = filter.id_range(after);
        let from = i32::try_from(filter.searched_from() + 1).unwrap_or(i32::MAX);
        let mut client = self.client().await?;
        let rows = query_planned_per_call(
            &mut client,
            &self.sql.schedules.search,
            &[
                &after,
                &limit_param(limit.saturating_add(1)),
                &filter.id_contains,
                &filter.paused,
                &from,
                &end,
                &filter.default_only(),
            ],
        )
        .await?;
        let schedules = rows
            .iter()
            .map(schedule_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SchedulePage::from_overfetched(schedules, limit))
    }

    async fn update_schedule(
        &self,
        id: &ScheduleId,
        def: ScheduleDef,
        arm: ArmChange,
        now: Timestamp,
    ) -> Result<(Schedule, Option<Task>), ScheduleError> {
        let def = def_json(&def)?;
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let current = self.lock_schedule(&tx, id).await?;
        let armed = self.apply_arm(&tx, current.armed_tick, arm, now).await?;
        let (set, next, tick) = match armed.set {
            Some((next, tick)) => (true, next, tick),
            None => (false, None, None),
        };
        let row = query_opt(
            &tx,
            &self.sql.schedules.update_def,
            &[&id.as_str(), &def, &now.0, &set, &next, &tick],
        )
        .await?
        .ok_or(ScheduleError::NotFound)?;
        let schedule = schedule_from_row(&row)?;
        self.commit_audited(tx, audit).await?;
        Ok((schedule, armed.tick))
    }

    async fn set_paused(
        &self,
        id: &ScheduleId,
        paused: bool,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<Schedule, ScheduleError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let Some(row) = query_opt(
            &tx,
            &self.sql.schedules.set_paused,
            &[&id.as_str(), &paused, &note, &now.0],
        )
        .await?
        else {
            return Err(ScheduleError::NotFound);
        };
        let schedule = schedule_from_row(&row)?;
        self.commit_audited(tx, audit).await?;
        Ok(schedule)
    }

    async fn delete_schedule(&self, id: &ScheduleId, now: Timestamp) -> Result<(), ScheduleError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let Some(row) = query_opt(&tx, &self.sql.schedules.delete, &[&id.as_str()]).await? else {
            return Err(ScheduleError::NotFound);
        };
        if let Some(tick) = col::<Option<Uuid>>(&row, 0)? {
            self.cancel_tick(&tx, TaskId(tick), now).await?;
        }
        query(&tx, &self.sql.schedules.delete_fires, &[&id.as_str()]).await?;
        self.commit_audited(tx, audit).await?;
        Ok(())
    }

    async fn fire(&self, op: FireOp) -> Result<FireApplied, ScheduleError> {
        // A manual trigger or backfill carries its request's record when it recorded a fire
        // (or armed a tick); the schedule loop runs outside any request and carries none.
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let applied = self.fire_in(&tx, op).await?;
        let changed = applied.tick.is_some()
            || applied
                .fires
                .iter()
                .any(|f| matches!(f, FireResult::Recorded { .. }));
        self.commit_audited(tx, audit.filter(|_| changed)).await?;
        Ok(applied)
    }

    /// Transactions of up to [`FIRE_CHUNK`] ops, each op inside its own savepoint. The schedule
    /// rows are locked in id order (ops sorted by schedule id), so two batches that share
    /// schedules cannot deadlock; answers come back in the callers' order.
    async fn fire_many(&self, ops: Vec<FireOp>) -> Vec<Result<FireApplied, ScheduleError>> {
        let n = ops.len();
        let mut order: Vec<(usize, FireOp)> = ops.into_iter().enumerate().collect();
        order.sort_by(|a, b| a.1.schedule_id.as_str().cmp(b.1.schedule_id.as_str()));
        let mut out: Vec<Option<Result<FireApplied, ScheduleError>>> =
            (0..n).map(|_| None).collect();
        let mut order = order.into_iter().peekable();
        while order.peek().is_some() {
            let chunk: Vec<(usize, FireOp)> = order.by_ref().take(FIRE_CHUNK).collect();
            let idx: Vec<usize> = chunk.iter().map(|(i, _)| *i).collect();
            match self
                .fire_chunk(chunk.into_iter().map(|(_, op)| op).collect())
                .await
            {
                Ok(results) => {
                    for (i, r) in idx.into_iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
                Err(e) => {
                    for i in idx {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::NoRow { what: "a fire op" }.into())))
            .collect()
    }

    async fn schedules_for_fire(
        &self,
        ids: &[ScheduleId],
    ) -> Result<Vec<(Schedule, Option<LastTask>)>, StoreError> {
        let ids: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
        let client = self.client().await?;
        let n = self.sql.schedules.columns;
        query(&client, &self.sql.schedules.for_fire, &[&ids])
            .await?
            .iter()
            .map(|r| {
                let schedule = schedule_from_row(r)?;
                let last = match col::<Option<Uuid>>(r, n)? {
                    Some(id) => Some(LastTask {
                        id: TaskId(id),
                        state: parse_state(&col::<String>(r, n + 1)?)?,
                        attempt: col_u32(r, n + 2, "attempt")?,
                    }),
                    None => None,
                };
                Ok((schedule, last))
            })
            .collect()
    }

    async fn stranded_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        self.schedule_page(&self.sql.schedules.stranded, after, limit)
            .await
    }

    async fn list_fires(
        &self,
        id: &ScheduleId,
        before: Option<Timestamp>,
        limit: usize,
    ) -> Result<FirePage, StoreError> {
        let client = self.client().await?;
        let rows = query(
            &client,
            &self.sql.schedules.list_fires,
            &[
                &id.as_str(),
                &before.map_or(i64::MAX, |b| b.0),
                &limit_param(limit.saturating_add(1)),
            ],
        )
        .await?;
        let mut fires = rows
            .iter()
            .map(fire_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if fires.len() > limit {
            fires.truncate(limit);
            fires.last().map(|f| f.nominal)
        } else {
            None
        };
        Ok(FirePage { fires, next_cursor })
    }

    async fn purge_fires(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let sql = format!(
            "DELETE FROM {s}.schedule_fires f USING (SELECT schedule_id, nominal_at \
             FROM {s}.schedule_fires WHERE recorded_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED) d \
             WHERE f.schedule_id = d.schedule_id AND f.nominal_at = d.nominal_at",
            s = self.schema.ident
        );
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        client
            .execute(&stmt, &[&before.0, &limit_param(limit)])
            .await
            .map_err(pg)
    }
}
