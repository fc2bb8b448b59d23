//! Retention: a background job that removes runs nobody has touched for a configured age
//! (`mira serve --retention-days`, off by default) with their turns (and the exposures they
//! hold), invocations, approvals, evidence, events and terminal sessions (with their stored
//! output), in bounded batches, then gives the space back ([`Store::reclaim_space`]).
//!
//! A run is removed only when it was created before the cut-off, nothing happened in it since
//! (no turn, no invocation change, no event), none of its invocations is `awaiting_approval`,
//! `queued` or `running`, and none of its terminal sessions is `running`
//! ([`Store::expired_runs`]); the condition is checked again inside each batch's write
//! transaction. A removed run answers 404 like one that never existed.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{RetentionCounts, Store, StoreResult};

/// When and how much retention removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Runs idle for longer than this are removed.
    pub max_age: Duration,
    /// Time between two sweeps (the first one runs at start-up).
    pub interval: Duration,
    /// Runs removed per write transaction.
    pub batch: i64,
}

impl RetentionPolicy {
    /// Runs per batch by default: one short write transaction each.
    pub const DEFAULT_BATCH: i64 = 100;

    /// The policy of `--retention-days` (None or 0: off), sweeping every `interval_secs`.
    pub fn from_days(days: Option<u64>, interval_secs: u64) -> Option<RetentionPolicy> {
        let days = days.filter(|d| *d > 0)?;
        Some(RetentionPolicy {
            max_age: Duration::from_secs(days.saturating_mul(86_400)),
            interval: Duration::from_secs(interval_secs.max(1)),
            batch: Self::DEFAULT_BATCH,
        })
    }

    /// The cut-off time (RFC 3339) for a sweep starting now.
    pub fn cutoff(&self) -> String {
        let age = chrono::Duration::from_std(self.max_age).unwrap_or(chrono::Duration::MAX);
        let at = chrono::Utc::now().checked_sub_signed(age).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        crate::ids::format_time(at)
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Rows removed, per table.
    pub removed: RetentionCounts,
    /// Write transactions used.
    pub batches: u64,
    /// SQLite pages still free after reclaiming (0 once given back; always 0 on Postgres).
    pub free_pages: i64,
}

/// Removes every run expired at `cutoff` (RFC 3339), `batch` runs per write transaction (other
/// writers get the database between two batches), then reclaims the space.
pub async fn sweep(store: &Store, cutoff: &str, batch: i64) -> StoreResult<SweepReport> {
    let mut report = SweepReport::default();
    loop {
        let ids = store.expired_runs(cutoff, batch.max(1)).await?;
        if ids.is_empty() {
            break;
        }
        let removed = store.delete_expired_runs(&ids, cutoff).await?;
        report.batches += 1;
        report.removed.add(removed);
        if removed.runs == 0 {
            // Every candidate got new work between the two reads: the next sweep sees them.
            break;
        }
        tokio::task::yield_now().await;
    }
    if report.removed.runs > 0 {
        report.free_pages = store.reclaim_space().await?;
    }
    Ok(report)
}

/// Sweeps now and then every `policy.interval` until `shutdown`.
pub fn spawn(store: Store, policy: RetentionPolicy, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let cutoff = policy.cutoff();
            match sweep(&store, &cutoff, policy.batch).await {
                Ok(r) if r.removed.runs > 0 => tracing::info!(
                    cutoff = %cutoff,
                    runs = r.removed.runs,
                    invocations = r.removed.invocations,
                    events = r.removed.events,
                    evidence = r.removed.evidence,
                    terminal_sessions = r.removed.terminal_sessions,
                    batches = r.batches,
                    free_pages = r.free_pages,
                    "retention removed expired runs"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "retention sweep failed; retrying at the next interval"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(policy.interval) => {}
            }
        }
    })
}
