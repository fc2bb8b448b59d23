//! OpenTelemetry traces over OTLP/HTTP (protobuf), following the GenAI semantic conventions
//! for tool execution.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set;
//! the other standard `OTEL_EXPORTER_OTLP_*` variables (headers, timeout) apply as the
//! `opentelemetry-otlp` exporter reads them. The spans:
//!
//! - `{METHOD} {route}` (kind server) for every HTTP request, from
//!   [`crate::http::service::track_http`], continuing an incoming W3C `traceparent`;
//! - `execute_tool {tool id}` for every execution by the harness, with
//!   `gen_ai.operation.name = execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`,
//!   `gen_ai.tool.type` and `mira.invocation.id`, parented to the request that made the call
//!   runnable (the freeze, or the grant of its approval): that request's W3C trace context
//!   is stored with the invocation (`invocation_traces`, only while tracing) because the harness runs off
//!   the request path, possibly on another replica;
//! - `store_result` under it: the result and the evidence written in one transaction.
//!
//! Span attributes carry ids and names, never tool inputs or outputs.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether the environment asks for trace export (`OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set and not empty).
pub fn enabled_by_env() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The HTTP client could not be built.
    #[error("building the OTLP HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    /// The exporter refused its configuration (an endpoint that is no URI…).
    #[error("building the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// A tracer provider exporting to `endpoint` (the full traces URL, e.g.
/// `http://collector:4318/v1/traces`), or, when `None`, to what the `OTEL_EXPORTER_OTLP_*`
/// variables name. Batches are sent from a background thread through this process's tokio
/// runtime (call it inside one). Call [`SdkTracerProvider::shutdown`] at exit to flush.
pub fn provider(endpoint: Option<&str>) -> Result<SdkTracerProvider, TelemetryError> {
    let client = TokioHttpClient {
        client: crate::net::client_builder().timeout(Duration::from_secs(10)).build()?,
        runtime: tokio::runtime::Handle::current(),
    };
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(client);
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    let exporter = builder.build()?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("mira").build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The `tracing` target of the spans exported as OpenTelemetry spans (and only those: the
/// log output never shows them, see [`log_filter`]).
pub const TARGET: &str = "mira::otel";

/// Set once a layer of [`layer`] was made: spans of [`TARGET`] are then exported.
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans are exported (a layer of [`layer`] exists in this process). Work done only
/// for the trace — reading an invocation's stored trace context — is skipped otherwise.
/// (`tracing::enabled!` cannot tell: an absent optional layer enables every target.)
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// The `tracing` layer that turns the spans of [`TARGET`] into OpenTelemetry spans of
/// `provider` (other spans and events are not exported).
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use tracing_subscriber::Layer as _;
    EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("mira"))
        .with_filter(tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE))
}

/// Log targets that are always off, whatever `RUST_LOG` asks: the trace-only spans of
/// [`TARGET`], and the IMAP and SMTP clients, which log protocol lines — credentials included
/// (`LOGIN user password`, `AUTH PLAIN …`) — at debug and trace level.
const ALWAYS_OFF: [&str; 4] = ["mira::otel=off", "async_imap=off", "imap_proto=off", "lettre=off"];

/// `filter` with [`ALWAYS_OFF`] switched off (for the log layer).
pub fn log_filter(mut filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    for directive in ALWAYS_OFF {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// The W3C `traceparent` of the current span, when it is being traced.
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the W3C trace context in `traceparent` (ignored when malformed).
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    set_parent_from(span, &carrier);
}

/// Makes `span` a child of the trace context found in `headers` (`traceparent`,
/// `tracestate`), if any.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    let Some(parent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) else { return };
    let mut carrier = HashMap::from([("traceparent".to_owned(), parent.to_owned())]);
    if let Some(state) = headers.get("tracestate").and_then(|v| v.to_str().ok()) {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    set_parent_from(span, &carrier);
}

fn set_parent_from(span: &tracing::Span, carrier: &HashMap<String, String>) {
    use opentelemetry::trace::TraceContextExt;
    let cx = TraceContextPropagator::new().extract(carrier);
    if cx.span().span_context().is_valid() {
        // Fails only when the span is disabled or already started; then it stays a root.
        let _ = span.set_parent(cx);
    }
}

/// The OTLP exporter's HTTP client: the project's reqwest (rustls) client, each request run
/// on the tokio runtime the provider was built in (the batch processor's thread has none).
#[derive(Debug)]
struct TokioHttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for TokioHttpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<opentelemetry_http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let response = client.execute(request).await?.error_for_status()?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        });
        let (status, headers, body) = sent.await??;
        let mut response = opentelemetry_http::Response::builder().status(status).body(body)?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
