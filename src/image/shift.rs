//! Ownership shift: moves every file of a built image from ids 0..65535 to the host
//! range that the sandbox user namespace maps them to, so root in a sandbox owns
//! what root owned in the recipe, and nothing in the image is owned by host root.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Host id that sandbox id 0 maps to.
pub const ID_OFFSET: u32 = 100_000;
/// Number of ids the sandbox user namespace maps.
pub const ID_RANGE: u32 = 65_536;

/// Why a tree could not be shifted, and where.
#[derive(Debug)]
pub(crate) struct ShiftError {
    pub path: PathBuf,
    pub reason: String,
}

/// What the walk saw.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ShiftStats {
    pub entries: u64,
    /// Allocated bytes, hard links counted once (what `du` reports).
    pub bytes: u64,
}

const CAP_XATTR: &[u8] = b"security.capability\0";

/// Shifts `root` and everything below it by [`ID_OFFSET`], never following symlinks
/// and never leaving `root`'s file system. Ids outside `0..ID_RANGE` are refused:
/// they would show up as `nobody` in the sandbox.
pub(crate) fn shift_tree(root: &Path) -> Result<ShiftStats, ShiftError> {
    let err = |path: &Path, reason: String| ShiftError {
        path: path.to_path_buf(),
        reason,
    };
    let root_dev = std::fs::symlink_metadata(root)
        .map_err(|e| err(root, format!("cannot stat: {e}")))?
        .dev();
    let mut stats = ShiftStats::default();
    // Hard links share one inode: shifting it twice would move it out of range.
    let mut seen_links: HashSet<u64> = HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| err(&path, format!("cannot stat: {e}")))?;
        if meta.dev() != root_dev {
            return Err(err(&path, "a different file system is mounted here".into()));
        }
        let ft = meta.file_type();
        if ft.is_dir() {
            let entries =
                std::fs::read_dir(&path).map_err(|e| err(&path, format!("cannot list: {e}")))?;
            for entry in entries {
                let entry = entry.map_err(|e| err(&path, format!("cannot list: {e}")))?;
                stack.push(entry.path());
            }
        } else if meta.nlink() > 1 && !seen_links.insert(meta.ino()) {
            continue;
        }
        stats.entries += 1;
        stats.bytes += meta.blocks() * 512;
        shift_one(&path, &meta).map_err(|reason| err(&path, reason))?;
    }
    Ok(stats)
}

fn shift_one(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let (uid, gid) = (meta.uid(), meta.gid());
    if uid >= ID_RANGE || gid >= ID_RANGE {
        return Err(format!(
            "owner {uid}:{gid} is outside the sandbox id range 0..{ID_RANGE}"
        ));
    }
    // chown clears set-id bits and file capabilities; both must survive.
    let is_file = meta.file_type().is_file();
    let caps = if is_file { get_caps(path)? } else { None };
    lchown(path, Some(uid + ID_OFFSET), Some(gid + ID_OFFSET))
        .map_err(|e| format!("cannot change owner: {e}"))?;
    let mode = meta.permissions().mode() & 0o7777;
    if is_file && mode & 0o6000 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("cannot restore set-id mode: {e}"))?;
    }
    if let Some(caps) = caps {
        set_caps(path, &caps)?;
    }
    Ok(())
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains a NUL byte".to_string())
}

fn get_caps(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let cpath = c_path(path)?;
    // The capability xattr is at most 24 bytes (v3); 64 leaves room.
    let mut buf = [0u8; 64];
    // SAFETY: both strings are NUL-terminated and outlive the call; buf is writable
    // for buf.len() bytes, which is the size passed.
    let n = unsafe {
        libc::lgetxattr(
            cpath.as_ptr(),
            CAP_XATTR.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n >= 0 {
        let n = usize::try_from(n).unwrap_or(0).min(buf.len());
        return Ok(Some(buf[..n].to_vec()));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
        _ => Err(format!(
            "cannot read file capabilities: {}",
            std::io::Error::last_os_error()
        )),
    }
}

fn set_caps(path: &Path, caps: &[u8]) -> Result<(), String> {
    let cpath = c_path(path)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; caps is readable
    // for caps.len() bytes, which is the size passed.
    let rc = unsafe {
        libc::lsetxattr(
            cpath.as_ptr(),
            CAP_XATTR.as_ptr().cast(),
            caps.as_ptr().cast(),
            caps.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot restore file capabilities: {}",
            std::io::Error::last_os_error()
        ))
    }
}
