//! Frozen invocations: insert once, then only status and result change, each change by a
//! compare-and-set on the previous status so that two tasks can never both move it.

use serde::Serialize;
use serde_json::json;

use super::ApprovalRule;
use super::evidence::EvidenceDraft;
use super::{Backend, HarnessClaim, Paged, Store, StoreError, StoreResult, WriteTx};
use crate::events::{EventKind, RunSignal};
use crate::ids;
use crate::state::{Flag, InvocationStatus};
use mira_core::chain;

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
    /// Its place in the execution queue ([`crate::harness::fair`]): queued invocations are
    /// claimed by tag, then id. Given when it entered the queue; 0 before that (and for
    /// invocations queued before migration 0030).
    pub queue_tag: i64,
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
    /// Its queue tag when it enters the queue now (no approval: queued or claimed at once;
    /// [`crate::harness::Harness::queue_tag`]); ignored with an approval (the grant gives it).
    pub queue_tag: i64,
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

/// The head of the execution queue ([`Store::queue_head`]).
#[derive(Debug, Clone, Default)]
pub struct QueueHead {
    /// Every user with queued invocations, in id order.
    pub owners: Vec<String>,
    /// The first claimable invocations in queue order, as `(id, owner_id)`.
    pub calls: Vec<(String, String)>,
}

/// Most freezes and execution results written in one transaction.
const MAX_WRITE_BATCH: usize = 128;

/// A freeze waiting for its group commit.
pub(crate) struct PendingFreeze {
    new: NewInvocation,
    /// The freeze request's W3C trace context, while traces are exported (read in the
    /// request's span, before the write moves to the flush task).
    trace_parent: Option<String>,
    /// The node that claims it at once, and the lease in milliseconds (approval-free calls).
    claim: Option<(String, u64)>,
}

/// An execution result waiting for its group commit.
pub(crate) struct PendingFinish {
    inv: InvocationRow,
    node_id: String,
    status: FinalStatus,
    result: serde_json::Value,
    evidence: Vec<EvidenceDraft>,
}

/// A write waiting for the store's group commit (see `store::group`).
pub(crate) enum PendingWrite {
    /// [`Store::freeze_and_claim`] (both kinds boxed: they differ in size).
    Freeze(Box<PendingFreeze>),
    /// [`Store::finish_invocation`].
    Finish(Box<PendingFinish>),
}

/// The answer to a [`PendingWrite`], of the same kind.
pub(crate) enum WriteOutcome {
    /// To a freeze (boxed: the row is the larger answer).
    Freeze(Box<StoreResult<FreezeOutcome>>),
    /// To a result (None: the claim was lost, nothing written).
    Finish(StoreResult<Option<Vec<String>>>),
}

impl Store {
    /// Inserts a frozen invocation (plus its approval request and events) unless the run
    /// already has `tool_call_id`, in which case the existing one is returned untouched.
    ///
    /// Concurrent freezes share one transaction (a group commit, see `store::group`), with
    /// the execution results stored at the same time: one statement on Postgres, two
    /// commands on SQLite ([`Store::write_group`]), instead of one transaction each.
    pub async fn freeze_invocation(&self, new: &NewInvocation) -> StoreResult<FreezeOutcome> {
        self.freeze_and_claim(new, None).await
    }

    /// [`Store::freeze_invocation`], and with `claim` a new approval-free invocation is
    /// claimed in the freeze's transaction for the harness of `claim.node_id` — created
    /// `running` with its lease, its `invocation.frozen` followed by `execution.started` —
    /// instead of `queued` for whichever harness claims next. A call that needs approval,
    /// or whose call id the run already has, is not claimed.
    pub async fn freeze_and_claim(
        &self,
        new: &NewInvocation,
        claim: Option<HarnessClaim<'_>>,
    ) -> StoreResult<FreezeOutcome> {
        let item = PendingFreeze {
            new: new.clone(),
            trace_parent: crate::telemetry::current_traceparent(),
            claim: claim.filter(|_| new.approval.is_none()).map(|c| (c.node_id.to_owned(), c.lease_ms)),
        };
        match self.group_write(PendingWrite::Freeze(Box::new(item))).await? {
            WriteOutcome::Freeze(outcome) => *outcome,
            WriteOutcome::Finish(_) => Err(StoreError::Corrupt("a freeze was answered as a result".into())),
        }
    }

    /// Queues `item` for the group commit, starting a flush when the queue allows one more,
    /// and waits for its answer.
    async fn group_write(&self, item: PendingWrite) -> StoreResult<WriteOutcome> {
        let (answer, start) = self.writes.push(item);
        if start {
            let guard = super::group::FlushGuard::new(std::sync::Arc::clone(&self.writes));
            let store = self.clone();
            tokio::spawn(async move {
                loop {
                    let batch = guard.queue().take(MAX_WRITE_BATCH);
                    if batch.is_empty() {
                        break;
                    }
                    store.write_batch(batch).await;
                }
                guard.done();
            });
        }
        answer.await.map_err(|_| StoreError::Db(sqlx::Error::PoolClosed))
    }

    /// Writes a batch of freezes and results in one transaction and answers each; when that
    /// fails, each on its own (so an error is only its item's).
    async fn write_batch(&self, batch: Vec<(PendingWrite, tokio::sync::oneshot::Sender<WriteOutcome>)>) {
        let mut freezes = Vec::new();
        let mut finishes = Vec::new();
        for (item, answer) in batch {
            match item {
                PendingWrite::Freeze(f) => freezes.push((*f, answer)),
                PendingWrite::Finish(f) => finishes.push((*f, answer)),
            }
        }
        let freeze_items: Vec<&PendingFreeze> = freezes.iter().map(|(f, _)| f).collect();
        let finish_items: Vec<&PendingFinish> = finishes.iter().map(|(f, _)| f).collect();
        let result = self.write_group(&freeze_items, &finish_items).await;
        match result {
            Ok((frozen, finished)) => {
                for ((_, answer), outcome) in freezes.into_iter().zip(frozen) {
                    let _ = answer.send(WriteOutcome::Freeze(Box::new(Ok(outcome))));
                }
                for ((_, answer), outcome) in finishes.into_iter().zip(finished) {
                    let _ = answer.send(WriteOutcome::Finish(Ok(outcome)));
                }
            }
            Err(e) if freezes.len() + finishes.len() == 1 => {
                if let Some((_, answer)) = freezes.pop() {
                    let _ = answer.send(WriteOutcome::Freeze(Box::new(Err(e))));
                } else if let Some((_, answer)) = finishes.pop() {
                    let _ = answer.send(WriteOutcome::Finish(Err(e)));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, freezes = freezes.len(), results = finishes.len(),
                    "a group of freezes and results failed; writing them one by one");
                for (item, answer) in freezes {
                    let outcome = self
                        .write_group(&[&item], &[])
                        .await
                        .and_then(|(mut o, _)| o.pop().ok_or_else(|| StoreError::Corrupt("no freeze outcome".into())));
                    let _ = answer.send(WriteOutcome::Freeze(Box::new(outcome)));
                }
                for (item, answer) in finishes {
                    let outcome = self
                        .write_group(&[], &[&item])
                        .await
                        .and_then(|(_, mut o)| o.pop().ok_or_else(|| StoreError::Corrupt("no result outcome".into())));
                    let _ = answer.send(WriteOutcome::Finish(outcome));
                }
            }
        }
    }

    /// Writes `freezes` and `finishes` in one transaction — on Postgres one statement
    /// ([`Store::write_group_in_one_statement`]), on SQLite two commands
    /// ([`Store::write_group_in_two_commands`]) — whose events are appended last (so the runs'
    /// event counters are locked only from there to the commit). One outcome per item, in
    /// order.
    async fn write_group(
        &self,
        freezes: &[&PendingFreeze],
        finishes: &[&PendingFinish],
    ) -> StoreResult<(Vec<FreezeOutcome>, Vec<Option<Vec<String>>>)> {
        match self.backend {
            Backend::Postgres => self.write_group_in_one_statement(freezes, finishes).await,
            Backend::Sqlite => self.write_group_in_two_commands(freezes, finishes).await,
        }
    }

    /// [`Store::write_group`] on Postgres: one statement ([`GROUP_WRITE_POSTGRES`]) run
    /// outside an explicit transaction, so the whole group — invocations with their approval
    /// requests and trace contexts, results, evidence, events and commit — is one round trip. Each event is written only when what it tells happened (its
    /// invocation was inserted, its result's compare-and-set succeeded).
    async fn write_group_in_one_statement(
        &self,
        freezes: &[&PendingFreeze],
        finishes: &[&PendingFinish],
    ) -> StoreResult<(Vec<FreezeOutcome>, Vec<Option<Vec<String>>>)> {
        let now = ids::now();
        let started = std::time::Instant::now();
        let rows = invocation_rows(freezes, &now);
        let approvals = new_approvals(freezes);
        let evidence_ids = new_evidence_ids(finishes);
        let evidence = evidence_rows(finishes, &evidence_ids);
        let events = candidate_events(&rows, &approvals, finishes, &evidence_ids)?;
        let events_json = serde_json::Value::Array(
            events
                .iter()
                .zip(event_texts(events.iter().map(|e| (e.0, e.1, &e.2)), &now))
                .enumerate()
                .map(|(ord, ((run_id, kind, _, inv, freeze), (data, h)))| {
                    json!({"run_id": run_id, "type": kind.as_str(), "data": data, "h": h, "ord": ord,
                           "inv": inv, "src": if *freeze { "f" } else { "r" }})
                })
                .collect(),
        );
        let answer: Vec<(String, String, i64)> = sqlx::query_as(GROUP_WRITE_POSTGRES)
            .bind(invocations_json(&rows).to_string())
            .bind(finishes_json(finishes).to_string())
            .bind(evidence_json(&evidence).to_string())
            .bind(events_json.to_string())
            .bind(&now)
            .bind(approvals_json(&rows, &approvals).to_string())
            .bind(traces_json(&rows, freezes).to_string())
            .fetch_all(self.pool())
            .await?;
        let total = started.elapsed();
        let mut inserted = std::collections::HashSet::new();
        let mut updated = std::collections::HashSet::new();
        let mut last: Vec<(String, i64)> = Vec::new();
        for (what, id, seq) in answer {
            match what.as_str() {
                "i" => {
                    inserted.insert(id);
                }
                "u" => {
                    updated.insert(id);
                }
                _ => last.push((id, seq)),
            }
        }
        // The ids the statement gave: per run, consecutive below its new last id, in order.
        let written: Vec<_> = events
            .into_iter()
            .filter(|(_, _, _, inv, freeze)| if *freeze { inserted.contains(*inv) } else { updated.contains(*inv) })
            .collect();
        let mut next: Vec<(&str, i64)> = Vec::with_capacity(last.len());
        for (run_id, seq) in &last {
            let n = written.iter().filter(|e| e.0 == run_id.as_str()).count();
            next.push((run_id, seq - i64::try_from(n).unwrap_or(0) + 1));
        }
        let mut signals = Vec::with_capacity(written.len());
        for (run_id, kind, _, _, _) in &written {
            let slot = next.iter_mut().find(|(r, _)| r == run_id).ok_or(StoreError::Db(sqlx::Error::RowNotFound))?;
            signals.push(RunSignal { run_id: (*run_id).to_owned(), seq: slot.1, kind: *kind });
            slot.1 += 1;
        }
        self.publish_committed(signals);
        self.group_counters.record(&super::group::GroupTimes {
            items: freezes.len() + finishes.len(),
            total,
            begin: std::time::Duration::ZERO,
            slot_wait: std::time::Duration::ZERO,
            append: std::time::Duration::ZERO,
            commit: total,
        });
        self.group_outcomes(rows, &approvals, &inserted, &updated, finishes, evidence_ids).await
    }

    /// [`Store::write_group`] on SQLite: one transaction in two commands of several statements
    /// on the store's own writer connection ([`super::SqliteWriteBatch`]), each one hand-off
    /// to the connection's thread, instead of one per statement ([`GROUP_STAGE_SQLITE`]:
    /// `BEGIN IMMEDIATE`, the invocations with their trace contexts and approval requests,
    /// the evidence, the results' compare-and-set and the runs' counters;
    /// [`APPEND_AND_COMMIT_SQLITE`]: the hash-chained events and the new counters, computed here in
    /// between, and `COMMIT`). On two busy cores each hand-off waits to be scheduled, and the
    /// writer is held meanwhile. Each event is written only when what it tells happened, as
    /// on Postgres.
    async fn write_group_in_two_commands(
        &self,
        freezes: &[&PendingFreeze],
        finishes: &[&PendingFinish],
    ) -> StoreResult<(Vec<FreezeOutcome>, Vec<Option<Vec<String>>>)> {
        let now = ids::now();
        let rows = invocation_rows(freezes, &now);
        let approvals = new_approvals(freezes);
        let evidence_ids = new_evidence_ids(finishes);
        let evidence = evidence_rows(finishes, &evidence_ids);
        let events = candidate_events(&rows, &approvals, finishes, &evidence_ids)?;
        // Serialised and hashed before the writer is taken: only the links need the heads.
        let texts = event_texts(events.iter().map(|e| (e.0, e.1, &e.2)), &now);
        let mut runs: Vec<&str> = events.iter().map(|e| e.0).collect();
        runs.sort_unstable();
        runs.dedup();
        let started = std::time::Instant::now();
        let mut batch = self.begin_sqlite_batch().await?;
        let begun = started.elapsed();
        let slot_wait = batch.slot_wait();
        let staged: Vec<(String, String, i64, Option<String>)> = sqlx::query_as(GROUP_STAGE_SQLITE)
            .bind(invocations_json(&rows).to_string())
            .bind(finishes_json(finishes).to_string())
            .bind(evidence_json(&evidence).to_string())
            .bind(&now)
            .bind(serde_json::to_string(&runs)?)
            .bind(approvals_json(&rows, &approvals).to_string())
            .bind(traces_json(&rows, freezes).to_string())
            .fetch_all(batch.conn()?)
            .await?;
        let mut inserted = std::collections::HashSet::new();
        let mut updated = std::collections::HashSet::new();
        // Per run: its last event id and hash before this group.
        let mut heads: Vec<(String, i64, String)> = Vec::with_capacity(runs.len());
        for (what, id, seq, hash) in staged {
            match what.as_str() {
                "i" => {
                    inserted.insert(id);
                }
                "u" => {
                    updated.insert(id);
                }
                _ => heads.push((id, seq, hash.unwrap_or_else(|| chain::GENESIS.to_owned()))),
            }
        }
        let appending = std::time::Instant::now();
        let written =
            events.iter().zip(&texts).filter(
                |((_, _, _, inv, freeze), _)| {
                    if *freeze { inserted.contains(*inv) } else { updated.contains(*inv) }
                },
            );
        let signals = batch
            .append_and_commit(
                &mut heads,
                written.map(|((run, kind, _, _, _), (data, content))| (*run, *kind, data.as_str(), content.as_str())),
                &now,
            )
            .await?;
        batch.committed();
        self.publish_committed(signals);
        // The commit travels with the events: their phase holds both.
        self.group_counters.record(&super::group::GroupTimes {
            items: freezes.len() + finishes.len(),
            total: started.elapsed(),
            begin: begun,
            slot_wait,
            append: appending.elapsed(),
            commit: std::time::Duration::ZERO,
        });
        self.group_outcomes(rows, &approvals, &inserted, &updated, finishes, evidence_ids).await
    }

    /// The outcomes of a group ([`Store::write_group_in_one_statement`],
    /// [`Store::write_group_in_two_commands`]), after its commit: a freeze whose row id is in
    /// `inserted` was created (with its approval request's id from `approvals`); one whose
    /// call id the run had already (or an earlier freeze of the group took) is answered with
    /// the invocation that has it, read now. A result whose invocation id is in `updated` won
    /// its compare-and-set and keeps its `evidence_ids`.
    async fn group_outcomes(
        &self,
        rows: Vec<InvocationRow>,
        approvals: &[Option<(String, &ApprovalRequest)>],
        inserted: &std::collections::HashSet<String>,
        updated: &std::collections::HashSet<String>,
        finishes: &[&PendingFinish],
        evidence_ids: Vec<Vec<String>>,
    ) -> StoreResult<(Vec<FreezeOutcome>, Vec<Option<Vec<String>>>)> {
        let mut frozen = Vec::with_capacity(rows.len());
        for (row, approval) in rows.into_iter().zip(approvals) {
            if inserted.contains(&row.id) {
                frozen.push(FreezeOutcome::Created(row, approval.as_ref().map(|(id, _)| id.clone())));
                continue;
            }
            let existing = self.invocation_by_call(&row.run_id, &row.tool_call_id).await?.ok_or_else(|| {
                StoreError::Corrupt(format!("invocation {} of run {} vanished", row.tool_call_id, row.run_id))
            })?;
            let approval = self.approval_id_of(&existing.id).await?;
            frozen.push(FreezeOutcome::Existing(existing, approval));
        }
        let finished = finishes
            .iter()
            .zip(evidence_ids)
            .map(|(item, ids)| updated.contains(&item.inv.id).then_some(ids))
            .collect();
        Ok((frozen, finished))
    }
}

/// Each event's data as JSON text and its content hash
/// ([`mira_core::chain::event_content_hash`]) at time `now`, in order: what
/// [`super::SqliteWriteBatch::append_and_commit`] and the Postgres statements take.
pub(crate) fn event_texts<'e>(
    events: impl Iterator<Item = (&'e str, EventKind, &'e serde_json::Value)>,
    now: &str,
) -> Vec<(String, String)> {
    events
        .map(|(run_id, kind, data)| (data.to_string(), chain::event_content_hash(run_id, kind.as_str(), now, data)))
        .collect()
}

impl super::SqliteWriteBatch {
    /// Appends `events` (`(run id, kind, data as JSON text, content hash)` — see
    /// [`event_texts`] — in order), each chained after its run's head in `heads` (`(run id,
    /// last event id, last hash)`, moved on as they are numbered), and commits — one command
    /// ([`APPEND_AND_COMMIT_SQLITE`]; just `COMMIT` without events). Returns their signals,
    /// for [`Store::publish_committed`] once [`super::SqliteWriteBatch::committed`] is called.
    /// Errors: an event of a run not in `heads`; the store's.
    pub(crate) async fn append_and_commit<'e>(
        &mut self,
        heads: &mut [(String, i64, String)],
        events: impl Iterator<Item = (&'e str, EventKind, &'e str, &'e str)>,
        now: &str,
    ) -> StoreResult<Vec<RunSignal>> {
        let mut rows = Vec::new();
        let mut signals = Vec::new();
        for (run_id, kind, data, content) in events {
            let head = heads.iter_mut().find(|h| h.0 == run_id).ok_or(StoreError::Db(sqlx::Error::RowNotFound))?;
            let seq = head.1 + 1;
            let hash = chain::event_link(&head.2, seq, content);
            let prev = std::mem::replace(&mut head.2, hash.clone());
            head.1 = seq;
            rows.push(json!({"run_id": run_id, "seq": seq, "type": kind.as_str(), "data": data,
                             "content_hash": content, "prev_hash": prev, "hash": hash}));
            signals.push(RunSignal { run_id: run_id.to_owned(), seq, kind });
        }
        if rows.is_empty() {
            sqlx::query("COMMIT").execute(self.conn()?).await?;
        } else {
            let counters: Vec<serde_json::Value> =
                heads.iter().map(|(id, seq, hash)| json!({"id": id, "seq": seq, "hash": hash})).collect();
            sqlx::query(APPEND_AND_COMMIT_SQLITE)
                .bind(serde_json::Value::Array(rows).to_string())
                .bind(serde_json::Value::Array(counters).to_string())
                .bind(now)
                .execute(self.conn()?)
                .await?;
        }
        Ok(signals)
    }
}

/// New evidence ids for every result's evidence (kept only for results whose
/// compare-and-set succeeds).
fn new_evidence_ids(finishes: &[&PendingFinish]) -> Vec<Vec<String>> {
    finishes.iter().map(|f| f.evidence.iter().map(|_| ids::new_id("evd")).collect()).collect()
}

/// The evidence rows `(id, invocation, draft)` of `finishes`, with the ids `evidence_ids`.
fn evidence_rows<'a>(
    finishes: &[&'a PendingFinish],
    evidence_ids: &[Vec<String>],
) -> Vec<(String, &'a InvocationRow, &'a EvidenceDraft)> {
    let mut evidence = Vec::new();
    for (item, ids) in finishes.iter().zip(evidence_ids) {
        for (id, draft) in ids.iter().zip(&item.evidence) {
            evidence.push((id.clone(), &item.inv, draft));
        }
    }
    evidence
}

/// An event a group may write: `(run id, kind, data, invocation id, from a freeze)` — written
/// only when its invocation was inserted (a freeze's) or its result's compare-and-set
/// succeeded (a result's).
type CandidateEvent<'a> = (&'a str, EventKind, serde_json::Value, &'a str, bool);

/// Every event a group of `rows` (its freezes, with their `approvals`) and `finishes` may
/// write, in append order: the freezes' first, each with its approval request's.
fn candidate_events<'a>(
    rows: &'a [InvocationRow],
    approvals: &[Option<(String, &ApprovalRequest)>],
    finishes: &[&'a PendingFinish],
    evidence_ids: &[Vec<String>],
) -> StoreResult<Vec<CandidateEvent<'a>>> {
    let mut events = Vec::new();
    for (row, approval) in rows.iter().zip(approvals) {
        for (kind, data) in frozen_events(row)? {
            events.push((row.run_id.as_str(), kind, data, row.id.as_str(), true));
        }
        if let Some((id, request)) = approval {
            let data = json!({
                "approval_id": id, "invocation_id": row.id, "tool_id": row.tool_id,
                "tool_call_id": row.tool_call_id, "input_hash": row.input_hash,
                "expires_at": request.expires_at, "rule": request.rule.as_str(), "rule_domain": request.rule_domain,
            });
            events.push((row.run_id.as_str(), EventKind::ApprovalRequested, data, row.id.as_str(), true));
        }
    }
    for (item, ids) in finishes.iter().zip(evidence_ids) {
        for (kind, data) in finished_events(item, ids) {
            events.push((item.inv.run_id.as_str(), kind, data, item.inv.id.as_str(), false));
        }
    }
    Ok(events)
}

/// The invocation rows `items` insert, as of `now`.
fn invocation_rows(items: &[&PendingFreeze], now: &str) -> Vec<InvocationRow> {
    items
        .iter()
        .map(|item| {
            let new = &item.new;
            let status = match (&new.approval, &item.claim) {
                (Some(_), _) => InvocationStatus::AwaitingApproval,
                (None, Some(_)) => InvocationStatus::Running,
                (None, None) => InvocationStatus::Queued,
            };
            let claim = item.claim.as_ref().filter(|_| status == InvocationStatus::Running);
            InvocationRow {
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
                claimed_by: claim.map(|(node, _)| node.clone()),
                lease_until: claim.map(|(_, lease_ms)| ids::now_plus_ms(*lease_ms)),
                created_at: now.to_owned(),
                updated_at: now.to_owned(),
                started_at: claim.map(|_| now.to_owned()),
                finished_at: None,
                cancel_requested_at: None,
                cancel_requested_by: None,
                cancel_token_id: None,
                queue_tag: if new.approval.is_some() { 0 } else { new.queue_tag },
            }
        })
        .collect()
}

/// `rows` as the JSON array the group statements read (`ord` = position).
fn invocations_json(rows: &[InvocationRow]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .enumerate()
            .map(|(ord, row)| {
                json!({
                    "id": row.id, "run_id": row.run_id, "turn_id": row.turn_id, "owner_id": row.owner_id,
                    "tool_id": row.tool_id, "tool_call_id": row.tool_call_id, "input": row.input,
                    "input_hash": row.input_hash, "approval_required": i64::from(row.approval_required),
                    "status": row.status.as_str(), "claimed_by": row.claimed_by, "lease_until": row.lease_until,
                    "started_at": row.started_at, "queue_tag": row.queue_tag, "ord": ord,
                })
            })
            .collect(),
    )
}

/// The trace contexts of the freezes of `rows` (while traces are exported) as the JSON array
/// the group statements read: `{id, trace_parent}` (empty when none has one).
fn traces_json(rows: &[InvocationRow], freezes: &[&PendingFreeze]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .zip(freezes)
            .filter_map(|(row, item)| Some(json!({"id": row.id, "trace_parent": item.trace_parent.as_deref()?})))
            .collect(),
    )
}

/// Per freeze: a new approval request id and the request, when the freeze asks for one.
fn new_approvals<'a>(freezes: &[&'a PendingFreeze]) -> Vec<Option<(String, &'a ApprovalRequest)>> {
    freezes.iter().map(|f| f.new.approval.as_ref().map(|request| (ids::new_id("apr"), request))).collect()
}

/// The approval requests of `rows` as the JSON array the group statements read (a request is
/// inserted only when its invocation is).
fn approvals_json(rows: &[InvocationRow], approvals: &[Option<(String, &ApprovalRequest)>]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .zip(approvals)
            .filter_map(|(row, approval)| {
                let (id, request) = approval.as_ref()?;
                Some(json!({
                    "id": id, "invocation_id": row.id, "run_id": row.run_id, "owner_id": row.owner_id,
                    "tool_id": row.tool_id, "tool_call_id": row.tool_call_id, "input_hash": row.input_hash,
                    "preview": request.preview.to_string(), "expires_at": request.expires_at,
                    "rule": request.rule.as_str(), "rule_domain": request.rule_domain,
                }))
            })
            .collect(),
    )
}

/// The events of a new invocation `row`, its approval request's aside: `invocation.frozen`,
/// and `execution.started` when it was claimed at once.
fn frozen_events(row: &InvocationRow) -> StoreResult<Vec<(EventKind, serde_json::Value)>> {
    let input: serde_json::Value = serde_json::from_str(&row.input)?;
    let mut events = vec![(
        EventKind::InvocationFrozen,
        json!({
            "invocation_id": row.id, "turn_id": row.turn_id, "tool_id": row.tool_id,
            "tool_call_id": row.tool_call_id, "input_hash": row.input_hash, "input": input,
            "status": row.status, "approval_required": row.approval_required,
        }),
    )];
    if row.status == InvocationStatus::Running {
        events.push((
            EventKind::ExecutionStarted,
            json!({"invocation_id": row.id, "tool_id": row.tool_id, "tool_call_id": row.tool_call_id}),
        ));
    }
    Ok(events)
}

/// The events of a stored result: its end, then one per piece of evidence.
fn finished_events(item: &PendingFinish, evidence_ids: &[String]) -> Vec<(EventKind, serde_json::Value)> {
    let (inv, status) = (&item.inv, item.status.status());
    let kind =
        if item.status == FinalStatus::Completed { EventKind::ExecutionCompleted } else { EventKind::ExecutionFailed };
    let mut events = vec![(
        kind,
        json!({
            "invocation_id": inv.id, "tool_id": inv.tool_id, "tool_call_id": inv.tool_call_id,
            "status": status, "error": item.result.get("error"), "evidence_ids": evidence_ids,
            "result_sha256": mira_core::chain::json_sha256(&item.result),
        }),
    )];
    for (id, draft) in evidence_ids.iter().zip(&item.evidence) {
        events.push((
            EventKind::EvidenceRecorded,
            json!({
                "evidence_id": id, "invocation_id": inv.id, "tool_id": inv.tool_id,
                "kind": draft.kind, "content_sha256": draft.content_sha256,
                "evidence_sha256": mira_core::chain::evidence_sha256(
                    &draft.kind, &draft.provenance, &draft.content_sha256, &draft.excerpt),
            }),
        ));
    }
    events
}

/// Results as the JSON array the Postgres statements read: `{id, status, result, node}`.
fn finishes_json(items: &[&PendingFinish]) -> serde_json::Value {
    serde_json::Value::Array(
        items
            .iter()
            .map(|item| {
                json!({"id": item.inv.id, "status": item.status.status().as_str(),
                       "result": item.result.to_string(), "node": item.node_id})
            })
            .collect(),
    )
}

/// Evidence rows `(id, invocation, draft)` as the JSON array the Postgres statements read.
fn evidence_json(rows: &[(String, &InvocationRow, &EvidenceDraft)]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|(id, inv, draft)| {
                json!({"id": id, "run_id": inv.run_id, "invocation_id": inv.id, "owner_id": inv.owner_id,
                       "tool_id": inv.tool_id, "kind": draft.kind, "provenance": draft.provenance.to_string(),
                       "content_sha256": draft.content_sha256, "excerpt": draft.excerpt})
            })
            .collect(),
    )
}

/// Run `run_id`'s invocations after `after` (exclusive) in id order: at most `limit`, each read
/// in full only while the ones before it hold fewer than `budget` bytes of input and result
/// ([`super::sized_page_sql`]: the first always, none after the one that passes the budget).
/// On a connection of its caller's, so a bundle reads them inside its read transaction.
pub(super) async fn invocations_sized(
    conn: &mut sqlx::AnyConnection,
    run_id: &str,
    after: Option<&str>,
    limit: i64,
    budget: i64,
) -> StoreResult<Paged<InvocationRow>> {
    let sql = super::sized_page_sql(
        "SELECT id, octet_length(input) + COALESCE(octet_length(result), 0) AS n FROM invocations
         WHERE run_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3",
        "id",
        "i.*",
        "JOIN invocations i ON i.id = s.k",
        "$4",
    );
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(run_id)
        .bind(after)
        .bind(limit.saturating_add(1))
        .bind(budget)
        .fetch_all(conn)
        .await?;
    Ok(Paged::of(rows, limit))
}

impl Store {
    /// The invocation with this call id in the run.
    ///
    /// The lookup repeats its two equalities as a row comparison, `(run_id, tool_call_id) >=
    /// (…, …)`: redundant, but only the unique `(run_id, tool_call_id)` index can take it as an
    /// index condition. Without it, Postgres planned the lookup on `invocations_run (run_id,
    /// id)` with the call id as a filter — reading every invocation of the run, and every old
    /// version of them — whenever the plan was made while the table was small and never
    /// analysed (autovacuum off): the two indexes then cost the same, and a prepared statement
    /// keeps its plan (checked with generic plans on an empty database).
    pub async fn invocation_by_call(&self, run_id: &str, tool_call_id: &str) -> StoreResult<Option<InvocationRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM invocations WHERE run_id = $1 AND tool_call_id = $2 AND (run_id, tool_call_id) >= ($1, $2)",
        )
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

    /// A run's invocations after `cursor`, oldest first: at most `limit`, and no more than
    /// [`super::PAGE_MAX_BYTES`] of inputs and results past the first row
    /// ([`invocations_sized`]).
    pub async fn list_invocations(
        &self,
        run_id: &str,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Paged<InvocationRow>> {
        let mut conn = self.pool().acquire().await?;
        // An empty cursor is no cursor (as it always was).
        invocations_sized(&mut conn, run_id, cursor.filter(|c| !c.is_empty()), limit, super::PAGE_MAX_BYTES).await
    }

    /// How many invocations are `queued`, counting at most `limit` (a read, no write
    /// transaction; `mira bench fairness` waits for the queue to drain with it).
    pub async fn queued_count(&self, limit: usize) -> StoreResult<usize> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM invocations WHERE status = 'queued' LIMIT $1) AS q",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(self.pool())
        .await?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The head of the execution queue as the claim loop reads it (a read, no write
    /// transaction): `owners`, every user with queued invocations (in id order), and `calls`,
    /// the first `limit` claimable invocations (see [`Store::claim_ids`]) in queue order (by
    /// `queue_tag`, then id; see [`crate::harness::fair`]), passing over those of the users in
    /// `skip` (who hold their share of the execution slots, `--max-running-per-user`).
    ///
    /// Read per user, so passing over a user costs nothing however long their backlog is:
    /// the users are found by a skip scan of the `status` index `(status, owner_id,
    /// queue_tag, id)` (one index step per user with queued invocations), then each other
    /// user's first `limit` claimable calls (one index range each), merged by tag — two
    /// statements of fixed text.
    pub async fn queue_head(&self, limit: usize, skip: &[String]) -> StoreResult<QueueHead> {
        let owners: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "{QUEUE_OWNERS} SELECT owner_id FROM o WHERE owner_id IS NOT NULL"
        )))
        .fetch_all(self.pool())
        .await?;
        if limit == 0 || owners.iter().all(|o| skip.contains(o)) {
            return Ok(QueueHead { owners, calls: Vec::new() });
        }
        // Each user's first calls: SQLite has no LATERAL, but runs a correlated `IN` list once
        // per user and finds its rows by id; Postgres runs the LATERAL subquery per user.
        let first_calls = "FROM invocations i WHERE i.status = 'queued' AND i.owner_id = o.owner_id AND ";
        let sql = match self.backend() {
            Backend::Sqlite => format!(
                "{QUEUE_OWNERS} SELECT h.id, h.owner_id FROM o JOIN invocations h ON h.id IN (
                     SELECT i.id {first_calls} {CLAIMABLE} ORDER BY i.queue_tag, i.id LIMIT $1)
                 WHERE o.owner_id IS NOT NULL AND o.owner_id NOT IN (SELECT value FROM json_each($2))
                 ORDER BY h.queue_tag, h.id LIMIT $1"
            ),
            Backend::Postgres => format!(
                "{QUEUE_OWNERS} SELECT h.id, h.owner_id FROM o CROSS JOIN LATERAL (
                     SELECT i.id, i.owner_id, i.queue_tag {first_calls} {CLAIMABLE}
                     ORDER BY i.queue_tag, i.id LIMIT $1) AS h
                 WHERE o.owner_id IS NOT NULL AND o.owner_id NOT IN (SELECT json_array_elements_text($2::json))
                 ORDER BY h.queue_tag, h.id LIMIT $1"
            ),
        };
        let calls: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(serde_json::Value::from(skip).to_string())
            .fetch_all(self.pool())
            .await?;
        Ok(QueueHead { owners, calls })
    }

    /// The smallest queue tag of a queued invocation (the queue's head; None when nothing is
    /// queued): one index step per user with queued invocations.
    pub async fn queue_head_tag(&self) -> StoreResult<Option<i64>> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "{QUEUE_OWNERS} SELECT MIN((SELECT i.queue_tag FROM invocations i
                 WHERE i.status = 'queued' AND i.owner_id = o.owner_id ORDER BY i.queue_tag LIMIT 1))
             FROM o WHERE o.owner_id IS NOT NULL"
        )))
        .fetch_one(self.pool())
        .await?)
    }

    /// Claims the first queued invocation that may run (see [`Store::claim_batch`]); when
    /// nothing is queued, one read says so without a write transaction.
    pub async fn claim_next(&self, node_id: &str, lease_ms: u64) -> StoreResult<Option<ClaimedInvocation>> {
        Ok(self.claim_batch(node_id, lease_ms, 1, &[]).await?.into_iter().next())
    }

    /// Claims up to `limit` of the queued invocations that may run, in queue order, passing
    /// over those of the users in `skip` ([`Store::queue_head`], then [`Store::claim_ids`]);
    /// empty only when none was left to claim (a read whose calls another claimer took
    /// meanwhile is read again). When nothing is queued, one read says so without a write
    /// transaction.
    pub async fn claim_batch(
        &self,
        node_id: &str,
        lease_ms: u64,
        limit: usize,
        skip: &[String],
    ) -> StoreResult<Vec<ClaimedInvocation>> {
        loop {
            let head = self.queue_head(limit, skip).await?;
            if head.calls.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<String> = head.calls.into_iter().map(|(id, _)| id).collect();
            let claimed = self.claim_ids(node_id, lease_ms, &ids).await?;
            if !claimed.is_empty() {
                return Ok(claimed);
            }
        }
    }

    /// Claims the invocations `ids` that are queued and may run: approval-free, or carrying
    /// a granted approval whose triple equals the invocation's (and, when its rule is
    /// four-eyes, decided by another user who is an admin or approver). Sets `running`, the
    /// claimer and a lease, and appends one `execution.started` each, all in one transaction
    /// of five statements whatever their number. Two claimers can never get the same row
    /// (SQLite: one writer; Postgres: `FOR UPDATE SKIP LOCKED`, and the final
    /// `status = 'queued'` compare-and-set). Returned in id order.
    ///
    /// The events are appended last ([`WriteTx::append_events`] locks the runs' counters in
    /// one fixed order), so two claimers, or a claimer and a group commit, never wait for each
    /// other in a cycle.
    pub async fn claim_ids(&self, node_id: &str, lease_ms: u64, ids: &[String]) -> StoreResult<Vec<ClaimedInvocation>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Postgres: `= ANY(ARRAY(…))` makes the locking subquery an init plan, run once. The
        // rows are found by id: the status test is kept from using the `status` index (a plan
        // that scanned every queued row of the index and probed the ids would cost as much as
        // the backlog, inside the write transaction).
        let (open, listed, queued, lock, close) = match self.backend() {
            Backend::Sqlite => ("IN (", "SELECT value FROM json_each($4)", "+i.status = 'queued'", "", ")"),
            Backend::Postgres => (
                "= ANY(ARRAY(",
                "SELECT json_array_elements_text($4::json)",
                "i.status || '' = 'queued'",
                "FOR UPDATE OF i SKIP LOCKED",
                "))",
            ),
        };
        let outer_queued = queued.replace("i.", "");
        let sql = format!(
            "UPDATE invocations SET status = 'running', claimed_by = $1, lease_until = $2, started_at = $3, updated_at = $3
             WHERE id {open}
                SELECT i.id FROM invocations i WHERE i.id IN ({listed}) AND {queued} AND {CLAIMABLE} {lock}
             {close} AND {outer_queued}
             RETURNING *"
        );
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let mut rows: Vec<InvocationRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(node_id)
            .bind(ids::now_plus_ms(lease_ms))
            .bind(&now)
            .bind(serde_json::Value::from(ids).to_string())
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
    ///
    /// Results finished at the same time share one transaction with each other and with the
    /// freezes made meanwhile (a group commit, see `store::group`); each still changes its
    /// invocation only if it is `running` under `node_id`'s claim.
    pub async fn finish_invocation(
        &self,
        inv: &InvocationRow,
        node_id: &str,
        status: FinalStatus,
        result: &serde_json::Value,
        evidence: &[EvidenceDraft],
    ) -> StoreResult<Option<Vec<String>>> {
        let item = PendingFinish {
            inv: inv.clone(),
            node_id: node_id.to_owned(),
            status,
            result: result.clone(),
            evidence: evidence.to_vec(),
        };
        match self.group_write(PendingWrite::Finish(Box::new(item))).await? {
            WriteOutcome::Finish(outcome) => outcome,
            WriteOutcome::Freeze(_) => Err(StoreError::Corrupt("a result was answered as a freeze".into())),
        }
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
                            "status": "interrupted", "error": result["error"],
                            "result_sha256": mira_core::chain::json_sha256(&result)}),
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

impl Store {
    /// Attaches `draft` (kind `kind`) to invocation `inv` after its end, when its outcome was
    /// unknown: only while it is `interrupted` or `cancelled` after it started (a call
    /// cancelled before it was claimed never reached a device; its status never changes
    /// here) and only once per kind (a second delivery adds nothing). The row is locked by a no-op
    /// update, so two deliveries at once store one. Returns the new evidence id, None when
    /// nothing was stored.
    pub async fn attach_late_evidence(
        &self,
        inv: &InvocationRow,
        draft: &EvidenceDraft,
    ) -> StoreResult<Option<String>> {
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        let locked = sqlx::query(
            "UPDATE invocations SET updated_at = updated_at
             WHERE id = $1 AND status IN ('interrupted', 'cancelled') AND started_at IS NOT NULL",
        )
        .bind(&inv.id)
        .execute(tx.conn())
        .await?;
        if locked.rows_affected() != 1 {
            return Ok(None);
        }
        let already: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM evidence WHERE invocation_id = $1 AND kind = $2")
            .bind(&inv.id)
            .bind(&draft.kind)
            .fetch_one(tx.conn())
            .await?;
        if already > 0 {
            return Ok(None);
        }
        let id = ids::new_id("evd");
        insert_evidence_rows(&mut tx, &[(id.clone(), inv, draft)], &now).await?;
        tx.append_event(
            &inv.run_id,
            EventKind::EvidenceRecorded,
            &json!({
                "evidence_id": id, "invocation_id": inv.id, "tool_id": inv.tool_id,
                "kind": draft.kind, "content_sha256": draft.content_sha256, "late": true,
                "evidence_sha256": mira_core::chain::evidence_sha256(
                    &draft.kind, &draft.provenance, &draft.content_sha256, &draft.excerpt),
            }),
        )
        .await?;
        tx.commit().await?;
        Ok(Some(id))
    }
}

/// A whole group commit on Postgres in one statement (see
/// `Store::write_group_in_one_statement`). `$1` the new invocations (as `invocations_json`:
/// `ord` = position in the batch, an earlier freeze of the batch takes a call id first; rows
/// go in in (run, call id) order, so two groups that both carry a replay of the same two
/// calls wait for each other in one direction only), `$2` the results (`{id, status, result,
/// node}`: a compare-and-set of each invocation `running` under its claimer), `$3` their
/// evidence (as [`INSERT_EVIDENCE_POSTGRES`]), `$4` every event that may be written
/// (`run_id`, `type`, `data`, `ord`, and `inv`/`src`: the invocation it tells of and whether
/// it was inserted (`f`) or updated (`r`) here), `$5` the time, `$6` the approval requests
/// (as `approvals_json`), `$7` the trace contexts (as `traces_json`; `$6` and `$7` are
/// usually empty, and apart from `$1` so that its rows are read once). Trace contexts, approval requests and the freezes' events are
/// written only for invocations this statement inserted, evidence and the results' events
/// only for those it updated; each run's events are numbered in `ord` order below its new
/// last id and hash-chained as [`crate::store::WriteTx::append_events`] does
/// (`chain_events_postgres!`; `h` = the event's content hash). Returns `('i', id, 0)` per inserted invocation,
/// `('u', id, 0)` per updated one and `('c', run id, last id)` per run.
///
/// The results' compare-and-set finds its rows by id (`id = ANY(ARRAY(…))`, an index
/// condition) and its status test (`status || '' = 'running'`) cannot use an index: joined
/// on `id` alone, the planner read every `status = 'running'` entry of the status index and
/// hashed them, and that index keeps an entry for every version a row ever had until a
/// vacuum — measured: 12,060 entries read to update 3 rows (2.6 ms instead of 0.8), the
/// larger the longer since the last vacuum. With the `ANY` alone, a plan made while the
/// table was small and never analysed (autovacuum off) still used the status index: both
/// looked equally cheap then, and a prepared statement keeps its plan.
const GROUP_WRITE_POSTGRES: &str = concat!(
    "WITH fz AS (SELECT x.* FROM json_to_recordset($1::json) AS x(id text, run_id text, turn_id text, owner_id text,
                tool_id text, tool_call_id text, input text, input_hash text, approval_required bigint, status text,
                claimed_by text, lease_until text, started_at text, queue_tag bigint, ord bigint)),
     ins AS (INSERT INTO invocations (id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
                 approval_required, status, claimed_by, lease_until, started_at, queue_tag, created_at, updated_at)
             SELECT id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash, approval_required,
                 status, claimed_by, lease_until, started_at, queue_tag, $5, $5
             FROM fz ORDER BY run_id, tool_call_id, ord
             ON CONFLICT DO NOTHING RETURNING id),
     trc AS (INSERT INTO invocation_traces (invocation_id, trace_parent)
             SELECT x.id, x.trace_parent FROM json_to_recordset($7::json) AS x(id text, trace_parent text)
             WHERE x.id IN (SELECT id FROM ins)),
     apr AS (INSERT INTO approvals (id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash, status,
                 preview, expires_at, created_at, rule, rule_domain)
             SELECT x.id, x.invocation_id, x.run_id, x.owner_id, x.tool_id, x.tool_call_id, x.input_hash, 'pending',
                 x.preview, x.expires_at, $5, x.rule, x.rule_domain
             FROM json_to_recordset($6::json) AS x(id text, invocation_id text, run_id text, owner_id text,
                 tool_id text, tool_call_id text, input_hash text, preview text, expires_at text, rule text,
                 rule_domain text)
             WHERE x.invocation_id IN (SELECT id FROM ins)),
     fv AS (SELECT x.* FROM json_to_recordset($2::json) AS x(id text, status text, result text, node text)),
     upd AS (UPDATE invocations SET status = fv.status, result = fv.result, finished_at = $5, updated_at = $5,
                 lease_until = NULL
             FROM fv
             WHERE invocations.id = ANY(ARRAY(SELECT id FROM fv)) AND invocations.id = fv.id
               AND invocations.status || '' = 'running' AND invocations.claimed_by = fv.node
             RETURNING invocations.id),
     evd AS (INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256,
                 excerpt, created_at)
             SELECT x.id, x.run_id, x.invocation_id, x.owner_id, x.tool_id, x.kind, x.provenance, x.content_sha256,
                 x.excerpt, $5
             FROM json_to_recordset($3::json) AS x(id text, run_id text, invocation_id text, owner_id text,
                 tool_id text, kind text, provenance text, content_sha256 text, excerpt text)
             WHERE x.invocation_id IN (SELECT id FROM upd)),
     v AS (SELECT e.run_id, e.type, e.data, e.h, e.ord,
                  ROW_NUMBER() OVER (PARTITION BY e.run_id ORDER BY e.ord) AS rn
           FROM json_to_recordset($4::json) AS e(run_id text, type text, data text, h text, ord bigint, inv text,
               src text)
           WHERE (e.src = 'f' AND e.inv IN (SELECT id FROM ins)) OR (e.src = 'r' AND e.inv IN (SELECT id FROM upd))),",
    chain_events_postgres!("$5"),
    "SELECT 'i' AS what, id, 0::bigint AS seq FROM ins
UNION ALL SELECT 'u', id, 0 FROM upd
UNION ALL SELECT 'c', id, event_seq FROM c"
);

/// The first command of a group on SQLite ([`Store::write_group_in_two_commands`]), which
/// begins its transaction (`BEGIN IMMEDIATE`): `$1` the new invocations (as
/// [`invocations_json`]; a call id the run has already, or an earlier row of the batch took,
/// is left alone), `$2` the results (as [`finishes_json`]), `$3` their evidence (as
/// [`evidence_json`]), `$4` the time, `$5` a JSON array of the ids of the runs the group may
/// append to, `$6` the approval requests (as [`approvals_json`]), `$7` the trace contexts (as
/// [`traces_json`]). A trace context or an
/// approval request is inserted only with its invocation (its new id exists only if this
/// command inserted it). A result's evidence is
/// inserted, and its invocation updated, only when the invocation is still `running` under
/// the result's node (the compare-and-set; the evidence is checked first, the update then
/// makes it false; the unary `+` on `status` keeps the planner from scanning every running
/// invocation through the `status` index instead of looking each one up by id). Answers rows
/// `(what, id, seq, hash)`: `i` an inserted invocation, `u` an updated one, `c` a run with its
/// last event id and hash.
const GROUP_STAGE_SQLITE: &str = "\
BEGIN IMMEDIATE;
INSERT INTO invocations (id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
    approval_required, status, claimed_by, lease_until, started_at, queue_tag, created_at, updated_at)
SELECT x.value ->> 'id', x.value ->> 'run_id', x.value ->> 'turn_id', x.value ->> 'owner_id', x.value ->> 'tool_id',
    x.value ->> 'tool_call_id', x.value ->> 'input', x.value ->> 'input_hash', x.value ->> 'approval_required',
    x.value ->> 'status', x.value ->> 'claimed_by', x.value ->> 'lease_until', x.value ->> 'started_at',
    x.value ->> 'queue_tag', $4, $4
FROM jsonb_each($1) AS x WHERE true ORDER BY x.key
ON CONFLICT DO NOTHING RETURNING 'i', id, 0, NULL;
INSERT INTO invocation_traces (invocation_id, trace_parent)
SELECT t.value ->> 'id', t.value ->> 'trace_parent' FROM jsonb_each($7) AS t
WHERE EXISTS (SELECT 1 FROM invocations AS i WHERE i.id = t.value ->> 'id');
INSERT INTO approvals (id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash, status, preview,
    expires_at, created_at, rule, rule_domain)
SELECT a.value ->> 'id', a.value ->> 'invocation_id', a.value ->> 'run_id', a.value ->> 'owner_id',
    a.value ->> 'tool_id', a.value ->> 'tool_call_id', a.value ->> 'input_hash', 'pending', a.value ->> 'preview',
    a.value ->> 'expires_at', $4, a.value ->> 'rule', a.value ->> 'rule_domain'
FROM jsonb_each($6) AS a WHERE EXISTS (SELECT 1 FROM invocations AS i WHERE i.id = a.value ->> 'invocation_id');
INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256, excerpt,
    created_at)
SELECT e.value ->> 'id', e.value ->> 'run_id', e.value ->> 'invocation_id', e.value ->> 'owner_id',
    e.value ->> 'tool_id', e.value ->> 'kind', e.value ->> 'provenance', e.value ->> 'content_sha256',
    e.value ->> 'excerpt', $4
FROM jsonb_each($3) AS e
WHERE EXISTS (SELECT 1 FROM jsonb_each($2) AS f JOIN invocations AS i ON i.id = f.value ->> 'id'
              WHERE f.value ->> 'id' = e.value ->> 'invocation_id' AND +i.status = 'running'
                AND i.claimed_by = f.value ->> 'node');
UPDATE invocations SET status = f.value ->> 'status', result = f.value ->> 'result', finished_at = $4,
    updated_at = $4, lease_until = NULL
FROM jsonb_each($2) AS f
WHERE invocations.id = f.value ->> 'id' AND +invocations.status = 'running' AND invocations.claimed_by = f.value ->> 'node'
RETURNING 'u', invocations.id, 0, NULL;
SELECT 'c', id, event_seq, last_hash FROM runs WHERE id IN (SELECT value FROM jsonb_each($5))";

/// The last command of a write batch on SQLite ([`super::SqliteWriteBatch::append_and_commit`]):
/// `$1` the events, numbered and hash-chained (`run_id, seq, type, data, content_hash,
/// prev_hash, hash`), `$2` each run's new last event id and hash (`id, seq, hash`), `$3` the
/// time; then the commit.
const APPEND_AND_COMMIT_SQLITE: &str = "\
INSERT INTO events (run_id, seq, type, data, content_hash, prev_hash, hash, created_at)
SELECT e.value ->> 'run_id', e.value ->> 'seq', e.value ->> 'type', e.value ->> 'data', e.value ->> 'content_hash',
    e.value ->> 'prev_hash', e.value ->> 'hash', $3
FROM jsonb_each($1) AS e;
UPDATE runs SET event_seq = c.value ->> 'seq', last_hash = c.value ->> 'hash'
FROM jsonb_each($2) AS c WHERE runs.id = c.value ->> 'id';
COMMIT";

/// The evidence insert on Postgres: `$1` a JSON array of the rows, `$2` the time.
const INSERT_EVIDENCE_POSTGRES: &str = "\
INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256, excerpt, created_at)
SELECT x.id, x.run_id, x.invocation_id, x.owner_id, x.tool_id, x.kind, x.provenance, x.content_sha256, x.excerpt, $2
FROM json_to_recordset($1::json) AS x(id text, run_id text, invocation_id text, owner_id text, tool_id text,
    kind text, provenance text, content_sha256 text, excerpt text)";

/// Most evidence rows in one insert statement (10 parameters each).
const EVIDENCE_ROWS_PER_INSERT: usize = 256;

/// Inserts evidence rows `(id, invocation, draft)` with multi-row inserts.
async fn insert_evidence_rows(
    tx: &mut WriteTx,
    rows: &[(String, &InvocationRow, &EvidenceDraft)],
    now: &str,
) -> StoreResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    if tx.backend == Backend::Postgres {
        sqlx::query(INSERT_EVIDENCE_POSTGRES)
            .bind(evidence_json(rows).to_string())
            .bind(now)
            .execute(tx.conn())
            .await?;
        return Ok(());
    }
    for chunk in rows.chunks(EVIDENCE_ROWS_PER_INSERT) {
        let mut sql = String::from(
            "INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256, excerpt, created_at) VALUES ",
        );
        sql.push_str(&value_rows(chunk.len(), "(?, ?, ?, ?, ?, ?, ?, ?, ?, $S)"));
        let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (id, inv, draft) in chunk {
            insert = insert
                .bind(id)
                .bind(&inv.run_id)
                .bind(&inv.id)
                .bind(&inv.owner_id)
                .bind(&inv.tool_id)
                .bind(&draft.kind)
                .bind(draft.provenance.to_string())
                .bind(&draft.content_sha256)
                .bind(&draft.excerpt);
        }
        insert.bind(now).execute(tx.conn()).await?;
    }
    Ok(())
}

/// Users with queued invocations, one index step each (a skip scan of the `status` index):
/// the start of a statement whose table `o(owner_id)` ends with a NULL row.
const QUEUE_OWNERS: &str = "WITH RECURSIVE o(owner_id) AS (
    SELECT (SELECT owner_id FROM invocations WHERE status = 'queued' ORDER BY owner_id LIMIT 1)
    UNION ALL
    SELECT (SELECT i.owner_id FROM invocations i WHERE i.status = 'queued' AND i.owner_id > o.owner_id
            ORDER BY i.owner_id LIMIT 1)
    FROM o WHERE o.owner_id IS NOT NULL)";

/// The condition of a claimable invocation `i` (see [`Store::claim_ids`]), `i.status =
/// 'queued'` before it.
const CLAIMABLE: &str = "(i.approval_required = 0 OR EXISTS (
          SELECT 1 FROM approvals a
          WHERE a.invocation_id = i.id AND a.status = 'granted'
            AND a.tool_id = i.tool_id AND a.tool_call_id = i.tool_call_id
            AND a.input_hash = i.input_hash
            AND (a.rule = 'self_approval' OR EXISTS (
                  SELECT 1 FROM users u
                  WHERE u.id = a.decided_by AND u.id <> i.owner_id
                    AND (u.is_admin <> 0 OR u.is_approver <> 0)))))";

/// The `VALUES` rows of a multi-row statement: `row` is one row with `?` for each parameter of
/// its own and `$S` for the one parameter every row shares, bound after all the rows'
/// parameters. For two rows of `(?, ?, $S)`: `($1, $2, $5), ($3, $4, $5)`.
fn value_rows(rows: usize, row: &str) -> String {
    let per_row = row.matches('?').count();
    let row = row.replace("$S", &format!("${}", rows * per_row + 1));
    let mut out = String::with_capacity(rows * (row.len() + per_row * 3 + 2));
    let mut n = 0;
    for i in 0..rows {
        if i > 0 {
            out.push_str(", ");
        }
        for c in row.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn value_rows_number_each_rows_parameters_and_share_one() {
        assert_eq!(super::value_rows(2, "(?, ?, $S)"), "($1, $2, $5), ($3, $4, $5)");
        assert_eq!(super::value_rows(1, "(?, 'pending', ?)"), "($1, 'pending', $2)");
    }
}
