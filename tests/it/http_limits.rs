//! Connection and stream limits (issue 13.7): the per-user cap on open event streams, the
//! idle timeout of keep-alive connections and the connection limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, Backend, Options, spawn_with};

fn options(f: impl FnOnce(&mut mira::http::limits::HttpLimits)) -> Options {
    let mut o = Options::default();
    f(&mut o.runtime.http);
    o
}

async fn open(t: &common::TestApp, token: &str, path: &str) -> reqwest::Response {
    t.client.get(format!("{}{path}", t.base)).bearer_auth(token).send().await.unwrap()
}

/// The N+1-th stream of a user is refused with 429 `too_many_streams` (on every kind of
/// stream), other users are not affected, and closing one stream frees its slot.
async fn stream_cap_per_user(backend: Backend) {
    let t = spawn_with(backend, options(|h| h.streams_per_user = 3)).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let run = t.run(&alice).await;
    let events = format!("/v1/runs/{run}/events");

    let a1 = open(&t, &alice, &events).await;
    let a2 = open(&t, &alice, "/v1/approvals/stream").await;
    let a3 = open(&t, &alice, &events).await;
    for r in [&a1, &a2, &a3] {
        assert_eq!(r.status(), StatusCode::OK);
    }
    for path in [events.as_str(), "/v1/approvals/stream"] {
        let r = open(&t, &alice, path).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    }
    // Bob has slots of his own.
    let b1 = open(&t, &bob, "/v1/approvals/stream").await;
    assert_eq!(b1.status(), StatusCode::OK);
    drop(b1);

    // Alice closes one stream: a new one is accepted once the server has seen it go.
    drop(a2);
    let mut accepted = None;
    for _ in 0..100 {
        let r = open(&t, &alice, "/v1/approvals/stream").await;
        if r.status() == StatusCode::OK {
            accepted = Some(r);
            break;
        }
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a4 = accepted.expect("the slot of the closed stream was never released");
    let me = t.get("/v1/me", &alice).await;
    assert_eq!(t.app().streams.open(me.body["id"].as_str().unwrap()), 3);
    // And she is at her cap again.
    assert_eq!(open(&t, &alice, &events).await.status(), StatusCode::TOO_MANY_REQUESTS);
    drop((a1, a3, a4));
}

/// Error answers (404, 401) never take a slot.
async fn refused_streams_hold_no_slot(backend: Backend) {
    let t = spawn_with(backend, options(|h| h.streams_per_user = 1)).await;
    let alice = t.user("alice").await;
    for _ in 0..5 {
        let r = open(&t, &alice, "/v1/runs/run_0000000000000000000000000000dead/events").await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
    let r = t.client.get(format!("{}/v1/approvals/stream", t.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let ok = open(&t, &alice, "/v1/approvals/stream").await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(open(&t, &alice, "/v1/approvals/stream").await.status(), StatusCode::TOO_MANY_REQUESTS);
}

both_backends!(stream_cap_per_user, refused_streams_hold_no_slot);

/// Turns one user has in progress are capped: with the place taken, a turn is 429
/// `too_many_turns`, another user's turn is not affected, and once the place
/// is freed the turn is accepted and gives its place back when done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_cap_per_user() {
    let t = spawn_with(Backend::Sqlite, options(|h| h.turns_per_user = 1)).await;
    let alice = t.user("alice").await;
    let bob = t.user("bob").await;
    let alice_id = t.get("/v1/me", &alice).await.body["id"].as_str().unwrap().to_owned();
    let run = t.run(&alice).await;
    let path = format!("/v1/runs/{run}/turns");
    let held = t.app().turn_limit.acquire(&alice_id, Duration::ZERO).await.unwrap();
    let r = t.post(&path, &alice, serde_json::json!({"task": "read a file"})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.body["error"]["code"], "too_many_turns", "{:?}", r.body);
    let bob_run = t.run(&bob).await;
    let r = t.post(&format!("/v1/runs/{bob_run}/turns"), &bob, serde_json::json!({"task": "read a file"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "bob's turns are his own: {r:?}");
    drop(held);
    let r = t.post(&path, &alice, serde_json::json!({"task": "read a file"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "the place is free again: {r:?}");
    assert_eq!(t.app().turn_limit.in_progress(&alice_id), 0, "a finished turn gives its place back");
}

async fn raw_get(t: &common::TestApp, path: &str) -> tokio::net::TcpStream {
    let addr = t.base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    s
}

/// Reads until the end of one response head (or EOF / timeout); the bytes read.
async fn read_head(s: &mut tokio::net::TcpStream, timeout: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + timeout;
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

/// A keep-alive connection that sends nothing more is closed after the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let t = spawn_with(Backend::Sqlite, options(|h| h.idle_timeout_secs = 1)).await;
    // Timed from before the request: the server's last write (the response) comes after it,
    // so a close by the idle timeout is at least 1 s later, however slow the machine.
    let started = std::time::Instant::now();
    let mut s = raw_get(&t, "/healthz").await;
    let head = read_head(&mut s, Duration::from_secs(30)).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    // Drain the body, then wait: the server closes the connection (EOF) about 1 s after it,
    // well before the default idle timeout (60 s).
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(_)) => continue,
            Err(_) => break false,
        }
    };
    let took = started.elapsed();
    assert!(closed, "the idle connection was still open 30 s after its response");
    assert!(took >= Duration::from_secs(1), "closed before the idle timeout: {took:?}");
    assert!(took < Duration::from_secs(30), "closed long after the idle timeout: {took:?}");
}

/// With `max_connections` connections open, one more is not served until one of them closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_queues_the_next_client() {
    let t = spawn_with(Backend::Sqlite, options(|h| h.max_connections = 2)).await;
    // The test client's own pool could hold connections: use raw sockets only.
    let mut a = raw_get(&t, "/healthz").await;
    let mut b = raw_get(&t, "/healthz").await;
    assert!(read_head(&mut a, Duration::from_secs(5)).await.starts_with(b"HTTP/1.1 200"));
    assert!(read_head(&mut b, Duration::from_secs(5)).await.starts_with(b"HTTP/1.1 200"));
    let mut c = raw_get(&t, "/healthz").await;
    assert!(read_head(&mut c, Duration::from_millis(700)).await.is_empty(), "a third connection was served");
    drop(a);
    let head = read_head(&mut c, Duration::from_secs(5)).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
}

/// The runner's routes are served outside the request timeout (a runner's connect answers a
/// stream that lasts), but their request bodies must arrive within it: a body trickled into
/// the unauthenticated `POST /v1/runner/enroll` a byte every 300 ms is answered 503
/// `request_timeout` once `--request-timeout-secs` (here 2 s) passed, and a runner's connect
/// still streams beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_bodies_must_arrive_within_the_request_time() {
    let mut t = common::spawn(Backend::Sqlite).await;
    t.settings.request_timeout = Duration::from_secs(2);
    t.restart().await;
    let addr = t.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    s.write_all(
        b"POST /v1/runner/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{",
    )
    .await
    .unwrap();
    let (mut rd, mut wr) = s.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..199 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if wr.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.windows(15).any(|w| w == b"request_timeout")) {
        match tokio::time::timeout_at(deadline, rd.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let took = started.elapsed();
    trickle.abort();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "no 503 within 10 s of a trickled body ({took:?}): {text:?}");
    assert!(text.contains("\"request_timeout\""), "{text}");
    assert!(took >= Duration::from_millis(1900), "answered before the request time: {took:?}");
    assert!(took < Duration::from_secs(6), "answered long after the request time: {took:?}");

    // A runner's connect answers a stream that outlives the request time: pings (every
    // lease / 3 = 5 s) still come after it.
    let r = t.post("/v1/devices", &t.admin_token, serde_json::json!({"name": "slow"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let device = r.body["id"].as_str().unwrap().to_owned();
    let code = r.body["enrollment"]["code"].as_str().unwrap().to_owned();
    let key = mira_core::remote::signing_key(&[7; 32]);
    let enrolled = t
        .client
        .post(format!("{}/v1/runner/enroll", t.base))
        .json(&serde_json::json!({"code": code, "public_key": mira_core::remote::public_hex(&key)}))
        .send()
        .await
        .unwrap();
    assert_eq!(enrolled.status(), StatusCode::OK);
    let challenge: serde_json::Value = t
        .client
        .post(format!("{}/v1/runner/challenge", t.base))
        .json(&serde_json::json!({"device_id": device}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let challenge = challenge["challenge"].as_str().unwrap().to_owned();
    let signature = mira_core::remote::sign(
        &key,
        mira_core::remote::CONNECT_DOMAIN,
        &mira_core::remote::connect_message(&device, &challenge),
    );
    let mut stream = t
        .client
        .post(format!("{}/v1/runner/connect", t.base))
        .json(&serde_json::json!({"device_id": device, "challenge": challenge, "signature": signature,
            "advertised": {"capabilities": ["fs.read"], "tools": ["read_open"], "workspaces": [{"path": "/srv/slow"}], "version": "hand"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let connected = std::time::Instant::now();
    let (mut lines, mut buf) = (Vec::<serde_json::Value>::new(), Vec::new());
    while connected.elapsed() < Duration::from_secs(12) && !lines.iter().any(|l| l["type"] == "ping") {
        match tokio::time::timeout(Duration::from_secs(12), stream.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.extend_from_slice(&bytes),
            other => panic!("the runner's stream ended after {:?}: {other:?}", connected.elapsed()),
        }
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            lines.push(serde_json::from_slice(&line).unwrap());
        }
    }
    assert_eq!(lines.first().map(|l| l["type"].clone()), Some("welcome".into()), "{lines:?}");
    assert!(lines.iter().any(|l| l["type"] == "ping"), "no ping within 12 s: {lines:?}");
    assert!(connected.elapsed() > Duration::from_secs(2), "the ping came before the request time passed");
}
