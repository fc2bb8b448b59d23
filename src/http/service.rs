//! `/healthz`, `/readyz`, `/openapi.json`.

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
    /// `ready|lexical_only|loading|failed`.
    pub state: String,
    /// Model id, when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Why the state is not `ready`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Readiness.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Ready {
    /// `ok` or the store error.
    pub store: String,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Embedding state.
    pub embedding: EmbeddingState,
    /// Registered tools.
    pub tools_registered: usize,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// The store answers; reports the embedding model's state.
#[utoipa::path(get, path = "/readyz", tag = "service", responses((status = 200, body = Ready), (status = 503, body = Ready)))]
pub async fn readyz(State(app): State<App>) -> impl IntoResponse {
    let store = match app.store.ping().await {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("error: {e}"),
    };
    let status = if store == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let embedding = EmbeddingState {
        state: "lexical_only".into(),
        model: None,
        reason: Some(format!(
            "no embedding model is configured; exposures beyond 20 tools are ranked by {}",
            app.ranker.name()
        )),
    };
    let body =
        Ready { store, backend: app.store.backend().name(), embedding, tools_registered: app.registry.all().len() };
    (status, axum::Json(body))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz))
}
