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
//! the hybrid. A registry change between batches restarts the round with the new set, after
//! at least one batch (so a registry that keeps changing cannot stop all embedding).
//!
//! Fair turns: pending tools are taken one owner at a time in rotation ([`interleave`]; the
//! deployment's own tools are one owner), so a user whose MCP servers keep re-describing
//! hundreds of tools delays another user's new tools by at most one tool per turn of the
//! rotation, not by their whole backlog.
//!
//! Sweeping: every [`Sweep::every`] (10 minutes; first after that long from the start, when
//! MCP servers have listed their tools) the worker deletes cached tool vectors of its model
//! that no indexed tool's text uses and that are older than [`Sweep::grace`] (1 hour)
//! ([`Store::sweep_tool_vectors`]): a tool that changes its description leaves one row per
//! text, and without the sweep those rows would only grow. The index is this replica's: a
//! vector only another replica indexes may go, costing that replica one embedding after its
//! next restart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Embeddings, State};
use crate::exposure::index::{IndexedTool, ToolIndex};
use crate::registry::Registry;
use crate::state::VectorKind;
use crate::store::Store;

/// When the worker sweeps cached tool vectors no indexed tool uses (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    /// How often it sweeps, and how long after its start it sweeps first (10 minutes).
    pub every: Duration,
    /// How old an unused tool vector must be before a sweep deletes it (1 hour): a tool that
    /// comes back with an earlier text within this time, or a vector another replica embedded
    /// for a tool this replica has not indexed yet, keeps its row.
    pub grace: Duration,
}

impl Default for Sweep {
    fn default() -> Self {
        Self { every: Duration::from_secs(10 * 60), grace: Duration::from_secs(60 * 60) }
    }
}

/// Starts the indexer; it ends with `shutdown`.
pub fn spawn(
    embeddings: Arc<Embeddings>,
    index: Arc<ToolIndex>,
    registry: Arc<Registry>,
    store: Store,
    sweep: Sweep,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(embeddings, index, registry, store, sweep, shutdown))
}

async fn run(
    embeddings: Arc<Embeddings>,
    index: Arc<ToolIndex>,
    registry: Arc<Registry>,
    store: Store,
    sweep: Sweep,
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
    // A period of zero would wake the loop at once, over and over.
    let every = sweep.every.max(Duration::from_millis(10));
    let mut next_sweep = tokio::time::Instant::now() + every;
    loop {
        changes.mark_unchanged();
        let (i, r) = (index.clone(), registry.clone());
        if tokio::task::spawn_blocking(move || i.sync(&r)).await.is_err() {
            tracing::error!("tool index sync panicked");
        }
        let ready = embeddings.status().state == State::Ready;
        if ready {
            embed_pending(&embeddings, &index, &store, &mut changes, &shutdown, &mut failed).await;
        }
        // The next sweep is due from now whether or not this one could run (without a model
        // there is nothing to sweep, and a deadline left in the past would wake the loop at
        // once, over and over).
        if tokio::time::Instant::now() >= next_sweep {
            next_sweep = tokio::time::Instant::now() + every;
            if ready {
                sweep_unused(&embeddings, &index, &store, sweep.grace).await;
            }
        }
        if changes.has_changed().unwrap_or(false) {
            continue;
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            r = changes.changed() => if r.is_err() { break },
            () = loaded.notified() => {}
            () = tokio::time::sleep_until(next_sweep) => {}
        }
    }
}

/// Deletes the cached tool vectors of the loaded model that no indexed tool uses and that
/// are older than `grace`; a failure is logged and tried again at the next sweep.
async fn sweep_unused(embeddings: &Embeddings, index: &ToolIndex, store: &Store, grace: Duration) {
    let Some(model) = embeddings.model() else { return };
    let grace = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    match store.sweep_tool_vectors(&model.cache_id(), &index.text_hashes(), &crate::ids::now_minus_ms(grace)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "swept cached tool vectors no indexed tool uses"),
        Err(e) => tracing::warn!(error = %e, "sweeping unused tool vectors failed; trying again later"),
    }
}

/// `items` taken one group at a time in rotation: the first of each group (groups in key
/// order), then the second of each, and so on; within a group the order is kept. Used to
/// take pending tools one owner at a time (see the module docs).
pub fn interleave<T, K: Ord>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let total = items.len();
    let mut groups: BTreeMap<K, std::collections::VecDeque<T>> = BTreeMap::new();
    for item in items {
        groups.entry(key(&item)).or_default().push_back(item);
    }
    // Only groups with items left take part in a rotation: the cost is one step per item.
    let mut rotation: std::collections::VecDeque<std::collections::VecDeque<T>> = groups.into_values().collect();
    let mut out = Vec::with_capacity(total);
    while let Some(mut group) = rotation.pop_front() {
        if let Some(item) = group.pop_front() {
            out.push(item);
        }
        if !group.is_empty() {
            rotation.push_back(group);
        }
    }
    out
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
    let missing: Vec<Arc<IndexedTool>> = index
        .missing_vectors()
        .into_iter()
        .filter(|t| !failed.contains(&t.text_sha256) && seen.insert(t.text_sha256.clone()))
        .collect();
    let pending: Vec<(String, Arc<(String, String)>)> = interleave(missing, |t| t.owner().map(str::to_owned))
        .into_iter()
        .map(|t| (t.text_sha256.clone(), t.fields.clone()))
        .collect();
    for (n, batch) in pending.chunks(embeddings.batch_size()).enumerate() {
        // A change restarts the round, but never before its first batch.
        if shutdown.is_cancelled() || (n > 0 && changes.has_changed().unwrap_or(false)) {
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
                    if let Err(e) = store.put_tool_vectors(&model_id, VectorKind::Tool, &rows).await {
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

#[cfg(test)]
mod tests {
    use super::interleave;

    #[test]
    fn pending_tools_are_taken_one_owner_at_a_time() {
        let items = vec![("b", 1), ("b", 2), ("b", 3), ("b", 4), ("a", 1), ("c", 1), ("c", 2)];
        let order = interleave(items, |(owner, _)| *owner);
        assert_eq!(order, [("a", 1), ("b", 1), ("c", 1), ("b", 2), ("c", 2), ("b", 3), ("b", 4)]);
        assert!(interleave(Vec::<u8>::new(), |x| *x).is_empty());
    }
}
