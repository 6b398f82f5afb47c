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

impl From<crate::supervisor::client::CallError> for ApiError {
    fn from(e: crate::supervisor::client::CallError) -> Self {
        Self(e.into())
    }
}

impl ApiError {
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self(SandboxError::bad(code, message))
    }
}

impl ApiError {
    /// The status and the body's detail (the one place the error table lives).
    pub fn status_and_detail(&self) -> (StatusCode, ErrorDetail) {
        let code = self.0.code();
        let (status, resource) = match &self.0 {
            SandboxError::BadRequest { .. } => (StatusCode::BAD_REQUEST, None),
            SandboxError::NotFound { .. } => (StatusCode::NOT_FOUND, None),
            SandboxError::Conflict { .. } => (StatusCode::CONFLICT, None),
            SandboxError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, None),
            SandboxError::Forbidden { .. } => (StatusCode::FORBIDDEN, None),
            SandboxError::BadGateway { .. } => (StatusCode::BAD_GATEWAY, None),
            SandboxError::Unprocessable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, None),
            SandboxError::Unavailable { resource, .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, Some(resource.to_string()))
            }
            SandboxError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, None),
            SandboxError::Internal(message) => {
                tracing::error!("internal error: {message}");
                (StatusCode::INTERNAL_SERVER_ERROR, None)
            }
        };
        let detail = ErrorDetail {
            code: code.to_string(),
            message: self.0.to_string(),
            resource,
            field: self.0.field().map(str::to_string),
        };
        (status, detail)
    }

    /// The body's detail, for an error reported inside a stream.
    pub fn detail(&self) -> ErrorDetail {
        self.status_and_detail().1
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error) = self.status_and_detail();
        (status, Json(ErrorBody { error })).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body; the message names the field that was wrong (serde
/// alone would say "expected u64" for `"memory_mib": -5` without the field).
/// Every body is an object: serde's derived structs also take an array of
/// their fields in order (`[null, null]` would be a create with defaults),
/// so anything else is refused before serde sees it. An empty body goes to
/// serde as before, so each route keeps its own answer to it.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    // JSON's whitespace, RFC 8259 section 2.
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::bad(
            "invalid_json",
            "the request body must be a JSON object",
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        if path.is_empty() || path == "." {
            ApiError::bad(
                "invalid_json",
                format!("request body is not valid: {}", e.inner()),
            )
        } else {
            let message = format!("request body is not valid: field `{path}`: {}", e.inner());
            ApiError(SandboxError::bad_field("invalid_json", path, message))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::CreateSandbox;

    #[test]
    fn a_slow_agent_is_a_504_that_says_the_sandbox_runs() {
        use crate::supervisor::protocol::{SupervisorError, SupervisorErrorKind};
        let slow = SupervisorError::new(
            SupervisorErrorKind::AgentTimeout,
            "the sandbox agent did not answer within 30s",
        );
        let (status, detail) = ApiError(slow.into()).status_and_detail();
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(detail.code, "agent_timeout");
        assert!(detail.message.contains("running"), "{}", detail.message);
        // Positive control: a gone agent is still the sandbox's state.
        let gone = SupervisorError::new(SupervisorErrorKind::AgentGone, "eof");
        let (status, detail) = ApiError(gone.into()).status_and_detail();
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(detail.code, "sandbox_not_running");
    }

    #[test]
    fn a_negative_unsigned_field_is_named() {
        let Err(err) = parse_json::<CreateSandbox>(br#"{"memory_mib": -5}"#) else {
            panic!("a negative memory_mib was accepted");
        };
        assert!(err.0.to_string().contains("memory_mib"), "{}", err.0);
        assert_eq!(err.0.field(), Some("memory_mib"));
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        for body in [&b"[null, null]"[..], b"\"x\"", b"42", b" \n\t[]", b"null"] {
            let Err(err) = parse_json::<CreateSandbox>(body) else {
                panic!("{} was accepted", String::from_utf8_lossy(body));
            };
            assert_eq!(err.0.code(), "invalid_json");
            assert!(
                err.0.to_string().contains("must be a JSON object"),
                "{}",
                err.0
            );
        }
        assert!(parse_json::<CreateSandbox>(b" \r\n{}").is_ok());
    }
}
