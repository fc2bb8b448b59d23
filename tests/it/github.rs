#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The GitHub tools end to end over HTTP, against real mock GitHub servers started here:
//! - Prism (`@stoplight/prism-cli`) mocking GitHub's published OpenAPI description
//!   (`@octokit/openapi`, trimmed to the tools' operations by scripts/github-trim-openapi.mjs).
//!   Each test writes its own copy of the description where `GET /user` answers what the test
//!   needs (an `X-OAuth-Scopes` list, or only 401), as GitHub would for that token;
//! - `@octokit/fixtures-server` replaying the recorded real GitHub answers of
//!   `@octokit/fixtures` (get-content, search-issues), after one `GET /user` entry for the
//!   connection check (the recordings have none) made from the recordings' own headers.
//!
//! Checked: the tools are `no_connection` without a connection; a classic token without the
//! `repo` scope leaves the write tools `scope_missing` (naming `repo`) and the reads available;
//! a read's evidence is marked `third_party`; a merge bound to an old head SHA fails with
//! `head_changed` and one bound to the current head merges; a repository outside the allowlist
//! is refused at freeze time; a refused token is `reauth_required`; a server that is down is
//! `connection_unreachable`; a used-up rate limit is `rate_limited` until its reset.
//!
//! A scripted GitHub (a small HTTP server started by the test, whose answers the test changes
//! between freezing a call and granting it, which Prism cannot) checks that a merge is bound to
//! its base branch (`base_changed` when retargeted or rewritten, merged when it only advanced)
//! and that an approval is bound to the connection's settings and credential
//! (`connection_changed`, nothing sent). Against it and a blob server, the connection's address
//! rule applies when a client connects (a name resolving to loopback is refused under
//! `PublicOnly`), and a job log's signed download URL never reaches an output or an error.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Backend, TestApp, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The head SHA of the pull request example of GitHub's OpenAPI description (Prism answers it).
const EXAMPLE_HEAD_SHA: &str = "6dcb09b5b57875f334f61aebed695e2e4193db5e";

/// The token of the recorded fixtures.
const FIXTURES_TOKEN: &str = "0000000000000000000000000000000000000001";

fn env_path(var: &str) -> PathBuf {
    PathBuf::from(
        std::env::var(var)
            .unwrap_or_else(|_| panic!("{var} is not set: run `eval \"$(scripts/setup-github.sh)\"` first")),
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A base URL nothing listens on.
fn closed_port() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// A mock server process, killed on drop.
struct Mock {
    base: String,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

/// Waits until `url` answers anything (30 s at most).
async fn wait_up(url: &str, child: &mut tokio::process::Child) {
    let client = mira::net::client_builder().build().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the mock server exited early: {status}");
        }
        if client.get(url).header("accept", "application/json").send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the mock server at {url} did not start within 30 s");
}

/// Prism on a copy of the trimmed description whose `GET /user` answers are changed by
/// `user`.
async fn prism(user: impl FnOnce(&mut Value)) -> Mock {
    prism_spec(|spec| user(&mut spec["paths"]["/user"]["get"]["responses"])).await
}

/// Prism on a copy of the trimmed description changed by `edit`.
///
/// The port comes from [`free_port`], which another test process may pick at the same moment:
/// its Prism would then answer on our port while ours fails to bind. So `/rate_limit` of our
/// copy answers a header naming this mock (`X-Mira-Mock`), and a port whose server answers
/// without it is given up for another.
async fn prism_spec(edit: impl FnOnce(&mut Value)) -> Mock {
    let spec_path = env_path("MIRA_GITHUB_OPENAPI_TRIMMED");
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    edit(&mut spec);
    let dir = tempfile::tempdir().unwrap();
    let client = mira::net::client_builder().build().unwrap();
    for attempt in 0..5 {
        let port = free_port();
        let marker = format!("{}-{port}-{attempt}", std::process::id());
        spec["paths"]["/rate_limit"]["get"]["responses"]["200"]["headers"]["X-Mira-Mock"] =
            json!({"schema": {"type": "string"}, "example": marker});
        let file = dir.path().join("github.json");
        std::fs::write(&file, serde_json::to_vec(&spec).unwrap()).unwrap();
        let mut child = tokio::process::Command::new(env_path("MIRA_GITHUB_PRISM"))
            .args(["mock", "-h", "127.0.0.1", "-p", &port.to_string()])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("prism starts");
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        // Up: ours answers with its marker. Another server answering, or ours exiting (the
        // port was taken), gives the port up.
        let ours = loop {
            assert!(start.elapsed() < Duration::from_secs(30), "Prism at {base} did not start within 30 s");
            if let Ok(Some(_)) = child.try_wait() {
                break false;
            }
            let answer = client.get(format!("{base}/rate_limit")).header("accept", "application/json").send().await;
            if let Ok(r) = answer {
                break r.headers().get("x-mira-mock").is_some_and(|v| v.as_bytes() == marker.as_bytes());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if ours {
            return Mock { base, _child: child, _dir: dir };
        }
        let _ = child.kill().await;
    }
    panic!("no free port for Prism after 5 attempts (each was answered by another mock)");
}

/// `GET /user` answers 200 with `X-OAuth-Scopes: scopes` (a classic token's scopes).
fn scopes(list: &'static str) -> impl FnOnce(&mut Value) {
    move |responses: &mut Value| {
        responses["200"]["headers"] = json!({
            "X-OAuth-Scopes": {"schema": {"type": "string"}, "example": list},
            "X-RateLimit-Remaining": {"schema": {"type": "integer"}, "example": 4999}
        });
    }
}

/// `GET /user` answers 200 with the rate limit used up until 2100-01-01.
fn exhausted(responses: &mut Value) {
    responses["200"]["headers"] = json!({
        "X-OAuth-Scopes": {"schema": {"type": "string"}, "example": "repo"},
        "X-RateLimit-Remaining": {"schema": {"type": "integer"}, "example": 0},
        "X-RateLimit-Reset": {"schema": {"type": "integer"}, "example": 4102444800u64}
    });
}

/// `GET /user` answers only 401 (a wrong or revoked token).
fn refused(responses: &mut Value) {
    let unauthorized = responses["401"].clone();
    *responses = json!({"401": unauthorized});
}

/// fixtures-server with one scenario `mira-<name>`: a `GET /user` entry (for the check),
/// then the recorded `scenario` of @octokit/fixtures. Returns the server and the scenario's
/// base URL.
async fn fixtures(scenario: &str) -> Mock {
    let recorded: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(env_path("MIRA_GITHUB_FIXTURES").join(scenario).join("normalized-fixture.json"))
            .unwrap(),
    )
    .unwrap();
    let first = &recorded[0];
    // The recordings have no GET /user; the check's is made from the first recording's
    // scope, request headers and response headers (its X-OAuth-Scopes included).
    let mut headers = first["headers"].clone();
    headers["content-type"] = json!("application/json; charset=utf-8");
    headers.as_object_mut().unwrap().remove("content-length");
    let user = json!({
        "scope": first["scope"],
        "method": "get",
        "path": "/user",
        "body": "",
        "status": 200,
        "reqheaders": {"accept": "application/vnd.github.v3+json", "authorization": format!("token {FIXTURES_TOKEN}"), "host": "api.github.com"},
        "response": {"login": "octokit-fixture-user-a", "id": 1000, "type": "User"},
        "headers": headers,
    });
    let mut all = vec![user];
    all.extend(recorded);
    let dir = tempfile::tempdir().unwrap();
    let name = format!("mira-{scenario}");
    std::fs::write(dir.path().join(format!("{name}.json")), serde_json::to_vec(&all).unwrap()).unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(env_path("MIRA_GITHUB_FIXTURES_SERVER"))
        .arg("--port")
        .arg(port.to_string())
        .arg("--log-level")
        .arg("error")
        .arg(format!("--fixtures={}/*.json", dir.path().display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fixtures-server starts");
    let server = format!("http://127.0.0.1:{port}");
    wait_up(&format!("{server}/ping"), &mut child).await;
    let r: Value = mira::net::client_builder()
        .build()
        .unwrap()
        .post(format!("{server}/fixtures"))
        .json(&json!({"scenario": name}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = r["url"].as_str().unwrap_or_else(|| panic!("no fixture url: {r}")).replace("localhost", "127.0.0.1");
    Mock { base: url, _child: child, _dir: dir }
}

/// Creates a GitHub connection for `token` (the caller's); returns its view.
async fn connect(t: &TestApp, token: &str, settings: Value, credential: Value) -> Value {
    let r = t
        .post(
            "/v1/connections",
            token,
            json!({"kind": "github", "name": "gh", "settings": settings, "credential": credential}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert!(!r.body.to_string().contains("ghp_"), "the credential leaked into the view: {}", r.body);
    r.body
}

async fn tool_state(t: &TestApp, token: &str, tool: &str) -> Value {
    let r = t.get(&format!("/v1/tools/{tool}"), token).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

fn reason(state: &Value) -> (&str, &str) {
    (state["state"].as_str().unwrap_or(""), state["reason"]["code"].as_str().unwrap_or(""))
}

/// A run and a turn of `token`.
async fn turn(t: &TestApp, token: &str) -> (String, String) {
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, "work on GitHub").await;
    (run, turn)
}

/// Freezes a call and, when it waits for approval, grants it; returns the final invocation.
async fn call(t: &TestApp, token: &str, tool: &str, call_id: &str, input: Value) -> Value {
    let (run, turn) = turn(t, token).await;
    let r = t.call(token, &run, &turn, tool, call_id, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let inv = r.body;
    if inv["status"] == "awaiting_approval" {
        return grant(t, token, &inv).await;
    }
    t.wait_final(token, inv["invocation_id"].as_str().unwrap()).await
}

/// Freezes a write, which must wait for approval; returns the invocation and its approval
/// (the frozen input and the preview the approver sees).
async fn freeze(t: &TestApp, token: &str, tool: &str, call_id: &str, input: Value) -> (Value, Value) {
    let (run, turn) = turn(t, token).await;
    let r = t.call(token, &run, &turn, tool, call_id, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let approval = t.get(&format!("/v1/approvals/{}", r.body["approval_id"].as_str().unwrap()), token).await;
    assert_eq!(approval.status, StatusCode::OK, "{approval:?}");
    (r.body, approval.body)
}

/// Grants a frozen call; returns the final invocation.
async fn grant(t: &TestApp, token: &str, inv: &Value) -> Value {
    let g = t
        .post(
            &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
            token,
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    t.wait_final(token, inv["invocation_id"].as_str().unwrap()).await
}

// ---- a scripted GitHub and a blob store --------------------------------------------------------

/// Base branch heads of the scripted pull request.
const BASE_1: &str = "1111111111111111111111111111111111111111";
const BASE_2: &str = "2222222222222222222222222222222222222222";
const BASE_3: &str = "3333333333333333333333333333333333333333";

/// The merge commit the scripted GitHub answers.
const MERGE_SHA: &str = "e5bd3914e2e596debea16f433f57875b5b90bcd6";

/// The token in the query of a signed log URL.
const SIGNATURE: &str = "SIGNEDxSECRETx2TUDfIg4fm36OJmfPy6km5QD5DLCO";

/// A job log's text as the blob store serves it.
const LOG: &str = "##[group]Run cargo test\ntest result: ok. 3 passed\n";

/// What the scripted GitHub answers now, changed by a test between calls.
struct Script {
    base: String,
    base_sha: String,
    /// The compare API's `status` between two base heads.
    compare: &'static str,
    /// Every request, as `METHOD /path`.
    seen: Vec<String>,
}

/// A GitHub server started by the test: `GET /user` (a classic token with `repo`), pull
/// request `octo/app#7` (head [`EXAMPLE_HEAD_SHA`], base from the script), the compare API and
/// the merge API; anything else 404.
struct Scripted {
    base: String,
    port: u16,
    script: Arc<Mutex<Script>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Scripted {
    async fn start(base: &str, base_sha: &str) -> Scripted {
        let script = Arc::new(Mutex::new(Script {
            base: base.into(),
            base_sha: base_sha.into(),
            compare: "ahead",
            seen: Vec::new(),
        }));
        let s = Arc::clone(&script);
        let app = axum::Router::new().fallback(move |method: axum::http::Method, uri: axum::http::Uri| {
            let s = Arc::clone(&s);
            async move { scripted_answer(&s, &method, uri.path()) }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Scripted { base: format!("http://127.0.0.1:{port}"), port, script, task }
    }

    fn set(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.script.lock().unwrap());
    }

    /// The requests seen so far, but the checks' `GET /user`.
    fn seen(&self) -> Vec<String> {
        self.script.lock().unwrap().seen.iter().filter(|r| *r != "GET /user").cloned().collect()
    }

    fn merges(&self) -> usize {
        self.seen().iter().filter(|r| r.starts_with("PUT ")).count()
    }
}

fn scripted_answer(s: &Mutex<Script>, method: &axum::http::Method, path: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut s = s.lock().unwrap();
    s.seen.push(format!("{method} {path}"));
    let ok = |v: Value| (StatusCode::OK, axum::Json(v)).into_response();
    match (method.as_str(), path) {
        ("GET", "/user") => {
            ([("x-oauth-scopes", "repo")], axum::Json(json!({"login": "scripted", "id": 1}))).into_response()
        }
        ("GET", "/repos/octo/app/pulls/7") => ok(json!({
            "number": 7, "title": "Feature", "state": "open", "merged": false,
            "head": {"ref": "feature", "sha": EXAMPLE_HEAD_SHA},
            "base": {"ref": s.base, "sha": s.base_sha},
        })),
        ("GET", p) if p.starts_with("/repos/octo/app/compare/") => ok(json!({"status": s.compare})),
        ("PUT", "/repos/octo/app/pulls/7/merge") => {
            ok(json!({"merged": true, "sha": MERGE_SHA, "message": "Pull Request successfully merged"}))
        }
        ("GET", "/repos/octo/app/issues/1") => {
            ok(json!({"number": 1, "title": "Bug", "state": "open", "body": "it breaks", "user": {"login": "octo"}}))
        }
        ("GET", "/repos/octo/app/issues/1/comments") => ok(json!([])),
        // A repository the token may not read (outside a fine-grained token's selection, an
        // organisation forbidding such tokens): GitHub's 403 for that resource only.
        ("GET", p) if p.starts_with("/repos/octo/locked/") => (
            StatusCode::FORBIDDEN,
            [("x-accepted-github-permissions", "issues=read")],
            axum::Json(json!({"message": "Resource not accessible by personal access token",
                              "documentation_url": "https://docs.github.com/rest/issues/issues#get-an-issue"})),
        )
            .into_response(),
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({"message": "Not Found"}))).into_response(),
    }
}

/// A blob store on loopback: answers [`LOG`] to the next `ok` connections, and closes every
/// later one at once (a failed download).
struct Blob {
    base: String,
    port: u16,
    ok: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Blob {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Blob {
    async fn start(ok: usize) -> Blob {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ok = Arc::new(AtomicUsize::new(ok));
        let connections = Arc::new(AtomicUsize::new(0));
        let (ok2, conns2) = (Arc::clone(&ok), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                conns2.fetch_add(1, Ordering::SeqCst);
                let serve = ok2.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
                tokio::spawn(async move {
                    if !serve {
                        return; // dropped: the connection closes before any answer
                    }
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{LOG}",
                        LOG.len()
                    );
                    let _ = sock.write_all(answer.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Blob { base: format!("http://127.0.0.1:{port}"), port, ok, connections, task }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

// ---- no connection --------------------------------------------------------------------------

async fn github_tools_need_a_connection(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    for tool in ["github_read", "github_read_issue", "github_merge_pull", "github_commit", "github_rerun"] {
        let state = tool_state(&t, &token, tool).await;
        assert_eq!(reason(&state), ("unavailable", "no_connection"), "{tool}: {state}");
    }
    let (run, turn) = turn(&t, &token).await;
    let r = t
        .call(&token, &run, &turn, "github_read_issue", "c1", json!({"repo": "octocat/hello-world", "number": 1}))
        .await;
    assert_ne!(r.status, StatusCode::CREATED, "a call without a connection was frozen: {r:?}");
    assert!(r.body.to_string().contains("no_connection"), "{r:?}");
}

// ---- scopes, evidence -------------------------------------------------------------------------

async fn github_classic_token_without_repo_scope(backend: Backend) {
    let mock = prism(scopes("read:user, gist")).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    let view = connect(&t, &token, json!({"base_url": mock.base}), json!({"token": "ghp_readonly"})).await;
    assert_eq!(view["account"], "octocat", "{view}");
    // Reads are available; every write says which scope is missing.
    for tool in ["github_read", "github_read_issue", "github_list_pulls", "github_read_run"] {
        let state = tool_state(&t, &token, tool).await;
        assert_eq!(state["state"], "available", "{tool}: {state}");
    }
    for tool in [
        "github_create_issue",
        "github_comment",
        "github_merge_pull",
        "github_commit",
        "github_rerun",
        "github_review_pull",
    ] {
        let state = tool_state(&t, &token, tool).await;
        assert_eq!(reason(&state), ("unavailable", "scope_missing"), "{tool}: {state}");
        assert!(state["reason"]["message"].as_str().unwrap().contains("repo"), "{state}");
    }
    // A read: the issue body is third-party evidence.
    let done =
        call(&t, &token, "github_read_issue", "read-1", json!({"repo": "octocat/hello-world", "number": 1347})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!(out["trust"], "third_party", "{out}");
    assert!(out["body"].is_string(), "{out}");
    let ids = done["evidence_ids"].as_array().unwrap();
    assert!(!ids.is_empty(), "{done}");
    for id in ids {
        let ev = t.get(&format!("/v1/evidence/{}", id.as_str().unwrap()), &token).await;
        assert_eq!(ev.status, StatusCode::OK, "{ev:?}");
        assert_eq!(ev.body["provenance"]["trust"], "third_party", "{}", ev.body);
        assert_eq!(ev.body["provenance"]["source"], "github", "{}", ev.body);
        assert!(!ev.body.to_string().contains("ghp_readonly"), "the token leaked into evidence");
    }
    // A pull request read: diff and checks come along, and its head SHA.
    let done =
        call(&t, &token, "github_read_pull", "read-2", json!({"repo": "octocat/hello-world", "number": 1347})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!(out["head"]["sha"], EXAMPLE_HEAD_SHA, "{out}");
    assert!(out["diff"].as_str().unwrap_or_default().starts_with("diff --git"), "{out}");
    assert!(out["check_runs"].is_array(), "{out}");
}

// ---- merge bound to the head SHA ----------------------------------------------------------------

async fn github_merge_is_bound_to_the_head_sha(backend: Backend) {
    let mock = prism(scopes("repo, workflow")).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    let view = connect(&t, &token, json!({"base_url": mock.base}), json!({"token": "ghp_full"})).await;
    let conn = view["id"].as_str().unwrap().to_owned();
    let state = tool_state(&t, &token, "github_merge_pull").await;
    assert_eq!(state["state"], "available", "{state}");
    // The frozen input names the connection and the exact target; writes wait for approval.
    let (run, turn) = turn(&t, &token).await;
    let old = "0123456789abcdef0123456789abcdef01234567";
    let r = t
        .call(
            &token,
            &run,
            &turn,
            "github_merge_pull",
            "merge-old",
            json!({"repo": "octocat/Hello-World", "number": 1347, "sha": old}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let inv = t.get(&format!("/v1/invocations/{}", r.body["invocation_id"].as_str().unwrap()), &token).await.body;
    let frozen = inv.to_string();
    assert!(frozen.contains(&conn) && frozen.contains(old), "the frozen input does not bind connection and sha: {inv}");
    // Approved, it still does not merge: the head is another commit now.
    let done = call(
        &t,
        &token,
        "github_merge_pull",
        "merge-old",
        json!({"repo": "octocat/Hello-World", "number": 1347, "sha": old}),
    )
    .await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "head_changed", "{done}");
    assert_eq!(done["result"]["error"]["details"]["current_sha"], EXAMPLE_HEAD_SHA, "{done}");
    // Bound to the current head, it merges.
    let done = call(
        &t,
        &token,
        "github_merge_pull",
        "merge-now",
        json!({"repo": "octocat/Hello-World", "number": 1347, "sha": EXAMPLE_HEAD_SHA.to_uppercase()}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["merged"], true, "{done}");
    assert_eq!(done["result"]["output"]["head_sha"], EXAMPLE_HEAD_SHA, "{done}");
    // The other writes, each approved, against the mocked operations (github_commit is not
    // here: it gets as far as the ref update, which Prism cannot route — `git/refs/{ref}` with
    // `ref = heads/master` holds a slash).
    let repo = "octocat/Hello-World";
    for (tool, input) in [
        ("github_create_issue", json!({"repo": repo, "title": "Found a bug", "body": "steps", "labels": ["bug"]})),
        ("github_comment", json!({"repo": repo, "number": 1347, "body": "Me too"})),
        (
            "github_set_issue_state",
            json!({"repo": repo, "number": 1347, "state": "closed", "state_reason": "completed"}),
        ),
        ("github_label_issue", json!({"repo": repo, "number": 1347, "labels": ["bug", "enhancement"]})),
        ("github_create_branch", json!({"repo": repo, "branch": "feature-x"})),
        (
            "github_create_pull",
            json!({"repo": repo, "title": "Amazing new feature", "head": "octocat:new-feature", "base": "master"}),
        ),
        ("github_review_pull", json!({"repo": repo, "number": 1347, "event": "APPROVE"})),
        ("github_rerun", json!({"repo": repo, "run_id": 30433642})),
    ] {
        let done = call(&t, &token, tool, &format!("w-{tool}"), input).await;
        assert_eq!(done["status"], "completed", "{tool}: {done}");
    }
    // Bad input is refused at freeze time, nothing sent.
    let r = t
        .call(
            &token,
            &run,
            &turn,
            "github_merge_pull",
            "merge-bad",
            json!({"repo": "octocat/../x", "number": 1, "sha": old}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
}

// ---- allowlist --------------------------------------------------------------------------------

async fn github_repository_allowlist(backend: Backend) {
    let mock = prism(scopes("repo")).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    let view = connect(
        &t,
        &token,
        json!({"base_url": mock.base, "repositories": ["Octocat/Hello-World"]}),
        json!({"token": "ghp_limited"}),
    )
    .await;
    assert_eq!(view["settings"]["repositories"], json!(["octocat/hello-world"]), "{view}");
    let (run, turn) = turn(&t, &token).await;
    for (tool, input) in [
        ("github_read_issue", json!({"repo": "someone/else", "number": 1})),
        ("github_create_issue", json!({"repo": "someone/else", "title": "x"})),
        ("github_search_issues", json!({"query": "bug"})),
    ] {
        let r = t.call(&token, &run, &turn, tool, &format!("c-{tool}"), input).await;
        assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "repository_not_allowed"), "{tool}: {r:?}");
    }
    // A qualifier that would leave the repository is refused too.
    let r = t
        .call(
            &token,
            &run,
            &turn,
            "github_search_issues",
            "c-q",
            json!({"query": "bug repo:someone/else", "repo": "octocat/hello-world"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    // The allowed repository works, whatever its spelling.
    let done = call(&t, &token, "github_read_issue", "ok", json!({"repo": "OCTOCAT/hello-world", "number": 1})).await;
    assert_eq!(done["status"], "completed", "{done}");
}

// ---- refused token, server down ---------------------------------------------------------------

async fn github_refused_token_and_server_down(backend: Backend) {
    let mock = prism(refused).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    let view = connect(&t, &token, json!({"base_url": mock.base}), json!({"token": "ghp_revoked"})).await;
    assert!(view["permissions"].to_string().contains("reauth_required"), "{view}");
    let state = tool_state(&t, &token, "github_read").await;
    assert_eq!(reason(&state), ("unavailable", "reauth_required"), "{state}");
    let r = t
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/connections/{}", view["id"].as_str().unwrap()),
            Some(&token),
            None,
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");

    let view = connect(&t, &token, json!({"base_url": closed_port()}), json!({"token": "ghp_nowhere"})).await;
    let state = tool_state(&t, &token, "github_read_issue").await;
    assert_eq!(reason(&state), ("unavailable", "connection_unreachable"), "{state}");
    let r = t
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/connections/{}", view["id"].as_str().unwrap()),
            Some(&token),
            None,
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");

    // X-RateLimit-Remaining: 0 → rate_limited until X-RateLimit-Reset.
    let mock = prism(exhausted).await;
    let view = connect(&t, &token, json!({"base_url": mock.base}), json!({"token": "ghp_busy"})).await;
    // The server's reset (2100-01-01) counts for at most a day.
    let until = view["rate_limited_until"].as_str().unwrap_or_default().to_owned();
    let now = chrono::Utc::now();
    let until_t = chrono::DateTime::parse_from_rfc3339(&until).unwrap_or_else(|e| panic!("{until}: {e}"));
    assert!(until_t > now && until_t <= now + chrono::TimeDelta::days(1) + chrono::TimeDelta::minutes(1), "{view}");
    let state = tool_state(&t, &token, "github_read").await;
    assert_eq!(reason(&state), ("unavailable", "rate_limited"), "{state}");
}

// ---- recorded fixtures ------------------------------------------------------------------------

async fn github_recorded_fixtures(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    // get-content: the root listing, then README.md's raw text, as recorded.
    let mock = fixtures("get-content").await;
    let view = connect(&t, &token, json!({"base_url": mock.base}), json!({"token": FIXTURES_TOKEN})).await;
    assert_eq!(view["account"], "octokit-fixture-user-a", "{view}");
    let done = call(&t, &token, "github_read", "ls", json!({"repo": "octokit-fixture-org/hello-world"})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let entries = done["result"]["output"]["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["path"] == "README.md"), "{done}");
    let done =
        call(&t, &token, "github_read", "cat", json!({"repo": "octokit-fixture-org/hello-world", "path": "README.md"}))
            .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["content"], "# hello-world", "{done}");
    let ev = t.get(&format!("/v1/evidence/{}", done["evidence_ids"][0].as_str().unwrap()), &token).await;
    assert_eq!(ev.body["provenance"]["trust"], "third_party", "{}", ev.body);
    assert_eq!(ev.body["content_sha256"], mira::evidence::sha256_hex(b"# hello-world"), "{}", ev.body);

    // search-issues: the recorded query.
    let mock = fixtures("search-issues").await;
    connect(
        &t,
        &token,
        json!({"base_url": mock.base, "repositories": ["octokit-fixture-org/search-issues"]}),
        json!({"token": FIXTURES_TOKEN}),
    )
    .await;
    let conns = t.get("/v1/connections", &token).await.body;
    let conn = conns["connections"].as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_owned();
    let done = call(
        &t,
        &token,
        "github_search_issues",
        "search",
        json!({"connection": conn, "query": "sesame", "repo": "octokit-fixture-org/search-issues"}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let items = done["result"]["output"]["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{done}");
    assert!(items.iter().all(|i| i["repo"] == "octokit-fixture-org/search-issues"), "{done}");
}

// ---- merge bound to the base ------------------------------------------------------------------

async fn github_merge_is_bound_to_the_base(backend: Backend) {
    let gh = Scripted::start("develop", BASE_1).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    connect(&t, &token, json!({"base_url": gh.base}), json!({"token": "ghp_scripted"})).await;
    let merge = json!({"repo": "octo/app", "number": 7, "sha": EXAMPLE_HEAD_SHA});

    // Frozen: the base branch and its head are derived, bound in the input and shown.
    let (inv, approval) = freeze(&t, &token, "github_merge_pull", "m-retarget", merge.clone()).await;
    let input = &approval["invocation"]["input"];
    assert_eq!((input["base"].as_str(), input["base_sha"].as_str()), (Some("develop"), Some(BASE_1)), "{approval}");
    assert_eq!(approval["preview"]["tool"]["base"], "develop", "{approval}");
    assert_eq!(approval["preview"]["tool"]["base_sha"], BASE_1, "{approval}");
    // Retargeted to main after the approver looked: nothing is merged.
    gh.set(|s| s.base = "main".into());
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "base_changed", "{done}");
    assert_eq!(done["result"]["error"]["details"]["current_base"], "main", "{done}");
    assert_eq!(gh.merges(), 0, "{:?}", gh.seen());

    // The base branch advanced (others merged into it): merged into its current head, both
    // heads reported.
    gh.set(|s| s.base = "develop".into());
    let (inv, _) = freeze(&t, &token, "github_merge_pull", "m-advanced", merge.clone()).await;
    gh.set(|s| {
        s.base_sha = BASE_2.into();
        s.compare = "ahead";
    });
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!((out["base"].as_str(), out["base_sha_approved"].as_str()), (Some("develop"), Some(BASE_1)), "{out}");
    assert_eq!(out["base_sha"], BASE_2, "{out}");
    assert_eq!(out["merge_commit_sha"], MERGE_SHA, "{out}");
    assert_eq!(gh.merges(), 1, "{:?}", gh.seen());
    let compare = format!("GET /repos/octo/app/compare/{BASE_1}...{BASE_2}");
    assert!(gh.seen().contains(&compare), "{:?}", gh.seen());

    // The base branch was rewritten (force-pushed): its head no longer descends from the
    // approved one, nothing is merged.
    let (inv, approval) = freeze(&t, &token, "github_merge_pull", "m-rewritten", merge.clone()).await;
    assert_eq!(approval["invocation"]["input"]["base_sha"], BASE_2, "{approval}");
    gh.set(|s| {
        s.base_sha = BASE_3.into();
        s.compare = "diverged";
    });
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "base_changed", "{done}");
    assert_eq!(gh.merges(), 1, "{:?}", gh.seen());

    // A base named in the input must be the pull request's when the call is frozen.
    let (run, turn) = turn(&t, &token).await;
    let mut wrong = merge.clone();
    wrong["base"] = json!("main");
    let r = t.call(&token, &run, &turn, "github_merge_pull", "m-wrong", wrong).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "base_changed"), "{r:?}");
}

// ---- approval bound to the connection ---------------------------------------------------------

async fn github_approval_is_bound_to_the_connection(backend: Backend) {
    let gh = Scripted::start("main", BASE_1).await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    let view = connect(&t, &token, json!({"base_url": gh.base}), json!({"token": "ghp_first"})).await;
    let conn = view["id"].as_str().unwrap().to_owned();
    let merge = json!({"repo": "octo/app", "number": 7, "sha": EXAMPLE_HEAD_SHA});
    let patch = |body: Value| {
        let (t, token, conn) = (&t, &token, &conn);
        async move {
            let r =
                t.request(reqwest::Method::PATCH, &format!("/v1/connections/{conn}"), Some(token), Some(body)).await;
            assert!(r.status.is_success(), "{r:?}");
        }
    };

    // The credential is replaced after the call was frozen: the grant runs nothing.
    let (inv, approval) = freeze(&t, &token, "github_merge_pull", "fp-credential", merge.clone()).await;
    assert!(approval["invocation"]["input"]["connection_fingerprint"].is_string(), "{approval}");
    patch(json!({"credential": {"token": "ghp_second"}})).await;
    let before = gh.seen();
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "connection_changed", "{done}");
    assert_eq!(gh.seen(), before, "a request was sent for a call frozen with another credential");
    assert_eq!(gh.merges(), 0);

    // So are the settings.
    let (inv, _) = freeze(&t, &token, "github_merge_pull", "fp-settings", merge.clone()).await;
    patch(json!({"settings": {"base_url": gh.base, "repositories": ["octo/app"]}})).await;
    let before = gh.seen();
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["result"]["error"]["code"], "connection_changed", "{done}");
    assert_eq!(gh.seen(), before);

    // Control: nothing changed between freeze and grant → it merges.
    let (inv, _) = freeze(&t, &token, "github_merge_pull", "fp-same", merge).await;
    let done = grant(&t, &token, &inv).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(gh.merges(), 1, "{:?}", gh.seen());
}

// ---- one resource's 403 is not the connection's -----------------------------------------------

/// A 403 for one repository fails that call with `scope_missing` but marks nothing on the
/// connection: on a shared connection it would otherwise turn the permission `scope_missing`
/// for every user (and every replica, from the store) until the next check.
async fn github_one_repository_refused_is_not_the_connection(backend: Backend) {
    let gh = Scripted::start("main", BASE_1).await;
    let t = spawn(backend).await;
    let bob = t.user("bob").await;
    let alice = t.user("alice").await;
    let r = t
        .post(
            "/v1/connections",
            &t.admin_token,
            json!({"kind": "github", "name": "team", "shared": true, "settings": {"base_url": gh.base},
                   "credential": {"token": "ghp_shared"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let conn = r.body["id"].as_str().unwrap().to_owned();
    assert_eq!(r.body["permissions"]["issues:read"]["access"]["state"], "granted", "{r:?}");

    // Bob reads an issue of the refused repository: his call fails, with GitHub's reason.
    let done = call(&t, &bob, "github_read_issue", "locked", json!({"repo": "octo/locked", "number": 1})).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "scope_missing", "{done}");
    assert!(done["result"]["error"]["message"].as_str().unwrap().contains("not accessible"), "{done}");
    // A store write of what a call learned is spawned: give one a moment to land.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Nothing changed for anyone: not in memory, not in the store other replicas read.
    for token in [&alice, &bob] {
        let state = tool_state(&t, token, "github_read_issue").await;
        assert_eq!(state["state"], "available", "{state}");
    }
    let view = t.get(&format!("/v1/connections/{conn}"), &alice).await;
    assert_eq!(view.body["permissions"]["issues:read"]["access"]["state"], "granted", "{view:?}");
    assert_eq!(view.body["state"], "ready", "{view:?}");
    let row = t.app().store.connection(&conn).await.unwrap().unwrap();
    assert!(!row.check_json.unwrap_or_default().contains("missing"), "a 403 of one repository was stored");
    // Alice's call on a repository the token reads runs.
    let done = call(&t, &alice, "github_read_issue", "ok", json!({"repo": "octo/app", "number": 1})).await;
    assert_eq!(done["status"], "completed", "{done}");
}

// ---- an execution reads its connection again ----------------------------------------------------

/// A connection disabled or deleted through another replica (straight in the store: this
/// replica's reload is an hour away) is refused by an execution at once, nothing sent: the
/// execution reads the connection's row, not this replica's copy.
async fn github_execution_reads_the_connection_again(backend: Backend) {
    let gh = Scripted::start("main", BASE_1).await;
    let mut options = common::Options::default();
    options.runtime.search.state_refresh_secs = 3600;
    let t = common::spawn_with(backend, options).await;
    let token = t.user("dev").await;
    let view = connect(&t, &token, json!({"base_url": gh.base}), json!({"token": "ghp_replicas"})).await;
    let conn = view["id"].as_str().unwrap().to_owned();
    let merge = json!({"repo": "octo/app", "number": 7, "sha": EXAMPLE_HEAD_SHA});
    let store = &t.app().store;

    // Disabled elsewhere between freeze and grant.
    let (inv, _) = freeze(&t, &token, "github_merge_pull", "other-disabled", merge.clone()).await;
    let mut row = store.connection(&conn).await.unwrap().unwrap();
    row.enabled = false;
    assert!(store.update_connection(&row).await.unwrap());
    let before = gh.seen();
    let done = grant(&t, &token, &inv).await;
    assert_eq!(
        (&done["status"], &done["result"]["error"]["code"]),
        (&json!("failed"), &json!("no_connection")),
        "{done}"
    );
    assert_eq!(gh.seen(), before, "a request was sent through a connection disabled on another replica");

    // Enabled again (through this replica: it reloads), then deleted elsewhere.
    row.enabled = true;
    assert!(store.update_connection(&row).await.unwrap());
    t.app().connections.reload().await;
    let (inv, _) = freeze(&t, &token, "github_merge_pull", "other-deleted", merge).await;
    assert!(store.delete_connection(&conn).await.unwrap());
    let done = grant(&t, &token, &inv).await;
    assert_eq!(
        (&done["status"], &done["result"]["error"]["code"]),
        (&json!("failed"), &json!("no_connection")),
        "{done}"
    );
    assert_eq!(gh.merges(), 0, "{:?}", gh.seen());
}

// ---- job logs: the signed URL stays secret -----------------------------------------------------

async fn github_job_logs_keep_the_signed_url_secret(backend: Backend) {
    let blob = Blob::start(MAX_LOG_DOWNLOADS).await;
    let location = format!("{}/signedlogcontent/19?urlExpires=2099-01-01&urlSignature={SIGNATURE}", blob.base);
    let mock = prism_spec(|spec| {
        scopes("repo")(&mut spec["paths"]["/user"]["get"]["responses"]);
        spec["paths"]["/repos/{owner}/{repo}/actions/jobs/{job_id}/logs"]["get"]["responses"]["302"]["headers"]
            ["Location"]["example"] = json!(location);
    })
    .await;
    let t = spawn(backend).await;
    let token = t.user("dev").await;
    connect(&t, &token, json!({"base_url": mock.base}), json!({"token": "ghp_actions"})).await;
    let repo = "octocat/hello-world";

    // github_list_runs and github_search_code against the description's examples.
    let done = call(&t, &token, "github_list_runs", "runs", json!({"repo": repo, "branch": "main"})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let runs = done["result"]["output"]["runs"].as_array().unwrap();
    assert!(!runs.is_empty() && runs[0]["id"].is_u64(), "{done}");
    let done = call(&t, &token, "github_search_code", "code", json!({"query": "addClass", "repo": repo})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(!done["result"]["output"]["items"].as_array().unwrap().is_empty(), "{done}");

    // The log is read through the redirect; the signed URL is nowhere in what the call keeps.
    let done = call(&t, &token, "github_read_run", "run-ok", json!({"repo": repo, "run_id": 30433642})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let jobs = done["result"]["output"]["jobs"].as_array().unwrap();
    assert!(!jobs.is_empty(), "{done}");
    assert_eq!(jobs[0]["log_tail"], LOG, "{done}");
    assert!(!done.to_string().contains(SIGNATURE), "the signed URL leaked into the invocation: {done}");
    for id in done["evidence_ids"].as_array().unwrap() {
        let ev = t.get(&format!("/v1/evidence/{}", id.as_str().unwrap()), &token).await;
        assert_eq!(ev.status, StatusCode::OK, "{ev:?}");
        assert!(!ev.body.to_string().contains(SIGNATURE), "the signed URL leaked into evidence: {}", ev.body);
    }

    // The blob store fails: the error names the host, never the signed URL.
    blob.ok.store(0, Ordering::SeqCst);
    let done = call(&t, &token, "github_read_run", "run-fail", json!({"repo": repo, "run_id": 30433642})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let error = done["result"]["output"]["jobs"][0]["log_error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("127.0.0.1"), "{done}");
    assert!(!done.to_string().contains(SIGNATURE), "the signed URL leaked into an error: {done}");
    assert!(!done.to_string().contains("signedlogcontent"), "the download URL leaked into an error: {done}");
}

/// Downloads the blob store answers in [`github_job_logs_keep_the_signed_url_secret`] (one per
/// job of the example run, at most 10).
const MAX_LOG_DOWNLOADS: usize = 10;

// ---- the address rule when a client connects --------------------------------------------------

/// An opened connection to `base_url` under `rule`, as the hub hands it to a call or a check.
fn opened(base_url: &str, rule: mira::net::AddressRule) -> mira::connections::Opened {
    mira::connections::Opened {
        id: "conn_rule".into(),
        owner_id: Some("usr_rule".into()),
        settings: json!({"base_url": base_url}),
        credential: json!({"token": "ghp_rule"}),
        fingerprint: String::new(),
        address_rule: rule,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_address_rule_applies_when_connecting() {
    use mira::connections::Access;
    use mira::error::ErrorCode;
    use mira::net::AddressRule::{Any, PublicOnly};
    use mira::tools::github::Api;
    use mira::tools::github::api::{ACCEPT_JSON, MAX_JSON_BYTES};

    let gh = Scripted::start("main", BASE_1).await;
    let driver = mira::tools::github::driver();
    // A name that resolves to loopback (as a rebound name would) and the IP literal.
    for base in [format!("http://localhost:{}", gh.port), gh.base.clone()] {
        let conn = opened(&base, PublicOnly);
        let error = match Api::for_check(&conn) {
            Err(e) => e,
            Ok(api) => api.send(reqwest::Method::GET, "/user", None, ACCEPT_JSON, MAX_JSON_BYTES).await.err().unwrap(),
        };
        assert_eq!(error.code, ErrorCode::InternalAddress, "{base}: {error:?}");
        assert!(error.message.contains("internal address"), "{base}: {error:?}");
        let report = driver.check(&conn).await;
        assert!(report.access.values().all(|a| matches!(a, Access::Unreachable { .. })), "{base}: {:?}", report.access);
        assert!(gh.script.lock().unwrap().seen.is_empty(), "{base}: a request reached the server under PublicOnly");
        // The same connection under Any (an admin's, or a deployment allowing internal URLs).
        let report = driver.check(&opened(&base, Any)).await;
        assert_eq!(report.account.as_deref(), Some("scripted"), "{base}: {:?}", report.access);
        gh.set(|s| s.seen.clear());
    }

    // A job log's redirect: under PublicOnly no internal address is downloaded from, by name
    // or literal, and the error keeps the signed URL secret.
    let blob = Blob::start(1).await;
    let by_name = format!("http://localhost:{}/signedlogcontent?urlSignature={SIGNATURE}", blob.port);
    let by_ip = format!("{}/signedlogcontent?urlSignature={SIGNATURE}", blob.base);
    let public_api = Api::for_check(&opened("https://api.github.com", PublicOnly)).unwrap();
    for url in [&by_name, &by_ip] {
        let e = public_api.download(url, 1024).await.unwrap_err();
        assert!(e.contains("internal address") && !e.contains(SIGNATURE), "{url}: {e}");
    }
    assert_eq!(blob.connections(), 0);
    // Under Any the API's own host is downloaded from; another internal host is not.
    let any_api = Api::for_check(&opened(&gh.base, Any)).unwrap();
    let e = any_api.download(&by_name, 1024).await.unwrap_err();
    assert!(e.contains("internal address") && !e.contains(SIGNATURE), "{e}");
    assert_eq!(blob.connections(), 0);
    assert_eq!(any_api.download(&by_ip, 1024).await.unwrap(), LOG.as_bytes());
}

both_backends!(
    github_tools_need_a_connection,
    github_classic_token_without_repo_scope,
    github_merge_is_bound_to_the_head_sha,
    github_repository_allowlist,
    github_refused_token_and_server_down,
    github_recorded_fixtures,
    github_merge_is_bound_to_the_base,
    github_approval_is_bound_to_the_connection,
    github_one_repository_refused_is_not_the_connection,
    github_execution_reads_the_connection_again,
    github_job_logs_keep_the_signed_url_secret,
);
