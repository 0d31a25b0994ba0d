//! HTTPS with a certificate made in the test (rcgen): the server serves TLS with `--tls-cert` and
//! `--tls-key` (a client trusting the test's CA gets answers; one trusting another CA refuses the
//! server); the CLI (`--ca-file`, `SUNDIAL_CA_FILE`) and `RemoteWorker::ca_file` trust a private
//! CA and refuse the server without it; and a slow client cannot hold a connection open: one
//! that sends part of its headers and then nothing is disconnected by the server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use common::Server;

const BIN: &str = env!("CARGO_BIN_EXE_sundial");

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA and a server certificate it signed, for `localhost` and `127.0.0.1`.
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        Pki { dir }
    }
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// `GET path` over HTTPS to `addr`, trusting only `ca_pem`; the status line, or the TLS error.
async fn https_get(addr: &str, ca_pem: &[u8], path: &str) -> Result<String, String> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    let _ = tls.read_to_string(&mut text).await;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_certificate_made_here() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    let server = Server::start_with(data.path(), &["--tls-cert", &cert, "--tls-key", &key]);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let addr = server.url.trim_start_matches("https://").to_string();
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();

    assert_eq!(
        https_get(&addr, &ca, "/healthz").await.unwrap(),
        "HTTP/1.1 200 OK"
    );
    // A client that trusts another CA refuses the server.
    let other = Pki::new();
    let other_ca = std::fs::read(other.path("ca.pem")).unwrap();
    let err = https_get(&addr, &other_ca, "/healthz").await.unwrap_err();
    assert!(err.contains("certificate"), "{err}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = std::net::TcpStream::connect(&addr).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    let _ = plain.read_to_end(&mut buf);
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));

    // A key that is not the certificate's: the server refuses to start and says why.
    let out = Command::new(BIN)
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
        ])
        .arg(other.path("key.pem"))
        .arg("--data-dir")
        .arg(data.path().join("other"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS"), "{err}");
}

#[test]
fn a_client_that_stops_sending_its_headers_is_disconnected() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start_with(data.path(), &["--header-read-timeout", "1s"]);
    let addr = server.url.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 512];
    // The server answers 408 or just closes; either way the read ends well before 10 s.
    let n = conn.read(&mut buf);
    match n {
        Ok(n) => {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(n == 0 || text.contains("408"), "{text}");
        }
        Err(e) => assert!(
            e.kind() == std::io::ErrorKind::ConnectionReset,
            "the server did not close the connection: {e}"
        ),
    }
    // The server still serves others.
    let mut ok = std::net::TcpStream::connect(&addr).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    ok.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// Runs `sundial ARGS…` with `envs`; returns (exit ok, stdout, stderr).
fn sundial(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("SUNDIAL_TOKEN")
        .env_remove("SUNDIAL_CA_FILE")
        .envs(envs.iter().copied())
        .output()
        .expect("run sundial");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[test]
fn the_cli_trusts_a_private_ca_with_ca_file() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let (cert, key, ca) = (
        pki.path("cert.pem"),
        pki.path("key.pem"),
        pki.path("ca.pem"),
    );
    let server = Server::start_with(data.path(), &["--tls-cert", &cert, "--tls-key", &key]);
    let url = server.url.as_str();

    // Without the CA: the server's certificate is refused, and the error says so.
    let (ok, _, err) = sundial(&["task", "ls", "--server", url], &[]);
    assert!(!ok);
    assert!(err.contains("certificate"), "{err}");
    let (ok, _, err) = sundial(&["schedule", "ls", "--server", url], &[]);
    assert!(!ok);
    assert!(err.contains("certificate"), "{err}");

    // With it, by flag (after the subcommand: the option is global) or by environment.
    let (ok, out, err) = sundial(&["task", "ls", "--server", url, "--ca-file", &ca], &[]);
    assert!(ok, "{err}");
    assert!(out.starts_with("ID"), "{out}");
    let (ok, _, err) = sundial(
        &["task", "add", "k", "--server", url],
        &[("SUNDIAL_CA_FILE", &ca)],
    );
    assert!(ok, "{err}");
    for cmd in [
        &["schedule", "ls"][..],
        &["workflow", "ls"],
        &["queue", "ls"],
        &["push", "secret", "ls"],
        &["token", "ls"],
    ] {
        let (ok, _, err) = sundial(cmd, &[("SUNDIAL_SERVER", url), ("SUNDIAL_CA_FILE", &ca)]);
        assert!(ok, "{cmd:?}: {err}");
    }

    // Another CA does not make the server trusted.
    let other = Pki::new();
    let (ok, _, err) = sundial(
        &[
            "task",
            "ls",
            "--server",
            url,
            "--ca-file",
            &other.path("ca.pem"),
        ],
        &[],
    );
    assert!(!ok);
    assert!(err.contains("certificate"), "{err}");

    // A file that is missing, or holds no certificate: an error naming it, before any request.
    let missing = pki.path("missing.pem");
    let (ok, _, err) = sundial(&["task", "ls", "--server", url, "--ca-file", &missing], &[]);
    assert!(!ok);
    assert!(
        err.contains("cannot read the CA file") && err.contains(&missing),
        "{err}"
    );
    let (ok, _, err) = sundial(&["task", "ls", "--server", url, "--ca-file", &key], &[]);
    assert!(!ok);
    assert!(
        err.contains("holds no PEM certificate") && err.contains(&key),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_worker_trusts_a_private_ca_with_ca_file() {
    use serde_json::{Value, json};
    use sundial_workflow::remote::{RemoteActivityContext, RemoteError, RemoteWorker};
    use sundial_workflow::{ActivityError, WorkflowContext, WorkflowError};

    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let (cert, key, ca) = (
        pki.path("cert.pem"),
        pki.path("key.pem"),
        pki.path("ca.pem"),
    );
    let server = Server::start_with(data.path(), &["--tls-cert", &cert, "--tls-key", &key]);
    let url = server.url.clone();

    // Without the CA the server is refused.
    let err = RemoteWorker::new(&url).check().await.unwrap_err();
    assert!(chain(&err).contains("certificate"), "{}", chain(&err));
    // A bad file is refused when given, naming it.
    let missing = pki.path("missing.pem");
    let err = RemoteWorker::new(&url).ca_file(&missing).err().unwrap();
    assert!(matches!(err, RemoteError::ReadCaFile { .. }), "{err}");
    assert!(err.to_string().contains(&missing), "{err}");
    let err = RemoteWorker::new(&url).ca_file(&key).err().unwrap();
    assert!(matches!(err, RemoteError::BadCaFile { .. }), "{err}");
    assert!(err.to_string().contains(&key), "{err}");

    // With it, the worker runs a workflow and its activity over HTTPS.
    let mut worker = RemoteWorker::new(&url).ca_file(&ca).unwrap();
    worker.check().await.unwrap();
    worker
        .register("shout", |ctx: WorkflowContext, s: String| async move {
            let up: String = ctx.activity("upper", &s).await?;
            Ok::<_, WorkflowError>(up)
        })
        .unwrap();
    worker
        .register_activity(
            "upper",
            |_ctx: RemoteActivityContext, s: String| async move {
                Ok::<_, ActivityError>(s.to_uppercase())
            },
        )
        .unwrap();
    let running = tokio::spawn(worker.run());

    let roots = reqwest::Certificate::from_pem_bundle(&std::fs::read(&ca).unwrap()).unwrap();
    let http = sundial_cli::http_client_builder()
        .tls_certs_merge(roots)
        .build()
        .unwrap();
    let resp = http
        .post(format!("{url}/v1/workflows"))
        .json(&json!({"type": "shout", "id": "s-1", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let mut view = Value::Null;
    for _ in 0..1_200 {
        view = http
            .get(format!("{url}/v1/workflows/s-1"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if view["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(view["result"], json!("HI"));
    running.abort();
}
