//! Issue 13 (4–6), replayed exactly as a hostile but honest user of a shared server tried
//! them, on SQLite and on Postgres: a workspace root swapped for a symlink between freeze
//! and grant, a hard link in the workspace to a file outside read through the Read tools,
//! and `POST /v1/workspaces` answering differently for paths a non-admin may not register.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::{Backend, Options, Resp, TestApp, spawn, spawn_with};
use mira::evidence::sha256_hex;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Every file under `root` with its content hash, symlinks not followed (a missing root is
/// an empty list).
fn files(root: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let path = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if meta.is_dir() {
                walk(root, &path, out);
            } else if meta.is_file() {
                out.push((rel, sha256_hex(&std::fs::read(&path).unwrap())));
            } else {
                out.push((rel, "other".into()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// The folder beside the test's default workspace (kept alive by the TestApp).
fn scratch(t: &TestApp) -> PathBuf {
    t.workspace.parent().unwrap().to_path_buf()
}

async fn freeze(t: &TestApp, token: &str, run: &str, turn: &str, tool: &str, call: &str, input: Value) -> Resp {
    t.call(token, run, turn, tool, call, input).await
}

async fn grant(t: &TestApp, token: &str, inv: &Value) -> Resp {
    t.post(
        &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
        token,
        json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
    )
    .await
}

// 13.4 --------------------------------------------------------------------------------------

async fn workspace_root_swapped_for_a_symlink_runs_nothing(backend: Backend) {
    let t = spawn(backend).await;
    let admin = t.admin_token.clone();
    let srv = scratch(&t).join("srv");
    let ws2 = srv.join("ws2");
    let elsewhere = srv.join("elsewhere");
    std::fs::create_dir_all(&ws2).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(ws2.join("readme.txt"), "the real ws2\n").unwrap();
    std::fs::write(elsewhere.join("secret.txt"), "not for this workspace\n").unwrap();

    // An admin registers /srv/ws2; a run there freezes two writes.
    let r = t.post("/v1/workspaces", &admin, json!({"name": "ws2", "path": ws2})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["root"]["status"], "ok", "{r:?}");
    let ws_id = r.body["id"].as_str().unwrap().to_owned();
    let r = t.post("/v1/runs", &admin, json!({"workspace_id": ws_id})).await;
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&admin, &run, "write a note and read files").await;
    let input = json!({"path": "note.txt", "content": "written by the agent\n"});
    let a = freeze(&t, &admin, &run, &turn, "write_file", "w1", input.clone()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let b = freeze(&t, &admin, &run, &turn, "write_file", "w2", json!({"path": "other.txt", "content": "b\n"})).await;
    assert_eq!(b.status, StatusCode::CREATED, "{b:?}");

    // ws2 is replaced by a symlink to another folder.
    let orig = srv.join("ws2.orig");
    std::fs::rename(&ws2, &orig).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &ws2).unwrap();
    let (before_orig, before_elsewhere) = (files(&orig), files(&elsewhere));

    // The grant runs nothing: the root is not the folder registered.
    let g = grant(&t, &admin, &a.body).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = t.wait_final(&admin, a.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("workspace_changed")),
        "{done}"
    );
    assert_eq!(done["result"]["error"]["details"]["change"], "symlink", "{done}");
    assert_eq!(files(&elsewhere), before_elsewhere, "nothing written in the symlink's target");
    assert_eq!(files(&orig), before_orig, "nothing written in the original folder");
    assert!(!elsewhere.join("note.txt").exists() && !orig.join("note.txt").exists());

    // The ladder says why; read_open is refused; the workspace list shows the change.
    let ladder = t.get(&format!("/v1/tools/read_open?turn={turn}"), &admin).await;
    assert_eq!(
        (ladder.body["state"].as_str(), ladder.body["reason"]["code"].as_str()),
        (Some("unavailable"), Some("workspace_changed")),
        "{ladder:?}"
    );
    let all = t.get(&format!("/v1/tools?turn={turn}"), &admin).await;
    for id in ["read_open", "grep", "read_discover", "write_file", "replace_block", "delete_path", "move_path"] {
        let tool = all.body["tools"].as_array().unwrap().iter().find(|v| v["id"] == id).unwrap();
        assert_eq!(tool["reason"]["code"], "workspace_changed", "{id}: {tool}");
    }
    let read = freeze(&t, &admin, &run, &turn, "read_open", "r1", json!({"path": "secret.txt"})).await;
    assert_eq!((read.status, read.code()), (StatusCode::CONFLICT, "unavailable"), "{read:?}");
    assert_eq!(read.body["error"]["details"]["ladder"]["reason"]["code"], "workspace_changed");
    assert!(!read.body.to_string().contains("not for this workspace"));
    // A tool that does not work in the folder (no fs/pty capability, like an External MCP
    // projection) is neither handed it nor stopped by its state: frozen and run once.
    let lookup = common::TestTool::new("net_lookup", "looks something up on the network", false);
    let runs = lookup.runs.clone();
    t.app().registry.register(std::sync::Arc::new(lookup)).unwrap();
    let (turn2, _) = t.turn(&admin, &run, "look something up").await;
    let n = freeze(&t, &admin, &run, &turn2, "net_lookup", "n1", json!({"value": "x"})).await;
    assert_eq!(n.status, StatusCode::CREATED, "{n:?}");
    let done = t.wait_final(&admin, n.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["given_workspace"], false, "{done}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let list = t.get("/v1/workspaces", &admin).await;
    let view = list.body["workspaces"].as_array().unwrap().iter().find(|w| w["id"] == ws_id.as_str()).unwrap().clone();
    assert_eq!((view["root"]["status"].as_str(), view["root"]["change"].as_str()), (Some("changed"), Some("symlink")));

    // Re-registering a symlinked root is refused; only an admin may re-register at all.
    let user = t.user("mallory").await;
    let r = t.post(&format!("/v1/workspaces/{ws_id}/reregister"), &user, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    let r = t.post(&format!("/v1/workspaces/{ws_id}/reregister"), &admin, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_workspace_path"), "{r:?}");

    // A real folder at the path again, re-registered by the admin: the tools work, but the
    // call frozen before the re-registration is refused rather than run in the new folder.
    std::fs::remove_file(&ws2).unwrap();
    std::fs::create_dir(&ws2).unwrap();
    let list = t.get("/v1/workspaces", &admin).await;
    let view = list.body["workspaces"].as_array().unwrap().iter().find(|w| w["id"] == ws_id.as_str()).unwrap().clone();
    assert_eq!(view["root"]["change"], "replaced", "{view}");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let r = t.post(&format!("/v1/workspaces/{ws_id}/reregister"), &admin, json!({})).await;
    assert_eq!((r.status, r.body["root"]["status"].as_str()), (StatusCode::OK, Some("ok")), "{r:?}");
    let g = grant(&t, &admin, &b.body).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = t.wait_final(&admin, b.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["result"]["error"]["code"], "workspace_changed", "{done}");
    assert!(files(&ws2).is_empty(), "the call frozen for the old folder wrote nothing in the new one");
    let (turn2, _) = t.turn(&admin, &run, "write a note").await;
    let c = freeze(&t, &admin, &run, &turn2, "write_file", "w3", input).await;
    assert_eq!(c.status, StatusCode::CREATED, "{c:?}");
    grant(&t, &admin, &c.body).await;
    let done = t.wait_final(&admin, c.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(ws2.join("note.txt")).unwrap(), "written by the agent\n");

    // Moved away (nothing at the path) is a change too.
    std::fs::rename(&ws2, srv.join("ws2.moved")).unwrap();
    let ladder = t.get(&format!("/v1/tools/grep?turn={turn2}"), &admin).await;
    assert_eq!(ladder.body["reason"]["code"], "workspace_changed", "{ladder:?}");
    let list = t.get("/v1/workspaces", &admin).await;
    let view = list.body["workspaces"].as_array().unwrap().iter().find(|w| w["id"] == ws_id.as_str()).unwrap().clone();
    assert_eq!(view["root"]["change"], "missing", "{view}");
}

// 13.5 --------------------------------------------------------------------------------------

/// A hard link `leak.txt` in the workspace to `secret.txt` outside it; returns the secret.
fn hard_link_outside(t: &TestApp) -> String {
    let outside = scratch(t).join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let secret = format!("TOKEN-{}", uuid::Uuid::now_v7().simple());
    std::fs::write(outside.join("secret.txt"), format!("{secret}\n")).unwrap();
    std::fs::hard_link(outside.join("secret.txt"), t.workspace.join("leak.txt")).unwrap();
    std::fs::write(t.workspace.join("plain.txt"), "TOKEN-plain\n").unwrap();
    secret
}

async fn read_tools(t: &TestApp, token: &str) -> (Value, Value, Value) {
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, "read").await;
    let mut out = Vec::new();
    for (tool, call, input) in [
        ("read_open", "o", json!({"path": "leak.txt"})),
        ("grep", "g", json!({"pattern": "TOKEN-"})),
        ("read_discover", "d", json!({})),
    ] {
        let r = t.call(token, &run, &turn, tool, call, input).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        out.push(t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await);
    }
    let d = out.pop().unwrap();
    let g = out.pop().unwrap();
    let o = out.pop().unwrap();
    (o, g, d)
}

async fn hard_links_to_outside_files_are_not_read(backend: Backend) {
    let t = spawn(backend).await;
    let secret = hard_link_outside(&t);
    let token = t.user("mallory").await;
    let (open, grep, discover) = read_tools(&t, &token).await;
    for v in [&open, &grep, &discover] {
        assert!(!v.to_string().contains(&secret), "the secret leaked: {v}");
    }
    assert_eq!(
        (open["status"].as_str(), open["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("outside_workspace")),
        "{open}"
    );
    assert_eq!(open["result"]["error"]["details"]["hard_links"], 2, "{open}");
    let g = &grep["result"]["output"];
    let paths: Vec<&str> = g["matches"].as_array().unwrap().iter().map(|m| m["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["plain.txt"], "{grep}");
    assert_eq!(g["skipped_hard_links"], 1, "{grep}");
    assert!(g["note"].as_str().unwrap().contains("hard link"), "{grep}");
    let d = &discover["result"]["output"];
    let listed: Vec<&str> = d["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(listed.contains(&"plain.txt") && !listed.contains(&"leak.txt"), "{discover}");
    assert_eq!(d["skipped_hard_links"], 1, "{discover}");
    assert!(d["note"].as_str().is_some(), "{discover}");
}

async fn a_single_user_deployment_may_allow_hard_link_reads(backend: Backend) {
    let mut options = Options::default();
    options.runtime.allow_hard_link_reads = true;
    let t = spawn_with(backend, options).await;
    let secret = hard_link_outside(&t);
    let token = t.user("solo").await;
    let (open, grep, discover) = read_tools(&t, &token).await;
    assert_eq!(open["result"]["output"]["content"], format!("{secret}\n").as_str(), "{open}");
    let g = &grep["result"]["output"];
    assert_eq!((g["files_with_matches"].as_u64(), g["skipped_hard_links"].as_u64()), (Some(2), Some(0)), "{grep}");
    let d = &discover["result"]["output"];
    assert!(d["entries"].as_array().unwrap().iter().any(|e| e["path"] == "leak.txt"), "{discover}");
    // The Edit tools still refuse the same file.
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "edit").await;
    let r = t.call(&token, &run, &turn, "write_file", "w", json!({"path": "leak.txt", "content": "x"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "outside_workspace"), "{r:?}");
}

// 13.6 --------------------------------------------------------------------------------------

async fn workspace_paths_are_no_oracle_for_non_admins(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let roots = tmp.path().join("roots");
    std::fs::create_dir_all(roots.join("mine")).unwrap();
    std::fs::write(roots.join("a-file.txt"), "x").unwrap();
    let secret_dir = tmp.path().join("private");
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::os::unix::fs::symlink(&secret_dir, roots.join("link-out")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nothing-here"), roots.join("dangling")).unwrap();
    let mut options = Options::default();
    options.runtime.workspace_roots = vec![roots.clone()];
    let t = spawn_with(backend, options).await;
    let user = t.user("mallory").await;

    // Every path a non-admin may not register: missing, a file, an existing directory
    // (/root/.ssh and one made here), outside and inside the roots, through symlinks.
    let candidates: Vec<String> = vec![
        "/root/.ssh".into(),
        "/nonexistent/certainly/not/here".into(),
        "/etc/hostname".into(),
        "/etc".into(),
        secret_dir.display().to_string(),
        roots.join("missing").display().to_string(),
        roots.join("a-file.txt").display().to_string(),
        roots.join("link-out").display().to_string(),
        roots.join("dangling").display().to_string(),
        format!("{}/../private", roots.display()),
        "relative/path".into(),
    ];
    let mut shapes = Vec::new();
    for path in &candidates {
        let r = t.post("/v1/workspaces", &user, json!({"name": "probe", "path": path})).await;
        let message = r.body["error"]["message"].as_str().unwrap_or_default().replace(&format!("{path:?}"), "<path>");
        let details = r.body["error"]["details"].clone();
        shapes.push((r.status, r.code().to_owned(), message, details));
    }
    for (path, shape) in candidates.iter().zip(&shapes) {
        assert_eq!(shape, &shapes[0], "{path} answers differently");
    }
    assert_eq!((shapes[0].0, shapes[0].1.as_str()), (StatusCode::FORBIDDEN, "workspace_path_not_allowed"));
    assert!(shapes[0].2.contains("<path>"), "{:?}", shapes[0]);

    // A real folder under the roots is registered; admins keep precise errors.
    let r = t.post("/v1/workspaces", &user, json!({"name": "mine", "path": roots.join("mine")})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let admin = t.admin_token.clone();
    let r = t.post("/v1/workspaces", &admin, json!({"name": "x", "path": "/nonexistent/certainly/not/here"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_workspace_path"), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains("No such file"), "{r:?}");
    let r = t.post("/v1/workspaces", &admin, json!({"name": "x", "path": roots.join("a-file.txt")})).await;
    assert!(r.body["error"]["message"].as_str().unwrap().contains("not a directory"), "{r:?}");
}

/// With `--workspace-roots <roots>`, a non-admin cannot register a root itself (every other
/// user's folders would be theirs to read and write through the Read and Edit tools), nor
/// another user's workspace, a folder inside one or a folder holding one — not by its own
/// path, not through a symlink, not with `..` — while their own folders may nest, and admins
/// still register anywhere.
async fn non_admins_cannot_register_a_root_or_another_users_workspace(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let roots = std::fs::canonicalize(tmp.path()).unwrap().join("roots");
    for dir in ["team/yan", "yan-alone/sub", "xia", "other"] {
        std::fs::create_dir_all(roots.join(dir)).unwrap();
    }
    std::fs::write(roots.join("team/yan/secret.txt"), "YAN-SECRET\n").unwrap();
    std::os::unix::fs::symlink(roots.join("team/yan"), roots.join("link-to-yan")).unwrap();
    let mut options = Options::default();
    options.runtime.workspace_roots = vec![roots.clone()];
    let t = spawn_with(backend, options).await;
    let yan = t.user("yan").await;
    let xia = t.user("xia").await;
    let register = |token: &str, path: String| {
        let (t, token) = (&t, token.to_owned());
        async move { t.post("/v1/workspaces", &token, json!({"name": "ws", "path": path})).await }
    };
    let at = |rel: &str| roots.join(rel).display().to_string();

    for path in [at("team/yan"), at("yan-alone")] {
        let r = register(&yan, path).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    // The root itself, however it is written: the one refusal of paths not allowed.
    for path in [roots.display().to_string(), format!("{}/", roots.display()), at("."), at("xia/..")] {
        let r = register(&xia, path.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "workspace_path_not_allowed"), "{path}: {r:?}");
    }
    // Yan's folders: equal (also through a symlink and with `..`), inside, holding them.
    for path in
        [at("team/yan"), at("link-to-yan"), at("xia/../team/yan"), at("yan-alone/sub"), at("team"), at("team/yan/")]
    {
        let r = register(&xia, path.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "workspace_path_taken"), "{path}: {r:?}");
        assert_eq!(r.body["error"]["details"]["path"], path.as_str(), "{r:?}");
    }
    let listed = t.get("/v1/workspaces", &xia).await;
    assert!(!listed.body.to_string().contains("yan"), "nothing was stored for xia: {listed:?}");
    // A folder nobody else holds; yan's own folders may nest; an admin registers anywhere.
    let r = register(&xia, at("xia")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = register(&yan, at("yan-alone/sub")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let admin = t.admin_token.clone();
    for path in [at("team/yan"), roots.display().to_string()] {
        let r = register(&admin, path).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    // An admin's workspace is another user's too for a non-admin.
    let r = register(&xia, at("other")).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "workspace_path_taken"), "inside the admin's: {r:?}");
}

/// Registrations of nested folders by different users at the same moment are serialised:
/// of a chain of folders each inside the previous one, registered concurrently by as many
/// users, exactly one is stored.
async fn concurrent_registrations_of_nested_folders_store_one(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let roots = std::fs::canonicalize(tmp.path()).unwrap().join("roots");
    let mut options = Options::default();
    options.runtime.workspace_roots = vec![roots.clone()];
    let t = spawn_with(backend, options).await;
    const USERS: usize = 8;
    let mut tokens = Vec::new();
    for i in 0..USERS {
        tokens.push(t.user(&format!("u{i}")).await);
    }
    for round in 0..4 {
        let mut chain = roots.join(format!("round{round}"));
        let mut paths = Vec::new();
        for i in 0..USERS {
            chain = chain.join(format!("d{i}"));
            paths.push(chain.display().to_string());
        }
        std::fs::create_dir_all(&chain).unwrap();
        // Deepest first, so the later requests are the outer folders.
        let answers = futures::future::join_all(tokens.iter().zip(paths.iter().rev()).map(|(token, path)| {
            let t = &t;
            async move { t.post("/v1/workspaces", token, json!({"name": "nested", "path": path})).await }
        }))
        .await;
        let created = answers.iter().filter(|r| r.status == StatusCode::CREATED).count();
        let taken = answers.iter().filter(|r| r.code() == "workspace_path_taken").count();
        assert_eq!((created, taken), (1, USERS - 1), "round {round}: {answers:?}");
    }
}

/// Every user reads the default workspace: a non-admin cannot register a folder inside it
/// (or holding it) as a private workspace, where other users would read it through the
/// default one. And a non-admin's host workspaces are counted.
async fn a_private_workspace_cannot_lie_in_the_default_one_and_they_are_counted(backend: Backend) {
    let mut options = Options::default();
    options.runtime.workspace_roots = vec![std::env::temp_dir()];
    let t = spawn_with(backend, options).await;
    let user = t.user("mallory").await;
    let inside = t.workspace.join("mine");
    std::fs::create_dir_all(&inside).unwrap();
    let holding = t.workspace.parent().unwrap().to_path_buf();
    for path in [&inside, &holding] {
        let r = t.post("/v1/workspaces", &user, json!({"name": "mine", "path": path})).await;
        assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "workspace_path_taken"), "{}: {r:?}", path.display());
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let r = t.post("/v1/workspaces", &user, json!({"name": "mine", "path": elsewhere.path()})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");

    // A non-admin holds at most 64 host workspaces (each is indexed and watched); an admin
    // registers more.
    let many = tempfile::tempdir().unwrap();
    let limit = mira::store::MAX_HOST_WORKSPACES_PER_USER;
    for i in 1..=limit {
        let dir = many.path().join(format!("w{i}"));
        std::fs::create_dir(&dir).unwrap();
        let r = t.post("/v1/workspaces", &user, json!({"name": format!("w{i}"), "path": dir})).await;
        if i < limit {
            assert_eq!(r.status, StatusCode::CREATED, "{i}: {r:?}");
        } else {
            assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "workspace_limit"), "{r:?}");
            assert_eq!(r.body["error"]["details"]["limit"], limit, "{r:?}");
            let r = t.post("/v1/workspaces", &t.admin_token, json!({"name": "admin's", "path": dir})).await;
            assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        }
    }
}

/// A folder of the workspace that is a symlink to another user's folder: neither
/// `read_discover` (by query or by path) nor `codebase_explore` (its results and its
/// `index.skipped` examples) names or measures anything beyond it. The race of swapping a
/// folder for such a symlink during the walk is replayed deterministically in the unit tests
/// of `read_discover` (mira-tools) and of `Workspace::entry_beneath` (mira-core).
async fn a_symlinked_folder_leading_out_is_never_listed(backend: Backend) {
    let t = spawn(backend).await;
    let bob = scratch(&t).join("bob");
    std::fs::create_dir_all(bob.join("private")).unwrap();
    std::fs::write(bob.join("private/bob_salary_review_2026.txt"), "x".repeat(4242)).unwrap();
    std::fs::write(bob.join("private/bob_secret.rs"), "pub fn bob_secret() {}\n").unwrap();
    std::fs::write(bob.join("private/bob_big.rs"), "// x\n".repeat(300_000)).unwrap();
    std::fs::create_dir_all(t.workspace.join("src")).unwrap();
    std::fs::write(t.workspace.join("src/lib.rs"), "pub fn mine() {}\n").unwrap();
    std::os::unix::fs::symlink(&bob, t.workspace.join("z")).unwrap();
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "find the salary file").await;
    for (i, input) in [json!({"query": "salary"}), json!({}), json!({"path": "z"})].into_iter().enumerate() {
        let r = t.call(&token, &run, &turn, "read_discover", &format!("d{i}"), input.clone()).await;
        let text = match r.body["invocation_id"].as_str() {
            Some(id) => t.wait_final(&token, id).await["result"].to_string(),
            None => r.body["error"].to_string(),
        };
        assert!(!text.contains("bob_") && !text.contains("private") && !text.contains("4242"), "{input}: {text}");
    }
    // The code graph: wait for its index, then ask in a turn that exposes it.
    let mut available = false;
    for _ in 0..400 {
        let v = t.get(&format!("/v1/tools/codebase_explore?turn={turn}"), &token).await;
        if v.body["state"] == "available" || v.body["state"] == "exposed" {
            available = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(available, "the code graph never became available");
    let (turn, _) = t.turn(&token, &run, "explore the code").await;
    let r = t.call(&token, &run, &turn, "codebase_explore", "c", json!({"kind": "overview"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"].to_string();
    assert!(!text.contains("bob_") && !text.contains("private/"), "{text}");
    assert!(done["result"]["output"]["index"]["files"].as_u64().is_some_and(|n| n >= 1), "{text}");
}

both_backends!(
    a_private_workspace_cannot_lie_in_the_default_one_and_they_are_counted,
    workspace_root_swapped_for_a_symlink_runs_nothing,
    a_symlinked_folder_leading_out_is_never_listed,
    hard_links_to_outside_files_are_not_read,
    a_single_user_deployment_may_allow_hard_link_reads,
    workspace_paths_are_no_oracle_for_non_admins,
    non_admins_cannot_register_a_root_or_another_users_workspace,
    concurrent_registrations_of_nested_folders_store_one,
);

/// The default `cargo run -- serve` layout, data dir inside the workspace: no Read or Edit
/// tool of a non-admin opens it — not by its path, not through a symlink to it — so the admin
/// token never reaches a result, and nothing in it is written, moved or deleted.
async fn data_dir_inside_the_workspace_is_never_opened(backend: Backend) {
    let t = spawn_with(backend, Options { data_in_workspace: true, ..Options::default() }).await;
    let token = t.user("mallory").await;
    std::os::unix::fs::symlink("data", t.workspace.join("d")).unwrap();
    let secret = std::fs::read_to_string(t.data_dir.join("admin.token")).unwrap();
    let secret = secret.trim();
    let before = files(&t.data_dir);
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read and change files").await;
    let reads = [
        ("read_open", json!({"path": "data/admin.token"})),
        ("read_open", json!({"path": "d/admin.token"})),
        ("grep", json!({"pattern": "[a-z0-9]", "path": "data"})),
        ("grep", json!({"pattern": secret})),
    ];
    for (i, (tool, input)) in reads.into_iter().enumerate() {
        let r = t.call(&token, &run, &turn, tool, &format!("r{i}"), input.clone()).await;
        // What came back (the result or the refusal), not the echoed input.
        let text = match r.body["invocation_id"].as_str() {
            Some(id) => t.wait_final(&token, id).await["result"].to_string(),
            None => r.body["error"].to_string(),
        };
        assert!(!text.contains(secret), "{tool} {input} leaked the admin token: {text}");
        if tool == "read_open" {
            assert!(text.contains("outside_workspace"), "{tool} {input}: {text}");
        }
    }
    // Nor is the data dir listed: not its files, not the folder.
    let r = t.call(&token, &run, &turn, "read_discover", "l0", json!({})).await;
    let listing = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    let entries = listing["result"]["output"]["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["path"] == "d"), "{listing}");
    assert!(!listing["result"].to_string().contains("admin.token"), "{listing}");
    assert!(!entries.iter().any(|e| e["path"] == "data"), "{listing}");
    let r = t.call(&token, &run, &turn, "read_discover", "l1", json!({"path": "data"})).await;
    let text = match r.body["invocation_id"].as_str() {
        Some(id) => t.wait_final(&token, id).await["result"].to_string(),
        None => r.body["error"].to_string(),
    };
    assert!(text.contains("outside_workspace") && !text.contains("admin.token"), "{text}");
    let edits = [
        ("write_file", json!({"path": "data/x.txt", "content": "x"})),
        ("write_file", json!({"path": "d/admin.token", "content": "x"})),
        ("delete_path", json!({"path": "data/mira.db"})),
        ("move_path", json!({"from": "data", "to": "elsewhere"})),
    ];
    for (i, (tool, input)) in edits.into_iter().enumerate() {
        let r = t.call(&token, &run, &turn, tool, &format!("e{i}"), input.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{tool} {input}: {r:?}");
        assert!(r.body.to_string().contains("outside_workspace"), "{tool} {input}: {r:?}");
    }
    let after = files(&t.data_dir);
    let kept = |list: &[(String, String)], name: &str| list.iter().find(|(n, _)| n == name).cloned();
    assert_eq!(kept(&after, "admin.token"), kept(&before, "admin.token"));
    assert!(after.iter().any(|(n, _)| n == "mira.db") == before.iter().any(|(n, _)| n == "mira.db"));
    assert!(!t.data_dir.join("x.txt").exists());
}

both_backends!(data_dir_inside_the_workspace_is_never_opened);
