//! The tool index: what ranking needs of every registered tool, computed once per
//! registration instead of once per turn.
//!
//! Per tool: its text ([`super::tool_text`]) and the text's SHA-256, its BM25 document,
//! and its embedding vector once the background worker ([`crate::embedding::worker`]) has
//! one. The index keeps the registered `Arc<dyn Tool>` itself, so "is this candidate the
//! tool that was indexed" is a pointer comparison: a re-registered tool is a new object,
//! and an indexed object stays alive (its address cannot be reused) while indexed.
//!
//! Readers take a snapshot (`Arc` of the map) and never wait for the worker; the worker is
//! the only writer (writes are serialised by a mutex, copy-on-write on the map).

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

/// See the module docs.
#[derive(Default)]
pub struct ToolIndex {
    vocab: Vocabulary,
    tools: RwLock<Arc<ToolMap>>,
    writer: Mutex<()>,
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

    /// The vocabulary of the BM25 documents (queries must be tokenised against it).
    pub fn vocabulary(&self) -> &Vocabulary {
        &self.vocab
    }

    /// Brings the index in line with the registry: tools that are new or re-registered are
    /// (re)indexed without a vector — unless their text did not change, then they keep it —
    /// and unregistered tools are dropped. Returns how many tools were (re)indexed.
    pub fn sync(&self, registry: &Registry) -> usize {
        let _w = self.writer.lock();
        let entries = registry.all();
        let current = self.snapshot();
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
                    lexical: Arc::new(self.vocab.doc(&text)),
                    text: text.into(),
                    text_sha256,
                    vector: None,
                },
            };
            next.insert(id.clone(), Arc::new(indexed));
        }
        *self.tools.write() = Arc::new(next);
        changed
    }

    /// Indexed tools without a vector, in id order.
    pub fn missing_vectors(&self) -> Vec<Arc<IndexedTool>> {
        let snapshot = self.snapshot();
        let mut out: Vec<Arc<IndexedTool>> = snapshot.values().filter(|t| t.vector.is_none()).cloned().collect();
        out.sort_by(|a, b| a.id().cmp(b.id()));
        out
    }

    /// Attaches vectors by text hash to every indexed tool with that text. Returns how
    /// many tools got one.
    pub fn set_vectors(&self, vectors: &HashMap<String, Arc<[f32]>>) -> usize {
        if vectors.is_empty() {
            return 0;
        }
        let _w = self.writer.lock();
        let mut map = self.snapshot();
        let updates: Vec<(String, Arc<IndexedTool>)> = map
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
        Arc::make_mut(&mut map).extend(updates);
        *self.tools.write() = map;
        n
    }

    /// What ranking needs of each candidate, in order. A candidate that is not the indexed
    /// object (registered since the last sync) gets a BM25 document made now and no vector.
    pub fn resolve(&self, specs: &[&ToolSpec]) -> Vec<Resolved> {
        let snapshot = self.snapshot();
        specs
            .iter()
            .map(|spec| match snapshot.get(&spec.id) {
                Some(t) if std::ptr::eq(t.tool.spec(), *spec) => {
                    Resolved { lexical: t.lexical.clone(), vector: t.vector.clone() }
                }
                _ => Resolved { lexical: Arc::new(self.vocab.doc(&tool_text(spec))), vector: None },
            })
            .collect()
    }

    /// How many tools are indexed and embedded.
    pub fn counts(&self) -> IndexCounts {
        let snapshot = self.snapshot();
        IndexCounts { indexed: snapshot.len(), embedded: snapshot.values().filter(|t| t.vector.is_some()).count() }
    }

    fn snapshot(&self) -> Arc<ToolMap> {
        self.tools.read().clone()
    }
}
