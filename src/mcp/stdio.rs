//! The stdio transport's process side: spawning a server, keeping its stderr tail, and a
//! guard on its stdout that the JSON-RPC layer reads through.
//!
//! The guard reads stdout line by line with a bounded buffer (a single line of hundreds of
//! MB never sits in memory: past `max_line` bytes the rest of the line is skipped), replaces
//! invalid UTF-8 with U+FFFD and remembers the JSON-RPC id of every response it had to
//! repair, and turns an oversized response into a JSON-RPC error for its id (when the id
//! is in the line's first 4 KiB), so the waiting call fails at once with a clear message
//! instead of timing out. Clean lines pass through unchanged.

use std::collections::{HashSet, VecDeque};
use std::process::Stdio;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::process::{Child, ChildStdin, Command};

/// Bytes of stderr kept per server.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// Bytes at the head of an oversized line searched for its JSON-RPC id.
const ID_SCAN_BYTES: usize = 4096;
/// JSON-RPC error code used for a dropped oversized response (implementation-defined
/// server-error range of JSON-RPC 2.0, -32000 to -32099).
pub const OVERSIZED_ERROR_CODE: i64 = -32098;

/// Longest JSON id the stdout guard notes (the client's own ids are numbers).
const MAX_NOTED_ID_BYTES: usize = 32;
/// Most ids a [`LineFacts`] set holds: every request removes its id when its answer came (or
/// it failed), so only ids the client never asked for (sent by a hostile server) could fill
/// it.
const MAX_NOTED_IDS: usize = 1024;

/// Notes a response id in one of [`LineFacts`]' sets, unless it is longer than any id the
/// client sends or the set is full.
fn note_id(set: &Mutex<HashSet<String>>, id: String) {
    let mut set = set.lock();
    if id.len() <= MAX_NOTED_ID_BYTES && set.len() < MAX_NOTED_IDS {
        set.insert(id);
    }
}

/// What the stdout guard observed, shared with the calls.
#[derive(Default)]
pub struct LineFacts {
    /// JSON ids (as JSON text) of responses whose invalid UTF-8 was replaced.
    pub repaired: Mutex<HashSet<String>>,
    /// JSON ids of responses dropped for being larger than the limit.
    pub oversized: Mutex<HashSet<String>>,
    /// Oversized lines whose id could not be found.
    pub dropped_without_id: std::sync::atomic::AtomicU64,
}

/// The last bytes a server wrote to stderr.
#[derive(Default)]
pub struct StderrTail {
    buf: Mutex<VecDeque<u8>>,
}

impl StderrTail {
    /// The tail as text (lossy).
    pub fn text(&self) -> String {
        let buf = self.buf.lock();
        let bytes: Vec<u8> = buf.iter().copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.buf.lock();
        buf.extend(bytes);
        while buf.len() > STDERR_TAIL_BYTES {
            buf.pop_front();
        }
    }
}

/// A running stdio server.
pub struct StdioProcess {
    /// The child (killed with its process group on drop).
    pub child: ChildGuard,
    /// Guarded stdout, for the JSON-RPC transport.
    pub stdout: DuplexStream,
    /// The child's stdin.
    pub stdin: ChildStdin,
    /// Its stderr tail.
    pub stderr: Arc<StderrTail>,
    /// What the stdout guard saw.
    pub facts: Arc<LineFacts>,
}

/// Kills the child's whole process group when dropped (servers started through `npx`,
/// shells or interpreters often fork) — also after the child itself exited and was reaped,
/// when helpers it started may still run.
pub struct ChildGuard {
    /// The child.
    pub child: Child,
    /// Its process group (= its pid, spawned with `process_group(0)`).
    pgid: Option<i32>,
    /// Its cgroup, when it is sandboxed and the host gives one (killed and removed on drop).
    cgroup: Option<crate::sandbox::cgroup::SessionCgroup>,
}

impl ChildGuard {
    /// Process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pgid.filter(|p| *p > 0) {
            // SAFETY: killpg only sends a signal; the group id is the child's pid because it
            // was spawned with process_group(0).
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
        if let Some(g) = self.cgroup.take() {
            g.kill();
            // (Removing waits for the killed processes to leave: not on an async worker.)
            std::thread::spawn(move || g.remove(std::time::Duration::from_secs(5)));
        }
    }
}

/// Spawns `command` with `args`, `env` (added to a cleared environment that keeps only
/// PATH, HOME, LANG and TMPDIR of the runtime) and `cwd` — inside `sandbox` when given (a
/// non-admin's server, see [`crate::sandbox::mcp`]).
pub fn spawn(
    command: &str,
    args: &[String],
    env: &[(String, String)],
    cwd: Option<&str>,
    max_line: usize,
    sandbox: Option<crate::sandbox::mcp::StdioSandbox>,
) -> std::io::Result<StdioProcess> {
    // A sandboxed server runs the real path its allow-list check admitted.
    let mut cmd = match &sandbox {
        Some(sb) => Command::new(&sb.program),
        None => Command::new(command),
    };
    cmd.args(args).env_clear();
    for key in ["PATH", "HOME", "LANG", "TMPDIR", "USER"] {
        if let Ok(v) = std::env::var(key) {
            cmd.env(key, v);
        }
    }
    if let Some(sb) = &sandbox {
        cmd.envs(sb.env.iter().map(|(k, v)| (k, v)));
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    match (&sandbox, cwd) {
        // The sandbox enters the cwd inside its own root.
        (Some(sb), _) => sb.prepared.install_tokio(&mut cmd),
        (None, Some(dir)) => {
            cmd.current_dir(dir);
        }
        (None, None) => {}
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true).process_group(0);
    let spawned = cmd.spawn();
    drop(cmd);
    let (mut child, cgroup) = match sandbox {
        Some(sb) => {
            sb.prepared.finish(spawned).map(|(c, g, _)| (c, g)).map_err(|e| std::io::Error::other(e.message))?
        }
        None => (spawned?, None),
    };
    let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("no stdin"))?;
    let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
    let stderr_pipe = child.stderr.take().ok_or_else(|| std::io::Error::other("no stderr"))?;
    let stderr = Arc::new(StderrTail::default());
    let tail = stderr.clone();
    tokio::spawn(async move {
        let mut pipe = stderr_pipe;
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tail.push(&buf[..n]);
        }
    });
    let facts = Arc::new(LineFacts::default());
    let (reader, writer) = tokio::io::duplex(256 * 1024);
    tokio::spawn(pump(stdout, writer, facts.clone(), max_line));
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());
    Ok(StdioProcess { child: ChildGuard { child, pgid, cgroup }, stdout: reader, stdin, stderr, facts })
}

/// Copies stdout to `out` line by line, enforcing the guard's rules (module docs).
async fn pump(stdout: tokio::process::ChildStdout, mut out: DuplexStream, facts: Arc<LineFacts>, max_line: usize) {
    let mut reader = BufReader::with_capacity(256 * 1024, stdout);
    let mut line: Vec<u8> = Vec::new();
    let mut oversized = false;
    let mut head: Vec<u8> = Vec::new();
    loop {
        let (consumed, complete) = {
            let available = match reader.fill_buf().await {
                Ok(a) if !a.is_empty() => a,
                _ => break,
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            if oversized {
                if head.len() < ID_SCAN_BYTES {
                    let room = ID_SCAN_BYTES - head.len();
                    head.extend_from_slice(&available[..take.min(room)]);
                }
            } else if line.len() + take > max_line {
                oversized = true;
                head = std::mem::take(&mut line);
                head.truncate(ID_SCAN_BYTES);
                if head.len() < ID_SCAN_BYTES {
                    let room = ID_SCAN_BYTES - head.len();
                    head.extend_from_slice(&available[..take.min(room)]);
                }
                line = Vec::new();
            } else {
                line.extend_from_slice(&available[..take]);
            }
            (take, newline.is_some())
        };
        reader.consume(consumed);
        if !complete {
            continue;
        }
        let ok = if oversized {
            oversized = false;
            let head = std::mem::take(&mut head);
            match oversized_reply(&head, max_line) {
                Some((id, reply)) => {
                    note_id(&facts.oversized, id);
                    out.write_all(reply.as_bytes()).await.is_ok()
                }
                None => {
                    facts.dropped_without_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(max_line, "an MCP server message larger than the limit was dropped");
                    true
                }
            }
        } else {
            let bytes = std::mem::take(&mut line);
            match String::from_utf8(bytes) {
                Ok(text) => out.write_all(text.as_bytes()).await.is_ok(),
                Err(e) => {
                    let repaired = String::from_utf8_lossy(e.as_bytes()).into_owned();
                    if let Some(id) = top_level_id(repaired.as_bytes())
                        && !top_level_key(repaired.as_bytes(), "method")
                    {
                        note_id(&facts.repaired, id);
                    }
                    out.write_all(repaired.as_bytes()).await.is_ok()
                }
            }
        };
        if !ok {
            break;
        }
    }
    let _ = out.shutdown().await;
}

/// A JSON-RPC error reply for an oversized response, when its head names an id and no
/// method (requests and notifications from the server are simply dropped).
fn oversized_reply(head: &[u8], max_line: usize) -> Option<(String, String)> {
    let id = top_level_id(head)?;
    if top_level_key(head, "method") {
        return None;
    }
    let message = format!("the server's response was larger than {max_line} bytes and was dropped");
    let reply = serde_json::json!({
        "jsonrpc": "2.0",
        "id": serde_json::from_str::<serde_json::Value>(&id).ok()?,
        "error": {"code": OVERSIZED_ERROR_CODE, "message": message, "data": {"mira": "message_too_large", "limit_bytes": max_line}},
    });
    Some((id, format!("{reply}\n")))
}

/// The JSON text of the top-level `"id"` member of a JSON object, scanning only `head`.
pub fn top_level_id(head: &[u8]) -> Option<String> {
    let at = find_top_level_key(head, "id")?;
    let rest = &head[at..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let end = if rest.first() == Some(&b'"') {
        let mut i = 1;
        let mut escaped = false;
        while i < rest.len() {
            match rest[i] {
                b'\\' if !escaped => escaped = true,
                b'"' if !escaped => break,
                _ => escaped = false,
            }
            i += 1;
        }
        i + 1
    } else {
        rest.iter().position(|b| matches!(b, b',' | b'}' | b' ' | b'\n' | b'\r' | b'\t')).unwrap_or(rest.len())
    };
    let text = std::str::from_utf8(rest.get(..end)?).ok()?;
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .filter(|v| v.is_number() || v.is_string())
        .map(|v| v.to_string())
}

fn top_level_key(head: &[u8], key: &str) -> bool {
    find_top_level_key(head, key).is_some()
}

/// Position just after the `:` of the top-level member `key`.
fn find_top_level_key(head: &[u8], key: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b'"' => {
                let start = i + 1;
                let mut j = start;
                let mut escaped = false;
                while j < head.len() {
                    match head[j] {
                        b'\\' if !escaped => escaped = true,
                        b'"' if !escaped => break,
                        _ => escaped = false,
                    }
                    j += 1;
                }
                if j >= head.len() {
                    return None;
                }
                let mut k = j + 1;
                while k < head.len() && head[k].is_ascii_whitespace() {
                    k += 1;
                }
                if depth == 1 && head.get(k) == Some(&b':') && &head[start..j] == key.as_bytes() {
                    return Some(k + 1);
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_top_level_id_only() {
        assert_eq!(top_level_id(br#"{"jsonrpc":"2.0","id":7,"result":{"id":9}}"#).as_deref(), Some("7"));
        assert_eq!(top_level_id(br#"{"result":{"id":9},"id":"a\"b"}"#).as_deref(), Some(r#""a\"b""#));
        assert_eq!(top_level_id(br#"{"result":{"id":9,"text":"xxxxxxxx"#), None);
        assert!(oversized_reply(br#"{"jsonrpc":"2.0","method":"x","id":3"#, 10).is_none());
        let (id, reply) = oversized_reply(br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"#, 10).unwrap_or_default();
        assert_eq!(id, "3");
        assert!(reply.contains("-32098") && reply.ends_with('\n'), "{reply}");
    }

    #[test]
    fn noted_ids_are_short_and_few() {
        let set = Mutex::new(HashSet::new());
        note_id(&set, format!("\"{}\"", "x".repeat(1 << 20)));
        assert!(set.lock().is_empty(), "an id longer than the client's own is not noted");
        for n in 0..5_000 {
            note_id(&set, n.to_string());
        }
        assert_eq!(set.lock().len(), MAX_NOTED_IDS);
    }
}
