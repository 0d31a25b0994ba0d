//! Namespace quotas: the most live tasks a namespace may hold, and the most tasks it may create
//! per second. A create over either is `429` with `Retry-After`, and nothing is stored; other
//! namespaces are not slowed by it.
//!
//! - **Creates per second** is a token bucket per namespace and per node: it holds at most one
//!   second's allowance and refills smoothly, so a namespace cannot spend a whole second's
//!   allowance in its first millisecond twice over. With several nodes each node admits up to
//!   the rate (the quota bounds what one node accepts; a load balancer spreading creates over
//!   `n` nodes lets up to `n` times through).
//! - **Live tasks** (scheduled, ready or running) are counted from the store's counts by queue
//!   and state, read again at most once per [`LIVE_COUNT_TTL_MS`] and raised by what this node
//!   admitted since. So a namespace can overshoot by what other nodes admitted within that
//!   window, never by more.
//!
//! This module never decides who may create (the access layer does) and never writes.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sundial::{Sundial, TaskState, Timestamp};
use sundial_store::Namespace;

use crate::error::ApiError;
use crate::namespace::Ns;

/// How long a namespace's count of live tasks is trusted before it is read again.
pub const LIVE_COUNT_TTL_MS: i64 = 1_000;

/// The quotas of the request's namespace (inserted by the access layer when it has a record).
#[derive(Debug, Clone)]
pub struct NamespaceQuota(pub Namespace);

/// The request's quotas, for handlers: `None` for the default namespace and namespaces without
/// quotas. Never fails.
#[derive(Debug, Clone, Default)]
pub struct Quota(pub Option<Namespace>);

impl<S: Send + Sync> FromRequestParts<S> for Quota {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Quota(
            parts
                .extensions
                .get::<NamespaceQuota>()
                .map(|q| q.0.clone()),
        ))
    }
}

/// Why a create was refused, and when to try again.
#[derive(Debug, Clone, PartialEq)]
pub struct OverQuota {
    pub message: String,
    pub retry_after_secs: u64,
}

impl IntoResponse for OverQuota {
    fn into_response(self) -> Response {
        let mut resp =
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota", self.message).into_response();
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(self.retry_after_secs.max(1)),
        );
        resp
    }
}

#[derive(Debug, Default)]
struct Usage {
    /// Create allowance left (fractional tokens), and when it was last refilled.
    tokens: f64,
    refilled_at: Option<Timestamp>,
    /// Live tasks as last read, when, and how many this node admitted since.
    live: Option<(u64, Timestamp)>,
    admitted_since_read: u64,
}

/// What every namespace with quotas has used, on this node.
#[derive(Debug, Default)]
pub struct Quotas {
    usage: Mutex<HashMap<String, Usage>>,
}

impl Quotas {
    /// Admits `n` creates into `ns` (with its quota record) at `now`, or says why not. Reads the
    /// store's counts when the namespace has a live-task quota and its count is stale.
    pub async fn admit(
        &self,
        sundial: &Sundial,
        ns: &Ns,
        quota: &Quota,
        n: usize,
    ) -> Result<(), Response> {
        let Some(q) = &quota.0 else {
            return Ok(());
        };
        if q.max_creates_per_second.is_none() && q.max_live_tasks.is_none() {
            return Ok(());
        }
        let now = sundial.clock().now();
        let n = n as u64;
        let live_stale = q.max_live_tasks.is_some()
            && self.with(ns, |u| {
                u.live
                    .is_none_or(|(_, at)| now.0 - at.0 >= LIVE_COUNT_TTL_MS)
            });
        if live_stale {
            let live = live_tasks(sundial, ns)
                .await
                .map_err(IntoResponse::into_response)?;
            self.with(ns, |u| {
                u.live = Some((live, now));
                u.admitted_since_read = 0;
            });
        }
        self.with(ns, |u| decide(u, q, n, now))
            .map_err(IntoResponse::into_response)
    }

    fn with<T>(&self, ns: &Ns, f: impl FnOnce(&mut Usage) -> T) -> T {
        let mut usage = self
            .usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if usage.len() > 10_000 && !usage.contains_key(ns.name()) {
            usage.clear();
        }
        f(usage.entry(ns.name().to_string()).or_default())
    }
}

/// The admission rule over one namespace's usage (pure, so it is tested without a store).
fn decide(u: &mut Usage, q: &Namespace, n: u64, now: Timestamp) -> Result<(), OverQuota> {
    if let Some(max) = q.max_live_tasks {
        let live = u.live.map_or(0, |(c, _)| c) + u.admitted_since_read;
        if live + n > max {
            return Err(OverQuota {
                message: format!(
                    "namespace {:?} holds {live} live tasks; its quota is {max} (creating {n} more would pass it)",
                    q.name
                ),
                retry_after_secs: 1,
            });
        }
    }
    if let Some(rate) = q.max_creates_per_second {
        let rate = f64::from(rate);
        if n as f64 > rate {
            return Err(OverQuota {
                message: format!(
                    "namespace {:?} may create {rate} tasks per second; this request creates {n}",
                    q.name
                ),
                retry_after_secs: 1,
            });
        }
        let elapsed_ms = u.refilled_at.map_or(1_000, |t| (now.0 - t.0).max(0));
        u.tokens = (u.tokens + rate * elapsed_ms as f64 / 1_000.0).min(rate);
        u.refilled_at = Some(now);
        if u.tokens + 1e-9 < n as f64 {
            let wait_secs = ((n as f64 - u.tokens) / rate).ceil() as u64;
            return Err(OverQuota {
                message: format!(
                    "namespace {:?} is over its quota of {rate} creates per second",
                    q.name
                ),
                retry_after_secs: wait_secs.max(1),
            });
        }
        u.tokens -= n as f64;
    }
    u.admitted_since_read += n;
    Ok(())
}

/// Live (scheduled, ready, running) tasks of namespace `ns`, from the store's counts.
async fn live_tasks(sundial: &Sundial, ns: &Ns) -> Result<u64, ApiError> {
    let counts = sundial.counts().await?;
    Ok(counts
        .iter()
        .filter(|c| ns.owns(&c.queue))
        .filter(|c| {
            matches!(
                c.state,
                TaskState::Scheduled | TaskState::Ready | TaskState::Running
            )
        })
        .map(|c| c.count)
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(max_live: Option<u64>, rate: Option<u32>) -> Namespace {
        Namespace {
            name: "acme".into(),
            max_live_tasks: max_live,
            max_creates_per_second: rate,
            created_at: Timestamp(0),
        }
    }

    #[test]
    fn the_create_rate_is_smooth_and_tells_when_to_come_back() {
        let q = ns(None, Some(10));
        let mut u = Usage::default();
        // A full second's allowance at first, then nothing more in the same millisecond.
        for _ in 0..10 {
            decide(&mut u, &q, 1, Timestamp(1_000)).unwrap();
        }
        let e = decide(&mut u, &q, 1, Timestamp(1_000)).unwrap_err();
        assert_eq!(e.retry_after_secs, 1);
        // 100 ms later: one more (10 per second, refilled smoothly), not ten.
        decide(&mut u, &q, 1, Timestamp(1_100)).unwrap();
        assert!(decide(&mut u, &q, 1, Timestamp(1_100)).is_err());
        // A batch larger than a second's allowance can never pass.
        let mut fresh = Usage::default();
        assert!(decide(&mut fresh, &q, 11, Timestamp(5_000)).is_err());
    }

    #[test]
    fn live_tasks_count_what_was_read_and_what_was_admitted_since() {
        let q = ns(Some(5), None);
        let mut u = Usage {
            live: Some((3, Timestamp(0))),
            ..Usage::default()
        };
        decide(&mut u, &q, 2, Timestamp(10)).unwrap();
        let e = decide(&mut u, &q, 1, Timestamp(20)).unwrap_err();
        assert!(e.message.contains("holds 5 live tasks"), "{}", e.message);
    }
}
