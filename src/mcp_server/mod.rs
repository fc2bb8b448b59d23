//! The runtime as an MCP server (docs/mcp-server.md): MCP clients — desktop assistants, IDEs,
//! other agents — connect to `/mcp` (Streamable HTTP, rmcp's server side) with a user's bearer
//! token and use the runtime's governed tools, with exposure, exact approvals and evidence
//! behind every call. `mira mcp-stdio` ([`bridge`]) carries the same session over stdio for
//! clients that only launch processes.
//!
//! This module is the transport and the per-user session cap; [`session`] is the session
//! itself (one run, its current turn, `tools/list` and `tools/call`).
//!
//! - Authentication: every HTTP request to `/mcp` carries `Authorization: Bearer <token>`;
//!   one without a valid token is answered 401 `unauthorized` in the API's error shape before
//!   rmcp sees it. A session is its initializing user's: a request of another user on it is
//!   refused (`-32600`, "this session belongs to another user").
//! - Protocol versions: up to `2025-11-25`, the last revision with sessions and
//!   server-to-client requests (elicitation); a client offering `2026-07-28` is answered with
//!   `2025-11-25` at `initialize`.
//! - Host: only the names of `--mcp-allowed-hosts` (default loopback) are answered, against
//!   DNS rebinding.
//! - Limits: [`MAX_SESSIONS_PER_USER`] open sessions per user; a session idle for five minutes
//!   is closed (rmcp's keep-alive); request bodies as the API's `--body-limit`.

pub mod bridge;
pub mod session;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::app::App;
use crate::http::auth::AuthUser;

/// The most MCP sessions one user may have open at once; `initialize` beyond it is refused
/// (`-32600`, naming the limit) until one closes (a `DELETE /mcp`, or five idle minutes).
pub const MAX_SESSIONS_PER_USER: usize = 16;

/// The path the MCP server is served at.
pub const PATH: &str = "/mcp";

/// Settings of the MCP server (`mira serve` flags).
#[derive(clap::Args, Debug, Clone)]
pub struct McpServerSettings {
    /// Host names (or `host:port`) `/mcp` answers to, comma-separated; `*` = any. A request
    /// with another `Host` is refused 403 before anything else (DNS-rebinding protection,
    /// as the MCP specification asks). A deployment reached by its own name lists it.
    #[arg(
        id = "mcp_allowed_hosts",
        value_name = "HOSTS",
        long = "mcp-allowed-hosts",
        env = "MIRA_MCP_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1,::1"
    )]
    pub allowed_hosts: Vec<String>,
}

impl Default for McpServerSettings {
    fn default() -> Self {
        Self { allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()] }
    }
}

/// Open sessions per user, for [`MAX_SESSIONS_PER_USER`].
#[derive(Default)]
pub struct SessionCounts {
    by_user: Mutex<HashMap<String, usize>>,
}

/// One counted session: dropping it (the session ends) gives its place back.
pub struct SessionSlot {
    counts: Arc<SessionCounts>,
    user_id: String,
}

impl SessionCounts {
    /// Takes a place for `user_id`, or None when the user has [`MAX_SESSIONS_PER_USER`] open.
    pub fn take(self: &Arc<Self>, user_id: &str) -> Option<SessionSlot> {
        let mut by_user = self.by_user.lock();
        let n = by_user.entry(user_id.to_owned()).or_default();
        if *n >= MAX_SESSIONS_PER_USER {
            return None;
        }
        *n += 1;
        Some(SessionSlot { counts: Arc::clone(self), user_id: user_id.to_owned() })
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut by_user = self.counts.by_user.lock();
        if let Some(n) = by_user.get_mut(&self.user_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_user.remove(&self.user_id);
            }
        }
    }
}

/// The `/mcp` routes: rmcp's Streamable HTTP service, one [`session::Session`] per MCP
/// session, behind [`authenticate`]. Served outside the API's request timeout (a call may
/// wait for its approval), with `body_limit` bytes per request.
pub fn router(app: App, body_limit: usize) -> Router<App> {
    let counts = Arc::new(SessionCounts::default());
    let factory_app = app.clone();
    let mut config = StreamableHttpServerConfig::default();
    config.max_request_body_bytes = body_limit;
    config.cancellation_token = app.shutdown.child_token();
    let hosts: Vec<String> =
        app.config.mcp_server.allowed_hosts.iter().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty()).collect();
    // `*` (or nothing listed): any Host. Every request still needs its bearer token, which a
    // page a browser was tricked into cannot add.
    let config = if hosts.is_empty() || hosts.iter().any(|h| h == "*") {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    let service = StreamableHttpService::new(
        move || Ok(session::Session::new(factory_app.clone(), Arc::clone(&counts))),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new().nest_service(PATH, service).layer(axum::middleware::from_fn_with_state(app, authenticate))
}

/// Authenticates a request to `/mcp` by its bearer token and hands the caller to the session
/// in the request's extensions (rmcp passes the request's `http::request::Parts` on to
/// the handler). 401 `unauthorized` otherwise, in the API's error shape.
pub async fn authenticate(State(app): State<App>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    match AuthUser::from_request_parts(&mut parts, &app).await {
        Ok(user) => {
            parts.extensions.insert(user);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => e.into_response(),
    }
}
