//! Push targets: the HTTP call a task makes at its due time instead of waiting for a worker.
//!
//! A [`Target`] is part of a task (and of a schedule's task template or a workflow activity). This
//! module only describes and validates it; the call itself, the address checks and the signature
//! are `sundial-push`'s. Validation here is about the shape of the request (scheme, credentials,
//! header names and values, sizes); which addresses may be called is the operator's policy and is
//! checked at delivery, on the addresses the name resolves to.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// The HTTP method of a push call. The body is the task's payload as JSON for every method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum PushMethod {
    #[default]
    Post,
    Put,
    Patch,
    Delete,
    Get,
}

impl PushMethod {
    pub fn as_str(&self) -> &'static str {
        match self {
            PushMethod::Post => "POST",
            PushMethod::Put => "PUT",
            PushMethod::Patch => "PATCH",
            PushMethod::Delete => "DELETE",
            PushMethod::Get => "GET",
        }
    }
}

impl fmt::Display for PushMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where and how a task is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// `http` or `https` URL without credentials.
    pub url: String,
    #[serde(default)]
    pub method: PushMethod,
    /// Extra request headers. Names are lower-cased at validation; the signature, content and
    /// connection headers are Sundial's and cannot be set here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Time limit of one call, connection and body included (default: the smaller of 30 s and
    /// the task's timeout; never more than the task's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// 4xx statuses other than 410 and 429 that are retried instead of ending the task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_statuses: Vec<u16>,
}

impl Target {
    /// The call timeout used when a target gives none.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    pub const MAX_URL_LEN: usize = 2048;
    pub const MAX_HEADERS: usize = 32;
    pub const MAX_HEADER_BYTES: usize = 8 * 1024;

    pub fn new(url: impl Into<String>) -> Self {
        Target {
            url: url.into(),
            method: PushMethod::Post,
            headers: BTreeMap::new(),
            timeout_ms: None,
            retry_statuses: Vec::new(),
        }
    }
    pub fn method(mut self, method: PushMethod) -> Self {
        self.method = method;
        self
    }
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }
    pub fn retry_statuses(mut self, statuses: Vec<u16>) -> Self {
        self.retry_statuses = statuses;
        self
    }

    /// The call's time limit for a task whose attempt timeout is `task_timeout`.
    pub fn call_timeout(&self, task_timeout: Duration) -> Duration {
        self.timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(Self::DEFAULT_TIMEOUT)
            .min(task_timeout)
    }

    /// Checks the target and returns it in canonical form (header names lower-cased, statuses
    /// sorted). `task_timeout` bounds the call timeout.
    pub fn validate(mut self, task_timeout: Duration) -> Result<Target, ValidationError> {
        let bad =
            |field: &'static str, reason: String| ValidationError::OutOfRange { field, reason };
        if self.url.is_empty() {
            return Err(ValidationError::Empty {
                field: "target.url",
            });
        }
        if self.url.len() > Self::MAX_URL_LEN {
            return Err(ValidationError::TooLong {
                field: "target.url",
                len: self.url.len(),
                max: Self::MAX_URL_LEN,
            });
        }
        let url = url::Url::parse(&self.url)
            .map_err(|e| bad("target.url", format!("not a valid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(
                "target.url",
                format!(
                    "scheme {:?} is not allowed; use http or https",
                    url.scheme()
                ),
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("target.url", "has no host".into()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad(
                "target.url",
                "must not carry credentials; use a header instead".into(),
            ));
        }
        if url.fragment().is_some() {
            return Err(bad("target.url", "must not have a #fragment".into()));
        }
        if self.headers.len() > Self::MAX_HEADERS {
            return Err(bad(
                "target.headers",
                format!("at most {} headers", Self::MAX_HEADERS),
            ));
        }
        let mut headers = BTreeMap::new();
        let mut bytes = 0;
        for (name, value) in std::mem::take(&mut self.headers) {
            let lower = name.to_ascii_lowercase();
            if lower.is_empty() || !lower.bytes().all(is_token_byte) {
                return Err(bad(
                    "target.headers",
                    format!("{name:?} is not a valid header name"),
                ));
            }
            if is_reserved_header(&lower) {
                return Err(bad(
                    "target.headers",
                    format!("{name:?} is set by Sundial and cannot be given"),
                ));
            }
            if !value
                .bytes()
                .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            {
                return Err(ValidationError::BadCharacters {
                    field: "target.headers",
                    reason: "header values must be visible ASCII (no line breaks)",
                });
            }
            bytes += lower.len() + value.len();
            if headers.insert(lower, value).is_some() {
                return Err(bad("target.headers", format!("{name:?} is given twice")));
            }
        }
        if bytes > Self::MAX_HEADER_BYTES {
            return Err(ValidationError::TooLong {
                field: "target.headers",
                len: bytes,
                max: Self::MAX_HEADER_BYTES,
            });
        }
        self.headers = headers;
        if let Some(ms) = self.timeout_ms {
            let max = u64::try_from(task_timeout.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 || ms > max {
                return Err(bad(
                    "target.timeout",
                    format!("must be between 1ms and the task's timeout ({max}ms)"),
                ));
            }
        }
        for s in &self.retry_statuses {
            if !(400..=499).contains(s) || *s == 410 || *s == 429 {
                return Err(bad(
                    "target.retry_statuses",
                    format!(
                        "{s} is not a 4xx status that can be made retryable (410 always ends the task, 429 is always retried)"
                    ),
                ));
            }
        }
        self.retry_statuses.sort_unstable();
        self.retry_statuses.dedup();
        // Keep the URL as given: the signature covers the body, not the URL, and a receiver may
        // route on the exact path.
        Ok(self)
    }
}

/// The destination of a target URL as `host:port` (lower case, default port filled in): the unit
/// of push concurrency limits. `None` for a URL that does not parse or has no host.
pub fn authority(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let host = u.host_str()?.to_ascii_lowercase();
    let port = u.port_or_known_default()?;
    Some(format!("{host}:{port}"))
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Header names (lower case) that Sundial sets itself or that would change how the request is
/// framed: a target cannot give them.
pub const RESERVED_HEADERS: [&str; 13] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "proxy-authorization",
    "traceparent",
    "tracestate",
];

/// Prefixes (lower case) of header names a target cannot give either.
pub const RESERVED_HEADER_PREFIXES: [&str; 3] = ["webhook-", "sundial-", "proxy-"];

/// Headers Sundial sets itself (or that would change how the request is framed).
fn is_reserved_header(lower: &str) -> bool {
    RESERVED_HEADERS.contains(&lower)
        || RESERVED_HEADER_PREFIXES
            .iter()
            .any(|p| lower.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(300);

    fn field(t: Target) -> Option<&'static str> {
        t.validate(T).expect_err("invalid").field()
    }

    #[test]
    fn accepts_and_canonicalises() {
        let t = Target::new("https://example.com/hook?a=1")
            .header("X-Token", "abc")
            .retry_statuses(vec![409, 404, 409])
            .validate(T)
            .expect("valid");
        assert_eq!(t.headers.get("x-token").map(String::as_str), Some("abc"));
        assert_eq!(t.retry_statuses, vec![404, 409]);
        assert_eq!(t.method, PushMethod::Post);
        assert_eq!(t.call_timeout(T), Target::DEFAULT_TIMEOUT);
        assert_eq!(
            t.call_timeout(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn refuses_bad_targets() {
        assert_eq!(field(Target::new("")), Some("target.url"));
        assert_eq!(field(Target::new("not a url")), Some("target.url"));
        assert_eq!(field(Target::new("ftp://example.com/")), Some("target.url"));
        assert_eq!(field(Target::new("file:///etc/passwd")), Some("target.url"));
        assert_eq!(
            field(Target::new("https://user:pw@example.com/")),
            Some("target.url")
        );
        assert_eq!(
            field(Target::new("https://user@example.com/")),
            Some("target.url")
        );
        assert_eq!(
            field(Target::new("https://example.com/#x")),
            Some("target.url")
        );
        assert_eq!(
            field(Target::new(format!(
                "https://example.com/{}",
                "a".repeat(2100)
            ))),
            Some("target.url")
        );
        let u = "https://example.com/";
        assert_eq!(
            field(Target::new(u).header("bad name", "x")),
            Some("target.headers")
        );
        assert_eq!(
            field(Target::new(u).header("Host", "x")),
            Some("target.headers")
        );
        assert_eq!(
            field(Target::new(u).header("webhook-signature", "x")),
            Some("target.headers")
        );
        assert_eq!(
            field(Target::new(u).header("x-a", "a\r\nb: c")),
            Some("target.headers")
        );
        assert_eq!(
            field(Target::new(u).header("X-A", "1").header("x-a", "2")),
            Some("target.headers")
        );
        assert_eq!(
            field(Target::new(u).timeout(Duration::ZERO)),
            Some("target.timeout")
        );
        assert_eq!(
            field(Target::new(u).timeout(Duration::from_secs(301))),
            Some("target.timeout")
        );
        for s in [200, 410, 429, 500] {
            assert_eq!(
                field(Target::new(u).retry_statuses(vec![s])),
                Some("target.retry_statuses")
            );
        }
    }

    #[test]
    fn authorities() {
        assert_eq!(
            authority("https://Hooks.Example.com/a").as_deref(),
            Some("hooks.example.com:443")
        );
        assert_eq!(
            authority("http://127.0.0.1:9000/").as_deref(),
            Some("127.0.0.1:9000")
        );
        assert_eq!(authority("http://[::1]/").as_deref(), Some("[::1]:80"));
        assert_eq!(authority("nope"), None);
    }

    #[test]
    fn stored_form_round_trips() {
        let t = Target::new("http://example.com/")
            .method(PushMethod::Put)
            .header("x-a", "1")
            .timeout(Duration::from_secs(5));
        let json = serde_json::to_string(&t).expect("json");
        assert_eq!(
            json,
            r#"{"url":"http://example.com/","method":"PUT","headers":{"x-a":"1"},"timeout_ms":5000}"#
        );
        assert_eq!(serde_json::from_str::<Target>(&json).expect("parse"), t);
    }
}
