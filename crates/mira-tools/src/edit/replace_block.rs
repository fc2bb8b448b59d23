//! `replace_block {path, old, new, expected_occurrences? = 1, expected_sha256?}`: a local
//! replacement of an exact block of text.
//!
//! Rules, in order:
//! - The file is text: UTF-8 (a byte-order mark is kept), or UTF-16 LE/BE with a byte-order
//!   mark (decoded, edited, re-encoded the same way). A NUL byte in the first 8 KiB without a
//!   UTF-16 mark is `binary_file`; other bytes that are not UTF-8 are `unsupported_encoding`.
//! - `old` is matched exactly, byte for byte, non-overlapping. Only if that finds nothing and
//!   the file uses one line-ending style throughout, `old` is tried again with its line
//!   endings converted to the file's (so text copied from `read_open` of a CRLF file, or the
//!   same text with plain LFs, both match). Whitespace is never made to match: a block that
//!   differs only in whitespace is reported as a candidate location, never rewritten.
//! - The number of matches must equal `expected_occurrences`. Zero is `block_not_found`
//!   (with the closest candidate lines), any other count `occurrence_mismatch` (with the count
//!   and the lines); nothing is written.
//! - `new` is inserted exactly as given — nothing trimmed — except that in a file with one
//!   line-ending style its line endings take that style, so a CRLF file stays CRLF.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::fs::{self as efs, Leaf, Parents, Replace};
use super::{TargetState, check_expected, check_precondition, check_resolved, diff, target};
use crate::input;
use crate::read::blocking;
use crate::read::open::BINARY_SNIFF_BYTES;
use mira_core::commit::{CommitGate, SideEffects};
use mira_core::error_code::ErrorCode;
use mira_core::evidence::sha256_hex;
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolOutput, ToolSpec};
use mira_core::workspace::Workspace;

/// Largest `expected_occurrences`.
pub const MAX_OCCURRENCES: u64 = 10_000;
/// Candidate locations reported when the block is not found.
pub const MAX_CANDIDATES: usize = 3;
/// Lines of the file compared when looking for candidates.
pub const MAX_CANDIDATE_SCAN_LINES: usize = 20_000;
/// Lowest similarity (0–1, `similar`'s ratio: 2·matches / total characters) a candidate line
/// must reach.
pub const MIN_CANDIDATE_SIMILARITY: f32 = 0.6;

/// Default `expected_occurrences`.
pub const DEFAULT_OCCURRENCES: u64 = 1;

/// The input of `replace_block`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplaceBlockInput {
    /// File path relative to the workspace root
    #[schemars(length(min = 1, max = super::MAX_PATH_BYTES))]
    path: String,
    /// The exact text to replace
    #[schemars(length(min = 1))]
    old: String,
    /// The replacement, inserted byte for byte
    new: String,
    /// How many times `old` must occur; all of them are replaced (default 1)
    #[schemars(range(min = 1, max = MAX_OCCURRENCES))]
    expected_occurrences: Option<u64>,
    /// SHA-256 (hex) of the file as last read (read_open returns it); if the file changed since, nothing is written (409 stale_target)
    #[schemars(pattern(r"^[0-9a-fA-F]{64}$"))]
    expected_sha256: Option<String>,
}

/// The canonical input of `replace_block` as frozen: [`ReplaceBlockInput`] with the
/// normalised path, the resolved absolute path, the lowercased hash, the count filled in and
/// the target's state (`precondition`, absent before the preview is made).
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    path: String,
    resolved_path: String,
    old: String,
    new: String,
    expected_occurrences: Option<u64>,
    expected_sha256: Option<String>,
    precondition: Option<Value>,
}

impl Frozen {
    fn expected_occurrences(&self) -> u64 {
        self.expected_occurrences.unwrap_or(DEFAULT_OCCURRENCES).clamp(1, MAX_OCCURRENCES)
    }
}

/// The `replace_block` tool.
pub struct ReplaceBlock {
    spec: ToolSpec,
}

impl ReplaceBlock {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: super::spec(
                "replace_block",
                "Replace a block of text",
                "Replace an exact block of text in a workspace file (copy `old` from read_open). The block must occur \
                 exactly expected_occurrences times (default 1), else nothing is written and the count (or the closest \
                 candidate lines) is returned. Keeps the file's line endings and encoding; refuses binary files. Needs \
                 approval; the approver sees a unified diff.",
                input::schema_of::<ReplaceBlockInput>(),
            ),
        }
    }
}

impl Default for ReplaceBlock {
    fn default() -> Self {
        Self::new()
    }
}

fn canonical(input: &Value, ws: &Workspace) -> Result<Value, ToolError> {
    let input: ReplaceBlockInput = input::parse(input)?;
    let (rel, abs) = target(ws, &input.path)?;
    let (old, new) = (&input.old, &input.new);
    if old == new {
        return Err(ToolError::new(ErrorCode::NoChange, "old and new are the same text; nothing to replace")
            .with_details(json!({"path": rel})));
    }
    let mut c = json!({
        "path": rel,
        "resolved_path": abs,
        "old": old,
        "new": new,
        "expected_occurrences": input.expected_occurrences.unwrap_or(DEFAULT_OCCURRENCES).clamp(1, MAX_OCCURRENCES),
    });
    if let Some(sha) = &input.expected_sha256 {
        c["expected_sha256"] = json!(sha.to_ascii_lowercase());
    }
    Ok(c)
}

/// How a text file is encoded on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8 without a byte-order mark.
    Utf8,
    /// UTF-8 with a byte-order mark.
    Utf8Bom,
    /// UTF-16 little-endian with a byte-order mark.
    Utf16Le,
    /// UTF-16 big-endian with a byte-order mark.
    Utf16Be,
}

impl Encoding {
    /// `utf-8`, `utf-8-bom`, `utf-16le`, `utf-16be`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf-8",
            Encoding::Utf8Bom => "utf-8-bom",
            Encoding::Utf16Le => "utf-16le",
            Encoding::Utf16Be => "utf-16be",
        }
    }
}

/// Decodes a file's bytes (see the module docs).
pub fn decode(bytes: &[u8], rel: &str) -> Result<(String, Encoding), ToolError> {
    let utf16 = |body: &[u8], le: bool| -> Result<String, ToolError> {
        let invalid = || {
            ToolError::new(
                ErrorCode::InvalidUtf16,
                format!("{rel} has a UTF-16 byte-order mark but is not valid UTF-16"),
            )
            .with_details(json!({"path": rel}))
        };
        if !body.len().is_multiple_of(2) {
            return Err(invalid());
        }
        let units: Vec<u16> = body
            .chunks_exact(2)
            .map(|p| if le { u16::from_le_bytes([p[0], p[1]]) } else { u16::from_be_bytes([p[0], p[1]]) })
            .collect();
        String::from_utf16(&units).map_err(|_| invalid())
    };
    if let Some(body) = bytes.strip_prefix(&[0xFF, 0xFE]) {
        return Ok((utf16(body, true)?, Encoding::Utf16Le));
    }
    if let Some(body) = bytes.strip_prefix(&[0xFE, 0xFF]) {
        return Ok((utf16(body, false)?, Encoding::Utf16Be));
    }
    let (body, encoding) = match bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]) {
        Some(body) => (body, Encoding::Utf8Bom),
        None => (bytes, Encoding::Utf8),
    };
    if body[..body.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(ToolError::new(
            ErrorCode::BinaryFile,
            format!("{rel} is a binary file; replace_block edits text only"),
        )
        .with_details(json!({"path": rel})));
    }
    match std::str::from_utf8(body) {
        Ok(text) => Ok((text.to_owned(), encoding)),
        Err(e) => Err(ToolError::new(
            ErrorCode::UnsupportedEncoding,
            format!(
                "{rel} is neither UTF-8 nor UTF-16 with a byte-order mark (invalid byte at offset {}); replace_block \
                 edits it only in one of those",
                e.valid_up_to()
            ),
        )
        .with_details(json!({"path": rel, "offset": e.valid_up_to()}))),
    }
}

/// Encodes text back the way it was stored.
pub fn encode(text: &str, encoding: Encoding) -> Vec<u8> {
    match encoding {
        Encoding::Utf8 => text.as_bytes().to_vec(),
        Encoding::Utf8Bom => [&[0xEF, 0xBB, 0xBF][..], text.as_bytes()].concat(),
        Encoding::Utf16Le => [0xFF, 0xFE].into_iter().chain(text.encode_utf16().flat_map(u16::to_le_bytes)).collect(),
        Encoding::Utf16Be => [0xFE, 0xFF].into_iter().chain(text.encode_utf16().flat_map(u16::to_be_bytes)).collect(),
    }
}

/// The line-ending style of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnding {
    /// Every line ends with CRLF.
    Crlf,
    /// Every line ends with LF alone.
    Lf,
    /// Both.
    Mixed,
    /// No line ending at all.
    None,
}

impl LineEnding {
    /// `crlf`, `lf`, `mixed`, `none` (the words of `read_open`).
    pub fn name(self) -> &'static str {
        match self {
            LineEnding::Crlf => "crlf",
            LineEnding::Lf => "lf",
            LineEnding::Mixed => "mixed",
            LineEnding::None => "none",
        }
    }

    /// The style of `text`.
    pub fn of(text: &str) -> Self {
        let crlf = text.matches("\r\n").count();
        let lf = text.matches('\n').count() - crlf;
        match (crlf, lf) {
            (0, 0) => LineEnding::None,
            (_, 0) => LineEnding::Crlf,
            (0, _) => LineEnding::Lf,
            _ => LineEnding::Mixed,
        }
    }

    /// `text` with every line ending in this style (unchanged for `Mixed`/`None`).
    pub fn apply(self, text: &str) -> String {
        match self {
            LineEnding::Crlf => text.replace("\r\n", "\n").replace('\n', "\r\n"),
            LineEnding::Lf => text.replace("\r\n", "\n"),
            LineEnding::Mixed | LineEnding::None => text.to_owned(),
        }
    }
}

/// A replacement that can be applied.
#[derive(Debug, Clone)]
pub struct Replacement {
    /// The whole new text.
    pub text: String,
    /// 1-based first lines of the replaced blocks.
    pub lines: Vec<usize>,
    /// True when `old` matched only after its line endings took the file's style.
    pub old_adapted: bool,
    /// True when `new`'s line endings were changed to the file's style.
    pub new_adapted: bool,
    /// The file's line-ending style.
    pub line_ending: LineEnding,
}

/// Applies the rules of the module docs to `text`.
pub fn replace(text: &str, old: &str, new: &str, expected: usize, rel: &str) -> Result<Replacement, ToolError> {
    let style = LineEnding::of(text);
    let mut needle = old.to_owned();
    let mut old_adapted = false;
    let mut count = text.matches(needle.as_str()).count();
    if count == 0 {
        let adapted = style.apply(old);
        if adapted != old && !adapted.is_empty() {
            count = text.matches(adapted.as_str()).count();
            if count > 0 {
                needle = adapted;
                old_adapted = true;
            }
        }
    }
    if count == 0 {
        let candidates = candidates(text, old);
        let listed: Vec<String> = candidates
            .iter()
            .map(|c| match c["kind"].as_str() {
                Some("whitespace_differs") => format!("line {} (differs only in whitespace)", c["line"]),
                _ => format!("line {} (similarity {:.2})", c["line"], c["similarity"].as_f64().unwrap_or(0.0)),
            })
            .collect();
        let hint = if listed.is_empty() { "no similar lines".to_owned() } else { listed.join(", ") };
        return Err(ToolError::new(
            ErrorCode::BlockNotFound,
            format!("old block not found in {rel} (0 matches); closest candidates: {hint}; nothing was written"),
        )
        .with_details(json!({"path": rel, "count": 0, "expected": expected, "candidates": candidates})));
    }
    let lines: Vec<usize> =
        text.match_indices(needle.as_str()).map(|(at, _)| text[..at].matches('\n').count() + 1).collect();
    if count != expected {
        return Err(ToolError::new(
            ErrorCode::OccurrenceMismatch,
            format!(
                "old block occurs {count} times in {rel} (lines {}), expected {expected}; nothing was written",
                lines.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        )
        .with_details(json!({"path": rel, "count": count, "expected": expected, "lines": lines})));
    }
    let replacement = style.apply(new);
    let new_adapted = replacement != new;
    Ok(Replacement {
        text: text.replace(needle.as_str(), &replacement),
        lines,
        old_adapted,
        new_adapted,
        line_ending: style,
    })
}

/// Where the block may have been meant: windows of lines equal to `old` up to whitespace
/// (located, never used to rewrite), else single lines most similar to `old`'s first
/// non-blank line.
fn candidates(text: &str, old: &str) -> Vec<Value> {
    let squash = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    let lines: Vec<&str> = text.lines().take(MAX_CANDIDATE_SCAN_LINES).collect();
    let wanted: Vec<String> = old.lines().map(squash).collect();
    let first = wanted.iter().position(|l| !l.is_empty());
    let last = wanted.iter().rposition(|l| !l.is_empty());
    let (Some(first), Some(last)) = (first, last) else {
        return Vec::new();
    };
    let wanted = &wanted[first..=last];
    let squashed: Vec<String> = lines.iter().map(|l| squash(l)).collect();
    let mut found: Vec<Value> = squashed
        .windows(wanted.len())
        .enumerate()
        .filter(|(_, w)| *w == wanted)
        .take(MAX_CANDIDATES)
        .map(|(i, _)| {
            json!({"kind": "whitespace_differs", "line": i + 1, "end_line": i + wanted.len(),
                   "text": mira_core::evidence::excerpt(&lines[i..i + wanted.len()].join("\n"), 500)})
        })
        .collect();
    if !found.is_empty() {
        return found;
    }
    let probe = &wanted[0];
    let mut scored: Vec<(f32, usize)> = squashed
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty() && l.len() <= 1000)
        .map(|(i, l)| (similar::TextDiff::from_chars(probe.as_str(), l.as_str()).ratio(), i))
        .filter(|(score, _)| *score >= MIN_CANDIDATE_SIMILARITY)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    found = scored
        .into_iter()
        .take(MAX_CANDIDATES)
        .map(|(score, i)| {
            json!({"kind": "similar_line", "line": i + 1, "similarity": (f64::from(score) * 100.0).round() / 100.0,
                   "text": mira_core::evidence::excerpt(lines[i], 500)})
        })
        .collect();
    found
}

/// The file as read, decoded and replaced.
struct Edit {
    file: efs::Regular,
    sha256_before: String,
    size_before: usize,
    encoding: Encoding,
    before: String,
    replacement: Replacement,
    bytes: Vec<u8>,
}

/// Reads, decodes and replaces. At execution (`frozen` = the frozen precondition) the file
/// must first be exactly the one the preview showed.
fn edit(
    dir: &cap_std::fs::Dir,
    name: &str,
    rel: &str,
    input: &Frozen,
    frozen: Option<Option<&Value>>,
) -> Result<Edit, ToolError> {
    let file = match efs::inspect(dir, name, rel)? {
        Leaf::File(f) => f,
        Leaf::Dir => return Err(super::is_a_directory(rel)),
        Leaf::Missing => {
            if let Some(frozen) = frozen {
                check_precondition(rel, frozen, &TargetState::Absent)?;
            }
            return Err(super::not_found(rel));
        }
    };
    let raw = file.read_all(rel)?;
    let sha256_before = sha256_hex(&raw);
    if let Some(frozen) = frozen {
        check_precondition(rel, frozen, &TargetState::File { sha256: sha256_before.clone() })?;
    }
    check_expected(rel, input.expected_sha256.as_deref(), Some(&sha256_before))?;
    let (before, encoding) = decode(&raw, rel)?;
    let expected = usize::try_from(input.expected_occurrences()).unwrap_or(1).max(1);
    let replacement = replace(&before, &input.old, &input.new, expected, rel)?;
    let bytes = encode(&replacement.text, encoding);
    Ok(Edit { file, sha256_before, size_before: raw.len(), encoding, before, replacement, bytes })
}

/// The preview and the precondition it shows.
fn plan(ws: &Workspace, input: &Frozen) -> Result<(Value, TargetState), ToolError> {
    let rel = input.path.as_str();
    let located = efs::locate(ws, rel, Parents::MustExist)?;
    let dir = located.dir.as_ref().ok_or_else(|| super::not_found(rel))?;
    let e = edit(dir, &located.name, rel, input, None)?;
    let diff = diff::unified(rel, Some(&e.before), &e.replacement.text);
    let state = TargetState::File { sha256: e.sha256_before.clone() };
    let preview = json!({
        "action": "replace_block",
        "path": rel,
        "resolved_path": input.resolved_path,
        "occurrences": e.replacement.lines.len(),
        "lines": e.replacement.lines,
        "encoding": e.encoding.name(),
        "line_ending": e.replacement.line_ending.name(),
        "line_endings_adapted": e.replacement.old_adapted || e.replacement.new_adapted,
        "before": {"sha256": e.sha256_before, "size": e.size_before},
        "after": {"sha256": sha256_hex(&e.bytes), "size": e.bytes.len()},
        "diff": diff.as_ref().map(|d| d.unified.clone()),
        "diff_truncated": diff.as_ref().is_some_and(|d| d.truncated),
        "diff_summary": diff.as_ref().map(|d| d.summary.clone()),
    });
    Ok((preview, state))
}

fn apply(ws: &Workspace, input: &Frozen, gate: &CommitGate) -> Result<ToolOutput, ToolError> {
    let rel = check_resolved(ws, &input.path, &input.resolved_path)?;
    let abs = input.resolved_path.as_str();
    let _guard = efs::lock_paths(&[abs]);
    let located = efs::locate(ws, &rel, Parents::MustExist)?;
    let dir = located.dir.as_ref().ok_or_else(|| super::not_found(&rel))?;
    let e = edit(dir, &located.name, &rel, input, Some(input.precondition.as_ref()))?;
    efs::write_atomic(dir, &located.name, &rel, &e.bytes, Some(e.file.mode), Replace::Overwrite, ws.node(), || {
        match efs::inspect(dir, &located.name, &rel)? {
            Leaf::File(now) if now.unchanged(&e.file, &e.sha256_before, &rel)? => gate.pass(),
            _ => Err(super::changed_meanwhile(&rel)),
        }
    })?;
    let sha256_after = match efs::inspect(dir, &located.name, &rel)? {
        Leaf::File(file) => file.sha256(&rel)?,
        _ => String::new(),
    };
    let diff = diff::unified(&rel, Some(&e.before), &e.replacement.text);
    let output = json!({
        "path": rel,
        "occurrences": e.replacement.lines.len(),
        "lines": e.replacement.lines,
        "encoding": e.encoding.name(),
        "line_ending": e.replacement.line_ending.name(),
        "line_endings_adapted": e.replacement.old_adapted || e.replacement.new_adapted,
        "bytes_written": e.bytes.len(),
        "sha256_before": e.sha256_before,
        "sha256_after": sha256_after,
        "diff_summary": diff.as_ref().map(|d| d.summary.clone()),
        "read_back_matches": sha256_after == sha256_hex(&e.bytes),
    });
    let provenance = json!({
        "path": rel,
        "resolved_path": abs,
        "sha256_before": e.sha256_before,
        "sha256_after": sha256_after,
        "bytes_written": e.bytes.len(),
        "occurrences": e.replacement.lines.len(),
        "lines": e.replacement.lines,
        "diff_summary": output["diff_summary"],
    });
    let text = diff.map_or_else(|| format!("replaced {} block(s) in {rel}", e.replacement.lines.len()), |d| d.unified);
    Ok(ToolOutput { output, evidence: vec![super::evidence("file_replace", provenance, &sha256_after, &text)] })
}

#[async_trait]
impl Tool for ReplaceBlock {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let mut canonical = canonical(&input, ctx.workspace()?)?;
        let ws = ctx.workspace()?.clone();
        let frozen: Frozen = input::frozen(&canonical)?;
        let rel = frozen.path.clone();
        let (preview, state) = blocking(move || plan(&ws, &frozen)).await?;
        let precondition = state.to_json();
        canonical["precondition"] = precondition.clone();
        let preview = super::finish_preview(preview, &precondition, &[("path", &rel)]);
        Ok(Prepared { input: canonical, preview })
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        canonical(&input, ctx.workspace()?)
    }

    fn replay_input(&self, canonical: Value, frozen: &Value) -> Value {
        super::replay_with_precondition(canonical, frozen)
    }

    fn side_effects(&self) -> SideEffects {
        SideEffects::AtCommitPoint
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: Frozen = input::frozen(input)?;
        let ws = ctx.workspace()?.clone();
        let gate = ctx.commit.clone();
        blocking(move || apply(&ws, &input, &gate)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str, old: &str, new: &str, n: usize) -> Replacement {
        match replace(text, old, new, n, "f") {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    fn code(text: &str, old: &str, new: &str, n: usize) -> String {
        replace(text, old, new, n, "f").err().map(|e| e.code.to_string()).unwrap_or_default()
    }

    #[test]
    fn crlf_files_stay_crlf_whether_old_has_crlf_or_lf() {
        let text = "a\r\nold one\r\nold two\r\nz\r\n";
        let copied = ok(text, "old one\r\nold two\r\n", "new\r\n", 1);
        assert_eq!(copied.text, "a\r\nnew\r\nz\r\n");
        assert!(!copied.old_adapted && !copied.new_adapted);
        let plain = ok(text, "old one\nold two\n", "new  \n\tkept\n", 1);
        assert_eq!(plain.text, "a\r\nnew  \r\n\tkept\r\nz\r\n");
        assert!(plain.old_adapted && plain.new_adapted);
        assert_eq!(plain.lines, [2]);
    }

    #[test]
    fn new_is_inserted_without_trimming() {
        let r = ok("x = 1\ny = 2\n", "y = 2", "  y = 3   \t", 1);
        assert_eq!(r.text, "x = 1\n  y = 3   \t\n");
    }

    #[test]
    fn counts_must_match_and_zero_names_candidates() {
        let text = "fn a() {}\nfn b() {}\nfn a() {}\n";
        assert_eq!(code(text, "fn a() {}", "fn c() {}", 1), "occurrence_mismatch");
        assert_eq!(ok(text, "fn a() {}", "fn c() {}", 2).text, "fn c() {}\nfn b() {}\nfn c() {}\n");
        assert_eq!(code(text, "fn a() {}", "x", 3), "occurrence_mismatch");
        let err = replace(text, "fn   b()  {}", "x", 1, "f").err().map(|e| e.details).unwrap_or_default();
        assert_eq!(err["candidates"][0]["kind"], "whitespace_differs");
        assert_eq!(err["candidates"][0]["line"], 2);
        let err = replace(text, "fn bb() {}", "x", 1, "f").err().map(|e| e.details).unwrap_or_default();
        assert_eq!(err["candidates"][0]["kind"], "similar_line");
        assert_eq!(err["candidates"][0]["line"], 2);
    }

    #[test]
    fn mixed_files_match_exactly_only() {
        let text = "a\r\nb\nc\r\n";
        assert_eq!(code(text, "a\nb\n", "x", 1), "block_not_found");
        assert_eq!(ok(text, "b\n", "B\n", 1).text, "a\r\nB\nc\r\n");
    }

    #[test]
    fn encodings_round_trip() {
        for enc in [Encoding::Utf8, Encoding::Utf8Bom, Encoding::Utf16Le, Encoding::Utf16Be] {
            let bytes = encode("héllo\r\nwörld\r\n", enc);
            let (text, seen) = decode(&bytes, "f").unwrap();
            assert_eq!((text.as_str(), seen), ("héllo\r\nwörld\r\n", enc));
        }
        assert_eq!(decode(b"\x7fELF\0\0", "f").err().map(|e| e.code), Some(ErrorCode::BinaryFile));
        assert_eq!(decode(b"caf\xe9", "f").err().map(|e| e.code), Some(ErrorCode::UnsupportedEncoding));
        assert_eq!(decode(b"\xff\xfe\x00", "f").err().map(|e| e.code), Some(ErrorCode::InvalidUtf16));
    }
}
