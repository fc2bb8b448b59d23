//! Remote devices: the control plane's side of `mira-runner` (docs/runner.md).
//!
//! [`DeviceHub`] holds the connected runners of this process: each runner connected
//! outbound with a signed challenge and keeps a stream open on which the hub sends signed
//! jobs ([`mira_core::remote`]). A runner renews its heartbeat lease; without a heartbeat for
//! the lease the device is `device_offline` (with when it was last seen), a revoked device is
//! `device_revoked` and its connection is cut at once. [`RemoteExecutor`] is the harness's
//! executor for runs bound to a device: the Read and Edit tools of such a run execute on the
//! device, at most once, and their evidence names the device that ran them.
//!
//! **In a cluster** one process holds a runner's connection: the replica haproxy gave the
//! runner's `connect`. The device row records that holder (its node id, its process id, the
//! SHA-256 of the session token; [`Store::hold_device`]). Every replica reads the truth from
//! there ([`DeviceHub::holder`]): the device is connected while its holder is a live replica
//! (the replica heartbeat of [`crate::cluster`]) whose process is the one that took the
//! connection and the runner's last heartbeat is younger than the runner lease. A runner's
//! heartbeat or result that lands on another replica is forwarded to the holder
//! (`/internal/v1/runner/*`, cluster secret), so the holder's waiting call gets its result. A
//! prepare or canonicalize job asked on another replica goes to the holder
//! (`/internal/v1/devices/job`); an execution claimed on another replica (a Read or Edit
//! call, a terminal action on the device) goes through the same `/internal/v1/execute` as
//! host terminal and MCP actions ([`executor::RemoteExecutor`]). A revocation, or a new key
//! enrolled for the device, made on another replica is told to the holder
//! (`/internal/v1/devices/cut`), which cuts the runner at once. Only a runner's heartbeat
//! renews its lease here, and every job asks the store whether the device is still the
//! connection's before it is sent.
//! A runner that reconnects through another replica moves the holder there.

pub mod cdp;
pub mod enroll_limit;
pub mod executor;
pub mod late;
pub mod terminal;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mira_core::remote::{
    Advertised, ChallengeAnswer, ConnectRequest, EnrollAnswer, EnrollRequest, JobEnvelope, JobOutcome, JobPhase,
    JobResult, PROTOCOL_VERSION, ServerMessage, SignedJob, SigningKey,
};
use parking_lot::Mutex;
use rand::RngExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use executor::RemoteExecutor;

use crate::availability::Availability;
use crate::cluster::Node;
use crate::cluster::forward::SECRET_HEADER;
use crate::error::ErrorCode;
use crate::registry::ToolError;
use crate::store::{DeviceRow, Store, StoreError};

/// Label of the control plane's job-signing key derived from the secret key
/// ([`crate::secret::SecretBox::derive_seed`]).
pub const SIGNING_KEY_LABEL: &str = "runner-signing";
/// How long a challenge stays valid.
const CHALLENGE_TTL: Duration = Duration::from_secs(60);
/// Lines buffered per connection before a send waits.
const CONNECTION_BUFFER: usize = 64;
/// Late results being attached at once ([`late::attach`]), per process: more are dropped
/// (logged), so that a runner posting results in a loop cannot pile up waiting tasks.
const LATE_ATTACH_SLOTS: usize = 64;

/// Timing of the remote devices (`--runner-*`).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSettings {
    /// Heartbeat lease: without a heartbeat for this long a device is offline.
    pub lease: Duration,
    /// How long a signed job stays valid after it is sent.
    pub job_ttl: Duration,
    /// How long an enrollment code stays valid.
    pub enroll_ttl: Duration,
    /// Wrong enrollment codes a minute from one client address ([`enroll_limit`]).
    pub enroll_failures_per_address: u32,
    /// Wrong enrollment codes a minute from all addresses together, per process.
    pub enroll_failures_global: u32,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            job_ttl: Duration::from_secs(60),
            enroll_ttl: Duration::from_secs(600),
            enroll_failures_per_address: 10,
            enroll_failures_global: 100,
        }
    }
}

/// A connected runner.
struct Connection {
    session: String,
    /// SHA-256 of `session`, as the device row records it.
    session_sha: String,
    tx: mpsc::Sender<ServerMessage>,
    cut: CancellationToken,
    last_beat: Mutex<Instant>,
    advertised: Advertised,
}

#[derive(Default)]
struct Inner {
    connections: HashMap<String, Arc<Connection>>,
    /// Jobs waiting for their outcome, by nonce: the device the job was sent to (only its
    /// runner may answer it) and the waiter.
    pending: HashMap<String, (String, oneshot::Sender<JobOutcome>)>,
}

/// Where a device stands, seen from this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// A runner is connected and its lease is valid; what it advertised.
    Connected(Advertised),
    /// Enrolled, but no runner holds a valid lease (last heartbeat, if any).
    Offline {
        /// RFC 3339 time of the last heartbeat.
        last_seen_at: Option<String>,
    },
    /// Revoked at this time.
    Revoked(String),
    /// Never enrolled.
    NotEnrolled,
}

impl Presence {
    /// The state's name in the API: `connected`, `offline`, `revoked`, `not_enrolled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Presence::Connected(_) => "connected",
            Presence::Offline { .. } => "offline",
            Presence::Revoked(_) => "revoked",
            Presence::NotEnrolled => "not_enrolled",
        }
    }

    /// The availability of work on the device: available when connected, else the reason
    /// (`device_offline` with the last heartbeat, `device_revoked`, `device_not_connected`).
    pub fn availability(&self, device_id: &str) -> Availability {
        match self {
            Presence::Connected(_) => Availability::Available,
            Presence::Offline { last_seen_at } => Availability::unavailable(
                ErrorCode::DeviceOffline,
                match last_seen_at {
                    Some(at) => format!("the runner of device {device_id} is offline (last seen {at})"),
                    None => format!("the runner of device {device_id} has never connected"),
                },
            ),
            Presence::Revoked(at) => {
                Availability::unavailable(ErrorCode::DeviceRevoked, format!("device {device_id} was revoked at {at}"))
            }
            Presence::NotEnrolled => Availability::unavailable(
                ErrorCode::DeviceNotConnected,
                format!("device {device_id} has no enrolled runner; enroll one with `mira runner enroll`"),
            ),
        }
    }
}

/// Why the runner protocol refused a request.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A refusal with its code and sentence.
    #[error("{1}")]
    Refused(ErrorCode, String),
    /// Too many wrong enrollment codes ([`enroll_limit`]): try again after this long.
    #[error("too many wrong enrollment codes")]
    Limited(Duration),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<HubError> for crate::error::Error {
    fn from(e: HubError) -> Self {
        match e {
            HubError::Store(e) => e.into(),
            // Answered with the code's own status (401, 403 or 400).
            HubError::Refused(code, message) => crate::error::Error::Tool(ToolError::new(code, message)),
            HubError::Limited(wait) => crate::error::Error::TooManyRequests {
                code: ErrorCode::EnrollmentRateLimited,
                message: format!(
                    "too many wrong enrollment codes from this address or from everyone; try again in {} s \
                     (nothing was looked at)",
                    retry_after_secs(wait)
                ),
            },
        }
    }
}

/// Whole seconds to wait (at least 1), for `Retry-After`.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// The connected runners of this process and the jobs they owe (see the module docs).
pub struct DeviceHub {
    store: Store,
    key: SigningKey,
    settings: DeviceSettings,
    inner: Mutex<Inner>,
    enroll_limit: enroll_limit::EnrollLimiter,
    /// Bumped when a device session's output or end is stored ([`terminal`]).
    terminal_wake: tokio::sync::watch::Sender<u64>,
    /// [`LATE_ATTACH_SLOTS`].
    late_slots: Arc<tokio::sync::Semaphore>,
    /// Issues and checks the jobs' nonces (a late result must carry one issued for its call).
    nonces: late::JobNonces,
    node: Arc<Node>,
    client: reqwest::Client,
    /// DevTools channels to devices' browsers, by channel id ([`cdp`]).
    cdp_channels: Mutex<HashMap<String, cdp::Channel>>,
    /// The tools, for which of them run on a device ([`late::attach`]).
    registry: Arc<crate::registry::Registry>,
}

/// Where a device's live connection is, seen from this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This process holds it and the runner's lease is valid.
    Here,
    /// Another live replica's process holds it and the runner's last heartbeat is within
    /// the lease: the base URL that replica is reached at.
    Elsewhere(String),
    /// Nobody holds it with a valid lease.
    Nowhere,
}

/// A job forwarded to the replica holding the device (`POST /internal/v1/devices/job`):
/// prepare and canonicalize only (an execution goes through `/internal/v1/execute`). It
/// names the call only; the holder reads the run and takes the owner, the device and the
/// workspace from it ([`DeviceHub::forwarded_spec`]), so the cluster secret alone does not
/// get a job signed for any device, user or folder.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardedJob {
    /// The run (bound to the device).
    pub run_id: String,
    /// `prepare` or `canonicalize`.
    pub phase: JobPhase,
    /// The tool.
    pub tool_id: String,
    /// The input.
    pub input: Value,
}

/// Answer of `POST /internal/v1/devices/job`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardedAnswer {
    /// The runner's outcome.
    Ok(JobOutcome),
    /// The job failed (offline, refused…).
    Err(ToolError),
}

/// How long a revocation waits for the holder replica to cut the runner
/// ([`DeviceHub::revoke`]) before it leaves the cut to the runner's next heartbeat.
pub const HOLDER_CUT_TIMEOUT: Duration = Duration::from_secs(3);

/// Body of `POST /internal/v1/devices/cut`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct CutRequest {
    /// The device revoked, or enrolled with a new key.
    pub device_id: String,
}

/// Answer of `POST /internal/v1/devices/cut`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct CutAnswer {
    /// Whether this replica held a connection of the device the store no longer names and
    /// cut it.
    pub cut: bool,
}

/// The runner routes a replica forwards to the holder: `heartbeat` or `results`.
#[derive(Debug, Clone, Copy)]
pub enum RunnerRoute {
    /// `POST /v1/runner/heartbeat`.
    Heartbeat,
    /// `POST /v1/runner/results`.
    Results,
}

impl RunnerRoute {
    fn path(self) -> &'static str {
        match self {
            Self::Heartbeat => "/internal/v1/runner/heartbeat",
            Self::Results => "/internal/v1/runner/results",
        }
    }
}

/// The stream a connected runner reads, and the guard that forgets the connection when the
/// stream is dropped (the runner went away).
pub struct Attached {
    /// Lines for the runner.
    pub rx: mpsc::Receiver<ServerMessage>,
    /// Cancelled when the connection is cut (revocation, a newer connection of the device).
    pub cut: CancellationToken,
    /// Forgets the connection when dropped.
    pub guard: DetachGuard,
}

/// Forgets a connection when dropped.
pub struct DetachGuard {
    hub: Arc<DeviceHub>,
    device_id: String,
    session: String,
}

impl Drop for DetachGuard {
    fn drop(&mut self) {
        let removed = {
            let mut inner = self.hub.inner.lock();
            if inner.connections.get(&self.device_id).is_some_and(|c| c.session == self.session) {
                inner.connections.remove(&self.device_id)
            } else {
                None
            }
        };
        if removed.is_some() {
            self.hub.drop_cdp_channels(&self.device_id);
        }
        // The row forgets this holder (only while the session is still its own).
        if let Some(conn) = removed
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let store = self.hub.store.clone();
            let device = self.device_id.clone();
            rt.spawn(async move {
                if let Err(e) = store.release_device(&device, &conn.session_sha).await {
                    tracing::warn!(device = %device, error = %e, "forgetting the device's holder failed");
                }
            });
        }
    }
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill(&mut buf[..]);
    hex::encode(buf)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl DeviceHub {
    /// A hub of replica `node` signing jobs with `key`, for the tools of `registry`. Fails
    /// only when the HTTP client (for forwarding to the replica holding a device) cannot be
    /// built.
    pub fn new(
        store: Store,
        key: SigningKey,
        settings: DeviceSettings,
        node: Arc<Node>,
        registry: Arc<crate::registry::Registry>,
    ) -> Result<Self, reqwest::Error> {
        let enroll_limit =
            enroll_limit::EnrollLimiter::new(settings.enroll_failures_per_address, settings.enroll_failures_global);
        let client = crate::net::cluster_client()?;
        Ok(Self {
            store,
            nonces: late::JobNonces::new(&key),
            key,
            settings,
            inner: Mutex::new(Inner::default()),
            enroll_limit,
            terminal_wake: tokio::sync::watch::Sender::new(0),
            late_slots: Arc::new(tokio::sync::Semaphore::new(LATE_ATTACH_SLOTS)),
            node,
            client,
            cdp_channels: Mutex::new(HashMap::new()),
            registry,
        })
    }

    /// This replica.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The client replicas forward with.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The control plane's public key (hex), which runners pin at enrollment.
    pub fn public_key(&self) -> String {
        mira_core::remote::public_hex(&self.key)
    }

    /// The jobs' nonces: what a late result's nonce must have been issued by.
    pub fn nonces(&self) -> &late::JobNonces {
        &self.nonces
    }

    /// The settings.
    pub fn settings(&self) -> DeviceSettings {
        self.settings
    }

    /// A new one-time enrollment code for the caller's device `device_id`: the code (shown
    /// once) and its expiry. Only its SHA-256 is stored. None when the device is not the
    /// caller's or is revoked.
    pub async fn new_enrollment_code(
        &self,
        owner_id: &str,
        device_id: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        let code = format!("mre_{}", random_hex(16));
        let expires_at = crate::ids::now_plus_ms(millis(self.settings.enroll_ttl));
        let stored = self
            .store
            .set_enrollment_code(owner_id, device_id, &crate::evidence::sha256_hex(code.as_bytes()), &expires_at)
            .await?;
        Ok(stored.then_some((code, expires_at)))
    }

    /// Enrolls a runner's public key with a one-time code, sent from `client` (the TCP
    /// peer's address, when known). Wrong codes are limited per address and per process
    /// ([`enroll_limit`]): [`HubError::Limited`] before the code is looked at. Two enrollments
    /// with the same code at once: one wins, the other gets `enrollment_code_invalid`.
    pub async fn enroll(
        &self,
        req: &EnrollRequest,
        client: Option<std::net::IpAddr>,
    ) -> Result<EnrollAnswer, HubError> {
        if mira_core::remote::parse_public(&req.public_key).is_none() {
            return Err(HubError::Refused(
                ErrorCode::InvalidRequest,
                "public_key is not an Ed25519 public key in hex".into(),
            ));
        }
        let attempt = self.enroll_limit.begin(client).map_err(HubError::Limited)?;
        let sha = crate::evidence::sha256_hex(req.code.trim().as_bytes());
        let enrolled = match self.store.enroll_device(&sha, &req.public_key, &crate::ids::now()).await {
            Ok(Some(enrolled)) => {
                self.enroll_limit.refund(attempt);
                enrolled
            }
            Ok(None) => {
                tracing::info!(client = ?client, "a wrong enrollment code");
                return Err(HubError::Refused(
                    ErrorCode::EnrollmentCodeInvalid,
                    "the enrollment code is unknown, already used or expired; ask for a new one (POST /v1/devices/{id}/enrollment-code)"
                        .into(),
                ));
            }
            Err(e) => {
                self.enroll_limit.refund(attempt);
                return Err(e.into());
            }
        };
        let row = enrolled.device;
        tracing::info!(device = %row.id, "device enrolled");
        // A new key ends the earlier runner's session as a revocation does: the store cleared
        // its holder and session (its heartbeats are refused everywhere); its connection is
        // cut here, and on the replica that held it.
        if enrolled.before.public_key.is_some() {
            self.cut_here(&row.id, "enrolled with a new key");
            match self.holder_address(&enrolled.before).await {
                Ok(Some(base)) => self.tell_holder_to_cut(&base, &row.id).await,
                Ok(None) => {}
                Err(e) => tracing::warn!(device = %row.id, error = %e,
                    "the replica holding the earlier runner could not be read; it cuts that runner at its next heartbeat"),
            }
        }
        Ok(EnrollAnswer { device_id: row.id, name: row.name, server_public_key: self.public_key() })
    }

    async fn usable_device(&self, device_id: &str) -> Result<DeviceRow, HubError> {
        let failed = || HubError::Refused(ErrorCode::DeviceAuthFailed, format!("device {device_id} cannot connect"));
        let row = self.store.device_by_id(device_id).await?.ok_or_else(failed)?;
        if let Some(at) = &row.revoked_at {
            return Err(HubError::Refused(ErrorCode::DeviceRevoked, format!("device {device_id} was revoked at {at}")));
        }
        if row.public_key.is_none() {
            return Err(failed());
        }
        Ok(row)
    }

    /// A challenge for `device_id` to sign.
    pub async fn challenge(&self, device_id: &str) -> Result<ChallengeAnswer, HubError> {
        self.usable_device(device_id).await?;
        let challenge = random_hex(32);
        // In the store, so that the `connect` may land on any replica.
        let expires_at = crate::ids::now_plus_ms(millis(CHALLENGE_TTL));
        let sha = crate::evidence::sha256_hex(challenge.as_bytes());
        self.store.add_runner_challenge(&sha, device_id, &expires_at, &crate::ids::now()).await?;
        Ok(ChallengeAnswer { challenge })
    }

    /// Attaches a runner that signed its challenge: a newer connection of the same device
    /// replaces (cuts) the older one. Errors: `device_auth_failed`, `device_revoked`.
    pub async fn connect(self: &Arc<Self>, req: ConnectRequest) -> Result<Attached, HubError> {
        let row = self.usable_device(&req.device_id).await?;
        let failed = |why: &str| {
            HubError::Refused(ErrorCode::DeviceAuthFailed, format!("device {} cannot connect: {why}", req.device_id))
        };
        let sha = crate::evidence::sha256_hex(req.challenge.as_bytes());
        if !self.store.take_runner_challenge(&sha, &req.device_id, &crate::ids::now()).await? {
            return Err(failed("the challenge is unknown, used or expired"));
        }
        let key = row.public_key.as_deref().ok_or_else(|| failed("no key"))?;
        let public = mira_core::remote::parse_public(key).ok_or_else(|| failed("no key"))?;
        let message = mira_core::remote::connect_message(&req.device_id, &req.challenge);
        if !mira_core::remote::verify(&public, mira_core::remote::CONNECT_DOMAIN, &message, &req.signature) {
            return Err(failed("the signature does not verify under the enrolled key"));
        }
        let advertised = serde_json::to_string(&req.advertised).ok();
        let (tx, rx) = mpsc::channel(CONNECTION_BUFFER);
        let session = format!("mrs_{}", random_hex(24));
        let session_sha = crate::evidence::sha256_hex(session.as_bytes());
        // This replica holds the device from now on (a holder elsewhere loses it: its next
        // heartbeat there is refused and that connection is cut).
        let holder = (self.node.id.as_str(), self.node.process_id.as_str());
        if !self
            .store
            .hold_device(&req.device_id, holder, &session_sha, &crate::ids::now(), advertised.as_deref(), key)
            .await?
        {
            // Revoked, or enrolled with another key since the signature was checked.
            return Err(match self.store.device_by_id(&req.device_id).await?.and_then(|r| r.revoked_at) {
                Some(_) => HubError::Refused(ErrorCode::DeviceRevoked, format!("device {} was revoked", req.device_id)),
                None => failed("the device was enrolled with another key meanwhile"),
            });
        }
        let heartbeat = self.settings.lease / 3;
        let welcome = ServerMessage::Welcome {
            session: session.clone(),
            lease_ms: millis(self.settings.lease),
            heartbeat_ms: millis(heartbeat),
        };
        let _ = tx.try_send(welcome);
        let cut = CancellationToken::new();
        let conn = Arc::new(Connection {
            session: session.clone(),
            session_sha: session_sha.clone(),
            tx,
            cut: cut.clone(),
            last_beat: Mutex::new(Instant::now()),
            advertised: req.advertised,
        });
        if let Some(old) = self.inner.lock().connections.insert(req.device_id.clone(), conn) {
            old.cut.cancel();
            self.drop_cdp_channels(&req.device_id);
        }
        // A revocation or a new enrollment between `hold_device` and the insert above found no
        // connection here to cut: read the row again, so that the runner of a revoked device,
        // or of a key replaced since, never stays attached.
        let now = self.store.device_by_id(&req.device_id).await?;
        if now.as_ref().is_none_or(|row| row.revoked_at.is_some()) {
            self.cut_here(&req.device_id, "revoked");
            return Err(HubError::Refused(ErrorCode::DeviceRevoked, format!("device {} was revoked", req.device_id)));
        }
        if now.as_ref().is_some_and(|row| row.public_key.as_deref() != Some(key)) {
            self.cut_connection_here(&req.device_id, &session_sha, "enrolled with a new key");
            return Err(failed("the device was enrolled with another key meanwhile"));
        }
        tracing::info!(device = %req.device_id, "runner connected");
        Ok(Attached { rx, cut, guard: DetachGuard { hub: Arc::clone(self), device_id: req.device_id, session } })
    }

    /// The connection whose session token is `session`. Compared by SHA-256 (of what the
    /// caller sent and of each session), so that how long the comparison takes tells nothing
    /// about a token.
    fn by_session(&self, session: &str) -> Option<(String, Arc<Connection>)> {
        let sha = crate::evidence::sha256_hex(session.as_bytes());
        let inner = self.inner.lock();
        inner.connections.iter().find(|(_, c)| c.session_sha == sha).map(|(d, c)| (d.clone(), Arc::clone(c)))
    }

    fn session_refused() -> HubError {
        HubError::Refused(ErrorCode::DeviceAuthFailed, "the runner session is unknown or was cut; connect again".into())
    }

    /// Renews the lease of the connection holding `session`: here when this process holds
    /// it, else forwarded to the replica that does (see the module docs).
    pub async fn heartbeat(&self, session: &str) -> Result<(), HubError> {
        if self.by_session(session).is_some() {
            return self.heartbeat_here(session).await;
        }
        self.forward_runner(RunnerRoute::Heartbeat, session, None).await
    }

    /// Renews the lease of the connection holding `session` in this process. A session the
    /// device row no longer names (a newer connection elsewhere, a revocation) is cut.
    pub async fn heartbeat_here(&self, session: &str) -> Result<(), HubError> {
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        if !self.store.beat_device(&device, &conn.session_sha, &crate::ids::now()).await? {
            conn.cut.cancel();
            let mut inner = self.inner.lock();
            if inner.connections.get(&device).is_some_and(|c| c.session == conn.session) {
                inner.connections.remove(&device);
            }
            drop(inner);
            self.drop_cdp_channels(&device);
            tracing::info!(device = %device, "a runner connection replaced elsewhere (revoked, or enrolled with a new key) was cut");
            return Err(Self::session_refused());
        }
        *conn.last_beat.lock() = Instant::now();
        Ok(())
    }

    /// Takes a job result from the connection holding `session`: here when this process
    /// holds it, else forwarded to the replica that does, whose waiting call gets it.
    pub async fn deliver(&self, session: &str, result: JobResult) -> Result<(), HubError> {
        if self.by_session(session).is_some() {
            return self.deliver_here(session, result).await;
        }
        let body = serde_json::to_value(&result)
            .map_err(|e| HubError::Refused(ErrorCode::Internal, format!("the result cannot be forwarded: {e}")))?;
        self.forward_runner(RunnerRoute::Results, session, Some(body)).await
    }

    /// Takes a job result from the connection holding `session` in this process: the
    /// waiting call gets it. A result nobody waits for any more (the call ended meanwhile:
    /// `interrupted` with `outcome_unknown`, or cancelled) is attached to its invocation as
    /// evidence of kind `late_device_result` ([`late::attach`]) when its nonce was issued for
    /// that device and invocation ([`late::JobNonces`]; else dropped); its status stays.
    pub async fn deliver_here(&self, session: &str, result: JobResult) -> Result<(), HubError> {
        // A result does not renew the lease: only a heartbeat does, which asks the store
        // whether the device is still this connection's (a revoked runner posting results
        // instead of heartbeats goes offline after its lease).
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        let waiter = {
            let mut inner = self.inner.lock();
            match inner.pending.get(&result.nonce) {
                Some((for_device, _)) if *for_device != device => {
                    drop(inner);
                    tracing::warn!(device = %device, nonce = %result.nonce,
                        "a runner answered a job sent to another device; refused");
                    return Err(HubError::Refused(
                        ErrorCode::DeviceAuthFailed,
                        "this runner was not sent that job".into(),
                    ));
                }
                Some(_) => inner.pending.remove(&result.nonce).map(|(_, tx)| tx),
                None => None,
            }
        };
        match waiter {
            Some(tx) => {
                let _ = tx.send(result.outcome);
            }
            None if result.invocation_id.is_empty() => {
                tracing::warn!(device = %device, nonce = %result.nonce,
                    "a runner delivered a prepare result no call waits for any more; dropped")
            }
            None => {
                // Evidence from a connection the device row no longer names (revoked, enrolled
                // with a new key, replaced elsewhere) is refused, and that connection is cut.
                let row = self.store.device_by_id(&device).await?;
                if row.is_none_or(|r| r.revoked_at.is_some() || r.session_sha256.as_deref() != Some(&conn.session_sha))
                {
                    self.cut_connection_here(&device, &conn.session_sha, "no longer the device's connection");
                    return Err(Self::session_refused());
                }
                if !self.nonces.names(&device, &result.invocation_id, &result.nonce) {
                    tracing::warn!(device = %device, invocation = %result.invocation_id,
                        "a runner delivered a late result whose nonce was not issued for that call; dropped");
                    return Ok(());
                }
                tracing::warn!(device = %device, invocation = %result.invocation_id, late = result.late,
                    "a runner delivered a result no call waits for any more; attaching it to its invocation");
                let Ok(slot) = Arc::clone(&self.late_slots).try_acquire_owned() else {
                    tracing::warn!(device = %device, invocation = %result.invocation_id,
                        "too many late results are being attached at once; this one is dropped");
                    return Ok(());
                };
                let store = self.store.clone();
                let registry = Arc::clone(&self.registry);
                let wait = self.settings.lease * 3;
                tokio::spawn(async move {
                    if let Err(e) = late::attach(&store, &registry, &device, result, wait).await {
                        tracing::warn!(device = %device, error = %e, "attaching a late device result failed");
                    }
                    drop(slot);
                });
            }
        }
        Ok(())
    }

    /// Sends a runner's request that landed here to the replica holding its session.
    /// `device_auth_failed` when no live replica holds it or the holder refused it (the
    /// runner connects again, which moves the holder).
    async fn forward_runner(&self, route: RunnerRoute, session: &str, body: Option<Value>) -> Result<(), HubError> {
        let sha = crate::evidence::sha256_hex(session.as_bytes());
        let row = self.store.device_by_session(&sha).await?.ok_or_else(Self::session_refused)?;
        let Some(base) = self.holder_address(&row).await? else {
            return Err(Self::session_refused());
        };
        let Some(secret) = self.node.config.secret.as_deref().filter(|s| !s.is_empty()) else {
            return Err(Self::session_refused());
        };
        let url = format!("{}{}", base.trim_end_matches('/'), route.path());
        let mut request = self.client.post(&url).header(SECRET_HEADER, secret).bearer_auth(session);
        if let Some(body) = body {
            request = request.json(&body);
        }
        match request.send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => {
                tracing::info!(device = %row.id, status = %r.status(), ?route, "the holder replica refused a forwarded runner request");
                Err(Self::session_refused())
            }
            Err(e) => {
                tracing::warn!(device = %row.id, error = %e, ?route, "forwarding a runner request to its holder failed");
                Err(Self::session_refused())
            }
        }
    }

    /// Revokes the caller's device and cuts its runner's connection at once: here when this
    /// process holds it, else by telling the live replica the device row named as its holder
    /// just before the revocation (`POST /internal/v1/devices/cut`, cluster secret,
    /// [`HOLDER_CUT_TIMEOUT`]). When that replica cannot be told (no secret, unreachable,
    /// refused; logged) it still cuts the runner at its next heartbeat, which it refuses; so
    /// does a replica the runner connected through between that read and the revocation.
    /// False when the device is not the caller's.
    pub async fn revoke(&self, owner_id: &str, device_id: &str) -> Result<bool, StoreError> {
        // The revocation clears the holder: read it first.
        let before = self.store.device_by_id(device_id).await?;
        if !self.store.revoke_device(owner_id, device_id, &crate::ids::now()).await? {
            return Ok(false);
        }
        // A connection here that the row no longer named (replaced elsewhere) goes too.
        self.cut_here(device_id, "revoked");
        if let Some(row) = before
            && let Some(base) = self.holder_address(&row).await?
        {
            self.tell_holder_to_cut(&base, device_id).await;
        }
        Ok(true)
    }

    /// Cuts this process's connection of `device_id`, if it has one (`why` is logged): the
    /// runner's stream ends (it connects again and is refused). True when there was one.
    fn cut_here(&self, device_id: &str, why: &str) -> bool {
        let Some(conn) = self.inner.lock().connections.remove(device_id) else { return false };
        conn.cut.cancel();
        self.drop_cdp_channels(device_id);
        tracing::info!(device = device_id, why, "a device's runner was cut");
        true
    }

    /// Cuts this process's connection of `device_id` only while it is the one whose session
    /// has SHA-256 `session_sha` (a newer connection is left alone). True when it was cut.
    fn cut_connection_here(&self, device_id: &str, session_sha: &str, why: &str) -> bool {
        let conn = {
            let mut inner = self.inner.lock();
            if inner.connections.get(device_id).is_none_or(|c| c.session_sha != session_sha) {
                return false;
            }
            inner.connections.remove(device_id)
        };
        let Some(conn) = conn else { return false };
        conn.cut.cancel();
        self.drop_cdp_channels(device_id);
        tracing::info!(device = device_id, why, "a device's runner was cut");
        true
    }

    /// The holder's side of a revocation or a new enrollment made on another replica
    /// (`POST /internal/v1/devices/cut`): cuts this process's connection of `device_id` when
    /// the store no longer names it — the device is revoked or gone, or its row holds another
    /// session (or none: enrolled with a new key). A connection the row still names is left
    /// alone. True when a connection was cut.
    pub async fn cut_stale_here(&self, device_id: &str) -> Result<bool, StoreError> {
        let Some(conn) = self.inner.lock().connections.get(device_id).cloned() else { return Ok(false) };
        let row = self.store.device_by_id(device_id).await?;
        let current =
            row.is_some_and(|r| r.revoked_at.is_none() && r.session_sha256.as_deref() == Some(&conn.session_sha));
        Ok(!current && self.cut_connection_here(device_id, &conn.session_sha, "no longer the device's connection"))
    }

    /// Asks the replica at `base` to cut its connection of `device_id`, revoked or enrolled
    /// with a new key; a failure is logged (that replica cuts the runner at its next
    /// heartbeat instead).
    async fn tell_holder_to_cut(&self, base: &str, device_id: &str) {
        let Some(secret) = self.node.config.secret.as_deref().filter(|s| !s.is_empty()) else {
            tracing::warn!(
                device = device_id,
                holder = base,
                "the device's earlier runner is held by another replica and this one has no --cluster-secret to tell it; it is cut at its next heartbeat"
            );
            return;
        };
        let url = format!("{}/internal/v1/devices/cut", base.trim_end_matches('/'));
        let sent = self
            .client
            .post(&url)
            .header(SECRET_HEADER, secret)
            .timeout(HOLDER_CUT_TIMEOUT)
            .json(&CutRequest { device_id: device_id.to_owned() })
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                let cut = r.json::<CutAnswer>().await.is_ok_and(|a| a.cut);
                tracing::info!(
                    device = device_id,
                    holder = base,
                    cut,
                    "told the holder replica to cut the device's runner"
                );
            }
            Ok(r) => tracing::warn!(device = device_id, holder = base, status = %r.status(),
                "the holder replica refused to cut the device's runner; it is cut at its next heartbeat"),
            Err(e) => tracing::warn!(device = device_id, holder = base, error = %e,
                "the holder replica could not be told to cut the device's runner; it cuts it at its next heartbeat"),
        }
    }

    fn live(&self, device_id: &str) -> Option<Arc<Connection>> {
        let conn = self.inner.lock().connections.get(device_id).cloned()?;
        (conn.last_beat.lock().elapsed() < self.settings.lease && !conn.cut.is_cancelled()).then_some(conn)
    }

    /// The base URL of the live replica process that `row` names as its holder, when that is
    /// not this process.
    async fn holder_address(&self, row: &DeviceRow) -> Result<Option<String>, StoreError> {
        let (Some(node_id), Some(process_id)) = (&row.holder_node_id, &row.holder_process_id) else {
            return Ok(None);
        };
        if *process_id == self.node.process_id {
            return Ok(None);
        }
        Ok(match self.store.replica(node_id).await? {
            Some(r) if self.node.is_alive(&r) && r.process_id == *process_id => Some(r.address),
            _ => None,
        })
    }

    /// Where `row`'s live connection is: here (this process holds it and the row still
    /// names it), elsewhere (a live replica's process holds it and the runner beat within
    /// the lease), or nowhere.
    pub async fn holder(&self, row: &DeviceRow) -> Result<Holder, StoreError> {
        if row.revoked_at.is_some() {
            return Ok(Holder::Nowhere);
        }
        if let Some(conn) = self.live(&row.id)
            && row.session_sha256.as_deref() == Some(conn.session_sha.as_str())
        {
            return Ok(Holder::Here);
        }
        let beat_recently =
            row.last_seen_at.as_deref().is_some_and(|at| !crate::cluster::stale(at, self.settings.lease));
        if !beat_recently {
            return Ok(Holder::Nowhere);
        }
        Ok(match self.holder_address(row).await? {
            Some(address) => Holder::Elsewhere(address),
            None => Holder::Nowhere,
        })
    }

    /// Where `row` stands now, in the whole cluster (see [`DeviceHub::holder`]). A store that
    /// fails counts the device offline.
    pub async fn presence(&self, row: &DeviceRow) -> Presence {
        if let Some(at) = &row.revoked_at {
            return Presence::Revoked(at.clone());
        }
        if row.public_key.is_none() {
            return Presence::NotEnrolled;
        }
        let holder = self.holder(row).await.unwrap_or_else(|e| {
            tracing::warn!(device = %row.id, error = %e, "where the device's runner is connected could not be read");
            Holder::Nowhere
        });
        match holder {
            Holder::Here => match self.live(&row.id) {
                Some(conn) => Presence::Connected(conn.advertised.clone()),
                None => Presence::Offline { last_seen_at: row.last_seen_at.clone() },
            },
            Holder::Elsewhere(_) => Presence::Connected(
                row.advertised.as_deref().and_then(|a| serde_json::from_str(a).ok()).unwrap_or_default(),
            ),
            Holder::Nowhere => Presence::Offline { last_seen_at: row.last_seen_at.clone() },
        }
    }

    /// The holder's side of `POST /internal/v1/devices/job`: the device and the job of
    /// `job`, read from its run — the run's owner, the device the run is bound to, the run's
    /// workspace — never from the request. Refused: an execution (400 `invalid_field`: those
    /// come through `/internal/v1/execute` under their claim), an unknown run (404
    /// `not_found`), a run not bound to a device, or bound to a device that is not its
    /// owner's or is gone (403 `forbidden`), a run without its workspace
    /// (`workspace_unavailable`).
    pub async fn forwarded_spec(&self, job: ForwardedJob) -> Result<(String, JobSpec), HubError> {
        if job.phase == JobPhase::Execute {
            return Err(HubError::Refused(
                ErrorCode::InvalidField,
                "executions are forwarded through /internal/v1/execute, under the claim of the invocation".into(),
            ));
        }
        let scope = self
            .store
            .run_scope_any_owner(&job.run_id)
            .await?
            .ok_or_else(|| HubError::Refused(ErrorCode::NotFound, format!("run {} is unknown", job.run_id)))?;
        let run = scope.run;
        let forbidden = |why: String| HubError::Refused(ErrorCode::Forbidden, why);
        let device = run
            .device_id
            .filter(|d| d != crate::availability::LOCAL_DEVICE_ID)
            .ok_or_else(|| forbidden(format!("run {} is not bound to a device", run.id)))?;
        let row = self.store.device_by_id(&device).await?;
        if row.is_none_or(|d| d.owner_id != run.owner_id) {
            return Err(forbidden(format!("run {} is bound to device {device}, which is not its owner's", run.id)));
        }
        let ws = scope.workspace.ok_or_else(|| {
            HubError::Refused(ErrorCode::WorkspaceUnavailable, format!("workspace {} is gone", run.workspace_id))
        })?;
        let spec = JobSpec {
            phase: job.phase,
            invocation_id: String::new(),
            run_id: run.id,
            owner_id: run.owner_id,
            tool_id: job.tool_id,
            input: job.input,
            approval_id: None,
            workspace: ws.path,
        };
        Ok((device, spec))
    }

    /// Sends one job to `device_id`'s runner wherever it is connected: here, or through the
    /// replica holding it (`POST /internal/v1/devices/job`). For prepare and canonicalize
    /// only (they change nothing; an execution goes through the harness's executor, which
    /// forwards it under its claim). Errors as [`DeviceHub::job`]; a forward that fails is
    /// `device_offline`.
    pub async fn job_anywhere(&self, device_id: &str, spec: JobSpec) -> Result<JobOutcome, ToolError> {
        let offline = |why: String| {
            ToolError::new(ErrorCode::DeviceOffline, format!("the runner of device {device_id} is offline: {why}"))
                .with_details(json!({"device_id": device_id}))
        };
        let row = self
            .store
            .device_by_id(device_id)
            .await
            .map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))?
            .ok_or_else(|| offline("the device is gone".into()))?;
        let base = match self.holder(&row).await.map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))? {
            Holder::Elsewhere(base) if spec.phase != JobPhase::Execute => base,
            _ => return self.job(device_id, spec, &CancellationToken::new()).await,
        };
        let Some(secret) = self.node.config.secret.as_deref().filter(|s| !s.is_empty()) else {
            return Err(offline("it is connected to another replica and this one has no --cluster-secret".into()));
        };
        let url = format!("{}/internal/v1/devices/job", base.trim_end_matches('/'));
        // Only what names the call: the holder takes the owner, the device and the workspace
        // from the run's row.
        let body = ForwardedJob { run_id: spec.run_id, phase: spec.phase, tool_id: spec.tool_id, input: spec.input };
        let wait = PREPARE_WAIT + Duration::from_secs(10);
        // The timeout covers the answer's body too: a holder that stalls mid-answer is a
        // timeout, not an offline device.
        let failed = |e: reqwest::Error, what: &str| {
            if e.is_timeout() {
                ToolError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "the replica holding device {device_id} did not answer within {} s; try again",
                        wait.as_secs()
                    ),
                )
                .with_details(json!({"device_id": device_id}))
            } else {
                // The replica's address and the client's error (which names it) go to the
                // log, not to the user.
                tracing::warn!(device = device_id, replica = %base, error = %e, "a device job was not forwarded: {what}");
                offline(format!("the replica holding its runner {what}"))
            }
        };
        let response = self
            .client
            .post(&url)
            .header(SECRET_HEADER, secret)
            .timeout(wait)
            .json(&body)
            .send()
            .await
            .map_err(|e| failed(e, "cannot be reached"))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| failed(e, "failed while answering"))?;
        if !status.is_success() {
            tracing::warn!(device = device_id, replica = %base, %status,
                answer = %text.chars().take(300).collect::<String>(), "the holder replica refused a forwarded device job");
            return Err(offline(format!("the replica holding its runner refused the job ({})", status.as_u16())));
        }
        match serde_json::from_str::<ForwardedAnswer>(&text) {
            Ok(ForwardedAnswer::Ok(outcome)) => Ok(outcome),
            Ok(ForwardedAnswer::Err(e)) => Err(e),
            Err(e) => {
                tracing::warn!(device = device_id, replica = %base, error = %e, "the holder replica answered a device job unreadably");
                Err(offline("the replica holding its runner answered unreadably".into()))
            }
        }
    }

    /// Sends one signed job to `device_id`'s runner and waits for its outcome.
    ///
    /// Errors: `device_offline` when no runner holds a lease here, or the store no longer
    /// names this process's connection as the device's (enrolled with a new key, connected
    /// again elsewhere: that connection is cut; nothing was sent); `device_revoked` when the
    /// store says the device is revoked (its connection here is cut, nothing was sent);
    /// `request_timeout` for a prepare or canonicalize whose job the runner's stream did not
    /// take (it stopped reading) within the wait below; once sent,
    /// when the runner stays away for a whole lease without answering: `outcome_unknown`
    /// for an execution (it may have run; it is never sent again), `device_offline` for
    /// prepare and canonicalize (which change nothing); `request_timeout` (503) for a prepare
    /// or canonicalize not answered within [`PREPARE_WAIT`] (or the job's validity, `job_ttl`,
    /// when shorter), the runner connected or not. `cancel` ends the wait.
    pub async fn job(
        &self,
        device_id: &str,
        spec: JobSpec,
        cancel: &CancellationToken,
    ) -> Result<JobOutcome, ToolError> {
        let offline = |when: &str| {
            ToolError::new(ErrorCode::DeviceOffline, format!("the runner of device {device_id} is offline {when}"))
                .with_details(json!({"device_id": device_id}))
        };
        let conn = self.live(device_id).ok_or_else(|| offline("; nothing was sent to it"))?;
        // A revocation or a new enrollment made on another replica that could not tell this
        // one leaves the connection here until the runner's next heartbeat: every job asks the
        // store whether the device is still this connection's.
        let row = self
            .store
            .device_by_id(device_id)
            .await
            .map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))?;
        if let Some(at) = row.as_ref().and_then(|r| r.revoked_at.as_deref()) {
            self.cut_here(device_id, "revoked");
            return Err(ToolError::new(
                ErrorCode::DeviceRevoked,
                format!("device {device_id} was revoked at {at}; nothing was sent to it"),
            )
            .with_details(json!({"device_id": device_id})));
        }
        if row.as_ref().and_then(|r| r.session_sha256.as_deref()) != Some(conn.session_sha.as_str()) {
            self.cut_connection_here(device_id, &conn.session_sha, "no longer the device's connection");
            return Err(offline(
                "here: the runner connected here was replaced (enrolled with a new key, or connected again elsewhere); nothing was sent to it",
            ));
        }
        let nonce = self.nonces.issue(device_id, &spec.invocation_id);
        let envelope = JobEnvelope {
            version: PROTOCOL_VERSION,
            device_id: device_id.to_owned(),
            phase: spec.phase,
            invocation_id: spec.invocation_id.clone(),
            run_id: spec.run_id,
            owner_id: spec.owner_id,
            input_hash: mira_core::canonical::input_hash(&spec.tool_id, &spec.input),
            tool_id: spec.tool_id,
            input: spec.input,
            approval_id: spec.approval_id,
            workspace: spec.workspace,
            expires_at: crate::ids::now_plus_ms(millis(self.settings.job_ttl)),
            nonce: nonce.clone(),
        };
        let (tx, mut rx) = oneshot::channel();
        self.inner.lock().pending.insert(nonce.clone(), (device_id.to_owned(), tx));
        let _forget = PendingGuard { hub: self, nonce: nonce.clone() };
        // A prepare or canonicalize (a freeze waits on it) is bounded by the job's validity: a
        // runner that takes the job and never answers cannot hold the freeze (an execution is
        // bounded by its own time limit, which cancels it). The bound starts before the send:
        // a runner that stops reading its stream fills it, and the send waits for room.
        let wait = self.settings.job_ttl.min(PREPARE_WAIT);
        let answer_by = (spec.phase != JobPhase::Execute).then(|| tokio::time::Instant::now() + wait);
        let too_late = async move {
            match answer_by {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(too_late);
        let timed_out = || {
            ToolError::new(
                ErrorCode::RequestTimeout,
                format!("the runner of device {device_id} did not answer within {} s; try again", wait.as_secs()),
            )
            .with_details(json!({"device_id": device_id}))
        };
        tokio::select! {
            sent = conn.tx.send(ServerMessage::Job(SignedJob::seal(&envelope, &self.key))) => {
                if sent.is_err() {
                    return Err(offline("; nothing was sent to it"));
                }
            }
            () = &mut too_late => return Err(timed_out()),
            () = cancel.cancelled() => {
                return Err(ToolError::new(
                    ErrorCode::Cancelled,
                    format!("stopped while the runner of device {device_id} did not read its stream; nothing was sent to it"),
                ));
            }
        }
        let mut away_since: Option<Instant> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                outcome = &mut rx => {
                    return outcome.map_err(|_| ToolError::new(ErrorCode::Internal, "the job's waiter was dropped"));
                }
                () = &mut too_late => return Err(timed_out()),
                () = cancel.cancelled() => {
                    return Err(ToolError::new(ErrorCode::Cancelled, format!("stopped while device {device_id} ran it")));
                }
                _ = tick.tick() => {
                    if self.live(device_id).is_some() {
                        away_since = None;
                        continue;
                    }
                    let since = *away_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < self.settings.lease {
                        continue;
                    }
                    return Err(if spec.phase == JobPhase::Execute {
                        ToolError::new(
                            ErrorCode::OutcomeUnknown,
                            format!("the job was sent to device {device_id}, whose runner went away before it answered; whether it ran is unknown and it is not run again"),
                        )
                        .with_details(json!({"device_id": device_id, "invocation_id": spec.invocation_id}))
                    } else {
                        offline("; it went away before it answered")
                    });
                }
            }
        }
    }
}

struct PendingGuard<'a> {
    hub: &'a DeviceHub,
    nonce: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.hub.inner.lock().pending.remove(&self.nonce);
    }
}

/// Longest a prepare or canonicalize job is waited for (or the job's validity, when shorter):
/// a freeze waits on it, and a job forwarded from another replica must be answered well
/// within the idle timeout of the connection it travels on (60 s by default).
pub const PREPARE_WAIT: Duration = Duration::from_secs(30);

/// What a job is about (the hub adds the device, the hash, the expiry and the nonce).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    /// What to do.
    pub phase: JobPhase,
    /// The invocation (empty for prepare and canonicalize).
    pub invocation_id: String,
    /// The run.
    pub run_id: String,
    /// The calling user.
    pub owner_id: String,
    /// The tool.
    pub tool_id: String,
    /// The input.
    pub input: Value,
    /// The granted approval of an execution.
    pub approval_id: Option<String>,
    /// The workspace root on the device.
    pub workspace: String,
}
