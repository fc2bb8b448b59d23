//! `mira bench expert`: External Expert consult overhead on the scripted a2a-sdk expert
//! (`tests/expert/expert_server.py`, from `scripts/setup-expert.sh`), in one run:
//!
//! 1. direct: `calls` sequential A2A calls with a bare reqwest client (`SendStreamingMessage`,
//!    the SSE read until the final task state) — the floor;
//! 2. runtime client: the same calls through the tool's client as `expert_consult` executes
//!    them (card fetched and hashed, then the message streamed and assembled,
//!    [`mira::tools::expert::a2a`]);
//! 3. full chain: `chain_calls` consultations through the HTTP API (freeze → grant → execute →
//!    `GET /v1/invocations/{id}?wait_ms=…`) in one turn.
//!
//! p50/p99 of each, and the overheads over direct.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::{Value, json};

use super::BenchServer;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct ExpertBench {
    /// Python with a2a-sdk (default `$MIRA_EXPERT_PYTHON`, else ./.cache/expert/venv/bin/python).
    #[arg(long)]
    pub python: Option<String>,
    /// The expert script (default ./tests/expert/expert_server.py).
    #[arg(long)]
    pub script: Option<String>,
    /// Calls for the direct and runtime-client series.
    #[arg(long, default_value_t = 300)]
    pub calls: usize,
    /// Calls through the full HTTP chain.
    #[arg(long, default_value_t = 100)]
    pub chain_calls: usize,
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: ExpertBench) -> anyhow::Result<()> {
    let python = opts
        .python
        .clone()
        .or_else(|| std::env::var("MIRA_EXPERT_PYTHON").ok())
        .unwrap_or_else(|| ".cache/expert/venv/bin/python".into());
    let script = opts.script.clone().unwrap_or_else(|| "tests/expert/expert_server.py".into());
    let state = tempfile::tempdir()?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let _expert = Child(
        std::process::Command::new(&python)
            .arg(&script)
            .args(["--port", &port.to_string(), "--chunk-delay", "0"])
            .arg("--state-dir")
            .arg(state.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {python} {script} (eval scripts/setup-expert.sh)"))?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(30), "the expert did not listen within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let http = mira::net::client_builder().build()?;
    let card_url = reqwest::Url::parse(&format!("{base}/.well-known/agent-card.json"))?;
    let card: Value = http.get(card_url.clone()).send().await?.json().await?;
    let hash = mira::evidence::sha256_hex(mira_core::canonical::to_canonical_string(&card).as_bytes());
    let message = "How should a library crate structure its error types?";

    // 1. Direct.
    let mut direct = Vec::with_capacity(opts.calls);
    for i in 0..opts.calls {
        let t = Instant::now();
        direct_call(&http, &format!("{base}/"), &format!("direct-{i}"), message).await?;
        direct.push(t.elapsed());
    }
    // 2. The runtime's client, as execute uses it.
    let client =
        mira::tools::expert::a2a::Client::new(mira::net::AddressRule::Any, mira::tools::expert::a2a::Auth::None)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut runtime = Vec::with_capacity(opts.calls);
    for i in 0..opts.calls {
        let t = Instant::now();
        let card = client.card(&card_url).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(card.sha256 == hash, "the card changed");
        let msg = json!({"messageId": format!("rt-{i}"), "role": "ROLE_USER", "parts": [{"text": message}]});
        let end = client.send(&card, &msg, &cancel).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(matches!(end, mira::tools::expert::a2a::End::Final(_)), "runtime call: {end:?}");
        runtime.push(t.elapsed());
    }
    // 3. The full chain.
    let bench = BenchServer::start("expert").await?;
    let api = &bench.api;
    let conn = api
        .send(
            reqwest::Method::POST,
            "/v1/connections",
            Some(json!({"kind": "expert", "name": "bench", "settings": {"card_url": base, "card_sha256": hash},
                        "credential": {}})),
        )
        .await?;
    anyhow::ensure!(conn["permissions"]["expert.consult"]["access"]["state"] == "granted", "connection: {conn}");
    let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({}))).await?;
    let run_id = run["id"].as_str().context("run id")?.to_owned();
    let turn = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/runs/{run_id}/turns"),
            Some(json!({"task": "consult the external expert"})),
        )
        .await?;
    let turn_id = turn["turn_id"].as_str().context("turn")?.to_owned();
    let mut chain = Vec::with_capacity(opts.chain_calls);
    for i in 0..opts.chain_calls {
        let t = Instant::now();
        let call = format!("chain-{i}");
        let inv = api
            .send(
                reqwest::Method::POST,
                &format!("/v1/runs/{run_id}/invocations"),
                Some(json!({"turn_id": turn_id, "tool_id": "expert_consult", "tool_call_id": call,
                            "input": {"message": message}})),
            )
            .await?;
        let approval = inv["approval_id"].as_str().context("approval")?;
        api.send(
            reqwest::Method::POST,
            &format!("/v1/approvals/{approval}/grant"),
            Some(json!({"tool_id": "expert_consult", "tool_call_id": call, "input_hash": inv["input_hash"]})),
        )
        .await?;
        let id = inv["invocation_id"].as_str().context("invocation")?;
        let done = loop {
            let v = api.send(reqwest::Method::GET, &format!("/v1/invocations/{id}?wait_ms=30000"), None).await?;
            if !matches!(v["status"].as_str(), Some("queued" | "running" | "awaiting_approval")) {
                break v;
            }
        };
        anyhow::ensure!(done["status"] == "completed", "chain call: {done}");
        chain.push(t.elapsed());
    }
    bench.stop().await;

    let (d, r, c) = (super::percentiles(&direct), super::percentiles(&runtime), super::percentiles(&chain));
    println!("expert: a2a-sdk scripted expert ({script}), streaming answer in 3 chunks, no delay");
    println!("direct_a2a      calls={} p50={:.2}ms p99={:.2}ms", direct.len(), d.p50, d.p99);
    println!(
        "runtime_client  calls={} p50={:.2}ms p99={:.2}ms (card fetch + hash + streamed send)",
        runtime.len(),
        r.p50,
        r.p99
    );
    println!(
        "full_http_chain calls={} p50={:.2}ms p99={:.2}ms (freeze + grant + execute + GET ?wait_ms)",
        chain.len(),
        c.p50,
        c.p99
    );
    println!(
        "overhead_vs_direct p50: runtime_client {:+.2}ms, chain {:+.2}ms; p99: runtime_client {:+.2}ms, chain {:+.2}ms",
        r.p50 - d.p50,
        c.p50 - d.p50,
        r.p99 - d.p99,
        c.p99 - d.p99
    );
    Ok(())
}

/// One `SendStreamingMessage` with a bare client, read until a final task state.
async fn direct_call(http: &reqwest::Client, url: &str, id: &str, text: &str) -> anyhow::Result<()> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "SendStreamingMessage",
                      "params": {"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]}}});
    let resp = http
        .post(url)
        .header("A2A-Version", "1.0")
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "direct call: {}", resp.status());
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        if buf.contains("TASK_STATE_COMPLETED") {
            return Ok(());
        }
    }
    anyhow::bail!("the direct stream ended before TASK_STATE_COMPLETED")
}
