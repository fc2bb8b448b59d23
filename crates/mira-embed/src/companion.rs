//! The companion encoder: a static word-embedding model whose vectors are appended to the
//! ONNX model's, so that one dot product scores both.
//!
//! The model is WordLlama's `l2_supercat_256` (PyPI `wordllama`, MIT; its 32,000 × 256
//! token table was trained from the token-embedding codebooks of LLaMA 2 70B and phi-3
//! medium, see the package's README). A text's vector is the mean of its tokens' rows,
//! tokenised without special tokens and without truncation, L2-normalised — WordLlama's own
//! `embed(..., norm=True)` (`wordllama/inference.py`). It knows no word order, but it was
//! trained on other data than all-MiniLM-L6-v2 and errs elsewhere, which is what a fusion
//! needs.
//!
//! Layout of a composite vector (see [`crate::Model::primary_dim`]): the first `primary`
//! dimensions are the ONNX model's vector exactly as without a companion; the rest are the
//! companion's vector times `sqrt(COMPANION_WEIGHT)`. For a query `[q₁; √w·q₂]` and a tool
//! `[t₁; √w·t₂]` the dot product is `q₁·t₁ + w·q₂·t₂`.
//!
//! Measured with `mira bench exposure` (shipped hybrid, convex 0.8): on the MetaTool
//! development set (2,000 queries, seed 7) Recall@20 0.9085 → 0.9190, MRR 0.692 → 0.699; on
//! `bench/mcp-servers` (70 tasks) Recall@20 0.914 → 0.921, MRR 0.726 → 0.760. Weights
//! 0.3–0.5 are within 0.002 on MetaTool (`docs/architecture.md`, "Ranking").

use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::{EmbedError, LoadError};

/// The companion's files in a model directory; both or neither.
pub const COMPANION_FILES: [&str; 2] =
    ["wordllama-l2_supercat_256.safetensors", "wordllama-l2_supercat.tokenizer.json"];

/// Weight `w` of the companion's cosine in a composite dot product (see the module docs).
pub const COMPANION_WEIGHT: f32 = 0.4;

/// The name of the table's tensor in the safetensors file.
const TABLE: &str = "embedding.weight";

/// A loaded companion: the tokenizer and the token table (f16 rows, converted on use).
pub(crate) struct Companion {
    pub(crate) id: String,
    pub(crate) dim: usize,
    rows: usize,
    table: Vec<half::f16>,
    tokenizer: Tokenizer,
}

impl Companion {
    /// Loads the companion from `dir` when both [`COMPANION_FILES`] are there; `Ok(None)`
    /// when neither is.
    ///
    /// Errors: [`LoadError::Failed`] when only one is there, or a file cannot be read or
    /// is not a tokenizer / an f16 table of as many rows as the tokenizer has tokens.
    pub(crate) fn load(dir: &Path) -> Result<Option<Companion>, LoadError> {
        let [table_file, tokenizer_file] = COMPANION_FILES.map(|f| dir.join(f));
        match (table_file.is_file(), tokenizer_file.is_file()) {
            (false, false) => return Ok(None),
            (true, true) => {}
            _ => {
                return Err(LoadError::Failed(format!(
                    "the model directory {} holds only one of the companion's files ({})",
                    dir.display(),
                    COMPANION_FILES.join(", ")
                )));
            }
        }
        let failed = |what: &Path, e: &dyn std::fmt::Display| LoadError::Failed(format!("{}: {e}", what.display()));
        let bytes = std::fs::read(&table_file).map_err(|e| failed(&table_file, &e))?;
        let tokenizer = Tokenizer::from_file(&tokenizer_file).map_err(|e| failed(&tokenizer_file, &e))?;
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| failed(&table_file, &e))?;
        let view = tensors.tensor(TABLE).map_err(|e| failed(&table_file, &e))?;
        let (rows, dim) = match (view.dtype(), view.shape()) {
            (Dtype::F16, [rows, dim]) if *rows > 0 && *dim > 0 => (*rows, *dim),
            (dtype, shape) => {
                return Err(failed(&table_file, &format!("{TABLE} is {dtype:?} {shape:?}, not a 2-D f16 table")));
            }
        };
        let vocab = tokenizer.get_vocab_size(true);
        if rows < vocab {
            return Err(failed(&table_file, &format!("{rows} rows for a tokenizer of {vocab} tokens")));
        }
        let table: Vec<half::f16> =
            view.data().chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]])).collect();
        let digest = hex::encode(Sha256::digest(&bytes));
        Ok(Some(Companion { id: format!("wordllama-l2_supercat_256@{}", &digest[..12]), dim, rows, table, tokenizer }))
    }

    /// The L2-normalised vector of each text, times `scale`; a text without tokens (or
    /// whose tokens sum to zero) gives zeros.
    ///
    /// Errors: [`EmbedError::Run`] when the tokenizer fails.
    pub(crate) fn embed(&self, texts: &[&str], scale: f32) -> Result<Vec<Vec<f32>>, EmbedError> {
        // The tokenizer must not take the server down on an odd text (as for the ONNX runs).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.embed_unguarded(texts, scale)))
            .unwrap_or_else(|panic| Err(EmbedError::Panicked(crate::panic_message(&panic))))
    }

    fn embed_unguarded(&self, texts: &[&str], scale: f32) -> Result<Vec<Vec<f32>>, EmbedError> {
        texts
            .iter()
            .map(|text| {
                let encoding = self.tokenizer.encode(*text, false).map_err(|e| EmbedError::Run(e.to_string()))?;
                let mut v = vec![0.0f32; self.dim];
                for &id in encoding.get_ids() {
                    let row = (id as usize).min(self.rows - 1) * self.dim;
                    for (x, t) in v.iter_mut().zip(&self.table[row..row + self.dim]) {
                        *x += t.to_f32();
                    }
                }
                // The mean's direction is the sum's: normalising the sum is normalising the mean.
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 && norm.is_finite() {
                    v.iter_mut().for_each(|x| *x *= scale / norm);
                } else {
                    v.iter_mut().for_each(|x| *x = 0.0);
                }
                Ok(v)
            })
            .collect()
    }
}
