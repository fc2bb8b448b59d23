//! Leftovers of the Edit tools: the temporary file of an atomic write
//! (`.mira-<uuid>[.<node>].tmp`, written beside its target, then renamed over it) and the
//! hidden name a directory being deleted gets (`.mira-delete-<uuid>[.<node>]`). A process
//! killed between those steps (`kill -9`, a power cut) leaves them in the workspace.
//! [`sweep`] removes them when the server starts.
//!
//! Only ours: a name must be exactly one of the two forms above with a version-7 UUID (whose
//! first 48 bits are its creation time in milliseconds); a temporary file must be a regular
//! file with one link, a delete directory a directory; symlinks are never followed or
//! removed through. Only dead ones, decided per entry:
//! - named with this node's id (the stable id of the data directory) and created before
//!   this process started: the previous process of this node made it and is gone (the
//!   same assumption `Harness::recover` makes about its invocations); removed at once;
//! - otherwise (another replica's, or from before names carried a node id): removed only
//!   when both its UUID time and its modification time are older than `min_age`, which is
//!   longer than any execution may run on any replica (the execution timeout plus a
//!   margin), so a write of another replica that is still running is never touched.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cap_fs_ext::DirExt as _;
use cap_std::fs::Dir;
use serde::Serialize;

use super::Workspace;

/// Prefix of every name the Edit tools leave while they work.
pub const PREFIX: &str = ".mira-";
/// Added to the execution timeout to give the age past which anyone's leftover is dead.
pub const MARGIN: Duration = Duration::from_secs(600);
/// Most directory entries one sweep of one workspace looks at.
pub const MAX_SWEEP_ENTRIES: u64 = 2_000_000;

/// What a leftover name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftoverKind {
    /// A temporary file of an atomic write.
    Temp,
    /// A directory renamed aside by `delete_path` before its removal.
    DeleteDir,
}

/// A parsed leftover name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// Which kind.
    pub kind: LeftoverKind,
    /// Creation time from the UUID, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The node id in the name, if any.
    pub node: Option<String>,
}

/// A node id as it may appear in a name: 1–64 ASCII letters, digits or `-`; None otherwise
/// (then names carry no node id).
fn node_tag(node: Option<&str>) -> Option<&str> {
    node.filter(|n| !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

fn name(stem: &str, node: Option<&str>, suffix: &str) -> String {
    let uuid = uuid::Uuid::now_v7().simple();
    match node_tag(node) {
        Some(tag) => format!("{PREFIX}{stem}{uuid}.{tag}{suffix}"),
        None => format!("{PREFIX}{stem}{uuid}{suffix}"),
    }
}

/// A fresh temporary-file name for an atomic write by `node`.
pub fn temp_name(node: Option<&str>) -> String {
    name("", node, ".tmp")
}

/// A fresh hidden name for a directory `delete_path` removes, by `node`.
pub fn delete_name(node: Option<&str>) -> String {
    name("delete-", node, "")
}

/// Parses a leftover name; None for any other name.
pub fn parse(name: &str) -> Option<Leftover> {
    let rest = name.strip_prefix(PREFIX)?;
    let (kind, rest) = match rest.strip_prefix("delete-") {
        Some(r) => (LeftoverKind::DeleteDir, r),
        None => (LeftoverKind::Temp, rest.strip_suffix(".tmp")?),
    };
    let (uuid_text, node) = match rest.split_once('.') {
        Some((u, n)) => (u, Some(n)),
        None => (rest, None),
    };
    if uuid_text.len() != 32 || node.is_some_and(|n| node_tag(Some(n)).is_none()) {
        return None;
    }
    let uuid = uuid::Uuid::try_parse(uuid_text).ok()?;
    if uuid.get_version_num() != 7 {
        return None;
    }
    let (secs, nanos) = uuid.get_timestamp()?.to_unix();
    Some(Leftover { kind, created_ms: secs * 1000 + u64::from(nanos / 1_000_000), node: node.map(str::to_owned) })
}

/// When a leftover counts as dead (see the module docs).
#[derive(Debug, Clone)]
pub struct SweepRule {
    /// This node's stable id.
    pub node: String,
    /// When this process started, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// Age past which anyone's leftover is dead.
    pub min_age: Duration,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepReport {
    /// Temporary files removed.
    pub temp_files_removed: u64,
    /// Delete directories removed.
    pub delete_dirs_removed: u64,
    /// Leftover names kept because they may belong to a running write.
    pub kept_recent: u64,
    /// Entries looked at.
    pub scanned: u64,
    /// True when the walk stopped at [`MAX_SWEEP_ENTRIES`].
    pub capped: bool,
    /// Entries that could not be removed or read.
    pub errors: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `left` (with modification time `mtime_ms`) is dead under `rule` at `now_ms`.
pub fn is_dead(left: &Leftover, mtime_ms: u64, rule: &SweepRule, now_ms: u64) -> bool {
    if left.node.as_deref() == Some(rule.node.as_str()) && left.created_ms < rule.started_ms {
        return true;
    }
    let min_age = u64::try_from(rule.min_age.as_millis()).unwrap_or(u64::MAX);
    let newest = left.created_ms.max(mtime_ms);
    now_ms.saturating_sub(newest) >= min_age
}

/// Walks the workspace through its open root handle, never following symlinks, and removes
/// dead leftovers (see the module docs). Stops early when `stop` is cancelled.
pub fn sweep(ws: &Workspace, rule: &SweepRule, stop: &tokio_util::sync::CancellationToken) -> SweepReport {
    let mut report = SweepReport::default();
    let now = now_ms();
    let Ok(top) = ws.dir().try_clone() else {
        report.errors += 1;
        return report;
    };
    let mut stack = vec![top];
    while let Some(dir) = stack.pop() {
        if stop.is_cancelled() {
            break;
        }
        let Ok(entries) = dir.entries() else {
            report.errors += 1;
            continue;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                report.errors += 1;
                continue;
            };
            report.scanned += 1;
            if report.scanned > MAX_SWEEP_ENTRIES {
                report.capped = true;
                return report;
            }
            let name = entry.file_name();
            let Ok(kind) = entry.file_type() else {
                report.errors += 1;
                continue;
            };
            let leftover = name.to_str().and_then(parse);
            match leftover {
                Some(left) => match remove_if_dead(&dir, &name, &left, rule, now) {
                    Ok(true) if left.kind == LeftoverKind::Temp => report.temp_files_removed += 1,
                    Ok(true) => report.delete_dirs_removed += 1,
                    Ok(false) => report.kept_recent += 1,
                    Err(_) => report.errors += 1,
                },
                None if kind.is_dir() => match dir.open_dir_nofollow(&name) {
                    Ok(sub) => stack.push(sub),
                    Err(_) => report.errors += 1,
                },
                None => {}
            }
        }
    }
    report
}

/// Removes `name` in `dir` when it is a dead leftover of the right type; Ok(false) when it
/// is kept (alive, or not of the type its name says).
fn remove_if_dead(dir: &Dir, name: &std::ffi::OsStr, left: &Leftover, rule: &SweepRule, now: u64) -> io::Result<bool> {
    let meta = dir.symlink_metadata(name)?;
    let mtime_ms =
        meta.modified().ok().map(cap_std::time::SystemTime::into_std).and_then(|t| t.duration_since(UNIX_EPOCH).ok());
    let mtime_ms = mtime_ms.map_or(u64::MAX, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ours = match left.kind {
        LeftoverKind::Temp => meta.is_file() && cap_std::fs::MetadataExt::nlink(&meta) == 1,
        LeftoverKind::DeleteDir => meta.is_dir(),
    };
    if !ours || !is_dead(left, mtime_ms, rule, now) {
        return Ok(false);
    }
    match left.kind {
        LeftoverKind::Temp => dir.remove_file(name)?,
        LeftoverKind::DeleteDir => dir.remove_dir_all(name)?,
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_not_ours() {
        let t = temp_name(Some("node-abc123"));
        let p = parse(&t).unwrap();
        assert_eq!((p.kind, p.node.as_deref()), (LeftoverKind::Temp, Some("node-abc123")));
        assert!(now_ms().abs_diff(p.created_ms) < 5_000);
        assert_eq!(parse(&temp_name(None)).unwrap().node, None);
        assert_eq!(parse(&temp_name(Some("bad/tag"))).unwrap().node, None);
        assert_eq!(parse(&delete_name(Some("n1"))).unwrap().kind, LeftoverKind::DeleteDir);
        for other in [
            ".mira-notes.tmp",
            ".mira-.tmp",
            "mira-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b.tmp",
            ".mira-0190a1b2c3d44e8f9a0b1c2d3e4f5a6b.tmp", // version 4
            ".mira-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b.tmp.bak",
            ".mira-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b.a/b.tmp",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn dead_means_own_previous_process_or_old() {
        let rule = SweepRule { node: "n1".into(), started_ms: 10_000_000, min_age: Duration::from_secs(600) };
        let left = |node: Option<&str>, created_ms| Leftover {
            kind: LeftoverKind::Temp,
            created_ms,
            node: node.map(str::to_owned),
        };
        let now = 10_100_000;
        assert!(is_dead(&left(Some("n1"), 9_999_000), 9_999_000, &rule, now), "own, before this start");
        assert!(!is_dead(&left(Some("n1"), 10_050_000), 10_050_000, &rule, now), "own, this process");
        assert!(!is_dead(&left(Some("n2"), 9_999_000), 9_999_000, &rule, now), "another node's, recent");
        assert!(is_dead(&left(Some("n2"), 9_000_000), 9_000_000, &rule, now), "another node's, old");
        assert!(!is_dead(&left(None, 9_000_000), 10_090_000, &rule, now), "old name, recently written");
    }
}
