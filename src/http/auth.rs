//! Bearer-token authentication as an extractor: a handler that needs a user takes
//! [`AuthUser`] and gets 401 otherwise.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::app::App;
use crate::auth;
use crate::error::Error;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct AuthUser {
    /// User id.
    pub user_id: String,
    /// User name.
    pub name: String,
    /// Admins may create users and register any workspace.
    pub is_admin: bool,
    /// Approvers (and admins) may decide other users' four-eyes approvals.
    pub is_approver: bool,
    /// The token used (recorded on approval decisions).
    pub token_id: String,
}

impl AuthUser {
    /// 403 unless the caller is an admin.
    pub fn require_admin(&self) -> Result<(), Error> {
        if self.is_admin { Ok(()) } else { Err(Error::Forbidden("this action needs an admin token".into())) }
    }

    /// The caller as a viewer of approvals (admins and approvers see four-eyes approvals).
    pub fn viewer(&self) -> crate::store::Viewer<'_> {
        crate::store::Viewer { user_id: &self.user_id, may_second: self.is_admin || self.is_approver }
    }

    /// The caller deciding an approval, with the token used.
    pub fn decider(&self) -> crate::store::Decider<'_> {
        crate::store::Decider {
            user_id: &self.user_id,
            token_id: &self.token_id,
            may_second: self.is_admin || self.is_approver,
        }
    }
}

impl FromRequestParts<App> for AuthUser {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Self::Rejection> {
        // Already authenticated by a middleware of this route (the stream slot).
        if let Some(user) = parts.extensions.get::<AuthUser>() {
            return Ok(user.clone());
        }
        let header = parts.headers.get(axum::http::header::AUTHORIZATION).ok_or(Error::Unauthorized)?;
        let value = header.to_str().map_err(|_| Error::Unauthorized)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 512)
            .ok_or(Error::Unauthorized)?;
        let identity = app.store.identity_by_token(&auth::hash_token(token)).await?.ok_or(Error::Unauthorized)?;
        Ok(AuthUser {
            user_id: identity.user_id,
            name: identity.name,
            is_admin: identity.is_admin,
            is_approver: identity.is_approver,
            token_id: identity.token_id,
        })
    }
}
