//! `/healthz`, `/readyz`, `/openapi.json`.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;

/// Liveness.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: &'static str,
}

/// Embedding model state (ranking of > 20 tools).
#[derive(Serialize, utoipa::ToSchema)]
pub struct EmbeddingState {
    /// `ready|fetching|loading|lexical_only|failed`.
    pub state: crate::embedding::State,
    /// How far the fetch of the pinned model is, while `fetching`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::embedding::fetch::Progress>,
    /// Model id when ready, else the configured model directory or name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Why the state is not `ready` (the error for `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How exposures beyond 20 tools are ranked now: `hybrid` or `lexical`.
    pub ranking: &'static str,
    /// Registered tools in the ranking index.
    pub tools_indexed: usize,
    /// Of those, tools with a vector of the current model.
    pub tools_embedded: usize,
    /// Tool texts embedded by this process since start.
    pub embedded_since_start: u64,
    /// Tool vectors taken from the store's cache since start.
    pub from_cache_since_start: u64,
    /// Turn queries embedded since start.
    pub queries_embedded: u64,
}

/// Readiness.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ok`, or `unavailable` when the store does not answer (the error is logged).
    pub store: String,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Embedding state.
    pub embedding: EmbeddingState,
    /// Registered tools.
    pub tools_registered: usize,
    /// What the host offers for sandboxing terminal sessions (Landlock ABI, cgroups) and
    /// which protections are in force.
    pub sandbox: crate::sandbox::SandboxReport,
    /// This replica: its node id and how it hears other replicas' events.
    pub replica: ReplicaReady,
    /// The managed browser: `missing` (no Chromium binary; the browser tools are unavailable
    /// with `browser_missing`), `idle` or `running`, and its open contexts.
    pub browser: crate::tools::browser::manager::BrowserReport,
}

/// This replica in `/readyz`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ReplicaReady {
    /// The data directory's stable node id (owner of its terminal sessions).
    pub node_id: String,
    /// `in_process` (SQLite: one process) or `postgres_notify` (LISTEN/NOTIFY between replicas).
    pub events: &'static str,
    /// Postgres: the event listener is connected now.
    pub listening: bool,
    /// Postgres: listener connections made since start (each one re-read every stream).
    pub listener_connections: u64,
    /// Postgres: event notifications received from other replicas since start.
    pub notifications_received: u64,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// The store answers; reports the embedding model's state and the sandbox.
#[utoipa::path(get, path = "/readyz", tag = "service", responses((status = 200, body = Ready), (status = 503, body = Ready)))]
pub async fn readyz(State(app): State<App>) -> impl IntoResponse {
    // Unauthenticated: the store's error (addresses, database names) is logged, not told —
    // once when the store stops answering and once when it answers again (a load balancer
    // asks every half second).
    static STORE_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let store = match app.store.ping().await {
        Ok(()) => {
            if STORE_DOWN.swap(false, std::sync::atomic::Ordering::Relaxed) {
                tracing::info!("readiness: the store answers again");
            }
            "ok".to_owned()
        }
        Err(e) => {
            if !STORE_DOWN.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "readiness: the store does not answer");
            }
            "unavailable".to_owned()
        }
    };
    let status = if store == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let model = app.embeddings.status();
    let counts = app.tool_index.counts();
    let counters = &app.embeddings.counters;
    let embedding = EmbeddingState {
        ranking: if model.state == crate::embedding::State::Ready { "hybrid" } else { "lexical" },
        state: model.state,
        progress: model.progress,
        model: model.model,
        reason: model.reason,
        tools_indexed: counts.indexed,
        tools_embedded: counts.embedded,
        embedded_since_start: counters.tools_embedded.load(Ordering::Relaxed),
        from_cache_since_start: counters.tools_from_cache.load(Ordering::Relaxed),
        queries_embedded: counters.queries_embedded.load(Ordering::Relaxed),
    };
    let body = Ready {
        store,
        backend: app.store.backend().name(),
        embedding,
        tools_registered: app.registry.all().len(),
        sandbox: app.sandbox.report(),
        browser: app.browser.report().await,
        replica: {
            let l = app.store.bus().listener();
            ReplicaReady {
                node_id: app.node.id.clone(),
                events: if l.enabled.load(Ordering::Relaxed) { "postgres_notify" } else { "in_process" },
                listening: l.listening.load(Ordering::Relaxed),
                listener_connections: l.connections.load(Ordering::Relaxed),
                notifications_received: l.received.load(Ordering::Relaxed),
            }
        },
    };
    (status, axum::Json(body))
}

/// Prometheus metrics in the OpenMetrics text format ([`crate::metrics`]): HTTP requests
/// by route template and status, invocations by tool and final status, approval wait time,
/// harness queue depth and recoveries, open event streams, MCP connections by state and the
/// replica's heartbeat. Admin token only (a scraper is given an admin user's token); labels
/// carry no user ids, inputs or raw URLs. Errors: 401, 403 (not an admin), 503
/// `store_unavailable` (the scrape-time store counts failed).
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String,
        description = "every metric, OpenMetrics text"), (status = 403)),
    security(("bearer" = [])))]
pub async fn metrics(State(app): State<App>, user: super::auth::AuthUser) -> crate::error::Result<impl IntoResponse> {
    user.require_admin()?;
    let queue = app.store.harness_queue_counts().await?;
    let mcp = app.store.mcp_state_counts().await?;
    let body = crate::metrics::render(&queue, &mcp);
    Ok(([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body))
}

/// Middleware on every route: counts the answer in `mira_http_requests_total` by method,
/// matched route template (`unmatched` for the fallback) and status, and runs the request in
/// a server span `{METHOD} {route}` ([`crate::telemetry`]) that continues the caller's W3C
/// `traceparent`.
pub async fn track_http(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use tracing::Instrument;
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let name = format!("{method} {route}");
    let span = tracing::info_span!(
        target: "mira::otel",
        "http_request",
        otel.name = name.as_str(),
        otel.kind = "server",
        http.request.method = method.as_str(),
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    );
    crate::telemetry::set_parent_from_headers(&span, req.headers());
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    crate::metrics::http_request(method.as_str(), &route, status, started.elapsed());
    response
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz)).routes(routes!(metrics))
}
