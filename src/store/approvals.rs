//! Approval requests and their single decision.
//!
//! A grant is one conditional UPDATE: it succeeds only while the approval is pending and
//! unexpired AND the triple the approver echoed equals both the approval's copy and the
//! frozen invocation's own columns (still awaiting approval). The same transaction moves
//! the invocation to `queued`. Anything else changes nothing and is diagnosed afterwards.
//!
//! Who may decide is part of the same UPDATE: an approval whose stored rule is
//! `self_approval` is decided by its owner only; one whose rule is `four_eyes` is granted
//! only by another user who is an admin or an approver, and denied by its owner (who may
//! withdraw the call) or by such a user. Everybody else gets [`DecideOutcome::NotFound`].

use serde::Serialize;
use serde_json::json;

use super::{ClaimedInvocation, Store, StoreResult};
use crate::events::EventKind;
use crate::ids;
use crate::state::{ApprovalRule, ApprovalStatus, InvocationStatus};

/// An approval joined with the frozen invocation it is about.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ApprovalRow {
    /// `apr_…`
    pub id: String,
    /// The invocation.
    pub invocation_id: String,
    /// The run.
    pub run_id: String,
    /// Owner: the user who froze the call (the requester).
    pub owner_id: String,
    /// Frozen tool id.
    pub tool_id: String,
    /// Frozen call id.
    pub tool_call_id: String,
    /// Frozen input hash.
    pub input_hash: String,
    /// The decision, or `pending`.
    pub status: ApprovalStatus,
    /// Tool-specific preview JSON (diff, real cwd…).
    pub preview: Option<String>,
    /// Reason given on deny.
    pub reason: Option<String>,
    /// RFC 3339 expiry.
    pub expires_at: String,
    /// Deciding user.
    pub decided_by: Option<String>,
    /// Deciding token.
    pub decided_token_id: Option<String>,
    /// RFC 3339.
    pub decided_at: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// The invocation's canonical input (JSON text).
    pub input: String,
    /// The invocation's turn.
    pub turn_id: String,
    /// The invocation's status.
    pub invocation_status: InvocationStatus,
    /// Who may grant, fixed when the call was frozen.
    pub rule: ApprovalRule,
    /// The tool domain that demanded four-eyes (None for self-approval).
    pub rule_domain: Option<String>,
    /// The requester's user name.
    pub requester_name: String,
}

impl ApprovalRow {
    /// The stored rule (who may grant).
    pub fn rule(&self) -> ApprovalRule {
        self.rule
    }

    /// Whether `viewer` may grant this approval now: pending, its invocation still waiting,
    /// and the viewer is the owner (self-approval) or another user who may second (four-eyes).
    pub fn may_grant(&self, viewer: &Viewer<'_>) -> bool {
        let pending =
            self.status == ApprovalStatus::Pending && self.invocation_status == InvocationStatus::AwaitingApproval;
        let mine = self.owner_id == viewer.user_id;
        pending
            && match self.rule {
                ApprovalRule::SelfApproval => mine,
                ApprovalRule::FourEyes => !mine && viewer.may_second,
            }
    }
}

/// Who is looking: approvals are visible to their owner, and four-eyes approvals also to
/// every admin and approver.
#[derive(Debug, Clone, Copy)]
pub struct Viewer<'a> {
    /// The calling user.
    pub user_id: &'a str,
    /// True for admins and approvers: they may second (decide) other users' four-eyes
    /// approvals.
    pub may_second: bool,
}

impl<'a> Viewer<'a> {
    /// The owner only (no second-person rights).
    pub fn owner(user_id: &'a str) -> Self {
        Self { user_id, may_second: false }
    }
}

/// Who decides, for the record (user and token) and for the rule (may they second?).
#[derive(Debug, Clone, Copy)]
pub struct Decider<'a> {
    /// The deciding user.
    pub user_id: &'a str,
    /// The token used.
    pub token_id: &'a str,
    /// Admin or approver.
    pub may_second: bool,
}

impl Decider<'_> {
    /// The same user as a viewer.
    pub fn viewer(&self) -> Viewer<'_> {
        Viewer { user_id: self.user_id, may_second: self.may_second }
    }
}

/// What the approver echoed back.
#[derive(Debug, Clone)]
pub struct GrantRequest<'a> {
    /// Must equal the frozen tool id.
    pub tool_id: &'a str,
    /// Must equal the frozen call id.
    pub tool_call_id: &'a str,
    /// Must equal the frozen input hash.
    pub input_hash: &'a str,
}

/// The outcome of a decision attempt.
#[derive(Debug)]
pub enum DecideOutcome {
    /// This request made the decision.
    Decided(ApprovalRow),
    /// No such approval for this user.
    NotFound,
    /// The echoed triple differs from the frozen invocation; nothing changed.
    Mismatch(ApprovalRow),
    /// Somebody decided first (or the invocation was cancelled).
    AlreadyDecided(ApprovalRow),
    /// The approval's TTL ran out.
    Expired(ApprovalRow),
    /// The requester tried to grant an approval whose rule is four-eyes; nothing changed.
    FourEyesRequired(ApprovalRow),
}

/// The harness that takes an invocation at once, in the transaction that makes it runnable
/// ([`Store::grant_and_claim`], [`Store::freeze_and_claim`]).
#[derive(Debug, Clone, Copy)]
pub struct HarnessClaim<'a> {
    /// The claiming node (`<stable node>:<boot id>`).
    pub node_id: &'a str,
    /// The claim's lease, in milliseconds.
    pub lease_ms: u64,
}

const SELECT: &str = "SELECT a.*, i.input, i.turn_id, i.status AS invocation_status, u.name AS requester_name
    FROM approvals a JOIN invocations i ON i.id = a.invocation_id JOIN users u ON u.id = a.owner_id";

/// The condition "visible to the viewer": parameter `$1` is the viewer's user id, `$2` is 1
/// for admins and approvers (see [`Viewer`]).
const VISIBLE: &str = "(a.owner_id = $1 OR ($2 <> 0 AND a.rule = 'four_eyes'))";

impl Store {
    /// The caller's own approval, or None.
    pub async fn approval_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<ApprovalRow>> {
        self.approval_visible(&Viewer::owner(owner_id), id).await
    }

    /// The approval if `viewer` may see it (see [`Viewer`]), or None.
    pub async fn approval_visible(&self, viewer: &Viewer<'_>, id: &str) -> StoreResult<Option<ApprovalRow>> {
        let sql = format!("{SELECT} WHERE {VISIBLE} AND a.id = $3");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(viewer.user_id)
            .bind(i64::from(viewer.may_second))
            .bind(id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The approval of an invocation, whoever owns it (for the harness's gate).
    pub async fn approval_of_invocation(&self, invocation_id: &str) -> StoreResult<Option<ApprovalRow>> {
        let sql = format!("{SELECT} WHERE a.invocation_id = $1");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(invocation_id).fetch_optional(self.pool()).await?)
    }

    /// The approval id of an invocation, if it has one.
    pub async fn approval_id_of(&self, invocation_id: &str) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar("SELECT id FROM approvals WHERE invocation_id = $1")
            .bind(invocation_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The approvals `viewer` may see (optionally of one status, one run), oldest first:
    /// their own, and for admins and approvers every four-eyes approval too.
    pub async fn list_approvals(
        &self,
        viewer: &Viewer<'_>,
        status: Option<ApprovalStatus>,
        run_id: Option<&str>,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<ApprovalRow>> {
        let sql = format!(
            "{SELECT} WHERE {VISIBLE} AND ($3 IS NULL OR a.status = $3) AND ($4 IS NULL OR a.run_id = $4)
             AND ($5 IS NULL OR a.id > $5) ORDER BY a.id LIMIT $6"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(viewer.user_id)
            .bind(i64::from(viewer.may_second))
            .bind(status)
            // An empty filter is no filter (as it always was).
            .bind(run_id.filter(|r| !r.is_empty()))
            .bind(cursor.filter(|c| !c.is_empty()))
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    /// Grants approval `id` iff `who` may grant it under its stored rule (see the module
    /// docs) and the echoed triple equals the frozen invocation. On success the invocation is
    /// `queued` for the harness, and the `approval.granted` event names the decider, their
    /// token, the requester and the rule.
    pub async fn grant_approval(
        &self,
        who: &Decider<'_>,
        id: &str,
        triple: &GrantRequest<'_>,
    ) -> StoreResult<DecideOutcome> {
        Ok(self.grant_and_claim(who, id, triple, None, None).await?.0)
    }

    /// [`Store::grant_approval`], and with `claim` the granted invocation is claimed in the
    /// same transaction for the harness of `claim.node_id` (status `running`, its lease, one
    /// `execution.started` after `approval.granted`) and returned, instead of being queued for
    /// whichever harness claims next: a grant's call starts without a second transaction.
    /// The claim needs nothing more than the grant did (the grant's own conditions are those
    /// [`Store::claim_batch`] checks). `pending`: the approval as the caller read it just
    /// before, still pending; when the grant succeeds the answer is that row with this
    /// decision applied (a pending approval changes only by a decision, which this one
    /// excludes), not a read after the commit.
    pub async fn grant_and_claim(
        &self,
        who: &Decider<'_>,
        id: &str,
        triple: &GrantRequest<'_>,
        claim: Option<HarnessClaim<'_>>,
        pending: Option<&ApprovalRow>,
    ) -> StoreResult<(DecideOutcome, Option<ClaimedInvocation>)> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let granted: Option<(String, String, String, ApprovalRule)> = sqlx::query_as(
            "UPDATE approvals SET status = 'granted', decided_by = $1, decided_token_id = $2, decided_at = $3
             WHERE id = $4 AND status = 'pending' AND expires_at > $3
               AND ((rule = 'self_approval' AND owner_id = $1) OR (rule = 'four_eyes' AND owner_id <> $1 AND $5 <> 0))
               AND tool_id = $6 AND tool_call_id = $7 AND input_hash = $8
               AND EXISTS (SELECT 1 FROM invocations i
                           WHERE i.id = approvals.invocation_id AND i.status = 'awaiting_approval'
                             AND i.tool_id = $6 AND i.tool_call_id = $7 AND i.input_hash = $8)
             RETURNING invocation_id, run_id, owner_id, rule",
        )
        .bind(who.user_id)
        .bind(who.token_id)
        .bind(&now)
        .bind(id)
        .bind(i64::from(who.may_second))
        .bind(triple.tool_id)
        .bind(triple.tool_call_id)
        .bind(triple.input_hash)
        .fetch_optional(tx.conn())
        .await?;
        let Some((invocation_id, run_id, requester, rule)) = granted else {
            drop(tx);
            return Ok((self.diagnose(&who.viewer(), id, Some(triple)).await?, None));
        };
        // The invocation's status now, when this transaction set it.
        let mut invocation_status = None;
        let claimed: Option<ClaimedInvocation> = match &claim {
            None => {
                let queued = sqlx::query(
                    "UPDATE invocations SET status = 'queued', updated_at = $1
                     WHERE id = $2 AND status = 'awaiting_approval'",
                )
                .bind(&now)
                .bind(&invocation_id)
                .execute(tx.conn())
                .await?;
                invocation_status = (queued.rows_affected() == 1).then_some(InvocationStatus::Queued);
                None
            }
            Some(claim) => {
                sqlx::query_as(
                    "UPDATE invocations SET status = 'running', claimed_by = $1, lease_until = $2, started_at = $3,
                            updated_at = $3
                     WHERE id = $4 AND status = 'awaiting_approval'
                     RETURNING *",
                )
                .bind(claim.node_id)
                .bind(ids::now_plus_ms(claim.lease_ms))
                .bind(&now)
                .bind(&invocation_id)
                .fetch_optional(tx.conn())
                .await?
            }
        };
        // While traces are exported: the grant request's trace becomes the execution's parent.
        if let Some(traceparent) = crate::telemetry::current_traceparent() {
            sqlx::query(
                "INSERT INTO invocation_traces (invocation_id, trace_parent) VALUES ($1, $2)
                 ON CONFLICT (invocation_id) DO UPDATE SET trace_parent = excluded.trace_parent",
            )
            .bind(&invocation_id)
            .bind(traceparent)
            .execute(tx.conn())
            .await?;
        }
        let mut events = vec![(
            run_id.as_str(),
            EventKind::ApprovalGranted,
            json!({"approval_id": id, "invocation_id": invocation_id, "tool_id": triple.tool_id,
                   "tool_call_id": triple.tool_call_id, "input_hash": triple.input_hash,
                   "decided_by": who.user_id, "token_id": who.token_id, "decided_at": now,
                   "requested_by": requester, "rule": rule}),
        )];
        if let Some(row) = &claimed {
            events.push((
                run_id.as_str(),
                EventKind::ExecutionStarted,
                json!({"invocation_id": row.id, "tool_id": row.tool_id, "tool_call_id": row.tool_call_id}),
            ));
        }
        // Both in one go, last: the run's counter is locked only from here to the commit.
        tx.append_events(&events).await?;
        tx.commit().await?;
        if claimed.is_some() {
            invocation_status = Some(InvocationStatus::Running);
        }
        let decided = match (pending, invocation_status) {
            (Some(row), Some(invocation_status)) if row.id == id => DecideOutcome::Decided(ApprovalRow {
                status: ApprovalStatus::Granted,
                decided_by: Some(who.user_id.to_owned()),
                decided_token_id: Some(who.token_id.to_owned()),
                decided_at: Some(now),
                invocation_status,
                ..row.clone()
            }),
            _ => self.decided(&who.viewer(), id).await?,
        };
        Ok((decided, claimed))
    }

    /// Denies pending approval `id`: its owner may (withdrawing the call, whatever the rule),
    /// and so may an admin or approver when the rule is four-eyes. The invocation becomes
    /// `denied`.
    pub async fn deny_approval(&self, who: &Decider<'_>, id: &str, reason: Option<&str>) -> StoreResult<DecideOutcome> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let denied: Option<(String, String, String, ApprovalRule)> = sqlx::query_as(
            "UPDATE approvals SET status = 'denied', decided_by = $1, decided_token_id = $2, decided_at = $3, reason = $4
             WHERE id = $5 AND status = 'pending' AND expires_at > $3
               AND (owner_id = $1 OR (rule = 'four_eyes' AND $6 <> 0))
             RETURNING invocation_id, run_id, owner_id, rule",
        )
        .bind(who.user_id)
        .bind(who.token_id)
        .bind(&now)
        .bind(reason)
        .bind(id)
        .bind(i64::from(who.may_second))
        .fetch_optional(tx.conn())
        .await?;
        let Some((invocation_id, run_id, requester, rule)) = denied else {
            drop(tx);
            return self.diagnose(&who.viewer(), id, None).await;
        };
        sqlx::query("UPDATE invocations SET status = 'denied', finished_at = $1, updated_at = $1 WHERE id = $2 AND status = 'awaiting_approval'")
            .bind(&now)
            .bind(&invocation_id)
            .execute(tx.conn())
            .await?;
        tx.append_event(
            &run_id,
            EventKind::ApprovalDenied,
            &json!({"approval_id": id, "invocation_id": invocation_id, "reason": reason,
                    "decided_by": who.user_id, "token_id": who.token_id, "decided_at": now,
                    "requested_by": requester, "rule": rule}),
        )
        .await?;
        tx.commit().await?;
        self.decided(&who.viewer(), id).await
    }

    async fn decided(&self, viewer: &Viewer<'_>, id: &str) -> StoreResult<DecideOutcome> {
        Ok(match self.approval_visible(viewer, id).await? {
            Some(row) => DecideOutcome::Decided(row),
            None => DecideOutcome::NotFound,
        })
    }

    /// Why a decision changed nothing (`triple` is Some for a grant).
    async fn diagnose(
        &self,
        viewer: &Viewer<'_>,
        id: &str,
        triple: Option<&GrantRequest<'_>>,
    ) -> StoreResult<DecideOutcome> {
        let Some(row) = self.approval_visible(viewer, id).await? else {
            return Ok(DecideOutcome::NotFound);
        };
        let own_four_eyes = row.rule == ApprovalRule::FourEyes && row.owner_id == viewer.user_id;
        Ok(match row.status {
            ApprovalStatus::Expired => DecideOutcome::Expired(row),
            ApprovalStatus::Pending if row.expires_at <= ids::now() => DecideOutcome::Expired(row),
            ApprovalStatus::Pending if row.invocation_status != InvocationStatus::AwaitingApproval => {
                DecideOutcome::AlreadyDecided(row)
            }
            ApprovalStatus::Pending if triple.is_some() && own_four_eyes => DecideOutcome::FourEyesRequired(row),
            ApprovalStatus::Pending => match triple {
                Some(t)
                    if t.tool_id != row.tool_id
                        || t.tool_call_id != row.tool_call_id
                        || t.input_hash != row.input_hash =>
                {
                    DecideOutcome::Mismatch(row)
                }
                // Equal triple but the guarded update still missed: a concurrent decision.
                _ => DecideOutcome::AlreadyDecided(row),
            },
            _ => DecideOutcome::AlreadyDecided(row),
        })
    }

    /// Expires every pending approval whose TTL ran out (the invocation becomes `expired`),
    /// each with an `approval.expired` event. Returns how many expired.
    pub async fn expire_approvals(&self) -> StoreResult<u64> {
        let now = ids::now();
        let due: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT id, invocation_id, run_id FROM approvals WHERE status = 'pending' AND expires_at <= $1 ORDER BY id LIMIT 500",
        )
        .bind(&now)
        .fetch_all(self.pool())
        .await?;
        let mut count = 0;
        for (id, invocation_id, run_id) in due {
            let mut tx = self.begin_write().await?;
            let done = sqlx::query(
                "UPDATE approvals SET status = 'expired', decided_at = $1 WHERE id = $2 AND status = 'pending'",
            )
            .bind(&now)
            .bind(&id)
            .execute(tx.conn())
            .await?;
            if done.rows_affected() == 1 {
                sqlx::query("UPDATE invocations SET status = 'expired', finished_at = $1, updated_at = $1 WHERE id = $2 AND status = 'awaiting_approval'")
                    .bind(&now)
                    .bind(&invocation_id)
                    .execute(tx.conn())
                    .await?;
                tx.append_event(
                    &run_id,
                    EventKind::ApprovalExpired,
                    &json!({"approval_id": id, "invocation_id": invocation_id}),
                )
                .await?;
                count += 1;
            }
            tx.commit().await?;
        }
        Ok(count)
    }
}
