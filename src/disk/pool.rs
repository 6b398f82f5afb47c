//! `DiskPool`: finds or sets up the btrfs pool (sparse image file, mkfs, loop mount,
//! quotas) once, then holds the pool directory open for the layer ioctls.

use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{umount2, MntFlags};
use nix::sys::statfs::{statfs, BTRFS_SUPER_MAGIC};

use super::layer::validate_id;
use super::DiskError;

/// Inode number of every btrfs subvolume's root directory.
const SUBVOL_ROOT_INO: u64 = 256;

/// The pool of per-sandbox layers. Dropping it leaves the pool mounted (layers of
/// running sandboxes live there); [`DiskPool::unmount`] takes it down.
#[derive(Debug)]
pub struct DiskPool {
    dir: PathBuf,
    /// Kept open: every layer ioctl is issued on it, saving an open per call.
    dir_fd: File,
}

impl DiskPool {
    /// Uses `pool_dir` if it is already on btrfs (e.g. mounted by an earlier run);
    /// otherwise creates the sparse `image_file` of `size_bytes` if missing, formats
    /// it, and loop-mounts it there. Quotas are enabled and stale qgroups cleared
    /// every time (both are no-ops when there is nothing to do).
    pub fn open(pool_dir: &Path, image_file: &Path, size_bytes: u64) -> Result<Self, DiskError> {
        fs::create_dir_all(pool_dir).map_err(|e| DiskError::io("create", pool_dir, e))?;
        if !is_btrfs(pool_dir)? {
            if !image_file.exists() {
                make_image(image_file, size_bytes)?;
            }
            run(Command::new("mount")
                .arg("-t")
                .arg("btrfs")
                .arg("-o")
                .arg("loop,nosuid,nodev,noatime")
                .arg(image_file)
                .arg(pool_dir))?;
            if !is_btrfs(pool_dir)? {
                return Err(DiskError::NotBtrfs {
                    path: pool_dir.to_path_buf(),
                });
            }
            tracing::info!(pool = %pool_dir.display(), image = %image_file.display(), "disk pool mounted");
        }
        run(Command::new("btrfs")
            .args(["quota", "enable"])
            .arg(pool_dir))?;
        // Since 6.x the kernel drops a deleted subvolume's qgroup itself once the
        // cleaner has freed it; this catches any left from a crash or older kernel.
        if let Err(e) = run(Command::new("btrfs")
            .args(["qgroup", "clear-stale"])
            .arg(pool_dir))
        {
            tracing::warn!(error = %e, "could not clear stale qgroups; harmless, continuing");
        }
        let dir_fd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(pool_dir)
            .map_err(|e| DiskError::io("open", pool_dir, e))?;
        Ok(DiskPool {
            dir: pool_dir.to_path_buf(),
            dir_fd,
        })
    }

    /// A pool on a plain directory, for unit tests of code that only
    /// carries a pool around: no btrfs, no mount, no root. Layer ioctls on
    /// it fail.
    #[cfg(test)]
    pub(crate) fn unmounted(dir: &Path) -> Result<Self, DiskError> {
        fs::create_dir_all(dir).map_err(|e| DiskError::io("create", dir, e))?;
        let dir_fd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| DiskError::io("open", dir, e))?;
        Ok(DiskPool {
            dir: dir.to_path_buf(),
            dir_fd,
        })
    }

    /// The pool's mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the layer for `id` lives (whether or not it exists).
    pub fn layer_path(&self, id: &str) -> Result<PathBuf, DiskError> {
        validate_id(id)?;
        Ok(self.dir.join(id))
    }

    /// Ids of all layers in the pool (subvolumes with a valid id as name), sorted.
    pub fn list_layers(&self) -> Result<Vec<String>, DiskError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| DiskError::io("list", &self.dir, e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| DiskError::io("list", &self.dir, e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if validate_id(&name).is_err() {
                continue;
            }
            // readdir reports a subvolume by its tree id; stat shows the root inode.
            let is_subvol = fs::symlink_metadata(entry.path())
                .map(|m| m.is_dir() && m.ino() == SUBVOL_ROOT_INO)
                .unwrap_or(false);
            if is_subvol {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Unmounts the pool (layers stay in the image file for the next mount).
    /// Fails with EBUSY while a layer is still used, e.g. as an overlay upper dir.
    pub fn unmount(self) -> Result<(), DiskError> {
        let DiskPool { dir, dir_fd } = self;
        drop(dir_fd);
        // A process another thread is forking holds a copy of every
        // descriptor (ours included, close-on-exec or not) until it execs,
        // and the mount is busy meanwhile: retry for a moment.
        let mut attempts = 0;
        loop {
            match umount2(&dir, MntFlags::empty()) {
                Err(nix::errno::Errno::EBUSY) if attempts < 40 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                done => return done.map_err(|e| DiskError::io("unmount", &dir, e)),
            }
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.dir_fd.as_fd()
    }
}

fn is_btrfs(dir: &Path) -> Result<bool, DiskError> {
    let st = statfs(dir).map_err(|e| DiskError::io("statfs", dir, e))?;
    Ok(st.filesystem_type() == BTRFS_SUPER_MAGIC)
}

/// Creates and formats the image under a temporary name, so an image file that
/// exists is always a formatted one.
fn make_image(image_file: &Path, size_bytes: u64) -> Result<(), DiskError> {
    if let Some(parent) = image_file.parent() {
        fs::create_dir_all(parent).map_err(|e| DiskError::io("create", parent, e))?;
    }
    let mut tmp_name = image_file.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let f = File::create(&tmp).map_err(|e| DiskError::io("create", &tmp, e))?;
    f.set_len(size_bytes)
        .map_err(|e| DiskError::io("size", &tmp, e))?;
    drop(f);
    run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&tmp))?;
    fs::rename(&tmp, image_file).map_err(|e| DiskError::io("rename", image_file, e))?;
    tracing::info!(image = %image_file.display(), size_bytes, "disk pool image created");
    Ok(())
}

fn run(cmd: &mut Command) -> Result<(), DiskError> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|e| DiskError::Setup {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(DiskError::Setup {
        command: shown,
        detail: format!("{} ({})", stderr.trim(), out.status),
    })
}
