//! What a PTY session needs on any machine — the host's `terminal_session` and a device's
//! runner alike: the environment a session inherits, the kill of every process it started,
//! and the display of its command line. (Its process-session setup in the child is
//! `mira_sandbox::child::pty_session`, part of every sandbox plan.)

/// Environment every session gets unless the call sets the variable itself: output is
/// never held by a pager and nothing waits for an editor.
pub const DEFAULT_ENV: [(&str, &str); 6] = [
    ("TERM", "xterm-256color"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("EDITOR", "true"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// Set to the session id in every session's environment: it marks the session's processes,
/// including any that leave its process session with `setsid`, so that ending the session
/// finds them too.
pub const SESSION_ENV: &str = "MIRA_TERMINAL_SESSION";

/// Variables of the server's own environment a session inherits (when set); everything
/// else — database URLs, API keys — stays out.
pub const INHERITED_ENV: [&str; 10] =
    ["HOME", "USER", "LOGNAME", "PATH", "LANG", "LC_ALL", "LC_CTYPE", "SHELL", "TZ", "TMPDIR"];

/// Sends SIGKILL to every process of terminal session `id` whose leader was `sid`: the
/// leader's process group, every process whose session id is `sid`, and every process whose
/// environment carries `MIRA_TERMINAL_SESSION=<id>` (those that left with `setsid`) —
/// twice, so that a process forked meanwhile does not survive. A process that both leaves
/// the session and clears its environment escapes this scan; the session's cgroup
/// (the host's `Session::kill_tree`) catches it where the host has one.
///
/// `sid` must be a leader not yet reaped, or reaped just now: the kernel reuses pids, so a
/// leader reaped a while ago may name another process (group, session) — pass `0` then,
/// which leaves the environment marker alone to find what the session left.
pub fn kill_session(sid: i32, id: &str) {
    for _ in 0..2 {
        if sid > 1 {
            // SAFETY: sending a signal has no memory effects; errors (ESRCH) are ignored.
            unsafe {
                libc::killpg(sid, libc::SIGKILL);
            }
        }
        for pid in session_members(sid, id) {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Pids of session `id` (leader `sid`): session id `sid` (field 6 of `/proc/<pid>/stat`,
/// proc(5)) or `MIRA_TERMINAL_SESSION=<id>` in `/proc/<pid>/environ`. Never this process.
pub fn session_members(sid: i32, id: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let marker = format!("{SESSION_ENV}={id}");
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me && *pid > 1)
        .filter(|pid| {
            (sid > 1 && stat_session(*pid) == Some(sid))
                || (!id.is_empty()
                    && stat_fields(*pid).is_some()
                    && std::fs::read(format!("/proc/{pid}/environ"))
                        .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == marker.as_bytes())))
        })
        .collect()
}

/// Fields 3… of `/proc/<pid>/stat` (proc(5)) of a live (not zombie) process.
pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields follow the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<String> = rest.split(' ').map(str::to_owned).collect();
    if matches!(fields.first().map(String::as_str), Some("Z" | "X") | None) {
        return None;
    }
    Some(fields)
}

/// The session id of `pid` (field 6), if it exists and is not a zombie.
fn stat_session(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

/// `command args…` quoted for display as a POSIX shell would need it.
pub fn shell_words(command: &str, args: &[String]) -> String {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .map(|w| {
            if !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)) {
                w.to_owned()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
