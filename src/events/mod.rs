//! Events: the run's log, stored first and broadcast second.
//!
//! Every state change of the chain appends an event to the `events` table inside the same
//! transaction as the change ([`crate::store::WriteTx::append_event`]). Only after the
//! transaction commits does the [`EventBus`] wake subscribers, and subscribers read the
//! events themselves back from the store. A wake-up is therefore only a hint: a missed or
//! reordered signal can delay an event on a stream, never lose or duplicate it. The same
//! shape serves several replicas later (Postgres LISTEN/NOTIFY would feed the bus).

use serde::Serialize;
use tokio::sync::broadcast;

/// The event types of `GET /v1/runs/{id}/events` (the SSE `event:` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub enum EventKind {
    /// A turn's exposure was computed and stored.
    #[serde(rename = "exposure.created")]
    ExposureCreated,
    /// A call was frozen into an invocation.
    #[serde(rename = "invocation.frozen")]
    InvocationFrozen,
    /// The Planner cancelled an invocation before it ran.
    #[serde(rename = "invocation.cancelled")]
    InvocationCancelled,
    /// The Planner asked to cancel an invocation while it ran; the final status says what
    /// the request achieved.
    #[serde(rename = "invocation.cancel_requested")]
    InvocationCancelRequested,
    /// A frozen invocation waits for a person's decision.
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    /// The approval was granted with the exact triple.
    #[serde(rename = "approval.granted")]
    ApprovalGranted,
    /// The approval was denied.
    #[serde(rename = "approval.denied")]
    ApprovalDenied,
    /// Nobody decided within the approval TTL.
    #[serde(rename = "approval.expired")]
    ApprovalExpired,
    /// The harness claimed the invocation and started it.
    #[serde(rename = "execution.started")]
    ExecutionStarted,
    /// The tool finished and returned a result.
    #[serde(rename = "execution.completed")]
    ExecutionCompleted,
    /// The tool failed, or the server stopped while it ran (`status: interrupted`).
    #[serde(rename = "execution.failed")]
    ExecutionFailed,
    /// A piece of evidence was stored.
    #[serde(rename = "evidence.recorded")]
    EvidenceRecorded,
    /// The Planner accepted or rejected a piece of evidence.
    #[serde(rename = "evidence.accepted")]
    EvidenceAccepted,
    /// Progress reported by a running tool (an MCP server's `notifications/progress`).
    #[serde(rename = "execution.progress")]
    ExecutionProgress,
    /// Output of a terminal session (see the terminal tool).
    #[serde(rename = "terminal.output")]
    TerminalOutput,
}

impl EventKind {
    /// The wire name, e.g. `approval.granted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExposureCreated => "exposure.created",
            Self::InvocationFrozen => "invocation.frozen",
            Self::InvocationCancelled => "invocation.cancelled",
            Self::InvocationCancelRequested => "invocation.cancel_requested",
            Self::ApprovalRequested => "approval.requested",
            Self::ApprovalGranted => "approval.granted",
            Self::ApprovalDenied => "approval.denied",
            Self::ApprovalExpired => "approval.expired",
            Self::ExecutionStarted => "execution.started",
            Self::ExecutionCompleted => "execution.completed",
            Self::ExecutionFailed => "execution.failed",
            Self::ExecutionProgress => "execution.progress",
            Self::EvidenceRecorded => "evidence.recorded",
            Self::EvidenceAccepted => "evidence.accepted",
            Self::TerminalOutput => "terminal.output",
        }
    }
}

/// "Run `run_id` has events up to `seq`": the only thing the bus carries.
#[derive(Debug, Clone)]
pub struct RunSignal {
    /// The run that has a new event.
    pub run_id: String,
    /// The newest event id of that run at the time of the signal.
    pub seq: i64,
    /// The type of that event (lets a subscriber skip signals it cannot care about).
    pub kind: EventKind,
}

/// Tells the harness loop there may be work (a new queued invocation, a grant): a cheap
/// handle the stages that queue work (freeze, grant) hold instead of the harness.
#[derive(Debug, Clone, Default)]
pub struct Wake(std::sync::Arc<tokio::sync::Notify>);

impl Wake {
    /// Wakes the loop (at most one pending wake-up is kept).
    pub fn wake(&self) {
        self.0.notify_one();
    }

    /// Resolves at the next wake-up (or at once for one that came while nobody waited).
    pub async fn notified(&self) {
        self.0.notified().await;
    }
}

/// In-process wake-ups for event subscribers, sent after commit.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<RunSignal>,
}

impl EventBus {
    /// A bus holding up to 4,096 undelivered signals per subscriber; a subscriber that lags
    /// further re-reads the store (see [`crate::store::follow`]).
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self { tx }
    }

    /// Wakes subscribers of `signal.run_id`. Call only after the event is committed.
    pub fn publish(&self, signal: RunSignal) {
        // No subscribers is fine: the event is in the store.
        let _ = self.tx.send(signal);
    }

    /// A receiver of every signal from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RunSignal> {
        self.tx.subscribe()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}
