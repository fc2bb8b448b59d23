//! `GET /v1/runs/{run_id}/events`: the run's event log as Server-Sent Events.
//!
//! Every event carries `id:` (monotonic per run) and `event:` (its type). A reconnect with
//! `Last-Event-ID` (or `?after=`) resumes from the store with nothing lost or repeated.
//! Keep-alive comments every 15 s. The stream ends when the server shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Path, Query};
use super::runs::owned_run;
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::follow::follow;

/// Query of the event stream.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Resume after this event id (same as the `Last-Event-ID` header, which wins).
    pub after: Option<i64>,
}

/// The run's events as SSE.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", tag = "events",
    params(("run_id" = String, Path), EventsQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses((status = 200, content_type = "text/event-stream", description = "event stream"), (status = 400, description = "invalid_last_event_id"), (status = 404)),
    security(("bearer" = [])))]
pub async fn run_events(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let run = owned_run(&app, &user, &run_id).await?;
    let after = match headers.get("last-event-id") {
        Some(v) => v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()).ok_or_else(|| {
            Error::bad_request(ErrorCode::InvalidLastEventId, "Last-Event-ID must be an event id (an integer)")
        })?,
        None => q.after.unwrap_or(0),
    };
    let newest = app.store.last_event_seq(&run.id).await?;
    if after < 0 || after > newest {
        return Err(Error::BadRequest {
            code: ErrorCode::InvalidLastEventId,
            message: format!("event id {after} does not exist in this run (newest is {newest})"),
            details: serde_json::json!({"last_event_id": after, "newest": newest}),
        });
    }
    let stream = follow(app.store.clone(), run.id, after, app.shutdown.clone()).map(|item| {
        Ok(match item {
            Ok(ev) => Event::default().id(ev.seq.to_string()).event(ev.kind).data(ev.data),
            Err(e) => {
                tracing::warn!(error = %e, "event stream failed");
                Event::default()
                    .event("error")
                    .data(r#"{"code":"store_error","message":"the event stream failed; reconnect with Last-Event-ID"}"#)
            }
        })
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)).text("keep-alive")))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(run_events))
}
