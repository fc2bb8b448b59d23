//! Skills: a skill's private runtime (`POST /v1/skills`, `GET /v1/skills`,
//! `GET /v1/skills/{skill_id}`). A run created with `skill_id` is the skill's sub-run: it
//! sees the skill's private tools plus the public tools its manifest allows; the private
//! tools never appear in a main run's exposure (`not_public`, reason `skill_private`).
//! Approvals and evidence apply inside a skill exactly as outside.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::AuthUser;
use super::error::{Json, Path};
use crate::app::App;
use crate::error::{Error, ErrorCode, Result};
use crate::registry::ToolKind;
use crate::store::SkillRow;

/// Most private tools of one skill.
pub const MAX_PRIVATE_TOOLS: usize = 64;
/// Most entries of a skill's `allow_public`.
pub const MAX_ALLOWED_PUBLIC: usize = 256;
/// Most skills of one user.
pub const MAX_SKILLS_PER_USER: usize = 64;
/// Most bytes of a skill's description.
pub const MAX_DESCRIPTION_BYTES: usize = 4096;

/// Body of `POST /v1/skills`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSkill {
    /// 1–64 characters of `A–Z a–z 0–9 _ -`, unique among the caller's skills.
    pub name: String,
    /// What the skill does (at most 4,096 bytes).
    #[serde(default)]
    pub description: String,
    /// The tools private to the skill (1–64 ids): tools registered and visible to the caller
    /// now that are not core or dynamic public tools — internal primitives, legacy entries,
    /// skill-private entries or External MCP projections (`mcp:<serverId>:tool:<name>`).
    pub private_tools: Vec<String>,
    /// The public tool ids the skill's sub-runs may see besides (at most 256; `"*"`: every
    /// public tool; default none).
    #[serde(default)]
    pub allow_public: Vec<String>,
}

/// A skill.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SkillView {
    /// `skl_…`
    pub id: String,
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Tool ids private to the skill.
    pub private_tools: Vec<String>,
    /// Public tool ids its sub-runs may see (`"*"`: all).
    pub allow_public: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
}

impl From<SkillRow> for SkillView {
    fn from(r: SkillRow) -> Self {
        Self {
            private_tools: r.private_tools(),
            allow_public: r.allowed_public(),
            id: r.id,
            name: r.name,
            description: r.description,
            created_at: r.created_at,
        }
    }
}

/// `{"skills": [...]}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SkillList {
    /// By name.
    pub skills: Vec<SkillView>,
}

fn check(app: &App, user: &AuthUser, body: &CreateSkill) -> Result<()> {
    let name_ok = (1..=64).contains(&body.name.len())
        && body.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        return Err(Error::invalid_field("name", "name must be 1–64 characters of A–Z, a–z, 0–9, _ and -"));
    }
    if body.description.len() > MAX_DESCRIPTION_BYTES {
        return Err(Error::invalid_field("description", format!("description is over {MAX_DESCRIPTION_BYTES} bytes")));
    }
    if body.private_tools.is_empty() || body.private_tools.len() > MAX_PRIVATE_TOOLS {
        return Err(Error::invalid_field("private_tools", format!("give 1–{MAX_PRIVATE_TOOLS} private tool ids")));
    }
    if body.allow_public.len() > MAX_ALLOWED_PUBLIC || body.allow_public.iter().any(|a| a.is_empty() || a.len() > 256) {
        return Err(Error::invalid_field(
            "allow_public",
            format!("allow_public takes at most {MAX_ALLOWED_PUBLIC} tool ids of 1–256 bytes"),
        ));
    }
    for id in &body.private_tools {
        let Some(entry) = app.registry.get(id, &user.user_id) else {
            return Err(Error::invalid_field("private_tools", format!("no tool {id:?} is registered for you")));
        };
        if matches!(entry.spec().kind, ToolKind::Public | ToolKind::Dynamic) {
            return Err(Error::invalid_field(
                "private_tools",
                format!(
                    "{id} is a public tool of the runtime; a skill may allow it (allow_public), not make it private"
                ),
            ));
        }
    }
    Ok(())
}

/// Registers a skill with its private tools.
#[utoipa::path(post, path = "/v1/skills", tag = "skills", request_body = CreateSkill,
    responses((status = 201, body = SkillView), (status = 400), (status = 409)), security(("bearer" = [])))]
pub async fn create_skill(
    State(app): State<App>,
    user: AuthUser,
    Json(body): Json<CreateSkill>,
) -> Result<(StatusCode, Json<SkillView>)> {
    check(&app, &user, &body)?;
    let mut private = body.private_tools.clone();
    private.sort();
    private.dedup();
    // Counted and inserted in one transaction under the user's lock: concurrent requests
    // never pass the limit together.
    let row = app
        .store
        .create_skill(&user.user_id, &body.name, &body.description, &private, &body.allow_public, MAX_SKILLS_PER_USER)
        .await
        .map_err(|e| {
            if e.is_unique_violation() {
                Error::conflict(
                    ErrorCode::NameTaken,
                    format!("you have a skill named {}", body.name),
                    serde_json::json!({"field": "name"}),
                )
            } else {
                e.into()
            }
        })?
        .ok_or_else(|| {
            Error::conflict(
                ErrorCode::SkillLimit,
                format!("you have {MAX_SKILLS_PER_USER} skills, the most one user may have"),
                serde_json::Value::Null,
            )
        })?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

/// The caller's skills.
#[utoipa::path(get, path = "/v1/skills", tag = "skills", responses((status = 200, body = SkillList)), security(("bearer" = [])))]
pub async fn list_skills(State(app): State<App>, user: AuthUser) -> Result<Json<SkillList>> {
    let rows = app.store.list_skills(&user.user_id).await?;
    Ok(Json(SkillList { skills: rows.into_iter().map(Into::into).collect() }))
}

/// One of the caller's skills (404 for another user's).
#[utoipa::path(get, path = "/v1/skills/{skill_id}", tag = "skills", params(("skill_id" = String, Path)),
    responses((status = 200, body = SkillView), (status = 404)), security(("bearer" = [])))]
pub async fn get_skill(
    State(app): State<App>,
    user: AuthUser,
    Path(skill_id): Path<String>,
) -> Result<Json<SkillView>> {
    let row = app.store.skill_for(&user.user_id, &skill_id).await?.ok_or(Error::NotFound("skill"))?;
    Ok(Json(row.into()))
}

/// The routes.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(create_skill, list_skills)).routes(routes!(get_skill))
}
