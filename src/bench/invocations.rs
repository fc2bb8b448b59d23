//! `mira bench invocations`: frozen invocations per second.
//!
//! Starts a server in-process on a fresh store (a temporary SQLite file, or a fresh database on
//! the given Postgres server), opens a run and a turn, then `clients` concurrent HTTP clients
//! submit `read_open` calls (each a new `tool_call_id`) for `seconds`. Prints the freeze
//! throughput, the request latency p50/p99, and how many of the frozen calls the harness
//! executed by the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use mira::config::RuntimeConfig;
use mira::server::{Server, Settings};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct InvocationBench {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// A Postgres server URL (a fresh database is created on it and dropped after);
    /// default a temporary SQLite file.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: InvocationBench) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("mira-bench-{}", uuid::Uuid::now_v7().simple()));
    let workspace = tmp.join("ws");
    std::fs::create_dir_all(&workspace)?;
    std::fs::write(workspace.join("file.txt"), "line one\nline two\nline three\n")?;
    let (url, pg_db) = match &opts.postgres {
        None => (format!("sqlite://{}?mode=rwc", tmp.join("mira.db").display()), None),
        Some(admin) => {
            let name = format!("mira_bench_{}", uuid::Uuid::now_v7().simple());
            admin_sql(admin, &format!("CREATE DATABASE {name}")).await?;
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            (format!("{base}/{name}"), Some((admin.clone(), name)))
        }
    };
    let settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: tmp.clone(),
        database_url: url,
        workspace,
        runtime: RuntimeConfig::default(),
        body_limit: 1024 * 1024,
        request_timeout: Duration::from_secs(30),
    };
    let server = Server::start(settings).await?;
    let token = std::fs::read_to_string(tmp.join("admin.token"))?.trim().to_owned();
    let base = format!("http://{}", server.addr);
    let client = mira::net::client_builder().pool_max_idle_per_host(opts.clients).build()?;
    let api = Arc::new(Api { client: client.clone(), base: base.clone(), token: token.clone() });
    let run = api.post("/v1/runs", &json!({"title": "bench"})).await?;
    let run_id = run["id"].as_str().context("run id")?.to_owned();
    let turn = api.post(&format!("/v1/runs/{run_id}/turns"), &json!({"task": "read a file"})).await?;
    let turn_id = turn["turn_id"].as_str().context("turn id")?.to_owned();

    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let started = Instant::now();
    let path = Arc::new(format!("/v1/runs/{run_id}/invocations"));
    let mut tasks = Vec::new();
    for client_no in 0..opts.clients {
        let (api, path, turn_id) = (api.clone(), path.clone(), turn_id.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let body = json!({"turn_id": turn_id, "tool_id": "read_open", "tool_call_id": format!("c{client_no}-{n}"),
                                  "input": {"path": "file.txt", "start_line": 1, "end_line": 2}});
                let t0 = Instant::now();
                match api.post(&path, &body).await {
                    Ok(_) => latencies.push(t0.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let p = super::percentiles(&latencies);
    let executed = executed_count(&client, &base, &token, &run_id).await.unwrap_or(0);
    println!(
        "backend={} clients={} seconds={:.1} frozen={} errors={} throughput={:.0}/s p50={:.2}ms p99={:.2}ms max={:.2}ms executed_by_end={}",
        server.app.store.backend().name(),
        opts.clients,
        elapsed,
        latencies.len(),
        errors,
        latencies.len() as f64 / elapsed,
        p.p50,
        p.p99,
        p.max,
        executed,
    );
    server.shutdown().await;
    if let Some((admin, name)) = pg_db {
        admin_sql(&admin, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

struct Api {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Result<serde_json::Value> {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await
    }
}

async fn executed_count(client: &reqwest::Client, base: &str, token: &str, run_id: &str) -> anyhow::Result<u64> {
    let events: String = client.get(format!("{base}/v1/runs/{run_id}")).bearer_auth(token).send().await?.text().await?;
    let run: serde_json::Value = serde_json::from_str(&events)?;
    // Each executed read_open appends frozen, started, completed and evidence events.
    Ok(run["last_event_id"].as_u64().unwrap_or(0).saturating_sub(1) / 4)
}

async fn admin_sql(admin_url: &str, sql: &str) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(admin_url).await?;
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut conn).await?;
    Ok(())
}
