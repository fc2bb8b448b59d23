//! `mira mcp-stdio --server URL`: a stdio bridge to the runtime's MCP server, for MCP clients
//! that only launch processes (docs/mcp-server.md).
//!
//! It carries JSON-RPC messages unchanged both ways between rmcp's stdio transport (the
//! client that launched it) and rmcp's Streamable HTTP client transport (`<URL>/mcp`, with
//! the bearer token of `MIRA_TOKEN`): requests, answers, notifications, and the server's own
//! requests (elicitation) and notifications (`tools/list_changed`). It keeps no state and
//! decides nothing: the session, its run and every approval live in the server. It exits
//! when either side closes; the exit code is 0 when stdin closed, 1 when the server side
//! failed.

use rmcp::RoleClient;
use rmcp::RoleServer;
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransport, StreamableHttpClientTransportConfig};
use rmcp::transport::{IntoTransport, Transport};

/// Longest the bridge waits for the server to close the session once stdin closed.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Arguments of `mira mcp-stdio`.
#[derive(clap::Args, Debug)]
pub struct BridgeArgs {
    /// The runtime's base URL (`http://host:port`); the bridge talks to `<URL>/mcp`.
    #[arg(long)]
    pub server: String,
    /// Bind the session to this run of yours (default: a new run).
    #[arg(long)]
    pub run: Option<String>,
    /// The ranking task of the session's first turn.
    #[arg(long)]
    pub task: Option<String>,
    /// The environment variable holding the bearer token.
    #[arg(long, default_value = "MIRA_TOKEN")]
    pub token_env: String,
}

/// Runs the bridge until either side closes.
///
/// Errors: no token in the named variable, a URL that does not parse; a server that
/// refuses or fails after the start ends the bridge with an error naming it.
pub async fn run(args: BridgeArgs) -> anyhow::Result<()> {
    let token = std::env::var(&args.token_env)
        .map_err(|_| anyhow::anyhow!("set {} to your Mira token (mira user create prints one)", args.token_env))?;
    let mut url = url::Url::parse(args.server.trim_end_matches('/'))?;
    url.set_path(&format!("{}{}", url.path().trim_end_matches('/'), super::PATH));
    {
        let mut query = url.query_pairs_mut();
        if let Some(run) = &args.run {
            query.append_pair("run", run);
        }
        if let Some(task) = &args.task {
            query.append_pair("task", task);
        }
    }
    if url.query() == Some("") {
        url.set_query(None);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token);
    let client = reqwest::Client::builder().build()?;
    let mut upstream: StreamableHttpClientTransport<reqwest::Client> =
        StreamableHttpClientTransport::with_client(client, config);
    let mut local = IntoTransport::<RoleServer, std::io::Error, _>::into_transport(rmcp::transport::io::stdio());
    loop {
        tokio::select! {
            from_client = Transport::<RoleServer>::receive(&mut local) => match from_client {
                Some(message) => Transport::<RoleClient>::send(&mut upstream, message).await
                    .map_err(|e| anyhow::anyhow!("sending to {url}: {e}"))?,
                None => break,
            },
            from_server = Transport::<RoleClient>::receive(&mut upstream) => match from_server {
                Some(message) => Transport::<RoleServer>::send(&mut local, message).await?,
                None => {
                    let _ = Transport::<RoleServer>::close(&mut local).await;
                    anyhow::bail!("the MCP server at {url} closed the session");
                }
            },
        }
    }
    // Closing ends the server's session (a `DELETE`); a server that does not answer must not
    // keep the bridge alive after its client closed stdin.
    let _ = tokio::time::timeout(CLOSE_WAIT, Transport::<RoleClient>::close(&mut upstream)).await;
    Ok(())
}
