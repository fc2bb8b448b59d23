//! What the attached browser needs from a device runner's channel (docs/browser.md, "Through
//! the device runner"), as traits: [`crate::devices`] implements them over the runner's
//! session, so this module (a tool) does not depend on the devices stage.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use crate::error::ErrorCode;
use crate::registry::ToolError;

/// How often a client looks whether its channel's runner is still there.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// What comes up a channel.
#[derive(Debug)]
pub enum CdpUp {
    /// The runner connected to its browser.
    Opened {
        /// The browser's product (`Chrome/…`).
        product: String,
        /// The path of its WebSocket.
        ws_path: String,
    },
    /// One DevTools message from the browser (JSON text).
    Message(String),
    /// The channel closed on the device: why.
    Closed(String),
}

/// The sending side of a channel to a device's browser.
pub trait DeviceDown: Send + Sync {
    /// Sends one DevTools command (already checked against the allow-list) to the runner.
    /// Errors: why the channel is unusable (its runner gone, its stream full).
    fn send(&self, data: String) -> BoxFuture<'_, Result<(), String>>;
    /// Closes the channel here and tells the runner (best effort).
    fn close(&self);
    /// Why the channel is unusable now (its runner gone, the channel closed), if it is.
    fn gone(&self) -> Option<String>;
}

/// The device runners of this process, as the attached browser uses them.
pub trait DeviceBrowsers: Send + Sync {
    /// Whether `device_id` is `owner_id`'s own device and not revoked. Errors: the store's
    /// (`store_error`).
    fn is_owned_by<'a>(&'a self, owner_id: &'a str, device_id: &'a str) -> BoxFuture<'a, Result<bool, ToolError>>;
    /// Opens a channel to the browser of `device_id`'s runner. Errors: `browser_gone` (no
    /// runner here, no browser capability, too many channels, the stream full).
    fn open(self: Arc<Self>, device_id: &str) -> Result<CdpLink, ToolError>;
}

/// One open channel: the client's side.
pub struct CdpLink {
    /// The device.
    pub device_id: String,
    /// Sends down.
    pub down: Arc<dyn DeviceDown>,
    /// What comes up, in order.
    pub up: mpsc::Receiver<CdpUp>,
}

impl CdpLink {
    /// Waits up to `within` for the runner to open its browser: the product and the
    /// WebSocket path. Errors: `browser_gone` (it could not, or did not answer).
    pub async fn opened(&mut self, within: Duration) -> Result<(String, String), ToolError> {
        let gone = |m: String| ToolError::new(ErrorCode::BrowserGone, m);
        match tokio::time::timeout(within, self.up.recv()).await {
            Ok(Some(CdpUp::Opened { product, ws_path })) => Ok((product, ws_path)),
            Ok(Some(CdpUp::Closed(reason))) => Err(gone(reason)),
            Ok(Some(CdpUp::Message(_))) => Err(gone("the device's runner sent a message before opening".into())),
            Ok(None) => Err(gone(format!("the runner of device {} went away", self.device_id))),
            Err(_) => Err(gone(format!(
                "the runner of device {} did not reach its browser within {} s",
                self.device_id,
                within.as_secs()
            ))),
        }
    }
}
