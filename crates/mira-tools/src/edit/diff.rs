//! Unified diffs for approval previews and edit evidence, computed with the `similar`
//! crate (Myers' O(ND) algorithm, E. Myers 1986, with a time limit after which it
//! approximates), in the unified format of POSIX `diff -u` with 3 lines of context.

use std::time::Duration;

use serde::Serialize;
use similar::{Algorithm, ChangeTag, TextDiff};

/// Largest text (each side) that is diffed, in bytes; larger files get a summary only.
pub const MAX_DIFF_INPUT_BYTES: usize = 8 * 1024 * 1024;
/// Largest diff text kept in a preview, in bytes; longer diffs are cut at a line boundary
/// with a marker line.
pub const MAX_PREVIEW_DIFF_BYTES: usize = 64 * 1024;
/// Time after which the diff algorithm stops refining and approximates.
pub const DIFF_TIMEOUT: Duration = Duration::from_secs(2);

/// Counts of a diff.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiffSummary {
    /// Lines only in the new text.
    pub lines_added: u64,
    /// Lines only in the old text.
    pub lines_removed: u64,
    /// Hunks of the unified diff.
    pub hunks: u64,
}

/// A unified diff, possibly cut.
#[derive(Debug, Clone, Default)]
pub struct Diff {
    /// The unified diff text (empty when nothing changed).
    pub unified: String,
    /// True when `unified` was cut at [`MAX_PREVIEW_DIFF_BYTES`].
    pub truncated: bool,
    /// Counts.
    pub summary: DiffSummary,
}

/// The diff from `old` (None = the file does not exist yet) to `new` for workspace path
/// `rel`. None when either side is larger than [`MAX_DIFF_INPUT_BYTES`].
pub fn unified(rel: &str, old: Option<&str>, new: &str) -> Option<Diff> {
    let old_text = old.unwrap_or("");
    if old_text.len() > MAX_DIFF_INPUT_BYTES || new.len() > MAX_DIFF_INPUT_BYTES {
        return None;
    }
    let diff = TextDiff::configure().algorithm(Algorithm::Myers).timeout(DIFF_TIMEOUT).diff_lines(old_text, new);
    let mut summary = DiffSummary::default();
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => summary.lines_added += 1,
            ChangeTag::Delete => summary.lines_removed += 1,
            ChangeTag::Equal => {}
        }
    }
    let from = if old.is_some() { format!("a/{rel}") } else { "/dev/null".to_owned() };
    let mut udiff = diff.unified_diff();
    udiff.context_radius(3).header(&from, &format!("b/{rel}"));
    summary.hunks = udiff.iter_hunks().count() as u64;
    let text = udiff.to_string();
    let (unified, truncated) = cut(text);
    Some(Diff { unified, truncated, summary })
}

fn cut(text: String) -> (String, bool) {
    if text.len() <= MAX_PREVIEW_DIFF_BYTES {
        return (text, false);
    }
    let mut end = MAX_PREVIEW_DIFF_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let end = text[..end].rfind('\n').map_or(end, |i| i + 1);
    let total = text.len();
    let mut head = text;
    head.truncate(end);
    head.push_str(&format!("[diff of {total} bytes truncated to its first {end} bytes]\n"));
    (head, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_diff_counts_lines_and_names_the_file() {
        let d = unified("src/a.txt", Some("one\ntwo\nthree\n"), "one\n2\nthree\nfour\n").unwrap_or_default();
        assert!(d.unified.starts_with("--- a/src/a.txt\n+++ b/src/a.txt\n"), "{}", d.unified);
        assert!(d.unified.contains("-two\n+2\n"), "{}", d.unified);
        assert_eq!((d.summary.lines_added, d.summary.lines_removed, d.summary.hunks), (2, 1, 1));
        let created = unified("n.txt", None, "x\n").unwrap_or_default();
        assert!(created.unified.starts_with("--- /dev/null\n+++ b/n.txt\n"), "{}", created.unified);
    }

    #[test]
    fn long_diffs_are_cut_on_a_line_with_a_marker() {
        let new: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let d = unified("big", Some(""), &new).unwrap_or_default();
        assert!(d.truncated);
        assert!(d.unified.len() <= MAX_PREVIEW_DIFF_BYTES + 100);
        assert!(d.unified.ends_with("bytes]\n"));
        assert_eq!(d.summary.lines_added, 20_000);
    }
}
