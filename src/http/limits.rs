//! The HTTP face of the connection and stream limits ([`crate::limits`], re-exported here):
//! the streaming routes' middleware that takes one of the caller's stream slots.

pub use crate::limits::*;

use crate::error::Result;

/// Middleware of the streaming routes: authenticates the caller, takes one of their stream
/// slots (429 `too_many_streams` when none is free) and ties the slot to the response body,
/// so it is released when the body is dropped — the client disconnected, the stream ended or
/// the server stopped. An error answer releases it at once. The stream's token stays under
/// watch ([`super::revocation`]): once it is revoked (or its user is gone) the stream ends
/// within a few seconds, after an `error` event `unauthorized`. Every route merged into the
/// streaming router gets this without code of its own.
pub async fn stream_slot(
    axum::extract::State(app): axum::extract::State<crate::app::App>,
    user: super::auth::AuthUser,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response> {
    let permit = app.streams.acquire(&user.user_id)?;
    // Watched from before the handler runs: a revocation while it answers is not missed.
    let verdict = app.token_watch.watch(&user.token_id);
    req.extensions_mut().insert(user);
    let response = next.run(req).await;
    if !response.status().is_success() {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let body = crate::revocation::end_on_revocation(body, verdict, permit);
    Ok(axum::response::Response::from_parts(parts, body))
}
