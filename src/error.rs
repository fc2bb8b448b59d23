//! The chain's error type. Every stage returns [`Error`]; `crate::http::error` maps it to
//! an HTTP status and the `{"error": {code, message, details}}` body in one place.

use serde_json::{Value, json};

pub use mira_core::error_code as code;
pub use mira_core::error_code::ErrorCode;

use crate::registry::ToolError;
use crate::store::StoreError;

/// An error of the chain, with a stable machine-readable code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Missing, malformed or unknown bearer token (401).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// The caller may not do this (403; only for admin-only actions, never to hide objects).
    #[error("{0}")]
    Forbidden(String),
    /// Refused for this caller with a specific reason (403).
    #[error("{message}")]
    ForbiddenCode {
        /// Stable code.
        code: ErrorCode,
        /// Human sentence.
        message: String,
    },
    /// The caller's token lacks the scope this action needs (403 `token_scope_missing`,
    /// details `{"needed": scope}`).
    #[error("this action needs a token with the `{0}` scope")]
    ScopeMissing(crate::auth::Scope),
    /// The object does not exist or is not the caller's (404).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The request is malformed (400).
    #[error("{message}")]
    BadRequest {
        /// Stable code.
        code: ErrorCode,
        /// Human sentence.
        message: String,
        /// Structured details.
        details: Value,
    },
    /// The request conflicts with stored state (409).
    #[error("{message}")]
    Conflict {
        /// Stable code (`tool_call_id_conflict`, `not_exposed`, `approval_mismatch`…).
        code: ErrorCode,
        /// Human sentence.
        message: String,
        /// Structured details.
        details: Value,
    },
    /// The input fails the tool's JSON Schema (422).
    #[error("input does not match the tool's input schema")]
    InputInvalid {
        /// One line per violation, each naming its location.
        errors: Vec<String>,
    },
    /// The body is not JSON (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The route exists, but not for this method (405).
    #[error("this route does not accept that method")]
    MethodNotAllowed,
    /// Too large (413).
    #[error("{message}")]
    TooLarge {
        /// Stable code.
        code: ErrorCode,
        /// Human sentence.
        message: String,
    },
    /// Too many at once for this caller (429), e.g. `too_many_streams`.
    #[error("{message}")]
    TooManyRequests {
        /// Stable code.
        code: ErrorCode,
        /// Human sentence.
        message: String,
    },
    /// The server cannot answer now (503), e.g. `request_timeout`.
    #[error("{message}")]
    Unavailable {
        /// Stable code.
        code: ErrorCode,
        /// Human sentence.
        message: String,
    },
    /// A tool refused the input while freezing.
    #[error("{0}")]
    Tool(ToolError),
    /// The store failed (503 when unreachable, else 500; details are logged, not returned).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A bug or an unexpected condition (500; logged, not returned).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A 400 with code and message (`code` is a 400 of the catalogue).
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        debug_assert_eq!(code.status(), 400, "{code} is not a 400");
        Error::BadRequest { code, message: message.into(), details: Value::Null }
    }

    /// A 400 `invalid_request` about one field of the body: `details` is `{"field": field}`
    /// (the field's path, e.g. `title` or `input.path`), the same shape as a body that does not
    /// deserialise.
    pub fn invalid_field(field: &str, message: impl Into<String>) -> Self {
        Error::BadRequest { code: ErrorCode::InvalidRequest, message: message.into(), details: json!({"field": field}) }
    }

    /// A 409 with code, message and details (`code` is a 409 of the catalogue).
    pub fn conflict(code: ErrorCode, message: impl Into<String>, details: Value) -> Self {
        debug_assert_eq!(code.status(), 409, "{code} is not a 409");
        Error::Conflict { code, message: message.into(), details }
    }

    /// The stable code of this error; its HTTP status is the code's
    /// ([`ErrorCode::status`]).
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Unauthorized => ErrorCode::Unauthorized,
            Error::Forbidden(_) => ErrorCode::Forbidden,
            Error::ScopeMissing(_) => ErrorCode::TokenScopeMissing,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::InputInvalid { .. } => ErrorCode::InputInvalid,
            Error::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            Error::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Error::ForbiddenCode { code, .. }
            | Error::BadRequest { code, .. }
            | Error::Conflict { code, .. }
            | Error::TooLarge { code, .. }
            | Error::TooManyRequests { code, .. }
            | Error::Unavailable { code, .. } => *code,
            Error::Tool(e) => e.code,
            Error::Store(StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed)) => {
                ErrorCode::StoreUnavailable
            }
            // Postgres shutting down or restarting (57P01-57P03), or a lost connection (08…).
            Error::Store(StoreError::Db(sqlx::Error::Database(d)))
                if d.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08")) =>
            {
                ErrorCode::StoreUnavailable
            }
            Error::Store(_) | Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<ToolError> for Error {
    fn from(e: ToolError) -> Self {
        Error::Tool(e)
    }
}

/// Result of a chain operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
