//! `GET /metrics`: admin only; real counters move after real calls (HTTP requests by route
//! template, invocations by tool and final status, approval wait time, queue depth, open
//! event streams, MCP connections by state, the replica heartbeat), on both back-ends; no
//! user id, token, run id or input in the text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Backend, TestApp, TestTool, spawn};

/// The sum of the samples of `name` whose labels include every `labels` pair (0 when none).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

async fn scrape(t: &TestApp) -> String {
    let r = t.client.get(format!("{}/metrics", t.base)).bearer_auth(&t.admin_token).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    text
}

/// Scrapes until `pred` holds (10 s at most); returns that scrape.
async fn scrape_until(t: &TestApp, what: &str, pred: impl Fn(&str) -> bool) -> String {
    for _ in 0..200 {
        let text = scrape(t).await;
        if pred(&text) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} never showed in /metrics:\n{}", scrape(t).await);
}

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("{key} in {v}")).to_owned()
}

async fn metrics_count_real_calls(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;

    // Access: an admin token only.
    let anon = t.client.get(format!("{}/metrics", t.base)).send().await.unwrap();
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    let r = t.get("/metrics", &alice).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");

    let before = scrape(&t).await;
    let probe = TestTool::new("metrics_probe", "a metrics probe action that needs approval", true);
    let runs = probe.runs.clone();
    t.app().registry.register(Arc::new(probe)).unwrap();
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "metrics probe action").await;
    let secret_input = "input-text-that-must-not-leak";
    let a = t.call(&alice, &run, &turn, "metrics_probe", "probe-1", json!({"value": secret_input})).await;
    assert_eq!((a.status, a.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{a:?}");
    let b = t.call(&alice, &run, &turn, "metrics_probe", "probe-2", json!({"value": "other"})).await;
    assert_eq!(b.status, StatusCode::CREATED, "{b:?}");

    // Queue depth is read from the store at scrape time.
    let waiting = scrape(&t).await;
    assert_eq!(sample(&waiting, "mira_harness_queue", &[("state", "awaiting_approval")]), 2.0, "{waiting}");

    // An open event stream counts while it is open.
    let streams_before = sample(&waiting, "mira_sse_streams_open", &[]);
    let stream = t.client.get(format!("{}/v1/runs/{run}/events", t.base)).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    scrape_until(&t, "the open stream", |m| sample(m, "mira_sse_streams_open", &[]) == streams_before + 1.0).await;

    // Grant one (it executes), deny the other.
    let grant = t
        .post(
            &format!("/v1/approvals/{}/grant", s(&a.body, "approval_id")),
            &alice,
            json!({"tool_id": "metrics_probe", "tool_call_id": "probe-1", "input_hash": s(&a.body, "input_hash")}),
        )
        .await;
    assert_eq!(grant.status, StatusCode::OK, "{grant:?}");
    let done = t.wait_final(&alice, &s(&a.body, "invocation_id")).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let deny =
        t.post(&format!("/v1/approvals/{}/deny", s(&b.body, "approval_id")), &alice, json!({"reason": "no"})).await;
    assert_eq!(deny.status, StatusCode::OK, "{deny:?}");
    assert_eq!(t.get("/no/such/route", &alice).await.status, StatusCode::NOT_FOUND);

    // An External MCP server that cannot be reached: counted by connection state.
    let mcp = t
        .post(
            "/v1/mcp/servers",
            &t.admin_token,
            json!({"name": "unreachable", "transport": {"http": {"url": "http://127.0.0.1:9/mcp"}}}),
        )
        .await;
    assert_eq!(mcp.status, StatusCode::CREATED, "{mcp:?}");

    let after = scrape_until(&t, "the finished invocation and the MCP connection", |m| {
        sample(m, "mira_invocations_finished_total", &[("tool", "metrics_probe"), ("status", "completed")]) == 1.0
            && sample(m, "mira_mcp_connections", &[]) == 1.0
    })
    .await;
    let delta = |name: &str, labels: &[(&str, &str)]| sample(&after, name, labels) - sample(&before, name, labels);
    assert_eq!(delta("mira_invocations_finished_total", &[("tool", "metrics_probe"), ("status", "denied")]), 1.0);
    assert_eq!(delta("mira_approval_wait_seconds_count", &[("decision", "granted")]), 1.0, "{after}");
    assert_eq!(delta("mira_approval_wait_seconds_count", &[("decision", "denied")]), 1.0, "{after}");
    assert!(sample(&after, "mira_approval_wait_seconds_sum", &[("decision", "granted")]) > 0.0, "{after}");
    let freeze = [("method", "POST"), ("route", "/v1/runs/{run_id}/invocations"), ("status", "201")];
    assert_eq!(delta("mira_http_requests_total", &freeze), 2.0, "{after}");
    assert_eq!(delta("mira_http_request_duration_seconds_count", &freeze), 2.0, "{after}");
    assert_eq!(delta("mira_http_requests_total", &[("method", "GET"), ("route", "unmatched"), ("status", "404")]), 1.0);
    assert_eq!(delta("mira_http_requests_total", &[("route", "/metrics"), ("status", "403")]), 0.0);
    assert_eq!(sample(&after, "mira_harness_queue", &[("state", "awaiting_approval")]), 0.0, "{after}");
    assert_eq!(sample(&after, "mira_harness_queue", &[("state", "queued")]), 0.0, "{after}");

    // The heartbeat names this replica's node id and is recent.
    let node = std::fs::read_to_string(t.data_dir.join("node.id")).unwrap();
    let beat = sample(&after, "mira_replica_heartbeat_timestamp_seconds", &[("node", node.trim())]);
    let now = chrono::Utc::now().timestamp() as f64;
    assert!((now - beat).abs() < 60.0, "heartbeat {beat} vs now {now}");

    // Closing the stream releases it.
    drop(stream);
    scrape_until(&t, "the closed stream", |m| sample(m, "mira_sse_streams_open", &[]) == streams_before).await;

    // No user id, token, run id, invocation id or input in any label.
    let me = t.get("/v1/me", &alice).await;
    for leak in [s(&me.body, "id"), alice.clone(), run.clone(), s(&a.body, "invocation_id"), secret_input.to_owned()] {
        assert!(!after.contains(&leak), "/metrics shows {leak}");
    }
}

both_backends!(metrics_count_real_calls);
