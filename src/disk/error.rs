//! The disk pool's error type. Messages say what the operator or caller can do.

use std::path::PathBuf;

/// Everything that can go wrong with the pool or a layer.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A layer id that could escape the pool directory or is not a plain name.
    #[error("invalid layer id {id:?}: use 1-128 characters of A-Z, a-z, 0-9, '.', '_', '-', not starting with '.'")]
    InvalidId { id: String },

    /// `create_layer` on an id that already has a layer.
    #[error("a disk layer for {id:?} already exists; remove it first or use a new sandbox id")]
    Exists { id: String },

    /// A one-time setup command (mkfs.btrfs, mount, btrfs quota) failed.
    #[error("disk pool setup: `{command}` failed: {detail}; install btrfs-progs, check that loop devices are available and the pool image is not damaged")]
    Setup { command: String, detail: String },

    /// The pool directory is not on btrfs even after mounting.
    #[error("disk pool {path} is not a btrfs file system after mounting; unmount whatever is mounted there or choose another pool directory")]
    NotBtrfs { path: PathBuf },

    /// A file-system call on the pool or a layer failed.
    #[error("disk pool: cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl DiskError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<std::io::Error>,
    ) -> Self {
        DiskError::Io {
            action,
            path: path.into(),
            source: source.into(),
        }
    }
}
