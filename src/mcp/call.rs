//! `tools/call`: timeout, cancellation sent to the server, progress routing, and the result
//! shaped into output and evidence.
//!
//! Content blocks (text, image, audio, resource, resource_link) and `structuredContent` are
//! kept, within [`super::McpSettings::max_output_bytes`]: past the budget text is cut on a
//! character boundary and binary data is replaced by its size and SHA-256, with a
//! `truncation_marker`. `content_sha256` covers the whole result as received. An `isError`
//! result is a failed invocation carrying the server's text.

use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CancelledNotificationParam, ClientNotification, ClientRequest, CustomRequest};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

use super::{McpManager, ProgressRoute, stdio};
use crate::error::ErrorCode;
use crate::evidence::{EvidenceDraft, sha256_hex};
use crate::registry::{ExecContext, ToolError, ToolOutput};

fn failed(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

impl McpManager {
    /// Calls `tool` on `server_id` with `arguments` for the invocation in `ctx`.
    pub async fn call(
        &self,
        server_id: &str,
        tool: &str,
        arguments: &Value,
        ctx: &ExecContext,
    ) -> Result<ToolOutput, ToolError> {
        let slot = self.slot(server_id).ok_or_else(|| {
            ToolError::new(ErrorCode::McpServerNotInstalled, format!("MCP server {server_id} is gone"))
        })?;
        // A deployment-wide server's error details and stderr are its managers' (see
        // `ServerState::seen_by`): the caller's run, events and Planner get a sentence instead.
        let owned = slot.state.read().row.owner_id.as_deref() == Some(ctx.owner_id.as_str());
        let live = slot.live.lock().clone().ok_or_else(|| {
            let s = slot.state.read();
            let why = match (&s.conn.last_error, owned) {
                (Some(e), true) => e.as_str(),
                (Some(_), false) => super::ERROR_SHOWN_TO_MANAGERS,
                (None, _) => "not connected",
            };
            ToolError::new(ErrorCode::McpNotConnected, format!("MCP server {server_id} is {}: {why}", s.conn.state))
        })?;
        let (timeout_ms, server_name, transport) = {
            let s = slot.state.read();
            (s.row.request_timeout_ms, s.row.name.clone(), s.row.transport.clone())
        };
        let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(60_000));
        let req = ClientRequest::CustomRequest(CustomRequest::new(
            "tools/call",
            Some(json!({"name": tool, "arguments": arguments})),
        ));
        let handle = live
            .peer
            .send_request_with_option(req, PeerRequestOptions::with_timeout(timeout))
            .await
            .map_err(|e| lost(&live, &e, owned))?;
        let id_json = serde_json::to_string(&handle.id).unwrap_or_default();
        let token = super::connection::progress_key(
            &live.routes,
            &serde_json::to_string(&handle.progress_token).unwrap_or_default(),
        );
        let request_id = handle.id.clone();
        let tool_id = super::projection_id(server_id, tool);
        self.progress
            .lock()
            .insert(token.clone(), ProgressRoute::new(ctx.run_id.clone(), ctx.invocation_id.clone(), tool_id));
        // The harness drops this future when the invocation is cancelled or times out; the
        // guard then tells the server (notifications/cancelled) and forgets the progress route.
        let mut guard = CancelGuard { peer: live.peer.clone(), id: Some(request_id), token, manager: self.me.clone() };
        let outcome = tokio::select! {
            r = handle.await_response() => Some(r),
            () = ctx.cancel.cancelled() => None,
        };
        let repaired = live.facts.as_ref().is_some_and(|f| f.repaired.lock().remove(&id_json));
        let oversized = live.facts.as_ref().is_some_and(|f| f.oversized.lock().remove(&id_json));
        let result = match outcome {
            None => {
                drop(guard);
                return Err(failed(
                    ErrorCode::Cancelled,
                    "the invocation was cancelled; the MCP server was sent notifications/cancelled",
                ));
            }
            Some(r) => {
                guard.id = None;
                drop(guard);
                r
            }
        };
        let result = match result {
            Ok(r) => serde_json::to_value(r).map_err(|e| failed(ErrorCode::McpBadResult, e.to_string()))?,
            Err(ServiceError::McpError(e))
                if oversized || e.code.0 == i32::try_from(stdio::OVERSIZED_ERROR_CODE).unwrap_or(0) =>
            {
                return Err(failed(ErrorCode::McpMessageTooLarge, e.message.to_string())
                    .with_details(json!({"limit_bytes": self.settings().max_message_bytes})));
            }
            Err(ServiceError::McpError(e)) => {
                return Err(failed(
                    ErrorCode::McpError,
                    format!("the MCP server answered with error {}: {}", e.code.0, e.message),
                )
                .with_details(json!({"code": e.code.0, "data": e.data})));
            }
            Err(ServiceError::Timeout { timeout }) => {
                return Err(failed(
                    ErrorCode::McpTimeout,
                    format!(
                        "the MCP server did not answer within {} ms; it was sent notifications/cancelled",
                        timeout.as_millis()
                    ),
                ));
            }
            Err(e) => return Err(lost(&live, &e, owned)),
        };
        self.shape(result, server_id, &server_name, &transport, tool, &live.protocol_version, repaired)
    }

    #[allow(clippy::too_many_arguments)]
    fn shape(
        &self,
        result: Value,
        server_id: &str,
        server_name: &str,
        transport: &str,
        tool: &str,
        protocol_version: &str,
        repaired: bool,
    ) -> Result<ToolOutput, ToolError> {
        let content = result.get("content").cloned().unwrap_or(Value::Array(Vec::new()));
        let structured = result.get("structuredContent").cloned();
        let whole = json!({"content": content, "structuredContent": structured}).to_string();
        let total_bytes = whole.len();
        let content_sha256 = sha256_hex(whole.as_bytes());
        drop(whole);
        let texts: Vec<&str> = content
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect();
        let joined = texts.join("\n");
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let message = if joined.is_empty() {
                "the MCP tool reported an error".to_owned()
            } else {
                crate::evidence::excerpt(&joined, 4096)
            };
            return Err(failed(ErrorCode::McpToolError, message).with_details(json!({
                "server_id": server_id, "tool": tool, "content_sha256": content_sha256, "utf8_replaced": repaired,
            })));
        }
        let mut budget = self.settings().max_output_bytes;
        let mut truncated = false;
        let mut kept = Vec::new();
        for block in content.as_array().into_iter().flatten() {
            kept.push(cap_block(block, &mut budget, &mut truncated));
        }
        let structured = structured.map(|s| {
            let size = s.to_string().len();
            if size <= budget {
                budget -= size;
                s
            } else {
                truncated = true;
                json!({"omitted": true, "bytes": size})
            }
        });
        let marker = truncated.then(|| {
            format!(
                "[MCP result of {total_bytes} bytes truncated to about {} bytes; content_sha256 covers the whole result]",
                self.settings().max_output_bytes
            )
        });
        let evidence = EvidenceDraft {
            kind: "mcp_result".into(),
            provenance: json!({
                "server_id": server_id, "server_name": server_name, "transport": transport, "tool": tool,
                "protocol_version": protocol_version, "content_sha256": content_sha256, "bytes": total_bytes,
                "truncated": truncated, "utf8_replaced": repaired,
            }),
            content_sha256: content_sha256.clone(),
            excerpt: crate::evidence::excerpt(&joined, crate::evidence::EXCERPT_MAX_BYTES),
        };
        Ok(ToolOutput {
            output: json!({
                "server_id": server_id, "tool": tool, "protocol_version": protocol_version,
                "content": kept, "structured_content": structured, "is_error": false,
                "bytes": total_bytes, "content_sha256": content_sha256,
                "truncated": truncated, "truncation_marker": marker, "utf8_replaced": repaired,
            }),
            evidence: vec![evidence],
        })
    }
}

fn cap_block(block: &Value, budget: &mut usize, truncated: &mut bool) -> Value {
    let mut block = block.clone();
    for field in ["text", "data", "blob"] {
        let holder = if block.get(field).is_some() {
            Some(&mut block)
        } else {
            block.get_mut("resource").filter(|r| r.get(field).is_some())
        };
        let Some(holder) = holder else { continue };
        let Some(s) = holder.get(field).and_then(Value::as_str) else { continue };
        if s.len() <= *budget {
            *budget -= s.len();
            continue;
        }
        *truncated = true;
        if field == "text" {
            let mut end = *budget;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            let cut = s[..end].to_owned();
            let omitted = s.len() - end;
            *budget -= end;
            holder[field] = Value::String(cut);
            holder["truncated_bytes"] = json!(omitted);
        } else {
            let (len, sha) = (s.len(), sha256_hex(s.as_bytes()));
            holder[field] = Value::Null;
            holder["omitted"] = json!({"bytes": len, "sha256": sha});
        }
    }
    block
}

/// The call's connection was lost. `owned`: the caller owns the server, and so reads the
/// transport's error and the server's stderr (a deployment-wide server's are its managers').
fn lost(live: &super::connection::Live, e: &ServiceError, owned: bool) -> ToolError {
    // The supervisor checks the server now instead of at the next health check.
    let _ = live.trouble.send(format!("a call lost the connection: {e}"));
    if !owned {
        return failed(
            ErrorCode::McpConnectionLost,
            format!("the connection to the MCP server was lost during the call; {}", super::ERROR_SHOWN_TO_MANAGERS),
        );
    }
    let tail = live.stderr.as_ref().map(|s| s.text()).unwrap_or_default();
    failed(ErrorCode::McpConnectionLost, format!("the connection to the MCP server was lost during the call: {e}"))
        .with_details(json!({"stderr_tail": tail}))
}

/// Sends `notifications/cancelled` for a request that is abandoned (dropped or cancelled)
/// before its answer, and removes its progress route.
struct CancelGuard {
    peer: rmcp::service::Peer<rmcp::service::RoleClient>,
    id: Option<rmcp::model::RequestId>,
    token: String,
    manager: std::sync::Weak<McpManager>,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(m) = self.manager.upgrade() {
            m.progress.lock().remove(&self.token);
        }
        if let Some(id) = self.id.take() {
            let peer = self.peer.clone();
            let note = ClientNotification::CancelledNotification(rmcp::model::CancelledNotification::new(
                CancelledNotificationParam::new(Some(id), Some("the invocation was cancelled".into())),
            ));
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = peer.send_notification(note).await;
                });
            }
        }
    }
}
