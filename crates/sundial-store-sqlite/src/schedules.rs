//! [`ScheduleStore`] on SQLite: tables `schedules` and `schedule_fires` (schema migration 2).
//!
//! Every write runs as one job of the group-committing writer, so everything it does (the fire
//! record, the fire's task, the next tick, the counters) commits or rolls back together. The fire
//! record's primary key `(schedule_id, nominal_at)` makes a repeated fire a no-op. `fire_many`
//! sends its ops as jobs of up to `FIRE_CHUNK` ops that share a group commit. An op is refused
//! (stale, not found) before it writes anything, so a refusal leaves the rest of its job alone;
//! an op that fails part-way fails its whole job, whose ops are then applied one job each.

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sundial_core::schedule::{ScheduleDef, ScheduleId};
use sundial_core::{ExecutionId, Task, TaskId, Timestamp};
use sundial_store::{
    ArmChange, FireApplied, FireCounts, FireOp, FireOutcome, FirePage, FireReason, FireRecord,
    FireResult, Inserted, LastTask, NewSchedule, Schedule, ScheduleError, ScheduleFilter,
    SchedulePage, ScheduleStore, StoreError, TickCompletions,
};

use crate::{SqliteStore, backend, insert_many, rows};

const SCHEDULE_COLUMNS: &str = "id, def, paused, note, next_fire_at, armed_tick, last_task, \
    last_fire_at, fired, skipped, missed, created_at, updated_at";

const FIRE_COLUMNS: &str =
    "schedule_id, nominal_at, outcome, reason, task_id, count, through, recorded_at";

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

fn schedule_id(s: String) -> Result<ScheduleId, StoreError> {
    ScheduleId::new(s).map_err(|e| corrupt("schedule id", e))
}

fn opt_task_id(b: Option<Vec<u8>>) -> Result<Option<TaskId>, StoreError> {
    b.map(|b| rows::task_id(&b)).transpose()
}

fn schedule_from_row(r: &Row<'_>) -> Result<Schedule, StoreError> {
    let def: String = r.get(1).map_err(backend)?;
    let def: ScheduleDef = serde_json::from_str(&def).map_err(|e| corrupt("schedule def", e))?;
    let count = |i: usize| -> Result<u64, StoreError> {
        Ok(r.get::<_, i64>(i).map_err(backend)?.max(0) as u64)
    };
    Ok(Schedule {
        id: schedule_id(r.get(0).map_err(backend)?)?,
        def,
        paused: r.get::<_, i64>(2).map_err(backend)? != 0,
        note: r.get(3).map_err(backend)?,
        next_fire_at: r.get::<_, Option<i64>>(4).map_err(backend)?.map(Timestamp),
        armed_tick: opt_task_id(r.get(5).map_err(backend)?)?,
        last_task: opt_task_id(r.get(6).map_err(backend)?)?,
        last_fire_at: r.get::<_, Option<i64>>(7).map_err(backend)?.map(Timestamp),
        counts: FireCounts {
            fired: count(8)?,
            skipped: count(9)?,
            missed: count(10)?,
        },
        created_at: Timestamp(r.get(11).map_err(backend)?),
        updated_at: Timestamp(r.get(12).map_err(backend)?),
    })
}

fn fire_from_row(r: &Row<'_>) -> Result<FireRecord, StoreError> {
    let outcome: String = r.get(2).map_err(backend)?;
    let reason: String = r.get(3).map_err(backend)?;
    Ok(FireRecord {
        schedule_id: schedule_id(r.get(0).map_err(backend)?)?,
        nominal: Timestamp(r.get(1).map_err(backend)?),
        outcome: FireOutcome::parse(&outcome).ok_or_else(|| corrupt("fire outcome", &outcome))?,
        reason: FireReason::parse(&reason).ok_or_else(|| corrupt("fire reason", &reason))?,
        task_id: opt_task_id(r.get(4).map_err(backend)?)?,
        count: r.get::<_, i64>(5).map_err(backend)?.max(0) as u64,
        through: r.get::<_, Option<i64>>(6).map_err(backend)?.map(Timestamp),
        recorded_at: Timestamp(r.get(7).map_err(backend)?),
    })
}

fn load(conn: &Connection, id: &ScheduleId) -> Result<Option<Schedule>, StoreError> {
    let sql = format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = ?1");
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![id.as_str()], |r| Ok(schedule_from_row(r)))
        .optional()
        .map_err(backend)?
        .transpose()
}

fn must_load(conn: &Connection, id: &ScheduleId) -> Result<Schedule, ScheduleError> {
    load(conn, id)?.ok_or(ScheduleError::NotFound)
}

fn load_fire(
    conn: &Connection,
    id: &ScheduleId,
    nominal: Timestamp,
) -> Result<Option<FireRecord>, StoreError> {
    let sql = format!(
        "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = ?1 AND nominal_at = ?2"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    stmt.query_row(params![id.as_str(), nominal.0], |r| Ok(fire_from_row(r)))
        .optional()
        .map_err(backend)?
        .transpose()
}

/// Cancels a superseded tick, unless it already left `scheduled` (a running tick is the one
/// firing; it finishes on its own).
fn cancel_tick(conn: &Connection, tick: TaskId, now: Timestamp) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE tasks SET state = 'cancelled', updated_at = ?2, finished_at = ?2, \
         last_error = 'superseded: the schedule was re-armed or removed' \
         WHERE id = ?1 AND state = 'scheduled'",
    )
    .map_err(backend)?
    .execute(params![tick.as_bytes(), now.0])
    .map_err(backend)?;
    Ok(())
}

/// Applies an arming change: returns the new `(next_fire_at, armed_tick)` and the inserted tick.
/// `None` for the pair means "keep".
#[allow(clippy::type_complexity)]
fn apply_arm(
    conn: &Connection,
    current: Option<TaskId>,
    arm: ArmChange,
    now: Timestamp,
) -> Result<(Option<(Option<i64>, Option<TaskId>)>, Option<Task>), StoreError> {
    match arm {
        ArmChange::Keep => Ok((None, None)),
        ArmChange::Disarm => {
            if let Some(t) = current {
                cancel_tick(conn, t, now)?;
            }
            Ok((Some((None, None)), None))
        }
        ArmChange::Arm(a) => {
            if let Some(t) = current
                && t != a.tick.id
            {
                cancel_tick(conn, t, now)?;
            }
            let tick = match insert_many(conn, std::slice::from_ref(&a.tick))?.pop() {
                Some(Inserted::Created(t)) => *t,
                Some(Inserted::Duplicate { existing }) => {
                    return Err(StoreError::InternalKeyTaken { existing });
                }
                None => {
                    return Err(StoreError::NoRow {
                        what: "tick insert",
                    });
                }
            };
            Ok((Some((Some(a.nominal.0), Some(tick.id))), Some(tick)))
        }
    }
}

fn set_arm(
    conn: &Connection,
    id: &ScheduleId,
    armed: Option<(Option<i64>, Option<TaskId>)>,
) -> Result<(), StoreError> {
    if let Some((next, tick)) = armed {
        conn.prepare_cached(
            "UPDATE schedules SET next_fire_at = ?2, armed_tick = ?3 WHERE id = ?1",
        )
        .map_err(backend)?
        .execute(params![
            id.as_str(),
            next,
            tick.map(|t| t.as_bytes().to_vec())
        ])
        .map_err(backend)?;
    }
    Ok(())
}

fn def_json(def: &ScheduleDef) -> Result<String, StoreError> {
    serde_json::to_string(def).map_err(|e| StoreError::encode("schedule definition", e))
}

/// One fire op, with its tick's success ([`FireOp::complete_tick`]) written at once.
fn fire(conn: &Connection, op: FireOp) -> Result<FireApplied, ScheduleError> {
    let now = op.now;
    let (mut applied, tick) = fire_op(conn, op)?;
    if let Some(tick) = tick {
        applied.tick_completed = !complete_ticks(conn, &[tick], now)?.is_empty();
    }
    Ok(applied)
}

/// Most ticks one [`complete_ticks`] statement records; the statement always has this many
/// pairs (unused ones are `NULL` and match nothing), so it is prepared once.
const TICKS_PER_STATEMENT: usize = FIRE_CHUNK;

/// Records the success of running ticks (id, execution) at `now`, as `complete` would, in as
/// few statements as there are [`TICKS_PER_STATEMENT`]s: the ticks a fire job ends are written
/// together at its end rather than one statement per op (each statement inside the job's
/// savepoint costs a walk of the job's growing sub-journal when it closes). Returns the ticks it
/// recorded; one no longer running under its execution is left alone.
fn complete_ticks(
    conn: &Connection,
    ticks: &[(TaskId, ExecutionId)],
    now: Timestamp,
) -> Result<HashSet<TaskId>, StoreError> {
    let mut done = HashSet::with_capacity(ticks.len());
    if ticks.is_empty() {
        return Ok(done);
    }
    let pairs = TICKS_PER_STATEMENT;
    let ids: Vec<String> = (0..pairs).map(|i| format!("?{}", 2 + 2 * i)).collect();
    let cases: Vec<String> = (0..pairs)
        .map(|i| format!("WHEN ?{} THEN ?{}", 2 + 2 * i, 3 + 2 * i))
        .collect();
    let sql = format!(
        "UPDATE tasks SET state = 'succeeded', result = NULL, updated_at = ?1, \
         finished_at = ?1, lease_expires_at = NULL \
         WHERE id IN ({}) AND state = 'running' AND execution_id = CASE id {} END \
         RETURNING id",
        ids.join(", "),
        cases.join(" ")
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    for chunk in ticks.chunks(pairs) {
        let mut values: Vec<Option<Vec<u8>>> = Vec::with_capacity(2 * pairs);
        for i in 0..pairs {
            match chunk.get(i) {
                Some((id, execution)) => {
                    values.push(Some(id.as_bytes().to_vec()));
                    values.push(Some(execution.as_bytes().to_vec()));
                }
                None => {
                    values.push(None);
                    values.push(None);
                }
            }
        }
        let mut params: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(1 + 2 * pairs);
        params.push(&now.0);
        for v in &values {
            params.push(v);
        }
        let mut rows = stmt.query(params.as_slice()).map_err(backend)?;
        while let Some(r) = rows.next().map_err(backend)? {
            let id: Vec<u8> = r.get(0).map_err(backend)?;
            done.insert(rows::task_id(&id)?);
        }
    }
    Ok(done)
}

/// One fire op, without its tick's success: the tick to record as succeeded, when the op asks
/// for it, comes back for the caller to write ([`complete_ticks`]). Its refusals (`NotFound`,
/// `StaleTick`) come before its first write; `fire_chunk` relies on that.
#[allow(clippy::type_complexity)]
fn fire_op(
    conn: &Connection,
    op: FireOp,
) -> Result<(FireApplied, Option<(TaskId, ExecutionId)>), ScheduleError> {
    let current = must_load(conn, &op.schedule_id)?;
    if let Some(expect) = op.expect_armed
        && current.armed_tick != Some(expect)
    {
        return Err(ScheduleError::StaleTick {
            armed: current.armed_tick,
        });
    }
    let complete_tick = op.expect_armed.zip(op.complete_tick);
    let id = &op.schedule_id;
    let mut results = Vec::with_capacity(op.fires.len());
    let (mut fired, mut skipped, mut missed) = (0i64, 0i64, 0i64);
    let mut last_task: Option<TaskId> = None;
    let mut last_fire: Option<i64> = None;
    for f in op.fires {
        if let Some(existing) = load_fire(conn, id, f.nominal)? {
            results.push(FireResult::AlreadyRecorded(existing));
            continue;
        }
        let (task_id, task) = match f.task {
            Some(t) => match insert_many(conn, std::slice::from_ref(&t))?.pop() {
                Some(Inserted::Created(t)) => (Some(t.id), Some(t)),
                Some(Inserted::Duplicate { existing }) => (Some(existing), None),
                None => {
                    return Err(StoreError::NoRow {
                        what: "schedule insert",
                    }
                    .into());
                }
            },
            None => (None, None),
        };
        let count = i64::try_from(f.count.max(1)).unwrap_or(i64::MAX);
        conn.prepare_cached(
            "INSERT INTO schedule_fires (schedule_id, nominal_at, outcome, reason, task_id, \
             count, through, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .map_err(backend)?
        .execute(params![
            id.as_str(),
            f.nominal.0,
            f.outcome.as_str(),
            f.reason.as_str(),
            task_id.map(|t| t.as_bytes().to_vec()),
            count,
            f.through.map(|t| t.0),
            op.now.0,
        ])
        .map_err(backend)?;
        match f.outcome {
            FireOutcome::Fired => fired += count,
            FireOutcome::Skipped => skipped += count,
            FireOutcome::Missed => missed += count,
        }
        if task_id.is_some() {
            last_task = task_id;
        }
        let latest = f.through.unwrap_or(f.nominal).0;
        last_fire = Some(last_fire.map_or(latest, |l| l.max(latest)));
        results.push(FireResult::Recorded {
            record: FireRecord {
                schedule_id: id.clone(),
                nominal: f.nominal,
                outcome: f.outcome,
                reason: f.reason,
                task_id,
                count: count as u64,
                through: f.through,
                recorded_at: op.now,
            },
            task,
        });
    }
    let (armed, tick) = apply_arm(conn, current.armed_tick, op.arm, op.now)?;
    // The counters, the latest fire and the arming in one statement that returns the new row.
    let (set, next, armed_tick) = match armed {
        Some((next, tick)) => (true, next, tick.map(|t| t.as_bytes().to_vec())),
        None => (false, None, None),
    };
    let sql = format!(
        "UPDATE schedules SET fired = fired + ?2, skipped = skipped + ?3, missed = missed + ?4, \
         last_task = COALESCE(?5, last_task), \
         last_fire_at = CASE WHEN ?6 IS NULL THEN last_fire_at \
                             ELSE MAX(COALESCE(last_fire_at, ?6), ?6) END, \
         updated_at = ?7, \
         next_fire_at = CASE WHEN ?8 THEN ?9 ELSE next_fire_at END, \
         armed_tick = CASE WHEN ?8 THEN ?10 ELSE armed_tick END \
         WHERE id = ?1 RETURNING {SCHEDULE_COLUMNS}"
    );
    let schedule = conn
        .prepare_cached(&sql)
        .map_err(backend)?
        .query_row(
            params![
                id.as_str(),
                fired,
                skipped,
                missed,
                last_task.map(|t| t.as_bytes().to_vec()),
                last_fire,
                op.now.0,
                set,
                next,
                armed_tick,
            ],
            |r| Ok(schedule_from_row(r)),
        )
        .optional()
        .map_err(backend)?
        // Loaded at the start of this job and nobody else writes: never missing here (and not
        // `NotFound`, which callers take as "nothing was written").
        .ok_or(StoreError::NoRow {
            what: "the schedule during its fire",
        })??;
    Ok((
        FireApplied {
            schedule,
            fires: results,
            tick: tick.map(Box::new),
            tick_completed: false,
        },
        complete_tick,
    ))
}

/// Fire ops per writer job in [`ScheduleStore::fire_many`]. Every statement of a job runs inside
/// the job's savepoint, whose sub-journal grows with it (see `INSERT_CHUNK`): a bounded job keeps
/// that cost per job; the jobs of one call still share a group commit.
const FIRE_CHUNK: usize = 32;

/// Applies `ops` one after another in the caller's job. A refusal ([`ScheduleError::StaleTick`],
/// [`ScheduleError::NotFound`]) is decided before `fire` writes anything, so it is answered and
/// the others go on; any other error may come after some of its op's writes, so the whole job
/// fails (its savepoint rolls everything back) and the caller applies the ops one job each.
/// Without a savepoint per op, each page the chunk touches is journaled once per job rather
/// than once per op.
fn fire_chunk(
    conn: &Connection,
    ops: Vec<FireOp>,
) -> Result<Vec<Result<FireApplied, ScheduleError>>, ScheduleError> {
    let mut out = Vec::with_capacity(ops.len());
    let mut ticks = TickCompletions::default();
    for op in ops {
        let now = op.now;
        match fire_op(conn, op) {
            Ok((applied, tick)) => {
                ticks.push(now, tick);
                out.push(Ok(applied));
            }
            Err(e @ (ScheduleError::StaleTick { .. } | ScheduleError::NotFound)) => {
                ticks.push(now, None);
                out.push(Err(e))
            }
            Err(e) => return Err(e),
        }
    }
    // The ticks' successes, together at the end of the job.
    let mut done = HashSet::new();
    for (now, group) in ticks.groups() {
        done.extend(complete_ticks(conn, group, *now)?);
    }
    ticks.answer(&mut out, &done);
    Ok(out)
}

/// `columns` ("a, b") qualified by `table` ("t.a, t.b").
fn prefixed(table: &str, columns: &str) -> String {
    columns
        .split(", ")
        .map(|c| format!("{table}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Schedules armed with a tick whose task row is gone or terminal.
fn stranded(conn: &Connection, after: &str, limit: usize) -> Result<SchedulePage, StoreError> {
    let cols = prefixed("s", SCHEDULE_COLUMNS);
    let sql = format!(
        "SELECT {cols} FROM schedules s LEFT JOIN tasks t ON t.id = s.armed_tick \
         WHERE s.id > ?1 AND s.armed_tick IS NOT NULL \
         AND (t.id IS NULL OR t.state IN ('succeeded', 'dead', 'cancelled')) \
         ORDER BY s.id LIMIT ?2"
    );
    schedule_page(conn, &sql, after, limit)
}

/// Schedules in id order from `sql` (parameters: after, limit), one page.
fn schedule_page(
    conn: &Connection,
    sql: &str,
    after: &str,
    limit: usize,
) -> Result<SchedulePage, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let mut rows = stmt
        .query(params![after, limit.saturating_add(1) as i64])
        .map_err(backend)?;
    let mut schedules = Vec::new();
    while let Some(r) = rows.next().map_err(backend)? {
        schedules.push(schedule_from_row(r)?);
    }
    Ok(SchedulePage::from_overfetched(schedules, limit))
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn create_schedule(
        &self,
        s: NewSchedule,
    ) -> Result<(Schedule, Option<Task>), ScheduleError> {
        let def = def_json(&s.def)?;
        self.writer
            .write(move |conn| {
                if load(conn, &s.id)?.is_some() {
                    return Err(ScheduleError::AlreadyExists);
                }
                conn.prepare_cached(
                    "INSERT INTO schedules (id, def, paused, note, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                )
                .map_err(backend)?
                .execute(params![
                    s.id.as_str(),
                    def,
                    i64::from(s.paused),
                    s.note,
                    s.now.0
                ])
                .map_err(backend)?;
                let arm = s.arm.map_or(ArmChange::Keep, ArmChange::arm);
                let (armed, tick) = apply_arm(conn, None, arm, s.now)?;
                set_arm(conn, &s.id, armed)?;
                Ok((must_load(conn, &s.id)?, tick))
            })
            .await
    }

    async fn get_schedule(&self, id: &ScheduleId) -> Result<Option<Schedule>, StoreError> {
        let id = id.clone();
        self.read(move |conn| load(conn, &id)).await
    }

    async fn list_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let after = after.map(|a| a.as_str().to_string()).unwrap_or_default();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id > ?1 ORDER BY id LIMIT ?2"
            );
            schedule_page(conn, &sql, &after, limit)
        })
        .await
    }

    async fn search_schedules(
        &self,
        filter: &ScheduleFilter,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let (after, end) = filter.id_range(after);
        let fragment = filter.id_contains.clone();
        let paused = filter.paused;
        let from = filter.searched_from() as i64 + 1;
        let default_only = filter.default_only();
        self.read(move |conn| {
            // `instr` compares bytes (case-sensitive), as `str::contains` does, in the id as its
            // namespace knows it (`substr` from ?5); the walk of the primary key, within the
            // namespace's range of ids (?1, ?6), stops at `limit + 1` matches. The default
            // namespace's ids are those without the separator (char 31).
            let sql = format!(
                "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id > ?1 \
                 AND (?6 IS NULL OR id < ?6) AND instr(substr(id, ?5), ?3) > 0 \
                 AND (?4 IS NULL OR paused = ?4) \
                 AND (NOT ?7 OR instr(id, char(31)) = 0) ORDER BY id LIMIT ?2"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt
                .query(params![
                    after,
                    limit.saturating_add(1) as i64,
                    fragment,
                    paused,
                    from,
                    end,
                    default_only
                ])
                .map_err(backend)?;
            let mut schedules = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                schedules.push(schedule_from_row(r)?);
            }
            Ok(SchedulePage::from_overfetched(schedules, limit))
        })
        .await
    }

    async fn update_schedule(
        &self,
        id: &ScheduleId,
        def: ScheduleDef,
        arm: ArmChange,
        now: Timestamp,
    ) -> Result<(Schedule, Option<Task>), ScheduleError> {
        let id = id.clone();
        let def = def_json(&def)?;
        self.writer
            .write(move |conn| {
                let current = must_load(conn, &id)?;
                let (armed, tick) = apply_arm(conn, current.armed_tick, arm, now)?;
                set_arm(conn, &id, armed)?;
                conn.prepare_cached("UPDATE schedules SET def = ?2, updated_at = ?3 WHERE id = ?1")
                    .map_err(backend)?
                    .execute(params![id.as_str(), def, now.0])
                    .map_err(backend)?;
                Ok((must_load(conn, &id)?, tick))
            })
            .await
    }

    async fn set_paused(
        &self,
        id: &ScheduleId,
        paused: bool,
        note: Option<String>,
        now: Timestamp,
    ) -> Result<Schedule, ScheduleError> {
        let id = id.clone();
        self.writer
            .write(move |conn| {
                let n = conn
                    .prepare_cached(
                        "UPDATE schedules SET paused = ?2, note = ?3, updated_at = ?4 WHERE id = ?1",
                    )
                    .map_err(backend)?
                    .execute(params![id.as_str(), i64::from(paused), note, now.0])
                    .map_err(backend)?;
                if n == 0 {
                    return Err(ScheduleError::NotFound);
                }
                must_load(conn, &id)
            })
            .await
    }

    async fn delete_schedule(&self, id: &ScheduleId, now: Timestamp) -> Result<(), ScheduleError> {
        let id = id.clone();
        self.writer
            .write(move |conn| {
                let current = must_load(conn, &id)?;
                if let Some(t) = current.armed_tick {
                    cancel_tick(conn, t, now)?;
                }
                conn.prepare_cached("DELETE FROM schedule_fires WHERE schedule_id = ?1")
                    .map_err(backend)?
                    .execute(params![id.as_str()])
                    .map_err(backend)?;
                conn.prepare_cached("DELETE FROM schedules WHERE id = ?1")
                    .map_err(backend)?
                    .execute(params![id.as_str()])
                    .map_err(backend)?;
                Ok(())
            })
            .await
    }

    async fn fire(&self, op: FireOp) -> Result<FireApplied, ScheduleError> {
        self.writer.write(move |conn| fire(conn, op)).await
    }

    async fn fire_many(&self, ops: Vec<FireOp>) -> Vec<Result<FireApplied, ScheduleError>> {
        let mut chunks: Vec<Vec<FireOp>> = Vec::new();
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            chunks.push(ops.by_ref().take(FIRE_CHUNK).collect());
        }
        let jobs = chunks.into_iter().map(|chunk| {
            let copy = chunk.clone();
            async move {
                let r = self.writer.write(move |conn| fire_chunk(conn, chunk)).await;
                match r {
                    Ok(results) => results,
                    // An op failed part-way (or the commit failed): nothing of the job happened.
                    // Apply its ops one job each, so only the failing one fails.
                    Err(_) => {
                        futures::future::join_all(copy.into_iter().map(|op| self.fire(op))).await
                    }
                }
            }
        });
        futures::future::join_all(jobs)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn schedules_for_fire(
        &self,
        ids: &[ScheduleId],
    ) -> Result<Vec<(Schedule, Option<LastTask>)>, StoreError> {
        let ids: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
        let ids = serde_json::to_string(&ids).map_err(|e| StoreError::encode("schedule ids", e))?;
        self.read(move |conn| {
            let cols = prefixed("s", SCHEDULE_COLUMNS);
            let sql = format!(
                "SELECT {cols}, t.id, t.state, t.attempt FROM schedules s \
                 LEFT JOIN tasks t ON t.id = s.last_task \
                 WHERE s.id IN (SELECT value FROM json_each(?1))"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt.query(params![ids]).map_err(backend)?;
            let mut out = Vec::new();
            let n = SCHEDULE_COLUMNS.split(", ").count();
            while let Some(r) = rows.next().map_err(backend)? {
                let schedule = schedule_from_row(r)?;
                let last = match r.get::<_, Option<Vec<u8>>>(n).map_err(backend)? {
                    Some(id) => {
                        let state: String = r.get(n + 1).map_err(backend)?;
                        Some(LastTask {
                            id: rows::task_id(&id)?,
                            state: rows::parse_state(&state)?,
                            attempt: r.get(n + 2).map_err(backend)?,
                        })
                    }
                    None => None,
                };
                out.push((schedule, last));
            }
            Ok(out)
        })
        .await
    }

    async fn stranded_schedules(
        &self,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<SchedulePage, StoreError> {
        let after = after.map(|a| a.as_str().to_string()).unwrap_or_default();
        self.read(move |conn| stranded(conn, &after, limit)).await
    }

    async fn list_fires(
        &self,
        id: &ScheduleId,
        before: Option<Timestamp>,
        limit: usize,
    ) -> Result<FirePage, StoreError> {
        let id = id.clone();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = ?1 \
                 AND nominal_at < ?2 ORDER BY nominal_at DESC LIMIT ?3"
            );
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt
                .query(params![
                    id.as_str(),
                    before.map_or(i64::MAX, |b| b.0),
                    limit.saturating_add(1) as i64
                ])
                .map_err(backend)?;
            let mut fires = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                fires.push(fire_from_row(r)?);
            }
            let next_cursor = if fires.len() > limit {
                fires.truncate(limit);
                fires.last().map(|f| f.nominal)
            } else {
                None
            };
            Ok(FirePage { fires, next_cursor })
        })
        .await
    }

    async fn purge_fires(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        self.writer
            .write(move |conn| {
                let n = conn
                    .prepare_cached(
                        "DELETE FROM schedule_fires WHERE (schedule_id, nominal_at) IN \
                         (SELECT schedule_id, nominal_at FROM schedule_fires \
                          INDEXED BY schedule_fires_recorded WHERE recorded_at < ?1 LIMIT ?2)",
                    )
                    .map_err(backend)?
                    .execute(params![before.0, limit as i64])
                    .map_err(backend)?;
                Ok(n as u64)
            })
            .await
    }
}
