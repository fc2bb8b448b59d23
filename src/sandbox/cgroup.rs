//! A cgroup per session: membership that a process cannot leave (no capabilities, no write
//! access to `/sys/fs/cgroup`), `cgroup.kill` for the whole tree, and `pids.max` /
//! `memory.max` limits where the host lets this server set them.
//!
//! Probed, not assumed (cgroups(7), Documentation/admin-guide/cgroup-v2.rst):
//! - cgroup v2 (`cgroup2` in `/proc/self/mountinfo`, our group from the `0::` line of
//!   `/proc/self/cgroup`): a child group `mira-<node>` of the server's own group, one group
//!   per session below it. `cgroup.kill` needs Linux 5.14. The `pids` and `memory`
//!   controllers are used when they can be enabled in the server's group's
//!   `cgroup.subtree_control` (a group that holds processes cannot enable controllers for its
//!   children unless it is the root group: the "no internal processes" rule).
//! - cgroup v1 (hybrid hosts): the `pids` and `memory` hierarchies give the limits (and a
//!   membership list to kill from) when v2 cannot.
//!
//! Without any writable hierarchy, sessions are still killed by session id and environment
//! marker (`crate::tools::terminal::host::kill_session`), and `/readyz` says so.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// What this host's cgroups give the sandbox.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CgroupSupport {
    /// The cgroup v2 mount, when there is one.
    pub v2_mount: Option<String>,
    /// Controllers enabled for sessions in the v2 hierarchy (`pids`, `memory`).
    pub v2_controllers: Vec<String>,
    /// The v2 group sessions are created under (writable by this server).
    pub v2_base: Option<String>,
    /// `cgroup.kill` is available (Linux ≥ 5.14).
    pub v2_kill: bool,
    /// The v1 `pids` group sessions are created under, when v2 has no `pids` controller.
    pub v1_pids_base: Option<String>,
    /// The v1 `memory` group sessions are created under, when v2 has no `memory` controller.
    pub v1_memory_base: Option<String>,
    /// Why a hierarchy could not be used (one line per problem).
    pub notes: Vec<String>,
}

impl CgroupSupport {
    /// Whether a session's whole process tree can be found (and killed) through a cgroup.
    pub fn membership(&self) -> bool {
        self.v2_base.is_some() || self.v1_pids_base.is_some() || self.v1_memory_base.is_some()
    }

    /// Whether `pids.max` can be set per session.
    pub fn pids_limit(&self) -> bool {
        self.v2_controllers.iter().any(|c| c == "pids") || self.v1_pids_base.is_some()
    }

    /// Whether a memory limit can be set per session.
    pub fn memory_limit(&self) -> bool {
        self.v2_controllers.iter().any(|c| c == "memory") || self.v1_memory_base.is_some()
    }

    /// How the whole process tree of a session is killed: `cgroup.kill`, `cgroup_procs`
    /// (SIGKILL to every member until none is left) or `session_scan` (no cgroup).
    pub fn kill_mechanism(&self) -> &'static str {
        if self.v2_base.is_some() && self.v2_kill {
            "cgroup.kill"
        } else if self.membership() {
            "cgroup_procs"
        } else {
            "session_scan"
        }
    }

    /// Probes the hierarchies and creates this node's base groups (`mira-<node_id>`).
    pub fn probe(node_id: &str) -> CgroupSupport {
        let mut s = CgroupSupport::default();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let leaf = format!("mira-{node_id}");
        // proc(5): "… mount-point … - fstype source super-options".
        let mut v1: Vec<(String, String)> = Vec::new();
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else { continue };
            let (Some(point), Some(fstype), Some(opts)) = (fields.get(4), fields.get(dash + 1), fields.get(dash + 3))
            else {
                continue;
            };
            let point = unescape_mount(point);
            if *fstype == "cgroup2" && s.v2_mount.is_none() {
                s.v2_mount = Some(point);
            } else if *fstype == "cgroup" {
                for ctl in ["pids", "memory"] {
                    if opts.split(',').any(|o| o == ctl) {
                        v1.push((ctl.to_owned(), point.clone()));
                    }
                }
            }
        }
        let own_path = |ctl: &str| -> Option<String> {
            own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, ctls, path) = (parts.next()?, parts.next()?, parts.next()?);
                let hit = if ctl.is_empty() { ctls.is_empty() } else { ctls.split(',').any(|c| c == ctl) };
                hit.then(|| path.to_owned())
            })
        };
        if let (Some(mount), Some(path)) = (s.v2_mount.clone(), own_path("")) {
            let group = Path::new(&mount).join(path.trim_start_matches('/'));
            remove_empty_bases(&group, &leaf);
            let base = group.join(&leaf);
            match std::fs::create_dir_all(&base) {
                Ok(()) => {
                    s.v2_kill = base.join("cgroup.kill").exists();
                    let available = std::fs::read_to_string(group.join("cgroup.controllers")).unwrap_or_default();
                    for ctl in ["pids", "memory"] {
                        if !available.split_whitespace().any(|c| c == ctl) {
                            continue;
                        }
                        let enabled = write(&group.join("cgroup.subtree_control"), &format!("+{ctl}")).is_ok()
                            && write(&base.join("cgroup.subtree_control"), &format!("+{ctl}")).is_ok();
                        if enabled {
                            s.v2_controllers.push(ctl.to_owned());
                        } else {
                            s.notes.push(format!(
                                "cgroup v2 controller {ctl} cannot be enabled below {} (a group with processes cannot delegate controllers)",
                                group.display()
                            ));
                        }
                    }
                    if !s.v2_kill {
                        s.notes.push("cgroup.kill is missing (Linux < 5.14): members are killed one by one".into());
                    }
                    s.v2_base = Some(base.to_string_lossy().into_owned());
                }
                Err(e) => s.notes.push(format!("cgroup v2 group {} cannot be created: {e}", base.display())),
            }
        }
        for (ctl, mount) in v1 {
            if s.v2_controllers.contains(&ctl) {
                continue;
            }
            let Some(path) = own_path(&ctl) else { continue };
            let group = Path::new(&mount).join(path.trim_start_matches('/'));
            remove_empty_bases(&group, &leaf);
            let base = group.join(&leaf);
            let file = if ctl == "pids" { "pids.max" } else { "memory.limit_in_bytes" };
            match std::fs::create_dir_all(&base) {
                Ok(()) if base.join(file).exists() => {
                    let base = Some(base.to_string_lossy().into_owned());
                    if ctl == "pids" {
                        s.v1_pids_base = base;
                    } else {
                        s.v1_memory_base = base;
                    }
                }
                Ok(()) => s.notes.push(format!("cgroup v1 {ctl} group {} has no {file}", base.display())),
                Err(e) => s.notes.push(format!("cgroup v1 {ctl} group {} cannot be created: {e}", base.display())),
            }
        }
        s
    }

    /// Removes this node's base groups when they are empty (server stop).
    pub fn release(&self) {
        for base in self.bases() {
            let _ = std::fs::remove_dir(base);
        }
    }

    fn bases(&self) -> Vec<PathBuf> {
        [&self.v2_base, &self.v1_pids_base, &self.v1_memory_base].into_iter().flatten().map(PathBuf::from).collect()
    }

    /// Creates the groups of session `id` with its limits (0 = none) and opens their
    /// `cgroup.procs` for the child to join.
    pub fn create(&self, id: &str, pids_max: u64, memory_max: u64) -> std::io::Result<(SessionCgroup, Vec<OwnedFd>)> {
        let mut group = SessionCgroup { dirs: Vec::new(), kill_file: None };
        let mut fds = Vec::new();
        let v2_controllers = self.v2_controllers.clone();
        let mut make = |base: &str, limits: &[(&str, u64)]| -> std::io::Result<()> {
            // (Recreated if another server's start removed it while it was empty.)
            if !Path::new(base).is_dir() {
                std::fs::create_dir_all(base)?;
                for ctl in &v2_controllers {
                    let _ = write(&Path::new(base).join("cgroup.subtree_control"), &format!("+{ctl}"));
                }
            }
            let dir = Path::new(base).join(id);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            group.dirs.push(dir.clone());
            for (file, value) in limits {
                if *value > 0 {
                    write(&dir.join(file), &value.to_string())?;
                }
            }
            let procs = OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(dir.join("cgroup.procs"))?;
            fds.push(OwnedFd::from(procs));
            Ok(())
        };
        if let Some(base) = &self.v2_base {
            let mut limits = Vec::new();
            if self.v2_controllers.iter().any(|c| c == "pids") {
                limits.push(("pids.max", pids_max));
            }
            if self.v2_controllers.iter().any(|c| c == "memory") {
                limits.push(("memory.max", memory_max));
            }
            make(base, &limits)?;
        }
        if let Some(base) = &self.v1_pids_base {
            make(base, &[("pids.max", pids_max)])?;
        }
        if let Some(base) = &self.v1_memory_base {
            make(base, &[("memory.limit_in_bytes", memory_max)])?;
        }
        if self.v2_kill
            && let Some(base) = &self.v2_base
        {
            group.kill_file = Some(Path::new(base).join(id).join("cgroup.kill"));
        }
        Ok((group, fds))
    }

    /// The groups a previous process of this node left for session `id` (recovery).
    pub fn existing(&self, id: &str) -> Option<SessionCgroup> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return None;
        }
        let dirs: Vec<PathBuf> = self.bases().into_iter().map(|b| b.join(id)).filter(|d| d.is_dir()).collect();
        if dirs.is_empty() {
            return None;
        }
        let kill_file = dirs.iter().map(|d| d.join("cgroup.kill")).find(|f| self.v2_kill && f.exists());
        Some(SessionCgroup { dirs, kill_file })
    }

    /// Kills and removes every session group left below this node's bases (at start: no
    /// session of this process exists yet, so each one is a previous process's leftover).
    pub fn sweep(&self) -> usize {
        let mut ids: Vec<String> = Vec::new();
        for base in self.bases() {
            for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                if e.path().is_dir()
                    && let Some(name) = e.file_name().to_str()
                    && !ids.iter().any(|i| i == name)
                {
                    ids.push(name.to_owned());
                }
            }
        }
        for id in &ids {
            if let Some(g) = self.existing(id) {
                g.kill();
                g.remove(Duration::from_secs(2));
            }
        }
        ids.len()
    }
}

/// How often a group's limits struck ([`SessionCgroup::limit_events`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitEvents {
    /// Processes killed by the memory controller (`memory.max` / `memory.limit_in_bytes`).
    pub oom_kills: u64,
    /// Forks (or threads) refused at `pids.max`.
    pub pids_refused: u64,
}

/// The cgroups of one session.
#[derive(Debug)]
pub struct SessionCgroup {
    dirs: Vec<PathBuf>,
    kill_file: Option<PathBuf>,
}

impl SessionCgroup {
    /// SIGKILLs every process of the session: `cgroup.kill` when available, else every pid
    /// listed in `cgroup.procs` until none is left (members cannot leave: they hold no
    /// capability and cannot write to the cgroup filesystem).
    pub fn kill(&self) {
        if let Some(f) = &self.kill_file
            && write(f, "1").is_ok()
        {
            return;
        }
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        for _ in 0..50 {
            let pids = self.members();
            if pids.iter().all(|p| *p == me) {
                return;
            }
            for pid in pids.into_iter().filter(|p| *p != me && *p > 1) {
                // SAFETY: sending a signal has no memory effects; ESRCH is ignored.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Pids in the session's groups.
    pub fn members(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs
            .iter()
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Makes the memory controller's out-of-memory killer take the whole group at once
    /// (cgroup v2 `memory.oom.group`) rather than its largest process; a no-op where the file
    /// is missing (cgroup v1, no v2 memory controller). Errors: the file cannot be written.
    pub fn kill_whole_group_on_oom(&self) -> std::io::Result<()> {
        for d in &self.dirs {
            let file = d.join("memory.oom.group");
            if file.exists() {
                write(&file, "1")?;
            }
        }
        Ok(())
    }

    /// How often the groups' limits struck so far: processes the memory controller killed
    /// (`oom_kill` of v2 `memory.events`, or of v1 `memory.oom_control`, Linux ≥ 4.13) and
    /// forks refused at `pids.max` (`max` of `pids.events`, v1 and v2).
    pub fn limit_events(&self) -> LimitEvents {
        let count = |file: &Path, key: &str| -> u64 {
            std::fs::read_to_string(file)
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
                .unwrap_or(0)
        };
        let mut events = LimitEvents::default();
        for d in &self.dirs {
            events.oom_kills +=
                count(&d.join("memory.events"), "oom_kill ") + count(&d.join("memory.oom_control"), "oom_kill ");
            events.pids_refused += count(&d.join("pids.events"), "max ");
        }
        events
    }

    /// The groups' anonymous memory in bytes (`anon` of v2 `memory.stat`, `total_rss` of v1),
    /// what the memory limit cannot reclaim; none where no group has a memory controller.
    pub fn anon_bytes(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            let stat = std::fs::read_to_string(d.join("memory.stat")).ok()?;
            stat.lines().find_map(|l| {
                l.strip_prefix("anon ").or_else(|| l.strip_prefix("total_rss ")).and_then(|v| v.trim().parse().ok())
            })
        })
    }

    /// Removes the groups once their members are gone (retrying for up to `limit`: killed
    /// processes leave their group when they have exited).
    pub fn remove(&self, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        for d in &self.dirs {
            loop {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => {
                        tracing::warn!(group = %d.display(), error = %e, "a session cgroup could not be removed");
                        break;
                    }
                }
            }
        }
    }
}

/// Removes the empty `mira-*` base groups other servers left below `group`, and their empty
/// session (and managed browser) groups older than a minute (a process that died without
/// stopping leaves them): `rmdir` fails on any group that still has processes or children, and the age (session ids
/// are UUIDv7, milliseconds first) keeps a group another server just made for a starting
/// session.
fn remove_empty_bases(group: &Path, own: &str) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    for base in std::fs::read_dir(group).into_iter().flatten().flatten() {
        let name = base.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("mira-node-") || name == own || !base.path().is_dir() {
            continue;
        }
        for session in std::fs::read_dir(base.path()).into_iter().flatten().flatten() {
            let created_ms = session
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("term_").or_else(|| n.strip_prefix("browser_")))
                .and_then(|hex| hex.get(..12))
                .and_then(|ms| u64::from_str_radix(ms, 16).ok());
            if created_ms.is_some_and(|ms| ms + 60_000 < now_ms) {
                let _ = std::fs::remove_dir(session.path());
            }
        }
        let _ = std::fs::remove_dir(base.path());
    }
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal (`\040`…).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Ok(v) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x"), 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(super::unescape_mount(r"/sys/fs/cgroup/a\040b"), "/sys/fs/cgroup/a b");
        assert_eq!(super::unescape_mount("/plain"), "/plain");
    }
}
