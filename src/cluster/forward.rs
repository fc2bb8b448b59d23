//! Actions on replica-owned resources that land on a replica other than the owner.
//!
//! A terminal session's PTY lives in the process of the replica that started it
//! (`terminal_sessions.node_id`); a stdio MCP server's process in the replica that holds it
//! (`mcp_owners`, see [`crate::mcp`]). Any replica's harness may claim a later action on a
//! session (`input`, `wait`, `kill`…) or a call of a projected stdio MCP tool.
//! [`ClusterExecutor`] then sends the execution to the owner:
//! `POST <owner address>/internal/v1/execute` with the invocation id and the claimer's
//! process id, authenticated by the cluster secret (`x-mira-cluster-secret`, compared in
//! constant time, never logged). The owner checks that the invocation is still running under
//! that claim, gates it again itself ([`crate::harness::Harness::gate`]: a grant that is no
//! longer an exact granted approval is refused with `approval_required`, nothing runs; and
//! `App::check_still_available`: a tool no longer available for the run — its MCP server
//! not connected, its device revoked — is refused with the ladder's reason), runs
//! it with its own [`LocalExecutor`] and answers the tool's output or error;
//! the claimer records the result under its lease as for a local execution (so a claim taken
//! over meanwhile drops it: the lease is the fencing token).
//!
//! When the owner's heartbeat is older than `--replica-dead-after-secs` (or, for an MCP server,
//! its owner was declared dead: `lost`) the action fails with `owner_gone` (nothing ran; the
//! session ends `lost` once the owner is declared dead; the MCP server waits for an explicit
//! connect on a live replica); when
//! the owner runs but cannot be reached (no secret configured, connection refused) with
//! `owner_unreachable`. A forwarded request that fails after it was sent leaves the outcome
//! unknown (`outcome_unknown`). Ended sessions are answered from the store by any replica.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Node;
use crate::error::ErrorCode;
use crate::harness::CommitGate;
use crate::harness::executor::{Executor, LocalExecutor};
use crate::registry::{Entry, ToolError, ToolOutput};
use crate::state::{McpOwnerState, TerminalSessionState};
use crate::store::{InvocationRow, Store};
use crate::workspace::Workspace;

/// The header carrying the cluster secret.
pub const SECRET_HEADER: &str = "x-mira-cluster-secret";
/// The tool whose sessions live on one replica.
pub const TERMINAL_TOOL: &str = "terminal_session";

/// Whether invocations of `tool_id` may be forwarded between replicas: terminal session
/// actions and calls of projected MCP tools.
pub fn forwardable(tool_id: &str) -> bool {
    tool_id == TERMINAL_TOOL || mira_core::ids::parse_mcp_projection_id(tool_id).is_some()
}

/// Body of `POST /internal/v1/execute`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ExecuteRequest {
    /// The invocation to run.
    pub invocation_id: String,
    /// The process id that holds its claim (`claimed_by`).
    pub claimed_by: String,
}

/// Answer of `POST /internal/v1/execute`: the tool's output or its error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecuteAnswer {
    /// The tool returned.
    Ok(ToolOutput),
    /// The tool (or the owner's checks) failed.
    Err(ToolError),
}

/// Where a session lives, seen from this replica.
#[derive(Debug)]
pub enum Owner {
    /// This replica (or the session ended: the store answers).
    Here,
    /// Another replica with a fresh heartbeat, at this base URL.
    Elsewhere(String),
    /// Another replica whose heartbeat stopped (its node id).
    Gone(String),
}

/// Where the running session `row_node` (its `node_id`) lives.
pub async fn owner(
    store: &Store,
    node: &Node,
    row_node: &str,
    state: TerminalSessionState,
) -> Result<Owner, crate::store::StoreError> {
    if row_node == node.id || state != TerminalSessionState::Running {
        return Ok(Owner::Here);
    }
    Ok(match store.replica(row_node).await? {
        Some(r) if node.is_alive(&r) => Owner::Elsewhere(r.address),
        _ => Owner::Gone(row_node.to_owned()),
    })
}

/// The `owner_gone` error for a session of `node_id`.
pub fn owner_gone(session_id: &str, node_id: &str) -> ToolError {
    ToolError::new(
        ErrorCode::OwnerGone,
        format!(
            "terminal session {session_id} lives on replica {node_id}, which stopped sending heartbeats; \
             nothing was run (the session ends lost once that replica is declared dead)"
        ),
    )
    .with_details(serde_json::json!({"session_id": session_id, "node_id": node_id}))
}

/// The `owner_gone` error for a call of stdio MCP server `server_id` held by `node_id`.
pub fn mcp_owner_gone(server_id: &str, node_id: &str, lost: bool) -> ToolError {
    let why = if lost { "was declared dead" } else { "stopped sending heartbeats" };
    ToolError::new(
        ErrorCode::OwnerGone,
        format!(
            "the process of stdio MCP server {server_id} lives on replica {node_id}, which {why}; nothing was sent \
             (POST /v1/mcp/servers/{server_id}/connect starts it on a live replica)"
        ),
    )
    .with_details(serde_json::json!({"server_id": server_id, "node_id": node_id}))
}

/// The harness's executor on a replica: terminal actions on another replica's session and
/// calls of a stdio MCP server another replica holds go to that replica, everything else
/// runs here (see the module docs).
pub struct ClusterExecutor {
    local: Arc<LocalExecutor>,
    store: Store,
    node: Arc<Node>,
    process_id: String,
    client: reqwest::Client,
}

impl ClusterExecutor {
    /// Wraps `local` for replica `node` (whose harness claims as `node.process_id`).
    /// Fails only when the HTTP client cannot be built.
    pub fn new(local: Arc<LocalExecutor>, store: Store, node: Arc<Node>) -> Result<Self, reqwest::Error> {
        let process_id = node.process_id.clone();
        let client = crate::net::client_builder().build()?;
        Ok(Self { local, store, node, process_id, client })
    }

    async fn forward(
        &self,
        base: &str,
        inv: &InvocationRow,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        forward_execute(&self.client, &self.node, base, &inv.id, &self.process_id, cancel).await
    }
}

/// Sends the execution of invocation `invocation_id` (claimed by process `claimed_by`) to the
/// replica at `base`: `POST <base>/internal/v1/execute` with the cluster secret, and answers
/// the owner's outcome. Errors: `owner_unreachable` when nothing was run (no secret here, the
/// connection refused, the owner refused before acting), `outcome_unknown` when the request
/// failed after it was sent (the owner may have acted; it is never sent again), `cancelled`
/// when `cancel` fired (the closed connection stops the action on the owner).
pub async fn forward_execute(
    client: &reqwest::Client,
    node: &Node,
    base: &str,
    invocation_id: &str,
    claimed_by: &str,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let Some(secret) = node.config.secret.as_deref().filter(|s| !s.is_empty()) else {
        return Err(ToolError::new(
            ErrorCode::OwnerUnreachable,
            "the resource (terminal session, stdio MCP server, device connection) lives on another replica and this one has no --cluster-secret to forward with; nothing was run",
        ));
    };
    let url = format!("{}/internal/v1/execute", base.trim_end_matches('/'));
    let body = ExecuteRequest { invocation_id: invocation_id.to_owned(), claimed_by: claimed_by.to_owned() };
    let send = client.post(&url).header(SECRET_HEADER, secret).json(&body).send();
    let response = tokio::select! {
        r = send => r,
        // Dropping the request closes the connection: the owner cancels the action.
        () = cancel.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled,
            "cancelled; the forwarded action was stopped on the owner replica")),
    };
    let unknown = |e: String| {
        ToolError::new(
            ErrorCode::OutcomeUnknown,
            format!("the forwarded action failed after it was sent to {base}: {e}"),
        )
    };
    let response = match response {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            return Err(ToolError::new(
                ErrorCode::OwnerUnreachable,
                format!("the owner replica at {base} cannot be reached ({e}); nothing was run"),
            ));
        }
        Err(e) => return Err(unknown(e.to_string())),
    };
    let status = response.status();
    let text = tokio::select! {
        t = response.text() => t.map_err(|e| unknown(e.to_string()))?,
        () = cancel.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled,
            "cancelled; the forwarded action was stopped on the owner replica")),
    };
    if !status.is_success() {
        // The owner refused before running anything (bad secret, claim no longer held…).
        return Err(ToolError::new(
            ErrorCode::OwnerUnreachable,
            format!(
                "the owner replica at {base} refused the forwarded action ({status}): {}",
                text.chars().take(300).collect::<String>()
            ),
        ));
    }
    match serde_json::from_str::<ExecuteAnswer>(&text) {
        Ok(ExecuteAnswer::Ok(out)) => Ok(out),
        Ok(ExecuteAnswer::Err(e)) => Err(e),
        Err(e) => Err(unknown(format!("unreadable answer: {e}"))),
    }
}

#[async_trait]
impl Executor for ClusterExecutor {
    async fn execute(
        &self,
        inv: &InvocationRow,
        prepared_in: Option<Workspace>,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError> {
        let store_error = |e: crate::store::StoreError| ToolError::new(ErrorCode::StoreError, e.to_string());
        if let Some((server_id, _)) = mira_core::ids::parse_mcp_projection_id(&entry.spec().id) {
            // Only stdio servers have an owner row; Streamable HTTP servers are reached from here.
            let owner = self.store.mcp_owner(server_id).await.map_err(store_error)?;
            let Some(owner) = owner.filter(|o| !(o.node_id == self.node.id && o.state == McpOwnerState::Held)) else {
                return self.local.execute(inv, prepared_in, entry, input, cancel, commit).await;
            };
            if owner.state == McpOwnerState::Lost {
                return Err(mcp_owner_gone(server_id, &owner.node_id, true));
            }
            return match self.store.replica(&owner.node_id).await.map_err(store_error)? {
                Some(r) if self.node.is_alive(&r) => {
                    commit
                        .commit()
                        .map_err(|reason| reason.error("stopped before it was forwarded; nothing was sent"))?;
                    self.forward(&r.address, inv, &cancel).await
                }
                _ => Err(mcp_owner_gone(server_id, &owner.node_id, false)),
            };
        }
        let session = (entry.spec().id == TERMINAL_TOOL && input["action"] != "start")
            .then(|| input["session_id"].as_str())
            .flatten();
        let Some(session_id) = session else {
            return self.local.execute(inv, prepared_in, entry, input, cancel, commit).await;
        };
        let row = self.store.terminal_session_for(&inv.owner_id, session_id).await.map_err(store_error)?;
        let Some(row) = row else {
            return self.local.execute(inv, prepared_in, entry, input, cancel, commit).await;
        };
        match owner(&self.store, &self.node, &row.node_id, row.state).await.map_err(store_error)? {
            Owner::Here => self.local.execute(inv, prepared_in, entry, input, cancel, commit).await,
            Owner::Gone(node) => Err(owner_gone(session_id, &node)),
            Owner::Elsewhere(base) => {
                // The owner acts from its first instruction: this side's commit point is now.
                commit.commit().map_err(|reason| reason.error("stopped before it was forwarded; nothing was run"))?;
                self.forward(&base, inv, &cancel).await
            }
        }
    }
}
