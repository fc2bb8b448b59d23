//! Terminal: `terminal_session`, the public host runtime over PTYs — shells, REPLs,
//! package managers, dev servers, watchers — governed like every other tool: each action
//! is a frozen invocation that needs an exact-invocation approval.
//!
//! Actions (`input.action`): `start`, `input`, `signal`, `resize`, `wait`, `kill`, `output`.
//! The canonical input is what the approver sees: for `start` the command and the program it
//! resolves to, the real absolute cwd (flagged when outside the workspace), the environment
//! as a sorted map (agent-friendly defaults such as `PAGER=cat` plus the call's own
//! variables), the life limit and the PTY size, all in ms / cells. Sessions live in the
//! [`host::TerminalHost`] and outlive invocations and turns; their output streams as SSE
//! from `GET /v1/terminal-sessions/{id}/stream` (see `crate::http::terminal`).
//!
//! Every byte is reported: each session has a *reported-up-to* offset R, the largest end of
//! the ranges in the results of its completed actions (stored in `terminal_reports`, so a
//! restart keeps it). Every action but `output` reports `[R, E)`, E being the end of the
//! output when it returns: bytes printed after an action returned come with the next one,
//! and `wait`/`kill` on an ended session return the rest with the exit. The range is in the
//! result (`output_range`) and the evidence (`byte_range`); bytes of it past the retention
//! cap are named (`output_missed_ranges`). Actions that overlap in time may report
//! overlapping ranges; none leaves a byte out. `output` reads any stored range (a page of
//! rendered text, or the lines matching a regex) and moves nothing. The text is the rendered
//! terminal text (see [`output::render`]); digests are of the raw bytes.

pub mod host;
pub mod output;
pub mod range;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use regex::Regex;

use self::host::{ExitInfo, Session, StartSpec, TerminalHost};
use self::output::{Capture, Captured, Ring, head_tail};
use self::range::Source;
use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::evidence::{EXCERPT_MAX_BYTES, EvidenceDraft, excerpt};
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::sandbox::{SANDBOX_HOME, SANDBOX_TMP, Sandbox, SandboxSpec, SpecRequest};
use crate::store::{TerminalReport, TerminalSessionRow};
use crate::tools::{str_field, uint_field};

/// Environment every session gets unless the call sets the variable itself: output is
/// never held by a pager and nothing waits for an editor.
pub const DEFAULT_ENV: [(&str, &str); 6] = [
    ("TERM", "xterm-256color"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("EDITOR", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
];
/// Life limit of a session when `start` gives none: 1 hour.
pub const DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
/// Longest life limit: 24 hours.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Longest `wait`: 5 minutes (below the harness's execution limit).
pub const MAX_WAIT_MS: u64 = 300_000;
/// Default quiet time after `start`/`input` before the action returns its output.
pub const DEFAULT_SETTLE_MS: u64 = 300;
/// Longest an action waits for output to settle.
pub const MAX_SETTLE_MS: u64 = 10_000;
/// Largest `input.data`, in bytes.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

/// The `terminal_session` tool.
pub struct TerminalSession {
    spec: ToolSpec,
    host: Arc<TerminalHost>,
}

impl TerminalSession {
    /// The tool over `host`.
    pub fn new(host: Arc<TerminalHost>) -> Self {
        let spec = ToolSpec {
            id: "terminal_session".into(),
            kind: ToolKind::Public,
            domain: "terminal".into(),
            title: "Terminal session".into(),
            description: "Run programs in persistent PTY terminal sessions on the host: shell commands, Python/Node REPLs, \
                git, package managers, builds, dev servers and watchers. action=start opens a session (default: the user's \
                shell in the workspace) and returns its id and first output; input sends keystrokes or a command line \
                (end with \\n); signal sends interrupt (Ctrl-C), eof (Ctrl-D), terminate or kill; resize changes the PTY; \
                wait returns when the program exits or its output goes idle (a prompt is waiting) or at timeout_ms; kill \
                ends the session and every process it started. Each action returns all output since the previous action's \
                result (output_range = byte offsets), rendered as the terminal shows it; a long output keeps its head and tail. \
                output reads any stored range (from/to byte offsets, paged by max_bytes) or, with pattern (a regex), returns \
                the matching lines with their offsets. Sessions keep state (cwd, variables, servers) between calls. \
                Every action needs approval."
                .into(),
            input_schema: json!({
                "type": "object",
                "required": ["action"],
                "properties": {
                    "action": {"type": "string", "enum": ["start", "input", "signal", "resize", "wait", "kill", "output"]},
                    "session_id": {"type": "string", "maxLength": 64, "description": "The session (all actions but start)"},
                    "command": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "start: program to run (default: the user's shell)"},
                    "args": {"type": "array", "items": {"type": "string", "maxLength": 65536}, "maxItems": 1024, "description": "start: its arguments"},
                    "cwd": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "start: working directory, relative to the workspace or absolute (default: the workspace root)"},
                    "env": {"type": "object", "maxProperties": 256, "additionalProperties": {"type": ["string", "null"], "maxLength": 32768}, "description": "start: variables to set (null removes one)"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS, "description": "start: life limit of the session (default 1 h); wait: how long to wait (default 30 s, at most 5 min)"},
                    "cols": {"type": "integer", "minimum": 2, "maximum": 1000, "description": "start/resize: PTY columns (default 120)"},
                    "rows": {"type": "integer", "minimum": 2, "maximum": 500, "description": "start/resize: PTY rows (default 32)"},
                    "data": {"type": "string", "maxLength": MAX_INPUT_BYTES, "description": "input: text to type (\\n = Enter)"},
                    "signal": {"type": "string", "enum": ["interrupt", "eof", "terminate", "kill"], "description": "signal: what to send"},
                    "until": {"type": "string", "enum": ["exit", "idle"], "description": "wait: for the exit (default) or for output to go quiet"},
                    "idle_ms": {"type": "integer", "minimum": 10, "maximum": 600000, "description": "wait until=idle: quiet time (default 500)"},
                    "settle_ms": {"type": "integer", "minimum": 0, "maximum": MAX_SETTLE_MS, "description": "start/input: return once output has been quiet this long (default 300)"},
                    "from": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "description": "output: first byte offset (default 0)"},
                    "to": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "description": "output: one past the last byte offset (default: the end so far)"},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_BYTES, "description": "output: bytes of output per page (default 65536); the result's next_from continues"},
                    "pattern": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN_BYTES, "description": "output: a regex (Rust syntax) matched against each rendered line"},
                    "case_insensitive": {"type": "boolean", "description": "output: pattern ignores case"},
                    "max_matches": {"type": "integer", "minimum": 1, "maximum": MAX_MATCHES, "description": "output: matching lines at most (default 100)"}
                },
                "additionalProperties": false
            }),
            requires_approval: true,
            capability: Some("pty".into()),
            replacement: None,
            owner: None,
        };
        Self { spec, host }
    }
}

fn bad(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

fn action_of(input: &Value) -> &str {
    str_field(input, "action").unwrap_or_default()
}

/// Fields each action accepts besides `action`.
fn allowed_fields(action: &str) -> &'static [&'static str] {
    match action {
        "start" => &["command", "args", "cwd", "env", "timeout_ms", "cols", "rows", "settle_ms"],
        "input" => &["session_id", "data", "settle_ms"],
        "signal" => &["session_id", "signal"],
        "resize" => &["session_id", "cols", "rows"],
        "wait" => &["session_id", "until", "idle_ms", "timeout_ms"],
        "output" => &["session_id", "from", "to", "max_bytes", "pattern", "case_insensitive", "max_matches"],
        _ => &["session_id"],
    }
}

fn require<'a>(input: &'a Value, field: &str, action: &str) -> Result<&'a Value, ToolError> {
    input.get(field).ok_or_else(|| bad(ErrorCode::MissingField, format!("action {action} needs {field}")))
}

/// Resolves `command` to the program that will run: a path containing `/` against `cwd`,
/// a bare name through `PATH` (the call's own `PATH` when it sets one).
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
    // Relative PATH entries would resolve against the server's cwd here and the session's
    // cwd at spawn: they are skipped, so the frozen program is always an absolute path.
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(command))
        .find(|p| executable(p))
        .map(|p| p.to_string_lossy().into_owned())
        .ok_or_else(|| bad(ErrorCode::CommandNotFound, format!("{command} is not found on PATH")))
}

/// Who starts a session, for its sandbox.
struct Starter<'a> {
    sandbox: &'a Sandbox,
    is_admin: bool,
}

/// The canonical `start` input and its approval facts.
fn prepare_start(input: &Value, ws_root: &Path, starter: &Starter<'_>) -> Result<Prepared, ToolError> {
    // A NUL byte cannot reach a process (argv, env and paths are C strings): refused here,
    // before anyone approves a call that could never run.
    let strings = ["command", "cwd"]
        .iter()
        .filter_map(|f| str_field(input, f))
        .chain(input.get("args").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str))
        .chain(
            input.get("env").and_then(Value::as_object).into_iter().flat_map(|m| m.values()).filter_map(Value::as_str),
        );
    for v in strings {
        if v.contains('\0') {
            return Err(bad(
                ErrorCode::NulByte,
                format!("{:?} contains a NUL byte, which no program can receive", excerpt(v, 80)),
            ));
        }
    }
    let cwd: PathBuf = match str_field(input, "cwd") {
        None => ws_root.to_path_buf(),
        Some(c) => {
            let given = if Path::new(c).is_absolute() { PathBuf::from(c) } else { ws_root.join(c) };
            let real = std::fs::canonicalize(&given)
                .map_err(|e| ToolError::new(ErrorCode::CwdNotFound, format!("cwd {c}: {e}")))?;
            if !real.is_dir() {
                return Err(bad(ErrorCode::CwdNotADirectory, format!("cwd {} is not a directory", real.display())));
            }
            real
        }
    };
    // The sandbox the process will get: part of the frozen input (a different sandbox is a
    // different invocation). Refused here for a non-admin on a server that cannot sandbox.
    let sandbox = starter.sandbox.spec(&SpecRequest {
        workspace: Some(ws_root),
        cwd: &cwd,
        is_admin: starter.is_admin,
        read_only: &[],
    })?;
    let call_env: Map<String, Value> = input.get("env").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(k) = call_env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(bad(ErrorCode::InvalidEnv, format!("{k:?} is not a valid environment variable name")));
    }
    // The whole environment of the process: a few variables of the server's own, the
    // agent-friendly defaults, then the call's; nothing else of the server's reaches it.
    let mut env: std::collections::BTreeMap<String, Value> =
        host::INHERITED_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), json!(v)))).collect();
    if sandbox.enforced {
        // Its own HOME and TMPDIR (the server's HOME holds keys and caches), and only the
        // PATH entries the sandbox shows.
        env.insert("HOME".into(), json!(SANDBOX_HOME));
        env.insert("TMPDIR".into(), json!(SANDBOX_TMP));
        if let Some(Value::String(path)) = env.get("PATH") {
            let kept: Vec<&str> =
                path.split(':').filter(|d| d.starts_with('/') && Sandbox::visible_in(&sandbox, Path::new(d))).collect();
            env.insert("PATH".into(), json!(kept.join(":")));
        }
    }
    env.extend(DEFAULT_ENV.iter().map(|(k, v)| ((*k).to_owned(), json!(v))));
    env.extend(call_env.clone());
    let env: Map<String, Value> = env.into_iter().collect();
    let command = match str_field(input, "command") {
        Some(c) => c.to_owned(),
        None => std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/bash".into()),
    };
    let program = resolve_program(&command, &cwd, &env)?;
    if sandbox.enforced && !Sandbox::visible_in(&sandbox, Path::new(&program)) {
        return Err(bad(
            ErrorCode::CommandNotFound,
            format!("{program} is outside the folders the sandbox shows ({})", sandbox.read_only.join(", ")),
        ));
    }
    let args: Vec<String> = input
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let canonical = json!({
        "action": "start",
        "command": command,
        "program": program,
        "args": args,
        "cwd": cwd.to_string_lossy(),
        "env": env,
        "timeout_ms": uint_field(input, "timeout_ms", DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS),
        "cols": uint_field(input, "cols", 120, 1000),
        "rows": uint_field(input, "rows", 32, 500),
        "settle_ms": uint_field(input, "settle_ms", DEFAULT_SETTLE_MS, MAX_SETTLE_MS),
        "sandbox": sandbox,
    });
    let outside = !cwd.starts_with(ws_root);
    let preview = json!({
        "command_line": host::shell_words(&command, &args),
        "program": program,
        "cwd": cwd.to_string_lossy(),
        "cwd_outside_workspace": outside,
        "workspace": ws_root.to_string_lossy(),
        "env_set_by_call": call_env,
        "timeout_ms": canonical["timeout_ms"],
    });
    Ok(Prepared { input: canonical, preview })
}

/// The canonical input of the actions on an existing session (defaults filled in).
fn canonical_session_action(input: &Value) -> Result<Value, ToolError> {
    let action = action_of(input);
    let session_id = require(input, "session_id", action)?.clone();
    Ok(match action {
        "input" => json!({
            "action": "input", "session_id": session_id,
            "data": require(input, "data", action)?,
            "settle_ms": uint_field(input, "settle_ms", DEFAULT_SETTLE_MS, MAX_SETTLE_MS),
        }),
        "signal" => json!({"action": "signal", "session_id": session_id, "signal": require(input, "signal", action)?}),
        "resize" => json!({
            "action": "resize", "session_id": session_id,
            "cols": require(input, "cols", action)?, "rows": require(input, "rows", action)?,
        }),
        "wait" => {
            let until = str_field(input, "until").unwrap_or("exit");
            let mut c = json!({
                "action": "wait", "session_id": session_id, "until": until,
                "timeout_ms": uint_field(input, "timeout_ms", 30_000, MAX_WAIT_MS),
            });
            if until == "idle" {
                c["idle_ms"] = json!(uint_field(input, "idle_ms", 500, 600_000));
            }
            c
        }
        "output" => {
            let q = OutputQuery::from_input(input)?;
            let mut c = json!({"action": "output", "session_id": session_id, "from": q.from});
            if let Some(to) = q.to {
                c["to"] = json!(to);
            }
            match str_field(input, "pattern") {
                Some(p) => {
                    c["pattern"] = json!(p);
                    c["case_insensitive"] = json!(input.get("case_insensitive").and_then(Value::as_bool) == Some(true));
                    c["max_matches"] = json!(q.max_matches);
                }
                None => c["max_bytes"] = json!(q.max_bytes),
            }
            c
        }
        _ => json!({"action": "kill", "session_id": session_id}),
    })
}

fn canonical(input: &Value, ctx: &PrepareContext<'_>, starter: &Starter<'_>) -> Result<Prepared, ToolError> {
    let action = action_of(input);
    if let Some(extra) = input
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .find(|k| k.as_str() != "action" && !allowed_fields(action).contains(&k.as_str()))
    {
        return Err(bad(ErrorCode::InvalidField, format!("action {action} does not take {extra}")));
    }
    if action == "start" {
        return prepare_start(input, ctx.workspace.root(), starter);
    }
    Ok(Prepared { input: canonical_session_action(input)?, preview: Value::Null })
}

fn session_not_found(id: &str) -> ToolError {
    ToolError::new(ErrorCode::TerminalSessionNotFound, format!("no live terminal session {id} of yours"))
}

/// What a result says about the session, from the live session or its stored row.
struct Facts {
    id: String,
    pid: Option<i64>,
    cwd: String,
    command_line: String,
    /// `running` or how it ended.
    exit: Option<ExitInfo>,
    /// PTY size `(rows, cols)`.
    size: (u16, u16),
}

impl Facts {
    fn live(s: &Session) -> Self {
        Self {
            id: s.id.clone(),
            pid: Some(i64::from(s.pid)),
            cwd: s.cwd.clone(),
            command_line: s.command_line.clone(),
            exit: s.exit_info(),
            size: s.size(),
        }
    }

    fn stored(row: &TerminalSessionRow) -> Self {
        let args: Vec<String> = serde_json::from_str(&row.args).unwrap_or_default();
        let exit = (row.state != "running").then(|| ExitInfo {
            state: row.state.clone(),
            end_reason: row.end_reason.clone(),
            exit_code: row.exit_code,
            signal: row.signal.clone(),
        });
        let dim = |v: i64, d: u16| u16::try_from(v).unwrap_or(d);
        Self {
            id: row.id.clone(),
            pid: row.pid,
            cwd: row.cwd.clone(),
            command_line: host::shell_words(&row.command, &args),
            exit,
            size: (dim(row.rows, 32), dim(row.cols, 120)),
        }
    }

    fn state(&self) -> &str {
        self.exit.as_ref().map_or("running", |e| e.state.as_str())
    }
}

fn store_error(e: crate::store::StoreError) -> ToolError {
    ToolError::new(ErrorCode::StoreError, e.to_string())
}

impl TerminalSession {
    async fn is_admin(&self, user_id: &str) -> Result<bool, ToolError> {
        self.host.store().user_is_admin(user_id).await.map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))
    }

    /// The caller's live session named in `input`, or 404 / 409 (ended).
    async fn live_session(&self, input: &Value, owner_id: &str) -> Result<Arc<Session>, ToolError> {
        let id = str_field(input, "session_id").unwrap_or_default();
        let ended = |state: &str, exit_code: Option<i64>, end_reason: Option<&str>| {
            ToolError::new(
                ErrorCode::TerminalSessionEnded,
                format!(
                    "terminal session {id} has ended ({state}); wait returns its output not yet reported, \
                     output reads any stored range"
                ),
            )
            .with_details(json!({"state": state, "exit_code": exit_code, "end_reason": end_reason}))
        };
        if let Some(s) = self.host.get(owner_id, id) {
            // Ended in memory, perhaps not yet recorded: the process's own exit is the answer.
            return match s.exit_info() {
                None => Ok(s),
                Some(e) => Err(ended(&e.state, e.exit_code, e.end_reason.as_deref())),
            };
        }
        match self.host.store().terminal_session_for(owner_id, id).await {
            Ok(Some(row)) => Err(ended(&row.state, row.exit_code, row.end_reason.as_deref())),
            Ok(None) => Err(session_not_found(id)),
            Err(e) => Err(store_error(e)),
        }
    }

    /// The caller's session named in `input`, live or ended: the live session (if this
    /// process holds it) and its stored row.
    async fn any_session(
        &self,
        input: &Value,
        owner_id: &str,
    ) -> Result<(Option<Arc<Session>>, TerminalSessionRow), ToolError> {
        let id = str_field(input, "session_id").unwrap_or_default();
        let row = self.host.store().terminal_session_for(owner_id, id).await.map_err(store_error)?;
        let row = row.ok_or_else(|| session_not_found(id))?;
        Ok((self.host.get(owner_id, id), row))
    }

    /// Runs one action on a session and returns its result and evidence. Every action but
    /// `output` reports the output from the session's reported-up-to offset to the end at
    /// its return.
    async fn act(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let action = action_of(input);
        if action == "output" {
            return self.read_output(input, ctx).await;
        }
        let wait_only = action == "wait" || action == "kill";
        let session = match self.live_session(input, &ctx.owner_id).await {
            Ok(s) => s,
            // Waiting on, or killing, a session that already ended reports how it ended,
            // with the output not yet reported.
            Err(e) if wait_only && e.code == ErrorCode::TerminalSessionEnded => {
                return self.ended_report(input, ctx).await;
            }
            Err(e) => return Err(e),
        };
        session.touch();
        let store = self.host.store();
        let from = store.terminal_reported_to(&session.id).await.map_err(store_error)?;
        let (rows, cols) = session.size();
        let mut capture = Capture::new(from, rows, cols);
        let source = Source { store, id: &session.id, live: Some(&session) };
        source.pull(&mut capture, None).await.map_err(store_error)?;
        let reason = match action {
            "input" => {
                let data = str_field(input, "data").unwrap_or_default();
                session.write_input(data.as_bytes().to_vec()).await?;
                let settle_ms = uint_field(input, "settle_ms", DEFAULT_SETTLE_MS, MAX_SETTLE_MS);
                settle(&source, &session, &mut capture, settle_ms, ctx).await?
            }
            "signal" => {
                match str_field(input, "signal").unwrap_or_default() {
                    "interrupt" => match session.write_input(vec![0x03]).await {
                        // Ctrl-C through the terminal (the line discipline, or the program in raw
                        // mode, acts on it); when the input is blocked, SIGINT to the foreground.
                        Err(e) if e.code == ErrorCode::PtyInputBlocked => session.signal_foreground(libc::SIGINT),
                        other => other?,
                    },
                    "eof" => session.write_input(vec![0x04]).await?,
                    "terminate" => session.signal_foreground(libc::SIGTERM),
                    _ => session.signal_foreground(libc::SIGKILL),
                }
                settle(&source, &session, &mut capture, DEFAULT_SETTLE_MS, ctx).await?
            }
            "resize" => {
                let cols = u16::try_from(uint_field(input, "cols", 120, 1000)).unwrap_or(120);
                let rows = u16::try_from(uint_field(input, "rows", 32, 500)).unwrap_or(32);
                session.resize(cols, rows)?;
                if let Err(e) = store.resize_terminal_session(&session.id, cols, rows).await {
                    tracing::warn!(error = %e, "recording a PTY resize failed");
                }
                source.pull(&mut capture, None).await.map_err(store_error)?;
                "resized"
            }
            "wait" => {
                let timeout = Duration::from_millis(uint_field(input, "timeout_ms", 30_000, MAX_WAIT_MS));
                let idle = (str_field(input, "until") == Some("idle"))
                    .then(|| Duration::from_millis(uint_field(input, "idle_ms", 500, 600_000)));
                watch_output(&source, &session, &mut capture, idle, timeout, ctx).await?
            }
            _ => {
                session.end("killed", "killed by a terminal_session kill action".into());
                let mut exit = session.exit();
                let _ = tokio::time::timeout(Duration::from_secs(5), exit.wait_for(Option::is_some)).await;
                source.pull(&mut capture, None).await.map_err(store_error)?;
                "killed"
            }
        };
        Ok(self.finish(input, &Facts::live(&session), &capture, reason, ctx).await)
    }

    /// `wait`/`kill` on a session that has ended: its exit, and the output not yet reported
    /// (from the reported-up-to offset to the end), read from the ring if this process still
    /// holds it, else from the store.
    async fn ended_report(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let (live, row) = self.any_session(input, &ctx.owner_id).await?;
        let facts = match &live {
            Some(s) if s.ended() => Facts::live(s),
            _ => Facts::stored(&row),
        };
        let from = u64::try_from(row.reported_to).unwrap_or(0);
        let mut capture = Capture::new(from, facts.size.0, facts.size.1);
        let source = Source { store: self.host.store(), id: &row.id, live: live.as_deref() };
        source.pull(&mut capture, None).await.map_err(store_error)?;
        Ok(self.finish(input, &facts, &capture, "already_ended", ctx).await)
    }

    /// The `output` action: a page of the rendered text of a stored range, or the lines of
    /// it matching `pattern`. Moves no reported-up-to offset.
    async fn read_output(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let (live, row) = self.any_session(input, &ctx.owner_id).await?;
        let facts = match &live {
            Some(s) => Facts::live(s),
            None => Facts::stored(&row),
        };
        let source = Source { store: self.host.store(), id: &row.id, live: live.as_deref() };
        let q = OutputQuery::from_input(input)?;
        let (output, evidence, event) = match q.read(&source, facts.size).await.map_err(store_error)? {
            OutputRead::Page(page) => {
                let out = &page.captured;
                let output = json!({
                    "session_id": facts.id, "action": "output", "state": facts.state(),
                    "exit_code": facts.exit.as_ref().and_then(|e| e.exit_code),
                    "output": out.text,
                    "output_range": [out.from, out.to],
                    "output_bytes": out.bytes,
                    "output_bytes_missed": out.bytes_missed,
                    "output_missed_ranges": out.missed_ranges,
                    "output_truncated": out.truncated,
                    "next_from": page.next_from,
                });
                let provenance = json!({
                    "session_id": facts.id, "action": "output", "input": input,
                    "byte_range": [out.from, out.to], "bytes": out.bytes, "bytes_missed": out.bytes_missed,
                    "missed_ranges": out.missed_ranges, "output_sha256": out.sha256, "render": "vt100",
                    "cols": facts.size.1, "rows": facts.size.0,
                });
                let evidence = EvidenceDraft {
                    kind: "terminal_output".into(),
                    provenance,
                    content_sha256: out.sha256.clone(),
                    excerpt: head_tail(&out.text, EXCERPT_MAX_BYTES),
                };
                let event =
                    json!({"from": out.from, "to": out.to, "bytes": out.bytes, "bytes_missed": out.bytes_missed});
                (output, evidence, event)
            }
            OutputRead::Search(found) => {
                let listing: String = found.matches.iter().map(|m| format!("{}: {}\n", m.offset, m.line)).collect();
                let missed: u64 = found.missed_ranges.iter().map(|r| r[1] - r[0]).sum();
                let output = json!({
                    "session_id": facts.id, "action": "output", "state": facts.state(),
                    "exit_code": facts.exit.as_ref().and_then(|e| e.exit_code),
                    "pattern": input.get("pattern"),
                    "matches": found.matches,
                    "matches_truncated": found.next_from.is_some(),
                    "next_from": found.next_from,
                    "output_range": [found.from, found.to],
                    "output_bytes": found.bytes,
                    "output_bytes_missed": missed,
                    "output_missed_ranges": found.missed_ranges,
                });
                let evidence = EvidenceDraft::of_text(
                    "terminal_output",
                    json!({
                        "session_id": facts.id, "action": "output", "input": input,
                        "byte_range": [found.from, found.to], "bytes": found.bytes, "bytes_missed": missed,
                        "missed_ranges": found.missed_ranges, "matches": found.matches.len(), "render": "vt100",
                    }),
                    &listing,
                );
                let event = json!({"from": found.from, "to": found.to, "bytes": found.bytes, "bytes_missed": missed});
                (output, evidence, event)
            }
        };
        let mut event = event;
        event["session_id"] = json!(facts.id);
        event["invocation_id"] = json!(ctx.invocation_id);
        event["action"] = json!("output");
        if let Err(e) = self.host.store().record_terminal_output(&ctx.run_id, &event, None).await {
            tracing::warn!(error = %e, "recording terminal.output failed");
        }
        Ok(ToolOutput { output, evidence: vec![evidence] })
    }

    /// The action's result, after the range it reports is recorded (it becomes the session's
    /// reported-up-to offset once the invocation completes) together with a `terminal.output`
    /// event that points the run's timeline at it.
    async fn finish(
        &self,
        input: &Value,
        facts: &Facts,
        capture: &Capture,
        reason: &str,
        ctx: &ExecContext,
    ) -> ToolOutput {
        let out = capture.finish();
        let event = json!({
            "session_id": facts.id, "invocation_id": ctx.invocation_id, "action": action_of(input),
            "from": out.from, "to": out.to, "bytes": out.bytes, "bytes_missed": out.bytes_missed,
        });
        let report = TerminalReport {
            session_id: facts.id.clone(),
            invocation_id: ctx.invocation_id.clone(),
            from: out.from,
            to: out.to,
        };
        // A failure here leaves the offset where it was: the next action reports these bytes again.
        if let Err(e) = self.host.store().record_terminal_output(&ctx.run_id, &event, Some(&report)).await {
            tracing::warn!(error = %e, "recording terminal.output failed");
        }
        result(input, facts, &out, reason)
    }
}

/// An `output` action's canonical query (also used by `GET /v1/terminal-sessions/{id}/output`).
#[derive(Debug, Clone)]
pub struct OutputQuery {
    /// First offset (default 0).
    pub from: u64,
    /// One past the last offset (default: the end of the output when read).
    pub to: Option<u64>,
    /// Rendered bytes at most per page (default [`DEFAULT_OUTPUT_BYTES`]).
    pub max_bytes: u64,
    /// A regex: the answer is the matching lines instead of a page.
    pub pattern: Option<Regex>,
    /// Matching lines at most (default 100).
    pub max_matches: usize,
}

/// What an [`OutputQuery`] read.
pub enum OutputRead {
    /// A page of rendered text.
    Page(range::Page),
    /// Matching lines.
    Search(range::Search),
}

/// Default page of an `output` read, in bytes of output.
pub const DEFAULT_OUTPUT_BYTES: u64 = 64 * 1024;
/// Largest page of an `output` read, in bytes of output.
pub const MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
/// Default and largest number of matching lines of an `output` search.
pub const DEFAULT_MATCHES: u64 = 100;
/// Largest number of matching lines of an `output` search.
pub const MAX_MATCHES: u64 = 1000;
/// Longest `pattern`, in bytes.
pub const MAX_PATTERN_BYTES: usize = 1000;
/// Largest byte offset accepted (2^53 − 1, exact in every JSON reader).
pub const MAX_OFFSET: u64 = (1 << 53) - 1;

/// Builds a search regex: `invalid_pattern` when it does not compile (or is too large).
pub fn output_pattern(pattern: &str, case_insensitive: bool) -> Result<Regex, ToolError> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(bad(ErrorCode::InvalidPattern, format!("pattern is longer than {MAX_PATTERN_BYTES} bytes")));
    }
    regex::RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| bad(ErrorCode::InvalidPattern, format!("pattern does not compile: {e}")))
}

/// An offset field: a whole number in `0..=MAX_OFFSET` (also when written as `1e6`), or
/// `invalid_field`.
fn offset_field(input: &Value, name: &str) -> Result<Option<u64>, ToolError> {
    let Some(v) = input.get(name) else { return Ok(None) };
    let n = v.as_u64().or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64));
    match n {
        Some(n) if n <= MAX_OFFSET => Ok(Some(n)),
        _ => Err(bad(ErrorCode::InvalidField, format!("{name} must be a byte offset from 0 to {MAX_OFFSET}"))),
    }
}

impl OutputQuery {
    /// The query of a raw or canonical `output` input: `invalid_range` when `from` > `to`,
    /// `invalid_pattern`, `invalid_field` (a bad offset, or `max_bytes` with `pattern`,
    /// `case_insensitive`/`max_matches` without it).
    pub fn from_input(input: &Value) -> Result<Self, ToolError> {
        let from = offset_field(input, "from")?.unwrap_or(0);
        let to = offset_field(input, "to")?;
        if let Some(to) = to.filter(|to| *to < from) {
            return Err(bad(ErrorCode::InvalidRange, format!("from {from} is after to {to}")));
        }
        let searching = input.get("pattern").is_some();
        let misplaced =
            if searching { ["max_bytes"].as_slice() } else { ["case_insensitive", "max_matches"].as_slice() };
        if let Some(f) = misplaced.iter().find(|f| input.get(**f).is_some()) {
            let with = if searching { "with pattern (a search)" } else { "without pattern (a page)" };
            return Err(bad(ErrorCode::InvalidField, format!("output {with} does not take {f}")));
        }
        let pattern = match str_field(input, "pattern") {
            Some(p) => Some(output_pattern(p, input.get("case_insensitive").and_then(Value::as_bool) == Some(true))?),
            None => None,
        };
        Ok(Self {
            from,
            to,
            max_bytes: uint_field(input, "max_bytes", DEFAULT_OUTPUT_BYTES, MAX_OUTPUT_BYTES).max(1),
            pattern,
            max_matches: usize::try_from(uint_field(input, "max_matches", DEFAULT_MATCHES, MAX_MATCHES).max(1))
                .unwrap_or(100),
        })
    }

    /// Reads the session's output as asked.
    pub async fn read(&self, source: &Source<'_>, size: (u16, u16)) -> Result<OutputRead, crate::store::StoreError> {
        Ok(match &self.pattern {
            Some(re) => OutputRead::Search(source.search(self.from, self.to, re, self.max_matches, size.1).await?),
            None => OutputRead::Page(source.page(self.from, self.to, self.max_bytes, size).await?),
        })
    }
}

/// Follows output for `settle_ms` of quiet (bounded by [`MAX_SETTLE_MS`]) or until exit.
async fn settle(
    source: &Source<'_>,
    session: &Session,
    capture: &mut Capture,
    settle_ms: u64,
    ctx: &ExecContext,
) -> Result<&'static str, ToolError> {
    if settle_ms == 0 {
        source.pull(capture, None).await.map_err(store_error)?;
        return Ok("returned");
    }
    let quiet = Some(Duration::from_millis(settle_ms));
    watch_output(source, session, capture, quiet, Duration::from_millis(MAX_SETTLE_MS), ctx).await
}

/// Captures output until the session exits, output has been quiet for `idle` (when
/// given), `timeout` passes, or the invocation is cancelled. Returns why it stopped:
/// `exit`, `idle`, `timeout` or `cancelled`.
async fn watch_output(
    source: &Source<'_>,
    session: &Session,
    capture: &mut Capture,
    idle: Option<Duration>,
    timeout: Duration,
    ctx: &ExecContext,
) -> Result<&'static str, ToolError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bytes = session.bytes();
    let mut exit = session.exit();
    let mut last_output = tokio::time::Instant::now();
    loop {
        source.pull(capture, None).await.map_err(store_error)?;
        if exit.borrow().is_some() {
            source.pull(capture, None).await.map_err(store_error)?;
            return Ok("exit");
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
                source.pull(capture, None).await.map_err(store_error)?;
                if quiet_until.is_some_and(|q| q <= tokio::time::Instant::now()) && capture.next() == session.with_ring(Ring::end) {
                    return Ok("idle");
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok("timeout");
                }
            }
            () = ctx.cancel.cancelled() => return Ok("cancelled"),
        }
    }
}

/// The result and evidence of an action that reports output.
fn result(input: &Value, facts: &Facts, out: &Captured, reason: &str) -> ToolOutput {
    let exit = facts.exit.as_ref();
    let output = json!({
        "session_id": facts.id,
        "action": action_of(input),
        "returned_because": reason,
        "state": facts.state(),
        "pid": facts.pid,
        "exit_code": exit.and_then(|e| e.exit_code),
        "signal": exit.and_then(|e| e.signal.clone()),
        "end_reason": exit.and_then(|e| e.end_reason.clone()),
        "output": out.text,
        "output_range": [out.from, out.to],
        "output_bytes": out.bytes,
        "output_bytes_missed": out.bytes_missed,
        "output_missed_ranges": out.missed_ranges,
        "output_truncated": out.truncated,
        "cwd": facts.cwd,
        "command_line": facts.command_line,
    });
    let provenance = json!({
        "session_id": facts.id,
        "action": action_of(input),
        "input": input,
        "state": facts.state(),
        "exit_code": exit.and_then(|e| e.exit_code),
        "signal": exit.and_then(|e| e.signal.clone()),
        "byte_range": [out.from, out.to],
        "bytes": out.bytes,
        "bytes_missed": out.bytes_missed,
        "missed_ranges": out.missed_ranges,
        "output_sha256": out.sha256,
        "render": "vt100",
        "cols": facts.size.1,
        "rows": facts.size.0,
    });
    let evidence = EvidenceDraft {
        kind: "terminal_output".into(),
        provenance,
        content_sha256: out.sha256.clone(),
        excerpt: head_tail(&out.text, EXCERPT_MAX_BYTES),
    };
    ToolOutput { output, evidence: vec![evidence] }
}

#[async_trait]
impl Tool for TerminalSession {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        match self.host.sandbox().refusal_for(ctx.is_admin) {
            Some(reason) => Availability::unavailable(ErrorCode::SandboxUnavailable, reason),
            None => Availability::Available,
        }
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let starter = Starter { sandbox: self.host.sandbox(), is_admin: self.is_admin(ctx.owner_id).await? };
        let mut prepared = canonical(&input, ctx, &starter)?;
        let action = action_of(&prepared.input).to_owned();
        if action != "start" {
            // The approver sees which session the action goes to; a call on a session
            // that is not the caller's (or does not exist) is refused before anyone is asked.
            let session = match self.live_session(&prepared.input, ctx.owner_id).await {
                Ok(s) => {
                    json!({"id": s.id, "command_line": s.command_line, "cwd": s.cwd, "pid": s.pid, "state": "running"})
                }
                Err(e)
                    if matches!(action.as_str(), "wait" | "kill" | "output")
                        && e.code == ErrorCode::TerminalSessionEnded =>
                {
                    json!({"id": prepared.input["session_id"], "state": e.details["state"]})
                }
                Err(e) => return Err(e),
            };
            prepared.preview = json!({"action": action, "session": session});
        }
        Ok(prepared)
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        let starter = Starter { sandbox: self.host.sandbox(), is_admin: self.is_admin(ctx.owner_id).await? };
        Ok(canonical(&input, ctx, &starter)?.input)
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        if action_of(input) != "start" {
            return self.act(input, ctx).await;
        }
        let str_list = |v: &Value| -> Vec<String> {
            v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect()).unwrap_or_default()
        };
        let cwd = str_field(input, "cwd").unwrap_or_default().to_owned();
        // The frozen cwd must still be the real directory it was when approved.
        match std::fs::canonicalize(&cwd) {
            Ok(real) if real == Path::new(&cwd) && real.is_dir() => {}
            _ => {
                return Err(ToolError::new(
                    ErrorCode::StaleTarget,
                    format!("the approved cwd {cwd} is no longer that directory"),
                ));
            }
        }
        // The sandbox that applies now must be the one approved.
        let is_admin = self.is_admin(&ctx.owner_id).await?;
        let sandbox = self.host.sandbox().spec(&SpecRequest {
            workspace: Some(ctx.workspace.root()),
            cwd: Path::new(&cwd),
            is_admin,
            read_only: &[],
        })?;
        let frozen: Option<SandboxSpec> = input.get("sandbox").and_then(|v| serde_json::from_value(v.clone()).ok());
        if frozen.as_ref() != Some(&sandbox) {
            return Err(ToolError::new(
                ErrorCode::SandboxChanged,
                "the sandbox this session would get is not the one approved (the server's sandbox or the workspace changed); freeze the call again",
            )
            .with_details(json!({"approved": input.get("sandbox"), "now": sandbox})));
        }
        // Other users' workspaces inside this sandbox's folders are covered too.
        let hidden = if is_admin || !sandbox.enforced {
            Vec::new()
        } else {
            self.host
                .store()
                .other_users_workspace_paths(&ctx.owner_id)
                .await
                .map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))?
                .into_iter()
                .map(PathBuf::from)
                .filter(|p| p.as_path() != ctx.workspace.root())
                .collect()
        };
        let spec = StartSpec {
            sandbox,
            hidden,
            owner_id: ctx.owner_id.clone(),
            run_id: ctx.run_id.clone(),
            invocation_id: ctx.invocation_id.clone(),
            program: str_field(input, "program").unwrap_or_default().to_owned(),
            command: str_field(input, "command").unwrap_or_default().to_owned(),
            args: str_list(&input["args"]),
            cwd,
            env: input.get("env").and_then(Value::as_object).cloned().unwrap_or_default(),
            timeout_ms: uint_field(input, "timeout_ms", DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS),
            cols: u16::try_from(uint_field(input, "cols", 120, 1000)).unwrap_or(120),
            rows: u16::try_from(uint_field(input, "rows", 32, 500)).unwrap_or(32),
        };
        let size = (spec.rows, spec.cols);
        // Until this execution returns, cancelling it (or dropping it) ends the session it
        // started: a cancelled start leaves nothing running.
        let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
        let session = self.host.start(spec, ctx.cancel.clone(), done_rx).await?;
        let mut capture = Capture::new(0, size.0, size.1);
        let source = Source { store: self.host.store(), id: &session.id, live: Some(&session) };
        let settle_ms = uint_field(input, "settle_ms", DEFAULT_SETTLE_MS, MAX_SETTLE_MS);
        let reason = settle(&source, &session, &mut capture, settle_ms, ctx).await?;
        let out = self.finish(input, &Facts::live(&session), &capture, reason, ctx).await;
        let _ = done.send(());
        Ok(out)
    }
}
