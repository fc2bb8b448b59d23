//! `mira bench invocations`: how many invocations per second are frozen and executed.
//!
//! Starts a server in-process on a fresh store (a temporary SQLite file, or a fresh database
//! on the given Postgres server). First it measures the ceiling: a pgbench-style one-row
//! insert (one autocommit `INSERT` per statement) by the same number of clients on the same
//! database, for `--ceiling-seconds`. Then `clients` planners, each with its own run and
//! turn, submit `read_open` calls (each a new `tool_call_id`) for `seconds`. Printed:
//!
//! - `frozen/s`: accepted freezes per second, with the request latency p50/p99;
//! - `completed/s`: invocations that had reached `completed` with their evidence stored by the
//!   end of the load, per second of load;
//! - the backlog left at the end (queued or running), also in seconds of work at the measured
//!   completion rate, and how long the harness then took to drain it;
//! - freeze → completed latency (from the stored times, millisecond resolution) p50/p99;
//! - where the CPU went during the load ([`super::cpu`]): milliseconds per frozen call spent by
//!   the server, its SQLite threads, the planners (which run on a tokio runtime of their own,
//!   with two worker threads named `bench-client`, so that their share can be told apart),
//!   the Postgres processes and the rest of the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use sqlx::Connection;

use mira::config::RuntimeConfig;
use mira::server::{Server, Settings};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct InvocationBench {
    /// Concurrent planners, each with its own run.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Seconds of the one-row insert ceiling measured first (0 skips it).
    #[arg(long, default_value_t = 5)]
    pub ceiling_seconds: u64,
    /// A Postgres server URL (a fresh database is created on it and dropped after);
    /// default a temporary SQLite file.
    #[arg(long)]
    pub postgres: Option<String>,
    /// The server's tool executions at once (`--execution-concurrency` of `mira serve`;
    /// default the server's default).
    #[arg(long)]
    pub execution_concurrency: Option<usize>,
    /// The server's tools of one user running at once (`--max-running-per-user` of `mira
    /// serve`; default the server's default, half of the executions; the planners are one user).
    #[arg(long)]
    pub max_running_per_user: Option<usize>,
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: InvocationBench) -> anyhow::Result<()> {
    let root = std::env::temp_dir().join(format!("mira-bench-{}", uuid::Uuid::now_v7().simple()));
    // The data dir beside the workspace, never inside it (the read tools refuse the data dir).
    let (tmp, workspace) = (root.join("data"), root.join("ws"));
    std::fs::create_dir_all(&workspace)?;
    std::fs::create_dir_all(&tmp)?;
    std::fs::write(workspace.join("file.txt"), "line one\nline two\nline three\n")?;
    let db = super::ScratchDb::create(opts.postgres.as_deref(), &tmp, "mira_bench").await?;
    let result = measure(&opts, &tmp, workspace, &db.url).await;
    db.drop(false).await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn measure(
    opts: &InvocationBench,
    tmp: &std::path::Path,
    workspace: std::path::PathBuf,
    url: &str,
) -> anyhow::Result<()> {
    let concurrency = opts.execution_concurrency.unwrap_or(RuntimeConfig::default().execution_concurrency);
    let per_user = RuntimeConfig {
        execution_concurrency: concurrency,
        max_running_per_user: opts.max_running_per_user,
        ..RuntimeConfig::default()
    }
    .running_per_user();
    let settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: tmp.to_path_buf(),
        database_url: url.to_owned(),
        workspace,
        runtime: RuntimeConfig {
            execution_concurrency: concurrency,
            max_running_per_user: opts.max_running_per_user,
            ..RuntimeConfig::default()
        },
        body_limit: 1024 * 1024,
        request_timeout: Duration::from_secs(30),
    };
    let server = Server::start(settings).await?;
    let backend = server.app.store.backend().name();
    let ceiling = if opts.ceiling_seconds > 0 {
        Some(insert_ceiling(url, opts.clients, Duration::from_secs(opts.ceiling_seconds)).await?)
    } else {
        None
    };
    let token = std::fs::read_to_string(tmp.join("admin.token"))?.trim().to_owned();
    let base = format!("http://{}", server.addr);
    let client = mira::net::client_builder().pool_max_idle_per_host(opts.clients).build()?;
    let api = Arc::new(Api { client, base, token });
    let mut planners = Vec::with_capacity(opts.clients);
    for n in 0..opts.clients {
        let run = api.post("/v1/runs", &json!({"title": format!("bench planner {n}")})).await?;
        let run_id = run["id"].as_str().context("run id")?.to_owned();
        let turn = api.post(&format!("/v1/runs/{run_id}/turns"), &json!({"task": "read a file"})).await?;
        let turn_id = turn["turn_id"].as_str().context("turn id")?.to_owned();
        planners.push((run_id, turn_id));
    }

    // The planners run on a runtime of their own, so that their CPU time can be told apart from
    // the server's, with their own HTTP client (a client's connections belong to the runtime
    // that opened them).
    let load_api = Arc::new(Api {
        client: mira::net::client_builder().pool_max_idle_per_host(opts.clients).build()?,
        base: api.base.clone(),
        token: api.token.clone(),
    });
    // Nothing may return early (`?`) between here and its shutdown: dropping a runtime inside
    // another one panics.
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(super::cpu::CLIENT_THREAD)
        .enable_all()
        .build()?;
    let groups_before = server.app.store.group_commit_stats();
    let writer_before = server.app.store.writer_slot_stats();
    let claims_before = server.app.harness.claim_stats();
    let load_before = load_average();
    let cpu_before = super::cpu::CpuSample::now();
    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (client_no, (run_id, turn_id)) in planners.into_iter().enumerate() {
        let api = load_api.clone();
        tasks.push(clients.spawn(async move {
            let path = format!("/v1/runs/{run_id}/invocations");
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
    let mut results = Vec::with_capacity(tasks.len());
    for t in tasks {
        results.push(t.await);
    }
    let cpu = super::cpu::CpuSample::now().since(&cpu_before);
    // A runtime cannot be dropped inside another one's context.
    drop(load_api);
    clients.shutdown_background();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for r in results {
        let (l, e) = r?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let groups = group_delta(groups_before, server.app.store.group_commit_stats());
    let writer = writer_before.zip(server.app.store.writer_slot_stats()).map(|(b, a)| writer_delta(b, a));
    let claims = server.app.harness.claim_stats();
    let load_after = load_average();
    let mut conn = sqlx::AnyConnection::connect(url).await?;
    let at_end = counts(&mut conn).await?;
    let drain_started = Instant::now();
    let mut drained = at_end;
    while drained.backlog > 0 && drain_started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drained = counts(&mut conn).await?;
    }
    let drain = drain_started.elapsed().as_secs_f64();
    let e2e = end_to_end(&mut conn).await?;
    let settings = if url.starts_with("postgres") { postgres_settings(&mut conn).await? } else { String::new() };
    conn.close().await?;
    server.shutdown().await;

    let p = super::percentiles(&latencies);
    let e = super::percentiles(&e2e);
    let frozen_rate = latencies.len() as f64 / elapsed;
    let completed_rate = at_end.completed as f64 / elapsed;
    println!(
        "backend={backend} clients={} runs={} seconds={elapsed:.1} execution_concurrency={} max_running_per_user={} (read_open, one run per planner)",
        opts.clients, opts.clients, concurrency, per_user
    );
    if !settings.is_empty() {
        println!("  postgres  {settings}");
    }
    match ceiling {
        Some(c) => println!(
            "  ceiling   one-row insert, same database, {} clients: {:>8.0}/s  mean {:.2} ms",
            opts.clients, c.rate, c.mean_ms
        ),
        None => println!("  ceiling   skipped (--ceiling-seconds 0)"),
    }
    println!(
        "  frozen    {:>8.0}/s  ({} accepted, {errors} errors)  request p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        frozen_rate,
        latencies.len(),
        p.p50,
        p.p99,
        p.max
    );
    println!(
        "  completed {:>8.0}/s  ({} completed with evidence by the end of the load; {} failed)",
        completed_rate, at_end.completed, at_end.failed
    );
    let backlog_secs = if completed_rate > 0.0 { at_end.backlog as f64 / completed_rate } else { f64::INFINITY };
    println!(
        "  backlog   {} queued or running at the end = {backlog_secs:.2} s of work; drained to {} in {drain:.2} s",
        at_end.backlog, drained.backlog
    );
    println!(
        "  freeze -> completed (stored times, ms resolution): p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms",
        e.p50, e.p99, e.max
    );
    let n = groups.transactions.max(1) as f64;
    let ms = |us: u64| us as f64 / 1000.0 / n;
    let statements = groups.total_us.saturating_sub(groups.begin_us + groups.append_us + groups.commit_us);
    println!(
        "  group commits {} ({:.0}/s), {:.1} freezes and results each; per transaction {:.2} ms = begin {:.2} + writes {:.2} + events append (run counters) {:.2} + commit {:.2}",
        groups.transactions,
        groups.transactions as f64 / elapsed,
        groups.items as f64 / n,
        ms(groups.total_us),
        ms(groups.begin_us),
        ms(statements),
        ms(groups.append_us),
        ms(groups.commit_us)
    );
    println!(
        "  claim loop: {} freezes found no free execution slot; the loop claimed {} invocations in {} transactions",
        claims.no_slot.saturating_sub(claims_before.no_slot),
        claims.invocations.saturating_sub(claims_before.invocations),
        claims.transactions.saturating_sub(claims_before.transactions),
    );
    if let Some(w) = writer {
        // Everything but the group commits: claim transactions, checkpoints, turns…
        let others = w.holds.saturating_sub(groups.transactions);
        let group_held_us = groups.total_us.saturating_sub(groups.slot_wait_us);
        println!(
            "  writer slot held {:.0}% of the load ({} holds: {} group commits, {others} others holding it {:.1}% of the load, of which {} log-limiting checkpoints {:.1}%); group commits waited {:.2} ms each for it, then {:.2} ms for the connection (and BEGIN IMMEDIATE when sent apart)",
            w.held_us as f64 / 1e4 / elapsed,
            w.holds,
            groups.transactions,
            w.held_us.saturating_sub(group_held_us) as f64 / 1e4 / elapsed,
            w.checkpoints,
            w.checkpoint_held_us as f64 / 1e4 / elapsed,
            ms(groups.slot_wait_us),
            ms(groups.begin_us.saturating_sub(groups.slot_wait_us)),
        );
    }
    println!("  load average (1 min) {load_before} at the start of the load, {load_after} at its end");
    println!("  {}", cpu.describe(latencies.len() as u64, "frozen call"));
    Ok(())
}

/// The group commits made between two readings.
fn group_delta(
    before: mira::store::GroupCommitStats,
    after: mira::store::GroupCommitStats,
) -> mira::store::GroupCommitStats {
    mira::store::GroupCommitStats {
        transactions: after.transactions.saturating_sub(before.transactions),
        items: after.items.saturating_sub(before.items),
        total_us: after.total_us.saturating_sub(before.total_us),
        begin_us: after.begin_us.saturating_sub(before.begin_us),
        slot_wait_us: after.slot_wait_us.saturating_sub(before.slot_wait_us),
        append_us: after.append_us.saturating_sub(before.append_us),
        commit_us: after.commit_us.saturating_sub(before.commit_us),
    }
}

/// The writer slot's use between two readings.
fn writer_delta(
    before: mira::store::WriterSlotStats,
    after: mira::store::WriterSlotStats,
) -> mira::store::WriterSlotStats {
    mira::store::WriterSlotStats {
        holds: after.holds.saturating_sub(before.holds),
        held_us: after.held_us.saturating_sub(before.held_us),
        checkpoints: after.checkpoints.saturating_sub(before.checkpoints),
        checkpoint_held_us: after.checkpoint_held_us.saturating_sub(before.checkpoint_held_us),
    }
}

/// The machine's one-minute load average (`/proc/loadavg`), `?` where it cannot be read.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
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

#[derive(Debug, Clone, Copy)]
struct Counts {
    completed: i64,
    failed: i64,
    backlog: i64,
}

async fn counts(conn: &mut sqlx::AnyConnection) -> anyhow::Result<Counts> {
    let completed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM invocations i WHERE i.status = 'completed'
           AND EXISTS (SELECT 1 FROM evidence e WHERE e.invocation_id = i.id)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let failed: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM invocations WHERE status IN ('failed', 'interrupted', 'cancelled')")
            .fetch_one(&mut *conn)
            .await?;
    let backlog: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM invocations WHERE status IN ('queued', 'running')")
        .fetch_one(&mut *conn)
        .await?;
    Ok(Counts { completed, failed, backlog })
}

/// The Postgres server settings that change the figures most, as `name=value` pairs: without
/// autovacuum, dead index entries accumulate and cached plans keep the statistics of an empty
/// database.
async fn postgres_settings(conn: &mut sqlx::AnyConnection) -> anyhow::Result<String> {
    let mut out = Vec::new();
    for name in ["autovacuum", "synchronous_commit", "fsync", "shared_buffers"] {
        let value: String =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}"))).fetch_one(&mut *conn).await?;
        out.push(format!("{name}={value}"));
    }
    Ok(out.join(" "))
}

/// Freeze → completed durations from the stored times.
async fn end_to_end(conn: &mut sqlx::AnyConnection) -> anyhow::Result<Vec<Duration>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT created_at, finished_at FROM invocations WHERE status = 'completed'")
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .iter()
        .filter_map(|(c, f)| {
            let c = chrono::DateTime::parse_from_rfc3339(c).ok()?;
            let f = chrono::DateTime::parse_from_rfc3339(f).ok()?;
            (f - c).to_std().ok()
        })
        .collect())
}

/// The ceiling's figures.
struct Ceiling {
    rate: f64,
    mean_ms: f64,
}

/// pgbench-style: `clients` tasks each insert one row per autocommit statement for
/// `duration` into a scratch table of the same database (dropped after). On SQLite the
/// clients share one connection, as SQLite has one writer (several would only add busy
/// waits).
async fn insert_ceiling(url: &str, clients: usize, duration: Duration) -> anyhow::Result<Ceiling> {
    let sqlite = url.starts_with("sqlite:");
    let connections = if sqlite { 1 } else { clients.max(1) };
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(u32::try_from(connections).unwrap_or(u32::MAX))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if sqlite {
                    // As the store's own connections.
                    sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    sqlx::query("CREATE TABLE mira_bench_ceiling (id TEXT PRIMARY KEY, v TEXT NOT NULL)").execute(&pool).await?;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let (mut n, mut busy) = (0u64, Duration::ZERO);
            while Instant::now() < deadline {
                let t0 = Instant::now();
                sqlx::query("INSERT INTO mira_bench_ceiling (id, v) VALUES ($1, $2)")
                    .bind(format!("{c}-{n}"))
                    .bind("x")
                    .execute(&pool)
                    .await?;
                busy += t0.elapsed();
                n += 1;
            }
            anyhow::Ok((n, busy))
        }));
    }
    let (mut total, mut busy) = (0u64, Duration::ZERO);
    for t in tasks {
        let (n, b) = t.await??;
        total += n;
        busy += b;
    }
    let elapsed = started.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE mira_bench_ceiling").execute(&pool).await?;
    pool.close().await;
    Ok(Ceiling { rate: total as f64 / elapsed, mean_ms: busy.as_secs_f64() * 1000.0 / total.max(1) as f64 })
}
