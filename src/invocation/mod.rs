//! Frozen Invocation: raw Planner input becomes one immutable, hashed call.
//!
//! [`freeze`] is the only function that turns a Planner's call into an invocation. It
//! checks the ladder against the turn's stored exposure, validates the input against the
//! tool's JSON Schema, lets the tool canonicalise it (defaults, normalised paths, resolved
//! cwd), hashes the canonical document, asks the policy whether approval is needed and
//! stores the result — all before anything executes.

pub use mira_core::canonical;
mod turns;
pub use turns::{CachedTurn, TURN_CACHE_CAPACITY, TurnCache};

use serde_json::{Value, json};

use crate::approval::policy::{self, Decision};
use crate::availability::AvailabilityContext;
use crate::error::{Error, ErrorCode};
use crate::exposure::Exposure;
use crate::exposure::ladder::{self, Blocked};
use crate::harness::{Handoff, Harness};
use crate::ids;
use crate::registry::{PrepareContext, Registry, ToolError};
use crate::state::InvocationStatus;
use crate::store::{ApprovalRequest, FreezeOutcome, InvocationRow, NewInvocation, RunRow, Store, StoreError};
use crate::workspace::RunWorkspace;

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

/// The deployment's approval settings a freeze applies.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalSettings<'a> {
    /// Tool domains whose calls need a second person (`*` = every domain).
    pub four_eyes_domains: &'a [String],
    /// How long an approval request waits for a decision, in seconds.
    pub ttl_secs: u64,
}

/// What freezing consults and whom it tells, besides the run's own context.
#[derive(Clone, Copy)]
pub struct FreezeStage<'a> {
    /// Turns, invocations and approval requests.
    pub store: &'a Store,
    /// The tools: their ladder, schemas and canonicalisation.
    pub registry: &'a Registry,
    /// The deployment's approval settings.
    pub approvals: ApprovalSettings<'a>,
    /// Takes an approval-free call at once when it has a free slot, or is woken for it.
    pub harness: &'a std::sync::Arc<Harness>,
    /// Turns whose exposure was read and parsed already.
    pub turns: &'a TurnCache,
}

/// The run a call is frozen in, as the caller resolved it.
#[derive(Clone, Copy)]
pub struct RunScope<'a> {
    /// The run (the caller checked that it is the user's).
    pub run: &'a RunRow,
    /// The run's availability context (owner, device, workspace root state).
    pub availability: &'a AvailabilityContext,
    /// The run's workspace, opened only once the tool is exposed and the input is valid.
    pub workspace: &'a RunWorkspace,
    /// The id of the run's invocation with the call's `tool_call_id`, as read with the run
    /// (None: there was none then; a call frozen since is caught by the insert).
    pub existing_call: Option<&'a str>,
    /// For a run bound to a device: its runner, which canonicalises and prepares the calls
    /// of tools working in the workspace (on the device's files).
    pub device: Option<&'a crate::devices::executor::DeviceTools>,
}

/// Why a call was not frozen.
#[derive(Debug)]
pub enum FreezeError {
    /// The tool is not exposed in the call's turn: 409 with the ladder stage as the code
    /// (`not_registered`, `not_public`, `unavailable`, `not_exposed`). The caller adds the
    /// tool's whole ladder view ([`FreezeError::into_error`] takes it).
    NotExposed(Box<NotExposed>),
    /// Any other refusal.
    Refused(Error),
}

/// A call whose tool is not exposed in its turn.
#[derive(Debug)]
pub struct NotExposed {
    /// The tool id the call resolved to.
    pub tool_id: String,
    /// The turn's stored exposure.
    pub exposure: Exposure,
    /// Where the ladder stopped, and why.
    pub blocked: Blocked,
    /// For a legacy entry, the public tool to use instead.
    pub replacement: Option<String>,
}

impl FreezeError {
    /// The API error; `ladder` is the tool's ladder view (JSON) for a call that was not
    /// exposed, placed in the details beside the tool id and its replacement.
    pub fn into_error(self, ladder: impl FnOnce(&NotExposed) -> Value) -> Error {
        match self {
            FreezeError::Refused(e) => e,
            FreezeError::NotExposed(n) => {
                let details = json!({"tool_id": n.tool_id, "replacement": n.replacement, "ladder": ladder(&n)});
                Error::conflict(n.blocked.state.error_code(), n.blocked.reason.message.clone(), details)
            }
        }
    }
}

impl From<Error> for FreezeError {
    fn from(e: Error) -> Self {
        FreezeError::Refused(e)
    }
}

impl From<StoreError> for FreezeError {
    fn from(e: StoreError) -> Self {
        FreezeError::Refused(e.into())
    }
}

impl From<ToolError> for FreezeError {
    fn from(e: ToolError) -> Self {
        FreezeError::Refused(e.into())
    }
}

/// Freezes a call in `scope.run` for `user_id` (see the module docs).
///
/// Errors: 404 turn; 409 `tool_call_id_conflict`; [`FreezeError::NotExposed`] (409 with the
/// failed ladder stage); 422 schema violations; tool-specific errors from canonicalisation
/// (`outside_workspace`…); the workspace's own (`workspace_changed`, `workspace_unavailable`).
pub async fn freeze(
    stage: &FreezeStage<'_>,
    scope: &RunScope<'_>,
    user_id: &str,
    req: CallRequest,
) -> std::result::Result<Frozen, FreezeError> {
    let run = scope.run;
    if req.tool_call_id.is_empty() || req.tool_call_id.len() > MAX_CALL_ID_BYTES {
        return Err(Error::invalid_field(
            "tool_call_id",
            format!("tool_call_id must be 1 to {MAX_CALL_ID_BYTES} bytes"),
        )
        .into());
    }
    // The call id is shown to the approver and sent back in the grant: a control, format or
    // bidirectional character in it would print as something else (or as nothing).
    if let Some(c) = req.tool_call_id.chars().find(|&c| crate::workspace::lookalike::text_flag(c, &[]).is_some()) {
        return Err(Error::invalid_field(
            "tool_call_id",
            format!(
                "tool_call_id must not contain control, format, bidirectional or unusual whitespace characters \
                 (found U+{:04X})",
                u32::from(c)
            ),
        )
        .into());
    }
    let turn = stage.turns.turn_for(stage.store, user_id, &req.turn_id).await?;
    let turn = turn.filter(|t| t.run_id == run.id).ok_or(Error::NotFound("turn"))?;
    let exposure = &turn.exposure;
    let tool_id = exposure.find(&req.tool).map_or(req.tool.clone(), |t| t.id.clone());

    let existing = match scope.existing_call {
        Some(id) => stage.store.invocation_by_id(id).await?.filter(|i| i.run_id == run.id),
        None => None,
    };
    if let Some(existing) = &existing
        && existing.tool_id != tool_id
    {
        return Err(call_id_conflict(existing).into());
    }

    if let Err(blocked) = ladder::check(stage.registry, &tool_id, scope.availability, exposure) {
        let replacement = stage.registry.get(&tool_id, user_id).and_then(|e| e.spec().replacement.clone());
        let exposure = exposure.clone();
        return Err(FreezeError::NotExposed(Box::new(NotExposed { tool_id, exposure, blocked, replacement })));
    }
    let entry = stage.registry.get(&tool_id, user_id).ok_or(Error::NotFound("tool"))?;
    let mut req = req;
    entry.check_input(&mut req.input).map_err(|errors| Error::InputInvalid { errors })?;

    let device = scope.device.filter(|_| crate::devices::executor::runs_on_device(entry.spec().capability.as_deref()));
    // Only a tool that works in the folder is prepared (and later run) with it open.
    let workspace = match device {
        None if entry.spec().works_in_workspace() => Some(scope.workspace.open()?),
        _ => None,
    };
    if let Some(existing) = existing {
        // A retried call: compare only, so preconditions the frozen call itself may have
        // changed since (an edit that already ran) cannot turn a replay into an error.
        let frozen: Value =
            serde_json::from_str(&existing.input).map_err(|e| Error::Internal(format!("stored input: {e}")))?;
        let recomputed = match device {
            Some(device) => device.canonicalize(&tool_id, req.input).await?,
            None => {
                let prepare_ctx = PrepareContext { workspace: workspace.as_ref(), owner_id: user_id, run_id: &run.id };
                entry.tool.canonicalize(req.input, &prepare_ctx).await?
            }
        };
        let input = entry.tool.replay_input(recomputed, &frozen);
        return if existing.input_hash == canonical::input_hash(&tool_id, &input) {
            let approval_id = stage.store.approval_id_of(&existing.id).await?;
            Ok(Frozen { row: existing, approval_id, created: false })
        } else {
            Err(call_id_conflict(&existing).into())
        };
    }
    let prepared = match device {
        Some(device) => device.prepare(&tool_id, req.input).await?,
        None => {
            let prepare_ctx = PrepareContext { workspace: workspace.as_ref(), owner_id: user_id, run_id: &run.id };
            entry.tool.prepare(req.input, &prepare_ctx).await?
        }
    };
    let input_hash = canonical::input_hash(&tool_id, &prepared.input);

    let approval = match policy::decide(entry.spec()) {
        Decision::Skip => None,
        Decision::NeedsApproval { mut reasons } => {
            let rule = policy::rule_for(entry.spec(), stage.approvals.four_eyes_domains);
            let rule_domain = (rule == policy::ApprovalRule::FourEyes).then(|| entry.spec().domain.clone());
            if let Some(domain) = &rule_domain {
                reasons.push(format!(
                    "four-eyes: this deployment requires {domain} calls to be granted by another person (an admin or approver)"
                ));
            }
            let preview = json!({"reasons": reasons, "tool": prepared.preview});
            let expires_at = ids::now_plus_ms(stage.approvals.ttl_secs.saturating_mul(1000));
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
        queue_tag: 0,
        approval,
    };
    // An approval-free call is claimed in the freeze's transaction when the harness has a
    // free slot (and no other user's calls are queued): it starts without a claim
    // transaction of its own. Otherwise it enters the execution queue now, with its owner's
    // next tag (a gated call when granted).
    let slot = new.approval.is_none().then(|| stage.harness.slot(user_id)).flatten();
    let new = NewInvocation {
        queue_tag: match (&new.approval, &slot) {
            (Some(_), _) => 0,
            (None, Some(_)) => stage.harness.unqueued_tag(),
            (None, None) => stage.harness.queue_tag(user_id),
        },
        ..new
    };
    let claim = slot.as_ref().map(|_| stage.harness.claim());
    match stage.store.freeze_and_claim(&new, claim).await? {
        FreezeOutcome::Created(row, approval_id) => {
            match row.status {
                InvocationStatus::Running => stage.harness.start_claimed(
                    Some(row.clone()),
                    Handoff { prepared_in: workspace, granted: None },
                    slot,
                    &row.owner_id,
                ),
                InvocationStatus::Queued => stage.harness.queued(&row.owner_id),
                _ => {}
            }
            Ok(Frozen { row, approval_id, created: true })
        }
        FreezeOutcome::Existing(row, approval_id) if row.tool_id == tool_id && row.input_hash == input_hash => {
            Ok(Frozen { row, approval_id, created: false })
        }
        FreezeOutcome::Existing(row, _) => Err(call_id_conflict(&row).into()),
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
