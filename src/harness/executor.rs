//! Where a cleared invocation actually runs. The harness talks to an [`Executor`], so that a
//! remote device runner (a process on the user's machine executing Read/Edit/Terminal work
//! for a hosted control plane) can later take the place of [`LocalExecutor`].

use std::path::Path;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::registry::{Entry, ErrorClass, ExecContext, ToolError, ToolOutput};
use crate::store::{InvocationRow, Store};
use crate::workspace::Workspace;

/// Runs one tool call for one stored invocation.
#[async_trait]
pub trait Executor: Send + Sync {
    /// Executes `entry` with the frozen `input` of `inv`, observing `cancel`.
    async fn execute(
        &self,
        inv: &InvocationRow,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, ToolError>;
}

/// Executes on the server host, in-process, against the run's workspace folder.
pub struct LocalExecutor {
    store: Store,
}

impl LocalExecutor {
    /// An executor reading runs and workspaces from `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
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
    ) -> Result<ToolOutput, ToolError> {
        let unavailable = |msg: String| ToolError::new(ErrorClass::Unavailable, "workspace_unavailable", msg);
        let run = self
            .store
            .run_for(&inv.owner_id, &inv.run_id)
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
        let ws = self
            .store
            .workspace_for(&run.owner_id, &run.workspace_id)
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| unavailable(format!("workspace {} is gone", run.workspace_id)))?;
        let workspace = Workspace::open(Path::new(&ws.path))
            .map_err(|e| unavailable(format!("workspace {} cannot be opened: {e}", ws.path)))?;
        let ctx = ExecContext {
            workspace,
            owner_id: inv.owner_id.clone(),
            run_id: inv.run_id.clone(),
            invocation_id: inv.id.clone(),
            cancel,
        };
        entry.tool.execute(input, &ctx).await
    }
}
