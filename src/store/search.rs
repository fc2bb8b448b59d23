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

/// Postgres ranks (`ts_rank_cd`) only the newest this many matches of a query: ranking every
/// match of a common word across 100k items took over a second (`mira bench news`).
pub const POSTGRES_RANK_POOL: usize = 2000;

const SOURCE_COLUMNS: &str = "id, owner_id, name, url, paused, interval_secs, next_fetch_at, etag, last_modified, \
    failures, last_fetch_at, last_success_at, last_error, last_error_at, last_fetch, item_count, feed_title, \
    feed_format, created_at, updated_at";

impl Store {
    // ---- connections -------------------------------------------------------------------

    /// Stores a new connection.
    pub async fn create_search_connection(&self, row: &SearchConnectionRow) -> StoreResult<()> {
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
        .execute(self.pool())
        .await?;
        Ok(())
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

    /// Number of connections the user has.
    pub async fn count_search_connections(&self, owner_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM search_connections WHERE owner_id = $1")
            .bind(owner_id)
            .fetch_one(self.pool())
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
        .execute(self.pool())
        .await?;
        Ok(())
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

    /// Number of sources the user owns.
    pub async fn count_own_news_sources(&self, user_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM news_sources WHERE owner_id = $1")
            .bind(user_id)
            .fetch_one(self.pool())
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
        let mut last_fetch = last_fetch.clone();
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

    /// Full-text search over the items of the sources `q.user_id` can see (see
    /// [`NewsQuery`]). SQLite: FTS5 `MATCH` ranked by BM25 (title ×10, summary ×4, content
    /// ×1) with `snippet()`; Postgres: `@@ websearch_to_tsquery('english', …)` ranked by
    /// `ts_rank_cd` over the A/B/C-weighted vector among the newest
    /// [`POSTGRES_RANK_POOL`] matches, with `ts_headline` for the passage. A query without a
    /// positive term ([`super::news_query::has_positive_term`]) finds nothing.
    pub async fn search_news(&self, q: &NewsQuery<'_>) -> StoreResult<Vec<NewsHit>> {
        let text = match self.backend() {
            Backend::Sqlite => match super::news_query::to_fts5(q.text) {
                Some(fts5) => fts5,
                None => return Ok(Vec::new()),
            },
            Backend::Postgres if super::news_query::has_positive_term(q.text) => q.text.to_owned(),
            Backend::Postgres => return Ok(Vec::new()),
        };
        let order = match q.sort {
            NewsSort::Relevance => "score DESC, effective_at DESC, id",
            NewsSort::Time => "effective_at DESC, score DESC, id",
        };
        let order_top = order.replace(", ", ", top.");
        // Postgres: when the caller sees every source and names none, the source condition
        // is left out, so the planner can walk the newest matches of a common word instead
        // of probing the full-text index once per source.
        let postgres = self.backend() == Backend::Postgres;
        let visibility = if postgres && q.source.is_none() && self.sees_every_news_source(q.user_id).await? {
            "AND $2::text IS NOT NULL AND $5::text IS NULL"
        } else {
            "AND i.source_id = ANY(ARRAY(SELECT s.id FROM news_sources s WHERE (s.owner_id = $2 OR s.owner_id IS NULL)
                 AND ($5::text IS NULL OR s.id = $5 OR s.name = $5 OR s.url = $5)))"
        };
        let sql = match self.backend() {
            // The best `limit` rows are chosen first (BM25 only); `snippet()` then runs for
            // those rows alone, each looked up by rowid under the same MATCH (CROSS JOIN
            // keeps `top` the outer loop).
            Backend::Sqlite => format!(
                "WITH top AS (
                     SELECT i.n, i.effective_at AS effective_at, i.id AS id, -bm25(news_items_fts, 10.0, 4.0, 1.0) AS score
                     FROM news_items_fts
                     JOIN news_items i ON i.n = news_items_fts.rowid
                     JOIN news_sources s ON s.id = i.source_id
                     WHERE news_items_fts MATCH $1
                       AND (s.owner_id = $2 OR s.owner_id IS NULL)
                       AND ($3 IS NULL OR i.effective_at >= $3)
                       AND ($4 IS NULL OR i.effective_at <= $4)
                       AND ($5 IS NULL OR s.id = $5 OR s.name = $5 OR s.url = $5)
                     ORDER BY {order} LIMIT $6
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
            // Ranking every match of a very common word costs a `ts_rank_cd` (and a detoasted
            // vector) per row; so the candidates are the newest POSTGRES_RANK_POOL matches
            // (found through the time index or the GIN index, as the planner sees fit), and
            // only those are ranked.
            Backend::Postgres => format!(
                "WITH pool AS MATERIALIZED (
                     SELECT i.id AS item_id, q.query
                     FROM news_items i
                     CROSS JOIN (SELECT websearch_to_tsquery('english', $1) AS query) q
                     WHERE i.search @@ q.query
                       {visibility}
                       AND ($3::text IS NULL OR i.effective_at >= $3)
                       AND ($4::text IS NULL OR i.effective_at <= $4)
                     ORDER BY i.effective_at DESC
                     LIMIT {POSTGRES_RANK_POOL}
                 ), hits AS (
                     SELECT i.id, i.source_id, s.name AS source_name, s.url AS source_url, i.guid, i.url,
                            i.title, i.summary, i.content, i.published_at, i.collected_at, i.changed_at,
                            i.effective_at, i.content_sha256, pool.query,
                            ts_rank_cd(i.search, pool.query)::float8 AS score
                     FROM pool
                     JOIN news_items i ON i.id = pool.item_id
                     JOIN news_sources s ON s.id = i.source_id
                     ORDER BY {order} LIMIT $6
                 )
                 SELECT id, source_id, source_name, source_url, guid, url, title, summary, published_at,
                        collected_at, changed_at, content_sha256,
                        ts_headline('english', title || ' — ' || summary || ' ' || content, query,
                                    'StartSel=\"\", StopSel=\"\", MaxWords=40, MinWords=15, MaxFragments=1')
                            AS snippet,
                        score
                 FROM hits ORDER BY {order}"
            ),
        };
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(text)
            .bind(q.user_id)
            .bind(q.since)
            .bind(q.until)
            .bind(q.source)
            .bind(q.limit)
            // Not a cached prepared statement: Postgres then plans each search with its actual
            // words (a generic plan cannot tell a word in every item from a rare one and picks
            // the wrong index, 10–30× slower for common words).
            .persistent(false)
            .fetch_all(self.pool())
            .await?)
    }
}
