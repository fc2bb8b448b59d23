//! [`RemoteExecutor`]: the harness's executor that sends the work of runs bound to a device
//! to that device's runner, and [`DeviceTools`]: the freeze's canonicalisation on the device.

use std::sync::Arc;

use async_trait::async_trait;
use mira_core::remote::{JobOutcome, JobPhase};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{DeviceHub, Holder, JobSpec};
use crate::cluster::forward::forward_execute;
use crate::error::ErrorCode;
use crate::harness::{CommitGate, Executor};
use crate::registry::{Entry, Prepared, ToolError, ToolOutput};
use crate::store::{InvocationRow, SessionLaunch, SessionOrigin, Store, TerminalSessionRow};
use crate::workspace::Workspace;

/// Whether a tool with `capability` works in the run's workspace, so that on a run bound to
/// a device it executes on that device.
pub fn runs_on_device(capability: Option<&str>) -> bool {
    capability.is_some_and(|c| mira_core::availability::WORKSPACE_CAPABILITIES.contains(&c))
}

/// Adds `device_id` to the provenance of each piece of evidence: which device ran the call.
pub fn stamp_device(mut output: ToolOutput, device_id: &str) -> ToolOutput {
    for e in &mut output.evidence {
        if let Some(obj) = e.provenance.as_object_mut() {
            obj.insert("device_id".to_owned(), json!(device_id));
        } else {
            e.provenance = json!({"device_id": device_id, "provenance": e.provenance.take()});
        }
    }
    output
}

fn unexpected(phase: &str) -> ToolError {
    ToolError::new(ErrorCode::Internal, format!("the runner answered a {phase} job with another kind of outcome"))
}

/// Most runs whose device binding [`RemoteExecutor`] keeps (the map is emptied when full).
const RUN_DEVICE_CACHE: usize = 4096;

/// Executes on the run's device when the run is bound to one and the tool works in its
/// workspace; everything else goes to `inner` (the host, or the replica owning a terminal).
pub struct RemoteExecutor {
    inner: Arc<dyn Executor>,
    hub: Arc<DeviceHub>,
    store: Store,
    /// Each recent run's device (None: the server host). A run's device never changes after
    /// it is created, so the binding is read once per run, not once per call.
    run_devices: parking_lot::Mutex<std::collections::HashMap<String, Option<String>>>,
    /// The host's `terminal_session`, which reads a device session's stored output (its
    /// `output` action never reaches the device).
    terminal: Option<Arc<crate::tools::terminal::TerminalSession>>,
}

impl RemoteExecutor {
    /// Wraps `inner`; device work goes through `hub`.
    pub fn new(inner: Arc<dyn Executor>, hub: Arc<DeviceHub>, store: Store) -> Self {
        Self { inner, hub, store, run_devices: Default::default(), terminal: None }
    }

    /// Reads device sessions' stored output with `terminal` (the `output` action).
    #[must_use]
    pub fn with_terminal(mut self, terminal: Arc<crate::tools::terminal::TerminalSession>) -> Self {
        self.terminal = Some(terminal);
        self
    }

    /// The device run `inv.run_id` is bound to (None: the server host), from the cache or the
    /// store.
    async fn device_of(&self, inv: &InvocationRow) -> Result<Option<String>, ToolError> {
        if let Some(device) = self.run_devices.lock().get(&inv.run_id) {
            return Ok(device.clone());
        }
        let run = self
            .store
            .run_for(&inv.owner_id, &inv.run_id)
            .await
            .map_err(|e| ToolError::new(ErrorCode::WorkspaceUnavailable, e.to_string()))?
            .ok_or_else(|| ToolError::new(ErrorCode::WorkspaceUnavailable, format!("run {} is gone", inv.run_id)))?;
        let device = run.device_id.filter(|d| d != crate::availability::LOCAL_DEVICE_ID);
        let mut cache = self.run_devices.lock();
        if cache.len() >= RUN_DEVICE_CACHE {
            cache.clear();
        }
        cache.insert(inv.run_id.clone(), device.clone());
        Ok(device)
    }
}

/// Runs the execution of `inv` on `device`'s runner through this process's connection
/// ([`DeviceHub::job`]): the local half of [`RemoteExecutor`], and what a replica holding the
/// device runs for an execution forwarded to it (`/internal/v1/execute`). A
/// `terminal_session` action keeps its session's books here ([`terminal_on_device`]).
/// `commit` is passed when the caller has not yet reached its commit point (the device acts
/// from the moment it has the job). Errors: `device_offline` when this process does not hold
/// a live connection of the device (nothing sent), the job's own errors ([`DeviceHub::job`]),
/// `internal` for a terminal `output` (read from the store by the claiming replica, never
/// sent to a device).
pub async fn execute_on_device(
    hub: &DeviceHub,
    store: &Store,
    inv: &InvocationRow,
    device: &str,
    input: &Value,
    cancel: &CancellationToken,
    commit: Option<CommitGate>,
) -> Result<ToolOutput, ToolError> {
    let spec = execute_spec(store, inv, input).await?;
    if inv.tool_id == TERMINAL_TOOL && action_of(input) == "output" {
        return Err(ToolError::new(
            ErrorCode::Internal,
            "a terminal output action is read from the store by the replica that claimed it; it never reaches a device",
        ));
    }
    if let Some(commit) = commit {
        commit.commit().map_err(|reason| reason.error("stopped before it was sent to the device; nothing was run"))?;
    }
    if inv.tool_id == TERMINAL_TOOL {
        return terminal_on_device(hub, store, inv, device, spec, cancel).await;
    }
    match hub.job(device, spec, cancel).await? {
        JobOutcome::Output { output } => Ok(stamp_device(output, device)),
        JobOutcome::Error { error } => Err(error),
        _ => Err(unexpected("execute")),
    }
}

/// The `action` of a `terminal_session` input.
fn action_of(input: &Value) -> &str {
    input.get("action").and_then(Value::as_str).unwrap_or_default()
}

/// What the frozen `start` input of a device session launches (the device resolved its
/// cwd and environment at the freeze); the tool's defaults where a field is missing.
fn launch_of(input: &Value) -> SessionLaunch {
    use crate::tools::terminal::{DEFAULT_COLS, DEFAULT_ROWS, DEFAULT_TIMEOUT_MS};
    let text = |k: &str| input.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let size = |k: &str, d: u64| {
        u16::try_from(input.get(k).and_then(Value::as_u64).unwrap_or(d)).unwrap_or(u16::try_from(d).unwrap_or(u16::MAX))
    };
    SessionLaunch {
        command: text("command"),
        args: input
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default(),
        cwd: text("cwd"),
        env: input.get("env").and_then(Value::as_object).cloned().unwrap_or_default(),
        cols: size("cols", DEFAULT_COLS),
        rows: size("rows", DEFAULT_ROWS),
        timeout_ms: input.get("timeout_ms").and_then(Value::as_u64).unwrap_or(DEFAULT_TIMEOUT_MS),
    }
}

/// The execute job of `inv` (its run's workspace, its approval): what the device is sent.
async fn execute_spec(store: &Store, inv: &InvocationRow, input: &Value) -> Result<JobSpec, ToolError> {
    let unavailable = |msg: String| ToolError::new(ErrorCode::WorkspaceUnavailable, msg);
    let store_error = |e: crate::store::StoreError| unavailable(e.to_string());
    // The run and its workspace in one round trip.
    let scope = store
        .run_scope_for(&inv.owner_id, &inv.run_id, None)
        .await
        .map_err(store_error)?
        .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
    let ws = scope.workspace.ok_or_else(|| unavailable(format!("workspace {} is gone", scope.run.workspace_id)))?;
    let approval_id = store.approval_id_of(&inv.id).await.map_err(store_error)?;
    Ok(JobSpec {
        phase: JobPhase::Execute,
        invocation_id: inv.id.clone(),
        run_id: inv.run_id.clone(),
        owner_id: inv.owner_id.clone(),
        tool_id: inv.tool_id.clone(),
        input: input.clone(),
        approval_id,
        workspace: ws.path,
    })
}

/// The device a run is bound to, when `inv` is a call that runs on it (its tool works in the
/// run's workspace): what `/internal/v1/execute` asks before it runs a forwarded execution.
pub async fn device_of_call(
    store: &Store,
    inv: &InvocationRow,
    capability: Option<&str>,
) -> Result<Option<String>, crate::store::StoreError> {
    if !runs_on_device(capability) {
        return Ok(None);
    }
    Ok(store
        .run_for(&inv.owner_id, &inv.run_id)
        .await?
        .and_then(|r| r.device_id)
        .filter(|d| d != crate::availability::LOCAL_DEVICE_ID))
}

#[async_trait]
impl Executor for RemoteExecutor {
    async fn execute(
        &self,
        inv: &InvocationRow,
        prepared_in: Option<Workspace>,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError> {
        if !runs_on_device(entry.spec().capability.as_deref()) {
            return self.inner.execute(inv, prepared_in, entry, input, cancel, commit).await;
        }
        let Some(device) = self.device_of(inv).await? else {
            return self.inner.execute(inv, prepared_in, entry, input, cancel, commit).await;
        };
        let device = device.as_str();
        if inv.tool_id == TERMINAL_TOOL && action_of(input) == "output" {
            // Reads the stored output, whichever replica holds the runner (it never reaches
            // the device).
            commit.commit().map_err(|reason| reason.error("stopped before the output was read"))?;
            let terminal = self
                .terminal
                .as_ref()
                .ok_or_else(|| ToolError::new(ErrorCode::Internal, "this server reads no device terminal output"))?;
            let out = terminal.device_output(input, &inv.owner_id, &inv.run_id, &inv.id, device).await?;
            return Ok(stamp_device(out, device));
        }
        let store_error = |e: crate::store::StoreError| ToolError::new(ErrorCode::StoreError, e.to_string());
        let row = self.store.device_by_id(device).await.map_err(store_error)?;
        let holder = match &row {
            Some(row) => self.hub.holder(row).await.map_err(store_error)?,
            None => Holder::Nowhere,
        };
        let Holder::Elsewhere(base) = holder else {
            // Here, or nowhere (the hub answers `device_offline`, nothing sent).
            return execute_on_device(&self.hub, &self.store, inv, device, input, &cancel, Some(commit)).await;
        };
        // Another replica holds the runner's connection: the execution (a Read or Edit call,
        // a terminal action) goes there under this claim, once; the holder keeps a terminal
        // session's books as it would for its own claim. The holder acts from the moment it
        // has it: this side's commit point is now. The request has no time limit of its own
        // (a terminal `wait` lasts up to 5 minutes; the internal route is outside the request
        // timeout): only the harness's execution limit or a cancel end it, by closing the
        // connection, which ends the holder's wait for the runner.
        commit.commit().map_err(|reason| reason.error("stopped before it was forwarded; nothing was sent"))?;
        let node = self.hub.node();
        forward_execute(self.hub.client(), node, &base, &inv.id, &node.process_id, &cancel).await.map_err(|e| {
            if e.code == ErrorCode::OutcomeUnknown && e.details.get("device_id").is_none() {
                // The holder went away with the job: it may have run on the device; it is
                // never sent again (the harness ends it `interrupted`).
                ToolError::new(
                    ErrorCode::OutcomeUnknown,
                    format!(
                        "the execution was forwarded to the replica holding device {device}'s runner, which did not answer \
                         ({}); whether it ran is unknown and it is not run again",
                        e.message
                    ),
                )
                .with_details(json!({"device_id": device, "invocation_id": inv.id}))
            } else {
                e
            }
        })
    }
}

/// The id of the terminal tool.
const TERMINAL_TOOL: &str = "terminal_session";

/// A `terminal_session` action of a device run, sent to the runner this process holds and
/// recorded here. `start`: the session's row (named by the invocation,
/// [`mira_core::remote::device_terminal_session_id`], `node_id` = the device) is recorded
/// before the job is sent, so the runner's output has somewhere to go; a start the device
/// refused or failed is recorded `failed`. Every action's reported range is recorded with a
/// `terminal.output` event, as on the host. Runs on the replica holding the runner, for its
/// own claims and for those forwarded to it.
async fn terminal_on_device(
    hub: &DeviceHub,
    store: &Store,
    inv: &InvocationRow,
    device: &str,
    spec: JobSpec,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let store_error = |e: crate::store::StoreError| ToolError::new(ErrorCode::StoreError, e.to_string());
    let input = spec.input.clone();
    let action = action_of(&input).to_owned();
    let session_id = match action.as_str() {
        "start" => {
            let id = mira_core::remote::device_terminal_session_id(&inv.id);
            let origin = SessionOrigin {
                owner_id: inv.owner_id.clone(),
                run_id: inv.run_id.clone(),
                invocation_id: inv.id.clone(),
            };
            let row = TerminalSessionRow::new_running(id.clone(), device.to_owned(), origin, launch_of(&input));
            store.insert_terminal_session(&row).await.map_err(store_error)?;
            id
        }
        _ => input.get("session_id").and_then(Value::as_str).unwrap_or_default().to_owned(),
    };
    let outcome = match hub.job(device, spec, cancel).await {
        Ok(JobOutcome::Output { output }) => Ok(output),
        Ok(JobOutcome::Error { error }) | Err(error) => Err(error),
        Ok(_) => Err(unexpected("execute")),
    };
    let output = match outcome {
        Ok(output) => output,
        Err(e) => {
            // Not run, or failed on the device: the row says so. Whether a start whose
            // outcome is unknown (the runner went away, or the call was cancelled) runs
            // is for the runner's output and the lost sweep to tell.
            if action == "start" && !matches!(e.code, ErrorCode::OutcomeUnknown | ErrorCode::Cancelled) {
                let end = crate::store::SessionEnd {
                    state: crate::state::TerminalSessionState::Failed,
                    reason: Some(format!("the device did not start it: {}", e.message)),
                    exit_code: None,
                    signal: None,
                };
                store.end_terminal_session(&session_id, &end, 0).await.map_err(store_error)?;
            }
            return Err(e);
        }
    };
    if output.output.get("session_id").and_then(Value::as_str) != Some(session_id.as_str()) {
        return Err(ToolError::new(ErrorCode::Internal, "the runner answered for another terminal session"));
    }
    let range = |i: usize| output.output.pointer(&format!("/output_range/{i}")).and_then(Value::as_u64).unwrap_or(0);
    let (from, to) = (range(0), range(1));
    if action == "resize" {
        let dim = |k: &str| u16::try_from(input.get(k).and_then(Value::as_u64).unwrap_or(0)).unwrap_or(0);
        if let Err(e) = store.resize_terminal_session(&session_id, dim("cols"), dim("rows")).await {
            tracing::warn!(error = %e, "recording a device PTY resize failed");
        }
    }
    let event = json!({
        "session_id": session_id, "invocation_id": inv.id, "action": action, "device_id": device,
        "from": from, "to": to, "bytes": output.output.get("output_bytes"),
        "bytes_missed": output.output.get("output_bytes_missed"),
    });
    let report =
        crate::store::TerminalReport { session_id: session_id.clone(), invocation_id: inv.id.clone(), from, to };
    if let Err(e) = store.record_terminal_output(&inv.run_id, &event, Some(&report)).await {
        tracing::warn!(error = %e, "recording terminal.output failed");
    }
    Ok(stamp_device(output, device))
}

/// Canonicalisation and preparation of a call on its run's device (the freeze of a device
/// run: the device's files decide the canonical input and the preview).
#[derive(Clone)]
pub struct DeviceTools {
    /// The hub.
    pub hub: Arc<DeviceHub>,
    /// The device.
    pub device_id: String,
    /// The workspace root on the device.
    pub workspace: String,
    /// The run.
    pub run_id: String,
    /// The caller.
    pub owner_id: String,
}

impl DeviceTools {
    fn spec(&self, phase: JobPhase, tool_id: &str, input: Value) -> JobSpec {
        JobSpec {
            phase,
            invocation_id: String::new(),
            run_id: self.run_id.clone(),
            owner_id: self.owner_id.clone(),
            tool_id: tool_id.to_owned(),
            input,
            approval_id: None,
            workspace: self.workspace.clone(),
        }
    }

    /// The tool's `prepare` on the device.
    pub async fn prepare(&self, tool_id: &str, input: Value) -> Result<Prepared, ToolError> {
        let spec = self.spec(JobPhase::Prepare, tool_id, input);
        match self.hub.job_anywhere(&self.device_id, spec).await? {
            JobOutcome::Prepared { input, preview } => Ok(Prepared { input, preview }),
            JobOutcome::Error { error } => Err(error),
            _ => Err(unexpected("prepare")),
        }
    }

    /// The tool's `canonicalize` on the device.
    pub async fn canonicalize(&self, tool_id: &str, input: Value) -> Result<Value, ToolError> {
        let spec = self.spec(JobPhase::Canonicalize, tool_id, input);
        match self.hub.job_anywhere(&self.device_id, spec).await? {
            JobOutcome::Canonical { input } => Ok(input),
            JobOutcome::Error { error } => Err(error),
            _ => Err(unexpected("canonicalize")),
        }
    }
}
