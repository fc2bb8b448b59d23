//! Bad input at the HTTP edge (issue 14.9): text no back-end can store, the catalogue of bad
//! bodies, cursors, and integers a tool cannot represent — the same answers on SQLite and
//! Postgres. The NUL sweep walks the served OpenAPI document, so every operation (new ones
//! included) is tried: each path parameter, each query parameter and each string field of each
//! JSON body gets a NUL (U+0000) in turn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Backend, spawn};

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or(schema),
        None => schema,
    }
}

/// Minimal bodies that each put NUL into one string leaf of `schema` (depth-limited).
fn nul_bodies(doc: &Value, schema: &Value, depth: usize) -> Vec<Value> {
    if depth > 6 {
        return vec![];
    }
    let schema = resolve(doc, schema);
    let mut out = Vec::new();
    for key in ["oneOf", "anyOf", "allOf"] {
        for branch in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.extend(nul_bodies(doc, branch, depth + 1));
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if types.contains(&"string") {
        out.push(json!("a\u{0}b"));
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            for inner in nul_bodies(doc, sub, depth + 1) {
                out.push(json!({ name.clone(): inner }));
            }
        }
    }
    if types.contains(&"array")
        && let Some(items) = schema.get("items")
    {
        for inner in nul_bodies(doc, items, depth + 1) {
            out.push(json!([inner]));
        }
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        out.push(json!({"k\u{0}": null}));
        for inner in nul_bodies(doc, extra, depth + 1) {
            out.push(json!({ "k": inner }));
        }
    }
    out
}

async fn nul_is_refused_by_every_operation(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.admin_token.clone();
    let doc: Value = t.client.get(format!("{}/openapi.json", t.base)).send().await.unwrap().json().await.unwrap();
    let mut tried = 0;
    let mut failures = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Ok(m) = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()) else { continue };
            let params: Vec<&Value> = op["parameters"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
            let path_params: Vec<&str> =
                params.iter().filter(|p| p["in"] == "path").filter_map(|p| p["name"].as_str()).collect();
            let mut concrete = path.clone();
            for p in &path_params {
                concrete = concrete.replace(&format!("{{{p}}}"), "run_0000000000000000000000000000beef");
            }
            let mut cases: Vec<(String, Option<Value>)> = Vec::new();
            for p in &path_params {
                let mut url = path.clone();
                for q in &path_params {
                    let v = if q == p { "a%00b" } else { "run_0000000000000000000000000000beef" };
                    url = url.replace(&format!("{{{q}}}"), v);
                }
                cases.push((url, None));
            }
            for p in params.iter().filter(|p| p["in"] == "query") {
                cases.push((format!("{concrete}?{}=a%00b", p["name"].as_str().unwrap()), None));
            }
            if let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") {
                for body in nul_bodies(&doc, schema, 0) {
                    cases.push((concrete.clone(), Some(body)));
                }
            }
            for (url, body) in cases {
                tried += 1;
                let r = t.request(m.clone(), &url, Some(&token), body.clone()).await;
                let message = r.body["error"]["message"].as_str().unwrap_or("");
                if r.status != StatusCode::BAD_REQUEST || r.code() != "invalid_request" || !message.contains("NUL") {
                    failures.push(format!("{method} {url} {body:?} → {} {}", r.status, r.body));
                }
            }
        }
    }
    assert!(tried > 60, "only {tried} cases");
    assert!(
        failures.is_empty(),
        "{} of {tried} cases were not 400 invalid_request:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The exact cases of the issue (they answered 500 on Postgres), and what still works: a tool
/// input may carry NUL (it is stored as JSON text) and the tool answers for it.
async fn nul_in_named_fields(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read files").await;
    let cases = [
        ("/v1/runs".to_owned(), json!({"title": "a\u{0}"})),
        (format!("/v1/runs/{run}/turns"), json!({"task": "x\u{0}y"})),
        (
            format!("/v1/runs/{run}/invocations"),
            json!({"turn_id": turn, "tool_id": "read_open", "tool_call_id": "c\u{0}", "input": {"path": "a"}}),
        ),
        (
            "/v1/approvals/apr_0000000000000000000000000000beef/grant".to_owned(),
            json!({"tool_id": "write_file", "tool_call_id": "c", "input_hash": "\u{0}"}),
        ),
    ];
    for (path, body) in cases {
        let r = t.post(&path, &token, body).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{path}: {r:?}");
    }
    for path in ["/v1/runs/%00", "/v1/runs?cursor=%00", "/v1/invocations/inv_%00", "/v1/approvals?status=%00"] {
        let r = t.get(path, &token).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{path}: {r:?}");
    }
    // Invalid UTF-8 in a path or a query: refused too, never stored lossily.
    let r = t.get("/v1/runs/%FF", &token).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_path_parameter"), "{r:?}");
    let r = t.get("/v1/runs?cursor=%FF", &token).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{r:?}");
    // The tool input is an opaque document: NUL reaches the tool, which refuses the path.
    let r = t.call(&token, &run, &turn, "read_open", "n1", json!({"path": "a\u{0}b"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_ne!(r.code(), "invalid_request");
    // Nothing was stored: the run list is the one run.
    let runs = t.get("/v1/runs", &token).await;
    assert_eq!(runs.body["runs"].as_array().unwrap().len(), 1, "{runs:?}");
}

/// One code per kind of bad body, whatever the endpoint.
async fn bad_body_catalogue(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("alice").await;
    let url = format!("{}/v1/runs", t.base);
    let send = |ct: Option<&'static str>, body: &'static str| {
        let mut req = t.client.post(&url).bearer_auth(&token).body(body);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            let v: Value = r.json().await.unwrap();
            (status, v["error"]["code"].as_str().unwrap_or("").to_owned())
        }
    };
    let json = Some("application/json");
    let bad = StatusCode::BAD_REQUEST;
    for (ct, body, want) in [
        (None, "", (bad, "invalid_json")),
        (json, "", (bad, "invalid_json")),
        (Some("text/plain"), "  ", (bad, "invalid_json")),
        (json, "{\"title\": ", (bad, "invalid_json")),
        (json, "{\"title\": \"a\"", (bad, "invalid_json")),
        (json, "{} {}", (bad, "invalid_json")),
        (json, "{\"title\": \"\\ud800\"}", (bad, "invalid_json")),
        (json, "[1]", (bad, "invalid_request")),
        (json, "{\"title\": 7}", (bad, "invalid_request")),
        (json, "{\"surprise\": 1}", (bad, "invalid_request")),
        (Some("text/plain"), "{}", (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")),
        (None, "{}", (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")),
        (Some("application/merge-patch+json"), "{}", (StatusCode::CREATED, "")),
    ] {
        let got = send(ct, body).await;
        assert_eq!((got.0, got.1.as_str()), want, "{ct:?} {body:?}");
    }
    // Invalid UTF-8 bytes in a string.
    let r = t
        .client
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(b"{\"title\": \"\xff\"}".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), bad);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_json");
}

/// A cursor that no list produced is 400, not silently the first page.
async fn garbage_cursor_is_refused(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    for list in ["/v1/runs", "/v1/approvals", &format!("/v1/runs/{run}/invocations"), "/v1/terminal-sessions"] {
        for cursor in ["garbage", "run_xyz", "RUN_0000000000000000000000000000beef"] {
            let r = t.get(&format!("{list}?cursor={cursor}"), &token).await;
            assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_query"), "{list} {cursor}: {r:?}");
        }
    }
    // A real cursor still pages.
    t.run(&token).await;
    let first = t.get("/v1/runs?limit=1", &token).await;
    let cursor = first.body["next_cursor"].as_str().unwrap();
    let second = t.get(&format!("/v1/runs?limit=1&cursor={cursor}"), &token).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body["runs"][0]["id"], run);
}

/// `read_open {"start_line": 1e300}` was frozen with `start_line` dropped. Integers beyond
/// what a tool takes are 422 naming the field; integral floats are the integers they denote.
async fn integers_out_of_range_are_422(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read files").await;
    for (i, input) in [
        json!({"path": "a.txt", "start_line": 1e300}),
        json!({"path": "a.txt", "start_line": 1e19}),
        json!({"path": "a.txt", "end_line": 4294967296u64}),
        json!({"path": "a.txt", "max_bytes": 1e300}),
    ]
    .into_iter()
    .enumerate()
    {
        let field = input.as_object().unwrap().keys().find(|k| *k != "path").unwrap().clone();
        let r = t.call(&token, &run, &turn, "read_open", &format!("big{i}"), input.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::UNPROCESSABLE_ENTITY, "input_invalid"), "{input}: {r:?}");
        let errors = r.body["error"]["details"]["errors"].to_string();
        assert!(errors.contains(&format!("/{field}")), "{input}: {errors}");
    }
    // 2.0 is the integer 2: the line range is kept, not dropped.
    let r = t.call(&token, &run, &turn, "read_open", "float", json!({"path": "a.txt", "start_line": 2.0})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["input"]["start_line"], 2, "{r:?}");
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["result"]["output"]["start_line"], 2, "{done}");

    // Beyond ±2^53 two integers share one canonical form (RFC 8785 numbers are doubles), so
    // one input hash: a tool whose schema lets any number through still refuses them.
    let free = crate::common::TestTool::new("free_numbers", "takes any fields", false);
    t.app().registry.register(std::sync::Arc::new(free)).unwrap();
    let (turn, _) = t.turn(&token, &run, "free numbers").await;
    let r = t.call(&token, &run, &turn, "free_numbers", "n1", json!({"deep": [{"n": 9007199254740993u64}]})).await;
    assert_eq!((r.status, r.code()), (StatusCode::UNPROCESSABLE_ENTITY, "input_invalid"), "{r:?}");
    assert!(r.body["error"]["details"]["errors"].to_string().contains("/deep/0/n"), "{r:?}");
    let r = t.call(&token, &run, &turn, "free_numbers", "n2", json!({"n": -9007199254740992i64})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

/// A 400 about one field names it in `details.field`: a missing field, a wrong type, a value
/// too long.
async fn bad_fields_are_named(backend: Backend) {
    let t = spawn(backend).await;
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    let field = |r: &crate::common::Resp| (r.status, r.code().to_owned(), r.body["error"]["details"]["field"].clone());
    let bad = StatusCode::BAD_REQUEST;
    let r = t.post(&format!("/v1/runs/{run}/turns"), &token, json!({})).await;
    assert_eq!(field(&r), (bad, "invalid_request".into(), json!("task")), "{r:?}");
    let r = t.post("/v1/runs", &token, json!({"title": "x".repeat(300)})).await;
    assert_eq!(field(&r), (bad, "invalid_request".into(), json!("title")), "{r:?}");
    let (turn, _) = t.turn(&token, &run, "read files").await;
    let r = t.call(&token, &run, &turn, "read_open", &"c".repeat(1000), json!({"path": "a.txt"})).await;
    assert_eq!(field(&r), (bad, "invalid_request".into(), json!("tool_call_id")), "{r:?}");
    // A body's unknown field, and query parameters: unknown, or of the wrong type.
    let r = t.post("/v1/runs", &token, json!({"surprise": 1})).await;
    assert_eq!(field(&r), (bad, "invalid_request".into(), json!("surprise")), "{r:?}");
    for (query, name) in [("bogus=1", "bogus"), ("limit=abc", "limit")] {
        let r = t.get(&format!("/v1/runs?{query}"), &token).await;
        assert_eq!((r.status, r.code()), (bad, "invalid_query"), "{query}: {r:?}");
        assert_eq!(r.body["error"]["details"]["parameter"], name, "{query}: {r:?}");
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("query parameter {name}: ")), "{message}");
    }
}

both_backends!(
    bad_fields_are_named,
    nul_is_refused_by_every_operation,
    nul_in_named_fields,
    bad_body_catalogue,
    garbage_cursor_is_refused,
    integers_out_of_range_are_422
);

/// Every integer field of every registered tool declares a `maximum` (the convention that
/// keeps 1e300 from being frozen; new tools must follow it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_integer_has_a_maximum() {
    fn walk(tool: &str, at: &str, schema: &Value, missing: &mut Vec<String>) {
        match schema {
            Value::Object(map) => {
                if map.get("type") == Some(&json!("integer")) && !map.contains_key("maximum") {
                    missing.push(format!("{tool}{at}"));
                }
                for (k, v) in map {
                    walk(tool, &format!("{at}/{k}"), v, missing);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(tool, &format!("{at}/{i}"), v, missing);
                }
            }
            _ => {}
        }
    }
    let t = spawn(Backend::Sqlite).await;
    let mut missing = Vec::new();
    for entry in t.app().registry.all() {
        walk(&entry.spec().id, "", &entry.spec().input_schema, &mut missing);
    }
    assert!(missing.is_empty(), "integer fields without a maximum: {missing:?}");
}
