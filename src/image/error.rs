//! The image cache's error type. Messages say what the caller or operator can do.

use std::path::PathBuf;

/// Everything that can go wrong resolving, building or listing images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A client-supplied name breaks the naming rule (maps to HTTP 400).
    #[error(
        "invalid image name {name:?}: use 1-64 characters of a-z, 0-9, '.', '_', '-', \
         starting with a letter or digit"
    )]
    InvalidName { name: String },

    /// No recipe defines this name (maps to HTTP 404).
    #[error(
        "unknown image {name:?}; known images: {known}. To add one, put a recipe \
         {name}.sh in an extra recipe directory and restart the daemon"
    )]
    Unknown { name: String, known: String },

    /// A configured extra recipe directory or recipe could not be read.
    #[error(
        "cannot read recipe {path}: {source}; fix the path or its permissions in the daemon config"
    )]
    Recipe {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A recipe file is too large to be a shell recipe (probably the wrong file).
    #[error(
        "recipe {path} is {size} bytes, over the {max}-byte limit; recipes are small shell scripts"
    )]
    RecipeTooLarge { path: PathBuf, size: u64, max: u64 },

    /// File-system trouble in the cache directory itself.
    #[error("image cache: cannot {action} {path}: {source}; check that the images directory is writable by the daemon and has free space")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The recipe script failed.
    #[error("building image {name:?} failed ({status}); see the build log at {log}")]
    BuildFailed {
        name: String,
        status: String,
        log: PathBuf,
    },

    /// The recipe script ran past the build timeout and was killed.
    #[error("building image {name:?} took longer than {seconds} s and was stopped; see the build log at {log}")]
    BuildTimeout {
        name: String,
        seconds: u64,
        log: PathBuf,
    },

    /// The built tree cannot be shifted into the sandbox id range.
    #[error("image {name:?} cannot be prepared for sandboxes: {reason} (at {path}); fix the recipe, see the build log at {log}")]
    Shift {
        name: String,
        path: PathBuf,
        reason: String,
        log: PathBuf,
    },
}

impl ImageError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        ImageError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the request named an image that does not exist or cannot exist, so
    /// the API answers 4xx rather than 5xx.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            ImageError::InvalidName { .. } | ImageError::Unknown { .. }
        )
    }
}
