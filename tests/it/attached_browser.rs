//! The Attached Browser against a second real Chromium (Debian's `chromium`,
//! `MIRA_WEB_CHROMIUM`) that the test starts as "the user's browser", with its own profile
//! (`--user-data-dir`) and debugging port, on both back-ends.
//!
//! Checked: a non-admin pointing the endpoint at loopback is refused (`internal_address`);
//! an admin's connection lists the browser's tabs (inventory) and grants none until the user
//! picks one (by target id, later by URL prefix); the tools act in the granted tab only
//! (snapshot, approved click changing the page, a snapshot of the other tab refused with
//! `tab_not_granted`, navigation to an origin outside the grant blocked in the network layer
//! and never reaching that server); kill -9 of the browser turns the ladder `browser_gone`
//! within moments; a restart on the same port brings the tools back without any call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Backend, Options, TestApp, spawn_with};

both_backends!(
    attach_act_on_the_granted_tab_only_and_survive_a_restart,
    a_user_s_own_browser_binds_its_approvals_and_is_theirs_alone,
    a_device_runner_carries_the_user_s_browser
);

const APP: &str = r#"<!doctype html><html><head><title>User app</title></head><body>
<h1>The user's app</h1>
<p id="status">Not pressed</p>
<button onclick="document.getElementById('status').textContent='Pressed!'">Press me</button>
</body></html>"#;

const OTHER: &str = r#"<!doctype html><html><head><title>Private mail</title></head><body>
<h1>Private mail</h1><p>Nothing for the agent here.</p></body></html>"#;

/// The user's pages: `/app` (granted) and `/other` (not granted).
async fn serve_pages() -> String {
    use axum::response::Html;
    let app = axum::Router::new()
        .route("/app", axum::routing::get(|| async { Html(APP) }))
        .route("/other", axum::routing::get(|| async { Html(OTHER) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A server outside the granted origins that counts its hits.
async fn serve_outside(hits: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().fallback(move || {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            axum::response::Html("<h1>outside</h1>")
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// "The user's browser": a Chromium with its own profile and debugging port, killed on drop.
struct UserBrowser {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl UserBrowser {
    async fn start(port: u16, profile: tempfile::TempDir) -> UserBrowser {
        mira::net::install_tls_provider();
        let chromium = std::env::var_os("MIRA_WEB_CHROMIUM")
            .map(std::path::PathBuf::from)
            .or_else(|| mira::tools::browser::manager::find_chromium(None))
            .expect("chromium (scripts/setup-web.sh installs it; MIRA_WEB_CHROMIUM names it)");
        let mut cmd = Command::new(chromium);
        cmd.args(["--headless", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--remote-debugging-port={port}"))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if rustix::process::geteuid().is_root() {
            cmd.arg("--no-sandbox");
        }
        let child = cmd.spawn().unwrap();
        let b = UserBrowser { child, port, profile };
        for _ in 0..100 {
            if reqwest::get(format!("{}/json/version", b.endpoint())).await.is_ok_and(|r| r.status().is_success()) {
                return b;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the user's chromium did not open its debugging port {port}");
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The user opens a tab at `url`; returns its target id.
    async fn open(&self, url: &str) -> String {
        let r = reqwest::Client::new().put(format!("{}/json/new?{url}", self.endpoint())).send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        let id = v["id"].as_str().unwrap().to_owned();
        // Until it has loaded.
        for _ in 0..100 {
            let list: Value =
                reqwest::get(format!("{}/json/list", self.endpoint())).await.unwrap().json().await.unwrap();
            if list.as_array().unwrap().iter().any(|t| t["id"] == id && t["url"] == url && t["title"] != "") {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tab {url} did not load");
    }

    /// kill -9, then the profile is handed back for a restart.
    fn kill(mut self) -> (u16, tempfile::TempDir) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let port = self.port;
        let profile = std::mem::replace(&mut self.profile, tempfile::tempdir().unwrap());
        (port, profile)
    }
}

impl Drop for UserBrowser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fx {
    t: TestApp,
    token: String,
    run: String,
    turn: String,
    calls: usize,
}

impl Fx {
    async fn tool(&self, id: &str) -> Value {
        let r = self.t.get(&format!("/v1/tools/{id}"), &self.token).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body
    }

    /// Polls the ladder of attached_browser_snapshot until its reason is `code` (None =
    /// available); returns how long it took.
    async fn wait_reason(&self, code: Option<&str>, within: Duration) -> Duration {
        let start = Instant::now();
        let mut last = Value::Null;
        while start.elapsed() < within {
            last = self.tool("attached_browser_snapshot").await;
            if last["reason"]["code"].as_str() == code && (code.is_some() || last["state"] == "available") {
                return start.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("attached_browser_snapshot never reached {code:?}: {last}");
    }

    async fn freeze(&mut self, tool: &str, input: Value) -> crate::common::Resp {
        self.calls += 1;
        let call = format!("c{}", self.calls);
        self.t.call(&self.token, &self.run, &self.turn, tool, &call, input).await
    }

    async fn wait(&self, inv: &Value) -> Value {
        for _ in 0..3 {
            let r =
                self.t.get(&format!("/v1/invocations/{}", inv["invocation_id"].as_str().unwrap()), &self.token).await;
            if !matches!(r.body["status"].as_str(), Some("queued" | "running")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.t.wait_final(&self.token, inv["invocation_id"].as_str().unwrap()).await
    }

    async fn run(&mut self, tool: &str, input: Value) -> Value {
        let r = self.freeze(tool, input).await;
        assert!(r.status.is_success(), "{tool}: {r:?}");
        assert_ne!(r.body["status"], "awaiting_approval", "{tool} needs no approval: {r:?}");
        self.wait(&r.body).await
    }

    async fn approved(&mut self, tool: &str, input: Value) -> (Value, Value) {
        let r = self.freeze(tool, input).await;
        assert!(r.status.is_success(), "{tool}: {r:?}");
        assert_eq!(r.body["status"], "awaiting_approval", "{tool} waits for approval: {r:?}");
        let inv = r.body;
        let a = self.t.get(&format!("/v1/approvals/{}", inv["approval_id"].as_str().unwrap()), &self.token).await;
        let preview = a.body["preview"]["tool"].clone();
        let g = self
            .t
            .post(
                &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
                &self.token,
                json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
            )
            .await;
        assert_eq!(g.status, StatusCode::OK, "{g:?}");
        (preview, self.wait(&inv).await)
    }

    async fn patch(&self, id: &str, patch: Value) -> Value {
        let r = self
            .t
            .request(reqwest::Method::PATCH, &format!("/v1/connections/{id}"), Some(&self.token), Some(patch))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        r.body
    }
}

fn reference(tree: &str, needle: &str) -> String {
    let line = tree.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle} not in\n{tree}"));
    let start = line.find("[ref=").unwrap_or_else(|| panic!("no ref on {line}")) + 5;
    line[start..].split(']').next().unwrap().to_owned()
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn attach_act_on_the_granted_tab_only_and_survive_a_restart(backend: Backend) {
    let site = serve_pages().await;
    let hits = Arc::new(AtomicUsize::new(0));
    let outside = serve_outside(hits.clone()).await;
    let user = UserBrowser::start(free_port(), tempfile::tempdir().unwrap()).await;
    let app_tab = user.open(&format!("{site}/app")).await;
    let other_tab = user.open(&format!("{site}/other")).await;

    let mut options = Options::default();
    options.runtime.allow_internal_urls = false;
    options.runtime.browser = mira::tools::browser::BrowserSettings {
        chromium: std::env::var_os("MIRA_WEB_CHROMIUM").map(Into::into),
        allow_origins: vec![site.clone()],
        ..Default::default()
    };
    let t = spawn_with(backend, options).await;

    // A non-admin may not point the server at a loopback debugging endpoint (it could be the
    // server's own browser, or another user's).
    let alice = t.user("alice").await;
    let settings = json!({"endpoint": user.endpoint(), "tabs": [], "origins": [site]});
    let r = t
        .post(
            "/v1/connections",
            &alice,
            json!({"kind": "browser", "name": "mine", "settings": settings, "credential": {}}),
        )
        .await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{r:?}");
    // Nor share one; nor give a credential; the endpoint is http://host:port.
    let token = t.admin_token.clone();
    let shared = t
        .post(
            "/v1/connections",
            &token,
            json!({"kind": "browser", "settings": settings, "credential": {}, "shared": true}),
        )
        .await;
    assert_eq!((shared.status, shared.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{shared:?}");
    let bad = t
        .post(
            "/v1/connections",
            &token,
            json!({"kind": "browser", "settings": {"endpoint": format!("{}/json", user.endpoint()), "origins": [site]}, "credential": {}}),
        )
        .await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_field"), "{bad:?}");

    // The admin connects their browser: the check lists its tabs; nothing is granted yet.
    let created = t
        .post(
            "/v1/connections",
            &token,
            json!({"kind": "browser", "name": "my chromium", "settings": settings, "credential": {}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let conn = created.body["id"].as_str().unwrap().to_owned();
    let inventory = created.body["inventory"].as_array().unwrap_or_else(|| panic!("{created:?}")).clone();
    for (id, title) in [(&app_tab, "User app"), (&other_tab, "Private mail")] {
        assert!(inventory.iter().any(|t| t["target_id"] == *id && t["title"] == title), "{inventory:?}");
    }
    assert_eq!(created.body["permissions"]["browser.attached"]["access"]["state"], "unknown", "{created:?}");
    let mut f = Fx { t, token, run: String::new(), turn: String::new(), calls: 0 };
    let view = f.tool("attached_browser_snapshot").await;
    assert_eq!(view["reason"]["code"], "permission_unknown", "{view}");

    // Grant the app tab (by target id): usable.
    let started = Instant::now();
    let granted =
        f.patch(&conn, json!({"settings": {"endpoint": user.endpoint(), "tabs": [app_tab], "origins": [site]}})).await;
    assert_eq!(granted["permissions"]["browser.attached"]["access"]["state"], "granted", "{granted}");
    f.wait_reason(None, Duration::from_secs(5)).await;
    f.run = f.t.run(&f.token).await;
    let (turn, exposure) =
        f.t.turn(
            &f.token,
            &f.run,
            "use my attached browser: snapshot the page of my attached browser tab, click a button there, navigate \
             the attached browser; also the managed browser",
        )
        .await;
    f.turn = turn;
    for tool in ["attached_browser_snapshot", "attached_browser_click", "attached_browser_navigate", "browser_snapshot"]
    {
        assert!(exposure.to_string().contains(&format!("\"{tool}\"")), "{tool} not exposed: {exposure}");
    }
    let snap = f.run("attached_browser_snapshot", json!({})).await;
    let attach_to_first_snapshot = started.elapsed();
    assert_eq!(snap["status"], "completed", "{snap}");
    let out = snap["result"]["output"].clone();
    assert_eq!(out["tab"], app_tab.as_str(), "{out}");
    assert_eq!(out["connection_id"], conn.as_str(), "{out}");
    assert_eq!(out["trust"], "third_party");
    let tree = out["tree"].as_str().unwrap();
    assert!(tree.contains("Not pressed") && !tree.contains("Private mail"), "{tree}");

    // An approved click acts in the user's tab; the approval binds the connection.
    let press = reference(tree, "button \"Press me\"");
    let (preview, click) =
        f.approved("attached_browser_click", json!({"snapshot_id": out["snapshot_id"], "ref": press})).await;
    assert_eq!(preview["element"]["name"], "Press me", "{preview}");
    assert_eq!(preview["connection_id"], conn.as_str(), "{preview}");
    assert_eq!(click["status"], "completed", "{click}");
    assert_eq!(click["input"]["connection_id"], conn.as_str(), "{click}");
    assert!(click["input"]["connection_fingerprint"].as_str().is_some_and(|s| s.len() == 32), "{click}");
    let after = f.run("attached_browser_snapshot", json!({})).await;
    assert!(after["result"]["output"]["tree"].as_str().unwrap().contains("Pressed!"), "{after}");

    // The other tab is not granted: refused, never read.
    let other = f.freeze("attached_browser_snapshot", json!({"tab": other_tab})).await;
    assert_eq!((other.status, other.code()), (StatusCode::FORBIDDEN, "tab_not_granted"), "{other:?}");
    assert!(!other.body.to_string().contains("Nothing for the agent"), "{other:?}");
    let tabs = f.run("attached_browser_tabs", json!({"action": "list"})).await;
    let listed = tabs["result"]["output"]["tabs"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "only the granted tab is listed: {tabs}");
    assert_eq!(listed[0]["tab"], app_tab.as_str());
    // The attached browser's tools open and close no tabs.
    let new_tab = f.freeze("attached_browser_navigate", json!({"url": format!("{site}/app"), "new_tab": true})).await;
    assert_eq!((new_tab.status, new_tab.code()), (StatusCode::BAD_REQUEST, "invalid_field"), "{new_tab:?}");
    // A navigation outside the granted origins is blocked in the network layer.
    let (_, nav) = f.approved("attached_browser_navigate", json!({"url": format!("{outside}/x")})).await;
    assert_eq!(nav["result"]["output"]["outcome"], "blocked", "{nav}");
    assert_eq!(nav["result"]["output"]["refused_requests"][0]["rule"], "origin", "{nav}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the outside server never saw a request");

    // Figures: snapshot latency through the attached browser and the managed one.
    let mut attached = Vec::new();
    for _ in 0..15 {
        let s = Instant::now();
        let done = f.run("attached_browser_snapshot", json!({})).await;
        assert_eq!(done["status"], "completed", "{done}");
        attached.push(s.elapsed());
    }
    let (_, managed_nav) = f.approved("browser_navigate", json!({"url": format!("{site}/app")})).await;
    assert_eq!(managed_nav["result"]["output"]["outcome"], "loaded", "{managed_nav}");
    let mut managed = Vec::new();
    for _ in 0..15 {
        let s = Instant::now();
        let done = f.run("browser_snapshot", json!({})).await;
        assert_eq!(done["status"], "completed", "{done}");
        managed.push(s.elapsed());
    }
    eprintln!(
        "FIGURES attached browser ({backend:?}): grant to first snapshot {:?}; snapshot p50 attached {:?}, managed {:?} \
         (through the HTTP API, freeze to final)",
        attach_to_first_snapshot,
        p50(attached),
        p50(managed)
    );

    // The server's own managed browser listens on no DevTools port at all (DevTools over a
    // pipe): nothing on the host can attach it, and its bridge's port is closed once the
    // server's own client is in.
    let pid = f.t.app().browser.process_id().await.expect("the managed browser runs");
    let listening = crate::common::listening_ports_of_tree(pid);
    assert!(listening.is_empty(), "the managed Chromium listens on {listening:?}");
    let bridge = f.t.app().browser.websocket_address().await.expect("the managed browser runs");
    let port = url::Url::parse(&bridge).unwrap().port().unwrap();
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err(), "the bridge stopped listening");

    // Grant by URL prefix instead (what survives a browser restart: target ids do not).
    let prefixed = f
        .patch(
            &conn,
            json!({"settings": {"endpoint": user.endpoint(), "tabs": [format!("{site}/app")], "origins": [site]}}),
        )
        .await;
    assert_eq!(prefixed["permissions"]["browser.attached"]["access"]["state"], "granted", "{prefixed}");
    f.wait_reason(None, Duration::from_secs(5)).await;

    // kill -9 the user's browser: the ladder says browser_gone at once, with no call.
    let (port, profile) = user.kill();
    let took = f.wait_reason(Some("browser_gone"), Duration::from_secs(5)).await;
    eprintln!("FIGURES attached browser ({backend:?}): kill -9 to browser_gone on the ladder {took:?}");
    for tool in ["attached_browser_click", "attached_browser_navigate", "attached_browser_screenshot"] {
        assert_eq!(f.tool(tool).await["reason"]["code"], "browser_gone", "{tool}");
    }
    let c = f.t.get(&format!("/v1/connections/{conn}"), &f.token).await;
    assert_eq!(c.body["permissions"]["browser.attached"]["access"]["state"], "browser_gone", "{c:?}");
    let refused = f.freeze("attached_browser_snapshot", json!({})).await;
    assert!(!refused.status.is_success(), "{refused:?}");
    assert!(refused.body.to_string().contains("browser_gone"), "{refused:?}");

    // Restart on the same port with the same profile, the user opens the app again: the
    // tools come back by themselves.
    let user = UserBrowser::start(port, profile).await;
    let new_app = user.open(&format!("{site}/app")).await;
    let back = f.wait_reason(None, Duration::from_secs(30)).await;
    eprintln!("FIGURES attached browser ({backend:?}): restart to available {back:?}");
    let snap = f.run("attached_browser_snapshot", json!({})).await;
    assert_eq!(snap["status"], "completed", "{snap}");
    assert_eq!(snap["result"]["output"]["tab"], new_app.as_str(), "{snap}");
    assert!(snap["result"]["output"]["tree"].as_str().unwrap().contains("Not pressed"), "{snap}");

    // Closing the granted tab (the user's act) is browser_gone too.
    let r = reqwest::get(format!("{}/json/close/{new_app}", user.endpoint())).await.unwrap();
    assert!(r.status().is_success());
    f.wait_reason(Some("browser_gone"), Duration::from_secs(5)).await;
}

/// With `--allow-internal-urls` a non-admin may attach a loopback browser; the approval binds
/// the connection as it was (a PATCH between freeze and grant fails the call
/// `connection_changed`, nothing done); another user can neither see nor use it.
async fn a_user_s_own_browser_binds_its_approvals_and_is_theirs_alone(backend: Backend) {
    let site = serve_pages().await;
    let user = UserBrowser::start(free_port(), tempfile::tempdir().unwrap()).await;
    user.open(&format!("{site}/app")).await;
    let mut options = Options::default();
    options.runtime.allow_internal_urls = true;
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let settings = json!({"endpoint": user.endpoint(), "tabs": [format!("{site}/app")], "origins": [site]});
    let created =
        t.post("/v1/connections", &alice, json!({"kind": "browser", "settings": settings, "credential": {}})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["permissions"]["browser.attached"]["access"]["state"], "granted", "{created:?}");
    let conn = created.body["id"].as_str().unwrap().to_owned();
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "use my attached browser: snapshot the page and click a button").await;
    let mut f = Fx { t, token: alice, run, turn, calls: 0 };
    let snap = f.run("attached_browser_snapshot", json!({"connection": conn})).await;
    assert_eq!(snap["status"], "completed", "{snap}");
    let out = snap["result"]["output"].clone();
    let press = reference(out["tree"].as_str().unwrap(), "button \"Press me\"");

    // Frozen, then the connection changes before the grant: nothing is clicked.
    let frozen = f.freeze("attached_browser_click", json!({"snapshot_id": out["snapshot_id"], "ref": press})).await;
    assert_eq!(frozen.body["status"], "awaiting_approval", "{frozen:?}");
    let mut changed = settings.clone();
    changed["origins"] = json!([site, "https://example.com"]);
    f.patch(&conn, json!({"settings": changed})).await;
    let inv = frozen.body;
    let g =
        f.t.post(
            &format!("/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap()),
            &f.token,
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]}),
        )
        .await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = f.wait(&inv).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "connection_changed", "{done}");
    f.wait_reason(None, Duration::from_secs(10)).await;
    let again = f.run("attached_browser_snapshot", json!({})).await;
    assert!(again["result"]["output"]["tree"].as_str().unwrap().contains("Not pressed"), "never clicked: {again}");

    // Another user: no connection of theirs, and alice's is not theirs to name.
    let bob = f.t.user("bob").await;
    let view = f.t.get("/v1/tools/attached_browser_snapshot", &bob).await;
    assert_eq!(view.body["reason"]["code"], "no_connection", "{view:?}");
    let seen = f.t.get(&format!("/v1/connections/{conn}"), &bob).await;
    assert_eq!(seen.status, StatusCode::NOT_FOUND, "{seen:?}");
    let bob_run = f.t.run(&bob).await;
    let (bob_turn, _) = f.t.turn(&bob, &bob_run, "use the attached browser: snapshot the page").await;
    let r = f.t.call(&bob, &bob_run, &bob_turn, "attached_browser_snapshot", "b1", json!({"connection": conn})).await;
    assert!(!r.status.is_success(), "{r:?}");
    assert!(!r.body.to_string().contains("Press me"), "{r:?}");
}

/// A hosted control plane (no internal addresses) reaches a non-admin's browser through
/// their device's runner: `mira runner --attach-browser http://127.0.0.1:PORT`, the
/// connection's endpoint `device:<device_id>`. Snapshot and an approved click in the granted
/// tab; another user cannot name the device; kill -9 of the browser is `browser_gone`, its
/// restart brings the tools back, and the runner stopping is `browser_gone` too.
async fn a_device_runner_carries_the_user_s_browser(backend: Backend) {
    let site = serve_pages().await;
    let user = UserBrowser::start(free_port(), tempfile::tempdir().unwrap()).await;
    let app_tab = user.open(&format!("{site}/app")).await;
    let mut options = crate::runner::options();
    options.runtime.allow_internal_urls = false;
    let t = spawn_with(backend, options).await;
    let alice = t.user("alice").await;
    let root = tempfile::tempdir().unwrap();
    let mut runner = crate::runner::device(&t, &alice, "laptop", root.path()).await;
    let device = runner.device_id.clone();
    // Again, attaching the browser on the device.
    if let Some(mut c) = runner.child.take() {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    runner.args = vec!["--attach-browser".into(), user.endpoint()];
    runner.start();
    let started = Instant::now();
    loop {
        let view = crate::runner::device_view(&t, &alice, &device).await;
        let caps = view["advertised"]["capabilities"].as_array().cloned().unwrap_or_default();
        if view["status"] == "connected" && caps.iter().any(|c| c == "browser") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the runner never advertised browser: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The loopback address itself is refused for the non-admin; the device endpoint is not.
    let direct = json!({"endpoint": user.endpoint(), "tabs": [], "origins": [site]});
    let r = t.post("/v1/connections", &alice, json!({"kind": "browser", "settings": direct, "credential": {}})).await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "internal_address"), "{r:?}");
    let settings = json!({"endpoint": format!("device:{device}"), "tabs": [format!("{site}/app")], "origins": [site]});
    let started = Instant::now();
    let created = t
        .post(
            "/v1/connections",
            &alice,
            json!({"kind": "browser", "name": "laptop chromium", "settings": settings, "credential": {}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["permissions"]["browser.attached"]["access"]["state"], "granted", "{created:?}");
    assert!(created.body.to_string().contains(&app_tab), "the inventory lists the tab: {created:?}");
    assert!(!created.body.to_string().contains(&user.endpoint()), "the device's address never reaches the server");
    let conn = created.body["id"].as_str().unwrap().to_owned();
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "use my attached browser: snapshot the page and click a button").await;
    let mut f = Fx { t, token: alice, run, turn, calls: 0 };
    f.wait_reason(None, Duration::from_secs(5)).await;
    let snap = f.run("attached_browser_snapshot", json!({})).await;
    let to_first_snapshot = started.elapsed();
    assert_eq!(snap["status"], "completed", "{snap}");
    let out = snap["result"]["output"].clone();
    assert_eq!(out["tab"], app_tab.as_str(), "{out}");
    assert_eq!(out["connection_id"], conn.as_str(), "{out}");
    let press = reference(out["tree"].as_str().unwrap(), "button \"Press me\"");
    let (preview, click) =
        f.approved("attached_browser_click", json!({"snapshot_id": out["snapshot_id"], "ref": press})).await;
    assert_eq!(preview["element"]["name"], "Press me", "{preview}");
    assert!(preview["browser"].as_str().unwrap().contains(&format!("device:{device}")), "{preview}");
    assert_eq!(click["status"], "completed", "{click}");
    let mut times = Vec::new();
    for _ in 0..10 {
        let s = Instant::now();
        let done = f.run("attached_browser_snapshot", json!({})).await;
        assert!(done["result"]["output"]["tree"].as_str().unwrap().contains("Pressed!"), "{done}");
        times.push(s.elapsed());
    }
    let shot = f.run("attached_browser_screenshot", json!({})).await;
    assert_eq!(shot["status"], "completed", "a screenshot's answer comes up through the runner: {shot}");
    eprintln!(
        "FIGURES attached browser through the device runner ({backend:?}): create to first snapshot {to_first_snapshot:?}; \
         snapshot p50 {:?} (freeze to final)",
        p50(times)
    );

    // The upload route reads a message up to 16 MiB (past the API's body limit) and no more;
    // a session that is not a runner's is refused.
    let client = reqwest::Client::new();
    let upload = |bytes: usize| {
        client
            .post(format!("{}/v1/runner/cdp?channel=cdp_x&seq=0", f.t.base))
            .bearer_auth("mrs_not_a_session")
            .body(vec![b'x'; bytes])
            .send()
    };
    // The server may answer and close before the client wrote the whole body: the send
    // then ends in a broken pipe, which is a refusal too (nothing was taken).
    match upload(3 << 20).await {
        Ok(r) => {
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            assert!(r.text().await.unwrap().contains("device_auth_failed"));
        }
        Err(e) => assert!(e.is_request(), "{e:?}"),
    }
    match upload(17 << 20).await {
        Ok(r) => assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE),
        Err(e) => assert!(e.is_request(), "{e:?}"),
    }

    // Another user can neither name the device nor use alice's connection.
    let bob = f.t.user("bob").await;
    let theirs =
        f.t.post("/v1/connections", &bob, json!({"kind": "browser", "settings": settings, "credential": {}})).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{theirs:?}");
    let view = f.t.get("/v1/tools/attached_browser_snapshot", &bob).await;
    assert_eq!(view.body["reason"]["code"], "no_connection", "{view:?}");

    // kill -9 of the browser on the device: browser_gone, with no call.
    let (port, profile) = user.kill();
    let took = f.wait_reason(Some("browser_gone"), Duration::from_secs(5)).await;
    eprintln!("FIGURES attached browser through the device runner ({backend:?}): kill -9 to browser_gone {took:?}");
    let refused = f.freeze("attached_browser_snapshot", json!({})).await;
    assert!(refused.body.to_string().contains("browser_gone"), "{refused:?}");

    // Restarted, the granted URL open again: available again by itself.
    let user = UserBrowser::start(port, profile).await;
    user.open(&format!("{site}/app")).await;
    let back = f.wait_reason(None, Duration::from_secs(30)).await;
    eprintln!("FIGURES attached browser through the device runner ({backend:?}): restart to available {back:?}");
    let again = f.run("attached_browser_snapshot", json!({})).await;
    assert_eq!(again["status"], "completed", "{again}");

    // A runner that stops beating (SIGSTOP, lease 2 s): browser_gone; back once it runs again.
    runner.signal("-STOP");
    let took = f.wait_reason(Some("browser_gone"), Duration::from_secs(10)).await;
    eprintln!(
        "FIGURES attached browser through the device runner ({backend:?}): runner SIGSTOP to browser_gone {took:?}"
    );
    runner.signal("-CONT");
    let back = f.wait_reason(None, Duration::from_secs(60)).await;
    eprintln!("FIGURES attached browser through the device runner ({backend:?}): SIGCONT to available {back:?}");

    // The runner stopping takes the browser with it.
    runner.signal("-9");
    let took = f.wait_reason(Some("browser_gone"), Duration::from_secs(10)).await;
    eprintln!(
        "FIGURES attached browser through the device runner ({backend:?}): runner kill -9 to browser_gone {took:?}"
    );
    drop(user);
}
