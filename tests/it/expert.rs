#![allow(clippy::unwrap_used, clippy::expect_used)]
//! External Expert end to end against a real A2A 1.0 expert each test starts:
//! tests/expert/expert_server.py, built with a2a-sdk 1.3.0 and served by uvicorn (installed by
//! scripts/setup-expert.sh: `MIRA_EXPERT_PYTHON`; the default is the venv under ./.cache).
//!
//! Checked: a new connection reports the card's name and hash and is not usable until the user
//! pins that hash; a consultation waits for an exact approval showing the disclosed text, sends
//! exactly it once (SSE, `A2A-Version: 1.0`, the bearer credential) and records the streamed
//! answer complete as advisory third-party evidence; `input_required` comes back as such and a
//! follow-up with `task_id` continues the task (over `SendMessage`, a non-streaming card);
//! `auth_required` likewise; a JSON-RPC error (an unknown task) is `expert_error`; a
//! stream cut mid-answer is `expert_incomplete` with the partial text kept, never completed; an
//! expert failure is `expert_error`; a changed card refuses the frozen call with `card_changed`
//! (nothing sent) and turns the tool unavailable until the new hash is pinned; a connection
//! changed between freeze and grant is `connection_changed` with nothing sent; a non-admin
//! cannot point a connection at 127.0.0.1 when internal URLs are not allowed; a card whose
//! JSON-RPC interface is on another origin is refused for a user's own connection, accepted for
//! a shared one; a hostile loopback expert (an endless SSE line, an endless answer) ends each
//! call within seconds as `expert_incomplete` naming the limit.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Backend, Options, TestApp, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

both_backends!(
    connect_pin_consult_and_record_the_answer,
    input_required_comes_back_and_a_follow_up_continues,
    cut_stream_is_incomplete_and_failure_is_expert_error,
    changed_card_is_card_changed_until_re_approved,
    changed_connection_after_freeze_is_connection_changed,
    non_admin_cannot_point_at_an_internal_address,
    cross_origin_interface_is_refused_unless_shared,
    hostile_streams_end_at_their_limits,
);

const TOKEN: &str = "expert-s3cret";

fn python() -> PathBuf {
    let p = std::env::var("MIRA_EXPERT_PYTHON").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/expert/venv/bin/python"),
        PathBuf::from,
    );
    assert!(p.exists(), "{} not found: run `eval \"$(scripts/setup-expert.sh)\"` first", p.display());
    p
}

fn free_port() -> u16 {
    loop {
        let port = 20000 + u16::try_from(uuid::Uuid::now_v7().as_u128() % 12000).unwrap();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// One scripted expert process, killed on drop.
struct Expert {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Expert {
    async fn start(extra: &[&str]) -> Expert {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/expert/expert_server.py");
        let child = Command::new(python())
            .arg(script)
            .args(["--port", &port.to_string(), "--token", TOKEN, "--chunk-delay", "0.25"])
            .arg("--state-dir")
            .arg(dir.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the expert starts");
        let e = Expert { child, port, dir };
        // 30 s at most for the process to start.
        for _ in 0..600 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the expert did not listen on {port}");
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The card as served now, and its RFC 8785 SHA-256 computed here.
    async fn card(&self) -> (Value, String) {
        let card: Value = reqwest::Client::new()
            .get(format!("{}/.well-known/agent-card.json", self.base()))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let hash = sha256_hex(serde_jcs::to_string(&card).unwrap().as_bytes());
        (card, hash)
    }

    /// Every JSON-RPC request the expert received.
    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn change_card(&self, text: &str) {
        std::fs::write(self.dir.path().join("card_variant"), text).unwrap();
    }
}

impl Drop for Expert {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fx {
    t: TestApp,
    token: String,
}

async fn fx_with(backend: Backend, options: Options) -> Fx {
    let t = spawn_with(backend, options).await;
    let token = t.user("alice").await;
    Fx { t, token }
}

async fn fx(backend: Backend) -> Fx {
    fx_with(backend, Options::default()).await
}

impl Fx {
    async fn connect(&self, e: &Expert, pin: Option<&str>) -> Value {
        let mut settings = json!({"card_url": e.base()});
        if let Some(p) = pin {
            settings["card_sha256"] = json!(p);
        }
        let r = self
            .t
            .post(
                "/v1/connections",
                &self.token,
                json!({"kind": "expert", "name": "rust expert", "settings": settings,
                       "credential": {"bearer_token": TOKEN}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body
    }

    async fn patch(&self, id: &str, patch: Value) -> Value {
        let r = self
            .t
            .request(reqwest::Method::PATCH, &format!("/v1/connections/{id}"), Some(&self.token), Some(patch))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body
    }

    async fn tool(&self) -> Value {
        let r = self.t.get("/v1/tools/expert_consult", &self.token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body
    }

    async fn wait_reason(&self, code: Option<&str>) -> Value {
        let mut last = Value::Null;
        for _ in 0..100 {
            last = self.tool().await;
            if last["reason"]["code"].as_str() == code {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("expert_consult never reached reason {code:?}: {last}");
    }

    /// A connection pinned to the expert's current card, usable.
    async fn pinned(&self, e: &Expert) -> String {
        let (_, hash) = e.card().await;
        let view = self.connect(e, Some(&hash)).await;
        assert_eq!(view["permissions"]["expert.consult"]["access"]["state"], "granted", "{view}");
        self.wait_reason(None).await;
        view["id"].as_str().unwrap().to_owned()
    }

    async fn turn(&self) -> (String, String) {
        let run = self.t.run(&self.token).await;
        let (turn, exposure) =
            self.t.turn(&self.token, &run, "consult the external expert: ask the expert a question").await;
        assert!(exposure.to_string().contains("\"expert_consult\""), "expert_consult not exposed: {exposure}");
        (run, turn)
    }

    /// Freezes a consultation; asserts it waits for approval.
    async fn freeze(&self, run: &str, turn: &str, call: &str, input: Value) -> Value {
        let r = self.t.call(&self.token, run, turn, "expert_consult", call, input).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        r.body
    }

    async fn grant(&self, inv: &Value) {
        let r = self
            .t
            .post(
                &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
                &self.token,
                json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }

    async fn consult(&self, run: &str, turn: &str, call: &str, input: Value) -> Value {
        let inv = self.freeze(run, turn, call, input).await;
        self.grant(&inv).await;
        self.t.wait_final(&self.token, inv["invocation_id"].as_str().unwrap()).await
    }

    async fn evidence(&self, done: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        for id in done["evidence_ids"].as_array().cloned().unwrap_or_default() {
            let r = self.t.get(&format!("/v1/evidence/{}", id.as_str().unwrap()), &self.token).await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            out.push(r.body);
        }
        out
    }
}

async fn connect_pin_consult_and_record_the_answer(backend: Backend) {
    let e = Expert::start(&[]).await;
    let f = fx(backend).await;
    // Not pinned: the check shows the card's name and hash; the tool is not usable yet.
    let (_, hash) = e.card().await;
    let view = f.connect(&e, None).await;
    let id = view["id"].as_str().unwrap().to_owned();
    assert_eq!(view["settings"]["card_url"], format!("{}/.well-known/agent-card.json", e.base()), "{view}");
    let account = view["account"].as_str().unwrap_or_default();
    assert!(account.contains("Rust Review Expert") && account.contains(&hash), "{view}");
    assert_eq!(view["permissions"]["expert.consult"]["access"]["state"], "unknown", "{view}");
    assert!(!view.to_string().contains(TOKEN), "the credential is never returned: {view}");
    f.wait_reason(Some("permission_unknown")).await;
    // The user approves the card by pinning its hash.
    let view = f.patch(&id, json!({"settings": {"card_url": e.base(), "card_sha256": hash}})).await;
    assert_eq!(view["permissions"]["expert.consult"]["access"]["state"], "granted", "{view}");
    f.wait_reason(None).await;

    let (run, turn) = f.turn().await;
    let message = "[slow] How should a library crate structure its error types?";
    let inv = f.freeze(&run, &turn, "c1", json!({"message": message})).await;
    assert_eq!(inv["input"]["request"]["message"], message, "{inv}");
    assert_eq!(inv["input"]["card_sha256"], hash.as_str(), "{inv}");
    assert_eq!(inv["input"]["connection_id"], id.as_str(), "{inv}");
    assert!(inv["input"]["connection_fingerprint"].is_string(), "{inv}");
    let approval = f.t.get(&format!("/v1/approvals/{}", inv["approval_id"].as_str().unwrap()), &f.token).await;
    let preview = &approval.body["preview"]["tool"];
    assert_eq!(preview["message"], message, "the approval shows the exact disclosure: {approval:?}");
    assert!(preview["expert"].as_str().unwrap_or_default().contains("Rust Review Expert"), "{approval:?}");
    assert!(e.received().is_empty(), "nothing is sent before the grant");
    // A retried freeze of the same call is the same invocation (same hash, same message id).
    let again = f.t.call(&f.token, &run, &turn, "expert_consult", "c1", json!({"message": message})).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["invocation_id"], inv["invocation_id"], "{again:?}");
    assert_eq!(again.body["input_hash"], inv["input_hash"], "{again:?}");
    let changed = f.t.call(&f.token, &run, &turn, "expert_consult", "c1", json!({"message": "another text"})).await;
    assert_eq!(changed.status, StatusCode::CONFLICT, "the same call with another disclosure: {changed:?}");

    f.grant(&inv).await;
    let done = f.t.wait_final(&f.token, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    let expected =
        format!("Expert answer to: {message}\nslow part 1. slow part 2. slow part 3. slow part 4. slow part 5. ");
    assert_eq!(out["answer"], expected.as_str(), "the streamed answer is complete: {out}");
    assert_eq!(out["state"], "completed");
    assert_eq!(out["streamed"], true);
    assert_eq!((out["trust"].as_str(), out["advisory"].as_bool()), (Some("third_party"), Some(true)), "{out}");
    assert!(out["events"].as_u64().unwrap() >= 8, "streamed in several events: {out}");
    let ev = f.evidence(&done).await;
    let answer = ev.iter().find(|e| e["kind"] == "expert_answer").expect("answer evidence");
    assert_eq!(answer["content_sha256"], sha256_hex(expected.as_bytes()), "{answer}");
    assert_eq!(answer["provenance"]["trust"], "third_party", "{answer}");
    assert_eq!(answer["provenance"]["advisory"], true, "{answer}");
    assert_eq!(answer["provenance"]["complete"], true, "{answer}");
    assert_eq!(answer["provenance"]["card_sha256"], hash.as_str(), "{answer}");
    // Sent once, exactly as approved, over SSE with the protocol version and the credential.
    let got = e.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["method"], "SendStreamingMessage");
    assert_eq!(got[0]["text"], message);
    assert_eq!(got[0]["a2a_version"], "1.0");
    assert_eq!(got[0]["authorization"], format!("Bearer {TOKEN}"));
    assert_eq!(got[0]["messageId"], inv["input"]["message_id"]);
}

async fn input_required_comes_back_and_a_follow_up_continues(backend: Backend) {
    // A card without streaming: SendMessage.
    let e = Expert::start(&["--no-streaming"]).await;
    let f = fx(backend).await;
    f.pinned(&e).await;
    let (run, turn) = f.turn().await;
    let first = f.consult(&run, &turn, "q1", json!({"message": "[input] review my crate's error handling"})).await;
    assert_eq!(first["status"], "completed", "{first}");
    let out = &first["result"]["output"];
    assert_eq!(out["state"], "input_required", "an interrupted task, not an answer: {out}");
    assert_eq!(out["question"], "Which Rust edition does the crate target?", "{out}");
    assert!(out["answer"].is_null(), "{out}");
    assert_eq!(out["complete"], false);
    assert_eq!(out["streamed"], false);
    let ev = f.evidence(&first).await;
    assert!(ev.iter().any(|e| e["kind"] == "expert_question" && e["provenance"]["trust"] == "third_party"), "{ev:?}");
    let (task_id, context_id) = (out["task_id"].as_str().unwrap(), out["context_id"].as_str().unwrap());

    let follow = json!({"message": "2024", "task_id": task_id, "context_id": context_id});
    let second = f.consult(&run, &turn, "q2", follow).await;
    assert_eq!(second["status"], "completed", "{second}");
    let out2 = &second["result"]["output"];
    assert_eq!(out2["state"], "completed", "{out2}");
    assert_eq!(out2["task_id"], task_id, "the same task continued: {out2}");
    assert!(out2["answer"].as_str().unwrap().contains("With that edition (2024)"), "{out2}");
    // auth_required comes back as such too.
    let auth = f.consult(&run, &turn, "q3", json!({"message": "[auth] look it up in the archive"})).await;
    assert_eq!(auth["status"], "completed", "{auth}");
    assert_eq!(auth["result"]["output"]["state"], "auth_required", "{auth}");
    assert_eq!(auth["result"]["output"]["question"], "Sign in to the partner archive first.", "{auth}");
    // A task the expert does not know: its JSON-RPC error is expert_error.
    let unknown = f.consult(&run, &turn, "q4", json!({"message": "2021", "task_id": "no-such-task"})).await;
    assert_eq!(unknown["status"], "failed", "{unknown}");
    assert_eq!(unknown["result"]["error"]["code"], "expert_error", "{unknown}");
    assert!(unknown["result"]["error"]["details"]["rpc_code"].is_i64(), "{unknown}");
    let got = e.received();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0]["method"], "SendMessage");
    assert_eq!(got[1]["taskId"], task_id);
    assert_eq!(got[1]["contextId"], context_id);
}

async fn cut_stream_is_incomplete_and_failure_is_expert_error(backend: Backend) {
    let e = Expert::start(&[]).await;
    let f = fx(backend).await;
    f.pinned(&e).await;
    let (run, turn) = f.turn().await;
    let cut = f.consult(&run, &turn, "cut", json!({"message": "[cut] explain lifetimes"})).await;
    assert_eq!(cut["status"], "failed", "a cut stream is never completed: {cut}");
    let err = &cut["result"]["error"];
    assert_eq!(err["code"], "expert_incomplete", "{cut}");
    assert_eq!(err["details"]["reason"], "stream_closed", "{cut}");
    let partial = &err["details"]["partial"];
    assert_eq!(partial["complete"], false, "{partial}");
    assert_eq!(partial["trust"], "third_party", "{partial}");
    let text = partial["text"].as_str().unwrap();
    assert!(text.contains("cut part 1. cut part 2. "), "the partial text is kept: {partial}");
    assert!(!text.contains("__CUT_THE_STREAM_HERE__"), "{partial}");
    assert!(cut["result"]["output"].is_null(), "{cut}");
    // The partial text is in the recorded evidence, marked incomplete.
    let ev = f.evidence(&cut).await;
    let e0 = ev.iter().find(|e| e["kind"] == "tool_error").expect("error evidence");
    assert_eq!(e0["provenance"]["code"], "expert_incomplete", "{e0}");
    assert_eq!(e0["provenance"]["details"]["partial"]["complete"], false, "{e0}");

    let failed = f.consult(&run, &turn, "fail", json!({"message": "[fail] anything"})).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["result"]["error"]["code"], "expert_error", "{failed}");
    assert_eq!(failed["result"]["error"]["details"]["state"], "failed", "{failed}");
    assert!(failed["result"]["error"]["message"].as_str().unwrap().contains("cannot answer"), "{failed}");
    // The connection stays usable: these are the expert's answers, not the connection's state.
    f.wait_reason(None).await;
}

async fn changed_card_is_card_changed_until_re_approved(backend: Backend) {
    let e = Expert::start(&[]).await;
    let f = fx(backend).await;
    let id = f.pinned(&e).await;
    let (run, turn) = f.turn().await;
    let inv = f.freeze(&run, &turn, "before", json!({"message": "frozen before the card changed"})).await;
    e.change_card("Now also forwards every question to a partner.");
    let (_, new_hash) = e.card().await;
    assert_ne!(new_hash, inv["input"]["card_sha256"].as_str().unwrap());
    // The frozen call sees the new card at run time: 409 card_changed, nothing sent.
    f.grant(&inv).await;
    let done = f.t.wait_final(&f.token, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "card_changed", "{done}");
    assert_eq!(done["result"]["error"]["details"]["seen"], new_hash.as_str(), "{done}");
    assert!(e.received().is_empty(), "nothing was sent: {:?}", e.received());
    // The ladder says so at once, and a check agrees.
    f.wait_reason(Some("card_changed")).await;
    let checked = f.t.post(&format!("/v1/connections/{id}/check"), &f.token, json!({})).await;
    assert_eq!(checked.body["permissions"]["expert.consult"]["access"]["state"], "card_changed", "{checked:?}");
    assert!(checked.body["last_error"].as_str().unwrap().contains(&new_hash), "{checked:?}");
    // Re-approved by pinning the new hash.
    let view = f.patch(&id, json!({"settings": {"card_url": e.base(), "card_sha256": new_hash}})).await;
    assert_eq!(view["permissions"]["expert.consult"]["access"]["state"], "granted", "{view}");
    f.wait_reason(None).await;
    let after = f.consult(&run, &turn, "after", json!({"message": "asked after re-approval"})).await;
    assert_eq!(after["status"], "completed", "{after}");
    assert_eq!(e.received().len(), 1);
}

async fn changed_connection_after_freeze_is_connection_changed(backend: Backend) {
    let e = Expert::start(&[]).await;
    let f = fx(backend).await;
    let id = f.pinned(&e).await;
    let (run, turn) = f.turn().await;
    // Control: unchanged between freeze and grant, it is sent.
    let ok = f.consult(&run, &turn, "unchanged", json!({"message": "control question"})).await;
    assert_eq!(ok["status"], "completed", "{ok}");
    let inv = f.freeze(&run, &turn, "changed", json!({"message": "frozen, then the connection changes"})).await;
    // The same token sealed anew: another credential as far as the approval is concerned.
    f.patch(&id, json!({"credential": {"bearer_token": TOKEN}})).await;
    f.wait_reason(None).await;
    f.grant(&inv).await;
    let done = f.t.wait_final(&f.token, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "connection_changed", "{done}");
    let got = e.received();
    assert_eq!(got.len(), 1, "only the unchanged call was sent: {got:?}");
    assert_eq!(got[0]["text"], "control question");
}

async fn non_admin_cannot_point_at_an_internal_address(backend: Backend) {
    let e = Expert::start(&[]).await;
    let mut options = Options::default();
    options.runtime.allow_internal_urls = false;
    let f = fx_with(backend, options).await;
    let body = json!({"kind": "expert", "name": "internal", "settings": {"card_url": e.base()}, "credential": {}});
    let r = f.t.post("/v1/connections", &f.token, body.clone()).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{r:?}");
    let list = f.t.get("/v1/connections", &f.token).await;
    assert!(!list.body.to_string().contains("\"internal\""), "nothing stored: {list:?}");
    // An admin may (control: the refusal is the rule, not a broken URL).
    let admin = f.t.post("/v1/connections", &f.t.admin_token, body).await;
    assert_eq!(admin.status, StatusCode::CREATED, "{admin:?}");
    assert!(e.received().is_empty());
}

async fn cross_origin_interface_is_refused_unless_shared(backend: Backend) {
    let elsewhere = format!("http://127.0.0.1:{}/", free_port());
    let e = Expert::start(&["--service-url", &elsewhere]).await;
    let f = fx(backend).await;
    let (_, hash) = e.card().await;
    let view = f.connect(&e, Some(&hash)).await;
    let access = &view["permissions"]["expert.consult"]["access"];
    assert_eq!(access["state"], "unknown", "{view}");
    assert!(access["message"].as_str().unwrap().contains("not on the card's origin"), "{view}");
    f.wait_reason(Some("permission_unknown")).await;
    // An admin's shared connection may point elsewhere.
    let shared =
        f.t.post(
            "/v1/connections",
            &f.t.admin_token,
            json!({"kind": "expert", "name": "shared expert", "shared": true,
                   "settings": {"card_url": e.base(), "card_sha256": hash}, "credential": {"bearer_token": TOKEN}}),
        )
        .await;
    assert_eq!(shared.status, StatusCode::CREATED, "{shared:?}");
    assert_eq!(shared.body["permissions"]["expert.consult"]["access"]["state"], "granted", "{shared:?}");
}

/// A loopback "expert" serving a valid card and, for every JSON-RPC request, `stream`'s bytes
/// as an SSE answer (never a final state). Returns its base URL and the card's hash.
async fn hostile_expert(endless_line: bool) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let card = json!({
        "name": "Hostile Expert", "description": "never finishes", "version": "1",
        "supportedInterfaces": [{"url": format!("{base}/"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": true},
    });
    let hash = sha256_hex(serde_jcs::to_string(&card).unwrap().as_bytes());
    let card_text = card.to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let card_text = card_text.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if head.starts_with(b"GET") {
                    let r = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{card_text}",
                        card_text.len()
                    );
                    let _ = s.write_all(r.as_bytes()).await;
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                    .await;
                if endless_line {
                    let _ = s.write_all(b"data: {\"jsonrpc\": \"2.0\", \"id\": \"1\", \"result\": {\"artifactUpdate\": {\"artifact\": {\"artifactId\": \"a\", \"parts\": [{\"text\": \"").await;
                    let chunk = vec![b'a'; 64 * 1024];
                    while s.write_all(&chunk).await.is_ok() {}
                } else {
                    let event = format!(
                        "data: {}\n\n",
                        json!({"jsonrpc": "2.0", "id": "1", "result": {"artifactUpdate": {"taskId": "t", "append": true,
                               "artifact": {"artifactId": "a", "parts": [{"text": "x".repeat(8 * 1024)}]}}}})
                    );
                    while s.write_all(event.as_bytes()).await.is_ok() {}
                }
            });
        }
    });
    (base, hash)
}

async fn hostile_streams_end_at_their_limits(backend: Backend) {
    let f = fx(backend).await;
    for (endless_line, reason) in [(true, "line_too_long"), (false, "answer_too_large")] {
        let (base, hash) = hostile_expert(endless_line).await;
        let r =
            f.t.post(
                "/v1/connections",
                &f.token,
                json!({"kind": "expert", "name": format!("hostile {reason}"),
                       "settings": {"card_url": base, "card_sha256": hash}, "credential": {}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        assert_eq!(r.body["permissions"]["expert.consult"]["access"]["state"], "granted", "{r:?}");
        let id = r.body["id"].as_str().unwrap().to_owned();
        f.wait_reason(None).await;
        let (run, turn) = f.turn().await;
        let started = std::time::Instant::now();
        let done = f.consult(&run, &turn, reason, json!({"message": "anything", "connection": id})).await;
        assert_eq!(done["status"], "failed", "{reason}: {done}");
        let err = &done["result"]["error"];
        assert_eq!(err["code"], "expert_incomplete", "{reason}: {done}");
        assert_eq!(err["details"]["reason"], reason, "{done}");
        assert_eq!(err["details"]["partial"]["complete"], false, "{done}");
        // The code and reason say which limit; a consultation's time limit (2 min) would be later.
        let took = started.elapsed();
        assert!(took < mira::tools::expert::a2a::MAX_TIME, "{reason}: ended at the limit, not a timeout: {took:?}");
        // Delete it: the next case's connection is then the caller's only one.
        let d = f.t.request(reqwest::Method::DELETE, &format!("/v1/connections/{id}"), Some(&f.token), None).await;
        assert_eq!(d.status, StatusCode::NO_CONTENT, "{d:?}");
    }
}
