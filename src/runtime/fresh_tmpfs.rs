//! The small tmpfs mounts of a checkpointed sandbox (its `/dev`, an unused
//! `/dev/shm`) that a fork gets made afresh from a listing kept in the
//! checkpoint, rather than through CRIU: CRIU saves and restores every
//! tmpfs with `tar` and `gzip`, two processes and about 3 ms per mount on
//! each restore. A tmpfs qualifies when all it holds is directories, empty
//! files and symlinks (`/dev`'s mount points and links), few enough to list;
//! one holding anything else (a file with data, a node, a socket) is left
//! to CRIU, which keeps its content.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{fchownat, Gid, Uid};
use serde::{Deserialize, Serialize};

/// More entries (the root included) than `/dev` holds; a tmpfs with more
/// is left to CRIU.
const MAX_ENTRIES: usize = 128;

/// The longest relative path listed; deeper trees are left to CRIU.
const MAX_PATH_LEN: usize = 1024;

/// A tmpfs as a fork gets it: mounted with the checkpointed options, then
/// its entries made with their modes and owners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreshTmpfs {
    /// Where it is mounted in the sandbox.
    pub point: String,
    /// The superblock's options as mountinfo gives them (size, mode, uid,
    /// gid...), without `rw`.
    pub options: String,
    /// The mount's `nosuid`, `nodev`, `noexec` and atime flags.
    pub flags: Vec<String>,
    /// The root first, then each directory before what it holds.
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the tmpfs's root; empty for the root itself.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (with setgid and sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Dir,
    /// An empty file (a mount point for a bind of a host file).
    File,
    Symlink {
        target: String,
    },
}

/// Why a listed tmpfs could not be made again.
#[derive(Debug, thiserror::Error)]
#[error("making the fork's {point} tmpfs ({step}): {source}")]
pub struct FreshTmpfsError {
    point: String,
    step: &'static str,
    source: io::Error,
}

/// The mount flags a fork's tmpfs is made with, as the checkpointed
/// mount had them. All of them: CRIU binds it into the sandbox's user
/// namespace, where a flag the host's mount set cannot be changed.
const MOUNT_FLAGS: [(&str, MsFlags); 6] = [
    ("nosuid", MsFlags::MS_NOSUID),
    ("nodev", MsFlags::MS_NODEV),
    ("noexec", MsFlags::MS_NOEXEC),
    ("noatime", MsFlags::MS_NOATIME),
    ("nodiratime", MsFlags::MS_NODIRATIME),
    ("relatime", MsFlags::MS_RELATIME),
];

impl FreshTmpfs {
    /// Lists the tmpfs mounted at `point`, seen on the host at `inside`
    /// (through `/proc/PID/root`; the sandbox frozen), or `None` when it
    /// holds what a listing does not keep. Entries on another filesystem
    /// are the mount points of its child mounts: listed, not entered.
    pub fn read(
        point: &str,
        inside: &Path,
        mount_options: &str,
        super_options: &str,
    ) -> Option<Self> {
        // A read-only filesystem would come back writable.
        if super_options.split(',').any(|o| o == "ro") {
            return None;
        }
        let root = fs::symlink_metadata(inside).ok()?;
        if !root.is_dir() {
            return None;
        }
        let mut entries = vec![entry(String::new(), EntryKind::Dir, &root)];
        let mut pending = vec![String::new()];
        while let Some(dir) = pending.pop() {
            // Never more than the cap is read: a directory of millions of
            // files costs no more than one of the cap's size.
            let mut names: Vec<_> = fs::read_dir(inside.join(&dir))
                .ok()?
                .take(MAX_ENTRIES + 1)
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<_, _>>()
                .ok()?;
            names.sort();
            for name in names {
                let name = name.to_str()?;
                let path = if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                };
                // Made again under a longer host path than it is read from.
                if path.len() > MAX_PATH_LEN {
                    return None;
                }
                let meta = fs::symlink_metadata(inside.join(&path)).ok()?;
                let own = meta.dev() == root.dev();
                let kind = if meta.file_type().is_symlink() {
                    let target = fs::read_link(inside.join(&path)).ok()?;
                    EntryKind::Symlink {
                        target: target.to_str()?.to_string(),
                    }
                } else if meta.is_dir() {
                    if own {
                        pending.push(path.clone());
                    }
                    EntryKind::Dir
                } else if !own || (meta.is_file() && meta.len() == 0) {
                    // A mount point of a bind over a file (a device node,
                    // /dev/null over a masked file...).
                    EntryKind::File
                } else {
                    return None;
                };
                entries.push(entry(path, kind, &meta));
                if entries.len() > MAX_ENTRIES {
                    return None;
                }
            }
        }
        let flags = mount_options
            .split(',')
            .filter(|o| MOUNT_FLAGS.iter().any(|(name, _)| name == o))
            .map(str::to_string)
            .collect();
        let options = super_options
            .split(',')
            .filter(|o| *o != "rw" && *o != "ro")
            .collect::<Vec<_>>()
            .join(",");
        Some(Self {
            point: point.to_string(),
            options,
            flags,
            entries,
        })
    }

    /// Mounts a new tmpfs at `at` (made here) and fills it with the
    /// entries; symlinks come last, so nothing made follows one.
    pub fn make(&self, at: &Path) -> Result<(), FreshTmpfsError> {
        let fail = |step| self.error(step);
        // Searchable by the sandbox's root: CRIU opens it from inside the
        // sandbox's user namespace.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(at)
            .map_err(fail("its host directory"))?;
        let mut flags = MOUNT_FLAGS
            .iter()
            .filter(|(name, _)| self.flags.iter().any(|f| f == name))
            .fold(MsFlags::empty(), |all, (_, flag)| all | *flag);
        // mountinfo shows neither relatime nor noatime for strictatime.
        if !flags.intersects(MsFlags::MS_RELATIME | MsFlags::MS_NOATIME) {
            flags |= MsFlags::MS_STRICTATIME;
        }
        mount_private(at, flags, &self.options).map_err(|(step, e)| fail(step)(e))?;
        let made = self.fill(at);
        if made.is_err() {
            unmount(at);
        }
        made
    }

    fn error(&self, step: &'static str) -> impl FnOnce(io::Error) -> FreshTmpfsError {
        let point = self.point.clone();
        move |source| FreshTmpfsError {
            point,
            step,
            source,
        }
    }

    fn fill(&self, at: &Path) -> Result<(), FreshTmpfsError> {
        let fail = |step| self.error(step);
        let (links, others): (Vec<_>, Vec<_>) = self
            .entries
            .iter()
            .partition(|e| matches!(e.kind, EntryKind::Symlink { .. }));
        for e in others.into_iter().chain(links) {
            let path = join_relative(at, &e.path).map_err(fail("an entry's path"))?;
            match &e.kind {
                EntryKind::Dir if e.path.is_empty() => {}
                EntryKind::Dir => fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&path)
                    .map_err(fail("a directory"))?,
                EntryKind::File => {
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&path)
                        .map_err(fail("a file"))?;
                }
                EntryKind::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &path).map_err(fail("a symlink"))?
                }
            }
            fchownat(
                None,
                &path,
                Some(Uid::from_raw(e.uid)),
                Some(Gid::from_raw(e.gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|err| fail("an owner")(err.into()))?;
            if !matches!(e.kind, EntryKind::Symlink { .. }) {
                fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                    .map_err(fail("a mode"))?;
            }
        }
        Ok(())
    }
}

/// Mounts a new tmpfs at `at` (an existing directory) with `flags` and
/// `options`, not a peer of the mount it sits on: nothing made in it
/// propagates to other namespaces before it is detached. On failure
/// nothing stays mounted and `at` is removed; the error names the step.
pub fn mount_private(
    at: &Path,
    flags: MsFlags,
    options: &str,
) -> Result<(), (&'static str, io::Error)> {
    if let Err(e) = mount(Some("tmpfs"), at, Some("tmpfs"), flags, Some(options)) {
        let _ = fs::remove_dir(at);
        return Err(("mount", e.into()));
    }
    let private = mount(
        None::<&str>,
        at,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    );
    if let Err(e) = private {
        unmount(at);
        return Err(("make it private", e.into()));
    }
    Ok(())
}

/// Takes a made tmpfs off the host's mount table; the fork's bind of it
/// keeps it alive. Best effort: it runs on error paths too.
pub fn unmount(at: &Path) {
    if let Err(e) = umount2(at, MntFlags::MNT_DETACH) {
        tracing::warn!(path = %at.display(), error = %e, "could not detach a tmpfs made for a fork");
    }
    let _ = fs::remove_dir(at);
}

fn entry(path: String, kind: EntryKind, meta: &fs::Metadata) -> Entry {
    Entry {
        path,
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }
}

/// `at/relative`, refusing anything but plain names in `relative`.
fn join_relative(at: &Path, relative: &str) -> io::Result<PathBuf> {
    let mut path = at.to_path_buf();
    for part in Path::new(relative).components() {
        match part {
            Component::Normal(name) => path.push(name),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{relative:?} is not a relative path of plain names"),
                ))
            }
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("pts")).unwrap();
        fs::File::create(dir.path().join("null")).unwrap();
        std::os::unix::fs::symlink("/proc/self/fd", dir.path().join("fd")).unwrap();
        dir
    }

    #[test]
    fn a_tree_of_dirs_empty_files_and_links_is_listed_root_first() {
        let dir = tree();
        let listed = FreshTmpfs::read(
            "/dev",
            dir.path(),
            "rw,nosuid,relatime",
            "rw,size=65536k,mode=755",
        )
        .unwrap();
        assert_eq!(listed.options, "size=65536k,mode=755");
        assert_eq!(listed.flags, ["nosuid", "relatime"]);
        let kinds: Vec<_> = listed
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.kind.clone()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("", EntryKind::Dir),
                (
                    "fd",
                    EntryKind::Symlink {
                        target: "/proc/self/fd".into()
                    }
                ),
                ("null", EntryKind::File),
                ("pts", EntryKind::Dir),
            ]
        );
    }

    #[test]
    fn a_file_with_data_or_a_fifo_leaves_the_tmpfs_to_criu() {
        let dir = tree();
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "rw").is_some());
        fs::write(dir.path().join("pts/data"), b"kept by CRIU").unwrap();
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "rw").is_none());
        fs::remove_file(dir.path().join("pts/data")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "rw").is_none());
    }

    #[test]
    fn a_read_only_filesystem_or_a_deep_path_is_left_to_criu() {
        let dir = tree();
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "rw,size=1m").is_some());
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "ro,size=1m").is_none());
        let mut deep = dir.path().join("pts");
        for _ in 0..(MAX_PATH_LEN / 100 + 1) {
            deep.push("d".repeat(99));
        }
        fs::create_dir_all(&deep).unwrap();
        assert!(FreshTmpfs::read("/dev/shm", dir.path(), "rw", "rw").is_none());
    }

    #[test]
    fn too_many_entries_leave_the_tmpfs_to_criu() {
        let dir = tempfile::tempdir().unwrap();
        for i in 1..MAX_ENTRIES {
            fs::create_dir(dir.path().join(i.to_string())).unwrap();
        }
        assert!(FreshTmpfs::read("/tmp", dir.path(), "rw", "rw").is_some());
        fs::create_dir(dir.path().join("one-more")).unwrap();
        assert!(FreshTmpfs::read("/tmp", dir.path(), "rw", "rw").is_none());
    }

    #[test]
    fn paths_with_parents_or_roots_are_refused() {
        let at = Path::new("/run/x");
        assert_eq!(join_relative(at, "a/b").unwrap(), Path::new("/run/x/a/b"));
        assert!(join_relative(at, "../etc").is_err());
        assert!(join_relative(at, "/etc").is_err());
        assert!(join_relative(at, "a/../../etc").is_err());
    }

    #[test]
    fn a_listing_is_made_again_on_a_new_tmpfs() {
        let dir = tree();
        fs::set_permissions(dir.path().join("pts"), fs::Permissions::from_mode(0o1777)).unwrap();
        let listed = FreshTmpfs::read("/dev", dir.path(), "rw,nodev", "rw,size=1m").unwrap();
        let at = tempfile::tempdir().unwrap();
        let target = at.path().join("fresh");
        listed.make(&target).unwrap();
        let again = FreshTmpfs::read("/dev", &target, "rw,nodev", "rw,size=1m").unwrap();
        unmount(&target);
        assert_eq!(again.entries, listed.entries);
        assert!(!target.exists(), "the host's directory is removed");
    }
}
