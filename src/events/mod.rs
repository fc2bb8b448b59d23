//! Events: the run's log, stored first and broadcast second.
//!
//! Every state change of the chain appends an event to the `events` table inside the same
//! transaction as the change ([`crate::store::WriteTx::append_event`]). Only after the
//! transaction commits does the [`EventBus`] wake subscribers, and subscribers read the
//! events themselves back from the store. A wake-up is therefore only a hint: a missed or
//! reordered signal can delay an event on a stream, never lose or duplicate it.
//!
//! On Postgres the same signals reach every replica: after the write transaction commits,
//! its events are announced with `pg_notify('mira_events', …)`, and each replica's
//! [`listen`] task feeds what other replicas sent into its own bus. After every
//! (re)connection of that listener, and every few seconds, the bus sends
//! [`Heard::Resync`], which makes every subscriber re-read the store, so notifications lost
//! while it was away (or never sent) lose nothing.

pub mod listen;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

    /// The kind of a wire name (`approval.granted`), None for an unknown one.
    pub fn parse(name: &str) -> Option<Self> {
        ALL_KINDS.iter().copied().find(|k| k.as_str() == name)
    }
}

/// Every event type.
const ALL_KINDS: [EventKind; 15] = [
    EventKind::ExposureCreated,
    EventKind::InvocationFrozen,
    EventKind::InvocationCancelled,
    EventKind::InvocationCancelRequested,
    EventKind::ApprovalRequested,
    EventKind::ApprovalGranted,
    EventKind::ApprovalDenied,
    EventKind::ApprovalExpired,
    EventKind::ExecutionStarted,
    EventKind::ExecutionCompleted,
    EventKind::ExecutionFailed,
    EventKind::ExecutionProgress,
    EventKind::EvidenceRecorded,
    EventKind::EvidenceAccepted,
    EventKind::TerminalOutput,
];

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

/// What the bus carries.
#[derive(Debug, Clone)]
enum BusMsg {
    Run(RunSignal),
    Resync,
}

/// What a subscriber hears next.
#[derive(Debug, Clone)]
pub enum Heard {
    /// A run has a new committed event.
    Run(RunSignal),
    /// Signals may have been missed (the cross-replica listener reconnected, or this
    /// subscriber lagged): re-read whatever is followed.
    Resync,
    /// The bus is gone (the server stops).
    Closed,
}

/// One subscriber's receiver (see [`EventBus::subscribe`]).
pub struct Subscription(broadcast::Receiver<BusMsg>);

impl Subscription {
    /// The next signal; a subscriber that fell more than the bus's capacity behind hears
    /// [`Heard::Resync`].
    pub async fn recv(&mut self) -> Heard {
        match self.0.recv().await {
            Ok(BusMsg::Run(s)) => Heard::Run(s),
            Ok(BusMsg::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => Heard::Resync,
            Err(broadcast::error::RecvError::Closed) => Heard::Closed,
        }
    }

    /// The next signal if one is waiting (None when none is).
    pub fn try_recv(&mut self) -> Option<Heard> {
        match self.0.try_recv() {
            Ok(BusMsg::Run(s)) => Some(Heard::Run(s)),
            Ok(BusMsg::Resync) | Err(broadcast::error::TryRecvError::Lagged(_)) => Some(Heard::Resync),
            Err(broadcast::error::TryRecvError::Closed) => Some(Heard::Closed),
            Err(broadcast::error::TryRecvError::Empty) => None,
        }
    }
}

/// State of the cross-replica listener (reported by `/readyz`).
#[derive(Debug, Default)]
pub struct ListenerStatus {
    /// A listener task runs (Postgres back-end).
    pub enabled: AtomicBool,
    /// The listener is connected and listening now.
    pub listening: AtomicBool,
    /// Successful connections so far (the first one included).
    pub connections: AtomicU64,
    /// Notifications from other replicas fed into this bus.
    pub received: AtomicU64,
}

/// Wake-ups for event subscribers, sent after commit: this process's own commits directly,
/// other replicas' through [`listen`].
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<BusMsg>,
    origin: Arc<str>,
    status: Arc<ListenerStatus>,
}

impl EventBus {
    /// A bus holding up to 4,096 undelivered signals per subscriber; a subscriber that lags
    /// further re-reads the store (see [`crate::store::follow`]).
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        let origin = uuid::Uuid::now_v7().simple().to_string();
        Self { tx, origin: origin.into(), status: Arc::default() }
    }

    /// Wakes subscribers of `signal.run_id`. Call only after the event is committed.
    pub fn publish(&self, signal: RunSignal) {
        // No subscribers is fine: the event is in the store.
        let _ = self.tx.send(BusMsg::Run(signal));
    }

    /// Makes every subscriber re-read the store (signals may have been lost).
    pub fn resync(&self) {
        let _ = self.tx.send(BusMsg::Resync);
    }

    /// A receiver of every signal from now on.
    pub fn subscribe(&self) -> Subscription {
        Subscription(self.tx.subscribe())
    }

    /// This process's random id in cross-replica notifications (its own are skipped).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The cross-replica listener's state.
    pub fn listener(&self) -> &ListenerStatus {
        &self.status
    }

    /// The `pg_notify` payload announcing `signal` from this process:
    /// `<origin> <run id> <seq> <kind>` (well under Postgres's 8,000-byte limit).
    pub fn payload(&self, signal: &RunSignal) -> String {
        format!("{} {} {} {}", self.origin, signal.run_id, signal.seq, signal.kind.as_str())
    }

    /// Feeds a notification payload from the listener into the bus; own and malformed
    /// payloads are ignored. Returns the signal published.
    pub fn feed(&self, payload: &str) -> Option<RunSignal> {
        let mut parts = payload.split(' ');
        let (origin, run_id, seq, kind) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if origin == &*self.origin || parts.next().is_some() {
            return None;
        }
        let signal = RunSignal { run_id: run_id.to_owned(), seq: seq.parse().ok()?, kind: EventKind::parse(kind)? };
        self.status.received.fetch_add(1, Ordering::Relaxed);
        self.publish(signal.clone());
        Some(signal)
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_between_buses_and_own_is_skipped() {
        let (a, b) = (EventBus::new(), EventBus::new());
        let signal = RunSignal { run_id: "run_1".into(), seq: 7, kind: EventKind::ApprovalGranted };
        let payload = a.payload(&signal);
        assert!(a.feed(&payload).is_none(), "own notification skipped");
        let got = b.feed(&payload).expect("other replica's notification");
        assert_eq!((got.run_id.as_str(), got.seq, got.kind), ("run_1", 7, EventKind::ApprovalGranted));
        assert!(b.feed("x run_1 7 no.such").is_none());
        assert!(b.feed("x run_1 seven approval.granted").is_none());
        for k in ALL_KINDS {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
        }
    }
}
