//! Shared harness: starts the real `sundial` binary on a temporary data directory and a free port,
//! and talks to it over HTTP.
//!
//! The port: the server is started with `--listen 127.0.0.1:0`, binds a free port itself and
//! prints the address it got; the harness reads it from stdout. This has no window in which
//! another process could take the port between "find a free port" and "bind it".
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

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
        let mut child = Command::new(BIN)
            .arg("server")
            .arg("--data-dir")
            .arg(dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
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
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .expect("the server printed its address");
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
