#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `/v1/connections` and the availability it gives the dynamic tools, on both back-ends,
//! through the real GitHub driver (a connection to a port nothing listens on is checked for
//! real and found unreachable): who may see, change and use a connection; shared connections;
//! the credential never leaves the server (not in any answer, not in the clear in the store);
//! the internal-address rule for non-admins; bad bodies; deleting a connection turns its tools
//! back to `no_connection`.

use crate::common::{self, Backend, TestApp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TOKEN: &str = "ghp_connectionsTestSecretValue0123456789";

/// A base URL nothing listens on.
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
}

async fn reason(t: &TestApp, token: &str, tool: &str) -> (String, String) {
    let v = t.get(&format!("/v1/tools/{tool}"), token).await;
    assert_eq!(v.status, StatusCode::OK, "{v:?}");
    (v.body["state"].as_str().unwrap_or("").to_owned(), v.body["reason"]["code"].as_str().unwrap_or("").to_owned())
}

async fn create(t: &TestApp, token: &str, body: Value) -> common::Resp {
    t.post("/v1/connections", token, body).await
}

fn github(base: &str) -> Value {
    json!({"kind": "github", "name": "work", "settings": {"base_url": base}, "credential": {"token": TOKEN}})
}

async fn connections_are_owned_checked_and_sealed(backend: Backend) {
    // The deployment default: user-given addresses must be public (admins aside).
    let mut options = common::Options::default();
    options.runtime.allow_internal_urls = false;
    let t = common::spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let down = closed_port();

    // Without a connection, every GitHub tool is unavailable with `no_connection`.
    assert_eq!(reason(&t, &alice, "github_search_issues").await, ("unavailable".into(), "no_connection".into()));

    // A non-admin may not point a connection inside the host's networks, nor share one.
    let r = create(&t, &alice, github(&down)).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{r:?}");
    let mut shared = github("https://api.github.com");
    shared["shared"] = json!(true);
    let r = create(&t, &alice, shared).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");

    // Bad bodies: each a clear 400, nothing stored.
    for (body, code) in [
        (json!({"kind": "github", "settings": [], "credential": {"token": TOKEN}}), "invalid_request"),
        (json!({"kind": "github", "credential": "x"}), "invalid_request"),
        (json!({"kind": "github", "credential": {"token": "x".repeat(20_000)}}), "invalid_request"),
        (json!({"kind": "github", "name": "", "credential": {"token": TOKEN}}), "invalid_name"),
        (json!({"kind": "github", "name": "a\nb", "credential": {"token": TOKEN}}), "invalid_name"),
        (json!({"kind": "carrier_pigeon", "credential": {}}), "invalid_request"),
    ] {
        let r = create(&t, &t.admin_token, body.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, code), "{body}: {r:?}");
        assert!(!r.body.to_string().contains(TOKEN), "an error echoes the credential: {r:?}");
    }
    assert_eq!(t.get("/v1/connections", &t.admin_token).await.body["connections"], json!([]));

    // The admin's own connection to a closed port: created, checked for real, unreachable.
    let r = create(&t, &t.admin_token, github(&down)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    assert_eq!(r.body["state"], "unreachable", "{r:?}");
    assert_eq!(r.body["shared"], false);
    assert_eq!(r.body["editable"], true);
    assert!(r.body["checked_at"].is_string());
    assert!(r.body["last_error"].is_string());
    let tools = r.body["tools"].as_array().unwrap();
    assert!(tools.len() >= 10, "every GitHub tool is listed with its need: {r:?}");
    assert!(
        tools.iter().all(|n| n["usable"] == false && n["code"] == "connection_unreachable"),
        "each tool names the reason: {r:?}"
    );
    assert_eq!(reason(&t, &t.admin_token, "github_search_issues").await.1, "connection_unreachable");
    // Bob's ladder does not see the admin's connection.
    assert_eq!(reason(&t, &bob, "github_search_issues").await.1, "no_connection");

    // The credential is in no answer, and sealed in the store.
    for path in ["/v1/connections".to_owned(), format!("/v1/connections/{id}")] {
        let v = t.get(&path, &t.admin_token).await;
        assert_eq!(v.status, StatusCode::OK);
        assert!(!v.body.to_string().contains(TOKEN), "{path} returns the credential: {v:?}");
    }
    let stored: Vec<String> = t
        .app()
        .store
        .all_connections()
        .await
        .unwrap()
        .into_iter()
        .map(|row| format!("{} {} {:?}", row.settings_json, row.credential_ciphertext, row.check_json))
        .collect();
    assert_eq!(stored.len(), 1);
    assert!(
        !stored[0].contains(TOKEN) && !stored[0].contains("connectionsTestSecret"),
        "stored in the clear: {stored:?}"
    );

    // Another user can neither see, change, check nor delete it.
    assert_eq!(t.get(&format!("/v1/connections/{id}"), &bob).await.status, StatusCode::NOT_FOUND);
    assert_eq!(t.post(&format!("/v1/connections/{id}/check"), &bob, json!({})).await.status, StatusCode::NOT_FOUND);
    let r =
        t.request(Method::PATCH, &format!("/v1/connections/{id}"), Some(&bob), Some(json!({"enabled": false}))).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = t.request(Method::DELETE, &format!("/v1/connections/{id}"), Some(&bob), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert_eq!(t.get("/v1/connections", &bob).await.body["connections"], json!([]));

    // Disabled: its tools say so; enabled again, it is checked again.
    let r = t
        .request(Method::PATCH, &format!("/v1/connections/{id}"), Some(&t.admin_token), Some(json!({"enabled": false})))
        .await;
    assert_eq!((r.status, r.body["state"].as_str()), (StatusCode::OK, Some("disabled")), "{r:?}");
    assert_eq!(reason(&t, &t.admin_token, "github_search_issues").await.1, "no_connection");
    let r = t
        .request(
            Method::PATCH,
            &format!("/v1/connections/{id}"),
            Some(&t.admin_token),
            Some(json!({"enabled": true, "name": "renamed"})),
        )
        .await;
    assert_eq!(
        (r.status, r.body["state"].as_str(), r.body["name"].as_str()),
        (StatusCode::OK, Some("unreachable"), Some("renamed"))
    );

    // A shared connection (admins only) serves every user, who may not change it.
    let mut shared = github(&closed_port());
    shared["shared"] = json!(true);
    let r = create(&t, &t.admin_token, shared).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let shared_id = r.body["id"].as_str().unwrap().to_owned();
    let v = t.get(&format!("/v1/connections/{shared_id}"), &bob).await;
    assert_eq!(
        (v.status, &v.body["shared"], &v.body["editable"]),
        (StatusCode::OK, &json!(true), &json!(false)),
        "{v:?}"
    );
    assert_eq!(reason(&t, &bob, "github_search_issues").await.1, "connection_unreachable");
    // Forcing a check spends the owner's quota: only who may edit it may.
    let r = t.post(&format!("/v1/connections/{shared_id}/check"), &bob, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    let r = t.request(Method::DELETE, &format!("/v1/connections/{shared_id}"), Some(&bob), None).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    let r = t
        .request(
            Method::PATCH,
            &format!("/v1/connections/{shared_id}"),
            Some(&bob),
            Some(json!({"credential": {"token": "mine"}})),
        )
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"), "{r:?}");
    // The caller's own connections come first in the list.
    let list = t.get("/v1/connections", &t.admin_token).await.body["connections"].clone();
    let ids: Vec<&str> = list.as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [id.as_str(), shared_id.as_str()]);

    // Deleted: gone, and its tools fall back to what remains.
    let r = t.request(Method::DELETE, &format!("/v1/connections/{shared_id}"), Some(&t.admin_token), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    assert_eq!(reason(&t, &bob, "github_search_issues").await.1, "no_connection");
    assert_eq!(t.get(&format!("/v1/connections/{shared_id}"), &bob).await.status, StatusCode::NOT_FOUND);
}

/// A restart keeps connections and their last check (availability answers from the store's
/// facts, not from a lost memory).
async fn connections_survive_a_restart(backend: Backend) {
    let mut t = common::spawn(backend).await;
    let r = create(&t, &t.admin_token, github(&closed_port())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    t.restart().await;
    let v = t.get(&format!("/v1/connections/{id}"), &t.admin_token).await;
    assert_eq!((v.status, v.body["state"].as_str()), (StatusCode::OK, Some("unreachable")), "{v:?}");
    assert_eq!(reason(&t, &t.admin_token, "github_search_issues").await.1, "connection_unreachable");
}

both_backends!(connections_are_owned_checked_and_sealed, connections_survive_a_restart);
