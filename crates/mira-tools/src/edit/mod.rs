//! Edit: `write_file` (create or overwrite), `replace_block` (a local replacement),
//! `delete_path` and `move_path`. Every call needs an exact-invocation approval
//! (`requires_approval`, domain `edit`) and stays inside the run's workspace.
//!
//! Each tool splits its work in two:
//! - `prepare` (freeze time) canonicalises the input — normalised workspace paths plus the
//!   resolved absolute targets, every default filled in — and inspects the target exactly as
//!   execution will, so a call that cannot succeed (an escape, a stale `expected_sha256`, a
//!   block that is not there) is refused before anyone is asked to approve it, and the
//!   approval shows what will change (a unified diff for writes and replacements, the entries
//!   for deletes and moves).
//! - `execute` repeats every check on the file system as it is then (a symlink swapped in
//!   after the freeze, a file changed since) and only then changes anything, atomically
//!   where the OS allows (see [`fs`]).
//!
//! What the preview showed is also what execution requires: `prepare` freezes the target's
//! state as it inspected it — its SHA-256, its absence, or a directory's manifest fingerprint
//! ([`TargetState`]) — into the canonical input as `precondition`, and shows the very same
//! value in the approval preview. At execution a target in any other state is `stale_target`
//! (409) and nothing is written, so an edit made by hand between the freeze and the grant is
//! never overwritten. A replay of the same call after the edit ran carries the frozen
//! precondition over ([`mira_core::tool::Tool::replay_input`]), so it stays an idempotent 200.
//! Each path is also checked for invisible and look-alike characters
//! ([`mira_core::workspace::lookalike`]), flagged in the preview as `path_flags`.
//!
//! A successful edit yields evidence about bytes — paths, SHA-256 before and after, bytes
//! written, a diff summary — never a claim that the content is right.

pub mod delete_path;
pub mod diff;
pub mod fs;
pub mod move_path;
pub mod replace_block;
pub mod write_file;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use mira_core::error_code::ErrorCode;
use mira_core::evidence::{EXCERPT_MAX_BYTES, EvidenceDraft, excerpt};
use mira_core::tool::{ToolError, ToolKind, ToolSpec};
use mira_core::workspace::{self, Workspace};

/// Longest workspace path an Edit tool takes, in bytes.
pub const MAX_PATH_BYTES: u32 = 4096;

/// The spec shared by the four tools: public, domain `edit`, always approved, `fs.write`.
fn spec(id: &str, title: &str, description: &str, input_schema: Value) -> ToolSpec {
    ToolSpec {
        id: id.to_owned(),
        kind: ToolKind::Public,
        domain: "edit".to_owned(),
        title: title.to_owned(),
        description: description.to_owned(),
        input_schema,
        requires_approval: true,
        capability: Some("fs.write".to_owned()),
        replacement: None,
        owner: None,
    }
}

/// Normalises the path `given` and resolves it against the workspace root:
/// `(workspace-relative path, absolute path)`. The root itself is refused
/// (`workspace_root`), escapes are `outside_workspace`.
fn target(ws: &Workspace, given: &str) -> Result<(String, String), ToolError> {
    let rel = workspace::normalize(given)?;
    if rel == "." {
        return Err(fs::root_refused(given));
    }
    let abs = ws.root().join(&rel).to_string_lossy().into_owned();
    Ok((rel, abs))
}

/// At execution: the absolute target `frozen` in the input must still be where this
/// workspace puts the relative path `rel`; otherwise the approval covered another file.
fn check_resolved(ws: &Workspace, rel: &str, frozen: &str) -> Result<String, ToolError> {
    let now = ws.root().join(rel).to_string_lossy().into_owned();
    if rel.is_empty() || rel == "." || frozen != now {
        return Err(ToolError::new(
            ErrorCode::WorkspaceMoved,
            format!("the approved target {frozen} is no longer {rel} in this workspace ({now}); nothing was changed"),
        )
        .with_details(json!({"path": rel, "approved": frozen, "now": now})));
    }
    Ok(rel.to_owned())
}

/// The `expected_sha256` precondition: 409 `stale_target` when the file's current hash
/// (None = missing) differs.
fn check_expected(rel: &str, expected: Option<&str>, current: Option<&str>) -> Result<(), ToolError> {
    match expected {
        Some(want) if Some(want) != current => Err(ToolError::new(
            ErrorCode::StaleTarget,
            match current {
                Some(_) => format!(
                    "{rel} changed since it was read (SHA-256 differs from expected_sha256); nothing was written"
                ),
                None => format!("{rel} does not exist, but expected_sha256 names a version of it; nothing was written"),
            },
        )
        .with_details(json!({"path": rel, "expected_sha256": want, "current_sha256": current}))),
        _ => Ok(()),
    }
}

/// The state of an Edit tool's target as its preview showed it, frozen into the canonical
/// input (`precondition`) and required again at execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TargetState {
    /// Nothing by that name.
    Absent,
    /// A regular file with this content.
    File {
        /// Lowercase hex SHA-256 of the whole file.
        sha256: String,
    },
    /// A directory with this shape ([`fs::TreeSummary::manifest_sha256`]: every entry's
    /// kind, path and size).
    Directory {
        /// The tree's manifest fingerprint.
        manifest_sha256: String,
    },
}

impl TargetState {
    /// The JSON form frozen in the input and shown in the preview.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Checks the target's `current` state against the frozen precondition `frozen` (the
/// `precondition` value of the canonical input, or a part of it): 409 `stale_target` when
/// it differs or when the call was frozen without one.
fn check_precondition(rel: &str, frozen: Option<&Value>, current: &TargetState) -> Result<(), ToolError> {
    let approved = frozen.and_then(|v| serde_json::from_value::<TargetState>(v.clone()).ok());
    if approved.as_ref() == Some(current) {
        return Ok(());
    }
    let message = match (&approved, current) {
        (None, _) => format!("{rel}: the call was frozen without the state of its target; nothing was written"),
        (Some(TargetState::Absent), _) => {
            format!("{rel} did not exist when the call was approved but exists now; nothing was written")
        }
        (Some(_), TargetState::Absent) => {
            format!("{rel} no longer exists as it was when the call was approved; nothing was written")
        }
        (Some(_), _) => format!(
            "{rel} changed since the call was frozen (it is not what the approval preview showed); nothing was written"
        ),
    };
    Err(ToolError::new(ErrorCode::StaleTarget, message).with_details(json!({
        "path": rel,
        "approved": approved.map(|a| a.to_json()),
        "current": current.to_json(),
    })))
}

/// A replay's canonical input: `canonical` (from the raw input) with the frozen input's
/// `precondition` carried over, since the precondition describes the world at freeze time,
/// not the caller's input.
fn replay_with_precondition(mut canonical: Value, frozen: &Value) -> Value {
    if let (Some(pre), Some(obj)) = (frozen.get("precondition"), canonical.as_object_mut()) {
        obj.insert("precondition".to_owned(), pre.clone());
    }
    canonical
}

/// Adds the frozen precondition and the path flags to a preview.
fn finish_preview(mut preview: Value, precondition: &Value, paths: &[(&str, &str)]) -> Value {
    if let Some(obj) = preview.as_object_mut() {
        obj.insert("precondition".to_owned(), precondition.clone());
        obj.insert("path_flags".to_owned(), workspace::lookalike::flags_json(paths));
    }
    preview
}

/// The file changed between the last check and the rename that would replace it.
fn changed_meanwhile(rel: &str) -> ToolError {
    ToolError::new(
        ErrorCode::StaleTarget,
        format!("{rel} changed while the edit was being written; nothing was written"),
    )
    .with_details(json!({"path": rel}))
}

/// `is_a_directory` for a target that must be a file.
fn is_a_directory(rel: &str) -> ToolError {
    ToolError::new(ErrorCode::IsADirectory, format!("{rel} is a directory")).with_details(json!({"path": rel}))
}

/// `not_found` for a missing target.
fn not_found(rel: &str) -> ToolError {
    ToolError::new(ErrorCode::NotFound, format!("{rel} does not exist")).with_details(json!({"path": rel}))
}

/// Evidence of an edit: `content_sha256` is the hash of the bytes the edit left (or removed),
/// the excerpt its diff or description.
fn evidence(kind: &str, provenance: Value, content_sha256: &str, text: &str) -> EvidenceDraft {
    EvidenceDraft {
        kind: kind.to_owned(),
        provenance,
        content_sha256: content_sha256.to_owned(),
        excerpt: excerpt(text, EXCERPT_MAX_BYTES),
    }
}

/// Text of `bytes` for a diff: None when it holds a NUL byte or is not UTF-8.
fn diffable(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) { None } else { std::str::from_utf8(bytes).ok() }
}

/// File mode as octal text (`"644"`).
fn mode_text(mode: u32) -> String {
    format!("{mode:o}")
}
