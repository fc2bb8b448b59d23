//! `GET /v1/admin/replicas`: the replica registry (see [`crate::cluster`]), and the internal
//! routes replicas call on each other (forwarded executions, device jobs, runner requests and
//! cuts, stdio MCP connects).

use axum::extract::State;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use tokio_util::sync::CancellationToken;

use super::auth::AuthUser;
use super::error::Json;
use crate::app::App;
use crate::cluster::forward::{ExecuteAnswer, ExecuteRequest, SECRET_HEADER, forwardable};
use crate::error::{Error, ErrorCode, Result};
use crate::harness::{CommitGate, Executor, LocalExecutor};
use crate::registry::ToolError;
use crate::state::InvocationStatus;
use crate::store::ReplicaRow;
use crate::workspace::HardLinks;

/// A request from another replica of the cluster: the extractor of the internal routes,
/// which answers 401 `unauthorized` unless the request carries the cluster secret
/// ([`SECRET_HEADER`], compared in constant time; always 401 when no secret is configured).
pub struct ClusterCaller;

impl axum::extract::FromRequestParts<App> for ClusterCaller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<Self> {
        let given = parts.headers.get(SECRET_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
        if app.node.config.secret_matches(given) { Ok(ClusterCaller) } else { Err(Error::Unauthorized) }
    }
}

/// One replica and whether it counts as running now.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ReplicaView {
    /// The stored row.
    #[serde(flatten)]
    pub replica: ReplicaRow,
    /// `state` is `alive` and the heartbeat is younger than `--replica-dead-after-secs`.
    pub live: bool,
    /// This is the replica that answered.
    pub this: bool,
}

/// The registry.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ReplicaList {
    /// Every replica ever registered on this database, by node id.
    pub replicas: Vec<ReplicaView>,
}

/// The replicas sharing this database (admin only).
#[utoipa::path(get, path = "/v1/admin/replicas", tag = "service",
    responses((status = 200, body = ReplicaList), (status = 403)),
    security(("bearer" = [])))]
pub async fn list_replicas(State(app): State<App>, user: AuthUser) -> Result<Json<ReplicaList>> {
    user.require_admin()?;
    let replicas = app
        .store
        .list_replicas()
        .await?
        .into_iter()
        .map(|r| ReplicaView { live: app.node.is_alive(&r), this: r.node_id == app.node.id, replica: r })
        .collect();
    Ok(Json(ReplicaList { replicas }))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_replicas))
}

/// `POST /internal/v1/execute`: runs a terminal action or a stdio MCP call forwarded by the
/// replica that claimed it (see [`crate::cluster::forward`]), or a device execution (a Read or
/// Edit call, a `terminal_session` action of a run bound to a device whose runner this
/// replica holds: [`crate::devices::executor::execute_on_device`], which keeps a device
/// session's books here), after gating it again here
/// ([`crate::harness::Harness::gate`], the tool family's frozen-input check and the ladder's
/// availability, [`App::check_still_available`]: what changed between the freeze and the
/// forward is refused, nothing runs). Not part of the public API: it
/// answers only requests carrying the cluster secret (401 otherwise, and always when no
/// secret is configured).
pub async fn internal_execute(
    State(app): State<App>,
    _caller: ClusterCaller,
    Json(body): Json<ExecuteRequest>,
) -> Result<axum::Json<ExecuteAnswer>> {
    let inv = app.store.invocation_by_id(&body.invocation_id).await?.ok_or(Error::NotFound("invocation"))?;
    if inv.status != InvocationStatus::Running || inv.claimed_by.as_deref() != Some(body.claimed_by.as_str()) {
        return Err(Error::Conflict {
            code: ErrorCode::LeaseLost,
            message: format!("{} is not running under the claim of {}", inv.id, body.claimed_by),
            details: serde_json::json!({"status": inv.status}),
        });
    }
    let capability = app.registry.get_any(&inv.tool_id).and_then(|e| e.spec().capability.clone());
    let device = crate::devices::executor::device_of_call(&app.store, &inv, capability.as_deref()).await?;
    if device.is_none() && !forwardable(&inv.tool_id) {
        return Err(Error::bad_request(
            ErrorCode::InvalidField,
            "only terminal session actions, MCP calls and device executions are forwarded",
        ));
    }
    if let Err(e) = app.registry.check_frozen(&inv.tool_id, &inv.input) {
        return Ok(axum::Json(ExecuteAnswer::Err(e)));
    }
    // Availability may have changed since the freeze (a device revoked, an MCP server no
    // longer connected, a workspace root replaced): the owner asks the ladder again.
    if let Err(e) = app.check_still_available(&inv).await {
        return Ok(axum::Json(ExecuteAnswer::Err(e)));
    }
    let entry = app.registry.get_any(&inv.tool_id);
    // Defence in depth: the claimer gated it, and the owner gates it again before acting.
    if let Some(entry) = &entry
        && let Err(e) = app.harness.gate(&inv, entry, None).await
    {
        return Ok(axum::Json(ExecuteAnswer::Err(e)));
    }
    let answer = match entry {
        None => {
            ExecuteAnswer::Err(ToolError::new(ErrorCode::ToolGone, format!("{} is no longer registered", inv.tool_id)))
        }
        Some(entry) => match serde_json::from_str::<serde_json::Value>(&inv.input) {
            Err(e) => ExecuteAnswer::Err(ToolError::new(ErrorCode::CorruptInput, e.to_string())),
            Ok(input) => {
                // The claimer closing the connection (a cancel, its time limit) stops the action.
                let cancel = CancellationToken::new();
                let _stop_on_drop = cancel.clone().drop_guard();
                let outcome = match &device {
                    // A device execution: sent once to the runner this replica holds (a runner
                    // that moved meanwhile makes it `device_offline`, nothing sent).
                    Some(device) => {
                        crate::devices::executor::execute_on_device(
                            &app.devices,
                            &app.store,
                            &inv,
                            device,
                            &input,
                            &cancel,
                            None,
                        )
                        .await
                    }
                    None => {
                        let hard_links =
                            if app.config.allow_hard_link_reads { HardLinks::Allow } else { HardLinks::Refuse };
                        let local = LocalExecutor::new(app.store.clone(), hard_links, &app.node.id);
                        local.execute(&inv, None, &entry, &input, cancel.clone(), CommitGate::new()).await
                    }
                };
                match outcome {
                    Ok(out) => ExecuteAnswer::Ok(out),
                    Err(e) => ExecuteAnswer::Err(e),
                }
            }
        },
    };
    Ok(axum::Json(answer))
}

/// Body of `POST /internal/v1/mcp/connect` and `…/discover`.
#[derive(serde::Deserialize)]
pub struct ConnectRequest {
    /// The stdio MCP server this replica holds.
    pub server_id: String,
}

/// `POST /internal/v1/mcp/connect`: an explicit connect of a stdio MCP server this replica
/// holds, asked through another replica ([`crate::mcp::McpManager::connect`]). 204; 401
/// without the cluster secret; 404 for an unknown server.
pub async fn internal_mcp_connect(
    State(app): State<App>,
    _caller: ClusterCaller,
    Json(body): Json<ConnectRequest>,
) -> Result<axum::http::StatusCode> {
    app.mcp.connect_here(&body.server_id)?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `POST /internal/v1/mcp/discover`: `tools/list` (after the re-discovery interval) on a stdio MCP server this replica
/// holds, asked through another replica ([`crate::mcp::McpManager::discover`]). 204 when the
/// listing is stored; the discovery's own error (409 `mcp_not_connected`,
/// `mcp_discovery_failed`) otherwise; 401 without the cluster secret; 404 for an unknown server.
pub async fn internal_mcp_discover(
    State(app): State<App>,
    _caller: ClusterCaller,
    Json(body): Json<ConnectRequest>,
) -> Result<axum::http::StatusCode> {
    app.mcp.discover_here(&body.server_id).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `POST /internal/v1/devices/job` `{run_id, phase, tool_id, input}`: a prepare or
/// canonicalize job for a run bound to a device whose runner this replica holds, asked through
/// another replica ([`crate::devices::DeviceHub::job_anywhere`]). The request names the call
/// only: the owner, the device and the workspace the job is signed for are the run's
/// ([`crate::devices::DeviceHub::forwarded_spec`]; any other field is refused). Answers the
/// runner's outcome or the job's error (`device_offline` when the runner is not connected here
/// any more); 400 for an execution (those come through `/internal/v1/execute`, under the
/// claimer's lease) or a tool that does not run on a device; 404 for an unknown run; 403 for a
/// run not bound to a device of its owner; 401 without the cluster secret.
pub async fn internal_device_job(
    State(app): State<App>,
    _caller: ClusterCaller,
    Json(body): Json<crate::devices::ForwardedJob>,
) -> Result<axum::Json<crate::devices::ForwardedAnswer>> {
    use crate::devices::ForwardedAnswer;
    let capability = app.registry.get_any(&body.tool_id).and_then(|e| e.spec().capability.clone());
    if !crate::devices::executor::runs_on_device(capability.as_deref()) {
        return Err(Error::bad_request(
            ErrorCode::InvalidField,
            format!("{} does not run on a device; only its calls are prepared there", body.tool_id),
        ));
    }
    let (device, spec) = app.devices.forwarded_spec(body).await?;
    let answer = match app.devices.job(&device, spec, &CancellationToken::new()).await {
        Ok(outcome) => ForwardedAnswer::Ok(outcome),
        Err(e) => ForwardedAnswer::Err(e),
    };
    Ok(axum::Json(answer))
}

/// `POST /internal/v1/devices/cut` `{device_id}`: a device revoked, or enrolled with a new key,
/// on another replica; this replica cuts its runner's connection at once when it holds one the
/// store no longer names ([`crate::devices::DeviceHub::cut_stale_here`]; the connection the
/// device row still names is left alone). Answers `{cut}`; 401 without the cluster secret.
pub async fn internal_device_cut(
    State(app): State<App>,
    _caller: ClusterCaller,
    Json(body): Json<crate::devices::CutRequest>,
) -> Result<axum::Json<crate::devices::CutAnswer>> {
    let cut = app.devices.cut_stale_here(&body.device_id).await?;
    Ok(axum::Json(crate::devices::CutAnswer { cut }))
}

fn runner_session(headers: &axum::http::HeaderMap) -> Result<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Error::Tool(ToolError::new(ErrorCode::DeviceAuthFailed, "the runner session is missing")))
}

/// `POST /internal/v1/runner/heartbeat`: a runner's heartbeat that landed on another replica,
/// for the connection this replica holds (session bearer as the runner sent it). 204; 401
/// `device_auth_failed` when this replica does not hold that session (or it was replaced).
pub async fn internal_runner_heartbeat(
    State(app): State<App>,
    _caller: ClusterCaller,
    headers: axum::http::HeaderMap,
) -> Result<axum::http::StatusCode> {
    app.devices.heartbeat_here(runner_session(&headers)?).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `POST /internal/v1/runner/results`: a runner's job result that landed on another replica,
/// for the connection this replica holds: the call waiting here gets it. 204; 401
/// `device_auth_failed` when this replica does not hold that session.
pub async fn internal_runner_results(
    State(app): State<App>,
    _caller: ClusterCaller,
    headers: axum::http::HeaderMap,
    Json(body): Json<mira_core::remote::JobResult>,
) -> Result<axum::http::StatusCode> {
    app.devices.deliver_here(runner_session(&headers)?, body).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// The internal routes replicas call on each other (outside the OpenAPI document and the
/// request timeout: a forwarded `wait` lasts as long as the action).
pub fn internal_router() -> axum::Router<App> {
    axum::Router::new()
        .route("/internal/v1/execute", axum::routing::post(internal_execute))
        .route("/internal/v1/mcp/connect", axum::routing::post(internal_mcp_connect))
        .route("/internal/v1/mcp/discover", axum::routing::post(internal_mcp_discover))
        .route("/internal/v1/devices/job", axum::routing::post(internal_device_job))
        .route("/internal/v1/devices/cut", axum::routing::post(internal_device_cut))
        .route("/internal/v1/runner/heartbeat", axum::routing::post(internal_runner_heartbeat))
        .route("/internal/v1/runner/results", axum::routing::post(internal_runner_results))
}
