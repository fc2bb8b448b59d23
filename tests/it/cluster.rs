//! Several replicas on one Postgres database, as separate `mira` processes started by
//! `scripts/cluster.sh` behind a real haproxy (installed by `scripts/setup-cluster.sh`):
//! run events and the approvals inbox across replicas, a replica killed with SIGKILL during
//! mixed load, a replica's event listener connection terminated by Postgres. Postgres only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common::{Backend, Resp, TestDb};

/// A user's run and turn to freeze calls in.
#[derive(Clone)]
struct Who {
    token: String,
    run: String,
    turn: String,
}

/// N replicas + haproxy on one fresh Postgres database; stopped on drop.
struct Cluster {
    dir: PathBuf,
    lb: String,
    ports: Vec<u16>,
    pids: Vec<i32>,
    admin: String,
    client: reqwest::Client,
    pool: sqlx::PgPool,
    _tmp: tempfile::TempDir,
    _db: TestDb,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh")
}

impl Cluster {
    async fn start(n: usize) -> Cluster {
        Cluster::start_with(n, &[]).await
    }

    /// [`Cluster::start`] with more `mira serve` flags for every replica.
    async fn start_with(n: usize, extra: &[&str]) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let db = TestDb::new(Backend::Postgres, tmp.path()).await;
        let dir = tmp.path().join("cluster");
        let out = tokio::process::Command::new("bash")
            .arg(script())
            .args(["start", "--replicas", &n.to_string(), "--database-url", &db.url, "--dir"])
            .arg(&dir)
            .args(["--bin", env!("CARGO_BIN_EXE_mira")])
            .args(["--", "--heartbeat-secs", "1", "--replica-dead-after-secs", "3", "--execution-concurrency", "8"])
            .args(extra)
            // One embedding model per test process is enough: replicas rank lexically.
            .env_remove("MIRA_EMBEDDING_MODEL_DIR")
            .env_remove("MIRA_EMBEDDING_MODEL")
            .env("MIRA_EMBEDDING_FETCH", "false")
            .env("RUST_LOG", "warn")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "cluster.sh start failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let exports: HashMap<&str, &str> =
            stdout.lines().filter_map(|l| l.strip_prefix("export ")?.split_once('=')).collect();
        let read = |name: String| std::fs::read_to_string(dir.join(name)).unwrap().trim().to_owned();
        let ports = (1..=n).map(|i| read(format!("r{i}.port")).parse().unwrap()).collect();
        let pids = (1..=n).map(|i| read(format!("r{i}.pid")).parse().unwrap()).collect();
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&db.url).await.unwrap();
        Cluster {
            lb: exports["MIRA_CLUSTER_URL"].to_owned(),
            admin: exports["MIRA_ADMIN_TOKEN"].to_owned(),
            dir,
            ports,
            pids,
            client: mira::net::client_builder().build().unwrap(),
            pool,
            _tmp: tmp,
            _db: db,
        }
    }

    /// Replica `i`'s own address (0-based).
    fn at(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    fn node_id(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("r{}/data/node.id", i + 1))).unwrap().trim().to_owned()
    }

    fn workspace(&self) -> PathBuf {
        self.dir.join("ws")
    }

    fn signal(&self, i: usize, sig: i32) {
        // SAFETY: kill(2) on a pid this test's script started.
        assert_eq!(unsafe { libc::kill(self.pids[i], sig) }, 0);
    }

    fn kill9(&self, i: usize) {
        // SAFETY: kill(2) on a pid this test's script started.
        assert_eq!(unsafe { libc::kill(self.pids[i], libc::SIGKILL) }, 0);
    }

    /// One request; transport errors are `None` (a replica may be dying).
    async fn try_req(&self, method: reqwest::Method, url: &str, token: &str, body: Option<Value>) -> Option<Resp> {
        let mut req = self.client.request(method, url).bearer_auth(token).timeout(Duration::from_secs(30));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.ok()?;
        let status = resp.status();
        let text = resp.text().await.ok()?;
        Some(Resp { status, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) })
    }

    async fn req(&self, method: reqwest::Method, url: &str, token: &str, body: Option<Value>) -> Resp {
        self.try_req(method, url, token, body).await.expect("request answered")
    }

    async fn user(&self, name: &str) -> String {
        let r = self
            .req(reqwest::Method::POST, &format!("{}/v1/users", self.lb), &self.admin, Some(json!({"name": name})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        r.body["token"].as_str().unwrap().to_owned()
    }

    async fn run_and_turn(&self, base: &str, token: &str, task: &str) -> (String, String) {
        let r =
            self.req(reqwest::Method::POST, &format!("{base}/v1/runs"), token, Some(json!({"title": "cluster"}))).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let run = r.body["id"].as_str().unwrap().to_owned();
        let r = self
            .req(reqwest::Method::POST, &format!("{base}/v1/runs/{run}/turns"), token, Some(json!({"task": task})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        (run, r.body["turn_id"].as_str().unwrap().to_owned())
    }

    /// Freezes a call at `base`, retrying (same `tool_call_id`: idempotent) while replicas die.
    async fn freeze(&self, base: &str, who: &Who, tool: &str, call: &str, input: Value) -> Value {
        let (token, run) = (&who.token, &who.run);
        let body = json!({"turn_id": who.turn, "tool_id": tool, "tool_call_id": call, "input": input});
        for _ in 0..50 {
            match self
                .try_req(reqwest::Method::POST, &format!("{base}/v1/runs/{run}/invocations"), token, Some(body.clone()))
                .await
            {
                Some(r) if r.status == StatusCode::CREATED || r.status == StatusCode::OK => return r.body,
                Some(r) if r.status.is_client_error() => panic!("freezing {call}: {r:?}"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("freezing {call} never succeeded");
    }

    /// Grants `inv` at `base`; true when this request decided it, false when it was decided
    /// already (retries transport failures and 5xx).
    async fn grant(&self, base: &str, token: &str, inv: &Value) -> bool {
        let body =
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]});
        let url = format!("{base}/v1/approvals/{}/grant", inv["approval_id"].as_str().unwrap());
        for _ in 0..50 {
            match self.try_req(reqwest::Method::POST, &url, token, Some(body.clone())).await {
                Some(r) if r.status == StatusCode::OK => return true,
                Some(r) if r.status == StatusCode::CONFLICT && r.body["error"]["code"] == "approval_decided" => {
                    return false;
                }
                Some(r) if r.status.is_client_error() => panic!("granting: {r:?}"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("granting never succeeded");
    }

    /// Polls an invocation at `base` until it is final (60 s at most).
    async fn final_of(&self, base: &str, token: &str, id: &str) -> Value {
        for _ in 0..600 {
            if let Some(r) =
                self.try_req(reqwest::Method::GET, &format!("{base}/v1/invocations/{id}"), token, None).await
            {
                let s = r.body["status"].as_str().unwrap_or("");
                if r.status == StatusCode::OK && !matches!(s, "queued" | "running" | "awaiting_approval") {
                    return r.body;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("invocation {id} did not finish");
    }

    async fn ready(&self, i: usize) -> Value {
        self.client.get(format!("{}/readyz", self.at(i))).send().await.unwrap().json().await.unwrap()
    }

    /// Opens an SSE stream; its events (id, type, data) arrive on the channel.
    async fn sse(
        &self,
        url: &str,
        token: &str,
        last_event_id: Option<i64>,
    ) -> mpsc::Receiver<(Option<i64>, String, Value)> {
        let mut req = self.client.get(url).bearer_auth(token);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        sse_channel(resp)
    }

    /// Stored events of a run (id, type), in id order.
    async fn stored_events(&self, run: &str) -> Vec<(i64, String)> {
        sqlx::query_as("SELECT seq, type FROM events WHERE run_id = $1 ORDER BY seq")
            .bind(run)
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
}

/// The events (id, type, data) of an open SSE response, forwarded as they arrive; the channel
/// closes when the stream ends.
fn sse_channel(resp: reqwest::Response) -> mpsc::Receiver<(Option<i64>, String, Value)> {
    let (tx, rx) = mpsc::channel(10_000);
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = stream.next().await {
            buf.extend_from_slice(&chunk);
            while let Some((id, event, data)) = crate::common::next_sse_block(&mut buf) {
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                if tx.send((id, event, data)).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Receives from `rx` until `n` events arrived (30 s at most).
async fn take(rx: &mut mpsc::Receiver<(Option<i64>, String, Value)>, n: usize) -> Vec<(i64, String, Value)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, event, data))) => out.push((id.unwrap_or(-1), event, data)),
            _ => break,
        }
    }
    out
}

/// Receives `approvals` snapshots until one satisfies `pred` (30 s at most).
async fn snapshot_where(rx: &mut mpsc::Receiver<(Option<i64>, String, Value)>, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((_, event, data))) if event == "approvals" && pred(&data) => return data,
            Ok(Some(_)) => {}
            other => panic!("no matching inbox snapshot: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_a_reach_a_stream_at_b_in_order_and_resumable_at_c() {
    let c = Cluster::start(3).await;
    // The load balancer serves no /internal/ route (haproxy answers 404 itself): the
    // replicas reach each other directly, where the route is (401 without the secret).
    for (base, want) in [(c.lb.as_str(), StatusCode::NOT_FOUND), (c.at(0).as_str(), StatusCode::UNAUTHORIZED)] {
        let r = c.client.post(format!("{base}/internal/v1/execute")).json(&json!({})).send().await.unwrap();
        assert_eq!(r.status(), want, "{base}/internal/v1/execute");
    }
    std::fs::write(c.workspace().join("hello.txt"), "hello\nworld\n").unwrap();
    let alice = c.user("alice").await;
    let (a, b, cc) = (c.at(0), c.at(1), c.at(2));
    let (run, turn) = c.run_and_turn(&a, &alice, "read hello.txt").await;
    let who = Who { token: alice.clone(), run: run.clone(), turn: turn.clone() };
    let mut at_b = c.sse(&format!("{b}/v1/runs/{run}/events"), &alice, None).await;
    let first = take(&mut at_b, 1).await;
    assert_eq!(first.first().map(|e| (e.0, e.1.as_str())), Some((1, "exposure.created")), "{first:?}");
    // Calls frozen at A, executed by whichever replica claims them.
    let mut ids = Vec::new();
    for i in 0..8 {
        let inv = c.freeze(&a, &who, "read_open", &format!("r{i}"), json!({"path": "hello.txt"})).await;
        ids.push(inv["invocation_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        assert_eq!(c.final_of(&a, &alice, id).await["status"], "completed");
    }
    let stored = c.stored_events(&run).await;
    let rest = take(&mut at_b, stored.len() - 1).await;
    let seen: Vec<(i64, String)> = first.iter().chain(&rest).map(|(id, t, _)| (*id, t.clone())).collect();
    assert_eq!(seen, stored, "B's stream has every event of the run, in order, with the stored ids");
    assert!(
        c.ready(1).await["replica"]["notifications_received"].as_u64().unwrap() > 0,
        "B heard A's commits through LISTEN/NOTIFY"
    );
    // Resumed at C from the middle: the same ids and payloads.
    let half = i64::try_from(stored.len() / 2).unwrap();
    let mut at_c = c.sse(&format!("{cc}/v1/runs/{run}/events"), &alice, Some(half)).await;
    let resumed = take(&mut at_c, stored.len() - stored.len() / 2).await;
    let from_b: Vec<_> = first.iter().chain(&rest).filter(|e| e.0 > half).cloned().collect();
    assert_eq!(resumed, from_b, "a stream resumed at C with Last-Event-ID continues exactly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_inbox_follows_every_replica() {
    let c = Cluster::start(3).await;
    let alice = c.user("alice").await;
    let (a, b, cc) = (c.at(0), c.at(1), c.at(2));
    let (run, turn) = c.run_and_turn(&a, &alice, "write a file").await;
    let who = Who { token: alice.clone(), run: run.clone(), turn: turn.clone() };
    // Timed from before the stream opens: its re-read (every 15 s without a wake-up) can come
    // no sooner than 15 s after this.
    let started = tokio::time::Instant::now();
    let mut inbox = c.sse(&format!("{b}/v1/approvals/stream"), &alice, None).await;
    snapshot_where(&mut inbox, |s| s["approvals"].as_array().is_some_and(Vec::is_empty)).await;
    let inv = c.freeze(&a, &who, "write_file", "w1", json!({"path": "w1.txt", "content": "one"})).await;
    assert_eq!(inv["status"], "awaiting_approval", "{inv}");
    let approval = inv["approval_id"].as_str().unwrap().to_owned();
    snapshot_where(&mut inbox, |s| {
        s["approvals"].as_array().is_some_and(|a| a.iter().any(|x| x["id"] == approval.as_str()))
    })
    .await;
    // Before the stream's 15 s re-read: the notification woke it.
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(c.grant(&cc, &alice, &inv).await, "granted at C");
    snapshot_where(&mut inbox, |s| s["approvals"].as_array().is_some_and(Vec::is_empty)).await;
    let done = c.final_of(&b, &alice, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(c.workspace().join("w1.txt")).unwrap(), "one");
    assert!(!c.grant(&a, &alice, &inv).await, "a second grant at A finds it decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_listener_misses_no_event() {
    let c = Cluster::start(2).await;
    std::fs::write(c.workspace().join("hello.txt"), "hello\n").unwrap();
    let alice = c.user("alice").await;
    let (a, b) = (c.at(0), c.at(1));
    let (run, turn) = c.run_and_turn(&a, &alice, "read hello.txt").await;
    let who = Who { token: alice.clone(), run: run.clone(), turn: turn.clone() };
    let mut at_b = c.sse(&format!("{b}/v1/runs/{run}/events"), &alice, None).await;
    assert_eq!(take(&mut at_b, 1).await.len(), 1);
    assert_eq!(c.ready(1).await["replica"]["listener_connections"], 1);
    let name = mira::events::listen::application_name(&c.node_id(1));
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
    )
    .bind(&name)
    .fetch_all(&c.pool)
    .await
    .unwrap();
    assert_eq!(killed, vec![true], "B's listener connection was found and terminated");
    // Events committed while B's listener is away and reconnecting.
    let mut ids = Vec::new();
    for i in 0..6 {
        let inv = c.freeze(&a, &who, "read_open", &format!("r{i}"), json!({"path": "hello.txt"})).await;
        ids.push(inv["invocation_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        c.final_of(&a, &alice, id).await;
    }
    let stored = c.stored_events(&run).await;
    let rest = take(&mut at_b, stored.len() - 1).await;
    let seen: Vec<(i64, String)> = rest.iter().map(|(id, t, _)| (*id, t.clone())).collect();
    assert_eq!(seen, stored[1..].to_vec(), "no event missed, none repeated");
    let mut connections = 0;
    for _ in 0..100 {
        connections = c.ready(1).await["replica"]["listener_connections"].as_u64().unwrap();
        if connections >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(connections, 2, "B's listener reconnected once");
}

/// What one mixed call ended as.
struct Outcome {
    call: String,
    invocation: String,
    gated: bool,
    decided_here: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_load_loses_nothing_and_runs_nothing_twice() {
    let c = Arc::new(Cluster::start(3).await);
    let ws = c.workspace();
    std::fs::create_dir_all(ws.join("w")).unwrap();
    for i in 0..10 {
        std::fs::write(ws.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let alice = c.user("alice").await;
    let lb = c.lb.clone();
    let (run, turn) = c.run_and_turn(&lb, &alice, "read and write files, run commands in a terminal").await;
    let who = Who { token: alice.clone(), run: run.clone(), turn: turn.clone() };

    // Terminal sessions, started wherever the claims land; then actions on each through the
    // load balancer (a claim on another replica than the session's is forwarded to its owner).
    let mut sessions = Vec::new();
    for i in 0..6 {
        let input =
            json!({"action": "start", "command": "bash", "args": ["--norc", "--noprofile"], "env": {"PS1": "$ "}});
        let inv = c.freeze(&lb, &who, "terminal_session", &format!("t{i}"), input).await;
        c.grant(&lb, &alice, &inv).await;
        let done = c.final_of(&lb, &alice, inv["invocation_id"].as_str().unwrap()).await;
        assert_eq!(done["status"], "completed", "{done}");
        sessions.push(done["result"]["output"]["session_id"].as_str().unwrap().to_owned());
    }
    for (i, s) in sessions.iter().enumerate() {
        let input = json!({"action": "input", "session_id": s, "data": format!("echo mark-$((40+{i}))\n")});
        let inv = c.freeze(&lb, &who, "terminal_session", &format!("ti{i}"), input).await;
        c.grant(&lb, &alice, &inv).await;
        let mut seen = c.final_of(&lb, &alice, inv["invocation_id"].as_str().unwrap()).await;
        assert_eq!(seen["status"], "completed", "{seen}");
        let mut text = seen["result"]["output"]["output"].as_str().unwrap_or("").to_owned();
        for k in 0..10 {
            if text.contains(&format!("mark-{}", 40 + i)) {
                break;
            }
            let input = json!({"action": "wait", "session_id": s, "until": "idle", "idle_ms": 300, "timeout_ms": 2000});
            let inv = c.freeze(&lb, &who, "terminal_session", &format!("tw{i}-{k}"), input).await;
            c.grant(&lb, &alice, &inv).await;
            seen = c.final_of(&lb, &alice, inv["invocation_id"].as_str().unwrap()).await;
            assert_eq!(seen["status"], "completed", "{seen}");
            text.push_str(seen["result"]["output"]["output"].as_str().unwrap_or(""));
        }
        assert!(text.contains(&format!("mark-{}", 40 + i)), "session {s} ran the input: {text:?}");
    }
    let owners: Vec<(String, String)> =
        sqlx::query_as("SELECT id, node_id FROM terminal_sessions").fetch_all(&c.pool).await.unwrap();
    let forwarded: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM invocations i JOIN terminal_sessions s ON s.id = (i.input::json->>'session_id')
         WHERE i.tool_id = 'terminal_session' AND i.status = 'completed' AND split_part(i.claimed_by, ':', 1) <> s.node_id",
    )
    .fetch_one(&c.pool)
    .await
    .unwrap();
    assert!(forwarded > 0, "some actions were claimed by a replica other than their session's owner");
    // The victim: the replica holding the most sessions.
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for (_, node) in &owners {
        *per_node.entry(node.clone()).or_default() += 1;
    }
    let victim_node = per_node.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let victim = (0..3).find(|i| c.node_id(*i) == victim_node).unwrap();
    let victim_sessions: Vec<String> =
        owners.iter().filter(|(_, n)| *n == victim_node).map(|(id, _)| id.clone()).collect();

    // ~200 mixed calls from 12 clients through the load balancer; the victim dies a third in.
    let total = 198;
    let issued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..12 {
        let (c, who, alice, issued) = (c.clone(), who.clone(), alice.clone(), issued.clone());
        tasks.spawn(async move {
            let mut out = Vec::new();
            for k in (w..total).step_by(12) {
                issued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let lb = c.lb.clone();
                let gated = k % 3 == 0;
                let call = format!("m{k}");
                let inv = if gated {
                    let input = json!({"path": format!("w/{k}.txt"), "content": format!("{k}")});
                    c.freeze(&lb, &who, "write_file", &call, input).await
                } else {
                    c.freeze(&lb, &who, "read_open", &call, json!({"path": format!("f{}.txt", k % 10)})).await
                };
                let mut decided_here = 0;
                if gated {
                    // Two grants race through the load balancer: one decides.
                    let (x, y) = tokio::join!(c.grant(&lb, &alice, &inv), c.grant(&lb, &alice, &inv));
                    decided_here = usize::from(x) + usize::from(y);
                }
                out.push(Outcome {
                    call,
                    invocation: inv["invocation_id"].as_str().unwrap().to_owned(),
                    gated,
                    decided_here,
                });
            }
            out
        });
    }
    while issued.load(std::sync::atomic::Ordering::SeqCst) < total / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.kill9(victim);
    let mut outcomes = Vec::new();
    while let Some(r) = tasks.join_next().await {
        outcomes.extend(r.unwrap());
    }
    assert_eq!(outcomes.len(), total);

    // Every call reaches a final state: completed, or interrupted where the victim ran it.
    let mut finals = HashMap::new();
    for o in &outcomes {
        let done = c.final_of(&lb, &alice, &o.invocation).await;
        finals.insert(o.invocation.clone(), done);
    }
    let mut interrupted = 0;
    for o in &outcomes {
        let done = &finals[&o.invocation];
        match done["status"].as_str().unwrap() {
            "completed" => {
                if o.gated {
                    let k = o.call.trim_start_matches('m');
                    assert_eq!(std::fs::read_to_string(ws.join(format!("w/{k}.txt"))).unwrap(), k);
                }
            }
            "interrupted" => interrupted += 1,
            other => panic!("{} ended {other}: {done}", o.call),
        }
    }
    let by_victim: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM invocations WHERE status = 'interrupted' AND split_part(claimed_by, ':', 1) <> $1",
    )
    .bind(&victim_node)
    .fetch_all(&c.pool)
    .await
    .unwrap();
    assert!(by_victim.is_empty(), "only the dead replica's calls were interrupted: {by_victim:?}");
    // None ran twice: one execution.started per invocation at most.
    let twice: Vec<(String, i64)> = sqlx::query_as(
        "SELECT data::json->>'invocation_id', count(*) FROM events WHERE type = 'execution.started'
         GROUP BY 1 HAVING count(*) > 1",
    )
    .fetch_all(&c.pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "started twice: {twice:?}");
    // Every grant decided once: one approval.granted per approval, and at most one of the two
    // racing grant requests won (the other found it decided; both may have lost only when the
    // dead replica decided and its answer was lost).
    let granted: Vec<(String, i64)> = sqlx::query_as(
        "SELECT data::json->>'approval_id', count(*) FROM events WHERE type = 'approval.granted' GROUP BY 1",
    )
    .fetch_all(&c.pool)
    .await
    .unwrap();
    assert!(granted.iter().all(|(_, n)| *n == 1), "{granted:?}");
    let gated: HashSet<&str> = outcomes.iter().filter(|o| o.gated).map(|o| o.invocation.as_str()).collect();
    let undecided: i64 =
        sqlx::query_scalar("SELECT count(*) FROM approvals WHERE status = 'pending'").fetch_one(&c.pool).await.unwrap();
    assert_eq!(undecided, 0);
    assert!(outcomes.iter().all(|o| o.decided_here <= 1), "two grants of one approval both won");
    assert_eq!(gated.len(), total / 3);
    eprintln!(
        "killed replica {victim} ({victim_node}): {interrupted} of {total} calls interrupted, {forwarded} terminal actions forwarded"
    );

    // The dead replica's sessions end lost; the others still run.
    for _ in 0..100 {
        let lost: i64 =
            sqlx::query_scalar("SELECT count(*) FROM terminal_sessions WHERE node_id = $1 AND state = 'lost'")
                .bind(&victim_node)
                .fetch_one(&c.pool)
                .await
                .unwrap();
        if lost == i64::try_from(victim_sessions.len()).unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &owners {
        let r = c.req(reqwest::Method::GET, &format!("{lb}/v1/terminal-sessions/{}", s.0), &alice, None).await;
        let expected = if s.1 == victim_node { "lost" } else { "running" };
        assert_eq!(r.body["state"], expected, "{r:?}");
    }
    let replicas = c.req(reqwest::Method::GET, &format!("{lb}/v1/admin/replicas"), &c.admin, None).await;
    let states: BTreeMap<String, String> = replicas.body["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["node_id"].as_str().unwrap().to_owned(), r["state"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(states.get(&victim_node).map(String::as_str), Some("dead"), "{states:?}");
    assert_eq!(states.values().filter(|s| *s == "alive").count(), 2, "{states:?}");
    // An action on a lost session says so, from any replica (refused before approval).
    let input = json!({"action": "input", "session_id": victim_sessions[0], "data": "echo late\n"});
    let body = json!({"turn_id": turn, "tool_id": "terminal_session", "tool_call_id": "after", "input": input});
    let r = c.req(reqwest::Method::POST, &format!("{lb}/v1/runs/{run}/invocations"), &alice, Some(body)).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("terminal_session_ended")),
        "{r:?}"
    );
    assert_eq!(r.body["error"]["details"]["state"], "lost", "{r:?}");
}

/// A terminal action on a session whose replica stopped (declared dead, its sessions not yet
/// marked) fails with `owner_gone` and runs nothing; once marked, the session is `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_on_a_gone_replicas_session_is_owner_gone() {
    let t = crate::common::spawn(Backend::Postgres).await;
    let alice = t.user("alice").await;
    let run = t.run(&alice).await;
    let (turn, _) = t.turn(&alice, &run, "run commands in a terminal").await;
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&t.db.url).await.unwrap();
    let owner: String =
        sqlx::query_scalar("SELECT owner_id FROM runs WHERE id = $1").bind(&run).fetch_one(&pool).await.unwrap();
    let now = mira::ids::now();
    sqlx::query(
        "INSERT INTO replicas (node_id, process_id, address, state, started_at, heartbeat_at)
         VALUES ('node-ghost', 'node-ghost:1', 'http://127.0.0.1:9', 'dead', $1, $1)",
    )
    .bind(&now)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO terminal_sessions (id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env, cols, rows,
            timeout_ms, state, bytes_out, retained_from, started_at)
         VALUES ('term_ghost', $1, $2, 'inv_x', 'node-ghost', 'bash', '[]', '/', '{}', 80, 24, 60000, 'running', 0, 0, $3)",
    )
    .bind(&owner)
    .bind(&run)
    .bind(&now)
    .execute(&pool)
    .await
    .unwrap();
    let input = json!({"action": "input", "session_id": "term_ghost", "data": "echo hi\n"});
    let r = t.call(&alice, &run, &turn, "terminal_session", "g1", input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let body = json!({"tool_id": r.body["tool_id"], "tool_call_id": r.body["tool_call_id"], "input_hash": r.body["input_hash"]});
    let g = t.post(&format!("/v1/approvals/{}/grant", r.body["approval_id"].as_str().unwrap()), &alice, body).await;
    assert_eq!(g.status, StatusCode::OK, "{g:?}");
    let done = t.wait_final(&alice, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["result"]["error"]["code"], "owner_gone", "{done}");
    assert_eq!(done["result"]["error"]["details"]["node_id"], "node-ghost", "{done}");
    // The registry lists this replica alive and the ghost dead.
    let list = t.get("/v1/admin/replicas", &t.admin_token).await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    let rows = list.body["replicas"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["this"] == true && r["state"] == "alive" && r["live"] == true), "{list:?}");
    assert!(rows.iter().any(|r| r["node_id"] == "node-ghost" && r["live"] == false), "{list:?}");
    assert_eq!(t.get("/v1/admin/replicas", &alice).await.status, StatusCode::FORBIDDEN);
    // The internal route refuses a request without the cluster secret.
    let internal = t
        .client
        .post(format!("{}/internal/v1/execute", t.base))
        .json(&json!({"invocation_id": "inv_x", "claimed_by": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(internal.status(), StatusCode::UNAUTHORIZED);
}

/// A private Postgres cluster (initdb + pg_ctl as user `postgres`, under /tmp, on a free
/// port) that a test may stop and start; removed on drop. Never the shared server.
struct PrivatePg {
    dir: PathBuf,
    port: u16,
}

fn pg_bin(name: &str) -> PathBuf {
    let root = std::path::Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).collect();
    versions.sort();
    versions.last().expect("a Debian PostgreSQL server (scripts/ensure-postgres.sh)").join("bin").join(name)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PrivatePg {
    fn init() -> PrivatePg {
        let dir = PathBuf::from(format!("/tmp/mira-pg-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("chown").arg("postgres:postgres").arg(&dir).status().unwrap();
        assert!(ok.success());
        let pg = PrivatePg { dir, port: free_port() };
        pg.as_postgres(pg_bin("initdb"), &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "--no-sync"]);
        pg
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn as_postgres(&self, bin: PathBuf, args: &[&str]) {
        let out =
            std::process::Command::new("runuser").args(["-u", "postgres", "--"]).arg(bin).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    fn start(&self) {
        let options = format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", self.port, self.dir.display());
        let log = self.dir.join("log").display().to_string();
        self.as_postgres(pg_bin("pg_ctl"), &["-D", &self.data(), "-o", &options, "-l", &log, "-w", "start"]);
    }

    fn stop(&self) {
        self.as_postgres(pg_bin("pg_ctl"), &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin("pg_ctl"))
            .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `mira serve` process of the test; killed on drop.
struct Replica {
    child: std::process::Child,
    base: String,
    log: PathBuf,
}

impl Replica {
    fn spawn(dir: &std::path::Path, url: &str, extra: &[&str]) -> Replica {
        Self::spawn_inner(dir, url, extra, false)
    }

    /// A replica that ranks with the embedding model of the test environment.
    fn spawn_with_model(dir: &std::path::Path, url: &str) -> Replica {
        Self::spawn_inner(dir, url, &[], true)
    }

    fn spawn_inner(dir: &std::path::Path, url: &str, extra: &[&str], model: bool) -> Replica {
        let port = free_port();
        // The default workspace is one folder for every replica of a database.
        let ws = dir.parent().unwrap().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join("serve.log");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mira"));
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--heartbeat-secs", "1"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--workspace")
            .arg(&ws)
            .args(extra)
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "info");
        if !model {
            command
                .env_remove("MIRA_EMBEDDING_MODEL_DIR")
                .env_remove("MIRA_EMBEDDING_MODEL")
                .env("MIRA_EMBEDDING_FETCH", "false");
        }
        let child =
            command.stdout(std::process::Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
        Replica { child, base: format!("http://127.0.0.1:{port}"), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (30 s at most) until `/readyz` answers `status`.
    async fn until_ready(&self, client: &reqwest::Client, status: StatusCode) -> Value {
        for _ in 0..300 {
            if let Ok(r) = client.get(format!("{}/readyz", self.base)).timeout(Duration::from_secs(5)).send().await
                && r.status() == status
            {
                return r.json().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} never answered /readyz {status}; log:\n{}", self.base, self.log());
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The database down at start: `mira serve` retries (logged) and serves once it is up, or
/// exits with a clear error when it stays down; a Postgres restart under two replicas gives
/// clear 503s meanwhile, then everything recovers and no event is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_at_start_and_restarted_under_load() {
    let pg = PrivatePg::init();
    let tmp = tempfile::tempdir().unwrap();
    let client = mira::net::client_builder().build().unwrap();

    // Down for good: a clear error after the wait, no panic.
    let started = std::time::Instant::now();
    let mut gives_up = Replica::spawn(&tmp.path().join("x"), &pg.url(), &["--database-wait-secs", "1"]);
    let status = gives_up.child.wait().unwrap();
    assert!(!status.success());
    let log = gives_up.log();
    assert!(log.contains("the database cannot be reached; retrying"), "{log}");
    assert!(log.contains(&format!("connecting to postgres://postgres@127.0.0.1:{}/postgres", pg.port)), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());

    // Down at start, up a moment later: it waits, then serves.
    let a = Replica::spawn(&tmp.path().join("a"), &pg.url(), &[]);
    // 30 s at most for the process to start and log.
    for _ in 0..300 {
        if a.log().contains("retrying") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.log().contains("the database cannot be reached; retrying"), "{}", a.log());
    pg.start();
    a.until_ready(&client, StatusCode::OK).await;
    let b = Replica::spawn(&tmp.path().join("b"), &pg.url(), &[]);
    let ready_b = b.until_ready(&client, StatusCode::OK).await;
    assert_eq!(ready_b["replica"]["events"], "postgres_notify");

    let admin = std::fs::read_to_string(tmp.path().join("a/data/admin.token")).unwrap().trim().to_owned();
    let ask = |method: reqwest::Method, url: String, token: String, body: Option<Value>| {
        let client = client.clone();
        async move {
            let mut req = client.request(method, url).bearer_auth(token).timeout(Duration::from_secs(60));
            if let Some(b) = body {
                req = req.json(&b);
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, user) =
        ask(reqwest::Method::POST, format!("{}/v1/users", a.base), admin.clone(), Some(json!({"name": "alice"}))).await;
    assert_eq!(s, StatusCode::CREATED);
    let alice = user["token"].as_str().unwrap().to_owned();
    std::fs::write(tmp.path().join("ws/hello.txt"), "hello\n").unwrap();
    let (s, run) =
        ask(reqwest::Method::POST, format!("{}/v1/runs", a.base), alice.clone(), Some(json!({"title": "t"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{run}");
    let run = run["id"].as_str().unwrap().to_owned();
    let resp = client.get(format!("{}/v1/runs/{run}/events", b.base)).bearer_auth(&alice).send().await.unwrap();
    // B learns of A's events once its listener is back (it reconnects with a backoff of up to
    // 5 s) or at its next poll: the check below waits for them instead of stopping B at once.
    let mut at_b = sse_channel(resp);

    // Postgres restarts: meanwhile clear 503s, not hangs or 500s.
    pg.stop();
    let (s, body) = ask(reqwest::Method::GET, format!("{}/readyz", a.base), String::new(), None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let t0 = std::time::Instant::now();
    let (s, body) =
        ask(reqwest::Method::POST, format!("{}/v1/runs", a.base), alice.clone(), Some(json!({"title": "x"}))).await;
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("store_unavailable")),
        "{body}"
    );
    eprintln!("a request while Postgres was down answered 503 store_unavailable in {:?}", t0.elapsed());
    pg.start();
    a.until_ready(&client, StatusCode::OK).await;
    b.until_ready(&client, StatusCode::OK).await;

    // After: calls run, and B's stream (opened before the restart) has every event.
    let (s, turn) = ask(
        reqwest::Method::POST,
        format!("{}/v1/runs/{run}/turns", a.base),
        alice.clone(),
        Some(json!({"task": "read hello.txt"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{turn}");
    let turn = turn["turn_id"].as_str().unwrap().to_owned();
    for i in 0..4 {
        let body = json!({"turn_id": turn, "tool_id": "read_open", "tool_call_id": format!("r{i}"), "input": {"path": "hello.txt"}});
        let (s, inv) =
            ask(reqwest::Method::POST, format!("{}/v1/runs/{run}/invocations", a.base), alice.clone(), Some(body))
                .await;
        assert_eq!(s, StatusCode::CREATED, "{inv}");
        let id = inv["invocation_id"].as_str().unwrap().to_owned();
        let mut status = String::new();
        for _ in 0..300 {
            let (_, v) =
                ask(reqwest::Method::GET, format!("{}/v1/invocations/{id}", a.base), alice.clone(), None).await;
            status = v["status"].as_str().unwrap_or("").to_owned();
            if status == "completed" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status, "completed");
    }
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&pg.url()).await.unwrap();
    let stored: Vec<(i64, String)> = sqlx::query_as("SELECT seq, type FROM events WHERE run_id = $1 ORDER BY seq")
        .bind(&run)
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    let mut seen: Vec<(i64, String)> =
        take(&mut at_b, stored.len()).await.into_iter().map(|(id, e, _)| (id, e)).collect();
    drop(a);
    drop(b);
    // Nothing after the stored events either (the stream ends when B stops).
    while let Some((id, event, _)) = at_b.recv().await {
        seen.push((id.unwrap_or(-1), event));
    }
    assert_eq!(seen, stored, "B's stream, open across the restart, has every event in order");
}

// ---------------------------------------------------------------------------------------
// Replica-owned resources: stdio MCP servers, the code graph, tool vectors.

fn mcp_python() -> String {
    std::env::var("MIRA_MCP_PYTHON").expect("MIRA_MCP_PYTHON is not set: run `eval \"$(scripts/setup-mcp.sh)\"` first")
}

impl Cluster {
    async fn mcp_view(&self, i: usize, token: &str, id: &str) -> Option<Value> {
        let r = self.try_req(reqwest::Method::GET, &format!("{}/v1/mcp/servers/{id}", self.at(i)), token, None).await?;
        (r.status == StatusCode::OK).then_some(r.body)
    }

    /// Polls replica `i`'s view of MCP server `id` until `pred` holds (30 s at most).
    async fn mcp_until(&self, i: usize, token: &str, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..300 {
            if let Some(v) = self.mcp_view(i, token, id).await
                && pred(&v)
            {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("replica {i}: {what} did not happen: {:#?}", self.mcp_view(i, token, id).await);
    }

    /// Replica `i`'s ladder entry of `tool` for a turn.
    async fn ladder(&self, i: usize, token: &str, turn: &str, tool: &str) -> Value {
        let url = format!("{}/v1/tools/{}?turn={turn}", self.at(i), urlencoding(tool));
        self.req(reqwest::Method::GET, &url, token, None).await.body
    }

    /// Polls replica `i`'s ladder entry until `pred` holds (30 s at most).
    async fn ladder_until(
        &self,
        i: usize,
        token: &str,
        turn: &str,
        tool: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        for _ in 0..300 {
            let v = self.ladder(i, token, turn, tool).await;
            if pred(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("replica {i}: the ladder of {tool} never changed: {:#}", self.ladder(i, token, turn, tool).await);
    }

    /// Who claimed invocation `id` last (`<node id>:<uuid>`).
    async fn claimed_by(&self, id: &str) -> String {
        sqlx::query_scalar::<_, Option<String>>("SELECT claimed_by FROM invocations WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
            .unwrap_or_default()
    }

    /// Freezes a call at replica `at`, grants it at replica `grant_at` and waits for its result.
    async fn call_granted(&self, at: usize, grant_at: usize, who: &Who, tool: &str, call: &str, input: Value) -> Value {
        let inv = self.freeze(&self.at(at), who, tool, call, input).await;
        assert_eq!(inv["status"], "awaiting_approval", "{inv}");
        assert!(self.grant(&self.at(grant_at), &who.token, &inv).await);
        self.final_of(&self.at(grant_at), &who.token, inv["invocation_id"].as_str().unwrap()).await
    }
}

fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn count_lines(log: &std::path::Path, prefix: &str) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter(|l| l.starts_with(prefix)).count()
}

/// A stdio MCP server lives on the replica that installed it: one process for the whole
/// cluster; every replica projects its tools (available while the owner lives), a call
/// claimed elsewhere is forwarded to the owner and answered; the owner gates a forwarded call
/// again (a grant revoked between claim and forward is refused, nothing is sent). Once the
/// owner is killed, the ladder of every other replica and a call say `owner_gone`, nobody
/// restarts the process by itself, and an explicit connect moves it to a live replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_server_lives_on_one_replica_and_calls_are_forwarded() {
    let c = Cluster::start(3).await;
    let log = c.dir.join("fault.log");
    let install = json!({
        "name": "fault", "deployment_wide": true, "default_agent_access": true,
        "transport": {"stdio": {"command": mcp_python(), "args": [
            format!("{}/tests/mcp/fault_server.py", env!("CARGO_MANIFEST_DIR")), "--log", log.to_string_lossy()]}},
    });
    let r = c.req(reqwest::Method::POST, &format!("{}/v1/mcp/servers", c.at(0)), &c.admin, Some(install)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let id = r.body["id"].as_str().unwrap().to_owned();
    let tool = format!("mcp:{id}:tool:echo");
    let (owner, other1, other2) = (c.node_id(0), c.node_id(1), c.node_id(2));
    let v = c
        .mcp_until(0, &c.admin, &id, "connected at the owner", |v| {
            v["connection"]["state"] == "connected" && v["connection"]["discovered_at"].is_string()
        })
        .await;
    assert_eq!(v["connection"]["owner"]["node_id"], owner.as_str(), "{v:#}");
    assert_eq!(v["connection"]["owner"]["here"], true, "{v:#}");
    // The other replicas learn of the server from the store and follow its owner.
    for i in [1, 2] {
        let v = c
            .mcp_until(i, &c.admin, &id, "the owner's connection and listing seen elsewhere", |v| {
                // The owner stores its connection before its discovery: wait for both.
                v["connection"]["state"] == "connected"
                    && v["connection"]["owner"]["live"] == true
                    && v["connection"]["discovered_at"].is_string()
            })
            .await;
        assert_eq!(v["connection"]["owner"]["node_id"], owner.as_str(), "{v:#}");
        assert_eq!(v["connection"]["owner"]["here"], false, "{v:#}");
        assert!(v["tools"].as_array().unwrap().iter().any(|t| t["name"] == "echo" && t["projected"] == true), "{v:#}");
    }
    // A discovery asked at another replica runs at the owner, where the process is, and
    // answers with the listing the owner stored.
    let r = c.req(reqwest::Method::POST, &format!("{}/v1/mcp/servers/{id}/discover", c.at(1)), &c.admin, None).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert!(r.body["tools"].as_array().unwrap().iter().any(|t| t["name"] == "echo"), "{r:?}");
    assert_eq!(r.body["connection"]["owner"]["node_id"], owner.as_str(), "{r:?}");
    let alice = c.user("alice").await;
    let (run, turn) = c.run_and_turn(&c.lb, &alice, "echo through the MCP server").await;
    let who = Who { token: alice.clone(), run, turn: turn.clone() };
    for i in 0..3 {
        let l = c.ladder_until(i, &alice, &turn, &tool, |l| l["state"] == "available" || l["state"] == "exposed").await;
        assert!(l.get("reason").is_none_or(Value::is_null), "replica {i}: {l:#}");
    }
    // Calls frozen and granted at the other replicas: until one of them was claimed (and so
    // forwarded) by a replica other than the owner.
    let mut forwarded = 0;
    let mut calls = 0;
    for n in 0..24 {
        let (at, grant_at) = (1 + n % 2, 1 + (n + 1) % 2);
        let done =
            c.call_granted(at, grant_at, &who, &tool, &format!("e{n}"), json!({"text": format!("hi {n}")})).await;
        calls += 1;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["result"]["output"]["content"][0]["text"], format!("hi {n}"), "{done:#}");
        let by = c.claimed_by(done["invocation_id"].as_str().unwrap()).await;
        if !by.starts_with(&format!("{owner}:")) {
            forwarded += 1;
        }
        if forwarded >= 2 {
            break;
        }
    }
    assert!(forwarded >= 2, "no call was claimed by a replica other than the owner in {calls} calls");
    assert_eq!(count_lines(&log, "initialize"), 1, "one process for the whole cluster");
    assert_eq!(count_lines(&log, "tools/call"), calls, "every call reached that one process once");

    // Defence in depth: a call running under a claim whose grant is no longer in force when
    // the owner receives it is refused by the owner (nothing is sent to the server).
    let inv = c.freeze(&c.at(1), &who, &tool, "revoked", json!({"text": "must not run"})).await;
    let inv_id = inv["invocation_id"].as_str().unwrap();
    sqlx::query(
        "UPDATE invocations SET status = 'running', claimed_by = $1, lease_until = '9999-12-31T00:00:00.000Z'
         WHERE id = $2",
    )
    .bind(format!("{other1}:claimer"))
    .bind(inv_id)
    .execute(&c.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE approvals SET status = 'denied' WHERE invocation_id = $1")
        .bind(inv_id)
        .execute(&c.pool)
        .await
        .unwrap();
    let secret = std::fs::read_to_string(c.dir.join("secret")).unwrap();
    let answer: Value = c
        .client
        .post(format!("{}/internal/v1/execute", c.at(0)))
        .header("x-mira-cluster-secret", secret.trim())
        .json(&json!({"invocation_id": inv_id, "claimed_by": format!("{other1}:claimer")}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["err"]["code"], "approval_required", "{answer:#}");
    assert_eq!(count_lines(&log, "tools/call"), calls, "the refused call sent nothing");

    // A call frozen before the owner dies and granted after.
    let pending = c.freeze(&c.at(1), &who, &tool, "after-kill", json!({"text": "late"})).await;
    c.kill9(0);
    for i in [1, 2] {
        let l = c.ladder_until(i, &alice, &turn, &tool, |l| l["reason"]["code"] == "owner_gone").await;
        assert_eq!(l["state"], "unavailable", "replica {i}: {l:#}");
        let v = c
            .mcp_until(i, &c.admin, &id, "connect stage owner_gone", |v| {
                v["stages"].as_array().unwrap().iter().any(|s| s["stage"] == "connect" && s["code"] == "owner_gone")
            })
            .await;
        assert_eq!(v["connection"]["owner"]["node_id"], owner.as_str(), "{v:#}");
    }
    assert!(c.grant(&c.at(1), &alice, &pending).await);
    let done = c.final_of(&c.at(1), &alice, pending["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed", "{done:#}");
    assert_eq!(done["result"]["error"]["code"], "owner_gone", "{done:#}");
    assert_eq!(done["result"]["error"]["details"]["node_id"], owner.as_str(), "{done:#}");
    // Nobody took the server over by itself.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count_lines(&log, "initialize"), 1, "no replica restarted the process silently");

    // An explicit connect at replica 1 moves it there, once.
    let r = c.req(reqwest::Method::POST, &format!("{}/v1/mcp/servers/{id}/connect", c.at(1)), &c.admin, None).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let v = c
        .mcp_until(1, &c.admin, &id, "connected at the new owner", |v| {
            v["connection"]["owner"]["node_id"] == other1.as_str() && v["connection"]["state"] == "connected"
        })
        .await;
    assert_eq!(v["connection"]["owner"]["here"], true, "{v:#}");
    c.mcp_until(2, &c.admin, &id, "the new owner seen elsewhere", |v| {
        v["connection"]["owner"]["node_id"] == other1.as_str() && v["connection"]["owner"]["live"] == true
    })
    .await;
    // A connect asked at replica 2 is the owner's business: it spawns nothing there.
    let r = c.req(reqwest::Method::POST, &format!("{}/v1/mcp/servers/{id}/connect", c.at(2)), &c.admin, None).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    c.ladder_until(2, &alice, &turn, &tool, |l| l["state"] == "available" || l["state"] == "exposed").await;
    let done = c.call_granted(2, 2, &who, &tool, "moved", json!({"text": "moved"})).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(done["result"]["output"]["content"][0]["text"], "moved", "{done:#}");
    assert_eq!(count_lines(&log, "initialize"), 2, "the explicit connect started one process: {other2} none");
}

/// The code graph is a cache of the shared workspace that every replica builds itself (no
/// owner to forward to, nothing to lose with a replica): calls claimed by different replicas
/// answer alike and verified, a killed replica changes nothing for the others, and a file
/// written meanwhile is seen by whichever replica answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_answers_code_graph_calls_from_its_own_index() {
    let c = Cluster::start(3).await;
    let ws = c.workspace();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(
        ws.join("src/lib.rs"),
        "pub fn alpha() -> u32 {\n    beta_helper()\n}\n\nfn beta_helper() -> u32 {\n    1\n}\n",
    )
    .unwrap();
    let alice = c.user("alice").await;
    // A turn exposes only what is available when it is made: wait until every replica's
    // index is ready (asked about a first turn), then make the turn the calls use.
    let (_, probe) = c.run_and_turn(&c.lb, &alice, "explore the code").await;
    for i in 0..3 {
        c.ladder_until(i, &alice, &probe, "codebase_explore", |l| l["state"] == "available" || l["state"] == "exposed")
            .await;
    }
    let (run, turn) = c.run_and_turn(&c.lb, &alice, "explore the code").await;
    let who = Who { token: alice.clone(), run, turn };
    let explore = |n: usize, at: usize, symbol: &'static str| {
        let (c, who) = (&c, &who);
        async move {
            let inv = c
                .freeze(
                    &c.at(at),
                    who,
                    "codebase_explore",
                    &format!("x{n}"),
                    json!({"kind": "definitions", "symbol": symbol}),
                )
                .await;
            let id = inv["invocation_id"].as_str().unwrap().to_owned();
            let done = c.final_of(&c.at(at), &who.token, &id).await;
            (done, c.claimed_by(&id).await)
        }
    };
    let mut claimers = HashSet::new();
    for n in 0..30 {
        let (done, by) = explore(n, n % 3, "alpha").await;
        assert_eq!(done["status"], "completed", "{done:#}");
        let results = done["result"]["output"]["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "{done:#}");
        assert_eq!(results[0]["verification"]["status"], "verified", "{done:#}");
        assert_eq!(results[0]["path"], "src/lib.rs", "{done:#}");
        claimers.insert(by.split(':').next().unwrap().to_owned());
        if claimers.len() >= 2 && n >= 5 {
            break;
        }
    }
    assert!(claimers.len() >= 2, "every call was claimed by one replica: {claimers:?}");
    c.kill9(0);
    std::fs::write(ws.join("src/more.rs"), "pub fn gamma() -> u32 {\n    2\n}\n").unwrap();
    for n in 100..106 {
        let (done, by) = explore(n, 1 + n % 2, "gamma").await;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert!(!by.starts_with(&c.node_id(0)), "{by}");
        let results = done["result"]["output"]["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "the new file is indexed by the replica that answered: {done:#}");
        assert_eq!(results[0]["path"], "src/more.rs", "{done:#}");
    }
}

/// Tool vectors are computed once per (model, text) for the whole cluster: a second replica
/// with the same model reads every vector the first stored and embeds none itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_vectors_are_computed_once_and_shared_by_replicas() {
    assert!(
        std::env::var_os("MIRA_EMBEDDING_MODEL_DIR").is_some(),
        "MIRA_EMBEDDING_MODEL_DIR is not set: eval \"$(scripts/fetch-embedding-model.sh)\" first"
    );
    let tmp = tempfile::tempdir().unwrap();
    let db = TestDb::new(Backend::Postgres, tmp.path()).await;
    let client = mira::net::client_builder().build().unwrap();
    let embedded = |v: &Value| {
        v["embedding"]["state"] == "ready"
            && v["embedding"]["tools_indexed"].as_u64().unwrap_or(0) > 0
            && v["embedding"]["tools_embedded"] == v["embedding"]["tools_indexed"]
    };
    let until_embedded = |r: &Replica| {
        let client = client.clone();
        let base = r.base.clone();
        async move {
            for _ in 0..1200 {
                if let Ok(resp) = client.get(format!("{base}/readyz")).send().await
                    && let Ok(v) = resp.json::<Value>().await
                    && embedded(&v)
                {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{base} never embedded its tools");
        }
    };
    let a = Replica::spawn_with_model(&tmp.path().join("a"), &db.url);
    let first = until_embedded(&a).await;
    let n = first["embedding"]["tools_indexed"].as_u64().unwrap();
    let stored: i64 = {
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM tool_embeddings").fetch_one(&pool).await.unwrap()
    };
    assert!(stored > 0 && u64::try_from(stored).unwrap() <= n, "{stored} rows for {n} tools");
    // One vector per distinct tool text, each computed by this first replica.
    assert_eq!(first["embedding"]["embedded_since_start"], stored, "{first:#}");
    let b = Replica::spawn_with_model(&tmp.path().join("b"), &db.url);
    let second = until_embedded(&b).await;
    assert_eq!(second["embedding"]["tools_indexed"], n, "{second:#}");
    assert_eq!(second["embedding"]["embedded_since_start"], 0, "the second replica computed nothing: {second:#}");
    assert_eq!(second["embedding"]["from_cache_since_start"], stored, "{second:#}");
    drop(b);
    drop(a);
}

/// The runner's standard error and the end of each replica's log, for a failure message.
fn diag(c: &Cluster, runner: &crate::runner::RunnerProc) -> String {
    let mut out = format!("runner:\n{}\n", runner.stderr.lock().unwrap());
    for i in 0..c.ports.len() {
        let log = std::fs::read_to_string(c.dir.join(format!("r{}.log", i + 1))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        out.push_str(&format!(
            "replica {i} ({}):\n{}\n",
            c.node_id(i),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    out
}

/// Device `id`'s holder as the database records it (node id, or None).
async fn device_holder(pool: &sqlx::PgPool, id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT holder_node_id FROM devices WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

/// A device of the cluster's user with a real runner connected through haproxy, a
/// workspace on it, and a run and a turn there (made through a replica that does not hold the
/// runner): what the device tests share.
struct ClusterDevice {
    id: String,
    runner: crate::runner::RunnerProc,
    workspace: PathBuf,
    /// The holder's node id and replica index.
    holder_node: String,
    holder: usize,
    /// The two other replicas.
    others: [usize; 2],
    who: Who,
    _root: tempfile::TempDir,
}

impl Cluster {
    /// Waits (30 s at most) until device `id` has a holder other than `not`; its node id.
    async fn device_holder_other_than(&self, id: &str, not: Option<&str>) -> String {
        for _ in 0..300 {
            if let Some(h) = device_holder(&self.pool, id).await
                && Some(h.as_str()) != not
            {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the device never got a holder other than {not:?}");
    }

    /// Device `id`'s status at replica `i` for `token`'s user.
    async fn device_status(&self, i: usize, token: &str, id: &str) -> Value {
        let r = self.req(reqwest::Method::GET, &format!("{}/v1/devices", self.at(i)), token, None).await;
        r.body["devices"].as_array().unwrap().iter().find(|d| d["id"] == id).unwrap()["status"].clone()
    }

    /// Registers and enrolls a device for `token`'s user through the load balancer, starts
    /// its runner (with `--confirm` when `confirm`) on a new folder holding `files`, checks
    /// that every replica says it is connected, and makes a workspace, a run and a turn
    /// (`task`) on it through a replica that is not the holder.
    async fn device(&self, token: &str, confirm: bool, files: &[(&str, &str)], task: &str) -> ClusterDevice {
        let root = tempfile::tempdir().unwrap();
        let r = self
            .req(reqwest::Method::POST, &format!("{}/v1/devices", self.lb), token, Some(json!({"name": "laptop"})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let device_id = r.body["id"].as_str().unwrap().to_owned();
        let code = r.body["enrollment"]["code"].as_str().unwrap().to_owned();
        let state = root.path().join("state");
        let workspace = root.path().join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        let workspace = std::fs::canonicalize(&workspace).unwrap();
        for (name, text) in files {
            std::fs::write(workspace.join(name), text).unwrap();
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mira"))
            .args(["runner", "enroll", "--server", &self.lb, "--code", &code, "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        assert!(out.status.success(), "enroll: {}", String::from_utf8_lossy(&out.stderr));
        let mut runner = crate::runner::RunnerProc {
            device_id: device_id.clone(),
            state,
            workspace: workspace.clone(),
            child: None,
            base: self.lb.clone(),
            confirm,
            stderr: Arc::new(std::sync::Mutex::new(String::new())),
            args: Vec::new(),
        };
        runner.start();
        let holder_node = self.device_holder_other_than(&device_id, None).await;
        let n = self.ports.len();
        let holder = (0..n).find(|i| self.node_id(*i) == holder_node).expect("the holder is one of the replicas");
        let others: Vec<usize> = (0..n).filter(|i| *i != holder).collect();
        // Every replica says it is connected, the holder and the others.
        for i in 0..n {
            assert_eq!(self.device_status(i, token, &device_id).await, "connected", "replica {i} (holder {holder})");
        }
        let via = self.at(others[0]);
        let r = self
            .req(
                reqwest::Method::POST,
                &format!("{via}/v1/workspaces"),
                token,
                Some(json!({"name": "dev", "path": workspace, "device_id": device_id})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let r = self
            .req(reqwest::Method::POST, &format!("{via}/v1/runs"), token, Some(json!({"workspace_id": r.body["id"]})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let run = r.body["id"].as_str().unwrap().to_owned();
        let r = self
            .req(reqwest::Method::POST, &format!("{via}/v1/runs/{run}/turns"), token, Some(json!({"task": task})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        let who = Who { token: token.to_owned(), run, turn: r.body["turn_id"].as_str().unwrap().to_owned() };
        ClusterDevice {
            id: device_id,
            runner,
            workspace,
            holder_node,
            holder,
            others: [others[0], others[1]],
            who,
            _root: root,
        }
    }
}

/// A device's runner in a cluster (issue 17 on issue 16): the runner connects through
/// haproxy to one replica (A, its holder); freezes (the prepare on the device), grants and
/// executions through the other replicas reach it, a read and an edit; every replica says
/// it is connected. A is killed with SIGKILL while the runner holds a granted edit (waiting
/// for its person's yes): the edit is written once, the invocation ends `interrupted` with
/// `outcome_unknown` naming the device and is never sent again; the runner reconnects
/// through another replica (the holder moves), its result arrives late and is attached as
/// evidence, and calls work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_runner_is_reached_through_every_replica_and_survives_its_holder() {
    let c = Cluster::start_with(3, &["--runner-lease-secs", "3"]).await;
    let token = c.user("dana").await;
    let files = [("notes.txt", "cluster notes\n"), ("counter.txt", "runs:\n")];
    let d = c.device(&token, true, &files, "read the notes and count a run").await;
    let ClusterDevice { id: device_id, mut runner, workspace, holder_node, holder: a, others: [b, cc], who, _root } = d;
    let status_at = async |i: usize| -> Value { c.device_status(i, &token, &device_id).await };
    let claimed_by = async |id: &str| -> String {
        let by: Option<String> = sqlx::query_scalar("SELECT claimed_by FROM invocations WHERE id = $1")
            .bind(id)
            .fetch_one(&c.pool)
            .await
            .unwrap();
        by.unwrap_or_default()
    };

    // Reads frozen through B and through C run on the device (whichever replica claims them).
    let mut forwarded = 0;
    for (k, at) in [b, cc, b, cc].into_iter().enumerate() {
        let inv = c.freeze(&c.at(at), &who, "read_open", &format!("r{k}"), json!({"path": "notes.txt"})).await;
        let id = inv["invocation_id"].as_str().unwrap();
        let done = c.final_of(&c.at(at), &token, id).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert!(done["result"]["output"].to_string().contains("cluster notes"), "{done}");
        let ev = c
            .req(
                reqwest::Method::GET,
                &format!("{}/v1/evidence/{}", c.at(at), done["evidence_ids"][0].as_str().unwrap()),
                &token,
                None,
            )
            .await;
        assert_eq!(ev.body["provenance"]["device_id"], device_id.as_str(), "{ev:?}");
        if !claimed_by(id).await.starts_with(&format!("{holder_node}:")) {
            forwarded += 1;
        }
    }
    assert!(forwarded > 0, "no read was claimed by a replica other than the holder");

    // An edit frozen through B (its preview prepared on the device through A), granted
    // through C while A is paused (so that B or C claims it and forwards it to A); the runner
    // holds it for its person's yes; A is killed meanwhile.
    let edit = json!({"path": "counter.txt", "old": "runs:\n", "new": "runs:\nran\n"});
    let inv = c.freeze(&c.at(b), &who, "replace_block", "e1", edit).await;
    assert_eq!(inv["status"], "awaiting_approval", "{inv}");
    let edit_id = inv["invocation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        device_holder(&c.pool, &device_id).await.as_deref(),
        Some(holder_node.as_str()),
        "{}",
        diag(&c, &runner)
    );
    c.signal(a, libc::SIGSTOP);
    assert!(c.grant(&c.at(cc), &token, &inv).await);
    let mut claimer = String::new();
    for _ in 0..100 {
        claimer = claimed_by(&edit_id).await;
        if !claimer.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.signal(a, libc::SIGCONT);
    assert!(!claimer.is_empty() && !claimer.starts_with(&format!("{holder_node}:")), "claimed by {claimer:?}");
    runner.prompt(1).await;
    assert_eq!(
        device_holder(&c.pool, &device_id).await.as_deref(),
        Some(holder_node.as_str()),
        "{}",
        diag(&c, &runner)
    );
    c.kill9(a);
    runner.answer("y");
    let done = c.final_of(&c.at(b), &token, &edit_id).await;
    eprintln!(
        "reads claimed away from the holder: {forwarded} of 4; the edit claimed by {claimer} (holder {holder_node})"
    );
    // Forwarded to A, which died with it: the outcome is unknown, and it is not sent again.
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("interrupted"), Some("outcome_unknown")),
        "{done}\n{}",
        diag(&c, &runner)
    );
    assert_eq!(done["result"]["error"]["details"]["device_id"], device_id.as_str(), "{done}");
    // The runner reconnects through another replica: the holder moves.
    let moved = c.device_holder_other_than(&device_id, Some(&holder_node)).await;
    assert_ne!(moved, holder_node);
    for i in [b, cc] {
        for _ in 0..100 {
            if status_at(i).await == "connected" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status_at(i).await, "connected", "replica {i} after the move");
    }
    // The edit ran once (the person said yes), its late result is attached, nothing re-sent.
    let late = {
        let mut found = None;
        for _ in 0..300 {
            let v = c.req(reqwest::Method::GET, &format!("{}/v1/invocations/{edit_id}", c.at(b)), &token, None).await;
            assert_eq!(v.body["status"], "interrupted", "{v:?}");
            for id in v.body["evidence_ids"].as_array().unwrap() {
                let ev = c
                    .req(
                        reqwest::Method::GET,
                        &format!("{}/v1/evidence/{}", c.at(b), id.as_str().unwrap()),
                        &token,
                        None,
                    )
                    .await;
                if ev.body["kind"] == "late_device_result" {
                    found = Some(ev.body);
                }
            }
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        found.unwrap_or_else(|| panic!("the late result was not attached\n{}", diag(&c, &runner)))
    };
    assert_eq!(late["provenance"]["outcome"], "succeeded", "{late}");
    assert_eq!(late["provenance"]["device_id"], device_id.as_str(), "{late}");
    assert_eq!(std::fs::read_to_string(workspace.join("counter.txt")).unwrap(), "runs:\nran\n");

    // Calls work again through the replicas left: a read and a granted write.
    let inv = c.freeze(&c.at(cc), &who, "read_open", "r-after", json!({"path": "counter.txt"})).await;
    let done = c.final_of(&c.at(cc), &token, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["result"]["output"].to_string().contains("ran"), "{done}");
    let inv =
        c.freeze(&c.at(b), &who, "write_file", "w-after", json!({"path": "after.txt", "content": "again\n"})).await;
    assert!(c.grant(&c.at(cc), &token, &inv).await);
    runner.prompt(2).await;
    runner.answer("y");
    let done = c.final_of(&c.at(b), &token, inv["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(std::fs::read_to_string(workspace.join("after.txt")).unwrap(), "again\n");
    // Still written once.
    assert_eq!(std::fs::read_to_string(workspace.join("counter.txt")).unwrap(), "runs:\nran\n");
}

/// Receives a terminal stream's events until `exit` (30 s at most).
async fn until_exit(rx: &mut mpsc::Receiver<(Option<i64>, String, Value)>) -> Vec<(i64, String, Value)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, event, data))) => {
                let exit = event == "exit";
                out.push((id.unwrap_or(-1), event, data));
                if exit {
                    return out;
                }
            }
            other => panic!("the stream ended without exit ({other:?}): {out:?}"),
        }
    }
}

/// The concatenated `data` of a terminal stream's `output` events.
fn stream_text(events: &[(i64, String, Value)]) -> String {
    events.iter().filter(|e| e.1 == "output").map(|e| e.2["data"].as_str().unwrap()).collect()
}

/// Terminal sessions on a device in a cluster (issues 16/17): every action of a session on
/// the device (start, input, resize, a `wait` longer than the request timeout) claimed by a
/// replica that does not hold the runner's connection is forwarded to the holder and run
/// there once, the holder keeping the session's books; the output stream is read from the
/// third replica, with a resume. Then revoking the device through a replica that does not
/// hold it cuts the runner at once: it exits with status 3 long before its next heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_terminal_actions_are_forwarded_to_the_holder_and_a_revocation_anywhere_cuts_at_once() {
    // A 30 s lease: the runner beats every 10 s. A 4 s request timeout, shorter than the wait.
    let c = Cluster::start_with(3, &["--runner-lease-secs", "30", "--request-timeout-secs", "4"]).await;
    let token = c.user("tess").await;
    let d = c.device(&token, false, &[], "run commands on the laptop").await;
    let (a, [b, cc]) = (d.holder, d.others);
    let b_node = c.node_id(b);
    // Each action: frozen at B (prepared on the device through A), granted at B while A and C
    // are stopped, so that B claims it, and forwards it to A once they continue. The
    // invocation id.
    let claimed_at_b = async |call: &str, input: Value| -> String {
        let inv = c.freeze(&c.at(b), &d.who, "terminal_session", call, input).await;
        assert_eq!(inv["status"], "awaiting_approval", "{inv}");
        let id = inv["invocation_id"].as_str().unwrap().to_owned();
        c.signal(a, libc::SIGSTOP);
        c.signal(cc, libc::SIGSTOP);
        assert!(c.grant(&c.at(b), &token, &inv).await);
        let mut claimer = String::new();
        for _ in 0..100 {
            claimer = c.claimed_by(&id).await;
            if !claimer.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.signal(a, libc::SIGCONT);
        c.signal(cc, libc::SIGCONT);
        assert!(claimer.starts_with(&format!("{b_node}:")), "{call} claimed by {claimer:?}, not B ({b_node})");
        id
    };
    // An action claimed at B, completed: its final view and how long it took from the grant.
    let mut ids = Vec::new();
    let mut act = async |call: &str, input: Value| -> (Value, Duration) {
        let begun = std::time::Instant::now();
        let id = claimed_at_b(call, input).await;
        let done = c.final_of(&c.at(b), &token, &id).await;
        assert_eq!(done["status"], "completed", "{call}: {done:#}\n{}", diag(&c, &d.runner));
        ids.push(id);
        (done, begun.elapsed())
    };

    let bash = json!({"action": "start", "command": "bash", "args": ["--norc", "--noprofile"], "env": {"PS1": "$ "}});
    let (done, _) = act("s1", bash).await;
    let out = &done["result"]["output"];
    let session = out["session_id"].as_str().unwrap().to_owned();
    assert_eq!(out["cwd"], d.workspace.to_string_lossy().as_ref(), "{done:#}");
    // The holder recorded the session (the device's) before it sent the start.
    let (node, state): (String, String) = sqlx::query_as("SELECT node_id, state FROM terminal_sessions WHERE id = $1")
        .bind(&session)
        .fetch_one(&c.pool)
        .await
        .unwrap();
    assert_eq!((node.as_str(), state.as_str()), (d.id.as_str(), "running"));

    let lines = json!({"action": "input", "session_id": session,
        "data": "for i in $(seq 1 200); do echo line-$i-$((i*7)); done\n", "settle_ms": 500});
    let (done, _) = act("i1", lines).await;
    assert!(done["result"]["output"]["output"].as_str().unwrap().contains("line-200-1400"), "{done:#}");

    let (done, _) = act("z1", json!({"action": "resize", "session_id": session, "cols": 100, "rows": 30})).await;
    assert_eq!(done["result"]["output"]["session_id"], session.as_str(), "{done:#}");
    let size: (i64, i64) = sqlx::query_as("SELECT cols, rows FROM terminal_sessions WHERE id = $1")
        .bind(&session)
        .fetch_one(&c.pool)
        .await
        .unwrap();
    assert_eq!(size, (100, 30), "the holder recorded the resize");

    let sleep = json!({"action": "input", "session_id": session,
        "data": "sleep 12; echo slept-$((6*7)); exit\n", "settle_ms": 100});
    act("i2", sleep).await;
    // A forwarded wait lasting longer than the request timeout (4 s) is not cut. (The sleep
    // began during the input action: 12 s leaves the wait over 5 s however slow that was.)
    let (done, took) = act("w1", json!({"action": "wait", "session_id": session, "timeout_ms": 60000})).await;
    let out = &done["result"]["output"];
    assert_eq!((out["state"].as_str(), out["exit_code"].as_i64()), (Some("exited"), Some(0)), "{done:#}");
    assert!(out["output"].as_str().unwrap().contains("slept-42"), "{done:#}");
    assert!(took > Duration::from_secs(5), "the wait took {took:?}");

    // Each action ran on the device once, and the holder recorded its reported range.
    let journal = d.runner.journal();
    for id in &ids {
        assert_eq!(journal.iter().filter(|e| e.starts_with(&format!("inv-{id}."))).count(), 2, "{journal:?}");
        assert!(journal.contains(&format!("inv-{id}.delivered")), "{journal:?}");
    }
    let reports: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM terminal_reports WHERE session_id = $1")
        .bind(&session)
        .fetch_one(&c.pool)
        .await
        .unwrap();
    assert_eq!(reports, ids.len() as i64);

    // The stream, read from C (neither the holder nor the claimer), then resumed there from
    // the middle: exactly the rest.
    let url = format!("{}/v1/terminal-sessions/{session}/stream", c.at(cc));
    let full = until_exit(&mut c.sse(&url, &token, None).await).await;
    let exit = full.last().unwrap();
    assert_eq!(exit.2["state"], "exited", "{full:?}");
    let outputs: Vec<_> = full.iter().filter(|e| e.1 == "output").collect();
    assert_eq!(outputs[0].2["start"], 0);
    for w in outputs.windows(2) {
        assert_eq!(w[0].2["end"], w[1].2["start"]);
    }
    assert_eq!(outputs.last().unwrap().2["end"], exit.2["bytes_out"]);
    let all = stream_text(&full);
    assert!(all.contains("line-1-7") && all.contains("line-200-1400") && all.contains("slept-42"), "{all}");
    assert_eq!(all.len() as i64, exit.2["bytes_out"].as_i64().unwrap(), "ASCII output: a byte is a character");
    let at = all.len() as i64 / 2;
    let rest = until_exit(&mut c.sse(&url, &token, Some(at)).await).await;
    assert_eq!(rest[0].2["start"].as_i64(), Some(at), "{rest:?}");
    assert_eq!(stream_text(&rest), all[at as usize..]);

    // A forwarded action whose holder dies with it: A is killed once the runner holds a
    // forwarded `wait` (its journal says it started). The wait ends `interrupted` with
    // `outcome_unknown` naming the device and is never sent again; the runner moves to B or
    // C, and the wait's real result arrives there as `late_device_result` evidence.
    let sleeper = json!({"action": "start", "command": "bash",
        "args": ["--norc", "--noprofile", "-c", "sleep 8; echo woke-$((3*3))"]});
    // (8 s: the session must outlive the freeze, grant and forward of the wait below, and
    // the wait's start on the device, before A is killed — however slow the machine.)
    let id = claimed_at_b("s2", sleeper).await;
    let done = c.final_of(&c.at(b), &token, &id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    let session2 = done["result"]["output"]["session_id"].as_str().unwrap().to_owned();
    let wait_id = claimed_at_b("w2", json!({"action": "wait", "session_id": session2, "timeout_ms": 20000})).await;
    let start = std::time::Instant::now();
    while !d.runner.journal().contains(&format!("inv-{wait_id}.started")) {
        assert!(start.elapsed() < Duration::from_secs(10), "the forwarded wait never reached the runner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.kill9(a);
    let done = c.final_of(&c.at(b), &token, &wait_id).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("interrupted"), Some("outcome_unknown")),
        "{done:#}\n{}",
        diag(&c, &d.runner)
    );
    assert_eq!(done["result"]["error"]["details"]["device_id"], d.id.as_str(), "{done:#}");
    let moved = c.device_holder_other_than(&d.id, Some(&d.holder_node)).await;
    let a = (0..3).find(|i| c.node_id(*i) == moved).unwrap();
    let b = [b, cc].into_iter().find(|i| *i != a).unwrap();
    let late = {
        let mut found = None;
        for _ in 0..300 {
            let v = c.req(reqwest::Method::GET, &format!("{}/v1/invocations/{wait_id}", c.at(b)), &token, None).await;
            assert_eq!(v.body["status"], "interrupted", "{v:?}");
            for ev in v.body["evidence_ids"].as_array().unwrap() {
                let url = format!("{}/v1/evidence/{}", c.at(b), ev.as_str().unwrap());
                let ev = c.req(reqwest::Method::GET, &url, &token, None).await;
                if ev.body["kind"] == "late_device_result" {
                    found = Some(ev.body);
                }
            }
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        found.unwrap_or_else(|| panic!("the wait's late result was not attached\n{}", diag(&c, &d.runner)))
    };
    assert_eq!(late["provenance"]["outcome"], "succeeded", "{late}");
    let journal = d.runner.journal();
    assert_eq!(journal.iter().filter(|e| e.starts_with(&format!("inv-{wait_id}."))).count(), 2, "{journal:?}");

    // The holder's (A now) cut route needs the cluster secret, and cuts only a revoked device: the
    // runner keeps its connection (it would reconnect within a second, with a new session).
    let session_sha = async || -> Option<String> {
        sqlx::query_scalar("SELECT session_sha256 FROM devices WHERE id = $1")
            .bind(&d.id)
            .fetch_one(&c.pool)
            .await
            .unwrap()
    };
    let connection = session_sha().await;
    assert!(connection.is_some());
    let cut_url = format!("{}/internal/v1/devices/cut", c.at(a));
    let r = c.client.post(&cut_url).json(&json!({"device_id": d.id})).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let secret = std::fs::read_to_string(c.dir.join("secret")).unwrap();
    let r = c
        .client
        .post(&cut_url)
        .header("x-mira-cluster-secret", secret.trim())
        .json(&json!({"device_id": d.id}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"cut": false}));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(session_sha().await, connection, "the connection of a device not revoked was kept");
    let mut runner = d.runner;
    assert!(runner.child.as_mut().unwrap().try_wait().unwrap().is_none(), "the runner is still running");

    // Revocation through the replica that does not hold the runner now (B), right after a
    // heartbeat (the next one is 10 s away): the holder (A now) is told and cuts the runner's
    // connection at once; the runner connects again, is refused, and
    // exits with status 3.
    let seen = async || -> Option<String> {
        sqlx::query_scalar("SELECT last_seen_at FROM devices WHERE id = $1")
            .bind(&d.id)
            .fetch_one(&c.pool)
            .await
            .unwrap()
    };
    let before = seen().await;
    let start = std::time::Instant::now();
    let beat = loop {
        let now = seen().await;
        if now != before {
            break now.unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(15), "no heartbeat in 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let r = c.req(reqwest::Method::POST, &format!("{}/v1/devices/{}/revoke", c.at(b), d.id), &token, None).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::OK, Some("revoked")), "{r:?}");
    let revoked = std::time::Instant::now();
    let mut child = runner.child.take().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(revoked.elapsed() < Duration::from_secs(30), "the revoked runner kept running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Exited before its next heartbeat (10 s after the stored one) could have had it cut: by
    // the stored time of that heartbeat and the clock the replicas stamp it with.
    let since_beat =
        chrono::Utc::now() - chrono::DateTime::parse_from_rfc3339(&beat).unwrap().with_timezone(&chrono::Utc);
    eprintln!("the runner exited {:?} after the revocation through a non-holder", revoked.elapsed());
    assert!(
        since_beat < chrono::TimeDelta::seconds(9),
        "the revoked runner exited {since_beat} after its last heartbeat, as if cut at the next one (10 s)"
    );
    assert_eq!(status.code(), Some(3));
    assert_eq!(device_holder(&c.pool, &d.id).await, None);
}
