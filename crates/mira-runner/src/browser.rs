//! `--attach-browser http://127.0.0.1:9222`: the runner carries DevTools messages between
//! the control plane and a Chromium debugging on this device's loopback, so that a hosted
//! control plane reaches the user's own browser without its debugging port ever leaving the
//! device (docs/browser.md, "Through the device runner").
//!
//! The address is checked here, when the runner starts: a loopback IP (or `localhost`, taken
//! as 127.0.0.1), never sent to the control plane. Each channel the control plane opens (a
//! signed `open` frame on the job stream) is one WebSocket to the browser, found as the
//! browser's own `/json/version` names it (its path only; the host is never followed).
//! Commands arrive as signed `message` frames, in order; each is checked against the same
//! method allow-list as on the server ([`mira_core::devtools::check_method`]) and rebuilt
//! from its checked parts before it reaches the browser: a frame that fails either check
//! closes the channel. The browser's messages go up in order (`POST /v1/runner/cdp`, one
//! upload at a time per channel); events over 1 MiB are dropped here, a message over
//! 16 MiB closes the channel, and a queue of [`UP_QUEUE`] messages that the control plane
//! does not drain closes it too.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_tungstenite::tungstenite::Message;
use ed25519_dalek::VerifyingKey;
use futures::StreamExt;
use mira_core::devtools::{MAX_EVENT_BYTES, MAX_MESSAGE_BYTES, answer_id, check_method};
use mira_core::remote::{CDP_BATCH_BYTES, CdpDown, CdpOp, CdpState};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Channels open at once at most.
pub const MAX_CHANNELS: usize = 4;
/// Commands waiting for the browser per channel; one more closes the channel.
pub const DOWN_QUEUE: usize = 256;
/// Browser messages waiting for their upload per channel; one more closes the channel.
pub const UP_QUEUE: usize = 1024;
/// Longest opening the browser (`/json/version`, the WebSocket) may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest `/json/version` answer read.
const MAX_VERSION_BYTES: usize = 64 * 1024;

/// The browser's loopback address from `--attach-browser`: `http://IP:port` with a
/// loopback IP, or `http://localhost:port` (127.0.0.1). Errors: anything else.
pub fn parse_endpoint(endpoint: &str) -> anyhow::Result<SocketAddr> {
    let url = reqwest::Url::parse(endpoint.trim())
        .map_err(|e| anyhow::anyhow!("--attach-browser {endpoint}: not a URL ({e})"))?;
    if url.scheme() != "http"
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || !matches!(url.path(), "" | "/")
    {
        anyhow::bail!("--attach-browser must be the browser's debugging address http://127.0.0.1:PORT");
    }
    let ip: IpAddr = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.into(),
        Some(url::Host::Ipv6(ip)) => ip.into(),
        Some(url::Host::Domain("localhost")) => IpAddr::from([127, 0, 0, 1]),
        _ => anyhow::bail!("--attach-browser must name a loopback address (127.0.0.1, [::1] or localhost)"),
    };
    if !ip.is_loopback() {
        anyhow::bail!(
            "--attach-browser {ip} is not a loopback address: a debugging port is full control of the browser and \
             must stay on this device"
        );
    }
    let port = url.port().ok_or_else(|| anyhow::anyhow!("--attach-browser needs the debugging port"))?;
    Ok(SocketAddr::new(ip, port))
}

struct Handle {
    last_seq: u64,
    tx: mpsc::Sender<String>,
    close: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl Handle {
    fn close(&self, reason: String) {
        self.reason.lock().get_or_insert(reason);
        self.close.cancel();
    }
}

/// The device's browser and the channels open to it.
pub struct DeviceBrowser {
    addr: SocketAddr,
    device_id: String,
    server_key: VerifyingKey,
    server: String,
    client: reqwest::Client,
    local: reqwest::Client,
    channels: Mutex<HashMap<String, Handle>>,
}

/// A command frame's data, checked and rebuilt from its parts (`id`, `method`, `params`,
/// `sessionId`). Errors: why it is refused.
pub fn checked_command(data: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(data).map_err(|_| "a DevTools command that is not JSON".to_owned())?;
    let id = v["id"].as_u64().ok_or("a DevTools command without an id")?;
    let method = v["method"].as_str().ok_or("a DevTools command without a method")?;
    let params = match v.get("params") {
        None => json!({}),
        Some(p) if p.is_object() => p.clone(),
        Some(_) => return Err("DevTools params that are not an object".into()),
    };
    check_method(method, &params)?;
    let mut out = json!({"id": id, "method": method, "params": params});
    match v.get("sessionId") {
        None => {}
        Some(Value::String(s)) => out["sessionId"] = json!(s),
        Some(_) => return Err("a DevTools sessionId that is not a string".into()),
    }
    Ok(out.to_string())
}

impl DeviceBrowser {
    /// The browser at `addr` (from [`parse_endpoint`]) for `device_id`, taking frames signed
    /// by `server_key` and uploading to `server` with `client`.
    pub fn new(
        addr: SocketAddr,
        device_id: &str,
        server_key: VerifyingKey,
        server: &str,
        client: reqwest::Client,
    ) -> anyhow::Result<Self> {
        let local = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(OPEN_TIMEOUT)
            .build()?;
        Ok(Self {
            addr,
            device_id: device_id.to_owned(),
            server_key,
            server: server.trim_end_matches('/').to_owned(),
            client,
            local,
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// Closes every channel (the connection to the control plane ended: its channels with it).
    pub fn close_all(&self, reason: &str) {
        for (_, h) in self.channels.lock().drain() {
            h.close(reason.to_owned());
        }
    }

    /// Takes one frame of the connection whose session token is `session`.
    pub fn handle(self: &Arc<Self>, frame: CdpDown, session: &str) {
        if !frame.verify(&self.server_key, &self.device_id) {
            tracing::warn!(channel = %frame.channel, "a DevTools frame that is not signed by the control plane for this device; ignored");
            return;
        }
        match frame.op {
            CdpOp::Open => {
                let mut map = self.channels.lock();
                if frame.seq != 0 || map.contains_key(&frame.channel) {
                    return;
                }
                if map.len() >= MAX_CHANNELS {
                    drop(map);
                    let this = Arc::clone(self);
                    let (channel, session) = (frame.channel.clone(), session.to_owned());
                    tokio::spawn(async move {
                        let reason = format!("the device's runner has {MAX_CHANNELS} browser channels open already");
                        this.post_state(&session, &CdpState::Closed { channel, reason }).await;
                    });
                    return;
                }
                let (tx, rx) = mpsc::channel(DOWN_QUEUE);
                let close = CancellationToken::new();
                let reason = Arc::new(Mutex::new(None));
                map.insert(
                    frame.channel.clone(),
                    Handle { last_seq: 0, tx, close: close.clone(), reason: reason.clone() },
                );
                let this = Arc::clone(self);
                let session = session.to_owned();
                tokio::spawn(async move { this.run(frame.channel, session, rx, close, reason).await });
            }
            CdpOp::Message => {
                let mut map = self.channels.lock();
                let Some(h) = map.get_mut(&frame.channel) else { return };
                if frame.seq <= h.last_seq {
                    h.close("a DevTools frame out of order".into());
                    return;
                }
                h.last_seq = frame.seq;
                match checked_command(&frame.data) {
                    Ok(text) => {
                        if h.tx.try_send(text).is_err() {
                            h.close("too many DevTools commands waiting for the browser".into());
                        }
                    }
                    Err(why) => {
                        tracing::warn!(channel = %frame.channel, reason = %why, "a DevTools command refused on the device");
                        h.close(format!("refused on the device: {why}"));
                    }
                }
            }
            CdpOp::Close => {
                if let Some(h) = self.channels.lock().remove(&frame.channel) {
                    h.close("closed by the server".into());
                }
            }
        }
    }

    async fn post_state(&self, session: &str, state: &CdpState) {
        let sent = self
            .client
            .post(format!("{}/v1/runner/cdp/state", self.server))
            .bearer_auth(session)
            .json(state)
            .send()
            .await;
        if let Err(e) = sent {
            tracing::debug!(error = %e, "a browser channel's state was not sent");
        }
    }

    /// `/json/version` at the loopback address: the product and the browser WebSocket path.
    async fn version(&self) -> Result<(String, String), String> {
        let url = format!("http://{}/json/version", self.addr);
        let mut resp = self
            .local
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("no browser answers on this device at {}: {e}", self.addr))?;
        if !resp.status().is_success() {
            return Err(format!("the device's browser answered {} to /json/version", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("reading /json/version: {e}"))? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_VERSION_BYTES {
                return Err("/json/version answered more than 64 KiB".into());
            }
        }
        let v: Value = serde_json::from_slice(&body).map_err(|_| "/json/version is not JSON".to_owned())?;
        let ws = v["webSocketDebuggerUrl"].as_str().unwrap_or_default();
        let path = reqwest::Url::parse(ws)
            .ok()
            .map(|u| u.path().to_owned())
            .filter(|p| p.starts_with("/devtools/browser/"))
            .ok_or("the device's browser names no browser WebSocket")?;
        Ok((v["Browser"].as_str().unwrap_or_default().to_owned(), path))
    }

    async fn run(
        self: Arc<Self>,
        channel: String,
        session: String,
        mut rx: mpsc::Receiver<String>,
        close: CancellationToken,
        reason: Arc<Mutex<Option<String>>>,
    ) {
        let why = tokio::select! {
            why = self.pump(&channel, &session, &mut rx, &close) => why,
            () = close.cancelled() => String::new(),
        };
        let why = reason.lock().clone().unwrap_or(why);
        self.channels.lock().remove(&channel);
        close.cancel();
        tracing::info!(channel = %channel, reason = %why, "browser channel closed");
        self.post_state(&session, &CdpState::Closed { channel, reason: why }).await;
    }

    /// Opens the browser and carries the channel's messages both ways until one side ends:
    /// why it ended.
    async fn pump(
        self: &Arc<Self>,
        channel: &str,
        session: &str,
        rx: &mut mpsc::Receiver<String>,
        close: &CancellationToken,
    ) -> String {
        let (product, path) = match self.version().await {
            Ok(v) => v,
            Err(e) => return e,
        };
        let stream = match tokio::time::timeout(OPEN_TIMEOUT, tokio::net::TcpStream::connect(self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return format!("cannot connect to the device's browser: {e}"),
            Err(_) => return "the device's browser did not accept a connection".into(),
        };
        let config = async_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let url = format!("ws://{}{path}", self.addr);
        let ws = match tokio::time::timeout(
            OPEN_TIMEOUT,
            async_tungstenite::tokio::client_async_with_config(url, stream, Some(config)),
        )
        .await
        {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => return format!("the DevTools handshake with the device's browser failed: {e}"),
            Err(_) => return "the DevTools handshake with the device's browser timed out".into(),
        };
        let (mut sink, mut source) = ws.split();
        let (up_tx, up_rx) = mpsc::channel::<String>(UP_QUEUE);
        let uploader =
            tokio::spawn(Arc::clone(self).upload(channel.to_owned(), session.to_owned(), up_rx, close.clone()));
        let _stop_uploader = AbortOnDrop(uploader);
        self.post_state(session, &CdpState::Open { channel: channel.to_owned(), product, ws_path: path }).await;
        let why = loop {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(text) => if let Err(e) = sink.send(Message::Text(text.into())).await {
                        break format!("the device's browser connection failed: {e}");
                    },
                    None => break "closed".into(),
                },
                message = source.next() => match message {
                    Some(Ok(Message::Text(text))) => {
                        let text = text.as_str();
                        if text.len() > MAX_EVENT_BYTES && answer_id(text).is_none() {
                            tracing::warn!(bytes = text.len(), "dropped an oversized DevTools event");
                            continue;
                        }
                        let line = if text.contains('\n') {
                            serde_json::from_str::<Value>(text).map(|v| v.to_string()).unwrap_or_default()
                        } else {
                            text.to_owned()
                        };
                        if up_tx.try_send(line).is_err() {
                            break "the control plane did not take the browser's messages fast enough".into();
                        }
                    }
                    Some(Ok(Message::Close(_))) | None => break "the browser closed the connection".into(),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("the connection to the browser failed: {e}"),
                },
            }
        };
        let _ = sink.close(None).await;
        why
    }

    /// Posts the channel's queued messages in order, gathered up to [`CDP_BATCH_BYTES`] an
    /// upload; a failed upload closes the channel.
    async fn upload(
        self: Arc<Self>,
        channel: String,
        session: String,
        mut rx: mpsc::Receiver<String>,
        close: CancellationToken,
    ) {
        let mut seq = 0u64;
        while let Some(first) = rx.recv().await {
            let mut body = first.into_bytes();
            while body.len() < CDP_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(next) => {
                        body.push(b'\n');
                        body.extend_from_slice(next.as_bytes());
                    }
                    Err(_) => break,
                }
            }
            let sent = self
                .client
                .post(format!("{}/v1/runner/cdp", self.server))
                .query(&[("channel", channel.as_str()), ("seq", &seq.to_string())])
                .bearer_auth(&session)
                .body(body)
                .send()
                .await;
            seq += 1;
            let failed = match sent {
                Ok(r) if r.status().is_success() => None,
                Ok(r) => Some(format!("the control plane refused the browser's messages ({})", r.status())),
                Err(e) => Some(format!("the browser's messages could not be sent: {e}")),
            };
            if let Some(why) = failed {
                if let Some(h) = self.channels.lock().get(&channel) {
                    h.close(why);
                }
                close.cancel();
                return;
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_endpoints() {
        assert_eq!(parse_endpoint("http://127.0.0.1:9222").unwrap().port(), 9222);
        assert!(parse_endpoint("http://localhost:9222/").unwrap().ip().is_loopback());
        assert!(parse_endpoint("http://[::1]:9222").is_ok());
        for bad in [
            "http://10.0.0.2:9222",
            "http://example.com:9222",
            "https://127.0.0.1:9222",
            "http://127.0.0.1",
            "http://127.0.0.1:9222/json",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commands_are_checked_and_rebuilt() {
        let ok = checked_command(r#"{"id":3,"method":"Target.getTargets","params":{},"extra":1}"#).unwrap();
        assert_eq!(ok, r#"{"id":3,"method":"Target.getTargets","params":{}}"#);
        assert!(checked_command(r#"{"id":3,"method":"Runtime.evaluate","params":{"expression":"1"}}"#).is_err());
        assert!(checked_command(r#"{"id":3,"method":"Network.getCookies"}"#).is_err());
        assert!(checked_command(r#"{"method":"Target.getTargets"}"#).is_err());
        let s = checked_command(r#"{"id":1,"method":"Page.enable","sessionId":"AB"}"#).unwrap();
        assert!(s.contains(r#""sessionId":"AB""#), "{s}");
    }
}
