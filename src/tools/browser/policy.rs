//! The origin policy of the managed browser: which URLs a user's browser context may load.
//!
//! Enforced in the browser's network layer (every request of every tab of the context is
//! paused by CDP `Fetch` and continued only when [`OriginPolicy::check`] allows it; redirects
//! are new paused requests) and, for the URL a `browser_navigate` names, before Chromium sees
//! it (Chromium's network layer never pauses `data:`, `blob:` or `file:` loads, so those are
//! refused here by scheme).
//!
//! The rules, strictest first:
//! - only `http` and `https` (and the empty page `about:blank`) load; `data:`, `blob:`,
//!   `file:`, `chrome:`, `javascript:` and every other scheme are refused (`scheme`);
//! - when the deployment lists origins (`--browser-allow-origins`), only those load (`origin`);
//! - a non-admin user's context never reaches an internal address: an IP literal or a host
//!   name any of whose DNS addresses is internal ([`crate::net::is_internal`]) is refused
//!   (`internal_address`).

use serde::Serialize;

use crate::net::AddressRule;

/// Why a URL was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalRule {
    /// A scheme other than `http`/`https` (or `about:blank`).
    Scheme,
    /// An origin the deployment's list does not hold.
    Origin,
    /// An internal address (or a name resolving to one) for a non-admin.
    InternalAddress,
    /// Not a URL at all.
    Malformed,
}

/// A refused URL and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    /// The URL, cut to 2,000 characters.
    pub url: String,
    /// The rule that refused it.
    pub rule: RefusalRule,
    /// A sentence.
    pub message: String,
}

/// Longest URL kept in a refusal record.
const MAX_URL_KEPT: usize = 2000;

/// The policy of one user's browser context.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// Origins allowed (`scheme://host[:port]`, lowercase, default ports dropped); empty = any.
    pub allow: Vec<String>,
    /// Which addresses the context may reach.
    pub rule: AddressRule,
}

/// The ASCII serialisation of `url`'s origin (`https://example.com`, `http://127.0.0.1:8080`).
pub fn origin_of(url: &url::Url) -> String {
    url.origin().ascii_serialization()
}

/// Normalises a configured origin (`https://Example.com:443/` → `https://example.com`);
/// None when it is not an http(s) origin.
pub fn normalise_origin(text: &str) -> Option<String> {
    let url = url::Url::parse(text.trim()).ok()?;
    matches!(url.scheme(), "http" | "https").then(|| origin_of(&url))
}

impl OriginPolicy {
    /// Checks `url` (see the module docs). Resolves a host name once under a public-only rule.
    pub async fn check(&self, url: &str) -> Result<(), Refusal> {
        let refuse = |rule: RefusalRule, message: String| Refusal {
            url: crate::evidence::excerpt(url, MAX_URL_KEPT),
            rule,
            message,
        };
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Err(refuse(RefusalRule::Malformed, format!("not a URL: {e}"))),
        };
        match parsed.scheme() {
            "http" | "https" => {}
            "about" if matches!(parsed.path(), "blank" | "srcdoc") => return Ok(()),
            other => {
                return Err(refuse(
                    RefusalRule::Scheme,
                    format!("{other}: URLs are never loaded by the managed browser (only http and https)"),
                ));
            }
        }
        let origin = origin_of(&parsed);
        if !self.allow.is_empty() && !self.allow.contains(&origin) {
            return Err(refuse(RefusalRule::Origin, format!("{origin} is not an origin this deployment allows")));
        }
        if self.rule == AddressRule::PublicOnly {
            let host = parsed.host_str().unwrap_or_default();
            let port = parsed.port_or_known_default().unwrap_or(80);
            if let Err(e) = crate::net::resolve_host(host, port, AddressRule::PublicOnly).await {
                return Err(refuse(RefusalRule::InternalAddress, e.0));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], rule: AddressRule) -> OriginPolicy {
        OriginPolicy { allow: allow.iter().filter_map(|o| normalise_origin(o)).collect(), rule }
    }

    #[tokio::test]
    async fn schemes_origins_and_addresses() {
        let any = policy(&[], AddressRule::Any);
        for url in ["http://127.0.0.1:9/x", "https://example.com/", "about:blank"] {
            assert!(any.check(url).await.is_ok(), "{url}");
        }
        for url in ["data:text/html,hi", "file:///etc/passwd", "blob:http://a/1", "chrome://settings", "javascript:1"] {
            assert_eq!(any.check(url).await.map_err(|r| r.rule).err(), Some(RefusalRule::Scheme), "{url}");
        }
        let listed = policy(&["HTTP://127.0.0.1:8080/"], AddressRule::Any);
        assert!(listed.check("http://127.0.0.1:8080/a?b").await.is_ok());
        assert_eq!(listed.check("http://127.0.0.1:8081/").await.map_err(|r| r.rule).err(), Some(RefusalRule::Origin));
        let public = policy(&[], AddressRule::PublicOnly);
        for url in ["http://127.0.0.1/", "http://localhost:8080/", "http://[::1]/", "http://169.254.169.254/"] {
            assert_eq!(public.check(url).await.map_err(|r| r.rule).err(), Some(RefusalRule::InternalAddress), "{url}");
        }
    }
}
