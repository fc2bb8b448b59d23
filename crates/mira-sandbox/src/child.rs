//! The part of the sandbox that runs in the forked child, between `fork` and `exec`.
//!
//! A multi-threaded parent may only call async-signal-safe functions in the child
//! (signal-safety(7)): everything here is a raw system call on data the parent prepared —
//! C strings, file descriptors, masks — with no allocation, no lock and no formatting. The
//! order matters:
//!
//! 1. signal dispositions and mask reset; `setsid` + `TIOCSCTTY` for a PTY session (without a
//!    PID namespace; with one, in the program's process, below);
//! 2. join the session's cgroups (write `0` to each `cgroup.procs` opened by the parent);
//! 3. with a [`MountPlan`]: a user namespace when the parent is not root (so the next steps
//!    are permitted);
//! 4. with a [`MountPlan`] asking for one: a private PID namespace. `unshare(CLONE_NEWPID)`
//!    moves only the caller's *children* into it, so the process `std` forked (the one the
//!    server waits for, "the supervisor") forks once more: that child is pid 1 of the new
//!    namespace (a minimal init that reaps orphans, forwards the signals it is sent to the
//!    program, and ends the whole namespace when the program ends), and it forks the
//!    program's process (pid 2), which goes on with the steps below and `exec`s. The
//!    supervisor and the init are forks of the whole server: left as they are, each would
//!    keep the server's heap of the moment alive, page by page, as the server's own copy
//!    changes (copy-on-write). With a helper image ([`MountPlan::pid_helper`], the server's
//!    own binary), each `execve`s it right after its fork, as
//!    `<helper> `[`HELPER_ARG`]` supervise <init pid> <status fd>` and
//!    `<helper> `[`HELPER_ARG`]` init <program pid> <status fd>`, with an environment of
//!    allocator options only (no transparent huge pages: `HELPER_ENV`),
//!    every signal blocked (one sent meanwhile waits, and is forwarded once the helper
//!    runs) and only the standard descriptors and its end of the status pipe open; the
//!    binary's `main` hands over to [`run_helper_if_asked`] first thing, which runs the
//!    same loop as before and never returns. Without a helper, or when its `execve` fails,
//!    they run that loop in the fork itself. The init's parent-death signal (`SIGKILL`, set
//!    before its fork of the program) survives the `execve` of a binary that is neither
//!    set-user-ID nor file-capable (prctl(2)); the helper sets it again all the same. Either
//!    way they close every descriptor they
//!    inherited; the supervisor ends the way the program ended (its exit code, or the same
//!    signal), so the server's exit codes, signals and kills work as before (see
//!    [`ChildPlan::apply`]);
//! 5. with a [`MountPlan`]: a private mount namespace, a private IPC namespace (SysV
//!    shared memory, semaphores and message queues of other sessions and of the host are
//!    out of reach) when asked, and a private network namespace for `--sandbox-network
//!    none`: a fresh tmpfs root with the system bound read-only, the workspace read-write
//!    (`nosuid,nodev`; a folder the parent pinned must be, once bound, the very folder of
//!    its open descriptor, so a path swapped after the check cannot redirect the bind), a private `/tmp`, `/dev` and
//!    `/proc` (a procfs of the new PID namespace), secrets covered; `pivot_root` into it;
//!    then `chdir` to the cwd (in the new root, or on the host without a mount plan);
//! 6. Landlock rules for the mounts the child made itself (the parent's rules name host
//!    inodes, which the binds share);
//! 7. every capability dropped (bounding, ambient, effective, permitted, inheritable) and the
//!    securebits locked (a process without `CAP_SETPCAP` that is not root only clears its
//!    sets: it has nothing to drop), then `no_new_privs`;
//! 8. `landlock_restrict_self` with the network layer (when any) and the filesystem layer
//!    (which also scopes signals and abstract UNIX sockets to the session);
//! 9. every inherited descriptor above 2 marked close-on-exec.
//!
//! A failing step writes its [`Step`] number to the report pipe and returns the errno, which
//! `std` hands back as the spawn's error: nothing runs half-sandboxed.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

/// The steps of [`ChildPlan::apply`], reported through the pipe when one fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// `setsid`/`TIOCSCTTY`.
    Session = 1,
    /// Writing `cgroup.procs`.
    Cgroup,
    /// `unshare(CLONE_NEWUSER)` and the id maps.
    UserNamespace,
    /// `unshare(CLONE_NEWNS|CLONE_NEWNET)`.
    Unshare,
    /// Bringing up `lo` in a private network namespace.
    Loopback,
    /// Making `/` private.
    MakePrivate,
    /// The tmpfs root.
    Root,
    /// A mount operation of the plan.
    Mount,
    /// `pivot_root` and detaching the old root.
    Pivot,
    /// `chdir` to the session's cwd.
    Chdir,
    /// Adding a Landlock rule in the child.
    LandlockRule,
    /// Dropping capabilities.
    Capabilities,
    /// `PR_SET_NO_NEW_PRIVS`.
    NoNewPrivs,
    /// `landlock_restrict_self`.
    Restrict,
    /// `close_range`.
    CloseRange,
    /// `unshare(CLONE_NEWPID)` and the forks of the supervisor and the namespace's init.
    PidNamespace,
}

impl Step {
    /// The step a report byte names.
    pub fn from_byte(b: u8) -> Option<Step> {
        use Step::*;
        [
            Session,
            Cgroup,
            UserNamespace,
            Unshare,
            Loopback,
            MakePrivate,
            Root,
            Mount,
            Pivot,
            Chdir,
            LandlockRule,
            Capabilities,
            NoNewPrivs,
            Restrict,
            CloseRange,
            PidNamespace,
        ]
        .into_iter()
        .find(|s| *s as u8 == b)
    }

    /// Words for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Session => "becoming a session leader with the PTY as controlling terminal",
            Step::Cgroup => "joining the session's cgroup",
            Step::UserNamespace => "entering a user namespace",
            Step::Unshare => "entering a private mount namespace",
            Step::Loopback => "bringing up loopback in the private network namespace",
            Step::MakePrivate => "making mounts private",
            Step::Root => "mounting the sandbox root",
            Step::Mount => "mounting the sandbox's view of the filesystem",
            Step::Pivot => "switching to the sandbox root",
            Step::Chdir => "entering the working directory",
            Step::LandlockRule => "adding a Landlock rule",
            Step::Capabilities => "dropping capabilities",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::Restrict => "applying the Landlock ruleset",
            Step::CloseRange => "closing inherited descriptors",
            Step::PidNamespace => "entering a private PID namespace",
        }
    }
}

/// Notes the child writes to the report pipe when it used a fallback (not failures).
pub mod note {
    /// `/proc` could not be mounted with `hidepid=ptraceable`; the host's was bound.
    pub const PROC_BOUND: u8 = b'p';
    /// A private devpts instance could not be mounted; the host's was bound.
    pub const PTS_BOUND: u8 = b't';
}

/// One mount-namespace operation; every path is absolute and already prefixed with the
/// staging root where it is a target.
#[derive(Debug)]
pub enum Op {
    /// `mkdir` (an existing entry is fine).
    Mkdir(CString),
    /// Creates an empty file as a mount point (an existing entry is fine).
    Touch(CString),
    /// `symlink(target, link)` (an existing entry is fine).
    Symlink {
        /// What the link points to.
        target: CString,
        /// The link.
        link: CString,
    },
    /// A tmpfs with `data` options.
    Tmpfs {
        /// Mount point.
        target: CString,
        /// `mode=…,size=…`.
        data: CString,
        /// Mounted read-only (a cover over a secret).
        readonly: bool,
    },
    /// A recursive bind mount, remounted read-only when asked, else `nosuid,nodev` unless
    /// it is a device node (keeping the source's locked flags, read-only included).
    Bind {
        /// Host path.
        source: CString,
        /// Mount point.
        target: CString,
        /// Read-only.
        readonly: bool,
        /// A device node (`/dev/null`…): a writable bind kept as it is (not `nodev`).
        device: bool,
        /// The folder the parent pinned for this bind (an open descriptor): what got bound
        /// must be that folder (same device and inode), else the step fails (`ESTALE`).
        pinned: Option<libc::c_int>,
    },
    /// A private procfs with `hidepid=ptraceable` (falls back to binding the host's).
    Proc(CString),
    /// A private devpts instance (falls back to binding the host's).
    Devpts(CString),
}

/// The user namespace of a non-root server: the server's uid and gid mapped onto themselves.
#[derive(Debug)]
pub struct UserMaps {
    /// `"<uid> <uid> 1"`.
    pub uid_map: Vec<u8>,
    /// `"<gid> <gid> 1"`.
    pub gid_map: Vec<u8>,
}

/// The private filesystem view of a plan: namespaces, the new root and its mounts.
#[derive(Debug)]
pub struct MountPlan {
    /// A user namespace first (a parent that is not root).
    pub userns: Option<UserMaps>,
    /// A private network namespace (`--sandbox-network none`).
    pub new_net: bool,
    /// A private PID namespace: the program runs as pid 2 under a minimal init (pid 1),
    /// below a supervisor that stays outside (module docs, step 4).
    pub new_pid: bool,
    /// With `new_pid`: the program the supervisor and the init `execve` so as not to stay
    /// copies of the server (an absolute path, e.g. `/proc/self/exe`; its `main` must call
    /// [`run_helper_if_asked`] first). None: they stay forks of the server (a caller that is
    /// not such a binary, e.g. a test harness).
    pub pid_helper: Option<CString>,
    /// A private IPC namespace (SysV IPC and POSIX message queues).
    pub new_ipc: bool,
    /// The staging directory the new root is mounted on.
    pub stage: CString,
    /// The tmpfs options of the new root.
    pub root_data: CString,
    /// Mount operations, in order.
    pub ops: Vec<Op>,
}

/// Everything the child needs, prepared by the parent.
#[derive(Debug)]
pub struct ChildPlan {
    /// Become a session leader with stdin (the PTY) as controlling terminal.
    pub pty_session: bool,
    /// `cgroup.procs` of each of the session's cgroups, opened for writing.
    pub cgroup_procs: Vec<OwnedFd>,
    /// The private mount namespace view; None for Landlock alone on the host's view (a
    /// device whose user may not create user namespaces).
    pub mounts: Option<MountPlan>,
    /// The working directory (inside the new root with `mounts`, else on the host).
    pub cwd: CString,
    /// The filesystem Landlock ruleset (with the scopes), rules for host inodes already in.
    pub ruleset: OwnedFd,
    /// Rules the child adds for mounts it made: path inside the new root, access mask.
    pub child_rules: Vec<(CString, u64)>,
    /// The network Landlock ruleset, when the network rule needs one (shared, built once).
    pub net_ruleset: Option<Arc<OwnedFd>>,
    /// Write end of the report pipe (close-on-exec).
    pub report: OwnedFd,
    /// Descriptors the plan's operations name (`/proc/self/fd/<n>` bind sources, close-on-exec),
    /// held open until the spawn is done.
    pub pinned: Vec<OwnedFd>,
}

const OLD_ROOT: &[u8] = b".old-root\0";
const OLD_ROOT_ABS: &[u8] = b"/.old-root\0";

fn c(bytes: &'static [u8]) -> *const libc::c_char {
    bytes.as_ptr().cast()
}

/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: libc::c_long = 1;

/// `struct landlock_path_beneath_attr` (packed, include/uapi/linux/landlock.h).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

impl ChildPlan {
    fn fail(&self, step: Step) -> std::io::Error {
        let err = std::io::Error::last_os_error();
        let b = [step as u8];
        // SAFETY: write(2) on a descriptor this plan owns; async-signal-safe.
        unsafe {
            libc::write(self.report.as_raw_fd(), b.as_ptr().cast(), 1);
        }
        err
    }

    fn note(&self, byte: u8) {
        let b = [byte];
        // SAFETY: as in `fail`.
        unsafe {
            libc::write(self.report.as_raw_fd(), b.as_ptr().cast(), 1);
        }
    }

    /// Applies the plan to the calling (child) process. Only async-signal-safe calls.
    ///
    /// # Safety
    /// To be called in a freshly forked child before `exec` (a `pre_exec` hook), never in
    /// the server itself: it changes the process's namespaces, root and credentials.
    pub unsafe fn apply(&self) -> std::io::Result<()> {
        // SAFETY (whole body): raw system calls on C strings and descriptors prepared by the
        // parent; the caller guarantees we are the forked child.
        unsafe {
            let new_pid = self.mounts.as_ref().is_some_and(|m| m.new_pid);
            if self.pty_session && !new_pid && pty_session().is_err() {
                return Err(self.fail(Step::Session));
            }
            for fd in &self.cgroup_procs {
                if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(self.fail(Step::Cgroup));
                }
            }
            if let Some(m) = &self.mounts {
                if let Some(maps) = &m.userns
                    && (libc::unshare(libc::CLONE_NEWUSER) != 0
                        || !write_file(b"/proc/self/setgroups\0", b"deny")
                        || !write_file(b"/proc/self/uid_map\0", &maps.uid_map)
                        || !write_file(b"/proc/self/gid_map\0", &maps.gid_map))
                {
                    return Err(self.fail(Step::UserNamespace));
                }
                if m.new_pid {
                    // The supervisor leaves the server's session (a PTY session's processes
                    // have their own; the program's process leads it, below).
                    if self.pty_session {
                        libc::setsid();
                    }
                    if libc::unshare(libc::CLONE_NEWPID) != 0 {
                        return Err(self.fail(Step::PidNamespace));
                    }
                    // Returns only in the program's process (pid 2 of the new namespace).
                    self.split()?;
                    if self.pty_session && pty_session().is_err() {
                        return Err(self.fail(Step::Session));
                    }
                }
                let flags = libc::CLONE_NEWNS
                    | if m.new_net { libc::CLONE_NEWNET } else { 0 }
                    | if m.new_ipc { libc::CLONE_NEWIPC } else { 0 };
                if libc::unshare(flags) != 0 {
                    return Err(self.fail(Step::Unshare));
                }
                if m.new_net && !loopback_up() {
                    return Err(self.fail(Step::Loopback));
                }
                if libc::mount(
                    std::ptr::null(),
                    c(b"/\0"),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(self.fail(Step::MakePrivate));
                }
                if libc::mount(
                    c(b"tmpfs\0"),
                    m.stage.as_ptr(),
                    c(b"tmpfs\0"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    m.root_data.as_ptr().cast(),
                ) != 0
                    || libc::mount(
                        std::ptr::null(),
                        m.stage.as_ptr(),
                        std::ptr::null(),
                        libc::MS_UNBINDABLE,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(self.fail(Step::Root));
                }
                // (Unbindable: a recursive bind of a tree that contains the staging directory —
                // a workspace holding the data dir — does not copy the new root into itself.)
                for op in &m.ops {
                    if !self.run_op(op) {
                        return Err(self.fail(Step::Mount));
                    }
                }
                if libc::chdir(m.stage.as_ptr()) != 0
                    || (libc::mkdir(c(OLD_ROOT), 0o700) != 0 && errno() != libc::EEXIST)
                    || libc::syscall(libc::SYS_pivot_root, c(b".\0"), c(OLD_ROOT)) != 0
                    || libc::chdir(c(b"/\0")) != 0
                    || libc::umount2(c(OLD_ROOT_ABS), libc::MNT_DETACH) != 0
                    || libc::rmdir(c(OLD_ROOT_ABS)) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c(b"/\0"),
                        std::ptr::null(),
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(self.fail(Step::Pivot));
                }
            }
            if libc::chdir(self.cwd.as_ptr()) != 0 {
                return Err(self.fail(Step::Chdir));
            }
            for (path, access) in &self.child_rules {
                let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(self.fail(Step::LandlockRule));
                }
                let attr = PathBeneathAttr { allowed_access: *access, parent_fd: fd };
                let r = libc::syscall(
                    libc::SYS_landlock_add_rule,
                    self.ruleset.as_raw_fd(),
                    RULE_PATH_BENEATH,
                    &attr as *const PathBeneathAttr,
                    0,
                );
                libc::close(fd);
                if r != 0 {
                    return Err(self.fail(Step::LandlockRule));
                }
            }
            if !drop_capabilities() {
                return Err(self.fail(Step::Capabilities));
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(self.fail(Step::NoNewPrivs));
            }
            if let Some(net) = &self.net_ruleset
                && libc::syscall(libc::SYS_landlock_restrict_self, net.as_raw_fd(), 0) != 0
            {
                return Err(self.fail(Step::Restrict));
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, self.ruleset.as_raw_fd(), 0) != 0 {
                return Err(self.fail(Step::Restrict));
            }
            // Every descriptor the server held (database files, sockets, other PTYs) is gone
            // at exec, whether or not it was opened close-on-exec.
            if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                return Err(self.fail(Step::CloseRange));
            }
        }
        Ok(())
    }

    /// The forks of a PID namespace (module docs, step 4), after `unshare(CLONE_NEWPID)`.
    /// Returns only in the program's process; the supervisor and the init never return.
    unsafe fn split(&self) -> std::io::Result<()> {
        // SAFETY: fork/pipe2/close/prctl/setpgid on descriptors and integers; the callers of
        // `apply` guarantee a forked child.
        unsafe {
            let mut status_pipe = [0; 2];
            if libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(self.fail(Step::PidNamespace));
            }
            let [read_end, write_end] = status_pipe;
            let init = libc::fork();
            if init < 0 {
                return Err(self.fail(Step::PidNamespace));
            }
            if init > 0 {
                libc::close(write_end);
                self.exec_helper(SUPERVISE, init, read_end);
                supervise(init, read_end);
            }
            // pid 1 of the new namespace: it dies with the supervisor (a SIGKILL from an
            // ancestor namespace reaches an init), and its own group, so that a signal to the
            // supervisor's group reaches the program once (forwarded), not twice.
            libc::close(read_end);
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 || libc::setpgid(0, 0) != 0 {
                return Err(self.fail(Step::PidNamespace));
            }
            let program = libc::fork();
            if program < 0 {
                return Err(self.fail(Step::PidNamespace));
            }
            if program > 0 {
                self.exec_helper(INIT, program, write_end);
                init_of_namespace(program, write_end);
            }
            libc::close(write_end);
            // The program leads its own process group, as it did without the namespace (a
            // PTY session's leads its own session right after, `pty_session`).
            if !self.pty_session && libc::setpgid(0, 0) != 0 {
                return Err(self.fail(Step::PidNamespace));
            }
        }
        Ok(())
    }

    /// Replaces the supervisor or the init with the helper image ([`MountPlan::pid_helper`]):
    /// `<helper> HELPER_ARG <role> <pid> <fd>`, environment [`HELPER_ENV`], every signal blocked (the
    /// helper unblocks them once it forwards them), every descriptor but 0–2 and `fd` closed
    /// at `exec`, `fd` kept open. Returns only without a helper or when `execve` failed (the
    /// caller then runs the loop in this process, which resets the mask and closes the rest).
    unsafe fn exec_helper(&self, role: &CStr, pid: libc::pid_t, fd: libc::c_int) {
        let Some(path) = self.mounts.as_ref().and_then(|m| m.pid_helper.as_ref()) else {
            return;
        };
        // SAFETY: sigprocmask/close_range/fcntl/execve with stack buffers, integers and C
        // strings prepared by the parent; async-signal-safe.
        unsafe {
            let mut pid_buf = [0u8; DECIMAL_LEN];
            let mut fd_buf = [0u8; DECIMAL_LEN];
            let (Some(pid_arg), Some(fd_arg)) = (decimal(pid, &mut pid_buf), decimal(fd, &mut fd_buf)) else {
                return;
            };
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
            // Only the standard descriptors (closed by the helper) and `fd` cross the exec.
            // (Without close_range's CLOEXEC flag the helper still closes the rest.)
            let keep = u32::try_from(fd).unwrap_or(0);
            if keep > 3 {
                libc::syscall(libc::SYS_close_range, 3u32, keep - 1, libc::CLOSE_RANGE_CLOEXEC);
            }
            libc::syscall(libc::SYS_close_range, keep.max(2) + 1, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return;
            }
            let argv = [path.as_ptr(), HELPER_ARG.as_ptr(), role.as_ptr(), pid_arg, fd_arg, std::ptr::null()];
            let envp = [HELPER_ENV[0].as_ptr(), HELPER_ENV[1].as_ptr(), std::ptr::null()];
            libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        }
    }

    /// Runs one mount operation; false on failure (errno set).
    unsafe fn run_op(&self, op: &Op) -> bool {
        // SAFETY: raw system calls on prepared C strings (see `apply`).
        unsafe {
            match op {
                Op::Mkdir(p) => libc::mkdir(p.as_ptr(), 0o755) == 0 || errno() == libc::EEXIST,
                Op::Touch(p) => {
                    let fd = libc::open(p.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                    if fd >= 0 {
                        libc::close(fd);
                        true
                    } else {
                        errno() == libc::EEXIST
                    }
                }
                Op::Symlink { target, link } => {
                    libc::symlink(target.as_ptr(), link.as_ptr()) == 0 || errno() == libc::EEXIST
                }
                Op::Tmpfs { target, data, readonly } => {
                    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
                    if *readonly {
                        flags |= libc::MS_RDONLY | libc::MS_NOEXEC;
                    }
                    libc::mount(c(b"tmpfs\0"), target.as_ptr(), c(b"tmpfs\0"), flags, data.as_ptr().cast()) == 0
                }
                Op::Bind { source, target, readonly, device, pinned } => {
                    bind(source.as_ptr(), target.as_ptr(), *readonly, *device)
                        && pinned.is_none_or(|fd| same_folder(fd, target.as_ptr()))
                }
                Op::Proc(target) => {
                    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    if libc::mount(
                        c(b"proc\0"),
                        target.as_ptr(),
                        c(b"proc\0"),
                        flags,
                        c(b"hidepid=ptraceable\0").cast(),
                    ) == 0
                    {
                        return true;
                    }
                    self.note(note::PROC_BOUND);
                    bind(c(b"/proc\0"), target.as_ptr(), true, false)
                }
                Op::Devpts(target) => {
                    if libc::mount(
                        c(b"devpts\0"),
                        target.as_ptr(),
                        c(b"devpts\0"),
                        libc::MS_NOSUID | libc::MS_NOEXEC,
                        c(b"newinstance,ptmxmode=0666,mode=0620\0").cast(),
                    ) == 0
                    {
                        return true;
                    }
                    self.note(note::PTS_BOUND);
                    bind(c(b"/dev/pts\0"), target.as_ptr(), false, true)
                }
            }
        }
    }
}

/// `argv[1]` of the server's binary run as the supervisor or the init of a PID namespace
/// (module docs, step 4; [`run_helper_if_asked`]).
pub const HELPER_ARG: &CStr = c"__mira-pid-namespace-helper";

/// The role [`helper_answers`] asks for: the helper exits [`PROBE_EXIT`] at once.
const PROBE: &CStr = c"probe";

/// What a helper asked to [`PROBE`] exits with.
const PROBE_EXIT: i32 = 71;

/// Whether `path` runs as the helper in the environment the forks give it (no environment
/// but [`HELPER_ENV`]): `<path> HELPER_ARG probe` exits [`PROBE_EXIT`]. A binary that needs
/// `LD_LIBRARY_PATH`, or a `/proc/self/exe` that is a loader or an emulator rather than the
/// server, fails here instead of failing every session after its `execve`.
pub fn helper_answers(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut cmd = std::process::Command::new(path);
    cmd.arg(std::ffi::OsStr::from_bytes(HELPER_ARG.to_bytes()))
        .arg(std::ffi::OsStr::from_bytes(PROBE.to_bytes()))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    for kv in HELPER_ENV {
        if let Some((k, v)) = kv.to_str().ok().and_then(|s| s.split_once('=')) {
            cmd.env(k, v);
        }
    }
    cmd.status().is_ok_and(|s| s.code() == Some(PROBE_EXIT))
}
/// The helper's whole environment: mimalloc (the server binary's allocator; other
/// allocators ignore them) without transparent huge pages nor memory committed ahead of
/// use, which it decides before `main` — a 2 MiB huge page of its first arena alone would
/// be half of a helper's private memory.
const HELPER_ENV: [&CStr; 2] = [c"MIMALLOC_ALLOW_THP=0", c"MIMALLOC_ARENA_EAGER_COMMIT=0"];
/// `argv[2]` of the supervisor: `<helper> HELPER_ARG supervise <init pid> <status fd>`.
const SUPERVISE: &CStr = c"supervise";
/// `argv[2]` of the init: `<helper> HELPER_ARG init <program pid> <status fd>`.
const INIT: &CStr = c"init";
/// Room for a non-negative `i32` in decimal and its NUL.
const DECIMAL_LEN: usize = 11;

/// Writes non-negative `n` in decimal, NUL-terminated, into `buf` without allocating; a
/// pointer to the C string (inside `buf`), or None for a negative `n`.
fn decimal(n: i32, buf: &mut [u8; DECIMAL_LEN]) -> Option<*const libc::c_char> {
    let mut n = u32::try_from(n).ok()?;
    let mut i = DECIMAL_LEN - 1;
    buf[i] = 0;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Some(buf[i..].as_ptr().cast())
}

/// Runs the supervisor or the init of a PID namespace when this process was started as one
/// (`argv[1]` is [`HELPER_ARG`], module docs step 4) and never returns then: it ends the way
/// the program ended (supervisor), or with 0 once it passed on the program's wait status
/// (init); with 127 for arguments it cannot use (`argv[2]` `supervise` or `init`, `argv[3]`
/// a pid, `argv[4]` a descriptor, in decimal). Returns at once, having changed nothing,
/// otherwise.
///
/// To be called first thing in `main` of a binary named as [`MountPlan::pid_helper`],
/// before it starts threads or changes any process setting.
pub fn run_helper_if_asked() {
    let mut args = std::env::args_os();
    if args.nth(1).is_none_or(|a| a.as_encoded_bytes() != HELPER_ARG.to_bytes()) {
        return;
    }
    let role = args.next();
    let number = |a: Option<std::ffi::OsString>| a.and_then(|a| a.to_str()?.parse::<i32>().ok());
    // A pid of 1 or less would make the forwarding signal whole process groups (`kill(-1)`):
    // refused, as is an init that is not pid 1 of its namespace.
    let (pid, fd) = (number(args.next()).filter(|p| *p > 1), number(args.next()).filter(|f| *f > 2));
    let role = role.as_ref().map(|r| r.as_encoded_bytes());
    // SAFETY: this process is the helper image `exec_helper` started (single-threaded, the
    // pid its child, the descriptor its end of the status pipe); the loops make raw system
    // calls on integers and stack buffers.
    unsafe {
        match (role, pid, fd) {
            (Some(r), _, _) if r == PROBE.to_bytes() => libc::_exit(PROBE_EXIT),
            (Some(r), Some(pid), Some(fd)) if r == SUPERVISE.to_bytes() => supervise(pid, fd),
            (Some(r), Some(pid), Some(fd)) if r == INIT.to_bytes() && libc::getpid() == 1 => {
                // Kept across `execve` (prctl(2)) unless the exec changed the credentials (a
                // set-user-ID binary or one with file capabilities): set again either way.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                init_of_namespace(pid, fd)
            }
            _ => libc::_exit(127),
        }
    }
}

/// Where the supervisor and the init forward the signals they are sent ([`FORWARDED`]): the
/// init (in the supervisor), the program's process group (in the init). Each process has
/// its own copy.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

/// The signals the supervisor and the init pass on instead of acting on them (an init
/// ignores the others unless it handles them; SIGKILL and SIGSTOP cannot be caught: a
/// SIGKILL to the supervisor ends the namespace through the init's parent-death signal).
const FORWARDED: [libc::c_int; 10] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGCONT,
    libc::SIGTSTP,
    libc::SIGWINCH,
    libc::SIGALRM,
];

extern "C" fn forward(sig: libc::c_int) {
    let to = FORWARD_TO.load(Ordering::Relaxed);
    if to != 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe {
            libc::kill(to, sig);
        }
    }
}

/// Resets every signal disposition, forwards [`FORWARDED`] to `to`, unblocks every signal,
/// and closes every descriptor but `keep` (the server's sockets, database files, the PTY and
/// `std`'s exec-error pipe are the program's business only: `std` reads that pipe until
/// every copy is closed).
unsafe fn become_helper(to: libc::pid_t, keep: libc::c_int) {
    // SAFETY: sigaction/sigprocmask/close_range with stack structs and integers.
    unsafe {
        FORWARD_TO.store(to, Ordering::Relaxed);
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let handler: extern "C" fn(libc::c_int) = forward;
        for sig in FORWARDED {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let keep = u32::try_from(keep).unwrap_or(0);
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
    }
}

/// The supervisor (outside the PID namespace, the process the server waits for): waits for
/// the init, then ends as the program ended — the status the init wrote to `status`, or the
/// init's own when it wrote none (it was killed).
unsafe fn supervise(init: libc::pid_t, status: libc::c_int) -> ! {
    // SAFETY: waitpid/read/_exit and the calls of `become_helper`/`end_as`.
    unsafe {
        become_helper(init, status);
        let mut own = 0;
        loop {
            let r = libc::waitpid(init, &mut own, 0);
            if r == init {
                break;
            }
            if r < 0 && errno() != libc::EINTR {
                libc::_exit(127);
            }
        }
        let mut bytes = [0u8; 4];
        let mut got = 0usize;
        while got < 4 {
            let n = libc::read(status, bytes[got..].as_mut_ptr().cast(), 4 - got);
            if n > 0 {
                got += n.unsigned_abs();
            } else if n < 0 && errno() == libc::EINTR {
                continue;
            } else {
                break;
            }
        }
        end_as(if got == 4 { i32::from_ne_bytes(bytes) } else { own })
    }
}

/// The init of the PID namespace (pid 1): reaps every orphan; when the program ends,
/// writes its wait status to `status` and exits, which kills what is left in the namespace.
unsafe fn init_of_namespace(program: libc::pid_t, status: libc::c_int) -> ! {
    // SAFETY: waitpid/write/_exit and the calls of `become_helper`.
    unsafe {
        // The program leads its own process group (and a PTY session's its own session):
        // signals go to that group, as they went to the leader's group before.
        become_helper(-program, status);
        loop {
            let mut st = 0;
            let r = libc::waitpid(-1, &mut st, 0);
            if r == program {
                let bytes = st.to_ne_bytes();
                libc::write(status, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
            if r < 0 && errno() != libc::EINTR {
                libc::_exit(127);
            }
        }
    }
}

/// Ends the calling process the way wait status `status` says a process ended: the same exit
/// code, or the same signal (without a core dump: without a helper image this is a copy of
/// the server, with one it holds nothing worth dumping).
unsafe fn end_as(status: libc::c_int) -> ! {
    // SAFETY: setrlimit/signal/sigprocmask/kill/_exit with integers and stack structs.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            FORWARD_TO.store(0, Ordering::Relaxed);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 127 })
    }
}

/// Resets signal dispositions and the mask, makes the process a session leader and the PTY
/// on its stdin its controlling terminal (what a PTY child needs, sandboxed or not).
///
/// # Safety
/// To be called in a freshly forked child before `exec`.
pub unsafe fn pty_session() -> std::io::Result<()> {
    // SAFETY: signal/sigprocmask/setsid/ioctl with plain integer arguments.
    unsafe {
        for signo in [libc::SIGCHLD, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGALRM] {
            libc::signal(signo, libc::SIG_DFL);
        }
        let empty: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) == -1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A recursive bind, remounted nosuid and nodev — and read-only when asked — keeping the
/// flags the source had (a user namespace may not clear locked ones; a read-only source
/// stays read-only). A writable device node (`device`) is bound as it is.
unsafe fn bind(source: *const libc::c_char, target: *const libc::c_char, readonly: bool, device: bool) -> bool {
    // SAFETY: raw system calls on NUL-terminated strings owned by the caller.
    unsafe {
        if libc::mount(source, target, std::ptr::null(), libc::MS_BIND | libc::MS_REC, std::ptr::null()) != 0 {
            return false;
        }
        if device && !readonly {
            return true;
        }
        // (glibc's statvfs takes the flags from statfs(2)'s f_flags, valid since Linux 2.6.36.)
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(target, &mut st) != 0 {
            return false;
        }
        let mut kept = mount_flags_of(st.f_flag);
        if readonly || st.f_flag & libc::ST_RDONLY != 0 {
            kept |= libc::MS_RDONLY;
        }
        libc::mount(
            std::ptr::null(),
            target,
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | kept,
            std::ptr::null(),
        ) == 0
    }
}

/// Whether the folder at `path` (a bind just made) is the open folder `fd`: same device and
/// inode. False with `ESTALE` when it is another one.
unsafe fn same_folder(fd: libc::c_int, path: *const libc::c_char) -> bool {
    // SAFETY: fstat/stat into zeroed stack structs.
    unsafe {
        let mut want: libc::stat = std::mem::zeroed();
        let mut got: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut want) != 0 || libc::stat(path, &mut got) != 0 {
            return false;
        }
        if want.st_dev == got.st_dev && want.st_ino == got.st_ino {
            return true;
        }
        *libc::__errno_location() = libc::ESTALE;
        false
    }
}

/// `statfs` `f_flags` (`ST_*`) as the `MS_*` flags a bind remount must keep.
fn mount_flags_of(st: u64) -> libc::c_ulong {
    const MAP: [(u64, libc::c_ulong); 6] = [
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
        (libc::ST_MANDLOCK, libc::MS_MANDLOCK),
    ];
    MAP.iter().filter(|(s, _)| st & s != 0).fold(0, |acc, (_, m)| acc | m)
}

/// Writes `data` to a (proc) file; false on failure.
unsafe fn write_file(path: &'static [u8], data: &[u8]) -> bool {
    // SAFETY: open/write/close on a static NUL-terminated path.
    unsafe {
        let fd = libc::open(c(path), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        usize::try_from(n).is_ok_and(|n| n == data.len())
    }
}

/// Sets `IFF_UP` on `lo` (netdevice(7)).
unsafe fn loopback_up() -> bool {
    // SAFETY: socket/ioctl/close on a zeroed, fully initialised ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let ok = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) == 0 && {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) == 0
        };
        libc::close(fd);
        ok
    }
}

/// Securebits that close every way of getting capabilities back (capabilities(7)):
/// NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, each locked, and KEEP_CAPS locked off.
const SECUREBITS_LOCKED: libc::c_ulong = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7);
/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability for good: securebits locked, the bounding set emptied, the
/// ambient set cleared, then effective/permitted/inheritable zeroed with `capset`. Root
/// without capabilities cannot load modules, open raw sockets, mknod, mount, reboot, bypass
/// file permissions, ptrace other users' processes or gain them back through `exec`.
///
/// A process that is not root and has no `CAP_SETPCAP` (an unprivileged runner on a
/// device without a user namespace: Landlock alone) cannot lock the securebits nor shrink
/// the bounding set; it clears its ambient, effective, permitted and inheritable sets, and
/// `no_new_privs` (set right after) keeps `exec` from granting any (setuid and file
/// capabilities are ignored under it). Root without `CAP_SETPCAP` fails.
unsafe fn drop_capabilities() -> bool {
    // SAFETY: prctl/capset with integer arguments and stack structs.
    unsafe {
        if libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS_LOCKED, 0, 0, 0) != 0 {
            let unprivileged = errno() == libc::EPERM && libc::getuid() != 0 && libc::geteuid() != 0;
            return unprivileged && clear_capability_sets();
        }
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                if errno() == libc::EINVAL && cap > 0 {
                    break;
                }
                return false;
            }
        }
        clear_capability_sets()
    }
}

/// Clears the ambient set, then zeroes effective, permitted and inheritable (`capset`).
unsafe fn clear_capability_sets() -> bool {
    // SAFETY: prctl/capset with integer arguments and stack structs.
    unsafe {
        if libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 {
            return false;
        }
        let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::{DECIMAL_LEN, decimal};

    /// The helper's pid and descriptor arguments, formatted without allocating.
    #[test]
    fn numbers_are_written_in_decimal_with_their_nul() {
        let mut buf = [0u8; DECIMAL_LEN];
        for n in [0, 7, 10, 4_194_304, i32::MAX] {
            let p = decimal(n, &mut buf).expect("non-negative");
            // SAFETY: `decimal` returned a pointer to a NUL-terminated string inside `buf`.
            let s = unsafe { std::ffi::CStr::from_ptr(p) };
            assert_eq!(s.to_str().expect("ASCII"), n.to_string());
        }
        assert!(decimal(-1, &mut buf).is_none());
    }
}
