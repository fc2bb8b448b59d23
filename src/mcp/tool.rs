//! External MCP projections: each discovered tool with agent access becomes a registry
//! entry `mcp:<serverId>:tool:<toolName>` ([`McpTool`]). The MCP client itself (connections,
//! discovery, calls) is [`crate::mcp`]; this module is only the `Tool` face of it.
//!
//! The canonical input of a call is `{"arguments": {…as the Planner gave them…},
//! "definition_sha256": "<fingerprint of the definition the call was made against>"}`
//! ([`crate::mcp::definition`]), so an approval covers the arguments and the exact
//! definition the model was shown; execution refuses it (`stale_definition`) if the server
//! lists another definition by then.

use std::sync::Weak;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::mcp::definition::{self, FROZEN_ARGUMENTS, FROZEN_FINGERPRINT};
use crate::mcp::{McpManager, ServerState, projection_id};
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::store::McpToolRow;

/// A projected MCP tool.
pub struct McpTool {
    spec: ToolSpec,
    server_id: String,
    server_name: String,
    tool: String,
    annotations: Value,
    definition: Value,
    definition_sha256: String,
    manager: Weak<McpManager>,
}

impl McpTool {
    /// The projection of discovered tool `t` of the server in `state`; the error is why its
    /// stored input schema is not JSON.
    pub fn new(state: &ServerState, t: &McpToolRow, manager: Weak<McpManager>) -> Result<Self, serde_json::Error> {
        let input_schema: Value = serde_json::from_str(t.input_schema.as_deref().unwrap_or("null"))?;
        let annotations: Value =
            t.annotations.as_deref().and_then(|a| serde_json::from_str(a).ok()).unwrap_or(Value::Null);
        let title = t.title.clone().unwrap_or_else(|| t.name.clone());
        let spec = ToolSpec {
            id: projection_id(&state.row.id, &t.name),
            kind: ToolKind::McpProjection,
            domain: "mcp".into(),
            title: format!("{title} ({})", state.row.name),
            description: t
                .description
                .clone()
                .unwrap_or_else(|| format!("{} from MCP server {}", t.name, state.row.name)),
            input_schema,
            requires_approval: true,
            capability: None,
            replacement: None,
            owner: state.row.owner_id.clone(),
        };
        let definition = definition::document(t);
        Ok(Self {
            spec,
            server_id: state.row.id.clone(),
            server_name: state.row.name.clone(),
            tool: t.name.clone(),
            annotations,
            definition_sha256: definition::fingerprint_of(&definition),
            definition,
            manager,
        })
    }

    /// A hash of everything the projection shows, to notice a changed definition.
    pub fn fingerprint(&self) -> String {
        let doc = json!([
            self.spec.title,
            self.spec.description,
            self.spec.input_schema,
            self.annotations,
            self.spec.owner,
            self.definition_sha256
        ]);
        crate::evidence::sha256_hex(doc.to_string().as_bytes())
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, _ctx: &AvailabilityContext) -> Availability {
        let Some(manager) = self.manager.upgrade() else {
            return Availability::unavailable(ErrorCode::McpStopped, "the MCP client is stopped");
        };
        let Some(slot) = manager.slot(&self.server_id) else {
            return Availability::unavailable(
                ErrorCode::McpServerNotInstalled,
                format!("MCP server {} is gone", self.server_id),
            );
        };
        if slot.live.lock().is_some() {
            return Availability::Available;
        }
        let s = slot.state.read();
        // A stdio server another replica holds: usable through that replica while it lives.
        if let Some(owner) = s.owner_gone() {
            return Availability::unavailable(ErrorCode::OwnerGone, s.owner_gone_reason(owner));
        }
        if s.owner_elsewhere().is_some() && s.conn.state == crate::state::McpConnectionState::Connected {
            return Availability::Available;
        }
        Availability::unavailable(
            ErrorCode::McpNotConnected,
            format!(
                "stage connect: MCP server {} is {}{} (POST /v1/mcp/servers/{}/connect)",
                self.server_id,
                s.conn.state,
                s.conn.last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default(),
                self.server_id
            ),
        )
    }

    async fn prepare(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        if !input.is_object() {
            return Err(ToolError::new(ErrorCode::InvalidInput, "MCP tool arguments are a JSON object"));
        }
        let preview = json!({
            "mcp_server_id": self.server_id,
            "mcp_server": self.server_name,
            "mcp_tool": self.tool,
            "annotations": self.annotations,
            "definition": self.definition,
            "definition_sha256": self.definition_sha256,
            "note": "annotations are the server's own hints; every MCP call needs approval regardless",
        });
        let input = json!({FROZEN_ARGUMENTS: input, FROZEN_FINGERPRINT: self.definition_sha256});
        Ok(Prepared { input, preview })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let manager =
            self.manager.upgrade().ok_or_else(|| ToolError::new(ErrorCode::McpStopped, "the MCP client is stopped"))?;
        // The definition the call was frozen against must still be the one listed and
        // accepted now; nothing is sent otherwise.
        manager.check_frozen(&self.spec.id, input)?;
        if input.get(FROZEN_FINGERPRINT).and_then(Value::as_str) != Some(self.definition_sha256.as_str()) {
            return Err(ToolError::new(
                definition::STALE_DEFINITION,
                format!("this call of {} was frozen against another definition of the tool", self.spec.id),
            ));
        }
        let arguments = input
            .get(FROZEN_ARGUMENTS)
            .filter(|a| a.is_object())
            .ok_or_else(|| ToolError::new(ErrorCode::CorruptInput, "the frozen MCP call has no arguments object"))?;
        manager.call(&self.server_id, &self.tool, arguments, ctx).await
    }
}
