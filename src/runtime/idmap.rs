//! Read-only layers owned by host ids (a root filesystem containerd
//! unpacked, owned by host uid 0) shown to the sandbox under its shifted ids
//! without a copy: each layer gets an idmapped bind mount (`open_tree` +
//! `mount_setattr(MOUNT_ATTR_IDMAP)`) through a user namespace holding the
//! sandbox's map, so host uid 0 reads as `id_map_base`.
//!
//! Overlayfs takes private clones of its layers when it mounts, and on
//! Linux 6.1 it refuses a layer that is not attached in the caller's mount
//! namespace. So the idmapped mounts are attached under the run directory
//! only until the overlay is made ([`IdmappedLayers`] detaches them when
//! dropped); nothing is left to unmount at teardown.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{umount2, MntFlags};

/// Why layers could not be idmapped.
#[derive(Debug, thiserror::Error)]
pub enum IdmapError {
    #[error("making a user namespace with the sandbox's id map: {0}")]
    UserNamespace(io::Error),
    #[error("idmapping layer {layer}: {step} failed: {source} (idmapped mounts need Linux 5.12 and a filesystem that supports them: ext4, xfs, btrfs)")]
    Layer {
        layer: PathBuf,
        step: &'static str,
        source: io::Error,
    },
}

/// Layers attached as idmapped mounts, detached when dropped.
#[derive(Debug)]
pub struct IdmappedLayers {
    mounts: Vec<PathBuf>,
}

impl IdmappedLayers {
    /// The idmapped mounts, in the order of the layers given.
    pub fn paths(&self) -> Vec<&Path> {
        self.mounts.iter().map(PathBuf::as_path).collect()
    }
}

impl Drop for IdmappedLayers {
    fn drop(&mut self) {
        for mount in &self.mounts {
            // The overlay keeps its own clones; a failure leaves one idle
            // mount under the run dir, which teardown's rm fails loudly on.
            let _ = umount2(mount, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(mount);
        }
    }
}

/// Attaches each of `layers` idmapped (host `0..size` seen as
/// `base..base+size`) at `<under>/<index>`.
pub fn idmap_layers(
    layers: &[&Path],
    under: &Path,
    base: u32,
    size: u32,
) -> Result<IdmappedLayers, IdmapError> {
    let userns = mapped_user_namespace(base, size).map_err(IdmapError::UserNamespace)?;
    let mut attached = IdmappedLayers { mounts: Vec::new() };
    for (index, layer) in layers.iter().enumerate() {
        let fail = |step| {
            move |source| IdmapError::Layer {
                layer: layer.to_path_buf(),
                step,
                source,
            }
        };
        let tree =
            mountfd::clone_tree(mountfd::Source::Path(layer), false).map_err(fail("open_tree"))?;
        set_idmap(&tree, &userns).map_err(fail("mount_setattr"))?;
        let target = under.join(index.to_string());
        std::fs::create_dir_all(&target).map_err(fail("making its mount point"))?;
        mountfd::attach_at(tree.as_fd(), &target).map_err(fail("move_mount"))?;
        attached.mounts.push(target);
    }
    Ok(attached)
}

fn set_idmap(tree: &OwnedFd, userns: &File) -> io::Result<()> {
    // Read-only too: the layers are another owner's (containerd's
    // snapshots), and nothing but overlayfs reads them through here.
    mountfd::set_attrs(
        tree.as_fd(),
        libc::MOUNT_ATTR_IDMAP | libc::MOUNT_ATTR_RDONLY,
        Some(userns.as_fd()),
        false,
    )
}

/// A user namespace whose ids `0..size` are host `base..base+size`, held by
/// its descriptor. A forked child makes it and waits; the parent writes
/// the maps (root in the parent namespace may), opens the namespace, then
/// lets the child exit.
pub(crate) fn mapped_user_namespace(base: u32, size: u32) -> io::Result<File> {
    // Close-on-exec, so no process another thread execs holds them open.
    let (ready_read, ready_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (done_read, done_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // A supervisor's reaper leaves the helper to the wait below.
    let own = super::children::OwnFork::start();
    // SAFETY: the child runs only async-signal-safe calls (close, unshare,
    // write, read, _exit) on descriptors it already holds, so forking a
    // process that may have other threads is sound.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            own.child();
            // Its copy of the parent's ends, so the parent's close is EOF.
            drop(done_write);
            drop(ready_read);
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = nix::unistd::write(&ready_write, &[u8::from(ok)]);
            let mut byte = [0u8; 1];
            // Returns when the parent closes its end (or dies).
            let _ = nix::unistd::read(done_read.as_raw_fd(), &mut byte);
            // SAFETY: _exit skips the parent's atexit handlers and buffers.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let owned = own.parent(child.as_raw());
            drop(ready_write);
            drop(done_read);
            let opened = (|| {
                let mut byte = [0u8; 1];
                let n = nix::unistd::read(ready_read.as_raw_fd(), &mut byte)?;
                if n != 1 || byte[0] != 1 {
                    return Err(io::Error::other(
                        "the helper process could not unshare its user namespace",
                    ));
                }
                let map = format!("0 {base} {size}\n");
                std::fs::write(format!("/proc/{child}/uid_map"), &map)?;
                std::fs::write(format!("/proc/{child}/gid_map"), &map)?;
                File::open(format!("/proc/{child}/ns/user"))
            })();
            drop(done_write);
            let _ = nix::sys::wait::waitpid(child, None);
            drop(owned);
            opened
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn root_or_skip() -> bool {
        sandboxd_test_support::root_or_note!("needs root (idmapped mounts)")
    }

    #[test]
    fn host_root_owned_files_read_as_the_shifted_base_and_nothing_stays_mounted() {
        if !root_or_skip() {
            return;
        }
        // Under /var/tmp: tmpfs supports idmapped mounts only from 6.3.
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let layer = tmp.path().join("layer");
        std::fs::create_dir(&layer).unwrap();
        std::fs::write(layer.join("f"), "x").unwrap();
        std::os::unix::fs::chown(layer.join("f"), Some(0), Some(0)).unwrap();
        let under = tmp.path().join("lower");
        let mounts;
        {
            let attached = idmap_layers(&[&layer], &under, 100_000, 65_536).unwrap();
            let seen = std::fs::metadata(attached.paths()[0].join("f")).unwrap();
            assert_eq!((seen.uid(), seen.gid()), (100_000, 100_000));
            mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(mounts.contains(&under.join("0").display().to_string()));
        }
        // The source itself is unchanged, and the mount is gone.
        assert_eq!(std::fs::metadata(layer.join("f")).unwrap().uid(), 0);
        let after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!after.contains(&under.join("0").display().to_string()));
        assert!(!under.join("0").exists());
    }

    #[test]
    fn a_missing_layer_names_itself() {
        if !root_or_skip() {
            return;
        }
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let missing = tmp.path().join("nope");
        let err = idmap_layers(&[&missing], &tmp.path().join("lower"), 100_000, 65_536)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope") && err.contains("open_tree"), "{err}");
    }
}
