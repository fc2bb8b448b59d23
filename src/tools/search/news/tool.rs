//! `news_search`: full-text search over what the News Hub collected — never the live web.
//! Results carry `published_at`, `collected_at` and their source so the Planner can judge
//! freshness; each hit becomes one `news_item` evidence item.
//!
//! Times in `since`/`until` may be RFC 3339, a date (`2025-06-10`: the start of that day
//! for `since`, its end for `until`) or relative (`24h`, `7d`, `2w`); freezing turns them
//! into absolute times, so the frozen call says exactly which window was searched.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::query;
use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::store::{NewsQuery, NewsSort};
use crate::tools::input;
use crate::tools::search::SearchHub;

/// Hits returned when `limit` is not given.
pub const DEFAULT_LIMIT: u64 = 10;
/// Most hits one call returns.
pub const MAX_LIMIT: u64 = 50;

/// `sort` of a news search (the store's [`NewsSort`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    /// Best match first.
    #[default]
    Relevance,
    /// Newest first.
    Time,
}

impl From<SortBy> for NewsSort {
    fn from(s: SortBy) -> Self {
        match s {
            SortBy::Relevance => NewsSort::Relevance,
            SortBy::Time => NewsSort::Time,
        }
    }
}

/// The input of `news_search`; its canonical input has the same fields, with the query and
/// source trimmed, `since`/`until` absolute and `sort`/`limit` filled in.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewsSearchInput {
    /// Words, "quoted phrases", or, -excluded
    #[schemars(length(min = 1, max = 400))]
    query: String,
    /// Only items published (or collected) at or after: RFC 3339, YYYY-MM-DD, or relative like 24h, 7d, 2w
    #[schemars(length(min = 2, max = 40))]
    since: Option<String>,
    /// Only items published (or collected) at or before: RFC 3339, YYYY-MM-DD, or relative
    #[schemars(length(min = 2, max = 40))]
    until: Option<String>,
    /// Only this source: its id, name or feed URL
    #[schemars(length(min = 1, max = 2048))]
    source: Option<String>,
    /// relevance (default) or time (newest first)
    sort: Option<SortBy>,
    /// Most hits (default 10)
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
}

impl NewsSearchInput {
    fn limit(&self) -> u64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
    }
}

/// The `news_search` tool.
pub struct NewsSearch {
    spec: ToolSpec,
    hub: Arc<SearchHub>,
}

impl NewsSearch {
    /// The tool over `hub`.
    pub fn new(hub: Arc<SearchHub>) -> Self {
        Self {
            spec: ToolSpec {
                id: "news_search".into(),
                kind: ToolKind::Public,
                domain: "search".into(),
                title: "Search collected news".into(),
                description:
                    "Full-text search over the news items the local News Hub collected from its RSS/Atom/JSON \
                    feeds (words, \"phrases\", or, -exclusions). Filters: since, until, source; sort by relevance or \
                    time. Each hit has its source, published_at and collected_at. It never searches the live web: use \
                    web_search for that."
                        .into(),
                input_schema: input::schema_of::<NewsSearchInput>(),
                requires_approval: false,
                capability: None,
                replacement: None,
                owner: None,
            },
            hub,
        }
    }
}

/// A `since`/`until` value as a stored time; `end_of_day` picks the last millisecond of a
/// bare date. None when it is none of the accepted forms.
pub fn parse_time(raw: &str, end_of_day: bool, now: DateTime<Utc>) -> Option<String> {
    let raw = raw.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Some(crate::ids::format_time(t.with_timezone(&Utc)));
    }
    if let Ok(d) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        let t = if end_of_day { d.and_hms_milli_opt(23, 59, 59, 999)? } else { d.and_hms_opt(0, 0, 0)? };
        return Some(crate::ids::format_time(t.and_utc()));
    }
    let (split, _) = raw.char_indices().last()?;
    let (n, unit) = raw.split_at(split);
    let n: i64 = n.parse().ok().filter(|n| *n >= 0 && *n <= 100_000)?;
    let delta = match unit {
        "h" => chrono::Duration::hours(n),
        "d" => chrono::Duration::days(n),
        "w" => chrono::Duration::weeks(n),
        _ => return None,
    };
    Some(crate::ids::format_time(now - delta))
}

#[async_trait]
impl Tool for NewsSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.hub.news_availability(&ctx.user_id)
    }

    async fn prepare(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let input: NewsSearchInput = input::parse(&input)?;
        let text = input.query.trim().to_owned();
        if !query::has_positive_term(&text) {
            return Err(ToolError::new(
                ErrorCode::EmptyQuery,
                "the query needs at least one word or phrase that is not excluded",
            ));
        }
        let now = Utc::now();
        let mut canonical = json!({
            "query": text,
            "sort": input.sort.unwrap_or_default(),
            "limit": input.limit(),
        });
        for (field, end_of_day, given) in [("since", false, &input.since), ("until", true, &input.until)] {
            if let Some(raw) = given.as_deref() {
                let t = parse_time(raw, end_of_day, now).ok_or_else(|| {
                    ToolError::new(
                        ErrorCode::InvalidTime,
                        format!("{field} {raw:?} is not RFC 3339, YYYY-MM-DD, or a relative time like 24h, 7d, 2w"),
                    )
                })?;
                canonical[field] = json!(t);
            }
        }
        if let (Some(s), Some(u)) = (canonical["since"].as_str(), canonical["until"].as_str())
            && s > u
        {
            return Err(ToolError::new(ErrorCode::InvalidRange, format!("since {s} is after until {u}")));
        }
        if let Some(source) = input.source.as_deref() {
            canonical["source"] = json!(source.trim());
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: NewsSearchInput = input::frozen(input)?;
        let text = input.query.as_str();
        if !query::has_positive_term(text) {
            return Err(ToolError::new(ErrorCode::EmptyQuery, "the query has no searchable term"));
        }
        let sort = NewsSort::from(input.sort.unwrap_or_default());
        let limit = input.limit();
        let q = NewsQuery {
            user_id: &ctx.owner_id,
            text,
            since: input.since.as_deref(),
            until: input.until.as_deref(),
            source: input.source.as_deref(),
            sort,
            limit: i64::try_from(limit).unwrap_or(10),
        };
        let searched_at = crate::ids::now();
        let hits = self.hub.store().search_news(&q).await.map_err(|e| {
            tracing::warn!(error = %e, "news search failed");
            ToolError::new(ErrorCode::StoreUnavailable, "the News Hub store could not be searched")
        })?;
        let mut results = Vec::with_capacity(hits.len());
        let mut evidence = Vec::with_capacity(hits.len());
        for (i, h) in hits.iter().enumerate() {
            let source = json!({"id": h.source_id, "name": h.source_name, "url": h.source_url});
            results.push(json!({
                "rank": i + 1,
                "item_id": h.id,
                "title": h.title,
                "url": h.url,
                "summary": crate::evidence::excerpt(&h.summary, 1024),
                "snippet": h.snippet,
                "source": source,
                "published_at": h.published_at,
                "collected_at": h.collected_at,
                "updated_at": h.changed_at,
                "score": h.score,
            }));
            let provenance = json!({
                "source": "news_hub",
                "news_source": source,
                "item_id": h.id,
                "item_url": h.url,
                "guid": h.guid,
                "published_at": h.published_at,
                "collected_at": h.collected_at,
                "updated_at": h.changed_at,
                "item_sha256": h.content_sha256,
                "query": text,
                "rank": i + 1,
            });
            evidence.push(EvidenceDraft::of_text(
                "news_item",
                provenance,
                &format!("{}\n{}\n{}", h.title, h.url.as_deref().unwrap_or(""), h.snippet),
            ));
        }
        Ok(ToolOutput {
            output: json!({
                "source": "news_hub",
                "query": text,
                "sort": if sort == NewsSort::Time { "time" } else { "relevance" },
                "since": input.since,
                "until": input.until,
                "searched_at": searched_at,
                "result_count": results.len(),
                "results": results,
            }),
            evidence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        let now = DateTime::parse_from_rfc3339("2025-06-10T12:00:00Z").unwrap().with_timezone(&Utc);
        assert_eq!(parse_time("2025-06-01", false, now).as_deref(), Some("2025-06-01T00:00:00.000Z"));
        assert_eq!(parse_time("2025-06-01", true, now).as_deref(), Some("2025-06-01T23:59:59.999Z"));
        assert_eq!(parse_time("24h", false, now).as_deref(), Some("2025-06-09T12:00:00.000Z"));
        assert_eq!(parse_time("2w", false, now).as_deref(), Some("2025-05-27T12:00:00.000Z"));
        assert_eq!(parse_time("2025-06-01T10:00:00+02:00", false, now).as_deref(), Some("2025-06-01T08:00:00.000Z"));
        assert_eq!(parse_time("yesterday", false, now), None);
        assert_eq!(parse_time("5x", false, now), None);
        assert_eq!(parse_time("-5d", false, now), None);
        assert_eq!(parse_time("5é", false, now), None);
    }
}
