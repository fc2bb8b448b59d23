//! The PTY host: live terminal sessions of this server process.
//!
//! Each session is a PTY (portable-pty) whose child runs as the leader of its own session
//! (`setsid`), so that everything it starts — background jobs with their own process
//! groups included — shares its session id, and ending the session kills all of them
//! (found through `/proc/<pid>/stat`). Three workers per session:
//! - a reader thread copies PTY output into the bounded [`Ring`] and wakes viewers; when
//!   the ring is full of bytes not yet stored it waits for the flusher, so the program
//!   blocks on its next write instead of output being dropped (back-pressure);
//! - a waiter thread reaps the leader (no zombies), kills what it left behind (no
//!   orphans), and publishes the exit;
//! - a flusher task copies every byte into the store in chunks (woken when a quarter of
//!   the ring is waiting, or every 250 ms), drops chunks past the retention cap, and
//!   records the end. Output therefore leaves memory only once it is stored: the store
//!   holds the newest `retain_bytes` (at least) of every session without holes, and older
//!   output is gone as a whole prefix (`retained_from`).
//!
//! A reaper ends sessions idle for longer than the configured time; stopping the server
//! kills every session and records it `lost`, as does the next start for sessions a
//! previous process left `running`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use portable_pty::{MasterPty, PtySize, native_pty_system};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::output::Ring;
use crate::error::ErrorCode;
use crate::registry::ToolError;
use crate::sandbox::cgroup::SessionCgroup;
use crate::sandbox::{Sandbox, SandboxSpec};
use crate::state::TerminalSessionState;
use crate::store::{SessionEnd, SessionLaunch, SessionOrigin, Store, TerminalSessionRow};
use mira_tools::pty::stat_fields;
pub use mira_tools::pty::{INHERITED_ENV, SESSION_ENV, kill_session, session_members, shell_words};

/// Limits of the PTY host.
#[derive(Debug, Clone, clap::Args)]
pub struct TerminalConfig {
    /// Live terminal sessions one user may have at once.
    #[arg(long = "terminal-max-sessions", env = "MIRA_TERMINAL_MAX_SESSIONS", default_value_t = 8)]
    pub max_sessions_per_user: usize,
    /// Seconds without output or action after which a session is reaped.
    #[arg(long = "terminal-idle-secs", env = "MIRA_TERMINAL_IDLE_SECS", default_value_t = 1800)]
    pub idle_secs: u64,
    /// Bytes of each session's newest output kept in memory for viewers.
    #[arg(long = "terminal-ring-bytes", env = "MIRA_TERMINAL_RING_BYTES", default_value_t = 1024 * 1024)]
    pub ring_bytes: usize,
    /// Bytes of each session's newest output kept in the store (the retention cap).
    #[arg(long = "terminal-retain-bytes", env = "MIRA_TERMINAL_RETAIN_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub retain_bytes: u64,
}

impl Default for TerminalConfig {
    fn default() -> Self {
        Self { max_sessions_per_user: 8, idle_secs: 1800, ring_bytes: 1024 * 1024, retain_bytes: 8 * 1024 * 1024 }
    }
}

/// How a session ended, as viewers see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExitInfo {
    /// `exited|killed|timed_out|reaped|lost`.
    pub state: TerminalSessionState,
    /// Why, in words.
    pub end_reason: Option<String>,
    /// Exit code, when the leader exited.
    pub exit_code: Option<i64>,
    /// Signal name, when a signal ended it.
    pub signal: Option<String>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// Owner.
    pub owner_id: String,
    /// Run.
    pub run_id: String,
    /// The `start` invocation.
    pub invocation_id: String,
    /// Program (absolute path).
    pub program: String,
    /// The command as given (for display).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Real absolute cwd.
    pub cwd: String,
    /// The process's whole environment (sorted; `null` = left unset). Nothing else of the
    /// server's environment reaches the session.
    pub env: serde_json::Map<String, Value>,
    /// Life limit in ms.
    pub timeout_ms: u64,
    /// PTY size.
    pub cols: u16,
    /// PTY size.
    pub rows: u16,
    /// The frozen sandbox (see [`crate::sandbox`]).
    pub sandbox: SandboxSpec,
    /// Further paths to cover inside the sandbox's folders (other users' workspaces).
    pub hidden: Vec<std::path::PathBuf>,
    /// The run's workspace root as the run holds it open (its real path, a descriptor of
    /// it): the sandbox binds it, and builds its Landlock rule, from this descriptor, never
    /// by its path again. None: every read-write folder is opened by its path at spawn.
    pub pinned_root: Option<Arc<(String, std::os::fd::OwnedFd)>>,
}

/// A live session.
pub struct Session {
    /// `term_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// Leader pid (= session id and process group of the leader).
    pub pid: i32,
    /// Real cwd at start.
    pub cwd: String,
    /// The command line, for display.
    pub command_line: String,
    ring: Mutex<Ring>,
    bytes: watch::Sender<u64>,
    exit: watch::Sender<Option<ExitInfo>>,
    writer: Mutex<Box<dyn Write + Send>>,
    master: Mutex<Box<dyn MasterPty + Send>>,
    last_activity: Mutex<Instant>,
    end_request: Mutex<Option<(TerminalSessionState, String)>>,
    /// Signalled when bytes of the ring are stored (room for the waiting reader).
    room: Condvar,
    /// Wakes the flusher early (the ring is filling up, or the reader is waiting).
    flush_wake: tokio::sync::Notify,
    /// Set when the reader thread has ended (EOF/EIO on the PTY).
    reader_done: AtomicBool,
    /// The session's cgroup, when the sandbox made one.
    cgroup: Option<SessionCgroup>,
}

impl Session {
    /// Reads the ring under its lock.
    pub fn with_ring<T>(&self, f: impl FnOnce(&Ring) -> T) -> T {
        f(&self.ring.lock())
    }

    /// The PTY size now, `(rows, cols)`.
    pub fn size(&self) -> (u16, u16) {
        self.master.lock().get_size().map_or((32, 120), |s| (s.rows, s.cols))
    }

    /// Copies PTY output into the ring until EOF/EIO. When the ring is full of bytes the
    /// store does not have yet, waits for the flusher (the PTY then fills up and the
    /// program's writes block): output leaves memory only once it is stored.
    fn pump_output(&self, mut reader: Box<dyn Read + Send>) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let (end, wake) = {
                    let mut ring = self.ring.lock();
                    let mut took = ring.push(rest);
                    while took == 0 {
                        self.flush_wake.notify_one();
                        self.room.wait(&mut ring);
                        took = ring.push(rest);
                    }
                    rest = &rest[took..];
                    (ring.end(), ring.unstored() >= (ring.capacity() / 4) as u64)
                };
                if wake {
                    self.flush_wake.notify_one();
                }
                *self.last_activity.lock() = Instant::now();
                self.bytes.send_replace(end);
            }
        }
        self.reader_done.store(true, Ordering::Release);
        self.flush_wake.notify_one();
    }

    /// Bytes of output so far, and a receiver woken when more arrive.
    pub fn bytes(&self) -> watch::Receiver<u64> {
        self.bytes.subscribe()
    }

    /// The exit, once published, and a receiver woken when it is.
    pub fn exit(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.subscribe()
    }

    /// Whether the session has ended.
    pub fn ended(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Marks activity (an action), which postpones idle reaping.
    pub fn touch(&self) {
        *self.last_activity.lock() = Instant::now();
    }

    /// How the session ended, once it has.
    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.exit.borrow().clone()
    }

    /// Writes bytes to the PTY, off the async workers (a program that does not read its
    /// input makes the write block once the terminal's buffer is full). Gives up after
    /// [`INPUT_WRITE_LIMIT`] with `pty_input_blocked`.
    pub async fn write_input(self: &Arc<Self>, data: Vec<u8>) -> Result<(), ToolError> {
        self.touch();
        let s = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut w = s.writer.lock();
            w.write_all(&data).and_then(|()| w.flush())
        });
        match tokio::time::timeout(INPUT_WRITE_LIMIT, job).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(failed(ErrorCode::PtyWriteFailed, format!("writing to the PTY: {e}"))),
            Ok(Err(e)) => Err(failed(ErrorCode::PtyWriteFailed, format!("writing to the PTY: {e}"))),
            Err(_) => Err(failed(
                ErrorCode::PtyInputBlocked,
                format!(
                    "the program has not read its input for {} s (the terminal's input buffer is full); interrupt or kill it",
                    INPUT_WRITE_LIMIT.as_secs()
                ),
            )),
        }
    }

    /// Changes the PTY size (the foreground program gets SIGWINCH).
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ToolError> {
        self.touch();
        self.master
            .lock()
            .resize(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 })
            .map_err(|e| failed(ErrorCode::PtyResizeFailed, format!("resizing the PTY: {e}")))
    }

    /// Sends `sig` to the PTY's foreground process group (the leader's group when the
    /// terminal reports none).
    pub fn signal_foreground(&self, sig: i32) {
        self.touch();
        let pgid = self.master.lock().process_group_leader().filter(|p| *p > 0).unwrap_or(self.pid);
        // SAFETY: killpg only sends a signal; a stale group id yields ESRCH, which is ignored.
        unsafe {
            libc::killpg(pgid, sig);
        }
    }

    /// Ends the session: records why, then kills every process of its session.
    pub fn end(&self, state: TerminalSessionState, reason: String) {
        {
            let mut req = self.end_request.lock();
            if req.is_none() {
                *req = Some((state, reason));
            }
        }
        self.kill_tree();
    }

    /// Kills every process of the session: its cgroup (when it has one) and the session
    /// scan of [`kill_session`] — by the leader's pid only until its end is published (the
    /// waiter reaps the leader and calls this first): after that the pid may name another
    /// process, and only the environment marker finds what the session left.
    pub fn kill_tree(&self) {
        if let Some(g) = &self.cgroup {
            g.kill();
        }
        kill_session(if self.ended() { 0 } else { self.pid }, &self.id);
    }
}

/// Longest a write to a PTY may block before the action fails.
pub const INPUT_WRITE_LIMIT: Duration = Duration::from_secs(5);

fn failed(code: ErrorCode, message: String) -> ToolError {
    ToolError::new(code, message)
}

/// `<boot id>:<start time of pid in clock ticks>` (field 22): names one process across
/// pid reuse, for recovery after a restart.
fn process_stamp(pid: i32) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let start = stat_fields(pid)?.get(19)?.clone();
    Some(format!("{}:{start}", boot.trim()))
}

/// The live sessions of this server process.
pub struct TerminalHost {
    store: Store,
    node_id: String,
    config: TerminalConfig,
    sandbox: Arc<Sandbox>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Starts in progress per owner (they count against the limit).
    starting: Mutex<HashMap<String, usize>>,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl TerminalHost {
    /// A host for this node (`node_id` is the data directory's stable node id) whose
    /// sessions end with `shutdown`.
    pub fn new(
        store: Store,
        node_id: String,
        config: TerminalConfig,
        sandbox: Arc<Sandbox>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let host = Arc::new(Self {
            store,
            node_id,
            config,
            sandbox,
            sessions: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            shutdown,
            tasks: tokio_util::task::TaskTracker::new(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&host);
            let shutdown = host.shutdown.clone();
            let every = Duration::from_secs((host.config.idle_secs / 2).clamp(1, 5));
            rt.spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let Some(host) = weak.upgrade() else { break };
                    host.reap_idle();
                }
                if let Some(host) = weak.upgrade() {
                    host.kill_all();
                }
            });
        }
        host
    }

    /// The store sessions are recorded in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The sandbox sessions run in.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// Marks sessions a previous process of this node left `running` as `lost`, and kills
    /// any of their processes that survived it. Returns how many there were.
    pub async fn recover(&self) -> Result<usize, crate::store::StoreError> {
        let lost = self.store.lose_terminal_sessions(&self.node_id).await?;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let boot = boot.trim();
        for (id, pid, stamp) in &lost {
            let pid = i32::try_from(*pid).unwrap_or(0);
            // The leader's pid counts only if it is still the very process that was started
            // (same boot, same start time), or is gone (its group and session id then name
            // only its leftovers); the environment marker finds the rest either way.
            let same = stamp.as_deref().is_some_and(|s| !boot.is_empty() && s.starts_with(boot));
            let leader = if same && (stat_fields(pid).is_none() || process_stamp(pid) == *stamp) { pid } else { 0 };
            kill_session(leader, id);
            self.sandbox.kill_leftover_cgroup(id);
        }
        Ok(lost.len())
    }

    /// The stable node id of this host's replica (the `node_id` of the sessions it starts).
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// A live session of `owner_id`.
    pub fn get(&self, owner_id: &str, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(id).filter(|s| s.owner_id == owner_id).cloned()
    }

    fn reap_idle(&self) {
        let idle = Duration::from_secs(self.config.idle_secs);
        let stale: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .values()
            .filter(|s| !s.ended() && s.last_activity.lock().elapsed() >= idle)
            .cloned()
            .collect();
        for s in stale {
            s.end(TerminalSessionState::Reaped, format!("no output and no action for {} s", self.config.idle_secs));
        }
    }

    /// Kills every live session (server stop); their rows become `lost`.
    pub fn kill_all(&self) {
        let all: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        for s in all {
            s.end(TerminalSessionState::Lost, "the server stopped; its processes were killed with it".to_owned());
        }
    }

    /// Waits (up to `limit`) for every session's end to be recorded in the store.
    pub async fn stopped(&self, limit: Duration) {
        self.kill_all();
        self.tasks.close();
        let _ = tokio::time::timeout(limit, self.tasks.wait()).await;
    }

    /// Starts a session: opens a PTY, spawns the program as a session leader in it, records
    /// the session and starts its workers. The work runs as its own task, so that a cancelled
    /// invocation cannot leave a spawned process half-registered; starts in progress count
    /// against the per-user limit.
    ///
    /// Until `done` resolves with a value, the session belongs to its `start` invocation:
    /// `cancel` firing, or `done`'s sender being dropped (the execution was abandoned),
    /// ends it.
    pub async fn start(
        self: &Arc<Self>,
        spec: StartSpec,
        cancel: CancellationToken,
        done: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<Arc<Session>, ToolError> {
        if self.shutdown.is_cancelled() {
            return Err(ToolError::new(ErrorCode::ServerStopping, "the server is stopping"));
        }
        let owner = spec.owner_id.clone();
        {
            let sessions = self.sessions.lock();
            let mut starting = self.starting.lock();
            let live = sessions.values().filter(|s| s.owner_id == owner && !s.ended()).count();
            if live + starting.get(&owner).copied().unwrap_or(0) >= self.config.max_sessions_per_user {
                return Err(ToolError::new(
                    ErrorCode::TerminalSessionLimit,
                    format!(
                        "you already have {} live terminal sessions (the limit); kill one first",
                        self.config.max_sessions_per_user
                    ),
                ));
            }
            *starting.entry(owner.clone()).or_default() += 1;
        }
        let host = self.clone();
        let started = tokio::spawn(async move {
            let session = host.spawn_session(spec).await?;
            let s = session.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => s.end(TerminalSessionState::Killed, "its start invocation was cancelled".into()),
                    r = done => if r.is_err() { s.end(TerminalSessionState::Killed, "its start invocation was abandoned".into()) },
                }
            });
            Ok(session)
        })
        .await;
        {
            let mut starting = self.starting.lock();
            if let Some(n) = starting.get_mut(&owner) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    starting.remove(&owner);
                }
            }
        }
        started.map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting the session: {e}")))?
    }

    async fn spawn_session(self: Arc<Self>, spec: StartSpec) -> Result<Arc<Session>, ToolError> {
        let id = crate::ids::new_id("term");
        let pair = native_pty_system()
            .openpty(PtySize { rows: spec.rows, cols: spec.cols, pixel_width: 0, pixel_height: 0 })
            .map_err(|e| failed(ErrorCode::PtyOpenFailed, format!("opening a PTY: {e}")))?;
        let (mut child, cgroup) = self.spawn_child(&spec, &id, pair.master.tty_name())?;
        drop(pair.slave);
        let pid = i32::try_from(child.id()).unwrap_or(0);
        let reader = pair.master.try_clone_reader().map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()));
        let writer = pair.master.take_writer().map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()));
        let (reader, writer) = match (reader, writer) {
            (Ok(r), Ok(w)) => (r, w),
            (Err(e), _) | (_, Err(e)) => {
                kill_session(pid, &id);
                let _ = child.wait();
                return Err(e);
            }
        };
        let command_line = shell_words(&spec.command, &spec.args);
        let session = Arc::new(Session {
            id: id.clone(),
            owner_id: spec.owner_id.clone(),
            pid,
            cwd: spec.cwd.clone(),
            command_line,
            ring: Mutex::new(Ring::new(self.config.ring_bytes)),
            bytes: watch::Sender::new(0),
            exit: watch::Sender::new(None),
            writer: Mutex::new(writer),
            master: Mutex::new(pair.master),
            last_activity: Mutex::new(Instant::now()),
            end_request: Mutex::new(None),
            room: Condvar::new(),
            flush_wake: tokio::sync::Notify::new(),
            reader_done: AtomicBool::new(false),
            cgroup,
        });
        let origin = SessionOrigin {
            owner_id: spec.owner_id.clone(),
            run_id: spec.run_id.clone(),
            invocation_id: spec.invocation_id.clone(),
        };
        let launch = SessionLaunch {
            command: spec.command.clone(),
            args: spec.args.clone(),
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
            cols: spec.cols,
            rows: spec.rows,
            timeout_ms: spec.timeout_ms,
        };
        let row = TerminalSessionRow {
            pid: Some(i64::from(pid)),
            pid_start: process_stamp(pid),
            ..TerminalSessionRow::new_running(id.clone(), self.node_id.clone(), origin, launch)
        };
        if let Err(e) = self.store.insert_terminal_session(&row).await {
            kill_session(pid, &id);
            let _ = child.wait();
            return Err(ToolError::new(ErrorCode::StoreError, e.to_string()));
        }
        self.sessions.lock().insert(id.clone(), session.clone());

        // Reader: PTY → ring. Ends at EOF/EIO, when every holder of the slave side is gone.
        let (read_done_tx, read_done_rx) = std::sync::mpsc::channel::<()>();
        let s = session.clone();
        std::thread::Builder::new()
            .name(format!("pty-read-{pid}"))
            .spawn(move || {
                s.pump_output(reader);
                let _ = read_done_tx.send(());
            })
            .map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting the PTY reader: {e}")))?;

        // Waiter: reaps the leader, kills what it left behind, publishes the exit once the
        // reader has drained the PTY (bounded, in case an escaped process keeps it open).
        let s = session.clone();
        std::thread::Builder::new()
            .name(format!("pty-wait-{pid}"))
            .spawn(move || {
                let status = child.wait().map(portable_pty::ExitStatus::from);
                s.kill_tree();
                let _ = read_done_rx.recv_timeout(Duration::from_secs(2));
                let requested = s.end_request.lock().clone();
                let (code, signal) = match &status {
                    Ok(st) => match st.signal() {
                        Some(sig) => (None, Some(sig.to_owned())),
                        None => (Some(i64::from(st.exit_code())), None),
                    },
                    Err(_) => (None, None),
                };
                let info = match requested {
                    Some((state, reason)) => ExitInfo { state, end_reason: Some(reason), exit_code: code, signal },
                    None => ExitInfo {
                        state: TerminalSessionState::Exited,
                        end_reason: status.as_ref().err().map(|e| format!("waiting for the process failed: {e}")),
                        exit_code: code,
                        signal,
                    },
                };
                s.exit.send_replace(Some(info));
                if let Some(g) = &s.cgroup {
                    g.remove(Duration::from_secs(5));
                }
            })
            .map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting the PTY waiter: {e}")))?;

        // Life limit.
        let s = session.clone();
        let mut exit = session.exit();
        let life = Duration::from_millis(spec.timeout_ms);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(life) => s.end(TerminalSessionState::TimedOut, format!("the session's life limit of {} ms passed", life.as_millis())),
                _ = exit.wait_for(Option::is_some) => {}
                () = shutdown.cancelled() => {}
            }
        });

        // Flusher: ring → store, then the end.
        let host = self.clone();
        let s = session.clone();
        self.tasks.spawn(async move { host.flush_loop(s).await });
        Ok(session)
    }

    /// Spawns the program on the PTY slave `tty`: as leader of its own session with the PTY
    /// as controlling terminal, in the frozen sandbox (with its cgroup) when it is enforced.
    fn spawn_child(
        &self,
        spec: &StartSpec,
        id: &str,
        tty: Option<std::path::PathBuf>,
    ) -> Result<(std::process::Child, Option<SessionCgroup>), ToolError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::process::CommandExt;
        let tty = tty.ok_or_else(|| failed(ErrorCode::PtyOpenFailed, "the PTY has no name".into()))?;
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&tty)
            .map_err(|e| failed(ErrorCode::PtyOpenFailed, format!("opening {}: {e}", tty.display())))?;
        let stdio = |f: &std::fs::File| -> Result<std::process::Stdio, ToolError> {
            f.try_clone().map(std::process::Stdio::from).map_err(|e| failed(ErrorCode::PtyOpenFailed, e.to_string()))
        };
        let mut cmd = std::process::Command::new(&spec.program);
        cmd.args(&spec.args).env_clear();
        for (k, v) in &spec.env {
            if let Some(v) = v.as_str() {
                cmd.env(k, v);
            }
        }
        cmd.env(SESSION_ENV, id).stdin(stdio(&slave)?).stdout(stdio(&slave)?).stderr(stdio(&slave)?);
        let pinned = match &spec.pinned_root {
            Some(root) => {
                let fd = root
                    .1
                    .try_clone()
                    .map_err(|e| failed(ErrorCode::SandboxFailed, format!("holding the workspace open: {e}")))?;
                vec![(root.0.clone(), fd)]
            }
            None => Vec::new(),
        };
        let prepared = self.sandbox.prepare(
            &spec.sandbox,
            std::path::Path::new(&spec.cwd),
            Some(id),
            &spec.hidden,
            true,
            pinned,
        )?;
        match &prepared {
            Some(p) => p.install(&mut cmd),
            None => {
                cmd.current_dir(&spec.cwd);
                // SAFETY: `pty_session` only makes async-signal-safe system calls.
                unsafe {
                    cmd.pre_exec(|| crate::sandbox::child::pty_session());
                }
            }
        }
        let spawned = cmd.spawn();
        drop(cmd);
        drop(slave);
        match prepared {
            Some(p) => p.finish(spawned).map(|(child, cgroup, _)| (child, cgroup)),
            None => spawned
                .map(|c| (c, None))
                .map_err(|e| failed(ErrorCode::SpawnFailed, format!("starting {}: {e}", spec.program))),
        }
    }

    async fn flush_loop(self: Arc<Self>, s: Arc<Session>) {
        let mut exit = s.exit();
        let mut ended_at: Option<Instant> = None;
        loop {
            let ended = exit.borrow().is_some();
            if ended && ended_at.is_none() {
                ended_at = Some(Instant::now());
            }
            if let Err(e) = self.flush(&s).await {
                tracing::warn!(session = %s.id, error = %e, "storing terminal output failed");
            }
            if let Some(at) = ended_at {
                // After the exit: until the reader has drained the PTY and all is stored.
                let drained = s.reader_done.load(Ordering::Acquire) && s.with_ring(Ring::unstored) == 0;
                if drained || at.elapsed() >= FINAL_FLUSH_LIMIT {
                    break;
                }
            }
            let pause = if ended { Duration::from_millis(20) } else { FLUSH_EVERY };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = s.flush_wake.notified() => {}
                _ = exit.changed(), if !ended => {}
            }
        }
        // From here on nothing is stored: a reader still held by a process that escaped the
        // kill no longer waits (what it reads is counted in `bytes_out`, never stored).
        s.ring.lock().spill();
        s.room.notify_all();
        let info = exit.borrow().clone().unwrap_or(ExitInfo {
            state: TerminalSessionState::Lost,
            end_reason: None,
            exit_code: None,
            signal: None,
        });
        let end =
            SessionEnd { state: info.state, reason: info.end_reason, exit_code: info.exit_code, signal: info.signal };
        let total = s.with_ring(Ring::end);
        if let Err(e) = self.store.end_terminal_session(&s.id, &end, total).await {
            tracing::warn!(session = %s.id, error = %e, "recording the end of a terminal session failed");
        }
        self.sessions.lock().remove(&s.id);
    }

    /// Stores the output not yet stored, in chunks of at most [`FLUSH_CHUNK`] bytes, and
    /// lets the stored bytes leave the ring. One pass stores what was there when it began.
    /// Bytes older than the retention cap at that moment are not written at all (they would
    /// be deleted in the same transaction).
    async fn flush(&self, s: &Session) -> Result<(), crate::store::StoreError> {
        let limit = s.with_ring(Ring::end);
        loop {
            let (start, data, end) = s.with_ring(|r| {
                let from = r.stored().max(r.start()).max(r.end().saturating_sub(self.config.retain_bytes));
                let max = usize::try_from(limit.saturating_sub(from)).unwrap_or(FLUSH_CHUNK).min(FLUSH_CHUNK);
                (from, r.read(from, max).unwrap_or_default(), r.end())
            });
            if data.is_empty() {
                if start > s.with_ring(Ring::stored) {
                    s.ring.lock().mark_stored(start);
                    s.room.notify_all();
                }
                return Ok(());
            }
            let next = start + data.len() as u64;
            let retain_from = end.saturating_sub(self.config.retain_bytes);
            self.store.append_terminal_chunk(&s.id, start, &data, next, retain_from).await?;
            s.ring.lock().mark_stored(next);
            s.room.notify_all();
        }
    }
}

/// Largest chunk of output stored in one row, in bytes.
pub const FLUSH_CHUNK: usize = 256 * 1024;

/// How often output is stored when less than a quarter of the ring is waiting.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// How long after the exit the flusher keeps storing what the reader still drains before
/// it gives up (a process that escaped the kill can hold the PTY open).
pub const FINAL_FLUSH_LIMIT: Duration = Duration::from_secs(10);
