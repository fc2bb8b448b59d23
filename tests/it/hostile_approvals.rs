#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile approvals, over HTTP on SQLite and on Postgres.
//!
//! Four-eyes: a deployment that requires a second person for a tool domain refuses the
//! requester's own grant (403 `four_eyes_required`, nothing changes), runs a grant by an
//! approver or an admin, keeps the approval 404 for every other user, fixes the rule when the
//! call is frozen, lists others' four-eyes approvals in an approver's inbox (list and live
//! stream) and in no one else's, and the harness refuses a self-grant written straight into
//! the store.
//!
//! Cancel racing a grant (issue 14.2): a status never contradicts a side effect. A race suite
//! of 200 trials checks `write_file`'s status against the file system every time, and each
//! branch of a cancel (before the claim, before the commit point, after it, a tool that acts
//! from its start, a reading tool, the time limit, another replica) has a deterministic test.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Backend, Options, Resp, TestApp, TestTool, spawn_with};
use mira::harness::{CommitGate, GateState, StopReason};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("{key} missing in {v}")).to_owned()
}

/// A person with a token, their user id and token id, and a run with a turn.
struct Person {
    token: String,
    id: String,
    token_id: String,
    run: String,
    turn: String,
}

/// A server whose `edit` calls need four-eyes approval, with Alice (requester), Bob
/// (approver), Carol (an ordinary third user) and the admin.
struct Fx {
    t: TestApp,
    alice: Person,
    bob: Person,
    carol: Person,
    admin: Person,
}

async fn person(t: &TestApp, token: String) -> Person {
    let ident = t.app().store.identity_by_token(&mira::auth::hash_token(&token)).await.unwrap().unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "edit the files").await;
    Person { token, id: ident.user_id, token_id: ident.token_id, run, turn }
}

async fn create_user(t: &TestApp, name: &str, approver: bool) -> Resp {
    let r = t.post("/v1/users", &t.admin_token, json!({"name": name, "approver": approver})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    r
}

async fn fx_with(backend: Backend, four_eyes: &[&str]) -> Fx {
    let mut options = Options::default();
    options.runtime.four_eyes_domains = four_eyes.iter().map(|d| (*d).to_owned()).collect();
    fx_options(backend, options).await
}

async fn fx_options(backend: Backend, options: Options) -> Fx {
    let t = spawn_with(backend, options).await;
    let alice = create_user(&t, "alice", false).await.body["token"].as_str().unwrap().to_owned();
    let bob = create_user(&t, "bob", true).await;
    assert_eq!(bob.body["user"]["is_approver"], true, "{bob:?}");
    let bob = bob.body["token"].as_str().unwrap().to_owned();
    let carol = create_user(&t, "carol", false).await.body["token"].as_str().unwrap().to_owned();
    let admin = t.admin_token.clone();
    let (alice, bob, carol, admin) =
        (person(&t, alice).await, person(&t, bob).await, person(&t, carol).await, person(&t, admin).await);
    Fx { t, alice, bob, carol, admin }
}

impl Fx {
    fn ws(&self) -> &Path {
        &self.t.workspace
    }

    /// Freezes a call of `who` that must wait for approval.
    async fn frozen(&self, who: &Person, tool: &str, call: &str, input: Value) -> Value {
        let r = self.t.call(&who.token, &who.run, &who.turn, tool, call, input).await;
        assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{r:?}");
        r.body
    }

    async fn grant(&self, who: &Person, inv: &Value) -> Resp {
        let body =
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]});
        self.t.post(&format!("/v1/approvals/{}/grant", s(inv, "approval_id")), &who.token, body).await
    }

    async fn deny(&self, who: &Person, inv: &Value) -> Resp {
        self.t.post(&format!("/v1/approvals/{}/deny", s(inv, "approval_id")), &who.token, json!({"reason": "no"})).await
    }

    async fn approval(&self, who: &Person, inv: &Value) -> Resp {
        self.t.get(&format!("/v1/approvals/{}", s(inv, "approval_id")), &who.token).await
    }

    async fn pending_ids(&self, who: &Person) -> Vec<String> {
        let r = self.t.get("/v1/approvals?status=pending", &who.token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body["approvals"].as_array().unwrap().iter().map(|a| s(a, "id")).collect()
    }

    /// The run's stored events as (type, data).
    async fn events(&self, run: &str) -> Vec<(String, Value)> {
        let rows = self.t.app().store.events_after(run, 0, 100_000).await.unwrap();
        rows.into_iter().map(|e| (e.kind, serde_json::from_str(&e.data).unwrap())).collect()
    }
}

fn write(path: &str) -> Value {
    json!({"path": path, "content": format!("{path} written\n")})
}

// Four-eyes ---------------------------------------------------------------------------------

async fn four_eyes_grant_needs_a_second_person(backend: Backend) {
    let f = fx_with(backend, &["edit"]).await;
    let (alice, bob, carol, admin) = (&f.alice, &f.bob, &f.carol, &f.admin);
    // Roles as the users see them.
    for (who, approver) in [(alice, false), (bob, true), (carol, false)] {
        let me = f.t.get("/v1/me", &who.token).await;
        assert_eq!((me.body["is_approver"].as_bool(), me.body["is_admin"].as_bool()), (Some(approver), Some(false)));
    }

    // Alice's edit waits for a second person; the approval record carries the rule.
    let inv = f.frozen(alice, "write_file", "fe-1", write("fe1.txt")).await;
    let view = f.approval(alice, &inv).await;
    assert_eq!(view.status, StatusCode::OK, "{view:?}");
    let v = &view.body;
    assert_eq!((v["rule"].as_str(), v["rule_domain"].as_str()), (Some("four_eyes"), Some("edit")), "{v}");
    assert_eq!((v["awaits_second_person"].as_bool(), v["may_grant"].as_bool()), (Some(true), Some(false)), "{v}");
    assert_eq!(v["requested_by"], json!({"user_id": alice.id, "name": "alice"}));
    assert!(
        v["preview"]["reasons"].as_array().unwrap().iter().any(|r| r.as_str().unwrap().contains("four-eyes")),
        "{v}"
    );

    // The requester's grant: 403 with a stable code, nothing changes.
    let r = f.grant(alice, &inv).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "four_eyes_required"), "{r:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = f.approval(alice, &inv).await.body;
    assert_eq!(
        (after["status"].as_str(), after["invocation"]["status"].as_str()),
        (Some("pending"), Some("awaiting_approval"))
    );
    assert_eq!(after["decided_by"], Value::Null);
    assert!(!f.ws().join("fe1.txt").exists());
    assert!(!f.events(&alice.run).await.iter().any(|(k, _)| k == "approval.granted"));

    // An ordinary third user: 404 for everything, and an empty inbox.
    assert_eq!(f.approval(carol, &inv).await.status, StatusCode::NOT_FOUND);
    let r = f.grant(carol, &inv).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{r:?}");
    assert_eq!(f.deny(carol, &inv).await.status, StatusCode::NOT_FOUND);
    assert!(f.pending_ids(carol).await.is_empty());
    assert_eq!(
        f.t.get(&format!("/v1/invocations/{}", s(&inv, "invocation_id")), &carol.token).await.status,
        StatusCode::NOT_FOUND
    );

    // The approver sees it in the inbox, with the requester named, and may grant it; the run
    // and the invocation themselves stay Alice's (404 to him).
    let listed = f.t.get("/v1/approvals?status=pending", &bob.token).await;
    let shown = listed.body["approvals"].as_array().unwrap().iter().find(|a| a["id"] == inv["approval_id"]).cloned();
    let shown = shown.unwrap_or_else(|| panic!("Bob's inbox lacks Alice's four-eyes approval: {listed:?}"));
    assert_eq!((shown["requested_by"]["name"].as_str(), shown["may_grant"].as_bool()), (Some("alice"), Some(true)));
    assert_eq!(
        f.t.get(&format!("/v1/invocations/{}", s(&inv, "invocation_id")), &bob.token).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(f.t.get(&format!("/v1/runs/{}", alice.run), &bob.token).await.status, StatusCode::NOT_FOUND);
    let g = f.grant(bob, &inv).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    assert_eq!(
        (g.body["decided_by"].as_str(), g.body["decided_token_id"].as_str()),
        (Some(bob.id.as_str()), Some(bob.token_id.as_str()))
    );
    let done = f.t.wait_final(&alice.token, &s(&inv, "invocation_id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(f.ws().join("fe1.txt")).unwrap(), "fe1.txt written\n");
    let events = f.events(&alice.run).await;
    let (_, granted) =
        events.iter().find(|(k, d)| k == "approval.granted" && d["approval_id"] == inv["approval_id"]).unwrap();
    assert_eq!(
        (
            granted["decided_by"].as_str(),
            granted["token_id"].as_str(),
            granted["requested_by"].as_str(),
            granted["rule"].as_str()
        ),
        (Some(bob.id.as_str()), Some(bob.token_id.as_str()), Some(alice.id.as_str()), Some("four_eyes"))
    );

    // An admin is a second person too.
    let inv = f.frozen(alice, "write_file", "fe-2", write("fe2.txt")).await;
    assert!(f.pending_ids(admin).await.contains(&s(&inv, "approval_id")));
    assert_eq!(f.grant(admin, &inv).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&alice.token, &s(&inv, "invocation_id")).await["status"], "completed");
    assert!(f.ws().join("fe2.txt").exists());

    // The approver's own four-eyes call needs another person as well: not himself, not a
    // plain user; the admin grants it.
    let own = f.frozen(bob, "write_file", "fe-bob", write("fe-bob.txt")).await;
    assert_eq!(f.grant(bob, &own).await.code(), "four_eyes_required");
    assert_eq!(f.grant(alice, &own).await.status, StatusCode::NOT_FOUND);
    assert_eq!(f.grant(carol, &own).await.status, StatusCode::NOT_FOUND);
    assert!(!f.pending_ids(alice).await.contains(&s(&own, "approval_id")));
    assert_eq!(f.grant(admin, &own).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&bob.token, &s(&own, "invocation_id")).await["status"], "completed");

    // Deny: the requester may withdraw; an approver may refuse; nothing runs either way.
    let withdrawn = f.frozen(alice, "write_file", "fe-3", write("fe3.txt")).await;
    let d = f.deny(alice, &withdrawn).await;
    assert_eq!(
        (d.status, d.body["status"].as_str(), d.body["decided_by"].as_str()),
        (StatusCode::OK, Some("denied"), Some(alice.id.as_str()))
    );
    let refused = f.frozen(alice, "write_file", "fe-4", write("fe4.txt")).await;
    let d = f.deny(bob, &refused).await;
    assert_eq!((d.status, d.body["decided_by"].as_str()), (StatusCode::OK, Some(bob.id.as_str())), "{d:?}");
    assert_eq!(f.grant(bob, &withdrawn).await.code(), "approval_decided");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!f.ws().join("fe3.txt").exists() && !f.ws().join("fe4.txt").exists());

    // Other domains keep self-approval: Alice grants her own, Bob never sees it.
    f.t.app().registry.register(Arc::new(TestTool::new("gated_echo", "echoes after approval", true))).unwrap();
    let (turn, _) = f.t.turn(&alice.token, &alice.run, "echo").await;
    let r = f.t.call(&alice.token, &alice.run, &turn, "gated_echo", "self-1", json!({"value": "x"})).await;
    assert_eq!(f.approval(alice, &r.body).await.body["rule"], "self_approval");
    assert_eq!(f.approval(bob, &r.body).await.status, StatusCode::NOT_FOUND);
    assert_eq!(f.grant(bob, &r.body).await.status, StatusCode::NOT_FOUND);
    assert!(!f.pending_ids(bob).await.contains(&s(&r.body, "approval_id")));
    assert_eq!(f.grant(alice, &r.body).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&alice.token, &s(&r.body, "invocation_id")).await["status"], "completed");
}

/// The rule is stored with the approval when the call is frozen: restarting the server with
/// another `--four-eyes-domains` changes what new calls need, never what a stored approval
/// needs (neither loosened for a pending four-eyes call, nor tightened for a pending
/// self-approval).
async fn four_eyes_rule_is_fixed_when_the_call_is_frozen(backend: Backend) {
    let mut f = fx_with(backend, &["edit"]).await;
    let strict = f.frozen(&f.alice, "write_file", "fx-1", write("fx1.txt")).await;
    f.t.settings.runtime.four_eyes_domains.clear();
    f.t.restart().await;
    // Loosened setting: the stored four-eyes approval still needs a second person.
    assert_eq!(f.approval(&f.alice, &strict).await.body["rule"], "four_eyes");
    assert_eq!(f.grant(&f.alice, &strict).await.code(), "four_eyes_required");
    // New calls are self-approved.
    let loose = f.frozen(&f.alice, "write_file", "fx-2", write("fx2.txt")).await;
    assert_eq!(f.approval(&f.alice, &loose).await.body["rule"], "self_approval");
    f.t.settings.runtime.four_eyes_domains = vec!["*".to_owned()];
    f.t.restart().await;
    // Tightened again (every domain): the stored self-approval stays the requester's decision.
    assert_eq!(f.approval(&f.bob, &loose).await.status, StatusCode::NOT_FOUND);
    assert_eq!(f.grant(&f.alice, &loose).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&f.alice.token, &s(&loose, "invocation_id")).await["status"], "completed");
    assert_eq!(f.grant(&f.bob, &strict).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&f.alice.token, &s(&strict, "invocation_id")).await["status"], "completed");
    assert!(f.ws().join("fx1.txt").exists() && f.ws().join("fx2.txt").exists());
    // `*` covers every domain for new calls.
    let any = f.frozen(&f.alice, "write_file", "fx-3", write("fx3.txt")).await;
    assert_eq!(f.approval(&f.alice, &any).await.body["rule_domain"], "edit");
    assert_eq!(f.grant(&f.alice, &any).await.code(), "four_eyes_required");
}

/// A self-grant written straight into the store (as a bug or a tampered row would leave it)
/// is never claimed and, forced past the claim, refused by the harness's gate.
async fn gate_refuses_a_self_granted_four_eyes_call(backend: Backend) {
    let f = fx_with(backend, &["edit"]).await;
    let app = f.t.app();
    let inv = f.frozen(&f.alice, "write_file", "forced", write("forced.txt")).await;
    let id = s(&inv, "invocation_id");
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&f.t.db.url).await.unwrap();
    let entry = app.registry.get_any("write_file").unwrap();
    for (decider, who) in [(&f.alice, "the requester"), (&f.carol, "a user who is not an approver")] {
        sqlx::query(
            "UPDATE approvals SET status = 'granted', decided_by = $2, decided_token_id = $3, decided_at = '2030-01-01T00:00:00.000Z'
             WHERE invocation_id = $1",
        )
        .bind(&id)
        .bind(&decider.id)
        .bind(&decider.token_id)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("UPDATE invocations SET status = 'queued' WHERE id = $1").bind(&id).execute(&pool).await.unwrap();
        app.harness.wake();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let now = f.t.get(&format!("/v1/invocations/{id}"), &f.alice.token).await;
        assert_eq!(now.body["status"], "queued", "claimed with a grant by {who}");
        let row = app.store.invocation_by_id(&id).await.unwrap().unwrap();
        let err = app.harness.gate(&row, &entry, None).await.err();
        assert_eq!(err.map(|e| e.code.as_str()), Some("four_eyes_required"), "granted by {who}");
    }
    // Forced past the claim too (approval_required cleared): the gate refuses at execution.
    sqlx::query("UPDATE approvals SET decided_by = $2 WHERE invocation_id = $1")
        .bind(&id)
        .bind(&f.alice.id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE invocations SET approval_required = 0 WHERE id = $1").bind(&id).execute(&pool).await.unwrap();
    app.harness.wake();
    let done = f.t.wait_final(&f.alice.token, &id).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("four_eyes_required")),
        "{done}"
    );
    assert!(!f.ws().join("forced.txt").exists());

    // Positive control: the same forcing with the approver as decider opens the gate.
    let ok = f.frozen(&f.alice, "write_file", "forced-ok", write("forced-ok.txt")).await;
    let ok_id = s(&ok, "invocation_id");
    sqlx::query("UPDATE approvals SET status = 'granted', decided_by = $2 WHERE invocation_id = $1")
        .bind(&ok_id)
        .bind(&f.bob.id)
        .execute(&pool)
        .await
        .unwrap();
    let row = app.store.invocation_by_id(&ok_id).await.unwrap().unwrap();
    assert!(app.harness.gate(&row, &entry, None).await.is_ok());
    sqlx::query("UPDATE invocations SET status = 'queued' WHERE id = $1").bind(&ok_id).execute(&pool).await.unwrap();
    app.harness.wake();
    assert_eq!(f.t.wait_final(&f.alice.token, &ok_id).await["status"], "completed");
    assert!(f.ws().join("forced-ok.txt").exists());
    pool.close().await;
}

/// The approval a grant hands to its call's execution (instead of a second read) opens the
/// gate only for that exact call: another call's granted approval makes the gate read the
/// stored one (pending: refused), and a handed-over approval whose triple is not the call's
/// is refused as a stored one would be. The grant's answer is the approval as stored.
async fn gate_checks_a_handed_over_approval_like_a_stored_one(backend: Backend) {
    let f = fx_with(backend, &[]).await;
    let app = f.t.app();
    let entry = app.registry.get_any("write_file").unwrap();
    let a = f.frozen(&f.alice, "write_file", "handed-a", write("handed-a.txt")).await;
    let b = f.frozen(&f.alice, "write_file", "handed-b", write("handed-b.txt")).await;
    let granted = f.grant(&f.alice, &a).await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let done = f.t.wait_final(&f.alice.token, &s(&a, "invocation_id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    // The answer built from the grant equals the stored approval, but for the invocation's
    // status, which has moved on since.
    let mut stored = f.approval(&f.alice, &a).await.body;
    let mut answered = granted.body.clone();
    for v in [&mut stored, &mut answered] {
        v["invocation"].as_object_mut().unwrap().remove("status");
    }
    assert_eq!(answered, stored);
    assert!(matches!(granted.body["invocation"]["status"].as_str(), Some("running" | "queued")), "{granted:?}");

    let a_approval = app.store.approval_of_invocation(&s(&a, "invocation_id")).await.unwrap().unwrap();
    let b_row = app.store.invocation_by_id(&s(&b, "invocation_id")).await.unwrap().unwrap();
    let err = app.harness.gate(&b_row, &entry, Some(&a_approval)).await.err();
    assert_eq!(err.map(|e| e.code.as_str()), Some("approval_required"), "another call's approval opened the gate");
    // B's own approval, handed over as granted but with another input hash: refused.
    let mut forged = app.store.approval_of_invocation(&b_row.id).await.unwrap().unwrap();
    forged.status = mira::state::ApprovalStatus::Granted;
    forged.input_hash = a_approval.input_hash.clone();
    let err = app.harness.gate(&b_row, &entry, Some(&forged)).await.err();
    assert_eq!(err.map(|e| e.code.as_str()), Some("approval_required"), "a handed-over triple went unchecked");
    // Positive control: B's approval as granted, exact.
    forged.input_hash = b_row.input_hash.clone();
    assert!(app.harness.gate(&b_row, &entry, Some(&forged)).await.is_ok());
    assert!(!f.ws().join("handed-b.txt").exists());
}

/// Reads `approvals` snapshots from an inbox stream until `n` arrived or `timeout` passed.
async fn snapshots(resp: &mut reqwest::Response, n: usize, timeout: Duration) -> Vec<Value> {
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
            let mut data = String::new();
            let mut is_snapshot = false;
            for line in block.lines() {
                if line.strip_prefix("event:").is_some_and(|e| e.trim() == "approvals") {
                    is_snapshot = true;
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            if is_snapshot {
                out.push(serde_json::from_str(&data).unwrap());
            }
        }
    }
    out
}

fn ids_of(snapshot: &Value) -> Vec<String> {
    snapshot["approvals"].as_array().unwrap().iter().map(|a| s(a, "id")).collect()
}

async fn approver_inbox_lists_others_four_eyes_approvals(backend: Backend) {
    let f = fx_with(backend, &["edit"]).await;
    f.t.app().registry.register(Arc::new(TestTool::new("gated_echo", "echoes after approval", true))).unwrap();
    let open = |who: &Person| {
        let req = f.t.client.get(format!("{}/v1/approvals/stream", f.t.base)).bearer_auth(&who.token);
        async move { req.send().await.unwrap() }
    };
    let (mut bob, mut carol, mut alice) = (open(&f.bob).await, open(&f.carol).await, open(&f.alice).await);
    for stream in [&mut bob, &mut carol, &mut alice] {
        let first = snapshots(stream, 1, Duration::from_secs(5)).await;
        assert_eq!(first.len(), 1);
        assert!(ids_of(&first[0]).is_empty());
    }
    // Alice: one four-eyes edit and one self-approved call.
    let four = f.frozen(&f.alice, "write_file", "in-1", write("in1.txt")).await;
    let (turn, _) = f.t.turn(&f.alice.token, &f.alice.run, "echo").await;
    let own = f.t.call(&f.alice.token, &f.alice.run, &turn, "gated_echo", "in-2", json!({"value": "x"})).await.body;
    let four_id = s(&four, "approval_id");

    // Bob's stream shows the four-eyes approval (requester named, his to grant), never the other.
    let mut seen = Vec::new();
    for snap in snapshots(&mut bob, 2, Duration::from_secs(5)).await {
        seen = ids_of(&snap);
        if let Some(a) = snap["approvals"].as_array().unwrap().iter().find(|a| a["id"] == four_id.as_str()) {
            assert_eq!(
                (a["requested_by"]["name"].as_str(), a["may_grant"].as_bool()),
                (Some("alice"), Some(true)),
                "{a}"
            );
            assert_eq!(a["invocation"]["input_hash"], four["input_hash"]);
        }
    }
    assert_eq!(seen, vec![four_id.clone()], "Bob's inbox");
    // Carol's stream stays silent; Alice's shows both, the four-eyes one not hers to grant.
    assert!(snapshots(&mut carol, 1, Duration::from_millis(800)).await.is_empty(), "Carol got a snapshot");
    let mut last = Value::Null;
    for snap in snapshots(&mut alice, 2, Duration::from_secs(5)).await {
        last = snap;
    }
    assert_eq!(ids_of(&last), vec![four_id.clone(), s(&own, "approval_id")]);
    assert_eq!(last["approvals"][0]["may_grant"], false);
    assert_eq!(last["approvals"][1]["may_grant"], true);
    // The list says the same; the admin sees the four-eyes one too.
    assert_eq!(f.pending_ids(&f.bob).await, vec![four_id.clone()]);
    assert_eq!(f.pending_ids(&f.carol).await, Vec::<String>::new());
    assert_eq!(f.pending_ids(&f.admin).await, vec![four_id.clone()]);
    let granted = f.t.get("/v1/approvals?status=granted", &f.bob.token).await;
    assert_eq!(granted.body["approvals"], json!([]));

    // Bob grants from what his snapshot showed: it leaves his inbox and Alice's.
    assert_eq!(f.grant(&f.bob, &four).await.status, StatusCode::OK);
    let after = snapshots(&mut bob, 1, Duration::from_secs(5)).await;
    assert_eq!(after.len(), 1);
    assert!(ids_of(&after[0]).is_empty());
    let after = snapshots(&mut alice, 1, Duration::from_secs(5)).await;
    assert_eq!(ids_of(&after[0]), vec![s(&own, "approval_id")]);
    // The decided approval stays visible to its decider in the history.
    let granted = f.t.get("/v1/approvals?status=granted", &f.bob.token).await;
    assert_eq!(granted.body["approvals"][0]["id"], four_id.as_str());
}

/// `mira user create --approver` and `POST /v1/users {"approver": true}` make approvers;
/// `GET /v1/me` says so; only admins create users.
async fn approvers_are_created_by_cli_and_api(backend: Backend) {
    let f = fx_with(backend, &["edit"]).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mira"))
        .args(["user", "create", "--name", "vic", "--approver", "--database-url", &f.t.db.url, "--data-dir"])
        .arg(&f.t.data_dir)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (created["user"]["is_approver"].as_bool(), created["user"]["is_admin"].as_bool()),
        (Some(true), Some(false))
    );
    let token = s(&created, "token");
    let me = f.t.get("/v1/me", &token).await;
    assert_eq!((me.body["name"].as_str(), me.body["is_approver"].as_bool()), (Some("vic"), Some(true)), "{me:?}");
    // Vic decides Alice's four-eyes call.
    let vic = person(&f.t, token).await;
    let inv = f.frozen(&f.alice, "write_file", "vic-1", write("vic.txt")).await;
    assert_eq!(f.grant(&vic, &inv).await.status, StatusCode::OK);
    assert_eq!(f.t.wait_final(&f.alice.token, &s(&inv, "invocation_id")).await["status"], "completed");
    // An approver is not an admin.
    let r = f.t.post("/v1/users", &f.bob.token, json!({"name": "eve", "approver": true})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
}

both_backends!(
    four_eyes_grant_needs_a_second_person,
    four_eyes_rule_is_fixed_when_the_call_is_frozen,
    gate_refuses_a_self_granted_four_eyes_call,
    gate_checks_a_handed_over_approval_like_a_stored_one,
    approver_inbox_lists_others_four_eyes_approvals,
    approvers_are_created_by_cli_and_api,
);

// Cancel racing a grant ---------------------------------------------------------------------

/// Polls an invocation every 5 ms until it reaches a final status (20 s at most).
async fn settled(t: &TestApp, token: &str, id: &str) -> Value {
    for _ in 0..4000 {
        let r = t.get(&format!("/v1/invocations/{id}"), token).await;
        if !matches!(r.body["status"].as_str(), Some("queued" | "running" | "awaiting_approval")) {
            return r.body;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("invocation {id} did not finish");
}

async fn evidence_kinds(t: &TestApp, token: &str, inv: &Value) -> Vec<String> {
    let mut kinds = Vec::new();
    for id in inv["evidence_ids"].as_array().unwrap() {
        let ev = t.get(&format!("/v1/evidence/{}", id.as_str().unwrap()), token).await;
        kinds.push(s(&ev.body, "kind"));
    }
    kinds
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".mira"))
        .collect()
}

/// The race of issue 14.2, 200 times: a grant of `write_file` and a cancel of its invocation
/// sent together (the cancel a little later each time, so that it lands before the claim,
/// while the write runs, around its rename and after it). Every time: `completed` ⇔ the file
/// holds the content; `cancelled` ⇔ no file; each answer agrees with the outcome.
async fn cancel_racing_a_grant_never_contradicts_the_file(backend: Backend) {
    let f = fx_with(backend, &[]).await;
    let a = &f.alice;
    std::fs::create_dir(f.ws().join("race")).unwrap();
    let delays = [0_u64, 100, 300, 600, 1000, 1500, 2500, 4000];
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..200 {
        let path = format!("race/{i}.txt");
        let content = format!("trial {i}\n");
        let inv = f.frozen(a, "write_file", &format!("race-{i}"), json!({"path": path, "content": content})).await;
        let id = s(&inv, "invocation_id");
        let delay = Duration::from_micros(delays[i % delays.len()]);
        let cancel = async {
            tokio::time::sleep(delay).await;
            f.t.post(&format!("/v1/invocations/{id}/cancel"), &a.token, json!({})).await
        };
        let (g, c) = tokio::join!(f.grant(a, &inv), cancel);
        let done = settled(&f.t, &a.token, &id).await;
        let status = done["status"].as_str().unwrap_or("").to_owned();
        let on_disk = std::fs::read_to_string(f.ws().join(&path)).ok();
        let kinds = evidence_kinds(&f.t, &a.token, &done).await;
        let ctx = format!("trial {i}: grant {:?} {}, cancel {:?} {}: {done}", g.status, g.code(), c.status, c.code());
        match status.as_str() {
            "completed" => assert_eq!(on_disk.as_deref(), Some(content.as_str()), "completed but not written; {ctx}"),
            "cancelled" => {
                assert_eq!(on_disk, None, "cancelled but the file was written; {ctx}");
                assert_eq!(done["result"]["error"]["code"].as_str().unwrap_or("cancelled"), "cancelled", "{ctx}");
            }
            _ => panic!("unexpected status; {ctx}"),
        }
        match (g.status, c.status, c.code()) {
            (StatusCode::OK, StatusCode::OK, _) => {
                assert_eq!(status, "cancelled", "both answered 200: the cancel won; {ctx}");
                // Cancelled in the queue (no execution, no evidence) or stopped before the rename.
                assert!(kinds.is_empty() || kinds == ["tool_error"], "{ctx}");
            }
            (StatusCode::CONFLICT, StatusCode::OK, _) => {
                assert_eq!((g.code(), status.as_str()), ("approval_decided", "cancelled"), "{ctx}");
                assert!(done["evidence_ids"].as_array().unwrap().is_empty(), "it never ran; {ctx}");
            }
            (StatusCode::OK, StatusCode::CONFLICT, "already_running") => {
                assert_eq!(status, "completed", "{ctx}");
                assert_eq!(done["result"]["stop"]["outcome"], "too_late", "{ctx}");
                assert_eq!(kinds, ["file_write", "stop_too_late"], "the evidence says the cancel came too late; {ctx}");
            }
            (StatusCode::OK, StatusCode::CONFLICT, "invalid_state") => {
                assert_eq!(status, "completed", "{ctx}");
                assert_eq!(kinds, ["file_write"], "{ctx}");
            }
            (StatusCode::OK, StatusCode::ACCEPTED, _) => {}
            _ => panic!("unexpected answers; {ctx}"),
        }
        let when = match (status.as_str(), kinds.len()) {
            ("cancelled", 0) => " (before it ran)",
            ("cancelled", _) => " (while it ran, before its rename)",
            _ => "",
        };
        let key = format!("grant {} / cancel {} {} → {status}{when}", g.status.as_u16(), c.status.as_u16(), c.code());
        *tally.entry(key).or_default() += 1;
    }
    println!("cancel-vs-grant outcomes over 200 trials ({backend:?}): {tally:#?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leftovers(&f.ws().join("race")), Vec::<String>::new(), "temporary files left behind");
}

/// A tool with a commit point the test controls: it waits for `before` to pass its commit
/// point, then for `after` to make its change (writing a file named by `value`). The commit
/// gate of its latest execution is shown to the test (`gate`).
struct Probe {
    spec: mira::registry::ToolSpec,
    dir: PathBuf,
    before: Arc<tokio::sync::Semaphore>,
    after: Arc<tokio::sync::Semaphore>,
    at: tokio::sync::watch::Sender<&'static str>,
    gate: Arc<std::sync::Mutex<Option<CommitGate>>>,
}

struct ProbeHandle {
    before: Arc<tokio::sync::Semaphore>,
    after: Arc<tokio::sync::Semaphore>,
    at: tokio::sync::watch::Receiver<&'static str>,
    gate: Arc<std::sync::Mutex<Option<CommitGate>>>,
}

impl ProbeHandle {
    async fn reached(&mut self, point: &'static str) {
        tokio::time::timeout(Duration::from_secs(30), self.at.wait_for(|p| *p == point))
            .await
            .unwrap_or_else(|_| panic!("the probe never reached {point}"))
            .unwrap();
    }

    /// Waits (30 s at most) until the commit gate of the probe's latest execution is in a
    /// state `pred` accepts: a stop the harness applied, seen rather than slept for.
    async fn gate_until(&self, what: &str, pred: impl Fn(&GateState) -> bool) {
        let start = std::time::Instant::now();
        loop {
            let state = self.gate.lock().unwrap().as_ref().map(CommitGate::state);
            if state.as_ref().is_some_and(&pred) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{what} never happened: {state:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn probe(id: &str, dir: &Path) -> (Arc<Probe>, ProbeHandle) {
    let mut spec = TestTool::new(id, "writes a file at its commit point, when the test lets it", true).spec;
    spec.domain = "probe".to_owned();
    let (at, rx) = tokio::sync::watch::channel("idle");
    let before = Arc::new(tokio::sync::Semaphore::new(0));
    let after = Arc::new(tokio::sync::Semaphore::new(0));
    let gate = Arc::new(std::sync::Mutex::new(None));
    let handle = ProbeHandle { before: before.clone(), after: after.clone(), at: rx, gate: gate.clone() };
    (Arc::new(Probe { spec, dir: dir.to_path_buf(), before, after, at, gate }), handle)
}

#[async_trait::async_trait]
impl mira::registry::Tool for Probe {
    fn spec(&self) -> &mira::registry::ToolSpec {
        &self.spec
    }

    fn side_effects(&self) -> mira::harness::SideEffects {
        mira::harness::SideEffects::AtCommitPoint
    }

    async fn execute(
        &self,
        input: &Value,
        ctx: &mira::registry::ExecContext,
    ) -> Result<mira::registry::ToolOutput, mira::registry::ToolError> {
        *self.gate.lock().unwrap() = Some(ctx.commit.clone());
        self.at.send_replace("started");
        self.before.acquire().await.unwrap().forget();
        if let Err(e) = ctx.commit() {
            self.at.send_replace("refused");
            return Err(e);
        }
        self.at.send_replace("committed");
        self.after.acquire().await.unwrap().forget();
        let name = input["value"].as_str().unwrap_or("probe.txt").to_owned();
        std::fs::write(self.dir.join(&name), "made\n").unwrap();
        self.at.send_replace("done");
        Ok(mira::registry::ToolOutput {
            output: json!({"wrote": name}),
            evidence: vec![mira::evidence::EvidenceDraft::of_text("probe_write", json!({"file": name}), "made\n")],
        })
    }
}

/// One approved call of `tool`: frozen by Alice and granted; returns the invocation.
async fn approved(f: &Fx, turn: &str, tool: &str, call: &str, value: &str) -> Value {
    let r = f.t.call(&f.alice.token, &f.alice.run, turn, tool, call, json!({"value": value})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    assert_eq!(f.grant(&f.alice, &r.body).await.status, StatusCode::OK);
    r.body
}

async fn cancel(f: &Fx, inv: &Value) -> Resp {
    f.t.post(&format!("/v1/invocations/{}/cancel", s(inv, "invocation_id")), &f.alice.token, json!({})).await
}

/// Each branch of a cancel, made deterministic: before the claim, before the commit point
/// (a probe and the real `write_file`), after it, a tool acting from its start, a reading
/// tool, and a finished call.
async fn cancel_branches_are_truthful(backend: Backend) {
    let mut options = Options::default();
    options.runtime.execution_concurrency = 1;
    let f = fx_options(backend, options).await;
    let ws = f.ws().to_path_buf();
    let app = f.t.app();
    let (tool, mut p) = probe("commit_probe", &ws);
    app.registry.register(tool).unwrap();
    let (tool, q) = probe("queued_probe", &ws);
    app.registry.register(tool).unwrap();
    let mut slow = TestTool::new("slow_action", "acts from its start until cancelled", true);
    slow.delay = Duration::from_secs(60);
    let slow_runs = slow.runs.clone();
    app.registry.register(Arc::new(slow)).unwrap();
    let mut reader = TestTool::new("slow_read", "reads for a long time", false);
    reader.delay = Duration::from_secs(60);
    let reader_runs = reader.runs.clone();
    app.registry.register(Arc::new(reader)).unwrap();
    let (turn, _) = f.t.turn(&f.alice.token, &f.alice.run, "cancel branches").await;

    // (1) Before its commit point: the cancel wins (200), the commit is refused, nothing is made.
    let inv = approved(&f, &turn, "commit_probe", "b1", "b1.txt").await;
    p.reached("started").await;
    let c = cancel(&f, &inv).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    assert!(c.body["cancel_requested_at"].is_string(), "{c:?}");
    p.before.add_permits(1);
    p.reached("refused").await;
    let done = f.t.wait_final(&f.alice.token, &s(&inv, "invocation_id")).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{done}"
    );
    assert_eq!(done["result"]["stop"]["outcome"], "stopped_before_commit", "{done}");
    assert_eq!(evidence_kinds(&f.t, &f.alice.token, &done).await, ["tool_error"]);
    assert!(!ws.join("b1.txt").exists());

    // (2) After its commit point: too late (409 already_running); it finishes, `completed`,
    // and the result and the evidence say a cancel was requested too late.
    let inv = approved(&f, &turn, "commit_probe", "b2", "b2.txt").await;
    p.before.add_permits(1);
    p.reached("committed").await;
    let c = cancel(&f, &inv).await;
    assert_eq!((c.status, c.code()), (StatusCode::CONFLICT, "already_running"), "{c:?}");
    p.after.add_permits(1);
    let done = f.t.wait_final(&f.alice.token, &s(&inv, "invocation_id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (done["result"]["stop"]["outcome"].as_str(), done["result"]["stop"]["reason"].as_str()),
        (Some("too_late"), Some("cancel"))
    );
    assert!(done["cancel_requested_at"].is_string());
    assert_eq!(evidence_kinds(&f.t, &f.alice.token, &done).await, ["probe_write", "stop_too_late"]);
    assert_eq!(std::fs::read_to_string(ws.join("b2.txt")).unwrap(), "made\n");
    let events = f.events(&f.alice.run).await;
    assert!(events.iter().any(|(k, d)| k == "invocation.cancel_requested"
        && d["invocation_id"] == inv["invocation_id"]
        && d["requested_by"] == f.alice.id.as_str()
        && d["token_id"] == f.alice.token_id.as_str()));
    // A second cancel of the finished call: 409 invalid_state.
    let again = cancel(&f, &inv).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "invalid_state"));

    // (3) The real write_file, held before its rename (its path lock taken by the test): the
    // cancel wins and the temporary file it wrote is removed.
    let w = f.frozen(&f.alice, "write_file", "b3", write("held.txt")).await;
    let resolved = w["input"]["resolved_path"].as_str().unwrap().to_owned();
    let held = mira::tools::edit::fs::lock_paths(&[&resolved]);
    assert_eq!(f.grant(&f.alice, &w).await.status, StatusCode::OK);
    for _ in 0..200 {
        if f.t.get(&format!("/v1/invocations/{}", s(&w, "invocation_id")), &f.alice.token).await.body["status"]
            == "running"
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = cancel(&f, &w).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    drop(held);
    let done = f.t.wait_final(&f.alice.token, &s(&w, "invocation_id")).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("cancelled"), Some("cancelled")),
        "{done}"
    );
    assert_eq!(done["result"]["stop"]["outcome"], "stopped_before_commit");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ws.join("held.txt").exists());
    assert_eq!(leftovers(&ws), Vec::<String>::new());

    // (4) Queued behind a busy harness (one execution at a time), not claimed yet: cancelled
    // in the store, never run. (5) The busy call acts from its start: the cancel asks it to
    // stop (200) and its status is what it reports, noting the cancel came after its start.
    let busy = approved(&f, &turn, "slow_action", "b4-busy", "x").await;
    for _ in 0..200 {
        if slow_runs.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = approved(&f, &turn, "queued_probe", "b4", "b4.txt").await;
    assert_eq!(
        f.t.get(&format!("/v1/invocations/{}", s(&queued, "invocation_id")), &f.alice.token).await.body["status"],
        "queued"
    );
    let c = cancel(&f, &queued).await;
    assert_eq!((c.status, c.body["status"].as_str()), (StatusCode::OK, Some("cancelled")), "{c:?}");
    let c = cancel(&f, &busy).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let done = f.t.wait_final(&f.alice.token, &s(&busy, "invocation_id")).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(done["result"]["stop"]["outcome"], "after_start", "{done}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*q.at.borrow(), "idle", "the queued probe never started");
    assert!(!ws.join("b4.txt").exists());

    // (6) A reading tool: stopped at once, `cancelled`.
    let r = f.t.call(&f.alice.token, &f.alice.run, &turn, "slow_read", "b6", json!({"value": "r"})).await;
    for _ in 0..200 {
        if reader_runs.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = cancel(&f, &r.body).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let done = f.t.wait_final(&f.alice.token, &s(&r.body, "invocation_id")).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["stop"]["outcome"].as_str()),
        (Some("cancelled"), Some("stopped_before_commit")),
        "{done}"
    );
}

/// The execution time limit goes through the same gate: before the commit point the call
/// fails with `timeout` and nothing is made; after it the change is made and reported
/// `completed` with the late stop noted.
async fn time_limit_respects_the_commit_point(backend: Backend) {
    let mut options = Options::default();
    options.runtime.execution_timeout_secs = 1;
    let f = fx_options(backend, options).await;
    let ws = f.ws().to_path_buf();
    let (tool, mut p) = probe("commit_probe", &ws);
    f.t.app().registry.register(tool).unwrap();
    let (turn, _) = f.t.turn(&f.alice.token, &f.alice.run, "time limit").await;

    let inv = approved(&f, &turn, "commit_probe", "t1", "t1.txt").await;
    p.reached("started").await;
    p.gate_until("the stop at the time limit", |g| matches!(g, GateState::Stopped { reason: StopReason::Timeout, .. }))
        .await;
    p.before.add_permits(1);
    let done = f.t.wait_final(&f.alice.token, &s(&inv, "invocation_id")).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("timeout")),
        "{done}"
    );
    assert!(!ws.join("t1.txt").exists());

    let inv = approved(&f, &turn, "commit_probe", "t2", "t2.txt").await;
    p.before.add_permits(1);
    p.reached("committed").await;
    p.gate_until("the late stop at the time limit", |g| {
        matches!(g, GateState::Committed { late_stop: Some((StopReason::Timeout, _)) })
    })
    .await;
    p.after.add_permits(1);
    let done = f.t.wait_final(&f.alice.token, &s(&inv, "invocation_id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        (done["result"]["stop"]["reason"].as_str(), done["result"]["stop"]["outcome"].as_str()),
        (Some("timeout"), Some("too_late"))
    );
    assert!(ws.join("t2.txt").exists());
}

/// A cancel sent to another replica than the one running the call is recorded (202) and
/// applied by the running one within about a second: the call ends `cancelled`, unmade.
async fn cancel_through_another_replica_is_applied(backend: Backend) {
    let f = fx_with(backend, &[]).await;
    let ws = f.ws().to_path_buf();
    let (tool, mut p) = probe("commit_probe", &ws);
    f.t.app().registry.register(tool.clone()).unwrap();
    let other_data = tempfile::tempdir().unwrap();
    let mut settings = f.t.settings.clone();
    settings.data_dir = other_data.path().to_path_buf();
    let b = mira::server::Server::start(settings).await.unwrap();
    b.app.registry.register(tool).unwrap();
    let (turn, _) = f.t.turn(&f.alice.token, &f.alice.run, "replicas").await;
    let inv = approved(&f, &turn, "commit_probe", "r1", "r1.txt").await;
    p.reached("started").await;
    let id = s(&inv, "invocation_id");
    let row = f.t.app().store.invocation_by_id(&id).await.unwrap().unwrap();
    let other = if row.claimed_by.as_deref() == Some(f.t.app().harness.node_id()) {
        format!("http://{}", b.addr)
    } else {
        f.t.base.clone()
    };
    let c =
        f.t.client
            .post(format!("{other}/v1/invocations/{id}/cancel"))
            .bearer_auth(&f.alice.token)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
    assert_eq!(c.status(), StatusCode::ACCEPTED);
    p.gate_until("the cancel, applied by the running replica", |g| {
        matches!(g, GateState::Stopped { reason: StopReason::Cancel, .. })
    })
    .await;
    p.before.add_permits(1);
    let done = f.t.wait_final(&f.alice.token, &id).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["stop"]["outcome"].as_str()),
        (Some("cancelled"), Some("stopped_before_commit")),
        "{done}"
    );
    assert!(!ws.join("r1.txt").exists());
    b.shutdown().await;
}

both_backends!(
    cancel_racing_a_grant_never_contradicts_the_file,
    cancel_branches_are_truthful,
    time_limit_respects_the_commit_point,
    cancel_through_another_replica_is_applied,
);
