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

pub mod hybrid;
pub mod index;
pub mod ladder;
pub mod lexical;
mod names;
pub mod shares;
pub mod steps;
pub mod usage;

pub use ladder::LadderState;
pub use names::function_name;
pub use shares::{Inclusion, SourceShare};
pub use usage::{Learned, UsageHistory};

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::availability::{self, Availability, AvailabilityContext};
use crate::registry::{Entry, Registry, ToolKind, ToolSpec};
use crate::surface;

/// The most tools one turn exposes (`docs/contract.md`, Tool Exposure).
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

impl Strategy {
    /// The wire name (`all`, `ranked`, `ranked_lexical`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::All => "all",
            Strategy::Ranked => "ranked",
            Strategy::RankedLexical => "ranked_lexical",
        }
    }
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
    /// True when the hybrid ranked this tool by its lexical score alone because its vector
    /// was not computed yet (absent otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_embedded: bool,
    /// Where the tool comes from: `core`, `mcp:<serverId>` or `dynamic:<domain>`
    /// ([`shares::source_of`]); absent in exposures stored before sources were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Why the tool is in the exposure ([`Inclusion`]); absent in older stored exposures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inclusion: Option<Inclusion>,
    /// How the user's past uses raised the tool's score ([`usage`]); absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<Learned>,
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
    /// Why the ranking is lexical only (the embedding model's state), for `ranked_lexical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lexical_reason: Option<String>,
    /// Candidates the hybrid ranked lexically because their vectors were not computed yet
    /// (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_embedded_count: Option<usize>,
    /// Per source, for a ranked exposure: candidates, exposed, and held back by the fair
    /// shares ([`shares`]), sorted by source; empty for `all`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<SourceShare>,
    /// How many of the user's past uses were weighed ([`usage`]), when the ranking had a
    /// task embedding of the model they were embedded by; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_uses: Option<usize>,
    /// The exposed tools: sorted by id for `all`; when ranked, in the order the shares took
    /// them ([`Inclusion`]): best first within each inclusion.
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
    /// Scores with the facts the exposure records. The default asks [`Ranker::score`],
    /// [`Ranker::name`] and [`Ranker::strategy`]; rankers whose strategy can change between
    /// calls (an embedding model finishing loading) answer all at once instead.
    fn rank(&self, query: &str, candidates: &[&ToolSpec]) -> Ranking {
        Ranking {
            scores: self.score(query, candidates),
            strategy: self.strategy(),
            ranker: self.name(),
            lexical_reason: None,
            not_embedded: Vec::new(),
            lexical_match: true,
            matched: Vec::new(),
            dense_max: None,
            query_vector: None,
        }
    }
}

/// One ranking of a turn's candidates.
#[derive(Debug, Clone)]
pub struct Ranking {
    /// One score per candidate, in candidate order; higher is more relevant.
    pub scores: Vec<f64>,
    /// `ranked` or `ranked_lexical`.
    pub strategy: Strategy,
    /// Ranker name for the exposure.
    pub ranker: String,
    /// Why the ranking is lexical only, when it is.
    pub lexical_reason: Option<String>,
    /// Indexes of candidates ranked lexically within the hybrid (no vector yet).
    pub not_embedded: Vec<usize>,
    /// False when the task's words matched no candidate's text (every BM25 score 0).
    pub lexical_match: bool,
    /// Per candidate, whether the task's words match its text (BM25 above 0); empty when the
    /// ranker does not say (the fair shares then count every candidate as matching).
    pub matched: Vec<bool>,
    /// The best raw cosine of the task and a candidate, when dense scores were computed (in
    /// the primary model's part of composite vectors, [`hybrid::QueryEmbedder::primary_dim`]).
    pub dense_max: Option<f64>,
    /// The task's embedding (its primary part) and the model that made it, when dense scores
    /// were computed (past uses embedded by the same model can then raise candidates:
    /// [`usage`]).
    pub query_vector: Option<(String, Vec<f32>)>,
}

/// Below this best cosine (all-MiniLM-L6-v2) a task that matches no tool's words carries no
/// signal. Measured on the MetaTool tools (199): the task `x` reaches 0.271 at best, `do it`
/// 0.306, while "Will it rain in Lyon tomorrow? Should I take an umbrella?" (no shared word)
/// reaches 0.484 on its weather tool.
pub const NO_SIGNAL_COSINE: f64 = 0.35;

impl Ranking {
    /// True when the ranking says nothing about the task: no candidate shares a word with
    /// it, and no candidate's embedding is close ([`NO_SIGNAL_COSINE`]). The core tools are
    /// then taken first ([`Inclusion::CorePrior`]).
    pub fn without_signal(&self) -> bool {
        !self.lexical_match && self.dense_max.is_none_or(|m| m < NO_SIGNAL_COSINE)
    }
}

/// The candidates for a user and device: registered, visible to the user, on the surface
/// of the context ([`surface::on_surface`]: public, which excludes skill-private, internal
/// and legacy entries — in a skill sub-run, the skill's private tools and the public ones
/// its manifest allows) and available.
pub fn candidates(registry: &Registry, ctx: &AvailabilityContext) -> Vec<Entry> {
    registry
        .visible_to(&ctx.user_id)
        .into_iter()
        .filter(|e| surface::on_surface(e.spec(), &ctx.skills).is_ok())
        .filter(|e| availability::evaluate(e, ctx) == Availability::Available)
        .collect()
}

/// Computes a turn's exposure from its candidates (see the module docs), raising the
/// candidates of similar past uses when `history` is given ([`usage`]).
pub fn expose(candidates: &[Entry], query: &str, ranker: &dyn Ranker, history: Option<&UsageHistory>) -> Exposure {
    let candidate_count = candidates.len();
    let mut specs: Vec<&ToolSpec> = candidates.iter().map(Entry::spec).collect();
    if candidate_count <= MAX_EXPOSED {
        specs.sort_by(|a, b| a.id.cmp(&b.id));
        return Exposure {
            strategy: Strategy::All,
            candidate_count,
            surface_version: surface::SURFACE_VERSION.to_owned(),
            ranker: None,
            lexical_reason: None,
            not_embedded_count: None,
            shares: Vec::new(),
            past_uses: None,
            tools: named(specs.into_iter().map(|s| (s, None, false, Inclusion::All, None)).collect()),
        };
    }
    let mut ranking = ranker.rank(query, &specs);
    let (past_uses, learned) = learn(&mut ranking, history, &specs, usage::LearnRule::default());
    let mut lexical_only = vec![false; candidate_count];
    for &i in &ranking.not_embedded {
        if let Some(flag) = lexical_only.get_mut(i) {
            *flag = true;
        }
    }
    let order = top_k(&ranking.scores, &specs, candidate_count);
    let sources: Vec<String> = specs.iter().map(|s| shares::source_of(s)).collect();
    let selection = shares::select(&order, &sources, &ranking.matched, ranking.without_signal(), MAX_EXPOSED);
    Exposure {
        strategy: ranking.strategy,
        candidate_count,
        surface_version: surface::SURFACE_VERSION.to_owned(),
        ranker: Some(ranking.ranker),
        lexical_reason: ranking.lexical_reason,
        not_embedded_count: (!ranking.not_embedded.is_empty()).then_some(ranking.not_embedded.len()),
        shares: selection.shares,
        past_uses,
        tools: named(
            selection
                .taken
                .into_iter()
                .map(|(i, score, why)| (specs[i], Some(score), lexical_only[i], why, learned.get(i).cloned().flatten()))
                .collect(),
        ),
    }
}

/// Adds the boosts of `history`'s similar past uses to the ranking's scores ([`usage`]), when
/// the ranking embedded the task with the model the history was embedded by, under `rule`.
/// Returns how many past uses were weighed (None when none could be) and each candidate's
/// boost.
pub fn learn(
    ranking: &mut Ranking,
    history: Option<&UsageHistory>,
    specs: &[&ToolSpec],
    rule: usage::LearnRule,
) -> (Option<usize>, Vec<Option<Learned>>) {
    let (Some(history), Some((model, q))) = (history, ranking.query_vector.as_ref()) else {
        return (None, Vec::new());
    };
    if *model != history.model_id {
        return (None, Vec::new());
    }
    let learned = usage::boosts(q, history, specs, rule);
    for (score, l) in ranking.scores.iter_mut().zip(&learned) {
        if let Some(l) = l {
            *score += l.boost;
        }
    }
    (Some(history.uses.len()), learned)
}

/// The `k` best candidates as (index, score), best first; NaN and missing scores rank last,
/// ties are broken by tool id so the same inputs always give the same order.
pub fn top_k(scores: &[f64], specs: &[&ToolSpec], k: usize) -> Vec<(usize, f64)> {
    let mut scored: Vec<(usize, f64)> = (0..specs.len())
        .map(|i| {
            let s = scores.get(i).copied().unwrap_or(f64::NEG_INFINITY);
            (i, if s.is_nan() { f64::NEG_INFINITY } else { s })
        })
        .collect();
    let order = |(a, sa): &(usize, f64), (b, sb): &(usize, f64)| {
        sb.partial_cmp(sa).unwrap_or(Ordering::Equal).then_with(|| specs[*a].id.cmp(&specs[*b].id))
    };
    if scored.len() > k {
        scored.select_nth_unstable_by(k, order);
        scored.truncate(k);
    }
    scored.sort_by(order);
    scored
}

/// One exposed tool before naming: spec, score, ranked lexically, inclusion, learned boost.
type Placed<'a> = (&'a ToolSpec, Option<f64>, bool, Inclusion, Option<Learned>);

fn named(tools: Vec<Placed<'_>>) -> Vec<ExposedTool> {
    let mut taken = std::collections::HashSet::new();
    tools
        .into_iter()
        .map(|(spec, score, not_embedded, inclusion, learned)| {
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
                not_embedded,
                source: Some(shares::source_of(spec)),
                inclusion: Some(inclusion),
                learned,
            }
        })
        .collect()
}

/// The text a tool is ranked by (BM25 document, embedding cache key): its name field and
/// its body field ([`tool_fields`]) joined by `. `.
pub fn tool_text(spec: &ToolSpec) -> String {
    let (name, body) = tool_fields(spec);
    if body.is_empty() { name } else { format!("{name}. {body}") }
}

/// The two fields of a tool's text:
/// - name: the id with its word boundaries (`_`, `-`, `:`, `.`, `/`, camelCase) turned into
///   spaces, plus the title when it says more than the id;
/// - body: the description, then each top-level input parameter (`properties` of the
///   schema) as `name: description`.
///
/// Dense ranking embeds the two separately (see [`crate::embedding::model::Model::embed_tools`]).
pub fn tool_fields(spec: &ToolSpec) -> (String, String) {
    let mut name = humanize(&spec.id);
    let squash = |s: &str| s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    if !spec.title.is_empty() && squash(&spec.title) != squash(&spec.id) {
        name.push_str(". ");
        name.push_str(&spec.title);
    }
    let mut body = spec.description.trim().to_owned();
    if let Some(props) = spec.input_schema.get("properties").and_then(|p| p.as_object()) {
        for (param, prop) in props {
            if !body.is_empty() {
                body.push_str(if body.ends_with('.') { " " } else { ". " });
            }
            body.push_str(&humanize(param));
            if let Some(d) = prop.get("description").and_then(|d| d.as_str()) {
                body.push_str(": ");
                body.push_str(d.trim());
            }
        }
    }
    (name, body)
}

/// `read_open` → `read open`; `getWeatherForecast` → `get Weather Forecast`; `mcp:srv:tool:x` → `mcp srv tool x`.
fn humanize(id: &str) -> String {
    let mut out = String::with_capacity(id.len() + 4);
    let mut prev: Option<char> = None;
    for c in id.chars() {
        if matches!(c, '_' | '-' | ':' | '.' | '/') {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
        } else {
            if prev.is_some_and(|p| p.is_lowercase() && c.is_uppercase()) && !out.ends_with(' ') {
                out.push(' ');
            }
            out.push(c);
        }
        prev = Some(c);
    }
    out.trim_end().to_owned()
}
