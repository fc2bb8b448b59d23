//! `GET /v1/tools` and `GET /v1/tools/{tool_id}`: the state ladder.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::error::{Error, Result};
use crate::exposure::{Exposure, ToolView, ladder};
use crate::surface;

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
        .map(|e| ladder::view(&app.registry, &e.spec().id, &ctx, exposure.as_ref()))
        .collect();
    for id in surface::CORE_PUBLIC {
        if !tools.iter().any(|t| t.id == id) {
            tools.push(ladder::view(&app.registry, id, &ctx, exposure.as_ref()));
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
    Ok(Json(ladder::view(&app.registry, &tool_id, &ctx, exposure.as_ref())))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_tools)).routes(routes!(get_tool))
}
