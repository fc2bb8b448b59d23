//! Following a run's event log: stored events after an id, then new ones as they commit.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::events::Heard;
use crate::store::{EventRow, Store, StoreError};

/// Events read from the store per query. With the channel below, this bounds what one
/// follower holds: at most `BATCH + QUEUE` event rows (small summaries, never tool results).
const BATCH: i64 = 100;
/// Events queued between the follower task and the SSE response.
const QUEUE: usize = 16;
/// A follower re-reads the store at least this often even without a wake-up.
const POLL: Duration = Duration::from_secs(5);
/// How long a follower keeps retrying a database it cannot reach before the stream ends
/// with the error (the client then resumes with `Last-Event-ID`).
const OUTAGE: Duration = Duration::from_secs(60);
/// Between those retries.
const RETRY: Duration = Duration::from_millis(500);

/// A stream of `run_id`'s events with id > `after`, in id order, without gaps or repeats:
/// first what is stored, then each newly committed event. Ends when the receiver is dropped,
/// on `shutdown`, or after a store error (yielded as the last item); a database that cannot
/// be reached is retried for up to a minute first.
pub fn follow(
    store: Store,
    run_id: String,
    after: i64,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<EventRow, StoreError>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        // Subscribe before the first read so that nothing committed in between is missed.
        let mut signals = store.bus().subscribe();
        let mut last = after;
        let mut outage: Option<Instant> = None;
        loop {
            let batch = match store.events_after(&run_id, last, BATCH).await {
                Ok(batch) => {
                    outage = None;
                    batch
                }
                // The database is away (restarting, say): keep the stream and read again.
                Err(e) if e.is_unavailable() && outage.get_or_insert_with(Instant::now).elapsed() < OUTAGE => {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tx.closed() => return,
                        () = tokio::time::sleep(RETRY) => continue,
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let full = batch.len() as i64 == BATCH;
            for event in batch {
                last = event.seq;
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tx.closed() => return,
                    () = tokio::time::sleep(POLL) => break,
                    heard = signals.recv() => match heard {
                        Heard::Run(s) if s.run_id == run_id && s.seq > last => break,
                        Heard::Run(_) => {}
                        // Signals may have been missed (lag, listener reconnect): re-read.
                        Heard::Resync => break,
                        Heard::Closed => return,
                    },
                }
            }
        }
    });
    ReceiverStream::new(rx)
}
