//! Runs anyone can verify offline (docs/verify.md): the run bundle's signature and the checks
//! of `mira verify`.
//!
//! A bundle is one JSON document (format `mira-run-bundle-v1`): the run, its exposures, frozen
//! calls with their results, approvals with who decided, evidence with its stored content and
//! every event with its hashes (the chain of [`mira_core::chain`]), signed with the server's
//! Ed25519 bundle key over [`BUNDLE_DOMAIN`] followed by the RFC 8785 form of the document
//! without its `signature` member. [`check`] needs nothing but the document (and, to pin the
//! signer, the public key): every event's content hash and link, the chain's order and head,
//! every record against the hash its event carries, a matching grant for every executed call
//! that required one, then the signature. `mira verify --database URL --run ID` runs the same
//! checks on the rows a database holds ([`crate::store::Store::run_document`]), without a
//! signature.

use mira_core::chain::{
    BUNDLE_DOMAIN, BUNDLE_FORMAT, GENESIS, event_content_hash, event_link, evidence_sha256, json_sha256,
};
use mira_core::remote::{SigningKey, VerifyingKey};
use serde_json::{Value, json};

/// Label of the server's bundle-signing key derived from the secret key
/// ([`crate::secret::SecretBox::derive_seed`]): its own key, not the runner job key.
pub const BUNDLE_KEY_LABEL: &str = "run-bundle-signing";

/// Largest bundle `GET /v1/runs/{id}/bundle` builds, in bytes of JSON records (64 MiB):
/// a larger run is refused with `bundle_too_large`.
pub const BUNDLE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The bytes a bundle's signature covers: [`BUNDLE_DOMAIN`] and the RFC 8785 form of the
/// document without its `signature` member.
pub fn signed_bytes(doc: &Value) -> Vec<u8> {
    let mut unsigned = doc.clone();
    if let Some(obj) = unsigned.as_object_mut() {
        obj.remove("signature");
    }
    let mut bytes = BUNDLE_DOMAIN.to_vec();
    bytes.extend_from_slice(mira_core::canonical::to_canonical_string(&unsigned).as_bytes());
    bytes
}

/// A bundle's `signature` member: `{"algorithm": "ed25519", "public_key": hex, "value": hex}`,
/// `value` the signature of `bytes` (the bundle's signed bytes) under `key`.
fn signature_of(bytes: &[u8], key: &SigningKey) -> Value {
    let value = mira_core::remote::sign(key, b"", bytes);
    json!({"algorithm": "ed25519", "public_key": mira_core::remote::public_hex(key), "value": value})
}

/// Signs `doc` with `key`: sets its `signature` member (see [`signature_of`]).
pub fn sign(doc: &mut Value, key: &SigningKey) {
    let signature = signature_of(&signed_bytes(doc), key);
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("signature".into(), signature);
    }
}

/// Signs a bundle document read in its signed form ([`crate::store::Store::run_bundle`]) and
/// answers the signed document's JSON text: those bytes themselves with the `signature`
/// member appended (RFC 8785 puts it last), not a second serialisation. It is the RFC 8785
/// form of the signed document, but for a record holding an integer beyond ±2^53, which keeps
/// its stored spelling (check 1 refuses it).
pub fn sign_text(text: crate::store::BundleText, key: &SigningKey) -> bytes::Bytes {
    let signature = mira_core::canonical::to_canonical_string(&signature_of(text.signed_bytes(), key));
    text.into_json(Some(&signature))
}

/// Which key a signature is checked under.
#[derive(Debug, Clone, Copy)]
pub enum KeyCheck<'a> {
    /// The given (pinned) public key.
    Pinned(&'a VerifyingKey),
    /// The key the bundle names (proves integrity, not who signed).
    Embedded,
    /// No signature check (a database's rows).
    Skip,
}

/// One problem found, naming the part: `event seq 7`, `invocation inv_…`, `signature`, ….
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The part: `bundle`, `chain`, `event seq N`, `exposure turn_…`, `invocation inv_…`,
    /// `approval apr_…`, `evidence evd_…`, `grant inv_…`, `signature`.
    pub part: String,
    /// What is wrong, in words.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.part, self.message)
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Problems in the order found (the first one is the one to report).
    pub problems: Vec<Problem>,
    /// Notes that are no problem (unchained events of a run older than the chain, an
    /// unpinned key).
    pub notes: Vec<String>,
    /// The run.
    pub run_id: String,
    /// Events in all.
    pub events: usize,
    /// Events with hashes (from `unchained_before` on).
    pub chained: usize,
    /// Records checked: exposures, invocations, approvals, evidence.
    pub records: [usize; 4],
    /// Executed calls that required a grant and had one.
    pub grants: usize,
    /// The key the signature verified under (hex), when it did.
    pub signed_by: Option<String>,
}

impl Report {
    /// Whether nothing is wrong.
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }

    fn fail(&mut self, part: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem { part: part.into(), message: message.into() });
    }
}

/// A string member of `v` ("" when absent or not a string).
fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// An event of the bundle, read.
struct Ev<'a> {
    seq: i64,
    kind: &'a str,
    data: &'a Value,
    chained: bool,
}

/// Checks bundle `doc` (docs/verify.md, What is checked): every problem found, in order.
pub fn check(doc: &Value, key: KeyCheck<'_>) -> Report {
    let mut r = Report::default();
    if s(doc, "format") != BUNDLE_FORMAT {
        r.fail("bundle", format!("not a {BUNDLE_FORMAT} document (format {:?})", doc.get("format")));
        return r;
    }
    let empty = Vec::new();
    let list = |name: &str| doc.get(name).and_then(Value::as_array).unwrap_or(&empty);
    for name in ["exposures", "invocations", "approvals", "evidence", "events"] {
        if doc.get(name).and_then(Value::as_array).is_none() {
            r.fail("bundle", format!("`{name}` is missing or not an array"));
        }
    }
    let run = doc.get("run").cloned().unwrap_or(Value::Null);
    r.run_id = s(&run, "id").to_owned();
    if r.run_id.is_empty() {
        r.fail("bundle", "`run.id` is missing");
    }
    // RFC 8785 writes numbers as doubles: beyond ±2^53 neighbouring integers share one
    // canonical form, so a hash or the signature could not tell an edited one apart.
    if let Some((pointer, n)) = mira_core::canonical::inexact_integer(doc) {
        r.fail("bundle", format!("{pointer}: {n} is beyond ±2^53, which no hash of this bundle can bind exactly"));
    }
    if !r.problems.is_empty() {
        return r;
    }
    let chain = doc.get("chain").cloned().unwrap_or(Value::Null);
    let chain_from = chain.get("unchained_before").and_then(Value::as_i64).unwrap_or(1);

    let events = check_events(&mut r, list("events"), chain_from, &chain);
    check_records(&mut r, &events, &list);
    check_grants(&mut r, &events);

    match key {
        KeyCheck::Skip => {}
        KeyCheck::Pinned(k) => check_signature(&mut r, doc, Some(k)),
        KeyCheck::Embedded => check_signature(&mut r, doc, None),
    }
    r
}

/// The chain: order, content hashes, links and head. Returns the events read.
fn check_events<'a>(r: &mut Report, list: &'a [Value], chain_from: i64, chain: &Value) -> Vec<Ev<'a>> {
    let run_id = r.run_id.clone();
    let mut out = Vec::with_capacity(list.len());
    let mut prev: Option<(i64, String)> = None;
    let mut order_broken = false;
    for (i, e) in list.iter().enumerate() {
        let expected = i64::try_from(i).unwrap_or(i64::MAX) + 1;
        let seq = e.get("seq").and_then(Value::as_i64).unwrap_or(0);
        if seq != expected && !order_broken {
            order_broken = true;
            let elsewhere = list.iter().any(|x| x.get("seq").and_then(Value::as_i64) == Some(expected));
            if seq > expected && !elsewhere {
                r.fail(
                    format!("event seq {expected}"),
                    format!("missing: position {i} holds seq {seq} (an event was deleted)"),
                );
            } else {
                r.fail(
                    format!("event seq {seq}"),
                    format!("out of order at position {i}, where seq {expected} belongs (reordered or duplicated)"),
                );
            }
        }
        let kind = s(e, "type");
        let null = &Value::Null;
        let data = e.get("data").unwrap_or(null);
        let chained = seq >= chain_from;
        out.push(Ev { seq, kind, data, chained });
        if !chained {
            continue;
        }
        let part = format!("event seq {seq}");
        let (Some(content), Some(prev_hash), Some(hash)) = (
            e.get("content_hash").and_then(Value::as_str),
            e.get("prev_hash").and_then(Value::as_str),
            e.get("hash").and_then(Value::as_str),
        ) else {
            r.fail(part, format!("no hashes, but the chain starts at seq {chain_from}"));
            prev = None;
            continue;
        };
        let recomputed = event_content_hash(&run_id, kind, s(e, "created_at"), data);
        if recomputed != content {
            r.fail(&part, "content (type, data or created_at) does not match its content_hash");
        }
        let expected_prev = match &prev {
            Some((_, h)) => h.as_str(),
            None if seq == chain_from => GENESIS,
            None => "",
        };
        if prev_hash != expected_prev {
            let before = if seq == chain_from {
                "the genesis (64 zeros)".to_owned()
            } else {
                format!("the hash of event seq {}", seq - 1)
            };
            r.fail(&part, format!("prev_hash is not {before} (an event was deleted, inserted or reordered)"));
        }
        if event_link(prev_hash, seq, content) != hash {
            r.fail(&part, "hash does not match its link (prev_hash, seq, content_hash)");
        }
        prev = Some((seq, hash.to_owned()));
    }
    r.events = out.len();
    r.chained = out.iter().filter(|e| e.chained).count();
    if chain_from > 1 {
        r.notes.push(format!(
            "events before seq {chain_from} were stored before the hash chain existed: they are not covered"
        ));
    }
    let head_seq = chain.get("head_seq").and_then(Value::as_i64).unwrap_or(0);
    let last_seq = out.last().map_or(0, |e| e.seq);
    if head_seq != last_seq && !order_broken {
        r.fail(
            "chain",
            format!("head_seq is {head_seq} but the last event is seq {last_seq} (events deleted at the end)"),
        );
    }
    let head_hash = chain.get("head_hash").and_then(Value::as_str);
    if let Some((seq, hash)) = &prev
        && head_hash != Some(hash.as_str())
    {
        r.fail("chain", format!("head_hash is not the hash of the last event (seq {seq})"));
    }
    out
}

/// The chained event of `kinds` whose data member `key` is `id`: the last one.
fn find<'e, 'a>(events: &'e [Ev<'a>], kinds: &[&str], key: &str, id: &str) -> Option<&'e Ev<'a>> {
    events.iter().rev().find(|e| kinds.contains(&e.kind) && s(e.data, key) == id)
}

/// Compares record member `field` with event data member `key`; a problem when they differ.
fn same(r: &mut Report, part: &str, rec: &Value, field: &str, ev: &Ev<'_>, key: &str) {
    let a = rec.get(field).unwrap_or(&Value::Null);
    let b = ev.data.get(key).unwrap_or(&Value::Null);
    if a != b {
        r.fail(part, format!("`{field}` does not match `{key}` of event seq {} ({})", ev.seq, ev.kind));
    }
}

/// Each record against the event that binds it, and each binding event against its record.
fn check_records<'a>(r: &mut Report, events: &[Ev<'a>], list: &dyn Fn(&str) -> &'a Vec<Value>) {
    let mut unbound = 0usize;

    let exposures = list("exposures");
    for x in exposures {
        let id = s(x, "turn_id");
        let part = format!("exposure {id}");
        let ev = find(events, &["exposure.created"], "turn_id", id);
        if bound(r, &mut unbound, &part, ev, "exposure.created")
            && let Some(ev) = ev
        {
            let exposure = x.get("exposure").unwrap_or(&Value::Null);
            if Some(json_sha256(exposure).as_str()) != ev.data.get("exposure_sha256").and_then(Value::as_str) {
                r.fail(&part, format!("exposure does not match exposure_sha256 of event seq {}", ev.seq));
            }
        }
    }

    let invocations = list("invocations");
    for inv in invocations {
        let id = s(inv, "id");
        let part = format!("invocation {id}");
        let null = Value::Null;
        let input = inv.get("input").unwrap_or(&null);
        if mira_core::canonical::input_hash(s(inv, "tool_id"), input) != s(inv, "input_hash") {
            r.fail(&part, "input (or tool_id) does not match its input_hash");
        }
        let ev = find(events, &["invocation.frozen"], "invocation_id", id);
        if bound(r, &mut unbound, &part, ev, "invocation.frozen")
            && let Some(ev) = ev
        {
            for f in ["tool_id", "tool_call_id", "input_hash", "turn_id", "input", "approval_required"] {
                same(r, &part, inv, f, ev, f);
            }
        }
        if let Some(result) = inv.get("result").filter(|v| !v.is_null()) {
            let ev = events.iter().rev().find(|e| {
                matches!(e.kind, "execution.completed" | "execution.failed")
                    && s(e.data, "invocation_id") == id
                    && e.data.get("result_sha256").is_some()
            });
            match ev {
                Some(ev) if ev.chained => {
                    if Some(json_sha256(result).as_str()) != ev.data.get("result_sha256").and_then(Value::as_str) {
                        r.fail(&part, format!("result does not match result_sha256 of event seq {}", ev.seq));
                    }
                }
                Some(_) => unbound += 1,
                None => {
                    let old = find(events, &["execution.completed", "execution.failed"], "invocation_id", id);
                    if old.is_some_and(|e| e.chained) || (old.is_none() && bound_anywhere(events, id)) {
                        r.fail(&part, "result is bound by no execution.completed or execution.failed event");
                    } else {
                        unbound += 1;
                    }
                }
            }
        }
    }

    let approvals = list("approvals");
    for a in approvals {
        let id = s(a, "id");
        let part = format!("approval {id}");
        let status = s(a, "status");
        let decision = match status {
            "granted" => Some("approval.granted"),
            "denied" => Some("approval.denied"),
            _ => None,
        };
        if let Some(kind) = decision {
            let ev = find(events, &[kind], "approval_id", id);
            if bound(r, &mut unbound, &part, ev, kind)
                && let Some(ev) = ev
            {
                same(r, &part, a, "invocation_id", ev, "invocation_id");
                same(r, &part, a, "decided_by", ev, "decided_by");
                same(r, &part, a, "decided_token_id", ev, "token_id");
                same(r, &part, a, "decided_at", ev, "decided_at");
                if kind == "approval.granted" {
                    for f in ["tool_id", "tool_call_id", "input_hash"] {
                        same(r, &part, a, f, ev, f);
                    }
                }
            }
        } else {
            let ev = find(events, &["approval.requested"], "approval_id", id);
            if bound(r, &mut unbound, &part, ev, "approval.requested")
                && let Some(ev) = ev
            {
                for f in ["invocation_id", "tool_id", "tool_call_id", "input_hash"] {
                    same(r, &part, a, f, ev, f);
                }
            }
        }
        // A decision the chain records but the record does not say.
        for (kind, said) in [("approval.granted", "granted"), ("approval.denied", "denied")] {
            if status != said && find(events, &[kind], "approval_id", id).is_some_and(|e| e.chained) {
                r.fail(&part, format!("status is {status:?} but the chain records {kind}"));
            }
        }
    }

    let evidence = list("evidence");
    for x in evidence {
        let id = s(x, "id");
        let part = format!("evidence {id}");
        let ev = find(events, &["evidence.recorded"], "evidence_id", id);
        if bound(r, &mut unbound, &part, ev, "evidence.recorded")
            && let Some(ev) = ev
        {
            let null = Value::Null;
            let recomputed = evidence_sha256(
                s(x, "kind"),
                x.get("provenance").unwrap_or(&null),
                s(x, "content_sha256"),
                s(x, "excerpt"),
            );
            if Some(recomputed.as_str()) != ev.data.get("evidence_sha256").and_then(Value::as_str) {
                r.fail(
                    &part,
                    format!(
                        "content (kind, provenance, content_sha256 or excerpt) does not match evidence_sha256 of event seq {}",
                        ev.seq
                    ),
                );
            }
            same(r, &part, x, "invocation_id", ev, "invocation_id");
        }
    }

    // Every chained event that tells of a record: the record is in the bundle.
    let has = |items: &[Value], key: &str, id: &str| items.iter().any(|v| s(v, key) == id);
    for e in events.iter().filter(|e| e.chained) {
        let missing = match e.kind {
            "exposure.created" => Some(("exposure", "turn_id", !has(exposures, "turn_id", s(e.data, "turn_id")))),
            "invocation.frozen" => {
                Some(("invocation", "invocation_id", !has(invocations, "id", s(e.data, "invocation_id"))))
            }
            "approval.requested" | "approval.granted" | "approval.denied" => {
                Some(("approval", "approval_id", !has(approvals, "id", s(e.data, "approval_id"))))
            }
            "evidence.recorded" => Some(("evidence", "evidence_id", !has(evidence, "id", s(e.data, "evidence_id")))),
            _ => None,
        };
        if let Some((what, key, true)) = missing {
            r.fail(
                format!("event seq {}", e.seq),
                format!("{} names {what} {} which is missing", e.kind, s(e.data, key)),
            );
        }
    }
    r.records = [exposures.len(), invocations.len(), approvals.len(), evidence.len()];
    if unbound > 0 {
        r.notes.push(format!("{unbound} record(s) are bound only by events older than the chain: not covered"));
    }
}

/// Whether `ev` binds a record: a chained event (true); an event older than the chain (counted
/// in `unbound`); none (a problem).
fn bound(r: &mut Report, unbound: &mut usize, part: &str, ev: Option<&Ev<'_>>, what: &str) -> bool {
    match ev {
        Some(e) if e.chained => true,
        Some(_) => {
            *unbound += 1;
            false
        }
        None => {
            r.fail(part, format!("no {what} event names it"));
            false
        }
    }
}

/// Whether invocation `id` has a chained frozen event (its later events are chained too).
fn bound_anywhere(events: &[Ev<'_>], id: &str) -> bool {
    find(events, &["invocation.frozen"], "invocation_id", id).is_some_and(|e| e.chained)
}

/// Every chained `execution.started` of a call whose frozen event says it required approval
/// has an earlier `approval.granted` with the same invocation, tool id, call id and input hash.
fn check_grants(r: &mut Report, events: &[Ev<'_>]) {
    for started in events.iter().filter(|e| e.chained && e.kind == "execution.started") {
        let id = s(started.data, "invocation_id");
        let Some(frozen) = events.iter().find(|e| e.kind == "invocation.frozen" && s(e.data, "invocation_id") == id)
        else {
            r.fail(format!("grant {id}"), format!("event seq {} starts a call that was never frozen", started.seq));
            continue;
        };
        if !frozen.chained || frozen.data.get("approval_required").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let triple =
            |d: &Value| (s(d, "tool_id").to_owned(), s(d, "tool_call_id").to_owned(), s(d, "input_hash").to_owned());
        let want = triple(frozen.data);
        let granted = events.iter().any(|e| {
            e.chained
                && e.seq < started.seq
                && e.kind == "approval.granted"
                && s(e.data, "invocation_id") == id
                && triple(e.data) == want
        });
        if granted {
            r.grants += 1;
        } else {
            r.fail(
                format!("grant {id}"),
                format!(
                    "tool {} call {} (input_hash {}) required approval and was executed at event seq {} without a matching grant",
                    want.0, want.1, want.2, started.seq
                ),
            );
        }
    }
}

/// The signature, under `pinned` or the key the bundle names.
fn check_signature(r: &mut Report, doc: &Value, pinned: Option<&VerifyingKey>) {
    let Some(sig) = doc.get("signature") else {
        r.fail("signature", "the bundle is not signed");
        return;
    };
    if s(sig, "algorithm") != "ed25519" {
        r.fail("signature", format!("algorithm {:?} is not ed25519", sig.get("algorithm")));
        return;
    }
    let embedded = s(sig, "public_key");
    let key = match pinned {
        Some(k) => {
            let hex_key = hex::encode(k.to_bytes());
            if embedded != hex_key {
                r.notes.push(format!("the bundle names key {embedded}, checked under the given key {hex_key}"));
            }
            *k
        }
        None => match mira_core::remote::parse_public(embedded) {
            Some(k) => {
                r.notes.push("no --key given: the signature was checked under the key the bundle names, which proves integrity, not who signed".into());
                k
            }
            None => {
                r.fail("signature", "public_key is not an Ed25519 public key in hex");
                return;
            }
        },
    };
    if mira_core::remote::verify(&key, b"", &signed_bytes(doc), s(sig, "value")) {
        r.signed_by = Some(hex::encode(key.to_bytes()));
    } else {
        r.fail("signature", format!("does not verify under key {}", hex::encode(key.to_bytes())));
    }
}

/// `mira verify` (docs/verify.md).
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The bundle file (`GET /v1/runs/{id}/bundle`); `-` reads standard input.
    #[arg(required_unless_present = "database", conflicts_with = "database")]
    pub bundle: Option<std::path::PathBuf>,
    /// The server's bundle public key: 64 hex digits, or a file holding them (or the JSON of
    /// `GET /.well-known/mira-signing-key`). Without it the key the bundle names is used.
    #[arg(long)]
    pub key: Option<String>,
    /// Check the stored chain of a run in this database (`postgres://…` or `sqlite://…`).
    #[arg(long, requires = "run")]
    pub database: Option<String>,
    /// The run to check with `--database`.
    #[arg(long, requires = "database")]
    pub run: Option<String>,
}

/// A public key from `--key`: hex, or a file holding hex or the well-known JSON.
fn read_key(arg: &str) -> Result<VerifyingKey, String> {
    if let Some(k) = mira_core::remote::parse_public(arg.trim()) {
        return Ok(k);
    }
    let text = std::fs::read_to_string(arg).map_err(|e| format!("--key {arg}: not a hex key, and reading it: {e}"))?;
    let text = text.trim();
    let hex_key = match serde_json::from_str::<Value>(text) {
        Ok(v) => s(&v, "public_key").to_owned(),
        Err(_) => text.to_owned(),
    };
    mira_core::remote::parse_public(&hex_key).ok_or_else(|| format!("--key {arg}: no Ed25519 public key in hex"))
}

/// Prints `report` and answers the exit status: 0 valid, 1 invalid.
fn print(report: &Report, what: &str) -> std::process::ExitCode {
    let [x, i, a, e] = report.records;
    for note in &report.notes {
        println!("note: {note}");
    }
    if report.valid() {
        println!(
            "valid: {what} of run {}: {} events ({} chained), {x} exposures, {i} invocations, {a} approvals, {e} evidence, {} grant(s) matched{}",
            report.run_id,
            report.events,
            report.chained,
            report.grants,
            report.signed_by.as_ref().map(|k| format!(", signed by {k}")).unwrap_or_default()
        );
        return std::process::ExitCode::SUCCESS;
    }
    println!("INVALID: {what} of run {}: {}", report.run_id, report.problems[0]);
    for p in report.problems.iter().skip(1) {
        println!("  also: {p}");
    }
    std::process::ExitCode::from(1)
}

/// Runs `mira verify`: exit 0 when valid, 1 when a check fails, 2 when the input cannot be
/// read.
pub async fn run(args: VerifyArgs) -> std::process::ExitCode {
    let fail = |msg: String| {
        eprintln!("mira verify: {msg}");
        std::process::ExitCode::from(2)
    };
    if let (Some(url), Some(run_id)) = (&args.database, &args.run) {
        let store = match crate::store::Store::connect(url, crate::events::EventBus::new()).await {
            Ok(s) => s,
            Err(e) => return fail(format!("opening {}: {e}", crate::store::redact_url(url))),
        };
        let doc = match store.run_document(run_id, usize::MAX).await {
            Ok(crate::store::RunDocument::Document(doc)) => doc,
            Ok(_) => return fail(format!("no run {run_id} in the database")),
            Err(e) => return fail(format!("reading run {run_id}: {e}")),
        };
        store.close().await;
        return print(&check(&doc, KeyCheck::Skip), "stored chain");
    }
    let key = match args.key.as_deref().map(read_key).transpose() {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let Some(path) = args.bundle else { return fail("give a BUNDLE file or --database and --run".into()) };
    let text = if path.as_os_str() == "-" {
        let mut buf = String::new();
        match std::io::Read::read_to_string(&mut std::io::stdin(), &mut buf) {
            Ok(_) => buf,
            Err(e) => return fail(format!("reading standard input: {e}")),
        }
    } else {
        match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => return fail(format!("reading {}: {e}", path.display())),
        }
    };
    let doc: Value = match serde_json::from_str(&text) {
        Ok(d) => d,
        Err(e) => {
            println!("INVALID: bundle: not JSON ({e})");
            return std::process::ExitCode::from(1);
        }
    };
    let report = check(&doc, key.as_ref().map_or(KeyCheck::Embedded, KeyCheck::Pinned));
    print(&report, "bundle")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_covers_everything_but_itself() {
        let key = mira_core::remote::signing_key(&[7; 32]);
        let mut doc = json!({"format": BUNDLE_FORMAT, "run": {"id": "run_1"}, "chain": {"unchained_before": 1,
            "head_seq": 0, "head_hash": null}, "exposures": [], "invocations": [], "approvals": [],
            "evidence": [], "events": []});
        sign(&mut doc, &key);
        let public = key.verifying_key();
        assert!(check(&doc, KeyCheck::Pinned(&public)).valid());
        doc["run"]["title"] = json!("x");
        let r = check(&doc, KeyCheck::Pinned(&public));
        assert_eq!(r.problems.first().map(|p| p.part.as_str()), Some("signature"));
        let other = mira_core::remote::signing_key(&[8; 32]).verifying_key();
        doc["run"]["title"] = Value::Null;
        if let Some(o) = doc["run"].as_object_mut() {
            o.remove("title");
        }
        assert!(!check(&doc, KeyCheck::Pinned(&other)).valid());
    }
}
