//! Layers: one btrfs subvolume per sandbox, with a qgroup limit and the overlay's
//! `upper/` and `work/` directories inside, created and destroyed by ioctl.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions, Permissions};
use std::os::fd::AsFd;
use std::os::unix::fs::{fchown, lchown, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::ioctl;
use super::pool::DiskPool;
use super::DiskError;

const MAX_ID_LEN: usize = 128;

/// Accepts 1-128 of `[A-Za-z0-9._-]`, not starting with `.` (so never `.` or `..`).
pub fn validate_id(id: &str) -> Result<(), DiskError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(DiskError::InvalidId {
            id: id.chars().take(MAX_ID_LEN + 8).collect(),
        })
    }
}

impl DiskPool {
    /// Creates the layer for `id`: a subvolume limited to `limit_bytes`, owned by
    /// `owner_uid:owner_gid`, holding empty `upper/` and `work/`. Returns the
    /// subvolume's path. On any failure nothing is left behind.
    pub fn create_layer(
        &self,
        id: &str,
        limit_bytes: u64,
        owner_uid: u32,
        owner_gid: u32,
    ) -> Result<PathBuf, DiskError> {
        validate_id(id)?;
        let path = self.dir().join(id);
        let cname = CString::new(id).map_err(|_| DiskError::InvalidId { id: id.to_string() })?;
        ioctl::subvol_create(self.fd(), &cname).map_err(|e| match e {
            Errno::EEXIST => DiskError::Exists { id: id.to_string() },
            e => DiskError::io("create subvolume", &path, e),
        })?;
        if let Err(e) = fill_layer(&path, limit_bytes, owner_uid, owner_gid) {
            if let Err(undo) = ioctl::snap_destroy(self.fd(), &cname) {
                tracing::warn!(path = %path.display(), error = %undo, "cannot remove half-made layer");
            }
            return Err(e);
        }
        Ok(path)
    }

    /// Deletes the layer for `id` with everything in it. A missing layer is fine.
    /// Its overlay must be unmounted first.
    pub fn remove_layer(&self, id: &str) -> Result<(), DiskError> {
        validate_id(id)?;
        let cname = CString::new(id).map_err(|_| DiskError::InvalidId { id: id.to_string() })?;
        match ioctl::snap_destroy(self.fd(), &cname) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(DiskError::io("remove subvolume", self.dir().join(id), e)),
        }
    }
}

/// Sets the qgroup limit of the layer (subvolume) at `path`; a sandbox's
/// supervisor lowers its own layer's this way at a pool claim.
pub fn limit_layer_at(path: &Path, limit_bytes: u64) -> Result<(), DiskError> {
    set_quota(&open_root(path)?, path, limit_bytes)
}

fn open_root(path: &Path) -> Result<File, DiskError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| DiskError::io("open", path, e))
}

fn set_quota(root: &File, path: &Path, limit_bytes: u64) -> Result<(), DiskError> {
    ioctl::qgroup_limit(root.as_fd(), limit_bytes)
        .map_err(|e| DiskError::io("set the quota of", path, e))
}

fn fill_layer(path: &Path, limit_bytes: u64, uid: u32, gid: u32) -> Result<(), DiskError> {
    let root = open_root(path)?;
    set_quota(&root, path, limit_bytes)?;
    own(&root, path, uid, gid)?;
    for sub in ["upper", "work"] {
        let p = path.join(sub);
        fs::create_dir(&p).map_err(|e| DiskError::io("create", &p, e))?;
        lchown(&p, Some(uid), Some(gid)).map_err(|e| DiskError::io("chown", &p, e))?;
        // upper/ becomes the sandbox's `/`: same mode as an image root.
        fs::set_permissions(&p, Permissions::from_mode(0o755))
            .map_err(|e| DiskError::io("chmod", &p, e))?;
    }
    Ok(())
}

fn own(dir: &File, path: &Path, uid: u32, gid: u32) -> Result<(), DiskError> {
    fchown(dir, Some(uid), Some(gid)).map_err(|e| DiskError::io("chown", path, e))?;
    dir.set_permissions(Permissions::from_mode(0o755))
        .map_err(|e| DiskError::io("chmod", path, e))
}
