//! Assembling and running the service: store, registry, harness, HTTP, graceful shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::config::RuntimeConfig;
use crate::embedding::Embeddings;
use crate::events::EventBus;
use crate::exposure::hybrid::{IndexRanker, Mode};
use crate::exposure::index::ToolIndex;
use crate::harness::{Harness, HarnessLimits, LocalExecutor};
use crate::registry::Registry;
use crate::store::Store;

/// Everything needed to start a server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to bind (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Data folder (SQLite file, admin token, node id).
    pub data_dir: PathBuf,
    /// Database URL.
    pub database_url: String,
    /// Default workspace folder.
    pub workspace: PathBuf,
    /// Chain settings.
    pub runtime: RuntimeConfig,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// Request timeout for non-streaming routes.
    pub request_timeout: Duration,
}

/// A running server.
pub struct Server {
    /// The bound address.
    pub addr: SocketAddr,
    /// The application context (tests register extra tools through it).
    pub app: App,
    /// Path of the bootstrap admin token file, when this start created the admin.
    pub admin_token_file: Option<PathBuf>,
    http: tokio::task::JoinHandle<std::io::Result<()>>,
    harness: tokio::task::JoinHandle<()>,
    indexer: tokio::task::JoinHandle<()>,
}

/// Opens the store and applies migrations.
pub async fn open_store(data_dir: &Path, url: &str) -> anyhow::Result<Store> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let store = Store::connect(url, EventBus::new())
        .await
        .with_context(|| format!("connecting to {}", crate::store::redact_url(url)))?;
    store.migrate().await.context("applying migrations")?;
    store.warn_without_autovacuum().await;
    Ok(store)
}

/// [`open_store`], retrying for up to `wait` while the database cannot be reached (each
/// failure logged with the next attempt's delay); then the last error.
pub async fn open_store_waiting(data_dir: &Path, url: &str, wait: Duration) -> anyhow::Result<Store> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut delay = Duration::from_millis(250);
    loop {
        match open_store(data_dir, url).await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() + delay < deadline && unreachable_database(&e) => {
                tracing::warn!(error = %format!("{e:#}"), retry_in_ms = delay.as_millis() as u64,
                    "the database cannot be reached; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether opening the store failed because the database could not be reached (worth a
/// retry), not because of a bad URL or a failed migration.
fn unreachable_database(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<crate::store::StoreError>(),
            Some(crate::store::StoreError::Db(
                sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_)
            ))
        ) || matches!(c.downcast_ref::<crate::store::StoreError>(),
                Some(crate::store::StoreError::Db(e @ (sqlx::Error::Io(_) | sqlx::Error::Tls(_)))) if !tls_refused(e))
            || matches!(c.downcast_ref::<crate::store::StoreError>(), Some(crate::store::StoreError::Db(sqlx::Error::Database(d))) if d.code().is_some_and(|c| c.starts_with("57P") || c == "08006" || c == "08001"))
    })
}

/// A TLS failure that waiting cannot cure: the server's certificate was refused (unknown
/// issuer, a name it does not cover, expired: rustls reports it inside an I/O error) or the
/// CA file (`sslrootcert`) cannot be read. A refused or reset connection stays retryable.
fn tls_refused(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(io) => {
            matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
                || io.get_ref().is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        }
        sqlx::Error::Tls(inner) => {
            let text = inner.to_string().to_lowercase();
            ["certificate", "no such file", "permission denied", "pem"].iter().any(|w| text.contains(w))
        }
        _ => false,
    }
}

/// Builds the application around a migrated store: registers the core tools, opens the
/// default workspace, recovers invocations a previous incarnation left running, and sets
/// up hybrid exposure ranking over the tool index (the model loads once serving starts,
/// see [`crate::embedding::worker`]).
pub async fn build(settings: &Settings, store: Store) -> anyhow::Result<App> {
    let shutdown = CancellationToken::new();
    let registry = Arc::new(Registry::new());
    let config = Arc::new(settings.runtime.clone());
    let node_id = node_id(&settings.data_dir)?;
    // No tool opens the data dir, even where it lies inside a workspace.
    crate::workspace::reserve(&settings.data_dir)
        .with_context(|| format!("reserving data dir {}", settings.data_dir.display()))?;
    let sandbox = {
        let (cfg, dir, url, node) = (
            settings.runtime.sandbox.clone(),
            settings.data_dir.clone(),
            settings.database_url.clone(),
            node_id.clone(),
        );
        tokio::task::spawn_blocking(move || crate::sandbox::Sandbox::new(cfg, &dir, &url, &node))
            .await
            .context("probing the sandbox")?
    };
    let attached = crate::tools::browser::attached::AttachedBrowsers::new();
    let connections = crate::connections::ConnectionHub::new(
        store.clone(),
        crate::secret::SecretBox::load(&settings.data_dir),
        crate::tools::connection_drivers(&attached),
        config.connections,
        Duration::from_secs(config.search.state_refresh_secs.max(1)),
        config.allow_internal_urls,
    );
    let deps = crate::tools::ToolDeps {
        connections: connections.clone(),
        allow_internal_urls: config.allow_internal_urls,
        store: store.clone(),
        data_dir: settings.data_dir.clone(),
        shutdown: shutdown.clone(),
        search: config.search.clone(),
        terminal: config.terminal.clone(),
        browser: config.browser.clone(),
        attached: attached.clone(),
        node_id,
        sandbox: sandbox.clone(),
    };
    let core = crate::tools::register_core(&registry, &deps).context("registering core tools")?;
    connections.start(shutdown.clone()).await;
    let mcp_settings = crate::mcp::McpSettings {
        sandbox: Some(sandbox.clone()),
        allow_internal_urls: config.allow_internal_urls,
        ..settings.runtime.mcp.clone()
    };
    let mcp = crate::mcp::McpManager::new(
        store.clone(),
        registry.clone(),
        &settings.data_dir,
        mcp_settings,
        deps.shutdown.clone(),
    )?;
    let workspace = std::fs::canonicalize(&settings.workspace)
        .with_context(|| format!("workspace {} does not exist", settings.workspace.display()))?;
    let (_, identity) = crate::workspace::open_root(&workspace)
        .map_err(|e| anyhow::anyhow!("workspace {}: {:?}", workspace.display(), e))?;
    // Every user reads the default workspace: one that holds a workspace root would show
    // everyone the private workspaces registered under that root.
    for root in &settings.runtime.workspace_roots {
        let real = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        if real.starts_with(&workspace) {
            anyhow::bail!(
                "the default workspace {} holds the workspace root {}: every user could read the private workspaces registered under it through the default one; give --workspace a folder outside every --workspace-roots entry",
                workspace.display(),
                real.display()
            );
        }
    }
    store.upsert_default_workspace(&workspace.to_string_lossy(), &identity.encode()).await?;
    adopt_root_identities(&store).await?;
    let stable = deps.node_id.clone();
    let lost = core.terminal.recover().await?;
    if lost > 0 {
        tracing::warn!(lost, "terminal sessions left running by the previous process were marked lost");
    }
    let node = format!("{stable}:{}", uuid::Uuid::now_v7().simple());
    let hard_links = if settings.runtime.allow_hard_link_reads {
        crate::workspace::HardLinks::Allow
    } else {
        crate::workspace::HardLinks::Refuse
    };
    let local = Arc::new(LocalExecutor::new(store.clone(), hard_links, &stable));
    let limits = HarnessLimits {
        concurrency: settings.runtime.execution_concurrency,
        timeout: Duration::from_secs(settings.runtime.execution_timeout_secs),
        lease: Duration::from_secs(30),
        per_user: settings.runtime.running_per_user(),
    };
    let cluster_node = Arc::new(crate::cluster::Node {
        id: stable.clone(),
        process_id: node.clone(),
        config: settings.runtime.cluster.clone(),
        execution_timeout: limits.timeout,
    });
    let cluster_executor = Arc::new(
        crate::cluster::forward::ClusterExecutor::new(local, store.clone(), cluster_node.clone())
            .context("building the cluster's HTTP client")?,
    );
    let secrets = crate::secret::SecretBox::load(&settings.data_dir)
        .map_err(|e| anyhow::anyhow!("the secret key (for the runner and bundle signing keys): {e}"))?;
    let signing = secrets.derive_seed(crate::devices::SIGNING_KEY_LABEL);
    let bundle_key = Arc::new(mira_core::remote::signing_key(&secrets.derive_seed(crate::verify::BUNDLE_KEY_LABEL)));
    let devices = Arc::new(
        crate::devices::DeviceHub::new(
            store.clone(),
            mira_core::remote::signing_key(&signing),
            settings.runtime.devices,
            cluster_node.clone(),
            registry.clone(),
        )
        .context("building the device hub's HTTP client")?,
    );
    let device_browsers: Arc<dyn crate::tools::browser::device::DeviceBrowsers> = devices.clone();
    attached.set_devices(&device_browsers);
    let device_terminal = Arc::new(crate::tools::terminal::TerminalSession::new(core.terminal.clone()));
    let executor = Arc::new(
        crate::devices::RemoteExecutor::new(cluster_executor, devices.clone(), store.clone())
            .with_terminal(device_terminal),
    );
    crate::devices::terminal::spawn_lost_sweep(store.clone(), settings.runtime.devices.lease, shutdown.clone());
    let harness = Arc::new(Harness::new(store.clone(), registry.clone(), executor, node, limits));
    let interrupted = harness.recover(&format!("{stable}:")).await?;
    crate::metrics::invocations_recovered(interrupted);
    if interrupted > 0 {
        tracing::warn!(interrupted, "invocations left running by the previous process were marked interrupted");
    }
    spawn_sweep(store.clone(), &stable, &settings.runtime, shutdown.clone());
    if let Some(policy) = settings.runtime.retention {
        tracing::info!(
            max_age_secs = policy.max_age.as_secs(),
            interval_secs = policy.interval.as_secs(),
            "retention on"
        );
        let files = vec![crate::tools::browser::screenshots_dir(&settings.data_dir)];
        crate::retention::spawn(store.clone(), policy, files, shutdown.clone());
        if store.sqlite_auto_vacuum().await?.is_some_and(|mode| mode != 2) {
            tracing::warn!(
                "this SQLite file predates auto_vacuum=INCREMENTAL: retention frees pages for reuse but the file does not shrink until it is converted once (docs/retention.md)"
            );
        }
    }
    mcp.set_node(cluster_node.clone()).context("building the cluster's HTTP client")?;
    mcp.start().await.context("loading External MCP servers")?;
    mcp.spawn_refresh();
    let embeddings = Arc::new(Embeddings::new(settings.runtime.embedding.clone(), &settings.data_dir));
    let tool_index = Arc::new(ToolIndex::new());
    let ranker = Arc::new(IndexRanker::new(tool_index.clone(), embeddings.clone(), Mode::Hybrid));
    let token_watch = crate::revocation::TokenWatch::new(store.clone(), shutdown.clone());
    Ok(App {
        store,
        registry,
        ranker,
        embeddings,
        tool_index,
        harness,
        mcp,
        config,
        shutdown,
        search: core.search,
        terminal: core.terminal,
        browser: core.browser,
        connections,
        sandbox,
        streams: crate::limits::StreamLimiter::new(settings.runtime.http.streams_per_user),
        token_watch,
        turn_limit: crate::limits::TurnLimiter::new(settings.runtime.http.turns_per_user),
        rankings: crate::limits::FairPool::per_core(),
        node: cluster_node,
        turns: Arc::default(),
        devices,
        bundle_key,
        bundle_slots: Arc::new(tokio::sync::Semaphore::new(crate::http::bundle::MAX_CONCURRENT_BUNDLES)),
        usage: Arc::default(),
    })
}

/// Records the root identity of host workspaces registered before identities were kept
/// (as found now; logged), so that every host workspace is held by identity from then on.
async fn adopt_root_identities(store: &Store) -> anyhow::Result<()> {
    let all = store.host_workspaces().await?;
    // Registrations made before a user's workspace could not overlap a deployment-wide one:
    // every user reads the latter, so the former is not private. Said at every start.
    for shared in all.iter().filter(|w| w.owner_id.is_none()) {
        let shared_path = std::path::Path::new(&shared.path);
        for own in all.iter().filter(|w| w.owner_id.is_some()) {
            let own_path = std::path::Path::new(&own.path);
            if own_path.starts_with(shared_path) || shared_path.starts_with(own_path) {
                tracing::warn!(workspace = %own.id, path = %own.path, shared = %shared.path,
                    "a user's workspace overlaps a deployment-wide one (registered before this was refused): every user reads it through the deployment-wide workspace");
            }
        }
    }
    for ws in all {
        if ws.root_identity.is_some() {
            continue;
        }
        match crate::workspace::open_root(std::path::Path::new(&ws.path)) {
            Ok((_, identity)) => {
                if store.adopt_root_identity(&ws.id, &identity.encode()).await? {
                    tracing::info!(workspace = %ws.id, path = %ws.path, identity = %identity.encode(),
                        "recorded the root identity of a workspace registered before identities were kept");
                }
            }
            Err(e) => tracing::warn!(workspace = %ws.id, path = %ws.path, error = ?e,
                "the root of a workspace registered before identities were kept cannot be opened; it stays unusable until an admin re-registers it"),
        }
    }
    Ok(())
}

/// Sweeps the Edit tools' leftovers ([`crate::workspace::sweep`]) from every host workspace
/// whose root is still the registered folder, in the background.
fn spawn_sweep(store: Store, node: &str, runtime: &RuntimeConfig, shutdown: CancellationToken) {
    let started_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or_default();
    let rule = crate::workspace::sweep::SweepRule {
        node: node.to_owned(),
        started_ms,
        min_age: Duration::from_secs(runtime.execution_timeout_secs).saturating_add(crate::workspace::sweep::MARGIN),
    };
    tokio::spawn(async move {
        let rows = match store.host_workspaces().await {
            Ok(rows) => rows,
            Err(e) => return tracing::warn!(error = %e, "listing workspaces for the temp sweep failed"),
        };
        for row in rows {
            let ws = match crate::workspace::open_registered(&row, crate::workspace::HardLinks::Refuse) {
                Ok(ws) => ws,
                Err(e) => {
                    tracing::warn!(workspace = %row.id, code = %e.code, "temp sweep skipped a workspace: {}", e.message);
                    continue;
                }
            };
            let (rule, stop) = (rule.clone(), shutdown.clone());
            let swept = tokio::task::spawn_blocking(move || crate::workspace::sweep::sweep(&ws, &rule, &stop)).await;
            match swept {
                Ok(report)
                    if report.temp_files_removed + report.delete_dirs_removed + report.errors > 0 || report.capped =>
                {
                    tracing::info!(workspace = %row.id, report = ?report, "swept leftovers of interrupted edits");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(workspace = %row.id, error = %e, "temp sweep failed"),
            }
        }
    });
}

/// A stable id for this data directory (kept in `<data-dir>/node.id`).
fn node_id(data_dir: &Path) -> anyhow::Result<String> {
    let file = data_dir.join("node.id");
    if let Ok(id) = std::fs::read_to_string(&file) {
        let id = id.trim().to_owned();
        if !id.is_empty() {
            return Ok(id);
        }
    }
    let id = format!("node-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    std::fs::write(&file, &id).with_context(|| format!("writing {}", file.display()))?;
    Ok(id)
}

/// Creates the first admin on an empty store and writes its token to
/// `<data-dir>/admin.token` (mode 0600). Returns the file path when it did.
pub async fn bootstrap_admin(store: &Store, data_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if store.count_users().await? > 0 {
        return Ok(None);
    }
    let token = crate::auth::new_token();
    let file = data_dir.join("admin.token");
    write_secret(&file, &token)?;
    match store.create_user("admin", true, &crate::auth::hash_token(&token)).await {
        Ok(_) => Ok(Some(file)),
        // Another replica bootstrapped first: its token file is the valid one.
        Err(e) if e.is_unique_violation() => {
            let _ = std::fs::remove_file(&file);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn write_secret(file: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("writing {}", file.display()))?;
    f.write_all(secret.as_bytes())?;
    f.write_all(b"\n")?;
    Ok(())
}

impl Server {
    /// Opens the store, builds the app, binds and starts serving and executing.
    pub async fn start(settings: Settings) -> anyhow::Result<Server> {
        crate::net::install_tls_provider();
        let wait = Duration::from_secs(settings.runtime.cluster.database_wait_secs);
        let store = open_store_waiting(&settings.data_dir, &settings.database_url, wait).await?;
        let admin_token_file = bootstrap_admin(&store, &settings.data_dir).await?;
        let app = build(&settings, store).await?;
        Self::serve(settings, app, admin_token_file).await
    }

    /// Binds and serves an already built app.
    pub async fn serve(settings: Settings, app: App, admin_token_file: Option<PathBuf>) -> anyhow::Result<Server> {
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("binding {}", settings.listen))?;
        let addr = tokio::net::TcpListener::local_addr(&listener)?;
        app.sandbox.set_listen_port(addr.port());
        let internal =
            (app.node.config.internal_url.clone()).unwrap_or_else(|| crate::cluster::default_internal_url(addr));
        crate::cluster::register(&app.store, &app.node, &internal).await.context("registering this replica")?;
        crate::cluster::spawn_heartbeat(
            app.store.clone(),
            (*app.node).clone(),
            internal,
            app.terminal.clone(),
            app.shutdown.clone(),
        );
        if app.store.backend() == crate::store::Backend::Postgres {
            crate::events::listen::spawn(
                settings.database_url.clone(),
                &app.node.id,
                app.store.bus().clone(),
                app.harness.waker().clone(),
                app.shutdown.clone(),
            );
        }
        let harness = app.harness.spawn(app.shutdown.clone());
        let indexer = crate::embedding::worker::spawn(
            app.embeddings.clone(),
            app.tool_index.clone(),
            app.registry.clone(),
            app.store.clone(),
            crate::embedding::worker::Sweep::default(),
            app.shutdown.clone(),
        );
        let mcp = crate::mcp_server::router(app.clone(), settings.body_limit, settings.request_timeout);
        let router = crate::http::router(app.clone(), mcp, settings.body_limit, settings.request_timeout);
        let limits = &settings.runtime.http;
        let idle = Duration::from_secs(limits.idle_timeout_secs.max(1));
        let listener = crate::limits::LimitedListener::new(listener, limits.max_connections, idle);
        let shutdown = app.shutdown.clone();
        let http = tokio::spawn(async move {
            // `into_make_service`: each connection shares the router (an `Arc`); serving the
            // `Router` itself rebuilds every route's service stack per connection.
            // With the peer's address as connect info (the enrollment attempt limit).
            axum::serve(listener, router.into_make_service_with_connect_info::<crate::limits::PeerAddr>())
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        });
        Ok(Server { addr, app, admin_token_file, http, harness, indexer })
    }

    /// Stops accepting requests, ends streams, lets running executions finish (5 s), stops
    /// MCP servers and terminal sessions, and closes the store. Every step is bounded (10 s),
    /// so a stuck one is logged and passed rather than keeping the process alive.
    pub async fn shutdown(self) {
        const STEP: Duration = Duration::from_secs(10);
        async fn bounded(step: &str, f: impl std::future::Future) {
            if tokio::time::timeout(STEP, f).await.is_err() {
                tracing::warn!(step, "shutdown step did not finish in time; going on");
            }
        }
        self.app.shutdown.cancel();
        bounded("http", self.http).await;
        bounded("harness", self.harness).await;
        self.app.mcp.stopped(Duration::from_secs(5)).await;
        self.app.terminal.stopped(Duration::from_secs(5)).await;
        self.app.sandbox.release();
        bounded("indexer", self.indexer).await;
        let node = &self.app.node;
        if let Err(e) = self.app.store.leave_replica(&node.id, &node.process_id).await {
            tracing::warn!(error = %e, "recording this replica's stop failed");
        }
        bounded("store", self.app.store.close()).await;
    }
}
