//! Discover: `tools/list` with pagination, each tool checked on its own.
//!
//! A tool is rejected (and recorded with its reason) when its name is not 1–128 characters
//! of `A-Z a-z 0-9 _ - .` (the MCP 2025-11-25 tool-name guidance, minus `/`, which cannot
//! sit in a tool id path segment) or is made only of dots (`.`, `..`: a path segment of its
//! own), when its name repeats an earlier tool of the listing, when `inputSchema` is missing
//! or not an object of `"type": "object"`, or when its definition is over
//! [`MAX_DEFINITION_BYTES`]. The rest of the
//! listing still works. An `inputSchema` is compiled in the dialect it declares (or reads as,
//! [`crate::registry::schema`]); one that compiles in no dialect leaves its tool listed (`ok`)
//! but `unavailable` with `schema_unusable` and the problem, never failing the others.
//!
//! A listing of more than [`MAX_PAGES`] pages or [`MAX_LISTED_TOOLS`] tools, or one taking
//! longer than [`MAX_DISCOVERY_TIME`], fails as a whole
//! (`discovery_error`), and the previous listing stays.
//!
//! Each listing is compared with the previous one: a tool whose definition changed while it
//! had agent access goes under review ([`super::definition`]).

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::connection::{Live, request};
use super::{McpManager, ServerSlot};
use crate::state::McpToolStatus;
use crate::store::McpToolRow;

/// Most pages followed in one discovery.
pub const MAX_PAGES: usize = 100;

/// Largest definition of one tool: its title, description, inputSchema, outputSchema and
/// annotations together, in bytes (as JSON text). Every turn that exposes a tool shows the
/// Planner its definition and stores it with the exposure, so a larger one is rejected
/// (`definition_too_large`) and not kept.
pub const MAX_DEFINITION_BYTES: usize = 64 * 1024;

/// Longest name kept of a rejected tool (an invalid name may be of any length), bytes: a
/// longer one is cut and marked with its place in the listing (`…#7`).
pub const MAX_REJECTED_NAME_BYTES: usize = 128;

/// Longest a whole discovery (every page) may take: the server's supervisor waits for it, and
/// with it removal, disabling and health checks, whatever the server's request timeout.
pub const MAX_DISCOVERY_TIME: std::time::Duration = std::time::Duration::from_secs(60);

/// Most tools one listing may hold. A longer listing fails the discovery (the previous
/// listing stays): storing, indexing and embedding an unbounded listing at every re-discovery
/// would let one server hold the store's writer and the embedding worker for everyone.
pub const MAX_LISTED_TOOLS: usize = 1_000;

/// Why a discovery did not complete; its message is stored as the connection's
/// `discovery_error` and returned in `mcp_discovery_failed`.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The server is disabled (answered by the connection task without trying).
    #[error("the server is disabled")]
    Disabled,
    /// The server is not connected (answered by the connection task without trying).
    #[error("the server is not connected")]
    NotConnected,
    /// The `tools/list` request failed (transport, timeout, JSON-RPC error).
    #[error(transparent)]
    Request(#[from] rmcp::ServiceError),
    /// A `tools/list` result without a `tools` array.
    #[error("the tools/list result has no tools array")]
    NoToolsArray,
    /// More than [`MAX_PAGES`] pages.
    #[error("tools/list returned more than {MAX_PAGES} pages")]
    TooManyPages,
    /// The whole listing took longer than [`MAX_DISCOVERY_TIME`].
    #[error("tools/list took longer than {} s in all", MAX_DISCOVERY_TIME.as_secs())]
    TimedOut,
    /// More than [`MAX_LISTED_TOOLS`] tools.
    #[error("tools/list returned more than {MAX_LISTED_TOOLS} tools")]
    TooManyTools,
    /// Storing the listing failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Runs one discovery and stores it; errors are recorded on the connection row too.
pub async fn run(manager: &Arc<McpManager>, slot: &Arc<ServerSlot>, live: &Live) -> Result<(), DiscoveryError> {
    let result =
        tokio::time::timeout(MAX_DISCOVERY_TIME, list(live, slot)).await.unwrap_or(Err(DiscoveryError::TimedOut));
    let mut conn = slot.state.read().conn.clone();
    match result {
        Ok(mut listed) => {
            {
                let state = slot.state.read();
                let now = crate::ids::now();
                for row in &mut listed {
                    let old = state.tools.iter().find(|t| t.name == row.name);
                    super::definition::carry_review(old, row, state.switch_of(&row.name).0, &now);
                }
            }
            manager.store().replace_mcp_tools(&slot.id, &listed).await?;
            let tools = manager.store().mcp_tools(&slot.id).await?;
            slot.state.write().tools = tools;
            // Projections follow the new listing at once: no await between the two, so no
            // turn sees a definition the state no longer holds.
            manager.sync_projections(slot);
            conn.discovered_at = Some(crate::ids::now());
            conn.discovery_error = None;
            manager.save_conn(slot, conn).await;
            Ok(())
        }
        Err(e) => {
            conn.discovery_error = Some(e.to_string());
            manager.save_conn(slot, conn).await;
            Err(e)
        }
    }
}

async fn list(live: &Live, slot: &ServerSlot) -> Result<Vec<McpToolRow>, DiscoveryError> {
    let now = crate::ids::now();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = cursor.as_ref().map(|c| serde_json::json!({"cursor": c}));
        let page = request(live, slot, "tools/list", params).await?;
        let tools = page.get("tools").and_then(Value::as_array).ok_or(DiscoveryError::NoToolsArray)?;
        if out.len() + tools.len() > MAX_LISTED_TOOLS {
            return Err(DiscoveryError::TooManyTools);
        }
        for tool in tools {
            let index = out.len();
            out.push(check(tool, index, &mut seen, &now));
        }
        cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
        if cursor.is_none() {
            return Ok(out);
        }
    }
    Err(DiscoveryError::TooManyPages)
}

/// Whether a tool name is acceptable (see the module docs): not one made only of dots
/// (`.`, `..` would be a path segment of their own in `…/tools/{name}/…` routes).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.bytes().all(|b| b == b'.')
}

fn check(tool: &Value, index: usize, seen: &mut HashSet<String>, now: &str) -> McpToolRow {
    let text = |k: &str| tool.get(k).and_then(Value::as_str).map(str::to_owned);
    let json_of = |k: &str| tool.get(k).filter(|v| !v.is_null()).map(Value::to_string);
    let raw_name = tool.get("name").and_then(Value::as_str);
    let name = match raw_name {
        Some(n) => n.to_owned(),
        None => format!("#{index}"),
    };
    let mut row = McpToolRow {
        server_id: String::new(),
        name: name.clone(),
        status: McpToolStatus::Ok,
        rejection: None,
        title: text("title").or_else(|| tool.pointer("/annotations/title").and_then(Value::as_str).map(str::to_owned)),
        description: text("description"),
        input_schema: json_of("inputSchema"),
        output_schema: json_of("outputSchema"),
        annotations: json_of("annotations"),
        discovered_at: now.to_owned(),
        removed_at: None,
        schema_dialect: None,
        schema_declared: None,
        schema_problem: None,
        review_previous: None,
        review_since: None,
    };
    // A rejected tool keeps its (cut) name and the reason, nothing else of its definition:
    // no turn shows it, and the server's words would otherwise be stored unbounded.
    let reject = |row: &mut McpToolRow, why: String| {
        row.status = McpToolStatus::Rejected;
        row.rejection = Some(why);
        (row.title, row.description, row.input_schema, row.output_schema, row.annotations) =
            (None, None, None, None, None);
    };
    if raw_name.is_none() {
        reject(&mut row, "the tool has no name".into());
    } else if !valid_name(&name) {
        let shown = &name[..name.floor_char_boundary(MAX_REJECTED_NAME_BYTES)];
        reject(
            &mut row,
            format!("invalid_name: {shown:?} is not 1-128 characters of A-Z a-z 0-9 _ - . (and not only dots)"),
        );
        if name.len() > MAX_REJECTED_NAME_BYTES {
            // Cut, it could equal a valid name of the listing: `#` keeps it apart.
            row.name = format!("{}#{index}", &name[..name.floor_char_boundary(MAX_REJECTED_NAME_BYTES - 12)]);
        }
    } else if !seen.insert(name.clone()) {
        reject(&mut row, format!("duplicate_name: {name} was already listed by this server"));
        // Its own row, beside the first tool of that name (which stays as listed).
        row.name = format!("{name}#{index}");
    } else if let size = definition_bytes(&row)
        && size > MAX_DEFINITION_BYTES
    {
        reject(
            &mut row,
            format!("definition_too_large: the definition is {size} bytes, over the {MAX_DEFINITION_BYTES} allowed"),
        );
    } else {
        match tool.get("inputSchema") {
            None | Some(Value::Null) => reject(&mut row, "missing_input_schema: the tool has no inputSchema".into()),
            Some(schema) if !schema.is_object() => {
                reject(&mut row, format!("invalid_input_schema: inputSchema is a {}, not an object", kind(schema)))
            }
            Some(schema) if schema.get("type").and_then(Value::as_str) != Some("object") => reject(
                &mut row,
                "invalid_input_schema: inputSchema must have \"type\": \"object\" (MCP tools take named arguments)"
                    .into(),
            ),
            Some(schema) => match crate::registry::schema::compile(schema) {
                Ok(c) => {
                    row.schema_dialect = Some(c.dialect.dialect.as_str().to_owned());
                    row.schema_declared = Some(c.dialect.declared);
                }
                Err(problem) => row.schema_problem = Some(problem.0),
            },
        }
    }
    row
}

/// Bytes of a listed tool's title, description and JSON schemas and annotations.
fn definition_bytes(row: &McpToolRow) -> usize {
    [&row.title, &row.description, &row.input_schema, &row.output_schema, &row.annotations]
        .into_iter()
        .map(|f| f.as_ref().map_or(0, String::len))
        .sum()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_tools_are_rejected_with_reasons() {
        let mut seen = HashSet::new();
        let ok = check(&serde_json::json!({"name": "echo", "inputSchema": {"type": "object"}}), 0, &mut seen, "t");
        assert_eq!(ok.status, McpToolStatus::Ok);
        let dup = check(&serde_json::json!({"name": "echo", "inputSchema": {"type": "object"}}), 1, &mut seen, "t");
        assert!(dup.rejection.unwrap_or_default().starts_with("duplicate_name"));
        assert_eq!(dup.name, "echo#1", "a row of its own, never overwriting the listed `echo`");
        let none = check(&serde_json::json!({"name": "a"}), 2, &mut seen, "t");
        assert!(none.rejection.unwrap_or_default().starts_with("missing_input_schema"));
        let s = check(&serde_json::json!({"name": "b", "inputSchema": "x"}), 3, &mut seen, "t");
        assert!(s.rejection.unwrap_or_default().contains("a string"));
        let n = check(&serde_json::json!({"name": "bad name!", "inputSchema": {"type": "object"}}), 4, &mut seen, "t");
        assert!(n.rejection.unwrap_or_default().starts_with("invalid_name"));
        // Names made only of dots would be `.` / `..` segments of the tool routes.
        for dots in [".", "..", "..."] {
            let d = check(&serde_json::json!({"name": dots, "inputSchema": {"type": "object"}}), 5, &mut seen, "t");
            assert!(d.rejection.unwrap_or_default().starts_with("invalid_name"), "{dots}");
        }
        for fine in [".hidden", "a.b", "v1..2"] {
            assert!(valid_name(fine), "{fine}");
        }
        let long = check(
            &serde_json::json!({"name": "!".repeat(100_000), "description": "d".repeat(50_000), "inputSchema": {}}),
            4,
            &mut seen,
            "t",
        );
        assert!(long.name.len() <= MAX_REJECTED_NAME_BYTES && long.name.ends_with("#4"), "{}", long.name);
        assert!(long.rejection.as_deref().is_some_and(|r| r.len() < 300), "{:?}", long.rejection);
        assert!(long.description.is_none() && long.input_schema.is_none(), "nothing of a rejected tool is kept");
        let at_limit = "d".repeat(MAX_DEFINITION_BYTES - r#"{"type":"object"}"#.len());
        let fits = check(
            &serde_json::json!({"name": "fits", "description": at_limit, "inputSchema": {"type": "object"}}),
            5,
            &mut seen,
            "t",
        );
        assert_eq!(fits.status, McpToolStatus::Ok, "{:?}", fits.rejection);
        let big = check(
            &serde_json::json!({"name": "big", "description": format!("{at_limit}d"), "inputSchema": {"type": "object"}}),
            6,
            &mut seen,
            "t",
        );
        assert_eq!(
            big.rejection.as_deref(),
            Some("definition_too_large: the definition is 65537 bytes, over the 65536 allowed")
        );
        assert!(big.description.is_none() && big.input_schema.is_none(), "nothing of it is kept");
    }
}
