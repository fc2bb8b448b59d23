//! Outbound HTTP. reqwest and rmcp are built with rustls but without a bundled crypto
//! provider (avoiding aws-lc's C/cmake build), so the process must install one before any
//! TLS client is built: [`install_tls_provider`] installs ring's, once.

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

/// Why a URL may not be fetched on behalf of a non-admin user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateAddress(pub String);

/// Whether `ip` is reachable only inside the host or its networks: loopback, unspecified,
/// RFC 1918 private, link-local, carrier-grade NAT (100.64/10), broadcast, multicast,
/// documentation, IPv6 unique-local (fc00::/7) and link-local (fe80::/10), or an
/// IPv4-mapped address of any of those (RFC 6890 special-purpose registries).
pub fn is_internal(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// Checks that `url`'s host is a public address, directly or through every address DNS gives
/// for it now. Used when a non-admin user names a URL the server will fetch (an MCP endpoint,
/// a news feed, a search instance), unless the deployment allows internal addresses. A later
/// DNS change is not re-checked at fetch time.
pub async fn check_public_url(url: &str) -> Result<(), PrivateAddress> {
    let parsed = reqwest::Url::parse(url).map_err(|e| PrivateAddress(format!("{url} is not a URL: {e}")))?;
    let host = parsed.host_str().ok_or_else(|| PrivateAddress(format!("{url} has no host")))?;
    let port = parsed.port_or_known_default().unwrap_or(80);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<std::net::IpAddr> = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| PrivateAddress(format!("{host} does not resolve: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    match addrs.iter().find(|ip| is_internal(**ip)) {
        Some(ip) => Err(PrivateAddress(format!(
            "{host} is an internal address ({ip}); only an admin may point the server at it"
        ))),
        None if addrs.is_empty() => Err(PrivateAddress(format!("{host} does not resolve"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert!(is_internal(ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"))), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
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
