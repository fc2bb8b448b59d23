#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile devices and cluster internals, over HTTP on SQLite and on Postgres, with runners
//! spoken by hand (enroll, challenge, signed connect, the NDJSON stream) so that a runner can
//! send what a hostile one would.
//!
//! - A runner speaks for its own device only: another user's runner cannot write output into
//!   or end a device session of someone else's device, cannot answer a job sent to another
//!   device (even knowing its nonce), and its late result for another device's invocation is
//!   dropped. A late result never lands on a call that was cancelled before it started (it
//!   never reached the device).
//! - Another user cannot revoke a device or take an enrollment code for it; a revoked device's
//!   stream ends at once and its session token is refused on every runner route.
//! - A device workspace's folder is a path on the device that its owner chose freely: the
//!   host never looks at it (the code graph's availability once indexed it on the host and
//!   told whether it existed and how far the walk got: an oracle on the host's folders for any
//!   user with a device).
//! - A device revoked through another replica that could not tell the holder (its runner
//!   still attached here until its next heartbeat) is sent no execution: `device_revoked`.
//! - Every `/internal/v1/*` route refuses a request without the exact cluster secret (no
//!   header, a prefix, a longer value, another case), and every one is refused when no secret
//!   is configured, whatever the header says.
//! - Enrolling a device with a new key ends its earlier runner as a revocation does: its
//!   stream is cut, its session and key are refused everywhere, its terminal sessions are
//!   `lost`, and no job goes to it — also when the enrollment was recorded by another replica
//!   that could not cut it here.
//! - A job forwarded with the cluster secret (`/internal/v1/devices/job`) names the call only:
//!   the owner, the device and the workspace it is signed for are its run's.
//! - A late result lands only on a call of a tool that runs on the device (never a host
//!   tool's call of a run bound to it).
//! - Results and terminal output do not keep a runner live (only heartbeats, which ask the
//!   store); a revoked device is nobody's to attach a browser through.
//! - A runner that stops reading its stream cannot hold a freeze at the send of its job.

use crate::common;

use std::time::{Duration, Instant};

use common::{Backend, Options, TestApp, spawn, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

both_backends!(
    a_runner_speaks_only_for_its_own_device,
    a_revoked_device_and_its_session_are_refused,
    internal_routes_demand_the_cluster_secret,
    a_device_folder_is_never_looked_at_on_the_host,
    an_execution_is_never_sent_to_a_device_the_store_says_is_revoked,
    a_runner_that_never_answers_cannot_hold_a_freeze,
    enrolling_a_new_key_ends_the_earlier_runner,
    a_new_key_enrolled_elsewhere_gets_the_earlier_runner_no_job,
    a_forwarded_job_is_signed_for_its_runs_owner_device_and_workspace,
    only_heartbeats_keep_a_runner_live,
    a_runner_that_stops_reading_its_stream_cannot_hold_a_freeze,
);

/// A runner spoken by hand: its device, its session bearer and its open stream.
struct HandRunner {
    device: String,
    session: String,
    stream: reqwest::Response,
    buf: Vec<u8>,
}

impl HandRunner {
    /// The next line of the stream that is not a ping (None when the stream ended or
    /// nothing came within `within`).
    async fn next(&mut self, within: Duration) -> Option<Value> {
        let until = Instant::now() + within;
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                let v: Value = serde_json::from_slice(&line).unwrap();
                if v["type"] == "ping" {
                    continue;
                }
                return Some(v);
            }
            let left = until.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.stream.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buf.extend_from_slice(&bytes),
                Ok(Ok(None) | Err(_)) | Err(_) => return None,
            }
        }
    }

    /// Whether the stream ended within `within`.
    async fn ended(&mut self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            let Some(left) = until.checked_duration_since(Instant::now()) else { return false };
            match tokio::time::timeout(left, self.stream.chunk()).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None) | Err(_)) => return true,
                Err(_) => return false,
            }
        }
    }
}

fn streaming_client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// Registers a device for `token`, enrolls key `seed` with its code and connects, advertising
/// the Read tools and the workspace folder `/srv/<name>`.
async fn hand_runner(t: &TestApp, token: &str, name: &str, seed: u8) -> HandRunner {
    let r = t.post("/v1/devices", token, json!({"name": name})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let device = r.body["id"].as_str().unwrap().to_owned();
    let code = r.body["enrollment"]["code"].as_str().unwrap().to_owned();
    assert_eq!(enroll(t, &code, seed).await.0, StatusCode::OK);
    connect(t, &device, name, seed).await.unwrap_or_else(|(status, body)| panic!("{status}: {body}"))
}

/// `POST /v1/runner/enroll` of key `seed` with `code`: (status, body).
async fn enroll(t: &TestApp, code: &str, seed: u8) -> (StatusCode, Value) {
    let key = mira_core::remote::signing_key(&[seed; 32]);
    let r = streaming_client()
        .post(format!("{}/v1/runner/enroll", t.base))
        .json(&json!({"code": code, "public_key": mira_core::remote::public_hex(&key)}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A challenge of `device` signed with key `seed`, and the connect: the runner with its
/// stream and session, or the refusal (status, body).
async fn connect(t: &TestApp, device: &str, name: &str, seed: u8) -> Result<HandRunner, (StatusCode, Value)> {
    let key = mira_core::remote::signing_key(&[seed; 32]);
    let client = streaming_client();
    let r: Value = client
        .post(format!("{}/v1/runner/challenge", t.base))
        .json(&json!({"device_id": device}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let challenge = r["challenge"].as_str().unwrap_or_else(|| panic!("{r}")).to_owned();
    let signature = mira_core::remote::sign(
        &key,
        mira_core::remote::CONNECT_DOMAIN,
        &mira_core::remote::connect_message(device, &challenge),
    );
    let stream = client
        .post(format!("{}/v1/runner/connect", t.base))
        .json(&json!({"device_id": device, "challenge": challenge, "signature": signature,
            "advertised": {"capabilities": ["fs.read", "fs.write"], "tools": ["read_open", "codebase_explore"],
                "workspaces": [{"path": format!("/srv/{name}")}], "version": "hand"}}))
        .send()
        .await
        .unwrap();
    if stream.status() != StatusCode::OK {
        let status = stream.status();
        return Err((status, stream.json().await.unwrap_or(Value::Null)));
    }
    let mut runner = HandRunner { device: device.to_owned(), session: String::new(), stream, buf: Vec::new() };
    let welcome = runner.next(Duration::from_secs(5)).await.expect("a welcome line");
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    runner.session = welcome["session"].as_str().unwrap().to_owned();
    Ok(runner)
}

/// `POST /v1/runner/<route>` with `session` as the bearer: (status, error code).
async fn runner_post(t: &TestApp, session: &str, route: &str, body: reqwest::Body, json: bool) -> (StatusCode, Value) {
    let mut r = t.client.post(format!("{}/v1/runner/{route}", t.base)).bearer_auth(session).body(body);
    if json {
        r = r.header("content-type", "application/json");
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn result_post(t: &TestApp, session: &str, body: Value) -> (StatusCode, Value) {
    runner_post(t, session, "results", body.to_string().into(), true).await
}

fn late_output(nonce: &str, invocation: &str, marker: &str) -> Value {
    json!({"nonce": nonce, "invocation_id": invocation, "late": true,
        "outcome": {"status": "output", "output": {"output": {"by": marker}, "evidence": []}}})
}

/// A device-bound run of `token` on `runner`'s device, its workspace `/srv/<name>`.
async fn device_run(t: &TestApp, token: &str, runner: &HandRunner, name: &str) -> String {
    let r = t
        .post(
            "/v1/workspaces",
            token,
            json!({"name": name, "path": format!("/srv/{name}"), "device_id": runner.device}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = t.post("/v1/runs", token, json!({"workspace_id": r.body["id"]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r.body["id"].as_str().unwrap().to_owned()
}

/// Freezes `read_open` of `notes.txt` (call `r1`) in `run`'s `turn` on a task of its own (the
/// freeze waits for the device's prepare): its HTTP status and body.
fn spawn_read_freeze(t: &TestApp, token: &str, run: &str, turn: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let (base, token, run, turn) = (t.base.clone(), token.to_owned(), run.to_owned(), turn.to_owned());
    tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{base}/v1/runs/{run}/invocations"))
            .bearer_auth(&token)
            .json(
                &json!({"turn_id": turn, "tool_id": "read_open", "tool_call_id": "r1", "input": {"path": "notes.txt"}}),
            )
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    })
}

async fn late_kinds(t: &TestApp, token: &str, inv: &str) -> Vec<Value> {
    let v = t.get(&format!("/v1/invocations/{inv}"), token).await.body;
    let mut out = Vec::new();
    for id in v["evidence_ids"].as_array().unwrap() {
        let e = t.get(&format!("/v1/evidence/{}", id.as_str().unwrap()), token).await.body;
        if e["kind"] == "late_device_result" {
            out.push(e);
        }
    }
    out
}

async fn a_runner_speaks_only_for_its_own_device(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let mut a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let b = hand_runner(&t, &bob, "bob-laptop", 9).await;
    let run = device_run(&t, &alice, &a, "alice-ws").await;

    // 1. Output and end of a session on alice's device, sent with bob's runner session.
    let session_id = "tss_0123456789abcdef0123456789abcdef".to_owned();
    let origin = mira::store::SessionOrigin {
        owner_id: alice_id.clone(),
        run_id: run.clone(),
        invocation_id: "inv_0123456789abcdef0123456789abcdef".into(),
    };
    let row = mira::store::TerminalSessionRow::new_running(
        session_id.clone(),
        a.device.clone(),
        origin,
        mira::store::SessionLaunch {
            command: "sh".into(),
            cols: 80,
            rows: 24,
            timeout_ms: 60_000,
            ..Default::default()
        },
    );
    t.app().store.insert_terminal_session(&row).await.unwrap();
    let out = |session: String| {
        let t = &t;
        let q = format!("terminal/output?session_id={session_id}&offset=0");
        async move { runner_post(t, &session, &q, b"rm -rf ~\n".to_vec().into(), false).await }
    };
    let (status, body) = out(b.session.clone()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("terminal_session_not_found")));
    let end = json!({"session_id": session_id, "bytes_out": 0, "state": "killed", "end_reason": "bob"});
    let (status, body) = runner_post(&t, &b.session, "terminal/end", end.to_string().into(), true).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("terminal_session_not_found")));
    let stored = t.app().store.terminal_session_for_any(&session_id).await.unwrap().unwrap();
    assert_eq!((stored.bytes_out, stored.state.to_string().as_str()), (0, "running"), "bob's runner wrote into it");
    // Alice's own runner may (the refusal above is about the device, not the route).
    let (status, body) = out(a.session.clone()).await;
    assert_eq!((status, body["bytes_out"].as_u64()), (StatusCode::OK, Some(9)), "{body}");

    // 2. A job sent to alice's runner (the freeze of a Read call) answered by bob's runner
    // with the job's nonce: refused, and the call gets alice's runner's answer.
    let (turn, _) = t.turn(&alice, &run, "read a file").await;
    let call = {
        let t2 = (t.base.clone(), alice.clone(), run.clone(), turn.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{}/v1/runs/{}/invocations", t2.0, t2.2))
                .bearer_auth(&t2.1)
                .json(&json!({"turn_id": t2.3, "tool_id": "read_open", "tool_call_id": "r1", "input": {"path": "notes.txt"}}))
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        })
    };
    let job = a.next(Duration::from_secs(10)).await.expect("the freeze sends a job to alice's runner");
    assert_eq!(job["type"], "job", "{job}");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    let nonce = envelope["nonce"].as_str().unwrap().to_owned();
    let error = |by: &str| {
        json!({"nonce": nonce, "invocation_id": "", "late": false,
            "outcome": {"status": "error", "error": {"code": "not_found", "message": format!("answered by {by}"), "details": null}}})
    };
    let (status, body) = result_post(&t, &b.session, error("bob")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("device_auth_failed")));
    let (status, _) = result_post(&t, &a.session, error("alice")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, answer) = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap().unwrap();
    let text = answer.to_string();
    assert!(text.contains("answered by alice") && !text.contains("answered by bob"), "{status}: {answer:#}");

    // 3. Late results. A Read call on alice's device run, sent to her runner, whose answer is
    // then recorded lost (`interrupted`, as when the runner stays away: a late result may land
    // on it).
    let device_run = run.clone();
    let (turn, _) = t.turn(&alice, &device_run, "read a file").await;
    let call = spawn_read_freeze(&t, &alice, &device_run, &turn);
    let job = a.next(Duration::from_secs(10)).await.expect("the freeze's prepare job");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["phase"], "prepare", "{envelope}");
    let prepare_nonce = envelope["nonce"].as_str().unwrap().to_owned();
    let prepared = json!({"nonce": envelope["nonce"], "invocation_id": "", "late": false,
        "outcome": {"status": "prepared", "input": {"path": "notes.txt"}, "preview": {}}});
    assert_eq!(result_post(&t, &a.session, prepared).await.0, StatusCode::NO_CONTENT);
    let (status, frozen) = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::CREATED, "{frozen:#}");
    let on_device = frozen["invocation_id"].as_str().unwrap().to_owned();
    let job = a.next(Duration::from_secs(10)).await.expect("the execution's job");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    assert_eq!((envelope["phase"].as_str(), envelope["invocation_id"].as_str()), (Some("execute"), Some(&*on_device)));
    let execute_nonce = envelope["nonce"].as_str().unwrap().to_owned();
    let error = json!({"nonce": envelope["nonce"], "invocation_id": on_device, "late": false,
        "outcome": {"status": "error", "error": {"code": "not_found", "message": "gone", "details": null}}});
    assert_eq!(result_post(&t, &a.session, error).await.0, StatusCode::NO_CONTENT);
    let done = t.wait_final(&alice, &on_device).await;
    assert_eq!(done["status"], "failed", "{done:#}");

    // Host-tool calls of a run bound to alice's device (a probe needing approval, frozen in
    // the host's default workspace): one recorded `interrupted` after it started — as a host
    // call whose replica died is — and one cancelled while it awaited approval. Neither was
    // ever sent to a device.
    let probe = common::TestTool::new("hostile_device_probe", "a probe needing approval", true);
    t.app().registry.register(std::sync::Arc::new(probe)).unwrap();
    let r = t.post("/v1/runs", &alice, json!({"device_id": a.device})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let run = r.body["id"].as_str().unwrap().to_owned();
    let (turn, _) = t.turn(&alice, &run, "probe the device").await;
    let mut frozen = Vec::new();
    for call in ["p1", "p2"] {
        let r = t.call(&alice, &run, &turn, "hostile_device_probe", call, json!({"value": call})).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        frozen.push(r.body["invocation_id"].as_str().unwrap().to_owned());
    }
    let (interrupted, cancelled) = (frozen[0].clone(), frozen[1].clone());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    for id in [&interrupted, &on_device] {
        sqlx::query(
            "UPDATE invocations SET status = 'interrupted', started_at = '2026-01-01T00:00:00.000Z',
                    finished_at = '2026-01-01T00:00:01.000Z' WHERE id = $1",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
    let r = t.post(&format!("/v1/invocations/{cancelled}/cancel"), &alice, json!({})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::OK, Some("cancelled")), "{r:?}");

    // Bob's runner names alice's device call; alice's runner names the host call interrupted
    // after it started (a host tool: never sent to her device), the call cancelled before it
    // started, and then her device call.
    // Each with a nonce issued for that device and call, as if it had been sent (the checks
    // after the nonce's are what this tests).
    let nonce = |device: &str, inv: &str| t.app().devices.nonces().issue(device, inv);
    let (status, _) = result_post(&t, &b.session, late_output(&nonce(&b.device, &on_device), &on_device, "bob")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) =
        result_post(&t, &a.session, late_output(&nonce(&a.device, &interrupted), &interrupted, "alice")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) =
        result_post(&t, &a.session, late_output(&nonce(&a.device, &cancelled), &cancelled, "alice")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Her runner names her device call with nonces not issued for its execution: one made
    // up, the prepare's (issued for no invocation), one issued for her other call, and the
    // execution's with its last digit changed.
    let mut altered = execute_nonce.clone();
    let last = if altered.ends_with('0') { "1" } else { "0" };
    altered.replace_range(95.., last);
    for nonce in ["n-a2".to_owned(), prepare_nonce, nonce(&a.device, &interrupted), altered] {
        let (status, _) = result_post(&t, &a.session, late_output(&nonce, &on_device, "forged")).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = result_post(&t, &a.session, late_output(&execute_nonce, &on_device, "alice")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let start = Instant::now();
    let late = loop {
        let late = late_kinds(&t, &alice, &on_device).await;
        if !late.is_empty() {
            break late;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "alice's own late result was never attached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late_again = late_kinds(&t, &alice, &on_device).await;
    assert_eq!(late_again.len(), 1, "{late_again:#?}");
    assert_eq!(late[0]["provenance"]["device_id"], a.device.as_str(), "{late:#?}");
    let excerpt = late[0]["excerpt"].as_str().unwrap();
    assert!(excerpt.contains("alice") && !excerpt.contains("forged"), "{late:#?}");
    let on_host_call = late_kinds(&t, &alice, &interrupted).await;
    assert!(on_host_call.is_empty(), "a late device result landed on a host tool's call: {on_host_call:#?}");
    let on_cancelled = late_kinds(&t, &alice, &cancelled).await;
    assert!(on_cancelled.is_empty(), "a late result landed on a call that never started: {on_cancelled:#?}");
    let v = t.get(&format!("/v1/invocations/{cancelled}"), &alice).await.body;
    assert_eq!(v["status"], "cancelled", "{v}");
}

async fn a_revoked_device_and_its_session_are_refused(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let mut a = hand_runner(&t, &alice, "alice-laptop", 7).await;

    // Bob can neither revoke alice's device nor take a code for it (404, nothing changes).
    for path in ["revoke", "enrollment-code"] {
        let r = t.post(&format!("/v1/devices/{}/{path}", a.device), &bob, json!({})).await;
        assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{path}: {r:?}");
    }
    let (status, _) = runner_post(&t, &a.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "bob's attempts cut alice's runner");
    let v = t.get("/v1/devices", &alice).await.body;
    assert_eq!(v["devices"][0]["status"], "connected", "{v}");

    let r = t.post(&format!("/v1/devices/{}/revoke", a.device), &alice, json!({})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::OK, Some("revoked")), "{r:?}");
    // Cut by the revocation itself: otherwise only a next heartbeat, which never comes, would.
    assert!(a.ended(Duration::from_secs(10)).await, "the revoked device's stream did not end");
    let refused =
        |(status, body): (StatusCode, Value)| (status, body["error"]["code"].as_str().unwrap_or("").to_owned());
    let expect = (StatusCode::UNAUTHORIZED, "device_auth_failed".to_owned());
    assert_eq!(refused(runner_post(&t, &a.session, "heartbeat", Vec::new().into(), false).await), expect);
    assert_eq!(refused(result_post(&t, &a.session, late_output("n", "inv_0", "x")).await), expect);
    let q = "terminal/output?session_id=tss_0123456789abcdef0123456789abcdef&offset=0";
    assert_eq!(refused(runner_post(&t, &a.session, q, b"x".to_vec().into(), false).await), expect);
    let r = t.client.post(format!("{}/v1/runner/challenge", t.base)).json(&json!({"device_id": a.device})).send().await;
    let r = r.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("device_revoked")), "{body}");
    let r = t.post(&format!("/v1/devices/{}/enrollment-code", a.device), &alice, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "device_revoked"), "{r:?}");
}

const INTERNAL: [&str; 7] = [
    "/internal/v1/execute",
    "/internal/v1/mcp/connect",
    "/internal/v1/mcp/discover",
    "/internal/v1/devices/job",
    "/internal/v1/devices/cut",
    "/internal/v1/runner/heartbeat",
    "/internal/v1/runner/results",
];

/// `POST <route>` with the secret header `secret` (None: no header) and `bearer`.
async fn internal(t: &TestApp, route: &str, secret: Option<&str>, bearer: &str, body: &Value) -> (StatusCode, Value) {
    let mut r = t.client.post(format!("{}{route}", t.base)).bearer_auth(bearer).json(body);
    if let Some(secret) = secret {
        r = r.header("x-mira-cluster-secret", secret);
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn internal_routes_demand_the_cluster_secret(backend: Backend) {
    let secret = "cluster-s3cret";
    let mut options = Options::default();
    options.runtime.cluster.secret = Some(secret.into());
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let device = a.device.clone();
    let bodies = |route: &str| match route {
        "/internal/v1/execute" => json!({"invocation_id": "inv_0123456789abcdef0123456789abcdef", "claimed_by": "x"}),
        "/internal/v1/devices/job" => {
            json!({"run_id": "run_0123456789abcdef0123456789abcdef", "phase": "canonicalize", "tool_id": "read_open",
                "input": {}})
        }
        "/internal/v1/runner/results" => late_output("n", "inv_0123456789abcdef0123456789abcdef", "x"),
        "/internal/v1/mcp/connect" | "/internal/v1/mcp/discover" => json!({"server_id": "mcp_0"}),
        _ => json!({"device_id": device}),
    };
    let upper = secret.to_uppercase();
    let longer = format!("{secret}x");
    let wrong = [None, Some(""), Some(&secret[..secret.len() - 1]), Some(longer.as_str()), Some(upper.as_str())];
    for route in INTERNAL {
        for given in wrong {
            let (status, body) = internal(&t, route, given, &a.session, &bodies(route)).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::UNAUTHORIZED, Some("unauthorized")),
                "{route} with {given:?}: {body}"
            );
        }
    }
    // The runner was neither cut nor beaten for: its session still works and the device is
    // connected.
    let (status, _) = runner_post(&t, &a.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // With the secret: a cut of a device that is not revoked cuts nothing; a heartbeat for a
    // session this replica does not hold is refused.
    let (status, body) = internal(&t, "/internal/v1/devices/cut", Some(secret), "x", &bodies("cut")).await;
    assert_eq!((status, body["cut"].as_bool()), (StatusCode::OK, Some(false)), "{body}");
    let (status, body) = internal(&t, "/internal/v1/runner/heartbeat", Some(secret), "mrs_forged", &json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("device_auth_failed")));
    let v = t.get("/v1/devices", &alice).await.body;
    assert_eq!(v["devices"][0]["status"], "connected", "{v}");
    drop(a);

    // No secret configured: every internal route is refused, whatever is sent.
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    for route in INTERNAL {
        for given in [None, Some(""), Some(secret)] {
            let (status, body) = internal(&t, route, given, &a.session, &bodies(route)).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::UNAUTHORIZED, Some("unauthorized")),
                "{route} with {given:?}: {body}"
            );
        }
    }
}

async fn a_device_folder_is_never_looked_at_on_the_host(backend: Backend) {
    let t = spawn(backend).await;
    let mallory = t.user("mallory").await;
    let a = hand_runner(&t, &mallory, "mallory-laptop", 11).await;
    // A host folder with code in it, and a path that exists nowhere on the host.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("lib.rs"), "pub fn secret() {}\n").unwrap();
    let host_path = std::fs::canonicalize(host.path()).unwrap().to_string_lossy().into_owned();
    let probe = common::TestTool::new("hostile_folder_probe", "a host tool", false);
    t.app().registry.register(std::sync::Arc::new(probe)).unwrap();
    for (name, path) in [("host-folder", host_path.as_str()), ("nowhere", "/nonexistent-on-this-host/x")] {
        let r = t.post("/v1/workspaces", &mallory, json!({"name": name, "path": path, "device_id": a.device})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let r = t.post("/v1/runs", &mallory, json!({"workspace_id": r.body["id"]})).await;
        let run = r.body["id"].as_str().unwrap().to_owned();
        let (turn, _) = t.turn(&mallory, &run, "explore the code graph").await;
        // A host tool that works in no folder (no fs/pty capability: those run on the device)
        // runs on the host without the host opening the path — it is given no folder — and
        // alike whether or not something is at that path here.
        let r = t.call(&mallory, &run, &turn, "hostile_folder_probe", "h1", json!({"value": "x"})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{name}: {r:?}");
        let done = t.wait_final(&mallory, r.body["invocation_id"].as_str().unwrap()).await;
        assert_eq!(
            (done["status"].as_str(), done["result"]["output"]["given_workspace"].as_bool()),
            (Some("completed"), Some(false)),
            "{name}: {done}"
        );
        assert!(!done.to_string().contains(path), "{name}: the answer names the host path: {done}");
        // On the run's device, and as if on the host (`device=local`).
        for query in [format!("turn={turn}"), format!("turn={turn}&device=local")] {
            for _ in 0..3 {
                let v = t.get(&format!("/v1/tools/codebase_explore?{query}"), &mallory).await;
                assert_eq!(v.status, StatusCode::OK, "{v:?}");
                let reason = v.body["reason"]["code"].as_str().unwrap_or("");
                assert!(
                    !reason.starts_with("index_"),
                    "{name} ({query}): the host judged the device folder {path}: {:#}",
                    v.body
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn an_execution_is_never_sent_to_a_device_the_store_says_is_revoked(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let mut a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let run = device_run(&t, &alice, &a, "alice-ws").await;
    let (turn, _) = t.turn(&alice, &run, "read a file").await;
    let call = spawn_read_freeze(&t, &alice, &run, &turn);
    let job = a.next(Duration::from_secs(10)).await.expect("the freeze's prepare job");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["phase"], "prepare", "{envelope}");
    // Revoked as another replica records it when it cannot reach this one: the row only.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    sqlx::query("UPDATE devices SET revoked_at = '2026-01-01T00:00:00.000Z', holder_node_id = NULL, holder_process_id = NULL, session_sha256 = NULL WHERE id = $1")
        .bind(&a.device)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let prepared = json!({"nonce": envelope["nonce"], "invocation_id": "", "late": false,
        "outcome": {"status": "prepared", "input": {"path": "notes.txt"}, "preview": {}}});
    let (status, body) = result_post(&t, &a.session, prepared).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (_, frozen) = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap().unwrap();
    let inv = frozen["invocation_id"].as_str().unwrap_or_else(|| panic!("{frozen:#}")).to_owned();
    let next = a.next(Duration::from_secs(3)).await;
    assert!(next.is_none(), "an execution was sent to the revoked device: {next:#?}");
    let done = t.wait_final(&alice, &inv).await;
    assert_eq!(done["result"]["error"]["code"], "device_revoked", "{done:#}");
}

/// A connected runner that takes a freeze's prepare job and never answers (a stolen laptop's,
/// or a stuck one) holds the freeze only as long as the job is valid: the call is answered 503
/// `request_timeout` then, nothing is frozen, and the next call is sent to the runner again.
async fn a_runner_that_never_answers_cannot_hold_a_freeze(backend: Backend) {
    const JOB_TTL: Duration = Duration::from_secs(2);
    let mut options = Options::default();
    options.runtime.devices = mira::devices::DeviceSettings { job_ttl: JOB_TTL, ..Default::default() };
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let mut a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let run = device_run(&t, &alice, &a, "alice-ws").await;
    let (turn, _) = t.turn(&alice, &run, "read a file").await;
    let started = Instant::now();
    let call = spawn_read_freeze(&t, &alice, &run, &turn);
    let job = a.next(Duration::from_secs(30)).await.expect("the freeze's prepare job");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["phase"], "prepare", "{envelope}");
    let (status, body) = tokio::time::timeout(Duration::from_secs(60), call).await.unwrap().unwrap();
    assert!(started.elapsed() >= JOB_TTL, "answered before the job's validity ran out: {body}");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("request_timeout")),
        "{body}"
    );
    // The job's bound, not the HTTP request's (30 s) which has the same code.
    assert!(body["error"]["message"].as_str().unwrap().contains("did not answer within 2 s"), "{body}");
    let listed = t.get(&format!("/v1/runs/{run}/invocations"), &alice).await;
    assert_eq!(listed.body["invocations"].as_array().map(Vec::len), Some(0), "nothing was frozen: {listed:?}");
    // The runner is still connected: the same call is sent to it again.
    let again = spawn_read_freeze(&t, &alice, &run, &turn);
    let job = a.next(Duration::from_secs(30)).await.expect("the second call's prepare job");
    assert_eq!(serde_json::from_str::<Value>(job["envelope"].as_str().unwrap()).unwrap()["phase"], "prepare");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(60), again).await.unwrap().unwrap().0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// `POST /v1/devices/{id}/enrollment-code`: the new code.
async fn new_code(t: &TestApp, token: &str, device: &str) -> String {
    let r = t.post(&format!("/v1/devices/{device}/enrollment-code"), token, json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r.body["code"].as_str().unwrap().to_owned()
}

/// The status of `token`'s device `id` in `GET /v1/devices`.
async fn device_status(t: &TestApp, token: &str, id: &str) -> String {
    let v = t.get("/v1/devices", token).await.body;
    let d = v["devices"].as_array().unwrap().iter().find(|d| d["id"] == id).unwrap_or_else(|| panic!("{v}"));
    d["status"].as_str().unwrap().to_owned()
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// A running terminal session of `device` (as the holder records it before a `start`).
async fn running_session(t: &TestApp, owner_id: &str, run: &str, device: &str, id: &str) {
    let origin = mira::store::SessionOrigin {
        owner_id: owner_id.to_owned(),
        run_id: run.to_owned(),
        invocation_id: "inv_0123456789abcdef0123456789abcdef".into(),
    };
    let launch = mira::store::SessionLaunch {
        command: "sh".into(),
        cols: 80,
        rows: 24,
        timeout_ms: 60_000,
        ..Default::default()
    };
    let row = mira::store::TerminalSessionRow::new_running(id.to_owned(), device.to_owned(), origin, launch);
    t.app().store.insert_terminal_session(&row).await.unwrap();
}

/// A new machine enrolled for a device (a new code, a new key) ends the earlier machine's
/// runner exactly as a revocation would: its stream ends at once, its session is refused on
/// every runner route, its key no longer connects, its terminal sessions are `lost`, and the
/// device's jobs go to the new runner only.
async fn enrolling_a_new_key_ends_the_earlier_runner(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let mut old = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let device = old.device.clone();
    let run = device_run(&t, &alice, &old, "alice-ws").await;
    let (turn, _) = t.turn(&alice, &run, "read a file").await;
    let session_id = "tss_00000000000000000000000000000001";
    running_session(&t, &alice_id, &run, &device, session_id).await;
    let (status, _) = runner_post(&t, &old.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let code = new_code(&t, &alice, &device).await;
    // A new code alone changes nothing: the runner keeps its connection until a key enrolls.
    let (status, _) = runner_post(&t, &old.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "a new code cut the runner");
    let (status, body) = enroll(&t, &code, 8).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(old.ended(Duration::from_secs(10)).await, "the earlier runner's stream did not end at the new enrollment");

    let refused = |(status, body): (StatusCode, Value)| (status, error_code(&body).to_owned());
    let expect = (StatusCode::UNAUTHORIZED, "device_auth_failed".to_owned());
    assert_eq!(refused(runner_post(&t, &old.session, "heartbeat", Vec::new().into(), false).await), expect);
    assert_eq!(refused(result_post(&t, &old.session, late_output("n", "inv_0", "x")).await), expect);
    let q = format!("terminal/output?session_id={session_id}&offset=0");
    assert_eq!(refused(runner_post(&t, &old.session, &q, b"x".to_vec().into(), false).await), expect);
    // The earlier key connects no more.
    let again = connect(&t, &device, "alice-ws", 7).await.err().expect("the earlier key connected again");
    assert_eq!(refused(again), expect);
    let stored = t.app().store.terminal_session_for_any(session_id).await.unwrap().unwrap();
    assert_eq!(stored.state.to_string(), "lost", "{stored:?}");
    assert_eq!(device_status(&t, &alice, &device).await, "offline");
    let (status, body) = spawn_read_freeze(&t, &alice, &run, &turn).await.unwrap();
    assert_ne!(status, StatusCode::CREATED, "{body:#}");
    assert!(body.to_string().contains("device_offline"), "{status}: {body:#}");

    // The new machine's runner connects and gets the device's jobs.
    let mut new = connect(&t, &device, "alice-ws", 8).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(device_status(&t, &alice, &device).await, "connected");
    let call = spawn_read_freeze(&t, &alice, &run, &turn);
    let job = new.next(Duration::from_secs(10)).await.expect("the new runner gets the prepare job");
    let envelope: Value = serde_json::from_str(job["envelope"].as_str().unwrap()).unwrap();
    assert_eq!((envelope["phase"].as_str(), envelope["device_id"].as_str()), (Some("prepare"), Some(&*device)));
    let error = json!({"nonce": envelope["nonce"], "invocation_id": "", "late": false,
        "outcome": {"status": "error", "error": {"code": "not_found", "message": "answered by the new machine", "details": null}}});
    assert_eq!(result_post(&t, &new.session, error).await.0, StatusCode::NO_CONTENT);
    let (_, answer) = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap().unwrap();
    assert!(answer.to_string().contains("answered by the new machine"), "{answer:#}");
}

/// A new key enrolled as another replica records it, when it cannot reach the replica holding
/// the earlier runner (the store only: the connection here is not cut by the enrollment):
/// the earlier runner is sent no job — the freeze is `device_offline` and its connection is
/// cut — and its heartbeat is refused.
async fn a_new_key_enrolled_elsewhere_gets_the_earlier_runner_no_job(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let mut old = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let run = device_run(&t, &alice, &old, "alice-ws").await;
    let (turn, _) = t.turn(&alice, &run, "read a file").await;
    let code = new_code(&t, &alice, &old.device).await;
    let key = mira_core::remote::public_hex(&mira_core::remote::signing_key(&[8; 32]));
    let sha = mira::evidence::sha256_hex(code.as_bytes());
    let enrolled = t.app().store.enroll_device(&sha, &key, &mira::ids::now()).await.unwrap();
    assert!(enrolled.is_some());

    let (status, body) = spawn_read_freeze(&t, &alice, &run, &turn).await.unwrap();
    let next = old.next(Duration::from_secs(2)).await;
    assert!(next.is_none(), "a job was sent to the earlier runner: {next:#?}");
    assert_ne!(status, StatusCode::CREATED, "{body:#}");
    assert!(body.to_string().contains("device_offline"), "{status}: {body:#}");
    let (status, body) = runner_post(&t, &old.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!((status, error_code(&body)), (StatusCode::UNAUTHORIZED, "device_auth_failed"));
    assert!(old.ended(Duration::from_secs(10)).await, "the earlier runner's stream did not end");
}

/// `/internal/v1/devices/job` with the cluster secret: the request names the call only (run,
/// phase, tool, input); the job is signed for the run's owner, the device the run is bound to
/// and the run's workspace. A forged owner, device or workspace is refused, as is a run whose
/// device is not its owner's, an execution, a host tool, an unknown run and a run on the host;
/// nothing reaches a runner. A legitimate forwarded prepare still works.
async fn a_forwarded_job_is_signed_for_its_runs_owner_device_and_workspace(backend: Backend) {
    let secret = "cluster-s3cret";
    let mut options = Options::default();
    options.runtime.cluster.secret = Some(secret.into());
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let bob_id = t.get("/v1/me", &bob).await.body["id"].as_str().unwrap().to_owned();
    let mut a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let mut b = hand_runner(&t, &bob, "bob-laptop", 9).await;
    let alice_run = device_run(&t, &alice, &a, "alice-ws").await;
    let bob_run = device_run(&t, &bob, &b, "bob-ws").await;
    let host_run = t.run(&alice).await;
    let probe = common::TestTool::new("hostile_forward_probe", "a host tool", false);
    t.app().registry.register(std::sync::Arc::new(probe)).unwrap();
    let job = |body: Value| {
        let t = &t;
        async move { internal(t, "/internal/v1/devices/job", Some(secret), "x", &body).await }
    };
    let call =
        |run: &str| json!({"run_id": run, "phase": "prepare", "tool_id": "read_open", "input": {"path": "id_ed25519"}});

    // The former shape: a device and a whole job of the caller's choosing (another user's
    // run and owner, a folder of alice's device that is no workspace of hers).
    let forged = json!({"device_id": a.device, "spec": {"phase": "prepare", "invocation_id": "", "run_id": bob_run,
        "owner_id": bob_id, "tool_id": "read_open", "input": {"path": "id_ed25519"}, "approval_id": null,
        "workspace": "/home/alice/.ssh"}});
    let (status, body) = job(forged).await;
    assert!(status.is_client_error() && status != StatusCode::UNAUTHORIZED, "{status}: {body}");
    // The call named, with a forged owner, device or workspace beside it.
    for (field, value) in
        [("owner_id", bob_id.as_str()), ("device_id", b.device.as_str()), ("workspace", "/home/alice/.ssh")]
    {
        let mut body = call(&alice_run);
        body[field] = json!(value);
        let (status, answer) = job(body).await;
        assert!(status.is_client_error() && status != StatusCode::UNAUTHORIZED, "{field}: {status}: {answer}");
    }
    // Bob's run, its row pointing at alice's device (a device that is not the run's owner's).
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    sqlx::query("UPDATE runs SET device_id = $1 WHERE id = $2")
        .bind(&a.device)
        .bind(&bob_run)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let (status, body) = job(call(&bob_run)).await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"), "{body}");
    // An execution, a host tool, an unknown run, a run on the host.
    let mut execute = call(&alice_run);
    execute["phase"] = json!("execute");
    let (status, body) = job(execute).await;
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_field"), "{body}");
    let mut host_tool = call(&alice_run);
    host_tool["tool_id"] = json!("hostile_forward_probe");
    let (status, body) = job(host_tool).await;
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "invalid_field"), "{body}");
    let (status, body) = job(call("run_0123456789abcdef0123456789abcdef")).await;
    assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"), "{body}");
    let (status, body) = job(call(&host_run)).await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"), "{body}");
    for (who, runner) in [("alice", &mut a), ("bob", &mut b)] {
        let next = runner.next(Duration::from_secs(1)).await;
        assert!(next.is_none(), "a refused forward reached {who}'s runner: {next:#?}");
    }

    // The legitimate forward (a freeze on another replica): signed for alice, her device and
    // her run's workspace.
    let forwarded = {
        let (base, body) = (t.base.clone(), call(&alice_run));
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{base}/internal/v1/devices/job"))
                .header("x-mira-cluster-secret", secret)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    let line = a.next(Duration::from_secs(10)).await.expect("the forwarded prepare reaches alice's runner");
    let envelope: Value = serde_json::from_str(line["envelope"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            envelope["phase"].as_str(),
            envelope["device_id"].as_str(),
            envelope["owner_id"].as_str(),
            envelope["run_id"].as_str(),
            envelope["workspace"].as_str()
        ),
        (
            Some("prepare"),
            Some(a.device.as_str()),
            Some(alice_id.as_str()),
            Some(alice_run.as_str()),
            Some("/srv/alice-ws")
        ),
        "{envelope:#}"
    );
    let prepared = json!({"nonce": envelope["nonce"], "invocation_id": "", "late": false,
        "outcome": {"status": "prepared", "input": {"path": "id_ed25519"}, "preview": {"by": "alice"}}});
    assert_eq!(result_post(&t, &a.session, prepared).await.0, StatusCode::NO_CONTENT);
    let (status, answer) = tokio::time::timeout(Duration::from_secs(10), forwarded).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["ok"]["status"], "prepared", "{answer}");
    assert_eq!(answer["ok"]["preview"]["by"], "alice", "{answer}");
}

/// A runner that posts results and terminal output but no heartbeat (which asks the store
/// whether the device is still its connection's) goes offline after its lease; a heartbeat
/// makes it connected again. A device revoked (in the store) is nobody's to attach a browser
/// through.
async fn only_heartbeats_keep_a_runner_live(backend: Backend) {
    const LEASE: Duration = Duration::from_millis(1500);
    let mut options = Options::default();
    options.runtime.devices = mira::devices::DeviceSettings { lease: LEASE, ..Default::default() };
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    assert_eq!(device_status(&t, &alice, &a.device).await, "connected");
    let until = Instant::now() + LEASE * 3;
    let q = "terminal/output?session_id=tss_0123456789abcdef0123456789abcdef&offset=0";
    while Instant::now() < until {
        let answer = json!({"nonce": "n", "invocation_id": "", "late": false,
            "outcome": {"status": "canonical", "input": {}}});
        assert_eq!(result_post(&t, &a.session, answer).await.0, StatusCode::NO_CONTENT);
        let (status, body) = runner_post(&t, &a.session, q, b"x".to_vec().into(), false).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(device_status(&t, &alice, &a.device).await, "offline", "results kept the runner live");
    let (status, _) = runner_post(&t, &a.session, "heartbeat", Vec::new().into(), false).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(device_status(&t, &alice, &a.device).await, "connected");

    use mira::tools::browser::device::DeviceBrowsers;
    let hub = t.app().devices.clone();
    assert!(hub.is_owned_by(&alice_id, &a.device).await.unwrap());
    // Revoked as another replica records it when it cannot reach this one: the row only.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    sqlx::query("UPDATE devices SET revoked_at = '2026-01-01T00:00:00.000Z' WHERE id = $1")
        .bind(&a.device)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert!(!hub.is_owned_by(&alice_id, &a.device).await.unwrap(), "a revoked device's browser could be attached");
}

/// A runner that stops reading its stream (its buffers and the connection's queue fill up)
/// cannot hold a freeze at the send of its job: the prepare wait (the job's validity here)
/// covers the send too, so every prepare is answered `request_timeout` in time.
async fn a_runner_that_stops_reading_its_stream_cannot_hold_a_freeze(backend: Backend) {
    const JOB_TTL: Duration = Duration::from_secs(2);
    const JOBS: usize = 200;
    let mut options = Options::default();
    options.runtime.devices = mira::devices::DeviceSettings { job_ttl: JOB_TTL, ..Default::default() };
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    // Never read again.
    let a = hand_runner(&t, &alice, "alice-laptop", 7).await;
    let run = device_run(&t, &alice, &a, "alice-ws").await;
    let hub = t.app().devices.clone();
    // 160 KiB a job: the stream's socket buffers and the connection's queue (64 lines) fill
    // long before the last one.
    let padding = "x".repeat(160 * 1024);
    let started = Instant::now();
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| {
            let (hub, device) = (hub.clone(), a.device.clone());
            let spec = mira::devices::JobSpec {
                phase: mira_core::remote::JobPhase::Prepare,
                invocation_id: String::new(),
                run_id: run.clone(),
                owner_id: alice_id.clone(),
                tool_id: "read_open".into(),
                input: json!({"path": format!("{i}-{padding}")}),
                approval_id: None,
                workspace: "/srv/alice-ws".into(),
            };
            // Spread over a second, so that the store (each job reads the device row first) is
            // not asked 200 times at once; all of them overlap within the jobs' wait all the same.
            let after = Duration::from_millis(5 * i as u64);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let cancel = tokio_util::sync::CancellationToken::new();
                tokio::time::timeout(Duration::from_secs(20), hub.job(&device, spec, &cancel)).await
            })
        })
        .collect();
    let mut held = 0;
    for job in jobs {
        match job.await.unwrap() {
            Err(_) => held += 1,
            Ok(Ok(outcome)) => panic!("a runner that reads nothing answered: {outcome:?}"),
            Ok(Err(e)) => assert_eq!(e.code, mira::error::ErrorCode::RequestTimeout, "{e:?}"),
        }
    }
    assert_eq!(held, 0, "{held} of {JOBS} prepares were held past their wait (at the send)");
    assert!(started.elapsed() < Duration::from_secs(16), "{:?}", started.elapsed());
    drop(a);
}
