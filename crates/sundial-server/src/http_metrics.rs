//! HTTP request metrics: `sundial_http_requests_total` and `sundial_http_request_duration_seconds`,
//! by route template, method and status class.
//!
//! Owns the labels of request series and keeps them bounded: the route is the router's template
//! (`/v1/tasks/{id}`, never the path a caller sent; `unmatched` for a path no route has), the
//! method one of the standard ones or `other`, the status its class (`2xx` … `5xx`). Never
//! decides an answer: it only observes what the inner layers return.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

/// The route template a request matched, carried on the response from the inner layer (which
/// runs after routing) to the outer one (which sees every request, matched or not).
#[derive(Clone)]
struct RouteTemplate(String);

/// The inner half (installed with `route_layer`, so the template is known): puts the template on
/// the response.
pub async fn mark_route(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| RouteTemplate(m.as_str().to_string()));
    let mut resp = next.run(req).await;
    if let Some(route) = route {
        resp.extensions_mut().insert(route);
    }
    resp
}

/// The outer half (installed with `layer`, around everything): counts and times the request.
pub async fn record(req: Request, next: Next) -> Response {
    // A measurement of elapsed time for a histogram, at a resolution finer than the Clock's
    // milliseconds; it decides nothing, so it need not follow a test's clock.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let method = method_label(req.method());
    let resp = next.run(req).await;
    let route = resp
        .extensions()
        .get::<RouteTemplate>()
        .map_or_else(|| "unmatched".to_string(), |r| r.0.clone());
    let status = status_class(resp.status().as_u16());
    metrics::counter!(
        "sundial_http_requests_total",
        "route" => route.clone(),
        "method" => method,
        "status_class" => status
    )
    .increment(1);
    metrics::histogram!(
        "sundial_http_request_duration_seconds",
        "route" => route,
        "method" => method,
        "status_class" => status
    )
    .record(started.elapsed().as_secs_f64());
    resp
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        assert_eq!(method_label(&Method::GET), "GET");
        let odd = Method::from_bytes(b"BREW").unwrap_or(Method::TRACE);
        assert_eq!(method_label(&odd), "other");
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(429), "4xx");
        assert_eq!(status_class(503), "5xx");
    }
}
