//! `/v1/connections`: the caller's accounts of the dynamic capabilities (GitHub, mail), which
//! make their tools available ([`crate::connections`]).
//!
//! A connection has a `kind`, a display name, the kind's non-secret `settings` and a
//! `credential` object, sealed at once and never returned, logged or echoed in an error.
//! Admins may add `shared` connections that every user can use (each user's own come first).
//! Every create, credential change or `POST …/check` runs a live check; the server re-checks
//! every enabled connection periodically. For non-admins every address the connection reaches
//! must be public (`internal_address` otherwise), like every other user-given URL.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path};
use crate::app::App;
use crate::connections::{Access, Connection, ConnectionKind};
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::ConnectionRow;

/// Most connections one user may own.
pub const MAX_CONNECTIONS_PER_USER: i64 = 16;

/// Largest `settings` or `credential` object, in bytes of JSON.
pub const MAX_OBJECT_BYTES: usize = 16 * 1024;

/// Body of `POST /v1/connections`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConnection {
    /// `github`, `mail`, `expert` or `browser`.
    pub kind: ConnectionKind,
    /// Display name, 1–128 characters (default: the kind).
    pub name: Option<String>,
    /// The kind's settings (docs/api.md, Connections), at most 16 KiB of JSON.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub settings: Value,
    /// The credential object (a token, a password…), at most 16 KiB of JSON; stored sealed,
    /// never returned.
    #[schema(value_type = Object)]
    pub credential: Value,
    /// Admins only: usable by every user.
    #[serde(default)]
    pub shared: bool,
    /// Whether tools may use it (default true).
    pub enabled: Option<bool>,
}

/// Body of `PATCH /v1/connections/{id}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateConnection {
    /// New display name.
    pub name: Option<String>,
    /// Replace the settings (validated like at creation).
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
    /// Replace the credential (sealed; the connection is checked again).
    #[schema(value_type = Option<Object>)]
    pub credential: Option<Value>,
    /// Enable or disable.
    pub enabled: Option<bool>,
}

/// A connection's overall state, summarising its last check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionState {
    /// Disabled by its owner.
    Disabled,
    /// Not checked yet.
    Unchecked,
    /// A rate limit holds (see `rate_limited_until`).
    RateLimited,
    /// The credential was refused.
    ReauthRequired,
    /// The server cannot be reached at all.
    Unreachable,
    /// Some parts cannot be reached (mail: IMAP up, SMTP down).
    Degraded,
    /// Reachable and accepted, but some permissions are missing or unverifiable.
    Limited,
    /// Every permission is granted.
    Ready,
}

fn state_of(c: &Connection) -> ConnectionState {
    if !c.enabled {
        return ConnectionState::Disabled;
    }
    let Some(report) = &c.report else { return ConnectionState::Unchecked };
    if c.rate_limited_until.as_deref().is_some_and(|u| u > crate::ids::now().as_str()) {
        return ConnectionState::RateLimited;
    }
    let count = |f: fn(&Access) -> bool| report.access.values().filter(|a| f(a)).count();
    let unreachable = count(|a| matches!(a, Access::Unreachable { .. } | Access::BrowserGone { .. }));
    if count(|a| matches!(a, Access::ReauthRequired { .. })) > 0 {
        ConnectionState::ReauthRequired
    } else if report.access.is_empty() || unreachable == report.access.len() {
        ConnectionState::Unreachable
    } else if unreachable > 0 {
        ConnectionState::Degraded
    } else if count(|a| matches!(a, Access::Granted)) == report.access.len() {
        ConnectionState::Ready
    } else {
        ConnectionState::Limited
    }
}

/// One permission of a connection.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PermissionView {
    /// What the permission allows.
    pub description: &'static str,
    /// What the last check (or a later call) found; absent when never checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access: Option<Access>,
}

/// What one tool needs of the connection, and whether this connection serves it now.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ToolNeedView {
    /// The tool.
    pub tool_id: String,
    /// The permission it needs.
    pub permission: String,
    /// True when a call could use this connection now.
    pub usable: bool,
    /// Why not (a ladder reason: `scope_missing`, `reauth_required`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Why not, as a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A connection as the API shows it (never its credential).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ConnectionView {
    /// `conn_…`
    pub id: String,
    /// The kind.
    pub kind: ConnectionKind,
    /// Display name.
    pub name: String,
    /// True for a shared connection (an admin's, usable by every user).
    pub shared: bool,
    /// True when the caller may change or delete it.
    pub editable: bool,
    /// Whether tools may use it.
    pub enabled: bool,
    /// The kind's settings.
    #[schema(value_type = Object)]
    pub settings: Value,
    /// Summary of the last check.
    pub state: ConnectionState,
    /// Who the credential is for (from the last check).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// When the last check ran (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
    /// The last problem found, as a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// End of a rate limit (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limited_until: Option<String>,
    /// Every permission of the kind with what was found.
    pub permissions: BTreeMap<String, PermissionView>,
    /// Every tool of the kind: what it needs and whether this connection serves it now.
    pub tools: Vec<ToolNeedView>,
    /// What the far side offers to grant (an attached browser: its open page tabs
    /// `[{target_id, url, title, granted}]`), from the last check; owners only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub inventory: Option<Value>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// `{"connections": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ConnectionList {
    /// The caller's connections (oldest first), then the shared ones.
    pub connections: Vec<ConnectionView>,
}

fn view(app: &App, user: &AuthUser, c: &Connection) -> ConnectionView {
    let descriptions: &[(&str, &str)] = app.connections.driver(c.kind).map_or(&[], |d| d.permissions());
    let permissions = descriptions
        .iter()
        .map(|(name, description)| {
            let access = c.report.as_ref().and_then(|r| r.access.get(*name)).cloned();
            ((*name).to_owned(), PermissionView { description, access })
        })
        .collect();
    let tools = app
        .connections
        .needs(c.kind)
        .into_iter()
        .map(|need| {
            let usable = c.usable(need.permission);
            let (code, message) = match usable.clone() {
                Ok(()) => (None, None),
                Err((code, message)) => (Some(code), Some(message)),
            };
            ToolNeedView {
                tool_id: need.tool_id,
                permission: need.permission.to_owned(),
                usable: usable.is_ok(),
                code,
                message,
            }
        })
        .collect();
    let last_error = c.report.as_ref().and_then(|r| {
        r.access.values().find_map(|a| match a {
            Access::ReauthRequired { message }
            | Access::Unreachable { message }
            | Access::Unknown { message }
            | Access::CardChanged { message }
            | Access::BrowserGone { message } => Some(message.clone()),
            Access::Granted | Access::Missing { .. } => None,
        })
    });
    ConnectionView {
        id: c.id.clone(),
        kind: c.kind,
        name: c.name.clone(),
        shared: c.owner_id.is_none(),
        editable: may_edit(user, c),
        enabled: c.enabled,
        settings: c.settings.clone(),
        state: state_of(c),
        account: c.report.as_ref().and_then(|r| r.account.clone()),
        checked_at: c.checked_at.clone(),
        last_error,
        rate_limited_until: c.rate_limited_until.clone(),
        permissions,
        tools,
        inventory: c
            .report
            .as_ref()
            .and_then(|r| r.inventory.clone())
            .filter(|_| c.owner_id.as_deref() == Some(user.user_id.as_str())),
        created_at: c.created_at.clone(),
        updated_at: c.updated_at.clone(),
    }
}

fn may_edit(user: &AuthUser, c: &Connection) -> bool {
    match &c.owner_id {
        Some(owner) => *owner == user.user_id,
        None => user.is_admin,
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.trim().is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
        return Err(Error::bad_request(
            ErrorCode::InvalidName,
            "name must be 1-128 characters without control characters",
        ));
    }
    Ok(())
}

fn check_object(field: &str, value: &Value) -> Result<()> {
    if !value.is_object() {
        return Err(Error::bad_request(ErrorCode::InvalidRequest, format!("{field} must be a JSON object")));
    }
    if serde_json::to_vec(value).map_or(usize::MAX, |v| v.len()) > MAX_OBJECT_BYTES {
        return Err(Error::bad_request(
            ErrorCode::InvalidRequest,
            format!("{field} must be at most {MAX_OBJECT_BYTES} bytes of JSON"),
        ));
    }
    Ok(())
}

/// Validates `settings` with the kind's driver and, for non-admins, that every address it
/// reaches is public (and, for mail, that it is encrypted: 400 `invalid_field` for `tls:
/// none`). Returns the canonical settings.
async fn validated_settings(app: &App, user: &AuthUser, kind: ConnectionKind, settings: Value) -> Result<Value> {
    let driver = app.connections.driver(kind).ok_or_else(|| {
        Error::bad_request(ErrorCode::InvalidRequest, format!("this server has no {} connections", kind.as_str()))
    })?;
    let settings = if settings.is_null() { Value::Object(serde_json::Map::new()) } else { settings };
    check_object("settings", &settings)?;
    let settings = driver.validate_settings(settings)?;
    for url in driver.endpoints(&settings) {
        app.check_fetch_url(user.is_admin, &url).await?;
    }
    // A browser reached through a device's runner: the caller's own device only (admins too).
    if kind == ConnectionKind::Browser
        && let Some(device) =
            settings["endpoint"].as_str().and_then(|e| e.strip_prefix(crate::tools::browser::attached::DEVICE_PREFIX))
        && app.store.device_for(&user.user_id, device).await?.is_none()
    {
        return Err(Error::NotFound("device"));
    }
    if kind == ConnectionKind::Mail && !user.is_admin && !app.config.allow_internal_urls {
        crate::tools::mail::refuse_plaintext_settings(&settings)?;
    }
    Ok(settings)
}

/// Validates and seals `credential` for connection `id` (sealed text, key id).
fn sealed_credential(app: &App, kind: ConnectionKind, id: &str, credential: &Value) -> Result<(String, String)> {
    check_object("credential", credential)?;
    let driver = app.connections.driver(kind).ok_or_else(|| {
        Error::bad_request(ErrorCode::InvalidRequest, format!("this server has no {} connections", kind.as_str()))
    })?;
    driver.validate_credential(credential)?;
    let secrets = app.connections.secrets()?;
    let plain = serde_json::to_string(credential).map_err(|e| Error::Internal(e.to_string()))?;
    let sealed = secrets.seal(&plain, id).map_err(|e| Error::Internal(e.to_string()))?;
    Ok((sealed, secrets.key_id().to_owned()))
}

async fn check_and_view(app: &App, user: &AuthUser, id: &str) -> Result<ConnectionView> {
    app.connections.reload().await;
    let conn = visible(app, user, id)?;
    if conn.enabled {
        app.connections.check(&conn).await;
    }
    let conn = visible(app, user, id)?;
    Ok(view(app, user, &conn))
}

/// Adds a connection (the caller's, or for admins a shared one), checks it once, and returns
/// it without its credential.
#[utoipa::path(post, path = "/v1/connections", tag = "connections", request_body = CreateConnection,
    responses((status = 201, body = ConnectionView), (status = 400), (status = 403), (status = 409), (status = 503)),
    security(("bearer" = [])))]
pub async fn create_connection(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateConnection>,
) -> Result<(StatusCode, Json<ConnectionView>)> {
    let name = body.name.clone().unwrap_or_else(|| body.kind.as_str().to_owned());
    check_name(&name)?;
    if body.shared && !user.is_admin {
        return Err(Error::Forbidden("only admins may add shared connections".into()));
    }
    if body.shared && body.kind == ConnectionKind::Browser {
        return Err(Error::bad_request(
            ErrorCode::InvalidRequest,
            "an attached browser is its user's own and cannot be shared",
        ));
    }
    let settings = validated_settings(&app, &user, body.kind, body.settings).await?;
    let id = crate::ids::new_id("conn");
    let (sealed, key_id) = sealed_credential(&app, body.kind, &id, &body.credential)?;
    let owner_id = (!body.shared).then(|| user.user_id.clone());
    let now = crate::ids::now();
    let row = ConnectionRow {
        id: id.clone(),
        owner_id,
        kind: body.kind.as_str().to_owned(),
        name,
        settings_json: settings.to_string(),
        credential_ciphertext: sealed,
        credential_key_id: key_id,
        enabled: body.enabled.unwrap_or(true),
        check_json: None,
        checked_at: None,
        next_check_at: app.connections.next_check_at(),
        rate_limited_until: None,
        created_at: now.clone(),
        updated_at: now,
    };
    // Counted and inserted in one transaction under the user's lock: concurrent requests
    // never pass the limit together.
    if !app.store.create_connection(&row, MAX_CONNECTIONS_PER_USER).await? {
        return Err(Error::conflict(
            ErrorCode::ConnectionLimit,
            format!("a user may have at most {MAX_CONNECTIONS_PER_USER} connections"),
            Value::Null,
        ));
    }
    Ok((StatusCode::CREATED, Json(check_and_view(&app, &user, &id).await?)))
}

/// The caller's connections, then the shared ones.
#[utoipa::path(get, path = "/v1/connections", tag = "connections",
    responses((status = 200, body = ConnectionList)), security(("bearer" = [])))]
pub async fn list_connections(State(app): State<App>, user: AuthUser) -> Result<Json<ConnectionList>> {
    let all = app.connections.visible(&user.user_id);
    Ok(Json(ConnectionList { connections: all.iter().map(|c| view(&app, &user, c)).collect() }))
}

fn visible(app: &App, user: &AuthUser, id: &str) -> Result<Connection> {
    app.connections.connection_for(&user.user_id, id).ok_or(Error::NotFound("connection"))
}

fn editable(app: &App, user: &AuthUser, id: &str) -> Result<Connection> {
    let conn = visible(app, user, id)?;
    if !may_edit(user, &conn) {
        return Err(Error::Forbidden("only an admin may change a shared connection".into()));
    }
    Ok(conn)
}

/// One connection.
#[utoipa::path(get, path = "/v1/connections/{connection_id}", tag = "connections",
    params(("connection_id" = String, Path)),
    responses((status = 200, body = ConnectionView), (status = 404)), security(("bearer" = [])))]
pub async fn get_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ConnectionView>> {
    let conn = visible(&app, &user, &id)?;
    Ok(Json(view(&app, &user, &conn)))
}

/// Renames, enables/disables, or replaces the settings or credential of a connection the
/// caller may edit; a changed connection is checked again.
#[utoipa::path(patch, path = "/v1/connections/{connection_id}", tag = "connections",
    params(("connection_id" = String, Path)), request_body = UpdateConnection,
    responses((status = 200, body = ConnectionView), (status = 400), (status = 403), (status = 404)),
    security(("bearer" = [])))]
pub async fn update_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<UpdateConnection>,
) -> Result<Json<ConnectionView>> {
    editable(&app, &user, &id)?;
    let mut row = app.store.connection(&id).await?.ok_or(Error::NotFound("connection"))?;
    let kind = ConnectionKind::parse(&row.kind).ok_or(Error::NotFound("connection"))?;
    if let Some(name) = body.name {
        check_name(&name)?;
        row.name = name;
    }
    let changed = body.settings.is_some() || body.credential.is_some() || body.enabled == Some(true);
    if let Some(settings) = body.settings {
        row.settings_json = validated_settings(&app, &user, kind, settings).await?.to_string();
    }
    if let Some(credential) = &body.credential {
        (row.credential_ciphertext, row.credential_key_id) = sealed_credential(&app, kind, &id, credential)?;
    }
    if let Some(enabled) = body.enabled {
        row.enabled = enabled;
    }
    if changed {
        (row.check_json, row.checked_at, row.rate_limited_until) = (None, None, None);
        row.next_check_at = app.connections.next_check_at();
    }
    row.updated_at = crate::ids::now();
    if !app.store.update_connection(&row).await? {
        return Err(Error::NotFound("connection"));
    }
    if changed {
        return Ok(Json(check_and_view(&app, &user, &id).await?));
    }
    app.connections.reload().await;
    let conn = visible(&app, &user, &id)?;
    Ok(Json(view(&app, &user, &conn)))
}

/// Deletes a connection the caller may edit (its sealed credential with it); its tools turn
/// unavailable unless another connection serves them.
#[utoipa::path(delete, path = "/v1/connections/{connection_id}", tag = "connections",
    params(("connection_id" = String, Path)),
    responses((status = 204), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn delete_connection(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<StatusCode> {
    editable(&app, &user, &id)?;
    if !app.store.delete_connection(&id).await? {
        return Err(Error::NotFound("connection"));
    }
    app.connections.reload().await;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs the check of a connection the caller may edit now and returns it (a check already
/// running for it is not doubled: this answers its report). Users of a shared connection
/// cannot force its checks (each spends the owner's API quota): the periodic check serves
/// them.
#[utoipa::path(post, path = "/v1/connections/{connection_id}/check", tag = "connections",
    params(("connection_id" = String, Path)),
    responses((status = 200, body = ConnectionView), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn check_connection(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ConnectionView>> {
    editable(&app, &user, &id)?;
    Ok(Json(check_and_view(&app, &user, &id).await?))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_connection, list_connections))
        .routes(routes!(get_connection, update_connection, delete_connection))
        .routes(routes!(check_connection))
}
