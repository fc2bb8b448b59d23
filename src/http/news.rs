//! `/v1/news/sources`: the News Hub's feeds. A user adds RSS 2.0, Atom or JSON Feed URLs for
//! themself; an admin may add deployment-wide ones (`shared: true`) that every user's
//! `news_search` reads. Each source shows its collection state: last success, last error,
//! item count, and what the last fetch did.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Page;
use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::NewsSourceRow;
use crate::tools::search::news::collector::json_or_null;

/// Most sources one user may own.
pub const MAX_SOURCES_PER_USER: i64 = 500;
/// Longest interval a source may ask for, in seconds (a week).
pub const MAX_INTERVAL_SECS: u64 = 7 * 24 * 3600;

/// Body of `POST /v1/news/sources`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSource {
    /// Feed URL (http or https, at most 2048 bytes).
    #[schema(max_length = 2048)]
    pub url: String,
    /// Display name, 1–128 characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// Seconds between fetches (default the server's `--news-interval-secs`; at least
    /// `--news-min-interval-secs`, at most a week).
    #[schema(maximum = 604800)]
    pub interval_secs: Option<u64>,
    /// Admins only: a deployment-wide source every user reads.
    #[serde(default)]
    pub shared: bool,
}

/// The most recent failure of a source.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SourceError {
    /// `feed_timeout`, `source_unreachable`, `redirect_loop`, `internal_address`, `too_many_redirects`,
    /// `http_error`, `feed_too_large`, `feed_malformed`, `fetch_failed`.
    pub code: String,
    /// Human sentence.
    pub message: String,
    /// The HTTP status, when the source answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u64>,
    /// When (RFC 3339).
    pub at: Option<String>,
}

/// Where a news source stands, as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SourceStatus {
    /// The collector skips it.
    Paused,
    /// Never fetched successfully, no failure yet.
    Pending,
    /// The last fetch succeeded.
    Ok,
    /// The last fetch failed.
    Failing,
}

/// A source as the API shows it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SourceView {
    /// `nsrc_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// Feed URL.
    pub url: String,
    /// True for deployment-wide sources.
    pub shared: bool,
    /// True when the collector skips it.
    pub paused: bool,
    /// `paused`, `pending` (never fetched successfully, no failure yet), `ok`, or `failing`
    /// (the last fetch failed).
    pub status: SourceStatus,
    /// Seconds between fetches.
    pub interval_secs: i64,
    /// Items stored for it.
    pub item_count: i64,
    /// When the last fetch started.
    pub last_fetch_at: Option<String>,
    /// When a fetch last succeeded (200 or 304).
    pub last_success_at: Option<String>,
    /// The most recent failure (kept after later successes; compare `at` with
    /// `last_success_at`).
    pub last_error: Option<SourceError>,
    /// Consecutive failed fetches (the backoff exponent).
    pub failures: i64,
    /// When the next fetch is due.
    pub next_fetch_at: String,
    /// The feed's own title.
    pub feed_title: Option<String>,
    /// `rss`, `atom` or `json_feed`.
    pub feed_format: Option<String>,
    /// What the last completed fetch did: `status`, `entries`, `inserted`, `updated`,
    /// `unchanged`, `truncated`, `bytes`, `duration_ms` (or `error`).
    #[schema(value_type = Object)]
    pub last_fetch: Value,
    /// RFC 3339.
    pub created_at: String,
}

impl From<NewsSourceRow> for SourceView {
    fn from(s: NewsSourceRow) -> Self {
        let status = if s.paused {
            SourceStatus::Paused
        } else if s.failures > 0 {
            SourceStatus::Failing
        } else if s.last_success_at.is_none() {
            SourceStatus::Pending
        } else {
            SourceStatus::Ok
        };
        let last_error = s.last_error.as_deref().map(|text| {
            let v = json_or_null(Some(text));
            SourceError {
                code: v["code"].as_str().unwrap_or("unknown").to_owned(),
                message: v["message"].as_str().unwrap_or_default().to_owned(),
                status: v["status"].as_u64(),
                at: s.last_error_at.clone(),
            }
        });
        SourceView {
            status,
            last_fetch: json_or_null(s.last_fetch.as_deref()),
            shared: s.owner_id.is_none(),
            paused: s.paused,
            id: s.id,
            name: s.name,
            url: s.url,
            interval_secs: s.interval_secs,
            item_count: s.item_count,
            last_fetch_at: s.last_fetch_at,
            last_success_at: s.last_success_at,
            last_error,
            failures: s.failures,
            next_fetch_at: s.next_fetch_at,
            feed_title: s.feed_title,
            feed_format: s.feed_format,
            created_at: s.created_at,
        }
    }
}

/// `{"sources": [...], "next_cursor": ...}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SourceList {
    /// The caller's sources and the shared ones, by id.
    pub sources: Vec<SourceView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// Adds a source; the collector fetches it at once.
#[utoipa::path(post, path = "/v1/news/sources", tag = "news", request_body = CreateSource,
    responses((status = 201, body = SourceView), (status = 400), (status = 403), (status = 409)),
    security(("bearer" = [])))]
pub async fn create_source(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateSource>,
) -> Result<(StatusCode, Json<SourceView>)> {
    let url = body.url.trim().to_owned();
    if !crate::tools::search::text::is_http_url(&url) {
        return Err(Error::bad_request(
            ErrorCode::InvalidUrl,
            "url must be an absolute http or https URL of at most 2048 bytes",
        ));
    }
    let name = body.name.trim().to_owned();
    if name.is_empty() || name.len() > 128 {
        return Err(Error::bad_request(ErrorCode::InvalidName, "name must be 1-128 characters"));
    }
    let cfg = app.search.config();
    let interval = body.interval_secs.unwrap_or(cfg.news_interval_secs);
    if interval < cfg.news_min_interval_secs || interval > MAX_INTERVAL_SECS {
        return Err(Error::bad_request(
            ErrorCode::InvalidInterval,
            format!("interval_secs must be {}-{MAX_INTERVAL_SECS}", cfg.news_min_interval_secs),
        ));
    }
    if body.shared {
        user.require_admin()?;
    }
    app.check_fetch_url(user.is_admin, &url).await?;
    let row = NewsSourceRow::new(
        (!body.shared).then(|| user.user_id.clone()),
        name,
        url.clone(),
        i64::try_from(interval).unwrap_or(900),
    );
    // An own source is counted and inserted in one transaction under the user's lock:
    // concurrent requests never pass the limit together.
    match app.store.create_news_source_within(&row, MAX_SOURCES_PER_USER).await {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::conflict(
                ErrorCode::SourceLimit,
                format!("a user may have at most {MAX_SOURCES_PER_USER} news sources"),
                Value::Null,
            ));
        }
        Err(e) if e.is_unique_violation() => {
            return Err(Error::conflict(
                ErrorCode::SourceExists,
                format!("{url} is already a source{}", if body.shared { " of the deployment" } else { " of yours" }),
                Value::Null,
            ));
        }
        Err(e) => return Err(e.into()),
    }
    app.search.reload().await;
    app.search.collector().wake();
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// The caller's sources and the shared ones.
#[utoipa::path(get, path = "/v1/news/sources", tag = "news", params(Page),
    responses((status = 200, body = SourceList), (status = 400)), security(("bearer" = [])))]
pub async fn list_sources(
    State(app): State<App>,
    user: AuthUser,
    Query(page): Query<Page>,
) -> Result<Json<SourceList>> {
    let limit = page.limit()?;
    let rows = app.store.list_news_sources(&user.user_id, page.cursor.as_deref(), limit + 1).await?;
    let (rows, next_cursor) = Page::split(rows, limit, |r| r.id.clone());
    Ok(Json(SourceList { sources: rows.into_iter().map(Into::into).collect(), next_cursor }))
}

async fn visible(app: &App, user: &AuthUser, id: &str) -> Result<NewsSourceRow> {
    if !crate::ids::is_well_formed(id, "nsrc") {
        return Err(Error::NotFound("news source"));
    }
    app.store.news_source_visible(&user.user_id, id).await?.ok_or(Error::NotFound("news source"))
}

/// A source the caller may change: their own, or a shared one for admins.
async fn changeable(app: &App, user: &AuthUser, id: &str) -> Result<NewsSourceRow> {
    let row = visible(app, user, id).await?;
    if row.owner_id.is_none() {
        user.require_admin()?;
    }
    Ok(row)
}

async fn reread(app: &App, user: &AuthUser, id: &str) -> Result<Json<SourceView>> {
    Ok(Json(visible(app, user, id).await?.into()))
}

/// One source with its collection state.
#[utoipa::path(get, path = "/v1/news/sources/{source_id}", tag = "news", params(("source_id" = String, Path)),
    responses((status = 200, body = SourceView), (status = 404)), security(("bearer" = [])))]
pub async fn get_source(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<SourceView>> {
    reread(&app, &user, &id).await
}

/// Pauses a source: the collector skips it; its items stay searchable.
#[utoipa::path(post, path = "/v1/news/sources/{source_id}/pause", tag = "news", params(("source_id" = String, Path)),
    responses((status = 200, body = SourceView), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn pause_source(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<SourceView>> {
    changeable(&app, &user, &id).await?;
    app.store.set_news_source_paused(&id, true).await?;
    reread(&app, &user, &id).await
}

/// Resumes a paused source; it is fetched at once.
#[utoipa::path(post, path = "/v1/news/sources/{source_id}/resume", tag = "news", params(("source_id" = String, Path)),
    responses((status = 200, body = SourceView), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn resume_source(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<SourceView>> {
    changeable(&app, &user, &id).await?;
    app.store.set_news_source_paused(&id, false).await?;
    app.search.collector().wake();
    reread(&app, &user, &id).await
}

/// Makes a source due now (ignoring its schedule and backoff); 409 `source_paused` when
/// paused.
#[utoipa::path(post, path = "/v1/news/sources/{source_id}/fetch", tag = "news", params(("source_id" = String, Path)),
    responses((status = 200, body = SourceView), (status = 403), (status = 404), (status = 409)),
    security(("bearer" = [])))]
pub async fn fetch_source(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<Json<SourceView>> {
    let row = changeable(&app, &user, &id).await?;
    if row.paused {
        return Err(Error::conflict(ErrorCode::SourcePaused, "the source is paused; resume it first", Value::Null));
    }
    app.store.news_source_due_now(&id).await?;
    app.search.collector().wake();
    reread(&app, &user, &id).await
}

/// Deletes a source and every item collected from it.
#[utoipa::path(delete, path = "/v1/news/sources/{source_id}", tag = "news", params(("source_id" = String, Path)),
    responses((status = 204), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn delete_source(State(app): State<App>, user: AuthUser, Path(id): Path<String>) -> Result<StatusCode> {
    changeable(&app, &user, &id).await?;
    if !app.store.delete_news_source(&id).await? {
        return Err(Error::NotFound("news source"));
    }
    app.search.reload().await;
    Ok(StatusCode::NO_CONTENT)
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_source, list_sources))
        .routes(routes!(get_source, delete_source))
        .routes(routes!(pause_source))
        .routes(routes!(resume_source))
        .routes(routes!(fetch_source))
}
