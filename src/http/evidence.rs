//! Evidence and the Planner's acceptance.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Page;
use super::auth::AuthUser;
use super::error::{Json, Path, Query};
use super::runs::owned_run;
use crate::app::App;
use crate::error::{Error, Result};
use crate::store::{EvidenceRow, json_col};

/// The Planner's judgement.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Acceptance {
    /// Accepted or rejected.
    pub accepted: bool,
    /// Note.
    pub note: Option<String>,
    /// RFC 3339.
    pub at: Option<String>,
    /// Judging user.
    pub by: Option<String>,
}

/// A piece of evidence.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EvidenceView {
    /// `evd_…`
    pub id: String,
    /// The invocation that produced it.
    pub invocation_id: String,
    /// Run.
    pub run_id: String,
    /// Tool.
    pub tool_id: String,
    /// Kind of fact (`file_excerpt`, `grep_match`, `directory_listing`, `tool_error`…).
    pub kind: String,
    /// Where it came from (path, line range, file SHA-256…).
    #[schema(value_type = Object)]
    pub provenance: Value,
    /// SHA-256 of the content the evidence speaks for.
    pub content_sha256: String,
    /// Bounded excerpt.
    pub excerpt: String,
    /// RFC 3339.
    pub created_at: String,
    /// Absent until the Planner judges it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Acceptance>,
}

fn view(row: EvidenceRow) -> Result<EvidenceView> {
    Ok(EvidenceView {
        provenance: json_col(&row.provenance)?,
        acceptance: row.accepted.map(|a| Acceptance {
            accepted: a,
            note: row.acceptance_note,
            at: row.accepted_at,
            by: row.accepted_by,
        }),
        id: row.id,
        invocation_id: row.invocation_id,
        run_id: row.run_id,
        tool_id: row.tool_id,
        kind: row.kind,
        content_sha256: row.content_sha256,
        excerpt: row.excerpt,
        created_at: row.created_at,
    })
}

/// `{"evidence": [...], "next_cursor"}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EvidenceList {
    /// Oldest first.
    pub evidence: Vec<EvidenceView>,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
}

/// A run's evidence.
#[utoipa::path(get, path = "/v1/runs/{run_id}/evidence", tag = "evidence", params(("run_id" = String, Path), Page),
    responses((status = 200, body = EvidenceList), (status = 404)), security(("bearer" = [])))]
pub async fn list_evidence(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<EvidenceList>> {
    let run = owned_run(&app, &user, &run_id).await?;
    let limit = page.limit()?;
    let rows = app.store.list_evidence(&run.id, page.cursor.as_deref(), limit + 1).await?;
    let (rows, next_cursor) = Page::split(rows, limit, |r| r.id.clone());
    Ok(Json(EvidenceList { evidence: rows.into_iter().map(view).collect::<Result<_>>()?, next_cursor }))
}

/// One piece of evidence.
#[utoipa::path(get, path = "/v1/evidence/{evidence_id}", tag = "evidence", params(("evidence_id" = String, Path)),
    responses((status = 200, body = EvidenceView), (status = 404)), security(("bearer" = [])))]
pub async fn get_evidence(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<EvidenceView>> {
    let row = app.store.evidence_for(&user.user_id, &id).await?.ok_or(Error::NotFound("evidence"))?;
    Ok(Json(view(row)?))
}

/// Body of an acceptance.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptanceBody {
    /// Whether the Planner accepts the evidence.
    pub accepted: bool,
    /// Note (at most 2,000 characters).
    #[schema(max_length = 2000)]
    pub note: Option<String>,
}

/// Records the Planner's judgement of a piece of evidence (a later one replaces it).
#[utoipa::path(post, path = "/v1/evidence/{evidence_id}/acceptance", tag = "evidence", params(("evidence_id" = String, Path)),
    request_body = AcceptanceBody, responses((status = 200, body = EvidenceView), (status = 404)), security(("bearer" = [])))]
pub async fn accept(
    State(app): State<App>,
    user: AuthUser,
    Path(id): Path<String>,
    Json(body): Json<AcceptanceBody>,
) -> Result<Json<EvidenceView>> {
    if body.note.as_ref().is_some_and(|n| n.len() > 2000) {
        return Err(Error::invalid_field("note", "note must be at most 2000 characters"));
    }
    let row = app
        .store
        .judge_evidence(&user.user_id, &id, body.accepted, body.note.as_deref())
        .await?
        .ok_or(Error::NotFound("evidence"))?;
    // The user's past uses changed (learning from use): their next turn reads them again.
    app.usage.forget(&user.user_id);
    Ok(Json(view(row)?))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(list_evidence)).routes(routes!(get_evidence)).routes(routes!(accept))
}
