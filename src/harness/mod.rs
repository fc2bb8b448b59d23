//! Harness Execution: runs cleared invocations off the request path and records what
//! really happened.
//!
//! A loop claims queued invocations from the store in batches as large as its free
//! execution slots ([`Store::claim_ids`], a compare-and-set that also demands a granted
//! approval with the exact triple for approval-gated calls) — users in turn ([`fair`]: by
//! queue tag, so one user's backlog does not hold back another user's call) — runs each
//! through the [`Executor`] with a time limit, a lease it keeps renewing and a cancellation
//! token, and stores the result with its evidence in one transaction. Before execution every invocation
//! passes [`Harness::gate`] again, whatever path it came by. On start, invocations a previous
//! incarnation of this server left `running` become `interrupted` and are never re-run;
//! queued ones (granted but not started) simply run.
//!
//! Stopping a running call (a cancel, the time limit, the server stopping) goes through its
//! [`CommitGate`] (see [`commit`]): a stop that wins before the tool's commit point means
//! nothing changed and the status is `cancelled` (or the time-limit failure); a stop that
//! comes after it is too late, the call finishes, and its status is what it did, with the
//! late request noted in the result and the evidence. A status never contradicts a side
//! effect.

pub use mira_core::commit;
pub mod executor;
pub mod fair;

pub use commit::{CommitGate, GateState, SideEffects, StopNoteOutcome, StopOutcome, StopReason};
pub use executor::{Executor, LocalExecutor};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::approval::policy::{self, ApprovalRule, Decision};
use crate::error::ErrorCode;
pub use crate::events::Wake;
use crate::evidence::EvidenceDraft;
use crate::limits::{PerUserLimit, UserSlot};
use crate::registry::{Entry, Registry, ToolError, ToolOutput};
use crate::state::ApprovalStatus;
use crate::store::{ApprovalRow, FinalStatus, HarnessClaim, InvocationRow, Store};
use crate::workspace::Workspace;

/// Most invocations claimed in one transaction.
const MAX_CLAIM_BATCH: usize = 64;

/// Largest serialized tool output kept in a result, in bytes; larger outputs are replaced
/// by a truncation marker with their head.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;

/// How long a call that was asked to stop may take to return before the harness reports the
/// stop without its answer: a call stopped before its commit point (it only unwinds), or a
/// [`SideEffects::FromStart`] call asked to stop.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long a call that passed its commit point may take to finish after a stop request
/// before its outcome is reported as unknown (`outcome_unknown`).
pub const COMMITTED_GRACE: Duration = Duration::from_secs(60);

/// What a cancel of a running invocation achieved on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The cancel won before any side effect: the invocation ends `cancelled`.
    Stopped,
    /// The call had started acting ([`SideEffects::FromStart`]); it was asked to stop as far
    /// as it can, and its final status is what it reports.
    Interrupting,
    /// The call had passed its commit point: it finishes, and its final status is what it
    /// did, with the late cancel noted.
    TooLate,
    /// The call had just returned; its result (being stored) stands as it is.
    Finished,
    /// The invocation is not running on this server.
    NotHere,
}

/// A call this server runs: its gate, the token its tool observes, and the harness's own
/// stop signal.
struct RunningCall {
    gate: CommitGate,
    tool_cancel: CancellationToken,
    stop: CancellationToken,
    effects: SideEffects,
}

impl RunningCall {
    /// Asks the call to stop (see [`commit`]); idempotent.
    fn stop_with(&self, reason: StopReason) -> CancelOutcome {
        let outcome = match (self.gate.request_stop(reason), self.effects) {
            (StopOutcome::Stopped, _) => {
                self.tool_cancel.cancel();
                CancelOutcome::Stopped
            }
            (StopOutcome::TooLate, SideEffects::FromStart) => {
                self.tool_cancel.cancel();
                CancelOutcome::Interrupting
            }
            (StopOutcome::TooLate, _) => CancelOutcome::TooLate,
            (StopOutcome::Finished, _) => return CancelOutcome::Finished,
        };
        self.stop.cancel();
        outcome
    }
}

/// Execution limits.
#[derive(Debug, Clone)]
pub struct HarnessLimits {
    /// Executions at once.
    pub concurrency: usize,
    /// Time limit of one execution.
    pub timeout: Duration,
    /// Claim lease; renewed every third of it while the execution runs.
    pub lease: Duration,
    /// Executions of one user at once (the harness's `shares`).
    pub per_user: usize,
}

/// What the claim loop of a harness did since it started (`mira bench invocations` prints it:
/// calls that found no free execution slot in their freeze or grant are claimed here, each
/// claim a write transaction of its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimStats {
    /// Claim transactions ([`Store::claim_ids`]) the loop made.
    pub transactions: u64,
    /// Invocations they claimed.
    pub invocations: u64,
    /// Times a freeze or grant asked for a free execution slot ([`Harness::slot`]) and found
    /// none: its call was left queued for the loop.
    pub no_slot: u64,
}

/// What the request that claimed an invocation knows already, handed to its execution so it
/// is not read again ([`Harness::start_claimed`]).
#[derive(Default)]
pub struct Handoff {
    /// The workspace the freeze that claimed the call prepared it in, by identity (see
    /// [`Executor::execute`]).
    pub prepared_in: Option<Workspace>,
    /// The approval as the grant that claimed the call committed it (see [`Harness::gate`]).
    pub granted: Option<ApprovalRow>,
}

/// One free execution slot of a harness, held for an invocation claimed outside its loop
/// (see [`Harness::slot`], [`Harness::adopt`]), counted in its user's share. A slot dropped
/// without being handed over (the grant or freeze that took it failed, or claimed nothing)
/// wakes the claim loop, which may have found no slot free while this one was held.
pub struct ExecutionSlot {
    held: Option<(OwnedSemaphorePermit, UserSlot)>,
    wake: Wake,
}

impl Drop for ExecutionSlot {
    fn drop(&mut self) {
        if self.held.take().is_some() {
            self.wake.wake();
        }
    }
}

/// The executions of a started harness, and the signal that stops them.
struct Executions {
    set: tokio::task::JoinSet<()>,
    stopping: CancellationToken,
}

/// The execution loop and its gate.
pub struct Harness {
    store: Store,
    registry: Arc<Registry>,
    executor: Arc<dyn Executor>,
    node_id: String,
    limits: HarnessLimits,
    wake: Wake,
    running: Mutex<HashMap<String, Arc<RunningCall>>>,
    /// Execution slots (`limits.concurrency`): the loop's claims and adopted invocations.
    permits: Arc<Semaphore>,
    /// Each user's share of the slots: the tools of one user running at once on this replica
    /// (`limits.per_user`, `--max-running-per-user`). The queue's order ([`fair`]) decides who
    /// starts next, not how long a start holds its slot: a user whose calls each run for
    /// minutes could otherwise hold every slot until the execution time limit. One more
    /// call's freeze or grant finds no slot ([`Harness::slot`]) and the claim loop passes over
    /// that user's queued calls, which keep their place and tag. A share is counted while the
    /// tool runs and given back when it returns ([`Harness::release`]), before its result
    /// waits for the group commit (the slot stays busy until then): counting that latency
    /// would make the share a throughput limit for short calls. Shares are per replica, like
    /// the slots.
    shares: Arc<PerUserLimit>,
    /// The claim loop's transactions and the invocations they claimed ([`ClaimStats`]).
    claim_transactions: AtomicU64,
    claimed: AtomicU64,
    no_slot: AtomicU64,
    /// Running executions, from [`Harness::spawn`] until the loop stops (then None: a late
    /// adoption is not started).
    executions: Mutex<Option<Executions>>,
    /// Queue tags between users ([`fair`]).
    queue: fair::FairQueue,
    /// The owners of queued calls as this replica knows them (the queue's head at the loop's
    /// last look, and calls queued here since; None until the loop first looked): a freeze
    /// does not take a free slot for its call ahead of another user's queued ones
    /// ([`Harness::slot`]).
    waiting: Mutex<Option<HashSet<String>>>,
    /// Users with queued calls who held their share of the slots at the loop's last look or
    /// when a call of theirs was queued: when one of their calls ends, they count as waiting
    /// until the loop looks again, so the slot that frees goes to the queue in its order.
    parked: Mutex<HashSet<String>>,
}

impl Harness {
    /// The handle that wakes this harness's loop.
    pub fn waker(&self) -> &Wake {
        &self.wake
    }

    /// The queue tag of a call of `owner_id` entering the execution queue now ([`fair`]).
    pub fn queue_tag(&self, owner_id: &str) -> i64 {
        self.queue.tag(owner_id)
    }

    /// The tag of a call that skips the queue (claimed at once in a free slot): the queue's
    /// virtual time, taking no turn of its owner's — a call that waits in no queue does not
    /// push its owner's later queued calls back, nor moves the virtual time past calls still
    /// queued.
    pub fn unqueued_tag(&self) -> i64 {
        self.queue.virtual_time()
    }

    /// A harness for node `node_id` (`<stable node>:<boot id>`).
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        executor: Arc<dyn Executor>,
        node_id: String,
        limits: HarnessLimits,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(limits.concurrency.max(1)));
        let shares = PerUserLimit::new(limits.per_user);
        Self {
            store,
            registry,
            executor,
            node_id,
            limits,
            wake: Wake::default(),
            running: Mutex::new(HashMap::new()),
            permits,
            shares,
            claim_transactions: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            no_slot: AtomicU64::new(0),
            executions: Mutex::new(None),
            queue: fair::FairQueue::default(),
            waiting: Mutex::new(None),
            parked: Mutex::new(HashSet::new()),
        }
    }

    /// What the claim loop did since this harness started.
    pub fn claim_stats(&self) -> ClaimStats {
        ClaimStats {
            transactions: self.claim_transactions.load(Ordering::Relaxed),
            invocations: self.claimed.load(Ordering::Relaxed),
            no_slot: self.no_slot.load(Ordering::Relaxed),
        }
    }

    /// A free execution slot now for a call of `owner_id`, or None when every slot is busy,
    /// the user's share of running tools is taken ([`Harness`]'s `shares`), or another user has calls queued (the
    /// invocation is then left to the claim loop, which claims in queue order: a call that
    /// took a slot at its freeze would go ahead of every queued one, and a user freezing all
    /// the time would take every slot that frees). A user's own queued calls do not stop
    /// it: within one user the queue is first come, first served anyway, and a freeze that
    /// claims its call in its own transaction spares the claim loop a write.
    pub fn slot(&self, owner_id: &str) -> Option<ExecutionSlot> {
        let others_waiting = match &*self.waiting.lock() {
            None => true,
            Some(waiting) => waiting.iter().any(|w| w != owner_id),
        };
        let slot = if others_waiting {
            None
        } else {
            self.shares.try_take(owner_id).and_then(|share| {
                let permit = Arc::clone(&self.permits).try_acquire_owned().ok()?;
                Some(ExecutionSlot { held: Some((permit, share)), wake: self.wake.clone() })
            })
        };
        if slot.is_none() {
            self.no_slot.fetch_add(1, Ordering::Relaxed);
        }
        slot
    }

    /// The claim a caller holding a [`Harness::slot`] makes for this harness
    /// ([`Store::grant_and_claim`], [`Store::freeze_and_claim`]): this node and its lease.
    pub fn claim(&self) -> HarnessClaim<'_> {
        HarnessClaim { node_id: &self.node_id, lease_ms: millis(self.limits.lease) }
    }

    /// After a grant or freeze of a call of `owner_id` made with [`Harness::claim`] while
    /// holding `slot`: runs the invocation it claimed, or (nothing claimed: no slot was free,
    /// or the invocation was no longer awaiting approval) notes the call as queued and wakes
    /// the loop, with what the claiming request knows already (`handoff`).
    pub fn start_claimed(
        self: &Arc<Self>,
        claimed: Option<InvocationRow>,
        handoff: Handoff,
        slot: Option<ExecutionSlot>,
        owner_id: &str,
    ) {
        match (claimed, slot) {
            (Some(inv), Some(slot)) => self.adopt(inv, handoff, slot),
            (_, slot) => {
                drop(slot);
                self.queued(owner_id);
            }
        }
    }

    /// Runs `inv`, already claimed for this node (`running`, `claimed_by` = this node), in
    /// `slot`, as the loop runs what it claims: same gate, lease, limits and recording. When
    /// the loop has stopped (the server is stopping), the invocation stays claimed and ends
    /// `interrupted` like every call this node left running — it never ran.
    pub fn adopt(self: &Arc<Self>, inv: InvocationRow, handoff: Handoff, mut slot: ExecutionSlot) {
        let Some((permit, share)) = slot.held.take() else { return };
        // Slots are taken for the call's owner (a grant takes it for the owner, whoever decides).
        debug_assert_eq!(share.user_id(), inv.owner_id);
        if !self.launch(inv, handoff, permit, share) {
            tracing::warn!("an invocation was claimed while the harness stopped; it ends interrupted");
        }
    }

    /// Starts a claimed invocation in its slot beside the others; false when the harness is
    /// not running (never started, or stopping).
    fn launch(
        self: &Arc<Self>,
        inv: InvocationRow,
        handoff: Handoff,
        permit: OwnedSemaphorePermit,
        share: UserSlot,
    ) -> bool {
        let mut executions = self.executions.lock();
        let Some(ex) = executions.as_mut() else { return false };
        while ex.set.try_join_next().is_some() {}
        let stopping = ex.stopping.clone();
        ex.set.spawn(Arc::clone(self).run_in_slot(inv, handoff, (permit, share), stopping));
        true
    }

    /// This server's node id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Tells the loop there may be work (a new queued invocation, a grant).
    pub fn wake(&self) {
        self.wake.wake();
    }

    /// A call of `owner_id` was queued: until the loop has looked, other users' freezes
    /// leave free slots to it ([`Harness::slot`]) — from the end of one of the user's calls
    /// when they hold their share of the slots — and the loop is woken.
    pub fn queued(&self, owner_id: &str) {
        if self.shares.is_full(owner_id) {
            self.parked.lock().insert(owner_id.to_owned());
        } else if let Some(waiting) = self.waiting.lock().as_mut() {
            waiting.insert(owner_id.to_owned());
        }
        self.wake();
    }

    /// Cancels a running invocation on this node, as far as its commit point allows (see
    /// [`CancelOutcome`]).
    pub fn cancel_running(&self, invocation_id: &str) -> CancelOutcome {
        let call = self.running.lock().get(invocation_id).cloned();
        call.map_or(CancelOutcome::NotHere, |call| call.stop_with(StopReason::Cancel))
    }

    /// Marks invocations left `running` by earlier incarnations of this node (`node_prefix`)
    /// as interrupted. Returns how many.
    pub async fn recover(&self, node_prefix: &str) -> Result<u64, crate::store::StoreError> {
        self.store.interrupt_orphans(Some(node_prefix)).await
    }

    /// Runs the claim loop until `shutdown`; then cancels running executions and marks
    /// those that did not finish within 5 s as interrupted.
    pub fn spawn(self: &Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        *self.executions.lock() = Some(Executions { set: tokio::task::JoinSet::new(), stopping: shutdown.clone() });
        let this = Arc::clone(self);
        tokio::spawn(async move { this.run(shutdown).await })
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            let mut lost_races = 0;
            // Claims as many as there are free execution slots, in batches: one transaction
            // of a few statements per batch instead of one per invocation. The slots are
            // taken first (a freeze or grant may take one meanwhile), one per claimed row.
            loop {
                // Slots are taken only for work that is queued: slots held by the loop while it
                // looks would make concurrent freezes find none, and their calls would be queued
                // for a claim transaction of their own — which, on SQLite, waits for the one
                // writer like every group commit. With no slot free, not even the queue is read.
                if self.permits.available_permits() == 0 {
                    break;
                }
                // Users holding their share of the slots are passed over until a call of theirs
                // ends (`shares`); the calls claimed are a prefix of the rest of the queue.
                let full = self.shares.full();
                let wanted = self.permits.available_permits().min(MAX_CLAIM_BATCH);
                let head = match self.store.queue_head(wanted, &full).await {
                    Ok(head) => head,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the queue failed");
                        break;
                    }
                };
                *self.parked.lock() = head.owners.into_iter().filter(|o| full.contains(o)).collect();
                let owners: Vec<String> = head.calls.iter().map(|(_, owner)| owner.clone()).collect();
                // Replaced only after the read (replaced before, the freezes meanwhile took
                // the slots that had freed, ahead of the queue); a call queued since adds its
                // owner again and wakes the loop.
                *self.waiting.lock() = Some(owners.iter().cloned().collect());
                let shares = self.shares.take_prefix(&owners, self.permits.available_permits());
                let free = shares.len();
                let Some(mut held) = u32::try_from(free)
                    .ok()
                    .filter(|n| *n > 0)
                    .and_then(|n| Arc::clone(&self.permits).try_acquire_many_owned(n).ok())
                else {
                    break;
                };
                let ids: Vec<String> = head.calls.into_iter().take(free).map(|(id, _)| id).collect();
                let mut shares: HashMap<String, UserSlot> = ids.iter().cloned().zip(shares).collect();
                let batch = match self.store.claim_ids(&self.node_id, millis(self.limits.lease), &ids).await {
                    Ok(batch) => batch,
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming invocations failed");
                        break;
                    }
                };
                if let Some(tag) = batch.iter().map(|inv| inv.queue_tag).max() {
                    self.queue.started(tag);
                }
                self.claim_transactions.fetch_add(1, Ordering::Relaxed);
                self.claimed.fetch_add(u64::try_from(batch.len()).unwrap_or(u64::MAX), Ordering::Relaxed);
                let lost = batch.len() < free;
                for inv in batch {
                    // `free` slots are held and at most `free` rows (of `ids`) were claimed, each
                    // on the share taken for it.
                    let (Some(permit), Some(share)) = (held.split(1), shares.remove(&inv.id)) else { break };
                    self.launch(inv, Handoff::default(), permit, share);
                }
                drop(held);
                drop(shares);
                // Fewer claimed than read: another replica took some meanwhile (or they were
                // cancelled); read again, a few times, rather than leave the slots idle until
                // the next wake-up.
                if lost {
                    lost_races += 1;
                    if lost_races > 3 {
                        break;
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.wake.notified() => {}
                _ = sweep.tick() => self.sweep().await,
            }
        }
        // From now on nothing is started; what was claimed too late ends interrupted below.
        let executions = self.executions.lock().take();
        if let Some(mut ex) = executions {
            let drained =
                tokio::time::timeout(Duration::from_secs(5), async { while ex.set.join_next().await.is_some() {} })
                    .await;
            if drained.is_err() {
                ex.set.abort_all();
            }
        }
        if let Err(e) = self.store.interrupt_orphans(Some(&self.node_id)).await {
            tracing::warn!(error = %e, "marking unfinished invocations interrupted failed");
        }
    }

    /// Gives back the share of a call whose tool returned (storing its result does not count:
    /// results are stored in group commits, and a user's calls waiting for one would hold
    /// their share for its whole latency). A user whose calls were passed over then counts as
    /// waiting, so the next free slot goes to the queue in its order, and the loop is woken
    /// (it may claim their calls in slots free already).
    fn release(&self, share: UserSlot) {
        let owner = share.user_id().to_owned();
        drop(share);
        if self.parked.lock().remove(&owner) {
            if let Some(waiting) = self.waiting.lock().as_mut() {
                waiting.insert(owner);
            }
            self.wake();
        }
    }

    /// Runs one claimed invocation, then frees its slot and wakes the loop to claim more.
    async fn run_in_slot(
        self: Arc<Self>,
        inv: InvocationRow,
        handoff: Handoff,
        (permit, share): (OwnedSemaphorePermit, UserSlot),
        stopping: CancellationToken,
    ) {
        self.run_one(inv, handoff, share, stopping).await;
        drop(permit);
        self.wake();
    }

    async fn sweep(&self) {
        // Cancels recorded for calls of this node (possibly through another replica).
        if !self.running.lock().is_empty() {
            match self.store.cancel_requests(&self.node_id).await {
                Ok(ids) => {
                    for id in ids {
                        self.cancel_running(&id);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading cancel requests failed"),
            }
        }
        if let Err(e) = self.store.expire_approvals().await {
            tracing::warn!(error = %e, "expiring approvals failed");
        }
        // Other replicas' claims advance the queue too: this replica's new tags start no
        // earlier than its head.
        match self.store.queue_head_tag().await {
            Ok(Some(head)) => self.queue.started(head),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "reading the queue's head failed"),
        }
        match self.store.interrupt_orphans(None).await {
            Ok(n) => crate::metrics::invocations_recovered(n),
            Err(e) => tracing::warn!(error = %e, "sweeping expired leases failed"),
        }
    }

    /// The single gate in front of execution: a tool the policy gates (or an invocation
    /// frozen as gated) runs only with a granted approval whose triple equals the
    /// invocation's. No action type reaches [`Executor::execute`] by another path.
    /// `granted`: the approval as the grant that claimed `inv` committed it (checked here
    /// instead of read again); None reads it from the store.
    pub async fn gate(
        &self,
        inv: &InvocationRow,
        entry: &Entry,
        granted: Option<&ApprovalRow>,
    ) -> Result<(), ToolError> {
        let gated = inv.approval_required || policy::decide(entry.spec()) != Decision::Skip;
        if !gated {
            return Ok(());
        }
        let refused =
            |why: &str| ToolError::new(ErrorCode::ApprovalRequired, format!("{} was not executed: {why}", inv.id));
        let approval = match granted.filter(|a| a.invocation_id == inv.id) {
            Some(approval) => approval.clone(),
            None => self
                .store
                .approval_of_invocation(&inv.id)
                .await
                .map_err(|e| refused(&format!("approval could not be read: {e}")))?
                .ok_or_else(|| refused("the tool requires approval and none exists"))?,
        };
        let exact = approval.status == ApprovalStatus::Granted
            && approval.tool_id == inv.tool_id
            && approval.tool_call_id == inv.tool_call_id
            && approval.input_hash == inv.input_hash;
        if !exact {
            return Err(refused("no granted approval names this exact invocation"));
        }
        if approval.rule() == ApprovalRule::FourEyes {
            // Verified from the stored record alone: another user, who may second, granted it.
            let decider = approval.decided_by.as_deref().unwrap_or_default();
            let seconded = !decider.is_empty()
                && decider != inv.owner_id
                && self
                    .store
                    .may_second(decider)
                    .await
                    .map_err(|e| refused(&format!("the decider could not be read: {e}")))?;
            if !seconded {
                return Err(ToolError::new(
                    ErrorCode::FourEyesRequired,
                    format!(
                        "{} was not executed: its approval needs a second person (an admin or approver other than the requester), and the stored grant is not one",
                        inv.id
                    ),
                )
                .with_details(json!({"approval_id": approval.id, "decided_by": approval.decided_by, "requested_by": inv.owner_id})));
            }
        }
        Ok(())
    }

    /// Runs a tool for an internal caller (an old persisted call, an internal primitive):
    /// no turn, no exposure and nothing stored, but the same policy — an internal call has
    /// no approval, so a tool the policy gates is refused with `approval_required`.
    pub async fn call_internal(
        &self,
        owner_id: &str,
        run_id: &str,
        tool_id: &str,
        workspace: Workspace,
        input: Value,
    ) -> Result<ToolOutput, ToolError> {
        let entry = self
            .registry
            .get_any(tool_id)
            .ok_or_else(|| ToolError::new(ErrorCode::NotRegistered, format!("{tool_id} is not registered")))?;
        if policy::decide(entry.spec()) != Decision::Skip {
            return Err(ToolError::new(
                ErrorCode::ApprovalRequired,
                format!("{tool_id} needs an exact-invocation approval and cannot be called internally"),
            ));
        }
        entry.validate(&input).map_err(|errors| ToolError::new(ErrorCode::InputInvalid, errors.join("; ")))?;
        let prepare_ctx = crate::registry::PrepareContext { workspace: Some(&workspace), owner_id, run_id };
        let prepared = entry.tool.prepare(input, &prepare_ctx).await?;
        let ctx = crate::registry::ExecContext {
            workspace: Some(workspace),
            owner_id: owner_id.to_owned(),
            run_id: run_id.to_owned(),
            invocation_id: String::new(),
            cancel: CancellationToken::new(),
            commit: CommitGate::new(),
        };
        entry.tool.execute(&prepared.input, &ctx).await
    }

    /// Executes one claimed invocation inside its `execute_tool {tool}` span (GenAI semantic
    /// conventions), a child of the request that made it runnable ([`crate::telemetry`]).
    async fn run_one(&self, inv: InvocationRow, handoff: Handoff, share: UserSlot, stopping: CancellationToken) {
        use tracing::Instrument;
        let span = tracing::info_span!(
            target: "mira::otel",
            "execute_tool",
            otel.name = format!("execute_tool {}", inv.tool_id).as_str(),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = inv.tool_id.as_str(),
            gen_ai.tool.call.id = inv.tool_call_id.as_str(),
            gen_ai.tool.type = "function",
            mira.invocation.id = inv.id.as_str(),
            mira.run.id = inv.run_id.as_str(),
            mira.invocation.status = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        if crate::telemetry::exporting() {
            match self.store.invocation_trace(&inv.id).await {
                Ok(Some(parent)) => crate::telemetry::set_parent(&span, &parent),
                Ok(None) => {}
                Err(e) => tracing::warn!(invocation = %inv.id, error = %e, "reading the trace context failed"),
            }
        }
        self.run_one_in_span(inv, handoff, share, stopping, &span).instrument(span.clone()).await;
    }

    async fn run_one_in_span(
        &self,
        inv: InvocationRow,
        handoff: Handoff,
        share: UserSlot,
        stopping: CancellationToken,
        span: &tracing::Span,
    ) {
        let entry = self.registry.get_any(&inv.tool_id);
        let effects = entry.as_ref().map_or(SideEffects::FromStart, |e| e.tool.side_effects());
        let call = Arc::new(RunningCall {
            gate: CommitGate::new(),
            tool_cancel: CancellationToken::new(),
            stop: stopping.child_token(),
            effects,
        });
        self.running.lock().insert(inv.id.clone(), Arc::clone(&call));
        let outcome = self.execute_gated(&inv, handoff, entry, &call, &stopping).await;
        // The call is over: from now on a stop request changes nothing (it stays registered
        // until its result is stored, so that a cancel in between is answered truthfully).
        call.gate.finish();
        self.release(share);
        if stopping.is_cancelled() && outcome.is_err() {
            // The server is stopping and the call did not finish: it is marked interrupted,
            // not failed. A call that finished (its change made) is stored as it is.
            self.running.lock().remove(&inv.id);
            return;
        }
        let note = match call.gate.state() {
            GateState::Committed { late_stop: Some((reason, at)) } => {
                Some(commit::late_stop_note(&inv.tool_id, effects, reason, &at))
            }
            GateState::Stopped { reason, at } => Some(json!({
                "requested_at": at, "reason": reason, "outcome": StopNoteOutcome::StoppedBeforeCommit,
                "message": format!("a stop ({reason:?}) won before {} changed anything; nothing was changed", inv.tool_id),
            })),
            _ => None,
        };
        let (status, mut result, mut evidence) = match outcome {
            Ok(out) => {
                let output = cap_output(out.output);
                (FinalStatus::Completed, json!({"ok": true, "output": output}), out.evidence)
            }
            Err(e) => {
                let status = match e.code {
                    ErrorCode::Cancelled => FinalStatus::Cancelled,
                    // Sent to a device whose runner went away unanswered: ended, never re-run.
                    ErrorCode::OutcomeUnknown if e.details.get("device_id").is_some() => FinalStatus::Interrupted,
                    _ => FinalStatus::Failed,
                };
                let evidence = EvidenceDraft::of_text(
                    "tool_error",
                    json!({"tool_id": inv.tool_id, "code": e.code, "details": e.details, "stop": note}),
                    &e.message,
                );
                (status, json!({"ok": false, "output": null, "error": e}), vec![evidence])
            }
        };
        if let Some(note) = note {
            if status == FinalStatus::Completed {
                // The evidence says it too: the change was made although a stop was asked.
                let text = note["message"].as_str().unwrap_or_default().to_owned();
                evidence.push(EvidenceDraft::of_text(
                    "stop_too_late",
                    json!({"tool_id": inv.tool_id, "invocation_id": inv.id, "stop": note}),
                    &text,
                ));
            }
            result["stop"] = note;
        }
        span.record("mira.invocation.status", status.status().as_str());
        if status != FinalStatus::Completed {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", result["error"]["code"].as_str().unwrap_or("tool_error"));
        }
        let store_span =
            tracing::info_span!(target: "mira::otel", "store_result", mira.evidence.count = evidence.len());
        let stored = {
            use tracing::Instrument;
            self.store.finish_invocation(&inv, &self.node_id, status, &result, &evidence).instrument(store_span).await
        };
        match stored {
            Ok(Some(_)) => crate::metrics::invocation_finished(&inv.tool_id, status.status().as_str()),
            Ok(None) => tracing::warn!(invocation = %inv.id, "claim lost before the result was stored; result dropped"),
            Err(e) => tracing::error!(invocation = %inv.id, error = %e, "storing a result failed"),
        }
        self.running.lock().remove(&inv.id);
    }

    async fn execute_gated(
        &self,
        inv: &InvocationRow,
        handoff: Handoff,
        entry: Option<Entry>,
        call: &RunningCall,
        stopping: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        // A frozen call its tool family refuses now (an MCP definition changed since it was
        // frozen: `stale_definition`) never runs, registered or not.
        self.registry.check_frozen(&inv.tool_id, &inv.input)?;
        let entry = entry
            .ok_or_else(|| ToolError::new(ErrorCode::ToolGone, format!("{} is no longer registered", inv.tool_id)))?;
        self.gate(inv, &entry, handoff.granted.as_ref()).await?;
        let input: Value =
            serde_json::from_str(&inv.input).map_err(|e| ToolError::new(ErrorCode::CorruptInput, e.to_string()))?;
        if call.effects == SideEffects::FromStart {
            // Such a tool may act from its first instruction: the commit point is its start.
            call.gate.commit().map_err(|reason| reason.error("stopped before it started; nothing was run"))?;
        }
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
        let lease_lost = || ToolError::new(ErrorCode::LeaseLost, "the execution lease was lost");
        let work = self.executor.execute(
            inv,
            handoff.prepared_in,
            &entry,
            &input,
            call.tool_cancel.clone(),
            call.gate.clone(),
        );
        tokio::pin!(renew, work);
        tokio::select! {
            res = &mut work => return res,
            () = &mut renew => return Err(lease_lost()),
            () = tokio::time::sleep(self.limits.timeout) => {
                call.stop_with(StopReason::Timeout);
            }
            () = call.stop.cancelled() => {
                if stopping.is_cancelled() {
                    call.stop_with(StopReason::Shutdown);
                }
            }
        }
        // A stop was requested; the gate says whether it came before the commit point.
        let (reason, before_commit) = match call.gate.state() {
            GateState::Stopped { reason, .. } => (reason, true),
            GateState::Committed { late_stop: Some((reason, _)) } => (reason, false),
            // Not reachable after `stop_with`; treated as the stricter case.
            GateState::Committed { late_stop: None } | GateState::Open => (StopReason::Cancel, false),
        };
        let limit = self.limits.timeout.as_secs();
        let stopped = |detail: &str| {
            let e = reason.error(detail);
            if reason == StopReason::Timeout { e.with_details(json!({"timeout_secs": limit})) } else { e }
        };
        if call.effects == SideEffects::None {
            // A reading call: dropped at once, nothing changed.
            return Err(stopped("it only reads; nothing was changed"));
        }
        let grace = if before_commit || call.effects == SideEffects::FromStart { STOP_GRACE } else { COMMITTED_GRACE };
        let answer = tokio::select! {
            res = &mut work => Some(res),
            () = &mut renew => return Err(lease_lost()),
            () = tokio::time::sleep(grace) => None,
        };
        match answer {
            // Whatever was asked, the tool finished: its result is the truth (a stop that came
            // too late is noted by the caller).
            Some(Ok(out)) => Ok(out),
            Some(Err(e)) if before_commit => Err(stopped("stopped before its commit point; nothing was changed")
                .with_details(json!({"tool_error": {"code": e.code, "message": e.message}, "timeout_secs": (reason == StopReason::Timeout).then_some(limit)}))),
            // The tool honoured its cancellation token ("cancelled"): report the real reason.
            Some(Err(e)) if e.code == ErrorCode::Cancelled && reason != StopReason::Cancel => {
                Err(stopped("it was asked to stop after it had started").with_details(json!({"started": true, "tool_error": {"code": e.code, "message": e.message}})))
            }
            Some(Err(e)) => Err(e),
            None if before_commit => Err(stopped("stopped before its commit point; nothing was changed")),
            None if call.effects == SideEffects::FromStart => Err(stopped(&format!(
                "it had started acting and did not confirm it stopped within {} s; what it did before is not undone",
                grace.as_secs()
            ))
            .with_details(json!({"started": true, "confirmed_stopped": false}))),
            None => Err(ToolError::new(
                ErrorCode::OutcomeUnknown,
                format!(
                    "{} passed its commit point and did not finish within {} s of the stop request; whether its change is complete is unknown",
                    inv.tool_id,
                    grace.as_secs()
                ),
            )),
        }
    }
}

/// What a grant needs of the execution queue ([`crate::approval::grant`]).
impl crate::approval::ExecutionQueue for Harness {
    type Slot = ExecutionSlot;

    fn slot(&self, owner_id: &str) -> Option<ExecutionSlot> {
        Harness::slot(self, owner_id)
    }

    fn claim(&self) -> HarnessClaim<'_> {
        Harness::claim(self)
    }

    fn next_tag(&self, owner_id: &str) -> i64 {
        self.queue.next_tag(owner_id)
    }

    fn took(&self, owner_id: &str, tag: i64) {
        self.queue.took(owner_id, tag);
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
