//! The cross-site write guard: no web page can make a browser change anything.
//!
//! A browser sends a cross-origin request without asking first (no CORS preflight) only when it
//! is a *simple request*: method `GET`, `HEAD` or `POST`, no headers beyond a short safe list, and
//! a `Content-Type` of `text/plain`, `application/x-www-form-urlencoded` or `multipart/form-data`
//! (or none). Such a request reaches the server whatever the page's origin, so a page in an
//! operator's browser could post `{"kind": …}` as `text/plain` to `http://127.0.0.1:7373`. The
//! server never answers a preflight, so anything else a page tries is stopped in the browser.
//!
//! The rule, for every method other than `GET`, `HEAD` and `OPTIONS`, checked by the access layer
//! ([`crate::access`]) before anything else (authentication, parsing, the store):
//!
//! - a `Content-Type` that is JSON (`application/json` or `application/<something>+json`, any
//!   parameters) passes;
//! - any other `Content-Type` is refused with `415 unsupported_media_type`;
//! - no `Content-Type` at all (a bodiless `POST` such as cancel or trigger) passes only with an
//!   `Authorization` header, which a simple request cannot carry; otherwise `415`.
//!
//! Clients therefore send `content-type: application/json` on every write, bodiless ones
//! included (the CLI and `RemoteWorker` do).

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};

use crate::error::ApiError;

/// Whether `method` can change something (everything but `GET`, `HEAD`, `OPTIONS`).
pub fn is_mutating(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether a `Content-Type` value names JSON: `application/json` or `application/*+json`, with
/// any parameters, in any case.
pub fn is_json_content_type(value: &str) -> bool {
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.strip_prefix("application/") {
        Some("json") => true,
        Some(sub) => sub.ends_with("+json") && sub.len() > "+json".len(),
        None => false,
    }
}

/// Why a write was refused by the guard, if it was.
pub fn cross_site_refusal(req: &Request) -> Option<ApiError> {
    if !is_mutating(req.method()) {
        return None;
    }
    let headers = req.headers();
    match headers.get(header::CONTENT_TYPE) {
        Some(ct) => match ct.to_str() {
            Ok(v) if is_json_content_type(v) => None,
            _ => Some(unsupported(format!(
                "a {} request must send content-type: application/json (got {:?})",
                req.method(),
                String::from_utf8_lossy(ct.as_bytes())
            ))),
        },
        None if headers.contains_key(header::AUTHORIZATION) => None,
        None => Some(unsupported(format!(
            "a {} request must send content-type: application/json (or an Authorization header), even without a body",
            req.method()
        ))),
    }
}

fn unsupported(message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            " application/json ;x=y",
        ] {
            assert!(is_json_content_type(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
            "application/+json",
            "text/json",
            "",
        ] {
            assert!(!is_json_content_type(bad), "{bad}");
        }
    }
}
