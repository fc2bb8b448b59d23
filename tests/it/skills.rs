#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `POST /v1/skills` under concurrency, on both back-ends: the per-user skill limit is counted
//! and inserted in one transaction under the user's lock, so simultaneous creates never pass
//! it together. (The skill runtime itself is tested with real MCP tools in `mcp.rs`.)

use std::sync::Arc;

use crate::common::{self, Backend, TestTool};
use reqwest::StatusCode;
use serde_json::json;

async fn skill_limit_holds_under_concurrent_creates(backend: Backend) {
    let t = common::spawn(backend).await;
    let sam = t.user("sam").await;
    let ada = t.user("ada").await;
    // An internal primitive: a tool a skill may make private.
    let tool =
        TestTool::new("skill_race_primitive", "an internal primitive", false).kind(mira::registry::ToolKind::Internal);
    t.app().registry.register(Arc::new(tool)).unwrap();

    let limit = mira::http::skills::MAX_SKILLS_PER_USER;
    let creates = (0..limit * 2).map(|i| {
        t.post("/v1/skills", &sam, json!({"name": format!("s{i}"), "private_tools": ["skill_race_primitive"]}))
    });
    let mut created = 0;
    for r in futures::future::join_all(creates).await {
        match r.status {
            StatusCode::CREATED => created += 1,
            _ => assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "skill_limit"), "{r:?}"),
        }
    }
    assert_eq!(created, limit);
    assert_eq!(t.get("/v1/skills", &sam).await.body["skills"].as_array().unwrap().len(), limit);
    // The limit is per user: another user still creates theirs.
    let r = t.post("/v1/skills", &ada, json!({"name": "s0", "private_tools": ["skill_race_primitive"]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // A name taken is still `name_taken`.
    let r = t.post("/v1/skills", &ada, json!({"name": "s0", "private_tools": ["skill_race_primitive"]})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "name_taken"), "{r:?}");
}

both_backends!(skill_limit_holds_under_concurrent_creates);
