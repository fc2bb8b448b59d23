//! Query-time verification: every location a query returns is re-read from the workspace
//! (through [`Workspace::open_regular`], so the boundary holds) before it is given as verified.
//!
//! A candidate is `verified` when the current text still has the symbol at the indexed span,
//! or when it is found again by name in the same file (`relocated`: for a definition, by
//! re-parsing the current text and finding the same name, kind and container nearest the old
//! line; for a reference, the nearest whole-word occurrence). Otherwise it is `stale` (the file
//! is gone, unreadable, or no longer contains the symbol) and is reported apart, never as
//! verified. Each verified candidate carries the current file's SHA-256 and an excerpt.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::graph::Graph;
use crate::lang::{Def, FileParser, Lang, NONE, Parsed};
use mira_core::evidence::{EvidenceDraft, sha256_hex};
use mira_core::workspace::Workspace;

/// Largest file re-read for verification, bytes.
pub const MAX_VERIFY_BYTES: u64 = 16 * 1024 * 1024;
/// Most lines of a definition put in its excerpt.
pub const MAX_EXCERPT_LINES: u32 = 12;

/// A file as it is now.
pub struct Current {
    text: String,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    line_starts: Vec<usize>,
}

impl Current {
    fn line(&self, line: u32) -> Option<&str> {
        let i = (line as usize).checked_sub(1)?;
        let start = *self.line_starts.get(i)?;
        let end = self.line_starts.get(i + 1).copied().unwrap_or(self.text.len());
        Some(self.text[start..end].trim_end_matches(['\n', '\r']))
    }

    fn lines(&self, from: u32, to: u32) -> String {
        (from..=to).filter_map(|l| self.line(l)).collect::<Vec<_>>().join("\n")
    }

    fn line_count(&self) -> u32 {
        u32::try_from(self.line_starts.len()).unwrap_or(u32::MAX)
    }
}

/// The outcome for one candidate.
#[derive(Debug, Clone)]
pub enum Check {
    /// Found in the current text.
    Verified {
        /// First line of the span now.
        start_line: u32,
        /// Last line of the span now.
        end_line: u32,
        /// Line of the name now.
        line: u32,
        /// Column of the name now (1-based bytes).
        col: u32,
        /// Found by name elsewhere in the file, not at the indexed span.
        relocated: bool,
        /// The file's bytes differ from the indexed version.
        file_changed: bool,
        /// Current SHA-256 of the file.
        sha256: String,
        /// The span's text (bounded).
        excerpt: String,
    },
    /// Not found; why.
    Stale {
        /// `file_missing`, `unreadable`, `symbol_not_found`…
        reason: String,
    },
}

impl Check {
    /// Whether verified.
    pub fn is_verified(&self) -> bool {
        matches!(self, Check::Verified { .. })
    }

    /// The JSON `verification` object of a result.
    pub fn to_json(&self) -> Value {
        match self {
            Check::Verified { relocated, file_changed, sha256, .. } => json!({
                "status": "verified", "relocated": relocated, "file_changed": file_changed, "file_sha256": sha256
            }),
            Check::Stale { reason } => json!({"status": "stale", "reason": reason}),
        }
    }

    /// Current span `(start_line, end_line, line, col)` if verified.
    pub fn span(&self) -> Option<(u32, u32, u32, u32)> {
        match self {
            Check::Verified { start_line, end_line, line, col, .. } => Some((*start_line, *end_line, *line, *col)),
            Check::Stale { .. } => None,
        }
    }

    /// Evidence for a verified candidate (None when stale).
    pub fn evidence(&self, path: &str, symbol: &str, relation: &str, query: &str) -> Option<EvidenceDraft> {
        match self {
            Check::Verified { start_line, end_line, line, col, relocated, sha256, excerpt, .. } => {
                Some(EvidenceDraft {
                    kind: "code_location".into(),
                    provenance: json!({
                        "path": path, "start_line": start_line, "end_line": end_line, "line": line, "column": col,
                        "symbol": symbol, "relation": relation, "query": query, "file_sha256": sha256,
                        "relocated": relocated, "verified_at_query_time": true,
                    }),
                    content_sha256: sha256.clone(),
                    excerpt: mira_core::evidence::excerpt(excerpt, mira_core::evidence::EXCERPT_MAX_BYTES),
                })
            }
            Check::Stale { .. } => None,
        }
    }
}

/// Why a file could not be re-read; its text is the stale reason reported to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The workspace refused the open; the workspace error's code (`not_found`,
    /// `outside_workspace`…).
    #[error("{0}")]
    Refused(mira_core::error_code::ErrorCode),
    /// Larger than [`MAX_VERIFY_BYTES`].
    #[error("file_too_large")]
    TooLarge,
    /// Reading failed.
    #[error("unreadable")]
    Unreadable,
    /// Not UTF-8 text.
    #[error("not_utf8")]
    NotUtf8,
}

/// Re-reads files for one query, each at most once.
pub struct Reader<'a> {
    ws: &'a Workspace,
    files: HashMap<String, Result<Current, ReadError>>,
    parsed: HashMap<String, Parsed>,
    parser: FileParser,
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// Byte columns (0-based) of whole-word occurrences of `name` in `line`.
fn word_occurrences(line: &str, name: &str) -> Vec<usize> {
    let bytes = line.as_bytes();
    line.match_indices(name)
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = i == 0 || !is_word(bytes[i - 1]);
            let after = bytes.get(i + name.len()).is_none_or(|&b| !is_word(b));
            before && after
        })
        .collect()
}

impl<'a> Reader<'a> {
    /// A reader over `ws`.
    pub fn new(ws: &'a Workspace) -> Self {
        Self { ws, files: HashMap::new(), parsed: HashMap::new(), parser: FileParser::new() }
    }

    fn current(&mut self, path: &str) -> Result<&Current, ReadError> {
        if !self.files.contains_key(path) {
            let loaded = read_current(self.ws, path);
            self.files.insert(path.to_owned(), loaded);
        }
        match self.files.get(path) {
            Some(Ok(c)) => Ok(c),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ReadError::Unreadable),
        }
    }

    /// The current SHA-256 of `path`, if readable.
    pub fn sha256(&mut self, path: &str) -> Option<String> {
        self.current(path).ok().map(|c| c.sha256.clone())
    }

    /// Checks a name occurrence (a reference, a call site, an import) at `line`/`col`.
    pub fn check_name(&mut self, path: &str, indexed_sha: &str, name: &str, line: u32, col: u32) -> Check {
        let cur = match self.current(path) {
            Ok(c) => c,
            Err(reason) => return Check::Stale { reason: reason.to_string() },
        };
        let changed = cur.sha256 != indexed_sha;
        let at = |l: u32| cur.line(l).map(|t| word_occurrences(t, name)).unwrap_or_default();
        let verified = |l: u32, c: u32, relocated: bool| Check::Verified {
            start_line: l,
            end_line: l,
            line: l,
            col: c,
            relocated,
            file_changed: changed,
            sha256: cur.sha256.clone(),
            excerpt: mira_core::evidence::excerpt(cur.line(l).unwrap_or("").trim(), 400),
        };
        let here = at(line);
        if here.iter().any(|&c| c as u32 + 1 == col) {
            return verified(line, col, false);
        }
        if let Some(&c) = here.first() {
            return verified(line, c as u32 + 1, true);
        }
        // Nearest line with the name, searching outwards.
        let total = cur.line_count();
        for d in 1..=total {
            for l in [line.saturating_sub(d), line.saturating_add(d)] {
                if l >= 1
                    && l <= total
                    && let Some(&c) = at(l).first()
                {
                    return verified(l, c as u32 + 1, true);
                }
            }
            if d > line && line + d > total {
                break;
            }
        }
        Check::Stale { reason: "symbol_not_found".into() }
    }

    /// Checks a definition: unchanged file and name at its place → the indexed span;
    /// otherwise the current text is parsed and the same name, kind and container nearest
    /// the old line is taken.
    pub fn check_def(&mut self, graph: &Graph, path: &str, lang: Lang, indexed_sha: &str, def: &Def) -> Check {
        let name = graph.name(def.name).to_owned();
        let cur = match self.current(path) {
            Ok(c) => c,
            Err(reason) => return Check::Stale { reason: reason.to_string() },
        };
        let unchanged = cur.sha256 == indexed_sha;
        let name_here =
            cur.line(def.line).is_some_and(|t| word_occurrences(t, &name).contains(&(def.col as usize - 1)));
        if unchanged && name_here {
            let end = def.end_line.min(def.start_line + MAX_EXCERPT_LINES - 1);
            return Check::Verified {
                start_line: def.start_line,
                end_line: def.end_line,
                line: def.line,
                col: def.col,
                relocated: false,
                file_changed: false,
                sha256: cur.sha256.clone(),
                excerpt: cur.lines(def.start_line, end),
            };
        }
        let sha = cur.sha256.clone();
        let text = cur.text.clone();
        if !self.parsed.contains_key(path) {
            let bytes = text.into_bytes();
            let p = self.parser.parse(lang, &bytes);
            self.parsed.insert(path.to_owned(), p);
        }
        let Some(p) = self.parsed.get(path) else { return Check::Stale { reason: "unreadable".into() } };
        let container = graph.name(def.container);
        let best = p
            .defs
            .iter()
            .filter(|d| {
                p.names.get(d.name as usize).is_some_and(|n| *n == name)
                    && d.kind == def.kind
                    && (d.container == NONE && def.container == NONE
                        || p.names.get(d.container as usize).is_some_and(|c| c == container))
            })
            .min_by_key(|d| d.line.abs_diff(def.line));
        let Some(d) = best.copied() else { return Check::Stale { reason: "symbol_not_found".into() } };
        let Ok(cur) = self.current(path) else { return Check::Stale { reason: "unreadable".into() } };
        let end = d.end_line.min(d.start_line + MAX_EXCERPT_LINES - 1);
        Check::Verified {
            start_line: d.start_line,
            end_line: d.end_line,
            line: d.line,
            col: d.col,
            relocated: d.line != def.line || d.col != def.col,
            file_changed: true,
            sha256: sha,
            excerpt: cur.lines(d.start_line, end),
        }
    }

    /// Checks that `text` (an import's module path) is still on `line`, or nearby.
    pub fn check_text(&mut self, path: &str, indexed_sha: &str, text: &str, line: u32) -> Check {
        let cur = match self.current(path) {
            Ok(c) => c,
            Err(reason) => return Check::Stale { reason: reason.to_string() },
        };
        let changed = cur.sha256 != indexed_sha;
        let total = cur.line_count();
        let mut candidates = vec![line];
        for d in 1..=total.min(2000) {
            candidates.push(line.saturating_sub(d));
            candidates.push(line.saturating_add(d));
        }
        for l in candidates {
            if l == 0 || l > total {
                continue;
            }
            if let Some(t) = cur.line(l)
                && let Some(c) = t.find(text)
            {
                return Check::Verified {
                    start_line: l,
                    end_line: l,
                    line: l,
                    col: c as u32 + 1,
                    relocated: l != line,
                    file_changed: changed,
                    sha256: cur.sha256.clone(),
                    excerpt: mira_core::evidence::excerpt(t.trim(), 400),
                };
            }
        }
        Check::Stale { reason: "import_not_found".into() }
    }
}

fn read_current(ws: &Workspace, path: &str) -> Result<Current, ReadError> {
    use std::io::Read;
    let (file, meta) = ws.open_regular(path).map_err(|e| ReadError::Refused(e.code))?;
    if meta.len() > MAX_VERIFY_BYTES {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_VERIFY_BYTES).read_to_end(&mut bytes).map_err(|_| ReadError::Unreadable)?;
    let sha256 = sha256_hex(&bytes);
    let text = String::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)?;
    let mut line_starts = vec![0];
    line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1).filter(|&i| i < text.len()));
    Ok(Current { text, sha256, line_starts })
}
