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
//! One process holds a runner's connection: in a cluster a runner connects to one replica,
//! and calls for its device run there (the other replicas answer `device_offline`).

pub mod enroll_limit;
pub mod executor;
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
    tx: mpsc::Sender<ServerMessage>,
    cut: CancellationToken,
    last_beat: Mutex<Instant>,
    advertised: Advertised,
}

#[derive(Default)]
struct Inner {
    connections: HashMap<String, Arc<Connection>>,
    challenges: HashMap<String, (String, Instant)>,
    pending: HashMap<String, oneshot::Sender<JobOutcome>>,
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
        let mut inner = self.hub.inner.lock();
        if inner.connections.get(&self.device_id).is_some_and(|c| c.session == self.session) {
            inner.connections.remove(&self.device_id);
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
    /// A hub signing jobs with `key`.
    pub fn new(store: Store, key: SigningKey, settings: DeviceSettings) -> Self {
        let enroll_limit =
            enroll_limit::EnrollLimiter::new(settings.enroll_failures_per_address, settings.enroll_failures_global);
        Self {
            store,
            key,
            settings,
            inner: Mutex::new(Inner::default()),
            enroll_limit,
            terminal_wake: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The control plane's public key (hex), which runners pin at enrollment.
    pub fn public_key(&self) -> String {
        mira_core::remote::public_hex(&self.key)
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
        let row = match self.store.enroll_device(&sha, &req.public_key, &crate::ids::now()).await {
            Ok(Some(row)) => {
                self.enroll_limit.refund(attempt);
                row
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
        tracing::info!(device = %row.id, "device enrolled");
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
        let mut inner = self.inner.lock();
        inner.challenges.retain(|_, (_, at)| at.elapsed() < CHALLENGE_TTL);
        inner.challenges.insert(challenge.clone(), (device_id.to_owned(), Instant::now()));
        Ok(ChallengeAnswer { challenge })
    }

    /// Attaches a runner that signed its challenge: a newer connection of the same device
    /// replaces (cuts) the older one. Errors: `device_auth_failed`, `device_revoked`.
    pub async fn connect(self: &Arc<Self>, req: ConnectRequest) -> Result<Attached, HubError> {
        let row = self.usable_device(&req.device_id).await?;
        let failed = |why: &str| {
            HubError::Refused(ErrorCode::DeviceAuthFailed, format!("device {} cannot connect: {why}", req.device_id))
        };
        let issued = self.inner.lock().challenges.remove(&req.challenge);
        match issued {
            Some((device, at)) if device == req.device_id && at.elapsed() < CHALLENGE_TTL => {}
            _ => return Err(failed("the challenge is unknown, used or expired")),
        }
        let public =
            row.public_key.as_deref().and_then(mira_core::remote::parse_public).ok_or_else(|| failed("no key"))?;
        let message = mira_core::remote::connect_message(&req.device_id, &req.challenge);
        if !mira_core::remote::verify(&public, mira_core::remote::CONNECT_DOMAIN, &message, &req.signature) {
            return Err(failed("the signature does not verify under the enrolled key"));
        }
        let advertised = serde_json::to_string(&req.advertised).ok();
        self.store.touch_device(&req.device_id, &crate::ids::now(), advertised.as_deref()).await?;
        let (tx, rx) = mpsc::channel(CONNECTION_BUFFER);
        let session = format!("mrs_{}", random_hex(24));
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
            tx,
            cut: cut.clone(),
            last_beat: Mutex::new(Instant::now()),
            advertised: req.advertised,
        });
        if let Some(old) = self.inner.lock().connections.insert(req.device_id.clone(), conn) {
            old.cut.cancel();
        }
        tracing::info!(device = %req.device_id, "runner connected");
        Ok(Attached { rx, cut, guard: DetachGuard { hub: Arc::clone(self), device_id: req.device_id, session } })
    }

    fn by_session(&self, session: &str) -> Option<(String, Arc<Connection>)> {
        let inner = self.inner.lock();
        inner.connections.iter().find(|(_, c)| c.session == session).map(|(d, c)| (d.clone(), Arc::clone(c)))
    }

    fn session_refused() -> HubError {
        HubError::Refused(ErrorCode::DeviceAuthFailed, "the runner session is unknown or was cut; connect again".into())
    }

    /// Renews the lease of the connection holding `session`.
    pub async fn heartbeat(&self, session: &str) -> Result<(), HubError> {
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        *conn.last_beat.lock() = Instant::now();
        self.store.touch_device(&device, &crate::ids::now(), None).await?;
        Ok(())
    }

    /// Takes a job result from the connection holding `session`: the waiting call gets it.
    /// A result nobody waits for any more (the call ended meanwhile) is logged and dropped.
    pub fn deliver(&self, session: &str, result: JobResult) -> Result<(), HubError> {
        let (device, conn) = self.by_session(session).ok_or_else(Self::session_refused)?;
        *conn.last_beat.lock() = Instant::now();
        let waiter = self.inner.lock().pending.remove(&result.nonce);
        match waiter {
            Some(tx) => {
                let _ = tx.send(result.outcome);
            }
            None => {
                tracing::warn!(device = %device, invocation = %result.invocation_id, nonce = %result.nonce, late = result.late,
                "a runner delivered a result no call waits for any more; dropped")
            }
        }
        Ok(())
    }

    /// Revokes the caller's device and cuts its connection at once. False when it is not
    /// the caller's.
    pub async fn revoke(&self, owner_id: &str, device_id: &str) -> Result<bool, StoreError> {
        if !self.store.revoke_device(owner_id, device_id, &crate::ids::now()).await? {
            return Ok(false);
        }
        if let Some(conn) = self.inner.lock().connections.remove(device_id) {
            conn.cut.cancel();
            tracing::info!(device = device_id, "revoked device's runner cut");
        }
        Ok(true)
    }

    fn live(&self, device_id: &str) -> Option<Arc<Connection>> {
        let conn = self.inner.lock().connections.get(device_id).cloned()?;
        (conn.last_beat.lock().elapsed() < self.settings.lease && !conn.cut.is_cancelled()).then_some(conn)
    }

    /// Where `row` stands now.
    pub fn presence(&self, row: &DeviceRow) -> Presence {
        if let Some(at) = &row.revoked_at {
            return Presence::Revoked(at.clone());
        }
        if row.public_key.is_none() {
            return Presence::NotEnrolled;
        }
        match self.live(&row.id) {
            Some(conn) => Presence::Connected(conn.advertised.clone()),
            None => Presence::Offline { last_seen_at: row.last_seen_at.clone() },
        }
    }

    /// Sends one signed job to `device_id`'s runner and waits for its outcome.
    ///
    /// Errors: `device_offline` when no runner holds a lease (nothing was sent); once sent,
    /// when the runner stays away for a whole lease without answering: `outcome_unknown`
    /// for an execution (it may have run; it is never sent again), `device_offline` for
    /// prepare and canonicalize (which change nothing). `cancel` ends the wait.
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
        let nonce = random_hex(16);
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
        self.inner.lock().pending.insert(nonce.clone(), tx);
        let _forget = PendingGuard { hub: self, nonce: nonce.clone() };
        if conn.tx.send(ServerMessage::Job(SignedJob::seal(&envelope, &self.key))).await.is_err() {
            return Err(offline("; nothing was sent to it"));
        }
        let mut away_since: Option<Instant> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                outcome = &mut rx => {
                    return outcome.map_err(|_| ToolError::new(ErrorCode::Internal, "the job's waiter was dropped"));
                }
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

/// What a job is about (the hub adds the device, the hash, the expiry and the nonce).
#[derive(Debug, Clone)]
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
