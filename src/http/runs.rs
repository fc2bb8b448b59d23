//! Runs and turns (each turn computes and stores its exposure).

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Page;
use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::exposure::{self, Exposure};
use crate::store::RunRow;

/// A run.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RunView {
    /// `run_…`
    pub id: String,
    /// Workspace.
    pub workspace_id: String,
    /// Device; absent = the server host.
    pub device_id: Option<String>,
    /// Title.
    pub title: Option<String>,
    /// Newest event id.
    pub last_event_id: i64,
    /// RFC 3339.
    pub created_at: String,
    /// The skill whose sub-run this is; absent for a main run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill_id: Option<String>,
}

impl From<RunRow> for RunView {
    fn from(r: RunRow) -> Self {
        Self {
            id: r.id,
            workspace_id: r.workspace_id,
            device_id: r.device_id,
            title: r.title,
            last_event_id: r.event_seq,
            created_at: r.created_at,
            skill_id: r.skill_id,
        }
    }
}

/// Body of `POST /v1/runs`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// Workspace (default: the deployment's default workspace).
    pub workspace_id: Option<String>,
    /// Device (default: the server host).
    pub device_id: Option<String>,
    /// Title, at most 256 characters.
    #[schema(max_length = 256)]
    pub title: Option<String>,
    /// Make the run a sub-run of this skill of the caller's (`POST /v1/skills`): it sees the
    /// skill's private tools and the public tools its manifest allows.
    pub skill_id: Option<String>,
}

/// `{"runs": [...], "next_cursor"}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RunList {
    /// Newest first.
    pub runs: Vec<RunView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// Opens a run.
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    responses((status = 201, body = RunView), (status = 404)), security(("bearer" = [])))]
pub async fn create_run(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateRun>,
) -> Result<(StatusCode, Json<RunView>)> {
    if body.title.as_ref().is_some_and(|t| t.len() > 256) {
        return Err(Error::invalid_field("title", "title must be at most 256 characters"));
    }
    let workspace = match &body.workspace_id {
        Some(id) => app.store.workspace_for(&user.user_id, id).await?,
        None => app.store.default_workspace().await?,
    }
    .ok_or(Error::NotFound("workspace"))?;
    if let Some(device) = &body.device_id
        && device != crate::availability::LOCAL_DEVICE_ID
    {
        app.store.device_for(&user.user_id, device).await?.ok_or(Error::NotFound("device"))?;
    }
    // A workspace on a device is worked on by that device: the run is bound to it.
    let device_id = match (&workspace.device_id, body.device_id.as_deref()) {
        (Some(ws_device), None) => Some(ws_device.as_str()),
        (Some(ws_device), Some(d)) if d != ws_device => {
            return Err(Error::invalid_field(
                "device_id",
                format!("workspace {} is on device {ws_device}, not on {d}", workspace.id),
            ));
        }
        (_, d) => d,
    };
    if let Some(skill) = &body.skill_id {
        app.store.skill_for(&user.user_id, skill).await?.ok_or(Error::NotFound("skill"))?;
    }
    let run = app
        .store
        .create_run(&user.user_id, &workspace.id, device_id, body.title.as_deref(), body.skill_id.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(run.into())))
}

/// The caller's runs.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(Page), responses((status = 200, body = RunList)), security(("bearer" = [])))]
pub async fn list_runs(State(app): State<App>, user: AuthUser, Query(page): Query<Page>) -> Result<Json<RunList>> {
    let limit = page.limit()?;
    let rows = app.store.list_runs(&user.user_id, page.cursor.as_deref(), limit + 1).await?;
    let (rows, next_cursor) = Page::split(rows, limit, |r| r.id.clone());
    Ok(Json(RunList { runs: rows.into_iter().map(Into::into).collect(), next_cursor }))
}

/// One run.
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs", params(("run_id" = String, Path)),
    responses((status = 200, body = RunView), (status = 404)), security(("bearer" = [])))]
pub async fn get_run(State(app): State<App>, user: AuthUser, Path(run_id): Path<String>) -> Result<Json<RunView>> {
    Ok(Json(owned_run(&app, &user, &run_id).await?.into()))
}

/// The caller's run or 404.
pub async fn owned_run(app: &App, user: &AuthUser, run_id: &str) -> Result<RunRow> {
    app.store.run_for(&user.user_id, run_id).await?.ok_or(Error::NotFound("run"))
}

/// Body of `POST /v1/runs/{run_id}/turns`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTurn {
    /// The task of this Planner step (ranking query when more than 20 tools are available).
    pub task: String,
    /// Extra context for ranking.
    pub context: Option<String>,
}

/// A turn and the exposure the model sees.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TurnView {
    /// `turn_…`
    pub turn_id: String,
    /// The run.
    pub run_id: String,
    /// The task.
    pub task: String,
    /// RFC 3339.
    pub created_at: String,
    /// The stored exposure, exactly as first returned.
    #[schema(value_type = Exposure)]
    pub exposure: serde_json::Value,
}

/// Starts a turn: computes the exposure for the task and stores it.
#[utoipa::path(post, path = "/v1/runs/{run_id}/turns", tag = "runs", params(("run_id" = String, Path)), request_body = CreateTurn,
    responses((status = 201, body = TurnView), (status = 404), (status = 413), (status = 429, description = "too_many_turns: the caller has the most turns in progress that a user may")),
    security(("bearer" = [])))]
pub async fn create_turn(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
    Json(body): Json<CreateTurn>,
) -> Result<(StatusCode, Json<TurnView>)> {
    // The place first, before any store read: a user's turns past the cap cost only their
    // authentication.
    let place = app.turn_limit.acquire(&user.user_id, std::time::Duration::ZERO).await?;
    let run = owned_run(&app, &user, &run_id).await?;
    let turn = start_turn(&app, &run, &body.task, body.context.as_deref(), place).await?;
    Ok((StatusCode::CREATED, Json(turn)))
}

/// Starts a turn of `run` (the caller's, already checked): computes the exposure for `task`
/// (and `context`, appended to the ranking query) and stores it. 413 `task_too_large` when
/// task and context together exceed `--max-task-bytes`. `place` is one of the run owner's
/// `--max-turns-per-user` places ([`crate::limits::TurnLimiter::acquire`]); it is held until
/// the turn is stored, and until the ranking ended even when the caller went away
/// meanwhile. A ranking (more than 20 candidates) runs once the owner's turn for a core has
/// come ([`crate::limits::FairPool`]). The HTTP route and the MCP server
/// ([`crate::mcp_server`]) share it.
pub async fn start_turn(
    app: &App,
    run: &RunRow,
    task: &str,
    context: Option<&str>,
    place: crate::limits::UserSlot,
) -> Result<TurnView> {
    let size = task.len() + context.map_or(0, str::len);
    if size > app.config.max_task_bytes {
        return Err(Error::TooLarge {
            code: ErrorCode::TaskTooLarge,
            message: format!("task and context are {size} bytes; the limit is {}", app.config.max_task_bytes),
        });
    }
    let ctx = app.run_availability_context(&run.owner_id, run).await?;
    let candidates = exposure::candidates(&app.registry, &ctx);
    let query = match context {
        Some(c) => format!("{task}\n{c}"),
        None => task.to_owned(),
    };
    let ranker = app.ranker.clone();
    // Past uses weigh only when ranking runs (more than 20 candidates).
    let history = if candidates.len() > exposure::MAX_EXPOSED { app.usage_history(&run.owner_id).await } else { None };
    // A ranking waits for a core, given to the users with rankings waiting in turn (one
    // user's many turns do not queue ahead of another's one); without ranking (≤ 20
    // candidates) there is nothing to wait for.
    let core =
        if candidates.len() > exposure::MAX_EXPOSED { Some(app.rankings.admit(&run.owner_id).await) } else { None };
    // The place and the core travel with the ranking (a caller that hangs up frees neither
    // while the ranking runs); the core comes back when it ends, the place once the turn is
    // stored.
    let (exposure, _place) = tokio::task::spawn_blocking(move || {
        let exposure = exposure::expose(&candidates, &query, ranker.as_ref(), history.as_deref());
        drop(core);
        (exposure, place)
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    let doc = serde_json::to_value(&exposure).map_err(|e| Error::Internal(e.to_string()))?;
    let turn = app.store.create_turn(run, task, context, &doc).await?;
    Ok(TurnView { turn_id: turn.id, run_id: turn.run_id, task: turn.task, created_at: turn.created_at, exposure: doc })
}

/// A stored turn with its exposure.
#[utoipa::path(get, path = "/v1/turns/{turn_id}", tag = "runs", params(("turn_id" = String, Path)),
    responses((status = 200, body = TurnView), (status = 404)), security(("bearer" = [])))]
pub async fn get_turn(State(app): State<App>, user: AuthUser, Path(turn_id): Path<String>) -> Result<Json<TurnView>> {
    let turn = app.store.turn_for(&user.user_id, &turn_id).await?.ok_or(Error::NotFound("turn"))?;
    let exposure = crate::store::json_col(&turn.exposure)?;
    Ok(Json(TurnView { turn_id: turn.id, run_id: turn.run_id, task: turn.task, created_at: turn.created_at, exposure }))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .routes(routes!(get_run))
        .routes(routes!(create_turn))
        .routes(routes!(get_turn))
}
