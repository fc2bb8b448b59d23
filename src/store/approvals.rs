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

use super::{Backend, ClaimedInvocation, InvocationRow, Paged, Store, StoreResult};
use crate::events::EventKind;
use crate::ids;
use crate::state::{ApprovalRule, ApprovalStatus, InvocationStatus};

/// A grant's compare-and-set without its `RETURNING`, shared by [`GRANT_SQLITE`] and
/// [`GRANT_POSTGRES`]: `$1` the decider, `$2` their token, `$3` the time, `$4` the approval,
/// `$5` 1 when the decider may second, `$6`–`$8` the echoed triple. It holds every rule:
/// pending, not expired, the rule satisfied (self-approval by its owner, four-eyes by another
/// who may second), the triple equal to the approval's copy and to the invocation, which
/// still awaits approval.
macro_rules! grant_update {
    () => {
        "UPDATE approvals SET status = 'granted', decided_by = $1, decided_token_id = $2, decided_at = $3
WHERE id = $4 AND status = 'pending' AND expires_at > $3
  AND ((rule = 'self_approval' AND owner_id = $1) OR (rule = 'four_eyes' AND owner_id <> $1 AND $5 <> 0))
  AND tool_id = $6 AND tool_call_id = $7 AND input_hash = $8
  AND EXISTS (SELECT 1 FROM invocations i
              WHERE i.id = approvals.invocation_id AND i.status = 'awaiting_approval'
                AND i.tool_id = $6 AND i.tool_call_id = $7 AND i.input_hash = $8)"
    };
}

/// Binds `$1`–`$8` of [`grant_update!`] ([`GRANT_SQLITE`], [`GRANT_POSTGRES`]) for a [`Grant`].
macro_rules! bind_grant {
    ($query:expr, $grant:expr) => {{
        let grant: &Grant<'_> = $grant;
        $query
            .bind(grant.who.user_id)
            .bind(grant.who.token_id)
            .bind(grant.now)
            .bind(grant.id)
            .bind(i64::from(grant.who.may_second))
            .bind(grant.triple.tool_id)
            .bind(grant.triple.tool_call_id)
            .bind(grant.triple.input_hash)
    }};
}

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

    /// The approvals `viewer` may see (optionally of one status, one run) after `cursor`,
    /// oldest first: their own, and for admins and approvers every four-eyes approval too. At
    /// most `limit`, and no more than [`super::PAGE_MAX_BYTES`] of frozen inputs and previews
    /// past the first ([`super::sized_page_sql`]: the rows past the budget are not read).
    pub async fn list_approvals(
        &self,
        viewer: &Viewer<'_>,
        status: Option<ApprovalStatus>,
        run_id: Option<&str>,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Paged<ApprovalRow>> {
        let sql = super::sized_page_sql(
            &format!(
                "SELECT a.id, octet_length(i.input) + COALESCE(octet_length(a.preview), 0) AS n
                 FROM approvals a JOIN invocations i ON i.id = a.invocation_id
                 WHERE {VISIBLE} AND ($3 IS NULL OR a.status = $3) AND ($4 IS NULL OR a.run_id = $4)
                   AND ($5 IS NULL OR a.id > $5) ORDER BY a.id LIMIT $6"
            ),
            "id",
            // The columns of SELECT.
            "a.*, i.input, i.turn_id, i.status AS invocation_status, u.name AS requester_name",
            "JOIN approvals a ON a.id = s.k JOIN invocations i ON i.id = a.invocation_id JOIN users u ON u.id = a.owner_id",
            "$7",
        );
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(viewer.user_id)
            .bind(i64::from(viewer.may_second))
            .bind(status)
            // An empty filter is no filter (as it always was).
            .bind(run_id.filter(|r| !r.is_empty()))
            .bind(cursor.filter(|c| !c.is_empty()))
            .bind(limit.saturating_add(1))
            .bind(super::PAGE_MAX_BYTES)
            .fetch_all(self.pool())
            .await?;
        Ok(Paged::of(rows, limit))
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
        Ok(self.grant_and_claim(who, id, triple, None, None, 0).await?.0)
    }

    /// [`Store::grant_approval`], and with `claim` the granted invocation is claimed in the
    /// same transaction for the harness of `claim.node_id` (status `running`, its lease, one
    /// `execution.started` after `approval.granted`) and returned, instead of being queued for
    /// whichever harness claims next: a grant's call starts without a second transaction.
    /// The claim needs nothing more than the grant did (the grant's own conditions are those
    /// [`Store::claim_batch`] checks). `pending`: the approval as the caller read it just
    /// before, still pending; when the grant succeeds the answer is that row with this
    /// decision applied (a pending approval changes only by a decision, which this one
    /// excludes), not a read after the commit. On Postgres the grant is one statement that
    /// writes its events from that row (read here when not given: see
    /// [`Store::grant_in_one_statement`]). `queue_tag` is the invocation's place in the
    /// execution queue from now ([`crate::harness::Harness::queue_tag`] of its owner;
    /// [`Store::grant_approval`] gives 0, the head).
    pub async fn grant_and_claim(
        &self,
        who: &Decider<'_>,
        id: &str,
        triple: &GrantRequest<'_>,
        claim: Option<HarnessClaim<'_>>,
        pending: Option<&ApprovalRow>,
        queue_tag: i64,
    ) -> StoreResult<(DecideOutcome, Option<ClaimedInvocation>)> {
        let now = ids::now();
        // While traces are exported: the grant request's trace becomes the execution's parent.
        let traceparent = crate::telemetry::current_traceparent();
        let claim = claim.map(|c| (c.node_id, ids::now_plus_ms(c.lease_ms)));
        let grant = Grant { who, id, triple, claim, traceparent: traceparent.as_deref(), now: &now, queue_tag };
        let read;
        let pending = match pending.filter(|row| row.id == id) {
            Some(row) => Some(row),
            // What the one-statement grant builds its events from.
            None if self.backend == Backend::Postgres => {
                read = self.approval_visible(&who.viewer(), id).await?;
                read.as_ref()
            }
            None => None,
        };
        let outcome = match (self.backend, pending) {
            (Backend::Sqlite, _) => self.grant_in_two_commands(&grant).await?,
            (Backend::Postgres, Some(row)) if row.status == ApprovalStatus::Pending => {
                self.grant_in_one_statement(&grant, row).await?
            }
            // Not visible to the decider (nothing they may grant), or decided already.
            (Backend::Postgres, _) => None,
        };
        let Some((claimed, invocation_status)) = outcome else {
            return Ok((self.diagnose(&who.viewer(), id, Some(triple)).await?, None));
        };
        let decided = match (pending, invocation_status) {
            (Some(row), Some(invocation_status)) => DecideOutcome::Decided(ApprovalRow {
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

    /// [`Store::grant_and_claim`]'s writes on Postgres: one statement ([`GRANT_POSTGRES`]),
    /// one round trip — the grant's compare-and-set, the claim (or queueing), the trace
    /// context and the events with the run's counter. The events are built beforehand from
    /// `pending`, the approval as read before (its invocation, run, requester and rule, which
    /// never change and which the statement requires); `execution.started` is written only
    /// when the claim took. Answers a [`GrantWritten`].
    async fn grant_in_one_statement(&self, grant: &Grant<'_>, pending: &ApprovalRow) -> StoreResult<GrantWritten> {
        use sqlx::Row;
        let (node_id, lease_until) =
            grant.claim.as_ref().map(|(n, l)| (Some(*n), Some(l.as_str()))).unwrap_or_default();
        let run_id = pending.run_id.as_str();
        let events =
            grant.events(run_id, &pending.invocation_id, &pending.owner_id, pending.rule, grant.claim.is_some());
        let texts =
            super::invocations::event_texts(events.iter().map(|(run, kind, data)| (*run, *kind, data)), grant.now);
        let events_json: Vec<serde_json::Value> = events
            .iter()
            .zip(texts)
            .enumerate()
            .map(|(ord, ((_, kind, _), (data, h)))| {
                json!({"type": kind.as_str(), "data": data, "h": h, "ord": ord,
                       "src": if *kind == EventKind::ExecutionStarted { "s" } else { "g" }})
            })
            .collect();
        let row = bind_grant!(sqlx::query(GRANT_POSTGRES), grant)
            .bind(node_id)
            .bind(lease_until)
            .bind(grant.traceparent)
            .bind(&pending.invocation_id)
            .bind(run_id)
            .bind(&pending.owner_id)
            .bind(pending.rule)
            .bind(serde_json::Value::Array(events_json).to_string())
            .bind(grant.queue_tag)
            .fetch_optional(self.pool())
            .await?;
        // No row: nothing was granted (and nothing written).
        let Some(row) = row else { return Ok(None) };
        // Committed: from here nothing may turn the grant into an error. The events are
        // published whatever fails to decode; an invocation that cannot be decoded is not
        // handed over (its claim is recovered when the lease runs out).
        let failed = |what: &str, e: sqlx::Error| {
            tracing::error!(approval = %pending.id, error = %e, "reading the grant's {what} failed");
        };
        // Null when the invocation's update missed.
        let invocation_status = row.try_get::<Option<InvocationStatus>, _>("status").unwrap_or_else(|e| {
            failed("invocation status", e);
            None
        });
        let started = invocation_status == Some(InvocationStatus::Running);
        let claimed = if started {
            <InvocationRow as sqlx::FromRow<'_, sqlx::any::AnyRow>>::from_row(&row)
                .map_err(|e| failed("claimed invocation", e))
                .ok()
        } else {
            None
        };
        match row.try_get::<i64, _>("last_event_seq") {
            Ok(last_seq) => {
                let written: Vec<EventKind> = events
                    .iter()
                    .map(|(_, kind, _)| *kind)
                    .filter(|kind| *kind != EventKind::ExecutionStarted || started)
                    .collect();
                let first = last_seq - i64::try_from(written.len()).unwrap_or(0) + 1;
                self.publish_committed(
                    (first..)
                        .zip(written)
                        .map(|(seq, kind)| super::RunSignal { run_id: run_id.to_owned(), seq, kind })
                        .collect(),
                );
            }
            Err(e) => failed("last event id", e),
        }
        Ok(Some((claimed, invocation_status)))
    }

    /// [`Store::grant_and_claim`]'s writes on SQLite: one transaction in two commands on the
    /// group commit's writer connection ([`super::SqliteWriteBatch`]) — [`GRANT_SQLITE`]
    /// (`BEGIN IMMEDIATE`, the grant, the claim or queueing, the run's event head), then the
    /// events and `COMMIT` — instead of eight hand-offs to the connection's thread. Answers a
    /// [`GrantWritten`].
    async fn grant_in_two_commands(&self, grant: &Grant<'_>) -> StoreResult<GrantWritten> {
        use sqlx::Row;
        let now = grant.now;
        let mut batch = self.begin_sqlite_batch().await?;
        let (node_id, lease_until) =
            grant.claim.as_ref().map(|(n, l)| (Some(*n), Some(l.as_str()))).unwrap_or_default();
        let rows = bind_grant!(sqlx::query(GRANT_SQLITE), grant)
            .bind(node_id)
            .bind(lease_until)
            .bind(grant.queue_tag)
            .fetch_all(batch.conn()?)
            .await?;
        let mut granted = None;
        let mut updated = None;
        for row in &rows {
            if row.columns().iter().any(|c| sqlx::Column::name(c) == "event_seq") {
                let (invocation_id, run_id, requester, rule): (String, String, String, ApprovalRule) =
                    (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
                let head: (i64, Option<String>) = (row.try_get(4)?, row.try_get(5)?);
                granted = Some((invocation_id, run_id, requester, rule, head));
            } else {
                updated = Some(<InvocationRow as sqlx::FromRow<'_, sqlx::any::AnyRow>>::from_row(row)?);
            }
        }
        // Not granted: dropping the batch rolls back (the claim's update changed nothing:
        // it needs the invocation still awaiting approval, which a grant never leaves).
        let Some((invocation_id, run_id, requester, rule, (seq, hash))) = granted else {
            return Ok(None);
        };
        let updated = updated.filter(|row| row.id == invocation_id);
        let invocation_status = updated.as_ref().map(|row| row.status);
        let claimed = updated.filter(|row| row.status == InvocationStatus::Running);
        if let Some(traceparent) = grant.traceparent {
            sqlx::query(TRACE_UPSERT).bind(&invocation_id).bind(traceparent).execute(batch.conn()?).await?;
        }
        let events = grant.events(&run_id, &invocation_id, &requester, rule, claimed.is_some());
        let mut heads = [(run_id.clone(), seq, hash.unwrap_or_else(|| mira_core::chain::GENESIS.to_owned()))];
        let texts = super::invocations::event_texts(events.iter().map(|(run, kind, data)| (*run, *kind, data)), now);
        let written = events
            .iter()
            .zip(&texts)
            .map(|((run, kind, _), (data, content))| (*run, *kind, data.as_str(), content.as_str()));
        let signals = batch.append_and_commit(&mut heads, written, now).await?;
        batch.committed();
        self.publish_committed(signals);
        Ok(Some((claimed, invocation_status)))
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

/// One grant's inputs ([`Store::grant_and_claim`]): the claim as `(node id, lease until)`.
struct Grant<'a> {
    who: &'a Decider<'a>,
    id: &'a str,
    triple: &'a GrantRequest<'a>,
    claim: Option<(&'a str, String)>,
    traceparent: Option<&'a str>,
    now: &'a str,
    /// The invocation's queue tag (see [`crate::harness::fair`]).
    queue_tag: i64,
}

/// What a grant's writes did: None when nothing was granted; else the invocation claimed
/// for this harness, and the invocation's status as the grant left it (None: unknown).
type GrantWritten = Option<(Option<ClaimedInvocation>, Option<InvocationStatus>)>;

impl Grant<'_> {
    /// The events of a grant of the invocation `invocation_id` of `run_id`: `approval.granted`,
    /// and `execution.started` when it was claimed (`started`; the invocation's tool and call
    /// id are the triple's, which the grant requires).
    fn events<'r>(
        &self,
        run_id: &'r str,
        invocation_id: &str,
        requester: &str,
        rule: ApprovalRule,
        started: bool,
    ) -> Vec<(&'r str, EventKind, serde_json::Value)> {
        let (who, triple) = (self.who, self.triple);
        let mut events = vec![(
            run_id,
            EventKind::ApprovalGranted,
            json!({"approval_id": self.id, "invocation_id": invocation_id, "tool_id": triple.tool_id,
                   "tool_call_id": triple.tool_call_id, "input_hash": triple.input_hash,
                   "decided_by": who.user_id, "token_id": who.token_id, "decided_at": self.now,
                   "requested_by": requester, "rule": rule}),
        )];
        if started {
            events.push((
                run_id,
                EventKind::ExecutionStarted,
                json!({"invocation_id": invocation_id, "tool_id": triple.tool_id, "tool_call_id": triple.tool_call_id}),
            ));
        }
        events
    }
}

/// The first command of a grant on SQLite ([`Store::grant_in_two_commands`]), which begins
/// its transaction: [`grant_update!`] answering also the run's last event id and hash, then
/// the invocation — still awaiting approval, which it is only when this grant just granted
/// it — claimed for `$9` with the lease `$10` (`running`), or `queued` when `$9` is null,
/// answered whole.
const GRANT_SQLITE: &str = concat!(
    "BEGIN IMMEDIATE;\n",
    grant_update!(),
    "
RETURNING invocation_id, run_id, owner_id, rule,
    (SELECT event_seq FROM runs WHERE runs.id = approvals.run_id) AS event_seq,
    (SELECT last_hash FROM runs WHERE runs.id = approvals.run_id) AS last_hash;
UPDATE invocations SET status = CASE WHEN $9 IS NULL THEN 'queued' ELSE 'running' END, claimed_by = $9,
    lease_until = $10, started_at = CASE WHEN $9 IS NULL THEN started_at ELSE $3 END, updated_at = $3,
    queue_tag = $11
WHERE id = (SELECT invocation_id FROM approvals WHERE id = $4 AND status = 'granted')
  AND status = 'awaiting_approval'
RETURNING *"
);

/// A grant on Postgres in one statement ([`Store::grant_in_one_statement`]): `$1`–`$8` as
/// [`grant_update!`], which must also find the approval's invocation `$12`, run `$13`,
/// requester `$14` and rule `$15` as read before (they never change); then the invocation —
/// still awaiting approval — claimed for `$9` with the lease `$10` (`running`), or `queued`
/// when `$9` is null; the trace context `$11` when given; and the events `$16` (`type, data,
/// h` = content hash`, ord, src`: `g` always, `s` only when the claim took) numbered and
/// hash-chained after the run's last event under its counter's lock
/// (`chain_events_postgres!`). No row when nothing was granted; else one row: the
/// invocation as updated (its columns null when the update missed) and the run's new last
/// event id (`last_event_seq`).
const GRANT_POSTGRES: &str = concat!(
    "WITH g AS (",
    grant_update!(),
    "
  AND invocation_id = $12 AND run_id = $13 AND owner_id = $14 AND rule = $15
  RETURNING invocation_id, run_id),
     cl AS (UPDATE invocations SET status = CASE WHEN $9::text IS NULL THEN 'queued' ELSE 'running' END,
                claimed_by = $9::text, lease_until = $10::text,
                started_at = CASE WHEN $9::text IS NULL THEN started_at ELSE $3 END, updated_at = $3,
                queue_tag = $17
            WHERE id = (SELECT invocation_id FROM g) AND status = 'awaiting_approval'
            RETURNING *),
     trc AS (INSERT INTO invocation_traces (invocation_id, trace_parent)
             SELECT invocation_id, $11::text FROM g WHERE $11::text IS NOT NULL
             ON CONFLICT (invocation_id) DO UPDATE SET trace_parent = excluded.trace_parent),
     v AS (SELECT g.run_id, e.type, e.data, e.h, e.ord, ROW_NUMBER() OVER (ORDER BY e.ord) AS rn
           FROM g, json_to_recordset($16::json) AS e(type text, data text, h text, ord bigint, src text)
           WHERE e.src = 'g' OR EXISTS (SELECT 1 FROM cl WHERE cl.status = 'running')),",
    chain_events_postgres!("$3"),
    "SELECT cl.*, c.event_seq AS last_event_seq FROM g LEFT JOIN cl ON true LEFT JOIN c ON true"
);

/// Records the trace context `$2` of the request that made invocation `$1` runnable.
const TRACE_UPSERT: &str = "INSERT INTO invocation_traces (invocation_id, trace_parent) VALUES ($1, $2)
    ON CONFLICT (invocation_id) DO UPDATE SET trace_parent = excluded.trace_parent";
