//! Turns as a freeze reads them, with their exposure parsed once.
//!
//! A turn's exposure is stored once, when the turn is created, and never changes; a freeze
//! reads it for every call (the ladder is checked against it). Parsing the whole exposure
//! document — every exposed tool's schema — for each call cost more than the rest of the
//! freeze's checks, and reading it one round trip. [`TurnCache`] keeps the parsed turns of
//! the latest turns used, by turn id. The cached value is only what is immutable (ids,
//! owner, exposure); the caller still checks the turn belongs to the run it froze in, and
//! the run itself is read from the store for every call (so a turn whose run was deleted
//! is never used).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::exposure::Exposure;
use crate::store::Store;

/// Most turns kept.
pub const TURN_CACHE_CAPACITY: usize = 256;

/// A turn's immutable part, its exposure parsed.
#[derive(Debug)]
pub struct CachedTurn {
    /// `turn_…`
    pub id: String,
    /// The run.
    pub run_id: String,
    /// Owner.
    pub owner_id: String,
    /// The stored exposure, parsed.
    pub exposure: Exposure,
}

/// Recently used turns by id, at most [`TURN_CACHE_CAPACITY`] (the least recently
/// inserted goes first).
#[derive(Default)]
pub struct TurnCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Arc<CachedTurn>>,
    order: std::collections::VecDeque<String>,
}

impl TurnCache {
    /// The caller's turn `id` (None when it does not exist or is another user's), from the
    /// cache or read and parsed from `store`. A stored exposure that does not parse is an
    /// internal error.
    pub async fn turn_for(&self, store: &Store, owner_id: &str, id: &str) -> Result<Option<Arc<CachedTurn>>> {
        let cached = self.inner.lock().by_id.get(id).cloned();
        if let Some(turn) = cached {
            return Ok((turn.owner_id == owner_id).then_some(turn));
        }
        let Some(row) = store.turn_for(owner_id, id).await? else { return Ok(None) };
        let exposure: Exposure = serde_json::from_str(&row.exposure).map_err(|e| Error::Internal(e.to_string()))?;
        let turn = Arc::new(CachedTurn { id: row.id, run_id: row.run_id, owner_id: row.owner_id, exposure });
        let mut inner = self.inner.lock();
        if !inner.by_id.contains_key(id) {
            while inner.by_id.len() >= TURN_CACHE_CAPACITY {
                let Some(oldest) = inner.order.pop_front() else { break };
                inner.by_id.remove(&oldest);
            }
            inner.order.push_back(turn.id.clone());
            inner.by_id.insert(turn.id.clone(), Arc::clone(&turn));
        }
        Ok(Some(turn))
    }
}
