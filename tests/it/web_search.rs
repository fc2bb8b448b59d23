#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `web_search` end to end over HTTP: each provider (SearXNG, Brave, Tavily) is a loopback
//! HTTP server answering in that provider's documented response format — results, error
//! bodies, 429 with Retry-After, 5xx — and the runtime is a real server on SQLite or
//! Postgres. Also: availability reasons, encrypted per-user connections, the per-user rate
//! limit, and that web_search never answers from the News Hub.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode as AxStatus};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use common::{Backend, Options, TestApp, spawn, spawn_with};
use mira::config::RuntimeConfig;
use mira::tools::search::config::{SearchConfig, Secret};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Serves `router` on a free loopback port; returns its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// A base URL nothing listens on.
async fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn options(search: SearchConfig) -> Options {
    Options {
        runtime: RuntimeConfig {
            execution_concurrency: 4,
            search,
            allow_internal_urls: true,
            ..RuntimeConfig::default()
        },
        ..Options::default()
    }
}

fn fast(search: SearchConfig) -> SearchConfig {
    SearchConfig { search_timeout_secs: 2, search_retries: 2, search_max_retry_wait_secs: 5, ..search }
}

/// Opens a run and a turn; calls web_search with `input`; waits for the final invocation.
async fn call_web(t: &TestApp, token: &str, input: Value) -> Value {
    let run = t.run(token).await;
    let (turn, exposure) = t.turn(token, &run, "search the web").await;
    assert!(exposure.to_string().contains("web_search"), "web_search not exposed: {exposure}");
    let r = t.call(token, &run, &turn, "web_search", "call-1", input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await
}

async fn tool_state(t: &TestApp, token: &str, tool: &str) -> Value {
    let r = t.get(&format!("/v1/tools/{tool}"), token).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

// ---- SearXNG -------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Searx {
    hits: Arc<AtomicUsize>,
    last: Arc<parking_lot::Mutex<Vec<(String, String)>>>,
}

fn searxng_body() -> Value {
    // The shape of SearXNG's /search?format=json answer.
    json!({
        "query": "tokio runtime",
        "number_of_results": 0,
        "results": [
            {"url": "https://tokio.rs/", "title": "Tokio - An asynchronous <b>Rust</b> runtime",
             "content": "Tokio is an event-driven, non-blocking I/O platform for writing asynchronous applications.",
             "engine": "duckduckgo", "parsed_url": ["https", "tokio.rs", "/", "", "", ""], "template": "default.html",
             "engines": ["duckduckgo", "brave"], "positions": [1, 1], "publishedDate": null, "score": 4.0,
             "category": "general"},
            {"url": "https://docs.rs/tokio/latest/tokio/runtime/", "title": "tokio::runtime - Rust",
             "content": "The Tokio runtime.", "engine": "brave", "engines": ["brave"], "positions": [2],
             "publishedDate": "2025-05-01T08:30:00", "score": 1.0, "category": "general"},
            {"url": "https://tokio.rs/", "title": "duplicate of the first", "content": "", "engine": "bing",
             "engines": ["bing"], "positions": [3], "score": 0.5, "category": "general"}
        ],
        "answers": [], "corrections": [], "infoboxes": [], "suggestions": ["tokio spawn"],
        "unresponsive_engines": [["google", "timeout"]]
    })
}

async fn searx_search(State(s): State<Searx>, Query(q): Query<Vec<(String, String)>>) -> impl IntoResponse {
    s.hits.fetch_add(1, Ordering::SeqCst);
    *s.last.lock() = q.clone();
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
    if get("format") != "json" {
        return (AxStatus::FORBIDDEN, "403 Forbidden".to_owned()).into_response();
    }
    if get("q").contains("nothing-works") {
        let body = json!({"query": get("q"), "number_of_results": 0, "results": [], "answers": [],
            "corrections": [], "infoboxes": [], "suggestions": [],
            "unresponsive_engines": [["google", "CAPTCHA"], ["duckduckgo", "timeout"]]});
        return axum::Json(body).into_response();
    }
    axum::Json(searxng_body()).into_response()
}

async fn searxng_deployment_provider(backend: Backend) {
    let mock = Searx::default();
    let base = serve(
        Router::new()
            .route("/search", get(searx_search))
            .route("/healthz", get(|| async { "OK" }))
            .with_state(mock.clone()),
    )
    .await;
    let t =
        spawn_with(backend, options(fast(SearchConfig { searxng_url: Some(base), ..SearchConfig::default() }))).await;
    let token = t.user("ann").await;

    let state = tool_state(&t, &token, "web_search").await;
    assert_eq!(state["state"], "available", "{state}");
    // The two searches never stand in for each other: no sources → news_search is unavailable.
    let news = tool_state(&t, &token, "news_search").await;
    assert_eq!(
        (news["state"].as_str(), news["reason"]["code"].as_str()),
        (Some("unavailable"), Some("news_hub_empty"))
    );

    let done = call_web(
        &t,
        &token,
        json!({"query": "tokio runtime", "count": 5, "freshness": "week", "site": "https://Tokio.rs/x", "language": "en"}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!(out["provider"], "searxng");
    assert_eq!(out["connection_id"], "deployment-searxng");
    assert_eq!(out["source"], "web");
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "duplicate URLs are dropped: {out}");
    assert_eq!(results[0]["rank"], 1);
    assert_eq!(results[0]["url"], "https://tokio.rs/");
    assert_eq!(results[0]["title"], "Tokio - An asynchronous Rust runtime");
    assert!(results[0]["snippet"].as_str().unwrap().contains("non-blocking"));
    assert!(results[0].get("published_at").is_none());
    assert_eq!(results[1]["published_at"], "2025-05-01T08:30:00.000Z");
    assert_eq!(results[1]["retrieved_at"], out["retrieved_at"]);
    assert!(out["notes"][0].as_str().unwrap().contains("google: timeout"), "{out}");
    // What the provider was asked.
    let asked = mock.last.lock().clone();
    let get = |k: &str| asked.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str().to_owned());
    assert_eq!(get("q").as_deref(), Some("tokio runtime site:tokio.rs"));
    assert_eq!(get("time_range").as_deref(), Some("week"));
    assert_eq!(get("language").as_deref(), Some("en"));

    // One evidence item per result, with url, title, snippet, retrieved_at, provider.
    let ev_ids = done["evidence_ids"].as_array().unwrap();
    assert_eq!(ev_ids.len(), 2);
    let ev = t.get(&format!("/v1/evidence/{}", ev_ids[1].as_str().unwrap()), &token).await;
    assert_eq!(ev.body["kind"], "web_result");
    let p = &ev.body["provenance"];
    assert_eq!(p["url"], "https://docs.rs/tokio/latest/tokio/runtime/");
    assert_eq!(p["provider"], "searxng");
    assert_eq!(p["title"], "tokio::runtime - Rust");
    assert_eq!(p["snippet"], "The Tokio runtime.");
    assert_eq!(p["retrieved_at"], out["retrieved_at"]);

    // Every engine failing is an error, not an empty list.
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "search").await;
    let r = t.call(&token, &run, &turn, "web_search", "c2", json!({"query": "nothing-works"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "provider_engines_failed");
    assert!(done["result"]["error"]["message"].as_str().unwrap().contains("CAPTCHA"));
}

// ---- Brave -----------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Brave {
    hits: Arc<AtomicUsize>,
    /// Number of 429s to answer before a 200.
    throttle: Arc<AtomicUsize>,
    tokens: Arc<parking_lot::Mutex<Vec<String>>>,
    last: Arc<parking_lot::Mutex<Vec<(String, String)>>>,
}

fn brave_error(status: u16, code: &str, detail: &str) -> Value {
    json!({"type": "ErrorResponse", "error": {"id": "8f2c1d6e-0000-4000-8000-000000000000", "status": status,
           "code": code, "detail": detail, "meta": {"component": "authentication"}}, "time": 1_749_000_000})
}

async fn brave_search(
    State(s): State<Brave>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> axum::response::Response {
    s.hits.fetch_add(1, Ordering::SeqCst);
    *s.last.lock() = q.clone();
    let token = headers.get("x-subscription-token").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    s.tokens.lock().push(token.clone());
    if token != "BSA-good-token" {
        let body = brave_error(422, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid.");
        return (AxStatus::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
    }
    let query = q.iter().find(|(k, _)| k == "q").map(|(_, v)| v.clone()).unwrap_or_default();
    if query.contains("always-throttled") || s.throttle.load(Ordering::SeqCst) > 0 {
        s.throttle.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).ok();
        let retry = if query.contains("long-wait") { "120" } else { "1" };
        let body = brave_error(429, "RATE_LIMITED", "Request rate limit exceeded for plan.");
        return (
            AxStatus::TOO_MANY_REQUESTS,
            [("retry-after", retry), ("x-ratelimit-limit", "1, 15000"), ("x-ratelimit-reset", "1, 1419704")],
            axum::Json(body),
        )
            .into_response();
    }
    // The shape of Brave's web search answer.
    axum::Json(json!({
        "type": "search",
        "query": {"original": query, "show_strict_warning": false, "is_navigational": false,
                  "spellcheck_off": true, "country": "us", "more_results_available": true},
        "mixed": {"type": "mixed", "main": [{"type": "web", "index": 0, "all": false}]},
        "web": {"type": "search", "family_friendly": true, "results": [
            {"title": "The Rust Programming Language", "url": "https://www.rust-lang.org/",
             "is_source_local": false, "is_source_both": false,
             "description": "A language empowering everyone to build reliable and efficient software.",
             "page_age": "2025-06-02T10:15:00", "age": "June 2, 2025", "language": "en", "family_friendly": true,
             "type": "search_result", "subtype": "generic",
             "meta_url": {"scheme": "https", "netloc": "rust-lang.org", "hostname": "www.rust-lang.org",
                          "favicon": "https://imgs.search.brave.com/x.png", "path": ""}},
            {"title": "Rust (programming language) - Wikipedia",
             "url": "https://en.wikipedia.org/wiki/Rust_(programming_language)",
             "description": "<strong>Rust</strong> is a general-purpose programming language &amp; more.",
             "type": "search_result", "language": "en", "family_friendly": true}
        ]}
    }))
    .into_response()
}

async fn brave_router(state: Brave) -> String {
    serve(Router::new().route("/res/v1/web/search", get(brave_search)).with_state(state)).await
}

async fn brave_user_connection_is_encrypted_and_used(backend: Backend) {
    let mock = Brave::default();
    let base = brave_router(mock.clone()).await;
    let t = spawn_with(backend, options(fast(SearchConfig::default()))).await;
    let token = t.user("bo").await;
    let other = t.user("eve").await;

    let state = tool_state(&t, &token, "web_search").await;
    assert_eq!(
        (state["state"].as_str(), state["reason"]["code"].as_str()),
        (Some("unavailable"), Some("no_search_provider"))
    );

    let r = t
        .post(
            "/v1/search/connections",
            &token,
            json!({"provider": "brave", "name": "my brave", "base_url": base, "api_key": "BSA-good-token"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let conn_id = r.body["id"].as_str().unwrap().to_owned();
    assert!(!r.body.to_string().contains("BSA-good-token"), "{r:?}");
    assert_eq!(r.body["credential"]["kind"], "encrypted");
    assert_eq!(r.body["health"]["state"], "healthy", "{r:?}");
    assert_eq!(r.body["priority"], 1);
    let listed = t.get("/v1/search/connections", &token).await;
    assert!(!listed.body.to_string().contains("BSA-good-token"));
    assert_eq!(listed.body["connections"].as_array().unwrap().len(), 1);
    // Stored sealed: the key's text is nowhere in the row.
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    let stored: (String, String) =
        sqlx::query_as("SELECT credential_kind, credential_ciphertext FROM search_connections WHERE id = $1")
            .bind(&conn_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(stored.0, "encrypted");
    assert!(!stored.1.contains("BSA-good-token") && stored.1.len() > 40);
    // Another user neither sees nor uses it.
    assert_eq!(t.get(&format!("/v1/search/connections/{conn_id}"), &other).await.status, StatusCode::NOT_FOUND);
    let theirs = tool_state(&t, &other, "web_search").await;
    assert_eq!(theirs["reason"]["code"], "no_search_provider");

    let done =
        call_web(&t, &token, json!({"query": "rust language", "count": 2, "freshness": "day", "language": "de"})).await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!((out["provider"].as_str(), out["connection_id"].as_str()), (Some("brave"), Some(conn_id.as_str())));
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["published_at"], "2025-06-02T10:15:00.000Z");
    assert_eq!(results[1]["snippet"], "Rust is a general-purpose programming language & more.");
    assert_eq!(mock.tokens.lock().last().unwrap(), "BSA-good-token");
    let asked = mock.last.lock().clone();
    assert!(asked.contains(&("freshness".into(), "pd".into())), "{asked:?}");
    assert!(asked.contains(&("search_lang".into(), "de".into())), "{asked:?}");
    assert!(asked.contains(&("count".into(), "2".into())), "{asked:?}");

    // A rejected token is the provider's error with its status, not an empty list, and is
    // not retried.
    let r = t
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/search/connections/{conn_id}"),
            Some(&token),
            Some(json!({"api_key": "BSA-revoked"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let before = mock.hits.load(Ordering::SeqCst);
    let done = call_web(&t, &token, json!({"query": "rust"})).await;
    assert_eq!(done["status"], "failed", "{done}");
    let err = &done["result"]["error"];
    assert_eq!(err["code"], "provider_error");
    assert_eq!(err["details"]["status"], 422);
    assert_eq!(err["details"]["provider"], "brave");
    assert!(err["message"].as_str().unwrap().contains("SUBSCRIPTION_TOKEN_INVALID"), "{err}");
    assert_eq!(mock.hits.load(Ordering::SeqCst) - before, 1, "a 422 is not retried");

    // Deleting the connection takes web_search back to no_search_provider.
    let r = t.request(reqwest::Method::DELETE, &format!("/v1/search/connections/{conn_id}"), Some(&token), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(tool_state(&t, &token, "web_search").await["reason"]["code"], "no_search_provider");
}

async fn brave_429_retry_after_is_honoured() {
    let mock = Brave::default();
    let base = brave_router(mock.clone()).await;
    let search = SearchConfig {
        brave_api_key: Some(Secret::new("BSA-good-token")),
        brave_url: base,
        ..fast(SearchConfig::default())
    };
    let t = spawn_with(Backend::Sqlite, options(search)).await;
    let token = t.user("cy").await;

    // One 429 with Retry-After: 1, then a 200: the call waits and succeeds.
    mock.throttle.store(1, Ordering::SeqCst);
    let started = Instant::now();
    let done = call_web(&t, &token, json!({"query": "rust"})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["output"]["attempts"], 2);
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After was not honoured");

    // Always 429: three attempts (two retries), then the provider's status and wait.
    let before = mock.hits.load(Ordering::SeqCst);
    let done = call_web(&t, &token, json!({"query": "always-throttled"})).await;
    assert_eq!(done["status"], "failed", "{done}");
    let err = &done["result"]["error"];
    assert_eq!(err["code"], "provider_rate_limited");
    assert_eq!(err["details"]["status"], 429);
    assert_eq!(err["details"]["retry_after_ms"], 1000);
    assert_eq!(err["details"]["attempts"], 3);
    assert!(err["message"].as_str().unwrap().contains("RATE_LIMITED"));
    assert_eq!(mock.hits.load(Ordering::SeqCst) - before, 3);

    // A Retry-After longer than the server waits ends the call at once.
    let before = mock.hits.load(Ordering::SeqCst);
    let started = Instant::now();
    let done = call_web(&t, &token, json!({"query": "always-throttled long-wait"})).await;
    let err = &done["result"]["error"];
    assert_eq!(
        (err["code"].as_str(), err["details"]["retry_after_ms"].as_u64()),
        (Some("provider_rate_limited"), Some(120_000))
    );
    assert_eq!(mock.hits.load(Ordering::SeqCst) - before, 1);
    assert!(started.elapsed() < Duration::from_secs(10));
}

// ---- Tavily ----------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Tavily {
    hits: Arc<AtomicUsize>,
    /// Number of 5xx to answer before a 200.
    fail: Arc<AtomicUsize>,
    last: Arc<parking_lot::Mutex<Value>>,
}

fn tavily_authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer tvly-good")
}

async fn tavily_search(
    State(s): State<Tavily>,
    headers: HeaderMap,
    body: axum::Json<Value>,
) -> axum::response::Response {
    s.hits.fetch_add(1, Ordering::SeqCst);
    *s.last.lock() = body.0.clone();
    if !tavily_authorized(&headers) {
        let e = json!({"detail": {"error": "Unauthorized: missing or invalid API key."}});
        return (AxStatus::UNAUTHORIZED, axum::Json(e)).into_response();
    }
    if s.fail.load(Ordering::SeqCst) > 0 {
        s.fail.fetch_sub(1, Ordering::SeqCst);
        return (AxStatus::BAD_GATEWAY, axum::Json(json!({"detail": {"error": "Upstream search failed"}})))
            .into_response();
    }
    if body.0["query"] == "over quota" {
        let e = json!({"detail": {"error": "This request exceeds your plan's set usage limit. Please upgrade your plan or contact support@tavily.com"}});
        return (AxStatus::from_u16(432).unwrap(), axum::Json(e)).into_response();
    }
    // The shape of Tavily's /search answer.
    axum::Json(json!({
        "query": body.0["query"],
        "follow_up_questions": null,
        "answer": null,
        "images": [],
        "results": [
            {"title": "Rust 1.87 released", "url": "https://blog.rust-lang.org/2025/05/15/Rust-1.87.0/",
             "content": "The Rust team is happy to announce a new version of Rust, 1.87.0.", "score": 0.91,
             "raw_content": null, "published_date": "Thu, 15 May 2025 00:00:00 GMT"},
            {"title": "Releases", "url": "https://github.com/rust-lang/rust/releases", "content": "Empowering everyone.",
             "score": 0.55, "raw_content": null}
        ],
        "response_time": 1.2,
        "request_id": "123e4567-e89b-12d3-a456-426614174111"
    }))
    .into_response()
}

async fn tavily_usage(headers: HeaderMap) -> axum::response::Response {
    if tavily_authorized(&headers) {
        axum::Json(json!({"key": {"usage": 12, "limit": 1000}, "account": {"current_plan": "Researcher"}}))
            .into_response()
    } else {
        (AxStatus::UNAUTHORIZED, axum::Json(json!({"detail": {"error": "Unauthorized: missing or invalid API key."}})))
            .into_response()
    }
}

async fn tavily_formats_errors_and_5xx_retries(backend: Backend) {
    let mock = Tavily::default();
    let base = serve(
        Router::new().route("/search", post(tavily_search)).route("/usage", get(tavily_usage)).with_state(mock.clone()),
    )
    .await;
    let t = spawn_with(backend, options(fast(SearchConfig::default()))).await;
    let token = t.user("dee").await;

    // A bad key fails Tavily's health check (GET /usage): the connection is unreachable and
    // web_search says why.
    let r = t
        .post("/v1/search/connections", &token, json!({"provider": "tavily", "base_url": base, "api_key": "tvly-bad"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["health"]["state"], "unreachable", "{r:?}");
    assert!(r.body["health"]["error"].as_str().unwrap().contains("HTTP 401"), "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    let state = tool_state(&t, &token, "web_search").await;
    assert_eq!(state["reason"]["code"], "provider_unreachable", "{state}");
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "search").await;
    assert!(!exposure.to_string().contains("web_search"));
    let r = t.call(&token, &run, &turn, "web_search", "x", json!({"query": "q"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "unavailable"), "{r:?}");

    // The right key: healthy after the PATCH's check.
    let r = t
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/search/connections/{id}"),
            Some(&token),
            Some(json!({"api_key": "tvly-good"})),
        )
        .await;
    assert_eq!(r.body["health"]["state"], "healthy", "{r:?}");

    mock.fail.store(1, Ordering::SeqCst);
    let done = call_web(
        &t,
        &token,
        json!({"query": "rust release", "count": 3, "freshness": "month",
        "site": "blog.rust-lang.org", "language": "fr"}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let out = &done["result"]["output"];
    assert_eq!(out["attempts"], 2, "one 502, then a retry");
    assert_eq!(out["results"][0]["published_at"], "2025-05-15T00:00:00.000Z");
    assert_eq!(out["results"][0]["provider"], "tavily");
    assert!(out["results"][1].get("published_at").is_none());
    assert!(out["notes"][0].as_str().unwrap().contains("language fr was not applied"), "{out}");
    let asked = mock.last.lock().clone();
    assert_eq!(asked["max_results"], 3);
    assert_eq!(asked["time_range"], "month");
    assert_eq!(asked["include_domains"], json!(["blog.rust-lang.org"]));

    let done = call_web(&t, &token, json!({"query": "over quota"})).await;
    let err = &done["result"]["error"];
    assert_eq!((err["code"].as_str(), err["details"]["status"].as_u64()), (Some("provider_error"), Some(432)), "{err}");
    assert!(err["message"].as_str().unwrap().contains("usage limit"));
}

// ---- availability, rate limit, validation ---------------------------------------------------

async fn unreachable_provider_makes_web_search_unavailable(backend: Backend) {
    let dead = closed_port().await;
    let t =
        spawn_with(backend, options(fast(SearchConfig { searxng_url: Some(dead), ..SearchConfig::default() }))).await;
    let token = t.user("fay").await;
    let r = t.post("/v1/search/connections/deployment-searxng/check", &token, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["health"]["state"], "unreachable");
    assert_eq!(r.body["shared"], true);
    let state = tool_state(&t, &token, "web_search").await;
    assert_eq!(
        (state["state"].as_str(), state["reason"]["code"].as_str()),
        (Some("unavailable"), Some("provider_unreachable"))
    );
    assert!(state["reason"]["message"].as_str().unwrap().contains("deployment-searxng"));
    // Shared connections are read-only.
    let r = t.request(reqwest::Method::DELETE, "/v1/search/connections/deployment-searxng", Some(&token), None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

async fn per_user_rate_limit() {
    let base = serve(
        Router::new()
            .route("/search", get(searx_search))
            .route("/healthz", get(|| async { "OK" }))
            .with_state(Searx::default()),
    )
    .await;
    let search = SearchConfig { searxng_url: Some(base), search_rate_per_minute: 2, ..fast(SearchConfig::default()) };
    let t = spawn_with(Backend::Sqlite, options(search)).await;
    let a = t.user("gus").await;
    let b = t.user("hal").await;
    for _ in 0..2 {
        assert_eq!(call_web(&t, &a, json!({"query": "x"})).await["status"], "completed");
    }
    let done = call_web(&t, &a, json!({"query": "x"})).await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["result"]["error"]["code"], "rate_limited");
    assert!(done["result"]["error"]["details"]["retry_after_ms"].as_u64().unwrap() > 1000);
    // The limit is per user.
    assert_eq!(call_web(&t, &b, json!({"query": "x"})).await["status"], "completed");
}

async fn connection_requests_are_validated() {
    let t = spawn(Backend::Sqlite).await;
    let token = t.user("ivy").await;
    let cases = [
        (json!({"provider": "google"}), StatusCode::BAD_REQUEST, "invalid_request"),
        (json!({"provider": "searxng"}), StatusCode::BAD_REQUEST, "base_url_required"),
        (json!({"provider": "searxng", "base_url": "ftp://x"}), StatusCode::BAD_REQUEST, "invalid_url"),
        (json!({"provider": "brave"}), StatusCode::BAD_REQUEST, "credential_required"),
        (json!({"provider": "brave", "api_key": ""}), StatusCode::BAD_REQUEST, "invalid_api_key"),
        (json!({"provider": "brave", "api_key_env": "HOME"}), StatusCode::FORBIDDEN, "server_env_reference"),
        (json!({"provider": "tavily", "api_key": "k", "api_key_env": "K"}), StatusCode::BAD_REQUEST, "invalid_request"),
        (json!({"provider": "tavily", "api_key": "k", "extra": 1}), StatusCode::BAD_REQUEST, "invalid_request"),
    ];
    for (body, status, code) in cases {
        let r = t.post("/v1/search/connections", &token, body.clone()).await;
        assert_eq!((r.status, r.code()), (status, code), "{body}: {r:?}");
    }
    // Admins may reference an environment variable; it is shown by name only.
    let r = t
        .post(
            "/v1/search/connections",
            &t.admin_token,
            json!({"provider": "brave", "api_key_env": "MIRA_TEST_UNSET_BRAVE_KEY", "base_url": closed_port().await}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["credential"], json!({"kind": "env", "env": "MIRA_TEST_UNSET_BRAVE_KEY"}));
    assert_eq!(t.get("/v1/search/connections/sconn_nope", &token).await.status, StatusCode::NOT_FOUND);
}

both_backends!(
    internal_urls_are_admin_only,
    searxng_deployment_provider,
    brave_user_connection_is_encrypted_and_used,
    tavily_formats_errors_and_5xx_retries,
    unreachable_provider_makes_web_search_unavailable,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brave_429() {
    brave_429_retry_after_is_honoured().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_is_per_user() {
    per_user_rate_limit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_validation() {
    connection_requests_are_validated().await;
}

/// By default only an admin may point the server at internal addresses (an MCP endpoint, a
/// news feed, a search instance on loopback): an ordinary user gets 403 `internal_address`.
async fn internal_urls_are_admin_only(backend: Backend) {
    let t = spawn_with(backend, Options { runtime: RuntimeConfig::default(), ..Options::default() }).await;
    let user = t.user("eve").await;
    let cases = [
        ("/v1/mcp/servers", json!({"name": "inner", "transport": {"http": {"url": "http://127.0.0.1:9/mcp"}}})),
        ("/v1/news/sources", json!({"name": "inner", "url": "http://localhost:9/feed.xml"})),
        ("/v1/search/connections", json!({"provider": "searxng", "base_url": "http://169.254.169.254/"})),
    ];
    for (path, body) in &cases {
        let r = t.post(path, &user, body.clone()).await;
        assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{path}: {r:?}");
    }
    for (path, body) in &cases {
        let r = t.post(path, &t.admin_token, body.clone()).await;
        assert_eq!(r.status, StatusCode::CREATED, "an admin may: {path}: {r:?}");
    }
}
