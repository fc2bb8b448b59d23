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
}

impl RemoteExecutor {
    /// Wraps `inner`; device work goes through `hub`.
    pub fn new(inner: Arc<dyn Executor>, hub: Arc<DeviceHub>, store: Store) -> Self {
        Self { inner, hub, store, run_devices: Default::default() }
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
        if !runs_on_device(entry.spec().capability.as_deref()) {
            return self.inner.execute(inv, entry, input, cancel, commit).await;
        }
        let Some(device) = self.device_of(inv).await? else {
            return self.inner.execute(inv, entry, input, cancel, commit).await;
        };
        let device = device.as_str();
        let unavailable = |msg: String| ToolError::new(ErrorCode::WorkspaceUnavailable, msg);
        let store_error = |e: crate::store::StoreError| unavailable(e.to_string());
        // The run and its workspace in one round trip.
        let scope = self
            .store
            .run_scope_for(&inv.owner_id, &inv.run_id, None)
            .await
            .map_err(store_error)?
            .ok_or_else(|| unavailable(format!("run {} is gone", inv.run_id)))?;
        let ws = scope.workspace.ok_or_else(|| unavailable(format!("workspace {} is gone", scope.run.workspace_id)))?;
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
