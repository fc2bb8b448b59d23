//! Settings of the search tools and the News Hub (`mira serve --help`), with the
//! [`Secret`] wrapper that keeps credentials out of `Debug` output and logs.

use std::str::FromStr;

/// A credential or key. `Debug` prints `Secret(***)`; only [`Secret::expose`] gives the text.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret string.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret text, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Default base URL of the Brave Search API.
pub const BRAVE_DEFAULT_URL: &str = "https://api.search.brave.com";
/// Default base URL of the Tavily API.
pub const TAVILY_DEFAULT_URL: &str = "https://api.tavily.com";

const DEFAULT_SEARCH_TIMEOUT_SECS: u64 = 10;
const DEFAULT_SEARCH_RETRIES: u32 = 2;
const DEFAULT_SEARCH_MAX_RETRY_WAIT_SECS: u64 = 30;
const DEFAULT_SEARCH_RATE_PER_MINUTE: u32 = 30;
const DEFAULT_SEARCH_HEALTH_SECS: u64 = 300;
const DEFAULT_STATE_REFRESH_SECS: u64 = 10;
const DEFAULT_NEWS_INTERVAL_SECS: u64 = 900;
const DEFAULT_NEWS_MIN_INTERVAL_SECS: u64 = 60;
const DEFAULT_NEWS_FETCH_TIMEOUT_SECS: u64 = 30;
const DEFAULT_NEWS_MAX_FEED_BYTES: u64 = 16 * 1024 * 1024;
const DEFAULT_NEWS_MAX_ITEMS_PER_FETCH: usize = 1000;
/// Default of `--news-max-items-per-source`.
const DEFAULT_NEWS_MAX_ITEMS_PER_SOURCE: usize = 10_000;
/// Default of `--news-max-items-per-user`.
const DEFAULT_NEWS_MAX_ITEMS_PER_USER: usize = 100_000;
const DEFAULT_NEWS_CONCURRENCY: usize = 4;

/// Web search providers for every user (deployment-wide connections) and the limits of
/// `web_search` and the News Hub collector. API keys are best given through the
/// environment (flags show up in process listings).
#[derive(Debug, Clone, clap::Args)]
pub struct SearchConfig {
    /// SearXNG instance for every user (its JSON output must be enabled: `search.formats: [html, json]`).
    #[arg(long, env = "MIRA_SEARXNG_URL")]
    pub searxng_url: Option<String>,
    /// Brave Search API subscription token for every user.
    #[arg(long, env = "MIRA_BRAVE_API_KEY", hide_env_values = true)]
    pub brave_api_key: Option<Secret>,
    /// Base URL of the Brave Search API.
    #[arg(long, env = "MIRA_BRAVE_URL", default_value = BRAVE_DEFAULT_URL)]
    pub brave_url: String,
    /// Tavily API key for every user.
    #[arg(long, env = "MIRA_TAVILY_API_KEY", hide_env_values = true)]
    pub tavily_api_key: Option<Secret>,
    /// Base URL of the Tavily API.
    #[arg(long, env = "MIRA_TAVILY_URL", default_value = TAVILY_DEFAULT_URL)]
    pub tavily_url: String,
    /// Seconds one provider request may take.
    #[arg(long, env = "MIRA_SEARCH_TIMEOUT_SECS", default_value_t = DEFAULT_SEARCH_TIMEOUT_SECS)]
    pub search_timeout_secs: u64,
    /// Retries of a provider request after a 429, a 5xx, a timeout or a connection failure.
    #[arg(long, env = "MIRA_SEARCH_RETRIES", default_value_t = DEFAULT_SEARCH_RETRIES)]
    pub search_retries: u32,
    /// Longest wait before a retry, in seconds; a longer Retry-After fails the call at once
    /// with `provider_rate_limited` and the wait in its details.
    #[arg(long, env = "MIRA_SEARCH_MAX_RETRY_WAIT_SECS", default_value_t = DEFAULT_SEARCH_MAX_RETRY_WAIT_SECS)]
    pub search_max_retry_wait_secs: u64,
    /// `web_search` calls each user may make per minute (token bucket, per server process).
    #[arg(long, env = "MIRA_SEARCH_RATE_PER_MINUTE", default_value_t = DEFAULT_SEARCH_RATE_PER_MINUTE)]
    pub search_rate_per_minute: u32,
    /// Seconds between health checks of a healthy provider connection.
    #[arg(long, env = "MIRA_SEARCH_HEALTH_SECS", default_value_t = DEFAULT_SEARCH_HEALTH_SECS)]
    pub search_health_secs: u64,
    /// Seconds between reloads of connections and sources written by other replicas.
    #[arg(long = "search-state-refresh-secs", env = "MIRA_SEARCH_STATE_REFRESH_SECS", default_value_t = DEFAULT_STATE_REFRESH_SECS)]
    pub state_refresh_secs: u64,
    /// Default seconds between two fetches of a news source.
    #[arg(long, env = "MIRA_NEWS_INTERVAL_SECS", default_value_t = DEFAULT_NEWS_INTERVAL_SECS)]
    pub news_interval_secs: u64,
    /// Shortest interval a source may ask for, in seconds.
    #[arg(long, env = "MIRA_NEWS_MIN_INTERVAL_SECS", default_value_t = DEFAULT_NEWS_MIN_INTERVAL_SECS)]
    pub news_min_interval_secs: u64,
    /// Seconds one feed fetch (connect, redirects and body) may take.
    #[arg(long, env = "MIRA_NEWS_FETCH_TIMEOUT_SECS", default_value_t = DEFAULT_NEWS_FETCH_TIMEOUT_SECS)]
    pub news_fetch_timeout_secs: u64,
    /// Largest feed document read, in bytes; a larger one fails with `feed_too_large`.
    #[arg(long, env = "MIRA_NEWS_MAX_FEED_BYTES", default_value_t = DEFAULT_NEWS_MAX_FEED_BYTES)]
    pub news_max_feed_bytes: u64,
    /// Most entries stored from one fetch (the first ones in document order).
    #[arg(long, env = "MIRA_NEWS_MAX_ITEMS_PER_FETCH", default_value_t = DEFAULT_NEWS_MAX_ITEMS_PER_FETCH)]
    pub news_max_items_per_fetch: usize,
    /// Most items a source keeps: after each fetch its older items beyond this many (by
    /// publication time, else collection time) are removed. A feed that brings new ids at
    /// every fetch cannot fill the disk all users share.
    #[arg(long, env = "MIRA_NEWS_MAX_ITEMS_PER_SOURCE", default_value_t = DEFAULT_NEWS_MAX_ITEMS_PER_SOURCE)]
    pub news_max_items_per_source: usize,
    /// Most items a user's own sources keep together: a source keeps at most what its
    /// owner's other sources leave of this (newest first), so one user's many sources cannot
    /// fill the disk either. Deployment-wide sources count against no one.
    #[arg(long, env = "MIRA_NEWS_MAX_ITEMS_PER_USER", default_value_t = DEFAULT_NEWS_MAX_ITEMS_PER_USER)]
    pub news_max_items_per_user: usize,
    /// Feeds fetched at once by this server.
    #[arg(long, env = "MIRA_NEWS_CONCURRENCY", default_value_t = DEFAULT_NEWS_CONCURRENCY)]
    pub news_concurrency: usize,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            searxng_url: None,
            brave_api_key: None,
            brave_url: BRAVE_DEFAULT_URL.to_owned(),
            tavily_api_key: None,
            tavily_url: TAVILY_DEFAULT_URL.to_owned(),
            search_timeout_secs: DEFAULT_SEARCH_TIMEOUT_SECS,
            search_retries: DEFAULT_SEARCH_RETRIES,
            search_max_retry_wait_secs: DEFAULT_SEARCH_MAX_RETRY_WAIT_SECS,
            search_rate_per_minute: DEFAULT_SEARCH_RATE_PER_MINUTE,
            search_health_secs: DEFAULT_SEARCH_HEALTH_SECS,
            state_refresh_secs: DEFAULT_STATE_REFRESH_SECS,
            news_interval_secs: DEFAULT_NEWS_INTERVAL_SECS,
            news_min_interval_secs: DEFAULT_NEWS_MIN_INTERVAL_SECS,
            news_fetch_timeout_secs: DEFAULT_NEWS_FETCH_TIMEOUT_SECS,
            news_max_feed_bytes: DEFAULT_NEWS_MAX_FEED_BYTES,
            news_max_items_per_fetch: DEFAULT_NEWS_MAX_ITEMS_PER_FETCH,
            news_max_items_per_source: DEFAULT_NEWS_MAX_ITEMS_PER_SOURCE,
            news_max_items_per_user: DEFAULT_NEWS_MAX_ITEMS_PER_USER,
            news_concurrency: DEFAULT_NEWS_CONCURRENCY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("tvly-very-secret");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        let cfg = SearchConfig { tavily_api_key: Some(s), ..SearchConfig::default() };
        assert!(!format!("{cfg:?}").contains("very-secret"));
    }
}
