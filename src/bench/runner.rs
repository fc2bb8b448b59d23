//! `mira bench runner`: the cost of running a call on a device through `mira runner`.
//!
//! Starts a server in-process (SQLite in a temporary directory), registers a device, enrolls
//! a real runner process for it (`<this binary> runner enroll`, then `<this binary> runner`
//! on loopback) and makes two runs with the same file: one bound to the device (a workspace
//! folder the runner was given), one on the server host (the default workspace).
//!
//! [`read_open_vs_host`]: `calls` sequential `read_open` calls in each run, each timed as the
//! Planner sees it — the freeze (`POST /v1/runs/{run}/invocations`; on the device run its
//! canonicalisation is a job on the device) until the answer of
//! `GET /v1/invocations/{id}?wait_ms=30000` says `completed` (the execution: a second job on
//! the device). Printed side by side: p50/p99/max per run and the device/host ratio. Also the
//! runner's resident memory (`VmRSS` of `/proc/<pid>/status`): idle after it connected, and
//! the highest of the samples taken every 20 ms during its calls.
//!
//! Then [`super::runner_terminal::terminal_vs_host`]: terminal throughput in both runs.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::{BenchServer, percentiles};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct RunnerBench {
    /// Sequential `read_open` calls per run (device and host).
    #[arg(long, default_value_t = 1000)]
    pub calls: usize,
    /// Size of the file read, in KiB.
    #[arg(long, default_value_t = 4)]
    pub file_kib: usize,
    /// Command whose output floods a terminal session in each run (by `sh -c`;
    /// [`super::runner_terminal`]); empty skips the terminal figure.
    #[arg(long, default_value = "head -c 20M /dev/zero | base64")]
    pub terminal_command: String,
}

/// A server with an enrolled `mira runner` process on loopback, a run bound to its device
/// and a run on the server host, both with the same file `bench.txt`.
pub struct RunnerSetup {
    /// The server (admin client).
    pub server: BenchServer,
    /// The runner process.
    pub runner: std::process::Child,
    /// The device.
    pub device_id: String,
    /// The run bound to the device, and a turn in it.
    pub device_run: (String, String),
    /// The run on the server host, and a turn in it.
    pub host_run: (String, String),
}

impl RunnerSetup {
    /// Starts everything; `file` is the content of `bench.txt` in both workspaces.
    pub async fn start(file: &str) -> anyhow::Result<Self> {
        let server = BenchServer::start("runner").await?;
        match Self::attach(server, file).await {
            Ok(s) => Ok(s),
            Err((server, e)) => {
                server.stop().await;
                Err(e)
            }
        }
    }

    async fn attach(server: BenchServer, file: &str) -> Result<Self, (BenchServer, anyhow::Error)> {
        let mut runner = None;
        let result = Self::attach_inner(&server, file, &mut runner).await;
        match result {
            Ok((device_id, device_run, host_run)) => match runner {
                Some(runner) => Ok(Self { server, runner, device_id, device_run, host_run }),
                None => Err((server, anyhow::anyhow!("the runner did not start"))),
            },
            Err(e) => {
                if let Some(mut r) = runner {
                    let _ = r.kill();
                    let _ = r.wait();
                }
                Err((server, e))
            }
        }
    }

    async fn attach_inner(
        server: &BenchServer,
        file: &str,
        runner: &mut Option<std::process::Child>,
    ) -> anyhow::Result<(String, (String, String), (String, String))> {
        let api = &server.api;
        let exe = std::env::current_exe().context("this binary's path")?;
        let device_ws = server.dir.join("device-ws");
        let state = server.dir.join("runner-state");
        std::fs::create_dir_all(&device_ws)?;
        let device_ws = std::fs::canonicalize(&device_ws)?;
        std::fs::write(device_ws.join("bench.txt"), file)?;
        std::fs::write(server.dir.join("ws").join("bench.txt"), file)?;
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
        let device_run = run_and_turn(api, Some(&ws["id"])).await?;
        let host_run = run_and_turn(api, None).await?;
        Ok((device_id, device_run, host_run))
    }

    /// The runner's resident memory now (`VmRSS`), in KiB.
    pub fn runner_rss_kib(&self) -> Option<u64> {
        rss_kib(self.runner.id())
    }

    /// Stops the runner and the server.
    pub async fn stop(mut self) {
        let _ = self.runner.kill();
        let _ = self.runner.wait();
        self.server.stop().await;
    }
}

async fn run_and_turn(api: &super::Api, workspace: Option<&Value>) -> anyhow::Result<(String, String)> {
    let body = match workspace {
        Some(ws) => json!({"workspace_id": ws}),
        None => json!({"title": "host"}),
    };
    let run = api.send(reqwest::Method::POST, "/v1/runs", Some(body)).await?;
    let run = run["id"].as_str().context("no run id")?.to_owned();
    let turn = api
        .send(reqwest::Method::POST, &format!("/v1/runs/{run}/turns"), Some(json!({"task": "read the bench file"})))
        .await?;
    Ok((run, turn["turn_id"].as_str().context("no turn id")?.to_owned()))
}

/// `VmRSS` of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `calls` sequential `read_open` calls of `bench.txt` in `run`: each call's latency, freeze
/// to `completed`.
async fn read_calls(
    api: &super::Api,
    run: &(String, String),
    tag: &str,
    calls: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        let inv = api
            .send(
                reqwest::Method::POST,
                &format!("/v1/runs/{}/invocations", run.0),
                Some(json!({"turn_id": run.1, "tool_id": "read_open", "tool_call_id": format!("{tag}-{i}"),
                            "input": {"path": "bench.txt"}})),
            )
            .await?;
        let id = inv["invocation_id"].as_str().context("no invocation id")?;
        loop {
            let v = api.send(reqwest::Method::GET, &format!("/v1/invocations/{id}?wait_ms=30000"), None).await?;
            match v["status"].as_str() {
                Some("completed") => break,
                Some("queued" | "running") => continue,
                other => bail!("read_open {tag}-{i} ended {other:?}: {v}"),
            }
        }
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// `read_open` through the runner vs on the host, and the runner's RSS (see the module docs).
pub async fn read_open_vs_host(setup: &RunnerSetup, calls: usize) -> anyhow::Result<()> {
    let api = &setup.server.api;
    // Warm both paths (connections, caches) before timing.
    read_calls(api, &setup.device_run, "warm-device", 20).await?;
    read_calls(api, &setup.host_run, "warm-host", 20).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = setup.runner_rss_kib();
    let pid = setup.runner.id();
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return peak,
                    _ = tick.tick() => peak = peak.max(rss_kib(pid).unwrap_or(0)),
                }
            }
        })
    };
    let device = read_calls(api, &setup.device_run, "device", calls).await;
    stop.cancel();
    let peak = sampler.await.unwrap_or(0);
    let device = percentiles(&device?);
    let host = percentiles(&read_calls(api, &setup.host_run, "host", calls).await?);
    let ratio = |d: f64, h: f64| if h > 0.0 { format!("{:.2}x", d / h) } else { "-".to_owned() };
    println!("read_open, {calls} sequential calls each (freeze → completed, ms):");
    println!("{:>8} {:>10} {:>10} {:>8}", "", "runner", "host", "ratio");
    println!("{:>8} {:>10.2} {:>10.2} {:>8}", "p50", device.p50, host.p50, ratio(device.p50, host.p50));
    println!("{:>8} {:>10.2} {:>10.2} {:>8}", "p99", device.p99, host.p99, ratio(device.p99, host.p99));
    println!("{:>8} {:>10.2} {:>10.2} {:>8}", "max", device.max, host.max, ratio(device.max, host.max));
    let mib = |k: Option<u64>| k.map_or("?".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
    println!("runner RSS: idle {}, under the read load (peak of 20 ms samples) {}", mib(idle), mib(Some(peak)));
    Ok(())
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: RunnerBench) -> anyhow::Result<()> {
    let line = "the quick brown fox jumps over the lazy dog 0123456789\n";
    let file = line.repeat((opts.file_kib * 1024).div_ceil(line.len()).max(1));
    let setup = RunnerSetup::start(&file).await?;
    println!(
        "mira bench runner: device {} (runner pid {}), file {} KiB",
        setup.device_id,
        setup.runner.id(),
        opts.file_kib
    );
    let mut result = read_open_vs_host(&setup, opts.calls).await;
    if result.is_ok() && !opts.terminal_command.is_empty() {
        let (api, device, host) = (&setup.server.api, &setup.device_run.0, &setup.host_run.0);
        result = super::runner_terminal::terminal_vs_host(api, device, host, &opts.terminal_command).await;
    }
    setup.stop().await;
    result
}
