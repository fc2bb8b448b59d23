//! The collector: fetches every due, unpaused source on its schedule and stores its items.
//!
//! - Claiming: a due source is claimed by moving its `next_fetch_at` to a lease end with a
//!   compare-and-set ([`crate::store::Store::claim_news_source`]), so several replicas never
//!   fetch one source at once; a fetch cut short by a crash is retried after the lease.
//! - Conditional GET: `If-None-Match` / `If-Modified-Since` from the last 200's `ETag` /
//!   `Last-Modified` (RFC 9110 §13.1); a 304 is a success that changes nothing.
//! - Failures (timeout, unreachable, redirect loop, HTTP error, body over the cap, malformed
//!   document) are recorded with a stable code and back off: the next fetch comes after
//!   `interval × 2^failures` (at most [`MAX_BACKOFF`]), or after the server's `Retry-After`
//!   when that is longer.
//! - Storing: items are upserted by `(source, dedup_key)`; an item whose content changed
//!   is updated in place, an unchanged one is left alone.
//!
//! The loop ends with the server's shutdown token; fetches in flight are dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::feed;
use crate::store::{FetchRecord, NewsSourceRow, Store, UpsertCounts};
use crate::tools::search::config::SearchConfig;
use crate::tools::search::net;

/// Longest wait between two fetches of a failing source.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 3600);
/// Extra lease beyond the fetch timeout, for parsing and storing.
pub const LEASE_SLACK: Duration = Duration::from_secs(60);
/// Longest idle sleep of the loop when nothing is due.
pub const MAX_IDLE: Duration = Duration::from_secs(30);
/// `Accept` of feed requests.
pub const ACCEPT: &str = "application/rss+xml, application/atom+xml, application/feed+json, application/json;q=0.9, \
    application/xml;q=0.8, text/xml;q=0.8, */*;q=0.5";

/// The collector (see the module docs).
pub struct Collector {
    store: Store,
    clients: net::RuleClients,
    addresses: Arc<crate::net::AddressPolicy>,
    fetch_timeout: Duration,
    max_feed_bytes: u64,
    max_items: usize,
    /// Most items a source keeps (`--news-max-items-per-source`).
    keep: i64,
    /// Most items a user's sources keep together (`--news-max-items-per-user`).
    keep_per_owner: i64,
    concurrency: usize,
    wake: Notify,
    /// Items inserted since the store's search statistics were last refreshed.
    inserted_since_analyze: std::sync::atomic::AtomicU64,
}

/// New items after which the collector refreshes the store's search statistics, so that
/// the query planner knows how common each word is (a bulk load otherwise leaves Postgres
/// planning with default estimates until autovacuum gets to the table).
pub const ANALYZE_AFTER_ITEMS: u64 = 10_000;

/// Why a fetch failed: the `code` recorded in a source's `last_error` and the `error` of
/// its `last_fetch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FetchCode {
    /// The source did not answer within the fetch timeout.
    FeedTimeout,
    /// The source could not be reached (connection refused, DNS…).
    SourceUnreachable,
    /// The source redirects in a loop.
    RedirectLoop,
    /// A non-admin's source resolves, or redirects, to an internal address.
    InternalAddress,
    /// The source redirects more often than allowed.
    TooManyRedirects,
    /// The source answered with an HTTP error status.
    HttpError,
    /// The feed is larger than the configured cap.
    FeedTooLarge,
    /// The document is not a readable RSS, Atom or JSON feed.
    FeedMalformed,
    /// Any other failure of the fetch (or no HTTP client).
    FetchFailed,
    /// The fetch could not be recorded in the store.
    StoreFailed,
}

impl FetchCode {
    /// The snake_case code (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FeedTimeout => "feed_timeout",
            Self::SourceUnreachable => "source_unreachable",
            Self::RedirectLoop => "redirect_loop",
            Self::InternalAddress => "internal_address",
            Self::TooManyRedirects => "too_many_redirects",
            Self::HttpError => "http_error",
            Self::FeedTooLarge => "feed_too_large",
            Self::FeedMalformed => "feed_malformed",
            Self::FetchFailed => "fetch_failed",
            Self::StoreFailed => "store_failed",
        }
    }
}

/// A failed fetch.
#[derive(Debug, Clone)]
pub struct FetchError {
    /// Why.
    pub code: FetchCode,
    /// Human sentence.
    pub message: String,
    /// The HTTP status, when the server answered.
    pub status: Option<u16>,
    /// What the server asked us to wait.
    pub retry_after: Option<Duration>,
}

/// What one fetch did.
#[derive(Debug, Clone)]
pub enum FetchOutcome {
    /// 200: items stored.
    Stored(UpsertCounts),
    /// 304.
    NotModified,
    /// Failed and recorded.
    Failed(FetchError),
}

enum Response {
    Ok { body: Vec<u8>, etag: Option<String>, last_modified: Option<String>, content_type: Option<String> },
    NotModified,
}

impl Collector {
    /// A collector over `store` with the configured limits.
    /// A source a non-admin added is fetched under `addresses`' rule for its owner.
    pub fn new(store: Store, config: &SearchConfig, addresses: Arc<crate::net::AddressPolicy>) -> Self {
        let fetch_timeout = Duration::from_secs(config.news_fetch_timeout_secs.max(1));
        Self {
            store,
            clients: net::RuleClients::new(fetch_timeout, net::MAX_REDIRECTS),
            addresses,
            fetch_timeout,
            max_feed_bytes: config.news_max_feed_bytes,
            max_items: config.news_max_items_per_fetch.max(1),
            keep: i64::try_from(config.news_max_items_per_source.max(1)).unwrap_or(i64::MAX),
            keep_per_owner: i64::try_from(config.news_max_items_per_user).unwrap_or(i64::MAX),
            concurrency: config.news_concurrency.max(1),
            wake: Notify::new(),
            inserted_since_analyze: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Tells the loop something may be due (a new, resumed or "fetch now" source).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Runs the loop until `shutdown`.
    pub fn spawn(self: Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.run(shutdown).await })
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            let now = crate::ids::now();
            let limit = i64::try_from(self.concurrency * 2).unwrap_or(8);
            match self.store.due_news_sources(&now, limit).await {
                Ok(rows) => {
                    for row in rows {
                        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else { break };
                        match self.claim(&row, &now).await {
                            Ok(true) => {
                                let this = Arc::clone(&self);
                                let stop = shutdown.clone();
                                tasks.spawn(async move {
                                    tokio::select! {
                                        _ = this.collect(&row) => {}
                                        () = stop.cancelled() => {}
                                    }
                                    drop(permit);
                                    this.wake();
                                });
                            }
                            Ok(false) => {}
                            Err(e) => tracing::warn!(source = %row.id, error = %e, "claiming a news source failed"),
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading due news sources failed"),
            }
            while tasks.try_join_next().is_some() {}
            let idle = if permits.available_permits() == 0 { MAX_IDLE } else { self.until_next_due().await };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(idle) => {}
            }
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }

    async fn until_next_due(&self) -> Duration {
        let next = match self.store.next_news_due().await {
            Ok(Some(t)) => t,
            Ok(None) => return MAX_IDLE,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next due news source failed");
                return MAX_IDLE;
            }
        };
        let Ok(at) = chrono::DateTime::parse_from_rfc3339(&next) else { return MAX_IDLE };
        let wait = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
        wait.clamp(Duration::from_millis(20), MAX_IDLE)
    }

    async fn claim(&self, row: &NewsSourceRow, now: &str) -> Result<bool, crate::store::StoreError> {
        let lease = crate::ids::now_plus_ms(millis(self.fetch_timeout + LEASE_SLACK));
        self.store.claim_news_source(&row.id, &row.next_fetch_at, &lease, now).await
    }

    /// Claims every due source and collects them all, `concurrency` at a time, until
    /// nothing is due (the benchmark's entry point; the server uses the loop). Returns the
    /// fetches made.
    pub async fn collect_due_now(self: &Arc<Self>) -> usize {
        let mut done = 0;
        loop {
            let now = crate::ids::now();
            let rows = match self.store.due_news_sources(&now, 10_000).await {
                Ok(rows) if !rows.is_empty() => rows,
                _ => return done,
            };
            let permits = Arc::new(Semaphore::new(self.concurrency));
            let mut tasks = tokio::task::JoinSet::new();
            for row in rows {
                if !matches!(self.claim(&row, &now).await, Ok(true)) {
                    continue;
                }
                let this = Arc::clone(self);
                let permits = Arc::clone(&permits);
                tasks.spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    this.collect(&row).await
                });
            }
            while tasks.join_next().await.is_some() {
                done += 1;
            }
        }
    }

    /// Fetches one claimed source and records the outcome.
    pub async fn collect(&self, source: &NewsSourceRow) -> FetchOutcome {
        let started = Instant::now();
        let now = crate::ids::now();
        let interval = Duration::from_secs(u64::try_from(source.interval_secs).unwrap_or(900).max(1));
        let fetched = self.fetch(source).await;
        let duration_ms = millis(started.elapsed());
        let result = match fetched {
            Ok(Response::NotModified) => {
                let next = crate::ids::now_plus_ms(millis(interval));
                let last = json!({"at": now, "status": 304, "duration_ms": duration_ms});
                self.store
                    .record_news_not_modified(&source.id, &now, &next, &last)
                    .await
                    .map(|()| FetchOutcome::NotModified)
            }
            Ok(Response::Ok { body, etag, last_modified, content_type }) => {
                // Parsing up to the feed cap (16 MiB by default) is CPU work: on a blocking
                // thread, so that a large or hostile feed never holds a worker the API needs.
                let bytes = body.len();
                let (url, max_items) = (source.url.clone(), self.max_items);
                let parsed = tokio::task::spawn_blocking(move || {
                    feed::parse(&body, content_type.as_deref(), &url, max_items).map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|e| Err(format!("the parser stopped: {e}")));
                match parsed {
                    Ok(parsed) => {
                        let next = crate::ids::now_plus_ms(millis(interval));
                        let last = json!({
                            "at": now, "status": 200, "duration_ms": duration_ms, "bytes": bytes,
                            "entries": parsed.entries, "truncated": parsed.truncated, "skipped": parsed.skipped,
                            "max_items": self.max_items,
                        });
                        let rec = FetchRecord {
                            now: &now,
                            next_fetch_at: &next,
                            etag: etag.as_deref(),
                            last_modified: last_modified.as_deref(),
                            feed_title: parsed.title.as_deref(),
                            feed_format: parsed.format,
                            items: &parsed.items,
                            keep: self.keep,
                            keep_per_owner: self.keep_per_owner,
                        };
                        self.store.record_news_fetch(&source.id, &rec, &last).await.map(FetchOutcome::Stored)
                    }
                    Err(e) => {
                        let err = FetchError {
                            code: FetchCode::FeedMalformed,
                            message: format!("the document is not a readable RSS, Atom or JSON feed: {e}"),
                            status: Some(200),
                            retry_after: None,
                        };
                        self.fail(source, &now, interval, err, duration_ms).await
                    }
                }
            }
            Err(err) => self.fail(source, &now, interval, err, duration_ms).await,
        };
        if let Ok(FetchOutcome::Stored(counts)) = &result {
            use std::sync::atomic::Ordering;
            let total = self.inserted_since_analyze.fetch_add(counts.inserted, Ordering::Relaxed) + counts.inserted;
            if total >= ANALYZE_AFTER_ITEMS {
                self.inserted_since_analyze.store(0, Ordering::Relaxed);
                if let Err(e) = self.store.refresh_news_statistics().await {
                    tracing::warn!(error = %e, "refreshing news search statistics failed");
                }
            }
        }
        match result {
            Ok(outcome) => {
                if let FetchOutcome::Failed(e) = &outcome {
                    tracing::info!(source = %source.id, code = e.code.as_str(), error = %e.message, "news fetch failed");
                }
                outcome
            }
            Err(e) => {
                // The source may have been deleted while it was fetched.
                tracing::warn!(source = %source.id, error = %e, "recording a news fetch failed");
                FetchOutcome::Failed(FetchError {
                    code: FetchCode::StoreFailed,
                    message: e.to_string(),
                    status: None,
                    retry_after: None,
                })
            }
        }
    }

    async fn fail(
        &self,
        source: &NewsSourceRow,
        now: &str,
        interval: Duration,
        err: FetchError,
        duration_ms: u64,
    ) -> Result<FetchOutcome, crate::store::StoreError> {
        let failures = u32::try_from(source.failures.max(0)).unwrap_or(u32::MAX).saturating_add(1);
        let delay = backoff(interval, failures).max(err.retry_after.unwrap_or(Duration::ZERO)).min(MAX_BACKOFF);
        let next = crate::ids::now_plus_ms(millis(delay));
        let mut error = json!({"code": err.code, "message": err.message});
        if let Some(s) = err.status {
            error["status"] = json!(s);
        }
        let last = json!({"at": now, "status": err.status, "duration_ms": duration_ms, "error": err.code,
                          "retry_in_ms": millis(delay)});
        self.store.record_news_failure(&source.id, now, &next, &error, &last).await?;
        Ok(FetchOutcome::Failed(err))
    }

    async fn fetch(&self, source: &NewsSourceRow) -> Result<Response, FetchError> {
        let client = self.clients.get(self.addresses.rule_for(source.owner_id.as_deref())).map_err(|e| FetchError {
            code: FetchCode::FetchFailed,
            message: e.to_string(),
            status: None,
            retry_after: None,
        })?;
        let mut req = client.get(&source.url).header(reqwest::header::ACCEPT, ACCEPT);
        if let Some(etag) = &source.etag {
            req = req.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        if let Some(lm) = &source.last_modified {
            req = req.header(reqwest::header::IF_MODIFIED_SINCE, lm);
        }
        let resp = req.send().await.map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_MODIFIED {
            return Ok(Response::NotModified);
        }
        if !status.is_success() {
            let retry_after = net::retry_after(resp.headers());
            let reason = status.canonical_reason().unwrap_or("");
            return Err(FetchError {
                code: FetchCode::HttpError,
                message: format!("the source answered HTTP {} {reason}", status.as_u16()),
                status: Some(status.as_u16()),
                retry_after,
            });
        }
        let header = |name: reqwest::header::HeaderName| {
            resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned).filter(|v| v.len() <= 1024)
        };
        let etag = header(reqwest::header::ETAG);
        let last_modified = header(reqwest::header::LAST_MODIFIED);
        let content_type = header(reqwest::header::CONTENT_TYPE);
        let body = net::read_capped(resp, self.max_feed_bytes).await.map_err(|e| match e {
            net::BodyError::TooLarge(max) => FetchError {
                code: FetchCode::FeedTooLarge,
                message: format!("the feed is larger than the {max}-byte cap"),
                status: Some(status.as_u16()),
                retry_after: None,
            },
            net::BodyError::Transfer(e) => self.transport_error(&e),
        })?;
        Ok(Response::Ok { body, etag, last_modified, content_type })
    }

    fn transport_error(&self, e: &reqwest::Error) -> FetchError {
        let (code, message) = if e.is_timeout() {
            (FetchCode::FeedTimeout, format!("the source did not answer within {} s", self.fetch_timeout.as_secs()))
        } else if crate::net::refused_address(e).is_some() {
            (FetchCode::InternalAddress, format!("the source is refused: {}", net::describe(e)))
        } else if net::is_redirect_loop(e) {
            (FetchCode::RedirectLoop, format!("the source redirects in a loop: {}", net::describe(e)))
        } else if e.is_redirect() {
            (FetchCode::TooManyRedirects, format!("the source redirects too often: {}", net::describe(e)))
        } else if e.is_connect() {
            (FetchCode::SourceUnreachable, format!("the source could not be reached: {}", net::describe(e)))
        } else {
            (FetchCode::FetchFailed, format!("fetching the source failed: {}", net::describe(e)))
        };
        FetchError { code, message, status: None, retry_after: None }
    }
}

/// `interval × 2^failures`, at most [`MAX_BACKOFF`].
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    interval.saturating_mul(2u32.saturating_pow(failures.min(20))).min(MAX_BACKOFF)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The JSON form of a stored `last_error` / `last_fetch` column (null when absent).
pub fn json_or_null(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok()).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_codes_serialise_as_their_text() {
        use FetchCode::*;
        for code in [
            FeedTimeout,
            SourceUnreachable,
            RedirectLoop,
            InternalAddress,
            TooManyRedirects,
            HttpError,
            FeedTooLarge,
            FeedMalformed,
            FetchFailed,
            StoreFailed,
        ] {
            assert_eq!(json!(code), json!(code.as_str()));
        }
        assert_eq!(json!({"code": HttpError}), json!({"code": "http_error"}));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let i = Duration::from_secs(60);
        assert_eq!(backoff(i, 1), Duration::from_secs(120));
        assert_eq!(backoff(i, 3), Duration::from_secs(480));
        assert_eq!(backoff(i, 30), MAX_BACKOFF);
    }
}
