//! The approval policy's registry-only part: does a call of this tool need a person's
//! decision? Rules are evaluated independently and the strictest answer wins; only registry
//! facts count (the tool's declared `requires_approval`, its kind and its domain), never the
//! input nor what a tool server says. Who may grant is the server's `approval::policy`.

use crate::tool::{ToolKind, ToolSpec};

/// Domains whose every call changes the world and therefore always needs approval.
pub const ALWAYS_APPROVE_DOMAINS: [&str; 2] = ["edit", "terminal"];

/// The policy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Runs without approval (read tools inside the workspace).
    Skip,
    /// Waits for an exact-invocation approval.
    NeedsApproval {
        /// Why, one line per rule that demanded it.
        reasons: Vec<String>,
    },
}

/// Decides for a tool (see the module docs).
pub fn decide(spec: &ToolSpec) -> Decision {
    let mut reasons = Vec::new();
    if spec.requires_approval {
        reasons.push(format!("{} requires approval for every call", spec.id));
    }
    if ALWAYS_APPROVE_DOMAINS.contains(&spec.domain.as_str()) {
        reasons.push(format!("{} tools always need approval", spec.domain));
    }
    if spec.kind == ToolKind::McpProjection {
        reasons.push("every External MCP call needs approval, whatever the server's annotations say".to_owned());
    }
    if reasons.is_empty() { Decision::Skip } else { Decision::NeedsApproval { reasons } }
}

/// True when every call of the tool waits for an exact-invocation approval: the policy's
/// answer, which is what views (tool ladder, exposure) must report — not the tool's own
/// `requires_approval` flag alone, which an MCP projection may leave false.
pub fn requires_approval(spec: &ToolSpec) -> bool {
    decide(spec) != Decision::Skip
}
