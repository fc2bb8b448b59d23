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

use std::path::{Path, PathBuf};
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

/// Removes the files directly in `dir` last written more than `max_age` ago; returns how many.
/// For folders of files named by their content and written again whenever they are made again
/// (the browser's screenshots): such a file is kept for `max_age` after it was last made, like
/// the runs that name it, even when one of those runs lives longer. A missing folder removes
/// nothing.
pub fn sweep_files(dir: &Path, max_age: Duration) -> std::io::Result<u64> {
    let Some(cutoff) = std::time::SystemTime::now().checked_sub(max_age) else { return Ok(0) };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    // An entry that cannot be read (a temporary file renamed meanwhile) is passed over.
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let old = meta.modified().is_ok_and(|at| at < cutoff);
        if meta.is_file() && old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Sweeps now and then every `policy.interval` until `shutdown`: the store, then the folders
/// of `files` ([`sweep_files`]).
pub fn spawn(
    store: Store,
    policy: RetentionPolicy,
    files: Vec<PathBuf>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for dir in &files {
                let (dir, age) = (dir.clone(), policy.max_age);
                match tokio::task::spawn_blocking(move || sweep_files(&dir, age)).await {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::info!(files = n, "retention removed expired files"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "retention could not sweep a folder"),
                    Err(e) => tracing::warn!(error = %e, "retention's folder sweep failed"),
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_older_than_the_age_go() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.png");
        let new = dir.path().join("new.png");
        std::fs::write(&old, b"x").unwrap();
        std::fs::write(&new, b"y").unwrap();
        let long_ago = std::time::SystemTime::now() - Duration::from_secs(3 * 86_400);
        std::fs::File::options().write(true).open(&old).unwrap().set_modified(long_ago).unwrap();
        assert_eq!(sweep_files(dir.path(), Duration::from_secs(86_400)).unwrap(), 1);
        assert!(!old.exists() && new.exists());
        assert_eq!(sweep_files(&dir.path().join("missing"), Duration::from_secs(1)).unwrap(), 0);
    }
}
