//! Devices (`/v1/devices…`: register, enrollment codes, list, rename, revoke) and the runner
//! protocol (`/v1/runner/…`: enroll, challenge, connect, heartbeat, results), which a
//! `mira runner` on the user's machine speaks outbound (docs/runner.md). The runner routes
//! authenticate with the device key and the connection's session, not with a user token, and
//! are not part of the OpenAPI document.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mira_core::remote::{Advertised, ChallengeRequest, ConnectRequest, EnrollRequest, JobResult, ServerMessage};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use crate::app::App;
use crate::devices::Presence;
use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::store::DeviceRow;

/// A one-time enrollment code, shown once.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Enrollment {
    /// The code for `mira runner enroll --code` (only its SHA-256 is stored).
    pub code: String,
    /// RFC 3339; the code is refused after it.
    pub expires_at: String,
}

/// A device and its runner.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeviceView {
    /// `dev_…`
    pub id: String,
    /// Name.
    pub name: String,
    /// Capabilities: the declared ones plus those its runner advertised (`fs.read`,
    /// `fs.write`, `pty`, `net`).
    pub capabilities: Vec<String>,
    /// Whether its runner is connected with a valid heartbeat lease now.
    pub connected: bool,
    /// `connected`, `offline` (enrolled, lease ran out), `revoked` or `not_enrolled`.
    pub status: String,
    /// The last heartbeat of its runner (RFC 3339).
    pub last_seen_at: Option<String>,
    /// When its runner enrolled (RFC 3339).
    pub enrolled_at: Option<String>,
    /// When it was revoked (RFC 3339).
    pub revoked_at: Option<String>,
    /// What its runner advertised when it last connected: capabilities, tools, workspace
    /// folders, version.
    pub advertised: Option<Advertised>,
    /// The expiry of a pending enrollment code (the code itself is shown only once).
    pub enrollment_expires_at: Option<String>,
    /// A new enrollment code (only in the answer that created it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enrollment: Option<Enrollment>,
    /// RFC 3339.
    pub created_at: String,
}

async fn view(app: &App, d: DeviceRow) -> DeviceView {
    let (info, presence) = app.device_info_and_presence(&d).await;
    let advertised = match &presence {
        Presence::Connected(a) => Some(a.clone()),
        _ => d.advertised.as_deref().and_then(|a| serde_json::from_str(a).ok()),
    };
    DeviceView {
        id: d.id,
        name: d.name,
        capabilities: info.capabilities,
        connected: matches!(presence, Presence::Connected(_)),
        status: presence.as_str().to_owned(),
        last_seen_at: d.last_seen_at,
        enrolled_at: d.enrolled_at,
        revoked_at: d.revoked_at,
        advertised,
        enrollment_expires_at: d.enroll_expires_at,
        enrollment: None,
        created_at: d.created_at,
    }
}

/// Body of `POST /v1/devices`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDevice {
    /// Name, at most 128 bytes.
    #[schema(max_length = 128)]
    pub name: String,
    /// Capability strings, at most 32 of at most 64 characters.
    #[serde(default)]
    #[schema(max_items = 32)]
    pub capabilities: Vec<String>,
}

/// Body of `PATCH /v1/devices/{device_id}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameDevice {
    /// The new name, 1-128 bytes.
    #[schema(max_length = 128)]
    pub name: String,
}

/// `{"devices": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DeviceList {
    /// The caller's devices.
    pub devices: Vec<DeviceView>,
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 128 {
        return Err(Error::invalid_field("name", "name must be 1-128 bytes"));
    }
    Ok(())
}

async fn owned(app: &App, user: &AuthUser, device_id: &str) -> Result<DeviceRow> {
    if !crate::ids::is_well_formed(device_id, "dev") {
        return Err(Error::NotFound("device"));
    }
    app.store.device_for(&user.user_id, device_id).await?.ok_or(Error::NotFound("device"))
}

/// Registers a device and returns its one-time enrollment code; availability of tools on
/// runs bound to it follows its runner.
#[utoipa::path(post, path = "/v1/devices", tag = "devices", request_body = CreateDevice,
    responses((status = 201, body = DeviceView), (status = 400)), security(("bearer" = [])))]
pub async fn create_device(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateDevice>,
) -> Result<(StatusCode, Json<DeviceView>)> {
    if body.name.is_empty()
        || body.name.len() > 128
        || body.capabilities.len() > 32
        || body.capabilities.iter().any(|c| c.is_empty() || c.len() > 64)
    {
        return Err(Error::bad_request(
            ErrorCode::InvalidRequest,
            "name must be 1-128 characters; at most 32 capabilities of 1-64 characters",
        ));
    }
    let row = app.store.create_device(&user.user_id, &body.name, &body.capabilities).await?;
    let enrollment = app.devices.new_enrollment_code(&user.user_id, &row.id).await?;
    let row = owned(&app, &user, &row.id).await?;
    let mut view = view(&app, row).await;
    view.enrollment = enrollment.map(|(code, expires_at)| Enrollment { code, expires_at });
    Ok((StatusCode::CREATED, Json(view)))
}

/// The caller's devices with the state of their runners.
#[utoipa::path(get, path = "/v1/devices", tag = "devices", responses((status = 200, body = DeviceList)), security(("bearer" = [])))]
pub async fn list_devices(State(app): State<App>, user: AuthUser) -> Result<Json<DeviceList>> {
    let rows = app.store.list_devices(&user.user_id).await?;
    let mut devices = Vec::with_capacity(rows.len());
    for d in rows {
        devices.push(view(&app, d).await);
    }
    Ok(Json(DeviceList { devices }))
}

/// Renames a device.
#[utoipa::path(patch, path = "/v1/devices/{device_id}", tag = "devices", params(("device_id" = String, Path)),
    request_body = RenameDevice, responses((status = 200, body = DeviceView), (status = 404)), security(("bearer" = [])))]
pub async fn rename_device(
    State(app): State<App>,
    user: AuthUser,
    Path(device_id): Path<String>,
    Json(body): Json<RenameDevice>,
) -> Result<Json<DeviceView>> {
    check_name(&body.name)?;
    owned(&app, &user, &device_id).await?;
    app.store.rename_device(&user.user_id, &device_id, &body.name).await?;
    Ok(Json(view(&app, owned(&app, &user, &device_id).await?).await))
}

/// Revokes a device: its runner's connection is cut at once, it cannot connect again and its
/// tools are `device_revoked`. Revoking again changes nothing.
#[utoipa::path(post, path = "/v1/devices/{device_id}/revoke", tag = "devices", params(("device_id" = String, Path)),
    responses((status = 200, body = DeviceView), (status = 404)), security(("bearer" = [])))]
pub async fn revoke_device(
    State(app): State<App>,
    user: AuthUser,
    Path(device_id): Path<String>,
) -> Result<Json<DeviceView>> {
    owned(&app, &user, &device_id).await?;
    app.devices.revoke(&user.user_id, &device_id).await?;
    Ok(Json(view(&app, owned(&app, &user, &device_id).await?).await))
}

/// A new one-time enrollment code for a device (replacing a pending one), e.g. to enroll a
/// runner again on a new machine. Errors: 403 `device_revoked`.
#[utoipa::path(post, path = "/v1/devices/{device_id}/enrollment-code", tag = "devices", params(("device_id" = String, Path)),
    responses((status = 201, body = Enrollment), (status = 403), (status = 404)), security(("bearer" = [])))]
pub async fn new_enrollment_code(
    State(app): State<App>,
    user: AuthUser,
    Path(device_id): Path<String>,
) -> Result<(StatusCode, Json<Enrollment>)> {
    let row = owned(&app, &user, &device_id).await?;
    let refused =
        || Error::ForbiddenCode { code: ErrorCode::DeviceRevoked, message: format!("device {device_id} was revoked") };
    if row.revoked_at.is_some() {
        return Err(refused());
    }
    let (code, expires_at) = app.devices.new_enrollment_code(&user.user_id, &device_id).await?.ok_or_else(refused)?;
    Ok((StatusCode::CREATED, Json(Enrollment { code, expires_at })))
}

/// Routes of the device resources.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new()
        .routes(routes!(create_device, list_devices))
        .routes(routes!(rename_device))
        .routes(routes!(revoke_device))
        .routes(routes!(new_enrollment_code))
}

/// `POST /v1/runner/enroll`: a runner registers its public key with a one-time code. Wrong
/// codes are limited per client address and per process: 429 `enrollment_rate_limited` with
/// `Retry-After` (seconds).
async fn runner_enroll(
    State(app): State<App>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<crate::limits::PeerAddr>>>,
    Json(body): Json<EnrollRequest>,
) -> Result<Response> {
    let client = peer.map(|axum::Extension(axum::extract::ConnectInfo(p))| p.0.ip());
    match app.devices.enroll(&body, client).await {
        Ok(answer) => Ok(Json(answer).into_response()),
        Err(crate::devices::HubError::Limited(wait)) => {
            let secs = crate::devices::retry_after_secs(wait);
            let mut response = Error::from(crate::devices::HubError::Limited(wait)).into_response();
            response.headers_mut().insert(header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
            Ok(response)
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/runner/challenge`.
async fn runner_challenge(State(app): State<App>, Json(body): Json<ChallengeRequest>) -> Result<Response> {
    Ok(Json(app.devices.challenge(&body.device_id).await?).into_response())
}

/// `POST /v1/runner/connect`: the signed challenge; answers a stream of NDJSON lines
/// ([`ServerMessage`]) that lasts as long as the connection.
async fn runner_connect(State(app): State<App>, Json(body): Json<ConnectRequest>) -> Result<Response> {
    let attached = app.devices.connect(body).await?;
    let ping = app.devices.settings().lease / 3;
    let shutdown = app.shutdown.clone();
    let stream = futures::stream::unfold(attached, move |mut a| {
        let shutdown = shutdown.clone();
        async move {
            let message = tokio::select! {
                m = a.rx.recv() => m?,
                () = a.cut.cancelled() => return None,
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(ping) => ServerMessage::Ping,
            };
            let mut line = serde_json::to_vec(&message).unwrap_or_default();
            line.push(b'\n');
            Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)), a))
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-store")],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

fn session(headers: &HeaderMap) -> Result<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).ok_or_else(
        || Error::Tool(crate::registry::ToolError::new(ErrorCode::DeviceAuthFailed, "the runner session is missing")),
    )
}

/// `POST /v1/runner/heartbeat` (session bearer): renews the lease.
async fn runner_heartbeat(State(app): State<App>, headers: HeaderMap) -> Result<StatusCode> {
    app.devices.heartbeat(session(&headers)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/runner/results` (session bearer): a job's outcome.
async fn runner_result(State(app): State<App>, headers: HeaderMap, Json(body): Json<JobResult>) -> Result<StatusCode> {
    app.devices.deliver(session(&headers)?, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/runner/terminal/output?session_id=&offset=` (session bearer): raw output bytes
/// of a device's terminal session at a byte offset; answers `{bytes_out}` held.
async fn runner_terminal_output(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<mira_core::remote::TerminalChunkQuery>,
    body: axum::body::Bytes,
) -> Result<Response> {
    let retain = app.config.terminal.retain_bytes;
    Ok(Json(app.devices.terminal_output(session(&headers)?, &q, &body, retain).await?).into_response())
}

/// `POST /v1/runner/terminal/end` (session bearer): how a device's terminal session ended.
async fn runner_terminal_end(
    State(app): State<App>,
    headers: HeaderMap,
    Json(body): Json<mira_core::remote::TerminalEnd>,
) -> Result<Response> {
    Ok(Json(app.devices.terminal_end(session(&headers)?, &body).await?).into_response())
}

/// `POST /v1/runner/cdp?channel=&seq=` (session bearer): the messages of a device's
/// browser for a DevTools channel, one per line (at most
/// [`mira_core::remote::CDP_UPLOAD_MAX`] bytes).
async fn runner_cdp(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<mira_core::remote::CdpUpQuery>,
    body: axum::body::Bytes,
) -> Result<StatusCode> {
    app.devices.cdp_upload(session(&headers)?, &q, &body)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/runner/cdp/state` (session bearer): a DevTools channel opened or closed on
/// the device.
async fn runner_cdp_state(
    State(app): State<App>,
    headers: HeaderMap,
    Json(body): Json<mira_core::remote::CdpState>,
) -> Result<StatusCode> {
    app.devices.cdp_state(session(&headers)?, body)?;
    Ok(StatusCode::NO_CONTENT)
}

/// The runner protocol's routes (outside the OpenAPI document; docs/runner.md).
pub fn runner_router() -> axum::Router<App> {
    use axum::routing::post;
    axum::Router::new()
        .route("/v1/runner/enroll", post(runner_enroll))
        .route("/v1/runner/challenge", post(runner_challenge))
        .route("/v1/runner/connect", post(runner_connect))
        .route("/v1/runner/heartbeat", post(runner_heartbeat))
        .route("/v1/runner/results", post(runner_result))
        .route("/v1/runner/terminal/output", post(runner_terminal_output))
        .route("/v1/runner/terminal/end", post(runner_terminal_end))
        .route(
            "/v1/runner/cdp",
            post(runner_cdp).layer(axum::extract::DefaultBodyLimit::max(mira_core::remote::CDP_UPLOAD_MAX)),
        )
        .route("/v1/runner/cdp/state", post(runner_cdp_state))
}
