//! `GET /v1/runs/{run_id}/bundle` (a run as one signed document anyone can verify offline)
//! and `GET /.well-known/mira-signing-key` (the public key that signs it). docs/verify.md.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::error::{Error, ErrorCode, Result};
use crate::http::auth::AuthUser;
use crate::http::error::Path;
use crate::store::RunDocument;
use crate::verify::BUNDLE_MAX_BYTES;

/// Most run bundles one server builds at once; a request waits up to [`BUNDLE_WAIT`] for a
/// place, then gets 429 `too_many_bundles`. A bundle holds its document (up to 64 MiB) and a
/// page of rows in memory while it is built, signed and sent, so this bounds the memory
/// bundles can take.
pub const MAX_CONCURRENT_BUNDLES: usize = 2;

/// How long a bundle request waits for a place before 429 `too_many_bundles`.
pub const BUNDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The server's bundle-signing public key.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SigningKeyView {
    /// Always `ed25519`.
    pub algorithm: &'static str,
    /// The Ed25519 public key, 64 lowercase hex digits (RFC 8032 encoding).
    pub public_key: String,
    /// The format of the documents it signs: `mira-run-bundle-v1`.
    pub format: &'static str,
}

/// The public key run bundles are signed with (no token needed): pin it and pass it to
/// `mira verify --key`.
#[utoipa::path(get, path = "/.well-known/mira-signing-key", tag = "runs",
    responses((status = 200, body = SigningKeyView)))]
pub async fn signing_key(State(app): State<App>) -> axum::Json<SigningKeyView> {
    axum::Json(SigningKeyView {
        algorithm: "ed25519",
        public_key: mira_core::remote::public_hex(&app.bundle_key),
        format: mira_core::chain::BUNDLE_FORMAT,
    })
}

/// The whole run as one JSON document signed with the server's Ed25519 key
/// (docs/verify.md, Format): exposures, frozen calls with results, approvals with who decided,
/// evidence with its stored content, every event with its hashes. The run's owner or an admin
/// only (anyone else gets the run's 404). 413 `bundle_too_large` past 64 MiB of records;
/// 429 `too_many_bundles` when [`MAX_CONCURRENT_BUNDLES`] are being built
/// and none finished within [`BUNDLE_WAIT`].
#[utoipa::path(get, path = "/v1/runs/{run_id}/bundle", tag = "runs", params(("run_id" = String, Path)),
    responses((status = 200, description = "the signed bundle (docs/verify.md)", body = Object),
              (status = 404, description = "not_found: no such run of the caller's"),
              (status = 413, description = "bundle_too_large"),
              (status = 429, description = "too_many_bundles: other bundles are being built; retry later")),
    security(("bearer" = [])))]
pub async fn get_bundle(
    State(app): State<App>,
    user: AuthUser,
    Path(run_id): Path<String>,
) -> Result<impl IntoResponse> {
    if !user.is_admin {
        crate::http::runs::owned_run(&app, &user, &run_id).await?;
    }
    let _slot = match tokio::time::timeout(BUNDLE_WAIT, Arc::clone(&app.bundle_slots).acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => return Err(Error::Internal("the bundle slots are closed".into())),
        Err(_) => {
            return Err(Error::TooManyRequests {
                code: ErrorCode::TooManyBundles,
                message: format!(
                    "{MAX_CONCURRENT_BUNDLES} run bundles are being built; none finished within {} s, try again",
                    BUNDLE_WAIT.as_secs()
                ),
            });
        }
    };
    let text = match app.store.run_bundle(&run_id, BUNDLE_MAX_BYTES).await? {
        RunDocument::Document(doc) => doc,
        RunDocument::NotFound => return Err(Error::NotFound("run")),
        RunDocument::TooLarge(bytes) => {
            return Err(Error::TooLarge {
                code: ErrorCode::BundleTooLarge,
                message: format!(
                    "the run's records pass {bytes} bytes, more than the {BUNDLE_MAX_BYTES} a bundle may hold"
                ),
            });
        }
    };
    // The document was read in the form its signature covers: signed and sent as those bytes,
    // not serialised again.
    let body = crate::verify::sign_text(text, &app.bundle_key);
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body))
}

/// Routes of this module.
pub fn router() -> OpenApiRouter<App> {
    OpenApiRouter::new().routes(routes!(get_bundle)).routes(routes!(signing_key))
}
