//! The Read tools on a real workspace: discovery with .gitignore, fuzzy names and pages;
//! grep options; devices and availability; the admin bootstrap file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{Backend, TestApp, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn run_tool(t: &TestApp, token: &str, run: &str, turn: &str, tool: &str, call: &str, input: Value) -> Value {
    let r = t.call(token, run, turn, tool, call, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await
}

fn tree(root: &std::path::Path) {
    for (path, body) in [
        (".gitignore", "target/\n*.log\n"),
        ("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n"),
        ("src/approval/grant.rs", "pub fn grant() {}\n// TODO: audit\npub fn GRANT_ALL() {}\n"),
        ("src/approval/deny.rs", "pub fn deny() {}\n"),
        ("docs/guide.md", "grant access here\n"),
        ("target/debug/out.rs", "pub fn grant() {}\n"),
        ("build.log", "grant\n"),
    ] {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
}

async fn discover_honours_gitignore_matches_fuzzily_and_paginates(backend: Backend) {
    let t = spawn(backend).await;
    tree(&t.workspace);
    let token = t.user("ann").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "discover").await;

    let all = run_tool(&t, &token, &run, &turn, "read_discover", "d1", json!({})).await;
    let paths: Vec<&str> =
        all["result"]["output"]["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"src/approval/grant.rs"), "{paths:?}");
    assert!(
        !paths.iter().any(|p| p.starts_with("target") || p.ends_with(".log")),
        "gitignored entries listed: {paths:?}"
    );

    let fuzzy =
        run_tool(&t, &token, &run, &turn, "read_discover", "d2", json!({"query": "aprgrant", "kind": "file"})).await;
    assert_eq!(fuzzy["result"]["output"]["entries"][0]["path"], "src/approval/grant.rs", "{fuzzy}");

    let page1 = run_tool(&t, &token, &run, &turn, "read_discover", "d3", json!({"limit": 2})).await;
    let out1 = &page1["result"]["output"];
    assert_eq!(out1["entries"].as_array().unwrap().len(), 2);
    let cursor = out1["next_cursor"].as_str().unwrap().to_owned();
    let page2 = run_tool(&t, &token, &run, &turn, "read_discover", "d4", json!({"limit": 50, "cursor": cursor})).await;
    let out2 = &page2["result"]["output"];
    assert_eq!(out1["total"], out2["total"]);
    assert_eq!(out2["entries"].as_array().unwrap().len() + 2, out1["total"].as_u64().unwrap() as usize);
    assert!(out2["next_cursor"].is_null());

    let bad = t.call(&token, &run, &turn, "read_discover", "d5", json!({"cursor": "not-ours"})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_cursor"));
    let sub = run_tool(&t, &token, &run, &turn, "read_discover", "d6", json!({"path": "src/approval"})).await;
    let n = sub["result"]["output"]["entries"].as_array().unwrap().len();
    assert_eq!(n, 2, "{sub}");
    let file_as_dir = run_tool(&t, &token, &run, &turn, "read_discover", "d7", json!({"path": "src/main.rs"})).await;
    assert_eq!(file_as_dir["result"]["error"]["code"], "not_a_directory");
}

async fn grep_options_work(backend: Backend) {
    let t = spawn(backend).await;
    tree(&t.workspace);
    let token = t.user("ben").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "grep").await;
    let matches = |v: &Value| -> Vec<(String, u64)> {
        v["result"]["output"]["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["path"].as_str().unwrap().to_owned(), m["line"].as_u64().unwrap()))
            .collect()
    };
    let plain = run_tool(&t, &token, &run, &turn, "grep", "g1", json!({"pattern": "grant"})).await;
    assert_eq!(matches(&plain), [("docs/guide.md".to_owned(), 1), ("src/approval/grant.rs".to_owned(), 1)]);
    let ci = run_tool(
        &t,
        &token,
        &run,
        &turn,
        "grep",
        "g2",
        json!({"pattern": "grant", "case_insensitive": true, "glob": "*.rs"}),
    )
    .await;
    assert_eq!(matches(&ci), [("src/approval/grant.rs".to_owned(), 1), ("src/approval/grant.rs".to_owned(), 3)]);
    let excl = run_tool(&t, &token, &run, &turn, "grep", "g3", json!({"pattern": "grant", "glob": ["!*.md"]})).await;
    assert_eq!(matches(&excl), [("src/approval/grant.rs".to_owned(), 1)]);
    let literal =
        run_tool(&t, &token, &run, &turn, "grep", "g4", json!({"pattern": "println!(", "literal": true})).await;
    assert_eq!(matches(&literal), [("src/main.rs".to_owned(), 2)]);
    let ctx = run_tool(&t, &token, &run, &turn, "grep", "g5", json!({"pattern": "TODO", "context": 1})).await;
    let m = &ctx["result"]["output"]["matches"][0];
    assert_eq!(m["before"][0]["text"], "pub fn grant() {}");
    assert_eq!(m["after"][0]["text"], "pub fn GRANT_ALL() {}");
    assert_eq!(m["column"], 4);
    let capped = run_tool(&t, &token, &run, &turn, "grep", "g6", json!({"pattern": "fn", "limit": 2})).await;
    assert_eq!(capped["result"]["output"]["matches"].as_array().unwrap().len(), 2);
    assert_eq!(capped["result"]["output"]["truncated"], true);
    let bad = t.call(&token, &run, &turn, "grep", "g7", json!({"pattern": "(unclosed"})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_pattern"));
    let one_file =
        run_tool(&t, &token, &run, &turn, "grep", "g8", json!({"pattern": "deny", "path": "src/approval/deny.rs"}))
            .await;
    assert_eq!(matches(&one_file), [("src/approval/deny.rs".to_owned(), 1)]);
    // Evidence names the file version.
    let ev = t.get(&format!("/v1/evidence/{}", one_file["evidence_ids"][0].as_str().unwrap()), &token).await;
    assert_eq!(ev.body["kind"], "grep_match");
    assert_eq!(ev.body["content_sha256"], mira::evidence::sha256_hex(b"pub fn deny() {}\n"));
}

async fn devices_decide_availability(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("cat").await;
    let r = t.post("/v1/devices", &token, json!({"name": "laptop", "capabilities": ["pty"]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let no_fs = r.body["id"].as_str().unwrap().to_owned();
    let r = t.post("/v1/devices", &token, json!({"name": "runner", "capabilities": ["fs.read"]})).await;
    let remote = r.body["id"].as_str().unwrap().to_owned();

    let view = t.get(&format!("/v1/tools/read_open?device={no_fs}"), &token).await;
    assert_eq!(
        (view.body["state"].as_str(), view.body["reason"]["code"].as_str()),
        (Some("unavailable"), Some("device_lacks_capability"))
    );
    let view = t.get(&format!("/v1/tools/grep?device={remote}"), &token).await;
    assert_eq!(view.body["reason"]["code"], "device_not_connected");
    let view = t.get("/v1/tools/grep", &token).await;
    assert_eq!(view.body["state"], "available");
    // A run on that device exposes nothing it cannot run, and says so per tool.
    let r = t.post("/v1/runs", &token, json!({"device_id": no_fs})).await;
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, exposure) = t.turn(&token, &run, "read").await;
    assert_eq!(exposure["candidate_count"], 0);
    let r = t.call(&token, &run, &turn, "grep", "x", json!({"pattern": "a"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "unavailable"));
    // Another user's device is 404.
    let other = t.user("dog").await;
    let r = t.post("/v1/runs", &other, json!({"device_id": no_fs})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let view = t.get("/v1/tools/not%20an%20id", &token).await;
    assert_eq!(view.status, StatusCode::NOT_FOUND);
    let view = t.get("/v1/tools/never_heard_of_it", &token).await;
    assert_eq!(
        (view.status, view.body["state"].as_str(), view.body["reason"]["code"].as_str()),
        (StatusCode::OK, Some("not_registered"), Some("unknown_tool"))
    );
}

#[tokio::test]
async fn admin_token_file_is_private_and_users_need_admin() {
    use std::os::unix::fs::PermissionsExt;
    let t = spawn(Backend::Sqlite).await;
    let mode = std::fs::metadata(t.data_dir.join("admin.token")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let user = t.user("eve").await;
    let r = t.post("/v1/users", &user, json!({"name": "x"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"));
    let r = t.post("/v1/users", &t.admin_token, json!({"name": "eve"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "name_taken"));
    let r = t.post("/v1/users", &t.admin_token, json!({"name": "bad name!"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_name"));
    // The stored token is a hash: the plain token appears nowhere in the database file.
    let db = std::fs::read(t.data_dir.join("mira.db")).unwrap();
    let wal = std::fs::read(t.data_dir.join("mira.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(user.len()).any(|w| w == user.as_bytes()));
    }
}

both_backends!(
    discover_honours_gitignore_matches_fuzzily_and_paginates,
    grep_options_work,
    devices_decide_availability
);
