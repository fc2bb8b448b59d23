#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The News Hub end to end over HTTP, on SQLite and Postgres: sources added through the
//! API, a collector fetching feeds served from loopback (RSS 2.0, Atom, JSON Feed, a
//! malformed feed, a duplicate GUID, a huge feed, a feed too large to read, a non-UTF-8
//! feed, a redirect loop, a source that times out), conditional GET, updates instead of
//! duplicates, and news_search's full-text search, filters, evidence and availability.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxStatus};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use common::{Backend, Options, TestApp, spawn_with};
use mira::config::RuntimeConfig;
use mira::tools::search::config::SearchConfig;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Caps of the test servers: small enough to hit.
const MAX_ITEMS: usize = 40;
const MAX_BYTES: u64 = 64 * 1024;

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

fn options() -> Options {
    let search = SearchConfig {
        news_min_interval_secs: 1,
        news_fetch_timeout_secs: 1,
        news_max_items_per_fetch: MAX_ITEMS,
        news_max_feed_bytes: MAX_BYTES,
        ..SearchConfig::default()
    };
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

// ---- the feed server ---------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Feeds {
    /// Version of /changing.xml (its second item's text changes with it).
    version: Arc<AtomicUsize>,
    /// Requests answered 304.
    not_modified: Arc<AtomicUsize>,
    /// Requests of /changing.xml.
    changing_hits: Arc<AtomicUsize>,
}

const RSS: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:content="http://purl.org/rss/1.0/modules/content/">
<channel>
  <title>Harbor Gazette</title><link>https://gazette.example/</link><description>Port news</description>
  <item>
    <guid isPermaLink="false">gazette-1</guid>
    <title>Dock workers vote on new contract</title>
    <link>https://gazette.example/2025/06/contract?utm_source=rss</link>
    <description>The union met on Tuesday.</description>
    <content:encoded><![CDATA[<p>After a long night the <b>stevedores</b> approved the agreement.</p>]]></content:encoded>
    <pubDate>Mon, 09 Jun 2025 18:00:00 GMT</pubDate>
  </item>
  <item>
    <guid isPermaLink="false">gazette-2</guid>
    <title>Ferry timetable changes</title>
    <link>https://gazette.example/2025/05/ferry</link>
    <description>Summer sailings start early.</description>
    <pubDate>Thu, 01 May 2025 07:00:00 GMT</pubDate>
  </item>
</channel>
</rss>"#;

const ATOM: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <title>Orbital Notes</title>
  <id>urn:uuid:60a76c80-d399-11d9-b93C-0003939e0af6</id>
  <updated>2025-06-08T12:00:00Z</updated>
  <entry>
    <title>Telescope mirror cleaned</title>
    <link href="https://orbital.example/mirror"/>
    <id>urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a</id>
    <updated>2025-06-08T12:00:00Z</updated>
    <summary>Maintenance finished ahead of schedule.</summary>
    <content type="html">&lt;p&gt;Engineers used a gentle &lt;em&gt;cryogenic&lt;/em&gt; wash.&lt;/p&gt;</content>
    <author><name>R. Vega</name></author>
  </entry>
</feed>"#;

fn json_feed() -> Value {
    json!({
        "version": "https://jsonfeed.org/version/1.1",
        "title": "Garden Log",
        "home_page_url": "https://garden.example/",
        "feed_url": "https://garden.example/feed.json",
        "items": [
            {"id": "g-1", "url": "https://garden.example/tomatoes", "title": "Tomatoes ripen",
             "content_text": "The heirloom plants produced an unexpected marmalade-coloured variety.",
             "summary": "First harvest.", "date_published": "2025-06-05T09:00:00Z"}
        ]
    })
}

fn changing(version: usize) -> String {
    let word = if version == 0 { "saffron" } else { "vermilion" };
    format!(
        r#"<?xml version="1.0"?><rss version="2.0"><channel><title>Changing</title>
<item><guid>c-1</guid><title>Stable item</title><description>unchanged text</description></item>
<item><guid>c-2</guid><title>Evolving item</title><description>The colour is {word}.</description></item>
</channel></rss>"#
    )
}

async fn changing_feed(State(f): State<Feeds>, headers: HeaderMap) -> Response {
    f.changing_hits.fetch_add(1, Ordering::SeqCst);
    let v = f.version.load(Ordering::SeqCst);
    let etag = format!("\"v{v}\"");
    if headers.get("if-none-match").and_then(|h| h.to_str().ok()) == Some(etag.as_str()) {
        f.not_modified.fetch_add(1, Ordering::SeqCst);
        return (AxStatus::NOT_MODIFIED, [("etag", etag)]).into_response();
    }
    ([("content-type", "application/rss+xml"), ("etag", etag.as_str())], changing(v)).into_response()
}

fn huge(n: usize) -> String {
    let mut s = String::from(r#"<?xml version="1.0"?><rss version="2.0"><channel><title>Huge</title>"#);
    for i in 0..n {
        s.push_str(&format!("<item><guid>h-{i}</guid><title>Bulletin {i}</title><description>x</description></item>"));
    }
    s.push_str("</channel></rss>");
    s
}

fn latin1() -> Vec<u8> {
    let mut b = br#"<?xml version="1.0" encoding="ISO-8859-1"?><rss version="2.0"><channel><title>Caf"#.to_vec();
    b.push(0xE9); // é in ISO-8859-1
    b.extend_from_slice(b"</title><item><guid>l-1</guid><title>Cr");
    b.push(0xE8); // è
    b.extend_from_slice(b"me br");
    b.push(0xFB); // û
    b.extend_from_slice(b"l");
    b.push(0xE9);
    b.extend_from_slice(b"e au menu</title><description>Recette du caf");
    b.push(0xE9);
    b.extend_from_slice(b" de la gare.</description></item></channel></rss>");
    b
}

async fn feed_server(feeds: Feeds) -> String {
    let router = Router::new()
        .route("/rss.xml", get(|| async { ([("content-type", "application/rss+xml")], RSS) }))
        .route("/atom.xml", get(|| async { ([("content-type", "application/atom+xml")], ATOM) }))
        .route("/feed.json", get(|| async { ([("content-type", "application/feed+json")], json_feed().to_string()) }))
        .route("/changing.xml", get(changing_feed))
        .route("/malformed.xml", get(|| async { "<rss version=\"2.0\"><channel><item><title>cut off" }))
        .route(
            "/dup.xml",
            get(|| async {
                r#"<rss version="2.0"><channel><title>Dup</title>
<item><guid>same</guid><title>First copy</title><description>alpha</description></item>
<item><guid>same</guid><title>Second copy</title><description>beta</description></item>
<item><guid>other</guid><title>Other</title><description>gamma</description></item>
</channel></rss>"#
            }),
        )
        .route("/huge.xml", get(|| async { huge(200) }))
        .route("/too-large.xml", get(|| async { huge(4000) }))
        .route("/latin1.xml", get(|| async { ([("content-type", "application/rss+xml")], latin1()) }))
        .route("/to-rss", get(|| async { Redirect::temporary("/rss.xml") }))
        .route("/loop-a", get(|| async { Redirect::temporary("/loop-b") }))
        .route("/loop-b", get(|| async { Redirect::temporary("/loop-a") }))
        .route(
            "/slow.xml",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                RSS
            }),
        )
        .route("/gone.xml", get(|| async { (AxStatus::SERVICE_UNAVAILABLE, [("retry-after", "7200")], "down") }))
        .with_state(feeds);
    serve(router).await
}

// ---- helpers ---------------------------------------------------------------------------------

async fn add_source(t: &TestApp, token: &str, url: &str, name: &str) -> String {
    let r = t.post("/v1/news/sources", token, json!({"url": url, "name": name, "interval_secs": 3600})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["status"], "pending");
    r.body["id"].as_str().unwrap().to_owned()
}

/// Polls a source until `done` holds (10 s at most).
async fn wait_source(t: &TestApp, token: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = t.get(&format!("/v1/news/sources/{id}"), token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        if done(&r.body) {
            return r.body;
        }
        assert!(Instant::now() < deadline, "source did not get there: {}", r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fetched(s: &Value) -> bool {
    s["last_success_at"].is_string() || s["last_error"].is_object()
}

/// Runs news_search with `input` in a fresh run; returns the final invocation.
async fn news(t: &TestApp, token: &str, input: Value) -> Value {
    let run = t.run(token).await;
    let (turn, exposure) = t.turn(token, &run, "read the news").await;
    assert!(exposure.to_string().contains("news_search"), "{exposure}");
    let r = t.call(token, &run, &turn, "news_search", "n-1", input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await
}

fn titles(done: &Value) -> Vec<String> {
    done["result"]["output"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["title"].as_str().unwrap().to_owned())
        .collect()
}

// ---- tests -------------------------------------------------------------------------------------

async fn collects_rss_atom_and_json_feed_and_searches_them(backend: Backend) {
    let base = feed_server(Feeds::default()).await;
    let t = spawn_with(backend, options()).await;
    let token = t.user("nia").await;
    let other = t.user("oz").await;

    let state = t.get("/v1/tools/news_search", &token).await;
    assert_eq!(state.body["reason"]["code"], "news_hub_empty", "{state:?}");

    let rss = add_source(&t, &token, &format!("{base}/rss.xml"), "Gazette").await;
    let atom = add_source(&t, &token, &format!("{base}/atom.xml"), "Orbital").await;
    let jf = add_source(&t, &token, &format!("{base}/feed.json"), "Garden").await;
    let s = wait_source(&t, &token, &rss, |s| s["status"] == "ok").await;
    assert_eq!((s["item_count"].as_i64(), s["feed_format"].as_str()), (Some(2), Some("rss")), "{s}");
    assert_eq!(s["feed_title"], "Harbor Gazette");
    assert_eq!(s["last_fetch"]["status"], 200);
    assert_eq!(s["last_fetch"]["inserted"], 2);
    assert!(s["last_error"].is_null());
    let s = wait_source(&t, &token, &atom, |s| s["status"] == "ok").await;
    assert_eq!((s["item_count"].as_i64(), s["feed_format"].as_str()), (Some(1), Some("atom")), "{s}");
    let s = wait_source(&t, &token, &jf, |s| s["status"] == "ok").await;
    assert_eq!((s["item_count"].as_i64(), s["feed_format"].as_str()), (Some(1), Some("json_feed")), "{s}");

    let list = t.get("/v1/news/sources?limit=2", &token).await;
    assert_eq!(list.body["sources"].as_array().unwrap().len(), 2);
    let next = list.body["next_cursor"].as_str().unwrap();
    let page2 = t.get(&format!("/v1/news/sources?limit=2&cursor={next}"), &token).await;
    assert_eq!(page2.body["sources"].as_array().unwrap().len(), 1);
    assert!(page2.body["next_cursor"].is_null());

    // A word that appears only in an item's body (content:encoded), in a stemmed form.
    let done = news(&t, &token, json!({"query": "stevedore"})).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(titles(&done), ["Dock workers vote on new contract"]);
    let hit = &done["result"]["output"]["results"][0];
    assert_eq!(hit["url"], "https://gazette.example/2025/06/contract");
    assert_eq!(hit["published_at"], "2025-06-09T18:00:00.000Z");
    assert!(hit["collected_at"].is_string());
    assert_eq!(hit["source"]["id"], rss);
    assert_eq!(hit["source"]["name"], "Gazette");
    assert!(hit["snippet"].as_str().unwrap().to_lowercase().contains("stevedores"), "{hit}");
    assert_eq!(done["result"]["output"]["source"], "news_hub");
    let ev = t.get(&format!("/v1/evidence/{}", done["evidence_ids"][0].as_str().unwrap()), &token).await;
    assert_eq!(ev.body["kind"], "news_item");
    let p = &ev.body["provenance"];
    assert_eq!(p["news_source"]["id"], rss);
    assert_eq!(p["item_url"], "https://gazette.example/2025/06/contract");
    assert_eq!(p["published_at"], "2025-06-09T18:00:00.000Z");
    assert_eq!(p["collected_at"], hit["collected_at"]);

    // Atom HTML content and JSON Feed content_text are searchable too.
    assert_eq!(titles(&news(&t, &token, json!({"query": "cryogenic"})).await), ["Telescope mirror cleaned"]);
    assert_eq!(titles(&news(&t, &token, json!({"query": "marmalade"})).await), ["Tomatoes ripen"]);
    // Phrases, OR, exclusion.
    assert_eq!(titles(&news(&t, &token, json!({"query": "\"summer sailings\""})).await), ["Ferry timetable changes"]);
    let both = titles(&news(&t, &token, json!({"query": "ferry or telescope", "sort": "time"})).await);
    assert_eq!(both, ["Telescope mirror cleaned", "Ferry timetable changes"], "newest first");
    assert!(titles(&news(&t, &token, json!({"query": "ferry -summer"})).await).is_empty());
    // Filters: since/until on the publication time, source by name.
    let recent = news(&t, &token, json!({"query": "ferry or contract or telescope", "since": "2025-06-01"})).await;
    let mut got = titles(&recent);
    got.sort();
    assert_eq!(got, ["Dock workers vote on new contract", "Telescope mirror cleaned"]);
    assert_eq!(recent["result"]["output"]["since"], "2025-06-01T00:00:00.000Z");
    let old = news(&t, &token, json!({"query": "ferry or contract", "until": "2025-05-31"})).await;
    assert_eq!(titles(&old), ["Ferry timetable changes"]);
    let only = news(&t, &token, json!({"query": "ferry or telescope", "source": "Orbital"})).await;
    assert_eq!(titles(&only), ["Telescope mirror cleaned"]);

    // Bad queries are refused when freezing.
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "news").await;
    for (input, code) in [
        (json!({"query": "-excluded"}), "empty_query"),
        (json!({"query": "***"}), "empty_query"),
        (json!({"query": "x", "since": "last tuesday"}), "invalid_time"),
        (json!({"query": "x", "since": "2025-06-02", "until": "2025-06-01"}), "invalid_range"),
    ] {
        let r = t.call(&token, &run, &turn, "news_search", &format!("bad-{code}-{}", input), input).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, code), "{r:?}");
    }

    // Another user sees none of it.
    assert_eq!(t.get(&format!("/v1/news/sources/{rss}"), &other).await.status, StatusCode::NOT_FOUND);
    assert_eq!(t.get("/v1/tools/news_search", &other).await.body["reason"]["code"], "news_hub_empty");
}

async fn conditional_get_and_changed_items_update_in_place(backend: Backend) {
    let feeds = Feeds::default();
    let base = feed_server(feeds.clone()).await;
    let t = spawn_with(backend, options()).await;
    let token = t.user("pia").await;
    let id = add_source(&t, &token, &format!("{base}/changing.xml"), "Changing").await;
    let s = wait_source(&t, &token, &id, |s| s["status"] == "ok").await;
    assert_eq!(s["item_count"], 2);
    assert_eq!(titles(&news(&t, &token, json!({"query": "saffron"})).await), ["Evolving item"]);

    // Unchanged feed: the server's ETag comes back, it answers 304, nothing is rewritten.
    let first_success = s["last_success_at"].as_str().unwrap().to_owned();
    let r = t.post(&format!("/v1/news/sources/{id}/fetch"), &token, json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let s = wait_source(&t, &token, &id, |s| s["last_success_at"].as_str() > Some(first_success.as_str())).await;
    assert_eq!(s["last_fetch"]["status"], 304, "{s}");
    assert_eq!(feeds.not_modified.load(Ordering::SeqCst), 1);
    assert_eq!(s["item_count"], 2);

    // The feed changes one item's text under the same GUID: updated, not duplicated.
    feeds.version.store(1, Ordering::SeqCst);
    let second = s["last_success_at"].as_str().unwrap().to_owned();
    t.post(&format!("/v1/news/sources/{id}/fetch"), &token, json!({})).await;
    let s = wait_source(&t, &token, &id, |s| s["last_success_at"].as_str() > Some(second.as_str())).await;
    assert_eq!(s["last_fetch"]["status"], 200, "{s}");
    assert_eq!((s["last_fetch"]["inserted"].as_u64(), s["last_fetch"]["updated"].as_u64()), (Some(0), Some(1)), "{s}");
    assert_eq!(s["last_fetch"]["unchanged"], 1);
    assert_eq!(s["item_count"], 2);
    assert!(titles(&news(&t, &token, json!({"query": "saffron"})).await).is_empty(), "old text is gone from the index");
    let hit = news(&t, &token, json!({"query": "vermilion"})).await;
    assert_eq!(titles(&hit), ["Evolving item"]);
    let h = &hit["result"]["output"]["results"][0];
    assert!(h["updated_at"].as_str() > h["collected_at"].as_str(), "{h}");
}

async fn bad_feeds_are_reported_and_backed_off(backend: Backend) {
    let base = feed_server(Feeds::default()).await;
    let t = spawn_with(backend, options()).await;
    let token = t.user("quin").await;
    let src = |path: &str| format!("{base}{path}");
    let malformed = add_source(&t, &token, &src("/malformed.xml"), "Malformed").await;
    let dup = add_source(&t, &token, &src("/dup.xml"), "Dup").await;
    let huge = add_source(&t, &token, &src("/huge.xml"), "Huge").await;
    let large = add_source(&t, &token, &src("/too-large.xml"), "Too large").await;
    let latin = add_source(&t, &token, &src("/latin1.xml"), "Latin-1").await;
    let looping = add_source(&t, &token, &src("/loop-a"), "Loop").await;
    let slow = add_source(&t, &token, &src("/slow.xml"), "Slow").await;
    let gone = add_source(&t, &token, &src("/gone.xml"), "Gone").await;

    let failing = |id: &str, code: &'static str| {
        let id = id.to_owned();
        let t = &t;
        let token = &token;
        async move {
            let s = wait_source(t, token, &id, fetched).await;
            assert_eq!((s["status"].as_str(), s["last_error"]["code"].as_str()), (Some("failing"), Some(code)), "{s}");
            assert_eq!(s["failures"], 1);
            assert!(s["last_success_at"].is_null());
            s
        }
    };
    let s = failing(&malformed, "feed_malformed").await;
    // Backoff: the next fetch is after interval × 2, not after the interval.
    let next = chrono::DateTime::parse_from_rfc3339(s["next_fetch_at"].as_str().unwrap()).unwrap();
    let at = chrono::DateTime::parse_from_rfc3339(s["last_error"]["at"].as_str().unwrap()).unwrap();
    assert!(next - at >= chrono::Duration::seconds(7100), "{s}");
    failing(&large, "feed_too_large").await;
    let s = failing(&looping, "redirect_loop").await;
    assert!(s["last_error"]["message"].as_str().unwrap().contains("loop"), "{s}");
    failing(&slow, "feed_timeout").await;
    let s = failing(&gone, "http_error").await;
    assert_eq!(s["last_error"]["status"], 503);

    let s = wait_source(&t, &token, &dup, fetched).await;
    assert_eq!(s["item_count"], 2, "duplicate GUID stored once: {s}");
    assert_eq!(titles(&news(&t, &token, json!({"query": "copy"})).await), ["First copy"]);

    let s = wait_source(&t, &token, &huge, fetched).await;
    assert_eq!(s["item_count"].as_u64(), Some(MAX_ITEMS as u64), "{s}");
    assert_eq!((s["last_fetch"]["entries"].as_u64(), s["last_fetch"]["truncated"].as_bool()), (Some(200), Some(true)));

    let s = wait_source(&t, &token, &latin, fetched).await;
    assert_eq!((s["status"].as_str(), s["feed_title"].as_str()), (Some("ok"), Some("Café")), "{s}");
    let hit = news(&t, &token, json!({"query": "café"})).await;
    assert_eq!(titles(&hit), ["Crème brûlée au menu"]);
    // Diacritics are folded on SQLite (unicode61 remove_diacritics) but not by Postgres'
    // english configuration, so only the exact spelling is asserted on both.
    assert_eq!(titles(&news(&t, &token, json!({"query": "brûlée"})).await), ["Crème brûlée au menu"]);
}

async fn sources_api_pause_resume_delete_and_sharing(backend: Backend) {
    let base = feed_server(Feeds::default()).await;
    let t = spawn_with(backend, options()).await;
    let token = t.user("rae").await;
    let other = t.user("sol").await;

    for (body, status, code) in [
        (json!({"url": "ftp://x.example/f", "name": "n"}), StatusCode::BAD_REQUEST, "invalid_url"),
        (json!({"url": "not a url", "name": "n"}), StatusCode::BAD_REQUEST, "invalid_url"),
        (json!({"url": format!("{base}/rss.xml"), "name": ""}), StatusCode::BAD_REQUEST, "invalid_name"),
        (
            json!({"url": format!("{base}/rss.xml"), "name": "n", "interval_secs": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_interval",
        ),
        (json!({"url": format!("{base}/rss.xml"), "name": "n", "shared": true}), StatusCode::FORBIDDEN, "forbidden"),
        (json!({"url": format!("{base}/rss.xml")}), StatusCode::BAD_REQUEST, "invalid_request"),
    ] {
        let r = t.post("/v1/news/sources", &token, body.clone()).await;
        assert_eq!((r.status, r.code()), (status, code), "{body}: {r:?}");
    }

    let id = add_source(&t, &token, &format!("{base}/rss.xml"), "Gazette").await;
    let dup = t.post("/v1/news/sources", &token, json!({"url": format!("{base}/rss.xml"), "name": "again"})).await;
    assert_eq!((dup.status, dup.code()), (StatusCode::CONFLICT, "source_exists"));
    wait_source(&t, &token, &id, |s| s["status"] == "ok").await;

    let r = t.post(&format!("/v1/news/sources/{id}/pause"), &token, json!({})).await;
    assert_eq!((r.body["paused"].as_bool(), r.body["status"].as_str()), (Some(true), Some("paused")), "{r:?}");
    let r = t.post(&format!("/v1/news/sources/{id}/fetch"), &token, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "source_paused"));
    // Paused sources' items stay searchable.
    assert_eq!(titles(&news(&t, &token, json!({"query": "stevedores"})).await).len(), 1);
    let r = t.post(&format!("/v1/news/sources/{id}/resume"), &token, json!({})).await;
    assert_eq!(r.body["paused"], false);
    // Another user's source is 404 for every verb.
    for verb in ["pause", "resume", "fetch"] {
        let r = t.post(&format!("/v1/news/sources/{id}/{verb}"), &other, json!({})).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{verb}");
    }
    let r = t.request(reqwest::Method::DELETE, &format!("/v1/news/sources/{id}"), Some(&other), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // A deployment-wide source (admin) is read by everyone, changed only by admins.
    let r = t
        .post(
            "/v1/news/sources",
            &t.admin_token,
            json!({"url": format!("{base}/atom.xml"), "name": "Orbital", "shared": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["shared"], true);
    let shared = r.body["id"].as_str().unwrap().to_owned();
    wait_source(&t, &other, &shared, |s| s["status"] == "ok").await;
    assert_eq!(t.get("/v1/tools/news_search", &other).await.body["state"], "available");
    assert_eq!(titles(&news(&t, &other, json!({"query": "cryogenic"})).await), ["Telescope mirror cleaned"]);
    assert!(titles(&news(&t, &other, json!({"query": "stevedores"})).await).is_empty(), "not another user's items");
    let r = t.post(&format!("/v1/news/sources/{shared}/pause"), &other, json!({})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // Deleting removes the items from search; the last source gone → news_hub_empty.
    let r = t.request(reqwest::Method::DELETE, &format!("/v1/news/sources/{id}"), Some(&token), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(titles(&news(&t, &token, json!({"query": "stevedores"})).await).is_empty());
    let r = t.request(reqwest::Method::DELETE, &format!("/v1/news/sources/{shared}"), Some(&t.admin_token), None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(t.get("/v1/tools/news_search", &token).await.body["reason"]["code"], "news_hub_empty");
    assert_eq!(t.get("/v1/news/sources/nsrc_bad", &token).await.status, StatusCode::NOT_FOUND);
}

/// A fetch in flight (a source that never answers within the test) does not hold up the
/// server's shutdown: the collector ends with the shutdown token.
async fn collector_stops_with_shutdown() {
    let base = feed_server(Feeds::default()).await;
    let mut opts = options();
    opts.runtime.search.news_fetch_timeout_secs = 120;
    let mut t = spawn_with(Backend::Sqlite, opts).await;
    let token = t.user("tom").await;
    let id = add_source(&t, &token, &format!("{base}/slow.xml"), "Slow").await;
    wait_source(&t, &token, &id, |s| s["last_fetch_at"].is_string()).await;
    let hub = t.app().search.clone();
    assert!(!hub.background_finished());
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), t.stop()).await.expect("shutdown finished");
    while !hub.background_finished() {
        assert!(started.elapsed() < Duration::from_secs(5), "the collector outlived the server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Of several collectors (replicas) claiming one due source at once, exactly one wins.
async fn one_claim_wins(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let row = mira::store::NewsSourceRow::new(None, "n".into(), "http://127.0.0.1:9/feed".into(), 60);
    store.create_news_source(&row).await.unwrap();
    let due = store.due_news_sources(&mira::ids::now(), 10).await.unwrap();
    assert_eq!(due.len(), 1);
    let claims = (0..8).map(|i| {
        let store = store.clone();
        let seen = due[0].next_fetch_at.clone();
        let id = row.id.clone();
        tokio::spawn(async move {
            store.claim_news_source(&id, &seen, &mira::ids::now_plus_ms(60_000 + i), &mira::ids::now()).await.unwrap()
        })
    });
    let won: usize = futures::future::join_all(claims).await.into_iter().map(|r| usize::from(r.unwrap())).sum();
    assert_eq!(won, 1);
    assert!(store.due_news_sources(&mira::ids::now(), 10).await.unwrap().is_empty(), "the lease hides it");
    store.close().await;
}

/// The store reads the query language itself on either back-end (FTS5 on SQLite,
/// `websearch_to_tsquery` on Postgres) — no caller translates it — and serialises
/// concurrent fetch writes of one source without an error.
async fn the_store_reads_the_query_language_and_takes_concurrent_fetches(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let row = mira::store::NewsSourceRow::new(None, "n".into(), "http://127.0.0.1:9/feed".into(), 60);
    store.create_news_source(&row).await.unwrap();
    let item = |key: &str, title: &str| mira::store::NewNewsItem {
        dedup_key: format!("guid:{key}"),
        guid: Some(key.to_owned()),
        url: None,
        title: title.to_owned(),
        summary: String::new(),
        content: String::new(),
        author: None,
        published_at: None,
        content_sha256: mira::evidence::sha256_hex(title.as_bytes()),
    };
    let items = vec![item("a", "Rust async runtime"), item("b", "Java beans and Rust"), item("c", "Go channels")];
    let fetches = (0..4).map(|_| {
        let (store, id, items) = (store.clone(), row.id.clone(), items.clone());
        tokio::spawn(async move {
            let now = mira::ids::now();
            let next = mira::ids::now_plus_ms(60_000);
            let rec = mira::store::FetchRecord {
                now: &now,
                next_fetch_at: &next,
                etag: None,
                last_modified: None,
                feed_title: None,
                feed_format: "rss",
                items: &items,
                keep: 10_000,
                keep_per_owner: 100_000,
            };
            store.record_news_fetch(&id, &rec, &json!({})).await.unwrap()
        })
    });
    let inserted: u64 = futures::future::join_all(fetches).await.into_iter().map(|r| r.unwrap().inserted).sum();
    assert_eq!(inserted, 3, "each item stored once");
    let user = mira::ids::new_id("usr");
    let search = |text: &'static str| {
        let store = store.clone();
        let user = user.clone();
        async move {
            let q = mira::store::NewsQuery {
                user_id: &user,
                text,
                since: None,
                until: None,
                source: None,
                sort: mira::store::NewsSort::Relevance,
                limit: 10,
            };
            let mut titles: Vec<String> = store.search_news(&q).await.unwrap().into_iter().map(|h| h.title).collect();
            titles.sort();
            titles
        }
    };
    assert_eq!(search("rust").await, ["Java beans and Rust", "Rust async runtime"]);
    assert_eq!(search("rust -java").await, ["Rust async runtime"]);
    assert_eq!(search("\"async runtime\"").await, ["Rust async runtime"]);
    assert_eq!(search("channels or java").await, ["Go channels", "Java beans and Rust"]);
    assert!(search("-rust").await.is_empty(), "no positive term finds nothing");
    store.close().await;
}

/// The newest [`mira::store::NEWS_RANK_POOL`] matches are ranked, found the same way on both
/// back-ends whatever path the store takes (SQLite: from the matches, or down the time index;
/// Postgres: window by window), with and without the per-source visibility condition, with
/// since/until, for words in every item, in one in ten, in three, and for phrases.
async fn search_ranks_the_newest_matches(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let reader = store.create_user("reader", false, &mira::auth::hash_token("r")).await.unwrap();
    let owner = store.create_user("owner", false, &mira::auth::hash_token("o")).await.unwrap();
    let shared = mira::store::NewsSourceRow::new(None, "shared".into(), "http://127.0.0.1:9/a".into(), 60);
    let private =
        mira::store::NewsSourceRow::new(Some(owner.id.clone()), "own".into(), "http://127.0.0.1:9/b".into(), 60);
    store.create_news_source(&shared).await.unwrap();
    store.create_news_source(&private).await.unwrap();
    let base = chrono::DateTime::parse_from_rfc3339("2025-01-01T00:00:00Z").unwrap().with_timezone(&chrono::Utc);
    let at = |i: usize| mira::ids::format_time(base + chrono::Duration::minutes(i as i64));
    const N: usize = 2600;
    let item = |i: usize, title: String| mira::store::NewNewsItem {
        dedup_key: format!("guid:{i}"),
        guid: Some(format!("{i}")),
        url: None,
        summary: String::new(),
        content: format!("n{i}"),
        author: None,
        published_at: Some(at(i)),
        content_sha256: mira::evidence::sha256_hex(title.as_bytes()),
        title,
    };
    // Every item has "alpha" once — item 5 (old) five times, item N-10 three times; one in ten
    // has "beta"; three have "gamma"; one in fifty "delta epsilon", another one in fifty the
    // reverse.
    let items: Vec<_> = (0..N)
        .map(|i| {
            let mut t = match i {
                5 => "alpha alpha alpha alpha alpha".to_owned(),
                i if i == N - 10 => "alpha alpha alpha".to_owned(),
                _ => "alpha".to_owned(),
            };
            if i % 10 == 0 {
                t.push_str(" beta");
            }
            if i % 1000 == 7 {
                t.push_str(" gamma");
            }
            match i % 50 {
                0 => t.push_str(" delta epsilon"),
                25 => t.push_str(" epsilon delta"),
                _ => {}
            }
            item(i, t)
        })
        .collect();
    let record = |items: &[mira::store::NewNewsItem], id: String| {
        let store = store.clone();
        let items = items.to_vec();
        async move {
            let now = mira::ids::now();
            let rec = mira::store::FetchRecord {
                now: &now,
                next_fetch_at: &now,
                etag: None,
                last_modified: None,
                feed_title: None,
                feed_format: "rss",
                items: &items,
                keep: 10_000,
                keep_per_owner: 100_000,
            };
            store.record_news_fetch(&id, &rec, &json!({})).await.unwrap();
        }
    };
    record(&items, shared.id.clone()).await;
    // The owner's private source: "beta" items newer than every shared one.
    let own: Vec<_> = (N..N + 5).map(|i| item(i, "beta own".to_owned())).collect();
    record(&own, private.id.clone()).await;
    store.refresh_news_statistics().await.unwrap();

    let search = |user: String, text: &'static str, sort, since: Option<String>, until: Option<String>| {
        let store = store.clone();
        async move {
            let q = mira::store::NewsQuery {
                user_id: &user,
                text,
                since: since.as_deref(),
                until: until.as_deref(),
                source: None,
                sort,
                limit: 10,
            };
            let hits = store.search_news(&q).await.unwrap();
            hits.into_iter().map(|h| h.guid.unwrap().parse::<usize>().unwrap()).collect::<Vec<_>>()
        }
    };
    use mira::store::NewsSort::{Relevance, Time};
    let r = reader.id.clone();
    let newest = |pick: &dyn Fn(usize) -> bool, below: usize| -> Vec<usize> {
        (0..=below).rev().filter(|i| pick(*i)).take(10).collect()
    };
    assert_eq!(search(r.clone(), "alpha", Time, None, None).await, newest(&|_| true, N - 1));
    let best = search(r.clone(), "alpha", Relevance, None, None).await;
    assert_eq!(best[0], N - 10, "the best of the newest matches first: {best:?}");
    assert!(!best.contains(&5), "item 5 scores higher but is not among the newest matches: {best:?}");
    assert_eq!(search(r.clone(), "beta", Time, None, None).await, newest(&|i| i % 10 == 0, N - 1));
    assert_eq!(search(r.clone(), "gamma", Time, None, None).await, [2007, 1007, 7]);
    let mut rare = search(r.clone(), "gamma", Relevance, None, None).await;
    rare.sort();
    assert_eq!(rare, [7, 1007, 2007]);
    assert_eq!(search(r.clone(), "\"delta epsilon\"", Time, None, None).await, newest(&|i| i % 50 == 0, N - 1));
    assert_eq!(
        search(r.clone(), "beta", Time, Some(at(2000)), Some(at(2300))).await,
        newest(&|i| i % 10 == 0, 2300),
        "since/until"
    );
    assert_eq!(search(r.clone(), "alpha", Time, None, Some(at(100))).await, newest(&|_| true, 100));
    // The owner sees every source (no source condition): its own items come first.
    let o = owner.id.clone();
    let mut expected: Vec<usize> = (N..N + 5).rev().collect();
    expected.extend(newest(&|i| i % 10 == 0, N - 1).into_iter().take(5));
    assert_eq!(search(o.clone(), "beta", Time, None, None).await, expected);
    store.close().await;
}

/// Phrases find exactly the items whose words stand in that order, on both back-ends — on
/// Postgres through the adjacent-pair prefilter (migration 0020) whenever every match needs
/// the pair: plain phrases, longer ones, with another word, a negation, under OR (no
/// prefilter), a hyphenated word (a phrase to Postgres). Checked against a brute-force scan.
async fn phrases_find_the_same_items_as_a_scan(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let user = store.create_user("reader", false, &mira::auth::hash_token("r")).await.unwrap();
    let source = mira::store::NewsSourceRow::new(None, "s".into(), "http://127.0.0.1:9/p".into(), 60);
    store.create_news_source(&source).await.unwrap();
    let base = chrono::DateTime::parse_from_rfc3339("2025-01-01T00:00:00Z").unwrap().with_timezone(&chrono::Utc);
    const VOCABULARY: [&str; 6] = ["alpha", "delta", "kilo", "bravo", "lima", "tango"];
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let titles: Vec<String> = (0..400)
        .map(|i| {
            let mut words: Vec<&str> = (0..6).map(|_| VOCABULARY[(next() % 6) as usize]).collect();
            if i % 7 == 3 {
                words.push("echo-oscar");
            }
            words.join(" ")
        })
        .collect();
    let items: Vec<_> = titles
        .iter()
        .enumerate()
        .map(|(i, title)| mira::store::NewNewsItem {
            dedup_key: format!("guid:{i}"),
            guid: Some(format!("{i}")),
            url: None,
            title: title.clone(),
            summary: String::new(),
            content: format!("n{i}"),
            author: None,
            published_at: Some(mira::ids::format_time(base + chrono::Duration::minutes(i as i64))),
            content_sha256: mira::evidence::sha256_hex(title.as_bytes()),
        })
        .collect();
    let now = mira::ids::now();
    let rec = mira::store::FetchRecord {
        now: &now,
        next_fetch_at: &now,
        etag: None,
        last_modified: None,
        feed_title: None,
        feed_format: "rss",
        items: &items,
        keep: 10_000,
        keep_per_owner: 100_000,
    };
    store.record_news_fetch(&source.id, &rec, &json!({})).await.unwrap();
    store.refresh_news_statistics().await.unwrap();

    // The words of a title as both back-ends index them (no stemming changes these words).
    let words = |t: &str| mira::store::news_query::words(t);
    let has = |i: usize, phrase: &str| {
        let (doc, p) = (words(&titles[i]), words(phrase));
        doc.windows(p.len()).any(|w| w == p.as_slice())
    };
    type Expect<'a> = Box<dyn Fn(usize) -> bool + 'a>;
    let cases: Vec<(&str, Expect)> = vec![
        ("\"alpha delta\"", Box::new(|i| has(i, "alpha delta"))),
        ("\"delta alpha kilo\"", Box::new(|i| has(i, "delta alpha kilo"))),
        ("\"bravo tango\" lima", Box::new(|i| has(i, "bravo tango") && has(i, "lima"))),
        ("\"lima bravo\" -alpha", Box::new(|i| has(i, "lima bravo") && !has(i, "alpha"))),
        ("\"alpha delta\" or \"tango tango\"", Box::new(|i| has(i, "alpha delta") || has(i, "tango tango"))),
        ("echo-oscar", Box::new(|i| titles[i].contains("echo-oscar"))),
        ("\"tango echo-oscar\"", Box::new(|i| titles[i].contains("tango echo-oscar"))),
    ];
    for (text, matches) in &cases {
        let q = mira::store::NewsQuery {
            user_id: &user.id,
            text,
            since: None,
            until: None,
            source: None,
            sort: mira::store::NewsSort::Time,
            limit: 50,
        };
        let got: Vec<usize> =
            store.search_news(&q).await.unwrap().into_iter().map(|h| h.guid.unwrap().parse().unwrap()).collect();
        let expected: Vec<usize> = (0..titles.len()).rev().filter(|i| matches(*i)).take(50).collect();
        assert!(!expected.is_empty(), "{text} matches something");
        assert_eq!(got, expected, "{text}");
    }
    if backend == Backend::Postgres {
        // The pair index answers a phrase's pairs (the planner may pick it).
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("SET enable_seqscan = off").execute(&mut conn).await.unwrap();
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN SELECT id FROM news_items i
             WHERE i.phrase_pairs @> news_pair_hashes('[\"alpha delta\"]')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(plan.iter().any(|l| l.contains("news_items_pairs")), "{plan:?}");
        let expected = (0..titles.len()).filter(|i| has(*i, "alpha delta")).count() as i64;
        let candidates: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM news_items WHERE phrase_pairs @> news_pair_hashes('[\"alpha delta\"]')",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(candidates, expected, "the pairs are the adjacent words");
    }
    store.close().await;
}

/// A non-admin's feed URL is held to public addresses when it is fetched, not only when it is
/// added: a name that resolves to an internal address now (DNS rebinding) and a redirect to an
/// internal address are refused; an admin's own source at the same URL is fetched.
async fn a_non_admins_feed_reaches_no_internal_address_at_fetch_time(backend: Backend) {
    let base = feed_server(Feeds::default()).await;
    let port = base.rsplit(':').next().unwrap().to_owned();
    let mut opts = options();
    opts.runtime.allow_internal_urls = false;
    let t = spawn_with(backend, opts).await;
    let eve = t.user("eve").await;
    let eve_id = t.get("/v1/me", &eve).await.body["id"].as_str().unwrap().to_owned();
    let admin_id = t.get("/v1/me", &t.admin_token).await.body["id"].as_str().unwrap().to_owned();
    let by_name = format!("http://localhost:{port}/rss.xml");
    // At creation the rule holds already.
    let r = t.post("/v1/news/sources", &eve, json!({"url": by_name, "name": "local"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{r:?}");
    // Sources stored while their names still resolved to public addresses (made directly in
    // the store here): the fetch checks again.
    let mut ids = Vec::new();
    for (owner, url, name) in [
        (&eve_id, by_name.clone(), "rebound"),
        (&eve_id, format!("{base}/to-rss"), "redirected"),
        (&admin_id, by_name.clone(), "admin's"),
    ] {
        let row = mira::store::NewsSourceRow::new(Some(owner.clone()), name.into(), url, 3600);
        t.app().store.create_news_source(&row).await.unwrap();
        ids.push(row.id);
    }
    for (id, token) in [(&ids[0], &eve), (&ids[1], &eve), (&ids[2], &t.admin_token)] {
        let r = t.post(&format!("/v1/news/sources/{id}/fetch"), token, json!({})).await;
        assert!(r.status.is_success(), "{r:?}");
    }
    for id in &ids[..2] {
        let s = wait_source(&t, &eve, id, fetched).await;
        assert!(s["last_success_at"].is_null(), "{s}");
        assert_eq!(s["last_error"]["code"], "internal_address", "{s}");
        let message = s["last_error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("internal address"), "{s}");
    }
    let s = wait_source(&t, &t.admin_token, &ids[2], fetched).await;
    assert!(s["last_success_at"].is_string(), "{s}");
}

/// A user's own news sources and search connections are counted and inserted in one write
/// transaction under the user's lock: of many concurrent creates exactly `limit` are stored
/// (counting first and inserting after let every one of them pass), and another user's
/// creates are not counted against theirs.
async fn per_user_limits_hold_under_concurrent_creates(backend: Backend) {
    let t = spawn_with(backend, options()).await;
    let mut users = Vec::new();
    for name in ["sam", "ada"] {
        let r = t.post("/v1/users", &t.admin_token, json!({"name": name})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        users.push(r.body["user"]["id"].as_str().unwrap().to_owned());
    }
    let store = t.app().store.clone();
    let limit = 5;
    let creates = (0..40).map(|i| {
        let store = store.clone();
        let owner = users[0].clone();
        tokio::spawn(async move {
            let source = mira::store::NewsSourceRow::new(
                Some(owner.clone()),
                format!("s{i}"),
                format!("http://feed.test/{i}"),
                60,
            );
            let now = mira::ids::now();
            let connection = mira::store::SearchConnectionRow {
                id: mira::ids::new_id("sconn"),
                owner_id: owner,
                provider: "searxng".into(),
                name: format!("c{i}"),
                base_url: format!("http://search.test/{i}"),
                credential_kind: "none".into(),
                credential_ciphertext: None,
                credential_key_id: None,
                credential_env: None,
                enabled: false,
                created_at: now.clone(),
                updated_at: now,
            };
            let (a, b) = tokio::join!(
                store.create_news_source_within(&source, limit),
                store.create_search_connection(&connection, limit)
            );
            (usize::from(a.unwrap()), usize::from(b.unwrap()))
        })
    });
    let created = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(Result::unwrap)
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    assert_eq!(created, (5, 5));
    let pool = sqlx::AnyPool::connect(&t.db.url).await.unwrap();
    for table in ["news_sources", "search_connections"] {
        let n: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table} WHERE owner_id = $1")))
                .bind(&users[0])
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(n, 5, "{table}");
    }
    pool.close().await;
    // The limit is per user.
    let other = mira::store::NewsSourceRow::new(Some(users[1].clone()), "o".into(), "http://feed.test/0".into(), 60);
    assert!(store.create_news_source_within(&other, limit).await.unwrap());
    // A deployment-wide source counts against no one's limit.
    let shared = mira::store::NewsSourceRow::new(None, "d".into(), "http://feed.test/d".into(), 60);
    assert!(store.create_news_source_within(&shared, 0).await.unwrap());
}

/// A source keeps its newest `keep` items: a feed that brings new ids at every fetch (a
/// hostile one, or a busy one) does not grow the table without end. The removal happens in
/// the fetch's transaction, oldest (by publication time) first, and the source's count
/// follows.
async fn a_source_keeps_its_newest_items_only(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let source = mira::store::NewsSourceRow::new(None, "s".into(), "http://127.0.0.1:9/p".into(), 60);
    store.create_news_source(&source).await.unwrap();
    let base = chrono::DateTime::parse_from_rfc3339("2025-01-01T00:00:00Z").unwrap().with_timezone(&chrono::Utc);
    let item = |i: i64| mira::store::NewNewsItem {
        dedup_key: format!("guid:{i}"),
        guid: Some(format!("{i}")),
        url: None,
        title: format!("item {i}"),
        summary: String::new(),
        content: String::new(),
        author: None,
        published_at: Some(mira::ids::format_time(base + chrono::Duration::minutes(i))),
        content_sha256: mira::evidence::sha256_hex(format!("{i}").as_bytes()),
    };
    let mut removed = Vec::new();
    for fetch in 0..4i64 {
        // Each fetch: 4 new ids, listed newest last; one of them older than all kept.
        let items: Vec<_> =
            [fetch * 10 + 1, fetch * 10 + 2, fetch * 10 + 3, fetch - 100].into_iter().map(item).collect();
        let now = mira::ids::now();
        let rec = mira::store::FetchRecord {
            now: &now,
            next_fetch_at: &now,
            etag: None,
            last_modified: None,
            feed_title: None,
            feed_format: "rss",
            items: &items,
            keep: 5,
            keep_per_owner: 100_000,
        };
        removed.push(store.record_news_fetch(&source.id, &rec, &json!({})).await.unwrap().removed);
    }
    assert_eq!(removed, [0, 3, 4, 4], "removed per fetch");
    let row = store.news_source(&source.id).await.unwrap().unwrap();
    assert_eq!(row.item_count, 5);
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let mut kept: Vec<String> = sqlx::query_scalar("SELECT guid FROM news_items WHERE source_id = $1")
        .bind(&source.id)
        .fetch_all(&pool)
        .await
        .unwrap();
    kept.sort();
    assert_eq!(kept, ["22", "23", "31", "32", "33"].map(String::from), "the newest five stay");
    pool.close().await;

    // A user's sources keep `keep_per_owner` items together: with 4 in one, another keeps 2.
    let user = store.create_user("reader", false, &mira::auth::hash_token("r")).await.unwrap();
    let fetch = |id: String, items: Vec<mira::store::NewNewsItem>| {
        let store = store.clone();
        async move {
            let now = mira::ids::now();
            let rec = mira::store::FetchRecord {
                now: &now,
                next_fetch_at: &now,
                etag: None,
                last_modified: None,
                feed_title: None,
                feed_format: "rss",
                items: &items,
                keep: 5,
                keep_per_owner: 6,
            };
            store.record_news_fetch(&id, &rec, &json!({})).await.unwrap().removed
        }
    };
    let mut own = Vec::new();
    for name in ["a", "b"] {
        let row =
            mira::store::NewsSourceRow::new(Some(user.id.clone()), name.into(), format!("http://feed.test/{name}"), 60);
        store.create_news_source(&row).await.unwrap();
        own.push(row.id);
    }
    assert_eq!(fetch(own[0].clone(), (100..104).map(item).collect()).await, 0);
    assert_eq!(fetch(own[1].clone(), (200..204).map(item).collect()).await, 2, "the user's other source holds 4 of 6");
    let counts: Vec<i64> = futures::future::join_all(own.iter().map(|id| store.news_source(id)))
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap().item_count)
        .collect();
    assert_eq!(counts, [4, 2]);
    store.close().await;
}

both_backends!(
    a_source_keeps_its_newest_items_only,
    per_user_limits_hold_under_concurrent_creates,
    a_non_admins_feed_reaches_no_internal_address_at_fetch_time,
    phrases_find_the_same_items_as_a_scan,
    search_ranks_the_newest_matches,
    the_store_reads_the_query_language_and_takes_concurrent_fetches,
    one_claim_wins,
    collects_rss_atom_and_json_feed_and_searches_them,
    conditional_get_and_changed_items_update_in_place,
    bad_feeds_are_reported_and_backed_off,
    sources_api_pause_resume_delete_and_sharing,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_ends_with_the_server() {
    collector_stops_with_shutdown().await;
}
