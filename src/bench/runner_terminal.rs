//! The terminal part of `mira bench runner`: terminal throughput through a device's `mira
//! runner` against the host's PTY, side by side in one run.
//!
//! [`terminal_vs_host`]: in each of two runs ([`super::runner::RunnerSetup`]) — one bound to
//! a device whose real runner process is connected on loopback, one on the server host — a
//! session of `sh -c CMD` (default `head -c 20M /dev/zero | base64`) is started through the
//! whole chain (freeze, grant, execute) and one SSE client reads its stream from offset 0
//! until `exit`. Reported per run: output bytes / seconds from the freeze to the `exit`
//! event, and the device/host ratio. On the device the bytes go PTY → the runner's ring →
//! `POST /v1/runner/terminal/output` (256 KiB chunks) → the store → SSE; on the host PTY →
//! ring → store → SSE.

use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::json;

use super::Api;

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
