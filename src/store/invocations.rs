//! Frozen invocations: insert once, then only status and result change, each change by a
//! compare-and-set on the previous status so that two tasks can never both move it.

use serde::Serialize;
use serde_json::json;

use super::ApprovalRule;
use super::evidence::EvidenceDraft;
use super::{Backend, Store, StoreError, StoreResult, WriteTx};
use crate::events::EventKind;
use crate::ids;
use crate::state::{Flag, InvocationStatus};

/// A stored invocation.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct InvocationRow {
    /// `inv_…`
    pub id: String,
    /// The run.
    pub run_id: String,
    /// The turn whose exposure allowed the call.
    pub turn_id: String,
    /// Owner.
    pub owner_id: String,
    /// Tool id (for MCP tools the projected id).
    pub tool_id: String,
    /// The model's call id; unique per run.
    pub tool_call_id: String,
    /// Canonical input (RFC 8785 JSON text).
    pub input: String,
    /// Lowercase hex SHA-256 of the canonical `{"input", "tool_id"}` document.
    pub input_hash: String,
    /// True when the policy demanded approval at freeze time.
    #[sqlx(try_from = "Flag")]
    pub approval_required: bool,
    /// Where it stands.
    pub status: InvocationStatus,
    /// `{ok, output, error?}` once finished.
    pub result: Option<String>,
    /// Node that claimed it for execution.
    pub claimed_by: Option<String>,
    /// Until when the claim holds without renewal.
    pub lease_until: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, last status change.
    pub updated_at: String,
    /// RFC 3339, when execution started.
    pub started_at: Option<String>,
    /// RFC 3339, when it reached a final status.
    pub finished_at: Option<String>,
    /// RFC 3339, when a cancel was asked while it ran (see [`Store::request_cancel`]).
    pub cancel_requested_at: Option<String>,
    /// Who asked for that cancel.
    pub cancel_requested_by: Option<String>,
    /// With which token.
    pub cancel_token_id: Option<String>,
}

/// The approval request created with a frozen invocation.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// What the approver sees besides the frozen call (reasons, the tool's preview), JSON.
    pub preview: serde_json::Value,
    /// RFC 3339 expiry.
    pub expires_at: String,
    /// Who may grant it, fixed from now on.
    pub rule: ApprovalRule,
    /// The tool domain that demanded four-eyes, if it applies.
    pub rule_domain: Option<String>,
}

impl ApprovalRequest {
    /// A self-approval request.
    pub fn new(preview: serde_json::Value, expires_at: String) -> Self {
        Self { preview, expires_at, rule: ApprovalRule::SelfApproval, rule_domain: None }
    }
}

/// What a cancel of a running invocation was recorded as.
#[derive(Debug)]
pub enum CancelRequest {
    /// Recorded now (the row after the update).
    Recorded(InvocationRow),
    /// A cancel had been recorded before; the row as it is.
    AlreadyRequested(InvocationRow),
    /// Not running (any more): the row as it is.
    NotRunning(InvocationRow),
}

/// Everything needed to insert a frozen invocation.
#[derive(Debug, Clone)]
pub struct NewInvocation {
    /// The run.
    pub run_id: String,
    /// The turn.
    pub turn_id: String,
    /// Owner.
    pub owner_id: String,
    /// Tool id.
    pub tool_id: String,
    /// Call id.
    pub tool_call_id: String,
    /// Canonical input JSON text.
    pub input: String,
    /// Hash of the canonical document.
    pub input_hash: String,
    /// When set, an approval request is created with it.
    pub approval: Option<ApprovalRequest>,
}

/// Result of [`Store::freeze_invocation`].
#[derive(Debug)]
pub enum FreezeOutcome {
    /// A new invocation (and approval id if one was created).
    Created(InvocationRow, Option<String>),
    /// The run already had this call id; the caller compares the triple.
    Existing(InvocationRow, Option<String>),
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalStatus {
    /// The tool returned a result.
    Completed,
    /// The tool returned an error.
    Failed,
    /// The Planner cancelled it while it ran.
    Cancelled,
    /// Its outcome cannot be known (`outcome_unknown`: a device runner went away with it);
    /// it is never run again.
    Interrupted,
}

impl FinalStatus {
    /// The invocation status it is stored as.
    pub fn status(self) -> InvocationStatus {
        match self {
            Self::Completed => InvocationStatus::Completed,
            Self::Failed => InvocationStatus::Failed,
            Self::Cancelled => InvocationStatus::Cancelled,
            Self::Interrupted => InvocationStatus::Interrupted,
        }
    }
}

/// An invocation claimed for execution by this node.
pub type ClaimedInvocation = InvocationRow;

impl Store {
    /// Inserts a frozen invocation (plus its approval request and events) unless the run
    /// already has `tool_call_id`, in which case the existing one is returned untouched.
    pub async fn freeze_invocation(&self, new: &NewInvocation) -> StoreResult<FreezeOutcome> {
        match self.insert_invocation(new).await {
            Ok(created) => Ok(created),
            Err(e) if e.is_unique_violation() => {
                // Lost a race with the same call id: report the winner.
                let existing = self.invocation_by_call(&new.run_id, &new.tool_call_id).await?.ok_or(e)?;
                let approval = self.approval_id_of(&existing.id).await?;
                Ok(FreezeOutcome::Existing(existing, approval))
            }
            Err(e) => Err(e),
        }
    }

    async fn insert_invocation(&self, new: &NewInvocation) -> StoreResult<FreezeOutcome> {
        let now = ids::now();
        let status = if new.approval.is_some() { InvocationStatus::AwaitingApproval } else { InvocationStatus::Queued };
        let row = InvocationRow {
            id: ids::new_id("inv"),
            run_id: new.run_id.clone(),
            turn_id: new.turn_id.clone(),
            owner_id: new.owner_id.clone(),
            tool_id: new.tool_id.clone(),
            tool_call_id: new.tool_call_id.clone(),
            input: new.input.clone(),
            input_hash: new.input_hash.clone(),
            approval_required: new.approval.is_some(),
            status,
            result: None,
            claimed_by: None,
            lease_until: None,
            created_at: now.clone(),
            updated_at: now.clone(),
            started_at: None,
            finished_at: None,
            cancel_requested_at: None,
            cancel_requested_by: None,
            cancel_token_id: None,
        };
        let mut tx = self.begin_write().await?;
        // Re-check inside the write lock on SQLite (one writer: a cheap in-process read).
        // Postgres relies on the unique index and the caller's fallback, saving a round trip.
        let dup: Option<String> = match self.backend() {
            Backend::Sqlite => {
                sqlx::query_scalar("SELECT id FROM invocations WHERE run_id = $1 AND tool_call_id = $2")
                    .bind(&new.run_id)
                    .bind(&new.tool_call_id)
                    .fetch_optional(tx.conn())
                    .await?
            }
            Backend::Postgres => None,
        };
        if let Some(id) = dup {
            drop(tx);
            let existing = self
                .invocation_by_id(&id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("invocation {id} vanished")))?;
            let approval = self.approval_id_of(&existing.id).await?;
            return Ok(FreezeOutcome::Existing(existing, approval));
        }
        sqlx::query(
            "INSERT INTO invocations (id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
                approval_required, status, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)",
        )
        .bind(&row.id)
        .bind(&row.run_id)
        .bind(&row.turn_id)
        .bind(&row.owner_id)
        .bind(&row.tool_id)
        .bind(&row.tool_call_id)
        .bind(&row.input)
        .bind(&row.input_hash)
        .bind(i64::from(row.approval_required))
        .bind(row.status)
        .bind(&now)
        .execute(tx.conn())
        .await?;
        // While traces are exported: the freeze request's trace, for the execution span.
        if let Some(traceparent) = crate::telemetry::current_traceparent() {
            sqlx::query("INSERT INTO invocation_traces (invocation_id, trace_parent) VALUES ($1, $2)")
                .bind(&row.id)
                .bind(traceparent)
                .execute(tx.conn())
                .await?;
        }
        let input: serde_json::Value = serde_json::from_str(&row.input)?;
        tx.append_event(
            &row.run_id,
            EventKind::InvocationFrozen,
            &json!({
                "invocation_id": row.id, "turn_id": row.turn_id, "tool_id": row.tool_id,
                "tool_call_id": row.tool_call_id, "input_hash": row.input_hash, "input": input,
                "status": row.status,
            }),
        )
        .await?;
        let mut approval_id = None;
        if let Some(request) = &new.approval {
            let (preview, expires_at) = (&request.preview, &request.expires_at);
            let id = ids::new_id("apr");
            sqlx::query(
                "INSERT INTO approvals (id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash,
                    status, preview, expires_at, created_at, rule, rule_domain)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $10, $11, $12)",
            )
            .bind(&id)
            .bind(&row.id)
            .bind(&row.run_id)
            .bind(&row.owner_id)
            .bind(&row.tool_id)
            .bind(&row.tool_call_id)
            .bind(&row.input_hash)
            .bind(preview.to_string())
            .bind(expires_at)
            .bind(&now)
            .bind(request.rule.as_str())
            .bind(request.rule_domain.as_deref())
            .execute(tx.conn())
            .await?;
            tx.append_event(
                &row.run_id,
                EventKind::ApprovalRequested,
                &json!({
                    "approval_id": id, "invocation_id": row.id, "tool_id": row.tool_id,
                    "tool_call_id": row.tool_call_id, "input_hash": row.input_hash,
                    "expires_at": expires_at, "rule": request.rule.as_str(), "rule_domain": request.rule_domain,
                }),
            )
            .await?;
            approval_id = Some(id);
        }
        tx.commit().await?;
        Ok(FreezeOutcome::Created(row, approval_id))
    }

    /// The invocation with this call id in the run.
    pub async fn invocation_by_call(&self, run_id: &str, tool_call_id: &str) -> StoreResult<Option<InvocationRow>> {
        Ok(sqlx::query_as("SELECT * FROM invocations WHERE run_id = $1 AND tool_call_id = $2")
            .bind(run_id)
            .bind(tool_call_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// An invocation by id, whoever owns it (for the harness).
    pub async fn invocation_by_id(&self, id: &str) -> StoreResult<Option<InvocationRow>> {
        Ok(sqlx::query_as("SELECT * FROM invocations WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// The caller's invocation, or None.
    pub async fn invocation_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<InvocationRow>> {
        Ok(sqlx::query_as("SELECT * FROM invocations WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// A run's invocations, oldest first.
    pub async fn list_invocations(
        &self,
        run_id: &str,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<InvocationRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM invocations WHERE run_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3",
        )
        .bind(run_id)
        // An empty cursor is no cursor (as it always was).
        .bind(cursor.filter(|c| !c.is_empty()))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// Claims the oldest queued invocation that may run (see [`Store::claim_batch`]).
    pub async fn claim_next(&self, node_id: &str, lease_ms: u64) -> StoreResult<Option<ClaimedInvocation>> {
        Ok(self.claim_batch(node_id, lease_ms, 1).await?.into_iter().next())
    }

    /// Claims up to `limit` of the oldest queued invocations that may run: approval-free, or
    /// carrying a granted approval whose triple equals the invocation's (and, when its rule
    /// is four-eyes, decided by another user who is an admin or approver). Sets `running`,
    /// the claimer and a lease, and appends one `execution.started` each, all in one
    /// transaction of five statements whatever `limit` is. Two claimers can never get the
    /// same row (SQLite: one writer; Postgres: `FOR UPDATE SKIP LOCKED`, and the final
    /// `status = 'queued'` compare-and-set). Returned oldest first.
    ///
    /// On Postgres two claimers' batches may touch the same runs' event counters in different
    /// orders; a deadlock then aborts one transaction, which changes nothing (its rows stay
    /// queued) and is an error the caller retries.
    pub async fn claim_batch(&self, node_id: &str, lease_ms: u64, limit: usize) -> StoreResult<Vec<ClaimedInvocation>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Postgres: `= ANY(ARRAY(…))` makes the locking subquery an init plan, run once; under
        // `IN (…)` the planner may re-run it per row, and with SKIP LOCKED each run picks other
        // rows (more than `limit` were claimed).
        let (open, lock, close) = match self.backend() {
            Backend::Sqlite => ("IN (", "", ")"),
            Backend::Postgres => ("= ANY(ARRAY(", "FOR UPDATE OF i SKIP LOCKED", "))"),
        };
        let sql = format!(
            "UPDATE invocations SET status = 'running', claimed_by = $1, lease_until = $2, started_at = $3, updated_at = $3
             WHERE id {open}
                SELECT i.id FROM invocations i
                WHERE i.status = 'queued'
                  AND (i.approval_required = 0 OR EXISTS (
                        SELECT 1 FROM approvals a
                        WHERE a.invocation_id = i.id AND a.status = 'granted'
                          AND a.tool_id = i.tool_id AND a.tool_call_id = i.tool_call_id
                          AND a.input_hash = i.input_hash
                          AND (a.rule = 'self_approval' OR EXISTS (
                                SELECT 1 FROM users u
                                WHERE u.id = a.decided_by AND u.id <> i.owner_id
                                  AND (u.is_admin <> 0 OR u.is_approver <> 0)))))
                ORDER BY i.id LIMIT $4 {lock}
             {close} AND status = 'queued'
             RETURNING *"
        );
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let mut rows: Vec<InvocationRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(node_id)
            .bind(ids::now_plus_ms(lease_ms))
            .bind(&now)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(tx.conn())
            .await?;
        if rows.is_empty() {
            return Ok(rows);
        }
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        let events: Vec<_> = rows
            .iter()
            .map(|row| {
                (
                    row.run_id.as_str(),
                    EventKind::ExecutionStarted,
                    json!({"invocation_id": row.id, "tool_id": row.tool_id, "tool_call_id": row.tool_call_id}),
                )
            })
            .collect();
        tx.append_events(&events).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// Extends this node's lease on a running invocation. False when the claim was lost.
    pub async fn renew_lease(&self, id: &str, node_id: &str, lease_ms: u64) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE invocations SET lease_until = $1 WHERE id = $2 AND status = 'running' AND claimed_by = $3",
        )
        .bind(ids::now_plus_ms(lease_ms))
        .bind(id)
        .bind(node_id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records the end of an execution claimed by `node_id`: final status, result, evidence
    /// and events in one transaction. Returns the evidence ids, or None when the claim was
    /// lost meanwhile (the invocation was marked interrupted) and nothing was written.
    pub async fn finish_invocation(
        &self,
        inv: &InvocationRow,
        node_id: &str,
        status: FinalStatus,
        result: &serde_json::Value,
        evidence: &[EvidenceDraft],
    ) -> StoreResult<Option<Vec<String>>> {
        let now = ids::now();
        let ok = status == FinalStatus::Completed;
        let status = status.status();
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE invocations SET status = $1, result = $2, finished_at = $3, updated_at = $3, lease_until = NULL
             WHERE id = $4 AND status = 'running' AND claimed_by = $5",
        )
        .bind(status)
        .bind(result.to_string())
        .bind(&now)
        .bind(&inv.id)
        .bind(node_id)
        .execute(tx.conn())
        .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let mut evidence_ids = Vec::with_capacity(evidence.len());
        for draft in evidence {
            let id = insert_evidence(&mut tx, inv, draft, &now).await?;
            evidence_ids.push(id);
        }
        let kind = if ok { EventKind::ExecutionCompleted } else { EventKind::ExecutionFailed };
        let mut events = Vec::with_capacity(1 + evidence.len());
        events.push((
            inv.run_id.as_str(),
            kind,
            json!({
                "invocation_id": inv.id, "tool_id": inv.tool_id, "tool_call_id": inv.tool_call_id,
                "status": status, "error": result.get("error"), "evidence_ids": evidence_ids,
            }),
        ));
        for (id, draft) in evidence_ids.iter().zip(evidence) {
            events.push((
                inv.run_id.as_str(),
                EventKind::EvidenceRecorded,
                json!({
                    "evidence_id": id, "invocation_id": inv.id, "tool_id": inv.tool_id,
                    "kind": draft.kind, "content_sha256": draft.content_sha256,
                }),
            ));
        }
        tx.append_events(&events).await?;
        tx.commit().await?;
        Ok(Some(evidence_ids))
    }

    /// Marks as `interrupted` every running invocation claimed by a node id starting with
    /// `dead_node_prefix` (earlier incarnations of this server) or
    /// whose lease ran out, with an `execution.failed` event each. They are never re-run.
    /// `dead_node_prefix` None sweeps expired leases only.
    pub async fn interrupt_orphans(&self, dead_node_prefix: Option<&str>) -> StoreResult<u64> {
        let now = ids::now();
        let orphans: Vec<InvocationRow> = sqlx::query_as(
            "SELECT * FROM invocations WHERE status = 'running'
             AND (($1 IS NOT NULL AND substr(claimed_by, 1, length($1)) = $1) OR lease_until < $2)",
        )
        // An empty prefix would match every node: it sweeps expired leases only (as it always did).
        .bind(dead_node_prefix.filter(|p| !p.is_empty()))
        .bind(&now)
        .fetch_all(self.pool())
        .await?;
        let mut count = 0;
        for inv in orphans {
            let mut tx = self.begin_write().await?;
            let result = json!({"ok": false, "output": null, "error": {
                "code": "interrupted",
                "message": "the server stopped while this invocation ran; it was not re-run",
            }});
            let done = sqlx::query(
                "UPDATE invocations SET status = 'interrupted', result = $1, finished_at = $2, updated_at = $2, lease_until = NULL
                 WHERE id = $3 AND status = 'running' AND (claimed_by = $4 OR lease_until < $2)",
            )
            .bind(result.to_string())
            .bind(&now)
            .bind(&inv.id)
            .bind(inv.claimed_by.as_deref())
            .execute(tx.conn())
            .await?;
            if done.rows_affected() == 1 {
                tx.append_event(
                    &inv.run_id,
                    EventKind::ExecutionFailed,
                    &json!({"invocation_id": inv.id, "tool_id": inv.tool_id, "tool_call_id": inv.tool_call_id,
                            "status": "interrupted", "error": result["error"]}),
                )
                .await?;
                count += 1;
            }
            tx.commit().await?;
        }
        Ok(count)
    }

    /// Cancels the caller's invocation if it has not started (awaiting approval or queued);
    /// its pending approval becomes `cancelled`, recording who cancelled it with which token
    /// (also in the `invocation.cancelled` event). Returns the row after the attempt.
    ///
    /// Rows are locked in the order every decision takes them — the approval, then the
    /// invocation, then the run's event counter — so a cancel racing a grant, deny or expiry
    /// waits for it instead of deadlocking (Postgres aborted one of the two, a 500).
    pub async fn cancel_invocation(
        &self,
        owner_id: &str,
        id: &str,
        token_id: &str,
    ) -> StoreResult<Option<(InvocationRow, bool)>> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let approval = sqlx::query(
            "UPDATE approvals SET status = 'cancelled', decided_at = $1, decided_by = $3, decided_token_id = $4
             WHERE invocation_id = $2 AND owner_id = $3 AND status = 'pending'
               AND EXISTS (SELECT 1 FROM invocations i WHERE i.id = $2 AND i.status = 'awaiting_approval')",
        )
        .bind(&now)
        .bind(id)
        .bind(owner_id)
        .bind(token_id)
        .execute(tx.conn())
        .await?;
        let row: Option<InvocationRow> = sqlx::query_as(
            "UPDATE invocations SET status = 'cancelled', finished_at = $1, updated_at = $1
             WHERE id = $2 AND owner_id = $3 AND status IN ('awaiting_approval', 'queued')
             RETURNING *",
        )
        .bind(&now)
        .bind(id)
        .bind(owner_id)
        .fetch_optional(tx.conn())
        .await?;
        let Some(row) = row else {
            drop(tx);
            return Ok(self.invocation_for(owner_id, id).await?.map(|r| (r, false)));
        };
        tx.append_event(
            &row.run_id,
            EventKind::InvocationCancelled,
            &json!({"invocation_id": row.id, "tool_id": row.tool_id, "tool_call_id": row.tool_call_id,
                    "approval_cancelled": approval.rows_affected() == 1,
                    "decided_by": owner_id, "token_id": token_id, "decided_at": now}),
        )
        .await?;
        tx.commit().await?;
        Ok(Some((row, true)))
    }
}

impl Store {
    /// Records a cancel asked by the owner of a running invocation (who, with which token,
    /// when) with an `invocation.cancel_requested` event. The harness decides what it
    /// achieves and the final status says so; this only makes the request durable, also for
    /// the server that runs it when that is another replica (it polls
    /// [`Store::cancel_requests`]). None when the caller has no such invocation.
    pub async fn request_cancel(&self, owner_id: &str, id: &str, token_id: &str) -> StoreResult<Option<CancelRequest>> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let row: Option<InvocationRow> = sqlx::query_as(
            "UPDATE invocations SET cancel_requested_at = $1, cancel_requested_by = $3, cancel_token_id = $4
             WHERE id = $2 AND owner_id = $3 AND status = 'running' AND cancel_requested_at IS NULL
             RETURNING *",
        )
        .bind(&now)
        .bind(id)
        .bind(owner_id)
        .bind(token_id)
        .fetch_optional(tx.conn())
        .await?;
        let Some(row) = row else {
            drop(tx);
            return Ok(self.invocation_for(owner_id, id).await?.map(|row| {
                if row.status == InvocationStatus::Running {
                    CancelRequest::AlreadyRequested(row)
                } else {
                    CancelRequest::NotRunning(row)
                }
            }));
        };
        tx.append_event(
            &row.run_id,
            EventKind::InvocationCancelRequested,
            &json!({"invocation_id": row.id, "tool_id": row.tool_id, "tool_call_id": row.tool_call_id,
                    "requested_by": owner_id, "token_id": token_id, "requested_at": now}),
        )
        .await?;
        tx.commit().await?;
        Ok(Some(CancelRequest::Recorded(row)))
    }

    /// Ids of the invocations `node_id` runs that have a recorded cancel request.
    pub async fn cancel_requests(&self, node_id: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM invocations WHERE status = 'running' AND claimed_by = $1 AND cancel_requested_at IS NOT NULL",
        )
        .bind(node_id)
        .fetch_all(self.pool())
        .await?)
    }
}

async fn insert_evidence(
    tx: &mut WriteTx,
    inv: &InvocationRow,
    draft: &EvidenceDraft,
    now: &str,
) -> StoreResult<String> {
    let id = ids::new_id("evd");
    sqlx::query(
        "INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256, excerpt, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&id)
    .bind(&inv.run_id)
    .bind(&inv.id)
    .bind(&inv.owner_id)
    .bind(&inv.tool_id)
    .bind(&draft.kind)
    .bind(draft.provenance.to_string())
    .bind(&draft.content_sha256)
    .bind(&draft.excerpt)
    .bind(now)
    .execute(tx.conn())
    .await?;
    Ok(id)
}
