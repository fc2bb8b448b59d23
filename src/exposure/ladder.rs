//! The state ladder of one tool: the first stage it fails, or the last it reaches.
//!
//! `not_registered` → `not_public` → `unavailable` (with a reason) → `available` (not
//! exposed in the given turn) → `exposed`. Calling all of these "tool unavailable" is the
//! failure this product exists to end, so every non-final state carries a reason.

use serde::Serialize;

use super::{ExposedTool, Exposure};
use crate::availability::{self, Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::registry::{Registry, ToolKind};
use crate::surface;

/// Where a tool stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LadderState {
    /// No implementation is registered (for this user).
    NotRegistered,
    /// Registered, but not on the public surface.
    NotPublic,
    /// Public, but not usable now.
    Unavailable,
    /// Usable, but not exposed in the given turn (or no turn given).
    Available,
    /// Exposed in the given turn.
    Exposed,
}

impl LadderState {
    /// The snake_case name, also used as the error code when a call fails at this stage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotRegistered => "not_registered",
            Self::NotPublic => "not_public",
            Self::Unavailable => "unavailable",
            Self::Available => "not_exposed",
            Self::Exposed => "exposed",
        }
    }

    /// The error code of a call refused at this stage (the code of [`Self::as_str`];
    /// `Exposed` refuses nothing and answers `not_exposed` like `Available`).
    pub fn error_code(self) -> ErrorCode {
        match self {
            Self::NotRegistered => ErrorCode::NotRegistered,
            Self::NotPublic => ErrorCode::NotPublic,
            Self::Unavailable => ErrorCode::Unavailable,
            Self::Available | Self::Exposed => ErrorCode::NotExposed,
        }
    }
}

/// A reason with a stable code.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Reason {
    /// Stable snake_case code.
    pub code: String,
    /// Human sentence.
    pub message: String,
}

/// One stage of the ladder.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StageView {
    /// `registered`, `public`, `available`, `exposed`.
    pub stage: &'static str,
    /// `ok`, `blocked`, or `not_reached` (an earlier stage blocked, or no turn was given).
    pub status: &'static str,
    /// Why it is blocked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

/// `GET /v1/tools/{id}`: a tool and where it stands.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolView {
    /// Tool id.
    pub id: String,
    /// Kind (absent when not registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    /// Domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Title.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Input JSON Schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<serde_json::Value>,
    /// Every call waits for an exact-invocation approval (the policy's answer:
    /// [`crate::approval::policy::requires_approval`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires_approval: Option<bool>,
    /// For legacy entries, the public tool to use instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// The ladder state.
    pub state: LadderState,
    /// Why the tool stops at `state` (absent when exposed, or available without a turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Exposed function name (when exposed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_name: Option<String>,
    /// Ranking score in the turn (when exposed by ranking).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Every stage with its status.
    pub stages: Vec<StageView>,
    /// For External MCP ids: the MCP stages of the tool (install, enabled, connect,
    /// disclaimer, discover, agent_access, tool_exposure, approval), as in
    /// `GET /v1/mcp/servers/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mcp: Option<serde_json::Value>,
}

const STAGES: [&str; 4] = ["registered", "public", "available", "exposed"];

/// Computes the ladder of `tool_id` for the user and device in `ctx`, and for `turn` when
/// given (its stored exposure).
pub fn view(registry: &Registry, tool_id: &str, ctx: &AvailabilityContext, turn: Option<&Exposure>) -> ToolView {
    let mut v = view_inner(registry, tool_id, ctx, turn);
    if let Some(explainer) = registry.explainer_for(tool_id) {
        v.mcp = explainer.detail(tool_id, &ctx.user_id);
    }
    v
}

fn view_inner(registry: &Registry, tool_id: &str, ctx: &AvailabilityContext, turn: Option<&Exposure>) -> ToolView {
    let Some(entry) = registry.get(tool_id, &ctx.user_id) else {
        let explained = registry.explainer_for(tool_id).and_then(|e| e.why_absent(tool_id, &ctx.user_id));
        let reason = if let Some((code, message)) = explained {
            Reason { code, message }
        } else if surface::CORE_PUBLIC.contains(&tool_id) {
            Reason {
                code: "not_implemented".into(),
                message: format!(
                    "{tool_id} is on public surface {} but no implementation is registered",
                    surface::SURFACE_VERSION
                ),
            }
        } else {
            Reason { code: "unknown_tool".into(), message: format!("no tool {tool_id} is registered") }
        };
        return finish(empty(tool_id), 0, reason);
    };
    let spec = entry.spec();
    let mut v = ToolView {
        id: spec.id.clone(),
        kind: Some(spec.kind),
        domain: Some(spec.domain.clone()),
        title: Some(spec.title.clone()),
        description: Some(spec.description.clone()),
        input_schema: Some(spec.input_schema.clone()),
        requires_approval: Some(crate::approval::policy::requires_approval(spec)),
        replacement: spec.replacement.clone(),
        ..empty(tool_id)
    };
    if spec.kind == ToolKind::SkillPrivate || !surface::is_public(spec) {
        let (code, message) = surface::why_not_public(spec);
        return finish(v, 1, Reason { code: code.into(), message });
    }
    if let Availability::Unavailable { code, message } = availability::evaluate(&entry, ctx) {
        return finish(v, 2, Reason { code: code.as_str().into(), message });
    }
    let Some(exposure) = turn else {
        v.state = LadderState::Available;
        v.stages = stage_list(3, None);
        v.stages[3].status = "not_reached";
        return v;
    };
    match exposure.tools.iter().find(|t: &&ExposedTool| t.id == spec.id) {
        Some(t) => {
            v.state = LadderState::Exposed;
            v.function_name = Some(t.function_name.clone());
            v.score = t.score;
            v.stages = stage_list(4, None);
            v
        }
        None => {
            let reason = Reason {
                code: "not_exposed".into(),
                message: format!(
                    "{} was available but not among the {} tools exposed in this turn (strategy {}, {} candidates)",
                    spec.id,
                    exposure.tools.len(),
                    exposure.strategy.as_str(),
                    exposure.candidate_count
                ),
            };
            let mut v = finish(v, 3, reason);
            v.state = LadderState::Available;
            v
        }
    }
}

fn empty(tool_id: &str) -> ToolView {
    ToolView {
        id: tool_id.to_owned(),
        kind: None,
        domain: None,
        title: None,
        description: None,
        input_schema: None,
        requires_approval: None,
        replacement: None,
        state: LadderState::NotRegistered,
        reason: None,
        function_name: None,
        score: None,
        stages: Vec::new(),
        mcp: None,
    }
}

/// Marks stages before `blocked_at` ok, `blocked_at` blocked with `reason`, later ones not reached.
fn finish(mut v: ToolView, blocked_at: usize, reason: Reason) -> ToolView {
    v.state = match blocked_at {
        0 => LadderState::NotRegistered,
        1 => LadderState::NotPublic,
        2 => LadderState::Unavailable,
        _ => LadderState::Available,
    };
    v.stages = stage_list(blocked_at, Some(reason.clone()));
    v.reason = Some(reason);
    v
}

fn stage_list(ok_until: usize, blocked: Option<Reason>) -> Vec<StageView> {
    let mut blocked = blocked;
    STAGES
        .iter()
        .enumerate()
        .map(|(i, stage)| match i.cmp(&ok_until) {
            std::cmp::Ordering::Less => StageView { stage, status: "ok", reason: None },
            std::cmp::Ordering::Equal if blocked.is_some() => {
                StageView { stage, status: "blocked", reason: blocked.take() }
            }
            _ => StageView { stage, status: "not_reached", reason: None },
        })
        .collect()
}
