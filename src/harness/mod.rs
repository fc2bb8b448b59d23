//! Harness Execution: runs cleared invocations off the request path and records what
//! really happened.
//!
//! A loop claims queued invocations from the store ([`Store::claim_next`], a compare-and-
//! set that also demands a granted approval with the exact triple for approval-gated
//! calls), runs each through the [`Executor`] with a time limit, a lease it keeps renewing
//! and a cancellation token, and stores the result with its evidence in one transaction.
//! Before execution every invocation passes [`Harness::gate`] again, whatever path it came
//! by. On start, invocations a previous incarnation of this server left `running` become
//! `interrupted` and are never re-run; queued ones (granted but not started) simply run.

pub mod executor;

pub use executor::{Executor, LocalExecutor};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::approval::policy::{self, Decision};
use crate::evidence::EvidenceDraft;
use crate::registry::{Entry, ErrorClass, Registry, ToolError, ToolOutput};
use crate::store::{FinalStatus, InvocationRow, Store};

/// Largest serialized tool output kept in a result, in bytes; larger outputs are replaced
/// by a truncation marker with their head.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;

/// Execution limits.
#[derive(Debug, Clone)]
pub struct HarnessLimits {
    /// Executions at once.
    pub concurrency: usize,
    /// Time limit of one execution.
    pub timeout: Duration,
    /// Claim lease; renewed every third of it while the execution runs.
    pub lease: Duration,
}

/// The execution loop and its gate.
pub struct Harness {
    store: Store,
    registry: Arc<Registry>,
    executor: Arc<dyn Executor>,
    node_id: String,
    limits: HarnessLimits,
    notify: Notify,
    running: Mutex<HashMap<String, CancellationToken>>,
}

impl Harness {
    /// A harness for node `node_id` (`<stable node>:<boot id>`).
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        executor: Arc<dyn Executor>,
        node_id: String,
        limits: HarnessLimits,
    ) -> Self {
        Self { store, registry, executor, node_id, limits, notify: Notify::new(), running: Mutex::new(HashMap::new()) }
    }

    /// This server's node id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Tells the loop there may be work (a new queued invocation, a grant).
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Cancels a running invocation on this node. False if it is not running here.
    pub fn cancel_running(&self, invocation_id: &str) -> bool {
        match self.running.lock().get(invocation_id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Marks invocations left `running` by earlier incarnations of this node (`node_prefix`)
    /// as interrupted. Returns how many.
    pub async fn recover(&self, node_prefix: &str) -> Result<u64, crate::store::StoreError> {
        self.store.interrupt_orphans(Some(node_prefix)).await
    }

    /// Runs the claim loop until `shutdown`; then cancels running executions and marks
    /// those that did not finish within 5 s as interrupted.
    pub fn spawn(self: &Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.run(shutdown).await })
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.limits.concurrency.max(1)));
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while let Ok(permit) = Arc::clone(&permits).try_acquire_owned() {
                match self.store.claim_next(&self.node_id, millis(self.limits.lease)).await {
                    Ok(Some(inv)) => {
                        let this = Arc::clone(&self);
                        let cancel = shutdown.child_token();
                        let stopping = shutdown.clone();
                        tasks.spawn(async move {
                            this.run_one(inv, cancel, stopping).await;
                            drop(permit);
                            this.wake();
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming an invocation failed");
                        break;
                    }
                }
            }
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.notify.notified() => {}
                _ = sweep.tick() => self.sweep().await,
            }
        }
        let drained =
            tokio::time::timeout(Duration::from_secs(5), async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tasks.abort_all();
        }
        if let Err(e) = self.store.interrupt_orphans(Some(&self.node_id)).await {
            tracing::warn!(error = %e, "marking unfinished invocations interrupted failed");
        }
    }

    async fn sweep(&self) {
        if let Err(e) = self.store.expire_approvals().await {
            tracing::warn!(error = %e, "expiring approvals failed");
        }
        if let Err(e) = self.store.interrupt_orphans(None).await {
            tracing::warn!(error = %e, "sweeping expired leases failed");
        }
    }

    /// The single gate in front of execution: a tool the policy gates (or an invocation
    /// frozen as gated) runs only with a granted approval whose triple equals the
    /// invocation's. No action type reaches [`Executor::execute`] by another path.
    pub async fn gate(&self, inv: &InvocationRow, entry: &Entry) -> Result<(), ToolError> {
        let gated = inv.approval_required != 0 || policy::decide(entry.spec()) != Decision::Skip;
        if !gated {
            return Ok(());
        }
        let refused = |why: &str| {
            ToolError::new(ErrorClass::Failed, "approval_required", format!("{} was not executed: {why}", inv.id))
        };
        let approval = self
            .store
            .approval_of_invocation(&inv.id)
            .await
            .map_err(|e| refused(&format!("approval could not be read: {e}")))?
            .ok_or_else(|| refused("the tool requires approval and none exists"))?;
        let exact = approval.status == "granted"
            && approval.tool_id == inv.tool_id
            && approval.tool_call_id == inv.tool_call_id
            && approval.input_hash == inv.input_hash;
        if exact { Ok(()) } else { Err(refused("no granted approval names this exact invocation")) }
    }

    /// Runs a tool for an internal caller (an old persisted call, an internal primitive):
    /// no turn, no exposure and nothing stored, but the same policy — an internal call has
    /// no approval, so a tool the policy gates is refused with `approval_required`.
    pub async fn call_internal(
        &self,
        owner_id: &str,
        run_id: &str,
        tool_id: &str,
        workspace: crate::workspace::Workspace,
        input: Value,
    ) -> Result<ToolOutput, ToolError> {
        let entry = self.registry.get_any(tool_id).ok_or_else(|| {
            ToolError::new(ErrorClass::NotFound, "not_registered", format!("{tool_id} is not registered"))
        })?;
        if policy::decide(entry.spec()) != Decision::Skip {
            return Err(ToolError::new(
                ErrorClass::Failed,
                "approval_required",
                format!("{tool_id} needs an exact-invocation approval and cannot be called internally"),
            ));
        }
        entry
            .validate(&input)
            .map_err(|errors| ToolError::new(ErrorClass::BadInput, "input_invalid", errors.join("; ")))?;
        let prepare_ctx = crate::registry::PrepareContext { workspace: &workspace, owner_id, run_id };
        let prepared = entry.tool.prepare(input, &prepare_ctx).await?;
        let ctx = crate::registry::ExecContext {
            workspace,
            owner_id: owner_id.to_owned(),
            run_id: run_id.to_owned(),
            invocation_id: String::new(),
            cancel: CancellationToken::new(),
        };
        entry.tool.execute(&prepared.input, &ctx).await
    }

    async fn run_one(&self, inv: InvocationRow, cancel: CancellationToken, stopping: CancellationToken) {
        self.running.lock().insert(inv.id.clone(), cancel.clone());
        let outcome = self.execute_gated(&inv, cancel.clone()).await;
        self.running.lock().remove(&inv.id);
        if stopping.is_cancelled() {
            // The server is stopping: the invocation is marked interrupted, not failed.
            return;
        }
        let (status, result, evidence) = match outcome {
            Ok(out) => {
                let output = cap_output(out.output);
                (FinalStatus::Completed, json!({"ok": true, "output": output}), out.evidence)
            }
            Err(e) => {
                let status = if e.code == "cancelled" { FinalStatus::Cancelled } else { FinalStatus::Failed };
                let evidence = EvidenceDraft::of_text(
                    "tool_error",
                    json!({"tool_id": inv.tool_id, "code": e.code, "details": e.details}),
                    &e.message,
                );
                (status, json!({"ok": false, "output": null, "error": e}), vec![evidence])
            }
        };
        match self.store.finish_invocation(&inv, &self.node_id, status, &result, &evidence).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(invocation = %inv.id, "claim lost before the result was stored; result dropped"),
            Err(e) => tracing::error!(invocation = %inv.id, error = %e, "storing a result failed"),
        }
    }

    async fn execute_gated(&self, inv: &InvocationRow, cancel: CancellationToken) -> Result<ToolOutput, ToolError> {
        // A frozen call its tool family refuses now (an MCP definition changed since it was
        // frozen: `stale_definition`) never runs, registered or not.
        self.registry.check_frozen(&inv.tool_id, &inv.input)?;
        let entry = self.registry.get_any(&inv.tool_id).ok_or_else(|| {
            ToolError::new(ErrorClass::Failed, "tool_gone", format!("{} is no longer registered", inv.tool_id))
        })?;
        self.gate(inv, &entry).await?;
        let input: Value = serde_json::from_str(&inv.input)
            .map_err(|e| ToolError::new(ErrorClass::Failed, "corrupt_input", e.to_string()))?;
        let renew = async {
            let mut tick = tokio::time::interval(self.limits.lease / 3);
            tick.tick().await;
            loop {
                tick.tick().await;
                match self.store.renew_lease(&inv.id, &self.node_id, millis(self.limits.lease)).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => tracing::warn!(invocation = %inv.id, error = %e, "lease renewal failed"),
                }
            }
        };
        let work =
            tokio::time::timeout(self.limits.timeout, self.executor.execute(inv, &entry, &input, cancel.clone()));
        tokio::select! {
            res = work => match res {
                Ok(out) => out,
                Err(_) => {
                    cancel.cancel();
                    Err(ToolError::new(ErrorClass::Failed, "timeout", format!("execution exceeded {} s", self.limits.timeout.as_secs())))
                }
            },
            () = renew => Err(ToolError::new(ErrorClass::Failed, "lease_lost", "the execution lease was lost")),
            () = cancel.cancelled() => Err(ToolError::new(ErrorClass::Failed, "cancelled", "the invocation was cancelled")),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn cap_output(output: Value) -> Value {
    let text = output.to_string();
    if text.len() <= MAX_OUTPUT_BYTES {
        return output;
    }
    json!({
        "truncated": true,
        "total_bytes": text.len(),
        "head": crate::evidence::excerpt(&text, 64 * 1024),
        "marker": format!("[output of {} bytes truncated to its first 64 KiB]", text.len()),
    })
}
