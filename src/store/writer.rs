//! SQLite: this process's one writer slot, held by every [`super::WriteTx`] from before
//! `BEGIN IMMEDIATE` until its commit or drop, and by the checkpointer's log-limiting
//! checkpoint. Writers queue on it in arrival order instead of meeting in SQLite's busy
//! handler, whose back-off sleeps (up to 100 ms each) made the p99.
//!
//! The slot counts what its holders did with it ([`WriterSlotStats`]): `mira bench
//! invocations` prints how busy the writer was and who held it; each [`super::WriteTx`] knows how
//! long it waited for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How the writer slot was used since the store opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriterSlotStats {
    /// Times it was taken (write transactions and log-limiting checkpoints).
    pub holds: u64,
    /// Summed time it was held, in microseconds.
    pub held_us: u64,
    /// Of `holds`, log-limiting checkpoints (see `store::checkpoint`).
    pub checkpoints: u64,
    /// Of `held_us`, held by those checkpoints, in microseconds.
    pub checkpoint_held_us: u64,
}

/// The slot and its counters.
#[derive(Default)]
pub(crate) struct WriterSlot {
    lock: Arc<tokio::sync::Mutex<()>>,
    holds: AtomicU64,
    held_us: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_held_us: AtomicU64,
}

/// The slot, held until dropped.
pub(crate) struct WriterHold {
    _guard: tokio::sync::OwnedMutexGuard<()>,
    since: Instant,
    slot: Arc<WriterSlot>,
    checkpoint: bool,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl WriterSlot {
    /// Waits for the slot; returns it with the time waited.
    pub(crate) async fn acquire(self: &Arc<Self>) -> (WriterHold, Duration) {
        let asked = Instant::now();
        let guard = Arc::clone(&self.lock).lock_owned().await;
        let waited = asked.elapsed();
        self.holds.fetch_add(1, Ordering::Relaxed);
        (WriterHold { _guard: guard, since: Instant::now(), slot: Arc::clone(self), checkpoint: false }, waited)
    }

    /// Waits for the slot to run a log-limiting checkpoint (counted apart).
    pub(crate) async fn acquire_for_checkpoint(self: &Arc<Self>) -> WriterHold {
        let (mut hold, _) = self.acquire().await;
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        hold.checkpoint = true;
        hold
    }

    /// The sums so far.
    pub(crate) fn stats(&self) -> WriterSlotStats {
        WriterSlotStats {
            holds: self.holds.load(Ordering::Relaxed),
            held_us: self.held_us.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            checkpoint_held_us: self.checkpoint_held_us.load(Ordering::Relaxed),
        }
    }
}

impl Drop for WriterHold {
    fn drop(&mut self) {
        let held = micros(self.since.elapsed());
        self.slot.held_us.fetch_add(held, Ordering::Relaxed);
        if self.checkpoint {
            self.slot.checkpoint_held_us.fetch_add(held, Ordering::Relaxed);
        }
    }
}
