//! Decoding rows into [`Task`]s. A row that does not decode is reported as
//! [`StoreError::Corrupt`], never silently patched.

use rusqlite::Row;
use sundial_core::{
    Backoff, Exclusive, ExclusiveMode, ExecutionId, Priority, Task, TaskId, TaskState, Timestamp,
    TraceContext,
};
use sundial_store::StoreError;

use crate::backend;

/// The column list every task query selects, in the order [`task_from_row`] reads.
pub const TASK_COLUMNS: &str = "id, shard, queue, kind, key, payload, due_at, state, attempt, \
    max_attempts, backoff, timeout_ms, exclusive_key, exclusive_mode, execution_id, \
    lease_expires_at, worker, last_error, result, created_at, updated_at, started_at, finished_at, \
    tags, target, traceparent, tracestate, priority, exclusive_limit, rate";

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

fn uuid16(b: &[u8], what: &str) -> Result<[u8; 16], StoreError> {
    b.try_into()
        .map_err(|_| StoreError::corrupt(format!("{what} is {} bytes, expected 16", b.len())))
}

pub fn task_id(b: &[u8]) -> Result<TaskId, StoreError> {
    Ok(TaskId::from_bytes(uuid16(b, "task id")?))
}

fn json(s: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::corrupt_from(what, e))
}

pub fn task_from_row(r: &Row<'_>) -> Result<Task, StoreError> {
    let id: Vec<u8> = r.get(0).map_err(backend)?;
    let payload: String = r.get(5).map_err(backend)?;
    let state: String = r.get(7).map_err(backend)?;
    let backoff: String = r.get(10).map_err(backend)?;
    let ex_key: Option<String> = r.get(12).map_err(backend)?;
    let ex_mode: Option<String> = r.get(13).map_err(backend)?;
    let ex_limit: u32 = r.get(28).map_err(backend)?;
    let exec: Option<Vec<u8>> = r.get(14).map_err(backend)?;
    let result: Option<String> = r.get(18).map_err(backend)?;
    let tags: Option<String> = r.get(23).map_err(backend)?;
    let target: Option<String> = r.get(24).map_err(backend)?;
    let traceparent: Option<String> = r.get(25).map_err(backend)?;
    let tracestate: Option<String> = r.get(26).map_err(backend)?;
    let rate: Option<String> = r.get(29).map_err(backend)?;
    let exclusive = match (ex_key, ex_mode.as_deref()) {
        (Some(key), Some("wait")) => Some(Exclusive {
            key,
            mode: ExclusiveMode::Wait,
            limit: ex_limit,
        }),
        (Some(key), Some("skip")) => Some(Exclusive {
            key,
            mode: ExclusiveMode::Skip,
            limit: ex_limit,
        }),
        (None, _) => None,
        (Some(_), other) => {
            return Err(StoreError::corrupt(format!(
                "unknown exclusive mode {other:?}"
            )));
        }
    };
    let backoff: Backoff =
        serde_json::from_str(&backoff).map_err(|e| StoreError::corrupt_from("backoff", e))?;
    Ok(Task {
        id: task_id(&id)?,
        shard: r.get(1).map_err(backend)?,
        queue: r.get(2).map_err(backend)?,
        kind: r.get(3).map_err(backend)?,
        key: r.get(4).map_err(backend)?,
        payload: json(&payload, "payload")?,
        due_at: Timestamp(r.get(6).map_err(backend)?),
        state: parse_state(&state)?,
        attempt: r.get(8).map_err(backend)?,
        max_attempts: r.get(9).map_err(backend)?,
        backoff,
        timeout_ms: r.get::<_, i64>(11).map_err(backend)? as u64,
        exclusive,
        rate: rate
            .map(|s| serde_json::from_str(&s).map_err(|e| StoreError::corrupt_from("rate", e)))
            .transpose()?,
        priority: Priority::from_stored(r.get(27).map_err(backend)?),
        execution_id: exec
            .map(|b| uuid16(&b, "execution id").map(ExecutionId::from_bytes))
            .transpose()?,
        lease_expires_at: r.get::<_, Option<i64>>(15).map_err(backend)?.map(Timestamp),
        worker: r.get(16).map_err(backend)?,
        last_error: r.get(17).map_err(backend)?,
        result: result.map(|s| json(&s, "result")).transpose()?,
        created_at: Timestamp(r.get(19).map_err(backend)?),
        updated_at: Timestamp(r.get(20).map_err(backend)?),
        started_at: r.get::<_, Option<i64>>(21).map_err(backend)?.map(Timestamp),
        finished_at: r.get::<_, Option<i64>>(22).map_err(backend)?.map(Timestamp),
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
