//! `mira bench browser`: the managed browser's figures against a page served on loopback —
//! Chromium start to the first snapshot, snapshot and click latency (p50/p99, the click
//! including the freshness check of its snapshot), and memory per user context (PSS of the
//! whole Chromium process tree, from `/proc/<pid>/smaps_rollup`, before and after opening
//! contexts that each load the page); and the network floor's cost: a page load through it, and
//! one GET through a context's proxy beside the same GET sent directly, in the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mira::tools::browser::BrowserSettings;
use mira::tools::browser::manager::{self, BrowserManager};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct BrowserBench {
    /// Chromium binary (default: `$MIRA_WEB_CHROMIUM`, else `chromium` on `PATH`).
    #[arg(long)]
    pub chromium: Option<PathBuf>,
    /// Snapshots and clicks measured.
    #[arg(long, default_value_t = 100)]
    pub iterations: usize,
    /// Users' contexts opened for the memory figure.
    #[arg(long, default_value_t = 4)]
    pub contexts: usize,
}

const PAGE: &str = r#"<!doctype html><title>Bench</title><h1>Bench page</h1>
<p id="n">0</p><button onclick="var p=document.getElementById('n');p.textContent=String(Number(p.textContent)+1)">Count</button>
<ul>"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Proportional set size (KiB) of `pid` and every process below it.
fn tree_pss_kib(root: u32) -> u64 {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // After the parenthesised command: state, then ppid.
            let Some(mut fields) = super::cpu::stat_fields_after_name(&stat) else { continue };
            let ppid = fields.nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            parents.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        })
        .sum()
}

/// The main Chromium process using the profile folder under `data_dir`.
fn browser_pid(data_dir: &std::path::Path) -> Option<u32> {
    let needle = data_dir.join("browser").display().to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains(&format!("--user-data-dir={needle}")) && cmd.contains("--remote-debugging-pipe") {
            return Some(pid);
        }
    }
    None
}

/// One GET of `url` through a context's proxy (the network floor) and directly, alternated,
/// `iterations` times each.
async fn floor_figures(url: &str, iterations: usize) -> anyhow::Result<()> {
    use mira::tools::browser::policy::OriginPolicy;
    use mira::tools::browser::proxy::{ContextProxy, Floor};
    let floor = Floor {
        policy: std::sync::Arc::new(parking_lot::RwLock::new(OriginPolicy {
            allow: Vec::new(),
            rule: mira::net::AddressRule::Any,
            service_ports: Vec::new(),
        })),
        refusals: std::sync::Arc::default(),
        slots: std::sync::Arc::new(tokio::sync::Semaphore::new(mira::tools::browser::proxy::MAX_FLOOR_CONNECTIONS)),
        tunnel_idle: std::time::Duration::from_secs(120),
    };
    let proxy = ContextProxy::start(floor).await?;
    let direct = reqwest::Client::builder().no_proxy().build()?;
    let through = reqwest::Client::builder().proxy(reqwest::Proxy::http(proxy.proxy_server())?).build()?;
    let (mut plain, mut floored) = (Vec::with_capacity(iterations), Vec::with_capacity(iterations));
    for _ in 0..iterations {
        for (client, times) in [(&direct, &mut plain), (&through, &mut floored)] {
            let t = Instant::now();
            client.get(url).send().await?.error_for_status()?.bytes().await?;
            times.push(t.elapsed());
        }
    }
    plain.sort();
    floored.sort();
    println!(
        "GET of the page ({iterations} runs each): direct p50 {:.2} ms, p99 {:.2} ms; through the network floor p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&plain, 0.5)),
        ms(percentile(&plain, 0.99)),
        ms(percentile(&floored, 0.5)),
        ms(percentile(&floored, 0.99))
    );
    Ok(())
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: BrowserBench) -> anyhow::Result<()> {
    let chromium = opts
        .chromium
        .or_else(|| std::env::var_os("MIRA_WEB_CHROMIUM").map(PathBuf::from))
        .or_else(|| manager::find_chromium(None))
        .ok_or_else(|| anyhow::anyhow!("no chromium (--chromium, MIRA_WEB_CHROMIUM or PATH)"))?;
    let app = axum::Router::new().route("/", axum::routing::get(|| async { axum::response::Html(PAGE) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir()?;
    let store = mira::store::Store::connect(
        &format!("sqlite://{}?mode=rwc", dir.path().join("mira.db").display()),
        mira::events::EventBus::new(),
    )
    .await?;
    let settings =
        BrowserSettings { chromium: Some(chromium.clone()), max_contexts: opts.contexts + 1, ..Default::default() };
    let browsers = BrowserManager::new(settings, dir.path(), store, true, std::sync::Arc::new(Vec::<u16>::new));
    let err = |e: mira::registry::ToolError| anyhow::anyhow!("{e}");

    // Start → first snapshot.
    let started = Instant::now();
    let ctx = browsers.context("bench").await.map_err(err)?;
    let launched = started.elapsed();
    let mut tabs = ctx.tabs.lock().await;
    ctx.open_tab(&mut tabs).await.map_err(err)?;
    let tab = tabs.get(None).map_err(err)?;
    manager::navigate(&tab.page, &url).await.map_err(err)?;
    let tab = tabs.get_mut(None).map_err(err)?;
    let snap = manager::take_snapshot(tab, 1500, 256 * 1024).await.map_err(err)?;
    let first = started.elapsed();
    println!("chromium {}", chromium.display());
    println!("start → first snapshot: {:.0} ms (process and context {:.0} ms)", ms(first), ms(launched));
    println!("snapshot: {} nodes, {} references", snap.rendered.nodes, snap.rendered.refs.len());

    let mut snapshots = Vec::with_capacity(opts.iterations);
    let mut clicks = Vec::with_capacity(opts.iterations);
    for _ in 0..opts.iterations {
        let t = Instant::now();
        let tab = tabs.get_mut(None).map_err(err)?;
        let snap = manager::take_snapshot(tab, 1500, 256 * 1024).await.map_err(err)?;
        snapshots.push(t.elapsed());
        let reference = snap
            .rendered
            .refs
            .iter()
            .find(|(_, e)| e.role == "button")
            .map(|(r, _)| r.clone())
            .ok_or_else(|| anyhow::anyhow!("no button in the snapshot"))?;
        let t = Instant::now();
        let (tab, element, _) = manager::resolve(&tabs, &snap.id, &reference, true).await.map_err(err)?;
        manager::click(&tab.page, element.backend_node_id).await.map_err(err)?;
        clicks.push(t.elapsed());
    }
    snapshots.sort();
    clicks.sort();
    println!(
        "snapshot ({} runs): p50 {:.1} ms, p99 {:.1} ms",
        snapshots.len(),
        ms(percentile(&snapshots, 0.5)),
        ms(percentile(&snapshots, 0.99))
    );
    println!(
        "click incl. freshness check and the 150 ms wait for a navigation to start ({} runs): p50 {:.1} ms, p99 {:.1} ms",
        clicks.len(),
        ms(percentile(&clicks, 0.5)),
        ms(percentile(&clicks, 0.99))
    );
    let mut loads = Vec::with_capacity(opts.iterations);
    for _ in 0..opts.iterations {
        let t = Instant::now();
        let tab = tabs.get(None).map_err(err)?;
        manager::navigate(&tab.page, &url).await.map_err(err)?;
        loads.push(t.elapsed());
    }
    loads.sort();
    println!(
        "page load through the network floor ({} runs): p50 {:.1} ms, p99 {:.1} ms",
        loads.len(),
        ms(percentile(&loads, 0.5)),
        ms(percentile(&loads, 0.99))
    );
    drop(tabs);
    floor_figures(&url, opts.iterations).await?;

    // Memory per context.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = browser_pid(dir.path()).ok_or_else(|| anyhow::anyhow!("the chromium process was not found"))?;
    let one = tree_pss_kib(pid);
    for i in 0..opts.contexts {
        let ctx = browsers.context(&format!("user{i}")).await.map_err(err)?;
        let mut tabs = ctx.tabs.lock().await;
        ctx.open_tab(&mut tabs).await.map_err(err)?;
        let tab = tabs.get(None).map_err(err)?;
        manager::navigate(&tab.page, &url).await.map_err(err)?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let more = tree_pss_kib(pid);
    println!(
        "memory (PSS of the process tree): {:.1} MiB with 1 context; {:.1} MiB with {}; {:.1} MiB per added context with one loaded tab",
        one as f64 / 1024.0,
        more as f64 / 1024.0,
        opts.contexts + 1,
        (more.saturating_sub(one)) as f64 / 1024.0 / opts.contexts.max(1) as f64
    );
    browsers.shutdown().await;
    Ok(())
}
