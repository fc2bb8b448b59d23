//! Connections: the user's accounts that make the dynamic capabilities usable (a GitHub
//! token, a mail account…). The contract's dynamic tools exist on the public surface for
//! everyone, but each is *available* only while one of the caller's connections of its kind
//! (their own first, then shared ones an admin made) is enabled, was checked, is not rate
//! limited, and grants the permission the tool needs. Otherwise the ladder names why, with one
//! of the stable reasons `no_connection`, `reauth_required`, `scope_missing` (naming the
//! scope), `connection_unreachable`, `rate_limited` (with the reset time),
//! `card_changed` (an expert's pinned agent card changed), `browser_gone` (an attached
//! browser or every tab it grants is gone) or `permission_unknown` — a permission that could not be verified is never available.
//!
//! A [`Driver`] per [`ConnectionKind`] validates settings and credentials and runs the check (a
//! live round trip answering who the credential is and each permission's [`Access`]). The
//! [`ConnectionHub`] keeps every connection and its last check in memory (availability answers
//! without I/O), reloads what other replicas wrote every few seconds (on a timer of its own,
//! never waiting for a check), and runs the periodic checks: a replica claims a due check with
//! a compare-and-set on `next_check_at`, so one replica checks each connection, and only when
//! it has a place for it ([`CheckSettings`]: a few at once, fewer per owner, so one user's
//! connections that never answer delay neither the reload nor other users' checks). An
//! execution reads its connection's row again before it opens the credential
//! ([`ConnectionHub::open_frozen_current`]), so a change made through another replica counts
//! at once, not after the next reload. Credentials are JSON objects sealed with the server's
//! [`SecretBox`] (associated data: the connection id); they are opened only to check or to
//! execute a call, and are never returned, logged, or put into errors, outputs or evidence.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::availability::Availability;
use crate::error::ErrorCode;
pub use crate::net::AddressRule;
use crate::registry::ToolError;
use crate::secret::{SecretBox, SecretError};
use crate::store::{ConnectionRow, Store};

/// What a connection connects to. Each kind has one [`Driver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionKind {
    /// A GitHub (or GitHub Enterprise) account: REST API with a token.
    Github,
    /// A mail account: IMAP to read, SMTP to send.
    Mail,
    /// An external expert: an A2A agent whose agent card is pinned by hash.
    Expert,
    /// The user's own running Chromium, attached at its remote-debugging endpoint: the
    /// attached-browser tools act in the tabs it grants, on the origins it allows.
    Browser,
}

impl ConnectionKind {
    /// Every kind.
    pub const ALL: [ConnectionKind; 4] =
        [ConnectionKind::Github, ConnectionKind::Mail, ConnectionKind::Expert, ConnectionKind::Browser];

    /// The snake_case name (`github`, `mail`, `expert`, `browser`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionKind::Github => "github",
            ConnectionKind::Mail => "mail",
            ConnectionKind::Expert => "expert",
            ConnectionKind::Browser => "browser",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What a check (or a call) found out about one permission of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Access {
    /// The credential grants it (verified).
    Granted,
    /// The credential lacks it: ladder reason `scope_missing`.
    Missing {
        /// The scope or permission that would grant it (`repo`, `pull_requests:write`…).
        scope: String,
    },
    /// It could not be verified: ladder reason `permission_unknown` (never available).
    Unknown {
        /// Why.
        message: String,
    },
    /// The credential was refused: ladder reason `reauth_required`.
    ReauthRequired {
        /// What the server said.
        message: String,
    },
    /// The server could not be reached: ladder reason `connection_unreachable`.
    Unreachable {
        /// Why.
        message: String,
    },
    /// The far side is no longer the one the user approved (an expert's agent card whose hash
    /// differs from the pinned one): ladder reason `card_changed`, until the user approves it
    /// again.
    CardChanged {
        /// What changed.
        message: String,
    },
    /// An attached browser cannot be reached at its debugging endpoint, its connection
    /// closed, or no tab it grants is open: ladder reason `browser_gone`, until the browser
    /// (and a granted tab) is back.
    BrowserGone {
        /// Why.
        message: String,
    },
}

impl Access {
    /// Ok for [`Access::Granted`], else the ladder reason (code and sentence) for a tool of
    /// connection `name` needing `permission`.
    fn reason(&self, name: &str, permission: &str) -> Result<(), (ErrorCode, String)> {
        match self {
            Access::Granted => Ok(()),
            Access::Missing { scope } => Err((
                ErrorCode::ScopeMissing,
                format!("connection {name} lacks {permission}: its credential needs the scope {scope}"),
            )),
            Access::Unknown { message } => Err((
                ErrorCode::PermissionUnknown,
                format!("whether connection {name} grants {permission} cannot be verified: {message}"),
            )),
            Access::ReauthRequired { message } => Err((
                ErrorCode::ReauthRequired,
                format!("connection {name}'s credential was refused ({message}); replace it"),
            )),
            Access::Unreachable { message } => {
                Err((ErrorCode::ConnectionUnreachable, format!("connection {name} cannot be reached: {message}")))
            }
            Access::CardChanged { message } => {
                Err((ErrorCode::CardChanged, format!("connection {name} changed since it was approved: {message}")))
            }
            Access::BrowserGone { message } => {
                Err((ErrorCode::BrowserGone, format!("the browser of connection {name} is gone: {message}")))
            }
        }
    }
}

/// What a check found: who the credential is and each permission's [`Access`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckReport {
    /// Who the credential is for (a GitHub login, a mail address), when the server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Every permission of the kind ([`Driver::permissions`]) with what was found.
    pub access: BTreeMap<String, Access>,
    /// The end of a rate limit the check ran into (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limited_until: Option<String>,
    /// What the far side offers to grant, for the owner to choose from (an attached browser:
    /// its open page tabs `[{target_id, url, title, granted}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub inventory: Option<Value>,
}

/// A connection opened for a check or a call: validated settings and the opened credential.
/// `credential` is secret: never log it or put it into an error, output or evidence.
#[derive(Clone)]
pub struct Opened {
    /// `conn_…`
    pub id: String,
    /// Owner; None = shared.
    pub owner_id: Option<String>,
    /// The kind's validated settings.
    pub settings: Value,
    /// The credential object.
    pub credential: Value,
    /// [`Connection::fingerprint`] of what was opened.
    pub fingerprint: String,
    /// The addresses a call may reach through it: [`AddressRule::PublicOnly`] for a
    /// non-admin's own connection unless the deployment allows internal addresses. Clients
    /// apply it when they connect (`net::with_rule`, `net::resolve_host`), not only when the
    /// settings were stored, so a DNS answer changed since (rebinding) is refused too.
    pub address_rule: AddressRule,
}

/// The connection a call was frozen with: its id and [`Connection::fingerprint`]. Both go into
/// the canonical input (`connection`/`connection_id` and `connection_fingerprint`), so an
/// approval binds the settings and the credential it was shown with, not only the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `conn_…`
    pub id: String,
    /// [`Connection::fingerprint`] at freeze time.
    pub fingerprint: String,
}

/// The canonical input's key holding [`Resolved::fingerprint`].
pub const FINGERPRINT_KEY: &str = "connection_fingerprint";

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").field("id", &self.id).field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// One kind of connection: how its settings and credentials are validated and how it is
/// checked. Implemented by the tool domains (`tools::github`, `tools::mail`,
/// `tools::expert`).
#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// The kind.
    fn kind(&self) -> ConnectionKind;
    /// Every permission this kind reports, each with a sentence (shown in the connections
    /// view).
    fn permissions(&self) -> &'static [(&'static str, &'static str)];
    /// Validates the non-secret settings and returns their canonical form. Errors carry 400
    /// codes.
    fn validate_settings(&self, settings: Value) -> Result<Value, ToolError>;
    /// Validates a credential object. Errors carry 400 codes and never echo the credential.
    fn validate_credential(&self, credential: &Value) -> Result<(), ToolError>;
    /// The URLs the server will reach for these settings; for non-admins each must be a
    /// public address (the internal-address rule of every user-given URL).
    fn endpoints(&self, settings: &Value) -> Vec<String>;
    /// A live round trip: who the credential is and each permission's [`Access`].
    async fn check(&self, conn: &Opened) -> CheckReport;
}

/// How often each enabled connection is checked again (the periodic health check).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(300);

/// Periodic checks of one replica running at once ([`CheckSettings::at_once`]).
pub const CHECKS_AT_ONCE: usize = 8;

/// Periodic checks of one owner's connections (the shared ones count as one owner) running
/// at once on one replica ([`CheckSettings::per_owner`]).
pub const CHECKS_PER_OWNER: usize = 2;

/// How the periodic checks run. A replica claims a due check only when it has a free place
/// for it (under `at_once`, and under `per_owner` for the connection's owner), so one user's
/// connections that never answer hold at most `per_owner` places for `timeout` each while
/// other users' checks go on, and a replica that is full leaves due checks to the others.
/// The reload of the in-memory table runs on its own timer and never waits for a check.
#[derive(Debug, Clone, Copy)]
pub struct CheckSettings {
    /// How often each enabled connection is checked again ([`CHECK_INTERVAL`]).
    pub interval: Duration,
    /// Longest a check may take before it counts as unreachable ([`CHECK_TIMEOUT`]).
    pub timeout: Duration,
    /// Periodic checks running at once on this replica ([`CHECKS_AT_ONCE`]).
    pub at_once: usize,
    /// Periodic checks of one owner running at once on this replica ([`CHECKS_PER_OWNER`]).
    pub per_owner: usize,
}

impl Default for CheckSettings {
    fn default() -> Self {
        Self { interval: CHECK_INTERVAL, timeout: CHECK_TIMEOUT, at_once: CHECKS_AT_ONCE, per_owner: CHECKS_PER_OWNER }
    }
}

/// A tool's need: a connection of `kind` granting `permission`.
#[derive(Debug, Clone)]
pub struct ToolNeed {
    /// The tool.
    pub tool_id: String,
    /// The kind of connection.
    pub kind: ConnectionKind,
    /// The permission ([`Driver::permissions`]).
    pub permission: &'static str,
}

/// Longest a check may take before it counts as unreachable.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// One connection as the hub holds it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// `conn_…`
    pub id: String,
    /// Owner; None = shared.
    pub owner_id: Option<String>,
    /// Kind.
    pub kind: ConnectionKind,
    /// Display name.
    pub name: String,
    /// Validated, non-secret settings.
    pub settings: Value,
    /// Whether calls may use it.
    pub enabled: bool,
    /// The last check's report, with what calls learned since (None = never checked).
    pub report: Option<CheckReport>,
    /// When the last check ran (RFC 3339).
    pub checked_at: Option<String>,
    /// End of a rate limit (RFC 3339).
    pub rate_limited_until: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    sealed: String,
    key_id: String,
    next_check_at: String,
}

impl Connection {
    fn from_row(row: ConnectionRow) -> Option<Connection> {
        let kind = ConnectionKind::parse(&row.kind)?;
        Some(Connection {
            id: row.id,
            owner_id: row.owner_id,
            kind,
            name: row.name,
            settings: serde_json::from_str(&row.settings_json).unwrap_or(Value::Null),
            enabled: row.enabled,
            report: row.check_json.as_deref().and_then(|j| serde_json::from_str(j).ok()),
            checked_at: row.checked_at,
            rate_limited_until: row.rate_limited_until,
            created_at: row.created_at,
            updated_at: row.updated_at,
            sealed: row.credential_ciphertext,
            key_id: row.credential_key_id,
            next_check_at: row.next_check_at,
        })
    }

    /// SHA-256 (hex, first 32 digits) over the kind, the settings and the sealed credential:
    /// it changes whenever the settings or the credential are replaced (a re-sealed credential
    /// counts as replaced), so a frozen call can tell that its connection is still the one
    /// its approval was shown.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [self.kind.as_str(), &self.settings.to_string(), &self.key_id, &self.sealed] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        let digest = h.finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `user_id` may use (and see) it: their own, or shared.
    pub fn visible_to(&self, user_id: &str) -> bool {
        self.owner_id.as_deref().is_none_or(|o| o == user_id)
    }

    /// Ok when a call needing `permission` can use it now, else the ladder reason.
    pub fn usable(&self, permission: &str) -> Result<(), (ErrorCode, String)> {
        if !self.enabled {
            return Err((ErrorCode::NoConnection, format!("connection {} is disabled", self.name)));
        }
        if let Some(until) = self.rate_limited_until.as_deref().filter(|u| *u > crate::ids::now().as_str()) {
            return Err((ErrorCode::RateLimited, format!("connection {} is rate limited until {until}", self.name)));
        }
        let Some(report) = &self.report else {
            return Err((ErrorCode::PermissionUnknown, format!("connection {} has not been checked yet", self.name)));
        };
        match report.access.get(permission) {
            Some(access) => access.reason(&self.name, permission),
            None => Err((
                ErrorCode::PermissionUnknown,
                format!("the last check of connection {} did not report {permission}", self.name),
            )),
        }
    }
}

/// The connections of every user in memory, their checks, and the drivers (see the module
/// docs).
pub struct ConnectionHub {
    store: Store,
    secrets: Result<SecretBox, SecretError>,
    drivers: HashMap<ConnectionKind, Arc<dyn Driver>>,
    connections: RwLock<Vec<Connection>>,
    needs: RwLock<Vec<ToolNeed>>,
    checking: Mutex<std::collections::HashSet<String>>,
    /// Held by a reload from its read to its swap: reloads run one after the other, so an
    /// older snapshot never replaces a newer one.
    reloading: tokio::sync::Mutex<()>,
    checks: CheckSettings,
    /// Periodic checks running on this replica, by owner (`None` = shared).
    periodic: Mutex<HashMap<Option<String>, usize>>,
    refresh: Duration,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    addresses: crate::net::AddressPolicy,
}

impl ConnectionHub {
    /// The hub over `store`, sealing with `secrets` (the key MCP and search secrets use),
    /// checking each connection as `checks` says and reloading every `refresh`.
    /// `allow_internal` (`--allow-internal-urls`) lifts the internal-address rule for every
    /// connection. Nothing runs until [`ConnectionHub::start`].
    pub fn new(
        store: Store,
        secrets: Result<SecretBox, SecretError>,
        drivers: Vec<Arc<dyn Driver>>,
        checks: CheckSettings,
        refresh: Duration,
        allow_internal: bool,
    ) -> Arc<ConnectionHub> {
        Arc::new(ConnectionHub {
            store,
            secrets,
            drivers: drivers.into_iter().map(|d| (d.kind(), d)).collect(),
            connections: RwLock::new(Vec::new()),
            needs: RwLock::new(Vec::new()),
            checking: Mutex::new(std::collections::HashSet::new()),
            reloading: tokio::sync::Mutex::new(()),
            checks: CheckSettings { at_once: checks.at_once.max(1), per_owner: checks.per_owner.max(1), ..checks },
            periodic: Mutex::new(HashMap::new()),
            refresh,
            tasks: Mutex::new(Vec::new()),
            addresses: crate::net::AddressPolicy::new(allow_internal),
        })
    }

    /// Declares that tool `tool_id` needs `permission` of a `kind` connection (each domain's
    /// `register` does this for its tools; the connections view lists them).
    pub fn declare_need(&self, tool_id: &str, kind: ConnectionKind, permission: &'static str) {
        self.needs.write().push(ToolNeed { tool_id: tool_id.to_owned(), kind, permission });
    }

    /// The declared needs of the tools of `kind`, by tool id.
    pub fn needs(&self, kind: ConnectionKind) -> Vec<ToolNeed> {
        let mut out: Vec<ToolNeed> = self.needs.read().iter().filter(|n| n.kind == kind).cloned().collect();
        out.sort_by(|a, b| a.tool_id.cmp(&b.tool_id));
        out
    }

    /// The driver of `kind`.
    pub fn driver(&self, kind: ConnectionKind) -> Option<&Arc<dyn Driver>> {
        self.drivers.get(&kind)
    }

    /// The credential box, or why it is unavailable (`secret_key_unavailable`).
    pub fn secrets(&self) -> Result<&SecretBox, ToolError> {
        self.secrets
            .as_ref()
            .map_err(|e| ToolError::new(ErrorCode::SecretKeyUnavailable, format!("credentials cannot be sealed: {e}")))
    }

    /// Loads the stored connections, then starts the periodic reload and checks until
    /// `shutdown`: two tasks, so the reload never waits for a check.
    pub async fn start(self: &Arc<Self>, shutdown: CancellationToken) {
        self.reload().await;
        let this = Arc::clone(self);
        let stop = shutdown.clone();
        let reload = tokio::spawn(async move { this.reload_loop(stop).await });
        let this = Arc::clone(self);
        let checks = tokio::spawn(async move { this.check_loop(shutdown).await });
        self.tasks.lock().extend([reload, checks]);
    }

    /// True once the background work has ended (it ends with the shutdown token).
    pub fn background_finished(&self) -> bool {
        self.tasks.lock().iter().all(tokio::task::JoinHandle::is_finished)
    }

    /// When a connection changed or checked now is next due for its periodic check (RFC 3339).
    pub fn next_check_at(&self) -> String {
        crate::ids::now_plus_ms(u64::try_from(self.checks.interval.as_millis()).unwrap_or(u64::MAX))
    }

    async fn reload_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut reload = tokio::time::interval(self.refresh.max(Duration::from_secs(1)));
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = reload.tick() => self.reload().await,
            }
        }
    }

    /// Starts due periodic checks while there are free places (see [`CheckSettings`]), every
    /// second and whenever a check ends. Each check is a task of its own (a driver that panics
    /// on a hostile answer ends its check, never this loop); the shutdown aborts them.
    async fn check_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.refresh.clamp(Duration::from_millis(100), Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut running = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                Some(done) = running.join_next(), if !running.is_empty() => {
                    if let Err(e) = done {
                        tracing::warn!(error = %e, "a connection check failed");
                    }
                }
            }
            self.start_due_checks(&mut running).await;
        }
        running.abort_all();
    }

    /// Claims and starts the due checks this replica has places for: owners take turns (each
    /// owner's most overdue first), so the first places go to as many owners as possible.
    async fn start_due_checks(self: &Arc<Self>, running: &mut tokio::task::JoinSet<()>) {
        let now = crate::ids::now();
        let mut due: Vec<Connection> = {
            let checking = self.checking.lock();
            self.connections
                .read()
                .iter()
                .filter(|c| c.enabled && c.next_check_at.as_str() <= now.as_str() && !checking.contains(&c.id))
                .cloned()
                .collect()
        };
        if due.is_empty() {
            return;
        }
        due.sort_by(|a, b| a.next_check_at.cmp(&b.next_check_at).then_with(|| a.id.cmp(&b.id)));
        // Round robin over owners: the i-th due check of every owner before any (i+1)-th.
        let mut turn: HashMap<Option<String>, usize> = HashMap::new();
        let mut order: Vec<(usize, usize, Connection)> = due
            .into_iter()
            .enumerate()
            .map(|(at, c)| {
                let n = turn.entry(c.owner_id.clone()).or_insert(0);
                *n += 1;
                (*n, at, c)
            })
            .collect();
        order.sort_by_key(|(n, at, _)| (*n, *at));
        for (_, _, conn) in order {
            let Some(place) = PeriodicPlace::take(self, conn.owner_id.clone()) else { continue };
            let next = self.next_check_at();
            let claimed = self.store.claim_connection_check(&conn.id, &conn.next_check_at, &next).await;
            if claimed.is_ok() {
                // Not due again here until the claimed time: claimed here, or by another
                // replica (whose time the next reload reads back) — not claimed again every
                // tick until then.
                if let Some(c) = self.connections.write().iter_mut().find(|c| c.id == conn.id) {
                    c.next_check_at.clone_from(&next);
                }
            }
            match claimed {
                Ok(true) => {
                    let this = Arc::clone(self);
                    running.spawn(async move {
                        let _place = place;
                        this.check(&conn).await;
                    });
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, connection = %conn.id, "claiming a connection check failed"),
            }
            if self.periodic.lock().values().sum::<usize>() >= self.checks.at_once {
                break;
            }
        }
    }

    /// Reloads every stored connection (other replicas' writes and checks, local changes).
    /// Reloads run one at a time: of two concurrent ones (two requests' writes), one that read
    /// before the other's write would otherwise replace the table after it, and a connection
    /// just created would be missing until the next reload.
    pub async fn reload(&self) {
        let _one_at_a_time = self.reloading.lock().await;
        match self.store.admin_user_ids().await {
            Ok(ids) => self.addresses.set_admins(ids),
            Err(e) => tracing::warn!(error = %e, "reloading the admins failed"),
        }
        match self.store.all_connections().await {
            Ok(rows) => {
                let conns: Vec<Connection> = rows.into_iter().filter_map(Connection::from_row).collect();
                *self.connections.write() = conns;
            }
            Err(e) => tracing::warn!(error = %e, "reloading connections failed"),
        }
    }

    /// Every connection of `kind` (every owner's).
    pub fn of_kind(&self, kind: ConnectionKind) -> Vec<Connection> {
        self.connections.read().iter().filter(|c| c.kind == kind).cloned().collect()
    }

    /// Connection `id` (any owner's).
    pub fn by_id(&self, id: &str) -> Option<Connection> {
        self.connections.read().iter().find(|c| c.id == id).cloned()
    }

    /// Every connection `user_id` may see: their own (oldest first), then the shared ones.
    pub fn visible(&self, user_id: &str) -> Vec<Connection> {
        let mut out: Vec<Connection> =
            self.connections.read().iter().filter(|c| c.visible_to(user_id)).cloned().collect();
        out.sort_by_key(|c| (c.owner_id.is_none(), c.id.clone()));
        out
    }

    /// Connection `id` when `user_id` may see it.
    pub fn connection_for(&self, user_id: &str, id: &str) -> Option<Connection> {
        self.connections.read().iter().find(|c| c.id == id && c.visible_to(user_id)).cloned()
    }

    /// The connections a call of `user_id` may use for `kind`, in the order they are tried.
    fn candidates(&self, user_id: &str, kind: ConnectionKind) -> Vec<Connection> {
        self.visible(user_id).into_iter().filter(|c| c.kind == kind).collect()
    }

    /// Whether a tool of `kind` needing `permission` is usable for `user_id`: Available when
    /// one of their connections is ([`Connection::usable`]); else the reason of the first
    /// (the one a call would use), or `no_connection` when they have none.
    pub fn availability(&self, user_id: &str, kind: ConnectionKind, permission: &str) -> Availability {
        match self.pick(user_id, kind, permission, None) {
            Ok(_) => Availability::Available,
            Err(e) => Availability::unavailable(e.code, e.message),
        }
    }

    fn pick(
        &self,
        user_id: &str,
        kind: ConnectionKind,
        permission: &str,
        requested: Option<&str>,
    ) -> Result<Connection, ToolError> {
        let candidates = self.candidates(user_id, kind);
        if let Some(id) = requested {
            let conn = candidates.into_iter().find(|c| c.id == id).ok_or_else(|| {
                ToolError::new(ErrorCode::NoConnection, format!("you have no {} connection {id}", kind.as_str()))
            })?;
            return conn.usable(permission).map(|()| conn).map_err(|(code, message)| ToolError::new(code, message));
        }
        let mut first_reason = None;
        for conn in candidates {
            match conn.usable(permission) {
                Ok(()) => return Ok(conn),
                Err(reason) => {
                    first_reason.get_or_insert(reason);
                }
            }
        }
        let (code, message) = first_reason.unwrap_or_else(|| {
            (ErrorCode::NoConnection, format!("no {} connection: add one with POST /v1/connections", kind.as_str()))
        });
        Err(ToolError::new(code, message))
    }

    /// The connection a call of `user_id` uses for `kind` and `permission`: `requested` (the
    /// input's `connection`) when given, else the first usable one. A tool's `prepare` puts
    /// both parts of [`Resolved`] into the canonical input, so an approval binds them.
    pub fn resolve(
        &self,
        user_id: &str,
        kind: ConnectionKind,
        permission: &str,
        requested: Option<&str>,
    ) -> Result<Resolved, ToolError> {
        self.pick(user_id, kind, permission, requested).map(|c| Resolved { fingerprint: c.fingerprint(), id: c.id })
    }

    /// Opens connection `id` for a call of `user_id` (theirs or shared, of `kind`, usable for
    /// `permission` now), with its credential. Errors: the ladder reasons,
    /// `secret_key_unavailable`, `credential_unavailable`.
    pub fn open(&self, user_id: &str, id: &str, kind: ConnectionKind, permission: &str) -> Result<Opened, ToolError> {
        let conn = self.pick(user_id, kind, permission, Some(id))?;
        self.open_credential(&conn)
    }

    /// [`ConnectionHub::open`] for a frozen call: also 409 `connection_changed` unless the
    /// connection's fingerprint is still `fingerprint` (the one frozen, and approved, with
    /// the call; None = a call frozen without one).
    pub fn open_frozen(
        &self,
        user_id: &str,
        id: &str,
        fingerprint: Option<&str>,
        kind: ConnectionKind,
        permission: &str,
    ) -> Result<Opened, ToolError> {
        let opened = self.open(user_id, id, kind, permission)?;
        still_frozen(id, fingerprint, &opened)?;
        Ok(opened)
    }

    /// [`ConnectionHub::open_frozen`] for an execution: from the stored row, not this
    /// replica's copy. Connection `id` is read again (one read by key) and this replica's copy
    /// replaced by it (or dropped, when it is gone), so a connection deleted, disabled or
    /// given another credential or settings through another replica is refused at once, not
    /// only after the next reload. A store that cannot be read refuses the call
    /// (`store_unavailable`): a credential is never used on a copy that could not be confirmed.
    pub async fn open_frozen_current(
        &self,
        user_id: &str,
        id: &str,
        fingerprint: Option<&str>,
        kind: ConnectionKind,
        permission: &str,
    ) -> Result<Opened, ToolError> {
        let row = self.store.connection(id).await.map_err(|e| {
            tracing::warn!(error = %e, connection = %id, "reading a connection for a call failed");
            ToolError::new(ErrorCode::StoreUnavailable, format!("connection {id} could not be read from the store"))
        })?;
        let stored = row.and_then(Connection::from_row);
        {
            let mut conns = self.connections.write();
            match &stored {
                Some(c) => {
                    if let Some(slot) = conns.iter_mut().find(|x| x.id == c.id) {
                        *slot = c.clone();
                    }
                }
                None => conns.retain(|x| x.id != id),
            }
        }
        let conn = stored.filter(|c| c.kind == kind && c.visible_to(user_id)).ok_or_else(|| {
            ToolError::new(ErrorCode::NoConnection, format!("you have no {} connection {id}", kind.as_str()))
        })?;
        conn.usable(permission).map_err(|(code, message)| ToolError::new(code, message))?;
        let opened = self.open_credential(&conn)?;
        still_frozen(id, fingerprint, &opened)?;
        Ok(opened)
    }

    /// Opens `conn` whatever its last check said (a connection's maintenance: reconnecting
    /// to an attached browser that was gone). Errors: `secret_key_unavailable`,
    /// `credential_unavailable`.
    pub fn opened(&self, conn: &Connection) -> Result<Opened, ToolError> {
        self.open_credential(conn)
    }

    fn open_credential(&self, conn: &Connection) -> Result<Opened, ToolError> {
        let plain = self.secrets()?.open(&conn.sealed, &conn.key_id, &conn.id).map_err(|e| {
            ToolError::new(
                ErrorCode::CredentialUnavailable,
                format!("the credential of connection {} cannot be opened: {e}", conn.name),
            )
        })?;
        let credential = serde_json::from_str(&plain).map_err(|_| {
            ToolError::new(
                ErrorCode::CredentialUnavailable,
                format!("the credential of connection {} is not a JSON object", conn.name),
            )
        })?;
        Ok(Opened {
            id: conn.id.clone(),
            owner_id: conn.owner_id.clone(),
            settings: conn.settings.clone(),
            credential,
            fingerprint: conn.fingerprint(),
            address_rule: self.addresses.rule_for(conn.owner_id.as_deref()),
        })
    }

    /// Runs `conn`'s check now (bounded by [`CheckSettings::timeout`]) and records its report in the
    /// store and in memory. A credential that cannot be opened is reported as
    /// `permission_unknown` for every permission.
    /// Of concurrent checks of one connection (a burst of `POST …/check`, the periodic one)
    /// only the first runs; the others return at once and see its report.
    pub async fn check(&self, conn: &Connection) {
        let Some(driver) = self.drivers.get(&conn.kind) else { return };
        if !self.checking.lock().insert(conn.id.clone()) {
            return;
        }
        let _running = Checking { hub: self, id: &conn.id };
        let report = match self.open_credential(conn) {
            Ok(opened) => match tokio::time::timeout(self.checks.timeout, driver.check(&opened)).await {
                Ok(report) => report,
                Err(_) => every(
                    driver.as_ref(),
                    &Access::Unreachable {
                        message: format!("no answer within {} s", self.checks.timeout.as_secs_f64()),
                    },
                ),
            },
            Err(e) => every(driver.as_ref(), &Access::Unknown { message: e.message }),
        };
        let checked_at = crate::ids::now();
        let json = serde_json::to_string(&report).unwrap_or_default();
        let until = report.rate_limited_until.clone();
        match self.store.record_connection_check(&conn.id, &conn.sealed, &json, &checked_at, until.as_deref()).await {
            Ok(true) => {
                if let Some(c) =
                    self.connections.write().iter_mut().find(|c| c.id == conn.id && c.sealed == conn.sealed)
                {
                    c.report = Some(report);
                    c.checked_at = Some(checked_at);
                    c.rate_limited_until = until;
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, connection = %conn.id, "recording a connection check failed"),
        }
    }

    /// A call learned something about `permission` of connection `id` as a whole (a 401 →
    /// [`Access::ReauthRequired`], a refused connection → [`Access::Unreachable`]): recorded
    /// at once in memory and in the store, where it stays until the next check. Only facts
    /// about the connection belong here, never one resource's refusal (a 403 for one
    /// repository): on a shared connection that would hold for every user. [`Access::Missing`]
    /// comes from checks.
    pub fn note_access(&self, id: &str, permission: &str, access: Access) {
        self.amend(id, |c| {
            c.report.get_or_insert_with(CheckReport::default).access.insert(permission.to_owned(), access);
        });
    }

    /// A call hit a rate limit of connection `id` that ends at `until` (RFC 3339).
    pub fn note_rate_limit(&self, id: &str, until: String) {
        self.amend(id, |c| {
            c.rate_limited_until = Some(until.clone());
            if let Some(r) = c.report.as_mut() {
                r.rate_limited_until = Some(until);
            }
        });
    }

    fn amend(&self, id: &str, change: impl FnOnce(&mut Connection)) {
        let updated = {
            let mut conns = self.connections.write();
            let Some(c) = conns.iter_mut().find(|c| c.id == id) else { return };
            change(c);
            c.clone()
        };
        let store = self.store.clone();
        let json = updated.report.as_ref().and_then(|r| serde_json::to_string(r).ok()).unwrap_or_default();
        let checked_at = updated.checked_at.clone().unwrap_or_else(crate::ids::now);
        tokio::spawn(async move {
            let written = store
                .record_connection_check(
                    &updated.id,
                    &updated.sealed,
                    &json,
                    &checked_at,
                    updated.rate_limited_until.as_deref(),
                )
                .await;
            if let Err(e) = written {
                tracing::warn!(error = %e, connection = %updated.id, "recording what a call learned failed");
            }
        });
    }
}

/// A place of one periodic check on this replica ([`CheckSettings`]), held until dropped.
struct PeriodicPlace {
    hub: Arc<ConnectionHub>,
    owner: Option<String>,
}

impl PeriodicPlace {
    /// A place for a check of `owner`'s connection, if both the replica's and the owner's
    /// bound leave one.
    fn take(hub: &Arc<ConnectionHub>, owner: Option<String>) -> Option<PeriodicPlace> {
        let mut periodic = hub.periodic.lock();
        if periodic.values().sum::<usize>() >= hub.checks.at_once {
            return None;
        }
        let mine = periodic.entry(owner.clone()).or_insert(0);
        if *mine >= hub.checks.per_owner {
            return None;
        }
        *mine += 1;
        Some(PeriodicPlace { hub: Arc::clone(hub), owner })
    }
}

impl Drop for PeriodicPlace {
    fn drop(&mut self) {
        let mut periodic = self.hub.periodic.lock();
        if let Some(n) = periodic.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                periodic.remove(&self.owner);
            }
        }
    }
}

/// Marks a connection's check as running until dropped.
struct Checking<'a> {
    hub: &'a ConnectionHub,
    id: &'a str,
}

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        self.hub.checking.lock().remove(self.id);
    }
}

/// 409 `connection_changed` unless `opened` still has the `fingerprint` its call was frozen
/// (and approved) with (None = a call frozen without one).
fn still_frozen(id: &str, fingerprint: Option<&str>, opened: &Opened) -> Result<(), ToolError> {
    if fingerprint == Some(opened.fingerprint.as_str()) {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::ConnectionChanged,
        format!(
            "connection {id}'s settings or credential changed after the call was frozen; freeze the call again to \
             use them"
        ),
    )
    .with_details(serde_json::json!({"connection": id})))
}

/// A report giving `access` for every permission of `driver`.
fn every(driver: &dyn Driver, access: &Access) -> CheckReport {
    CheckReport {
        account: None,
        access: driver.permissions().iter().map(|(p, _)| ((*p).to_owned(), access.clone())).collect(),
        rate_limited_until: None,
        inventory: None,
    }
}
