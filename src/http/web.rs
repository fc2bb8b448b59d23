//! The control-plane page: the files of `web/` (HTML, CSS, ES modules and the vendored
//! xterm.js), embedded in the binary at compile time and served at `/` by `mira serve` itself.
//! No build step, no third-party request at run time. These routes are not part of the API
//! (nor of the OpenAPI document); the page talks to `/v1/...` with the token the person signs
//! in with, which it keeps in the browser's session storage.
//!
//! Every response carries a strict Content-Security-Policy (scripts and connections only to
//! this origin, no framing, no inline script), `X-Content-Type-Options: nosniff`,
//! `Referrer-Policy: no-referrer` and cross-origin isolation headers. `style-src` allows
//! inline styles because xterm.js's DOM renderer injects `<style>` elements for its cell
//! metrics and theme; scripts stay `'self'` only. Responses are revalidated (`no-cache`) with
//! a strong `ETag` (the first 16 bytes of the content's SHA-256, hex), answered 304 on a match.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::app::App;

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// URL path (the file's path under `web/`, with `/index.html` served at `/`).
    pub path: &'static str,
    /// `Content-Type`.
    pub mime: &'static str,
    /// The bytes, embedded by `include_bytes!`.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $mime:expr) => {
        Asset { path: $path, mime: $mime, body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/web", $path)) }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";
const TEXT: &str = "text/plain; charset=utf-8";

/// Every file of `web/` (a unit test checks that none is missing).
pub const ASSETS: &[Asset] = &[
    asset!("/index.html", HTML),
    asset!("/app.css", CSS),
    asset!("/app.js", JS),
    asset!("/favicon.svg", SVG),
    asset!("/js/api.js", JS),
    asset!("/js/sse.js", JS),
    asset!("/js/ui.js", JS),
    asset!("/js/tools.js", JS),
    asset!("/js/mcp.js", JS),
    asset!("/js/devices.js", JS),
    asset!("/js/connections.js", JS),
    asset!("/js/approvals.js", JS),
    asset!("/js/runs.js", JS),
    asset!("/js/terminal.js", JS),
    asset!("/vendor/xterm/xterm.mjs", JS),
    asset!("/vendor/xterm/addon-fit.mjs", JS),
    asset!("/vendor/xterm/xterm.css", CSS),
    asset!("/vendor/xterm/LICENSE", TEXT),
    asset!("/vendor/xterm/LICENSE.addon-fit", TEXT),
    asset!("/vendor/xterm/VERSIONS", TEXT),
];

/// The Content-Security-Policy of every page response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; \
     font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

const SECURITY_HEADERS: [(&str, &str); 7] = [
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
    ("permissions-policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()"),
];

fn etag(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    format!("\"{}\"", hex::encode(&digest[..16]))
}

fn respond(asset: &Asset, tag: &str, headers: &HeaderMap) -> Response {
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut response = if fresh {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Body::from(asset.body));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.mime));
        r
    };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    for (name, value) in SECURITY_HEADERS {
        h.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    response
}

/// The page's routes: `/` (index.html) and every other embedded file at its path.
pub fn router() -> Router<App> {
    let mut router = Router::new();
    for asset in ASSETS {
        let tag = etag(asset.body);
        let route = if asset.path == "/index.html" { "/" } else { asset.path };
        router = router.route(route, get(move |headers: HeaderMap| async move { respond(asset, &tag, &headers) }));
    }
    router
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn files(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, base, out);
            } else if path.file_name().is_some_and(|n| n != ".gitkeep") {
                out.push(format!("/{}", path.strip_prefix(base).unwrap().to_string_lossy()));
            }
        }
    }

    #[test]
    fn every_file_of_web_is_embedded() {
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
        let mut on_disk = Vec::new();
        files(&base, &base, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "web/ and ASSETS differ: add the file to ASSETS in src/http/web.rs");
        for a in ASSETS {
            let ext = a.path.rsplit('.').next().unwrap();
            let want = match ext {
                "js" | "mjs" => JS,
                "css" => CSS,
                "html" => HTML,
                "svg" => SVG,
                _ => TEXT,
            };
            assert_eq!(a.mime, want, "{}", a.path);
        }
    }
}
