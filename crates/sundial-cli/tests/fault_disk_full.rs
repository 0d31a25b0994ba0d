//! Fault battery, disk full (embedded store): the real `sundial server` on a small filesystem that
//! fills up, and on database files that are damaged before it starts.
//!
//! It proves, and fails otherwise:
//! - on a full disk, creates (single and batch) answer `507 insufficient_storage` naming the
//!   cause, not `500 internal`; nothing of a refused create is stored; reads keep working;
//!   `/healthz` says `degraded` with the problem; once space is freed, creates succeed again by
//!   themselves and `/healthz` says `ok`; every task acknowledged before is still there;
//! - a database file that is not a database, or one cut short, makes the server exit at once
//!   with status 3 and an error naming the problem, never a panic.
//!
//! The filesystem is a tmpfs of 16 MiB that the test mounts, which needs root: without it that
//! part is skipped with a message (CI runs as root, so it runs there). Short and long form are
//! the same (a few seconds).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, Launch, Server, now_ms};
use serde_json::{Value, json};

const EXIT_STORE_UNUSABLE: i32 = 3;

/// `sundial server` on `dir`, expected to exit at once: its status and stderr.
fn start_expecting_exit(dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run the server");
    assert!(
        out.stdout.is_empty(),
        "it must not start serving: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check_refused(what: &str, dir: &Path, expect: &str) -> String {
    let (code, stderr) = start_expecting_exit(dir);
    assert!(!stderr.contains("panicked"), "{what}: a panic: {stderr}");
    assert_eq!(
        code,
        Some(EXIT_STORE_UNUSABLE),
        "{what}: exit status; stderr: {stderr}"
    );
    assert!(
        stderr.contains(expect),
        "{what}: stderr names the problem: {stderr}"
    );
    stderr.lines().last().unwrap_or_default().to_string()
}

/// A database file of garbage, and a real one cut in half.
async fn damaged_files() -> (String, String) {
    let garbage = tempfile::tempdir().unwrap();
    let mut bytes = vec![0u8; 64 * 1024];
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    for b in bytes.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(garbage.path().join("sundial.db"), &bytes).unwrap();
    let garbage_line = check_refused("garbage", garbage.path(), "not a SQLite database");

    let cut = tempfile::tempdir().unwrap();
    let mut server = Server::start(cut.path());
    let client = server.client();
    let batch = sundial_server::wire::CreateBatch {
        tasks: (0..400)
            .map(|i| sundial_server::wire::CreateTask {
                payload: Some(json!({"i": i, "pad": "x".repeat(1_000)})),
                delay: Some("1h".into()),
                ..sundial_server::wire::CreateTask::new("k")
            })
            .collect(),
    };
    client.create_batch(&batch).await.unwrap();
    server.terminate(Duration::from_secs(20));
    let db = cut.path().join("sundial.db");
    for side in ["sundial.db-wal", "sundial.db-shm"] {
        let _ = std::fs::remove_file(cut.path().join(side));
    }
    let len = std::fs::metadata(&db).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let cut_line = check_refused("truncated", cut.path(), "truncated");
    (garbage_line, cut_line)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs as root failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the filesystem holding `path`: a file written until the disk refuses more.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let mut written = 0u64;
    for chunk in [1 << 20, 4 << 10, 512] {
        let buf = vec![0u8; chunk];
        while f.write_all(&buf).is_ok() {
            written += chunk as u64;
        }
    }
    let _ = f.sync_all();
    written
}

struct Answer {
    status: u16,
    body: Value,
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Answer {
    let resp = http
        .post(url)
        .json(body)
        .send()
        .await
        .expect("the server answers");
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Answer { status, body }
}

async fn get(http: &reqwest::Client, url: &str) -> Answer {
    let resp = http.get(url).send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Answer { status, body }
}

fn task(key: &str) -> Value {
    json!({"kind": "k", "key": key, "delay": "1h", "payload": {"pad": "p".repeat(2_000)}})
}

/// The full-disk part; `None` when it cannot run here (not root).
async fn full_disk() -> Option<String> {
    if !is_root() {
        return None;
    }
    let fs = Tmpfs::mount("16m");
    let data = fs.path().join("data");
    let log: PathBuf = std::env::temp_dir().join(format!("sundial-disk-full-{}.log", now_ms()));
    let args: Vec<OsString> = vec!["--data-dir".into(), data.clone().into()];
    let server = Server::spawn(
        args,
        &Launch {
            log: Some(log.clone()),
            ..Launch::default()
        },
        &data,
    );
    let http = sundial_cli::http_client_builder().build().unwrap();
    let url = |p: &str| format!("{}{p}", server.url);

    let mut acked = Vec::new();
    for i in 0..50 {
        let a = post(&http, &url("/v1/tasks"), &task(&format!("before-{i}"))).await;
        assert_eq!(a.status, 201, "{:?}", a.body);
        acked.push(a.body["id"].as_str().unwrap().to_string());
    }

    let filler = fs.path().join("filler");
    fill(&filler);

    // Creates until the store runs out of room (SQLite's free pages and the log's slack first).
    let mut accepted_after_fill = 0;
    let mut first_refusal = None;
    let mut refused_keys = Vec::new();
    for i in 0..2_000 {
        let key = format!("full-{i}");
        let a = post(&http, &url("/v1/tasks"), &task(&key)).await;
        if a.status == 201 {
            accepted_after_fill += 1;
            acked.push(a.body["id"].as_str().unwrap().to_string());
            continue;
        }
        refused_keys.push(key);
        first_refusal.get_or_insert(a);
        if refused_keys.len() >= 5 {
            break;
        }
    }
    let first = first_refusal.expect("creates are refused once the disk is full");
    assert!(
        first.status == 507 || first.status == 503,
        "a full disk answers 507 (or 503), got {} {}",
        first.status,
        first.body
    );
    assert_eq!(
        first.body["error"]["code"], "insufficient_storage",
        "{}",
        first.body
    );
    let message = first.body["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("disk is full"),
        "the message names the cause: {message}"
    );

    let batch: Vec<Value> = (0..20).map(|i| task(&format!("batch-{i}"))).collect();
    let b = post(&http, &url("/v1/tasks:batch"), &json!({"tasks": batch})).await;
    assert_eq!(b.status, 507, "a batch on a full disk: {}", b.body);
    refused_keys.extend((0..20).map(|i| format!("batch-{i}")));

    // Reads keep working, and nothing of a refused create is there.
    for id in acked.iter().take(10) {
        let a = get(&http, &url(&format!("/v1/tasks/{id}"))).await;
        assert_eq!(a.status, 200, "a read on a full disk: {}", a.body);
    }
    for key in &refused_keys {
        let a = get(&http, &url(&format!("/v1/tasks?key={key}"))).await;
        assert_eq!(a.status, 200, "a list on a full disk: {}", a.body);
        assert_eq!(
            a.body["tasks"].as_array().map(Vec::len),
            Some(0),
            "{key} was stored"
        );
    }
    let h = get(&http, &url("/healthz")).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.body["status"], "degraded", "{}", h.body);
    let problem = h.body["problems"][0].as_str().unwrap_or("").to_string();
    assert!(problem.contains("disk full"), "{}", h.body);

    // Space comes back: creates work again by themselves.
    std::fs::remove_file(&filler).unwrap();
    let freed = now_ms();
    let mut recovered_ms = None;
    for i in 0..200 {
        let a = post(&http, &url("/v1/tasks"), &task(&format!("after-{i}"))).await;
        if a.status == 201 {
            recovered_ms = Some(now_ms() - freed);
            acked.push(a.body["id"].as_str().unwrap().to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered_ms = recovered_ms.expect("creates succeed again once space is freed");
    let h = get(&http, &url("/healthz")).await;
    assert_eq!(h.body["status"], "ok", "{}", h.body);
    for id in &acked {
        let a = get(&http, &url(&format!("/v1/tasks/{id}"))).await;
        assert_eq!(a.status, 200, "acknowledged task {id} is gone");
    }
    drop(server);
    let _ = std::fs::remove_file(&log);
    Some(format!(
        "tmpfs 16 MiB: {accepted_after_fill} creates fit after the fill, then 507 insufficient_storage \
         (single and batch of 20), 0 of {} refused stored, reads 200, healthz degraded ({problem:?}); \
         creates again {recovered_ms} ms after space was freed, healthz ok, {} acknowledged all present",
        refused_keys.len(),
        acked.len()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full() {
    let (garbage, cut) = damaged_files().await;
    let full = full_disk().await.unwrap_or_else(|| {
        "full disk: skipped: mounting a tmpfs needs root (CI runs as root)".to_string()
    });
    println!(
        "FAULT disk_full: {full}; damaged files refused with exit 3: garbage ({garbage:?}), truncated ({cut:?})"
    );
}
