//! Outbound HTTP. reqwest and rmcp are built with rustls but without a bundled crypto
//! provider (avoiding aws-lc's C/cmake build), so the process must install one before any
//! TLS client is built: [`install_tls_provider`] installs ring's, once.

use std::net::{IpAddr, SocketAddr};
use std::sync::Once;

/// Installs ring as the process-wide rustls crypto provider. Idempotent; call before
/// building any `reqwest::Client` (building one without a provider panics inside reqwest).
pub fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already installed, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A `reqwest::ClientBuilder`, with the TLS provider installed first.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder()
}

/// How long a replica waits to connect to another ([`cluster_client`]).
pub const CLUSTER_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a request between replicas may take, its answer included, unless the request
/// sets its own bound ([`cluster_client`]): a replica that accepts a forwarded request and
/// then answers nothing cannot hold the request (and the runner's or user's request behind
/// it) forever.
pub const CLUSTER_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The client replicas reach each other with (requests carrying `x-mira-cluster-secret`):
/// - it never follows a redirect: a 3xx answer is returned as it is, which every caller
///   treats as a refusal, so the cluster secret never travels to a host the request was not
///   addressed to;
/// - it ignores `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` (replicas reach each other directly;
///   a proxy would see the secret);
/// - it connects within [`CLUSTER_CONNECT_TIMEOUT`] and every request ends within
///   [`CLUSTER_REQUEST_TIMEOUT`] unless it sets its own time limit (a forwarded execution
///   sets the execution time limit).
///
/// The internal URLs (`--internal-url`) should be `https://` or addresses of a private
/// network: the secret is sent with every request.
pub fn cluster_client() -> reqwest::Result<reqwest::Client> {
    client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CLUSTER_CONNECT_TIMEOUT)
        .timeout(CLUSTER_REQUEST_TIMEOUT)
        .build()
}

/// Why a URL may not be fetched on behalf of a non-admin user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateAddress(pub String);

impl std::fmt::Display for PrivateAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A [`PublicResolver`] refusal is an `io::Error` (kind `PermissionDenied`) wrapping this type,
/// so a caller can tell it from other connection failures ([`refused_address`]).
impl std::error::Error for PrivateAddress {}

/// The [`PrivateAddress`] refusal somewhere in `err`'s chain of causes: raised by
/// [`PublicResolver`] or a redirect policy directly, or inside an `io::Error` (whose
/// `source()` skips the error it wraps, so it is looked into here).
pub fn refused_address<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a PrivateAddress> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(p) = e.downcast_ref::<PrivateAddress>() {
            return Some(p);
        }
        let io = e.downcast_ref::<std::io::Error>().or_else(|| e.downcast_ref::<Box<std::io::Error>>().map(|b| &**b));
        if let Some(p) = io.and_then(|io| io.get_ref()).and_then(|inner| inner.downcast_ref::<PrivateAddress>()) {
            return Some(p);
        }
        cur = e.source();
    }
    None
}

/// Whether `ip` is reachable only inside the host or its networks, or is no public unicast
/// address: loopback, unspecified, RFC 1918 private, link-local, carrier-grade NAT
/// (100.64/10), IETF protocol assignments (192.0.0/24), benchmarking (198.18/15), the 6to4
/// relay (192.88.99/24), reserved (240/4) and broadcast, multicast, documentation; IPv6
/// unique-local (fc00::/7), link-local (fe80::/10), site-local (fec0::/10), documentation
/// (2001:db8::/32), discard (100::/64); and an IPv4 address carried inside IPv6 — mapped
/// (::ffff:0:0/96), compatible (::/96), NAT64 (64:ff9b::/96), 6to4 (2002::/16) — when that
/// IPv4 address is any of the above (RFC 6890 special-purpose registries).
pub fn is_internal(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || a >= 240
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 192 && b == 88 && c == 99)
                || (a == 198 && (b == 18 || b == 19))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let seg = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                Ipv4Addr::new(a, b, c, d)
            };
            // IPv4-compatible (::a.b.c.d, also :: and ::1) and NAT64 (64:ff9b::a.b.c.d).
            if seg[..6] == [0; 6] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return seg[..6] == [0; 6] || is_internal(IpAddr::V4(embedded(seg[6], seg[7])));
            }
            // 6to4 (2002:a.b.c.d::/48).
            if seg[0] == 0x2002 {
                return is_internal(IpAddr::V4(embedded(seg[1], seg[2])));
            }
            let first = seg[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || (first == 0x2001 && seg[1] == 0x0db8)
                || (first == 0x0100 && seg[1..4] == [0, 0, 0])
                // Local-use NAT64 (64:ff9b:1::/48, RFC 8215): translates to the site's own addresses.
                || (first == 0x0064 && seg[1] == 0xff9b && seg[2] == 0x0001)
        }
    }
}

/// Which addresses the server may reach for a user's URL or host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRule {
    /// Any address (admins, shared connections, deployments with `--allow-internal-urls`).
    Any,
    /// Public addresses only ([`is_internal`] is refused): a non-admin user's URLs.
    PublicOnly,
}

/// Resolves `host` (a DNS name, or an IP literal with or without brackets) at `port` once,
/// and under [`AddressRule::PublicOnly`] refuses it when any address is internal. Connect to
/// the returned addresses, never to the name again: a DNS answer that changes between the
/// check and the connection (DNS rebinding) then cannot reach an internal address.
/// Errors: the name does not resolve, resolves to nothing, or to an internal address.
pub async fn resolve_host(host: &str, port: u16, rule: AddressRule) -> Result<Vec<SocketAddr>, PrivateAddress> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| PrivateAddress(format!("{host} does not resolve: {e}")))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(PrivateAddress(format!("{host} does not resolve")));
    }
    if rule == AddressRule::PublicOnly
        && let Some(a) = addrs.iter().find(|a| is_internal(a.ip()))
    {
        return Err(PrivateAddress(format!(
            "{host} is an internal address ({}); only an admin may point the server at it",
            a.ip()
        )));
    }
    Ok(addrs)
}

/// Checks that `url`'s host is a public address, directly or through every address DNS gives
/// for it now. Used when a non-admin user names a URL the server will fetch (an MCP endpoint,
/// a news feed, a search instance), unless the deployment allows internal addresses. A later
/// DNS change is not re-checked here: clients that fetch later use [`PublicResolver`].
pub async fn check_public_url(url: &str) -> Result<(), PrivateAddress> {
    let parsed = reqwest::Url::parse(url).map_err(|e| PrivateAddress(format!("{url} is not a URL: {e}")))?;
    let host = parsed.host_str().ok_or_else(|| PrivateAddress(format!("{url} has no host")))?;
    let port = parsed.port_or_known_default().unwrap_or(80);
    resolve_host(host, port, AddressRule::PublicOnly).await.map(|_| ())
}

/// A reqwest DNS resolver that refuses a name resolving to any internal address, so a client
/// built with it (`ClientBuilder::dns_resolver(Arc::new(PublicResolver))`) checks the
/// addresses it connects to on every connection (no DNS rebinding). IP-literal URLs do not go
/// through a resolver: check those with [`check_public_url`] before the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicResolver;

impl reqwest::dns::Resolve for PublicResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = resolve_host(&host, 0, AddressRule::PublicOnly)
                .await
                .map_err(|e| Box::new(std::io::Error::new(std::io::ErrorKind::PermissionDenied, e)))?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Who may make the server reach internal addresses: admins (their URLs and the shared
/// resources they make) and everyone when the deployment allows it (`--allow-internal-urls`).
/// The admin set is refreshed by its holder's reload.
#[derive(Debug, Default)]
pub struct AddressPolicy {
    allow_internal: bool,
    admins: parking_lot::RwLock<std::collections::HashSet<String>>,
}

impl AddressPolicy {
    /// A policy with no admins known yet (until [`AddressPolicy::set_admins`]).
    pub fn new(allow_internal: bool) -> AddressPolicy {
        AddressPolicy { allow_internal, admins: Default::default() }
    }

    /// Replaces the set of admin user ids.
    pub fn set_admins(&self, admins: std::collections::HashSet<String>) {
        *self.admins.write() = admins;
    }

    /// The rule for a URL owned by `owner` (None = shared, which only admins make).
    pub fn rule_for(&self, owner: Option<&str>) -> AddressRule {
        match owner {
            _ if self.allow_internal => AddressRule::Any,
            None => AddressRule::Any,
            Some(o) if self.admins.read().contains(o) => AddressRule::Any,
            Some(_) => AddressRule::PublicOnly,
        }
    }
}

/// `builder` with [`PublicResolver`] when `rule` is [`AddressRule::PublicOnly`], and then no
/// proxy from the environment (`HTTP(S)_PROXY`, `ALL_PROXY`): through a proxy the proxy
/// resolves the host name, so the resolver would never see it and a name that resolves to an
/// internal address (or is re-pointed there after it was checked) would be reached.
pub fn with_rule(builder: reqwest::ClientBuilder, rule: AddressRule) -> reqwest::ClientBuilder {
    match rule {
        AddressRule::Any => builder,
        AddressRule::PublicOnly => builder.no_proxy().dns_resolver(std::sync::Arc::new(PublicResolver)),
    }
}

/// The redirect loop error (a URL seen twice in one chain).
#[derive(Debug)]
pub struct RedirectLoop(pub String);

impl std::fmt::Display for RedirectLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redirect loop at {}", self.0)
    }
}

impl std::error::Error for RedirectLoop {}

/// The redirect policy of clients that may fetch a user's URLs: at most `max_redirects`, a
/// URL already visited in the chain is a [`RedirectLoop`], and under
/// [`AddressRule::PublicOnly`] a redirect to an internal IP literal is a [`PrivateAddress`]
/// (a name is checked when it is resolved, by [`with_rule`]'s resolver; a literal is never
/// resolved, so without this a public server could send the client to `127.0.0.1` or the
/// cloud metadata address).
pub fn redirect_policy(max_redirects: usize, rule: AddressRule) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let internal = match attempt.url().host() {
            Some(url::Host::Ipv4(ip)) => is_internal(ip.into()),
            Some(url::Host::Ipv6(ip)) => is_internal(ip.into()),
            _ => false,
        };
        if rule == AddressRule::PublicOnly && internal {
            let url = attempt.url().to_string();
            attempt.error(PrivateAddress(format!(
                "redirect to an internal address ({url}); only an admin's URLs may reach it"
            )))
        } else if attempt.previous().iter().any(|u| u == attempt.url()) {
            let url = attempt.url().to_string();
            attempt.error(RedirectLoop(url))
        } else if attempt.previous().len() > max_redirects {
            attempt.error(format!("more than {max_redirects} redirects"))
        } else {
            attempt.follow()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client under `PublicOnly` refuses a redirect to an internal IP literal; under `Any`
    /// it follows it. (The first URL is a loopback literal too, which no client checks:
    /// users' URLs are checked before any request.)
    #[tokio::test]
    async fn a_redirect_to_an_internal_literal_is_refused_for_users() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let end = format!("http://127.0.0.1:{port}/end");
        let app = axum::Router::new()
            .route("/away", axum::routing::post(move || async move { axum::response::Redirect::temporary(&end) }))
            .route("/end", axum::routing::post(|| async { "reached" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = |rule| with_rule(client_builder(), rule).redirect(redirect_policy(5, rule)).build().unwrap();
        let err =
            client(AddressRule::PublicOnly).post(format!("http://127.0.0.1:{port}/away")).send().await.unwrap_err();
        let mut source: Option<&dyn std::error::Error> = Some(&err);
        let mut refused = false;
        while let Some(e) = source {
            refused |= e.downcast_ref::<PrivateAddress>().is_some();
            source = e.source();
        }
        assert!(refused, "{err:?}");
        let followed = client(AddressRule::Any).post(format!("http://127.0.0.1:{port}/away")).send().await.unwrap();
        assert_eq!(followed.text().await.unwrap(), "reached");
    }

    /// A proxy (here set on the builder; from the environment alike) would resolve the host
    /// name itself: a `PublicOnly` client uses none, so its resolver refuses `localhost`,
    /// and the proxy is never contacted; an `Any` client goes through it.
    #[tokio::test]
    async fn public_only_clients_use_no_proxy() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
        let contacted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = contacted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = proxy.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ =
                    conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nproxied").await;
            }
        });
        let client =
            |rule| with_rule(client_builder().proxy(reqwest::Proxy::all(&proxy_url).unwrap()), rule).build().unwrap();
        let err = client(AddressRule::PublicOnly).get("http://localhost:9/secret").send().await.unwrap_err();
        // (The resolver's refusal comes wrapped in an `io::Error`, whose `source` skips it.)
        assert!(format!("{err:?}").contains("localhost is an internal address"), "{err:?}");
        assert_eq!(contacted.load(std::sync::atomic::Ordering::SeqCst), 0, "the proxy was used");
        let through = client(AddressRule::Any).get("http://localhost:9/secret").send().await.unwrap();
        assert_eq!(through.text().await.unwrap(), "proxied");
    }

    #[test]
    fn internal_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "198.18.0.1",
            "198.19.255.1",
            "192.0.0.8",
            "240.0.0.1",
            "::127.0.0.1",
            "::8.8.8.8",
            "64:ff9b::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
            "2002:c0a8:101::1",
            "fec0::1",
            "2001:db8::1",
            "100::1",
        ] {
            assert!(is_internal(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"))), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111", "198.20.0.1", "64:ff9b::808:808", "2002:808:808::1"] {
            assert!(!is_internal(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"))), "{ip}");
        }
    }

    #[tokio::test]
    async fn literal_and_named_hosts() {
        assert!(check_public_url("http://127.0.0.1:8080/mcp").await.is_err());
        assert!(check_public_url("http://[::1]/").await.is_err());
        assert!(check_public_url("http://localhost/feed").await.is_err());
        assert!(check_public_url("https://1.1.1.1/").await.is_ok());
    }
}
