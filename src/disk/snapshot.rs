//! Snapshot storage in the pool: `snapshots/` (0700) holds one directory
//! per snapshot, with its filesystem layer as a read-only btrfs snapshot of
//! the sandbox's layer (`layer/upper` is what the sandbox had written) and
//! whatever else the snapshot keeps (memory images). Being on the same
//! btrfs as the layers, a snapshot shares their extents: it costs no copy.

use std::ffi::CString;
use std::fs::{self, DirBuilder, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::ioctl;
use super::layer::validate_id;
use super::pool::DiskPool;
use super::DiskError;

const SNAPSHOTS: &str = "snapshots";
const LAYER: &str = "layer";

impl DiskPool {
    /// The directory of snapshot `id` (whether or not it exists).
    pub fn snapshot_dir(&self, id: &str) -> Result<PathBuf, DiskError> {
        validate_id(id)?;
        Ok(self.dir().join(SNAPSHOTS).join(id))
    }

    /// Creates the (empty, 0700) directory of snapshot `id`.
    pub fn create_snapshot_dir(&self, id: &str) -> Result<PathBuf, DiskError> {
        let dir = self.snapshot_dir(id)?;
        let mut builder = DirBuilder::new();
        builder.mode(0o700);
        let parent = self.dir().join(SNAPSHOTS);
        match builder.create(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(DiskError::io("create", &parent, e)),
        }
        builder.create(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => DiskError::Exists { id: id.to_string() },
            _ => DiskError::io("create", &dir, e),
        })?;
        Ok(dir)
    }

    /// Snapshots the layer of sandbox `layer_id` into snapshot `id`'s
    /// directory, read-only. Returns the snapshot layer's path; its
    /// `upper/` is the sandbox's writes. The caller stops writes first
    /// (freezes the sandbox) for a consistent picture.
    pub fn snapshot_layer(&self, layer_id: &str, id: &str) -> Result<PathBuf, DiskError> {
        let dir = self.snapshot_dir(id)?;
        self.keep_layer(layer_id, &dir)
    }

    /// Keeps the layer of sandbox `layer_id` as a read-only snapshot named
    /// `layer` in `dir`, an existing directory in the pool. Returns its
    /// path. The caller stops writes first.
    pub fn keep_layer(&self, layer_id: &str, dir: &Path) -> Result<PathBuf, DiskError> {
        let source_path = self.layer_path(layer_id)?;
        let open_dir = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| DiskError::io("open", path, e))
        };
        let source = open_dir(&source_path)?;
        // Writes still in the page cache belong in the snapshot.
        nix::unistd::syncfs(source.as_raw_fd())
            .map_err(|e| DiskError::io("sync", &source_path, e))?;
        let parent = open_dir(dir)?;
        let name = CString::new(LAYER).map_err(|_| DiskError::InvalidId {
            id: dir.display().to_string(),
        })?;
        ioctl::snapshot_read_only(parent.as_fd(), &name, source.as_fd())
            .map_err(|e| DiskError::io("snapshot", &source_path, e))?;
        Ok(dir.join(LAYER))
    }

    /// Removes snapshot `id`: its layer subvolume and everything else in its
    /// directory. A missing snapshot is fine. No overlay may still use it.
    pub fn remove_snapshot(&self, id: &str) -> Result<(), DiskError> {
        let dir = self.snapshot_dir(id)?;
        self.remove_kept(&dir)
    }

    /// Removes `dir`, a directory in the pool that may hold a kept layer
    /// ([`DiskPool::keep_layer`]). A missing directory is fine.
    pub fn remove_kept(&self, dir: &Path) -> Result<(), DiskError> {
        if !dir.starts_with(self.dir()) {
            return Err(DiskError::InvalidId {
                id: dir.display().to_string(),
            });
        }
        if !dir.exists() {
            return Ok(());
        }
        if dir.join(LAYER).exists() {
            let parent = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(dir)
                .map_err(|e| DiskError::io("open", dir, e))?;
            let name = CString::new(LAYER).map_err(|_| DiskError::InvalidId {
                id: dir.display().to_string(),
            })?;
            match ioctl::snap_destroy(parent.as_fd(), &name) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(DiskError::io("remove subvolume", dir.join(LAYER), e)),
            }
        }
        fs::remove_dir_all(dir).map_err(|e| DiskError::io("remove", dir, e))
    }

    /// Ids of every snapshot directory in the pool.
    pub fn list_snapshots(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.dir().join(SNAPSHOTS)) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| validate_id(n).is_ok())
            .collect();
        ids.sort();
        ids
    }

    /// Bytes free in the pool for new data.
    pub fn free_bytes(&self) -> Result<u64, DiskError> {
        free_bytes_at(self.dir())
    }
}

/// Bytes free for new data on the filesystem holding `path`.
pub fn free_bytes_at(path: &std::path::Path) -> Result<u64, DiskError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| DiskError::io("statvfs", path, e))?;
    Ok(st.blocks_available() * st.fragment_size())
}
