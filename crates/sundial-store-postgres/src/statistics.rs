//! Planner statistics of `tasks`, kept by the store when nothing else keeps them.
//!
//! The store's statements are planned once per connection, generically (`plan_cache_mode`, see
//! `PostgresStore::connect`). Without statistics PostgreSQL takes every partial index of `tasks`
//! for a handful of rows, so a statement given a few task ids can be planned to read every due
//! task of the partial due index instead of looking the ids up by primary key: cheap on the
//! empty table it was planned on, and a read of the whole backlog on every call once tasks pile
//! up, which makes the backlog grow faster still. Autovacuum analyzes a table a while after it
//! changes, and `ANALYZE` makes every connection plan its statements again; but a schema younger
//! than autovacuum's next visit has no statistics yet, and a database run with autovacuum off
//! never gets any.
//!
//! So, at most every [`CHECK_EVERY`] (every [`CHECK_EVERY_UNTIL_FIRST`] until the first analyze)
//! of the callers' clock, and only while the store inserts or claims tasks, one call of the
//! store looks at `tasks` and analyzes it ([`verdict`]):
//! - when it has never been analyzed and holds at least [`FIRST_ROWS`] rows;
//! - when more rows changed since the last analyze than [`STALE_BASE`] plus [`STALE_FRACTION`]
//!   of the table (twice autovacuum's default threshold, so that autovacuum, where it runs,
//!   gets there first) and that analyze is older than [`STALE_AGE`].
//!
//! The look and the analyze run on a task of their own: a caller never waits for them, and a
//! failure is logged and looked at again at the next check. The one statement here that reads
//! the database's clock (the age of the last analyze) decides nothing about tasks.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sundial_core::Timestamp;
use sundial_store::StoreError;

use crate::PostgresStore;
use crate::rows::col;

/// How often the store looks at the statistics once `tasks` has been analyzed.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);
/// How often it looks before the first analyze (a fresh schema filling up).
pub const CHECK_EVERY_UNTIL_FIRST: Duration = Duration::from_secs(1);
/// Rows a never-analyzed `tasks` must hold before it is analyzed.
pub const FIRST_ROWS: i64 = 100;
/// Rows changed since the last analyze, beyond [`STALE_FRACTION`] of the table, that make the
/// statistics stale.
pub const STALE_BASE: f64 = 1_000.0;
/// Share of the table's rows that, changed since the last analyze, make the statistics stale.
pub const STALE_FRACTION: f64 = 0.2;
/// The least age of the last analyze before another for staleness (each analyze makes every
/// connection plan its statements again).
pub const STALE_AGE: Duration = Duration::from_secs(300);

/// What PostgreSQL says about `tasks`'s statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableStatistics {
    /// Seconds since the last analyze (manual or autovacuum's); `None`: never analyzed.
    pub analyzed_ago_secs: Option<f64>,
    /// The planner's row count (`pg_class.reltuples`; negative before any analyze or vacuum).
    pub rows_estimate: f64,
    /// Rows inserted, updated or deleted since the last analyze (`n_mod_since_analyze`).
    pub changed_since_analyze: i64,
    /// Rows the table holds, counted up to [`FIRST_ROWS`].
    pub rows_up_to_first: i64,
}

/// Why `tasks` is analyzed, or that it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatisticsVerdict {
    /// Never analyzed, and holds at least [`FIRST_ROWS`] rows.
    Missing,
    /// Analyzed, but enough rows changed since, long enough ago.
    Stale,
    /// Nothing to do.
    Current,
}

/// The decision of one check (pure: the tests call it on any figures).
pub fn verdict(s: &TableStatistics) -> StatisticsVerdict {
    match s.analyzed_ago_secs {
        None if s.rows_up_to_first >= FIRST_ROWS => StatisticsVerdict::Missing,
        None => StatisticsVerdict::Current,
        Some(ago) => {
            let threshold = STALE_BASE + STALE_FRACTION * s.rows_estimate.max(0.0);
            // Rounding to whole rows is what the threshold means.
            #[allow(clippy::cast_precision_loss)]
            let changed = s.changed_since_analyze as f64;
            if changed > threshold && ago >= STALE_AGE.as_secs_f64() {
                StatisticsVerdict::Stale
            } else {
                StatisticsVerdict::Current
            }
        }
    }
}

/// When the store next looks (shared by its clones), in the callers' clock.
#[derive(Debug)]
pub(crate) struct StatisticsUpkeep {
    /// No call before this time (ms) looks; [`LOOKING`] while a look runs.
    next_ms: AtomicI64,
}

/// `next_ms` while a look runs: no call takes a turn.
const LOOKING: i64 = i64::MAX;

impl Default for StatisticsUpkeep {
    fn default() -> Self {
        StatisticsUpkeep {
            next_ms: AtomicI64::new(i64::MIN),
        }
    }
}

impl StatisticsUpkeep {
    /// Whether the call at `now` is the one to look (at most one at a time).
    fn take_turn(&self, now: Timestamp) -> bool {
        let next = self.next_ms.load(Ordering::Relaxed);
        next != LOOKING
            && now.0 >= next
            && self
                .next_ms
                .compare_exchange(next, LOOKING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// The look begun at `now` is over; the next one is `wait` later.
    fn look_again_after(&self, now: Timestamp, wait: Duration) {
        let wait = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
        self.next_ms.store(
            now.0.saturating_add(wait).min(LOOKING - 1),
            Ordering::Release,
        );
    }
}

impl PostgresStore {
    /// Called by the store's task-writing calls with their time: when a look is due, starts one
    /// on a task of its own and returns at once.
    pub(crate) fn keep_statistics_in_the_background(&self, now: Timestamp) {
        if !self.statistics.take_turn(now) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let wait = match store.keep_statistics().await {
                Ok((before, StatisticsVerdict::Current)) if before.analyzed_ago_secs.is_none() => {
                    CHECK_EVERY_UNTIL_FIRST
                }
                Ok((_, v)) => {
                    if v != StatisticsVerdict::Current {
                        tracing::info!(verdict = ?v, "analyzed the tasks table (planner statistics)");
                    }
                    CHECK_EVERY
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not check the tasks table's planner statistics");
                    CHECK_EVERY
                }
            };
            store.statistics.look_again_after(now, wait);
        });
    }

    /// Looks at `tasks`'s planner statistics and analyzes the table when they are missing or
    /// stale ([`verdict`]). Returns what it saw and what it decided. The store calls this by
    /// itself while it writes tasks; an operator's tool may call it too.
    pub async fn keep_statistics(
        &self,
    ) -> Result<(TableStatistics, StatisticsVerdict), StoreError> {
        let client = self.client().await?;
        let row = crate::query_one(&client, &self.sql.tasks_statistics, &[]).await?;
        let seen = TableStatistics {
            analyzed_ago_secs: col(&row, 0)?,
            rows_estimate: col::<f64>(&row, 1)?,
            changed_since_analyze: col::<i64>(&row, 2)?,
            rows_up_to_first: col::<i64>(&row, 3)?,
        };
        let v = verdict(&seen);
        if v != StatisticsVerdict::Current {
            client
                .batch_execute(&self.sql.analyze_tasks)
                .await
                .map_err(crate::pg)?;
        }
        Ok((seen, v))
    }
}

/// Statements of the engine's hot path whose plans [`PostgresStore::explain_generic`] shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlannedStatement {
    /// A worker poll's group claim of ready tasks (`claim_ready`, the common one-statement form).
    ClaimReady,
    /// A group of completions.
    CompleteMany,
    /// The reaper's expiry of ended leases.
    ExpireLeases,
    /// Due tasks handed to the ready queue by id (`claim_due` for pollers).
    ReadyClaimed,
    /// A group of such calls readied in one statement (`readier.rs`).
    ReadyEach,
    /// Retention's delete of finished tasks, one shard at a time.
    Purge,
}

impl PostgresStore {
    /// The plan PostgreSQL makes once for `statement` on this store's connections (generic, as
    /// `plan_cache_mode` has it there), as `EXPLAIN (FORMAT JSON)` text. For tests of what the
    /// statements read on a table with or without statistics.
    pub async fn explain_generic(&self, statement: PlannedStatement) -> Result<String, StoreError> {
        let sql = match statement {
            PlannedStatement::ClaimReady => &self.sql.claim_plain[0],
            PlannedStatement::CompleteMany => &self.sql.complete_many,
            PlannedStatement::ExpireLeases => &self.sql.expire_leases,
            PlannedStatement::ReadyClaimed => &self.sql.ready_claimed,
            PlannedStatement::ReadyEach => &self.sql.ready_each,
            PlannedStatement::Purge => &self.ops.purge_in_shard,
        };
        let params = highest_parameter(sql);
        let nulls = vec!["NULL"; params].join(", ");
        let client = self.client().await?;
        client
            .batch_execute(&format!("PREPARE sundial_explain AS {sql}"))
            .await
            .map_err(crate::pg)?;
        let explained = client
            .simple_query(&format!(
                "EXPLAIN (FORMAT JSON) EXECUTE sundial_explain({nulls})"
            ))
            .await
            .map_err(crate::pg);
        let deallocated = client
            .batch_execute("DEALLOCATE sundial_explain")
            .await
            .map_err(crate::pg);
        let mut out = String::new();
        for m in explained? {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                out.push_str(r.get(0).unwrap_or_default());
            }
        }
        deallocated?;
        Ok(out)
    }
}

/// The highest `$n` in `sql` (how many parameters a statement takes).
fn highest_parameter(sql: &str) -> usize {
    let mut highest = 0;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse::<usize>() {
            highest = highest.max(n);
        }
    }
    highest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ago: Option<f64>, rows: f64, changed: i64, first: i64) -> TableStatistics {
        TableStatistics {
            analyzed_ago_secs: ago,
            rows_estimate: rows,
            changed_since_analyze: changed,
            rows_up_to_first: first,
        }
    }

    #[test]
    fn a_table_never_analyzed_is_analyzed_once_it_holds_the_first_rows() {
        assert_eq!(
            verdict(&stats(None, -1.0, 0, 99)),
            StatisticsVerdict::Current
        );
        assert_eq!(
            verdict(&stats(None, -1.0, 0, 100)),
            StatisticsVerdict::Missing
        );
        // A vacuum gives a row count but no statistics: still missing.
        assert_eq!(
            verdict(&stats(None, 5_000.0, 0, 100)),
            StatisticsVerdict::Missing
        );
    }

    #[test]
    fn statistics_go_stale_after_enough_changes_and_time() {
        let old = STALE_AGE.as_secs_f64();
        // 1,000 + 20 % of 10,000 = 3,000 changed rows.
        assert_eq!(
            verdict(&stats(Some(old), 10_000.0, 3_000, 100)),
            StatisticsVerdict::Current
        );
        assert_eq!(
            verdict(&stats(Some(old), 10_000.0, 3_001, 100)),
            StatisticsVerdict::Stale
        );
        // Not again within STALE_AGE, however much changed.
        assert_eq!(
            verdict(&stats(Some(old - 1.0), 10_000.0, 1_000_000, 100)),
            StatisticsVerdict::Current
        );
    }

    #[test]
    fn the_highest_parameter_is_counted() {
        assert_eq!(highest_parameter("SELECT $1, $12::int, $3"), 12);
        assert_eq!(highest_parameter("SELECT 1"), 0);
        assert_eq!(highest_parameter("SELECT '$' || $2"), 2);
    }

    #[test]
    fn one_look_at_a_time_and_none_before_its_time() {
        let upkeep = StatisticsUpkeep::default();
        let t = Timestamp(1_700_000_000_000);
        assert!(upkeep.take_turn(t));
        assert!(!upkeep.take_turn(t), "a second look while one runs");
        upkeep.look_again_after(t, Duration::from_secs(30));
        assert!(
            !upkeep.take_turn(Timestamp(t.0 + 29_999)),
            "a look before its time"
        );
        assert!(upkeep.take_turn(Timestamp(t.0 + 30_000)));
    }
}
