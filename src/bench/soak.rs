//! `mira bench soak`: memory and disk under sustained load.
//!
//! Starts a server in-process on SQLite in a temporary directory (or a fresh database on a
//! given Postgres server), then `clients` planners (each with its own run) freeze `read_open`
//! and `grep` calls in turn for `minutes`. Every `every` seconds it prints the calls frozen and
//! completed so far, this process's RSS (`VmRSS` of /proc/self/status: server and clients,
//! which hold nothing per call; with its anonymous and file-backed parts), the data folder's size and disk bytes per call (the SQLite
//! file with its WAL, or the Postgres database's `pg_database_size`), glibc malloc's bytes in
//! use and free inside its arenas (a leak grows the first, fragmentation the second), and the
//! RSS growth per call since the first sample after `warmup` seconds; at the end a summary
//! line (RSS at start, after warm-up, at the end, its largest growth after warm-up, calls,
//! disk per call).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::Api;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakBench {
    /// Concurrent planners, each with its own run.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Minutes of load (fractions allowed).
    #[arg(long, default_value_t = 1.0)]
    pub minutes: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10)]
    pub every: u64,
    /// Seconds of load before the reference sample ("after warm-up") that growth is
    /// measured from.
    #[arg(long, default_value_t = 60)]
    pub warmup: u64,
    /// A Postgres server URL (a fresh database is created on it and dropped after);
    /// default a temporary SQLite file.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: SoakBench) -> anyhow::Result<()> {
    let root = std::env::temp_dir().join(format!("mira-bench-soak-{}", uuid::Uuid::now_v7().simple()));
    let (data, workspace) = (root.join("data"), root.join("ws"));
    std::fs::create_dir_all(&workspace)?;
    std::fs::create_dir_all(&data)?;
    for i in 0..20 {
        let text: String = (0..200).map(|l| format!("line {l} of file {i}: some text to search\n")).collect();
        std::fs::write(workspace.join(format!("file{i}.txt")), text)?;
    }
    let db = super::ScratchDb::create(opts.postgres.as_deref(), &data, "mira_soak").await?;
    let result = soak(&opts, &data, workspace, &db.url).await;
    db.drop(false).await?;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn soak(
    opts: &SoakBench,
    data: &std::path::Path,
    workspace: std::path::PathBuf,
    url: &str,
) -> anyhow::Result<()> {
    let settings = mira::server::Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: data.to_path_buf(),
        database_url: url.to_owned(),
        workspace,
        runtime: mira::config::RuntimeConfig::default(),
        body_limit: 1024 * 1024,
        request_timeout: Duration::from_secs(30),
    };
    let server = mira::server::Server::start(settings).await?;
    let token = std::fs::read_to_string(data.join("admin.token"))?.trim().to_owned();
    let api = Arc::new(Api::new(server.addr, token)?);
    let mut planners = Vec::new();
    for n in 0..opts.clients {
        let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": format!("soak {n}")}))).await?;
        let run_id = run["id"].as_str().context("run id")?.to_owned();
        let turn = api
            .send(reqwest::Method::POST, &format!("/v1/runs/{run_id}/turns"), Some(json!({"task": "read and grep"})))
            .await?;
        planners.push((run_id, turn["turn_id"].as_str().context("turn id")?.to_owned()));
    }
    let frozen = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(opts.minutes * 60.0);
    let mut tasks = Vec::new();
    for (c, (run_id, turn_id)) in planners.into_iter().enumerate() {
        let (api, frozen, errors) = (api.clone(), frozen.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let path = format!("/v1/runs/{run_id}/invocations");
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let (tool, input) = if n.is_multiple_of(2) {
                    ("read_open", json!({"path": format!("file{}.txt", n % 20), "start_line": 1, "end_line": 20}))
                } else {
                    ("grep", json!({"pattern": format!("line {} of", n % 200), "limit": 10}))
                };
                let body =
                    json!({"turn_id": turn_id, "tool_id": tool, "tool_call_id": format!("s{c}-{n}"), "input": input});
                match api.send(reqwest::Method::POST, &path, Some(body)).await {
                    Ok(_) => frozen.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let started = Instant::now();
    let rss_start = rss_kb();
    let mut first: Option<(u64, u64)> = None;
    let mut rss_max = rss_start;
    let (mut calls_end, mut rss_end, mut disk_end);
    println!(
        "backend={} clients={} minutes={} warmup_s={} rss_start_kb={rss_start}",
        server.app.store.backend().name(),
        opts.clients,
        opts.minutes,
        opts.warmup
    );
    println!(
        "{:>7} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>13}",
        "t_s",
        "frozen",
        "completed",
        "rss_kb",
        "anon_kb",
        "file_kb",
        "heap_kb",
        "free_kb",
        "disk_kb",
        "disk_B/call",
        "rss_B/call*"
    );
    loop {
        let sleep = Duration::from_secs(opts.every.max(1));
        let done = tokio::time::timeout(sleep, async {
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
        .is_ok();
        let calls = frozen.load(Ordering::Relaxed);
        let completed =
            server.app.store.count_invocations_with_status(mira::state::InvocationStatus::Completed).await?;
        let rss = rss_kb();
        let disk = disk_bytes(&server.app.store, data).await?;
        if started.elapsed() >= Duration::from_secs(opts.warmup) || done {
            first.get_or_insert((calls, rss));
        }
        let per_call_rss = match first {
            Some((c0, r0)) if calls > c0 => (rss.saturating_sub(r0) as f64 * 1024.0) / (calls - c0) as f64,
            _ => 0.0,
        };
        if first.is_some() {
            rss_max = rss_max.max(rss);
        }
        (calls_end, rss_end, disk_end) = (calls, rss, disk);
        let (heap, free) = malloc_kb();
        println!(
            "{:>7.0} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11.0} {:>13.0}",
            started.elapsed().as_secs_f64(),
            calls,
            completed,
            rss,
            status_kb("RssAnon:"),
            status_kb("RssFile:"),
            heap,
            free,
            disk / 1024,
            disk as f64 / calls.max(1) as f64,
            per_call_rss
        );
        if done {
            break;
        }
    }
    for t in tasks {
        t.await?;
    }
    let (c0, r0) = first.unwrap_or((0, rss_start));
    println!(
        "summary: calls={calls_end} errors={} rss_start_kb={rss_start} rss_after_warmup_kb={r0} (at {c0} calls) \
         rss_end_kb={rss_end} rss_max_after_warmup_kb={rss_max} growth_after_warmup_kb={} disk_kb={} disk_B/call={:.0}",
        errors.load(Ordering::Relaxed),
        rss_max.saturating_sub(r0),
        disk_end / 1024,
        disk_end as f64 / calls_end.max(1) as f64,
    );
    println!(
        "(heap_kb/free_kb: glibc malloc's bytes in use and free inside its arenas (mallinfo2); \
         * RSS growth per call since the warm-up sample; disk per call includes the fixed schema)"
    );
    server.shutdown().await;
    Ok(())
}

/// A field of /proc/self/status in kB (`VmRSS:`, `RssAnon:`, `RssFile:`).
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// glibc malloc's bytes in use (`uordblks` + `hblkhd`, mmapped blocks included) and free
/// bytes kept inside its arenas (`fordblks`), in kB: a leak grows the first, fragmentation
/// the second. Zeros where the allocator is not glibc's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn malloc_kb() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads glibc's arena statistics (under their locks); no
    // preconditions.
    let m = unsafe { libc::mallinfo2() };
    (((m.uordblks + m.hblkhd) / 1024) as u64, (m.fordblks / 1024) as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn malloc_kb() -> (u64, u64) {
    (0, 0)
}

/// VmRSS of this process, kB.
fn rss_kb() -> u64 {
    status_kb("VmRSS:")
}

/// Bytes the store uses: the data folder (SQLite file, WAL, evidence files) plus, on
/// Postgres, the database's size.
async fn disk_bytes(store: &mira::store::Store, data: &std::path::Path) -> anyhow::Result<u64> {
    fn walk(p: &std::path::Path) -> u64 {
        let Ok(dir) = std::fs::read_dir(p) else { return 0 };
        dir.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    Ok(walk(data) + store.database_size().await?)
}
