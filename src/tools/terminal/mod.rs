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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
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
use crate::state::TerminalSessionState;
use crate::store::{TerminalReport, TerminalSessionRow};
use crate::tools::input;

pub use mira_tools::pty::DEFAULT_ENV;
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
/// PTY columns when `start` gives none.
pub const DEFAULT_COLS: u64 = 120;
/// Most PTY columns.
pub const MAX_COLS: u64 = 1000;
/// PTY rows when `start` gives none.
pub const DEFAULT_ROWS: u64 = 32;
/// Most PTY rows.
pub const MAX_ROWS: u64 = 500;
/// Fewest PTY columns or rows.
pub const MIN_SIZE: u64 = 2;
/// How long `wait` waits when it gives no `timeout_ms`: 30 s.
pub const DEFAULT_WAIT_MS: u64 = 30_000;
/// Quiet time of `wait until=idle` when it gives no `idle_ms`.
pub const DEFAULT_IDLE_MS: u64 = 500;
/// Shortest `idle_ms`.
pub const MIN_IDLE_MS: u64 = 10;
/// Longest `idle_ms`: 10 minutes.
pub const MAX_IDLE_MS: u64 = 600_000;
/// Longest `command` or `cwd`, in bytes.
pub const MAX_PATH_BYTES: u32 = 4096;
/// Most `args`.
pub const MAX_ARGS: u32 = 1024;
/// Longest argument, in bytes.
pub const MAX_ARG_BYTES: u32 = 65_536;
/// Most variables in `env`.
pub const MAX_ENV_VARS: u32 = 256;
/// Longest variable value, in bytes.
pub const MAX_ENV_VALUE_BYTES: u32 = 32_768;
/// Longest `session_id`.
pub const MAX_SESSION_ID_BYTES: u32 = 64;

/// `terminal_session`'s input: one variant per action, named by `action`. Each variant takes
/// only its own fields (another is `invalid_field`) and needs its required ones
/// (`missing_field`); both checks read the variant's generated schema, so they follow the
/// type. The tool publishes one flat object schema ([`flat_schema`]): every field of every
/// action, `action` the only required one, so a call names its action first and the
/// per-action answer is one of those two codes (as it was before the input was typed).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
pub(crate) enum TerminalAction {
    Start(StartInput),
    Input(TypeInput),
    Signal(SignalInput),
    Resize(ResizeInput),
    Wait(WaitInput),
    Kill(KillInput),
    Output(OutputInput),
}

impl TerminalAction {
    /// The session an action goes to (all but `start`).
    fn session_id(&self) -> Option<&str> {
        match self {
            TerminalAction::Start(_) => None,
            TerminalAction::Input(a) => Some(&a.session_id),
            TerminalAction::Signal(a) => Some(&a.session_id),
            TerminalAction::Resize(a) => Some(&a.session_id),
            TerminalAction::Wait(a) => Some(&a.session_id),
            TerminalAction::Kill(a) => Some(&a.session_id),
            TerminalAction::Output(a) => Some(&a.session_id),
        }
    }
}

/// `start`: open a session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartInput {
    /// start: program to run (default: the user's shell)
    #[schemars(length(min = 1, max = MAX_PATH_BYTES))]
    command: Option<String>,
    /// start: its arguments
    #[schemars(length(max = MAX_ARGS), inner(length(max = MAX_ARG_BYTES)))]
    args: Option<Vec<String>>,
    /// start: working directory, relative to the workspace or absolute (default: the workspace root)
    #[schemars(length(min = 1, max = MAX_PATH_BYTES))]
    cwd: Option<String>,
    /// start: variables to set (null removes one)
    #[schemars(extend(
        "maxProperties" = MAX_ENV_VARS,
        "additionalProperties" = {"type": ["string", "null"], "maxLength": MAX_ENV_VALUE_BYTES},
    ))]
    env: Option<BTreeMap<String, Option<String>>>,
    /// start: life limit of the session (default 1 h); wait: how long to wait (default 30 s, at most 5 min)
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    timeout_ms: Option<u64>,
    /// start/resize: PTY columns (default 120)
    #[schemars(range(min = MIN_SIZE, max = MAX_COLS))]
    cols: Option<u64>,
    /// start/resize: PTY rows (default 32)
    #[schemars(range(min = MIN_SIZE, max = MAX_ROWS))]
    rows: Option<u64>,
    /// start/input: return once output has been quiet this long (default 300)
    #[schemars(range(min = 0, max = MAX_SETTLE_MS))]
    settle_ms: Option<u64>,
}

/// `input`: type text into a session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TypeInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
    /// input: text to type (\n = Enter)
    #[schemars(length(max = MAX_INPUT_BYTES))]
    data: String,
    /// start/input: return once output has been quiet this long (default 300)
    #[schemars(range(min = 0, max = MAX_SETTLE_MS))]
    settle_ms: Option<u64>,
}

/// What `signal` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignalName {
    /// Ctrl-C (SIGINT to the foreground when the input is blocked).
    Interrupt,
    /// Ctrl-D.
    Eof,
    /// SIGTERM to the foreground process group.
    Terminate,
    /// SIGKILL to the foreground process group.
    Kill,
}

/// `signal`: send a signal.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignalInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
    /// signal: what to send
    signal: SignalName,
}

/// `resize`: change the PTY size.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResizeInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
    /// start/resize: PTY columns (default 120)
    #[schemars(range(min = MIN_SIZE, max = MAX_COLS))]
    cols: u64,
    /// start/resize: PTY rows (default 32)
    #[schemars(range(min = MIN_SIZE, max = MAX_ROWS))]
    rows: u64,
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitUntil {
    /// The program's exit.
    #[default]
    Exit,
    /// Output going quiet for `idle_ms`.
    Idle,
}

/// `wait`: wait for the exit or for quiet output.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
    /// wait: for the exit (default) or for output to go quiet
    until: Option<WaitUntil>,
    /// wait until=idle: quiet time (default 500)
    #[schemars(range(min = MIN_IDLE_MS, max = MAX_IDLE_MS))]
    idle_ms: Option<u64>,
    /// start: life limit of the session (default 1 h); wait: how long to wait (default 30 s, at most 5 min)
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    timeout_ms: Option<u64>,
}

impl WaitInput {
    fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS)
    }

    /// The quiet time, when waiting for it.
    fn idle_ms(&self) -> Option<u64> {
        (self.until == Some(WaitUntil::Idle)).then(|| self.idle_ms.unwrap_or(DEFAULT_IDLE_MS).min(MAX_IDLE_MS))
    }
}

/// `kill`: end the session.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KillInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
}

/// `output`: read a stored range, or search it ([`OutputQuery`] reads the fields).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutputInput {
    /// The session (all actions but start)
    #[schemars(length(max = MAX_SESSION_ID_BYTES))]
    session_id: String,
    /// output: first byte offset (default 0)
    #[schemars(range(min = 0, max = MAX_OFFSET))]
    from: Option<u64>,
    /// output: one past the last byte offset (default: the end so far)
    #[schemars(range(min = 0, max = MAX_OFFSET))]
    to: Option<u64>,
    /// output: bytes of output per page (default 65536); the result's next_from continues
    #[schemars(range(min = 1, max = MAX_OUTPUT_BYTES))]
    max_bytes: Option<u64>,
    /// output: a regex (Rust syntax) matched against each rendered line
    #[schemars(length(min = 1, max = MAX_PATTERN_BYTES))]
    pattern: Option<String>,
    /// output: pattern ignores case
    case_insensitive: Option<bool>,
    /// output: matching lines at most (default 100)
    #[schemars(range(min = 1, max = MAX_MATCHES))]
    max_matches: Option<u64>,
}

/// The frozen canonical input of `start` (what [`prepare_start`] resolved).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct FrozenStart {
    command: String,
    program: String,
    args: Vec<String>,
    cwd: String,
    env: Map<String, Value>,
    timeout_ms: Option<u64>,
    cols: Option<u64>,
    rows: Option<u64>,
    settle_ms: Option<u64>,
    sandbox: Option<Value>,
}

/// The schema of each action's variant, generated from [`TerminalAction`].
static VARIANTS: LazyLock<Vec<Value>> = LazyLock::new(|| match input::schema_of::<TerminalAction>().get("oneOf") {
    Some(Value::Array(variants)) => variants.clone(),
    _ => Vec::new(),
});

/// The `action` a variant schema stands for.
fn variant_action(variant: &Value) -> Option<&str> {
    variant.pointer("/properties/action/const").and_then(Value::as_str)
}

/// The published input schema: one object with every field of every action (the first
/// action that has a field gives its schema; `flat_schema_is_lossless` checks that they all
/// agree), `action` an enum of the actions and the only required field.
pub fn flat_schema() -> Value {
    let mut actions = Vec::new();
    let mut properties = Map::new();
    for variant in VARIANTS.iter() {
        actions.extend(variant_action(variant).map(|a| json!(a)));
        for (name, schema) in variant.get("properties").and_then(Value::as_object).into_iter().flatten() {
            if name != "action" && !properties.contains_key(name) {
                properties.insert(name.clone(), schema.clone());
            }
        }
    }
    let mut all = Map::new();
    all.insert("action".into(), json!({"type": "string", "enum": actions}));
    all.extend(properties);
    json!({"type": "object", "required": ["action"], "properties": all, "additionalProperties": false})
}

/// The per-action rules of [`TerminalAction`] on a schema-valid input: a field the action
/// does not take is `invalid_field`, a missing required one `missing_field` (checked in
/// that order, as before the input was typed).
fn check_action_fields(input: &Value) -> Result<(), ToolError> {
    let action = input.get("action").and_then(Value::as_str).unwrap_or_default();
    let Some(variant) = VARIANTS.iter().find(|v| variant_action(v) == Some(action)) else { return Ok(()) };
    let takes = |k: &str| variant.pointer(&format!("/properties/{k}")).is_some();
    if let Some(extra) = input.as_object().into_iter().flat_map(|o| o.keys()).find(|k| !takes(k)) {
        return Err(bad(ErrorCode::InvalidField, format!("action {action} does not take {extra}")));
    }
    let required = variant.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    for field in required {
        if input.get(field).is_none() {
            return Err(bad(ErrorCode::MissingField, format!("action {action} needs {field}")));
        }
    }
    Ok(())
}

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
            input_schema: flat_schema(),
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

/// The `action` of an input (raw or frozen).
fn action_of(input: &Value) -> &str {
    input.get("action").and_then(Value::as_str).unwrap_or_default()
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
fn prepare_start(input: &StartInput, ws_root: &Path, starter: &Starter<'_>) -> Result<Prepared, ToolError> {
    // A NUL byte cannot reach a process (argv, env and paths are C strings): refused here,
    // before anyone approves a call that could never run.
    let strings = [&input.command, &input.cwd]
        .into_iter()
        .filter_map(Option::as_deref)
        .chain(input.args.iter().flatten().map(String::as_str))
        .chain(input.env.iter().flat_map(|m| m.values()).filter_map(Option::as_deref));
    for v in strings {
        if v.contains('\0') {
            return Err(bad(
                ErrorCode::NulByte,
                format!("{:?} contains a NUL byte, which no program can receive", excerpt(v, 80)),
            ));
        }
    }
    let cwd: PathBuf = match input.cwd.as_deref() {
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
    let call_env: Map<String, Value> =
        input.env.iter().flatten().map(|(k, v)| (k.clone(), v.as_ref().map_or(Value::Null, |v| json!(v)))).collect();
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
    let command = match input.command.as_deref() {
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
    let args: Vec<String> = input.args.clone().unwrap_or_default();
    let canonical = json!({
        "action": "start",
        "command": command,
        "program": program,
        "args": args,
        "cwd": cwd.to_string_lossy(),
        "env": env,
        "timeout_ms": input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).min(MAX_TIMEOUT_MS),
        "cols": input.cols.unwrap_or(DEFAULT_COLS).min(MAX_COLS),
        "rows": input.rows.unwrap_or(DEFAULT_ROWS).min(MAX_ROWS),
        "settle_ms": input.settle_ms.unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS),
        "sandbox": sandbox,
    });
    let outside = !cwd.starts_with(ws_root);
    // Characters that print as nothing or reorder the text (a U+202E that makes `; curl …|sh`
    // read as a comment): flagged, and the page shows the text escaped.
    let text_flags = crate::workspace::lookalike::text_flags(
        std::iter::once(command.as_str())
            .chain(args.iter().map(String::as_str))
            .chain(input.env.iter().flatten().flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.as_deref()))),
    );
    let preview = json!({
        "text_flags": text_flags,
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
fn canonical_session_action(action: &TerminalAction) -> Result<Value, ToolError> {
    Ok(match action {
        TerminalAction::Input(a) => json!({
            "action": "input", "session_id": a.session_id, "data": a.data,
            "settle_ms": a.settle_ms.unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS),
        }),
        TerminalAction::Signal(a) => json!({"action": "signal", "session_id": a.session_id, "signal": a.signal}),
        TerminalAction::Resize(a) => {
            json!({"action": "resize", "session_id": a.session_id, "cols": a.cols, "rows": a.rows})
        }
        TerminalAction::Wait(a) => {
            let mut c = json!({
                "action": "wait", "session_id": a.session_id, "until": a.until.unwrap_or_default(),
                "timeout_ms": a.timeout_ms(),
            });
            if let Some(idle) = a.idle_ms() {
                c["idle_ms"] = json!(idle);
            }
            c
        }
        TerminalAction::Output(a) => {
            let q = OutputQuery::from_fields(&a.fields())?;
            let mut c = json!({"action": "output", "session_id": a.session_id, "from": q.from});
            if let Some(to) = q.to {
                c["to"] = json!(to);
            }
            match &a.pattern {
                Some(p) => {
                    c["pattern"] = json!(p);
                    c["case_insensitive"] = json!(a.case_insensitive == Some(true));
                    c["max_matches"] = json!(q.max_matches);
                }
                None => c["max_bytes"] = json!(q.max_bytes),
            }
            c
        }
        TerminalAction::Kill(a) => json!({"action": "kill", "session_id": a.session_id}),
        TerminalAction::Start(_) => return Err(bad(ErrorCode::InvalidField, "start is not an action on a session")),
    })
}

fn canonical(input: &Value, ctx: &PrepareContext<'_>, starter: &Starter<'_>) -> Result<Prepared, ToolError> {
    check_action_fields(input)?;
    match input::parse::<TerminalAction>(input)? {
        TerminalAction::Start(start) => prepare_start(&start, ctx.workspace()?.root(), starter),
        action => Ok(Prepared { input: canonical_session_action(&action)?, preview: Value::Null }),
    }
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
        let exit = (row.state != TerminalSessionState::Running).then(|| ExitInfo {
            state: row.state,
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

    fn state(&self) -> TerminalSessionState {
        self.exit.as_ref().map_or(TerminalSessionState::Running, |e| e.state)
    }
}

fn store_error(e: crate::store::StoreError) -> ToolError {
    ToolError::new(ErrorCode::StoreError, e.to_string())
}

impl TerminalSession {
    async fn is_admin(&self, user_id: &str) -> Result<bool, ToolError> {
        self.host.store().user_is_admin(user_id).await.map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))
    }

    /// The caller's live session `id`, or 404 / 409 (ended).
    async fn live_session(&self, id: &str, owner_id: &str) -> Result<Arc<Session>, ToolError> {
        let ended = |state: TerminalSessionState, exit_code: Option<i64>, end_reason: Option<&str>| {
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
                Some(e) => Err(ended(e.state, e.exit_code, e.end_reason.as_deref())),
            };
        }
        match self.host.store().terminal_session_for(owner_id, id).await {
            Ok(Some(row)) => Err(ended(row.state, row.exit_code, row.end_reason.as_deref())),
            Ok(None) => Err(session_not_found(id)),
            Err(e) => Err(store_error(e)),
        }
    }

    /// The caller's session `id`, live or ended: the live session (if this process holds it)
    /// and its stored row.
    async fn any_session(
        &self,
        id: &str,
        owner_id: &str,
    ) -> Result<(Option<Arc<Session>>, TerminalSessionRow), ToolError> {
        let row = self.host.store().terminal_session_for(owner_id, id).await.map_err(store_error)?;
        let row = row.ok_or_else(|| session_not_found(id))?;
        Ok((self.host.get(owner_id, id), row))
    }

    /// Runs one action on a session and returns its result and evidence. Every action but
    /// `output` reports the output from the session's reported-up-to offset to the end at
    /// its return.
    async fn act(&self, input: &Value, action: &TerminalAction, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let id = action.session_id().unwrap_or_default();
        if let TerminalAction::Output(o) = action {
            return self.read_output(input, o, &ctx.owner_id, &ctx.run_id, &ctx.invocation_id).await;
        }
        let wait_only = matches!(action, TerminalAction::Wait(_) | TerminalAction::Kill(_));
        let session = match self.live_session(id, &ctx.owner_id).await {
            Ok(s) => s,
            // Waiting on, or killing, a session that already ended reports how it ended,
            // with the output not yet reported.
            Err(e) if wait_only && e.code == ErrorCode::TerminalSessionEnded => {
                return self.ended_report(input, id, ctx).await;
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
            TerminalAction::Input(a) => {
                session.write_input(a.data.as_bytes().to_vec()).await?;
                let settle_ms = a.settle_ms.unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS);
                settle(&source, &session, &mut capture, settle_ms, ctx).await?
            }
            TerminalAction::Signal(a) => {
                match a.signal {
                    SignalName::Interrupt => match session.write_input(vec![0x03]).await {
                        // Ctrl-C through the terminal (the line discipline, or the program in raw
                        // mode, acts on it); when the input is blocked, SIGINT to the foreground.
                        Err(e) if e.code == ErrorCode::PtyInputBlocked => session.signal_foreground(libc::SIGINT),
                        other => other?,
                    },
                    SignalName::Eof => session.write_input(vec![0x04]).await?,
                    SignalName::Terminate => session.signal_foreground(libc::SIGTERM),
                    SignalName::Kill => session.signal_foreground(libc::SIGKILL),
                }
                settle(&source, &session, &mut capture, DEFAULT_SETTLE_MS, ctx).await?
            }
            TerminalAction::Resize(a) => {
                let cols = u16::try_from(a.cols.min(MAX_COLS)).unwrap_or(120);
                let rows = u16::try_from(a.rows.min(MAX_ROWS)).unwrap_or(32);
                session.resize(cols, rows)?;
                if let Err(e) = store.resize_terminal_session(&session.id, cols, rows).await {
                    tracing::warn!(error = %e, "recording a PTY resize failed");
                }
                source.pull(&mut capture, None).await.map_err(store_error)?;
                "resized"
            }
            TerminalAction::Wait(a) => {
                let timeout = Duration::from_millis(a.timeout_ms());
                let idle = a.idle_ms().map(Duration::from_millis);
                watch_output(&source, &session, &mut capture, idle, timeout, ctx).await?
            }
            _ => {
                session.end(TerminalSessionState::Killed, "killed by a terminal_session kill action".into());
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
    async fn ended_report(&self, input: &Value, id: &str, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let (live, row) = self.any_session(id, &ctx.owner_id).await?;
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
    async fn read_output(
        &self,
        input: &Value,
        o: &OutputInput,
        owner_id: &str,
        run_id: &str,
        invocation_id: &str,
    ) -> Result<ToolOutput, ToolError> {
        let (live, row) = self.any_session(&o.session_id, owner_id).await?;
        let facts = match &live {
            Some(s) => Facts::live(s),
            None => Facts::stored(&row),
        };
        let source = Source { store: self.host.store(), id: &row.id, live: live.as_deref() };
        let q = OutputQuery::from_fields(&o.fields())?;
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
        event["invocation_id"] = json!(invocation_id);
        event["action"] = json!("output");
        if let Err(e) = self.host.store().record_terminal_output(run_id, &event, None).await {
            tracing::warn!(error = %e, "recording terminal.output failed");
        }
        Ok(ToolOutput { output, evidence: vec![evidence] })
    }

    /// The `output` action (frozen `input`) of invocation `invocation_id` on a session of the
    /// remote device `device_id`: read from the store like any ended or remote session. A
    /// session of another device (or another user) is `terminal_session_not_found`.
    pub async fn device_output(
        &self,
        input: &Value,
        owner_id: &str,
        run_id: &str,
        invocation_id: &str,
        device_id: &str,
    ) -> Result<ToolOutput, ToolError> {
        let TerminalAction::Output(o) = input::frozen::<TerminalAction>(input)? else {
            return Err(bad(ErrorCode::InvalidField, "not an output action"));
        };
        match self.host.store().terminal_session_for(owner_id, &o.session_id).await.map_err(store_error)? {
            Some(row) if row.node_id == device_id => {}
            _ => return Err(session_not_found(&o.session_id)),
        }
        self.read_output(input, &o, owner_id, run_id, invocation_id).await
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

/// An offset field: a whole number in `0..=MAX_OFFSET`, or `invalid_field`.
fn offset_field(value: Option<u64>, name: &str) -> Result<Option<u64>, ToolError> {
    match value {
        Some(n) if n > MAX_OFFSET => {
            Err(bad(ErrorCode::InvalidField, format!("{name} must be a byte offset from 0 to {MAX_OFFSET}")))
        }
        other => Ok(other),
    }
}

/// The fields of an `output` read: the `output` action's ([`OutputInput`]) and those of
/// `GET /v1/terminal-sessions/{id}/output`.
#[derive(Debug, Clone, Default)]
pub struct OutputFields<'a> {
    /// First byte offset (default 0).
    pub from: Option<u64>,
    /// One past the last byte offset (default: the end so far).
    pub to: Option<u64>,
    /// Bytes per page (default [`DEFAULT_OUTPUT_BYTES`]); not with `pattern`.
    pub max_bytes: Option<u64>,
    /// A regex matched against each rendered line (a search).
    pub pattern: Option<&'a str>,
    /// `pattern` ignores case; only with `pattern`.
    pub case_insensitive: Option<bool>,
    /// Matching lines at most (default [`DEFAULT_MATCHES`]); only with `pattern`.
    pub max_matches: Option<u64>,
}

impl OutputInput {
    /// The fields of this `output` action.
    fn fields(&self) -> OutputFields<'_> {
        OutputFields {
            from: self.from,
            to: self.to,
            max_bytes: self.max_bytes,
            pattern: self.pattern.as_deref(),
            case_insensitive: self.case_insensitive,
            max_matches: self.max_matches,
        }
    }
}

impl OutputQuery {
    /// The query of an `output` read: `invalid_range` when `from` > `to`, `invalid_pattern`,
    /// `invalid_field` (a bad offset, or `max_bytes` with `pattern`,
    /// `case_insensitive`/`max_matches` without it).
    pub fn from_fields(f: &OutputFields<'_>) -> Result<Self, ToolError> {
        let from = offset_field(f.from, "from")?.unwrap_or(0);
        let to = offset_field(f.to, "to")?;
        if let Some(to) = to.filter(|to| *to < from) {
            return Err(bad(ErrorCode::InvalidRange, format!("from {from} is after to {to}")));
        }
        let searching = f.pattern.is_some();
        let misplaced = if searching {
            [("max_bytes", f.max_bytes.is_some())].to_vec()
        } else {
            [("case_insensitive", f.case_insensitive.is_some()), ("max_matches", f.max_matches.is_some())].to_vec()
        };
        if let Some((name, _)) = misplaced.iter().find(|(_, given)| *given) {
            let with = if searching { "with pattern (a search)" } else { "without pattern (a page)" };
            return Err(bad(ErrorCode::InvalidField, format!("output {with} does not take {name}")));
        }
        let pattern = match f.pattern {
            Some(p) => Some(output_pattern(p, f.case_insensitive == Some(true))?),
            None => None,
        };
        Ok(Self {
            from,
            to,
            max_bytes: f.max_bytes.unwrap_or(DEFAULT_OUTPUT_BYTES).clamp(1, MAX_OUTPUT_BYTES),
            pattern,
            max_matches: usize::try_from(f.max_matches.unwrap_or(DEFAULT_MATCHES).clamp(1, MAX_MATCHES)).unwrap_or(100),
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
        if !ctx.device.local {
            // On a device the runner runs the PTY, with the device's own isolation
            // (docs/runner.md), not the server's sandbox.
            return Availability::Available;
        }
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
            let frozen: TerminalAction = input::frozen(&prepared.input)?;
            let id = frozen.session_id().unwrap_or_default();
            let session = match self.live_session(id, ctx.owner_id).await {
                // Running in another replica's process (the owner runs the action when it
                // comes, see crate::cluster::forward): the stored row describes it.
                Err(e) if e.code == ErrorCode::TerminalSessionEnded && e.details["state"] == "running" => {
                    match self.host.store().terminal_session_for(ctx.owner_id, id).await.map_err(store_error)? {
                        // A device's session is reached from runs on that device only.
                        Some(row) if row.node_id.starts_with("dev_") => return Err(session_not_found(id)),
                        Some(row) if row.node_id != self.host.node_id() => {
                            let f = Facts::stored(&row);
                            json!({"id": f.id, "command_line": f.command_line, "cwd": f.cwd, "pid": f.pid,
                                   "state": "running", "node_id": row.node_id})
                        }
                        _ => return Err(e),
                    }
                }
                Ok(s) => {
                    json!({"id": s.id, "command_line": s.command_line, "cwd": s.cwd, "pid": s.pid, "state": "running"})
                }
                // Ended: the caller's stored row still says which program it ran, and where.
                Err(e)
                    if matches!(action.as_str(), "wait" | "kill" | "output")
                        && e.code == ErrorCode::TerminalSessionEnded =>
                {
                    match self.host.store().terminal_session_for(ctx.owner_id, id).await.map_err(store_error)? {
                        Some(row) => {
                            let f = Facts::stored(&row);
                            json!({"id": f.id, "command_line": f.command_line, "cwd": f.cwd, "pid": f.pid,
                                   "state": e.details["state"]})
                        }
                        None => json!({"id": prepared.input["session_id"], "state": e.details["state"]}),
                    }
                }
                Err(e) => return Err(e),
            };
            prepared.preview = json!({"action": action, "session": session});
            if let Some(data) = prepared.input["data"].as_str() {
                // Keystrokes are control characters by nature (Enter, Ctrl-C, arrows): flagging
                // them would put the warning on nearly every input. What changes how the
                // bytes read (bidi controls, invisible characters) is still flagged.
                let flags: Vec<_> = crate::workspace::lookalike::text_flags([data])
                    .into_iter()
                    .filter(|k| *k != crate::workspace::lookalike::FlagKind::Control)
                    .collect();
                prepared.preview["text_flags"] = json!(flags);
            }
        }
        Ok(prepared)
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        let starter = Starter { sandbox: self.host.sandbox(), is_admin: self.is_admin(ctx.owner_id).await? };
        Ok(canonical(&input, ctx, &starter)?.input)
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        if action_of(input) != "start" {
            let action: TerminalAction = input::frozen(input)?;
            return self.act(input, &action, ctx).await;
        }
        let start: FrozenStart = input::frozen(input)?;
        let cwd = start.cwd.clone();
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
        // The sandbox that applies now must be the one approved. It is decided, bound and
        // Landlock-ruled from the workspace root the run holds open (by identity), at the
        // real path of that open folder — never by looking its path up again, where a
        // symlink swapped into a folder on the way would lead elsewhere.
        let is_admin = self.is_admin(&ctx.owner_id).await?;
        let (root_path, root_fd) = pinned_root(ctx.workspace()?)?;
        let root = root_path.as_path();
        let sandbox = self.host.sandbox().spec(&SpecRequest {
            workspace: Some(root),
            cwd: Path::new(&cwd),
            is_admin,
            read_only: &[],
        })?;
        let frozen: Option<SandboxSpec> = start.sandbox.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok());
        // Frozen on another replica, the spec denies that replica's own port instead of this
        // one's: accepted, and both are denied.
        let Some(sandbox) = frozen.as_ref().and_then(|f| self.host.sandbox().accept_frozen(&sandbox, f)) else {
            return Err(ToolError::new(
                ErrorCode::SandboxChanged,
                "the sandbox this session would get is not the one approved (the server's sandbox or the workspace changed); freeze the call again",
            )
            .with_details(json!({"approved": input.get("sandbox"), "now": sandbox})));
        };
        // Other users' workspaces inside this sandbox's folders are covered too. One at the
        // workspace's own folder (two users registered the same folder) cannot be covered —
        // the sandbox covers only what lies strictly inside the folders it shows — so the
        // session does not start rather than show another user's workspace.
        let hidden: Vec<PathBuf> = if is_admin || !sandbox.enforced {
            Vec::new()
        } else {
            self.host
                .store()
                .other_users_workspace_paths(&ctx.owner_id)
                .await
                .map_err(|e| ToolError::new(ErrorCode::StoreError, e.to_string()))?
                .into_iter()
                .map(PathBuf::from)
                .collect()
        };
        if hidden.iter().any(|p| p.as_path() == root) {
            return Err(ToolError::new(
                ErrorCode::WorkspacePathTaken,
                format!(
                    "the workspace's folder {} is also another user's workspace; a sandboxed session cannot hide it, \
                     so none starts there",
                    root.display()
                ),
            )
            .with_details(json!({"path": root})));
        }
        let spec = StartSpec {
            sandbox,
            hidden,
            pinned_root: Some(std::sync::Arc::new((root_path.to_string_lossy().into_owned(), root_fd))),
            owner_id: ctx.owner_id.clone(),
            run_id: ctx.run_id.clone(),
            invocation_id: ctx.invocation_id.clone(),
            program: start.program.clone(),
            command: start.command.clone(),
            args: start.args.clone(),
            cwd,
            env: start.env.clone(),
            timeout_ms: start.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).min(MAX_TIMEOUT_MS),
            cols: u16::try_from(start.cols.unwrap_or(DEFAULT_COLS).min(MAX_COLS)).unwrap_or(120),
            rows: u16::try_from(start.rows.unwrap_or(DEFAULT_ROWS).min(MAX_ROWS)).unwrap_or(32),
        };
        let size = (spec.rows, spec.cols);
        // Until this execution returns, cancelling it (or dropping it) ends the session it
        // started: a cancelled start leaves nothing running.
        let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
        let session = self.host.start(spec, ctx.cancel.clone(), done_rx).await?;
        let mut capture = Capture::new(0, size.0, size.1);
        let source = Source { store: self.host.store(), id: &session.id, live: Some(&session) };
        let settle_ms = start.settle_ms.unwrap_or(DEFAULT_SETTLE_MS).min(MAX_SETTLE_MS);
        let reason = settle(&source, &session, &mut capture, settle_ms, ctx).await?;
        let out = self.finish(input, &Facts::live(&session), &capture, reason, ctx).await;
        let _ = done.send(());
        Ok(out)
    }
}

/// The workspace root the run holds open, as a new descriptor of the same open folder, with
/// the folder's real path now (the kernel's path of the descriptor). 409 `stale_target`
/// when it cannot be read (the folder was removed).
fn pinned_root(ws: &crate::workspace::Workspace) -> Result<(PathBuf, std::os::fd::OwnedFd), ToolError> {
    use std::os::fd::{AsFd, AsRawFd};
    let stale = |e: std::io::Error| {
        let message = format!("the workspace {} cannot be held open: {e}", ws.root().display());
        ToolError::new(ErrorCode::StaleTarget, message)
    };
    let fd = ws.dir().as_fd().try_clone_to_owned().map_err(stale)?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(stale)?;
    if !real.is_absolute() || !real.is_dir() {
        return Err(stale(std::io::Error::other(format!("it is now {}", real.display()))));
    }
    Ok((real, fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every action that shares a field gives it the same schema, so the flat schema loses
    /// nothing of any action's.
    #[test]
    fn flat_schema_is_lossless() {
        let flat = flat_schema();
        assert_eq!(VARIANTS.len(), 7);
        for variant in VARIANTS.iter() {
            let action = variant_action(variant).unwrap_or_default();
            for (name, schema) in variant["properties"].as_object().into_iter().flatten() {
                if name != "action" {
                    assert_eq!(&flat["properties"][name], schema, "{action}.{name}");
                }
            }
            assert_eq!(variant["additionalProperties"], json!(false), "{action}");
        }
        assert_eq!(
            flat["properties"]["action"]["enum"],
            json!(["start", "input", "signal", "resize", "wait", "kill", "output"])
        );
        assert_eq!(flat["required"], json!(["action"]));
    }

    #[test]
    fn action_fields_follow_the_type() {
        let code = |v: Value| check_action_fields(&v).err().map_or("", |e| e.code.as_str());
        assert_eq!(code(json!({"action": "input", "session_id": "s"})), "missing_field");
        assert_eq!(code(json!({"action": "input", "session_id": "s", "data": "x", "cols": 3})), "invalid_field");
        assert_eq!(code(json!({"action": "kill"})), "missing_field");
        assert_eq!(code(json!({"action": "start", "session_id": "s"})), "invalid_field");
        assert_eq!(code(json!({"action": "resize", "session_id": "s", "cols": 80})), "missing_field");
        assert_eq!(code(json!({"action": "start", "command": "ls", "env": {"A": null}})), "");
        assert_eq!(code(json!({"action": "wait", "session_id": "s", "until": "idle", "idle_ms": 20})), "");
    }
}
