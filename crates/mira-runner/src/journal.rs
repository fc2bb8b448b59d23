//! The runner's local job journal: what makes a job run at most once and its result
//! survive a lost connection.
//!
//! - `nonce-<nonce>`: created (`O_EXCL`) when a job is accepted; a second job with the same
//!   nonce is a replay.
//! - `inv-<invocation>.started`: created (`O_EXCL`, synced) before an execution starts; a
//!   second execution of the same invocation is refused, whatever its nonce.
//! - `inv-<invocation>.result`: the [`JobResult`] once it finished (written to a temporary
//!   file, synced, renamed); `.delivered` once the control plane took it.
//!
//! A `.started` without a `.result` after a restart means the runner died during the call:
//! its result is `outcome_unknown`, never a second run. An execution still running in this
//! process (a long terminal `wait` across a reconnect) is not one of those: the journal
//! knows which it started and has not finished.
//!
//! Each `nonce-…` and `.started` entry records the expiry of its job's envelope.
//! [`Journal::prune`] removes what is no longer needed once that expiry has passed (a job
//! whose expiry has passed is refused as `job_expired` before the journal is consulted, so
//! replay protection holds without the entry): `nonce-…` entries, and `.started` with
//! `.delivered` of executions whose result the control plane took. A result not yet
//! delivered (`.result`, or `.started` alone) is kept whatever its age.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use mira_core::error_code::ErrorCode;
use mira_core::remote::{JobOutcome, JobResult};
use mira_core::tool::ToolError;

/// How often a running runner prunes its journal (it also prunes at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(300);

/// How long an entry that records no expiry (written by an older runner) is kept after it
/// was last written: far longer than any envelope lives (60 s).
const KEEP_WITHOUT_EXPIRY: Duration = Duration::from_secs(3600);

/// What [`Journal::prune`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    /// `nonce-…` entries removed.
    pub nonces: usize,
    /// Delivered executions removed (their `.started` and `.delivered`).
    pub executions: usize,
}

/// The journal directory. Clones share what this process has running.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    /// Invocations whose execution this process started and has not finished.
    running: Arc<Mutex<HashSet<String>>>,
}

/// Only hex digits, letters, `_` and `-` go into file names.
fn safe(name: &str) -> Option<&str> {
    (!name.is_empty() && name.len() <= 128 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
        .then_some(name)
}

fn create_new(path: &Path, content: &str) -> std::io::Result<bool> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut f) => {
            f.write_all(content.as_bytes())?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

fn replayed(what: &str) -> ToolError {
    ToolError::new(ErrorCode::JobReplayed, format!("{what} was already received by this runner; nothing was run again"))
}

fn io(e: &std::io::Error) -> ToolError {
    ToolError::new(ErrorCode::IoError, format!("the runner's journal cannot be written: {e}; nothing was run"))
}

impl Journal {
    /// The journal in `dir` (created if missing).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self { dir: dir.to_owned(), running: Arc::default() })
    }

    /// Accepts the job with `nonce`, whose envelope expires at `expires_at` (RFC 3339 as
    /// in the envelope), once. Errors: `job_replayed`.
    pub fn accept_nonce(&self, nonce: &str, expires_at: &str) -> Result<(), ToolError> {
        let nonce = safe(nonce).ok_or_else(|| replayed("a job without a usable nonce"))?;
        match create_new(&self.dir.join(format!("nonce-{nonce}")), expires_at) {
            Ok(true) => Ok(()),
            Ok(false) => Err(replayed(&format!("job {nonce}"))),
            Err(e) => Err(io(&e)),
        }
    }

    /// Marks the execution of `invocation` (job `nonce`, whose envelope expires at
    /// `expires_at`) as started, once. Errors: `job_replayed`.
    pub fn start(&self, invocation: &str, nonce: &str, expires_at: &str) -> Result<(), ToolError> {
        let inv = safe(invocation).ok_or_else(|| replayed("an execution without an invocation id"))?;
        let dir = std::fs::File::open(&self.dir).map_err(|e| io(&e))?;
        let started = create_new(&self.dir.join(format!("inv-{inv}.started")), &format!("{nonce}\n{expires_at}\n"))
            .map_err(|e| io(&e))?;
        // The entry itself must survive a crash before the tool acts.
        dir.sync_all().map_err(|e| io(&e))?;
        if !started {
            return Err(replayed(&format!("the execution of {inv}")));
        }
        self.running.lock().unwrap_or_else(PoisonError::into_inner).insert(inv.to_owned());
        Ok(())
    }

    /// Refuses an execution of `invocation` that already started (`job_replayed`), before
    /// anything else is done for it (such as asking at the device). [`Journal::start`] is
    /// what guarantees at most once.
    pub fn not_started(&self, invocation: &str) -> Result<(), ToolError> {
        let inv = safe(invocation).ok_or_else(|| replayed("an execution without an invocation id"))?;
        if self.dir.join(format!("inv-{inv}.started")).exists() {
            return Err(replayed(&format!("the execution of {inv}")));
        }
        Ok(())
    }

    /// Records the result of an execution (before it is sent); the execution is no longer
    /// running here, whether or not the result could be written.
    pub fn finish(&self, result: &JobResult) -> std::io::Result<()> {
        let Some(inv) = safe(&result.invocation_id) else { return Ok(()) };
        let written = self.write_result(inv, result);
        self.running.lock().unwrap_or_else(PoisonError::into_inner).remove(inv);
        written
    }

    fn write_result(&self, inv: &str, result: &JobResult) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("inv-{inv}.result.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(result).unwrap_or_default())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(format!("inv-{inv}.result")))
    }

    /// Marks a result as taken by the control plane.
    pub fn delivered(&self, invocation: &str) -> std::io::Result<()> {
        let Some(inv) = safe(invocation) else { return Ok(()) };
        match std::fs::rename(self.dir.join(format!("inv-{inv}.result")), self.dir.join(format!("inv-{inv}.delivered")))
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Results not yet delivered: finished ones, and `outcome_unknown` for executions that
    /// started and never finished (the runner died during them; recorded as such now).
    /// Executions still running in this process are left out: their own result follows.
    /// Call at start-up, before any job runs.
    pub fn undelivered(&self) -> std::io::Result<Vec<JobResult>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some(inv) = name.strip_prefix("inv-") else { continue };
            if let Some(inv) = inv.strip_suffix(".result") {
                if let Ok(result) = serde_json::from_slice::<JobResult>(&std::fs::read(self.dir.join(&name))?) {
                    out.push(result);
                } else {
                    tracing::warn!(invocation = inv, "an unreadable result in the journal was skipped");
                }
            } else if let Some(inv) = inv.strip_suffix(".started") {
                let done = ["result", "delivered"].iter().any(|s| self.dir.join(format!("inv-{inv}.{s}")).exists());
                let running = self.running.lock().unwrap_or_else(PoisonError::into_inner).contains(inv);
                if !done && !running {
                    let text = std::fs::read_to_string(self.dir.join(&name)).unwrap_or_default();
                    let nonce = text.lines().next().unwrap_or_default().trim().to_owned();
                    let result = JobResult {
                        nonce,
                        invocation_id: inv.to_owned(),
                        outcome: JobOutcome::Error {
                            error: ToolError::new(
                                ErrorCode::OutcomeUnknown,
                                format!(
                                    "the runner stopped while {inv} ran; whether its change is complete is unknown, and it is not run again"
                                ),
                            ),
                        },
                        late: true,
                    };
                    self.finish(&result)?;
                    out.push(result);
                }
            }
        }
        Ok(out)
    }

    /// Removes the entries no longer needed at `now` (RFC 3339 as in the envelopes): every
    /// `nonce-…` whose envelope expired, and every delivered execution (`.started` and
    /// `.delivered`) whose envelope expired. Undelivered results are kept. An entry that
    /// records no expiry is kept for an hour after it was last written.
    pub fn prune(&self, now: &str) -> std::io::Result<Pruned> {
        let mut pruned = Pruned::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with("nonce-") {
                if expired(&path, |text| text.trim(), now) && remove(&path)? {
                    pruned.nonces += 1;
                }
            } else if let Some(inv) = name.strip_prefix("inv-").and_then(|n| n.strip_suffix(".delivered")) {
                let started = self.dir.join(format!("inv-{inv}.started"));
                let due = if started.exists() {
                    expired(&started, |text| text.lines().nth(1).unwrap_or_default().trim(), now)
                } else {
                    // Left by a prune interrupted between its two removals.
                    true
                };
                if due {
                    // `.started` first: a `.started` left alone would read as a call that
                    // never finished (outcome_unknown).
                    remove(&started)?;
                    remove(&path)?;
                    pruned.executions += 1;
                }
            }
        }
        Ok(pruned)
    }
}

/// Whether the entry at `path`, whose expiry `expiry` reads from its text, has expired
/// at `now`; an entry without a readable expiry by its age.
fn expired(path: &Path, expiry: impl Fn(&str) -> &str, now: &str) -> bool {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let at = expiry(&text);
    if looks_like_time(at) {
        return at <= now;
    }
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > KEEP_WITHOUT_EXPIRY)
}

/// An RFC 3339 time as the envelopes carry it (`2026-01-02T03:04:05.678Z`), so that two
/// compare as strings.
fn looks_like_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24 && b.get(10) == Some(&b'T') && b.ends_with(b"Z") && b.iter().take(4).all(u8::is_ascii_digit)
}

/// Removes a file; whether it was there.
fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result_of(inv: &str) -> JobResult {
        JobResult {
            nonce: "n1".into(),
            invocation_id: inv.into(),
            outcome: JobOutcome::Output {
                output: mira_core::tool::ToolOutput { output: serde_json::json!({"ok": true}), evidence: Vec::new() },
            },
            late: false,
        }
    }

    /// An execution still running here is not reported `outcome_unknown` (a reconnect while a
    /// long call runs); once finished its own result is the undelivered one; a restart (a
    /// new journal on the same folder) reports one that never finished as unknown.
    #[test]
    fn a_running_execution_is_not_reported_unknown_but_one_left_by_a_dead_process_is() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.start("inv_a", "n1", "2999-01-01T00:00:00.000Z").unwrap();
        journal.start("inv_b", "n2", "2999-01-01T00:00:00.000Z").unwrap();
        assert!(journal.undelivered().unwrap().is_empty(), "both still run here");
        journal.finish(&result_of("inv_a")).unwrap();
        let out = journal.undelivered().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].invocation_id, "inv_a");
        assert!(matches!(out[0].outcome, JobOutcome::Output { .. }), "{:?}", out[0].outcome);
        // A new process: inv_b started and never finished.
        let restarted = Journal::open(dir.path()).unwrap();
        let mut out = restarted.undelivered().unwrap();
        out.sort_by(|x, y| x.invocation_id.cmp(&y.invocation_id));
        assert_eq!(out.len(), 2);
        match &out[1].outcome {
            JobOutcome::Error { error } => assert_eq!(error.code, ErrorCode::OutcomeUnknown),
            other => panic!("{other:?}"),
        }
    }
}
