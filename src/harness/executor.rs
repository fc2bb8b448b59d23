//! Where a cleared invocation actually runs. The harness talks to an [`Executor`], so that a
//! remote device runner (a process on the user's machine executing Read/Edit/Terminal work
//! for a hosted control plane) can later take the place of [`LocalExecutor`].

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::CommitGate;
use crate::error::ErrorCode;
use crate::registry::{Entry, ExecContext, ToolError, ToolOutput};
use crate::store::{InvocationRow, Store};
use crate::workspace::{HardLinks, Workspace};

/// Runs one tool call for one stored invocation.
#[async_trait]
pub trait Executor: Send + Sync {
    /// Executes `entry` with the frozen `input` of `inv`, observing `cancel` and passing its
    /// commit point through `commit` (see [`super::commit`]). `prepared_in` is the run's
    /// workspace as the freeze that claimed `inv` opened it (by identity) to prepare the
    /// input — the folder the call was frozen against; None for a call claimed later (by the
    /// claim loop, or a grant), whose workspace the executor reads and opens itself when the
    /// tool works in it ([`crate::registry::ToolSpec::works_in_workspace`]; other tools are
    /// given none).
    async fn execute(
        &self,
        inv: &InvocationRow,
        prepared_in: Option<Workspace>,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError>;
}

/// Executes on the server host, in-process, against the run's workspace folder — the one the
/// freeze prepared the call in when the freeze claimed it, else opened by identity for the
/// execution, so a root replaced since the call was frozen runs nothing. A tool that does not
/// work in the folder ([`crate::registry::ToolSpec::works_in_workspace`]) is given none: its
/// run is not read again and no folder is opened for it.
pub struct LocalExecutor {
    store: Store,
    hard_links: HardLinks,
    node: String,
}

impl LocalExecutor {
    /// An executor reading runs and workspaces from `store`, giving the Read tools the
    /// hard-link rule `hard_links`; `node` is this server's stable node id (named in the Edit
    /// tools' temporary files).
    pub fn new(store: Store, hard_links: HardLinks, node: &str) -> Self {
        Self { store, hard_links, node: node.to_owned() }
    }

    /// Reads the run of `inv` with its workspace (one round trip) and opens the workspace by
    /// identity. Errors: `workspace_unavailable` (the run or workspace is gone, the store
    /// failed, the folder cannot be opened), `workspace_changed` (another folder is at the
    /// path, or the root was re-registered after `inv` was frozen).
    async fn open_for(&self, inv: &InvocationRow) -> Result<Workspace, ToolError> {
        let unavailable = |msg: String| ToolError::new(ErrorCode::WorkspaceUnavailable, msg);
        let scope = self
            .store
            .run_scope_for(&inv.owner_id, &inv.run_id, None)
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
        let ws = scope.workspace.ok_or_else(|| unavailable(format!("workspace {} is gone", scope.run.workspace_id)))?;
        let ws = crate::workspace::RunWorkspace::new(ws, self.hard_links);
        let workspace = ws.open()?;
        let ws = ws.row();
        // A call frozen against an earlier registration of the root was approved for another
        // folder: it does not run in the re-registered one.
        if ws.root_registered_at.as_deref().is_some_and(|at| inv.created_at.as_str() < at) {
            return Err(ToolError::new(
                ErrorCode::WorkspaceChanged,
                format!(
                    "{} was frozen before workspace {} was re-registered at {}; nothing was run — freeze the call again",
                    inv.id, ws.id, ws.path
                ),
            )
            .with_details(serde_json::json!({"workspace_id": ws.id, "path": ws.path,
                                             "registered_at": ws.root_registered_at, "frozen_at": inv.created_at})));
        }
        Ok(workspace)
    }
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn execute(
        &self,
        inv: &InvocationRow,
        prepared_in: Option<Workspace>,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError> {
        let workspace = match prepared_in {
            // Claimed by its freeze: the folder its input was prepared in, opened moments ago.
            Some(workspace) => Some(workspace),
            None if entry.spec().works_in_workspace() => Some(self.open_for(inv).await?),
            // A tool that does not work in the folder (MCP, network, mail…) runs without the
            // run being read again or its folder opened.
            None => None,
        }
        .map(|w| w.with_node(&self.node));
        let ctx = ExecContext {
            workspace,
            owner_id: inv.owner_id.clone(),
            run_id: inv.run_id.clone(),
            invocation_id: inv.id.clone(),
            cancel,
            commit,
        };
        entry.tool.execute(input, &ctx).await
    }
}
