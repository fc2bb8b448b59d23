//! `mira bench mcp-server`: the cost of a call through the runtime's own MCP server (`/mcp`,
//! docs/mcp-server.md) beside the same call through the HTTP API, on one server in one run.
//!
//! Both series call `read_open` on a small file of the workspace (no approval), sequentially:
//!
//! 1. HTTP API: `POST /v1/runs/{id}/invocations` then `GET /v1/invocations/{id}?wait_ms=…`
//!    until it is final, in one turn — what a Planner speaking the API pays;
//! 2. MCP: `tools/call` with rmcp's Streamable HTTP client on one session — the freeze, the
//!    wait and the result inside one request.
//!
//! p50/p99 of each and the difference. The server is a debug or release build as `mira` was
//! built; both series share it, so the difference is the façade's own cost.

use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::BenchServer;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct McpServerBench {
    /// Calls per series.
    #[arg(long, default_value_t = 300)]
    pub calls: usize,
}

/// Runs the benchmark and prints its figures.
pub async fn run(opts: McpServerBench) -> anyhow::Result<()> {
    let bench = BenchServer::start("mcp-server").await?;
    std::fs::write(bench.dir.join("ws").join("bench.txt"), "one line to read\n")?;
    let api = &bench.api;
    let input = json!({"path": "bench.txt"});

    // 1. The HTTP API.
    let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({}))).await?;
    let run_id = run["id"].as_str().context("run id")?.to_owned();
    let turn = api
        .send(reqwest::Method::POST, &format!("/v1/runs/{run_id}/turns"), Some(json!({"task": "read a file"})))
        .await?;
    let turn_id = turn["turn_id"].as_str().context("turn")?.to_owned();
    let mut http = Vec::with_capacity(opts.calls);
    for i in 0..opts.calls {
        let t = Instant::now();
        let inv = api
            .send(
                reqwest::Method::POST,
                &format!("/v1/runs/{run_id}/invocations"),
                Some(json!({"turn_id": turn_id, "tool_id": "read_open", "tool_call_id": format!("http-{i}"), "input": input})),
            )
            .await?;
        let id = inv["invocation_id"].as_str().context("invocation")?;
        let mut status = inv["status"].as_str().unwrap_or_default().to_owned();
        while matches!(status.as_str(), "queued" | "running") {
            let v = api.send(reqwest::Method::GET, &format!("/v1/invocations/{id}?wait_ms=30000"), None).await?;
            status = v["status"].as_str().unwrap_or_default().to_owned();
        }
        anyhow::ensure!(status == "completed", "HTTP call {i}: {status}");
        http.push(t.elapsed());
    }

    // 2. The MCP server, one session.
    let mcp = {
        use rmcp::ServiceExt;
        use rmcp::transport::streamable_http_client::{
            StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
        };
        let config =
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", api.base)).auth_header(api.token.clone());
        let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
        ().serve(transport).await.context("the MCP session")?
    };
    let arguments = input.as_object().cloned().context("input")?;
    let mut via_mcp = Vec::with_capacity(opts.calls);
    for i in 0..opts.calls {
        let params = rmcp::model::CallToolRequestParams::new("read_open").with_arguments(arguments.clone());
        let t = Instant::now();
        let result = mcp.call_tool(params).await?;
        anyhow::ensure!(result.is_error != Some(true), "MCP call {i}: {result:?}");
        via_mcp.push(t.elapsed());
    }
    let _ = mcp.cancel().await;
    bench.stop().await;

    let (h, m) = (super::percentiles(&http), super::percentiles(&via_mcp));
    println!("mcp-server: read_open of a 17-byte file, {} sequential calls per series, one server", opts.calls);
    println!("http_api   p50={:.2}ms p99={:.2}ms (POST invocations + GET ?wait_ms until final)", h.p50, h.p99);
    println!("mcp_server p50={:.2}ms p99={:.2}ms (tools/call over Streamable HTTP, one session)", m.p50, m.p99);
    println!("difference p50 {:+.2}ms, p99 {:+.2}ms", m.p50 - h.p50, m.p99 - h.p99);
    Ok(())
}
