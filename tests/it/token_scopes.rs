#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Token scopes (`plan`, `approve`, `manage`), over HTTP on SQLite and on Postgres.
//!
//! - A `plan` token (an agent's) freezes a call that needs approval but cannot grant or deny
//!   it, nor make tokens, nor revoke another token (403 `token_scope_missing`, details
//!   `{"needed": …}`); it can always revoke itself.
//! - A token makes tokens with its own scopes or fewer; the default is its own.
//! - Revoking a token revokes the tokens it made (and theirs), and their open streams end.
//! - Tokens made before scopes existed, and the tokens made with a user, hold all three.
//! - A token without `plan` reaches only who-am-I, the tokens and the approvals.

use crate::common;

use std::time::Duration;

use common::{Backend, TestApp, spawn};
use reqwest::StatusCode;
use serde_json::{Value, json};

both_backends!(
    a_plan_token_freezes_but_cannot_decide_or_manage,
    a_token_makes_tokens_with_its_scopes_or_fewer,
    revoking_a_token_revokes_the_tokens_it_made_and_ends_their_streams,
    tokens_made_before_scopes_and_with_users_hold_every_scope,
    a_token_without_plan_reaches_only_tokens_and_approvals,
    an_admins_plan_token_has_no_admin_power_and_cannot_repoint_what_needs_manage,
);

/// A new token of `token`'s user with `scopes`: (id, secret).
async fn token_with(t: &TestApp, token: &str, scopes: Value) -> (String, String) {
    let r = t.post("/v1/tokens", token, json!({"label": "scoped", "scopes": scopes})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["scopes"], scopes, "{r:?}");
    (r.body["id"].as_str().unwrap().to_owned(), r.body["secret"].as_str().unwrap().to_owned())
}

fn assert_scope_missing(r: &common::Resp, needed: &str) {
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "token_scope_missing"), "{r:?}");
    assert_eq!(r.body["error"]["details"], json!({"needed": needed}), "{r:?}");
    assert!(r.body["error"]["message"].as_str().unwrap().contains(needed), "{r:?}");
}

async fn a_plan_token_freezes_but_cannot_decide_or_manage(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let (plan_id, plan) = token_with(&t, &alice, json!(["plan"])).await;
    let me = t.get("/v1/me", &plan).await;
    assert_eq!((me.body["scopes"].clone(), me.body["token_id"].as_str()), (json!(["plan"]), Some(plan_id.as_str())));

    // The agent's token plans: a run, a turn, a call frozen awaiting approval.
    let run = t.run(&plan).await;
    let (turn, _) = t.turn(&plan, &run, "edit the files").await;
    let r = t.call(&plan, &run, &turn, "write_file", "c1", json!({"path": "x.txt", "content": "agent"})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{r:?}");
    let approval = r.body["approval_id"].as_str().unwrap().to_owned();
    let triple = json!({"tool_id": "write_file", "tool_call_id": "c1", "input_hash": r.body["input_hash"]});

    // It sees the approval, but deciding it needs `approve`: nothing changes.
    let seen = t.get(&format!("/v1/approvals/{approval}"), &plan).await;
    assert_eq!(seen.status, StatusCode::OK, "{seen:?}");
    assert_scope_missing(&t.post(&format!("/v1/approvals/{approval}/grant"), &plan, triple.clone()).await, "approve");
    assert_scope_missing(&t.post(&format!("/v1/approvals/{approval}/deny"), &plan, json!({})).await, "approve");
    // An unknown approval is refused the same way (nothing is told of it).
    let unknown = "/v1/approvals/apr_0123456789abcdef0123456789abcdef/grant";
    assert_scope_missing(&t.post(unknown, &plan, triple.clone()).await, "approve");
    let still = t.get(&format!("/v1/approvals/{approval}"), &alice).await;
    assert_eq!(still.body["status"], "pending", "{still:?}");
    assert!(!t.workspace.join("x.txt").exists());

    // Nor can it make tokens, nor revoke another of the user's.
    assert_scope_missing(&t.post("/v1/tokens", &plan, json!({"scopes": ["plan"]})).await, "manage");
    assert_scope_missing(&t.post("/v1/tokens", &plan, json!({})).await, "manage");
    let alice_id = t.get("/v1/me", &alice).await.body["token_id"].as_str().unwrap().to_owned();
    assert_scope_missing(&t.post(&format!("/v1/tokens/{alice_id}/revoke"), &plan, json!({})).await, "manage");
    assert_eq!(t.get("/v1/me", &alice).await.status, StatusCode::OK);

    // The person's token (every scope) grants it.
    let g = t.post(&format!("/v1/approvals/{approval}/grant"), &alice, triple).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = t.wait_final(&alice, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");

    // A token can always revoke itself.
    let r = t.post(&format!("/v1/tokens/{plan_id}/revoke"), &plan, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(t.get("/v1/me", &plan).await.status, StatusCode::UNAUTHORIZED);
}

async fn a_token_makes_tokens_with_its_scopes_or_fewer(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let alice_id = t.get("/v1/me", &alice).await.body["token_id"].as_str().unwrap().to_owned();
    // The default is the caller's own scopes; the maker is recorded.
    let r = t.post("/v1/tokens", &alice, json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["scopes"], json!(["plan", "approve", "manage"]), "{r:?}");
    assert_eq!(r.body["parent_token_id"].as_str(), Some(alice_id.as_str()), "{r:?}");

    // A manage token without approve cannot make one with approve (nor with everything).
    let (_, manager) = token_with(&t, &alice, json!(["plan", "manage"])).await;
    assert_scope_missing(&t.post("/v1/tokens", &manager, json!({"scopes": ["approve"]})).await, "approve");
    assert_scope_missing(
        &t.post("/v1/tokens", &manager, json!({"scopes": ["manage", "approve", "plan"]})).await,
        "approve",
    );
    // Its default is its own scopes; a subset is fine.
    let r = t.post("/v1/tokens", &manager, json!({})).await;
    assert_eq!((r.status, r.body["scopes"].clone()), (StatusCode::CREATED, json!(["plan", "manage"])), "{r:?}");
    token_with(&t, &manager, json!(["plan"])).await;

    // No scope at all, or an unknown one, is a bad request.
    let r = t.post("/v1/tokens", &alice, json!({"scopes": []})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{r:?}");
    let r = t.post("/v1/tokens", &alice, json!({"scopes": ["root"]})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{r:?}");

    // The list shows each token's scopes and maker.
    let list = t.get("/v1/tokens", &alice).await.body;
    let tokens = list["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5, "{list}");
    assert!(tokens.iter().all(|t| t["scopes"].is_array()), "{list}");
    let initial = tokens.iter().find(|t| t["id"] == alice_id.as_str()).unwrap();
    assert_eq!(
        (initial["scopes"].clone(), initial["parent_token_id"].clone()),
        (json!(["plan", "approve", "manage"]), Value::Null)
    );
}

async fn revoking_a_token_revokes_the_tokens_it_made_and_ends_their_streams(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let (parent_id, parent) = token_with(&t, &alice, json!(["plan", "manage"])).await;
    let (child_id, child) = token_with(&t, &parent, json!(["plan", "manage"])).await;
    let (_, grandchild) = token_with(&t, &child, json!(["plan"])).await;
    let (_, sibling) = token_with(&t, &alice, json!(["plan"])).await;
    let run = t.run(&child).await;

    // The child's and the grandchild's open streams.
    let open = |token: String, path: String| {
        let req = t.client.get(format!("{}{path}", t.base)).bearer_auth(token);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r
        }
    };
    let streams = [
        open(child.clone(), format!("/v1/runs/{run}/events")).await,
        open(grandchild.clone(), "/v1/approvals/stream".to_owned()).await,
    ];
    let kept = open(sibling.clone(), "/v1/approvals/stream".to_owned()).await;

    let started = std::time::Instant::now();
    let r = t.post(&format!("/v1/tokens/{parent_id}/revoke"), &alice, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    for token in [&parent, &child, &grandchild] {
        let me = t.get("/v1/me", token).await;
        assert_eq!((me.status, me.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "{me:?}");
    }
    for stream in streams {
        let (events, closed) = common::until_closed(stream, Duration::from_secs(20)).await;
        assert!(closed, "a descendant's stream was still open 20 s later: {events:?}");
        assert!(started.elapsed() < Duration::from_secs(4), "ended {:?} after the revocation", started.elapsed());
        let (event, data) = events.last().unwrap();
        assert_eq!((event.as_str(), data["code"].as_str()), ("error", Some("unauthorized")), "{events:?}");
    }
    let list = t.get("/v1/tokens", &alice).await.body;
    let child_row = list["tokens"].as_array().unwrap().iter().find(|t| t["id"] == child_id.as_str()).unwrap().clone();
    assert!(child_row["revoked_at"].is_string(), "{child_row}");
    assert_eq!(child_row["parent_token_id"].as_str(), Some(parent_id.as_str()));

    // Tokens not made by it stay valid, and their streams open.
    assert_eq!(t.get("/v1/me", &alice).await.status, StatusCode::OK);
    assert_eq!(t.get("/v1/me", &sibling).await.status, StatusCode::OK);
    let (events, closed) = common::until_closed(kept, Duration::from_secs(1)).await;
    assert!(!closed, "the stream of a valid token ended: {events:?}");

    // A revoked token makes nothing more.
    let r = t.post("/v1/tokens", &child, json!({})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{r:?}");
}

async fn tokens_made_before_scopes_and_with_users_hold_every_scope(backend: Backend) {
    let t = spawn(backend).await;
    let every = json!(["plan", "approve", "manage"]);
    // The bootstrap admin's token and a created user's first token.
    assert_eq!(t.get("/v1/me", &t.admin_token).await.body["scopes"], every);
    let alice = t.user("alice").await;
    assert_eq!(t.get("/v1/me", &alice).await.body["scopes"], every);
    let user_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();

    // A token row written as before migration 0033 (no scopes, no maker): the column's
    // default, which the migration gave every existing row, is all three.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    let old = "mira_a_token_from_before_scopes";
    sqlx::query("INSERT INTO tokens (id, user_id, token_sha256, label, created_at) VALUES ($1, $2, $3, $4, $5)")
        .bind("tok_0123456789abcdef0123456789abcdef")
        .bind(&user_id)
        .bind(mira::auth::hash_token(old))
        .bind("old")
        .bind(mira::ids::now())
        .execute(&pool)
        .await
        .unwrap();
    let ident = t.app().store.identity_by_token(&mira::auth::hash_token(old)).await.unwrap().unwrap();
    assert_eq!(ident.scopes, mira::auth::Scopes::ALL);
    assert_eq!(t.get("/v1/me", old).await.body["scopes"], every);
    // It still makes tokens and decides: a token made by it is revoked with it.
    let (_, made) = token_with(&t, old, json!(["plan"])).await;
    let r = t.post("/v1/tokens/tok_0123456789abcdef0123456789abcdef/revoke", old, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(t.get("/v1/me", &made).await.status, StatusCode::UNAUTHORIZED);
}

async fn a_token_without_plan_reaches_only_tokens_and_approvals(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let (_, approver) = token_with(&t, &alice, json!(["approve"])).await;
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "edit the files").await;
    let r = t.call(&alice, &run, &turn, "write_file", "c1", json!({"path": "y.txt", "content": "person"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let approval = r.body["approval_id"].as_str().unwrap().to_owned();

    // Planning needs `plan`.
    assert_scope_missing(&t.post("/v1/runs", &approver, json!({"title": "x"})).await, "plan");
    assert_scope_missing(&t.get(&format!("/v1/runs/{run}"), &approver).await, "plan");
    let r2 = t.call(&approver, &run, &turn, "write_file", "c2", json!({"path": "z.txt", "content": "no"})).await;
    assert_scope_missing(&r2, "plan");
    // Who am I, the approvals and deciding them do not.
    assert_eq!(t.get("/v1/me", &approver).await.status, StatusCode::OK);
    assert_eq!(t.get("/v1/tokens", &approver).await.status, StatusCode::OK);
    assert_eq!(t.get("/v1/approvals?status=pending", &approver).await.status, StatusCode::OK);
    let g = t
        .post(
            &format!("/v1/approvals/{approval}/grant"),
            &approver,
            json!({"tool_id": "write_file", "tool_call_id": "c1", "input_hash": r.body["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
}

/// An admin's `plan` token (an agent's) acts as an ordinary user's: no admin-only operation,
/// no admin rule (internal addresses, any MCP command). And routes that would let a `plan`
/// token send a stored credential elsewhere, accept for a person, or enroll a device need
/// `manage` too — checked before the object is looked at.
async fn an_admins_plan_token_has_no_admin_power_and_cannot_repoint_what_needs_manage(backend: Backend) {
    let t = spawn(backend).await;
    let admin = t.admin_token.clone();
    let (_, plan) = token_with(&t, &admin, json!(["plan"])).await;
    let me = t.get("/v1/me", &plan).await;
    assert_eq!(me.status, StatusCode::OK, "{me:?}");
    let r = t.get("/metrics", &plan).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    let r = t.client.get(format!("{}/metrics", t.base)).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Admins register any folder; this token only inside the roots (none here).
    let r = t.post("/v1/workspaces", &plan, json!({"name": "etc", "path": "/etc"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "workspace_path_not_allowed"), "{r:?}");

    let id = "x_0123456789abcdef0123456789abcdef";
    let needs_manage: [(&str, String, Value); 6] = [
        ("PATCH", format!("/v1/connections/{id}"), json!({"settings": {}})),
        ("PATCH", format!("/v1/mcp/servers/{id}"), json!({"default_agent_access": true})),
        ("POST", format!("/v1/mcp/servers/{id}/disclaimer/accept"), json!({})),
        ("PUT", format!("/v1/mcp/servers/{id}/tools/t/agent-access"), json!({"enabled": true})),
        ("POST", "/v1/devices".to_owned(), json!({"name": "laptop"})),
        ("POST", format!("/v1/devices/{id}/enrollment-code"), json!({})),
    ];
    for (method, path, body) in needs_manage {
        let r = t
            .client
            .request(method.parse().unwrap(), format!("{}{path}", t.base))
            .bearer_auth(&plan)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("token_scope_missing")),
            "{method} {path}: {v}"
        );
        assert_eq!(v["error"]["details"], json!({"needed": "manage"}), "{method} {path}: {v}");
    }
    // With `manage` the same route goes on to look at the object.
    let r = t.post("/v1/devices", &admin, json!({"name": "laptop"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}
