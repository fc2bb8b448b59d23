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
        let client = crate::net::cluster_client()?;
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
/// connection refused, the owner refused before acting — a redirect too: `client` is a
/// [`crate::net::cluster_client`], which follows none), `outcome_unknown` when the request
/// failed after it was sent (the owner may have acted; it is never sent again) or took
/// longer than the execution time limit plus [`crate::harness::COMMITTED_GRACE`] and
/// [`FORWARD_MARGIN`], `cancelled` when `cancel` fired (the closed connection stops the
/// action on the owner).
///
/// The errors' messages go to the user whose call it is: they name no replica address and
/// carry none of the other replica's answer; those are logged.
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
    let limit = node.execution_timeout.saturating_add(crate::harness::COMMITTED_GRACE).saturating_add(FORWARD_MARGIN);
    let send = client.post(&url).header(SECRET_HEADER, secret).timeout(limit).json(&body).send();
    let response = tokio::select! {
        r = send => r,
        // Dropping the request closes the connection: the owner cancels the action.
        () = cancel.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled,
            "cancelled; the forwarded action was stopped on the owner replica")),
    };
    let unknown = |why: &str| {
        tracing::warn!(invocation = invocation_id, replica = base, why, "a forwarded action failed after it was sent");
        ToolError::new(
            ErrorCode::OutcomeUnknown,
            "the forwarded action failed after it was sent to the owner replica; whether it ran is unknown (it is not sent again)",
        )
    };
    let response = match response {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            tracing::warn!(invocation = invocation_id, replica = base, error = %e, "the owner replica cannot be reached");
            return Err(ToolError::new(
                ErrorCode::OwnerUnreachable,
                "the owner replica cannot be reached; nothing was run",
            ));
        }
        Err(e) => return Err(unknown(&e.to_string())),
    };
    let status = response.status();
    let text = tokio::select! {
        t = response.text() => t.map_err(|e| unknown(&e.to_string()))?,
        () = cancel.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled,
            "cancelled; the forwarded action was stopped on the owner replica")),
    };
    if !status.is_success() {
        // The owner refused before running anything (bad secret, claim no longer held…), or
        // something that is not a replica answered (a redirect is never followed).
        tracing::warn!(invocation = invocation_id, replica = base, %status,
            answer = %text.chars().take(300).collect::<String>(), "the owner replica refused a forwarded action");
        return Err(ToolError::new(
            ErrorCode::OwnerUnreachable,
            format!("the owner replica refused the forwarded action ({})", status.as_u16()),
        ));
    }
    match serde_json::from_str::<ExecuteAnswer>(&text) {
        Ok(ExecuteAnswer::Ok(out)) => Ok(out),
        Ok(ExecuteAnswer::Err(e)) => Err(e),
        Err(e) => Err(unknown(&format!("unreadable answer: {e}"))),
    }
}

/// How much longer than the execution time limit and its grace a forwarded execution may
/// take before its request is abandoned (the harness stops the call itself before that).
pub const FORWARD_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use parking_lot::Mutex;
    use tokio_util::sync::CancellationToken;

    use super::{ErrorCode, SECRET_HEADER, forward_execute};
    use crate::cluster::{ClusterConfig, Node};

    type Seen = Arc<Mutex<Vec<HeaderMap>>>;

    /// A listener on loopback that records every request's headers and answers `status`
    /// with `location` (when given) and `body`; its base URL.
    async fn listener(status: StatusCode, location: Option<String>, body: &'static str) -> (String, Seen) {
        let seen: Seen = Arc::default();
        let record = Arc::clone(&seen);
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let record = Arc::clone(&record);
            let location = location.clone();
            async move {
                record.lock().push(headers);
                let mut response = (status, body).into_response();
                if let Some(to) = location {
                    response.headers_mut().insert(header::LOCATION, to.parse().unwrap());
                }
                response
            }
        });
        let socket = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", socket.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(socket, app).await });
        (base, seen)
    }

    fn node() -> Node {
        Node {
            id: "node-a".into(),
            process_id: "node-a:1".into(),
            config: ClusterConfig { secret: Some("the-cluster-secret".into()), ..ClusterConfig::default() },
            execution_timeout: Duration::from_secs(5),
        }
    }

    /// A "replica" that answers a forwarded execution with a redirect to another listener:
    /// the redirect is not followed — the other listener never sees the request, nor the
    /// cluster secret — and the forward fails `owner_unreachable`, naming neither address.
    #[tokio::test]
    async fn a_redirect_is_not_followed_and_the_secret_goes_nowhere_else() {
        let (elsewhere, seen_elsewhere) = listener(StatusCode::OK, None, "{}").await;
        for status in [StatusCode::TEMPORARY_REDIRECT, StatusCode::FOUND, StatusCode::PERMANENT_REDIRECT] {
            let to = format!("{elsewhere}/internal/v1/execute");
            let (replica, seen_replica) = listener(status, Some(to), "").await;
            let client = crate::net::cluster_client().unwrap();
            let e = forward_execute(&client, &node(), &replica, "inv_1", "node-a:1", &CancellationToken::new())
                .await
                .unwrap_err();
            assert!(
                seen_elsewhere.lock().is_empty(),
                "{status}: the redirect was followed to another listener, with headers {:?}",
                seen_elsewhere.lock()
            );
            assert_eq!(e.code, ErrorCode::OwnerUnreachable, "{status}: {e:?}");
            let asked = seen_replica.lock();
            assert_eq!(asked.len(), 1, "{status}");
            assert_eq!(asked[0].get(SECRET_HEADER).unwrap(), "the-cluster-secret");
            assert!(!e.message.contains(&replica) && !e.message.contains(&elsewhere), "{e:?}");
        }
    }

    /// A refusal or an unreachable owner is told to the user without the replica's address or
    /// any of its answer (both are logged).
    #[tokio::test]
    async fn forward_errors_name_no_replica_and_quote_no_answer() {
        let (replica, _) = listener(StatusCode::FORBIDDEN, None, "REPLICA-SIDE DETAIL 10.1.2.3").await;
        let client = crate::net::cluster_client().unwrap();
        let cancel = CancellationToken::new();
        let e = forward_execute(&client, &node(), &replica, "inv_1", "node-a:1", &cancel).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::OwnerUnreachable, "{e:?}");
        assert!(!e.message.contains("DETAIL") && !e.message.contains(&replica), "{e:?}");

        // Nothing listens there any more: the connection is refused.
        let gone = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", socket.local_addr().unwrap())
        };
        let e = forward_execute(&client, &node(), &gone, "inv_1", "node-a:1", &cancel).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::OwnerUnreachable, "{e:?}");
        assert!(!e.message.contains(&gone) && !e.message.contains("127.0.0.1"), "{e:?}");

        // An answer that is no execution answer: unknown outcome, unquoted.
        let (replica, _) = listener(StatusCode::OK, None, "not json DETAIL").await;
        let e = forward_execute(&client, &node(), &replica, "inv_1", "node-a:1", &cancel).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::OutcomeUnknown, "{e:?}");
        assert!(!e.message.contains("DETAIL") && !e.message.contains(&replica), "{e:?}");
    }
}
