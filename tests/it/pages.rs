#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Lists whose rows carry frozen inputs, results or approval previews page by bytes as well as
//! by rows (docs/api.md, Pagination): a page ends with the row that passes
//! `mira::store::PAGE_MAX_BYTES` (1 MiB; the first row always comes), says so with
//! `next_cursor`, and the client pages on. `GET /v1/runs/{id}/invocations`,
//! `GET /v1/approvals` and the approvals stream's snapshot, on SQLite and on Postgres.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Backend, Options, TestApp, TestTool, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

crate::both_backends!(
    invocations_and_approvals_pages_are_bounded_by_bytes,
    approvals_inbox_snapshot_is_bounded_by_bytes
);

/// The text of each big input's `value` (400 KiB: three of them pass 1 MiB).
const BIG: usize = 400 * 1024;

struct Fx {
    t: TestApp,
    token: String,
    run: String,
    /// The invocations, in the order frozen: six big inputs, then four small ones.
    invocations: Vec<String>,
    /// Their approvals, in the same order.
    approvals: Vec<String>,
}

async fn fx(backend: Backend) -> Fx {
    // Bodies up to 4 MiB: one call's input can pass the page budget by itself.
    let t = spawn_with(backend, Options { body_limit: 4 * 1024 * 1024, ..Options::default() }).await;
    t.app().registry.register(Arc::new(TestTool::new("gated_echo", "echoes after approval", true))).unwrap();
    let token = t.user("ada").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "echo").await;
    let (mut invocations, mut approvals) = (Vec::new(), Vec::new());
    for i in 0..10 {
        let value = if i < 6 { format!("{i}").repeat(BIG) } else { format!("small {i}") };
        let r = t.call(&token, &run, &turn, "gated_echo", &format!("c{i}"), json!({ "value": value })).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{}", r.status);
        invocations.push(r.body["invocation_id"].as_str().unwrap().to_owned());
        approvals.push(r.body["approval_id"].as_str().unwrap().to_owned());
    }
    Fx { t, token, run, invocations, approvals }
}

/// Every page of a list from `path` (which has a `?`), following `next_cursor`: each page's
/// items.
async fn pages(t: &TestApp, token: &str, path: &str, list: &str) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_owned(),
        };
        let r = t.get(&url, token).await;
        assert_eq!(r.status, StatusCode::OK, "{url}: {:?}", r.body);
        let items = r.body[list].as_array().unwrap().clone();
        assert!(!items.is_empty(), "{url}: an empty page");
        cursor = r.body["next_cursor"].as_str().map(str::to_owned);
        if let Some(c) = &cursor {
            assert_eq!(c, &id(items.last().unwrap()), "the cursor is the page's last id");
        }
        out.push(items);
        if cursor.is_none() {
            return out;
        }
        assert!(out.len() < 50, "{path}: no end");
    }
}

/// The input text a view shows (its `invocation.input` for an approval).
fn input_len(item: &Value) -> usize {
    let input = if item["invocation"].is_object() { &item["invocation"]["input"] } else { &item["input"] };
    input.to_string().len()
}

/// Each page but the last holds at least the budget, and less without its last row.
fn assert_budgeted(pages: &[Vec<Value>]) {
    let budget = usize::try_from(mira::store::PAGE_MAX_BYTES).unwrap();
    for (n, page) in pages.iter().enumerate() {
        let sizes: Vec<usize> = page.iter().map(input_len).collect();
        let before_last: usize = sizes[..sizes.len() - 1].iter().sum();
        assert!(before_last < budget, "page {n}: {sizes:?} goes on past the budget");
        if n + 1 < pages.len() && page.len() < 200 {
            assert!(before_last + sizes[sizes.len() - 1] >= budget, "page {n}: {sizes:?} ends before the budget");
        }
    }
}

/// An item's id: an approval's `id`, an invocation's `invocation_id`.
fn id(item: &Value) -> String {
    item.get("invocation_id").unwrap_or(&item["id"]).as_str().unwrap().to_owned()
}

fn ids(pages: &[Vec<Value>]) -> Vec<String> {
    pages.iter().flatten().map(id).collect()
}

async fn invocations_and_approvals_pages_are_bounded_by_bytes(backend: Backend) {
    let f = fx(backend).await;
    let (t, token) = (&f.t, &f.token);

    // Three 400 KiB inputs pass 1 MiB: pages of 3, 3 and the 4 small ones, every row once, in order.
    let invocations = pages(t, token, &format!("/v1/runs/{}/invocations?limit=200", f.run), "invocations").await;
    assert_eq!(invocations.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 4]);
    assert_eq!(ids(&invocations), f.invocations);
    assert_budgeted(&invocations);
    assert_eq!(invocations[0][0]["input"]["value"].as_str().map(str::len), Some(BIG), "rows come whole");

    // The row limit still applies.
    let r = t.get(&format!("/v1/runs/{}/invocations?limit=2", f.run), token).await;
    assert_eq!(r.body["invocations"].as_array().unwrap().len(), 2);
    assert_eq!(r.body["next_cursor"].as_str(), Some(f.invocations[1].as_str()));

    // The approvals inbox pages alike (inputs and previews).
    let approvals = pages(t, token, "/v1/approvals?status=pending&limit=200", "approvals").await;
    assert_eq!(approvals.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 4]);
    assert_eq!(ids(&approvals), f.approvals);
    assert_budgeted(&approvals);
    let one_run = pages(t, token, &format!("/v1/approvals?run_id={}&limit=5", f.run), "approvals").await;
    assert_eq!(one_run.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 4]);

    // A row bigger than the budget comes whole, on a page of its own.
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, "echo").await;
    for (call, value) in [("huge", "h".repeat(1536 * 1024)), ("small", "s".to_owned())] {
        let r = t.call(token, &run, &turn, "gated_echo", call, json!({ "value": value })).await;
        assert_eq!(r.body["status"], "awaiting_approval", "{}", r.status);
    }
    let huge = pages(t, token, &format!("/v1/runs/{run}/invocations?limit=200"), "invocations").await;
    assert_eq!(huge.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(huge[0][0]["input"]["value"].as_str().map(str::len), Some(1536 * 1024));
}

/// The SSE events of `stream` until `n` arrived or `timeout` passed: (event, data).
async fn sse_events(stream: &mut reqwest::Response, n: usize, timeout: Duration) -> Vec<(String, Value)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while out.len() < n {
        let chunk = match tokio::time::timeout_at(deadline, stream.chunk()).await {
            Ok(Ok(Some(c))) => c,
            _ => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some((_, event, data)) = crate::common::next_sse_block(&mut buf) {
            if !event.is_empty() {
                out.push((event, data));
            }
        }
    }
    out
}

fn snapshot_ids(snapshot: &Value) -> Vec<String> {
    snapshot["approvals"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

async fn approvals_inbox_snapshot_is_bounded_by_bytes(backend: Backend) {
    let f = fx(backend).await;
    let (t, token) = (&f.t, &f.token);
    let mut stream = t.client.get(format!("{}/v1/approvals/stream", t.base)).bearer_auth(token).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let first = sse_events(&mut stream, 1, Duration::from_secs(10)).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, "approvals");
    // The first page of the inbox, as `GET /v1/approvals?status=pending&limit=200` answers it.
    assert_eq!(snapshot_ids(&first[0].1), f.approvals[..3]);
    assert_eq!(first[0].1["next_cursor"].as_str(), Some(f.approvals[2].as_str()));
    assert_eq!(first[0].1["approvals"][0]["invocation"]["input"]["value"].as_str().map(str::len), Some(BIG));

    // Denying the first approval moves the page on by one.
    let d = t.post(&format!("/v1/approvals/{}/deny", f.approvals[0]), token, json!({"reason": "no"})).await;
    assert_eq!(d.status, StatusCode::OK, "{d:?}");
    let next = sse_events(&mut stream, 1, Duration::from_secs(10)).await;
    assert_eq!(next.len(), 1, "a snapshot after the denial");
    assert_eq!(snapshot_ids(&next[0].1), f.approvals[1..4]);
    assert_eq!(next[0].1["next_cursor"].as_str(), Some(f.approvals[3].as_str()));
}
