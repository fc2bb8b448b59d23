#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Runs anyone can verify offline (docs/verify.md), over HTTP on SQLite and on Postgres: a
//! real run's bundle verifies under the well-known key (in-process and with `mira verify`);
//! changing any byte of any part is detected, and the exposure, frozen input, approval
//! decision, result, evidence content and event alterations are named; a deleted or reordered
//! event is detected; a wrong key fails the signature; a forged-but-re-signed bundle that runs
//! a gated call without its grant fails the grant check; rows edited directly in the database
//! are named by `mira verify --database`; only the owner (or an admin) gets the bundle.

use crate::common::{Backend, TestApp, spawn};
use mira::verify::{KeyCheck, check};
use mira_core::chain::{GENESIS, event_content_hash, event_link};
use mira_core::remote::VerifyingKey;
use reqwest::StatusCode;
use serde_json::{Value, json};

crate::both_backends!(bundle_verifies_and_every_alteration_is_found, stored_rows_edited_are_named);

/// A run with an exposure, a read with evidence, a granted write and a denied one.
struct Fx {
    t: TestApp,
    token: String,
    run: String,
    /// The granted write's invocation id.
    granted: String,
    /// The read's invocation id.
    read: String,
}

async fn fx(backend: Backend) -> Fx {
    let t = spawn(backend).await;
    let token = t.user("alice").await;
    std::fs::write(t.workspace.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read and edit the notes").await;
    let r = t.call(&token, &run, &turn, "read_open", "read-1", json!({"path": "notes.txt"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let read = r.body["invocation_id"].as_str().unwrap().to_owned();
    let done = t.wait_final(&token, &read).await;
    assert_eq!(done["status"], "completed", "{done}");
    let w = t.call(&token, &run, &turn, "write_file", "write-1", json!({"path": "out.txt", "content": "hello"})).await;
    assert_eq!(w.body["status"], "awaiting_approval", "{w:?}");
    let granted = w.body["invocation_id"].as_str().unwrap().to_owned();
    let g = t
        .post(
            &format!("/v1/approvals/{}/grant", w.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"tool_id": w.body["tool_id"], "tool_call_id": w.body["tool_call_id"], "input_hash": w.body["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    assert_eq!(t.wait_final(&token, &granted).await["status"], "completed");
    let d = t.call(&token, &run, &turn, "write_file", "write-2", json!({"path": "no.txt", "content": "no"})).await;
    let denied = t
        .post(
            &format!("/v1/approvals/{}/deny", d.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"reason": "no"}),
        )
        .await;
    assert_eq!(denied.status, StatusCode::OK, "{denied:?}");
    Fx { t, token, run, granted, read }
}

/// The server's key from the well-known path (no token).
async fn well_known_key(t: &TestApp) -> (VerifyingKey, String) {
    let r = t.client.get(format!("{}/.well-known/mira-signing-key", t.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["algorithm"], "ed25519");
    let hex_key = body["public_key"].as_str().unwrap().to_owned();
    (mira_core::remote::parse_public(&hex_key).unwrap(), hex_key)
}

fn first(doc: &Value, key: &VerifyingKey) -> String {
    let report = check(doc, KeyCheck::Pinned(key));
    report.problems.first().map(|p| p.to_string()).unwrap_or_default()
}

/// Index of the first element of `doc[list]` whose `key` is `value`.
fn pos(doc: &Value, list: &str, key: &str, value: &str) -> usize {
    doc[list].as_array().unwrap().iter().position(|v| v[key] == value).unwrap_or_else(|| panic!("{value} in {list}"))
}

/// Re-chains events from seq 1 on after an edit (renumbering them) and sets the head: what a
/// forger with the database would do.
fn rechain(doc: &mut Value) {
    let run_id = doc["run"]["id"].as_str().unwrap().to_owned();
    let mut prev = GENESIS.to_owned();
    let events = doc["events"].as_array_mut().unwrap();
    for (i, e) in events.iter_mut().enumerate() {
        let seq = i64::try_from(i).unwrap() + 1;
        e["seq"] = json!(seq);
        let content =
            event_content_hash(&run_id, e["type"].as_str().unwrap(), e["created_at"].as_str().unwrap(), &e["data"]);
        let hash = event_link(&prev, seq, &content);
        e["content_hash"] = json!(content);
        e["prev_hash"] = json!(prev);
        e["hash"] = json!(hash);
        prev = hash;
    }
    let n = events.len();
    doc["chain"]["head_seq"] = json!(n);
    doc["chain"]["head_hash"] = json!(prev);
}

/// Every string and number leaf of `v` with its JSON pointer.
fn leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            m.iter().for_each(|(k, x)| leaves(x, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out))
        }
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| leaves(x, format!("{at}/{i}"), out)),
        Value::String(_) | Value::Number(_) | Value::Bool(_) => out.push(at),
        Value::Null => {}
    }
}

/// `v` with one byte changed: a string's first byte (or its absence filled), a number + 1, a
/// boolean flipped.
fn altered(v: &Value) -> Value {
    match v {
        Value::String(s) if s.is_empty() => json!("x"),
        Value::String(s) => {
            let mut b = s.clone().into_bytes();
            b[0] = if b[0] == b'A' {
                b'B'
            } else if b[0].is_ascii() {
                b'A'
            } else {
                b'a'
            };
            json!(String::from_utf8_lossy(&b).into_owned())
        }
        Value::Number(n) => json!(n.as_i64().unwrap_or(0) + 1),
        Value::Bool(b) => json!(!b),
        other => other.clone(),
    }
}

fn mira(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mira")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

async fn bundle_verifies_and_every_alteration_is_found(backend: Backend) {
    let f = fx(backend).await;
    let (key, key_hex) = well_known_key(&f.t).await;
    let r = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &f.token).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let doc = r.body;
    assert_eq!(doc["signature"]["public_key"], key_hex.as_str());
    let report = check(&doc, KeyCheck::Pinned(&key));
    assert!(report.valid(), "{:?}", report.problems);
    assert_eq!(
        report.records,
        [1, 3, 2, 2],
        "one exposure, three calls, two approvals, the read's and the write's evidence"
    );
    assert_eq!(report.grants, 1, "the granted write ran with its grant");
    assert_eq!(report.chained, report.events);
    assert!(report.events >= 10, "{}", report.events);
    assert_eq!(doc["chain"]["unchained_before"], 1);
    // Who decided is in the bundle.
    let a = pos(&doc, "approvals", "invocation_id", &f.granted);
    assert_eq!(doc["approvals"][a]["decided_by_name"], "alice");
    let e = pos(&doc, "evidence", "invocation_id", &f.read);
    assert_eq!(doc["evidence"][e]["excerpt"], "one\ntwo\nthree\n");

    // The CLI, offline: valid (0), tampered (1, named), wrong key (1), with the key in a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundle.json");
    std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();
    let (code, out) = mira(&["verify", file.to_str().unwrap(), "--key", &key_hex]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("valid: bundle of run"), "{out}");
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, json!({"public_key": key_hex}).to_string()).unwrap();
    assert_eq!(mira(&["verify", file.to_str().unwrap(), "--key", key_file.to_str().unwrap()]).0, 0);
    let other = hex::encode(mira_core::remote::signing_key(&[9; 32]).verifying_key().to_bytes());
    let (code, out) = mira(&["verify", file.to_str().unwrap(), "--key", &other]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("INVALID") && out.contains("signature: does not verify"), "{out}");
    let other_key = mira_core::remote::parse_public(&other).unwrap();
    assert!(first(&doc, &other_key).starts_with("signature"), "wrong key");

    // Each part altered is named.
    let read_i = pos(&doc, "invocations", "id", &f.read);
    let write_i = pos(&doc, "invocations", "id", &f.granted);
    let turn = doc["exposures"][0]["turn_id"].as_str().unwrap().to_owned();
    let evd = doc["evidence"][e]["id"].as_str().unwrap().to_owned();
    let apr = doc["approvals"][a]["id"].as_str().unwrap().to_owned();
    let cases: Vec<(String, String, String)> = vec![
        ("/exposures/0/exposure/strategy".to_owned(), json!("forged").to_string(), format!("exposure {turn}: ")),
        (
            format!("/invocations/{write_i}/input/content"),
            json!("HELLO").to_string(),
            format!("invocation {}: ", f.granted),
        ),
        (format!("/approvals/{a}/decided_by"), json!("usr_mallory").to_string(), format!("approval {apr}: ")),
        (
            format!("/invocations/{read_i}/result/ok"),
            json!(false).to_string(),
            format!("invocation {}: result", f.read),
        ),
        (format!("/evidence/{e}/excerpt"), json!("one\ntwo\nTHREE\n").to_string(), format!("evidence {evd}: content")),
        ("/events/1/data/tool_id".to_owned(), json!("write_file").to_string(), "event seq 2: content".to_owned()),
    ];
    for (pointer, value, named) in &cases {
        let mut d = doc.clone();
        *d.pointer_mut(pointer.as_str()).unwrap_or_else(|| panic!("{pointer}")) = serde_json::from_str(value).unwrap();
        let p = first(&d, &key);
        assert!(p.starts_with(named.as_str()), "{pointer}: expected {named}…, got {p}");
        // And the CLI names the same.
        if pointer.starts_with("/evidence") {
            std::fs::write(&file, serde_json::to_vec(&d).unwrap()).unwrap();
            let (code, out) = mira(&["verify", file.to_str().unwrap(), "--key", &key_hex]);
            assert_eq!(code, 1, "{out}");
            assert!(out.contains(&format!("INVALID: bundle of run {}: {named}", f.run)), "{out}");
        }
    }

    // Any byte of any part: every leaf altered makes the bundle invalid.
    let mut all = Vec::new();
    leaves(&doc, String::new(), &mut all);
    let mut checked = 0;
    for pointer in all.iter().filter(|p| !p.starts_with("/signature")) {
        let mut d = doc.clone();
        let v = d.pointer_mut(pointer).unwrap();
        *v = altered(v);
        assert!(!check(&d, KeyCheck::Pinned(&key)).valid(), "altering {pointer} went unnoticed");
        checked += 1;
    }
    assert!(checked > 100, "{checked}");
    // The signature's own bytes.
    let mut d = doc.clone();
    // Another hex digit: `altered` would write `A` over a leading `a`, the same byte to a
    // case-blind hex decoder (one run in 16 would then alter nothing).
    let value = d["signature"]["value"].as_str().unwrap().to_owned();
    let other = if value.starts_with('0') { "1" } else { "0" };
    d["signature"]["value"] = json!(format!("{other}{}", &value[1..]));
    assert!(first(&d, &key).starts_with("signature"));

    // A deleted event (in the middle), two events swapped, the last event deleted.
    let mut d = doc.clone();
    d["events"].as_array_mut().unwrap().remove(3);
    assert!(first(&d, &key).starts_with("event seq 4: missing"), "{}", first(&d, &key));
    let mut d = doc.clone();
    d["events"].as_array_mut().unwrap().swap(2, 3);
    assert!(first(&d, &key).starts_with("event seq 4: out of order"), "{}", first(&d, &key));
    let mut d = doc.clone();
    d["events"].as_array_mut().unwrap().pop();
    assert!(first(&d, &key).starts_with("chain: head_seq"), "{}", first(&d, &key));

    // Forged and re-signed: the grant is taken out (and the approval shown as pending), the
    // chain rebuilt — hashes and signature hold, the grant check does not.
    let forger = mira_core::remote::signing_key(&[42; 32]);
    let mut d = doc.clone();
    d["events"].as_array_mut().unwrap().retain(|e| e["type"] != "approval.granted");
    d["approvals"][a]["status"] = json!("pending");
    rechain(&mut d);
    mira::verify::sign(&mut d, &forger);
    let report = check(&d, KeyCheck::Pinned(&forger.verifying_key()));
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let p = report.problems[0].to_string();
    assert!(p.starts_with(&format!("grant {}: tool write_file call write-1", f.granted)), "{p}");
    assert!(p.contains("without a matching grant"), "{p}");
    // The same forgery, re-signed but with the real grant left in: valid under the forger's key,
    // refused under the server's.
    let mut d = doc.clone();
    mira::verify::sign(&mut d, &forger);
    assert!(check(&d, KeyCheck::Pinned(&forger.verifying_key())).valid());
    assert!(first(&d, &key).starts_with("signature"));
    // A grant for another input does not count.
    let mut d = doc.clone();
    for e in d["events"].as_array_mut().unwrap() {
        if e["type"] == "approval.granted" {
            e["data"]["input_hash"] = json!(GENESIS);
        }
    }
    d["approvals"][a]["input_hash"] = json!(GENESIS);
    rechain(&mut d);
    mira::verify::sign(&mut d, &forger);
    let report = check(&d, KeyCheck::Pinned(&forger.verifying_key()));
    assert!(report.problems.iter().any(|p| p.part == format!("grant {}", f.granted)), "{:?}", report.problems);

    // Access: another user gets the run's 404; an admin gets the bundle.
    let bob = f.t.user("bob").await;
    let r = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &bob).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{r:?}");
    let r = f.t.get(&format!("/v1/runs/{}/bundle", "run_nope"), &f.token).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &f.t.admin_token).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(check(&r.body, KeyCheck::Pinned(&key)).valid());
    let r = f.t.request(reqwest::Method::GET, &format!("/v1/runs/{}/bundle", f.run), None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

/// `mira verify --database URL --run ID` over the rows.
fn verify_db(t: &TestApp, run: &str) -> (i32, String) {
    mira(&["verify", "--database", &t.db.url, "--run", run])
}

async fn stored_rows_edited_are_named(backend: Backend) {
    let f = fx(backend).await;
    let (code, out) = verify_db(&f.t, &f.run);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("valid: stored chain of run"), "{out}");
    let pool = sqlx::AnyPool::connect(&f.t.db.url).await.unwrap();
    let run = f.run.as_str();

    // An event's data.
    let (data,): (String,) = sqlx::query_as("SELECT data FROM events WHERE run_id = $1 AND seq = 3")
        .bind(run)
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut value: Value = serde_json::from_str(&data).unwrap();
    value["forged"] = json!(true);
    let edited = value.to_string();
    assert_ne!(edited, data);
    sqlx::query("UPDATE events SET data = $1 WHERE run_id = $2 AND seq = 3")
        .bind(&edited)
        .bind(run)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("INVALID: stored chain of run {run}: event seq 3: content")), "{out}");
    sqlx::query("UPDATE events SET data = $1 WHERE run_id = $2 AND seq = 3")
        .bind(&data)
        .bind(run)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(verify_db(&f.t, run).0, 0);

    // A frozen input.
    let (input, input_hash): (String, String) =
        sqlx::query_as("SELECT input, input_hash FROM invocations WHERE id = $1")
            .bind(&f.granted)
            .fetch_one(&pool)
            .await
            .unwrap();
    sqlx::query("UPDATE invocations SET input = $1 WHERE id = $2")
        .bind(json!({"path": "out.txt", "content": "HELLO"}).to_string())
        .bind(&f.granted)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!(": invocation {}: input", f.granted)), "{out}");
    sqlx::query("UPDATE invocations SET input = $1, input_hash = $2 WHERE id = $3")
        .bind(json!({"path": "out.txt", "content": "HELLO"}).to_string())
        .bind(mira_core::canonical::input_hash("write_file", &json!({"path": "out.txt", "content": "HELLO"})))
        .bind(&f.granted)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!(": invocation {}: `input_hash` does not match", f.granted)), "{out}");

    sqlx::query("UPDATE invocations SET input = $1, input_hash = $2 WHERE id = $3")
        .bind(&input)
        .bind(&input_hash)
        .bind(&f.granted)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 0, "{out}");

    // A result, an approval's decider, evidence content: each named.
    sqlx::query("UPDATE invocations SET result = $1 WHERE id = $2")
        .bind(json!({"ok": true, "output": {"forged": true}}).to_string())
        .bind(&f.read)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!(": invocation {}: result does not match", f.read)), "{out}");

    sqlx::query("UPDATE approvals SET decided_by = 'usr_mallory' WHERE invocation_id = $1")
        .bind(&f.granted)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE evidence SET excerpt = 'forged' WHERE run_id = $1").bind(run).execute(&pool).await.unwrap();
    let (_, out) = verify_db(&f.t, run);
    assert!(out.contains("approval apr_") && out.contains("`decided_by` does not match"), "{out}");
    assert!(out.contains(": evidence evd_") && out.contains("content (kind, provenance"), "{out}");

    // A deleted event row, then a hash edited.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("DELETE FROM events WHERE run_id = $1 AND seq = 5").bind(run).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let (code, out) = verify_db(&f.t, run);
    assert_eq!(code, 1);
    assert!(out.contains(&format!("INVALID: stored chain of run {run}: event seq 5: missing")), "{out}");
    sqlx::query("UPDATE events SET hash = $1 WHERE run_id = $2 AND seq = 2")
        .bind(GENESIS)
        .bind(run)
        .execute(&pool)
        .await
        .unwrap();
    let (_, out) = verify_db(&f.t, run);
    assert!(out.contains(&format!("INVALID: stored chain of run {run}: event seq 2: hash does not match")), "{out}");

    // An unknown run is an input error (2), not a verdict.
    assert_eq!(verify_db(&f.t, "run_nope").0, 2);
    pool.close().await;
}

crate::both_backends!(chains_hold_under_concurrent_group_commits);

/// Many planners at once, each on its own run, their freezes and results written in shared
/// group commits (on Postgres one statement for several runs): every run's stored chain holds.
async fn chains_hold_under_concurrent_group_commits(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("a.txt"), "alpha\n").unwrap();
    let mut runs = Vec::new();
    for i in 0..6 {
        let token = t.user(&format!("user{i}")).await;
        let run = t.run(&token).await;
        let (turn, _) = t.turn(&token, &run, "read a.txt").await;
        runs.push((token, run, turn));
    }
    let app = &t;
    let calls = runs.iter().flat_map(|(token, run, turn)| {
        (0..15).map(move |n| {
            let t = app;
            async move {
                let r = t.call(token, run, turn, "read_open", &format!("c{n}"), json!({"path": "a.txt"})).await;
                assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
                t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await
            }
        })
    });
    for done in futures::future::join_all(calls).await {
        assert_eq!(done["status"], "completed", "{done}");
    }
    for (_, run, _) in &runs {
        let mira::store::RunDocument::Document(doc) = t.app().store.run_document(run, usize::MAX).await.unwrap() else {
            panic!("run {run}");
        };
        let report = check(&doc, KeyCheck::Skip);
        assert!(report.valid(), "{run}: {:?}", report.problems);
        assert_eq!(report.chained, report.events);
        assert!(report.events > 15 * 4, "{run}: {} events", report.events);
        assert_eq!(report.records[1], 15);
    }
}

crate::both_backends!(runs_older_than_the_chain_verify_from_where_it_starts);

/// A run as migration 0026 leaves one made before it (events without hashes, `chain_from` past
/// them, no last hash): its new events chain from the genesis at `chain_from`, the bundle says
/// `unchained_before`, records bound only by older events are not covered (a note, no
/// failure), and an event past the start stripped of its hashes is a problem.
async fn runs_older_than_the_chain_verify_from_where_it_starts(backend: Backend) {
    let f = fx(backend).await;
    let pool = sqlx::AnyPool::connect(&f.t.db.url).await.unwrap();
    sqlx::query("UPDATE events SET content_hash = NULL, prev_hash = NULL, hash = NULL WHERE run_id = $1")
        .bind(&f.run)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET last_hash = NULL, chain_from = event_seq + 1 WHERE id = $1")
        .bind(&f.run)
        .execute(&pool)
        .await
        .unwrap();
    let (old,): (i64,) =
        sqlx::query_as("SELECT event_seq FROM runs WHERE id = $1").bind(&f.run).fetch_one(&pool).await.unwrap();
    // New work on the old run.
    let (turn, _) = f.t.turn(&f.token, &f.run, "read again").await;
    let r = f.t.call(&f.token, &f.run, &turn, "read_open", "read-2", json!({"path": "notes.txt"})).await;
    assert_eq!(f.t.wait_final(&f.token, r.body["invocation_id"].as_str().unwrap()).await["status"], "completed");

    let (key, _) = well_known_key(&f.t).await;
    let doc = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &f.token).await.body;
    assert_eq!(doc["chain"]["unchained_before"], old + 1);
    let first_chained = &doc["events"][usize::try_from(old).unwrap()];
    assert_eq!(first_chained["prev_hash"], GENESIS);
    let report = check(&doc, KeyCheck::Pinned(&key));
    assert!(report.valid(), "{:?}", report.problems);
    assert_eq!(report.events - report.chained, usize::try_from(old).unwrap());
    assert!(report.chained >= 5, "{}", report.chained);
    assert!(report.notes.iter().any(|n| n.contains(&format!("before seq {}", old + 1))), "{:?}", report.notes);
    assert!(report.notes.iter().any(|n| n.contains("not covered")), "{:?}", report.notes);
    let (code, out) = verify_db(&f.t, &f.run);
    assert_eq!(code, 0, "{out}");

    // Hashes stripped from a chained event: named, not taken for an old event.
    sqlx::query("UPDATE events SET content_hash = NULL, prev_hash = NULL, hash = NULL WHERE run_id = $1 AND seq = $2")
        .bind(&f.run)
        .bind(old + 2)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = verify_db(&f.t, &f.run);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("event seq {}: no hashes, but the chain starts at seq {}", old + 2, old + 1)),
        "{out}"
    );
    pool.close().await;
}

crate::both_backends!(bundles_built_at_once_are_bounded);

/// A server builds at most two bundles at once (each holds up to 64 MiB of records): with both
/// places taken, a request waits 10 s and is refused 429 `too_many_bundles`; once a place is
/// free, it is served.
async fn bundles_built_at_once_are_bounded(backend: Backend) {
    let f = fx(backend).await;
    let slots = std::sync::Arc::clone(&f.t.app().bundle_slots);
    let held = slots.acquire_many_owned(mira::http::bundle::MAX_CONCURRENT_BUNDLES as u32).await.unwrap();
    let started = std::time::Instant::now();
    let r = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &f.token).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.code(), "too_many_bundles");
    assert!(started.elapsed() >= mira::http::bundle::BUNDLE_WAIT, "{:?}", started.elapsed());
    drop(held);
    let r = f.t.get(&format!("/v1/runs/{}/bundle", f.run), &f.token).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.code());
}

crate::both_backends!(bundle_body_is_its_signed_bytes);

/// The bundle is sent as the bytes its signature covers, the signature appended: the body is
/// the RFC 8785 form of the signed document (not a second serialisation of it), served as
/// JSON, and it verifies.
async fn bundle_body_is_its_signed_bytes(backend: Backend) {
    let f = fx(backend).await;
    let (key, _) = well_known_key(&f.t).await;
    // A result whose RFC 8785 form differs from a plain serialisation: a number written
    // `1e+21` (not `1e21`), and keys in UTF-16 order (U+1F600 before U+FFFD).
    f.t.app().registry.register(std::sync::Arc::new(crate::common::TestTool::new("echo", "echoes", false))).unwrap();
    let (turn, _) = f.t.turn(&f.token, &f.run, "echo").await;
    let input = json!({"value": "x", "n": 1e21, "\u{fffd}": 1, "\u{1f600}": 2});
    let r = f.t.call(&f.token, &f.run, &turn, "echo", "echo-1", input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(f.t.wait_final(&f.token, r.body["invocation_id"].as_str().unwrap()).await["status"], "completed");
    let r =
        f.t.client.get(format!("{}/v1/runs/{}/bundle", f.t.base, f.run)).bearer_auth(&f.token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    let body = r.text().await.unwrap();
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body, mira_core::canonical::to_canonical_string(&doc), "the body is the canonical form");
    let mut unsigned = doc.clone();
    unsigned.as_object_mut().unwrap().remove("signature");
    let covered = mira_core::canonical::to_canonical_string(&unsigned);
    assert!(body.starts_with(&covered[..covered.len() - 1]), "the signed bytes, then the signature");
    assert!(body[covered.len() - 1..].starts_with(",\"signature\":{"), "{}", &body[covered.len() - 1..]);
    let report = check(&doc, KeyCheck::Pinned(&key));
    assert!(report.valid(), "{:?}", report.problems);
}

crate::both_backends!(bundles_of_an_active_run_verify);

/// Bundles exported again and again while calls of their run are granted, executed and
/// frozen: every one is one state of the run (one read snapshot) and verifies. Read in
/// separate statements, the chain head (read first) fell behind the events (read last), and an
/// approval read `pending` met the `approval.granted` event of a grant that committed between
/// the two reads.
async fn bundles_of_an_active_run_verify(backend: Backend) {
    let t = spawn(backend).await;
    t.app()
        .registry
        .register(std::sync::Arc::new(crate::common::TestTool::new("gated_echo", "echoes after approval", true)))
        .unwrap();
    let token = t.user("ada").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "echo").await;
    let (key, _) = well_known_key(&t).await;
    let mut pending = Vec::new();
    for i in 0..40 {
        let r = t.call(&token, &run, &turn, "gated_echo", &format!("c{i}"), json!({"value": format!("v{i}")})).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        pending.push(r.body.clone());
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let writer = async {
        for (i, call) in pending.iter().enumerate() {
            let g = t
                .post(
                    &format!("/v1/approvals/{}/grant", call["approval_id"].as_str().unwrap()),
                    &token,
                    json!({"tool_id": call["tool_id"], "tool_call_id": call["tool_call_id"], "input_hash": call["input_hash"]}),
                )
                .await;
            assert_eq!(g.status, StatusCode::OK, "{g:?}");
            let r = t.call(&token, &run, &turn, "gated_echo", &format!("n{i}"), json!({"value": "new"})).await;
            assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
        }
        for call in &pending {
            t.wait_final(&token, call["invocation_id"].as_str().unwrap()).await;
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let reader = async {
        let (mut exported, mut invalid) = (0usize, Vec::new());
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let r = t.get(&format!("/v1/runs/{run}/bundle"), &token).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.code());
            exported += 1;
            let report = check(&r.body, KeyCheck::Pinned(&key));
            if !report.valid() {
                invalid.push(report.problems[0].to_string());
            }
        }
        (exported, invalid)
    };
    let ((), (exported, invalid)) = tokio::join!(writer, reader);
    eprintln!("{exported} bundles exported while the run changed, {} invalid", invalid.len());
    assert!(exported >= 5, "only {exported} bundles were exported while the run changed");
    assert!(invalid.is_empty(), "{} of {exported} bundles do not verify: {invalid:?}", invalid.len());
}

crate::both_backends!(bundle_memory_stays_near_its_size);

/// A field of `/proc/self/status` in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// Gives freed heap back, resets the peak resident size to the current one (Linux
/// `clear_refs` 5) and answers it; None where that is not possible.
fn reset_peak() -> Option<u64> {
    // SAFETY: malloc_trim only walks glibc's own arenas; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_kib("VmRSS:")
}

/// GETs `path` reading the body as it comes and dropping it: (status, body bytes, how much the
/// process's peak resident size grew meanwhile in bytes — the server is in this process).
async fn peak_of(t: &TestApp, token: &str, path: &str) -> (StatusCode, usize, Option<u64>) {
    let start = reset_peak();
    let mut r = t.client.get(format!("{}{path}", t.base)).bearer_auth(token).send().await.unwrap();
    let status = r.status();
    let mut len = 0;
    while let Some(chunk) = r.chunk().await.unwrap() {
        len += chunk.len();
    }
    let grew = start.zip(status_kib("VmHWM:")).map(|(start, peak)| peak.saturating_sub(start) * 1024);
    (status, len, grew)
}

/// A run of ~55 MB of records exports (its document is written once, in the form it is signed
/// and sent in; it was read whole, built as a JSON value, cloned, canonicalised, copied to be
/// signed and serialised again), is refused once it passes 64 MiB, and a page of its
/// invocations holds one of them, not all. The growth of the process's peak resident size for
/// each is printed (a figure, not asserted).
async fn bundle_memory_stays_near_its_size(backend: Backend) {
    let options = crate::common::Options { body_limit: 8 * 1024 * 1024, ..Default::default() };
    let t = crate::common::spawn_with(backend, options).await;
    t.app().registry.register(std::sync::Arc::new(crate::common::TestTool::new("echo", "echoes", false))).unwrap();
    let token = t.user("ada").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "echo").await;
    // Each call: a 3.5 MiB input, its echo as the result (under the 4 MiB a result keeps), the
    // input again in `invocation.frozen`: about 10.5 MiB of records.
    let call = |i: usize| {
        let t = &t;
        let (token, run, turn) = (&token, &run, &turn);
        async move {
            let value = char::from(b'a' + u8::try_from(i).unwrap()).to_string().repeat(3584 * 1024);
            let r = t.call(token, run, turn, "echo", &format!("c{i}"), json!({ "value": value })).await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.code());
            let done = t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await;
            assert_eq!(done["status"], "completed");
        }
    };
    for i in 0..5 {
        call(i).await;
    }
    let bundle = format!("/v1/runs/{run}/bundle");
    let (status, len, grew) = peak_of(&t, &token, &bundle).await;
    assert_eq!(status, StatusCode::OK);
    eprintln!("bundle of {len} bytes: peak resident size grew by {grew:?} bytes");

    for i in 5..8 {
        call(i).await;
    }
    let (status, _, refused) = peak_of(&t, &token, &bundle).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    eprintln!("bundle past 64 MiB refused: peak resident size grew by {refused:?} bytes");

    let (status, page, page_grew) = peak_of(&t, &token, &format!("/v1/runs/{run}/invocations?limit=200")).await;
    assert_eq!(status, StatusCode::OK);
    eprintln!("a page of invocations of {page} bytes: peak resident size grew by {page_grew:?} bytes");

    // Measured (debug build): about 2–2.7 times the bundle's size, allocator slack included;
    // it was 4.5–4.7 times. Printed, not asserted: a resident-size bound in a test depends on
    // the allocator and the machine (memory targets are for benchmarks). What is asserted is
    // exact: a page holds one 7 MiB invocation, not all eight.
    assert!(page < 10 * 1024 * 1024, "a page of {page} bytes");
}
