//! W3C trace context on the API: the `traceparent` and `tracestate` request headers, and the
//! request spans that continue them.
//!
//! A create (`POST /v1/tasks`, `POST /v1/tasks:batch`) runs inside a `sundial.task.create` span
//! whose parent is the request's `traceparent`; every task it stores carries that span's context
//! (or, when no OpenTelemetry layer is installed, the request's own context unchanged), so the
//! steps that later run the task (`sundial::trace`) continue the same trace. A worker's complete or
//! fail runs inside a span whose parent is the worker's `traceparent`; one without the header is
//! still recorded in the task's trace, as a point after the write.
//!
//! A malformed `traceparent` is ignored, as the W3C recommendation asks (with the `tracestate`
//! beside it): the request is served as if it had none, and its task is stored without one. The
//! header never makes a request fail.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use sundial::TraceContext;
use sundial::trace::{self, Step};
use tracing::Span;

/// The request's W3C trace context, when it sent a well-formed `traceparent`.
#[derive(Debug, Clone, Default)]
pub struct TraceHeaders(pub Option<TraceContext>);

impl TraceHeaders {
    pub fn from_headers(headers: &HeaderMap) -> TraceHeaders {
        let one = |name: &str| -> Option<String> {
            // Several values of one header are one comma-separated list (RFC 9110); several
            // traceparents make none valid, which the parse below refuses.
            let values: Vec<&str> = headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            (!values.is_empty()).then(|| values.join(","))
        };
        let Some(traceparent) = one("traceparent") else {
            return TraceHeaders(None);
        };
        let tracestate = one("tracestate");
        TraceHeaders(TraceContext::parse(&traceparent, tracestate.as_deref()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for TraceHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(TraceHeaders::from_headers(&parts.headers))
    }
}

/// The span of a create request, a child of the caller's context when it sent one (a new trace
/// otherwise, when traces are exported).
pub fn create_span(incoming: Option<&TraceContext>, tasks: usize) -> Span {
    let span = tracing::info_span!(
        "sundial.task.create",
        otel.name = "sundial.task.create",
        otel.kind = "server",
        sundial.tasks = tasks,
    );
    if let Some(parent) = incoming {
        trace::continue_trace(&span, parent);
    }
    span
}

/// The context a created task carries: the create span's when traced, else the caller's.
pub fn stored_context(span: &Span, incoming: Option<&TraceContext>) -> Option<TraceContext> {
    trace::handed_on(span, incoming)
}

/// The span of a worker's complete or fail, a child of the worker's context (`None` when the
/// request sent none).
pub fn result_span(step: Step, incoming: Option<&TraceContext>) -> Option<Span> {
    let parent = incoming?;
    let span = match step {
        Step::Fail => tracing::info_span!(
            "sundial.task.fail",
            otel.name = "sundial.task.fail",
            otel.kind = "server"
        ),
        _ => tracing::info_span!(
            "sundial.task.complete",
            otel.name = "sundial.task.complete",
            otel.kind = "server"
        ),
    };
    trace::continue_trace(&span, parent);
    Some(span)
}

/// A result recorded without the worker's context: one point in the task's own trace.
pub fn record_result_point(step: Step, task: &sundial::Task) {
    drop(trace::task_span(step, task).entered());
}
