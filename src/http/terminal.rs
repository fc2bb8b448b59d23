//! Terminal sessions: `GET /v1/terminal-sessions`, `GET /v1/terminal-sessions/{id}`, the
//! output stream `GET /v1/terminal-sessions/{id}/stream?offset=N`, and range reads
//! `GET /v1/terminal-sessions/{id}/output?from=&to=&max_bytes=&pattern=` (the `output` action
//! of `terminal_session` without an invocation: for the session's owner, e.g. a frontend).
//!
//! The stream is Server-Sent Events of the session's raw output (ANSI sequences kept, for
//! xterm.js), read from the live ring or, for older bytes, from the store:
//! - `output` `{start, end, data}`, `id:` = `end` (a byte offset): a reconnect with
//!   `Last-Event-ID` (or `?offset=`) resumes exactly there. A UTF-8 character split across
//!   reads is held until complete; invalid bytes become U+FFFD.
//! - `gap` `{from, to}`: bytes no longer retained (the retention cap passed them), so a slow
//!   viewer skips ahead instead of the server buffering for it. Output leaves the live ring
//!   only once stored, so a gap is always a prefix the retention cap dropped.
//! - `exit` `{state, end_reason, exit_code, signal, bytes_out}`, after the last output; the
//!   stream then ends.
//!
//! Every viewer pulls at its own pace from shared buffers; nothing is queued per viewer.
//!
//! With several replicas the stream works from any of them: on a replica other than the
//! session's owner it reads the stored output, woken by the run's `terminal.output` events
//! (which reach every replica, see [`crate::events::listen`]), and ends with `exit` once the
//! session's end is recorded (`lost` when its replica died).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::events::{EventKind, Heard};
use crate::state::TerminalSessionState;
use crate::store::TerminalSessionRow;
use crate::tools::terminal::host::{ExitInfo, Session};
use crate::tools::terminal::output::decode_utf8;
use crate::tools::terminal::range::{LineMatch, Piece, Source};
use crate::tools::terminal::{OutputFields, OutputQuery, OutputRead};

/// Largest `output` event, in bytes of output.
const EVENT_BYTES: usize = 64 * 1024;

/// A terminal session as listed.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionView {
    /// `term_…`
    pub id: String,
    /// The run.
    pub run_id: String,
    /// The `start` invocation.
    pub invocation_id: String,
    /// `running|exited|killed|timed_out|reaped|lost`.
    pub state: TerminalSessionState,
    /// Program as given.
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Real absolute working directory at start.
    pub cwd: String,
    /// Environment set for the process (sorted map; `null` = removed).
    #[schema(value_type = Object)]
    pub env: serde_json::Value,
    /// Leader pid.
    pub pid: Option<i64>,
    /// PTY columns.
    pub cols: i64,
    /// PTY rows.
    pub rows: i64,
    /// Life limit, ms.
    pub timeout_ms: i64,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, when ended.
    pub ended_at: Option<String>,
    /// Why it ended.
    pub end_reason: Option<String>,
    /// Exit code.
    pub exit_code: Option<i64>,
    /// Signal that ended it.
    pub signal: Option<String>,
    /// Bytes of output so far.
    pub bytes_out: i64,
    /// Offset of the oldest retained byte.
    pub retained_from: i64,
    /// Output before this offset was in the result of a completed action; the next action
    /// reports from here.
    pub reported_to: i64,
}

impl SessionView {
    fn new(row: TerminalSessionRow, live: Option<&Session>) -> Self {
        let bytes_out = live.map_or(row.bytes_out, |s| i64::try_from(s.with_ring(|r| r.end())).unwrap_or(i64::MAX));
        Self {
            args: serde_json::from_str(&row.args).unwrap_or_default(),
            env: serde_json::from_str(&row.env).unwrap_or_default(),
            id: row.id,
            run_id: row.run_id,
            invocation_id: row.invocation_id,
            state: row.state,
            command: row.command,
            cwd: row.cwd,
            pid: row.pid,
            cols: row.cols,
            rows: row.rows,
            timeout_ms: row.timeout_ms,
            started_at: row.started_at,
            ended_at: row.ended_at,
            end_reason: row.end_reason,
            exit_code: row.exit_code,
            signal: row.signal,
            bytes_out,
            retained_from: row.retained_from,
            reported_to: row.reported_to,
        }
    }
}

/// `{"sessions": [...], "next_cursor"}`, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionList {
    /// Sessions.
    pub sessions: Vec<SessionView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// Query of the list.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this run's sessions.
    pub run_id: Option<String>,
    /// Page size, 1–200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[a-z]+_[0-9a-f]{32}$")]
    pub cursor: Option<String>,
}

/// The caller's terminal sessions.
#[utoipa::path(get, path = "/v1/terminal-sessions", tag = "terminal", params(ListQuery),
    responses((status = 200, body = SessionList), (status = 400, description = "invalid_query")), security(("bearer" = [])))]
pub async fn list_sessions(
    State(app): State<App>,
    user: AuthUser,
    Query(q): Query<ListQuery>,
) -> Result<Json<SessionList>> {
    let page = super::Page { limit: q.limit, cursor: q.cursor };
    let limit = page.limit()?;
    let rows =
        app.store.list_terminal_sessions(&user.user_id, q.run_id.as_deref(), page.cursor.as_deref(), limit + 1).await?;
    let (rows, next_cursor) = super::Page::split(rows, limit, |r| r.id.clone());
    let sessions = rows
        .into_iter()
        .map(|r| {
            let live = app.terminal.get(&user.user_id, &r.id);
            SessionView::new(r, live.as_deref())
        })
        .collect();
    Ok(Json(SessionList { sessions, next_cursor }))
}

async fn owned(app: &App, user: &AuthUser, id: &str) -> Result<TerminalSessionRow> {
    app.store.terminal_session_for(&user.user_id, id).await?.ok_or(Error::NotFound("terminal_session"))
}

/// One of the caller's terminal sessions.
#[utoipa::path(get, path = "/v1/terminal-sessions/{id}", tag = "terminal", params(("id" = String, Path)),
    responses((status = 200, body = SessionView), (status = 404, description = "terminal_session_not_found")), security(("bearer" = [])))]
pub async fn get_session(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<SessionView>> {
    let row = owned(&app, &user, &id).await?;
    let live = app.terminal.get(&user.user_id, &id);
    Ok(Json(SessionView::new(row, live.as_deref())))
}

/// Query of the stream.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Byte offset to start from (default 0; `Last-Event-ID` wins).
    pub offset: Option<u64>,
}

/// The session's output as SSE from a byte offset.
#[utoipa::path(get, path = "/v1/terminal-sessions/{id}/stream", tag = "terminal",
    params(("id" = String, Path), StreamQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume at this byte offset")),
    responses((status = 200, content_type = "text/event-stream", description = "`output`, `gap` and `exit` events"),
        (status = 400, description = "invalid_offset"), (status = 404, description = "terminal_session_not_found")),
    security(("bearer" = [])))]
pub async fn stream_session(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = std::result::Result<Event, Infallible>>>> {
    let row = owned(&app, &user, &id).await?;
    let live = app.terminal.get(&user.user_id, &id);
    let offset = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| Error::bad_request(ErrorCode::InvalidOffset, "Last-Event-ID must be a byte offset"))?,
        None => q.offset.unwrap_or(0),
    };
    let total = live.as_ref().map_or(u64::try_from(row.bytes_out).unwrap_or(0), |s| s.with_ring(|r| r.end()));
    if offset > total {
        return Err(Error::BadRequest {
            code: ErrorCode::InvalidOffset,
            message: format!("offset {offset} is past the session's output ({total} bytes so far)"),
            details: json!({"offset": offset, "bytes_out": total}),
        });
    }
    let run_id = row.run_id.clone();
    let state = Viewer {
        app,
        id,
        run_id,
        live,
        offset,
        pending: Vec::new(),
        exit: None,
        done: false,
        signals: None,
        device_wake: None,
    };
    let stream = futures::stream::unfold(state, |mut v| async move {
        if v.done {
            return None;
        }
        let event = v.next_event().await?;
        Some((Ok(event), v))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)).text("keep-alive")))
}

/// One viewer's position in a session's output.
struct Viewer {
    app: App,
    id: String,
    /// The run whose `terminal.output` events announce stored output.
    run_id: String,
    /// Bus subscription, taken when the session runs in another replica's process.
    signals: Option<crate::events::Subscription>,
    /// Woken when a device's runner delivers output to this process (a device session).
    device_wake: Option<tokio::sync::watch::Receiver<u64>>,
    live: Option<Arc<Session>>,
    offset: u64,
    /// Bytes of an incomplete UTF-8 character, held until the rest arrives.
    pending: Vec<u8>,
    /// How the live session ended (kept when it leaves the host).
    exit: Option<ExitInfo>,
    done: bool,
}

/// What the next read found.
enum Next {
    Bytes(Vec<u8>),
    Gap(u64),
    Nothing,
}

impl Viewer {
    /// The next event, waiting for output when there is none; None when the server stops.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            let next = match self.read().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "terminal stream failed");
                    self.done = true;
                    return Some(Event::default().event("error").data(
                        r#"{"code":"store_error","message":"the output stream failed; reconnect with Last-Event-ID"}"#,
                    ));
                }
            };
            match next {
                Next::Bytes(bytes) => {
                    let start = self.offset - self.pending.len() as u64;
                    let mut buf = std::mem::take(&mut self.pending);
                    buf.extend_from_slice(&bytes);
                    self.offset += bytes.len() as u64;
                    let (text, held) = decode_utf8(&buf, false);
                    self.pending = buf.split_off(buf.len() - held);
                    if text.is_empty() {
                        continue;
                    }
                    let end = self.offset - held as u64;
                    return Some(output_event(start, end, &text));
                }
                Next::Gap(to) => {
                    let from = self.offset - self.pending.len() as u64;
                    self.pending.clear();
                    self.offset = to;
                    return Some(
                        Event::default()
                            .id(to.to_string())
                            .event("gap")
                            .data(json!({"from": from, "to": to}).to_string()),
                    );
                }
                Next::Nothing => {}
            }
            // Nothing new: wait for more while the session runs.
            if let Some(s) = self.live.clone() {
                if !s.ended() {
                    let mut bytes = s.bytes();
                    let mut exit = s.exit();
                    if s.with_ring(|r| r.end()) > self.offset || s.ended() {
                        continue;
                    }
                    tokio::select! {
                        _ = bytes.changed() => {}
                        _ = exit.changed() => {}
                        () = self.app.shutdown.cancelled() => { self.done = true; return None; }
                    }
                    continue;
                }
                // It just ended: once its end is recorded (bounded wait), the rest of its
                // output is read from the store, then `exit` follows.
                self.live = None;
                self.exit = s.exit_info();
                for _ in 0..100 {
                    match self.app.store.terminal_session_for_any(&self.id).await {
                        Ok(Some(row)) if row.state != TerminalSessionState::Running => break,
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                continue;
            }
            // After the last byte: a held partial character, then `exit`.
            if !self.pending.is_empty() {
                let start = self.offset - self.pending.len() as u64;
                let (text, _) = decode_utf8(&std::mem::take(&mut self.pending), true);
                return Some(output_event(start, self.offset, &text));
            }
            if let Some(exit) = self.exit_event().await {
                self.done = true;
                return Some(exit);
            }
            // Still running, in another replica's process (or its end is not recorded yet):
            // wait for more output to be stored (a `terminal.output` event of its run, from
            // any replica) or for its end, re-reading at least every second.
            match self.app.store.terminal_session_for_any(&self.id).await {
                Ok(Some(row)) if row.state == TerminalSessionState::Running => {}
                // It ended since `exit_event` looked: the next pass reads the rest and `exit`.
                Ok(Some(_)) => continue,
                _ => {
                    self.done = true;
                    return None;
                }
            }
            let run_id = self.run_id.clone();
            let bus = self.app.store.bus().clone();
            let signals = self.signals.get_or_insert_with(|| bus.subscribe());
            let device_wake = self.device_wake.get_or_insert_with(|| self.app.devices.terminal_signal());
            let wait = async {
                loop {
                    match signals.recv().await {
                        Heard::Run(s) if s.run_id == run_id && s.kind == EventKind::TerminalOutput => return,
                        Heard::Run(_) => {}
                        Heard::Resync | Heard::Closed => return,
                    }
                }
            };
            tokio::select! {
                () = wait => {}
                _ = device_wake.changed() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = self.app.shutdown.cancelled() => { self.done = true; return None; }
            }
        }
    }

    /// The `exit` event: the recorded end, or the process's own exit while the record is late.
    async fn exit_event(&mut self) -> Option<Event> {
        let row = self.app.store.terminal_session_for_any(&self.id).await.ok().flatten()?;
        let data = match (&self.exit, row.state) {
            (Some(e), TerminalSessionState::Running) => json!({
                "state": e.state, "end_reason": e.end_reason, "exit_code": e.exit_code,
                "signal": e.signal, "bytes_out": self.offset,
            }),
            (None, TerminalSessionState::Running) => return None,
            _ => json!({
                "state": row.state, "end_reason": row.end_reason, "exit_code": row.exit_code,
                "signal": row.signal, "bytes_out": row.bytes_out,
            }),
        };
        Some(Event::default().id(self.offset.to_string()).event("exit").data(data.to_string()))
    }

    /// Reads from the ring, or from the store for bytes the ring no longer holds.
    async fn read(&mut self) -> std::result::Result<Next, crate::store::StoreError> {
        let source = Source { store: &self.app.store, id: &self.id, live: self.live.as_deref() };
        Ok(match source.read(self.offset, EVENT_BYTES).await? {
            Piece::Bytes(b) => Next::Bytes(b),
            Piece::Gap(to) => Next::Gap(to),
            Piece::Nothing => Next::Nothing,
        })
    }
}

fn output_event(start: u64, end: u64, text: &str) -> Event {
    Event::default()
        .id(end.to_string())
        .event("output")
        .data(json!({"start": start, "end": end, "data": text}).to_string())
}

/// Query of a range read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct OutputParams {
    /// First byte offset (default 0).
    #[param(maximum = 9_007_199_254_740_991_u64)]
    pub from: Option<u64>,
    /// One past the last byte offset (default: the end so far).
    #[param(maximum = 9_007_199_254_740_991_u64)]
    pub to: Option<u64>,
    /// Bytes of output per page, 1–1048576 (default 65536).
    #[param(minimum = 1, maximum = 1_048_576)]
    pub max_bytes: Option<u64>,
    /// A regex (Rust syntax, at most 1000 bytes): the answer is the matching rendered lines.
    pub pattern: Option<String>,
    /// The pattern ignores case.
    pub case_insensitive: Option<bool>,
    /// Matching lines at most, 1–1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub max_matches: Option<u64>,
}

/// A range of a session's output: a page of rendered text, or the lines matching `pattern`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OutputView {
    /// `[from, to)` read (or searched), byte offsets.
    pub output_range: [u64; 2],
    /// Bytes of the range that were read.
    pub output_bytes: u64,
    /// Parts of the range no longer retained (past the retention cap), `[from, to)` each.
    pub output_missed_ranges: Vec<[u64; 2]>,
    /// The rendered text of the page (without `pattern`).
    pub output: Option<String>,
    /// SHA-256 (hex) of the raw bytes of the page (without `pattern`).
    pub output_sha256: Option<String>,
    /// Matching lines (with `pattern`).
    pub matches: Option<Vec<LineMatch>>,
    /// Where the next page (or the search for more matches) starts, when there is more.
    pub next_from: Option<u64>,
}

/// Reads any retained range of one of the caller's sessions (live or ended): the same reads
/// as the `output` action of `terminal_session`, for the session's owner, without an
/// invocation.
#[utoipa::path(get, path = "/v1/terminal-sessions/{id}/output", tag = "terminal", params(("id" = String, Path), OutputParams),
    responses((status = 200, body = OutputView),
        (status = 400, description = "invalid_range, invalid_pattern, invalid_field, invalid_query"),
        (status = 404, description = "terminal_session_not_found")),
    security(("bearer" = [])))]
pub async fn read_output(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Query(q): Query<OutputParams>,
) -> Result<Json<OutputView>> {
    let row = owned(&app, &user, &id).await?;
    let live = app.terminal.get(&user.user_id, &id);
    let fields = OutputFields {
        from: q.from,
        to: q.to,
        max_bytes: q.max_bytes,
        pattern: q.pattern.as_deref(),
        case_insensitive: q.case_insensitive,
        max_matches: q.max_matches,
    };
    let query = OutputQuery::from_fields(&fields).map_err(|e| Error::BadRequest {
        code: match e.code {
            ErrorCode::InvalidRange => ErrorCode::InvalidRange,
            ErrorCode::InvalidPattern => ErrorCode::InvalidPattern,
            _ => ErrorCode::InvalidField,
        },
        message: e.message,
        details: serde_json::Value::Null,
    })?;
    let size = live
        .as_ref()
        .map_or_else(|| (u16::try_from(row.rows).unwrap_or(32), u16::try_from(row.cols).unwrap_or(120)), |s| s.size());
    let source = Source { store: &app.store, id: &id, live: live.as_deref() };
    Ok(Json(match query.read(&source, size).await? {
        OutputRead::Page(p) => OutputView {
            output_range: [p.captured.from, p.captured.to],
            output_bytes: p.captured.bytes,
            output_missed_ranges: p.captured.missed_ranges,
            output: Some(p.captured.text),
            output_sha256: Some(p.captured.sha256),
            matches: None,
            next_from: p.next_from,
        },
        OutputRead::Search(f) => OutputView {
            output_range: [f.from, f.to],
            output_bytes: f.bytes,
            output_missed_ranges: f.missed_ranges,
            output: None,
            output_sha256: None,
            matches: Some(f.matches),
            next_from: f.next_from,
        },
    }))
}

/// Routes of this module that answer at once.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_sessions)).routes(routes!(get_session)).routes(routes!(read_output))
}

/// The streaming route (outside the request timeout).
pub fn stream_router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(stream_session))
}
