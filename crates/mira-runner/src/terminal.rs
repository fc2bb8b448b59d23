//! `terminal_session` on a device: the PTYs run here, in the runner's process, and their
//! output is streamed outbound to the control plane, which stores it exactly as it stores
//! the output of its own PTYs (so its SSE stream, offsets and resume work unchanged).
//!
//! Every action arrives as a signed, checked job like any other ([`crate::runner`]): `start`
//! and every action on a session are executions of frozen, approved calls, run at most once
//! (the journal). The canonical input of `start` is resolved here, on the device's files
//! (cwd, the program found on the device's `PATH`, the environment). The `output` action
//! reads the stored output on the control plane and never reaches the device.
//!
//! Per session, as on the host (`src/tools/terminal/host.rs`):
//! - a reader thread copies PTY output into a bounded [`Ring`]; when the ring is full of
//!   bytes the control plane has not acknowledged, it waits (the program blocks on its next
//!   write): memory stays bounded while the control plane is unreachable;
//! - a waiter thread reaps the leader, kills everything it left behind
//!   ([`mira_tools::pty::kill_session`]) and publishes the exit;
//! - an uploader task posts the unacknowledged bytes (`POST /v1/runner/terminal/output`,
//!   with the connection's session bearer, at most [`TERMINAL_CHUNK_MAX`] bytes each, at
//!   their byte offset) and, once all is acknowledged after the exit, the end
//!   (`POST /v1/runner/terminal/end`). A chunk is resent from the offset the control plane
//!   acknowledged; a control plane that refuses the session (it recorded it `lost`, or does
//!   not know it) ends it here.
//!
//! Isolation: the cwd must be inside the run's workspace (one of the runner's `--workspace`
//! folders), and the program runs in the device's sandbox ([`crate::sandbox`]): the
//! spec it gets is part of the canonical `start` input and of the start's result, and is
//! checked again before it runs (`sandbox_changed`). docs/runner.md says what it covers.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use mira_core::error_code::ErrorCode;
use mira_core::remote::{
    DeviceSessionState, TERMINAL_CAPABILITY, TERMINAL_CHUNK_MAX, TerminalAck, TerminalChunkQuery, TerminalEnd,
    device_terminal_session_id,
};
use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use mira_tools::pty::{DEFAULT_ENV, INHERITED_ENV, SESSION_ENV, kill_session, shell_words};
use mira_tools::terminal_output::{Capture, Captured, Ring, head_tail};
use parking_lot::{Condvar, Mutex};
use portable_pty::{MasterPty, PtySize, native_pty_system};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::sandbox::{DeviceSandbox, SessionSandbox, failure_error};

/// Life limit of a session when `start` gives none: 1 hour.
pub const DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
/// Longest life limit: 24 hours.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Longest `wait`: 5 minutes.
pub const MAX_WAIT_MS: u64 = 300_000;
/// How long `wait` waits when it gives no `timeout_ms`: 30 s.
pub const DEFAULT_WAIT_MS: u64 = 30_000;
/// Default quiet time after `start`/`input` before the action returns its output.
pub const DEFAULT_SETTLE_MS: u64 = 300;
/// Longest an action waits for output to settle.
pub const MAX_SETTLE_MS: u64 = 10_000;
/// Quiet time of `wait until=idle` when it gives no `idle_ms`.
pub const DEFAULT_IDLE_MS: u64 = 500;
/// Longest `idle_ms`.
pub const MAX_IDLE_MS: u64 = 600_000;
/// PTY columns when `start` gives none / most.
pub const DEFAULT_COLS: u64 = 120;
/// Most PTY columns.
pub const MAX_COLS: u64 = 1000;
/// PTY rows when `start` gives none.
pub const DEFAULT_ROWS: u64 = 32;
/// Most PTY rows.
pub const MAX_ROWS: u64 = 500;
/// Live sessions one user may have on this device at once.
pub const MAX_SESSIONS_PER_USER: usize = 8;
/// Bytes of each session's newest output held here (unacknowledged bytes never leave it).
pub const RING_BYTES: usize = 1024 * 1024;
/// How long an ended session stays known here (for `wait`/`kill` reporting its end).
pub const KEEP_ENDED: Duration = Duration::from_secs(30 * 60);
/// Longest a write to a PTY may block before the action fails.
pub const INPUT_WRITE_LIMIT: Duration = Duration::from_secs(5);
/// A session quiet this long asks the control plane whether it still holds it.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);
/// How often unacknowledged output is sent when little is waiting.
pub const UPLOAD_EVERY: Duration = Duration::from_millis(100);

/// The runner's way out to the control plane for terminal output: the HTTP client, the
/// server and the bearer of the current connection (None while disconnected).
pub struct Uplink {
    client: reqwest::Client,
    server: String,
    token: watch::Sender<Option<String>>,
}

/// Why a post did not go through.
enum PostError {
    /// Try again later (no connection, a network error, a server error).
    Retry(String),
    /// The control plane refuses the session (unknown, ended, not this device's).
    Refused(String),
}

impl Uplink {
    /// An uplink to `server` through `client`.
    pub fn new(server: &str, client: reqwest::Client) -> Self {
        Self { client, server: server.trim_end_matches('/').to_owned(), token: watch::Sender::new(None) }
    }

    /// Sets the bearer of the current connection (None when it ended).
    pub fn set_session(&self, token: Option<String>) {
        self.token.send_replace(token);
    }

    async fn token(&self) -> String {
        let mut rx = self.token.subscribe();
        loop {
            if let Some(t) = rx.borrow_and_update().clone() {
                return t;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as self.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    async fn answer(resp: Result<reqwest::Response, reqwest::Error>) -> Result<TerminalAck, PostError> {
        let resp = resp.map_err(|e| PostError::Retry(e.to_string()))?;
        let status = resp.status();
        if status.is_success() {
            return resp.json::<TerminalAck>().await.map_err(|e| PostError::Retry(e.to_string()));
        }
        let body: Value = resp.json().await.unwrap_or_default();
        let code = body["error"]["code"].as_str().unwrap_or_default().to_owned();
        let message = format!("{status} {code}: {}", body["error"]["message"].as_str().unwrap_or_default());
        if status == reqwest::StatusCode::NOT_FOUND
            || (status == reqwest::StatusCode::CONFLICT && code != "invalid_offset")
        {
            Err(PostError::Refused(message))
        } else {
            Err(PostError::Retry(message))
        }
    }

    async fn post_chunk(&self, session_id: &str, offset: u64, data: Vec<u8>) -> Result<TerminalAck, PostError> {
        let token = self.token().await;
        let query = TerminalChunkQuery { session_id: session_id.to_owned(), offset };
        let resp = self
            .client
            .post(format!("{}/v1/runner/terminal/output", self.server))
            .bearer_auth(token)
            .query(&query)
            .header("content-type", "application/octet-stream")
            .body(data)
            .send()
            .await;
        Self::answer(resp).await
    }

    async fn post_end(&self, end: &TerminalEnd) -> Result<TerminalAck, PostError> {
        let token = self.token().await;
        let resp = self
            .client
            .post(format!("{}/v1/runner/terminal/end", self.server))
            .bearer_auth(token)
            .json(end)
            .send()
            .await;
        Self::answer(resp).await
    }
}

/// How a session ended.
#[derive(Debug, Clone)]
struct Exit {
    state: DeviceSessionState,
    end_reason: Option<String>,
    exit_code: Option<i64>,
    signal: Option<String>,
}

/// A session on this device.
struct DevSession {
    id: String,
    owner_id: String,
    pid: i32,
    cwd: String,
    command_line: String,
    ring: Mutex<Ring>,
    bytes: watch::Sender<u64>,
    exit: watch::Sender<Option<Exit>>,
    writer: Mutex<Box<dyn Write + Send>>,
    master: Mutex<Box<dyn MasterPty + Send>>,
    end_request: Mutex<Option<(DeviceSessionState, String)>>,
    /// Signalled when bytes are acknowledged (room for the waiting reader).
    room: Condvar,
    /// Wakes the uploader early.
    upload_wake: tokio::sync::Notify,
    reader_done: AtomicBool,
    /// Output before this offset was in the result of an action.
    reported_to: Mutex<u64>,
    ended_at: Mutex<Option<Instant>>,
}

impl DevSession {
    fn size(&self) -> (u16, u16) {
        self.master.lock().get_size().map_or((32, 120), |s| (s.rows, s.cols))
    }

    fn end_offset(&self) -> u64 {
        self.ring.lock().end()
    }

    fn exit_info(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    fn pump_output(&self, mut reader: Box<dyn Read + Send>) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let end = {
                    let mut ring = self.ring.lock();
                    let mut took = ring.push(rest);
                    while took == 0 {
                        self.upload_wake.notify_one();
                        self.room.wait(&mut ring);
                        took = ring.push(rest);
                    }
                    rest = &rest[took..];
                    ring.end()
                };
                self.upload_wake.notify_one();
                self.bytes.send_replace(end);
            }
        }
        self.reader_done.store(true, Ordering::Release);
        self.upload_wake.notify_one();
    }

    fn end(&self, state: DeviceSessionState, reason: String) {
        {
            let mut req = self.end_request.lock();
            if req.is_none() {
                *req = Some((state, reason));
            }
        }
        // Once the leader was reaped its pid (and so its session and group id) may name
        // another process by now: only the environment marker finds what it left.
        let leader = if self.exit_info().is_some() { 0 } else { self.pid };
        kill_session(leader, &self.id);
    }

    async fn write_input(self: &Arc<Self>, data: Vec<u8>) -> Result<(), ToolError> {
        let s = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut w = s.writer.lock();
            w.write_all(&data).and_then(|()| w.flush())
        });
        match tokio::time::timeout(INPUT_WRITE_LIMIT, job).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(ToolError::new(ErrorCode::PtyWriteFailed, format!("writing to the PTY: {e}"))),
            Ok(Err(e)) => Err(ToolError::new(ErrorCode::PtyWriteFailed, format!("writing to the PTY: {e}"))),
            Err(_) => Err(ToolError::new(
                ErrorCode::PtyInputBlocked,
                format!(
                    "the program has not read its input for {} s (the terminal's input buffer is full); interrupt or kill it",
                    INPUT_WRITE_LIMIT.as_secs()
                ),
            )),
        }
    }

    fn signal_foreground(&self, sig: i32) {
        let pgid = self.master.lock().process_group_leader().filter(|p| *p > 0).unwrap_or(self.pid);
        // SAFETY: killpg only sends a signal; a stale group id yields ESRCH, which is ignored.
        unsafe {
            libc::killpg(pgid, sig);
        }
    }

    /// Feeds `capture` what the ring holds from its next offset (bytes the ring no longer
    /// holds — acknowledged and pushed out — are named missed; they are in the control
    /// plane's store).
    fn pull(&self, capture: &mut Capture) {
        loop {
            let read = self.ring.lock().read(capture.next(), 256 * 1024);
            match read {
                Ok(b) if b.is_empty() => return,
                Ok(b) => capture.feed(&b),
                Err(start) => capture.skip_to(start),
            }
        }
    }

    fn state(&self) -> DeviceSessionState {
        self.exit_info().map_or(DeviceSessionState::Running, |e| e.state)
    }
}

/// `terminal_session` on this device.
pub struct DeviceTerminal {
    spec: ToolSpec,
    sessions: Mutex<HashMap<String, Arc<DevSession>>>,
    starting: Mutex<HashMap<String, usize>>,
    uplink: Arc<Uplink>,
    sandbox: Arc<DeviceSandbox>,
}

/// Whether this machine can open a PTY (the runner advertises [`TERMINAL_CAPABILITY`] only
/// then).
pub fn pty_works() -> bool {
    native_pty_system().openpty(PtySize { rows: 2, cols: 2, pixel_width: 0, pixel_height: 0 }).is_ok()
}

fn bad(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

/// Fields each action takes, and those it needs.
fn action_fields(action: &str) -> Option<(&'static [&'static str], &'static [&'static str])> {
    Some(match action {
        "start" => (&["command", "args", "cwd", "env", "timeout_ms", "cols", "rows", "settle_ms"], &[]),
        "input" => (&["session_id", "data", "settle_ms"], &["session_id", "data"]),
        "signal" => (&["session_id", "signal"], &["session_id", "signal"]),
        "resize" => (&["session_id", "cols", "rows"], &["session_id", "cols", "rows"]),
        "wait" => (&["session_id", "until", "idle_ms", "timeout_ms"], &["session_id"]),
        "kill" => (&["session_id"], &["session_id"]),
        "output" => {
            (&["session_id", "from", "to", "max_bytes", "pattern", "case_insensitive", "max_matches"], &["session_id"])
        }
        _ => return None,
    })
}

/// The per-action field rules (as on the host): `invalid_field`, then `missing_field`.
fn check_fields(input: &Value) -> Result<&str, ToolError> {
    let action = input.get("action").and_then(Value::as_str).unwrap_or_default();
    let (takes, needs) =
        action_fields(action).ok_or_else(|| bad(ErrorCode::InvalidField, format!("unknown action {action:?}")))?;
    let obj = input.as_object().ok_or_else(|| bad(ErrorCode::InvalidField, "the input is not an object"))?;
    if let Some(extra) = obj.keys().find(|k| *k != "action" && !takes.contains(&k.as_str())) {
        return Err(bad(ErrorCode::InvalidField, format!("action {action} does not take {extra}")));
    }
    if let Some(field) = needs.iter().find(|f| !obj.contains_key(**f)) {
        return Err(bad(ErrorCode::MissingField, format!("action {action} needs {field}")));
    }
    Ok(action)
}

fn u64_of(input: &Value, field: &str) -> Option<u64> {
    input.get(field).and_then(Value::as_u64)
}

fn str_of<'a>(input: &'a Value, field: &str) -> Option<&'a str> {
    input.get(field).and_then(Value::as_str)
}

/// Resolves `command` to the program that will run (as on the host).
fn resolve_program(command: &str, cwd: &Path, env: &Map<String, Value>) -> Result<String, ToolError> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if command.contains('/') {
        let p = cwd.join(command);
        return if executable(&p) {
            Ok(p.to_string_lossy().into_owned())
        } else {
            Err(bad(ErrorCode::CommandNotFound, format!("{} is not an executable file", p.display())))
        };
    }
    let path = match env.get("PATH") {
        Some(Value::String(p)) => p.clone(),
        _ => std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
    };
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(command))
        .find(|p| executable(p))
        .map(|p| p.to_string_lossy().into_owned())
        .ok_or_else(|| bad(ErrorCode::CommandNotFound, format!("{command} is not found on PATH")))
}

/// What a device session is given as its isolation in words, shown to the approver and in
/// the canonical input (next to the `sandbox` spec itself).
pub fn isolation(sandbox: &SessionSandbox) -> String {
    match (sandbox.enforced, sandbox.filesystem.as_deref()) {
        (true, Some(kind)) => format!(
            "device: cwd inside a --workspace folder of the runner; sandboxed ({kind}): the workspace read-write, system folders read-only, {}, the runner's state hidden, no capabilities, no_new_privs",
            if sandbox.private.as_ref().is_some_and(|p| p.shared_by_runner_sessions) {
                "this runner's tmp folder"
            } else {
                "a private tmp"
            }
        ),
        _ => format!(
            "device: cwd inside a --workspace folder of the runner; runs as the runner's user with no sandbox ({}; the runner allows unsandboxed sessions)",
            sandbox.reason.as_deref().unwrap_or("not enforced")
        ),
    }
}

/// The canonical `start` input and its preview, resolved on this device. Errors include
/// 403 `sandbox_unavailable` (see [`DeviceSandbox::spec`]).
fn prepare_start(input: &Value, ws_root: &Path, device_sandbox: &DeviceSandbox) -> Result<Prepared, ToolError> {
    let command_in = str_of(input, "command");
    let cwd_in = str_of(input, "cwd");
    let args: Vec<String> = match input.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|_| bad(ErrorCode::InvalidField, "args must be strings"))?
        }
    };
    let call_env: Map<String, Value> = match input.get("env") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad(ErrorCode::InvalidField, "env must be an object")),
    };
    let strings = [command_in, cwd_in]
        .into_iter()
        .flatten()
        .chain(args.iter().map(String::as_str))
        .chain(call_env.values().filter_map(Value::as_str));
    for v in strings {
        if v.contains('\0') {
            return Err(bad(ErrorCode::NulByte, "a value contains a NUL byte, which no program can receive"));
        }
    }
    if let Some((k, _)) = call_env.iter().find(|(_, v)| !(v.is_string() || v.is_null())) {
        return Err(bad(ErrorCode::InvalidEnv, format!("{k}: a variable's value is a string or null")));
    }
    let cwd = match cwd_in {
        None => ws_root.to_path_buf(),
        Some(c) => {
            let given = if Path::new(c).is_absolute() { Path::new(c).to_path_buf() } else { ws_root.join(c) };
            let real = std::fs::canonicalize(&given)
                .map_err(|e| ToolError::new(ErrorCode::CwdNotFound, format!("cwd {c}: {e}")))?;
            if !real.is_dir() {
                return Err(bad(ErrorCode::CwdNotADirectory, format!("cwd {} is not a directory", real.display())));
            }
            real
        }
    };
    // The runner's own boundary: a device session works inside the workspace only.
    if !cwd.starts_with(ws_root) {
        return Err(ToolError::new(
            ErrorCode::OutsideWorkspace,
            format!(
                "cwd {} is outside the workspace {}; a terminal on a device starts inside its workspace only",
                cwd.display(),
                ws_root.display()
            ),
        ));
    }
    if let Some(k) = call_env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(bad(ErrorCode::InvalidEnv, format!("{k:?} is not a valid environment variable name")));
    }
    // The sandbox the session will get: part of the frozen input (the approver sees it).
    let sandbox = device_sandbox.spec(ws_root)?;
    let mut env: std::collections::BTreeMap<String, Value> =
        INHERITED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), json!(v)))).collect();
    DeviceSandbox::environment(&sandbox, &mut env);
    env.extend(DEFAULT_ENV.iter().map(|(k, v)| ((*k).to_owned(), json!(v))));
    env.extend(call_env.clone());
    let env: Map<String, Value> = env.into_iter().collect();
    let command = match command_in {
        Some(c) => c.to_owned(),
        None => std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/bash".into()),
    };
    let program = resolve_program(&command, &cwd, &env)?;
    if sandbox.enforced && !DeviceSandbox::visible_in(&sandbox, Path::new(&program)) {
        return Err(bad(
            ErrorCode::CommandNotFound,
            format!("{program} is outside the folders the sandbox shows ({})", sandbox.read_only.join(", ")),
        ));
    }
    let timeout_ms = u64_of(input, "timeout_ms").unwrap_or(DEFAULT_TIMEOUT_MS).min(MAX_TIMEOUT_MS);
    let isolation = isolation(&sandbox);
    let canonical = json!({
        "action": "start",
        "command": command,
        "program": program,
        "args": args,
        "cwd": cwd.to_string_lossy(),
        "env": env,
        "timeout_ms": timeout_ms,
        "cols": u64_of(input, "cols").unwrap_or(DEFAULT_COLS).min(MAX_COLS),
        "rows": u64_of(input, "rows").unwrap_or(DEFAULT_ROWS).min(MAX_ROWS),
        "settle_ms": u64_of(input, "settle_ms").unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS),
        "isolation": isolation,
        "sandbox": sandbox,
    });
    let preview = json!({
        "command_line": shell_words(&command, &args),
        "program": program,
        "cwd": cwd.to_string_lossy(),
        "cwd_outside_workspace": false,
        "workspace": ws_root.to_string_lossy(),
        "env_set_by_call": call_env,
        "timeout_ms": timeout_ms,
        "isolation": isolation,
        "sandbox": sandbox,
    });
    Ok(Prepared { input: canonical, preview })
}

/// The canonical input of an action on a session (defaults filled in, as on the host).
fn canonical_action(action: &str, input: &Value) -> Result<Value, ToolError> {
    let id = str_of(input, "session_id").unwrap_or_default();
    Ok(match action {
        "input" => json!({
            "action": "input", "session_id": id, "data": str_of(input, "data").unwrap_or_default(),
            "settle_ms": u64_of(input, "settle_ms").unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS),
        }),
        "signal" => {
            let signal = str_of(input, "signal").unwrap_or_default();
            if !matches!(signal, "interrupt" | "eof" | "terminate" | "kill") {
                return Err(bad(
                    ErrorCode::InvalidField,
                    format!("signal {signal:?} is not interrupt, eof, terminate or kill"),
                ));
            }
            json!({"action": "signal", "session_id": id, "signal": signal})
        }
        "resize" => {
            json!({"action": "resize", "session_id": id, "cols": u64_of(input, "cols"), "rows": u64_of(input, "rows")})
        }
        "wait" => {
            let until = str_of(input, "until").unwrap_or("exit");
            let mut c = json!({
                "action": "wait", "session_id": id, "until": until,
                "timeout_ms": u64_of(input, "timeout_ms").unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS),
            });
            if until == "idle" {
                c["idle_ms"] = json!(u64_of(input, "idle_ms").unwrap_or(DEFAULT_IDLE_MS).min(MAX_IDLE_MS));
            }
            c
        }
        "kill" => json!({"action": "kill", "session_id": id}),
        "output" => canonical_output(id, input)?,
        other => return Err(bad(ErrorCode::InvalidField, format!("{other} is not an action this device runs"))),
    })
}

/// The canonical `output` input (as the host's `OutputQuery`: defaults filled in, a page or a
/// search). The pattern is compiled where it runs, on the control plane.
fn canonical_output(id: &str, input: &Value) -> Result<Value, ToolError> {
    const MAX_OFFSET: u64 = (1 << 53) - 1;
    let from = u64_of(input, "from").unwrap_or(0);
    let to = u64_of(input, "to");
    if from > MAX_OFFSET || to.is_some_and(|t| t > MAX_OFFSET) {
        return Err(bad(ErrorCode::InvalidField, format!("from and to must be byte offsets from 0 to {MAX_OFFSET}")));
    }
    if let Some(to) = to.filter(|to| *to < from) {
        return Err(bad(ErrorCode::InvalidRange, format!("from {from} is after to {to}")));
    }
    let pattern = str_of(input, "pattern");
    let misplaced: &[&str] = if pattern.is_some() { &["max_bytes"] } else { &["case_insensitive", "max_matches"] };
    if let Some(name) = misplaced.iter().find(|f| input.get(**f).is_some()) {
        let with = if pattern.is_some() { "with pattern (a search)" } else { "without pattern (a page)" };
        return Err(bad(ErrorCode::InvalidField, format!("output {with} does not take {name}")));
    }
    let mut c = json!({"action": "output", "session_id": id, "from": from});
    if let Some(to) = to {
        c["to"] = json!(to);
    }
    match pattern {
        Some(p) => {
            c["pattern"] = json!(p);
            c["case_insensitive"] = json!(input.get("case_insensitive").and_then(Value::as_bool) == Some(true));
            c["max_matches"] = json!(u64_of(input, "max_matches").unwrap_or(100).clamp(1, 1000));
        }
        None => c["max_bytes"] = json!(u64_of(input, "max_bytes").unwrap_or(64 * 1024).clamp(1, 1024 * 1024)),
    }
    Ok(c)
}

/// What a result says about a session.
fn facts(s: &DevSession) -> Value {
    let exit = s.exit_info();
    let (rows, cols) = s.size();
    json!({
        "id": s.id, "pid": s.pid, "cwd": s.cwd, "command_line": s.command_line,
        "state": s.state(),
        "exit_code": exit.as_ref().and_then(|e| e.exit_code),
        "signal": exit.as_ref().and_then(|e| e.signal.clone()),
        "end_reason": exit.as_ref().and_then(|e| e.end_reason.clone()),
        "rows": rows, "cols": cols,
    })
}

/// The result and evidence of an action that reports output (the host's shape).
fn result(input: &Value, s: &DevSession, out: &Captured, reason: &str) -> ToolOutput {
    let f = facts(s);
    let action = str_of(input, "action").unwrap_or_default();
    let output = json!({
        "session_id": s.id,
        "action": action,
        "returned_because": reason,
        "state": f["state"],
        "pid": s.pid,
        "exit_code": f["exit_code"],
        "signal": f["signal"],
        "end_reason": f["end_reason"],
        "output": out.text,
        "output_range": [out.from, out.to],
        "output_bytes": out.bytes,
        "output_bytes_missed": out.bytes_missed,
        "output_missed_ranges": out.missed_ranges,
        "output_truncated": out.truncated,
        "cwd": s.cwd,
        "command_line": s.command_line,
    });
    let provenance = json!({
        "session_id": s.id,
        "action": action,
        "input": input,
        "state": f["state"],
        "exit_code": f["exit_code"],
        "signal": f["signal"],
        "byte_range": [out.from, out.to],
        "bytes": out.bytes,
        "bytes_missed": out.bytes_missed,
        "missed_ranges": out.missed_ranges,
        "output_sha256": out.sha256,
        "render": "vt100",
        "cols": f["cols"],
        "rows": f["rows"],
    });
    let evidence = mira_core::evidence::EvidenceDraft {
        kind: "terminal_output".into(),
        provenance,
        content_sha256: out.sha256.clone(),
        excerpt: head_tail(&out.text, mira_core::evidence::EXCERPT_MAX_BYTES),
    };
    ToolOutput { output, evidence: vec![evidence] }
}

/// Follows output until the exit, `idle` of quiet (when given), or `timeout`; why it stopped.
async fn watch_output(
    s: &DevSession,
    capture: &mut Capture,
    idle: Option<Duration>,
    timeout: Duration,
) -> &'static str {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bytes = s.bytes.subscribe();
    let mut exit = s.exit.subscribe();
    let mut last_output = tokio::time::Instant::now();
    loop {
        s.pull(capture);
        if exit.borrow().is_some() {
            s.pull(capture);
            return "exit";
        }
        let quiet_until = idle.map(|d| last_output + d);
        let wake = quiet_until.map_or(deadline, |q| q.min(deadline));
        tokio::select! {
            changed = bytes.changed() => {
                if changed.is_ok() {
                    last_output = tokio::time::Instant::now();
                }
            }
            _ = exit.changed() => {}
            () = tokio::time::sleep_until(wake) => {
                s.pull(capture);
                if quiet_until.is_some_and(|q| q <= tokio::time::Instant::now()) && capture.next() == s.end_offset() {
                    return "idle";
                }
                if tokio::time::Instant::now() >= deadline {
                    return "timeout";
                }
            }
        }
    }
}

async fn settle(s: &DevSession, capture: &mut Capture, settle_ms: u64) -> &'static str {
    if settle_ms == 0 {
        s.pull(capture);
        return "returned";
    }
    watch_output(s, capture, Some(Duration::from_millis(settle_ms)), Duration::from_millis(MAX_SETTLE_MS)).await
}

impl DeviceTerminal {
    /// The tool, streaming output through `uplink`, its sessions in `sandbox`.
    pub fn new(uplink: Arc<Uplink>, sandbox: Arc<DeviceSandbox>) -> Self {
        let spec = ToolSpec {
            id: "terminal_session".into(),
            kind: ToolKind::Public,
            domain: "terminal".into(),
            title: "Terminal session".into(),
            description: "PTY sessions on this device (the control plane publishes the schema)".into(),
            input_schema: json!({"type": "object"}),
            requires_approval: true,
            capability: Some(TERMINAL_CAPABILITY.into()),
            replacement: None,
            owner: None,
        };
        Self { spec, sessions: Mutex::new(HashMap::new()), starting: Mutex::new(HashMap::new()), uplink, sandbox }
    }

    /// The caller's session `id` held here.
    fn session(&self, id: &str, owner_id: &str) -> Result<Arc<DevSession>, ToolError> {
        let mut sessions = self.sessions.lock();
        sessions.retain(|_, s| s.ended_at.lock().is_none_or(|at| at.elapsed() < KEEP_ENDED));
        sessions.get(id).filter(|s| s.owner_id == owner_id).cloned().ok_or_else(|| {
            ToolError::new(
                ErrorCode::TerminalSessionNotFound,
                format!("no terminal session {id} of yours on this device"),
            )
        })
    }

    /// Live sessions (for a runner stopping: they are ended).
    pub fn end_all(&self, reason: &str) {
        for s in self.sessions.lock().values() {
            s.end(DeviceSessionState::Reaped, reason.to_owned());
        }
    }

    async fn start(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let cwd = str_of(input, "cwd").unwrap_or_default().to_owned();
        let root = ctx.workspace()?.root();
        match std::fs::canonicalize(&cwd) {
            Ok(real) if real == Path::new(&cwd) && real.is_dir() && real.starts_with(root) => {}
            _ => {
                return Err(ToolError::new(
                    ErrorCode::StaleTarget,
                    format!("the approved cwd {cwd} is no longer that directory inside the workspace"),
                ));
            }
        }
        let owner = ctx.owner_id.clone();
        {
            let sessions = self.sessions.lock();
            let mut starting = self.starting.lock();
            let live = sessions.values().filter(|s| s.owner_id == owner && s.exit_info().is_none()).count();
            if live + starting.get(&owner).copied().unwrap_or(0) >= MAX_SESSIONS_PER_USER {
                return Err(ToolError::new(
                    ErrorCode::TerminalSessionLimit,
                    format!(
                        "you already have {MAX_SESSIONS_PER_USER} live terminal sessions on this device (the limit); kill one first"
                    ),
                ));
            }
            *starting.entry(owner.clone()).or_default() += 1;
        }
        let spawned = self.spawn(input, ctx);
        {
            let mut starting = self.starting.lock();
            if let Some(n) = starting.get_mut(&owner) {
                *n = n.saturating_sub(1);
            }
        }
        let session = spawned?;
        let (rows, cols) = session.size();
        let mut capture = Capture::new(0, rows, cols);
        let settle_ms = u64_of(input, "settle_ms").unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS);
        let reason = settle(&session, &mut capture, settle_ms).await;
        *session.reported_to.lock() = capture.next();
        let mut out = result(input, &session, &capture.finish(), reason);
        // The sandbox in force (the evidence holds it in its `input`).
        out.output["sandbox"] = input.get("sandbox").cloned().unwrap_or(Value::Null);
        Ok(out)
    }

    fn spawn(&self, input: &Value, ctx: &ExecContext) -> Result<Arc<DevSession>, ToolError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::process::CommandExt;
        let failed = |code: ErrorCode, m: String| ToolError::new(code, m);
        let id = device_terminal_session_id(&ctx.invocation_id);
        if self.sessions.lock().contains_key(&id) {
            return Err(failed(ErrorCode::JobReplayed, format!("session {id} was already started")));
        }
        let program = str_of(input, "program").unwrap_or_default().to_owned();
        let command = str_of(input, "command").unwrap_or_default().to_owned();
        let args: Vec<String> = input
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let cwd = str_of(input, "cwd").unwrap_or_default().to_owned();
        let cols = u16::try_from(u64_of(input, "cols").unwrap_or(DEFAULT_COLS).min(MAX_COLS)).unwrap_or(120);
        let rows = u16::try_from(u64_of(input, "rows").unwrap_or(DEFAULT_ROWS).min(MAX_ROWS)).unwrap_or(32);
        let timeout_ms = u64_of(input, "timeout_ms").unwrap_or(DEFAULT_TIMEOUT_MS).min(MAX_TIMEOUT_MS);
        // The sandbox that applies now must be the one approved.
        let now = self.sandbox.spec(ctx.workspace()?.root())?;
        let frozen: Option<SessionSandbox> = input.get("sandbox").and_then(|v| serde_json::from_value(v.clone()).ok());
        if frozen.as_ref() != Some(&now) {
            return Err(ToolError::new(
                ErrorCode::SandboxChanged,
                "the sandbox this session would get is not the one approved (the runner's sandbox or the workspace changed); freeze the call again",
            )
            .with_details(json!({"approved": input.get("sandbox"), "now": now})));
        }
        let launch = self.sandbox.launch(&now, Path::new(&cwd))?;
        let pair = native_pty_system()
            .openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 })
            .map_err(|e| failed(ErrorCode::PtyOpenFailed, format!("opening a PTY: {e}")))?;
        let tty =
            pair.master.tty_name().ok_or_else(|| failed(ErrorCode::PtyOpenFailed, "the PTY has no name".into()))?;
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&tty)
            .map_err(|e| failed(ErrorCode::PtyOpenFailed, format!("opening {}: {e}", tty.display())))?;
        let stdio = |f: &std::fs::File| -> Result<std::process::Stdio, ToolError> {
            f.try_clone().map(std::process::Stdio::from).map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()))
        };
        let mut cmd = std::process::Command::new(&program);
        cmd.args(&args).env_clear();
        for (k, v) in input.get("env").and_then(Value::as_object).into_iter().flatten() {
            if let Some(v) = v.as_str() {
                cmd.env(k, v);
            }
        }
        cmd.env(SESSION_ENV, &id).stdin(stdio(&slave)?).stdout(stdio(&slave)?).stderr(stdio(&slave)?);
        match &launch {
            // The plan enters the cwd itself (inside its new root) and makes the session.
            Some(launch) => launch.install(&mut cmd),
            None => {
                cmd.current_dir(&cwd);
                // SAFETY: `pty_session` only makes async-signal-safe system calls.
                unsafe {
                    cmd.pre_exec(|| mira_sandbox::child::pty_session());
                }
            }
        }
        let spawned = cmd.spawn();
        drop(cmd);
        drop(slave);
        drop(pair.slave);
        let mut child = match launch {
            Some(launch) => launch.finish(spawned).map(|(c, _)| c).map_err(|f| failure_error(&f))?,
            None => spawned.map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting {program}: {e}")))?,
        };
        let pid = i32::try_from(child.id()).unwrap_or(0);
        let reader = pair.master.try_clone_reader().map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()));
        let writer = pair.master.take_writer().map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()));
        let (reader, writer) = match (reader, writer) {
            (Ok(r), Ok(w)) => (r, w),
            (Err(e), _) | (_, Err(e)) => {
                kill_session(pid, &id);
                let _ = child.wait();
                return Err(e);
            }
        };
        let session = Arc::new(DevSession {
            id: id.clone(),
            owner_id: ctx.owner_id.clone(),
            pid,
            cwd,
            command_line: shell_words(&command, &args),
            ring: Mutex::new(Ring::new(RING_BYTES)),
            bytes: watch::Sender::new(0),
            exit: watch::Sender::new(None),
            writer: Mutex::new(writer),
            master: Mutex::new(pair.master),
            end_request: Mutex::new(None),
            room: Condvar::new(),
            upload_wake: tokio::sync::Notify::new(),
            reader_done: AtomicBool::new(false),
            reported_to: Mutex::new(0),
            ended_at: Mutex::new(None),
        });
        self.sessions.lock().insert(id.clone(), session.clone());
        let (read_done_tx, read_done_rx) = std::sync::mpsc::channel::<()>();
        let s = session.clone();
        std::thread::Builder::new()
            .name(format!("pty-read-{pid}"))
            .spawn(move || {
                s.pump_output(reader);
                let _ = read_done_tx.send(());
            })
            .map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting the PTY reader: {e}")))?;
        let s = session.clone();
        std::thread::Builder::new()
            .name(format!("pty-wait-{pid}"))
            .spawn(move || {
                let status = child.wait().map(portable_pty::ExitStatus::from);
                kill_session(s.pid, &s.id);
                let _ = read_done_rx.recv_timeout(Duration::from_secs(2));
                let (code, signal) = match &status {
                    Ok(st) => match st.signal() {
                        Some(sig) => (None, Some(sig.to_owned())),
                        None => (Some(i64::from(st.exit_code())), None),
                    },
                    Err(_) => (None, None),
                };
                let info = match s.end_request.lock().clone() {
                    Some((state, reason)) => Exit { state, end_reason: Some(reason), exit_code: code, signal },
                    None => Exit {
                        state: DeviceSessionState::Exited,
                        end_reason: status.as_ref().err().map(|e| format!("waiting for the process failed: {e}")),
                        exit_code: code,
                        signal,
                    },
                };
                *s.ended_at.lock() = Some(Instant::now());
                s.exit.send_replace(Some(info));
                s.upload_wake.notify_one();
            })
            .map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting the PTY waiter: {e}")))?;
        let s = session.clone();
        let life = Duration::from_millis(timeout_ms);
        tokio::spawn(async move {
            let mut exit = s.exit.subscribe();
            tokio::select! {
                () = tokio::time::sleep(life) => s.end(DeviceSessionState::TimedOut, format!("the session's life limit of {} ms passed", life.as_millis())),
                _ = exit.wait_for(Option::is_some) => {}
            }
        });
        tokio::spawn(upload(self.uplink.clone(), session.clone()));
        Ok(session)
    }

    async fn act(&self, action: &str, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let id = str_of(input, "session_id").unwrap_or_default();
        let session = self.session(id, &ctx.owner_id)?;
        let ended = session.exit_info().is_some();
        if ended && !matches!(action, "wait" | "kill") {
            return Err(ToolError::new(
                ErrorCode::TerminalSessionEnded,
                format!("terminal session {id} has ended; wait returns its output not yet reported, output reads any stored range"),
            )
            .with_details(json!({"state": session.state()})));
        }
        let (rows, cols) = session.size();
        let from = *session.reported_to.lock();
        let mut capture = Capture::new(from, rows, cols);
        session.pull(&mut capture);
        let reason = if ended {
            "already_ended"
        } else {
            match action {
                "input" => {
                    session.write_input(str_of(input, "data").unwrap_or_default().as_bytes().to_vec()).await?;
                    let settle_ms = u64_of(input, "settle_ms").unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS);
                    settle(&session, &mut capture, settle_ms).await
                }
                "signal" => {
                    match str_of(input, "signal").unwrap_or_default() {
                        "interrupt" => match session.write_input(vec![0x03]).await {
                            Err(e) if e.code == ErrorCode::PtyInputBlocked => session.signal_foreground(libc::SIGINT),
                            other => other?,
                        },
                        "eof" => session.write_input(vec![0x04]).await?,
                        "terminate" => session.signal_foreground(libc::SIGTERM),
                        _ => session.signal_foreground(libc::SIGKILL),
                    }
                    settle(&session, &mut capture, DEFAULT_SETTLE_MS).await
                }
                "resize" => {
                    let cols =
                        u16::try_from(u64_of(input, "cols").unwrap_or(DEFAULT_COLS).min(MAX_COLS)).unwrap_or(120);
                    let rows = u16::try_from(u64_of(input, "rows").unwrap_or(DEFAULT_ROWS).min(MAX_ROWS)).unwrap_or(32);
                    session
                        .master
                        .lock()
                        .resize(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 })
                        .map_err(|e| ToolError::new(ErrorCode::PtyResizeFailed, format!("resizing the PTY: {e}")))?;
                    session.pull(&mut capture);
                    "resized"
                }
                "wait" => {
                    let timeout =
                        Duration::from_millis(u64_of(input, "timeout_ms").unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS));
                    let idle = (str_of(input, "until") == Some("idle"))
                        .then(|| Duration::from_millis(u64_of(input, "idle_ms").unwrap_or(DEFAULT_IDLE_MS)));
                    watch_output(&session, &mut capture, idle, timeout).await
                }
                _ => {
                    session.end(DeviceSessionState::Killed, "killed by a terminal_session kill action".into());
                    let mut exit = session.exit.subscribe();
                    let _ = tokio::time::timeout(Duration::from_secs(5), exit.wait_for(Option::is_some)).await;
                    session.pull(&mut capture);
                    "killed"
                }
            }
        };
        {
            let mut r = session.reported_to.lock();
            *r = (*r).max(capture.next());
        }
        Ok(result(input, &session, &capture.finish(), reason))
    }
}

/// Sends a session's output to the control plane as it comes, then its end.
async fn upload(uplink: Arc<Uplink>, s: Arc<DevSession>) {
    let mut backoff = Duration::from_millis(100);
    let mut last_post = Instant::now();
    let refused = loop {
        let (from, data, end) = {
            let ring = s.ring.lock();
            let from = ring.stored().max(ring.start());
            (from, ring.read(from, TERMINAL_CHUNK_MAX).unwrap_or_default(), ring.end())
        };
        let quiet = last_post.elapsed() >= KEEPALIVE_EVERY;
        if data.is_empty() && !quiet {
            let drained = s.reader_done.load(Ordering::Acquire) && s.exit_info().is_some() && from >= end;
            if drained {
                break None;
            }
            tokio::select! {
                () = s.upload_wake.notified() => {}
                () = tokio::time::sleep(UPLOAD_EVERY) => {}
            }
            continue;
        }
        // An empty post after a quiet while asks whether the control plane still holds the
        // session running (it may have recorded it `lost` while this runner was away).
        last_post = Instant::now();
        match uplink.post_chunk(&s.id, from, data).await {
            Ok(ack) => {
                backoff = Duration::from_millis(100);
                s.ring.lock().mark_stored(ack.bytes_out);
                s.room.notify_all();
            }
            Err(PostError::Refused(why)) => break Some(why),
            Err(PostError::Retry(why)) => {
                tracing::debug!(session = %s.id, reason = %why, "terminal output not sent; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    };
    if let Some(why) = refused {
        tracing::warn!(session = %s.id, reason = %why, "the control plane refused this session's output; ending it");
        s.end(DeviceSessionState::Reaped, format!("the control plane refused its output: {why}"));
        s.ring.lock().spill();
        s.room.notify_all();
        return;
    }
    let Some(exit) = s.exit_info() else { return };
    let end = TerminalEnd {
        session_id: s.id.clone(),
        bytes_out: s.end_offset(),
        state: exit.state,
        end_reason: exit.end_reason,
        exit_code: exit.exit_code,
        signal: exit.signal,
    };
    loop {
        match uplink.post_end(&end).await {
            Ok(_) | Err(PostError::Refused(_)) => return,
            Err(PostError::Retry(why)) => {
                tracing::debug!(session = %s.id, reason = %why, "terminal end not sent; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[async_trait]
impl Tool for DeviceTerminal {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let action = check_fields(&input)?;
        if action == "start" {
            return prepare_start(&input, ctx.workspace()?.root(), &self.sandbox);
        }
        let canonical = canonical_action(action, &input)?;
        let id = str_of(&input, "session_id").unwrap_or_default();
        let session = match self.session(id, ctx.owner_id) {
            // `output` reads the control plane's store, which checks the session is this
            // device's when it runs; an ended session may be forgotten here.
            Err(_) if action == "output" => json!({"id": id, "state": "not held by this device (read from the store)"}),
            Ok(s) => {
                let f = facts(&s);
                if f["state"] != "running" && !matches!(action, "wait" | "kill" | "output") {
                    return Err(ToolError::new(
                        ErrorCode::TerminalSessionEnded,
                        format!("terminal session {id} has ended; wait returns its output not yet reported"),
                    )
                    .with_details(json!({"state": f["state"]})));
                }
                json!({"id": f["id"], "command_line": f["command_line"], "cwd": f["cwd"], "pid": f["pid"], "state": f["state"]})
            }
            Err(e) => return Err(e),
        };
        Ok(Prepared { input: canonical, preview: json!({"action": action, "session": session}) })
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        let action = check_fields(&input)?;
        if action == "start" {
            return Ok(prepare_start(&input, ctx.workspace()?.root(), &self.sandbox)?.input);
        }
        canonical_action(action, &input)
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        match str_of(input, "action").unwrap_or_default() {
            "start" => self.start(input, ctx).await,
            "output" => Err(bad(ErrorCode::InvalidField, "output is read on the control plane, not on a device")),
            action => self.act(action, input, ctx).await,
        }
    }
}
