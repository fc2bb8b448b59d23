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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

/// A TCP listener that accepts every connection and never answers (the sockets are kept
/// open): a check against it lasts its whole time limit.
struct Silent {
    base: String,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Silent {
    async fn start() -> Silent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(sock);
            }
        });
        Silent { base, accepted, task }
    }
}

/// One user's connections to a host that accepts and never answers (16, the most a user may
/// have, each check lasting its whole time limit) delay neither the reload of the connection
/// table — a connection deleted through another replica (here: straight in the store) stops
/// being usable here within a refresh or two — nor another user's periodic check. Checked one
/// at a time, the 16 checks took 16 × the time limit, and the reload waited for them.
async fn slow_connection_checks_delay_neither_the_reload_nor_other_users(backend: Backend) {
    const TIMEOUT: Duration = Duration::from_secs(3);
    const INTERVAL: Duration = Duration::from_secs(4);
    let mut options = common::Options::default();
    options.runtime.search.state_refresh_secs = 1;
    options.runtime.connections =
        mira::connections::CheckSettings { interval: INTERVAL, timeout: TIMEOUT, ..Default::default() };
    let t = common::spawn_with(backend, options).await;
    let silent = Silent::start().await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;

    // Alice's 16 connections: each create waits out its first check (unreachable).
    let creates = (0..16).map(|i| {
        let mut body = github(&silent.base);
        body["name"] = json!(format!("slow{i}"));
        create(&t, &alice, body)
    });
    let mut slow = Vec::new();
    for r in futures::future::join_all(creates).await {
        assert_eq!((r.status, r.body["state"].as_str()), (StatusCode::CREATED, Some("unreachable")), "{r:?}");
        slow.push(r.body["id"].as_str().unwrap().to_owned());
    }
    let r = create(&t, &bob, github(&closed_port())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let bob_conn = r.body["id"].as_str().unwrap().to_owned();
    let bob_checked = r.body["checked_at"].as_str().unwrap().to_owned();
    let bob_created = Instant::now();

    // The periodic checks of Alice's connections have begun (the silent host is called again).
    let start = Instant::now();
    while silent.accepted.load(Ordering::SeqCst) <= 16 {
        assert!(start.elapsed() < Duration::from_secs(30), "no periodic check began");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another replica deletes one of them: gone here within a couple of refreshes.
    assert!(t.app().store.delete_connection(&slow[15]).await.unwrap());
    let deleted = Instant::now();
    while t.app().connections.by_id(&slow[15]).is_some() {
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "a connection deleted elsewhere is still in this replica's table after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Bob's periodic check is due INTERVAL after his create and is not queued behind Alice's.
    loop {
        let v = t.get(&format!("/v1/connections/{bob_conn}"), &bob).await;
        if v.body["checked_at"].as_str().is_some_and(|c| c != bob_checked) {
            break;
        }
        assert!(
            bob_created.elapsed() < INTERVAL + Duration::from_secs(6),
            "bob's periodic check waited behind alice's slow ones: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The per-user connection limit holds under concurrent creates: counted and inserted in one
/// transaction under the user's lock, so of many simultaneous POSTs exactly the limit pass.
async fn connection_limit_holds_under_concurrent_creates(backend: Backend) {
    let t = common::spawn(backend).await;
    let alice = t.user("alice").await;
    let down = closed_port();
    let creates = (0..120).map(|i| {
        let mut body = github(&down);
        body["name"] = json!(format!("c{i}"));
        create(&t, &alice, body)
    });
    let mut created = 0;
    for r in futures::future::join_all(creates).await {
        match r.status {
            StatusCode::CREATED => created += 1,
            _ => assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "connection_limit"), "{r:?}"),
        }
    }
    let limit = usize::try_from(mira::http::connections::MAX_CONNECTIONS_PER_USER).unwrap();
    assert_eq!(created, limit);
    assert_eq!(t.get("/v1/connections", &alice).await.body["connections"].as_array().unwrap().len(), limit);
    // Shared connections are no user's: the limit does not apply to them.
    let mut shared = github(&down);
    shared["shared"] = json!(true);
    let admin_own = (0..limit).map(|i| {
        let mut body = github(&down);
        body["name"] = json!(format!("a{i}"));
        create(&t, &t.admin_token, body)
    });
    for r in futures::future::join_all(admin_own).await {
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let r = create(&t, &t.admin_token, shared).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

both_backends!(
    connections_are_owned_checked_and_sealed,
    connections_survive_a_restart,
    slow_connection_checks_delay_neither_the_reload_nor_other_users,
    connection_limit_holds_under_concurrent_creates,
);
