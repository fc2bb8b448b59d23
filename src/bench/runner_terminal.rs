//! `mira bench runner-terminal`: terminal throughput through a device's `mira runner` against
//! the host's PTY, side by side in one run.
//!
//! [`terminal_vs_host`] is the measurement, kept apart from the set-up so that it can join
//! `mira bench runner` (the device's `read_open` figures): in each of two runs — one bound to
//! a device whose real runner process is connected on loopback, one on the server host — a
//! session of `sh -c CMD` (default `head -c 20M /dev/zero | base64`) is started through the
//! whole chain (freeze, grant, execute) and one SSE client reads its stream from offset 0
//! until `exit`. Reported per run: output bytes / seconds from the freeze to the `exit`
//! event, and the device/host ratio. On the device the bytes go PTY → the runner's ring →
//! `POST /v1/runner/terminal/output` (256 KiB chunks) → the store → SSE; on the host PTY →
//! ring → store → SSE.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::{Api, BenchServer};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct RunnerTerminalBench {
    /// Command producing the output (run by `sh -c`).
    #[arg(long, default_value = "head -c 20M /dev/zero | base64")]
    pub command: String,
}

/// One flood through the chain in `run`: `(bytes, seconds)` from the freeze to `exit`.
async fn flood(api: &Api, run: &str, tag: &str, command: &str) -> anyhow::Result<(u64, f64)> {
    let turn = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/runs/{run}/turns"),
            Some(json!({"task": "run commands in a terminal"})),
        )
        .await?;
    let turn = turn["turn_id"].as_str().context("turn id")?.to_owned();
    let t0 = Instant::now();
    let (inv, _) = api
        .freeze(run, &turn, tag, json!({"action": "start", "command": "sh", "args": ["-c", command], "settle_ms": 0}))
        .await?;
    let started = api.result(&inv).await?;
    let session = started["result"]["output"]["session_id"]
        .as_str()
        .with_context(|| format!("the {tag} session did not start: {started}"))?
        .to_owned();
    let mut sse = api.stream(&session).await?;
    while let Some((event, data)) = sse.next().await {
        if event == "exit" {
            return Ok((data["bytes_out"].as_u64().unwrap_or(0), t0.elapsed().as_secs_f64()));
        }
    }
    bail!("the {tag} stream ended without exit")
}

/// Terminal throughput of `sh -c command` in `device_run` (bound to a device with a
/// connected runner) and in `host_run` (on the server host), printed side by side.
pub async fn terminal_vs_host(api: &Api, device_run: &str, host_run: &str, command: &str) -> anyhow::Result<()> {
    let (host_bytes, host_secs) = flood(api, host_run, "host-flood", command).await?;
    let (dev_bytes, dev_secs) = flood(api, device_run, "device-flood", command).await?;
    let rate = |b: u64, s: f64| b as f64 / 1e6 / s;
    println!("terminal throughput: `{command}` (freeze → grant → PTY → SSE `exit`, one client)");
    println!(
        "  host PTY:        {:.1} MB in {host_secs:.2} s = {:.1} MB/s",
        host_bytes as f64 / 1e6,
        rate(host_bytes, host_secs)
    );
    println!(
        "  through runner:  {:.1} MB in {dev_secs:.2} s = {:.1} MB/s",
        dev_bytes as f64 / 1e6,
        rate(dev_bytes, dev_secs)
    );
    println!("  runner / host throughput ratio {:.2}", rate(dev_bytes, dev_secs) / rate(host_bytes, host_secs));
    Ok(())
}

/// Starts a server, enrolls a real runner on loopback, runs [`terminal_vs_host`].
pub async fn run(opts: RunnerTerminalBench) -> anyhow::Result<()> {
    let bench = BenchServer::start("runner-terminal").await?;
    let mut runner = None;
    let result = measure(&bench, &opts, &mut runner).await;
    if let Some(mut r) = runner {
        let _ = r.kill();
        let _ = r.wait();
    }
    bench.stop().await;
    result
}

async fn measure(
    bench: &BenchServer,
    opts: &RunnerTerminalBench,
    runner: &mut Option<std::process::Child>,
) -> anyhow::Result<()> {
    let api = &bench.api;
    let exe = std::env::current_exe().context("this binary's path")?;
    let device_ws = bench.dir.join("device-ws");
    let state = bench.dir.join("runner-state");
    std::fs::create_dir_all(&device_ws)?;
    let device_ws = std::fs::canonicalize(&device_ws)?;
    let d = api.send(reqwest::Method::POST, "/v1/devices", Some(json!({"name": "bench"}))).await?;
    let device_id = d["id"].as_str().context("no device id")?.to_owned();
    let code = d["enrollment"]["code"].as_str().context("no enrollment code")?.to_owned();
    let out = std::process::Command::new(&exe)
        .args(["runner", "enroll", "--server", &api.base, "--code", &code, "--state-dir"])
        .arg(&state)
        .output()?;
    if !out.status.success() {
        bail!("mira runner enroll failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    *runner = Some(
        std::process::Command::new(&exe)
            .args(["runner", "--server", &api.base, "--workspace"])
            .arg(&device_ws)
            .arg("--state-dir")
            .arg(&state)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting mira runner")?,
    );
    let start = Instant::now();
    loop {
        let list = api.send(reqwest::Method::GET, "/v1/devices", None).await?;
        let connected = list["devices"]
            .as_array()
            .is_some_and(|ds| ds.iter().any(|d| d["id"] == device_id.as_str() && d["status"] == "connected"));
        if connected {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            bail!("the runner did not connect within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ws = api
        .send(
            reqwest::Method::POST,
            "/v1/workspaces",
            Some(json!({"name": "device", "path": device_ws, "device_id": device_id})),
        )
        .await?;
    let device_run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"workspace_id": ws["id"]}))).await?;
    let host_run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": "host"}))).await?;
    terminal_vs_host(
        api,
        device_run["id"].as_str().context("no run id")?,
        host_run["id"].as_str().context("no run id")?,
        &opts.command,
    )
    .await
}
