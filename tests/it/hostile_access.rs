#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile access, over HTTP on SQLite and on Postgres.
//!
//! - Tokens: a user lists (never the secret), creates and revokes their own bearer tokens; a
//!   revoked token is 401 at once on the same server; another user's token id is 404, and an
//!   admin revokes any user's.
//! - Enrollment: wrong codes on the unauthenticated `POST /v1/runner/enroll` are limited per
//!   client address and globally (429 `enrollment_rate_limited` with `Retry-After`), a right
//!   code from another address still works, and a code raced by several enrollments at once
//!   enrolls exactly one key.
//! - Open event streams (the approvals inbox, a run's events) end, after an `error` event
//!   `unauthorized`, within seconds of their token's revocation — through the API or behind
//!   the replica's back, as another replica's would be.
//! - `/readyz` says `unavailable`, not the store's error, to anyone.
//! - Forwarded calls: the owner's `POST /internal/v1/execute` refuses a call whose tool became
//!   unavailable since it was frozen (the ladder's reason), and runs it once it is available.

use crate::common;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{Backend, Options, TestApp, spawn, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

both_backends!(
    tokens_are_listed_created_and_revoked_by_their_owner,
    wrong_enrollment_codes_are_limited_per_address_and_globally,
    a_code_raced_by_concurrent_enrollments_enrolls_once,
    the_owner_of_a_forwarded_call_rechecks_availability,
    open_streams_end_when_their_token_is_revoked,
    readyz_tells_no_store_error,
);

async fn status_of_me(t: &TestApp, token: &str) -> StatusCode {
    t.get("/v1/me", token).await.status
}

async fn tokens_are_listed_created_and_revoked_by_their_owner(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;

    // A second token for Alice: its secret is shown once and works at once.
    let created = t.post("/v1/tokens", &alice, json!({"label": "laptop"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let second = created.body["secret"].as_str().unwrap().to_owned();
    let second_id = created.body["id"].as_str().unwrap().to_owned();
    assert!(second.starts_with("mira_"), "{created:?}");
    assert_eq!(created.body["label"], "laptop");
    assert_eq!(status_of_me(&t, &second).await, StatusCode::OK);

    // The list: both tokens, ids and times, never a secret or its hash.
    let list = t.get("/v1/tokens", &alice).await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    let tokens = list.body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "{list:?}");
    let text = list.body.to_string();
    assert!(!text.contains(&second) && !text.contains(&alice), "a secret is listed: {text}");
    assert!(!text.contains(&mira::auth::hash_token(&second)), "a hash is listed: {text}");
    for tok in tokens {
        assert!(tok["id"].as_str().unwrap().starts_with("tok_"), "{tok}");
        assert!(tok["created_at"].is_string() && tok["revoked_at"].is_null(), "{tok}");
    }
    let initial_id = tokens.iter().find(|t| t["id"] != second_id.as_str()).unwrap()["id"].as_str().unwrap().to_owned();
    // Both were used just now (one by this very request): their last use is known.
    assert!(tokens.iter().all(|t| t["last_used_at"].is_string()), "{list:?}");

    // Bob cannot see, list or revoke Alice's tokens: 404 as for an unknown id.
    let r = t.post(&format!("/v1/tokens/{second_id}/revoke"), &bob, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{r:?}");
    let unknown = t.post("/v1/tokens/tok_0123456789abcdef0123456789abcdef/revoke", &bob, json!({})).await;
    assert_eq!((unknown.status, unknown.body["error"].clone()), (r.status, r.body["error"].clone()));
    let malformed = t.post("/v1/tokens/not-a-token/revoke", &bob, json!({})).await;
    assert_eq!(malformed.status, StatusCode::NOT_FOUND, "{malformed:?}");
    let bobs = t.get("/v1/tokens", &bob).await;
    assert_eq!(bobs.body["tokens"].as_array().unwrap().len(), 1, "{bobs:?}");
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let peek = t.get(&format!("/v1/tokens?user_id={alice_id}"), &bob).await;
    assert_eq!((peek.status, peek.code()), (StatusCode::FORBIDDEN, "forbidden"), "{peek:?}");
    assert_eq!(status_of_me(&t, &second).await, StatusCode::OK, "Bob's attempt changed nothing");

    // Alice revokes her second token: refused at once (it was just cached as valid).
    let revoked = t.post(&format!("/v1/tokens/{second_id}/revoke"), &alice, json!({})).await;
    assert_eq!(revoked.status, StatusCode::OK, "{revoked:?}");
    assert!(revoked.body["revoked_at"].is_string(), "{revoked:?}");
    let me = t.get("/v1/me", &second).await;
    assert_eq!((me.status, me.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "{me:?}");
    // Again: the first revocation time stays.
    let again = t.post(&format!("/v1/tokens/{second_id}/revoke"), &alice, json!({})).await;
    assert_eq!(again.body["revoked_at"], revoked.body["revoked_at"], "{again:?}");
    assert_eq!(status_of_me(&t, &alice).await, StatusCode::OK, "her other token still works");

    // An admin lists and revokes any user's token; Alice's first token is refused at once.
    let seen = t.get(&format!("/v1/tokens?user_id={alice_id}"), &t.admin_token).await;
    assert_eq!(seen.body["tokens"].as_array().unwrap().len(), 2, "{seen:?}");
    let r = t.post(&format!("/v1/tokens/{initial_id}/revoke"), &t.admin_token, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(status_of_me(&t, &alice).await, StatusCode::UNAUTHORIZED);

    // A label that is not printable is refused.
    let bad = t.post("/v1/tokens", &bob, json!({"label": "a\u{7}b"})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{bad:?}");
}

/// A device's fresh enrollment code.
async fn device_code(t: &TestApp, token: &str, name: &str) -> (String, String) {
    let r = t.post("/v1/devices", token, json!({"name": name})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    (r.body["id"].as_str().unwrap().to_owned(), r.body["enrollment"]["code"].as_str().unwrap().to_owned())
}

fn public_key(seed: u8) -> String {
    mira_core::remote::public_hex(&mira_core::remote::signing_key(&[seed; 32]))
}

/// `POST /v1/runner/enroll` sent from the loopback address `from`: (status, code, Retry-After).
async fn enroll_from(base: &str, from: &str, code: &str, key_seed: u8) -> (StatusCode, String, Option<u64>) {
    let client = reqwest::Client::builder().local_address(from.parse::<IpAddr>().unwrap()).build().unwrap();
    let resp = client
        .post(format!("{base}/v1/runner/enroll"))
        .json(&json!({"code": code, "public_key": public_key(key_seed)}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
    let body: Value = resp.json().await.unwrap();
    (status, body["error"]["code"].as_str().unwrap_or("").to_owned(), retry)
}

async fn wrong_enrollment_codes_are_limited_per_address_and_globally(backend: Backend) {
    let mut options = Options::default();
    options.runtime.devices.enroll_failures_per_address = 3;
    options.runtime.devices.enroll_failures_global = 6;
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let (_, code_a) = device_code(&t, &alice, "a").await;
    let (_, code_b) = device_code(&t, &alice, "b").await;
    let wrong = "mre_00000000000000000000000000000000";

    // Three wrong codes from 127.0.0.2 are answered; the fourth is limited, with Retry-After
    // (one attempt refills in 60 / 3 = 20 s), and so is a right code from that address.
    for _ in 0..3 {
        assert_eq!(enroll_from(&t.base, "127.0.0.2", wrong, 1).await.1, "enrollment_code_invalid");
    }
    let (status, code, retry) = enroll_from(&t.base, "127.0.0.2", wrong, 1).await;
    assert_eq!((status, code.as_str()), (StatusCode::TOO_MANY_REQUESTS, "enrollment_rate_limited"));
    assert!(retry.is_some_and(|s| (1..=20).contains(&s)), "Retry-After {retry:?}");
    let (status, code, _) = enroll_from(&t.base, "127.0.0.2", &code_a, 1).await;
    assert_eq!((status, code.as_str()), (StatusCode::TOO_MANY_REQUESTS, "enrollment_rate_limited"));

    // The right code from another address still works, and a success costs nothing.
    let (status, code, _) = enroll_from(&t.base, "127.0.0.1", &code_a, 2).await;
    assert_eq!((status, code.as_str()), (StatusCode::OK, ""), "the right code from another address");

    // Globally: three more wrong codes (from 127.0.0.3) empty the global bucket of six; then
    // every address is limited, even with a right code.
    for _ in 0..3 {
        assert_eq!(enroll_from(&t.base, "127.0.0.3", wrong, 3).await.1, "enrollment_code_invalid");
    }
    let (status, code, retry) = enroll_from(&t.base, "127.0.0.4", &code_b, 4).await;
    assert_eq!((status, code.as_str()), (StatusCode::TOO_MANY_REQUESTS, "enrollment_rate_limited"));
    assert!(retry.is_some_and(|s| (1..=10).contains(&s)), "Retry-After {retry:?}");
    let devices = t.get("/v1/devices", &alice).await;
    let b = devices.body["devices"].as_array().unwrap().iter().find(|d| d["name"] == "b").unwrap().clone();
    assert_eq!(b["status"], "not_enrolled", "the limited right code enrolled nothing: {b}");
}

async fn a_code_raced_by_concurrent_enrollments_enrolls_once(backend: Backend) {
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let (device, code) = device_code(&t, &alice, "raced").await;
    let racers: Vec<_> = (0..6u8)
        .map(|i| {
            let (base, code) = (t.base.clone(), code.clone());
            tokio::spawn(async move { (i, enroll_from(&base, "127.0.0.1", &code, 10 + i).await) })
        })
        .collect();
    let mut winners = Vec::new();
    for racer in racers {
        let (i, (status, code, _)) = racer.await.unwrap();
        match status {
            StatusCode::OK => winners.push(i),
            StatusCode::UNAUTHORIZED => assert_eq!(code, "enrollment_code_invalid"),
            other => panic!("racer {i}: {other} {code}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one enrollment wins: {winners:?}");
    let stored = t.app().store.device_by_id(&device).await.unwrap().unwrap();
    assert_eq!(stored.public_key.as_deref(), Some(public_key(10 + winners[0]).as_str()), "the winner's key is kept");
    // The code is spent.
    assert_eq!(enroll_from(&t.base, "127.0.0.1", &code, 40).await.1, "enrollment_code_invalid");
}

/// A tool that looks like a projected MCP tool (so its calls are forwardable) and whose
/// availability a test switches.
struct Switched {
    spec: mira::registry::ToolSpec,
    up: Arc<AtomicBool>,
    runs: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl mira::registry::Tool for Switched {
    fn spec(&self) -> &mira::registry::ToolSpec {
        &self.spec
    }

    fn availability(&self, _ctx: &mira::availability::AvailabilityContext) -> mira::availability::Availability {
        if self.up.load(Ordering::SeqCst) {
            mira::availability::Availability::Available
        } else {
            mira::availability::Availability::unavailable(
                mira::error::ErrorCode::McpNotConnected,
                "the test switched it off",
            )
        }
    }

    async fn execute(
        &self,
        input: &Value,
        _ctx: &mira::registry::ExecContext,
    ) -> Result<mira::registry::ToolOutput, mira::registry::ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(mira::registry::ToolOutput { output: json!({"echo": input}), evidence: vec![] })
    }
}

async fn the_owner_of_a_forwarded_call_rechecks_availability(backend: Backend) {
    let mut options = Options::default();
    options.runtime.cluster.secret = Some("forward-secret".into());
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let tool_id = "mcp:mcp_0123456789abcdef0123456789abcdef:tool:probe";
    let mut spec = common::TestTool::new(tool_id, "probe the forwarded availability recheck", true).spec;
    spec.kind = mira::registry::ToolKind::McpProjection;
    let (up, runs) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
    t.app().registry.register(Arc::new(Switched { spec, up: up.clone(), runs: runs.clone() })).unwrap();
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "probe the forwarded availability recheck").await;
    let r = t.call(&alice, &run, &turn, tool_id, "f1", json!({"value": "x"})).await;
    assert_eq!(r.body["status"], "awaiting_approval", "{r:?}");
    let inv = r.body["invocation_id"].as_str().unwrap().to_owned();

    // As a replica that claimed it would leave it: running under its claim, granted.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    sqlx::query(
        "UPDATE invocations SET status = 'running', claimed_by = 'node-other:claimer',
                lease_until = '9999-12-31T00:00:00.000Z' WHERE id = $1",
    )
    .bind(&inv)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE approvals SET status = 'granted' WHERE invocation_id = $1")
        .bind(&inv)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let forward = || async {
        let answer: Value = t
            .client
            .post(format!("{}/internal/v1/execute", t.base))
            .header("x-mira-cluster-secret", "forward-secret")
            .json(&json!({"invocation_id": inv, "claimed_by": "node-other:claimer"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer
    };
    // Unavailable since the freeze: refused with the ladder's reason, nothing ran.
    up.store(false, Ordering::SeqCst);
    let answer = forward().await;
    assert_eq!(answer["err"]["code"], "mcp_not_connected", "{answer:#}");
    assert_eq!(answer["err"]["details"]["ladder"]["state"], "unavailable", "{answer:#}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the owner ran a call whose tool is unavailable");
    // Available again: the owner runs it.
    up.store(true, Ordering::SeqCst);
    let answer = forward().await;
    assert_eq!(answer["ok"]["output"]["echo"]["value"], "x", "{answer:#}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A token's open streams end once it is revoked: the approvals inbox and a run's events,
/// each after an `error` event `unauthorized`. Revoked through the API, the streams are
/// checked at once; revoked in the store behind this replica's back (as through another
/// replica), within the check interval (2 s). A stream of the user's other, valid token stays
/// open.
async fn open_streams_end_when_their_token_is_revoked(backend: Backend) {
    use std::time::{Duration, Instant};
    let t = spawn(backend).await;
    let alice = t.user("alice").await;
    let run = t.run(&alice).await;
    let mut tokens = Vec::new();
    for label in ["by-api", "elsewhere"] {
        let c = t.post("/v1/tokens", &alice, json!({"label": label})).await;
        assert_eq!(c.status, StatusCode::CREATED, "{c:?}");
        tokens.push((c.body["id"].as_str().unwrap().to_owned(), c.body["secret"].as_str().unwrap().to_owned()));
    }
    let open = |token: String, path: String| {
        let req = t.client.get(format!("{}{path}", t.base)).bearer_auth(token);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r
        }
    };
    let paths = ["/v1/approvals/stream".to_owned(), format!("/v1/runs/{run}/events")];
    let kept = open(alice.clone(), paths[0].clone()).await;

    for (i, (id, secret)) in tokens.iter().enumerate() {
        let mut streams = Vec::new();
        for path in &paths {
            streams.push(open(secret.clone(), path.clone()).await);
        }
        let started = Instant::now();
        let bound = if i == 0 {
            let r = t.post(&format!("/v1/tokens/{id}/revoke"), &alice, json!({})).await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            Duration::from_secs(4)
        } else {
            assert!(t.app().store.revoke_token(id).await.unwrap());
            Duration::from_secs(8)
        };
        for (path, stream) in paths.iter().zip(streams) {
            let (events, closed) = common::until_closed(stream, Duration::from_secs(20)).await;
            let took = started.elapsed();
            assert!(closed, "{path} of a revoked token was still open 20 s later: {events:?}");
            assert!(took < bound, "{path} ended {took:?} after the revocation (bound {bound:?})");
            let (event, data) = events.last().unwrap();
            assert_eq!((event.as_str(), data["code"].as_str()), ("error", Some("unauthorized")), "{events:?}");
        }
        // The revoked token opens nothing more.
        let r = t.client.get(format!("{}{}", t.base, paths[0])).bearer_auth(secret).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let (events, closed) = common::until_closed(kept, Duration::from_secs(1)).await;
    assert!(!closed, "the stream of a valid token ended: {events:?}");
    assert_eq!(events.first().map(|e| e.0.as_str()), Some("approvals"), "{events:?}");
}

/// `/readyz` needs no token: a store that does not answer is `unavailable` (503), never the
/// store's error text (database names, addresses), which is logged instead.
async fn readyz_tells_no_store_error(backend: Backend) {
    let t = spawn(backend).await;
    let r = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!((r.status, r.body["store"].as_str()), (StatusCode::OK, Some("ok")), "{r:?}");
    t.app().store.close().await;
    let r = t.request(reqwest::Method::GET, "/readyz", None, None).await;
    assert_eq!((r.status, r.body["store"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")), "{r:?}");
}
