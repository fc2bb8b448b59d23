#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Exact-invocation approval and the Edit tools, over HTTP on SQLite and on Postgres: the
//! drift, changed input, stale and foreign grants, racing decisions (one server and two),
//! restarts, every workspace-boundary escape, replace_block's text rules, a real OS-level
//! write failure, the single gate for every gated tool, and nothing lowering the bar.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Backend, Options, Resp, TestApp, TestTool, spawn_with};
use mira::evidence::sha256_hex;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// One user with a run and a turn on a fresh server.
struct Fx {
    t: TestApp,
    token: String,
    user_id: String,
    token_id: String,
    run: String,
    turn: String,
}

async fn fx(backend: Backend) -> Fx {
    fx_with(backend, Options::default()).await
}

async fn fx_with(backend: Backend, options: Options) -> Fx {
    let t = spawn_with(backend, options).await;
    let token = t.user("alice").await;
    let ident = t.app().store.identity_by_token(&mira::auth::hash_token(&token)).await.unwrap().unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "edit the files").await;
    Fx { t, token, user_id: ident.user_id, token_id: ident.token_id, run, turn }
}

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("{key} missing in {v}")).to_owned()
}

impl Fx {
    fn decider(&self) -> mira::store::Decider<'_> {
        mira::store::Decider { user_id: &self.user_id, token_id: &self.token_id, may_second: false }
    }

    fn ws(&self) -> &Path {
        &self.t.workspace
    }

    async fn call(&self, tool: &str, call: &str, input: Value) -> Resp {
        self.t.call(&self.token, &self.run, &self.turn, tool, call, input).await
    }

    /// Freezes a call that must wait for approval; returns the invocation view.
    async fn frozen(&self, tool: &str, call: &str, input: Value) -> Value {
        let r = self.call(tool, call, input).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        r.body
    }

    async fn grant_triple(&self, approval: &str, tool_id: &str, call: &str, hash: &str) -> Resp {
        self.t
            .post(
                &format!("/v1/approvals/{approval}/grant"),
                &self.token,
                json!({"tool_id": tool_id, "tool_call_id": call, "input_hash": hash}),
            )
            .await
    }

    /// Grants `inv`'s approval echoing its own triple.
    async fn grant(&self, inv: &Value) -> Resp {
        self.grant_triple(&s(inv, "approval_id"), &s(inv, "tool_id"), &s(inv, "tool_call_id"), &s(inv, "input_hash"))
            .await
    }

    async fn deny(&self, approval: &str) -> Resp {
        self.t.post(&format!("/v1/approvals/{approval}/deny"), &self.token, json!({"reason": "no"})).await
    }

    async fn inv(&self, id: &str) -> Value {
        let r = self.t.get(&format!("/v1/invocations/{id}"), &self.token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body
    }

    async fn wait_final(&self, inv: &Value) -> Value {
        self.t.wait_final(&self.token, &s(inv, "invocation_id")).await
    }

    /// Grants and waits for the result, which must be `completed`.
    async fn run_approved(&self, inv: &Value) -> Value {
        let g = self.grant(inv).await;
        assert_eq!(g.status, StatusCode::OK, "{g:?}");
        let done = self.wait_final(inv).await;
        assert_eq!(done["status"], "completed", "{done}");
        done
    }

    /// The run's stored events as (type, data).
    async fn events(&self) -> Vec<(String, Value)> {
        let rows = self.t.app().store.events_after(&self.run, 0, 100_000).await.unwrap();
        rows.into_iter().map(|e| (e.kind, serde_json::from_str(&e.data).unwrap())).collect()
    }

    /// How many events of `kind` name invocation `id`.
    async fn count(&self, kind: &str, id: &str) -> usize {
        self.events().await.iter().filter(|(k, d)| k == kind && d["invocation_id"] == id).count()
    }
}

/// A fingerprint of a directory tree, symlinks not followed: every entry's path, kind,
/// mode, and content hash (files) or link target (symlinks).
fn tree_hash(root: &Path) -> String {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode();
            let kind = meta.file_type();
            if kind.is_symlink() {
                out.push(format!("l {rel} -> {}", std::fs::read_link(&path).unwrap().display()));
            } else if kind.is_dir() {
                out.push(format!("d {rel} {mode:o}"));
                walk(root, &path, out);
            } else if kind.is_file() {
                out.push(format!("f {rel} {mode:o} {}", sha256_hex(&std::fs::read(&path).unwrap())));
            } else {
                out.push(format!("o {rel} {mode:o}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    sha256_hex(out.join("\n").as_bytes())
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

fn sha_of(path: &Path) -> String {
    sha256_hex(&std::fs::read(path).unwrap())
}

// 1. ---------------------------------------------------------------------------------------

async fn drift_same_input_other_call_id_never_shares_a_grant(backend: Backend) {
    let f = fx(backend).await;
    let input = json!({"path": "drift.txt", "content": "approved once\n"});
    let first = f.frozen("write_file", "call-A", input.clone()).await;
    let second = f.frozen("write_file", "call-B", input).await;
    assert_eq!(first["input_hash"], second["input_hash"], "same tool and input hash alike");
    assert_ne!(first["approval_id"], second["approval_id"]);

    // A's triple presented at B's approval: the call id differs → 409, nothing granted.
    let replay = f.grant_triple(&s(&second, "approval_id"), "write_file", "call-A", &s(&first, "input_hash")).await;
    assert_eq!((replay.status, replay.code()), (StatusCode::CONFLICT, "approval_mismatch"), "{replay:?}");
    assert_eq!(replay.body["error"]["details"]["mismatched"], json!(["tool_call_id"]));

    f.run_approved(&first).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("drift.txt")).unwrap(), "approved once\n");
    // The same grant again (a retried request) → 409 approval_decided.
    let again = f.grant(&first).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "approval_decided"), "{again:?}");
    // A's grant against B's approval after A ran: still 409.
    let replay = f.grant_triple(&s(&second, "approval_id"), "write_file", "call-A", &s(&first, "input_hash")).await;
    assert_eq!(replay.code(), "approval_mismatch");

    // B never ran: remove the file, give the harness time, it stays gone.
    std::fs::remove_file(f.ws().join("drift.txt")).unwrap();
    f.t.app().harness.wake();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!f.ws().join("drift.txt").exists());
    let b = f.inv(&s(&second, "invocation_id")).await;
    assert_eq!(b["status"], "awaiting_approval", "{b}");
    assert_eq!(f.count("execution.started", &s(&first, "invocation_id")).await, 1);
    assert_eq!(f.count("execution.started", &s(&second, "invocation_id")).await, 0);
    let pending = f.t.get("/v1/approvals?status=pending", &f.token).await;
    let ids: Vec<&Value> = pending.body["approvals"].as_array().unwrap().iter().map(|a| &a["id"]).collect();
    assert_eq!(ids, [&second["approval_id"]]);
}

// 2. ---------------------------------------------------------------------------------------

async fn changed_input_is_a_new_invocation_with_its_own_approval(backend: Backend) {
    let f = fx(backend).await;
    let first = f.frozen("write_file", "c1", json!({"path": "x.txt", "content": "abc"})).await;
    // Same triple again → 200, same invocation and approval.
    let same = f.call("write_file", "c1", json!({"content": "abc", "path": "./x.txt"})).await;
    assert_eq!(same.status, StatusCode::OK, "{same:?}");
    assert_eq!(
        (&same.body["invocation_id"], &same.body["approval_id"]),
        (&first["invocation_id"], &first["approval_id"])
    );
    // One byte changed under the same call id → 409.
    let changed = f.call("write_file", "c1", json!({"path": "x.txt", "content": "abd"})).await;
    assert_eq!((changed.status, changed.code()), (StatusCode::CONFLICT, "tool_call_id_conflict"), "{changed:?}");
    // Another target under the same call id → 409.
    let moved = f.call("write_file", "c1", json!({"path": "y.txt", "content": "abc"})).await;
    assert_eq!(moved.code(), "tool_call_id_conflict");
    // A default made explicit is the same canonical input (create_dirs: false).
    let explicit = f.call("write_file", "c1", json!({"path": "x.txt", "content": "abc", "create_dirs": false})).await;
    assert_eq!(explicit.status, StatusCode::OK, "{explicit:?}");
    // The changed input with a new call id → a new invocation with its own approval.
    let second = f.frozen("write_file", "c2", json!({"path": "x.txt", "content": "abd"})).await;
    assert_ne!(second["input_hash"], first["input_hash"]);
    let pending = f.t.get("/v1/approvals?status=pending", &f.token).await;
    assert_eq!(pending.body["approvals"].as_array().unwrap().len(), 2, "{pending:?}");
    // The canonical input carries the resolved target.
    let view = f.t.get(&format!("/v1/approvals/{}", s(&first, "approval_id")), &f.token).await;
    let resolved = f.ws().join("x.txt").display().to_string();
    assert_eq!(view.body["invocation"]["input"]["resolved_path"], resolved.as_str());
    assert_eq!(view.body["invocation"]["input"]["path"], "x.txt");
    // Granting the first still writes the first's content, not the second's.
    f.run_approved(&first).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("x.txt")).unwrap(), "abc");
    // A retried freeze of the executed call is still an idempotent 200.
    let retried = f.call("write_file", "c1", json!({"path": "x.txt", "content": "abc"})).await;
    assert_eq!((retried.status, &retried.body["status"]), (StatusCode::OK, &json!("completed")), "{retried:?}");
}

// 3 and 11. --------------------------------------------------------------------------------

async fn stale_or_edited_grants_change_nothing(backend: Backend) {
    let f = fx(backend).await;
    std::fs::write(f.ws().join("keep.txt"), "original\n").unwrap();
    let inv = f.frozen("write_file", "w", json!({"path": "keep.txt", "content": "replaced\n"})).await;
    let apr = s(&inv, "approval_id");
    let hash = s(&inv, "input_hash");
    let other_hash = mira::invocation::canonical::input_hash("write_file", &json!({"path": "keep.txt"}));
    for (tool, call, h, differs) in [
        ("write_file", "w", other_hash.as_str(), "input_hash"),
        ("write_file", "w", &hash[..63], "input_hash"),
        ("delete_path", "w", hash.as_str(), "tool_id"),
        ("write_file", "w2", hash.as_str(), "tool_call_id"),
    ] {
        let r = f.grant_triple(&apr, tool, call, h).await;
        assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "approval_mismatch"), "{r:?}");
        assert_eq!(r.body["error"]["details"]["mismatched"], json!([differs]));
    }
    // 11: the approver cannot edit — a grant body carrying input or another field is refused.
    for body in [
        json!({"tool_id": "write_file", "tool_call_id": "w", "input_hash": hash, "input": {"path": "keep.txt", "content": "evil"}}),
        json!({"tool_id": "write_file", "tool_call_id": "w", "input_hash": hash, "requires_approval": false}),
        json!({"tool_id": "write_file", "tool_call_id": "w"}),
    ] {
        let r = f.t.post(&format!("/v1/approvals/{apr}/grant"), &f.token, body).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{r:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("keep.txt")).unwrap(), "original\n");
    let view = f.t.get(&format!("/v1/approvals/{apr}"), &f.token).await;
    assert_eq!(
        (view.body["status"].as_str(), view.body["invocation"]["status"].as_str()),
        (Some("pending"), Some("awaiting_approval"))
    );
    // Another user cannot see or decide it (404, never 403).
    let mallory = f.t.user("mallory").await;
    let inbox = f.t.get("/v1/approvals?status=pending", &mallory).await;
    assert_eq!(inbox.body["approvals"], json!([]));
    assert_eq!(f.t.get(&format!("/v1/approvals/{apr}"), &mallory).await.status, StatusCode::NOT_FOUND);
    let body = json!({"tool_id": "write_file", "tool_call_id": "w", "input_hash": hash});
    let r = f.t.post(&format!("/v1/approvals/{apr}/grant"), &mallory, body).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(f.t.post(&format!("/v1/approvals/{apr}/deny"), &mallory, json!({})).await.status, StatusCode::NOT_FOUND);
    // The exact triple still works afterwards, once.
    f.run_approved(&inv).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("keep.txt")).unwrap(), "replaced\n");
}

// 4. ---------------------------------------------------------------------------------------

async fn twenty_concurrent_grants_execute_once(backend: Backend) {
    let f = fx(backend).await;
    std::fs::write(f.ws().join("counter.txt"), "runs:\n").unwrap();
    // Each execution appends one line after "runs:\n": the file counts executions.
    let inv = f
        .frozen("replace_block", "once", json!({"path": "counter.txt", "old": "runs:\n", "new": "runs:\nran\n"}))
        .await;
    let grants = (0..20).map(|_| f.grant(&inv));
    let results = futures::future::join_all(grants).await;
    let ok = results.iter().filter(|r| r.status == StatusCode::OK).count();
    let decided = results.iter().filter(|r| r.status == StatusCode::CONFLICT && r.code() == "approval_decided").count();
    assert_eq!((ok, decided), (1, 19), "{results:?}");
    let done = f.wait_final(&inv).await;
    assert_eq!(done["status"], "completed", "{done}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("counter.txt")).unwrap(), "runs:\nran\n");
    let id = s(&inv, "invocation_id");
    assert_eq!(f.count("approval.granted", &id).await, 1);
    assert_eq!(f.count("execution.started", &id).await, 1);
    assert_eq!(done["evidence_ids"].as_array().unwrap().len(), 1);

    // A counting tool as well: twenty grants, one execution.
    let tool = TestTool::new("counted_action", "an action that needs approval", true);
    let runs = tool.runs.clone();
    f.t.app().registry.register(Arc::new(tool)).unwrap();
    let (turn, _) = f.t.turn(&f.token, &f.run, "counted").await;
    let r = f.t.call(&f.token, &f.run, &turn, "counted_action", "count-1", json!({"value": "x"})).await;
    let results = futures::future::join_all((0..20).map(|_| f.grant(&r.body))).await;
    assert_eq!(results.iter().filter(|r| r.status == StatusCode::OK).count(), 1);
    f.wait_final(&r.body).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn two_servers_on_one_store_run_each_grant_once(backend: Backend) {
    let f = fx(backend).await;
    let other_data = tempfile::tempdir().unwrap();
    let mut settings = f.t.settings.clone();
    settings.data_dir = other_data.path().to_path_buf();
    let b = mira::server::Server::start(settings).await.unwrap();
    let base_b = format!("http://{}", b.addr);
    std::fs::create_dir(f.ws().join("many")).unwrap();
    let mut invs = Vec::new();
    for i in 0..12 {
        let path = format!("many/{i}.txt");
        std::fs::write(f.ws().join(&path), "n\n").unwrap();
        invs.push(
            f.frozen("replace_block", &format!("m{i}"), json!({"path": path, "old": "n\n", "new": "n\nran\n"})).await,
        );
    }
    // Every approval is granted twice at once, through server A and through server B.
    let client = reqwest::Client::new();
    let mut attempts = Vec::new();
    for inv in &invs {
        for base in [f.t.base.clone(), base_b.clone()] {
            let url = format!("{base}/v1/approvals/{}/grant", s(inv, "approval_id"));
            let body = json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]});
            let req = client.post(url).bearer_auth(&f.token).json(&body);
            attempts.push(async move { req.send().await.unwrap().status() });
        }
    }
    let statuses = futures::future::join_all(attempts).await;
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), invs.len(), "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::CONFLICT).count(), invs.len(), "{statuses:?}");
    for (i, inv) in invs.iter().enumerate() {
        let done = f.wait_final(inv).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(std::fs::read_to_string(f.ws().join(format!("many/{i}.txt"))).unwrap(), "n\nran\n");
        assert_eq!(f.count("execution.started", &s(inv, "invocation_id")).await, 1);
    }
    b.shutdown().await;
}

// 5. ---------------------------------------------------------------------------------------

async fn restart_between_grant_and_execution_executes_once(backend: Backend) {
    let mut f = fx(backend).await;
    let before = f.frozen("write_file", "before-crash", json!({"path": "r1.txt", "content": "one\n"})).await;
    let after = f.frozen("write_file", "after-restart", json!({"path": "r2.txt", "content": "two\n"})).await;
    // The server stops; the grant lands in the store while nothing can execute it (the state
    // a crash right after the grant's commit leaves behind).
    f.t.stop().await;
    let store = mira::server::open_store(&f.t.data_dir, &f.t.db.url).await.unwrap();
    let triple = mira::store::GrantRequest {
        tool_id: "write_file",
        tool_call_id: "before-crash",
        input_hash: before["input_hash"].as_str().unwrap(),
    };
    let outcome = store.grant_approval(&f.decider(), &s(&before, "approval_id"), &triple).await.unwrap();
    assert!(matches!(outcome, mira::store::DecideOutcome::Decided(_)), "{outcome:?}");
    store.close().await;
    assert!(!f.ws().join("r1.txt").exists());
    f.t.restart().await;
    let done = f.wait_final(&before).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(f.ws().join("r1.txt")).unwrap(), "one\n");
    // The other approval survived the restart and a grant after it executes.
    let pending = f.t.get("/v1/approvals?status=pending", &f.token).await;
    assert_eq!(pending.body["approvals"][0]["id"], after["approval_id"], "{pending:?}");
    f.run_approved(&after).await;
    assert_eq!(std::fs::read_to_string(f.ws().join("r2.txt")).unwrap(), "two\n");
    // Another restart re-runs nothing.
    std::fs::remove_file(f.ws().join("r1.txt")).unwrap();
    f.t.restart().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!f.ws().join("r1.txt").exists());
    assert_eq!(f.count("execution.started", &s(&before, "invocation_id")).await, 1);
    assert_eq!(f.count("execution.started", &s(&after, "invocation_id")).await, 1);
}

// 6. ---------------------------------------------------------------------------------------

async fn boundary_escapes_are_refused_and_change_nothing(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path();
    std::fs::write(out.join("secret.txt"), "secret\n").unwrap();
    std::fs::write(ws.join("inside.txt"), "inside\n").unwrap();
    std::fs::create_dir(ws.join("dir")).unwrap();
    std::fs::write(ws.join("dir/f.txt"), "f\n").unwrap();
    std::os::unix::fs::symlink(out, ws.join("link-out")).unwrap();
    std::os::unix::fs::symlink(out.join("secret.txt"), ws.join("file-link")).unwrap();
    std::os::unix::fs::symlink("inside.txt", ws.join("inner-link")).unwrap();
    std::os::unix::fs::symlink("loop", ws.join("loop")).unwrap();
    std::fs::hard_link(out.join("secret.txt"), ws.join("hard.txt")).unwrap();
    mkfifo(&ws.join("fifo"));
    let _socket = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    // A character device (needs CAP_MKNOD; the FIFO and socket cover the rule without it).
    let device = std::process::Command::new("mknod")
        .arg(ws.join("null"))
        .args(["c", "1", "3"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let ws_before = tree_hash(&ws);
    let out_before = tree_hash(out);

    let mut cases: Vec<(&str, Value, &str)> = vec![
        ("write_file", json!({"path": "../escape.txt", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "dir/../../escape.txt", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": out.join("abs.txt").display().to_string(), "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "link-out/new.txt", "content": "x"}), "outside_workspace"),
        (
            "write_file",
            json!({"path": "link-out/sub/new.txt", "content": "x", "create_dirs": true}),
            "outside_workspace",
        ),
        ("write_file", json!({"path": "link-out/secret.txt", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "file-link", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "inner-link", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "loop", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "loop/x", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "hard.txt", "content": "x"}), "outside_workspace"),
        ("write_file", json!({"path": "fifo", "content": "x"}), "unsupported_file_type"),
        ("write_file", json!({"path": "sock", "content": "x"}), "unsupported_file_type"),
        ("write_file", json!({"path": ".", "content": "x"}), "workspace_root"),
        ("write_file", json!({"path": "dir", "content": "x"}), "is_a_directory"),
        ("write_file", json!({"path": "inside.txt/x", "content": "x"}), "not_a_directory"),
        ("replace_block", json!({"path": "file-link", "old": "secret", "new": "x"}), "outside_workspace"),
        ("replace_block", json!({"path": "link-out/secret.txt", "old": "secret", "new": "x"}), "outside_workspace"),
        ("replace_block", json!({"path": "hard.txt", "old": "secret", "new": "x"}), "outside_workspace"),
        ("replace_block", json!({"path": "fifo", "old": "a", "new": "b"}), "unsupported_file_type"),
        ("replace_block", json!({"path": "../ws/inside.txt", "old": "inside", "new": "x"}), "outside_workspace"),
        ("delete_path", json!({"path": "."}), "workspace_root"),
        ("delete_path", json!({"path": "./"}), "workspace_root"),
        ("delete_path", json!({"path": ".."}), "outside_workspace"),
        ("delete_path", json!({"path": "/etc/hostname"}), "outside_workspace"),
        ("delete_path", json!({"path": "link-out", "recursive": true}), "outside_workspace"),
        ("delete_path", json!({"path": "link-out/secret.txt"}), "outside_workspace"),
        ("delete_path", json!({"path": "file-link"}), "outside_workspace"),
        ("delete_path", json!({"path": "hard.txt"}), "outside_workspace"),
        ("delete_path", json!({"path": "fifo"}), "unsupported_file_type"),
        ("delete_path", json!({"path": "dir"}), "recursive_required"),
        ("move_path", json!({"from": ".", "to": "elsewhere"}), "workspace_root"),
        ("move_path", json!({"from": "inside.txt", "to": "."}), "workspace_root"),
        ("move_path", json!({"from": "dir", "to": "dir/sub"}), "move_into_itself"),
        ("move_path", json!({"from": "inside.txt", "to": "inside.txt"}), "same_path"),
        ("move_path", json!({"from": "inside.txt", "to": "../inside.txt"}), "outside_workspace"),
        ("move_path", json!({"from": "inside.txt", "to": "link-out/inside.txt"}), "outside_workspace"),
        ("move_path", json!({"from": "link-out/secret.txt", "to": "stolen.txt"}), "outside_workspace"),
        ("move_path", json!({"from": "file-link", "to": "moved-link"}), "outside_workspace"),
        ("move_path", json!({"from": "hard.txt", "to": "moved-hard.txt"}), "outside_workspace"),
        ("move_path", json!({"from": "fifo", "to": "moved-fifo"}), "unsupported_file_type"),
        ("move_path", json!({"from": "inside.txt", "to": "dir/f.txt"}), "already_exists"),
        ("move_path", json!({"from": "inside.txt", "to": "dir", "overwrite": true}), "destination_is_directory"),
        ("move_path", json!({"from": "inside.txt", "to": "file-link", "overwrite": true}), "outside_workspace"),
    ];
    if device {
        cases.push(("write_file", json!({"path": "null", "content": "x"}), "unsupported_file_type"));
        cases.push(("replace_block", json!({"path": "null", "old": "a", "new": "b"}), "unsupported_file_type"));
        cases.push(("delete_path", json!({"path": "null"}), "unsupported_file_type"));
    }
    for (i, (tool, input, code)) in cases.iter().enumerate() {
        let r = f.call(tool, &format!("escape-{i}"), input.clone()).await;
        assert_eq!(r.code(), *code, "{tool} {input}: {r:?}");
        assert!(r.status.is_client_error(), "{r:?}");
    }
    let list = f.t.get(&format!("/v1/runs/{}/invocations", f.run), &f.token).await;
    assert_eq!(list.body["invocations"], json!([]), "no escape was frozen");
    assert_eq!(tree_hash(&ws), ws_before, "the workspace is unchanged");
    assert_eq!(tree_hash(out), out_before, "outside is unchanged");

    // Swapped between check (freeze) and use (execution).
    std::fs::create_dir(ws.join("sw")).unwrap();
    std::fs::write(ws.join("swap.txt"), "swap\n").unwrap();
    std::fs::write(ws.join("hl.txt"), "secret\n").unwrap();
    std::fs::create_dir(ws.join("deldir")).unwrap();
    std::fs::write(ws.join("deldir/keep.txt"), "k\n").unwrap();
    std::fs::write(ws.join("mv.txt"), "mv\n").unwrap();
    std::fs::create_dir(ws.join("mvdir")).unwrap();
    std::fs::write(ws.join("later-fifo"), "regular for now\n").unwrap();
    let swaps = [
        f.frozen("write_file", "s1", json!({"path": "sw/target.txt", "content": "x"})).await,
        f.frozen("write_file", "s2", json!({"path": "swap.txt", "content": "x"})).await,
        f.frozen("replace_block", "s3", json!({"path": "hl.txt", "old": "secret", "new": "pwned"})).await,
        f.frozen("delete_path", "s4", json!({"path": "deldir", "recursive": true})).await,
        f.frozen("move_path", "s5", json!({"from": "mv.txt", "to": "mvdir/mv.txt"})).await,
        f.frozen("write_file", "s6", json!({"path": "later-fifo", "content": "x"})).await,
    ];
    std::fs::rename(ws.join("sw"), ws.join("sw.real")).unwrap();
    std::os::unix::fs::symlink(out, ws.join("sw")).unwrap();
    std::fs::remove_file(ws.join("swap.txt")).unwrap();
    std::os::unix::fs::symlink(out.join("secret.txt"), ws.join("swap.txt")).unwrap();
    std::fs::remove_file(ws.join("hl.txt")).unwrap();
    std::fs::hard_link(out.join("secret.txt"), ws.join("hl.txt")).unwrap();
    std::fs::rename(ws.join("deldir"), ws.join("deldir.real")).unwrap();
    std::os::unix::fs::symlink(out, ws.join("deldir")).unwrap();
    std::fs::rename(ws.join("mvdir"), ws.join("mvdir.real")).unwrap();
    std::os::unix::fs::symlink(out, ws.join("mvdir")).unwrap();
    std::fs::remove_file(ws.join("later-fifo")).unwrap();
    mkfifo(&ws.join("later-fifo"));
    let ws_swapped = tree_hash(&ws);
    let expected = [
        "outside_workspace",
        "outside_workspace",
        "outside_workspace",
        "outside_workspace",
        "outside_workspace",
        "unsupported_file_type",
    ];
    for (inv, code) in swaps.iter().zip(expected) {
        assert_eq!(f.grant(inv).await.status, StatusCode::OK);
        let done = f.wait_final(inv).await;
        assert_eq!(
            (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
            (Some("failed"), Some(code)),
            "{done}"
        );
    }
    assert_eq!(tree_hash(&ws), ws_swapped, "the workspace is unchanged by the refused executions");
    assert_eq!(tree_hash(out), out_before, "outside is unchanged");
}

// 7. ---------------------------------------------------------------------------------------

async fn replace_block_keeps_line_endings_and_encoding(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    std::fs::write(ws.join("crlf.txt"), "line one\r\nline two\r\nline three\r\n").unwrap();
    // `old` copied from read_open's output (CRLF kept), `new` written byte for byte.
    let read = f.call("read_open", "open-crlf", json!({"path": "crlf.txt", "start_line": 2, "end_line": 2})).await;
    let read = f.t.wait_final(&f.token, &s(&read.body, "invocation_id")).await;
    let copied = read["result"]["output"]["content"].as_str().unwrap().to_owned();
    assert_eq!(copied, "line two\r\n");
    let sha = s(&read["result"]["output"], "sha256");
    let inv = f
        .frozen(
            "replace_block",
            "crlf-1",
            json!({"path": "crlf.txt", "old": copied, "new": "  line  2 \t\r\n", "expected_sha256": sha}),
        )
        .await;
    let apr = f.t.get(&format!("/v1/approvals/{}", s(&inv, "approval_id")), &f.token).await;
    let diff = apr.body["preview"]["tool"]["diff"].as_str().unwrap();
    assert!(diff.starts_with("--- a/crlf.txt\n+++ b/crlf.txt\n"), "{diff}");
    assert!(diff.contains("-line two\r\n+  line  2 \t\r\n"), "{diff}");
    let done = f.run_approved(&inv).await;
    assert_eq!(std::fs::read(ws.join("crlf.txt")).unwrap(), b"line one\r\n  line  2 \t\r\nline three\r\n");
    let out = &done["result"]["output"];
    assert_eq!((out["line_ending"].as_str(), out["line_endings_adapted"].as_bool()), (Some("crlf"), Some(false)));
    assert_eq!(out["sha256_before"], sha.as_str());
    assert_eq!(out["sha256_after"], sha_of(&ws.join("crlf.txt")).as_str());
    // The same block typed with plain LFs still matches, and the file stays CRLF.
    let inv = f
        .frozen(
            "replace_block",
            "crlf-2",
            json!({"path": "crlf.txt", "old": "line three\n", "new": "line 3\nline 4\n"}),
        )
        .await;
    let done = f.run_approved(&inv).await;
    assert_eq!(std::fs::read(ws.join("crlf.txt")).unwrap(), b"line one\r\n  line  2 \t\r\nline 3\r\nline 4\r\n");
    assert_eq!(done["result"]["output"]["line_endings_adapted"], true);

    // A block that occurs twice: refused at freeze time with the count, then both replaced.
    std::fs::write(ws.join("dup.txt"), "x = 1\ny = 2\nx = 1\n").unwrap();
    let r = f.call("replace_block", "dup-1", json!({"path": "dup.txt", "old": "x = 1\n", "new": "x = 9\n"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "occurrence_mismatch"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["count"], 2);
    assert_eq!(r.body["error"]["details"]["lines"], json!([1, 3]));
    assert!(r.body["error"]["message"].as_str().unwrap().contains("2 times"));
    let inv = f
        .frozen(
            "replace_block",
            "dup-2",
            json!({"path": "dup.txt", "old": "x = 1\n", "new": "x = 9\n", "expected_occurrences": 2}),
        )
        .await;
    f.run_approved(&inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("dup.txt")).unwrap(), "x = 9\ny = 2\nx = 9\n");

    // Not found: the count (0) and the closest candidates; whitespace differences are
    // located, never rewritten.
    let r = f.call("replace_block", "nf-1", json!({"path": "dup.txt", "old": "y  =  2", "new": "y = 3"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "block_not_found"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["candidates"][0]["kind"], "whitespace_differs");
    assert_eq!(r.body["error"]["details"]["candidates"][0]["line"], 2);
    let r = f.call("replace_block", "nf-2", json!({"path": "dup.txt", "old": "y = 22", "new": "y = 3"})).await;
    assert_eq!(r.code(), "block_not_found");
    assert_eq!(r.body["error"]["details"]["candidates"][0]["line"], 2);
    assert_eq!(std::fs::read_to_string(ws.join("dup.txt")).unwrap(), "x = 9\ny = 2\nx = 9\n");

    // UTF-16LE with a byte-order mark: decoded, replaced, re-encoded the same way.
    let utf16 = |text: &str| -> Vec<u8> {
        [0xFF, 0xFE].into_iter().chain(text.encode_utf16().flat_map(u16::to_le_bytes)).collect()
    };
    std::fs::write(ws.join("wide.txt"), utf16("hello wörld\r\nbye\r\n")).unwrap();
    let inv = f.frozen("replace_block", "wide", json!({"path": "wide.txt", "old": "wörld", "new": "welt"})).await;
    let done = f.run_approved(&inv).await;
    assert_eq!(std::fs::read(ws.join("wide.txt")).unwrap(), utf16("hello welt\r\nbye\r\n"));
    assert_eq!(done["result"]["output"]["encoding"], "utf-16le");

    // Binary and non-UTF-8 files are refused; nothing written.
    std::fs::write(ws.join("blob.bin"), b"\x7fELF\0\0\x01abc").unwrap();
    let r = f.call("replace_block", "bin", json!({"path": "blob.bin", "old": "abc", "new": "xyz"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "binary_file"), "{r:?}");
    std::fs::write(ws.join("latin1.txt"), b"caf\xe9 abc\n").unwrap();
    let r = f.call("replace_block", "latin", json!({"path": "latin1.txt", "old": "abc", "new": "xyz"})).await;
    assert_eq!(r.code(), "unsupported_encoding", "{r:?}");
    assert_eq!(std::fs::read(ws.join("blob.bin")).unwrap(), b"\x7fELF\0\0\x01abc");

    // The file changed after the freeze: the frozen precondition (the SHA-256 the preview
    // showed) no longer holds, so execution refuses with stale_target and writes nothing.
    std::fs::write(ws.join("moving.txt"), "alpha\nbeta\n").unwrap();
    let inv =
        f.frozen("replace_block", "moving", json!({"path": "moving.txt", "old": "beta\n", "new": "gamma\n"})).await;
    std::fs::write(ws.join("moving.txt"), "alpha\n").unwrap();
    f.grant(&inv).await;
    let done = f.wait_final(&inv).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("stale_target"))
    );
    assert_eq!(std::fs::read_to_string(ws.join("moving.txt")).unwrap(), "alpha\n");
}

// 7b. --------------------------------------------------------------------------------------

/// Runs the rest of the test in a child process of this test binary with `RLIMIT_FSIZE`
/// lowered: the limit is per process, and must not touch other tests running beside it.
async fn os_level_write_failure_is_a_failed_invocation(backend: Backend) {
    const CHILD: &str = "MIRA_TEST_FSIZE_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let name = match backend {
            Backend::Sqlite => "approval::os_level_write_failure_is_a_failed_invocation::sqlite",
            Backend::Postgres => "approval::os_level_write_failure_is_a_failed_invocation::postgres",
        };
        let out = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .output()
            .await
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
        return;
    }
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    // 20 MiB file; the process may then write files of at most 16 MiB.
    let line = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklm\n";
    let mut big = String::from("HEADER\n");
    while big.len() < 20 * 1024 * 1024 {
        big.push_str(line);
    }
    std::fs::write(ws.join("big.txt"), &big).unwrap();
    let before = sha_of(&ws.join("big.txt"));
    let inv = f.frozen("replace_block", "big", json!({"path": "big.txt", "old": "HEADER\n", "new": "HEAD\n"})).await;
    let limit = 16 * 1024 * 1024;
    // SAFETY: plain libc calls on this process; SIGXFSZ is ignored so that a write past the
    // limit fails with EFBIG instead of killing the process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let rl = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rl), 0);
    }
    assert_eq!(f.grant(&inv).await.status, StatusCode::OK);
    let done = f.wait_final(&inv).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["ok"], false);
    let error = &done["result"]["error"];
    assert_eq!(error["code"], "no_space", "{done}");
    assert_eq!(error["details"]["os_error"], libc::EFBIG, "{done}");
    assert!(error["message"].as_str().unwrap().contains("too large"), "{done}");
    assert_eq!(sha_of(&ws.join("big.txt")), before, "the old file is intact");
    let leftovers: Vec<String> =
        std::fs::read_dir(&ws).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(leftovers, ["big.txt"], "no temporary file left behind");
    assert_eq!(f.count("execution.failed", &s(&inv, "invocation_id")).await, 1);
    assert_eq!(f.count("execution.completed", &s(&inv, "invocation_id")).await, 0);
}

// 8. ---------------------------------------------------------------------------------------

async fn grant_and_deny_one_decision_stands(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    // Grant, then deny: the deny is 409 and the grant stands.
    let a = f.frozen("write_file", "gd", json!({"path": "gd.txt", "content": "granted"})).await;
    let g = f.grant(&a).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(
        (g.body["decided_by"].as_str(), g.body["decided_token_id"].as_str()),
        (Some(f.user_id.as_str()), Some(f.token_id.as_str()))
    );
    assert!(g.body["decided_at"].is_string());
    let d = f.deny(&s(&a, "approval_id")).await;
    assert_eq!((d.status, d.code()), (StatusCode::CONFLICT, "approval_decided"), "{d:?}");
    assert_eq!(f.wait_final(&a).await["status"], "completed");
    assert!(ws.join("gd.txt").exists());
    // Deny, then grant: the grant is 409 and nothing runs.
    let b = f.frozen("write_file", "dg", json!({"path": "dg.txt", "content": "denied"})).await;
    let d = f.deny(&s(&b, "approval_id")).await;
    assert_eq!(
        (d.status, d.body["status"].as_str(), d.body["reason"].as_str()),
        (StatusCode::OK, Some("denied"), Some("no"))
    );
    let g = f.grant(&b).await;
    assert_eq!((g.status, g.code()), (StatusCode::CONFLICT, "approval_decided"), "{g:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(f.inv(&s(&b, "invocation_id")).await["status"], "denied");
    assert!(!ws.join("dg.txt").exists());
    // Every decision is in the run's events with who, when and which token.
    let events = f.events().await;
    let granted = events.iter().find(|(k, d)| k == "approval.granted" && d["approval_id"] == a["approval_id"]).unwrap();
    let denied = events.iter().find(|(k, d)| k == "approval.denied" && d["approval_id"] == b["approval_id"]).unwrap();
    for (_, data) in [granted, denied] {
        assert_eq!(
            (data["decided_by"].as_str(), data["token_id"].as_str()),
            (Some(f.user_id.as_str()), Some(f.token_id.as_str()))
        );
        assert!(data["decided_at"].is_string());
    }

    // Racing: grant and deny at once, ten times; exactly one wins each time.
    for i in 0..10 {
        let path = format!("race-{i}.txt");
        let inv = f.frozen("write_file", &format!("race-{i}"), json!({"path": path, "content": "x"})).await;
        let apr = s(&inv, "approval_id");
        let (g, d) = tokio::join!(f.grant(&inv), f.deny(&apr));
        let winners = [&g, &d].iter().filter(|r| r.status == StatusCode::OK).count();
        assert_eq!(winners, 1, "{g:?} {d:?}");
        let loser = if g.status == StatusCode::OK { &d } else { &g };
        assert_eq!((loser.status, loser.code()), (StatusCode::CONFLICT, "approval_decided"), "{loser:?}");
        let done = f.wait_final(&inv).await;
        if g.status == StatusCode::OK {
            assert_eq!(done["status"], "completed", "{done}");
            assert!(ws.join(&path).exists());
        } else {
            assert_eq!(done["status"], "denied", "{done}");
            assert!(!ws.join(&path).exists());
            assert_eq!(f.count("execution.started", &s(&inv, "invocation_id")).await, 0);
        }
    }
}

async fn grant_and_cancel_race_cleanly(backend: Backend) {
    let f = fx(backend).await;
    for i in 0..15 {
        let path = format!("cancel-{i}.txt");
        let inv = f.frozen("write_file", &format!("cancel-{i}"), json!({"path": path, "content": "x"})).await;
        let id = s(&inv, "invocation_id");
        let cancel_url = format!("/v1/invocations/{id}/cancel");
        let cancel = f.t.post(&cancel_url, &f.token, json!({}));
        let (g, c) = tokio::join!(f.grant(&inv), cancel);
        for r in [&g, &c] {
            assert!(r.status == StatusCode::OK || r.status == StatusCode::CONFLICT, "round {i}: {r:?}");
        }
        let done = f.wait_final(&inv).await;
        let started = f.count("execution.started", &id).await;
        assert!(started <= 1);
        // A status never contradicts the file (issue 14.2; the 200-trial suite is in
        // hostile_approvals.rs): `cancelled` even after the execution started means unwritten.
        match done["status"].as_str() {
            Some("completed") => assert!(f.ws().join(&path).exists()),
            Some("cancelled") => assert!(!f.ws().join(&path).exists(), "round {i}: cancelled but written: {done}"),
            other => panic!("round {i}: unexpected {other:?}: {done}"),
        }
        if c.status == StatusCode::OK {
            assert_eq!(done["status"], "cancelled", "round {i}: the cancel answered 200: {done}");
        }
        if g.status == StatusCode::CONFLICT {
            assert_eq!(g.code(), "approval_decided");
            assert_eq!(started, 0);
        }
    }
}

async fn approvals_expire_and_can_be_cancelled(backend: Backend) {
    let runtime = mira::config::RuntimeConfig { approval_ttl_secs: 1, ..Options::default().runtime };
    let f = fx_with(backend, Options { runtime, ..Options::default() }).await;
    let inv = f.frozen("write_file", "ttl", json!({"path": "ttl.txt", "content": "late"})).await;
    let cancelled = f.frozen("write_file", "cancel-me", json!({"path": "c.txt", "content": "x"})).await;
    let r = f.t.post(&format!("/v1/invocations/{}/cancel", s(&cancelled, "invocation_id")), &f.token, json!({})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::OK, Some("cancelled")), "{r:?}");
    let g = f.grant(&cancelled).await;
    assert_eq!((g.status, g.code()), (StatusCode::CONFLICT, "approval_decided"), "{g:?}");
    let view = f.t.get(&format!("/v1/approvals/{}", s(&cancelled, "approval_id")), &f.token).await;
    assert_eq!(view.body["status"], "cancelled");
    assert_eq!(
        (view.body["decided_by"].as_str(), view.body["decided_token_id"].as_str()),
        (Some(f.user_id.as_str()), Some(f.token_id.as_str()))
    );
    let events = f.events().await;
    let (_, ev) = events.iter().find(|(k, _)| k == "invocation.cancelled").unwrap();
    assert_eq!((ev["token_id"].as_str(), ev["approval_cancelled"].as_bool()), (Some(f.token_id.as_str()), Some(true)));
    let done = f.wait_final(&inv).await;
    assert_eq!(done["status"], "expired", "{done}");
    let g = f.grant(&inv).await;
    assert_eq!((g.status, g.code()), (StatusCode::CONFLICT, "approval_expired"), "{g:?}");
    let view = f.t.get(&format!("/v1/approvals/{}", s(&inv, "approval_id")), &f.token).await;
    assert_eq!(view.body["status"], "expired");
    assert_eq!(f.count("approval.expired", &s(&inv, "invocation_id")).await, 1);
    assert!(!f.ws().join("ttl.txt").exists() && !f.ws().join("c.txt").exists());
}

// 9. ---------------------------------------------------------------------------------------

/// A valid input per gated tool for the HTTP part of the walk (tools without one are still
/// walked through the store and the internal path).
fn sample_input(tool: &str) -> Option<Value> {
    Some(match tool {
        "write_file" => json!({"path": "gate/w.txt", "content": "w"}),
        "replace_block" => json!({"path": "gate/r.txt", "old": "r", "new": "R"}),
        "delete_path" => json!({"path": "gate/d.txt"}),
        "move_path" => json!({"from": "gate/m.txt", "to": "gate/m2.txt"}),
        "gated_dynamic" | "mcp:srv_gate:tool:lookup" => json!({"value": "v"}),
        _ => return None,
    })
}

async fn every_gated_tool_is_refused_without_a_matching_grant(backend: Backend) {
    use mira::approval::policy::{self, Decision};
    let f = fx(backend).await;
    let app = f.t.app();
    let dynamic = TestTool::new("gated_dynamic", "a dynamic capability that acts", true);
    let mcp = TestTool::new("mcp:srv_gate:tool:lookup", "an External MCP tool whose server says readOnlyHint", false)
        .kind(mira::registry::ToolKind::McpProjection);
    let counters = [dynamic.runs.clone(), mcp.runs.clone()];
    app.registry.register(Arc::new(dynamic)).unwrap();
    app.registry.register(Arc::new(mcp)).unwrap();
    std::fs::create_dir(f.ws().join("gate")).unwrap();
    for name in ["r.txt", "d.txt", "m.txt"] {
        std::fs::write(f.ws().join("gate").join(name), "r").unwrap();
    }
    let (turn, exposure) = f.t.turn(&f.token, &f.run, "gate").await;
    let gated: Vec<String> = app
        .registry
        .all()
        .iter()
        .filter(|e| policy::decide(e.spec()) != Decision::Skip)
        .map(|e| e.spec().id.clone())
        .collect();
    for must in ["write_file", "replace_block", "delete_path", "move_path", "gated_dynamic", "mcp:srv_gate:tool:lookup"]
    {
        assert!(gated.iter().any(|g| g == must), "{must} is not gated: {gated:?}");
    }
    let ws_before = tree_hash(f.ws());
    let store = &app.store;
    let ws = mira::workspace::Workspace::open(f.ws()).unwrap();

    // (a) A call that reached the queue without any approval (as a buggy path would put it
    // there): the harness claims it and its gate refuses; the tool never runs.
    let mut bypassed = Vec::new();
    for tool in &gated {
        let input = sample_input(tool).unwrap_or(json!({}));
        let new = mira::store::NewInvocation {
            run_id: f.run.clone(),
            turn_id: turn.clone(),
            owner_id: f.user_id.clone(),
            tool_id: tool.clone(),
            tool_call_id: format!("bypass-{tool}"),
            input: input.to_string(),
            input_hash: mira::invocation::canonical::input_hash(tool, &input),
            approval: None,
            queue_tag: 0,
        };
        let mira::store::FreezeOutcome::Created(row, None) = store.freeze_invocation(&new).await.unwrap() else {
            panic!("expected a new invocation without approval");
        };
        assert_eq!(row.status.as_str(), "queued");
        bypassed.push(row.id);
    }
    app.harness.wake();
    for (tool, id) in gated.iter().zip(&bypassed) {
        let done = f.t.wait_final(&f.token, id).await;
        assert_eq!(
            (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
            (Some("failed"), Some("approval_required")),
            "{tool}: {done}"
        );
    }
    // (b) The internal path: no approval exists there, so a gated tool is refused.
    for tool in &gated {
        let input = sample_input(tool).unwrap_or(json!({}));
        let err = app.harness.call_internal(&f.user_id, &f.run, tool, ws.clone(), input).await.err();
        assert_eq!(err.map(|e| e.code.as_str()), Some("approval_required"), "{tool}");
    }
    assert_eq!(tree_hash(f.ws()), ws_before);
    assert!(counters.iter().all(|c| c.load(Ordering::SeqCst) == 0));

    // (c) Frozen properly (awaiting approval), then pushed to `queued` behind the approval's
    // back, then "granted" for another triple: never claimed, and the gate refuses each time.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&f.t.db.url).await.unwrap();
    let mut held = Vec::new();
    for tool in gated.iter().filter(|t| sample_input(t).is_some()) {
        assert!(exposure["tools"].as_array().unwrap().iter().any(|t| t["id"] == tool.as_str()), "{tool} not exposed");
        let r = f.t.call(&f.token, &f.run, &turn, tool, &format!("held-{tool}"), sample_input(tool).unwrap()).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{tool}: {r:?}");
        let id = s(&r.body, "invocation_id");
        sqlx::query("UPDATE invocations SET status = 'queued' WHERE id = $1").bind(&id).execute(&pool).await.unwrap();
        held.push((tool.clone(), id, r.body));
    }
    let tampered: [(&str, &str); 3] = [
        ("pending", "SELECT 1"),
        ("granted", "UPDATE approvals SET status = 'granted', tool_call_id = 'someone-else' WHERE invocation_id = $1"),
        (
            "granted",
            "UPDATE approvals SET tool_call_id = (SELECT tool_call_id FROM invocations WHERE id = $1), input_hash = 'ff' WHERE invocation_id = $1",
        ),
    ];
    for (state, sql) in tampered {
        for (tool, id, _) in &held {
            if sql != "SELECT 1" {
                sqlx::query(sql).bind(id).execute(&pool).await.unwrap();
            }
            let row = store.invocation_by_id(id).await.unwrap().unwrap();
            let entry = app.registry.get_any(tool).unwrap();
            let err = app.harness.gate(&row, &entry, None).await.err();
            assert_eq!(err.map(|e| e.code.as_str()), Some("approval_required"), "{tool} with a {state} approval");
        }
        app.harness.wake();
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (tool, id, _) in &held {
            assert_eq!(f.inv(id).await["status"], "queued", "{tool} was claimed with a {state} approval");
        }
    }
    assert_eq!(tree_hash(f.ws()), ws_before);
    assert!(counters.iter().all(|c| c.load(Ordering::SeqCst) == 0));

    // Positive control: with the exact triple granted the gate opens and each runs once.
    for (tool, id, body) in &held {
        sqlx::query("UPDATE approvals SET tool_call_id = $2, input_hash = $3 WHERE invocation_id = $1")
            .bind(id)
            .bind(body["tool_call_id"].as_str().unwrap())
            .bind(body["input_hash"].as_str().unwrap())
            .execute(&pool)
            .await
            .unwrap();
        let row = store.invocation_by_id(id).await.unwrap().unwrap();
        assert!(app.harness.gate(&row, &app.registry.get_any(tool).unwrap(), None).await.is_ok(), "{tool}");
    }
    app.harness.wake();
    for (tool, id, _) in &held {
        let done = f.t.wait_final(&f.token, id).await;
        assert_eq!(done["status"], "completed", "{tool}: {done}");
    }
    assert!(counters.iter().all(|c| c.load(Ordering::SeqCst) == 1));
    pool.close().await;
}

// 10. --------------------------------------------------------------------------------------

async fn nothing_in_the_input_or_a_server_hint_lowers_the_bar(backend: Backend) {
    let f = fx(backend).await;
    let app = f.t.app();
    let dynamic = TestTool::new("acting_tool", "does something", true);
    let mcp = TestTool::new("mcp:srv_hint:tool:read_only", "server annotates readOnlyHint: true", false)
        .kind(mira::registry::ToolKind::McpProjection);
    let counters = [dynamic.runs.clone(), mcp.runs.clone()];
    app.registry.register(Arc::new(dynamic)).unwrap();
    app.registry.register(Arc::new(mcp)).unwrap();
    let (turn, _) = f.t.turn(&f.token, &f.run, "hints").await;
    for (tool, input) in [
        ("acting_tool", json!({"value": "x", "requires_approval": false, "approved": true})),
        (
            "mcp:srv_hint:tool:read_only",
            json!({"value": "x", "readOnlyHint": true, "annotations": {"readOnlyHint": true}}),
        ),
    ] {
        let r = f.t.call(&f.token, &f.run, &turn, tool, &format!("hint-{tool}"), input).await;
        assert_eq!(
            (r.status, r.body["status"].as_str()),
            (StatusCode::CREATED, Some("awaiting_approval")),
            "{tool}: {r:?}"
        );
        let view = f.t.get(&format!("/v1/approvals/{}", s(&r.body, "approval_id")), &f.token).await;
        assert!(!view.body["preview"]["reasons"].as_array().unwrap().is_empty());
    }
    // The edit tools' schemas refuse such fields outright; nothing is frozen or written.
    let r = f.call("write_file", "hint-w", json!({"path": "h.txt", "content": "x", "requires_approval": false})).await;
    assert_eq!((r.status, r.code()), (StatusCode::UNPROCESSABLE_ENTITY, "input_invalid"), "{r:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(counters.iter().all(|c| c.load(Ordering::SeqCst) == 0));
    assert!(!f.ws().join("h.txt").exists());
    // The tool views say so too.
    for tool in ["write_file", "replace_block", "delete_path", "move_path", "mcp:srv_hint:tool:read_only"] {
        let v = f.t.get(&format!("/v1/tools/{tool}"), &f.token).await;
        assert_eq!(v.body["requires_approval"], true, "{tool}: {v:?}");
    }
}

// The Edit tools end to end. ----------------------------------------------------------------

async fn edit_tools_write_replace_delete_move(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();

    // write_file creating directories: the preview is a diff from /dev/null.
    let inv =
        f.frozen("write_file", "w1", json!({"path": "notes/a.txt", "content": "alpha\n", "create_dirs": true})).await;
    let pending = f.t.get("/v1/approvals?status=pending", &f.token).await;
    let approval = &pending.body["approvals"][0];
    assert_eq!(approval["invocation"]["tool_call_id"], "w1");
    let tool = &approval["preview"]["tool"];
    assert_eq!((tool["creates"].as_bool(), &tool["create_dirs"]), (Some(true), &json!(["notes"])), "{tool}");
    assert!(tool["diff"].as_str().unwrap().starts_with("--- /dev/null\n+++ b/notes/a.txt\n"), "{tool}");
    assert!(!ws.join("notes").exists(), "nothing happens before the grant");
    let done = f.run_approved(&inv).await;
    let out = &done["result"]["output"];
    assert_eq!(std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(), "alpha\n");
    assert_eq!((out["created"].as_bool(), out["bytes_written"].as_u64()), (Some(true), Some(6)));
    assert_eq!(out["sha256_before"], Value::Null);
    assert_eq!(out["sha256_after"], sha256_hex(b"alpha\n").as_str());
    let evidence_id = done["evidence_ids"][0].as_str().unwrap();
    let ev = f.t.get(&format!("/v1/evidence/{evidence_id}"), &f.token).await;
    assert_eq!(
        (ev.body["kind"].as_str(), ev.body["content_sha256"].as_str()),
        (Some("file_write"), Some(sha256_hex(b"alpha\n").as_str()))
    );
    assert_eq!(ev.body["provenance"]["bytes_written"], 6);
    assert_eq!(ev.body["provenance"]["diff_summary"]["lines_added"], 1);

    // Overwrite keeps the mode; expected_sha256 is checked at freeze and at execution.
    std::fs::set_permissions(ws.join("notes/a.txt"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let stale = f
        .call(
            "write_file",
            "w2",
            json!({"path": "notes/a.txt", "content": "beta\n", "expected_sha256": sha256_hex(b"other")}),
        )
        .await;
    assert_eq!((stale.status, stale.code()), (StatusCode::CONFLICT, "stale_target"), "{stale:?}");
    let sha = sha256_hex(b"alpha\n");
    let inv = f
        .frozen(
            "write_file",
            "w3",
            json!({"path": "notes/a.txt", "content": "beta\n", "expected_sha256": sha.to_uppercase()}),
        )
        .await;
    let tool_preview =
        f.t.get(&format!("/v1/approvals/{}", s(&inv, "approval_id")), &f.token).await.body["preview"]["tool"].clone();
    assert!(tool_preview["diff"].as_str().unwrap().contains("-alpha\n+beta\n"), "{tool_preview}");
    assert_eq!(tool_preview["before"]["mode"], "640");
    let done = f.run_approved(&inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(), "beta\n");
    assert_eq!(std::fs::metadata(ws.join("notes/a.txt")).unwrap().permissions().mode() & 0o777, 0o640);
    assert_eq!(done["result"]["output"]["sha256_before"], sha.as_str());
    // A replay of the executed call (its precondition no longer holds) is still a 200.
    let replay =
        f.call("write_file", "w3", json!({"path": "notes/a.txt", "content": "beta\n", "expected_sha256": sha})).await;
    assert_eq!((replay.status, &replay.body["invocation_id"]), (StatusCode::OK, &inv["invocation_id"]), "{replay:?}");
    // Changed after the freeze: execution refuses with stale_target and writes nothing.
    let inv = f
        .frozen(
            "write_file",
            "w4",
            json!({"path": "notes/a.txt", "content": "gamma\n", "expected_sha256": sha256_hex(b"beta\n")}),
        )
        .await;
    std::fs::write(ws.join("notes/a.txt"), "changed by someone\n").unwrap();
    f.grant(&inv).await;
    let done = f.wait_final(&inv).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("stale_target")),
        "{done}"
    );
    assert_eq!(std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(), "changed by someone\n");
    // A missing parent without create_dirs; a file that does not exist with expected_sha256.
    let r = f.call("write_file", "w5", json!({"path": "nowhere/a.txt", "content": "x"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{r:?}");
    let r = f.call("write_file", "w6", json!({"path": "new.txt", "content": "x", "expected_sha256": sha})).await;
    assert_eq!(r.code(), "stale_target");

    // move_path across directories, refusing to overwrite unless asked.
    std::fs::create_dir(ws.join("archive")).unwrap();
    std::fs::write(ws.join("archive/old.txt"), "old\n").unwrap();
    let inv = f.frozen("move_path", "m1", json!({"from": "notes/a.txt", "to": "archive/a.txt"})).await;
    let done = f.run_approved(&inv).await;
    assert!(!ws.join("notes/a.txt").exists());
    assert_eq!(std::fs::read_to_string(ws.join("archive/a.txt")).unwrap(), "changed by someone\n");
    let sha_moved = sha256_hex(b"changed by someone\n");
    assert_eq!(
        (done["result"]["output"]["sha256_before"].as_str(), done["result"]["output"]["sha256_after"].as_str()),
        (Some(sha_moved.as_str()), Some(sha_moved.as_str()))
    );
    let r = f.call("move_path", "m2", json!({"from": "archive/a.txt", "to": "archive/old.txt"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "already_exists"), "{r:?}");
    let inv =
        f.frozen("move_path", "m3", json!({"from": "archive/a.txt", "to": "archive/old.txt", "overwrite": true})).await;
    let done = f.run_approved(&inv).await;
    assert_eq!(done["result"]["output"]["overwritten"]["sha256"], sha256_hex(b"old\n").as_str());
    assert_eq!(std::fs::read_to_string(ws.join("archive/old.txt")).unwrap(), "changed by someone\n");
    let r = f.call("move_path", "m4", json!({"from": "archive/old.txt", "to": "missing/old.txt"})).await;
    assert_eq!(r.code(), "not_found");
    // A directory moves with its contents.
    let inv = f.frozen("move_path", "m5", json!({"from": "archive", "to": "notes/archive"})).await;
    let done = f.run_approved(&inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("notes/archive/old.txt")).unwrap(), "changed by someone\n");
    assert_eq!(done["result"]["output"]["sha256_before"], done["result"]["output"]["sha256_after"]);

    // delete_path: a file; a directory only with recursive.
    let inv = f.frozen("delete_path", "d1", json!({"path": "notes/archive/old.txt"})).await;
    let done = f.run_approved(&inv).await;
    assert_eq!(done["result"]["output"]["sha256_before"], sha_moved.as_str());
    assert!(!ws.join("notes/archive/old.txt").exists());
    std::fs::write(ws.join("notes/archive/x.txt"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("notes/archive/etc-link")).unwrap();
    let r = f.call("delete_path", "d2", json!({"path": "notes"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "recursive_required"));
    let inv = f.frozen("delete_path", "d3", json!({"path": "notes", "recursive": true})).await;
    let preview =
        f.t.get(&format!("/v1/approvals/{}", s(&inv, "approval_id")), &f.token).await.body["preview"]["tool"].clone();
    assert_eq!(
        (preview["tree"]["files"].as_u64(), preview["tree"]["dirs"].as_u64(), preview["tree"]["others"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{preview}"
    );
    let done = f.run_approved(&inv).await;
    assert!(!ws.join("notes").exists());
    assert!(
        Path::new("/etc/hostname").exists() || Path::new("/etc/passwd").exists(),
        "the symlink was removed, not followed"
    );
    assert_eq!(done["result"]["output"]["files_removed"], 1);
    let entries: Vec<_> = std::fs::read_dir(&ws).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(entries.iter().all(|n| !n.to_string_lossy().starts_with(".mira")), "{entries:?}");
}

// 14.1 -------------------------------------------------------------------------------------

/// The approval view of a frozen call: (canonical input, tool preview).
async fn approval_view(f: &Fx, inv: &Value) -> (Value, Value) {
    let view = f.t.get(&format!("/v1/approvals/{}", s(inv, "approval_id")), &f.token).await;
    assert_eq!(view.status, StatusCode::OK, "{view:?}");
    (view.body["invocation"]["input"].clone(), view.body["preview"]["tool"].clone())
}

/// Grants `inv` and asserts it fails with `stale_target` (nothing written is checked by the
/// caller).
async fn grant_is_stale(f: &Fx, inv: &Value) -> Value {
    let g = f.grant(inv).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = f.wait_final(inv).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("stale_target")),
        "{done}"
    );
    done
}

async fn approved_diff_is_what_runs_or_nothing(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();

    // The issue's replay: write_file frozen against "v1 original", the user edits by hand.
    std::fs::write(ws.join("stale.txt"), "v1 original\n").unwrap();
    let inv = f.frozen("write_file", "s1", json!({"path": "stale.txt", "content": "agent version\n"})).await;
    let (input, preview) = approval_view(&f, &inv).await;
    let v1 = sha256_hex(b"v1 original\n");
    assert_eq!(preview["before"]["sha256"], v1.as_str(), "{preview}");
    assert!(preview["diff"].as_str().unwrap().contains("-v1 original"), "{preview}");
    assert_eq!(input["precondition"], json!({"state": "file", "sha256": v1}), "{input}");
    assert_eq!(preview["precondition"], input["precondition"], "the preview shows the frozen precondition");
    std::fs::write(ws.join("stale.txt"), "v2 edited by hand\n").unwrap();
    let done = grant_is_stale(&f, &inv).await;
    assert_eq!(done["result"]["error"]["details"]["approved"]["sha256"], v1.as_str(), "{done}");
    assert_eq!(std::fs::read_to_string(ws.join("stale.txt")).unwrap(), "v2 edited by hand\n");

    // A new file frozen as absent; someone creates it before the grant.
    let inv = f.frozen("write_file", "s2", json!({"path": "fresh.txt", "content": "agent\n"})).await;
    assert_eq!(approval_view(&f, &inv).await.0["precondition"], json!({"state": "absent"}));
    std::fs::write(ws.join("fresh.txt"), "mine\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("fresh.txt")).unwrap(), "mine\n");

    // replace_block without expected_sha256: the edit elsewhere in the file is kept.
    std::fs::write(ws.join("code.rs"), "fn a() {}\nfn b() {}\n").unwrap();
    let inv = f.frozen("replace_block", "s3", json!({"path": "code.rs", "old": "fn b() {}", "new": "fn c() {}"})).await;
    let (input, preview) = approval_view(&f, &inv).await;
    assert_eq!(input["precondition"]["sha256"], sha256_hex(b"fn a() {}\nfn b() {}\n").as_str());
    assert_eq!(preview["precondition"], input["precondition"]);
    std::fs::write(ws.join("code.rs"), "fn a() { user(); }\nfn b() {}\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("code.rs")).unwrap(), "fn a() { user(); }\nfn b() {}\n");

    // delete_path of a file changed since, and of a directory that gained a file.
    std::fs::write(ws.join("gone.txt"), "old\n").unwrap();
    let inv = f.frozen("delete_path", "s4", json!({"path": "gone.txt"})).await;
    std::fs::write(ws.join("gone.txt"), "new work\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("gone.txt")).unwrap(), "new work\n");
    std::fs::create_dir_all(ws.join("tree/sub")).unwrap();
    std::fs::write(ws.join("tree/sub/a.txt"), "a").unwrap();
    let inv = f.frozen("delete_path", "s5", json!({"path": "tree", "recursive": true})).await;
    let (input, preview) = approval_view(&f, &inv).await;
    assert_eq!(input["precondition"]["state"], "directory");
    assert_eq!(input["precondition"]["manifest_sha256"], preview["tree"]["manifest_sha256"], "{preview}");
    std::fs::write(ws.join("tree/sub/b.txt"), "added after the preview").unwrap();
    grant_is_stale(&f, &inv).await;
    assert!(ws.join("tree/sub/b.txt").exists() && ws.join("tree/sub/a.txt").exists());

    // move_path: the source changed; the destination appeared; the overwritten file changed.
    std::fs::write(ws.join("src.txt"), "source\n").unwrap();
    let inv = f.frozen("move_path", "s6", json!({"from": "src.txt", "to": "dst.txt"})).await;
    let (input, preview) = approval_view(&f, &inv).await;
    assert_eq!(
        input["precondition"],
        json!({"from": {"state": "file", "sha256": sha256_hex(b"source\n")}, "to": {"state": "absent"}})
    );
    assert_eq!(preview["precondition"], input["precondition"]);
    std::fs::write(ws.join("src.txt"), "source, edited\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert!(!ws.join("dst.txt").exists());
    let inv = f.frozen("move_path", "s7", json!({"from": "src.txt", "to": "dst.txt"})).await;
    std::fs::write(ws.join("dst.txt"), "someone else's\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("dst.txt")).unwrap(), "someone else's\n");
    assert_eq!(std::fs::read_to_string(ws.join("src.txt")).unwrap(), "source, edited\n");
    let inv = f.frozen("move_path", "s8", json!({"from": "src.txt", "to": "dst.txt", "overwrite": true})).await;
    assert_eq!(
        approval_view(&f, &inv).await.0["precondition"]["to"],
        json!({"state": "file", "sha256": sha256_hex(b"someone else's\n")})
    );
    std::fs::write(ws.join("dst.txt"), "someone else's, edited\n").unwrap();
    grant_is_stale(&f, &inv).await;
    assert_eq!(std::fs::read_to_string(ws.join("dst.txt")).unwrap(), "someone else's, edited\n");
    assert!(ws.join("src.txt").exists());

    // A precondition cannot be smuggled in: the input schema refuses the field.
    let r =
        f.call("write_file", "s9", json!({"path": "x.txt", "content": "x", "precondition": {"state": "absent"}})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
}

async fn replays_after_a_successful_edit_are_idempotent(backend: Backend) {
    let f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    std::fs::write(ws.join("r.txt"), "one\n").unwrap();
    std::fs::create_dir(ws.join("dir")).unwrap();
    std::fs::write(ws.join("dir/f.txt"), "f").unwrap();
    std::fs::write(ws.join("m.txt"), "m\n").unwrap();
    let calls = [
        ("write_file", "p1", json!({"path": "w.txt", "content": "new\n"})),
        ("replace_block", "p2", json!({"path": "r.txt", "old": "one", "new": "two"})),
        ("delete_path", "p3", json!({"path": "dir", "recursive": true})),
        ("move_path", "p4", json!({"from": "m.txt", "to": "moved.txt"})),
    ];
    for (tool, call, input) in &calls {
        let inv = f.frozen(tool, call, input.clone()).await;
        f.run_approved(&inv).await;
        // Every target is now in another state than the frozen precondition says: the same
        // call again is still the same invocation, not a conflict.
        let replay = f.call(tool, call, input.clone()).await;
        assert_eq!(
            (replay.status, &replay.body["invocation_id"], &replay.body["input_hash"]),
            (StatusCode::OK, &inv["invocation_id"], &inv["input_hash"]),
            "{tool}: {replay:?}"
        );
        // A changed input under the same call id is still a conflict.
        let mut changed = input.clone();
        let key = if *tool == "move_path" { "to" } else { "path" };
        changed[key] = json!("elsewhere.txt");
        let r = f.call(tool, call, changed).await;
        assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "tool_call_id_conflict"), "{tool}: {r:?}");
    }
    assert_eq!(std::fs::read_to_string(ws.join("w.txt")).unwrap(), "new\n");
    assert_eq!(std::fs::read_to_string(ws.join("r.txt")).unwrap(), "two\n");
    assert!(!ws.join("dir").exists() && ws.join("moved.txt").exists());
}

// 14.9 -------------------------------------------------------------------------------------

async fn look_alike_paths_are_flagged_in_the_approval(backend: Backend) {
    let f = fx(backend).await;
    std::fs::write(f.ws().join("a.txt"), "real\n").unwrap();
    let flags = |preview: &Value| preview["path_flags"].clone();
    let cases = [
        ("z1", "a.txt\u{200b}", "invisible", "U+200B", 5, None),
        ("z2", "..\u{2215}x", "lookalike", "U+2215", 2, Some("/")),
        ("z3", "\u{2024}\u{2024}\u{2215}x", "lookalike", "U+2024", 0, Some(".")),
        ("z4", "report\u{202e}txt.exe", "bidi_control", "U+202E", 6, None),
        ("z5", "p\u{0430}yp\u{0430}l.txt", "lookalike", "U+0430", 1, Some("a")),
        ("z6", "cafe\u{301}.txt", "not_nfc", "U+0301", 4, None),
        ("z7", "a.txt ", "edge_whitespace", "U+0020", 5, None),
    ];
    for (call, path, kind, code_point, index, looks_like) in cases {
        let inv = f.frozen("write_file", call, json!({"path": path, "content": "x"})).await;
        let (_, preview) = approval_view(&f, &inv).await;
        let flagged = flags(&preview);
        assert_eq!(flagged.as_array().map(Vec::len), Some(1), "{path:?}: {preview}");
        let first = &flagged[0]["flags"][0];
        assert_eq!(flagged[0]["field"], "path");
        assert_eq!(flagged[0]["path"], path);
        assert_eq!(
            (first["kind"].as_str(), first["code_point"].as_str(), first["char_index"].as_u64()),
            (Some(kind), Some(code_point), Some(index)),
            "{path:?}: {flagged}"
        );
        assert_eq!(first["looks_like"].as_str(), looks_like, "{path:?}: {flagged}");
        assert_ne!(flagged[0]["escaped"], path, "the escaped form differs from the look-alike");
    }
    let inv = f.frozen("write_file", "z6b", json!({"path": "cafe\u{301}.txt", "content": "x"})).await;
    assert_eq!(flags(&approval_view(&f, &inv).await.1)[0]["nfc"], "caf\u{e9}.txt");
    // Both ends of a move; a plain path is not flagged.
    let inv = f.frozen("move_path", "z8", json!({"from": "a.txt", "to": "b\u{2044}c"})).await;
    let flagged = flags(&approval_view(&f, &inv).await.1);
    assert_eq!((flagged.as_array().map(Vec::len), flagged[0]["field"].as_str()), (Some(1), Some("to")), "{flagged}");
    let inv = f.frozen("write_file", "z9", json!({"path": "plain-name.txt", "content": "x"})).await;
    assert_eq!(flags(&approval_view(&f, &inv).await.1), json!([]));
}

async fn leftover_temp_files_are_swept_at_start(backend: Backend) {
    use mira::workspace::sweep;
    let mut f = fx(backend).await;
    let ws = f.ws().to_path_buf();
    let node = std::fs::read_to_string(f.t.data_dir.join("node.id")).unwrap().trim().to_owned();
    std::fs::create_dir_all(ws.join("deep/er")).unwrap();
    // What a `kill -9` between the temp file and the rename leaves: this node's temp file
    // and delete directory (made by the process that is about to die), beside real files.
    let own_tmp = ws.join("deep/er").join(sweep::temp_name(Some(&node)));
    std::fs::write(&own_tmp, "half a write").unwrap();
    let own_delete = ws.join(sweep::delete_name(Some(&node)));
    std::fs::create_dir_all(own_delete.join("inner")).unwrap();
    std::fs::write(own_delete.join("inner/x.txt"), "being deleted").unwrap();
    // Another replica's temp file from a moment ago: may belong to a write still running.
    let other_recent = ws.join(sweep::temp_name(Some("node-otherreplica")));
    std::fs::write(&other_recent, "another replica, writing now").unwrap();
    // Another replica's (and a pre-node-id) temp file from two hours ago: dead.
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    let secs = two_hours_ago.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let old_uuid = uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, secs, 0)).simple().to_string();
    let old_other = ws.join(format!(".mira-{old_uuid}.node-otherreplica.tmp"));
    let old_plain = ws.join(format!("deep/.mira-{old_uuid}.tmp"));
    for p in [&old_other, &old_plain] {
        std::fs::write(p, "old").unwrap();
        std::fs::File::options().write(true).open(p).unwrap().set_modified(two_hours_ago).unwrap();
    }
    // Not ours: a user's file with a similar name, a symlink with our name, a hard link.
    let users = ws.join(".mira-notes.tmp");
    std::fs::write(&users, "keep me").unwrap();
    let link = ws.join(format!(".mira-{old_uuid}.evil.tmp"));
    std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
    let shared = ws.join(sweep::temp_name(Some(&node)));
    std::fs::write(ws.join("shared.txt"), "shared").unwrap();
    std::fs::hard_link(ws.join("shared.txt"), &shared).unwrap();

    f.t.restart().await;
    for _ in 0..200 {
        if !own_tmp.exists() && !own_delete.exists() && !old_other.exists() && !old_plain.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for gone in [&own_tmp, &own_delete, &old_other, &old_plain] {
        assert!(!gone.exists(), "{} was left behind", gone.display());
    }
    for kept in [&other_recent, &users, &shared, &ws.join("shared.txt")] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
    assert!(std::fs::symlink_metadata(&link).is_ok(), "the symlink was removed");
    assert!(Path::new("/etc/hostname").exists() || Path::new("/etc/passwd").exists());

    // A write by the new process names its node and leaves nothing behind.
    let (turn, _) = f.t.turn(&f.token, &f.run, "write").await;
    f.turn = turn;
    let inv = f.frozen("write_file", "after", json!({"path": "deep/er/ok.txt", "content": "ok\n"})).await;
    f.run_approved(&inv).await;
    let left: Vec<String> = std::fs::read_dir(ws.join("deep/er"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["ok.txt"], "{left:?}");
}

both_backends!(
    drift_same_input_other_call_id_never_shares_a_grant,
    changed_input_is_a_new_invocation_with_its_own_approval,
    stale_or_edited_grants_change_nothing,
    twenty_concurrent_grants_execute_once,
    two_servers_on_one_store_run_each_grant_once,
    restart_between_grant_and_execution_executes_once,
    boundary_escapes_are_refused_and_change_nothing,
    replace_block_keeps_line_endings_and_encoding,
    os_level_write_failure_is_a_failed_invocation,
    grant_and_deny_one_decision_stands,
    grant_and_cancel_race_cleanly,
    approvals_expire_and_can_be_cancelled,
    every_gated_tool_is_refused_without_a_matching_grant,
    nothing_in_the_input_or_a_server_hint_lowers_the_bar,
    edit_tools_write_replace_delete_move,
    approved_diff_is_what_runs_or_nothing,
    replays_after_a_successful_edit_are_idempotent,
    look_alike_paths_are_flagged_in_the_approval,
    leftover_temp_files_are_swept_at_start,
);
