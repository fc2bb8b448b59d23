//! Invocations: freeze a call, read it back, cancel it.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Page;
use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use super::runs::owned_run;
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::harness::CancelOutcome;
use crate::invocation::{self, CallRequest};
use crate::state::InvocationStatus;
use crate::store::{CancelRequest, InvocationRow, json_col};

/// Body of `POST /v1/runs/{run_id}/invocations`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInvocation {
    /// The turn whose exposure showed the tool.
    pub turn_id: String,
    /// Tool id, or the exposure's `function_name` for it.
    pub tool_id: String,
    /// The model's call id (1–256 bytes, unique per run).
    #[schema(min_length = 1, max_length = 256)]
    pub tool_call_id: String,
    /// The tool input (an opaque document: checked against the tool's schema when frozen).
    #[schema(value_type = Object)]
    pub input: super::storable::JsonDocument,
}

/// A frozen invocation.
#[derive(Serialize, utoipa::ToSchema)]
pub struct InvocationView {
    /// `inv_…`
    pub invocation_id: String,
    /// The run.
    pub run_id: String,
    /// The turn.
    pub turn_id: String,
    /// Tool id.
    pub tool_id: String,
    /// Call id.
    pub tool_call_id: String,
    /// SHA-256 of the canonical `{"input", "tool_id"}` (RFC 8785).
    pub input_hash: String,
    /// Canonical input as frozen.
    #[schema(value_type = Object)]
    pub input: Value,
    /// `awaiting_approval|queued|running|completed|failed|denied|expired|cancelled|interrupted`.
    pub status: InvocationStatus,
    /// The approval request, when the call needs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// `{ok, output, error?}` when finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// Evidence produced.
    pub evidence_ids: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub finished_at: Option<String>,
    /// RFC 3339, when a cancel was asked while it ran (the result's `stop` says what it
    /// achieved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<String>,
}

/// Builds the view of a stored invocation.
pub fn view(row: InvocationRow, approval_id: Option<String>, evidence_ids: Vec<String>) -> Result<InvocationView> {
    Ok(InvocationView {
        input: json_col(&row.input)?,
        result: row.result.as_deref().map(json_col).transpose()?,
        invocation_id: row.id,
        run_id: row.run_id,
        turn_id: row.turn_id,
        tool_id: row.tool_id,
        tool_call_id: row.tool_call_id,
        input_hash: row.input_hash,
        status: row.status,
        approval_id,
        evidence_ids,
        created_at: row.created_at,
        updated_at: row.updated_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
        cancel_requested_at: row.cancel_requested_at,
    })
}

/// The view of a stored invocation with its approval and evidence ids.
pub async fn full_view(app: &App, row: InvocationRow) -> Result<InvocationView> {
    full_views(app, vec![row]).await?.pop().ok_or_else(|| Error::Internal("no invocation view".into()))
}

/// [`full_view`] of each of `rows`, in order, with one read of their approval and evidence
/// ids.
pub async fn full_views(app: &App, rows: Vec<InvocationRow>) -> Result<Vec<InvocationView>> {
    let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let links = app.store.invocation_links(&ids).await?;
    rows.into_iter().zip(links).map(|(row, (approval_id, evidence_ids))| view(row, approval_id, evidence_ids)).collect()
}

/// Freezes a call. 201 new; 200 idempotent replay of the same triple.
#[utoipa::path(post, path = "/v1/runs/{run_id}/invocations", tag = "invocations", params(("run_id" = String, Path)),
    request_body = CreateInvocation,
    responses((status = 201, body = InvocationView), (status = 200, body = InvocationView), (status = 404),
        (status = 409, description = "tool_call_id_conflict, or the failed ladder stage"), (status = 422, description = "input_invalid")),
    security(("bearer" = [])))]
pub async fn create_invocation(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
    Json(body): Json<CreateInvocation>,
) -> Result<(StatusCode, Json<InvocationView>)> {
    let (created, view) = freeze_call(&app, &user, &run_id, body).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view)))
}

/// Freezes a call in the caller's run `run_id`: `(true, view)` for a new invocation, `(false,
/// view)` for an idempotent replay of the same triple. Errors as `POST
/// /v1/runs/{run_id}/invocations` answers them (a failed ladder stage carries the tool's
/// ladder view in `details`). The HTTP route and the MCP server share it.
pub async fn freeze_call(
    app: &App,
    user: &AuthUser,
    run_id: &str,
    body: CreateInvocation,
) -> Result<(bool, InvocationView)> {
    let crate::app::FreezeScope { run, availability, workspace, existing_call } =
        app.freeze_scope(&user.user_id, user.is_admin, run_id, &body.tool_call_id).await?;
    let req =
        CallRequest { turn_id: body.turn_id, tool: body.tool_id, tool_call_id: body.tool_call_id, input: body.input.0 };
    let device = app.device_tools(&run, workspace.row());
    let scope = invocation::RunScope {
        run: &run,
        availability: &availability,
        workspace: &workspace,
        existing_call: existing_call.as_deref(),
        device: device.as_ref(),
    };
    let frozen = invocation::freeze(&app.freeze_stage(), &scope, &user.user_id, req).await.map_err(|e| {
        e.into_error(|n| {
            let view = super::tools::tool_view(&app.registry, &n.tool_id, &availability, Some(&n.exposure));
            serde_json::to_value(view).unwrap_or(Value::Null)
        })
    })?;
    let evidence_ids = if frozen.created { Vec::new() } else { app.store.evidence_ids_of(&frozen.row.id).await? };
    Ok((frozen.created, view(frozen.row, frozen.approval_id, evidence_ids)?))
}

/// `{"invocations": [...], "next_cursor"}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct InvocationList {
    /// Oldest first.
    pub invocations: Vec<InvocationView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// A run's invocations.
#[utoipa::path(get, path = "/v1/runs/{run_id}/invocations", tag = "invocations", params(("run_id" = String, Path), Page),
    responses((status = 200, body = InvocationList), (status = 404)), security(("bearer" = [])))]
pub async fn list_invocations(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<InvocationList>> {
    let run = owned_run(&app, &user, &run_id).await?;
    let limit = page.limit()?;
    let rows = app.store.list_invocations(&run.id, page.cursor.as_deref(), limit).await?;
    let next_cursor = Page::next_cursor(&rows, |r| r.id.clone());
    Ok(Json(InvocationList { invocations: full_views(&app, rows.rows).await?, next_cursor }))
}

/// Longest accepted `wait_ms` of `GET /v1/invocations/{id}`, in milliseconds (30 s).
pub const MAX_WAIT_MS: u64 = 30_000;

/// Query of `GET /v1/invocations/{invocation_id}`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParams {
    /// Wait up to this many milliseconds (0–30000) for the invocation to reach a final status
    /// or `awaiting_approval`, and answer as soon as it does; answered at once when it already
    /// is, or without the parameter. When the time runs out the current state is answered
    /// (200 either way: read `status`). Not a number or above 30000: 400 `invalid_query`.
    #[param(minimum = 0, maximum = 30000)]
    pub wait_ms: Option<u64>,
}

/// One invocation with its result and evidence ids.
///
/// With `wait_ms`, answered once it is final or awaits approval (woken by the run's committed
/// events, not by polling), or when `wait_ms` runs out.
#[utoipa::path(get, path = "/v1/invocations/{invocation_id}", tag = "invocations",
    params(("invocation_id" = String, Path), WaitParams),
    responses((status = 200, body = InvocationView), (status = 404)),
    security(("bearer" = [])))]
pub async fn get_invocation(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Query(params): Query<WaitParams>,
) -> Result<Json<InvocationView>> {
    let wait_ms = params.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(Error::BadRequest {
            code: ErrorCode::InvalidQuery,
            message: format!("wait_ms must be 0 to {MAX_WAIT_MS} (milliseconds)"),
            details: serde_json::json!({"parameter": "wait_ms", "max": MAX_WAIT_MS}),
        });
    }
    let row = wait_for(&app, &user.user_id, &id, std::time::Duration::from_millis(wait_ms), settled).await?;
    Ok(Json(full_view(&app, row).await?))
}

/// True when a waiter of `GET /v1/invocations/{id}?wait_ms` stops waiting.
fn settled(status: InvocationStatus) -> bool {
    status.is_final() || status == InvocationStatus::AwaitingApproval
}

/// Reads the caller's invocation until `done(status)` holds or `wait` elapses, and answers the
/// row last read. Subscribes to the event bus before each read, so a change committed in
/// between wakes it; re-reads only for events of its run that can change an invocation's
/// status. 404 `invocation` when it is not the caller's.
pub async fn wait_for(
    app: &App,
    user_id: &str,
    id: &str,
    wait: std::time::Duration,
    done: fn(InvocationStatus) -> bool,
) -> Result<InvocationRow> {
    use crate::events::EventKind;
    use crate::events::Heard;
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first read: nothing committed after the read is missed.
    let mut signals = (!wait.is_zero()).then(|| app.store.bus().subscribe());
    loop {
        let row = app.store.invocation_for(user_id, id).await?.ok_or(Error::NotFound("invocation"))?;
        let Some(rx) = signals.as_mut() else { return Ok(row) };
        if done(row.status) {
            return Ok(row);
        }
        loop {
            let signal = tokio::select! {
                () = tokio::time::sleep_until(deadline) => return Ok(row),
                signal = rx.recv() => signal,
            };
            match signal {
                Heard::Run(s)
                    if s.run_id == row.run_id
                        && matches!(
                            s.kind,
                            EventKind::ExecutionCompleted
                                | EventKind::ExecutionFailed
                                | EventKind::InvocationCancelled
                                | EventKind::ApprovalDenied
                                | EventKind::ApprovalExpired
                                | EventKind::ApprovalRequested
                        ) =>
                {
                    break;
                }
                Heard::Run(_) => {}
                // Signals may have been missed (lagged, or the cross-replica listener
                // reconnected): re-read.
                Heard::Resync => break,
                // The bus is gone (the server is stopping): answer what is stored.
                Heard::Closed => {
                    signals = None;
                    break;
                }
            }
        }
    }
}

/// Cancels an invocation that has not finished.
///
/// - Not started yet (awaiting approval or queued): it is `cancelled` (its pending approval
///   too) — 200.
/// - Running: the request is recorded (`invocation.cancel_requested`) and the call is stopped
///   as far as its commit point allows — 200 when it stopped before any side effect (the
///   final status is `cancelled`) or, for a tool that acts from its start (terminal, MCP),
///   when it was asked to stop (the final status is what it reports); 409 `already_running`
///   when it had already passed its commit point (an edit's rename): it finishes, and its
///   result notes the late request; 202 when it runs on another server, which applies the
///   request within about a second.
/// - Finished: 409 `invalid_state`.
#[utoipa::path(post, path = "/v1/invocations/{invocation_id}/cancel", tag = "invocations", params(("invocation_id" = String, Path)),
    responses((status = 200, body = InvocationView), (status = 202, body = InvocationView, description = "recorded; it runs on another server"),
        (status = 404), (status = 409, description = "already_running (past its commit point) or invalid_state (finished)")),
    security(("bearer" = [])))]
pub async fn cancel_invocation(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<InvocationView>)> {
    cancel(&app, &user, &id).await.map(|(status, view)| (status, Json(view)))
}

/// Cancels the caller's invocation `id` as `POST /v1/invocations/{id}/cancel` describes, and
/// answers its status code (200, or 202 when it runs on another server) with the invocation.
/// The HTTP route and the MCP server (a client's `notifications/cancelled`) share it.
pub async fn cancel(app: &App, user: &AuthUser, id: &str) -> Result<(StatusCode, InvocationView)> {
    let (row, cancelled) =
        app.store.cancel_invocation(&user.user_id, id, &user.token_id).await?.ok_or(Error::NotFound("invocation"))?;
    if cancelled {
        return Ok((StatusCode::OK, full_view(app, row).await?));
    }
    if row.status != InvocationStatus::Running {
        return Err(invalid_state(&row));
    }
    let row = match app.store.request_cancel(&user.user_id, id, &user.token_id).await? {
        None => return Err(Error::NotFound("invocation")),
        Some(CancelRequest::Recorded(row) | CancelRequest::AlreadyRequested(row)) => row,
        Some(CancelRequest::NotRunning(row)) => return Err(invalid_state(&row)),
    };
    let mut outcome = app.harness.cancel_running(id);
    if outcome == CancelOutcome::NotHere && row.claimed_by.as_deref() == Some(app.harness.node_id()) {
        // Claimed by this server a moment ago and not registered yet, or just finishing.
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            outcome = app.harness.cancel_running(id);
            if outcome != CancelOutcome::NotHere {
                break;
            }
            let now = app.store.invocation_for(&user.user_id, id).await?.ok_or(Error::NotFound("invocation"))?;
            if now.status != InvocationStatus::Running {
                return ended(app, now).await;
            }
        }
    }
    let mut row = app.store.invocation_for(&user.user_id, id).await?.ok_or(Error::NotFound("invocation"))?;
    if outcome == CancelOutcome::Finished {
        // The tool returned, possibly because it saw this very request (recorded above) before
        // its commit point: the answer follows what is stored once the result is in.
        for _ in 0..100 {
            if row.status != InvocationStatus::Running {
                return ended(app, row).await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            row = app.store.invocation_for(&user.user_id, id).await?.ok_or(Error::NotFound("invocation"))?;
        }
    }
    match outcome {
        CancelOutcome::Stopped | CancelOutcome::Interrupting => Ok((StatusCode::OK, full_view(app, row).await?)),
        CancelOutcome::TooLate => Err(already_running(&row)),
        CancelOutcome::Finished => Err(Error::conflict(
            ErrorCode::InvalidState,
            format!("invocation {} has finished running; its result is being stored and stands as it is", row.id),
            serde_json::json!({"status": row.status, "finished": true}),
        )),
        CancelOutcome::NotHere if row.status != InvocationStatus::Running => ended(app, row).await,
        CancelOutcome::NotHere => Ok((StatusCode::ACCEPTED, full_view(app, row).await?)),
    }
}

/// The answer to a cancel whose invocation ended while the request was being applied: 200
/// when it ended `cancelled` (the execution saw the recorded request before its commit
/// point, whoever's stop reached it first); 409 `already_running` when it completed with the
/// request noted as too late; else 409 `invalid_state`.
async fn ended(app: &App, row: InvocationRow) -> Result<(StatusCode, InvocationView)> {
    if row.status == InvocationStatus::Cancelled {
        return Ok((StatusCode::OK, full_view(app, row).await?));
    }
    // The execution saw the recorded request after its commit point and noted it in its
    // result: the answer says the same (409 `already_running`), not that it had finished.
    let too_late = row
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
        .is_some_and(|r| r["stop"]["outcome"] == "too_late");
    if too_late {
        return Err(already_running(&row));
    }
    Err(invalid_state(&row))
}

/// 409 `already_running`: `row` passed its commit point before the cancel reached it.
fn already_running(row: &InvocationRow) -> Error {
    Error::conflict(
        ErrorCode::AlreadyRunning,
        format!(
            "invocation {} has passed its commit point ({} was already making its change); it was not cancelled, and its result notes the request",
            row.id, row.tool_id
        ),
        serde_json::json!({"status": row.status, "cancel_requested_at": row.cancel_requested_at}),
    )
}

fn invalid_state(row: &InvocationRow) -> Error {
    Error::conflict(
        ErrorCode::InvalidState,
        format!("invocation {} is {} and can no longer be cancelled", row.id, row.status),
        serde_json::json!({"status": row.status}),
    )
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_invocation, list_invocations))
        .routes(routes!(get_invocation))
        .routes(routes!(cancel_invocation))
}
