//! External MCP: the client side of the Model Context Protocol, kept apart from the chain.
//!
//! Six stages, each with a stored fact: **Install** (`mcp_servers`), **Connect**
//! (`mcp_connections`: the initialize handshake, negotiated protocol version, capabilities,
//! `connecting|connected|failed|disconnected` with the last error and a stdio server's
//! stderr tail), **Discover** (`mcp_tools`: `tools/list` with pagination; a malformed tool is
//! rejected with its reason, the rest still work), **Agent Access** (`mcp_agent_access`,
//! per tool with a per-server default, surviving re-discovery), **Tool Exposure** (each
//! accessible tool is projected into the registry as `mcp:<serverId>:tool:<toolName>` by
//! [`tool`]), **Approval** (every call, whatever the annotations say:
//! [`crate::approval::policy`]). "Enabled" and "disclaimer accepted" sit along the way.
//!
//! [`McpManager`] owns one supervisor task per server ([`connection`]): it connects with a
//! handshake timeout, re-discovers on `notifications/tools/list_changed` (at most once per
//! [`McpSettings::rediscovery_interval`], however many arrive) and on every reconnect,
//! checks health with `ping`, and reconnects with exponential backoff after a
//! crash or a dropped HTTP session (rmcp re-initializes an expired Streamable HTTP session
//! itself). A server that fails never blocks another. The in-memory [`ServerState`] mirrors
//! the stored rows so the ladder ([`crate::exposure::ladder`]) can say synchronously which
//! MCP stage blocks a projected id; every change is written to the store first.
//!
//! **Replicas.** A stdio server is a child process of one replica: its owner, recorded in
//! `mcp_owners` (node id and process id, `held` or `lost`) beside the replica heartbeat. Only
//! the owner's supervisor spawns and connects it ([`crate::store::OwnerClaim`]: a replica
//! connects by itself only a server nobody holds or its own data directory held; it takes
//! another replica's server only on an explicit `POST …/connect`, and only once that replica
//! is `dead`, stale or `lost`), so the process never runs twice silently. Every other replica
//! re-reads the stored facts at each heartbeat ([`McpManager::spawn_refresh`]: new and
//! removed servers, settings, agent access, and for stdio servers it does not own the
//! owner's connection row and tool listing), projects the same tools, and reports them
//! available while the owner is alive and connected, `owner_gone` once the owner's heartbeat
//! stopped. A call claimed on such a replica is forwarded to the owner
//! ([`crate::cluster::forward`]). Streamable HTTP servers have no owner: any replica can
//! reach the URL, so each replica connects and discovers by itself (the stored connection
//! row is the last writer's view; each replica's availability is its own connection's).

pub mod call;
pub mod config;
pub mod connection;
pub mod definition;
pub mod discovery;
pub mod stages;
pub mod stdio;
pub mod tool;
pub mod watched_http;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::registry::{Explainer, Registry};
use crate::state::{McpConnectionState, McpOwnerState, McpToolStatus};
use crate::store::{McpConnectionRow, McpOwnerRow, McpServerRow, McpToolRow, OwnerClaim, Store};

pub use config::{HttpInput, SecretInput, StdioInput, TransportInput};
pub use stages::{McpStage, McpStageStatus, ServerView, ToolListing, ToolStatus};

pub use mira_core::ids::{
    MCP_ID_PREFIX as ID_PREFIX, mcp_projection_id as projection_id, parse_mcp_projection_id as parse_projection_id,
};

/// Longest error sentence kept on a connection (`last_error`, `discovery_error`; they may
/// quote the server), bytes.
pub const MAX_CONNECTION_ERROR_BYTES: usize = 4096;
/// Largest `server_info` or `capabilities` document kept, bytes of JSON; a larger one is kept
/// as `{"omitted": true, "bytes": n}` (both are the server's own words, shown in the view).
pub const MAX_SERVER_DOCUMENT_BYTES: usize = 16 * 1024;

/// Bounds what a server's own words may make a stored connection row: error sentences cut to
/// [`MAX_CONNECTION_ERROR_BYTES`], `server_info` and `capabilities` replaced when over
/// [`MAX_SERVER_DOCUMENT_BYTES`]. The connection row is rewritten at every state change.
fn bound_connection_texts(conn: &mut McpConnectionRow) {
    for text in [&mut conn.last_error, &mut conn.discovery_error].into_iter().flatten() {
        let cut = text.floor_char_boundary(MAX_CONNECTION_ERROR_BYTES);
        text.truncate(cut);
    }
    for doc in [&mut conn.server_info, &mut conn.capabilities].into_iter().flatten() {
        if doc.len() > MAX_SERVER_DOCUMENT_BYTES {
            *doc = serde_json::json!({"omitted": true, "bytes": doc.len()}).to_string();
        }
    }
}

/// Default of [`McpSettings::max_message_bytes`] (`--mcp-max-message-bytes`): 16 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 16 * 1024 * 1024;

/// Limits of the MCP client.
#[derive(Debug, Clone)]
pub struct McpSettings {
    /// Largest JSON-RPC message accepted from a server, bytes (a stdio line, an HTTP body or
    /// SSE event); larger ones are dropped without being held in memory.
    pub max_message_bytes: usize,
    /// Largest tool result kept, bytes of content; the rest is cut with a marker.
    pub max_output_bytes: usize,
    /// Time for spawning/reaching a server and the initialize handshake.
    pub connect_timeout: Duration,
    /// Interval of `ping` health checks on a connected server.
    pub health_interval: Duration,
    /// Shortest time between two discoveries of a connected server, prompted by its
    /// `notifications/tools/list_changed` (notifications within it are answered by one
    /// re-discovery at its end) or asked for through the API (which waits for it), so a server
    /// that floods them costs one `tools/list` (and one re-index of its tools) per interval.
    pub rediscovery_interval: Duration,
    /// First reconnect delay; doubles up to `backoff_max`, and starts over only after a
    /// connection that stayed up at least `backoff_max`.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Commands non-admin users may launch as stdio MCP servers, matched on real paths
    /// ([`crate::sandbox::mcp::allowed_program`]): an entry with a `/` names that program, a
    /// bare name the program it resolves to on the server's `PATH` (outside every workspace);
    /// `*` allows any. A stdio server is a process on the server host, so by default (empty)
    /// only admins may install one.
    pub stdio_allow: Vec<String>,
    /// The sandbox non-admins' stdio servers run in (set by the server at start).
    pub sandbox: Option<std::sync::Arc<crate::sandbox::Sandbox>>,
    /// Whether a non-admin's HTTP server may be at an internal address (`--allow-internal-urls`,
    /// set by the server at start). Otherwise every connection to it is checked when its name
    /// is resolved, so a DNS answer changed since the install (rebinding) is refused too.
    pub allow_internal_urls: bool,
}

impl McpSettings {
    /// Whether a non-admin may install a stdio server running `command`: the real path of the
    /// program it names is one the allow-list admits (see [`McpSettings::stdio_allow`]);
    /// `workspaces` are the real paths of the host's workspaces, where no bare entry may
    /// resolve. Errors are sentences.
    pub fn user_may_launch(&self, command: &str, workspaces: &[std::path::PathBuf]) -> std::result::Result<(), String> {
        let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        crate::sandbox::mcp::allowed_program(&self.stdio_allow, command, &path_env, workspaces).map(|_| ())
    }
}

impl Default for McpSettings {
    fn default() -> Self {
        Self {
            max_message_bytes: usize::try_from(DEFAULT_MAX_MESSAGE_BYTES).unwrap_or(usize::MAX),
            max_output_bytes: 1024 * 1024,
            connect_timeout: Duration::from_secs(30),
            health_interval: Duration::from_secs(30),
            rediscovery_interval: Duration::from_secs(2),
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            stdio_allow: Vec::new(),
            sandbox: None,
            allow_internal_urls: false,
        }
    }
}

/// The stored facts of one server, mirrored in memory.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// Install row.
    pub row: McpServerRow,
    /// Connection row.
    pub conn: McpConnectionRow,
    /// Discovered tools (ok, rejected, removed).
    pub tools: Vec<McpToolRow>,
    /// Per-tool agent-access switches.
    pub access: HashMap<String, bool>,
    /// The replica holding a stdio server's process, as this replica last read it (none for
    /// Streamable HTTP servers, and before any replica claimed it).
    pub owner: Option<OwnerView>,
}

/// Where a stdio server's process lives, seen from this replica.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OwnerView {
    /// The owner replica's node id.
    pub node_id: String,
    /// The owner's process id that claimed it.
    pub process_id: String,
    /// `held`, or `lost` once that replica was declared dead.
    pub state: McpOwnerState,
    /// The owner replica is alive with a heartbeat younger than `--replica-dead-after-secs`.
    pub live: bool,
    /// The owner is this replica.
    pub here: bool,
    /// Its internal base URL (for forwarded calls).
    #[serde(skip)]
    pub address: String,
}

impl OwnerView {
    fn of(row: &McpOwnerRow, replica: Option<&crate::store::ReplicaRow>, node: &crate::cluster::Node) -> Self {
        Self {
            node_id: row.node_id.clone(),
            process_id: row.process_id.clone(),
            state: row.state,
            live: row.node_id == node.id || replica.is_some_and(|r| node.is_alive(r)),
            here: row.node_id == node.id,
            address: replica.map(|r| r.address.clone()).unwrap_or_default(),
        }
    }
}

/// What a user who does not manage a deployment-wide server reads in place of its connection's
/// last error ([`ServerState::seen_by_user`]).
pub const ERROR_SHOWN_TO_MANAGERS: &str = "the connection failed (its details are shown to the server's managers)";

impl ServerState {
    /// The server as a user who may see but not manage it (a deployment-wide server, for a
    /// non-admin) sees it: its command's file name without arguments or working directory,
    /// its URL's scheme, host and port only, no stderr tail, and no error
    /// details — an admin's arguments, URL tokens and the server's own output are not
    /// everyone's. Secret values are never shown to anyone.
    pub fn seen_by_user(mut self) -> ServerState {
        if let Ok(mut config) = serde_json::from_str::<Value>(&self.row.config) {
            if let Some(stdio) = config.get_mut("stdio").and_then(Value::as_object_mut) {
                if let Some(command) = stdio.get("command").and_then(Value::as_str) {
                    let name = std::path::Path::new(command).file_name().and_then(|n| n.to_str()).unwrap_or(command);
                    stdio.insert("command".into(), Value::String(name.to_owned()));
                }
                stdio.remove("args");
                stdio.remove("cwd");
            }
            if let Some(http) = config.get_mut("http").and_then(Value::as_object_mut)
                && let Some(url) = http.get("url").and_then(Value::as_str).and_then(|u| url::Url::parse(u).ok())
            {
                // Scheme, host and port only: a key may sit in the path as well as in the
                // user info or the query.
                http.insert("url".into(), Value::String(url.origin().ascii_serialization()));
            }
            self.row.config = config.to_string();
        }
        self.conn.stderr_tail = None;
        if self.conn.last_error.is_some() {
            self.conn.last_error = Some(ERROR_SHOWN_TO_MANAGERS.to_owned());
        }
        if self.conn.discovery_error.is_some() {
            self.conn.discovery_error = Some(ERROR_SHOWN_TO_MANAGERS.to_owned());
        }
        self
    }

    /// The server as `user_id` sees it outside the server view: whole for its owner, else as
    /// [`ServerState::seen_by_user`] (a deployment-wide server, even for an admin: tool
    /// ladders, tool details and call errors reach every user of it).
    pub fn seen_by(self, user_id: &str) -> ServerState {
        if self.row.owner_id.as_deref() == Some(user_id) { self } else { self.seen_by_user() }
    }

    /// Whether the tool has agent access: off while a changed definition waits for review
    /// (`definition_changed`), else its own switch (`tool`), else the server default
    /// (`server_default`).
    pub fn access_of(&self, tool: &str) -> (bool, &'static str) {
        if self.under_review(tool).is_some() {
            return (false, definition::DEFINITION_CHANGED);
        }
        self.switch_of(tool)
    }

    /// The agent-access switch in force for the tool, ignoring reviews: its own switch, else
    /// the server default.
    pub fn switch_of(&self, tool: &str) -> (bool, &'static str) {
        match self.access.get(tool) {
            Some(on) => (*on, "tool"),
            None => (self.row.default_agent_access, "server_default"),
        }
    }

    /// The tool's row while its changed definition waits for review.
    pub fn under_review(&self, tool: &str) -> Option<&McpToolRow> {
        self.tools.iter().find(|t| t.name == tool && t.review_previous.is_some())
    }

    /// Whether a disclaimer still waits for acceptance.
    pub fn disclaimer_pending(&self) -> bool {
        self.row.disclaimer.is_some() && self.row.disclaimer_accepted_at.is_none()
    }

    /// Whether the server is a stdio process (owned by one replica).
    pub fn is_stdio(&self) -> bool {
        self.row.transport == "stdio"
    }

    /// The owner of a stdio server when this replica does not hold it.
    pub fn owner_elsewhere(&self) -> Option<&OwnerView> {
        self.owner.as_ref().filter(|o| self.is_stdio() && !(o.here && o.state == McpOwnerState::Held))
    }

    /// The owner of a stdio server whose process nobody runs now: its replica stopped
    /// sending heartbeats, or was declared dead (`lost`).
    pub fn owner_gone(&self) -> Option<&OwnerView> {
        self.owner_elsewhere().filter(|o| o.state == McpOwnerState::Lost || !o.live)
    }

    /// The sentence of `owner_gone` for this server.
    pub fn owner_gone_reason(&self, owner: &OwnerView) -> String {
        let id = &self.row.id;
        let why = if owner.state == McpOwnerState::Lost { "was declared dead" } else { "stopped sending heartbeats" };
        format!(
            "stage connect: the process of stdio MCP server {id} lived on replica {}, which {why}; nothing runs it \
             now (POST /v1/mcp/servers/{id}/connect starts it on a live replica)",
            owner.node_id
        )
    }
}

/// What a supervisor is told.
#[derive(Debug)]
pub enum Control {
    /// Connect now if enabled and not connected (resets the backoff); disconnect if disabled.
    Reconsider,
    /// Run `tools/list` (no sooner than the re-discovery interval after the last) and report.
    Discover(oneshot::Sender<std::result::Result<(), discovery::DiscoveryError>>),
    /// The server was removed: disconnect and end.
    Remove,
    /// An explicit connect (`POST …/connect`): like `Reconsider`, and a stdio server held by
    /// a gone replica may be taken over ([`OwnerClaim::Explicit`]).
    Connect,
    /// Another replica holds this stdio server now: disconnect (without writing the
    /// connection row, which is the owner's) and follow.
    Release,
}

/// One server's slot: its state, live connection and supervisor channel.
pub struct ServerSlot {
    /// Server id.
    pub id: String,
    /// Stored facts.
    pub state: RwLock<ServerState>,
    /// The live connection, while connected.
    pub live: Mutex<Option<connection::Live>>,
    control: mpsc::UnboundedSender<Control>,
    /// Projected tool names → hash of the projected spec.
    projected: Mutex<BTreeMap<String, String>>,
    /// Bumped after each local change of the stored server row or agent access, so that a
    /// refresh that read the store before that change does not apply its older view.
    changes: AtomicU64,
}

impl ServerSlot {
    /// Whether `user_id` may see the server (its owner, or everyone for deployment-wide).
    pub fn visible_to(&self, user_id: &str) -> bool {
        self.state.read().row.owner_id.as_deref().is_none_or(|o| o == user_id)
    }

    fn tell(&self, c: Control) {
        let _ = self.control.send(c);
    }

    fn changed_here(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }
}

/// This replica in the cluster, for ownership and forwarded connects.
struct ClusterLink {
    node: Arc<crate::cluster::Node>,
    client: reqwest::Client,
}

/// Where progress notifications of a running call go, and how many more may be stored: a
/// token bucket of [`PROGRESS_BURST`] refilled at [`PROGRESS_PER_SECOND`], at most
/// [`MAX_PROGRESS_EVENTS`] in all. Each stored notification is one write transaction and one
/// run event, so a server that floods them must not hold the store's writer or fill the run.
#[derive(Debug, Clone)]
pub(crate) struct ProgressRoute {
    pub run_id: String,
    pub invocation_id: String,
    pub tool_id: String,
    tokens: f64,
    refilled: std::time::Instant,
    stored: u32,
    skipped: u64,
}

/// Progress events stored at once before the rate applies.
pub const PROGRESS_BURST: f64 = 10.0;
/// Progress events stored per second of one call after the burst.
pub const PROGRESS_PER_SECOND: f64 = 4.0;
/// Most progress events stored for one call.
pub const MAX_PROGRESS_EVENTS: u32 = 1_000;
/// Longest progress message stored, bytes (cut at a character boundary).
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

impl ProgressRoute {
    /// A route with a full bucket.
    pub(crate) fn new(run_id: String, invocation_id: String, tool_id: String) -> Self {
        Self {
            run_id,
            invocation_id,
            tool_id,
            tokens: PROGRESS_BURST,
            refilled: std::time::Instant::now(),
            stored: 0,
            skipped: 0,
        }
    }

    /// Whether a notification arriving at `now` is stored; when it is, how many were skipped
    /// since the last one stored.
    pub(crate) fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * PROGRESS_PER_SECOND).min(PROGRESS_BURST);
        self.refilled = now;
        if self.tokens < 1.0 || self.stored >= MAX_PROGRESS_EVENTS {
            self.skipped += 1;
            return None;
        }
        self.tokens -= 1.0;
        self.stored += 1;
        Some(std::mem::take(&mut self.skipped))
    }
}

/// The MCP client side: servers, connections, projections.
pub struct McpManager {
    store: Store,
    registry: Arc<Registry>,
    secrets: crate::secret::SecretBox,
    settings: McpSettings,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    servers: RwLock<BTreeMap<String, Arc<ServerSlot>>>,
    /// Progress routes of running calls, by [`connection::progress_key`].
    pub(crate) progress: Mutex<HashMap<String, ProgressRoute>>,
    pub(crate) me: Weak<McpManager>,
    cluster: OnceLock<ClusterLink>,
    /// Servers removed through this replica: a refresh that read them before never adds them back.
    removed: Mutex<std::collections::HashSet<String>>,
}

/// An install request, validated by [`McpManager::install`].
#[derive(Debug, Clone)]
pub struct Install {
    /// Display name.
    pub name: String,
    /// Transport.
    pub transport: TransportInput,
    /// Disclaimer the owner must accept before the tools are used.
    pub disclaimer: Option<String>,
    /// Start enabled (default true).
    pub enabled: bool,
    /// Deployment-wide (admins only).
    pub deployment_wide: bool,
    /// Agent access of tools without their own switch.
    pub default_agent_access: bool,
    /// Per-request timeout, ms.
    pub request_timeout_ms: i64,
}

/// A change of `PATCH /v1/mcp/servers/{id}`.
#[derive(Debug, Clone, Default)]
pub struct Patch {
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// Server default of agent access.
    pub default_agent_access: Option<bool>,
    /// Per-request timeout, ms.
    pub request_timeout_ms: Option<i64>,
}

/// What a replica asks the owner of a stdio server to do ([`McpManager::ask_owner`]).
#[derive(Debug, Clone, Copy)]
enum OwnerAction {
    Connect,
    Discover,
}

impl OwnerAction {
    /// The last segment of the internal route, and the verb of messages.
    fn verb(self) -> &'static str {
        match self {
            OwnerAction::Connect => "connect",
            OwnerAction::Discover => "discover",
        }
    }
}

impl McpManager {
    /// A manager over `store`, projecting into `registry`; the secret key comes from
    /// `MIRA_SECRET_KEY` or `<data_dir>/secret.key`. Background work ends with `shutdown`.
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        data_dir: &Path,
        settings: McpSettings,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        let secrets = crate::secret::SecretBox::load(data_dir).map_err(|e| anyhow::anyhow!("MCP secret key: {e}"))?;
        // Streamable HTTP over https needs a process-wide rustls provider; installing it twice
        // is harmless (the second call reports the first).
        crate::net::install_tls_provider();
        let manager = Arc::new_cyclic(|me| Self {
            store,
            registry: registry.clone(),
            secrets,
            settings,
            shutdown,
            tasks: TaskTracker::new(),
            servers: RwLock::new(BTreeMap::new()),
            progress: Mutex::new(HashMap::new()),
            me: me.clone(),
            cluster: OnceLock::new(),
            removed: Mutex::new(std::collections::HashSet::new()),
        });
        let explainer: Arc<dyn Explainer> = manager.clone();
        registry.add_explainer(ID_PREFIX, Arc::downgrade(&explainer));
        Ok(manager)
    }

    /// Names this replica (before [`McpManager::start`]): stdio servers are then claimed
    /// in `mcp_owners` before they are spawned. Without it every server is this process's.
    /// Fails only when the HTTP client for forwarded connects cannot be built.
    pub fn set_node(&self, node: Arc<crate::cluster::Node>) -> anyhow::Result<()> {
        let client = crate::net::cluster_client()?;
        let _ = self.cluster.set(ClusterLink { node, client });
        Ok(())
    }

    /// Loads every stored server, projects its stored tools and starts its supervisor.
    pub async fn start(&self) -> anyhow::Result<()> {
        let owners = self.owner_views().await?;
        for row in self.store.all_mcp_servers().await? {
            let mut state = self.load_state(row).await?;
            state.owner = owners.get(&state.row.id).cloned();
            self.add_slot(state);
        }
        Ok(())
    }

    /// The owner of every claimed stdio server, seen from this replica.
    async fn owner_views(&self) -> crate::store::StoreResult<HashMap<String, OwnerView>> {
        let Some(link) = self.cluster.get() else { return Ok(HashMap::new()) };
        let replicas: HashMap<String, crate::store::ReplicaRow> =
            self.store.list_replicas().await?.into_iter().map(|r| (r.node_id.clone(), r)).collect();
        Ok(self
            .store
            .mcp_owners()
            .await?
            .into_iter()
            .map(|o| (o.server_id.clone(), OwnerView::of(&o, replicas.get(&o.node_id), &link.node)))
            .collect())
    }

    /// Keeps this replica in line with what other replicas stored: re-reads the servers at
    /// every heartbeat (`--heartbeat-secs`) until shutdown (see the module docs). Postgres
    /// only: SQLite has one replica.
    pub fn spawn_refresh(self: &Arc<Self>) {
        let Some(link) = self.cluster.get() else { return };
        if self.store.backend() != crate::store::Backend::Postgres {
            return;
        }
        let every = link.node.config.heartbeat();
        let me = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(manager) = me.upgrade() else { return };
                if let Err(e) = manager.refresh().await {
                    tracing::warn!(error = %e, "re-reading the MCP servers other replicas stored failed");
                }
            }
        });
    }

    /// One refresh (see [`McpManager::spawn_refresh`]).
    pub async fn refresh(&self) -> anyhow::Result<()> {
        // What this replica had before reading: a server installed here meanwhile is not
        // "removed elsewhere", a change made here meanwhile is newer than what is read.
        let before: HashMap<String, u64> =
            self.servers.read().iter().map(|(id, s)| (id.clone(), s.changes.load(Ordering::SeqCst))).collect();
        let owners = self.owner_views().await?;
        let rows = self.store.all_mcp_servers().await?;
        let ids: std::collections::HashSet<String> = rows.iter().map(|r| r.id.clone()).collect();
        for id in before.keys().filter(|id| !ids.contains(*id)) {
            // Removed through another replica.
            let Some(slot) = self.servers.write().remove(id) else { continue };
            slot.state.write().row.enabled = false;
            self.sync_projections(&slot);
            slot.tell(Control::Remove);
        }
        for row in rows {
            let id = row.id.clone();
            let Some(slot) = self.slot(&id) else {
                if before.contains_key(&id) || self.removed.lock().contains(&id) {
                    continue;
                }
                // Installed through another replica.
                let mut state = self.load_state(row).await?;
                state.owner = owners.get(&id).cloned();
                self.add_slot(state);
                continue;
            };
            let owner = owners.get(&id).cloned();
            let stdio = row.transport == "stdio";
            let follower = stdio && owner.as_ref().is_some_and(|o| !(o.here && o.state == McpOwnerState::Held));
            let access: HashMap<String, bool> =
                self.store.mcp_access(&id).await?.into_iter().map(|a| (a.tool_name, a.enabled)).collect();
            let mirrored = if follower {
                Some((self.store.mcp_connection(&id).await?, self.store.mcp_tools(&id).await?))
            } else {
                None
            };
            let row_changed = {
                let mut state = slot.state.write();
                let fresh = before.get(&id).is_some_and(|g| *g == slot.changes.load(Ordering::SeqCst));
                let row_changed = fresh && state.row.updated_at != row.updated_at;
                if fresh {
                    state.row = row;
                    state.access = access;
                }
                state.owner = owner;
                if let Some((conn, tools)) = mirrored {
                    if let Some(conn) = conn {
                        state.conn = conn;
                    }
                    state.tools = tools;
                }
                row_changed
            };
            self.sync_projections(&slot);
            if row_changed {
                slot.tell(Control::Reconsider);
            }
            if follower && slot.live.lock().is_some() {
                slot.tell(Control::Release);
            }
        }
        Ok(())
    }

    /// Claims a stdio server's process for this replica before its supervisor spawns it
    /// (always true without a cluster node, and for Streamable HTTP servers).
    pub(crate) async fn claim(&self, slot: &ServerSlot, how: OwnerClaim) -> Result<bool> {
        let Some(link) = self.cluster.get() else { return Ok(true) };
        if !slot.state.read().is_stdio() {
            return Ok(true);
        }
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(link.node.config.dead_after()).unwrap_or(chrono::Duration::seconds(10));
        let node = &link.node;
        let mine = self
            .store
            .claim_mcp_owner(&slot.id, &node.id, &node.process_id, how, &crate::ids::format_time(cutoff))
            .await?;
        let owner = self.owner_views().await?.remove(&slot.id);
        slot.state.write().owner = owner;
        Ok(mine)
    }

    /// Waits (at most `limit`) for every supervisor to end after shutdown.
    pub async fn stopped(&self, limit: Duration) {
        self.tasks.close();
        let _ = tokio::time::timeout(limit, self.tasks.wait()).await;
    }

    /// The limits in force.
    pub fn settings(&self) -> &McpSettings {
        &self.settings
    }

    async fn load_state(&self, row: McpServerRow) -> anyhow::Result<ServerState> {
        let conn = self.store.mcp_connection(&row.id).await?.unwrap_or_else(|| McpConnectionRow {
            server_id: row.id.clone(),
            state: McpConnectionState::Disconnected,
            ..McpConnectionRow::default()
        });
        let tools = self.store.mcp_tools(&row.id).await?;
        let access = self.store.mcp_access(&row.id).await?.into_iter().map(|a| (a.tool_name, a.enabled)).collect();
        Ok(ServerState { row, conn, tools, access, owner: None })
    }

    fn add_slot(&self, state: ServerState) -> Arc<ServerSlot> {
        let (tx, rx) = mpsc::unbounded_channel();
        let slot = Arc::new(ServerSlot {
            id: state.row.id.clone(),
            state: RwLock::new(state),
            live: Mutex::new(None),
            control: tx,
            projected: Mutex::new(BTreeMap::new()),
            changes: AtomicU64::new(0),
        });
        self.servers.write().insert(slot.id.clone(), slot.clone());
        self.sync_projections(&slot);
        if let Some(me) = self.me.upgrade() {
            let s = slot.clone();
            self.tasks.spawn(async move { connection::supervise(me, s, rx).await });
        }
        slot
    }

    /// The slot of a server the user may see, else 404.
    pub fn slot_for(&self, user_id: &str, id: &str) -> Result<Arc<ServerSlot>> {
        self.servers.read().get(id).filter(|s| s.visible_to(user_id)).cloned().ok_or(Error::NotFound("mcp server"))
    }

    /// A server's slot by id (any owner).
    pub fn slot(&self, id: &str) -> Option<Arc<ServerSlot>> {
        self.servers.read().get(id).cloned()
    }

    /// The servers a user may see, by id.
    pub fn visible(&self, user_id: &str) -> Vec<Arc<ServerSlot>> {
        self.servers.read().values().filter(|s| s.visible_to(user_id)).cloned().collect()
    }

    /// Whether `user` may change the server (see [`McpManager::may_manage`]), and so sees all of
    /// it ([`ServerState::seen_by_user`]).
    pub fn manages(slot: &ServerSlot, user_id: &str, is_admin: bool) -> bool {
        Self::may_manage(slot, user_id, is_admin).is_ok()
    }

    /// 403 unless `user` may change the server: its owner, or an admin for a
    /// deployment-wide server.
    fn may_manage(slot: &ServerSlot, user_id: &str, is_admin: bool) -> Result<()> {
        match slot.state.read().row.owner_id.as_deref() {
            Some(owner) if owner == user_id => Ok(()),
            Some(_) => Err(Error::NotFound("mcp server")),
            None if is_admin => Ok(()),
            None => Err(Error::Forbidden("a deployment-wide MCP server is managed by admins".into())),
        }
    }

    /// Installs a server (Install) and, when enabled, starts connecting in the background.
    ///
    /// Errors: 400 `invalid_request` (name, transport, disclaimer, timeout); 403 when a
    /// non-admin asks for a deployment-wide server or an unlisted stdio command; 403
    /// `server_env_reference` when a non-admin names a `from_env` value.
    pub async fn install(&self, user_id: &str, is_admin: bool, req: Install) -> Result<Arc<ServerSlot>> {
        config::check_env_references(&req.transport, is_admin)?;
        config::validate_name(&req.name)?;
        if req.deployment_wide && !is_admin {
            return Err(Error::Forbidden("only admins install deployment-wide MCP servers".into()));
        }
        if req.disclaimer.as_ref().is_some_and(|d| d.len() > config::MAX_DISCLAIMER_BYTES || d.trim().is_empty()) {
            return Err(Error::bad_request(
                ErrorCode::InvalidRequest,
                format!("disclaimer must be 1 to {} bytes", config::MAX_DISCLAIMER_BYTES),
            ));
        }
        validate_timeout(req.request_timeout_ms)?;
        if let config::TransportInput::Stdio(s) = &req.transport
            && !is_admin
        {
            let (own, others) =
                crate::sandbox::mcp::host_workspaces(&self.store, user_id).await.map_err(Error::Internal)?;
            let (own_real, others_real) = (own.clone(), others.clone());
            let workspaces: Vec<std::path::PathBuf> = own.into_iter().chain(others).collect();
            if let Err(why) = self.settings.user_may_launch(&s.command, &workspaces) {
                return Err(Error::Forbidden(format!(
                    "a stdio MCP server runs `{}` on the server host; only admins may install it unless the \
                     deployment allows that command (--mcp-stdio-allow / MIRA_MCP_STDIO_ALLOW): {why}",
                    s.command
                )));
            }
            // Its cwd is granted read-write: one of the user's workspaces (or a folder in one)
            // by its real path. Checked again at every launch.
            if let Some(cwd) = &s.cwd {
                crate::sandbox::mcp::cwd_in_workspaces(cwd, &own_real, &others_real).map_err(Error::Forbidden)?;
            }
        }
        let id = crate::ids::new_id("mcp");
        let sealed = config::seal(&req.transport, &self.secrets, &id)?;
        let now = crate::ids::now();
        let row = McpServerRow {
            id: id.clone(),
            owner_id: (!req.deployment_wide).then(|| user_id.to_owned()),
            installed_by: user_id.to_owned(),
            name: req.name,
            transport: sealed.transport.to_owned(),
            config: sealed.config.to_string(),
            secrets_key_id: sealed.secrets.as_ref().map(|_| self.secrets.key_id().to_owned()),
            secrets: sealed.secrets,
            disclaimer: req.disclaimer,
            disclaimer_accepted_at: None,
            disclaimer_accepted_by: None,
            enabled: req.enabled,
            default_agent_access: req.default_agent_access,
            request_timeout_ms: req.request_timeout_ms,
            created_at: now.clone(),
            updated_at: now,
        };
        let holder = self
            .cluster
            .get()
            .filter(|_| row.transport == "stdio")
            .map(|link| (link.node.id.as_str(), link.node.process_id.as_str()));
        self.store.insert_mcp_server_held(&row, holder).await?;
        let conn =
            McpConnectionRow { server_id: id, state: McpConnectionState::Disconnected, ..McpConnectionRow::default() };
        Ok(self.add_slot(ServerState { row, conn, tools: Vec::new(), access: HashMap::new(), owner: None }))
    }

    /// Enables/disables a server and changes its defaults. Disabling disconnects it and
    /// removes its projections; enabling reconnects it.
    pub async fn patch(&self, user_id: &str, is_admin: bool, id: &str, patch: Patch) -> Result<Arc<ServerSlot>> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        if let Some(ms) = patch.request_timeout_ms {
            validate_timeout(ms)?;
        }
        let mut row = slot.state.read().row.clone();
        if let Some(e) = patch.enabled {
            row.enabled = e;
        }
        if let Some(d) = patch.default_agent_access {
            row.default_agent_access = d;
        }
        if let Some(ms) = patch.request_timeout_ms {
            row.request_timeout_ms = ms;
        }
        row.updated_at = crate::ids::now();
        self.store.update_mcp_server(&row).await?;
        slot.changed_here();
        slot.state.write().row = row;
        self.sync_projections(&slot);
        slot.tell(Control::Reconsider);
        Ok(slot)
    }

    /// Removes a server: disconnects it, drops its projections and its stored rows.
    pub async fn remove(&self, user_id: &str, is_admin: bool, id: &str) -> Result<()> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        self.store.delete_mcp_server(id).await?;
        self.removed.lock().insert(id.to_owned());
        self.servers.write().remove(id);
        slot.state.write().row.enabled = false;
        self.sync_projections(&slot);
        slot.tell(Control::Remove);
        Ok(())
    }

    /// Asks the supervisor to connect now (no-op when connected). A stdio server held by
    /// another live replica is asked of that replica (forwarded with the cluster secret);
    /// one held by a gone replica is taken over here (an explicit connect is the only way a
    /// stdio server moves between replicas).
    ///
    /// Errors: 404, 403 (see [`McpManager::patch`]); 409 `mcp_server_disabled`; 503
    /// `owner_unreachable` when the live owner cannot be asked.
    pub async fn connect(&self, user_id: &str, is_admin: bool, id: &str) -> Result<Arc<ServerSlot>> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        if !slot.state.read().row.enabled {
            return Err(Error::conflict(
                ErrorCode::McpServerDisabled,
                format!("MCP server {id} is disabled; enable it with PATCH /v1/mcp/servers/{id} {{\"enabled\": true}}"),
                serde_json::json!({"server_id": id, "stage": "enabled"}),
            ));
        }
        if let Some((link, owner)) = self.live_owner_elsewhere(&slot, id).await? {
            self.ask_owner(link, &owner, id, OwnerAction::Connect).await?;
            return Ok(slot);
        }
        slot.tell(Control::Connect);
        Ok(slot)
    }

    /// The live owner replica of stdio server `id` when it is another replica (None on
    /// SQLite, for servers without an owner row, or when this replica holds it).
    async fn live_owner_elsewhere(&self, slot: &ServerSlot, id: &str) -> Result<Option<(&ClusterLink, OwnerView)>> {
        let Some(link) = self.cluster.get() else { return Ok(None) };
        let Some(owner) = self.owner_views().await?.remove(id) else { return Ok(None) };
        let mut state = slot.state.write();
        state.owner = Some(owner);
        Ok(state.owner_elsewhere().filter(|o| o.state == McpOwnerState::Held && o.live).cloned().map(|o| (link, o)))
    }

    /// Asks the live owner replica to connect or discover server `id` (`POST
    /// /internal/v1/mcp/connect` or `…/discover`). An error the owner answers with its own
    /// code (409 `mcp_not_connected`, `mcp_discovery_failed`…) is this answer's error too;
    /// an owner that cannot be reached is 503 `owner_unreachable`.
    async fn ask_owner(&self, link: &ClusterLink, owner: &OwnerView, id: &str, action: OwnerAction) -> Result<()> {
        let verb = action.verb();
        let unreachable = |why: String| Error::Unavailable {
            code: ErrorCode::OwnerUnreachable,
            message: format!(
                "the process of MCP server {id} lives on replica {} and it cannot be asked to {verb}: {why}",
                owner.node_id
            ),
        };
        let secret = link.node.config.secret.as_deref().filter(|s| !s.is_empty());
        let Some(secret) = secret else { return Err(unreachable("this replica has no --cluster-secret".into())) };
        let timeout = match action {
            OwnerAction::Connect => Duration::from_secs(10),
            OwnerAction::Discover => self.discovery_wait() + Duration::from_secs(5),
        };
        let url = format!("{}/internal/v1/mcp/{verb}", owner.address.trim_end_matches('/'));
        let response = link
            .client
            .post(&url)
            .header(crate::cluster::forward::SECRET_HEADER, secret)
            .json(&serde_json::json!({"server_id": id}))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| {
                // The client's error names the replica's address: for the log only.
                tracing::warn!(server = id, replica = %owner.address, error = %e, "the owner replica of an MCP server was not reached");
                unreachable(if e.is_timeout() { "it did not answer in time".into() } else { "it was not reached".into() })
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        if status == reqwest::StatusCode::CONFLICT {
            // The owner's own answer, passed on.
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            if let Ok(code) = serde_json::from_value::<ErrorCode>(body["error"]["code"].clone()) {
                let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
                return Err(Error::conflict(code, message, body["error"]["details"].clone()));
            }
        }
        Err(unreachable(format!("it answered {status}")))
    }

    /// The owner's side of a forwarded connect: asks the supervisor to connect now.
    /// Unknown servers are 404.
    pub fn connect_here(&self, id: &str) -> Result<()> {
        let slot = self.slot(id).ok_or(Error::NotFound("mcp server"))?;
        slot.tell(Control::Connect);
        Ok(())
    }

    /// Accepts the server's disclaimer (idempotent). 409 `no_disclaimer` when it has none.
    pub async fn accept_disclaimer(&self, user_id: &str, is_admin: bool, id: &str) -> Result<Arc<ServerSlot>> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        let mut row = slot.state.read().row.clone();
        if row.disclaimer.is_none() {
            return Err(Error::conflict(
                ErrorCode::NoDisclaimer,
                format!("MCP server {id} carries no disclaimer"),
                serde_json::json!({"server_id": id}),
            ));
        }
        if row.disclaimer_accepted_at.is_none() {
            row.disclaimer_accepted_at = Some(crate::ids::now());
            row.disclaimer_accepted_by = Some(user_id.to_owned());
            row.updated_at = crate::ids::now();
            self.store.update_mcp_server(&row).await?;
            slot.changed_here();
            slot.state.write().row = row;
            self.sync_projections(&slot);
        }
        Ok(slot)
    }

    /// Runs `tools/list` (no sooner than [`McpSettings::rediscovery_interval`] after the last discovery) and waits for it (at most the server's request timeout plus
    /// 5 s). 409 `mcp_not_connected` when the server is not connected.
    pub async fn discover(&self, user_id: &str, is_admin: bool, id: &str) -> Result<Arc<ServerSlot>> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        if let Some((link, owner)) = self.live_owner_elsewhere(&slot, id).await? {
            // The process lives on the owner: it lists the tools and stores them; this
            // replica then re-reads what was stored.
            self.ask_owner(link, &owner, id, OwnerAction::Discover).await?;
            self.refresh()
                .await
                .map_err(|e| Error::Internal(format!("re-reading the discovered tools failed: {e}")))?;
            return Ok(slot);
        }
        self.discover_slot(slot, id).await
    }

    /// The owner's side of a forwarded discovery (`POST /internal/v1/mcp/discover`): runs
    /// `tools/list` (no sooner than the re-discovery interval after the last). Unknown servers
    /// are 404.
    pub async fn discover_here(&self, id: &str) -> Result<()> {
        let slot = self.slot(id).ok_or(Error::NotFound("mcp server"))?;
        self.discover_slot(slot, id).await.map(|_| ())
    }

    /// How long a discovery asked for through the API may take: the wait for the re-discovery
    /// interval and the whole listing ([`discovery::MAX_DISCOVERY_TIME`]).
    fn discovery_wait(&self) -> Duration {
        self.settings.rediscovery_interval + discovery::MAX_DISCOVERY_TIME
    }

    async fn discover_slot(&self, slot: Arc<ServerSlot>, id: &str) -> Result<Arc<ServerSlot>> {
        let not_connected = |why: String| {
            Error::conflict(ErrorCode::McpNotConnected, why, serde_json::json!({"server_id": id, "stage": "connect"}))
        };
        if slot.live.lock().is_none() {
            let state = slot.state.read().conn.state;
            return Err(not_connected(format!(
                "MCP server {id} is {state}; discovery needs a connection (POST /v1/mcp/servers/{id}/connect)"
            )));
        }
        let (tx, rx) = oneshot::channel();
        slot.tell(Control::Discover(tx));
        let wait = self.discovery_wait() + Duration::from_secs(5);
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Ok(()))) => Ok(slot),
            Ok(Ok(Err(e))) => Err(Error::conflict(
                ErrorCode::McpDiscoveryFailed,
                format!("tools/list failed: {e}"),
                serde_json::json!({"server_id": id, "stage": "discover"}),
            )),
            Ok(Err(_)) => Err(not_connected(format!("MCP server {id} disconnected during discovery"))),
            Err(_) => Err(Error::conflict(
                ErrorCode::McpDiscoveryFailed,
                "tools/list did not finish in time",
                serde_json::json!({"server_id": id, "stage": "discover"}),
            )),
        }
    }

    /// Sets one tool's agent access (the tool need not be discovered yet: a switch set
    /// for a name applies when a server lists it). Turning it on accepts the definition
    /// listed now and ends a `definition_changed` review; with `definition_sha256`, only if
    /// that is the fingerprint of the definition listed now (409 `definition_changed`
    /// otherwise, nothing changed), so a person accepts exactly the definition they read.
    pub async fn set_agent_access(
        &self,
        user_id: &str,
        is_admin: bool,
        id: &str,
        tool: &str,
        enabled: bool,
        definition_sha256: Option<&str>,
    ) -> Result<Arc<ServerSlot>> {
        let slot = self.slot_for(user_id, id)?;
        Self::may_manage(&slot, user_id, is_admin)?;
        if tool.is_empty() || tool.len() > 256 {
            return Err(Error::bad_request(ErrorCode::InvalidRequest, "tool_name must be 1 to 256 bytes"));
        }
        if let Some(expected) = definition_sha256 {
            let current = slot
                .state
                .read()
                .tools
                .iter()
                .find(|t| t.name == tool && t.status != McpToolStatus::Removed)
                .map(definition::fingerprint);
            if current.as_deref() != Some(expected) {
                return Err(Error::conflict(
                    ErrorCode::DefinitionChanged,
                    format!(
                        "the definition of {tool} listed now is not the one given (definition_sha256 {expected}); \
                         nothing changed — read the current definition and try again"
                    ),
                    serde_json::json!({"server_id": id, "tool": tool, "current_sha256": current}),
                ));
            }
        }
        self.store.set_mcp_access(id, tool, enabled, user_id).await?;
        slot.changed_here();
        {
            let mut state = slot.state.write();
            state.access.insert(tool.to_owned(), enabled);
            if enabled && let Some(t) = state.tools.iter_mut().find(|t| t.name == tool) {
                t.review_previous = None;
                t.review_since = None;
            }
        }
        self.sync_projections(&slot);
        Ok(slot)
    }

    /// Refuses a frozen call of projected tool `tool_id` (canonical input `frozen`) whose
    /// definition is no longer the current, accepted one (`stale_definition`). Calls of
    /// servers or tools that are gone pass (other stages refuse them).
    pub fn check_frozen(&self, tool_id: &str, frozen: &Value) -> std::result::Result<(), crate::registry::ToolError> {
        let Some((server_id, tool)) = parse_projection_id(tool_id) else { return Ok(()) };
        let Some(slot) = self.slot(server_id) else { return Ok(()) };
        let state = slot.state.read();
        match state.tools.iter().find(|t| t.name == tool && t.status == McpToolStatus::Ok) {
            Some(current) => definition::check_frozen(tool_id, frozen, current),
            None => Ok(()),
        }
    }

    /// Brings the registry in line with the slot's state: every discovered (`ok`) tool with
    /// agent access on an enabled server whose disclaimer is settled is registered, nothing
    /// else. A changed definition is re-registered.
    pub fn sync_projections(&self, slot: &Arc<ServerSlot>) {
        let removed = !self.servers.read().contains_key(&slot.id);
        let state = slot.state.read().clone();
        let mut want: BTreeMap<String, tool::McpTool> = BTreeMap::new();
        if !removed && state.row.enabled && !state.disclaimer_pending() {
            for t in state.tools.iter().filter(|t| t.status == McpToolStatus::Ok) {
                if state.access_of(&t.name).0 {
                    match tool::McpTool::new(&state, t, self.me.clone()) {
                        Ok(tool) => {
                            want.insert(t.name.clone(), tool);
                        }
                        Err(e) => tracing::warn!(server = %slot.id, tool = %t.name, error = %e, "tool not projected"),
                    }
                }
            }
        }
        let mut projected = slot.projected.lock();
        let names: Vec<String> = projected.keys().cloned().collect();
        for name in names {
            let keep = want.get(&name).is_some_and(|t| projected.get(&name) == Some(&t.fingerprint()));
            if !keep {
                self.registry.unregister(&projection_id(&slot.id, &name));
                projected.remove(&name);
            }
        }
        for (name, tool) in want {
            if projected.contains_key(&name) {
                continue;
            }
            let fingerprint = tool.fingerprint();
            match self.registry.register(Arc::new(tool)) {
                Ok(()) => {
                    projected.insert(name, fingerprint);
                }
                Err(e) => tracing::warn!(server = %slot.id, tool = %name, error = %e, "projection refused"),
            }
        }
    }

    /// Whether a projected tool is registered now.
    pub fn is_projected(&self, server_id: &str, tool: &str) -> bool {
        self.slot(server_id).is_some_and(|s| s.projected.lock().contains_key(tool))
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn secrets(&self) -> &crate::secret::SecretBox {
        &self.secrets
    }

    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Writes the connection row and mirrors it.
    pub(crate) async fn save_conn(&self, slot: &ServerSlot, mut conn: McpConnectionRow) {
        bound_connection_texts(&mut conn);
        if let Err(e) = self.store.save_mcp_connection(&conn).await {
            tracing::warn!(server = %slot.id, error = %e, "storing the MCP connection state failed");
        }
        slot.state.write().conn = conn;
    }
}

impl Explainer for McpManager {
    fn why_absent(&self, id: &str, user_id: &str) -> Option<(String, String)> {
        let (server_id, tool) = parse_projection_id(id)?;
        let Some(slot) = self.slot(server_id).filter(|s| s.visible_to(user_id)) else {
            return Some((
                "mcp_server_not_installed".into(),
                format!("stage install: no MCP server {server_id} is installed for you (removed, or never installed)"),
            ));
        };
        let state = slot.state.read().clone().seen_by(user_id);
        Some(stages::why_not_projected(&state, tool))
    }

    fn detail(&self, id: &str, user_id: &str) -> Option<Value> {
        let (server_id, tool) = parse_projection_id(id)?;
        let slot = self.slot(server_id).filter(|s| s.visible_to(user_id))?;
        let view = stages::tool_view(self, &slot, tool, user_id);
        serde_json::to_value(view).ok()
    }

    fn check_frozen(&self, id: &str, input: &Value) -> std::result::Result<(), crate::registry::ToolError> {
        McpManager::check_frozen(self, id, input)
    }
}

fn validate_timeout(ms: i64) -> Result<()> {
    if (100..=3_600_000).contains(&ms) {
        Ok(())
    } else {
        Err(Error::bad_request(ErrorCode::InvalidRequest, "request_timeout_ms must be 100 to 3600000"))
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_PROGRESS_EVENTS, ProgressRoute};
    use std::time::{Duration, Instant};

    #[test]
    fn a_servers_words_on_its_connection_row_are_bounded() {
        let mut conn = crate::store::McpConnectionRow {
            last_error: Some("é".repeat(10_000)),
            discovery_error: Some("short".into()),
            server_info: Some(serde_json::json!({"name": "x".repeat(20_000)}).to_string()),
            capabilities: Some(r#"{"tools":{}}"#.into()),
            ..Default::default()
        };
        super::bound_connection_texts(&mut conn);
        assert_eq!(conn.last_error.as_deref().map(str::len), Some(4096));
        assert_eq!(conn.discovery_error.as_deref(), Some("short"));
        assert_eq!(conn.server_info.as_deref(), Some(r#"{"bytes":20011,"omitted":true}"#));
        assert_eq!(conn.capabilities.as_deref(), Some(r#"{"tools":{}}"#));
    }

    #[test]
    fn progress_is_stored_in_a_burst_then_at_the_rate_up_to_the_cap() {
        let mut route = ProgressRoute::new("r".into(), "i".into(), "t".into());
        let t0 = Instant::now();
        let stored = (0..100).filter(|_| route.admit(t0).is_some()).count();
        assert_eq!(stored, 10, "the burst");
        // A second later: four more, the first of them counting the 90 skipped.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(route.admit(t1), Some(90));
        assert_eq!((0..10).filter(|_| route.admit(t1).is_some()).count(), 3);
        // However long the call runs, at most the cap in all.
        let mut total = 14;
        for s in 2..2_000 {
            total += (0..10).filter(|_| route.admit(t0 + Duration::from_secs(s)).is_some()).count();
        }
        assert_eq!(total, MAX_PROGRESS_EVENTS as usize);
    }
}
