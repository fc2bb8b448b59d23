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
//!   rmcp sees it. A session is its initializing user's: any request of another user naming
//!   it is answered 404 before rmcp sees it ([`gate`]).
//! - Protocol versions: up to `2025-11-25`, the last revision with sessions and
//!   server-to-client requests (elicitation); a client offering `2026-07-28` is answered with
//!   `2025-11-25` at `initialize`.
//! - Host and Origin: only the names of `--mcp-allowed-hosts` (default loopback) are
//!   answered, and a request carrying `Origin` only when it is in `--mcp-allowed-origins`
//!   (default none), against DNS rebinding and pages in a browser.
//! - Limits: [`MAX_SESSIONS_PER_USER`] open sessions per user on this replica; each request
//!   answered by a stream takes one of the user's `--max-streams-per-user` places until the
//!   stream ends; a session idle for five minutes is closed (rmcp's keep-alive); request bodies
//!   as the API's `--body-limit`.

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

/// The most MCP sessions one user may have open at once on one replica (sessions live in the
/// replica that opened them); `initialize` beyond it is refused
/// (`-32600`, naming the limit) until one closes (a `DELETE /mcp`, or five idle minutes).
pub const MAX_SESSIONS_PER_USER: usize = 16;

/// The path the MCP server is served at.
pub const PATH: &str = "/mcp";

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

/// Which user each MCP session belongs to, by `Mcp-Session-Id`: recorded from the answer to
/// `initialize`, checked by [`gate`] on every later request of the session.
#[derive(Default)]
pub struct SessionOwners {
    by_session: Mutex<HashMap<String, String>>,
}

impl SessionOwners {
    fn owner(&self, session: &str) -> Option<String> {
        self.by_session.lock().get(session).cloned()
    }

    /// Records `session` as `user_id`'s and forgets sessions rmcp no longer holds (closed,
    /// or idle past the keep-alive).
    async fn record(&self, session: &str, user_id: &str, live: &LocalSessionManager) {
        let held = live.sessions.read().await;
        let mut by_session = self.by_session.lock();
        by_session.retain(|s, _| held.contains_key(s.as_str()));
        by_session.insert(session.to_owned(), user_id.to_owned());
    }

    fn forget(&self, session: &str) {
        self.by_session.lock().remove(session);
    }
}

/// What [`gate`] needs.
#[derive(Clone)]
struct Gate {
    app: App,
    owners: Arc<SessionOwners>,
    sessions: Arc<LocalSessionManager>,
    /// Most bytes of a posted body (`--body-limit`).
    body_limit: usize,
    /// How long reading a posted body may take (`--request-timeout-secs`): a body is read
    /// before it is known whether it takes a stream place.
    body_time: std::time::Duration,
}

/// The `/mcp` routes: rmcp's Streamable HTTP service, one [`session::Session`] per MCP
/// session, behind [`gate`]. Served outside the API's request timeout (a call may wait for
/// its approval), with `body_limit` bytes per request, each body read within `body_time`.
pub fn router(app: App, body_limit: usize, body_time: std::time::Duration) -> Router<App> {
    let counts = Arc::new(SessionCounts::default());
    let sessions = Arc::new(LocalSessionManager::default());
    let factory_app = app.clone();
    let mut config = StreamableHttpServerConfig::default();
    config.max_request_body_bytes = body_limit;
    config.cancellation_token = app.shutdown.child_token();
    let settings = &app.config.mcp_server;
    let hosts: Vec<String> =
        settings.allowed_hosts.iter().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty()).collect();
    // `*` (or nothing listed): any Host. Every request still needs its bearer token, which a
    // page a browser was tricked into cannot add.
    let config = if hosts.is_empty() || hosts.iter().any(|h| h == "*") {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    // A request carrying `Origin` (a browser's) is refused unless the origin is listed.
    let origins: Vec<String> =
        settings.allowed_origins.iter().map(|o| o.trim().to_owned()).filter(|o| !o.is_empty()).collect();
    let config =
        if origins.is_empty() { config.enforce_origin_validation() } else { config.with_allowed_origins(origins) };
    let service = StreamableHttpService::new(
        move || Ok(session::Session::new(factory_app.clone(), Arc::clone(&counts))),
        Arc::clone(&sessions),
        config,
    );
    let gate_state = Gate { app, owners: Arc::default(), sessions, body_limit, body_time };
    Router::new().nest_service(PATH, service).layer(axum::middleware::from_fn_with_state(gate_state, gate))
}

/// Every request to `/mcp` passes here before rmcp sees it:
/// - it is authenticated by its bearer token (401 `unauthorized` otherwise, in the API's
///   error shape) and the caller is handed to the session in the request's extensions (rmcp
///   passes the request's `http::request::Parts` on to the handler);
/// - a request naming a session (`Mcp-Session-Id`) of another user — any message: a call,
///   an answer to an elicitation, a notification, the stream, its closing — or one no longer
///   held is answered 404 `not_found` (`session`), as for a session that does not exist;
/// - a request whose answer is a stream — a posted JSON-RPC request ([`carries_request`]),
///   the `GET` stream — takes one of the caller's stream places (`--max-streams-per-user`,
///   429 `too_many_streams`), held until that stream ends. Answers to the server's requests
///   (an elicitation's), notifications (a cancel) and the closing `DELETE` take none: a user
///   whose places are all held by calls waiting for approval can still approve or cancel them.
///   Such a stream ends (after an `error` event `unauthorized`) once its token is revoked or
///   its user removed, as the API's streams do ([`crate::revocation`]);
/// - an answer to an elicitation ([`carries_elicitation_answer`]) sent with a token without
///   the `approve` scope is refused (403 `token_scope_missing`): the session's elicitations
///   ask for approvals, and only such a token may decide one (the session asks none of a
///   call made with such a token; this also holds when another of the user's tokens made it).
async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let user = match AuthUser::from_request_parts(&mut parts, &gate.app).await {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(s) = &session
        && gate.owners.owner(s).as_deref() != Some(user.user_id.as_str())
    {
        return crate::error::Error::NotFound("session").into_response();
    }
    let (body, opens_stream) = match parts.method {
        // Read whole before it is known whether it takes a place, so within the API's
        // request time: a body trickled in cannot hold a connection longer than any request.
        axum::http::Method::POST => {
            match tokio::time::timeout(gate.body_time, axum::body::to_bytes(body, gate.body_limit)).await {
                Ok(Ok(bytes)) => {
                    if !user.scopes.contains(crate::auth::Scope::Approve) && carries_elicitation_answer(&bytes) {
                        return crate::error::Error::ScopeMissing(crate::auth::Scope::Approve).into_response();
                    }
                    let opens = carries_request(&bytes);
                    (axum::body::Body::from(bytes), opens)
                }
                Ok(Err(_)) => {
                    return crate::error::Error::TooLarge {
                        code: crate::error::ErrorCode::BodyTooLarge,
                        message: format!("the body is larger than {} bytes, or was cut off", gate.body_limit),
                    }
                    .into_response();
                }
                Err(_) => {
                    return crate::error::Error::Unavailable {
                        code: crate::error::ErrorCode::RequestTimeout,
                        message: format!("the body took longer than {} s to arrive", gate.body_time.as_secs()),
                    }
                    .into_response();
                }
            }
        }
        axum::http::Method::DELETE => (body, false),
        _ => (body, true),
    };
    let permit = if opens_stream {
        match gate.app.streams.acquire(&user.user_id) {
            Ok(permit) => Some(permit),
            Err(e) => return e.into_response(),
        }
    } else {
        None
    };
    // A stream stays open for as long as its token authenticates (as the API's streams do,
    // [`crate::revocation`]): watched from before the handler runs.
    let verdict = opens_stream.then(|| gate.app.token_watch.watch(&user.token_id));
    let closing = parts.method == axum::http::Method::DELETE;
    let user_id = user.user_id.clone();
    parts.extensions.insert(user);
    let response = next.run(Request::from_parts(parts, body)).await;
    match &session {
        None => {
            if let Some(new) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
                gate.owners.record(new, &user_id, &gate.sessions).await;
            }
        }
        Some(s) if closing && response.status().is_success() => gate.owners.forget(s),
        Some(_) => {}
    }
    if !response.status().is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = match verdict {
        Some(verdict) => crate::revocation::end_on_revocation(body, verdict, permit),
        None => body,
    };
    Response::from_parts(parts, body)
}

/// Whether a posted body carries an answer to an elicitation: a JSON-RPC response (an `id`,
/// no `method`) whose `result` has an `action` (`accept`, `decline`, `cancel`), or a batch
/// holding one.
fn carries_elicitation_answer(body: &[u8]) -> bool {
    let is_answer = |m: &serde_json::Value| {
        m.get("method").is_none() && m.get("id").is_some() && m.get("result").and_then(|r| r.get("action")).is_some()
    };
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(messages)) => messages.iter().any(is_answer),
        Ok(message) => is_answer(&message),
        Err(_) => false,
    }
}

/// Whether a posted body carries a JSON-RPC request (a message with `method` and `id`, or a
/// batch holding one), which rmcp answers with a stream; a body of answers and notifications
/// only is answered `202` at once. A body that is not JSON counts as a request (rmcp refuses
/// it).
fn carries_request(body: &[u8]) -> bool {
    let is_request = |m: &serde_json::Value| m.get("method").is_some() && m.get("id").is_some();
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(messages)) => messages.iter().any(is_request),
        Ok(message) => is_request(&message),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::carries_elicitation_answer;

    #[test]
    fn an_elicitation_answer_is_told_from_other_posts() {
        let accept = br#"{"jsonrpc":"2.0","id":3,"result":{"action":"accept","content":{"approve":true}}}"#;
        assert!(carries_elicitation_answer(accept));
        let batch = br#"[{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":"a","result":{"action":"decline"}}]"#;
        assert!(carries_elicitation_answer(batch));
        // A call, a notification, another answer, and a body that is not JSON are not.
        let call =
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":{"action":"accept"}}}"#;
        assert!(!carries_elicitation_answer(call));
        assert!(!carries_elicitation_answer(br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#));
        assert!(!carries_elicitation_answer(br#"{"jsonrpc":"2.0","id":5,"result":{}}"#));
        assert!(!carries_elicitation_answer(b"not json"));
    }
}
