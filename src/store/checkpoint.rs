//! SQLite WAL checkpoints off the writer's path.
//!
//! In WAL mode a commit appends frames to the `-wal` file; a checkpoint copies them into the
//! database file and, with `synchronous = NORMAL`, is where the syncs happen. SQLite's own
//! automatic checkpoint runs inside the commit that crosses 1,000 WAL pages, on the writing
//! connection — so every few group commits the one writer (`Store::sqlite_write_pool`) also
//! waited for a checkpoint's copying and syncs, while every other write waited for it.
//!
//! The writer therefore has `wal_autocheckpoint = 0`, and after each of its commits
//! [`Checkpointer::committed`] asks for a `PRAGMA wal_checkpoint(PASSIVE)` on a reader
//! connection [`CHECKPOINT_INTERVAL`] later: at most one runs at a time, and the commits made
//! meanwhile share it (coalesced). A passive checkpoint takes no lock a writer or reader waits for;
//! it copies what no reader still needs, and once the whole log has been copied the next
//! commit starts the log from its beginning again (SQLite, "Write-Ahead Logging", §
//! Checkpointing). Under writes without a pause a commit nearly always lands during the
//! checkpoint, so the log would never be wholly copied and never start over: once it holds
//! more than [`LOG_FRAMES_LIMIT`] frames, the checkpoint runs again holding the store's writer
//! slot, which no commit can overlap. The `-wal` file so stays bounded (about 32 MiB).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::AnyPool;

/// How long after a commit its checkpoint runs; commits meanwhile share it. At the
/// invocation benchmark's rate on SQLite (about 1,500 calls/s) the log then holds a few
/// hundred pages between checkpoints, as with SQLite's own threshold of 1,000 pages.
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Log frames past which a checkpoint holds the writer slot (8,000 pages of 4 KiB: a log of
/// at most about 32 MiB). SQLite's own threshold (`wal_autocheckpoint`) is 1,000 pages; with
/// it, `mira bench invocations` measured 75–79 such checkpoints in 10 s, holding the writer
/// 6.3–6.6 % of the load; with 8,000, 19–20 holding it 2.2 % and 6 % more calls completed
/// (1,838–1,878/s against 1,741–1,759/s, same machine, runs interleaved). A larger log is
/// copied less per frame: the pages every commit rewrites (the runs' counters, the indexes'
/// last leaves) are copied once per checkpoint however often they were written.
const LOG_FRAMES_LIMIT: i64 = 8000;

/// Runs passive checkpoints after commits, one at a time (see the module docs).
pub(crate) struct Checkpointer {
    pool: AnyPool,
    /// The store's writer slot (`Store::sqlite_writer`).
    writer: Arc<super::writer::WriterSlot>,
    /// A checkpoint task is running.
    running: AtomicBool,
    /// A commit happened since the running checkpoint started.
    pending: AtomicBool,
}

impl Checkpointer {
    /// A checkpointer that runs its checkpoints on a connection of `pool` (the readers'),
    /// holding `writer` (the store's writer slot) when the log has grown past
    /// [`LOG_FRAMES_LIMIT`].
    pub(crate) fn new(pool: AnyPool, writer: Arc<super::writer::WriterSlot>) -> Self {
        Self { pool, writer, running: AtomicBool::new(false), pending: AtomicBool::new(false) }
    }

    /// One passive checkpoint; when the log then holds more than [`LOG_FRAMES_LIMIT`] frames,
    /// a second one with the writer slot held, which no commit can overlap.
    async fn checkpoint(&self) -> Result<(), sqlx::Error> {
        // The connection first: the writer slot is never held while waiting for a reader.
        let mut conn = self.pool.acquire().await?;
        let (_busy, log, _copied): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(&mut *conn).await?;
        if log > LOG_FRAMES_LIMIT {
            let _writer = self.writer.acquire_for_checkpoint().await;
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Says a write transaction committed: starts a checkpoint task unless one is running
    /// (that one then runs once more). Must be called inside a Tokio runtime.
    pub(crate) fn committed(self: &Arc<Self>) {
        self.pending.store(true, Ordering::Release);
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                loop {
                    // Commits within the interval share one checkpoint, and a request's next
                    // step does not meet this one's syncs.
                    tokio::time::sleep(CHECKPOINT_INTERVAL).await;
                    if !this.pending.swap(false, Ordering::AcqRel) {
                        break;
                    }
                    if let Err(e) = this.checkpoint().await {
                        // A closed pool (the store is shutting down) or a transient error: the
                        // next commit asks again; the log is copied by a later checkpoint.
                        tracing::debug!(error = %e, "WAL checkpoint failed");
                        this.pending.store(false, Ordering::Release);
                        break;
                    }
                }
                this.running.store(false, Ordering::Release);
                // A commit between the last swap and the store above found `running` set and
                // left it to this task: take it over unless a new task already did.
                if !this.pending.load(Ordering::Acquire) || this.running.swap(true, Ordering::AcqRel) {
                    break;
                }
            }
        });
    }
}
