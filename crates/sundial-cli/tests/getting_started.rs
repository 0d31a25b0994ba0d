//! What a new user meets first: `--listen` with a host name, and a refused address leaving
//! nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_sundial");

#[test]
fn listen_accepts_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["server", "--listen", "localhost:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let addr = line
        .trim()
        .strip_prefix("sundial listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 0);
}

#[test]
fn a_refused_address_creates_no_data_directory() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        !data.exists(),
        "the failed start left {} behind",
        data.display()
    );
    drop(taken);
}

#[test]
fn listen_explains_the_form_when_the_port_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["server", "--listen", "localhost", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:7373"), "{err}");
}
