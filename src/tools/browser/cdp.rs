//! A small DevTools protocol client for a user's attached browser: one WebSocket to the
//! browser endpoint, commands answered by id, events handed to whoever subscribed to their
//! (session, method), flat sessions (`Target.attachToTarget` with `flatten: true`) for the
//! granted tabs only.
//!
//! `chromiumoxide` is not used here on purpose: its handler attaches to every page target of
//! the browser it connects to and initialises each (page, runtime, network, auto-attach),
//! which would put the server into tabs the user never granted. This client attaches to
//! nothing by itself, and sends only the methods of [`ALLOWED_METHODS`]: nothing that reads
//! cookies or storage (`Network.getCookies`, `Storage.*`, `DOMStorage.*`, `IndexedDB.*`…) and
//! no `Runtime.evaluate`; `Runtime.callFunctionOn` only with this module's fixed functions
//! ([`super::manager`]'s field clearing and option choosing).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_tungstenite::tungstenite::Message;
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::manager::COMMAND_TIMEOUT;
use crate::error::ErrorCode;
use crate::registry::ToolError;

/// Every DevTools method the attached client sends; anything else is refused before it
/// leaves the server (403 `forbidden`), and again by a device runner carrying it.
pub use mira_core::devtools::ALLOWED_METHODS;

/// Longest a WebSocket connection to a browser may take to open.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

type Pending = oneshot::Sender<Result<Value, String>>;

/// Events queued for one subscriber at most; more are dropped (a browser that floods events
/// only stalls its own paused requests, never the server's memory).
pub const MAX_QUEUED_EVENTS: usize = 64;
/// The largest event (a message that is not the answer to a command) passed on; larger ones
/// are dropped unread, so a hostile endpoint cannot make the server build huge JSON trees or
/// fill the event queues (64 × 1 MiB per subscriber at most).
pub use mira_core::devtools::MAX_EVENT_BYTES;
/// The largest WebSocket message (and frame) accepted from a browser: a screenshot's answer
/// fits; a larger one closes the connection (`browser_gone`).
pub use mira_core::devtools::MAX_MESSAGE_BYTES;

struct Subscriber {
    session: Option<String>,
    method: &'static str,
    tx: mpsc::Sender<Value>,
}

/// One DevTools WebSocket connection to a browser.
pub struct CdpClient {
    out: mpsc::UnboundedSender<String>,
    pending: Mutex<HashMap<u64, Pending>>,
    subscribers: Mutex<Vec<Subscriber>>,
    next: AtomicU64,
    closed: CancellationToken,
    reason: Mutex<Option<String>>,
}

fn gone(message: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::BrowserGone, message)
}

impl CdpClient {
    /// Opens the WebSocket `ws://{host}{path}` over a TCP connection to one of `addrs` (the
    /// addresses resolved, under the connection's address rule, from the endpoint itself: a
    /// URL the browser's `/json/version` names elsewhere is never followed).
    /// Errors: `browser_gone` (cannot connect, or the handshake failed).
    pub async fn connect(addrs: &[SocketAddr], host: &str, path: &str) -> Result<Arc<CdpClient>, ToolError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addrs))
            .await
            .map_err(|_| gone(format!("{host} did not accept a connection within {} s", CONNECT_TIMEOUT.as_secs())))?
            .map_err(|e| gone(format!("cannot connect to {host}: {e}")))?;
        let url = format!("ws://{host}{path}");
        let config = async_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let handshake = async_tungstenite::tokio::client_async_with_config(url, stream, Some(config));
        let (ws, _) = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| gone(format!("the DevTools handshake with {host} timed out")))?
            .map_err(|e| gone(format!("the DevTools handshake with {host} failed: {e}")))?;
        let (mut sink, mut source) = ws.split();
        let (out, mut rx) = mpsc::unbounded_channel::<String>();
        let client = CdpClient::new(out);
        let closed = client.closed.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = closed.cancelled() => break,
                    next = rx.recv() => match next {
                        Some(text) => if sink.send(Message::Text(text.into())).await.is_err() { break },
                        None => break,
                    },
                }
            }
            let _ = sink.close(None).await;
        });
        let weak = Arc::downgrade(&client);
        tokio::spawn(async move {
            let reason = loop {
                let Some(message) = source.next().await else { break "the browser closed the connection".to_owned() };
                let Some(client) = weak.upgrade() else { return };
                match message {
                    Ok(Message::Text(text)) => client.dispatch(text.as_str()),
                    Ok(Message::Close(_)) => break "the browser closed the connection".to_owned(),
                    Ok(_) => {}
                    Err(e) => break format!("the connection to the browser failed: {e}"),
                }
            };
            if let Some(client) = weak.upgrade() {
                client.shut(reason);
            }
        });
        Ok(client)
    }

    fn new(out: mpsc::UnboundedSender<String>) -> Arc<CdpClient> {
        Arc::new(CdpClient {
            out,
            pending: Mutex::new(HashMap::new()),
            subscribers: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            closed: CancellationToken::new(),
            reason: Mutex::new(None),
        })
    }

    /// The same client over a device runner's session instead of a WebSocket: the DevTools
    /// messages go down the runner's stream as signed frames of `link`'s channel and come
    /// back through `POST /v1/runner/cdp`, in order (implemented by the devices stage,
    /// [`super::device`]). The channel closing (the browser or the runner gone, a queue
    /// overflowing) closes the client.
    pub fn over_device(link: super::device::CdpLink) -> Arc<CdpClient> {
        use super::device::CdpUp;
        let (out, mut rx) = mpsc::unbounded_channel::<String>();
        let client = CdpClient::new(out);
        let super::device::CdpLink { down, mut up, .. } = link;
        let watch = Arc::clone(&down);
        let closed = client.closed.clone();
        let weak = Arc::downgrade(&client);
        tokio::spawn(async move {
            let failed = loop {
                tokio::select! {
                    () = closed.cancelled() => break None,
                    next = rx.recv() => match next {
                        Some(text) => if let Err(e) = down.send(text).await { break Some(e) },
                        None => break None,
                    },
                }
            };
            down.close();
            if let (Some(reason), Some(client)) = (failed, weak.upgrade()) {
                client.shut(reason);
            }
        });
        let weak = Arc::downgrade(&client);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(super::device::WATCH_EVERY);
            let reason = loop {
                let next = tokio::select! {
                    next = up.recv() => next,
                    _ = tick.tick() => match watch.gone() {
                        Some(why) => break why,
                        None => continue,
                    },
                };
                let Some(up) = next else {
                    break "the device's runner went away".to_owned();
                };
                let Some(client) = weak.upgrade() else { return };
                match up {
                    CdpUp::Message(text) => client.dispatch(&text),
                    CdpUp::Closed(reason) => break reason,
                    CdpUp::Opened { .. } => {}
                }
            };
            if let Some(client) = weak.upgrade() {
                client.shut(reason);
            }
        });
        client
    }

    fn shut(&self, reason: String) {
        self.reason.lock().get_or_insert(reason);
        self.closed.cancel();
        for (_, tx) in self.pending.lock().drain() {
            let _ = tx.send(Err("the connection to the browser closed".into()));
        }
        self.subscribers.lock().clear();
    }

    fn dispatch(&self, text: &str) {
        if text.len() > MAX_EVENT_BYTES {
            // Only the answer to a command we are waiting for may be this large; the browser
            // writes answers as `{"id":N,…`: anything else is dropped unparsed.
            let id = mira_core::devtools::answer_id(text);
            if !id.is_some_and(|id| self.pending.lock().contains_key(&id)) {
                tracing::warn!(bytes = text.len(), "dropped an oversized DevTools message that answers no command");
                return;
            }
        }
        let Ok(msg) = serde_json::from_str::<Value>(text) else { return };
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            if let Some(tx) = self.pending.lock().remove(&id) {
                let answer = match msg.get("error") {
                    Some(e) => Err(e["message"].as_str().unwrap_or("error").to_owned()),
                    None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = tx.send(answer);
            }
            return;
        }
        let Some(method) = msg.get("method").and_then(Value::as_str) else { return };
        let session = msg.get("sessionId").and_then(Value::as_str);
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        self.subscribers.lock().retain(|s| {
            if s.tx.is_closed() {
                return false;
            }
            if s.method == method && s.session.as_deref() == session {
                return !matches!(s.tx.try_send(params.clone()), Err(mpsc::error::TrySendError::Closed(_)));
            }
            true
        });
    }

    /// Cancelled when the connection has closed.
    pub fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// Closes the connection (the browser detaches every session of it).
    pub fn close(&self) {
        self.shut("closed by the server".into());
    }

    /// The events `method` of `session` (None: the browser's own) from now on, as their
    /// parameters (at most [`MAX_QUEUED_EVENTS`] waiting). The stream ends when the
    /// connection closes.
    pub fn subscribe(&self, session: Option<&str>, method: &'static str) -> mpsc::Receiver<Value> {
        let (tx, rx) = mpsc::channel(MAX_QUEUED_EVENTS);
        if !self.closed.is_cancelled() {
            self.subscribers.lock().push(Subscriber { session: session.map(str::to_owned), method, tx });
        }
        rx
    }

    /// Sends `method` with `params` to `session` (None: the browser) within
    /// [`COMMAND_TIMEOUT`]. Errors: 403 `forbidden` (a method outside [`ALLOWED_METHODS`],
    /// or a function that is not one of the fixed ones), 503 `browser_gone` (the connection
    /// closed), 422 `browser_error` (the browser answered an error, or did not answer).
    pub async fn call(&self, session: Option<&str>, method: &'static str, params: Value) -> Result<Value, ToolError> {
        check_method(method, &params)?;
        if self.closed.is_cancelled() {
            return Err(gone(self.close_reason().unwrap_or_else(|| "the connection to the browser closed".into())));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        if self.out.send(msg.to_string()).is_err() {
            self.pending.lock().remove(&id);
            return Err(gone("the connection to the browser closed"));
        }
        match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(message))) if self.closed.is_cancelled() => Err(gone(message)),
            Ok(Ok(Err(message))) => Err(ToolError::new(
                ErrorCode::BrowserError,
                format!("{method} failed: {}", crate::evidence::excerpt(&message, 500)),
            )),
            Ok(Err(_)) => Err(gone("the connection to the browser closed")),
            Err(_) => {
                self.pending.lock().remove(&id);
                Err(ToolError::new(
                    ErrorCode::BrowserError,
                    format!("{method} did not answer within {} s", COMMAND_TIMEOUT.as_secs()),
                ))
            }
        }
    }
}

impl Drop for CdpClient {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// Refuses a method outside [`ALLOWED_METHODS`], and a `Runtime.callFunctionOn` whose
/// function is not one of [`super::manager`]'s fixed ones.
pub fn check_method(method: &str, params: &Value) -> Result<(), ToolError> {
    mira_core::devtools::check_method(method, params).map_err(|m| ToolError::new(ErrorCode::Forbidden, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_storage_and_scripts_are_never_sent() {
        for method in [
            "Network.getCookies",
            "Network.getAllCookies",
            "Storage.getCookies",
            "Storage.getStorageKeyForFrame",
            "DOMStorage.getDOMStorageItems",
            "IndexedDB.requestData",
            "Runtime.evaluate",
            "Network.enable",
        ] {
            let e = check_method(method, &json!({})).expect_err(method);
            assert_eq!(e.code, ErrorCode::Forbidden, "{method}");
        }
        let e = check_method(
            "Runtime.callFunctionOn",
            &json!({"functionDeclaration": "function() { return document.cookie }"}),
        )
        .expect_err("a caller's function");
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert!(
            check_method("Runtime.callFunctionOn", &json!({"functionDeclaration": super::super::manager::CLEAR_FIELD}))
                .is_ok()
        );
        assert!(check_method("Accessibility.getFullAXTree", &json!({})).is_ok());
    }
}
