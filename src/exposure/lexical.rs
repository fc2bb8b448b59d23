//! Lexical ranking: Okapi BM25 over each tool's text ([`super::tool_text`]).
//!
//! Scoring follows Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and
//! Beyond" (2009), with the common parameters k1 = 1.2 and b = 0.75 and the non-negative
//! IDF variant ln(1 + (N − df + 0.5) / (df + 0.5)) used by Lucene. Tokens are lower-cased
//! alphanumeric runs, split at camelCase and snake_case boundaries, English stop words
//! removed, and reduced with the Snowball English stemmer. Tokenised tool texts are cached
//! by tool id and text hash, so a turn only tokenises tools that are new or changed.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rust_stemmers::{Algorithm, Stemmer};

use super::{Ranker, Strategy, tool_text};
use crate::registry::ToolSpec;

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Common English words that carry no signal for tool choice.
const STOP_WORDS: [&str; 48] = [
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "get", "has", "have", "how", "i",
    "if", "in", "into", "is", "it", "its", "me", "my", "not", "of", "on", "or", "please", "so", "that", "the", "their",
    "then", "this", "to", "use", "want", "was", "we", "what", "when", "which", "with", "you", "your", "will",
];

/// Splits text into stemmed tokens (see the module docs).
pub fn tokenize(text: &str) -> Vec<String> {
    let stemmer = Stemmer::create(Algorithm::English);
    let mut out = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        for part in split_case(word) {
            let lower = part.to_lowercase();
            if lower.is_empty() || STOP_WORDS.contains(&lower.as_str()) {
                continue;
            }
            out.push(stemmer.stem(&lower).into_owned());
        }
    }
    out
}

/// `readOpen` → [`read`, `Open`]; `HTTPServer` → [`HTTP`, `Server`].
fn split_case(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut start = 0;
    for i in 1..chars.len() {
        let (idx, c) = chars[i];
        let prev = chars[i - 1].1;
        let next_lower = chars.get(i + 1).is_some_and(|(_, n)| n.is_lowercase());
        let boundary = (prev.is_lowercase() && c.is_uppercase())
            || (prev.is_uppercase() && c.is_uppercase() && next_lower)
            || (prev.is_alphabetic() != c.is_alphabetic());
        if boundary {
            parts.push(&word[start..idx]);
            start = idx;
        }
    }
    if start < word.len() {
        parts.push(&word[start..]);
    }
    parts
}

/// A tokenised document: term frequencies and length.
struct Doc {
    text_hash: u64,
    tf: HashMap<String, u32>,
    len: u32,
}

/// BM25 ranker with a per-tool token cache.
#[derive(Default)]
pub struct Bm25Ranker {
    cache: Mutex<HashMap<String, Arc<Doc>>>,
}

impl Bm25Ranker {
    /// A ranker with an empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn doc(&self, spec: &ToolSpec) -> Arc<Doc> {
        let text = tool_text(spec);
        let text_hash = fxhash(&text);
        if let Some(doc) = self.cache.lock().get(&spec.id)
            && doc.text_hash == text_hash
        {
            return doc.clone();
        }
        let tokens = tokenize(&text);
        let mut tf = HashMap::new();
        for t in &tokens {
            *tf.entry(t.clone()).or_insert(0) += 1;
        }
        let doc = Arc::new(Doc { text_hash, tf, len: u32::try_from(tokens.len()).unwrap_or(u32::MAX) });
        let mut cache = self.cache.lock();
        if cache.len() > 100_000 {
            cache.clear();
        }
        cache.insert(spec.id.clone(), doc.clone());
        doc
    }
}

impl Ranker for Bm25Ranker {
    fn name(&self) -> String {
        "bm25".to_owned()
    }

    fn strategy(&self) -> Strategy {
        Strategy::RankedLexical
    }

    fn score(&self, query: &str, candidates: &[&ToolSpec]) -> Vec<f64> {
        let docs: Vec<Arc<Doc>> = candidates.iter().map(|s| self.doc(s)).collect();
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        bm25(&terms, &docs)
    }
}

fn bm25(terms: &[String], docs: &[Arc<Doc>]) -> Vec<f64> {
    let n = docs.len() as f64;
    if docs.is_empty() {
        return Vec::new();
    }
    let avg_len = docs.iter().map(|d| f64::from(d.len)).sum::<f64>() / n;
    let avg_len = if avg_len > 0.0 { avg_len } else { 1.0 };
    let idf: Vec<f64> = terms
        .iter()
        .map(|t| {
            let df = docs.iter().filter(|d| d.tf.contains_key(t)).count() as f64;
            (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    docs.iter()
        .map(|d| {
            let norm = K1 * (1.0 - B + B * f64::from(d.len) / avg_len);
            terms
                .iter()
                .zip(&idf)
                .map(|(t, idf)| {
                    let f = f64::from(d.tf.get(t).copied().unwrap_or(0));
                    if f == 0.0 { 0.0 } else { idf * f * (K1 + 1.0) / (f + norm) }
                })
                .sum()
        })
        .collect()
}

/// FNV-1a 64-bit, enough to notice that a tool's text changed.
fn fxhash(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::ToolKind;

    fn spec(id: &str, description: &str) -> ToolSpec {
        ToolSpec {
            id: id.to_owned(),
            kind: ToolKind::Dynamic,
            domain: "test".to_owned(),
            title: id.to_owned(),
            description: description.to_owned(),
            input_schema: serde_json::json!({"type": "object"}),
            requires_approval: false,
            capability: None,
            replacement: None,
            owner: None,
        }
    }

    #[test]
    fn tokenize_splits_case_and_stems() {
        assert_eq!(tokenize("readOpen the Files"), vec!["read", "open", "file"]);
        assert_eq!(tokenize("HTTPServer snake_case"), vec!["http", "server", "snake", "case"]);
    }

    #[test]
    fn relevant_tool_scores_highest() {
        let tools = [
            spec("weather", "Current weather forecast for a city"),
            spec("stocks", "Stock prices and market quotes"),
            spec("flights", "Search flights and airline tickets"),
        ];
        let refs: Vec<&ToolSpec> = tools.iter().collect();
        let scores = Bm25Ranker::new().score("what is the weather forecast in Paris", &refs);
        assert!(scores[0] > scores[1] && scores[0] > scores[2], "{scores:?}");
        assert_eq!(scores[1], 0.0);
    }
}
