//! SHA-256 of every file of a memory snapshot's images, taken right after
//! the checkpoint and checked before every restore: CRIU restores as root
//! from images of hostile processes, so a changed, missing or added file
//! must never reach it.
//!
//! Hashing 100 MiB takes about 100 ms, most of a fork's time, so the daemon
//! remembers (in its own memory, nowhere an attacker could write) each file
//! it has hashed with what identifies that version of it: device, inode,
//! size, mtime and ctime. A file whose identity is unchanged is not hashed
//! again. Any write through the file system changes its ctime, which no
//! caller can set back; what this misses is corruption below the file system
//! (the disk or its driver changing bytes with no write), which the first
//! restore after a daemon restart hashes again.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::disk::FileVersion;

#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    #[error("reading the snapshot's images in {dir}: {source}")]
    Io { dir: String, source: io::Error },
    #[error("the snapshot is corrupted: {0}; delete it and take a new one")]
    Mismatch(String),
}

/// SHA-256 (hex) of each regular file directly in `dir`, by file name.
pub fn digest_dir(dir: &Path) -> Result<BTreeMap<String, String>, IntegrityError> {
    let io_err = |source| IntegrityError::Io {
        dir: dir.display().to_string(),
        source,
    };
    let mut sums = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let kind = entry.file_type().map_err(io_err)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !kind.is_file() {
            return Err(IntegrityError::Mismatch(format!(
                "{name} is not a regular file"
            )));
        }
        sums.insert(name, digest_file(&entry.path()).map_err(io_err)?);
    }
    Ok(sums)
}

/// Files hashed by this process: path -> (version, SHA-256).
static HASHED: Mutex<Vec<(PathBuf, FileVersion, String)>> = Mutex::new(Vec::new());
/// Entries kept; the oldest are forgotten first.
const MAX_HASHED: usize = 65536;

/// The file's SHA-256, from memory when this version was hashed before.
fn digest_file(path: &Path) -> io::Result<String> {
    let before = FileVersion::read(path)?;
    {
        let hashed = HASHED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, sum)) = hashed.iter().find(|(p, v, _)| p == path && *v == before) {
            return Ok(sum.clone());
        }
    }
    let sum = hash_file(path)?;
    // Kept only if nothing changed the file while it was read.
    if FileVersion::read(path)? == before {
        let mut hashed = HASHED.lock().unwrap_or_else(|p| p.into_inner());
        hashed.retain(|(p, _, _)| p != path);
        if hashed.len() >= MAX_HASHED {
            hashed.remove(0);
        }
        hashed.push((path.to_path_buf(), before, sum.clone()));
    }
    Ok(sum)
}

fn hash_file(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// Checks that `dir` holds exactly the files of `expected`, unchanged.
pub fn verify(dir: &Path, expected: &BTreeMap<String, String>) -> Result<(), IntegrityError> {
    let found = digest_dir(dir)?;
    for (name, sum) in expected {
        match found.get(name) {
            None => return Err(IntegrityError::Mismatch(format!("{name} is missing"))),
            Some(got) if got != sum => {
                return Err(IntegrityError::Mismatch(format!("{name} has changed")))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = found.keys().find(|n| !expected.contains_key(*n)) {
        return Err(IntegrityError::Mismatch(format!("{extra} was added")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), b"memory").unwrap();
        std::fs::write(dir.path().join("core-1.img"), b"registers").unwrap();
        let sums = digest_dir(dir.path()).unwrap();
        verify(dir.path(), &sums).unwrap();

        std::fs::write(dir.path().join("pages-1.img"), b"memorx").unwrap();
        let err = verify(dir.path(), &sums).unwrap_err().to_string();
        assert!(err.contains("pages-1.img has changed"), "{err}");

        std::fs::write(dir.path().join("pages-1.img"), b"memory").unwrap();
        std::fs::write(dir.path().join("extra.img"), b"").unwrap();
        let err = verify(dir.path(), &sums).unwrap_err().to_string();
        assert!(err.contains("extra.img was added"), "{err}");

        // Same length, same second: the change is still seen (ctime moves).
        std::fs::write(dir.path().join("core-1.img"), b"registerz").unwrap();
        let err = verify(dir.path(), &sums).unwrap_err().to_string();
        assert!(err.contains("core-1.img has changed"), "{err}");
        std::fs::write(dir.path().join("core-1.img"), b"registers").unwrap();

        std::fs::remove_file(dir.path().join("extra.img")).unwrap();
        std::fs::remove_file(dir.path().join("core-1.img")).unwrap();
        let err = verify(dir.path(), &sums).unwrap_err().to_string();
        assert!(err.contains("core-1.img is missing"), "{err}");
    }
}
