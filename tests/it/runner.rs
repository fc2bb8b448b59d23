//! Remote devices (docs/runner.md): a control plane and real `mira runner` processes on
//! loopback, enrolled with one-time codes; and the runner's own refusals of signed jobs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Backend, Options, TestApp, read_sse, read_sse_until, spawn_with};

const LEASE: Duration = Duration::from_secs(2);

/// A runner process with its state directory and workspace.
pub(crate) struct RunnerProc {
    pub(crate) device_id: String,
    pub(crate) state: PathBuf,
    pub(crate) workspace: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) base: String,
    /// Started with `--confirm`, answers on its standard input.
    pub(crate) confirm: bool,
    /// Its standard error so far (with `confirm`).
    pub(crate) stderr: Arc<Mutex<String>>,
    /// Further arguments of `mira runner` (e.g. `--sandbox landlock`).
    pub(crate) args: Vec<String>,
}

impl RunnerProc {
    pub(crate) fn start(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mira"));
        cmd.args(["runner", "--server", &self.base, "--workspace"])
            .arg(&self.workspace)
            .arg("--state-dir")
            .arg(&self.state)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .args(&self.args);
        if self.confirm {
            cmd.args(["--confirm", "--confirm-input", "stdin", "--confirm-timeout-secs", "30"])
                .stdin(Stdio::piped())
                .stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().expect("runner starts");
        if let Some(mut err) = child.stderr.take() {
            let sink = self.stderr.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = err.read(&mut buf) {
                    sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        self.child = Some(child);
    }

    /// Waits for the `n`th confirmation prompt on its standard error; the prompt's text.
    pub(crate) async fn prompt(&self, n: usize) -> String {
        let start = Instant::now();
        loop {
            let text = self.stderr.lock().unwrap().clone();
            if let Some((i, _)) = text.match_indices("a job needs your confirmation").nth(n - 1) {
                let rest = &text[i..];
                if let Some(end) = rest.find("without an answer)") {
                    return rest[..end].to_owned();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no prompt {n}; stderr: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `line` at its prompt.
    pub(crate) fn answer(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.as_mut().unwrap().stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    pub(crate) fn pid(&self) -> String {
        self.child.as_ref().expect("running").id().to_string()
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.pid()]).status().expect("kill").success();
        assert!(ok, "kill {sig}");
    }

    /// Journal entries (`inv-…`, `nonce-…`).
    pub(crate) fn journal(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.state.join("journal"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for RunnerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn options() -> Options {
    let mut o = Options::default();
    o.runtime.devices = mira::devices::DeviceSettings { lease: LEASE, ..Default::default() };
    o
}

/// Registers a device, enrolls a runner for it with `mira runner enroll` and starts it on a
/// new workspace folder under `root`.
pub(crate) async fn device(t: &TestApp, token: &str, name: &str, root: &Path) -> RunnerProc {
    device_with(t, token, name, root, false).await
}

/// [`device`], its runner started with `--confirm` (answers on its standard input) when
/// `confirm`.
async fn device_with(t: &TestApp, token: &str, name: &str, root: &Path, confirm: bool) -> RunnerProc {
    let r = t.post("/v1/devices", token, json!({"name": name})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let device_id = r.body["id"].as_str().unwrap().to_owned();
    let code = r.body["enrollment"]["code"].as_str().unwrap().to_owned();
    assert_eq!(r.body["status"], "not_enrolled");
    let state = root.join(format!("{name}-state"));
    let workspace = root.join(format!("{name}-ws"));
    std::fs::create_dir_all(&workspace).unwrap();
    let workspace = std::fs::canonicalize(&workspace).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["runner", "enroll", "--server", &t.base, "--code", &code, "--state-dir"])
        .arg(&state)
        .output()
        .expect("enroll runs");
    assert!(out.status.success(), "enroll: {}", String::from_utf8_lossy(&out.stderr));
    // The private key stays on the device, readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("device.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // The code works once.
    let again = Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["runner", "enroll", "--server", &t.base, "--code", &code, "--state-dir"])
        .arg(root.join(format!("{name}-again")))
        .output()
        .expect("enroll runs");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("enrollment_code_invalid"));
    let mut p = RunnerProc {
        device_id,
        state,
        workspace,
        child: None,
        base: t.base.clone(),
        confirm,
        stderr: Arc::new(Mutex::new(String::new())),
        args: Vec::new(),
    };
    p.start();
    // A process start on a loaded machine can take seconds.
    wait_status(t, token, &p.device_id, "connected", Duration::from_secs(30)).await;
    p
}

pub(crate) async fn device_view(t: &TestApp, token: &str, id: &str) -> Value {
    let r = t.get("/v1/devices", token).await;
    r.body["devices"].as_array().unwrap().iter().find(|d| d["id"] == id).cloned().unwrap()
}

/// Waits until the device has `status`; the time it took.
pub(crate) async fn wait_status(t: &TestApp, token: &str, id: &str, status: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let view = device_view(t, token, id).await;
        if view["status"] == status {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "device {id} never became {status}: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn evidence(t: &TestApp, token: &str, inv: &Value) -> Value {
    let id = inv["evidence_ids"][0].as_str().unwrap();
    t.get(&format!("/v1/evidence/{id}"), token).await.body
}

pub(crate) async fn grant(t: &TestApp, token: &str, inv: &Value) {
    let r = t
        .post(
            &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
            token,
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// Everything but the device stamp.
fn without_device(mut ev: Value) -> Value {
    for field in ["id", "invocation_id", "run_id", "created_at"] {
        ev.as_object_mut().unwrap().remove(field);
    }
    ev["provenance"].as_object_mut().unwrap().remove("device_id");
    ev
}

async fn two_runners_on_loopback(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let token = t.user("ada").await;
    let root = tempfile::tempdir().unwrap();
    let a = device(&t, &token, "laptop", root.path()).await;
    let b = device(&t, &token, "desktop", root.path()).await;
    let view = device_view(&t, &token, &a.device_id).await;
    assert_eq!(view["advertised"]["workspaces"][0]["path"], a.workspace.to_string_lossy().as_ref());
    assert!(view["capabilities"].as_array().unwrap().contains(&json!("fs.write")), "{view}");
    assert!(view["last_seen_at"].is_string());

    // A workspace on device A, and the same file on the host for comparison.
    std::fs::write(a.workspace.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::write(t.workspace.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let r =
        t.post("/v1/workspaces", &token, json!({"name": "on-a", "path": a.workspace, "device_id": a.device_id})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let ws_a = r.body["id"].as_str().unwrap().to_owned();
    let r = t.post("/v1/runs", &token, json!({"workspace_id": ws_a})).await;
    assert_eq!((r.status, r.body["device_id"].as_str()), (StatusCode::CREATED, Some(a.device_id.as_str())), "{r:?}");
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&token, &run, "read notes.txt and write a file").await;

    // read_open runs on A, with the host's evidence plus the device that ran it.
    let r = t.call(&token, &run, &turn, "read_open", "r1", json!({"path": "notes.txt"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["content"], "one\ntwo\nthree\n");
    let remote_ev = evidence(&t, &token, &done).await;
    assert_eq!(remote_ev["provenance"]["device_id"], a.device_id.as_str());
    let host_run = t.run(&token).await;
    let (host_turn, _) = t.turn(&token, &host_run, "read notes.txt").await;
    let r = t.call(&token, &host_run, &host_turn, "read_open", "h1", json!({"path": "notes.txt"})).await;
    let host = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(host["result"], done["result"]);
    let host_ev = evidence(&t, &token, &host).await;
    assert!(host_ev["provenance"].get("device_id").is_none());
    assert_eq!(without_device(remote_ev), without_device(host_ev));

    // write_file: frozen against A's files (prepare on A), approved, executed once on A.
    std::fs::create_dir_all(a.workspace.join("out")).unwrap();
    let r = t.call(&token, &run, &turn, "write_file", "w1", json!({"path": "out/new.txt", "content": "hi\n"})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{r:?}");
    grant(&t, &token, &r.body).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(a.workspace.join("out/new.txt")).unwrap(), "hi\n");
    let ev = evidence(&t, &token, &done).await;
    assert_eq!(
        (ev["kind"].as_str(), ev["provenance"]["device_id"].as_str()),
        (Some("file_write"), Some(a.device_id.as_str()))
    );
    assert_eq!(ev["content_sha256"], mira::evidence::sha256_hex(b"hi\n"));
    // The retried call is the same invocation: nothing runs twice.
    let again =
        t.call(&token, &run, &turn, "write_file", "w1", json!({"path": "out/new.txt", "content": "hi\n"})).await;
    assert_eq!(
        (again.status, again.body["invocation_id"].clone()),
        (StatusCode::OK, done["invocation_id"].clone()),
        "{again:?}"
    );
    let inv = done["invocation_id"].as_str().unwrap();
    assert!(a.journal().contains(&format!("inv-{inv}.delivered")), "{:?}", a.journal());

    // Nothing of device A's run ever reached device B.
    assert!(b.journal().is_empty(), "{:?}", b.journal());
    assert!(!b.workspace.join("out").exists());

    // kill -STOP: A is device_offline (with last seen) once the lease runs out; calls fail
    // clearly. A stopped runner never closes its connection: only the lease (2 s here) can
    // make it offline, well within 10 s and before the default lease (15 s) would.
    a.signal("-STOP");
    wait_status(&t, &token, &a.device_id, "offline", LEASE * 5).await;
    let view = t.get(&format!("/v1/tools/read_open?device={}", a.device_id), &token).await;
    assert_eq!(view.body["reason"]["code"], "device_offline", "{view:?}");
    assert!(view.body["reason"]["message"].as_str().unwrap().contains("last seen"), "{view:?}");
    let r = t.call(&token, &run, &turn, "read_open", "r2", json!({"path": "notes.txt"})).await;
    assert_eq!(
        (r.status, r.body["error"]["details"]["ladder"]["reason"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("device_offline")),
        "{r:?}"
    );
    a.signal("-CONT");
    wait_status(&t, &token, &a.device_id, "connected", Duration::from_secs(40)).await;
    // Continued, the runner may still drop its stale connection (its silence timer ran out
    // while it was stopped) and connect again: a call in between is refused `device_offline`
    // (nothing sent) and a new one works once it is back.
    let start = Instant::now();
    let r = loop {
        let n = start.elapsed().as_millis();
        let r = t.call(&token, &run, &turn, "read_open", &format!("r3-{n}"), json!({"path": "notes.txt"})).await;
        if r.body["invocation_id"].is_string() {
            break r;
        }
        assert_eq!(
            (r.status, r.body["error"]["details"]["ladder"]["reason"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("device_offline")),
            "{r:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(20), "the continued runner did not come back: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Revocation cuts B's live connection at once: the runner stops (exit 3) and cannot return.
    let r = t.post(&format!("/v1/devices/{}/revoke", b.device_id), &token, json!({})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::OK, Some("revoked")), "{r:?}");
    let mut b = b;
    let mut child = b.child.take().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the revoked runner kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Status 3: it stopped because it was revoked (not for any other failure).
    assert_eq!(status.code(), Some(3));
    let view = t.get(&format!("/v1/tools/read_open?device={}", b.device_id), &token).await;
    assert_eq!(view.body["reason"]["code"], "device_revoked", "{view:?}");
    let r = t.post(&format!("/v1/devices/{}/enrollment-code", b.device_id), &token, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "device_revoked"));
    // Rename.
    let r = t
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/devices/{}", a.device_id),
            Some(&token),
            Some(json!({"name": "work laptop"})),
        )
        .await;
    assert_eq!((r.status, r.body["name"].as_str()), (StatusCode::OK, Some("work laptop")), "{r:?}");
    // Another user sees none of it.
    let other = t.user("bob").await;
    let r = t.post(&format!("/v1/devices/{}/revoke", a.device_id), &other, json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

/// `kill -9` of a runner holding a granted write: the invocation ends `interrupted` with
/// `outcome_unknown`, the write is not made twice (not at all here: the job never left the
/// socket), and a restarted runner does not run it.
async fn killed_runner_leaves_outcome_unknown(backend: Backend) {
    // A lease long enough that the job is sent before the stopped runner's lease runs out,
    // however slowly the grant, the claim and the send go on a loaded machine (with 2 s the
    // call could end `device_offline`, nothing sent).
    let mut options = options();
    options.runtime.devices.lease = Duration::from_secs(8);
    let t = spawn_with(backend, options).await;
    let token = t.user("kim").await;
    let root = tempfile::tempdir().unwrap();
    let mut a = device(&t, &token, "laptop", root.path()).await;
    let r =
        t.post("/v1/workspaces", &token, json!({"name": "on-a", "path": a.workspace, "device_id": a.device_id})).await;
    let r = t.post("/v1/runs", &token, json!({"workspace_id": r.body["id"]})).await;
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&token, &run, "write a file").await;
    let r = t.call(&token, &run, &turn, "write_file", "w1", json!({"path": "x.txt", "content": "once\n"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    // Stopped first, so the job is sent while its lease still runs, then the runner dies.
    a.signal("-STOP");
    grant(&t, &token, &r.body).await;
    // Claimed (`running`), the job is sent after two store reads; once sent, an early or a
    // late kill ends the call alike, so the pause after the claim may be generous.
    let inv = r.body["invocation_id"].as_str().unwrap();
    let start = Instant::now();
    while t.get(&format!("/v1/invocations/{inv}"), &token).await.body["status"] == "queued" {
        assert!(start.elapsed() < Duration::from_secs(30), "the granted write was never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.signal("-KILL");
    let _ = a.child.as_mut().unwrap().wait();
    a.child = None;
    let start = Instant::now();
    let done = loop {
        let v = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
        if !matches!(v["status"].as_str(), Some("queued" | "running")) {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("interrupted"), Some("outcome_unknown")),
        "{done}"
    );
    assert_eq!(done["result"]["error"]["details"]["device_id"], a.device_id.as_str());
    // The runner comes back: nothing is re-sent and nothing is written.
    a.start();
    wait_status(&t, &token, &a.device_id, "connected", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!a.workspace.join("x.txt").exists());
    let v = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
    assert_eq!(v["status"], "interrupted");
}

/// `mira runner --confirm`: each approved job waits for the person at the device, who sees
/// the tool, the input hash, the input and the approval; "n" declines it (nothing written,
/// the invocation ends with `job_declined`), "y" runs it. Jobs without an approval (a read)
/// are not asked about.
async fn confirmation_at_the_device(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let token = t.user("cy").await;
    let root = tempfile::tempdir().unwrap();
    let mut a = device_with(&t, &token, "laptop", root.path(), true).await;
    std::fs::write(a.workspace.join("notes.txt"), "one\n").unwrap();
    let r =
        t.post("/v1/workspaces", &token, json!({"name": "on-a", "path": a.workspace, "device_id": a.device_id})).await;
    let r = t.post("/v1/runs", &token, json!({"workspace_id": r.body["id"]})).await;
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&token, &run, "write two files").await;

    // Declined: nothing is written and the invocation ends with the refusal.
    let r = t.call(&token, &run, &turn, "write_file", "w1", json!({"path": "no.txt", "content": "never\n"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    grant(&t, &token, &r.body).await;
    let prompt = a.prompt(1).await;
    for shown in
        ["write_file", r.body["input_hash"].as_str().unwrap(), r.body["approval_id"].as_str().unwrap(), "no.txt"]
    {
        assert!(prompt.contains(shown), "{shown} not in the prompt: {prompt}");
    }
    a.answer("n");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("job_declined")),
        "{done}"
    );
    assert_eq!(done["result"]["error"]["details"]["declined"], "no", "{done}");
    assert!(!a.workspace.join("no.txt").exists());

    // A read has no approval: it runs without a question.
    let r = t.call(&token, &run, &turn, "read_open", "r1", json!({"path": "notes.txt"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Confirmed: it runs.
    let r = t.call(&token, &run, &turn, "write_file", "w2", json!({"path": "yes.txt", "content": "ok\n"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    grant(&t, &token, &r.body).await;
    a.prompt(2).await;
    a.answer("y");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(a.workspace.join("yes.txt")).unwrap(), "ok\n");
    assert_eq!(a.stderr.lock().unwrap().matches("a job needs your confirmation").count(), 2);
}

/// A terminal call of a device run, frozen (prepared on the device), granted, and final.
pub(crate) async fn term(t: &TestApp, token: &str, run: &str, turn: &str, call: &str, input: Value) -> Value {
    let r = t.call(token, run, turn, "terminal_session", call, input).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{r:?}");
    grant(t, token, &r.body).await;
    t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await
}

/// The concatenated `data` of the `output` events.
fn sse_text(events: &[(i64, String, Value)]) -> String {
    events.iter().filter(|e| e.1 == "output").map(|e| e.2["data"].as_str().unwrap()).collect()
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit(')').next().unwrap_or("").trim_start().chars().next(), Some('Z' | 'X')))
}

/// `terminal_session` on a device: the PTY runs on device A (its runner advertises `pty`),
/// each action is an approved job, the output reaches the control plane's SSE stream with the
/// host's offsets and resume; device B never sees A's session; another user cannot read it;
/// a runner that goes away leaves the session `lost` with its output still readable, and
/// when it comes back it ends the session.
async fn terminal_on_a_device(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let token = t.user("dee").await;
    let root = tempfile::tempdir().unwrap();
    let mut a = device(&t, &token, "laptop", root.path()).await;
    let b = device(&t, &token, "desktop", root.path()).await;
    let view = device_view(&t, &token, &a.device_id).await;
    assert!(view["advertised"]["capabilities"].as_array().unwrap().contains(&json!("pty")), "{view}");
    assert!(view["advertised"]["tools"].as_array().unwrap().contains(&json!("terminal_session")), "{view}");
    let on = |p: &RunnerProc, name: &str| json!({"name": name, "path": p.workspace, "device_id": p.device_id});
    std::fs::create_dir_all(a.workspace.join("sub")).unwrap();
    let ws_a = t.post("/v1/workspaces", &token, on(&a, "on-a")).await.body["id"].clone();
    let run = t.post("/v1/runs", &token, json!({"workspace_id": ws_a})).await.body["id"].as_str().unwrap().to_owned();
    let (turn, exposure) = t.turn(&token, &run, "run commands in a terminal").await;
    assert!(exposure["tools"].as_array().unwrap().iter().any(|x| x["id"] == "terminal_session"), "{exposure}");

    // A cwd outside the device's workspace is refused at the freeze (on the device).
    let r = t
        .call(&token, &run, &turn, "terminal_session", "out", json!({"action": "start", "command": "bash", "cwd": "/"}))
        .await;
    assert_eq!(r.code(), "outside_workspace", "{r:?}");

    // start: on A, in A's workspace, at most once.
    let bash = json!({"action": "start", "command": "bash", "args": ["--norc", "--noprofile"], "cwd": "sub",
        "env": {"PS1": "$ "}});
    let done = term(&t, &token, &run, &turn, "s1", bash).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    let id = out["session_id"].as_str().unwrap().to_owned();
    let pid = out["pid"].as_i64().unwrap();
    assert!(alive(pid));
    assert_eq!(out["cwd"], a.workspace.join("sub").to_string_lossy().as_ref());
    let ev = evidence(&t, &token, &done).await;
    assert_eq!(
        (ev["kind"].as_str(), ev["provenance"]["device_id"].as_str()),
        (Some("terminal_output"), Some(a.device_id.as_str()))
    );
    let start_inv = done["invocation_id"].as_str().unwrap();
    assert!(a.journal().contains(&format!("inv-{start_inv}.delivered")), "{:?}", a.journal());
    let s = t.get(&format!("/v1/terminal-sessions/{id}"), &token).await;
    assert_eq!((s.status, s.body["state"].as_str()), (StatusCode::OK, Some("running")), "{s:?}");

    // input: typed on A; the result holds the output since the last action.
    let done = term(
        &t,
        &token,
        &run,
        &turn,
        "i1",
        json!({"action": "input", "session_id": id,
        "data": "for i in $(seq 1 300); do echo line-$i-$((i*7)); done; pwd\n", "settle_ms": 500}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["output"]["output"].as_str().unwrap();
    assert!(text.contains("line-300-2100") && text.contains("/sub"), "{text}");

    // The SSE stream (the host's route) carries A's output; a reconnect from an event's
    // offset gets exactly the rest.
    let stream_of = |id: &str, token: &str, at: Option<i64>| {
        let mut req = t.client.get(format!("{}/v1/terminal-sessions/{id}/stream", t.base)).bearer_auth(token);
        if let Some(at) = at {
            req = req.header("Last-Event-ID", at.to_string());
        }
        req.send()
    };
    let stream = |token: &str, at: Option<i64>| stream_of(&id, token, at);
    let resp = stream(&token, None).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let live = read_sse_until(resp, Duration::from_secs(30), |e| sse_text(e).contains("line-300-2100")).await;
    assert!(sse_text(&live).contains("line-300-2100"), "{live:?}");
    // Another user cannot read it.
    let other = t.user("eve").await;
    let r = stream(&other, None).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = t.get(&format!("/v1/terminal-sessions/{id}/output"), &other).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Device B never reaches A's session: a run on B naming it is refused by B (which has
    // no such session), and nothing of it is executed on B.
    let ws_b = t.post("/v1/workspaces", &token, on(&b, "on-b")).await.body["id"].clone();
    let run_b = t.post("/v1/runs", &token, json!({"workspace_id": ws_b})).await.body["id"].as_str().unwrap().to_owned();
    let (turn_b, _) = t.turn(&token, &run_b, "run commands in a terminal").await;
    let r = t
        .call(
            &token,
            &run_b,
            &turn_b,
            "terminal_session",
            "x1",
            json!({"action": "input", "session_id": id, "data": "id\n"}),
        )
        .await;
    assert_eq!(r.code(), "terminal_session_not_found", "{r:?}");
    let r =
        t.call(&token, &run_b, &turn_b, "terminal_session", "x2", json!({"action": "output", "session_id": id})).await;
    if r.status == StatusCode::CREATED {
        grant(&t, &token, &r.body).await;
        let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
        assert_eq!(done["result"]["error"]["code"], "terminal_session_not_found", "{done}");
    } else {
        assert_eq!(r.code(), "terminal_session_not_found", "{r:?}");
    }
    assert!(!b.journal().iter().any(|e| e.starts_with("inv-")), "{:?}", b.journal());

    // output on A's run reads the stored output (the control plane's store).
    let done =
        term(&t, &token, &run, &turn, "o1", json!({"action": "output", "session_id": id, "pattern": "line-150-"}))
            .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["matches"][0]["line"], "line-150-1050", "{done}");

    // kill: the session ends on A; the stream then ends with `exit`, and a resume from the
    // middle is exactly the rest.
    let done = term(&t, &token, &run, &turn, "k1", json!({"action": "kill", "session_id": id})).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["output"]["state"].as_str()),
        (Some("completed"), Some("killed")),
        "{done}"
    );
    let start = Instant::now();
    while t.get(&format!("/v1/terminal-sessions/{id}"), &token).await.body["state"] != "killed" {
        assert!(start.elapsed() < Duration::from_secs(10), "the end never reached the control plane");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(pid));
    let full = read_sse(stream(&token, None).await.unwrap(), 10_000, Duration::from_secs(10)).await;
    let exit = full.last().unwrap();
    assert_eq!((exit.1.as_str(), exit.2["state"].as_str()), ("exit", Some("killed")), "{full:?}");
    let outputs: Vec<_> = full.iter().filter(|e| e.1 == "output").collect();
    for w in outputs.windows(2) {
        assert_eq!(w[0].2["end"], w[1].2["start"]);
    }
    assert_eq!(outputs.last().unwrap().2["end"], exit.2["bytes_out"]);
    assert_eq!(outputs[0].2["start"], 0);
    let all = sse_text(&full);
    assert!(all.contains("line-1-7"));
    assert_eq!(all.len() as i64, exit.2["bytes_out"].as_i64().unwrap(), "ASCII output: a byte is a character");
    let at = all.len() as i64 / 2;
    let rest = read_sse(stream(&token, Some(at)).await.unwrap(), 10_000, Duration::from_secs(10)).await;
    assert_eq!(rest[0].2["start"].as_i64(), Some(at));
    assert_eq!(sse_text(&rest), all[at as usize..]);
    assert_eq!(rest.last().map(|e| e.1.as_str()), Some("exit"));

    // A runner that goes away: once its lease runs out the session is `lost`, the output it
    // sent stays readable; when it comes back its uploads are refused and it ends the session.
    let done = term(
        &t,
        &token,
        &run,
        &turn,
        "s2",
        json!({"action": "start", "command": "bash",
        "args": ["--norc", "--noprofile", "-c", "echo before-$((2+3)); sleep 300"]}),
    )
    .await;
    let id2 = done["result"]["output"]["session_id"].as_str().unwrap().to_owned();
    let pid2 = done["result"]["output"]["pid"].as_i64().unwrap();
    assert!(done["result"]["output"]["output"].as_str().unwrap().contains("before-5"), "{done}");
    a.signal("-STOP");
    let start = Instant::now();
    let lost = loop {
        let s = t.get(&format!("/v1/terminal-sessions/{id2}"), &token).await.body;
        if s["state"] != "running" {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never lost: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lost["state"], "lost", "{lost}");
    // By the stored times: lost a whole lease after the runner's last heartbeat, not sooner.
    let seen = device_view(&t, &token, &a.device_id).await["last_seen_at"].clone();
    let at = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    let after = (at(&lost["ended_at"]) - at(&seen)).to_std().unwrap();
    assert!(after >= LEASE, "lost {after:?} after the last heartbeat ({seen}), before the lease ran out: {lost}");
    let r = t.get(&format!("/v1/terminal-sessions/{id2}/output"), &token).await;
    assert!(r.body["output"].as_str().unwrap().contains("before-5"), "{r:?}");
    let full = read_sse(stream_of(&id2, &token, None).await.unwrap(), 100, Duration::from_secs(5)).await;
    assert!(sse_text(&full).contains("before-5"), "{full:?}");
    assert_eq!(full.last().map(|e| (e.1.as_str(), e.2["state"].as_str())), Some(("exit", Some("lost"))), "{full:?}");
    a.signal("-CONT");
    let start = Instant::now();
    while alive(pid2) {
        assert!(start.elapsed() < Duration::from_secs(20), "the runner kept a session the control plane lost");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = &mut a;
}

/// A result the runner delivers after the control plane gave up on it (`interrupted`,
/// `outcome_unknown`) does not re-open the invocation: its status stays, and the outcome is
/// attached as `late_device_result` evidence (the device, succeeded, the output's hash).
/// The runner is stopped (SIGSTOP) while it asks its person, until the control plane gives
/// up, then continued (SIGCONT) and the person says yes.
async fn late_result_after_outcome_unknown_is_attached(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let token = t.user("lou").await;
    let root = tempfile::tempdir().unwrap();
    let mut a = device_with(&t, &token, "laptop", root.path(), true).await;
    let r =
        t.post("/v1/workspaces", &token, json!({"name": "on-a", "path": a.workspace, "device_id": a.device_id})).await;
    let r = t.post("/v1/runs", &token, json!({"workspace_id": r.body["id"]})).await;
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&token, &run, "write a file").await;
    let r = t.call(&token, &run, &turn, "write_file", "w1", json!({"path": "late.txt", "content": "late\n"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    grant(&t, &token, &r.body).await;
    a.prompt(1).await;
    a.signal("-STOP");
    let inv = r.body["invocation_id"].as_str().unwrap().to_owned();
    let done = t.wait_final(&token, &inv).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("interrupted"), Some("outcome_unknown")),
        "{done}"
    );
    let evidence_before = done["evidence_ids"].as_array().unwrap().len();
    a.signal("-CONT");
    a.answer("y");
    // The runner runs it now (the person said yes) and delivers the result: on the same
    // connection, or from its journal on the next one (a restart forces that).
    let late = {
        let start = Instant::now();
        let mut restarted = false;
        loop {
            let v = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
            assert_eq!(v["status"], "interrupted", "the late result re-opened it: {v}");
            let ids = v["evidence_ids"].as_array().unwrap().clone();
            if ids.len() > evidence_before {
                eprintln!("late result attached {:?} after SIGCONT (runner restarted: {restarted})", start.elapsed());
                let id = ids.last().unwrap().as_str().unwrap();
                break t.get(&format!("/v1/evidence/{id}"), &token).await.body;
            }
            if !restarted && start.elapsed() > Duration::from_secs(8) {
                // Delivered from the journal on the next connection (`late: true`).
                a.signal("-KILL");
                let _ = a.child.as_mut().unwrap().wait();
                a.child = None;
                a.confirm = false;
                a.start();
                restarted = true;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no late evidence: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(std::fs::read_to_string(a.workspace.join("late.txt")).unwrap(), "late\n");
    assert_eq!(late["kind"], "late_device_result", "{late}");
    let p = &late["provenance"];
    assert_eq!(p["device_id"], a.device_id.as_str(), "{late}");
    assert_eq!(p["outcome"], "succeeded", "{late}");
    assert_eq!(p["status_kept"], "interrupted", "{late}");
    assert_eq!(p["output_sha256"], late["content_sha256"], "{late}");
    assert!(
        late["excerpt"].as_str().unwrap().starts_with(&format!("late result from device {}: succeeded", a.device_id))
    );
    // Delivered again (a restart replays nothing delivered; a replayed post adds nothing):
    // still one late evidence, still interrupted.
    if a.child.is_some() {
        a.signal("-KILL");
        let _ = a.child.as_mut().unwrap().wait();
        a.child = None;
    }
    a.confirm = false;
    a.start();
    wait_status(&t, &token, &a.device_id, "connected", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = t.get(&format!("/v1/invocations/{inv}"), &token).await.body;
    assert_eq!(v["status"], "interrupted");
    assert_eq!(v["evidence_ids"].as_array().unwrap().len(), evidence_before + 1, "{v}");
}

both_backends!(
    two_runners_on_loopback,
    killed_runner_leaves_outcome_unknown,
    confirmation_at_the_device,
    terminal_on_a_device,
    late_result_after_outcome_unknown_is_attached
);
