//! The device's sandbox for terminal sessions (docs/runner.md "Isolation"): a real `mira
//! runner` on loopback runs an approved session that tries to read the runner's private key
//! by its absolute path and to write outside the workspace; the key's content appears
//! nowhere (result, stream, stored output, evidence), only the workspace is written, and the
//! start's result and evidence name the sandbox. Both kinds (the private view and Landlock
//! alone), a sandbox that changed since the approval, and a runner that cannot sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Backend, TestApp, read_sse, spawn_with};
use crate::runner::{RunnerProc, device, device_view, evidence, grant, options, term, wait_status};

/// Restarts the runner with `args` and waits until the new runner is connected (it is
/// also given a new, empty `--workspace` folder, which tells its advertisement from the old
/// runner's); what it advertised of its sandbox.
async fn restart(t: &TestApp, token: &str, a: &mut RunnerProc, args: &[&str]) -> Value {
    if let Some(mut c) = a.child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let marker = a.workspace.with_file_name(format!("marker-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&marker).unwrap();
    let marker = std::fs::canonicalize(&marker).unwrap().to_string_lossy().into_owned();
    a.args = args.iter().map(|s| (*s).to_owned()).chain(["--workspace".to_owned(), marker.clone()]).collect();
    a.start();
    let start = Instant::now();
    loop {
        let view = device_view(t, token, &a.device_id).await;
        let advertised = &view["advertised"];
        let new = advertised["workspaces"].as_array().is_some_and(|w| w.iter().any(|w| w["path"] == marker));
        if view["status"] == "connected" && new {
            return advertised["sandbox"].clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the runner with {args:?} never connected: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a session tries: read the key, write in the workspace, outside it, in the state
/// dir and in `/etc`; one marker line each.
fn attempts(a: &RunnerProc, outside: &Path, tag: &str) -> String {
    let key = a.state.join("device.key");
    format!(
        "if cat '{key}'; then echo KEY-READ; else echo KEY-DENIED; fi
if echo in > '{ws}/in-{tag}.txt'; then echo IN-WROTE; else echo IN-DENIED; fi
if echo out > '{out}/out-{tag}.txt'; then echo OUT-WROTE; else echo OUT-DENIED; fi
if echo evil > '{state}/evil-{tag}'; then echo STATE-WROTE; else echo STATE-DENIED; fi
if echo etc > /etc/mira-sandbox-{tag}; then echo ETC-WROTE; else echo ETC-DENIED; fi
echo DONE-$((6*7))",
        key = key.display(),
        ws = a.workspace.display(),
        out = outside.display(),
        state = a.state.display(),
    )
}

/// Runs [`attempts`] in an approved session on the device; (the start's final invocation,
/// the whole output, the session id). The session is waited for to its end.
async fn run_attempts(
    t: &TestApp,
    token: &str,
    (run, turn): (&str, &str),
    a: &RunnerProc,
    outside: &Path,
    tag: &str,
) -> (Value, String, String) {
    let script = attempts(a, outside, tag);
    let done = term(
        t,
        token,
        run,
        turn,
        &format!("s-{tag}"),
        json!({"action": "start", "command": "sh", "args": ["-c", script], "settle_ms": 500}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let id = done["result"]["output"]["session_id"].as_str().unwrap().to_owned();
    let mut text = done["result"]["output"]["output"].as_str().unwrap().to_owned();
    // How each action returned, and how the session ended (shown when the output falls short).
    let how = |v: &Value| {
        let o = &v["result"]["output"];
        format!(
            "{} state={} exit_code={} signal={} end_reason={}",
            o["returned_because"], o["state"], o["exit_code"], o["signal"], o["end_reason"]
        )
    };
    let mut ends = vec![how(&done)];
    if !text.contains("DONE-42") {
        let w = term(
            t,
            token,
            run,
            turn,
            &format!("w-{tag}"),
            json!({"action": "wait", "session_id": id, "timeout_ms": 20_000}),
        )
        .await;
        assert_eq!(w["status"], "completed", "{w}");
        text.push_str(w["result"]["output"]["output"].as_str().unwrap());
        ends.push(how(&w));
    }
    assert!(text.contains("DONE-42"), "{text}\n(start, wait: {ends:?})");
    (done, text, id)
}

/// Everything the control plane holds of the session (stored output, SSE stream) and the
/// start's evidence, as text.
async fn held(t: &TestApp, token: &str, done: &Value, id: &str) -> String {
    let start = Instant::now();
    while t.get(&format!("/v1/terminal-sessions/{id}"), token).await.body["state"] == "running" {
        assert!(start.elapsed() < Duration::from_secs(10), "the session never ended on the control plane");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = t.get(&format!("/v1/terminal-sessions/{id}/output"), token).await.body;
    let resp =
        t.client.get(format!("{}/v1/terminal-sessions/{id}/stream", t.base)).bearer_auth(token).send().await.unwrap();
    let events = read_sse(resp, 1000, Duration::from_secs(5)).await;
    let ev = evidence(t, token, done).await;
    format!("{stored}\n{events:?}\n{ev}\n{done}")
}

/// See the module docs.
async fn terminal_sandbox_on_a_device(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let token = t.user("sam").await;
    let root = tempfile::tempdir().unwrap();
    let outside = std::fs::canonicalize(root.path()).unwrap();
    let mut a = device(&t, &token, "laptop", root.path()).await;
    let key = std::fs::read_to_string(a.state.join("device.key")).unwrap().trim().to_owned();
    assert_eq!(key.len(), 64, "the key file holds the hex seed");

    // Advertised: the sandbox is enforced; as root (or with user namespaces) a private view.
    let view = device_view(&t, &token, &a.device_id).await;
    let adv = &view["advertised"]["sandbox"];
    assert_eq!((adv["state"].as_str(), adv["sessions"].as_str()), (Some("enforced"), Some("sandboxed")), "{view}");
    assert!(adv["landlock_abi"].as_i64().unwrap() >= 1, "{adv}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(adv["filesystem"], "landlock+mount_namespace", "{adv}");
    }
    let filesystem = adv["filesystem"].as_str().unwrap().to_owned();

    let ws = t
        .post("/v1/workspaces", &token, json!({"name": "ws", "path": a.workspace, "device_id": a.device_id}))
        .await
        .body["id"]
        .clone();
    let run = t.post("/v1/runs", &token, json!({"workspace_id": ws})).await.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&token, &run, "run commands in a terminal").await;

    // 1. The default sandbox.
    let (done, text, id) = run_attempts(&t, &token, (&run, &turn), &a, &outside, "auto").await;
    assert!(text.contains("KEY-DENIED") && !text.contains("KEY-READ"), "{text}");
    assert!(text.contains("IN-WROTE"), "{text}");
    assert!(text.contains("STATE-DENIED") && text.contains("ETC-DENIED"), "{text}");
    assert_eq!(std::fs::read_to_string(a.workspace.join("in-auto.txt")).unwrap(), "in\n");
    // (In the private view the folder above the workspace exists only in the session's own
    // tmpfs: whatever it wrote there never reaches the device's folder.)
    assert!(!outside.join("out-auto.txt").exists(), "{text}");
    assert!(!a.state.join("evil-auto").exists() && !Path::new("/etc/mira-sandbox-auto").exists());
    let sandbox = &done["result"]["output"]["sandbox"];
    assert_eq!((sandbox["enforced"].as_bool(), sandbox["filesystem"].as_str()), (Some(true), Some(&*filesystem)));
    assert_eq!(sandbox["read_write"], json!([a.workspace]), "{sandbox}");
    assert_eq!(
        (sandbox["capabilities_dropped"].as_bool(), sandbox["no_new_privs"].as_bool()),
        (Some(true), Some(true))
    );
    let ev = evidence(&t, &token, &done).await;
    assert_eq!(&ev["provenance"]["input"]["sandbox"], sandbox, "{ev}");
    let all = held(&t, &token, &done, &id).await;
    assert!(all.contains("DONE-42"), "{all}");
    assert!(!all.contains(&key) && !all.contains(&key[..16]) && !text.contains(&key[..16]), "the key leaked");

    // 2. Landlock alone (what a device without user namespaces gets).
    let adv = restart(&t, &token, &mut a, &["--sandbox", "landlock"]).await;
    assert_eq!((adv["state"].as_str(), adv["filesystem"].as_str()), (Some("enforced"), Some("landlock")), "{adv}");
    let (done, text, id) = run_attempts(&t, &token, (&run, &turn), &a, &outside, "landlock").await;
    assert!(text.contains("KEY-DENIED") && !text.contains("KEY-READ"), "{text}");
    assert!(text.contains("IN-WROTE") && text.contains("OUT-DENIED"), "{text}");
    assert!(text.contains("STATE-DENIED") && text.contains("ETC-DENIED"), "{text}");
    assert_eq!(std::fs::read_to_string(a.workspace.join("in-landlock.txt")).unwrap(), "in\n");
    assert!(!outside.join("out-landlock.txt").exists());
    assert!(!a.state.join("evil-landlock").exists() && !Path::new("/etc/mira-sandbox-landlock").exists());
    let sandbox = &done["result"]["output"]["sandbox"];
    assert_eq!((sandbox["enforced"].as_bool(), sandbox["filesystem"].as_str()), (Some(true), Some("landlock")));
    let ev = evidence(&t, &token, &done).await;
    assert_eq!(&ev["provenance"]["input"]["sandbox"], sandbox, "{ev}");
    let all = held(&t, &token, &done, &id).await;
    assert!(!all.contains(&key) && !all.contains(&key[..16]) && !text.contains(&key[..16]), "the key leaked");

    // 3. A call approved under one sandbox does not run under another (here: one more
    // folder to read).
    let r =
        t.call(&token, &run, &turn, "terminal_session", "changed", json!({"action": "start", "command": "true"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let tools = outside.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    restart(&t, &token, &mut a, &["--sandbox", "landlock", "--sandbox-read", tools.to_str().unwrap()]).await;
    grant(&t, &token, &r.body).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["result"]["error"]["code"], "sandbox_changed", "{done}");

    // 4. A runner whose sandbox is off refuses sessions at the freeze, unless it allows
    // unsandboxed ones; then the result says so.
    let adv = restart(&t, &token, &mut a, &["--sandbox", "off"]).await;
    assert_eq!((adv["state"].as_str(), adv["sessions"].as_str()), (Some("off"), Some("refused")), "{adv}");
    assert!(adv["reason"].as_str().unwrap().contains("--sandbox off"), "{adv}");
    let r = t.call(&token, &run, &turn, "terminal_session", "off", json!({"action": "start", "command": "true"})).await;
    assert_eq!(r.code(), "sandbox_unavailable", "{r:?}");
    let adv = restart(&t, &token, &mut a, &["--sandbox", "off", "--allow-unsandboxed"]).await;
    assert_eq!(adv["sessions"], "unsandboxed_allowed", "{adv}");
    let done = term(
        &t,
        &token,
        &run,
        &turn,
        "plain",
        json!({"action": "start", "command": "sh", "args": ["-c", "echo plain-$((1+1))"], "settle_ms": 500}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["sandbox"]["enforced"], false, "{done}");
    wait_status(&t, &token, &a.device_id, "connected", Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("mira-runner-{}", a.device_id)));
}

both_backends!(terminal_sandbox_on_a_device);
