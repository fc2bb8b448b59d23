#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Escapes from the sandbox of non-admins' processes found by a security review, replayed
//! through the API: a stdio MCP server's cwd that only looks like it is in the user's
//! workspace (`..`, a symlink the user's terminal made), a user's script named like an
//! allow-listed command, and what sessions share with the host (PID and IPC namespaces).

use crate::common;

use std::time::Duration;

use common::{Backend, Options, TestApp, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn options() -> Options {
    let mut o = Options::default();
    o.runtime.workspace_roots = vec![std::env::temp_dir()];
    o
}

async fn install(t: &TestApp, token: &str, name: &str, stdio: Value) -> common::Resp {
    t.post("/v1/mcp/servers", token, json!({"name": name, "transport": {"stdio": stdio}})).await
}

/// A non-admin's stdio server may write in its cwd, so the cwd is judged by its real path:
/// `<workspace>/../…/<data dir>` and a symlink to the data dir inside the workspace are
/// refused at install; a real folder of the workspace swapped for such a symlink after the
/// install is refused at the next launch — the admin token never reaches the server.
async fn a_stdio_servers_cwd_is_judged_by_its_real_path(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let data = std::fs::canonicalize(&t.data_dir).unwrap();
    let ws = std::fs::canonicalize(&t.workspace).unwrap();
    assert!(!data.starts_with(&ws), "the data dir is outside the workspace here");
    let token = std::fs::read_to_string(data.join("admin.token")).unwrap().trim().to_owned();
    let alice = t.user("alice").await;
    let script = "cat admin.token >&2; echo attempt >&2; exit 3";
    let up = "../".repeat(ws.components().count() - 1);
    let traversal = format!("{}/{up}{}", ws.display(), data.strip_prefix("/").unwrap().display());
    assert!(std::path::Path::new(&traversal).starts_with(&ws), "the text starts with the workspace");
    std::os::unix::fs::symlink(&data, ws.join("to-data")).unwrap();
    for (name, cwd) in [("dots", traversal.clone()), ("link", ws.join("to-data").to_string_lossy().into_owned())] {
        let r = install(&t, &alice, name, json!({"command": "sh", "args": ["-c", script], "cwd": cwd})).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{name}: {r:?}");
        assert!(r.body.to_string().contains("not inside one of your workspaces"), "{r:?}");
    }

    // A real folder when installed, a symlink to the data dir at the next launch.
    let later = ws.join("later");
    std::fs::create_dir(&later).unwrap();
    let r = install(&t, &alice, "later", json!({"command": "sh", "args": ["-c", script], "cwd": later})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    let mut swapped = false;
    let mut refused = false;
    let mut seen = String::new();
    for _ in 0..300 {
        let v = t.get(&format!("/v1/mcp/servers/{id}"), &alice).await.body;
        let tail = v["connection"]["stderr_tail"].as_str().unwrap_or("").to_owned();
        let error = v["connection"]["last_error"].as_str().unwrap_or("").to_owned();
        seen.push_str(&tail);
        if !swapped && tail.contains("attempt") {
            std::fs::rename(&later, ws.join("later-moved")).unwrap();
            std::os::unix::fs::symlink(&data, &later).unwrap();
            swapped = true;
        }
        if swapped && error.contains("not inside one of your workspaces") {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(swapped, "the server ran once in its real folder: {seen}");
    assert!(!seen.contains(&token), "a non-admin's MCP server read the admin token: {seen}");
    assert!(refused, "the launch after the swap was refused: {seen}");
}

/// `--mcp-stdio-allow sh` admits the `sh` of the server's PATH, not a user's script named
/// `sh` in their workspace (by path or through a symlink), nor a path that names no file.
async fn the_allow_list_is_matched_on_real_paths(backend: Backend) {
    let mut o = options();
    o.runtime.mcp.stdio_allow = vec!["sh".into()];
    let t = spawn_with(backend, o).await;
    let alice = t.user("alice").await;
    let ws = std::fs::canonicalize(&t.workspace).unwrap();
    let own = ws.join("bin/sh");
    std::fs::create_dir_all(own.parent().unwrap()).unwrap();
    std::fs::write(&own, "#!/bin/sh\necho mine\n").unwrap();
    std::os::unix::fs::symlink(&own, ws.join("sh-link")).unwrap();
    for command in [own.to_string_lossy().into_owned(), ws.join("sh-link").to_string_lossy().into_owned()] {
        let r = install(&t, &alice, "mine", json!({"command": command, "args": ["-c", "exit 0"]})).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{command}: {r:?}");
    }
    let r = install(&t, &alice, "missing", json!({"command": "/opt/bin/sh"})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    let r = install(&t, &alice, "system", json!({"command": "sh", "args": ["-c", "exit 0"]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

/// Files of `/etc` that others may not read (a service's configuration with its password, a
/// host key) are covered in a session's view, though the folder is shown read-only and the
/// session keeps the server's uid, which owns them; a readable neighbour stays readable.
async fn restricted_system_files_are_hidden(backend: Backend) {
    use std::os::unix::fs::PermissionsExt;
    /// Removes the files it names on drop (the test's own files in `/etc`).
    struct Remove(Vec<std::path::PathBuf>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let tag = format!("{}-{}", std::process::id(), backend as i32);
    let secret = std::path::PathBuf::from(format!("/etc/mira-it-secret-{tag}.conf"));
    let open = std::path::PathBuf::from(format!("/etc/mira-it-open-{tag}.conf"));
    let _remove = Remove(vec![secret.clone(), open.clone()]);
    if std::fs::write(&secret, "password=HIDDEN-VALUE\n").is_err() {
        eprintln!("/etc is not writable here: nothing to test");
        return;
    }
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&open, "setting=SHOWN-VALUE\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Made before the server starts: the sandbox reads the system folders when it is built.
    let t = spawn_with(backend, options()).await;
    let ready = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    if ready.body["sandbox"]["state"] != "enforced" {
        eprintln!("the sandbox is not enforced here: {}", ready.body["sandbox"]);
        return;
    }
    let alice = t.user("alice").await;
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "run commands in a terminal").await;
    let script = format!("cat {} {}; echo finished", secret.display(), open.display());
    let input = json!({"action": "start", "command": "sh", "args": ["-c", script], "settle_ms": 2000});
    let (inv, done) = approved(&t, &alice, (&run, &turn), "call_0", input).await;
    let hidden = inv["input"]["sandbox"]["hidden"].to_string();
    assert!(hidden.contains(&*secret.to_string_lossy()), "the approval shows the file covered: {inv}");
    let text = &output_until(&t, &alice, &done, "finished").await;
    assert!(text.contains("finished"), "{text}\n{done}");
    assert!(!text.contains("HIDDEN-VALUE"), "a session read a file of /etc others may not read: {done}");
    assert!(text.contains("SHOWN-VALUE"), "a readable file of /etc stays readable: {done}");
}

both_backends!(restricted_system_files_are_hidden);

both_backends!(a_stdio_servers_cwd_is_judged_by_its_real_path, the_allow_list_is_matched_on_real_paths);

/// A terminal session runs in its own PID namespace (its shell is pid 2, under the
/// namespace's init; the server's pid names nothing there) and its own IPC namespace (a SysV
/// segment the host made is not listed). The supervisor the server waits for and the init
/// below it run the helper image, not copies of the server.
async fn a_session_has_its_own_pid_and_ipc_namespaces(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let ready = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    let sb = &ready.body["sandbox"];
    if sb["state"] != "enforced" {
        eprintln!("the sandbox is not enforced here: {sb}");
        return;
    }
    assert_eq!(sb["host"]["pid_namespace"], true, "{sb}");
    assert_eq!(
        (sb["protections"]["pid_namespace"].as_bool(), sb["protections"]["ipc_namespace"].as_bool()),
        (Some(true), Some(true)),
        "{sb}"
    );
    assert_eq!(sb["protections"]["signal_scope"], true, "{sb}");
    let key = 0x4d1b_0000 ^ i32::try_from(std::process::id() & 0xffff).unwrap() ^ (backend as i32);
    // SAFETY: shmget with plain integers; the segment is removed below.
    let shm = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o600) };
    assert!(shm >= 0, "shmget: {}", std::io::Error::last_os_error());
    let alice = t.user("alice").await;
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "run commands in a terminal").await;
    let server = std::process::id();
    let script = format!(
        "echo pid=$$; kill -0 {server} 2>/dev/null && echo SIGNAL-SENT || echo SIGNAL-DENIED; ipcs -m; echo finished; exec sleep 600"
    );
    let input = json!({"action": "start", "command": "sh", "args": ["-c", script], "settle_ms": 2000});
    let (_, done) = approved(&t, &alice, (&run, &turn), "call_0", input).await;
    let text = &output_until(&t, &alice, &done, "finished").await;
    // SAFETY: removes the segment made above.
    unsafe { libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut()) };
    assert!(text.contains("finished"), "{text}\n{done}");
    assert!(text.contains("pid=2"), "the session's shell is pid 2 of its own namespace: {done}");
    assert!(text.contains("SIGNAL-DENIED") && !text.contains("SIGNAL-SENT"), "{done}");
    assert!(!text.contains(&format!("0x{key:08x}")), "the host's SysV segment is visible: {done}");
    assert!(text.contains("Shared Memory Segments"), "ipcs ran: {done}");
    // The supervisor (the pid the session reports) and its child, the namespace's init,
    // run the helper image; below them the session's program.
    assert_eq!(done["result"]["output"]["state"], "running", "{done}");
    let supervisor = done["result"]["output"]["pid"].as_u64().expect("the session's pid");
    let helper = b"\0__mira-pid-namespace-helper\0";
    let cmdline = |pid: u64| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let runs_helper = |pid: u64| cmdline(pid).windows(helper.len()).any(|w| w == helper);
    let mut init = Vec::new();
    for _ in 0..100 {
        init = children_of(supervisor);
        if runs_helper(supervisor) && init.len() == 1 && runs_helper(init[0]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let shown = |pid: u64| String::from_utf8_lossy(&cmdline(pid)).replace('\0', " ");
    assert!(runs_helper(supervisor), "the supervisor {supervisor} runs `{}`", shown(supervisor));
    assert_eq!(init.len(), 1, "the supervisor {supervisor} has one child, the init: {init:?}");
    assert!(runs_helper(init[0]), "the init {} runs `{}`", init[0], shown(init[0]));
    let program = children_of(init[0]);
    assert_eq!(program.len(), 1, "the init has one child, the program: {program:?}");
    assert!(cmdline(program[0]).starts_with(b"sleep\x00600\x00"), "the program runs `{}`", shown(program[0]));
    let session = done["result"]["output"]["session_id"].as_str().expect("session id").to_owned();
    let input = json!({"action": "kill", "session_id": session});
    let (_, killed) = approved(&t, &alice, (&run, &turn), "call_1", input).await;
    assert_eq!(killed["result"]["output"]["state"], "killed", "{killed}");
    // Gone, or a zombie nobody reaped yet.
    let stat = |pid: u64| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let gone = |pid: u64| stat(pid).rsplit_once(')').is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'));
    for _ in 0..100 {
        if [supervisor, init[0], program[0]].into_iter().all(gone) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in [supervisor, init[0], program[0]] {
        assert!(gone(p), "process {p} outlived the kill of its session: {}", stat(p));
    }
}

/// Calls `terminal_session` with `input` as `call_id` in `(run, turn)`, grants its approval
/// and waits for its end: (the invocation as frozen, as it ended).
async fn approved(t: &TestApp, token: &str, (run, turn): (&str, &str), call_id: &str, input: Value) -> (Value, Value) {
    let r = t.call(token, run, turn, "terminal_session", call_id, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let inv = r.body;
    let g = t
        .post(
            &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
            token,
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = t.wait_final(token, inv["invocation_id"].as_str().unwrap()).await;
    (inv, done)
}

/// The stored output of the session `done` (a start's final invocation) started, once it
/// holds `needle` (on a loaded machine a session may stay quiet past its start's settle
/// time), or as it is after 30 s.
async fn output_until(t: &TestApp, token: &str, done: &Value, needle: &str) -> String {
    let session = done["result"]["output"]["session_id"].as_str().unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = t.get(&format!("/v1/terminal-sessions/{session}/output"), token).await;
        let text = r.body["output"].as_str().unwrap_or_default().to_owned();
        if text.contains(needle) || std::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pids whose parent is `parent` (from `/proc/<pid>/stat`).
fn children_of(parent: u64) -> Vec<u64> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // "pid (comm) state ppid …": the comm may hold spaces and parentheses.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u64>().ok());
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

both_backends!(a_session_has_its_own_pid_and_ipc_namespaces);
