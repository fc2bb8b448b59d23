//! Search: `web_search` asks the public internet through a configured provider at call
//! time; `news_search` reads the items the News Hub collected. Their evidence differs in
//! freshness and provenance, so neither ever falls back to the other: each has its own
//! availability (`no_search_provider` / `provider_unreachable` vs `news_hub_empty`), its
//! own output and its own evidence kind (`web_result` vs `news_item`).
//!
//! [`SearchHub`] is the state both tools and their HTTP resources share: provider
//! connections with their health, the number of news sources per user, the per-user rate
//! limiter and the collector. Availability is answered from memory; the hub reloads what
//! other replicas wrote every `state_refresh_secs` and at once after local changes.

pub mod config;
pub mod connections;
pub mod net;
pub mod news;
pub mod providers;
pub mod text;
pub mod web;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use self::config::{SearchConfig, Secret};
use self::connections::{Connection, Credential, Health, HealthState};
use self::news::collector::Collector;
use self::providers::Endpoint;
use crate::availability::Availability;
use crate::error::ErrorCode;
use crate::registry::ToolError;
use crate::secret::{SecretBox, SecretError};
use crate::store::Store;

/// Why a provider health check (a probe) failed.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] net::ClientError),
    /// The connection's credential cannot be read (the tool error's sentence).
    #[error("{0}")]
    Credential(String),
    /// The provider failed the check.
    #[error(transparent)]
    Check(#[from] providers::HealthError),
}

/// Shared state of the search tools (see the module docs).
pub struct SearchHub {
    store: Store,
    config: SearchConfig,
    secrets: Result<SecretBox, SecretError>,
    clients: net::RuleClients,
    addresses: Arc<crate::net::AddressPolicy>,
    connections: RwLock<Vec<Connection>>,
    health: Mutex<HashMap<String, Health>>,
    sources: RwLock<SourceCounts>,
    limiter: Mutex<HashMap<String, Bucket>>,
    health_wake: tokio::sync::Notify,
    collector: Arc<Collector>,
    reload_seq: std::sync::atomic::AtomicU64,
    reload_applied: Mutex<(u64, u64)>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct SourceCounts {
    shared: i64,
    per_owner: HashMap<String, i64>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl SearchHub {
    /// The hub over `store`, with the credential key from the configuration or the data
    /// directory. Nothing runs until [`SearchHub::start`].
    /// `allow_internal` (`--allow-internal-urls`) lifts the internal-address rule for the
    /// URLs of non-admins' connections and news sources.
    pub fn new(store: Store, data_dir: &Path, config: SearchConfig, allow_internal: bool) -> Arc<SearchHub> {
        // The same key (`MIRA_SECRET_KEY` or `<data-dir>/secret.key`) seals MCP secrets.
        let secrets = SecretBox::load(data_dir);
        if let Err(e) = &secrets {
            tracing::warn!(error = %e, "stored search credentials cannot be sealed or opened");
        }
        let clients = net::RuleClients::new(Duration::from_secs(config.search_timeout_secs.max(1)), 3);
        let addresses = Arc::new(crate::net::AddressPolicy::new(allow_internal));
        let collector = Arc::new(Collector::new(store.clone(), &config, addresses.clone()));
        let deployment = Connection::deployment(&config);
        Arc::new(SearchHub {
            store,
            config,
            secrets,
            clients,
            addresses,
            connections: RwLock::new(deployment),
            health: Mutex::new(HashMap::new()),
            sources: RwLock::new(SourceCounts::default()),
            limiter: Mutex::new(HashMap::new()),
            health_wake: tokio::sync::Notify::new(),
            collector,
            reload_seq: std::sync::atomic::AtomicU64::new(0),
            reload_applied: Mutex::new((0, 0)),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Starts the background work — the collector, provider health checks and the state
    /// reload — until `shutdown`.
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) {
        let collector = self.collector.clone().spawn(shutdown.clone());
        let this = Arc::clone(self);
        let maintain = tokio::spawn(async move { this.maintain(shutdown).await });
        self.tasks.lock().extend([collector, maintain]);
    }

    /// True once every background task started by [`SearchHub::start`] has ended (they end
    /// with the shutdown token).
    pub fn background_finished(&self) -> bool {
        self.tasks.lock().iter().all(tokio::task::JoinHandle::is_finished)
    }

    async fn maintain(self: Arc<Self>, shutdown: CancellationToken) {
        let mut reload = tokio::time::interval(Duration::from_secs(self.config.state_refresh_secs.max(1)));
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = reload.tick() => {
                    self.reload().await;
                }
                () = self.health_wake.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let due: Vec<Connection> = {
                let health = self.health.lock();
                self.connections
                    .read()
                    .iter()
                    .filter(|c| c.enabled && health.get(&c.id).is_none_or(Health::due))
                    .cloned()
                    .collect()
            };
            let checks = due.into_iter().map(|c| {
                let this = Arc::clone(&self);
                async move {
                    let outcome = this.probe(&c).await;
                    this.record_health(&c.id, outcome);
                }
            });
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = futures::future::join_all(checks) => {}
            }
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &SearchConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The collector (wake it after adding or resuming a source).
    pub fn collector(&self) -> &Arc<Collector> {
        &self.collector
    }

    /// The credential box, or why it is unavailable.
    pub fn secrets(&self) -> Result<&SecretBox, ToolError> {
        self.secrets
            .as_ref()
            .map_err(|e| ToolError::new(ErrorCode::SecretKeyUnavailable, format!("credentials cannot be sealed: {e}")))
    }

    /// Reloads stored connections and source counts (other replicas' writes, local changes).
    /// Of two overlapping reloads, the one that started later wins, so a slow periodic reload
    /// cannot overwrite what a handler's reload read after its write.
    pub async fn reload(&self) {
        let seq = self.reload_seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        match self.store.admin_user_ids().await {
            Ok(ids) => self.addresses.set_admins(ids),
            Err(e) => tracing::warn!(error = %e, "reloading the admins failed"),
        }
        match self.store.all_search_connections().await {
            Ok(rows) => {
                let mut applied = self.reload_applied.lock();
                if applied.0 < seq {
                    applied.0 = seq;
                    let mut all = Connection::deployment(&self.config);
                    all.extend(rows.iter().filter_map(Connection::from_row));
                    let ids: std::collections::HashSet<String> = all.iter().map(|c| c.id.clone()).collect();
                    *self.connections.write() = all;
                    self.health.lock().retain(|id, _| ids.contains(id));
                    self.health_wake.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "reloading search connections failed"),
        }
        match self.store.news_source_counts().await {
            Ok(rows) => {
                let mut counts = SourceCounts::default();
                for (owner, n) in rows {
                    match owner {
                        Some(o) => {
                            counts.per_owner.insert(o, n);
                        }
                        None => counts.shared = n,
                    }
                }
                let mut applied = self.reload_applied.lock();
                if applied.1 < seq {
                    applied.1 = seq;
                    *self.sources.write() = counts;
                }
            }
            Err(e) => tracing::warn!(error = %e, "reloading news source counts failed"),
        }
    }

    // ---- connections -------------------------------------------------------------------

    /// The connections `user_id` can use, in the order `web_search` tries them: the user's
    /// own enabled ones (oldest first), then the deployment-wide ones.
    pub fn candidates(&self, user_id: &str) -> Vec<Connection> {
        let all = self.connections.read();
        let own = all.iter().filter(|c| c.enabled && c.owner_id.as_deref() == Some(user_id));
        let shared = all.iter().filter(|c| c.enabled && c.owner_id.is_none());
        own.chain(shared).cloned().collect()
    }

    /// Every connection `user_id` can see (own, enabled or not, and deployment-wide).
    pub fn visible(&self, user_id: &str) -> Vec<Connection> {
        self.connections.read().iter().filter(|c| c.owner_id.as_deref().is_none_or(|o| o == user_id)).cloned().collect()
    }

    /// A connection by id, if `user_id` may use it.
    pub fn connection_for(&self, user_id: &str, id: &str) -> Option<Connection> {
        self.connections
            .read()
            .iter()
            .find(|c| c.id == id && c.owner_id.as_deref().is_none_or(|o| o == user_id))
            .cloned()
    }

    /// The health of a connection.
    pub fn health_of(&self, id: &str) -> Health {
        self.health.lock().get(id).cloned().unwrap_or_default()
    }

    fn healthy_enough(&self, id: &str) -> bool {
        self.health.lock().get(id).is_none_or(|h| h.state != HealthState::Unreachable)
    }

    fn record_health(&self, id: &str, outcome: Result<(), impl std::fmt::Display>) {
        if let Err(e) = &outcome {
            tracing::info!(connection = id, error = %e, "search provider health check failed");
        }
        let interval = Duration::from_secs(self.config.search_health_secs.max(1));
        self.health.lock().entry(id.to_owned()).or_default().record(outcome, interval);
    }

    /// Records what a real call learned about reachability.
    pub fn record_call(&self, id: &str, outcome: Result<(), impl std::fmt::Display>) {
        self.record_health(id, outcome);
    }

    /// Runs a health check of `conn` now and records it.
    pub async fn check_now(&self, conn: &Connection) -> Health {
        let outcome = self.probe(conn).await;
        self.record_health(&conn.id, outcome);
        self.health_of(&conn.id)
    }

    async fn probe(&self, conn: &Connection) -> Result<(), ProbeError> {
        let client = self.clients.get(self.addresses.rule_for(conn.owner_id.as_deref()))?;
        let key = self.credential(conn).map_err(|e| ProbeError::Credential(e.message))?;
        let ep = Endpoint { kind: conn.provider, base_url: &conn.base_url, key: key.as_ref() };
        Ok(providers::check(client, &ep).await?)
    }

    /// The connection's credential in clear, for the one request that sends it.
    pub fn credential(&self, conn: &Connection) -> Result<Option<Secret>, ToolError> {
        match &conn.credential {
            Credential::None => Ok(None),
            Credential::Configured(s) => Ok(Some(s.clone())),
            Credential::Env(name) => match std::env::var(name) {
                Ok(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
                _ => Err(ToolError::new(
                    ErrorCode::CredentialUnavailable,
                    format!("connection {} reads its key from ${name}, which is not set on this server", conn.id),
                )),
            },
            Credential::Sealed { ciphertext, key_id } => {
                let secrets = self.secrets()?;
                secrets.open(ciphertext, key_id, &conn.id).map(|s| Some(Secret::new(s))).map_err(|e| {
                    ToolError::new(ErrorCode::CredentialUnavailable, format!("connection {}: {e}", conn.id))
                })
            }
        }
    }

    /// The HTTP client of provider calls through `conn` (a non-admin's own connection
    /// reaches public addresses only, checked at every connection and redirect).
    pub fn client(&self, conn: &Connection) -> Result<&reqwest::Client, ToolError> {
        self.clients
            .get(self.addresses.rule_for(conn.owner_id.as_deref()))
            .map_err(|e| ToolError::new(ErrorCode::ProviderUnreachable, e.to_string()))
    }

    /// `web_search` availability for a user (from memory).
    pub fn web_availability(&self, user_id: &str) -> Availability {
        let candidates = self.candidates(user_id);
        if candidates.is_empty() {
            return Availability::unavailable(
                ErrorCode::NoSearchProvider,
                "no web search provider is configured: add a connection with POST /v1/search/connections, \
                 or start the server with MIRA_SEARXNG_URL, MIRA_BRAVE_API_KEY or MIRA_TAVILY_API_KEY",
            );
        }
        if candidates.iter().any(|c| self.healthy_enough(&c.id)) {
            return Availability::Available;
        }
        let why: Vec<String> = candidates
            .iter()
            .map(|c| {
                let h = self.health_of(&c.id);
                format!("{} ({}): {}", c.id, c.provider.as_str(), h.error.unwrap_or_else(|| "unreachable".into()))
            })
            .collect();
        Availability::unavailable(
            ErrorCode::ProviderUnreachable,
            format!("every configured search provider failed its health check: {}", why.join("; ")),
        )
    }

    /// The connection a new `web_search` call of `user_id` uses: the first candidate not
    /// known to be unreachable.
    pub fn pick(&self, user_id: &str) -> Result<Connection, ToolError> {
        match self.web_availability(user_id) {
            Availability::Available => {}
            Availability::Unavailable { code, message } => {
                return Err(ToolError::new(code, message));
            }
        }
        self.candidates(user_id)
            .into_iter()
            .find(|c| self.healthy_enough(&c.id))
            .ok_or_else(|| ToolError::new(ErrorCode::ProviderUnreachable, "no search provider is reachable"))
    }

    /// Takes one call from `user_id`'s token bucket (`search_rate_per_minute` tokens,
    /// refilled continuously). Err = how long until a token is back.
    pub fn take_rate_token(&self, user_id: &str) -> Result<(), Duration> {
        let per_minute = f64::from(self.config.search_rate_per_minute.max(1));
        let rate = per_minute / 60.0;
        let now = Instant::now();
        let mut buckets = self.limiter.lock();
        let b = buckets.entry(user_id.to_owned()).or_insert(Bucket { tokens: per_minute, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(per_minute);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
    }

    // ---- news --------------------------------------------------------------------------

    /// Number of news sources `user_id` can read (own and deployment-wide).
    pub fn source_count(&self, user_id: &str) -> i64 {
        let s = self.sources.read();
        s.shared + s.per_owner.get(user_id).copied().unwrap_or(0)
    }

    /// `news_search` availability for a user (from memory).
    pub fn news_availability(&self, user_id: &str) -> Availability {
        if self.source_count(user_id) == 0 {
            Availability::unavailable(
                ErrorCode::NewsHubEmpty,
                "the News Hub has no sources for this user: add a feed with POST /v1/news/sources",
            )
        } else {
            Availability::Available
        }
    }
}

/// Registers `web_search` and `news_search` over a new hub and starts its background work
/// with `deps.shutdown`.
pub fn register(
    registry: &crate::registry::Registry,
    deps: &super::ToolDeps,
) -> Result<Arc<SearchHub>, crate::registry::RegistryError> {
    let hub = SearchHub::new(deps.store.clone(), &deps.data_dir, deps.search.clone(), deps.allow_internal_urls);
    registry.register(Arc::new(web::WebSearch::new(hub.clone())))?;
    registry.register(Arc::new(news::tool::NewsSearch::new(hub.clone())))?;
    hub.start(deps.shutdown.clone());
    Ok(hub)
}
