//! In-process handlers run in their task's trace. Without an OpenTelemetry layer a handler's
//! `ctx.trace()` is the context stored with the task, unchanged (an untraced task has none); with
//! one, it is the context of the `sundial.task.run` span, a child of the `sundial.task.fire` span,
//! itself a child of the stored context, and the handler's own `tracing` spans are children of the
//! run span.
//!
//! Each test runs on a current-thread runtime, so the subscriber that `set_default` installs for
//! it sees every span the engine's tasks open. Every test installs one: `tracing` caches whether a
//! span is wanted across threads, and a test running with no subscriber at all could have the
//! engine's spans cached as unwanted for the other tests of this binary.

mod common;

use common::*;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use sundial::{TaskSpec, TaskState, TraceContext};
use tokio::sync::mpsc;
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn stored() -> Option<TraceContext> {
    TraceContext::parse(
        &format!("00-{TRACE}-{CALLER_SPAN}-01"),
        Some("congo=t61rcWkgMzE"),
    )
}

/// Registers a handler for kind `traced` that reports the `ctx.trace()` it was given, after
/// opening a span of its own.
fn traced_handler(h: &Harness) -> mpsc::UnboundedReceiver<Option<TraceContext>> {
    let (tx, rx) = mpsc::unbounded_channel();
    h.sundial
        .register("traced", move |ctx: sundial::TaskContext| {
            let tx = tx.clone();
            async move {
                tracing::info_span!("handler.own").in_scope(|| {});
                let _ = tx.send(ctx.trace().cloned());
                Ok::<(), sundial::HandlerError>(())
            }
        });
    rx
}

async fn seen(rx: &mut mpsc::UnboundedReceiver<Option<TraceContext>>) -> Option<TraceContext> {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("a run within 10s")
        .expect("channel open")
}

#[tokio::test]
async fn without_a_layer_the_handler_gets_the_stored_context() {
    // A subscriber without an OpenTelemetry layer, as `sundial server` without `--otlp-endpoint`.
    let _installed = tracing::subscriber::set_default(tracing_subscriber::registry());
    let h = harness().await;
    let mut runs = traced_handler(&h);
    let mut stepper = h.sundial.stepper();
    let traced = h
        .sundial
        .schedule(TaskSpec::new("traced").trace(stored()))
        .await
        .unwrap();
    stepper.settle().await;
    assert_eq!(seen(&mut runs).await, stored());
    wait_state(&h.sundial, traced, TaskState::Succeeded).await;

    let plain = h.sundial.schedule(TaskSpec::new("traced")).await.unwrap();
    stepper.settle().await;
    assert_eq!(
        seen(&mut runs).await,
        None,
        "an untraced task has no context"
    );
    wait_state(&h.sundial, plain, TaskState::Succeeded).await;
}

#[tokio::test]
async fn with_a_layer_the_handler_runs_in_the_run_span() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("engine_trace")));
    let _installed = tracing::subscriber::set_default(subscriber);

    let h = harness().await;
    let mut runs = traced_handler(&h);
    let mut stepper = h.sundial.stepper();
    let id = h
        .sundial
        .schedule(TaskSpec::new("traced").trace(stored()))
        .await
        .unwrap();
    stepper.settle().await;
    let given = seen(&mut runs).await.expect("the handler got a context");
    wait_state(&h.sundial, id, TaskState::Succeeded).await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let named = |name: &str| {
        let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        found[0].clone()
    };
    let fire = named("sundial.task.fire");
    let run = named("sundial.task.run");
    let own = named("handler.own");
    let trace = TraceId::from_hex(TRACE).unwrap();
    for s in [&fire, &run, &own] {
        assert_eq!(
            s.span_context.trace_id(),
            trace,
            "{} in the task's trace",
            s.name
        );
    }
    assert_eq!(fire.parent_span_id, SpanId::from_hex(CALLER_SPAN).unwrap());
    assert_eq!(run.parent_span_id, fire.span_context.span_id());
    assert_eq!(own.parent_span_id, run.span_context.span_id());
    assert_eq!(
        given.traceparent(),
        format!("00-{TRACE}-{}-01", run.span_context.span_id()),
        "the handler's context is the run span's"
    );
    assert_eq!(given.tracestate(), Some("congo=t61rcWkgMzE"));
}
