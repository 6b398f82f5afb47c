//! The new mount API's calls that take and give mounts as descriptors
//! (`open_tree`, `mount_setattr`, `move_mount`), which neither `libc` nor
//! `nix` wraps. One copy serves the daemon (container roots, idmapped
//! layers, volumes) and the guest agent (a microVM's volume copies),
//! which is its own statically built crate and cannot call the daemon's.
//!
//! A tree is cloned detached, its attributes set while nothing can see
//! it, then attached in one step: a mount never appears half made, and a
//! path swapped for a symlink after it was checked is not followed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a clone is of.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A path from the working directory; a symlink at its last
    /// component is not followed.
    Path(&'a Path),
    /// The very file or directory a descriptor holds (an `O_PATH` one
    /// from `openat2(RESOLVE_BENEATH)`, say).
    Held(BorrowedFd<'a>),
}

/// A detached clone of the mount at `source` (with the mounts beneath it
/// when `recursive`), close-on-exec.
pub fn clone_tree(source: Source<'_>, recursive: bool) -> io::Result<OwnedFd> {
    let (dir, path, empty) = match source {
        Source::Path(path) => (libc::AT_FDCWD, cstring(path)?, 0),
        Source::Held(held) => (
            held.as_raw_fd(),
            CString::default(),
            libc::AT_EMPTY_PATH as u32,
        ),
    };
    let recursive = if recursive {
        libc::AT_RECURSIVE as u32
    } else {
        0
    };
    // SAFETY: open_tree(2) with a directory descriptor (or AT_FDCWD)
    // borrowed for the call and a NUL-terminated path that outlives it; it
    // returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            path.as_ptr(),
            libc::OPEN_TREE_CLONE
                | libc::OPEN_TREE_CLOEXEC
                | libc::AT_SYMLINK_NOFOLLOW as u32
                | recursive
                | empty,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("open_tree returned no fd"))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets `attr_set` (`MOUNT_ATTR_*`) on detached tree `tree`, on every
/// mount in it when `recursive`, and makes it private in the same call (a
/// clone of a shared mount is in its source's peer group until then, and
/// a mount propagated into it would come without the attributes);
/// `userns` holds the id map that `MOUNT_ATTR_IDMAP` asks for.
pub fn set_attrs(
    tree: BorrowedFd<'_>,
    attr_set: u64,
    userns: Option<BorrowedFd<'_>>,
    recursive: bool,
) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: userns
            .and_then(|u| u64::try_from(u.as_raw_fd()).ok())
            .unwrap_or_default(),
    };
    let flags = if recursive {
        libc::AT_EMPTY_PATH | libc::AT_RECURSIVE
    } else {
        libc::AT_EMPTY_PATH
    };
    // SAFETY: mount_setattr(2) on a descriptor borrowed for the call, with
    // an empty path, AT_EMPTY_PATH, and a `mount_attr` of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts detached `tree` on the very file or directory `target` holds.
pub fn attach_onto(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    move_mount(tree, target.as_raw_fd(), c"", libc::MOVE_MOUNT_T_EMPTY_PATH)
}

/// Mounts detached `tree` at `target`, a path from the working directory.
pub fn attach_at(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    move_mount(tree, libc::AT_FDCWD, &target, 0)
}

fn move_mount(
    tree: BorrowedFd<'_>,
    target_dir: i32,
    target: &std::ffi::CStr,
    target_flags: u32,
) -> io::Result<()> {
    // SAFETY: move_mount(2) of a detached tree borrowed for the call onto a
    // directory descriptor (or AT_FDCWD) and a NUL-terminated path, both
    // outliving it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target_dir,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | target_flags,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

/// Needs root: each test makes its thread a mount namespace of its own
/// (the rest of the test process keeps the host's) and binds there.
#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::AsFd;

    /// Runs `test` on a thread of its own in a mount namespace of its own,
    /// whose mounts propagate nowhere.
    fn in_own_mount_namespace(test: impl FnOnce() + Send + 'static) {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare (root?)");
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .expect("private mounts");
            test();
        })
        .join()
        .expect("the test's thread");
    }

    #[test]
    fn a_read_only_clone_is_attached_by_path_and_onto_a_descriptor() {
        in_own_mount_namespace(|| {
            let source = tempfile::tempdir().expect("source");
            fs::write(source.path().join("f"), "from the source").expect("file");
            let by_path = tempfile::tempdir().expect("target");
            let by_fd = tempfile::tempdir().expect("target");

            let tree = clone_tree(Source::Path(source.path()), true).expect("clone");
            set_attrs(tree.as_fd(), libc::MOUNT_ATTR_RDONLY, None, true).expect("attrs");
            attach_at(tree.as_fd(), by_path.path()).expect("attach at a path");
            assert_eq!(
                fs::read_to_string(by_path.path().join("f")).expect("read"),
                "from the source"
            );
            let written = fs::write(by_path.path().join("g"), "x");
            assert_eq!(
                written.map_err(|e| e.raw_os_error()),
                Err(Some(libc::EROFS)),
                "the clone is read-only"
            );

            // A clone of what a descriptor holds, onto what another holds;
            // writable, as the positive control of the read-only one.
            let held = fs::File::open(source.path()).expect("held");
            let point = fs::File::open(by_fd.path()).expect("mount point");
            let tree = clone_tree(Source::Held(held.as_fd()), false).expect("clone");
            set_attrs(tree.as_fd(), libc::MOUNT_ATTR_NOSUID, None, false).expect("attrs");
            attach_onto(tree.as_fd(), point.as_fd()).expect("attach onto");
            fs::write(by_fd.path().join("g"), "through the bind").expect("writable");
            assert_eq!(
                fs::read_to_string(source.path().join("g")).expect("read"),
                "through the bind"
            );
            for target in [by_path.path(), by_fd.path()] {
                nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).expect("umount");
            }
        });
    }

    #[test]
    fn a_symlink_at_the_path_is_not_followed() {
        in_own_mount_namespace(|| {
            let dir = tempfile::tempdir().expect("dir");
            fs::create_dir(dir.path().join("real")).expect("real");
            std::os::unix::fs::symlink("real", dir.path().join("link")).expect("link");
            let is_dir = |tree: &OwnedFd| {
                let mode = nix::sys::stat::fstat(tree.as_raw_fd())
                    .expect("stat")
                    .st_mode;
                mode & libc::S_IFMT == libc::S_IFDIR
            };
            // Refused, or a clone of the link itself: never of its target.
            if let Ok(tree) = clone_tree(Source::Path(&dir.path().join("link")), false) {
                assert!(!is_dir(&tree), "the link was followed");
            }
            let real =
                clone_tree(Source::Path(&dir.path().join("real")), false).expect("the directory");
            assert!(is_dir(&real), "the positive control");
        });
    }
}
