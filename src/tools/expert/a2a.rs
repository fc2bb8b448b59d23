//! A small A2A 1.0 client over JSON-RPC (reqwest, SSE parsed here): the agent card, and one
//! message sent with `SendMessage` or `SendStreamingMessage`.
//!
//! Wire shapes as a2a-sdk 1.3.0 speaks them (protobuf JSON, camelCase): the card's
//! `supportedInterfaces[] {url, protocolBinding: "JSONRPC", protocolVersion: "1.0"}` and
//! `capabilities.streaming`; requests `{"jsonrpc": "2.0", "id", "method", "params":
//! SendMessageRequest {message: {messageId, role: "ROLE_USER", parts: [{text}], contextId?,
//! taskId?}}}` with the header `A2A-Version: 1.0`; `SendMessage` answers `{"result": {"task"} |
//! {"message"}}`, `SendStreamingMessage` an SSE stream whose every `data:` is a JSON-RPC
//! response holding one `StreamResponse` (`task`, `message`, `statusUpdate`, `artifactUpdate`).
//! Task states are `TASK_STATE_*`.
//!
//! Every request is bounded: no redirects, the connection's [`AddressRule`] at each connect
//! (IP literals checked here, names by [`crate::net::PublicResolver`]), the card at
//! [`MAX_CARD_BYTES`], an SSE line at [`MAX_LINE_BYTES`], the answer at [`MAX_ANSWER_BYTES`],
//! the whole exchange at [`MAX_TIME`]. A stream that ends before a final task state is
//! [`End::Incomplete`], never an answer.

use std::time::Duration;

use futures::StreamExt;
use reqwest::Url;
use serde_json::{Value, json};

use crate::connections::AddressRule;
use crate::error::ErrorCode;
use crate::registry::ToolError;

/// Largest agent card read, in bytes.
pub const MAX_CARD_BYTES: usize = 64 * 1024;
/// Longest line of an SSE stream (one `data:` line carries one event), in bytes.
pub const MAX_LINE_BYTES: usize = 512 * 1024;
/// Largest answer (the text of the task's artifacts and status messages) kept, in bytes.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Bytes each artifact counts towards [`MAX_ANSWER_BYTES`] beyond its id and text: an expert
/// cannot make the answer hold thousands of empty artifacts for free.
pub const ARTIFACT_OVERHEAD: usize = 64;
/// Largest non-streaming JSON-RPC answer read, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Most SSE events of one answer.
pub const MAX_EVENTS: usize = 20_000;
/// Longest a whole consultation may take (connect, send, every event).
pub const MAX_TIME: Duration = Duration::from_secs(120);
/// Longest a card fetch may take.
pub const CARD_TIMEOUT: Duration = Duration::from_secs(10);
/// The A2A protocol version this client speaks (header `A2A-Version`).
pub const PROTOCOL_VERSION: &str = "1.0";

/// How the expert authenticates the server (the connection's credential).
#[derive(Clone)]
pub enum Auth {
    /// No header.
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `<header>: <key>`.
    ApiKey {
        /// Header name.
        header: reqwest::header::HeaderName,
        /// Key.
        key: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "Auth::None",
            Auth::Bearer(_) => "Auth::Bearer(…)",
            Auth::ApiKey { .. } => "Auth::ApiKey(…)",
        })
    }
}

/// An HTTP client for one expert: the address rule, no redirects, the credential.
pub struct Client {
    http: reqwest::Client,
    auth: Auth,
    rule: AddressRule,
}

/// An agent card as fetched.
#[derive(Debug, Clone)]
pub struct Card {
    /// The card's JSON.
    pub json: Value,
    /// Lowercase hex SHA-256 of its RFC 8785 canonical JSON.
    pub sha256: String,
    /// `name` (at most 200 characters).
    pub name: String,
    /// The JSON-RPC interface's URL.
    pub service_url: Url,
    /// `capabilities.streaming`.
    pub streaming: bool,
}

/// A task state (`TASK_STATE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Accepted, not started.
    Submitted,
    /// Running.
    Working,
    /// Done: the answer is complete.
    Completed,
    /// The expert failed.
    Failed,
    /// Cancelled.
    Canceled,
    /// The expert refused the task.
    Rejected,
    /// The expert asks a question (continue with `task_id`).
    InputRequired,
    /// The expert needs authentication.
    AuthRequired,
    /// A state this client does not know.
    Unknown,
}

impl TaskState {
    fn parse(s: &str) -> TaskState {
        let s = s.trim_start_matches("TASK_STATE_").to_ascii_lowercase().replace('-', "_");
        match s.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "input_required" => TaskState::InputRequired,
            "auth_required" => TaskState::AuthRequired,
            _ => TaskState::Unknown,
        }
    }

    /// Whether the task stops here (terminal or interrupted): the answer is final.
    pub fn is_final(self) -> bool {
        !matches!(self, TaskState::Submitted | TaskState::Working | TaskState::Unknown)
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Rejected => "rejected",
            TaskState::InputRequired => "input_required",
            TaskState::AuthRequired => "auth_required",
            TaskState::Unknown => "unknown",
        }
    }
}

/// What arrived of an answer so far.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The last task state seen.
    pub state: Option<TaskState>,
    /// The task's id.
    pub task_id: Option<String>,
    /// The context's id.
    pub context_id: Option<String>,
    /// (id, text) in order of first appearance.
    artifacts: Vec<(String, String)>,
    /// Index in `artifacts` by the SHA-256 of each artifact's whole id (ids are shown cut,
    /// [`cap_id`]; two that share their first 200 characters stay apart).
    artifact_index: std::collections::HashMap<[u8; 32], usize>,
    /// The text of the last status message (an input-required question, a failure reason).
    pub status_text: String,
    /// A direct `Message` answer's text.
    message_text: Option<String>,
    /// Events (or the one JSON answer) received.
    pub events: usize,
    /// Bytes of text held (artifacts, status and message text).
    pub bytes: usize,
}

impl Progress {
    /// The answer's text: the artifacts in order of first appearance, else a direct message,
    /// else the last status message.
    pub fn answer(&self) -> String {
        if !self.artifacts.is_empty() {
            return self.artifacts.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join("\n\n");
        }
        if let Some(m) = &self.message_text {
            return m.clone();
        }
        self.status_text.clone()
    }

    /// The artifacts' text alone (None when the expert sent none): what an interrupted task
    /// streamed before it asked.
    pub fn artifacts_text(&self) -> Option<String> {
        (!self.artifacts.is_empty())
            .then(|| self.artifacts.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join("\n\n"))
    }

    /// Counts what is held: each artifact's id and text plus [`ARTIFACT_OVERHEAD`] (so that
    /// many empty artifacts count too), the status and message text.
    fn recount(&mut self) {
        self.bytes = self.artifacts.iter().map(|(id, t)| id.len() + t.len() + ARTIFACT_OVERHEAD).sum::<usize>()
            + self.status_text.len()
            + self.message_text.as_ref().map_or(0, String::len);
    }

    fn ids(&mut self, task_id: Option<&Value>, context_id: Option<&Value>) {
        if let Some(t) = task_id.and_then(Value::as_str).filter(|t| !t.is_empty()) {
            self.task_id = Some(cap_id(t));
        }
        if let Some(c) = context_id.and_then(Value::as_str).filter(|c| !c.is_empty()) {
            self.context_id = Some(cap_id(c));
        }
    }

    fn status(&mut self, status: &Value) {
        if let Some(s) = status.get("state").and_then(Value::as_str) {
            self.state = Some(TaskState::parse(s));
        }
        if let Some(m) = status.get("message") {
            self.status_text = parts_text(m.get("parts"));
        }
    }

    fn artifact(&mut self, artifact: &Value, append: bool) {
        use sha2::Digest;
        let full = artifact.get("artifactId").and_then(Value::as_str).unwrap_or("");
        let key: [u8; 32] = sha2::Sha256::digest(full.as_bytes()).into();
        let text = parts_text(artifact.get("parts"));
        match self.artifact_index.get(&key).and_then(|i| self.artifacts.get_mut(*i)) {
            Some((_, t)) if append => t.push_str(&text),
            Some((_, t)) => *t = text,
            None => {
                self.artifact_index.insert(key, self.artifacts.len());
                self.artifacts.push((cap_id(full), text));
            }
        }
    }

    fn task(&mut self, task: &Value) {
        self.ids(task.get("id"), task.get("contextId"));
        if let Some(s) = task.get("status") {
            self.status(s);
        }
        if let Some(arts) = task.get("artifacts").and_then(Value::as_array) {
            for a in arts {
                self.artifact(a, false);
            }
        }
    }

    /// Applies one `StreamResponse` (or a `SendMessageResponse`).
    fn apply(&mut self, result: &Value) {
        self.events += 1;
        if let Some(task) = result.get("task") {
            self.task(task);
        } else if let Some(m) = result.get("message") {
            self.ids(m.get("taskId"), m.get("contextId"));
            self.message_text = Some(parts_text(m.get("parts")));
            // A direct message answers the request: nothing more follows.
            self.state = Some(TaskState::Completed);
        } else if let Some(u) = result.get("statusUpdate") {
            self.ids(u.get("taskId"), u.get("contextId"));
            if let Some(s) = u.get("status") {
                self.status(s);
            }
        } else if let Some(u) = result.get("artifactUpdate") {
            self.ids(u.get("taskId"), u.get("contextId"));
            let append = u.get("append").and_then(Value::as_bool).unwrap_or(false);
            if let Some(a) = u.get("artifact") {
                self.artifact(a, append);
            }
        }
        self.recount();
    }
}

fn cap_id(s: &str) -> String {
    s.chars().take(200).collect()
}

/// The text of a `parts` array: text parts as they are, data parts as JSON; files are named.
fn parts_text(parts: Option<&Value>) -> String {
    let Some(parts) = parts.and_then(Value::as_array) else { return String::new() };
    let mut out = String::new();
    for p in parts {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            out.push_str(t);
        } else if let Some(d) = p.get("data") {
            out.push_str(&d.to_string());
        } else if let Some(u) = p.get("url").and_then(Value::as_str) {
            out.push_str(&format!("[file: {u}]"));
        }
    }
    out
}

/// How an exchange ended.
#[derive(Debug)]
pub enum End {
    /// A final task state (terminal or interrupted) arrived.
    Final(Progress),
    /// It ended before one: the stream was cut, or a limit was reached (`reason`).
    Incomplete {
        /// What arrived.
        progress: Progress,
        /// `stream_closed`, `answer_too_large`, `line_too_long`, `too_many_events`,
        /// `time_limit`, `bad_event`.
        reason: &'static str,
        /// A sentence.
        message: String,
    },
    /// A JSON-RPC error object.
    RpcError {
        /// What arrived before it.
        progress: Progress,
        /// JSON-RPC `error.code`.
        code: i64,
        /// JSON-RPC `error.message` (at most 1000 bytes).
        message: String,
    },
}

fn transport(e: &reqwest::Error, what: &str) -> ToolError {
    if let Some(p) = crate::net::refused_address(e) {
        return ToolError::new(ErrorCode::InternalAddress, format!("{what}: {}", p.0));
    }
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    ToolError::new(ErrorCode::ConnectionUnreachable, format!("{what} failed: {}", cut(&msg, 500)))
}

/// `s` cut to at most `max` bytes on a character boundary.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// The canonical card URL of `url`: http(s), a host, no user info or fragment; a URL whose
/// path does not end in `.json` is taken as the expert's base and gets
/// `/.well-known/agent-card.json` appended.
pub fn card_url(url: &str) -> Result<Url, String> {
    let mut u = Url::parse(url.trim()).map_err(|e| format!("card_url is not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("card_url must be http or https".into());
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err("card_url has no host".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("card_url must not carry user info (put a key into the credential)".into());
    }
    u.set_fragment(None);
    if !u.path().ends_with(".json") {
        let base = u.path().trim_end_matches('/').to_owned();
        u.set_path(&format!("{base}/.well-known/agent-card.json"));
    }
    Ok(u)
}

impl Client {
    /// A client reaching only what `rule` allows, authenticating with `auth`.
    pub fn new(rule: AddressRule, auth: Auth) -> Result<Client, ToolError> {
        let http = crate::net::with_rule(crate::net::client_builder(), rule)
            .user_agent(crate::tools::search::net::USER_AGENT)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ToolError::new(ErrorCode::Internal, format!("the HTTP client cannot be built: {e}")))?;
        Ok(Client { http, auth, rule })
    }

    /// Refuses an IP-literal URL the rule forbids (names are checked by the resolver).
    async fn guard(&self, url: &Url) -> Result<(), ToolError> {
        if self.rule == AddressRule::Any {
            return Ok(());
        }
        if let Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) = url.host() {
            let host = url.host_str().unwrap_or_default();
            crate::net::resolve_host(host, url.port_or_known_default().unwrap_or(80), self.rule)
                .await
                .map_err(|p| ToolError::new(ErrorCode::InternalAddress, p.0))?;
        }
        Ok(())
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.auth {
            Auth::None => req,
            Auth::Bearer(t) => req.bearer_auth(t),
            Auth::ApiKey { header, key } => req.header(header.clone(), key.as_str()),
        }
    }

    /// Fetches and hashes the card at `url`. Errors: `internal_address`,
    /// `connection_unreachable`, `reauth_required` (401/403), `expert_error` (another status,
    /// not JSON, too large, no A2A 1.0 JSON-RPC interface).
    pub async fn card(&self, url: &Url) -> Result<Card, ToolError> {
        self.guard(url).await?;
        let req = self.authed(self.http.get(url.clone()).header(reqwest::header::ACCEPT, "application/json"));
        let fetch = async {
            let resp = req.send().await.map_err(|e| transport(&e, "fetching the agent card"))?;
            let status = resp.status();
            let body = read_capped(resp, MAX_CARD_BYTES)
                .await
                .map_err(|m| ToolError::new(ErrorCode::ExpertError, format!("reading the agent card at {url}: {m}")))?;
            Ok::<_, ToolError>((status, body))
        };
        let (status, body) = tokio::time::timeout(CARD_TIMEOUT, fetch).await.map_err(|_| {
            ToolError::new(
                ErrorCode::ConnectionUnreachable,
                format!("the agent card at {url} did not arrive within {} s", CARD_TIMEOUT.as_secs()),
            )
        })??;
        if matches!(status.as_u16(), 401 | 403) {
            return Err(ToolError::new(
                ErrorCode::ReauthRequired,
                format!("the expert refused the credential when fetching its card ({status})"),
            ));
        }
        if !status.is_success() {
            return Err(ToolError::new(ErrorCode::ExpertError, format!("the agent card at {url} answered {status}")));
        }
        let json: Value = serde_json::from_slice(&body)
            .map_err(|e| ToolError::new(ErrorCode::ExpertError, format!("the agent card at {url} is not JSON: {e}")))?;
        parse_card(json, url)
    }

    /// Sends `message` to the card's JSON-RPC interface (streaming when the card says so) and
    /// reads the answer until a final task state, a cut, a limit or `cancel`. Transport and
    /// HTTP errors before any answer are errors (`connection_unreachable`, `internal_address`,
    /// `reauth_required`, `expert_error`); what follows is an [`End`].
    pub async fn send(
        &self,
        card: &Card,
        message: &Value,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<End, ToolError> {
        let deadline = tokio::time::Instant::now() + MAX_TIME;
        self.guard(&card.service_url).await?;
        let method = if card.streaming { "SendStreamingMessage" } else { "SendMessage" };
        let id = uuid::Uuid::now_v7().to_string();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"message": message}});
        let accept = if card.streaming { "text/event-stream" } else { "application/json" };
        let req = self.authed(
            self.http
                .post(card.service_url.clone())
                .header("A2A-Version", PROTOCOL_VERSION)
                .header(reqwest::header::ACCEPT, accept)
                .json(&body),
        );
        let resp = tokio::select! {
            () = cancel.cancelled() => return Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled")),
            r = tokio::time::timeout_at(deadline, req.send()) => match r {
                Err(_) => return Ok(End::Incomplete {
                    progress: Progress::default(),
                    reason: "time_limit",
                    message: format!("no answer within {} s", MAX_TIME.as_secs()),
                }),
                Ok(r) => r.map_err(|e| transport(&e, "sending to the expert"))?,
            },
        };
        let status = resp.status();
        if matches!(status.as_u16(), 401 | 403) {
            return Err(ToolError::new(
                ErrorCode::ReauthRequired,
                format!("the expert refused the connection's credential ({status})"),
            ));
        }
        if !status.is_success() {
            let text = read_capped(resp, 4096).await.unwrap_or_default();
            return Err(ToolError::new(
                ErrorCode::ExpertError,
                format!("the expert answered HTTP {status}: {}", cut(&String::from_utf8_lossy(&text), 1000)),
            )
            .with_details(json!({"status": status.as_u16()})));
        }
        let is_sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if is_sse { Ok(read_sse(resp, deadline, cancel).await) } else { Ok(read_json(resp, deadline, cancel).await) }
    }
}

/// The card's fields, checked (a JSON object with a JSON-RPC interface of A2A 1.x).
pub fn parse_card(json: Value, url: &Url) -> Result<Card, ToolError> {
    let bad = |m: String| ToolError::new(ErrorCode::ExpertError, format!("the agent card at {url} {m}"));
    if !json.is_object() {
        return Err(bad("is not a JSON object".into()));
    }
    let sha256 = crate::evidence::sha256_hex(mira_core::canonical::to_canonical_string(&json).as_bytes());
    let name: String =
        json.get("name").and_then(Value::as_str).unwrap_or("(unnamed expert)").chars().take(200).collect();
    let interfaces = json.get("supportedInterfaces").and_then(Value::as_array).cloned().unwrap_or_default();
    let iface = interfaces
        .iter()
        .find(|i| {
            i.get("protocolBinding").and_then(Value::as_str).is_some_and(|b| b.eq_ignore_ascii_case("JSONRPC"))
                && i.get("protocolVersion").and_then(Value::as_str).is_none_or(|v| v == "1" || v.starts_with("1."))
        })
        .ok_or_else(|| bad("offers no A2A 1.0 JSON-RPC interface (supportedInterfaces)".into()))?;
    let service = iface.get("url").and_then(Value::as_str).unwrap_or_default();
    let service_url = url.join(service).map_err(|e| bad(format!("names a bad interface URL: {e}")))?;
    if !matches!(service_url.scheme(), "http" | "https")
        || !service_url.username().is_empty()
        || service_url.password().is_some()
    {
        return Err(bad("names an interface URL that is not plain http(s)".into()));
    }
    let streaming = json.pointer("/capabilities/streaming").and_then(Value::as_bool).unwrap_or(false);
    Ok(Card { json, sha256, name, service_url, streaming })
}

/// Reads at most `cap` bytes of `resp`'s body.
async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("reading failed: {e}"))?;
        if out.len() + chunk.len() > cap {
            return Err(format!("larger than {cap} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn incomplete(progress: Progress, reason: &'static str, message: String) -> End {
    End::Incomplete { progress, reason, message }
}

/// Applies one JSON-RPC response; Some(end) when the exchange is over.
fn on_response(progress: &mut Progress, data: &Value) -> Option<End> {
    if let Some(err) = data.get("error") {
        let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = cut(err.get("message").and_then(Value::as_str).unwrap_or("(no message)"), 1000);
        return Some(End::RpcError { progress: std::mem::take(progress), code, message });
    }
    let Some(result) = data.get("result") else {
        return Some(incomplete(
            std::mem::take(progress),
            "bad_event",
            "the expert sent a JSON-RPC response with neither result nor error".into(),
        ));
    };
    progress.apply(result);
    if progress.bytes > MAX_ANSWER_BYTES {
        return Some(incomplete(
            std::mem::take(progress),
            "answer_too_large",
            format!("the answer grew past {MAX_ANSWER_BYTES} bytes"),
        ));
    }
    if progress.state.is_some_and(TaskState::is_final) {
        return Some(End::Final(std::mem::take(progress)));
    }
    None
}

async fn read_json(
    resp: reqwest::Response,
    deadline: tokio::time::Instant,
    cancel: &tokio_util::sync::CancellationToken,
) -> End {
    let body = tokio::select! {
        () = cancel.cancelled() => return incomplete(Progress::default(), "cancelled", "the call was cancelled".into()),
        r = tokio::time::timeout_at(deadline, read_capped(resp, MAX_BODY_BYTES)) => r,
    };
    let body = match body {
        Err(_) => {
            return incomplete(Progress::default(), "time_limit", format!("no answer within {} s", MAX_TIME.as_secs()));
        }
        Ok(Err(m)) => return incomplete(Progress::default(), "stream_closed", format!("the answer was cut: {m}")),
        Ok(Ok(b)) => b,
    };
    let Ok(data) = serde_json::from_slice::<Value>(&body) else {
        return incomplete(Progress::default(), "bad_event", "the expert's answer is not JSON".into());
    };
    let mut progress = Progress::default();
    on_response(&mut progress, &data).unwrap_or_else(|| {
        incomplete(
            progress,
            "stream_closed",
            "the expert answered without a final task state (the task is still running)".into(),
        )
    })
}

/// Reads an SSE stream of JSON-RPC responses until a final task state.
async fn read_sse(
    resp: reqwest::Response,
    deadline: tokio::time::Instant,
    cancel: &tokio_util::sync::CancellationToken,
) -> End {
    let mut stream = resp.bytes_stream();
    let mut progress = Progress::default();
    let mut line: Vec<u8> = Vec::new();
    let mut data = String::new();
    loop {
        let chunk = tokio::select! {
            () = cancel.cancelled() => return incomplete(progress, "cancelled", "the call was cancelled".into()),
            c = tokio::time::timeout_at(deadline, stream.next()) => c,
        };
        let chunk = match chunk {
            Err(_) => {
                return incomplete(
                    progress,
                    "time_limit",
                    format!("no final task state within {} s", MAX_TIME.as_secs()),
                );
            }
            Ok(None) => {
                return incomplete(
                    progress,
                    "stream_closed",
                    "the expert closed the stream before a final task state".into(),
                );
            }
            Ok(Some(Err(e))) => {
                return incomplete(
                    progress,
                    "stream_closed",
                    format!("the stream was cut before a final task state: {e}"),
                );
            }
            Ok(Some(Ok(c))) => c,
        };
        for &b in chunk.iter() {
            if b != b'\n' {
                line.push(b);
                if line.len() > MAX_LINE_BYTES {
                    return incomplete(
                        progress,
                        "line_too_long",
                        format!("an SSE line exceeded {MAX_LINE_BYTES} bytes"),
                    );
                }
                continue;
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            line.clear();
            if text.is_empty() {
                // The end of one event.
                if data.is_empty() {
                    continue;
                }
                let event = std::mem::take(&mut data);
                let Ok(json) = serde_json::from_str::<Value>(&event) else {
                    return incomplete(progress, "bad_event", "the expert sent an event that is not JSON".into());
                };
                if let Some(end) = on_response(&mut progress, &json) {
                    return end;
                }
                if progress.events >= MAX_EVENTS {
                    return incomplete(progress, "too_many_events", format!("more than {MAX_EVENTS} events"));
                }
            } else if let Some(rest) = text.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                if data.len() > MAX_LINE_BYTES {
                    return incomplete(
                        progress,
                        "line_too_long",
                        format!("an SSE event exceeded {MAX_LINE_BYTES} bytes"),
                    );
                }
            }
            // `event:`, `id:`, `retry:` and comments carry nothing this client needs: an
            // `event: error` has a JSON-RPC error as its data.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Artifact ids are cut like task ids and, with each artifact's overhead, count towards
    /// the answer's size: many empty artifacts with long ids exceed it.
    #[test]
    fn artifacts_count_their_ids_and_their_number() {
        let mut p = Progress::default();
        let long = "x".repeat(10_000);
        p.apply(&serde_json::json!({"artifactUpdate": {"artifact": {"artifactId": long, "parts": [{"text": "a"}]}}}));
        p.apply(&serde_json::json!({"artifactUpdate": {"append": true, "artifact": {"artifactId": long, "parts": [{"text": "b"}]}}}));
        assert_eq!(p.artifacts.len(), 1);
        assert_eq!(p.artifacts[0].0.len(), 200);
        assert_eq!(p.answer(), "ab");
        let many: Vec<serde_json::Value> =
            (0..5_000).map(|i| serde_json::json!({"artifactId": format!("a{i}"), "parts": []})).collect();
        p.apply(&serde_json::json!({"task": {"id": "t", "artifacts": many}}));
        assert_eq!(p.artifacts.len(), 5_001);
        assert!(p.bytes > MAX_ANSWER_BYTES, "5,000 empty artifacts hold {} bytes", p.bytes);
    }

    #[tokio::test]
    async fn public_only_refuses_internal_addresses_at_each_request() {
        let client = Client::new(AddressRule::PublicOnly, Auth::None).unwrap();
        for url in ["http://127.0.0.1:9/.well-known/agent-card.json", "http://localhost:9/card.json"] {
            let e = client.card(&Url::parse(url).unwrap()).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InternalAddress, "{url}: {e}");
        }
        // The same URL under the admin rule is tried (and finds nothing listening).
        let any = Client::new(AddressRule::Any, Auth::None).unwrap();
        let e = any.card(&Url::parse("http://127.0.0.1:9/card.json").unwrap()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ConnectionUnreachable, "{e}");
    }

    #[test]
    fn card_urls_are_canonical() {
        assert_eq!(card_url("http://h:1").unwrap().as_str(), "http://h:1/.well-known/agent-card.json");
        assert_eq!(card_url("https://h/x/").unwrap().as_str(), "https://h/x/.well-known/agent-card.json");
        assert_eq!(card_url("https://h/card.json#f").unwrap().as_str(), "https://h/card.json");
        assert!(card_url("ftp://h/").is_err());
        assert!(card_url("http://u:p@h/").is_err());
    }

    #[test]
    fn progress_assembles_streamed_artifacts() {
        let mut p = Progress::default();
        p.apply(&json!({"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_SUBMITTED"}}}));
        p.apply(
            &json!({"artifactUpdate": {"taskId": "t1", "artifact": {"artifactId": "a", "parts": [{"text": "Hel"}]}}}),
        );
        p.apply(&json!({"artifactUpdate": {"taskId": "t1", "append": true, "artifact": {"artifactId": "a", "parts": [{"text": "lo"}]}}}));
        assert_eq!(p.answer(), "Hello");
        assert!(!p.state.unwrap().is_final());
        p.apply(&json!({"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_COMPLETED"}}}));
        assert_eq!(p.state, Some(TaskState::Completed));
        assert_eq!(p.task_id.as_deref(), Some("t1"));
    }

    #[test]
    fn cards_need_a_jsonrpc_interface() {
        let url = Url::parse("http://h/.well-known/agent-card.json").unwrap();
        let ok = json!({"name": "E", "supportedInterfaces": [{"url": "http://h/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}], "capabilities": {"streaming": true}});
        let card = parse_card(ok.clone(), &url).unwrap();
        assert!(card.streaming);
        assert_eq!(card.service_url.as_str(), "http://h/");
        // Key order does not change the hash (RFC 8785).
        let reordered: Value = serde_json::from_str(&serde_json::to_string(&json!({"capabilities": {"streaming": true}, "supportedInterfaces": ok["supportedInterfaces"], "name": "E"})).unwrap()).unwrap();
        assert_eq!(parse_card(reordered, &url).unwrap().sha256, card.sha256);
        assert!(
            parse_card(json!({"name": "E", "supportedInterfaces": [{"url": "/", "protocolBinding": "GRPC"}]}), &url)
                .is_err()
        );
    }
}
