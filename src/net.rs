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
