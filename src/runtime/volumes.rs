//! Host files and directories bound into a pod container's root: the
//! Kubernetes volumes the kubelet hands its runtime (a service account's
//! token, an emptyDir, a ConfigMap). Each is a recursive clone of the host
//! tree (`open_tree`), always `nodev` and `nosuid` (a device node or a
//! set-id file in it gives the sandbox nothing), read-only when asked,
//! shown under the sandbox's ids through an idmapped mount, and moved onto
//! its mount point while only the host sees the root (`super::pod_roots`
//! binds them before it clones the root into the sandbox).
//!
//! A filesystem that cannot be idmapped (tmpfs before Linux 6.3, which is
//! where the kubelet keeps a service account's token) is bound with its
//! host ids as they are: the sandbox sees them as the overflow id (65534)
//! and reaches the files as their mode lets others, which still reads a
//! token (0644).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::mount::{umount2, MntFlags};
use nix::sys::stat::{fstat, SFlag};

use super::beneath::{Dir, MountPointKind};
use super::idmap::mapped_user_namespace;
use crate::model::HostVolume;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("making a user namespace with the sandbox's id map for its volumes: {0}")]
    UserNamespace(io::Error),
    #[error("volume {destination} (from {source_path}): {step}: {source}{hint}")]
    Bind {
        destination: String,
        source_path: String,
        step: &'static str,
        source: io::Error,
        hint: &'static str,
    },
}

/// A volume bound into a root, held by its mount.
#[derive(Debug)]
pub struct BoundVolume {
    pub binding: Binding,
    /// The volume's mount (its root), as moved onto its mount point.
    mount: OwnedFd,
}

impl BoundVolume {
    /// Unmounts it from the tree it was bound in, lazily: a mount
    /// namespace copied from that tree meanwhile (a container's) keeps its
    /// own copy, which is private, so nothing propagates to it.
    pub fn detach(self) -> io::Result<()> {
        let path = format!("/proc/self/fd/{}", self.mount.as_raw_fd());
        umount2(path.as_str(), MntFlags::MNT_DETACH).map_err(io::Error::from)
    }
}

/// How a volume was bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Host ids `0..size` seen as the sandbox's.
    Idmapped,
    /// Host ids as they are (the filesystem cannot be idmapped).
    HostIds,
}

/// Binds each of `volumes`, in order, into the container root at `root`
/// (a tree only the host sees), the sandbox's ids being host
/// `base..base + size`. Returns how each was bound.
pub fn bind_volumes(
    root: &Path,
    volumes: &[HostVolume],
    base: u32,
    size: u32,
) -> Result<Vec<BoundVolume>, VolumeError> {
    if volumes.is_empty() {
        return Ok(Vec::new());
    }
    let userns = mapped_user_namespace(base, size).map_err(VolumeError::UserNamespace)?;
    let top = Dir::at(root).map_err(|source| VolumeError::Bind {
        destination: "/".into(),
        source_path: root.display().to_string(),
        step: "opening the container's root",
        source,
        hint: "",
    })?;
    let mut bound = Vec::with_capacity(volumes.len());
    for volume in volumes {
        let fail = |step: &'static str| {
            move |source: io::Error| {
                let hint = match (step, source.raw_os_error()) {
                    (MOUNT_POINT, Some(libc::ENOTDIR)) => {
                        " (the image has a file where the volume's directory goes)"
                    }
                    (MOUNT_POINT, Some(libc::EISDIR)) => {
                        " (the image has a directory where the volume's file goes)"
                    }
                    _ => "",
                };
                VolumeError::Bind {
                    destination: volume.destination.clone(),
                    source_path: volume.source.display().to_string(),
                    step,
                    source,
                    hint,
                }
            }
        };
        let tree = mountfd::clone_tree(mountfd::Source::Path(&volume.source), true)
            .map_err(fail(CLONING))?;
        let mut attrs = libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOSUID;
        if volume.read_only {
            attrs |= libc::MOUNT_ATTR_RDONLY;
        }
        let binding = match mountfd::set_attrs(
            tree.as_fd(),
            attrs | libc::MOUNT_ATTR_IDMAP,
            Some(userns.as_fd()),
            true,
        ) {
            Ok(()) => Binding::Idmapped,
            // The filesystem (or one mounted inside the tree) has no
            // idmapped mounts.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                mountfd::set_attrs(tree.as_fd(), attrs, None, true)
                    .map_err(fail("setting its flags"))?;
                Binding::HostIds
            }
            Err(e) => return Err(fail("idmapping it")(e)),
        };
        let kind = match is_dir(&tree).map_err(fail("reading it"))? {
            true => MountPointKind::Directory,
            false => MountPointKind::File,
        };
        let point = top
            .mount_point_in_root(&volume.destination, kind, base)
            .map_err(fail(MOUNT_POINT))?;
        mountfd::attach_onto(tree.as_fd(), point.as_fd()).map_err(fail("mounting it"))?;
        bound.push(BoundVolume {
            binding,
            mount: tree,
        });
    }
    Ok(bound)
}

/// Logs each volume of `whose` root (a sandbox's id, or a pod root's
/// name) bound with host ids: its files show as 65534 inside.
pub fn warn_host_ids(whose: &str, volumes: &[HostVolume], bound: &[BoundVolume]) {
    for (volume, bound) in volumes.iter().zip(bound) {
        if bound.binding == Binding::HostIds {
            tracing::warn!(
                root = whose,
                volume = %volume.destination,
                "its filesystem cannot be idmapped: bound with host ids, which the sandbox sees as 65534"
            );
        }
    }
}

impl VolumeError {
    /// Whether the caller can fix it (the volume or the image), not the
    /// host: the image has no place for the volume, or its source changed
    /// since it was validated.
    pub fn is_callers(&self) -> bool {
        let VolumeError::Bind { step, source, .. } = self else {
            return false;
        };
        match (*step, source.raw_os_error()) {
            // A file where a directory goes (or the reverse), a link loop,
            // or a place that is the root of a mount (no errno).
            (
                MOUNT_POINT,
                None | Some(libc::ENOTDIR | libc::EISDIR | libc::ELOOP | libc::ENOENT),
            ) => true,
            (CLONING, Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)) => true,
            _ => false,
        }
    }
}

/// The step that makes a volume's mount point, which the image's own
/// tree can fail.
const MOUNT_POINT: &str = "making its mount point in the root";
/// The step that clones the host tree, which a source gone since its
/// validation fails.
const CLONING: &str = "cloning it";

/// Whether the root of detached tree `tree` is a directory.
fn is_dir(tree: &OwnedFd) -> io::Result<bool> {
    let stat = fstat(tree.as_raw_fd())?;
    Ok(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}
