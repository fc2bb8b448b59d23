//! `move_path {from, to, overwrite?}`: move (rename) a file or directory inside the
//! workspace, across directories. Refuses to overwrite unless `overwrite: true` (and even
//! then replaces only a regular file, by a file); refuses to move the workspace root, onto
//! it, or a directory into itself. The destination's parent must exist. A move without
//! overwrite uses `renameat2(RENAME_NOREPLACE)`, so a destination created meanwhile is never
//! replaced. Both paths obey the Edit boundary rules ([`super::fs`]). The state of both ends
//! as the preview showed them — the source's SHA-256 or directory fingerprint, the
//! destination's absence or (with `overwrite`) SHA-256 — is frozen as
//! `precondition: {from, to}`; either end in another state at execution is `stale_target`
//! and nothing moves.

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

/// The input of `move_path`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MovePathInput {
    /// Source path relative to the workspace root
    #[schemars(length(min = 1, max = super::MAX_PATH_BYTES))]
    from: String,
    /// Destination path relative to the workspace root
    #[schemars(length(min = 1, max = super::MAX_PATH_BYTES))]
    to: String,
    /// Replace an existing destination file (default false)
    #[serde(default)]
    overwrite: bool,
}

/// The canonical input of `move_path` as frozen: both normalised paths and their resolved
/// absolute paths, `overwrite`, and the state of both ends (`precondition`, absent before
/// the preview is made).
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    from: String,
    to: String,
    resolved_from: String,
    resolved_to: String,
    #[serde(default)]
    overwrite: bool,
    precondition: Option<Value>,
}

/// The `move_path` tool.
pub struct MovePath {
    spec: ToolSpec,
}

impl MovePath {
    /// The tool with its spec.
    pub fn new() -> Self {
        Self {
            spec: super::spec(
                "move_path",
                "Move a file or directory",
                "Move or rename a workspace file or directory, also across directories (the destination's parent must \
                 exist). Refuses to overwrite an existing destination unless overwrite: true. Needs approval.",
                input::schema_of::<MovePathInput>(),
            ),
        }
    }
}

impl Default for MovePath {
    fn default() -> Self {
        Self::new()
    }
}

fn canonical(input: &Value, ws: &Workspace) -> Result<Value, ToolError> {
    let input: MovePathInput = input::parse(input)?;
    let (from, resolved_from) = target(ws, &input.from)?;
    let (to, resolved_to) = target(ws, &input.to)?;
    if from == to {
        return Err(ToolError::new(ErrorCode::SamePath, format!("from and to are both {from}"))
            .with_details(json!({"from": from, "to": to})));
    }
    if to.starts_with(&format!("{from}/")) {
        return Err(ToolError::new(ErrorCode::MoveIntoItself, format!("cannot move {from} into itself ({to})"))
            .with_details(json!({"from": from, "to": to})));
    }
    Ok(json!({
        "from": from, "to": to, "resolved_from": resolved_from, "resolved_to": resolved_to,
        "overwrite": input.overwrite,
    }))
}

/// The source and what the destination holds.
struct Plan {
    from_dir: cap_std::fs::Dir,
    from_name: String,
    to_dir: cap_std::fs::Dir,
    to_name: String,
    source: Value,
    source_sha256: String,
    source_state: TargetState,
    size: u64,
    replaced: Option<(efs::Regular, String)>,
}

impl Plan {
    /// The destination's state.
    fn target_state(&self) -> TargetState {
        self.replaced.as_ref().map_or(TargetState::Absent, |(_, sha)| TargetState::File { sha256: sha.clone() })
    }

    /// The frozen precondition: both ends.
    fn precondition(&self) -> Value {
        json!({"from": self.source_state.to_json(), "to": self.target_state().to_json()})
    }
}

/// Inspects both ends. At execution (`frozen` = the frozen precondition) each must first be
/// in the state the preview showed.
fn plan(ws: &Workspace, input: &Frozen, frozen: Option<&Value>) -> Result<Plan, ToolError> {
    let from = input.from.as_str();
    let to = input.to.as_str();
    let overwrite = input.overwrite;
    let src = efs::locate(ws, from, Parents::MustExist)?;
    let from_dir = src.dir.ok_or_else(|| super::not_found(from))?;
    let (source, source_sha256, size, is_dir) = match efs::inspect(&from_dir, &src.name, from)? {
        Leaf::Missing => {
            if let Some(frozen) = frozen {
                check_precondition(from, frozen.get("from"), &TargetState::Absent)?;
            }
            return Err(super::not_found(from));
        }
        Leaf::File(file) => {
            let sha = file.sha256(from)?;
            (json!({"kind": "file", "path": from, "sha256": sha, "size": file.size}), sha, file.size, false)
        }
        Leaf::Dir => {
            let tree = efs::walk_tree(&from_dir, &src.name, from)?;
            let (sha, bytes) = (tree.manifest_sha256.clone(), tree.bytes);
            (json!({"kind": "directory", "path": from, "tree": tree}), sha, bytes, true)
        }
    };
    let source_state = if is_dir {
        TargetState::Directory { manifest_sha256: source_sha256.clone() }
    } else {
        TargetState::File { sha256: source_sha256.clone() }
    };
    if let Some(frozen) = frozen {
        check_precondition(from, frozen.get("from"), &source_state)?;
    }
    let dst = efs::locate(ws, to, Parents::MustExist)?;
    let to_dir = dst.dir.ok_or_else(|| super::not_found(to))?;
    let exists = |what: &str| {
        ToolError::new(
            ErrorCode::AlreadyExists,
            format!("{to} already exists ({what}); set overwrite: true to replace a file"),
        )
        .with_details(json!({"from": from, "to": to}))
    };
    let leaf = efs::inspect(&to_dir, &dst.name, to)?;
    if let Some(frozen) = frozen {
        let now = match &leaf {
            Leaf::Missing => TargetState::Absent,
            Leaf::File(file) => TargetState::File { sha256: file.sha256(to)? },
            Leaf::Dir => {
                TargetState::Directory { manifest_sha256: efs::walk_tree(&to_dir, &dst.name, to)?.manifest_sha256 }
            }
        };
        check_precondition(to, frozen.get("to"), &now)?;
    }
    let replaced = match leaf {
        Leaf::Missing => None,
        Leaf::Dir if overwrite => {
            return Err(ToolError::new(
                ErrorCode::DestinationIsDirectory,
                format!("{to} is a directory; move_path replaces only files"),
            )
            .with_details(json!({"from": from, "to": to})));
        }
        Leaf::Dir => return Err(exists("a directory")),
        Leaf::File(_) if !overwrite => return Err(exists("a file")),
        Leaf::File(_) if is_dir => {
            return Err(ToolError::new(
                ErrorCode::TypeMismatch,
                format!("{to} is a file and {from} a directory; a directory cannot replace a file"),
            )
            .with_details(json!({"from": from, "to": to})));
        }
        Leaf::File(file) => {
            let sha = file.sha256(to)?;
            Some((file, sha))
        }
    };
    Ok(Plan {
        from_dir,
        from_name: src.name,
        to_dir,
        to_name: dst.name,
        source,
        source_sha256,
        source_state,
        size,
        replaced,
    })
}

fn preview(input: &Frozen, plan: &Plan) -> Value {
    let preview = json!({
        "action": "move_path",
        "from": input.from,
        "to": input.to,
        "resolved_from": input.resolved_from,
        "resolved_to": input.resolved_to,
        "source": plan.source,
        "overwrites": plan.replaced.as_ref().map(|(f, sha)| json!({"sha256": sha, "size": f.size})),
    });
    let paths = [("from", input.from.as_str()), ("to", input.to.as_str())];
    super::finish_preview(preview, &plan.precondition(), &paths)
}

fn apply(ws: &Workspace, input: &Frozen, gate: &CommitGate) -> Result<ToolOutput, ToolError> {
    let from = check_resolved(ws, &input.from, &input.resolved_from)?;
    let to = check_resolved(ws, &input.to, &input.resolved_to)?;
    let resolved_from = input.resolved_from.as_str();
    let resolved_to = input.resolved_to.as_str();
    let _guard = efs::lock_paths(&[resolved_from, resolved_to]);
    let none = Value::Null;
    let p = plan(ws, input, Some(input.precondition.as_ref().unwrap_or(&none)))?;
    match &p.replaced {
        None => {
            gate.pass()?;
            efs::rename_noreplace(&p.from_dir, &p.from_name, &p.to_dir, &p.to_name, &to)?;
        }
        Some((file, sha256)) => {
            match efs::inspect(&p.to_dir, &p.to_name, &to)? {
                Leaf::File(now) if now.unchanged(file, sha256, &to)? => {}
                _ => return Err(super::changed_meanwhile(&to)),
            }
            gate.pass()?;
            p.from_dir.rename(&p.from_name, &p.to_dir, &p.to_name).map_err(|e| workspace::io_error(&to, &e))?;
        }
    }
    efs::sync_dir(&p.to_dir, &to)?;
    efs::sync_dir(&p.from_dir, &from)?;
    let sha256_after = match efs::inspect(&p.to_dir, &p.to_name, &to)? {
        Leaf::File(file) => file.sha256(&to)?,
        Leaf::Dir => efs::walk_tree(&p.to_dir, &p.to_name, &to)?.manifest_sha256,
        Leaf::Missing => String::new(),
    };
    let overwritten = p.replaced.as_ref().map(|(f, sha)| json!({"sha256": sha, "size": f.size}));
    let output = json!({
        "from": from,
        "to": to,
        "moved": p.source,
        "sha256_before": p.source_sha256,
        "sha256_after": sha256_after,
        "bytes_moved": p.size,
        "overwritten": overwritten,
    });
    let provenance = json!({
        "from": from, "to": to, "resolved_from": resolved_from, "resolved_to": resolved_to,
        "sha256_before": p.source_sha256, "sha256_after": sha256_after, "bytes_moved": p.size,
        "overwritten": overwritten,
    });
    let text = format!("moved {from} to {to} ({} bytes)", p.size);
    Ok(ToolOutput { output, evidence: vec![super::evidence("path_move", provenance, &sha256_after, &text)] })
}

#[async_trait]
impl Tool for MovePath {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let mut canonical = canonical(&input, ctx.workspace()?)?;
        let ws = ctx.workspace()?.clone();
        let frozen: Frozen = input::frozen(&canonical)?;
        let (preview, precondition) =
            blocking(move || plan(&ws, &frozen, None).map(|p| (preview(&frozen, &p), p.precondition()))).await?;
        canonical["precondition"] = precondition;
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
