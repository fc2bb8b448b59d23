//! The tool interface every implementation provides.

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::availability::{Availability, AvailabilityContext};
use crate::error_code::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::workspace::Workspace;

/// What sort of implementation a registry entry is (the contract's six kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A core tool of the public surface.
    Public,
    /// An internal primitive, never shown to the Planner.
    Internal,
    /// An old call shape kept for compatibility; maps onto a public tool.
    Legacy,
    /// A dynamic capability (browser, mail, GitHub…) that joins the surface when registered.
    Dynamic,
    /// An External MCP tool projected as `mcp:<serverId>:tool:<toolName>`.
    McpProjection,
    /// A tool private to a skill's runtime; never in a main-Planner exposure.
    SkillPrivate,
}

/// The static description of a tool.
#[derive(Debug, Clone, Serialize)]
pub struct ToolSpec {
    /// Stable id, e.g. `read_open` or `mcp:srv_…:tool:search`.
    pub id: String,
    /// Kind of implementation.
    pub kind: ToolKind,
    /// Capability domain: `read`, `edit`, `search`, `terminal`, `mcp`, …
    pub domain: String,
    /// Short human title.
    pub title: String,
    /// What the tool does, as shown to the model.
    pub description: String,
    /// JSON Schema of the input.
    pub input_schema: Value,
    /// When true every call waits for an exact-invocation approval. Nothing in the input can
    /// lower this.
    pub requires_approval: bool,
    /// Device capability the tool needs (`fs.read`, `fs.write`, `pty`, `net`), if any.
    pub capability: Option<String>,
    /// For legacy entries: the public tool that replaces it.
    pub replacement: Option<String>,
    /// For per-user tools (MCP projections, a user's dynamic capabilities): the owner.
    /// None = every user.
    pub owner: Option<String>,
}

impl ToolSpec {
    /// Whether `user_id` can see this registry entry at all.
    pub fn visible_to(&self, user_id: &str) -> bool {
        self.owner.as_deref().is_none_or(|o| o == user_id)
    }

    /// Whether the tool works inside the run's workspace folder: its capability is one of
    /// [`WORKSPACE_CAPABILITIES`] (`fs.read`, `fs.write`, `pty`). Only such a tool is handed
    /// the folder to prepare and execute a call in ([`PrepareContext::workspace`],
    /// [`ExecContext::workspace`]); every other tool (network, MCP, mail, browser…) is
    /// prepared and run without it: the executor does not read the run again nor open the
    /// folder for it, and the folder's state (a replaced root) does not stop it.
    ///
    /// [`WORKSPACE_CAPABILITIES`]: crate::availability::WORKSPACE_CAPABILITIES
    pub fn works_in_workspace(&self) -> bool {
        self.capability.as_deref().is_some_and(|c| crate::availability::WORKSPACE_CAPABILITIES.contains(&c))
    }
}

/// The error of a tool asking for a workspace it was not handed: it does not declare a
/// workspace capability ([`ToolSpec::works_in_workspace`]). A defect of the tool, never of
/// the call: `workspace_unavailable`.
fn no_workspace() -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceUnavailable,
        "this tool was given no workspace folder: it declares no workspace capability (fs.read, fs.write, pty)",
    )
}

/// A tool's error: a stable code, a sentence, details. At freeze time it becomes an HTTP
/// error with its code's status ([`ErrorCode::status`]); during execution it becomes the
/// invocation's `result.error`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ToolError {
    /// Stable code (`outside_workspace`, `binary_file`, `stale_target`…).
    pub code: ErrorCode,
    /// Human sentence.
    pub message: String,
    /// Structured details (may be `null`).
    pub details: Value,
}

impl ToolError {
    /// A new error without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: Value::Null }
    }

    /// Adds details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Canonical input plus what the approver should see.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The canonical input that is frozen and hashed (defaults filled, paths normalised,
    /// cwd resolved…).
    pub input: Value,
    /// Extra facts for the approval view (a diff preview, the real cwd…); `null` if none.
    pub preview: Value,
}

/// A tool's successful output and the evidence it yields.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ToolOutput {
    /// The result the Planner reads.
    pub output: Value,
    /// Citable facts, stored with the result.
    pub evidence: Vec<EvidenceDraft>,
}

/// What canonicalisation may look at: the run's workspace and who is calling.
pub struct PrepareContext<'a> {
    /// The run's workspace on this host; None for a tool that does not work in it
    /// ([`ToolSpec::works_in_workspace`]). Read it through [`PrepareContext::workspace`].
    pub workspace: Option<&'a Workspace>,
    /// The calling user.
    pub owner_id: &'a str,
    /// The run.
    pub run_id: &'a str,
}

impl<'a> PrepareContext<'a> {
    /// The run's workspace. Errors: `workspace_unavailable` for a tool that declares no
    /// workspace capability ([`ToolSpec::works_in_workspace`]), which is given none.
    pub fn workspace(&self) -> Result<&'a Workspace, ToolError> {
        self.workspace.ok_or_else(no_workspace)
    }
}

/// Everything an execution may use.
pub struct ExecContext {
    /// The run's workspace on this host, opened by identity; None for a tool that does not
    /// work in it ([`ToolSpec::works_in_workspace`]). Read it through
    /// [`ExecContext::workspace`].
    pub workspace: Option<Workspace>,
    /// Owner of the invocation.
    pub owner_id: String,
    /// The run.
    pub run_id: String,
    /// The invocation being executed.
    pub invocation_id: String,
    /// Cancelled when the invocation must stop (a cancel, the time limit, the server
    /// stopping) and stopping it is still possible (see [`crate::commit`]).
    pub cancel: CancellationToken,
    /// Decides between this call's commit point and a stop request.
    pub commit: crate::commit::CommitGate,
}

impl ExecContext {
    /// The run's workspace. Errors: `workspace_unavailable` for a tool that declares no
    /// workspace capability ([`ToolSpec::works_in_workspace`]), which is given none.
    pub fn workspace(&self) -> Result<&Workspace, ToolError> {
        self.workspace.as_ref().ok_or_else(no_workspace)
    }

    /// Marks the commit point of a [`crate::commit::SideEffects::AtCommitPoint`] tool: call it
    /// right before the irreversible step (the Edit tools' rename). An error means a stop won
    /// first: the tool must not make its change, undo what it prepared and return the error.
    pub fn commit(&self) -> Result<(), ToolError> {
        self.commit.pass()
    }
}

/// One implementation in the registry.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The static description.
    fn spec(&self) -> &ToolSpec;

    /// Tool-specific availability beyond device capabilities (connections, providers…).
    fn availability(&self, _ctx: &AvailabilityContext) -> Availability {
        Availability::Available
    }

    /// Turns schema-valid input into the canonical input that will be frozen. Runs before
    /// the hash is taken, so anything resolved here (defaults, normalised paths, real cwd)
    /// is part of what an approval covers. The default keeps the input as given.
    async fn prepare(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        Ok(Prepared { input, preview: Value::Null })
    }

    /// The canonical input of a retried call: the run already froze this `tool_call_id` for
    /// this tool, and the result is only compared with the frozen hash (no approval is
    /// created, nothing runs). It must equal what [`Tool::prepare`] returned for the same raw
    /// input, without depending on state the frozen call itself may since have changed —
    /// an edit's `expected_sha256` no longer holds once the edit ran, a moved file is gone —
    /// so that a replay of the same triple stays an idempotent 200. Tools whose `prepare`
    /// checks the world override this with the pure part of their canonicalisation; the
    /// default runs `prepare`.
    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        Ok(self.prepare(input, ctx).await?.input)
    }

    /// The canonical input of a retried call, from [`Tool::canonicalize`]'s `canonical` and
    /// the input `frozen` for that call earlier: carries over what `prepare` derived from the
    /// world rather than from the caller's input — an Edit tool's `precondition`, the state
    /// of its target when the preview was made — so the replay's hash equals the frozen one
    /// exactly when the caller sent the same input. The default keeps `canonical`.
    fn replay_input(&self, canonical: Value, _frozen: &Value) -> Value {
        canonical
    }

    /// What stopping a running call of this tool means (see [`crate::commit`]).
    /// Default: tools that run without approval only read ([`SideEffects::None`]); every
    /// other tool may act from its start ([`SideEffects::FromStart`]). Tools that mark a
    /// commit point with [`ExecContext::commit`] return [`SideEffects::AtCommitPoint`].
    ///
    /// [`SideEffects::None`]: crate::commit::SideEffects::None
    /// [`SideEffects::FromStart`]: crate::commit::SideEffects::FromStart
    /// [`SideEffects::AtCommitPoint`]: crate::commit::SideEffects::AtCommitPoint
    fn side_effects(&self) -> crate::commit::SideEffects {
        if crate::policy::requires_approval(self.spec()) {
            crate::commit::SideEffects::FromStart
        } else {
            crate::commit::SideEffects::None
        }
    }

    /// Executes a frozen, policy-cleared invocation. Only the harness calls this.
    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError>;
}
