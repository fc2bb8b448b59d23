//! Prometheus metrics (`GET /metrics`, OpenMetrics text format, `prometheus-client`).
//!
//! One process-wide registry: every part of the server counts into it with a one-line call
//! ([`http_request`], [`invocation_finished`], [`approval_decided`], [`stream_opened`], …),
//! and the scrape adds gauges read from the store at that moment (harness queue depth and MCP
//! connections by state, both cluster-wide since the store is shared).
//!
//! Labels never carry a user id, a token, a run or invocation id, an input or a raw URL:
//! only route templates (`/v1/runs/{id}`), methods, status codes, tool ids, final statuses,
//! approval decisions, connection states and the node id of a replica. `/metrics` needs an
//! admin token (see [`crate::http::service`]).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `mira_http_requests_total` and `mira_http_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// `GET`, `POST`, …
    pub method: String,
    /// The matched route template (`/v1/invocations/{id}`), or `unmatched`.
    pub route: String,
    /// The HTTP status code.
    pub status: u16,
}

/// Labels of `mira_invocations_finished_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvocationLabels {
    /// The tool id.
    pub tool: String,
    /// The final status (`completed`, `failed`, `cancelled`, `denied`, `interrupted`, …).
    pub status: String,
}

/// A single-label set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `granted` or `denied`.
    pub decision: String,
}

/// A single-label set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// A state name.
    pub state: String,
}

/// A single-label set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The replica's node id (`<data-dir>/node.id`).
    pub node: String,
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Family<HttpLabels, Histogram>,
    invocations: Family<InvocationLabels, Counter>,
    approval_wait: Family<DecisionLabels, Histogram>,
    queue: Family<StateLabels, Gauge>,
    recoveries: Counter,
    streams: Gauge,
    mcp: Family<StateLabels, Gauge>,
    heartbeat: Family<NodeLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    // 1 ms … ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn wait_histogram() -> Histogram {
    // 0.1 s … ~1.8 h.
    Histogram::new(exponential_buckets(0.1, 3.0, 12))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("mira");
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            http_requests.clone(),
        );
        let http_duration =
            Family::<HttpLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> Histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to the response head, by method, route template and status",
            http_duration.clone(),
        );
        let invocations = Family::<InvocationLabels, Counter>::default();
        registry.register(
            "invocations_finished",
            "Invocations that reached a final status on this replica, by tool and final status",
            invocations.clone(),
        );
        let approval_wait =
            Family::<DecisionLabels, Histogram>::new_with_constructor(wait_histogram as fn() -> Histogram);
        registry.register(
            "approval_wait_seconds",
            "Time from an approval request to its decision, by decision",
            approval_wait.clone(),
        );
        let queue = Family::<StateLabels, Gauge>::default();
        registry.register(
            "harness_queue",
            "Invocations waiting for or in execution in the whole store (queued, running, awaiting_approval), read at scrape time",
            queue.clone(),
        );
        let recoveries = Counter::default();
        registry.register(
            "harness_recovered_invocations",
            "Invocations left running by a previous incarnation, an expired lease or a dead replica that this replica recovered (interrupted)",
            recoveries.clone(),
        );
        let streams = Gauge::default();
        registry.register("sse_streams_open", "Server-Sent Event streams open on this replica", streams.clone());
        let mcp = Family::<StateLabels, Gauge>::default();
        registry.register(
            "mcp_connections",
            "External MCP servers by connection state, read from the store at scrape time",
            mcp.clone(),
        );
        let heartbeat = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "replica_heartbeat_timestamp_seconds",
            "Unix time of this replica's last successful heartbeat in the store, by node id",
            heartbeat.clone(),
        );
        Metrics {
            registry,
            http_requests,
            http_duration,
            invocations,
            approval_wait,
            queue,
            recoveries,
            streams,
            mcp,
            heartbeat,
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Counts one answered HTTP request (`route` is the matched template, never the raw path).
pub fn http_request(method: &str, route: &str, status: u16, elapsed: Duration) {
    let labels = HttpLabels { method: method.to_owned(), route: route.to_owned(), status };
    METRICS.http_requests.get_or_create(&labels).inc();
    METRICS.http_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
}

/// Counts an invocation that reached final status `status` (the stored status word).
pub fn invocation_finished(tool_id: &str, status: &str) {
    METRICS.invocations.get_or_create(&InvocationLabels { tool: tool_id.to_owned(), status: status.to_owned() }).inc();
}

/// Records an approval decided `waited` after it was requested.
pub fn approval_decided(decision: &str, waited: Duration) {
    METRICS
        .approval_wait
        .get_or_create(&DecisionLabels { decision: decision.to_owned() })
        .observe(waited.as_secs_f64());
}

/// Counts invocations recovered from a dead or previous incarnation.
pub fn invocations_recovered(n: u64) {
    METRICS.recoveries.inc_by(n);
}

/// One more open event stream (pair with [`stream_closed`]).
pub fn stream_opened() {
    METRICS.streams.inc();
}

/// One event stream fewer.
pub fn stream_closed() {
    METRICS.streams.dec();
}

/// Records a heartbeat of replica `node` now.
pub fn heartbeat(node: &str) {
    let now = chrono::Utc::now().timestamp();
    METRICS.heartbeat.get_or_create(&NodeLabels { node: node.to_owned() }).set(now);
}

/// Renders every metric (OpenMetrics text), after setting the scrape-time gauges from
/// `queue` (status → count) and `mcp` (state → count). States missing from a map are 0.
pub fn render(queue: &[(String, i64)], mcp: &[(String, i64)]) -> String {
    for state in ["queued", "running", "awaiting_approval"] {
        let n = queue.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
        METRICS.queue.get_or_create(&StateLabels { state: state.to_owned() }).set(n);
    }
    for state in crate::state::McpConnectionState::ALL {
        let n = mcp.iter().find(|(s, _)| s == state.as_str()).map_or(0, |(_, n)| *n);
        METRICS.mcp.get_or_create(&StateLabels { state: state.as_str().to_owned() }).set(n);
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
