//! `mira bench mcp`: External MCP figures on a real stdio server (default
//! `@modelcontextprotocol/server-everything`, from `scripts/setup-mcp.sh`).
//!
//! 1. Time from `POST /v1/mcp/servers` to the first completed call through the whole chain
//!    (connect, discover, agent access, turn, freeze, grant, execute).
//! 2. Call overhead: `calls` sequential `tools/call` through the runtime's MCP client
//!    ([`mira::mcp::McpManager::call`]: stdout guard, raw request, result shaping, evidence)
//!    versus the same server called directly with rmcp's `TokioChildProcess` client —
//!    p50/p99 of each and their ratio; plus p50/p99 of the full HTTP chain (freeze → grant →
//!    completed, awaited with one `GET /v1/invocations/{id}?wait_ms=…`, in one turn) over
//!    `chain_calls` calls, against the target 1.3 × direct + 2 ms.
//! 3. Memory per connected server: `servers` more copies are installed and connected; the
//!    growth of this process's RSS and the RSS of the server processes, per server.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::{Api, BenchServer};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct McpBench {
    /// Server command (default `$MIRA_MCP_EVERYTHING`).
    #[arg(long)]
    pub command: Option<String>,
    /// Server arguments.
    #[arg(long, default_values_t = vec!["stdio".to_owned()])]
    pub args: Vec<String>,
    /// Tool to call.
    #[arg(long, default_value = "echo")]
    pub tool: String,
    /// Tool arguments (JSON).
    #[arg(long, default_value = r#"{"message":"ping"}"#)]
    pub input: String,
    /// Calls for the overhead comparison.
    #[arg(long, default_value_t = 1000)]
    pub calls: usize,
    /// Calls through the full HTTP chain.
    #[arg(long, default_value_t = 100)]
    pub chain_calls: usize,
    /// Extra servers connected for the memory figure.
    #[arg(long, default_value_t = 10)]
    pub servers: usize,
    /// Run the server on a new database of this Postgres server (a URL naming a database the
    /// user may create databases from; the database is dropped at the end) instead of SQLite.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: McpBench) -> anyhow::Result<()> {
    let command = match &opts.command {
        Some(c) => c.clone(),
        None => std::env::var("MIRA_MCP_EVERYTHING").context("give --command or eval scripts/setup-mcp.sh")?,
    };
    let input: Value = serde_json::from_str(&opts.input).context("--input is not JSON")?;
    let bench = BenchServer::start_on("mcp", Default::default(), opts.postgres.as_deref()).await?;
    let (server, api) = (&bench.server, &bench.api);
    let transport = json!({"stdio": {"command": command, "args": opts.args}});

    // 1. Install → first successful call.
    let t0 = Instant::now();
    let installed = api
        .send(
            reqwest::Method::POST,
            "/v1/mcp/servers",
            Some(json!({"name": "bench", "transport": transport, "default_agent_access": true})),
        )
        .await?;
    let id = installed["id"].as_str().context("server id")?.to_owned();
    let tool_id = mira::mcp::projection_id(&id, &opts.tool);
    let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({}))).await?;
    let run_id = run["id"].as_str().context("run id")?.to_owned();
    while !server.app.mcp.is_projected(&id, &opts.tool)
        || server.app.mcp.slot(&id).is_none_or(|s| s.live.lock().is_none())
    {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(60), "the server did not connect within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first = api.chain_call(&run_id, &tool_id, "first", &input).await?;
    let install_to_first = t0.elapsed();
    anyhow::ensure!(first["status"] == "completed", "first call: {first}");

    // 2a. Through the runtime's MCP client.
    let mut runtime = Vec::with_capacity(opts.calls);
    for i in 0..opts.calls {
        let ctx = mira::registry::ExecContext {
            workspace: None,
            owner_id: String::new(),
            run_id: run_id.clone(),
            invocation_id: format!("bench-{i}"),
            cancel: tokio_util::sync::CancellationToken::new(),
            commit: mira::harness::CommitGate::new(),
        };
        let t = Instant::now();
        server.app.mcp.call(&id, &opts.tool, &input, &ctx).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        runtime.push(t.elapsed());
    }
    // 2b. Directly with rmcp.
    let direct = direct_calls(&command, &opts.args, &opts.tool, &input, opts.calls).await?;
    // 2c. The full HTTP chain.
    let mut chain = Vec::with_capacity(opts.chain_calls);
    let mut phases: [Vec<Duration>; 3] = Default::default();
    let chain_turn = api.turn(&run_id).await?;
    for i in 0..opts.chain_calls {
        let t = Instant::now();
        let (done, took) = api.chain_call_in(&run_id, &chain_turn, &tool_id, &format!("chain-{i}"), &input).await?;
        anyhow::ensure!(done["status"] == "completed", "chain call: {done}");
        chain.push(t.elapsed());
        for (all, one) in phases.iter_mut().zip(took) {
            all.push(one);
        }
    }

    // 3. Memory per connected server.
    let (self_before, kids_before) = rss_kb();
    let mut ids = Vec::new();
    for i in 0..opts.servers {
        let v = api
            .send(
                reqwest::Method::POST,
                "/v1/mcp/servers",
                Some(json!({"name": format!("mem-{i}"), "transport": transport})),
            )
            .await?;
        ids.push(v["id"].as_str().context("id")?.to_owned());
    }
    let t = Instant::now();
    while !ids.iter().all(|id| server.app.mcp.slot(id).is_some_and(|s| s.live.lock().is_some())) {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "the extra servers did not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (self_after, kids_after) = rss_kb();
    let n = opts.servers.max(1) as f64;

    let (r, d, c) = (super::percentiles(&runtime), super::percentiles(&direct), super::percentiles(&chain));
    println!("server: {} {}", command, opts.args.join(" "));
    println!("store: {}", if opts.postgres.is_some() { "postgres" } else { "sqlite" });
    println!("install_to_first_call_ms={:.1}", install_to_first.as_secs_f64() * 1000.0);
    println!("runtime_client calls={} p50={:.3}ms p99={:.3}ms", runtime.len(), r.p50, r.p99);
    println!("direct_rmcp    calls={} p50={:.3}ms p99={:.3}ms", direct.len(), d.p50, d.p99);
    println!("overhead_ratio p50={:.2} p99={:.2}", r.p50 / d.p50.max(1e-9), r.p99 / d.p99.max(1e-9));
    println!(
        "full_http_chain calls={} p50={:.2}ms p99={:.2}ms (freeze + grant + execute + GET ?wait_ms; one turn for all)",
        chain.len(),
        c.p50,
        c.p99
    );
    let [freeze, grant, wait] = phases.each_ref().map(|p| super::percentiles(p));
    println!(
        "  phases p50/p99 ms: freeze {:.2}/{:.2}  grant {:.2}/{:.2}  execute until the final status (GET ?wait_ms) {:.2}/{:.2}",
        freeze.p50, freeze.p99, grant.p50, grant.p99, wait.p50, wait.p99
    );
    println!(
        "chain_vs_direct p50: chain {:.2} ms, target 1.3 x direct + 2 ms = {:.2} ms ({})",
        c.p50,
        1.3 * d.p50 + 2.0,
        if c.p50 <= 1.3 * d.p50 + 2.0 { "met" } else { "missed" }
    );
    println!(
        "memory_per_server runtime_rss_kb={:.0} server_process_rss_kb={:.0} (over {} servers)",
        (self_after.saturating_sub(self_before)) as f64 / n,
        (kids_after.saturating_sub(kids_before)) as f64 / n,
        opts.servers
    );
    bench.stop().await;
    Ok(())
}

async fn direct_calls(
    command: &str,
    args: &[String],
    tool: &str,
    input: &Value,
    calls: usize,
) -> anyhow::Result<Vec<Duration>> {
    use rmcp::ServiceExt;
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args);
    let transport = rmcp::transport::TokioChildProcess::new(cmd)?;
    let client = ().serve(transport).await?;
    let arguments = input.as_object().cloned();
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let mut params = rmcp::model::CallToolRequestParams::new(tool.to_owned());
        if let Some(a) = arguments.clone() {
            params = params.with_arguments(a);
        }
        let t = Instant::now();
        client.call_tool(params).await?;
        out.push(t.elapsed());
    }
    let _ = client.cancel().await;
    Ok(out)
}

/// (RSS of this process, RSS of all its descendants), kB, from /proc.
fn rss_kb() -> (u64, u64) {
    let field = |pid: &str, name: &str| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()
    };
    let me = std::process::id().to_string();
    let mut parents: Vec<(String, String)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if pid.bytes().all(|b| b.is_ascii_digit())
                && let Some(ppid) = field(&pid, "PPid:")
            {
                parents.push((pid, ppid.to_string()));
            }
        }
    }
    let mut family = vec![me.clone()];
    let mut i = 0;
    while i < family.len() {
        let p = family[i].clone();
        family.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| c.clone()));
        i += 1;
    }
    let kids: u64 = family[1..].iter().filter_map(|p| field(p, "VmRSS:")).sum();
    (field(&me, "VmRSS:").unwrap_or(0), kids)
}

impl Api {
    /// Turn, then the chain ([`Api::chain_call_in`]).
    async fn chain_call(&self, run: &str, tool: &str, call_id: &str, input: &Value) -> anyhow::Result<Value> {
        let turn_id = self.turn(run).await?;
        Ok(self.chain_call_in(run, &turn_id, tool, call_id, input).await?.0)
    }

    /// A new turn of `run`; its id.
    async fn turn(&self, run: &str) -> anyhow::Result<String> {
        let turn =
            self.send(reqwest::Method::POST, &format!("/v1/runs/{run}/turns"), Some(json!({"task": "bench"}))).await?;
        Ok(turn["turn_id"].as_str().context("turn")?.to_owned())
    }

    /// Freeze, grant, then one `GET /v1/invocations/{id}?wait_ms=…` that answers when the
    /// call is final (no polling). The final invocation, and how long the three steps took.
    async fn chain_call_in(
        &self,
        run: &str,
        turn_id: &str,
        tool: &str,
        call_id: &str,
        input: &Value,
    ) -> anyhow::Result<(Value, [Duration; 3])> {
        let t = Instant::now();
        let inv = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/runs/{run}/invocations"),
                Some(json!({"turn_id": turn_id, "tool_id": tool, "tool_call_id": call_id, "input": input})),
            )
            .await?;
        let frozen = t.elapsed();
        let approval = inv["approval_id"].as_str().context("approval")?;
        self.send(
            reqwest::Method::POST,
            &format!("/v1/approvals/{approval}/grant"),
            Some(json!({"tool_id": tool, "tool_call_id": call_id, "input_hash": inv["input_hash"]})),
        )
        .await?;
        let granted = t.elapsed();
        let id = inv["invocation_id"].as_str().context("invocation")?;
        loop {
            let v = self.send(reqwest::Method::GET, &format!("/v1/invocations/{id}?wait_ms=30000"), None).await?;
            if !matches!(v["status"].as_str(), Some("queued" | "running" | "awaiting_approval")) {
                return Ok((v, [frozen, granted - frozen, t.elapsed() - granted]));
            }
        }
    }
}
