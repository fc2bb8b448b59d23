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

use parking_lot::{Mutex, RwLock};
use rust_stemmers::{Algorithm, Stemmer};

use super::{Ranker, Strategy, tool_text};
use crate::registry::ToolSpec;

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Longest tool text tokenised, in bytes (cut at a character boundary): a tool's name,
/// description and parameters fit many times over, and a listed tool of megabytes (an MCP
/// server's description is not bounded) costs no more than this to index, nor adds more terms
/// to the shared vocabulary.
pub const MAX_LEXICAL_TEXT_BYTES: usize = 16 * 1024;

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

/// Stemmed token → term id, shared by the documents and queries scored together. Only
/// documents add terms; a query term the vocabulary lacks matches no document.
#[derive(Default)]
pub struct Vocabulary {
    ids: RwLock<HashMap<String, u32>>,
}

impl Vocabulary {
    /// An empty vocabulary.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of terms (term ids are `0..len`).
    pub fn len(&self) -> usize {
        self.ids.read().len()
    }

    /// True when no document was added yet.
    pub fn is_empty(&self) -> bool {
        self.ids.read().is_empty()
    }

    /// Tokenises a tool text (its first [`MAX_LEXICAL_TEXT_BYTES`]) into a document, adding
    /// new terms.
    pub fn doc(&self, text: &str) -> LexicalDoc {
        let tokens = tokenize(mira_embed::truncate(text, MAX_LEXICAL_TEXT_BYTES));
        let mut tf: HashMap<u32, u32> = HashMap::new();
        {
            let mut ids = self.ids.write();
            for t in &tokens {
                let next = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                let id = *ids.entry(t.clone()).or_insert(next);
                *tf.entry(id).or_insert(0) += 1;
            }
        }
        let mut terms: Vec<(u32, u32)> = tf.into_iter().collect();
        terms.sort_unstable();
        LexicalDoc { terms: terms.into_boxed_slice(), len: u32::try_from(tokens.len()).unwrap_or(u32::MAX) }
    }

    /// A vocabulary of the terms whose ids are in `used` (sorted, distinct), each numbered by
    /// its place in `used` — the numbering [`LexicalDoc::renumbered`] gives documents.
    pub fn compacted(&self, used: &[u32]) -> Vocabulary {
        let ids = self.ids.read();
        let kept = ids
            .iter()
            .filter_map(|(term, id)| {
                let place = used.binary_search(id).ok()?;
                Some((term.clone(), u32::try_from(place).unwrap_or(u32::MAX)))
            })
            .collect();
        Vocabulary { ids: RwLock::new(kept) }
    }

    /// The distinct known term ids of a query, sorted.
    pub fn query(&self, text: &str) -> Vec<u32> {
        let ids = self.ids.read();
        let mut terms: Vec<u32> = tokenize(text).iter().filter_map(|t| ids.get(t).copied()).collect();
        terms.sort_unstable();
        terms.dedup();
        terms
    }
}

/// A tokenised tool text: (term id, frequency) pairs sorted by term id, and its length in tokens.
#[derive(Debug, Clone, Default)]
pub struct LexicalDoc {
    terms: Box<[(u32, u32)]>,
    len: u32,
}

impl LexicalDoc {
    /// Its distinct term ids, ascending.
    pub fn term_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.terms.iter().map(|&(id, _)| id)
    }

    /// The same document in the numbering of [`Vocabulary::compacted`] with `used` (which
    /// holds every term id of this document). The numbering keeps the order of ids, so the
    /// terms stay sorted.
    pub fn renumbered(&self, used: &[u32]) -> LexicalDoc {
        let terms = self
            .terms
            .iter()
            .filter_map(|&(id, tf)| {
                let place = used.binary_search(&id).ok()?;
                Some((u32::try_from(place).unwrap_or(u32::MAX), tf))
            })
            .collect();
        LexicalDoc { terms, len: self.len }
    }
}

/// BM25 scores of `docs` for the query terms `query` (from [`Vocabulary::query`] of the same
/// vocabulary), with document frequencies and the average length taken over `docs` — the
/// candidates of one turn. One pass counts document frequencies, one scores; both walk each
/// document's own terms, so the cost is the candidates' total distinct terms (each looked up
/// in the query's few terms) whatever the query's length.
pub fn bm25(query: &[u32], docs: &[&LexicalDoc]) -> Vec<f64> {
    if docs.is_empty() {
        return Vec::new();
    }
    if query.is_empty() {
        return vec![0.0; docs.len()];
    }
    // Position of each term id in the query, by binary search over the sorted distinct ids (a
    // table over every id up to the query's largest would cost memory in the vocabulary's size
    // on every turn).
    let mut sorted = query.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let query = sorted.as_slice();
    let lookup = |t: u32| query.binary_search(&t).ok();
    let n = docs.len() as f64;
    let mut df = vec![0u32; query.len()];
    let mut total_len = 0.0;
    for d in docs {
        total_len += f64::from(d.len);
        for &(t, _) in d.terms.iter() {
            if let Some(s) = lookup(t) {
                df[s] += 1;
            }
        }
    }
    let avg_len = if total_len > 0.0 { total_len / n } else { 1.0 };
    let idf: Vec<f64> = df.iter().map(|&df| (1.0 + (n - f64::from(df) + 0.5) / (f64::from(df) + 0.5)).ln()).collect();
    docs.iter()
        .map(|d| {
            let norm = K1 * (1.0 - B + B * f64::from(d.len) / avg_len);
            d.terms
                .iter()
                .filter_map(|&(t, f)| {
                    lookup(t).map(|s| {
                        let f = f64::from(f);
                        idf[s] * f * (K1 + 1.0) / (f + norm)
                    })
                })
                .sum()
        })
        .collect()
}

/// A cached document and the hash of the text it was made from.
struct Cached {
    text_hash: u64,
    doc: Arc<LexicalDoc>,
}

/// BM25 ranker with a per-tool token cache (keyed by tool id, checked by a hash of the text).
#[derive(Default)]
pub struct Bm25Ranker {
    vocab: Vocabulary,
    cache: Mutex<HashMap<String, Cached>>,
}

impl Bm25Ranker {
    /// A ranker with an empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn doc(&self, spec: &ToolSpec) -> Arc<LexicalDoc> {
        let text = tool_text(spec);
        let text_hash = fxhash(&text);
        if let Some(c) = self.cache.lock().get(&spec.id)
            && c.text_hash == text_hash
        {
            return c.doc.clone();
        }
        let doc = Arc::new(self.vocab.doc(&text));
        let mut cache = self.cache.lock();
        if cache.len() > 100_000 {
            cache.clear();
        }
        cache.insert(spec.id.clone(), Cached { text_hash, doc: doc.clone() });
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
        let docs: Vec<Arc<LexicalDoc>> = candidates.iter().map(|s| self.doc(s)).collect();
        let refs: Vec<&LexicalDoc> = docs.iter().map(AsRef::as_ref).collect();
        bm25(&self.vocab.query(query), &refs)
    }
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
pub(crate) mod tests {
    use super::*;
    use crate::registry::ToolKind;

    /// A public (dynamic) tool spec with `description` and an empty object schema.
    pub(crate) fn spec(id: &str, description: &str) -> ToolSpec {
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

    #[test]
    fn a_huge_tool_text_is_indexed_up_to_the_cap() {
        let vocab = Vocabulary::new();
        // Distinct letter-only words (consonants: the stemmer leaves them alone).
        let word = |mut i: usize| {
            const LETTERS: &[u8] = b"bcdfghjklmnpqrtvwxz";
            let mut w = String::from("z");
            for _ in 0..5 {
                w.push(char::from(LETTERS[i % LETTERS.len()]));
                i /= LETTERS.len();
            }
            w
        };
        // About a megabyte of them: only the first 16 KiB are tokenised and learned.
        let text: String = (0..150_000).map(|i| word(i) + " ").collect();
        let doc = vocab.doc(&text);
        assert!(doc.len as usize <= MAX_LEXICAL_TEXT_BYTES / 6, "{}", doc.len);
        assert_eq!(vocab.len(), doc.terms.len());
        assert_eq!(vocab.query(&word(0)).len(), 1);
        assert!(vocab.query(&word(149_999)).is_empty(), "a word past the cap was learned");
    }

    #[test]
    fn query_terms_may_be_any_ids_in_any_order() {
        let vocab = Vocabulary::new();
        let docs = [vocab.doc("weather forecast city"), vocab.doc("stock market quotes")];
        let refs: Vec<&LexicalDoc> = docs.iter().collect();
        let q = vocab.query("weather quotes");
        let expected = bm25(&q, &refs);
        assert!(expected.iter().all(|&s| s > 0.0), "{expected:?}");
        // Unsorted, repeated, and an id far beyond the vocabulary (no table of its size is made).
        let mut odd = vec![u32::MAX - 1, q[1], q[0], q[1]];
        assert_eq!(bm25(&odd, &refs), expected);
        odd.clear();
        assert_eq!(bm25(&odd, &refs), vec![0.0, 0.0]);
    }
}
