//! `/v1/search/connections`: which web search providers a user's `web_search` asks.
//!
//! A connection names a provider (`searxng`, `brave`, `tavily`), its base URL and its
//! credential: an API key sent once and stored encrypted (never returned, never logged), or —
//! for admins — the name of a server environment variable. Deployment-wide connections come
//! from the server's settings (`MIRA_SEARXNG_URL`, `MIRA_BRAVE_API_KEY`,
//! `MIRA_TAVILY_API_KEY`), are listed to everyone as `shared`, and are read-only here.
//! `web_search` tries the caller's enabled connections oldest first, then the shared ones,
//! skipping those that failed their health check (`priority` shows the order).

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path};
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::SearchConnectionRow;
use crate::tools::search::connections::{Connection, Credential, Health};
use crate::tools::search::providers::ProviderKind;

/// Most connections one user may store.
pub const MAX_CONNECTIONS_PER_USER: i64 = 16;

/// Body of `POST /v1/search/connections`.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SearchCreateConnection)]
#[serde(deny_unknown_fields)]
pub struct CreateConnection {
    /// `searxng`, `brave` or `tavily`.
    pub provider: ProviderKind,
    /// Display name, 1–128 characters (default: the provider's name).
    pub name: Option<String>,
    /// Base URL (http or https). Required for SearXNG; defaults to the public API for Brave
    /// and Tavily.
    pub base_url: Option<String>,
    /// API key, 1–1024 characters; stored encrypted, never returned. Required for Brave and
    /// Tavily unless `api_key_env` is given.
    pub api_key: Option<String>,
    /// Admins only: the name of a server environment variable holding the key.
    pub api_key_env: Option<String>,
    /// Whether `web_search` may use it (default true).
    pub enabled: Option<bool>,
}

/// Body of `PATCH /v1/search/connections/{id}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = SearchUpdateConnection)]
#[serde(deny_unknown_fields)]
pub struct UpdateConnection {
    /// New display name.
    pub name: Option<String>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// Replace the key (stored encrypted).
    pub api_key: Option<String>,
    /// Admins only: read the key from this environment variable instead.
    pub api_key_env: Option<String>,
}

/// Where a connection's credential comes from (never the credential itself).
#[derive(Serialize, utoipa::ToSchema)]
pub struct CredentialView {
    /// `none`, `encrypted` (stored sealed), `env` (a server environment variable) or
    /// `configured` (the server's settings).
    pub kind: &'static str,
    /// The environment variable, for kind `env`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

/// A connection as the API shows it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = SearchConnectionView)]
pub struct ConnectionView {
    /// `sconn_…`, or `deployment-<provider>` for shared ones.
    pub id: String,
    /// The provider.
    pub provider: ProviderKind,
    /// Display name.
    pub name: String,
    /// Base URL.
    pub base_url: String,
    /// True for deployment-wide connections (configured by the server, read-only here).
    pub shared: bool,
    /// Whether `web_search` may use it.
    pub enabled: bool,
    /// Where the credential comes from.
    pub credential: CredentialView,
    /// Health: `unknown`, `healthy` or `unreachable`, with when and why.
    pub health: Health,
    /// 1-based place in the order `web_search` tries this user's connections (absent when
    /// disabled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<usize>,
    /// RFC 3339 (absent for shared ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

/// `{"connections": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = SearchConnectionList)]
pub struct ConnectionList {
    /// The caller's connections, then the shared ones.
    pub connections: Vec<ConnectionView>,
}

fn view(app: &App, user_id: &str, c: &Connection) -> ConnectionView {
    let priority = app.search.candidates(user_id).iter().position(|x| x.id == c.id).map(|p| p + 1);
    let env = match &c.credential {
        Credential::Env(name) => Some(name.clone()),
        _ => None,
    };
    ConnectionView {
        id: c.id.clone(),
        provider: c.provider,
        name: c.name.clone(),
        base_url: c.base_url.clone(),
        shared: c.owner_id.is_none(),
        enabled: c.enabled,
        credential: CredentialView { kind: c.credential.kind(), env },
        health: app.search.health_of(&c.id),
        priority,
        created_at: c.created_at.clone(),
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.trim().is_empty() || name.len() > 128 {
        return Err(Error::bad_request(ErrorCode::InvalidName, "name must be 1-128 characters"));
    }
    Ok(())
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > 1024 || key.chars().any(char::is_control) {
        return Err(Error::bad_request(
            ErrorCode::InvalidApiKey,
            "api_key must be 1-1024 characters without control characters",
        ));
    }
    Ok(())
}

fn check_env(user: &AuthUser, name: &str) -> Result<()> {
    if !user.is_admin {
        return Err(Error::ForbiddenCode {
            code: crate::mcp::config::SERVER_ENV_REFERENCE,
            message: "only admins may point a connection at a server environment variable; send api_key instead".into(),
        });
    }
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !valid {
        return Err(Error::bad_request(
            ErrorCode::InvalidApiKeyEnv,
            "api_key_env must be an environment variable name",
        ));
    }
    Ok(())
}

/// Seals `key` for connection `id` (kind, ciphertext, key id).
fn seal(app: &App, id: &str, key: &str) -> Result<(String, Option<String>, Option<String>)> {
    let secrets = app.search.secrets()?;
    let sealed = secrets.seal(key, id).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(("encrypted".into(), Some(sealed), Some(secrets.key_id().to_owned())))
}

/// Adds a connection for the caller, checks its health once, and returns it (without the
/// credential).
#[utoipa::path(post, path = "/v1/search/connections", tag = "search", request_body = CreateConnection,
    responses((status = 201, body = ConnectionView), (status = 400), (status = 403), (status = 409), (status = 503)),
    security(("bearer" = [])))]
pub async fn create_connection(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateConnection>,
) -> Result<(StatusCode, Json<ConnectionView>)> {
    let name = body.name.clone().unwrap_or_else(|| body.provider.as_str().to_owned());
    check_name(&name)?;
    let base_url = match (&body.base_url, body.provider.default_base_url(app.search.config())) {
        (Some(url), _) => url.trim().trim_end_matches('/').to_owned(),
        (None, Some(default)) => default.trim_end_matches('/').to_owned(),
        (None, None) => {
            return Err(Error::bad_request(
                ErrorCode::BaseUrlRequired,
                "a searxng connection needs the instance's base_url",
            ));
        }
    };
    if !crate::tools::search::text::is_http_url(&base_url) {
        return Err(Error::bad_request(ErrorCode::InvalidUrl, "base_url must be an absolute http or https URL"));
    }
    app.check_fetch_url(user.is_admin, &base_url).await?;
    if body.api_key.is_some() && body.api_key_env.is_some() {
        return Err(Error::bad_request(ErrorCode::InvalidRequest, "give api_key or api_key_env, not both"));
    }
    if let Some(key) = &body.api_key {
        check_key(key)?;
    }
    if let Some(env) = &body.api_key_env {
        check_env(&user, env)?;
    }
    if body.provider.needs_key() && body.api_key.is_none() && body.api_key_env.is_none() {
        return Err(Error::bad_request(
            ErrorCode::CredentialRequired,
            format!("a {} connection needs api_key (or, for admins, api_key_env)", body.provider.as_str()),
        ));
    }
    let id = crate::ids::new_id("sconn");
    let (kind, ciphertext, key_id, env) = match (&body.api_key, &body.api_key_env) {
        (Some(key), _) => {
            let (k, c, i) = seal(&app, &id, key)?;
            (k, c, i, None)
        }
        (None, Some(env)) => ("env".to_owned(), None, None, Some(env.clone())),
        (None, None) => ("none".to_owned(), None, None, None),
    };
    let now = crate::ids::now();
    let row = SearchConnectionRow {
        id: id.clone(),
        owner_id: user.user_id.clone(),
        provider: body.provider.as_str().to_owned(),
        name,
        base_url,
        credential_kind: kind,
        credential_ciphertext: ciphertext,
        credential_key_id: key_id,
        credential_env: env,
        enabled: body.enabled.unwrap_or(true),
        created_at: now.clone(),
        updated_at: now,
    };
    // Counted and inserted in one transaction under the user's lock: concurrent requests never
    // pass the limit together.
    if !app.store.create_search_connection(&row, MAX_CONNECTIONS_PER_USER).await? {
        return Err(Error::conflict(
            ErrorCode::ConnectionLimit,
            format!("a user may have at most {MAX_CONNECTIONS_PER_USER} search connections"),
            serde_json::Value::Null,
        ));
    }
    app.search.reload().await;
    let conn = app.search.connection_for(&user.user_id, &id).ok_or(Error::Internal("connection vanished".into()))?;
    if conn.enabled {
        app.search.check_now(&conn).await;
    }
    Ok((StatusCode::CREATED, Json(view(&app, &user.user_id, &conn))))
}

/// The caller's connections and the shared ones.
#[utoipa::path(get, path = "/v1/search/connections", tag = "search",
    responses((status = 200, body = ConnectionList)), security(("bearer" = [])))]
pub async fn list_connections(State(app): State<App>, user: AuthUser) -> Result<Json<ConnectionList>> {
    let mut all = app.search.visible(&user.user_id);
    all.sort_by_key(|c| (c.owner_id.is_none(), c.id.clone()));
    Ok(Json(ConnectionList { connections: all.iter().map(|c| view(&app, &user.user_id, c)).collect() }))
}

fn visible(app: &App, user: &AuthUser, id: &str) -> Result<Connection> {
    app.search.connection_for(&user.user_id, id).ok_or(Error::NotFound("search connection"))
}

fn own(app: &App, user: &AuthUser, id: &str) -> Result<Connection> {
    let conn = visible(app, user, id)?;
    if conn.owner_id.is_none() {
        return Err(Error::Forbidden("shared connections are configured by the server's settings".into()));
    }
    Ok(conn)
}

/// One connection.
#[utoipa::path(get, path = "/v1/search/connections/{connection_id}", tag = "search",
    params(("connection_id" = String, Path)),
    responses((status = 200, body = ConnectionView), (status = 404)), security(("bearer" = [])))]
pub async fn get_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ConnectionView>> {
    let conn = visible(&app, &user, &id)?;
    Ok(Json(view(&app, &user.user_id, &conn)))
}

/// Renames, enables/disables, or replaces the credential of one of the caller's connections.
#[utoipa::path(patch, path = "/v1/search/connections/{connection_id}", tag = "search",
    params(("connection_id" = String, Path)), request_body = UpdateConnection,
    responses((status = 200, body = ConnectionView), (status = 400), (status = 403), (status = 404)),
    security(("bearer" = [])))]
pub async fn update_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<UpdateConnection>,
) -> Result<Json<ConnectionView>> {
    own(&app, &user, &id)?;
    let mut row =
        app.store.search_connection_for(&user.user_id, &id).await?.ok_or(Error::NotFound("search connection"))?;
    if body.api_key.is_some() && body.api_key_env.is_some() {
        return Err(Error::bad_request(ErrorCode::InvalidRequest, "give api_key or api_key_env, not both"));
    }
    if let Some(name) = body.name {
        check_name(&name)?;
        row.name = name;
    }
    if let Some(enabled) = body.enabled {
        row.enabled = enabled;
    }
    if let Some(key) = &body.api_key {
        check_key(key)?;
        let (kind, ciphertext, key_id) = seal(&app, &id, key)?;
        (row.credential_kind, row.credential_ciphertext, row.credential_key_id, row.credential_env) =
            (kind, ciphertext, key_id, None);
    }
    if let Some(env) = &body.api_key_env {
        check_env(&user, env)?;
        (row.credential_kind, row.credential_ciphertext, row.credential_key_id, row.credential_env) =
            ("env".into(), None, None, Some(env.clone()));
    }
    row.updated_at = crate::ids::now();
    if !app.store.update_search_connection(&row).await? {
        return Err(Error::NotFound("search connection"));
    }
    app.search.reload().await;
    let conn = visible(&app, &user, &id)?;
    if conn.enabled && (body.api_key.is_some() || body.api_key_env.is_some() || body.enabled == Some(true)) {
        app.search.check_now(&conn).await;
    }
    Ok(Json(view(&app, &user.user_id, &conn)))
}

/// Deletes one of the caller's connections (its sealed credential with it).
#[utoipa::path(delete, path = "/v1/search/connections/{connection_id}", tag = "search",
    params(("connection_id" = String, Path)),
    responses((status = 204), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn delete_connection(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<StatusCode> {
    own(&app, &user, &id)?;
    if !app.store.delete_search_connection(&user.user_id, &id).await? {
        return Err(Error::NotFound("search connection"));
    }
    app.search.reload().await;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs the connection's health check now (no query is spent) and returns it.
#[utoipa::path(post, path = "/v1/search/connections/{connection_id}/check", tag = "search",
    params(("connection_id" = String, Path)),
    responses((status = 200, body = ConnectionView), (status = 404)), security(("bearer" = [])))]
pub async fn check_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ConnectionView>> {
    let conn = visible(&app, &user, &id)?;
    app.search.check_now(&conn).await;
    Ok(Json(view(&app, &user.user_id, &conn)))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_connection, list_connections))
        .routes(routes!(get_connection, update_connection, delete_connection))
        .routes(routes!(check_connection))
}
