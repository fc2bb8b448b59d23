//! Benchmarks run by `mira bench …`: they start a real server in-process and print figures.
//! Not tests: their numbers go into issue notes, not assertions.

pub mod browser;
pub mod codegraph;
pub mod cpu;
pub mod expert;
pub mod exposure;
pub mod fairness;
pub mod invocations;
pub mod mcp;
pub mod mcp_server;
pub mod news;
pub mod runner;
pub mod runner_terminal;
pub mod soak;
pub mod sse;
pub mod terminal;

use std::time::Duration;

use serde_json::Value;

/// The database a benchmark runs on: a SQLite file in a folder of the benchmark's, or a fresh
/// database created on a Postgres server and dropped by [`ScratchDb::drop`].
pub struct ScratchDb {
    /// The URL the benchmark's server connects to.
    pub url: String,
    /// The Postgres server's URL and the database created on it.
    postgres: Option<(String, String)>,
}

impl ScratchDb {
    /// `mira.db` in `dir` when `postgres` is None; otherwise a new database named
    /// `<prefix>_<uuid>` on the server `postgres` (a URL naming a database the user may create
    /// databases from).
    pub async fn create(postgres: Option<&str>, dir: &std::path::Path, prefix: &str) -> anyhow::Result<Self> {
        let Some(server) = postgres else {
            return Ok(Self { url: format!("sqlite://{}?mode=rwc", dir.join("mira.db").display()), postgres: None });
        };
        let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
        admin_sql(server, &format!("CREATE DATABASE {name}")).await?;
        let base = server.rsplit_once('/').map_or(server, |(b, _)| b);
        Ok(Self { url: format!("{base}/{name}"), postgres: Some((server.to_owned(), name)) })
    }

    /// Drops the Postgres database (nothing for SQLite: the file goes with its folder), or,
    /// with `keep`, names it on stderr and leaves it.
    pub async fn drop(self, keep: bool) -> anyhow::Result<()> {
        match self.postgres {
            Some((server, name)) if keep => eprintln!("kept database {name} on {}", mira::store::redact_url(&server)),
            Some((server, name)) => admin_sql(&server, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?,
            None => {}
        }
        Ok(())
    }
}

/// Runs one statement on the server `admin_url` outside any transaction.
async fn admin_sql(admin_url: &str, sql: &str) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(admin_url).await?;
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut conn).await?;
    Ok(())
}

/// A server started for a benchmark: SQLite (or a scratch Postgres database) and a workspace
/// in a temporary directory, the admin's client, and the directory (removed by
/// [`BenchServer::stop`]).
pub struct BenchServer {
    /// The running server.
    pub server: mira::server::Server,
    /// A client with the admin token.
    pub api: Api,
    /// The temporary directory (the data dir is `data/` inside it, the workspace `ws/`).
    pub dir: std::path::PathBuf,
    /// The database the server runs on (dropped by [`BenchServer::stop`]).
    db: ScratchDb,
}

impl BenchServer {
    /// Starts a server with default settings on SQLite under a new temporary directory.
    pub async fn start(name: &str) -> anyhow::Result<Self> {
        Self::start_with(name, mira::config::RuntimeConfig::default()).await
    }

    /// Starts a server with `runtime` settings on SQLite under a new temporary directory
    /// (data in `data/`, the workspace in `ws/`: a workspace is never inside the data dir,
    /// which sandboxed sessions cannot see).
    pub async fn start_with(name: &str, runtime: mira::config::RuntimeConfig) -> anyhow::Result<Self> {
        Self::start_on(name, runtime, None).await
    }

    /// As [`BenchServer::start_with`], on a new database of the Postgres server `postgres`
    /// when given (a URL naming a database the user may create databases from; see
    /// [`ScratchDb`]), dropped again by [`BenchServer::stop`].
    pub async fn start_on(
        name: &str,
        runtime: mira::config::RuntimeConfig,
        postgres: Option<&str>,
    ) -> anyhow::Result<Self> {
        let root = std::env::temp_dir().join(format!("mira-bench-{name}-{}", uuid::Uuid::now_v7().simple()));
        let dir = root.join("data");
        let workspace = root.join("ws");
        std::fs::create_dir_all(&workspace)?;
        std::fs::create_dir_all(&dir)?;
        let db = ScratchDb::create(postgres, &dir, "mira_bench").await?;
        let settings = mira::server::Settings {
            listen: "127.0.0.1:0".parse()?,
            data_dir: dir.clone(),
            database_url: db.url.clone(),
            workspace,
            runtime,
            body_limit: 1024 * 1024,
            request_timeout: Duration::from_secs(60),
        };
        let server = match mira::server::Server::start(settings).await {
            Ok(server) => server,
            Err(e) => {
                // Nothing of a failed start is left behind: its database and its folder.
                if let Err(d) = db.drop(false).await {
                    eprintln!("dropping the benchmark's database failed: {d:#}");
                }
                let _ = std::fs::remove_dir_all(&root);
                return Err(e);
            }
        };
        let token = std::fs::read_to_string(dir.join("admin.token"))?.trim().to_owned();
        let api = Api::new(server.addr, token)?;
        Ok(Self { server, api, dir: root, db })
    }

    /// Shuts the server down and removes its directory and its Postgres database.
    pub async fn stop(self) {
        self.server.shutdown().await;
        if let Err(e) = self.db.drop(false).await {
            eprintln!("dropping the benchmark's database failed: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A bearer-token JSON client for the server a benchmark started.
pub struct Api {
    /// HTTP client.
    pub client: reqwest::Client,
    /// `http://addr`.
    pub base: String,
    /// Bearer token.
    pub token: String,
}

impl Api {
    /// A client for `addr` with `token`.
    pub fn new(addr: std::net::SocketAddr, token: String) -> anyhow::Result<Self> {
        Ok(Self { client: mira::net::client_builder().build()?, base: format!("http://{addr}"), token })
    }

    /// Sends a request; a non-2xx answer is an error naming the path, status and body.
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req = self.client.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let v: Value = resp.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }
}

/// p50/p99/max of a set of latencies, in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
    /// Largest, ms.
    pub max: f64,
}

/// Nearest-rank percentiles of `samples` (0 for an empty set).
pub fn percentiles(samples: &[Duration]) -> Percentiles {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| -> f64 {
        if ms.is_empty() {
            return 0.0;
        }
        let rank = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len());
        ms[rank - 1]
    };
    Percentiles { p50: at(0.50), p99: at(0.99), max: at(1.0) }
}
