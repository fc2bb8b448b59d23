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
//!   (`internal_address`);
//! - nobody's context, an admin's included, reaches a port of this server's own services: its
//!   database's and its API's (`service_port`).

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
    /// A port of this server's own services (its database, its API), whoever the user is.
    ServicePort,
    /// A pop-up a page opened beyond the tabs one user may have (`--browser-max-tabs`): closed
    /// at once.
    TabLimit,
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
    /// The ports of this server's own services (its database's, its API's): refused for
    /// every user (`service_port`).
    pub service_ports: Vec<u16>,
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
        let Some(parsed) = self.check_url(url)? else {
            return Ok(());
        };
        if self.rule == AddressRule::PublicOnly {
            let host = parsed.host_str().unwrap_or_default();
            self.addresses(url, host, parsed.port_or_known_default().unwrap_or(80)).await?;
        }
        Ok(())
    }

    /// The scheme and origin rules for `url`, without DNS: the parsed URL when it is http(s)
    /// and allowed, None for the empty page (`about:blank`, `about:srcdoc`).
    pub fn check_url(&self, url: &str) -> Result<Option<url::Url>, Refusal> {
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Err(refusal(url, RefusalRule::Malformed, format!("not a URL: {e}"))),
        };
        match parsed.scheme() {
            "http" | "https" => {}
            "about" if matches!(parsed.path(), "blank" | "srcdoc") => return Ok(None),
            other => {
                return Err(refusal(
                    url,
                    RefusalRule::Scheme,
                    format!("{other}: URLs are never loaded by the managed browser (only http and https)"),
                ));
            }
        }
        let origin = origin_of(&parsed);
        if !self.allow.is_empty() && !self.allow.contains(&origin) {
            return Err(refusal(url, RefusalRule::Origin, format!("{origin} is not an origin this deployment allows")));
        }
        self.check_port(url, parsed.port_or_known_default().unwrap_or(80))?;
        Ok(Some(parsed))
    }

    /// The service-port rule. `shown` names the request in a refusal.
    pub fn check_port(&self, shown: &str, port: u16) -> Result<(), Refusal> {
        if self.service_ports.contains(&port) {
            return Err(refusal(
                shown,
                RefusalRule::ServicePort,
                format!("port {port} is one of this server's own services"),
            ));
        }
        Ok(())
    }

    /// The origin and service-port rules for a tunnel to `host:port` (an HTTP `CONNECT`: TLS
    /// or a WebSocket, whose scheme the proxy cannot see): allowed when the list is empty or
    /// one of its origins has this host and port, whatever that origin's scheme (a listed
    /// `http://h:8443` also lets a worker open a TLS or WebSocket tunnel to `h:8443`).
    /// `shown` names the request in a refusal.
    pub fn check_authority(&self, shown: &str, host: &str, port: u16) -> Result<(), Refusal> {
        self.check_port(shown, port)?;
        let host = host.to_ascii_lowercase();
        let listed = |origin: &String| {
            url::Url::parse(origin).is_ok_and(|u| {
                u.host_str().is_some_and(|h| h.eq_ignore_ascii_case(&host)) && u.port_or_known_default() == Some(port)
            })
        };
        if self.allow.is_empty() || self.allow.iter().any(listed) {
            return Ok(());
        }
        Err(refusal(
            shown,
            RefusalRule::Origin,
            format!("{host}:{port} is not the host and port of an origin this deployment allows"),
        ))
    }

    /// The addresses of `host:port` under the context's address rule, resolved once: connect
    /// to these, never to the name again (DNS rebinding). `shown` names the request in a
    /// refusal. Errors: `internal_address` (which also covers a name that does not resolve).
    pub async fn addresses(&self, shown: &str, host: &str, port: u16) -> Result<Vec<std::net::SocketAddr>, Refusal> {
        crate::net::resolve_host(host, port, self.rule)
            .await
            .map_err(|e| refusal(shown, RefusalRule::InternalAddress, e.0))
    }
}

/// A refusal of `url` (URL and message each cut to [`MAX_URL_KEPT`] characters).
pub fn refusal(url: &str, rule: RefusalRule, message: String) -> Refusal {
    Refusal {
        url: crate::evidence::excerpt(url, MAX_URL_KEPT),
        rule,
        message: crate::evidence::excerpt(&message, MAX_URL_KEPT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], rule: AddressRule) -> OriginPolicy {
        OriginPolicy {
            allow: allow.iter().filter_map(|o| normalise_origin(o)).collect(),
            rule,
            service_ports: vec![5432],
        }
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
        for url in ["http://127.0.0.1:5432/", "https://example.com:5432/"] {
            assert_eq!(any.check(url).await.map_err(|r| r.rule).err(), Some(RefusalRule::ServicePort), "{url}");
        }
        let public = policy(&[], AddressRule::PublicOnly);
        for url in ["http://127.0.0.1/", "http://localhost:8080/", "http://[::1]/", "http://169.254.169.254/"] {
            assert_eq!(public.check(url).await.map_err(|r| r.rule).err(), Some(RefusalRule::InternalAddress), "{url}");
        }
    }

    #[test]
    fn tunnels_match_listed_hosts_and_ports() {
        let listed = policy(&["http://127.0.0.1:8080", "https://Example.com"], AddressRule::Any);
        assert!(listed.check_authority("x", "127.0.0.1", 8080).is_ok());
        assert!(listed.check_authority("x", "EXAMPLE.com", 443).is_ok());
        for (host, port) in [("127.0.0.1", 8081), ("example.com", 80), ("example.org", 443)] {
            assert_eq!(listed.check_authority("x", host, port).map_err(|r| r.rule).err(), Some(RefusalRule::Origin));
        }
        assert!(
            policy(&[], AddressRule::PublicOnly).check_authority("x", "10.0.0.1", 22).is_ok(),
            "no list: the address rule decides"
        );
        assert_eq!(
            policy(&[], AddressRule::Any).check_authority("x", "db.example", 5432).map_err(|r| r.rule).err(),
            Some(RefusalRule::ServicePort)
        );
    }
}
