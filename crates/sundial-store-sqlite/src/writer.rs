//! The writer thread and its group commit.
//!
//! Callers send a job (a closure over the connection) and wait for its answer. The thread takes the
//! first job, then every job already queued (up to `max_batch`), opens one `BEGIN IMMEDIATE`
//! transaction, runs each job inside its own savepoint, commits once and answers everybody. A job
//! that returns an error has its savepoint rolled back; the batch goes on. If the commit itself
//! fails, every job in the batch is answered with that error and nothing of the batch is kept.
//!
//! Answers are sent only after `COMMIT` returned, so "Ok" means durable (to the configured
//! `synchronous` level).
//!
//! **Audit records** of HTTP requests ride along: a job sent from inside a request's
//! [`sundial_store::audit_scope`] claims the request's pending record, and when the job changed
//! something the record is inserted in the job's own savepoint, so the action and its record
//! commit together or not at all.
//!
//! **Checkpoints** (copying the WAL back into the database file, with an fsync of its own) run on a
//! second thread with its own connection, shortly after commits, as `PASSIVE` checkpoints that never
//! block the writer. Left to SQLite's automatic checkpoint they would run inside whichever commit
//! crosses the threshold, stalling every caller in that group (and the due tasks waiting to be
//! claimed) for a copy and an extra fsync. The writer keeps a large automatic threshold only as a
//! backstop for when the background thread cannot keep up. The checkpoint thread waits on the
//! writer's signal, so an idle store does not wake it.
//!
//! **Out-of-band writes** are counted ([`sundial_store::OutOfBandMark`]): every data job that
//! changed something moves the count before it is answered, except the jobs sent with
//! [`Writer::write_in_band`] (inserts, claims, an attempt's own heartbeat, completion and
//! failure), which cannot end a task another caller started.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use rusqlite::Connection;
use sundial_store::{StoreError, audit_scope};
use tokio::sync::oneshot;

use crate::SqliteError;

/// Called after the batch's commit with the commit's error, if any.
type Finish = Box<dyn FnOnce(Option<&StoreError>) + Send>;
/// Runs the job on the connection (`Some`) or, when the batch could not start, only prepares its
/// answer (`None`; the answer is then the batch's error).
type Job = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

pub struct Writer {
    tx: mpsc::Sender<Job>,
    condition: Arc<Mutex<Option<String>>>,
    /// Data jobs that changed something, other than in-band ones (see the module doc).
    out_of_band: Arc<AtomicU64>,
}

thread_local! {
    /// Whether a job of the batch being written on this thread hit a full disk.
    static DISK_FULL: Cell<bool> = const { Cell::new(false) };
}

/// Notes, on the writer thread, that the statement that just failed found the disk full.
pub(crate) fn note_disk_full() {
    DISK_FULL.with(|f| f.set(true));
}

fn take_disk_full() -> bool {
    DISK_FULL.with(|f| f.replace(false))
}

thread_local! {
    /// Whether a job of the batch being written on this thread changed something other than
    /// the audit log: only such a commit shows that the disk takes writes again.
    static WROTE_DATA: Cell<bool> = const { Cell::new(false) };
}

fn take_wrote_data() -> bool {
    WROTE_DATA.with(|f| f.replace(false))
}

/// A batch-level rusqlite error as a [`StoreError`].
fn batch_error(e: rusqlite::Error, step: &'static str) -> StoreError {
    if crate::is_disk_full(&e) {
        StoreError::full_at(step, e)
    } else {
        StoreError::WriteBatch {
            step,
            source: std::sync::Arc::new(e),
        }
    }
}

impl Writer {
    /// Starts the writer thread on `conn` and the checkpoint thread on `checkpoint_conn`.
    pub fn start(
        conn: Connection,
        checkpoint_conn: Connection,
        max_batch: usize,
    ) -> Result<Self, SqliteError> {
        let thread_error = |what: &str, e: std::io::Error| SqliteError::DataDir {
            path: what.into(),
            source: e,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let condition: Arc<Mutex<Option<String>>> = Arc::default();
        let cond = condition.clone();
        // Capacity one: a pending signal already covers every later commit.
        let (committed, commits) = mpsc::sync_channel::<()>(1);
        thread::Builder::new()
            .name("sundial-sqlite-checkpoint".into())
            .spawn(move || checkpoint(checkpoint_conn, commits))
            .map_err(|e| thread_error("checkpoint thread", e))?;
        thread::Builder::new()
            .name("sundial-sqlite-writer".into())
            .spawn(move || run(conn, rx, committed, max_batch.max(1), cond))
            .map_err(|e| thread_error("writer thread", e))?;
        Ok(Writer {
            tx,
            condition,
            out_of_band: Arc::default(),
        })
    }

    /// What keeps writes from succeeding now (the disk is full), as the last commits found it.
    pub fn condition(&self) -> Arc<Mutex<Option<String>>> {
        self.condition.clone()
    }

    /// Runs `f` in the next group commit and returns its result once the commit is durable.
    ///
    /// Inside a request's [`audit_scope`], the request's audit record goes into the same
    /// savepoint when `f` changed something (see the module doc). When it did, the job counts
    /// as an out-of-band write ([`Writer::out_of_band`]).
    pub async fn write<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        self.write_job(f, JobKind::Data).await
    }

    /// Like [`Writer::write`], for a job that never ends a task another caller started: it
    /// inserts tasks, claims them, or records its own attempt's heartbeat, completion or
    /// failure. It does not move [`Writer::out_of_band`].
    pub async fn write_in_band<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        self.write_job(f, JobKind::InBand).await
    }

    /// How many data jobs that changed something, other than in-band ones, ran so far (each
    /// counted before it is answered).
    pub fn out_of_band(&self) -> u64 {
        self.out_of_band.load(Ordering::SeqCst)
    }

    /// Like [`Writer::write`], for a write to the audit log alone: it carries no request's
    /// record, and its commit does not clear a full-disk condition (a small record may fit
    /// where a task does not).
    pub async fn write_audit_log<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        self.write_job(f, JobKind::AuditLog).await
    }

    async fn write_job<R, E, F>(&self, f: F, kind: JobKind) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<Result<R, E>>();
        // Claimed here, on the request's task: the job runs on the writer thread.
        let audit = match kind {
            JobKind::Data | JobKind::InBand => audit_scope::claim_pending(),
            JobKind::AuditLog => None,
        };
        let out_of_band = self.out_of_band.clone();
        let job: Job = Box::new(move |conn: Option<&Connection>| {
            let mut audit_seq = None;
            let outcome = match conn {
                Some(conn) => run_in_savepoint(conn, |conn| {
                    let before = conn.total_changes();
                    let out = f(conn)?;
                    if conn.total_changes() != before {
                        if kind != JobKind::AuditLog {
                            WROTE_DATA.with(|w| w.set(true));
                        }
                        if kind == JobKind::Data {
                            // Before the commit, so before the answer: a count read after the
                            // call returned has moved, whether or not the commit then holds.
                            out_of_band.fetch_add(1, Ordering::SeqCst);
                        }
                        if let Some(a) = &audit {
                            audit_seq = Some(crate::access::insert_audit(conn, a.record())?);
                        }
                    }
                    Ok(out)
                }),
                None => Err(E::from(StoreError::Closed)),
            };
            Box::new(move |commit_err: Option<&StoreError>| {
                let answer = match commit_err {
                    Some(e) => Err(E::from(e.clone())),
                    None => {
                        if let (Some(a), Some(seq), true) = (audit, audit_seq, outcome.is_ok()) {
                            a.written(seq);
                        }
                        outcome
                    }
                };
                let _ = reply.send(answer);
            })
        });
        self.tx.send(job).map_err(|_| E::from(StoreError::Closed))?;
        rx.await.map_err(|_| E::from(StoreError::Closed))?
    }
}

/// What a job writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    /// Tasks, schedules, anything but the audit log alone, that may end a started task.
    Data,
    /// Inserts, claims, an attempt's own heartbeat, completion or failure.
    InBand,
    /// Only audit records (appended or amended on their own).
    AuditLog,
}

fn run_in_savepoint<R, E, F>(conn: &Connection, f: F) -> Result<R, E>
where
    E: From<StoreError>,
    F: FnOnce(&Connection) -> Result<R, E>,
{
    if let Err(e) = conn.execute_batch("SAVEPOINT job") {
        return Err(E::from(batch_error(e, "savepoint")));
    }
    let out = f(conn);
    let end = if out.is_ok() {
        "RELEASE job"
    } else {
        "ROLLBACK TO job; RELEASE job"
    };
    if let Err(e) = conn.execute_batch(end) {
        return Err(E::from(batch_error(e, "savepoint")));
    }
    out
}

/// How long the checkpoint thread lets commits accumulate before copying them.
const CHECKPOINT_DELAY: Duration = Duration::from_millis(50);

/// The checkpoint thread: after each signal, wait a moment, then copy what the WAL holds. Ends when
/// the writer thread does (its sender is dropped).
fn checkpoint(conn: Connection, commits: mpsc::Receiver<()>) {
    while commits.recv().is_ok() {
        thread::sleep(CHECKPOINT_DELAY);
        // Signals that arrived meanwhile are covered by this checkpoint.
        while commits.try_recv().is_ok() {}
        // PASSIVE never waits for the writer or readers; SQLITE_BUSY (another checkpoint running)
        // just means the next signal tries again.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(error = %e, "background checkpoint did not run");
        }
    }
}

fn run(
    conn: Connection,
    rx: mpsc::Receiver<Job>,
    committed: mpsc::SyncSender<()>,
    max_batch: usize,
    condition: Arc<Mutex<Option<String>>>,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    let mut finishes: Vec<Finish> = Vec::with_capacity(max_batch);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        take_disk_full();
        take_wrote_data();
        let commit_err = match conn.execute_batch("BEGIN IMMEDIATE") {
            Err(e) => Some(batch_error(e, "cannot begin the batch")),
            Ok(()) => {
                let mut rolled_back = false;
                let mut jobs = std::mem::take(&mut batch).into_iter();
                for job in jobs.by_ref() {
                    finishes.push(job(Some(&conn)));
                    // A full disk (or another I/O error) can make SQLite roll the whole
                    // transaction back, not only the failing statement: the jobs before it are
                    // gone too, so none of the batch may be answered as done.
                    if conn.is_autocommit() {
                        rolled_back = true;
                        break;
                    }
                }
                // The jobs not run are answered with the batch's error below.
                batch.extend(jobs);
                if rolled_back {
                    Some(if take_disk_full() {
                        StoreError::full_at(
                            "the database rolled the batch back",
                            sundial_store::Reason("database or disk is full"),
                        )
                    } else {
                        StoreError::BatchRolledBack
                    })
                } else {
                    match conn.execute_batch("COMMIT") {
                        Ok(()) => None,
                        Err(e) => {
                            let _ = conn.execute_batch("ROLLBACK");
                            Some(batch_error(e, "commit failed"))
                        }
                    }
                }
            }
        };
        // The store's condition, for health reports: set while writes hit a full disk, cleared
        // by the first commit that writes data again (an audit record alone does not count:
        // a refused create's record may fit where the task did not).
        let full = take_disk_full() || matches!(commit_err, Some(StoreError::Full { .. }));
        if let Ok(mut c) = condition.lock() {
            if let Some(StoreError::Full { step, source }) = &commit_err {
                *c = Some(match step {
                    Some(step) => format!("disk full: {step}: {source}"),
                    None => format!("disk full: {source}"),
                });
            } else if full {
                *c = Some("disk full: database or disk is full".to_string());
            } else if take_wrote_data() && commit_err.is_none() {
                *c = None;
            }
        }
        if let Some(e) = &commit_err {
            tracing::error!(error = %e, "group commit failed");
            // Jobs that never ran still need an answer (the batch's error).
            for job in batch.drain(..) {
                finishes.push(job(None));
            }
        }
        for finish in finishes.drain(..) {
            finish(commit_err.as_ref());
        }
        if commit_err.is_none() {
            let _ = committed.try_send(());
        }
    }
}
