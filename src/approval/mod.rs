//! Policy / Approval: one concrete frozen call, not a standing pass.
//!
//! A grant names the frozen triple `tool_id + tool_call_id + input_hash`; the store compares
//! all three with the invocation itself, atomically, and the grant is used once: the harness
//! claims the invocation with a compare-and-set, and its claim requires a granted approval
//! whose triple equals the invocation's ([`crate::store::Store::claim_next`]). There is no
//! matcher on `tool_id + input_hash` anywhere, so a grant can never be reused by another
//! call with the same input (the "approval identity drift" of the original product).
//!
//! Four-eyes: when the deployment lists a tool's domain in `--four-eyes-domains`, the
//! approval is frozen with the rule [`policy::ApprovalRule::FourEyes`]: only another user who
//! is an admin or an approver may grant it (the requester gets 403 `four_eyes_required` and
//! nothing changes); the requester may still deny it (withdraw the call). The rule is read
//! from the stored approval by the grant, by the claim and by the harness's gate, never from
//! the current setting.

pub mod policy;

use serde_json::json;

use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::registry::Registry;
use crate::state::ApprovalStatus;
pub use crate::store::Decider;
use crate::store::{ApprovalRow, ClaimedInvocation, DecideOutcome, GrantRequest, HarnessClaim, Store};

/// Grants approval `id` if `who` may grant it under its stored rule and `triple` equals the
/// frozen invocation. When `queue` has a free execution slot for a call of the invocation's
/// owner, the invocation is claimed for that harness in the grant's transaction and
/// returned with the slot, for the caller to hand over
/// ([`crate::harness::Harness::start_claimed`]); otherwise it is queued with its owner's next
/// tag ([`crate::harness::fair`]) and the slot, if any, comes back unused.
///
/// Errors: 404 (not the caller's, and not a four-eyes approval an admin or approver may
/// decide); 403 `four_eyes_required` (the requester of a four-eyes approval; nothing
/// changed); 409 `approval_mismatch` (nothing changed), `approval_decided`,
/// `approval_expired`, `stale_definition` (the tool's definition changed since the call was
/// frozen).
pub async fn grant<Q: ExecutionQueue>(
    store: &Store,
    registry: &Registry,
    who: &Decider<'_>,
    id: &str,
    triple: &GrantRequest<'_>,
    queue: &Q,
) -> Result<(ApprovalRow, Option<ClaimedInvocation>, Option<Q::Slot>)> {
    // A call its tool no longer matches (an MCP definition changed since it was frozen:
    // 409 `stale_definition`) is not granted.
    let pending = store.approval_visible(&who.viewer(), id).await?.filter(|row| row.status == ApprovalStatus::Pending);
    if let Some(row) = &pending {
        registry.check_frozen(&row.tool_id, &row.input).map_err(Error::Tool)?;
    }
    // A granted call enters the execution queue now, in its owner's turn (not at its freeze:
    // calls held for approval would otherwise all go ahead of everyone's once granted). The
    // turn is taken only by a grant that queued its call: a refused grant, or one that claimed
    // its call at once, does not push the owner's later calls back.
    let queue_tag = pending.as_ref().map_or(0, |row| queue.next_tag(&row.owner_id));
    // The slot is the owner's (the decider of a four-eyes approval is another user).
    let slot = pending.as_ref().and_then(|row| queue.slot(&row.owner_id));
    let claim = slot.as_ref().map(|_| queue.claim());
    let (outcome, claimed) = store.grant_and_claim(who, id, triple, claim, pending.as_ref(), queue_tag).await?;
    let granted = settle(outcome, Some(triple))?;
    if claimed.is_none() {
        queue.took(&granted.owner_id, queue_tag);
    }
    Ok((granted, claimed, slot))
}

/// The execution queue as a grant needs it (implemented by [`crate::harness::Harness`]).
pub trait ExecutionQueue: Sync {
    /// A free execution slot, held until the claimed call is handed over.
    type Slot: Send;
    /// A free execution slot for a call of `owner_id` now, if any.
    fn slot(&self, owner_id: &str) -> Option<Self::Slot>;
    /// The claim a grant holding a slot makes: this harness's node and lease.
    fn claim(&self) -> HarnessClaim<'_>;
    /// The tag a call of `owner_id` entering the queue now would get, without taking it.
    fn next_tag(&self, owner_id: &str) -> i64;
    /// A call of `owner_id` entered the queue with `tag` (from [`ExecutionQueue::next_tag`]).
    fn took(&self, owner_id: &str, tag: i64);
}

/// Denies approval `id` (its requester may always withdraw it; admins and approvers may deny
/// a four-eyes approval). Errors: 404; 409 `approval_decided`, `approval_expired`.
pub async fn deny(store: &Store, who: &Decider<'_>, id: &str, reason: Option<&str>) -> Result<ApprovalRow> {
    let outcome = store.deny_approval(who, id, reason).await?;
    let row = settle(outcome, None)?;
    crate::metrics::invocation_finished(&row.tool_id, crate::state::InvocationStatus::Denied.as_str());
    Ok(row)
}

fn settle(outcome: DecideOutcome, triple: Option<&GrantRequest<'_>>) -> Result<ApprovalRow> {
    match outcome {
        DecideOutcome::Decided(row) => {
            observe_wait(&row);
            Ok(row)
        }
        DecideOutcome::NotFound => Err(Error::NotFound("approval")),
        DecideOutcome::Mismatch(row) => {
            let given = triple
                .map(|t| json!({"tool_id": t.tool_id, "tool_call_id": t.tool_call_id, "input_hash": t.input_hash}));
            let mismatched: Vec<&str> = triple
                .map(|t| {
                    [
                        ("tool_id", t.tool_id != row.tool_id),
                        ("tool_call_id", t.tool_call_id != row.tool_call_id),
                        ("input_hash", t.input_hash != row.input_hash),
                    ]
                    .into_iter()
                    .filter_map(|(name, differs)| differs.then_some(name))
                    .collect()
                })
                .unwrap_or_default();
            Err(Error::conflict(
                ErrorCode::ApprovalMismatch,
                format!(
                    "the grant does not name this approval's frozen invocation ({} differ); nothing was granted",
                    mismatched.join(", ")
                ),
                json!({"approval_id": row.id, "mismatched": mismatched, "given": given}),
            ))
        }
        DecideOutcome::AlreadyDecided(row) => Err(Error::conflict(
            ErrorCode::ApprovalDecided,
            format!("approval {} was already decided: {}", row.id, decision_word(&row)),
            json!({"approval_id": row.id, "status": row.status, "invocation_status": row.invocation_status}),
        )),
        DecideOutcome::FourEyesRequired(row) => Err(Error::ForbiddenCode {
            code: ErrorCode::FourEyesRequired,
            message: format!(
                "approval {} needs a second person: an admin or approver other than its requester must grant it \
                 (the requester may deny it); nothing was granted",
                row.id
            ),
        }),
        DecideOutcome::Expired(row) => Err(Error::conflict(
            ErrorCode::ApprovalExpired,
            format!("approval {} expired at {}", row.id, row.expires_at),
            json!({"approval_id": row.id, "expires_at": row.expires_at}),
        )),
    }
}

/// Records the time the approval waited for its decision (`mira_approval_wait_seconds`).
fn observe_wait(row: &ApprovalRow) {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    if let (Some(asked), Some(decided)) = (parse(&row.created_at), row.decided_at.as_deref().and_then(parse)) {
        let waited = (decided - asked).to_std().unwrap_or_default();
        crate::metrics::approval_decided(row.status.as_str(), waited);
    }
}

fn decision_word(row: &ApprovalRow) -> String {
    if row.status == ApprovalStatus::Pending {
        format!("invocation is {}", row.invocation_status)
    } else {
        row.status.to_string()
    }
}
