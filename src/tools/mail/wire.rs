//! The byte stream under IMAP and SMTP, where a hostile mail server is met first.
//!
//! - [`connect`] resolves the host once, refuses an internal address under
//!   [`AddressRule::PublicOnly`] (403 `internal_address`, naming the address) and connects to
//!   the addresses it checked, never to the name again (no DNS rebinding); TLS still verifies
//!   the host name and sends it as SNI. [`refuse_plaintext`] refuses `tls: none` under the same
//!   rule (the password would cross the network in clear).
//! - [`Budgeted`] counts every byte read: once a [`Budget`]'s session allowance, the current
//!   phase's allowance (one IMAP command, or one SMTP reply: the count restarts at each write)
//!   is spent, the read fails with [`Exceeded`], so neither async-imap nor lettre can buffer
//!   without bound. For IMAP it also watches literal announcements (`{N}` before CRLF) and
//!   fails as soon as one announces more than is left, before async-imap reserves a buffer
//!   for it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::TlsMode;
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::ToolError;

/// A read budget was spent: the server sent more than the named limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// What was being read (`one SMTP reply`, `UID SEARCH`, `the IMAP session`…).
    pub what: String,
    /// The limit, in bytes.
    pub limit: u64,
    /// For a literal announcement: the bytes announced.
    pub announced: Option<u64>,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.announced {
            Some(n) => write!(
                f,
                "the server announced a literal of {n} bytes during {}, more than the {} bytes left of its read limit",
                self.what, self.limit
            ),
            None => write!(f, "the server sent more than the read limit of {} bytes for {}", self.limit, self.what),
        }
    }
}

impl std::error::Error for Exceeded {}

/// The [`Exceeded`] somewhere in `e`'s source chain (io errors included), if any.
pub fn exceeded_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Exceeded> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(x) = err.downcast_ref::<Exceeded>() {
            return Some(x);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(x) = io.get_ref().and_then(|i| i.downcast_ref::<Exceeded>())
        {
            return Some(x);
        }
        cur = err.source();
    }
    None
}

#[derive(Debug)]
struct Phase {
    what: String,
    limit: u64,
}

#[derive(Debug)]
struct State {
    session_limit: u64,
    session_used: AtomicU64,
    phase_used: AtomicU64,
    phase: Mutex<Phase>,
    /// SMTP: a write starts a new phase (one reply per command).
    per_reply: bool,
}

/// A shared read allowance: a whole session's, and the current phase's. Cheap to clone (the
/// stream holds one, the caller another to start phases).
#[derive(Debug, Clone)]
pub struct Budget(Arc<State>);

impl Budget {
    /// A budget of `session` bytes in all, and `phase` bytes for the first phase, named `what`.
    /// With `per_reply`, every write starts a new phase of the same size (SMTP: one reply per
    /// command).
    pub fn new(session: u64, what: &str, phase: u64, per_reply: bool) -> Self {
        Budget(Arc::new(State {
            session_limit: session,
            session_used: AtomicU64::new(0),
            phase_used: AtomicU64::new(0),
            phase: Mutex::new(Phase { what: what.to_owned(), limit: phase }),
            per_reply,
        }))
    }

    /// Starts a phase named `what` with `limit` bytes (what is left of the session still caps it).
    pub fn phase(&self, what: &str, limit: u64) {
        *self.0.phase.lock() = Phase { what: what.to_owned(), limit };
        self.0.phase_used.store(0, Ordering::SeqCst);
    }

    /// Bytes read so far in the session.
    pub fn used(&self) -> u64 {
        self.0.session_used.load(Ordering::SeqCst)
    }

    /// The bytes still allowed now and the limit that allows them (the smaller of the phase's
    /// and the session's).
    fn left(&self) -> (u64, Exceeded) {
        let phase = self.0.phase.lock();
        let phase_left = phase.limit.saturating_sub(self.0.phase_used.load(Ordering::SeqCst));
        let session_left = self.0.session_limit.saturating_sub(self.0.session_used.load(Ordering::SeqCst));
        if phase_left <= session_left {
            (phase_left, Exceeded { what: phase.what.clone(), limit: phase.limit, announced: None })
        } else {
            (session_left, Exceeded { what: "the whole session".into(), limit: self.0.session_limit, announced: None })
        }
    }

    /// Counts `n` bytes read; the limit spent if that is more than was left.
    fn take(&self, n: u64) -> Result<(), Exceeded> {
        let (left, limit) = self.left();
        self.0.session_used.fetch_add(n, Ordering::SeqCst);
        self.0.phase_used.fetch_add(n, Ordering::SeqCst);
        if n > left { Err(limit) } else { Ok(()) }
    }

    fn wrote(&self) {
        if self.0.per_reply {
            self.0.phase_used.store(0, Ordering::SeqCst);
        }
    }
}

/// Most bytes of one IMAP response line outside its literals. async-imap parses a line again
/// from its start at every read until it is complete, so a long line costs quadratic time:
/// this bounds it (and a `UID SEARCH` answer, one line, to about 150 000 UIDs).
pub const IMAP_LINE_BYTES: u64 = 1024 * 1024;

/// Where the IMAP literal watcher is.
#[derive(Debug, Default)]
struct Literals {
    /// Bytes of the current line outside literals.
    line: u64,
    /// Bytes of a literal still to pass unexamined.
    skip: u64,
    /// The current line's first bytes (to tell a text line from a data line).
    head: Vec<u8>,
    /// The current line's last bytes since its start or its last literal.
    tail: Vec<u8>,
}

const HEAD: usize = 16;
const TAIL: usize = 24;

impl Literals {
    /// Whether the line (by its first bytes) is status text (`* OK …`, `tag NO …`, `+ …`),
    /// where imap-proto reads a trailing `{N}` as text, not as a literal.
    fn text_line(&self) -> bool {
        let h = &self.head;
        if h.starts_with(b"+") {
            return true;
        }
        let mut words = h.split(|b| *b == b' ');
        let _tag = words.next();
        let word = words.next().unwrap_or_default().to_ascii_uppercase();
        matches!(word.as_slice(), b"OK" | b"NO" | b"BAD" | b"BYE" | b"PREAUTH")
    }

    /// The size a literal announced at the end of the tail (`{N}` or `~{N}`, `+` allowed).
    fn announced(&self) -> Option<u64> {
        let t = self.tail.strip_suffix(b"}")?;
        let t = t.strip_suffix(b"+").unwrap_or(t);
        let open = t.iter().rposition(|b| *b == b'{')?;
        let digits = &t[open + 1..];
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // More digits than u64 holds is "more than any budget".
        Some(std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).unwrap_or(u64::MAX))
    }

    /// Examines bytes as they arrive; the limit spent when a literal announces more than
    /// `left` (computed lazily, only at an announcement).
    fn scan(&mut self, bytes: &[u8], left: impl Fn() -> (u64, Exceeded)) -> Result<(), Exceeded> {
        let mut i = 0;
        while i < bytes.len() {
            if self.skip > 0 {
                let n = usize::try_from(self.skip).unwrap_or(usize::MAX).min(bytes.len() - i);
                i += n;
                self.skip -= n as u64;
                continue;
            }
            let b = bytes[i];
            i += 1;
            if b == b'\n' {
                let announced = if self.tail.last() == Some(&b'\r') {
                    self.tail.pop();
                    self.announced()
                } else {
                    None
                };
                self.tail.clear();
                if announced.is_none() {
                    self.line = 0;
                }
                match announced {
                    Some(n) => {
                        let (left, mut limit) = left();
                        if n > left {
                            limit.announced = Some(n);
                            limit.limit = left;
                            return Err(limit);
                        }
                        if self.text_line() {
                            self.head.clear();
                            self.line = 0;
                        } else {
                            // The line goes on after the literal's bytes.
                            self.skip = n;
                        }
                    }
                    None => self.head.clear(),
                }
                continue;
            }
            self.line += 1;
            if self.line > IMAP_LINE_BYTES {
                let (_, limit) = left();
                return Err(Exceeded {
                    what: format!("one IMAP line of {}", limit.what),
                    limit: IMAP_LINE_BYTES,
                    announced: None,
                });
            }
            if self.head.len() < HEAD {
                self.head.push(b);
            }
            if self.tail.len() == TAIL {
                self.tail.remove(0);
            }
            self.tail.push(b);
        }
        Ok(())
    }
}

/// A plain or TLS stream reading within a [`Budget`].
pub struct Budgeted<S> {
    inner: S,
    budget: Budget,
    literals: Option<Literals>,
}

impl<S> std::fmt::Debug for Budgeted<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgeted").field("used", &self.budget.used()).finish_non_exhaustive()
    }
}

impl<S> Budgeted<S> {
    /// `inner` read within `budget`; `imap` also watches IMAP literal announcements.
    pub fn new(inner: S, budget: Budget, imap: bool) -> Self {
        Self { inner, budget, literals: imap.then(Literals::default) }
    }

    /// The stream (for STARTTLS), and the budget.
    pub fn into_parts(self) -> (S, Budget) {
        (self.inner, self.budget)
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                let over = this.budget.take(fresh.len() as u64).err().or_else(|| {
                    let budget = &this.budget;
                    this.literals.as_mut().and_then(|l| l.scan(fresh, || budget.left()).err())
                });
                match over {
                    Some(e) => {
                        buf.set_filled(before);
                        Poll::Ready(Err(std::io::Error::other(e)))
                    }
                    None => Poll::Ready(Ok(())),
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.budget.wrote();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// 403 `forbidden` for `tls: none` under [`AddressRule::PublicOnly`]: a non-admin's own
/// connection may not send its password in clear across the network.
pub fn refuse_plaintext(which: &str, tls: TlsMode, rule: AddressRule) -> Result<(), ToolError> {
    if tls == TlsMode::None && rule == AddressRule::PublicOnly {
        return Err(ToolError::new(
            ErrorCode::Forbidden,
            format!(
                "{which} tls: none (no encryption: the password would cross the network in clear) is allowed only on \
                 an admin's or a shared connection; use tls or starttls"
            ),
        ));
    }
    Ok(())
}

/// Resolves `host` once and refuses an internal address under `rule` (403
/// `internal_address`, naming the address); a name that does not resolve is
/// `connection_unreachable` (`unreachable` builds that error).
pub async fn resolve(
    host: &str,
    port: u16,
    rule: AddressRule,
    unreachable: impl Fn(String) -> ToolError,
) -> Result<Vec<SocketAddr>, ToolError> {
    let addrs = crate::net::resolve_host(host, port, AddressRule::Any).await.map_err(|e| unreachable(e.0))?;
    if rule == AddressRule::PublicOnly
        && let Some(a) = addrs.iter().find(|a| crate::net::is_internal(a.ip()))
    {
        return Err(ToolError::new(
            ErrorCode::InternalAddress,
            format!(
                "{host}:{port} is an internal address ({}); only an admin's or a shared connection may reach it",
                a.ip()
            ),
        ));
    }
    Ok(addrs)
}

/// Connects to `host`:`port` through the addresses [`resolve`] checked under `rule`, in order;
/// the first that answers wins.
pub async fn connect(
    host: &str,
    port: u16,
    rule: AddressRule,
    unreachable: impl Fn(String) -> ToolError,
) -> Result<TcpStream, ToolError> {
    let addrs = resolve(host, port, rule, &unreachable).await?;
    let mut last = String::from("no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(unreachable(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn unreachable(why: String) -> ToolError {
        ToolError::new(ErrorCode::ConnectionUnreachable, why)
    }

    #[tokio::test]
    async fn public_only_refuses_loopback_without_connecting() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        for host in ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"] {
            let e = connect(host, port, AddressRule::PublicOnly, unreachable).await.expect_err(host);
            assert_eq!(e.code, ErrorCode::InternalAddress, "{host}: {e:?}");
            assert!(e.message.contains("127.0.0.1"), "the message names the address: {}", e.message);
        }
        let accepted = tokio::time::timeout(std::time::Duration::from_millis(300), listener.accept()).await;
        assert!(accepted.is_err(), "nothing connected");
        // The same address under Any connects.
        let s = connect("127.0.0.1", port, AddressRule::Any, unreachable).await.expect("connects");
        let (_, peer) =
            tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept()).await.unwrap().unwrap();
        assert_eq!(s.local_addr().unwrap(), peer);
    }

    #[test]
    fn plaintext_only_for_any() {
        let e = refuse_plaintext("imap", TlsMode::None, AddressRule::PublicOnly).expect_err("refused");
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert!(refuse_plaintext("imap", TlsMode::None, AddressRule::Any).is_ok());
        assert!(refuse_plaintext("imap", TlsMode::Starttls, AddressRule::PublicOnly).is_ok());
    }

    async fn read_all(data: Vec<u8>, budget: Budget, imap: bool) -> Result<Vec<u8>, std::io::Error> {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = a.write_all(&data).await;
        });
        let mut s = Budgeted::new(b, budget, imap);
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map(|_| out)
    }

    #[tokio::test]
    async fn a_reply_over_its_limit_fails() {
        let reply = vec![b'x'; 70_000];
        let e = read_all(reply.clone(), Budget::new(1 << 20, "one SMTP reply", 65_536, true), false)
            .await
            .expect_err("over the reply limit");
        let x = exceeded_in(&e).expect("an Exceeded");
        assert_eq!((x.limit, x.what.as_str()), (65_536, "one SMTP reply"));
        assert!(e.to_string().contains("65536"), "{e}");
        // The session limit binds too.
        let e = read_all(reply.clone(), Budget::new(10_000, "one SMTP reply", 65_536, true), false).await.unwrap_err();
        assert_eq!(exceeded_in(&e).map(|x| x.limit), Some(10_000));
        assert!(read_all(reply, Budget::new(1 << 20, "r", 80_000, true), false).await.is_ok());
    }

    #[tokio::test]
    async fn a_huge_literal_announcement_fails_before_its_bytes() {
        let data = b"* 1 FETCH (UID 5 BODY[]<0> {9999999999}\r\nabc".to_vec();
        let e = read_all(data, Budget::new(1 << 20, "UID FETCH", 1 << 20, false), true).await.unwrap_err();
        let x = exceeded_in(&e).expect("an Exceeded");
        assert_eq!(x.announced, Some(9_999_999_999), "{x}");
        // A literal within the budget passes, and its content is not examined (a `{N}` line
        // inside a message is text).
        let body = b"Subject: {99999999999}\r\n\r\nhi\r\n";
        let mut data = format!("* 1 FETCH (UID 5 BODY[] {{{}}}\r\n", body.len()).into_bytes();
        data.extend_from_slice(body);
        data.extend_from_slice(b")\r\n* OK [ALERT] text {99}\r\nA1 OK done\r\n");
        let out = read_all(data.clone(), Budget::new(1 << 20, "UID FETCH", 1 << 20, false), true).await.unwrap();
        assert_eq!(out, data);
        // Status text ending in a big {N} is refused too (conservative), and a data line's
        // literal counts against what is left of the phase.
        let data = b"* 1 FETCH (BODY[] {2000}\r\n".to_vec();
        let e = read_all(data, Budget::new(1 << 20, "UID FETCH", 100, false), true).await.unwrap_err();
        assert_eq!(exceeded_in(&e).and_then(|x| x.announced), Some(2000));
        // A line without end is cut at IMAP_LINE_BYTES, within a larger budget.
        let mut data = b"* SEARCH".to_vec();
        data.extend(b" 12345".iter().cycle().take(2 << 20));
        let e = read_all(data, Budget::new(8 << 20, "UID SEARCH", 4 << 20, false), true).await.unwrap_err();
        let x = exceeded_in(&e).expect("an Exceeded");
        assert_eq!((x.limit, x.what.as_str()), (IMAP_LINE_BYTES, "one IMAP line of UID SEARCH"));
    }
}
