//! Lexical, dense and hybrid ranking over the [`ToolIndex`].
//!
//! - Lexical: BM25 ([`super::lexical`]) over the tool texts.
//! - Dense: the dot product of the query's vector and each tool's: the cosine of their
//!   embeddings by the model (a tool's is `body + 0.3 · name`, see
//!   [`mira_embed::Model::embed_tools`]), plus 0.4 × the companion encoder's when the model
//!   has one ([`QueryEmbedder::primary_dim`]).
//! - Hybrid (shipped): a fusion of both, see [`Fusion`].
//!
//! A candidate whose vector is not computed yet is ranked by its lexical part alone within
//! the hybrid (its dense part is imputed from its normalised lexical score), and the
//! exposure records it. Without a ready model every mode ranks by BM25 and says why
//! (`ranked_lexical` with a reason).

use std::sync::Arc;

use super::index::ToolIndex;
use super::lexical::bm25;
use super::{Ranker, Ranking, Strategy};
use crate::registry::ToolSpec;

/// Turns a query into a vector of the model the index's vectors come from.
pub trait QueryEmbedder: Send + Sync {
    /// The model's id when a model is ready.
    fn model_id(&self) -> Option<String>;
    /// The query's vector, or why there is none (no model, loading, failed). Its first
    /// [`QueryEmbedder::primary_dim`] dimensions are L2-normalised.
    fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedQueryError>;
    /// The leading dimensions of a vector that are the primary model's own L2-normalised
    /// vector, when the vector goes on with a companion's
    /// ([`mira_embed::Model::primary_dim`]); `None`: the whole vector. Absolute cosine
    /// thresholds ([`super::NO_SIGNAL_COSINE`], the usage floor) are measured in that part.
    fn primary_dim(&self) -> Option<usize> {
        None
    }
}

/// The part of `v` in which absolute cosine thresholds apply (see
/// [`QueryEmbedder::primary_dim`]).
pub fn primary(v: &[f32], primary_dim: Option<usize>) -> &[f32] {
    &v[..primary_dim.unwrap_or(v.len()).min(v.len())]
}

/// Why a query has no vector; its message becomes the ranking's `lexical_reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedQueryError {
    /// No model is ready: the embedding status's reason (unavailable, loading, failed).
    #[error("{0}")]
    NotReady(String),
    /// The model is ready but embedding the query failed.
    #[error("embedding the task failed: {0}; ranked by BM25")]
    Failed(#[from] mira_embed::EmbedError),
}

/// How the hybrid combines the two rankings.
///
/// The default is [`Fusion::Convex`] with dense weight 0.8: a convex combination of the
/// dense score, min–max normalised over the turn's candidates, and the BM25 score divided
/// by the turn's best BM25 score. Bruch, Gai & Ingber, "An Analysis of Fusion Functions for
/// Hybrid Retrieval" (ACM TOIS 2023) show such a combination beats reciprocal-rank fusion,
/// which throws the score gaps away: with a strong dense ranker and a weaker lexical one RRF
/// lets lexical noise push good dense hits out of the 20. Weighting dense at 0.8 keeps the
/// dense order unless BM25 is confident. On the MetaTool development set Recall@20 varies
/// by less than 0.007 for weights 0.7–0.9; `mira bench exposure` measures every set
/// against both parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// `w · dense_minmax + (1 − w) · bm25 / max bm25`.
    Convex {
        /// Dense weight `w` in [0, 1].
        dense_weight: f64,
    },
    /// Reciprocal-rank fusion, `1/(k + rank_dense) + 1/(k + rank_bm25)` (Cormack, Clarke &
    /// Büttcher, SIGIR 2009; k = 60 there). Kept for comparison in the benchmark.
    Rrf {
        /// The rank offset `k`.
        k: f64,
    },
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Convex { dense_weight: 0.8 }
    }
}

/// Why a fusion spec does not parse ([`Fusion::parse`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FusionParseError {
    /// The argument after `:` is not a number.
    #[error("bad number {arg:?} in {spec:?}: {source}")]
    BadNumber {
        /// The whole spec.
        spec: String,
        /// The argument.
        arg: String,
        /// Why it is not a number.
        source: std::num::ParseFloatError,
    },
    /// A convex weight outside [0, 1] (the spec).
    #[error("{0}: weight must be in [0, 1]")]
    WeightOutOfRange(String),
    /// Neither `convex` nor `rrf` (the spec).
    #[error("unknown fusion {0:?} (convex[:W] or rrf[:K])")]
    Unknown(String),
}

impl Fusion {
    /// Parses `convex:W` or `rrf:K` (`convex` and `rrf` alone take the defaults 0.8 and 60).
    pub fn parse(s: &str) -> Result<Fusion, FusionParseError> {
        let (kind, arg) = s.split_once(':').map_or((s, None), |(k, a)| (k, Some(a)));
        let num = |default: f64| -> Result<f64, FusionParseError> {
            arg.map_or(Ok(default), |a| {
                a.parse::<f64>().map_err(|source| FusionParseError::BadNumber {
                    spec: s.to_owned(),
                    arg: a.to_owned(),
                    source,
                })
            })
        };
        match kind {
            "convex" => {
                let w = num(0.8)?;
                if (0.0..=1.0).contains(&w) {
                    Ok(Fusion::Convex { dense_weight: w })
                } else {
                    Err(FusionParseError::WeightOutOfRange(s.to_owned()))
                }
            }
            "rrf" => Ok(Fusion::Rrf { k: num(60.0)? }),
            _ => Err(FusionParseError::Unknown(s.to_owned())),
        }
    }

    /// Short name for the exposure's `ranker` field.
    pub fn name(&self) -> String {
        match self {
            Fusion::Convex { dense_weight } => format!("convex{dense_weight}"),
            Fusion::Rrf { k } => format!("rrf{k}"),
        }
    }
}

/// Which ranking an [`IndexRanker`] produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// BM25 only.
    Lexical,
    /// Dense only (a tool without a vector takes its normalised BM25 score instead, as in
    /// the hybrid).
    Dense,
    /// The fusion of both.
    Hybrid,
}

impl Mode {
    /// `lexical`, `dense`, `hybrid`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Lexical => "lexical",
            Mode::Dense => "dense",
            Mode::Hybrid => "hybrid",
        }
    }
}

/// A ranker over the tool index (the service ships [`Mode::Hybrid`]).
pub struct IndexRanker {
    index: Arc<ToolIndex>,
    embedder: Arc<dyn QueryEmbedder>,
    mode: Mode,
    fusion: Fusion,
}

impl IndexRanker {
    /// A ranker of `mode` (with the default fusion).
    pub fn new(index: Arc<ToolIndex>, embedder: Arc<dyn QueryEmbedder>, mode: Mode) -> Self {
        Self { index, embedder, mode, fusion: Fusion::default() }
    }

    /// The same with another fusion.
    pub fn with_fusion(mut self, fusion: Fusion) -> Self {
        self.fusion = fusion;
        self
    }

    fn lexical_name() -> String {
        "bm25".to_owned()
    }
}

impl Ranker for IndexRanker {
    fn name(&self) -> String {
        match (self.mode, self.embedder.model_id()) {
            (Mode::Lexical, _) | (_, None) => Self::lexical_name(),
            (Mode::Dense, Some(m)) => format!("dense:{m}"),
            (Mode::Hybrid, Some(m)) => format!("hybrid:{}:bm25+{m}", self.fusion.name()),
        }
    }

    fn strategy(&self) -> Strategy {
        match (self.mode, self.embedder.model_id()) {
            (Mode::Lexical, _) | (_, None) => Strategy::RankedLexical,
            _ => Strategy::Ranked,
        }
    }

    fn score(&self, query: &str, candidates: &[&ToolSpec]) -> Vec<f64> {
        self.rank(query, candidates).scores
    }

    fn rank(&self, query: &str, candidates: &[&ToolSpec]) -> Ranking {
        let resolution = self.index.resolve(candidates);
        let resolved = &resolution.tools;
        let docs: Vec<&_> = resolved.iter().map(|r| r.lexical.as_ref()).collect();
        let lexical = bm25(&resolution.vocabulary.query(query), &docs);
        let matched: Vec<bool> = lexical.iter().map(|&l| l > 0.0).collect();
        let lexical_match = matched.contains(&true);
        let lexical_ranking = |reason: Option<String>| Ranking {
            scores: lexical.clone(),
            strategy: Strategy::RankedLexical,
            ranker: Self::lexical_name(),
            lexical_reason: reason,
            not_embedded: Vec::new(),
            lexical_match,
            matched: matched.clone(),
            dense_max: None,
            query_vector: None,
        };
        if self.mode == Mode::Lexical {
            return lexical_ranking(None);
        }
        let (model, q) = match (self.embedder.model_id(), self.embedder.embed_query(query)) {
            (Some(model), Ok(q)) => (model, q),
            (_, Err(reason)) => return lexical_ranking(Some(reason.to_string())),
            (None, Ok(_)) => return lexical_ranking(Some("no embedding model is ready".to_owned())),
        };
        let primary_dim = self.embedder.primary_dim();
        let lead = primary(&q, primary_dim).len();
        // (whole dot product, its primary part) per candidate with a vector of this space.
        let both: Vec<Option<(f64, f64)>> = resolved
            .iter()
            .map(|r| r.vector.as_ref().filter(|v| v.len() == q.len()).map(|v| split_dot(&q, v, lead)))
            .collect();
        let dense: Vec<Option<f64>> = both.iter().map(|b| b.map(|(whole, _)| whole)).collect();
        let dense_max = both.iter().flatten().map(|&(_, lead)| lead).reduce(f64::max);
        let not_embedded: Vec<usize> = dense.iter().enumerate().filter(|(_, d)| d.is_none()).map(|(i, _)| i).collect();
        let scores = match self.mode {
            Mode::Dense => fuse(&dense, &lexical, Fusion::Convex { dense_weight: 1.0 }),
            _ => fuse(&dense, &lexical, self.fusion),
        };
        let name = match self.mode {
            Mode::Dense => format!("dense:{model}"),
            _ => format!("hybrid:{}:bm25+{model}", self.fusion.name()),
        };
        Ranking {
            scores,
            strategy: Strategy::Ranked,
            ranker: name,
            lexical_reason: None,
            not_embedded,
            lexical_match,
            matched,
            dense_max,
            query_vector: Some((model, primary(&q, primary_dim).to_vec())),
        }
    }
}

/// Dot product (cosine for L2-normalised vectors). Eight independent accumulators let the
/// compiler vectorise the loop.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len().min(b.len()) / 8;
    for i in 0..chunks {
        for j in 0..8 {
            acc[j] += a[i * 8 + j] * b[i * 8 + j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 8..a.len().min(b.len()) {
        sum += a[i] * b[i];
    }
    sum
}

/// `(a·b, a[..lead]·b[..lead])`: a composite vector's whole dot product and its primary part
/// ([`QueryEmbedder::primary_dim`]).
pub fn split_dot(a: &[f32], b: &[f32], lead: usize) -> (f64, f64) {
    let lead = lead.min(a.len()).min(b.len());
    let head = f64::from(dot(&a[..lead], &b[..lead]));
    (head + f64::from(dot(&a[lead..], &b[lead..])), head)
}

/// Fuses dense scores (None = no vector) with BM25 scores, one per candidate.
///
/// Normalisation: dense cosines min–max over the candidates that have one; BM25 divided by
/// the turn's best BM25 (0 when nothing matched). A candidate without a vector takes its
/// normalised lexical score in place of the dense part, so it competes on the same scale.
pub fn fuse(dense: &[Option<f64>], lexical: &[f64], fusion: Fusion) -> Vec<f64> {
    let lex_max = lexical.iter().copied().fold(0.0f64, f64::max);
    let lex_norm: Vec<f64> = lexical.iter().map(|&l| if lex_max > 0.0 { l / lex_max } else { 0.0 }).collect();
    match fusion {
        Fusion::Convex { dense_weight } => {
            let (lo, hi) =
                dense.iter().flatten().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &d| (lo.min(d), hi.max(d)));
            let span = hi - lo;
            dense
                .iter()
                .zip(&lex_norm)
                .map(|(d, &l)| {
                    let d = match d {
                        Some(d) if span > 0.0 => (d - lo) / span,
                        Some(_) => 1.0,
                        None => l,
                    };
                    dense_weight * d + (1.0 - dense_weight) * l
                })
                .collect()
        }
        Fusion::Rrf { k } => {
            let dense_or_lex: Vec<f64> = dense.iter().zip(&lex_norm).map(|(d, &l)| d.unwrap_or(l - 2.0)).collect();
            let rd = ranks(&dense_or_lex);
            let rl = ranks(lexical);
            rd.iter().zip(&rl).map(|(&a, &b)| 1.0 / (k + a) + 1.0 / (k + b)).collect()
        }
    }
}

/// 1-based rank of each score (best = 1; ties share the better rank).
fn ranks(scores: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap_or(std::cmp::Ordering::Equal));
    let mut out = vec![0.0; scores.len()];
    let mut rank = 1.0;
    for (pos, &i) in order.iter().enumerate() {
        if pos > 0 && scores[i] < scores[order[pos - 1]] {
            rank = pos as f64 + 1.0;
        }
        out[i] = rank;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composite_dot_product_splits_at_the_primary_part() {
        let q = [1.0, 0.0, 0.5, 0.5];
        let t = [0.5, 2.0, 1.0, -1.0];
        assert_eq!(split_dot(&q, &t, 2), (0.5, 0.5));
        assert_eq!(split_dot(&q, &[0.5, 2.0, 1.0, 1.0], 2), (1.5, 0.5));
        // No companion: the whole vector is primary.
        assert_eq!(primary(&q, None), &q[..]);
        assert_eq!(primary(&q, Some(2)), &q[..2]);
        assert_eq!(primary(&q, Some(9)), &q[..]);
        assert_eq!(split_dot(&q, &t, 9), (0.5, 0.5));
    }

    #[test]
    fn convex_fusion_imputes_missing_vectors_from_lexical() {
        let dense = [Some(0.9), Some(0.1), None];
        let lexical = [0.0, 2.0, 4.0];
        let s = fuse(&dense, &lexical, Fusion::Convex { dense_weight: 0.7 });
        assert!((s[0] - 0.7).abs() < 1e-9, "{s:?}");
        assert!((s[1] - 0.15).abs() < 1e-9, "{s:?}");
        assert!((s[2] - 1.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn rrf_adds_reciprocal_ranks() {
        let s = fuse(&[Some(0.9), Some(0.1)], &[0.0, 1.0], Fusion::Rrf { k: 60.0 });
        assert!((s[0] - s[1]).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn fusion_parses() {
        assert_eq!(Fusion::parse("convex:0.5").unwrap(), Fusion::Convex { dense_weight: 0.5 });
        assert_eq!(Fusion::parse("rrf").unwrap(), Fusion::Rrf { k: 60.0 });
        assert!(Fusion::parse("convex:2").is_err() && Fusion::parse("max").is_err());
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.1).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.05).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }
}
