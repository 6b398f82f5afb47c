//! `memory.verified`: a record that the memory file was checked against its
//! digest, so that forks after the first need not read all of guest RAM
//! again (hashing 256 MiB takes ~150 ms here; a fork must be ready in a few
//! ms).
//!
//! The stamp names the file by device, inode, size, mtime and ctime (in ns)
//! plus the digest it was checked against. Any write to the file through
//! the filesystem (a flipped byte, a truncation, a replacement) changes its
//! ctime, which nobody can set back, so the stamp no longer matches and the
//! next restore verifies the whole file again. What it does not catch is
//! corruption beneath the filesystem (a failing disk); kernels before 6.13
//! also keep ctime at timer-tick granularity, so a write within the same tick
//! as the stamp could go unseen. Restore with `--verify-memory always` to
//! hash the file every time.

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Name of the stamp in a snapshot directory.
pub const STAMP_FILE: &str = "memory.verified";
/// Largest stamp read (it is ~200 bytes).
const MAX_STAMP_BYTES: u64 = 4096;

/// Which file, in which state, matched which digest.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    sha256: String,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    /// The stamp of `file` as it is now, for `sha256`.
    pub fn of(file: &File, sha256: &str) -> std::io::Result<Self> {
        let m = file.metadata()?;
        Ok(Stamp {
            sha256: sha256.to_owned(),
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// Whether `dir`'s stamp says `file` was verified against `sha256` and has
/// not changed since. Any problem reading the stamp means "no".
pub fn is_verified(dir: &Path, file: &File, sha256: &str) -> bool {
    let path = dir.join(STAMP_FILE);
    let Ok(meta) = fs::metadata(&path) else {
        return false;
    };
    if meta.len() > MAX_STAMP_BYTES {
        return false;
    }
    let Ok(bytes) = fs::read(&path) else {
        return false;
    };
    let Ok(stamp) = serde_json::from_slice::<Stamp>(&bytes) else {
        return false;
    };
    matches!(Stamp::of(file, sha256), Ok(now) if now == stamp)
}

/// Records that `file` matched `sha256`. Best effort (a read-only snapshot
/// directory only costs later forks a full check): written to a temporary
/// name and renamed, so readers never see half a stamp.
pub fn record(dir: &Path, file: &File, sha256: &str) {
    let Ok(stamp) = Stamp::of(file, sha256) else {
        return;
    };
    let Ok(bytes) = serde_json::to_vec(&stamp) else {
        return;
    };
    let tmp = dir.join(format!(".{STAMP_FILE}.{}", std::process::id()));
    if fs::write(&tmp, bytes).is_ok() && fs::rename(&tmp, dir.join(STAMP_FILE)).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}
