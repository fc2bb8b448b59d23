//! The managed Chromium's DevTools connection over a pipe, not a port.
//!
//! Chromium started with `--remote-debugging-port` listens on loopback without authentication:
//! any process of the host (a sandboxed terminal session under `--sandbox-network open` or
//! `deny-services` included) could connect and drive every user's browser context. So the
//! managed browser is started with `--remote-debugging-pipe` instead: it reads DevTools
//! messages from file descriptor 3 and writes its own to descriptor 4, each message ended by a
//! NUL byte, and opens no port at all.
//!
//! chromiumoxide speaks DevTools over a WebSocket only, so this module bridges: a WebSocket
//! server on a free loopback port accepts exactly one client — the one that opens the path
//! `/devtools/browser/<128 random bits, hex>` — and stops listening; every text message it
//! gets is written to the pipe, every message from the pipe is sent back as text. A process
//! that finds the port and does not know the path gets `404` (and the port is closed as soon as
//! the server's own client is in). When either side closes, the bridge ends, and with it the
//! browser process ([`PipeBrowser`] kills it when dropped).
//!
//! Messages from the browser are bounded as on the attached path: an answer to a command of at
//! most [`MAX_MESSAGE_BYTES`] (a longer one is skipped unread past its first bytes, and the
//! command is answered with an error instead, so it fails at once rather than at its time
//! limit), an event of at most [`MAX_EVENT_BYTES`] (a longer one — a page's 5 MB
//! `console.log`, a request with a huge URL — is dropped). A page cannot make the one
//! connection every user's context shares hold hundreds of megabytes.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use async_tungstenite::tungstenite::Message;
use async_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use futures::StreamExt;
use mira_core::devtools::{MAX_EVENT_BYTES, MAX_MESSAGE_BYTES, answer_id};
use rand::RngExt;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;

/// Longest a client may take to complete its WebSocket handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most handshakes in progress at once; further connections are closed at accept.
const MAX_HANDSHAKES: usize = 16;

/// A Chromium process driven over its DevTools pipe, reachable by one client at
/// [`PipeBrowser::websocket_url`]. Dropping it ends the bridge and kills the process.
pub struct PipeBrowser {
    websocket_url: String,
    child: tokio::process::Child,
    bridge: JoinHandle<()>,
}

/// The server's environment variables a managed Chromium keeps (besides `LC_*` and `XDG_*`),
/// when set: where it finds its files, its libraries (`LD_LIBRARY_PATH`, a Chromium unpacked
/// outside the system's library paths) and the session bus (`DBUS_SESSION_BUS_ADDRESS`).
const CHROMIUM_ENV: [&str; 9] = [
    "PATH",
    "HOME",
    "LANG",
    "TZ",
    "TMPDIR",
    "FONTCONFIG_PATH",
    "FONTCONFIG_FILE",
    "LD_LIBRARY_PATH",
    "DBUS_SESSION_BUS_ADDRESS",
];

impl PipeBrowser {
    /// Starts `binary` with `args` and `--remote-debugging-pipe`, its descriptors 3 and 4 the
    /// pipe's ends, and the bridge. With `cgroup_procs` (the `cgroup.procs` files of the
    /// browser's cgroups, opened by [`crate::sandbox::cgroup::CgroupSupport::create`]) the
    /// process joins those groups before it runs Chromium, so its whole tree — every process it
    /// forks — stays in them. Errors: the pipes, the listener or the process cannot be made, or
    /// the process cannot join its groups.
    pub async fn launch(binary: &Path, args: &[String], cgroup_procs: Vec<OwnedFd>) -> std::io::Result<PipeBrowser> {
        use command_fds::{CommandFdExt, FdMapping};
        let (browser_reads, server_writes) = std::io::pipe()?;
        let (server_reads, browser_writes) = std::io::pipe()?;
        let mut command = tokio::process::Command::new(binary);
        // Pages run in this process tree: it gets none of the server's environment (cluster
        // secret, database URL, provider keys), only what Chromium needs to find its files.
        command.env_clear().envs(std::env::vars_os().filter(|(k, _)| {
            k.to_str().is_some_and(|k| CHROMIUM_ENV.contains(&k) || k.starts_with("LC_") || k.starts_with("XDG_"))
        }));
        command
            .args(args)
            .arg("--remote-debugging-pipe")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        command
            .fd_mappings(vec![
                FdMapping { parent_fd: OwnedFd::from(browser_reads), child_fd: 3 },
                FdMapping { parent_fd: OwnedFd::from(browser_writes), child_fd: 4 },
            ])
            .map_err(|e| std::io::Error::other(format!("mapping the DevTools pipe: {e}")))?;
        if !cgroup_procs.is_empty() {
            // SAFETY: runs in the forked child before exec; it only calls write(2) on
            // descriptors the parent opened (async-signal-safe) and allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    use std::os::fd::AsRawFd;
                    for fd in &cgroup_procs {
                        // "0" is the writing process itself (cgroup v1 and v2).
                        if libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let to_browser = pipe::Sender::from_owned_fd(OwnedFd::from(server_writes))?;
        let from_browser = pipe::Receiver::from_owned_fd(OwnedFd::from(server_reads))?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let mut secret = [0u8; 16];
        rand::rng().fill(&mut secret);
        let path = format!("/devtools/browser/{}", hex(&secret));
        let websocket_url = format!("ws://{}{path}", listener.local_addr()?);
        let child = command.spawn()?;
        // The command held the browser's ends; the process has its own copies now.
        drop(command);
        let bridge = tokio::spawn(bridge(listener, path, to_browser, from_browser));
        Ok(PipeBrowser { websocket_url, child, bridge })
    }

    /// The bridge's WebSocket URL (`ws://127.0.0.1:<port>/devtools/browser/<secret>`): give
    /// it to chromiumoxide's `Browser::connect_with_config`, once.
    pub fn websocket_url(&self) -> &str {
        &self.websocket_url
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process has exited (reaped here when it has).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the process and waits for it (5 s at most).
    pub async fn kill(mut self) {
        self.bridge.abort();
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

impl Drop for PipeBrowser {
    fn drop(&mut self) {
        self.bridge.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A client's WebSocket handshake, accepted only for `path` and within
/// [`HANDSHAKE_TIMEOUT`].
async fn handshake(
    stream: tokio::net::TcpStream,
    path: String,
) -> Option<async_tungstenite::WebSocketStream<async_tungstenite::tokio::TokioAdapter<tokio::net::TcpStream>>> {
    // Small DevTools messages back to back: no Nagle delay on loopback.
    let _ = stream.set_nodelay(true);
    // The shape tungstenite's handshake callback must have.
    #[allow(clippy::result_large_err)]
    let check = move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        if request.uri().path() == path {
            return Ok(response);
        }
        let mut refused = ErrorResponse::new(Some("not found".into()));
        *refused.status_mut() = async_tungstenite::tungstenite::http::StatusCode::NOT_FOUND;
        Err(refused)
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, async_tungstenite::tokio::accept_hdr_async(stream, check)).await {
        Ok(Ok(ws)) => Some(ws),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "DevTools bridge: a client was refused");
            None
        }
        Err(_) => {
            tracing::debug!("DevTools bridge: a client's handshake timed out");
            None
        }
    }
}

/// Waits for the one client that names `path`, stops listening, then relays until either
/// side closes.
async fn bridge(listener: TcpListener, path: String, mut to_browser: pipe::Sender, from_browser: pipe::Receiver) {
    // Handshakes run side by side (at most MAX_HANDSHAKES), so a process that connects and
    // stalls cannot hold the server's own client back.
    let mut handshakes = tokio::task::JoinSet::new();
    let ws = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::debug!(error = %e, "DevTools bridge accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if handshakes.len() < MAX_HANDSHAKES {
                    handshakes.spawn(handshake(stream, path.clone()));
                }
            }
            Some(done) = handshakes.join_next(), if !handshakes.is_empty() => {
                if let Ok(Some(ws)) = done {
                    break ws;
                }
            }
        }
    };
    handshakes.abort_all();
    drop(listener);
    let (mut ws_out, mut ws_in) = ws.split();
    let down = async {
        while let Some(Ok(message)) = ws_in.next().await {
            let bytes = match message {
                Message::Text(text) => text.as_bytes().to_vec(),
                Message::Binary(data) => data.to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            if to_browser.write_all(&bytes).await.is_err() || to_browser.write_all(b"\0").await.is_err() {
                break;
            }
        }
    };
    let up = async {
        let mut reader = tokio::io::BufReader::new(from_browser);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // At most one byte past the limit is kept; the rest of a longer message is skipped.
            let limit = u64::try_from(MAX_MESSAGE_BYTES).unwrap_or(u64::MAX).saturating_add(1);
            match (&mut reader).take(limit).read_until(0, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let ended = buf.last() == Some(&0);
            if ended {
                buf.pop();
            }
            let head = String::from_utf8_lossy(&buf[..buf.len().min(32)]).into_owned();
            let answer = answer_id(&head);
            let text = if !ended && buf.len() > MAX_MESSAGE_BYTES {
                if skip_past_nul(&mut reader).await.is_err() {
                    break;
                }
                let Some(id) = answer else { continue };
                tracing::warn!(id, "a DevTools answer over {MAX_MESSAGE_BYTES} bytes was skipped");
                format!(
                    r#"{{"id":{id},"error":{{"code":-32000,"message":"the answer is larger than {MAX_MESSAGE_BYTES} bytes"}}}}"#
                )
            } else if answer.is_none() && buf.len() > MAX_EVENT_BYTES {
                continue;
            } else {
                let Ok(text) = String::from_utf8(std::mem::take(&mut buf)) else { continue };
                text
            };
            if ws_out.send(Message::text(text)).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = down => {}
        () = up => {}
    }
}

/// Reads and drops everything up to and including the next NUL (the end of a message).
async fn skip_past_nul<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<()> {
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(at) = chunk.iter().position(|b| *b == 0) {
            reader.consume(at + 1);
            return Ok(());
        }
        let n = chunk.len();
        reader.consume(n);
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// `sh` copying its descriptor 3 to 4 plays the browser: every message comes back.
    #[tokio::test]
    async fn one_client_with_the_path_gets_through_a_stalled_and_a_wrong_one() {
        let echo = ["-c".to_owned(), "cat <&3 >&4".to_owned()];
        let browser = PipeBrowser::launch(Path::new("/bin/sh"), &echo, Vec::new()).await.unwrap();
        let url = url::Url::parse(browser.websocket_url()).unwrap();
        let address = format!("127.0.0.1:{}", url.port().unwrap());
        // A client that connects and says nothing does not hold the others back.
        let _stalled = tokio::net::TcpStream::connect(&address).await.unwrap();
        // A client without the path is refused.
        let wrong = format!("ws://{address}/devtools/browser/guess");
        let refused = async_tungstenite::tokio::connect_async(wrong).await;
        assert!(refused.is_err(), "a wrong path is refused");
        let started = std::time::Instant::now();
        let (mut ws, _) = async_tungstenite::tokio::connect_async(browser.websocket_url()).await.unwrap();
        assert!(started.elapsed() < HANDSHAKE_TIMEOUT, "not held back by the stalled client");
        ws.send(Message::text(r#"{"id":1,"method":"Browser.getVersion"}"#)).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), r#"{"id":1,"method":"Browser.getVersion"}"#);
        // The bridge listens no more.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(&address).await.is_err(), "the port is closed once the client is in");
        let pid = browser.pid();
        browser.kill().await;
        let mut status = String::new();
        if let Ok(mut f) = tokio::fs::File::open(format!("/proc/{}/status", pid.unwrap_or(0))).await {
            let _ = f.read_to_string(&mut status).await;
        }
        assert!(!status.contains("State:\tS") && !status.contains("State:\tR"), "the process is gone: {status}");
    }

    /// A browser writing an answer over the limit, then an event over the event limit, then a
    /// small answer: the first command gets an error, the event is dropped, the last passes.
    #[tokio::test]
    async fn messages_past_the_limits_are_skipped() {
        let script = format!(
            r#"{{ printf '{{"id":7,"r":"'; head -c {big} /dev/zero | tr '\000' a; printf '"}}\000';
                printf '{{"method":"E","p":"'; head -c {event} /dev/zero | tr '\000' b; printf '"}}\000';
                printf '{{"id":8,"result":{{}}}}\000'; }} >&4; cat <&3 >/dev/null"#,
            big = MAX_MESSAGE_BYTES + 10,
            event = MAX_EVENT_BYTES + 10,
        );
        let browser = PipeBrowser::launch(Path::new("/bin/sh"), &["-c".to_owned(), script], Vec::new()).await.unwrap();
        let (mut ws, _) = async_tungstenite::tokio::connect_async(browser.websocket_url()).await.unwrap();
        let mut next = async || {
            let m = tokio::time::timeout(Duration::from_secs(20), ws.next()).await.unwrap().unwrap().unwrap();
            serde_json::from_str::<serde_json::Value>(m.into_text().unwrap().as_str()).unwrap()
        };
        let first = next().await;
        assert_eq!(first["id"], 7, "{first}");
        assert!(first["error"]["message"].as_str().unwrap().contains("larger than"), "{first}");
        let second = next().await;
        assert_eq!(second, serde_json::json!({"id": 8, "result": {}}), "the event was dropped");
        browser.kill().await;
    }
}
