//! Open event streams end when their token stops authenticating.
//!
//! A stream (run events, the approvals inbox, terminal output; on `/mcp`, a call's answer
//! stream and the session's `GET` stream) is authenticated once, when it opens
//! (`http::limits::stream_slot`, `mcp_server`'s gate); it may then stay open for hours. [`TokenWatch`]
//! keeps every open stream's token under watch: every [`CHECK_EVERY`] one statement reads
//! which of the watched tokens still authenticate ([`crate::store::Store::valid_token_ids`]:
//! not revoked, their user still there), and the streams of a token that does not end with an
//! `error` event whose code is `unauthorized` — what the API answers that token — then close.
//! A revocation made through this replica is checked at once
//! ([`TokenWatch::recheck`]); one made through another replica (or by hand in the database) is
//! seen within [`CHECK_EVERY`] plus one store round trip.
//!
//! One statement per tick for the whole process, whatever the number of streams: a task runs
//! while at least one stream is watched and stops when none is. When the check keeps failing
//! (the store is unreachable) the tokens cannot be vouched for: after [`UNVERIFIED_FOR`]
//! without one successful check every watched stream ends with an `error` event
//! `store_error` (a client reconnects, and is authenticated again). The same window lets a run
//! event stream ride out a database restart, as it does by itself ([`crate::store::follow`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// How often the watched tokens are checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// How long the checks may keep failing before every watched stream ends.
pub const UNVERIFIED_FOR: Duration = Duration::from_secs(60);

/// Most token ids read in one statement.
const CHUNK: usize = 500;

/// What the watch last found of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It still authenticates.
    Valid,
    /// It was revoked, or its user is gone.
    Revoked,
    /// It could not be checked for [`UNVERIFIED_FOR`].
    Unverified,
}

impl Verdict {
    /// The `error` event that ends a stream on this verdict (as the bytes of one Server-Sent
    /// Event), or None while the token is valid.
    pub fn end_event(self) -> Option<&'static str> {
        match self {
            Verdict::Valid => None,
            Verdict::Revoked => Some(
                "event: error\ndata: {\"code\":\"unauthorized\",\"message\":\"the token of this stream was revoked; the stream ends\"}\n\n",
            ),
            Verdict::Unverified => Some(
                "event: error\ndata: {\"code\":\"store_error\",\"message\":\"the token of this stream could not be checked; reconnect\"}\n\n",
            ),
        }
    }
}

/// The watch over the tokens of this process's open streams (see the module docs).
pub struct TokenWatch {
    store: Store,
    shutdown: CancellationToken,
    inner: Mutex<Inner>,
    /// Wakes the checking task before its next tick (a revocation through this replica).
    recheck: Notify,
}

#[derive(Default)]
struct Inner {
    /// One sender per watched token; each open stream of the token holds a receiver.
    watched: HashMap<String, watch::Sender<Verdict>>,
    /// The checking task runs.
    running: bool,
}

impl TokenWatch {
    /// A watch reading `store`, whose task stops when `shutdown` is cancelled.
    pub fn new(store: Store, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self { store, shutdown, inner: Mutex::default(), recheck: Notify::new() })
    }

    /// Watches token `token_id` (a row id) for one stream: the receiver's value changes from
    /// [`Verdict::Valid`] once the token stops authenticating. Dropping the receiver ends
    /// the watch of that stream.
    pub fn watch(self: &Arc<Self>, token_id: &str) -> watch::Receiver<Verdict> {
        let mut inner = self.inner.lock();
        let rx = match inner.watched.get(token_id) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(Verdict::Valid);
                inner.watched.insert(token_id.to_owned(), tx);
                rx
            }
        };
        if !inner.running && !self.shutdown.is_cancelled() {
            inner.running = true;
            tokio::spawn(Arc::clone(self).run());
        }
        rx
    }

    /// Checks the watched tokens now rather than at the next tick (a token was revoked here).
    pub fn recheck(&self) {
        self.recheck.notify_one();
    }

    /// Whether token `token_id` still authenticates, read from the store now (a store that
    /// fails answers false).
    pub async fn still_valid(&self, token_id: &str) -> bool {
        match self.store.valid_token_ids(&[token_id]).await {
            Ok(valid) => valid.contains(token_id),
            Err(e) => {
                tracing::warn!(error = %e, "checking a token failed; it counts as not valid");
                false
            }
        }
    }

    /// The checking task: runs while tokens are watched.
    async fn run(self: Arc<Self>) {
        let mut failing_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => break,
                () = tokio::time::sleep(CHECK_EVERY) => {}
                () = self.recheck.notified() => {}
            }
            let ids: Vec<String> = {
                let mut inner = self.inner.lock();
                inner.watched.retain(|_, tx| !tx.is_closed());
                if inner.watched.is_empty() {
                    inner.running = false;
                    return;
                }
                inner.watched.keys().cloned().collect()
            };
            match self.valid_among(&ids).await {
                Ok(valid) => {
                    failing_since = None;
                    let mut inner = self.inner.lock();
                    for id in ids.iter().filter(|id| !valid.contains(*id)) {
                        if let Some(tx) = inner.watched.remove(id) {
                            tracing::info!(token = %id, streams = tx.receiver_count(),
                                "the token of open streams no longer authenticates; they end");
                            tx.send_replace(Verdict::Revoked);
                        }
                    }
                }
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    tracing::warn!(error = %e, failing_secs = since.elapsed().as_secs(),
                        "checking the tokens of open streams failed");
                    if since.elapsed() >= UNVERIFIED_FOR {
                        let mut inner = self.inner.lock();
                        for (_, tx) in inner.watched.drain() {
                            tx.send_replace(Verdict::Unverified);
                        }
                    }
                }
            }
        }
        self.inner.lock().running = false;
    }

    /// Which of `ids` still authenticate, [`CHUNK`] ids a statement.
    async fn valid_among(&self, ids: &[String]) -> crate::store::StoreResult<std::collections::HashSet<String>> {
        let mut valid = std::collections::HashSet::new();
        for chunk in ids.chunks(CHUNK) {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            valid.extend(self.store.valid_token_ids(&chunk).await?);
        }
        Ok(valid)
    }
}

/// `body` (a stream's response body) ended after an `error` event once `verdict` leaves
/// [`Verdict::Valid`]: the event comes between two of the body's chunks (each chunk of a
/// Server-Sent Event body is whole events) and the body is dropped, which ends the stream's
/// producer. `hold` is dropped with the body (the stream's slot).
pub fn end_on_revocation<H: Send + 'static>(
    body: axum::body::Body,
    verdict: watch::Receiver<Verdict>,
    hold: H,
) -> axum::body::Body {
    use futures::StreamExt;
    struct State<H> {
        body: axum::body::BodyDataStream,
        /// None once the watch is gone (its task stopped with the server).
        verdict: Option<watch::Receiver<Verdict>>,
        ended: bool,
        _hold: H,
    }
    let state = State { body: body.into_data_stream(), verdict: Some(verdict), ended: false, _hold: hold };
    let stream = futures::stream::unfold(state, |mut s| async move {
        if s.ended {
            return None;
        }
        let Some(rx) = s.verdict.as_mut() else {
            let chunk = s.body.next().await?;
            return Some((chunk, s));
        };
        // What the select found, without its borrows (the verdict's `Ref` holds a lock).
        enum Step {
            Chunk(Option<Result<axum::body::Bytes, axum::Error>>),
            End(Option<&'static str>),
        }
        let step = tokio::select! {
            biased;
            v = rx.wait_for(|v| *v != Verdict::Valid) => Step::End(v.ok().and_then(|v| v.end_event())),
            chunk = s.body.next() => Step::Chunk(chunk),
        };
        let end = match step {
            Step::Chunk(chunk) => return chunk.map(|chunk| (chunk, s)),
            Step::End(end) => end,
        };
        match end {
            Some(event) => {
                s.ended = true;
                Some((Ok(axum::body::Bytes::from_static(event.as_bytes())), s))
            }
            None => {
                // The watch stopped (server shutdown): the stream goes on as it is.
                s.verdict = None;
                let chunk = s.body.next().await?;
                Some((chunk, s))
            }
        }
    });
    axum::body::Body::from_stream(stream)
}
