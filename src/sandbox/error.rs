//! The sandbox manager's errors, each already in the terms of the API's
//! error table (400 / 404 / 409 / 503 / 504 / 500).

use crate::gpu::{AllocError, GrantError, RequestError};
use crate::supervisor::client::CallError;

/// Clone: a failed keyed create's error is kept and returned again to its
/// retries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SandboxError {
    /// 400: the request cannot be done as asked; the message says what to fix.
    /// `field`: the request field at fault, when one is.
    #[error("{message}")]
    BadRequest {
        code: &'static str,
        message: String,
        field: Option<String>,
    },
    /// 404
    #[error("{message}")]
    NotFound { code: &'static str, message: String },
    /// 409: the object's state does not allow it now.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// 403: refused by policy (a registry's credentials, the deny list).
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    /// 413
    #[error("{message}")]
    TooLarge { message: String },
    /// 422: the request was understood but doing it failed on its own
    /// terms (an image build whose step failed).
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    /// 502: a server the daemon depends on (an image registry) failed.
    #[error("{message}")]
    BadGateway { code: &'static str, message: String },
    /// 503: the host cannot take it now; `resource` says what is short.
    #[error("{message}")]
    Unavailable {
        resource: &'static str,
        message: String,
    },
    /// 504: the sandbox did not answer in time; it still runs, and the
    /// request may be retried.
    #[error("{message}")]
    Timeout { code: &'static str, message: String },
    /// 500: our fault; logged with details.
    #[error("{0}")]
    Internal(String),
}

/// The request field each single-field 400 code is about, for the error
/// body's `field`.
fn field_of(code: &str) -> Option<&'static str> {
    Some(match code {
        "invalid_cpu" => "cpu",
        "invalid_memory" => "memory_mib",
        "invalid_disk" => "disk_mib",
        "invalid_pids" => "pids",
        "invalid_cpu_shares" => "cpu_shares",
        "oom_group_unsupported" => "oom_group",
        "invalid_ttl" => "ttl_seconds",
        "invalid_env" => "env",
        "invalid_labels" => "labels",
        "invalid_path" | "path_escape" => "path",
        "invalid_idempotency_key" => "idempotency_key",
        "invalid_image" => "image",
        "gpu_not_found" => "gpu",
        "gpu_count_too_large" => "gpu_count",
        "invalid_secrets" => "secrets",
        "invalid_network_policy" => "allow_list",
        "invalid_language" => "language",
        "invalid_argv" => "argv",
        "invalid_timeout" => "timeout_seconds",
        "invalid_signal" => "signal",
        "invalid_cursor" => "cursor",
        "invalid_mode" => "mode",
        "invalid_pty" => "pty",
        "invalid_port" => "port",
        "invalid_host_rootfs" => "host_rootfs",
        "invalid_volume" => "volumes",
        "invalid_join_netns" => "join_netns",
        "invalid_hostname" => "hostname",
        _ => return None,
    })
}

impl SandboxError {
    /// A 400 whose field, if its code belongs to one, is that field.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
            field: field_of(code).map(str::to_string),
        }
    }

    /// A 400 naming the request field at fault.
    pub fn bad_field(
        code: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
            field: Some(field.into()),
        }
    }

    /// The same error, about request field `name` when it is a 400.
    pub fn of_field(self, name: &str) -> Self {
        match self {
            Self::BadRequest { code, message, .. } => Self::BadRequest {
                code,
                message,
                field: Some(name.to_string()),
            },
            other => other,
        }
    }

    /// The request field a 400 is about, when one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::BadRequest { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    pub fn sandbox_not_found(id: &str) -> Self {
        Self::NotFound {
            code: "sandbox_not_found",
            message: format!("no sandbox with id {id:?}"),
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::Internal(message.to_string())
    }

    /// The machine-readable code of the API's error body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest { code, .. }
            | Self::NotFound { code, .. }
            | Self::Conflict { code, .. }
            | Self::Forbidden { code, .. }
            | Self::BadGateway { code, .. }
            | Self::Unprocessable { code, .. }
            | Self::Timeout { code, .. } => code,
            Self::TooLarge { .. } => "too_large",
            Self::Unavailable { .. } => "insufficient_capacity",
            Self::Internal(_) => "internal",
        }
    }
}

impl From<crate::image::oci::RegistryError> for SandboxError {
    fn from(e: crate::image::oci::RegistryError) -> Self {
        use crate::image::oci::RegistryErrorKind as K;
        let (code, message) = (e.code(), e.to_string());
        match e.kind() {
            K::BadRequest => Self::bad_field(code, "image", message),
            K::NotFound => Self::NotFound { code, message },
            K::Forbidden => Self::Forbidden { code, message },
            K::BadGateway => Self::BadGateway { code, message },
            K::Unavailable => Self::Unavailable {
                resource: "disk",
                message,
            },
            K::Internal => Self::Internal(message),
        }
    }
}

impl From<crate::secrets::SecretError> for SandboxError {
    fn from(e: crate::secrets::SecretError) -> Self {
        use crate::secrets::SecretError as E;
        let message = e.to_string();
        match e {
            E::Invalid(_) | E::NothingToChange => Self::bad("invalid_secret", message),
            E::UnknownBinding(_) | E::TooManyBound { .. } => Self::bad("invalid_secrets", message),
            E::NotFound(_) => Self::NotFound {
                code: "secret_not_found",
                message,
            },
            E::Exists(_) => Self::Conflict {
                code: "secret_exists",
                message,
            },
            E::Store(_) | E::Seal(_) | E::Authority(_) => Self::Internal(message),
        }
    }
}

impl From<crate::supervisor::protocol::ClientError> for SandboxError {
    fn from(e: crate::supervisor::protocol::ClientError) -> Self {
        Self::Internal(e.to_string())
    }
}

impl From<crate::supervisor::protocol::SupervisorError> for SandboxError {
    fn from(e: crate::supervisor::protocol::SupervisorError) -> Self {
        use crate::supervisor::protocol::SupervisorErrorKind as K;
        match e.kind {
            K::UnknownProcess => Self::NotFound {
                code: "process_not_found",
                message: e.message,
            },
            K::InvalidInput => Self::BadRequest {
                code: "invalid_request",
                message: e.message,
                field: None,
            },
            K::Conflict => Self::Conflict {
                code: "process_state",
                message: e.message,
            },
            K::Refused => Self::Unavailable {
                resource: "sandbox_port",
                message: e.message,
            },
            K::AgentGone => Self::Conflict {
                code: "sandbox_not_running",
                message: format!("the sandbox is no longer running: {}", e.message),
            },
            K::AgentTimeout => Self::Timeout {
                code: "agent_timeout",
                message: format!(
                    "the sandbox is running but its agent did not answer in time ({}): \
                     it may be starved by its CPU or memory limits. A request that starts \
                     a process may have started it late: list the sandbox's processes \
                     before retrying",
                    e.message
                ),
            },
            K::UnknownRoot => Self::NotFound {
                code: "root_not_found",
                message: e.message,
            },
            K::Internal => Self::Internal(e.message),
        }
    }
}

impl From<sandbox_proto::AgentError> for SandboxError {
    fn from(e: sandbox_proto::AgentError) -> Self {
        use sandbox_proto::ErrorKind as K;
        let message = e.message;
        match e.kind {
            K::NotFound => Self::NotFound {
                code: "file_not_found",
                message,
            },
            // The sandbox's own quota, not the host: a conflict with its state.
            K::NoSpace => Self::Conflict {
                code: "disk_limit_reached",
                message: format!("the sandbox's disk limit is reached: {message}"),
            },
            // The request is well formed; the sandbox's files are not in
            // the state it needs (a folder where a file is asked for...).
            K::AlreadyExists | K::NotADirectory | K::IsADirectory | K::DirectoryNotEmpty => {
                Self::Conflict {
                    code: "file_error",
                    message,
                }
            }
            K::InvalidInput | K::PermissionDenied => Self::BadRequest {
                code: "file_error",
                message,
                field: None,
            },
            K::UnknownProcess => Self::NotFound {
                code: "process_not_found",
                message,
            },
            K::UnknownHandle | K::Other => Self::Internal(message),
        }
    }
}

impl From<CallError> for SandboxError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Connect(e) | CallError::Client(e) => e.into(),
            CallError::Refused(e) => e.into(),
            CallError::Agent(e) => e.into(),
            unexpected @ CallError::Unexpected { .. } => Self::internal(unexpected),
        }
    }
}

// The GPU service's refusals, as the API reports them.
impl From<RequestError> for SandboxError {
    fn from(e: RequestError) -> Self {
        let code = match e {
            RequestError::VmRuntime => "gpu_unsupported_runtime",
            _ => "invalid_gpu",
        };
        SandboxError::bad(code, e.to_string())
    }
}

impl From<AllocError> for SandboxError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::NoSuchModel { .. } => SandboxError::bad("gpu_not_found", e.to_string()),
            AllocError::TooMany { .. } => SandboxError::bad("gpu_count_too_large", e.to_string()),
            AllocError::Busy { .. } => SandboxError::Unavailable {
                resource: "gpu",
                message: e.to_string(),
            },
            AllocError::AlreadyHolds(_) => SandboxError::internal(e),
        }
    }
}

impl From<GrantError> for SandboxError {
    fn from(e: GrantError) -> Self {
        SandboxError::internal(format!("wiring the sandbox's GPUs: {e}"))
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;

    #[test]
    fn busy_is_a_503_for_gpu_and_absent_is_a_400() {
        let busy: SandboxError = AllocError::Busy {
            model: "H200".into(),
            requested: 1,
            free: 0,
            present: 2,
        }
        .into();
        assert!(matches!(
            busy,
            SandboxError::Unavailable {
                resource: "gpu",
                ..
            }
        ));
        let absent: SandboxError = AllocError::NoSuchModel {
            model: "A100".into(),
            available: "2 × NVIDIA H200".into(),
        }
        .into();
        match absent {
            SandboxError::BadRequest { code, message, .. } => {
                assert_eq!(code, "gpu_not_found");
                assert!(
                    message.contains("A100") && message.contains("H200"),
                    "{message}"
                );
            }
            other => panic!("not a 400: {other:?}"),
        }
        let vm: SandboxError = RequestError::VmRuntime.into();
        assert!(matches!(
            vm,
            SandboxError::BadRequest {
                code: "gpu_unsupported_runtime",
                ..
            }
        ));
    }
}
