//! Grant → file written: how long after an approver's grant the approved edit is on disk.
//!
//! For each back-end a real server is started in-process on loopback (a fresh SQLite file,
//! or a fresh Postgres database on `TEST_DATABASE_URL`, default the local server, dropped
//! afterwards). N `write_file` invocations are frozen (each waits for approval), then granted
//! one at a time: the clock starts just before the grant request is sent, and stops when a
//! poller (checking every 20 µs) first sees the target file on disk — it appears whole, by
//! rename. The previous invocation is completed before the next grant. Reported: p50, p99
//! (nearest rank), max and mean of that time, and of the grant's HTTP round trip alone.
//!
//! Run: `cargo bench --bench approval_latency` (options after `--`: `--n 1000`,
//! `--backend sqlite|postgres|both`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mira::config::RuntimeConfig;
use mira::server::{Server, Settings};
use serde_json::{Value, json};

struct Args {
    n: usize,
    backends: Vec<&'static str>,
}

fn args() -> anyhow::Result<Args> {
    let mut out = Args { n: 1000, backends: vec!["sqlite", "postgres"] };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => out.n = it.next().context("--n needs a number")?.parse()?,
            "--backend" => {
                out.backends = match it.next().as_deref() {
                    Some("sqlite") => vec!["sqlite"],
                    Some("postgres") => vec!["postgres"],
                    Some("both") => vec!["sqlite", "postgres"],
                    other => bail!("unknown backend {other:?}"),
                }
            }
            "--bench" => {} // passed by `cargo bench`
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(out)
}

fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

async fn pg_admin(sql: String) -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&admin_url()).await?;
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await?;
    pool.close().await;
    Ok(())
}

struct Stats {
    p50: Duration,
    p99: Duration,
    max: Duration,
    mean: Duration,
}

/// Nearest-rank percentiles of `samples`.
fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let n = samples.len().max(1);
    let rank = |p: usize| samples[((p * n).div_ceil(100)).clamp(1, n) - 1];
    let total: Duration = samples.iter().sum();
    Stats { p50: rank(50), p99: rank(99), max: samples[n - 1], mean: total / u32::try_from(n).unwrap_or(u32::MAX) }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.json().await?))
    }
}

/// Polls until `path` exists; returns when it was first seen.
fn wait_for_file(path: PathBuf, stop: Arc<AtomicBool>) -> Option<Instant> {
    loop {
        if path.exists() {
            return Some(Instant::now());
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

async fn bench(backend: &str, n: usize) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data_dir = tmp.path().join("data");
    let workspace = tmp.path().join("ws");
    std::fs::create_dir_all(&data_dir)?;
    std::fs::create_dir_all(&workspace)?;
    let pg_name = format!("mira_bench_{}", uuid::Uuid::now_v7().simple());
    let database_url = if backend == "postgres" {
        pg_admin(format!("CREATE DATABASE {pg_name}")).await?;
        let admin = admin_url();
        format!("{}/{pg_name}", admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b))
    } else {
        format!("sqlite://{}?mode=rwc", data_dir.join("mira.db").display())
    };
    let settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: data_dir.clone(),
        database_url,
        workspace: workspace.clone(),
        runtime: RuntimeConfig::default(),
        body_limit: 1024 * 1024,
        request_timeout: Duration::from_secs(30),
    };
    let server = Server::start(settings).await?;
    let token = std::fs::read_to_string(server.admin_token_file.clone().context("admin token")?)?.trim().to_owned();
    let c = Client { http: reqwest::Client::new(), base: format!("http://{}", server.addr), token };
    let result = measure(&c, &std::fs::canonicalize(&workspace)?, backend, n).await;
    server.shutdown().await;
    if backend == "postgres" {
        pg_admin(format!("DROP DATABASE IF EXISTS {pg_name} WITH (FORCE)")).await?;
    }
    result
}

async fn measure(c: &Client, ws: &Path, backend: &str, n: usize) -> anyhow::Result<()> {
    use reqwest::Method;
    let (_, run) = c.send(Method::POST, "/v1/runs", Some(json!({"title": "bench"}))).await?;
    let run = run["id"].as_str().context("run id")?.to_owned();
    let (_, turn) =
        c.send(Method::POST, &format!("/v1/runs/{run}/turns"), Some(json!({"task": "write files"}))).await?;
    let turn = turn["turn_id"].as_str().context("turn id")?.to_owned();
    let mut frozen = Vec::with_capacity(n);
    for i in 0..n {
        let body = json!({"turn_id": turn, "tool_id": "write_file", "tool_call_id": format!("call-{i}"),
                          "input": {"path": format!("f{i:05}.txt"), "content": format!("file {i}\n")}});
        let (status, inv) = c.send(Method::POST, &format!("/v1/runs/{run}/invocations"), Some(body)).await?;
        if status != 201 || inv["status"] != "awaiting_approval" {
            bail!("freezing call {i}: {status} {inv}");
        }
        frozen.push(inv);
    }
    let mut to_file = Vec::with_capacity(n);
    let mut round_trip = Vec::with_capacity(n);
    for (i, inv) in frozen.iter().enumerate() {
        let path = ws.join(format!("f{i:05}.txt"));
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let stop = stop.clone();
            tokio::task::spawn_blocking(move || wait_for_file(path, stop))
        };
        let grant =
            json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]});
        let approval = inv["approval_id"].as_str().context("approval id")?;
        let t0 = Instant::now();
        let (status, body) = c.send(Method::POST, &format!("/v1/approvals/{approval}/grant"), Some(grant)).await?;
        round_trip.push(t0.elapsed());
        if status != 200 {
            stop.store(true, Ordering::Relaxed);
            bail!("grant {i}: {status} {body}");
        }
        let seen = tokio::time::timeout(Duration::from_secs(30), poller).await;
        let Ok(Ok(Some(seen))) = seen else {
            stop.store(true, Ordering::Relaxed);
            bail!("file {i} did not appear within 30 s");
        };
        to_file.push(seen - t0);
        let id = inv["invocation_id"].as_str().context("invocation id")?;
        loop {
            let (_, now) = c.send(Method::GET, &format!("/v1/invocations/{id}"), None).await?;
            match now["status"].as_str() {
                Some("completed") => break,
                Some("queued" | "running") => tokio::time::sleep(Duration::from_millis(1)).await,
                other => bail!("invocation {i} ended {other:?}: {now}"),
            }
        }
    }
    let f = stats(to_file);
    let r = stats(round_trip);
    println!(
        "{backend:<9} n={n:<5} grant→file written: p50 {} p99 {} max {} mean {} | grant HTTP round trip: p50 {} p99 {}",
        ms(f.p50),
        ms(f.p99),
        ms(f.max),
        ms(f.mean),
        ms(r.p50),
        ms(r.p99)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    rt.block_on(async {
        for backend in &args.backends {
            bench(backend, args.n).await?;
        }
        Ok(())
    })
}
