//! A layered image (pulled, or built from a spec) as one microVM disk: its
//! layers merged by a read-only overlay mounted for the export (overlayfs
//! applies the whiteouts and opaque directories, so the disk holds exactly
//! what a container of the image sees), exported once per image digest as
//! `<dir>/<hex>.ext4` the way `ext4.rs` exports a single tree.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::ext4::{export_at, Ext4Error, Owners};
use super::Image;

/// Where exports of layered images live, under the image cache.
pub const LAYERED_DISKS: &str = "vm-disks";

/// The ext4 export of `image` (layers above its root) in `dir`, made on
/// first use.
pub fn ensure_layered_ext4(image: &Image, dir: &Path, id_shift: u32) -> Result<PathBuf, Ext4Error> {
    let hex = image.digest.trim_start_matches("sha256:");
    let bad_digest = hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_alphanumeric());
    if bad_digest {
        return Err(Ext4Error::NotAnImage {
            path: image.rootfs.clone(),
            reason: format!("its digest {:?} cannot name a disk", image.digest),
        });
    }
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| Ext4Error::Io {
            action,
            path,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    let out = dir.join(format!("{hex}.ext4"));
    if out.is_file() {
        return Ok(out);
    }
    let merged = dir.join(format!(".merge-{hex}"));
    let mut lowers: Vec<&Path> = image.layers.iter().map(PathBuf::as_path).collect();
    lowers.push(&image.rootfs);
    let target = merged.clone();
    export_at(&merged, &out, Owners::Shifted(id_shift), true, move || {
        MergedView::mount(&target, &lowers)
    })
}

/// A read-only overlay of some layers, unmounted (and its mount point
/// removed) on drop.
pub(super) struct MergedView {
    at: PathBuf,
}

impl MergedView {
    pub(super) fn mount(at: &Path, lowers: &[&Path]) -> Result<Self, Ext4Error> {
        let err = |action: &'static str| {
            let path = at.to_path_buf();
            move |source: std::io::Error| Ext4Error::Io {
                action,
                path,
                source,
            }
        };
        // A half-done earlier export may have left it mounted.
        let _ = umount2(at, MntFlags::MNT_DETACH);
        std::fs::create_dir_all(at).map_err(err("create"))?;
        let (lower, _fds) =
            super::lowerdir::lowerdir_value(lowers).map_err(err("open the layers of"))?;
        let options = format!("lowerdir={lower}");
        mount(
            Some("overlay"),
            at,
            Some("overlay"),
            MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
            Some(options.as_str()),
        )
        .map_err(|e| err("mount the layers at")(e.into()))?;
        Ok(MergedView {
            at: at.to_path_buf(),
        })
    }
}

impl Drop for MergedView {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.at, MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.at.display(), "unmounting a merged image: {e}");
        }
        let _ = std::fs::remove_dir(&self.at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ext4::debugfs;
    use std::os::unix::fs::MetadataExt;

    const SHIFT: u32 = 100_000;

    fn shifted(path: &Path) {
        std::os::unix::fs::lchown(path, Some(SHIFT), Some(SHIFT)).unwrap();
    }

    #[test]
    fn the_disk_holds_the_merged_view_with_deletions_applied() {
        sandboxd_test_support::require_root!("needs root (overlay mount, user namespace maps)");
        let tmp = tempfile::tempdir().unwrap();
        let (bottom, top) = (tmp.path().join("bottom"), tmp.path().join("top"));
        for dir in [
            bottom.join("etc"),
            bottom.join("opt/old"),
            top.join("etc"),
            top.join("opt"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(bottom.join("etc/kept"), "kept\n").unwrap();
        std::fs::write(bottom.join("etc/deleted"), "gone\n").unwrap();
        std::fs::write(bottom.join("opt/old/file"), "old\n").unwrap();
        std::fs::write(top.join("opt/new"), "new\n").unwrap();
        std::fs::write(top.join("added"), "added\n").unwrap();
        nix::sys::stat::mknod(
            &top.join("etc/deleted"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            0,
        )
        .unwrap();
        xattr_set(&top.join("opt"), "trusted.overlay.opaque", b"y");
        for layer in [&bottom, &top] {
            for entry in walk(layer) {
                shifted(&entry);
            }
        }
        let image = Image {
            name: "layered".into(),
            digest: "sha256:0123abcd".into(),
            rootfs: bottom.clone(),
            layers: vec![top.clone()],
            defaults: Default::default(),
        };
        let disks = tmp.path().join("disks");
        let disk = ensure_layered_ext4(&image, &disks, SHIFT).expect("export");
        assert_eq!(disk, disks.join("0123abcd.ext4"));
        assert_eq!(debugfs(&disk, "cat /etc/kept"), "kept\n");
        assert_eq!(debugfs(&disk, "cat /added"), "added\n");
        assert_eq!(debugfs(&disk, "cat /opt/new"), "new\n");
        let listing = debugfs(&disk, "ls -l /etc");
        assert!(listing.contains("kept"), "positive control: {listing}");
        assert!(
            !listing.contains("deleted"),
            "the whiteout applies: {listing}"
        );
        let opt = debugfs(&disk, "ls -l /opt");
        assert!(opt.contains("new") && !opt.contains("old"), "opaque: {opt}");
        assert!(debugfs(&disk, "stat /etc/kept").contains("User:     0"));
        // Nothing is left mounted or half made, and a second call reuses it.
        let made = std::fs::metadata(&disk).unwrap().mtime();
        assert!(!disks.join(".merge-0123abcd").exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(".merge-0123abcd"), "{mounts}");
        let again = ensure_layered_ext4(&image, &disks, SHIFT).unwrap();
        assert_eq!(std::fs::metadata(&again).unwrap().mtime(), made);
    }

    fn walk(root: &Path) -> Vec<PathBuf> {
        let mut out = vec![root.to_path_buf()];
        let mut i = 0;
        while i < out.len() {
            if out[i].is_dir() && !out[i].is_symlink() {
                for entry in std::fs::read_dir(&out[i]).unwrap().flatten() {
                    out.push(entry.path());
                }
            }
            i += 1;
        }
        out
    }

    fn xattr_set(path: &Path, name: &str, value: &[u8]) {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: both strings are NUL-terminated and live across the call;
        // value points at value.len() readable bytes.
        let rc = unsafe {
            libc::lsetxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}
