//! The Attached Browser: a user's own running Chromium, connected at its remote-debugging
//! endpoint as a connection of kind `browser` (docs/browser.md, "Attached browser").
//!
//! Settings `{endpoint, tabs, origins}`: the endpoint `http://host:port` (for a non-admin a
//! public address, unless the deployment allows internal URLs: the debugging port of a
//! loopback Chromium — the server's own managed one among them — would hand over every tab of
//! it), the tabs the user grants (target ids, or URL prefixes a tab's address starts with),
//! and the origins the granted tabs may load. The credential is `{}`.
//!
//! The server holds one DevTools WebSocket per connection ([`super::cdp::CdpClient`]: it
//! attaches only to the granted tabs and sends only a fixed list of methods — no cookie,
//! storage or script access). Each granted tab is driven by the managed browser's own code
//! ([`super::manager`], through [`TabPage::Attached`]): snapshot-bound references
//! (`stale_snapshot`), approvals, screenshots, and the origin policy by `Fetch` interception,
//! with the connection's origins as the allow-list.
//!
//! Availability: the check is a live round trip (`/json/version`, the WebSocket,
//! `Target.getTargets`); the tools are available while a granted tab is open. The browser's
//! events turn them `unavailable` with `browser_gone` at once: the WebSocket closing (the
//! browser gone) or the last granted tab destroyed. A maintenance task reconnects every few
//! seconds (backing off to a minute) while a browser is gone, and checks the connection again
//! once it answers.
//!
//! The tools are the managed browser's, wrapped ([`AttachedTool`]): ids `attached_browser_*`,
//! an optional `connection` argument, the connection id and fingerprint frozen into the
//! canonical input (the approval binds the browser connection as it was then:
//! `connection_changed` otherwise). A tab the connection does not grant is 403
//! `tab_not_granted`; an attached browser's tools open and close no tabs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::cdp::CdpClient;
use super::manager::{AttachedPage, BrowserManager, TabPage, UserContext};
use super::policy::{OriginPolicy, normalise_origin};
use crate::availability::{Availability, AvailabilityContext};
use crate::connections::{
    Access, CheckReport, Connection, ConnectionHub, ConnectionKind, Driver, FINGERPRINT_KEY, Opened,
};
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::{
    ExecContext, PrepareContext, Prepared, Registry, RegistryError, Tool, ToolError, ToolKind, ToolOutput, ToolSpec,
};

/// The permission of acting in the granted tabs.
pub const ATTACH: &str = "browser.attached";
/// The endpoint prefix of a browser reached through a device's runner: `device:<device_id>`.
pub const DEVICE_PREFIX: &str = "device:";
/// Longest the runner may take to reach its browser when a channel opens.
pub const DEVICE_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Most tabs one connection grants.
pub const MAX_TABS: usize = 8;
/// Most origins one connection allows.
pub const MAX_ORIGINS: usize = 16;
/// Most page tabs the inventory lists.
pub const MAX_INVENTORY: usize = 100;
/// The most bytes of a tab's URL and title kept in the inventory shown to the owner.
pub const MAX_INVENTORY_TEXT: usize = 2048;
/// Largest `/json/version` answer read, in bytes.
const MAX_VERSION_BYTES: usize = 64 * 1024;
/// How often the maintenance task looks at the attached browsers.
pub const MAINTENANCE_EVERY: Duration = Duration::from_secs(2);
/// Longest wait between two reconnection attempts to a gone browser.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

const PERMISSIONS: &[(&str, &str)] = &[(
    ATTACH,
    "read and act in the tabs of your own Chromium that this connection grants, on the origins it allows \
     (attached_browser_*)",
)];

tokio::task_local! {
    /// The attached browser a call of an inner tool acts in (set by [`AttachedTool`]).
    static BOUND: Arc<UserContext>;
}

/// The context of the attached browser the running call is bound to. Errors: `internal`
/// (an inner tool called outside [`AttachedTool`]).
pub fn bound() -> Result<Arc<UserContext>, ToolError> {
    BOUND
        .try_with(Arc::clone)
        .map_err(|_| ToolError::new(ErrorCode::Internal, "an attached-browser tool ran without its connection"))
}

// ---------------------------------------------------------------- settings

/// The settings of a `browser` connection (not secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachedSettings {
    /// The remote-debugging endpoint, canonical `http://host:port`; or `device:<device_id>`,
    /// the browser the device's runner was started with (`--attach-browser`), reached
    /// through the runner.
    pub endpoint: String,
    /// The granted tabs: a target id (as the connection's `inventory` lists it), or an
    /// http(s) URL prefix (canonical) a tab's address starts with when it is attached.
    #[serde(default)]
    pub tabs: Vec<String>,
    /// The origins the granted tabs may load (canonical `scheme://host[:port]`).
    pub origins: Vec<String>,
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::InvalidField, message)
}

/// True for a DevTools target id (hexadecimal, 8–64 digits).
fn is_target_id(s: &str) -> bool {
    (8..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl AttachedSettings {
    /// Parses and canonicalises settings (400 `invalid_request`, `invalid_field`).
    pub fn parse(settings: Value) -> Result<Self, ToolError> {
        let mut s: AttachedSettings = serde_json::from_value(settings).map_err(|e| {
            ToolError::new(
                ErrorCode::InvalidRequest,
                format!("browser settings must be {{endpoint, tabs, origins}}: {e}"),
            )
        })?;
        if let Some(device) = s.endpoint.trim().strip_prefix(DEVICE_PREFIX) {
            if !crate::ids::is_well_formed(device, "dev") {
                return Err(invalid("endpoint device:<device_id> names no device id (dev_…)"));
            }
            s.endpoint = format!("{DEVICE_PREFIX}{device}");
        } else {
            s.endpoint = Self::canonical_url(&s.endpoint)?;
        }
        Self::canonical_rest(s)
    }

    /// The device whose runner carries this browser (`device:<device_id>` endpoints).
    pub fn device(&self) -> Option<&str> {
        self.endpoint.strip_prefix(DEVICE_PREFIX)
    }

    fn canonical_url(endpoint: &str) -> Result<String, ToolError> {
        let url = url::Url::parse(endpoint.trim()).map_err(|e| invalid(format!("endpoint is not a URL: {e}")))?;
        if url.scheme() != "http"
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
            || !matches!(url.path(), "" | "/")
        {
            return Err(invalid(
                "endpoint must be the browser's remote-debugging address http://host:port (no path, user or query)",
            ));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| invalid("endpoint has no host"))?;
        let port = url.port_or_known_default().unwrap_or(80);
        Ok(format!("http://{host}:{port}"))
    }

    fn canonical_rest(mut s: AttachedSettings) -> Result<Self, ToolError> {
        if s.origins.is_empty() || s.origins.len() > MAX_ORIGINS {
            return Err(invalid(format!(
                "origins must list 1–{MAX_ORIGINS} http(s) origins the granted tabs may load"
            )));
        }
        let mut origins = Vec::new();
        for o in &s.origins {
            let n = normalise_origin(o).ok_or_else(|| invalid(format!("{o:?} is not an http(s) origin")))?;
            if !origins.contains(&n) {
                origins.push(n);
            }
        }
        s.origins = origins;
        if s.tabs.len() > MAX_TABS {
            return Err(invalid(format!("tabs may grant at most {MAX_TABS} tabs")));
        }
        let mut tabs = Vec::new();
        for t in &s.tabs {
            let t = t.trim();
            let canonical = if is_target_id(t) {
                t.to_ascii_uppercase()
            } else {
                let u = url::Url::parse(t)
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| invalid(format!("tab {t:?} is neither a target id nor an http(s) URL prefix")))?;
                if !s.origins.contains(&super::policy::origin_of(&u)) {
                    return Err(invalid(format!("tab {t:?} is on an origin that origins does not list")));
                }
                u.to_string()
            };
            if !tabs.contains(&canonical) {
                tabs.push(canonical);
            }
        }
        s.tabs = tabs;
        Ok(s)
    }

    /// The settings of an opened connection (`browser_error` when they no longer parse).
    pub fn of(conn: &Opened) -> Result<Self, ToolError> {
        Self::parse(conn.settings.clone()).map_err(|e| {
            ToolError::new(
                ErrorCode::BrowserError,
                format!("the stored settings of connection {} are invalid: {}", conn.id, e.message),
            )
        })
    }

    /// Whether the page target `id` at `url` is granted: its id is listed, or a listed URL
    /// prefix starts its address.
    pub fn grants(&self, id: &str, url: &str) -> bool {
        self.tabs.iter().any(|t| t.eq_ignore_ascii_case(id) || (t.contains("://") && url.starts_with(t.as_str())))
    }
}

// ---------------------------------------------------------------- sessions

/// A live connection to one attached browser: the DevTools WebSocket, the granted tabs'
/// context, and what is known of the browser.
pub struct Session {
    conn_id: String,
    fingerprint: String,
    settings: AttachedSettings,
    client: Arc<CdpClient>,
    ctx: Arc<UserContext>,
    /// The browser's product (`Chrome/…`).
    pub product: String,
    /// Target ids of the granted tabs attached now (updated at once by the browser's events).
    live: Mutex<HashSet<String>>,
    /// Serialises tab synchronisation.
    syncing: tokio::sync::Mutex<()>,
}

/// One page target of the browser as the inventory shows it.
#[derive(Debug, Clone, Serialize)]
struct Target {
    target_id: String,
    url: String,
    title: String,
    granted: bool,
    attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

impl Session {
    /// Whether the WebSocket is still open.
    pub fn alive(&self) -> bool {
        !self.client.closed().is_cancelled()
    }

    /// Granted tabs attached now.
    pub fn live_tabs(&self) -> usize {
        self.live.lock().len()
    }

    /// Lists the page targets; attaches granted ones not attached yet (those on an origin the
    /// connection allows, or blank); forgets attached ones that are gone or left the allowed
    /// origins. Returns the inventory. Errors: `browser_gone`, `browser_error`.
    async fn sync(&self) -> Result<Vec<Target>, ToolError> {
        let _one = self.syncing.lock().await;
        let answer = self.client.call(None, "Target.getTargets", json!({})).await?;
        let infos = answer["targetInfos"].as_array().cloned().unwrap_or_default();
        let policy = self.ctx.policy();
        let mut tabs = self.ctx.tabs.lock().await;
        let mut inventory = Vec::new();
        let mut seen = HashSet::new();
        for info in infos.iter().filter(|i| i["type"] == "page") {
            let id = info["targetId"].as_str().unwrap_or_default().to_owned();
            let url = info["url"].as_str().unwrap_or_default().to_owned();
            // A tab granted when it was attached stays granted for the session's lifetime (an
            // approved navigation within the origins does not end the grant of a URL prefix).
            let granted = self.settings.grants(&id, &url) || tabs.list.iter().any(|t| t.id == id);
            let mut refused = None;
            if granted {
                if !tabs.list.iter().any(|t| t.id == id) && tabs.list.len() >= MAX_TABS {
                    refused = Some(format!("{MAX_TABS} granted tabs are attached already"));
                } else if let Err(r) = policy.check(&url).await {
                    refused = Some(format!("the tab shows {}: {}", r.url, r.message));
                } else if tabs.list.iter().any(|t| t.id == id) {
                    seen.insert(id.clone());
                } else {
                    match self.attach(&mut tabs, &id).await {
                        Ok(()) => {
                            seen.insert(id.clone());
                        }
                        Err(e) if e.code == ErrorCode::BrowserGone => return Err(e),
                        // A tab that closed meanwhile, or refused the session: not attached.
                        Err(e) => refused = Some(e.message),
                    }
                }
            }
            if inventory.len() >= MAX_INVENTORY {
                continue;
            }
            inventory.push(Target {
                attached: seen.contains(&id),
                target_id: id,
                url: crate::evidence::excerpt(&url, MAX_INVENTORY_TEXT),
                title: crate::evidence::excerpt(info["title"].as_str().unwrap_or_default(), MAX_INVENTORY_TEXT),
                granted,
                refused,
            });
        }
        let gone: Vec<String> = tabs.list.iter().map(|t| t.id.clone()).filter(|id| !seen.contains(id)).collect();
        for id in gone {
            if let Some(tab) = tabs.list.iter().find(|t| t.id == id) {
                tab.page.close().await;
            }
            self.ctx.drop_tab(&mut tabs, &id);
        }
        *self.live.lock() = seen;
        Ok(inventory)
    }

    /// Attaches to page target `id` (a flat session) and adopts it as a granted tab.
    async fn attach(&self, tabs: &mut super::manager::Tabs, id: &str) -> Result<(), ToolError> {
        let attached =
            self.client.call(None, "Target.attachToTarget", json!({"targetId": id, "flatten": true})).await?;
        let session = attached["sessionId"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ToolError::new(ErrorCode::BrowserError, "Target.attachToTarget returned no session"))?
            .to_owned();
        let page = TabPage::Attached(AttachedPage { client: self.client.clone(), session, target_id: id.to_owned() });
        self.ctx.adopt_tab(tabs, id.to_owned(), page.clone()).await.inspect_err(|_| {
            let detach = page.clone();
            tokio::spawn(async move { detach.close().await });
        })
    }

    async fn close(&self) {
        self.ctx.close().await;
        self.client.close();
    }
}

/// The attached browsers of this server: one [`Session`] per `browser` connection in use.
#[derive(Default)]
pub struct AttachedBrowsers {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// One lock per connection: a browser slow to answer delays only its own connection.
    connecting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    hub: OnceLock<Weak<ConnectionHub>>,
    managed: OnceLock<Weak<BrowserManager>>,
    devices: OnceLock<Weak<dyn super::device::DeviceBrowsers>>,
    backoff: Mutex<HashMap<String, (Instant, Duration)>>,
}

impl AttachedBrowsers {
    /// No sessions yet; [`register`] wires the hub and the managed browser in.
    pub fn new() -> Arc<AttachedBrowsers> {
        Arc::new(AttachedBrowsers::default())
    }

    /// Wires in the device hub, for browsers reached through a device's runner.
    pub fn set_devices(&self, devices: &Arc<dyn super::device::DeviceBrowsers>) {
        let _ = self.devices.set(Arc::downgrade(devices));
    }

    fn hub(&self) -> Option<Arc<ConnectionHub>> {
        self.hub.get().and_then(Weak::upgrade)
    }

    fn note(&self, conn_id: &str, access: Access) {
        if let Some(hub) = self.hub() {
            hub.note_access(conn_id, ATTACH, access);
        }
    }

    /// The live session of `conn` (same fingerprint), or a new one: `/json/version` at the
    /// endpoint's resolved address (under the connection's address rule), the WebSocket to
    /// that same address, target discovery, the granted tabs attached.
    /// Errors: 403 `internal_address`, `forbidden` (the server's own managed browser), 503
    /// `browser_gone`, 422 `browser_error`.
    pub async fn session(self: &Arc<Self>, conn: &Opened) -> Result<Arc<Session>, ToolError> {
        if let Some(s) = self.live(conn) {
            return Ok(s);
        }
        let lock = self.connecting.lock().entry(conn.id.clone()).or_default().clone();
        let _one = lock.lock().await;
        if let Some(s) = self.live(conn) {
            return Ok(s);
        }
        let old = self.sessions.lock().remove(&conn.id);
        if let Some(old) = old {
            old.close().await;
        }
        let settings = AttachedSettings::of(conn)?;
        let session = Arc::new(self.connect(conn, settings).await?);
        self.sessions.lock().insert(conn.id.clone(), session.clone());
        self.watch(&session);
        if let Err(e) = session.sync().await {
            self.forget(&session).await;
            return Err(e);
        }
        Ok(session)
    }

    fn live(&self, conn: &Opened) -> Option<Arc<Session>> {
        self.sessions.lock().get(&conn.id).filter(|s| s.fingerprint == conn.fingerprint && s.alive()).cloned()
    }

    async fn forget(&self, session: &Arc<Session>) {
        let removed = {
            let mut map = self.sessions.lock();
            match map.get(&session.conn_id) {
                Some(s) if Arc::ptr_eq(s, session) => map.remove(&session.conn_id),
                _ => None,
            }
        };
        if let Some(s) = removed {
            s.close().await;
        }
    }

    async fn connect(&self, conn: &Opened, settings: AttachedSettings) -> Result<Session, ToolError> {
        if let Some(device) = settings.device().map(str::to_owned) {
            return self.connect_device(conn, settings, &device).await;
        }
        let url = url::Url::parse(&settings.endpoint).map_err(|e| invalid(format!("endpoint: {e}")))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let port = url.port_or_known_default().unwrap_or(80);
        let addrs = crate::net::resolve_host(&host, port, conn.address_rule)
            .await
            .map_err(|e| ToolError::new(ErrorCode::InternalAddress, e.0))?;
        let authority = format!("{host}:{port}");
        // /json/version from the checked addresses only (never a redirect, never the name again).
        let client = crate::net::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(super::cdp::CONNECT_TIMEOUT)
            .no_proxy()
            .resolve_to_addrs(&host, &addrs)
            .build()
            .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?;
        let gone = |m: String| ToolError::new(ErrorCode::BrowserGone, m);
        let resp = client
            .get(format!("{}/json/version", settings.endpoint))
            .send()
            .await
            .map_err(|e| gone(format!("no browser answers at {}: {e}", settings.endpoint)))?;
        if !resp.status().is_success() {
            return Err(gone(format!("{} answered {} to /json/version", settings.endpoint, resp.status())));
        }
        let mut resp = resp;
        let mut body = Vec::new();
        while let Some(chunk) =
            resp.chunk().await.map_err(|e| gone(format!("reading {}/json/version: {e}", settings.endpoint)))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_VERSION_BYTES {
                return Err(gone(format!("{}/json/version answered more than 64 KiB", settings.endpoint)));
            }
        }
        let version: Value = serde_json::from_slice(&body).map_err(|_| {
            gone(format!("{} is not a DevTools endpoint (/json/version is not JSON)", settings.endpoint))
        })?;
        let ws = version["webSocketDebuggerUrl"].as_str().unwrap_or_default();
        let path = url::Url::parse(ws)
            .ok()
            .map(|u| u.path().to_owned())
            .filter(|p| p.starts_with("/devtools/browser/"))
            .ok_or_else(|| gone(format!("{} names no browser WebSocket", settings.endpoint)))?;
        if let Some(managed) = self.managed.get().and_then(Weak::upgrade)
            && managed.websocket_path().await.as_deref() == Some(path.as_str())
        {
            return Err(ToolError::new(
                ErrorCode::Forbidden,
                "this endpoint is the server's own managed browser: it cannot be attached",
            ));
        }
        let cdp = CdpClient::connect(&addrs, &authority, &path).await?;
        Ok(Self::new_session(conn, settings, cdp, version["Browser"].as_str().unwrap_or_default().to_owned()))
    }

    fn new_session(conn: &Opened, settings: AttachedSettings, client: Arc<CdpClient>, product: String) -> Session {
        // The user's own browser on their own network: this server's service ports are not its.
        let policy =
            OriginPolicy { allow: settings.origins.clone(), rule: AddressRule::Any, service_ports: Vec::new() };
        Session {
            conn_id: conn.id.clone(),
            fingerprint: conn.fingerprint.clone(),
            product,
            settings,
            client,
            ctx: Arc::new(UserContext::attached(policy)),
            live: Mutex::new(HashSet::new()),
            syncing: tokio::sync::Mutex::new(()),
        }
    }

    /// A session over the runner of the connection owner's device `device`: the runner
    /// reaches the browser at its own loopback address (`--attach-browser`, checked on the
    /// device; the address never reaches the server). Errors: 403 `forbidden` (not the
    /// owner's device, or the server's own managed browser), 503 `browser_gone` (the runner
    /// not connected here, without the browser capability, or its browser not answering).
    async fn connect_device(
        &self,
        conn: &Opened,
        settings: AttachedSettings,
        device: &str,
    ) -> Result<Session, ToolError> {
        let devices = self
            .devices
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| ToolError::new(ErrorCode::BrowserGone, "this server has no device runners"))?;
        let owned = match conn.owner_id.as_deref() {
            Some(owner) => devices.is_owned_by(owner, device).await?,
            None => false,
        };
        if !owned {
            return Err(ToolError::new(
                ErrorCode::Forbidden,
                format!("device {device} is not the connection owner's device: only its owner attaches its browser"),
            ));
        }
        let mut link = devices.open(device)?;
        let (product, ws_path) = link.opened(DEVICE_OPEN_TIMEOUT).await?;
        if let Some(managed) = self.managed.get().and_then(Weak::upgrade)
            && managed.websocket_path().await.as_deref() == Some(ws_path.as_str())
        {
            link.down.close();
            return Err(ToolError::new(
                ErrorCode::Forbidden,
                "this device's browser is the server's own managed browser: it cannot be attached",
            ));
        }
        let cdp = CdpClient::over_device(link);
        Ok(Self::new_session(conn, settings, cdp, product))
    }

    /// Watches the browser's events for `session`: the WebSocket closing, and granted tabs
    /// destroyed, crashed or detached, each turning the ladder `browser_gone` at once when no
    /// granted tab remains.
    fn watch(self: &Arc<Self>, session: &Arc<Session>) {
        let client = session.client.clone();
        let mut destroyed = client.subscribe(None, "Target.targetDestroyed");
        let mut crashed = client.subscribe(None, "Target.targetCrashed");
        let mut detached = client.subscribe(None, "Target.detachedFromTarget");
        let closed = client.closed();
        let this = Arc::downgrade(self);
        let weak = Arc::downgrade(session);
        tokio::spawn(async move {
            let discover = client.call(None, "Target.setDiscoverTargets", json!({"discover": true})).await;
            if let Err(e) = discover {
                tracing::debug!(error = %e.message, "Target.setDiscoverTargets");
            }
            drop(client);
            loop {
                let target = tokio::select! {
                    () = closed.cancelled() => None,
                    Some(e) = destroyed.recv() => Some(e["targetId"].as_str().unwrap_or_default().to_owned()),
                    Some(e) = crashed.recv() => Some(e["targetId"].as_str().unwrap_or_default().to_owned()),
                    Some(e) = detached.recv() => Some(e["targetId"].as_str().unwrap_or_default().to_owned()),
                    else => None,
                };
                let (Some(this), Some(session)) = (this.upgrade(), weak.upgrade()) else { return };
                match target {
                    None => {
                        if session.client.close_reason().as_deref() != Some("closed by the server") {
                            let why = session.client.close_reason().unwrap_or_else(|| "the connection closed".into());
                            this.note(&session.conn_id, Access::BrowserGone { message: why });
                        }
                        this.forget(&session).await;
                        return;
                    }
                    Some(id) => {
                        let empty = {
                            let mut live = session.live.lock();
                            live.remove(&id) && live.is_empty()
                        };
                        if empty {
                            this.note(
                                &session.conn_id,
                                Access::BrowserGone { message: "every tab the connection grants was closed".into() },
                            );
                        }
                    }
                }
            }
        });
    }

    /// The check of `conn`: a live round trip, the report's `inventory` listing the
    /// browser's page tabs.
    pub async fn check(self: &Arc<Self>, conn: &Opened) -> CheckReport {
        let mut report = CheckReport::default();
        let access = match self.session(conn).await {
            Err(e) => access_of(&e),
            Ok(session) => match session.sync().await {
                Err(e) => access_of(&e),
                Ok(inventory) => {
                    let live = inventory.iter().filter(|t| t.attached).count();
                    report.account = Some(format!(
                        "{} at {} ({live} granted tab(s) open)",
                        session.product, session.settings.endpoint
                    ));
                    report.inventory = serde_json::to_value(&inventory).ok();
                    if session.settings.tabs.is_empty() {
                        Access::Unknown {
                            message: "no tab is granted yet: choose tabs from the inventory, then PATCH settings.tabs"
                                .into(),
                        }
                    } else if live == 0 {
                        Access::BrowserGone { message: "no tab the connection grants is open".into() }
                    } else {
                        Access::Granted
                    }
                }
            },
        };
        report.access.insert(ATTACH.to_owned(), access);
        report
    }

    /// Every [`MAINTENANCE_EVERY`] until `shutdown`: closes the sessions of connections that
    /// were deleted, disabled or changed, and reconnects to gone browsers (backing off up to
    /// [`MAX_BACKOFF`]), checking a connection again once its browser answers.
    pub fn spawn_maintenance(self: &Arc<Self>, shutdown: CancellationToken) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => this.maintain().await,
                }
            }
            let all: Vec<Arc<Session>> = this.sessions.lock().drain().map(|(_, s)| s).collect();
            for s in all {
                s.close().await;
            }
        });
    }

    async fn maintain(self: &Arc<Self>) {
        let Some(hub) = self.hub() else { return };
        let conns = hub.of_kind(ConnectionKind::Browser);
        let stale: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .values()
            .filter(|s| !conns.iter().any(|c| c.id == s.conn_id && c.enabled && c.fingerprint() == s.fingerprint))
            .cloned()
            .collect();
        for s in stale {
            self.forget(&s).await;
        }
        let known: HashSet<&str> = conns.iter().map(|c| c.id.as_str()).collect();
        self.connecting.lock().retain(|id, _| known.contains(id.as_str()));
        self.backoff.lock().retain(|id, _| known.contains(id.as_str()));
        for conn in conns.into_iter().filter(|c| c.enabled && c.usable(ATTACH).is_err()) {
            if !self.due(&conn.id) {
                continue;
            }
            let this = Arc::clone(self);
            let hub = hub.clone();
            tokio::spawn(async move { this.revive(&hub, &conn).await });
        }
    }

    /// Whether a reconnection attempt of `id` is due; when it is, no other starts until this
    /// one ends ([`AttachedBrowsers::revive`] books the next).
    fn due(&self, id: &str) -> bool {
        let mut b = self.backoff.lock();
        let now = Instant::now();
        match b.get(id).copied() {
            Some((next, _)) if next > now => false,
            other => {
                let wait = other.map_or(Duration::ZERO, |(_, w)| w);
                b.insert(id.to_owned(), (now + MAX_BACKOFF * 2, wait));
                true
            }
        }
    }

    /// Tries the browser of `conn` once: when it answers with a granted tab open, the
    /// connection is checked again (the ladder turns available); otherwise waits longer
    /// before the next try.
    async fn revive(self: &Arc<Self>, hub: &ConnectionHub, conn: &Connection) {
        let Ok(opened) = hub.opened(conn) else { return };
        // A browser that answers is looked at again every round (one DevTools round trip on
        // the open WebSocket: has a granted tab appeared?); one that does not, ever more rarely.
        let answered = match self.session(&opened).await {
            Ok(session) => match session.sync().await {
                Ok(_) => Some(session.live_tabs() > 0 && !session.settings.tabs.is_empty()),
                Err(_) => None,
            },
            Err(_) => None,
        };
        if let Some(usable) = answered {
            self.backoff.lock().remove(&conn.id);
            if usable {
                hub.check(conn).await;
            }
        } else {
            let mut b = self.backoff.lock();
            let wait =
                b.get(&conn.id).map_or(MAINTENANCE_EVERY, |(_, w)| (*w * 2).clamp(MAINTENANCE_EVERY, MAX_BACKOFF));
            b.insert(conn.id.clone(), (Instant::now() + wait, wait));
        }
    }
}

fn access_of(e: &ToolError) -> Access {
    match e.code {
        ErrorCode::BrowserGone => Access::BrowserGone { message: e.message.clone() },
        ErrorCode::InternalAddress => Access::Unreachable { message: e.message.clone() },
        _ => Access::Unknown { message: e.message.clone() },
    }
}

// ---------------------------------------------------------------- driver

/// The `browser` connection kind.
pub struct AttachedDriver {
    browsers: Arc<AttachedBrowsers>,
}

/// The driver of `browser` connections over `browsers`.
pub fn driver(browsers: &Arc<AttachedBrowsers>) -> Arc<dyn Driver> {
    Arc::new(AttachedDriver { browsers: browsers.clone() })
}

#[async_trait]
impl Driver for AttachedDriver {
    fn kind(&self) -> ConnectionKind {
        ConnectionKind::Browser
    }

    fn permissions(&self) -> &'static [(&'static str, &'static str)] {
        PERMISSIONS
    }

    fn validate_settings(&self, settings: Value) -> Result<Value, ToolError> {
        let s = AttachedSettings::parse(settings)?;
        serde_json::to_value(&s).map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
    }

    fn validate_credential(&self, credential: &Value) -> Result<(), ToolError> {
        match credential.as_object() {
            Some(o) if o.is_empty() => Ok(()),
            _ => Err(invalid("a browser connection has no credential: give {}")),
        }
    }

    fn endpoints(&self, settings: &Value) -> Vec<String> {
        // A device's browser is reached through its runner: no address of the server's.
        AttachedSettings::parse(settings.clone())
            .ok()
            .filter(|s| s.device().is_none())
            .map(|s| vec![s.endpoint])
            .unwrap_or_default()
    }

    async fn check(&self, conn: &Opened) -> CheckReport {
        self.browsers.check(conn).await
    }
}

// ---------------------------------------------------------------- tools

/// Registers the `attached_browser_*` tools (the managed browser's tools over the bound
/// attached browser), declares their need, and starts the sessions' maintenance.
pub fn register(
    registry: &Registry,
    hub: &Arc<ConnectionHub>,
    browsers: &Arc<AttachedBrowsers>,
    managed: &Arc<BrowserManager>,
    data_dir: &std::path::Path,
    shutdown: CancellationToken,
) -> Result<(), RegistryError> {
    let _ = browsers.hub.set(Arc::downgrade(hub));
    let _ = browsers.managed.set(Arc::downgrade(managed));
    let b = super::Browser { source: super::Source::Attached, shots: data_dir.join("browser").join("screenshots") };
    for inner in super::tools(&b) {
        let tool = AttachedTool::new(inner, hub.clone(), browsers.clone());
        hub.declare_need(&tool.spec.id, ConnectionKind::Browser, ATTACH);
        registry.register(Arc::new(tool))?;
    }
    browsers.spawn_maintenance(shutdown);
    Ok(())
}

/// Keys of the canonical input the wrapper adds.
const CONNECTION_KEYS: [&str; 3] = ["connection_id", FINGERPRINT_KEY, "requested_connection"];

/// A managed-browser tool acting in the caller's attached browser: same input plus an
/// optional `connection`, the connection resolved and frozen, the inner tool run bound to
/// the connection's session.
pub struct AttachedTool {
    spec: ToolSpec,
    inner: Arc<dyn Tool>,
    hub: Arc<ConnectionHub>,
    browsers: Arc<AttachedBrowsers>,
}

impl AttachedTool {
    fn new(inner: Arc<dyn Tool>, hub: Arc<ConnectionHub>, browsers: Arc<AttachedBrowsers>) -> Self {
        let i = inner.spec();
        let mut schema = i.input_schema.clone();
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert(
                "connection".into(),
                json!({"type": "string", "minLength": 1, "maxLength": 100,
                       "description": "Browser connection id (default: your first usable browser connection)"}),
            );
        }
        let description = format!(
            "In the user's own Chromium, attached as a browser connection: only in the tabs they granted (tab = \
             the tab's target id) and on the origins they allowed; no tabs are opened or closed. {}",
            i.description
                .replace("browser_", "attached_browser_")
                .replace("managed browser", "attached browser")
                .replace(" (or a new tab)", "")
        );
        let spec = ToolSpec {
            id: format!("attached_{}", i.id),
            kind: ToolKind::Dynamic,
            domain: "attached_browser".into(),
            title: format!("{} (your attached browser)", i.title),
            description,
            input_schema: schema,
            requires_approval: i.requires_approval,
            capability: None,
            replacement: None,
            owner: None,
        };
        AttachedTool { spec, inner, hub, browsers }
    }

    /// The input without `connection`, and the connection named.
    fn split(&self, input: &Value) -> Result<(Value, Option<String>), ToolError> {
        let mut rest = input.clone();
        let requested = match rest.as_object_mut().and_then(|o| o.remove("connection")) {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => return Err(invalid("connection must be a connection id")),
        };
        if rest.get("new_tab").and_then(Value::as_bool) == Some(true) {
            return Err(invalid("an attached browser's tools open no tabs: act in a granted tab"));
        }
        if self.spec.id == "attached_browser_tabs" && rest.get("action").and_then(Value::as_str) == Some("close") {
            return Err(invalid("an attached browser's tabs are its user's: close them in the browser"));
        }
        Ok((rest, requested))
    }

    /// The session of connection `id` frozen with `fingerprint`, its tabs synchronised. The
    /// connection is read again from the store ([`ConnectionHub::open_frozen_current`]), so one
    /// deleted, disabled or changed through another replica is refused at once.
    async fn bind(&self, user: &str, id: &str, fingerprint: Option<&str>) -> Result<Arc<Session>, ToolError> {
        let opened = self.hub.open_frozen_current(user, id, fingerprint, ConnectionKind::Browser, ATTACH).await?;
        let session = self.browsers.session(&opened).await.inspect_err(|e| self.note(id, e))?;
        session.sync().await.inspect_err(|e| self.note(id, e))?;
        Ok(session)
    }

    fn note(&self, id: &str, e: &ToolError) {
        if e.code == ErrorCode::BrowserGone {
            self.hub.note_access(id, ATTACH, Access::BrowserGone { message: e.message.clone() });
        }
    }
}

fn strip(input: &Value) -> Value {
    let mut out = input.clone();
    if let Some(o) = out.as_object_mut() {
        for k in CONNECTION_KEYS {
            o.remove(k);
        }
    }
    out
}

#[async_trait]
impl Tool for AttachedTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.hub.availability(&ctx.user_id, ConnectionKind::Browser, ATTACH)
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let (rest, requested) = self.split(&input)?;
        let resolved = self.hub.resolve(ctx.owner_id, ConnectionKind::Browser, ATTACH, requested.as_deref())?;
        let session = self.bind(ctx.owner_id, &resolved.id, Some(&resolved.fingerprint)).await?;
        if let Some(tab) = rest.get("tab").and_then(Value::as_str) {
            // A tab the connection does not grant is refused at freeze time (403).
            session.ctx.tabs.lock().await.get(Some(tab)).map(|_| ())?;
        }
        let mut prepared = BOUND.scope(session.ctx.clone(), self.inner.prepare(rest, ctx)).await?;
        let o = prepared
            .input
            .as_object_mut()
            .ok_or_else(|| ToolError::new(ErrorCode::Internal, "canonical input is not an object"))?;
        o.insert("connection_id".into(), json!(resolved.id));
        o.insert(FINGERPRINT_KEY.into(), json!(resolved.fingerprint));
        if let Some(r) = requested {
            o.insert("requested_connection".into(), json!(r));
        }
        if let Some(p) = prepared.preview.as_object_mut() {
            p.insert("connection_id".into(), json!(resolved.id));
            p.insert("browser".into(), json!(format!("{} at {}", session.product, session.settings.endpoint)));
        }
        Ok(prepared)
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        let (rest, requested) = self.split(&input)?;
        let mut canonical = self.inner.canonicalize(rest, ctx).await?;
        if let (Some(r), Some(o)) = (requested, canonical.as_object_mut()) {
            o.insert("requested_connection".into(), json!(r));
        }
        Ok(canonical)
    }

    fn replay_input(&self, canonical: Value, frozen: &Value) -> Value {
        let mut out = self.inner.replay_input(canonical, frozen);
        for key in ["connection_id", FINGERPRINT_KEY] {
            if let (Some(v), Some(o)) = (frozen.get(key), out.as_object_mut()) {
                o.insert(key.into(), v.clone());
            }
        }
        out
    }

    fn side_effects(&self) -> crate::harness::SideEffects {
        self.inner.side_effects()
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let id = input["connection_id"]
            .as_str()
            .ok_or_else(|| ToolError::new(ErrorCode::InvalidInput, "the frozen call names no connection"))?;
        let session = self.bind(&ctx.owner_id, id, input[FINGERPRINT_KEY].as_str()).await?;
        let inner = strip(input);
        let mut out = BOUND.scope(session.ctx.clone(), self.inner.execute(&inner, ctx)).await.inspect_err(|e| {
            self.note(id, e);
        })?;
        if let Some(o) = out.output.as_object_mut() {
            o.insert("connection_id".into(), json!(id));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<AttachedSettings, ErrorCode> {
        AttachedSettings::parse(v).map_err(|e| e.code)
    }

    #[test]
    fn settings_are_canonical_and_bad_ones_refused() {
        let s = parse(json!({"endpoint": "http://127.0.0.1:9222/", "origins": ["HTTPS://App.Example.com:443/x"],
                             "tabs": ["9a2f0000aaaabbbbccccddddeeeeffff", "https://app.example.com/inbox"]}))
        .unwrap();
        assert_eq!(s.endpoint, "http://127.0.0.1:9222");
        assert_eq!(s.origins, vec!["https://app.example.com"]);
        assert_eq!(s.tabs, vec!["9A2F0000AAAABBBBCCCCDDDDEEEEFFFF", "https://app.example.com/inbox"]);
        let base = |endpoint: &str| json!({"endpoint": endpoint, "origins": ["https://a.example"]});
        for endpoint in [
            "https://127.0.0.1:9222",
            "http://127.0.0.1:9222/json",
            "http://u:p@127.0.0.1:9222",
            "http://127.0.0.1:9222?x=1",
            "ws://127.0.0.1:9222",
            "not a url",
        ] {
            assert_eq!(parse(base(endpoint)).err(), Some(ErrorCode::InvalidField), "{endpoint}");
        }
        assert_eq!(parse(json!({"endpoint": "http://h:1", "origins": []})).err(), Some(ErrorCode::InvalidField));
        assert_eq!(
            parse(json!({"endpoint": "http://h:1", "origins": ["data:text/html,x"]})).err(),
            Some(ErrorCode::InvalidField)
        );
        // A URL prefix off the listed origins, a tab that is neither, too many tabs, unknown keys.
        for tabs in [json!(["https://b.example/"]), json!(["file:///etc/passwd"]), json!(["x"])] {
            let v = json!({"endpoint": "http://h:1", "origins": ["https://a.example"], "tabs": tabs});
            assert_eq!(parse(v).err(), Some(ErrorCode::InvalidField), "{tabs}");
        }
        let many: Vec<String> = (0..9).map(|i| format!("https://a.example/{i}")).collect();
        let v = json!({"endpoint": "http://h:1", "origins": ["https://a.example"], "tabs": many});
        assert_eq!(parse(v).err(), Some(ErrorCode::InvalidField));
        let v = json!({"endpoint": "http://h:1", "origins": ["https://a.example"], "cookies": true});
        assert_eq!(parse(v).err(), Some(ErrorCode::InvalidRequest));
    }

    #[test]
    fn grants_by_target_id_or_url_prefix_only() {
        let s = parse(json!({"endpoint": "http://h:1", "origins": ["https://a.example"],
                             "tabs": ["AAAABBBBCCCCDDDD", "https://a.example"]}))
        .unwrap();
        assert!(s.grants("aaaabbbbccccdddd", "https://elsewhere.example/"));
        assert!(s.grants("1234567890ABCDEF", "https://a.example/inbox"));
        // The canonical prefix ends with the path's "/": no other host shares it.
        assert!(!s.grants("1234567890ABCDEF", "https://a.example.evil.test/"));
        assert!(!s.grants("1234567890ABCDEF", "http://a.example/"));
    }
}
