//! A loopback HTTP/1.1 sink for push tests: it counts connections, records requests and answers
//! as its behaviour says (including receivers that misbehave on purpose).
#![allow(dead_code, clippy::disallowed_methods)] // test helper: reads the wall clock to time receipts

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the sink received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Lower-cased names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// Wall-clock receive time, Unix ms.
    pub at_ms: i64,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A scripted answer: status, extra headers, body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// What the sink does with a request.
#[derive(Clone)]
pub enum Behaviour {
    /// Answer with this status, extra headers and body.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Answer by calling the function with the number of the request (0-based).
    Script(Arc<dyn Fn(usize) -> Answer + Send + Sync>),
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Read the request and never answer.
    Silent,
    /// Send the status line one byte per `interval`, forever.
    Slowloris(Duration),
    /// Answer 200 with a body of `bytes` zeros, streamed in 64 KiB writes.
    Huge(u64),
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub struct Sink {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Body bytes written by `Huge` answers.
    pub written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    pub async fn start(ip: &str, behaviour: Behaviour) -> Sink {
        let ip: IpAddr = ip.parse().expect("ip");
        let listener = TcpListener::bind((ip, 0)).await.expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicU64::new(0));
        let count = Arc::new(AtomicUsize::new(0));
        let (c, r, w) = (connections.clone(), received.clone(), written.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let (r, w, b, n) = (r.clone(), w.clone(), behaviour.clone(), count.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, b, r, w, n).await;
                });
            }
        });
        Sink {
            addr,
            connections,
            received,
            written,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests arrived (or panics after `limit`).
    pub async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sink got {} of {n} requests in {limit:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Received>> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = HashMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let at_ms = now_ms();
    while buf.len() < head_end + 4 + len {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end + 4..head_end + 4 + len].to_vec();
    buf.drain(..head_end + 4 + len);
    Ok(Some(Received {
        method,
        path,
        headers,
        body,
        at_ms,
    }))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        302 => "Found",
        404 => "Not Found",
        410 => "Gone",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

async fn serve(
    mut stream: TcpStream,
    behaviour: Behaviour,
    received: Arc<Mutex<Vec<Received>>>,
    written: Arc<AtomicU64>,
    count: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut stream, &mut buf).await? {
        received.lock().expect("lock").push(req);
        let n = count.fetch_add(1, Ordering::SeqCst);
        let (status, headers, body) = match &behaviour {
            Behaviour::Answer {
                status,
                headers,
                body,
            } => (*status, headers.clone(), body.clone()),
            Behaviour::Script(f) => f(n),
            Behaviour::Slow(d) => {
                tokio::time::sleep(*d).await;
                (200, vec![], b"{}".to_vec())
            }
            Behaviour::Silent => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return Ok(());
            }
            Behaviour::Slowloris(interval) => {
                for b in b"HTTP/1.1 200 OK\r\nX-Drip: "
                    .iter()
                    .chain(std::iter::repeat(&b'a'))
                {
                    stream.write_all(&[*b]).await?;
                    tokio::time::sleep(*interval).await;
                }
                return Ok(());
            }
            Behaviour::Huge(total) => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {total}\r\n\r\n"
                );
                stream.write_all(head.as_bytes()).await?;
                let chunk = vec![0u8; 64 * 1024];
                let mut left = *total;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    stream.write_all(&chunk[..n]).await?;
                    written.fetch_add(n as u64, Ordering::SeqCst);
                    left -= n as u64;
                }
                return Ok(());
            }
        };
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\n",
            reason(status),
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
    }
    Ok(())
}
