//! Decoding rows into [`Task`]s. A row that does not decode is reported as
//! [`StoreError::Corrupt`], never silently patched.

use sundial_core::{
    Backoff, Exclusive, ExclusiveMode, ExecutionId, Priority, Task, TaskId, TaskState, Timestamp,
    TraceContext,
};
use sundial_store::StoreError;
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;
use uuid::Uuid;

/// The task columns every task query returns, in the order [`task_from_row`] reads them.
const COLUMNS: [&str; 30] = [
    "id",
    "shard",
    "queue",
    "kind",
    "key",
    "payload",
    "due_at",
    "state",
    "attempt",
    "max_attempts",
    "backoff",
    "timeout_ms",
    "exclusive_key",
    "exclusive_mode",
    "execution_id",
    "lease_expires_at",
    "worker",
    "last_error",
    "result",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "tags",
    "target",
    "traceparent",
    "tracestate",
    "priority",
    "exclusive_limit",
    "rate",
];

/// The column list qualified with `alias` (`t.id, t.shard, …`): queries that join the task table
/// with a row source of their own (`UPDATE … FROM unnest(…)`) name the table's columns exactly.
pub fn task_columns(alias: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn parse_state(s: &str) -> Result<TaskState, StoreError> {
    s.parse()
        .map_err(|_| StoreError::corrupt(format!("unknown task state {s:?}")))
}

pub fn mode_str(m: ExclusiveMode) -> &'static str {
    match m {
        ExclusiveMode::Wait => "wait",
        ExclusiveMode::Skip => "skip",
    }
}

pub fn parse_mode(s: &str) -> Result<ExclusiveMode, StoreError> {
    match s {
        "wait" => Ok(ExclusiveMode::Wait),
        "skip" => Ok(ExclusiveMode::Skip),
        other => Err(StoreError::corrupt(format!(
            "unknown exclusive mode {other:?}"
        ))),
    }
}

/// Column `idx` of `r` as a `T`; a column of another type (or a NULL where none may be) is
/// corrupt data, not a backend failure.
pub fn col<'a, T: FromSql<'a>>(r: &'a Row, idx: usize) -> Result<T, StoreError> {
    r.try_get(idx)
        .map_err(|e| StoreError::corrupt_from(format!("column {idx}"), e))
}

/// A `bigint` column that holds a `u32`.
pub fn col_u32(r: &Row, idx: usize, what: &str) -> Result<u32, StoreError> {
    let v: i64 = col(r, idx)?;
    u32::try_from(v).map_err(|_| StoreError::corrupt(format!("{what} {v} is out of range")))
}

fn json(s: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::corrupt_from(what, e))
}

fn time(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp)
}

pub fn task_from_row(r: &Row) -> Result<Task, StoreError> {
    let id: Uuid = col(r, 0)?;
    let payload: String = col(r, 5)?;
    let state: String = col(r, 7)?;
    let backoff: String = col(r, 10)?;
    let timeout_ms: i64 = col(r, 11)?;
    let ex_key: Option<String> = col(r, 12)?;
    let ex_mode: Option<String> = col(r, 13)?;
    let exec: Option<Uuid> = col(r, 14)?;
    let result: Option<String> = col(r, 18)?;
    let tags: Option<String> = col(r, 23)?;
    let target: Option<String> = col(r, 24)?;
    let traceparent: Option<String> = col(r, 25)?;
    let tracestate: Option<String> = col(r, 26)?;
    let rate: Option<String> = col(r, 29)?;
    let exclusive = match (ex_key, ex_mode) {
        (None, _) => None,
        (Some(key), Some(mode)) => Some(Exclusive {
            key,
            mode: parse_mode(&mode)?,
            limit: u32::try_from(col::<i32>(r, 28)?)
                .map_err(|_| StoreError::corrupt("a group limit below 1".to_string()))?,
        }),
        (Some(_), None) => {
            return Err(StoreError::corrupt(
                "exclusive key without a mode".to_string(),
            ));
        }
    };
    let backoff: Backoff =
        serde_json::from_str(&backoff).map_err(|e| StoreError::corrupt_from("backoff", e))?;
    Ok(Task {
        id: TaskId(id),
        shard: col_u32(r, 1, "shard")?,
        queue: col(r, 2)?,
        kind: col(r, 3)?,
        key: col(r, 4)?,
        payload: json(&payload, "payload")?,
        due_at: Timestamp(col(r, 6)?),
        state: parse_state(&state)?,
        attempt: col_u32(r, 8, "attempt")?,
        max_attempts: col_u32(r, 9, "max_attempts")?,
        backoff,
        timeout_ms: u64::try_from(timeout_ms)
            .map_err(|_| StoreError::corrupt(format!("timeout_ms {timeout_ms} is negative")))?,
        exclusive,
        rate: rate
            .map(|s| serde_json::from_str(&s).map_err(|e| StoreError::corrupt_from("rate", e)))
            .transpose()?,
        priority: Priority::from_stored(i64::from(col::<i16>(r, 27)?)),
        execution_id: exec.map(ExecutionId),
        lease_expires_at: time(col(r, 15)?),
        worker: col(r, 16)?,
        last_error: col(r, 17)?,
        result: result.map(|s| json(&s, "result")).transpose()?,
        created_at: Timestamp(col(r, 19)?),
        updated_at: Timestamp(col(r, 20)?),
        started_at: time(col(r, 21)?),
        finished_at: time(col(r, 22)?),
        tags: match tags {
            None => Default::default(),
            Some(s) => serde_json::from_str(&s).map_err(|e| StoreError::corrupt_from("tags", e))?,
        },
        target: target
            .map(|s| serde_json::from_str(&s).map_err(|e| StoreError::corrupt_from("target", e)))
            .transpose()?,
        trace: match traceparent {
            None => None,
            Some(tp) => Some(
                TraceContext::parse(&tp, tracestate.as_deref())
                    .ok_or_else(|| StoreError::corrupt(format!("traceparent {tp:?}")))?,
            ),
        },
    })
}

pub fn tasks_from_rows(rows: &[Row]) -> Result<Vec<Task>, StoreError> {
    rows.iter().map(task_from_row).collect()
}
