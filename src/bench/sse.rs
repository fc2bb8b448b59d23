//! `mira bench sse`: server memory while many clients hold streams or idle connections open,
//! and after they leave.
//!
//! The server runs as a child process (`mira serve` of this binary, SQLite or `--database-url`,
//! in a temporary directory), so its resident set (`VmRSS` of `/proc/<pid>/status`) is the
//! server's alone. Each round opens `--clients` connections at once — run event streams
//! (`GET /v1/runs/{id}/events`), approval inbox streams (`GET /v1/approvals/stream`) or idle
//! keep-alive connections (one `GET /healthz`, then nothing) — spread over `--users` users,
//! waits until every stream has answered, reads the RSS ("during"), closes them all, waits
//! `--settle-ms` and reads it again ("after"). "before" is read once the server has started and
//! served one request of each kind.
//!
//! Side by side, in the same run, the same rounds against a server started with
//! `MIRA_MALLOC_TRIM=0`, which keeps glibc's freed memory in its arenas instead of handing it
//! back when connections close: the reference for what the release step does; and, with
//! `--compare BINARY`, against another build (e.g. the commit before these fixes).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Api;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct SseBench {
    /// Clients per round.
    #[arg(long, default_value_t = 300)]
    pub clients: usize,
    /// Rounds per kind of connection.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Users the clients are spread over (each within its stream cap).
    #[arg(long, default_value_t = 10)]
    pub users: usize,
    /// Milliseconds to wait after the clients left before reading "after".
    #[arg(long, default_value_t = 3000)]
    pub settle_ms: u64,
    /// Database of the server (default: SQLite in the temporary directory).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Also measure this `mira` binary (e.g. a build of an older commit) as a third column
    /// set; its streams are opened the same way.
    #[arg(long)]
    pub compare: Option<std::path::PathBuf>,
}

/// What a round's clients hold open.
#[derive(Debug, Clone, Copy)]
enum Kind {
    RunEvents,
    Inbox,
    IdleKeepAlive,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::RunEvents => "run events SSE",
            Kind::Inbox => "approvals inbox SSE",
            Kind::IdleKeepAlive => "idle keep-alive",
        }
    }
}

/// A server child process and its users' tokens and runs.
struct Child {
    process: tokio::process::Child,
    pid: u32,
    addr: std::net::SocketAddr,
    users: Vec<(String, String)>,
    dir: std::path::PathBuf,
}

impl Child {
    async fn start(opts: &SseBench, binary: &std::path::Path, trim: bool) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("mira-bench-sse-{}", uuid::Uuid::now_v7().simple()));
        let ws = dir.join("ws");
        std::fs::create_dir_all(&ws)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let mut cmd = tokio::process::Command::new(binary);
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(&dir)
            .arg("--workspace")
            .arg(&ws)
            .env("MIRA_MAX_STREAMS_PER_USER", opts.clients.div_ceil(opts.users.max(1)).to_string())
            .env("MIRA_MALLOC_TRIM", if trim { "1" } else { "0" })
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(url) = &opts.database_url {
            cmd.arg("--database-url").arg(url);
        }
        let process = cmd.spawn().context("starting the server")?;
        let pid = process.id().context("server pid")?;
        let token_file = dir.join("admin.token");
        let mut token = None;
        for _ in 0..300 {
            if let Ok(t) = std::fs::read_to_string(&token_file)
                && TcpStream::connect(addr).await.is_ok()
            {
                token = Some(t.trim().to_owned());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let admin = Api::new(addr, token.context("the server did not start in 30 s")?)?;
        let mut users = Vec::new();
        for i in 0..opts.users.max(1) {
            let created =
                admin.send(reqwest::Method::POST, "/v1/users", Some(json!({"name": format!("sse-user-{i}")}))).await?;
            let token = created["token"].as_str().context("user token")?.to_owned();
            let api = Api::new(addr, token.clone())?;
            let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({"title": "sse bench"}))).await?;
            users.push((token, run["id"].as_str().context("run id")?.to_owned()));
        }
        Ok(Self { process, pid, addr, users, dir })
    }

    fn rss_mb(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("VmRSS")?;
        Ok(kb / 1024.0)
    }

    /// Opens one client of `kind` for user `i` and waits for the response head.
    async fn open(&self, kind: Kind, i: usize) -> anyhow::Result<TcpStream> {
        let (token, run) = &self.users[i % self.users.len()];
        let request = match kind {
            Kind::RunEvents => format!(
                "GET /v1/runs/{run}/events HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
            ),
            Kind::Inbox => format!(
                "GET /v1/approvals/stream HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
            ),
            Kind::IdleKeepAlive => "GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n".to_owned(),
        };
        let mut stream = TcpStream::connect(self.addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf)).await??;
            if n == 0 {
                bail!("the server closed the connection");
            }
            head.extend_from_slice(&buf[..n]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            bail!("{}: {}", kind.name(), String::from_utf8_lossy(&head).lines().next().unwrap_or_default());
        }
        Ok(stream)
    }

    async fn stop(mut self) {
        let _ = self.process.start_kill();
        let _ = self.process.wait().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One round's figures, MB.
struct Round {
    before: f64,
    during: f64,
    after: f64,
}

async fn rounds(child: &Child, kind: Kind, opts: &SseBench) -> anyhow::Result<Vec<Round>> {
    let mut out = Vec::new();
    for _ in 0..opts.rounds {
        let before = child.rss_mb()?;
        let opened = futures::future::join_all((0..opts.clients).map(|i| child.open(kind, i))).await;
        let clients = opened.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = child.rss_mb()?;
        drop(clients);
        tokio::time::sleep(Duration::from_millis(opts.settle_ms)).await;
        out.push(Round { before, during, after: child.rss_mb()? });
    }
    Ok(out)
}

/// Runs the benchmark and prints its table.
pub async fn run(opts: SseBench) -> anyhow::Result<()> {
    let kinds = [Kind::RunEvents, Kind::Inbox, Kind::IdleKeepAlive];
    println!(
        "mira bench sse: {} clients per round over {} users, {} rounds per kind, RSS of the server process (MB), after = {} ms after the clients left",
        opts.clients, opts.users, opts.rounds, opts.settle_ms
    );
    let mut results = Vec::new();
    let this = std::env::current_exe()?;
    let mut variants = vec![(this.clone(), true), (this, false)];
    if let Some(other) = &opts.compare {
        variants.push((other.clone(), true));
    }
    for (binary, trim) in variants {
        let child = Child::start(&opts, &binary, trim).await?;
        // Warm-up: one client of each kind, so "start" includes what any first request loads.
        for kind in kinds {
            drop(child.open(kind, 0).await?);
        }
        tokio::time::sleep(Duration::from_millis(opts.settle_ms)).await;
        let start = child.rss_mb()?;
        let mut per_kind = Vec::new();
        for kind in kinds {
            per_kind.push(rounds(&child, kind, &opts).await?);
        }
        let end = child.rss_mb()?;
        child.stop().await;
        results.push((start, per_kind, end));
    }
    let names = ["this build", "MALLOC_TRIM=0", "--compare"];
    let mut head = format!("{:<22} {:>5}", "", "");
    let mut cols = format!("{:<22} {:>5}", "kind", "round");
    for name in names.iter().take(results.len()) {
        head.push_str(&format!(" | {name:<26}"));
        cols.push_str(&format!(" | {:>8} {:>8} {:>8}", "before", "during", "after"));
    }
    println!("{head}\n{cols}");
    for (k, kind) in kinds.iter().enumerate() {
        for r in 0..opts.rounds {
            let mut line = format!("{:<22} {:>5}", kind.name(), r + 1);
            for result in &results {
                let x = &result.1[k][r];
                line.push_str(&format!(" | {:>8.1} {:>8.1} {:>8.1}", x.before, x.during, x.after));
            }
            println!("{line}");
        }
    }
    for (name, (start, _, end)) in names.iter().zip(&results) {
        println!(
            "{name}: server RSS at start (after warm-up) {start:.1} MB, at the end {end:.1} MB ({:+.1})",
            end - start
        );
    }
    Ok(())
}
