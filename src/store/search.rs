//! Search storage: web search provider connections, News Hub sources and items, and the
//! full-text query over items — FTS5 on SQLite, `tsvector` + `websearch_to_tsquery` on
//! Postgres (the one place these queries differ by [`Backend`]).

use serde::Serialize;

use super::{Backend, Store, StoreResult};
use crate::state::Flag;

/// A stored web search provider connection (the credential stays sealed).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SearchConnectionRow {
    /// `sconn_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// `searxng`, `brave` or `tavily`.
    pub provider: String,
    /// Display name.
    pub name: String,
    /// Base URL without a trailing slash.
    pub base_url: String,
    /// `none`, `encrypted` or `env`.
    pub credential_kind: String,
    /// Sealed credential (kind `encrypted`).
    pub credential_ciphertext: Option<String>,
    /// Id of the key that sealed it.
    pub credential_key_id: Option<String>,
    /// Environment variable name (kind `env`).
    pub credential_env: Option<String>,
    /// True when calls may use it (stored as 0/1).
    #[sqlx(try_from = "Flag")]
    pub enabled: bool,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// A news source with its collection state.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NewsSourceRow {
    /// `nsrc_…`
    pub id: String,
    /// NULL = deployment-wide.
    pub owner_id: Option<String>,
    /// Display name.
    pub name: String,
    /// Feed URL.
    pub url: String,
    /// True when the collector skips it (stored as 0/1).
    #[sqlx(try_from = "Flag")]
    pub paused: bool,
    /// Seconds between fetches.
    pub interval_secs: i64,
    /// When the collector fetches it next (or the end of a running fetch's lease).
    pub next_fetch_at: String,
    /// Validator of the last 200 answer.
    pub etag: Option<String>,
    /// Validator of the last 200 answer.
    pub last_modified: Option<String>,
    /// Consecutive failures.
    pub failures: i64,
    /// When the last fetch started.
    pub last_fetch_at: Option<String>,
    /// When the last fetch succeeded (200 or 304).
    pub last_success_at: Option<String>,
    /// JSON `{code, message, status?}` of the most recent failure.
    pub last_error: Option<String>,
    /// When it happened.
    pub last_error_at: Option<String>,
    /// JSON summary of the last completed fetch.
    pub last_fetch: Option<String>,
    /// Items stored for it.
    pub item_count: i64,
    /// The feed's own title.
    pub feed_title: Option<String>,
    /// `rss`, `atom` or `json_feed`.
    pub feed_format: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

impl NewsSourceRow {
    /// A new source, due now, with no collection history: `owner_id` None = shared.
    pub fn new(owner_id: Option<String>, name: String, url: String, interval_secs: i64) -> Self {
        let now = crate::ids::now();
        Self {
            id: crate::ids::new_id("nsrc"),
            owner_id,
            name,
            url,
            paused: false,
            interval_secs,
            next_fetch_at: now.clone(),
            etag: None,
            last_modified: None,
            failures: 0,
            last_fetch_at: None,
            last_success_at: None,
            last_error: None,
            last_error_at: None,
            last_fetch: None,
            item_count: 0,
            feed_title: None,
            feed_format: None,
            created_at: now.clone(),
            updated_at: now,
        }
    }
}

/// An item as parsed from a feed, before it is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NewNewsItem {
    /// `guid:…`, `url:…` or `title:…` (see the migration).
    pub dedup_key: String,
    /// The feed's id for the entry.
    pub guid: Option<String>,
    /// Canonical URL of the entry's page.
    pub url: Option<String>,
    /// Plain-text title.
    pub title: String,
    /// Plain-text summary.
    pub summary: String,
    /// Plain-text content.
    pub content: String,
    /// Author names.
    pub author: Option<String>,
    /// Publication time (RFC 3339) when the feed gave one.
    pub published_at: Option<String>,
    /// SHA-256 of the fields above (what "changed" means).
    pub content_sha256: String,
}

/// The outcome of a 200 fetch to record.
#[derive(Debug, Clone)]
pub struct FetchRecord<'a> {
    /// Now (RFC 3339).
    pub now: &'a str,
    /// When to fetch next.
    pub next_fetch_at: &'a str,
    /// New ETag.
    pub etag: Option<&'a str>,
    /// New Last-Modified.
    pub last_modified: Option<&'a str>,
    /// The feed's title.
    pub feed_title: Option<&'a str>,
    /// `rss`, `atom` or `json_feed`.
    pub feed_format: &'a str,
    /// Items to upsert, deduplicated by `dedup_key` already.
    pub items: &'a [NewNewsItem],
    /// Most items the source keeps: after the upsert, older ones (by `effective_at`, then
    /// id) beyond this many are removed in the same transaction.
    pub keep: i64,
    /// Most items a user's own sources keep together: a user's source keeps at most what its
    /// owner's other sources leave of this (a deployment-wide source only `keep`).
    pub keep_per_owner: i64,
}

/// How an upsert went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UpsertCounts {
    /// New items.
    pub inserted: u64,
    /// Items whose content changed.
    pub updated: u64,
    /// Items seen before without change.
    pub unchanged: u64,
    /// Older items removed to keep the source within its limit ([`FetchRecord::keep`]).
    pub removed: u64,
}

/// Sort order of a news search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewsSort {
    /// Best match first (BM25 on SQLite, `ts_rank_cd` on Postgres), newest first on ties.
    Relevance,
    /// Newest first by `effective_at`.
    Time,
}

/// A news search as the store runs it.
#[derive(Debug, Clone)]
pub struct NewsQuery<'a> {
    /// The user whose sources (and the deployment-wide ones) are searched.
    pub user_id: &'a str,
    /// The query text as the user wrote it, in the language of [`super::news_query`]
    /// (Postgres reads it with `websearch_to_tsquery`; SQLite gets its FTS5 translation).
    pub text: &'a str,
    /// Only items with `effective_at >= since`.
    pub since: Option<&'a str>,
    /// Only items with `effective_at <= until`.
    pub until: Option<&'a str>,
    /// Only this source (id, name or feed URL).
    pub source: Option<&'a str>,
    /// Order.
    pub sort: NewsSort,
    /// Most hits.
    pub limit: i64,
}

/// One hit.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NewsHit {
    /// `nitem_…`
    pub id: String,
    /// The source.
    pub source_id: String,
    /// Its name.
    pub source_name: String,
    /// Its feed URL.
    pub source_url: String,
    /// The entry's id in the feed.
    pub guid: Option<String>,
    /// The entry's page.
    pub url: Option<String>,
    /// Title.
    pub title: String,
    /// Summary.
    pub summary: String,
    /// Publication time, when known.
    pub published_at: Option<String>,
    /// First collected.
    pub collected_at: String,
    /// Last changed.
    pub changed_at: String,
    /// SHA-256 of the stored version.
    pub content_sha256: String,
    /// The passage around the match.
    pub snippet: String,
    /// Relevance (higher is better; scales differ between back-ends).
    pub score: f64,
}

/// Items per upsert statement (14 parameters each; well under SQLite's 32,766 and
/// Postgres' 65,535 parameter limits).
pub const UPSERT_CHUNK: usize = 100;

/// Most older items one fetch removes to keep its source within [`FetchRecord::keep`].
const MAX_REMOVED_PER_FETCH: i64 = 100_000;

/// Both back-ends rank (BM25 on SQLite, `ts_rank_cd` on Postgres) only the newest this many
/// matches of a query (by `effective_at`, then id, both descending): ranking every match of a
/// common word across 100k items took over 100 ms on either back-end (`mira bench news`).
pub const NEWS_RANK_POOL: usize = 128;

/// SQLite: from this many matches on, a news search walks the time index against the match
/// list instead of going from the matches to the items.
const SQLITE_WALK_FROM: i64 = 2048;

/// SQLite: from this many matches on, a news search walks the time index probing each item's
/// rowid under the MATCH (about 20 µs a probe, so it only pays when most items match).
const SQLITE_PROBE_FROM: i64 = 32768;

/// Postgres: the newest-first windows a news search walks, in items: the matches are looked for among
/// the newest 512 items first, then the next 3,584, then the next 28,672, then the rest, until
/// [`NEWS_RANK_POOL`] are found. A common word is done after the first window; a rare one costs
/// a few index lookups per window.
const NEWS_WINDOWS: [i64; 3] = [512, 4096, 32768];

/// How long the window boundaries are reused. They only shape the work: any non-increasing
/// boundaries partition the items, so stale ones give the same hits.
const NEWS_CUTS_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// How a news search window finds its matches on SQLite (Postgres leaves it to its planner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NewsScan<'a> {
    /// Down the time index, one FTS5 rowid probe per item.
    Probe,
    /// Down the time index, against the match list read once.
    Walk,
    /// From the match list to the items, then sorted.
    Matches,
    /// Postgres: the planner's choice, with the phrase prefilter when the query has one
    /// (the JSON array of the adjacent lexeme pairs every match holds: [`Store::news_phrase_pairs`]).
    Planner { pairs: Option<&'a str> },
}

/// The `effective_at` of the items at the [`NEWS_WINDOWS`] offsets (newest first), and when
/// they were read.
#[derive(Debug, Clone)]
pub struct NewsCuts {
    read_at: std::time::Instant,
    cuts: Vec<String>,
}

const SOURCE_COLUMNS: &str = "id, owner_id, name, url, paused, interval_secs, next_fetch_at, etag, last_modified, \
    failures, last_fetch_at, last_success_at, last_error, last_error_at, last_fetch, item_count, feed_title, \
    feed_format, created_at, updated_at";

impl Store {
    // ---- connections -------------------------------------------------------------------

    /// Stores a new connection, unless its owner has `limit` already (false, nothing stored).
    /// The count and the insert are one write transaction under the owner's lock
    /// ([`Store::begin_owner_write`]), so concurrent requests never pass the limit together.
    pub async fn create_search_connection(&self, row: &SearchConnectionRow, limit: i64) -> StoreResult<bool> {
        let (_turn, mut tx) = self.begin_owner_write(&row.owner_id).await?;
        let owned: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM search_connections WHERE owner_id = $1")
            .bind(&row.owner_id)
            .fetch_one(tx.conn())
            .await?;
        if owned >= limit {
            tx.commit().await?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO search_connections (id, owner_id, provider, name, base_url, credential_kind,
                 credential_ciphertext, credential_key_id, credential_env, enabled, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.provider)
        .bind(&row.name)
        .bind(&row.base_url)
        .bind(&row.credential_kind)
        .bind(&row.credential_ciphertext)
        .bind(&row.credential_key_id)
        .bind(&row.credential_env)
        .bind(i64::from(row.enabled))
        .bind(&row.created_at)
        .bind(&row.updated_at)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Every stored connection of every user, oldest first (the in-memory availability
    /// state is built from this).
    pub async fn all_search_connections(&self) -> StoreResult<Vec<SearchConnectionRow>> {
        Ok(sqlx::query_as("SELECT * FROM search_connections ORDER BY id").fetch_all(self.pool()).await?)
    }

    /// The caller's connection, or None (also for another user's).
    pub async fn search_connection_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<SearchConnectionRow>> {
        Ok(sqlx::query_as("SELECT * FROM search_connections WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Writes the mutable fields of a connection (name, enabled, credential). False when it
    /// is not the caller's.
    pub async fn update_search_connection(&self, row: &SearchConnectionRow) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE search_connections SET name = $3, enabled = $4, credential_kind = $5,
                 credential_ciphertext = $6, credential_key_id = $7, credential_env = $8, updated_at = $9
             WHERE id = $1 AND owner_id = $2",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.name)
        .bind(i64::from(row.enabled))
        .bind(&row.credential_kind)
        .bind(&row.credential_ciphertext)
        .bind(&row.credential_key_id)
        .bind(&row.credential_env)
        .bind(&row.updated_at)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes the caller's connection. False when it is not the caller's.
    pub async fn delete_search_connection(&self, owner_id: &str, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM search_connections WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    // ---- news sources ------------------------------------------------------------------

    /// Stores a new source. The same URL twice for one owner (or twice deployment-wide) is a
    /// unique violation.
    pub async fn create_news_source(&self, row: &NewsSourceRow) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        insert_news_source(&mut tx, row).await?;
        tx.commit().await
    }

    /// Stores a source, unless its owner (`row.owner_id`) owns `limit` already (false, nothing
    /// stored): counted and inserted in one write transaction under the owner's lock
    /// ([`Store::begin_owner_write`]), so concurrent requests never pass the limit together. A
    /// deployment-wide source (no owner) counts against no limit. Errors as
    /// [`Store::create_news_source`].
    pub async fn create_news_source_within(&self, row: &NewsSourceRow, limit: i64) -> StoreResult<bool> {
        let Some(owner_id) = row.owner_id.as_deref() else {
            self.create_news_source(row).await?;
            return Ok(true);
        };
        let (_turn, mut tx) = self.begin_owner_write(owner_id).await?;
        let owned: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM news_sources WHERE owner_id = $1")
            .bind(owner_id)
            .fetch_one(tx.conn())
            .await?;
        if owned >= limit {
            tx.commit().await?;
            return Ok(false);
        }
        insert_news_source(&mut tx, row).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Sources visible to the user (own and deployment-wide), by id, `limit` after `cursor`.
    pub async fn list_news_sources(
        &self,
        user_id: &str,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<NewsSourceRow>> {
        let sql = format!(
            "SELECT {SOURCE_COLUMNS} FROM news_sources WHERE (owner_id = $1 OR owner_id IS NULL)
             AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(user_id)
            // An empty cursor is no cursor (every id sorts after it, as it always did).
            .bind(cursor.filter(|c| !c.is_empty()))
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    /// A source the user can see, or None.
    pub async fn news_source_visible(&self, user_id: &str, id: &str) -> StoreResult<Option<NewsSourceRow>> {
        let sql =
            format!("SELECT {SOURCE_COLUMNS} FROM news_sources WHERE id = $1 AND (owner_id = $2 OR owner_id IS NULL)");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id).bind(user_id).fetch_optional(self.pool()).await?)
    }

    /// A source by id (the collector's view).
    pub async fn news_source(&self, id: &str) -> StoreResult<Option<NewsSourceRow>> {
        let sql = format!("SELECT {SOURCE_COLUMNS} FROM news_sources WHERE id = $1");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(self.pool()).await?)
    }

    /// Pauses or resumes a source; resuming makes it due now.
    pub async fn set_news_source_paused(&self, id: &str, paused: bool) -> StoreResult<()> {
        let now = crate::ids::now();
        let sql = if paused {
            "UPDATE news_sources SET paused = 1, updated_at = $2 WHERE id = $1"
        } else {
            "UPDATE news_sources SET paused = 0, next_fetch_at = $2, updated_at = $2 WHERE id = $1"
        };
        sqlx::query(sql).bind(id).bind(&now).execute(self.pool()).await?;
        Ok(())
    }

    /// Makes a source due now.
    pub async fn news_source_due_now(&self, id: &str) -> StoreResult<()> {
        let now = crate::ids::now();
        sqlx::query("UPDATE news_sources SET next_fetch_at = $2, updated_at = $2 WHERE id = $1")
            .bind(id)
            .bind(&now)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Deletes a source and its items in one transaction.
    pub async fn delete_news_source(&self, id: &str) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        sqlx::query("DELETE FROM news_items WHERE source_id = $1").bind(id).execute(tx.conn()).await?;
        let done = sqlx::query("DELETE FROM news_sources WHERE id = $1").bind(id).execute(tx.conn()).await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// `(owner_id, number of sources)` for every owner (None = deployment-wide).
    pub async fn news_source_counts(&self) -> StoreResult<Vec<(Option<String>, i64)>> {
        Ok(sqlx::query_as("SELECT owner_id, COUNT(*) FROM news_sources GROUP BY owner_id")
            .fetch_all(self.pool())
            .await?)
    }

    // ---- the collector -----------------------------------------------------------------

    /// Unpaused sources due at `now`, most overdue first.
    pub async fn due_news_sources(&self, now: &str, limit: i64) -> StoreResult<Vec<NewsSourceRow>> {
        let sql = format!(
            "SELECT {SOURCE_COLUMNS} FROM news_sources WHERE paused = 0 AND next_fetch_at <= $1
             ORDER BY next_fetch_at LIMIT $2"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(now).bind(limit).fetch_all(self.pool()).await?)
    }

    /// The earliest `next_fetch_at` of unpaused sources.
    pub async fn next_news_due(&self) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar("SELECT MIN(next_fetch_at) FROM news_sources WHERE paused = 0")
            .fetch_one(self.pool())
            .await?)
    }

    /// Claims a due source: moves `next_fetch_at` from `seen` to `lease_until` (compare-and-
    /// set, so of several collectors exactly one wins) and stamps `last_fetch_at`.
    pub async fn claim_news_source(&self, id: &str, seen: &str, lease_until: &str, now: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE news_sources SET next_fetch_at = $3, last_fetch_at = $4
             WHERE id = $1 AND next_fetch_at = $2 AND paused = 0",
        )
        .bind(id)
        .bind(seen)
        .bind(lease_until)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a 200 fetch: upserts its items [`UPSERT_CHUNK`] per statement (a changed item
    /// is updated in place, an unchanged one untouched; `items` must not repeat a
    /// `dedup_key`), stores the validators, clears the failure count and recounts the
    /// source's items — one transaction.
    pub async fn record_news_fetch(
        &self,
        source_id: &str,
        rec: &FetchRecord<'_>,
        last_fetch: &serde_json::Value,
    ) -> StoreResult<UpsertCounts> {
        let mut counts = UpsertCounts::default();
        let _serial = match self.backend() {
            Backend::Sqlite => Some(self.news_writes.lock().await),
            Backend::Postgres => None,
        };
        let mut tx = self.begin_write().await?;
        for chunk in rec.items.chunks(UPSERT_CHUNK) {
            let ids: Vec<String> = chunk.iter().map(|_| crate::ids::new_id("nitem")).collect();
            let rows: Vec<String> = (0..chunk.len())
                .map(|r| {
                    let p: Vec<String> = (1..=14).map(|c| format!("${}", r * 14 + c)).collect();
                    format!("({})", p.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO news_items (id, source_id, dedup_key, guid, url, title, summary, content, author,
                     published_at, collected_at, changed_at, effective_at, content_sha256)
                 VALUES {}
                 ON CONFLICT (source_id, dedup_key) DO UPDATE SET
                     guid = excluded.guid, url = excluded.url, title = excluded.title,
                     summary = excluded.summary, content = excluded.content, author = excluded.author,
                     published_at = excluded.published_at, changed_at = excluded.changed_at,
                     effective_at = COALESCE(excluded.published_at, news_items.collected_at),
                     content_sha256 = excluded.content_sha256
                 WHERE news_items.content_sha256 <> excluded.content_sha256
                 RETURNING id",
                rows.join(", ")
            );
            let mut q = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql));
            for (item, id) in chunk.iter().zip(&ids) {
                q = q
                    .bind(id)
                    .bind(source_id)
                    .bind(&item.dedup_key)
                    .bind(&item.guid)
                    .bind(&item.url)
                    .bind(&item.title)
                    .bind(&item.summary)
                    .bind(&item.content)
                    .bind(&item.author)
                    .bind(&item.published_at)
                    .bind(rec.now)
                    .bind(rec.now)
                    .bind(item.published_at.as_deref().unwrap_or(rec.now))
                    .bind(&item.content_sha256);
            }
            let returned = q.fetch_all(tx.conn()).await?;
            let new_ids: std::collections::HashSet<&String> = ids.iter().collect();
            let inserted = returned.iter().filter(|r| new_ids.contains(r)).count() as u64;
            counts.inserted += inserted;
            counts.updated += returned.len() as u64 - inserted;
            counts.unchanged += (chunk.len() - returned.len()) as u64;
        }
        // A feed that brings new ids at every fetch must not fill the disk every user shares:
        // the source keeps its newest `keep` items. (At most `MAX_REMOVED_PER_FETCH` go per
        // fetch, so a lowered limit is reached over a few fetches.)
        // A user's 500 sources must not each keep `keep` either: their owner's other sources'
        // counts (kept on their rows) leave this one the rest of `keep_per_owner`.
        let (owner, others): (Option<String>, i64) = sqlx::query_as(
            "SELECT s.owner_id, CAST(COALESCE((SELECT SUM(o.item_count) FROM news_sources o
                 WHERE o.owner_id = s.owner_id AND o.id <> s.id), 0) AS BIGINT)
             FROM news_sources s WHERE s.id = $1",
        )
        .bind(source_id)
        .fetch_one(tx.conn())
        .await?;
        let keep = match owner {
            Some(_) => rec.keep.min(rec.keep_per_owner.saturating_sub(others)).max(0),
            None => rec.keep.max(1),
        };
        counts.removed = sqlx::query(
            "DELETE FROM news_items WHERE source_id = $1 AND id IN (
                 SELECT id FROM news_items WHERE source_id = $1
                 ORDER BY effective_at DESC, id DESC LIMIT $3 OFFSET $2)",
        )
        .bind(source_id)
        .bind(keep)
        .bind(MAX_REMOVED_PER_FETCH)
        .execute(tx.conn())
        .await?
        .rows_affected();
        let mut last_fetch = last_fetch.clone();
        last_fetch["removed"] = counts.removed.into();
        last_fetch["inserted"] = counts.inserted.into();
        last_fetch["updated"] = counts.updated.into();
        last_fetch["unchanged"] = counts.unchanged.into();
        sqlx::query(
            "UPDATE news_sources SET etag = $2, last_modified = $3, feed_title = $4, feed_format = $5,
                 failures = 0, last_success_at = $6, next_fetch_at = $7, last_fetch = $8, updated_at = $6,
                 item_count = (SELECT COUNT(*) FROM news_items WHERE source_id = $1)
             WHERE id = $1",
        )
        .bind(source_id)
        .bind(rec.etag)
        .bind(rec.last_modified)
        .bind(rec.feed_title)
        .bind(rec.feed_format)
        .bind(rec.now)
        .bind(rec.next_fetch_at)
        .bind(last_fetch.to_string())
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(counts)
    }

    /// Records a 304 Not Modified: a success that changed nothing.
    pub async fn record_news_not_modified(
        &self,
        source_id: &str,
        now: &str,
        next_fetch_at: &str,
        last_fetch: &serde_json::Value,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE news_sources SET failures = 0, last_success_at = $2, next_fetch_at = $3, last_fetch = $4,
                 updated_at = $2
             WHERE id = $1",
        )
        .bind(source_id)
        .bind(now)
        .bind(next_fetch_at)
        .bind(last_fetch.to_string())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records a failed fetch: one more consecutive failure, the error, the backed-off next
    /// fetch.
    pub async fn record_news_failure(
        &self,
        source_id: &str,
        now: &str,
        next_fetch_at: &str,
        error: &serde_json::Value,
        last_fetch: &serde_json::Value,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE news_sources SET failures = failures + 1, last_error = $2, last_error_at = $3,
                 next_fetch_at = $4, last_fetch = $5, updated_at = $3
             WHERE id = $1",
        )
        .bind(source_id)
        .bind(error.to_string())
        .bind(now)
        .bind(next_fetch_at)
        .bind(last_fetch.to_string())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Refreshes the planner statistics of the items table (Postgres `ANALYZE`; FTS5 on
    /// SQLite needs none).
    pub async fn refresh_news_statistics(&self) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("ANALYZE news_items").execute(self.pool()).await?;
        }
        Ok(())
    }

    /// Number of stored items (all sources).
    pub async fn count_news_items(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM news_items").fetch_one(self.pool()).await?)
    }

    // ---- search ------------------------------------------------------------------------

    /// Whether `user_id` can see every news source (its own and the shared ones are all there are).
    async fn sees_every_news_source(&self, user_id: &str) -> StoreResult<bool> {
        let hidden: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM news_sources WHERE owner_id IS NOT NULL AND owner_id <> $1")
                .bind(user_id)
                .fetch_one(self.pool())
                .await?;
        Ok(hidden == 0)
    }

    /// The window boundaries of [`Store::search_news`]: newest first, at most
    /// `NEWS_WINDOWS.len()`, cached for [`NEWS_CUTS_TTL`].
    async fn news_window_cuts(&self) -> StoreResult<Vec<String>> {
        if let Some(c) = self.news_cuts.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
            && c.read_at.elapsed() < NEWS_CUTS_TTL
        {
            return Ok(c.cuts.clone());
        }
        let one = "(SELECT effective_at FROM news_items ORDER BY effective_at DESC LIMIT 1 OFFSET {})";
        let sql = format!(
            "SELECT {}, {}, {}",
            one.replace("{}", &(NEWS_WINDOWS[0] - 1).to_string()),
            one.replace("{}", &(NEWS_WINDOWS[1] - 1).to_string()),
            one.replace("{}", &(NEWS_WINDOWS[2] - 1).to_string()),
        );
        let (a, b, c): (Option<String>, Option<String>, Option<String>) =
            sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_one(self.pool()).await?;
        let cuts: Vec<String> = [a, b, c].into_iter().flatten().collect();
        *self.news_cuts.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(NewsCuts { read_at: std::time::Instant::now(), cuts: cuts.clone() });
        Ok(cuts)
    }

    /// Full-text search over the items of the sources `q.user_id` can see (see
    /// [`NewsQuery`]), in two steps that run the same way on both back-ends:
    ///
    /// 1. **Pool**: the newest [`NEWS_RANK_POOL`] matches (by `effective_at`, then id, both
    ///    descending), so a common word reads a few hundred rows and a rare one a few index
    ///    entries. SQLite matches with FTS5 `MATCH` and picks its scan by the number of
    ///    matches ([`SQLITE_WALK_FROM`], [`SQLITE_PROBE_FROM`]); Postgres matches with
    ///    `@@ websearch_to_tsquery('english', …)` over the stored `search` vector and its GIN
    ///    index, window by window ([`NEWS_WINDOWS`], newest items first); a phrase every
    ///    match needs is looked up first by its adjacent lexeme pairs in the pair index
    ///    (`phrase_pairs`, migration 0020), which the lexeme index cannot answer since it
    ///    holds no positions ([`super::news_query::phrase_pairs`]).
    /// 2. **Rank**: only the pool is ranked — SQLite: BM25 (title ×10, summary ×4, content
    ///    ×1) with `snippet()`; Postgres: `ts_rank_cd` over the A/B/C-weighted vector with
    ///    `ts_headline` — and the best `limit` returned (by score, or by time with
    ///    [`NewsSort::Time`]). The passage is computed for those rows alone.
    ///
    /// A query without a positive term ([`super::news_query::has_positive_term`]) finds
    /// nothing.
    pub async fn search_news(&self, q: &NewsQuery<'_>) -> StoreResult<Vec<NewsHit>> {
        let text = match self.backend() {
            Backend::Sqlite => match super::news_query::to_fts5(q.text) {
                Some(fts5) => fts5,
                None => return Ok(Vec::new()),
            },
            Backend::Postgres if super::news_query::has_positive_term(q.text) => q.text.to_owned(),
            Backend::Postgres => return Ok(Vec::new()),
        };
        // When the caller sees every source and names none, the source condition is left out
        // (no join, no per-row check).
        let every = q.source.is_none() && self.sees_every_news_source(q.user_id).await?;
        let mut pool: Vec<String> = Vec::with_capacity(NEWS_RANK_POOL);
        match self.backend() {
            // SQLite: how the newest matches are found depends on how many there are, counted
            // up to SQLITE_PROBE_FROM: few → from the match list to the items; more → down the
            // time index against the match list; very many → down the time index with a rowid
            // probe per item, which stops after a few hundred items.
            Backend::Sqlite => {
                let many: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM news_items_fts WHERE news_items_fts MATCH $1 LIMIT $2)",
                )
                .bind(&text)
                .bind(SQLITE_PROBE_FROM)
                .fetch_one(self.pool())
                .await?;
                let scan = match many {
                    n if n >= SQLITE_PROBE_FROM => NewsScan::Probe,
                    n if n >= SQLITE_WALK_FROM => NewsScan::Walk,
                    _ => NewsScan::Matches,
                };
                pool = self.news_window(q, &text, every, None, None, NEWS_RANK_POOL, scan).await?;
            }
            // Postgres: window by window ([`NEWS_WINDOWS`]) until the pool is full.
            Backend::Postgres => {
                let pairs = self.news_phrase_pairs(&text).await?;
                let cuts = self.news_window_cuts().await?;
                for w in 0..=cuts.len() {
                    let lower = cuts.get(w).map(String::as_str);
                    let upper = w.checked_sub(1).and_then(|u| cuts.get(u)).map(String::as_str);
                    let need = NEWS_RANK_POOL - pool.len();
                    let scan = NewsScan::Planner { pairs: pairs.as_deref() };
                    pool.extend(self.news_window(q, &text, every, lower, upper, need, scan).await?);
                    if pool.len() >= NEWS_RANK_POOL {
                        break;
                    }
                }
            }
        }
        if pool.is_empty() {
            return Ok(Vec::new());
        }
        let order = match q.sort {
            NewsSort::Relevance => "score DESC, effective_at DESC, id",
            NewsSort::Time => "effective_at DESC, score DESC, id",
        };
        let order_top = order.replace(", ", ", top.");
        let sql = match self.backend() {
            // BM25 runs in one scan of the match list restricted to the pool's rowids (the
            // unary `+` keeps the IN list from becoming one lookup per rowid, each of which
            // would recompute the phrase statistics); `snippet()` then runs for the best
            // `limit` rows alone, each looked up by rowid under the same MATCH (CROSS JOIN
            // keeps `top` the outer loop).
            Backend::Sqlite => format!(
                "WITH ranked AS MATERIALIZED (
                     SELECT rowid AS n, -bm25(news_items_fts, 10.0, 4.0, 1.0) AS score
                     FROM news_items_fts
                     WHERE news_items_fts MATCH $1
                       AND rowid >= (SELECT min(CAST(value AS INTEGER)) FROM json_each($2))
                       AND rowid <= (SELECT max(CAST(value AS INTEGER)) FROM json_each($2))
                       AND +rowid IN (SELECT CAST(value AS INTEGER) FROM json_each($2))
                 ), top AS (
                     SELECT ranked.n, i.effective_at AS effective_at, i.id AS id, ranked.score AS score
                     FROM ranked JOIN news_items i ON i.n = ranked.n
                     ORDER BY {order} LIMIT $3
                 )
                 SELECT i.id, i.source_id, s.name AS source_name, s.url AS source_url, i.guid, i.url, i.title,
                        i.summary, i.published_at, i.collected_at, i.changed_at, i.content_sha256,
                        snippet(news_items_fts, -1, '', '', '…', 32) AS snippet, top.score
                 FROM top
                 CROSS JOIN news_items_fts ON news_items_fts.rowid = top.n
                 JOIN news_items i ON i.n = top.n
                 JOIN news_sources s ON s.id = i.source_id
                 WHERE news_items_fts MATCH $1
                 ORDER BY top.{order_top}"
            ),
            Backend::Postgres => format!(
                "WITH top AS MATERIALIZED (
                     SELECT i.id, i.effective_at,
                            ts_rank_cd(i.search, websearch_to_tsquery('english', $1))::float8 AS score
                     FROM json_array_elements_text($2::json) AS p(id)
                     JOIN news_items i ON i.id = p.id
                     ORDER BY {order} LIMIT $3
                 )
                 SELECT i.id, i.source_id, s.name AS source_name, s.url AS source_url, i.guid, i.url, i.title,
                        i.summary, i.published_at, i.collected_at, i.changed_at, i.content_sha256,
                        ts_headline('english', i.title || ' — ' || i.summary || ' ' || i.content,
                                    websearch_to_tsquery('english', $1),
                                    'StartSel=\"\", StopSel=\"\", MaxWords=40, MinWords=15, MaxFragments=1')
                            AS snippet,
                        top.score
                 FROM top
                 JOIN news_items i ON i.id = top.id
                 JOIN news_sources s ON s.id = i.source_id
                 ORDER BY top.{order_top}"
            ),
        };
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(text)
            .bind(serde_json::Value::from(pool).to_string())
            .bind(q.limit)
            // Not a cached prepared statement: Postgres then plans each search with its actual
            // words (see `news_window`).
            .persistent(false)
            .fetch_all(self.pool())
            .await?)
    }

    /// Postgres: the adjacent lexeme pairs every match of `text` holds (see
    /// [`super::news_query::phrase_pairs`]) as a JSON array of `"x y"` strings, or None when
    /// the query has no phrase (one round trip, only for queries that may have one).
    async fn news_phrase_pairs(&self, text: &str) -> StoreResult<Option<String>> {
        if !super::news_query::may_have_phrase(text) {
            return Ok(None);
        }
        let tsquery: String = sqlx::query_scalar("SELECT websearch_to_tsquery('english', $1)::text")
            .bind(text)
            .fetch_one(self.pool())
            .await?;
        let pairs = super::news_query::phrase_pairs(&tsquery);
        if pairs.is_empty() {
            return Ok(None);
        }
        let keys: Vec<String> = pairs.into_iter().map(|(x, y)| format!("{x} {y}")).collect();
        Ok(Some(serde_json::Value::from(keys).to_string()))
    }

    /// The keys (SQLite: rowid as text; Postgres: id) of the newest `need` matches of `q`
    /// among the items with `lower <= effective_at < upper` (None: unbounded), newest first
    /// by `(effective_at, id)`.
    #[allow(clippy::too_many_arguments)]
    async fn news_window(
        &self,
        q: &NewsQuery<'_>,
        text: &str,
        every: bool,
        lower: Option<&str>,
        upper: Option<&str>,
        need: usize,
        scan: NewsScan<'_>,
    ) -> StoreResult<Vec<String>> {
        let sql = match self.backend() {
            // Bounds are bound as text with neutral values ('' and '~' sort before and after
            // every RFC 3339 time), so SQLite can use them as an index range.
            Backend::Sqlite => {
                let (source_join, visibility) = if every {
                    ("", "AND $2 IS NOT NULL AND $5 IS NULL")
                } else {
                    (
                        "JOIN news_sources s ON s.id = i.source_id",
                        "AND (s.owner_id = $2 OR s.owner_id IS NULL)
                         AND ($5 IS NULL OR s.id = $5 OR s.name = $5 OR s.url = $5)",
                    )
                };
                let list = "i.n IN (SELECT rowid FROM news_items_fts WHERE news_items_fts MATCH $1)";
                let (indexed, matching) = match scan {
                    NewsScan::Probe => (
                        "INDEXED BY news_items_time_id",
                        "EXISTS (SELECT 1 FROM news_items_fts f WHERE f.rowid = i.n AND news_items_fts MATCH $1)",
                    ),
                    NewsScan::Walk => ("INDEXED BY news_items_time_id", list),
                    NewsScan::Matches | NewsScan::Planner { .. } => ("", list),
                };
                format!(
                    "SELECT CAST(i.n AS TEXT) FROM news_items i {indexed} {source_join}
                     WHERE i.effective_at >= $3 AND i.effective_at <= $4 AND i.effective_at < $7
                       {visibility}
                       AND {matching}
                     ORDER BY i.effective_at DESC, i.id DESC LIMIT $6"
                )
            }
            // The first window may walk the time index (the planner's choice); the others are
            // sorted by a key no index provides (the same order: RFC 3339 text under "C"), so
            // the planner fetches from the GIN index (or the window's time range, whichever is
            // smaller) instead of walking every item of the window testing its vector.
            Backend::Postgres => {
                let visibility = if every {
                    "AND $2::text IS NOT NULL AND $5::text IS NULL"
                } else {
                    "AND i.source_id = ANY(ARRAY(SELECT s.id FROM news_sources s WHERE (s.owner_id = $2 OR s.owner_id IS NULL)
                         AND ($5::text IS NULL OR s.id = $5 OR s.name = $5 OR s.url = $5)))"
                };
                let key = if upper.is_none() { "i.effective_at" } else { "i.effective_at COLLATE \"C\"" };
                // A phrase's adjacent pairs (bound as $9) are looked up in the pair index
                // (migration 0020) and the vector test decides. It is written as the
                // function behind `@@` so that the planner does not also read the lexeme
                // index: for two common words that costs more than the few candidates.
                // The time bounds are compared under "C" then (the same order for RFC 3339
                // text) for the same reason: the window's time range in the time index is
                // larger than the phrase's candidates.
                let (matching, pairs, at) = match scan {
                    NewsScan::Planner { pairs: Some(_) } => (
                        "ts_match_vq(i.search, websearch_to_tsquery('english', $1))",
                        "AND i.phrase_pairs @> news_pair_hashes($9::text)",
                        "i.effective_at COLLATE \"C\"",
                    ),
                    _ => ("i.search @@ websearch_to_tsquery('english', $1)", "", "i.effective_at"),
                };
                // The cheap conditions first: Postgres tests filters of equal cost in the
                // order written, so an item outside the window never has its vector read.
                format!(
                    "SELECT i.id FROM news_items i
                     WHERE ($3::text IS NULL OR {at} >= $3)
                       AND ($4::text IS NULL OR {at} <= $4)
                       AND ($7::text IS NULL OR {at} < $7)
                       AND ($8::text IS NULL OR {at} >= $8)
                       {visibility}
                       {pairs}
                       AND {matching}
                     ORDER BY {key} DESC, i.id COLLATE \"C\" DESC LIMIT $6"
                )
            }
        };
        let query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(text).bind(q.user_id);
        let query = match self.backend() {
            Backend::Sqlite => {
                let lo = match (lower, q.since) {
                    (Some(l), Some(s)) => l.max(s),
                    (l, s) => l.or(s).unwrap_or(""),
                };
                query.bind(lo).bind(q.until.unwrap_or("~")).bind(q.source).bind(need as i64).bind(upper.unwrap_or("~"))
            }
            Backend::Postgres => {
                let query = query.bind(q.since).bind(q.until).bind(q.source).bind(need as i64).bind(upper).bind(lower);
                match scan {
                    NewsScan::Planner { pairs: Some(pairs) } => query.bind(pairs),
                    _ => query,
                }
            }
        };
        // Not a cached prepared statement: Postgres then plans each window with its actual
        // words and bounds (a generic plan cannot tell a word in every item from a rare one).
        Ok(query.persistent(false).fetch_all(self.pool()).await?)
    }
}

/// Inserts a news source row in `tx`.
async fn insert_news_source(tx: &mut super::WriteTx, row: &NewsSourceRow) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO news_sources (id, owner_id, name, url, paused, interval_secs, next_fetch_at, failures,
             item_count, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, $8, $9)",
    )
    .bind(&row.id)
    .bind(&row.owner_id)
    .bind(&row.name)
    .bind(&row.url)
    .bind(i64::from(row.paused))
    .bind(row.interval_secs)
    .bind(&row.next_fetch_at)
    .bind(&row.created_at)
    .bind(&row.updated_at)
    .execute(tx.conn())
    .await?;
    Ok(())
}
