//! Trace spans of a task's steps, continued from the W3C trace context the task carries.
//!
//! The steps are `tracing` spans (`sundial.task.fire`, `sundial.task.run`,
//! `sundial.task.deliver`, `sundial.task.complete`, `sundial.task.fail`), made only for tasks that
//! carry a [`TraceContext`], so untraced tasks cost nothing here. Each span's OpenTelemetry parent is
//! set from the stored context through `tracing-opentelemetry`; the process that installs an
//! OpenTelemetry layer (the `sundial server --otlp-endpoint`, or an embedder's own) exports them.
//! Without such a layer the spans are plain `tracing` spans and the context a step hands on (to a
//! handler, a worker, a push receiver) is the stored one unchanged, so a trace that started at the
//! caller still continues at the worker.
//!
//! Never decides anything about a task: spans observe, the store decides.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use sundial_core::{Task, TraceContext};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The OpenTelemetry context of a W3C trace context (a remote parent).
pub fn otel_context(trace: &TraceContext) -> opentelemetry::Context {
    let state = trace
        .tracestate()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let span = SpanContext::new(
        TraceId::from_bytes(trace.trace_id()),
        SpanId::from_bytes(trace.span_id()),
        TraceFlags::new(trace.flags()),
        true,
        state,
    );
    opentelemetry::Context::new().with_remote_span_context(span)
}

/// The W3C trace context of `span`, when it belongs to an OpenTelemetry trace (an OpenTelemetry
/// layer is installed and the span is enabled).
pub fn span_trace(span: &Span) -> Option<TraceContext> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let otel = cx.span();
    let sc = otel.span_context();
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    TraceContext::from_parts(
        sc.trace_id().to_bytes(),
        sc.span_id().to_bytes(),
        sc.trace_flags().to_u8(),
        (!state.is_empty()).then_some(state),
    )
}

/// Makes `span` a child of `parent` in its OpenTelemetry trace (nothing without a layer). Call
/// before the span is first entered.
pub fn continue_trace(span: &Span, parent: &TraceContext) {
    // Without an OpenTelemetry layer there is no trace to join: the span stays a plain one.
    let _ = span.set_parent(otel_context(parent));
}

/// What a step hands on to the next: its span's context when traced, else the one it was given.
pub fn handed_on(span: &Span, given: Option<&TraceContext>) -> Option<TraceContext> {
    span_trace(span).or_else(|| given.cloned())
}

/// A step of a task's life that gets a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The shard loop claimed the due task (to run it here, or to make it ready for workers).
    Fire,
    /// An in-process handler (or the push executor) runs an attempt.
    Run,
    /// A worker's poll took the task.
    Deliver,
    /// An attempt's success was recorded.
    Complete,
    /// An attempt's failure was recorded.
    Fail,
}

/// A step's span for `task`, a child of the task's stored context (`Span::none()` for a task
/// without one).
pub fn task_span(step: Step, task: &Task) -> Span {
    let Some(trace) = &task.trace else {
        return Span::none();
    };
    let span = step_span(step, task);
    continue_trace(&span, trace);
    span
}

/// A step's span for `task`, a child of `parent` (`Span::none()` when `parent` is none).
pub fn child_span(step: Step, task: &Task, parent: &Span) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    let span = step_span(step, task);
    if let Some(trace) = span_trace(parent) {
        continue_trace(&span, &trace);
    }
    span
}

fn step_span(step: Step, task: &Task) -> Span {
    // `tracing` wants span names as literals: one arm per step.
    macro_rules! span {
        ($name:literal) => {
            tracing::info_span!(
                $name,
                otel.name = $name,
                sundial.task.id = %task.id,
                sundial.task.queue = %task.queue,
                sundial.task.kind = %task.kind,
                sundial.task.attempt = task.attempt,
            )
        };
    }
    match step {
        Step::Fire => span!("sundial.task.fire"),
        Step::Run => span!("sundial.task.run"),
        Step::Deliver => span!("sundial.task.deliver"),
        Step::Complete => span!("sundial.task.complete"),
        Step::Fail => span!("sundial.task.fail"),
    }
}
