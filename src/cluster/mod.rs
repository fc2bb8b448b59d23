//! Several `mira serve` replicas on one Postgres database.
//!
//! - **Events** reach every replica through Postgres `LISTEN/NOTIFY` ([`crate::events::listen`]).
//! - **Registry.** Each server records itself in the `replicas` table (its data directory's
//!   stable node id, its current process id, the internal address other replicas reach it
//!   at) and renews its heartbeat every `--heartbeat-secs`. A replica whose heartbeat is older
//!   than `--replica-dead-after-secs` is declared dead by the first other replica to notice
//!   ([`crate::store::Store::declare_dead_replicas`]): its running terminal sessions become
//!   `lost` and the invocations it held are interrupted (never re-run). `GET /v1/admin/replicas`
//!   lists the registry.
//! - **Replica-owned resources** (terminal sessions) live on the replica that started them
//!   (`terminal_sessions.node_id`); actions on them claimed by another replica are forwarded
//!   to the owner ([`forward`]).
//!
//! SQLite keeps one process: the registry holds that one row, nothing else changes.

pub mod forward;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{ReplicaRow, Store};

/// Cluster settings (`mira serve --help`).
#[derive(Clone, Default, clap::Args)]
pub struct ClusterConfig {
    /// Shared secret replicas authenticate forwarded requests with (header
    /// `x-mira-cluster-secret`); never logged. Without it nothing is forwarded.
    #[arg(long = "cluster-secret", env = "MIRA_CLUSTER_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Base URL other replicas reach this one at (default `http://<listen address>`, with
    /// an unspecified host replaced by 127.0.0.1).
    #[arg(long = "internal-url", env = "MIRA_INTERNAL_URL")]
    pub internal_url: Option<String>,
    /// Seconds between this replica's heartbeats (0 = the default, 2).
    #[arg(long = "heartbeat-secs", env = "MIRA_HEARTBEAT_SECS", default_value_t = 2)]
    pub heartbeat_secs: u64,
    /// Seconds without a heartbeat after which a replica is declared dead (0 = the
    /// default, 10).
    #[arg(long = "replica-dead-after-secs", env = "MIRA_REPLICA_DEAD_AFTER_SECS", default_value_t = 10)]
    pub dead_after_secs: u64,
    /// Seconds `mira serve` keeps retrying a database it cannot reach at start (0 = fail at
    /// once).
    #[arg(long = "database-wait-secs", env = "MIRA_DATABASE_WAIT_SECS", default_value_t = 60)]
    pub database_wait_secs: u64,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("internal_url", &self.internal_url)
            .field("heartbeat_secs", &self.heartbeat_secs)
            .field("dead_after_secs", &self.dead_after_secs)
            .field("database_wait_secs", &self.database_wait_secs)
            .finish()
    }
}

impl ClusterConfig {
    /// The heartbeat interval.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(if self.heartbeat_secs == 0 { 2 } else { self.heartbeat_secs })
    }

    /// How old a heartbeat may be before its replica counts as gone.
    pub fn dead_after(&self) -> Duration {
        Duration::from_secs(if self.dead_after_secs == 0 { 10 } else { self.dead_after_secs })
    }

    /// True when `given` is the cluster secret (false without a secret). Constant-time, its
    /// length included: the SHA-256 digests of both are compared, not the bytes (a slice
    /// comparison answers at once when the lengths differ).
    pub fn secret_matches(&self, given: &[u8]) -> bool {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        match &self.secret {
            Some(s) if !s.is_empty() => {
                let (want, got) = (sha2::Sha256::digest(s.as_bytes()), sha2::Sha256::digest(given));
                want.as_slice().ct_eq(got.as_slice()).into()
            }
            _ => false,
        }
    }
}

/// This replica's identity in the cluster.
#[derive(Debug, Clone)]
pub struct Node {
    /// The data directory's stable node id (`node-…`): owner of terminal sessions.
    pub id: String,
    /// This process's id (`<node id>:<uuid>`): holder of invocation leases.
    pub process_id: String,
    /// Settings.
    pub config: ClusterConfig,
    /// The harness's execution time limit (`--execution-timeout-secs`): what a forwarded
    /// execution may last ([`forward::forward_execute`]).
    pub execution_timeout: Duration,
}

impl Node {
    /// Whether `replica`'s heartbeat is recent enough to count it as running.
    pub fn is_alive(&self, replica: &ReplicaRow) -> bool {
        replica.state == crate::state::ReplicaState::Alive && !stale(&replica.heartbeat_at, self.config.dead_after())
    }
}

/// Whether an RFC 3339 heartbeat is older than `limit` (an unreadable one counts as old).
pub(crate) fn stale(heartbeat: &str, limit: Duration) -> bool {
    match chrono::DateTime::parse_from_rfc3339(heartbeat) {
        Ok(t) => {
            let age = chrono::Utc::now().signed_duration_since(t.with_timezone(&chrono::Utc));
            age.to_std().is_ok_and(|age| age > limit)
        }
        Err(_) => true,
    }
}

/// The default internal address for a listen address.
pub fn default_internal_url(addr: std::net::SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        if addr.is_ipv4() { std::net::IpAddr::from([127, 0, 0, 1]) } else { std::net::Ipv6Addr::LOCALHOST.into() }
    } else {
        addr.ip()
    };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}

/// Registers this replica and keeps its heartbeat; declares stale replicas dead. Store
/// failures are logged and retried at the next beat (a database that is down is also
/// reported by `/readyz`).
pub async fn register(store: &Store, node: &Node, address: &str) -> Result<(), crate::store::StoreError> {
    store.register_replica(&node.id, &node.process_id, address).await
}

/// The heartbeat task (see [`register`]).
pub fn spawn_heartbeat(
    store: Store,
    node: Node,
    address: String,
    terminal: std::sync::Arc<crate::tools::terminal::host::TerminalHost>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(node.config.heartbeat());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when this replica's own heartbeats have succeeded without a break: it judges
        // others only after a whole dead-after window of its own (after a database outage
        // every heartbeat is old, and the first replica back must not declare the rest dead).
        let mut healthy_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match store.replica_heartbeat(&node.id, &node.process_id).await {
                Ok(true) => {
                    crate::metrics::heartbeat(&node.id);
                    healthy_since.get_or_insert_with(tokio::time::Instant::now);
                }
                Ok(false) => {
                    // Declared dead while alive (a long pause, a lost database): its sessions
                    // are recorded lost and its invocations interrupted, so its live sessions
                    // end too; then it comes back as a fresh member.
                    tracing::error!(node = %node.id,
                        "this replica was declared dead by another (heartbeat too old); ending its terminal sessions and registering again");
                    terminal.kill_all();
                    healthy_since = None;
                    if let Err(e) = register(&store, &node, &address).await {
                        tracing::warn!(error = %e, "re-registering the replica failed");
                    }
                    continue;
                }
                Err(e) => {
                    healthy_since = None;
                    tracing::warn!(error = %e, "replica heartbeat failed");
                    continue;
                }
            }
            if healthy_since.is_none_or(|t| t.elapsed() < node.config.dead_after()) {
                continue;
            }
            let cutoff = chrono::Utc::now()
                - chrono::Duration::from_std(node.config.dead_after()).unwrap_or(chrono::Duration::seconds(10));
            match store.declare_dead_replicas(&node.id, &crate::ids::format_time(cutoff)).await {
                Ok(dead) => {
                    for id in dead {
                        tracing::warn!(node = %id, "replica declared dead: its terminal sessions are lost, its running invocations interrupted");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "sweeping dead replicas failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_whole_secret_matches_and_no_secret_matches_nothing() {
        let config = ClusterConfig { secret: Some("s3cret".into()), ..Default::default() };
        assert!(config.secret_matches(b"s3cret"));
        for wrong in [&b""[..], b"s3cre", b"s3cret ", b"S3cret", b"s3cret\0"] {
            assert!(!config.secret_matches(wrong), "{wrong:?} matched");
        }
        for unset in [None, Some(String::new())] {
            let config = ClusterConfig { secret: unset, ..Default::default() };
            assert!(!config.secret_matches(b"") && !config.secret_matches(b"anything"));
        }
    }
}
