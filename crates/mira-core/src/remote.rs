//! The remote-device protocol between the control plane (`mira serve`) and a runner on a
//! user's own machine (`mira-runner`): the messages, the signed job envelope and the
//! signatures (Ed25519, RFC 8032), shared by both sides so that they sign and verify the
//! very same bytes.
//!
//! - **Enrollment**: the runner generates its key pair, sends the public key with a one-time
//!   code ([`EnrollRequest`]) and pins the control plane's public key from the answer
//!   ([`EnrollAnswer`]).
//! - **Connection**: the runner asks for a challenge ([`ChallengeRequest`]), signs
//!   [`connect_message`] with its device key ([`ConnectRequest`]) and keeps the answer open: a
//!   stream of [`ServerMessage`] lines (NDJSON). It renews its lease with heartbeats and posts
//!   job results ([`JobResult`]) with the session token of the welcome.
//! - **Jobs**: every job is a [`JobEnvelope`] serialised as canonical JSON (RFC 8785) and
//!   signed by the control plane over [`JOB_DOMAIN`] followed by those bytes
//!   ([`SignedJob`]). The runner verifies the signature under the pinned key, recomputes
//!   the input hash ([`crate::canonical::input_hash`]) from the canonical input, checks the
//!   expiry and its own policy before it runs anything ([`SignedJob::open`]).
//!
//! Keys and signatures travel as lowercase hex.

use ed25519_dalek::{Signature, Signer, Verifier};
/// The Ed25519 key types (ed25519-dalek), re-exported for users of the protocol.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{input_hash, to_canonical_string};
use crate::error_code::ErrorCode;
use crate::tool::{ToolError, ToolOutput};

/// Version of the protocol (in every envelope; a runner refuses other versions).
pub const PROTOCOL_VERSION: u32 = 1;
/// Domain separation prefix of a job signature.
pub const JOB_DOMAIN: &[u8] = b"mira-job-v1\n";
/// Domain separation prefix of a connection challenge signature.
pub const CONNECT_DOMAIN: &[u8] = b"mira-runner-connect-v1\n";
/// Capabilities a runner of this build advertises (Read and Edit tools).
pub const RUNNER_CAPABILITIES: [&str; 2] = ["fs.read", "fs.write"];
/// The capability a runner adds to [`RUNNER_CAPABILITIES`] when it can run terminal
/// sessions (`terminal_session`): it opened a PTY when it started.
pub const TERMINAL_CAPABILITY: &str = "pty";
/// Largest body of one `POST /v1/runner/terminal/output`, in bytes of output.
pub const TERMINAL_CHUNK_MAX: usize = 256 * 1024;
/// The capability of a runner started with `--attach-browser`: it carries DevTools messages
/// between the control plane and a Chromium on the device's loopback ([`CdpDown`],
/// `POST /v1/runner/cdp`).
pub const BROWSER_CAPABILITY: &str = "browser";
/// Domain separation prefix of a DevTools frame's signature ([`CdpDown`]).
pub const CDP_DOMAIN: &[u8] = b"mira-cdp-v1\n";
/// Largest body of one `POST /v1/runner/cdp`: one DevTools message of
/// [`crate::devtools::MAX_MESSAGE_BYTES`] and the line around it.
pub const CDP_UPLOAD_MAX: usize = crate::devtools::MAX_MESSAGE_BYTES + 64 * 1024;
/// The runner gathers queued browser messages into one upload up to this many bytes (a
/// single larger message goes alone).
pub const CDP_BATCH_BYTES: usize = 1 << 20;

/// The id of the terminal session a device's `start` execution opens: `term_` and the first
/// 16 bytes (hex) of SHA-256 over `"mira-device-terminal\n"` and the invocation id. Both
/// sides derive it from the signed envelope, so the runner cannot choose another and the
/// control plane knows where the output of that invocation's session belongs.
pub fn device_terminal_session_id(invocation_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"mira-device-terminal\n");
    h.update(invocation_id.as_bytes());
    format!("term_{}", hex::encode(&h.finalize()[..16]))
}

/// The state of a terminal session on a device, as its runner reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceSessionState {
    /// The leader process runs.
    Running,
    /// The leader exited by itself.
    Exited,
    /// A `kill` action (or a cancel) ended it.
    Killed,
    /// It outlived its life limit.
    TimedOut,
    /// It sat idle past the idle limit, or the runner stopped.
    Reaped,
}

/// Query of `POST /v1/runner/terminal/output` (the body is the raw output bytes
/// `[offset, offset + len)`, at most [`TERMINAL_CHUNK_MAX`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TerminalChunkQuery {
    /// The session ([`device_terminal_session_id`]).
    pub session_id: String,
    /// Byte offset of the first byte of the body in the session's output.
    pub offset: u64,
}

/// Answer of `POST /v1/runner/terminal/output` and `…/end`: the bytes the control plane
/// holds (`bytes_out`), so the runner resends from there when a chunk was lost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TerminalAck {
    /// Bytes of the session's output stored so far.
    pub bytes_out: u64,
}

/// Body of `POST /v1/runner/terminal/end`: how a device's session ended, after all its
/// output was acknowledged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TerminalEnd {
    /// The session.
    pub session_id: String,
    /// Bytes of output in all.
    pub bytes_out: u64,
    /// How it ended (never `running`).
    pub state: DeviceSessionState,
    /// Why, in words.
    pub end_reason: Option<String>,
    /// Exit code, when the leader exited.
    pub exit_code: Option<i64>,
    /// Signal name, when a signal ended it.
    pub signal: Option<String>,
}

/// A key pair made from 32 secret bytes (an Ed25519 seed).
pub fn signing_key(seed: &[u8; 32]) -> SigningKey {
    SigningKey::from_bytes(seed)
}

/// The public key of `key` as hex (64 digits).
pub fn public_hex(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().to_bytes())
}

/// Parses a hex public key. None when it is not 32 bytes of hex or not a valid point.
pub fn parse_public(hex_key: &str) -> Option<VerifyingKey> {
    let bytes: [u8; 32] = hex::decode(hex_key).ok()?.try_into().ok()?;
    VerifyingKey::from_bytes(&bytes).ok()
}

/// Signs `domain || message` with `key`; the signature as hex (128 digits).
pub fn sign(key: &SigningKey, domain: &[u8], message: &[u8]) -> String {
    if domain.is_empty() {
        // No copy of a message that is already complete (a run bundle: up to 64 MiB).
        return hex::encode(key.sign(message).to_bytes());
    }
    let mut bytes = Vec::with_capacity(domain.len() + message.len());
    bytes.extend_from_slice(domain);
    bytes.extend_from_slice(message);
    hex::encode(key.sign(&bytes).to_bytes())
}

/// Whether `signature` (hex) signs `domain || message` under `public`.
pub fn verify(public: &VerifyingKey, domain: &[u8], message: &[u8], signature: &str) -> bool {
    let Some(sig) = hex::decode(signature).ok().and_then(|b| <[u8; 64]>::try_from(b).ok()) else {
        return false;
    };
    let mut bytes = Vec::with_capacity(domain.len() + message.len());
    bytes.extend_from_slice(domain);
    bytes.extend_from_slice(message);
    public.verify(&bytes, &Signature::from_bytes(&sig)).is_ok()
}

/// The bytes a runner signs to answer a challenge: `device_id`, a newline, the challenge.
pub fn connect_message(device_id: &str, challenge: &str) -> Vec<u8> {
    format!("{device_id}\n{challenge}").into_bytes()
}

/// Body of `POST /v1/runner/enroll`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnrollRequest {
    /// The one-time code `POST /v1/devices` returned.
    pub code: String,
    /// The device's Ed25519 public key (hex).
    pub public_key: String,
}

/// Answer of `POST /v1/runner/enroll`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnrollAnswer {
    /// The enrolled device.
    pub device_id: String,
    /// Its display name.
    pub name: String,
    /// The control plane's Ed25519 public key (hex), which the runner pins.
    pub server_public_key: String,
}

/// Body of `POST /v1/runner/challenge`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChallengeRequest {
    /// The device asking.
    pub device_id: String,
}

/// Answer of `POST /v1/runner/challenge`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChallengeAnswer {
    /// Random hex, valid once for a short time.
    pub challenge: String,
}

/// A workspace folder the runner was given (`--workspace`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdvertisedWorkspace {
    /// Absolute, canonical path on the device.
    pub path: String,
}

/// What a runner advertises when it connects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Advertised {
    /// Capability strings (`fs.read`, `fs.write`).
    pub capabilities: Vec<String>,
    /// Tool ids the runner implements.
    pub tools: Vec<String>,
    /// Its workspace folders.
    pub workspaces: Vec<AdvertisedWorkspace>,
    /// The runner's version.
    pub version: String,
    /// The sandbox its terminal sessions get (None from a runner without one: an older
    /// runner, or one that runs no terminal sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<AdvertisedSandbox>,
}

/// The sandbox a runner's terminal sessions get on its device (docs/runner.md "Isolation").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdvertisedSandbox {
    /// `enforced`, `unavailable` or `off` (`--sandbox off`).
    pub state: String,
    /// When enforced: `landlock+mount_namespace` (a private view of the filesystem, then
    /// Landlock) or `landlock` (Landlock on the device's own view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<String>,
    /// Why it is not enforced, or why the private view could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What terminal sessions get when it is not enforced: `refused`
    /// (`sandbox_unavailable`) or `unsandboxed_allowed` (`--allow-unsandboxed`); `sandboxed`
    /// when it is.
    pub sessions: String,
    /// The device kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
}

/// Body of `POST /v1/runner/connect`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectRequest {
    /// The device.
    pub device_id: String,
    /// The challenge it was given.
    pub challenge: String,
    /// [`sign`] of [`connect_message`] under [`CONNECT_DOMAIN`] with the device key.
    pub signature: String,
    /// What it offers.
    pub advertised: Advertised,
}

/// One line of the connection stream, from the control plane to the runner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// First line: the session token for heartbeats and results, and the lease.
    Welcome {
        /// Bearer token of this connection (`Authorization: Bearer …` on heartbeats and
        /// results); it dies with the connection.
        session: String,
        /// The heartbeat lease in milliseconds: without a heartbeat for this long the device
        /// is `device_offline`.
        lease_ms: u64,
        /// How often to send a heartbeat, in milliseconds.
        heartbeat_ms: u64,
    },
    /// A job to run.
    Job(SignedJob),
    /// A DevTools frame for the browser this runner attaches (`--attach-browser`); sent only
    /// to runners that advertised [`BROWSER_CAPABILITY`].
    Cdp(CdpDown),
    /// Keeps idle connections alive.
    Ping,
}

/// What a [`CdpDown`] frame asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CdpOp {
    /// Open a DevTools connection to the device's browser for this channel.
    Open,
    /// Send `data` (one DevTools command as JSON text) to the browser.
    Message,
    /// Close the channel's DevTools connection.
    Close,
}

/// A DevTools frame from the control plane to a runner, signed like a job (Ed25519 over
/// [`CDP_DOMAIN`] + [`CdpDown::signed_bytes`]), in order per channel (`seq` from 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdpDown {
    /// The device it is for.
    pub device_id: String,
    /// The channel (one DevTools connection; chosen by the control plane, random).
    pub channel: String,
    /// 0 for `open`, then one more per frame of the channel.
    pub seq: u64,
    /// What to do.
    pub op: CdpOp,
    /// The DevTools command (`message`), else empty.
    #[serde(default)]
    pub data: String,
    /// Hex signature.
    pub signature: String,
}

impl CdpDown {
    /// The bytes the signature covers: device, channel, seq, op and data, one per line
    /// (data last, as it is).
    pub fn signed_bytes(device_id: &str, channel: &str, seq: u64, op: CdpOp, data: &str) -> Vec<u8> {
        let op = match op {
            CdpOp::Open => "open",
            CdpOp::Message => "message",
            CdpOp::Close => "close",
        };
        format!("{device_id}\n{channel}\n{seq}\n{op}\n{data}").into_bytes()
    }

    /// A frame signed with the control plane's `key`.
    pub fn seal(key: &SigningKey, device_id: &str, channel: &str, seq: u64, op: CdpOp, data: String) -> Self {
        let signature = sign(key, CDP_DOMAIN, &Self::signed_bytes(device_id, channel, seq, op, &data));
        Self { device_id: device_id.to_owned(), channel: channel.to_owned(), seq, op, data, signature }
    }

    /// Whether the frame is signed by `public` and for `device_id`.
    pub fn verify(&self, public: &VerifyingKey, device_id: &str) -> bool {
        self.device_id == device_id
            && verify(
                public,
                CDP_DOMAIN,
                &Self::signed_bytes(&self.device_id, &self.channel, self.seq, self.op, &self.data),
                &self.signature,
            )
    }
}

/// Query of `POST /v1/runner/cdp` (session bearer): the browser's messages of `channel`,
/// the body holding them one per line (`seq` counts uploads of the channel from 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CdpUpQuery {
    /// The channel.
    pub channel: String,
    /// This upload's number in the channel, from 0.
    pub seq: u64,
}

/// Body of `POST /v1/runner/cdp/state` (session bearer): a channel's DevTools connection on
/// the device opened, or closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CdpState {
    /// Connected to the browser's WebSocket.
    Open {
        /// The channel.
        channel: String,
        /// The browser's product (`Chrome/…`, from `/json/version`).
        product: String,
        /// The path of the browser's WebSocket (`/devtools/browser/…`).
        ws_path: String,
    },
    /// The connection could not open, or closed.
    Closed {
        /// The channel.
        channel: String,
        /// Why.
        reason: String,
    },
}

/// What a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    /// Canonicalise and inspect (the freeze): the canonical input and the approval preview;
    /// changes nothing.
    Prepare,
    /// Canonicalise only (a retried call is compared with the frozen one); changes nothing.
    Canonicalize,
    /// Execute the frozen, approved call — at most once.
    Execute,
}

/// The exact job: what the control plane signs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEnvelope {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The device it is for.
    pub device_id: String,
    /// What to do.
    pub phase: JobPhase,
    /// The invocation (`inv_…`; empty for prepare and canonicalize).
    pub invocation_id: String,
    /// The run.
    pub run_id: String,
    /// The calling user.
    pub owner_id: String,
    /// The tool.
    pub tool_id: String,
    /// The input (canonical for execute).
    pub input: Value,
    /// [`input_hash`] of `tool_id` and `input`.
    pub input_hash: String,
    /// The granted approval (execute of a gated call).
    pub approval_id: Option<String>,
    /// Workspace root on the device.
    pub workspace: String,
    /// RFC 3339 time after which the runner refuses it.
    pub expires_at: String,
    /// Random hex, unique per job: the runner's replay key.
    pub nonce: String,
}

/// A job envelope with the control plane's signature.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedJob {
    /// The envelope as canonical JSON text (the signed bytes).
    pub envelope: String,
    /// [`sign`] of `envelope` under [`JOB_DOMAIN`] (hex).
    pub signature: String,
}

impl SignedJob {
    /// Signs `envelope` with the control plane's `key`.
    pub fn seal(envelope: &JobEnvelope, key: &SigningKey) -> Self {
        let text = serde_json::to_value(envelope).map(|v| to_canonical_string(&v)).unwrap_or_default();
        let signature = sign(key, JOB_DOMAIN, text.as_bytes());
        Self { envelope: text, signature }
    }

    /// The envelope without any check: only for naming the job in a refusal.
    pub fn peek(&self) -> Option<JobEnvelope> {
        serde_json::from_str(&self.envelope).ok()
    }

    /// Verifies and opens the job for `device_id` at `now` (RFC 3339 as stored): the
    /// signature under the pinned `server` key (`job_signature_invalid`), the version and
    /// shape, the device (`job_wrong_device`), the input hash (`job_input_mismatch`) and the
    /// expiry (`job_expired`). Replays and the workspace are the runner's own checks.
    pub fn open(&self, server: &VerifyingKey, device_id: &str, now: &str) -> Result<JobEnvelope, ToolError> {
        if !verify(server, JOB_DOMAIN, self.envelope.as_bytes(), &self.signature) {
            return Err(ToolError::new(
                ErrorCode::JobSignatureInvalid,
                "the job's signature does not verify under the control plane key pinned at enrollment; nothing was run",
            ));
        }
        let env: JobEnvelope = serde_json::from_str(&self.envelope).map_err(|e| {
            ToolError::new(ErrorCode::CorruptInput, format!("the signed job does not parse: {e}; nothing was run"))
        })?;
        if env.version != PROTOCOL_VERSION {
            return Err(ToolError::new(
                ErrorCode::CorruptInput,
                format!("protocol version {} is not {PROTOCOL_VERSION}; nothing was run", env.version),
            ));
        }
        if env.device_id != device_id {
            return Err(ToolError::new(
                ErrorCode::JobWrongDevice,
                format!("the job is for device {}, this is {device_id}; nothing was run", env.device_id),
            ));
        }
        let recomputed = input_hash(&env.tool_id, &env.input);
        if recomputed != env.input_hash {
            return Err(ToolError::new(
                ErrorCode::JobInputMismatch,
                "the job's input does not hash to its input_hash; nothing was run",
            )
            .with_details(serde_json::json!({"input_hash": env.input_hash, "recomputed": recomputed})));
        }
        if env.expires_at.as_str() <= now {
            return Err(ToolError::new(
                ErrorCode::JobExpired,
                format!("the job expired at {}; nothing was run", env.expires_at),
            )
            .with_details(serde_json::json!({"expires_at": env.expires_at, "now": now})));
        }
        Ok(env)
    }
}

/// What a job produced on the device.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum JobOutcome {
    /// Executed: the tool's output and evidence.
    Output {
        /// The tool's output.
        output: ToolOutput,
    },
    /// Prepared: the canonical input and the preview.
    Prepared {
        /// The canonical input.
        input: Value,
        /// The approval preview.
        preview: Value,
    },
    /// Canonicalised.
    Canonical {
        /// The canonical input.
        input: Value,
    },
    /// Refused by the runner, or the tool failed.
    Error {
        /// The error.
        error: ToolError,
    },
}

/// Body of `POST /v1/runner/results`: the outcome of the job with this nonce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    /// The job's nonce.
    pub nonce: String,
    /// The job's invocation (empty for prepare and canonicalize).
    pub invocation_id: String,
    /// What happened.
    pub outcome: JobOutcome,
    /// True when the result is delivered after a reconnect.
    #[serde(default)]
    pub late: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> JobEnvelope {
        let input = serde_json::json!({"path": "a.txt"});
        JobEnvelope {
            version: PROTOCOL_VERSION,
            device_id: "dev_a".into(),
            phase: JobPhase::Execute,
            invocation_id: "inv_1".into(),
            run_id: "run_1".into(),
            owner_id: "usr_1".into(),
            tool_id: "read_open".into(),
            input_hash: input_hash("read_open", &input),
            input,
            approval_id: None,
            workspace: "/tmp/w".into(),
            expires_at: "2999-01-01T00:00:00.000Z".into(),
            nonce: "n1".into(),
        }
    }

    #[test]
    fn devtools_frames_verify_only_as_signed_for_their_device() {
        let server = signing_key(&[7; 32]);
        let public = server.verifying_key();
        let f = CdpDown::seal(&server, "dev_a", "cdp_1", 3, CdpOp::Message, r#"{"id":1}"#.into());
        assert!(f.verify(&public, "dev_a"));
        assert!(!f.verify(&public, "dev_b"));
        for tampered in [
            CdpDown { seq: 4, ..f.clone() },
            CdpDown { channel: "cdp_2".into(), ..f.clone() },
            CdpDown { op: CdpOp::Open, ..f.clone() },
            CdpDown { data: r#"{"id":2}"#.into(), ..f.clone() },
            CdpDown { device_id: "dev_b".into(), ..f.clone() },
        ] {
            assert!(!tampered.verify(&public, &tampered.device_id.clone()), "{tampered:?}");
        }
        let forged = CdpDown::seal(&signing_key(&[8; 32]), "dev_a", "cdp_1", 3, CdpOp::Message, r#"{"id":1}"#.into());
        assert!(!forged.verify(&public, "dev_a"));
        // A frame on the stream as the runner reads it.
        let line = serde_json::to_string(&ServerMessage::Cdp(f.clone())).unwrap();
        assert!(line.starts_with(r#"{"type":"cdp""#), "{line}");
        assert!(matches!(serde_json::from_str::<ServerMessage>(&line).unwrap(), ServerMessage::Cdp(g) if g == f));
    }

    #[test]
    fn device_terminal_ids_are_the_invocations_own() {
        let a = device_terminal_session_id("inv_1");
        assert_eq!(a, device_terminal_session_id("inv_1"));
        assert_ne!(a, device_terminal_session_id("inv_2"));
        assert!(crate::ids::is_well_formed(&a, "term"), "{a}");
    }

    #[test]
    fn a_sealed_job_opens_and_every_tampering_is_refused() {
        let server = signing_key(&[7; 32]);
        let public = server.verifying_key();
        let job = SignedJob::seal(&envelope(), &server);
        let now = "2026-01-01T00:00:00.000Z";
        assert_eq!(job.open(&public, "dev_a", now).ok(), Some(envelope()));
        let wrong = |j: &SignedJob, dev: &str, now: &str| j.open(&public, dev, now).err().map(|e| e.code);
        assert_eq!(wrong(&job, "dev_b", now), Some(ErrorCode::JobWrongDevice));
        assert_eq!(wrong(&job, "dev_a", "2999-01-01T00:00:00.001Z"), Some(ErrorCode::JobExpired));
        let tampered = SignedJob { envelope: job.envelope.replace("a.txt", "b.txt"), ..job.clone() };
        assert_eq!(wrong(&tampered, "dev_a", now), Some(ErrorCode::JobSignatureInvalid));
        let forged = SignedJob::seal(&envelope(), &signing_key(&[8; 32]));
        assert_eq!(wrong(&forged, "dev_a", now), Some(ErrorCode::JobSignatureInvalid));
        let mut bad_hash = envelope();
        bad_hash.input = serde_json::json!({"path": "other.txt"});
        assert_eq!(wrong(&SignedJob::seal(&bad_hash, &server), "dev_a", now), Some(ErrorCode::JobInputMismatch));
    }
}
