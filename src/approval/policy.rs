//! The approval policy: does this frozen call need a person's decision?
//!
//! Rules are evaluated independently and the strictest answer wins. Only registry facts
//! count — the tool's declared `requires_approval`, its kind and its domain. Nothing in the
//! input (a `"requires_approval": false` field) and nothing a tool server says (an MCP
//! `readOnlyHint`) is ever consulted, so nothing the model or a server says can lower the bar.

use crate::registry::{ToolKind, ToolSpec};

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

/// Who may grant an approval: the rule that applied when the call was frozen. It is stored
/// with the approval and never recomputed, so a later change of the deployment's
/// `--four-eyes-domains` does not change what an existing approval demands (neither loosening
/// it for a pending call nor stranding approvals asked under the old setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    /// The user who froze the call decides (the default).
    SelfApproval,
    /// A different user decides: an admin or a user with the approver role. The requester may
    /// still deny (withdraw) the call, never grant it.
    FourEyes,
}

impl ApprovalRule {
    /// The stored text (`self_approval`, `four_eyes`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SelfApproval => "self_approval",
            Self::FourEyes => "four_eyes",
        }
    }

    /// Parses the stored text; None for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "self_approval" => Some(Self::SelfApproval),
            "four_eyes" => Some(Self::FourEyes),
            _ => None,
        }
    }
}

/// The rule for a call of `spec` under the deployment's four-eyes domains (`*` names every
/// domain): four-eyes when the tool's registry domain is listed. Only registry facts count,
/// as for [`decide`].
pub fn rule_for(spec: &ToolSpec, four_eyes_domains: &[String]) -> ApprovalRule {
    let listed = four_eyes_domains.iter().any(|d| d == "*" || *d == spec.domain);
    if listed { ApprovalRule::FourEyes } else { ApprovalRule::SelfApproval }
}
