use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::*;

/// A tar stream built entry by entry; names are written raw, so hostile
/// ones (`..`, absolute) get through as a registry could send them.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, name: &str, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(size);
        h
    }

    fn file(mut self, name: &str, body: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, name, 0o644, body.len() as u64);
        h.set_cksum();
        self.0.append(&h, body).unwrap();
        self
    }

    fn owned_file(mut self, name: &str, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, name, 0o4755, 1);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_cksum();
        self.0.append(&h, &b"x"[..]).unwrap();
        self
    }

    fn dir(mut self, name: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, name, 0o755, 0);
        h.set_cksum();
        self.0.append(&h, io::empty()).unwrap();
        self
    }

    fn link(mut self, kind: tar::EntryType, name: &str, target: &str) -> Self {
        let mut h = Self::header(kind, name, 0o777, 0);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        self.0.append(&h, io::empty()).unwrap();
        self
    }

    fn device(mut self, kind: tar::EntryType, name: &str) -> Self {
        let mut h = Self::header(kind, name, 0o666, 0);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        h.set_cksum();
        self.0.append(&h, io::empty()).unwrap();
        self
    }

    fn unpack(self, dest: &Path) -> Result<UnpackStats, UnpackError> {
        let bytes = self.0.into_inner().unwrap();
        unpack_layer(&bytes[..], dest, 1 << 20)
    }
}

/// `<tmp>/layer` to unpack into, and `<tmp>/outside` that nothing may touch.
fn scratch() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let layer = tmp.path().join("layer");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&layer).unwrap();
    std::fs::create_dir(&outside).unwrap();
    (tmp, layer, outside)
}

fn entries_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn files_dirs_links_keep_modes_and_times_with_owners_shifted() {
    let (_tmp, layer, _) = scratch();
    let stats = Layer::new()
        .dir("usr/")
        .dir("usr/bin/")
        .file("usr/bin/tool", b"#!/bin/sh\n")
        .link(tar::EntryType::Symlink, "bin", "usr/bin")
        .link(tar::EntryType::Link, "usr/bin/tool2", "usr/bin/tool")
        .owned_file("usr/bin/suid", 1000)
        .owned_file("usr/bin/far", 4_000_000)
        .unpack(&layer)
        .unwrap();
    assert_eq!(stats.entries, 7);
    let tool = std::fs::symlink_metadata(layer.join("usr/bin/tool")).unwrap();
    assert_eq!((tool.uid(), tool.gid()), (ID_OFFSET, ID_OFFSET));
    assert_eq!(tool.mode() & 0o7777, 0o644);
    assert_eq!(tool.mtime(), 1_700_000_000);
    assert_eq!(tool.nlink(), 2, "the hard link shares the inode");
    let suid = std::fs::symlink_metadata(layer.join("usr/bin/suid")).unwrap();
    assert_eq!(suid.uid(), ID_OFFSET + 1000);
    assert_eq!(suid.mode() & 0o7777, 0o4755);
    let far = std::fs::symlink_metadata(layer.join("usr/bin/far")).unwrap();
    assert_eq!(far.uid(), ID_OFFSET + OVERFLOW_ID);
    assert_eq!(
        std::fs::read_link(layer.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
}

#[test]
fn dot_dot_names_are_refused_and_write_nothing_outside() {
    let (_tmp, layer, outside) = scratch();
    let err = Layer::new()
        .file("../outside/x", b"escaped")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::Escape { .. }), "{err}");
    let err = Layer::new()
        .file("a/../../outside/y", b"escaped")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::Escape { .. }), "{err}");
    assert_eq!(entries_in(&outside), 0);
}

#[test]
fn absolute_names_land_inside_the_layer() {
    let (_tmp, layer, _) = scratch();
    Layer::new()
        .file("/etc/sandboxd-unpack-test", b"inside")
        .unpack(&layer)
        .unwrap();
    assert_eq!(
        std::fs::read(layer.join("etc/sandboxd-unpack-test")).unwrap(),
        b"inside"
    );
    assert!(!Path::new("/etc/sandboxd-unpack-test").exists());
}

#[test]
fn a_symlinked_parent_cannot_lead_outside() {
    let (_tmp, layer, outside) = scratch();
    // Absolute symlink used as a parent.
    let err = Layer::new()
        .link(tar::EntryType::Symlink, "evil", outside.to_str().unwrap())
        .file("evil/x", b"escaped")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::Escape { .. }), "{err}");
    // Relative symlink climbing out.
    let (_tmp2, layer2, outside2) = scratch();
    let err = Layer::new()
        .link(tar::EntryType::Symlink, "up", "../outside")
        .file("up/y", b"escaped")
        .unpack(&layer2)
        .unwrap_err();
    assert!(matches!(err, UnpackError::Escape { .. }), "{err}");
    assert_eq!(entries_in(&outside), 0);
    assert_eq!(entries_in(&outside2), 0);
    // Positive control: a symlink that stays inside is followed.
    let (_tmp3, layer3, _) = scratch();
    Layer::new()
        .dir("real/")
        .link(tar::EntryType::Symlink, "alias", "real")
        .file("alias/z", b"in")
        .unpack(&layer3)
        .unwrap();
    assert_eq!(std::fs::read(layer3.join("real/z")).unwrap(), b"in");
}

#[test]
fn hard_links_must_stay_inside_the_layer() {
    let (_tmp, layer, outside) = scratch();
    std::fs::write(outside.join("secret"), b"host").unwrap();
    let err = Layer::new()
        .link(tar::EntryType::Link, "stolen", "../outside/secret")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::LinkOutside { .. }), "{err}");
    let err = Layer::new()
        .link(tar::EntryType::Symlink, "out", outside.to_str().unwrap())
        .link(tar::EntryType::Link, "stolen", "out/secret")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::LinkOutside { .. }), "{err}");
    assert_eq!(
        std::fs::metadata(outside.join("secret")).unwrap().nlink(),
        1
    );
}

#[test]
fn devices_are_dropped_and_fifos_kept() {
    let (_tmp, layer, _) = scratch();
    let stats = Layer::new()
        .device(tar::EntryType::Char, "dev/null")
        .device(tar::EntryType::Block, "dev/sda")
        .link(tar::EntryType::Fifo, "pipe", "")
        .unpack(&layer)
        .unwrap();
    assert_eq!(stats.devices_dropped, 2);
    assert!(!layer.join("dev/null").exists());
    assert!(!layer.join("dev/sda").exists());
    assert!(std::fs::symlink_metadata(layer.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn whiteouts_become_overlay_whiteouts() {
    let (_tmp, layer, _) = scratch();
    Layer::new()
        .file("etc/.wh.motd", b"")
        .dir("opt/")
        .file("opt/.wh..wh..opq", b"")
        .unpack(&layer)
        .unwrap();
    let whiteout = std::fs::symlink_metadata(layer.join("etc/motd")).unwrap();
    assert!(whiteout.file_type().is_char_device());
    assert_eq!(whiteout.rdev(), 0);
    assert!(!layer.join("etc/.wh.motd").exists());
    let mut value = [0u8; 4];
    let name = std::ffi::CString::new(layer.join("opt").to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let len = unsafe {
        libc::getxattr(
            name.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    assert_eq!(len, 1, "{}", io::Error::last_os_error());
    assert_eq!(value[0], b'y');
    // A whiteout naming `..` is not a deletion outside.
    let err = Layer::new()
        .file("a/.wh...", b"")
        .unpack(&layer)
        .unwrap_err();
    assert!(matches!(err, UnpackError::Escape { .. }), "{err}");
}

#[test]
fn content_past_the_limit_stops_the_unpack() {
    let (_tmp, layer, _) = scratch();
    let bytes = Layer::new()
        .file("a", &[7u8; 600])
        .file("b", &[7u8; 600])
        .0
        .into_inner()
        .unwrap();
    let err = unpack_layer(&bytes[..], &layer, 1000).unwrap_err();
    assert!(
        matches!(err, UnpackError::TooLarge { limit: 1000 }),
        "{err}"
    );
    // Positive control: the same layer fits a larger limit.
    let (_tmp2, layer2, _) = scratch();
    let stats = unpack_layer(&bytes[..], &layer2, 1200).unwrap();
    assert_eq!(stats.bytes, 1200);
}
