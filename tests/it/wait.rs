//! `GET /v1/invocations/{id}?wait_ms=N`: answered as soon as the invocation is final or
//! awaits approval (woken by the run's committed events), or when N runs out; bad values
//! are 400 `invalid_query`. On both back-ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{self, Backend, TestTool};

async fn wait_answers_when_final_or_awaiting(backend: Backend) {
    let t = common::spawn(backend).await;
    let token = t.admin_token.clone();
    let mut slow = TestTool::new("slow_echo", "echoes its input after a while", false);
    slow.delay = Duration::from_millis(600);
    t.app().registry.register(Arc::new(slow)).unwrap();
    // Runs until the test lets it finish: still unfinished when a short wait runs out,
    // however slowly the machine answers that wait.
    let (held, release) = TestTool::new("held_echo", "echoes its input when let go", false).gated();
    t.app().registry.register(Arc::new(held)).unwrap();
    t.app().registry.register(Arc::new(TestTool::new("gated_echo", "an action that needs approval", true))).unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "echo things").await;

    // Final: the wait returns the completed call, well before wait_ms.
    let r = t.call(&token, &run, &turn, "slow_echo", "a", json!({"value": "x"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["invocation_id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    let w = t.get(&format!("/v1/invocations/{id}?wait_ms=20000"), &token).await;
    let took = t0.elapsed();
    assert_eq!(w.status, StatusCode::OK, "{w:?}");
    assert_eq!(w.body["status"], "completed", "{w:?}");
    assert_eq!(w.body["evidence_ids"].as_array().unwrap().len(), 1);
    assert!(took < Duration::from_secs(10), "answered when final, not at wait_ms: {took:?}");

    // Time runs out first: the current (unfinished) state, after about wait_ms.
    let r = t.call(&token, &run, &turn, "held_echo", "b", json!({"value": "y"})).await;
    let id_b = r.body["invocation_id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    let w = t.get(&format!("/v1/invocations/{id_b}?wait_ms=150"), &token).await;
    let took = t0.elapsed();
    assert_eq!(w.status, StatusCode::OK, "{w:?}");
    assert!(matches!(w.body["status"].as_str(), Some("queued" | "running")), "{w:?}");
    assert!(took >= Duration::from_millis(150), "{took:?}");
    // No wait_ms (and wait_ms=0): at once.
    let w = t.get(&format!("/v1/invocations/{id_b}?wait_ms=0"), &token).await;
    assert_eq!(w.status, StatusCode::OK);
    release.add_permits(1);
    let done = t.get(&format!("/v1/invocations/{id_b}?wait_ms=20000"), &token).await;
    assert_eq!(done.body["status"], "completed", "{done:?}");

    // Awaiting approval: answered at once, although wait_ms is long.
    let r = t.call(&token, &run, &turn, "gated_echo", "c", json!({"value": "z"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let id_c = r.body["invocation_id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    let w = t.get(&format!("/v1/invocations/{id_c}?wait_ms=30000"), &token).await;
    assert_eq!(w.body["status"], "awaiting_approval", "{w:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // A waiter is woken by a decision made while it waits: grant, then completed.
    let waiter = {
        let (client, base, token, id) = (t.client.clone(), t.base.clone(), token.clone(), id_c.clone());
        tokio::spawn(async move {
            // Granted → queued → running → completed: the wait ends on the final status.
            client
                .get(format!("{base}/v1/invocations/{id}?wait_ms=20000"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    };
    let g = t
        .post(
            &format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"tool_id": "gated_echo", "tool_call_id": "c", "input_hash": r.body["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let woke = waiter.await.unwrap();
    // The waiter may have read the row before the grant (awaiting_approval, answered at once)
    // or after it (then it waits for the final status).
    assert!(matches!(woke["status"].as_str(), Some("awaiting_approval" | "completed")), "{woke}");
    let done = t.get(&format!("/v1/invocations/{id_c}?wait_ms=20000"), &token).await;
    assert_eq!(done.body["status"], "completed", "{done:?}");

    // A cancel while it waits: the waiter answers `cancelled` (the tool honours its token).
    let mut long = TestTool::new("long_echo", "echoes after a long while", false);
    long.delay = Duration::from_secs(20);
    t.app().registry.register(Arc::new(long)).unwrap();
    let (turn2, _) = t.turn(&token, &run, "echo slowly").await;
    let r = t.call(&token, &run, &turn2, "long_echo", "d", json!({"value": "w"})).await;
    let id_d = r.body["invocation_id"].as_str().unwrap().to_owned();
    let waiter = {
        let (client, base, token, id) = (t.client.clone(), t.base.clone(), token.clone(), id_d.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let v = client
                .get(format!("{base}/v1/invocations/{id}?wait_ms=25000"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap();
            (v, t0.elapsed())
        })
    };
    let c = t.post(&format!("/v1/invocations/{id_d}/cancel"), &token, json!({})).await;
    assert!(c.status == StatusCode::OK, "{c:?}");
    let (v, took) = waiter.await.unwrap();
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(took < Duration::from_secs(15), "woken by the cancel, not by wait_ms: {took:?}");
}

async fn bad_wait_values_are_400(backend: Backend) {
    let t = common::spawn(backend).await;
    let token = t.admin_token.clone();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read a file").await;
    std::fs::write(t.workspace.join("f.txt"), "one\n").unwrap();
    let r = t.call(&token, &run, &turn, "read_open", "r", json!({"path": "f.txt"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["invocation_id"].as_str().unwrap();
    for bad in ["abc", "-1", "30001", "1.5", "99999999999999999999999"] {
        let w = t.get(&format!("/v1/invocations/{id}?wait_ms={bad}"), &token).await;
        assert_eq!((w.status, w.code()), (StatusCode::BAD_REQUEST, "invalid_query"), "wait_ms={bad}: {w:?}");
    }
    let w = t.get(&format!("/v1/invocations/{id}?wait_ms=30000"), &token).await;
    assert_eq!(w.status, StatusCode::OK, "{w:?}");
    // Someone else's invocation is 404 at once, waiting or not.
    let other = t.user("other").await;
    let w = t.get(&format!("/v1/invocations/{id}?wait_ms=5000"), &other).await;
    assert_eq!(w.status, StatusCode::NOT_FOUND, "{w:?}");
}

both_backends!(wait_answers_when_final_or_awaiting, bad_wait_values_are_400);
