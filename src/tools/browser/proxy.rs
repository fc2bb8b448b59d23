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
//! (a DNS answer that changes between check and connection cannot reach an internal address).
//! A refused request gets `403` (Chromium then fails it) and is recorded with the context's
//! other refusals: tab `*` (the proxy cannot tell which tab asked), resource type `proxied`
//! (plain HTTP, its URL) or `tunnel` (a `CONNECT`, named `host:port`).
//!
//! Who else can use the proxy: it listens on loopback, so any process of this host can connect
//! to it. It gives such a process nothing it could not do itself: this host's processes reach
//! the same addresses directly, except the sandboxed ones, which the sandbox denies the
//! database's and the server's ports (`--sandbox-network deny-services`) — and the floor
//! refuses those ports too — or keeps in a private network namespace where this loopback is not
//! reachable (`none`).
//!
//! Bounds: 256 connections at once per context (more are closed at accept), 30 s to send a
//! request's head, 10 s to connect upstream. The listener and every connection it serves end
//! when the context's proxy is dropped.

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
const MAX_CONNECTIONS: usize = 256;
/// Longest a client may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a connection to an upstream address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// This server's service ports.
    pub services: ServicePorts,
}

/// One context's proxy, listening until dropped.
pub struct ContextProxy {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl ContextProxy {
    /// Listens on a free loopback port and serves `floor`. Errors: the listener cannot bind.
    pub async fn start(floor: Floor) -> std::io::Result<ContextProxy> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, floor));
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

/// Accepts connections until aborted; dropping the set on abort ends every connection.
async fn serve(listener: TcpListener, floor: Floor) {
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
                connections.spawn(serve_connection(stream, floor.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A tunnel the service accepted: the client side's upgrade and the upstream connection.
type Tunnel = Arc<parking_lot::Mutex<Option<(hyper::upgrade::OnUpgrade, TcpStream)>>>;

/// Serves one client connection: requests until it closes, or until a `CONNECT` turns it
/// into a tunnel, spliced here until either side closes.
async fn serve_connection(stream: TcpStream, floor: Floor) {
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
    let Some((upgrade, mut upstream)) = tunnel.lock().take() else {
        return;
    };
    match upgrade.await {
        Ok(client) => {
            let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut upstream).await;
        }
        Err(e) => tracing::debug!(error = %e, "browser proxy tunnel"),
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
            let addrs = match self.admit(&shown, authority.host(), port, None).await {
                Ok(addrs) => addrs,
                Err(refused) => return self.refuse(refused, "tunnel"),
            };
            return match connect(&addrs).await {
                Ok(upstream) => {
                    *tunnel.lock() = Some((hyper::upgrade::on(&mut req), upstream));
                    Response::new(Empty::new().map_err(|never| match never {}).boxed())
                }
                Err(e) => text(StatusCode::BAD_GATEWAY, format!("connecting to {shown}: {e}")),
            };
        }
        let url = req.uri().to_string();
        let (host, port) = match req.uri().authority() {
            Some(a) if req.uri().scheme_str() == Some("http") => (a.host().to_owned(), a.port_u16().unwrap_or(80)),
            _ => return text(StatusCode::BAD_REQUEST, "a proxy request names an absolute http URL".into()),
        };
        let addrs = match self.admit(&url, &host, port, Some(&url)).await {
            Ok(addrs) => addrs,
            Err(refused) => return self.refuse(refused, "proxied"),
        };
        match forward(req, &addrs).await {
            Ok(response) => response,
            Err(message) => text(StatusCode::BAD_GATEWAY, message),
        }
    }

    /// The policy for one request (`url` for plain HTTP; none for a tunnel): the service
    /// ports, the scheme and origin rules, then the address rule. Returns the addresses to
    /// connect to.
    async fn admit(&self, shown: &str, host: &str, port: u16, url: Option<&str>) -> Result<Vec<SocketAddr>, Refusal> {
        if (self.services)().contains(&port) {
            return Err(refusal(
                shown,
                RefusalRule::ServicePort,
                format!("port {port} is one of this server's own services"),
            ));
        }
        let policy = self.policy.read().clone();
        match url {
            Some(url) => {
                policy.check_url(url)?;
            }
            None => policy.check_authority(shown, host, port)?,
        }
        policy.addresses(shown, host, port).await
    }

    fn refuse(&self, refused: Refusal, resource_type: &str) -> Response<ProxyBody> {
        let message = format!("refused by the browser's origin policy: {}", refused.message);
        record_refusal(
            &self.refusals,
            RefusedRequest { tab: "*".into(), resource_type: resource_type.into(), refusal: refused },
        );
        text(StatusCode::FORBIDDEN, message)
    }
}

/// Connects to the first of `addrs` that answers within [`CONNECT_TIMEOUT`].
async fn connect(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{addr} timed out")),
        }
    }
    Err(last)
}

/// Sends `req` (absolute form) to `addrs` in origin form without hop-by-hop headers, and
/// streams the answer back.
async fn forward(mut req: Request<Incoming>, addrs: &[SocketAddr]) -> Result<Response<ProxyBody>, String> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = path.parse().map_err(|e| format!("{path}: {e}"))?;
    let listed: Vec<HeaderName> = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP.map(HeaderName::from_static)) {
        req.headers_mut().remove(name);
    }
    let upstream = connect(addrs).await.map_err(|e| format!("connecting upstream: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
        .await
        .map_err(|e| format!("upstream handshake: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "browser proxy upstream");
        }
    });
    let response = sender.send_request(req).await.map_err(|e| format!("upstream request: {e}"))?;
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
        };
        let refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>> = Arc::default();
        let floor = Floor {
            policy: Arc::new(parking_lot::RwLock::new(policy)),
            refusals: refusals.clone(),
            services: Arc::new(move || services.clone()),
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
                "GET http://127.0.0.1:{port}/page?q=1 HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\
                 proxy-connection: keep-alive\r\nx-kept: yes\r\nconnection: close\r\n\r\n"
            ),
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains("GET /page?q=1 HTTP/1.1"), "origin form upstream: {got}");
        assert!(got.contains("x-kept: yes"), "{got}");
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
