//! One process per database: an exclusive lock on a file beside it, taken at open.
//!
//! Two processes writing one database would each keep their own windows, wake-ups and
//! exclusive-key bookkeeping over the same rows. So opening takes an exclusive `flock` on
//! `<database>.lock` (`std::fs::File::try_lock`) and holds it for as long as the store lives;
//! a second opener is refused at once, naming the holder's pid, which the holder writes into the
//! file. The operating system drops the lock when the holding process dies in any way (a
//! `kill -9` included), so a crash never leaves the directory locked: the stale pid left in the
//! file is only read when the lock is actually held. The lock is per open file, so a second
//! open from the same process is refused too.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::SqliteError;

/// What a refused opener is told holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// What was being opened ("data directory /x" or "database /x/sundial.db").
    pub what: String,
    /// The holder's pid, when it had written it.
    pub pid: Option<u32>,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "{} is in use by pid {pid}", self.what),
            None => write!(f, "{} is in use by another process", self.what),
        }
    }
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub(crate) struct StoreLock {
    _file: File,
}

/// The lock file of the database at `db`.
pub(crate) fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

impl StoreLock {
    /// Takes the lock of the database at `db`; `what` names it in the refusal.
    pub(crate) fn acquire(db: &Path, what: String) -> Result<StoreLock, SqliteError> {
        let path = lock_path(db);
        let io = |source| SqliteError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let pid = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse::<u32>().ok());
                return Err(SqliteError::InUse(LockHolder { what, pid }));
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(StoreLock { _file: file })
    }
}
