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

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
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
    let spec_path = env_path("MIRA_GITHUB_OPENAPI_TRIMMED");
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    user(&mut spec["paths"]["/user"]["get"]["responses"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("github.json");
    std::fs::write(&file, serde_json::to_vec(&spec).unwrap()).unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(env_path("MIRA_GITHUB_PRISM"))
        .args(["mock", "-h", "127.0.0.1", "-p", &port.to_string()])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prism starts");
    let base = format!("http://127.0.0.1:{port}");
    wait_up(&format!("{base}/rate_limit"), &mut child).await;
    Mock { base, _child: child, _dir: dir }
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
        let g = t
            .post(
                &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
                token,
                json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
            )
            .await;
        assert_eq!(g.status, StatusCode::OK, "{g:?}");
    }
    t.wait_final(token, inv["invocation_id"].as_str().unwrap()).await
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

both_backends!(
    github_tools_need_a_connection,
    github_classic_token_without_repo_scope,
    github_merge_is_bound_to_the_head_sha,
    github_repository_allowlist,
    github_refused_token_and_server_down,
    github_recorded_fixtures,
);
