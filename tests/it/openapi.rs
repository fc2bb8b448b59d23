//! The committed OpenAPI document must equal the one generated from the code, and the
//! service must serve the same document. Regenerate with
//! `cargo run -q -- openapi > openapi/openapi.json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

#[test]
fn committed_openapi_matches_the_code() {
    let generated: serde_json::Value = serde_json::to_value(mira::http::openapi()).unwrap();
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json")).unwrap(),
    )
    .unwrap();
    assert!(
        generated == committed,
        "openapi/openapi.json is stale: run `cargo run -q -- openapi > openapi/openapi.json`"
    );
}

#[tokio::test]
async fn served_document_is_the_generated_one() {
    let t = common::spawn(common::Backend::Sqlite).await;
    let served: serde_json::Value =
        t.client.get(format!("{}/openapi.json", t.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(served, serde_json::to_value(mira::http::openapi()).unwrap());
    for path in
        ["/v1/runs/{run_id}/invocations", "/v1/approvals/{approval_id}/grant", "/v1/runs/{run_id}/events", "/readyz"]
    {
        assert!(served["paths"].get(path).is_some(), "{path} missing");
    }
}

/// utoipa names a schema after its Rust type, so two types of the same name (in different
/// modules) silently share one component — one of them then documents the other's shape. Every
/// `ToSchema` type must have a name of its own (or a `#[schema(as = …)]`).
#[test]
fn no_two_schemas_share_a_name() {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    files(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")), &mut all);
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut clashes = Vec::new();
    for file in all {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !(line.contains("derive(") && line.contains("ToSchema")) {
                continue;
            }
            // The item after the derive (attributes and doc lines may come between).
            let mut renamed = None;
            for next in lines.iter().skip(i + 1).take(12) {
                let t = next.trim();
                if let Some(rest) = t.strip_prefix("#[schema(as = ") {
                    renamed = Some(rest.trim_end_matches(")]").trim().to_owned());
                }
                let item = t.strip_prefix("pub ").unwrap_or(t);
                let name = item
                    .strip_prefix("struct ")
                    .or_else(|| item.strip_prefix("enum "))
                    .map(|r| r.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or("").to_owned());
                if let Some(name) = name {
                    let name = renamed.take().unwrap_or(name);
                    let at = format!("{}:{}", file.display(), i + 1);
                    if let Some(prev) = seen.insert(name.clone(), at.clone()) {
                        clashes.push(format!("{name}: {prev} and {at}"));
                    }
                    break;
                }
            }
        }
    }
    assert!(seen.len() > 40, "found only {} schema types", seen.len());
    assert!(clashes.is_empty(), "schema names used twice: {clashes:?}");
}

/// Every operation documents the answers of the shared machinery (see
/// `mira::http::openapi`): 401 when secured, 400 with parameters or a body, 413/415 with a
/// body, 429 on streams, 503 everywhere — each error with the error body's schema.
#[test]
fn every_operation_documents_the_common_answers() {
    let doc = serde_json::to_value(mira::http::openapi()).unwrap();
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let r = &op["responses"];
            let mut want = vec!["503"];
            if op["security"].as_array().is_some_and(|s| !s.is_empty()) {
                want.push("401");
            }
            if op.get("requestBody").is_some() {
                want.extend(["400", "413", "415"]);
            }
            if op.pointer("/responses/200/content/text~1event-stream").is_some() {
                want.push("429");
            }
            for status in want {
                if r.get(status).is_none() {
                    missing.push(format!("{method} {path} {status}"));
                }
            }
            for (status, resp) in r.as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        resp.pointer("/content/application~1json/schema/$ref").and_then(|v| v.as_str()),
                        Some("#/components/schemas/ErrorResponse"),
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    assert!(missing.is_empty(), "undocumented: {missing:?}");
}
