//! Web search providers: one request builder and one response parser per provider, and one
//! call loop ([`search`]) with timeouts, retries with exponential backoff on 429, 5xx,
//! timeouts and connection failures, `Retry-After` honoured, and every failure turned into
//! a [`ProviderError`] that carries the provider's HTTP status — never an empty list.

pub mod brave;
pub mod searxng;
pub mod tavily;

use std::time::Duration;

use rand::RngExt;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::config::{SearchConfig, Secret};
use super::net;
use crate::error::ErrorCode;

/// Largest provider response read, in bytes.
pub const MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;
/// Most results a call may ask for (Brave's and Tavily's own maximum).
pub const MAX_COUNT: usize = 20;
/// Longest title kept, in bytes.
pub const MAX_TITLE_BYTES: usize = 512;
/// Longest snippet kept, in bytes.
pub const MAX_SNIPPET_BYTES: usize = 1024;
/// First retry delay; each further retry doubles it (±25 % jitter) unless the provider
/// said `Retry-After`.
pub const BASE_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Which search API a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// A SearXNG instance's JSON API (`GET /search?format=json`); no key, or a key sent as a
    /// bearer token to an instance behind an authenticating proxy.
    Searxng,
    /// The Brave Search API (`GET /res/v1/web/search`, `X-Subscription-Token`).
    Brave,
    /// The Tavily API (`POST /search`, `Authorization: Bearer`).
    Tavily,
}

impl ProviderKind {
    /// Every provider, in the order deployment-wide connections are tried.
    pub const ALL: [ProviderKind; 3] = [ProviderKind::Searxng, ProviderKind::Brave, ProviderKind::Tavily];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Searxng => "searxng",
            Self::Brave => "brave",
            Self::Tavily => "tavily",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether calls need an API key.
    pub fn needs_key(self) -> bool {
        !matches!(self, Self::Searxng)
    }

    /// The public API's base URL (None for SearXNG, which is always self-hosted).
    pub fn default_base_url(self, config: &SearchConfig) -> Option<String> {
        match self {
            Self::Searxng => None,
            Self::Brave => Some(config.brave_url.clone()),
            Self::Tavily => Some(config.tavily_url.clone()),
        }
    }
}

/// `freshness` of a query: results from the last day, week, month or year.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Freshness {
    /// Past 24 hours.
    Day,
    /// Past 7 days.
    Week,
    /// Past 31 days.
    Month,
    /// Past 365 days.
    Year,
}

impl Freshness {
    /// Parses `day|week|month|year`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            "year" => Some(Self::Year),
            _ => None,
        }
    }

    /// The wire name (also SearXNG's and Tavily's `time_range` value).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }
}

/// A canonical `web_search` query.
#[derive(Debug, Clone)]
pub struct WebQuery {
    /// The query text.
    pub query: String,
    /// Results wanted, 1..=[`MAX_COUNT`].
    pub count: usize,
    /// Recency filter.
    pub freshness: Option<Freshness>,
    /// Restrict to this host name.
    pub site: Option<String>,
    /// Result language (ISO 639-1, optionally with a region: `en`, `pt-BR`).
    pub language: Option<String>,
}

/// One result as the provider gave it (text already cleaned and capped).
#[derive(Debug, Clone, PartialEq)]
pub struct RawResult {
    /// Result URL.
    pub url: String,
    /// Title.
    pub title: String,
    /// Snippet (plain text).
    pub snippet: String,
    /// Publication time, RFC 3339, when the provider gave a parseable one.
    pub published_at: Option<String>,
}

/// A provider's successful answer.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// Results in the provider's order.
    pub results: Vec<RawResult>,
    /// Facts the Planner should know (a filter the provider cannot apply, engines that
    /// failed…).
    pub notes: Vec<String>,
}

/// Where and how to call one provider.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint<'a> {
    /// The provider.
    pub kind: ProviderKind,
    /// Base URL without a trailing slash.
    pub base_url: &'a str,
    /// API key, when the connection has one.
    pub key: Option<&'a Secret>,
}

/// Retry limits of one call.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// Longest single wait; a longer `Retry-After` ends the call.
    pub max_wait: Duration,
}

/// A failed provider call.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderError {
    /// Stable code: `provider_error` (an HTTP error answer), `provider_rate_limited` (429),
    /// `provider_timeout`, `provider_unreachable` (connection failed), `provider_bad_response`
    /// (a 2xx body that is not the provider's format), `provider_engines_failed` (SearXNG:
    /// no results because every engine failed), `cancelled`.
    pub code: ErrorCode,
    /// Human sentence, with the provider's own error message when it sent one.
    pub message: String,
    /// The provider's HTTP status, when it answered.
    pub status: Option<u16>,
    /// What the provider asked us to wait, in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// Attempts made.
    pub attempts: u32,
}

impl ProviderError {
    /// True when the failure says the provider cannot be reached (for its health).
    pub fn is_unreachable(&self) -> bool {
        matches!(self.code, ErrorCode::ProviderUnreachable | ErrorCode::ProviderTimeout)
            || (self.code == ErrorCode::ProviderError && self.status.is_some_and(|s| s >= 500))
    }
}

fn request(client: &reqwest::Client, ep: &Endpoint<'_>, q: &WebQuery) -> reqwest::RequestBuilder {
    match ep.kind {
        ProviderKind::Searxng => searxng::request(client, ep, q),
        ProviderKind::Brave => brave::request(client, ep, q),
        ProviderKind::Tavily => tavily::request(client, ep, q),
    }
}

/// Why a provider's 2xx body is not its format.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not the provider's JSON (serde's description).
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// Brave: an answer whose `type` is not `search` (the type found).
    #[error("expected type \"search\", got {0:?}")]
    NotSearch(String),
}

/// Why a provider's health check failed.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The provider could not be reached (its name, what failed).
    #[error("{provider} could not be reached: {detail}")]
    Unreachable {
        /// Provider name.
        provider: &'static str,
        /// What failed ([`net::describe`]).
        detail: String,
    },
    /// The check's request was answered with a status that fails it.
    #[error("{provider} health check answered HTTP {status}: {detail}")]
    Status {
        /// Provider name.
        provider: &'static str,
        /// The HTTP status.
        status: u16,
        /// The provider's error message, if it sent one.
        detail: String,
    },
}

fn parse(kind: ProviderKind, body: &[u8], q: &WebQuery) -> Result<Answer, ProviderError> {
    let bad = |e: ParseError| ProviderError {
        code: ErrorCode::ProviderBadResponse,
        message: format!("{} answered 2xx with a body that is not its JSON format: {e}", kind.as_str()),
        status: None,
        retry_after_ms: None,
        attempts: 0,
    };
    match kind {
        ProviderKind::Searxng => searxng::parse(body, q),
        ProviderKind::Brave => brave::parse(body, q).map_err(bad),
        ProviderKind::Tavily => tavily::parse(body, q).map_err(bad),
    }
}

/// The provider's own error message from an error body, in its documented shape; else the
/// body's text, cut.
pub fn error_message(kind: ProviderKind, body: &[u8]) -> Option<String> {
    let parsed = match kind {
        ProviderKind::Searxng => None,
        ProviderKind::Brave => brave::error_message(body),
        ProviderKind::Tavily => tavily::error_message(body),
    };
    parsed.or_else(|| {
        let text = super::text::html_to_text(&String::from_utf8_lossy(body));
        (!text.is_empty()).then(|| super::text::cut(&text, 300))
    })
}

/// Extra rate-limit hints a provider sends instead of `Retry-After` (Brave's
/// `X-RateLimit-Reset`: seconds until each window resets, shortest window first).
fn provider_retry_hint(kind: ProviderKind, headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    match kind {
        ProviderKind::Brave => brave::reset_hint(headers),
        _ => None,
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = BASE_RETRY_DELAY.saturating_mul(2u32.saturating_pow(attempt.min(16)));
    base.mul_f64(rand::rng().random_range(0.75..1.25))
}

/// Calls the provider with the retry policy (see the module docs). `cancel` aborts waits
/// and requests.
pub async fn search(
    client: &reqwest::Client,
    ep: &Endpoint<'_>,
    q: &WebQuery,
    policy: RetryPolicy,
    cancel: &CancellationToken,
) -> Result<(Answer, u32), ProviderError> {
    let name = ep.kind.as_str();
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let last = attempt > policy.retries;
        let sent = tokio::select! {
            r = request(client, ep, q).send() => r,
            () = cancel.cancelled() => return Err(cancelled(attempt)),
        };
        let (error, wait_hint) = match sent {
            Ok(resp) if resp.status().is_success() => {
                let status = resp.status().as_u16();
                let body = tokio::select! {
                    b = net::read_capped(resp, MAX_RESPONSE_BYTES) => b,
                    () = cancel.cancelled() => return Err(cancelled(attempt)),
                };
                match body {
                    Ok(body) => {
                        return parse(ep.kind, &body, q).map(|a| (a, attempt)).map_err(|mut e| {
                            e.status = Some(status);
                            e.attempts = attempt;
                            e
                        });
                    }
                    Err(net::BodyError::TooLarge(max)) => {
                        return Err(ProviderError {
                            code: ErrorCode::ProviderBadResponse,
                            message: format!("{name} answered with more than {max} bytes"),
                            status: Some(status),
                            retry_after_ms: None,
                            attempts: attempt,
                        });
                    }
                    Err(net::BodyError::Transfer(e)) => (transport_error(name, &e, attempt), None),
                }
            }
            Ok(resp) => {
                let status = resp.status();
                let hint = net::retry_after(resp.headers()).or_else(|| provider_retry_hint(ep.kind, resp.headers()));
                let body = net::read_capped(resp, 64 * 1024).await.unwrap_or_default();
                let detail = error_message(ep.kind, &body).unwrap_or_else(|| "no error message".to_owned());
                let retryable = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
                let err = ProviderError {
                    code: if status == StatusCode::TOO_MANY_REQUESTS {
                        ErrorCode::ProviderRateLimited
                    } else {
                        ErrorCode::ProviderError
                    },
                    message: format!("{name} answered HTTP {}: {detail}", status.as_u16()),
                    status: Some(status.as_u16()),
                    retry_after_ms: hint.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    attempts: attempt,
                };
                if !retryable {
                    return Err(err);
                }
                (err, hint)
            }
            Err(e) => (transport_error(name, &e, attempt), None),
        };
        if last {
            return Err(error);
        }
        let wait = wait_hint.unwrap_or_else(|| backoff(attempt - 1));
        if wait > policy.max_wait {
            let mut error = error;
            error.message = format!(
                "{}; it asked to wait {} s, longer than the {} s this server waits",
                error.message,
                wait.as_secs(),
                policy.max_wait.as_secs()
            );
            return Err(error);
        }
        tracing::debug!(provider = name, attempt, wait_ms = wait.as_millis() as u64, code = %error.code, "retrying");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = cancel.cancelled() => return Err(cancelled(attempt)),
        }
    }
}

fn cancelled(attempts: u32) -> ProviderError {
    ProviderError {
        code: ErrorCode::Cancelled,
        message: "the call was cancelled".into(),
        status: None,
        retry_after_ms: None,
        attempts,
    }
}

fn transport_error(name: &str, e: &reqwest::Error, attempts: u32) -> ProviderError {
    let (code, what) = if e.is_timeout() {
        (ErrorCode::ProviderTimeout, "did not answer in time")
    } else {
        (ErrorCode::ProviderUnreachable, "could not be reached")
    };
    ProviderError {
        code,
        message: format!("{name} {what}: {}", net::describe(e)),
        status: None,
        retry_after_ms: None,
        attempts,
    }
}

/// Health check of one endpoint (no query is spent): SearXNG's `GET /healthz` must answer
/// 2xx; Tavily's `GET /usage` must accept the key (2xx); for Brave, which has no such
/// endpoint, the API host must answer HTTP at all with a status below 500.
pub async fn check(client: &reqwest::Client, ep: &Endpoint<'_>) -> Result<(), HealthError> {
    let name = ep.kind.as_str();
    let req = match ep.kind {
        ProviderKind::Searxng => client.get(format!("{}/healthz", ep.base_url)),
        ProviderKind::Brave => client.get(format!("{}/", ep.base_url)),
        ProviderKind::Tavily => {
            let req = client.get(format!("{}/usage", ep.base_url));
            match ep.key {
                Some(key) => req.bearer_auth(key.expose()),
                None => req,
            }
        }
    };
    let resp = req.send().await.map_err(|e| HealthError::Unreachable { provider: name, detail: net::describe(&e) })?;
    let status = resp.status();
    let ok = match ep.kind {
        ProviderKind::Brave => !status.is_server_error(),
        ProviderKind::Searxng | ProviderKind::Tavily => status.is_success(),
    };
    if ok {
        Ok(())
    } else {
        let body = net::read_capped(resp, 64 * 1024).await.unwrap_or_default();
        let detail = error_message(ep.kind, &body).unwrap_or_default();
        Err(HealthError::Status { provider: name, status: status.as_u16(), detail })
    }
}

/// A provider time (RFC 3339, RFC 2822, or a zone-less ISO date-time taken as UTC, or a
/// bare date) in the stored format; None when it is none of these.
pub fn normalize_time(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return None;
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(raw) {
        return Some(crate::ids::format_time(t.with_timezone(&chrono::Utc)));
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc2822(raw) {
        return Some(crate::ids::format_time(t.with_timezone(&chrono::Utc)));
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(raw, fmt) {
            return Some(crate::ids::format_time(t.and_utc()));
        }
    }
    chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| crate::ids::format_time(t.and_utc()))
}

/// Cleans one result: HTML stripped from title and snippet, both capped, the URL kept only
/// if it is absolute http(s).
pub fn clean(url: &str, title: &str, snippet: &str, published: Option<&str>) -> Option<RawResult> {
    let url = url.trim();
    if !super::text::is_http_url(url) {
        return None;
    }
    Some(RawResult {
        url: url.to_owned(),
        title: super::text::cut(&super::text::html_to_text(title), MAX_TITLE_BYTES),
        snippet: super::text::cut(&super::text::html_to_text(snippet), MAX_SNIPPET_BYTES),
        published_at: published.and_then(normalize_time),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_provider_formats() {
        assert_eq!(normalize_time("2024-05-01T12:00:00").as_deref(), Some("2024-05-01T12:00:00.000Z"));
        assert_eq!(normalize_time("2024-05-01T12:00:00+02:00").as_deref(), Some("2024-05-01T10:00:00.000Z"));
        assert_eq!(normalize_time("Wed, 01 May 2024 14:00:00 GMT").as_deref(), Some("2024-05-01T14:00:00.000Z"));
        assert_eq!(normalize_time("2024-05-01").as_deref(), Some("2024-05-01T00:00:00.000Z"));
        assert_eq!(normalize_time("3 days ago"), None);
    }

    #[test]
    fn backoff_doubles_with_jitter() {
        for attempt in 0..4 {
            let d = backoff(attempt).as_secs_f64();
            let nominal = 0.5 * f64::from(2u32.pow(attempt));
            assert!(d >= nominal * 0.75 && d <= nominal * 1.25, "{attempt}: {d}");
        }
    }
}
