//! The approval policy: does this frozen call need a person's decision?
//!
//! Rules are evaluated independently and the strictest answer wins. Only registry facts
//! count — the tool's declared `requires_approval`, its kind and its domain. Nothing in the
//! input (a `"requires_approval": false` field) and nothing a tool server says (an MCP
//! `readOnlyHint`) is ever consulted, so nothing the model or a server says can lower the bar.

pub use mira_core::policy::{ALWAYS_APPROVE_DOMAINS, Decision, decide, requires_approval};

use crate::registry::ToolSpec;
pub use crate::state::ApprovalRule;

/// The rule for a call of `spec` under the deployment's four-eyes domains (`*` names every
/// domain): four-eyes when the tool's registry domain is listed. Only registry facts count,
/// as for [`decide`].
pub fn rule_for(spec: &ToolSpec, four_eyes_domains: &[String]) -> ApprovalRule {
    let listed = four_eyes_domains.iter().any(|d| d == "*" || *d == spec.domain);
    if listed { ApprovalRule::FourEyes } else { ApprovalRule::SelfApproval }
}
