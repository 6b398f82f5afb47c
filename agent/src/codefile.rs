//! Run-code files: the code of a Spawn request written to a private file that
//! only the target user can read, in a root-owned directory.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where run-code files go; root-owned and not listable, so other users in
/// the sandbox cannot find or replace another process's code.
const CODE_DIR: &str = "/tmp/.sandbox-code";

/// Writes run-code to a fresh file readable only by the target user.
pub fn write(proc: u64, code: &[u8], uid: u32, gid: u32) -> io::Result<PathBuf> {
    ensure_code_dir()?;
    let path = PathBuf::from(format!("{CODE_DIR}/{proc}"));
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
    };
    let mut file = match open() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(&path)?;
            open()?
        }
        other => other?,
    };
    file.write_all(code)?;
    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    Ok(path)
}

/// Creates the code directory, or replaces one that sandbox code planted
/// (a symlink, or a directory it owns).
fn ensure_code_dir() -> io::Result<()> {
    let tmp = Path::new("/tmp");
    if fs::symlink_metadata(tmp).is_err() {
        DirBuilder::new().mode(0o1777).create(tmp)?;
        fs::set_permissions(tmp, Permissions::from_mode(0o1777))?;
    }
    let dir = Path::new(CODE_DIR);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() && meta.uid() == me => {}
        Ok(meta) => {
            if meta.is_dir() {
                fs::remove_dir_all(dir)?;
            } else {
                fs::remove_file(dir)?;
            }
            DirBuilder::new().mode(0o711).create(dir)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new().mode(0o711).create(dir)?
        }
        Err(e) => return Err(e),
    }
    fs::set_permissions(dir, Permissions::from_mode(0o711))
}

/// Removes a run-code file once its process is done (or failed to start).
pub fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}
