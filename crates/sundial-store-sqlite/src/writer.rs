//! The writer thread and its group commit.
//!
//! Callers send a job (a closure over the connection) and wait for its answer. The thread takes the
//! first job, then every job already queued (up to `max_batch`; bulk jobs apart, see below),
//! opens one `BEGIN IMMEDIATE`
//! transaction, runs each job inside its own savepoint, commits once and answers everybody. A job
//! that returns an error has its savepoint rolled back; the batch goes on. If the commit itself
//! fails, every job in the batch is answered with that error and nothing of the batch is kept.
//!
//! Answers are sent only after `COMMIT` returned, so "Ok" means durable (to the configured
//! `synchronous` level).
//!
//! **Bulk writes** (a job that stores many rows, such as a batch of a thousand tasks) do not share
//! a group with the small ones. A group is either small jobs (up to `max_batch`) or bulk jobs (up
//! to [`BULK_GROUP_ROWS`] rows, at least one job), and while both wait the writer takes them in
//! turn, small first. A claim of due tasks that arrives behind a large insert so waits for at most
//! one bulk group, not for the insert and everything queued with it; the insert is still one job,
//! stored atomically. Jobs waiting at the same time have no order among them (their callers
//! have not been answered), so the writer may run them in any order.
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

use std::cell::Cell;
use std::collections::VecDeque;
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

/// A job of at least this many rows is written in a bulk group.
pub(crate) const BULK_ROWS: usize = 64;
/// The rows a bulk group holds at most (a single larger job makes a group of its own).
pub(crate) const BULK_GROUP_ROWS: usize = 1_000;

/// A job in the writer's channel, with the rows it writes (its size, for grouping).
struct Queued {
    job: Job,
    rows: usize,
}

pub struct Writer {
    tx: mpsc::Sender<Queued>,
    condition: Arc<Mutex<Option<String>>>,
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
        let (tx, rx) = mpsc::channel::<Queued>();
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
        Ok(Writer { tx, condition })
    }

    /// What keeps writes from succeeding now (the disk is full), as the last commits found it.
    pub fn condition(&self) -> Arc<Mutex<Option<String>>> {
        self.condition.clone()
    }

    /// Runs `f` in the next group commit and returns its result once the commit is durable.
    ///
    /// Inside a request's [`audit_scope`], the request's audit record goes into the same
    /// savepoint when `f` changed something (see the module doc).
    pub async fn write<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        self.write_job(f, JobKind::Data, 1).await
    }

    /// Like [`Writer::write`], for a job that writes about `rows` rows: one of [`BULK_ROWS`] or
    /// more goes into a bulk group (see the module doc).
    pub async fn write_rows<R, E, F>(&self, rows: usize, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        self.write_job(f, JobKind::Data, rows).await
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
        self.write_job(f, JobKind::AuditLog, 1).await
    }

    async fn write_job<R, E, F>(&self, f: F, kind: JobKind, rows: usize) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<Result<R, E>>();
        // Claimed here, on the request's task: the job runs on the writer thread.
        let audit = match kind {
            JobKind::Data => audit_scope::claim_pending(),
            JobKind::AuditLog => None,
        };
        let job: Job = Box::new(move |conn: Option<&Connection>| {
            let mut audit_seq = None;
            let outcome = match conn {
                Some(conn) => run_in_savepoint(conn, |conn| {
                    let before = conn.total_changes();
                    let out = f(conn)?;
                    if conn.total_changes() != before {
                        if kind == JobKind::Data {
                            WROTE_DATA.with(|w| w.set(true));
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
        self.tx
            .send(Queued { job, rows })
            .map_err(|_| E::from(StoreError::Closed))?;
        rx.await.map_err(|_| E::from(StoreError::Closed))?
    }
}

/// What a job writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    /// Tasks, schedules, anything but the audit log alone.
    Data,
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

/// The jobs waiting on the writer thread: small ones and bulk ones, each in arrival order.
struct Waiting {
    small: VecDeque<Job>,
    bulk: VecDeque<Queued>,
    /// Whether the next group is bulk when both kinds wait (they take turns).
    bulk_turn: bool,
}

impl Waiting {
    fn push(&mut self, q: Queued) {
        if q.rows >= BULK_ROWS {
            self.bulk.push_back(q);
        } else {
            self.small.push_back(q.job);
        }
    }

    fn is_empty(&self) -> bool {
        self.small.is_empty() && self.bulk.is_empty()
    }

    /// The next group to write: small jobs first, then bulk and small in turn.
    fn next_group(&mut self, max_batch: usize, group: &mut Vec<Job>) {
        if !self.bulk.is_empty() && (self.small.is_empty() || self.bulk_turn) {
            self.bulk_turn = false;
            let mut rows = 0;
            while let Some(q) = self.bulk.front() {
                if !group.is_empty()
                    && (rows + q.rows > BULK_GROUP_ROWS || group.len() >= max_batch)
                {
                    break;
                }
                rows += q.rows;
                if let Some(q) = self.bulk.pop_front() {
                    group.push(q.job);
                }
            }
        } else {
            self.bulk_turn = true;
            let n = self.small.len().min(max_batch);
            group.extend(self.small.drain(..n));
        }
    }
}

fn run(
    conn: Connection,
    rx: mpsc::Receiver<Queued>,
    committed: mpsc::SyncSender<()>,
    max_batch: usize,
    condition: Arc<Mutex<Option<String>>>,
) {
    let mut waiting = Waiting {
        small: VecDeque::new(),
        bulk: VecDeque::new(),
        bulk_turn: false,
    };
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    let mut finishes: Vec<Finish> = Vec::with_capacity(max_batch);
    loop {
        if waiting.is_empty() {
            match rx.recv() {
                Ok(q) => waiting.push(q),
                Err(_) => break,
            }
        }
        while let Ok(q) = rx.try_recv() {
            waiting.push(q);
        }
        waiting.next_group(max_batch, &mut batch);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that records its name when answered without running.
    fn job(name: &'static str, log: &Arc<Mutex<Vec<&'static str>>>) -> Job {
        let log = log.clone();
        Box::new(move |_conn: Option<&Connection>| {
            if let Ok(mut l) = log.lock() {
                l.push(name);
            }
            Box::new(|_: Option<&StoreError>| {})
        })
    }

    fn groups(
        waiting: &mut Waiting,
        log: &Arc<Mutex<Vec<&'static str>>>,
    ) -> Vec<Vec<&'static str>> {
        let mut out = Vec::new();
        while !waiting.is_empty() {
            let mut group = Vec::new();
            waiting.next_group(1024, &mut group);
            for j in group {
                j(None)(None);
            }
            out.push(std::mem::take(&mut *log.lock().unwrap()));
        }
        out
    }

    #[test]
    fn small_jobs_do_not_wait_in_a_bulk_group_and_the_kinds_take_turns() {
        let log = Arc::default();
        let mut waiting = Waiting {
            small: VecDeque::new(),
            bulk: VecDeque::new(),
            bulk_turn: false,
        };
        for (name, rows) in [
            ("insert 1", 1_000),
            ("claim 1", 1),
            ("insert 2", 400),
            ("insert 3", 400),
            ("claim 2", 3),
            ("insert 4", 300),
        ] {
            waiting.push(Queued {
                job: job(name, &log),
                rows,
            });
        }
        assert_eq!(
            groups(&mut waiting, &log),
            vec![
                vec!["claim 1", "claim 2"],
                vec!["insert 1"],
                vec!["insert 2", "insert 3"],
                vec!["insert 4"],
            ]
        );
        // While small jobs keep coming, a bulk group still gets every other turn.
        for (name, rows) in [("insert 5", 1_000), ("insert 6", 1_000), ("claim 3", 1)] {
            waiting.push(Queued {
                job: job(name, &log),
                rows,
            });
        }
        let mut group = Vec::new();
        waiting.next_group(1024, &mut group);
        group.into_iter().for_each(|j| j(None)(None));
        waiting.push(Queued {
            job: job("claim 4", &log),
            rows: 1,
        });
        let mut seen = vec![std::mem::take(&mut *log.lock().unwrap())];
        seen.extend(groups(&mut waiting, &log));
        assert_eq!(
            seen,
            vec![
                vec!["claim 3"],
                vec!["insert 5"],
                vec!["claim 4"],
                vec!["insert 6"],
            ]
        );
    }
}
