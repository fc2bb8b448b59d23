//! The control plane's side of `terminal_session` on a device: the runner posts each
//! session's output (`POST /v1/runner/terminal/output`, raw bytes at a byte offset) and its
//! end (`POST /v1/runner/terminal/end`) with its connection's session bearer; they are stored
//! through the very calls the host's flusher uses ([`Store::append_terminal_chunk`],
//! [`Store::end_terminal_session`]), so the session's SSE stream, offsets, resume and range
//! reads are those of a host session. A device's session row names the device as its
//! `node_id`; only that device's runner may write to it.
//!
//! A session whose runner stays away for a whole lease is recorded `lost`
//! ([`spawn_lost_sweep`]); the output already stored stays readable, and a runner that comes
//! back is refused further output for it (it then ends the session on the device).

use std::time::Duration;

use mira_core::remote::{DeviceSessionState, TERMINAL_CHUNK_MAX, TerminalAck, TerminalChunkQuery, TerminalEnd};
use tokio_util::sync::CancellationToken;

use super::{DeviceHub, HubError};
use crate::error::ErrorCode;
use crate::state::TerminalSessionState;
use crate::store::{SessionEnd, Store, TerminalSessionRow};

/// The state recorded for a device session's end.
pub fn recorded_state(state: DeviceSessionState) -> TerminalSessionState {
    match state {
        DeviceSessionState::Running | DeviceSessionState::Exited => TerminalSessionState::Exited,
        DeviceSessionState::Killed => TerminalSessionState::Killed,
        DeviceSessionState::TimedOut => TerminalSessionState::TimedOut,
        DeviceSessionState::Reaped => TerminalSessionState::Reaped,
    }
}

impl DeviceHub {
    /// The running session `id` of the device holding `session`: 401 `device_auth_failed`
    /// (unknown bearer), 404 `terminal_session_not_found` (no such session on that device),
    /// 409 `terminal_session_ended` (it was recorded ended, e.g. `lost`).
    async fn device_session(&self, session: &str, id: &str) -> Result<TerminalSessionRow, HubError> {
        // Output does not renew the lease: only a heartbeat does, which asks the store
        // whether the device is still this connection's.
        let device = match self.by_session(session) {
            Some((device, _)) => device,
            // In a cluster the post may land on a replica that does not hold the runner's
            // connection: the output goes to the shared store all the same, for a session
            // token that a live holder still has.
            None => {
                let sha = crate::evidence::sha256_hex(session.as_bytes());
                let row = self.store.device_by_session(&sha).await?.ok_or_else(Self::session_refused)?;
                if self.holder(&row).await? == super::Holder::Nowhere {
                    return Err(Self::session_refused());
                }
                row.id
            }
        };
        let row = self.store.terminal_session_for_any(id).await?.filter(|r| r.node_id == device).ok_or_else(|| {
            HubError::Refused(
                ErrorCode::TerminalSessionNotFound,
                format!("device {device} has no terminal session {id}"),
            )
        })?;
        if row.state != TerminalSessionState::Running {
            return Err(HubError::Refused(
                ErrorCode::TerminalSessionEnded,
                format!("terminal session {id} was recorded {}; end it", row.state),
            ));
        }
        Ok(row)
    }

    /// Stores `data`, the output `[q.offset, q.offset + data.len())` of a device's session:
    /// bytes already held are skipped (a resent chunk), a chunk past the end is 400
    /// `invalid_offset`, a chunk larger than [`TERMINAL_CHUNK_MAX`] is 400 `invalid_request`.
    /// Bytes older than `retain_bytes` before the end are dropped as on the host. Answers
    /// the bytes held.
    pub async fn terminal_output(
        &self,
        session: &str,
        q: &TerminalChunkQuery,
        data: &[u8],
        retain_bytes: u64,
    ) -> Result<TerminalAck, HubError> {
        if data.len() > TERMINAL_CHUNK_MAX {
            return Err(HubError::Refused(
                ErrorCode::InvalidRequest,
                format!("a chunk holds at most {TERMINAL_CHUNK_MAX} bytes"),
            ));
        }
        let row = self.device_session(session, &q.session_id).await?;
        let held = u64::try_from(row.bytes_out).unwrap_or(0);
        if q.offset > held {
            return Err(HubError::Refused(
                ErrorCode::InvalidOffset,
                format!("offset {} is past the {held} bytes held; send from {held}", q.offset),
            ));
        }
        let skip = usize::try_from(held - q.offset).unwrap_or(usize::MAX);
        let Some(new) = data.get(skip..).filter(|d| !d.is_empty()) else {
            return Ok(TerminalAck { bytes_out: held });
        };
        let end = held + new.len() as u64;
        if !self.store.append_device_terminal_chunk(&row.id, held, new, end.saturating_sub(retain_bytes)).await? {
            // Another chunk (or the session's end) came first: the runner sends again.
            return Err(HubError::Refused(
                ErrorCode::InvalidOffset,
                format!("the output of {} moved on from {held} meanwhile; send again", row.id),
            ));
        }
        self.terminal_wake.send_modify(|n| *n = n.wrapping_add(1));
        Ok(TerminalAck { bytes_out: end })
    }

    /// Records the end of a device's session (after all its output was acknowledged).
    pub async fn terminal_end(&self, session: &str, end: &TerminalEnd) -> Result<TerminalAck, HubError> {
        let row = self.device_session(session, &end.session_id).await?;
        let held = u64::try_from(row.bytes_out).unwrap_or(0);
        let recorded = SessionEnd {
            state: recorded_state(end.state),
            reason: end.end_reason.clone(),
            exit_code: end.exit_code,
            signal: end.signal.clone(),
        };
        self.store.end_terminal_session(&row.id, &recorded, held).await?;
        self.terminal_wake.send_modify(|n| *n = n.wrapping_add(1));
        Ok(TerminalAck { bytes_out: held })
    }

    /// Woken whenever a device's session output or end is stored in this process (the SSE
    /// stream of a device session waits on it; other replicas re-read every second).
    pub fn terminal_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.terminal_wake.subscribe()
    }
}

/// Every `lease / 3` (at least 200 ms): device sessions whose runner was last seen more than
/// a lease ago (or whose device was revoked) are recorded `lost`. Reads the store only, so
/// every replica may run it.
pub fn spawn_lost_sweep(store: Store, lease: Duration, shutdown: CancellationToken) {
    let every = (lease / 3).max(Duration::from_millis(200));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            let ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
            let cutoff = crate::ids::now_minus_ms(ms);
            match store.lose_device_terminal_sessions(&cutoff).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(sessions = n, "device terminal sessions lost with their runner"),
                Err(e) => tracing::warn!(error = %e, "sweeping device terminal sessions failed"),
            }
        }
    });
}
