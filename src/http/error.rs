//! The one place where errors become HTTP responses:
//! `{"error": {"code": "snake_case", "message": "sentence", "details": {...}}}`.
//!
//! Also the request extractors ([`Json`], [`Query`], [`Path`]) whose rejections (malformed
//! JSON, a body over the limit, a bad query string) are turned into the same error shape.

use axum::extract::FromRequest;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::Error;
use crate::registry::ErrorClass;
use crate::store::StoreError;

/// The error body's inner object.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case code.
    pub code: String,
    /// Human sentence.
    pub message: String,
    /// Structured details (may be null).
    #[schema(value_type = Object)]
    pub details: Value,
}

/// `{"error": ErrorBody}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

impl Error {
    /// The HTTP status and code of this error.
    pub fn status_and_code(&self) -> (StatusCode, String) {
        match self {
            Error::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized".into()),
            Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden".into()),
            Error::ForbiddenCode { code, .. } => (StatusCode::FORBIDDEN, (*code).into()),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found".into()),
            Error::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, (*code).into()),
            Error::Conflict { code, .. } => (StatusCode::CONFLICT, (*code).into()),
            Error::InputInvalid { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "input_invalid".into()),
            Error::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type".into()),
            Error::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed".into()),
            Error::TooLarge { code, .. } => (StatusCode::PAYLOAD_TOO_LARGE, (*code).into()),
            Error::TooManyRequests { code, .. } => (StatusCode::TOO_MANY_REQUESTS, (*code).into()),
            Error::Tool(e) => {
                let status = match e.class {
                    ErrorClass::BadInput => StatusCode::BAD_REQUEST,
                    ErrorClass::Conflict => StatusCode::CONFLICT,
                    ErrorClass::NotFound => StatusCode::NOT_FOUND,
                    ErrorClass::Forbidden => StatusCode::FORBIDDEN,
                    ErrorClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                    ErrorClass::Failed => StatusCode::UNPROCESSABLE_ENTITY,
                };
                (status, e.code.clone())
            }
            Error::Store(StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable".into())
            }
            Error::Store(_) | Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal".into()),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let (message, details) = match &self {
            Error::Store(e) => {
                tracing::error!(error = %e, "store error");
                ("the store failed; the request changed nothing it reported".to_owned(), Value::Null)
            }
            Error::Internal(e) => {
                tracing::error!(error = %e, "internal error");
                ("internal error".to_owned(), Value::Null)
            }
            Error::NotFound(what) => (format!("{what} not found"), json!({"resource": what})),
            Error::BadRequest { message, details, .. } | Error::Conflict { message, details, .. } => {
                (message.clone(), details.clone())
            }
            Error::InputInvalid { errors } => (self.to_string(), json!({"errors": errors})),
            Error::Tool(e) => (e.message.clone(), e.details.clone()),
            other => (other.to_string(), Value::Null),
        };
        let body = ErrorResponse { error: ErrorBody { code, message, details } };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<JsonRejection> for Error {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonSyntaxError(e) => {
                Error::bad_request("invalid_json", format!("body is not valid JSON: {}", e.body_text()))
            }
            JsonRejection::JsonDataError(e) => Error::bad_request("invalid_request", e.body_text()),
            JsonRejection::MissingJsonContentType(_) => {
                Error::UnsupportedMediaType("expected Content-Type: application/json".into())
            }
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Error::TooLarge {
                code: "body_too_large",
                message: "request body is larger than the server's limit".into(),
            },
            other => Error::bad_request("invalid_request", other.body_text()),
        }
    }
}

impl From<QueryRejection> for Error {
    fn from(r: QueryRejection) -> Self {
        Error::bad_request("invalid_query", r.body_text())
    }
}

impl From<PathRejection> for Error {
    fn from(r: PathRejection) -> Self {
        Error::bad_request("invalid_path_parameter", r.body_text())
    }
}

/// `axum::Json` with our error shape on rejection.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(Error))]
pub struct Json<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Query` with our error shape on rejection.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(Error))]
pub struct Query<T>(pub T);

/// `axum::extract::Path` with our error shape on rejection.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(Error))]
pub struct Path<T>(pub T);
