//! Connection and stream limits: what one client, or one user, may hold open on the server.
//! (The streaming routes' middleware that takes a user's slot is `http::limits::stream_slot`.)
//!
//! - [`LimitedListener`] wraps the TCP listener: at most `max_connections` connections are
//!   served at once (more wait in the kernel's accept backlog, costing the server nothing), and
//!   a connection with no byte read or written for `idle_timeout` is closed — an idle
//!   keep-alive connection, a client that stopped reading a stream, or a request sent a byte
//!   at a time. SSE streams write a keep-alive comment every 15 s, so a live stream is never
//!   idle.
//! - [`StreamLimiter`] caps the Server-Sent Event streams one user has open at once (run
//!   events, the approvals inbox, terminal output): one more is refused with 429
//!   `too_many_streams`. The [`StreamPermit`] travels inside the response stream, so it is
//!   released when the stream is dropped — the client left, or the server stops.
//! - [`TurnLimiter`] caps the turns one user has in progress at once (a turn ranks every
//!   available tool on the server's CPU, then stores the exposure through the store's
//!   writer): one more is refused with 429 `too_many_turns`. The slot is held until the turn
//!   is stored and travels into the ranking's blocking task, so a client that sends turns
//!   and hangs up at once cannot leave more rankings running than its limit: one user's flood
//!   shares the CPU and the writer with other users' turns as that many turns, not as all of
//!   them.
//! - [`FairPool`] admits rankings to the server's cores one user at a time: at most one
//!   ranking per core runs at once, and when one ends its core goes to the next user in
//!   rotation who has a ranking waiting. A user's many turns wait behind each other, not in
//!   front of another user's one.
//! - When a connection or a stream closes, freed heap memory is handed back to the operating
//!   system ([`release_memory`]). glibc's malloc keeps freed small blocks in its arenas: a
//!   round of 300 clients left the server ~45 MB above its resting size until
//!   `malloc_trim(0)` was called (measured with `mira bench sse`).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::error::{Error, ErrorCode, Result};

/// Limits of the HTTP server (`mira serve --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct HttpLimits {
    /// Server-Sent Event streams (run events, approvals inbox, terminal output) one user may
    /// have open at once; one more is refused with 429 `too_many_streams`.
    #[arg(long = "max-streams-per-user", env = "MIRA_MAX_STREAMS_PER_USER", default_value_t = 32)]
    pub streams_per_user: usize,
    /// Turns one user may have in progress at once (each ranks the available tools); one more
    /// is refused with 429 `too_many_turns`.
    #[arg(long = "max-turns-per-user", env = "MIRA_MAX_TURNS_PER_USER", default_value_t = 8)]
    pub turns_per_user: usize,
    /// Connections served at once; further clients wait in the accept backlog.
    #[arg(long = "max-connections", env = "MIRA_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a connection may stay without reading or writing a byte before it is closed
    /// (idle keep-alive connections, stalled readers). Keep it above the request timeout: a
    /// request whose handler writes nothing for this long is cut.
    #[arg(long = "idle-timeout-secs", env = "MIRA_IDLE_TIMEOUT_SECS", default_value_t = 60)]
    pub idle_timeout_secs: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self { streams_per_user: 32, turns_per_user: 8, max_connections: 4096, idle_timeout_secs: 60 }
    }
}

/// Counts what each user holds at once of one thing (streams, turns, running tools), up to a
/// number per user.
#[derive(Debug)]
pub struct PerUserLimit {
    per_user: usize,
    held: Mutex<HashMap<String, usize>>,
    /// Woken whenever a place is freed (for those waiting for one).
    freed: tokio::sync::Notify,
}

impl PerUserLimit {
    /// A limit of `per_user` places per user (at least 1).
    pub fn new(per_user: usize) -> Arc<Self> {
        Arc::new(Self {
            per_user: per_user.max(1),
            held: Mutex::new(HashMap::new()),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// Like [`PerUserLimit::try_take`], waiting up to `wait` for a place of `user_id` to free.
    pub async fn take_within(self: &Arc<Self>, user_id: &str, wait: Duration) -> Option<UserSlot> {
        let deadline = Instant::now() + wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the attempt: a place freed in between still wakes this wait.
            freed.as_mut().enable();
            if let Some(slot) = self.try_take(user_id) {
                return Some(slot);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return self.try_take(user_id);
            }
        }
    }

    /// One more place for `user_id`, or None when the user holds them all.
    pub fn try_take(self: &Arc<Self>, user_id: &str) -> Option<UserSlot> {
        let mut held = self.held.lock();
        let n = held.entry(user_id.to_owned()).or_insert(0);
        if *n >= self.per_user {
            return None;
        }
        *n += 1;
        Some(UserSlot { limit: self.clone(), user_id: user_id.to_owned() })
    }

    /// For the first `n` of `users` (one entry per place wanted, in order), a place each while
    /// its user has one left: stops at the first entry whose user has none, so the places
    /// taken are for a prefix of `users`. All are taken under one lock: nothing taken
    /// meanwhile pushes a user past the limit.
    pub fn take_prefix(self: &Arc<Self>, users: &[String], n: usize) -> Vec<UserSlot> {
        let mut held = self.held.lock();
        let mut taken = Vec::new();
        for user_id in users.iter().take(n) {
            let count = held.entry(user_id.clone()).or_insert(0);
            if *count >= self.per_user {
                break;
            }
            *count += 1;
            taken.push(UserSlot { limit: self.clone(), user_id: user_id.clone() });
        }
        taken
    }

    /// The most places one user holds at once.
    pub fn per_user(&self) -> usize {
        self.per_user
    }

    /// Places `user_id` holds now.
    pub fn held(&self, user_id: &str) -> usize {
        self.held.lock().get(user_id).copied().unwrap_or(0)
    }

    /// Whether `user_id` holds every place they may.
    pub fn is_full(&self, user_id: &str) -> bool {
        self.held(user_id) >= self.per_user
    }

    /// The users holding every place they may.
    pub fn full(&self) -> Vec<String> {
        self.held.lock().iter().filter(|(_, n)| **n >= self.per_user).map(|(u, _)| u.clone()).collect()
    }
}

/// One place a user holds; dropping it frees it.
#[derive(Debug)]
pub struct UserSlot {
    limit: Arc<PerUserLimit>,
    user_id: String,
}

impl UserSlot {
    /// Whose place this is.
    pub fn user_id(&self) -> &str {
        &self.user_id
    }
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let mut held = self.limit.held.lock();
        if let Some(n) = held.get_mut(&self.user_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.user_id);
            }
        }
        drop(held);
        self.limit.freed.notify_waiters();
    }
}

/// Counts each user's open streams (see the module docs).
#[derive(Debug)]
pub struct StreamLimiter {
    slots: Arc<PerUserLimit>,
}

impl StreamLimiter {
    /// A limiter allowing `per_user` open streams per user (at least 1).
    pub fn new(per_user: usize) -> Arc<Self> {
        Arc::new(Self { slots: PerUserLimit::new(per_user) })
    }

    /// A permit for one more stream of `user_id`, or 429 `too_many_streams` when the user
    /// already has the maximum open.
    pub fn acquire(self: &Arc<Self>, user_id: &str) -> Result<StreamPermit> {
        let slot = self.slots.try_take(user_id).ok_or_else(|| Error::TooManyRequests {
            code: ErrorCode::TooManyStreams,
            message: format!(
                "you already have {} event streams open (the limit per user); close one and retry",
                self.slots.per_user
            ),
        })?;
        crate::metrics::stream_opened();
        Ok(StreamPermit { _slot: slot })
    }

    /// Streams `user_id` has open now.
    pub fn open(&self, user_id: &str) -> usize {
        self.slots.held(user_id)
    }
}

/// One open stream of a user; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamPermit {
    _slot: UserSlot,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        crate::metrics::stream_closed();
        release_memory();
    }
}

/// Counts each user's turns in progress (see the module docs).
#[derive(Debug)]
pub struct TurnLimiter {
    slots: Arc<PerUserLimit>,
}

impl TurnLimiter {
    /// A limiter allowing `per_user` turns in progress per user (at least 1).
    pub fn new(per_user: usize) -> Arc<Self> {
        Arc::new(Self { slots: PerUserLimit::new(per_user) })
    }

    /// A place for one more turn of `user_id` — to be held until the turn is stored —
    /// waiting up to `wait` for one to free (zero: not at all), or 429 `too_many_turns` when
    /// the user still has the maximum in progress.
    pub async fn acquire(&self, user_id: &str, wait: Duration) -> Result<UserSlot> {
        self.slots.take_within(user_id, wait).await.ok_or_else(|| Error::TooManyRequests {
            code: ErrorCode::TooManyTurns,
            message: format!(
                "you already have {} turns in progress (the limit per user); retry when one has its exposure",
                self.slots.per_user
            ),
        })
    }

    /// Turns `user_id` has in progress now.
    pub fn in_progress(&self, user_id: &str) -> usize {
        self.slots.held(user_id)
    }
}

/// Admits work of many users to a fixed number of places (the cores that rank turns), one
/// user at a time.
///
/// While a place is free, [`FairPool::admit`] answers at once. Otherwise the request waits in
/// its user's queue, and each freed place goes to the user at the head of the rotation (the
/// users with work waiting, in the order they started waiting), who then goes to its back:
/// round-robin between users, first come first served within a user — the scheduling of
/// Nagle's fair queuing ("On packet switches with infinite storage", IEEE Trans. Commun.
/// 35(4), 1987) with equal-cost jobs. One user's 8 waiting rankings therefore hold back another
/// user's one by at most the rankings already running, not by all 8.
#[derive(Debug)]
pub struct FairPool {
    state: Mutex<FairState>,
}

#[derive(Debug)]
struct FairState {
    /// Places not held.
    free: usize,
    /// Each user's waiting requests, oldest first (only users with at least one).
    waiting: HashMap<String, VecDeque<tokio::sync::oneshot::Sender<Admission>>>,
    /// The users of `waiting`, next to be served first.
    rotation: VecDeque<String>,
}

impl FairPool {
    /// A pool of `places` places (at least 1).
    pub fn new(places: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(FairState { free: places.max(1), waiting: HashMap::new(), rotation: VecDeque::new() }),
        })
    }

    /// A pool of one place per core this process may use
    /// ([`std::thread::available_parallelism`], which follows cgroup CPU quotas).
    pub fn per_core() -> Arc<Self> {
        Self::new(std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
    }

    /// A place for `user_id`, once it is this user's turn (see the type's docs). The place is
    /// held until the [`Admission`] is dropped. A request dropped while waiting gives up its
    /// turn.
    pub async fn admit(self: &Arc<Self>, user_id: &str) -> Admission {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut s = self.state.lock();
            if s.free > 0 {
                s.free -= 1;
                return Admission { pool: Some(self.clone()) };
            }
            match s.waiting.get_mut(user_id) {
                Some(queue) => {
                    // Requests of this user that went away leave, so that a user who sends
                    // requests and hangs up cannot grow the queue while every place is busy.
                    queue.retain(|w| !w.is_closed());
                    queue.push_back(tx);
                }
                None => {
                    s.waiting.insert(user_id.to_owned(), VecDeque::from([tx]));
                    s.rotation.push_back(user_id.to_owned());
                }
            }
        }
        // The sender is only dropped after its admission was sent (or by a pool that no
        // longer exists, which cannot hold anyone back).
        rx.await.unwrap_or_else(|_| Admission { pool: None })
    }

    /// Places not held now.
    pub fn free(&self) -> usize {
        self.state.lock().free
    }

    /// Gives a freed place to the next waiting user, or back to the pool.
    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut s = self.state.lock();
                let Some(user) = s.rotation.pop_front() else {
                    s.free += 1;
                    return;
                };
                let Some(queue) = s.waiting.get_mut(&user) else { continue };
                let next = queue.pop_front();
                if queue.is_empty() {
                    s.waiting.remove(&user);
                } else {
                    s.rotation.push_back(user);
                }
                next
            };
            // Sent outside the lock: an admission that cannot be delivered is dropped here,
            // and dropping one takes the lock.
            if let Some(tx) = next {
                match tx.send(Admission { pool: Some(self.clone()) }) {
                    Ok(()) => return,
                    // The request went away while waiting: the place goes to the next one.
                    Err(mut undelivered) => undelivered.pool = None,
                }
            }
        }
    }
}

/// One place of a [`FairPool`]; dropping it hands the place on.
#[derive(Debug)]
pub struct Admission {
    pool: Option<Arc<FairPool>>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.release();
        }
    }
}

/// Hands freed heap memory back to the operating system, at most once a second: the call is
/// debounced so that a thousand clients leaving at once cost one trim, made a second after
/// the last of them. A no-op where the allocator is not glibc's.
///
/// `MIRA_MALLOC_TRIM=0` turns it off (the reference of `mira bench sse`).
pub fn release_memory() {
    static PENDING: AtomicBool = AtomicBool::new(false);
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ENABLED.get_or_init(|| std::env::var("MIRA_MALLOC_TRIM").map_or(true, |v| v != "0")) {
        return;
    }
    if PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        PENDING.store(false, Ordering::Release);
        return;
    };
    runtime.spawn(async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        PENDING.store(false, Ordering::Release);
        trim();
    });
}

/// Arenas glibc's malloc may use (its default is 8 per core): each thread that allocates gets
/// an arena, and blocks freed in one arena serve only that arena's threads, so under
/// sustained load from many threads (tokio workers, blocking-pool threads, SQLite workers)
/// free memory piles up in arenas that the next allocation does not use.
const MALLOC_ARENAS_PER_CORE: usize = 1;

/// Blocks of at least this many bytes are mapped separately and unmapped when freed. A fixed
/// value turns off glibc's sliding threshold, which after the first large block is freed
/// (an exposure read from the store, a JSON body) takes blocks up to 32 MiB from the arenas,
/// where they fragment them.
const MALLOC_MMAP_THRESHOLD: i32 = 256 * 1024;

/// Sets glibc malloc's arena count (one per core, at least 2) and a fixed mmap threshold
/// (256 KiB) before any thread starts, so that memory freed under sustained load is reused or
/// returned instead of accumulating in per-thread arenas (compare with `mira bench soak` and
/// `MIRA_MALLOC_TUNE=0`).
/// Call first thing in `main`. Left alone when the environment already tunes malloc
/// (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`) or `MIRA_MALLOC_TUNE=0`;
/// a no-op where the allocator is not glibc's.
pub fn tune_allocator() {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    if std::env::var("MIRA_MALLOC_TUNE").is_ok_and(|v| v == "0")
        || ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"].iter().any(|v| set(v))
    {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let arenas = i32::try_from((cores * MALLOC_ARENAS_PER_CORE).max(2)).unwrap_or(i32::MAX);
    set_malloc_options(arenas, MALLOC_MMAP_THRESHOLD);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_malloc_options(arenas: i32, mmap_threshold: i32) {
    // SAFETY: mallopt only changes glibc malloc's parameters; it is thread-safe and has no
    // preconditions (called before other threads exist anyway).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap_threshold);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_malloc_options(_arenas: i32, _mmap_threshold: i32) {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks glibc's own arenas; it is thread-safe and has no
    // preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// A TCP listener serving at most `max_connections` connections at once, each closed after
/// `idle` without traffic (see the module docs).
pub struct LimitedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
}

impl LimitedListener {
    /// Wraps `inner`.
    pub fn new(inner: TcpListener, max_connections: usize, idle: Duration) -> Self {
        Self { inner, slots: Arc::new(Semaphore::new(max_connections.max(1))), idle }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // Wait for a free slot before accepting: a client over the limit waits in the backlog.
        // The semaphore is never closed; were it, connections would be served unlimited.
        let permit = self.slots.clone().acquire_owned().await.ok();
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let _ = stream.set_nodelay(true);
        let io = LimitedIo {
            inner: stream,
            idle: self.idle,
            last: Instant::now(),
            timer: Box::pin(tokio::time::sleep(self.idle)),
            _permit: permit,
        };
        (io, addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The TCP peer of a connection of [`LimitedListener`], as the server's connect info
/// (`axum::extract::ConnectInfo<PeerAddr>`): what the enrollment attempt limit keys on.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, LimitedListener>> for PeerAddr {
    fn connect_info(stream: axum::serve::IncomingStream<'_, LimitedListener>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

/// A connection of [`LimitedListener`]: holds its slot until dropped and reports end of
/// stream once it has been idle too long.
pub struct LimitedIo {
    inner: TcpStream,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl LimitedIo {
    /// True when the connection has been idle for `idle`; otherwise arms the timer for the
    /// moment it would be, so the task is woken then.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let deadline = self.last + self.idle;
            if Instant::now() >= deadline {
                return true;
            }
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }
}

impl Drop for LimitedIo {
    fn drop(&mut self) {
        release_memory();
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.idle_expired(cx) => Poll::Ready(Ok(())), // end of stream
            other => other,
        }
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.idle_expired(cx) => {
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading")))
            }
            other => other,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.idle_expired(cx) => {
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading")))
            }
            other => other,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_user_holds_at_most_their_places_and_gets_them_back() {
        let limit = PerUserLimit::new(2);
        let a1 = limit.try_take("a").unwrap();
        let _a2 = limit.try_take("a").unwrap();
        assert!(limit.try_take("a").is_none(), "a third place for a");
        assert!(limit.is_full("a"));
        assert_eq!(limit.full(), users(&["a"]));
        let b = limit.try_take("b").unwrap();
        assert_eq!(b.user_id(), "b");
        drop(a1);
        assert!(limit.full().is_empty());
        assert_eq!(limit.held("a"), 1);
    }

    #[test]
    fn a_prefix_stops_at_the_first_entry_past_its_users_places() {
        let limit = PerUserLimit::new(2);
        let _held = limit.try_take("a").unwrap();
        let taken = limit.take_prefix(&users(&["b", "a", "b", "a", "c"]), 10);
        let got: Vec<&str> = taken.iter().map(UserSlot::user_id).collect();
        assert_eq!(got, ["b", "a", "b"], "a's second entry is past a's places");
        assert_eq!(limit.held("a"), 2);
        drop(taken);
        assert_eq!((limit.held("a"), limit.held("b")), (1, 0));
        assert_eq!(limit.take_prefix(&users(&["c", "c", "c"]), 2).len(), 2, "no more than n");
        assert_eq!(limit.held("c"), 0, "dropped places are given back");
    }

    #[tokio::test]
    async fn turns_are_limited_per_user_and_freed_when_dropped() {
        let now = Duration::ZERO;
        let turns = TurnLimiter::new(2);
        let a1 = turns.acquire("a", now).await.unwrap();
        let _a2 = turns.acquire("a", now).await.unwrap();
        let refused = turns.acquire("a", now).await.unwrap_err();
        assert!(matches!(refused, Error::TooManyRequests { code: ErrorCode::TooManyTurns, .. }), "{refused:?}");
        let _b = turns.acquire("b", now).await.expect("another user's turns are their own");
        assert_eq!((turns.in_progress("a"), turns.in_progress("b")), (2, 1));
        drop(a1);
        assert_eq!(turns.in_progress("a"), 1);
        let a3 = turns.acquire("a", now).await.expect("a freed place is taken again");
        assert!(TurnLimiter::new(0).acquire("c", now).await.is_ok(), "a limit of 0 allows one");
        // A waiting acquire gets the place freed meanwhile; one that waits in vain is refused.
        let freer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(a3);
        });
        let started = Instant::now();
        let _a4 = turns.acquire("a", Duration::from_secs(10)).await.expect("the place freed meanwhile");
        assert!(started.elapsed() < Duration::from_secs(5), "woken when the place was freed, not at the deadline");
        freer.await.unwrap();
        assert!(turns.acquire("a", Duration::from_millis(50)).await.is_err());
    }

    #[tokio::test]
    async fn the_fair_pool_takes_users_in_turn() {
        let pool = FairPool::new(1);
        let held = pool.admit("a").await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        // Current-thread runtime: each spawned waiter queues at the yield after it.
        for label in ["a1", "a2", "a3", "b1"] {
            let (pool, order) = (pool.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _place = pool.admit(&label[..1]).await;
                order.lock().push(label);
                tokio::task::yield_now().await;
            }));
            tokio::task::yield_now().await;
        }
        // A waiter that goes away gives up its turn, not the place.
        let gone = tokio::spawn({
            let pool = pool.clone();
            async move { pool.admit("c").await }
        });
        tokio::task::yield_now().await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        assert_eq!(pool.free(), 0);
        drop(held);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock(), ["a1", "b1", "a2", "a3"], "b's one request is not behind all of a's");
        assert_eq!(pool.free(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_fair_pool_never_holds_more_than_its_places_and_loses_none() {
        let pool = FairPool::new(2);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..400 {
            let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let user = format!("u{}", i % 5);
                // Some give up while waiting.
                let admitted = tokio::time::timeout(Duration::from_micros(200 * (i % 7)), pool.admit(&user)).await;
                if let Ok(_place) = admitted {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(100)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 2, "{} at once", most.load(Ordering::SeqCst));
        assert_eq!(pool.free(), 2, "every place came back");
        assert!(pool.state.lock().rotation.is_empty());
    }
}
