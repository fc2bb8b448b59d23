//! The sandbox of every process the runtime starts for a user: terminal sessions, and stdio
//! MCP servers installed by non-admins.
//!
//! A sandboxed process sees, through kernel mechanisms rather than path checks:
//! - **Its own filesystem view** (a private mount namespace and `pivot_root`, in
//!   [`child`]): an empty tmpfs root holding the system folders bound read-only (`/usr`,
//!   `/etc`…), its workspace bound read-write (plus a cwd outside it that an admin's approved
//!   call names), a private `/tmp` (tmpfs, `HOME=/tmp/home`), a private `/dev` (null, zero,
//!   random, tty, a private devpts, a private `/dev/shm`) and a private `/proc` mounted with
//!   `hidepid=ptraceable` (only processes it may ptrace: its own session). Nothing else exists in it: the server's data dir (admin.token,
//!   secret.key, the SQLite file, code graph indexes), its HOME, other users' workspaces,
//!   `/run` (database and tmux sockets) and the host `/tmp`. Where one of these lies inside
//!   a bound folder — the default `./data` inside the default workspace — an empty
//!   read-only tmpfs (a `/dev/null` bind for a file) covers it. Landlock allow-lists cannot
//!   carve a folder out of an allowed one; a mount can.
//! - **Landlock** (the `landlock` crate, through `crates/mira-sandbox`) over that view:
//!   read+execute on the read-only folders, everything on the read-write ones, nothing
//!   elsewhere; since ABI 6 signals and abstract UNIX sockets are scoped to the session (it
//!   cannot signal the server), and Landlock's ptrace rule denies `/proc/<pid>/{environ,mem}`
//!   of processes outside the session. With `--sandbox-network` a second layer denies TCP
//!   `connect` to the database's and the server's ports (ABI 4).
//! - **No privilege**: every capability dropped (bounding, ambient, effective, permitted,
//!   inheritable) with the securebits locked, and `no_new_privs`: a root server's sessions
//!   cannot load modules, mount, open raw sockets, mknod, bypass file modes or regain any of
//!   it through setuid programs.
//! - **Its own PID and IPC namespaces** (in [`child`]): the program runs as pid 2 under a
//!   minimal init, so it cannot name or signal any process outside its session — the server
//!   included — whatever the Landlock ABI, and SysV IPC of the host and of other sessions is
//!   out of reach. A host that cannot make a PID namespace says so (`/readyz`
//!   `host.pid_namespace`); non-admins are then refused unless Landlock (ABI ≥ 6) scopes
//!   signals instead. The init and the supervisor above it (the process the server waits
//!   for) run the server's own binary as a small helper image ([`set_pid_helper`],
//!   [`child::run_helper_if_asked`]) rather than staying copies of the server's memory.
//! - **A cgroup per session** ([`cgroup`]) where the host allows it: `cgroup.kill` ends the
//!   whole tree (a process that leaves the session and clears its environment included),
//!   `pids.max` and a memory limit bound it.
//!
//! [`Sandbox::new`] probes the host (Landlock ABI, cgroups, namespaces) and runs a real
//! sandboxed self-test; `/readyz` reports what the host offers and what is in force. A host
//! that cannot sandbox makes terminal sessions of non-admins unavailable
//! (`sandbox_unavailable`) unless the operator passes `--allow-unsandboxed`.
//!
//! What does not depend on the server — the child's pre-exec plan, the Landlock rulesets, the
//! mount operations of the view — is `crates/mira-sandbox` ([`child`] is its module), which
//! `mira-runner` applies to terminal sessions on a device too; this module keeps the server's
//! configuration, `/readyz` report, cgroups and error mapping.
//!
//! The sandbox a session will get ([`SandboxSpec`]) is computed when the call is frozen and
//! is part of its canonical input: a different sandbox is a different invocation, and the
//! approval card shows it.

pub mod cgroup;
pub mod mcp;

/// The child's pre-exec plan (shared with `mira-runner`: `crates/mira-sandbox`).
pub use mira_sandbox::child;
pub use mira_sandbox::{SANDBOX_HOME, SANDBOX_TMP, SYSTEM_READ_ONLY, SYSTEM_SECRETS, landlock_abi};

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};

use mira_sandbox::child::MountPlan;
use mira_sandbox::{Failure, Launch, PlanParts, View, cstr, within};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use self::cgroup::{CgroupSupport, SessionCgroup};
use crate::error::ErrorCode;
use crate::registry::ToolError;

/// Whether sessions are sandboxed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Sandbox every session when the host can; otherwise refuse non-admins' sessions
    /// (unless `--allow-unsandboxed`).
    Auto,
    /// Never sandbox (non-admins are then refused unless `--allow-unsandboxed`).
    Off,
}

/// The network rule of sandboxed processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// `deny-services` when the database is reached over TCP (Postgres), else `open`.
    Auto,
    /// No network rule: every address and port, loopback services included.
    Open,
    /// Landlock denies TCP `connect` to the database's port and the server's own port (to
    /// any address); everything else is open.
    DenyServices,
    /// A private network namespace: no network but the session's own loopback.
    None,
}

/// Settings of the sandbox (`mira serve --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxConfig {
    /// `auto`: sandbox every terminal session (and non-admins' stdio MCP servers) when the
    /// host can; `off`: never.
    #[arg(long = "sandbox", env = "MIRA_SANDBOX", value_enum, default_value_t = SandboxMode::Auto)]
    pub mode: SandboxMode,
    /// Let non-admin users run unsandboxed sessions when the host cannot sandbox (or with
    /// `--sandbox off`). Meant for single-user machines.
    #[arg(long = "allow-unsandboxed", env = "MIRA_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// Network rule of sandboxed processes: `auto`, `open`, `deny-services`, `none`.
    #[arg(long = "sandbox-network", env = "MIRA_SANDBOX_NETWORK", value_enum, default_value_t = NetworkMode::Auto)]
    pub network: NetworkMode,
    /// Extra folders sandboxed processes may read and execute (colon-separated), e.g.
    /// toolchains under the server's HOME.
    #[arg(long = "sandbox-read", env = "MIRA_SANDBOX_READ", value_delimiter = ':')]
    pub read_only: Vec<PathBuf>,
    /// Extra files or folders covered inside the sandbox's folders (colon-separated), in
    /// addition to the data dir, database files and known system secrets.
    #[arg(long = "sandbox-hide", env = "MIRA_SANDBOX_HIDE", value_delimiter = ':')]
    pub hide: Vec<PathBuf>,
    /// Processes (and threads) one session may have at once (`pids.max`; 0 = no limit).
    #[arg(long = "sandbox-pids-max", env = "MIRA_SANDBOX_PIDS_MAX", default_value_t = 1024)]
    pub pids_max: u64,
    /// Memory one session may use, in bytes, its `/tmp` included (0 = no limit).
    #[arg(long = "sandbox-memory-max", env = "MIRA_SANDBOX_MEMORY_MAX", default_value_t = 4 << 30)]
    pub memory_max: u64,
    /// Size of a session's private `/tmp` and of its `/dev/shm`, in bytes.
    #[arg(long = "sandbox-tmp-bytes", env = "MIRA_SANDBOX_TMP_BYTES", default_value_t = 1 << 30)]
    pub tmp_bytes: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::Auto,
            allow_unsandboxed: false,
            network: NetworkMode::Auto,
            read_only: Vec::new(),
            hide: Vec::new(),
            pids_max: 1024,
            memory_max: 4 << 30,
            tmp_bytes: 1 << 30,
        }
    }
}

/// The sandbox one process gets: part of a terminal `start`'s canonical input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SandboxSpec {
    /// Whether the process is sandboxed. False only for admins, or when the operator allowed
    /// unsandboxed sessions, on a host that cannot sandbox.
    pub enforced: bool,
    /// Why it is not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Folders it may read, write, create in and execute from (absolute, real paths).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_write: Vec<String>,
    /// Folders it may read and execute from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    /// Paths inside those folders it cannot see at all (covered by an empty read-only mount).
    /// Other users' workspaces inside them are covered too (not listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<String>,
    /// Its private folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private: Option<PrivateView>,
    /// Its network rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRule>,
    /// Its limits (those the host can enforce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

impl SandboxSpec {
    fn unenforced(reason: String) -> Self {
        SandboxSpec {
            enforced: false,
            reason: Some(reason),
            read_write: Vec::new(),
            read_only: Vec::new(),
            hidden: Vec::new(),
            private: None,
            network: None,
            limits: None,
        }
    }
}

/// The private folders of a sandboxed process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PrivateView {
    /// Its own `/tmp` (tmpfs), also `TMPDIR`.
    pub tmp: String,
    /// Its HOME (inside `/tmp`).
    pub home: String,
    /// Size of `/tmp` (and of `/dev/shm`), in bytes.
    pub tmp_bytes: u64,
    /// `/proc` shows only the process's own session.
    pub proc: String,
}

/// The network rule of a sandboxed process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetworkRule {
    /// Every address and port.
    Open,
    /// TCP `connect` to these ports (any address) is denied; everything else is open.
    DenyTcpConnect {
        /// The denied ports: the database's (when over TCP) and the server's.
        ports: Vec<u16>,
    },
    /// A private network namespace: only the process's own loopback.
    Private,
}

/// Limits of a sandboxed session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Limits {
    /// `pids.max` (processes and threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// Memory limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max_bytes: Option<u64>,
    /// How the whole process tree is killed: `cgroup.kill`, `cgroup_procs` or
    /// `session_scan`.
    pub tree_kill: String,
}

/// Whether sandboxing is in force on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Every session is sandboxed.
    Enforced,
    /// The host cannot sandbox (see `reason`).
    Unavailable,
    /// `--sandbox off`.
    Off,
}

/// What non-admins' sessions get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NonAdminSessions {
    /// Sandboxed.
    Sandboxed,
    /// Refused (`sandbox_unavailable`).
    Refused,
    /// Unsandboxed, because the operator passed `--allow-unsandboxed`.
    UnsandboxedAllowed,
}

/// What the host offers (`/readyz`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HostSupport {
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
    /// The server runs as root (else user namespaces are needed for the mounts).
    pub root: bool,
    /// Unprivileged user namespaces are allowed (`/proc/sys/user/max_user_namespaces`).
    pub user_namespaces: bool,
    /// cgroup hierarchies and controllers usable for sessions.
    pub cgroup: CgroupSupport,
    /// Sandboxed processes get their own PID and IPC namespaces (found by the self-test).
    pub pid_namespace: bool,
    /// Result of the sandboxed self-test at start: `passed`, `passed without a PID
    /// namespace`, `skipped` or the failure.
    pub self_test: String,
}

/// The protections every sandboxed session gets on this server (`/readyz`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Protections {
    /// `landlock+mount_namespace`, or `none`.
    pub filesystem: String,
    /// Capabilities dropped and securebits locked.
    pub capabilities_dropped: bool,
    /// `no_new_privs`.
    pub no_new_privs: bool,
    /// Signals to processes outside the session are impossible (its own PID namespace, or
    /// Landlock ABI ≥ 6).
    pub signal_scope: bool,
    /// Its own PID namespace (the program is pid 2 under a minimal init; no process
    /// outside the session can be named).
    pub pid_namespace: bool,
    /// Its own IPC namespace (SysV IPC and POSIX message queues of the host and of other
    /// sessions are out of reach).
    pub ipc_namespace: bool,
    /// Abstract UNIX sockets outside the session are unreachable (Landlock ABI ≥ 6).
    pub abstract_unix_scope: bool,
    /// ptrace and `/proc/<pid>/{environ,mem}` of processes outside the session are denied.
    pub ptrace_scope: bool,
    /// `private_hidepid` (own `/proc`, other processes invisible) or `host_bound`.
    pub proc: String,
    /// The network rule in force.
    pub network: NetworkRule,
    /// Whether the network rule can be enforced (ABI ≥ 4 for `deny_tcp_connect`).
    pub network_enforced: bool,
    /// `cgroup.kill`, `cgroup_procs` or `session_scan`.
    pub tree_kill: String,
    /// `pids.max` per session, when enforced.
    pub pids_max: Option<u64>,
    /// Memory limit per session in bytes, when enforced.
    pub memory_max_bytes: Option<u64>,
}

/// The sandbox section of `/readyz`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SandboxReport {
    /// `enforced`, `unavailable` or `off`.
    pub state: SandboxState,
    /// Why not `enforced`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What non-admin users' terminal sessions get.
    pub non_admin_sessions: NonAdminSessions,
    /// What the host offers.
    pub host: HostSupport,
    /// What is in force for sandboxed processes (when `enforced`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protections: Option<Protections>,
}

/// What a sandbox is asked for.
#[derive(Debug, Clone)]
pub struct SpecRequest<'a> {
    /// The run's workspace root (real path), granted read-write; None for a process without
    /// a workspace (an MCP server).
    pub workspace: Option<&'a Path>,
    /// The real working directory.
    pub cwd: &'a Path,
    /// Whether the caller is an admin (an admin's cwd outside the sandbox is granted).
    pub is_admin: bool,
    /// Extra read-only folders for this process (an MCP server's install tree).
    pub read_only: &'a [PathBuf],
}

#[derive(Debug, Clone)]
enum State {
    Enforced,
    Unavailable(String),
    Off,
}

/// The sandbox engine of this server (see the module docs).
pub struct Sandbox {
    config: SandboxConfig,
    state: State,
    host: HostSupport,
    proc_view: String,
    stage: PathBuf,
    /// Files and folders covered when they lie inside a sandbox's folders.
    secrets: Vec<PathBuf>,
    /// System read-only folders: (path, link target when it is a symbolic link).
    system: Vec<(PathBuf, Option<PathBuf>)>,
    db_port: Option<u16>,
    listen_port: AtomicU16,
    net_ruleset: Mutex<Option<(Vec<u16>, Arc<OwnedFd>)>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("state", &self.state).finish_non_exhaustive()
    }
}

/// The program a PID namespace's supervisor and init `execve` ([`set_pid_helper`]).
static PID_HELPER: OnceLock<PathBuf> = OnceLock::new();

/// Names the binary the supervisor and the init of every PID namespace `execve` right after
/// their forks, so that they hold a small helper image instead of a copy of the server's
/// memory ([`child::MountPlan::pid_helper`], module docs of [`child`], step 4): a binary
/// whose `main` calls [`child::run_helper_if_asked`] first — the `mira` binary, as
/// `/proc/self/exe` in the server (still the running binary if its file was replaced), the
/// built `mira` in tests that run the server inside another binary. Process-wide, set once
/// before the first session starts: a later call changes nothing and returns false. The
/// binary is first run once as the helper would be ([`child::helper_answers`]); one that
/// does not answer (it needs `LD_LIBRARY_PATH`, or the server runs under a loader or an
/// emulator) is not used: false, with a warning. Unset, they stay copies of the server (as
/// in a test harness that sets none).
pub fn set_pid_helper(path: PathBuf) -> bool {
    if PID_HELPER.get().is_some() {
        return false;
    }
    if !child::helper_answers(&path) {
        tracing::warn!(helper = %path.display(),
            "the binary does not run as the PID-namespace helper: each session's supervisor and init stay copies of the server's memory");
        return false;
    }
    PID_HELPER.set(path).is_ok()
}

fn sandbox_error(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

/// The database's TCP port, for Postgres: the URL's port (or its `port` parameter, else
/// 5432) also when the server reaches it over a UNIX socket (`host=/run/postgresql`): the
/// socket is out of the sandbox's view, but the same Postgres usually listens on that port of
/// the loopback address too, where a trust-auth line would hand a session the database.
fn database_port(url: &str) -> Option<u16> {
    let parsed = url::Url::parse(url).ok()?;
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return None;
    }
    let param = parsed.query_pairs().find(|(k, _)| k == "port").and_then(|(_, v)| v.parse::<u16>().ok());
    Some(parsed.port().or(param).unwrap_or(5432))
}

impl Sandbox {
    /// Probes the host, prepares this server's sandboxes and runs a sandboxed self-test.
    /// `data_dir` is hidden from every sandbox, as are the SQLite files of `database_url`.
    pub fn new(config: SandboxConfig, data_dir: &Path, database_url: &str, node_id: &str) -> Arc<Sandbox> {
        let data_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        let stage = data_dir.join("sandbox-root");
        let mut secrets = vec![data_dir.clone()];
        if let Some(path) = database_url.strip_prefix("sqlite://").or_else(|| database_url.strip_prefix("sqlite:")) {
            let file = path.split('?').next().unwrap_or_default();
            if !file.is_empty() && file != ":memory:" {
                let file = std::fs::canonicalize(file).unwrap_or_else(|_| PathBuf::from(file));
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let mut f = file.clone().into_os_string();
                    f.push(suffix);
                    secrets.push(PathBuf::from(f));
                }
            }
        }
        let (system_secrets, complete) = mira_sandbox::system_secrets();
        if !complete {
            tracing::warn!(
                limit = mira_sandbox::SCAN_LIMIT,
                "the system folders hold more entries than the sandbox looks at: restricted files past them are not covered (name them with --sandbox-hide)"
            );
        }
        secrets.extend(system_secrets);
        for p in config.hide.iter().cloned() {
            secrets.push(std::fs::canonicalize(&p).unwrap_or(p));
        }
        let system = mira_sandbox::system_folders();
        let abi = landlock_abi();
        let root = mira_sandbox::is_root();
        let user_namespaces = mira_sandbox::user_namespaces_allowed();
        let cgroup = if config.mode == SandboxMode::Auto && abi > 0 {
            CgroupSupport::probe(node_id)
        } else {
            CgroupSupport::default()
        };
        if cgroup.membership() {
            let swept = cgroup.sweep();
            if swept > 0 {
                tracing::info!(swept, "session cgroups left by a previous process were killed and removed");
            }
        }
        let host = HostSupport {
            landlock_abi: abi,
            root,
            user_namespaces,
            cgroup,
            pid_namespace: false,
            self_test: "skipped".into(),
        };
        let mut sandbox = Sandbox {
            config,
            state: State::Off,
            host,
            proc_view: "private_hidepid".into(),
            stage,
            secrets,
            system,
            db_port: database_port(database_url),
            listen_port: AtomicU16::new(0),
            net_ruleset: Mutex::new(None),
        };
        sandbox.state = match sandbox.config.mode {
            SandboxMode::Off => State::Off,
            SandboxMode::Auto if abi < 1 => State::Unavailable(
                "Landlock is not available on this kernel (Linux ≥ 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= list)".into(),
            ),
            SandboxMode::Auto if !root && !user_namespaces => State::Unavailable(
                "the server is not root and unprivileged user namespaces are disabled, so sessions cannot get a private mount namespace".into(),
            ),
            SandboxMode::Auto => {
                // Own PID and IPC namespaces where the host makes them; else without, which
                // leaves signals to Landlock's scoping (ABI ≥ 6) alone.
                sandbox.host.pid_namespace = true;
                let tested = sandbox.self_test().or_else(|with| {
                    sandbox.host.pid_namespace = false;
                    sandbox.self_test().map_err(|_| with.clone()).inspect(|_| {
                        tracing::warn!(error = %with, "sandboxed processes cannot get their own PID namespace here");
                    })
                });
                match tested {
                    Ok(_) if !sandbox.host.pid_namespace && abi < 6 => {
                        sandbox.host.self_test = "passed without a PID namespace".into();
                        State::Unavailable(
                            "this host gives sandboxed processes no PID namespace and its Landlock (ABI < 6) cannot scope signals, so a session could signal the server".into(),
                        )
                    }
                    Ok(notes) => {
                        if notes.contains(&child::note::PROC_BOUND) {
                            sandbox.proc_view = "host_bound".into();
                        }
                        sandbox.host.self_test = if sandbox.host.pid_namespace {
                            "passed".into()
                        } else {
                            "passed without a PID namespace".into()
                        };
                        State::Enforced
                    }
                    Err(e) => {
                        sandbox.host.self_test = e.clone();
                        State::Unavailable(format!("the sandbox self-test failed: {e}"))
                    }
                }
            }
        };
        match &sandbox.state {
            State::Enforced => tracing::info!(
                landlock_abi = abi,
                tree_kill = sandbox.host.cgroup.kill_mechanism(),
                "terminal sessions are sandboxed"
            ),
            State::Unavailable(r) => {
                tracing::warn!(reason = %r, allow_unsandboxed = sandbox.config.allow_unsandboxed, "terminal sessions cannot be sandboxed")
            }
            State::Off => tracing::warn!(
                allow_unsandboxed = sandbox.config.allow_unsandboxed,
                "the sandbox is off (--sandbox off)"
            ),
        }
        Arc::new(sandbox)
    }

    /// Records the port the server listens on (denied to sessions under `deny-services`).
    pub fn set_listen_port(&self, port: u16) {
        self.listen_port.store(port, Ordering::Relaxed);
    }

    /// The spec a session frozen with `frozen` runs under here, when that is the approved
    /// one: `now` (this server's spec for it) when equal, or — for a call frozen on another
    /// replica of the same database, whose own listen port the frozen spec denies instead of
    /// this server's — `frozen` with this server's port denied too (every port the approval
    /// promised to deny stays denied). None when they differ in anything else
    /// (`sandbox_changed`).
    pub fn accept_frozen(&self, now: &SandboxSpec, frozen: &SandboxSpec) -> Option<SandboxSpec> {
        if now == frozen {
            return Some(now.clone());
        }
        let own = self.listen_port.load(Ordering::Relaxed);
        let (Some(NetworkRule::DenyTcpConnect { ports: here }), Some(NetworkRule::DenyTcpConnect { ports: there })) =
            (&now.network, &frozen.network)
        else {
            return None;
        };
        let only_own_port_differs = here.iter().all(|p| *p == own || there.contains(p));
        let without_ports = |s: &SandboxSpec| SandboxSpec { network: None, ..s.clone() };
        if own == 0 || !only_own_port_differs || without_ports(now) != without_ports(frozen) {
            return None;
        }
        let mut ports: Vec<u16> = there.iter().copied().chain([own]).collect();
        ports.sort_unstable();
        ports.dedup();
        Some(SandboxSpec { network: Some(NetworkRule::DenyTcpConnect { ports }), ..now.clone() })
    }

    /// Whether sessions are sandboxed.
    pub fn enforced(&self) -> bool {
        matches!(self.state, State::Enforced)
    }

    /// Why sessions are not sandboxed (None when they are).
    pub fn unavailable_reason(&self) -> Option<String> {
        match &self.state {
            State::Enforced => None,
            State::Unavailable(r) => Some(r.clone()),
            State::Off => Some("the operator turned the sandbox off (--sandbox off)".into()),
        }
    }

    /// None when a user may run processes here; for a non-admin on a server that cannot
    /// sandbox (and no `--allow-unsandboxed`), the reason they may not.
    pub fn refusal_for(&self, is_admin: bool) -> Option<String> {
        if is_admin || self.config.allow_unsandboxed {
            return None;
        }
        self.unavailable_reason().map(|r| {
            format!("{r}; terminal sessions of non-admin users need the sandbox (an operator may pass --allow-unsandboxed on a single-user machine)")
        })
    }

    /// The tool error of [`Sandbox::refusal_for`] (403 `sandbox_unavailable`).
    pub fn refusal_error(reason: String) -> ToolError {
        ToolError::new(ErrorCode::SandboxUnavailable, reason)
    }

    /// The TCP ports of this server's own services: the database's (when reached over TCP)
    /// and the API's (once listening), sorted.
    pub fn service_ports(&self) -> Vec<u16> {
        let mut p: Vec<u16> = [self.db_port, Some(self.listen_port.load(Ordering::Relaxed))]
            .into_iter()
            .flatten()
            .filter(|p| *p != 0)
            .collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// The network rule sandboxed processes get on this server.
    pub fn network_rule(&self) -> NetworkRule {
        let ports = || self.service_ports();
        match self.config.network {
            NetworkMode::Open => NetworkRule::Open,
            NetworkMode::None => NetworkRule::Private,
            NetworkMode::DenyServices => NetworkRule::DenyTcpConnect { ports: ports() },
            NetworkMode::Auto if self.db_port.is_some() => NetworkRule::DenyTcpConnect { ports: ports() },
            NetworkMode::Auto => NetworkRule::Open,
        }
    }

    fn network_enforceable(&self, rule: &NetworkRule) -> bool {
        match rule {
            NetworkRule::DenyTcpConnect { ports } => ports.is_empty() || self.host.landlock_abi >= 4,
            _ => true,
        }
    }

    fn limits(&self) -> Limits {
        let cg = &self.host.cgroup;
        Limits {
            pids_max: (cg.pids_limit() && self.config.pids_max > 0).then_some(self.config.pids_max),
            memory_max_bytes: (cg.memory_limit() && self.config.memory_max > 0).then_some(self.config.memory_max),
            tree_kill: cg.kill_mechanism().to_owned(),
        }
    }

    /// The `/readyz` section.
    pub fn report(&self) -> SandboxReport {
        let (state, reason) = match &self.state {
            State::Enforced => (SandboxState::Enforced, None),
            State::Unavailable(r) => (SandboxState::Unavailable, Some(r.clone())),
            State::Off => (SandboxState::Off, self.unavailable_reason()),
        };
        let non_admin_sessions = if state == SandboxState::Enforced {
            NonAdminSessions::Sandboxed
        } else if self.config.allow_unsandboxed {
            NonAdminSessions::UnsandboxedAllowed
        } else {
            NonAdminSessions::Refused
        };
        let abi = self.host.landlock_abi;
        let protections = (state == SandboxState::Enforced).then(|| {
            let network = self.network_rule();
            let limits = self.limits();
            Protections {
                filesystem: "landlock+mount_namespace".into(),
                capabilities_dropped: true,
                no_new_privs: true,
                signal_scope: abi >= 6 || self.host.pid_namespace,
                pid_namespace: self.host.pid_namespace,
                ipc_namespace: self.host.pid_namespace,
                abstract_unix_scope: abi >= 6,
                ptrace_scope: true,
                proc: self.proc_view.clone(),
                network_enforced: self.network_enforceable(&network),
                network,
                tree_kill: limits.tree_kill,
                pids_max: limits.pids_max,
                memory_max_bytes: limits.memory_max_bytes,
            }
        });
        SandboxReport { state, reason, non_admin_sessions, host: self.host.clone(), protections }
    }

    /// The real paths every sandbox hides: the data dir, the SQLite files, system secrets
    /// and `--sandbox-hide` paths.
    pub fn secrets(&self) -> &[PathBuf] {
        &self.secrets
    }

    fn hidden_inside(&self, roots: &[&Path]) -> Vec<String> {
        mira_sandbox::hidden_inside(&self.secrets, roots)
    }

    /// Whether `path` is visible (and at least readable) inside a sandbox of `spec`.
    pub fn visible_in(spec: &SandboxSpec, path: &Path) -> bool {
        let inside = |list: &[String]| list.iter().any(|r| within(path, Path::new(r)));
        (inside(&spec.read_only) || inside(&spec.read_write)) && !inside(&spec.hidden)
    }

    /// The sandbox for a process (see [`SpecRequest`]). Errors: 403 `sandbox_unavailable`
    /// (a non-admin on a server that cannot sandbox), 403 `cwd_hidden` (the cwd is the data
    /// dir or another hidden path), 403 `cwd_outside_sandbox` (a non-admin's cwd the sandbox
    /// would not show).
    pub fn spec(&self, req: &SpecRequest<'_>) -> Result<SandboxSpec, ToolError> {
        if !self.enforced() {
            if let Some(reason) = self.refusal_for(req.is_admin) {
                return Err(Self::refusal_error(reason));
            }
            return Ok(SandboxSpec::unenforced(self.unavailable_reason().unwrap_or_default()));
        }
        self.build_spec(req)
    }

    fn build_spec(&self, req: &SpecRequest<'_>) -> Result<SandboxSpec, ToolError> {
        // Every decision below compares real paths: `..` and symbolic links resolved, as the
        // bind mounts and Landlock resolve them.
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let cwd_real = real(req.cwd);
        let req = &SpecRequest { cwd: &cwd_real, ..req.clone() };
        let mut read_write: Vec<PathBuf> = req.workspace.map(real).into_iter().collect();
        let mut read_only: Vec<PathBuf> =
            self.system.iter().filter(|(_, link)| link.is_none()).map(|(p, _)| p.clone()).collect();
        for extra in self.config.read_only.iter().chain(req.read_only) {
            // Bound where it was named (a path through a symbolic link stays usable as
            // given, e.g. a worktree's `.cache` linked elsewhere); the link is followed.
            let Ok(real) = std::fs::canonicalize(extra) else { continue };
            let clean = extra.is_absolute()
                && extra
                    .components()
                    .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
            let shown = if clean { extra.clone() } else { real.clone() };
            if real.is_dir() && !read_only.contains(&shown) {
                read_only.push(shown);
            }
        }
        if self.secrets.iter().any(|s| within(req.cwd, s)) {
            return Err(ToolError::new(
                ErrorCode::CwdHidden,
                format!("{} is hidden from sandboxed processes (the server's data or a secret)", req.cwd.display()),
            ));
        }
        let inside = read_write.iter().chain(&read_only).any(|r| within(req.cwd, r));
        let ancestor = req.cwd == Path::new("/") || read_write.iter().chain(&read_only).any(|r| within(r, req.cwd));
        if !inside {
            if req.is_admin && req.cwd != Path::new("/") {
                read_write.push(req.cwd.to_path_buf());
            } else if !ancestor {
                return Err(ToolError::new(
                    ErrorCode::CwdOutsideSandbox,
                    format!(
                        "{} is outside your workspace and the sandbox's read-only folders; only an admin's session may name such a cwd",
                        req.cwd.display()
                    ),
                ));
            }
        }
        // A read-only folder inside a read-write one adds nothing.
        read_only.retain(|r| !read_write.iter().any(|w| within(r, w)));
        let roots: Vec<&Path> = read_write.iter().chain(&read_only).map(PathBuf::as_path).collect();
        let hidden = self.hidden_inside(&roots);
        let network = self.network_rule();
        Ok(SandboxSpec {
            enforced: true,
            reason: None,
            read_write: read_write.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
            read_only: read_only.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
            hidden,
            private: Some(PrivateView {
                tmp: SANDBOX_TMP.into(),
                home: SANDBOX_HOME.into(),
                tmp_bytes: self.config.tmp_bytes,
                proc: if self.proc_view == "private_hidepid" {
                    "own session only (hidepid=ptraceable)".into()
                } else {
                    "the host's (read-only); environ and mem of other processes denied".into()
                },
            }),
            network: Some(network),
            limits: Some(self.limits()),
        })
    }

    /// The network layer for `ports` (built once, then shared; see
    /// [`mira_sandbox::deny_tcp_connect_ruleset`]).
    fn net_ruleset(&self, ports: &[u16]) -> Result<Arc<OwnedFd>, String> {
        let mut cached = self.net_ruleset.lock();
        if let Some((p, fd)) = cached.as_ref()
            && p == ports
        {
            return Ok(fd.clone());
        }
        let fd = Arc::new(mira_sandbox::deny_tcp_connect_ruleset(ports)?);
        *cached = Some((ports.to_vec(), fd.clone()));
        Ok(fd)
    }

    /// Prepares the sandbox of one process: its cgroups (when `cgroup_id` is given and the
    /// host has them), its mount plan and its Landlock rulesets. `extra_hidden` are further
    /// paths to cover (other users' workspaces). Returns None when `spec` is not enforced.
    ///
    /// Every read-write folder is bound, and gets its Landlock rule, from an open descriptor
    /// ([`mira_sandbox::Pinned`]): `pinned` are those the caller already holds (a run's
    /// workspace root, opened by identity when the run started), the others are opened here;
    /// each must still be at its path in `spec` (else 409 `sandbox_changed`), so a symlink
    /// swapped into a folder on the way after the checks cannot redirect the bind.
    pub fn prepare(
        &self,
        spec: &SandboxSpec,
        cwd: &Path,
        cgroup_id: Option<&str>,
        extra_hidden: &[PathBuf],
        pty_session: bool,
        pinned: Vec<(String, OwnedFd)>,
    ) -> Result<Option<Prepared>, ToolError> {
        if !spec.enforced {
            return Ok(None);
        }
        if !self.enforced() {
            return Err(sandbox_error(
                ErrorCode::SandboxFailed,
                "the approved call is sandboxed but this server can no longer sandbox; nothing was started",
            ));
        }
        self.prepare_inner(spec, cwd, cgroup_id, extra_hidden, pty_session, pinned).map(Some)
    }

    fn prepare_inner(
        &self,
        spec: &SandboxSpec,
        cwd: &Path,
        cgroup_id: Option<&str>,
        extra_hidden: &[PathBuf],
        pty_session: bool,
        mut pinned: Vec<(String, OwnedFd)>,
    ) -> Result<Prepared, ToolError> {
        let fail = |e: String| sandbox_error(ErrorCode::SandboxFailed, format!("preparing the sandbox: {e}"));
        let changed = |e: String| {
            sandbox_error(
                ErrorCode::SandboxChanged,
                format!("a read-write folder of the approved sandbox is not where it was: {e}; nothing was started"),
            )
        };
        let mut held: Vec<(String, OwnedFd)> = Vec::new();
        for path in &spec.read_write {
            let fd = match pinned.iter().position(|(p, _)| p == path) {
                Some(i) => {
                    let (_, fd) = pinned.swap_remove(i);
                    mira_sandbox::check_pinned(&fd, path).map_err(changed)?;
                    fd
                }
                None => mira_sandbox::pin_folder(path).map_err(changed)?,
            };
            held.push((path.clone(), fd));
        }
        let pins: Vec<mira_sandbox::Pinned<'_>> =
            held.iter().map(|(path, fd)| mira_sandbox::Pinned { path, fd: fd.as_fd() }).collect();
        let ruleset = mira_sandbox::fs_ruleset_pinned(self.host.landlock_abi, &spec.read_only, &spec.read_write, &pins)
            .map_err(fail)?;
        // Covers are decided on real paths too.
        let extra_hidden: Vec<PathBuf> =
            extra_hidden.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect();
        let net_ruleset = match &spec.network {
            Some(NetworkRule::DenyTcpConnect { ports }) if !ports.is_empty() => {
                Some(self.net_ruleset(ports).map_err(fail)?)
            }
            _ => None,
        };
        let (cgroup, cgroup_procs) = match cgroup_id {
            Some(id) if self.host.cgroup.membership() => {
                let (g, fds) = self
                    .host
                    .cgroup
                    .create(id, self.config.pids_max, self.config.memory_max)
                    .map_err(|e| fail(format!("creating the session's cgroup: {e}")))?;
                (Some(g), fds)
            }
            _ => (None, Vec::new()),
        };
        let ops = mira_sandbox::mount_ops(&View {
            stage: &self.stage,
            system: &self.system,
            read_only: &spec.read_only,
            read_write: &spec.read_write,
            pinned: &pins,
            hidden: &spec.hidden,
            extra_hidden: &extra_hidden,
            tmp_bytes: self.config.tmp_bytes,
        })
        .map_err(fail)?;
        drop(pins);
        let launch = Launch::new(PlanParts {
            pty_session,
            cgroup_procs,
            mounts: Some(MountPlan {
                userns: (!self.host.root).then(mira_sandbox::own_user_maps),
                new_net: matches!(spec.network, Some(NetworkRule::Private)),
                new_pid: self.host.pid_namespace,
                pid_helper: match PID_HELPER.get() {
                    Some(path) if self.host.pid_namespace => Some(cstr(path).map_err(fail)?),
                    _ => None,
                },
                new_ipc: self.host.pid_namespace,
                stage: cstr(&self.stage).map_err(fail)?,
                root_data: cstr(mira_sandbox::ROOT_DATA).map_err(fail)?,
                ops,
            }),
            cwd: cstr(cwd).map_err(fail)?,
            ruleset,
            child_rules: mira_sandbox::view_child_rules(self.host.landlock_abi).map_err(fail)?,
            net_ruleset,
            pinned: held.into_iter().map(|(_, fd)| fd).collect(),
        })
        .map_err(fail)?;
        std::fs::create_dir_all(&self.stage).map_err(|e| fail(format!("{}: {e}", self.stage.display())))?;
        Ok(Prepared { launch, cgroup })
    }

    /// Releases what the sandbox holds on the host (this node's empty cgroup bases), once
    /// every session has ended (server stop).
    pub fn release(&self) {
        self.host.cgroup.release();
    }

    /// Kills and removes the cgroups a previous process left for session `id` (recovery).
    /// Returns whether there were any.
    pub fn kill_leftover_cgroup(&self, id: &str) -> bool {
        match self.host.cgroup.existing(id) {
            Some(g) => {
                g.kill();
                g.remove(std::time::Duration::from_secs(2));
                true
            }
            None => false,
        }
    }

    /// Runs `/bin/true` (or `sh -c :`) in a full sandbox with no workspace; returns the
    /// child's fallback notes.
    fn self_test(&self) -> Result<Vec<u8>, String> {
        let program =
            ["/bin/true", "/usr/bin/true"].into_iter().find(|p| Path::new(p).exists()).ok_or("no /bin/true to run")?;
        let spec = self
            .build_spec(&SpecRequest { workspace: None, cwd: Path::new("/"), is_admin: false, read_only: &[] })
            .map_err(|e| e.message)?;
        // The network layer is built on first use, not for the self-test.
        let spec = SandboxSpec { network: Some(NetworkRule::Open), ..spec };
        let prepared =
            self.prepare_inner(&spec, Path::new("/"), None, &[], false, Vec::new()).map_err(|e| e.message)?;
        let mut cmd = std::process::Command::new(program);
        cmd.env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        prepared.install(&mut cmd);
        let spawned = cmd.spawn();
        drop(cmd);
        let (mut child, _, notes) = prepared.finish(spawned).map_err(|e| e.message)?;
        match child.wait() {
            Ok(s) if s.success() => Ok(notes),
            Ok(s) => Err(format!("the sandboxed {program} ended with {s}")),
            Err(e) => Err(format!("waiting for the sandboxed {program}: {e}")),
        }
    }
}

/// One process's prepared sandbox.
pub struct Prepared {
    launch: Launch,
    cgroup: Option<SessionCgroup>,
}

impl Prepared {
    /// Sets the `pre_exec` hook that applies the sandbox in the child. The command must not
    /// set a working directory of its own: the plan enters the cwd inside the new root.
    pub fn install(&self, cmd: &mut std::process::Command) {
        self.launch.install(cmd);
    }

    /// As [`Prepared::install`], for tokio's `Command` (stdio MCP servers).
    pub fn install_tokio(&self, cmd: &mut tokio::process::Command) {
        let plan = self.launch.plan();
        // SAFETY: `ChildPlan::apply` only makes async-signal-safe system calls on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
    }

    /// Reads the child's report once the spawn returned (the command must have been dropped
    /// so that no copy of the pipe's write end remains): the spawned child with its cgroup
    /// and the child's fallback notes, or a `sandbox_failed` error naming the step that
    /// failed (`spawn_failed` when no step failed; the cgroup is then removed).
    pub fn finish<C>(self, spawned: std::io::Result<C>) -> Result<(C, Option<SessionCgroup>, Vec<u8>), ToolError> {
        let Prepared { launch, cgroup } = self;
        let error = match launch.finish(spawned) {
            Ok((c, notes)) => return Ok((c, cgroup, notes)),
            Err(f @ Failure::Step(..)) => sandbox_error(ErrorCode::SandboxFailed, f.to_string()),
            Err(f @ Failure::Spawn(_)) => sandbox_error(ErrorCode::SpawnFailed, f.to_string()),
        };
        if let Some(g) = cgroup {
            g.kill();
            g.remove(std::time::Duration::from_millis(500));
        }
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::database_port;

    /// `auto` closes the database's port for every Postgres URL: over a UNIX socket the same
    /// Postgres usually listens on that port at loopback too.
    #[test]
    fn the_database_port_is_known_for_unix_sockets_too() {
        assert_eq!(database_port("postgres://u@db.example:6543/x"), Some(6543));
        assert_eq!(database_port("postgres://u@127.0.0.1/x"), Some(5432));
        assert_eq!(database_port("postgresql:///mira?host=/run/postgresql"), Some(5432));
        assert_eq!(database_port("postgres:///mira?host=/run/postgresql&port=5433"), Some(5433));
        assert_eq!(database_port("postgresql://%2Frun%2Fpostgresql/mira"), Some(5432));
        assert_eq!(database_port("sqlite://data/mira.db"), None);
    }
}
