//! The network floor of the managed browser: a forward HTTP proxy on loopback for each user's
//! browser context (CDP `Target.createBrowserContext` with `proxyServer`, and the bypass list
//! `<-loopback>` so that not even loopback addresses skip it), through which every connection
//! of that context goes — pages, pop-ups, dedicated, shared and service workers, WebSockets,
//! prefetches — including the requests the tabs' `Fetch` interception never sees.
//!
//! Each request is checked against the context's [`OriginPolicy`] at the moment it arrives:
//! - a plain HTTP request (absolute form, `GET http://host/path`) by its URL (scheme, origin
//!   list, address rule) and then forwarded over a new connection;
//! - a tunnel (`CONNECT host:port`: TLS, or a WebSocket) by its host and port
//!   ([`OriginPolicy::check_authority`]) and the address rule, then spliced byte for byte;
//! - either is refused when its port is one of this server's own services (its database, its
//!   API: [`ServicePorts`]), whoever the user is.
//!
//! The name is resolved once, by the proxy, and the connection goes to the checked addresses
//! (a DNS answer that changes between check and connection cannot reach an internal address);
//! under the public-only rule a connection that turns out to be to this host itself (one of its
//! own public addresses) is refused too. A plain request is sent with the `Host` the checked URL
//! names. A refused request gets `403` (a tunnel then fails in Chromium; a plain request shows
//! the proxy's refusal text as its response) and is recorded with the context's other
//! refusals: tab `*` (the proxy cannot tell which tab asked), resource type `proxied` (plain
//! HTTP, its URL) or `tunnel` (a `CONNECT`, named `host:port`). An upstream's hop-by-hop
//! headers are dropped, and its `407` (which Chromium would take as the proxy's) becomes `502`.
//!
//! Who else can use the proxy: it listens on loopback, so any process of this host can connect
//! to it. It gives such a process nothing it could not do itself: this host's processes reach
//! the same addresses directly, except the sandboxed ones, which the sandbox denies the
//! database's and the server's ports (`--sandbox-network deny-services`) — and the floor
//! refuses those ports too — or keeps in a private network namespace where this loopback is not
//! reachable (`none`).
//!
//! Bounds: 256 connections at once per context, each user's share of the pool (a semaphore of
//! the user's, [`ContextProxy::start_shared`]: the manager gives each user
//! [`MAX_FLOOR_CONNECTIONS`] / `--browser-max-contexts`, so the users together never hold more
//! than the pool and none can starve another) and [`MAX_FLOOR_CONNECTIONS`] over all contexts
//! (more are closed at accept), 30 s to send a request's head, 10 s to connect upstream (the
//! first 4 addresses of a name), 30 s for the upstream's response head, and a tunnel through
//! which no byte moved either way for [`Floor::tunnel_idle`] (`--browser-tunnel-idle-secs`) is
//! closed on both sides — a half-closed one too (one side sent its end and the other stays open
//! and silent), which would otherwise hold its place in the user's share for as long as the
//! upstream kept its side open. The listener and every connection it serves end when the
//! context's proxy is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderName};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::manager::{RefusedRequest, record_refusal};
use super::policy::{OriginPolicy, Refusal, RefusalRule, refusal};

/// The ports of this server's own services (its database's, its API's) at the time of the
/// call; the floor refuses them for every user.
pub type ServicePorts = Arc<dyn Fn() -> Vec<u16> + Send + Sync>;

/// Most connections one context's proxy serves at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Most connections all contexts' proxies serve at once (a tunnel holds two descriptors).
pub const MAX_FLOOR_CONNECTIONS: usize = 512;
/// Fewest connections a user's share of the pool may hold: a page loading opens several at
/// once (Chromium up to 6 per host), and a connection beyond the share is closed at accept, so
/// a smaller share breaks pages.
pub const MIN_FLOOR_SHARE: usize = 8;
/// Most users' contexts `--browser-max-contexts` may allow (64): each user's share is
/// [`MAX_FLOOR_CONNECTIONS`] / that number, never below [`MIN_FLOOR_SHARE`].
pub const MAX_CONTEXTS: usize = MAX_FLOOR_CONNECTIONS / MIN_FLOOR_SHARE;
/// Most addresses of one name tried.
const MAX_ADDRESSES: usize = 4;
/// Longest a client may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest connecting upstream may take, over all the addresses tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an upstream may take to answer a plain request's head.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Hop-by-hop headers (RFC 9110 §7.6.1) and the proxy's own, never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// What a context's proxy checks against and where it records refusals.
#[derive(Clone)]
pub struct Floor {
    /// The context's policy (shared with its tabs' interception; its address rule follows
    /// the user's admin status).
    pub policy: Arc<parking_lot::RwLock<OriginPolicy>>,
    /// The context's refusals, taken by the next call.
    pub refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>>,
    /// Connections all contexts' proxies may still open ([`MAX_FLOOR_CONNECTIONS`] in all).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Longest a tunnel may pass no byte either way before both its sides are closed
    /// (`--browser-tunnel-idle-secs`).
    pub tunnel_idle: Duration,
}

/// One context's proxy, listening until dropped.
pub struct ContextProxy {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl ContextProxy {
    /// Listens on a free loopback port and serves `floor`, bounded by the per-context limit and
    /// `floor.slots` only. Errors: the listener cannot bind.
    pub async fn start(floor: Floor) -> std::io::Result<ContextProxy> {
        Self::listen(floor, None).await
    }

    /// [`ContextProxy::start`], each connection also taking a place of `share`: the share of
    /// the pool of the context's owner (one semaphore per user, whichever of their contexts'
    /// proxies hold its places), so that one user's pages cannot take every connection of the
    /// pool. Errors: the listener cannot bind.
    pub async fn start_shared(floor: Floor, share: Arc<tokio::sync::Semaphore>) -> std::io::Result<ContextProxy> {
        Self::listen(floor, Some(share)).await
    }

    async fn listen(floor: Floor, share: Option<Arc<tokio::sync::Semaphore>>) -> std::io::Result<ContextProxy> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, floor, share));
        Ok(ContextProxy { address, task })
    }

    /// The `proxyServer` value for Chromium (`http://127.0.0.1:<port>`).
    pub fn proxy_server(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Drop for ContextProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; dropping the set on abort ends every connection. A
/// connection beyond the context's limit, its owner's `share` or the pool is closed at once.
async fn serve(listener: TcpListener, floor: Floor, share: Option<Arc<tokio::sync::Semaphore>>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "browser proxy accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if connections.len() >= MAX_CONNECTIONS {
                    continue;
                }
                let owners = match &share {
                    Some(share) => match share.clone().try_acquire_owned() {
                        Ok(place) => Some(place),
                        Err(_) => continue,
                    },
                    None => None,
                };
                let Ok(slot) = floor.slots.clone().try_acquire_owned() else {
                    continue;
                };
                let served = serve_connection(stream, floor.clone());
                connections.spawn(async move {
                    served.await;
                    drop((slot, owners));
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A tunnel the service accepted: the client side's upgrade and the upstream connection.
type Tunnel = Arc<parking_lot::Mutex<Option<(hyper::upgrade::OnUpgrade, TcpStream)>>>;

/// Serves one client connection: requests until it closes, or until a `CONNECT` turns it
/// into a tunnel, spliced here ([`splice`]) until both directions ended, either side failed,
/// or nothing moved for [`Floor::tunnel_idle`].
async fn serve_connection(stream: TcpStream, floor: Floor) {
    let idle = floor.tunnel_idle;
    let tunnel: Tunnel = Arc::default();
    let slot = tunnel.clone();
    let service = hyper::service::service_fn(move |req| {
        let floor = floor.clone();
        let slot = slot.clone();
        async move { Ok::<_, Infallible>(floor.handle(req, &slot).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "browser proxy connection");
    }
    let Some((upgrade, upstream)) = tunnel.lock().take() else {
        return;
    };
    match upgrade.await {
        Ok(client) => {
            if splice(TokioIo::new(client), upstream, idle).await == Spliced::Idle {
                tracing::debug!(idle_secs = idle.as_secs(), "browser proxy tunnel closed: idle");
            }
        }
        Err(e) => tracing::debug!(error = %e, "browser proxy tunnel"),
    }
}

/// How a tunnel's splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spliced {
    /// Both directions ended (each side sent its end), or one side failed.
    Ended,
    /// No byte moved either way for the idle limit: both sides were closed.
    Idle,
}

/// Copies bytes both ways between `client` and `upstream` until both directions ended (an end
/// read from one side is passed on as a shutdown of the other's writing half), either side
/// failed, or no byte was read or written either way for `idle`. Then both sides are dropped,
/// which closes them: a tunnel half closed by one side and kept open and silent by the other
/// ends after `idle` like any idle tunnel.
async fn splice<C>(client: C, upstream: TcpStream, idle: Duration) -> Spliced
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    let start = tokio::time::Instant::now();
    // Milliseconds since `start` of the last byte read or written either way.
    let moved = AtomicU64::new(0);
    let (client_reads, client_writes) = tokio::io::split(client);
    let (upstream_reads, upstream_writes) = upstream.into_split();
    let copy = async {
        tokio::try_join!(
            pipe(client_reads, upstream_writes, &moved, start),
            pipe(upstream_reads, client_writes, &moved, start)
        )
    };
    let watch = async {
        loop {
            let last = start + Duration::from_millis(moved.load(Ordering::Relaxed));
            if last.elapsed() >= idle {
                return;
            }
            tokio::time::sleep_until(last + idle).await;
        }
    };
    tokio::select! {
        _ = copy => Spliced::Ended,
        () = watch => Spliced::Idle,
    }
}

/// Copies `from` to `to` until `from` ends (then shuts `to`'s writing down), noting in `moved`
/// (milliseconds since `start`) each time bytes were read or written. Errors: either side's.
async fn pipe<R, W>(
    mut from: R,
    mut to: W,
    moved: &std::sync::atomic::AtomicU64,
    start: tokio::time::Instant,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let note = || {
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        moved.fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        note();
        to.write_all(&buf[..n]).await?;
        note();
    }
}

impl Floor {
    async fn handle(&self, mut req: Request<Incoming>, tunnel: &Tunnel) -> Response<ProxyBody> {
        if req.method() == Method::CONNECT {
            let Some(authority) = req.uri().authority().cloned() else {
                return text(StatusCode::BAD_REQUEST, "CONNECT needs host:port".into());
            };
            let shown = authority.as_str().to_owned();
            let port = authority.port_u16().unwrap_or(443);
            let policy = self.policy.read().clone();
            if let Err(refused) = policy.check_authority(&shown, authority.host(), port) {
                return self.refuse(refused, "tunnel");
            }
            return match self.connect(&policy, &shown, authority.host(), port).await {
                Ok(upstream) => {
                    *tunnel.lock() = Some((hyper::upgrade::on(&mut req), upstream));
                    Response::new(Empty::new().map_err(|never| match never {}).boxed())
                }
                Err(Failure::Refused(refused)) => self.refuse(refused, "tunnel"),
                Err(Failure::Failed(message)) => text(StatusCode::BAD_GATEWAY, message),
            };
        }
        let url = req.uri().to_string();
        let policy = self.policy.read().clone();
        // The URL is parsed once, by the policy; host, port and `Host` all come from it.
        let parsed = match policy.check_url(&url) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => return text(StatusCode::BAD_REQUEST, "a proxy request names an absolute http URL".into()),
            Err(refused) => return self.refuse(refused, "proxied"),
        };
        let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
            return text(StatusCode::BAD_REQUEST, "a proxy request names an absolute http URL".into());
        };
        if parsed.scheme() != "http" {
            return text(StatusCode::BAD_REQUEST, "a proxy request names an absolute http URL".into());
        }
        let upstream = match self.connect(&policy, &url, host, port).await {
            Ok(upstream) => upstream,
            Err(Failure::Refused(refused)) => return self.refuse(refused, "proxied"),
            Err(Failure::Failed(message)) => return text(StatusCode::BAD_GATEWAY, message),
        };
        let authority = match parsed.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        };
        match forward(req, upstream, &parsed, &authority).await {
            Ok(response) => response,
            Err(message) => text(StatusCode::BAD_GATEWAY, message),
        }
    }

    /// Resolves `host` under the address rule and connects to the first of its checked
    /// addresses (at most [`MAX_ADDRESSES`]) that answers within [`CONNECT_TIMEOUT`] in all;
    /// under the public-only rule, a connection to this host itself is refused.
    async fn connect(&self, policy: &OriginPolicy, shown: &str, host: &str, port: u16) -> Result<TcpStream, Failure> {
        let addrs = policy.addresses(shown, host, port).await.map_err(Failure::Refused)?;
        let attempt = async {
            let mut last = format!("{shown}: no address");
            for addr in addrs.iter().take(MAX_ADDRESSES) {
                match TcpStream::connect(addr).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = format!("connecting to {addr}: {e}"),
                }
            }
            Err(last)
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .map_err(|_| Failure::Failed(format!("connecting to {shown} timed out")))?
            .map_err(Failure::Failed)?;
        if policy.rule == crate::net::AddressRule::PublicOnly {
            let (local, peer) = (stream.local_addr(), stream.peer_addr());
            if let (Ok(local), Ok(peer)) = (local, peer)
                && local.ip() == peer.ip()
            {
                return Err(Failure::Refused(refusal(
                    shown,
                    RefusalRule::InternalAddress,
                    format!(
                        "{} is an address of this host itself; only an admin may point the browser at it",
                        peer.ip()
                    ),
                )));
            }
        }
        Ok(stream)
    }

    /// Records the refusal (with its reason, for the user's evidence) and answers the page
    /// 403 with a fixed text: the reason may name the addresses a name resolved to, and a
    /// page (a worker's `fetch` reads the body) could map internal names to addresses with it.
    fn refuse(&self, refused: Refusal, resource_type: &str) -> Response<ProxyBody> {
        let message = "refused by the browser's origin policy";
        record_refusal(
            &self.refusals,
            RefusedRequest { tab: "*".into(), resource_type: resource_type.into(), refusal: refused },
        );
        text(StatusCode::FORBIDDEN, message.to_owned())
    }
}

/// Why a connection upstream was not made.
enum Failure {
    /// The policy refused it.
    Refused(Refusal),
    /// It failed (502).
    Failed(String),
}

/// Drops the hop-by-hop headers of `headers`, and those its `Connection` names.
fn strip_hop_by_hop(headers: &mut header::HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP.map(HeaderName::from_static)) {
        headers.remove(name);
    }
}

/// Sends `req` (absolute form, for `url`) over `upstream` in origin form, with `Host` set to
/// `authority` and without hop-by-hop headers, and streams the answer back (its hop-by-hop
/// headers dropped, a `407` turned into `502`).
async fn forward(
    mut req: Request<Incoming>,
    upstream: TcpStream,
    url: &url::Url,
    authority: &str,
) -> Result<Response<ProxyBody>, String> {
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    *req.uri_mut() = path.parse().map_err(|e| format!("{path}: {e}"))?;
    strip_hop_by_hop(req.headers_mut());
    let host = header::HeaderValue::from_str(authority).map_err(|e| format!("{authority}: {e}"))?;
    req.headers_mut().insert(header::HOST, host);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
        .await
        .map_err(|e| format!("upstream handshake: {e}"))?;
    // Ends when the response (and its body) is done or dropped: hyper closes it then.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "browser proxy upstream");
        }
    });
    let mut response = tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| format!("{authority} did not answer within {} s", RESPONSE_TIMEOUT.as_secs()))?
        .map_err(|e| format!("upstream request: {e}"))?;
    if response.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        return Ok(text(StatusCode::BAD_GATEWAY, format!("{authority} answered 407, which only a proxy may send")));
    }
    strip_hop_by_hop(response.headers_mut());
    Ok(response.map(BodyExt::boxed))
}

fn text(status: StatusCode, message: String) -> Response<ProxyBody> {
    let mut response = Response::new(Full::new(Bytes::from(message)).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::net::AddressRule;

    /// An upstream on loopback that answers each connection's first read with the request
    /// head it got (plain HTTP) or echoes bytes back (a tunnel).
    async fn upstream() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let got = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if got.starts_with("GET ") {
                        let body = got.replace("\r\n", "\n");
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                        let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
                    } else {
                        let _ = s.write_all(&buf[..n]).await;
                    }
                });
            }
        });
        port
    }

    async fn proxy(allow: &[&str], services: Vec<u16>) -> (ContextProxy, Arc<parking_lot::Mutex<Vec<RefusedRequest>>>) {
        let policy = OriginPolicy {
            allow: allow.iter().filter_map(|o| super::super::policy::normalise_origin(o)).collect(),
            rule: AddressRule::Any,
            service_ports: services,
        };
        let refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>> = Arc::default();
        let floor = Floor {
            policy: Arc::new(parking_lot::RwLock::new(policy)),
            refusals: refusals.clone(),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_FLOOR_CONNECTIONS)),
            tunnel_idle: Duration::from_secs(120),
        };
        (ContextProxy::start(floor).await.unwrap(), refusals)
    }

    async fn exchange(proxy: &ContextProxy, request: &str) -> String {
        let mut s = TcpStream::connect(proxy.address).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        // Reads until the head and its content-length of body are in (or the peer closes).
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if out.len() >= end + 4 + length {
                    return text;
                }
            }
            match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => out.extend_from_slice(&chunk[..n]),
                _ => return text,
            }
        }
    }

    #[tokio::test]
    async fn forwards_allowed_plain_http_without_proxy_headers() {
        let port = upstream().await;
        let (p, refusals) = proxy(&[&format!("http://127.0.0.1:{port}")], Vec::new()).await;
        let got = exchange(
            &p,
            &format!(
                "GET http://127.0.0.1:{port}/page?q=1 HTTP/1.1\r\nhost: other.example\r\n\
                 proxy-connection: keep-alive\r\nx-kept: yes\r\nconnection: close\r\n\r\n"
            ),
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains("GET /page?q=1 HTTP/1.1"), "origin form upstream: {got}");
        assert!(got.contains("x-kept: yes"), "{got}");
        assert!(got.contains(&format!("host: 127.0.0.1:{port}")), "Host is the checked URL's: {got}");
        assert!(!got.contains("other.example"), "{got}");
        assert!(!got.to_ascii_lowercase().contains("proxy-connection"), "{got}");
        assert!(refusals.lock().is_empty());
    }

    #[tokio::test]
    async fn refuses_unlisted_origins_and_service_ports_and_records_them() {
        let port = upstream().await;
        let service = upstream().await;
        let (p, refusals) = proxy(&[&format!("http://127.0.0.1:{service}")], vec![service]).await;
        let other =
            exchange(&p, &format!("GET http://127.0.0.1:{port}/x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"))
                .await;
        assert!(other.starts_with("HTTP/1.1 403"), "{other}");
        let tunnel = exchange(&p, &format!("CONNECT 127.0.0.1:{service} HTTP/1.1\r\nhost: a\r\n\r\n")).await;
        assert!(tunnel.starts_with("HTTP/1.1 403"), "a listed origin on a service port is still refused: {tunnel}");
        let kept = refusals.lock().clone();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!((kept[0].resource_type.as_str(), kept[0].refusal.rule), ("proxied", RefusalRule::Origin));
        assert_eq!((kept[1].resource_type.as_str(), kept[1].refusal.rule), ("tunnel", RefusalRule::ServicePort));
        assert_eq!(kept[1].refusal.url, format!("127.0.0.1:{service}"));
        assert!(kept.iter().all(|r| r.tab == "*"));
    }

    #[tokio::test]
    async fn tunnels_splice_bytes_to_a_listed_host_and_port() {
        let port = upstream().await;
        let (p, refusals) = proxy(&[&format!("https://127.0.0.1:{port}")], Vec::new()).await;
        let mut s = TcpStream::connect(p.address).await.unwrap();
        s.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = vec![0u8; 256];
        let n = s.read(&mut head).await.unwrap();
        assert!(
            String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&head[..n])
        );
        s.write_all(b"\x16\x03\x01 opaque bytes").await.unwrap();
        let mut echo = vec![0u8; 64];
        let n = s.read(&mut echo).await.unwrap();
        assert_eq!(&echo[..n], b"\x16\x03\x01 opaque bytes");
        assert!(refusals.lock().is_empty());
        drop(p);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut echo)).await.unwrap().unwrap_or(0);
        assert_eq!(n, 0, "dropping the proxy ends its tunnels");
    }
}
