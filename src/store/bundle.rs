//! Reading a whole run for its bundle (docs/verify.md): the stored rows as they are, nothing
//! recomputed, so that `mira verify` judges what the store holds.

use serde_json::{Value, json};

use super::{EventRow, EvidenceRow, InvocationRow, Store, StoreResult, json_col};

/// Events read per query while a bundle is built.
const EVENTS_PER_PAGE: i64 = 1000;

/// What [`Store::run_document`] found.
#[derive(Debug)]
pub enum RunDocument {
    /// No such run.
    NotFound,
    /// The run's records are larger than the limit (bytes counted so far).
    TooLarge(usize),
    /// The unsigned bundle document (without `signature`).
    Document(Value),
}

/// A stored event with its chain columns.
#[derive(Debug, Clone, sqlx::FromRow)]
struct ChainedEvent {
    #[sqlx(flatten)]
    event: EventRow,
    content_hash: Option<String>,
    prev_hash: Option<String>,
    hash: Option<String>,
}

/// A text column as JSON, or the text itself (a string) when it does not parse: an altered
/// row must reach the verifier as it is, not fail the export.
fn json_or_text(text: &str) -> Value {
    json_col(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Adds the JSON length of `v` to `size`; the new size.
fn grow(size: &mut usize, v: &Value) -> usize {
    *size += v.to_string().len();
    *size
}

impl Store {
    /// Run `run_id` as one unsigned bundle document (docs/verify.md, Format): the run, its
    /// exposures, frozen calls with results, approvals with who decided, evidence with its
    /// stored content (excerpt) and every event with its hashes. [`RunDocument::TooLarge`]
    /// when the records' text passes `max_bytes`. Owner checks are the caller's.
    pub async fn run_document(&self, run_id: &str, max_bytes: usize) -> StoreResult<RunDocument> {
        type RunCols = (String, String, String, Option<String>, Option<String>, i64, String, Option<String>, i64);
        let run: Option<RunCols> = sqlx::query_as(
            "SELECT id, owner_id, workspace_id, device_id, title, event_seq, created_at, last_hash, chain_from
             FROM runs WHERE id = $1",
        )
        .bind(run_id)
        .fetch_optional(self.pool())
        .await?;
        let Some((id, owner_id, workspace_id, device_id, title, event_seq, created_at, last_hash, chain_from)) = run
        else {
            return Ok(RunDocument::NotFound);
        };
        let owner_name: Option<String> = sqlx::query_scalar("SELECT name FROM users WHERE id = $1")
            .bind(&owner_id)
            .fetch_optional(self.pool())
            .await?;
        let mut size = 0usize;

        let turns: Vec<(String, String, Option<String>, String, String)> =
            sqlx::query_as("SELECT id, task, context, exposure, created_at FROM turns WHERE run_id = $1 ORDER BY id")
                .bind(&id)
                .fetch_all(self.pool())
                .await?;
        let mut exposures = Vec::with_capacity(turns.len());
        for (turn_id, task, context, exposure, at) in turns {
            let v = json!({"turn_id": turn_id, "task": task, "context": context, "created_at": at,
                           "exposure": json_or_text(&exposure)});
            if grow(&mut size, &v) > max_bytes {
                return Ok(RunDocument::TooLarge(size));
            }
            exposures.push(v);
        }

        let rows: Vec<InvocationRow> = sqlx::query_as("SELECT * FROM invocations WHERE run_id = $1 ORDER BY id")
            .bind(&id)
            .fetch_all(self.pool())
            .await?;
        let mut invocations = Vec::with_capacity(rows.len());
        for r in rows {
            let v = json!({
                "id": r.id, "turn_id": r.turn_id, "tool_id": r.tool_id, "tool_call_id": r.tool_call_id,
                "input": json_or_text(&r.input), "input_hash": r.input_hash,
                "approval_required": r.approval_required, "status": r.status,
                "result": r.result.as_deref().map(json_or_text),
                "created_at": r.created_at, "started_at": r.started_at, "finished_at": r.finished_at,
            });
            if grow(&mut size, &v) > max_bytes {
                return Ok(RunDocument::TooLarge(size));
            }
            invocations.push(v);
        }

        type ApprovalCols = (
            String,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            String,
        );
        let rows: Vec<ApprovalCols> = sqlx::query_as(
            "SELECT a.id, a.invocation_id, a.tool_id, a.tool_call_id, a.input_hash, a.status, a.reason, a.expires_at,
                    a.decided_by, u.name, a.decided_token_id, a.decided_at, a.created_at
             FROM approvals a LEFT JOIN users u ON u.id = a.decided_by
             WHERE a.run_id = $1 ORDER BY a.id",
        )
        .bind(&id)
        .fetch_all(self.pool())
        .await?;
        let approvals: Vec<Value> = rows
            .into_iter()
            .map(|(aid, inv, tool, call, hash, status, reason, expires, by, by_name, token, at, created)| {
                json!({"id": aid, "invocation_id": inv, "tool_id": tool, "tool_call_id": call, "input_hash": hash,
                       "status": status, "reason": reason, "expires_at": expires, "decided_by": by,
                       "decided_by_name": by_name, "decided_token_id": token, "decided_at": at,
                       "created_at": created})
            })
            .collect();

        let rows: Vec<EvidenceRow> = sqlx::query_as("SELECT * FROM evidence WHERE run_id = $1 ORDER BY id")
            .bind(&id)
            .fetch_all(self.pool())
            .await?;
        let mut evidence = Vec::with_capacity(rows.len());
        for e in rows {
            let v = json!({
                "id": e.id, "invocation_id": e.invocation_id, "tool_id": e.tool_id, "kind": e.kind,
                "provenance": json_or_text(&e.provenance), "content_sha256": e.content_sha256,
                "excerpt": e.excerpt, "created_at": e.created_at, "accepted": e.accepted,
                "acceptance_note": e.acceptance_note, "accepted_at": e.accepted_at, "accepted_by": e.accepted_by,
            });
            if grow(&mut size, &v) > max_bytes {
                return Ok(RunDocument::TooLarge(size));
            }
            evidence.push(v);
        }

        let mut events = Vec::new();
        let mut after = 0i64;
        loop {
            let page: Vec<ChainedEvent> =
                sqlx::query_as("SELECT * FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
                    .bind(&id)
                    .bind(after)
                    .bind(EVENTS_PER_PAGE)
                    .fetch_all(self.pool())
                    .await?;
            let Some(last) = page.last() else { break };
            after = last.event.seq;
            let full = page.len() == usize::try_from(EVENTS_PER_PAGE).unwrap_or(usize::MAX);
            for e in page {
                let v = json!({
                    "seq": e.event.seq, "type": e.event.kind, "created_at": e.event.created_at,
                    "data": json_or_text(&e.event.data), "content_hash": e.content_hash,
                    "prev_hash": e.prev_hash, "hash": e.hash,
                });
                if grow(&mut size, &v) > max_bytes {
                    return Ok(RunDocument::TooLarge(size));
                }
                events.push(v);
            }
            if !full {
                break;
            }
        }

        Ok(RunDocument::Document(json!({
            "format": mira_core::chain::BUNDLE_FORMAT,
            "exported_at": crate::ids::now(),
            "run": {"id": id, "owner_id": owner_id, "owner_name": owner_name, "workspace_id": workspace_id,
                    "device_id": device_id, "title": title, "created_at": created_at},
            "chain": {"unchained_before": chain_from, "head_seq": event_seq, "head_hash": last_hash},
            "exposures": exposures,
            "invocations": invocations,
            "approvals": approvals,
            "evidence": evidence,
            "events": events,
        })))
    }
}
