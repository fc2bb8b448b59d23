//! `write_file {path, content, create_dirs?, expected_sha256?}`: create or overwrite a
//! file with exactly `content` (UTF-8 bytes, nothing trimmed or converted).
//!
//! Written atomically: a temporary file in the same directory, fsynced, given the old
//! file's mode, renamed over the target, then the directory fsynced. A new file is put in
//! place with `RENAME_NOREPLACE`, so a file created meanwhile is never overwritten. The
//! approval preview carries the unified diff from the current file (computed at freeze time),
//! and the file's state then (its SHA-256, or its absence) is frozen as `precondition`: a
//! file that is not in that state at execution is `stale_target`, nothing written.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::fs::{self as efs, Leaf, Parents, Regular, Replace};
use super::{TargetState, check_expected, check_precondition, check_resolved, diff, diffable, mode_text, target};
use crate::input;
use crate::read::blocking;
use mira_core::commit::{CommitGate, SideEffects};
use mira_core::evidence::sha256_hex;
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolOutput, ToolSpec};
use mira_core::workspace::Workspace;

/// The input of `write_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileInput {
    /// File path relative to the workspace root
    #[schemars(length(min = 1, max = super::MAX_PATH_BYTES))]
    path: String,
    /// The whole new content, written byte for byte
    content: String,
    /// Create missing parent directories (default false)
    #[serde(default)]
    create_dirs: bool,
    /// SHA-256 (hex) of the file as last read (read_open returns it); if the file changed since, nothing is written (409 stale_target)
    #[schemars(pattern(r"^[0-9a-fA-F]{64}$"))]
    expected_sha256: Option<String>,
}

/// The canonical input of `write_file` as frozen: [`WriteFileInput`] with the normalised
/// path, the resolved absolute path, the lowercased hash and the target's state
/// (`precondition`, absent before the preview is made).
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    path: String,
    resolved_path: String,
    content: String,
    #[serde(default)]
    create_dirs: bool,
    expected_sha256: Option<String>,
    precondition: Option<Value>,
}

/// The `write_file` tool.
pub struct WriteFile {
    spec: ToolSpec,
}

impl WriteFile {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: super::spec(
                "write_file",
                "Write a file",
                "Create or overwrite a workspace file with the given text, atomically, keeping the file's mode. \
                 Needs approval; the approver sees a unified diff. Give expected_sha256 (from read_open) to refuse \
                 the write if the file changed since you read it.",
                input::schema_of::<WriteFileInput>(),
            ),
        }
    }
}

impl Default for WriteFile {
    fn default() -> Self {
        Self::new()
    }
}

/// The canonical input: normalised path, resolved absolute path, every default.
fn canonical(input: &Value, ws: &Workspace) -> Result<Value, ToolError> {
    let input: WriteFileInput = input::parse(input)?;
    let (rel, abs) = target(ws, &input.path)?;
    let mut c = json!({
        "path": rel,
        "resolved_path": abs,
        "content": input.content,
        "create_dirs": input.create_dirs,
    });
    if let Some(sha) = &input.expected_sha256 {
        c["expected_sha256"] = json!(sha.to_ascii_lowercase());
    }
    Ok(c)
}

/// The current file: its bytes when small enough to diff, else only its hash.
struct Before {
    file: Regular,
    bytes: Option<Vec<u8>>,
    sha256: String,
}

impl Before {
    /// The precondition this state is.
    fn state(before: Option<&Before>) -> TargetState {
        before.map_or(TargetState::Absent, |b| TargetState::File { sha256: b.sha256.clone() })
    }
}

/// Inspects the target and checks `expected_sha256`; `None` = the file does not exist.
fn current(dir: &cap_std::fs::Dir, name: &str, rel: &str, input: &Frozen) -> Result<Option<Before>, ToolError> {
    let before = match efs::inspect(dir, name, rel)? {
        Leaf::Missing => None,
        Leaf::Dir => return Err(super::is_a_directory(rel)),
        Leaf::File(file) if file.size > diff::MAX_DIFF_INPUT_BYTES as u64 => {
            let sha256 = file.sha256(rel)?;
            Some(Before { file, bytes: None, sha256 })
        }
        Leaf::File(file) => {
            let bytes = file.read_all(rel)?;
            let sha256 = sha256_hex(&bytes);
            Some(Before { file, bytes: Some(bytes), sha256 })
        }
    };
    check_expected(rel, input.expected_sha256.as_deref(), before.as_ref().map(|b| b.sha256.as_str()))?;
    Ok(before)
}

fn preview(input: &Frozen, missing_dirs: &[String], before: Option<&Before>) -> Value {
    let rel = input.path.as_str();
    let content = input.content.as_str();
    let (diff, note) = match before.map(|b| b.bytes.as_deref().map(diffable)) {
        Some(None) => (None, Some("the current file is too large to diff")),
        Some(Some(None)) => (None, Some("the current file is binary or not UTF-8; no text diff")),
        Some(Some(Some(old))) => (diff::unified(rel, Some(old), content), None),
        None => (diff::unified(rel, None, content), None),
    };
    let note = note.or(diff.is_none().then_some("too large to diff"));
    json!({
        "action": "write_file",
        "path": rel,
        "resolved_path": input.resolved_path,
        "creates": before.is_none(),
        "create_dirs": missing_dirs,
        "before": before.map(|b| json!({"sha256": b.sha256, "size": b.file.size, "mode": mode_text(b.file.mode)})),
        "after": {"sha256": sha256_hex(content.as_bytes()), "size": content.len()},
        "diff": diff.as_ref().map(|d| d.unified.clone()),
        "diff_truncated": diff.as_ref().is_some_and(|d| d.truncated),
        "diff_summary": diff.as_ref().map(|d| d.summary.clone()),
        "note": note,
    })
}

/// The preview and the precondition it shows.
fn plan(ws: &Workspace, input: &Frozen) -> Result<(Value, TargetState), ToolError> {
    let rel = input.path.as_str();
    let parents = if input.create_dirs { Parents::Probe } else { Parents::MustExist };
    let located = efs::locate(ws, rel, parents)?;
    let before = match &located.dir {
        Some(dir) => current(dir, &located.name, rel, input)?,
        None => {
            check_expected(rel, input.expected_sha256.as_deref(), None)?;
            None
        }
    };
    Ok((preview(input, &located.missing_dirs, before.as_ref()), Before::state(before.as_ref())))
}

fn write(ws: &Workspace, input: &Frozen, gate: &CommitGate) -> Result<ToolOutput, ToolError> {
    let rel = check_resolved(ws, &input.path, &input.resolved_path)?;
    let abs = input.resolved_path.as_str();
    let content = input.content.as_str();
    let _guard = efs::lock_paths(&[abs]);
    let parents = if input.create_dirs { Parents::Create } else { Parents::MustExist };
    let located = efs::locate(ws, &rel, parents)?;
    let result = (|| {
        let dir = located.dir.as_ref().ok_or_else(|| super::not_found(&rel))?;
        let before = current(dir, &located.name, &rel, input)?;
        check_precondition(&rel, input.precondition.as_ref(), &Before::state(before.as_ref()))?;
        let replace = if before.is_some() { Replace::Overwrite } else { Replace::CreateNew };
        let mode = before.as_ref().map(|b| b.file.mode);
        efs::write_atomic(dir, &located.name, &rel, content.as_bytes(), mode, replace, ws.node(), || {
            match (efs::inspect(dir, &located.name, &rel)?, &before) {
                (Leaf::Missing, None) => Ok(()),
                (Leaf::File(now), Some(b)) if now.unchanged(&b.file, &b.sha256, &rel)? => Ok(()),
                _ => Err(super::changed_meanwhile(&rel)),
            }
            .and_then(|()| gate.pass())
        })?;
        Ok((dir, before))
    })();
    let (dir, before) = match result {
        Ok(done) => done,
        Err(e) => {
            // Directories this call created for nothing are removed again (when still empty).
            for created in located.missing_dirs.iter().rev() {
                let _ = ws.dir().remove_dir(created);
            }
            return Err(e);
        }
    };
    let after = match efs::inspect(dir, &located.name, &rel)? {
        Leaf::File(file) => Some((file.sha256(&rel)?, file.size, file.mode)),
        _ => None,
    };
    let written_sha = sha256_hex(content.as_bytes());
    let (after_sha, after_size, after_mode) = after.unwrap_or((String::new(), 0, 0));
    let diff = match before.as_ref().map(|b| b.bytes.as_deref().and_then(diffable)) {
        Some(Some(old)) => diff::unified(&rel, Some(old), content),
        Some(None) => None,
        None => diff::unified(&rel, None, content),
    };
    let output = json!({
        "path": rel,
        "created": before.is_none(),
        "created_dirs": located.missing_dirs,
        "bytes_written": content.len(),
        "sha256_before": before.as_ref().map(|b| b.sha256.clone()),
        "sha256_after": after_sha,
        "size_after": after_size,
        "mode": mode_text(after_mode),
        "diff_summary": diff.as_ref().map(|d| d.summary.clone()),
        "read_back_matches": after_sha == written_sha,
    });
    let provenance = json!({
        "path": rel,
        "resolved_path": abs,
        "sha256_before": output["sha256_before"],
        "sha256_after": after_sha,
        "bytes_written": content.len(),
        "created": before.is_none(),
        "diff_summary": output["diff_summary"],
    });
    let text = diff.map_or_else(|| format!("wrote {} bytes to {rel}", content.len()), |d| d.unified);
    Ok(ToolOutput { output, evidence: vec![super::evidence("file_write", provenance, &after_sha, &text)] })
}

#[async_trait]
impl Tool for WriteFile {
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
        blocking(move || write(&ws, &input, &gate)).await
    }
}
