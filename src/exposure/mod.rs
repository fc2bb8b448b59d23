//! Tool Exposure: "which concrete tools did the model see this turn?"
//!
//! Candidates are the tools that are registered, public and available for the run's user
//! and device. With 20 or fewer candidates every one is exposed and no ranking code runs
//! (strategy `all`). With more, a [`Ranker`] scores them against the turn's task and the 20
//! best are exposed, best first, ties broken by tool id. This is a context budget, never a
//! permission: risk is handled by approval of the concrete call.
//!
//! The exposure document is stored with the turn verbatim, so "what did the model see" has
//! a stored answer.

pub mod ladder;
pub mod lexical;
mod names;

pub use ladder::{LadderState, ToolView};
pub use names::function_name;

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::availability::{self, Availability, AvailabilityContext};
use crate::registry::{Entry, Registry, ToolKind, ToolSpec};
use crate::surface;

/// The most tools one turn exposes (`../shared/docs/contract.md` §4).
pub const MAX_EXPOSED: usize = 20;

/// How a turn's exposure was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// ≤ 20 candidates: all exposed, nothing ranked.
    All,
    /// Ranked with embeddings (dense or hybrid).
    Ranked,
    /// Ranked lexically (BM25) only, because no embedding model is ready.
    RankedLexical,
}

/// One tool as the model saw it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExposedTool {
    /// Registry id.
    pub id: String,
    /// A name every major LLM API accepts (`^[A-Za-z0-9_-]{1,64}$`), unique in the exposure.
    pub function_name: String,
    /// Kind of implementation.
    pub kind: ToolKind,
    /// Short title.
    pub title: String,
    /// Description shown to the model.
    pub description: String,
    /// Input JSON Schema.
    #[schema(value_type = Object)]
    pub input_schema: serde_json::Value,
    /// Every call waits for an exact-invocation approval (the policy's answer:
    /// [`crate::approval::policy::requires_approval`]).
    pub requires_approval: bool,
    /// Ranking score (higher is better); absent when strategy is `all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// The stored answer to "what did the model see this turn".
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Exposure {
    /// How the tools were chosen.
    pub strategy: Strategy,
    /// Public ∧ available tools before the budget.
    pub candidate_count: usize,
    /// Public surface version in force.
    pub surface_version: String,
    /// Ranker that ordered the tools (absent for `all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranker: Option<String>,
    /// The exposed tools: sorted by id for `all`, best first when ranked.
    pub tools: Vec<ExposedTool>,
}

impl Exposure {
    /// The exposed tool with this id or function name.
    pub fn find(&self, id_or_function_name: &str) -> Option<&ExposedTool> {
        self.tools
            .iter()
            .find(|t| t.id == id_or_function_name)
            .or_else(|| self.tools.iter().find(|t| t.function_name == id_or_function_name))
    }
}

/// Orders candidates by relevance to a query. Only called with more than
/// [`MAX_EXPOSED`] candidates.
pub trait Ranker: Send + Sync {
    /// Name recorded in the exposure (`bm25`, `hybrid:…`).
    fn name(&self) -> String;
    /// The strategy this ranker amounts to right now.
    fn strategy(&self) -> Strategy;
    /// One score per candidate, same order as `candidates`; higher is more relevant.
    fn score(&self, query: &str, candidates: &[&ToolSpec]) -> Vec<f64>;
}

/// The candidates for a user and device: registered, visible to the user, public (which
/// excludes skill-private, internal and legacy entries) and available.
pub fn candidates(registry: &Registry, ctx: &AvailabilityContext) -> Vec<Entry> {
    registry
        .visible_to(&ctx.user_id)
        .into_iter()
        .filter(|e| e.spec().kind != ToolKind::SkillPrivate && surface::is_public(e.spec()))
        .filter(|e| availability::evaluate(e, ctx) == Availability::Available)
        .collect()
}

/// Computes a turn's exposure from its candidates (see the module docs).
pub fn expose(candidates: &[Entry], query: &str, ranker: &dyn Ranker) -> Exposure {
    let candidate_count = candidates.len();
    let mut specs: Vec<&ToolSpec> = candidates.iter().map(Entry::spec).collect();
    if candidate_count <= MAX_EXPOSED {
        specs.sort_by(|a, b| a.id.cmp(&b.id));
        return Exposure {
            strategy: Strategy::All,
            candidate_count,
            surface_version: surface::SURFACE_VERSION.to_owned(),
            ranker: None,
            tools: named(specs.into_iter().map(|s| (s, None)).collect()),
        };
    }
    let scores = ranker.score(query, &specs);
    let mut scored: Vec<(&ToolSpec, f64)> = specs
        .into_iter()
        .zip(scores.into_iter().chain(std::iter::repeat(f64::NEG_INFINITY)))
        .map(|(s, score)| (s, if score.is_nan() { f64::NEG_INFINITY } else { score }))
        .collect();
    scored.sort_by(|(a, sa), (b, sb)| sb.partial_cmp(sa).unwrap_or(Ordering::Equal).then_with(|| a.id.cmp(&b.id)));
    scored.truncate(MAX_EXPOSED);
    Exposure {
        strategy: ranker.strategy(),
        candidate_count,
        surface_version: surface::SURFACE_VERSION.to_owned(),
        ranker: Some(ranker.name()),
        tools: named(scored.into_iter().map(|(s, score)| (s, Some(score))).collect()),
    }
}

fn named(tools: Vec<(&ToolSpec, Option<f64>)>) -> Vec<ExposedTool> {
    let mut taken = std::collections::HashSet::new();
    tools
        .into_iter()
        .map(|(spec, score)| {
            let function_name = names::unique_function_name(&spec.id, &mut taken);
            ExposedTool {
                id: spec.id.clone(),
                function_name,
                kind: spec.kind,
                title: spec.title.clone(),
                description: spec.description.clone(),
                input_schema: spec.input_schema.clone(),
                requires_approval: crate::approval::policy::requires_approval(spec),
                score: score.map(|s| (s * 1e6).round() / 1e6),
            }
        })
        .collect()
}

/// The text a tool is ranked by: id, title, description, and the names and descriptions of
/// its input parameters (`properties` at the top level of the schema).
pub fn tool_text(spec: &ToolSpec) -> String {
    let mut text = format!("{} {} {}", spec.id, spec.title, spec.description);
    if let Some(props) = spec.input_schema.get("properties").and_then(|p| p.as_object()) {
        for (name, prop) in props {
            text.push(' ');
            text.push_str(name);
            if let Some(d) = prop.get("description").and_then(|d| d.as_str()) {
                text.push(' ');
                text.push_str(d);
            }
        }
    }
    text
}
