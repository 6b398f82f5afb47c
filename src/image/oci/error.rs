//! What can go wrong pulling an image, each message saying what to do.

use std::path::PathBuf;

use super::unpack::UnpackError;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid image reference {reference:?}: {reason}; write e.g. node:20, docker.io/library/python:3.12-slim or registry.example.com:5000/team/app@sha256:<hex>")]
    InvalidReference { reference: String, reason: String },
    #[error("image {reference} was not found in its registry ({detail}); check the name and tag")]
    NotFound { reference: String, detail: String },
    #[error("registry {registry} refused the credentials for {reference} ({detail}); check registry_auth_file")]
    Unauthorized {
        registry: String,
        reference: String,
        detail: String,
    },
    #[error("registry {registry} is refused: {reason}; to pull from it anyway, list it in private_registries")]
    AddressRefused { registry: String, reason: String },
    #[error("registry {registry} is not in allowed_registries ({allowed}); pull from one of those, or ask the operator to allow it")]
    NotAllowed { registry: String, allowed: String },
    #[error("registry {registry} could not be reached: {detail}")]
    Unreachable { registry: String, detail: String },
    #[error("image {reference} has no linux/amd64 variant (it offers {offered}); pick an image built for linux/amd64")]
    NoPlatform { reference: String, offered: String },
    #[error("blob {digest} of {reference} does not match its digest; the registry or something between served corrupt data, nothing was kept")]
    DigestMismatch { reference: String, digest: String },
    #[error("layer {digest} of {reference} uses media type {media_type}, which sandboxd cannot unpack (gzip and plain tar only)")]
    UnsupportedLayer {
        reference: String,
        digest: String,
        media_type: String,
    },
    #[error("image {reference}: {detail}")]
    Malformed { reference: String, detail: String },
    #[error("layer {digest} of {reference}: {source}")]
    Unpack {
        reference: String,
        digest: String,
        #[source]
        source: UnpackError,
    },
    #[error("not enough disk for {reference}: {needed} bytes of layers to fetch, {free} bytes free under {path}; prune images or free space")]
    NoSpace {
        reference: String,
        needed: u64,
        free: u64,
        path: PathBuf,
    },
    #[error("registry credentials file {path}: {detail}")]
    Credentials { path: PathBuf, detail: String },
    #[error("image store: cannot {action} {path}: {source}; check that the images directory is writable and has free space")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the registry dialer could not start: {0}")]
    Gate(String),
}

impl RegistryError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        RegistryError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// The HTTP status class the API answers with.
    pub fn kind(&self) -> RegistryErrorKind {
        use RegistryError::*;
        match self {
            InvalidReference { .. } | NoPlatform { .. } | UnsupportedLayer { .. } => {
                RegistryErrorKind::BadRequest
            }
            NotFound { .. } => RegistryErrorKind::NotFound,
            Unauthorized { .. } | AddressRefused { .. } | NotAllowed { .. } => {
                RegistryErrorKind::Forbidden
            }
            Unreachable { .. } | DigestMismatch { .. } | Malformed { .. } | Unpack { .. } => {
                RegistryErrorKind::BadGateway
            }
            NoSpace { .. } => RegistryErrorKind::Unavailable,
            Credentials { .. } | Io { .. } | Gate(_) => RegistryErrorKind::Internal,
        }
    }

    /// A short machine-readable code for the API's error body.
    pub fn code(&self) -> &'static str {
        use RegistryError::*;
        match self {
            InvalidReference { .. } => "invalid_image_reference",
            NotFound { .. } => "image_not_found",
            Unauthorized { .. } => "registry_unauthorized",
            AddressRefused { .. } => "registry_refused",
            NotAllowed { .. } => "registry_not_allowed",
            Unreachable { .. } => "registry_unreachable",
            NoPlatform { .. } => "image_platform_unsupported",
            DigestMismatch { .. } => "image_digest_mismatch",
            UnsupportedLayer { .. } => "image_layer_unsupported",
            Malformed { .. } | Unpack { .. } => "image_malformed",
            NoSpace { .. } => "image_no_space",
            Credentials { .. } | Io { .. } | Gate(_) => "internal",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryErrorKind {
    BadRequest,
    NotFound,
    Forbidden,
    BadGateway,
    Unavailable,
    Internal,
}
