//! One push call: build the signed request, send it through the checked resolver, read at most
//! [`MAX_RESPONSE_BYTES`] of the answer, all within the call's timeout.
//!
//! The HTTP client is shared by every call (its connection pool keeps connections alive per
//! host and port). It follows no redirects, uses no proxy (the `HTTP_PROXY` family is ignored),
//! speaks `http` and `https` only (rustls with the `ring` provider) and resolves names only
//! through [`crate::resolve`]. An IP literal in a URL is not resolved at all, so it is checked
//! here before the request is built.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER, USER_AGENT};
use sundial_core::Target;
use thiserror::Error;

use crate::address::{AddressPolicy, Refused};
use crate::resolve::{CALL, CallScope, CheckedResolver, Lookup, SystemLookup};
use crate::sign::{SigningKey, signature_header};

/// Response bodies are read up to this many bytes; the rest is never read.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Settings of the shared HTTP client.
#[derive(Clone)]
pub struct ClientConfig {
    pub policy: AddressPolicy,
    pub lookup: Arc<dyn Lookup>,
    /// Idle keep-alive connections kept per host (as many as the engine's calls in flight per
    /// receiver by default, so a busy receiver's connections are reused rather than reopened).
    pub pool_max_idle_per_host: usize,
    /// How long an idle connection is kept.
    pub pool_idle_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            policy: AddressPolicy::default(),
            lookup: Arc::new(SystemLookup),
            pool_max_idle_per_host: sundial::Config::default().push_host_concurrency,
            pool_idle_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Error)]
#[error("cannot build the push HTTP client: {0}")]
pub struct BuildError(#[source] reqwest::Error);

/// Everything that goes into one call besides the target.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// `webhook-id`: the same for every attempt of one task.
    pub webhook_id: String,
    /// `webhook-timestamp`, Unix seconds.
    pub timestamp: i64,
    pub task_id: String,
    pub attempt: u32,
    pub execution_id: String,
    pub traceparent: Option<String>,
    /// The body: the task's payload as JSON.
    pub body: Vec<u8>,
    pub timeout: Duration,
}

/// The receiver's answer (its body cut at [`MAX_RESPONSE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// The receiver sent more than the cap; the rest was not read.
    pub truncated: bool,
    pub retry_after: Option<String>,
}

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CallError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("invalid target URL: {0}")]
    Url(String),
    #[error("the call did not finish within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("request failed: {0}")]
    Request(String),
}

impl CallError {
    /// Whether trying again later can help (a refused or malformed destination cannot).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CallError::Timeout(_) | CallError::Connect(_) | CallError::Request(_)
        )
    }
}

/// The shared HTTP client of push delivery.
#[derive(Clone)]
pub struct PushClient {
    http: reqwest::Client,
    policy: Arc<AddressPolicy>,
}

impl PushClient {
    pub fn new(config: ClientConfig) -> Result<Self, BuildError> {
        // reqwest's `rustls-no-provider` needs a process-wide provider; an embedder that
        // installed one already keeps theirs.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let policy = Arc::new(config.policy);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver {
                lookup: config.lookup,
                policy: policy.clone(),
            }))
            .http1_only()
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .pool_idle_timeout(config.pool_idle_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(BuildError)?;
        Ok(PushClient { http, policy })
    }

    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// Makes the call. The whole of it (resolution, connection, request, answer and body) is
    /// bounded by `req.timeout`.
    pub async fn call(
        &self,
        target: &Target,
        keys: &[SigningKey],
        req: CallRequest,
    ) -> Result<CallResponse, CallError> {
        let url = reqwest::Url::parse(&target.url).map_err(|e| CallError::Url(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(CallError::Url(format!(
                "scheme {} is not allowed",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(CallError::Url(
                "credentials in the URL are not allowed".into(),
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| CallError::Url("no host".into()))?
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| CallError::Url("no port".into()))?;
        // IP literals never reach the resolver: check them here.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.policy.check(&host, SocketAddr::new(ip, port))?;
        }
        let headers = build_headers(target, keys, &req)?;
        let method = reqwest::Method::from_bytes(target.method.as_str().as_bytes())
            .map_err(|e| CallError::Url(e.to_string()))?;
        let request = self
            .http
            .request(method, url)
            .headers(headers)
            .body(req.body)
            .build()
            .map_err(|e| CallError::Url(e.to_string()))?;
        let scope = CallScope {
            host: bare.to_string(),
            port,
            refused: Arc::new(Mutex::new(None)),
        };
        let refused = scope.refused.clone();
        let http = self.http.clone();
        let timeout = req.timeout;
        let exchange = async move {
            let mut resp = http.execute(request).await?;
            let status = resp.status().as_u16();
            let header = |name| {
                resp.headers()
                    .get(name)
                    .and_then(|v: &HeaderValue| v.to_str().ok())
                    .map(str::to_string)
            };
            let content_type = header(CONTENT_TYPE);
            let retry_after = header(RETRY_AFTER);
            let mut body = Vec::new();
            let mut truncated = false;
            while let Some(chunk) = resp.chunk().await? {
                let room = MAX_RESPONSE_BYTES - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
                if body.len() == MAX_RESPONSE_BYTES {
                    // One more byte would be over the cap: find out without reading it all.
                    truncated = resp.chunk().await?.is_some_and(|c| !c.is_empty());
                    break;
                }
            }
            // Dropping `resp` here closes a connection whose body was not read to the end.
            Ok::<_, reqwest::Error>(CallResponse {
                status,
                content_type,
                body,
                truncated,
                retry_after,
            })
        };
        let outcome = tokio::time::timeout(timeout, CALL.scope(scope, exchange)).await;
        match outcome {
            Err(_) => Err(CallError::Timeout(timeout)),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                if let Some(r) = refused.lock().ok().and_then(|mut s| s.take()) {
                    return Err(CallError::Refused(r));
                }
                Err(describe(&e))
            }
        }
    }
}

fn describe(e: &reqwest::Error) -> CallError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    if e.is_connect() {
        CallError::Connect(msg)
    } else if e.is_timeout() {
        CallError::Timeout(Duration::ZERO)
    } else {
        CallError::Request(msg)
    }
}

fn build_headers(
    target: &Target,
    keys: &[SigningKey],
    req: &CallRequest,
) -> Result<HeaderMap, CallError> {
    let value =
        |v: &str| HeaderValue::from_str(v).map_err(|e| CallError::Url(format!("header: {e}")));
    let mut h = HeaderMap::new();
    for (name, v) in &target.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| CallError::Url(format!("header {name}: {e}")))?;
        h.insert(name, value(v)?);
    }
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("sundial/", env!("CARGO_PKG_VERSION"))),
    );
    h.insert("webhook-id", value(&req.webhook_id)?);
    h.insert("webhook-timestamp", value(&req.timestamp.to_string())?);
    if !keys.is_empty() {
        let sig = signature_header(keys, &req.webhook_id, req.timestamp, &req.body);
        h.insert("webhook-signature", value(&sig)?);
    }
    h.insert("sundial-task-id", value(&req.task_id)?);
    h.insert("sundial-attempt", value(&req.attempt.to_string())?);
    h.insert("sundial-execution-id", value(&req.execution_id)?);
    if let Some(tp) = &req.traceparent {
        h.insert("traceparent", value(tp)?);
    }
    Ok(h)
}
