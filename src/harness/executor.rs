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
use crate::workspace::HardLinks;

/// Runs one tool call for one stored invocation.
#[async_trait]
pub trait Executor: Send + Sync {
    /// Executes `entry` with the frozen `input` of `inv`, observing `cancel` and passing its
    /// commit point through `commit` (see [`super::commit`]).
    async fn execute(
        &self,
        inv: &InvocationRow,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError>;
}

/// Executes on the server host, in-process, against the run's workspace folder — opened by
/// identity for each execution, so a root replaced since the call was frozen runs nothing.
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
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn execute(
        &self,
        inv: &InvocationRow,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError> {
        let unavailable = |msg: String| ToolError::new(ErrorCode::WorkspaceUnavailable, msg);
        // The run and its workspace in one round trip.
        let scope = self
            .store
            .run_scope_for(&inv.owner_id, &inv.run_id, None)
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
        let ws = scope.workspace.ok_or_else(|| unavailable(format!("workspace {} is gone", scope.run.workspace_id)))?;
        let ws = crate::workspace::RunWorkspace::new(ws, self.hard_links);
        let workspace = ws.open()?.with_node(&self.node);
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
