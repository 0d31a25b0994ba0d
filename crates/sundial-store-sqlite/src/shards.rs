//! The store's shard count: recorded when the store is created, adopted on every open.
//!
//! Every task row carries the shard it was hashed into, and a shard loop scans only its own
//! shard, so a store opened with fewer shards than it was written with would leave the rows of
//! the missing shards where no loop looks. The count is therefore a property of the store, kept
//! in `store_meta` (migration 4) under `shard_count`, not of whoever opens it:
//!
//! - a new store (no row, no tasks) records the count its opener proposes;
//! - a store that recorded one keeps it, whatever the opener proposes;
//! - a store written before the count was recorded (tasks, no row) gets one derived from its
//!   rows and recorded: at least one more than the highest shard any row has (so every row is in
//!   a shard that some loop runs), and, of the counts from there on, the proposed one or the
//!   smallest that sends a sample of rows to the shards they are in (the count they were written
//!   with, when they were all written with one).
//!
//! Deciding and recording happen in one `IMMEDIATE` transaction.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use sundial_core::{TaskId, shard_for};

use crate::SqliteError;

/// Rows read to recognise the count an older store's tasks were hashed with.
const SAMPLE_ROWS: usize = 1_000;
/// Highest count tried when recognising it.
const MAX_TRIED: u32 = 4_096;

/// Where the store's shard count came from, at this open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCountOrigin {
    /// The store was new: the opener's proposal was recorded.
    Created,
    /// The store had recorded it.
    Recorded,
    /// The store was written by a build that did not record it: derived from its rows (and now
    /// recorded).
    DerivedFromRows,
}

/// The shard count a store runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreShards {
    pub count: u32,
    pub origin: ShardCountOrigin,
}

/// Reads the recorded shard count, or decides and records one (see the module doc).
pub(crate) fn adopt(conn: &mut Connection, proposed: u32) -> Result<StoreShards, SqliteError> {
    let proposed = proposed.max(1);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let recorded: Option<String> = tx
        .query_row(
            "SELECT value FROM store_meta WHERE name = 'shard_count'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(v) = recorded {
        let count = v
            .parse::<u32>()
            .ok()
            .filter(|c| *c >= 1)
            .ok_or_else(|| SqliteError::Corrupt(format!("recorded shard count {v:?}")))?;
        return Ok(StoreShards {
            count,
            origin: ShardCountOrigin::Recorded,
        });
    }
    let highest: Option<i64> = tx.query_row("SELECT MAX(shard) FROM tasks", [], |r| r.get(0))?;
    let shards = match highest {
        None => StoreShards {
            count: proposed,
            origin: ShardCountOrigin::Created,
        },
        Some(highest) => {
            let sample = sample_rows(&tx)?;
            let lowest = u32::try_from(highest.max(0))
                .ok()
                .and_then(|h| h.checked_add(1))
                .ok_or_else(|| SqliteError::Corrupt(format!("task shard {highest}")))?;
            StoreShards {
                count: derive(&sample, lowest, proposed),
                origin: ShardCountOrigin::DerivedFromRows,
            }
        }
    };
    tx.execute(
        "INSERT INTO store_meta (name, value) VALUES ('shard_count', ?1)",
        [shards.count.to_string()],
    )?;
    tx.commit()?;
    Ok(shards)
}

/// A row's hashing inputs and the shard it is in.
pub(crate) struct SampleRow {
    pub id: TaskId,
    pub queue: String,
    pub key: Option<String>,
    pub shard: u32,
}

fn sample_rows(conn: &Connection) -> Result<Vec<SampleRow>, SqliteError> {
    let mut stmt =
        conn.prepare("SELECT id, queue, key, shard FROM tasks ORDER BY rowid DESC LIMIT ?1")?;
    let rows = stmt.query_map([SAMPLE_ROWS as i64], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, i64>(3)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, queue, key, shard) = row?;
        let id = crate::rows::task_id(&id).map_err(|e| SqliteError::Corrupt(e.to_string()))?;
        let shard = u32::try_from(shard)
            .map_err(|_| SqliteError::Corrupt(format!("task shard {shard}")))?;
        out.push(SampleRow {
            id,
            queue,
            key,
            shard,
        });
    }
    Ok(out)
}

/// The count for a store whose rows reach shard `lowest - 1`: the proposed count when it is at
/// least `lowest` and agrees with every sampled row, else the smallest count from `lowest` on that
/// agrees with them, else `lowest` (rows written with several counts agree with none; every row
/// is still in a shard that runs).
pub(crate) fn derive(sample: &[SampleRow], lowest: u32, proposed: u32) -> u32 {
    let agrees = |count: u32| {
        sample
            .iter()
            .all(|r| shard_for(&r.queue, r.key.as_deref(), &r.id, count) == r.shard)
    };
    if proposed >= lowest && agrees(proposed) {
        return proposed;
    }
    (lowest..=MAX_TRIED.max(lowest))
        .find(|c| agrees(*c))
        .unwrap_or(lowest)
}
