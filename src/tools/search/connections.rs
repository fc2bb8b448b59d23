//! Web search provider connections as the tools see them: the deployment-wide ones from
//! the server's configuration, the users' stored ones, and the health of each — all in
//! memory, so that availability answers without I/O.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::config::{SearchConfig, Secret};
use super::providers::ProviderKind;
use crate::store::SearchConnectionRow;

/// Id prefix of deployment-wide connections (`deployment-searxng`, `deployment-brave`,
/// `deployment-tavily`); stored ones are `sconn_…`.
pub const DEPLOYMENT_PREFIX: &str = "deployment-";

/// Where a connection's credential comes from.
#[derive(Clone)]
pub enum Credential {
    /// No credential.
    None,
    /// Sealed in the store ([`crate::secret::SecretBox`], the key MCP secrets use too).
    Sealed {
        /// The sealed text.
        ciphertext: String,
        /// The key that sealed it.
        key_id: String,
    },
    /// Read from this server environment variable at call time.
    Env(String),
    /// Given to the server by its configuration (deployment-wide connections).
    Configured(Secret),
}

impl Credential {
    /// `none`, `encrypted`, `env` or `configured`.
    pub fn kind(&self) -> &'static str {
        match self {
            Credential::None => "none",
            Credential::Sealed { .. } => "encrypted",
            Credential::Env(_) => "env",
            Credential::Configured(_) => "configured",
        }
    }
}

/// One connection.
#[derive(Clone)]
pub struct Connection {
    /// `sconn_…` or `deployment-<provider>`.
    pub id: String,
    /// The user it belongs to; None = deployment-wide.
    pub owner_id: Option<String>,
    /// Which API it speaks.
    pub provider: ProviderKind,
    /// Display name.
    pub name: String,
    /// Base URL without a trailing slash.
    pub base_url: String,
    /// Its credential.
    pub credential: Credential,
    /// Whether calls may use it.
    pub enabled: bool,
    /// RFC 3339 (None for deployment-wide ones).
    pub created_at: Option<String>,
}

impl Connection {
    /// The in-memory form of a stored row (None for a row naming an unknown provider).
    pub fn from_row(row: &SearchConnectionRow) -> Option<Connection> {
        let credential = match row.credential_kind.as_str() {
            "encrypted" => Credential::Sealed {
                ciphertext: row.credential_ciphertext.clone().unwrap_or_default(),
                key_id: row.credential_key_id.clone().unwrap_or_default(),
            },
            "env" => Credential::Env(row.credential_env.clone().unwrap_or_default()),
            _ => Credential::None,
        };
        Some(Connection {
            id: row.id.clone(),
            owner_id: Some(row.owner_id.clone()),
            provider: ProviderKind::parse(&row.provider)?,
            name: row.name.clone(),
            base_url: row.base_url.clone(),
            credential,
            enabled: row.enabled,
            created_at: Some(row.created_at.clone()),
        })
    }

    /// The deployment-wide connections the configuration names, in the order they are tried.
    pub fn deployment(config: &SearchConfig) -> Vec<Connection> {
        let mut out = Vec::new();
        let mut push = |provider: ProviderKind, base_url: &str, credential: Credential| {
            out.push(Connection {
                id: format!("{DEPLOYMENT_PREFIX}{}", provider.as_str()),
                owner_id: None,
                provider,
                name: format!("{} (deployment)", provider.as_str()),
                base_url: base_url.trim_end_matches('/').to_owned(),
                credential,
                enabled: true,
                created_at: None,
            });
        };
        if let Some(url) = &config.searxng_url {
            push(ProviderKind::Searxng, url, Credential::None);
        }
        if let Some(key) = &config.brave_api_key {
            push(ProviderKind::Brave, &config.brave_url, Credential::Configured(key.clone()));
        }
        if let Some(key) = &config.tavily_api_key {
            push(ProviderKind::Tavily, &config.tavily_url, Credential::Configured(key.clone()));
        }
        out
    }
}

/// What the last health check (or the last call) said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Not checked yet (treated as usable).
    Unknown,
    /// Answered.
    Healthy,
    /// Failed its health check or its last call could not reach it.
    Unreachable,
}

/// Health of one connection.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = ConnectionHealth)]
pub struct Health {
    /// State.
    pub state: HealthState,
    /// When it was last checked (RFC 3339).
    pub checked_at: Option<String>,
    /// Why it is unreachable.
    pub error: Option<String>,
    /// Consecutive failures.
    #[serde(skip)]
    pub failures: u32,
    /// When to check next.
    #[serde(skip)]
    pub next_check: Option<Instant>,
}

impl Default for Health {
    fn default() -> Self {
        Health { state: HealthState::Unknown, checked_at: None, error: None, failures: 0, next_check: None }
    }
}

/// First re-check delay after a failed check; doubles per consecutive failure up to the
/// healthy interval.
pub const RECHECK_BASE: Duration = Duration::from_secs(5);

impl Health {
    /// Records a check or call outcome; `interval` is the healthy re-check interval.
    pub fn record(&mut self, outcome: Result<(), impl std::fmt::Display>, interval: Duration) {
        self.checked_at = Some(crate::ids::now());
        match outcome {
            Ok(()) => {
                self.state = HealthState::Healthy;
                self.error = None;
                self.failures = 0;
                self.next_check = Some(Instant::now() + interval);
            }
            Err(e) => {
                self.state = HealthState::Unreachable;
                self.error = Some(e.to_string());
                self.failures = self.failures.saturating_add(1);
                let backoff = RECHECK_BASE.saturating_mul(2u32.saturating_pow(self.failures.saturating_sub(1).min(16)));
                self.next_check = Some(Instant::now() + backoff.min(interval));
            }
        }
    }

    /// Whether a check is due.
    pub fn due(&self) -> bool {
        self.next_check.is_none_or(|t| t <= Instant::now())
    }
}
