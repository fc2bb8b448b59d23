//! The page of truth: every stage of a server (and of each of its tools) with
//! `ok|blocked|pending`, the reason and the action that unblocks it.

use serde::Serialize;
use serde_json::{Value, json};

use super::definition::{self, DEFINITION_CHANGED};
use super::{McpManager, ServerSlot, ServerState, projection_id};
use crate::exposure::function_name;
use crate::state::{McpConnectionState, McpToolStatus};
use crate::store::McpToolRow;

/// Where one MCP stage stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpStageStatus {
    /// The stage holds.
    Ok,
    /// The stage stops the server or tool; `action` says what unblocks it.
    Blocked,
    /// The stage waits for an earlier one (or for work in progress, like connecting).
    Pending,
}

/// One stage.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct McpStage {
    /// `install`, `enabled`, `connect`, `disclaimer`, `discover`, `agent_access`,
    /// `tool_exposure`, `approval`.
    pub stage: &'static str,
    /// `ok`, `blocked` or `pending`.
    pub status: McpStageStatus,
    /// Stable code of the reason.
    pub code: String,
    /// Why, in a sentence.
    pub reason: String,
    /// What unblocks it: `{method, path, body?}`; absent when nothing needs doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub action: Option<Value>,
}

fn stage(stage: &'static str, status: McpStageStatus, code: &str, reason: String, action: Option<Value>) -> McpStage {
    McpStage { stage, status, code: code.to_owned(), reason, action }
}

fn act(method: &str, path: String, body: Option<Value>) -> Option<Value> {
    Some(match body {
        Some(b) => json!({"method": method, "path": path, "body": b}),
        None => json!({"method": method, "path": path}),
    })
}

/// What the server's listing says about a tool in its view: the stored MCP tool status
/// (`ok`, `rejected`, `removed`), or `not_listed` for a name the server never listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolListing {
    /// Listed and usable.
    Ok,
    /// Listed but refused (see `rejection`).
    Rejected,
    /// Listed before, dropped by the server since.
    Removed,
    /// The server has never listed a tool of this name.
    NotListed,
}

impl From<McpToolStatus> for ToolListing {
    fn from(status: McpToolStatus) -> Self {
        match status {
            McpToolStatus::Ok => Self::Ok,
            McpToolStatus::Rejected => Self::Rejected,
            McpToolStatus::Removed => Self::Removed,
        }
    }
}

/// A discovered tool with its own stages.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolStatus {
    /// Name as listed by the server.
    pub name: String,
    /// Projected id `mcp:<serverId>:tool:<name>`.
    pub tool_id: String,
    /// Function name the model calls it by.
    pub function_name: String,
    /// `ok`, `rejected` or `removed`.
    pub status: ToolListing,
    /// Why it was rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<String>,
    /// Title.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Server annotations (hints only; they never lower the approval bar).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub annotations: Option<Value>,
    /// inputSchema as listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<Value>,
    /// outputSchema as listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    /// The JSON Schema dialect the inputSchema compiled as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_schema_dialect: Option<InputDialect>,
    /// Why the inputSchema compiles in no dialect: the tool is `unavailable` with
    /// `schema_unusable` (the rest of the server's tools are unaffected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_problem: Option<String>,
    /// SHA-256 of the canonical definition (name, title, description, inputSchema,
    /// outputSchema, annotations); frozen into every call, and what
    /// `PUT …/agent-access {"enabled": true, "definition_sha256"}` accepts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition_sha256: Option<String>,
    /// Present while a changed definition waits for review (`definition_changed`): the
    /// definition that had agent access and the one listed now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition_review: Option<DefinitionReview>,
    /// Agent access in force.
    pub agent_access: bool,
    /// `tool` (its own switch), `server_default`, or `definition_changed` (off until the
    /// changed definition is reviewed).
    pub agent_access_source: &'static str,
    /// Registered as a projection now.
    pub projected: bool,
    /// The stages of this tool.
    pub stages: Vec<McpStage>,
}

/// The dialect an inputSchema compiled as.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct InputDialect {
    /// `draft-04`, `draft-06`, `draft-07`, `2019-09` or `2020-12`.
    pub dialect: String,
    /// True when the schema declared it in `$schema`, false when it was inferred.
    pub declared: bool,
}

/// A changed definition waiting for the owner's review.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DefinitionReview {
    /// RFC 3339, when the change was seen.
    pub since: Option<String>,
    /// The definition that had agent access (`{name, title, description, input_schema,
    /// output_schema, annotations}`).
    #[schema(value_type = Object)]
    pub previous: Value,
    /// Its fingerprint.
    pub previous_sha256: String,
    /// The definition listed now.
    #[schema(value_type = Object)]
    pub current: Value,
    /// Its fingerprint (send it back to accept exactly this definition).
    pub current_sha256: String,
}

fn review_of(t: &McpToolRow) -> Option<DefinitionReview> {
    let previous: Value = serde_json::from_str(t.review_previous.as_deref()?).ok()?;
    let current = definition::document(t);
    Some(DefinitionReview {
        since: t.review_since.clone(),
        previous_sha256: definition::fingerprint_of(&previous),
        previous,
        current_sha256: definition::fingerprint_of(&current),
        current,
    })
}

/// `GET /v1/mcp/servers/{id}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ServerView {
    /// `mcp_…`
    pub id: String,
    /// Name.
    pub name: String,
    /// True for a deployment-wide server (admins manage it).
    pub deployment_wide: bool,
    /// `stdio` or `http`.
    pub transport: String,
    /// Transport without secret values (env/header values show only their source).
    #[schema(value_type = Object)]
    pub config: Value,
    /// Enabled.
    pub enabled: bool,
    /// Disclaimer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disclaimer: Option<String>,
    /// RFC 3339 of the acceptance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disclaimer_accepted_at: Option<String>,
    /// Agent access of tools without their own switch.
    pub default_agent_access: bool,
    /// Per-request timeout, ms.
    pub request_timeout_ms: i64,
    /// `{state, protocol_version, server_info, capabilities, last_error, stderr_tail, attempts, connected_at,
    /// discovered_at, owner}`; `owner` (stdio servers once claimed) is `{node_id, process_id, state: held|lost,
    /// live, here}`: the replica holding the process, whether it is alive, whether it is the replica answering.
    #[schema(value_type = Object)]
    pub connection: Value,
    /// Every stage of the server.
    pub stages: Vec<McpStage>,
    /// Every tool the server listed (including rejected and removed ones).
    pub tools: Vec<ToolStatus>,
    /// RFC 3339.
    pub created_at: String,
}

fn parse(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

fn base(s: &ServerState) -> Vec<McpStage> {
    let id = &s.row.id;
    let path = format!("/v1/mcp/servers/{id}");
    let mut out = vec![stage(
        "install",
        McpStageStatus::Ok,
        "installed",
        format!("installed {} by {}", s.row.created_at, s.row.installed_by),
        None,
    )];
    out.push(if s.row.enabled {
        stage("enabled", McpStageStatus::Ok, "enabled", "the server is enabled".into(), None)
    } else {
        stage(
            "enabled",
            McpStageStatus::Blocked,
            "mcp_server_disabled",
            "the server is disabled; its tools are not projected".into(),
            act("PATCH", path.clone(), Some(json!({"enabled": true}))),
        )
    });
    let c = &s.conn;
    let tail = c.stderr_tail.as_deref().map(|t| format!("; stderr: {}", t.trim_end())).unwrap_or_default();
    out.push(match c.state {
        _ if s.row.enabled && s.owner_gone().is_some() => stage(
            "connect",
            McpStageStatus::Blocked,
            "owner_gone",
            s.owner_gone().map(|o| s.owner_gone_reason(o)).unwrap_or_default(),
            act("POST", format!("{path}/connect"), None),
        ),
        McpConnectionState::Connected => stage(
            "connect",
            McpStageStatus::Ok,
            "connected",
            format!("connected, protocol version {}", c.protocol_version.as_deref().unwrap_or("?")),
            None,
        ),
        McpConnectionState::Connecting => stage(
            "connect",
            McpStageStatus::Pending,
            "mcp_connecting",
            format!(
                "connecting (attempt {}){}",
                c.attempts,
                c.last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default()
            ),
            None,
        ),
        _ if !s.row.enabled => stage(
            "connect",
            McpStageStatus::Pending,
            "mcp_server_disabled",
            "waits for the server to be enabled".into(),
            None,
        ),
        state => stage(
            "connect",
            McpStageStatus::Blocked,
            if state == McpConnectionState::Failed { "mcp_connect_failed" } else { "mcp_disconnected" },
            format!("{state}: {}{tail}", c.last_error.as_deref().unwrap_or("not connected yet")),
            act("POST", format!("{path}/connect"), None),
        ),
    });
    out.push(if s.disclaimer_pending() {
        stage(
            "disclaimer",
            McpStageStatus::Blocked,
            "mcp_disclaimer_not_accepted",
            "the server's disclaimer must be accepted before its tools are used".into(),
            act("POST", format!("{path}/disclaimer/accept"), None),
        )
    } else if s.row.disclaimer.is_some() {
        stage(
            "disclaimer",
            McpStageStatus::Ok,
            "accepted",
            format!("accepted {}", s.row.disclaimer_accepted_at.as_deref().unwrap_or("")),
            None,
        )
    } else {
        stage("disclaimer", McpStageStatus::Ok, "none", "the server carries no disclaimer".into(), None)
    });
    out
}

fn discover_stage(s: &ServerState) -> McpStage {
    let path = format!("/v1/mcp/servers/{}", s.row.id);
    let ok = s.tools.iter().filter(|t| t.status == McpToolStatus::Ok).count();
    let rejected = s.tools.iter().filter(|t| t.status == McpToolStatus::Rejected).count();
    match (&s.conn.discovered_at, &s.conn.discovery_error) {
        (_, Some(e)) => stage(
            "discover",
            McpStageStatus::Blocked,
            "mcp_discovery_failed",
            format!("tools/list failed: {e}"),
            act("POST", format!("{path}/discover"), None),
        ),
        (Some(at), None) if ok > 0 => stage(
            "discover",
            McpStageStatus::Ok,
            "discovered",
            format!("{ok} tools listed, {rejected} rejected (last listing {at})"),
            None,
        ),
        (Some(_), None) => stage(
            "discover",
            McpStageStatus::Blocked,
            "mcp_no_tools",
            format!("the server lists no usable tool ({rejected} rejected)"),
            act("POST", format!("{path}/discover"), None),
        ),
        (None, None) if matches!(s.conn.state, McpConnectionState::Connected | McpConnectionState::Connecting) => {
            stage(
                "discover",
                McpStageStatus::Pending,
                "mcp_not_discovered",
                "tools/list has not completed yet".into(),
                None,
            )
        }
        (None, None) => {
            stage("discover", McpStageStatus::Pending, "mcp_not_connected", "waits for a connection".into(), None)
        }
    }
}

/// The stages and tools of a server, whole when the viewer `manages` it, else as
/// [`super::ServerState::seen_by_user`].
pub fn server_view(manager: &McpManager, slot: &ServerSlot, manages: bool) -> ServerView {
    let s = slot.state.read().clone();
    let s = if manages { s } else { s.seen_by_user() };
    let mut stages = base(&s);
    stages.push(discover_stage(&s));
    let path = format!("/v1/mcp/servers/{}", s.row.id);
    let usable: Vec<_> = s.tools.iter().filter(|t| t.status == McpToolStatus::Ok).collect();
    let accessible = usable.iter().filter(|t| s.access_of(&t.name).0).count();
    let reviewing: Vec<&str> = usable.iter().filter(|t| t.review_previous.is_some()).map(|t| t.name.as_str()).collect();
    let review_note = if reviewing.is_empty() {
        String::new()
    } else {
        format!("; agent access is off until a person reviews the changed definition of {}", reviewing.join(", "))
    };
    stages.push(if accessible > 0 {
        stage(
            "agent_access",
            McpStageStatus::Ok,
            "agent_access_on",
            format!("{accessible} of {} tools have agent access{review_note}", usable.len()),
            None,
        )
    } else if !reviewing.is_empty() {
        stage(
            "agent_access",
            McpStageStatus::Blocked,
            DEFINITION_CHANGED,
            format!("no tool has agent access{review_note}"),
            act("PUT", format!("{path}/tools/{{tool_name}}/agent-access"), Some(json!({"enabled": true}))),
        )
    } else if usable.is_empty() {
        stage("agent_access", McpStageStatus::Pending, "mcp_no_tools", "waits for discovered tools".into(), None)
    } else {
        stage(
            "agent_access",
            McpStageStatus::Blocked,
            "mcp_agent_access_off",
            "no tool has agent access".into(),
            act("PUT", format!("{path}/tools/{{tool_name}}/agent-access"), Some(json!({"enabled": true}))),
        )
    });
    let projected =
        usable.iter().filter(|t| t.schema_problem.is_none() && manager.is_projected(&s.row.id, &t.name)).count();
    let first_blocked = stages.iter().find(|st| st.status != McpStageStatus::Ok).map(|st| (st.stage, st.code.clone()));
    stages.push(exposure_stage(&s, projected, first_blocked));
    stages.push(approval_stage());
    let tools = s.tools.iter().map(|t| tool_status(manager, &s, &t.name)).collect();
    ServerView {
        id: s.row.id.clone(),
        name: s.row.name.clone(),
        deployment_wide: s.row.owner_id.is_none(),
        transport: s.row.transport.clone(),
        config: parse(Some(&s.row.config)).unwrap_or(Value::Null),
        enabled: s.row.enabled,
        disclaimer: s.row.disclaimer.clone(),
        disclaimer_accepted_at: s.row.disclaimer_accepted_at.clone(),
        default_agent_access: s.row.default_agent_access,
        request_timeout_ms: s.row.request_timeout_ms,
        connection: json!({
            "state": s.conn.state, "protocol_version": s.conn.protocol_version,
            "server_info": parse(s.conn.server_info.as_deref()), "capabilities": parse(s.conn.capabilities.as_deref()),
            "last_error": s.conn.last_error, "stderr_tail": s.conn.stderr_tail, "attempts": s.conn.attempts,
            "connected_at": s.conn.connected_at, "discovered_at": s.conn.discovered_at, "updated_at": s.conn.updated_at,
            "owner": s.owner,
        }),
        stages,
        tools,
        created_at: s.row.created_at.clone(),
    }
}

fn exposure_stage(s: &ServerState, projected: usize, first_blocked: Option<(&'static str, String)>) -> McpStage {
    match (projected, s.conn.state, first_blocked) {
        (n, _, _) if n > 0 && s.owner_gone().is_some() => stage(
            "tool_exposure",
            McpStageStatus::Blocked,
            "owner_gone",
            format!("{n} tools are projected but unavailable: the replica holding the server's process is gone"),
            None,
        ),
        (n, McpConnectionState::Connected, _) if n > 0 => stage(
            "tool_exposure",
            McpStageStatus::Ok,
            "projected",
            format!("{n} tools are projected, public and available; each turn exposes at most 20 tools, by relevance"),
            None,
        ),
        (n, state, _) if n > 0 => stage(
            "tool_exposure",
            McpStageStatus::Blocked,
            "mcp_not_connected",
            format!("{n} tools are projected but unavailable while the server is {state}"),
            None,
        ),
        (_, _, Some((st, code))) => stage(
            "tool_exposure",
            McpStageStatus::Pending,
            &code,
            format!("no tool is projected: stage {st} does not hold"),
            None,
        ),
        _ => stage("tool_exposure", McpStageStatus::Pending, "mcp_not_projected", "no tool is projected".into(), None),
    }
}

fn approval_stage() -> McpStage {
    stage(
        "approval",
        McpStageStatus::Pending,
        "approval_per_call",
        "every call of an MCP tool waits for its own exact-invocation approval, whatever the server's annotations say"
            .into(),
        act(
            "POST",
            "/v1/approvals/{approval_id}/grant".into(),
            Some(json!({"tool_id": "…", "tool_call_id": "…", "input_hash": "…"})),
        ),
    )
}

/// One tool's status and stages (also used for `GET /v1/tools/{id}` of a projected id).
pub fn tool_status(manager: &McpManager, s: &ServerState, name: &str) -> ToolStatus {
    let id = projection_id(&s.row.id, name);
    let row = s.tools.iter().find(|t| t.name == name);
    let (access, source) = s.access_of(name);
    let projected = manager.is_projected(&s.row.id, name);
    let mut stages = base(s);
    let path = format!("/v1/mcp/servers/{}", s.row.id);
    stages.push(match row {
        Some(t) if t.status == McpToolStatus::Ok => stage(
            "discover",
            McpStageStatus::Ok,
            "discovered",
            format!("listed as it is since {}", t.discovered_at),
            None,
        ),
        Some(t) if t.status == McpToolStatus::Rejected => stage(
            "discover",
            McpStageStatus::Blocked,
            "mcp_tool_rejected",
            format!("rejected: {}", t.rejection.as_deref().unwrap_or("")),
            act("POST", format!("{path}/discover"), None),
        ),
        Some(t) => stage(
            "discover",
            McpStageStatus::Blocked,
            "mcp_tool_removed",
            format!("the server no longer lists {name} (gone since {})", t.removed_at.as_deref().unwrap_or("?")),
            act("POST", format!("{path}/discover"), None),
        ),
        None => {
            let mut d = discover_stage(s);
            if d.status == McpStageStatus::Ok {
                d = stage(
                    "discover",
                    McpStageStatus::Blocked,
                    "mcp_tool_not_listed",
                    format!("the server does not list {name}"),
                    act("POST", format!("{path}/discover"), None),
                );
            }
            d
        }
    });
    let review = row.and_then(review_of);
    stages.push(if access {
        stage("agent_access", McpStageStatus::Ok, "agent_access_on", format!("agent access is on ({source})"), None)
    } else if let Some(r) = &review {
        stage(
            "agent_access",
            McpStageStatus::Blocked,
            DEFINITION_CHANGED,
            format!(
                "the server changed the definition of {name} at {} while it had agent access; agent access is off \
                 until a person compares the previous and the current definition (definition_review) and turns it \
                 on again, which accepts the current one",
                r.since.as_deref().unwrap_or("?")
            ),
            act(
                "PUT",
                format!("{path}/tools/{name}/agent-access"),
                Some(json!({"enabled": true, "definition_sha256": r.current_sha256})),
            ),
        )
    } else {
        stage(
            "agent_access",
            McpStageStatus::Blocked,
            "mcp_agent_access_off",
            format!("agent access is off ({source})"),
            act("PUT", format!("{path}/tools/{name}/agent-access"), Some(json!({"enabled": true}))),
        )
    });
    let first_blocked = stages.iter().find(|st| st.status != McpStageStatus::Ok).map(|st| (st.stage, st.code.clone()));
    let problem = row.and_then(|t| t.schema_problem.clone());
    stages.push(match &problem {
        Some(p) if first_blocked.is_none() => stage(
            "tool_exposure",
            McpStageStatus::Blocked,
            "schema_unusable",
            format!("{name} is projected but unavailable: its inputSchema cannot be used: {p}"),
            act("POST", format!("{path}/discover"), None),
        ),
        _ => exposure_stage(s, usize::from(projected), first_blocked),
    });
    stages.push(approval_stage());
    ToolStatus {
        name: name.to_owned(),
        function_name: function_name(&id),
        tool_id: id,
        status: row.map_or(ToolListing::NotListed, |t| t.status.into()),
        rejection: row.and_then(|t| t.rejection.clone()),
        title: row.and_then(|t| t.title.clone()),
        description: row.and_then(|t| t.description.clone()),
        annotations: row.and_then(|t| parse(t.annotations.as_deref())),
        input_schema: row.and_then(|t| parse(t.input_schema.as_deref())),
        output_schema: row.and_then(|t| parse(t.output_schema.as_deref())),
        input_schema_dialect: row.and_then(|t| {
            t.schema_dialect.clone().map(|dialect| InputDialect { dialect, declared: t.schema_declared == Some(true) })
        }),
        schema_problem: problem,
        definition_sha256: row.map(definition::fingerprint),
        definition_review: review,
        agent_access: access,
        agent_access_source: source,
        projected,
        stages,
    }
}

/// A tool's status for the ladder's `mcp` field.
pub fn tool_view(manager: &McpManager, slot: &ServerSlot, name: &str, user_id: &str) -> ToolStatus {
    let s = slot.state.read().clone().seen_by(user_id);
    tool_status(manager, &s, name)
}

/// Why a projected id is not registered: the first MCP stage that blocks, as a code and a
/// sentence naming the stage and the unblocking action.
pub fn why_not_projected(s: &ServerState, tool: &str) -> (String, String) {
    let id = &s.row.id;
    if !s.row.enabled {
        return (
            "mcp_server_disabled".into(),
            format!("stage enabled: MCP server {id} is disabled (PATCH /v1/mcp/servers/{id} {{\"enabled\": true}})"),
        );
    }
    if s.disclaimer_pending() {
        return (
            "mcp_disclaimer_not_accepted".into(),
            format!(
                "stage disclaimer: the disclaimer of MCP server {id} is not accepted (POST /v1/mcp/servers/{id}/disclaimer/accept)"
            ),
        );
    }
    match s.tools.iter().find(|t| t.name == tool) {
        None if s.conn.discovered_at.is_none() => {
            return (
                "mcp_not_discovered".into(),
                format!("stage discover: MCP server {id} has not been discovered yet (connection {})", s.conn.state),
            );
        }
        None => {
            return (
                "mcp_tool_not_listed".into(),
                format!("stage discover: MCP server {id} does not list a tool {tool}"),
            );
        }
        Some(t) if t.status == McpToolStatus::Rejected => {
            return (
                "mcp_tool_rejected".into(),
                format!("stage discover: tool {tool} was rejected: {}", t.rejection.as_deref().unwrap_or("")),
            );
        }
        Some(t) if t.status == McpToolStatus::Removed => {
            return (
                "mcp_tool_removed".into(),
                format!(
                    "stage discover: MCP server {id} dropped tool {tool} at {}",
                    t.removed_at.as_deref().unwrap_or("?")
                ),
            );
        }
        Some(_) => {}
    }
    if let Some(t) = s.under_review(tool) {
        return (
            DEFINITION_CHANGED.into(),
            format!(
                "stage agent_access: MCP server {id} changed the definition of {tool} at {}; agent access is off until \
                 it is reviewed (GET /v1/mcp/servers/{id}, then PUT /v1/mcp/servers/{id}/tools/{tool}/agent-access \
                 {{\"enabled\": true}})",
                t.review_since.as_deref().unwrap_or("?")
            ),
        );
    }
    if !s.access_of(tool).0 {
        return (
            "mcp_agent_access_off".into(),
            format!(
                "stage agent_access: agent access to {tool} is off (PUT /v1/mcp/servers/{id}/tools/{tool}/agent-access {{\"enabled\": true}})"
            ),
        );
    }
    ("mcp_not_projected".into(), format!("stage tool_exposure: {tool} of MCP server {id} could not be projected"))
}
