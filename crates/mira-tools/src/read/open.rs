//! `read_open`: a known file, whole or a line range.
//!
//! The file is opened through the workspace boundary and streamed once: every byte feeds
//! the SHA-256 (so the evidence names the exact file version, and an Edit tool's
//! `expected_sha256` can refer to it), lines are counted, and the requested lines are kept
//! up to `max_bytes`, cut only at line boundaries, with a truncation marker. Binary files
//! (a NUL byte in the first 8 KiB) and invalid UTF-8 are answered with `binary_file` and
//! `invalid_utf8` rather than garbled text; UTF-16 files with a byte-order mark are decoded.
//! Line endings are returned as stored (a CRLF file's text keeps its CRLFs).
//!
//! Files larger than [`MAX_FILE_BYTES`] (the Edit tools' limit, so every file an edit can
//! refer to by `expected_sha256` can be hashed here) are refused with `file_too_large`
//! before a byte is read — a sparse file of a terabyte would otherwise be hashed to its end
//! — and the pass stops at the limit if the file grows meanwhile. A cancel, the time limit
//! or the server stopping ends the pass between two reads (`cancelled`).

use std::io::Read;

use tokio_util::sync::CancellationToken;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::blocking;
use crate::input;
use mira_core::error_code::ErrorCode;
use mira_core::evidence::EvidenceDraft;
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use mira_core::workspace::{self, Workspace};

/// Default cap on returned content, in bytes.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024;
/// Largest allowed `max_bytes`.
pub const MAX_MAX_BYTES: u64 = 1024 * 1024;
/// Bytes inspected for a NUL to call a file binary (the same heuristic as git and ripgrep).
pub const BINARY_SNIFF_BYTES: usize = 8192;
/// Largest UTF-16 file decoded, in bytes.
pub const MAX_UTF16_BYTES: u64 = 16 * 1024 * 1024;
/// Largest file read (and hashed), in bytes: the Edit tools' limit
/// ([`crate::edit::fs::MAX_EDIT_BYTES`]).
pub const MAX_FILE_BYTES: u64 = crate::edit::fs::MAX_EDIT_BYTES;

/// The input of `read_open` (also its canonical input, defaults filled).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenInput {
    /// File path relative to the workspace root
    #[schemars(length(min = 1, max = 4096))]
    path: String,
    /// First line to return (1-based)
    #[schemars(range(min = 1, max = u32::MAX))]
    start_line: Option<u64>,
    /// Last line to return (inclusive)
    #[schemars(range(min = 1, max = u32::MAX))]
    end_line: Option<u64>,
    /// Most bytes of text to return (default 262144)
    #[schemars(range(min = 1, max = MAX_MAX_BYTES))]
    max_bytes: Option<u64>,
}

impl OpenInput {
    fn max_bytes(&self) -> u64 {
        self.max_bytes.unwrap_or(DEFAULT_MAX_BYTES).min(MAX_MAX_BYTES)
    }
}

/// The `read_open` tool.
pub struct ReadOpen {
    spec: ToolSpec,
}

impl ReadOpen {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                id: "read_open".into(),
                kind: ToolKind::Public,
                domain: "read".into(),
                title: "Open a file".into(),
                description: "Open a known workspace file, whole or a line range (1-based, inclusive). Returns the text \
                    with its SHA-256, line count and line-ending style; large output is truncated with a marker; binary \
                    and non-UTF-8 files are reported as such; files over 64 MiB are refused (file_too_large)."
                    .into(),
                input_schema: input::schema_of::<OpenInput>(),
                requires_approval: false,
                capability: Some("fs.read".into()),
                replacement: None,
                owner: None,
            },
        }
    }
}

impl Default for ReadOpen {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for ReadOpen {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let ws = ctx.workspace()?;
        let input: OpenInput = input::parse(&input)?;
        let path = workspace::normalize(&input.path)?;
        ws.check_beneath(&path)?;
        let (start, end) = (input.start_line, input.end_line);
        if let (Some(s), Some(e)) = (start, end)
            && s > e
        {
            return Err(ToolError::new(ErrorCode::InvalidRange, format!("start_line {s} is after end_line {e}")));
        }
        let mut canonical = json!({"path": path, "max_bytes": input.max_bytes()});
        if let Some(s) = start {
            canonical["start_line"] = json!(s);
        }
        if let Some(e) = end {
            canonical["end_line"] = json!(e);
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: OpenInput = input::frozen(input)?;
        let ws = ctx.workspace()?.clone();
        let cancel = ctx.cancel.clone();
        blocking(move || open(&ws, &input, &cancel)).await
    }
}

/// What one streaming pass over a file found.
struct Scan {
    sha256: String,
    size: u64,
    total_lines: u64,
    crlf: u64,
    lf_only: u64,
    kept: Vec<u8>,
    first_kept: u64,
    last_kept: u64,
    truncated: bool,
}

/// One pass over `file` (at most [`MAX_FILE_BYTES`], else `file_too_large`), stopping with
/// `cancelled` between two reads once `cancel` is cancelled.
fn scan(
    file: impl Read,
    start: u64,
    end: u64,
    max_bytes: usize,
    rel: &str,
    cancel: &CancellationToken,
) -> Result<Scan, ToolError> {
    let mut file = file.take(MAX_FILE_BYTES + 1);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut s = Scan {
        sha256: String::new(),
        size: 0,
        total_lines: 0,
        crlf: 0,
        lf_only: 0,
        kept: Vec::new(),
        first_kept: 0,
        last_kept: 0,
        truncated: false,
    };
    let mut line_no: u64 = 1;
    let mut line = Vec::new();
    let mut prev: u8 = 0;
    let mut sniffed = false;
    loop {
        if cancel.is_cancelled() {
            return Err(ToolError::new(ErrorCode::Cancelled, "the invocation was cancelled"));
        }
        let n = file.read(&mut buf).map_err(|e| workspace::io_error(rel, &e))?;
        if n == 0 {
            break;
        }
        if s.size + n as u64 > MAX_FILE_BYTES {
            // The file grew past the limit since it was opened.
            return Err(too_large(rel, s.size + n as u64));
        }
        let chunk = &buf[..n];
        if !sniffed {
            sniffed = true;
            let head = &chunk[..chunk.len().min(BINARY_SNIFF_BYTES)];
            if head.contains(&0) {
                return Err(ToolError::new(
                    ErrorCode::BinaryFile,
                    format!("{rel} is a binary file; read_open returns text only"),
                )
                .with_details(json!({"path": rel})));
            }
        }
        hasher.update(chunk);
        s.size += n as u64;
        for &b in chunk {
            let in_range = line_no >= start && line_no <= end;
            if in_range && !s.truncated {
                line.push(b);
            }
            if b == b'\n' {
                if prev == b'\r' {
                    s.crlf += 1
                } else {
                    s.lf_only += 1
                }
                if in_range && !s.truncated {
                    keep_line(&mut s, &mut line, line_no, max_bytes);
                }
                line_no += 1;
            }
            prev = b;
        }
    }
    if !line.is_empty() && !s.truncated {
        keep_line(&mut s, &mut line, line_no, max_bytes);
    }
    s.total_lines = if s.size == 0 {
        0
    } else if prev == b'\n' {
        line_no - 1
    } else {
        line_no
    };
    s.sha256 = hex::encode(hasher.finalize());
    Ok(s)
}

fn keep_line(s: &mut Scan, line: &mut Vec<u8>, line_no: u64, max_bytes: usize) {
    if s.kept.len() + line.len() > max_bytes {
        if s.kept.is_empty() {
            // A single line longer than the cap: keep its head (cut on a char boundary later).
            s.kept.extend_from_slice(&line[..max_bytes]);
            s.first_kept = line_no;
            s.last_kept = line_no;
        }
        s.truncated = true;
    } else {
        if s.kept.is_empty() && s.first_kept == 0 {
            s.first_kept = line_no;
        }
        s.kept.extend_from_slice(line);
        s.last_kept = line_no;
    }
    line.clear();
}

/// `file_too_large` for `rel` of `size` bytes (or more).
fn too_large(rel: &str, size: u64) -> ToolError {
    ToolError::new(
        ErrorCode::FileTooLarge,
        format!(
            "{rel} is {size} bytes; read_open reads files up to {MAX_FILE_BYTES} bytes (grep searches files up to \
             {} bytes; a terminal session can read parts of a larger one)",
            super::grep::MAX_FILE_BYTES
        ),
    )
    .with_details(json!({"path": rel, "size": size, "max": MAX_FILE_BYTES}))
}

fn open(ws: &Workspace, input: &OpenInput, cancel: &CancellationToken) -> Result<ToolOutput, ToolError> {
    let rel = input.path.clone();
    let start = input.start_line.unwrap_or(1);
    let end = input.end_line.unwrap_or(u64::MAX);
    let max_bytes = usize::try_from(input.max_bytes()).unwrap_or(262_144);
    let (file, meta) = ws.open_regular(&rel)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large(&rel, meta.len()));
    }
    let mut bom = [0u8; 2];
    let bom_len = std::os::unix::fs::FileExt::read_at(&file, &mut bom, 0).map_err(|e| workspace::io_error(&rel, &e))?;
    let utf16 = bom_len == 2 && (bom == [0xFF, 0xFE] || bom == [0xFE, 0xFF]);
    let (scan, encoding) = if utf16 {
        (decode_utf16(file, &rel, meta.len(), start, end, max_bytes, cancel)?, "utf-16")
    } else {
        (scan(&file, start, end, max_bytes, &rel, cancel)?, "utf-8")
    };
    if scan.total_lines > 0 && start > scan.total_lines {
        return Err(ToolError::new(
            ErrorCode::InvalidRange,
            format!("start_line {start} is beyond the end of {rel} ({} lines)", scan.total_lines),
        )
        .with_details(json!({"path": rel, "total_lines": scan.total_lines})));
    }
    let content = match String::from_utf8(scan.kept) {
        Ok(text) => text,
        Err(e) if scan.truncated && e.utf8_error().error_len().is_none() => {
            // The cut fell inside a character: drop the partial sequence.
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
        Err(e) => {
            return Err(ToolError::new(
                ErrorCode::InvalidUtf8,
                format!(
                    "{rel} is not valid UTF-8 (first invalid byte at offset {} of the returned range)",
                    e.utf8_error().valid_up_to()
                ),
            )
            .with_details(
                json!({"path": rel, "offset_in_range": e.utf8_error().valid_up_to(), "sha256": scan.sha256}),
            ));
        }
    };
    let line_ending = match (scan.crlf, scan.lf_only) {
        (0, 0) => "none",
        (_, 0) => "crlf",
        (0, _) => "lf",
        _ => "mixed",
    };
    let (first, last) =
        if content.is_empty() { (start, start.saturating_sub(1)) } else { (scan.first_kept, scan.last_kept) };
    let marker = scan.truncated.then(|| {
        format!(
            "[truncated: returned lines {first}-{last} of {}; {} bytes cap reached; ask for start_line {} to continue]",
            scan.total_lines,
            max_bytes,
            last + 1
        )
    });
    let evidence = EvidenceDraft {
        kind: "file_excerpt".into(),
        provenance: json!({
            "path": rel, "start_line": first, "end_line": last, "total_lines": scan.total_lines,
            "file_sha256": scan.sha256, "size_bytes": scan.size, "truncated": scan.truncated,
        }),
        content_sha256: scan.sha256.clone(),
        excerpt: mira_core::evidence::excerpt(&content, mira_core::evidence::EXCERPT_MAX_BYTES),
    };
    Ok(ToolOutput {
        output: json!({
            "path": rel,
            "content": content,
            "start_line": first,
            "end_line": last,
            "total_lines": scan.total_lines,
            "size_bytes": scan.size,
            "sha256": scan.sha256,
            "encoding": encoding,
            "line_ending": line_ending,
            "truncated": scan.truncated,
            "truncation_marker": marker,
        }),
        evidence: vec![evidence],
    })
}

/// Decodes a UTF-16 file (byte-order mark present; `decode` sniffs LE/BE and strips it).
fn decode_utf16(
    file: std::fs::File,
    rel: &str,
    size: u64,
    start: u64,
    end: u64,
    max_bytes: usize,
    cancel: &CancellationToken,
) -> Result<Scan, ToolError> {
    if size > MAX_UTF16_BYTES {
        return Err(ToolError::new(
            ErrorCode::FileTooLarge,
            format!("{rel} is UTF-16 and larger than {MAX_UTF16_BYTES} bytes"),
        ));
    }
    let mut raw = Vec::new();
    file.take(MAX_UTF16_BYTES).read_to_end(&mut raw).map_err(|e| workspace::io_error(rel, &e))?;
    let (text, _, had_errors) = encoding_rs::UTF_16LE.decode(&raw);
    if had_errors {
        return Err(ToolError::new(
            ErrorCode::InvalidUtf16,
            format!("{rel} has a UTF-16 byte-order mark but is not valid UTF-16"),
        ));
    }
    let mut s = scan(text.as_bytes(), start, end, max_bytes, rel, cancel)?;
    s.sha256 = mira_core::evidence::sha256_hex(&raw);
    s.size = raw.len() as u64;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use super::*;

    /// A fresh workspace folder (removed by the caller) and the workspace on it.
    fn scratch(name: &str) -> (PathBuf, Workspace) {
        let dir = std::env::temp_dir().join(format!("mira-read-open-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ws = Workspace::open(&dir).unwrap();
        (dir, ws)
    }

    fn whole(path: &str) -> OpenInput {
        OpenInput { path: path.into(), start_line: None, end_line: None, max_bytes: None }
    }

    /// A sparse file of a terabyte costs nothing to make and, with text in its first 8 KiB
    /// (so it is not found binary), would be hashed to its end: it is refused from its size,
    /// at once, with the limit in the details.
    #[test]
    fn a_sparse_file_past_the_limit_is_refused_unread() {
        let (dir, ws) = scratch("sparse");
        std::fs::write(dir.join("huge.log"), "x\n".repeat(8192)).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(dir.join("huge.log")).unwrap();
        file.set_len(1 << 40).unwrap();
        let began = Instant::now();
        let e = open(&ws, &whole("huge.log"), &CancellationToken::new()).err().unwrap();
        assert!(began.elapsed() < Duration::from_secs(5), "refused without reading: {:?}", began.elapsed());
        assert_eq!(e.code, ErrorCode::FileTooLarge, "{e}");
        assert_eq!(e.details["size"], 1u64 << 40);
        assert_eq!(e.details["max"], MAX_FILE_BYTES);
        // One byte over the limit too; a range does not change it (the whole file is hashed).
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let ranged = OpenInput { start_line: Some(1), end_line: Some(1), ..whole("huge.log") };
        let e = open(&ws, &ranged, &CancellationToken::new()).err().unwrap();
        assert_eq!(e.code, ErrorCode::FileTooLarge, "{e}");
        // At the limit it is read and hashed whole.
        file.set_len(MAX_FILE_BYTES).unwrap();
        let out = open(&ws, &ranged, &CancellationToken::new()).unwrap();
        assert_eq!(out.output["size_bytes"], MAX_FILE_BYTES);
        assert_eq!(out.output["content"], "x\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file that grows past the limit while it is read stops the pass there.
    #[test]
    fn a_file_growing_past_the_limit_is_not_read_to_its_end() {
        let endless = std::io::repeat(b'a');
        let e = scan(endless, 1, u64::MAX, 16, "growing.txt", &CancellationToken::new()).err().unwrap();
        assert_eq!(e.code, ErrorCode::FileTooLarge, "{e}");
    }

    /// A cancelled call (a cancel, the time limit, the server stopping) stops reading.
    #[test]
    fn a_cancelled_call_stops_reading() {
        let (dir, ws) = scratch("cancel");
        std::fs::write(dir.join("notes.txt"), "line\n".repeat(100_000)).unwrap();
        let cancel = CancellationToken::new();
        assert!(open(&ws, &whole("notes.txt"), &cancel).is_ok());
        cancel.cancel();
        let e = open(&ws, &whole("notes.txt"), &cancel).err().unwrap();
        assert_eq!(e.code, ErrorCode::Cancelled, "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
