//! `read_discover`: directories, paths and file-name candidates.
//!
//! Walks the workspace (or a folder of it) with ripgrep's `ignore` walker, honouring
//! `.gitignore`, `.ignore` and hidden-file rules, never following symlinks. Without a
//! `query` entries come in path order; with one, names are matched fuzzily (the `nucleo`
//! matcher used by the Helix editor) and come best first. On a shared server files with
//! more than one hard link are not listed (counted in `skipped_hard_links`, with a `note`;
//! see [`mira_core::workspace::HardLinks`]). The server's own folders (its data dir, where
//! it lies inside the workspace) are neither listed nor walked into, like every other tool
//! refuses to open them ([`workspace::is_reserved`]); starting in one is `outside_workspace`.
//! The walker enters folders by path, so every entry it yields must be the entry at that
//! path beneath the root ([`Workspace::entry_beneath`]: same device and inode through the
//! root's capability) before it is listed or counted: a folder swapped for a symlink during
//! the walk lists nothing beyond it, and kinds and sizes come from that check.
//! At most 200,000 entries are scanned; results are paginated with an opaque cursor.

use async_trait::async_trait;
use nucleo_matcher::pattern::{AtomKind, CaseMatching, Normalization, Pattern};
use nucleo_matcher::{Config, Matcher, Utf32Str};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::blocking;
use crate::input;
use mira_core::error_code::ErrorCode;
use mira_core::evidence::EvidenceDraft;
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use mira_core::workspace::{self, Workspace};

/// Entries scanned at most per call.
pub const MAX_SCANNED: usize = 200_000;
/// Default and largest page size.
pub const DEFAULT_LIMIT: u64 = 100;
/// Largest page size.
pub const MAX_LIMIT: u64 = 1000;

/// Nesting levels `max_depth` may name at most.
pub const MAX_DEPTH: u64 = 64;

/// Which entries to list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EntryKind {
    #[default]
    Any,
    File,
    Dir,
}

/// The input of `read_discover` (also its canonical input, defaults filled).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DiscoverInput {
    /// File or folder name fragment, matched fuzzily
    #[schemars(length(max = 512))]
    query: Option<String>,
    /// Folder to look in, relative to the workspace root (default the root)
    #[schemars(length(max = 4096))]
    path: Option<String>,
    /// Only files or only folders
    kind: Option<EntryKind>,
    /// Deepest level to descend
    #[schemars(range(min = 1, max = MAX_DEPTH))]
    max_depth: Option<u64>,
    /// Entries per page (default 100)
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
    /// next_cursor of the previous page
    #[schemars(length(max = 64))]
    cursor: Option<String>,
}

impl DiscoverInput {
    fn limit(&self) -> u64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
    }
}

/// The `read_discover` tool.
pub struct ReadDiscover {
    spec: ToolSpec,
}

impl ReadDiscover {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                id: "read_discover".into(),
                kind: ToolKind::Public,
                domain: "read".into(),
                title: "Discover files and folders".into(),
                description: "List directories, paths and file-name candidates in the workspace. Honours .gitignore. \
                    Give `query` to fuzzy-match file and folder names (best first), `path` to look inside a folder."
                    .into(),
                input_schema: input::schema_of::<DiscoverInput>(),
                requires_approval: false,
                capability: Some("fs.read".into()),
                replacement: None,
                owner: None,
            },
        }
    }
}

impl Default for ReadDiscover {
    fn default() -> Self {
        Self::new()
    }
}

fn parse_cursor(cursor: Option<&str>) -> Result<usize, ToolError> {
    match cursor {
        None => Ok(0),
        Some(c) => c.strip_prefix("o").and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| {
            ToolError::new(ErrorCode::InvalidCursor, format!("cursor {c:?} was not issued by read_discover"))
        }),
    }
}

#[async_trait]
impl Tool for ReadDiscover {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let ws = ctx.workspace()?;
        let input: DiscoverInput = input::parse(&input)?;
        let path = workspace::normalize(input.path.as_deref().unwrap_or("."))?;
        ws.check_beneath(&path)?;
        parse_cursor(input.cursor.as_deref())?;
        let mut canonical = json!({
            "path": path,
            "kind": input.kind.unwrap_or_default(),
            "limit": input.limit(),
        });
        if let Some(query) = &input.query {
            canonical["query"] = json!(query);
        }
        if let Some(cursor) = &input.cursor {
            canonical["cursor"] = json!(cursor);
        }
        if let Some(depth) = input.max_depth {
            canonical["max_depth"] = json!(depth);
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: DiscoverInput = input::frozen(input)?;
        let ws = ctx.workspace()?.clone();
        let cancel = ctx.cancel.clone();
        blocking(move || discover(&ws, &input, &cancel)).await
    }
}

struct Found {
    path: String,
    kind: &'static str,
    size: Option<u64>,
    score: Option<u32>,
}

fn discover(
    ws: &Workspace,
    input: &DiscoverInput,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let rel = input.path.as_deref().unwrap_or(".").to_owned();
    let kind_filter = input.kind.unwrap_or_default();
    let limit = usize::try_from(input.limit()).unwrap_or(100);
    let offset = parse_cursor(input.cursor.as_deref())?;
    let query = input.query.as_deref().filter(|q| !q.trim().is_empty());

    let meta = ws.dir().metadata(&rel).map_err(|e| workspace::io_error(&rel, &e))?;
    if !meta.is_dir() {
        return Err(ToolError::new(ErrorCode::NotADirectory, format!("{rel} is not a directory")));
    }
    // Walked through the workspace's open root handle; the start folder must really be
    // beneath the root (no symlinked folder leading out).
    let real_root = ws.walk_root();
    let real_start = super::grep::start_beneath(ws, &rel)?;
    // The server's own folders are neither walked nor listed, contents and all: compared by
    // the kernel's path of the start folder as opened (a symlink named as `path` resolved)
    // joined with each entry's path beneath it (the walk follows no symlink below).
    let start = std::fs::File::open(&real_start).map_err(|e| workspace::io_error(&rel, &e))?;
    if workspace::is_reserved(&start, None) {
        return Err(workspace::reserved_refused(&rel));
    }
    let hide_hard_links = ws.hard_links() == workspace::HardLinks::Refuse;
    let mut skipped_hard_links = 0usize;

    let mut walker = ignore::WalkBuilder::new(&real_start);
    walker.follow_links(false).sort_by_file_name(|a, b| a.cmp(b)).require_git(false);
    let walked_from = real_start.clone();
    walker.filter_entry(move |entry| match entry.path().strip_prefix(&walked_from) {
        Ok(beneath) if !beneath.as_os_str().is_empty() => !workspace::is_reserved_beneath(&start, Some(beneath)),
        _ => true,
    });
    if let Some(depth) = input.max_depth {
        walker.max_depth(usize::try_from(depth).ok());
    }
    let mut matcher = Matcher::new(Config::DEFAULT.match_paths());
    let pattern = query.map(|q| Pattern::new(q, CaseMatching::Smart, Normalization::Smart, AtomKind::Fuzzy));
    let mut found = Vec::new();
    let mut scanned = 0usize;
    let mut walked_entries = 0usize;
    let mut scan_capped = false;
    let mut buf = Vec::new();
    for entry in walker.build() {
        if cancel.is_cancelled() {
            return Err(ToolError::new(ErrorCode::Cancelled, "the invocation was cancelled"));
        }
        let Ok(entry) = entry else { continue };
        if entry.depth() == 0 {
            continue;
        }
        walked_entries += 1;
        if walked_entries > MAX_SCANNED {
            scan_capped = true;
            break;
        }
        let Ok(path) = entry.path().strip_prefix(&real_root) else { continue };
        let path = path.to_string_lossy().into_owned();
        #[cfg(test)]
        tests::ON_ENTRY.with(|hook| {
            if let Some(hook) = hook.borrow_mut().as_mut() {
                hook(&path);
            }
        });
        // The walker opens each subfolder by path: one swapped for a symlink after its parent
        // was listed would lead it out. Every entry must be the very entry at its path
        // beneath the root (same device and inode, looked up through the root's capability);
        // kinds and sizes come from that lookup, never from what the walk reached.
        let Ok(walked) = entry.metadata() else { continue };
        let Some(meta) = ws.entry_beneath(&path, &walked) else { continue };
        scanned += 1;
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        if (kind_filter == EntryKind::File && kind != "file") || (kind_filter == EntryKind::Dir && kind != "dir") {
            continue;
        }
        let score = match &pattern {
            Some(p) => {
                let Some(score) = p.score(Utf32Str::new(&path, &mut buf), &mut matcher) else { continue };
                Some(score)
            }
            None => None,
        };
        let meta = (kind == "file").then_some(meta);
        if hide_hard_links && meta.as_ref().is_some_and(|m| cap_std::fs::MetadataExt::nlink(m) > 1) {
            skipped_hard_links += 1;
            continue;
        }
        let size = meta.map(|m| m.len());
        found.push(Found { path, kind, size, score });
    }
    if pattern.is_some() {
        found.sort_by(|a, b| {
            b.score.cmp(&a.score).then_with(|| a.path.len().cmp(&b.path.len())).then_with(|| a.path.cmp(&b.path))
        });
    }
    let total = found.len();
    let page: Vec<&Found> = found.iter().skip(offset).take(limit).collect();
    let next = offset + page.len();
    let next_cursor = (next < total).then(|| format!("o{next}"));
    let entries: Vec<Value> = page
        .iter()
        .map(|f| {
            let mut e = json!({"path": f.path, "kind": f.kind});
            if let Some(size) = f.size {
                e["size"] = json!(size);
            }
            if let Some(score) = f.score {
                e["score"] = json!(score);
            }
            e
        })
        .collect();
    let listing: String = page.iter().map(|f| format!("{}\t{}\n", f.kind, f.path)).collect();
    let evidence = EvidenceDraft::of_text(
        "directory_listing",
        json!({"path": rel, "query": query, "offset": offset, "count": page.len(), "total": total, "scan_capped": scan_capped}),
        &listing,
    );
    Ok(ToolOutput {
        output: json!({
            "path": rel,
            "query": query,
            "entries": entries,
            "total": total,
            "scanned": scanned.min(MAX_SCANNED),
            "scan_capped": scan_capped,
            "skipped_hard_links": skipped_hard_links,
            "note": (skipped_hard_links > 0).then(|| format!(
                "{skipped_hard_links} file(s) with more than one hard link are not listed: on a shared server a hard \
                 link may be a file outside the workspace (--allow-hard-link-reads allows them)"
            )),
            "next_cursor": next_cursor,
        }),
        evidence: vec![evidence],
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    use super::*;

    type Hook = Box<dyn FnMut(&str)>;

    thread_local! {
        /// Called with each entry's path as the walk yields it, before it is judged: the tests
        /// swap folders there, between the walker's listing of a folder and its entering one.
        pub(super) static ON_ENTRY: RefCell<Option<Hook>> = RefCell::new(None);
    }

    /// A fresh canonical folder (removed by the caller).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mira-discover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    fn run(ws: &Workspace, query: Option<&str>) -> Value {
        let input = DiscoverInput {
            query: query.map(str::to_owned),
            path: None,
            kind: None,
            max_depth: None,
            limit: Some(MAX_LIMIT),
            cursor: None,
        };
        discover(ws, &input, &tokio_util::sync::CancellationToken::new()).unwrap().output
    }

    fn paths(out: &Value) -> Vec<String> {
        out["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap().to_owned()).collect()
    }

    /// The attack of a user who swaps a folder of her workspace for a symlink to another
    /// user's folder while she lists it, made deterministic: `z/` is listed as a folder with
    /// the root, then, while the walker is still in `a/`, it becomes a symlink to the other
    /// folder, which the walker enters by path. Nothing of the other folder — names, sizes —
    /// is listed; `z` itself (a folder of hers when it was listed) may be.
    #[test]
    fn a_folder_swapped_for_a_symlink_during_the_walk_lists_nothing_beyond_it() {
        let base = scratch("swap");
        let (root, other) = (base.join("alice"), base.join("bob"));
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(root.join("z")).unwrap();
        std::fs::write(root.join("a/notes.txt"), "mine").unwrap();
        std::fs::write(root.join("z/own.txt"), "mine").unwrap();
        std::fs::create_dir_all(other.join("private")).unwrap();
        std::fs::write(other.join("private/bob_salary_review_2026.txt"), "x".repeat(4242)).unwrap();
        let ws = Workspace::open(&root).unwrap();

        // Unswapped: her own files.
        assert!(paths(&run(&ws, None)).contains(&"z/own.txt".to_owned()));

        let swap = |root: &Path, other: &Path| {
            std::fs::rename(root.join("z"), root.join("z.r")).unwrap();
            std::os::unix::fs::symlink(other, root.join("z")).unwrap();
        };
        for query in [None, Some("salary")] {
            let (r, o) = (root.clone(), other.clone());
            let mut swapped = false;
            ON_ENTRY.with(|h| {
                *h.borrow_mut() = Some(Box::new(move |path: &str| {
                    if path == "a/notes.txt" && !swapped {
                        swapped = true;
                        swap(&r, &o);
                    }
                }));
            });
            let out = run(&ws, query);
            ON_ENTRY.with(|h| *h.borrow_mut() = None);
            let listed = paths(&out);
            assert!(listed.iter().all(|p| !p.contains("private") && !p.contains("salary")), "{out}");
            assert!(!out.to_string().contains("4242"), "no size of the other folder: {out}");
            // Swap back for the next round.
            if std::fs::symlink_metadata(root.join("z")).unwrap().is_symlink() {
                std::fs::remove_file(root.join("z")).unwrap();
                std::fs::rename(root.join("z.r"), root.join("z")).unwrap();
            }
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
