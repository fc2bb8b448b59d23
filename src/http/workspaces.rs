//! Workspaces (devices are [`super::devices`]).

use std::path::{Component, PathBuf};

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
use crate::store::{MAX_HOST_WORKSPACES_PER_USER, RegistrationRefused, WorkspaceRow};
use crate::workspace::{RootChange, RootError, RootIdentity, Workspace};

/// Whether a workspace's root is still the folder that was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RootStatus {
    /// The folder at the path is the one registered.
    Ok,
    /// It is not (replaced, a symlink, moved): its tools are unavailable with
    /// `workspace_changed` until an admin re-registers it.
    Changed,
    /// The folder cannot be opened (permissions, I/O).
    Unavailable,
    /// On a device, not checked by the server.
    Remote,
}

/// The state of a workspace's root.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RootView {
    /// `ok`, `changed`, `unavailable`, `remote`.
    pub status: RootStatus,
    /// For `changed`: what changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<RootChange>,
    /// Why, when not `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the root's identity was recorded (registration or re-registration), RFC 3339.
    pub registered_at: Option<String>,
}

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
    /// Whether the root is still the folder registered.
    pub root: RootView,
}

impl From<WorkspaceRow> for WorkspaceView {
    fn from(w: WorkspaceRow) -> Self {
        let root = if w.device_id.is_some() {
            RootView {
                status: RootStatus::Remote,
                change: None,
                message: None,
                registered_at: w.root_registered_at.clone(),
            }
        } else {
            let expected = w.root_identity.as_deref().and_then(RootIdentity::parse);
            let (status, change, message) = match Workspace::open_pinned(std::path::Path::new(&w.path), expected) {
                Ok(_) => (RootStatus::Ok, None, None),
                Err(e) => {
                    let message = Some(e.to_tool_error(&w.id, &w.path).message);
                    match e {
                        RootError::Changed { change, .. } => (RootStatus::Changed, Some(change), message),
                        RootError::Unavailable(_) => (RootStatus::Unavailable, None, message),
                    }
                }
            };
            RootView { status, change, message, registered_at: w.root_registered_at.clone() }
        };
        Self {
            shared: w.owner_id.is_none(),
            id: w.id,
            name: w.name,
            path: w.path,
            device_id: w.device_id,
            created_at: w.created_at,
            root,
        }
    }
}

/// Body of `POST /v1/workspaces`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspace {
    /// Name, 1–128 bytes.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// An existing folder on the server host; with `device_id`, an absolute folder on that
    /// device (checked by its runner, which must have been given it with `--workspace`).
    pub path: String,
    /// The caller's device holding the folder (default: the server host).
    #[serde(default)]
    pub device_id: Option<String>,
}

/// `{"workspaces": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WorkspaceList {
    /// The caller's and the deployment-wide workspaces.
    pub workspaces: Vec<WorkspaceView>,
}

/// `path` with `.` and `..` resolved as text (no file-system access); None when it is
/// relative or climbs above `/`.
fn lexical(path: &str) -> Option<PathBuf> {
    let path = std::path::Path::new(path);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The one answer a non-admin gets for every path they may not register (403
/// `workspace_path_not_allowed`): a missing path, a file, a folder outside the roots, a root
/// itself, a folder they cannot read — all alike, so the answer says nothing about the path.
fn not_allowed(path: &str) -> Error {
    Error::ForbiddenCode {
        code: ErrorCode::WorkspacePathNotAllowed,
        message: format!(
            "workspace path {path:?} is not allowed: users other than admins may register only an existing folder \
             inside one of the workspace roots this server allows (not a root itself)"
        ),
    }
}

/// The canonical folder and its root identity a non-admin may register at `raw`, or the
/// single refusal: the path must lie strictly inside a configured root as text first
/// (nothing outside the roots is even looked at), then as resolved (symlinks followed), be a
/// folder and contain no root (a root is where every user's folders are), and the folder
/// opened must be the one at the resolved path ([`crate::workspace::open_root`]: a folder on
/// the way swapped for a symlink meanwhile is refused). Whether it overlaps another user's
/// workspace is checked when it is stored ([`crate::store::Store::create_workspace`]).
fn user_path(app: &App, raw: &str) -> Result<(PathBuf, RootIdentity)> {
    let roots: Vec<PathBuf> =
        app.config.workspace_roots.iter().filter_map(|root| std::fs::canonicalize(root).ok()).collect();
    let inside_roots = |p: &std::path::Path| roots.iter().any(|r| p.starts_with(r) && p != r);
    let holds_a_root = |p: &std::path::Path| roots.iter().any(|r| r.starts_with(p));
    let text = lexical(raw).ok_or_else(|| not_allowed(raw))?;
    if !inside_roots(&text) {
        return Err(not_allowed(raw));
    }
    let path = std::fs::canonicalize(&text).map_err(|_| not_allowed(raw))?;
    if !inside_roots(&path) || holds_a_root(&path) || !path.is_dir() {
        return Err(not_allowed(raw));
    }
    let (_, identity) = crate::workspace::open_root(&path).map_err(|_| not_allowed(raw))?;
    Ok((path, identity))
}

/// The canonical folder at `raw` and its root identity, for an admin: precise errors
/// (400 `invalid_workspace_path`).
fn admin_path(raw: &str) -> Result<(PathBuf, RootIdentity)> {
    let path = std::fs::canonicalize(PathBuf::from(raw))
        .map_err(|e| Error::bad_request(ErrorCode::InvalidWorkspacePath, format!("{raw}: {e}")))?;
    if !path.is_dir() {
        return Err(Error::bad_request(ErrorCode::InvalidWorkspacePath, format!("{raw} is not a directory")));
    }
    let (_, identity) = crate::workspace::open_root(&path).map_err(|e| {
        Error::bad_request(ErrorCode::InvalidWorkspacePath, format!("{raw}: the folder cannot be opened: {e:?}"))
    })?;
    Ok((path, identity))
}

/// Registers a workspace: admins anywhere (precise 400 `invalid_workspace_path` errors),
/// others only an existing folder inside the configured roots (not a root itself), with one
/// answer (403 `workspace_path_not_allowed`) for every other path, and 409
/// `workspace_path_taken` for a folder that is, contains or lies inside another user's
/// workspace. The root folder's identity (device, inode) is recorded: if another folder later
/// takes its path, its tools stop (`workspace_changed`) until an admin re-registers it. With
/// `device_id`, the folder is on that device of the caller (404 `not_found` when the caller
/// has no such device).
#[utoipa::path(post, path = "/v1/workspaces", tag = "workspaces", request_body = CreateWorkspace,
    responses((status = 201, body = WorkspaceView), (status = 400), (status = 403), (status = 404), (status = 409)), security(("bearer" = [])))]
pub async fn create_workspace(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateWorkspace>,
) -> Result<(StatusCode, Json<WorkspaceView>)> {
    if body.name.is_empty() || body.name.len() > 128 {
        return Err(Error::bad_request(ErrorCode::InvalidName, "name must be 1-128 characters"));
    }
    if let Some(device) = body.device_id.as_deref().filter(|d| *d != crate::availability::LOCAL_DEVICE_ID) {
        app.store.device_for(&user.user_id, device).await?.ok_or(Error::NotFound("device"))?;
        let path = lexical(&body.path).filter(|p| p.as_os_str() == body.path.as_str()).ok_or_else(|| {
            Error::bad_request(ErrorCode::InvalidWorkspacePath, "a device folder must be an absolute, normalised path")
        })?;
        let row = app.store.create_device_workspace(&user.user_id, &body.name, &path.to_string_lossy(), device).await?;
        return Ok((StatusCode::CREATED, Json(row.into())));
    }
    let (path, identity) = if user.is_admin { admin_path(&body.path)? } else { user_path(&app, &body.path)? };
    let row = app
        .store
        .create_workspace(&user.user_id, &body.name, &path.to_string_lossy(), &identity.encode(), !user.is_admin)
        .await?
        .map_err(|refused| match refused {
            RegistrationRefused::AtLimit => Error::conflict(
                ErrorCode::WorkspaceLimit,
                format!("you already hold {MAX_HOST_WORKSPACES_PER_USER} workspaces on this server, the most a user may register; use one of them"),
                serde_json::json!({"limit": MAX_HOST_WORKSPACES_PER_USER}),
            ),
            RegistrationRefused::Overlaps => Error::conflict(
                ErrorCode::WorkspacePathTaken,
                format!(
                    "workspace path {:?} is, contains or lies inside another user's workspace or a \
                     deployment-wide one; users other than admins may register only a folder no other \
                     user's workspace and no deployment-wide workspace overlaps",
                    body.path
                ),
                serde_json::json!({"path": body.path}),
            ),
        })?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// Re-registers a workspace whose root changed (admin only): records the identity of the
/// folder now at its path, which must be a real folder (not a symlink). Its tools work
/// again; calls frozen before this are refused (`workspace_changed`) rather than run in the
/// new folder. 403 for non-admins, 404 for an unknown workspace.
#[utoipa::path(post, path = "/v1/workspaces/{workspace_id}/reregister", tag = "workspaces",
    params(("workspace_id" = String, Path)),
    responses((status = 200, body = WorkspaceView), (status = 400), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn reregister_workspace(
    State(app): State<App>,
    user: AuthUser,
    Path(workspace_id): Path<String>,
) -> Result<Json<WorkspaceView>> {
    if !user.is_admin {
        return Err(Error::Forbidden("re-registering a workspace needs an admin".into()));
    }
    let row = app.store.workspace_by_id(&workspace_id).await?.ok_or(Error::NotFound("workspace"))?;
    if row.device_id.is_some() {
        return Err(Error::bad_request(
            ErrorCode::InvalidWorkspacePath,
            "the workspace is on a device, not on this host",
        ));
    }
    let canonical = std::fs::canonicalize(&row.path)
        .map_err(|e| Error::bad_request(ErrorCode::InvalidWorkspacePath, format!("{}: {e}", row.path)))?;
    if canonical != std::path::Path::new(&row.path) {
        return Err(Error::bad_request(
            ErrorCode::InvalidWorkspacePath,
            format!(
                "{} now leads to {} (a symlink on the way); register a new workspace at the real folder instead",
                row.path,
                canonical.display()
            ),
        ));
    }
    let (_, identity) = admin_path(&row.path)?;
    let row = app.store.record_root_identity(&row.id, &identity.encode()).await?.ok_or(Error::NotFound("workspace"))?;
    tracing::info!(workspace = %row.id, path = %row.path, identity = %identity.encode(), by = %user.user_id, "workspace re-registered");
    Ok(Json(row.into()))
}

/// The caller's workspaces and the deployment-wide ones.
#[utoipa::path(get, path = "/v1/workspaces", tag = "workspaces", responses((status = 200, body = WorkspaceList)), security(("bearer" = [])))]
pub async fn list_workspaces(State(app): State<App>, user: AuthUser) -> Result<Json<WorkspaceList>> {
    let rows = app.store.list_workspaces(&user.user_id).await?;
    Ok(Json(WorkspaceList { workspaces: rows.into_iter().map(Into::into).collect() }))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(create_workspace, list_workspaces)).routes(routes!(reregister_workspace))
}
