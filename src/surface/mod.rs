//! Public Surface: "is it part of today's public agent contract?"
//!
//! The core surface is a versioned list of ids in code (the 11 tools of the contract,
//! `docs/contract.md`, Public Surface). Dynamic capabilities and External MCP projections join
//! the surface when they are registered; internal, legacy and skill-private entries never
//! do. A core id with no implementation yet is simply `not_registered` on the ladder.

use crate::availability::SkillScope;
use crate::registry::{ToolKind, ToolSpec};

/// Version of the core public surface (the date of the contract it implements).
pub const SURFACE_VERSION: &str = "2026-07-30";

/// The core public tool ids, by domain: Read, Edit, Search, Terminal.
pub const CORE_PUBLIC: [&str; 11] = [
    "read_discover",
    "grep",
    "read_open",
    "codebase_explore",
    "write_file",
    "replace_block",
    "delete_path",
    "move_path",
    "web_search",
    "news_search",
    "terminal_session",
];

/// Whether a registered tool is on the public surface.
pub fn is_public(spec: &ToolSpec) -> bool {
    match spec.kind {
        ToolKind::Public => CORE_PUBLIC.contains(&spec.id.as_str()),
        ToolKind::Dynamic | ToolKind::McpProjection => true,
        ToolKind::Internal | ToolKind::Legacy | ToolKind::SkillPrivate => false,
    }
}

/// Why a registered tool is not public, as a stable code and a sentence.
pub fn why_not_public(spec: &ToolSpec) -> (&'static str, String) {
    match spec.kind {
        ToolKind::Legacy => (
            "legacy_entry",
            format!(
                "{} is a legacy compatibility entry; use {} instead",
                spec.id,
                spec.replacement.as_deref().unwrap_or("a public tool")
            ),
        ),
        ToolKind::SkillPrivate => ("skill_private", format!("{} is private to a skill runtime", spec.id)),
        ToolKind::Internal => ("internal_primitive", format!("{} is an internal primitive", spec.id)),
        ToolKind::Public | ToolKind::Dynamic | ToolKind::McpProjection => {
            ("not_on_surface", format!("{} is not on public surface {SURFACE_VERSION}", spec.id))
        }
    }
}

/// Whether a registered tool is on the surface of a context with these skills, or why not
/// (a stable code and a sentence): the skill's own private tools are on its surface whatever
/// their kind; another skill's private tools are `skill_private`; otherwise the public
/// surface ([`is_public`]), narrowed in a skill sub-run to what its manifest allows
/// (`not_in_skill_manifest`).
pub fn on_surface(spec: &ToolSpec, skills: &SkillScope) -> Result<(), (&'static str, String)> {
    if skills.private.contains(&spec.id) {
        return Ok(());
    }
    if skills.private_elsewhere.contains(&spec.id) {
        return Err(("skill_private", format!("{} is private to a skill runtime", spec.id)));
    }
    if !is_public(spec) {
        return Err(why_not_public(spec));
    }
    match (&skills.allowed_public, &skills.skill_id) {
        (Some(allowed), Some(skill)) if !allowed.contains(&spec.id) => Err((
            "not_in_skill_manifest",
            format!("{} is public but the manifest of skill {skill} does not allow it", spec.id),
        )),
        _ => Ok(()),
    }
}
