//! The application context shared by every stage and handler.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::availability::{AvailabilityContext, DeviceInfo};
use crate::config::RuntimeConfig;
use crate::embedding::Embeddings;
use crate::error::{Error, Result};
use crate::exposure::Ranker;
use crate::exposure::index::ToolIndex;
use crate::harness::Harness;
use crate::registry::{ErrorClass, Registry, ToolError};
use crate::store::{RunRow, Store};
use crate::workspace::Workspace;

/// Everything the chain needs, cheap to clone (typed axum state).
#[derive(Clone)]
pub struct App {
    /// Storage.
    pub store: Store,
    /// What exists.
    pub registry: Arc<Registry>,
    /// Orders candidates when more than 20 are available.
    pub ranker: Arc<dyn Ranker>,
    /// The embedding model's state and query side.
    pub embeddings: Arc<Embeddings>,
    /// Per-tool ranking data (BM25 documents, vectors), kept by the background indexer.
    pub tool_index: Arc<ToolIndex>,
    /// Runs cleared invocations.
    pub harness: Arc<Harness>,
    /// Settings.
    pub config: Arc<RuntimeConfig>,
    /// External MCP servers, connections and projections.
    pub mcp: Arc<crate::mcp::McpManager>,
    /// Cancelled when the server shuts down (ends SSE streams and workers).
    pub shutdown: CancellationToken,
    /// State the search tools share with their HTTP resources.
    pub search: Arc<crate::tools::search::SearchHub>,
    /// Live terminal sessions of this server.
    pub terminal: Arc<crate::tools::terminal::host::TerminalHost>,
}

impl App {
    /// The availability context of a user on a device (the server host when none is named),
    /// for the default workspace (no run named).
    pub async fn availability_context(&self, user_id: &str, device_id: Option<&str>) -> Result<AvailabilityContext> {
        let mut ctx = self.device_context(user_id, device_id).await?;
        ctx.workspace_root = self.store.default_workspace().await?.map(|w| std::path::PathBuf::from(w.path));
        Ok(ctx)
    }

    /// The availability context of a run: its owner, its device (the server host when the run
    /// names none) and its workspace.
    pub async fn run_availability_context(&self, user_id: &str, run: &RunRow) -> Result<AvailabilityContext> {
        let mut ctx = self.device_context(user_id, run.device_id.as_deref()).await?;
        ctx.workspace_root =
            self.store.workspace_for(&run.owner_id, &run.workspace_id).await?.map(|w| std::path::PathBuf::from(w.path));
        Ok(ctx)
    }

    async fn device_context(&self, user_id: &str, device_id: Option<&str>) -> Result<AvailabilityContext> {
        let device = match device_id {
            None => DeviceInfo::local(),
            Some(id) if id == crate::availability::LOCAL_DEVICE_ID => DeviceInfo::local(),
            Some(id) => {
                let row = self.store.device_for(user_id, id).await?.ok_or(Error::NotFound("device"))?;
                let capabilities: Vec<String> = serde_json::from_str(&row.capabilities).unwrap_or_default();
                DeviceInfo { id: row.id, local: false, capabilities }
            }
        };
        Ok(AvailabilityContext { user_id: user_id.to_owned(), device, workspace_root: None })
    }

    /// Refuses (403 `internal_address`) a URL the server would fetch for `user` when it points
    /// inside the host's networks, unless the user is an admin or the deployment allows it.
    pub async fn check_fetch_url(&self, is_admin: bool, url: &str) -> Result<()> {
        if is_admin || self.config.allow_internal_urls {
            return Ok(());
        }
        crate::net::check_public_url(url)
            .await
            .map_err(|e| Error::ForbiddenCode { code: "internal_address", message: e.0 })
    }

    /// Opens the run's workspace root on this host.
    pub async fn workspace_of(&self, run: &RunRow) -> Result<Workspace> {
        let ws =
            self.store.workspace_for(&run.owner_id, &run.workspace_id).await?.ok_or(Error::NotFound("workspace"))?;
        Workspace::open(std::path::Path::new(&ws.path)).map_err(|e| {
            Error::Tool(ToolError::new(
                ErrorClass::Unavailable,
                "workspace_unavailable",
                format!("workspace {} at {} cannot be opened: {e}", ws.id, ws.path),
            ))
        })
    }
}
