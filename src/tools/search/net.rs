//! HTTP plumbing shared by the providers and the feed collector: reqwest clients over
//! rustls (built with [`crate::net::client_builder`], which installs the crypto provider),
//! bodies read with a byte cap, `Retry-After`, and a redirect policy that names loops.

use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::net::AddressRule;

/// `User-Agent` of every request this module's clients send.
pub const USER_AGENT: &str = concat!("mira/", env!("CARGO_PKG_VERSION"), " (+tool runtime)");

/// Most redirects a feed fetch follows (the same bound as browsers' and reqwest's default).
pub const MAX_REDIRECTS: usize = 10;

pub use crate::net::RedirectLoop;

/// The HTTP client could not be built (reqwest's error, shared so the failure can be
/// reported on every use).
#[derive(Debug, Clone, thiserror::Error)]
#[error("building the HTTP client failed: {0}")]
pub struct ClientError(#[source] pub std::sync::Arc<reqwest::Error>);

/// Builds a client: rustls, `timeout` for the whole exchange, at most `max_redirects`
/// redirects, a redirect back to a URL already visited is an error ([`RedirectLoop`]).
/// Under [`AddressRule::PublicOnly`] (a URL a non-admin named) every connection's addresses
/// are checked when they are resolved ([`crate::net::PublicResolver`], so DNS rebinding is
/// refused) and a redirect to an internal IP literal is an error.
pub fn client(timeout: Duration, max_redirects: usize, rule: AddressRule) -> Result<reqwest::Client, ClientError> {
    crate::net::with_rule(crate::net::client_builder(), rule)
        .user_agent(USER_AGENT)
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(crate::net::redirect_policy(max_redirects, rule))
        .build()
        .map_err(|e| ClientError(std::sync::Arc::new(e)))
}

/// A client per [`AddressRule`], built once with the same limits.
#[derive(Debug)]
pub struct RuleClients {
    any: Result<reqwest::Client, ClientError>,
    public: Result<reqwest::Client, ClientError>,
}

impl RuleClients {
    /// Both clients with `timeout` and `max_redirects` ([`client`]).
    pub fn new(timeout: Duration, max_redirects: usize) -> RuleClients {
        RuleClients {
            any: client(timeout, max_redirects, AddressRule::Any),
            public: client(timeout, max_redirects, AddressRule::PublicOnly),
        }
    }

    /// The client enforcing `rule`.
    pub fn get(&self, rule: AddressRule) -> Result<&reqwest::Client, ClientError> {
        match rule {
            AddressRule::Any => self.any.as_ref(),
            AddressRule::PublicOnly => self.public.as_ref(),
        }
        .map_err(Clone::clone)
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// The body is longer than the cap.
    TooLarge(u64),
    /// The transfer failed (timeout, reset…).
    Transfer(reqwest::Error),
}

/// Reads a response body, refusing more than `max` bytes (checked against Content-Length
/// first, then while streaming).
pub async fn read_capped(mut resp: reqwest::Response, max: u64) -> Result<Vec<u8>, BodyError> {
    if let Some(len) = resp.content_length()
        && len > max
    {
        return Err(BodyError::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transfer)? {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(BodyError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The wait a `Retry-After` header asks for (RFC 9110 §10.2.3: delay-seconds or an
/// HTTP-date), if present and parseable. A date in the past is zero.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// True when `err` or one of its sources is a [`RedirectLoop`].
pub fn is_redirect_loop(err: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(s) = source {
        if s.is::<RedirectLoop>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// `err` with its chain of causes, for messages (`a: b: c`).
pub fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        let later = (chrono::Utc::now() + chrono::Duration::seconds(120)).to_rfc2822();
        h.insert(reqwest::header::RETRY_AFTER, later.parse().unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120), "{wait:?}");
    }
}
