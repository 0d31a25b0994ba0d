//! Logs and traces of the `sundial` binary: the `tracing` subscriber (logs on stderr, filtered by
//! `RUST_LOG`), and, when an OTLP endpoint is configured (`sundial server --otlp-endpoint`), the
//! OpenTelemetry layer that turns Sundial's spans into OpenTelemetry spans and exports them over
//! OTLP/HTTP (protobuf) in batches.
//!
//! Without an endpoint nothing of OpenTelemetry is installed: no exporter, no batch thread, no
//! span bookkeeping beyond `tracing`'s own.
//!
//! The exporter's HTTP client is the workspace reqwest (built through
//! [`sundial_cli::http_client_builder`], so HTTPS uses the ring provider); its requests run on the
//! server's tokio runtime, whichever thread the batch processor calls from.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest answer read from the collector.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What was installed; [`Telemetry::shutdown`] exports the spans still queued.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the exporter (nothing when none was configured).
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: traces not all exported at shutdown: {e}");
        }
    }
}

/// The OTLP/HTTP traces URL for `endpoint`: the base URL of a collector (`http://host:4318`, as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` means it) gets `/v1/traces` appended; a URL already ending in
/// `/v1/traces` is used as it is.
pub fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(endpoint)
        .with_context(|| format!("--otlp-endpoint {endpoint:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        anyhow::bail!("--otlp-endpoint {endpoint:?}: use an http or https URL");
    }
    if url.path().ends_with("/v1/traces") {
        return Ok(url.to_string());
    }
    Ok(format!("{}/v1/traces", url.as_str().trim_end_matches('/')))
}

/// Installs the global subscriber: logs at `default_level` unless `RUST_LOG` says otherwise, and
/// the OpenTelemetry layer when `otlp_endpoint` is given.
pub fn init(
    default_level: &str,
    otlp_endpoint: Option<&str>,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<Telemetry> {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let Some(endpoint) = otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let url = traces_url(endpoint)?;
    let http = OtlpHttp {
        client: sundial_cli::http_client_builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .context("building the OTLP client")?,
        runtime: runtime.clone(),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(http)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("building the OTLP exporter")?;
    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("sundial").build())
        .with_batch_exporter(exporter)
        .build();
    let tracer = provider.tracer("sundial");
    // Only Sundial's own spans are exported (not those of the libraries it uses).
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            Targets::new()
                .with_target("sundial", LevelFilter::INFO)
                .with_target("sundial_server", LevelFilter::INFO)
                .with_target("sundial_push", LevelFilter::INFO),
        );
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The exporter's HTTP client: the request runs on the server's runtime (the batch processor
/// calls from a thread of its own, outside any runtime).
#[derive(Debug, Clone)]
struct OtlpHttp {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request: reqwest::Request = request.try_into()?;
        let client = self.client.clone();
        let call = self.runtime.spawn(async move {
            let mut answer = client.execute(request).await?;
            let status = answer.status();
            let headers = std::mem::take(answer.headers_mut());
            let mut body = Vec::new();
            while let Some(chunk) = answer.chunk().await? {
                let room = MAX_ANSWER_BYTES.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if room < chunk.len() {
                    break;
                }
            }
            let mut out = Response::builder().status(status).body(Bytes::from(body))?;
            *out.headers_mut() = headers;
            Ok::<_, HttpError>(out)
        });
        call.await?
    }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_endpoint_is_a_base_url_or_the_traces_url() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/prefix/v1/traces").unwrap(),
            "https://otel.example/prefix/v1/traces"
        );
        assert!(traces_url("collector:4318").is_err());
        assert!(traces_url("ftp://collector").is_err());
    }
}
