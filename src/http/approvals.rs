//! Approvals: the inbox, grant (echoing the exact triple) and deny.
//!
//! Every user sees and decides their own approvals. When a deployment requires four-eyes
//! for a tool domain (`--four-eyes-domains`), such approvals are also visible to every admin
//! and approver, who may grant or deny them; their requester may only deny (withdraw) them,
//! and gets 403 `four_eyes_required` on a grant. To anyone else they stay 404.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::approval;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::harness::Handoff;
use crate::state::{ApprovalRule, ApprovalStatus, InvocationStatus};
use crate::store::{ApprovalRow, GrantRequest, Viewer, json_col};

/// The frozen invocation an approval is about.
#[derive(Serialize, utoipa::ToSchema)]
pub struct FrozenCall {
    /// `inv_…`
    pub invocation_id: String,
    /// Turn.
    pub turn_id: String,
    /// Tool id.
    pub tool_id: String,
    /// Call id.
    pub tool_call_id: String,
    /// Input hash.
    pub input_hash: String,
    /// Canonical input: what will run, exactly.
    #[schema(value_type = Object)]
    pub input: Value,
    /// Invocation status.
    pub status: InvocationStatus,
}

/// The user who froze the call an approval is about.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Requester {
    /// `usr_…`
    pub user_id: String,
    /// User name.
    pub name: String,
}

/// An approval request with the whole frozen invocation.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    /// `apr_…`
    pub id: String,
    /// Run.
    pub run_id: String,
    /// `pending|granted|denied|expired|cancelled`.
    pub status: ApprovalStatus,
    /// Who may grant, fixed when the call was frozen: `self_approval` (the requester) or
    /// `four_eyes` (another user who is an admin or approver; the requester may deny).
    pub rule: ApprovalRule,
    /// The tool domain whose four-eyes setting applied (absent for self-approval).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_domain: Option<String>,
    /// True while a four-eyes approval is pending: it needs a person other than the requester.
    pub awaits_second_person: bool,
    /// Who froze the call.
    pub requested_by: Requester,
    /// Whether the caller may grant it now (pending, and the rule lets the caller decide).
    pub may_grant: bool,
    /// The frozen call.
    pub invocation: FrozenCall,
    /// Why approval is needed and tool-specific facts (diff preview, real cwd…).
    #[schema(value_type = Object)]
    pub preview: Value,
    /// RFC 3339 expiry.
    pub expires_at: String,
    /// Deciding user.
    pub decided_by: Option<String>,
    /// Deciding token id.
    pub decided_token_id: Option<String>,
    /// RFC 3339.
    pub decided_at: Option<String>,
    /// Deny reason.
    pub reason: Option<String>,
    /// RFC 3339.
    pub created_at: String,
}

/// The API view of a stored approval, as `viewer` sees it.
pub(super) fn view(row: ApprovalRow, viewer: &Viewer<'_>) -> Result<ApprovalView> {
    let rule = row.rule();
    let may_grant = row.may_grant(viewer);
    Ok(ApprovalView {
        rule,
        rule_domain: row.rule_domain.clone(),
        awaits_second_person: rule == ApprovalRule::FourEyes && row.status == ApprovalStatus::Pending,
        requested_by: Requester { user_id: row.owner_id.clone(), name: row.requester_name.clone() },
        may_grant,
        invocation: FrozenCall {
            invocation_id: row.invocation_id,
            turn_id: row.turn_id,
            tool_id: row.tool_id,
            tool_call_id: row.tool_call_id,
            input_hash: row.input_hash,
            input: json_col(&row.input)?,
            status: row.invocation_status,
        },
        preview: row.preview.as_deref().map(json_col).transpose()?.unwrap_or(Value::Null),
        id: row.id,
        run_id: row.run_id,
        status: row.status,
        expires_at: row.expires_at,
        decided_by: row.decided_by,
        decided_token_id: row.decided_token_id,
        decided_at: row.decided_at,
        reason: row.reason,
        created_at: row.created_at,
    })
}

/// Query of the inbox.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    /// Only this status.
    #[param(value_type = Option<ApprovalStatus>)]
    pub status: Option<String>,
    /// Only this run.
    pub run_id: Option<String>,
    /// Page size (1–200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[a-z]+_[0-9a-f]{32}$")]
    pub cursor: Option<String>,
}

/// `{"approvals": [...], "next_cursor"}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ApprovalList {
    /// Oldest first.
    pub approvals: Vec<ApprovalView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// The caller's approvals; for admins and approvers also every four-eyes approval (with its
/// requester named).
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalQuery),
    responses((status = 200, body = ApprovalList), (status = 400)), security(("bearer" = [])))]
pub async fn list_approvals(
    State(app): State<App>,
    user: AuthUser,
    Query(q): Query<ApprovalQuery>,
) -> Result<Json<ApprovalList>> {
    let status = q.status.as_deref().map(str::parse::<ApprovalStatus>).transpose().map_err(|_| {
        let all: Vec<&str> = ApprovalStatus::ALL.iter().map(|s| s.as_str()).collect();
        Error::bad_request(ErrorCode::InvalidQuery, format!("status must be one of {}", all.join(", ")))
    })?;
    let page = super::Page { limit: q.limit, cursor: q.cursor };
    let limit = page.limit()?;
    let viewer = user.viewer();
    let rows = app.store.list_approvals(&viewer, status, q.run_id.as_deref(), page.cursor.as_deref(), limit).await?;
    let next_cursor = super::Page::next_cursor(&rows, |r| r.id.clone());
    let approvals = rows.rows.into_iter().map(|r| view(r, &viewer)).collect::<Result<_>>()?;
    Ok(Json(ApprovalList { approvals, next_cursor }))
}

/// One approval.
#[utoipa::path(get, path = "/v1/approvals/{approval_id}", tag = "approvals", params(("approval_id" = String, Path)),
    responses((status = 200, body = ApprovalView), (status = 404)), security(("bearer" = [])))]
pub async fn get_approval(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<ApprovalView>> {
    let viewer = user.viewer();
    let row = app.store.approval_visible(&viewer, &id).await?.ok_or(Error::NotFound("approval"))?;
    Ok(Json(view(row, &viewer)?))
}

/// The screenshot a computer-use call is bound to, as its approval card shows it: the PNG
/// whose SHA-256 the frozen input names (`screenshot_sha256` of `browser_click_at`,
/// `browser_scroll_at`, `browser_type_at`, `browser_drag` and their `attached_browser_*`
/// forms). Visible to whoever sees the approval. Errors: 404 (no such approval, a call not
/// bound to a screenshot, or the PNG not stored on this server).
#[utoipa::path(get, path = "/v1/approvals/{approval_id}/screenshot", tag = "approvals", params(("approval_id" = String, Path)),
    responses((status = 200, content_type = "image/png", description = "the screenshot's PNG; `x-content-sha256` is its SHA-256"),
        (status = 404)),
    security(("bearer" = [])))]
pub async fn approval_screenshot(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<axum::response::Response> {
    use axum::response::IntoResponse;
    let viewer = user.viewer();
    let row = app.store.approval_visible(&viewer, &id).await?.ok_or(Error::NotFound("approval"))?;
    let input = json_col(&row.input)?;
    let sha = input.get("screenshot_sha256").and_then(Value::as_str).ok_or(Error::NotFound("screenshot"))?;
    let png = app.browser.stored_screenshot(sha).ok_or(Error::NotFound("screenshot"))?;
    let headers = [
        (axum::http::header::CONTENT_TYPE, "image/png".to_owned()),
        (axum::http::header::CACHE_CONTROL, "private, max-age=3600".to_owned()),
        (axum::http::HeaderName::from_static("x-content-sha256"), sha.to_owned()),
    ];
    Ok((headers, png).into_response())
}

/// Body of a grant: the triple the approver saw. Any other field is refused: the approver
/// cannot edit the call.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantBody {
    /// Must equal the frozen tool id.
    pub tool_id: String,
    /// Must equal the frozen call id.
    pub tool_call_id: String,
    /// Must equal the frozen input hash.
    pub input_hash: String,
}

/// Grants one frozen invocation, once.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/grant", tag = "approvals", params(("approval_id" = String, Path)),
    request_body = GrantBody,
    responses((status = 200, body = ApprovalView), (status = 404),
        (status = 403, description = "four_eyes_required: the requester of a four-eyes approval; nothing was granted; token_scope_missing: the token lacks the approve scope"),
        (status = 409, description = "approval_mismatch, approval_decided or approval_expired")),
    security(("bearer" = [])))]
pub async fn grant(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<GrantBody>,
) -> Result<Json<ApprovalView>> {
    let triple =
        GrantRequest { tool_id: &body.tool_id, tool_call_id: &body.tool_call_id, input_hash: &body.input_hash };
    // A free execution slot for the call's owner lets the grant claim its call: it starts
    // without a second transaction and without waiting for the harness loop.
    let (row, claimed, slot) =
        approval::grant(&app.store, &app.registry, &user.decider()?, &id, &triple, &*app.harness).await?;
    let handoff = Handoff { prepared_in: None, granted: claimed.as_ref().map(|_| row.clone()) };
    app.harness.start_claimed(claimed, handoff, slot, &row.owner_id);
    Ok(Json(view(row, &user.viewer())?))
}

/// Body of a deny.
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct DenyBody {
    /// Why (at most 2,000 characters).
    #[schema(max_length = 2000)]
    pub reason: Option<String>,
}

/// Denies one frozen invocation (the requester may always withdraw it; admins and approvers
/// may deny a four-eyes approval).
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/deny", tag = "approvals", params(("approval_id" = String, Path)),
    request_body = DenyBody,
    responses((status = 200, body = ApprovalView), (status = 403, description = "token_scope_missing: the token lacks the approve scope"), (status = 404), (status = 409, description = "approval_decided or approval_expired")),
    security(("bearer" = [])))]
pub async fn deny(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<DenyBody>,
) -> Result<Json<ApprovalView>> {
    if body.reason.as_ref().is_some_and(|r| r.len() > 2000) {
        return Err(Error::invalid_field("reason", "reason must be at most 2000 characters"));
    }
    let row = approval::deny(&app.store, &user.decider()?, &id, body.reason.as_deref()).await?;
    Ok(Json(view(row, &user.viewer())?))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(list_approvals))
        .routes(routes!(get_approval))
        .routes(routes!(approval_screenshot))
        .routes(routes!(grant))
        .routes(routes!(deny))
}
