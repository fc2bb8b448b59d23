//! The background indexer: keeps the [`ToolIndex`] in line with the registry and fills in
//! tool vectors, off the request path.
//!
//! On start it fetches the pinned model when none is configured ([`super::fetch`]), then
//! loads the model (on a blocking thread), while it indexes the registered
//! tools lexically. After every registry change it re-syncs the index, then embeds the
//! tools without a vector in batches of [`Embeddings::batch_size`]: each batch first asks
//! the store's cache (`tool_embeddings`, keyed by model id and text SHA-256), runs the model
//! only on the misses, stores the new vectors and publishes them to the index. Turns never
//! wait for any of this; a tool whose vector is not there yet is ranked lexically within
//! the hybrid. A registry change between batches restarts the round with the new set.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Embeddings, State};
use crate::exposure::index::ToolIndex;
use crate::registry::Registry;
use crate::store::Store;

/// Starts the indexer; it ends with `shutdown`.
pub fn spawn(
    embeddings: Arc<Embeddings>,
    index: Arc<ToolIndex>,
    registry: Arc<Registry>,
    store: Store,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(embeddings, index, registry, store, shutdown))
}

async fn run(
    embeddings: Arc<Embeddings>,
    index: Arc<ToolIndex>,
    registry: Arc<Registry>,
    store: Store,
    shutdown: CancellationToken,
) {
    let mut changes = registry.subscribe();
    let loaded = Arc::new(tokio::sync::Notify::new());
    let (loader, done) = (embeddings.clone(), loaded.clone());
    tokio::spawn(async move {
        if loader.fetch_default().await {
            let l = loader.clone();
            let _ = tokio::task::spawn_blocking(move || l.load()).await;
        }
        done.notify_one();
    });
    let mut failed: HashSet<String> = HashSet::new();
    loop {
        changes.mark_unchanged();
        let (i, r) = (index.clone(), registry.clone());
        if tokio::task::spawn_blocking(move || i.sync(&r)).await.is_err() {
            tracing::error!("tool index sync panicked");
        }
        if embeddings.status().state == State::Ready {
            embed_pending(&embeddings, &index, &store, &mut changes, &shutdown, &mut failed).await;
        }
        if changes.has_changed().unwrap_or(false) {
            continue;
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            r = changes.changed() => if r.is_err() { break },
            () = loaded.notified() => {}
        }
    }
}

/// Embeds indexed tools that lack a vector, batch by batch, until none is left, the
/// registry changes or the server stops.
async fn embed_pending(
    embeddings: &Embeddings,
    index: &ToolIndex,
    store: &Store,
    changes: &mut watch::Receiver<u64>,
    shutdown: &CancellationToken,
    failed: &mut HashSet<String>,
) {
    let Some(model) = embeddings.model() else { return };
    let model_id = model.cache_id();
    // One text per hash: tools with the same text share a vector.
    let mut seen = HashSet::new();
    let pending: Vec<(String, Arc<(String, String)>)> = index
        .missing_vectors()
        .into_iter()
        .filter(|t| !failed.contains(&t.text_sha256) && seen.insert(t.text_sha256.clone()))
        .map(|t| (t.text_sha256.clone(), t.fields.clone()))
        .collect();
    for batch in pending.chunks(embeddings.batch_size()) {
        if shutdown.is_cancelled() || changes.has_changed().unwrap_or(false) {
            return;
        }
        let shas: Vec<String> = batch.iter().map(|(s, _)| s.clone()).collect();
        let mut found: HashMap<String, Arc<[f32]>> = match store.tool_vectors(&model_id, &shas).await {
            Ok(rows) => rows.into_iter().filter(|(_, v)| v.len() == model.dim()).map(|(s, v)| (s, v.into())).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "reading cached tool vectors failed; embedding instead");
                HashMap::new()
            }
        };
        embeddings.counters.tools_from_cache.fetch_add(found.len() as u64, Ordering::Relaxed);
        let misses: Vec<(String, Arc<(String, String)>)> =
            batch.iter().filter(|(s, _)| !found.contains_key(s)).cloned().collect();
        if !misses.is_empty() {
            let m = model.clone();
            let fields: Vec<Arc<(String, String)>> = misses.iter().map(|(_, f)| f.clone()).collect();
            let result = tokio::task::spawn_blocking(move || {
                let refs: Vec<(&str, &str)> = fields.iter().map(|f| (f.0.as_str(), f.1.as_str())).collect();
                m.embed_tools(&refs)
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            match result {
                Ok(vectors) => {
                    let rows: Vec<(String, Vec<f32>)> = misses.iter().map(|(s, _)| s.clone()).zip(vectors).collect();
                    embeddings.counters.tools_embedded.fetch_add(rows.len() as u64, Ordering::Relaxed);
                    if let Err(e) = store.put_tool_vectors(&model_id, &rows).await {
                        tracing::warn!(error = %e, "caching tool vectors failed; they will be recomputed after a restart");
                    }
                    found.extend(rows.into_iter().map(|(s, v)| (s, v.into())));
                }
                Err(e) => {
                    tracing::warn!(error = %e, tools = misses.len(), "embedding tool texts failed; those tools are ranked lexically");
                    embeddings.counters.tools_failed.fetch_add(misses.len() as u64, Ordering::Relaxed);
                    failed.extend(misses.into_iter().map(|(s, _)| s));
                }
            }
        }
        index.set_vectors(&found);
    }
}
