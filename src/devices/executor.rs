//! [`RemoteExecutor`]: the harness's executor that sends the work of runs bound to a device
//! to that device's runner, and [`DeviceTools`]: the freeze's canonicalisation on the device.

use std::sync::Arc;

use async_trait::async_trait;
use mira_core::remote::{JobOutcome, JobPhase};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{DeviceHub, JobSpec};
use crate::error::ErrorCode;
use crate::harness::{CommitGate, Executor};
use crate::registry::{Entry, Prepared, ToolError, ToolOutput};
use crate::store::{InvocationRow, Store};

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

/// Executes on the run's device when the run is bound to one and the tool works in its
/// workspace; everything else goes to `inner` (the host, or the replica owning a terminal).
pub struct RemoteExecutor {
    inner: Arc<dyn Executor>,
    hub: Arc<DeviceHub>,
    store: Store,
}

impl RemoteExecutor {
    /// Wraps `inner`; device work goes through `hub`.
    pub fn new(inner: Arc<dyn Executor>, hub: Arc<DeviceHub>, store: Store) -> Self {
        Self { inner, hub, store }
    }
}

#[async_trait]
impl Executor for RemoteExecutor {
    async fn execute(
        &self,
        inv: &InvocationRow,
        entry: &Entry,
        input: &Value,
        cancel: CancellationToken,
        commit: CommitGate,
    ) -> Result<ToolOutput, ToolError> {
        let unavailable = |msg: String| ToolError::new(ErrorCode::WorkspaceUnavailable, msg);
        let store_error = |e: crate::store::StoreError| unavailable(e.to_string());
        let run = self
            .store
            .run_for(&inv.owner_id, &inv.run_id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
        let device = run.device_id.as_deref().filter(|d| *d != crate::availability::LOCAL_DEVICE_ID);
        let Some(device) = device.filter(|_| runs_on_device(entry.spec().capability.as_deref())) else {
            return self.inner.execute(inv, entry, input, cancel, commit).await;
        };
        let ws = self
            .store
            .workspace_for(&run.owner_id, &run.workspace_id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| unavailable(format!("workspace {} is gone", run.workspace_id)))?;
        let approval_id = self.store.approval_id_of(&inv.id).await.map_err(store_error)?;
        // The device acts from the moment it has the job: this side's commit point is now.
        commit.commit().map_err(|reason| reason.error("stopped before it was sent to the device; nothing was run"))?;
        let spec = JobSpec {
            phase: JobPhase::Execute,
            invocation_id: inv.id.clone(),
            run_id: inv.run_id.clone(),
            owner_id: inv.owner_id.clone(),
            tool_id: inv.tool_id.clone(),
            input: input.clone(),
            approval_id,
            workspace: ws.path,
        };
        match self.hub.job(device, spec, &cancel).await? {
            JobOutcome::Output { output } => Ok(stamp_device(output, device)),
            JobOutcome::Error { error } => Err(error),
            _ => Err(unexpected("execute")),
        }
    }
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
        match self.hub.job(&self.device_id, spec, &CancellationToken::new()).await? {
            JobOutcome::Prepared { input, preview } => Ok(Prepared { input, preview }),
            JobOutcome::Error { error } => Err(error),
            _ => Err(unexpected("prepare")),
        }
    }

    /// The tool's `canonicalize` on the device.
    pub async fn canonicalize(&self, tool_id: &str, input: Value) -> Result<Value, ToolError> {
        let spec = self.spec(JobPhase::Canonicalize, tool_id, input);
        match self.hub.job(&self.device_id, spec, &CancellationToken::new()).await? {
            JobOutcome::Canonical { input } => Ok(input),
            JobOutcome::Error { error } => Err(error),
            _ => Err(unexpected("canonicalize")),
        }
    }
}
