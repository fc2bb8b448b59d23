//! The one place where errors become HTTP responses:
//! `{"error": {"code": "snake_case", "message": "sentence", "details": {...}}}`.
//!
//! Also the request extractors ([`Json`], [`Query`], [`Path`]) whose rejections (malformed
//! JSON, a body over the limit, a bad query string) are turned into the same error shape.

use axum::extract::FromRequest;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::{Error, ErrorCode};

/// The error body's inner object.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case code, one of the `ErrorCode` catalogue.
    pub code: ErrorCode,
    /// Human sentence.
    pub message: String,
    /// Structured details (may be null).
    #[schema(value_type = Option<Object>)]
    pub details: Value,
}

/// `{"error": ErrorBody}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

impl Error {
    /// The HTTP status and code of this error: the code's status in the catalogue.
    pub fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        let code = self.code();
        (status_of(code), code)
    }
}

/// The HTTP status of `code` ([`ErrorCode::status`]).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl Error {
    /// The error's body, `{"error": {code, message, details}}`, as every answer carries it
    /// (also the text of an MCP tool error, [`crate::mcp_server`]). Store and internal
    /// failures are logged here and described without their cause.
    pub fn body(&self) -> ErrorResponse {
        let code = self.code();
        let (message, details) = match self {
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
            Error::ScopeMissing(scope) => (self.to_string(), json!({"needed": scope})),
            Error::InputInvalid { errors } => (self.to_string(), json!({"errors": errors})),
            Error::Tool(e) => (e.message.clone(), e.details.clone()),
            other => (other.to_string(), Value::Null),
        };
        ErrorResponse { error: ErrorBody { code, message, details } }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = status_of(self.code());
        let mut response = (status, axum::Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<PathRejection> for Error {
    fn from(r: PathRejection) -> Self {
        Error::bad_request(ErrorCode::InvalidPathParameter, r.body_text())
    }
}

/// A JSON request body, read with one error code per kind of bad body (the catalogue):
///
/// | body | status | code |
/// |---|---|---|
/// | empty (no bytes, or only whitespace), whatever the `Content-Type` | 400 | `invalid_json` |
/// | not JSON: a syntax error, truncated, invalid UTF-8, a lone surrogate, trailing data | 400 | `invalid_json` |
/// | JSON of the wrong shape: a wrong type, a missing or unknown field, a value out of its range, NUL (U+0000) in a string | 400 | `invalid_request` |
/// | a non-empty body whose `Content-Type` is not `application/json` (or `+json`) | 415 | `unsupported_media_type` |
/// | larger than `--body-limit` | 413 | `body_too_large` |
///
/// Shape errors name the field (`details.field`). NUL is refused in every string because
/// PostgreSQL cannot store it ([`super::storable`]), except inside a
/// [`JsonDocument`](super::storable::JsonDocument) field.
pub struct Json<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Error;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Error> {
        let json_type =
            req.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
                let mime = v.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
                mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
            });
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Error::TooLarge {
                    code: ErrorCode::BodyTooLarge,
                    message: "request body is larger than the server's limit".into(),
                }
            } else {
                Error::bad_request(
                    ErrorCode::InvalidRequest,
                    format!("the request body could not be read: {}", e.body_text()),
                )
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::bad_request(
                ErrorCode::InvalidJson,
                "the request body is empty; this operation takes a JSON document",
            ));
        }
        if !json_type {
            return Err(Error::UnsupportedMediaType("expected Content-Type: application/json".into()));
        }
        match super::storable::from_json(&bytes) {
            Ok(value) => Ok(Json(value)),
            Err(super::storable::BodyError::Syntax(message)) => {
                Err(Error::bad_request(ErrorCode::InvalidJson, format!("body is not valid JSON: {message}")))
            }
            Err(super::storable::BodyError::Shape { path, message }) => Err(Error::BadRequest {
                code: ErrorCode::InvalidRequest,
                message: if path == "." { message } else { format!("{path}: {message}") },
                details: json!({"field": path}),
            }),
        }
    }
}

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Query` with our error shape: 400 `invalid_query` for a parameter that does
/// not parse, 400 `invalid_request` for a value no back-end can store (NUL, invalid UTF-8).
pub struct Query<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Query<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Error> {
        let query = parts.uri.query().unwrap_or_default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            for part in [name, value] {
                let spaced = part.replace('+', " ");
                let decoded =
                    percent_encoding::percent_decode_str(&spaced).decode_utf8().map_err(|_| Error::BadRequest {
                        code: ErrorCode::InvalidRequest,
                        message: format!("query parameter {name} is not valid UTF-8"),
                        details: json!({"parameter": name}),
                    })?;
                if decoded.contains('\0') {
                    return Err(Error::BadRequest {
                        code: ErrorCode::InvalidRequest,
                        message: format!("query parameter {name}: {}", super::storable::NUL_MESSAGE),
                        details: json!({"parameter": name}),
                    });
                }
            }
        }
        // What axum's Query does (serde_urlencoded), with the parameter named in the error.
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(Query).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            let parameter =
                if path == "." { super::storable::missing_field(&message).map(str::to_owned) } else { Some(path) };
            match parameter {
                Some(name) => Error::BadRequest {
                    code: ErrorCode::InvalidQuery,
                    message: format!("query parameter {name}: {message}"),
                    details: json!({"parameter": name}),
                },
                None => Error::bad_request(ErrorCode::InvalidQuery, format!("the query string is invalid: {message}")),
            }
        })
    }
}

/// `axum::extract::Path` with our error shape: 400 `invalid_path_parameter` for a segment that
/// does not parse or is not UTF-8, 400 `invalid_request` for NUL in a segment.
pub struct Path<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S> for Path<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Error> {
        if let Ok(raw) = axum::extract::RawPathParams::from_request_parts(parts, state).await {
            for (name, value) in &raw {
                if value.contains('\0') {
                    return Err(Error::BadRequest {
                        code: ErrorCode::InvalidRequest,
                        message: format!("path parameter {name}: {}", super::storable::NUL_MESSAGE),
                        details: json!({"parameter": name}),
                    });
                }
            }
        }
        axum::extract::Path::<T>::from_request_parts(parts, state).await.map(|p| Path(p.0)).map_err(Error::from)
    }
}
