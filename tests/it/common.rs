//! Test harness: a real server on a free port over a real database — a fresh SQLite file,
//! or a fresh Postgres database on `TEST_DATABASE_URL` (default the local server) that is
//! dropped afterwards — with a temporary workspace and helpers for the HTTP API.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use mira::config::RuntimeConfig;
use mira::server::{Server, Settings};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates `<name>::sqlite` and `<name>::postgres` tests from `async fn <name>(Backend)`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() { super::$name($crate::common::Backend::Sqlite).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() { super::$name($crate::common::Backend::Postgres).await }
        }
    )*};
}

pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database for one test; Postgres databases are dropped on drop.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Backend, data_dir: &Path) -> TestDb {
        match backend {
            Backend::Sqlite => {
                TestDb { url: format!("sqlite://{}?mode=rwc", data_dir.join("mira.db").display()), pg_name: None }
            }
            Backend::Postgres => {
                let name = format!("mira_test_{}", uuid::Uuid::now_v7().simple());
                let admin = admin_url();
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&admin)
                    .await
                    .expect("TEST_DATABASE_URL reachable");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&pool)
                    .await
                    .expect("create test database");
                pool.close().await;
                let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b).to_owned();
                TestDb { url: format!("{base}/{name}"), pg_name: Some(name) }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            let admin = admin_url();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    if let Ok(pool) = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&admin).await {
                        let _ =
                            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                                .execute(&pool)
                                .await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}

/// A running server for one test.
pub struct TestApp {
    pub backend: Backend,
    pub base: String,
    pub client: reqwest::Client,
    pub admin_token: String,
    pub workspace: PathBuf,
    pub data_dir: PathBuf,
    pub server: Option<Server>,
    pub settings: Settings,
    _tmp: tempfile::TempDir,
    pub db: TestDb,
}

/// Options for [`spawn_with`].
pub struct Options {
    pub runtime: RuntimeConfig,
    pub body_limit: usize,
    /// The data dir inside the workspace (`<ws>/data`), as with `mira serve`'s defaults.
    pub data_in_workspace: bool,
}

impl Default for Options {
    fn default() -> Self {
        // Tests install their stdio MCP servers as ordinary users and point them at local
        // servers; the deployment defaults (admins only) have their own tests in tests/it/mcp.rs
        // and tests/it/web_search.rs.
        let mcp = mira::mcp::McpSettings { stdio_allow: vec!["*".into()], ..Default::default() };
        // Their sandbox may read the project's test servers (an operator's --sandbox-read).
        let sandbox = mira::sandbox::SandboxConfig {
            read_only: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")],
            ..Default::default()
        };
        Options {
            runtime: RuntimeConfig {
                execution_concurrency: 4,
                mcp,
                allow_internal_urls: true,
                sandbox,
                // The managed browser's tools stay out of other tests' exposures (they would
                // be nine more candidates wherever chromium is installed); tests/it/browser.rs
                // names the binary.
                browser: mira::tools::browser::BrowserSettings {
                    chromium: Some("/nonexistent/mira-tests-without-a-browser".into()),
                    ..Default::default()
                },
                ..RuntimeConfig::default()
            },
            body_limit: 1024 * 1024,
            data_in_workspace: false,
        }
    }
}

pub async fn spawn(backend: Backend) -> TestApp {
    spawn_with(backend, Options::default()).await
}

pub async fn spawn_with(backend: Backend, options: Options) -> TestApp {
    // The server runs inside this test binary: its PID namespaces' supervisor and init run
    // the built `mira` as their helper image, as they run the server's own binary in `mira`.
    mira::sandbox::set_pid_helper(env!("CARGO_BIN_EXE_mira").into());
    let tmp = tempfile::tempdir().expect("tempdir");
    let workspace = tmp.path().join("ws");
    let data_dir = if options.data_in_workspace { workspace.join("data") } else { tmp.path().join("data") };
    std::fs::create_dir_all(&workspace).expect("workspace");
    std::fs::create_dir_all(&data_dir).expect("data");
    let db = TestDb::new(backend, &data_dir).await;
    let settings = Settings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data_dir: data_dir.clone(),
        database_url: db.url.clone(),
        workspace: workspace.clone(),
        runtime: options.runtime,
        body_limit: options.body_limit,
        request_timeout: Duration::from_secs(30),
    };
    let server = Server::start(settings.clone()).await.expect("server starts");
    let token_file = server.admin_token_file.clone().expect("fresh store bootstraps an admin");
    let admin_token = std::fs::read_to_string(token_file).expect("token file").trim().to_owned();
    TestApp {
        backend,
        base: format!("http://{}", server.addr),
        client: mira::net::client_builder().build().expect("client"),
        admin_token,
        workspace: std::fs::canonicalize(&workspace).expect("canonical workspace"),
        data_dir,
        server: Some(server),
        settings,
        _tmp: tmp,
        db,
    }
}

/// A JSON response.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub body: Value,
}

impl Resp {
    /// The error code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl TestApp {
    pub fn app(&self) -> &mira::app::App {
        &self.server.as_ref().expect("running").app
    }

    pub async fn request(&self, method: reqwest::Method, path: &str, token: Option<&str>, body: Option<Value>) -> Resp {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Resp { status, body }
    }

    pub async fn get(&self, path: &str, token: &str) -> Resp {
        self.request(reqwest::Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Resp {
        self.request(reqwest::Method::POST, path, Some(token), Some(body)).await
    }

    /// Creates a user and returns its token.
    pub async fn user(&self, name: &str) -> String {
        let r = self.post("/v1/users", &self.admin_token, json!({"name": name})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body["token"].as_str().expect("token").to_owned()
    }

    /// Opens a run on the default workspace; returns its id.
    pub async fn run(&self, token: &str) -> String {
        let r = self.post("/v1/runs", token, json!({"title": "test"})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body["id"].as_str().expect("run id").to_owned()
    }

    /// Starts a turn; returns (turn id, exposure).
    pub async fn turn(&self, token: &str, run: &str, task: &str) -> (String, Value) {
        let r = self.post(&format!("/v1/runs/{run}/turns"), token, json!({"task": task})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        (r.body["turn_id"].as_str().expect("turn id").to_owned(), r.body["exposure"].clone())
    }

    /// Freezes a call.
    pub async fn call(&self, token: &str, run: &str, turn: &str, tool: &str, call_id: &str, input: Value) -> Resp {
        self.post(
            &format!("/v1/runs/{run}/invocations"),
            token,
            json!({"turn_id": turn, "tool_id": tool, "tool_call_id": call_id, "input": input}),
        )
        .await
    }

    /// Polls an invocation until it reaches a final status (60 s at most: on a loaded machine
    /// claiming and running even a quick call can take seconds).
    pub async fn wait_final(&self, token: &str, invocation: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.get(&format!("/v1/invocations/{invocation}"), token).await;
            let status = r.body["status"].as_str().unwrap_or("");
            if !matches!(status, "queued" | "running" | "awaiting_approval") {
                return r.body;
            }
            assert!(tokio::time::Instant::now() < deadline, "invocation {invocation} did not finish in 60 s: {r:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every event the run has stored so far (`last_event_id` of the run, read from its
    /// stream; 30 s at most), so a caller never waits out a window for events that do not come.
    pub async fn run_events(&self, token: &str, run: &str) -> Vec<(i64, String, Value)> {
        let r = self.get(&format!("/v1/runs/{run}"), token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let n = usize::try_from(r.body["last_event_id"].as_i64().expect("last_event_id")).unwrap();
        let resp = self.client.get(format!("{}/v1/runs/{run}/events", self.base)).bearer_auth(token).send().await;
        let events = read_sse(resp.expect("stream opens"), n, Duration::from_secs(30)).await;
        assert_eq!(events.len(), n, "the run's {n} stored events did not all arrive: {events:?}");
        events
    }

    /// Waits (10 s at most) until `codebase_explore` is available for the default workspace,
    /// so that candidate counts do not change between turns while its first index builds.
    pub async fn code_graph_ready(&self) {
        let app = self.app();
        let ctx = app.availability_context("x", None).await.expect("context");
        for _ in 0..400 {
            if mira::exposure::candidates(&app.registry, &ctx).iter().any(|e| e.spec().id == "codebase_explore") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the code graph of the test workspace never became ready");
    }

    /// Stops the server (graceful shutdown).
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// Starts a new server process on the same store and data dir.
    pub async fn restart(&mut self) {
        self.stop().await;
        let server = Server::start(self.settings.clone()).await.expect("server restarts");
        self.base = format!("http://{}", server.addr);
        self.server = Some(server);
    }
}

/// Reads SSE events from a response until `n` events arrived or `timeout` passed.
/// Returns (id, event, data) triples; comments are skipped.
pub async fn read_sse(resp: reqwest::Response, n: usize, timeout: Duration) -> Vec<(i64, String, Value)> {
    read_sse_until(resp, timeout, |events| events.len() >= n).await
}

/// Reads SSE events from a response (as [`read_sse`]) until `done` holds for the events read
/// so far or `timeout` passed.
pub async fn read_sse_until(
    resp: reqwest::Response,
    timeout: Duration,
    done: impl Fn(&[(i64, String, Value)]) -> bool,
) -> Vec<(i64, String, Value)> {
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while !done(&out) {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(c))) => c,
            _ => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some((id, event, data)) = next_sse_block(&mut buf) {
            if let Some(id) = id {
                out.push((id, event, data));
            }
        }
    }
    out
}

/// Takes the first complete SSE block (ending in a blank line) off `buf`, decoded. The buffer
/// holds bytes, not text: a chunk of the stream may end inside a multi-byte character, and
/// decoding chunk by chunk would turn its halves into two replacement characters.
pub fn take_sse_block(buf: &mut Vec<u8>) -> Option<String> {
    let end = buf.windows(2).position(|w| w == b"\n\n")?;
    let block: Vec<u8> = buf.drain(..end + 2).collect();
    Some(String::from_utf8(block).expect("an SSE block is UTF-8"))
}

/// Takes the first complete SSE block off `buf` ([`take_sse_block`]) as (id, event, data);
/// data that is JSON is parsed, other data is a JSON string. None until a block is complete.
pub fn next_sse_block(buf: &mut Vec<u8>) -> Option<(Option<i64>, String, Value)> {
    let block = take_sse_block(buf)?;
    let (mut id, mut event, mut data) = (None, String::new(), String::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
    Some((id, event, data))
}

/// A dynamic tool for tests: counts its executions, optionally requires approval, can block.
pub struct TestTool {
    pub spec: mira::registry::ToolSpec,
    pub runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub delay: Duration,
    /// When set, each execution waits for one permit of it (or a cancel) before it answers:
    /// a hold the test releases, where a delay would be a guess at how slow the machine is.
    pub gate: Option<std::sync::Arc<tokio::sync::Semaphore>>,
}

impl TestTool {
    pub fn new(id: &str, description: &str, requires_approval: bool) -> TestTool {
        TestTool {
            spec: mira::registry::ToolSpec {
                id: id.to_owned(),
                kind: mira::registry::ToolKind::Dynamic,
                domain: "test".to_owned(),
                title: id.to_owned(),
                description: description.to_owned(),
                input_schema: json!({"type": "object", "properties": {"value": {"type": "string", "description": "any text"}}}),
                requires_approval,
                capability: None,
                replacement: None,
                owner: None,
            },
            runs: Default::default(),
            delay: Duration::ZERO,
            gate: None,
        }
    }

    /// This tool with a [`TestTool::gate`]; returns the gate (no permits yet) with it.
    pub fn gated(mut self) -> (Self, std::sync::Arc<tokio::sync::Semaphore>) {
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        self.gate = Some(gate.clone());
        (self, gate)
    }

    pub fn kind(mut self, kind: mira::registry::ToolKind) -> Self {
        self.spec.kind = kind;
        self
    }
}

#[async_trait::async_trait]
impl mira::registry::Tool for TestTool {
    fn spec(&self) -> &mira::registry::ToolSpec {
        &self.spec
    }

    async fn execute(
        &self,
        input: &Value,
        ctx: &mira::registry::ExecContext,
    ) -> Result<mira::registry::ToolOutput, mira::registry::ToolError> {
        let n = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if let Some(gate) = &self.gate {
            tokio::select! {
                permit = gate.acquire() => permit.expect("the gate stays open").forget(),
                () = ctx.cancel.cancelled() => return Err(mira::registry::ToolError::new(mira::error::ErrorCode::Cancelled, "cancelled")),
            }
        }
        if !self.delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(self.delay) => {}
                () = ctx.cancel.cancelled() => return Err(mira::registry::ToolError::new(mira::error::ErrorCode::Cancelled, "cancelled")),
            }
        }
        Ok(mira::registry::ToolOutput {
            output: json!({"echo": input, "execution": n, "given_workspace": ctx.workspace.is_some()}),
            evidence: vec![mira::evidence::EvidenceDraft::of_text(
                "test_echo",
                json!({"tool": self.spec.id}),
                &input.to_string(),
            )],
        })
    }
}

/// The TCP ports on which process `root` or any process below it listens (`/proc/<pid>/fd`
/// socket inodes matched against the `LISTEN` rows of `/proc/net/tcp` and `tcp6`).
pub fn listening_ports_of_tree(root: u32) -> Vec<u16> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        parents.push((pid, ppid));
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let mut inodes = std::collections::HashSet::new();
    for pid in &tree {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) =
                    target.to_str().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
            {
                inodes.insert(inode);
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && inodes.contains(cols[9]) {
                let port = cols[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
                ports.extend(port);
            }
        }
    }
    ports
}

/// Reads a Server-Sent Event stream until it closes or `within` passed: its events (keep-alive
/// comments left out) as (type, data), and whether it closed cleanly.
pub async fn until_closed(resp: reqwest::Response, within: std::time::Duration) -> (Vec<(String, Value)>, bool) {
    use futures::StreamExt;
    let mut body = resp.bytes_stream();
    let (mut buf, mut events) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(chunk))) => {
                buf.extend_from_slice(&chunk);
                while let Some((_, event, data)) = next_sse_block(&mut buf) {
                    if !event.is_empty() {
                        events.push((event, data));
                    }
                }
            }
            Ok(None) => return (events, true),
            Ok(Some(Err(e))) => panic!("the stream broke instead of ending: {e} (after {events:?})"),
            Err(_) => return (events, false),
        }
    }
}
