#![allow(clippy::unwrap_used, clippy::expect_used)]
//! External MCP against the reference servers, installed by `scripts/setup-mcp.sh`:
//! `@modelcontextprotocol/server-everything` over stdio and over Streamable HTTP,
//! `server-filesystem`, `server-memory` (npm) and `mcp-server-time` (PyPI).

use crate::common;

use std::time::Duration;

use common::{Backend, TestApp, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn env_path(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run `eval \"$(scripts/setup-mcp.sh)\"` first"))
}

async fn install(t: &TestApp, token: &str, name: &str, transport: Value) -> String {
    let r = t
        .post(
            "/v1/mcp/servers",
            token,
            json!({"name": name, "transport": transport, "default_agent_access": true, "request_timeout_ms": 30000}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    for _ in 0..600 {
        let v = t.get(&format!("/v1/mcp/servers/{id}"), token).await.body;
        if v["connection"]["state"] == "connected" && v["connection"]["discovered_at"].is_string() {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} did not connect: {:#}", t.get(&format!("/v1/mcp/servers/{id}"), token).await.body);
}

async fn call(t: &TestApp, token: &str, run: &str, tool: &str, call_id: &str, input: Value) -> Value {
    let (turn, _) = t.turn(token, run, "use the tool").await;
    let r = t.call(token, run, &turn, tool, call_id, input).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    t.post(
        &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
        token,
        json!({"tool_id": tool, "tool_call_id": call_id, "input_hash": r.body["input_hash"]}),
    )
    .await;
    let inv = r.body["invocation_id"].as_str().unwrap();
    for _ in 0..600 {
        let v = t.get(&format!("/v1/invocations/{inv}"), token).await.body;
        if matches!(v["status"].as_str(), Some("completed" | "failed" | "cancelled")) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{tool} did not finish");
}

fn text(v: &Value) -> String {
    v["result"]["output"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn tool_names(t: &Value) -> Vec<String> {
    t["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["status"] == "ok")
        .map(|x| x["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_stdio() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("amy").await;
    let id = install(
        &t,
        &token,
        "everything",
        json!({"stdio": {"command": env_path("MIRA_MCP_EVERYTHING"), "args": ["stdio"]}}),
    )
    .await;
    // Tools registered after initialization arrive through list_changed → re-discovery.
    let mut names = Vec::new();
    for _ in 0..100 {
        names = tool_names(&t.get(&format!("/v1/mcp/servers/{id}"), &token).await.body);
        if names.iter().any(|n| n == "simulate-research-query") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(names.iter().any(|n| n == "echo") && names.iter().any(|n| n == "get-sum"), "{names:?}");
    assert!(names.iter().any(|n| n == "simulate-research-query"), "{names:?}");
    let run = t.run(&token).await;
    let done = call(&t, &token, &run, &format!("mcp:{id}:tool:echo"), "e1", json!({"message": "hi there"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert!(text(&done).contains("hi there"), "{done:#}");
    let done = call(&t, &token, &run, &format!("mcp:{id}:tool:get-sum"), "e2", json!({"a": 2, "b": 40})).await;
    assert!(text(&done).contains("42"), "{done:#}");
    let done = call(
        &t,
        &token,
        &run,
        &format!("mcp:{id}:tool:trigger-long-running-operation"),
        "e3",
        json!({"duration": 1, "steps": 3}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let events = t.run_events(&token, &run).await;
    let progress = events.iter().filter(|(_, k, _)| k == "execution.progress").count();
    assert!(progress >= 2, "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_over_streamable_http() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = tokio::process::Command::new(env_path("MIRA_MCP_EVERYTHING"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("ben").await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let id =
        install(&t, &token, "everything-http", json!({"http": {"url": url, "headers": {"X-Api-Key": "k-secret-9"}}}))
            .await;
    let v = t.get(&format!("/v1/mcp/servers/{id}"), &token).await.body;
    assert!(!v.to_string().contains("k-secret-9"));
    assert_eq!(v["transport"], "http");
    let run = t.run(&token).await;
    let done = call(&t, &token, &run, &format!("mcp:{id}:tool:echo"), "h1", json!({"message": "over http"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert!(text(&done).contains("over http"));
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_memory_and_time() {
    // cy's servers run in the sandbox: the folder they work in is one of cy's workspaces,
    // named as their cwd (src/sandbox/mcp.rs).
    let mut options = common::Options::default();
    options.runtime.workspace_roots = vec![std::env::temp_dir()];
    let t = common::spawn_with(Backend::Sqlite, options).await;
    let token = t.user("cy").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "remember the milk").unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap().to_string_lossy().into_owned();
    let r = t.post("/v1/workspaces", &token, json!({"name": "notes", "path": root})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let fs = install(
        &t,
        &token,
        "fs",
        json!({"stdio": {"command": env_path("MIRA_MCP_FILESYSTEM"), "args": [root], "cwd": root}}),
    )
    .await;
    let mem_file = dir.path().join("memory.jsonl");
    let mem = install(
        &t,
        &token,
        "memory",
        json!({"stdio": {"command": env_path("MIRA_MCP_MEMORY"), "cwd": root,
        "env": {"MEMORY_FILE_PATH": mem_file.to_string_lossy()}}}),
    )
    .await;
    let time = install(&t, &token, "time", json!({"stdio": {"command": env_path("MIRA_MCP_TIME")}})).await;
    let run = t.run(&token).await;
    let done = call(
        &t,
        &token,
        &run,
        &format!("mcp:{fs}:tool:read_text_file"),
        "f1",
        json!({"path": format!("{root}/notes.txt")}),
    )
    .await;
    assert!(text(&done).contains("remember the milk"), "{done:#}");
    let done = call(
        &t,
        &token,
        &run,
        &format!("mcp:{mem}:tool:create_entities"),
        "m1",
        json!({"entities": [{"name": "Mira", "entityType": "project", "observations": ["speaks MCP"]}]}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let done = call(&t, &token, &run, &format!("mcp:{mem}:tool:read_graph"), "m2", json!({})).await;
    assert!(text(&done).contains("speaks MCP"), "{done:#}");
    let done =
        call(&t, &token, &run, &format!("mcp:{time}:tool:get_current_time"), "t1", json!({"timezone": "UTC"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert!(text(&done).contains("UTC"), "{done:#}");
}
