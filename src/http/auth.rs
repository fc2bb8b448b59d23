//! Bearer-token authentication as an extractor: a handler that needs a user takes
//! [`AuthUser`] and gets 401 otherwise.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::app::App;
use crate::auth::{self, Scope, Scopes};
use crate::error::Error;

/// The routes a token without the `plan` scope may use (each checks the scope it needs
/// itself, [`AuthUser::require_scope`]): who am I, the tokens (`manage`, and revoking the
/// token in use), the approvals and their inbox (`approve` to decide). Every other route
/// needs `plan`, checked when the caller is authenticated — a new route needs it unless it is
/// added here. Matched against the route's template (`axum::extract::MatchedPath`).
const WITHOUT_PLAN: &[&str] = &[
    "/v1/me",
    "/v1/tokens",
    "/v1/tokens/{token_id}/revoke",
    "/v1/approvals",
    "/v1/approvals/stream",
    "/v1/approvals/{approval_id}",
    "/v1/approvals/{approval_id}/screenshot",
    "/v1/approvals/{approval_id}/grant",
    "/v1/approvals/{approval_id}/deny",
];

/// Routes that change what later calls may reach without an approval of their own, or where
/// a stored credential is sent: they need [`Scope::Manage`] as well as `plan` (an agent's
/// `plan` token must not re-point a person's GitHub or mail connection at a server of its
/// choosing, accept an MCP server's disclaimer or a changed tool definition for them, or
/// enroll a device whose runner computes their calls' previews). Matched like
/// [`WITHOUT_PLAN`], with the method.
const NEED_MANAGE: &[(&str, &str)] = &[
    ("PATCH", "/v1/connections/{connection_id}"),
    ("POST", "/v1/mcp/servers/{server_id}/disclaimer/accept"),
    ("PUT", "/v1/mcp/servers/{server_id}/tools/{tool_name}/agent-access"),
    ("PATCH", "/v1/mcp/servers/{server_id}"),
    ("POST", "/v1/devices"),
    ("POST", "/v1/devices/{device_id}/enrollment-code"),
];

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct AuthUser {
    /// User id.
    pub user_id: String,
    /// User name.
    pub name: String,
    /// Admins may create users and register any workspace — through a token that holds
    /// [`Scope::Manage`] only: an admin's `plan` token (an agent's) has no admin power, which
    /// would reach the server host (stdio MCP servers, internal addresses) past every
    /// approval.
    pub is_admin: bool,
    /// Approvers (and admins) may decide other users' four-eyes approvals.
    pub is_approver: bool,
    /// The person is an admin or an approver (whatever the token's scopes): may see and, with
    /// [`Scope::Approve`], decide other users' four-eyes approvals.
    pub may_second: bool,
    /// The token used (recorded on approval decisions).
    pub token_id: String,
    /// What the token used may do ([`AuthUser::require_scope`]).
    pub scopes: Scopes,
}

impl AuthUser {
    /// 403 unless the caller is an admin.
    pub fn require_admin(&self) -> Result<(), Error> {
        if self.is_admin { Ok(()) } else { Err(Error::Forbidden("this action needs an admin token".into())) }
    }

    /// 403 `token_scope_missing` (details `{"needed": scope}`) unless the token used holds
    /// `scope`.
    pub fn require_scope(&self, scope: Scope) -> Result<(), Error> {
        if self.scopes.contains(scope) { Ok(()) } else { Err(Error::ScopeMissing(scope)) }
    }

    /// The caller as a viewer of approvals (admins and approvers see four-eyes approvals).
    pub fn viewer(&self) -> crate::store::Viewer<'_> {
        crate::store::Viewer { user_id: &self.user_id, may_second: self.may_second }
    }

    /// The caller deciding an approval, with the token used: 403 `token_scope_missing`
    /// unless the token holds [`Scope::Approve`]. Every decision (the API's grant and deny,
    /// an MCP elicitation's answer) takes a decider, so none is made without that scope.
    pub fn decider(&self) -> Result<crate::store::Decider<'_>, Error> {
        self.require_scope(Scope::Approve)?;
        Ok(crate::store::Decider { user_id: &self.user_id, token_id: &self.token_id, may_second: self.may_second })
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
        let user = AuthUser {
            user_id: identity.user_id,
            name: identity.name,
            is_admin: identity.is_admin && identity.scopes.contains(Scope::Manage),
            is_approver: identity.is_approver,
            may_second: identity.is_admin || identity.is_approver,
            token_id: identity.token_id,
            scopes: identity.scopes,
        };
        let route = parts.extensions.get::<axum::extract::MatchedPath>().map(axum::extract::MatchedPath::as_str);
        if !route.is_some_and(|r| WITHOUT_PLAN.contains(&r)) {
            user.require_scope(Scope::Plan)?;
        }
        if route.is_some_and(|r| NEED_MANAGE.iter().any(|(m, p)| *p == r && parts.method.as_str() == *m)) {
            user.require_scope(Scope::Manage)?;
        }
        Ok(user)
    }
}
