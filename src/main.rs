//! `mira`: serve the runtime, migrate its store, create users.

mod bench;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mira::config::{RuntimeConfig, ServeConfig, StorageConfig};
use mira::server::{self, Server, Settings};

/// mimalloc instead of glibc malloc for everything Rust allocates: under load the locks of
/// glibc's arenas (two on two cores, [`mira::limits::tune_allocator`]) were the most
/// contended locks of the process (`perf` during `mira bench invocations`). C code (SQLite,
/// ONNX Runtime) still allocates from glibc. See [`tune_mimalloc`].
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Before any thread starts: mimalloc commits its arenas' memory only when used
/// (`arena_eager_commit` 0) and the process uses no transparent huge pages
/// (`PR_SET_THP_DISABLE`, what mimalloc's `allow_thp` 0 does at its start, which comes before
/// `main`). With mimalloc's defaults the server's resident memory was about 50 MB higher at
/// start and after warm-up (`mira bench soak`); the kernel's THP setting does not matter to
/// glibc's malloc, which never asks for huge pages. Options given in the environment
/// (`MIMALLOC_ARENA_EAGER_COMMIT`, `MIMALLOC_ALLOW_THP`) are left as they are.
fn tune_mimalloc() {
    // `mi_option_arena_eager_commit` in mimalloc v3's `mi_option_e` (mimalloc.h), which
    // libmimalloc-sys's bindings (written for v2) do not name. v3 keeps its options'
    // numbers (retired ones stay as `deprecated` entries); another major version is not
    // assumed to: the option is then left at its default.
    const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    // SAFETY: mi_version only returns a constant (major · 10,000 + minor · 100 + patch).
    let v3 = unsafe { libmimalloc_sys::mi_version() } / 10_000 == 3;
    let given = |v: &str| std::env::var_os(v).is_some();
    if v3 && !given("MIMALLOC_ARENA_EAGER_COMMIT") {
        // SAFETY: sets one of mimalloc's options; no preconditions.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    }
    #[cfg(target_os = "linux")]
    if !given("MIMALLOC_ALLOW_THP") {
        // SAFETY: prctl(PR_SET_THP_DISABLE) only sets a flag of this process.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

#[derive(Parser)]
#[command(
    name = "mira",
    version,
    about = "Mira Tool Runtime: the tool control plane between an agent Planner and its tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP/SSE service.
    Serve(Box<ServeConfig>),
    /// Apply database migrations and exit.
    Migrate(StorageConfig),
    /// Manage users.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// The device runner (docs/runner.md): `mira runner enroll --server URL --code CODE`,
    /// then `mira runner --server URL --workspace DIR…` on the user's machine. The same as
    /// the standalone `mira-runner` binary.
    Runner(mira_runner::cli::RunnerArgs),
    /// Check a run bundle offline (hashes, chain, grants, signature), or a run's stored
    /// chain with `--database URL --run ID` (docs/verify.md). Exit 0 valid, 1 invalid (the
    /// first problem named), 2 unreadable input.
    Verify(mira::verify::VerifyArgs),
    /// A stdio bridge to a runtime's MCP server for MCP clients that only launch processes:
    /// `mira mcp-stdio --server URL` with the token in `MIRA_TOKEN` (docs/mcp-server.md).
    McpStdio(mira::mcp_server::bridge::BridgeArgs),
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Frozen invocations per second (concurrent `read_open` calls).
    Invocations(bench::invocations::InvocationBench),
    /// External MCP: install → first call, call overhead vs direct rmcp, memory per server.
    Mcp(bench::mcp::McpBench),
    /// The runtime's own MCP server: a `read_open` call over `/mcp` beside the same call through
    /// the HTTP API (p50/p99).
    McpServer(bench::mcp_server::McpServerBench),
    /// External Expert: consult overhead through the chain vs a direct A2A call (p50/p99).
    Expert(bench::expert::ExpertBench),
    /// Code graph: index time and memory, incremental update, query latency, quality.
    Codegraph(bench::codegraph::CodegraphBench),
    /// Tool Exposure ranking: Recall@5/@20, MRR and latency per ranker, then the exposure
    /// latency series at 21, 100, 1,000 and 10,000 registered tools.
    Exposure(Box<ExposureArgs>),
    /// News Hub: collection throughput (items/s stored) and search latency (p50/p99).
    News(bench::news::NewsBench),
    /// Terminal: PTY → SSE throughput vs a bare PTY and a pipe, echo latency, server RSS.
    Terminal(bench::terminal::TerminalBench),
    /// Server RSS before, during and after many SSE clients / idle connections come and go.
    Sse(bench::sse::SseBench),
    /// Sustained load: RSS, data size and disk bytes per call over time.
    Soak(bench::soak::SoakBench),
    /// Managed browser: start → first snapshot, snapshot and click p50/p99, memory per context.
    Browser(bench::browser::BrowserBench),
    /// Remote devices: `read_open` and terminal throughput through a real `mira runner` vs on
    /// the host, runner RSS.
    Runner(bench::runner::RunnerBench),
    /// Fairness between users: one user's calls (freeze → completed) and turns alone and
    /// while another user floods the server with calls, then with turns (p50/p99).
    Fairness(bench::fairness::FairnessBench),
}

/// Arguments of `mira bench exposure`.
#[derive(clap::Args)]
struct ExposureArgs {
    /// Tool definitions: a JSON array of {id|name, description, input_schema?}.
    #[arg(long)]
    tools: PathBuf,
    /// Queries: JSONL of {query, gold: [tool id]}.
    #[arg(long)]
    queries: PathBuf,
    /// Measure a seeded sample of this many queries (default: all).
    #[arg(long)]
    sample: Option<usize>,
    /// Sampling seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Ranker to measure.
    #[arg(long, value_enum, default_value_t = RankerArg::All)]
    ranker: RankerArg,
    /// Hybrid fusions to compare, comma-separated: convex[:W] (W = dense weight) or
    /// rrf[:K]. The first one is the one used in the latency series.
    #[arg(long, value_delimiter = ',', default_value = "convex:0.8")]
    fusion: Vec<String>,
    /// Registered tool counts of the exposure latency series (comma-separated; 0 to skip).
    #[arg(long, value_delimiter = ',', default_value = "20,21,100,1000,10000")]
    series: Vec<usize>,
    /// Turns measured per series size.
    #[arg(long, default_value_t = 200)]
    series_turns: usize,
    /// Also write each query's per-tool lexical and dense scores to this JSONL file.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Also measure each ranker with multi-step tasks split into steps, ranked each and
    /// fused by the best score (a row `… + steps`).
    #[arg(long)]
    steps: bool,
    /// Learning from use: replay this many queries of the set (the ones after the sample in
    /// the seeded order, so never a measured one) as accepted past uses of their gold tools,
    /// and measure each embedding ranker with them too (a row `… + history N`). Needs
    /// --sample.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// The rules measured with --history, as FLOOR:BOOST pairs (default: the shipped one).
    #[arg(long, value_delimiter = ',')]
    history_rule: Vec<String>,
    /// Replay each history query with the gold tools of the next one instead of its own: past
    /// uses that mislead, to measure what they cost.
    #[arg(long)]
    history_mismatched: bool,
    #[command(flatten)]
    embedding: mira::config::EmbeddingArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RankerArg {
    Lexical,
    Dense,
    Hybrid,
    All,
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a user and print its token (shown once).
    Create {
        /// Unique name.
        #[arg(long)]
        name: String,
        /// Grant admin rights.
        #[arg(long)]
        admin: bool,
        /// Grant the approver role: may grant other users' four-eyes approvals.
        #[arg(long)]
        approver: bool,
        #[command(flatten)]
        storage: StorageConfig,
    },
}

/// Logs go to stderr: JSON lines with `--log-format json`, else text, coloured only when stderr is a
/// terminal (a file or a pipe gets plain text without ANSI escape codes). When
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, traces are
/// exported over OTLP/HTTP too ([`mira::telemetry`]); the provider is returned so that `run`
/// flushes it at exit.
fn init_tracing(json: bool) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,sqlx=warn,tower_http=info,rmcp=warn,rmcp::service=error")
    });
    let filter = mira::telemetry::log_filter(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let fmt = if json { fmt.json().with_filter(filter).boxed() } else { fmt.with_filter(filter).boxed() };
    let (provider, failed) = if mira::telemetry::enabled_by_env() {
        match mira::telemetry::provider(None) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let otel = provider.as_ref().map(mira::telemetry::layer);
    tracing_subscriber::registry().with(fmt).with(otel).init();
    match (&provider, failed) {
        (Some(_), _) => tracing::info!("exporting traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)"),
        (None, Some(e)) => tracing::error!(error = %e, "trace export is off: the OTLP exporter could not be set up"),
        (None, None) => {}
    }
    provider
}

async fn serve(cfg: ServeConfig) -> anyhow::Result<()> {
    // The supervisor and init of a session's PID namespace become this very binary again
    // (the running one, even if its file was replaced since) instead of staying copies of
    // the server's memory.
    mira::sandbox::set_pid_helper(PathBuf::from("/proc/self/exe"));
    if !cfg.allow_internal_urls
        && ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
    {
        tracing::warn!(
            "a proxy is set in the environment: non-admins' outbound connections (GitHub, web sources, experts, HTTP MCP servers) do not use it (a proxy would resolve names past the public-address check); where the proxy is the only way out they fail"
        );
    }
    let workspace = match &cfg.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().context("reading the current directory")?,
    };
    let settings = Settings {
        listen: cfg.listen,
        database_url: cfg.storage.url(),
        data_dir: cfg.storage.data_dir.clone(),
        workspace,
        runtime: RuntimeConfig {
            approval_ttl_secs: cfg.approval_ttl_secs,
            execution_timeout_secs: cfg.execution_timeout_secs,
            execution_concurrency: cfg.execution_concurrency,
            max_running_per_user: cfg.max_running_per_user.and_then(|n| usize::try_from(n).ok()),
            workspace_roots: cfg.workspace_roots.clone(),
            mcp: mira::mcp::McpSettings {
                stdio_allow: cfg.mcp_stdio_allow.clone(),
                max_message_bytes: usize::try_from(cfg.mcp_max_message_bytes).unwrap_or(usize::MAX),
                ..Default::default()
            },
            embedding: cfg.embedding.config(),
            search: cfg.search.clone(),
            terminal: cfg.terminal.clone(),
            browser: cfg.browser.clone(),
            mcp_server: cfg.mcp_server.clone(),
            allow_internal_urls: cfg.allow_internal_urls,
            allow_hard_link_reads: cfg.allow_hard_link_reads,
            learn_from_use: cfg.learn_from_use,
            four_eyes_domains: cfg
                .four_eyes_domains
                .iter()
                .map(|d| d.trim().to_owned())
                .filter(|d| !d.is_empty())
                .collect(),
            sandbox: cfg.sandbox.clone(),
            http: cfg.http.clone(),
            cluster: cfg.cluster.clone(),
            retention: mira::retention::RetentionPolicy::from_days(cfg.retention_days, cfg.retention_interval_secs),
            devices: mira::devices::DeviceSettings {
                lease: Duration::from_secs(cfg.runner_lease_secs),
                enroll_failures_per_address: cfg.enroll_failures_per_address,
                enroll_failures_global: cfg.enroll_failures_global,
                ..Default::default()
            },
            ..RuntimeConfig::default()
        },
        body_limit: cfg.body_limit,
        request_timeout: Duration::from_secs(cfg.request_timeout_secs),
    };
    let server = Server::start(settings.clone()).await?;
    if let Some(file) = &server.admin_token_file {
        // The path only: the token itself never goes to the log.
        eprintln!("admin token written to {}", file.display());
    }
    tracing::info!(addr = %server.addr, backend = server.app.store.backend().name(), workspace = %settings.workspace.display(), "mira listening");
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

fn main() -> ExitCode {
    // A PID namespace's supervisor or init started as this binary: its loop, never returning.
    mira_sandbox::child::run_helper_if_asked();
    // Before the runtime starts its threads (see the function's docs).
    mira::limits::tune_allocator();
    tune_mimalloc();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run());
    // Blocking work that cannot be interrupted (a write to a PTY nobody reads) must not keep
    // the process alive after a clean shutdown.
    runtime.shutdown_timeout(Duration::from_secs(2));
    code
}

async fn run() -> ExitCode {
    mira::net::install_tls_provider();
    let cli = Cli::parse();
    let json_logs = matches!(&cli.command, Command::Serve(c) if c.log_format == "json");
    let traces = init_tracing(json_logs);
    let result = match cli.command {
        Command::Serve(cfg) => serve(*cfg).await,
        Command::Runner(args) => {
            return match mira_runner::cli::run(args).await {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("mira runner: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Verify(args) => return mira::verify::run(args).await,
        Command::McpStdio(args) => mira::mcp_server::bridge::run(args).await,
        Command::Migrate(storage) => server::open_store(&storage.data_dir, &storage.url()).await.map(|_| {
            eprintln!("migrations applied");
        }),
        Command::User { command: UserCommand::Create { name, admin, approver, storage } } => {
            async {
                let store = server::open_store(&storage.data_dir, &storage.url()).await?;
                let (user, token) = mira::http::users::create(&store, &name, mira::store::Roles { admin, approver })
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                println!("{}", serde_json::json!({"user": user, "token": token}));
                Ok(())
            }
            .await
        }
        Command::Bench { command: BenchCommand::Invocations(opts) } => bench::invocations::run(opts).await,
        Command::Bench { command: BenchCommand::Mcp(opts) } => bench::mcp::run(opts).await,
        Command::Bench { command: BenchCommand::Exposure(args) } => {
            let ExposureArgs {
                tools,
                queries,
                sample,
                seed,
                ranker,
                fusion,
                series,
                series_turns,
                dump,
                steps,
                history,
                history_rule,
                history_mismatched,
                embedding,
            } = *args;
            async {
                use mira::exposure::hybrid::{Fusion, Mode};
                let modes = match ranker {
                    RankerArg::Lexical => vec![Mode::Lexical],
                    RankerArg::Dense => vec![Mode::Dense],
                    RankerArg::Hybrid => vec![Mode::Hybrid],
                    RankerArg::All => vec![Mode::Lexical, Mode::Dense, Mode::Hybrid],
                };
                let fusions = fusion
                    .iter()
                    .map(|f| Fusion::parse(f))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(anyhow::Error::msg)?;
                bench::exposure::run_exposure(bench::exposure::ExposureBench {
                    tools,
                    queries,
                    sample,
                    seed,
                    modes,
                    fusions,
                    series: series.into_iter().filter(|n| *n > 0).collect(),
                    series_turns,
                    steps,
                    history,
                    history_rules: history_rule
                        .iter()
                        .map(|r| bench::exposure::parse_rule(r))
                        .collect::<anyhow::Result<Vec<_>>>()?,
                    history_mismatched,
                    dump,
                    embedding: embedding.config(),
                })
                .await
            }
            .await
        }
        Command::Bench { command: BenchCommand::Codegraph(opts) } => bench::codegraph::run(opts).await,
        Command::Bench { command: BenchCommand::Expert(opts) } => bench::expert::run(opts).await,
        Command::Bench { command: BenchCommand::McpServer(opts) } => bench::mcp_server::run(opts).await,
        Command::Bench { command: BenchCommand::News(opts) } => bench::news::run(opts).await,
        Command::Bench { command: BenchCommand::Terminal(opts) } => bench::terminal::run(opts).await,
        Command::Bench { command: BenchCommand::Sse(opts) } => bench::sse::run(opts).await,
        Command::Bench { command: BenchCommand::Soak(opts) } => bench::soak::run(opts).await,
        Command::Bench { command: BenchCommand::Runner(opts) } => bench::runner::run(opts).await,
        Command::Bench { command: BenchCommand::Browser(opts) } => bench::browser::run(opts).await,
        Command::Bench { command: BenchCommand::Fairness(opts) } => bench::fairness::run(opts).await,
        Command::Openapi => {
            serde_json::to_string_pretty(&mira::http::openapi()).map(|s| println!("{s}")).map_err(Into::into)
        }
    };
    if let Some(provider) = traces {
        // Sends the last batch (bounded by the exporter's timeout).
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
