//! The managed browser: one Chromium process (Debian's `chromium`, headless, DevTools over a
//! pipe and no port: [`super::pipe`]) started on the first call that needs it, one isolated browser context per user (CDP
//! `Target.createBrowserContext`: its own cookies, storage and cache), a bounded number of
//! contexts and of tabs per context, each context closed after `--browser-idle-secs` without a
//! call and the process closed with the last context.
//!
//! Every tab is opened on `about:blank`, then CDP `Fetch` request interception is turned on
//! for it (`Fetch.enable`, pattern `*`, sent here rather than by chromiumoxide's
//! `request_intercept`, which keeps a copy of every request a page sends until its
//! `Fetch.requestPaused` arrives — never, for a page's `blob:` requests, so a page looping
//! over them grew the server's memory without end), and a task per
//! tab continues each paused request that the context's [`OriginPolicy`] allows and fails the
//! others (`Fetch.failRequest`, `BlockedByClient`), recording each refusal for the evidence of
//! the call during which it happened. Beneath that, every connection of a user's context goes
//! through the context's own proxy (the network floor, [`super::proxy`]), which applies the same
//! policy to what interception never sees: workers, WebSockets, pop-ups. WebRTC may not send
//! UDP outside the proxy (`--webrtc-ip-handling-policy=disable_non_proxied_udp`). Nothing here evaluates JavaScript given by a caller; the
//! two fixed functions that clear a text field and choose a `<select>` option are this
//! module's own.
//!
//! All of one user's calls run one at a time (the context's lock), so a snapshot, the check
//! that it is still current and the action that follows cannot interleave with another call.
//!
//! Every page target of a context counts against `--browser-max-tabs`, the tabs the tools open
//! and the pop-ups its pages open (`window.open`, `target=_blank`, allowed by Chromium's pop-up
//! blocker once per user gesture) alike. A task per context ([`watch_targets`]) follows the
//! browser's `Target.targetCreated` / `Target.targetDestroyed` events of that context's
//! `browserContextId`: a pop-up beyond the limit is closed at once (`Target.closeTarget`) and
//! recorded like a refused request (resource type `popup`, rule `tab_limit`) for the evidence
//! of the call during which it appeared; one within the limit becomes a tab of the user's
//! (interception on, `opener` naming the tab that opened it), listed and usable from the
//! user's next call on.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chromiumoxide::cdp::browser_protocol::fetch::EventRequestPaused;
use chromiumoxide::cdp::browser_protocol::page::{EventFrameStartedLoading, EventLoadEventFired};
use chromiumoxide::cdp::browser_protocol::target::{
    CloseTargetParams, CreateTargetParams, EventTargetCreated, EventTargetDestroyed, TargetId, TargetInfo,
};
use chromiumoxide::{Browser, Page};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::BrowserSettings;
use super::policy::{OriginPolicy, Refusal, RefusalRule};
use super::proxy::{ContextProxy, Floor, ServicePorts};
use super::snapshot::{self, Element, Rendered};
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::ToolError;
use crate::sandbox::cgroup::{CgroupSupport, SessionCgroup};
use crate::store::Store;

/// Longest one DevTools command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a started Chromium may take to answer on its DevTools pipe.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Chromium's flags: puppeteer's defaults as chromiumoxide 0.9 passes them, except that
/// Chromium's pop-up blocker stays on (a pop-up opened by a click still opens, and passes the
/// network floor), headless, no extensions, no background traffic, and WebRTC
/// kept inside the context's proxy.
const LAUNCH_ARGS: [&str; 30] = [
    "--disable-background-networking",
    "--enable-features=NetworkService,NetworkServiceInProcess",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-component-extensions-with-background-pages",
    "--disable-default-apps",
    "--disable-dev-shm-usage",
    "--disable-features=TranslateUI",
    "--disable-hang-monitor",
    "--disable-ipc-flooding-protection",
    "--disable-prompt-on-repost",
    "--disable-renderer-backgrounding",
    "--disable-sync",
    "--force-color-profile=srgb",
    "--metrics-recording-only",
    "--no-first-run",
    "--enable-automation",
    "--password-store=basic",
    "--use-mock-keychain",
    "--enable-blink-features=IdleDetection",
    "--lang=en_US",
    "--disable-extensions",
    "--headless",
    "--hide-scrollbars",
    "--mute-audio",
    "--disable-gpu",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--no-default-browser-check",
];
/// Longest a navigation waits for the page's `load` event.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(15);
/// Most refusals kept per context between two calls.
const MAX_REFUSALS_KEPT: usize = 200;

/// A raw DevTools command: method and JSON parameters, answered with raw JSON, so that
/// fields a newer Chromium adds never fail to parse.
#[derive(Debug, Clone)]
struct Raw {
    method: &'static str,
    params: Value,
}

impl Serialize for Raw {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.params.serialize(s)
    }
}

impl chromiumoxide::Method for Raw {
    fn identifier(&self) -> chromiumoxide::types::MethodId {
        self.method.into()
    }
}

impl chromiumoxide::Command for Raw {
    type Response = Value;
}

pub(super) fn browser_error(message: impl Into<String>) -> ToolError {
    ToolError::new(ErrorCode::BrowserError, message)
}

/// A tab's page target as the tools drive it: a page of the managed browser (through
/// `chromiumoxide`) or a tab of a user's attached browser (through this module's own
/// DevTools client, [`super::cdp`], attached to that one target only). Every function of this
/// module acts through [`TabPage::call`] and [`TabPage::events`], so both kinds of tab run
/// the same code.
#[derive(Clone)]
pub enum TabPage {
    /// A page of the managed browser.
    Managed(Page),
    /// A granted tab of an attached browser.
    Attached(AttachedPage),
}

/// A session attached to one granted tab of an attached browser.
#[derive(Clone)]
pub struct AttachedPage {
    /// The browser's DevTools connection.
    pub client: Arc<super::cdp::CdpClient>,
    /// The flat session of the tab (`Target.attachToTarget`, `flatten: true`).
    pub session: String,
    /// The tab's target id.
    pub target_id: String,
}

/// A managed page's events of type `E`, as their JSON parameters (the shape the attached
/// tabs' DevTools client gives).
async fn json_events<E>(page: &Page) -> Result<BoxStream<'static, Value>, chromiumoxide::error::CdpError>
where
    E: chromiumoxide::cdp::IntoEventKind + serde::Serialize + Unpin + Send + Sync + 'static,
{
    Ok(page.event_listener::<E>().await?.map(|e| serde_json::to_value(&*e).unwrap_or_default()).boxed())
}

impl TabPage {
    /// Sends `method` with `params` to the tab's target, within [`COMMAND_TIMEOUT`].
    /// Errors: `browser_error`; for an attached tab also `browser_gone` (the connection
    /// closed) and `forbidden` (a method outside the attached client's list).
    pub async fn call(&self, method: &'static str, params: Value) -> Result<Value, ToolError> {
        match self {
            TabPage::Managed(page) => {
                match tokio::time::timeout(COMMAND_TIMEOUT, page.execute(Raw { method, params })).await {
                    Ok(Ok(resp)) => Ok(resp.result),
                    Ok(Err(e)) => Err(browser_error(format!("{method} failed: {e}"))),
                    Err(_) => {
                        Err(browser_error(format!("{method} did not answer within {} s", COMMAND_TIMEOUT.as_secs())))
                    }
                }
            }
            TabPage::Attached(a) => a.client.call(Some(&a.session), method, params).await,
        }
    }

    /// The events `method` of the tab, as their JSON parameters, from now on. The managed
    /// browser's pages give `Page.loadEventFired`, `Page.frameStartedLoading` and
    /// `Fetch.requestPaused`.
    pub async fn events(&self, method: &'static str) -> Result<BoxStream<'static, Value>, ToolError> {
        let listen = |e: chromiumoxide::error::CdpError| browser_error(format!("listening for {method}: {e}"));
        match self {
            TabPage::Managed(page) => match method {
                "Page.loadEventFired" => json_events::<EventLoadEventFired>(page).await.map_err(listen),
                "Page.frameStartedLoading" => json_events::<EventFrameStartedLoading>(page).await.map_err(listen),
                "Fetch.requestPaused" => json_events::<EventRequestPaused>(page).await.map_err(listen),
                other => Err(browser_error(format!("no listener for {other}"))),
            },
            TabPage::Attached(a) => {
                Ok(tokio_stream::wrappers::ReceiverStream::new(a.client.subscribe(Some(&a.session), method)).boxed())
            }
        }
    }

    /// Closes a managed page; detaches from an attached tab (which stays open).
    pub async fn close(&self) {
        match self {
            TabPage::Managed(page) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), page.clone().close()).await;
            }
            // The user's tab is theirs: detaching leaves it open (and ends the interception).
            TabPage::Attached(a) => {
                let _ = a.client.call(None, "Target.detachFromTarget", json!({"sessionId": a.session})).await;
            }
        }
    }
}

/// Sends `method` with `params` to `page`'s target (see [`TabPage::call`]).
async fn cdp(page: &TabPage, method: &'static str, params: Value) -> Result<Value, ToolError> {
    page.call(method, params).await
}

/// Brings the tab to the front (`Page.bringToFront`).
pub async fn bring_to_front(page: &TabPage) -> Result<(), ToolError> {
    cdp(page, "Page.bringToFront", json!({})).await.map(|_| ())
}

/// A request the origin policy refused.
#[derive(Debug, Clone, Serialize)]
pub struct RefusedRequest {
    /// The tab whose page made it (`*` when the network floor refused it: any tab or worker).
    pub tab: String,
    /// CDP resource type (`Document`, `Script`, `Image`…), or the network floor's `proxied`
    /// (plain HTTP) and `tunnel` (a `CONNECT`: TLS or a WebSocket, named `host:port`).
    pub resource_type: String,
    /// The URL and the rule.
    #[serde(flatten)]
    pub refusal: Refusal,
}

/// What a snapshot saw, kept to check later references against.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `snap_…`, unique.
    pub id: String,
    /// The main frame's loader (one per document load).
    pub loader_id: String,
    /// The page URL.
    pub url: String,
    /// The rendering.
    pub rendered: Rendered,
    /// The (node, byte) limits it was rendered with; a later check renders with the same.
    pub limits: (usize, usize),
}

/// What a screenshot saw, kept to check later coordinates against.
#[derive(Debug, Clone)]
pub struct Shot {
    /// `shot_…`, unique.
    pub id: String,
    /// The PNG's SHA-256.
    pub sha256: String,
    /// The main frame's loader then.
    pub loader_id: String,
    /// The page URL then.
    pub url: String,
    /// The accessibility tree's structure digest then (default snapshot limits).
    pub digest: String,
    /// Width and height in CSS pixels (one image pixel per CSS pixel, whatever the screen's
    /// device pixel ratio: [`screenshot`]).
    pub size: (u32, u32),
    /// The page's scroll offset then: the origin of the screenshot's clip, the visual viewport's
    /// offset in the document ([`Capture::offset`], [`scroll_offset`]; CSS pixels).
    pub scroll: (f64, f64),
    /// The `browser_screenshot` invocation that took it (its evidence holds the PNG's SHA-256).
    pub invocation_id: String,
}

/// One tab of a context.
pub struct Tab {
    /// `t1`, `t2`… within a managed context; the target id in an attached browser.
    pub id: String,
    /// The page.
    pub page: TabPage,
    /// The latest snapshot of this tab.
    pub snapshot: Option<Snapshot>,
    /// The latest screenshot of this tab (what the coordinates of `browser_click_at`,
    /// `browser_scroll_at`, `browser_type_at` and `browser_drag` refer to); cleared by each of
    /// those actions (coordinates are used once).
    pub shot: Option<Shot>,
    /// The tab whose page opened this one (a pop-up), when it is a tab of the context.
    pub opener: Option<String>,
    interceptor: JoinHandle<()>,
}

impl Tab {
    /// The page target's id, for a managed page.
    fn target_id(&self) -> Option<&str> {
        match &self.page {
            TabPage::Managed(page) => Some(page.target_id().inner().as_str()),
            TabPage::Attached(_) => None,
        }
    }
}

/// The tabs of one context and which is active.
pub struct Tabs {
    /// Open tabs, oldest first.
    pub list: Vec<Tab>,
    /// Id of the active tab.
    pub active: Option<String>,
    /// True for an attached browser's granted tabs: a tab id not among them is
    /// `tab_not_granted`.
    attached: bool,
}

impl Tabs {
    /// No tabs yet; `attached` for an attached browser's.
    pub fn new(attached: bool) -> Tabs {
        Tabs { list: Vec::new(), active: None, attached }
    }
}

/// Whose browser a context is.
enum ContextOwner {
    /// A user's context in the managed browser.
    Managed {
        context_id: chromiumoxide::cdp::browser_protocol::browser::BrowserContextId,
        browser: Arc<Browser>,
        /// The context's network floor, held for its lifetime: dropping it closes its listener
        /// and connections.
        proxy: ContextProxy,
        /// The task following the context's page targets ([`watch_targets`]).
        watcher: JoinHandle<()>,
    },
    /// The granted tabs of a user's attached browser.
    Attached,
}

/// One user's isolated browser context (managed), or the granted tabs of an attached browser.
pub struct UserContext {
    owner: ContextOwner,
    /// The tabs; held for the whole of a call.
    pub tabs: tokio::sync::Mutex<Tabs>,
    policy: Arc<parking_lot::RwLock<OriginPolicy>>,
    refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>>,
    last_used: parking_lot::Mutex<Instant>,
    max_tabs: usize,
    /// The context's page targets, shared with its watcher.
    targets: Arc<parking_lot::Mutex<PageTargets>>,
    /// The number of the next tab id (`t1`, `t2`…), shared with the watcher (pop-ups).
    next_tab: Arc<std::sync::atomic::AtomicU64>,
}

/// The page targets of one managed context, as its watcher ([`watch_targets`]) and the calls
/// see them.
#[derive(Default)]
struct PageTargets {
    /// Page targets of the context now (the tools' tabs, pop-ups not closed): what counts
    /// against `--browser-max-tabs`.
    live: HashSet<String>,
    /// The tab id of each target that is a tab (opened by the tools, or an adopted pop-up).
    tab_ids: HashMap<String, String>,
    /// Tabs the tools are opening (`Target.createTarget` sent, its `targetCreated` not seen
    /// yet): a new page target without an opener is one of them.
    opening: usize,
    /// Pop-ups within the limit, interception on, not yet in the tab list.
    pending: Vec<Tab>,
    /// Targets of tabs that closed by themselves (a pop-up's `window.close()`).
    gone: Vec<String>,
}

struct Running {
    browser: Arc<Browser>,
    handler: JoinHandle<()>,
    profile: PathBuf,
    /// The process and its DevTools pipe; dropping it kills the process.
    process: super::pipe::PipeBrowser,
    /// The cgroup the whole process tree runs in, when the host gives one.
    cgroup: Option<Arc<SessionCgroup>>,
    /// Set when the memory watch ([`watch_memory`]) ended the tree at its limit.
    struck: Arc<std::sync::atomic::AtomicBool>,
    /// The memory watch, while the browser runs with a memory limit.
    memory_watch: Option<JoinHandle<()>>,
}

/// How long the tree's anonymous memory may stay within a tenth of its limit before the server
/// ends the browser ([`watch_memory`]).
const MEMORY_PINNED: Duration = Duration::from_secs(5);

/// Ends the browser whose cgroup is `group` once its anonymous memory stayed within a tenth of
/// `limit` bytes for [`MEMORY_PINNED`] (checked every second), setting `struck`. At its limit
/// the kernel kills a process only when nothing else can be reclaimed, and first reclaims
/// Chromium's own code pages, which the processes read back at once: seen on cgroup v1, a page
/// taking memory without end held its browser thrashing at the limit for ten minutes, every
/// call timing out, with no process killed.
async fn watch_memory(group: Arc<SessionCgroup>, limit: u64, struck: Arc<std::sync::atomic::AtomicBool>) {
    let mut since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        match group.anon_bytes() {
            Some(anon) if anon >= limit / 10 * 9 => {
                if since.get_or_insert_with(Instant::now).elapsed() >= MEMORY_PINNED {
                    tracing::warn!(anon, limit, "the managed browser stayed at its memory limit: ending it");
                    struck.store(true, std::sync::atomic::Ordering::Relaxed);
                    let g = Arc::clone(&group);
                    let _ = tokio::task::spawn_blocking(move || g.kill()).await;
                    return;
                }
            }
            _ => since = None,
        }
    }
}

/// Why a running browser is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The memory controller killed a process of its tree, or the tree stayed at its limit
    /// ([`watch_memory`]) (`--browser-memory-max`).
    MemoryLimit,
    /// The process exited (killed, crashed) or its DevTools connection closed; with the forks
    /// its process limit (`--browser-pids-max`) had refused by then.
    Exited { forks_refused: u64 },
}

impl Ended {
    fn describe(self, settings: &BrowserSettings) -> String {
        match self {
            Ended::MemoryLimit => format!(
                "the managed browser was killed by its memory limit (--browser-memory-max {} bytes)",
                settings.memory_max
            ),
            Ended::Exited { forks_refused: 0 } => {
                "the managed browser's process ended (it was killed or crashed)".to_owned()
            }
            Ended::Exited { forks_refused } => format!(
                "the managed browser's process ended (it was killed or crashed; its process limit, \
                 --browser-pids-max {}, had refused {forks_refused} new processes or threads)",
                settings.pids_max
            ),
        }
    }
}

impl Running {
    /// Whether the browser is over: the memory controller killed a process of its tree (the
    /// rest of the tree is then of no use: a renderer killed leaves a dead tab, the browser
    /// process killed leaves nothing), the process exited, or the connection closed.
    fn ended(&mut self) -> Option<Ended> {
        let events = self.cgroup.as_deref().map(SessionCgroup::limit_events).unwrap_or_default();
        if events.oom_kills > 0 || self.struck.load(std::sync::atomic::Ordering::Relaxed) {
            return Some(Ended::MemoryLimit);
        }
        (self.handler.is_finished() || self.process.exited())
            .then_some(Ended::Exited { forks_refused: events.pids_refused })
    }
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    users: HashMap<String, Arc<UserContext>>,
    /// Users whose context ended with the browser, and why, until their next call (which is
    /// `browser_gone`) or the idle limit.
    lost: HashMap<String, (String, Instant)>,
}

/// Whether the managed browser's process tree is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BoundState {
    /// Each Chromium runs in a cgroup of its own with the limits reported.
    Cgroup,
    /// The host gives this server no cgroup it can write (see `notes`): Chromium runs
    /// without a memory or process limit.
    Unbounded,
}

/// The bounds of the managed browser's process tree (`--browser-memory-max`,
/// `--browser-pids-max`), as the host lets them be enforced.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BrowserBounds {
    /// `cgroup` or `unbounded`.
    pub state: BoundState,
    /// The memory limit in force, in bytes (none: no limit, or no memory controller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_bytes: Option<u64>,
    /// The limit of processes and threads in force (none: no limit, or no pids controller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// Times a browser was ended because its memory limit killed a process of it, since the
    /// server started.
    pub memory_kills: u64,
    /// Why a limit is not in force (the host's cgroup notes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The `/readyz` section of the managed browser.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BrowserReport {
    /// `missing` (no Chromium binary: the browser tools are unavailable with
    /// `browser_missing`), `idle` (no process now; one starts on the first call) or `running`.
    pub state: &'static str,
    /// The Chromium binary in use, when found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chromium: Option<String>,
    /// Users' browser contexts open now.
    pub contexts: usize,
    /// Most contexts at once (`--browser-max-contexts`).
    pub max_contexts: usize,
    /// The process tree's memory and process limits.
    pub bounds: BrowserBounds,
}

/// The managed browser of this server.
pub struct BrowserManager {
    settings: BrowserSettings,
    binary: Option<PathBuf>,
    profile_root: PathBuf,
    store: Store,
    allow_internal: bool,
    allow: Vec<String>,
    services: ServicePorts,
    /// Connections all contexts' proxies may hold at once.
    floor_slots: Arc<tokio::sync::Semaphore>,
    /// Connections one user's contexts' proxies may hold at once: the pool over
    /// `--browser-max-contexts` (at most the per-context limit), so the users together never
    /// need more than the pool and none can starve another.
    floor_share: usize,
    /// Each user's share of the pool, while a proxy of theirs holds it.
    floor_shares: parking_lot::Mutex<HashMap<String, std::sync::Weak<tokio::sync::Semaphore>>>,
    state: tokio::sync::Mutex<State>,
    contexts: std::sync::atomic::AtomicUsize,
    /// What the host's cgroups give (set once at start, [`BrowserManager::set_cgroups`]).
    cgroups: std::sync::OnceLock<CgroupSupport>,
    /// Browsers ended by their memory limit since the start.
    memory_kills: std::sync::atomic::AtomicU64,
}

/// Finds the Chromium binary: the configured path when it is an executable file, else none
/// (a configured path that is not there is not replaced by another); without a configured
/// path, `chromium`, `chromium-browser`, `google-chrome` on `PATH`.
pub fn find_chromium(configured: Option<&std::path::Path>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if let Some(p) = configured {
        return executable(p).then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let candidate = dir.join(name);
            if executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

impl BrowserManager {
    /// The manager for `settings`; nothing starts until a call needs the browser. `data_dir`
    /// holds the profiles (`<data>/browser/profile-…`, removed when the process closes);
    /// `services` names the ports every context's network floor refuses.
    pub fn new(
        settings: BrowserSettings,
        data_dir: &std::path::Path,
        store: Store,
        allow_internal: bool,
        services: ServicePorts,
    ) -> Arc<Self> {
        Self::with_floor_pool(settings, data_dir, store, allow_internal, services, super::proxy::MAX_FLOOR_CONNECTIONS)
    }

    /// [`BrowserManager::new`] with `floor_pool` connections over all contexts' network floors
    /// instead of [`super::proxy::MAX_FLOOR_CONNECTIONS`] (tests make it small); each user's
    /// share is `floor_pool` / `--browser-max-contexts` (at least 1, at most the per-context
    /// limit; `mira serve` refuses more than [`super::proxy::MAX_CONTEXTS`] contexts, so with
    /// the real pool it is at least [`super::proxy::MIN_FLOOR_SHARE`]).
    pub fn with_floor_pool(
        settings: BrowserSettings,
        data_dir: &std::path::Path,
        store: Store,
        allow_internal: bool,
        services: ServicePorts,
        floor_pool: usize,
    ) -> Arc<Self> {
        let binary = find_chromium(settings.chromium.as_deref());
        let allow = settings.allow_origins.iter().filter_map(|o| super::policy::normalise_origin(o)).collect();
        let floor_share = (floor_pool / settings.max_contexts.max(1)).clamp(1, super::proxy::MAX_CONNECTIONS);
        Arc::new(BrowserManager {
            binary,
            profile_root: data_dir.join("browser"),
            store,
            allow_internal,
            allow,
            services,
            floor_slots: Arc::new(tokio::sync::Semaphore::new(floor_pool)),
            floor_share,
            floor_shares: parking_lot::Mutex::default(),
            settings,
            state: tokio::sync::Mutex::new(State::default()),
            contexts: std::sync::atomic::AtomicUsize::new(0),
            cgroups: std::sync::OnceLock::new(),
            memory_kills: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Bounds every Chromium started from now on by a cgroup of its own below `support`'s
    /// bases (this node's `mira-<node>` groups), with `--browser-memory-max` and
    /// `--browser-pids-max` where the host has those controllers. Without a call (or with a
    /// `support` that has no group this server can write) Chromium runs unbounded and
    /// `/readyz` says so. Only the first call counts.
    pub fn set_cgroups(&self, support: CgroupSupport) {
        let _ = self.cgroups.set(support);
    }

    /// The bounds as the host lets them be enforced.
    pub fn bounds(&self) -> BrowserBounds {
        let support = self.cgroups.get();
        let usable = support.is_some_and(CgroupSupport::membership);
        let mut notes = support.map(|s| s.notes.clone()).unwrap_or_default();
        if support.is_none() {
            notes.push("the host's cgroups were not probed".to_owned());
        } else if !usable {
            notes.push("no cgroup hierarchy is writable by this server".to_owned());
        }
        let memory = support.is_some_and(CgroupSupport::memory_limit) && self.settings.memory_max > 0;
        let pids = support.is_some_and(CgroupSupport::pids_limit) && self.settings.pids_max > 0;
        BrowserBounds {
            state: if usable { BoundState::Cgroup } else { BoundState::Unbounded },
            memory_max_bytes: (usable && memory).then_some(self.settings.memory_max),
            pids_max: (usable && pids).then_some(self.settings.pids_max),
            memory_kills: self.memory_kills.load(std::sync::atomic::Ordering::Relaxed),
            notes,
        }
    }

    /// Ends a browser that is over ([`Running::ended`]): its whole process tree is killed, and
    /// every user's context is dropped and remembered as lost, so that each user's next call
    /// says why (`browser_gone`) and a later one starts a fresh browser.
    async fn reap_ended(&self, state: &mut State) {
        let Some(ended) = state.running.as_mut().and_then(Running::ended) else {
            return;
        };
        let why = ended.describe(&self.settings);
        tracing::warn!(reason = %why, contexts = state.users.len(), "managed browser ended");
        if ended == Ended::MemoryLimit {
            self.memory_kills.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let now = Instant::now();
        for (user, ctx) in state.users.drain() {
            // Its pages are gone with the process: nothing to close but its own tasks.
            ctx.abandon();
            state.lost.insert(user, (why.clone(), now));
        }
        self.contexts.store(0, std::sync::atomic::Ordering::Relaxed);
        if let Some(running) = state.running.take() {
            Self::stop(running).await;
        }
    }

    /// `browser_gone` when `user`'s context ended with the browser since their last call
    /// (said once). Errors: that.
    fn take_loss(state: &mut State, user: &str) -> Result<(), ToolError> {
        match state.lost.remove(user) {
            Some((why, _)) => Err(ToolError::new(
                ErrorCode::BrowserGone,
                format!(
                    "{why}; your tabs, snapshots and screenshots are gone with it. The next call starts a fresh browser"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The stored PNG of the screenshot whose SHA-256 is `sha256` (managed and attached
    /// browsers store theirs in `<data-dir>/browser/screenshots/<sha256>.png`); `None` when
    /// `sha256` is not 64 lowercase hex digits, the file is not on this host, or its content
    /// no longer has that hash.
    pub fn stored_screenshot(&self, sha256: &str) -> Option<Vec<u8>> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let png = std::fs::read(self.profile_root.join("screenshots").join(format!("{sha256}.png"))).ok()?;
        (crate::evidence::sha256_hex(&png) == sha256).then_some(png)
    }

    /// The path of the running process's browser WebSocket (`/devtools/browser/<id>`), when
    /// it runs: an attached browser may never be this one.
    pub async fn websocket_path(&self) -> Option<String> {
        url::Url::parse(&self.websocket_address().await?).ok().map(|u| u.path().to_owned())
    }

    /// The running process's browser WebSocket URL (`ws://127.0.0.1:<port>/devtools/browser/<id>`),
    /// when it runs.
    pub async fn websocket_address(&self) -> Option<String> {
        let state = self.state.lock().await;
        Some(state.running.as_ref()?.browser.websocket_address().clone())
    }

    /// The Chromium process's id, while it runs.
    pub async fn process_id(&self) -> Option<u32> {
        self.state.lock().await.running.as_ref()?.process.pid()
    }

    /// The Chromium binary, when one was found.
    pub fn binary(&self) -> Option<&std::path::Path> {
        self.binary.as_deref()
    }

    /// The `/readyz` section.
    pub async fn report(&self) -> BrowserReport {
        let mut state = self.state.lock().await;
        self.reap_ended(&mut state).await;
        BrowserReport {
            state: if self.binary.is_none() {
                "missing"
            } else if state.running.is_some() {
                "running"
            } else {
                "idle"
            },
            chromium: self.binary.as_ref().map(|p| p.display().to_string()),
            contexts: state.users.len(),
            max_contexts: self.settings.max_contexts,
            bounds: self.bounds(),
        }
    }

    /// Users' contexts open now (no lock).
    pub fn context_count(&self) -> usize {
        self.contexts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The address rule for `user`: any address for admins and deployments that allow
    /// internal URLs, public ones only otherwise.
    async fn rule_for(&self, user: &str) -> Result<AddressRule, ToolError> {
        if self.allow_internal {
            return Ok(AddressRule::Any);
        }
        let admins = self
            .store
            .admin_user_ids()
            .await
            .map_err(|e| ToolError::new(ErrorCode::StoreError, format!("reading the admins: {e}")))?;
        Ok(if admins.contains(user) { AddressRule::Any } else { AddressRule::PublicOnly })
    }

    /// The context of `user`, creating it (and starting Chromium) when there is none.
    /// Errors: `browser_missing`, `browser_limit`, `browser_error`; `browser_gone` once after
    /// the browser the user's context was in ended (killed by its memory limit, crashed).
    pub async fn context(&self, user: &str) -> Result<Arc<UserContext>, ToolError> {
        let rule = self.rule_for(user).await?;
        let mut state = self.state.lock().await;
        self.reap_ended(&mut state).await;
        Self::take_loss(&mut state, user)?;
        if let Some(ctx) = state.users.get(user).cloned() {
            if !Self::demoted(&ctx, rule) {
                ctx.policy.write().rule = rule;
                *ctx.last_used.lock() = Instant::now();
                return Ok(ctx);
            }
            // No longer an admin: what the context opened under the old rule (a tunnel to an
            // internal address) closes with it; a new context starts under the new rule.
            state.users.remove(user);
            self.contexts.store(state.users.len(), std::sync::atomic::Ordering::Relaxed);
            ctx.close().await;
        }
        let Some(binary) = self.binary.clone() else {
            return Err(ToolError::new(ErrorCode::BrowserMissing, "no Chromium binary is installed or configured"));
        };
        if state.users.len() >= self.settings.max_contexts {
            return Err(ToolError::new(
                ErrorCode::BrowserLimit,
                format!("the managed browser already serves {} users (--browser-max-contexts)", state.users.len()),
            ));
        }
        if state.running.is_none() {
            state.running = Some(self.launch(&binary).await?);
        }
        let Some(running) = state.running.as_ref() else {
            return Err(browser_error("the browser did not start"));
        };
        let browser = running.browser.clone();
        let policy = Arc::new(parking_lot::RwLock::new(OriginPolicy {
            allow: self.allow.clone(),
            rule,
            service_ports: (self.services)(),
        }));
        let refusals = Arc::default();
        let floor = Floor {
            policy: policy.clone(),
            refusals: Arc::clone(&refusals),
            slots: self.floor_slots.clone(),
            tunnel_idle: Duration::from_secs(self.settings.tunnel_idle_secs.max(1)),
        };
        let proxy = ContextProxy::start_shared(floor, self.floor_share_of(user))
            .await
            .map_err(|e| browser_error(format!("starting the context's proxy: {e}")))?;
        let params = chromiumoxide::cdp::browser_protocol::target::CreateBrowserContextParams::builder()
            .proxy_server(proxy.proxy_server())
            .proxy_bypass_list("<-loopback>")
            .build();
        let context_id = tokio::time::timeout(COMMAND_TIMEOUT, browser.create_browser_context(params))
            .await
            .map_err(|_| browser_error("Target.createBrowserContext timed out"))?
            .map_err(|e| browser_error(format!("Target.createBrowserContext failed: {e}")))?;
        // A page may not save files: downloads are denied in the context (fail closed: a
        // context whose downloads could not be denied is not used).
        let deny = chromiumoxide::cdp::browser_protocol::browser::SetDownloadBehaviorParams::builder()
            .behavior(chromiumoxide::cdp::browser_protocol::browser::SetDownloadBehaviorBehavior::Deny)
            .browser_context_id(context_id.clone())
            .build()
            .map_err(|e| browser_error(format!("Browser.setDownloadBehavior: {e}")));
        let denied = match deny {
            Ok(params) => match tokio::time::timeout(COMMAND_TIMEOUT, browser.execute(params)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(browser_error(format!("Browser.setDownloadBehavior failed: {e}"))),
                Err(_) => Err(browser_error("Browser.setDownloadBehavior timed out")),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = denied {
            let _ = tokio::time::timeout(Duration::from_secs(5), browser.dispose_browser_context(context_id)).await;
            return Err(e);
        }
        let targets: Arc<parking_lot::Mutex<PageTargets>> = Arc::default();
        let next_tab = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let watched = Watched {
            browser: browser.clone(),
            context_id: context_id.inner().clone(),
            max_tabs: self.settings.max_tabs,
            targets: targets.clone(),
            next_tab: next_tab.clone(),
            policy: policy.clone(),
            refusals: Arc::clone(&refusals),
        };
        let watcher = match target_events(&browser).await {
            Ok(events) => tokio::spawn(watch_targets(watched, events)),
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), browser.dispose_browser_context(context_id)).await;
                return Err(e);
            }
        };
        let ctx = Arc::new(UserContext {
            owner: ContextOwner::Managed { context_id, browser, proxy, watcher },
            tabs: tokio::sync::Mutex::new(Tabs::new(false)),
            policy,
            refusals,
            last_used: parking_lot::Mutex::new(Instant::now()),
            max_tabs: self.settings.max_tabs,
            targets,
            next_tab,
        });
        state.users.insert(user.to_owned(), ctx.clone());
        self.contexts.store(state.users.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(ctx)
    }

    /// Re-reads whether `user` is an admin and sets the address rule of their open context
    /// (an action on an existing snapshot does not go through [`BrowserManager::context`]).
    /// Errors: `stale_snapshot` when the user is no longer an admin (the context was closed,
    /// see [`BrowserManager::context`]).
    pub async fn refresh_rule(&self, user: &str, ctx: &UserContext) -> Result<(), ToolError> {
        let rule = self.rule_for(user).await?;
        if Self::demoted(ctx, rule) {
            let mut state = self.state.lock().await;
            if let Some(open) = state.users.get(user).cloned() {
                state.users.remove(user);
                self.contexts.store(state.users.len(), std::sync::atomic::Ordering::Relaxed);
                drop(state);
                open.close().await;
            }
            return Err(ToolError::new(
                ErrorCode::StaleSnapshot,
                "the browser context was closed because its user is no longer an admin: navigate again",
            ));
        }
        let mut policy = ctx.policy.write();
        policy.rule = rule;
        policy.service_ports = (self.services)();
        Ok(())
    }

    /// The semaphore of `user`'s share of the network floor's pool: the one their open
    /// contexts' proxies (an old one still closing included) already hold, else a new one of
    /// `floor_share` places.
    fn floor_share_of(&self, user: &str) -> Arc<tokio::sync::Semaphore> {
        let mut shares = self.floor_shares.lock();
        if let Some(share) = shares.get(user).and_then(std::sync::Weak::upgrade) {
            return share;
        }
        shares.retain(|_, share| share.strong_count() > 0);
        let share = Arc::new(tokio::sync::Semaphore::new(self.floor_share));
        shares.insert(user.to_owned(), Arc::downgrade(&share));
        share
    }

    /// Whether `ctx` was opened for an admin whose rule is now public-only.
    fn demoted(ctx: &UserContext, rule: AddressRule) -> bool {
        ctx.policy.read().rule == AddressRule::Any && rule == AddressRule::PublicOnly
    }

    /// The context of `user` when one is open (no start). Errors: `browser_gone` once after the
    /// browser the user's context was in ended.
    pub async fn existing(&self, user: &str) -> Result<Option<Arc<UserContext>>, ToolError> {
        let mut state = self.state.lock().await;
        self.reap_ended(&mut state).await;
        Self::take_loss(&mut state, user)?;
        Ok(state.users.get(user).cloned())
    }

    async fn launch(&self, binary: &std::path::Path) -> Result<Running, ToolError> {
        let profile = self.profile_root.join(format!("profile-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&profile)
            .map_err(|e| browser_error(format!("creating the browser profile {}: {e}", profile.display())))?;
        let mut args: Vec<String> = LAUNCH_ARGS.iter().map(|a| (*a).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        // Chromium's own sandbox cannot start as root (it refuses to run); under root the
        // process runs without it and the origin policy and the contexts' isolation remain.
        if rustix::process::geteuid().is_root() {
            args.extend(["--no-sandbox".to_owned(), "--disable-setuid-sandbox".to_owned()]);
        }
        let (cgroup, procs) = self.browser_cgroup()?;
        let process = match super::pipe::PipeBrowser::launch(binary, &args, procs).await {
            Ok(process) => process,
            Err(e) => {
                if let Some(g) = cgroup {
                    release_cgroup(Arc::new(g)).await;
                }
                return Err(browser_error(format!("starting {}: {e}", binary.display())));
            }
        };
        let config = chromiumoxide::handler::HandlerConfig {
            ignore_https_errors: false,
            request_timeout: COMMAND_TIMEOUT,
            request_intercept: false,
            // Every page emulates chromiumoxide's default 800×600 viewport (computer use's
            // coordinates are in it).
            viewport: Some(chromiumoxide::handler::viewport::Viewport::default()),
            ..Default::default()
        };
        let connected =
            tokio::time::timeout(LAUNCH_TIMEOUT, Browser::connect_with_config(process.websocket_url(), config)).await;
        let (browser, mut handler) = match connected {
            Ok(Ok(pair)) => pair,
            failed => {
                process.kill().await;
                if let Some(g) = cgroup {
                    release_cgroup(Arc::new(g)).await;
                }
                return Err(match failed {
                    Ok(Err(e)) => browser_error(format!("connecting to {}: {e}", binary.display())),
                    _ => browser_error(format!("{} did not answer within {LAUNCH_TIMEOUT:?}", binary.display())),
                });
            }
        };
        let handler = tokio::spawn(async move {
            while let Some(event) = handler.next().await {
                if let Err(e) = event {
                    tracing::debug!(error = %e, "browser handler");
                    if matches!(e, chromiumoxide::error::CdpError::Ws(_)) {
                        break;
                    }
                }
            }
        });
        tracing::info!(chromium = %binary.display(), pid = ?process.pid(), "managed browser started (DevTools over a pipe)");
        let cgroup = cgroup.map(Arc::new);
        let struck = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let memory_watch = match (&cgroup, self.bounds().memory_max_bytes) {
            (Some(g), Some(limit)) => Some(tokio::spawn(watch_memory(Arc::clone(g), limit, struck.clone()))),
            _ => None,
        };
        Ok(Running { browser: Arc::new(browser), handler, profile, process, cgroup, struck, memory_watch })
    }

    /// A cgroup of its own for the next Chromium, with the memory and process limits the host
    /// can enforce, and its `cgroup.procs` files for the process to join; none where the host
    /// gives no writable group. Errors: `browser_error` when the group cannot be made.
    fn browser_cgroup(&self) -> Result<(Option<SessionCgroup>, Vec<std::os::fd::OwnedFd>), ToolError> {
        let Some(support) = self.cgroups.get().filter(|s| s.membership()) else {
            return Ok((None, Vec::new()));
        };
        let id = format!("browser_{}", uuid::Uuid::now_v7().simple());
        let (group, procs) = support
            .create(&id, self.settings.pids_max, self.settings.memory_max)
            .map_err(|e| browser_error(format!("creating the browser's cgroup: {e}")))?;
        if let Err(e) = group.kill_whole_group_on_oom() {
            tracing::warn!(error = %e, "memory.oom.group of the browser's cgroup");
        }
        Ok((Some(group), procs))
    }

    /// Closes contexts idle for longer than the idle limit, and the process with the last one;
    /// ends a browser that is over ([`BrowserManager::reap_ended`]) and forgets the losses
    /// older than the idle limit.
    pub async fn close_idle(&self) {
        let idle = Duration::from_secs(self.settings.idle_secs.max(1));
        let mut state = self.state.lock().await;
        self.reap_ended(&mut state).await;
        state.lost.retain(|_, (_, at)| at.elapsed() < idle);
        let expired: Vec<String> = state
            .users
            .iter()
            .filter(|(_, c)| c.last_used.lock().elapsed() >= idle && c.tabs.try_lock().is_ok())
            .map(|(u, _)| u.clone())
            .collect();
        for user in expired {
            if let Some(ctx) = state.users.remove(&user) {
                ctx.close().await;
            }
        }
        self.contexts.store(state.users.len(), std::sync::atomic::Ordering::Relaxed);
        if state.users.is_empty()
            && let Some(running) = state.running.take()
        {
            Self::stop(running).await;
        }
    }

    async fn stop(running: Running) {
        let Running { browser, handler, profile, process, cgroup, memory_watch, .. } = running;
        if let Some(watch) = memory_watch {
            watch.abort();
        }
        if !handler.is_finished()
            && let Ok(mut browser) = Arc::try_unwrap(browser)
        {
            let _ = tokio::time::timeout(Duration::from_secs(5), browser.close()).await;
        }
        handler.abort();
        process.kill().await;
        // What is left of the tree (a renderer whose parent was killed) dies with its group.
        if let Some(g) = cgroup {
            release_cgroup(g).await;
        }
        let _ = std::fs::remove_dir_all(&profile);
        tracing::info!("managed browser closed");
    }

    /// Closes every context and the process.
    pub async fn shutdown(&self) {
        let mut state = self.state.lock().await;
        for (_, ctx) in state.users.drain() {
            ctx.close().await;
        }
        self.contexts.store(0, std::sync::atomic::Ordering::Relaxed);
        if let Some(running) = state.running.take() {
            Self::stop(running).await;
        }
    }

    /// Closes idle contexts every few seconds until `shutdown`, then everything.
    pub fn spawn_reaper(self: &Arc<Self>, shutdown: CancellationToken) {
        let this = Arc::clone(self);
        let every = Duration::from_secs((self.settings.idle_secs / 4).clamp(1, 30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => this.close_idle().await,
                }
            }
            this.shutdown().await;
        });
    }
}

impl UserContext {
    /// The context of an attached browser's granted tabs (added with
    /// [`UserContext::adopt_tab`]), loading only what `policy` allows.
    pub fn attached(policy: OriginPolicy) -> UserContext {
        UserContext {
            owner: ContextOwner::Attached,
            tabs: tokio::sync::Mutex::new(Tabs::new(true)),
            policy: Arc::new(parking_lot::RwLock::new(policy)),
            refusals: Arc::default(),
            last_used: parking_lot::Mutex::new(Instant::now()),
            max_tabs: 0,
            targets: Arc::default(),
            next_tab: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        }
    }

    /// Closes the context: a managed one's tabs and browser context; an attached browser's
    /// sessions are detached (its tabs stay open, their interception ends).
    pub async fn close(&self) {
        let mut tabs = self.tabs.lock().await;
        if let ContextOwner::Managed { watcher, .. } = &self.owner {
            watcher.abort();
        }
        let pending = std::mem::take(&mut self.targets.lock().pending);
        for tab in tabs.list.drain(..).chain(pending) {
            tab.interceptor.abort();
            tab.page.close().await;
        }
        // Disposing of the context also closes every pop-up its pages opened.
        if let ContextOwner::Managed { context_id, browser, .. } = &self.owner {
            let _ =
                tokio::time::timeout(Duration::from_secs(5), browser.dispose_browser_context(context_id.clone())).await;
        }
    }

    /// Stops the context's own tasks (its watcher, its tabs' interception) when its browser is
    /// gone; the proxy closes when the last holder of the context lets it go.
    fn abandon(&self) {
        if let ContextOwner::Managed { watcher, .. } = &self.owner {
            watcher.abort();
        }
        if let Ok(tabs) = self.tabs.try_lock() {
            for tab in &tabs.list {
                tab.interceptor.abort();
            }
        }
        for tab in self.targets.lock().pending.drain(..) {
            tab.interceptor.abort();
        }
    }

    /// Adds an attached browser's granted tab `id` (its target id) driven through `page`:
    /// listens for its paused requests, then turns `Fetch` interception (pattern `*`) and
    /// page events on, so every request of the tab passes the policy from now on.
    pub async fn adopt_tab(&self, tabs: &mut Tabs, id: String, page: TabPage) -> Result<(), ToolError> {
        let events = page.events("Fetch.requestPaused").await?;
        let interceptor =
            tokio::spawn(intercept(page.clone(), events, self.policy.clone(), self.refusals.clone(), id.clone()));
        let enabled = async {
            cdp(&page, "Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})).await?;
            cdp(&page, "Page.enable", json!({})).await
        };
        if let Err(e) = enabled.await {
            interceptor.abort();
            return Err(e);
        }
        if tabs.active.is_none() {
            tabs.active = Some(id.clone());
        }
        tabs.list.push(Tab { id, page, snapshot: None, shot: None, opener: None, interceptor });
        Ok(())
    }

    /// Forgets tab `id` (closed by its user); the next remaining tab becomes active.
    pub fn drop_tab(&self, tabs: &mut Tabs, id: &str) {
        if let Some(pos) = tabs.list.iter().position(|t| t.id == id) {
            let tab = tabs.list.remove(pos);
            tab.interceptor.abort();
        }
        if tabs.active.as_deref() == Some(id) {
            tabs.active = tabs.list.first().map(|t| t.id.clone());
        }
    }

    /// The `proxyServer` of a managed context's network floor (`http://127.0.0.1:<port>`);
    /// `None` for an attached browser's.
    pub fn proxy_server(&self) -> Option<String> {
        match &self.owner {
            ContextOwner::Managed { proxy, .. } => Some(proxy.proxy_server()),
            ContextOwner::Attached => None,
        }
    }

    /// Marks the context used now.
    pub fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    /// The refusals recorded since the last call to this, oldest first.
    pub fn take_refusals(&self) -> Vec<RefusedRequest> {
        std::mem::take(&mut *self.refusals.lock())
    }

    /// The policy in force.
    pub fn policy(&self) -> OriginPolicy {
        self.policy.read().clone()
    }

    /// Opens a tab on `about:blank` with interception on, and makes it active.
    /// Errors: `browser_limit`, `browser_error`.
    pub async fn open_tab(&self, tabs: &mut Tabs) -> Result<String, ToolError> {
        let ContextOwner::Managed { context_id, browser, .. } = &self.owner else {
            return Err(ToolError::new(
                ErrorCode::TabNotGranted,
                "an attached browser's tools act only in the tabs its connection grants; they open no tab",
            ));
        };
        self.adopt_popups(tabs);
        let open = {
            let targets = self.targets.lock();
            (tabs.list.len() + targets.pending.len()).max(targets.live.len())
        };
        if open >= self.max_tabs {
            return Err(ToolError::new(
                ErrorCode::BrowserLimit,
                format!(
                    "{open} tabs are open (pop-ups included), the most one user may have (--browser-max-tabs): \
                     close one with browser_tabs"
                ),
            ));
        }
        let params = CreateTargetParams::builder()
            .url("about:blank")
            .browser_context_id(context_id.clone())
            .build()
            .map_err(|e| browser_error(format!("Target.createTarget: {e}")))?;
        self.targets.lock().opening += 1;
        let page = match tokio::time::timeout(COMMAND_TIMEOUT, browser.new_page(params)).await {
            Ok(Ok(page)) => page,
            failed => {
                // Whether a target was made is unknown: no later page counts as this one.
                self.targets.lock().opening = 0;
                return Err(match failed {
                    Ok(Err(e)) => browser_error(format!("opening a tab: {e}")),
                    _ => browser_error("opening a tab timed out"),
                });
            }
        };
        let id = format!("t{}", self.next_tab.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        self.targets.lock().tab_ids.insert(page.target_id().inner().clone(), id.clone());
        let page = TabPage::Managed(page);
        let events = page.events("Fetch.requestPaused").await?;
        let interceptor =
            tokio::spawn(intercept(page.clone(), events, self.policy.clone(), self.refusals.clone(), id.clone()));
        if let Err(e) = cdp(&page, "Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})).await {
            interceptor.abort();
            page.close().await;
            return Err(e);
        }
        tabs.list.push(Tab { id: id.clone(), page, snapshot: None, shot: None, opener: None, interceptor });
        tabs.active = Some(id.clone());
        Ok(id)
    }

    /// Locks the tabs for a call and brings the pop-ups the watcher took over since the last
    /// call into the list (see [`UserContext::adopt_popups`]).
    pub async fn lock_tabs(&self) -> tokio::sync::MutexGuard<'_, Tabs> {
        let mut tabs = self.tabs.lock().await;
        self.adopt_popups(&mut tabs);
        tabs
    }

    /// Moves the pop-ups taken over within the limit into `tabs` (the active tab stays; a
    /// pop-up is active only when no tab was), and forgets the tabs whose page closed by
    /// itself. Nothing for an attached browser's tabs.
    pub fn adopt_popups(&self, tabs: &mut Tabs) {
        let (pending, gone) = {
            let mut targets = self.targets.lock();
            (std::mem::take(&mut targets.pending), std::mem::take(&mut targets.gone))
        };
        for target in gone {
            if let Some(id) = tabs.list.iter().find(|t| t.target_id() == Some(target.as_str())).map(|t| t.id.clone()) {
                self.drop_tab(tabs, &id);
            }
        }
        for tab in pending {
            if tabs.active.is_none() {
                tabs.active = Some(tab.id.clone());
            }
            tabs.list.push(tab);
        }
    }

    /// Closes tab `id`; the next remaining tab becomes active. Errors: `not_found`.
    pub async fn close_tab(&self, tabs: &mut Tabs, id: &str) -> Result<(), ToolError> {
        if matches!(self.owner, ContextOwner::Attached) {
            return Err(ToolError::new(
                ErrorCode::TabNotGranted,
                "an attached browser's tabs are its user's: close them in the browser",
            ));
        }
        let pos = tabs.list.iter().position(|t| t.id == id).ok_or_else(|| tabs.no_tab(id))?;
        let tab = tabs.list.remove(pos);
        tab.interceptor.abort();
        tab.page.close().await;
        if tabs.active.as_deref() == Some(id) {
            tabs.active = tabs.list.last().map(|t| t.id.clone());
        }
        Ok(())
    }
}

impl Tabs {
    fn no_tab(&self, id: &str) -> ToolError {
        if self.attached {
            ToolError::new(
                ErrorCode::TabNotGranted,
                format!(
                    "tab {id} is not an open tab this browser connection grants (granted and open: {})",
                    self.list.iter().map(|t| t.id.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )
        } else {
            ToolError::new(ErrorCode::NotFound, format!("no open tab {id}"))
        }
    }

    fn none_open(&self) -> ToolError {
        if self.attached {
            ToolError::new(ErrorCode::BrowserGone, "no tab the browser connection grants is open")
        } else {
            ToolError::new(ErrorCode::NotFound, "no tab is open: navigate somewhere first (browser_navigate)")
        }
    }

    /// Tab `id`, or the active tab when `id` is None. Errors: `not_found`.
    pub fn get(&self, id: Option<&str>) -> Result<&Tab, ToolError> {
        let want = id.or(self.active.as_deref()).ok_or_else(|| self.none_open())?;
        self.list.iter().find(|t| t.id == want).ok_or_else(|| self.no_tab(want))
    }

    /// Mutable tab `id` or the active one.
    pub fn get_mut(&mut self, id: Option<&str>) -> Result<&mut Tab, ToolError> {
        let want = id.or(self.active.as_deref()).map(str::to_owned).ok_or_else(|| self.none_open())?;
        if !self.list.iter().any(|t| t.id == want) {
            return Err(self.no_tab(&want));
        }
        self.list.iter_mut().find(|t| t.id == want).ok_or_else(|| browser_error("the tab vanished"))
    }

    /// The tab whose latest snapshot is `snapshot_id`. Errors: `stale_snapshot` (no tab's
    /// latest snapshot has that id: an older one, or one of a closed tab).
    pub fn by_snapshot(&self, snapshot_id: &str) -> Result<&Tab, ToolError> {
        self.list.iter().find(|t| t.snapshot.as_ref().is_some_and(|s| s.id == snapshot_id)).ok_or_else(|| {
            ToolError::new(
                ErrorCode::StaleSnapshot,
                format!(
                    "{snapshot_id} is not the latest snapshot of an open tab: take a new snapshot (browser_snapshot)"
                ),
            )
        })
    }
}

/// Continues or fails every paused request of one tab (`Fetch.requestPaused` parameters) by
/// the context's policy.
async fn intercept(
    page: TabPage,
    mut events: BoxStream<'static, Value>,
    policy: Arc<parking_lot::RwLock<OriginPolicy>>,
    refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>>,
    tab: String,
) {
    while let Some(event) = events.next().await {
        let url = event["request"]["url"].as_str().unwrap_or_default().to_owned();
        let request_id = event["requestId"].clone();
        let current = policy.read().clone();
        match current.check(&url).await {
            Ok(()) => {
                if let Err(e) = page.call("Fetch.continueRequest", json!({"requestId": request_id})).await {
                    tracing::debug!(error = %e.message, "Fetch.continueRequest");
                }
            }
            Err(refusal) => {
                let failed =
                    page.call("Fetch.failRequest", json!({"requestId": request_id, "errorReason": "BlockedByClient"}));
                if let Err(e) = failed.await {
                    tracing::debug!(error = %e.message, "Fetch.failRequest");
                }
                let resource_type = event["resourceType"].as_str().unwrap_or("Other").to_owned();
                record_refusal(&refusals, RefusedRequest { tab: tab.clone(), resource_type, refusal });
            }
        }
    }
}

/// Kills what is left in the browser's cgroup and removes it (off the runtime's threads:
/// removal waits for the killed processes to leave).
async fn release_cgroup(group: Arc<SessionCgroup>) {
    let _ = tokio::task::spawn_blocking(move || {
        group.kill();
        group.remove(Duration::from_secs(2));
    })
    .await;
}

/// What the browser says about a page target.
enum TargetEvent {
    /// `Target.targetCreated`.
    Created(TargetInfo),
    /// `Target.targetDestroyed`.
    Destroyed(String),
}

/// The browser's `Target.targetCreated` and `Target.targetDestroyed` events (chromiumoxide's
/// handler turns target discovery on at connection). Errors: `browser_error`.
async fn target_events(browser: &Browser) -> Result<BoxStream<'static, TargetEvent>, ToolError> {
    let listen = |e: chromiumoxide::error::CdpError| browser_error(format!("listening for page targets: {e}"));
    let created = browser.event_listener::<EventTargetCreated>().await.map_err(listen)?;
    let destroyed = browser.event_listener::<EventTargetDestroyed>().await.map_err(listen)?;
    Ok(futures::stream::select(
        created.map(|e| TargetEvent::Created(e.target_info.clone())),
        destroyed.map(|e| TargetEvent::Destroyed(e.target_id.inner().clone())),
    )
    .boxed())
}

/// What the watcher of one context works with.
struct Watched {
    browser: Arc<Browser>,
    /// The context's `browserContextId`.
    context_id: String,
    max_tabs: usize,
    targets: Arc<parking_lot::Mutex<PageTargets>>,
    next_tab: Arc<std::sync::atomic::AtomicU64>,
    policy: Arc<parking_lot::RwLock<OriginPolicy>>,
    refusals: Arc<parking_lot::Mutex<Vec<RefusedRequest>>>,
}

/// Longest taking a pop-up over may wait for chromiumoxide to attach to it.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Follows the page targets of one context until aborted (the context closes). Every page
/// target of the context counts against its tab limit; a new one that is not a tab the tools
/// are opening is a pop-up: beyond the limit it is closed at once (`Target.closeTarget`) and
/// recorded as a refused request (`popup`, `tab_limit`, the opener's tab), within it it is
/// taken over as a tab ([`adopt`]).
async fn watch_targets(w: Watched, mut events: BoxStream<'static, TargetEvent>) {
    let w = Arc::new(w);
    while let Some(event) = events.next().await {
        match event {
            TargetEvent::Created(info) => {
                let ours = info.browser_context_id.as_ref().is_some_and(|c| *c.inner() == w.context_id);
                if !ours || info.r#type != "page" {
                    continue;
                }
                let target = info.target_id.inner().clone();
                let (popup, over, opener) = {
                    let mut targets = w.targets.lock();
                    if !targets.live.insert(target.clone()) {
                        continue;
                    }
                    let popup = info.opener_id.is_some() || targets.opening == 0;
                    if !popup {
                        targets.opening -= 1;
                    }
                    let opener = info.opener_id.as_ref().and_then(|o| targets.tab_ids.get(o.inner()).cloned());
                    (popup, targets.live.len() > w.max_tabs, opener)
                };
                if !popup {
                    continue;
                }
                if over {
                    w.targets.lock().live.remove(&target);
                    let closed = w.browser.execute(CloseTargetParams::new(info.target_id.clone()));
                    if let Err(e) = tokio::time::timeout(COMMAND_TIMEOUT, closed)
                        .await
                        .unwrap_or(Err(chromiumoxide::error::CdpError::Timeout))
                    {
                        tracing::warn!(error = %e, "closing a pop-up beyond the tab limit");
                    }
                    let url = if info.url.is_empty() { "about:blank".to_owned() } else { info.url.clone() };
                    let refusal = super::policy::refusal(
                        &url,
                        RefusalRule::TabLimit,
                        format!(
                            "a pop-up beyond the {} tabs one user may have (--browser-max-tabs) was closed",
                            w.max_tabs
                        ),
                    );
                    record_refusal(
                        &w.refusals,
                        RefusedRequest {
                            tab: opener.unwrap_or_else(|| "*".to_owned()),
                            resource_type: "popup".into(),
                            refusal,
                        },
                    );
                    continue;
                }
                let id = format!("t{}", w.next_tab.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                w.targets.lock().tab_ids.insert(target.clone(), id.clone());
                tokio::spawn(adopt(Arc::clone(&w), info.target_id.clone(), id, opener));
            }
            TargetEvent::Destroyed(target) => {
                let mut targets = w.targets.lock();
                if !targets.live.remove(&target) {
                    continue;
                }
                if targets.tab_ids.remove(&target).is_some() {
                    targets.gone.push(target.clone());
                }
                if let Some(pos) = targets.pending.iter().position(|t| t.target_id() == Some(target.as_str())) {
                    targets.pending.remove(pos).interceptor.abort();
                }
            }
        }
    }
}

/// Takes pop-up `target` over as tab `id` of the context: waits (at most [`ADOPT_TIMEOUT`])
/// for chromiumoxide's page of it, turns `Fetch` interception on and leaves it for the next
/// call ([`UserContext::adopt_popups`]). A pop-up that cannot be taken over is closed: the
/// tools could neither list nor act in it.
async fn adopt(w: Arc<Watched>, target: TargetId, id: String, opener: Option<String>) {
    let key = target.inner().clone();
    let started = Instant::now();
    let page = loop {
        if !w.targets.lock().live.contains(&key) {
            return;
        }
        if let Ok(page) = w.browser.get_page(target.clone()).await {
            break Some(page);
        }
        if started.elapsed() >= ADOPT_TIMEOUT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let tab = match page {
        Some(page) => {
            let page = TabPage::Managed(page);
            match page.events("Fetch.requestPaused").await {
                Ok(events) => {
                    let interceptor =
                        tokio::spawn(intercept(page.clone(), events, w.policy.clone(), w.refusals.clone(), id.clone()));
                    match cdp(&page, "Fetch.enable", json!({"patterns": [{"urlPattern": "*"}]})).await {
                        Ok(_) => Some(Tab { id, page, snapshot: None, shot: None, opener, interceptor }),
                        Err(e) => {
                            interceptor.abort();
                            tracing::warn!(error = %e.message, "a pop-up's interception could not start");
                            None
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, "a pop-up's interception could not start");
                    None
                }
            }
        }
        None => None,
    };
    let Some(tab) = tab else {
        w.targets.lock().tab_ids.remove(&key);
        tracing::warn!(target = %key, "a pop-up could not be taken over as a tab and is closed");
        let _ = tokio::time::timeout(COMMAND_TIMEOUT, w.browser.execute(CloseTargetParams::new(target))).await;
        return;
    };
    let mut targets = w.targets.lock();
    if targets.live.contains(&key) {
        targets.pending.push(tab);
    } else {
        tab.interceptor.abort();
    }
}

/// Keeps `refused` among the context's refusals (at most [`MAX_REFUSALS_KEPT`] between two
/// calls; later ones are dropped).
pub fn record_refusal(refusals: &parking_lot::Mutex<Vec<RefusedRequest>>, refused: RefusedRequest) {
    let mut kept = refusals.lock();
    if kept.len() < MAX_REFUSALS_KEPT {
        kept.push(refused);
    }
}

/// The main frame's loader id and URL (`Page.getFrameTree`).
pub async fn main_frame(page: &TabPage) -> Result<(String, String), ToolError> {
    let tree = cdp(page, "Page.getFrameTree", json!({})).await?;
    let frame = &tree["frameTree"]["frame"];
    Ok((
        frame["loaderId"].as_str().unwrap_or_default().to_owned(),
        frame["url"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Reads and renders the page's accessibility tree.
pub async fn read_tree(page: &TabPage, max_nodes: usize, max_bytes: usize) -> Result<Rendered, ToolError> {
    let tree = cdp(page, "Accessibility.getFullAXTree", json!({})).await?;
    let nodes = tree["nodes"].as_array().cloned().unwrap_or_default();
    Ok(snapshot::render(&nodes, max_nodes, max_bytes))
}

/// Takes a snapshot of `tab` and keeps it as the tab's latest.
pub async fn take_snapshot(tab: &mut Tab, max_nodes: usize, max_bytes: usize) -> Result<Snapshot, ToolError> {
    let (loader_id, url) = main_frame(&tab.page).await?;
    let rendered = read_tree(&tab.page, max_nodes, max_bytes).await?;
    let id = format!("snap_{}", &uuid::Uuid::now_v7().simple().to_string()[16..]);
    let snap = Snapshot { id, loader_id, url, rendered, limits: (max_nodes, max_bytes) };
    tab.snapshot = Some(snap.clone());
    Ok(snap)
}

/// The element `reference` of `snapshot_id`, checked to still be current: the snapshot is its
/// tab's latest, the reference is in it, the page was not navigated since (same loader) and
/// its tree has the same structure. Errors: `stale_snapshot`, `not_found` (no such reference
/// in that snapshot).
pub async fn resolve<'t>(
    tabs: &'t Tabs,
    snapshot_id: &str,
    reference: &str,
    check_page: bool,
) -> Result<(&'t Tab, Element, String), ToolError> {
    let tab = tabs.by_snapshot(snapshot_id)?;
    let Some(snap) = tab.snapshot.as_ref() else {
        return Err(ToolError::new(ErrorCode::StaleSnapshot, "the tab has no snapshot"));
    };
    let element = snap.rendered.refs.get(reference).cloned().ok_or_else(|| {
        ToolError::new(ErrorCode::NotFound, format!("snapshot {snapshot_id} has no element {reference}"))
    })?;
    if check_page {
        let (loader, url) = main_frame(&tab.page).await?;
        if loader != snap.loader_id {
            return Err(ToolError::new(
                ErrorCode::StaleSnapshot,
                format!(
                    "the page of tab {} navigated since snapshot {snapshot_id} (now {url}): take a new snapshot",
                    tab.id
                ),
            )
            .with_details(json!({"snapshot_id": snapshot_id, "reason": "navigated", "url": url})));
        }
        let now = read_tree(&tab.page, snap.limits.0, snap.limits.1).await?;
        if now.digest != snap.rendered.digest {
            return Err(ToolError::new(
                ErrorCode::StaleSnapshot,
                format!("the page of tab {} changed since snapshot {snapshot_id}: take a new snapshot", tab.id),
            )
            .with_details(json!({"snapshot_id": snapshot_id, "reason": "changed"})));
        }
    }
    Ok((tab, element, snap.url.clone()))
}

/// Scrolls the element into view and returns the centre of its first content quad (CSS px).
async fn centre(page: &TabPage, backend_node_id: i64) -> Result<(f64, f64), ToolError> {
    let _ = cdp(page, "DOM.scrollIntoViewIfNeeded", json!({"backendNodeId": backend_node_id})).await;
    let quads = cdp(page, "DOM.getContentQuads", json!({"backendNodeId": backend_node_id})).await?;
    let quad: Vec<f64> = quads["quads"][0].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
    if quad.len() != 8 {
        return Err(browser_error("the element has no box on the page (hidden or detached)"));
    }
    let x = (quad[0] + quad[2] + quad[4] + quad[6]) / 4.0;
    let y = (quad[1] + quad[3] + quad[5] + quad[7]) / 4.0;
    Ok((x, y))
}

/// Listeners opened before an action, to tell afterwards whether it started a navigation.
pub struct Watch {
    loads: BoxStream<'static, Value>,
    started: BoxStream<'static, Value>,
    loader: String,
}

/// Starts watching `page` for a navigation an action may start.
async fn watch(page: &TabPage) -> Result<Watch, ToolError> {
    let (loader, _) = main_frame(page).await?;
    let loads = page.events("Page.loadEventFired").await?;
    let started = page.events("Page.frameStartedLoading").await?;
    Ok(Watch { loads, started, loader })
}

/// How long after an action a frame must start loading for the action to count as having
/// started a navigation (then its `load` is awaited, up to [`LOAD_TIMEOUT`]).
pub const NAVIGATION_START_WAIT: Duration = Duration::from_millis(150);

/// Waits until the page settles after an action: when a frame starts loading within
/// [`NAVIGATION_START_WAIT`] (or the main frame's loader changed meanwhile), up to
/// [`LOAD_TIMEOUT`] for the `load` event. Returns whether a load happened.
async fn settle(page: &TabPage, mut w: Watch) -> bool {
    let started = tokio::time::timeout(NAVIGATION_START_WAIT, w.started.next()).await.is_ok();
    let changed = matches!(main_frame(page).await, Ok((loader, _)) if loader != w.loader);
    if started || changed { tokio::time::timeout(LOAD_TIMEOUT, w.loads.next()).await.is_ok() } else { false }
}

/// Navigates `page` to `url` and waits for its `load` event. Returns (loaded, error text of a
/// failed navigation such as `net::ERR_BLOCKED_BY_CLIENT`).
pub async fn navigate(page: &TabPage, url: &str) -> Result<(bool, Option<String>), ToolError> {
    let loads = page.events("Page.loadEventFired").await?;
    let answer = cdp(page, "Page.navigate", json!({"url": url})).await?;
    if let Some(error) = answer["errorText"].as_str().filter(|e| !e.is_empty()) {
        return Ok((false, Some(error.to_owned())));
    }
    let same_document = answer.get("loaderId").is_none_or(Value::is_null);
    if same_document {
        return Ok((true, None));
    }
    let mut loads = loads;
    let loaded = tokio::time::timeout(LOAD_TIMEOUT, loads.next()).await.is_ok();
    Ok((loaded, None))
}

/// Clicks the element's centre with the left button. Returns whether a new document loaded.
/// Errors: `stale_snapshot` (details `reason` `obscured`, and `element_at_point`) when the
/// click would land on something else ([`reaches`]) — checked before the mouse moves there,
/// again after (the move tells the page where the press will come, and a page could put a
/// layer there in its `mousemove` handler) and once more with the button held (then released
/// away, so no click happens); `browser_error` when the check cannot run.
pub async fn click(page: &TabPage, backend_node_id: i64) -> Result<bool, ToolError> {
    let (x, y) = centre(page, backend_node_id).await?;
    // The hit test takes whole pixels: the click goes to the point tested.
    let (x, y) = (x.round(), y.round());
    let obscured = async || {
        ToolError::new(
            ErrorCode::StaleSnapshot,
            "something else lies over the element where it would be clicked (a dialog, a banner, another frame): \
             take a new snapshot",
        )
        .with_details(json!({"reason": "obscured", "element_at_point": element_at(page, x, y).await}))
    };
    if !reaches(page, backend_node_id, x, y).await? {
        return Err(obscured().await);
    }
    let w = watch(page).await?;
    mouse(page, "mouseMoved", x, y, "none", 0).await?;
    if !reaches(page, backend_node_id, x, y).await? {
        return Err(obscured().await);
    }
    mouse(page, "mousePressed", x, y, "left", 1).await?;
    // Once more with the button held: a layer laid there since the last check took the press,
    // but no click — a click needs the release on the same element, so the button is released
    // away from the point (the top-left corner).
    if !reaches(page, backend_node_id, x, y).await? {
        mouse(page, "mouseReleased", 0.0, 0.0, "left", 0).await?;
        return Err(obscured().await);
    }
    mouse(page, "mouseReleased", x, y, "left", 0).await?;
    Ok(settle(page, w).await)
}

pub(crate) use mira_core::devtools::{CLEAR_FIELD, REACHES, SELECT_OPTION};

/// The node a hit test finds at viewport point `(x, y)` (CSS pixels, as `DOM.getContentQuads`
/// gives them and `Input.dispatchMouseEvent` takes them), if any. `DOM.getNodeForLocation`
/// takes document coordinates, so the visual viewport's offset in the document is added (the
/// scroll, and a pinch zoom's pan on an attached browser); it passes over `pointer-events:
/// none` as a click does.
async fn node_at(page: &TabPage, x: f64, y: f64) -> Result<Option<i64>, ToolError> {
    let m = cdp(page, "Page.getLayoutMetrics", json!({})).await?;
    let v = &m["cssVisualViewport"];
    let (sx, sy) = (v["pageX"].as_f64().unwrap_or(0.0), v["pageY"].as_f64().unwrap_or(0.0));
    let at = json!({"x": (x + sx).round() as i64, "y": (y + sy).round() as i64});
    Ok(cdp(page, "DOM.getNodeForLocation", at).await.ok().and_then(|found| found["backendNodeId"].as_i64()))
}

/// Whether a click at `(x, y)` reaches the element: the browser's own hit test there
/// ([`node_at`]) finds the element or a node inside it ([`REACHES`]). A page that lays
/// something over the approved element — a transparent layer, another site's frame — would
/// otherwise take its click. The comparison runs in an isolated world of the main frame
/// (`Page.createIsolatedWorld`), whose built-ins the page cannot rewrite; a node of another
/// frame cannot even be resolved there (not reached). Errors: `browser_error` when the check
/// itself cannot run (an attached browser's runner too old to allow it, a page gone).
async fn reaches(page: &TabPage, backend_node_id: i64, x: f64, y: f64) -> Result<bool, ToolError> {
    let Some(hit) = node_at(page, x, y).await? else { return Ok(false) };
    if hit == backend_node_id {
        return Ok(true);
    }
    let cannot = |e: ToolError| browser_error(format!("what lies under the click could not be checked: {}", e.message));
    let tree = cdp(page, "Page.getFrameTree", json!({})).await.map_err(cannot)?;
    let frame = tree["frameTree"]["frame"]["id"].clone();
    let world = cdp(page, "Page.createIsolatedWorld", json!({"frameId": frame, "worldName": "mira-reaches"}))
        .await
        .map_err(cannot)?;
    let context = world["executionContextId"].clone();
    let resolve = async |id: i64| {
        let r = cdp(page, "DOM.resolveNode", json!({"backendNodeId": id, "executionContextId": context})).await?;
        r["object"]["objectId"].as_str().map(str::to_owned).ok_or_else(|| browser_error("the node has no object"))
    };
    let element = resolve(backend_node_id).await.map_err(cannot)?;
    let answer = match resolve(hit).await {
        Ok(hit) => {
            let answer = cdp(
                page,
                "Runtime.callFunctionOn",
                json!({"objectId": element, "functionDeclaration": REACHES, "arguments": [{"objectId": hit}],
                       "returnByValue": true}),
            )
            .await;
            let _ = cdp(page, "Runtime.releaseObject", json!({"objectId": hit})).await;
            Some(answer)
        }
        // A node of another frame (or gone since): not the element.
        Err(_) => None,
    };
    let _ = cdp(page, "Runtime.releaseObject", json!({"objectId": element})).await;
    let Some(answer) = answer else { return Ok(false) };
    let answer = answer.map_err(cannot)?;
    if answer.get("exceptionDetails").is_some_and(|e| !e.is_null()) {
        return Err(browser_error("what lies under the click could not be checked: the check failed in the page"));
    }
    Ok(answer["result"]["value"] == json!(true))
}

async fn call_on(page: &TabPage, backend_node_id: i64, function: &str, args: Value) -> Result<Value, ToolError> {
    let resolved = cdp(page, "DOM.resolveNode", json!({"backendNodeId": backend_node_id})).await?;
    let object_id = resolved["object"]["objectId"]
        .as_str()
        .ok_or_else(|| browser_error("the element cannot be resolved in the page"))?
        .to_owned();
    let out = cdp(
        page,
        "Runtime.callFunctionOn",
        json!({"objectId": object_id, "functionDeclaration": function, "arguments": args, "returnByValue": true}),
    )
    .await?;
    let _ = cdp(page, "Runtime.releaseObject", json!({"objectId": object_id})).await;
    if out.get("exceptionDetails").is_some_and(|e| !e.is_null()) {
        return Err(browser_error("the page refused the action"));
    }
    Ok(out["result"]["value"].clone())
}

/// Focuses the element, empties it when `clear`, and inserts `text` as typed input.
pub async fn type_text(page: &TabPage, backend_node_id: i64, text: &str, clear: bool) -> Result<(), ToolError> {
    cdp(page, "DOM.focus", json!({"backendNodeId": backend_node_id})).await?;
    if clear {
        call_on(page, backend_node_id, CLEAR_FIELD, json!([])).await?;
    }
    cdp(page, "Input.insertText", json!({"text": text})).await?;
    Ok(())
}

/// Chooses the option `value` (by value, label or text) of a `<select>`. Returns the chosen
/// value. Errors: `browser_error` (not a select, or no such option).
pub async fn select(page: &TabPage, backend_node_id: i64, value: &str) -> Result<String, ToolError> {
    let chosen = call_on(page, backend_node_id, SELECT_OPTION, json!([{"value": value}])).await?;
    chosen
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| browser_error(format!("the element is not a select with an option {value:?}")))
}

/// The keys `browser_press` accepts: (name, DOM `key`, DOM `code`, key code, text).
pub const KEYS: [(&str, &str, &str, i64, &str); 14] = [
    ("Enter", "Enter", "Enter", 13, "\r"),
    ("Tab", "Tab", "Tab", 9, ""),
    ("Escape", "Escape", "Escape", 27, ""),
    ("Backspace", "Backspace", "Backspace", 8, ""),
    ("Delete", "Delete", "Delete", 46, ""),
    ("Space", " ", "Space", 32, " "),
    ("ArrowUp", "ArrowUp", "ArrowUp", 38, ""),
    ("ArrowDown", "ArrowDown", "ArrowDown", 40, ""),
    ("ArrowLeft", "ArrowLeft", "ArrowLeft", 37, ""),
    ("ArrowRight", "ArrowRight", "ArrowRight", 39, ""),
    ("PageUp", "PageUp", "PageUp", 33, ""),
    ("PageDown", "PageDown", "PageDown", 34, ""),
    ("Home", "Home", "Home", 36, ""),
    ("End", "End", "End", 35, ""),
];

/// Presses and releases `key` (one of [`KEYS`]) in the focused element. Returns whether a new
/// document loaded.
pub async fn press(page: &TabPage, key: &str) -> Result<bool, ToolError> {
    let Some((_, dom_key, code, key_code, text)) = KEYS.iter().find(|k| k.0 == key) else {
        return Err(ToolError::new(ErrorCode::InvalidField, format!("unknown key {key:?}")));
    };
    let w = watch(page).await?;
    let mut down = json!({"type": if text.is_empty() { "rawKeyDown" } else { "keyDown" }, "key": dom_key, "code": code,
        "windowsVirtualKeyCode": key_code, "nativeVirtualKeyCode": key_code});
    if !text.is_empty() {
        down["text"] = json!(text);
    }
    cdp(page, "Input.dispatchKeyEvent", down).await?;
    cdp(
        page,
        "Input.dispatchKeyEvent",
        json!({"type": "keyUp", "key": dom_key, "code": code, "windowsVirtualKeyCode": key_code, "nativeVirtualKeyCode": key_code}),
    )
    .await?;
    Ok(settle(page, w).await)
}

/// A screenshot of the viewport, one image pixel per CSS pixel.
#[derive(Debug, Clone)]
pub struct Capture {
    /// The PNG.
    pub png: Vec<u8>,
    /// Device pixels per CSS pixel of the viewport it was taken of (`Page.getLayoutMetrics`:
    /// `visualViewport` over `cssVisualViewport`; `window.devicePixelRatio` when not pinch
    /// zoomed): 2 on a HiDPI screen, 1 in the managed browser.
    pub device_pixel_ratio: f64,
    /// The clip's origin: the visual viewport's offset in the document ([`scroll_offset`]) in
    /// the same `Page.getLayoutMetrics` answer that gave the clip, unchanged after the capture.
    /// What the image shows starts there; an action at a point of it compares this offset.
    pub offset: (f64, f64),
    /// The clip's width and height in CSS pixels (whole pixels, rounded down): the size the
    /// PNG has when it holds one image pixel per CSS pixel.
    pub size: (u32, u32),
}

/// The visual viewport of a `Page.getLayoutMetrics` answer in CSS pixels (`cssVisualViewport`):
/// its offset in the document (`pageX`, `pageY`: the scroll, plus a pinch zoom's pan on an
/// attached browser) and its size without scroll bars (`clientWidth`, `clientHeight`).
fn css_visual_viewport(metrics: &Value) -> Option<((f64, f64), (f64, f64))> {
    let css = &metrics["cssVisualViewport"];
    let number = |key: &str| css[key].as_f64().filter(|n| n.is_finite());
    Some(((number("pageX")?, number("pageY")?), (number("clientWidth")?, number("clientHeight")?)))
}

/// Whether the viewport moved between two readings of its offset: by a whole CSS pixel or more
/// either way.
fn moved(then: (f64, f64), now: (f64, f64)) -> bool {
    (now.0 - then.0).abs() >= 1.0 || (now.1 - then.1).abs() >= 1.0
}

/// A PNG screenshot of the viewport in CSS pixels, the space the point actions' coordinates
/// (`Input.dispatchMouseEvent`) and the hit test ([`node_at`]) use. `Page.captureScreenshot`
/// alone captures device pixels — twice as many each way on a HiDPI screen (an attached
/// browser on a Retina display) — so a point read from such an image would be clicked at
/// twice its place. The capture is clipped to the visual viewport (`Page.getLayoutMetrics`,
/// `cssVisualViewport`: its offset in the document and its size, without scroll bars) at
/// `scale` 1 / (device pixels per CSS pixel), which Chromium applies on top of the screen's
/// own factor (no emulation: the page sees no resize). The offset is read again after the
/// capture: a page that scrolled (or a person who panned a pinch zoom) while it was taken
/// is refused, since the image's fixed layers and the offset recorded with it might not
/// agree. Errors: `browser_error`.
pub async fn screenshot(page: &TabPage) -> Result<Capture, ToolError> {
    use base64::Engine as _;
    let metrics = cdp(page, "Page.getLayoutMetrics", json!({})).await?;
    let device_width = metrics["visualViewport"]["clientWidth"].as_f64().filter(|n| n.is_finite());
    let (Some(((x, y), (width, height))), Some(device_width)) = (css_visual_viewport(&metrics), device_width) else {
        return Err(browser_error("Page.getLayoutMetrics did not give the viewport's size in CSS pixels"));
    };
    if width < 1.0 || height < 1.0 || device_width <= 0.0 {
        return Err(browser_error(format!("the viewport is {width}x{height} CSS pixels: nothing to capture")));
    }
    let device_pixel_ratio = device_width / width;
    let (width, height) = (width.floor(), height.floor());
    let params = json!({"format": "png", "captureBeyondViewport": false,
                        "clip": {"x": x, "y": y, "width": width, "height": height,
                                 "scale": 1.0 / device_pixel_ratio}});
    let shot = cdp(page, "Page.captureScreenshot", params).await?;
    let after = scroll_offset(page).await?;
    if moved((x, y), after) {
        return Err(browser_error(format!(
            "the page scrolled while the screenshot was taken (from {x},{y} to {},{} CSS pixels): take a new screenshot",
            after.0, after.1
        )));
    }
    let data = shot["data"].as_str().ok_or_else(|| browser_error("Page.captureScreenshot returned no data"))?;
    let png = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| browser_error(format!("the screenshot is not base64: {e}")))?;
    // Both at least 1 and finite (checked above), below any real viewport's u32 bound.
    let size = (width as u32, height as u32);
    Ok(Capture { png, device_pixel_ratio, offset: (x, y), size })
}

/// The page's title (the accessibility root's name is not needed: `Target.getTargetInfo`).
pub async fn title(page: &TabPage) -> String {
    match cdp(page, "Target.getTargetInfo", json!({})).await {
        Ok(info) => info["targetInfo"]["title"].as_str().unwrap_or_default().to_owned(),
        Err(_) => String::new(),
    }
}

/// The page's scroll offset as a screenshot sees it: the visual viewport's offset in the
/// document (`Page.getLayoutMetrics`, `cssVisualViewport` `pageX`, `pageY`, CSS pixels) — the
/// origin of [`screenshot`]'s clip. It is the layout viewport's scroll plus a pinch zoom's pan
/// (an attached browser), which moves what the image shows without scrolling the layout
/// viewport. Errors: `browser_error`.
pub async fn scroll_offset(page: &TabPage) -> Result<(f64, f64), ToolError> {
    let m = cdp(page, "Page.getLayoutMetrics", json!({})).await?;
    css_visual_viewport(&m)
        .map(|(offset, _)| offset)
        .ok_or_else(|| browser_error("Page.getLayoutMetrics did not give the viewport's offset in CSS pixels"))
}

/// The tab whose latest screenshot is `shot_id`, checked to still show the same page: the
/// loader, the accessibility tree's structure and the scroll offset are those of the
/// screenshot, and every point of `points` lies inside it. Errors: `stale_snapshot` (details
/// `reason`: `navigated`, `changed` or `scrolled`), `invalid_field` (a point outside the image).
pub async fn resolve_shot<'t>(
    tabs: &'t Tabs,
    shot_id: &str,
    points: &[(f64, f64)],
) -> Result<(&'t Tab, Shot), ToolError> {
    let tab = tabs.list.iter().find(|t| t.shot.as_ref().is_some_and(|s| s.id == shot_id)).ok_or_else(|| {
        ToolError::new(
            ErrorCode::StaleSnapshot,
            format!(
                "{shot_id} is not the latest screenshot of an open tab (each action at a point uses its screenshot \
                 once): take a new screenshot (browser_screenshot)"
            ),
        )
    })?;
    let Some(shot) = tab.shot.clone() else {
        return Err(ToolError::new(ErrorCode::StaleSnapshot, "the tab has no screenshot"));
    };
    for &(x, y) in points {
        if !(x >= 0.0 && y >= 0.0 && x < f64::from(shot.size.0) && y < f64::from(shot.size.1)) {
            return Err(ToolError::new(
                ErrorCode::InvalidField,
                format!("({x}, {y}) is outside the {}x{} screenshot", shot.size.0, shot.size.1),
            ));
        }
    }
    let (loader, url) = main_frame(&tab.page).await?;
    let now = read_tree(&tab.page, super::DEFAULT_MAX_NODES as usize, super::MAX_SNAPSHOT_BYTES).await?;
    let scroll = scroll_offset(&tab.page).await?;
    let reason = if loader != shot.loader_id {
        Some("navigated")
    } else if now.digest != shot.digest {
        Some("changed")
    } else if moved(shot.scroll, scroll) {
        Some("scrolled")
    } else {
        None
    };
    if let Some(reason) = reason {
        let what = if reason == "scrolled" { "scrolled" } else { "changed" };
        return Err(ToolError::new(
            ErrorCode::StaleSnapshot,
            format!("the page of tab {} {what} since screenshot {shot_id} (now {url}): take a new screenshot", tab.id),
        )
        .with_details(json!({"screenshot_id": shot_id, "reason": reason})));
    }
    Ok((tab, shot))
}

/// The element at `(x, y)` of the viewport ([`node_at`]): `{node, role, name}` — its backend
/// node id and its accessibility role and name — best effort (null when none).
pub async fn element_at(page: &TabPage, x: f64, y: f64) -> Value {
    let Ok(Some(id)) = node_at(page, x, y).await else { return Value::Null };
    match cdp(page, "Accessibility.getPartialAXTree", json!({"backendNodeId": id, "fetchRelatives": false})).await {
        Ok(tree) => {
            let node = &tree["nodes"][0];
            json!({"node": id, "role": node["role"]["value"], "name": node["name"]["value"]})
        }
        Err(_) => Value::Null,
    }
}

/// One mouse event at `(x, y)`; `button` `none` for a move without a button held.
async fn mouse(page: &TabPage, kind: &str, x: f64, y: f64, button: &str, buttons: u8) -> Result<(), ToolError> {
    let mut params = json!({"type": kind, "x": x, "y": y, "button": button, "buttons": buttons});
    if kind == "mousePressed" || kind == "mouseReleased" {
        params["clickCount"] = json!(1);
    }
    cdp(page, "Input.dispatchMouseEvent", params).await.map(|_| ())
}

/// Clicks at `(x, y)` of the viewport with the left button. Returns whether a new document
/// loaded.
pub async fn click_at(page: &TabPage, x: f64, y: f64, expect: Option<&Value>) -> Result<bool, ToolError> {
    let w = watch(page).await?;
    press_at(page, x, y, expect).await?;
    Ok(settle(page, w).await)
}

/// Moves the mouse to `(x, y)`, presses and releases the left button. With `expect` (the
/// element the approval showed there, as [`element_at`]), the press is refused as
/// `stale_snapshot` (`element_changed`) when, once the mouse is there, another element lies
/// under it: the move tells the page where the press will come.
async fn press_at(page: &TabPage, x: f64, y: f64, expect: Option<&Value>) -> Result<(), ToolError> {
    mouse(page, "mouseMoved", x, y, "none", 0).await?;
    still_there(page, x, y, expect).await?;
    mouse(page, "mousePressed", x, y, "left", 1).await?;
    mouse(page, "mouseReleased", x, y, "left", 0).await
}

/// With `expect` (the element the approval showed at `(x, y)`, as [`element_at`]): refused as
/// `stale_snapshot` (`element_changed`) when another element lies there now.
async fn still_there(page: &TabPage, x: f64, y: f64, expect: Option<&Value>) -> Result<(), ToolError> {
    let Some(expect) = expect else { return Ok(()) };
    let now = element_at(page, x, y).await;
    if now == *expect {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::StaleSnapshot,
        "something else lay under the point once the mouse was there: take a new screenshot",
    )
    .with_details(json!({"reason": "element_changed", "approved": expect, "now": now})))
}

/// Turns the mouse wheel at `(x, y)`: `delta_x`, `delta_y` CSS pixels (positive: right, down),
/// one `mouseWheel` event. Returns whether a new document loaded. With `expect` (the element
/// the approval showed there, as [`element_at`]), the wheel is refused as `stale_snapshot`
/// (`element_changed`) when, once the mouse is there, another element lies under it: a page's
/// `mousemove` handler could slide another scrollable layer under the point.
pub async fn scroll_at(
    page: &TabPage,
    x: f64,
    y: f64,
    delta: (f64, f64),
    expect: Option<&Value>,
) -> Result<bool, ToolError> {
    let (delta_x, delta_y) = delta;
    let w = watch(page).await?;
    mouse(page, "mouseMoved", x, y, "none", 0).await?;
    still_there(page, x, y, expect).await?;
    cdp(
        page,
        "Input.dispatchMouseEvent",
        json!({"type": "mouseWheel", "x": x, "y": y, "deltaX": delta_x, "deltaY": delta_y}),
    )
    .await?;
    Ok(settle(page, w).await)
}

/// The key events of one character of typed text: (DOM `key`, DOM `code`, key code, text).
/// `\n` is Enter and `\t` is Tab; any other character is typed as itself.
fn key_of(c: char) -> (String, String, i64, String) {
    match c {
        '\n' => ("Enter".into(), "Enter".into(), 13, "\r".into()),
        '\t' => ("Tab".into(), "Tab".into(), 9, String::new()),
        c => {
            let code = if c.is_ascii_alphabetic() {
                format!("Key{}", c.to_ascii_uppercase())
            } else if c.is_ascii_digit() {
                format!("Digit{c}")
            } else if c == ' ' {
                "Space".into()
            } else {
                String::new()
            };
            let key_code = if c.is_ascii_alphanumeric() { i64::from(u32::from(c.to_ascii_uppercase())) } else { 0 };
            (c.to_string(), code, if c == ' ' { 32 } else { key_code }, c.to_string())
        }
    }
}

/// Clicks at `(x, y)` (which focuses what is there), then types `text` one character at a
/// time as key events (`keyDown` with the character's text, `keyUp`): a text field inserts
/// it, and a canvas app listening to key events sees each key. Returns whether a new document
/// loaded.
pub async fn type_at(page: &TabPage, x: f64, y: f64, text: &str, expect: Option<&Value>) -> Result<bool, ToolError> {
    let w = watch(page).await?;
    press_at(page, x, y, expect).await?;
    for c in text.chars() {
        let (key, code, key_code, text) = key_of(c);
        let mut down = json!({"type": if text.is_empty() { "rawKeyDown" } else { "keyDown" }, "key": key, "code": code,
            "windowsVirtualKeyCode": key_code, "nativeVirtualKeyCode": key_code});
        if !text.is_empty() {
            down["text"] = json!(text);
            down["unmodifiedText"] = json!(text);
        }
        cdp(page, "Input.dispatchKeyEvent", down).await?;
        cdp(
            page,
            "Input.dispatchKeyEvent",
            json!({"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": key_code,
                   "nativeVirtualKeyCode": key_code}),
        )
        .await?;
    }
    Ok(settle(page, w).await)
}

/// Mouse moves between the press and the release of a drag.
pub const DRAG_STEPS: u32 = 10;

/// Drags with the left button from `from` to `to`: a press at `from`, [`DRAG_STEPS`] moves
/// along the straight line with the button held, the release at `to`. A pointer drag (what
/// canvas apps see); an HTML5 drag-and-drop between elements is not started by it. Returns
/// whether a new document loaded.
pub async fn drag(page: &TabPage, from: (f64, f64), to: (f64, f64), expect: Option<&Value>) -> Result<bool, ToolError> {
    let w = watch(page).await?;
    mouse(page, "mouseMoved", from.0, from.1, "none", 0).await?;
    still_there(page, from.0, from.1, expect).await?;
    mouse(page, "mousePressed", from.0, from.1, "left", 1).await?;
    for step in 1..=DRAG_STEPS {
        let f = f64::from(step) / f64::from(DRAG_STEPS);
        let (x, y) = (from.0 + (to.0 - from.0) * f, from.1 + (to.1 - from.1) * f);
        mouse(page, "mouseMoved", x, y, "left", 1).await?;
    }
    mouse(page, "mouseReleased", to.0, to.1, "left", 0).await?;
    Ok(settle(page, w).await)
}
