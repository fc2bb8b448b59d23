//! [`Runner`]: checks a signed job and runs it with the very same Read and Edit tools the
//! control plane runs on its host ([`mira_tools`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ed25519_dalek::VerifyingKey;
use mira_core::commit::CommitGate;
use mira_core::error_code::ErrorCode;
use mira_core::remote::{
    Advertised, AdvertisedWorkspace, JobOutcome, JobPhase, JobResult, RUNNER_CAPABILITIES, SignedJob,
    TERMINAL_CAPABILITY,
};
use mira_core::tool::{ExecContext, PrepareContext, Tool, ToolError};
use mira_core::workspace::{HardLinks, Workspace};
use tokio_util::sync::CancellationToken;

use crate::confirm::Confirmer;
use crate::journal::Journal;
use crate::sandbox::DeviceSandbox;
use crate::terminal::{DeviceTerminal, Uplink};

/// A device's runner: its identity, the control plane key it pinned, its local policy (the
/// workspace folders it was given, and whether a person confirms each approved job) and its
/// tools.
pub struct Runner {
    device_id: String,
    server_key: VerifyingKey,
    workspaces: Vec<PathBuf>,
    tools: HashMap<String, Arc<dyn Tool>>,
    journal: Journal,
    confirm: Option<Confirmer>,
    terminal: Option<(Arc<Uplink>, Arc<DeviceTerminal>)>,
    sandbox: Option<Arc<DeviceSandbox>>,
    browser: Option<Arc<crate::browser::DeviceBrowser>>,
}

impl Runner {
    /// A runner for `device_id` trusting jobs signed by `server_key`, working only in
    /// `workspaces` (each must be an existing folder; kept canonical), journaling in
    /// `journal`.
    pub fn new(
        device_id: &str,
        server_key: VerifyingKey,
        workspaces: &[PathBuf],
        journal: Journal,
    ) -> anyhow::Result<Self> {
        let mut roots = Vec::new();
        for w in workspaces {
            let root = std::fs::canonicalize(w).map_err(|e| anyhow::anyhow!("workspace {}: {e}", w.display()))?;
            if !root.is_dir() {
                anyhow::bail!("workspace {} is not a folder", root.display());
            }
            roots.push(root);
        }
        let tools = mira_tools::read_and_edit().into_iter().map(|t| (t.spec().id.clone(), t)).collect();
        Ok(Self {
            device_id: device_id.to_owned(),
            server_key,
            workspaces: roots,
            tools,
            journal,
            confirm: None,
            terminal: None,
            sandbox: None,
            browser: None,
        })
    }

    /// Asks `confirm` before running each execution that arrives with an approval
    /// (`--confirm`); a declined one runs nothing and ends with `job_declined`.
    #[must_use]
    pub fn with_confirmation(mut self, confirm: Confirmer) -> Self {
        self.confirm = Some(confirm);
        self
    }

    /// Runs `terminal_session` here in `sandbox`, streaming its output through `uplink`,
    /// when this machine can open a PTY (only then is `pty` advertised). The sandbox's state
    /// is advertised either way.
    #[must_use]
    pub fn with_terminal(mut self, uplink: Arc<Uplink>, sandbox: Arc<DeviceSandbox>) -> Self {
        self.sandbox = Some(sandbox.clone());
        if crate::terminal::pty_works() {
            let terminal = Arc::new(DeviceTerminal::new(uplink.clone(), sandbox));
            self.tools.insert(terminal.spec().id.clone(), terminal.clone());
            self.terminal = Some((uplink, terminal));
        } else {
            tracing::warn!("no PTY can be opened here: terminal_session is not offered");
        }
        self
    }

    /// Carries DevTools messages to `browser` (`--attach-browser`); `browser` is advertised.
    #[must_use]
    pub fn with_browser(mut self, browser: Arc<crate::browser::DeviceBrowser>) -> Self {
        self.browser = Some(browser);
        self
    }

    /// The attached browser, when this runner carries one.
    pub fn browser(&self) -> Option<&Arc<crate::browser::DeviceBrowser>> {
        self.browser.as_ref()
    }

    /// The server key jobs and DevTools frames are signed with.
    pub fn server_key(&self) -> VerifyingKey {
        self.server_key
    }

    /// The terminal's uplink, when this runner runs terminal sessions.
    pub fn uplink(&self) -> Option<&Arc<Uplink>> {
        self.terminal.as_ref().map(|t| &t.0)
    }

    /// Ends every terminal session of this runner (it is stopping).
    pub fn end_terminals(&self, reason: &str) {
        if let Some((_, t)) = &self.terminal {
            t.end_all(reason);
        }
    }

    /// The device id.
    pub fn device_id(&self) -> &str {
        &self.device_id
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// What this runner advertises: capabilities, tool ids, workspace folders, version.
    pub fn advertised(&self) -> Advertised {
        let mut tools: Vec<String> = self.tools.keys().cloned().collect();
        tools.sort();
        Advertised {
            capabilities: RUNNER_CAPABILITIES
                .iter()
                .copied()
                .chain(self.terminal.as_ref().map(|_| TERMINAL_CAPABILITY))
                .chain(self.browser.as_ref().map(|_| mira_core::remote::BROWSER_CAPABILITY))
                .map(str::to_owned)
                .collect(),
            tools,
            workspaces: self
                .workspaces
                .iter()
                .map(|w| AdvertisedWorkspace { path: w.to_string_lossy().into_owned() })
                .collect(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            sandbox: self.sandbox.as_ref().map(|s| s.advertised()),
        }
    }

    /// The local policy: `path` must be one of the workspace folders this runner was given.
    fn workspace(&self, path: &str) -> Result<Workspace, ToolError> {
        let refused = || {
            ToolError::new(
                ErrorCode::DeviceWorkspaceRefused,
                format!(
                    "this runner was not given the folder {path} (its --workspace folders decide); nothing was run"
                ),
            )
            .with_details(serde_json::json!({"workspace": path}))
        };
        let given = std::fs::canonicalize(Path::new(path)).map_err(|_| refused())?;
        if given.as_os_str() != path || !self.workspaces.contains(&given) {
            return Err(refused());
        }
        let ws = Workspace::open(&given).map_err(|e| {
            ToolError::new(ErrorCode::WorkspaceUnavailable, format!("the workspace {path} cannot be opened: {e}"))
        })?;
        Ok(ws.with_hard_links(HardLinks::Refuse).with_node(&self.device_id))
    }

    /// Checks and runs one signed job; the result to send back (also journaled for an
    /// execution). Every refusal runs nothing.
    pub async fn handle(&self, job: &SignedJob) -> JobResult {
        let peek = job.peek();
        let nonce = peek.as_ref().map(|e| e.nonce.clone()).unwrap_or_default();
        let invocation_id = peek.as_ref().map(|e| e.invocation_id.clone()).unwrap_or_default();
        // Set once this job marked its execution started: only then is the result its own to
        // journal (a forged or replayed job naming a real invocation never touches that
        // invocation's journaled result).
        let mut started = false;
        let outcome = match self.check_and_run(job, &mut started).await {
            Ok(outcome) => outcome,
            Err(error) => JobOutcome::Error { error },
        };
        let result = JobResult { nonce, invocation_id, outcome, late: false };
        if started && let Err(e) = self.journal.finish(&result) {
            tracing::error!(error = %e, invocation = %result.invocation_id, "the result could not be journaled");
        }
        result
    }

    async fn check_and_run(&self, job: &SignedJob, started: &mut bool) -> Result<JobOutcome, ToolError> {
        let env = job.open(&self.server_key, &self.device_id, &mira_core::ids::now())?;
        self.journal.accept_nonce(&env.nonce, &env.expires_at)?;
        let workspace = self.workspace(&env.workspace)?;
        let tool = self.tools.get(&env.tool_id).cloned().ok_or_else(|| {
            ToolError::new(ErrorCode::NotRegistered, format!("this runner does not implement {}", env.tool_id))
        })?;
        tracing::info!(phase = ?env.phase, tool = %env.tool_id, invocation = %env.invocation_id, "job");
        let ctx = PrepareContext { workspace: Some(&workspace), owner_id: &env.owner_id, run_id: &env.run_id };
        match env.phase {
            JobPhase::Prepare => {
                let p = tool.prepare(env.input, &ctx).await?;
                Ok(JobOutcome::Prepared { input: p.input, preview: p.preview })
            }
            JobPhase::Canonicalize => Ok(JobOutcome::Canonical { input: tool.canonicalize(env.input, &ctx).await? }),
            JobPhase::Execute => {
                if let (Some(confirm), Some(approval_id)) = (&self.confirm, env.approval_id.as_deref()) {
                    // A replayed execution is refused before anyone is asked about it.
                    self.journal.not_started(&env.invocation_id)?;
                    if let Err(declined) = confirm.ask(&env, approval_id).await {
                        // Journaled as started (and its refusal as its result): a declined
                        // execution is never run later, whatever job names it again.
                        self.journal.start(&env.invocation_id, &env.nonce, &env.expires_at)?;
                        *started = true;
                        return Err(declined);
                    }
                }
                self.journal.start(&env.invocation_id, &env.nonce, &env.expires_at)?;
                *started = true;
                let ctx = ExecContext {
                    workspace: Some(workspace),
                    owner_id: env.owner_id,
                    run_id: env.run_id,
                    invocation_id: env.invocation_id,
                    cancel: CancellationToken::new(),
                    commit: CommitGate::new(),
                };
                Ok(JobOutcome::Output { output: tool.execute(&env.input, &ctx).await? })
            }
        }
    }
}
