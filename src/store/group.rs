//! Group commit: concurrent writers of the same kind (freezes, execution results) share one
//! transaction.
//!
//! A writer puts its item in a [`GroupQueue`] and waits for its answer. The first writer to
//! find no flush under way starts one (a spawned task, so that a caller that goes away —
//! an HTTP client disconnecting — cannot abort other writers' transaction). The flush takes
//! everything queued (up to a batch size), writes it in one transaction, answers each
//! writer, and repeats until the queue is empty. Nothing waits for a batch to fill: a lone
//! writer is flushed at once, and under load the items that arrive while one transaction
//! commits form the next. A batch that fails is retried item by item, so that one item's
//! error (a constraint, a vanished row) is that item's answer only.

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Items waiting to be written, and whether a flush is under way.
pub(crate) struct GroupQueue<T, R> {
    inner: Mutex<Inner<T, R>>,
}

struct Inner<T, R> {
    queue: Vec<(T, oneshot::Sender<R>)>,
    flushing: bool,
}

impl<T, R> Default for GroupQueue<T, R> {
    fn default() -> Self {
        Self { inner: Mutex::new(Inner { queue: Vec::new(), flushing: false }) }
    }
}

impl<T, R> GroupQueue<T, R> {
    /// Queues `item`; returns where its answer comes and whether the caller must start a
    /// flush (none was under way).
    pub(crate) fn push(&self, item: T) -> (oneshot::Receiver<R>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner.lock();
        inner.queue.push((item, tx));
        let start = !inner.flushing;
        inner.flushing = true;
        (rx, start)
    }

    /// The next batch, oldest first, at most `max` items; empty (and the flush marked over)
    /// when nothing is queued.
    pub(crate) fn take(&self, max: usize) -> Vec<(T, oneshot::Sender<R>)> {
        let mut inner = self.inner.lock();
        if inner.queue.is_empty() {
            inner.flushing = false;
            return Vec::new();
        }
        let n = inner.queue.len().min(max);
        inner.queue.drain(..n).collect()
    }
}

impl<T, R> GroupQueue<T, R> {
    /// Ends a flush that stopped before the queue was empty (its task panicked or was dropped
    /// at shutdown): the waiting writers are answered with a closed channel, and the next
    /// writer starts a new flush.
    fn abandon(&self) {
        let mut inner = self.inner.lock();
        inner.flushing = false;
        inner.queue.clear();
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
