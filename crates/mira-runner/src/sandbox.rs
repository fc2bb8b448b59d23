//! The device's sandbox for terminal sessions (`--sandbox auto|landlock|off`): the same
//! plan the control plane applies to its own sessions (`crates/mira-sandbox`), so that an
//! approved command on the device cannot read the runner's key and state (`--state-dir`),
//! cannot write outside the run's workspace (and a private tmp), and cannot gain privilege.
//!
//! Two kinds, probed at start with a real sandboxed self-test (`/bin/true`):
//! - **`landlock+mount_namespace`** (root, or unprivileged user namespaces): a private mount
//!   namespace whose root shows the system folders read-only, the run's workspace
//!   read-write, a private tmpfs `/tmp` (`HOME=/tmp/home`), a private `/dev` and `/proc`
//!   (own session only); the state dir is not in it at all (covered when it lies inside the
//!   workspace or a system folder), nor are the host's secrets such as `/etc/shadow`. Then
//!   Landlock over that view, every capability dropped, `no_new_privs`.
//! - **`landlock`** (a device that may not create user namespaces, or `--sandbox
//!   landlock`): Landlock on the device's own view — read+execute on the system folders,
//!   everything on the workspace and on this runner's private tmp folder
//!   (`$TMPDIR/mira-runner-<device>`, shared by its sessions), reading `/proc`, nothing
//!   elsewhere (the state dir included) — plus capabilities dropped and `no_new_privs`.
//!   Landlock cannot carve a folder out of an allowed one: a state dir inside the workspace
//!   makes sessions refused (`sandbox_unavailable`) in this kind.
//!
//! Both: every inherited descriptor is closed at exec, signals and abstract UNIX sockets
//! are scoped to the session (Landlock ABI ≥ 6), and other processes' `/proc/<pid>/environ`,
//! `mem`, `root`, `fd` are denied (Landlock's ptrace rule). The network stays open; there is
//! no cgroup (the session is killed by session id and environment marker).
//!
//! The spec a session gets ([`SessionSandbox`]) is part of the canonical `start` input (the
//! approver sees it); an execution whose spec now differs is refused (`sandbox_changed`).
//! When the device cannot sandbox (or `--sandbox off`), terminal starts are refused
//! (`sandbox_unavailable`) unless the runner was started with `--allow-unsandboxed`.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use mira_core::error_code::ErrorCode;
use mira_core::remote::AdvertisedSandbox;
use mira_core::tool::ToolError;
use mira_sandbox::child::MountPlan;
use mira_sandbox::{Failure, Launch, PlanParts, SANDBOX_HOME, SANDBOX_TMP, View, cstr, within};
use serde::{Deserialize, Serialize};

/// Size of a session's private `/tmp` (and `/dev/shm`) in the private view: 1 GiB.
pub const TMP_BYTES: u64 = 1 << 30;

/// `--sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxMode {
    /// The private view when the device allows it, else Landlock alone; sessions are refused
    /// when neither works (unless `--allow-unsandboxed`).
    Auto,
    /// Landlock alone on the device's own view (no namespaces).
    Landlock,
    /// No sandbox: sessions are refused unless `--allow-unsandboxed`.
    Off,
}

/// What kind of sandbox sessions get here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A private mount namespace view, then Landlock.
    PrivateView,
    /// Landlock on the host's view.
    HostView,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::PrivateView => "landlock+mount_namespace",
            Kind::HostView => "landlock",
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    Enforced(Kind),
    Unavailable(String),
    Off,
}

/// The private folders of a sandboxed session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrivateTmp {
    /// Its `TMPDIR`: `/tmp` (a private tmpfs) in the private view, this runner's own folder
    /// with Landlock alone.
    pub tmp: String,
    /// Its HOME (inside `tmp`).
    pub home: String,
    /// Shared by every sandboxed session of this runner (Landlock alone) rather than the
    /// session's own.
    pub shared_by_runner_sessions: bool,
}

/// The sandbox one device session gets: part of the canonical `start` input, and of the
/// start's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSandbox {
    /// Whether the session is sandboxed (false only with `--allow-unsandboxed` on a device
    /// that cannot sandbox, or `--sandbox off`).
    pub enforced: bool,
    /// Why it is not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `landlock+mount_namespace` or `landlock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<String>,
    /// Folders it may read, write, create in and execute from (real paths): the run's
    /// workspace (and the private tmp folder with Landlock alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_write: Vec<String>,
    /// Folders it may read and execute from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    /// Paths inside those folders it cannot see (the runner's state dir, system secrets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<String>,
    /// Its private tmp and HOME.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private: Option<PrivateTmp>,
    /// Every capability dropped and the securebits locked.
    pub capabilities_dropped: bool,
    /// `no_new_privs`.
    pub no_new_privs: bool,
    /// `open`: the device's network is not restricted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// How the session's processes are killed: `session_scan` (session id and environment
    /// marker; no cgroup on a device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_kill: Option<String>,
}

/// The device's sandbox (see the module docs).
#[derive(Debug)]
pub struct DeviceSandbox {
    allow_unsandboxed: bool,
    state: State,
    /// Why the private view is not used, when Landlock alone is.
    fallback: Option<String>,
    abi: i32,
    root: bool,
    state_dir: PathBuf,
    stage: PathBuf,
    shared_tmp: PathBuf,
    secrets: Vec<PathBuf>,
    system: Vec<(PathBuf, Option<PathBuf>)>,
    /// `--sandbox-read`: further folders sessions may read and execute from.
    extra_read: Vec<PathBuf>,
}

fn sandbox_error(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

impl DeviceSandbox {
    /// Probes this device and runs the self-tests. `state_dir` (the key, enrollment and
    /// journal) is never shown to sessions; the staging root of the private view is made
    /// in it.
    pub fn new(mode: SandboxMode, allow_unsandboxed: bool, state_dir: &Path, device_id: &str) -> DeviceSandbox {
        let state_dir = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let mut secrets = vec![state_dir.clone()];
        let (system_secrets, complete) = mira_sandbox::system_secrets();
        if !complete {
            tracing::warn!(
                limit = mira_sandbox::SCAN_LIMIT,
                "the system folders hold more entries than the sandbox looks at: restricted files past them are not covered"
            );
        }
        secrets.extend(system_secrets);
        let name: String =
            device_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' }).collect();
        let tmp_base = std::fs::canonicalize(std::env::temp_dir()).unwrap_or_else(|_| std::env::temp_dir());
        let mut sandbox = DeviceSandbox {
            allow_unsandboxed,
            state: State::Off,
            fallback: None,
            abi: mira_sandbox::landlock_abi(),
            root: mira_sandbox::is_root(),
            stage: state_dir.join("sandbox-root"),
            state_dir,
            shared_tmp: tmp_base.join(format!("mira-runner-{name}")),
            secrets,
            system: mira_sandbox::system_folders(),
            extra_read: Vec::new(),
        };
        sandbox.state = sandbox.probe(mode);
        match &sandbox.state {
            State::Enforced(kind) => tracing::info!(
                filesystem = kind.name(),
                landlock_abi = sandbox.abi,
                fallback = sandbox.fallback.as_deref().unwrap_or(""),
                "terminal sessions on this device are sandboxed"
            ),
            State::Unavailable(r) => {
                tracing::warn!(reason = %r, allow_unsandboxed, "terminal sessions on this device cannot be sandboxed")
            }
            State::Off => tracing::warn!(allow_unsandboxed, "the sandbox is off (--sandbox off)"),
        }
        sandbox
    }

    fn probe(&mut self, mode: SandboxMode) -> State {
        if mode == SandboxMode::Off {
            return State::Off;
        }
        if self.abi < 1 {
            return State::Unavailable(
                "Landlock is not available on this device's kernel (Linux ≥ 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= list)".into(),
            );
        }
        if mode == SandboxMode::Auto {
            let why = if !self.root && !mira_sandbox::user_namespaces_allowed() {
                "unprivileged user namespaces are disabled".to_owned()
            } else {
                match self.self_test(Kind::PrivateView) {
                    Ok(()) => return State::Enforced(Kind::PrivateView),
                    Err(e) => e,
                }
            };
            self.fallback = Some(format!("no private view ({why}); Landlock alone"));
        }
        if let Err(e) = self.ensure_shared_tmp() {
            return State::Unavailable(e);
        }
        match self.self_test(Kind::HostView) {
            Ok(()) => State::Enforced(Kind::HostView),
            Err(e) => State::Unavailable(format!("the sandbox self-test failed: {e}")),
        }
    }

    /// Creates this runner's tmp folder for Landlock alone (0700); one that exists must be a
    /// folder of this user's, not a link.
    fn ensure_shared_tmp(&self) -> Result<(), String> {
        let p = &self.shared_tmp;
        match std::fs::DirBuilder::new().mode(0o700).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("creating {}: {e}", p.display())),
        }
        let meta = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(format!("{} is not a private folder of this user's", p.display()));
        }
        std::fs::create_dir_all(p.join("home")).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// Runs `/bin/true` in a sandbox of `kind` with no workspace.
    fn self_test(&self, kind: Kind) -> Result<(), String> {
        let program =
            ["/bin/true", "/usr/bin/true"].into_iter().find(|p| Path::new(p).exists()).ok_or("no /bin/true to run")?;
        let spec = self.build(kind, None);
        let launch = self.launch_of(kind, &spec, Path::new("/"), false)?;
        let mut cmd = std::process::Command::new(program);
        cmd.env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        launch.install(&mut cmd);
        let spawned = cmd.spawn();
        drop(cmd);
        let (mut child, _) = launch.finish(spawned).map_err(|e| e.to_string())?;
        match child.wait() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("the sandboxed {program} ended with {s}")),
            Err(e) => Err(format!("waiting for the sandboxed {program}: {e}")),
        }
    }

    /// Lets sessions read and execute from `dirs` too (`--sandbox-read`: toolchains under
    /// the user's HOME, say). Each is bound where it was named (its real path when the
    /// name is not a plain absolute path); those that are not folders are left out. The
    /// state dir stays hidden inside them (refused with Landlock alone).
    #[must_use]
    pub fn with_read_only(mut self, dirs: &[PathBuf]) -> Self {
        for d in dirs {
            let Ok(real) = std::fs::canonicalize(d) else {
                tracing::warn!(folder = %d.display(), "--sandbox-read: no such folder; left out");
                continue;
            };
            let clean = d.is_absolute()
                && d.components().all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
            let shown = if clean { d.clone() } else { real.clone() };
            if real.is_dir() && !self.extra_read.contains(&shown) {
                self.extra_read.push(shown);
            }
        }
        self
    }

    /// Whether sessions are sandboxed here.
    pub fn enforced(&self) -> bool {
        matches!(self.state, State::Enforced(_))
    }

    fn unavailable_reason(&self) -> Option<String> {
        match &self.state {
            State::Enforced(_) => None,
            State::Unavailable(r) => Some(r.clone()),
            State::Off => Some("the runner's sandbox is off (--sandbox off)".into()),
        }
    }

    /// What the runner advertises about its sandbox.
    pub fn advertised(&self) -> AdvertisedSandbox {
        let (state, filesystem, reason) = match &self.state {
            State::Enforced(kind) => ("enforced", Some(kind.name().to_owned()), self.fallback.clone()),
            State::Unavailable(r) => ("unavailable", None, Some(r.clone())),
            State::Off => ("off", None, self.unavailable_reason()),
        };
        let sessions = if self.enforced() {
            "sandboxed"
        } else if self.allow_unsandboxed {
            "unsandboxed_allowed"
        } else {
            "refused"
        };
        AdvertisedSandbox { state: state.into(), filesystem, reason, sessions: sessions.into(), landlock_abi: self.abi }
    }

    /// The sandbox a session in `ws_root` gets. Errors: 403 `sandbox_unavailable` (this
    /// device cannot sandbox and the runner was not started with `--allow-unsandboxed`, or
    /// Landlock alone cannot hide the state dir, which lies inside the workspace).
    pub fn spec(&self, ws_root: &Path) -> Result<SessionSandbox, ToolError> {
        let kind = match &self.state {
            State::Enforced(kind) => *kind,
            _ => {
                let reason = self.unavailable_reason().unwrap_or_default();
                if !self.allow_unsandboxed {
                    return Err(sandbox_error(
                        ErrorCode::SandboxUnavailable,
                        format!(
                            "{reason}; terminal sessions on this device need the sandbox (its user may start the runner with --allow-unsandboxed)"
                        ),
                    ));
                }
                return Ok(SessionSandbox {
                    enforced: false,
                    reason: Some(reason),
                    filesystem: None,
                    read_write: Vec::new(),
                    read_only: Vec::new(),
                    hidden: Vec::new(),
                    private: None,
                    capabilities_dropped: false,
                    no_new_privs: false,
                    network: None,
                    tree_kill: None,
                });
            }
        };
        let spec = self.build(kind, Some(ws_root));
        if kind == Kind::HostView && !spec.hidden.is_empty() {
            return Err(sandbox_error(
                ErrorCode::SandboxUnavailable,
                format!(
                    "{} lies inside the folders a session may read ({}); Landlock alone cannot hide it (this device has no private view): move the runner's --state-dir out of its workspaces",
                    spec.hidden.join(", "),
                    ws_root.display()
                ),
            ));
        }
        Ok(spec)
    }

    fn build(&self, kind: Kind, ws_root: Option<&Path>) -> SessionSandbox {
        let mut read_write: Vec<PathBuf> = ws_root.map(Path::to_path_buf).into_iter().collect();
        if kind == Kind::HostView {
            read_write.push(self.shared_tmp.clone());
        }
        let read_only: Vec<PathBuf> = self
            .system
            .iter()
            .filter(|(_, link)| link.is_none())
            .map(|(p, _)| p.clone())
            .chain(self.extra_read.iter().filter(|_| ws_root.is_some()).cloned())
            .filter(|p| !read_write.iter().any(|w| within(p, w)))
            .collect();
        let roots: Vec<&Path> = read_write.iter().chain(&read_only).map(PathBuf::as_path).collect();
        let mut secrets = self.secrets.clone();
        if kind == Kind::HostView {
            // Only the state dir matters here: the system's secrets are the device owner's
            // files, unreadable by a non-root runner anyway.
            secrets.truncate(1);
        }
        let hidden = mira_sandbox::hidden_inside(&secrets, &roots);
        let private = match kind {
            Kind::PrivateView => {
                PrivateTmp { tmp: SANDBOX_TMP.into(), home: SANDBOX_HOME.into(), shared_by_runner_sessions: false }
            }
            Kind::HostView => PrivateTmp {
                tmp: self.shared_tmp.to_string_lossy().into_owned(),
                home: self.shared_tmp.join("home").to_string_lossy().into_owned(),
                shared_by_runner_sessions: true,
            },
        };
        let strings = |v: &[PathBuf]| v.iter().map(|p| p.to_string_lossy().into_owned()).collect::<Vec<_>>();
        SessionSandbox {
            enforced: true,
            reason: None,
            filesystem: Some(kind.name().into()),
            read_write: strings(&read_write),
            read_only: strings(&read_only),
            hidden,
            private: Some(private),
            capabilities_dropped: true,
            no_new_privs: true,
            network: Some("open".into()),
            tree_kill: Some("session_scan".into()),
        }
    }

    /// Whether `path` is visible (and at least readable) in a session of `spec`.
    pub fn visible_in(spec: &SessionSandbox, path: &Path) -> bool {
        let inside = |list: &[String]| list.iter().any(|r| within(path, Path::new(r)));
        (inside(&spec.read_only) || inside(&spec.read_write)) && !inside(&spec.hidden)
    }

    /// The environment a sandboxed session gets instead of the runner's: its HOME and
    /// TMPDIR (the runner's HOME holds its state), and only the PATH entries it can see.
    pub fn environment(spec: &SessionSandbox, env: &mut std::collections::BTreeMap<String, serde_json::Value>) {
        let Some(private) = spec.private.as_ref().filter(|_| spec.enforced) else { return };
        env.insert("HOME".into(), serde_json::json!(private.home));
        env.insert("TMPDIR".into(), serde_json::json!(private.tmp));
        if let Some(serde_json::Value::String(path)) = env.get("PATH") {
            let kept: Vec<&str> =
                path.split(':').filter(|d| d.starts_with('/') && Self::visible_in(spec, Path::new(d))).collect();
            env.insert("PATH".into(), serde_json::json!(kept.join(":")));
        }
    }

    /// The plan of a PTY session of `spec` in `cwd`; None when `spec` is not enforced.
    /// Errors: 422 `sandbox_failed` (the sandbox could not be prepared, or the device can
    /// no longer sandbox).
    pub fn launch(&self, spec: &SessionSandbox, cwd: &Path) -> Result<Option<Launch>, ToolError> {
        if !spec.enforced {
            return Ok(None);
        }
        let kind = match (&self.state, spec.filesystem.as_deref()) {
            (State::Enforced(kind), Some(f)) if kind.name() == f => *kind,
            _ => {
                return Err(sandbox_error(
                    ErrorCode::SandboxFailed,
                    "the approved session is sandboxed but this runner cannot sandbox it that way; nothing was started",
                ));
            }
        };
        self.launch_of(kind, spec, cwd, true)
            .map(Some)
            .map_err(|e| sandbox_error(ErrorCode::SandboxFailed, format!("preparing the sandbox: {e}")))
    }

    fn launch_of(&self, kind: Kind, spec: &SessionSandbox, cwd: &Path, pty_session: bool) -> Result<Launch, String> {
        let ruleset = mira_sandbox::fs_ruleset(self.abi, &spec.read_only, &spec.read_write)?;
        let (mounts, child_rules) = match kind {
            Kind::PrivateView => {
                let ops = mira_sandbox::mount_ops(&View {
                    stage: &self.stage,
                    system: &self.system,
                    read_only: &spec.read_only,
                    read_write: &spec.read_write,
                    pinned: &[],
                    hidden: &spec.hidden,
                    extra_hidden: &[],
                    tmp_bytes: TMP_BYTES,
                })?;
                std::fs::create_dir_all(&self.stage).map_err(|e| format!("{}: {e}", self.stage.display()))?;
                let mounts = MountPlan {
                    userns: (!self.root).then(mira_sandbox::own_user_maps),
                    new_net: false,
                    // (A device's sessions keep the host's PID and IPC namespaces for now.)
                    new_pid: false,
                    pid_helper: None,
                    new_ipc: false,
                    stage: cstr(&self.stage)?,
                    root_data: cstr(mira_sandbox::ROOT_DATA)?,
                    ops,
                };
                (Some(mounts), mira_sandbox::view_child_rules(self.abi)?)
            }
            Kind::HostView => (None, mira_sandbox::host_view_child_rules(self.abi)?),
        };
        Launch::new(PlanParts {
            pty_session,
            cgroup_procs: Vec::new(),
            mounts,
            cwd: cstr(cwd)?,
            ruleset,
            child_rules,
            net_ruleset: None,
            pinned: Vec::new(),
        })
    }

    /// The state dir sessions never see.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// The tool error of a failed sandboxed spawn: `sandbox_failed` naming the step, or
/// `spawn_failed`.
pub fn failure_error(f: &Failure) -> ToolError {
    match f {
        Failure::Step(..) => ToolError::new(ErrorCode::SandboxFailed, f.to_string()),
        Failure::Spawn(_) => ToolError::new(ErrorCode::SpawnFailed, f.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::process::Stdio;

    use super::*;

    /// Runs `sh -c script` in `cwd` under `spec` (no PTY); (success, stdout + stderr).
    fn run(sandbox: &DeviceSandbox, spec: &SessionSandbox, cwd: &Path, script: &str) -> (bool, String) {
        let kind = if spec.filesystem.as_deref() == Some("landlock") { Kind::HostView } else { Kind::PrivateView };
        let launch = sandbox.launch_of(kind, spec, cwd, false).unwrap();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", script]).env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        launch.install(&mut cmd);
        let spawned = cmd.spawn();
        drop(cmd);
        let (child, _) = launch.finish(spawned).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// A state dir inside the workspace: the private view covers it (the key cannot be read,
    /// the workspace around it is written); Landlock alone cannot, so sessions are refused.
    #[test]
    fn a_state_dir_inside_the_workspace_is_hidden_or_refused() {
        if mira_sandbox::landlock_abi() < 1 {
            eprintln!("no Landlock on this kernel: the device sandbox is unavailable here");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(root.path()).unwrap().join("ws");
        let state = ws.join(".mira-runner");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("device.key"), "k3y-c0ntent-8841\n").unwrap();
        let device = format!("dev_test{}", std::process::id());

        let tools = std::fs::canonicalize(root.path()).unwrap().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(tools.join("tool.sh"), "echo tool-$((20+1))\n").unwrap();
        let auto = DeviceSandbox::new(SandboxMode::Auto, false, &state, &device)
            .with_read_only(&[tools.join("."), ws.join("..")]);
        // `--sandbox-read`: a folder outside the workspace, by its real path.
        assert!(auto.extra_read.contains(&tools), "{:?}", auto.extra_read);
        assert!(auto.enforced(), "{:?}", auto.advertised());
        let spec = auto.spec(&ws);
        if auto.advertised().filesystem.as_deref() == Some("landlock+mount_namespace") {
            let spec = spec.unwrap();
            assert!(spec.hidden.contains(&state.to_string_lossy().into_owned()), "{spec:?}");
            let key = state.join("device.key");
            let script = format!(
                "cat '{}'; ls -a '{}'; echo ok > '{}/written' && echo WROTE; sh '{}/tool.sh'; echo x > '{3}/evil' || echo RO",
                key.display(),
                state.display(),
                ws.display(),
                tools.display()
            );
            let (_, text) = run(&auto, &spec, &ws, &script);
            assert!(!text.contains("k3y-c0ntent") && text.contains("WROTE"), "{text}");
            assert!(text.contains("tool-21") && text.contains("RO"), "{text}");
            assert!(!tools.join("evil").exists());
            assert!(!text.contains("device.key\n"), "the state dir is listed: {text}");
            assert_eq!(std::fs::read_to_string(ws.join("written")).unwrap(), "ok\n");
        } else {
            assert_eq!(spec.unwrap_err().code, ErrorCode::SandboxUnavailable);
        }

        let landlock = DeviceSandbox::new(SandboxMode::Landlock, false, &state, &device);
        assert_eq!(landlock.advertised().filesystem.as_deref(), Some("landlock"));
        let e = landlock.spec(&ws).unwrap_err();
        assert_eq!(e.code, ErrorCode::SandboxUnavailable, "{e:?}");
        assert!(e.message.contains("--state-dir"), "{}", e.message);
        // With the state dir elsewhere it is enforced, and the state dir is out of reach.
        let other = std::fs::canonicalize(root.path()).unwrap().join("state");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("device.key"), "k3y-c0ntent-8841\n").unwrap();
        let landlock = DeviceSandbox::new(SandboxMode::Landlock, false, &other, &device);
        let spec = landlock.spec(&ws).unwrap();
        let script = format!("cat '{0}/device.key'; echo x > '{0}/evil' || echo DENIED", other.display());
        let (_, text) = run(&landlock, &spec, &ws, &script);
        assert!(!text.contains("k3y-c0ntent") && text.contains("DENIED"), "{text}");
        assert!(!other.join("evil").exists());
        let _ = std::fs::remove_dir_all(&landlock.shared_tmp);

        // Off: refused, unless unsandboxed sessions are allowed.
        let off = DeviceSandbox::new(SandboxMode::Off, false, &other, &device);
        assert_eq!(off.spec(&ws).unwrap_err().code, ErrorCode::SandboxUnavailable);
        let allowed = DeviceSandbox::new(SandboxMode::Off, true, &other, &device);
        let spec = allowed.spec(&ws).unwrap();
        assert!(!spec.enforced && allowed.launch(&spec, &ws).unwrap().is_none());
        assert_eq!(allowed.advertised().sessions, "unsandboxed_allowed");
    }
}
