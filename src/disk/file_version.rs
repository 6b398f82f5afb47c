//! What identifies one version of a file, for caches that skip work on a
//! file they have seen (a snapshot image's hash, the agent binary's disk):
//! device, inode, size, mtime and ctime. Any write through the file system
//! moves ctime, and no caller can set ctime back.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileVersion {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileVersion {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The version of the file at `path` now (following symlinks).
    pub fn read(path: &Path) -> std::io::Result<Self> {
        std::fs::metadata(path).map(|m| Self::of(&m))
    }
}
