//! The commit point: the moment a running call's side effect becomes irreversible, and the
//! rule that a status never contradicts a side effect.
//!
//! Every tool declares what stopping it means ([`SideEffects`]):
//! - [`SideEffects::None`]: it only reads (every tool the policy lets run without approval).
//!   A stop request always wins; the work is dropped and the status is `cancelled`.
//! - [`SideEffects::AtCommitPoint`]: it changes the world in one step it marks by calling
//!   [`crate::tool::ExecContext::commit`] right before it — the Edit tools' rename
//!   (`write_file`, `replace_block`), unlink or first rename (`delete_path`) and rename
//!   (`move_path`). Everything before that step (temporary files, checks) is undone by the
//!   tool itself when the commit is refused.
//! - [`SideEffects::FromStart`]: it may act from the moment it starts (a terminal process,
//!   an External MCP call, a dynamic capability); the harness commits for it before it runs.
//!
//! A [`CommitGate`] decides, atomically, between the tool's commit and a stop request
//! (cancel, time limit, server stop): whichever comes first wins, and the loser learns it.
//! A stop that wins means the side effect can no longer happen, so `cancelled` (or the
//! time-limit failure) is the truth even while the tool is still unwinding. A stop that
//! comes after the commit is *too late*: an `AtCommitPoint` tool finishes and its status is
//! what it did (`completed`, with a note that a cancel was requested too late); a
//! `FromStart` tool is asked to stop as far as it can (its cancellation token) and its
//! status is what it reports.

use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;

use crate::error_code::ErrorCode;
use crate::tool::ToolError;

/// What stopping a running call means for a tool (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffects {
    /// Only reads: stopping it at any moment leaves the world as it was.
    None,
    /// Changes the world at one point the tool marks with `ExecContext::commit`.
    AtCommitPoint,
    /// May change the world from the moment it starts.
    FromStart,
}

/// The `outcome` of a result's `stop` note: what a stop request did to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopNoteOutcome {
    /// The stop won before the commit point; nothing was changed.
    StoppedBeforeCommit,
    /// The call had started acting (`SideEffects::FromStart`); it was asked to stop as far
    /// as it can.
    AfterStart,
    /// The call had passed its commit point; it was not stopped.
    TooLate,
}

/// Why a running call is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The owner cancelled it (`POST /v1/invocations/{id}/cancel`).
    Cancel,
    /// The execution time limit passed.
    Timeout,
    /// The server is stopping.
    Shutdown,
}

impl StopReason {
    /// The tool error a call stopped for this reason ends with (`cancelled`, `timeout`,
    /// `interrupted`).
    pub fn error(self, detail: &str) -> ToolError {
        let (code, why) = match self {
            Self::Cancel => (ErrorCode::Cancelled, "the invocation was cancelled"),
            Self::Timeout => (ErrorCode::Timeout, "the execution time limit passed"),
            Self::Shutdown => (ErrorCode::Interrupted, "the server stopped"),
        };
        ToolError::new(code, format!("{why}; {detail}"))
    }
}

/// Where a gate stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateState {
    /// Neither committed nor stopped.
    Open,
    /// The tool passed its commit point; `late_stop` is the first stop requested after it
    /// (with its RFC 3339 time), if any.
    Committed {
        /// The stop that came too late.
        late_stop: Option<(StopReason, String)>,
    },
    /// A stop won before the commit point: the side effect can no longer happen.
    Stopped {
        /// Why.
        reason: StopReason,
        /// RFC 3339.
        at: String,
    },
}

/// What a stop request achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// The stop won: the call will not pass its commit point.
    Stopped,
    /// The call had already passed its commit point (and is still running).
    TooLate,
    /// The call had already returned; its result stands as it is.
    Finished,
}

/// The race between a tool's commit and a stop request, decided once (see the module docs).
/// Cheap to clone; every clone is the same gate.
#[derive(Debug, Clone)]
pub struct CommitGate {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    state: GateState,
    /// Set when the call returned: later stop requests change nothing.
    finished: bool,
}

impl Default for CommitGate {
    fn default() -> Self {
        Self::new()
    }
}

impl CommitGate {
    /// An open gate.
    pub fn new() -> Self {
        Self { inner: Arc::new(Mutex::new(Inner { state: GateState::Open, finished: false })) }
    }

    /// Passes the commit point, unless a stop won first (then its reason is returned and the
    /// caller must not make its change). Committing twice is fine.
    pub fn commit(&self) -> Result<(), StopReason> {
        let mut inner = self.inner.lock();
        let state = &mut inner.state;
        match &*state {
            GateState::Open => {
                *state = GateState::Committed { late_stop: None };
                Ok(())
            }
            GateState::Committed { .. } => Ok(()),
            GateState::Stopped { reason, .. } => Err(*reason),
        }
    }

    /// [`CommitGate::commit`] as a tool error (`cancelled`, `timeout`, `interrupted`) for the
    /// tool to return when a stop won first.
    pub fn pass(&self) -> Result<(), ToolError> {
        self.commit().map_err(|reason| reason.error("stopped before its commit point; nothing was changed"))
    }

    /// Asks the call to stop. Idempotent: a repeated request gets the same outcome, and only
    /// the first reason is kept.
    pub fn request_stop(&self, reason: StopReason) -> StopOutcome {
        let mut inner = self.inner.lock();
        if inner.finished {
            return StopOutcome::Finished;
        }
        let state = &mut inner.state;
        match &mut *state {
            GateState::Open => {
                *state = GateState::Stopped { reason, at: crate::ids::now() };
                StopOutcome::Stopped
            }
            GateState::Stopped { .. } => StopOutcome::Stopped,
            GateState::Committed { late_stop } => {
                if late_stop.is_none() {
                    *late_stop = Some((reason, crate::ids::now()));
                }
                StopOutcome::TooLate
            }
        }
    }

    /// Marks the call as returned: from now on stop requests answer
    /// [`StopOutcome::Finished`] and the state no longer changes.
    pub fn finish(&self) {
        self.inner.lock().finished = true;
    }

    /// The current state.
    pub fn state(&self) -> GateState {
        self.inner.lock().state.clone()
    }
}

/// The note a result and its evidence carry when a stop came after the commit point (or,
/// for a [`SideEffects::FromStart`] tool, after it started): what was asked, when, and that
/// the result is what really happened.
pub fn late_stop_note(tool_id: &str, effects: SideEffects, reason: StopReason, at: &str) -> serde_json::Value {
    let (outcome, message) = match effects {
        SideEffects::FromStart => (
            StopNoteOutcome::AfterStart,
            format!(
                "a {} was requested at {at}, after {tool_id} had started acting; it was asked to stop as far as it can, and this result is what it reports",
                reason_word(reason)
            ),
        ),
        _ => (
            StopNoteOutcome::TooLate,
            format!(
                "a {} was requested at {at}, after {tool_id} had passed its commit point; it was not stopped, and this result is what happened",
                reason_word(reason)
            ),
        ),
    };
    json!({"requested_at": at, "reason": reason, "outcome": outcome, "message": message})
}

fn reason_word(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Cancel => "cancel",
        StopReason::Timeout => "stop at the time limit",
        StopReason::Shutdown => "stop at server shutdown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_of_commit_and_stop_wins_once() {
        let gate = CommitGate::new();
        assert_eq!(gate.request_stop(StopReason::Cancel), StopOutcome::Stopped);
        assert_eq!(gate.commit(), Err(StopReason::Cancel));
        assert_eq!(gate.request_stop(StopReason::Timeout), StopOutcome::Stopped);
        assert!(matches!(gate.state(), GateState::Stopped { reason: StopReason::Cancel, .. }));

        let gate = CommitGate::new();
        assert_eq!(gate.commit(), Ok(()));
        assert_eq!(gate.commit(), Ok(()));
        assert_eq!(gate.request_stop(StopReason::Cancel), StopOutcome::TooLate);
        assert_eq!(gate.request_stop(StopReason::Timeout), StopOutcome::TooLate);
        match gate.state() {
            GateState::Committed { late_stop: Some((reason, _)) } => assert_eq!(reason, StopReason::Cancel),
            other => panic!("{other:?}"),
        }
        gate.finish();
        assert_eq!(gate.request_stop(StopReason::Cancel), StopOutcome::Finished);
        let gate = CommitGate::new();
        gate.finish();
        assert_eq!(gate.request_stop(StopReason::Cancel), StopOutcome::Finished);
        assert_eq!(gate.state(), GateState::Open);
    }

    #[test]
    fn racing_threads_agree() {
        for _ in 0..200 {
            let gate = CommitGate::new();
            let g = gate.clone();
            let committer = std::thread::spawn(move || g.commit().is_ok());
            let stopped = gate.request_stop(StopReason::Cancel) == StopOutcome::Stopped;
            let committed = committer.join().unwrap_or(false);
            assert_ne!(stopped, committed, "exactly one of commit and stop wins");
        }
    }
}
