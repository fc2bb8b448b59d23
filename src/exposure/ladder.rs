//! The state ladder of one tool: the first stage it fails, or the last it reaches.
//!
//! `not_registered` → `not_public` → `unavailable` (with a reason) → `available` (not
//! exposed in the given turn) → `exposed`. Calling all of these "tool unavailable" is the
//! failure this product exists to end, so every non-final state carries a reason.

use serde::Serialize;

use super::{ExposedTool, Exposure};
use crate::availability::{self, Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::registry::Registry;
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Reason {
    /// Stable snake_case code.
    pub code: String,
    /// Human sentence.
    pub message: String,
}

/// Where a tool stands: the state, how many stages it passed, why it stops, and how the
/// turn exposed it. The HTTP view of a tool (`GET /v1/tools/{id}`) is built from this.
#[derive(Debug, Clone, PartialEq)]
pub struct Ladder {
    /// The state.
    pub state: LadderState,
    /// How many of the stages `registered`, `public`, `available`, `exposed` hold (0–4);
    /// when `reason` is set, the stage at this index is the one that blocks.
    pub reached: usize,
    /// Why the tool stops at `state` (absent when exposed, or available without a turn).
    pub reason: Option<Reason>,
    /// How the turn exposed it (when exposed).
    pub exposed: Option<ExposedAs>,
}

/// How a turn exposed a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ExposedAs {
    /// The function name the model calls it by.
    pub function_name: String,
    /// Ranking score in the turn (when exposed by ranking).
    pub score: Option<f64>,
}

/// A call's tool is not exposed in its turn: the state it stops at and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// The state (never `exposed`); [`LadderState::as_str`] is the error code of the call.
    pub state: LadderState,
    /// Why.
    pub reason: Reason,
}

impl Ladder {
    fn blocked_at(reached: usize, reason: Reason) -> Self {
        let state = match reached {
            0 => LadderState::NotRegistered,
            1 => LadderState::NotPublic,
            2 => LadderState::Unavailable,
            _ => LadderState::Available,
        };
        Self { state, reached, reason: Some(reason), exposed: None }
    }
}

/// Computes the ladder of `tool_id` for the user and device in `ctx`, and for `turn` when
/// given (its stored exposure).
pub fn evaluate(registry: &Registry, tool_id: &str, ctx: &AvailabilityContext, turn: Option<&Exposure>) -> Ladder {
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
        return Ladder::blocked_at(0, reason);
    };
    let spec = entry.spec();
    if let Err((code, message)) = surface::on_surface(spec, &ctx.skills) {
        return Ladder::blocked_at(1, Reason { code: code.into(), message });
    }
    if let Availability::Unavailable { code, message } = availability::evaluate(&entry, ctx) {
        return Ladder::blocked_at(2, Reason { code: code.as_str().into(), message });
    }
    let Some(exposure) = turn else {
        return Ladder { state: LadderState::Available, reached: 3, reason: None, exposed: None };
    };
    match exposure.tools.iter().find(|t: &&ExposedTool| t.id == spec.id) {
        Some(t) => Ladder {
            state: LadderState::Exposed,
            reached: 4,
            reason: None,
            exposed: Some(ExposedAs { function_name: t.function_name.clone(), score: t.score }),
        },
        None => Ladder::blocked_at(
            3,
            Reason {
                code: "not_exposed".into(),
                message: format!(
                    "{} was available but not among the {} tools exposed in this turn (strategy {}, {} candidates)",
                    spec.id,
                    exposure.tools.len(),
                    exposure.strategy.as_str(),
                    exposure.candidate_count
                ),
            },
        ),
    }
}

/// Whether a call of `tool_id` in the turn whose exposure is `turn` may be frozen: Ok when
/// the tool is exposed, else the stage that blocks it and why.
pub fn check(registry: &Registry, tool_id: &str, ctx: &AvailabilityContext, turn: &Exposure) -> Result<(), Blocked> {
    let ladder = evaluate(registry, tool_id, ctx, Some(turn));
    match (ladder.state, ladder.reason) {
        (LadderState::Exposed, _) => Ok(()),
        (state, Some(reason)) => Err(Blocked { state, reason }),
        // Not reached: with a turn, every state but `exposed` carries its reason.
        (state, None) => Err(Blocked {
            state,
            reason: Reason { code: state.as_str().to_owned(), message: format!("{tool_id} cannot be called") },
        }),
    }
}
