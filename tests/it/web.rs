//! The control-plane page: the embedded files served by `mira serve` with their security
//! headers, the live approval inbox stream it follows, and the page itself driven end to end
//! in a real browser (Debian's chromium through playwright-core, installed by
//! `scripts/setup-web.sh`): `tests/web/e2e.mjs` signs in, watches an approval appear without a
//! reload, approves it, sees the evidence arrive on the run timeline (also across a dropped
//! connection), registers, renames and revokes a device, adds a GitHub connection to a closed
//! local port as the admin (its check finds it unreachable, every GitHub tool
//! `connection_unreachable`, its token nowhere in the API or the page), checks, disables,
//! enables, replaces its token and deletes it, and visits every view, saving screenshots under
//! `tests/artifacts/web/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{Backend, TestTool, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_is_embedded_and_served_with_security_headers() {
    let t = spawn(Backend::Sqlite).await;
    let c = &t.client;

    let index = c.get(format!("{}/", t.base)).send().await.unwrap();
    assert_eq!(index.status(), StatusCode::OK);
    let h = index.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().unwrap();
    for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(part), "CSP lacks {part}: {csp}");
    }
    assert!(!csp.contains("script-src 'self' 'unsafe"), "scripts must not be allowed inline: {csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["x-frame-options"], "DENY");
    let etag = h["etag"].to_str().unwrap().to_owned();
    let html = index.text().await.unwrap();
    assert!(html.contains(r#"<script type="module" src="/app.js"></script>"#));
    assert!(!html.contains("http://") && !html.contains("https://"), "the page must load nothing from elsewhere");

    // Revalidation: the same ETag answers 304 with no body.
    let again = c.get(format!("{}/", t.base)).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert!(again.bytes().await.unwrap().is_empty());

    // Every embedded file is served with its type and is byte-identical to web/.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("web");
    for (path, mime) in [
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/js/sse.js", "text/javascript; charset=utf-8"),
        ("/app.css", "text/css; charset=utf-8"),
        ("/vendor/xterm/xterm.mjs", "text/javascript; charset=utf-8"),
        ("/vendor/xterm/addon-fit.mjs", "text/javascript; charset=utf-8"),
        ("/vendor/xterm/LICENSE", "text/plain; charset=utf-8"),
    ] {
        let r = c.get(format!("{}{path}", t.base)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(r.headers()["content-type"], mime, "{path}");
        assert!(r.headers().contains_key("content-security-policy"), "{path}");
        let body = r.bytes().await.unwrap();
        assert_eq!(body.as_ref(), std::fs::read(root.join(&path[1..])).unwrap().as_slice(), "{path}");
    }

    // The page's routes do not shadow the API: unknown paths still get the API's JSON 404,
    // /v1 still needs a token, and the page is not in the OpenAPI document.
    let missing = t.request(reqwest::Method::GET, "/app2.js", None, None).await;
    assert_eq!((missing.status, missing.code()), (StatusCode::NOT_FOUND, "not_found"));
    assert_eq!(missing.body["error"]["details"]["resource"], "route");
    let anon = t.request(reqwest::Method::GET, "/v1/approvals/stream", None, None).await;
    assert_eq!(anon.status, StatusCode::UNAUTHORIZED);
    let doc = t.request(reqwest::Method::GET, "/openapi.json", None, None).await;
    let paths = doc.body["paths"].as_object().unwrap();
    assert!(paths.contains_key("/v1/approvals/stream"));
    assert!(!paths.keys().any(|p| p == "/" || p.starts_with("/vendor") || p.ends_with(".js")));
}

/// Reads SSE events (name, data) from a response until `n` arrived or `timeout` passed.
async fn sse_events(resp: &mut reqwest::Response, n: usize, timeout: Duration) -> Vec<(String, Value)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while out.len() < n {
        let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(c))) => c,
            _ => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some(block) = crate::common::take_sse_block(&mut buf) {
            let (mut event, mut data) = (String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if !event.is_empty() {
                out.push((event, serde_json::from_str(&data).unwrap_or(Value::String(data))));
            }
        }
    }
    out
}

fn pending_ids(snapshot: &Value) -> Vec<String> {
    snapshot["approvals"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

async fn approval_inbox_stream_follows_every_run_of_the_caller_only(backend: Backend) {
    let mut t = spawn(backend).await;
    t.app().registry.register(Arc::new(TestTool::new("gated_echo", "echoes after approval", true))).unwrap();
    let ada = t.user("ada").await;
    let bob = t.user("bob").await;

    let mut stream = t.client.get(format!("{}/v1/approvals/stream", t.base)).bearer_auth(&ada).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let first = sse_events(&mut stream, 1, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, "approvals");
    assert!(pending_ids(&first[0].1).is_empty());

    // Bob's approval is not Ada's business: no snapshot for it.
    let bob_run = t.run(&bob).await;
    let (bob_turn, _) = t.turn(&bob, &bob_run, "echo").await;
    let r = t.call(&bob, &bob_run, &bob_turn, "gated_echo", "b1", json!({"value": "bob"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert!(sse_events(&mut stream, 1, Duration::from_millis(700)).await.is_empty());

    // Two of Ada's runs, each opened after the stream started: both show up, with the frozen call.
    let mut approvals = Vec::new();
    for (i, value) in ["one", "two"].iter().enumerate() {
        let run = t.run(&ada).await;
        let (turn, _) = t.turn(&ada, &run, "echo").await;
        let r = t.call(&ada, &run, &turn, "gated_echo", &format!("c{i}"), json!({"value": value})).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        let id = r.body["approval_id"].as_str().unwrap().to_owned();
        let got = sse_events(&mut stream, 1, Duration::from_secs(5)).await;
        assert_eq!(got.len(), 1, "a snapshot for {id}");
        let ids = pending_ids(&got[0].1);
        assert_eq!(ids.last(), Some(&id));
        assert_eq!(ids.len(), i + 1);
        let shown = got[0].1["approvals"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(shown["invocation"]["tool_call_id"], format!("c{i}"));
        assert_eq!(shown["invocation"]["input_hash"], r.body["input_hash"]);
        assert_eq!(shown["invocation"]["input"]["value"], *value);
        approvals.push((id, shown));
    }

    // Granting one (with the triple the snapshot showed) removes it from the next snapshot.
    let (id, shown) = &approvals[0];
    let inv = &shown["invocation"];
    let g = t
        .post(
            &format!("/v1/approvals/{id}/grant"),
            &ada,
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let got = sse_events(&mut stream, 1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(pending_ids(&got[0].1), vec![approvals[1].0.clone()]);

    // The execution and evidence events that follow change nothing in the inbox: no new snapshot.
    assert!(sse_events(&mut stream, 1, Duration::from_millis(700)).await.is_empty());

    // A server shutting down ends the stream instead of waiting for the viewer to leave.
    tokio::time::timeout(Duration::from_secs(10), t.stop()).await.expect("shutdown does not wait for the stream");
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.chunk().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the stream ended with the server");
}

both_backends!(approval_inbox_stream_follows_every_run_of_the_caller_only);

fn artifacts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/artifacts/web")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_end_to_end() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let chromium = std::env::var("MIRA_WEB_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
    assert!(
        std::path::Path::new(&chromium).exists() && root.join("tests/web/node_modules/playwright-core").exists(),
        "the browser test needs chromium and playwright-core: run scripts/setup-web.sh (scripts/test.sh does)"
    );

    // Calls of the `deploy` domain need four-eyes approval in this deployment.
    let mut options = common::Options::default();
    options.runtime.four_eyes_domains = vec!["deploy".to_owned()];
    let t = common::spawn_with(Backend::Sqlite, options).await;
    let mut deploy = TestTool::new("deploy_release", "deploys a release once a second person approves it", true);
    deploy.spec.domain = "deploy".to_owned();
    t.app().registry.register(Arc::new(deploy)).unwrap();
    // The approval path of the test: write_file once the Edit tools are registered; until then
    // a dynamic tool that requires approval for every call.
    let tool = if t.app().registry.get_any("write_file").is_some() {
        "write_file"
    } else {
        t.app()
            .registry
            .register(Arc::new(TestTool::new("web_probe", "records a note after a person approves it", true)))
            .unwrap();
        "web_probe"
    };
    let token = t.user("ada").await;
    let approver = t.post("/v1/users", &t.admin_token, json!({"name": "vera", "approver": true})).await;
    assert_eq!(approver.status, StatusCode::CREATED, "{approver:?}");
    let approver_token = approver.body["token"].as_str().unwrap().to_owned();
    // Bea has 21 capabilities of her own (owned dynamic tools, invisible to Ada): her turns have
    // more than 20 candidates, so they are ranked and the page shows scores.
    let bea = t.user("bea").await;
    let bea_id = t.get("/v1/me", &bea).await.body["id"].as_str().unwrap().to_owned();
    for (i, topic) in
        ["weather forecast", "rain radar", "tide tables", "air quality"].iter().cycle().take(21).enumerate()
    {
        let mut tool = TestTool::new(&format!("bea_{i:02}"), &format!("{topic} for a city, source {i}"), false);
        tool.spec.owner = Some(bea_id.clone());
        t.app().registry.register(Arc::new(tool)).unwrap();
    }
    let artifacts = artifacts_dir();
    std::fs::create_dir_all(&artifacts).unwrap();

    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(root.join("tests/web/e2e.mjs"))
        .current_dir(root.join("tests/web"))
        .env("MIRA_BASE_URL", &t.base)
        .env("MIRA_TOKEN", &token)
        .env("MIRA_TOKEN_2", &bea)
        .env("MIRA_E2E_TOOL", tool)
        .env("MIRA_TOKEN_APPROVER", &approver_token)
        .env("MIRA_TOKEN_ADMIN", &t.admin_token)
        .env("MIRA_FOUR_EYES_TOOL", "deploy_release")
        .env("MIRA_WORKSPACE", &t.workspace)
        .env("MIRA_ARTIFACTS", &artifacts)
        .env("MIRA_WEB_CHROMIUM", &chromium)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(150), cmd.output())
        .await
        .expect("the browser test finishes within 150 s")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(out.status.success(), "tests/web/e2e.mjs failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("e2e: all checks passed"), "{stdout}");

    // What the browser did is in the store: the approval was granted with the displayed
    // triple by Ada's token, the call ran once, and its evidence was accepted.
    let approvals = t.get("/v1/approvals?status=granted", &token).await;
    let granted: Vec<&Value> = approvals.body["approvals"]
        .as_array()
        .unwrap()
        .iter()
        // The MCP client's call (`mcp-…`, approved in the page too) is checked by e2e.mjs.
        .filter(|a| {
            a["invocation"]["tool_id"] == tool && !a["invocation"]["tool_call_id"].as_str().unwrap().starts_with("mcp-")
        })
        .collect();
    assert_eq!(granted.len(), 1, "{approvals:?}");
    let inv = t
        .get(&format!("/v1/invocations/{}", granted[0]["invocation"]["invocation_id"].as_str().unwrap()), &token)
        .await;
    assert_eq!(inv.body["status"], "completed", "{inv:?}");
    let evidence_id = inv.body["evidence_ids"][0].as_str().unwrap();
    let ev = t.get(&format!("/v1/evidence/{evidence_id}"), &token).await;
    assert_eq!(ev.body["acceptance"]["accepted"], true, "{ev:?}");
    // The four-eyes call: granted in the page by Vera, the approver, not by Ada who asked.
    let four_eyes = t.get("/v1/approvals?status=granted", &token).await;
    let four_eyes: Vec<&Value> = four_eyes.body["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["invocation"]["tool_id"] == "deploy_release")
        .collect();
    assert_eq!(four_eyes.len(), 1, "{four_eyes:?}");
    assert_eq!(four_eyes[0]["rule"], "four_eyes");
    assert_eq!(four_eyes[0]["decided_by"], approver.body["user"]["id"], "{:?}", four_eyes[0]);
    assert_eq!(four_eyes[0]["requested_by"]["name"], "ada");
    // The device registered, renamed and revoked in the page.
    let devices = t.get("/v1/devices", &token).await;
    let device = devices.body["devices"].as_array().unwrap().iter().find(|d| d["name"] == "e2e laptop").cloned();
    let device = device.unwrap_or_else(|| panic!("no device from the page: {devices:?}"));
    assert_eq!((device["status"].as_str(), device["enrolled_at"].is_string()), (Some("revoked"), true), "{device}");
    // The connection added in the page was deleted in the page.
    let connections = t.get("/v1/connections", &t.admin_token).await;
    assert_eq!(connections.body["connections"], json!([]), "{connections:?}");
    for shot in [
        "connections",
        "phone-connections",
        "four-eyes-requester",
        "four-eyes-approver",
        "sign-in",
        "approvals",
        "timeline",
        "tools",
        "tools-ranked",
        "mcp",
        "terminal",
        "devices",
        "devices-revoked",
        "phone-approvals",
        "phone-timeline",
    ] {
        assert!(artifacts.join(format!("{shot}.png")).exists(), "screenshot {shot}.png");
    }
}
