//! Shared harness: starts the real `sundial` binary on a free port, on the embedded store (a
//! temporary data directory) or on PostgreSQL (a fresh schema), and talks to it over HTTP.
//!
//! The port: the server is started with `--listen 127.0.0.1:0`, binds a free port itself and
//! prints the address it got; the harness reads it from stdout. This has no window in which
//! another process could take the port between "find a free port" and "bind it".
//!
//! PostgreSQL: see `pg.rs` for the environment (`SUNDIAL_TEST_DATABASE_URL`, skipping,
//! `SUNDIAL_REQUIRE_POSTGRES=1`) and the fresh schemas.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod pg;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sundial::Clock;
use sundial_cli::Client;

pub const BIN: &str = env!("CARGO_BIN_EXE_sundial");

/// Generous bounds: they only decide when a test gives up, never what it asserts about speed.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The store a test's server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded store in a temporary data directory.
    Embedded,
    /// PostgreSQL (`SUNDIAL_TEST_DATABASE_URL`), in a fresh schema dropped afterwards.
    Postgres,
}

impl Backend {
    /// How far the server's clock may read behind the test's wall clock, for checks of times the
    /// server wrote against times the test read. The embedded server reads the system clock
    /// itself: 0. On PostgreSQL a node runs on the database's clock as it measured it at start,
    /// rounded down so as never to be ahead of it (`OffsetClock`): on one machine that is the wall
    /// clock minus that measurement's round trip and 1 ms, and a node refuses to start when the
    /// difference exceeds `max_clock_skew` (2 s), which therefore bounds it.
    pub fn server_clock_lag_ms(self) -> i64 {
        match self {
            Backend::Embedded => 0,
            Backend::Postgres => 2_000,
        }
    }
}

/// Where a test's server keeps its data, for as long as the test runs: a temporary directory,
/// and with PostgreSQL a fresh schema (dropped when this is dropped, so declare it before the
/// servers that use it: locals drop in reverse order, servers first).
pub struct Storage {
    pub dir: tempfile::TempDir,
    pub pg: Option<pg::TestSchema>,
}

impl Storage {
    /// `None` when the backend is PostgreSQL and its tests are skipped here (see `pg.rs`).
    pub fn new(backend: Backend) -> Option<Storage> {
        let pg = match backend {
            Backend::Embedded => None,
            Backend::Postgres => Some(pg::TestSchema::fresh()?),
        };
        Some(Storage {
            dir: tempfile::tempdir().unwrap(),
            pg,
        })
    }

    /// The server arguments that select this storage. The data directory is passed in both cases
    /// (the server ignores it with `--database-url`).
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["--data-dir".into(), self.dir.path().into()];
        if let Some(s) = &self.pg {
            a.extend(
                ["--database-url", &s.url, "--database-schema", &s.schema].map(OsString::from),
            );
        }
        a
    }
}

/// How to start a server beyond its storage.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// More arguments for `sundial server`.
    pub extra: Vec<OsString>,
    /// `RUST_LOG` (default `warn`).
    pub rust_log: Option<String>,
    /// Append the server's stderr to this file instead of the test's stderr.
    pub log: Option<PathBuf>,
    /// More environment variables for the server.
    pub env: Vec<(OsString, OsString)>,
}

pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub dir: PathBuf,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Self::start_with(dir, &[])
    }

    pub fn start_with(dir: &Path, extra: &[&str]) -> Server {
        let mut args: Vec<OsString> = vec!["--data-dir".into(), dir.into()];
        args.extend(extra.iter().map(OsString::from));
        Self::spawn(args, &Launch::default(), dir)
    }

    /// A server on `storage` (either backend).
    pub fn start_on(storage: &Storage) -> Server {
        Self::launch(storage, &Launch::default())
    }

    pub fn launch(storage: &Storage, launch: &Launch) -> Server {
        let mut args = storage.args();
        args.extend(launch.extra.iter().cloned());
        Self::spawn(args, launch, storage.dir.path())
    }

    /// `sundial server --listen 127.0.0.1:0` with exactly `args` (and `launch`'s environment and
    /// log); `dir` is only remembered.
    pub fn spawn(args: Vec<OsString>, launch: &Launch, dir: &Path) -> Server {
        let stderr = match &launch.log {
            None => Stdio::inherit(),
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("open the server log"),
            ),
        };
        let mut child = Command::new(BIN)
            .arg("server")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(&args)
            .env("RUST_LOG", launch.rust_log.as_deref().unwrap_or("warn"))
            .env_remove("SUNDIAL_BOOTSTRAP_TOKEN")
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start the sundial binary");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            // Keep draining so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("the server did not print its address ({e}); exit: {status:?}")
            }
        };
        let url = line
            .strip_prefix("sundial listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .trim()
            .to_string();
        Server {
            child: Some(child),
            url,
            dir: dir.to_path_buf(),
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url).expect("client")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().expect("kill -9");
            c.wait().expect("reap");
        }
    }

    /// Sends `signal` (`libc::SIGSTOP`, `libc::SIGCONT`, ...) to the server process.
    pub fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id();
        let pid = i32::try_from(pid).expect("a pid fits an i32");
        // SAFETY: kill(2) on a child process this harness started and has not reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .expect("run kill");
        assert!(ok.success());
        let deadline = now_ms() + within.as_millis() as i64;
        loop {
            if let Some(status) = c.try_wait().expect("try_wait") {
                return status;
            }
            if now_ms() > deadline {
                let _ = c.kill();
                panic!("the server did not exit within {within:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wall-clock milliseconds, through Sundial's own system clock (the server uses the same one).
pub fn now_ms() -> i64 {
    sundial::SystemClock.now().as_millis()
}

pub fn rfc3339_ms(s: &str) -> i64 {
    sundial_server::time::parse(s)
        .unwrap_or_else(|e| panic!("{e}"))
        .as_millis()
}

/// Every task on the server (up to 1000 per page, all pages).
pub async fn all_tasks(client: &Client) -> Vec<sundial_server::wire::TaskView> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = client
            .list(&sundial_server::wire::ListQuery {
                limit: Some(1_000),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .expect("list");
        let n = page.tasks.len();
        out.extend(page.tasks);
        match page.next_cursor {
            Some(c) if n > 0 => cursor = Some(c),
            _ => return out,
        }
    }
}

pub async fn count(client: &Client) -> usize {
    all_tasks(client).await.len()
}
