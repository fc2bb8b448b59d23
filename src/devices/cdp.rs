//! DevTools channels through a device's runner: the transport of an attached browser whose
//! connection's endpoint is `device:<device_id>` (docs/browser.md, "Through the device
//! runner").
//!
//! A channel is one DevTools connection to the browser the runner was started with
//! (`--attach-browser`). Down: signed [`CdpDown`] frames on the runner's job stream (`open`,
//! then each command as `message`, `close`), numbered per channel; the runner applies the
//! method allow-list again and connects to the browser's loopback address itself. Up: the
//! runner posts the browser's messages in order (`POST /v1/runner/cdp?channel=&seq=`, one
//! message a line, the uploads of a channel numbered from 0, one at a time) and the
//! channel's state (`POST /v1/runner/cdp/state`: open with the browser's product, or closed
//! with why). Everything is bounded: [`UP_QUEUE`] messages wait for the client at most (one
//! more closes the channel), a frame waits [`DOWN_WAIT`] at most for room on the runner's
//! stream, a runner holds [`MAX_CHANNELS`] channels at most. A channel lives on the replica
//! that holds the runner's connection, and dies with that connection.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use mira_core::remote::{BROWSER_CAPABILITY, CdpDown, CdpOp, CdpState, CdpUpQuery, ServerMessage};
use tokio::sync::mpsc;

use super::{DeviceHub, HubError, random_hex};
use crate::error::ErrorCode;
use crate::registry::ToolError;
use crate::tools::browser::device::{CdpLink, CdpUp, DeviceBrowsers, DeviceDown};

/// Messages from the browser waiting for the client, per channel; one more closes the
/// channel (the client's own event queues drop, this one never grows).
pub const UP_QUEUE: usize = 1024;
/// Longest a frame waits for room on the runner's stream before the channel closes.
pub const DOWN_WAIT: Duration = Duration::from_secs(5);
/// Channels one device's runner holds at most.
pub const MAX_CHANNELS: usize = 4;

/// A channel of this process, as the hub keeps it.
pub(super) struct Channel {
    device_id: String,
    /// The runner connection it belongs to (SHA-256 of its session).
    session_sha: String,
    /// The next upload's number.
    next_up: u64,
    tx: mpsc::Sender<CdpUp>,
}

/// Sends a channel's frames down to its runner.
struct CdpDownSender {
    hub: Arc<DeviceHub>,
    device_id: String,
    channel: String,
    seq: std::sync::atomic::AtomicU64,
}

impl DeviceDown for CdpDownSender {
    fn send(&self, data: String) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(
            async move { self.hub.cdp_down(&self.device_id, &self.channel, &self.seq, CdpOp::Message, data).await },
        )
    }

    fn close(&self) {
        let hub = Arc::clone(&self.hub);
        let (device, channel) = (self.device_id.clone(), self.channel.clone());
        let seq = self.seq.load(std::sync::atomic::Ordering::Relaxed);
        if hub.cdp_channels.lock().remove(&channel).is_none() {
            return;
        }
        tokio::spawn(async move {
            let at = std::sync::atomic::AtomicU64::new(seq);
            let _ = hub.send_frame(&device, &channel, &at, CdpOp::Close, String::new()).await;
        });
    }

    fn gone(&self) -> Option<String> {
        if self.hub.live(&self.device_id).is_none() {
            return Some(format!(
                "the runner of device {} went away (no heartbeat for its lease, or disconnected)",
                self.device_id
            ));
        }
        (!self.hub.cdp_channels.lock().contains_key(&self.channel))
            .then(|| "the channel to the device's browser closed".to_owned())
    }
}

impl DeviceBrowsers for DeviceHub {
    fn is_owned_by<'a>(&'a self, owner_id: &'a str, device_id: &'a str) -> BoxFuture<'a, Result<bool, ToolError>> {
        Box::pin(async move {
            // A revoked device is nobody's to attach a browser through.
            self.store
                .device_for(owner_id, device_id)
                .await
                .map(|d| d.is_some_and(|d| d.revoked_at.is_none()))
                .map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))
        })
    }

    fn open(self: Arc<Self>, device_id: &str) -> Result<CdpLink, ToolError> {
        self.open_cdp(device_id)
    }
}

fn refused(message: impl Into<String>) -> HubError {
    HubError::Refused(ErrorCode::DeviceAuthFailed, message.into())
}

impl DeviceHub {
    /// Opens a channel to the browser of `device_id`'s runner (connected to this process,
    /// with the `browser` capability). Errors: `browser_gone` (no runner here, no browser
    /// capability, too many channels, the stream full).
    pub fn open_cdp(self: &Arc<Self>, device_id: &str) -> Result<CdpLink, ToolError> {
        let gone = |m: String| ToolError::new(ErrorCode::BrowserGone, m);
        let conn = self
            .live(device_id)
            .ok_or_else(|| gone(format!("the runner of device {device_id} is not connected (to this replica)")))?;
        if !conn.advertised.capabilities.iter().any(|c| c == BROWSER_CAPABILITY) {
            return Err(gone(format!(
                "the runner of device {device_id} attaches no browser (start it with --attach-browser http://127.0.0.1:9222)"
            )));
        }
        let channel = format!("cdp_{}", random_hex(16));
        let (tx, up) = mpsc::channel(UP_QUEUE);
        {
            let mut map = self.cdp_channels.lock();
            if map.values().filter(|c| c.device_id == device_id).count() >= MAX_CHANNELS {
                return Err(gone(format!("device {device_id} has {MAX_CHANNELS} browser channels open already")));
            }
            map.insert(
                channel.clone(),
                Channel { device_id: device_id.to_owned(), session_sha: conn.session_sha.clone(), next_up: 0, tx },
            );
        }
        let frame = CdpDown::seal(&self.key, device_id, &channel, 0, CdpOp::Open, String::new());
        if conn.tx.try_send(ServerMessage::Cdp(frame)).is_err() {
            self.cdp_channels.lock().remove(&channel);
            return Err(gone(format!("the stream of device {device_id}'s runner is full")));
        }
        let down = CdpDownSender {
            hub: Arc::clone(self),
            device_id: device_id.to_owned(),
            channel,
            seq: std::sync::atomic::AtomicU64::new(1),
        };
        Ok(CdpLink { device_id: device_id.to_owned(), down: Arc::new(down), up })
    }

    async fn cdp_down(
        &self,
        device_id: &str,
        channel: &str,
        seq: &std::sync::atomic::AtomicU64,
        op: CdpOp,
        data: String,
    ) -> Result<(), String> {
        if !self.cdp_channels.lock().contains_key(channel) {
            return Err("the channel to the device's browser closed".into());
        }
        self.send_frame(device_id, channel, seq, op, data).await
    }

    async fn send_frame(
        &self,
        device_id: &str,
        channel: &str,
        seq: &std::sync::atomic::AtomicU64,
        op: CdpOp,
        data: String,
    ) -> Result<(), String> {
        let conn = self.live(device_id).ok_or_else(|| format!("the runner of device {device_id} went away"))?;
        let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let frame = CdpDown::seal(&self.key, device_id, channel, n, op, data);
        match tokio::time::timeout(DOWN_WAIT, conn.tx.send(ServerMessage::Cdp(frame))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(format!("the runner of device {device_id} went away")),
            Err(_) => {
                self.cdp_channels.lock().remove(channel);
                Err(format!("the stream of device {device_id}'s runner stayed full for {} s", DOWN_WAIT.as_secs()))
            }
        }
    }

    /// Closes every channel of `device_id` (its runner's connection ended or was replaced):
    /// their clients see the runner gone.
    pub(super) fn drop_cdp_channels(&self, device_id: &str) {
        self.cdp_channels.lock().retain(|_, c| c.device_id != device_id);
    }

    /// `POST /v1/runner/cdp`: the browser's messages of a channel of the runner holding
    /// `session`, one per line, in the channel's order. A channel that is not this
    /// connection's, or an upload out of order, is refused (`device_auth_failed`; the
    /// latter also closes the channel); a client that does not keep up closes it.
    pub fn cdp_upload(&self, session: &str, q: &CdpUpQuery, body: &[u8]) -> Result<(), HubError> {
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        let mut map = self.cdp_channels.lock();
        let Some(ch) = map.get_mut(&q.channel).filter(|c| c.device_id == device && c.session_sha == conn.session_sha)
        else {
            return Err(refused("no such browser channel on this connection"));
        };
        if ch.next_up != q.seq {
            map.remove(&q.channel);
            return Err(refused("a browser upload out of order; the channel is closed"));
        }
        ch.next_up += 1;
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(text) = std::str::from_utf8(line) else {
                map.remove(&q.channel);
                return Err(HubError::Refused(ErrorCode::InvalidRequest, "a browser message is not UTF-8".into()));
            };
            if ch.tx.try_send(CdpUp::Message(text.to_owned())).is_err() {
                tracing::warn!(device = %device, channel = %q.channel, "a browser channel's queue overflowed; closed");
                if let Some(ch) = map.remove(&q.channel) {
                    let _ = ch.tx.try_send(CdpUp::Closed("the browser sent more than the server took".into()));
                }
                return Ok(());
            }
        }
        Ok(())
    }

    /// `POST /v1/runner/cdp/state`: a channel of the runner holding `session` opened, or
    /// closed on the device.
    pub fn cdp_state(&self, session: &str, state: CdpState) -> Result<(), HubError> {
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        let channel = match &state {
            CdpState::Open { channel, .. } | CdpState::Closed { channel, .. } => channel.clone(),
        };
        let mut map = self.cdp_channels.lock();
        let ok = map.get(&channel).is_some_and(|c| c.device_id == device && c.session_sha == conn.session_sha);
        if !ok {
            return Err(refused("no such browser channel on this connection"));
        }
        match state {
            CdpState::Open { product, ws_path, .. } => {
                if let Some(c) = map.get(&channel) {
                    let _ = c.tx.try_send(CdpUp::Opened { product, ws_path });
                }
            }
            CdpState::Closed { reason, .. } => {
                if let Some(c) = map.remove(&channel) {
                    let _ = c.tx.try_send(CdpUp::Closed(reason));
                }
            }
        }
        Ok(())
    }
}
