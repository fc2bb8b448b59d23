//! The command line, shared by `mira runner …` and the standalone `mira-runner …`:
//!
//! - `enroll --server URL --code CODE`: generates the device key pair (Ed25519) here,
//!   registers the public key with the one-time code and pins the control plane's key.
//! - `--server URL --workspace DIR [--workspace DIR…]` (no subcommand): connects outbound
//!   and runs jobs in those folders until stopped (exit 0), or until the device is revoked
//!   (exit 3). With `--confirm` a person at the device confirms each job that arrives with
//!   an approval ([`crate::confirm`]). Terminal sessions run in the device's sandbox
//!   (`--sandbox auto|landlock|off`, `--allow-unsandboxed`; [`crate::sandbox`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use mira_core::remote::{EnrollAnswer, EnrollRequest};
use tokio_util::sync::CancellationToken;

use crate::confirm::{ConfirmInput, Confirmer};
use crate::connection::Connector;
use crate::journal::{Journal, PRUNE_EVERY};
use crate::runner::Runner;
use crate::sandbox::{DeviceSandbox, SandboxMode};
use crate::state;
use crate::terminal::Uplink;

/// Exit status of a runner whose device was revoked (or whose key is refused).
pub const EXIT_REFUSED: u8 = 3;

/// `mira runner` arguments.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RunnerArgs {
    /// Enroll this machine (once).
    #[command(subcommand)]
    pub command: Option<RunnerCommand>,
    /// Run: connect and execute jobs.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands of `mira runner`.
#[derive(clap::Subcommand, Debug)]
pub enum RunnerCommand {
    /// Generate this device's key pair and register it with a one-time enrollment code
    /// (from `POST /v1/devices`).
    Enroll(EnrollArgs),
}

/// `mira runner enroll` arguments.
#[derive(clap::Args, Debug)]
pub struct EnrollArgs {
    /// The control plane's base URL.
    #[arg(long)]
    pub server: String,
    /// The one-time enrollment code.
    #[arg(long, env = "MIRA_ENROLLMENT_CODE")]
    pub code: String,
    /// State directory (key, enrollment, journal).
    #[arg(long, env = "MIRA_RUNNER_DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `mira runner --server … --workspace …` arguments.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The control plane's base URL (default: the one enrolled with).
    #[arg(long)]
    pub server: Option<String>,
    /// A folder jobs may work in (repeatable); every other folder is refused.
    #[arg(long = "workspace")]
    pub workspaces: Vec<PathBuf>,
    /// State directory (key, enrollment, journal).
    #[arg(long, env = "MIRA_RUNNER_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Ask here before running each job that arrives with an approval (tool, input hash,
    /// input, approval id are shown); only `y` runs it, anything else declines it
    /// (`job_declined`, nothing run).
    #[arg(long)]
    pub confirm: bool,
    /// Seconds `--confirm` waits for an answer before it declines the job.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub confirm_timeout_secs: u64,
    /// Where `--confirm` reads answers: `auto` (/dev/tty when there is one, else standard
    /// input), `tty` or `stdin`.
    #[arg(long, value_enum, default_value_t = ConfirmInput::Auto)]
    pub confirm_input: ConfirmInput,
    /// The sandbox of terminal sessions: `auto` (a private view of the filesystem when this
    /// machine allows it, else Landlock alone), `landlock` (Landlock alone) or `off`.
    /// Sessions are refused when it is not enforced, unless `--allow-unsandboxed`.
    #[arg(long = "sandbox", env = "MIRA_RUNNER_SANDBOX", value_enum, default_value_t = SandboxMode::Auto)]
    pub sandbox: SandboxMode,
    /// Run terminal sessions unsandboxed (as this user, with its rights) when the sandbox is
    /// off or this machine cannot sandbox.
    #[arg(long = "allow-unsandboxed", env = "MIRA_RUNNER_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// Extra folders sandboxed sessions may read and execute from (repeatable, or
    /// colon-separated), e.g. toolchains under your HOME such as `~/.cargo` or `~/.nvm`.
    #[arg(long = "sandbox-read", env = "MIRA_RUNNER_SANDBOX_READ", value_delimiter = ':')]
    pub sandbox_read: Vec<PathBuf>,
    /// The debugging address of a Chromium on this device to offer as the owner's attached
    /// browser (`http://127.0.0.1:9222`; loopback only, it never leaves the device): the
    /// runner advertises `browser` and carries the control plane's DevTools messages to it,
    /// each checked against the method allow-list here too.
    #[arg(long = "attach-browser", env = "MIRA_RUNNER_ATTACH_BROWSER")]
    pub attach_browser: Option<String>,
}

/// Logs to standard error (`RUST_LOG`, default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn client() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10)).build()?)
}

/// Runs the command on a new Tokio runtime; the exit status.
pub fn main(args: RunnerArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mira runner: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mira runner: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command.
pub async fn run(args: RunnerArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(RunnerCommand::Enroll(e)) => enroll(e).await.map(|()| ExitCode::SUCCESS),
        None => connect(args.run).await,
    }
}

async fn enroll(args: EnrollArgs) -> anyhow::Result<()> {
    let dir = args.state_dir.unwrap_or_else(state::default_dir);
    if dir.join(state::DEVICE_FILE).exists() {
        anyhow::bail!("{} already holds an enrolled device; use another --state-dir", dir.display());
    }
    state::ensure_dir(&dir)?;
    // A key left by an enrollment that failed is replaced: it was never registered.
    let _ = std::fs::remove_file(dir.join(state::KEY_FILE));
    let key = state::new_key(&dir)?;
    let body = EnrollRequest { code: args.code, public_key: mira_core::remote::public_hex(&key) };
    let url = format!("{}/v1/runner/enroll", args.server.trim_end_matches('/'));
    let resp = client()?.post(&url).json(&body).send().await.with_context(|| format!("POST {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        anyhow::bail!("enrollment refused ({status}): {text}");
    }
    let answer: EnrollAnswer = resp.json().await?;
    state::save_enrolled(
        &dir,
        &state::Enrolled {
            server: args.server.clone(),
            device_id: answer.device_id.clone(),
            name: answer.name.clone(),
            server_public_key: answer.server_public_key,
        },
    )?;
    println!("enrolled device {} ({}) with {}; state in {}", answer.device_id, answer.name, args.server, dir.display());
    Ok(())
}

/// Prunes the journal now (a failure is logged: pruning only saves space).
fn prune(journal: &Journal) {
    match journal.prune(&mira_core::ids::now()) {
        Ok(p) => tracing::debug!(nonces = p.nonces, executions = p.executions, "journal pruned"),
        Err(e) => tracing::warn!(error = %e, "the journal could not be pruned"),
    }
}

async fn connect(args: RunArgs) -> anyhow::Result<ExitCode> {
    let dir = args.state_dir.unwrap_or_else(state::default_dir);
    let key = state::load_key(&dir)?;
    let (enrolled, server_key) = state::load_enrolled(&dir)?;
    if args.workspaces.is_empty() {
        anyhow::bail!("give at least one --workspace folder");
    }
    let server = args.server.unwrap_or(enrolled.server);
    let journal = Journal::open(&dir.join("journal")).context("opening the journal")?;
    prune(&journal);
    let mut runner = Runner::new(&enrolled.device_id, server_key, &args.workspaces, journal.clone())?;
    if args.confirm {
        let timeout = std::time::Duration::from_secs(args.confirm_timeout_secs);
        runner = runner.with_confirmation(Confirmer::new(args.confirm_input, timeout)?);
    }
    let client = client()?;
    if let Some(endpoint) = &args.attach_browser {
        let addr = crate::browser::parse_endpoint(endpoint)?;
        let browser = crate::browser::DeviceBrowser::new(
            addr,
            &enrolled.device_id,
            runner.server_key(),
            &server,
            client.clone(),
        )?;
        runner = runner.with_browser(Arc::new(browser));
    }
    let (mode, allow, device) = (args.sandbox, args.allow_unsandboxed, enrolled.device_id.clone());
    let state_dir = dir.clone();
    let read = args.sandbox_read.clone();
    let sandbox =
        tokio::task::spawn_blocking(move || DeviceSandbox::new(mode, allow, &state_dir, &device).with_read_only(&read))
            .await
            .context("probing the sandbox")?;
    let runner = Arc::new(runner.with_terminal(Arc::new(Uplink::new(&server, client.clone())), Arc::new(sandbox)));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PRUNE_EVERY).await;
            prune(&journal);
        }
    });
    let connector = Arc::new(Connector::new(&server, key, runner.clone(), client));
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => None } } => {}
        }
        signal.cancel();
    });
    tracing::info!(device = %enrolled.device_id, server = %server, "runner starting");
    let refused = connector.run(stop).await;
    runner.end_terminals("the runner stopped");
    match refused {
        Some(why) => {
            eprintln!("mira runner: the control plane refused this device: {why}");
            Ok(ExitCode::from(EXIT_REFUSED))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}
