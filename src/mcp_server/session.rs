//! One MCP session: bound to one run of its user, it answers `tools/list` with the run's
//! exposure and `tools/call` by freezing an invocation exactly as the HTTP API does
//! (docs/mcp-server.md).
//!
//! - **Binding.** `initialize` binds the session to the run named by the `run` query
//!   parameter of the `/mcp` URL (the caller's, else the session is refused), or to a new run
//!   titled after the client. The `task` query parameter (at most `--max-task-bytes`) is the
//!   ranking query until the client asks for another with [`FIND_TOOLS`].
//! - **`tools/list`** is the exposure of the session's current turn. A turn is started (and
//!   stored, as every turn is) when the session has none, or when the public available tools
//!   changed since its turn was computed; otherwise the current turn is listed again. With
//!   more than 20 candidates the list is the ranked 20 plus [`FIND_TOOLS`], a tool that takes
//!   a task, starts a turn ranked for it and sends `notifications/tools/list_changed`. MCP
//!   carries no task of its own: that tool and the `task` parameter are how one reaches the
//!   ranking.
//! - **`notifications/tools/list_changed`** is sent when the candidates change (an MCP server
//!   of the runtime's loses its connection, a connection is granted…): the session compares
//!   them with its turn's every [`WATCH_PERIOD`] and on every run event.
//! - **`tools/call`** freezes the call in the current turn (`tool_call_id`
//!   `mcp-<session tag>-<n>`). When it needs approval and the client supports form
//!   elicitation, the user is asked through it (tool, call id, input hash, the input);
//!   accepting grants exactly that triple, declining denies it. Whatever the client
//!   supports, it can be approved in the page or the API meanwhile. The call waits up to
//!   [`CALL_WAIT`] for a final status and answers the result with its evidence ids
//!   (`_meta["mira/invocation"]`); when the approval is still pending then, an error result
//!   names the approval, and calling the tool again with the same arguments in this session
//!   waits on the same invocation rather than freezing another. A call whose request carries a
//!   progress token hears `notifications/progress` every [`PROGRESS_EVERY`] while it waits
//!   (saying for which approval), so a client that resets its timeout on progress keeps
//!   waiting.
//! - **Cancellation.** A client's `notifications/cancelled` for a waiting call cancels its
//!   invocation as `POST /v1/invocations/{id}/cancel` does (what it achieved is recorded).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::RoleServer;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeRequestParams,
    InitializeResult, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, RequestId, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{SessionCounts, SessionSlot};
use crate::app::App;
use crate::error::{Error, ErrorCode};
use crate::exposure::{ExposedTool, Exposure, Strategy};
use crate::http::auth::AuthUser;
use crate::http::invocations::{self, CreateInvocation, InvocationView};
use crate::http::storable::JsonDocument;
use crate::state::{ApprovalRule, InvocationStatus};

/// The façade's own tool, listed beside a ranked exposure: `{"task": string, "context"?:
/// string}` → a turn ranked for that task becomes the session's.
pub const FIND_TOOLS: &str = "mira_find_tools";

/// Longest a turn of the session (`tools/list` after the candidates changed, `tools/call`,
/// `mira_find_tools`) waits for one of its user's `--max-turns-per-user` places to free
/// before answering `too_many_turns`: MCP clients do not retry a refused listing, and a user
/// may run more agents than places, all re-listing at once after a registry change.
pub const TURN_PLACE_WAIT: Duration = Duration::from_secs(10);

/// How often a session compares the candidates with its turn's (besides run events).
pub const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// Longest a `tools/call` waits for its invocation to finish (including its approval) before
/// answering an error that names the pending approval: under the 60 s request timeout of
/// the common MCP client SDKs.
pub const CALL_WAIT: Duration = Duration::from_secs(50);

/// How often a waiting call sends `notifications/progress` when its request carried a
/// progress token.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Most bytes of the input and its preview an elicitation shows, whole: a larger call is not
/// asked about through elicitation (nothing of a call is ever cut from what a person approves
/// there); it waits for the page or the API, which show it all.
const ELICIT_INPUT_BYTES: usize = 32 * 1024;

/// Longest a waiting call whose request was cancelled waits to hear the client's
/// `notifications/cancelled` for it (handled right after rmcp cancels the request); not heard
/// by then, the cancel came from the session ending or the server stopping.
const CANCEL_HEARD_WAIT: Duration = Duration::from_secs(1);

/// Most request ids of a client's `notifications/cancelled` a session keeps until a waiting
/// call reads them (ids of requests not waiting are kept too, the oldest forgotten first).
const MAX_CANCELS_HEARD: usize = 64;

/// Most fields of the input an elicitation lists ([`elicit_input`]); an input with more is
/// not asked about there.
const ELICIT_FIELDS: usize = 24;

/// Most calls of one session waiting at once; one more is an error result.
pub const MAX_CALLS_IN_FLIGHT: usize = 8;

/// Most calls of one session remembered for rejoining ([`CALL_WAIT`]); past it the oldest is
/// forgotten (calling it again then freezes a new invocation).
pub const MAX_REMEMBERED_CALLS: usize = 64;

/// Query parameters of the `/mcp` URL read at `initialize`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BindParams {
    /// An existing run of the caller's to bind to.
    run: Option<String>,
    /// The ranking query of the first turn.
    task: Option<String>,
}

/// A session's binding, fixed at `initialize`.
struct Bound {
    user_id: String,
    run_id: String,
    task: String,
    turn: Option<Turn>,
    /// Calls not known to be final, by the SHA-256 of (function name, arguments): a repeated
    /// call waits on the same invocation. An entry is made before the freeze, and the freeze
    /// runs inside it ([`tokio::sync::OnceCell::get_or_try_init`]), so a second identical call
    /// sent while the first is freezing waits for that freeze instead of making its own, and a
    /// call that fails after its freeze leaves the invocation to rejoin. Forgotten when a call
    /// answers its final result (or the client cancels it); at most [`MAX_REMEMBERED_CALLS`],
    /// the oldest forgotten first.
    pending: HashMap<[u8; 32], Arc<tokio::sync::OnceCell<String>>>,
    pending_order: std::collections::VecDeque<[u8; 32]>,
    _slot: SessionSlot,
}

/// The session's current turn.
#[derive(Clone)]
struct Turn {
    id: String,
    exposure: Arc<Exposure>,
    /// The candidates it was computed from ([`candidate_key`]).
    candidates: String,
}

/// One MCP session's handler (rmcp creates one per session).
pub struct Session {
    app: App,
    counts: Arc<SessionCounts>,
    /// Distinguishes this session's call ids from other sessions' in the same run.
    tag: String,
    calls: AtomicU64,
    /// Calls waiting now ([`MAX_CALLS_IN_FLIGHT`]).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Set once the list watcher runs (a repeated `notifications/initialized` starts none).
    watching: std::sync::atomic::AtomicBool,
    bound: Arc<Mutex<Option<Bound>>>,
    /// The requests the client cancelled ([`Session::stopped`]).
    cancels: CancelsHeard,
    /// Wakes the list watcher's end when the session is dropped.
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl Session {
    /// A session not bound yet (bound at `initialize`).
    pub fn new(app: App, counts: Arc<SessionCounts>) -> Self {
        let stop = CancellationToken::new();
        // The random tail of a UUIDv7 (its head is the time, shared by sessions of one ms).
        let id = crate::ids::new_id("s");
        let tag = id[id.len().saturating_sub(12)..].to_owned();
        Self {
            app,
            counts,
            tag,
            calls: AtomicU64::new(0),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_CALLS_IN_FLIGHT)),
            watching: std::sync::atomic::AtomicBool::new(false),
            bound: Arc::new(Mutex::new(None)),
            cancels: CancelsHeard::default(),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        }
    }

    /// The authenticated caller of this request (put there by [`super::authenticate`]).
    fn caller(ctx_ext: &rmcp::model::Extensions) -> Result<AuthUser, McpError> {
        ctx_ext
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<AuthUser>())
            .cloned()
            .ok_or_else(|| McpError::invalid_request("the request carries no authenticated user", None))
    }

    /// The caller, who must be the user the session was bound to.
    async fn bound_caller(&self, ext: &rmcp::model::Extensions) -> Result<(AuthUser, String), McpError> {
        let user = Self::caller(ext)?;
        let guard = self.bound.lock().await;
        let bound = guard.as_ref().ok_or_else(|| McpError::invalid_request("the session is not initialized", None))?;
        if bound.user_id != user.user_id {
            return Err(McpError::invalid_request("this session belongs to another user", None));
        }
        Ok((user, bound.run_id.clone()))
    }

    /// The session's current turn: the stored one while the candidates are the ones it was
    /// computed from, else a new turn for the session's task (or `task` when given, which
    /// becomes the session's task).
    async fn turn(&self, task: Option<(&str, Option<&str>)>) -> Result<Turn, Error> {
        let (user_id, run_id, session_task, current) = {
            let guard = self.bound.lock().await;
            let b = guard.as_ref().ok_or(Error::NotFound("session"))?;
            (b.user_id.clone(), b.run_id.clone(), b.task.clone(), b.turn.clone())
        };
        let run = self.app.store.run_for(&user_id, &run_id).await?.ok_or(Error::NotFound("run"))?;
        let candidates = candidate_key(&self.app, &run).await?;
        if task.is_none()
            && let Some(turn) = current.filter(|t| t.candidates == candidates)
        {
            return Ok(turn);
        }
        let (task, context) = task.unwrap_or((&session_task, None));
        let place = self.app.turn_limit.acquire(&user_id, TURN_PLACE_WAIT).await?;
        let view = crate::http::runs::start_turn(&self.app, &run, task, context, place).await?;
        let exposure: Exposure = serde_json::from_value(view.exposure).map_err(|e| Error::Internal(e.to_string()))?;
        let turn = Turn { id: view.turn_id, exposure: Arc::new(exposure), candidates };
        let mut guard = self.bound.lock().await;
        if let Some(b) = guard.as_mut() {
            b.task = task.to_owned();
            b.turn = Some(turn.clone());
        }
        Ok(turn)
    }

    /// `mira_find_tools`: a turn ranked for the given task becomes the session's.
    async fn find_tools(&self, args: &JsonObject, peer: &Peer<RoleServer>) -> Result<CallToolResult, Error> {
        let text = |name: &str| match args.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.contains('\0') => {
                Err(Error::invalid_field(name, crate::http::storable::NUL_MESSAGE))
            }
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(Error::invalid_field(name, format!("{name} must be a string"))),
        };
        let task = text("task")?.ok_or_else(|| Error::invalid_field("task", "task is required"))?;
        let context = text("context")?;
        let turn = self.turn(Some((task, context))).await?;
        // The client re-lists: the new turn is what it sees.
        let _ = peer.notify_tool_list_changed().await;
        let names: Vec<&str> = turn.exposure.tools.iter().map(|t| t.function_name.as_str()).collect();
        let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
            "Turn {} ranked {} of {} tools for this task; the tool list now holds: {}",
            turn.id,
            names.len(),
            turn.exposure.candidate_count,
            names.join(", ")
        ))]);
        result.structured_content = Some(json!({"turn_id": turn.id, "tools": names}));
        Ok(result)
    }

    /// `tools/call` of an exposed tool: freeze (or rejoin the same pending call), get it
    /// decided, wait for its result.
    async fn call(
        &self,
        user: &AuthUser,
        run_id: &str,
        name: &str,
        args: JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, Error> {
        let key = call_key(name, &args)?;
        let deadline = tokio::time::Instant::now() + CALL_WAIT;
        let entry = self.remember(key).await?;
        let mut frozen = None;
        let freeze = entry.get_or_try_init(|| async {
            let turn = tokio::time::timeout_at(deadline, self.turn(None)).await.map_err(|_| Error::Unavailable {
                code: ErrorCode::RequestTimeout,
                message: format!("ranking the call's turn took longer than {} s", CALL_WAIT.as_secs()),
            })??;
            let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
            let body = CreateInvocation {
                turn_id: turn.id,
                tool_id: name.to_owned(),
                tool_call_id: format!("mcp-{}-{n}", self.tag),
                input: JsonDocument(Value::Object(args)),
            };
            let view = invocations::freeze_call(&self.app, user, run_id, body).await?.1;
            let id = view.invocation_id.clone();
            frozen = Some(view);
            Ok::<_, Error>(id)
        });
        // The freeze is never dropped half-way (its write commits in a group commit whatever
        // its caller does): a cancel that comes meanwhile is seen by the wait below, which
        // cancels the frozen invocation. Only the turn before it is bounded by the call's wait.
        let id = match freeze.await {
            Ok(id) => id.clone(),
            Err(e) => {
                // A call that was never frozen leaves no entry to push out live ones.
                if entry.get().is_none() {
                    self.forget(key, &entry).await;
                }
                return Err(e);
            }
        };
        let mut view = match frozen {
            Some(view) => view,
            None => {
                let row = invocations::wait_for(&self.app, &user.user_id, &id, Duration::ZERO, |_| true).await?;
                invocations::full_view(&self.app, row).await?
            }
        };
        let mut asked = false;
        let mut waited: u32 = 0;
        loop {
            if view.status.is_final() {
                break;
            }
            if view.status == InvocationStatus::AwaitingApproval && !asked {
                asked = true;
                if let Some(approval_id) = &view.approval_id {
                    self.ask(user, approval_id, &view, ctx, deadline).await?;
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let awaiting = view.status == InvocationStatus::AwaitingApproval;
            let done: fn(InvocationStatus) -> bool =
                if awaiting { |s| s != InvocationStatus::AwaitingApproval } else { InvocationStatus::is_final };
            // With a progress token, the client hears every PROGRESS_EVERY that the call is
            // still waiting (and why), so a client that resets its timeout on progress keeps it.
            let token = ctx.meta.get_progress_token();
            let slice = if token.is_some() { left.min(PROGRESS_EVERY) } else { left };
            let wait = invocations::wait_for(&self.app, &user.user_id, &view.invocation_id, slice, done);
            let row = tokio::select! {
                row = wait => row?,
                () = ctx.ct.cancelled() => return Err(self.stopped(user, &view.invocation_id, (key, &entry), &ctx.id).await),
            };
            view = invocations::full_view(&self.app, row).await?;
            if let Some(token) = token
                && !view.status.is_final()
            {
                waited += 1;
                let why = match view.status {
                    InvocationStatus::AwaitingApproval => {
                        format!("waiting for approval {}", view.approval_id.as_deref().unwrap_or("?"))
                    }
                    status => format!("invocation {} is {status}", view.invocation_id),
                };
                let note = ProgressNotificationParam::new(token, f64::from(waited)).with_message(why);
                let _ = ctx.peer.notify_progress(note).await;
            }
        }
        if view.status.is_final() {
            self.forget(key, &entry).await;
        }
        Ok(result_of(&view))
    }

    /// Whether the token of the `tools/call` a grant through elicitation is recorded with is
    /// still valid: the answer comes in another request (whose token rmcp shows nobody), and
    /// a grant is never recorded under a revoked token.
    async fn token_still_valid(&self, user: &AuthUser) -> bool {
        self.app.token_watch.still_valid(&user.token_id).await
    }

    /// The rejoin entry of call `key` ([`Bound::pending`]), made now when there is none.
    async fn remember(&self, key: [u8; 32]) -> Result<Arc<tokio::sync::OnceCell<String>>, Error> {
        let mut guard = self.bound.lock().await;
        let b = guard.as_mut().ok_or(Error::NotFound("session"))?;
        if let Some(entry) = b.pending.get(&key) {
            return Ok(Arc::clone(entry));
        }
        let entry = Arc::new(tokio::sync::OnceCell::new());
        b.pending.insert(key, Arc::clone(&entry));
        b.pending_order.push_back(key);
        while b.pending_order.len() > MAX_REMEMBERED_CALLS {
            if let Some(old) = b.pending_order.pop_front() {
                b.pending.remove(&old);
            }
        }
        Ok(entry)
    }

    /// Forgets the rejoin entry of call `key` when it is still `entry` (not one made since).
    async fn forget(&self, key: [u8; 32], entry: &Arc<tokio::sync::OnceCell<String>>) {
        let mut guard = self.bound.lock().await;
        if let Some(b) = guard.as_mut()
            && b.pending.get(&key).is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            b.pending.remove(&key);
            b.pending_order.retain(|k| *k != key);
        }
    }

    /// A waiting call's request was cancelled. Only a client's `notifications/cancelled` for
    /// it ([`ServerHandler::on_cancelled`], heard within [`CANCEL_HEARD_WAIT`]) cancels the
    /// invocation, as `POST /v1/invocations/{id}/cancel` would, and forgets it; the server
    /// stopping or the session ending (rmcp cancels every request then) leaves the invocation
    /// as it is, still decidable in the page and rejoinable — nobody asked to cancel it.
    async fn stopped(
        &self,
        user: &AuthUser,
        invocation_id: &str,
        (key, entry): ([u8; 32], &Arc<tokio::sync::OnceCell<String>>),
        request: &RequestId,
    ) -> Error {
        let by_client = !self.app.shutdown.is_cancelled() && self.cancels.heard(request, CANCEL_HEARD_WAIT).await;
        if by_client {
            let outcome = invocations::cancel(&self.app, user, invocation_id).await;
            tracing::info!(invocation = %invocation_id, ok = outcome.is_ok(), "MCP client cancelled its call");
            self.forget(key, entry).await;
            Error::conflict(
                ErrorCode::InvalidState,
                "the client cancelled the call",
                json!({"invocation_id": invocation_id}),
            )
        } else {
            Error::Unavailable {
                code: ErrorCode::ServerStopping,
                message: "the session or the server ended while the call waited; the invocation is left as it is"
                    .to_owned(),
            }
        }
    }

    /// Asks the user through form elicitation to approve the exact call, when the client
    /// supports it and the caller may decide it (its token holds the `approve` scope, and not
    /// a four-eyes approval). Accepting grants the frozen triple; declining denies it;
    /// anything else leaves it pending. A token without `approve` (an agent's `plan` token)
    /// is never asked: the call waits for a decision in the page or the API, as for a client
    /// without elicitation.
    async fn ask(
        &self,
        user: &AuthUser,
        approval_id: &str,
        view: &InvocationView,
        ctx: &RequestContext<RoleServer>,
        deadline: tokio::time::Instant,
    ) -> Result<(), Error> {
        use rmcp::service::{ElicitationError, ElicitationMode};
        // The decider needs the `approve` scope: without it nothing is asked, so no answer of
        // this session's client can decide the approval.
        let Ok(decider) = user.decider() else {
            return Ok(());
        };
        if !ctx.peer.supported_elicitation_modes().contains(&ElicitationMode::Form) {
            return Ok(());
        }
        let Some(approval) = self.app.store.approval_visible(&user.viewer(), approval_id).await? else {
            return Ok(());
        };
        if approval.rule() == ApprovalRule::FourEyes {
            return Ok(());
        }
        let declared: Vec<String> = self
            .app
            .registry
            .get(&view.tool_id, &user.user_id)
            .and_then(|e| {
                e.spec().input_schema.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect())
            })
            .unwrap_or_default();
        // The preview (what the approval page shows: a diff, a mail's decoded body…) comes
        // with the input, both whole: an input that holds its content only encoded (a mail's
        // MIME bytes in base64) or by hash is read from the preview.
        let preview: Option<Value> = approval.preview.as_deref().and_then(|p| serde_json::from_str(p).ok());
        let shown = elicit_input(&view.input, &declared).and_then(|input| match &preview {
            None => Some((input, String::new())),
            Some(p) => elicit_input(p, &[])
                .filter(|p| input.len() + p.len() <= ELICIT_INPUT_BYTES)
                .map(|p| (input, format!("\n\npreview (as the approval page shows it):\n{p}"))),
        });
        let Some((input, preview)) = shown else {
            tracing::info!(
                approval = approval_id,
                "not asked through elicitation: the input and its preview are too large to show whole"
            );
            return Ok(());
        };
        // Characters that print as nothing or reorder the text are written as `\u{XXXX}`, so
        // the person reads the call's bytes (the lines' own newlines stay).
        let (body, escaped) = crate::workspace::lookalike::escape_text(
            &format!(
                "tool: {}\ncall id: {}\ninput hash: {}\napproval: {}\n\ninput:\n{input}{preview}",
                view.tool_id, view.tool_call_id, view.input_hash, approval_id
            ),
            &['\n'],
        );
        let warning = if escaped {
            "\n\n⚠ This call contains invisible or direction-changing characters, shown escaped as \\u{…}."
        } else {
            ""
        };
        let message = format!("Approve this exact call?{warning}\n\n{body}");
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let answer = tokio::select! {
            answer = ctx.peer.elicit_with_timeout::<ApprovalAnswer>(message, Some(left)) => answer,
            () = ctx.ct.cancelled() => return Ok(()),
        };
        let triple = crate::store::GrantRequest {
            tool_id: &view.tool_id,
            tool_call_id: &view.tool_call_id,
            input_hash: &view.input_hash,
        };
        match answer {
            Ok(Some(ApprovalAnswer { approve: true })) if !self.token_still_valid(user).await => {
                tracing::info!(
                    approval = approval_id,
                    "grant through elicitation refused: the call's token was revoked"
                );
            }
            Ok(Some(ApprovalAnswer { approve: true })) => {
                match crate::approval::grant(
                    &self.app.store,
                    &self.app.registry,
                    &decider,
                    approval_id,
                    &triple,
                    &*self.app.harness,
                )
                .await
                {
                    Ok((granted, claimed, slot)) => {
                        let owner = granted.owner_id.clone();
                        let handoff = crate::harness::Handoff { prepared_in: None, granted: Some(granted) };
                        self.app.harness.start_claimed(claimed, handoff, slot, &owner);
                    }
                    // Decided meanwhile (in the page) or expired: the wait reads what happened.
                    Err(e) => tracing::info!(approval = approval_id, error = %e, "grant through elicitation refused"),
                }
            }
            Ok(Some(ApprovalAnswer { approve: false })) | Err(ElicitationError::UserDeclined) => {
                let reason = "declined in the MCP client";
                if let Err(e) = crate::approval::deny(&self.app.store, &decider, approval_id, Some(reason)).await {
                    tracing::info!(approval = approval_id, error = %e, "deny through elicitation refused");
                }
            }
            Ok(None) | Err(_) => {}
        }
        Ok(())
    }
}

/// The request ids of a session's client `notifications/cancelled`, kept until a waiting
/// call takes its own ([`Session::stopped`]).
#[derive(Default)]
struct CancelsHeard {
    ids: parking_lot::Mutex<std::collections::VecDeque<RequestId>>,
    heard: tokio::sync::Notify,
}

impl CancelsHeard {
    /// The client cancelled request `id`.
    fn hear(&self, id: RequestId) {
        let mut ids = self.ids.lock();
        if ids.len() >= MAX_CANCELS_HEARD {
            ids.pop_front();
        }
        ids.push_back(id);
        drop(ids);
        self.heard.notify_waiters();
    }

    /// Whether the client cancelled request `id`, waiting up to `within` to hear it; the id
    /// is taken.
    async fn heard(&self, id: &RequestId, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.heard.notified();
            tokio::pin!(notified);
            // Registered before the look: a cancel heard in between still wakes this wait.
            notified.as_mut().enable();
            if self.take(id) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.take(id);
            }
        }
    }

    fn take(&self, id: &RequestId) -> bool {
        let mut ids = self.ids.lock();
        let found = ids.iter().position(|i| i == id);
        found.map(|at| ids.remove(at)).is_some()
    }
}

/// The rejoin key of a call: SHA-256 of the function name and the arguments' JSON (object keys
/// sorted, as serde_json's map keeps them).
fn call_key(name: &str, args: &JsonObject) -> Result<[u8; 32], Error> {
    use sha2::{Digest, Sha256};
    let json = serde_json::to_vec(args).map_err(|e| Error::Internal(e.to_string()))?;
    let mut hash = Sha256::new();
    hash.update((name.len() as u64).to_le_bytes());
    hash.update(name.as_bytes());
    hash.update(&json);
    Ok(hash.finalize().into())
}

/// The input as an elicitation shows it: one `field: value` line per member (its JSON) — the
/// fields the tool's schema declares (`declared`) first, then any others; within each,
/// shortest value first (so a long text never pushes the path or the flags out of view). A
/// field name that is not plain (letters, digits, `_`, `-`, `.`) is shown quoted and escaped,
/// so no name can forge a line. None when the input cannot be shown whole: more than
/// [`ELICIT_FIELDS`] fields or more than [`ELICIT_INPUT_BYTES`] of text.
fn elicit_input(input: &Value, declared: &[String]) -> Option<String> {
    let text = match input {
        Value::Object(map) if map.len() <= ELICIT_FIELDS => {
            let mut fields: Vec<(&String, String)> = map.iter().map(|(k, v)| (k, v.to_string())).collect();
            fields.sort_by_key(|(k, v)| (!declared.contains(k), v.len(), (*k).clone()));
            let plain =
                |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            let lines: Vec<String> = fields
                .iter()
                .map(|(k, v)| if plain(k) { format!("{k}: {v}") } else { format!("{k:?}: {v}") })
                .collect();
            lines.join("\n")
        }
        Value::Object(_) => return None,
        other => other.to_string(),
    };
    (text.len() <= ELICIT_INPUT_BYTES).then_some(text)
}

/// The form an approval elicitation asks for.
#[derive(Deserialize, schemars::JsonSchema)]
struct ApprovalAnswer {
    /// True to approve exactly this call (tool, call id, input hash), false to deny it.
    approve: bool,
}
rmcp::elicit_safe!(ApprovalAnswer);

/// The candidates of `run` now, as a comparable key: the SHA-256 of the surface version and
/// each public available tool's id, description, input schema and approval flag, in id order
/// (so a changed definition counts as a change, as a new or lost tool does).
async fn candidate_key(app: &App, run: &crate::store::RunRow) -> Result<String, Error> {
    use sha2::{Digest, Sha256};
    let ctx = app.run_availability_context(&run.owner_id, run).await?;
    let mut candidates = crate::exposure::candidates(&app.registry, &ctx);
    candidates.sort_unstable_by(|a, b| a.spec().id.cmp(&b.spec().id));
    let mut hash = Sha256::new();
    hash.update(crate::surface::SURFACE_VERSION.as_bytes());
    for c in &candidates {
        let spec = c.spec();
        for part in [spec.id.as_str(), spec.description.as_str(), &spec.input_schema.to_string()] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        hash.update([u8::from(spec.requires_approval)]);
    }
    Ok(hex::encode(hash.finalize()))
}

/// An exposed tool as MCP lists it: the function name, title, description and input schema
/// as the turn stored them; `_meta["mira/tool"]` gives the registry id and whether each call
/// waits for an approval.
fn mcp_tool(t: &ExposedTool) -> Tool {
    let schema = match &t.input_schema {
        Value::Object(o) => o.clone(),
        _ => JsonObject::new(),
    };
    let mut tool = Tool::new(t.function_name.clone(), t.description.clone(), Arc::new(schema));
    tool.title = Some(t.title.clone());
    let mut annotations = ToolAnnotations::default();
    annotations.title = Some(t.title.clone());
    tool.annotations = Some(annotations);
    let mut meta = JsonObject::new();
    meta.insert("mira/tool".into(), json!({"id": t.id, "requires_approval": t.requires_approval}));
    tool.meta = Some(MetaObject(meta));
    tool
}

/// [`FIND_TOOLS`] as listed.
fn find_tools_tool(candidates: usize) -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "What you are trying to do now, in a sentence or two."},
            "context": {"type": "string", "description": "Optional context for ranking (the open file, recent calls)."}
        },
        "required": ["task"],
        "additionalProperties": false
    });
    let schema = match schema {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    };
    Tool::new(
        FIND_TOOLS,
        format!(
            "The tool list shows 20 of the {candidates} tools available. Describe your task to get the 20 that fit it best; the tool list then changes to them."
        ),
        Arc::new(schema),
    )
}

/// The MCP result of a settled (or still waiting) invocation: a completed call's output as
/// text (and as structured content when it is an object); any other status an error naming
/// it. `_meta["mira/invocation"]` carries the invocation, its call id, input hash, status,
/// approval and evidence ids.
fn result_of(view: &InvocationView) -> CallToolResult {
    let meta = json!({
        "invocation_id": view.invocation_id,
        "tool_id": view.tool_id,
        "tool_call_id": view.tool_call_id,
        "input_hash": view.input_hash,
        "status": view.status,
        "approval_id": view.approval_id,
        "evidence_ids": view.evidence_ids,
    });
    let ok = view.status == InvocationStatus::Completed
        && view.result.as_ref().and_then(|r| r.get("ok")).and_then(Value::as_bool) == Some(true);
    let mut result = if ok {
        let output = view.result.as_ref().and_then(|r| r.get("output")).cloned().unwrap_or(Value::Null);
        let text = match &output {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
        if output.is_object() {
            r.structured_content = Some(output);
        }
        r
    } else {
        let text = match view.status {
            InvocationStatus::AwaitingApproval => format!(
                "Approval {} is pending for invocation {} ({} call {}, input hash {}). It is decided in the Mira page (or with POST /v1/approvals/{}/grant by whoever may decide it); then call this tool again with the same arguments to receive its result.",
                view.approval_id.as_deref().unwrap_or("?"),
                view.invocation_id,
                view.tool_id,
                view.tool_call_id,
                view.input_hash,
                view.approval_id.as_deref().unwrap_or("?"),
            ),
            InvocationStatus::Queued | InvocationStatus::Running => format!(
                "Invocation {} is still {}; call this tool again with the same arguments to receive its result.",
                view.invocation_id, view.status
            ),
            status => match view.result.as_ref().and_then(|r| r.get("error")).filter(|e| !e.is_null()) {
                Some(error) => format!("Invocation {} ended {status}: {error}", view.invocation_id),
                None => format!("Invocation {} ended {status}.", view.invocation_id),
            },
        };
        CallToolResult::error(vec![ContentBlock::text(text)])
    };
    let mut m = JsonObject::new();
    m.insert("mira/invocation".into(), meta);
    result.meta = Some(MetaObject(m));
    result
}

/// An error as a tool error result: the API's error body as text.
fn error_result(e: &Error) -> CallToolResult {
    let body = serde_json::to_string(&e.body()).unwrap_or_else(|_| e.to_string());
    CallToolResult::error(vec![ContentBlock::text(body)])
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("mira", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Tools of the Mira Tool Runtime. Calls that change things wait for a person's approval of the exact call; results carry their evidence ids.",
            )
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let user = Self::caller(&context.extensions)?;
        let params = context
            .extensions
            .get::<axum::http::request::Parts>()
            .map(|p| axum::extract::Query::<BindParams>::try_from_uri(&p.uri))
            .transpose()
            .map_err(|e| McpError::invalid_params(format!("the /mcp query: {e}"), None))?
            .map(|q| q.0)
            .unwrap_or_default();
        let task = params.task.unwrap_or_default();
        if task.contains('\0') || params.run.as_deref().is_some_and(|r| r.contains('\0')) {
            return Err(McpError::invalid_params(crate::http::storable::NUL_MESSAGE, None));
        }
        if task.len() > self.app.config.max_task_bytes {
            return Err(McpError::invalid_params(
                format!("task is {} bytes; the limit is {}", task.len(), self.app.config.max_task_bytes),
                None,
            ));
        }
        let mut guard = self.bound.lock().await;
        if guard.is_some() {
            return Err(McpError::invalid_request("the session is already initialized", None));
        }
        let slot = self.counts.take(&user.user_id).ok_or_else(|| {
            McpError::invalid_request(
                format!(
                    "you have {} MCP sessions open, the most allowed; close one first",
                    super::MAX_SESSIONS_PER_USER
                ),
                None,
            )
        })?;
        let run = match &params.run {
            Some(id) => self.app.store.run_for(&user.user_id, id).await.map_err(internal)?,
            None => {
                let workspace = self.app.store.default_workspace().await.map_err(internal)?;
                match workspace {
                    Some(ws) => {
                        let name: String =
                            request.client_info.name.chars().filter(|c| !c.is_control()).take(120).collect();
                        let title = format!("MCP: {name}");
                        Some(
                            self.app
                                .store
                                .create_run(&user.user_id, &ws.id, ws.device_id.as_deref(), Some(&title), None)
                                .await
                                .map_err(internal)?,
                        )
                    }
                    None => None,
                }
            }
        }
        .ok_or_else(|| McpError::invalid_params("run not found (or no default workspace to open one in)", None))?;
        *guard = Some(Bound {
            user_id: user.user_id,
            run_id: run.id.clone(),
            task,
            turn: None,
            pending: HashMap::new(),
            pending_order: std::collections::VecDeque::new(),
            _slot: slot,
        });
        drop(guard);
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        let mut meta = JsonObject::new();
        meta.insert("mira/run".into(), json!({"run_id": run.id}));
        result.meta = Some(MetaObject(meta));
        Ok(result)
    }

    async fn on_cancelled(
        &self,
        notification: rmcp::model::CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        if let Some(id) = notification.request_id {
            self.cancels.hear(id);
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(run) = self.bound.lock().await.as_ref().map(|b| (b.user_id.clone(), b.run_id.clone())) else { return };
        tokio::spawn(watch(self.app.clone(), Arc::clone(&self.bound), run, context.peer, self.stop.clone()));
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.bound_caller(&context.extensions).await?;
        let turn = self.turn(None).await.map_err(mcp_error)?;
        let mut tools: Vec<Tool> = turn.exposure.tools.iter().map(mcp_tool).collect();
        if turn.exposure.strategy != Strategy::All {
            tools.push(find_tools_tool(turn.exposure.candidate_count));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (user, run_id) = self.bound_caller(&context.extensions).await?;
        let args = request.arguments.unwrap_or_default();
        if request.name.contains('\0') {
            return Err(McpError::invalid_params(crate::http::storable::NUL_MESSAGE, None));
        }
        let result = if request.name == FIND_TOOLS {
            self.find_tools(&args, &context.peer).await
        } else {
            match Arc::clone(&self.in_flight).try_acquire_owned() {
                Ok(_place) => self.call(&user, &run_id, &request.name, args, &context).await,
                Err(_) => Err(Error::TooManyRequests {
                    code: ErrorCode::TooManyStreams,
                    message: format!(
                        "this session has {MAX_CALLS_IN_FLIGHT} calls waiting, the most it may; wait for one to finish"
                    ),
                }),
            }
        };
        Ok(result.unwrap_or_else(|e| error_result(&e)).into())
    }
}

/// Sends `notifications/tools/list_changed` when the candidates of the session's run differ
/// from those of its current turn: checked every [`WATCH_PERIOD`] and on the run's events;
/// one notification per change. Ends with the session (`stop`) or its transport.
async fn watch(
    app: App,
    bound: Arc<Mutex<Option<Bound>>>,
    (user_id, run_id): (String, String),
    peer: Peer<RoleServer>,
    stop: CancellationToken,
) {
    let mut bus = app.store.bus().subscribe();
    let mut notified: Option<String> = None;
    // One ticker for the whole watch: other runs' events never put the periodic check off.
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            heard = bus.recv() => match heard {
                crate::events::Heard::Run(s) if s.run_id != run_id => continue,
                crate::events::Heard::Closed => return,
                _ => {}
            },
        }
        if peer.is_transport_closed() {
            return;
        }
        let Ok(Some(run)) = app.store.run_for(&user_id, &run_id).await else { continue };
        let Ok(now) = candidate_key(&app, &run).await else { continue };
        let listed = bound.lock().await.as_ref().and_then(|b| b.turn.as_ref().map(|t| t.candidates.clone()));
        let Some(listed) = listed else { continue };
        if listed != now && notified.as_deref() != Some(&now) {
            if peer.notify_tool_list_changed().await.is_err() {
                return;
            }
            notified = Some(now);
        }
    }
}

fn internal(e: impl std::fmt::Display) -> McpError {
    tracing::error!(error = %e, "MCP session");
    McpError::internal_error("the store failed", None)
}

/// A JSON-RPC error for an error of the catalogue, `data.code` its stable code: a refusal of
/// the request (4xx: a run gone, a task too large, a user's turns all taken) is not a fault of
/// the server, so only 5xx answers are `internal_error`.
fn mcp_error(e: Error) -> McpError {
    let status = e.code().status();
    let body = e.body();
    let data = Some(json!({"code": body.error.code, "status": status}));
    match status {
        400..=499 => McpError::invalid_request(body.error.message, data),
        _ => McpError::internal_error(body.error.message, data),
    }
}
