//! `grep`: content search (text, symbols, references, config keys) with ripgrep's crates.
//!
//! Regex (Rust `regex` syntax) or literal, case options, include/exclude globs, context
//! lines. Files are found with the `ignore` walker (honours `.gitignore`, never follows
//! symlinks) and opened through the workspace boundary; binary files (a NUL byte), files
//! over 20 MiB and — on a shared server — files with more than one hard link (see
//! [`mira_core::workspace::HardLinks`]) are skipped and counted, the last with a `note`. Caps: `max_per_file` matches per file, `limit`
//! matches in all, 100,000 files searched.

use std::io::Read;

use async_trait::async_trait;
use grep_matcher::Matcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{Searcher, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch};
use schemars::{JsonSchema, SchemaGenerator, json_schema};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::blocking;
use crate::input;
use mira_core::error_code::ErrorCode;
use mira_core::evidence::{EvidenceDraft, sha256_hex};
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use mira_core::workspace::{self, Workspace};

/// Files larger than this are skipped, in bytes.
pub const MAX_FILE_BYTES: u64 = 20 * 1024 * 1024;
/// Files searched at most per call.
pub const MAX_FILES: usize = 100_000;
/// Longest line text returned, in bytes (longer lines are cut with `…`).
pub const MAX_LINE_BYTES: usize = 1000;
/// Evidence items at most per call (one per file with matches).
pub const MAX_EVIDENCE_FILES: usize = 50;

/// Default `limit`: matches in all.
pub const DEFAULT_LIMIT: u64 = 200;
/// Largest `limit`.
pub const MAX_LIMIT: u64 = 2000;
/// Default `max_per_file`.
pub const DEFAULT_PER_FILE: u64 = 50;
/// Largest `max_per_file`.
pub const MAX_PER_FILE: u64 = 1000;
/// Largest `context`, lines before and after (default 0).
pub const MAX_CONTEXT: u64 = 10;

/// `glob`: one glob or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Globs {
    One(String),
    Many(Vec<String>),
}

impl JsonSchema for Globs {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Globs".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> schemars::Schema {
        json_schema!({"oneOf": [
            {"type": "string", "maxLength": 1024},
            {"type": "array", "items": {"type": "string", "maxLength": 1024}, "maxItems": 32}
        ]})
    }
}

/// The input of `grep` (also its canonical input, defaults filled and `glob` a list).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrepInput {
    /// Regular expression (Rust regex syntax), or literal text when literal is true
    #[schemars(length(min = 1, max = 4096))]
    pattern: String,
    /// File or folder to search, relative to the workspace root (default the root)
    #[schemars(length(max = 4096))]
    path: Option<String>,
    /// Treat pattern as plain text
    #[serde(default)]
    literal: bool,
    /// Ignore case
    #[serde(default)]
    case_insensitive: bool,
    /// Only files matching these globs; prefix ! to exclude
    glob: Option<Globs>,
    /// Lines of context before and after each match
    #[schemars(range(min = 0, max = MAX_CONTEXT))]
    context: Option<u64>,
    /// Most matches in all (default 200)
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
    /// Most matches per file (default 50)
    #[schemars(range(min = 1, max = MAX_PER_FILE))]
    max_per_file: Option<u64>,
}

impl GrepInput {
    fn context(&self) -> u64 {
        self.context.unwrap_or(0).min(MAX_CONTEXT)
    }

    fn limit(&self) -> u64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
    }

    fn max_per_file(&self) -> u64 {
        self.max_per_file.unwrap_or(DEFAULT_PER_FILE).min(MAX_PER_FILE)
    }

    fn globs(&self) -> Vec<String> {
        match &self.glob {
            Some(Globs::One(g)) => vec![g.clone()],
            Some(Globs::Many(gs)) => gs.clone(),
            None => Vec::new(),
        }
    }
}

/// The `grep` tool.
pub struct Grep {
    spec: ToolSpec,
}

impl Grep {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                id: "grep".into(),
                kind: ToolKind::Public,
                domain: "read".into(),
                title: "Search file contents".into(),
                description:
                    "Search the contents of workspace files for a regex or literal: text, symbols, references, \
                    config keys. Honours .gitignore, skips binary files, returns matching lines with line numbers and \
                    optional context."
                        .into(),
                input_schema: input::schema_of::<GrepInput>(),
                requires_approval: false,
                capability: Some("fs.read".into()),
                replacement: None,
                owner: None,
            },
        }
    }
}

impl Default for Grep {
    fn default() -> Self {
        Self::new()
    }
}

fn matcher_for(input: &GrepInput) -> Result<RegexMatcher, ToolError> {
    RegexMatcherBuilder::new()
        .case_insensitive(input.case_insensitive)
        .fixed_strings(input.literal)
        .size_limit(16 * 1024 * 1024)
        .build(&input.pattern)
        .map_err(|e| ToolError::new(ErrorCode::InvalidPattern, format!("pattern does not compile: {e}")))
}

#[async_trait]
impl Tool for Grep {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let ws = ctx.workspace()?;
        let input: GrepInput = input::parse(&input)?;
        matcher_for(&input)?;
        let path = workspace::normalize(input.path.as_deref().unwrap_or("."))?;
        ws.check_beneath(&path)?;
        let globs = input.globs();
        let mut overrides = ignore::overrides::OverrideBuilder::new(ws.root());
        for g in &globs {
            overrides.add(g).map_err(|e| ToolError::new(ErrorCode::InvalidGlob, format!("glob {g:?}: {e}")))?;
        }
        Ok(Prepared {
            input: json!({
                "pattern": input.pattern,
                "path": path,
                "literal": input.literal,
                "case_insensitive": input.case_insensitive,
                "glob": globs,
                "context": input.context(),
                "limit": input.limit(),
                "max_per_file": input.max_per_file(),
            }),
            preview: Value::Null,
        })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: GrepInput = input::frozen(input)?;
        let ws = ctx.workspace()?.clone();
        let cancel = ctx.cancel.clone();
        blocking(move || grep(&ws, &input, &cancel)).await
    }
}

#[derive(Default)]
struct Hit {
    line: u64,
    column: usize,
    text: String,
    before: Vec<Value>,
    after: Vec<Value>,
}

struct Collect<'m> {
    matcher: &'m RegexMatcher,
    hits: Vec<Hit>,
    pending_before: Vec<Value>,
    max: usize,
}

fn line_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim_end_matches(['\n', '\r']);
    mira_core::evidence::excerpt(text, MAX_LINE_BYTES)
}

impl Sink for Collect<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _s: &Searcher, m: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        let column = self.matcher.find(m.bytes()).ok().flatten().map_or(1, |found| found.start() + 1);
        self.hits.push(Hit {
            line: m.line_number().unwrap_or(0),
            column,
            text: line_text(m.bytes()),
            before: std::mem::take(&mut self.pending_before),
            after: Vec::new(),
        });
        Ok(self.hits.len() < self.max)
    }

    fn context(&mut self, _s: &Searcher, c: &SinkContext<'_>) -> Result<bool, Self::Error> {
        let line = json!({"line": c.line_number().unwrap_or(0), "text": line_text(c.bytes())});
        match c.kind() {
            SinkContextKind::Before => self.pending_before.push(line),
            SinkContextKind::After => {
                if let Some(last) = self.hits.last_mut() {
                    last.after.push(line);
                }
            }
            SinkContextKind::Other => {}
        }
        Ok(true)
    }
}

fn grep(ws: &Workspace, input: &GrepInput, cancel: &CancellationToken) -> Result<ToolOutput, ToolError> {
    let matcher = matcher_for(input)?;
    let rel = input.path.as_deref().unwrap_or(".").to_owned();
    let context = usize::try_from(input.context()).unwrap_or(0);
    let limit = usize::try_from(input.limit()).unwrap_or(200);
    let per_file = usize::try_from(input.max_per_file()).unwrap_or(50);
    let globs = input.globs();

    // Walked through the workspace's open root handle, never by the root's path.
    let real_root = ws.walk_root();
    let start_meta = ws.dir().metadata(&rel).map_err(|e| workspace::io_error(&rel, &e))?;
    let files: Box<dyn Iterator<Item = String>> = if start_meta.is_file() {
        Box::new(std::iter::once(rel.clone()))
    } else {
        let real_start = start_beneath(ws, &rel)?;
        let mut overrides = ignore::overrides::OverrideBuilder::new(&real_root);
        for g in &globs {
            overrides.add(g).map_err(|e| ToolError::new(ErrorCode::InvalidGlob, e.to_string()))?;
        }
        let overrides = overrides.build().map_err(|e| ToolError::new(ErrorCode::InvalidGlob, e.to_string()))?;
        let mut walker = ignore::WalkBuilder::new(&real_start);
        walker.follow_links(false).sort_by_file_name(|a, b| a.cmp(b)).require_git(false).overrides(overrides);
        let root = real_root.clone();
        Box::new(
            walker
                .build()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                .filter_map(move |e| e.path().strip_prefix(&root).ok().map(|p| p.to_string_lossy().into_owned())),
        )
    };

    let mut searcher = SearcherBuilder::new().line_number(true).before_context(context).after_context(context).build();
    let mut matches = Vec::new();
    let mut evidence = Vec::new();
    let (mut searched, mut with_matches, mut skipped_binary, mut skipped_large) = (0usize, 0usize, 0usize, 0usize);
    let mut skipped_hard_links = 0usize;
    let mut truncated = false;
    for path in files {
        if cancel.is_cancelled() {
            return Err(ToolError::new(ErrorCode::Cancelled, "the invocation was cancelled"));
        }
        if searched >= MAX_FILES || matches.len() >= limit {
            truncated = true;
            break;
        }
        let (file, meta) = match ws.open_regular(&path) {
            Ok(opened) => opened,
            Err(e) if workspace::is_hard_link_refusal(&e) => {
                skipped_hard_links += 1;
                continue;
            }
            Err(_) => continue,
        };
        if meta.len() > MAX_FILE_BYTES {
            skipped_large += 1;
            continue;
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        if file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).is_err() {
            continue;
        }
        searched += 1;
        if memchr_nul(&bytes) {
            skipped_binary += 1;
            continue;
        }
        let room = (limit - matches.len()).min(per_file);
        let mut sink = Collect { matcher: &matcher, hits: Vec::new(), pending_before: Vec::new(), max: room };
        if searcher.search_slice(&matcher, &bytes, &mut sink).is_err() || sink.hits.is_empty() {
            continue;
        }
        with_matches += 1;
        if sink.hits.len() >= room {
            truncated = true;
        }
        if evidence.len() < MAX_EVIDENCE_FILES {
            let lines: Vec<u64> = sink.hits.iter().map(|h| h.line).collect();
            let excerpt: String = sink.hits.iter().map(|h| format!("{}:{}: {}\n", path, h.line, h.text)).collect();
            evidence.push(EvidenceDraft {
                kind: "grep_match".into(),
                provenance: json!({"path": path, "lines": lines, "pattern": input.pattern, "file_sha256": sha256_hex(&bytes)}),
                content_sha256: sha256_hex(&bytes),
                excerpt: mira_core::evidence::excerpt(&excerpt, mira_core::evidence::EXCERPT_MAX_BYTES),
            });
        }
        for h in sink.hits {
            let mut m = json!({"path": path, "line": h.line, "column": h.column, "text": h.text});
            if context > 0 {
                m["before"] = Value::Array(h.before);
                m["after"] = Value::Array(h.after);
            }
            matches.push(m);
        }
    }
    Ok(ToolOutput {
        output: json!({
            "matches": matches,
            "files_searched": searched,
            "files_with_matches": with_matches,
            "skipped_binary": skipped_binary,
            "skipped_large": skipped_large,
            "skipped_hard_links": skipped_hard_links,
            "note": (skipped_hard_links > 0).then(|| format!(
                "{skipped_hard_links} file(s) with more than one hard link were not searched: on a shared server a hard \
                 link may be a file outside the workspace (--allow-hard-link-reads allows them)"
            )),
            "truncated": truncated,
        }),
        evidence,
    })
}

/// The folder `rel` (normalised, not `.`) as a path through the workspace's open root
/// handle, after checking with cap-std that it resolves beneath the root (a symlinked
/// folder leading out is `outside_workspace`) and is the folder that path names.
pub(crate) fn start_beneath(ws: &Workspace, rel: &str) -> Result<std::path::PathBuf, ToolError> {
    let root = ws.walk_root();
    if rel == "." {
        return Ok(root);
    }
    let beneath = ws.dir().open_dir(rel).map_err(|e| workspace::io_error(rel, &e))?;
    let by_path = root.join(rel);
    let (a, b) = (beneath.dir_metadata(), std::fs::metadata(&by_path));
    match (a, b) {
        (Ok(a), Ok(b))
            if cap_std::fs::MetadataExt::dev(&a) == std::os::unix::fs::MetadataExt::dev(&b)
                && cap_std::fs::MetadataExt::ino(&a) == std::os::unix::fs::MetadataExt::ino(&b) =>
        {
            Ok(by_path)
        }
        (Err(e), _) | (_, Err(e)) => Err(workspace::io_error(rel, &e)),
        _ => Err(workspace::outside(rel)),
    }
}

fn memchr_nul(bytes: &[u8]) -> bool {
    bytes.contains(&0)
}
