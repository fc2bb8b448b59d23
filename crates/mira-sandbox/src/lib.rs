//! The sandbox of the processes Mira starts for users, without the server around it: what
//! both `mira serve` (`src/sandbox`: its configuration, `/readyz` report, cgroups and error
//! mapping) and `mira-runner` on a user's device (`crates/mira-runner/src/sandbox.rs`) apply.
//! No axum, sqlx, clap or utoipa: `libc` and `landlock` only.
//!
//! A sandboxed process gets, through kernel mechanisms rather than path checks:
//! - **its own filesystem view** ([`mount_ops`], applied by [`child::ChildPlan`]): a private
//!   mount namespace (in a user namespace when the parent is not root) whose new root is an
//!   empty tmpfs holding the system folders bound read-only ([`SYSTEM_READ_ONLY`]), the
//!   read-write folders bound read-write, a private `/tmp` (also `HOME`, [`SANDBOX_HOME`]),
//!   a private `/dev` and `/proc`; paths to hide inside those folders are covered by an
//!   empty read-only tmpfs (a `/dev/null` bind for a file). Nothing else exists in it;
//! - **its own PID and IPC namespaces** (with the private view, when asked): it cannot name,
//!   let alone signal, a process outside its session (the server included) whatever the
//!   Landlock ABI, nor reach another session's or the host's SysV IPC;
//! - **Landlock** ([`fs_ruleset`]): read+execute on the read-only folders, everything on the
//!   read-write ones, nothing elsewhere; since ABI 6 signals and abstract UNIX sockets are
//!   scoped to the process's domain; Landlock's ptrace rule denies `/proc/<pid>/{environ,mem,
//!   root,fd}` of processes outside it. A folder the caller pinned (an open descriptor) gets
//!   its rule and its bind from that descriptor, never from its path again;
//! - **no privilege**: every capability dropped with the securebits locked, and
//!   `no_new_privs` (setuid programs gain nothing);
//! - every inherited descriptor above 2 closed at `exec`.
//!
//! [`Launch`] holds one prepared plan: [`Launch::install`] sets it as the command's
//! `pre_exec` hook, [`Launch::finish`] reads the child's report once the spawn returned.

pub mod child;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    Scope, path_beneath_rules,
};

use crate::child::{ChildPlan, Op, Step};

/// System folders bound read-only into every sandbox (those that exist; symbolic links
/// such as a merged-usr `/bin` are recreated as links).
pub const SYSTEM_READ_ONLY: [&str; 9] =
    ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"];

/// Secrets of the system folders covered in every sandbox (when they exist): a root
/// parent's sandboxed processes keep uid 0, which owns them, even without capabilities.
pub const SYSTEM_SECRETS: [&str; 8] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssl/private",
    "/etc/mysql/debian.cnf",
    "/etc/sudoers",
    "/etc/security/opasswd",
];

/// The private `/tmp` of a sandboxed process (also its `TMPDIR`).
pub const SANDBOX_TMP: &str = "/tmp";
/// HOME of sandboxed processes (inside their private `/tmp`).
pub const SANDBOX_HOME: &str = "/tmp/home";

/// Device nodes every sandbox may read and write.
pub const DEVICES: [&str; 6] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

/// The kernel's Landlock ABI version (0 when Landlock is missing or disabled):
/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`, landlock(7).
pub fn landlock_abi() -> i32 {
    // SAFETY: the version query takes no pointer and creates nothing.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether unprivileged user namespaces are allowed (`/proc/sys/user/max_user_namespaces`
/// above 0; a Linux security module may still refuse them, which the self-test finds).
pub fn user_namespaces_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// `p` as a C string; an error for a path with a NUL byte.
pub fn cstr(p: impl AsRef<std::ffi::OsStr>) -> Result<CString, String> {
    CString::new(p.as_ref().as_bytes()).map_err(|_| "a path contains a NUL byte".to_owned())
}

/// `path` is `root` or below it (by components).
pub fn within(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
}

/// The system folders that exist here: (path, link target when it is a symbolic link that
/// stays inside another system folder, as a merged-usr `/bin`). Other links are left out.
pub fn system_folders() -> Vec<(PathBuf, Option<PathBuf>)> {
    SYSTEM_READ_ONLY
        .iter()
        .map(PathBuf::from)
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(&p).ok()?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).ok()?;
                let real = std::fs::canonicalize(&p).ok()?;
                SYSTEM_READ_ONLY.iter().any(|s| *s != p.as_os_str() && real.starts_with(s)).then_some((p, Some(target)))
            } else {
                meta.is_dir().then_some((p, None))
            }
        })
        .collect()
}

/// The system folders whose restricted entries are covered in every sandbox
/// ([`restricted_under`]): the configuration, where host keys and services' passwords live.
/// (Not `/opt`: workspaces and software trees live there, and a tree a strict umask made
/// unreadable to others is users' work, not a secret; its secrets are named with
/// `--sandbox-hide`.)
pub const SYSTEM_SCANNED: [&str; 1] = ["/etc"];

/// Most entries [`system_secrets`] looks at under [`SYSTEM_SCANNED`] (what lies past the
/// limit is not covered, and a warning says so).
pub const SCAN_LIMIT: usize = 50_000;

/// What every sandbox covers in the system folders, as real paths: [`SYSTEM_SECRETS`], and
/// every file and folder under [`SYSTEM_SCANNED`] that others may not read
/// ([`restricted_under`]) — SSH host keys, a database's or mail server's configuration with
/// its passwords, a service's private keys: a sandboxed process keeps the server's uid (0 for
/// a root server), which owns such files even without capabilities. Read when the sandbox is
/// built (at start): a restricted file made later is covered from the next start. The flag
/// is false when the walk stopped at [`SCAN_LIMIT`] (the caller warns).
pub fn system_secrets() -> (Vec<PathBuf>, bool) {
    let mut all: Vec<PathBuf> =
        SYSTEM_SECRETS.iter().map(PathBuf::from).map(|p| std::fs::canonicalize(&p).unwrap_or(p)).collect();
    let roots: Vec<&Path> = SYSTEM_SCANNED.iter().map(Path::new).collect();
    let (found, complete) = restricted_under(&roots, SCAN_LIMIT);
    all.extend(found);
    (all, complete)
}

/// The entries under `roots` that others may not read, found by a walk that follows no
/// symbolic link and stays on each root's filesystem: a folder without `o+x` (nothing in it
/// can be reached by others; it is listed, not entered), a file or other entry without
/// `o+r`. (A folder without `o+r` but with `o+x` is entered: its files are judged one by
/// one.) The walk looks at `limit` entries at most; the flag is false when it stopped there.
pub fn restricted_under(roots: &[&Path], limit: usize) -> (Vec<PathBuf>, bool) {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut seen = 0usize;
    for root in roots {
        let Ok(top) = std::fs::symlink_metadata(root) else { continue };
        if !top.is_dir() {
            continue;
        }
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                seen += 1;
                if seen > limit {
                    return (found, false);
                }
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
                let mode = meta.mode();
                if meta.file_type().is_symlink() {
                    continue;
                }
                if meta.is_dir() {
                    if mode & 0o001 == 0 {
                        found.push(path);
                    } else if meta.dev() == top.dev() {
                        stack.push(path);
                    }
                } else if mode & 0o004 == 0 {
                    found.push(path);
                }
            }
        }
    }
    (found, true)
}

/// Masks of the filesystem rights the kernel of Landlock ABI `abi` handles: (all,
/// read+execute).
pub fn masks(abi: i32) -> (landlock::BitFlags<AccessFs>, landlock::BitFlags<AccessFs>) {
    let abi = ABI::from(abi.min(5));
    (AccessFs::from_all(abi), AccessFs::from_read(abi))
}

/// The filesystem Landlock ruleset: read+execute beneath `read_only`, every right beneath
/// `read_write` and on [`DEVICES`], nothing elsewhere; signals and abstract UNIX sockets
/// scoped to the domain on ABI ≥ 6. Paths that do not exist are an error.
pub fn fs_ruleset(abi: i32, read_only: &[String], read_write: &[String]) -> Result<OwnedFd, String> {
    fs_ruleset_pinned(abi, read_only, read_write, &[])
}

/// [`fs_ruleset`], where the read-write folders named in `pinned` get their rule from that
/// open descriptor (the folder the caller checked), not by opening their path again.
pub fn fs_ruleset_pinned(
    abi: i32,
    read_only: &[String],
    read_write: &[String],
    pinned: &[Pinned<'_>],
) -> Result<OwnedFd, String> {
    let (all, read) = masks(abi);
    let err = |e: landlock::RulesetError| format!("building the Landlock ruleset: {e}");
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort).handle_access(all).map_err(err)?;
    if abi >= 6 {
        ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(err)?;
    }
    let by_path: Vec<&String> = read_write.iter().filter(|p| !pinned.iter().any(|f| f.path == p.as_str())).collect();
    let by_fd = pinned.iter().filter(|f| read_write.iter().any(|p| p.as_str() == f.path));
    let created = ruleset
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(read_only, read))
        .map_err(err)?
        .add_rules(path_beneath_rules(by_path, all))
        .map_err(err)?
        .add_rules(by_fd.map(|f| Ok::<_, landlock::RulesetError>(landlock::PathBeneath::new(f.fd, all))))
        .map_err(err)?
        .add_rules(path_beneath_rules(DEVICES, all))
        .map_err(err)?;
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| "Landlock is not supported by this kernel".to_owned())
}

/// The network Landlock ruleset that denies TCP `connect` to `ports` (any address) and
/// allows it to every other port. Landlock network rules are an allow-list (landlock(7)),
/// so this is 65,536 − n rules: ~0.15 s to build; build it once and share it.
pub fn deny_tcp_connect_ruleset(ports: &[u16]) -> Result<OwnedFd, String> {
    let err = |e: landlock::RulesetError| format!("building the network ruleset: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessNet::ConnectTcp)
        .map_err(err)?
        .create()
        .map_err(err)?;
    for port in 0..=u16::MAX {
        if !ports.contains(&port) {
            ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp)).map_err(err)?;
        }
    }
    let fd: Option<OwnedFd> = ruleset.into();
    fd.ok_or_else(|| "Landlock network rules are not supported by this kernel".to_owned())
}

/// Landlock rules the child adds for the mounts it makes itself (inside the new root):
/// listing `/`, everything in `/tmp`, `/dev/shm` and `/dev/pts`, reading `/proc`.
pub fn view_child_rules(abi: i32) -> Result<Vec<(CString, u64)>, String> {
    let (all, read) = masks(abi);
    let rw = all.bits();
    Ok(vec![
        (cstr("/")?, AccessFs::ReadDir as u64),
        (cstr(SANDBOX_TMP)?, rw),
        (cstr("/dev/shm")?, rw),
        (cstr("/dev/pts")?, rw),
        (cstr("/proc")?, read.bits() & !(AccessFs::Execute as u64)),
    ])
}

/// Landlock rules of a sandbox on the host's own view (no mount namespace), added in the
/// child like [`view_child_rules`]: reading `/proc` (other processes' `environ`, `mem`,
/// `root` and `fd` stay denied by Landlock's ptrace rule) and everything on the PTYs in
/// `/dev/pts`. (The parent's ruleset could hold them; the child adds them so both kinds of
/// plan build the same way.)
pub fn host_view_child_rules(abi: i32) -> Result<Vec<(CString, u64)>, String> {
    let (all, read) = masks(abi);
    Ok(vec![(cstr("/dev/pts")?, all.bits()), (cstr("/proc")?, read.bits() & !(AccessFs::Execute as u64))])
}

/// A read-write folder the caller holds open: its Landlock rule is built from `fd`, and the
/// child checks that the folder it bound at `path` is that very folder (device and inode of
/// the bind against `fstat(fd)`; a mismatch fails the spawn), so a symlink swapped into its
/// path after the caller checked it can redirect neither. (The descriptor itself cannot be
/// the bind's source: it names a mount of the parent's mount namespace, which a bind in the
/// child's new one refuses with `EINVAL`.) `path` is the folder's real path (the kernel's
/// path of `fd`), as listed in the view's `read_write`.
#[derive(Debug, Clone, Copy)]
pub struct Pinned<'a> {
    /// The real path, as in `read_write`.
    pub path: &'a str,
    /// The open folder (kept open, and close-on-exec, until the spawn is done).
    pub fd: std::os::fd::BorrowedFd<'a>,
}

/// Opens the folder at `path` (absolute and real) without following a symlink at its last
/// component and checks that the kernel's path of the open folder is `path` itself (no
/// symlink on the way): the descriptor for [`Pinned`]. Errors name what differed.
pub fn pin_folder(path: &str) -> Result<OwnedFd, String> {
    let c = cstr(path)?;
    // SAFETY: open(2) on a NUL-terminated path; the descriptor is owned right below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("opening {path}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    check_pinned(&fd, path)?;
    Ok(fd)
}

/// Checks that the open folder `fd` is at `path` now (the kernel's path of the descriptor).
pub fn check_pinned(fd: &impl std::os::fd::AsRawFd, path: &str) -> Result<(), String> {
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("reading the path of the open folder {path}: {e}"))?;
    if real != Path::new(path) {
        return Err(format!("{path} now leads to {} (a folder on the way was replaced)", real.display()));
    }
    Ok(())
}

/// What a private view shows.
#[derive(Debug, Clone)]
pub struct View<'a> {
    /// The staging directory the new root is mounted on (an empty folder of the parent's,
    /// outside every folder the view shows).
    pub stage: &'a Path,
    /// [`system_folders`]: the links among them are recreated; the folders are expected in
    /// `read_only` when they should be shown.
    pub system: &'a [(PathBuf, Option<PathBuf>)],
    /// Folders bound read-only.
    pub read_only: &'a [String],
    /// Folders bound read-write (`nosuid,nodev`).
    pub read_write: &'a [String],
    /// Those of `read_write` held open by the caller: bound from the descriptor.
    pub pinned: &'a [Pinned<'a>],
    /// Paths covered (an empty read-only tmpfs, a `/dev/null` bind for a file).
    pub hidden: &'a [String],
    /// Further paths covered when they lie strictly inside one of the view's folders.
    pub extra_hidden: &'a [PathBuf],
    /// Size of the private `/tmp` and `/dev/shm`, in bytes (at least 1 MiB).
    pub tmp_bytes: u64,
}

/// The tmpfs options of a view's new root.
pub const ROOT_DATA: &str = "mode=0755,size=1048576,nr_inodes=4096";

/// The mount operations that build `view` under its stage (see the crate docs).
pub fn mount_ops(view: &View<'_>) -> Result<Vec<Op>, String> {
    let stage = view.stage;
    let at = |p: &Path| -> Result<CString, String> {
        let rel = p.strip_prefix("/").unwrap_or(p);
        cstr(stage.join(rel))
    };
    enum Kind {
        Tmp,
        Link(PathBuf),
        Bind(bool),
    }
    let mut entries: Vec<(PathBuf, Kind)> = vec![(PathBuf::from(SANDBOX_TMP), Kind::Tmp)];
    for (p, link) in view.system {
        if let Some(target) = link {
            entries.push((p.clone(), Kind::Link(target.clone())));
        }
    }
    entries.extend(view.read_only.iter().map(|p| (PathBuf::from(p), Kind::Bind(true))));
    entries.extend(view.read_write.iter().map(|p| (PathBuf::from(p), Kind::Bind(false))));
    entries.sort_by_key(|(p, _)| p.components().count());
    let mut ops = Vec::new();
    let mut made: BTreeSet<PathBuf> = BTreeSet::new();
    let mut ensure = |ops: &mut Vec<Op>, p: &Path| -> Result<(), String> {
        let mut chain: Vec<&Path> = p.ancestors().filter(|a| *a != Path::new("/")).collect();
        chain.reverse();
        for a in chain {
            if made.insert(a.to_path_buf()) {
                ops.push(Op::Mkdir(at(a)?));
            }
        }
        Ok(())
    };
    let tmp_data = format!("mode=1777,size={}", view.tmp_bytes.max(1 << 20));
    for (path, kind) in &entries {
        match kind {
            Kind::Tmp => {
                ensure(&mut ops, path)?;
                ops.push(Op::Tmpfs { target: at(path)?, data: cstr(&tmp_data)?, readonly: false });
                ops.push(Op::Mkdir(at(Path::new(SANDBOX_HOME))?));
            }
            Kind::Link(target) => {
                if let Some(parent) = path.parent() {
                    ensure(&mut ops, parent)?;
                }
                ops.push(Op::Symlink { target: cstr(target)?, link: at(path)? });
            }
            Kind::Bind(readonly) => {
                ensure(&mut ops, path)?;
                let pinned = (!*readonly)
                    .then(|| view.pinned.iter().find(|f| Path::new(f.path) == path.as_path()))
                    .flatten()
                    .map(|f| f.fd.as_raw_fd());
                ops.push(Op::Bind {
                    source: cstr(path)?,
                    target: at(path)?,
                    readonly: *readonly,
                    device: false,
                    pinned,
                });
            }
        }
    }
    let dev = Path::new("/dev");
    ensure(&mut ops, dev)?;
    ops.push(Op::Tmpfs { target: at(dev)?, data: cstr("mode=0755,size=65536,nr_inodes=128")?, readonly: false });
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let p = dev.join(node);
        ops.push(Op::Touch(at(&p)?));
        ops.push(Op::Bind { source: cstr(&p)?, target: at(&p)?, readonly: false, device: true, pinned: None });
    }
    ops.push(Op::Mkdir(at(&dev.join("pts"))?));
    ops.push(Op::Devpts(at(&dev.join("pts"))?));
    ops.push(Op::Symlink { target: cstr("pts/ptmx")?, link: at(&dev.join("ptmx"))? });
    ops.push(Op::Mkdir(at(&dev.join("shm"))?));
    ops.push(Op::Tmpfs { target: at(&dev.join("shm"))?, data: cstr(&tmp_data)?, readonly: false });
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(Op::Symlink { target: cstr(target)?, link: at(&dev.join(name))? });
    }
    let proc = Path::new("/proc");
    ensure(&mut ops, proc)?;
    ops.push(Op::Proc(at(proc)?));
    // Covers, deepest last so that a cover inside a covered folder is not lost.
    let roots: Vec<&Path> = view.read_write.iter().chain(view.read_only).map(Path::new).collect();
    let mut covers: Vec<PathBuf> = view.hidden.iter().map(PathBuf::from).collect();
    covers.extend(view.extra_hidden.iter().filter(|h| roots.iter().any(|r| within(h, r) && *h != r)).cloned());
    covers.sort_by_key(|p| p.components().count());
    covers.dedup();
    let all = covers.clone();
    covers.retain(|c| !all.iter().any(|o| o != c && within(c, o)));
    for h in covers {
        match std::fs::symlink_metadata(&h) {
            Ok(m) if m.is_dir() => {
                ops.push(Op::Tmpfs { target: at(&h)?, data: cstr("mode=000,size=4096,nr_inodes=1")?, readonly: true })
            }
            // A symbolic link is never followed by a mount here: covering it would cover
            // its target's path instead; links inside a folder resolve in the sandbox's
            // own view anyway.
            Ok(m) if m.file_type().is_symlink() => {}
            Ok(_) => ops.push(Op::Bind {
                source: cstr("/dev/null")?,
                target: at(&h)?,
                readonly: true,
                device: false,
                pinned: None,
            }),
            Err(_) => {}
        }
    }
    Ok(ops)
}

/// The paths of `secrets` that exist and lie inside one of `roots`, without those inside
/// another of them (what lies inside a covered folder is covered with it).
pub fn hidden_inside(secrets: &[PathBuf], roots: &[&Path]) -> Vec<String> {
    let mut hidden: BTreeSet<String> = BTreeSet::new();
    for s in secrets {
        if roots.iter().any(|r| within(s, r)) && std::fs::symlink_metadata(s).is_ok() {
            hidden.insert(s.to_string_lossy().into_owned());
        }
    }
    let all: Vec<String> = hidden.into_iter().collect();
    all.iter().filter(|h| !all.iter().any(|o| o != *h && within(Path::new(h), Path::new(o)))).cloned().collect()
}

/// The pieces of a [`ChildPlan`] its parent chooses.
#[derive(Debug)]
pub struct PlanParts {
    /// Become a session leader with the PTY on stdin as controlling terminal.
    pub pty_session: bool,
    /// `cgroup.procs` of the process's cgroups, opened for writing.
    pub cgroup_procs: Vec<OwnedFd>,
    /// The private view, or None for Landlock on the host's view.
    pub mounts: Option<child::MountPlan>,
    /// The working directory.
    pub cwd: CString,
    /// The filesystem ruleset ([`fs_ruleset`]).
    pub ruleset: OwnedFd,
    /// Rules the child adds ([`view_child_rules`], [`host_view_child_rules`]).
    pub child_rules: Vec<(CString, u64)>,
    /// The network ruleset, when any ([`deny_tcp_connect_ruleset`]).
    pub net_ruleset: Option<Arc<OwnedFd>>,
    /// Descriptors the mount operations name ([`Pinned`]), held until the spawn is done.
    pub pinned: Vec<OwnedFd>,
}

/// The user namespace maps of a parent that is not root: its uid and gid onto themselves.
pub fn own_user_maps() -> child::UserMaps {
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    child::UserMaps { uid_map: format!("{uid} {uid} 1").into_bytes(), gid_map: format!("{gid} {gid} 1").into_bytes() }
}

/// Why a sandboxed spawn failed.
#[derive(Debug)]
pub enum Failure {
    /// A step of the plan failed in the child (nothing ran), with the spawn's error when
    /// the child reported it before `exec`.
    Step(Step, Option<std::io::Error>),
    /// The program could not be started (no sandbox step failed).
    Spawn(std::io::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Step(step, None) => write!(f, "the sandbox could not be applied while {}", step.describe()),
            Failure::Step(step, Some(e)) => {
                write!(f, "the sandbox could not be applied while {}: {e}; nothing was started", step.describe())
            }
            Failure::Spawn(e) => write!(f, "starting the program: {e}"),
        }
    }
}

/// One process's prepared plan and the read end of its report pipe.
pub struct Launch {
    plan: Arc<ChildPlan>,
    report: OwnedFd,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch").finish_non_exhaustive()
    }
}

impl Launch {
    /// The plan of `parts`, with a new report pipe (close-on-exec).
    pub fn new(parts: PlanParts) -> Result<Launch, String> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors, owned right below.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("a pipe: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned by nothing else.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let PlanParts { pty_session, cgroup_procs, mounts, cwd, ruleset, child_rules, net_ruleset, pinned } = parts;
        let plan =
            ChildPlan { pty_session, cgroup_procs, mounts, cwd, ruleset, child_rules, net_ruleset, report: tx, pinned };
        Ok(Launch { plan: Arc::new(plan), report: rx })
    }

    /// The plan (to install on another kind of command, e.g. tokio's, the same way as
    /// [`Launch::install`]).
    pub fn plan(&self) -> Arc<ChildPlan> {
        self.plan.clone()
    }

    /// Sets the `pre_exec` hook that applies the plan in the child. The command must not
    /// set a working directory of its own: the plan enters the cwd itself.
    pub fn install(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let plan = self.plan.clone();
        // SAFETY: `ChildPlan::apply` only makes async-signal-safe system calls on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
    }

    /// Reads the child's report once the spawn returned (the command must have been dropped
    /// so that no copy of the pipe's write end remains): the spawned child and the child's
    /// fallback notes ([`child::note`]), or what failed.
    pub fn finish<C>(self, spawned: std::io::Result<C>) -> Result<(C, Vec<u8>), Failure> {
        let Launch { plan, report } = self;
        drop(plan);
        let mut bytes = Vec::new();
        {
            use std::io::Read;
            let mut f = std::fs::File::from(report);
            let _ = f.read_to_end(&mut bytes);
        }
        let failed = bytes.iter().find_map(|b| Step::from_byte(*b));
        let notes: Vec<u8> = bytes.into_iter().filter(|b| Step::from_byte(*b).is_none()).collect();
        match (spawned, failed) {
            (Ok(c), None) => Ok((c, notes)),
            (Ok(_), Some(step)) => Err(Failure::Step(step, None)),
            (Err(e), Some(step)) => Err(Failure::Step(step, Some(e))),
            (Err(e), None) => Err(Failure::Spawn(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Restricted entries are found (a folder others cannot enter as a whole, without its
    /// contents), readable ones and symbolic links are not, and the walk stops at its limit.
    #[test]
    fn restricted_entries_are_found_and_nothing_else() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        std::fs::create_dir_all(root.join("app/private")).unwrap();
        std::fs::create_dir_all(root.join("app/listless")).unwrap();
        for (f, m) in [
            ("app/open.conf", 0o644),
            ("app/secret.conf", 0o640),
            ("app/private/key.pem", 0o644),
            ("app/listless/token", 0o600),
            ("app/listless/public", 0o644),
        ] {
            std::fs::write(root.join(f), "x").unwrap();
            mode(&root.join(f), m);
        }
        mode(&root.join("app/private"), 0o750);
        mode(&root.join("app/listless"), 0o711);
        std::os::unix::fs::symlink("/etc/shadow", root.join("app/link")).unwrap();
        let (mut found, complete) = restricted_under(&[&root], 1000);
        found.sort();
        assert!(complete);
        let expected: Vec<PathBuf> =
            ["app/listless/token", "app/private", "app/secret.conf"].iter().map(|p| root.join(p)).collect();
        assert_eq!(found, expected);
        let (_, complete) = restricted_under(&[&root], 3);
        assert!(!complete, "the walk stops at its limit");
    }

    /// Mount targets of `ops` that cover (read-only tmpfs or a `/dev/null` bind), below `stage`.
    fn covers(ops: &[Op], stage: &Path) -> Vec<PathBuf> {
        ops.iter()
            .filter_map(|op| match op {
                Op::Tmpfs { target, readonly: true, .. } => Some(target),
                Op::Bind { source, target, readonly: true, .. } if source.as_bytes() == b"/dev/null" => Some(target),
                _ => None,
            })
            .map(|t| {
                Path::new("/").join(Path::new(std::ffi::OsStr::from_bytes(t.as_bytes())).strip_prefix(stage).unwrap())
            })
            .collect()
    }

    /// A workspace whose path is swapped for a symlink to another folder after the caller
    /// pinned (opened) it, right before the spawn: a plan built from the pinned descriptor
    /// starts nothing (the child finds another folder bound at the path); the control, built
    /// from the path as before, binds the other folder read-write and reads its secret.
    #[test]
    fn a_workspace_swapped_after_it_was_pinned_is_not_bound() {
        use std::os::fd::AsFd;
        use std::process::{Command, Stdio};
        if landlock_abi() < 1 || (!is_root() && !user_namespaces_allowed()) {
            eprintln!("no Landlock or no namespaces here: nothing to test");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (ws, victim, stage) = (base.join("ws"), base.join("victim"), base.join("stage"));
        for d in [&ws, &victim, &stage] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(victim.join("secret"), "VICTIM-SECRET").unwrap();
        let ws_s = ws.to_string_lossy().into_owned();
        let pinned_fd = pin_folder(&ws_s).unwrap();
        // The swap: the workspace moves away and its path now leads to the victim.
        std::fs::rename(&ws, base.join("ws-moved")).unwrap();
        std::os::unix::fs::symlink(&victim, &ws).unwrap();
        let abi = landlock_abi();
        let read_write = vec![ws_s.clone()];
        let run = |pinned: &[Pinned<'_>]| {
            let launch = view_launch(&stage, abi, &read_write, pinned, true);
            let mut cmd = Command::new("/bin/sh");
            cmd.args(["-c", &format!("cat {ws_s}/secret")])
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            launch.install(&mut cmd);
            let spawned = cmd.spawn();
            drop(cmd);
            launch
                .finish(spawned)
                .map(|(c, _)| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
        };
        let control = run(&[]);
        assert_eq!(control.as_deref().ok(), Some("VICTIM-SECRET"), "the control reads the victim");
        let pinned = [Pinned { path: &ws_s, fd: pinned_fd.as_fd() }];
        match run(&pinned) {
            Err(Failure::Step(child::Step::Mount, _)) => {}
            other => panic!("a swapped workspace was bound: {:?}", other.map_err(|e| e.to_string())),
        }
        assert!(check_pinned(&pinned_fd, &ws_s).is_err(), "the parent's check sees the swap too");
    }

    /// A launch into a private view of the system folders (read-only) and `read_write` (those
    /// in `pinned` from their descriptors) staged at `stage`, with a Landlock ruleset of ABI
    /// `abi`, with (`isolate`) or without private PID and IPC namespaces; cwd `/`.
    fn view_launch(stage: &Path, abi: i32, read_write: &[String], pinned: &[Pinned<'_>], isolate: bool) -> Launch {
        let system = system_folders();
        let read_only: Vec<String> =
            system.iter().filter(|(_, l)| l.is_none()).map(|(p, _)| p.to_string_lossy().into_owned()).collect();
        let ops = mount_ops(&View {
            stage,
            system: &system,
            read_only: &read_only,
            read_write,
            pinned,
            hidden: &[],
            extra_hidden: &[],
            tmp_bytes: 1 << 20,
        })
        .unwrap();
        Launch::new(PlanParts {
            pty_session: false,
            cgroup_procs: Vec::new(),
            mounts: Some(child::MountPlan {
                userns: (!is_root()).then(own_user_maps),
                new_net: false,
                new_pid: isolate,
                pid_helper: None,
                new_ipc: isolate,
                stage: cstr(stage).unwrap(),
                root_data: cstr(ROOT_DATA).unwrap(),
                ops,
            }),
            cwd: cstr("/").unwrap(),
            ruleset: fs_ruleset_pinned(abi, &read_only, read_write, pinned).unwrap(),
            child_rules: view_child_rules(abi).unwrap(),
            net_ruleset: None,
            pinned: Vec::new(),
        })
        .unwrap()
    }

    /// Runs `sh -c script` in a private view of the system folders whose Landlock ruleset is
    /// of ABI 5 at most (no signal scoping), with (`isolate`) or without private PID and IPC
    /// namespaces; (status, stdout + stderr).
    fn run_isolated(stage: &Path, script: &str, isolate: bool) -> (std::process::ExitStatus, String) {
        use std::process::{Command, Stdio};
        let launch = view_launch(stage, landlock_abi().min(5), &[], &[], isolate);
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        launch.install(&mut cmd);
        let spawned = cmd.spawn();
        drop(cmd);
        let (child, _) = launch.finish(spawned).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status, format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// Without Landlock's signal scoping (ABI < 6), a sandboxed process in its own PID
    /// namespace cannot signal a process of the same uid outside it (here a sacrificial
    /// `sleep`; the server in real life), nor see a SysV shared memory segment made outside;
    /// it runs as pid 2 under the namespace's init, and its exit code and the signal that
    /// ended it come back to the parent. The control, without the namespaces, reaches both.
    #[test]
    fn a_pid_and_ipc_namespace_keep_the_host_out_of_reach() {
        use std::os::unix::process::ExitStatusExt;
        if landlock_abi() < 1 || (!is_root() && !user_namespaces_allowed()) {
            eprintln!("no Landlock or no namespaces here: nothing to test");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let stage = std::fs::canonicalize(dir.path()).unwrap().join("stage");
        std::fs::create_dir_all(&stage).unwrap();
        let mut victim = std::process::Command::new("sleep").arg("120").spawn().unwrap();
        let key = 0x4d1a_0000 ^ i32::try_from(std::process::id() & 0xffff).unwrap();
        // SAFETY: shmget with plain integers; the segment is removed below.
        let shm = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o600) };
        assert!(shm >= 0, "shmget: {}", std::io::Error::last_os_error());
        let script = format!(
            "echo pid=$$; kill -0 {victim} && echo SIGNAL-SENT || echo SIGNAL-DENIED; \
             kill -STOP {victim} 2>/dev/null; ipcs -m 2>&1; exit 7",
            victim = victim.id()
        );
        let key_text = format!("0x{key:08x}");
        let (status, out) = run_isolated(&stage, &script, false);
        let control = (out.contains("SIGNAL-SENT"), out.contains(&key_text));
        // SAFETY: kill only sends a signal (the control may have stopped the victim).
        unsafe { libc::kill(i32::try_from(victim.id()).unwrap(), libc::SIGCONT) };
        let (isolated_status, isolated) = run_isolated(&stage, &script, true);
        let (killed, _) = run_isolated(&stage, "kill -TERM $$; sleep 5", true);
        let victim_state = std::fs::read_to_string(format!("/proc/{}/stat", victim.id())).unwrap();
        let _ = victim.kill();
        let _ = victim.wait();
        // SAFETY: removes the segment made above.
        unsafe { libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut()) };
        assert_eq!(status.code(), Some(7), "{out}");
        assert_eq!(control, (true, true), "the control reaches the victim and the segment: {out}");
        assert_eq!(isolated_status.code(), Some(7), "the exit code comes back: {isolated}");
        assert!(isolated.contains("pid=2"), "{isolated}");
        assert!(isolated.contains("SIGNAL-DENIED") && !isolated.contains("SIGNAL-SENT"), "{isolated}");
        assert!(!isolated.contains(&key_text), "the host's SysV segment is visible: {isolated}");
        let state = victim_state.rsplit(')').next().unwrap_or("").trim_start().chars().next();
        assert_eq!(state, Some('S'), "the victim was not stopped: {victim_state}");
        assert_eq!(killed.signal(), Some(libc::SIGTERM), "the signal that ended it comes back: {killed:?}");
    }

    /// Covers: what is hidden inside the view's folders, not twice inside a covered folder,
    /// nothing outside the view; files by a `/dev/null` bind.
    #[test]
    fn covers_inside_the_view_only() {
        let root = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("state/journal")).unwrap();
        std::fs::create_dir_all(ws.join("other")).unwrap();
        std::fs::write(ws.join("secret.key"), "k").unwrap();
        std::fs::create_dir_all(base.join("elsewhere")).unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let stage = base.join("stage");
        let read_write = [s(&ws)];
        let hidden = [s(&ws.join("state")), s(&ws.join("state/journal")), s(&ws.join("secret.key"))];
        let extra = [ws.join("other"), base.join("elsewhere"), ws.clone()];
        let ops = mount_ops(&View {
            stage: &stage,
            system: &[],
            read_only: &[],
            read_write: &read_write,
            pinned: &[],
            hidden: &hidden,
            extra_hidden: &extra,
            tmp_bytes: 0,
        })
        .unwrap();
        let mut got = covers(&ops, &stage);
        got.sort();
        assert_eq!(got, vec![ws.join("other"), ws.join("secret.key"), ws.join("state")]);
        // The workspace is bound read-write, after the private /tmp it may lie in.
        let bind = ops.iter().position(|op| matches!(op, Op::Bind { readonly: false, source, .. } if source.as_bytes() == ws.as_os_str().as_bytes()));
        let tmp = ops.iter().position(|op| matches!(op, Op::Tmpfs { readonly: false, .. }));
        assert!(tmp.unwrap() < bind.unwrap());
        assert_eq!(
            hidden_inside(&[ws.join("state"), ws.join("state/journal"), base.join("elsewhere")], &[&ws]),
            vec![s(&ws.join("state"))]
        );
    }
}
