#![allow(clippy::unwrap_used, clippy::expect_used)]
//! External MCP over HTTP against real MCP servers on stdio and Streamable HTTP: the six
//! stages, projections and the ladder, approval of every call, results, and the failure
//! modes of issue 7. The servers are installed by `scripts/setup-mcp.sh` (npm and PyPI) and
//! the project's own servers in `tests/mcp/`.

use crate::common;

use std::time::Duration;

use common::{Backend, TestApp, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn env_path(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run `eval \"$(scripts/setup-mcp.sh)\"` first"))
}

fn python() -> String {
    env_path("MIRA_MCP_PYTHON")
}

fn server_script(name: &str) -> String {
    format!("{}/tests/mcp/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn fault(extra: &[&str]) -> Value {
    let mut args = vec![Value::String(server_script("fault_server.py"))];
    args.extend(extra.iter().map(|a| Value::String((*a).to_owned())));
    json!({"stdio": {"command": python(), "args": args}})
}

async fn install(t: &TestApp, token: &str, body: Value) -> String {
    let r = t.post("/v1/mcp/servers", token, body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r.body["id"].as_str().unwrap().to_owned()
}

async fn server(t: &TestApp, token: &str, id: &str) -> Value {
    let r = t.get(&format!("/v1/mcp/servers/{id}"), token).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

fn stage<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["stages"].as_array().unwrap().iter().find(|s| s["stage"] == name).unwrap()
}

/// Polls the server view until `pred` holds (20 s at most).
async fn wait_for(t: &TestApp, token: &str, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let v = server(t, token, id).await;
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen: {:#}", server(t, token, id).await);
}

fn connected(v: &Value) -> bool {
    v["connection"]["state"] == "connected" && v["connection"]["discovered_at"].is_string()
}

async fn access(t: &TestApp, token: &str, id: &str, tool: &str, on: bool) {
    let r = t
        .request(
            reqwest::Method::PUT,
            &format!("/v1/mcp/servers/{id}/tools/{tool}/agent-access"),
            Some(token),
            Some(json!({"enabled": on})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// Freezes a call, grants its approval with the exact triple and waits for the result.
async fn call_approved(
    t: &TestApp,
    token: &str,
    run: &str,
    turn: &str,
    tool: &str,
    call_id: &str,
    input: Value,
) -> Value {
    let r = t.call(token, run, turn, tool, call_id, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let approval = r.body["approval_id"].as_str().unwrap();
    let g = t
        .post(
            &format!("/v1/approvals/{approval}/grant"),
            token,
            json!({"tool_id": r.body["tool_id"], "tool_call_id": call_id, "input_hash": r.body["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    wait_final_long(t, token, r.body["invocation_id"].as_str().unwrap()).await
}

async fn wait_final_long(t: &TestApp, token: &str, invocation: &str) -> Value {
    for _ in 0..600 {
        let r = t.get(&format!("/v1/invocations/{invocation}"), token).await;
        if !matches!(r.body["status"].as_str().unwrap_or(""), "queued" | "running" | "awaiting_approval") {
            return r.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("invocation {invocation} did not finish");
}

fn ladder_code(v: &Value) -> (&str, &str) {
    (v["state"].as_str().unwrap(), v["reason"]["code"].as_str().unwrap_or(""))
}

async fn six_stages_end_to_end(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let id = install(
        &t,
        &alice,
        json!({"name": "faults", "transport": fault(&["--page-size", "4"]), "disclaimer": "This server is a test double.",
               "request_timeout_ms": 5000}),
    )
    .await;
    let v = wait_for(&t, &alice, &id, "connect + discover", connected).await;
    assert_eq!(stage(&v, "install")["status"], "ok");
    assert_eq!(stage(&v, "connect")["status"], "ok");
    assert_eq!(v["connection"]["protocol_version"], "2025-11-25");
    assert_eq!(v["connection"]["server_info"]["name"], "fault-server");
    assert_eq!(stage(&v, "disclaimer")["status"], "blocked");
    assert_eq!(stage(&v, "disclaimer")["action"]["path"], format!("/v1/mcp/servers/{id}/disclaimer/accept"));
    assert_eq!(stage(&v, "agent_access")["status"], "blocked");
    assert_eq!(stage(&v, "approval")["status"], "pending");
    // Pagination (page size 4) reached every tool; the three malformed ones are rejected with reasons.
    let tools = v["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 14, "{tools:#?}");
    let rejected: Vec<(&str, &str)> = tools
        .iter()
        .filter(|t| t["status"] == "rejected")
        .map(|t| (t["name"].as_str().unwrap(), t["rejection"].as_str().unwrap()))
        .collect();
    assert_eq!(rejected.len(), 3, "{rejected:?}");
    assert!(rejected.iter().any(|(n, r)| *n == "broken_no_schema" && r.starts_with("missing_input_schema")));
    assert!(rejected.iter().any(|(n, r)| *n == "bad name!" && r.starts_with("invalid_name")));
    assert!(rejected.iter().any(|(n, r)| *n == "broken_schema_type" && r.starts_with("invalid_input_schema")));

    let echo = format!("mcp:{id}:tool:echo");
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_disclaimer_not_accepted"), "{ladder:#}");
    // Another user sees nothing of it.
    let bob = t.user("bob").await;
    assert_eq!(t.get(&format!("/v1/mcp/servers/{id}"), &bob).await.status, StatusCode::NOT_FOUND);
    let ladder = t.get(&format!("/v1/tools/{echo}"), &bob).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_server_not_installed"));

    let r = t.post(&format!("/v1/mcp/servers/{id}/disclaimer/accept"), &alice, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_agent_access_off"));
    let rejected_ladder = t.get(&format!("/v1/tools/mcp:{id}:tool:broken_no_schema"), &alice).await.body;
    assert_eq!(ladder_code(&rejected_ladder), ("not_registered", "mcp_tool_rejected"));

    access(&t, &alice, &id, "echo", true).await;
    access(&t, &alice, &id, "image", true).await;
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder["state"], "available", "{ladder:#}");
    assert_eq!(ladder["kind"], "mcp_projection");
    assert_eq!(ladder["requires_approval"], true);
    assert_eq!(ladder["mcp"]["agent_access"], true);
    assert_eq!(ladder["mcp"]["annotations"]["readOnlyHint"], true);
    let v = server(&t, &alice, &id).await;
    assert_eq!(stage(&v, "tool_exposure")["status"], "ok", "{v:#}");

    let run = t.run(&alice).await;
    let (turn, exposure) = t.turn(&alice, &run, "echo some text").await;
    let exposed = exposure["tools"].as_array().unwrap().iter().find(|x| x["id"] == echo).expect("echo exposed").clone();
    let fname = exposed["function_name"].as_str().unwrap().to_owned();
    assert!(fname.len() <= 64 && fname.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{fname}");
    // The input is validated against the inputSchema before freezing.
    let bad = t.call(&alice, &run, &turn, &fname, "c0", json!({"text": 5})).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}");
    // readOnlyHint does not lower the bar: the call waits for approval, annotations shown.
    let r = t.call(&alice, &run, &turn, &fname, "c1", json!({"text": "hello mcp"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let pending = t.get("/v1/approvals?status=pending", &alice).await.body;
    assert!(pending.to_string().contains("readOnlyHint"), "{pending}");
    let approval = r.body["approval_id"].as_str().unwrap();
    t.post(
        &format!("/v1/approvals/{approval}/grant"),
        &alice,
        json!({"tool_id": echo, "tool_call_id": "c1", "input_hash": r.body["input_hash"]}),
    )
    .await;
    let done = wait_final_long(&t, &alice, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["output"]["content"][0]["text"], "hello mcp");
    let ev = t.get(&format!("/v1/evidence/{}", done["evidence_ids"][0].as_str().unwrap()), &alice).await.body;
    assert_eq!(ev["kind"], "mcp_result");
    assert_eq!(ev["provenance"]["server_id"], id.as_str());
    assert_eq!(ev["provenance"]["tool"], "echo");
    assert_eq!(ev["provenance"]["protocol_version"], "2025-11-25");
    assert_eq!(ev["content_sha256"], done["result"]["output"]["content_sha256"]);

    // Text, image, resource blocks and structuredContent are kept.
    let done = call_approved(&t, &alice, &run, &turn, &format!("mcp:{id}:tool:image"), "c2", json!({})).await;
    let out = &done["result"]["output"];
    assert_eq!(out["content"][1]["type"], "image");
    assert_eq!(out["content"][2]["resource"]["text"], "dot");
    assert_eq!(out["structured_content"]["color"], "red");

    // Disable: the projection disappears and the ladder names the stage; access survives.
    let r = t
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/mcp/servers/{id}"),
            Some(&alice),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_server_disabled"));
    let again = t.call(&alice, &run, &turn, &echo, "c3", json!({"text": "x"})).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "not_registered"), "{again:?}");
    wait_for(&t, &alice, &id, "disconnect", |v| v["connection"]["state"] == "disconnected").await;
    t.request(reqwest::Method::PATCH, &format!("/v1/mcp/servers/{id}"), Some(&alice), Some(json!({"enabled": true})))
        .await;
    let v = wait_for(&t, &alice, &id, "reconnect", |v| v["connection"]["state"] == "connected").await;
    assert_eq!(v["tools"].as_array().unwrap().iter().find(|x| x["name"] == "echo").unwrap()["agent_access"], true);
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder["state"], "available", "{ladder:#}");

    // Remove: gone from the registry, the ladder says why.
    let r = t.request(reqwest::Method::DELETE, &format!("/v1/mcp/servers/{id}"), Some(&alice), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    let ladder = t.get(&format!("/v1/tools/{echo}"), &alice).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_server_not_installed"));
}

async fn crash_at_start_shows_stderr_and_blocks_no_one(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("carol").await;
    let bad = install(&t, &token, json!({"name": "broken", "transport": fault(&["--crash-at-start"])})).await;
    let good = install(&t, &token, json!({"name": "good", "transport": fault(&[])})).await;
    wait_for(&t, &token, &good, "good server connects", connected).await;
    let v = wait_for(&t, &token, &bad, "crash recorded", |v| v["connection"]["state"] == "failed").await;
    let connect = stage(&v, "connect");
    assert_eq!(connect["status"], "blocked");
    assert!(v["connection"]["stderr_tail"].as_str().unwrap().contains("cannot open configuration"), "{v:#}");
    assert!(connect["reason"].as_str().unwrap().contains("cannot open configuration"), "{connect}");
    assert_eq!(connect["action"]["path"], format!("/v1/mcp/servers/{bad}/connect"));
}

both_backends!(six_stages_end_to_end);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_start() {
    crash_at_start_shows_stderr_and_blocks_no_one(Backend::Sqlite).await;
}

/// Installs the fault server with agent access on by default and returns (app, token,
/// server id, run, turn).
async fn fault_app(extra: &[&str], timeout_ms: i64) -> (TestApp, String, String, String, String) {
    let t = spawn(Backend::Sqlite).await;
    // A fault server that reports to the test through files in the host's /tmp (--log,
    // --drop-file) is the admin's: a non-admin's server runs in the sandbox, whose /tmp is
    // its own (tests/it/hostile_sandbox.rs).
    let token = if extra.is_empty() { t.user("dora").await } else { t.admin_token.clone() };
    let id = install(
        &t,
        &token,
        json!({"name": "faults", "transport": fault(extra), "default_agent_access": true, "request_timeout_ms": timeout_ms}),
    )
    .await;
    wait_for(&t, &token, &id, "connect", connected).await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "anything").await;
    (t, token, id, run, turn)
}

/// A server that completes the handshake and its listing, then dies at once, is reconnected
/// ever more slowly (0.5, 1, 2, 4 s…), not every 0.5 s with a discovery each time: only a
/// connection that stayed up resets the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_after_each_handshake_is_retried_ever_more_slowly() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.log");
    let t = spawn(Backend::Sqlite).await;
    let id = install(
        &t,
        &t.admin_token,
        json!({"name": "flapping", "transport": fault(&["--die-after-list", "--log", log.to_str().unwrap()])}),
    )
    .await;
    // Five connections, however long each process takes to start (60 s at most).
    let read = || -> Vec<f64> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("connect-at ")?.parse().ok())
            .collect()
    };
    let start = std::time::Instant::now();
    let at = loop {
        let at = read();
        if at.len() >= 5 {
            break at;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{} connections in 60 s: {at:?}", at.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Between two connections lie the backoff (0.5, 1, 2, 4 s) plus a process start and a
    // handshake: each gap is at least its doubled wait, whatever the machine's speed. At a
    // constant 0.5 s the fourth gap is 0.5 s plus one start-up, far below 4 s.
    let gaps: Vec<f64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().take(4).enumerate() {
        let backoff = 0.5 * f64::from(1u32 << i);
        assert!(*gap >= backoff - 0.01, "wait {i} was {gap:.2} s, less than its backoff {backoff} s: {gaps:?}");
    }
    wait_for(&t, &t.admin_token, &id, "not shown as connected between attempts", |v| {
        v["connection"]["state"] != "connected"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_call_fails_the_call_and_reconnects() {
    let (t, token, id, run, turn) = fault_app(&[], 5000).await;
    let done = call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:crash"), "c1", json!({})).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(done["result"]["error"]["code"], "mcp_connection_lost", "{done:#}");
    // The supervisor reconnects with backoff, re-discovers, and the next call works.
    wait_for(&t, &token, &id, "reconnect", |v| v["connection"]["state"] == "connected").await;
    let (turn, _) = t.turn(&token, &run, "echo").await;
    let done =
        call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:echo"), "c2", json!({"text": "back"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_times_out_and_cancellation_reaches_the_server() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let log_path = log.path().to_str().unwrap().to_owned();
    let (t, token, id, run, turn) = fault_app(&["--log", &log_path], 1000).await;
    let done = call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:hang"), "c1", json!({})).await;
    assert_eq!(done["result"]["error"]["code"], "mcp_timeout", "{done:#}");
    // A cancelled invocation sends notifications/cancelled too.
    let id2 = install(
        &t,
        &token,
        json!({"name": "slow", "transport": fault(&["--log", &log_path]), "default_agent_access": true,
        "request_timeout_ms": 60000}),
    )
    .await;
    wait_for(&t, &token, &id2, "connect", connected).await;
    let (turn, _) = t.turn(&token, &run, "hang").await;
    let tool = format!("mcp:{id2}:tool:hang");
    let r = t.call(&token, &run, &turn, &tool, "c2", json!({})).await;
    let inv = r.body["invocation_id"].as_str().unwrap().to_owned();
    t.post(
        &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
        &token,
        json!({"tool_id": tool, "tool_call_id": "c2", "input_hash": r.body["input_hash"]}),
    )
    .await;
    for _ in 0..100 {
        if std::fs::read_to_string(&log_path).unwrap().matches("hanging").count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = t.post(&format!("/v1/invocations/{inv}/cancel"), &token, json!({})).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let done = wait_final_long(&t, &token, &inv).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    let mut cancels = 0;
    for _ in 0..100 {
        cancels = std::fs::read_to_string(&log_path).unwrap().matches("notifications/cancelled").count();
        if cancels >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cancels, 2, "{}", std::fs::read_to_string(&log_path).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_errors_progress_and_bad_bytes() {
    let (t, token, id, run, turn) = fault_app(&[], 30000).await;
    let tool = |n: &str| format!("mcp:{id}:tool:{n}");
    // isError → failed invocation with the server's text.
    let done = call_approved(&t, &token, &run, &turn, &tool("fail"), "c1", json!({})).await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["result"]["error"]["code"], "mcp_tool_error");
    assert_eq!(done["result"]["error"]["message"], "quota exceeded for key k-42");
    // Invalid UTF-8 is replaced and flagged.
    let done = call_approved(&t, &token, &run, &turn, &tool("badutf8"), "c2", json!({})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["output"]["utf8_replaced"], true);
    assert_eq!(done["result"]["output"]["content"][0]["text"], "caf\u{fffd} \u{fffd}\u{fffd} ok");
    // A 12 MB result (under the 16 MiB message limit) is kept up to the 1 MiB cap, with a
    // marker and the hash of the whole.
    let done = call_approved(&t, &token, &run, &turn, &tool("big"), "c3", json!({"megabytes": 12})).await;
    let out = &done["result"]["output"];
    assert_eq!(out["truncated"], true, "{}", short(&done));
    assert!(out["truncation_marker"].as_str().unwrap().contains("truncated"));
    assert_eq!(out["content"][0]["text"].as_str().unwrap().len(), 1024 * 1024);
    assert!(out["bytes"].as_u64().unwrap() > 12 * 1024 * 1024);
    // Progress notifications become run events.
    let done = call_approved(&t, &token, &run, &turn, &tool("progress"), "c4", json!({})).await;
    assert_eq!(done["status"], "completed");
    let events = t.run_events(&token, &run).await;
    let progress: Vec<&Value> =
        events.iter().filter(|(_, k, _)| k == "execution.progress").map(|(_, _, d)| d).collect();
    assert_eq!(progress.len(), 3, "{events:?}");
    assert_eq!(progress[2]["message"], "step 3");
    assert_eq!(progress[0]["invocation_id"], done["invocation_id"]);
    // 5,000 notifications at once with 2 KB messages, then a last one half a second later: a
    // burst of 10 is stored (messages cut to 1 KiB), then 4 a second; each stored one says
    // how many were skipped before it.
    let done = call_approved(&t, &token, &run, &turn, &tool("progress_flood"), "c5", json!({})).await;
    assert_eq!(done["status"], "completed");
    let events = t.run_events(&token, &run).await;
    let flood: Vec<&Value> = events
        .iter()
        .filter(|(_, k, d)| k == "execution.progress" && d["invocation_id"] == done["invocation_id"])
        .map(|(_, _, d)| d)
        .collect();
    // The burst, then 4 a second while the flood is read, then the last: at most 10 plus 4 a
    // second of the call's own span (its stored start and end; a slow machine reads the flood
    // longer, and may store more), plus one for rounding.
    let at = |field: &str| chrono::DateTime::parse_from_rfc3339(done[field].as_str().unwrap()).unwrap();
    let span = (at("finished_at") - at("started_at")).as_seconds_f64();
    let most = 10.0 + 4.0 * span + 1.0;
    assert!(flood.len() >= 11 && flood.len() as f64 <= most, "{} progress events stored in {span} s", flood.len());
    assert!(flood.iter().all(|d| d["message"].as_str().unwrap().len() <= 1024));
    let burst = flood.iter().filter(|d| d["message"].as_str().unwrap().len() == 1024 && d.get("skipped").is_none());
    assert!(burst.count() >= 10);
    // Skipped ones are counted by the next stored one (none follows the last skipped ones).
    let skipped: u64 = flood.iter().filter_map(|d| d["skipped"].as_u64()).sum();
    assert!(skipped >= 1_000 && flood.len() as u64 + skipped <= 5_001, "{} stored, {skipped} skipped", flood.len());
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    s.chars().take(2000).collect()
}

/// One server's progress notifications never reach another server's calls: a hostile server
/// (the admin's here, so that it sees the test's file) sprays `notifications/progress` for
/// every small token while another user's call on another server reports its own progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_from_one_server_never_reaches_another_servers_call() {
    let dir = tempfile::tempdir().unwrap();
    let spray = dir.path().join("spray");
    let (t, token, id, run, turn) = fault_app(&[], 5000).await;
    let hostile = install(
        &t,
        &t.admin_token,
        json!({"name": "sprayer", "transport": fault(&["--spray-file", spray.to_str().unwrap()]),
               "default_agent_access": true}),
    )
    .await;
    wait_for(&t, &t.admin_token, &hostile, "connect", connected).await;
    std::fs::write(&spray, "").unwrap();
    let mut calls = Vec::new();
    for c in ["p1", "p2", "p3"] {
        let done = call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:progress"), c, json!({})).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        calls.push(done["invocation_id"].clone());
    }
    std::fs::remove_file(&spray).unwrap();
    let events = t.run_events(&token, &run).await;
    let progress: Vec<&Value> =
        events.iter().filter(|(_, k, _)| k == "execution.progress").map(|(_, _, d)| d).collect();
    assert!(progress.iter().all(|d| d["message"] != "injected"), "{progress:#?}");
    for inv in &calls {
        let own: Vec<&&Value> = progress.iter().filter(|d| d["invocation_id"] == *inv).collect();
        assert_eq!(own.len(), 3, "each call keeps its own three steps: {progress:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_of_hundreds_of_megabytes_is_dropped_without_exhausting_memory() {
    let (t, token, id, run, turn) = fault_app(&[], 60000).await;
    let done =
        call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:huge_line"), "c1", json!({"megabytes": 400}))
            .await;
    assert_eq!(done["status"], "failed", "{}", short(&done));
    assert_eq!(done["result"]["error"]["code"], "mcp_message_too_large", "{}", short(&done));
    // The limit is 16 MiB, so the peak resident set stays far below the line's 400 MB.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm_kb: u64 =
        status.lines().find(|l| l.starts_with("VmHWM")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(hwm_kb < 380 * 1024, "peak RSS {hwm_kb} kB");
    // The connection survived.
    let (turn, _) = t.turn(&token, &run, "echo").await;
    let done =
        call_approved(&t, &token, &run, &turn, &format!("mcp:{id}:tool:echo"), "c2", json!({"text": "alive"})).await;
    assert_eq!(done["status"], "completed");
}

/// A server that sends `notifications/tools/list_changed` 2,000 times at once is listed again
/// once or twice, not 2,000 times: notifications coalesce into at most one re-discovery per
/// interval (2 s), and the last change is still picked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_list_changed_costs_one_rediscovery_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (flood, log) = (dir.path().join("flood"), dir.path().join("calls.log"));
    let (t, token, id, _, _) =
        fault_app(&["--flood-file", flood.to_str().unwrap(), "--log", log.to_str().unwrap()], 5000).await;
    std::fs::write(&flood, "").unwrap();
    wait_for(&t, &token, &id, "re-discovery after the flood", |v| {
        v["tools"].as_array().unwrap().iter().any(|x| x["name"] == "remove_me" && x["status"] == "removed")
    })
    .await;
    // Time for 2,000 re-discoveries' worth of listing, had each notification made one.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    let after = logged.split_once("flooded\n").expect("the server flooded").1;
    // One discovery lists 13 tools in pages of 4: 4 `tools/list` requests; one or two
    // discoveries follow the flood (the second for notifications read during the first).
    let lists = after.lines().filter(|l| *l == "tools/list").count();
    assert!((4..=8).contains(&lists), "{lists} tools/list requests after 2,000 list_changed");
    // The server stays connected and usable.
    let v = server(&t, &token, &id).await;
    assert_eq!(v["connection"]["state"], "connected", "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_rediscovers_and_a_tool_removed_after_exposure_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let drop_file = dir.path().join("drop");
    let (t, token, id, run, turn) = fault_app(&["--drop-file", drop_file.to_str().unwrap()], 5000).await;
    let tool = format!("mcp:{id}:tool:remove_me");
    let r = t.call(&token, &run, &turn, &tool, "c1", json!({})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    std::fs::write(&drop_file, "").unwrap();
    wait_for(&t, &token, &id, "re-discovery after list_changed", |v| {
        v["tools"].as_array().unwrap().iter().any(|x| x["name"] == "remove_me" && x["status"] == "removed")
    })
    .await;
    let ladder = t.get(&format!("/v1/tools/{tool}"), &token).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "mcp_tool_removed"), "{ladder:#}");
    let g = t
        .post(
            &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"tool_id": tool, "tool_call_id": "c1", "input_hash": r.body["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK);
    let done = wait_final_long(&t, &token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["result"]["error"]["code"], "tool_gone", "{done:#}");
}

fn sdk_server(count: &str, label: Option<&str>) -> Value {
    let mut args = vec![json!(server_script("many_tools.py")), json!(count)];
    if let Some(l) = label {
        args.push(json!(l));
    }
    json!({"stdio": {"command": python(), "args": args}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_offering_search_never_collide() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("erin").await;
    let a = install(
        &t,
        &token,
        json!({"name": "alpha", "transport": sdk_server("0", Some("alpha")), "default_agent_access": true}),
    )
    .await;
    let b = install(
        &t,
        &token,
        json!({"name": "beta", "transport": sdk_server("0", Some("beta")), "default_agent_access": true}),
    )
    .await;
    wait_for(&t, &token, &a, "alpha", connected).await;
    wait_for(&t, &token, &b, "beta", connected).await;
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "search").await;
    let names: Vec<&str> = exposure["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["kind"] == "mcp_projection")
        .map(|x| x["function_name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{exposure:#}");
    assert_ne!(names[0], names[1]);
    for (i, (fname, label)) in names
        .iter()
        .zip(if names[0].contains(&a[..20].replace(':', "_")) { ["alpha", "beta"] } else { ["beta", "alpha"] })
        .enumerate()
    {
        let done = call_approved(&t, &token, &run, &turn, fname, &format!("s{i}"), json!({"query": "rust"})).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let text = done["result"]["output"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with(label), "{text} via {fname}");
    }
}

/// A real server (the Python SDK) listing 1,001 tools: the discovery fails as a whole with
/// a clear reason (`mcp_discovery_failed`) instead of storing, indexing and embedding an unbounded listing;
/// the connection itself stands and nothing of the server is projected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_more_than_a_thousand_tools_is_refused() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("gus").await;
    let id = install(
        &t,
        &token,
        json!({"name": "huge", "transport": sdk_server("1001", None), "default_agent_access": true}),
    )
    .await;
    let discover =
        |v: &Value| v["stages"].as_array().unwrap().iter().find(|s| s["stage"] == "discover").unwrap().clone();
    let v = wait_for(&t, &token, &id, "a refused discovery", |v| {
        v["connection"]["state"] == "connected" && discover(v)["code"] == "mcp_discovery_failed"
    })
    .await;
    assert_eq!(discover(&v)["reason"], "tools/list failed: tools/list returned more than 1000 tools", "{v:#}");
    assert_eq!(v["tools"].as_array().unwrap().len(), 0, "{v:#}");
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, "create an invoice").await;
    assert!(exposure["tools"].as_array().unwrap().iter().all(|x| x["kind"] != "mcp_projection"), "{exposure:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_real_tools_are_ranked() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("fay").await;
    let run = t.run(&token).await;
    t.code_graph_ready().await;
    let (_, before) = t.turn(&token, &run, "anything").await;
    let core = before["candidate_count"].as_u64().unwrap();
    let id = install(
        &t,
        &token,
        json!({"name": "many", "transport": sdk_server("300", None), "default_agent_access": true}),
    )
    .await;
    let v = wait_for(&t, &token, &id, "300 tools", connected).await;
    assert_eq!(v["tools"].as_array().unwrap().len(), 300);
    let (_, exposure) = t.turn(&token, &run, "archive an old shipment record").await;
    assert_eq!(exposure["strategy"], "ranked_lexical");
    assert_eq!(exposure["candidate_count"], core + 300);
    let tools = exposure["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 20);
    assert!(tools[0]["id"].as_str().unwrap().ends_with(":tool:shipment_archive_0"), "{:#}", tools[0]);
}

/// Issue 20's crowding case: one server's 151 similar tools must not push out the core
/// tools a task plainly needs, and the exposure explains what the shares did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_cannot_crowd_out_the_core_tools() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("gus").await;
    let run = t.run(&token).await;
    t.code_graph_ready().await;
    let id = install(
        &t,
        &token,
        json!({"name": "many", "transport": sdk_server("151", None), "default_agent_access": true}),
    )
    .await;
    wait_for(&t, &token, &id, "151 tools", connected).await;
    let source = format!("mcp:{id}");
    let ids = |e: &Value| -> Vec<String> {
        e["tools"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_owned()).collect()
    };
    let share = |e: &Value| -> Value {
        e["shares"].as_array().unwrap().iter().find(|s| s["source"] == source.as_str()).cloned().unwrap()
    };

    // A task whose words match dozens of the server's tools better than any core tool.
    let task = "list every invoice record, every calendar record, every weather record and every \
                ticket record in the invoice, calendar, weather and ticket systems, then read the file notes.txt";
    let (_, e) = t.turn(&token, &run, task).await;
    assert_eq!(e["tools"].as_array().unwrap().len(), 20, "{e:#}");
    let s = share(&e);
    assert_eq!(s["candidates"], 151, "{s:#}");
    assert_eq!(s["exposed"], 12, "{e:#}");
    assert!(s["held_back"].as_u64().unwrap() > 0, "the shares held nothing back: {e:#}");
    assert!(ids(&e).contains(&"read_open".to_owned()), "{:?}", ids(&e));
    for tool in e["tools"].as_array().unwrap() {
        let expected = if tool["kind"] == "mcp_projection" { source.as_str() } else { "core" };
        assert_eq!(tool["source"], expected, "{tool:#}");
        assert_eq!(tool["inclusion"], "ranked", "{tool:#}");
    }

    // A task that matches nothing: the core tools come first, not the server's by id order.
    let (_, e) = t.turn(&token, &run, "x").await;
    let exposed = ids(&e);
    for core in ["read_open", "write_file"] {
        assert!(exposed.contains(&core.to_owned()), "{core} missing from {exposed:?}");
    }
    let first = &e["tools"][0];
    assert_eq!((first["source"].as_str(), first["inclusion"].as_str()), (Some("core"), Some("core_prior")), "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_servers_are_admin_only_unless_the_deployment_allows_the_command() {
    let mut options = common::Options::default();
    // (Entries are matched on real paths: a bare name stands for the program it resolves to
    // on the server's PATH; tests/it/sandbox_escapes.rs has the refusals.)
    options.runtime.mcp.stdio_allow = vec!["true".into()];
    let t = common::spawn_with(Backend::Sqlite, options).await;
    let user = t.user("ivy").await;
    let r = t.post("/v1/mcp/servers", &user, json!({"name": "mine", "transport": fault(&[])})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    let r = t.post("/v1/mcp/servers", &user, json!({"name": "ok", "transport": {"stdio": {"command": "true"}}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = t.post("/v1/mcp/servers", &t.admin_token, json!({"name": "admins", "transport": fault(&[])})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // HTTP servers run elsewhere: any user may install one.
    let r = t
        .post(
            "/v1/mcp/servers",
            &user,
            json!({"name": "remote", "transport": {"http": {"url": "http://127.0.0.1:9/mcp"}}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_and_never_echoed_and_deployment_wide_servers_are_admin_managed() {
    let t = spawn(Backend::Sqlite).await;
    let user = t.user("gus").await;
    // SAFETY: set once before the server reads it; no other thread reads this variable.
    unsafe { std::env::set_var("MIRA_TEST_FROM_ENV", "from-the-environment") };
    let id = install(
        &t,
        &t.admin_token,
        json!({"name": "shared", "deployment_wide": true, "transport": {"stdio": {"command": python(),
            "args": [server_script("fault_server.py"), "--api-key-in-args", "sk-in-the-arguments-7"],
            "env": {"API_KEY": "sk-very-secret-42", "OTHER": {"from_env": "MIRA_TEST_FROM_ENV"}}}}}),
    )
    .await;
    let v = server(&t, &user, &id).await;
    assert!(!v.to_string().contains("sk-very-secret-42"), "{v}");
    // The admin's arguments are the admin's: a user of the shared server sees the command's
    // name only (the admin, who manages it, sees them).
    assert!(!v.to_string().contains("sk-in-the-arguments-7"), "{v}");
    assert!(v["config"]["stdio"].get("args").is_none(), "{v}");
    let command = std::path::Path::new(&python()).file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(v["config"]["stdio"]["command"], command);
    let managed = server(&t, &t.admin_token, &id).await;
    assert_eq!(managed["config"]["stdio"]["args"][2], "sk-in-the-arguments-7");

    assert_eq!(v["config"]["stdio"]["env"]["API_KEY"]["source"], "encrypted");
    assert_eq!(v["config"]["stdio"]["env"]["OTHER"]["from_env"], "MIRA_TEST_FROM_ENV");
    assert_eq!(v["deployment_wide"], true);
    let row: (String, String) =
        sqlx::query_as(sqlx::AssertSqlSafe("SELECT config, secrets FROM mcp_servers".to_owned()))
            .fetch_one(&sqlx::SqlitePool::connect(&t.db.url).await.unwrap())
            .await
            .unwrap();
    assert!(!row.0.contains("sk-very-secret") && !row.1.contains("sk-very-secret"));
    wait_for(&t, &user, &id, "connect", connected).await;
    let r = t
        .request(reqwest::Method::PATCH, &format!("/v1/mcp/servers/{id}"), Some(&user), Some(json!({"enabled": false})))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    let r =
        t.post("/v1/mcp/servers", &user, json!({"name": "x", "deployment_wide": true, "transport": fault(&[])})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = t.post("/v1/mcp/servers", &user, json!({"name": "x", "transport": {"http": {"url": "ftp://x"}}})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"));
}

/// A deployment-wide server's stderr and error details are its managers': a user who looks at
/// a failing one (its view, a tool's detail) or whose call it crashes never reads them; the
/// admin does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_servers_output_and_errors_are_its_managers() {
    let t = spawn(Backend::Sqlite).await;
    let user = t.user("ivy").await;
    let failing = install(
        &t,
        &t.admin_token,
        json!({"name": "broken", "deployment_wide": true, "transport": fault(&["--crash-at-start"])}),
    )
    .await;
    let secret = "nonexistent/config.toml";
    wait_for(&t, &t.admin_token, &failing, "the failure and its stderr", |v| v.to_string().contains(secret)).await;
    let seen = server(&t, &user, &failing).await;
    assert!(!seen.to_string().contains(secret), "{seen:#}");
    assert_eq!(seen["connection"]["last_error"], mira::mcp::ERROR_SHOWN_TO_MANAGERS, "{seen:#}");
    let detail = t.get(&format!("/v1/tools/mcp:{failing}:tool:echo"), &user).await.body;
    assert!(!detail.to_string().contains(secret), "{detail:#}");

    let crashing = install(
        &t,
        &t.admin_token,
        json!({"name": "shared", "deployment_wide": true, "default_agent_access": true, "transport": fault(&[])}),
    )
    .await;
    wait_for(&t, &t.admin_token, &crashing, "connect", connected).await;
    let run = t.run(&user).await;
    let (turn, _) = t.turn(&user, &run, "crash").await;
    let done = call_approved(&t, &user, &run, &turn, &format!("mcp:{crashing}:tool:crash"), "c1", json!({})).await;
    assert_eq!(done["result"]["error"]["code"], "mcp_connection_lost", "{done:#}");
    assert!(!done.to_string().contains("segmentation fault"), "{done:#}");
}

/// A TCP listener that records every byte any client sends it and answers nothing useful
/// (a 500 to each request), standing for a user's own HTTP endpoint.
struct Listener {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Listener {
    async fn start() -> Listener {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", l.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, c) = (seen.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = l.accept().await {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(300), sock.read(&mut buf)).await {
                        if n == 0 {
                            break;
                        }
                        s.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = sock
                        .write_all(
                            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        Listener { url, seen, connections }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }
}

/// Issue 13.2: a non-admin installs an HTTP MCP server whose header is
/// `{"from_env": "MIRA_BRAVE_API_KEY"}` pointing at their own listener. The install is 403
/// `server_env_reference` (stdio env alike), nothing reaches the listener; a row stored
/// that way before the fix connects to nothing either, and a literal header value (the
/// user's own secret) is stored sealed and never returned.
async fn from_env_is_refused_to_non_admins_and_no_server_secret_leaves(backend: Backend) {
    const SECRET: &str = "brave-key-of-the-server-7f3a9c";
    // SAFETY: set before the server reads it; nothing else in this test process reads it.
    unsafe { std::env::set_var("MIRA_BRAVE_API_KEY", SECRET) };
    let mut t = spawn(backend).await;
    let mallory = t.user("mallory").await;
    let listener = Listener::start().await;
    let leak = json!({"name": "leak", "transport": {"http": {"url": listener.url,
        "headers": {"X-Leak": {"from_env": "MIRA_BRAVE_API_KEY"}}}}});
    let r = t.post("/v1/mcp/servers", &mallory, leak.clone()).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "server_env_reference"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains("X-Leak"), "{r:?}");
    for var in ["DATABASE_URL", "MIRA_SECRET_KEY"] {
        let body = json!({"name": "leak", "transport": {"http": {"url": listener.url, "headers": {"X-Leak": {"from_env": var}}}}});
        let r = t.post("/v1/mcp/servers", &mallory, body).await;
        assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "server_env_reference"), "{r:?}");
    }
    let stdio = json!({"name": "leak", "transport": {"stdio": {"command": python(),
        "args": [server_script("fault_server.py")], "env": {"K": {"from_env": "MIRA_BRAVE_API_KEY"}}}}});
    let r = t.post("/v1/mcp/servers", &mallory, stdio).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "server_env_reference"), "{r:?}");
    let listed = t.get("/v1/mcp/servers", &mallory).await;
    assert_eq!(listed.body["servers"].as_array().unwrap().len(), 0, "{listed:?}");

    // The user's own header value is accepted, sealed, never echoed; it reaches their listener.
    let own = json!({"name": "own", "request_timeout_ms": 1000, "transport": {"http": {"url": listener.url,
        "headers": {"X-Own": "users-own-token-55"}}}});
    let id = install(&t, &mallory, own).await;
    let v = wait_for(&t, &mallory, &id, "a connect attempt", |v| v["connection"]["state"] == "failed").await;
    assert!(!v.to_string().contains("users-own-token-55"), "{v}");
    assert_eq!(v["config"]["http"]["headers"]["X-Own"]["source"], "encrypted");
    assert!(listener.text().contains("users-own-token-55"), "{}", listener.text());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    let (config, sealed): (String, String) = sqlx::query_as("SELECT config, secrets FROM mcp_servers WHERE id = $1")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!config.contains("users-own-token-55") && !sealed.contains("users-own-token-55"));

    // A row stored with a from_env reference before non-admins were refused: after a restart
    // the server refuses to read the variable, and the listener never sees the secret.
    t.stop().await;
    let stale = json!({"http": {"url": listener.url, "headers": {"X-Leak": {"source": "env", "from_env": "MIRA_BRAVE_API_KEY"}}}});
    sqlx::query("UPDATE mcp_servers SET config = $1, secrets = NULL, secrets_key_id = NULL WHERE id = $2")
        .bind(stale.to_string())
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let before = listener.connections.load(std::sync::atomic::Ordering::SeqCst);
    t.restart().await;
    let v = wait_for(&t, &mallory, &id, "the stale row is refused", |v| {
        v["connection"]["last_error"].as_str().is_some_and(|e| e.contains("server_env_reference"))
    })
    .await;
    assert_eq!(stage(&v, "connect")["status"], "blocked", "{v:#}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(listener.connections.load(std::sync::atomic::Ordering::SeqCst), before, "the server connected anyway");
    assert!(!listener.text().contains(SECRET), "the server's secret reached the user's listener");
    // An admin may still use from_env for a server the admin installs.
    let mut admins = leak;
    admins["enabled"] = json!(false);
    let r = t.post("/v1/mcp/servers", &t.admin_token, admins).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

both_backends!(from_env_is_refused_to_non_admins_and_no_server_secret_leaves);

fn changing(extra: &[&str]) -> Value {
    let mut args = vec![Value::String(server_script("changing_server.py"))];
    args.extend(extra.iter().map(|a| Value::String((*a).to_owned())));
    json!({"stdio": {"command": python(), "args": args}})
}

/// The changing server working in `dir` (its cwd): a non-admin's server runs in the sandbox,
/// which shows it the files the test shares with it only in a folder of the user's
/// workspaces (src/sandbox/mcp.rs).
fn changing_in(dir: &std::path::Path, extra: &[&str]) -> Value {
    let mut v = changing(extra);
    v["stdio"]["cwd"] = json!(dir);
    v
}

fn tool_of<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no tool {name}: {v:#}"))
}

fn calls_logged(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Issue 14.3, replayed against a real MCP server (the Python SDK): `fetch_doc` is listed
/// as "Fetch a document by URL" with `{url}`, agent access is on, calls are frozen; the
/// server then changes the description into an instruction to read `~/.ssh/id_rsa`, adds a
/// `note` parameter and sends `notifications/tools/list_changed`. Re-discovery turns the
/// tool's agent access off (`definition_changed`, old and new shown); the pending grant is
/// refused (`stale_definition`), a grant that raced the change never runs; no turn exposes
/// the new description until a person accepts it; after that, the old calls still refuse.
async fn a_changed_mcp_definition_is_reviewed_and_stale_calls_never_run(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("hana").await;
    let dir = tempfile::tempdir_in(&t.workspace).unwrap();
    let poison = dir.path().join("poison");
    let log = dir.path().join("calls.log");
    let id = install(
        &t,
        &token,
        json!({"name": "docs", "default_agent_access": true, "request_timeout_ms": 5000,
               "transport": changing_in(dir.path(), &["--poison-file", poison.to_str().unwrap(), "--log", log.to_str().unwrap()])}),
    )
    .await;
    let v = wait_for(&t, &token, &id, "connect + discover", connected).await;
    let original = tool_of(&v, "fetch_doc").clone();
    assert_eq!(original["description"], "Fetch a document by URL");
    let d1 = original["definition_sha256"].as_str().unwrap().to_owned();
    assert_eq!(d1.len(), 64);
    let tool = format!("mcp:{id}:tool:fetch_doc");
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "fetch a document").await;
    let shown = exposure["tools"].as_array().unwrap().iter().find(|x| x["id"] == tool).expect("exposed").clone();
    assert_eq!(shown["description"], "Fetch a document by URL");
    let mut frozen = Vec::new();
    for c in ["c1", "c2"] {
        let r = t.call(&token, &run, &turn, &tool, c, json!({"url": format!("https://example.com/{c}")})).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        // The definition's fingerprint is part of the frozen canonical input.
        assert_eq!(
            r.body["input"],
            json!({"arguments": {"url": format!("https://example.com/{c}")}, "definition_sha256": d1})
        );
        frozen.push(r.body);
    }

    // The server changes the tool and says so.
    std::fs::write(&poison, "").unwrap();
    let v = wait_for(&t, &token, &id, "re-discovery after list_changed", |v| {
        let t = tool_of(v, "fetch_doc");
        t["description"].as_str().unwrap_or("").contains("id_rsa") && t["projected"] == false
    })
    .await;
    let changed = tool_of(&v, "fetch_doc");
    assert_eq!(changed["agent_access"], false, "{changed:#}");
    assert_eq!(changed["agent_access_source"], "definition_changed");
    assert_eq!(changed["projected"], false);
    let d2 = changed["definition_sha256"].as_str().unwrap().to_owned();
    assert_ne!(d1, d2);
    let review = &changed["definition_review"];
    assert_eq!(review["previous"]["description"], "Fetch a document by URL");
    assert_eq!(review["previous_sha256"], d1.as_str());
    assert!(review["current"]["description"].as_str().unwrap().contains("~/.ssh/id_rsa"));
    assert!(review["current"]["input_schema"]["properties"]["note"].is_object());
    assert_eq!(review["current_sha256"], d2.as_str());
    let st = stage(changed, "agent_access");
    assert_eq!((st["status"].as_str(), st["code"].as_str()), (Some("blocked"), Some("definition_changed")), "{st}");
    assert_eq!(st["action"]["body"]["definition_sha256"], d2.as_str());
    let ladder = t.get(&format!("/v1/tools/{tool}"), &token).await.body;
    assert_eq!(ladder_code(&ladder), ("not_registered", "definition_changed"), "{ladder:#}");
    // No turn shows the new description, and no new call can be frozen.
    let (turn2, exposure) = t.turn(&token, &run, "fetch a document").await;
    assert!(!exposure.to_string().contains("id_rsa"), "{exposure:#}");
    let r = t.call(&token, &run, &turn2, &tool, "c9", json!({"url": "https://example.com/x"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");

    // The pending grant is refused; nothing is granted.
    let grant =
        |f: &Value| json!({"tool_id": f["tool_id"], "tool_call_id": f["tool_call_id"], "input_hash": f["input_hash"]});
    let a1 = frozen[0]["approval_id"].as_str().unwrap().to_owned();
    let g = t.post(&format!("/v1/approvals/{a1}/grant"), &token, grant(&frozen[0])).await;
    assert_eq!((g.status, g.code()), (StatusCode::CONFLICT, "stale_definition"), "{g:?}");
    assert_eq!(g.body["error"]["details"]["frozen_sha256"], d1.as_str());
    assert_eq!(t.get(&format!("/v1/approvals/{a1}"), &token).await.body["status"], "pending");
    // A grant that raced the change (stored as granted, queued) is refused by the harness.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    let inv2 = frozen[1]["invocation_id"].as_str().unwrap();
    sqlx::query("UPDATE approvals SET status = 'granted' WHERE invocation_id = $1")
        .bind(inv2)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE invocations SET status = 'queued' WHERE id = $1").bind(inv2).execute(&pool).await.unwrap();
    pool.close().await;
    let done = wait_final_long(&t, &token, inv2).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(done["result"]["error"]["code"], "stale_definition", "{done:#}");
    assert!(calls_logged(&log).is_empty(), "the server was called: {:?}", calls_logged(&log));

    // Accepting needs the definition the person read.
    let put_path = format!("/v1/mcp/servers/{id}/tools/fetch_doc/agent-access");
    let put = |body: Value| t.request(reqwest::Method::PUT, &put_path, Some(&token), Some(body));
    let r = put(json!({"enabled": true, "definition_sha256": d1})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "definition_changed"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["current_sha256"], d2.as_str());
    let r = put(json!({"enabled": true, "definition_sha256": d2})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let accepted = tool_of(&r.body, "fetch_doc");
    assert_eq!(accepted["agent_access"], true);
    assert!(accepted["definition_review"].is_null(), "{accepted:#}");
    // Still: the calls frozen against the old definition never run.
    let g = t.post(&format!("/v1/approvals/{a1}/grant"), &token, grant(&frozen[0])).await;
    assert_eq!((g.status, g.code()), (StatusCode::CONFLICT, "stale_definition"), "{g:?}");
    // A call frozen now carries the accepted definition and runs.
    let (turn3, exposure) = t.turn(&token, &run, "fetch a document").await;
    assert!(exposure.to_string().contains("id_rsa"), "the accepted definition is exposed");
    let done = call_approved(&t, &token, &run, &turn3, &tool, "c3", json!({"url": "https://example.com/c3"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["input"]["definition_sha256"], d2.as_str());
    let calls = calls_logged(&log);
    assert_eq!(calls, vec![json!({"name": "fetch_doc", "arguments": {"url": "https://example.com/c3"}})]);
    assert!(server(&t, &token, &id).await.to_string().contains("definition_sha256"));
    let _ = &original;
}

both_backends!(a_changed_mcp_definition_is_reviewed_and_stale_calls_never_run);

/// A server that changes a tool's definition back before anyone reviewed it ends the review;
/// a change while agent access was off starts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_that_changes_back_ends_its_review_and_access_off_needs_none() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("ida").await;
    let dir = tempfile::tempdir_in(&t.workspace).unwrap();
    let poison = dir.path().join("poison");
    let id = install(
        &t,
        &token,
        json!({"name": "docs", "default_agent_access": true, "transport": changing_in(dir.path(), &["--poison-file", poison.to_str().unwrap()])}),
    )
    .await;
    wait_for(&t, &token, &id, "connect", connected).await;
    std::fs::write(&poison, "").unwrap();
    wait_for(&t, &token, &id, "review", |v| tool_of(v, "fetch_doc")["definition_review"].is_object()).await;
    std::fs::remove_file(&poison).unwrap();
    let v = wait_for(&t, &token, &id, "review ended", |v| tool_of(v, "fetch_doc")["definition_review"].is_null()).await;
    assert_eq!(tool_of(&v, "fetch_doc")["agent_access"], true, "{v:#}");
    let ladder = t.get(&format!("/v1/tools/mcp:{id}:tool:fetch_doc"), &token).await.body;
    assert_eq!(ladder["state"], "available", "{ladder:#}");
    // Agent access off: a change is simply what the owner sees when turning it on.
    access(&t, &token, &id, "fetch_doc", false).await;
    std::fs::write(&poison, "").unwrap();
    let v = wait_for(&t, &token, &id, "changed", |v| {
        tool_of(v, "fetch_doc")["description"].as_str().unwrap_or("").contains("id_rsa")
    })
    .await;
    assert!(tool_of(&v, "fetch_doc")["definition_review"].is_null(), "{v:#}");
    assert_eq!(tool_of(&v, "fetch_doc")["agent_access_source"], "tool");
}

/// Issue 14.8: a real server (the Python SDK) lists schemas in every dialect — draft-04
/// declared and undeclared (boolean `exclusiveMinimum`, `id` + `$ref`), draft-06, draft-07
/// (tuple `items`), 2019-09, 2020-12, none — and one that compiles in no dialect. Discovery
/// keeps them all, each validated in its own dialect; only the broken one is `unavailable`
/// with `schema_unusable`, and the others are exposed and callable.
async fn schemas_are_read_in_their_dialect_and_one_broken_tool_spoils_nothing(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("jo").await;
    let id = install(
        &t,
        &token,
        json!({"name": "dialects", "default_agent_access": true, "transport": changing(&["--dialects"])}),
    )
    .await;
    let v = wait_for(&t, &token, &id, "connect + discover", connected).await;
    let dialect = |name: &str| {
        let d = &tool_of(&v, name)["input_schema_dialect"];
        (d["dialect"].as_str().unwrap_or("none").to_owned(), d["declared"].as_bool().unwrap_or(false))
    };
    assert_eq!(dialect("d04_declared"), ("draft-04".into(), true));
    assert_eq!(dialect("d04_undeclared"), ("draft-04".into(), false));
    assert_eq!(dialect("d04_id"), ("draft-04".into(), false));
    assert_eq!(dialect("d06"), ("draft-06".into(), true));
    assert_eq!(dialect("d07"), ("draft-07".into(), true));
    assert_eq!(dialect("d2019"), ("2019-09".into(), true));
    assert_eq!(dialect("d2020"), ("2020-12".into(), true));
    assert_eq!(dialect("undeclared"), ("2020-12".into(), false));
    let broken = tool_of(&v, "broken");
    assert_eq!(broken["status"], "ok", "listed, not rejected: {broken:#}");
    assert!(broken["schema_problem"].as_str().unwrap().contains("strnig"), "{broken:#}");
    assert_eq!(stage(broken, "tool_exposure")["code"], "schema_unusable");
    assert_eq!(stage(&v, "discover")["status"], "ok", "{v:#}");
    let ladder = t.get(&format!("/v1/tools/mcp:{id}:tool:broken"), &token).await.body;
    assert_eq!(ladder_code(&ladder), ("unavailable", "schema_unusable"), "{ladder:#}");
    assert!(ladder["reason"]["message"].as_str().unwrap().contains("strnig"), "{ladder:#}");
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "numbers pairs pages").await;
    let exposed: Vec<&str> = exposure["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["kind"] == "mcp_projection")
        .map(|x| x["id"].as_str().unwrap().rsplit(':').next().unwrap())
        .collect();
    assert_eq!(exposed.len(), 9, "every tool but the broken one: {exposed:?}");
    assert!(!exposed.contains(&"broken"));
    // Each input is validated in its schema's dialect before freezing.
    let tool = |n: &str| format!("mcp:{id}:tool:{n}");
    let cases = [
        ("d04_declared", json!({"n": 0}), false),
        ("d04_declared", json!({"n": 10}), false),
        ("d04_declared", json!({"n": 5}), true),
        ("d04_undeclared", json!({"n": 0}), false),
        ("d04_undeclared", json!({"n": 0.5}), true),
        ("d04_id", json!({"page": 0}), false),
        ("d04_id", json!({"page": 3}), true),
        ("d06", json!({"n": 0}), false),
        ("d07", json!({"pair": ["a", "b"]}), false),
        ("d07", json!({"pair": ["a", 1]}), true),
        ("d2019", json!({"n": 0}), false),
        ("d2020", json!({"pair": [1, "a"]}), false),
        ("d2020", json!({"pair": ["a", 1]}), true),
        ("undeclared", json!({"n": 0}), false),
        ("undeclared", json!({"n": 1}), true),
    ];
    for (i, (name, input, ok)) in cases.iter().enumerate() {
        let r = t.call(&token, &run, &turn, &tool(name), &format!("v{i}"), input.clone()).await;
        if *ok {
            assert_eq!(r.body["status"], "awaiting_approval", "{name} {input}: {r:?}");
        } else {
            assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{name} {input}: {r:?}");
        }
    }
    let done = call_approved(&t, &token, &run, &turn, &tool("d04_undeclared"), "run1", json!({"n": 2})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let r = t.call(&token, &run, &turn, &tool("broken"), "b1", json!({"a": "x"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "unavailable"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["ladder"]["reason"]["code"], "schema_unusable");
}

both_backends!(schemas_are_read_in_their_dialect_and_one_broken_tool_spoils_nothing);

/// `mira bench exposure` loads a tool set in which one tool's schema uses draft-04 forms and
/// another compiles in no dialect: the draft-04 tool is ranked, the broken one is reported
/// and left out, and the benchmark runs (issue 14.8's 527-tool set refused whole).
#[test]
fn the_exposure_bench_loads_a_set_with_draft04_and_broken_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let mut tools = vec![
        json!({"id": "weather_forecast", "description": "Forecast the weather for a city",
               "input_schema": {"type": "object", "properties": {"days": {"type": "integer", "minimum": 0, "exclusiveMinimum": true}}}}),
        json!({"id": "broken_tool", "description": "Broken weather schema",
               "input_schema": {"type": "object", "properties": {"a": {"type": "strnig"}}}}),
        json!({"id": "legacy_sum", "description": "Add numbers",
               "input_schema": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
                                "properties": {"a": {"type": "number", "maximum": 5, "exclusiveMaximum": true}}}}),
    ];
    for i in 0..30 {
        tools.push(json!({"id": format!("filler_{i}"), "description": format!("Unrelated chore number {i}")}));
    }
    let tools_path = dir.path().join("tools.json");
    std::fs::write(&tools_path, serde_json::to_string(&tools).unwrap()).unwrap();
    let queries_path = dir.path().join("queries.jsonl");
    std::fs::write(
        &queries_path,
        "{\"query\": \"what is the weather forecast\", \"gold\": [\"weather_forecast\"]}\n{\"query\": \"add two numbers\", \"gold\": [\"legacy_sum\"]}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["bench", "exposure", "--ranker", "lexical", "--series", "21", "--series-turns", "5", "--tools"])
        .arg(&tools_path)
        .arg("--queries")
        .arg(&queries_path)
        .env_remove("MIRA_EMBEDDING_MODEL_DIR")
        .env_remove("MIRA_EMBEDDING_MODEL")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("schema_unusable: 1 tools left out"), "{stdout}");
    assert!(stdout.contains("broken_tool: ") && stdout.contains("strnig"), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("| lexical |")).unwrap_or_else(|| panic!("{stdout}"));
    // Both gold tools (one of them draft-04) are found in the top 5: Recall@5 = 1.
    assert!(row.starts_with("| lexical | 1.0000 |"), "{row}");
    assert!(stdout.lines().any(|l| l.starts_with("| 21 |")), "{stdout}");
}

/// Pids of processes whose command line contains `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        if String::from_utf8_lossy(&cmd).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Options for the lost-server tests: no periodic health check within the test (10 min), so
/// only the watch of the transport itself can notice the loss; and the first reconnect 3 s
/// after it (not 0.5 s), so the lost state, and the `last_error` saying why, are there to be
/// seen however slowly the test polls.
fn for_lost_servers() -> common::Options {
    let mut options = common::Options::default();
    options.runtime.mcp.health_interval = Duration::from_secs(600);
    options.runtime.mcp.backoff_min = Duration::from_secs(3);
    options
}

/// Polls until the server shows as lost — connect stage not ok, connection not `connected`,
/// the tool `unavailable` (`mcp_not_connected`) and out of a new turn's exposure — and
/// fails when that takes longer than 20 s after `since` (the health check is off: see
/// [`for_lost_servers`]; the caller's `last_error` says which watch noticed). Returns the
/// first server view that showed it lost.
async fn shown_as_lost(t: &TestApp, token: &str, id: &str, tool: &str, since: std::time::Instant) -> Value {
    let run = t.run(token).await;
    let mut first_lost = None;
    loop {
        let v = server(t, token, id).await;
        // The ladder and a turn only once the server view says lost (one request a poll).
        if stage(&v, "connect")["status"] != "ok" && v["connection"]["state"] != "connected" {
            let first = first_lost.get_or_insert_with(|| v.clone());
            let ladder = t.get(&format!("/v1/tools/{tool}"), token).await.body;
            // The state the ladder names, unless a reconnect attempt changed it meanwhile.
            let same = server(t, token, id).await["connection"]["state"] == v["connection"]["state"];
            let (_, exposure) = t.turn(token, &run, "fetch a document").await;
            if ladder["state"] == "unavailable" && !exposure.to_string().contains(tool) && same {
                assert_eq!(ladder["reason"]["code"], "mcp_not_connected", "{ladder:#}");
                let state = v["connection"]["state"].as_str().unwrap();
                assert!(ladder["reason"]["message"].as_str().unwrap().contains(state), "{ladder:#}");
                return first.clone();
            }
        }
        assert!(since.elapsed() < Duration::from_secs(20), "still shown as connected after 20 s: {v:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 14.7 over stdio: `kill -9` of the server process — one that started a helper
/// which still holds its pipes, so no end-of-file comes — shows at once (the process exit is
/// watched; within 1 s on an idle machine): the connect stage is not ok, the tool is
/// unavailable with the reason and out of every exposure; the helper dies with it, and the
/// supervisor reconnects as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stdio_server_shows_as_lost_within_a_second() {
    let t = common::spawn_with(Backend::Sqlite, for_lost_servers()).await;
    // An admin's server (unsandboxed): a non-admin's runs in its own PID namespace, where the
    // helper dies with the server and its pipes close with it (an end-of-file comes at once).
    let token = t.admin_token.clone();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("kill-me.log");
    let marker = marker.to_str().unwrap();
    let id = install(
        &t,
        &token,
        json!({"name": "victim", "default_agent_access": true, "transport": changing(&["--log", marker, "--helper"])}),
    )
    .await;
    wait_for(&t, &token, &id, "connect", connected).await;
    let tool = format!("mcp:{id}:tool:fetch_doc");
    let ladder = t.get(&format!("/v1/tools/{tool}"), &token).await.body;
    assert_eq!(ladder["state"], "available", "{ladder:#}");
    let pids = pids_with(marker);
    assert_eq!(pids.len(), 1, "{pids:?}");
    // SAFETY: getpgid only reads; the server leads its own process group.
    let group = unsafe { libc::getpgid(pids[0]) };
    assert_eq!(group, pids[0]);
    // SAFETY: kill only sends a signal to the server process this test started.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    let v = shown_as_lost(&t, &token, &id, &tool, std::time::Instant::now()).await;
    // Noticed by the watch of the process's exit (not an end-of-file, not a health check).
    assert!(v["connection"]["last_error"].as_str().unwrap().contains("exited"), "{v:#}");
    // The helper went with it (the whole process group is killed; 10 s at most to be reaped).
    for _ in 0..500 {
        // SAFETY: signal 0 only checks whether the group still has a member.
        if unsafe { libc::kill(-group, 0) } != 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: as above.
    assert_ne!(unsafe { libc::kill(-group, 0) }, 0, "a process of the dead server's group survived");
    // Reconnect behaviour is unchanged: backoff, reconnect, re-discover, available again.
    wait_for(&t, &token, &id, "reconnect", connected).await;
    let ladder = t.get(&format!("/v1/tools/{tool}"), &token).await.body;
    assert_eq!(ladder["state"], "available", "{ladder:#}");
}

/// Issue 14.7 over Streamable HTTP: `kill -9` of a server (the Python SDK) shows at once
/// (within 1 s on an idle machine) — the broken event stream is noticed and confirmed with a
/// ping — instead of at the next health check (off here); a call in the meantime is not
/// needed. When the server is back, the supervisor reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_http_server_shows_as_lost_within_a_second() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let start = || {
        tokio::process::Command::new(python())
            .arg(server_script("changing_server.py"))
            .args(["--http", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let up = || async {
        for _ in 0..600 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the HTTP server did not start in 30 s");
    };
    let mut child = start();
    up().await;
    let t = common::spawn_with(Backend::Sqlite, for_lost_servers()).await;
    let token = t.user("lee").await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let id = install(
        &t,
        &token,
        json!({"name": "remote", "default_agent_access": true, "transport": {"http": {"url": url}}}),
    )
    .await;
    wait_for(&t, &token, &id, "connect", connected).await;
    let tool = format!("mcp:{id}:tool:fetch_doc");
    assert_eq!(t.get(&format!("/v1/tools/{tool}"), &token).await.body["state"], "available");
    // Let the standalone event stream settle, as it would on a server that has been up a while.
    // (Not needed for the outcome: a stream not yet open fails to open, and is reported alike.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.start_kill().unwrap();
    let killed = std::time::Instant::now();
    child.wait().await.unwrap();
    let v = shown_as_lost(&t, &token, &id, &tool, killed).await;
    // Noticed by the watch of the transport, confirmed by a ping (not a health check).
    assert!(v["connection"]["last_error"].as_str().unwrap().contains("ping failed"), "{v:#}");
    let mut child = start();
    up().await;
    wait_for(&t, &token, &id, "reconnect", connected).await;
    assert_eq!(t.get(&format!("/v1/tools/{tool}"), &token).await.body["state"], "available");
    child.kill().await.unwrap();
}

/// Issue 20's skill-private runtime: an MCP tool a skill makes private leaves the main
/// exposure (`not_public`, `skill_private`), its sub-runs see it with only what the manifest
/// allows, a call inside the skill is approved and evidenced as outside, and another user
/// cannot run the skill.
async fn skill_private_tools_stay_inside_the_skill(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("sam").await;
    let id = install(
        &t,
        &token,
        json!({"name": "alpha", "transport": sdk_server("0", Some("alpha")), "default_agent_access": true}),
    )
    .await;
    wait_for(&t, &token, &id, "alpha", connected).await;
    let tool = format!("mcp:{id}:tool:search");
    let ids = |e: &Value| -> Vec<String> {
        e["tools"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_owned()).collect()
    };
    let main = t.run(&token).await;
    let (_, before) = t.turn(&token, &main, "search").await;
    assert!(ids(&before).contains(&tool), "{before:#}");

    // Bad manifests are refused with the field named; nothing is stored.
    for (body, field) in [
        (json!({"name": "r", "private_tools": ["read_open"]}), "private_tools"),
        (json!({"name": "r", "private_tools": ["mcp:nope:tool:x"]}), "private_tools"),
        (json!({"name": "r", "private_tools": []}), "private_tools"),
        (json!({"name": "bad name!", "private_tools": [tool]}), "name"),
    ] {
        let r = t.post("/v1/skills", &token, body.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{body}: {r:?}");
        assert_eq!(r.body["error"]["details"]["field"], field, "{r:?}");
    }
    let r = t
        .post(
            "/v1/skills",
            &token,
            json!({"name": "researcher", "description": "searches alpha", "private_tools": [tool], "allow_public": ["read_open"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let skill = r.body["id"].as_str().unwrap().to_owned();
    let again = t.post("/v1/skills", &token, json!({"name": "researcher", "private_tools": [tool]})).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "name_taken"), "{again:?}");
    assert_eq!(t.get("/v1/skills", &token).await.body["skills"].as_array().unwrap().len(), 1);

    // The main run: the private tool is gone from the exposure and says why.
    let (main_turn, after) = t.turn(&token, &main, "search").await;
    assert!(!ids(&after).contains(&tool), "{after:#}");
    let ladder = t.get(&format!("/v1/tools/{tool}?turn={main_turn}"), &token).await.body;
    assert_eq!(ladder_code(&ladder), ("not_public", "skill_private"), "{ladder:#}");
    let r = t.call(&token, &main, &main_turn, &tool, "m1", json!({"query": "rust"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.body["error"]["details"]["ladder"]["reason"]["code"], "skill_private", "{r:?}");

    // The skill's sub-run: its private tool and the one public tool its manifest allows.
    let r = t.post("/v1/runs", &token, json!({"skill_id": skill})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["skill_id"], skill.as_str());
    let sub = r.body["id"].as_str().unwrap().to_owned();
    let (sub_turn, exposure) = t.turn(&token, &sub, "search").await;
    let mut seen = ids(&exposure);
    seen.sort();
    assert_eq!(seen, vec![tool.clone(), "read_open".to_owned()], "{exposure:#}");
    let ladder = t.get(&format!("/v1/tools/grep?turn={sub_turn}"), &token).await.body;
    assert_eq!(ladder_code(&ladder), ("not_public", "not_in_skill_manifest"), "{ladder:#}");
    let done = call_approved(&t, &token, &sub, &sub_turn, &tool, "s1", json!({"query": "rust"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["evidence_ids"].as_array().map(Vec::len), Some(1), "{done:#}");

    // Another user can neither see nor run the skill, and keeps their own exposure.
    let other = t.user("tia").await;
    assert_eq!(t.get(&format!("/v1/skills/{skill}"), &other).await.status, StatusCode::NOT_FOUND);
    let r = t.post("/v1/runs", &other, json!({"skill_id": skill})).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{r:?}");
}

both_backends!(skill_private_tools_stay_inside_the_skill);
