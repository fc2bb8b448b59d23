//! `POST /v1/users` (admin) and `GET /v1/me`.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::Json;
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::{Roles, Store, UserRow};

/// Body of `POST /v1/users`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// Unique name, 1–64 characters of letters, digits, `-`, `_`, `.`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9._-]+$")]
    pub name: String,
    /// Grant admin rights.
    #[serde(default)]
    pub admin: bool,
    /// Grant the approver role: may grant (or deny) other users' four-eyes approvals.
    #[serde(default)]
    pub approver: bool,
}

/// A new user and its token (shown once; only its hash is stored).
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedUser {
    /// The user.
    pub user: UserRow,
    /// Bearer token.
    pub token: String,
}

/// Creates a user (admin only, with a token holding `manage`: the new user's token holds
/// every scope).
#[utoipa::path(post, path = "/v1/users", tag = "users", request_body = CreateUser,
    responses((status = 201, body = CreatedUser), (status = 403), (status = 409)), security(("bearer" = [])))]
pub async fn create_user(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateUser>,
) -> Result<(StatusCode, Json<CreatedUser>)> {
    user.require_admin()?;
    // The new user's first token holds every scope: making one is managing tokens.
    user.require_scope(crate::auth::Scope::Manage)?;
    let (user, token) = create(&app.store, &body.name, Roles { admin: body.admin, approver: body.approver }).await?;
    Ok((StatusCode::CREATED, Json(CreatedUser { user, token })))
}

/// Creates a user with a fresh token (shared by the API and `mira user create`).
pub async fn create(store: &Store, name: &str, roles: Roles) -> Result<(UserRow, String)> {
    let valid =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !valid {
        return Err(Error::bad_request(
            ErrorCode::InvalidName,
            "name must be 1-64 characters of letters, digits, '-', '_' or '.'",
        ));
    }
    let token = crate::auth::new_token();
    match store.create_user_with_roles(name, roles, &crate::auth::hash_token(&token)).await {
        Ok(user) => Ok((user, token)),
        Err(e) if e.is_unique_violation() => {
            Err(Error::conflict(ErrorCode::NameTaken, format!("a user named {name} exists"), serde_json::Value::Null))
        }
        Err(e) => Err(e.into()),
    }
}

/// The caller.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Me {
    /// User id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Admin.
    pub is_admin: bool,
    /// Approver: may grant other users' four-eyes approvals (admins may too).
    pub is_approver: bool,
    /// The id of the token in use.
    pub token_id: String,
    /// What the token in use may do (`plan`, `approve`, `manage`).
    #[schema(value_type = Vec<crate::auth::Scope>)]
    pub scopes: crate::auth::Scopes,
}

/// Who the token belongs to.
#[utoipa::path(get, path = "/v1/me", tag = "users", responses((status = 200, body = Me), (status = 401)), security(("bearer" = [])))]
pub async fn me(user: AuthUser) -> Json<Me> {
    Json(Me {
        id: user.user_id,
        name: user.name,
        is_admin: user.is_admin,
        is_approver: user.is_approver,
        token_id: user.token_id,
        scopes: user.scopes,
    })
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(create_user)).routes(routes!(me))
}
