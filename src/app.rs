//! The application context shared by every stage and handler.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::availability::{AvailabilityContext, DeviceInfo};
use crate::config::RuntimeConfig;
use crate::embedding::Embeddings;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::exposure::Ranker;
use crate::exposure::index::ToolIndex;
use crate::harness::Harness;
use crate::registry::{Registry, ToolError};
use crate::store::{RunRow, Store};
use crate::workspace::{HardLinks, RunWorkspace, Workspace};

/// The caller's run as a freeze sees it ([`App::freeze_scope`]).
pub struct FreezeScope {
    /// The run.
    pub run: RunRow,
    /// Its availability context for the caller.
    pub availability: AvailabilityContext,
    /// Its workspace, not opened yet.
    pub workspace: RunWorkspace,
    /// The id of the run's invocation with the call's `tool_call_id`, when one exists.
    pub existing_call: Option<String>,
}

/// Most past tasks [`App::usage_history`] embeds in one load (a few milliseconds each, on
/// the query session every turn's ranking also uses).
pub const EMBED_PER_LOAD: usize = 16;

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
    /// The users' connections of the dynamic capabilities (`/v1/connections`).
    pub connections: Arc<crate::connections::ConnectionHub>,
    /// Live terminal sessions of this server.
    pub terminal: Arc<crate::tools::terminal::host::TerminalHost>,
    /// The managed browser (`/readyz` reports it).
    pub browser: Arc<crate::tools::browser::manager::BrowserManager>,
    /// The sandbox of the processes started for users (`/readyz` reports it).
    pub sandbox: Arc<crate::sandbox::Sandbox>,
    /// Open event streams per user (the cap of `--max-streams-per-user`).
    pub streams: Arc<crate::limits::StreamLimiter>,
    /// The tokens of open event streams, re-checked so a revoked token's streams end
    /// ([`crate::revocation`]).
    pub token_watch: Arc<crate::revocation::TokenWatch>,
    /// Turns in progress per user (the cap of `--max-turns-per-user`).
    pub turn_limit: Arc<crate::limits::TurnLimiter>,
    /// The cores that rank turns, given to users in turn ([`crate::limits::FairPool`]).
    pub rankings: Arc<crate::limits::FairPool>,
    /// This replica's identity and cluster settings.
    pub node: Arc<crate::cluster::Node>,
    /// Turns with their exposure parsed, for freezes ([`crate::invocation::TurnCache`]).
    pub turns: Arc<crate::invocation::TurnCache>,
    /// Connected device runners (docs/runner.md).
    pub devices: Arc<crate::devices::DeviceHub>,
    /// The key run bundles are signed with (docs/verify.md): Ed25519, derived from the
    /// secret key with the label [`crate::verify::BUNDLE_KEY_LABEL`].
    pub bundle_key: Arc<mira_core::remote::SigningKey>,
    /// Run bundles being built at once ([`crate::http::bundle::MAX_CONCURRENT_BUNDLES`]):
    /// each holds up to 64 MiB of records in memory.
    pub bundle_slots: Arc<tokio::sync::Semaphore>,
    /// The users' loaded past uses (learning from use, [`crate::exposure::usage`]).
    pub usage: Arc<crate::exposure::usage::UsageMemory>,
}

impl App {
    /// The availability context of a user on a device (the server host when none is named),
    /// for the default workspace (no run named).
    pub async fn availability_context(&self, user_id: &str, device_id: Option<&str>) -> Result<AvailabilityContext> {
        let mut ctx = self.device_context(user_id, device_id).await?;
        ctx.skills = self.skill_scope(user_id, None).await?;
        if let Some(ws) = self.store.default_workspace().await? {
            ctx.workspace_root = Some(std::path::PathBuf::from(&ws.path));
            ctx.workspace_state = crate::workspace::root_state(&ws);
        }
        Ok(ctx)
    }

    /// The availability context of a run: its owner, its device (the server host when the run
    /// names none) and its workspace (whose root must still be the folder registered).
    pub async fn run_availability_context(&self, user_id: &str, run: &RunRow) -> Result<AvailabilityContext> {
        let mut ctx = self.device_context(user_id, run.device_id.as_deref()).await?;
        ctx.skills = self.skill_scope(&run.owner_id, run.skill_id.as_deref()).await?;
        // A device's folder is a path on the device (never looked at on this host: the user
        // chose it freely): only a host workspace gives the host's checks a root to judge.
        if let Some(ws) = self.store.workspace_for(&run.owner_id, &run.workspace_id).await?
            && ws.device_id.is_none()
        {
            ctx.workspace_root = Some(std::path::PathBuf::from(&ws.path));
            ctx.workspace_state = crate::workspace::root_state(&ws);
        }
        Ok(ctx)
    }

    /// Whether the frozen invocation `inv` may still execute as far as the ladder goes, as the
    /// freeze checked it (the turn's exposure aside, fixed when the call was frozen): its tool
    /// is registered for the run's owner, public, and available for the run's context now —
    /// its device (runner connected, not revoked), its workspace root, the tool's own check
    /// (an MCP server connected…). The owner of a forwarded call runs this before acting
    /// ([`crate::http::cluster::internal_execute`]), since the availability may have changed
    /// between the freeze and the forward.
    ///
    /// Errors: `tool_gone` (not registered for the owner any more), `not_public`, the
    /// availability reason's own code (`device_revoked`, `mcp_not_connected`,
    /// `workspace_changed`…) with `details.ladder`; the run, its device or the store failing
    /// give their own codes. Nothing runs on an error.
    pub async fn check_still_available(&self, inv: &crate::store::InvocationRow) -> Result<(), ToolError> {
        use crate::exposure::ladder::{self, LadderState};
        let failed = |e: Error| {
            let why = if matches!(e, Error::Store(_)) { "the store failed".to_owned() } else { e.to_string() };
            ToolError::new(e.code(), format!("{} was not executed: {why}", inv.id))
        };
        let run = self
            .store
            .run_for(&inv.owner_id, &inv.run_id)
            .await
            .map_err(|e| failed(e.into()))?
            .ok_or_else(|| failed(Error::NotFound("run")))?;
        let ctx = self.run_availability_context(&inv.owner_id, &run).await.map_err(failed)?;
        let view = ladder::evaluate(&self.registry, &inv.tool_id, &ctx, None);
        let Some(reason) = view.reason.filter(|_| view.state != LadderState::Available) else {
            return Ok(());
        };
        let code = match view.state {
            LadderState::NotRegistered => ErrorCode::ToolGone,
            LadderState::NotPublic => ErrorCode::NotPublic,
            _ => ErrorCode::parse(&reason.code).unwrap_or(ErrorCode::Unavailable),
        };
        Err(ToolError::new(
            code,
            format!("{} was not executed: {} is {} now ({})", inv.id, inv.tool_id, view.state.as_str(), reason.message),
        )
        .with_details(serde_json::json!({"tool_id": inv.tool_id, "ladder": {"state": view.state.as_str(), "reason": {"code": reason.code, "message": reason.message}}})))
    }

    /// The user's past uses, embedded by the ready model ([`crate::exposure::usage`]), or
    /// None when learning from use is off, no model is ready (the ranking is then lexical and
    /// has no task vector to compare) or loading failed (logged: the turn ranks by its task
    /// alone rather than fail). See [`App::load_usage_history`].
    pub async fn usage_history(&self, user_id: &str) -> Option<Arc<crate::exposure::UsageHistory>> {
        if !self.config.learn_from_use {
            return None;
        }
        self.load_usage_history(user_id).await.unwrap_or_else(|e| {
            tracing::warn!(user_id, error = %e, "past uses not loaded; ranking by the task alone");
            None
        })
    }

    /// From memory when loaded less than [`crate::exposure::usage::HISTORY_TTL`] ago; else
    /// (one load at a time) the most recent acceptances are read from the store, their
    /// distinct (task, tool) pairs kept up to [`crate::exposure::usage::MAX_USES`], the tasks'
    /// vectors taken from the embedding cache; tasks without one are embedded now (at most
    /// [`EMBED_PER_LOAD`] per load, the rest at later loads) and cached.
    async fn load_usage_history(&self, user_id: &str) -> Result<Option<Arc<crate::exposure::UsageHistory>>> {
        use crate::exposure::hybrid::{QueryEmbedder, primary};
        use crate::exposure::usage::{self, PastUse, UsageHistory};
        use crate::store::task_key;
        let Some(model_id) = self.embeddings.model_id() else { return Ok(None) };
        if let Some(h) = self.usage.get(user_id, &model_id) {
            return Ok(Some(h));
        }
        let (_one_load, generation) = self.usage.begin_load().await;
        if let Some(h) = self.usage.get(user_id, &model_id) {
            return Ok(Some(h));
        }
        let mut seen = std::collections::HashSet::new();
        let mut facts: Vec<(String, String, String)> = Vec::new(); // (key, task, tool)
        for (task, tool) in self.store.accepted_uses(user_id, usage::SCAN_ACCEPTANCES).await? {
            let key = task_key(user_id, &task);
            if seen.insert((key.clone(), tool.clone())) {
                facts.push((key, task, tool));
                if facts.len() == usage::MAX_USES {
                    break;
                }
            }
        }
        let mut keys: Vec<String> = facts.iter().map(|(k, _, _)| k.clone()).collect();
        keys.sort();
        keys.dedup();
        let mut vectors: std::collections::HashMap<String, Arc<[f32]>> =
            self.store.tool_vectors(&model_id, &keys).await?.into_iter().map(|(k, v)| (k, v.into())).collect();
        let mut missing: Vec<(String, String)> = Vec::new();
        let mut queued = std::collections::HashSet::new();
        for (key, task, _) in &facts {
            if missing.len() == EMBED_PER_LOAD {
                break;
            }
            if !vectors.contains_key(key) && queued.insert(key.as_str()) {
                missing.push((key.clone(), task.clone()));
            }
        }
        if !missing.is_empty() {
            let embeddings = Arc::clone(&self.embeddings);
            let embedded = tokio::task::spawn_blocking(move || {
                missing
                    .into_iter()
                    .filter_map(|(key, task)| {
                        // Past tasks are compared in the primary model's part (the usage floor's space).
                        let v = embeddings.embed_query(&task).ok()?;
                        Some((key, primary(&v, embeddings.primary_dim()).to_vec()))
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
            self.store.put_tool_vectors(&model_id, crate::state::VectorKind::Task, &embedded).await?;
            vectors.extend(embedded.into_iter().map(|(k, v)| (k, v.into())));
        }
        let uses = facts
            .into_iter()
            .filter_map(|(key, _, tool_id)| vectors.get(&key).map(|v| PastUse { tool_id, task_vector: Arc::clone(v) }))
            .collect();
        let history = Arc::new(UsageHistory { model_id, uses });
        self.usage.put(user_id, generation, Arc::clone(&history));
        Ok(Some(history))
    }

    /// What the owner's skills change for a run of `skill_id` (None: a main run): see
    /// [`crate::availability::SkillScope`]. One store read of the owner's skills.
    pub async fn skill_scope(&self, owner_id: &str, skill_id: Option<&str>) -> Result<crate::availability::SkillScope> {
        let mut scope = crate::availability::SkillScope { skill_id: skill_id.map(str::to_owned), ..Default::default() };
        for skill in self.store.list_skills(owner_id).await? {
            if Some(skill.id.as_str()) == skill_id {
                scope.private.extend(skill.private_tools());
                let allowed = skill.allowed_public();
                if !allowed.iter().any(|a| a == "*") {
                    scope.allowed_public = Some(allowed.into_iter().collect());
                }
            } else {
                scope.private_elsewhere.extend(skill.private_tools());
            }
        }
        Ok(scope)
    }

    async fn device_context(&self, user_id: &str, device_id: Option<&str>) -> Result<AvailabilityContext> {
        let is_admin = self.store.user_is_admin(user_id).await?;
        self.device_context_as(user_id, is_admin, device_id).await
    }

    /// [`App::device_context`] for a user whose admin flag the caller already knows.
    async fn device_context_as(
        &self,
        user_id: &str,
        is_admin: bool,
        device_id: Option<&str>,
    ) -> Result<AvailabilityContext> {
        let device = match device_id {
            None => DeviceInfo::local(),
            Some(id) if id == crate::availability::LOCAL_DEVICE_ID => DeviceInfo::local(),
            Some(id) => {
                let row = self.store.device_for(user_id, id).await?.ok_or(Error::NotFound("device"))?;
                self.device_info(&row).await
            }
        };
        Ok(AvailabilityContext {
            user_id: user_id.to_owned(),
            is_admin,
            device,
            workspace_root: None,
            workspace_state: crate::availability::Availability::Available,
            skills: Default::default(),
        })
    }

    /// What availability knows of the device `row`: while its runner is connected, the
    /// capabilities and tools that runner advertised; otherwise the declared capabilities
    /// (and the last advertised ones) and why it cannot execute now.
    pub async fn device_info(&self, row: &crate::store::DeviceRow) -> DeviceInfo {
        self.device_info_and_presence(row).await.0
    }

    /// [`App::device_info`] and where the device stands in the cluster
    /// ([`crate::devices::DeviceHub::presence`]), from one look.
    pub async fn device_info_and_presence(
        &self,
        row: &crate::store::DeviceRow,
    ) -> (DeviceInfo, crate::devices::Presence) {
        let mut capabilities: Vec<String> = serde_json::from_str(&row.capabilities).unwrap_or_default();
        let presence = self.devices.presence(row).await;
        let advertised = match &presence {
            crate::devices::Presence::Connected(a) => Some(a.clone()),
            _ => row.advertised.as_deref().and_then(|a| serde_json::from_str::<mira_core::remote::Advertised>(a).ok()),
        };
        let runner_tools = advertised.as_ref().map(|a| a.tools.clone());
        if let Some(a) = advertised {
            for c in a.capabilities {
                if !capabilities.contains(&c) {
                    capabilities.push(c);
                }
            }
        }
        let info = DeviceInfo {
            id: row.id.clone(),
            local: false,
            capabilities,
            runner: presence.availability(&row.id),
            runner_tools,
        };
        (info, presence)
    }

    /// The runner of `run`'s device as the freeze's canonicaliser, when the run is bound to
    /// a device (`ws` is the run's workspace).
    pub fn device_tools(
        &self,
        run: &RunRow,
        ws: &crate::store::WorkspaceRow,
    ) -> Option<crate::devices::executor::DeviceTools> {
        let device = run.device_id.as_deref().filter(|d| *d != crate::availability::LOCAL_DEVICE_ID)?;
        Some(crate::devices::executor::DeviceTools {
            hub: self.devices.clone(),
            device_id: device.to_owned(),
            workspace: ws.path.clone(),
            run_id: run.id.clone(),
            owner_id: run.owner_id.clone(),
        })
    }

    /// Refuses (403 `internal_address`) a URL the server would fetch for `user` when it points
    /// inside the host's networks, unless the user is an admin or the deployment allows it.
    pub async fn check_fetch_url(&self, is_admin: bool, url: &str) -> Result<()> {
        if is_admin || self.config.allow_internal_urls {
            return Ok(());
        }
        crate::net::check_public_url(url)
            .await
            .map_err(|e| Error::ForbiddenCode { code: ErrorCode::InternalAddress, message: e.0 })
    }

    /// The Read tools' hard-link rule in force (`--allow-hard-link-reads`).
    pub fn hard_link_rule(&self) -> HardLinks {
        if self.config.allow_hard_link_reads { HardLinks::Allow } else { HardLinks::Refuse }
    }

    /// The run's registered workspace, to be opened by identity
    /// ([`RunWorkspace::open`]: `workspace_changed` (409) when the folder at its path is not
    /// the one registered, `workspace_unavailable` (503) when it cannot be opened). 404 when
    /// the run names no workspace of its owner.
    pub async fn run_workspace(&self, run: &RunRow) -> Result<RunWorkspace> {
        let ws =
            self.store.workspace_for(&run.owner_id, &run.workspace_id).await?.ok_or(Error::NotFound("workspace"))?;
        Ok(RunWorkspace::new(ws, self.hard_link_rule()))
    }

    /// Opens the run's workspace root on this host, by identity (see [`App::run_workspace`]).
    pub async fn workspace_of(&self, run: &RunRow) -> Result<Workspace> {
        self.run_workspace(run).await?.open().map_err(Error::Tool)
    }

    /// Everything a freeze needs to know about the caller's run, read in one round trip
    /// ([`Store::run_scope_for`]) instead of four: the run (404 `run` when it is not the
    /// caller's), its availability context for `user_id` (`is_admin` as the
    /// authenticated token says), its workspace (404 `workspace` when the run names none of its
    /// owner's) and the id of the run's invocation with `tool_call_id`, if one exists.
    pub async fn freeze_scope(
        &self,
        user_id: &str,
        is_admin: bool,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<FreezeScope> {
        let scope =
            self.store.run_scope_for(user_id, run_id, Some(tool_call_id)).await?.ok_or(Error::NotFound("run"))?;
        let mut availability = self.device_context_as(user_id, is_admin, scope.run.device_id.as_deref()).await?;
        // As in `run_availability_context`: a device's folder is never judged on this host.
        if let Some(ws) = &scope.workspace
            && ws.device_id.is_none()
        {
            availability.workspace_root = Some(std::path::PathBuf::from(&ws.path));
            availability.workspace_state = crate::workspace::root_state(ws);
        }
        if scope.owner_has_skills {
            availability.skills = self.skill_scope(&scope.run.owner_id, scope.run.skill_id.as_deref()).await?;
        }
        let workspace = scope.workspace.ok_or(Error::NotFound("workspace"))?;
        Ok(FreezeScope {
            run: scope.run,
            availability,
            workspace: RunWorkspace::new(workspace, self.hard_link_rule()),
            existing_call: scope.invocation_id,
        })
    }

    /// What a freeze consults besides the run: the store, the registry, the deployment's
    /// approval settings and the harness's wake-up handle.
    pub fn freeze_stage(&self) -> crate::invocation::FreezeStage<'_> {
        crate::invocation::FreezeStage {
            store: &self.store,
            registry: &self.registry,
            approvals: crate::invocation::ApprovalSettings {
                four_eyes_domains: &self.config.four_eyes_domains,
                ttl_secs: self.config.approval_ttl_secs,
            },
            harness: &self.harness,
            turns: &self.turns,
        }
    }
}
