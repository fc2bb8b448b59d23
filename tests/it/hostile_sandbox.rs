#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A hostile but honest user of a multi-user server, replaying issue 13's attacks through
//! `terminal_session` with real PTYs and real programs: each approved call runs in the
//! sandbox (src/sandbox/), and none reaches the server's secrets, another user's workspace,
//! the server process, or outlives its session.

use crate::common;

use std::time::Duration;

use common::{Backend, Options, TestApp, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// One user's run with a turn that exposes `terminal_session`.
struct User {
    token: String,
    run: String,
    turn: String,
    calls: std::sync::atomic::AtomicUsize,
}

async fn user(t: &TestApp, token: String) -> User {
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "run commands in a terminal").await;
    User { token, run, turn, calls: Default::default() }
}

impl User {
    async fn freeze(&self, t: &TestApp, input: Value) -> common::Resp {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        t.call(&self.token, &self.run, &self.turn, "terminal_session", &format!("call_{n}"), input).await
    }

    /// Freezes, grants with the exact triple, and returns the final invocation.
    async fn run_call(&self, t: &TestApp, input: Value) -> Value {
        let r = self.freeze(t, input).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let inv = r.body;
        let g = t
            .post(
                &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
                &self.token,
                json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
            )
            .await;
        assert_eq!(g.status, StatusCode::OK, "{g:?}");
        let id = inv["invocation_id"].as_str().unwrap();
        for _ in 0..600 {
            let r = t.get(&format!("/v1/invocations/{id}"), &self.token).await;
            if !matches!(r.body["status"].as_str().unwrap_or(""), "queued" | "running" | "awaiting_approval") {
                return r.body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("invocation {id} did not finish");
    }

    /// Runs `sh -c script` to its end; returns (final invocation, everything the session
    /// printed as its stream shows it).
    async fn sh(&self, t: &TestApp, script: &str) -> (Value, String) {
        self.sh_in(t, script, None).await
    }

    /// As `sh`, with the session's cwd.
    async fn sh_in(&self, t: &TestApp, script: &str, cwd: Option<&std::path::Path>) -> (Value, String) {
        let mut input = json!({"action": "start", "command": "sh", "args": ["-c", script], "settle_ms": 0});
        if let Some(cwd) = cwd {
            input["cwd"] = json!(cwd);
        }
        let start = self.run_call(t, input).await;
        assert_eq!(start["status"], "completed", "{start}");
        let id = start["result"]["output"]["session_id"].as_str().unwrap().to_owned();
        let waited = self.run_call(t, json!({"action": "wait", "session_id": id, "timeout_ms": 20000})).await;
        assert_eq!(waited["status"], "completed", "{waited}");
        (waited, self.stream_text(t, &id).await)
    }

    /// The whole retained output of a session, from its SSE stream.
    async fn stream_text(&self, t: &TestApp, id: &str) -> String {
        let resp = t
            .client
            .get(format!("{}/v1/terminal-sessions/{id}/stream", t.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let events = common::read_sse(resp, 10_000, Duration::from_secs(5)).await;
        events.iter().filter(|e| e.1 == "output").map(|e| e.2["data"].as_str().unwrap_or("").to_owned()).collect()
    }

    /// Every evidence item and invocation result of the run, as text.
    async fn run_record(&self, t: &TestApp) -> String {
        let ev = t.get(&format!("/v1/runs/{}/evidence", self.run), &self.token).await;
        let invs = t.get(&format!("/v1/runs/{}/invocations", self.run), &self.token).await;
        format!("{}{}", ev.body, invs.body)
    }
}

fn options(data_in_workspace: bool) -> Options {
    let mut o = Options { data_in_workspace, ..Options::default() };
    o.runtime.workspace_roots = vec![std::env::temp_dir()];
    o
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit(')').next().unwrap_or("").trim_start().chars().next(), Some('Z' | 'X')))
}

/// Live processes whose command line is exactly `cmdline` (NUL-separated).
fn pids_of_cmdline(cmdline: &[u8]) -> Vec<i64> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline) && alive(*pid))
        .collect()
}

/// The README's default layout (`./data` inside the workspace): a non-admin's approved
/// session cannot read admin.token, secret.key or the SQLite file — by relative or absolute
/// path — and the token is in no output, stream, result or evidence. On Postgres the
/// database's port is closed to the session instead.
async fn secrets_of_the_data_dir_stay_hidden(backend: Backend) {
    let t = spawn_with(backend, options(true)).await;
    let data = std::fs::canonicalize(&t.data_dir).unwrap();
    assert!(data.starts_with(&t.workspace), "the data dir is inside the workspace, as by default");
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap().trim().to_owned();
    assert!(!token.is_empty());
    let secret_key = std::fs::read(data.join("secret.key")).expect("the server made its secret key");
    let secret_hex = hex::encode(&secret_key);
    let alice = user(&t, t.user("alice").await).await;

    // The replay: `cat <data-dir>/admin.token`, exactly.
    let (waited, out) = alice.sh(&t, &format!("cat {}/admin.token", data.display())).await;
    assert_ne!(waited["result"]["output"]["exit_code"], 0, "cat failed: {waited}");
    assert!(!out.contains(&token), "the admin token leaked: {out}");
    // The same through the workspace-relative path, secret.key, the database, and a listing.
    // The `find /` walks every folder bound into the view: bounded, so that a loaded machine
    // cannot push the script past the 20 s wait (CI saw it cut before `scanned`).
    let script = "cat data/admin.token; od -An -tx1 data/secret.key | tr -d ' \\n'; echo; \
                  cat data/mira.db data/mira.db-wal | od -c | head -5; ls -la data; \
                  cp -r data /tmp/copy 2>&1; ls /tmp/copy; ln data/admin.token stolen 2>&1; mv data moved 2>&1; \
                  timeout 5 find / -name admin.token 2>/dev/null; echo scanned";
    let (_, out2) = alice.sh(&t, script).await;
    assert!(out2.contains("scanned"), "the script ran to its end: {out2}");
    for text in [&out, &out2] {
        assert!(!text.contains(&token), "the admin token leaked: {text}");
        assert!(!text.contains(&secret_hex), "secret.key leaked: {text}");
        assert!(!text.contains("SQLite format"), "the database file leaked: {text}");
    }
    assert!(
        data.join("admin.token").exists()
            && !t.workspace.join("moved").exists()
            && !t.workspace.join("stolen").exists()
    );
    let record = alice.run_record(&t).await;
    assert!(!record.contains(&token) && !record.contains(&secret_hex), "a secret reached a result or evidence");
    // The token still works for the admin, and alice is still no admin.
    let me = t.get("/v1/me", &alice.token).await;
    assert_eq!(me.body["is_admin"], false);

    if backend == Backend::Postgres {
        // Trust auth on loopback would hand the session the whole database: its port is
        // closed to sandboxed processes (Landlock TCP connect rule).
        let url = url::Url::parse(&t.db.url).unwrap();
        let port = url.port().unwrap_or(5432);
        let (_, out) = alice
            .sh(
                &t,
                &format!(
                    "python3 -c 'import socket\ntry:\n socket.create_connection((\"127.0.0.1\", {port}), 3); print(\"DB-CONNECTED\")\nexcept OSError as e: print(\"DB-REFUSED\", e.errno)'"
                ),
            )
            .await;
        assert!(out.contains("DB-REFUSED 13") && !out.contains("DB-CONNECTED"), "{out}");
        let ready = t.request(reqwest::Method::GET, "/readyz", None, None).await;
        let net = &ready.body["sandbox"]["protections"]["network"];
        assert_eq!(net["mode"], "deny_tcp_connect", "{ready:?}");
        assert!(net["ports"].as_array().unwrap().contains(&json!(port)), "{net}");
    }
}

/// `setsid -f env -u MIRA_TERMINAL_SESSION sleep …` leaves the session and drops its marker;
/// killing the session still kills it (the session's cgroup).
async fn setsid_escapee_dies_with_its_session(backend: Backend) {
    let t = spawn_with(backend, options(false)).await;
    let alice = user(&t, t.user("alice").await).await;
    // (A unique duration per test process, so that parallel tests cannot see each other's.)
    let nap = format!("6005.{}{}", std::process::id(), if backend == Backend::Sqlite { 1 } else { 2 });
    let start = alice
        .run_call(
            &t,
            json!({"action": "start", "command": "bash", "args": ["--norc", "--noprofile"], "env": {"PS1": "$ "}}),
        )
        .await;
    let id = start["result"]["output"]["session_id"].as_str().unwrap().to_owned();
    let input = alice
        .run_call(
            &t,
            json!({"action": "input", "session_id": id, "data": format!("setsid -f env -u MIRA_TERMINAL_SESSION sleep {nap}; echo escaped\n")}),
        )
        .await;
    assert_eq!(input["status"], "completed", "{input}");
    let cmdline = format!("sleep\0{nap}\0");
    let mut escaped = Vec::new();
    for _ in 0..100 {
        escaped = pids_of_cmdline(cmdline.as_bytes());
        if !escaped.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(escaped.len(), 1, "the escapee runs");
    let pid = escaped[0];
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    assert!(!environ.windows(21).any(|w| w == b"MIRA_TERMINAL_SESSION"), "it dropped the session marker");
    let killed = alice.run_call(&t, json!({"action": "kill", "session_id": id})).await;
    assert_eq!(killed["result"]["output"]["state"], "killed", "{killed}");
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(pid), "the escapee {pid} survived the kill of its session");
    assert!(pids_of_cmdline(cmdline.as_bytes()).is_empty(), "no such process remains");
}

/// A session may read `/usr`, not the data dir, not another user's workspace (inside its
/// own workspace or elsewhere), not the server's `/proc/<pid>/{environ,mem}`, and may not
/// signal the server.
async fn what_a_session_may_see(backend: Backend) {
    let t = spawn_with(backend, options(false)).await;
    let alice = user(&t, t.user("alice").await).await;
    let bob_token = t.user("bob").await;
    // Bob's workspaces: one inside the default workspace alice uses, one elsewhere.
    let inner = t.workspace.join("bob-inside");
    let outer = tempfile::tempdir().unwrap();
    let outer_path = std::fs::canonicalize(outer.path()).unwrap();
    std::fs::create_dir(&inner).unwrap();
    for (dir, name) in [(&inner, "inner"), (&outer_path, "outer")] {
        std::fs::write(dir.join("bob-secret.txt"), format!("BOB-{name}-SECRET")).unwrap();
        let r = t.post("/v1/workspaces", &bob_token, json!({"name": name, "path": dir})).await;
        if name == "outer" {
            assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
            continue;
        }
        // One inside the default workspace is refused now; as registered before that rule
        // (written to the store directly), sessions must still not see it.
        assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "workspace_path_taken"), "{r:?}");
        let bob_id = t.get("/v1/me", &bob_token).await.body["id"].as_str().unwrap().to_owned();
        let real = std::fs::canonicalize(dir).unwrap();
        let (_, identity) = mira::workspace::open_root(&real).unwrap();
        let (path, identity) = (real.to_string_lossy().into_owned(), identity.encode());
        let stored = t.app().store.create_workspace(&bob_id, name, &path, &identity, false).await.unwrap();
        assert!(stored.is_ok());
    }
    std::fs::write(t.workspace.join("mine.txt"), "ALICE-OWN-FILE").unwrap();
    let data = std::fs::canonicalize(&t.data_dir).unwrap();
    let server = std::process::id();
    let script = format!(
        "cat mine.txt; echo; head -c 4 /usr/bin/env | od -c | head -1; \
         cat {data}/admin.token && echo DATA-READ || echo DATA-DENIED; \
         cat bob-inside/bob-secret.txt && echo INNER-READ || echo INNER-DENIED; \
         cat {outer}/bob-secret.txt && echo OUTER-READ || echo OUTER-DENIED; \
         cat /proc/{server}/environ >/dev/null && echo ENVIRON-READ || echo ENVIRON-DENIED; \
         head -c 1 /proc/{server}/mem >/dev/null && echo MEM-READ || echo MEM-DENIED; \
         kill -0 {server} && echo SIGNAL-SENT || echo SIGNAL-DENIED; \
         ls /proc | grep -qx {server} && echo SERVER-LISTED || echo SERVER-INVISIBLE; \
         cat $HOME/.ssh/id_rsa 2>/dev/null; ls /root 2>&1 | head -1; echo HOME=$HOME TMPDIR=$TMPDIR; echo finished",
        data = data.display(),
        outer = outer_path.display(),
    );
    let (_, out) = alice.sh(&t, &script).await;
    assert!(out.contains("finished"), "{out}");
    assert!(out.contains("ALICE-OWN-FILE"), "its own workspace is readable: {out}");
    assert!(out.contains("177   E   L   F"), "/usr is readable: {out}");
    for denied in [
        "DATA-DENIED",
        "INNER-DENIED",
        "OUTER-DENIED",
        "ENVIRON-DENIED",
        "MEM-DENIED",
        "SIGNAL-DENIED",
        "SERVER-INVISIBLE",
    ] {
        assert!(out.contains(denied), "expected {denied}: {out}");
    }
    for leaked in ["BOB-inner-SECRET", "BOB-outer-SECRET", "DATA-READ", "ENVIRON-READ", "MEM-READ", "SIGNAL-SENT"] {
        assert!(!out.contains(leaked), "{leaked}: {out}");
    }
    assert!(out.contains("HOME=/tmp/home TMPDIR=/tmp"), "{out}");
    // The server is alive and well.
    assert_eq!(t.request(reqwest::Method::GET, "/healthz", None, None).await.status, StatusCode::OK);
}

/// The sandbox is part of the frozen input and of the approval view; a non-admin cannot
/// name a cwd outside it, an admin can (and it is then granted, so the hash differs).
async fn the_sandbox_is_frozen_and_shown(backend: Backend) {
    let t = spawn_with(backend, options(true)).await;
    let alice = user(&t, t.user("alice").await).await;
    let r = alice.freeze(&t, json!({"action": "start", "command": "true"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let sb = &r.body["input"]["sandbox"];
    assert_eq!(sb["enforced"], true, "{sb}");
    assert_eq!(sb["read_write"], json!([t.workspace.to_str().unwrap()]));
    assert!(sb["read_only"].as_array().unwrap().contains(&json!("/usr")), "{sb}");
    let data = std::fs::canonicalize(&t.data_dir).unwrap();
    assert!(sb["hidden"].as_array().unwrap().contains(&json!(data.to_str().unwrap())), "{sb}");
    assert_eq!(sb["private"]["home"], "/tmp/home");
    assert!(sb["network"]["mode"].is_string() && sb["limits"]["tree_kill"].is_string(), "{sb}");
    assert_eq!(r.body["input"]["env"]["HOME"], "/tmp/home");
    // The approval view carries it (the web card renders it from there).
    let approvals = t.get("/v1/approvals?status=pending", &alice.token).await;
    let a = approvals.body["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == r.body["approval_id"])
        .unwrap()
        .clone();
    assert_eq!(a["invocation"]["input"]["sandbox"], *sb, "{a}");
    // A non-admin's cwd outside the sandbox, or in the data dir: refused before approval.
    let outside = tempfile::tempdir().unwrap();
    for (cwd, code) in
        [(outside.path().to_str().unwrap(), "cwd_outside_sandbox"), (data.to_str().unwrap(), "cwd_hidden")]
    {
        let r = alice.freeze(&t, json!({"action": "start", "command": "true", "cwd": cwd})).await;
        assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, code), "{r:?}");
    }
    // An admin may: the folder is granted, shown, and makes another input hash.
    let admin = user(&t, t.admin_token.clone()).await;
    let base = admin.freeze(&t, json!({"action": "start", "command": "true"})).await;
    let out = admin.freeze(&t, json!({"action": "start", "command": "true", "cwd": outside.path()})).await;
    assert_eq!(out.status, StatusCode::CREATED, "{out:?}");
    let real = std::fs::canonicalize(outside.path()).unwrap();
    assert!(out.body["input"]["sandbox"]["read_write"].as_array().unwrap().contains(&json!(real.to_str().unwrap())));
    assert_ne!(base.body["input_hash"], out.body["input_hash"]);
    // It really is granted: the admin's session writes there, and still cannot see the data dir.
    let (_, text) = admin
        .sh_in(
            &t,
            &format!("echo written > by-admin.txt && cat {}/admin.token; echo done", data.display()),
            Some(&real),
        )
        .await;
    assert!(text.contains("done") && !text.contains(t.admin_token.as_str()), "{text}");
    assert_eq!(std::fs::read_to_string(real.join("by-admin.txt")).unwrap().trim(), "written");
}

/// A server that cannot sandbox (here: `--sandbox off`) refuses non-admins' sessions with
/// `sandbox_unavailable` — on the ladder and at freeze — unless `--allow-unsandboxed`;
/// admins' sessions run, recorded as not enforced.
async fn an_unsandboxed_server_refuses_non_admins(backend: Backend) {
    let mut o = options(false);
    o.runtime.sandbox.mode = mira::sandbox::SandboxMode::Off;
    let t = spawn_with(backend, o).await;
    let ready = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.body["sandbox"]["state"], "off", "{ready:?}");
    assert_eq!(ready.body["sandbox"]["non_admin_sessions"], "refused");
    let alice_token = t.user("alice").await;
    let tools = t.get("/v1/tools", &alice_token).await;
    let term = tools.body["tools"].as_array().unwrap().iter().find(|x| x["id"] == "terminal_session").unwrap().clone();
    assert_eq!(term["state"], "unavailable", "{term}");
    assert_eq!(term["reason"]["code"], "sandbox_unavailable", "{term}");
    assert!(term["reason"]["message"].as_str().unwrap().contains("--allow-unsandboxed"), "{term}");
    let alice = user(&t, alice_token).await;
    let r = alice.freeze(&t, json!({"action": "start", "command": "true"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "unavailable"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["ladder"]["reason"]["code"], "sandbox_unavailable", "{r:?}");
    // The admin's session runs, unsandboxed and saying so.
    let admin = user(&t, t.admin_token.clone()).await;
    let done = admin.run_call(&t, json!({"action": "start", "command": "true", "settle_ms": 0})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["input"]["sandbox"]["enforced"], false, "{done}");
    assert!(done["input"]["sandbox"]["reason"].as_str().unwrap().contains("--sandbox off"));

    // With --allow-unsandboxed the operator lets non-admins run (single-user machines).
    let mut o = options(false);
    o.runtime.sandbox.mode = mira::sandbox::SandboxMode::Off;
    o.runtime.sandbox.allow_unsandboxed = true;
    let t2 = spawn_with(backend, o).await;
    let ready = t2.request(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.body["sandbox"]["non_admin_sessions"], "unsandboxed_allowed");
    let bob = user(&t2, t2.user("bob").await).await;
    let done = bob.run_call(&t2, json!({"action": "start", "command": "true", "settle_ms": 0})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["input"]["sandbox"]["enforced"], false);
}

/// `/readyz` says what the host offers and what is in force (this host: Landlock, root,
/// cgroups).
async fn readyz_reports_the_sandbox(backend: Backend) {
    let t = spawn_with(backend, options(false)).await;
    let ready = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    let sb = &ready.body["sandbox"];
    let abi = sb["host"]["landlock_abi"].as_i64().unwrap();
    assert_eq!(abi, i64::from(mira::sandbox::landlock_abi()));
    if abi == 0 {
        assert_eq!(sb["state"], "unavailable", "{sb}");
        return;
    }
    assert_eq!(sb["state"], "enforced", "{sb}");
    assert_eq!(sb["host"]["self_test"], "passed");
    assert_eq!(sb["non_admin_sessions"], "sandboxed");
    let p = &sb["protections"];
    assert_eq!(p["filesystem"], "landlock+mount_namespace");
    assert_eq!((p["capabilities_dropped"].as_bool(), p["no_new_privs"].as_bool()), (Some(true), Some(true)));
    // Signals are scoped by the session's own PID namespace, or by Landlock (ABI ≥ 6).
    let pid_namespace = sb["host"]["pid_namespace"].as_bool().unwrap();
    assert_eq!(p["pid_namespace"].as_bool(), Some(pid_namespace), "{sb}");
    assert_eq!(p["signal_scope"].as_bool(), Some(abi >= 6 || pid_namespace), "{sb}");
    let cg = &sb["host"]["cgroup"];
    let membership = cg["v2_base"].is_string() || cg["v1_pids_base"].is_string() || cg["v1_memory_base"].is_string();
    let expected = if cg["v2_base"].is_string() && cg["v2_kill"] == true {
        "cgroup.kill"
    } else if membership {
        "cgroup_procs"
    } else {
        "session_scan"
    };
    assert_eq!(p["tree_kill"], expected, "{sb}");
    assert_eq!(
        p["pids_max"].is_u64(),
        cg["v2_controllers"].as_array().unwrap().contains(&json!("pids")) || cg["v1_pids_base"].is_string()
    );
}

/// A folder two users registered (rows from before registrations were refused when they
/// overlap another user's workspace, stored here as the store took them then): the sandbox
/// covers other users' workspaces only strictly inside the folders it shows, so it cannot
/// hide bob's workspace from alice's session at alice's own root. The session does not
/// start (`workspace_path_taken`) rather than show bob's files.
async fn a_folder_another_user_also_registered_starts_no_session(backend: Backend) {
    let t = spawn_with(backend, options(false)).await;
    let shared = tempfile::tempdir().unwrap();
    let path = std::fs::canonicalize(shared.path()).unwrap();
    std::fs::write(path.join("bob-secret.txt"), "BOB-SHARED-SECRET").unwrap();
    let bob = t.user("bob").await;
    let r = t.post("/v1/workspaces", &bob, json!({"name": "bob's", "path": path})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let alice_token = t.user("alice").await;
    let alice_id = t.get("/v1/me", &alice_token).await.body["id"].as_str().unwrap().to_owned();
    let (_, identity) = mira::workspace::open_root(&path).unwrap();
    let row = t
        .app()
        .store
        .create_workspace(&alice_id, "alice's", path.to_str().unwrap(), &identity.encode(), false)
        .await
        .unwrap()
        .unwrap();
    let r = t.post("/v1/runs", &alice_token, json!({"workspace_id": row.id})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&alice_token, &run, "run commands in a terminal").await;
    let alice = User { token: alice_token, run, turn, calls: Default::default() };
    let done = alice
        .run_call(&t, json!({"action": "start", "command": "sh", "args": ["-c", "cat bob-secret.txt"], "settle_ms": 0}))
        .await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("workspace_path_taken")),
        "{done}"
    );
    assert!(!alice.run_record(&t).await.contains("BOB-SHARED-SECRET"));
}

both_backends!(
    secrets_of_the_data_dir_stay_hidden,
    setsid_escapee_dies_with_its_session,
    what_a_session_may_see,
    the_sandbox_is_frozen_and_shown,
    an_unsandboxed_server_refuses_non_admins,
    readyz_reports_the_sandbox,
    a_folder_another_user_also_registered_starts_no_session,
);

/// A non-admin's stdio MCP server runs in the sandbox too: one whose command reads the
/// admin token gets nothing (the connection's stderr tail shows the refusal, not the
/// token); an admin's server runs unsandboxed, as before.
async fn a_non_admins_stdio_server_cannot_read_the_data_dir(backend: Backend) {
    let t = spawn_with(backend, options(true)).await;
    let data = std::fs::canonicalize(&t.data_dir).unwrap();
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap().trim().to_owned();
    let script = format!("cat {}/admin.token >&2; echo sandboxed-attempt >&2; exit 3", data.display());
    let alice = t.user("alice").await;
    let mut seen = String::new();
    for (who, tok) in [("alice", alice.as_str()), ("admin", t.admin_token.as_str())] {
        let r = t
            .post("/v1/mcp/servers", tok, json!({"name": format!("leak-{who}"), "transport": {"stdio": {"command": "sh", "args": ["-c", script]}}}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let id = r.body["id"].as_str().unwrap().to_owned();
        let mut tail = String::new();
        for _ in 0..200 {
            let v = t.get(&format!("/v1/mcp/servers/{id}"), tok).await.body;
            tail = v["connection"]["stderr_tail"].as_str().unwrap_or("").to_owned();
            if tail.contains("sandboxed-attempt") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(tail.contains("sandboxed-attempt"), "{who}'s server ran: {tail:?}");
        if who == "alice" {
            assert!(!tail.contains(&token), "a non-admin's MCP server read the admin token: {tail}");
        } else {
            // The control: unsandboxed, the same command reads it (what alice was denied).
            assert!(tail.contains(&token), "the admin's server is not sandboxed: {tail}");
        }
        seen.push_str(&tail);
    }
    assert!(seen.contains("sandboxed-attempt"));
}

both_backends!(a_non_admins_stdio_server_cannot_read_the_data_dir);
