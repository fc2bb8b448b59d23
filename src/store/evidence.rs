//! Evidence rows and the Planner's acceptance of them.

use serde::Serialize;
use serde_json::json;

use super::TASK_PREFIX_CHARS;
use super::{Backend, Store, StoreResult};
use crate::events::EventKind;
pub use crate::evidence::EvidenceDraft;
use crate::ids;
use crate::state::OptionalFlag;

/// A stored piece of evidence.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct EvidenceRow {
    /// `evd_…`
    pub id: String,
    /// The run.
    pub run_id: String,
    /// The invocation that produced it.
    pub invocation_id: String,
    /// Owner.
    pub owner_id: String,
    /// The tool.
    pub tool_id: String,
    /// Kind of fact.
    pub kind: String,
    /// Provenance JSON text.
    pub provenance: String,
    /// Lowercase hex SHA-256.
    pub content_sha256: String,
    /// Bounded excerpt.
    pub excerpt: String,
    /// RFC 3339.
    pub created_at: String,
    /// The Planner's acceptance: None until judged, then true (accepted) or false (rejected).
    #[sqlx(try_from = "OptionalFlag")]
    pub accepted: Option<bool>,
    /// The Planner's note.
    pub acceptance_note: Option<String>,
    /// RFC 3339.
    pub accepted_at: Option<String>,
    /// The judging user.
    pub accepted_by: Option<String>,
}

impl Store {
    /// The caller's evidence, or None.
    pub async fn evidence_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<EvidenceRow>> {
        Ok(sqlx::query_as("SELECT * FROM evidence WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// A run's evidence, oldest first.
    pub async fn list_evidence(&self, run_id: &str, cursor: Option<&str>, limit: i64) -> StoreResult<Vec<EvidenceRow>> {
        Ok(sqlx::query_as("SELECT * FROM evidence WHERE run_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3")
            .bind(run_id)
            // An empty cursor is no cursor (as it always was).
            .bind(cursor.filter(|c| !c.is_empty()))
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    /// For each of `invocation_ids` (in order): its approval request's id, if it has one, and
    /// its evidence ids, oldest first — what [`Store::approval_id_of`] and
    /// [`Store::evidence_ids_of`] answer, for any number of invocations in one statement.
    pub async fn invocation_links(&self, invocation_ids: &[&str]) -> StoreResult<Vec<(Option<String>, Vec<String>)>> {
        if invocation_ids.is_empty() {
            return Ok(Vec::new());
        }
        // On Postgres `= ANY(ARRAY(…))` is an index condition whatever the statistics say.
        let among = match self.backend {
            Backend::Sqlite => "IN (SELECT value FROM json_each($1))",
            Backend::Postgres => "= ANY(ARRAY(SELECT json_array_elements_text($1::json)))",
        };
        let rows: Vec<(String, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT invocation_id, 'a', id FROM approvals WHERE invocation_id {among}
             UNION ALL SELECT invocation_id, 'e', id FROM evidence WHERE invocation_id {among}
             ORDER BY 1, 2, 3"
        )))
        .bind(serde_json::to_string(invocation_ids)?)
        .fetch_all(self.pool())
        .await?;
        let mut links: std::collections::HashMap<String, (Option<String>, Vec<String>)> =
            std::collections::HashMap::new();
        for (invocation_id, kind, id) in rows {
            let link = links.entry(invocation_id).or_default();
            if kind == "a" {
                link.0 = Some(id);
            } else {
                link.1.push(id);
            }
        }
        Ok(invocation_ids.iter().map(|id| links.get(*id).cloned().unwrap_or_default()).collect())
    }

    /// Evidence ids of one invocation, oldest first.
    pub async fn evidence_ids_of(&self, invocation_id: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT id FROM evidence WHERE invocation_id = $1 ORDER BY id")
            .bind(invocation_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Records the Planner's judgement (a later judgement replaces an earlier one; each is an
    /// `evidence.accepted` event). None when the evidence is not the caller's.
    pub async fn judge_evidence(
        &self,
        owner_id: &str,
        id: &str,
        accepted: bool,
        note: Option<&str>,
    ) -> StoreResult<Option<EvidenceRow>> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let row: Option<EvidenceRow> = sqlx::query_as(
            "UPDATE evidence SET accepted = $1, acceptance_note = $2, accepted_at = $3, accepted_by = $4
             WHERE id = $5 AND owner_id = $4 RETURNING *",
        )
        .bind(i64::from(accepted))
        .bind(note)
        .bind(&now)
        .bind(owner_id)
        .bind(id)
        .fetch_optional(tx.conn())
        .await?;
        if let Some(row) = &row {
            tx.append_event(
                &row.run_id,
                EventKind::EvidenceAccepted,
                &json!({"evidence_id": row.id, "invocation_id": row.invocation_id, "accepted": accepted, "note": note}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    /// The owner's most recent past uses ([`crate::exposure::usage`]): (task prefix, tool id)
    /// of the invocations whose evidence the owner accepted, most recently accepted first,
    /// from the `scan` most recent acceptances (the index `evidence_accepted` bounds the read,
    /// however much evidence the owner has). The task is cut to its first
    /// [`TASK_PREFIX_CHARS`] characters (the embedding model reads less). Pairs repeat when
    /// the same task and tool were accepted more than once.
    pub async fn accepted_uses(&self, owner_id: &str, scan: usize) -> StoreResult<Vec<(String, String)>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT substr(t.task, 1, {TASK_PREFIX_CHARS}), i.tool_id FROM
               (SELECT invocation_id, accepted_at, id FROM evidence WHERE owner_id = $1 AND accepted = 1
                ORDER BY accepted_at DESC, id DESC LIMIT $2) e
             JOIN invocations i ON i.id = e.invocation_id JOIN turns t ON t.id = i.turn_id
             ORDER BY e.accepted_at DESC, e.id DESC"
        )))
        .bind(owner_id)
        .bind(i64::try_from(scan).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await?)
    }
}
