//! Workspaces and devices.

use std::path::PathBuf;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::Json;
use crate::app::App;
use crate::error::{Error, Result};
use crate::store::{DeviceRow, WorkspaceRow};

/// A workspace.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WorkspaceView {
    /// `ws_…`
    pub id: String,
    /// Name.
    pub name: String,
    /// Absolute root path on its device.
    pub path: String,
    /// Device; absent = the server host.
    pub device_id: Option<String>,
    /// True for deployment-wide workspaces.
    pub shared: bool,
    /// RFC 3339.
    pub created_at: String,
}

impl From<WorkspaceRow> for WorkspaceView {
    fn from(w: WorkspaceRow) -> Self {
        Self {
            shared: w.owner_id.is_none(),
            id: w.id,
            name: w.name,
            path: w.path,
            device_id: w.device_id,
            created_at: w.created_at,
        }
    }
}

/// Body of `POST /v1/workspaces`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspace {
    /// Name.
    pub name: String,
    /// An existing folder on the server host.
    pub path: String,
}

/// `{"workspaces": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WorkspaceList {
    /// The caller's and the deployment-wide workspaces.
    pub workspaces: Vec<WorkspaceView>,
}

/// Registers a workspace: admins anywhere, others only inside the configured roots.
#[utoipa::path(post, path = "/v1/workspaces", tag = "workspaces", request_body = CreateWorkspace,
    responses((status = 201, body = WorkspaceView), (status = 400), (status = 403)), security(("bearer" = [])))]
pub async fn create_workspace(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateWorkspace>,
) -> Result<(StatusCode, Json<WorkspaceView>)> {
    if body.name.is_empty() || body.name.len() > 128 {
        return Err(Error::bad_request("invalid_name", "name must be 1-128 characters"));
    }
    let path = std::fs::canonicalize(PathBuf::from(&body.path))
        .map_err(|e| Error::bad_request("invalid_workspace_path", format!("{}: {e}", body.path)))?;
    if !path.is_dir() {
        return Err(Error::bad_request("invalid_workspace_path", format!("{} is not a directory", body.path)));
    }
    if !user.is_admin
        && !app.config.workspace_roots.iter().any(|root| std::fs::canonicalize(root).is_ok_and(|r| path.starts_with(r)))
    {
        return Err(Error::Forbidden("workspaces outside the configured roots need an admin".into()));
    }
    let row = app.store.create_workspace(&user.user_id, &body.name, &path.to_string_lossy()).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// The caller's workspaces and the deployment-wide ones.
#[utoipa::path(get, path = "/v1/workspaces", tag = "workspaces", responses((status = 200, body = WorkspaceList)), security(("bearer" = [])))]
pub async fn list_workspaces(State(app): State<App>, user: AuthUser) -> Result<Json<WorkspaceList>> {
    let rows = app.store.list_workspaces(&user.user_id).await?;
    Ok(Json(WorkspaceList { workspaces: rows.into_iter().map(Into::into).collect() }))
}

/// A device.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeviceView {
    /// `dev_…`
    pub id: String,
    /// Name.
    pub name: String,
    /// Declared capabilities (`fs.read`, `fs.write`, `pty`, `net`).
    pub capabilities: Vec<String>,
    /// Whether a runner for it is connected (none can be yet; its tools are unavailable).
    pub connected: bool,
    /// RFC 3339.
    pub created_at: String,
}

impl From<DeviceRow> for DeviceView {
    fn from(d: DeviceRow) -> Self {
        Self {
            capabilities: serde_json::from_str(&d.capabilities).unwrap_or_default(),
            id: d.id,
            name: d.name,
            connected: false,
            created_at: d.created_at,
        }
    }
}

/// Body of `POST /v1/devices`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDevice {
    /// Name.
    pub name: String,
    /// Capability strings, at most 32 of at most 64 characters.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// `{"devices": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeviceList {
    /// The caller's devices.
    pub devices: Vec<DeviceView>,
}

/// Registers a device; availability of tools on runs bound to it follows its capabilities.
#[utoipa::path(post, path = "/v1/devices", tag = "devices", request_body = CreateDevice,
    responses((status = 201, body = DeviceView), (status = 400)), security(("bearer" = [])))]
pub async fn create_device(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateDevice>,
) -> Result<(StatusCode, Json<DeviceView>)> {
    if body.name.is_empty()
        || body.name.len() > 128
        || body.capabilities.len() > 32
        || body.capabilities.iter().any(|c| c.is_empty() || c.len() > 64)
    {
        return Err(Error::bad_request(
            "invalid_request",
            "name must be 1-128 characters; at most 32 capabilities of 1-64 characters",
        ));
    }
    let row = app.store.create_device(&user.user_id, &body.name, &body.capabilities).await?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// The caller's devices.
#[utoipa::path(get, path = "/v1/devices", tag = "devices", responses((status = 200, body = DeviceList)), security(("bearer" = [])))]
pub async fn list_devices(State(app): State<App>, user: AuthUser) -> Result<Json<DeviceList>> {
    let rows = app.store.list_devices(&user.user_id).await?;
    Ok(Json(DeviceList { devices: rows.into_iter().map(Into::into).collect() }))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(create_workspace, list_workspaces)).routes(routes!(create_device, list_devices))
}
