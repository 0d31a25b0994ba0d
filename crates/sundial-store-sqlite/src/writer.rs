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

use std::sync::mpsc;
use std::thread;

use rusqlite::Connection;
use sundial_store::StoreError;
use tokio::sync::oneshot;

use crate::SqliteError;

/// Called after the batch's commit with the commit's error, if any.
type Finish = Box<dyn FnOnce(Option<&StoreError>) + Send>;
/// Runs the job on the connection (`Some`) or, when the batch could not start, only prepares its
/// answer (`None`; the answer is then the batch's error).
type Job = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

pub struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    pub fn start(conn: Connection, max_batch: usize) -> Result<Self, SqliteError> {
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("sundial-sqlite-writer".into())
            .spawn(move || run(conn, rx, max_batch.max(1)))
            .map_err(|e| SqliteError::DataDir {
                path: "writer thread".into(),
                source: e,
            })?;
        Ok(Writer { tx })
    }

    /// Runs `f` in the next group commit and returns its result once the commit is durable.
    pub async fn write<R, E, F>(&self, f: F) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<Result<R, E>>();
        let job: Job = Box::new(move |conn: Option<&Connection>| {
            let outcome = match conn {
                Some(conn) => run_in_savepoint(conn, f),
                None => Err(E::from(StoreError::Closed)),
            };
            Box::new(move |commit_err: Option<&StoreError>| {
                let answer = match commit_err {
                    Some(e) => Err(E::from(e.clone())),
                    None => outcome,
                };
                let _ = reply.send(answer);
            })
        });
        self.tx.send(job).map_err(|_| E::from(StoreError::Closed))?;
        rx.await.map_err(|_| E::from(StoreError::Closed))?
    }
}

fn run_in_savepoint<R, E, F>(conn: &Connection, f: F) -> Result<R, E>
where
    E: From<StoreError>,
    F: FnOnce(&Connection) -> Result<R, E>,
{
    if let Err(e) = conn.execute_batch("SAVEPOINT job") {
        return Err(E::from(StoreError::Backend(e.to_string())));
    }
    let out = f(conn);
    let end = if out.is_ok() {
        "RELEASE job"
    } else {
        "ROLLBACK TO job; RELEASE job"
    };
    if let Err(e) = conn.execute_batch(end) {
        return Err(E::from(StoreError::Backend(e.to_string())));
    }
    out
}

fn run(conn: Connection, rx: mpsc::Receiver<Job>, max_batch: usize) {
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
        let commit_err = match conn.execute_batch("BEGIN IMMEDIATE") {
            Err(e) => Some(StoreError::Backend(e.to_string())),
            Ok(()) => {
                for job in batch.drain(..) {
                    finishes.push(job(Some(&conn)));
                }
                match conn.execute_batch("COMMIT") {
                    Ok(()) => None,
                    Err(e) => {
                        let _ = conn.execute_batch("ROLLBACK");
                        Some(StoreError::Backend(format!("commit failed: {e}")))
                    }
                }
            }
        };
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
    }
}
