//! External MCP servers: install, enable/disable, connect, accept the disclaimer, discover,
//! agent access, remove — and `GET /v1/mcp/servers/{id}`, every stage with
//! `ok|blocked|pending`, its reason and the action that unblocks it.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path};
use crate::app::App;
use crate::error::Result;
use crate::mcp::stages::server_view;
use crate::mcp::{Install, Patch, ServerView, TransportInput, config};

/// Body of `POST /v1/mcp/servers`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallServer {
    /// Display name (1–128 characters).
    pub name: String,
    /// `{"stdio": {command, args, env, cwd}}` or `{"http": {url, headers}}`; env and header
    /// values are stored encrypted and never echoed. Admins may also give
    /// `{"from_env": "VAR"}` (read from the server's environment at connect time); for anyone
    /// else that is 403 `server_env_reference`.
    pub transport: TransportInput,
    /// Text the owner must accept before the server's tools are used.
    pub disclaimer: Option<String>,
    /// Start enabled (default true): connecting begins at once, in the background.
    pub enabled: Option<bool>,
    /// Deployment-wide server, visible to every user (admins only; default false).
    pub deployment_wide: Option<bool>,
    /// Agent access of tools without their own switch (default false: off until turned on).
    pub default_agent_access: Option<bool>,
    /// Timeout of every request to the server, ms (100–3600000, default 60000).
    pub request_timeout_ms: Option<i64>,
}

/// Body of `PATCH /v1/mcp/servers/{id}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchServer {
    /// Enable (connects) or disable (disconnects; projections disappear).
    pub enabled: Option<bool>,
    /// Agent access of tools without their own switch.
    pub default_agent_access: Option<bool>,
    /// Per-request timeout, ms.
    pub request_timeout_ms: Option<i64>,
}

/// Body of `PUT /v1/mcp/servers/{id}/tools/{tool_name}/agent-access`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentAccess {
    /// On or off. Survives re-discovery and reconnects. Turning it on accepts the definition
    /// listed now and ends a `definition_changed` review.
    pub enabled: bool,
    /// The fingerprint (`definition_sha256` of the tool in `GET /v1/mcp/servers/{id}`) of
    /// the definition being accepted; when given and the server lists another definition by
    /// now, 409 `definition_changed` and nothing changes.
    #[schema(min_length = 64, max_length = 64)]
    pub definition_sha256: Option<String>,
}

/// `{"servers": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ServerList {
    /// The caller's servers and the deployment-wide ones, by id.
    pub servers: Vec<ServerView>,
}

/// Installs a server.
#[utoipa::path(post, path = "/v1/mcp/servers", tag = "mcp", request_body = InstallServer,
    responses((status = 201, body = ServerView), (status = 400),
        (status = 403, description = "forbidden (deployment-wide, or a stdio command not allowed), \
            internal_address, or server_env_reference (a non-admin used from_env)")),
    security(("bearer" = [])))]
pub async fn install(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<InstallServer>,
) -> Result<(StatusCode, Json<ServerView>)> {
    if let config::TransportInput::Http(h) = &body.transport {
        app.check_fetch_url(user.is_admin, &h.url).await?;
    }
    let req = Install {
        name: body.name,
        transport: body.transport,
        disclaimer: body.disclaimer,
        enabled: body.enabled.unwrap_or(true),
        deployment_wide: body.deployment_wide.unwrap_or(false),
        default_agent_access: body.default_agent_access.unwrap_or(false),
        request_timeout_ms: body.request_timeout_ms.unwrap_or(config::DEFAULT_REQUEST_TIMEOUT_MS),
    };
    let slot = app.mcp.install(&user.user_id, user.is_admin, req).await?;
    Ok((StatusCode::CREATED, Json(view(&app, &slot, &user))))
}

/// A server's view for `user`: whole for its managers, without an admin's arguments, URL
/// tokens and the server's output for the other users of a deployment-wide server.
fn view(app: &App, slot: &crate::mcp::ServerSlot, user: &AuthUser) -> ServerView {
    server_view(&app.mcp, slot, crate::mcp::McpManager::manages(slot, &user.user_id, user.is_admin))
}

/// The caller's servers and the deployment-wide ones.
#[utoipa::path(get, path = "/v1/mcp/servers", tag = "mcp", responses((status = 200, body = ServerList)), security(("bearer" = [])))]
pub async fn list(State(app): State<App>, user: AuthUser) -> Result<Json<ServerList>> {
    let servers = app.mcp.visible(&user.user_id).iter().map(|s| view(&app, s, &user)).collect();
    Ok(Json(ServerList { servers }))
}

/// One server: every stage with `ok|blocked|pending`, reason and unblocking action, and
/// every tool it listed.
#[utoipa::path(get, path = "/v1/mcp/servers/{server_id}", tag = "mcp", params(("server_id" = String, Path)),
    responses((status = 200, body = ServerView), (status = 404)), security(("bearer" = [])))]
pub async fn get(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<ServerView>> {
    let slot = app.mcp.slot_for(&user.user_id, &id)?;
    Ok(Json(view(&app, &slot, &user)))
}

/// Enables/disables a server or changes its defaults.
#[utoipa::path(patch, path = "/v1/mcp/servers/{server_id}", tag = "mcp", params(("server_id" = String, Path)),
    request_body = PatchServer, responses((status = 200, body = ServerView), (status = 400), (status = 403), (status = 404)),
    security(("bearer" = [])))]
pub async fn patch(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<PatchServer>,
) -> Result<Json<ServerView>> {
    let p = Patch {
        enabled: body.enabled,
        default_agent_access: body.default_agent_access,
        request_timeout_ms: body.request_timeout_ms,
    };
    let slot = app.mcp.patch(&user.user_id, user.is_admin, &id, p).await?;
    Ok(Json(view(&app, &slot, &user)))
}

/// Removes a server; its projections disappear.
#[utoipa::path(delete, path = "/v1/mcp/servers/{server_id}", tag = "mcp", params(("server_id" = String, Path)),
    responses((status = 204), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn remove(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<StatusCode> {
    app.mcp.remove(&user.user_id, user.is_admin, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Connects now (resets the reconnect backoff); 202 with the stages, connect `pending`. With
/// several replicas a stdio server is connected by the replica holding it (asked through
/// this one), or taken over here when that replica is gone.
#[utoipa::path(post, path = "/v1/mcp/servers/{server_id}/connect", tag = "mcp", params(("server_id" = String, Path)),
    responses((status = 202, body = ServerView), (status = 404), (status = 409, description = "mcp_server_disabled"),
        (status = 503, description = "owner_unreachable: the replica holding the stdio server could not be asked")),
    security(("bearer" = [])))]
pub async fn connect(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<ServerView>)> {
    let slot = app.mcp.connect(&user.user_id, user.is_admin, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&app, &slot, &user))))
}

/// Accepts the server's disclaimer.
#[utoipa::path(post, path = "/v1/mcp/servers/{server_id}/disclaimer/accept", tag = "mcp", params(("server_id" = String, Path)),
    responses((status = 200, body = ServerView), (status = 404), (status = 409, description = "no_disclaimer")),
    security(("bearer" = [])))]
pub async fn accept_disclaimer(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ServerView>> {
    let slot = app.mcp.accept_disclaimer(&user.user_id, user.is_admin, &id).await?;
    Ok(Json(view(&app, &slot, &user)))
}

/// Runs `tools/list` (no sooner than 2 s after the last discovery) and returns the result.
#[utoipa::path(post, path = "/v1/mcp/servers/{server_id}/discover", tag = "mcp", params(("server_id" = String, Path)),
    responses((status = 200, body = ServerView), (status = 404),
        (status = 409, description = "mcp_not_connected or mcp_discovery_failed"),
        (status = 503, description = "owner_unreachable: the replica holding the stdio server could not be asked")),
    security(("bearer" = [])))]
pub async fn discover(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<ServerView>> {
    let slot = app.mcp.discover(&user.user_id, user.is_admin, &id).await?;
    Ok(Json(view(&app, &slot, &user)))
}

/// Turns one tool's agent access on or off.
#[utoipa::path(put, path = "/v1/mcp/servers/{server_id}/tools/{tool_name}/agent-access", tag = "mcp",
    params(("server_id" = String, Path), ("tool_name" = String, Path)), request_body = AgentAccess,
    responses((status = 200, body = ServerView), (status = 400), (status = 403), (status = 404),
        (status = 409, description = "definition_changed: the server lists another definition than definition_sha256")),
    security(("bearer" = [])))]
pub async fn agent_access(
    State(app): State<App>,
    user: AuthUser,
    Path((id, tool)): Path<(String, String)>,
    Json(body): Json<AgentAccess>,
) -> Result<Json<ServerView>> {
    let slot = app
        .mcp
        .set_agent_access(&user.user_id, user.is_admin, &id, &tool, body.enabled, body.definition_sha256.as_deref())
        .await?;
    Ok(Json(view(&app, &slot, &user)))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(install, list))
        .routes(routes!(get, patch, remove))
        .routes(routes!(connect))
        .routes(routes!(accept_disclaimer))
        .routes(routes!(discover))
        .routes(routes!(agent_access))
}
