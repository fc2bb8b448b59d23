//! A user's bearer tokens: `GET /v1/tokens` (list, never the secret), `POST /v1/tokens`
//! (another token, its secret shown once), `POST /v1/tokens/{token_id}/revoke`.
//!
//! A user sees and revokes only their own tokens: another user's token id is 404, as an
//! unknown one (its existence is not told). Admins may list (`?user_id=`) and revoke any
//! user's. A revocation takes effect at once on the replica that made it and within
//! [`crate::store::cache::IDENTITY_TTL`] on the others.
//!
//! Scopes ([`crate::auth::Scope`]): making a token, and revoking a token other than the one
//! in use, need `manage`; a new token holds the scopes asked for, never one its maker's token
//! lacks, and is revoked with its maker (and so are the tokens it makes). Any token may
//! revoke itself, so a leaked token can always be ended with itself.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::auth::{Scope, Scopes};
use crate::error::{Error, ErrorCode, Result};
use crate::store::TokenRow;

/// Most tokens a user may hold that are not revoked; one more is 409 `token_limit`.
pub const MAX_ACTIVE_TOKENS: i64 = 50;

/// Query of `GET /v1/tokens`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TokenQuery {
    /// Admins only: list this user's tokens instead of the caller's (403 `forbidden` for
    /// anyone else naming another user).
    #[param(pattern = r"^usr_[0-9a-f]{32}$")]
    pub user_id: Option<String>,
}

/// `{"tokens": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenList {
    /// The tokens, revoked ones included, oldest first.
    pub tokens: Vec<TokenRow>,
}

/// Body of `POST /v1/tokens`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// A label to tell it apart, 1-64 printable characters (default `api`).
    #[schema(min_length = 1, max_length = 64)]
    pub label: Option<String>,
    /// What the new token may do: at least one of `plan`, `approve`, `manage`, each held by
    /// the caller's token (default: the caller's token's scopes). Give an agent `["plan"]`.
    #[schema(min_items = 1)]
    pub scopes: Option<Vec<Scope>>,
}

/// A new token and its secret (shown once; only its hash is stored).
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    /// The stored token.
    #[serde(flatten)]
    pub token: TokenRow,
    /// The bearer token itself (`mira_…`).
    pub secret: String,
}

/// The caller's tokens (an admin may name another user with `?user_id=`).
#[utoipa::path(get, path = "/v1/tokens", tag = "users", params(TokenQuery),
    responses((status = 200, body = TokenList), (status = 403)), security(("bearer" = [])))]
pub async fn list_tokens(
    State(app): State<App>,
    user: AuthUser,
    Query(query): Query<TokenQuery>,
) -> Result<Json<TokenList>> {
    let whose = match query.user_id {
        Some(other) if other != user.user_id => {
            user.require_admin()?;
            other
        }
        _ => user.user_id,
    };
    Ok(Json(TokenList { tokens: app.store.list_tokens(&whose).await? }))
}

/// Creates another token for the caller, made by (and revoked with) the token in use.
/// Errors: 400 `invalid_request` (label, empty scopes), 403 `token_scope_missing` (the
/// caller's token lacks `manage`, or a scope asked for), 409 `token_limit`
/// ([`MAX_ACTIVE_TOKENS`] valid tokens already).
#[utoipa::path(post, path = "/v1/tokens", tag = "users", request_body = CreateToken,
    responses((status = 201, body = CreatedToken),
        (status = 403, description = "token_scope_missing: the caller's token lacks manage, or a scope asked for"),
        (status = 409)), security(("bearer" = [])))]
pub async fn create_token(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateToken>,
) -> Result<(StatusCode, Json<CreatedToken>)> {
    user.require_scope(Scope::Manage)?;
    let scopes = match body.scopes {
        None => user.scopes,
        Some(asked) if asked.is_empty() => {
            return Err(Error::invalid_field("scopes", "scopes must name at least one scope"));
        }
        Some(asked) => asked.into_iter().collect::<Scopes>(),
    };
    // A token makes tokens with its own scopes or fewer, never more.
    if let Some(missing) = scopes.first_missing_from(user.scopes) {
        return Err(Error::ScopeMissing(missing));
    }
    let label = body.label.unwrap_or_else(|| "api".to_owned());
    if label.is_empty() || label.chars().count() > 64 || label.chars().any(char::is_control) {
        return Err(Error::invalid_field("label", "label must be 1-64 printable characters"));
    }
    if app.store.count_active_tokens(&user.user_id).await? >= MAX_ACTIVE_TOKENS {
        return Err(Error::conflict(
            ErrorCode::TokenLimit,
            format!("you already have {MAX_ACTIVE_TOKENS} valid tokens; revoke one first"),
            serde_json::json!({"limit": MAX_ACTIVE_TOKENS}),
        ));
    }
    let secret = crate::auth::new_token();
    let token = app
        .store
        .create_token(&user.user_id, &label, &crate::auth::hash_token(&secret), scopes, Some(&user.token_id))
        .await?
        // The caller's token was revoked meanwhile.
        .ok_or(Error::Unauthorized)?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })))
}

/// Revokes a token and the tokens it made (and theirs): from this answer on they are
/// refused (401) on this replica, and within 1 s on the others; the event streams they
/// opened end after an `error` event `unauthorized`, at once on this replica and within a few
/// seconds on the others. The caller's own tokens; admins any user's. The token in use may
/// always revoke itself; any other needs `manage` (403 `token_scope_missing`, whether it
/// exists or not). Another user's token is 404. Revoking again keeps the first `revoked_at`.
#[utoipa::path(post, path = "/v1/tokens/{token_id}/revoke", tag = "users", params(("token_id" = String, Path)),
    responses((status = 200, body = TokenRow),
        (status = 403, description = "token_scope_missing: another token than the one in use, without manage"),
        (status = 404)), security(("bearer" = [])))]
pub async fn revoke_token(
    State(app): State<App>,
    user: AuthUser,
    Path(token_id): Path<String>,
) -> Result<Json<TokenRow>> {
    // Before the lookup: a token without `manage` learns nothing of other token ids.
    if token_id != user.token_id {
        user.require_scope(Scope::Manage)?;
    }
    if !crate::ids::is_well_formed(&token_id, "tok") {
        return Err(Error::NotFound("token"));
    }
    let row = app.store.token_by_id(&token_id).await?.ok_or(Error::NotFound("token"))?;
    if row.user_id != user.user_id && !user.is_admin {
        return Err(Error::NotFound("token"));
    }
    app.store.revoke_token(&token_id).await?;
    app.token_watch.recheck();
    Ok(Json(app.store.token_by_id(&token_id).await?.ok_or(Error::NotFound("token"))?))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_tokens, create_token)).routes(routes!(revoke_token))
}
