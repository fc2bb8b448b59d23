//! `web_search`: the public internet through the user's (or the deployment's) search
//! provider, at call time.
//!
//! Freezing resolves which connection answers (the first of the user's own enabled
//! connections, then the deployment-wide ones, that is not known to be unreachable) and
//! puts its id and provider into the canonical input, so the frozen call says who will be
//! asked. Execution takes a token from the user's rate limit, calls the provider with
//! retries ([`super::providers::search`]) and turns every provider failure into a tool error
//! carrying the provider's HTTP status. Each result becomes one `web_result` evidence item.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::SearchHub;
use super::providers::{self, Endpoint, Freshness, MAX_COUNT, ProviderKind, RetryPolicy, WebQuery};
use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::tools::input;

/// Results returned when `count` is not given.
pub const DEFAULT_COUNT: u64 = 10;
/// Longest query, in characters.
pub const MAX_QUERY_CHARS: u64 = 400;

/// Largest `count`.
const MAX_COUNT_INPUT: u64 = MAX_COUNT as u64;

/// The input of `web_search`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebSearchInput {
    /// What to search for
    #[schemars(length(min = 1, max = MAX_QUERY_CHARS))]
    query: String,
    /// Results wanted (default 10)
    #[schemars(range(min = 1, max = MAX_COUNT_INPUT))]
    count: Option<u64>,
    /// Only results from the last day, week, month or year
    freshness: Option<Freshness>,
    /// Only results from this host, e.g. docs.rs
    #[schemars(length(min = 1, max = 253))]
    site: Option<String>,
    /// Result language, ISO 639-1 with an optional region (en, pt-BR)
    #[schemars(pattern(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})?$"))]
    language: Option<String>,
}

/// The canonical input of `web_search` as frozen: [`WebSearchInput`] with the trimmed query,
/// the count filled in, the normalised site and the connection that answers.
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    query: String,
    count: Option<u64>,
    connection_id: String,
    freshness: Option<Freshness>,
    site: Option<String>,
    language: Option<String>,
}

/// The `web_search` tool.
pub struct WebSearch {
    spec: ToolSpec,
    hub: Arc<SearchHub>,
}

impl WebSearch {
    /// The tool over `hub`.
    pub fn new(hub: Arc<SearchHub>) -> Self {
        Self {
            spec: ToolSpec {
                id: "web_search".into(),
                kind: ToolKind::Public,
                domain: "search".into(),
                title: "Search the web".into(),
                description: "Search the public internet now through the configured search provider. Returns ranked \
                    results (url, title, snippet, provider, rank, retrieved_at, published_at when known). For news \
                    already collected by the local News Hub use news_search instead; this tool never reads it."
                    .into(),
                input_schema: input::schema_of::<WebSearchInput>(),
                requires_approval: false,
                capability: Some("net".into()),
                replacement: None,
                owner: None,
            },
            hub,
        }
    }
}

/// `docs.rs`, `https://Docs.rs/path` → `docs.rs`; None when no host name is left.
fn normalize_site(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let host = match url::Url::parse(raw) {
        Ok(u) if u.host_str().is_some() => u.host_str().unwrap_or_default().to_owned(),
        _ => raw.split(['/', '?', '#']).next().unwrap_or_default().to_owned(),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    valid.then_some(host)
}

fn query_of(input: &Frozen) -> WebQuery {
    WebQuery {
        query: input.query.clone(),
        count: usize::try_from(input.count.unwrap_or(DEFAULT_COUNT).min(MAX_COUNT_INPUT)).unwrap_or(10),
        freshness: input.freshness,
        site: input.site.clone(),
        language: input.language.clone(),
    }
}

#[async_trait]
impl Tool for WebSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.hub.web_availability(&ctx.user_id)
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let input: WebSearchInput = input::parse(&input)?;
        let query = input.query.trim().to_owned();
        if query.is_empty() {
            return Err(ToolError::new(ErrorCode::EmptyQuery, "query is empty"));
        }
        let conn = self.hub.pick(ctx.owner_id)?;
        let mut canonical = json!({
            "query": query,
            "count": input.count.unwrap_or(DEFAULT_COUNT).min(MAX_COUNT_INPUT),
            "provider": conn.provider.as_str(),
            "connection_id": conn.id,
        });
        if let Some(f) = input.freshness {
            canonical["freshness"] = json!(f.as_str());
        }
        if let Some(site) = input.site.as_deref() {
            let host = normalize_site(site)
                .ok_or_else(|| ToolError::new(ErrorCode::InvalidSite, format!("site {site:?} is not a host name")))?;
            canonical["site"] = json!(host);
        }
        if let Some(lang) = &input.language {
            canonical["language"] = json!(lang);
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let input: Frozen = input::frozen(input)?;
        let connection_id = input.connection_id.as_str();
        if let Err(wait) = self.hub.take_rate_token(&ctx.owner_id) {
            let per_minute = self.hub.config().search_rate_per_minute;
            return Err(ToolError::new(
                ErrorCode::RateLimited,
                format!("this user's web_search limit of {per_minute} calls per minute is used up"),
            )
            .with_details(json!({"retry_after_ms": wait.as_millis() as u64, "limit_per_minute": per_minute})));
        }
        let conn = self.hub.connection_for(&ctx.owner_id, connection_id).filter(|c| c.enabled).ok_or_else(|| {
            ToolError::new(
                ErrorCode::ConnectionGone,
                format!("search connection {connection_id} was removed or disabled after this call was frozen"),
            )
        })?;
        let key = self.hub.credential(&conn)?;
        if conn.provider.needs_key() && key.is_none() {
            return Err(ToolError::new(
                ErrorCode::CredentialUnavailable,
                format!("connection {} ({}) has no API key", conn.id, conn.provider.as_str()),
            ));
        }
        let client = self.hub.client(&conn)?;
        let q = query_of(&input);
        let ep = Endpoint { kind: conn.provider, base_url: &conn.base_url, key: key.as_ref() };
        let policy = RetryPolicy {
            retries: self.hub.config().search_retries,
            max_wait: Duration::from_secs(self.hub.config().search_max_retry_wait_secs),
        };
        let outcome = providers::search(client, &ep, &q, policy, &ctx.cancel).await;
        let (answer, attempts) = match outcome {
            Ok(ok) => {
                self.hub.record_call(&conn.id, Ok::<(), String>(()));
                ok
            }
            Err(e) => {
                if e.is_unreachable() {
                    self.hub.record_call(&conn.id, Err(e.message.clone()));
                }
                return Err(provider_error(conn.provider, &conn.id, e));
            }
        };
        let retrieved_at = crate::ids::now();
        let provider = conn.provider.as_str();
        let mut results = Vec::with_capacity(answer.results.len());
        let mut evidence = Vec::with_capacity(answer.results.len());
        for (i, r) in answer.results.iter().enumerate() {
            let rank = i + 1;
            let mut result = json!({
                "rank": rank,
                "url": r.url,
                "title": r.title,
                "snippet": r.snippet,
                "provider": provider,
                "retrieved_at": retrieved_at,
            });
            if let Some(p) = &r.published_at {
                result["published_at"] = json!(p);
            }
            let mut provenance = json!({
                "source": "web",
                "url": r.url,
                "title": r.title,
                "snippet": r.snippet,
                "provider": provider,
                "connection_id": conn.id,
                "query": q.query,
                "rank": rank,
                "retrieved_at": retrieved_at,
            });
            if let Some(p) = &r.published_at {
                provenance["published_at"] = json!(p);
            }
            evidence.push(EvidenceDraft::of_text(
                "web_result",
                provenance,
                &format!("{}\n{}\n{}", r.title, r.url, r.snippet),
            ));
            results.push(result);
        }
        Ok(ToolOutput {
            output: json!({
                "source": "web",
                "query": q.query,
                "provider": provider,
                "connection_id": conn.id,
                "retrieved_at": retrieved_at,
                "result_count": results.len(),
                "results": results,
                "notes": answer.notes,
                "attempts": attempts,
            }),
            evidence,
        })
    }
}

fn provider_error(kind: ProviderKind, connection_id: &str, e: providers::ProviderError) -> ToolError {
    ToolError::new(e.code, e.message).with_details(json!({
        "provider": kind.as_str(),
        "connection_id": connection_id,
        "status": e.status,
        "retry_after_ms": e.retry_after_ms,
        "attempts": e.attempts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_are_host_names() {
        assert_eq!(normalize_site("Docs.RS").as_deref(), Some("docs.rs"));
        assert_eq!(normalize_site("https://docs.rs/tokio?x=1").as_deref(), Some("docs.rs"));
        assert_eq!(normalize_site("example.com/path").as_deref(), Some("example.com"));
        assert_eq!(normalize_site("exa mple.com"), None);
        assert_eq!(normalize_site("a..b"), None);
        assert_eq!(normalize_site("site:x.com"), None);
    }
}
