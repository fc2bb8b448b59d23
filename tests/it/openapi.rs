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
