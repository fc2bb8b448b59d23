//! Loading an embedding model with fastembed on a dynamically loaded ONNX Runtime.
//!
//! Two sources:
//! - a local model directory (the offline path): `model.onnx` plus the tokenizer files
//!   `tokenizer.json`, `config.json`, `special_tokens_map.json`, `tokenizer_config.json`,
//!   loaded as a fastembed user-defined model with mean pooling (the pooling of
//!   sentence-transformers' all-MiniLM-L6-v2, `1_Pooling/config.json` of that model);
//! - a stock fastembed model name (`BGESmallENV15`, `bge-small-en-v1.5`…), downloaded from
//!   the Hugging Face Hub into a cache directory on first use (needs internet).
//!
//! The ONNX Runtime library is loaded from an explicit path (`ORT_DYLIB_PATH`) before any
//! other `ort` call, so a missing or incompatible library is an error value here instead of
//! a panic inside `ort`. Each [`Model`] holds two ONNX sessions, one for turn queries and one
//! for background batches of tool texts, so a turn never queues behind a batch.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fastembed::{
    EmbeddingModel, InitOptionsUserDefined, Pooling, TextEmbedding, TextInitOptions, TokenizerFiles,
    UserDefinedEmbeddingModel,
};
use ort::environment::Environment;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

mod companion;

use companion::Companion;
pub use companion::{COMPANION_FILES, COMPANION_WEIGHT};

/// Files a local model directory must hold.
pub const MODEL_DIR_FILES: [&str; 5] =
    ["model.onnx", "tokenizer.json", "config.json", "special_tokens_map.json", "tokenizer_config.json"];

/// Longest text given to the tokenizer, in bytes. The model reads at most
/// [`MAX_TOKENS`] tokens anyway (about 1–2 KB of English); cutting the text first keeps a
/// 100 KB tool description from costing 100 KB of tokenisation.
pub const MAX_EMBED_TEXT_BYTES: usize = 8 * 1024;

/// Tokens per text the model sees (all-MiniLM-L6-v2 was trained with 256,
/// `sentence_bert_config.json` `max_seq_length`).
pub const MAX_TOKENS: usize = 256;

/// Weight of the name field in a tool vector (see [`Model::embed_tools`]).
pub const NAME_WEIGHT: f32 = 0.3;

/// Names how tool vectors are made from the model's embeddings (part of the cache key).
pub const TOOL_VECTOR_RECIPE: &str = "body+0.3name";

/// Why a model could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// A precondition is not met (no runtime, missing files): the service ranks lexically.
    #[error("{0}")]
    Unavailable(String),
    /// The runtime or model refused to load or to run (a corrupt or wrong ONNX file…).
    #[error("{0}")]
    Failed(String),
}

/// Why embedding texts with a loaded model failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    /// ONNX Runtime or the tokenizer returned an error (its message).
    #[error("{0}")]
    Run(String),
    /// ONNX Runtime or the tokenizer panicked (the panic message).
    #[error("embedding panicked: {0}")]
    Panicked(String),
    /// A query run returned no vector.
    #[error("the model returned no vector")]
    NoVector,
    /// A tool run returned fewer vectors than the (name, body) fields need.
    #[error("the model returned too few vectors")]
    TooFewVectors,
    /// A batch run returned a different number of vectors than texts, or vectors of the
    /// wrong dimension.
    #[error("the model returned {vectors} vectors for {texts} texts")]
    WrongCount {
        /// Vectors returned.
        vectors: usize,
        /// Texts given.
        texts: usize,
    },
}

/// Where to load a model from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local directory with [`MODEL_DIR_FILES`].
    Dir(PathBuf),
    /// A stock fastembed model, downloaded into `cache_dir`.
    Stock {
        /// The name as configured.
        name: String,
        /// Download cache.
        cache_dir: PathBuf,
    },
}

/// A loaded model: an id naming its vector space, the vector dimension, two sessions, and
/// the companion encoder when the model directory holds one ([`companion`]).
pub struct Model {
    id: String,
    dim: usize,
    query: Mutex<TextEmbedding>,
    batch: Mutex<TextEmbedding>,
    companion: Option<Companion>,
    /// The ONNX model's own dimension (the leading part of a composite vector).
    primary_dim: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("id", &self.id).field("dim", &self.dim).finish_non_exhaustive()
    }
}

impl Model {
    /// Loads ONNX Runtime from `ort_dylib` (once per process) and the model from `source`,
    /// then embeds a probe text to check that the output is a usable vector.
    ///
    /// Errors: [`LoadError::Unavailable`] for a missing library or model file,
    /// [`LoadError::Failed`] when ONNX Runtime rejects the library, the model or its output.
    pub fn load(source: &ModelSource, ort_dylib: &Path) -> Result<Model, LoadError> {
        let env = load_runtime(ort_dylib)?;
        // `ort` and the tokenizer may panic on malformed input; a panic here must not take
        // the server down, only the embedding state.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_sessions(source, &env))) {
            Ok(r) => r,
            Err(panic) => Err(LoadError::Failed(format!("loading the model panicked: {}", panic_message(&panic)))),
        }
    }

    /// The id of this model's vector space (`local:<dir name>@<sha256 of model.onnx, 12 hex>`,
    /// followed by `+wordllama-l2_supercat_256@<sha256 of its table, 12 hex>*0.4` with a
    /// companion, or `fastembed:<model code>`): vectors of different ids are never compared.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Vector dimension (with a companion: the ONNX model's plus the companion's).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// With a companion, the ONNX model's own dimension: the leading part of every vector,
    /// which is exactly the vector the model gives without one (a query's is L2-normalised),
    /// the space that absolute cosine thresholds are measured in. `None` without a companion
    /// (the whole vector is the model's).
    pub fn primary_dim(&self) -> Option<usize> {
        self.companion.as_ref().map(|_| self.primary_dim)
    }

    /// Embeds one query (a turn's task) on the query session: the model's L2-normalised
    /// vector, followed with a companion by the companion's, weighted (see [`companion`]).
    ///
    /// Errors: [`EmbedError`] when the run fails or returns no vector.
    pub fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let text = truncate(text, MAX_EMBED_TEXT_BYTES);
        let mut out = run(&self.query, &[text])?;
        let mut v = out.pop().ok_or(EmbedError::NoVector)?;
        if let Some(c) = &self.companion {
            v.extend(c.embed(&[text], COMPANION_WEIGHT.sqrt())?.into_iter().flatten());
        }
        Ok(v)
    }

    /// Tool vectors for (name, body) fields (the server's `exposure::tool_fields`) on the
    /// batch session, one ONNX run per call: `e(body) + NAME_WEIGHT · e(name)` with both
    /// embeddings L2-normalised, or `e(name)` alone when the body is empty. A dot product
    /// with a query vector is then `cos(query, body) + 0.3 · cos(query, name)`: a
    /// two-field score in the manner of BM25F's field weights (Robertson, Zaragoza & Taylor,
    /// "Simple BM25 extension to multiple weighted fields", CIKM 2004), which keeps an
    /// uninformative tool name ("timeport", "copilot") from diluting the description, as
    /// it does when the whole text is embedded at once. On the MetaTool development set
    /// (2,000 queries, seed 7) dense Recall@20 is 0.882 with the whole text, 0.887 with the
    /// body alone and 0.899 with this combination; weights 0.2–0.5 are within 0.002.
    ///
    /// With a companion, each vector is followed by the companion's made the same way,
    /// weighted (see [`companion`]).
    ///
    /// Errors: those of [`Model::embed_batch`], or [`EmbedError::TooFewVectors`].
    pub fn embed_tools(&self, fields: &[(&str, &str)]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut texts = Vec::with_capacity(fields.len() * 2);
        for (name, body) in fields {
            texts.push(truncate(name, MAX_EMBED_TEXT_BYTES));
            if !body.is_empty() {
                texts.push(truncate(body, MAX_EMBED_TEXT_BYTES));
            }
        }
        let mut out = two_fields(fields, run_checked(&self.batch, &texts, self.primary_dim)?)?;
        if let Some(c) = &self.companion {
            let extra = two_fields(fields, c.embed(&texts, COMPANION_WEIGHT.sqrt())?)?;
            for (v, e) in out.iter_mut().zip(extra) {
                v.extend(e);
            }
        }
        Ok(out)
    }

    /// The cache key's model part: the model id and the tool-vector recipe, so vectors of
    /// another recipe are never mixed in.
    pub fn cache_id(&self) -> String {
        format!("{}#{}", self.id, TOOL_VECTOR_RECIPE)
    }

    /// Embeds texts on the batch session (one ONNX run per call): vectors in input order,
    /// each the model's L2-normalised vector followed, with a companion, by the companion's
    /// weighted one (see [`companion`]). Texts longer than [`MAX_EMBED_TEXT_BYTES`] are cut first.
    ///
    /// Errors: [`EmbedError::Run`]/[`EmbedError::Panicked`] when the run fails,
    /// [`EmbedError::WrongCount`] when its output does not match the texts.
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let texts: Vec<&str> = texts.iter().map(|t| truncate(t, MAX_EMBED_TEXT_BYTES)).collect();
        let mut out = run_checked(&self.batch, &texts, self.primary_dim)?;
        if let Some(c) = &self.companion {
            for (v, e) in out.iter_mut().zip(c.embed(&texts, COMPANION_WEIGHT.sqrt())?) {
                v.extend(e);
            }
        }
        Ok(out)
    }
}

/// [`run`], refused unless it returns one vector of `dim` per text.
fn run_checked(session: &Mutex<TextEmbedding>, texts: &[&str], dim: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
    let out = run(session, texts)?;
    if out.len() != texts.len() || out.iter().any(|v| v.len() != dim) {
        return Err(EmbedError::WrongCount { vectors: out.len(), texts: texts.len() });
    }
    Ok(out)
}

/// Tool vectors from the vectors of their texts as [`Model::embed_tools`] lists them (name,
/// then body when there is one): `body + NAME_WEIGHT · name`, or `name` alone.
fn two_fields(fields: &[(&str, &str)], vectors: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut it = vectors.into_iter();
    let mut out = Vec::with_capacity(fields.len());
    for (_, body) in fields {
        let name = it.next().ok_or(EmbedError::TooFewVectors)?;
        if body.is_empty() {
            out.push(name);
        } else {
            let body = it.next().ok_or(EmbedError::TooFewVectors)?;
            out.push(body.iter().zip(&name).map(|(b, n)| b + NAME_WEIGHT * n).collect());
        }
    }
    Ok(out)
}

fn run(session: &Mutex<TextEmbedding>, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut session = session.lock();
    let n = texts.len().max(1);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| session.embed(texts, Some(n)))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(EmbedError::Run(e.to_string())),
        Err(panic) => Err(EmbedError::Panicked(panic_message(&panic))),
    }
}

/// The longest prefix of `text` of at most `max` bytes ending on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Why the ONNX Runtime library could not be loaded or its environment built.
#[derive(Debug, thiserror::Error)]
enum RuntimeError {
    #[error(transparent)]
    Load(#[from] ort::LoadDynamicError),
    #[error(transparent)]
    Build(#[from] ort::Error),
}

/// The library ONNX Runtime was loaded from in this process and its one environment (a
/// library cannot be unloaded, and ONNX Runtime allows one environment per process).
static ORT_LOADED: OnceLock<(PathBuf, Environment)> = OnceLock::new();

fn load_runtime(path: &Path) -> Result<Environment, LoadError> {
    if let Some((loaded, env)) = ORT_LOADED.get() {
        return if loaded == path {
            Ok(env.clone())
        } else {
            Err(LoadError::Unavailable(format!(
                "ONNX Runtime is already loaded from {} in this process; {} cannot be loaded as well",
                loaded.display(),
                path.display()
            )))
        };
    }
    if !path.is_file() {
        return Err(LoadError::Unavailable(format!(
            "the ONNX Runtime library {} does not exist (ORT_DYLIB_PATH; scripts/fetch-embedding-model.sh provides one)",
            path.display()
        )));
    }
    let loaded = std::panic::catch_unwind(|| -> Result<Environment, RuntimeError> {
        Ok(ort::init_from(path)?.with_name("mira").with_telemetry(false).build()?)
    });
    match loaded {
        Ok(Ok(env)) => {
            let _ = ORT_LOADED.set((path.to_path_buf(), env.clone()));
            Ok(env)
        }
        Ok(Err(e)) => {
            Err(LoadError::Unavailable(format!("the ONNX Runtime library {} cannot be used: {e}", path.display())))
        }
        Err(panic) => Err(LoadError::Unavailable(format!(
            "the ONNX Runtime library {} cannot be used: {}",
            path.display(),
            panic_message(&panic)
        ))),
    }
}

fn load_sessions(source: &ModelSource, env: &Environment) -> Result<Model, LoadError> {
    let (id, query, batch, companion) = match source {
        ModelSource::Dir(dir) => {
            let files = read_model_dir(dir)?;
            let digest = hex::encode(Sha256::digest(&files.onnx));
            let name = dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
            let id = format!("local:{name}@{}", &digest[..12]);
            let session = || {
                let model = UserDefinedEmbeddingModel::new(files.onnx.clone(), files.tokenizer.clone())
                    .with_pooling(Pooling::Mean);
                let options = InitOptionsUserDefined::new()
                    .with_environment(env.clone())
                    .with_max_length(MAX_TOKENS)
                    .with_intra_threads(1);
                TextEmbedding::try_new_from_user_defined(model, options).map_err(|e| {
                    LoadError::Failed(format!("ONNX Runtime cannot load {}: {e}", dir.join("model.onnx").display()))
                })
            };
            (id, session()?, session()?, Companion::load(dir)?)
        }
        ModelSource::Stock { name, cache_dir } => {
            let model = stock_model(name)?;
            let code = TextEmbedding::get_model_info(&model).map(|i| i.model_code.clone()).unwrap_or(name.clone());
            let session = || {
                let options = TextInitOptions::new(model.clone())
                    .with_cache_dir(cache_dir.clone())
                    .with_environment(env.clone())
                    .with_max_length(MAX_TOKENS)
                    .with_intra_threads(1)
                    .with_show_download_progress(false);
                TextEmbedding::try_new(options)
                    .map_err(|e| LoadError::Failed(format!("cannot load stock model {name}: {e}")))
            };
            (format!("fastembed:{code}"), session()?, session()?, None)
        }
    };
    let id = match &companion {
        // The weight is part of the vector space: vectors of another weight are not mixed in.
        Some(c) => format!("{id}+{}*{COMPANION_WEIGHT}", c.id),
        None => id,
    };
    let mut model = Model { id, dim: 0, query: Mutex::new(query), batch: Mutex::new(batch), companion, primary_dim: 0 };
    let probe = run(&model.query, &["probe: list the files of a folder"])
        .map_err(|e| LoadError::Failed(format!("the model does not run: {e}")))?;
    let dim = probe.first().map_or(0, Vec::len);
    if dim == 0 || probe.iter().flatten().any(|x| !x.is_finite()) {
        return Err(LoadError::Failed(format!("the model returned no usable vector (dimension {dim})")));
    }
    model.primary_dim = dim;
    model.dim = dim + model.companion.as_ref().map_or(0, |c| c.dim);
    Ok(model)
}

struct DirFiles {
    onnx: Vec<u8>,
    tokenizer: TokenizerFiles,
}

fn read_model_dir(dir: &Path) -> Result<DirFiles, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::Unavailable(format!("the model directory {} does not exist", dir.display())));
    }
    let missing: Vec<&str> = MODEL_DIR_FILES.iter().copied().filter(|f| !dir.join(f).is_file()).collect();
    if !missing.is_empty() {
        return Err(LoadError::Unavailable(format!(
            "the model directory {} lacks {} (it needs {})",
            dir.display(),
            missing.join(", "),
            MODEL_DIR_FILES.join(", ")
        )));
    }
    let read = |f: &str| {
        std::fs::read(dir.join(f))
            .map_err(|e| LoadError::Unavailable(format!("cannot read {}: {e}", dir.join(f).display())))
    };
    Ok(DirFiles {
        onnx: read("model.onnx")?,
        tokenizer: TokenizerFiles {
            tokenizer_file: read("tokenizer.json")?,
            config_file: read("config.json")?,
            special_tokens_map_file: read("special_tokens_map.json")?,
            tokenizer_config_file: read("tokenizer_config.json")?,
        },
    })
}

/// A stock fastembed model by its variant name (`BGESmallENV15`) or its Hugging Face code
/// with or without the owner (`BAAI/bge-small-en-v1.5`, `bge-small-en-v1.5`), case-insensitive.
pub fn stock_model(name: &str) -> Result<EmbeddingModel, LoadError> {
    if let Ok(m) = name.parse::<EmbeddingModel>() {
        return Ok(m);
    }
    let wanted = name.to_ascii_lowercase();
    TextEmbedding::list_supported_models()
        .into_iter()
        .find(|info| {
            let code = info.model_code.to_ascii_lowercase();
            code == wanted || code.rsplit('/').next() == Some(wanted.as_str())
        })
        .map(|info| info.model)
        .ok_or_else(|| LoadError::Unavailable(format!("{name} is not a stock fastembed text embedding model")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn stock_names_resolve() {
        assert_eq!(stock_model("bge-small-en-v1.5").unwrap(), EmbeddingModel::BGESmallENV15);
        assert_eq!(stock_model("BGESmallENV15").unwrap(), EmbeddingModel::BGESmallENV15);
        assert!(matches!(stock_model("no-such-model"), Err(LoadError::Unavailable(_))));
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.onnx"), b"x").unwrap();
        let Err(LoadError::Unavailable(m)) = read_model_dir(dir.path()) else { panic!("expected unavailable") };
        assert!(m.contains("tokenizer.json") && !m.contains("lacks model.onnx"), "{m}");
    }
}
