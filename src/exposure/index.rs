//! The tool index: what ranking needs of every registered tool, computed once per
//! registration instead of once per turn.
//!
//! Per tool: its text ([`super::tool_text`]) and the text's SHA-256, its BM25 document,
//! and its embedding vector once the background worker ([`crate::embedding::worker`]) has
//! one. The index keeps the registered `Arc<dyn Tool>` itself, so "is this candidate the
//! tool that was indexed" is a pointer comparison: a re-registered tool is a new object,
//! and an indexed object stays alive (its address cannot be reused) while indexed.
//!
//! Readers take a snapshot (`Arc` of the map and its vocabulary) and never wait for the
//! worker; the worker is the only writer (writes are serialised by a mutex, copy-on-write on
//! the map).
//!
//! The BM25 vocabulary only grows while tools come and go (a new text adds its new terms), so
//! a server whose tools keep changing their descriptions would grow it without end. When a
//! sync finds the vocabulary more than twice the terms its indexed documents use (plus
//! [`VOCABULARY_SLACK`]), it compacts it: a new vocabulary of the used terms only, every
//! document's term ids mapped onto it, published with the map in one snapshot — so a turn
//! always scores documents and its query against the same vocabulary. Each compaction costs
//! the index's terms once, after at least as many terms were added.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};

use super::lexical::{LexicalDoc, Vocabulary};
use super::tool_text;
use crate::registry::{Registry, Tool, ToolSpec};

/// One indexed tool.
pub struct IndexedTool {
    tool: Arc<dyn Tool>,
    /// The tool text (full; the model cuts it, see [`crate::embedding::model::MAX_EMBED_TEXT_BYTES`]).
    pub text: Arc<str>,
    /// Name and body fields of the text ([`super::tool_fields`]), embedded separately.
    pub fields: Arc<(String, String)>,
    /// Lowercase hex SHA-256 of `text`: the embedding cache key with the model id.
    pub text_sha256: String,
    /// BM25 document.
    pub lexical: Arc<LexicalDoc>,
    /// The tool's vector by the loaded model ([`mira_embed::Model::embed_tools`]), once computed.
    pub vector: Option<Arc<[f32]>>,
}

impl IndexedTool {
    /// The tool's id.
    pub fn id(&self) -> &str {
        &self.tool.spec().id
    }

    /// The tool's owner (None: a tool of every user).
    pub fn owner(&self) -> Option<&str> {
        self.tool.spec().owner.as_deref()
    }
}

/// What ranking uses of one candidate.
pub struct Resolved {
    /// BM25 document (from the index, or made on the spot for a tool not indexed yet).
    pub lexical: Arc<LexicalDoc>,
    /// Vector, when the candidate is indexed and embedded.
    pub vector: Option<Arc<[f32]>>,
}

/// Counts for `/readyz`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCounts {
    /// Tools in the index.
    pub indexed: usize,
    /// Of those, tools with a vector.
    pub embedded: usize,
}

type ToolMap = HashMap<String, Arc<IndexedTool>>;

/// Terms a vocabulary may hold beyond twice those its documents use before a sync compacts it
/// (see the module docs).
pub const VOCABULARY_SLACK: usize = 20_000;

/// The map and the vocabulary its BM25 documents were made with, published together.
#[derive(Clone, Default)]
struct Snapshot {
    vocab: Arc<Vocabulary>,
    tools: ToolMap,
}

/// What ranking uses of a turn's candidates ([`ToolIndex::resolve`]).
pub struct Resolution {
    /// The vocabulary of the candidates' BM25 documents: the query must be tokenised against
    /// this one ([`Vocabulary::query`]).
    pub vocabulary: Arc<Vocabulary>,
    /// One per candidate, in order.
    pub tools: Vec<Resolved>,
}

/// See the module docs.
#[derive(Default)]
pub struct ToolIndex {
    snapshot: RwLock<Arc<Snapshot>>,
    writer: Mutex<Compaction>,
    syncs: std::sync::atomic::AtomicU64,
}

/// The writer's memory of the last vocabulary check: the terms the documents used then, so
/// that a sync counts them again only once the vocabulary outgrew that.
#[derive(Default)]
struct Compaction {
    used_at_last_check: usize,
}

/// Lowercase hex SHA-256 of a text.
pub fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn same_object(a: &Arc<dyn Tool>, b: &Arc<dyn Tool>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

impl ToolIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current vocabulary of the BM25 documents (a query must be tokenised against the
    /// vocabulary of the documents it is scored with: see [`ToolIndex::resolve`]).
    pub fn vocabulary(&self) -> Arc<Vocabulary> {
        self.snapshot().vocab.clone()
    }

    /// Brings the index in line with the registry: tools that are new or re-registered are
    /// (re)indexed without a vector — unless their text did not change, then they keep it —
    /// and unregistered tools are dropped; the vocabulary is compacted when it outgrew its
    /// documents (see the module docs). Returns how many tools were (re)indexed.
    pub fn sync(&self, registry: &Registry) -> usize {
        let mut writer = self.writer.lock();
        self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entries = registry.all();
        let current = self.snapshot();
        let vocab = current.vocab.clone();
        let current = &current.tools;
        let mut next: ToolMap = HashMap::with_capacity(entries.len());
        let mut changed = 0;
        for entry in entries {
            let id = &entry.spec().id;
            let old = current.get(id);
            if let Some(old) = old
                && same_object(&old.tool, &entry.tool)
            {
                next.insert(id.clone(), old.clone());
                continue;
            }
            changed += 1;
            let text = tool_text(entry.spec());
            let text_sha256 = sha256_hex(&text);
            let indexed = match old {
                Some(old) if old.text_sha256 == text_sha256 => IndexedTool {
                    tool: entry.tool.clone(),
                    text: old.text.clone(),
                    fields: old.fields.clone(),
                    text_sha256,
                    lexical: old.lexical.clone(),
                    vector: old.vector.clone(),
                },
                _ => IndexedTool {
                    tool: entry.tool.clone(),
                    fields: Arc::new(super::tool_fields(entry.spec())),
                    lexical: Arc::new(vocab.doc(&text)),
                    text: text.into(),
                    text_sha256,
                    vector: None,
                },
            };
            next.insert(id.clone(), Arc::new(indexed));
        }
        let snapshot = match writer.compacted(&vocab, &next) {
            Some(compacted) => compacted,
            None => Snapshot { vocab, tools: next },
        };
        *self.snapshot.write() = Arc::new(snapshot);
        changed
    }

    /// Indexed tools without a vector, in id order.
    pub fn missing_vectors(&self) -> Vec<Arc<IndexedTool>> {
        let snapshot = self.snapshot();
        let mut out: Vec<Arc<IndexedTool>> = snapshot.tools.values().filter(|t| t.vector.is_none()).cloned().collect();
        out.sort_by(|a, b| a.id().cmp(b.id()));
        out
    }

    /// How many times [`ToolIndex::sync`] ran (the background worker syncs after every
    /// registry change, and at each sweep).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The text hashes of every indexed tool (with or without a vector), each once: the
    /// embedding cache rows the index may still need.
    pub fn text_hashes(&self) -> Vec<String> {
        let snapshot = self.snapshot();
        let hashes: std::collections::BTreeSet<&String> = snapshot.tools.values().map(|t| &t.text_sha256).collect();
        hashes.into_iter().cloned().collect()
    }

    /// Attaches vectors by text hash to every indexed tool with that text. Returns how
    /// many tools got one.
    pub fn set_vectors(&self, vectors: &HashMap<String, Arc<[f32]>>) -> usize {
        if vectors.is_empty() {
            return 0;
        }
        let _w = self.writer.lock();
        let mut snapshot = self.snapshot();
        let updates: Vec<(String, Arc<IndexedTool>)> = snapshot
            .tools
            .iter()
            .filter(|(_, t)| t.vector.is_none())
            .filter_map(|(id, t)| {
                vectors.get(&t.text_sha256).map(|v| {
                    let with = IndexedTool {
                        tool: t.tool.clone(),
                        text: t.text.clone(),
                        fields: t.fields.clone(),
                        text_sha256: t.text_sha256.clone(),
                        lexical: t.lexical.clone(),
                        vector: Some(v.clone()),
                    };
                    (id.clone(), Arc::new(with))
                })
            })
            .collect();
        let n = updates.len();
        Arc::make_mut(&mut snapshot).tools.extend(updates);
        *self.snapshot.write() = snapshot;
        n
    }

    /// What ranking needs of each candidate, in order, with the vocabulary of their BM25
    /// documents. A candidate that is not the indexed object (registered since the last sync)
    /// gets a BM25 document made now and no vector.
    pub fn resolve(&self, specs: &[&ToolSpec]) -> Resolution {
        let snapshot = self.snapshot();
        let tools = specs
            .iter()
            .map(|spec| match snapshot.tools.get(&spec.id) {
                Some(t) if std::ptr::eq(t.tool.spec(), *spec) => {
                    Resolved { lexical: t.lexical.clone(), vector: t.vector.clone() }
                }
                _ => Resolved { lexical: Arc::new(snapshot.vocab.doc(&tool_text(spec))), vector: None },
            })
            .collect();
        Resolution { vocabulary: snapshot.vocab.clone(), tools }
    }

    /// How many tools are indexed and embedded.
    pub fn counts(&self) -> IndexCounts {
        let snapshot = self.snapshot();
        IndexCounts {
            indexed: snapshot.tools.len(),
            embedded: snapshot.tools.values().filter(|t| t.vector.is_some()).count(),
        }
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().clone()
    }
}

impl Compaction {
    /// `tools` with their documents mapped onto a new vocabulary of the terms they use, when
    /// `vocab` holds more than twice those terms plus [`VOCABULARY_SLACK`]; otherwise none
    /// (counting the used terms only when `vocab` outgrew the last count that way).
    fn compacted(&mut self, vocab: &Vocabulary, tools: &ToolMap) -> Option<Snapshot> {
        let limit = |used: usize| used.saturating_mul(2).saturating_add(VOCABULARY_SLACK);
        if vocab.len() <= limit(self.used_at_last_check) {
            return None;
        }
        let mut used: Vec<u32> = tools.values().flat_map(|t| t.lexical.term_ids()).collect();
        used.sort_unstable();
        used.dedup();
        self.used_at_last_check = used.len();
        if vocab.len() <= limit(used.len()) {
            return None;
        }
        let compact = vocab.compacted(&used);
        let tools = tools
            .iter()
            .map(|(id, t)| {
                let tool = IndexedTool {
                    tool: t.tool.clone(),
                    text: t.text.clone(),
                    fields: t.fields.clone(),
                    text_sha256: t.text_sha256.clone(),
                    lexical: Arc::new(t.lexical.renumbered(&used)),
                    vector: t.vector.clone(),
                };
                (id.clone(), Arc::new(tool))
            })
            .collect();
        tracing::info!(before = vocab.len(), after = compact.len(), "BM25 vocabulary compacted");
        Some(Snapshot { vocab: Arc::new(compact), tools })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::exposure::lexical::bm25;
    use crate::registry::{ExecContext, ToolError, ToolOutput};

    struct Listed(ToolSpec);

    #[async_trait::async_trait]
    impl Tool for Listed {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn execute(&self, _input: &serde_json::Value, _ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
            Err(ToolError::new(ErrorCode::Internal, "listed only"))
        }
    }

    fn listed(id: &str, description: &str) -> Arc<dyn Tool> {
        Arc::new(Listed(crate::exposure::lexical::tests::spec(id, description)))
    }

    /// A distinct word for `n` that tokenising keeps whole and stemming leaves alone: letters
    /// only (a digit would split it), consonants only and no `s` (no suffix rule applies).
    fn word(n: usize) -> String {
        const LETTERS: &[u8] = b"bcdfghjklmnpqrtvwxz";
        let mut out = String::from("zq");
        let mut rest = n;
        for _ in 0..5 {
            out.push(char::from(LETTERS[rest % LETTERS.len()]));
            rest /= LETTERS.len();
        }
        out
    }

    /// The best-scoring candidate's id for `query`, scored as a turn does.
    fn best(index: &ToolIndex, registry: &Registry, query: &str) -> String {
        let entries = registry.all();
        let specs: Vec<&ToolSpec> = entries.iter().map(|e| e.spec()).collect();
        let resolution = index.resolve(&specs);
        let docs: Vec<&LexicalDoc> = resolution.tools.iter().map(|r| r.lexical.as_ref()).collect();
        let scores = bm25(&resolution.vocabulary.query(query), &docs);
        let top = scores.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap();
        specs[top].id.clone()
    }

    #[test]
    fn a_tool_whose_description_keeps_changing_does_not_grow_the_vocabulary_without_end() {
        let registry = Registry::new();
        registry.register(listed("weather", "Current weather forecast for a city")).unwrap();
        registry.register(listed("flights", "Search flights and airline tickets")).unwrap();
        let index = ToolIndex::new();
        index.sync(&registry);
        let mut largest = 0;
        // A listed tool that re-describes itself with 500 new words at every re-discovery.
        for change in 0..200 {
            let words: Vec<String> = (0..500).map(|w| word(change * 500 + w)).collect();
            registry.unregister("churn");
            registry.register(listed("churn", &words.join(" "))).unwrap();
            index.sync(&registry);
            largest = largest.max(index.vocabulary().len());
            // Ranking stays right whenever it runs, compaction or not.
            assert_eq!(best(&index, &registry, "weather forecast in Paris"), "weather");
            assert_eq!(best(&index, &registry, "book airline tickets"), "flights");
            assert_eq!(best(&index, &registry, &word(change * 500 + 7)), "churn");
        }
        // 100,000 words went through; the vocabulary never held much more than the slack.
        assert_eq!(crate::exposure::lexical::tokenize(&word(123_456)), [word(123_456)], "one term per word");
        assert!(largest <= VOCABULARY_SLACK + 2 * 600, "largest vocabulary {largest}");
        assert!(largest > VOCABULARY_SLACK, "compaction ran: largest {largest}");
        let used: std::collections::HashSet<u32> =
            index.snapshot().tools.values().flat_map(|t| t.lexical.term_ids().collect::<Vec<_>>()).collect();
        assert!(index.vocabulary().len() >= used.len());
        assert!(used.iter().all(|&id| (id as usize) < index.vocabulary().len()), "ids stay dense");
    }

    #[test]
    fn compaction_keeps_vectors_and_every_documents_terms() {
        let registry = Registry::new();
        registry.register(listed("read_file", "Read a file from the workspace")).unwrap();
        let index = ToolIndex::new();
        index.sync(&registry);
        let sha = index.snapshot().tools["read_file"].text_sha256.clone();
        let vector: Arc<[f32]> = vec![1.0, 0.0].into();
        index.set_vectors(&HashMap::from([(sha, vector.clone())]));
        let before = index.snapshot().tools["read_file"].lexical.term_ids().count();
        let changes = VOCABULARY_SLACK / 400 + 2;
        for change in 0..changes {
            let words: Vec<String> = (0..500).map(|w| word(change * 500 + w)).collect();
            registry.unregister("churn");
            registry.register(listed("churn", &words.join(" "))).unwrap();
            index.sync(&registry);
        }
        assert!(index.vocabulary().len() < changes * 500, "compacted: {}", index.vocabulary().len());
        let kept = index.snapshot().tools["read_file"].clone();
        assert_eq!(kept.vector.as_deref(), Some(&vector[..]), "the vector survives compaction");
        assert_eq!(kept.lexical.term_ids().count(), before);
        assert_eq!(best(&index, &registry, "read a file"), "read_file");
    }
}
