//! Group commit: concurrent writers (freezes and execution results) share one transaction.
//!
//! A writer puts its item in a [`GroupQueue`] and waits for its answer. A writer that finds
//! fewer flushes under way than the queue allows starts one (a spawned task, so that a
//! caller that goes away — an HTTP client disconnecting — cannot abort other writers'
//! transaction). A flush takes everything queued (up to a batch size), writes it in one
//! transaction, answers each writer, and repeats until the queue is empty. Nothing waits for
//! a batch to fill: a lone writer is flushed at once, and under load the items that arrive
//! while one transaction commits form the next. A batch that fails is retried item by item,
//! so that one item's error (a constraint, a vanished row) is that item's answer only.
//!
//! Two flushes at once (Postgres) overlap one transaction's statements with the other's
//! commit: every group transaction takes the run event counters it needs last, in one fixed
//! order, so the second waits for them only during the first's commit (its flush to disk).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Items waiting to be written, and how many flushes are under way.
pub(crate) struct GroupQueue<T, R> {
    inner: Mutex<Inner<T, R>>,
    /// Most flushes at once.
    max_flushes: usize,
}

struct Inner<T, R> {
    queue: Vec<(T, oneshot::Sender<R>)>,
    flushes: usize,
}

impl<T, R> GroupQueue<T, R> {
    /// An empty queue flushed by at most `max_flushes` tasks at once (at least one).
    pub(crate) fn new(max_flushes: usize) -> Self {
        Self { inner: Mutex::new(Inner { queue: Vec::new(), flushes: 0 }), max_flushes: max_flushes.max(1) }
    }

    /// Queues `item`; returns where its answer comes and whether the caller must start a
    /// flush (fewer than the allowed number were under way).
    pub(crate) fn push(&self, item: T) -> (oneshot::Receiver<R>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock();
        inner.queue.push((item, tx));
        let start = inner.flushes < self.max_flushes;
        if start {
            inner.flushes += 1;
        }
        (rx, start)
    }

    /// The next batch, oldest first, at most `max` items; empty (and this flush counted
    /// over) when nothing is queued.
    pub(crate) fn take(&self, max: usize) -> Vec<(T, oneshot::Sender<R>)> {
        let mut inner = self.inner.lock();
        if inner.queue.is_empty() {
            inner.flushes = inner.flushes.saturating_sub(1);
            return Vec::new();
        }
        let n = inner.queue.len().min(max);
        inner.queue.drain(..n).collect()
    }
}

impl<T, R> GroupQueue<T, R> {
    /// Ends a flush that stopped before the queue was empty (its task panicked or was dropped
    /// at shutdown): when it was the last one, the waiting writers are answered with a closed
    /// channel (another flush still under way would take them); the next writer starts a
    /// new flush.
    fn abandon(&self) {
        let mut inner = self.inner.lock();
        inner.flushes = inner.flushes.saturating_sub(1);
        if inner.flushes == 0 {
            inner.queue.clear();
        }
    }
}

/// Held by a flush task: abandons the queue's flush if the task ends before it emptied the
/// queue ([`FlushGuard::done`] disarms it).
pub(crate) struct FlushGuard<T, R> {
    queue: std::sync::Arc<GroupQueue<T, R>>,
    armed: bool,
}

impl<T, R> FlushGuard<T, R> {
    /// A guard of `queue`'s flush.
    pub(crate) fn new(queue: std::sync::Arc<GroupQueue<T, R>>) -> Self {
        Self { queue, armed: true }
    }

    /// The queue being flushed.
    pub(crate) fn queue(&self) -> &GroupQueue<T, R> {
        &self.queue
    }

    /// The flush emptied the queue ([`GroupQueue::take`] returned nothing).
    pub(crate) fn done(mut self) {
        self.armed = false;
    }
}

impl<T, R> Drop for FlushGuard<T, R> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.abandon();
        }
    }
}

/// What the group commits of a store did since it was opened (`mira bench invocations`
/// prints it: where a group transaction's time goes).
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupCommitStats {
    /// Group transactions committed.
    pub transactions: u64,
    /// Freezes and results they carried.
    pub items: u64,
    /// Summed time from asking for the transaction to the end of its commit, in
    /// microseconds.
    pub total_us: u64,
    /// Of that, getting the connection and beginning (on SQLite: waiting for this process's
    /// writer slot), in microseconds.
    pub begin_us: u64,
    /// Of `begin_us`, on SQLite, waiting for the writer slot (the rest is the pool's
    /// connection and `BEGIN IMMEDIATE`), in microseconds.
    pub slot_wait_us: u64,
    /// Of that, appending the events — the run counters' update, which waits while another
    /// transaction holding one of those counters commits — in microseconds.
    pub append_us: u64,
    /// Of that, the commits, in microseconds. A group written as one statement (Postgres,
    /// see `Store::write_group`) counts here whole.
    pub commit_us: u64,
}

/// The running sums behind [`GroupCommitStats`].
#[derive(Default)]
pub(crate) struct GroupCounters {
    transactions: AtomicU64,
    items: AtomicU64,
    total_us: AtomicU64,
    begin_us: AtomicU64,
    slot_wait_us: AtomicU64,
    append_us: AtomicU64,
    commit_us: AtomicU64,
}

/// The phases of one group transaction, as measured.
pub(crate) struct GroupTimes {
    pub(crate) items: usize,
    pub(crate) total: Duration,
    pub(crate) begin: Duration,
    pub(crate) slot_wait: Duration,
    pub(crate) append: Duration,
    pub(crate) commit: Duration,
}

impl GroupCounters {
    /// Adds one committed transaction.
    pub(crate) fn record(&self, t: &GroupTimes) {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(u64::try_from(t.items).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.total_us.fetch_add(us(t.total), Ordering::Relaxed);
        self.begin_us.fetch_add(us(t.begin), Ordering::Relaxed);
        self.slot_wait_us.fetch_add(us(t.slot_wait), Ordering::Relaxed);
        self.append_us.fetch_add(us(t.append), Ordering::Relaxed);
        self.commit_us.fetch_add(us(t.commit), Ordering::Relaxed);
    }

    /// The sums so far.
    pub(crate) fn snapshot(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            total_us: self.total_us.load(Ordering::Relaxed),
            begin_us: self.begin_us.load(Ordering::Relaxed),
            slot_wait_us: self.slot_wait_us.load(Ordering::Relaxed),
            append_us: self.append_us.load(Ordering::Relaxed),
            commit_us: self.commit_us.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GroupQueue;

    #[test]
    fn at_most_the_allowed_flushes_start_and_each_ends_on_an_empty_queue() {
        let q: GroupQueue<u32, ()> = GroupQueue::new(2);
        let starts: Vec<bool> = (0..4).map(|i| q.push(i).1).collect();
        assert_eq!(starts, [true, true, false, false]);
        let batch: Vec<u32> = q.take(3).into_iter().map(|(i, _)| i).collect();
        assert_eq!(batch, [0, 1, 2], "oldest first, at most the batch size");
        assert_eq!(q.take(3).len(), 1);
        assert!(q.take(3).is_empty(), "one flush ends");
        assert!(q.push(9).1, "one under way: room for another");
        assert!(!q.push(10).1, "two under way");
        assert_eq!(q.take(3).len(), 2);
        assert!(q.take(3).is_empty(), "one ends");
        assert!(q.take(3).is_empty(), "the other ends");
        assert!(q.push(11).1, "none under way: the next writer starts one");
    }
}
