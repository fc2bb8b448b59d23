//! Reading a whole run for its bundle (docs/verify.md): the stored rows as they are, nothing
//! recomputed, so that `mira verify` judges what the store holds.
//!
//! **One snapshot.** Every read of one bundle is in one read transaction — on Postgres
//! `REPEATABLE READ READ ONLY`, on SQLite one transaction on one connection, whose WAL
//! snapshot is taken at its first read — so the document is one state of the run: an approval
//! read `pending` never meets the `approval.granted` event of a grant that committed between
//! two statements, nor the chain head an event that came after it.
//!
//! **Written as read, in its signed form.** The document is written straight into the bytes its
//! signature covers ([`BUNDLE_DOMAIN`] and the RFC 8785 form of the unsigned document),
//! member by member in RFC 8785 order, record by record; reading stops as soon as those bytes
//! pass the budget. Invocations and events, whose rows can hold megabytes (a frozen input up
//! to the body limit, and its copy in `invocation.frozen`; a result up to 4 MiB), are read in
//! pages bounded by their stored bytes as well as by rows ([`super::sized_page_sql`]), so no
//! more than one page of rows is held beside the document.

use std::ops::Range;

use futures::TryStreamExt;
use mira_core::chain::{BUNDLE_DOMAIN, BUNDLE_FORMAT};
use serde_json::{Value, json};
use sqlx::{Any, Transaction};

use super::invocations::invocations_sized;
use super::{Backend, EventRow, EvidenceRow, Paged, Store, StoreResult, json_col};

/// Most rows of invocations or events read per statement while a bundle is built.
const PAGE_ROWS: i64 = 500;
/// Most stored bytes of invocations or events read per statement past the page's first row
/// (and never more than the budget has left).
const PAGE_BYTES: i64 = 4 * 1024 * 1024;

/// What [`Store::run_bundle`] (a [`BundleText`]) and [`Store::run_document`] (a JSON value)
/// found.
#[derive(Debug)]
pub enum RunDocument<T = Value> {
    /// No such run.
    NotFound,
    /// The run's records are larger than the limit (bytes of the document written so far).
    TooLarge(usize),
    /// The unsigned bundle document (without `signature`).
    Document(T),
}

/// An unsigned bundle document as the bytes its signature covers: [`BUNDLE_DOMAIN`] followed by
/// the RFC 8785 form of the document. A record holding an integer beyond ±2^53 (possible in a
/// tool's result) has a canonical form that rounds it; such records also keep their exact
/// JSON text, which the exported document carries ([`BundleText::into_json`]) so that
/// `mira verify` sees the stored number and refuses it (docs/verify.md, check 1).
#[derive(Debug)]
pub struct BundleText {
    buf: Vec<u8>,
    /// Where in `buf` such a record's canonical form is, and its exact text.
    exact: Vec<(Range<usize>, String)>,
}

impl BundleText {
    /// The bytes the bundle's signature covers.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The document as JSON text, with `signature` (the canonical JSON text of its value) as its
    /// last member when given — RFC 8785 orders it after every other member — and each
    /// inexact record's exact text: with no such record, the signed bytes themselves, not a
    /// copy.
    pub fn into_json(mut self, signature: Option<&str>) -> bytes::Bytes {
        if let Some(signature) = signature {
            // The document ends with the `}` of its object.
            self.buf.pop();
            self.buf.extend_from_slice(b",\"signature\":");
            self.buf.extend_from_slice(signature.as_bytes());
            self.buf.push(b'}');
        }
        let start = BUNDLE_DOMAIN.len();
        if self.exact.is_empty() {
            return bytes::Bytes::from(self.buf).slice(start..);
        }
        let grown: usize = self.exact.iter().map(|(range, text)| text.len().saturating_sub(range.len())).sum();
        let mut out = Vec::with_capacity(self.buf.len() - start + grown);
        let mut at = start;
        for (range, text) in &self.exact {
            out.extend_from_slice(&self.buf[at..range.start]);
            out.extend_from_slice(text.as_bytes());
            at = range.end;
        }
        out.extend_from_slice(&self.buf[at..]);
        out.into()
    }
}

/// Writes a bundle document's RFC 8785 form as it is read (see the module docs).
struct Writer {
    buf: Vec<u8>,
    exact: Vec<(Range<usize>, String)>,
    max_bytes: usize,
    /// The last member written ("" before the first): members come in RFC 8785 order.
    last_key: &'static str,
    /// Whether the open list has no item yet.
    list_empty: bool,
}

impl Writer {
    fn new(max_bytes: usize) -> Writer {
        let mut buf = BUNDLE_DOMAIN.to_vec();
        buf.push(b'{');
        Writer { buf, exact: Vec::new(), max_bytes, last_key: "", list_empty: true }
    }

    /// Bytes of the document written so far.
    fn size(&self) -> usize {
        self.buf.len() - BUNDLE_DOMAIN.len()
    }

    /// Whether the document passed the budget.
    fn too_large(&self) -> bool {
        self.size() > self.max_bytes
    }

    /// What the budget has left, at least 1 (a page reads one row however large).
    fn left(&self) -> i64 {
        i64::try_from(self.max_bytes.saturating_sub(self.size())).unwrap_or(i64::MAX).max(1)
    }

    /// Starts member `name` (plain ASCII, after the last one in code-unit order).
    fn key(&mut self, name: &'static str) {
        debug_assert!(self.last_key < name, "bundle members out of RFC 8785 order: {} then {name}", self.last_key);
        if !self.last_key.is_empty() {
            self.buf.push(b',');
        }
        self.last_key = name;
        self.buf.push(b'"');
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.extend_from_slice(b"\":");
    }

    fn value(&mut self, v: &Value) {
        let start = self.buf.len();
        if serde_jcs::to_writer(&mut self.buf, v).is_err() {
            // Never for a Value; the same fallback as the input hash's.
            self.buf.truncate(start);
            self.buf.extend_from_slice(mira_core::canonical::to_canonical_string(v).as_bytes());
        }
        if mira_core::canonical::inexact_integer(v).is_some() {
            self.exact.push((start..self.buf.len(), v.to_string()));
        }
    }

    fn member(&mut self, name: &'static str, v: &Value) {
        self.key(name);
        self.value(v);
    }

    fn open_list(&mut self, name: &'static str) {
        self.key(name);
        self.buf.push(b'[');
        self.list_empty = true;
    }

    /// Adds an item to the open list; false once the document passed the budget.
    fn item(&mut self, v: &Value) -> bool {
        if !self.list_empty {
            self.buf.push(b',');
        }
        self.list_empty = false;
        self.value(v);
        !self.too_large()
    }

    fn close_list(&mut self) {
        self.buf.push(b']');
    }

    fn finish(mut self) -> BundleText {
        self.buf.push(b'}');
        BundleText { buf: self.buf, exact: self.exact }
    }
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

/// Events of run `$1` after seq `after` under a byte budget (see [`super::sized_page_sql`]).
async fn events_sized(
    tx: &mut Transaction<'static, Any>,
    run_id: &str,
    after: i64,
    budget: i64,
) -> StoreResult<Paged<ChainedEvent>> {
    let sql = super::sized_page_sql(
        "SELECT seq, octet_length(data) AS n FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        "seq",
        "e.*",
        "JOIN events e ON e.run_id = $1 AND e.seq = s.k",
        "$4",
    );
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(run_id)
        .bind(after)
        .bind(PAGE_ROWS + 1)
        .bind(budget)
        .fetch_all(&mut **tx)
        .await?;
    Ok(Paged::of(rows, PAGE_ROWS))
}

impl Store {
    /// Run `run_id` as one unsigned bundle document (docs/verify.md, Format), parsed: what
    /// `mira verify --database` checks. See [`Store::run_bundle`].
    pub async fn run_document(&self, run_id: &str, max_bytes: usize) -> StoreResult<RunDocument> {
        Ok(match self.run_bundle(run_id, max_bytes).await? {
            RunDocument::Document(text) => RunDocument::Document(serde_json::from_slice(&text.into_json(None))?),
            RunDocument::NotFound => RunDocument::NotFound,
            RunDocument::TooLarge(n) => RunDocument::TooLarge(n),
        })
    }

    /// Run `run_id` as one unsigned bundle document (docs/verify.md, Format) in the bytes its
    /// signature covers: the run, its exposures, frozen calls with results, approvals with who
    /// decided, evidence with its stored content (excerpt) and every event with its hashes,
    /// all read in one snapshot (see the module docs). [`RunDocument::TooLarge`] as soon as
    /// the document passes `max_bytes`, without reading further. Owner checks are the
    /// caller's.
    pub async fn run_bundle(&self, run_id: &str, max_bytes: usize) -> StoreResult<RunDocument<BundleText>> {
        let mut tx = match self.backend {
            Backend::Postgres => self.pool().begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?,
            Backend::Sqlite => self.pool().begin().await?,
        };
        let found = write_bundle(&mut tx, run_id, max_bytes).await;
        // Nothing was written: the end of the transaction only lets its snapshot go.
        tx.rollback().await?;
        found
    }
}

/// [`Store::run_bundle`] inside its transaction.
async fn write_bundle(
    tx: &mut Transaction<'static, Any>,
    run_id: &str,
    max_bytes: usize,
) -> StoreResult<RunDocument<BundleText>> {
    type RunCols = (String, String, String, Option<String>, Option<String>, i64, String, Option<String>, i64);
    let run: Option<RunCols> = sqlx::query_as(
        "SELECT id, owner_id, workspace_id, device_id, title, event_seq, created_at, last_hash, chain_from
         FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((id, owner_id, workspace_id, device_id, title, event_seq, created_at, last_hash, chain_from)) = run else {
        return Ok(RunDocument::NotFound);
    };
    let owner_name: Option<String> =
        sqlx::query_scalar("SELECT name FROM users WHERE id = $1").bind(&owner_id).fetch_optional(&mut **tx).await?;
    let mut w = Writer::new(max_bytes);

    // Members in RFC 8785 order: approvals, chain, events, evidence, exported_at, exposures,
    // format, invocations, run.
    w.open_list("approvals");
    {
        let mut rows = sqlx::query_as::<_, ApprovalCols>(
            "SELECT a.id, a.invocation_id, a.tool_id, a.tool_call_id, a.input_hash, a.status, a.reason, a.expires_at,
                    a.decided_by, u.name, a.decided_token_id, a.decided_at, a.created_at
             FROM approvals a LEFT JOIN users u ON u.id = a.decided_by
             WHERE a.run_id = $1 ORDER BY a.id",
        )
        .bind(&id)
        .fetch(&mut **tx);
        while let Some((aid, inv, tool, call, hash, status, reason, expires, by, by_name, token, at, created)) =
            rows.try_next().await?
        {
            let v = json!({"id": aid, "invocation_id": inv, "tool_id": tool, "tool_call_id": call, "input_hash": hash,
                           "status": status, "reason": reason, "expires_at": expires, "decided_by": by,
                           "decided_by_name": by_name, "decided_token_id": token, "decided_at": at,
                           "created_at": created});
            if !w.item(&v) {
                return Ok(RunDocument::TooLarge(w.size()));
            }
        }
    }
    w.close_list();

    w.member("chain", &json!({"unchained_before": chain_from, "head_seq": event_seq, "head_hash": last_hash}));

    w.open_list("events");
    let mut after = 0i64;
    loop {
        let page = events_sized(tx, &id, after, PAGE_BYTES.min(w.left())).await?;
        for e in &page.rows {
            let v = json!({
                "seq": e.event.seq, "type": e.event.kind, "created_at": e.event.created_at,
                "data": json_or_text(&e.event.data), "content_hash": e.content_hash,
                "prev_hash": e.prev_hash, "hash": e.hash,
            });
            if !w.item(&v) {
                return Ok(RunDocument::TooLarge(w.size()));
            }
        }
        match page.rows.last() {
            Some(last) if page.more => after = last.event.seq,
            _ => break,
        }
    }
    w.close_list();

    w.open_list("evidence");
    {
        let mut rows = sqlx::query_as::<_, EvidenceRow>("SELECT * FROM evidence WHERE run_id = $1 ORDER BY id")
            .bind(&id)
            .fetch(&mut **tx);
        while let Some(e) = rows.try_next().await? {
            let v = json!({
                "id": e.id, "invocation_id": e.invocation_id, "tool_id": e.tool_id, "kind": e.kind,
                "provenance": json_or_text(&e.provenance), "content_sha256": e.content_sha256,
                "excerpt": e.excerpt, "created_at": e.created_at, "accepted": e.accepted,
                "acceptance_note": e.acceptance_note, "accepted_at": e.accepted_at, "accepted_by": e.accepted_by,
            });
            if !w.item(&v) {
                return Ok(RunDocument::TooLarge(w.size()));
            }
        }
    }
    w.close_list();

    w.member("exported_at", &json!(crate::ids::now()));

    w.open_list("exposures");
    {
        let mut rows = sqlx::query_as::<_, (String, String, Option<String>, String, String)>(
            "SELECT id, task, context, exposure, created_at FROM turns WHERE run_id = $1 ORDER BY id",
        )
        .bind(&id)
        .fetch(&mut **tx);
        while let Some((turn_id, task, context, exposure, at)) = rows.try_next().await? {
            let v = json!({"turn_id": turn_id, "task": task, "context": context, "created_at": at,
                           "exposure": json_or_text(&exposure)});
            if !w.item(&v) {
                return Ok(RunDocument::TooLarge(w.size()));
            }
        }
    }
    w.close_list();

    w.member("format", &json!(BUNDLE_FORMAT));

    w.open_list("invocations");
    let mut after: Option<String> = None;
    loop {
        let page = invocations_sized(tx, &id, after.as_deref(), PAGE_ROWS, PAGE_BYTES.min(w.left())).await?;
        for r in &page.rows {
            let v = json!({
                "id": r.id, "turn_id": r.turn_id, "tool_id": r.tool_id, "tool_call_id": r.tool_call_id,
                "input": json_or_text(&r.input), "input_hash": r.input_hash,
                "approval_required": r.approval_required, "status": r.status,
                "result": r.result.as_deref().map(json_or_text),
                "created_at": r.created_at, "started_at": r.started_at, "finished_at": r.finished_at,
            });
            if !w.item(&v) {
                return Ok(RunDocument::TooLarge(w.size()));
            }
        }
        match page.rows.last() {
            Some(last) if page.more => after = Some(last.id.clone()),
            _ => break,
        }
    }
    w.close_list();

    w.member(
        "run",
        &json!({"id": id, "owner_id": owner_id, "owner_name": owner_name, "workspace_id": workspace_id,
                "device_id": device_id, "title": title, "created_at": created_at}),
    );
    Ok(RunDocument::Document(w.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small document: two approvals (one with an integer beyond ±2^53), a chain, no events.
    fn small() -> BundleText {
        let mut w = Writer::new(usize::MAX);
        w.open_list("approvals");
        assert!(w.item(&json!({"b": 1, "a": [1.5, "x", {"é": "\u{1}"}]})));
        assert!(w.item(&json!({"big": 9_007_199_254_740_993u64})));
        w.close_list();
        w.member("chain", &json!({"z": null, "y": 2}));
        w.open_list("events");
        w.close_list();
        w.finish()
    }

    #[test]
    fn written_document_is_the_canonical_form_and_keeps_inexact_integers() {
        let doc: Value = serde_json::from_slice(&small().into_json(None)).unwrap_or_default();
        assert_eq!(doc["approvals"][1]["big"].as_u64(), Some(9_007_199_254_740_993));
        assert_eq!(doc["events"], json!([]));
        // What is signed is what a verifier computes from the exported document.
        let mut expected = BUNDLE_DOMAIN.to_vec();
        expected.extend_from_slice(mira_core::canonical::to_canonical_string(&doc).as_bytes());
        assert_eq!(small().signed_bytes(), expected.as_slice());
        let signed: Value = serde_json::from_slice(&small().into_json(Some(r#"{"value":"v"}"#))).unwrap_or_default();
        assert_eq!(signed["signature"]["value"], "v");
        assert_eq!(signed["approvals"][1]["big"].as_u64(), Some(9_007_199_254_740_993));
        assert_eq!(signed["chain"], json!({"y": 2, "z": null}));
    }

    #[test]
    fn budget_stops_the_document() {
        let mut w = Writer::new(20);
        w.open_list("events");
        assert!(w.item(&json!("short")));
        assert!(!w.item(&json!("a longer string")));
        assert!(w.size() > 20);
    }
}
