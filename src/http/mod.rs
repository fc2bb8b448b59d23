//! HTTP: the API of `docs/api.md`, one module per resource, each exposing a
//! `router()`; this module merges them, adds the layers (body limit, timeout, tracing) and
//! assembles the OpenAPI document from the handlers' annotations.

pub mod approvals;
pub mod auth;
pub mod bundle;
pub mod cluster;
pub mod connections;
pub mod devices;
pub mod error;
pub mod events;
pub mod evidence;
pub mod inbox;
pub mod invocations;
pub mod limits;
pub mod mcp;
pub mod news;
pub mod runs;
pub mod search;
pub mod service;
pub mod skills;
pub mod storable;
pub mod terminal;
pub mod tokens;
pub mod tools;
pub mod users;
pub mod web;
pub mod workspaces;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use serde::Deserialize;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::ids;

/// Pagination query: `?limit=&cursor=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// Page size, 1–200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[a-z]+_[0-9a-f]{32}$")]
    pub cursor: Option<String>,
}

impl Page {
    /// The page size, or 400 `invalid_query` (also for a cursor that is no list's
    /// `next_cursor`: every cursor is an id, `<prefix>_<32 hex digits>`).
    pub fn limit(&self) -> Result<i64> {
        if let Some(cursor) = &self.cursor
            && !cursor.split_once('_').is_some_and(|(prefix, _)| {
                !prefix.is_empty()
                    && prefix.bytes().all(|b| b.is_ascii_lowercase())
                    && ids::is_well_formed(cursor, prefix)
            })
        {
            return Err(Error::bad_request(
                ErrorCode::InvalidQuery,
                "cursor must be the next_cursor of a previous page of this list",
            ));
        }
        match self.limit {
            None => Ok(50),
            Some(n) if (1..=200).contains(&n) => Ok(n),
            Some(n) => Err(Error::bad_request(ErrorCode::InvalidQuery, format!("limit must be 1-200, not {n}"))),
        }
    }

    /// The next cursor of a page read under a byte budget: its last row's key when rows follow.
    pub fn next_cursor<T>(page: &crate::store::Paged<T>, key: impl Fn(&T) -> String) -> Option<String> {
        if page.more { page.rows.last().map(key) } else { None }
    }

    /// Splits a `limit + 1` fetch into the page and the next cursor.
    pub fn split<T>(mut rows: Vec<T>, limit: i64, key: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
        let limit = usize::try_from(limit).unwrap_or(50);
        if rows.len() > limit {
            rows.truncate(limit);
            let next = rows.last().map(key);
            (rows, next)
        } else {
            (rows, None)
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Mira Tool Runtime", description = "The tool control plane between an agent Planner and every tool: registry, public surface, availability, exposure, frozen invocations, exact-invocation approval, harness execution and evidence."),
    modifiers(&BearerAuth),
    components(schemas(error::ErrorResponse, error::ErrorBody)),
    tags(
        (name = "service"), (name = "users"), (name = "workspaces"), (name = "devices"), (name = "tools"),
        (name = "runs"), (name = "skills"), (name = "invocations"), (name = "approvals"), (name = "evidence"), (name = "events"), (name = "mcp"),
        (name = "search"), (name = "news"), (name = "terminal"), (name = "connections"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API routes with their OpenAPI document, before layers and state.
fn api() -> OpenApiRouter<App> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(service::router())
        .merge(cluster::router())
        .merge(users::router())
        .merge(tokens::router())
        .merge(workspaces::router())
        .merge(devices::router())
        .merge(tools::router())
        .merge(runs::router())
        .merge(skills::router())
        .merge(bundle::router())
        .merge(invocations::router())
        .merge(approvals::router())
        .merge(evidence::router())
        .merge(mcp::router())
        .merge(search::router())
        .merge(news::router())
        .merge(terminal::router())
        .merge(connections::router())
}

/// The streaming routes (Server-Sent Events), outside the request timeout.
fn streams() -> OpenApiRouter<App> {
    OpenApiRouter::new().merge(events::router()).merge(inbox::router()).merge(terminal::stream_router())
}

/// The OpenAPI document (also committed as `openapi/openapi.json`), with the answers every
/// operation can give added by [`document_common_answers`].
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = api().merge(streams()).split_for_parts();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let Ok(mut value) = serde_json::to_value(&doc) else { return doc };
    document_common_answers(&mut value);
    serde_json::from_value(value).unwrap_or(doc)
}

/// Documents, on every operation, the answers that come from the shared machinery rather
/// than from its handler, so the document lists every status the server gives:
/// 400 when it has path/query parameters or a body (the extractors), 401 when it needs a
/// token, 413 and 415 when it takes a body, 429 on event streams (the stream cap), 503 on
/// every operation (`store_unavailable`, `request_timeout`). Every error answer gets the
/// [`error::ErrorResponse`] body.
fn document_common_answers(doc: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}});
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for op in item.values_mut() {
            let has_params = op["parameters"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["in"] == "path" || p["in"] == "query"));
            let has_body = op.get("requestBody").is_some();
            let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
            let stream = op.pointer("/responses/200/content/text~1event-stream").is_some();
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else { continue };
            let mut add = |status: &str, description: &str| {
                responses.entry(status.to_owned()).or_insert_with(|| json!({"description": description}));
            };
            if has_params || has_body {
                add(
                    "400",
                    "invalid_query, invalid_path_parameter, invalid_json or invalid_request (a malformed parameter or body, or text containing NUL)",
                );
            }
            if secured {
                add("401", "unauthorized: a valid bearer token is required");
            }
            if has_body {
                add("413", "body_too_large");
                add("415", "unsupported_media_type: the body is not application/json");
            }
            if stream {
                add("429", "too_many_streams: the caller has the most event streams open that a user may");
            }
            add("503", "store_unavailable, or request_timeout");
            for (status, response) in responses.iter_mut() {
                if status.starts_with('4') || status.starts_with('5') {
                    response["content"] = error.clone();
                }
            }
        }
    }
}

/// The whole HTTP application. Streaming routes are outside the request timeout; the
/// control-plane page ([`web`]) is served at `/` beside the API; `extra` (the MCP server's
/// `/mcp`, [`crate::mcp_server::router`], which builds on this module) is merged beside them,
/// outside the request timeout and inside the shared layers.
pub fn router(app: App, extra: Router<App>, body_limit: usize, request_timeout: Duration) -> Router {
    // Serialised once and shared: axum clones the route tree for every connection, so a
    // handler that owned the document deep-copied it per connection (1.4 MB each).
    let doc = axum::body::Bytes::from(serde_json::to_vec(&openapi()).unwrap_or_default());
    let (api, _) = api().split_for_parts();
    let (streams, _) = streams().split_for_parts();
    let api = api
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = doc.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], doc) }
            }),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                match tokio::time::timeout(request_timeout, next.run(req)).await {
                    Ok(response) => response,
                    Err(_) => Error::Unavailable {
                        code: ErrorCode::RequestTimeout,
                        message: format!("the request took longer than {} s", request_timeout.as_secs()),
                    }
                    .into_response(),
                }
            },
        ));
    let streams = streams.layer(axum::middleware::from_fn_with_state(app.clone(), limits::stream_slot));
    // The runner's and the replicas' routes are outside the request timeout (a runner's
    // connect answers its job stream; a forwarded execution lasts as long as the tool), but
    // their request bodies must arrive within it.
    let bodies_in_time = axum::middleware::from_fn_with_state(request_timeout, body_within);
    api.merge(streams)
        .merge(extra)
        .merge(cluster::internal_router().layer(bodies_in_time.clone()))
        .merge(devices::runner_router().layer(bodies_in_time))
        .merge(web::router())
        .fallback(|| async { Error::NotFound("route") })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .layer(axum::middleware::from_fn(service::track_http))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TraceLayer::new_for_http())
        .with_state(app)
}

/// Middleware of routes served outside the request timeout whose handlers read a whole body
/// (the runner's `/v1/runner/*`, the replicas' `/internal/*`): the body must have arrived
/// within `limit` (`--request-timeout-secs`) of the request's start, else the answer is 503
/// `request_timeout` — a body trickled in a byte at a time cannot hold a connection longer
/// than any request. Only the body's reading is bounded: the answer (a runner's job stream,
/// a forwarded execution) takes as long as it takes. Each route's own body limit still
/// applies (its extractor reads the body).
async fn body_within(
    axum::extract::State(limit): axum::extract::State<Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let deadline = tokio::time::Instant::now() + limit;
    let late = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let flag = Arc::clone(&late);
    let body = futures::stream::unfold(Some(body.into_data_stream()), move |rest| {
        let flag = Arc::clone(&flag);
        async move {
            let mut rest = rest?;
            match tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut rest)).await {
                Ok(Some(chunk)) => Some((chunk, Some(rest))),
                Ok(None) => None,
                Err(_) => {
                    flag.store(true, Ordering::Release);
                    Some((Err(axum::Error::new("the request body did not arrive in time")), None))
                }
            }
        }
    });
    let response = next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(body))).await;
    if late.load(Ordering::Acquire) {
        return Error::Unavailable {
            code: ErrorCode::RequestTimeout,
            message: format!("the request body took longer than {} s to arrive", limit.as_secs()),
        }
        .into_response();
    }
    response
}
