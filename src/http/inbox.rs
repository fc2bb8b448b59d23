//! `GET /v1/approvals/stream`: the caller's approval inbox, live, as Server-Sent Events.
//!
//! Run event streams are per run; a person deciding approvals needs every run at once, over
//! one connection (a browser keeps at most six HTTP/1.1 connections per origin). This stream
//! sends snapshots, so it needs no resume protocol: each `approvals` event carries the
//! pending inbox in the shape of `GET /v1/approvals?status=pending&limit=200`
//! (`{"approvals": [...], "next_cursor"}`, oldest first) — that page: at most 200 approvals and
//! [`crate::store::PAGE_MAX_BYTES`] of frozen inputs and previews past the first, with
//! `next_cursor` when more are pending. Between snapshots a stream keeps only the SHA-256 of
//! the last one it sent (to send the next only when it differs), and at most one snapshot
//! waits for a slow client. The first event comes at once; the
//! next ones only when the inbox changed, checked after every committed event of one of the
//! caller's runs (on Postgres also those committed by other replicas, see
//! [`crate::events::listen`]), after the cross-replica listener reconnects, and at least
//! every 15 s (approvals expire). A reconnect
//! simply gets a fresh snapshot. For admins and approvers the inbox also holds every pending
//! four-eyes approval of other users (each naming its requester), so their stream is also
//! woken by the approval events (requested, granted, denied, expired, cancelled) of any run. Keep-alive comments every 15 s; the stream ends when the
//! server shuts down, or after an `error` event when the store fails.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::approvals::{ApprovalList, view};
use super::auth::AuthUser;
use crate::app::App;
use crate::error::Result;
use crate::events::{EventKind, Heard};
use crate::store::Viewer;
use mira_core::evidence::sha256_hex;

/// Most approvals in one snapshot (the API's page limit).
const SNAPSHOT_LIMIT: i64 = 200;
/// The inbox is re-read at least this often even without a wake-up.
const POLL: Duration = Duration::from_secs(15);
/// Runs whose ownership a stream remembers before it forgets them all.
const OWNED_CACHE: usize = 10_000;

/// The inbox's first page as the JSON text of an `approvals` event.
async fn snapshot(app: &App, viewer: &Viewer<'_>) -> Result<String> {
    let rows = app
        .store
        .list_approvals(viewer, Some(crate::state::ApprovalStatus::Pending), None, None, SNAPSHOT_LIMIT)
        .await?;
    let next_cursor = super::Page::next_cursor(&rows, |r| r.id.clone());
    let approvals = rows.rows.into_iter().map(|r| view(r, viewer)).collect::<Result<_>>()?;
    let list = ApprovalList { approvals, next_cursor };
    serde_json::to_string(&list).map_err(|e| crate::error::Error::Internal(e.to_string()))
}

/// The caller's pending approvals as SSE snapshots (see the module docs).
#[utoipa::path(get, path = "/v1/approvals/stream", tag = "approvals",
    responses((status = 200, content_type = "text/event-stream",
        description = "`approvals` events, each the whole pending inbox as an ApprovalList")),
    security(("bearer" = [])))]
pub async fn approvals_stream(
    State(app): State<App>,
    user: AuthUser,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    // The first snapshot is read before answering, so a store failure is an HTTP error.
    let first = snapshot(&app, &user.viewer()).await?;
    // One snapshot may wait for the client; the next read waits for its place.
    let (tx, rx) = mpsc::channel::<Event>(1);
    tokio::spawn(async move {
        // Subscribed before the first send: nothing committed after the snapshot is missed.
        let mut signals = app.store.bus().subscribe();
        let mut owned: HashMap<String, bool> = HashMap::new();
        // What the last snapshot was, not the snapshot: it can hold megabytes of inputs.
        let mut last = sha256_hex(first.as_bytes());
        if tx.send(Event::default().event("approvals").data(first)).await.is_err() {
            return;
        }
        loop {
            // Wait for a committed event of one of the caller's runs (or the poll interval).
            loop {
                let (run_id, kind) = tokio::select! {
                    () = app.shutdown.cancelled() => return,
                    () = tx.closed() => return,
                    () = tokio::time::sleep(POLL) => break,
                    heard = signals.recv() => match heard {
                        Heard::Run(s) => (s.run_id, s.kind),
                        // Signals may have been missed (lag, listener reconnect): re-read.
                        Heard::Resync => break,
                        Heard::Closed => return,
                    },
                };
                if user.viewer().may_second && changes_approvals(kind) {
                    // Another user's four-eyes approval may have come or gone.
                    break;
                }
                if owned.len() > OWNED_CACHE {
                    owned.clear();
                }
                let mine = match owned.get(&run_id) {
                    Some(mine) => *mine,
                    None => match app.store.run_for(&user.user_id, &run_id).await {
                        Ok(run) => *owned.entry(run_id).or_insert(run.is_some()),
                        Err(_) => true, // unknown: re-read, the snapshot reports a failing store
                    },
                };
                if mine {
                    break;
                }
            }
            match snapshot(&app, &user.viewer()).await {
                Ok(now) => {
                    let digest = sha256_hex(now.as_bytes());
                    if digest == last {
                        continue;
                    }
                    if tx.send(Event::default().event("approvals").data(now)).await.is_err() {
                        return;
                    }
                    last = digest;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "approval stream failed");
                    let data = r#"{"code":"store_error","message":"the approval stream failed; reconnect"}"#;
                    let _ = tx.send(Event::default().event("error").data(data)).await;
                    return;
                }
            }
        }
    });
    let stream = futures::StreamExt::map(ReceiverStream::new(rx), Ok);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)).text("keep-alive")))
}

/// Whether an event of this type can change some pending approval.
fn changes_approvals(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::ApprovalRequested
            | EventKind::ApprovalGranted
            | EventKind::ApprovalDenied
            | EventKind::ApprovalExpired
            | EventKind::InvocationCancelled
    )
}

/// Routes of this module (streaming: merged outside the request timeout).
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(approvals_stream))
}
