//! A microVM's root made of host directories (`host_rootfs`: a containerd
//! snapshot's upperdir and lowerdirs, or a bundle's rootfs) as one ext4
//! disk. The directories carry the ids the guest is to see, so mkfs reads
//! them as host root; stacked ones are merged by a read-only overlay, as
//! `flatten.rs` merges an image's layers.
//!
//! Disks are cached in `<dir>/host-<hex>.ext4`, `hex` naming what the
//! directories hold now: each one's path and identity and the newest change
//! time (ctime) anywhere under it, which no write leaves as it was. Empty
//! directories add nothing to a merge and are left out of it, so the tasks
//! of one image (whose writable upperdir starts empty) share one disk.
//! Beside each disk, `host-<hex>.dirs` names its directories; every export
//! sweeps the disks whose directories are gone (the container or image was
//! removed) or hold something else now (this export replaces them). A
//! running VM keeps its open disk whatever the sweep unlinks.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::ext4::{export_at, Ext4Error, Owners};
use super::flatten::MergedView;

const PREFIX: &str = "host-";

/// The ext4 disk of the root stacked from `dirs` (top first) in `dir`,
/// made unless a disk of the same contents exists.
pub fn ensure_host_ext4(dirs: &[PathBuf], dir: &Path) -> Result<PathBuf, Ext4Error> {
    let mut stacked = Vec::new();
    for layer in dirs {
        let mut entries = std::fs::read_dir(layer).map_err(io("list", layer))?;
        if entries.next().is_some() {
            stacked.push(layer.clone());
        }
    }
    if stacked.is_empty() {
        return Err(Ext4Error::NotAnImage {
            path: dirs.first().cloned().unwrap_or_default(),
            reason: "the root's directories are all empty".into(),
        });
    }
    let hex = fingerprint(&stacked)?;
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let out = dir.join(format!("{PREFIX}{hex}.ext4"));
    {
        let _sweeping = super::ext4::lock_file(&dir.join(format!("{PREFIX}sweep.lock")))?;
        sweep(dir, &stacked, &hex);
        let listing = dir.join(format!("{PREFIX}{hex}.dirs"));
        let names: String = stacked
            .iter()
            .map(|d| format!("{}\n", d.display()))
            .collect();
        std::fs::write(&listing, names).map_err(io("write", &listing))?;
    }
    match stacked.as_slice() {
        [only] => export_at(only, &out, Owners::Host, false, || Ok(())),
        layers => {
            let merged = dir.join(format!(".merge-{PREFIX}{hex}"));
            let lowers: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
            let target = merged.clone();
            export_at(&merged, &out, Owners::Host, true, move || {
                MergedView::mount(&target, &lowers)
            })
        }
    }
}

/// sha256 of each directory's path, device, inode and the newest ctime
/// under it (with the number of entries, for a removal that left times
/// as they were).
fn fingerprint(dirs: &[PathBuf]) -> Result<String, Ext4Error> {
    let mut hash = Sha256::new();
    for dir in dirs {
        let top = std::fs::symlink_metadata(dir).map_err(io("stat", dir))?;
        let (mut newest, mut count) = ((top.ctime(), top.ctime_nsec()), 0u64);
        let mut stack = vec![dir.clone()];
        while let Some(path) = stack.pop() {
            let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
            newest = newest.max((meta.ctime(), meta.ctime_nsec()));
            count += 1;
            if meta.is_dir() && meta.dev() == top.dev() {
                for entry in std::fs::read_dir(&path).map_err(io("list", &path))? {
                    stack.push(entry.map_err(io("list", &path))?.path());
                }
            }
        }
        hash.update(dir.as_os_str().as_encoded_bytes());
        hash.update([0]);
        for n in [top.dev(), top.ino(), count] {
            hash.update(n.to_le_bytes());
        }
        hash.update(newest.0.to_le_bytes());
        hash.update(newest.1.to_le_bytes());
    }
    Ok(hex::encode(hash.finalize()))
}

/// Removes the disks whose directories are gone, and those of `dirs` that
/// are not `hex` (their contents changed since). Best effort: what cannot
/// be removed now is tried again at the next export.
fn sweep(dir: &Path, dirs: &[PathBuf], hex: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(other) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.strip_suffix(".dirs"))
        else {
            continue;
        };
        let Ok(listing) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let listed: Vec<PathBuf> = listing.lines().map(PathBuf::from).collect();
        let gone = listed.iter().any(|d| !d.is_dir());
        let replaced = listed == dirs && other != hex;
        if gone || replaced {
            for file in [".ext4", ".ext4.lock", ".dirs"] {
                let _ = std::fs::remove_file(dir.join(format!("{PREFIX}{other}{file}")));
            }
        }
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Ext4Error {
    let path = path.to_path_buf();
    move |source| Ext4Error::Io {
        action,
        path,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ext4::debugfs;

    fn disks_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".ext4"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn host_directories_become_one_disk_shared_while_unchanged_and_swept_when_gone() {
        sandboxd_test_support::require_root!("needs root (overlay mount, mkfs as root)");
        let tmp = tempfile::tempdir().unwrap();
        let (lower, upper_a, upper_b) = (
            tmp.path().join("lower"),
            tmp.path().join("upper-a"),
            tmp.path().join("upper-b"),
        );
        for d in [lower.join("etc"), upper_a.clone(), upper_b.clone()] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(lower.join("etc/kept"), "kept\n").unwrap();
        std::fs::write(lower.join("etc/owned"), "owned\n").unwrap();
        std::os::unix::fs::lchown(lower.join("etc/owned"), Some(1234), Some(1234)).unwrap();
        let disks = tmp.path().join("disks");

        // Two tasks of one image, their upperdirs still empty: one disk,
        // with the host's ids as they are.
        let a = ensure_host_ext4(&[upper_a.clone(), lower.clone()], &disks).expect("export");
        let b = ensure_host_ext4(&[upper_b.clone(), lower.clone()], &disks).expect("again");
        assert_eq!(a, b);
        assert_eq!(disks_in(&disks).len(), 1, "{:?}", disks_in(&disks));
        assert_eq!(debugfs(&a, "cat /etc/kept"), "kept\n");
        assert!(debugfs(&a, "stat /etc/owned").contains("User:  1234"));

        // An upperdir with something in it (a whiteout of `kept`, a new
        // file) is merged above the image, as the container would see it.
        std::fs::create_dir(upper_a.join("etc")).unwrap();
        nix::sys::stat::mknod(
            &upper_a.join("etc/kept"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            0,
        )
        .unwrap();
        std::fs::write(upper_a.join("etc/added"), "added\n").unwrap();
        let merged = ensure_host_ext4(&[upper_a.clone(), lower.clone()], &disks).unwrap();
        assert_ne!(merged, a);
        let listing = debugfs(&merged, "ls -l /etc");
        assert!(
            listing.contains("added") && listing.contains("owned"),
            "{listing}"
        );
        assert!(!listing.contains("kept"), "the whiteout applies: {listing}");

        // A change deep in the tree is a new disk, which replaces the old
        // one of the same directories.
        std::fs::write(lower.join("etc/kept"), "changed\n").unwrap();
        let changed = ensure_host_ext4(&[upper_b.clone(), lower.clone()], &disks).unwrap();
        assert_ne!(changed, a);
        assert_eq!(debugfs(&changed, "cat /etc/kept"), "changed\n");
        assert!(!a.exists(), "the stale disk is swept");
        assert!(
            merged.exists(),
            "positive control: other directories' disk stays"
        );

        // The directories of a disk are removed (the container is gone):
        // the next export sweeps its disk.
        std::fs::remove_dir_all(&upper_a).unwrap();
        let only = ensure_host_ext4(std::slice::from_ref(&lower), &disks).unwrap();
        assert!(!merged.exists(), "{:?}", disks_in(&disks));
        assert!(only.exists() && changed.exists(), "{:?}", disks_in(&disks));
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(".merge-host-"), "{mounts}");
    }

    #[test]
    fn a_root_of_empty_directories_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let err = ensure_host_ext4(&[tmp.path().to_path_buf()], &tmp.path().join("d"))
            .expect_err("nothing to boot");
        assert!(err.to_string().contains("all empty"), "{err}");
    }
}
