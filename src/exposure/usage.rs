//! Learning from use: tools the Planner accepted results of in similar past turns of the
//! same user rank higher.
//!
//! The facts are already stored: a piece of evidence the Planner accepted
//! (`POST /v1/evidence/{id}/acceptance` with `accepted: true`) names its invocation, whose
//! tool and turn are known, and the turn stores its task. One such (task, tool) pair is a
//! *past use*. Nothing else is learned: a refused or unjudged result teaches nothing, and a
//! user's uses never rank another user's tools (a deployment-wide memory would let one
//! user's tasks steer what another user's model sees).
//!
//! The rule (a nearest-neighbour prior over past tasks): with `s` the cosine of this turn's
//! task embedding and a past task's, a past use counts when `s ≥` [`SIMILARITY_FLOOR`];
//! a candidate's boost is [`MAX_BOOST`] · `(s* − floor) / (1 − floor)`, `s*` the best
//! similarity among its counting uses, added to its ranking score (the hybrid's scores are
//! in [0, 1]). Only candidates get a boost, so a past use never adds a tool the ladder
//! left out; the budget of 20 and the fair shares then apply as before. The exposure
//! records, per boosted tool, how many past uses counted, the best similarity and the
//! boost ([`Learned`]), and how many past uses were consulted.
//!
//! The floor and the boost are measured with `mira bench exposure --history N`, which
//! replays N queries of the set (disjoint from the measured sample) as accepted uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::hybrid::dot;
use crate::registry::ToolSpec;

/// Below this cosine of two tasks (all-MiniLM-L6-v2) a past use says nothing about this
/// turn. Chosen with [`MAX_BOOST`] on MetaTool and bench/mcp-servers (`mira bench exposure
/// --history`, figures in docs/architecture.md): the pair that gains on MetaTool and costs
/// nothing on bench/mcp-servers, with real past uses and with misleading ones
/// (`--history-mismatched`). Lower floors gain more on MetaTool, whose tasks cluster by tool,
/// but let a use for a merely related task push the right tool down on bench/mcp-servers.
pub const SIMILARITY_FLOOR: f64 = 0.5;

/// The boost of a past use whose task is the same as this turn's (cosine 1), in units of
/// the hybrid's [0, 1] scores.
pub const MAX_BOOST: f64 = 0.5;

/// The two numbers of the rule: the similarity floor and the boost at cosine 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnRule {
    /// Past uses whose task's cosine with this turn's is below this say nothing.
    pub floor: f64,
    /// The boost of a past use with the same task.
    pub max_boost: f64,
}

impl Default for LearnRule {
    /// [`SIMILARITY_FLOOR`] and [`MAX_BOOST`].
    fn default() -> Self {
        Self { floor: SIMILARITY_FLOOR, max_boost: MAX_BOOST }
    }
}

/// Most past uses a user's history holds (the most recent distinct (task, tool) pairs).
pub const MAX_USES: usize = 256;

/// Most acceptances read to find them (the store's read is bounded by this, however much
/// evidence the user has).
pub const SCAN_ACCEPTANCES: usize = 1024;

/// One past use: a tool whose result the Planner accepted, with the embedding of the task
/// of the turn it was called in.
#[derive(Debug, Clone)]
pub struct PastUse {
    /// Registry id of the tool.
    pub tool_id: String,
    /// L2-normalised embedding of the turn's task, by [`UsageHistory::model_id`].
    pub task_vector: Arc<[f32]>,
}

/// A user's past uses, embedded by one model.
#[derive(Debug, Clone, Default)]
pub struct UsageHistory {
    /// The model the task vectors come from; a ranking by another model ignores them.
    pub model_id: String,
    /// Most recent first.
    pub uses: Vec<PastUse>,
}

/// How past uses raised one exposed tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Learned {
    /// Past uses of the tool whose task was similar enough ([`SIMILARITY_FLOOR`]).
    pub uses: u32,
    /// The best cosine of this turn's task and one of those past tasks (6 decimals).
    pub similarity: f64,
    /// What was added to the tool's ranking score (6 decimals).
    pub boost: f64,
}

/// The boosts of past uses, one per candidate (`None`: no counting use), for a turn whose
/// task embeds to `query` (L2-normalised, the history's model), under `rule`. Uses whose
/// vector has another length are ignored.
pub fn boosts(
    query: &[f32],
    history: &UsageHistory,
    candidates: &[&ToolSpec],
    rule: LearnRule,
) -> Vec<Option<Learned>> {
    let mut best: HashMap<&str, (u32, f64)> = HashMap::new();
    for u in &history.uses {
        if u.task_vector.len() != query.len() {
            continue;
        }
        let s = f64::from(dot(query, &u.task_vector));
        // NaN (a broken vector) counts as dissimilar.
        if !s.is_finite() || s < rule.floor {
            continue;
        }
        let e = best.entry(u.tool_id.as_str()).or_insert((0, f64::NEG_INFINITY));
        e.0 += 1;
        e.1 = e.1.max(s);
    }
    let round = |x: f64| (x * 1e6).round() / 1e6;
    candidates
        .iter()
        .map(|c| {
            best.get(c.id.as_str()).map(|&(uses, s)| Learned {
                uses,
                similarity: round(s.min(1.0)),
                boost: round(rule.max_boost * ((s.min(1.0) - rule.floor) / (1.0 - rule.floor).max(1e-9))),
            })
        })
        .collect()
}

/// How long a loaded history serves a user's turns before it is read again (an acceptance
/// on this replica forgets it at once; one on another replica shows within this time).
pub const HISTORY_TTL: Duration = Duration::from_secs(30);

/// Most users whose histories are kept in memory (at most [`MAX_USES`] vectors each: about
/// 0.4 MB per user with 384-dimension vectors); the least recently loaded is dropped first.
pub const MAX_CACHED_USERS: usize = 64;

/// The users' loaded histories, each kept [`HISTORY_TTL`].
#[derive(Default)]
pub struct UsageMemory {
    entries: Mutex<HashMap<String, (Instant, Arc<UsageHistory>)>>,
    /// Bumped by every [`UsageMemory::forget`]: a load that began before it keeps nothing.
    generation: AtomicU64,
    /// One load at a time (loads embed on the model's query session every turn needs).
    loading: tokio::sync::Mutex<()>,
}

impl UsageMemory {
    /// The user's history of `model_id` when it was loaded less than [`HISTORY_TTL`] ago.
    pub fn get(&self, user_id: &str, model_id: &str) -> Option<Arc<UsageHistory>> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries
            .get(user_id)
            .filter(|(at, h)| at.elapsed() < HISTORY_TTL && h.model_id == model_id)
            .map(|(_, h)| Arc::clone(h))
    }

    /// Waits for the right to load (one load at a time) and returns it with the generation
    /// to hand to [`UsageMemory::put`].
    pub async fn begin_load(&self) -> (tokio::sync::MutexGuard<'_, ()>, u64) {
        let guard = self.loading.lock().await;
        (guard, self.generation.load(Ordering::SeqCst))
    }

    /// Keeps a history loaded since `generation` (dropping the oldest beyond
    /// [`MAX_CACHED_USERS`]); nothing when a judgement came in meanwhile.
    pub fn put(&self, user_id: &str, generation: u64, history: Arc<UsageHistory>) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        if entries.len() >= MAX_CACHED_USERS && !entries.contains_key(user_id) {
            let oldest = entries.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                entries.remove(&k);
            }
        }
        entries.insert(user_id.to_owned(), (Instant::now(), history));
    }

    /// Forgets the user's history (their judgement of a result changed it), and keeps any
    /// load already under way from storing what it read.
    pub fn forget(&self, user_id: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::SeqCst);
        entries.remove(user_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{ToolKind, ToolSpec};

    fn spec(id: &str) -> ToolSpec {
        ToolSpec {
            id: id.to_owned(),
            kind: ToolKind::Public,
            domain: "test".to_owned(),
            title: id.to_owned(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            requires_approval: false,
            capability: None,
            replacement: None,
            owner: None,
        }
    }

    fn unit(v: &[f32]) -> Arc<[f32]> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect::<Vec<_>>().into()
    }

    #[test]
    fn only_similar_uses_of_candidates_count() {
        let history = UsageHistory {
            model_id: "m".into(),
            uses: vec![
                PastUse { tool_id: "a".into(), task_vector: unit(&[1.0, 0.0]) },
                PastUse { tool_id: "a".into(), task_vector: unit(&[0.9, 0.1]) },
                PastUse { tool_id: "b".into(), task_vector: unit(&[0.0, 1.0]) },
                PastUse { tool_id: "gone".into(), task_vector: unit(&[1.0, 0.0]) },
                PastUse { tool_id: "a".into(), task_vector: unit(&[1.0, 0.0, 0.0]) },
            ],
        };
        let (a, b) = (spec("a"), spec("b"));
        let out = boosts(&unit(&[1.0, 0.0]), &history, &[&a, &b], LearnRule::default());
        let la = out[0].as_ref().unwrap();
        assert_eq!(la.uses, 2);
        assert!((la.similarity - 1.0).abs() < 1e-6 && (la.boost - MAX_BOOST).abs() < 1e-6, "{la:?}");
        assert!(out[1].is_none(), "an orthogonal task teaches nothing");
        assert_eq!(out.len(), 2, "a past use of a tool that is not a candidate adds nothing");
    }

    #[test]
    fn a_broken_vector_counts_as_dissimilar() {
        let history = UsageHistory {
            model_id: "m".into(),
            uses: vec![PastUse { tool_id: "a".into(), task_vector: vec![f32::NAN, 0.0].into() }],
        };
        let a = spec("a");
        assert!(boosts(&unit(&[1.0, 0.0]), &history, &[&a], LearnRule::default())[0].is_none());
    }

    #[tokio::test]
    async fn a_judgement_during_a_load_keeps_the_load_from_storing() {
        let memory = UsageMemory::default();
        let history = Arc::new(UsageHistory { model_id: "m".into(), uses: Vec::new() });
        let (guard, generation) = memory.begin_load().await;
        memory.forget("u");
        memory.put("u", generation, Arc::clone(&history));
        drop(guard);
        assert!(memory.get("u", "m").is_none(), "read before the judgement: not kept");
        let (_guard, generation) = memory.begin_load().await;
        memory.put("u", generation, history);
        assert!(memory.get("u", "m").is_some() && memory.get("u", "other-model").is_none());
    }
}
