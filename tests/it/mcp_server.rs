#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The runtime as an MCP server (`/mcp`, `mira mcp-stdio`), driven by the official Python
//! `mcp` SDK (tests/mcp/facade_client.py, installed by `scripts/setup-mcp.sh`): list, a read
//! call with its evidence, an edit approved through elicitation, declined there, approved in
//! the API while the client waits, a cancelled call, list_changed when an MCP server of the
//! runtime's loses its connection, the stdio bridge, and the session's ownership.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::{Backend, Options, TestApp, spawn, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

fn python() -> String {
    std::env::var("MIRA_MCP_PYTHON").expect("MIRA_MCP_PYTHON is not set: run `eval \"$(scripts/setup-mcp.sh)\"` first")
}

fn script(name: &str) -> String {
    format!("{}/tests/mcp/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The Python client running one scenario, its stdout read line by line.
struct PyClient {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PyClient {
    fn start(token: &str, url: &str, scenario: &str, args: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg(script("facade_client.py"))
            .arg(url)
            .arg(scenario)
            .args(args)
            .env("MIRA_TOKEN", token)
            .env("MIRA_BIN", env!("CARGO_BIN_EXE_mira"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next step the client printed (60 s at most).
    async fn step(&mut self, name: &str) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no `{name}` step within 60 s"))
            .expect("stdout")
            .unwrap_or_else(|| panic!("the client exited before `{name}`"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_eq!(v["step"], name, "{v}");
        v
    }

    /// Starts a scenario and reads its first two steps: (client, `initialized`, `listed`).
    async fn listed(token: &str, url: &str, scenario: &str, args: &[&str]) -> (Self, Value, Value) {
        let mut c = Self::start(token, url, scenario, args);
        let init = c.step("initialized").await;
        let listed = c.step("listed").await;
        (c, init, listed)
    }

    async fn finish(mut self) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.expect("exits").unwrap();
        assert!(status.success(), "the client failed: {status}");
    }
}

fn mcp_url(t: &TestApp) -> String {
    format!("{}/mcp", t.base)
}

async fn user_with_file(t: &TestApp, name: &str, file: &str, content: &str) -> String {
    std::fs::write(t.workspace.join(file), content).unwrap();
    t.user(name).await
}

async fn list_read_and_evidence(backend: Backend) {
    let t = spawn(backend).await;
    // The candidates stay the same while the client lists and calls (the code graph's first
    // index would add `codebase_explore`, and a new turn, in between).
    t.code_graph_ready().await;
    let token = user_with_file(&t, "ada", "hello.txt", "hello from the workspace\n").await;
    let (mut c, init, listed) = PyClient::listed(&token, &mcp_url(&t), "read", &["hello.txt"]).await;
    assert_eq!(init["protocol"], "2025-11-25", "{init}");

    let tools: Vec<&str> = listed["tools"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(tools.contains(&"read_open") && tools.contains(&"write_file"), "{tools:?}");
    let called = c.step("called").await;
    let result = &called["result"];
    assert_eq!(result["is_error"], false, "{called}");
    assert!(result["text"].as_str().unwrap().contains("hello from the workspace"), "{called}");
    let meta = &result["meta"];
    assert_eq!(meta["status"], "completed");
    assert!(!meta["evidence_ids"].as_array().unwrap().is_empty(), "{meta}");
    c.finish().await;

    // The session opened a run of the user's; its turn stored what the client listed, and
    // the invocation and evidence are the API's own.
    let runs = t.get("/v1/runs", &token).await.body;
    let run = &runs["runs"][0];
    assert!(run["title"].as_str().unwrap().starts_with("MCP: "), "{runs}");
    let inv = t.get(&format!("/v1/invocations/{}", meta["invocation_id"].as_str().unwrap()), &token).await.body;
    assert_eq!(inv["run_id"], run["id"]);
    assert_eq!(inv["tool_call_id"], meta["tool_call_id"]);
    assert_eq!(inv["input_hash"], meta["input_hash"]);
    assert_eq!(inv["evidence_ids"], meta["evidence_ids"]);
    let turn = t.get(&format!("/v1/turns/{}", inv["turn_id"].as_str().unwrap()), &token).await.body;
    let exposed: Vec<&str> =
        turn["exposure"]["tools"].as_array().unwrap().iter().map(|v| v["function_name"].as_str().unwrap()).collect();
    let listed_real: Vec<&str> = tools.iter().copied().filter(|n| *n != "mira_find_tools").collect();
    assert_eq!(exposed, listed_real, "tools/list is the stored exposure");
}

async fn edit_approved_through_elicitation(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    // A long content: the elicitation still shows the path (shorter fields come first, long
    // strings are cut one by one).
    let content = format!("{}\n", "lorem ipsum ".repeat(500));
    let (mut c, _, _) = PyClient::listed(&token, &mcp_url(&t), "edit-elicit", &["notes.txt", &content]).await;
    let called = c.step("called").await;
    c.finish().await;
    let result = &called["result"];
    assert_eq!(result["is_error"], false, "{called}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), content);
    assert!(called["elicitations"][0].as_str().unwrap().contains("path: \"notes.txt\""), "{called}");
    // The person was shown the exact call: tool, call id and input hash.
    let asked = called["elicitations"][0].as_str().unwrap();
    let meta = &result["meta"];
    for part in ["write_file", meta["tool_call_id"].as_str().unwrap(), meta["input_hash"].as_str().unwrap()] {
        assert!(asked.contains(part), "{part} missing from the elicitation: {asked}");
    }
    // With what the approval page shows (here the diff), whole.
    let preview = asked.split_once("preview (as the approval page shows it):\n").map(|(_, p)| p).unwrap_or_default();
    assert!(preview.contains("-old") && preview.contains("+lorem ipsum"), "the preview is shown: {asked}");
    let approval = t.get(&format!("/v1/approvals/{}", meta["approval_id"].as_str().unwrap()), &token).await.body;
    assert_eq!(approval["status"], "granted", "{approval}");
    assert_eq!(approval["invocation"]["input_hash"], meta["input_hash"]);
}

/// An input with bidirectional controls is shown escaped in the elicitation (`\u{202e}`, never
/// the raw character, which would reorder the lines the person reads), with a warning.
async fn elicitation_shows_bidi_controls_escaped(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let content = "x = 1 \u{202e}\u{2066}; import os #\u{2069}\u{2066}# ok\u{2069}\u{202c}\n";
    let (mut c, _, _) = PyClient::listed(&token, &mcp_url(&t), "edit-elicit", &["notes.txt", content]).await;
    let called = c.step("called").await;
    c.finish().await;
    let asked = called["elicitations"][0].as_str().unwrap();
    assert!(asked.contains("\\u{202e}") && asked.contains("\\u{2066}"), "escaped: {asked}");
    assert!(!asked.contains('\u{202e}') && !asked.contains('\u{2066}'), "no raw bidi control: {asked:?}");
    assert!(asked.contains("invisible or direction-changing characters, shown escaped"), "{asked}");
}

/// An input too large to show whole in an elicitation is not asked about there (a person
/// approves nothing of which a part was cut away): the call waits, and the page or the API
/// decides it.
async fn an_input_too_large_to_show_whole_is_not_elicited(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let content = format!("{}\n", "lorem ipsum ".repeat(4000));
    let (mut c, _, _) = PyClient::listed(&token, &mcp_url(&t), "edit-elicit", &["notes.txt", &content]).await;
    let a = pending_approval(&t, &token).await;
    let call = &a["invocation"];
    let r = t
        .post(
            &format!("/v1/approvals/{}/grant", a["id"].as_str().unwrap()),
            &token,
            json!({"tool_id": call["tool_id"], "tool_call_id": call["tool_call_id"], "input_hash": call["input_hash"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let called = c.step("called").await;
    c.finish().await;
    assert_eq!(called["result"]["is_error"], false, "{called}");
    assert!(called["elicitations"].as_array().unwrap().is_empty(), "nothing elicited: {called}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), content);
}

/// A session whose token lacks the `approve` scope (an agent's `plan` token) is never asked
/// to approve through elicitation, although its client offers it (and would accept): the call
/// stays `awaiting_approval` until a person decides it in the page or the API.
async fn a_plan_token_is_not_asked_to_approve(backend: Backend) {
    let t = spawn(backend).await;
    let person = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let r = t.post("/v1/tokens", &person, json!({"label": "agent", "scopes": ["plan"]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let agent = r.body["secret"].as_str().unwrap().to_owned();
    let (mut c, _, _) = PyClient::listed(&agent, &mcp_url(&t), "edit-elicit", &["notes.txt", "by the agent\n"]).await;
    let a = pending_approval(&t, &person).await;
    // Still pending a while later: nothing answered for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = a["id"].as_str().unwrap();
    let seen = t.get(&format!("/v1/approvals/{id}"), &person).await.body;
    assert_eq!(seen["status"], "pending", "{seen}");
    let inv =
        t.get(&format!("/v1/invocations/{}", seen["invocation"]["invocation_id"].as_str().unwrap()), &person).await;
    assert_eq!(inv.body["status"], "awaiting_approval", "{inv:?}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "old\n");
    let call = &a["invocation"];
    let r = t
        .post(
            &format!("/v1/approvals/{id}/grant"),
            &person,
            json!({"tool_id": call["tool_id"], "tool_call_id": call["tool_call_id"], "input_hash": call["input_hash"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let called = c.step("called").await;
    c.finish().await;
    assert_eq!(called["result"]["is_error"], false, "{called}");
    assert!(called["elicitations"].as_array().unwrap().is_empty(), "nothing elicited: {called}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "by the agent\n");
}

async fn edit_declined_through_elicitation(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let (mut c, _, _) = PyClient::listed(&token, &mcp_url(&t), "edit-decline", &["notes.txt", "new text\n"]).await;
    let called = c.step("called").await;
    c.finish().await;
    assert_eq!(called["result"]["is_error"], true, "{called}");
    assert_eq!(called["result"]["meta"]["status"], "denied", "{called}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "old\n");
}

/// Pending approvals of `token`'s user (10 s at most for one to appear).
async fn pending_approval(t: &TestApp, token: &str) -> Value {
    for _ in 0..200 {
        let list = t.get("/v1/approvals?status=pending", token).await.body;
        if let Some(a) = list["approvals"].as_array().and_then(|a| a.first()) {
            return a.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending approval appeared");
}

async fn edit_approved_in_the_api_while_the_client_waits(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let (mut c, _, _) =
        PyClient::listed(&token, &mcp_url(&t), "edit-wait", &["notes.txt", "granted elsewhere\n"]).await;
    let a = pending_approval(&t, &token).await;
    let call = &a["invocation"];
    assert_eq!(call["tool_id"], "write_file");
    // Long enough for a progress notification (every 5 s while it waits), with 3 s to spare
    // for the session's wait starting late or its notice going out late on a loaded machine.
    tokio::time::sleep(mira::mcp_server::session::PROGRESS_EVERY + Duration::from_secs(3)).await;
    let r = t
        .post(
            &format!("/v1/approvals/{}/grant", a["id"].as_str().unwrap()),
            &token,
            json!({"tool_id": call["tool_id"], "tool_call_id": call["tool_call_id"], "input_hash": call["input_hash"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let called = c.step("called").await;
    c.finish().await;
    assert_eq!(called["result"]["is_error"], false, "{called}");
    assert_eq!(called["result"]["meta"]["approval_id"], a["id"]);
    assert!(called["elicitations"].as_array().unwrap().is_empty());
    let progress = called["progress"].as_array().unwrap();
    let waiting = format!("waiting for approval {}", a["id"].as_str().unwrap());
    assert!(progress.iter().any(|m| m.as_str() == Some(waiting.as_str())), "{progress:?}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "granted elsewhere\n");
}

async fn a_cancelled_call_cancels_its_invocation(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let (mut c, _, _) = PyClient::listed(&token, &mcp_url(&t), "cancel", &["notes.txt", "never\n", "2"]).await;
    let a = pending_approval(&t, &token).await;
    c.step("cancelled").await;
    c.finish().await;
    let inv = a["invocation"]["invocation_id"].as_str().unwrap();
    let mut status = Value::Null;
    for _ in 0..100 {
        status = t.get(&format!("/v1/invocations/{inv}"), &token).await.body["status"].clone();
        if status == "cancelled" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "cancelled");
    let approval = t.get(&format!("/v1/approvals/{}", a["id"].as_str().unwrap()), &token).await.body;
    assert_ne!(approval["status"], "pending", "{approval}");
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "old\n");
}

async fn list_changed_when_an_mcp_server_is_lost(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("ada").await;
    let server = fault_server(&t, &token, "faulty").await;
    // A run whose first turn is ranked for the crash tool, so it is listed whatever the count.
    let run = t.run(&token).await;
    let url = format!("{}?run={run}&task=crash%20the%20server", mcp_url(&t));
    let crash_id = format!("mcp:{server}:tool:crash");
    let crash_name = mira::exposure::function_name(&crash_id);
    t.code_graph_ready().await;
    let (mut c, _, listed) = PyClient::listed(&token, &url, "list-changed", &["30", &crash_name]).await;
    assert!(listed["tools"].as_array().unwrap().iter().any(|n| n == crash_name.as_str()), "{listed}");

    // The server dies in the middle of a call of its crash tool (approved in the API).
    let (turn, _) = t.turn(&token, &run, "crash the server").await;
    let r = t.call(&token, &run, &turn, &crash_id, "crash-1", json!({})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    t.post(
        &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
        &token,
        json!({"tool_id": crash_id, "tool_call_id": "crash-1", "input_hash": r.body["input_hash"]}),
    )
    .await;
    // Each notifications/tools/list_changed makes the client list again, until the lost
    // server's tools are gone (the client gives up after 30 s without).
    loop {
        let relisted = c.step("relisted").await;
        if !relisted["tools"].as_array().unwrap().iter().any(|n| n == crash_name.as_str()) {
            break;
        }
    }
    c.finish().await;
}

/// Installs `tests/mcp/fault_server.py` (13 tools) for `token`'s user with agent access and
/// waits until it is connected; returns its id.
async fn fault_server(t: &TestApp, token: &str, name: &str) -> String {
    let r = t
        .post(
            "/v1/mcp/servers",
            token,
            json!({"name": name, "transport": {"stdio": {"command": python(), "args": [script("fault_server.py")]}},
                   "default_agent_access": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    for _ in 0..400 {
        let v = t.get(&format!("/v1/mcp/servers/{id}"), token).await.body;
        if v["connection"]["state"] == "connected" && v["connection"]["discovered_at"].is_string() {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} did not connect");
}

async fn find_tools_reranks_a_ranked_exposure(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("ada").await;
    let one = fault_server(&t, &token, "faulty-one").await;
    fault_server(&t, &token, "faulty-two").await;
    t.code_graph_ready().await;
    let (mut c, _, listed) = PyClient::listed(&token, &mcp_url(&t), "find", &["echo the text back"]).await;
    // More than 20 candidates: the ranked 20 and the façade's own search tool.
    let tools = listed["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 21, "{listed}");
    assert!(tools.iter().any(|n| n == "mira_find_tools"), "{listed}");
    let found = c.step("found").await;
    assert_eq!(found["result"]["is_error"], false, "{found}");
    let relisted = c.step("relisted").await;
    c.finish().await;
    assert_eq!(relisted["changed"], true, "no notifications/tools/list_changed: {relisted}");
    let echo = mira::exposure::function_name(&format!("mcp:{one}:tool:echo"));
    assert!(relisted["tools"].as_array().unwrap().iter().any(|n| n == echo.as_str()), "{relisted}");
    // The turn ranked for the task is stored like any other.
    let turn_id = found["result"]["structured"]["turn_id"].as_str().unwrap();
    let turn = t.get(&format!("/v1/turns/{turn_id}"), &token).await.body;
    assert_eq!(turn["task"], "echo the text back");
    assert_ne!(turn["exposure"]["strategy"], "all", "{turn}");
}

async fn the_stdio_bridge_carries_a_session(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "hello.txt", "through the bridge\n").await;
    let (mut c, _, listed) = PyClient::listed(&token, &t.base, "stdio", &["hello.txt"]).await;
    assert!(listed["tools"].as_array().unwrap().iter().any(|n| n == "read_open"), "{listed}");
    let called = c.step("called").await;
    c.finish().await;
    assert_eq!(called["result"]["is_error"], false, "{called}");
    assert!(called["result"]["text"].as_str().unwrap().contains("through the bridge"), "{called}");
}

/// The bridge exits once its client closes stdin (the MCP stdio shutdown), even after a
/// session was opened.
async fn the_stdio_bridge_exits_when_stdin_closes(backend: Backend) {
    use tokio::io::AsyncWriteExt;
    let t = spawn(backend).await;
    let token = t.user("ada").await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["mcp-stdio", "--server", &t.base])
        .env("MIRA_TOKEN", &token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin.write_all(format!("{}\n", initialize()).as_bytes()).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
    assert!(answer.contains("2025-11-25"), "{answer}");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the bridge exits within 10 s of stdin closing")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// One JSON-RPC message posted to `/mcp`: (HTTP status, session id, the answer's JSON-RPC
/// message, from a JSON or an SSE body).
async fn rpc(
    t: &TestApp,
    token: Option<&str>,
    session: Option<&str>,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    let mut req = t
        .client
        .post(mcp_url(t))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .json(&body);
    if let Some(tok) = token {
        req = req.bearer_auth(tok);
    }
    if let Some(s) = session {
        req = req.header("mcp-session-id", s).header("mcp-protocol-version", "2025-11-25");
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let session = resp.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    let message = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id").is_some())
            .unwrap_or(Value::String(text.clone()))
    });
    (status, session, message)
}

/// Sends `tools/call` of `write_file` (`notes.txt` ← "new") with JSON-RPC id `id` in
/// `session`, on a task of its own (the call waits for its approval): the answer's text.
fn spawn_write_call(t: &TestApp, token: &str, session: &str, id: u64) -> tokio::task::JoinHandle<String> {
    let req = t
        .client
        .post(mcp_url(t))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .bearer_auth(token)
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": "notes.txt", "content": "new\n"}}}));
    tokio::spawn(async move { req.send().await.unwrap().text().await.unwrap_or_default() })
}

/// Two identical calls sent at once wait on one invocation, and a session that ends (the
/// stdio bridge sends DELETE when its IDE restarts it) leaves its waiting calls as they are:
/// rmcp cancels every request of a session that ends, and only a client's
/// `notifications/cancelled` may cancel an invocation.
async fn a_session_that_ends_leaves_its_waiting_calls(backend: Backend) {
    let t = spawn(backend).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let (_, session, init) = rpc(&t, Some(&token), None, initialize()).await;
    let session = session.expect("a session id");
    let run = init["result"]["_meta"]["mira/run"]["run_id"].as_str().expect("the run").to_owned();
    rpc(&t, Some(&token), Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let calls: Vec<_> = (10..12).map(|id| spawn_write_call(&t, &token, &session, id)).collect();
    let approval = pending_approval(&t, &token).await;
    // Both calls are in (a second freeze would be a few milliseconds behind the first).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listed = t.get(&format!("/v1/runs/{run}/invocations"), &token).await.body;
    let invocations = listed["invocations"].as_array().cloned().unwrap_or_default();
    assert_eq!(invocations.len(), 1, "identical calls froze one invocation: {listed}");
    let closed = t
        .client
        .delete(mcp_url(&t))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    for call in calls {
        let _ = tokio::time::timeout(Duration::from_secs(15), call).await;
    }
    // rmcp gives a closed session's handlers up to 5 s to answer before cancelling them, and
    // a cancel is written at once: past that, the call is still awaiting its approval.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let inv = approval["invocation"]["invocation_id"].as_str().unwrap();
    let row = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
    assert_eq!(row["status"], "awaiting_approval", "{row}");
    let a = t.get(&format!("/v1/approvals/{}", approval["id"].as_str().unwrap()), &token).await.body;
    assert_eq!(a["status"], "pending", "{a}");
}

/// A user whose stream places are all held — here the one place, by a call waiting for its
/// approval — can still cancel it: a notification (like an answer to an elicitation) opens
/// no stream and takes no place, while another request is refused 429 `too_many_streams`.
async fn a_user_at_the_stream_cap_can_still_cancel(backend: Backend) {
    let mut options = Options::default();
    options.runtime.http.streams_per_user = 1;
    let t = spawn_with(backend, options).await;
    let token = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let (_, session, _) = rpc(&t, Some(&token), None, initialize()).await;
    let session = session.expect("a session id");
    rpc(&t, Some(&token), Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let call = spawn_write_call(&t, &token, &session, 10);
    let approval = pending_approval(&t, &token).await;
    let (status, _, refused) =
        rpc(&t, Some(&token), Some(&session), json!({"jsonrpc": "2.0", "id": 11, "method": "tools/list"})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["error"]["code"], "too_many_streams", "{refused}");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 10}});
    let (status, _, body) = rpc(&t, Some(&token), Some(&session), cancel).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let inv = approval["invocation"]["invocation_id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
        if row["status"] == "cancelled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cancel never reached the call: {row}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), call).await;
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "old\n");
}

/// An MCP stream — here a call waiting for its approval — ends once its token is revoked, as
/// the API's streams do: an `error` event `unauthorized`, then the end of the body; the
/// session's token opens nothing more.
async fn a_stream_ends_when_its_token_is_revoked(backend: Backend) {
    let t = spawn(backend).await;
    let ada = user_with_file(&t, "ada", "notes.txt", "old\n").await;
    let c = t.post("/v1/tokens", &ada, json!({"label": "ide"})).await;
    assert_eq!(c.status, StatusCode::CREATED, "{c:?}");
    let (id, token) = (c.body["id"].as_str().unwrap().to_owned(), c.body["secret"].as_str().unwrap().to_owned());
    let (_, session, _) = rpc(&t, Some(&token), None, initialize()).await;
    let session = session.expect("a session id");
    rpc(&t, Some(&token), Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let call = spawn_write_call(&t, &token, &session, 10);
    pending_approval(&t, &ada).await;
    let r = t.post(&format!("/v1/tokens/{id}/revoke"), &ada, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let text = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the stream of a revoked token was still open 10 s later")
        .unwrap();
    assert!(text.contains("event: error") && text.contains("\"unauthorized\""), "{text}");
    let (status, _, _) =
        rpc(&t, Some(&token), Some(&session), json!({"jsonrpc": "2.0", "id": 11, "method": "tools/list"})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(std::fs::read_to_string(t.workspace.join("notes.txt")).unwrap(), "old\n");
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
}

async fn sessions_belong_to_their_user(backend: Backend) {
    let t = spawn(backend).await;
    let ada = t.user("ada").await;
    let bob = t.user("bob").await;
    // No token: the API's 401.
    let (status, _, body) = rpc(&t, None, None, initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    let (status, _, _) = rpc(&t, Some("not-a-token"), None, initialize()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, session, init) = rpc(&t, Some(&ada), None, initialize()).await;
    assert_eq!(status, StatusCode::OK, "{init}");
    let session = session.expect("a session id");
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    rpc(&t, Some(&ada), Some(&session), initialized).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (_, _, mine) = rpc(&t, Some(&ada), Some(&session), list.clone()).await;
    assert!(mine["result"]["tools"].as_array().is_some_and(|a| !a.is_empty()), "{mine}");
    // Bob holding Ada's session id reaches nothing of hers: not her list, not a call, not an
    // answer to an elicitation she was sent, not a notification, not her stream, not its
    // closing — each is the 404 of a session that does not exist, before rmcp sees it.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "read_open", "arguments": {"path": "x"}}});
    let answer = json!({"jsonrpc": "2.0", "id": 0, "result": {"action": "accept", "content": {"approve": true}}});
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}});
    for message in [list.clone(), call, answer, cancel] {
        let (status, _, theirs) = rpc(&t, Some(&bob), Some(&session), message.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{message}: {theirs}");
        assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
        assert!(theirs.get("result").is_none(), "{theirs}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = t
            .client
            .request(method.clone(), mcp_url(&t))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .bearer_auth(&bob)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{method}");
    }
    // Her session still serves her.
    let (_, _, mine) = rpc(&t, Some(&ada), Some(&session), list).await;
    assert!(mine["result"]["tools"].as_array().is_some_and(|a| !a.is_empty()), "{mine}");

    // With a token: a page in a browser (a request carrying Origin) is refused, and so is a
    // Host that is not one of --mcp-allowed-hosts (DNS rebinding); a loopback name is served.
    let port = t.base.rsplit(':').next().unwrap();
    for (header, value, expected) in [
        ("origin", "http://evil.example".to_owned(), Some(StatusCode::FORBIDDEN)),
        ("host", format!("evil.example:{port}"), Some(StatusCode::FORBIDDEN)),
        ("host", format!("localhost:{port}"), None),
    ] {
        let resp = t
            .client
            .post(mcp_url(&t))
            .header(header, &value)
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(&ada)
            .json(&initialize())
            .send()
            .await
            .unwrap();
        match expected {
            Some(status) => assert_eq!(resp.status(), status, "{header}: {value}"),
            None => assert!(resp.status().is_success(), "{header}: {value}: {}", resp.status()),
        }
    }

    // Nor can Bob bind a session to Ada's run.
    let ada_run = t.run(&ada).await;
    let mut req = t
        .client
        .post(format!("{}?run={ada_run}", mcp_url(&t)))
        .header("accept", "application/json, text/event-stream")
        .json(&initialize());
    req = req.bearer_auth(&bob);
    let text = req.send().await.unwrap().text().await.unwrap();
    assert!(text.contains("run not found"), "{text}");
}

/// The scenarios of the official conformance suite that apply to a server of its own tools:
/// the others call the reference server's fixture tools (`test_simple_text`…), resources,
/// prompts, logging or completions, which this server does not offer; and
/// `dns-rebinding-protection` is for servers without authentication (its raw requests carry
/// no token, so every one is refused 401 here): [`sessions_belong_to_their_user`] checks the
/// Host rule with a token.
const CONFORMANCE_SCENARIOS: &[&str] = &["server-initialize", "ping", "tools-list", "server-sse-multiple-streams"];

async fn the_official_conformance_suite_passes(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("ada").await;
    let suite = std::env::var("MIRA_MCP_CONFORMANCE")
        .expect("MIRA_MCP_CONFORMANCE is not set: run `eval \"$(scripts/setup-mcp.sh)\"` first");
    let results = tempfile::tempdir().unwrap();
    for scenario in CONFORMANCE_SCENARIOS {
        let out = Command::new("node")
            .arg("--import")
            .arg(script("conformance/register.mjs"))
            .arg(&suite)
            .args(["server", "--url", &mcp_url(&t), "--scenario", scenario])
            .env("MIRA_TOKEN", &token)
            .env("MIRA_ORIGIN", &t.base)
            .current_dir(results.path())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(120), out).await.expect("the suite finishes").unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains(" 0 failed"), "conformance scenario {scenario} failed:\n{text}");
    }
}

both_backends!(
    list_read_and_evidence,
    edit_approved_through_elicitation,
    elicitation_shows_bidi_controls_escaped,
    an_input_too_large_to_show_whole_is_not_elicited,
    a_plan_token_is_not_asked_to_approve,
    edit_declined_through_elicitation,
    edit_approved_in_the_api_while_the_client_waits,
    a_cancelled_call_cancels_its_invocation,
    a_session_that_ends_leaves_its_waiting_calls,
    a_user_at_the_stream_cap_can_still_cancel,
    a_stream_ends_when_its_token_is_revoked,
    list_changed_when_an_mcp_server_is_lost,
    find_tools_reranks_a_ranked_exposure,
    the_stdio_bridge_carries_a_session,
    the_stdio_bridge_exits_when_stdin_closes,
    sessions_belong_to_their_user,
    the_official_conformance_suite_passes,
);
