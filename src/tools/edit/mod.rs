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
//! A successful edit yields evidence about bytes — paths, SHA-256 before and after, bytes
//! written, a diff summary — never a claim that the content is right.

pub mod delete_path;
pub mod diff;
pub mod fs;
pub mod move_path;
pub mod replace_block;
pub mod write_file;

use serde_json::{Value, json};

use crate::evidence::{EXCERPT_MAX_BYTES, EvidenceDraft, excerpt};
use crate::registry::{ErrorClass, ToolError, ToolKind, ToolSpec};
use crate::tools::str_field;
use crate::workspace::{self, Workspace};

/// The JSON Schema of a workspace path field.
fn path_schema(description: &str) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 4096, "description": description})
}

/// The JSON Schema of an `expected_sha256` field.
fn sha_schema() -> Value {
    json!({
        "type": "string", "pattern": "^[0-9a-fA-F]{64}$",
        "description": "SHA-256 (hex) of the file as last read (read_open returns it); if the file changed since, nothing is written (409 stale_target)"
    })
}

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

/// Normalises the path in field `field` and resolves it against the workspace root:
/// `(workspace-relative path, absolute path)`. The root itself is refused
/// (`workspace_root`), escapes are `outside_workspace`.
fn target(ws: &Workspace, input: &Value, field: &str) -> Result<(String, String), ToolError> {
    let rel = workspace::normalize(str_field(input, field).unwrap_or_default())?;
    if rel == "." {
        return Err(fs::root_refused(str_field(input, field).unwrap_or_default()));
    }
    let abs = ws.root().join(&rel).to_string_lossy().into_owned();
    Ok((rel, abs))
}

/// At execution: the absolute target frozen in the input must still be where this
/// workspace puts the relative path; otherwise the approval covered another file.
fn check_resolved(ws: &Workspace, input: &Value, rel_field: &str, abs_field: &str) -> Result<String, ToolError> {
    let rel = str_field(input, rel_field).unwrap_or_default().to_owned();
    let frozen = str_field(input, abs_field).unwrap_or_default();
    let now = ws.root().join(&rel).to_string_lossy().into_owned();
    if rel.is_empty() || rel == "." || frozen != now {
        return Err(ToolError::new(
            ErrorClass::Failed,
            "workspace_moved",
            format!("the approved target {frozen} is no longer {rel} in this workspace ({now}); nothing was changed"),
        )
        .with_details(json!({"path": rel, "approved": frozen, "now": now})));
    }
    Ok(rel)
}

/// `expected_sha256`, lowercased, if given.
fn expected_sha(input: &Value) -> Option<String> {
    str_field(input, "expected_sha256").map(str::to_ascii_lowercase)
}

/// The `expected_sha256` precondition: 409 `stale_target` when the file's current hash
/// (None = missing) differs.
fn check_expected(rel: &str, expected: Option<&str>, current: Option<&str>) -> Result<(), ToolError> {
    match expected {
        Some(want) if Some(want) != current => Err(ToolError::new(
            ErrorClass::Conflict,
            "stale_target",
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

/// The file changed between the last check and the rename that would replace it.
fn changed_meanwhile(rel: &str) -> ToolError {
    ToolError::new(
        ErrorClass::Conflict,
        "stale_target",
        format!("{rel} changed while the edit was being written; nothing was written"),
    )
    .with_details(json!({"path": rel}))
}

/// `is_a_directory` for a target that must be a file.
fn is_a_directory(rel: &str) -> ToolError {
    ToolError::new(ErrorClass::BadInput, "is_a_directory", format!("{rel} is a directory"))
        .with_details(json!({"path": rel}))
}

/// `not_found` for a missing target.
fn not_found(rel: &str) -> ToolError {
    ToolError::new(ErrorClass::NotFound, "not_found", format!("{rel} does not exist"))
        .with_details(json!({"path": rel}))
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
