//! # sundial-store-sqlite
//!
//! The embedded store: one SQLite database file in WAL mode.
//!
//! **Writes** go through one writer thread that practises *group commit*: it takes every write
//! waiting in its channel (up to [`SqliteOptions::max_batch`]), runs each inside its own savepoint
//! of one shared transaction, commits once (one fsync with `synchronous = FULL`), and only then
//! answers the callers. A caller therefore hears "done" only once its write is durable, while the
//! cost of the fsync is shared by everyone who arrived during the previous one. A write that fails
//! rolls back its own savepoint and leaves the others in the batch alone.
//!
//! **Reads** use a small pool of separate connections on tokio's blocking threads; WAL lets them run
//! beside the writer and see only committed data.
//!
//! This crate is the only one in the workspace that depends on rusqlite. It never reads a clock:
//! every time it writes was handed to it.

mod access;
mod lock;
mod ops;
mod push;
mod rows;
mod schedules;
mod schema;
mod shards;
mod workflows;
mod writer;

use std::collections::{HashMap, HashSet};

use schema::RANK_SQL;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use sundial_core::{ExecutionId, NewTask, Priority, RateLimit, Task, TaskId, TaskState, Timestamp};
use sundial_store::{
    AttemptHistory, ClaimOutcome, ClaimTarget, DeadGroup, DeadGroupFilter, DebounceOutcome,
    DebouncedCreate, DueClaim, DueEntry, DueKey, Fence, IdempotencyDecision, IdempotentCreate,
    IdempotentOutcome, Inserted, LIST_VISIT_BUDGET, ListDriver, QueueConfig, QueueSettings,
    ReadyClaim, ReadyTaken, RetentionRules, Retry, SelectPage, StateCount, Store, StoreError,
    TaskFilter, TaskPage, TransitionError, debounced_due, idempotency_decision,
    idempotency_remembered, page_cursor,
};
use thiserror::Error;

use rows::{TASK_COLUMNS, task_from_row};
use writer::Writer;

pub use lock::LockHolder;
pub use schema::CURRENT_VERSION as SCHEMA_VERSION;
pub use shards::{ShardCountOrigin, StoreShards};

use lock::StoreLock;

/// Errors from opening the store (operations report [`StoreError`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SqliteError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "database schema version {found} is newer than this build supports ({supported}); upgrade Sundial"
    )]
    TooNew { found: i64, supported: i64 },
    /// Another store (in this process or another) has the database open.
    #[error("{0}")]
    InUse(LockHolder),
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    /// What the database holds is not what this build wrote.
    #[error("the database is corrupt: {0}")]
    Corrupt(String),
}

impl From<SqliteError> for StoreError {
    fn from(e: SqliteError) -> Self {
        StoreError::backend(e)
    }
}

/// A rusqlite error as a [`StoreError`]: [`StoreError::Full`] when the disk is full (noted for
/// the writer, see [`writer::note_disk_full`]), else [`StoreError::Backend`].
pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    if is_disk_full(&e) {
        writer::note_disk_full();
        StoreError::full(e)
    } else {
        StoreError::backend(e)
    }
}

pub(crate) fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// How hard a commit tries to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync on every commit (`synchronous = FULL`): an acknowledged write survives power loss.
    Full,
    /// fsync at checkpoints only (`synchronous = NORMAL`): survives a process crash (`kill -9`),
    /// may lose the last commits on power loss.
    Normal,
}

#[derive(Debug, Clone)]
pub struct SqliteOptions {
    pub durability: Durability,
    /// Most writes committed together.
    pub max_batch: usize,
    /// Read connections kept open.
    pub readers: usize,
    /// Page cache per connection, in KiB.
    pub cache_kib: i64,
    /// The shard count recorded when the store is created. A store that exists keeps the count
    /// it recorded (or, from an older build, one derived from its rows): see
    /// [`SqliteStore::shards`].
    pub shard_count: u32,
    /// Attempts kept per task (the latest); older ones are dropped as new ones start, while the
    /// total keeps counting.
    pub attempts_kept: u32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::Full,
            max_batch: 1024,
            readers: 4,
            cache_kib: 16 * 1024,
            shard_count: 4,
            attempts_kept: 100,
        }
    }
}

/// The embedded store. Cheap to clone; all clones share one writer thread.
#[derive(Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    readers: Arc<ReaderPool>,
    shards: StoreShards,
    /// Set by the writer while its commits fail for want of space.
    condition: Arc<Mutex<Option<String>>>,
    _lock: Arc<StoreLock>,
}

struct ReaderPool {
    path: PathBuf,
    opts: SqliteOptions,
    idle: Mutex<Vec<Connection>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in directory `dir` (file `sundial.db`). Refused with
    /// [`SqliteError::InUse`] ("data directory D is in use by pid N") while another store has it
    /// open.
    pub fn open_dir(dir: &Path, opts: SqliteOptions) -> Result<Self, SqliteError> {
        std::fs::create_dir_all(dir).map_err(|source| SqliteError::DataDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let db = dir.join("sundial.db");
        let lock = StoreLock::acquire(&db, format!("data directory {}", dir.display()))?;
        Self::open_locked(&db, opts, lock)
    }

    /// Opens (creating if needed) the database file at `path` and migrates it. Refused with
    /// [`SqliteError::InUse`] while another store has it open (the lock is `<path>.lock`).
    pub fn open(path: &Path, opts: SqliteOptions) -> Result<Self, SqliteError> {
        let lock = StoreLock::acquire(path, format!("database {}", path.display()))?;
        Self::open_locked(path, opts, lock)
    }

    fn open_locked(path: &Path, opts: SqliteOptions, lock: StoreLock) -> Result<Self, SqliteError> {
        check_not_truncated(path)?;
        let mut conn = open_connection(path, &opts).map_err(corrupt_at_open)?;
        schema::migrate(&mut conn).map_err(corrupt_at_open)?;
        let shards = shards::adopt(&mut conn, opts.shard_count)?;
        conn.execute(
            "UPDATE store_settings SET value = ?1 WHERE name = 'attempts_kept'",
            params![i64::from(opts.attempts_kept.max(1))],
        )?;
        // Checkpoints run on the writer's checkpoint thread; the automatic one (inside a commit)
        // is only a backstop, at 64 MiB of WAL instead of SQLite's 4 MiB.
        conn.pragma_update(None, "wal_autocheckpoint", 16_384)?;
        let checkpoint_conn = open_connection(path, &opts)?;
        let writer = Writer::start(conn, checkpoint_conn, opts.max_batch)?;
        let condition = writer.condition();
        Ok(SqliteStore {
            writer: Arc::new(writer),
            readers: Arc::new(ReaderPool {
                path: path.to_path_buf(),
                opts,
                idle: Mutex::new(Vec::new()),
            }),
            shards,
            condition,
            _lock: Arc::new(lock),
        })
    }

    /// The shard count this store runs with and where it came from. Tasks are hashed into and
    /// scanned by these shards, so an engine on this store must use this count whatever it was
    /// configured with (`sundial::Builder::open` adopts it).
    pub fn shards(&self) -> StoreShards {
        self.shards
    }

    /// Runs `f` on a read connection from the pool, on a blocking thread.
    /// The plan SQLite chooses for a page of `list` with `filter`: the `detail` lines of
    /// `EXPLAIN QUERY PLAN` of the very statement `list` runs. For checking that every filter
    /// is served by an index (`tests/list_plans.rs`) and for operators.
    pub async fn explain_list(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let filter = filter.clone();
        self.read(move |conn| {
            let columns = qualified_columns();
            let (sql, args) = filtered(
                &filter,
                &columns,
                limit.saturating_add(1),
                LIST_VISIT_BUDGET,
            );
            let mut stmt = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .map_err(backend)?;
            let params: Vec<&dyn rusqlite::ToSql> = args.iter().map(|b| b.as_ref()).collect();
            let mut rows = stmt.query(params.as_slice()).map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                out.push(r.get::<_, String>(3).map_err(backend)?);
            }
            Ok(out)
        })
        .await
    }

    async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let pool = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match pool.idle.lock().ok().and_then(|mut v| v.pop()) {
                Some(c) => c,
                None => open_connection(&pool.path, &pool.opts).map_err(StoreError::from)?,
            };
            let out = f(&conn);
            if let Ok(mut idle) = pool.idle.lock()
                && idle.len() < pool.opts.readers
            {
                idle.push(conn);
            }
            out
        })
        .await
        .map_err(StoreError::backend)?
    }
}

/// SQLite's answer to a file that is not a database, at open, as [`SqliteError::Corrupt`].
fn corrupt_at_open(e: SqliteError) -> SqliteError {
    match &e {
        SqliteError::Sqlite(inner)
            if matches!(
                inner.sqlite_error_code(),
                Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
            ) =>
        {
            SqliteError::Corrupt(inner.to_string())
        }
        _ => e,
    }
}

/// Refuses a database file shorter than its header says it is (cut off by a failed copy or a
/// full disk), which SQLite itself would only notice when a read reaches the missing pages. A
/// file with a write-ahead log beside it is left to SQLite (pages may live in the log).
fn check_not_truncated(path: &Path) -> Result<(), SqliteError> {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return Ok(()); // a new store
    };
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
        return Ok(());
    }
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut header = [0u8; 100];
    if len == 0 || file.read_exact(&mut header).is_err() {
        return if len == 0 {
            Ok(())
        } else {
            Err(SqliteError::Corrupt(format!(
                "{} is {len} bytes, shorter than a database header",
                path.display()
            )))
        };
    }
    if &header[..16] != b"SQLite format 3\0" {
        return Err(SqliteError::Corrupt(format!(
            "{} is not a SQLite database",
            path.display()
        )));
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536u64,
        n => u64::from(n),
    };
    let pages = u64::from(u32::from_be_bytes([
        header[28], header[29], header[30], header[31],
    ]));
    // The page count is valid only when the change counter matches its "valid for" copy.
    let valid = header[24..28] == header[92..96];
    if valid && pages * page_size > len {
        return Err(SqliteError::Corrupt(format!(
            "{} is truncated: {len} bytes, its header says {} pages of {page_size} bytes",
            path.display(),
            pages
        )));
    }
    Ok(())
}

/// Statements each connection keeps prepared (rusqlite's default is 16; the store has several
/// times that many, and a statement that falls out of the cache is parsed and planned again).
const STATEMENT_CACHE: usize = 256;

fn open_connection(path: &Path, opts: &SqliteOptions) -> Result<Connection, SqliteError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // Plans never depend on bound values. Without this, SQLite plans a statement with its bound
    // values wherever they could decide the plan (a `LIMIT ?`, a term a partial index's `WHERE`
    // could imply) and marks it expired whenever its bindings change or are cleared, which
    // rusqlite does each time a cached statement goes back to the cache: the statement is then
    // parsed and planned again on every use (a tenth of the writer thread's time when it was
    // found). Every hot statement names its states as literals, so partial indexes stay usable.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match opts.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "cache_size", -opts.cache_kib)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(conn)
}

/// A shard's scheduled tasks due by `?2` after the cursor `(?3, ?4)`, in due order: `scan_due`.
const SCAN_DUE_SQL: &str = "SELECT due_at, id, queue, kind, timeout_ms, \
     json_extract(target, '$.url'), priority FROM tasks INDEXED BY tasks_due \
     WHERE state = 'scheduled' AND shard = ?1 AND due_at <= ?2 \
     AND (due_at, id) > (?3, ?4) ORDER BY due_at, id LIMIT ?5";

/// A page of a queue's ready tasks (of the kinds `?2`, a JSON array, when not null) by rank and
/// id after `(?3, ?4)`, leaving out those whose exclusive key is taken: `claim_ready`'s
/// candidates.
fn ready_candidates_sql() -> String {
    format!(
        "SELECT {RANK_SQL}, id, rate FROM tasks INDEXED BY tasks_ready \
         WHERE state = 'ready' AND queue = ?1 \
         AND (?2 IS NULL OR kind IN (SELECT value FROM json_each(?2))) \
         AND ({RANK_SQL}, id) > (?3, ?4) AND {GROUP_FREE_SQL} \
         ORDER BY {RANK_SQL}, id LIMIT ?5"
    )
}

/// [`Store::claim_ready`] inside the writer's transaction.
fn claim_ready_in(conn: &Connection, claim: &ReadyClaim) -> Result<ReadyTaken, StoreError> {
    let want = claim.execution_ids.len();
    let kinds = claim
        .kinds
        .as_ref()
        .map(|k| serde_json::to_string(k).unwrap_or_else(|_| "[]".to_string()));
    // Candidates by rank (the due time moved by the priority, `sundial_core::priority`)
    // and id, page by page, leaving out tasks whose exclusive key a running task
    // holds: however many of those come first, the free ones behind them are
    // reached. A candidate can still lose its key to a task started earlier in this
    // call; the update checks again.
    let mut stmt = conn
        .prepare_cached(&ready_candidates_sql())
        .map_err(backend)?;
    let sql = format!(
        "UPDATE tasks SET state = 'running', attempt = attempt + 1, execution_id = ?2, \
         lease_expires_at = MAX(?3, due_at) + timeout_ms, started_at = MAX(?3, due_at), \
         updated_at = MAX(?3, due_at), \
         worker = ?4 WHERE id = ?1 AND state = 'ready' AND {GROUP_FREE_SQL} \
         RETURNING {TASK_COLUMNS}"
    );
    // The queue's concurrency limit: no more starts than it has free places.
    let free: Option<i64> = conn
        .prepare_cached(
            "SELECT json_extract(q.config, '$.concurrency') - (SELECT count(*) \
             FROM tasks r WHERE r.queue = q.queue AND r.state = 'running') \
             FROM queue_settings q WHERE q.queue = ?1",
        )
        .map_err(backend)?
        .query_row(params![claim.queue], |r| r.get(0))
        .optional()
        .map_err(backend)?
        .flatten();
    let want = match free {
        Some(free) => want.min(usize::try_from(free.max(0)).unwrap_or(0)),
        None => want,
    };
    let page = (want * 4 + 16) as i64;
    // The empty blob sorts before every id.
    let mut after: (i64, Vec<u8>) = (i64::MIN, Vec::new());
    let mut out = Vec::with_capacity(want);
    let mut turns = TakeTurns::new(claim.now);
    while out.len() < want {
        let rows: Vec<(i64, Vec<u8>, Option<String>)> = stmt
            .query_map(params![claim.queue, kinds, after.0, after.1, page], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(backend)?
            .collect::<Result<_, _>>()
            .map_err(backend)?;
        let Some(last) = rows.last() else {
            break;
        };
        after = (last.0, last.1.clone());
        for (_, id, rate) in rows {
            if out.len() >= want {
                break;
            }
            let Some(exec) = claim.execution_ids.get(out.len()) else {
                break;
            };
            // A rate limit: taken only at its key's take turn.
            let rate = rate
                .map(|r| serde_json::from_str::<RateLimit>(&r))
                .transpose()
                .map_err(|e| StoreError::corrupt_from("rate", e))?;
            let take_key = rate.as_ref().map(|r| r.take_key(&claim.queue));
            if let Some(key) = &take_key
                && !turns.open(conn, key)?
            {
                continue;
            }
            if let Some(t) = update_returning(
                conn,
                &sql,
                &[
                    &id,
                    &exec.as_bytes().as_slice(),
                    &claim.now.0,
                    &claim.worker,
                ],
            )? {
                if let (Some(key), Some(rate)) = (take_key, &rate) {
                    turns.take(conn, key, t.started_at.unwrap_or(claim.now), rate)?;
                }
                out.push(t);
            }
        }
    }
    Ok(ReadyTaken::new(out, turns.next_turn()))
}

/// [`Store::complete`] inside the writer's transaction.
fn complete_in(
    conn: &Connection,
    id: &TaskId,
    execution: &ExecutionId,
    now: Timestamp,
    result: Option<&str>,
) -> Result<Task, TransitionError> {
    let sql = format!(
        "UPDATE tasks SET state = 'succeeded', result = ?3, updated_at = ?4, \
         finished_at = ?4, lease_expires_at = NULL \
         WHERE id = ?1 AND state = 'running' AND execution_id = ?2 \
         RETURNING {TASK_COLUMNS}"
    );
    update_returning(
        conn,
        &sql,
        &[
            &id.as_bytes().as_slice(),
            &execution.as_bytes().as_slice(),
            &result,
            &now.0,
        ],
    )?
    .ok_or_else(|| attempt_refusal(conn, id))
}

fn get_task(conn: &Connection, id: &TaskId) -> Result<Option<Task>, StoreError> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1");
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let row = stmt
        .query_row(params![id.as_bytes()], |r| Ok(task_from_row(r)))
        .optional()
        .map_err(backend)?;
    row.transpose()
}

/// [`Store::insert_idempotent`] inside the writer's transaction.
fn insert_idempotent(
    conn: &Connection,
    c: &IdempotentCreate,
) -> Result<IdempotentOutcome, StoreError> {
    let record: Option<(i64, String, Vec<u8>, i64)> = conn
        .prepare_cached(
            "SELECT version, fingerprint, task_id, created_at FROM idempotency \
             WHERE queue = ?1 AND key = ?2",
        )
        .map_err(backend)?
        .query_row(params![c.task.queue, c.key], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
        .map_err(backend)?;
    let remembered = match &record {
        Some((v, fp, id, recorded_at)) => get_task(conn, &rows::task_id(id)?)?
            .filter(|t| idempotency_remembered(t, Timestamp(*recorded_at), c.remember, c.now))
            .map(|t| (*v as u64, fp.clone(), t)),
        None => None,
    };
    let decision = idempotency_decision(
        remembered.as_ref().map(|(v, fp, t)| (*v, fp.as_str(), t)),
        c.version,
        &c.fingerprint,
    );
    if let IdempotencyDecision::Answer(a) = decision {
        return Ok(a);
    }
    match insert_many(conn, std::slice::from_ref(&c.task))?.pop() {
        Some(Inserted::Created(t)) => {
            conn.prepare_cached(
                "INSERT INTO idempotency (queue, key, version, fingerprint, task_id, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (queue, key) DO UPDATE SET \
                 version = excluded.version, fingerprint = excluded.fingerprint, \
                 task_id = excluded.task_id, created_at = excluded.created_at",
            )
            .map_err(backend)?
            .execute(params![
                c.task.queue,
                c.key,
                c.version as i64,
                c.fingerprint,
                t.id.as_bytes(),
                c.now.0
            ])
            .map_err(backend)?;
            Ok(IdempotentOutcome::Created(t))
        }
        Some(Inserted::Duplicate { existing }) => Ok(IdempotentOutcome::Duplicate { existing }),
        None => Err(StoreError::NoRow { what: "insert" }),
    }
}

/// [`Store::insert_debounced`] inside the writer's transaction (the single writer serialises
/// calls with one key).
fn insert_debounced(conn: &Connection, c: &DebouncedCreate) -> Result<DebounceOutcome, StoreError> {
    let pending: Option<(Vec<u8>, i64)> = conn
        .prepare_cached(
            "SELECT id, created_at FROM tasks \
             WHERE queue = ?1 AND debounce_key = ?2 AND state = 'scheduled' AND attempt = 0",
        )
        .map_err(backend)?
        .query_row(params![c.task.queue, c.key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(backend)?;
    if let Some((id, created_at)) = pending {
        let due = debounced_due(c.task.due_at, Timestamp(created_at), c.max_wait_ms);
        conn.prepare_cached(
            "UPDATE tasks SET payload = ?2, due_at = ?3, updated_at = ?4 WHERE id = ?1",
        )
        .map_err(backend)?
        .execute(params![id, c.task.payload, due.0, c.now.0])
        .map_err(backend)?;
        let task = get_task(conn, &rows::task_id(&id)?)?.ok_or(StoreError::NoRow {
            what: "debounced task",
        })?;
        return Ok(DebounceOutcome::Replaced(Box::new(task)));
    }
    match insert_many(conn, std::slice::from_ref(&c.task))?.pop() {
        Some(Inserted::Created(t)) => {
            conn.prepare_cached("UPDATE tasks SET debounce_key = ?2 WHERE id = ?1")
                .map_err(backend)?
                .execute(params![t.id.as_bytes(), c.key])
                .map_err(backend)?;
            Ok(DebounceOutcome::Created(t))
        }
        Some(Inserted::Duplicate { existing }) => Ok(DebounceOutcome::Duplicate { existing }),
        None => Err(StoreError::NoRow { what: "insert" }),
    }
}

fn state_of(conn: &Connection, id: &TaskId) -> Result<Option<TaskState>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT state FROM tasks WHERE id = ?1")
        .map_err(backend)?;
    let s: Option<String> = stmt
        .query_row(params![id.as_bytes()], |r| r.get(0))
        .optional()
        .map_err(backend)?;
    s.map(|s| rows::parse_state(&s)).transpose()
}

/// Runs an `UPDATE … RETURNING <task columns>` and decodes the row it returned, if any.
fn update_returning(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<Option<Task>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let row = stmt
        .query_row(params, |r| Ok(task_from_row(r)))
        .optional()
        .map_err(backend)?;
    row.transpose()
}

/// Why a conditional update on an attempt touched nothing.
fn attempt_refusal(conn: &Connection, id: &TaskId) -> TransitionError {
    match state_of(conn, id) {
        Ok(None) => TransitionError::NotFound,
        Ok(Some(state)) => TransitionError::StaleExecution { state },
        Err(e) => e.into(),
    }
}

/// [`TASK_COLUMNS`] qualified with `t.` (a tag filter joins `task_tags`, whose `key` would be
/// ambiguous).
fn qualified_columns() -> String {
    TASK_COLUMNS
        .split(", ")
        .map(|c| format!("t.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Positional parameters of a statement being built.
#[derive(Default)]
struct Args(Vec<Box<dyn rusqlite::ToSql>>);

impl Args {
    /// Adds `v` and answers its placeholder (`?n`).
    fn add(&mut self, v: Box<dyn rusqlite::ToSql>) -> String {
        self.0.push(v);
        format!("?{}", self.0.len())
    }
}

/// The candidates of a page: `SELECT <id> AS id … ORDER BY <id> DESC LIMIT <budget>` from the
/// driving index of `driver` (see [`ListDriver`]), named with `INDEXED BY` so that SQLite's
/// planner, which keeps no statistics here, cannot walk another one; below the cursor, with only
/// the conditions that index serves.
fn driver_sql(filter: &TaskFilter, driver: ListDriver, budget: &str, args: &mut Args) -> String {
    let index = match driver {
        ListDriver::Key => " INDEXED BY tasks_key_id",
        ListDriver::DeadGroup => " INDEXED BY tasks_dead_error",
        ListDriver::QueueState => " INDEXED BY tasks_queue_state_id",
        ListDriver::Queue => " INDEXED BY tasks_queue_id",
        ListDriver::Kind => " INDEXED BY tasks_kind_id",
        ListDriver::State => " INDEXED BY tasks_state_id",
        // The primary key of `task_tags` is the table (`WITHOUT ROWID`); the id's own index.
        ListDriver::Tag | ListDriver::Id => "",
    };
    let (from, idcol, mut conds) = match driver {
        ListDriver::Tag => {
            let mut conds = String::new();
            if let Some((k, v)) = filter.tags.first() {
                let k = args.add(Box::new(k.clone()));
                let v = args.add(Box::new(v.clone()));
                conds = format!(" AND g.key = {k} AND g.value = {v}");
            }
            ("task_tags g".to_string(), "g.task_id", conds)
        }
        _ => (format!("tasks d{index}"), "d.id", String::new()),
    };
    match driver {
        ListDriver::Key => {
            if let Some(k) = &filter.key {
                let k = args.add(Box::new(k.clone()));
                conds.push_str(&format!(" AND d.key IS NOT NULL AND d.key = {k}"));
            }
        }
        ListDriver::DeadGroup => {
            // The partial index `tasks_dead_error (queue, <group>, id) WHERE state = 'dead'`:
            // its predicate is implied by a literal, and its expression is repeated to the letter.
            let q = args.add(Box::new(filter.queue.clone()));
            let g = args.add(Box::new(filter.error_group.clone()));
            conds.push_str(&format!(
                " AND d.queue = {q} AND d.state = 'dead' AND {} = {g}",
                ops::ERROR_GROUP_SQL
            ));
        }
        ListDriver::QueueState | ListDriver::Queue => {
            let q = args.add(Box::new(filter.queue.clone()));
            conds.push_str(&format!(" AND d.queue = {q}"));
            if driver == ListDriver::QueueState
                && let Some(st) = filter.state
            {
                let st = args.add(Box::new(st.as_str()));
                conds.push_str(&format!(" AND d.state = {st}"));
            }
        }
        ListDriver::Kind => {
            let k = args.add(Box::new(filter.kind.clone()));
            conds.push_str(&format!(" AND d.kind = {k}"));
        }
        ListDriver::State => {
            if let Some(st) = filter.state {
                let st = args.add(Box::new(st.as_str()));
                conds.push_str(&format!(" AND d.state = {st}"));
            }
        }
        ListDriver::Tag | ListDriver::Id => {}
    }
    if let Some(b) = filter.before {
        let b = args.add(Box::new(b.as_bytes().to_vec()));
        conds.push_str(&format!(" AND {idcol} < {b}"));
    }
    format!(
        "SELECT {idcol} AS id FROM {from} WHERE 1 = 1{conds} ORDER BY {idcol} DESC LIMIT {budget}"
    )
}

/// Every condition of `filter` but the cursor, on `t` (the task row of a candidate).
fn conditions(filter: &TaskFilter, args: &mut Args) -> String {
    let mut sql = String::new();
    for (k, v) in &filter.tags {
        let k = args.add(Box::new(k.clone()));
        let v = args.add(Box::new(v.clone()));
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM task_tags h WHERE h.key = {k} AND h.value = {v} \
             AND h.task_id = t.id)"
        ));
    }
    if let Some(q) = &filter.queue {
        let q = args.add(Box::new(q.clone()));
        sql.push_str(&format!(" AND t.queue = {q}"));
    }
    if let Some(k) = &filter.kind {
        let k = args.add(Box::new(k.clone()));
        sql.push_str(&format!(" AND t.kind = {k}"));
    }
    if let Some(st) = filter.state {
        // The states are a closed set of plain words.
        sql.push_str(&format!(" AND t.state = '{}'", st.as_str()));
    }
    if let Some(k) = &filter.key {
        let k = args.add(Box::new(k.clone()));
        sql.push_str(&format!(" AND t.key = {k}"));
    }
    if let Some(p) = &filter.key_prefix {
        let lo = args.add(Box::new(p.clone()));
        sql.push_str(&format!(" AND t.key >= {lo}"));
        if let Some(upper) = sundial_store::prefix_upper_bound(p) {
            let hi = args.add(Box::new(upper));
            sql.push_str(&format!(" AND t.key < {hi}"));
        }
    }
    if let Some(g) = &filter.error_group {
        let g = args.add(Box::new(g.clone()));
        sql.push_str(&format!(" AND {} = {g}", ops::ERROR_GROUP_SQL));
    }
    let ranges = [
        (filter.due_after, "t.due_at >="),
        (filter.due_before, "t.due_at <"),
        (filter.created_after, "t.created_at >="),
        (filter.created_before, "t.created_at <"),
    ];
    for (t, cmp) in ranges {
        if let Some(t) = t {
            let t = args.add(Box::new(t.0));
            sql.push_str(&format!(" AND {cmp} {t}"));
        }
    }
    if filter.exclude_internal {
        // Exact (no LIKE wildcards, case-sensitive); the prefix is ASCII, so characters are bytes.
        let p = args.add(Box::new(sundial_core::INTERNAL_QUEUE_PREFIX));
        sql.push_str(&format!(
            " AND substr(t.queue, 1, {}) <> {p}",
            sundial_core::INTERNAL_QUEUE_PREFIX.len()
        ));
    }
    if let Some(ns) = &filter.namespace {
        match sundial_core::namespace::stored_prefix(ns) {
            // Exact, like the internal-queue test above; namespace names are ASCII.
            Some(prefix) => {
                let n = prefix.len();
                let p = args.add(Box::new(prefix));
                sql.push_str(&format!(" AND substr(t.queue, 1, {n}) = {p}"));
            }
            // The default namespace's names are those without the separator (char 31).
            None => sql.push_str(" AND instr(t.queue, char(31)) = 0"),
        }
    }
    sql
}

/// The query behind `list` and `select`: `columns` (qualified `t.`) of at most `limit` tasks
/// matching `filter`, newest id first, found among at most `budget` candidates of the driving
/// index ([`TaskFilter::list_driver`]), followed by two columns: how many candidates were
/// visited and the oldest of them (the same on every row; one row of NULL task columns when
/// nothing matched). The other filters apply to the candidates' task rows. A `key_prefix`
/// without a better driver first probes `tasks_key_id` for at most `budget + 1` keys of the
/// range ([`TaskFilter::probes_key_prefix`]): a range that fits the budget is the candidate set,
/// a larger one leaves the candidates to the driver.
fn filtered(
    filter: &TaskFilter,
    columns: &str,
    limit: usize,
    budget: usize,
) -> (String, Vec<Box<dyn rusqlite::ToSql>>) {
    let param = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let mut args = Args::default();
    let b = args.add(Box::new(param(budget)));
    let driver = driver_sql(filter, filter.list_driver(), &b, &mut args);
    let (with, candidates) = match &filter.key_prefix {
        Some(p) if filter.probes_key_prefix() => {
            let lo = args.add(Box::new(p.clone()));
            let mut probe = format!(
                "SELECT d.id FROM tasks d INDEXED BY tasks_key_id \
                 WHERE d.key IS NOT NULL AND d.key >= {lo}"
            );
            if let Some(upper) = sundial_store::prefix_upper_bound(p) {
                let hi = args.add(Box::new(upper));
                probe.push_str(&format!(" AND d.key < {hi}"));
            }
            if let Some(before) = filter.before {
                let c = args.add(Box::new(before.as_bytes().to_vec()));
                probe.push_str(&format!(" AND d.id < {c}"));
            }
            let b1 = args.add(Box::new(param(budget.saturating_add(1))));
            (
                format!("WITH k AS MATERIALIZED ({probe} ORDER BY d.key LIMIT {b1}) "),
                format!(
                    "SELECT id FROM k WHERE (SELECT count(*) FROM k) <= {b} \
                     UNION ALL SELECT f.id FROM ({driver}) f \
                     WHERE (SELECT count(*) FROM k) > {b}"
                ),
            )
        }
        _ => (String::new(), driver),
    };
    let conds = conditions(filter, &mut args);
    let lim = args.add(Box::new(param(limit)));
    let sql = format!(
        "{with}SELECT p.*, v.visited, v.oldest FROM \
         (SELECT count(*) AS visited, min(c0.id) AS oldest FROM ({candidates}) c0) v \
         LEFT JOIN (SELECT {columns} FROM ({candidates}) c CROSS JOIN tasks t ON t.id = c.id \
          WHERE 1 = 1{conds} ORDER BY c.id DESC LIMIT {lim}) p ON 1 \
         ORDER BY p.id DESC"
    );
    (sql, args.0)
}

/// Runs [`filtered`]: the task rows, decoded by `decode` (none when nothing matched), and how
/// many candidates were visited, the oldest of them.
fn run_filtered<T>(
    conn: &Connection,
    filter: &TaskFilter,
    columns: &str,
    limit: usize,
    budget: usize,
    mut decode: impl FnMut(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<(Vec<T>, usize, Option<TaskId>), StoreError> {
    let (sql, args) = filtered(filter, columns, limit, budget);
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let n = stmt.column_count();
    let params: Vec<&dyn rusqlite::ToSql> = args.iter().map(|b| b.as_ref()).collect();
    let mut rows = stmt.query(params.as_slice()).map_err(backend)?;
    let mut out = Vec::new();
    let mut visited = 0;
    let mut oldest = None;
    while let Some(r) = rows.next().map_err(backend)? {
        let v: i64 = r.get(n.saturating_sub(2)).map_err(backend)?;
        visited = usize::try_from(v).unwrap_or(usize::MAX);
        let o: Option<Vec<u8>> = r.get(n.saturating_sub(1)).map_err(backend)?;
        oldest = o.map(|o| rows::task_id(&o)).transpose()?;
        // The one row of an empty page has no task: its id column is NULL.
        let id: Option<Vec<u8>> = r.get(0).map_err(backend)?;
        if id.is_some() {
            out.push(decode(r)?);
        }
    }
    Ok((out, visited, oldest))
}

/// Rows per multi-row `INSERT` statement (`INSERT_PARAMS` parameters each; SQLite allows 32,766).
///
/// Inserting a batch row by row is quadratic in SQLite here: every statement inside the job's
/// savepoint opens a statement savepoint that copies the pages it touches into the in-memory
/// sub-journal again, and releasing it walks that journal from the start. One statement per chunk
/// keeps both costs per chunk instead of per row.
const INSERT_CHUNK: usize = 64;
const INSERT_PARAMS: usize = 20;

/// Inserts `tasks` in order; a task whose live `(queue, key)` is already held (by an earlier
/// task, possibly of the same batch) becomes [`Inserted::Duplicate`].
pub(crate) fn insert_many(
    conn: &Connection,
    tasks: &[NewTask],
) -> Result<Vec<Inserted>, StoreError> {
    let mut out = Vec::with_capacity(tasks.len());
    for chunk in tasks.chunks(INSERT_CHUNK) {
        insert_chunk(conn, chunk, &mut out)?;
    }
    Ok(out)
}

fn insert_chunk(
    conn: &Connection,
    chunk: &[NewTask],
    out: &mut Vec<Inserted>,
) -> Result<(), StoreError> {
    let backoffs = chunk
        .iter()
        .map(|t| serde_json::to_string(&t.backoff))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| StoreError::encode("backoff", e))?;
    let values = (0..chunk.len())
        .map(|i| {
            let p = |n: usize| i * INSERT_PARAMS + n;
            format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, 'scheduled', 0, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})",
                p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11), p(12), p(13), p(13), p(14), p(15), p(16), p(17), p(18), p(19), p(20)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    // No conflict target: a row that would break any uniqueness (a live key, a reused id) is
    // skipped and simply not returned; the loop below says why.
    let sql = format!(
        "INSERT INTO tasks (id, shard, queue, kind, key, payload, due_at, state, attempt, \
         max_attempts, backoff, timeout_ms, exclusive_key, exclusive_mode, created_at, updated_at, \
         tags, target, traceparent, tracestate, priority, exclusive_limit, rate) VALUES {values} \
         ON CONFLICT DO NOTHING RETURNING {TASK_COLUMNS}"
    );
    let timeouts: Vec<i64> = chunk.iter().map(|t| t.timeout_ms as i64).collect();
    let priorities: Vec<u8> = chunk.iter().map(|t| t.priority.get()).collect();
    let group_limits: Vec<u32> = chunk
        .iter()
        .map(|t| t.exclusive.as_ref().map_or(1, |e| e.limit))
        .collect();
    let tags = chunk
        .iter()
        .map(|t| {
            if t.tags.is_empty() {
                Ok(None)
            } else {
                serde_json::to_string(&t.tags).map(Some)
            }
        })
        .collect::<Result<Vec<Option<String>>, _>>()
        .map_err(|e| StoreError::encode("tags", e))?;
    let targets = chunk
        .iter()
        .map(|t| t.target.as_ref().map(serde_json::to_string).transpose())
        .collect::<Result<Vec<Option<String>>, _>>()
        .map_err(|e| StoreError::encode("target", e))?;
    let rates = chunk
        .iter()
        .map(|t| t.rate.as_ref().map(serde_json::to_string).transpose())
        .collect::<Result<Vec<Option<String>>, _>>()
        .map_err(|e| StoreError::encode("rate", e))?;
    let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(chunk.len() * INSERT_PARAMS);
    let modes: Vec<Option<&str>> = chunk
        .iter()
        .map(|t| t.exclusive.as_ref().map(|e| rows::mode_str(e.mode)))
        .collect();
    let traceparents: Vec<Option<&str>> = chunk
        .iter()
        .map(|t| t.trace.as_ref().map(|c| c.traceparent()))
        .collect();
    let tracestates: Vec<Option<&str>> = chunk
        .iter()
        .map(|t| t.trace.as_ref().and_then(|c| c.tracestate()))
        .collect();
    for (i, (((((t, backoff), timeout), mode), tags), target)) in chunk
        .iter()
        .zip(&backoffs)
        .zip(&timeouts)
        .zip(&modes)
        .zip(&tags)
        .zip(&targets)
        .enumerate()
    {
        args.push(t.id.as_bytes());
        args.push(&t.shard);
        args.push(&t.queue);
        args.push(&t.kind);
        args.push(&t.key);
        args.push(&t.payload);
        args.push(&t.due_at.0);
        args.push(&t.max_attempts);
        args.push(backoff);
        args.push(timeout);
        args.push(match &t.exclusive {
            Some(e) => &e.key,
            None => &rusqlite::types::Null,
        });
        args.push(mode);
        args.push(&t.created_at.0);
        args.push(tags);
        args.push(target);
        args.push(&traceparents[i]);
        args.push(&tracestates[i]);
        args.push(&priorities[i]);
        args.push(&group_limits[i]);
        args.push(&rates[i]);
    }
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let mut rows = stmt.query(args.as_slice()).map_err(backend)?;
    let mut created: HashMap<TaskId, Task> = HashMap::with_capacity(chunk.len());
    while let Some(r) = rows.next().map_err(backend)? {
        let task = task_from_row(r)?;
        created.insert(task.id, task);
    }
    drop(rows);
    for t in chunk {
        if let Some(task) = created.remove(&t.id) {
            if !task.tags.is_empty() {
                let mut tag = conn
                    .prepare_cached(
                        "INSERT INTO task_tags (key, value, task_id) VALUES (?1, ?2, ?3)",
                    )
                    .map_err(backend)?;
                for (k, v) in &task.tags {
                    tag.execute(params![k, v, task.id.as_bytes()])
                        .map_err(backend)?;
                }
            }
            out.push(Inserted::Created(Box::new(task)));
            continue;
        }
        let Some(key) = &t.key else {
            return Err(StoreError::DuplicateId { id: t.id });
        };
        let mut q = conn
            .prepare_cached(
                "SELECT id FROM tasks WHERE queue = ?1 AND key = ?2 \
                 AND state IN ('scheduled', 'ready', 'running')",
            )
            .map_err(backend)?;
        let existing: Option<Vec<u8>> = q
            .query_row(params![t.queue, key], |r| r.get(0))
            .optional()
            .map_err(backend)?;
        match existing {
            Some(b) => out.push(Inserted::Duplicate {
                existing: rows::task_id(&b)?,
            }),
            None => return Err(StoreError::DuplicateId { id: t.id }),
        }
    }
    Ok(())
}

/// Whether the task in `tasks` may start under its group limit: no exclusive key, or fewer than
/// its `exclusive_limit` running tasks with its key (over `tasks_running_exclusive`).
const GROUP_FREE_SQL: &str = "(exclusive_key IS NULL OR (SELECT count(*) FROM tasks r \
    WHERE r.state = 'running' AND r.exclusive_key = tasks.exclusive_key) < tasks.exclusive_limit)";

/// Whether the queue of the task in `tasks` has a free place under its concurrency limit
/// (`concurrency` in `queue_settings.config`): no settings or no limit, or fewer running tasks
/// of the queue than it allows (over `tasks_queue_state_id`). The `CASE` counts only for a
/// limited queue.
const QUEUE_FREE_SQL: &str = "((SELECT CASE WHEN json_extract(q.config, '$.concurrency') IS NULL \
    THEN 1 ELSE (SELECT count(*) FROM tasks r WHERE r.queue = q.queue AND r.state = 'running') \
    < json_extract(q.config, '$.concurrency') END \
    FROM queue_settings q WHERE q.queue = tasks.queue) IS NOT 0)";

/// Whether the queue of the task in `tasks` has no concurrency limit (so a chunked claim may
/// start it without counting).
const QUEUE_UNLIMITED_SQL: &str = "NOT EXISTS (SELECT 1 FROM queue_settings q \
    WHERE q.queue = tasks.queue AND json_extract(q.config, '$.concurrency') IS NOT NULL)";

/// Claims per multi-row `UPDATE` statement.
const CLAIM_CHUNK: usize = 64;

/// Claims in order. The first claim of each task without an exclusive key or a rate limit (nearly
/// all) is taken
/// with one `UPDATE … WHERE id IN (…)` per chunk; one statement per task would re-journal and walk
/// the savepoint's sub-journal per task, as with inserts (see [`INSERT_CHUNK`]). Everything else
/// goes through [`claim_one`] in the caller's order: exclusive and rate-limited tasks (whose check
/// must see the claims made just before them, which a single statement does not promise), repeated
/// claims, and
/// claims the chunk did not take, which `claim_one` then classifies.
fn claim_many(
    conn: &Connection,
    claims: &[DueClaim],
    now: Timestamp,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let mut taken: HashMap<TaskId, ClaimOutcome> = HashMap::with_capacity(claims.len());
    // Only the first claim of a task can take it; a repeat falls through to `claim_one`, which
    // finds it taken.
    let mut seen = HashSet::with_capacity(claims.len());
    let first: Vec<&DueClaim> = claims.iter().filter(|c| seen.insert(c.id)).collect();
    let runs: Vec<(&DueClaim, ExecutionId, Timestamp, Option<&str>)> = first
        .iter()
        .copied()
        .filter_map(|c| match &c.target {
            ClaimTarget::Run {
                execution,
                lease_until,
                worker,
            } => Some((c, *execution, *lease_until, worker.as_deref())),
            ClaimTarget::Ready => None,
        })
        .collect();
    for chunk in runs.chunks(CLAIM_CHUNK) {
        let values = (0..chunk.len())
            .map(|i| {
                format!(
                    "(?{}, ?{}, ?{}, ?{})",
                    4 * i + 2,
                    4 * i + 3,
                    4 * i + 4,
                    4 * i + 5
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "WITH c(id, execution, lease, worker) AS (VALUES {values}) \
             UPDATE tasks SET state = 'running', attempt = attempt + 1, \
             execution_id = (SELECT execution FROM c WHERE c.id = tasks.id), \
             lease_expires_at = (SELECT lease FROM c WHERE c.id = tasks.id), \
             started_at = ?1, updated_at = ?1, \
             worker = (SELECT worker FROM c WHERE c.id = tasks.id) \
             WHERE id IN (SELECT id FROM c) AND state = 'scheduled' AND due_at <= ?1 \
             AND exclusive_key IS NULL AND rate IS NULL AND {QUEUE_UNLIMITED_SQL} \
             RETURNING {TASK_COLUMNS}"
        );
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(1 + 4 * chunk.len());
        args.push(&now.0);
        for (c, execution, lease_until, worker) in chunk {
            args.push(c.id.as_bytes());
            args.push(execution.as_bytes());
            args.push(&lease_until.0);
            args.push(worker);
        }
        collect_taken(conn, &sql, &args, &mut taken, |t| {
            ClaimOutcome::Started(Box::new(t))
        })?;
    }
    let readies: Vec<&DueClaim> = first
        .iter()
        .copied()
        .filter(|c| c.target == ClaimTarget::Ready)
        .collect();
    for chunk in readies.chunks(CLAIM_CHUNK) {
        let ids = (0..chunk.len())
            .map(|i| format!("?{}", i + 2))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "UPDATE tasks SET state = 'ready', updated_at = ?1 \
             WHERE id IN ({ids}) AND state = 'scheduled' AND due_at <= ?1 \
             AND exclusive_key IS NULL AND rate IS NULL RETURNING {TASK_COLUMNS}"
        );
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(1 + chunk.len());
        args.push(&now.0);
        for c in chunk {
            args.push(c.id.as_bytes());
        }
        collect_taken(conn, &sql, &args, &mut taken, |t| {
            ClaimOutcome::Readied(Box::new(t))
        })?;
    }
    claims
        .iter()
        .map(|c| match taken.remove(&c.id) {
            Some(outcome) => Ok(outcome),
            None => claim_one(conn, c, now),
        })
        .collect()
}

/// Runs a claiming `UPDATE … RETURNING` and files each returned task under its id.
fn collect_taken(
    conn: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
    taken: &mut HashMap<TaskId, ClaimOutcome>,
    outcome: impl Fn(Task) -> ClaimOutcome,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let mut rows = stmt.query(args).map_err(backend)?;
    while let Some(r) = rows.next().map_err(backend)? {
        let task = task_from_row(r)?;
        taken.insert(task.id, outcome(task));
    }
    Ok(())
}

/// The rate limit of a claimable task and the key it is counted under, when it has one.
fn rate_of(
    conn: &Connection,
    c: &DueClaim,
    now: Timestamp,
) -> Result<Option<(String, RateLimit)>, StoreError> {
    let row: Option<(String, String)> = conn
        .prepare_cached(
            "SELECT queue, rate FROM tasks \
             WHERE id = ?1 AND state = 'scheduled' AND due_at <= ?2 AND rate IS NOT NULL",
        )
        .map_err(backend)?
        .query_row(params![c.id.as_bytes(), now.0], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(backend)?;
    row.map(|(queue, rate)| {
        let rate: RateLimit =
            serde_json::from_str(&rate).map_err(|e| StoreError::corrupt_from("rate", e))?;
        Ok((rate.store_key(&queue), rate))
    })
    .transpose()
}

/// The take turns of rate limit keys within one worker claim (`RateLimit::take_key`): read from
/// `rate_limits` once per key, then kept as the claim takes (the writer's transaction serialises
/// every check and update of them).
struct TakeTurns {
    now: Timestamp,
    next: HashMap<String, i64>,
    /// The earliest turn of a key this claim passed over.
    passed: Option<i64>,
}

impl TakeTurns {
    fn new(now: Timestamp) -> Self {
        Self {
            now,
            next: HashMap::new(),
            passed: None,
        }
    }

    /// Whether `key` may take a task now; when not, its turn is remembered for
    /// [`TakeTurns::next_turn`].
    fn open(&mut self, conn: &Connection, key: &str) -> Result<bool, StoreError> {
        let next = match self.next.get(key) {
            Some(next) => *next,
            None => {
                let next: i64 = conn
                    .prepare_cached("SELECT next_at FROM rate_limits WHERE key = ?1")
                    .map_err(backend)?
                    .query_row(params![key], |r| r.get(0))
                    .optional()
                    .map_err(backend)?
                    .unwrap_or(i64::MIN);
                self.next.insert(key.to_string(), next);
                next
            }
        };
        if next > self.now.0 {
            self.passed = Some(self.passed.map_or(next, |p| p.min(next)));
            return Ok(false);
        }
        Ok(true)
    }

    /// Records a take under `key` that started at `started`: the key's next take comes one
    /// interval later.
    fn take(
        &mut self,
        conn: &Connection,
        key: String,
        started: Timestamp,
        rate: &RateLimit,
    ) -> Result<(), StoreError> {
        let interval = i64::try_from(rate.interval_ms()).unwrap_or(i64::MAX);
        let next = started.0.saturating_add(interval);
        conn.prepare_cached(
            "INSERT INTO rate_limits (key, next_at) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET next_at = excluded.next_at",
        )
        .map_err(backend)?
        .execute(params![key, next])
        .map_err(backend)?;
        self.next.insert(key, next);
        Ok(())
    }

    fn next_turn(&self) -> Option<Timestamp> {
        self.passed.map(Timestamp)
    }
}

fn claim_one(conn: &Connection, c: &DueClaim, now: Timestamp) -> Result<ClaimOutcome, StoreError> {
    // A rate limit: the key's next start may not come before its `next_at` (the writer's
    // transaction serialises every check and update of it).
    let rate = rate_of(conn, c, now)?;
    if let Some((key, limit)) = &rate {
        let next: Option<i64> = conn
            .prepare_cached("SELECT next_at FROM rate_limits WHERE key = ?1")
            .map_err(backend)?
            .query_row(params![key], |r| r.get(0))
            .optional()
            .map_err(backend)?;
        if let Some(next) = next
            && next > now.0
        {
            return Ok(ClaimOutcome::RateLimited {
                key: key.clone(),
                until: Timestamp(next),
                interval_ms: limit.interval_ms(),
            });
        }
    }
    let outcome = claim_one_unlimited(conn, c, now)?;
    if let (Some((key, limit)), ClaimOutcome::Started(_) | ClaimOutcome::Readied(_)) =
        (&rate, &outcome)
    {
        let interval = i64::try_from(limit.interval_ms()).unwrap_or(i64::MAX);
        conn.prepare_cached(
            "INSERT INTO rate_limits (key, next_at) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET next_at = excluded.next_at",
        )
        .map_err(backend)?
        .execute(params![key, now.0.saturating_add(interval)])
        .map_err(backend)?;
    }
    Ok(outcome)
}

fn claim_one_unlimited(
    conn: &Connection,
    c: &DueClaim,
    now: Timestamp,
) -> Result<ClaimOutcome, StoreError> {
    const FREE: &str = GROUP_FREE_SQL;
    let claimed = match &c.target {
        ClaimTarget::Run {
            execution,
            lease_until,
            worker,
        } => {
            let sql = format!(
                "UPDATE tasks SET state = 'running', attempt = attempt + 1, execution_id = ?2, \
                 lease_expires_at = ?3, started_at = ?4, updated_at = ?4, worker = ?5 \
                 WHERE id = ?1 AND state = 'scheduled' AND due_at <= ?4 AND {FREE} \
                 AND {QUEUE_FREE_SQL} RETURNING {TASK_COLUMNS}"
            );
            update_returning(
                conn,
                &sql,
                &[
                    &c.id.as_bytes().as_slice(),
                    &execution.as_bytes().as_slice(),
                    &lease_until.0,
                    &now.0,
                    worker,
                ],
            )?
            .map(|t| ClaimOutcome::Started(Box::new(t)))
        }
        ClaimTarget::Ready => {
            let sql = format!(
                "UPDATE tasks SET state = 'ready', updated_at = ?2 \
                 WHERE id = ?1 AND state = 'scheduled' AND due_at <= ?2 AND {FREE} \
                 RETURNING {TASK_COLUMNS}"
            );
            update_returning(conn, &sql, &[&c.id.as_bytes().as_slice(), &now.0])?
                .map(|t| ClaimOutcome::Readied(Box::new(t)))
        }
    };
    if let Some(outcome) = claimed {
        return Ok(outcome);
    }
    // Nothing changed: find out whether the queue's limit (for a start) or an exclusive key is
    // what stood in the way.
    if matches!(c.target, ClaimTarget::Run { .. }) {
        let full: Option<String> = conn
            .prepare_cached(&format!(
                "SELECT queue FROM tasks WHERE id = ?1 AND state = 'scheduled' AND due_at <= ?2 \
                 AND NOT {QUEUE_FREE_SQL}"
            ))
            .map_err(backend)?
            .query_row(params![c.id.as_bytes(), now.0], |r| r.get(0))
            .optional()
            .map_err(backend)?;
        if let Some(queue) = full {
            return Ok(ClaimOutcome::QueueFull { queue });
        }
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT exclusive_key, exclusive_mode FROM tasks \
             WHERE id = ?1 AND state = 'scheduled' AND due_at <= ?2 AND exclusive_key IS NOT NULL",
        )
        .map_err(backend)?;
    let blocked: Option<(String, String)> = stmt
        .query_row(params![c.id.as_bytes(), now.0], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(backend)?;
    match blocked {
        None => Ok(ClaimOutcome::NotClaimable),
        Some((key, mode)) if mode == "skip" => {
            let sql = format!(
                "UPDATE tasks SET state = 'cancelled', updated_at = ?2, finished_at = ?2, \
                 last_error = ?3 WHERE id = ?1 AND state = 'scheduled' RETURNING {TASK_COLUMNS}"
            );
            let reason = format!("skipped: exclusive key {key:?} was held by a running task");
            Ok(
                update_returning(conn, &sql, &[&c.id.as_bytes().as_slice(), &now.0, &reason])?
                    .map(|t| ClaimOutcome::Skipped(Box::new(t)))
                    .unwrap_or(ClaimOutcome::NotClaimable),
            )
        }
        Some((key, _)) => Ok(ClaimOutcome::Busy { exclusive_key: key }),
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert(&self, tasks: Vec<NewTask>) -> Result<Vec<Inserted>, StoreError> {
        self.writer
            .write_in_band(move |conn| insert_many(conn, &tasks))
            .await
    }

    async fn insert_idempotent(
        &self,
        create: IdempotentCreate,
    ) -> Result<IdempotentOutcome, StoreError> {
        // One writer job: the record's read, the decision and the writes share one transaction,
        // and the single writer serialises calls with one key.
        self.writer
            .write_in_band(move |conn| insert_idempotent(conn, &create))
            .await
    }

    async fn insert_debounced(
        &self,
        create: DebouncedCreate,
    ) -> Result<DebounceOutcome, StoreError> {
        self.writer
            .write_in_band(move |conn| insert_debounced(conn, &create))
            .await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        self.read(move |conn| get_task(conn, &id)).await
    }

    async fn list(&self, filter: &TaskFilter, limit: usize) -> Result<TaskPage, StoreError> {
        let filter = filter.clone();
        self.read(move |conn| {
            let columns = qualified_columns();
            // One row more than asked for tells whether another page follows.
            let (mut tasks, visited, oldest) = run_filtered(
                conn,
                &filter,
                &columns,
                limit.saturating_add(1),
                LIST_VISIT_BUDGET,
                task_from_row,
            )?;
            let n = tasks.len();
            tasks.truncate(limit);
            let next_cursor = page_cursor(
                n,
                limit,
                tasks.last().map(|t| t.id),
                visited,
                LIST_VISIT_BUDGET,
                oldest,
            );
            Ok(TaskPage { tasks, next_cursor })
        })
        .await
    }

    async fn cancel(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        self.writer
            .write(move |conn| {
                let sql = format!(
                    "UPDATE tasks SET state = 'cancelled', updated_at = ?2, finished_at = ?2, \
                     lease_expires_at = NULL \
                     WHERE id = ?1 AND state IN ('scheduled', 'ready', 'running') \
                     RETURNING {TASK_COLUMNS}"
                );
                match update_returning(conn, &sql, &[&id.as_bytes().as_slice(), &now.0])? {
                    Some(t) => Ok(t),
                    None => Err(match state_of(conn, &id)? {
                        None => TransitionError::NotFound,
                        Some(state) => TransitionError::WrongState { state },
                    }),
                }
            })
            .await
    }

    async fn trigger(&self, id: TaskId, now: Timestamp) -> Result<Task, TransitionError> {
        self.writer
            .write(move |conn| {
                let sql = format!(
                    "UPDATE tasks SET due_at = MIN(due_at, ?2), updated_at = ?2 \
                     WHERE id = ?1 AND state = 'scheduled' RETURNING {TASK_COLUMNS}"
                );
                match update_returning(conn, &sql, &[&id.as_bytes().as_slice(), &now.0])? {
                    Some(t) => Ok(t),
                    None => Err(match state_of(conn, &id)? {
                        None => TransitionError::NotFound,
                        Some(state) => TransitionError::WrongState { state },
                    }),
                }
            })
            .await
    }

    async fn scan_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
        until: Timestamp,
        limit: usize,
    ) -> Result<Vec<DueEntry>, StoreError> {
        self.read(move |conn| {
            let (after_due, after_id) = match after {
                Some(k) => (k.due_at.0, k.id.as_bytes().to_vec()),
                None => (i64::MIN, Vec::new()),
            };
            let mut stmt = conn.prepare_cached(SCAN_DUE_SQL).map_err(backend)?;
            let mut rows = stmt
                .query(params![shard, until.0, after_due, after_id, limit as i64])
                .map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                let id: Vec<u8> = r.get(1).map_err(backend)?;
                out.push(DueEntry {
                    key: DueKey {
                        due_at: Timestamp(r.get(0).map_err(backend)?),
                        id: rows::task_id(&id)?,
                    },
                    queue: r.get(2).map_err(backend)?,
                    kind: r.get(3).map_err(backend)?,
                    timeout_ms: r.get::<_, i64>(4).map_err(backend)? as u64,
                    push_host: r
                        .get::<_, Option<String>>(5)
                        .map_err(backend)?
                        .and_then(|u| sundial_core::authority(&u)),
                    priority: Priority::from_stored(r.get(6).map_err(backend)?),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn next_due(
        &self,
        shard: u32,
        after: Option<DueKey>,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.read(move |conn| {
            let (after_due, after_id) = match after {
                Some(k) => (k.due_at.0, k.id.as_bytes().to_vec()),
                None => (i64::MIN, Vec::new()),
            };
            let mut stmt = conn
                .prepare_cached(
                    "SELECT due_at FROM tasks INDEXED BY tasks_due \
                     WHERE state = 'scheduled' AND shard = ?1 AND (due_at, id) > (?2, ?3) \
                     ORDER BY due_at, id LIMIT 1",
                )
                .map_err(backend)?;
            let t: Option<i64> = stmt
                .query_row(params![shard, after_due, after_id], |r| r.get(0))
                .optional()
                .map_err(backend)?;
            Ok(t.map(Timestamp))
        })
        .await
    }

    async fn claim_due(
        &self,
        claims: Vec<DueClaim>,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        // This store grants no shard leases (one process owns every shard): no fence is current.
        if let Some(f) = fence {
            return Err(StoreError::LeaseLost { shard: f.shard });
        }
        self.writer
            .write_in_band(move |conn| claim_many(conn, &claims, now))
            .await
    }

    async fn claim_ready(&self, claim: ReadyClaim) -> Result<ReadyTaken, StoreError> {
        self.writer
            .write_in_band(move |conn| claim_ready_in(conn, &claim))
            .await
    }

    async fn heartbeat(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.writer
            .write_in_band(move |conn| {
                let sql = format!(
                    "UPDATE tasks SET lease_expires_at = MAX(lease_expires_at, ?3 + timeout_ms), \
                     updated_at = ?3 \
                     WHERE id = ?1 AND state = 'running' AND execution_id = ?2 \
                     RETURNING {TASK_COLUMNS}"
                );
                update_returning(
                    conn,
                    &sql,
                    &[
                        &id.as_bytes().as_slice(),
                        &execution.as_bytes().as_slice(),
                        &now.0,
                    ],
                )?
                .ok_or_else(|| attempt_refusal(conn, &id))
            })
            .await
    }

    async fn complete(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
    ) -> Result<Task, TransitionError> {
        self.writer
            .write_in_band(move |conn| complete_in(conn, &id, &execution, now, result.as_deref()))
            .await
    }

    async fn complete_then_claim_ready(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        result: Option<String>,
        claim: ReadyClaim,
    ) -> Result<(Task, ReadyTaken), TransitionError> {
        // One job: the completion and the claim commit together, and a refused completion
        // claims nothing.
        self.writer
            .write_in_band(move |conn| {
                let done = complete_in(conn, &id, &execution, now, result.as_deref())?;
                let taken = claim_ready_in(conn, &claim)?;
                Ok((done, taken))
            })
            .await
    }

    async fn fail(
        &self,
        id: TaskId,
        execution: ExecutionId,
        now: Timestamp,
        error: String,
        retry: Retry,
    ) -> Result<Task, TransitionError> {
        self.writer
            .write_in_band(move |conn| {
                let retry_at = match retry {
                    Retry::Never => None,
                    // The update itself checks that attempts remain.
                    Retry::At(t) => Some(t),
                    // The attempt's own row decides the backoff, read in this write (the writer
                    // thread runs one job at a time, so nothing changes it in between).
                    Retry::Backoff { .. } | Retry::After { .. } => {
                        let read = format!(
                            "SELECT {TASK_COLUMNS} FROM tasks \
                             WHERE id = ?1 AND state = 'running' AND execution_id = ?2"
                        );
                        let mut stmt = conn.prepare_cached(&read).map_err(backend)?;
                        let mut rows = stmt
                            .query(params![
                                id.as_bytes().as_slice(),
                                execution.as_bytes().as_slice()
                            ])
                            .map_err(backend)?;
                        let current = match rows.next().map_err(backend)? {
                            Some(r) => task_from_row(r)?,
                            None => {
                                drop(rows);
                                drop(stmt);
                                return Err(attempt_refusal(conn, &id));
                            }
                        };
                        retry.retry_at(&current, now)
                    }
                };
                let sql = format!(
                    "UPDATE tasks SET \
                     state = CASE WHEN ?3 IS NOT NULL AND attempt < max_attempts \
                       THEN 'scheduled' ELSE 'dead' END, \
                     due_at = CASE WHEN ?3 IS NOT NULL AND attempt < max_attempts \
                       THEN ?3 ELSE due_at END, \
                     last_error = ?4, updated_at = ?5, \
                     finished_at = CASE WHEN ?3 IS NOT NULL AND attempt < max_attempts \
                       THEN NULL ELSE ?5 END, \
                     lease_expires_at = NULL \
                     WHERE id = ?1 AND state = 'running' AND execution_id = ?2 \
                     RETURNING {TASK_COLUMNS}"
                );
                update_returning(
                    conn,
                    &sql,
                    &[
                        &id.as_bytes().as_slice(),
                        &execution.as_bytes().as_slice(),
                        &retry_at.map(|t| t.0),
                        &error,
                        &now.0,
                    ],
                )?
                .ok_or_else(|| attempt_refusal(conn, &id))
            })
            .await
    }

    async fn expire_leases(
        &self,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<Task>, StoreError> {
        // No shard leases here (see `claim_due`): no fence is current.
        if let Some(f) = fence {
            return Err(StoreError::LeaseLost { shard: f.shard });
        }
        self.writer
            .write(move |conn| {
                let sql = format!(
                    "UPDATE tasks SET \
                     state = CASE WHEN attempt < max_attempts THEN 'scheduled' ELSE 'dead' END, \
                     due_at = CASE WHEN attempt < max_attempts THEN ?1 ELSE due_at END, \
                     finished_at = CASE WHEN attempt < max_attempts THEN NULL ELSE ?1 END, \
                     last_error = 'lease expired: the attempt neither finished nor heartbeated in time', \
                     lease_expires_at = NULL, updated_at = ?1 \
                     WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_lease \
                       WHERE state = 'running' AND lease_expires_at < ?1 \
                       ORDER BY lease_expires_at LIMIT ?2) \
                     RETURNING {TASK_COLUMNS}"
                );
                let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
                let mut rows = stmt.query(params![now.0, limit as i64]).map_err(backend)?;
                let mut out = Vec::new();
                while let Some(r) = rows.next().map_err(backend)? {
                    out.push(task_from_row(r)?);
                }
                Ok(out)
            })
            .await
    }

    async fn next_lease_expiry(&self, shard: Option<u32>) -> Result<Option<Timestamp>, StoreError> {
        self.read(move |conn| {
            let t: Option<i64> = conn
                .query_row(
                    "SELECT MIN(lease_expires_at) FROM tasks INDEXED BY tasks_lease \
                     WHERE state = 'running' AND (?1 IS NULL OR shard = ?1)",
                    params![shard],
                    |r| r.get(0),
                )
                .map_err(backend)?;
            Ok(t.map(Timestamp))
        })
        .await
    }

    fn condition(&self) -> Option<String> {
        self.condition.lock().ok().and_then(|c| c.clone())
    }

    /// This process holds the data directory's lock, so every write goes through this store's
    /// writer, which counts the out-of-band ones.
    fn out_of_band_mark(&self) -> Option<sundial_store::OutOfBandMark> {
        Some(sundial_store::OutOfBandMark(self.writer.out_of_band()))
    }

    async fn count_by_state(&self) -> Result<Vec<StateCount>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT queue, state, n FROM task_counts WHERE n > 0 ORDER BY queue, state",
                )
                .map_err(backend)?;
            let mut rows = stmt.query([]).map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                let state: String = r.get(1).map_err(backend)?;
                out.push(StateCount {
                    queue: r.get(0).map_err(backend)?,
                    state: rows::parse_state(&state)?,
                    count: r.get::<_, i64>(2).map_err(backend)? as u64,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn dead_groups(
        &self,
        filter: DeadGroupFilter<'_>,
        limit: usize,
    ) -> Result<Vec<DeadGroup>, StoreError> {
        let queue = filter.queue.map(str::to_string);
        let (prefix, default_only) = filter.namespace_test();
        self.read(move |conn| {
            ops::dead_groups(
                conn,
                queue.as_deref(),
                prefix.as_deref(),
                default_only,
                limit,
            )
        })
        .await
    }

    async fn queue_settings(&self, queue: &str) -> Result<Option<QueueSettings>, StoreError> {
        let queue = queue.to_string();
        self.read(move |conn| ops::queue_settings(conn, &queue))
            .await
    }

    async fn list_queue_settings(&self) -> Result<Vec<QueueSettings>, StoreError> {
        self.read(ops::list_queue_settings).await
    }

    async fn put_queue_config(
        &self,
        queue: &str,
        config: QueueConfig,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let queue = queue.to_string();
        self.writer
            .write(move |conn| ops::put_queue_config(conn, &queue, &config, now))
            .await
    }

    async fn set_queue_paused(
        &self,
        queue: &str,
        paused: bool,
        now: Timestamp,
    ) -> Result<QueueSettings, StoreError> {
        let queue = queue.to_string();
        self.writer
            .write(move |conn| ops::set_queue_paused(conn, &queue, paused, now))
            .await
    }

    async fn earliest_waiting(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        let queue = queue.to_string();
        self.read(move |conn| ops::earliest_waiting(conn, &queue))
            .await
    }

    async fn count_rate_limited(&self, queue: &str, now: Timestamp) -> Result<u64, StoreError> {
        let queue = queue.to_string();
        self.read(move |conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM tasks INDEXED BY tasks_rate_limited \
                     WHERE queue = ?1 AND due_at <= ?2 AND rate IS NOT NULL \
                     AND state = 'scheduled'",
                )
                .map_err(backend)?
                .query_row(params![queue, now.0], |r| r.get(0))
                .map_err(backend)?;
            // Ready ones passed over until their take turn.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT rate FROM tasks INDEXED BY tasks_ready \
                     WHERE state = 'ready' AND queue = ?1 AND rate IS NOT NULL",
                )
                .map_err(backend)?;
            let rates: Vec<String> = stmt
                .query_map(params![queue], |r| r.get(0))
                .map_err(backend)?
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            let mut turns = TakeTurns::new(now);
            let mut waiting = 0i64;
            for rate in rates {
                let rate: RateLimit =
                    serde_json::from_str(&rate).map_err(|e| StoreError::corrupt_from("rate", e))?;
                if !turns.open(conn, &rate.take_key(&queue))? {
                    waiting += 1;
                }
            }
            Ok(u64::try_from(n + waiting).unwrap_or(0))
        })
        .await
    }

    async fn attempts(&self, id: TaskId) -> Result<Option<AttemptHistory>, StoreError> {
        self.read(move |conn| ops::attempts(conn, &id)).await
    }

    async fn record_attempt_response(
        &self,
        id: TaskId,
        execution: ExecutionId,
        response: sundial_store::AttemptResponse,
    ) -> Result<bool, StoreError> {
        self.writer
            .write(move |conn| ops::record_attempt_response(conn, &id, &execution, &response))
            .await
    }

    async fn retry(
        &self,
        id: TaskId,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        self.writer
            .write(move |conn| ops::retry(conn, &id, due_at, now))
            .await
    }

    async fn select(&self, filter: &TaskFilter, limit: usize) -> Result<SelectPage, StoreError> {
        let filter = filter.clone();
        self.read(move |conn| ops::select(conn, &filter, limit))
            .await
    }

    async fn cancel_many(&self, ids: Vec<TaskId>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        self.writer
            .write(move |conn| ops::cancel_many(conn, &ids, now))
            .await
    }

    async fn retry_many(
        &self,
        ids: Vec<TaskId>,
        due_at: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<Task>, StoreError> {
        self.writer
            .write(move |conn| ops::retry_many(conn, &ids, due_at, now))
            .await
    }

    async fn purge_tasks(
        &self,
        rules: &RetentionRules,
        now: Timestamp,
        limit: usize,
        fence: Option<Fence>,
    ) -> Result<u64, StoreError> {
        // No shard leases here (see `claim_due`): no fence is current.
        if let Some(f) = fence {
            return Err(StoreError::LeaseLost { shard: f.shard });
        }
        let shard = None;
        let rules = rules.clone();
        self.writer
            .write(move |conn| ops::purge_tasks(conn, shard, &rules, now, limit))
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rusqlite::StatementStatus;

    /// A cached statement is planned once. Regression: with plans that depended on bound values
    /// (`LIMIT ?`, `queue = ?` beside the partial indexes), every use of the claim's candidates
    /// and of the due scan was parsed and planned again.
    #[test]
    fn cached_hot_statements_are_not_prepared_again() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SqliteOptions::default();
        let mut conn = open_connection(&dir.path().join("s.db"), &opts).unwrap();
        schema::migrate(&mut conn).unwrap();
        let ready = ready_candidates_sql();
        let kinds: [Option<&str>; 3] = [None, Some(r#"["a"]"#), None];
        for (round, limit) in [20_i64, 20, 7, 64, 20].into_iter().enumerate() {
            let queue = format!("q{round}");
            let after: (i64, Vec<u8>) = (i64::MIN + round as i64, vec![round as u8; round]);
            let mut stmt = conn.prepare_cached(&ready).unwrap();
            let n = stmt
                .query_map(
                    params![queue, kinds[round % 3], after.0, after.1, limit],
                    |_| Ok(()),
                )
                .unwrap()
                .count();
            assert_eq!(n, 0);
            drop(stmt);
            let mut stmt = conn.prepare_cached(SCAN_DUE_SQL).unwrap();
            let n = stmt
                .query_map(
                    params![round as i64, 1_000 + round as i64, after.0, after.1, limit],
                    |_| Ok(()),
                )
                .unwrap()
                .count();
            assert_eq!(n, 0);
        }
        for sql in [ready.as_str(), SCAN_DUE_SQL] {
            let stmt = conn.prepare_cached(sql).unwrap();
            assert_eq!(
                stmt.get_status(StatementStatus::RePrepare),
                0,
                "prepared again: {sql}"
            );
        }
    }
}
