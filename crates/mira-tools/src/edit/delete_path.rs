//! `delete_path {path, recursive?}`: delete a file, or a directory with `recursive: true`.
//! Never the workspace root. The target itself must be a regular file with one link or a
//! directory (a symlink, a hard-linked file, a FIFO, socket or device is refused); inside a
//! directory being deleted, entries of any kind are removed as entries and symlinks are
//! never followed. A directory is first renamed to a hidden name beside it, so it leaves the
//! workspace view at once, then removed. What the preview showed — the file's SHA-256, or
//! the directory's manifest fingerprint — is frozen as `precondition`; a target in another
//! state at execution is `stale_target` and nothing is deleted.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::fs::{self as efs, Leaf, Parents};
use super::{TargetState, check_precondition, check_resolved, target};
use crate::input;
use crate::read::blocking;
use mira_core::commit::{CommitGate, SideEffects};
use mira_core::error_code::ErrorCode;
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolOutput, ToolSpec};
use mira_core::workspace::{self, Workspace};

/// The input of `delete_path`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeletePathInput {
    /// Path relative to the workspace root
    #[schemars(length(min = 1, max = super::MAX_PATH_BYTES))]
    path: String,
    /// Required (true) to delete a directory and everything in it
    #[serde(default)]
    recursive: bool,
}

/// The canonical input of `delete_path` as frozen: the normalised and the resolved absolute
/// path, `recursive`, and the target's state (`precondition`, absent before the preview is
/// made).
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    path: String,
    resolved_path: String,
    #[serde(default)]
    recursive: bool,
    precondition: Option<Value>,
}

/// The `delete_path` tool.
pub struct DeletePath {
    spec: ToolSpec,
}

impl DeletePath {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: super::spec(
                "delete_path",
                "Delete a file or directory",
                "Delete a workspace file, or a directory with recursive: true. Never the workspace root; symlinks are \
                 not followed. Needs approval; the approver sees what will be removed.",
                input::schema_of::<DeletePathInput>(),
            ),
        }
    }
}

impl Default for DeletePath {
    fn default() -> Self {
        Self::new()
    }
}

fn canonical(input: &Value, ws: &Workspace) -> Result<Value, ToolError> {
    let input: DeletePathInput = input::parse(input)?;
    let (rel, abs) = target(ws, &input.path)?;
    Ok(json!({"path": rel, "resolved_path": abs, "recursive": input.recursive}))
}

/// What is at the target.
enum Found {
    File { sha256: String, size: u64 },
    Dir(efs::TreeSummary),
}

fn look(dir: &cap_std::fs::Dir, name: &str, rel: &str, recursive: bool) -> Result<Found, ToolError> {
    match efs::inspect(dir, name, rel)? {
        Leaf::Missing => Err(super::not_found(rel)),
        Leaf::File(file) => Ok(Found::File { sha256: file.sha256(rel)?, size: file.size }),
        Leaf::Dir if !recursive => Err(ToolError::new(
            ErrorCode::RecursiveRequired,
            format!("{rel} is a directory; deleting it needs recursive: true"),
        )
        .with_details(json!({"path": rel}))),
        Leaf::Dir => Ok(Found::Dir(efs::walk_tree(dir, name, rel)?)),
    }
}

impl Found {
    /// The precondition this state is.
    fn state(&self) -> TargetState {
        match self {
            Found::File { sha256, .. } => TargetState::File { sha256: sha256.clone() },
            Found::Dir(tree) => TargetState::Directory { manifest_sha256: tree.manifest_sha256.clone() },
        }
    }
}

fn describe(rel: &str, found: &Found) -> Value {
    match found {
        Found::File { sha256, size } => json!({"kind": "file", "path": rel, "sha256": sha256, "size": size}),
        Found::Dir(tree) => json!({"kind": "directory", "path": rel, "tree": tree}),
    }
}

/// The preview and the precondition it shows.
fn plan(ws: &Workspace, input: &Frozen) -> Result<(Value, TargetState), ToolError> {
    let rel = input.path.as_str();
    let located = efs::locate(ws, rel, Parents::MustExist)?;
    let dir = located.dir.as_ref().ok_or_else(|| super::not_found(rel))?;
    let found = look(dir, &located.name, rel, input.recursive)?;
    let mut preview = describe(rel, &found);
    preview["action"] = json!("delete_path");
    preview["resolved_path"] = json!(input.resolved_path);
    Ok((preview, found.state()))
}

fn delete(ws: &Workspace, input: &Frozen, gate: &CommitGate) -> Result<ToolOutput, ToolError> {
    let rel = check_resolved(ws, &input.path, &input.resolved_path)?;
    let abs = input.resolved_path.as_str();
    let _guard = efs::lock_paths(&[abs]);
    let located = efs::locate(ws, &rel, Parents::MustExist)?;
    let dir = located.dir.as_ref().ok_or_else(|| super::not_found(&rel))?;
    let found = match look(dir, &located.name, &rel, input.recursive) {
        Err(e) if e.code == ErrorCode::NotFound => {
            check_precondition(&rel, input.precondition.as_ref(), &TargetState::Absent)?;
            return Err(e);
        }
        other => other?,
    };
    check_precondition(&rel, input.precondition.as_ref(), &found.state())?;
    // Moved out of reach under a hidden name first and looked at again there: what is removed
    // is what the precondition named (a change in place since the look above, even one that
    // kept the size and modification time, is put back and refused), and the commit point
    // comes last (a stop that won puts it back too).
    let hidden = workspace::sweep::delete_name(ws.node());
    efs::rename_noreplace(dir, &located.name, dir, &hidden, &rel)?;
    let checked = look(dir, &hidden, &rel, input.recursive)
        .and_then(|now| if now.state() == found.state() { Ok(()) } else { Err(super::changed_meanwhile(&rel)) })
        .and_then(|()| gate.pass());
    if let Err(error) = checked {
        if efs::rename_noreplace(dir, &hidden, dir, &located.name, &rel).is_ok() {
            return Err(error);
        }
        // A new entry took the name meanwhile: the old one stays under its hidden name (the
        // sweep removes it), which the error says.
        let mut details = if error.details.is_object() { error.details.clone() } else { json!({"path": rel}) };
        details["remainder_restored"] = json!(false);
        return Err(error.with_details(details));
    }
    match &found {
        Found::File { .. } => dir.remove_file(&hidden).map_err(|e| workspace::io_error(&rel, &e))?,
        Found::Dir(_) => {
            if let Err(e) = dir.remove_dir_all(&hidden) {
                // Put back what is left, so nothing lingers under a hidden name.
                let restored = efs::rename_noreplace(dir, &hidden, dir, &located.name, &rel).is_ok();
                return Err(workspace::io_error(&rel, &e)
                    .with_details(json!({"path": rel, "os_error": e.raw_os_error(), "partially_deleted": true,
                                         "remainder_restored": restored})));
            }
        }
    }
    efs::sync_dir(dir, &rel)?;
    let (sha256_before, bytes, files, dirs, others) = match &found {
        Found::File { sha256, size } => (sha256.clone(), *size, 1, 0, 0),
        Found::Dir(t) => (t.manifest_sha256.clone(), t.bytes, t.files, t.dirs + 1, t.others),
    };
    let output = json!({
        "path": rel,
        "deleted": describe(&rel, &found),
        "sha256_before": sha256_before,
        "sha256_after": null,
        "bytes_removed": bytes,
        "files_removed": files,
        "dirs_removed": dirs,
        "others_removed": others,
    });
    let provenance = json!({
        "path": rel, "resolved_path": abs, "sha256_before": sha256_before, "sha256_after": null,
        "bytes_removed": bytes, "files_removed": files, "dirs_removed": dirs, "others_removed": others,
    });
    let text = format!("deleted {rel}: {files} files, {dirs} directories, {others} other entries, {bytes} bytes");
    Ok(ToolOutput { output, evidence: vec![super::evidence("path_delete", provenance, &sha256_before, &text)] })
}

#[async_trait]
impl Tool for DeletePath {
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
        blocking(move || delete(&ws, &input, &gate)).await
    }
}
