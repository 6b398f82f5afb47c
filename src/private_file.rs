//! Files only the daemon's user may read: the secrets key, the secrets CA's
//! key, the remote API's TLS key and its tokens file. Written whole (a
//! temporary, fsync, rename) with mode 0600; a file its group or others may
//! read or write is refused rather than used.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is open to others (mode {mode:o}); chmod 600 it")]
    Exposed { mode: u32 },
    #[error("belongs to uid {owner}, not to the daemon's uid {ours}; chown it")]
    Foreign { owner: u32, ours: u32 },
}

impl PrivateFileError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Reads `path` whole, refusing a file others may access or that another
/// user owns (either could have read or replaced it).
pub fn read(path: &Path) -> Result<Zeroizing<Vec<u8>>, PrivateFileError> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(PrivateFileError::Exposed { mode });
    }
    let ours = nix::unistd::geteuid().as_raw();
    if meta.uid() != ours {
        return Err(PrivateFileError::Foreign {
            owner: meta.uid(),
            ours,
        });
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize));
    std::io::Read::read_to_end(&mut &file, &mut bytes)?;
    Ok(bytes)
}

/// Writes `bytes` to a new 0600 file at `path` (through a temporary and a
/// rename, so a crash leaves the old file or the whole new one).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_written_file_reads_back_and_an_exposed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write(&path, b"k").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read(&path).unwrap().as_slice(), b"k");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        assert!(read(&dir.path().join("absent")).unwrap_err().is_not_found());
    }
}
