//! `GET /v1/tools` and `GET /v1/tools/{tool_id}`: the state ladder.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::availability::AvailabilityContext;
use crate::error::{Error, Result};
use crate::exposure::Exposure;
use crate::exposure::ladder::{self, LadderState, Reason};
use crate::registry::{Registry, ToolKind};
use crate::surface;

/// Where one stage of the ladder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// The stage holds.
    Ok,
    /// The stage is the one that stops the tool (see `reason`).
    Blocked,
    /// An earlier stage blocked, or no turn was given.
    NotReached,
}

/// One stage of the ladder.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StageView {
    /// `registered`, `public`, `available`, `exposed`.
    pub stage: &'static str,
    /// `ok`, `blocked`, or `not_reached` (an earlier stage blocked, or no turn was given).
    pub status: StageStatus,
    /// Why it is blocked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

/// `GET /v1/tools/{id}`: a tool and where it stands.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolView {
    /// Tool id.
    pub id: String,
    /// Kind (absent when not registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolKind>,
    /// Domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Title.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Input JSON Schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub input_schema: Option<serde_json::Value>,
    /// Every call waits for an exact-invocation approval (the policy's answer:
    /// [`crate::approval::policy::requires_approval`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires_approval: Option<bool>,
    /// For legacy entries, the public tool to use instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// The ladder state.
    pub state: LadderState,
    /// Why the tool stops at `state` (absent when exposed, or available without a turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Exposed function name (when exposed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function_name: Option<String>,
    /// Ranking score in the turn (when exposed by ranking).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Every stage with its status.
    pub stages: Vec<StageView>,
    /// For External MCP ids: the MCP stages of the tool (install, enabled, connect,
    /// disclaimer, discover, agent_access, tool_exposure, approval), as in
    /// `GET /v1/mcp/servers/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub mcp: Option<serde_json::Value>,
}

const STAGES: [&str; 4] = ["registered", "public", "available", "exposed"];

/// The view of `tool_id`'s ladder ([`ladder::evaluate`]) for the user and device in `ctx`,
/// and for `turn` when given: the tool's registry facts, every stage with its status, and
/// for External MCP ids the MCP stages.
pub fn tool_view(registry: &Registry, tool_id: &str, ctx: &AvailabilityContext, turn: Option<&Exposure>) -> ToolView {
    let ladder = ladder::evaluate(registry, tool_id, ctx, turn);
    let mut v = match registry.get(tool_id, &ctx.user_id) {
        None => ToolView {
            id: tool_id.to_owned(),
            kind: None,
            domain: None,
            title: None,
            description: None,
            input_schema: None,
            requires_approval: None,
            replacement: None,
            state: ladder.state,
            reason: None,
            function_name: None,
            score: None,
            stages: Vec::new(),
            mcp: None,
        },
        Some(entry) => {
            let spec = entry.spec();
            ToolView {
                id: spec.id.clone(),
                kind: Some(spec.kind),
                domain: Some(spec.domain.clone()),
                title: Some(spec.title.clone()),
                description: Some(spec.description.clone()),
                input_schema: Some(spec.input_schema.clone()),
                requires_approval: Some(crate::approval::policy::requires_approval(spec)),
                replacement: spec.replacement.clone(),
                state: ladder.state,
                reason: None,
                function_name: None,
                score: None,
                stages: Vec::new(),
                mcp: None,
            }
        }
    };
    let mut blocked = ladder.reason.clone();
    v.stages = STAGES
        .iter()
        .enumerate()
        .map(|(i, stage)| match i.cmp(&ladder.reached) {
            std::cmp::Ordering::Less => StageView { stage, status: StageStatus::Ok, reason: None },
            std::cmp::Ordering::Equal if blocked.is_some() => {
                StageView { stage, status: StageStatus::Blocked, reason: blocked.take() }
            }
            _ => StageView { stage, status: StageStatus::NotReached, reason: None },
        })
        .collect();
    v.reason = ladder.reason;
    if let Some(exposed) = ladder.exposed {
        v.function_name = Some(exposed.function_name);
        v.score = exposed.score;
    }
    if let Some(explainer) = registry.explainer_for(tool_id) {
        v.mcp = explainer.detail(tool_id, &ctx.user_id);
    }
    v
}

/// Query of the ladder endpoints.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LadderQuery {
    /// Device to evaluate availability for (default the server host, or the turn's run's device).
    pub device: Option<String>,
    /// Turn whose exposure decides `exposed` vs `available`.
    pub turn: Option<String>,
}

/// `{"tools": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ToolList {
    /// Public surface version.
    pub surface_version: &'static str,
    /// Every registered tool visible to the caller, then core surface ids with no
    /// implementation (`not_registered`).
    pub tools: Vec<ToolView>,
}

async fn context(
    app: &App,
    user: &AuthUser,
    q: &LadderQuery,
) -> Result<(crate::availability::AvailabilityContext, Option<Exposure>)> {
    let (exposure, run) = match &q.turn {
        None => (None, None),
        Some(turn_id) => {
            let turn = app.store.turn_for(&user.user_id, turn_id).await?.ok_or(Error::NotFound("turn"))?;
            let run = app.store.run_for(&user.user_id, &turn.run_id).await?.ok_or(Error::NotFound("run"))?;
            (Some(serde_json::from_str(&turn.exposure).map_err(|e| Error::Internal(e.to_string()))?), Some(run))
        }
    };
    // The turn's run decides the workspace (and the device, unless one is asked for).
    let ctx = match (run, &q.device) {
        (Some(mut run), device) => {
            if device.is_some() {
                run.device_id = device.clone();
            }
            app.run_availability_context(&user.user_id, &run).await?
        }
        (None, device) => app.availability_context(&user.user_id, device.as_deref()).await?,
    };
    Ok((ctx, exposure))
}

/// Every tool with its ladder state.
#[utoipa::path(get, path = "/v1/tools", tag = "tools", params(LadderQuery),
    responses((status = 200, body = ToolList), (status = 404)), security(("bearer" = [])))]
pub async fn list_tools(
    State(app): State<App>,
    user: AuthUser,
    Query(q): Query<LadderQuery>,
) -> Result<Json<ToolList>> {
    let (ctx, exposure) = context(&app, &user, &q).await?;
    let mut tools: Vec<ToolView> = app
        .registry
        .visible_to(&user.user_id)
        .iter()
        .map(|e| tool_view(&app.registry, &e.spec().id, &ctx, exposure.as_ref()))
        .collect();
    for id in surface::CORE_PUBLIC {
        if !tools.iter().any(|t| t.id == id) {
            tools.push(tool_view(&app.registry, id, &ctx, exposure.as_ref()));
        }
    }
    Ok(Json(ToolList { surface_version: surface::SURFACE_VERSION, tools }))
}

/// One tool's full ladder. An id nothing registered answers 200 `not_registered`.
#[utoipa::path(get, path = "/v1/tools/{tool_id}", tag = "tools", params(("tool_id" = String, Path), LadderQuery),
    responses((status = 200, body = ToolView), (status = 404)), security(("bearer" = [])))]
pub async fn get_tool(
    State(app): State<App>,
    user: AuthUser,
    Path(tool_id): Path<String>,
    Query(q): Query<LadderQuery>,
) -> Result<Json<ToolView>> {
    let well_formed = !tool_id.is_empty()
        && tool_id.len() <= 256
        && tool_id.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !well_formed {
        return Err(Error::NotFound("tool"));
    }
    let (ctx, exposure) = context(&app, &user, &q).await?;
    Ok(Json(tool_view(&app.registry, &tool_id, &ctx, exposure.as_ref())))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_tools)).routes(routes!(get_tool))
}
