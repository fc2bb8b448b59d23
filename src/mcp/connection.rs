//! One supervisor task per server: connect, discover, watch, reconnect.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientRequest, CustomRequest, Implementation, InitializeRequestParams,
    ProgressNotificationParam, ProtocolVersion,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, ServiceExt};
use rmcp::{ClientHandler, ServiceError};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::config::{self, Resolved};
use super::stdio::{self, LineFacts, StderrTail};
use super::{Control, McpManager, ServerSlot};
use crate::events::EventKind;
use crate::state::McpConnectionState;
use crate::store::OwnerClaim;

/// Protocol version this client asks for. The server answers with the version it speaks;
/// that negotiated version is what gets recorded.
pub const CLIENT_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// A live connection.
#[derive(Clone)]
pub struct Live {
    /// Sends requests.
    pub peer: Peer<RoleClient>,
    /// The stdout guard's observations (stdio only).
    pub facts: Option<Arc<LineFacts>>,
    /// The stderr tail (stdio only).
    pub stderr: Option<Arc<StderrTail>>,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// Cancels the connection.
    pub ct: CancellationToken,
    /// Reports transport trouble (a failed request, a broken stream) to the supervisor, which
    /// checks the server at once and marks the connection lost when it does not answer.
    pub trouble: mpsc::UnboundedSender<String>,
    /// This connection's part of its calls' progress route keys ([`progress_key`]).
    pub routes: Arc<str>,
}

/// The key of a call's progress route: the connection (server id and a number unique in the
/// process) and the progress token's JSON. rmcp numbers progress tokens per connection from
/// 0, so the token alone would let one server's notifications reach another's calls.
pub(crate) fn progress_key(routes: &str, token_json: &str) -> String {
    format!("{routes}\n{token_json}")
}

/// Most redirects an HTTP MCP server's responses may lead through (each checked by
/// [`crate::net::redirect_policy`]: never to an internal address for a user's server).
const MAX_REDIRECTS: usize = 5;

/// Numbers the connections of this process ([`Live::routes`]).
static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The rmcp client handler: list_changed wakes re-discovery; progress becomes run events (as
/// many as the call's [`super::ProgressRoute`] admits; an event says how many notifications
/// were `skipped` before it).
struct Handler {
    /// Signalled on `notifications/tools/list_changed`. A [`Notify`] holds at most one
    /// pending signal, so any number of notifications before the supervisor looks are one.
    tools_changed: Arc<Notify>,
    manager: std::sync::Weak<McpManager>,
    /// The connection's part of progress route keys ([`Live::routes`]).
    routes: Arc<str>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let Some(manager) = self.manager.upgrade() else { return };
        let key = progress_key(&self.routes, &serde_json::to_string(&params.progress_token).unwrap_or_default());
        let (route, skipped) = {
            let mut routes = manager.progress.lock();
            let Some(route) = routes.get_mut(&key) else { return };
            let Some(skipped) = route.admit(std::time::Instant::now()) else { return };
            (route.clone(), skipped)
        };
        let message = params.message.as_deref().map(|m| &m[..m.floor_char_boundary(super::MAX_PROGRESS_MESSAGE_BYTES)]);
        let mut data = json!({
            "invocation_id": route.invocation_id, "tool_id": route.tool_id,
            "progress": params.progress, "total": params.total, "message": message,
        });
        if skipped > 0 {
            data["skipped"] = json!(skipped);
        }
        let write = async {
            let mut tx = manager.store().begin_write().await?;
            // Only while the invocation runs: a late notice of an execution whose lease was
            // taken over (it ended `interrupted`) adds nothing after its end.
            if !tx.invocation_still_running(&route.invocation_id).await? {
                return Ok(());
            }
            tx.append_event(&route.run_id, EventKind::ExecutionProgress, &data).await?;
            tx.commit().await
        };
        if let Err(e) = write.await {
            tracing::warn!(invocation = %route.invocation_id, error = %e, "storing a progress event failed");
        }
    }

    fn get_info(&self) -> InitializeRequestParams {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("mira-tool-runtime", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(CLIENT_PROTOCOL_VERSION)
    }
}

/// Why a connection ended.
enum End {
    Lost(String),
    Disabled,
    Removed,
    Shutdown,
    /// Another replica holds the stdio server now.
    Released,
}

/// The supervisor loop of one server (see the module docs of [`super`]).
pub(super) async fn supervise(
    manager: Arc<McpManager>,
    slot: Arc<ServerSlot>,
    mut rx: mpsc::UnboundedReceiver<Control>,
) {
    let shutdown = manager.shutdown_token().clone();
    let settings = manager.settings().clone();
    let mut backoff = settings.backoff_min;
    // Set by an explicit connect until the next claim: only then may a stdio server held by
    // a gone replica be taken over.
    let mut explicit = false;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        if !slot.state.read().row.enabled {
            tokio::select! {
                () = shutdown.cancelled() => return,
                c = rx.recv() => match c {
                    None | Some(Control::Remove) => return,
                    Some(Control::Discover(reply)) => { let _ = reply.send(Err(super::discovery::DiscoveryError::Disabled)); }
                    Some(Control::Reconsider | Control::Connect | Control::Release) => { backoff = settings.backoff_min; }
                },
            }
            continue;
        }
        // A stdio process runs on one replica: claim it first, else follow its owner.
        let how = if explicit { OwnerClaim::Explicit } else { OwnerClaim::Automatic };
        explicit = false;
        let claimed = manager.claim(&slot, how).await;
        if !matches!(claimed, Ok(true)) {
            if let Err(e) = &claimed {
                tracing::warn!(server = %slot.id, error = %e, "claiming the stdio MCP server failed");
            }
            // Retried on the next control message (a refresh tells of changes), or after the
            // backoff when the claim itself failed.
            let retry = if claimed.is_err() { backoff } else { Duration::from_secs(3600) };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
                c = rx.recv() => match c {
                    None | Some(Control::Remove) => return,
                    Some(Control::Discover(reply)) => { let _ = reply.send(Err(super::discovery::DiscoveryError::NotConnected)); }
                    Some(Control::Connect) => explicit = true,
                    Some(Control::Reconsider | Control::Release) => {}
                },
            }
            continue;
        }
        let mut conn = slot.state.read().conn.clone();
        conn.state = McpConnectionState::Connecting;
        conn.attempts += 1;
        manager.save_conn(&slot, conn).await;
        let tools_changed = Arc::new(Notify::new());
        let (trouble_tx, mut trouble_rx) = mpsc::unbounded_channel();
        let routes: Arc<str> =
            format!("{}#{}", slot.id, CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).into();
        let handler = Handler { tools_changed: tools_changed.clone(), manager: Arc::downgrade(&manager), routes };
        let attempt = tokio::time::timeout(settings.connect_timeout, connect(&manager, &slot, handler, trouble_tx));
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return,
            r = attempt => r.unwrap_or_else(|_| Err((format!("no initialize response within {} s", settings.connect_timeout.as_secs()), None))),
        };
        match outcome {
            Ok((running, live, mut child)) => {
                let up_since = tokio::time::Instant::now();
                let info = live.peer.peer_info();
                let mut conn = slot.state.read().conn.clone();
                conn.state = McpConnectionState::Connected;
                conn.protocol_version = Some(live.protocol_version.clone());
                conn.server_info = info.as_ref().and_then(|i| serde_json::to_string(&i.server_info).ok());
                conn.capabilities = info.as_ref().and_then(|i| serde_json::to_string(&i.capabilities).ok());
                conn.last_error = None;
                conn.stderr_tail = None;
                conn.attempts = 0;
                conn.connected_at = Some(crate::ids::now());
                *slot.live.lock() = Some(live.clone());
                manager.save_conn(&slot, conn).await;
                if let Err(e) = super::discovery::run(&manager, &slot, &live).await {
                    tracing::warn!(server = %slot.id, error = %e, "discovery after connect failed");
                }
                // Trouble seen during the handshake and first discovery is old news.
                while trouble_rx.try_recv().is_ok() {}
                let channels = Channels { control: &mut rx, tools_changed: &tools_changed, trouble: &mut trouble_rx };
                let end = watch(&manager, &slot, running, &live, channels, child.as_mut(), &shutdown).await;
                // Only a connection that stayed up resets the backoff: a server that completes
                // the handshake and dies at once is retried ever more slowly, not every 0.5 s
                // with a discovery each time.
                if up_since.elapsed() >= settings.backoff_max {
                    backoff = settings.backoff_min;
                }
                // From here on the tools are unavailable, and the connection says why at once;
                // the stored row (with the exit status and stderr) follows below.
                *slot.live.lock() = None;
                if let End::Lost(why) = &end {
                    let mut s = slot.state.write();
                    s.conn.state = McpConnectionState::Failed;
                    s.conn.last_error = Some(why.clone());
                }
                let exit = match child {
                    Some(mut c) => {
                        let status = tokio::time::timeout(Duration::from_millis(500), c.child.wait()).await;
                        drop(c);
                        match status {
                            Ok(Ok(s)) => Some(format!("the process exited with {s}")),
                            _ => None,
                        }
                    }
                    None => None,
                };
                let mut conn = slot.state.read().conn.clone();
                conn.stderr_tail = live.stderr.as_ref().map(|s| s.text()).filter(|t| !t.is_empty());
                match end {
                    End::Shutdown => {
                        conn.state = McpConnectionState::Disconnected;
                        conn.last_error = Some("the runtime stopped".into());
                        manager.save_conn(&slot, conn).await;
                        return;
                    }
                    End::Removed => return,
                    End::Released => {
                        tracing::warn!(server = %slot.id, "another replica holds this stdio MCP server now; disconnected here");
                        continue;
                    }
                    End::Disabled => {
                        conn.state = McpConnectionState::Disconnected;
                        conn.last_error = Some("the server was disabled".into());
                        manager.save_conn(&slot, conn).await;
                        continue;
                    }
                    End::Lost(why) => {
                        conn.state = McpConnectionState::Failed;
                        conn.last_error = Some(match exit {
                            Some(exit) => format!("{why}; {exit}"),
                            None => why,
                        });
                        manager.save_conn(&slot, conn).await;
                    }
                }
            }
            Err((why, stderr)) => {
                let mut conn = slot.state.read().conn.clone();
                conn.state = McpConnectionState::Failed;
                conn.last_error = Some(why);
                conn.stderr_tail = stderr.map(|s| s.text()).filter(|t| !t.is_empty());
                manager.save_conn(&slot, conn).await;
            }
        }
        // Wait before the next attempt, unless told to connect now.
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut sleep => break,
                c = rx.recv() => match c {
                    None | Some(Control::Remove) => return,
                    Some(Control::Discover(reply)) => { let _ = reply.send(Err(super::discovery::DiscoveryError::NotConnected)); }
                    Some(Control::Reconsider | Control::Release) => { backoff = settings.backoff_min; break; }
                    Some(Control::Connect) => { backoff = settings.backoff_min; explicit = true; break; }
                },
            }
        }
        backoff = (backoff * 2).min(settings.backoff_max);
    }
}

type Running = rmcp::service::RunningService<RoleClient, Handler>;
type ConnectError = (String, Option<Arc<StderrTail>>);

async fn connect(
    manager: &McpManager,
    slot: &ServerSlot,
    handler: Handler,
    trouble: mpsc::UnboundedSender<String>,
) -> Result<(Running, Live, Option<stdio::ChildGuard>), ConnectError> {
    let row = slot.state.read().row.clone();
    let cfg: serde_json::Value = serde_json::from_str(&row.config).map_err(|e| (e.to_string(), None))?;
    // `from_env` is read only for a server an admin installed (and who is still an admin).
    let allow_env = manager.store().user_is_admin(&row.installed_by).await.map_err(|e| (e.to_string(), None))?;
    let resolved = config::resolve(
        &cfg,
        row.secrets.as_deref(),
        row.secrets_key_id.as_deref(),
        manager.secrets(),
        &row.id,
        allow_env,
    )
    .map_err(|e| (e.to_string(), None))?;
    let max = manager.settings().max_message_bytes;
    let routes = handler.routes.clone();
    match resolved {
        Resolved::Stdio { command, args, env, cwd } => {
            let sandbox = match &manager.settings().sandbox {
                Some(sb) => crate::sandbox::mcp::for_stdio_server(
                    sb,
                    manager.store(),
                    &row.installed_by,
                    &manager.settings().stdio_allow,
                    &command,
                    cwd.as_deref(),
                )
                .await
                .map_err(|e| (e, None))?,
                None => None,
            };
            let proc = stdio::spawn(&command, &args, &env, cwd.as_deref(), max, sandbox)
                .map_err(|e| (format!("starting {command} failed: {e}"), None))?;
            let stderr = proc.stderr.clone();
            let facts = proc.facts.clone();
            let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(proc.stdout, proc.stdin)
                .with_max_line_length(max.saturating_add(1024));
            let mut child = proc.child;
            let ct = CancellationToken::new();
            let running = match handler.serve_with_ct(transport, ct.clone()).await {
                Ok(r) => r,
                Err(e) => {
                    // Give a crashing process a moment to finish writing its stderr.
                    let status = tokio::time::timeout(Duration::from_millis(500), child.child.wait()).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let exit = match status {
                        Ok(Ok(s)) => format!(" ({s})"),
                        _ => String::new(),
                    };
                    return Err((format!("the initialize handshake failed: {e}{exit}"), Some(stderr)));
                }
            };
            let live = live_of(&running, Some(facts), Some(stderr), ct, trouble, routes);
            Ok((running, live, Some(child)))
        }
        Resolved::Http { url, headers } => {
            use rmcp::transport::streamable_http_client::{
                StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
            };
            let mut map = HashMap::new();
            for (k, v) in headers {
                let name = axum::http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| (e.to_string(), None))?;
                let value = axum::http::HeaderValue::from_str(&v).map_err(|e| (e.to_string(), None))?;
                map.insert(name, value);
            }
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
            config.max_json_response_size = max;
            config.max_sse_event_size = max;
            let rule = if allow_env || manager.settings().allow_internal_urls {
                crate::net::AddressRule::Any
            } else {
                crate::net::AddressRule::PublicOnly
            };
            let client = crate::net::with_rule(crate::net::client_builder(), rule)
                .redirect(crate::net::redirect_policy(MAX_REDIRECTS, rule))
                .connect_timeout(manager.settings().connect_timeout)
                .build()
                .map_err(|e| (e.to_string(), None))?;
            let client = super::watched_http::WatchedClient::new(client, trouble.clone());
            let transport = StreamableHttpClientTransport::with_client(client, config);
            let ct = CancellationToken::new();
            let running = handler
                .serve_with_ct(transport, ct.clone())
                .await
                .map_err(|e| (format!("the initialize handshake with {url} failed: {e}"), None))?;
            let live = live_of(&running, None, None, ct, trouble, routes);
            Ok((running, live, None))
        }
    }
}

fn live_of(
    running: &Running,
    facts: Option<Arc<LineFacts>>,
    stderr: Option<Arc<StderrTail>>,
    ct: CancellationToken,
    trouble: mpsc::UnboundedSender<String>,
    routes: Arc<str>,
) -> Live {
    let peer = running.peer().clone();
    let protocol_version = peer.peer_info().map(|i| i.protocol_version.to_string()).unwrap_or_default();
    Live { peer, facts, stderr, protocol_version, ct, trouble, routes }
}

/// What a connected supervisor listens to besides the transport.
struct Channels<'a> {
    control: &'a mut mpsc::UnboundedReceiver<Control>,
    tools_changed: &'a Notify,
    trouble: &'a mut mpsc::UnboundedReceiver<String>,
}

/// How long a server may take to answer a periodic health `ping` (whatever its request
/// timeout: the supervisor waits for it, and with it for removal or disabling).
const HEALTH_PING: Duration = Duration::from_secs(10);

/// How long a server may take to answer the `ping` that checks it after transport trouble.
const TROUBLE_PING: Duration = Duration::from_secs(3);

/// Watches a live connection until it ends. Loss is noticed when it happens: the transport
/// closing (stdio EOF), the stdio process exiting (even if a child of it still holds the
/// pipes), or transport trouble (a failed HTTP request or broken stream, a call that lost
/// the connection) confirmed by a failing `ping`; the periodic health check catches the rest.
async fn watch(
    manager: &Arc<McpManager>,
    slot: &Arc<ServerSlot>,
    running: Running,
    live: &Live,
    ch: Channels<'_>,
    child: Option<&mut stdio::ChildGuard>,
    shutdown: &CancellationToken,
) -> End {
    let Channels { control: rx, tools_changed, trouble } = ch;
    // Re-discovery after list_changed: at most one per `rediscovery_interval` since the last
    // discovery (the one after connecting counts), however many notifications a server sends;
    // notifications meanwhile make one more when the interval is over. A discovery asked for
    // through the API waits for the interval too.
    let interval = manager.settings().rediscovery_interval;
    let mut last_discovery = tokio::time::Instant::now();
    let mut rediscovery_due: Option<tokio::time::Instant> = None;
    let ct = live.ct.clone();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let exited = async move {
        match child {
            Some(c) => c.child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    let mut health = tokio::time::interval(manager.settings().health_interval);
    health.tick().await;
    let stop = |end: End| {
        ct.cancel();
        end
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return stop(End::Shutdown),
            quit = &mut waiting => {
                return End::Lost(match quit {
                    Ok(reason) => format!("the connection closed ({reason:?})"),
                    Err(e) => format!("the connection task failed: {e}"),
                });
            }
            status = &mut exited => {
                return stop(End::Lost(format!("the server process exited ({status})")));
            }
            why = trouble.recv() => {
                let Some(mut why) = why else { continue };
                // One check for a burst of reports.
                while let Ok(more) = trouble.try_recv() {
                    if why.len() < 512 {
                        why = format!("{why}; {more}");
                    }
                }
                match tokio::time::timeout(TROUBLE_PING, request(live, slot, "ping", None)).await {
                    Ok(Ok(_)) => tracing::info!(server = %slot.id, trouble = %why, "transport trouble, but the server answers ping"),
                    Ok(Err(e)) => return stop(End::Lost(format!("{why}; ping failed: {e}"))),
                    Err(_) => return stop(End::Lost(format!("{why}; no answer to ping within {} s", TROUBLE_PING.as_secs()))),
                }
            }
            () = tools_changed.notified(), if rediscovery_due.is_none() => {
                rediscovery_due = Some((last_discovery + interval).max(tokio::time::Instant::now()));
            }
            () = sleep_until_due(rediscovery_due) => {
                rediscovery_due = None;
                if let Err(e) = super::discovery::run(manager, slot, live).await {
                    tracing::warn!(server = %slot.id, error = %e, "re-discovery after list_changed failed");
                }
                last_discovery = tokio::time::Instant::now();
            }
            c = rx.recv() => match c {
                None | Some(Control::Remove) => return stop(End::Removed),
                Some(Control::Reconsider | Control::Connect) => {
                    if !slot.state.read().row.enabled {
                        return stop(End::Disabled);
                    }
                }
                Some(Control::Release) => return stop(End::Released),
                Some(Control::Discover(reply)) => {
                    // Asked for (`POST …/discover`): no sooner than the interval after the last.
                    tokio::time::sleep_until(last_discovery + interval).await;
                    let _ = reply.send(super::discovery::run(manager, slot, live).await);
                    last_discovery = tokio::time::Instant::now();
                    // A re-discovery already due waits for the interval after this one.
                    rediscovery_due = rediscovery_due.map(|due| due.max(last_discovery + interval));
                }
            },
            _ = health.tick() => {
                match tokio::time::timeout(HEALTH_PING, request(live, slot, "ping", None)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return stop(End::Lost(format!("health check failed: {e}"))),
                    Err(_) => return stop(End::Lost(format!("health check failed: no answer to ping within {} s", HEALTH_PING.as_secs()))),
                }
            }
        }
    }
}

/// Sleeps until `due`; never wakes without one.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends a request by method name and returns the raw result document, so that one
/// malformed part of a reply never makes the whole reply unreadable.
pub(crate) async fn request(
    live: &Live,
    slot: &ServerSlot,
    method: &str,
    params: Option<serde_json::Value>,
) -> Result<serde_json::Value, ServiceError> {
    let timeout = Duration::from_millis(u64::try_from(slot.state.read().row.request_timeout_ms).unwrap_or(60_000));
    let req = ClientRequest::CustomRequest(CustomRequest::new(method, params));
    let handle = live.peer.send_request_with_option(req, PeerRequestOptions::with_timeout(timeout)).await?;
    let id_json = serde_json::to_string(&handle.id).unwrap_or_default();
    let result = handle.await_response().await;
    // The stdout guard may have noted this response's id; only calls read those notes.
    if let Some(facts) = &live.facts {
        facts.repaired.lock().remove(&id_json);
        facts.oversized.lock().remove(&id_json);
    }
    serde_json::to_value(result?).map_err(|_| ServiceError::UnexpectedResponse)
}
