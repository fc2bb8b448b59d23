//! Approval requests and their single decision.
//!
//! A grant is one conditional UPDATE: it succeeds only while the approval is pending and
//! unexpired AND the triple the approver echoed equals both the approval's copy and the
//! frozen invocation's own columns (still awaiting approval). The same transaction moves
//! the invocation to `queued`. Anything else changes nothing and is diagnosed afterwards.

use serde::Serialize;
use serde_json::json;

use super::{Store, StoreResult};
use crate::events::EventKind;
use crate::ids;

/// An approval joined with the frozen invocation it is about.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ApprovalRow {
    /// `apr_…`
    pub id: String,
    /// The invocation.
    pub invocation_id: String,
    /// The run.
    pub run_id: String,
    /// Owner (the only user who may decide).
    pub owner_id: String,
    /// Frozen tool id.
    pub tool_id: String,
    /// Frozen call id.
    pub tool_call_id: String,
    /// Frozen input hash.
    pub input_hash: String,
    /// `pending|granted|denied|expired|cancelled`.
    pub status: String,
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
    pub invocation_status: String,
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
}

const SELECT: &str = "SELECT a.*, i.input, i.turn_id, i.status AS invocation_status
    FROM approvals a JOIN invocations i ON i.id = a.invocation_id";

impl Store {
    /// The caller's approval, or None.
    pub async fn approval_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<ApprovalRow>> {
        let sql = format!("{SELECT} WHERE a.id = $1 AND a.owner_id = $2");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id).bind(owner_id).fetch_optional(self.pool()).await?)
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

    /// The caller's approvals (optionally of one status, one run), oldest first.
    pub async fn list_approvals(
        &self,
        owner_id: &str,
        status: Option<&str>,
        run_id: Option<&str>,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<ApprovalRow>> {
        let sql = format!(
            "{SELECT} WHERE a.owner_id = $1 AND ($2 = '' OR a.status = $2) AND ($3 = '' OR a.run_id = $3)
             AND ($4 = '' OR a.id > $4) ORDER BY a.id LIMIT $5"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(owner_id)
            .bind(status.unwrap_or(""))
            .bind(run_id.unwrap_or(""))
            .bind(cursor.unwrap_or(""))
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    /// Grants the caller's approval `id` iff the echoed triple equals the frozen invocation
    /// (see the module docs). On success the invocation is `queued` for the harness.
    pub async fn grant_approval(
        &self,
        owner_id: &str,
        id: &str,
        triple: &GrantRequest<'_>,
        decided_by: &str,
        token_id: &str,
    ) -> StoreResult<DecideOutcome> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let granted: Option<(String, String)> = sqlx::query_as(
            "UPDATE approvals SET status = 'granted', decided_by = $1, decided_token_id = $2, decided_at = $3
             WHERE id = $4 AND owner_id = $5 AND status = 'pending' AND expires_at > $3
               AND tool_id = $6 AND tool_call_id = $7 AND input_hash = $8
               AND EXISTS (SELECT 1 FROM invocations i
                           WHERE i.id = approvals.invocation_id AND i.status = 'awaiting_approval'
                             AND i.tool_id = $6 AND i.tool_call_id = $7 AND i.input_hash = $8)
             RETURNING invocation_id, run_id",
        )
        .bind(decided_by)
        .bind(token_id)
        .bind(&now)
        .bind(id)
        .bind(owner_id)
        .bind(triple.tool_id)
        .bind(triple.tool_call_id)
        .bind(triple.input_hash)
        .fetch_optional(tx.conn())
        .await?;
        let Some((invocation_id, run_id)) = granted else {
            drop(tx);
            return self.diagnose(owner_id, id, Some(triple)).await;
        };
        sqlx::query(
            "UPDATE invocations SET status = 'queued', updated_at = $1 WHERE id = $2 AND status = 'awaiting_approval'",
        )
        .bind(&now)
        .bind(&invocation_id)
        .execute(tx.conn())
        .await?;
        tx.append_event(
            &run_id,
            EventKind::ApprovalGranted,
            &json!({"approval_id": id, "invocation_id": invocation_id, "tool_id": triple.tool_id,
                    "tool_call_id": triple.tool_call_id, "input_hash": triple.input_hash,
                    "decided_by": decided_by, "token_id": token_id, "decided_at": now}),
        )
        .await?;
        tx.commit().await?;
        self.decided(owner_id, id).await
    }

    /// Denies the caller's pending approval; the invocation becomes `denied`.
    pub async fn deny_approval(
        &self,
        owner_id: &str,
        id: &str,
        reason: Option<&str>,
        decided_by: &str,
        token_id: &str,
    ) -> StoreResult<DecideOutcome> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let denied: Option<(String, String)> = sqlx::query_as(
            "UPDATE approvals SET status = 'denied', decided_by = $1, decided_token_id = $2, decided_at = $3, reason = $4
             WHERE id = $5 AND owner_id = $6 AND status = 'pending' AND expires_at > $3
             RETURNING invocation_id, run_id",
        )
        .bind(decided_by)
        .bind(token_id)
        .bind(&now)
        .bind(reason)
        .bind(id)
        .bind(owner_id)
        .fetch_optional(tx.conn())
        .await?;
        let Some((invocation_id, run_id)) = denied else {
            drop(tx);
            return self.diagnose(owner_id, id, None).await;
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
                    "decided_by": decided_by, "token_id": token_id, "decided_at": now}),
        )
        .await?;
        tx.commit().await?;
        self.decided(owner_id, id).await
    }

    async fn decided(&self, owner_id: &str, id: &str) -> StoreResult<DecideOutcome> {
        Ok(match self.approval_for(owner_id, id).await? {
            Some(row) => DecideOutcome::Decided(row),
            None => DecideOutcome::NotFound,
        })
    }

    /// Why a decision changed nothing.
    async fn diagnose(
        &self,
        owner_id: &str,
        id: &str,
        triple: Option<&GrantRequest<'_>>,
    ) -> StoreResult<DecideOutcome> {
        let Some(row) = self.approval_for(owner_id, id).await? else {
            return Ok(DecideOutcome::NotFound);
        };
        Ok(match row.status.as_str() {
            "expired" => DecideOutcome::Expired(row),
            "pending" if row.expires_at <= ids::now() => DecideOutcome::Expired(row),
            "pending" if row.invocation_status != "awaiting_approval" => DecideOutcome::AlreadyDecided(row),
            "pending" => match triple {
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
