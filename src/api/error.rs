//! The API's one error shape, `{"error":{"code","message","resource"?}}`,
//! and the mapping from the manager's errors to HTTP statuses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::types::{ErrorBody, ErrorDetail};
use crate::sandbox::SandboxError;

pub struct ApiError(pub SandboxError);

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        Self(e)
    }
}

impl From<crate::shim::protocol::ClientError> for ApiError {
    fn from(e: crate::shim::protocol::ClientError) -> Self {
        Self(e.into())
    }
}

impl ApiError {
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self(SandboxError::bad(code, message))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, resource) = match &self.0 {
            SandboxError::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, *code, None),
            SandboxError::NotFound { code, .. } => (StatusCode::NOT_FOUND, *code, None),
            SandboxError::Conflict { code, .. } => (StatusCode::CONFLICT, *code, None),
            SandboxError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large", None),
            SandboxError::Unavailable { resource, .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "insufficient_capacity",
                Some(resource.to_string()),
            ),
            SandboxError::Internal(message) => {
                tracing::error!("internal error: {message}");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", None)
            }
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: self.0.to_string(),
                resource,
            },
        };
        (status, Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body with serde's own message (which names the bad field).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("invalid_json", format!("request body is not valid: {e}")))
}
