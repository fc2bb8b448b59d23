//! Frozen Invocation: raw Planner input becomes one immutable, hashed call.
//!
//! [`freeze`] is the only function that turns a Planner's call into an invocation. It
//! checks the ladder against the turn's stored exposure, validates the input against the
//! tool's JSON Schema, lets the tool canonicalise it (defaults, normalised paths, resolved
//! cwd), hashes the canonical document, asks the policy whether approval is needed and
//! stores the result — all before anything executes.

pub use mira_core::canonical;

use serde_json::{Value, json};

use crate::app::App;
use crate::approval::policy::{self, Decision};
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::exposure::{Exposure, LadderState, ladder};
use crate::ids;
use crate::registry::PrepareContext;
use crate::store::{ApprovalRequest, FreezeOutcome, InvocationRow, NewInvocation, RunRow};

/// A Planner's call as received.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The turn whose exposure allows the call.
    pub turn_id: String,
    /// Tool id, or the exposure's function name for it.
    pub tool: String,
    /// The model's call id.
    pub tool_call_id: String,
    /// Raw input.
    pub input: Value,
}

/// A frozen invocation as returned to the Planner.
#[derive(Debug, Clone)]
pub struct Frozen {
    /// The stored row.
    pub row: InvocationRow,
    /// The approval request, when one was created.
    pub approval_id: Option<String>,
    /// False when this was an idempotent replay of an existing call.
    pub created: bool,
}

/// Longest accepted `tool_call_id`, in bytes.
pub const MAX_CALL_ID_BYTES: usize = 256;

/// Freezes a call in `run` for `user_id` (see the module docs).
///
/// Errors: 404 turn; 409 `tool_call_id_conflict`; 409 with the failed ladder stage
/// (`not_registered`, `not_public`, `unavailable`, `not_exposed`) and the ladder in details;
/// 422 schema violations; tool-specific errors from canonicalisation (`outside_workspace`…).
pub async fn freeze(app: &App, user_id: &str, run: &RunRow, req: CallRequest) -> Result<Frozen> {
    if req.tool_call_id.is_empty() || req.tool_call_id.len() > MAX_CALL_ID_BYTES {
        return Err(Error::bad_request(
            ErrorCode::InvalidRequest,
            format!("tool_call_id must be 1 to {MAX_CALL_ID_BYTES} bytes"),
        ));
    }
    let turn = app.store.turn_for(user_id, &req.turn_id).await?;
    let turn = turn.filter(|t| t.run_id == run.id).ok_or(Error::NotFound("turn"))?;
    let exposure: Exposure = serde_json::from_str(&turn.exposure).map_err(|e| Error::Internal(e.to_string()))?;
    let tool_id = exposure.find(&req.tool).map_or(req.tool.clone(), |t| t.id.clone());

    let existing = app.store.invocation_by_call(&run.id, &req.tool_call_id).await?;
    if let Some(existing) = &existing
        && existing.tool_id != tool_id
    {
        return Err(call_id_conflict(existing));
    }

    let ctx = app.run_availability_context(user_id, run).await?;
    let view = ladder::view(&app.registry, &tool_id, &ctx, Some(&exposure));
    if view.state != LadderState::Exposed {
        let message = view.reason.as_ref().map_or_else(|| format!("{tool_id} cannot be called"), |r| r.message.clone());
        let code = view.state.error_code();
        let details = json!({"tool_id": tool_id, "replacement": view.replacement, "ladder": view});
        return Err(Error::conflict(code, message, details));
    }
    let entry = app.registry.get(&tool_id, user_id).ok_or(Error::NotFound("tool"))?;
    let mut req = req;
    entry.check_input(&mut req.input).map_err(|errors| Error::InputInvalid { errors })?;

    let workspace = app.workspace_of(run).await?;
    let prepare_ctx = PrepareContext { workspace: &workspace, owner_id: user_id, run_id: &run.id };
    if let Some(existing) = existing {
        // A retried call: compare only, so preconditions the frozen call itself may have
        // changed since (an edit that already ran) cannot turn a replay into an error.
        let frozen: Value =
            serde_json::from_str(&existing.input).map_err(|e| Error::Internal(format!("stored input: {e}")))?;
        let input = entry.tool.replay_input(entry.tool.canonicalize(req.input, &prepare_ctx).await?, &frozen);
        return if existing.input_hash == canonical::input_hash(&tool_id, &input) {
            let approval_id = app.store.approval_id_of(&existing.id).await?;
            Ok(Frozen { row: existing, approval_id, created: false })
        } else {
            Err(call_id_conflict(&existing))
        };
    }
    let prepared = entry.tool.prepare(req.input, &prepare_ctx).await?;
    let input_hash = canonical::input_hash(&tool_id, &prepared.input);

    let approval = match policy::decide(entry.spec()) {
        Decision::Skip => None,
        Decision::NeedsApproval { mut reasons } => {
            let rule = policy::rule_for(entry.spec(), &app.config.four_eyes_domains);
            let rule_domain = (rule == policy::ApprovalRule::FourEyes).then(|| entry.spec().domain.clone());
            if let Some(domain) = &rule_domain {
                reasons.push(format!(
                    "four-eyes: this deployment requires {domain} calls to be granted by another person (an admin or approver)"
                ));
            }
            let preview = json!({"reasons": reasons, "tool": prepared.preview});
            let expires_at = ids::now_plus_ms(app.config.approval_ttl_secs.saturating_mul(1000));
            Some(ApprovalRequest { preview, expires_at, rule, rule_domain })
        }
    };
    let new = NewInvocation {
        run_id: run.id.clone(),
        turn_id: turn.id.clone(),
        owner_id: user_id.to_owned(),
        tool_id: tool_id.clone(),
        tool_call_id: req.tool_call_id,
        input: canonical::to_canonical_string(&prepared.input),
        input_hash: input_hash.clone(),
        approval,
    };
    match app.store.freeze_invocation(&new).await? {
        FreezeOutcome::Created(row, approval_id) => {
            if row.status == "queued" {
                app.harness.wake();
            }
            Ok(Frozen { row, approval_id, created: true })
        }
        FreezeOutcome::Existing(row, approval_id) if row.tool_id == tool_id && row.input_hash == input_hash => {
            Ok(Frozen { row, approval_id, created: false })
        }
        FreezeOutcome::Existing(row, _) => Err(call_id_conflict(&row)),
    }
}

fn call_id_conflict(existing: &InvocationRow) -> Error {
    Error::conflict(
        ErrorCode::ToolCallIdConflict,
        format!(
            "tool_call_id {} already names another frozen call in this run; a changed call needs a new tool_call_id",
            existing.tool_call_id
        ),
        json!({"invocation_id": existing.id, "tool_id": existing.tool_id, "input_hash": existing.input_hash}),
    )
}
