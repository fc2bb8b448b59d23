//! `mira bench terminal`: PTY → SSE throughput, keystroke echo latency and server memory,
//! measured against the same command through a bare PTY and through a plain pipe.
//!
//! 1. Throughput: `CMD` (default `head -c 500M /dev/zero | base64`) runs in a session started
//!    through the whole chain (freeze, grant, execute); one SSE client reads
//!    `/v1/terminal-sessions/{id}/stream` from offset 0 until `exit`. Reported: output bytes /
//!    seconds from the grant to the `exit` event, bytes the client received (the rest came as
//!    `gap` events, when the client fell further behind than the retention cap), and this
//!    process's RSS peak over its RSS before. Side by side, in the same run: the same command
//!    under `script -qfc CMD /dev/null > /dev/null` (a bare PTY, no server) and through a plain
//!    pipe read to the end, with the ratios. Every byte goes through the store (output leaves
//!    the ring only once stored), so the flood also shows whether storing it starves other
//!    writers: unrelated store writes (`POST /v1/runs`, every 50 ms) are timed while the flood
//!    runs, against the same writes timed just before it.
//! 2. Echo latency: a `cat` session; `keys` times a line is written to the PTY and the time to
//!    its echo on the SSE stream is taken — once through the host directly (the runtime's own
//!    path: PTY → ring → SSE) and `governed_keys` times as an approved `input` invocation
//!    (grant → byte on the stream).
//! 3. Start latency with and without the sandbox, side by side: `starts` sessions of `true`
//!    started through the PTY host (`TerminalHost::start`: PTY, cgroup, fork, sandbox setup,
//!    exec, store row), on three servers in the same run — `--sandbox off`, the sandbox with
//!    the network open, and the sandbox with `--sandbox-network deny-services` (Landlock's
//!    TCP rules are an allow-list, so denying two ports costs 65,534 rules per session
//!    domain). Also the kernel's slab memory (`/proc/meminfo` `Slab`) added by 20 live
//!    sessions of each.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Api, BenchServer};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct TerminalBench {
    /// Command producing the flood (run by `sh -c`).
    #[arg(long, default_value = "head -c 500M /dev/zero | base64")]
    pub command: String,
    /// Lines typed for the direct echo latency.
    #[arg(long, default_value_t = 500)]
    pub keys: usize,
    /// Lines typed as approved `input` invocations.
    #[arg(long, default_value_t = 50)]
    pub governed_keys: usize,
    /// Sessions started per sandbox configuration for the start latency.
    #[arg(long, default_value_t = 100)]
    pub starts: usize,
}

impl Api {
    /// Freezes a terminal_session call and returns the grant request (not yet sent).
    pub(super) async fn freeze(
        &self,
        run: &str,
        turn: &str,
        call: &str,
        input: Value,
    ) -> anyhow::Result<(String, Value)> {
        let inv = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/runs/{run}/invocations"),
                Some(json!({"turn_id": turn, "tool_id": "terminal_session", "tool_call_id": call, "input": input})),
            )
            .await?;
        let approval = inv["approval_id"].as_str().context("no approval")?.to_owned();
        let inv_id = inv["invocation_id"].as_str().context("no invocation id")?.to_owned();
        self.send(
            reqwest::Method::POST,
            &format!("/v1/approvals/{approval}/grant"),
            Some(json!({"tool_id": inv["tool_id"], "tool_call_id": inv["tool_call_id"], "input_hash": inv["input_hash"]})),
        )
        .await?;
        Ok((inv_id, inv))
    }

    pub(super) async fn result(&self, inv: &str) -> anyhow::Result<Value> {
        for _ in 0..6000 {
            let v = self.send(reqwest::Method::GET, &format!("/v1/invocations/{inv}"), None).await?;
            if !matches!(v["status"].as_str(), Some("queued" | "running" | "awaiting_approval")) {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("invocation {inv} did not finish")
    }

    pub(super) async fn stream(&self, session: &str) -> anyhow::Result<SseReader> {
        let resp = self
            .client
            .get(format!("{}/v1/terminal-sessions/{session}/stream?offset=0", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        Ok(SseReader { stream: resp.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed(), buf: Vec::new() })
    }
}

/// A minimal SSE reader: `(event, data)` pairs.
pub(super) struct SseReader {
    stream: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl SseReader {
    pub(super) async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&block);
                let (mut event, mut data) = (String::new(), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if event.is_empty() {
                    continue;
                }
                return Some((event, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")).map(|v| v.trim().trim_end_matches("kB").trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: TerminalBench) -> anyhow::Result<()> {
    let bench = BenchServer::start("terminal").await?;
    let (server, api) = (&bench.server, &bench.api);
    let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": "bench"}))).await?;
    let run = run["id"].as_str().context("run id")?.to_owned();
    let turn =
        api.send(reqwest::Method::POST, &format!("/v1/runs/{run}/turns"), Some(json!({"task": "terminal"}))).await?;
    let turn = turn["turn_id"].as_str().context("turn id")?.to_owned();

    // Reference for the store writes during the flood: the same writes with nothing running.
    let mut idle_writes = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": "idle write"}))).await?;
        idle_writes.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // 1. Throughput through the runtime.
    let before = rss_kib();
    let t0 = Instant::now();
    let (inv, _) = api
        .freeze(
            &run,
            &turn,
            "flood",
            json!({"action": "start", "command": "sh", "args": ["-c", opts.command], "settle_ms": 0}),
        )
        .await?;
    let started = api.result(&inv).await?;
    let session = started["result"]["output"]["session_id"].as_str().context("session id")?.to_owned();
    let mut sse = api.stream(&session).await?;
    let (mut received, mut gaps, mut total) = (0u64, 0u64, 0u64);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let stop_writes = tokio_util::sync::CancellationToken::new();
    let writer = {
        let api = Api { client: api.client.clone(), base: api.base.clone(), token: api.token.clone() };
        let stop = stop_writes.clone();
        tokio::spawn(async move {
            let (mut times, mut failed) = (Vec::new(), 0usize);
            while !stop.is_cancelled() {
                let t = Instant::now();
                match api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": "write during flood"}))).await {
                    Ok(_) => times.push(t.elapsed()),
                    Err(_) => failed += 1,
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    () = stop.cancelled() => {}
                }
            }
            (times, failed)
        })
    };
    while let Some((event, data)) = sse.next().await {
        match event.as_str() {
            "output" => received += data["data"].as_str().map_or(0, |s| s.len() as u64),
            "gap" => gaps += data["to"].as_u64().unwrap_or(0) - data["from"].as_u64().unwrap_or(0),
            "exit" => {
                total = data["bytes_out"].as_u64().unwrap_or(0);
                break;
            }
            _ => {}
        }
    }
    let runtime_secs = t0.elapsed().as_secs_f64();
    sampler.abort();
    stop_writes.cancel();
    let (flood_writes, failed_writes) = writer.await.context("the writer task")?;
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let mb = total as f64 / 1e6;

    // The same command through a bare PTY, and through a pipe.
    let t = Instant::now();
    let status = tokio::process::Command::new("script")
        .args(["-qfc", &opts.command, "/dev/null"])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .context("running script(1)")?;
    let pty_secs = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("script(1) failed: {status}");
    }
    let t = Instant::now();
    let mut child =
        tokio::process::Command::new("sh").args(["-c", &opts.command]).stdout(std::process::Stdio::piped()).spawn()?;
    let mut out = child.stdout.take().context("pipe")?;
    let piped = tokio::io::copy(&mut out, &mut tokio::io::sink()).await?;
    child.wait().await?;
    let pipe_secs = t.elapsed().as_secs_f64();

    println!("terminal throughput: `{}`", opts.command);
    println!(
        "  runtime (PTY → ring → SSE, one client): {mb:.0} MB in {runtime_secs:.2} s = {:.1} MB/s; client received {:.0} MB, {:.0} MB as gaps",
        mb / runtime_secs,
        received as f64 / 1e6,
        gaps as f64 / 1e6
    );
    println!("  bare PTY (script -qfc … > /dev/null): {pty_secs:.2} s = {:.1} MB/s", mb / pty_secs);
    println!(
        "  plain pipe: {:.0} MB in {pipe_secs:.2} s = {:.1} MB/s",
        piped as f64 / 1e6,
        piped as f64 / 1e6 / pipe_secs
    );
    println!(
        "  runtime / bare PTY time ratio {:.2}; runtime / pipe time ratio {:.2}",
        runtime_secs / pty_secs,
        runtime_secs / pipe_secs
    );
    println!(
        "  server RSS {} MiB before, peak {} MiB (+{} MiB)",
        before / 1024,
        peak / 1024,
        peak.saturating_sub(before) / 1024
    );
    let (i, f) = (super::percentiles(&idle_writes), super::percentiles(&flood_writes));
    println!(
        "  store writes (POST /v1/runs): idle {} writes p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; during the flood {} writes p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {failed_writes} failed",
        idle_writes.len(),
        i.p50,
        i.p99,
        i.max,
        flood_writes.len(),
        f.p50,
        f.p99,
        f.max
    );

    // 2. Echo latency on `cat`.
    let (inv, _) = api.freeze(&run, &turn, "cat", json!({"action": "start", "command": "cat", "settle_ms": 0})).await?;
    let started = api.result(&inv).await?;
    let session = started["result"]["output"]["session_id"].as_str().context("session id")?.to_owned();
    let row = server.app.store.terminal_session_for_any(&session).await?.context("session row")?;
    let live = server.app.terminal.get(&row.owner_id, &session).context("live session")?;
    let mut sse = api.stream(&session).await?;
    let mut seen = String::new();
    let mut direct = Vec::with_capacity(opts.keys);
    for i in 0..opts.keys {
        let marker = format!("k{i}x");
        let t = Instant::now();
        live.write_input(format!("{marker}\n").into_bytes()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        wait_for(&mut sse, &mut seen, &marker).await?;
        direct.push(t.elapsed());
    }
    let mut governed = Vec::with_capacity(opts.governed_keys);
    for i in 0..opts.governed_keys {
        let marker = format!("g{i}x");
        let t = Instant::now();
        let (inv, _) = api
            .freeze(
                &run,
                &turn,
                &format!("key{i}"),
                json!({"action": "input", "session_id": session, "data": format!("{marker}\n"), "settle_ms": 0}),
            )
            .await?;
        wait_for(&mut sse, &mut seen, &marker).await?;
        governed.push(t.elapsed());
        api.result(&inv).await?;
    }
    let d = super::percentiles(&direct);
    let g = super::percentiles(&governed);
    println!("echo latency on `cat` (write → byte on the SSE stream):");
    println!("  runtime path, {} keys: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", direct.len(), d.p50, d.p99, d.max);
    println!(
        "  governed `input` (freeze + grant → byte on the stream), {} keys: p50 {:.2} ms, p99 {:.2} ms",
        governed.len(),
        g.p50,
        g.p99
    );
    bench.stop().await;
    start_latency(opts.starts).await
}

/// Kernel slab memory in KiB (`/proc/meminfo`).
fn slab_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Section 3 of the module docs.
async fn start_latency(starts: usize) -> anyhow::Result<()> {
    use mira::sandbox::{NetworkMode, SandboxConfig, SandboxMode, SpecRequest};
    use mira::tools::terminal::host::StartSpec;
    let configs = [
        ("no sandbox (--sandbox off)", SandboxConfig { mode: SandboxMode::Off, ..SandboxConfig::default() }),
        ("sandbox, network open", SandboxConfig { network: NetworkMode::Open, ..SandboxConfig::default() }),
        ("sandbox, deny-services", SandboxConfig { network: NetworkMode::DenyServices, ..SandboxConfig::default() }),
    ];
    println!(
        "terminal start latency (`true` through TerminalHost::start: PTY, cgroup, fork, sandbox, exec, store row):"
    );
    let program =
        ["/bin/true", "/usr/bin/true"].into_iter().find(|p| std::path::Path::new(p).exists()).context("no true")?;
    for (label, sandbox) in configs {
        let runtime = mira::config::RuntimeConfig {
            sandbox,
            terminal: mira::tools::terminal::host::TerminalConfig { max_sessions_per_user: 64, ..Default::default() },
            ..mira::config::RuntimeConfig::default()
        };
        let bench = BenchServer::start_with("terminal-start", runtime).await?;
        let app = &bench.server.app;
        let me = bench.api.send(reqwest::Method::GET, "/v1/me", None).await?;
        let owner = me["id"].as_str().context("user id")?.to_owned();
        let ws = std::fs::canonicalize(bench.dir.join("ws"))?;
        let spec = app
            .sandbox
            .spec(&SpecRequest { workspace: Some(&ws), cwd: &ws, is_admin: true, read_only: &[] })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let enforced = spec.enforced;
        let make = |i: usize| StartSpec {
            owner_id: owner.clone(),
            run_id: "run_bench".into(),
            invocation_id: format!("inv_bench_{i}"),
            program: program.into(),
            command: "true".into(),
            args: Vec::new(),
            cwd: ws.to_string_lossy().into_owned(),
            env: serde_json::Map::new(),
            timeout_ms: 60_000,
            cols: 80,
            rows: 24,
            sandbox: spec.clone(),
            hidden: Vec::new(),
            pinned_root: None,
        };
        let start = |i: usize| {
            let (done, rx) = tokio::sync::oneshot::channel::<()>();
            let host = app.terminal.clone();
            let spec = make(i);
            async move {
                let t = Instant::now();
                let s = host.start(spec, tokio_util::sync::CancellationToken::new(), rx).await;
                let took = t.elapsed();
                let _ = done.send(());
                s.map(|s| (s, took)).map_err(|e| anyhow::anyhow!("{e}"))
            }
        };
        // Warm-up (the deny-services network layer is built on first use).
        let (s, warm) = start(usize::MAX).await?;
        let mut exit = s.exit();
        let _ = exit.wait_for(Option::is_some).await;
        let mut times = Vec::with_capacity(starts);
        for i in 0..starts {
            let (s, took) = start(i).await?;
            times.push(took);
            let mut exit = s.exit();
            let _ = tokio::time::timeout(Duration::from_secs(5), exit.wait_for(Option::is_some)).await;
        }
        let p = super::percentiles(&times);
        // Slab held by 20 live sessions (`sleep`), sampled after they started.
        let slab_before = slab_kib();
        let mut live = Vec::new();
        for i in 0..20 {
            let mut spec = make(100_000 + i);
            spec.program = ["/bin/sleep", "/usr/bin/sleep"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .unwrap_or("/bin/sleep")
                .into();
            spec.args = vec!["60".into()];
            let (done, rx) = tokio::sync::oneshot::channel::<()>();
            let s = app
                .terminal
                .start(spec, tokio_util::sync::CancellationToken::new(), rx)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let _ = done.send(());
            live.push(s);
        }
        let slab_delta = slab_kib().saturating_sub(slab_before);
        for s in &live {
            s.end(mira::state::TerminalSessionState::Killed, "bench".into());
        }
        println!(
            "  {label:<28} enforced={enforced:<5} {starts} starts: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (first start {:.1} ms); slab +{} KiB for 20 live sessions",
            p.p50,
            p.p99,
            p.max,
            warm.as_secs_f64() * 1000.0,
            slab_delta
        );
        bench.stop().await;
    }
    Ok(())
}

async fn wait_for(sse: &mut SseReader, seen: &mut String, marker: &str) -> anyhow::Result<()> {
    loop {
        if let Some(at) = seen.find(marker) {
            seen.drain(..at + marker.len());
            return Ok(());
        }
        match tokio::time::timeout(Duration::from_secs(10), sse.next()).await {
            Ok(Some((event, data))) if event == "output" => seen.push_str(data["data"].as_str().unwrap_or("")),
            Ok(Some(_)) => {}
            _ => bail!("{marker} never appeared on the stream"),
        }
    }
}
