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
use serde_json::{Value, json};

use super::query;
use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::store::{NewsQuery, NewsSort};
use crate::tools::search::SearchHub;
use crate::tools::{str_field, uint_field};

/// Hits returned when `limit` is not given.
pub const DEFAULT_LIMIT: u64 = 10;
/// Most hits one call returns.
pub const MAX_LIMIT: u64 = 50;

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
                input_schema: json!({
                    "type": "object",
                    "required": ["query"],
                    "properties": {
                        "query": {"type": "string", "minLength": 1, "maxLength": 400, "description": "Words, \"quoted phrases\", or, -excluded"},
                        "since": {"type": "string", "minLength": 2, "maxLength": 40, "description": "Only items published (or collected) at or after: RFC 3339, YYYY-MM-DD, or relative like 24h, 7d, 2w"},
                        "until": {"type": "string", "minLength": 2, "maxLength": 40, "description": "Only items published (or collected) at or before: RFC 3339, YYYY-MM-DD, or relative"},
                        "source": {"type": "string", "minLength": 1, "maxLength": 2048, "description": "Only this source: its id, name or feed URL"},
                        "sort": {"type": "string", "enum": ["relevance", "time"], "description": "relevance (default) or time (newest first)"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": "Most hits (default 10)"}
                    },
                    "additionalProperties": false
                }),
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
        let text = str_field(&input, "query").unwrap_or_default().trim().to_owned();
        if !query::has_positive_term(&text) {
            return Err(ToolError::new(
                ErrorCode::EmptyQuery,
                "the query needs at least one word or phrase that is not excluded",
            ));
        }
        let now = Utc::now();
        let mut canonical = json!({
            "query": text,
            "sort": str_field(&input, "sort").unwrap_or("relevance"),
            "limit": uint_field(&input, "limit", DEFAULT_LIMIT, MAX_LIMIT),
        });
        for (field, end_of_day) in [("since", false), ("until", true)] {
            if let Some(raw) = str_field(&input, field) {
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
        if let Some(source) = str_field(&input, "source") {
            canonical["source"] = json!(source.trim());
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let text = str_field(input, "query").unwrap_or_default();
        if !query::has_positive_term(text) {
            return Err(ToolError::new(ErrorCode::EmptyQuery, "the query has no searchable term"));
        }
        let sort = if str_field(input, "sort") == Some("time") { NewsSort::Time } else { NewsSort::Relevance };
        let limit = uint_field(input, "limit", DEFAULT_LIMIT, MAX_LIMIT);
        let q = NewsQuery {
            user_id: &ctx.owner_id,
            text,
            since: str_field(input, "since"),
            until: str_field(input, "until"),
            source: str_field(input, "source"),
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
                "since": str_field(input, "since"),
                "until": str_field(input, "until"),
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
