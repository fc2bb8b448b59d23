//! The hot path's shortcuts keep the chain's guarantees, on both back-ends: concurrent
//! freezes and results share transactions (group commit) yet every call id names one
//! invocation, replays and conflicts answer as before, approvals carry their exact triple and
//! every run's event ids stay gapless; a cached token stops working at once when revoked on
//! this server and within the cache's bound when revoked elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Connection;

use crate::common::{self, Backend};

async fn concurrent_freezes_keep_every_guarantee(backend: Backend) {
    let t = common::spawn(backend).await;
    let token = t.admin_token.clone();
    std::fs::write(t.workspace.join("f.txt"), "one\ntwo\n").unwrap();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let run = t.run(&token).await;
        let (turn, _) = t.turn(&token, &run, "read and write files").await;
        runs.push((run, turn));
    }
    // Per run: 10 distinct reads, the same call id three times with the same input (one
    // created, the others replays of it), and once with another input (a conflict), and two
    // approval-gated writes — all at once.
    let mut calls = Vec::new();
    for (r, (run, turn)) in runs.iter().enumerate() {
        for n in 0..10 {
            calls.push((run.clone(), turn.clone(), "read_open", format!("read-{n}"), json!({"path": "f.txt"})));
        }
        for _ in 0..3 {
            calls.push((run.clone(), turn.clone(), "read_open", "same".to_owned(), json!({"path": "f.txt"})));
        }
        calls.push((
            run.clone(),
            turn.clone(),
            "read_open",
            "same".to_owned(),
            json!({"path": "f.txt", "end_line": 1}),
        ));
        for n in 0..2 {
            calls.push((
                run.clone(),
                turn.clone(),
                "write_file",
                format!("write-{n}"),
                json!({"path": format!("w{r}-{n}.txt"), "content": "x"}),
            ));
        }
    }
    let mut tasks = Vec::new();
    for (run, turn, tool, call_id, input) in calls {
        let (base, client, token) = (t.base.clone(), t.client.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(format!("{base}/v1/runs/{run}/invocations"))
                .bearer_auth(token)
                .json(&json!({"turn_id": turn, "tool_id": tool, "tool_call_id": call_id, "input": input}))
                .send()
                .await
                .unwrap();
            let status = resp.status();
            (run, call_id, input, status, resp.json::<Value>().await.unwrap())
        }));
    }
    type Answers = Vec<(Value, StatusCode, Value)>;
    let mut by_call: HashMap<(String, String), Answers> = HashMap::new();
    for task in tasks {
        let (run, call_id, input, status, body) = task.await.unwrap();
        by_call.entry((run, call_id)).or_default().push((input, status, body));
    }
    let mut reads = Vec::new();
    for ((run, call_id), answers) in &by_call {
        if call_id == "same" {
            // The first freeze to commit wins; the same input replays it (200) and the other
            // input conflicts (409), whichever order they came in.
            let winner = answers.iter().find(|(_, s, _)| *s == StatusCode::CREATED).expect("one created");
            let created = answers.iter().filter(|(_, s, _)| *s == StatusCode::CREATED).count();
            assert_eq!(created, 1, "{run}: {answers:?}");
            let id = winner.2["invocation_id"].clone();
            for (input, status, body) in answers {
                if *input == winner.0 {
                    assert!(matches!(*status, StatusCode::CREATED | StatusCode::OK), "{body}");
                    assert_eq!(body["invocation_id"], id, "a replay names the same invocation");
                } else {
                    assert_eq!(*status, StatusCode::CONFLICT, "{body}");
                    assert_eq!(body["error"]["code"], "tool_call_id_conflict", "{body}");
                    assert_eq!(body["error"]["details"]["invocation_id"], id, "{body}");
                }
            }
            reads.push(id.as_str().unwrap().to_owned());
            continue;
        }
        let (_, status, body) = &answers[0];
        assert_eq!(*status, StatusCode::CREATED, "{body}");
        if call_id.starts_with("write-") {
            assert_eq!(body["status"], "awaiting_approval", "{body}");
            let approval = t.get(&format!("/v1/approvals/{}", body["approval_id"].as_str().unwrap()), &token).await;
            assert_eq!(approval.status, StatusCode::OK, "{approval:?}");
            let frozen = &approval.body["invocation"];
            assert_eq!(frozen["invocation_id"], body["invocation_id"]);
            assert_eq!(frozen["tool_id"], "write_file");
            assert_eq!(frozen["tool_call_id"], call_id.as_str());
            assert_eq!(frozen["input_hash"], body["input_hash"]);
        } else {
            reads.push(body["invocation_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(reads.len(), 4 * 11);
    for id in &reads {
        let done = t.get(&format!("/v1/invocations/{id}?wait_ms=20000"), &token).await;
        assert_eq!(done.body["status"], "completed", "{done:?}");
        assert_eq!(done.body["evidence_ids"].as_array().unwrap().len(), 1, "{done:?}");
    }

    // Every run's events: ids 1..n without a gap, and per invocation frozen → started →
    // completed → evidence in that order.
    let mut conn = sqlx::AnyConnection::connect(&t.db.url).await.unwrap();
    for (run, _) in &runs {
        let rows: Vec<(i64, String, String)> =
            sqlx::query_as("SELECT seq, type, data FROM events WHERE run_id = $1 ORDER BY seq")
                .bind(run)
                .fetch_all(&mut conn)
                .await
                .unwrap();
        for (i, (seq, _, _)) in rows.iter().enumerate() {
            assert_eq!(*seq, i as i64 + 1, "{run}: gapless ids");
        }
        let mut seen: HashMap<String, Vec<String>> = HashMap::new();
        for (_, kind, data) in &rows {
            let data: Value = serde_json::from_str(data).unwrap();
            if let Some(id) = data["invocation_id"].as_str() {
                seen.entry(id.to_owned()).or_default().push(kind.clone());
            }
        }
        for (id, kinds) in seen {
            if reads.contains(&id) {
                assert_eq!(
                    kinds,
                    ["invocation.frozen", "execution.started", "execution.completed", "evidence.recorded"],
                    "{id}"
                );
            } else {
                assert_eq!(kinds, ["invocation.frozen", "approval.requested"], "{id}");
            }
        }
    }
    conn.close().await.unwrap();
}

async fn revoked_tokens_stop_working(backend: Backend) {
    let t = common::spawn(backend).await;
    let token = t.user("revokee").await;
    let other = t.user("revokee2").await;
    // Both tokens are cached by their first use.
    assert_eq!(t.get("/v1/runs", &token).await.status, StatusCode::OK);
    assert_eq!(t.get("/v1/runs", &other).await.status, StatusCode::OK);
    let store = &t.app().store;
    let id_of = |token: &str| {
        let hash = mira::auth::hash_token(token);
        async move { store.identity_by_token(&hash).await.unwrap().unwrap().token_id }
    };

    // Revoked on this server: refused at the very next request.
    let token_id = id_of(&token).await;
    assert!(store.revoke_token(&token_id).await.unwrap());
    assert_eq!(t.get("/v1/runs", &token).await.status, StatusCode::UNAUTHORIZED);
    assert!(!store.revoke_token(&token_id).await.unwrap(), "already revoked");

    // Revoked elsewhere (another replica, or by hand in the database): refused within the
    // cache's bound.
    assert_eq!(t.get("/v1/runs", &other).await.status, StatusCode::OK);
    let other_id = id_of(&other).await;
    let mut conn = sqlx::AnyConnection::connect(&t.db.url).await.unwrap();
    sqlx::query("UPDATE tokens SET revoked_at = 'now' WHERE id = $1").bind(&other_id).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    tokio::time::sleep(mira::store::cache::IDENTITY_TTL + Duration::from_millis(50)).await;
    assert_eq!(t.get("/v1/runs", &other).await.status, StatusCode::UNAUTHORIZED);
    // The admin's token was never touched.
    assert_eq!(t.get("/v1/runs", &t.admin_token).await.status, StatusCode::OK);
}

both_backends!(concurrent_freezes_keep_every_guarantee, revoked_tokens_stop_working);
