//! Path operations done as host root inside a tree that a sandbox's own
//! root can change (its mount namespace, seen from the supervisor): every
//! lookup starts at a directory descriptor and follows no symlink
//! (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), and mounts go
//! onto the descriptor that was looked up (`move_mount` with
//! `MOVE_MOUNT_T_EMPTY_PATH`). A name swapped for a symlink in between
//! fails the step (ELOOP) instead of leading somewhere else.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, FileStat, Mode, SFlag};

/// A directory held open (`O_PATH`) for lookups beneath it.
pub struct Dir(OwnedFd);

impl Dir {
    /// The root of the calling thread's mount namespace.
    pub fn root() -> io::Result<Dir> {
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC);
        open(libc::AT_FDCWD, "/", how).map(Dir)
    }

    /// The host directory at `path`, which the caller trusts: symlinks on
    /// the way to it are followed (a run dir under `/var/run`), those
    /// beneath it never.
    pub fn at(path: &std::path::Path) -> io::Result<Dir> {
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC);
        let path = path.to_str().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "a path that is not UTF-8")
        })?;
        open(libc::AT_FDCWD, path, how).map(Dir)
    }

    /// The directory at `path` (relative, any number of components)
    /// beneath this one, through no symlink.
    pub fn open(&self, path: &str) -> io::Result<Dir> {
        // No O_NOFOLLOW: with it a trailing symlink would be opened
        // itself; without it RESOLVE_NO_SYMLINKS refuses it (ELOOP).
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        open(self.0.as_raw_fd(), path, how).map(Dir)
    }

    /// Makes directory `name` here (owned by the caller, `mode`); false
    /// when something of that name is already there.
    pub fn make(&self, name: &str, mode: u32) -> io::Result<bool> {
        match mkdirat(
            Some(self.0.as_raw_fd()),
            name,
            Mode::from_bits_truncate(mode),
        ) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EEXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Directory `path` (relative) beneath this one, each missing
    /// component made with `mode` on the way.
    pub fn make_all(&self, path: &str, mode: u32) -> io::Result<Dir> {
        let mut dir = self.open(".")?;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            dir.make(name, mode)?;
            dir = dir.open(name)?;
        }
        Ok(dir)
    }

    /// The mount point at `path` in the tree this directory is the root
    /// of, held `O_PATH`: symlinks on the way resolve inside the tree
    /// (`RESOLVE_IN_ROOT`), as for a process chrooted here, never out of
    /// it. Missing components are made (directories 0755, a last `File`
    /// empty 0644), owned by `owner`; an existing last component of the
    /// other kind is an error, and so is the root of a mount (this tree's
    /// own root, or a volume bound before): a mount there would cover it.
    pub fn mount_point_in_root(
        &self,
        path: &str,
        kind: MountPointKind,
        owner: u32,
    ) -> io::Result<OwnedFd> {
        let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        if components.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the root itself is no mount point",
            ));
        }
        let in_root = |path: &str, flags: OFlag| {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            open(self.0.as_raw_fd(), path, how)
        };
        // The first `made` components, made (as `kind`) if missing.
        let ensure = |made: usize, kind: MountPointKind| -> io::Result<OwnedFd> {
            let prefix = components[..made].join("/");
            match in_root(&prefix, OFlag::empty()) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                found => return found,
            }
            let parent = match made {
                1 => ".".to_string(),
                _ => components[..made - 1].join("/"),
            };
            let parent = in_root(&parent, OFlag::O_DIRECTORY)?;
            let name = components[made - 1];
            match create(&parent, name, kind) {
                Ok(()) => nix::unistd::fchownat(
                    Some(parent.as_raw_fd()),
                    name,
                    Some(nix::unistd::Uid::from_raw(owner)),
                    Some(nix::unistd::Gid::from_raw(owner)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?,
                // Inside an idmapped volume, where host root has no id:
                // made as `owner`, whom the volume's map shows as its root
                // (so it owns it already).
                Err(e) if e.raw_os_error() == Some(libc::EOVERFLOW) => {
                    as_owner(owner, || create(&parent, name, kind))?
                }
                // Nothing at the name resolved, yet something is there:
                // a symlink that leads nowhere.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(io::Error::other(format!(
                        "{} is a symlink to nothing in the image",
                        components[..made].join("/")
                    )))
                }
                Err(e) => return Err(e),
            }
            in_root(&prefix, OFlag::empty())
        };
        for made in 1..components.len() {
            of_kind(
                ensure(made, MountPointKind::Directory)?,
                MountPointKind::Directory,
            )?;
        }
        let point = of_kind(ensure(components.len(), kind)?, kind)?;
        if is_mount_root(&point)? || same_file(&point, &self.0)? {
            return Err(io::Error::other(format!(
                "{path} resolves to the root of a mount (the container's root itself, or another volume)"
            )));
        }
        Ok(point)
    }

    /// Regular file `path` (relative) beneath this one, through no
    /// symlink, held `O_PATH`; `None` when it is not there or is
    /// something else (a symlink too).
    pub fn regular_file(&self, path: &str) -> io::Result<Option<OwnedFd>> {
        Ok(self
            .entry(path)?
            .and_then(|(file, stat)| is_regular(&stat).then_some(file)))
    }

    /// Whatever is at `path` (relative) beneath this one, through no
    /// symlink (a trailing one is held itself), held `O_PATH`, with its
    /// status; `None` when nothing is there.
    pub fn entry(&self, path: &str) -> io::Result<Option<(OwnedFd, FileStat)>> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let file = match open(self.0.as_raw_fd(), path, how) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let stat = fstat(file.as_raw_fd())?;
        Ok(Some((file, stat)))
    }

    /// Replaces the contents of regular file `path` (relative) beneath this
    /// one with `bytes`, keeping its owner and mode; false, with nothing
    /// written, when there is no regular file there reached through no
    /// symlink, or it cannot be opened for writing (the caller then writes
    /// it some other way).
    pub fn overwrite_regular_file(&self, path: &str, bytes: &[u8]) -> io::Result<bool> {
        // Truncated by the open itself: an overlay then copies the lower
        // file up without its data (a 220 KB trust bundle: 0.1-0.2 ms to
        // open, against 0.6-1.0 ms opened for writing and then truncated).
        let options = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .clone();
        let Some(mut file) = self.writable_regular_file(path, &options)? else {
            return Ok(false);
        };
        io::Write::write_all(&mut file, bytes)?;
        Ok(true)
    }

    /// Copies regular file `path` (relative) beneath an overlay's root up
    /// into its upper layer, contents unchanged, and returns it open for
    /// appending, so that a later [`append_if_length`] writes only what it
    /// appends; `None`, with nothing done, where that would write nothing.
    pub fn copy_up_for_append(&self, path: &str) -> io::Result<Option<std::fs::File>> {
        let options = std::fs::OpenOptions::new().append(true).clone();
        self.writable_regular_file(path, &options)
    }

    /// Regular file `path` (relative) beneath this one, through no
    /// symlink, opened with `options` (which write); `None` when there is
    /// none, or it refuses writing.
    fn writable_regular_file(
        &self,
        path: &str,
        options: &std::fs::OpenOptions,
    ) -> io::Result<Option<std::fs::File>> {
        let file = match self.regular_file(path) {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        match reopen(&file, options) {
            Ok(file) => Ok(Some(file)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The contents of regular file `path` (relative) beneath this one,
    /// reached through no symlink; `None` when nothing is there. Anything
    /// else there (a symlink on the way, a FIFO, a file over `max` bytes)
    /// is an error, and nothing but a regular file is ever opened.
    pub fn read_regular_file(&self, path: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        let Some((file, stat)) = self.entry(path)? else {
            return Ok(None);
        };
        if !is_regular(&stat) {
            return Err(io::Error::other(format!("{path} is not a regular file")));
        }
        if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > max {
            return Err(io::Error::other(format!("{path} is over {max} bytes")));
        }
        let file = reopen(&file, std::fs::OpenOptions::new().read(true))?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut io::Read::take(file, max), &mut bytes)?;
        Ok(Some(bytes))
    }
}

/// Makes `name` in `parent` as `kind` (a directory 0755, an empty file
/// 0644), never through a symlink.
fn create(parent: &OwnedFd, name: &str, kind: MountPointKind) -> io::Result<()> {
    match kind {
        MountPointKind::File => {
            let file = nix::fcntl::openat(
                Some(parent.as_raw_fd()),
                name,
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )?;
            // SAFETY: openat just returned this descriptor; nothing else
            // owns it, and it is closed here.
            drop(unsafe { OwnedFd::from_raw_fd(file) });
        }
        MountPointKind::Directory => mkdirat(
            Some(parent.as_raw_fd()),
            name,
            Mode::from_bits_truncate(0o755),
        )?,
    }
    Ok(())
}

/// Runs `work` on a thread of its own whose filesystem ids are `owner`
/// (setfsuid and setfsgid are per thread; the caller's stay root's).
fn as_owner(owner: u32, work: impl FnOnce() -> io::Result<()> + Send) -> io::Result<()> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setfsgid(2) and setfsuid(2) change only this
                // thread's filesystem ids, which end with it.
                unsafe {
                    libc::setfsgid(owner);
                    libc::setfsuid(owner);
                }
                work()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the thread making a mount point panicked")))
    })
}

/// Whether `file` is the root of a mount (`STATX_ATTR_MOUNT_ROOT`; false
/// where the kernel does not say).
fn is_mount_root(file: &OwnedFd) -> io::Result<bool> {
    // SAFETY: all-zero bytes are a valid `statx` (integers only).
    let mut stat: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx(2) of the descriptor itself (empty path, AT_EMPTY_PATH)
    // into a struct this function owns.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
            &mut stat,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mount_root = u64::try_from(libc::STATX_ATTR_MOUNT_ROOT).unwrap_or_default();
    Ok(stat.stx_attributes_mask & mount_root != 0 && stat.stx_attributes & mount_root != 0)
}

/// Whether two descriptors hold the same file.
fn same_file(a: &OwnedFd, b: &OwnedFd) -> io::Result<bool> {
    let (a, b) = (fstat(a.as_raw_fd())?, fstat(b.as_raw_fd())?);
    Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
}

/// What a mount point is: a directory for a directory bound there, a
/// file for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountPointKind {
    Directory,
    File,
}

/// `found` if it is a mount point of `kind`: a directory, or anything
/// but one.
fn of_kind(found: OwnedFd, kind: MountPointKind) -> io::Result<OwnedFd> {
    let is_dir = SFlag::from_bits_truncate(fstat(found.as_raw_fd())?.st_mode) & SFlag::S_IFMT
        == SFlag::S_IFDIR;
    match (kind, is_dir) {
        (MountPointKind::Directory, false) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        (MountPointKind::File, true) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
        _ => Ok(found),
    }
}

fn is_regular(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
}

/// Opens the very file an `O_PATH` descriptor holds, with `options`.
fn reopen(file: &OwnedFd, options: &std::fs::OpenOptions) -> io::Result<std::fs::File> {
    options.open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

fn open(dirfd: i32, path: &str, how: OpenHow) -> io::Result<OwnedFd> {
    let fd = openat2(dirfd, path, how)?;
    // SAFETY: openat2 just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Appends `tail` to `file` (open for appending) when it is
/// `expected_len` bytes long and still has a name; false, with nothing
/// written, when it is another length or was unlinked (replaced by a file
/// renamed over it, as `update-ca-certificates` does: the append would
/// reach nobody). The length is checked, then the tail written: only for
/// a file nothing else writes meanwhile (a root no code has run in yet).
pub fn append_if_length(file: &std::fs::File, expected_len: u64, tail: &[u8]) -> io::Result<bool> {
    if !has_length_and_name(file, expected_len)? {
        return Ok(false);
    }
    io::Write::write_all(&mut &*file, tail)?;
    Ok(true)
}

/// Whether `file` is `expected_len` bytes long and still has a name: what
/// [`append_if_length`] checks before it writes.
pub fn has_length_and_name(file: &std::fs::File, expected_len: u64) -> io::Result<bool> {
    let meta = file.metadata()?;
    Ok(meta.len() == expected_len && std::os::unix::fs::MetadataExt::nlink(&meta) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn lookups_follow_no_symlink_and_stay_beneath() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        std::fs::write(tmp.path().join("real/file"), "x").unwrap();
        std::os::unix::fs::symlink("file", tmp.path().join("real/file-link")).unwrap();
        let top = Dir::root()
            .unwrap()
            .open(tmp.path().to_str().unwrap().trim_start_matches('/'))
            .unwrap();

        // Positive control: real names resolve, and make_all makes them.
        assert!(top.open("real").is_ok());
        assert!(top.regular_file("real/file").unwrap().is_some());
        top.make_all("real/a/b", 0o755).unwrap();
        assert!(tmp.path().join("real/a/b").is_dir());

        let looped = |r: io::Result<Dir>| r.err().and_then(|e| e.raw_os_error());
        assert_eq!(looped(top.open("link")), Some(libc::ELOOP));
        assert_eq!(looped(top.make_all("link/made", 0o755)), Some(libc::ELOOP));
        assert_eq!(looped(top.open("../")), Some(libc::EXDEV));
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
        assert!(
            top.regular_file("real/file-link").unwrap().is_none(),
            "a symlink"
        );
        assert!(top.regular_file("real/missing").unwrap().is_none());
        assert!(top.regular_file("real/a").unwrap().is_none(), "a directory");
    }

    #[test]
    fn mount_points_resolve_symlinks_inside_the_tree_and_are_made_there() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("run")).unwrap();
        std::fs::create_dir(root.join("var")).unwrap();
        std::fs::create_dir(root.join("etc")).unwrap();
        // An image's /var/run, and links that point out of the tree.
        std::os::unix::fs::symlink("/run", root.join("var/run")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.join("up")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("host-etc")).unwrap();
        std::fs::create_dir(root.join("dir")).unwrap();
        let top = Dir::at(root).unwrap();
        let owner = nix::unistd::geteuid().as_raw();

        let secrets = top
            .mount_point_in_root("/var/run/secrets/token", MountPointKind::Directory, owner)
            .unwrap();
        assert!(root.join("run/secrets/token").is_dir());
        assert_eq!(
            std::fs::read_link(format!("/proc/self/fd/{}", secrets.as_raw_fd())).unwrap(),
            root.join("run/secrets/token")
        );
        top.mount_point_in_root("/up/made", MountPointKind::File, owner)
            .unwrap();
        assert!(root.join("made").is_file(), "clamped at the tree's root");
        // A link to the tree's root is no place for a mount: it would
        // cover the whole tree.
        let covering = top
            .mount_point_in_root("/up", MountPointKind::Directory, owner)
            .unwrap_err()
            .to_string();
        assert!(covering.contains("root of a mount"), "{covering}");
        std::os::unix::fs::symlink("/nowhere", root.join("dangling")).unwrap();
        let dangling = top
            .mount_point_in_root("/dangling/x", MountPointKind::Directory, owner)
            .unwrap_err()
            .to_string();
        assert!(
            dangling.contains("dangling is a symlink to nothing"),
            "{dangling}"
        );
        top.mount_point_in_root("/host-etc/sandboxd-made", MountPointKind::File, owner)
            .unwrap();
        assert!(root.join("etc/sandboxd-made").is_file());
        assert!(!Path::new("/etc/sandboxd-made").exists());

        // Found as it is, when it is of the kind asked for.
        assert!(top
            .mount_point_in_root("dir", MountPointKind::Directory, owner)
            .is_ok());
        let error = |path: &str, kind| {
            top.mount_point_in_root(path, kind, owner)
                .err()
                .and_then(|e| e.raw_os_error())
        };
        assert_eq!(error("dir", MountPointKind::File), Some(libc::EISDIR));
        assert_eq!(
            error("made/below", MountPointKind::Directory),
            Some(libc::ENOTDIR)
        );
        assert!(top
            .mount_point_in_root("/", MountPointKind::Directory, owner)
            .is_err());
    }

    #[test]
    fn a_file_is_overwritten_only_when_reached_through_no_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("bundle"), "host's").unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("bundle"), tmp.path().join("file-link"))
            .unwrap();
        std::fs::write(tmp.path().join("bundle"), "a longer old text").unwrap();
        std::fs::create_dir(tmp.path().join("dir")).unwrap();
        nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        let top = Dir::at(tmp.path()).unwrap();

        // Positive control: the plain file takes the new bytes, all of them.
        assert!(top.overwrite_regular_file("bundle", b"new").unwrap());
        assert_eq!(std::fs::read(tmp.path().join("bundle")).unwrap(), b"new");

        for refused in ["link/bundle", "file-link", "missing", "fifo", "dir"] {
            assert!(
                !top.overwrite_regular_file(refused, b"x").unwrap(),
                "{refused}"
            );
        }
        assert_eq!(
            top.read_regular_file("bundle", 16).unwrap(),
            Some(b"new".to_vec())
        );
        assert_eq!(top.read_regular_file("missing", 16).unwrap(), None);
        for refused in ["link/bundle", "file-link", "fifo", "dir"] {
            assert!(top.read_regular_file(refused, 16).is_err(), "{refused}");
        }
        assert!(
            top.read_regular_file("bundle", 2).is_err(),
            "over the bound"
        );
        assert_eq!(
            std::fs::read(outside.path().join("bundle")).unwrap(),
            b"host's",
            "nothing outside was written"
        );
    }

    /// Copied up ahead, an overlay's file takes an append without its
    /// data being copied again; an append finds the length it expects or
    /// writes nothing.
    #[test]
    fn an_overlay_file_copied_up_ahead_takes_an_append() {
        sandboxd_test_support::require_root!("needs root (an overlay mount)");
        // Not /tmp: an upper layer cannot be on an overlay itself.
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let [lower, upper, work, merged] =
            ["lower", "upper", "work", "merged"].map(|d| tmp.path().join(d));
        for dir in [&lower, &upper, &work, &merged] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::create_dir(lower.join("certs")).unwrap();
        std::fs::write(lower.join("certs/bundle"), "roots\n").unwrap();
        std::os::unix::fs::symlink("bundle", lower.join("certs/link")).unwrap();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .unwrap();
        /// Unmounts the overlay however the test ends.
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let unmount = Unmount(&merged);
        let top = Dir::at(&merged).unwrap();

        assert!(!upper.join("certs/bundle").exists());
        let copied = top
            .copy_up_for_append("certs/bundle")
            .unwrap()
            .expect("a regular file to copy up");
        assert_eq!(
            std::fs::read(upper.join("certs/bundle")).unwrap(),
            b"roots\n"
        );
        assert!(top.copy_up_for_append("certs/link").unwrap().is_none());
        assert!(top.copy_up_for_append("certs/missing").unwrap().is_none());

        // Another length than the one expected: nothing written.
        assert!(!append_if_length(&copied, 5, b"CA\n").unwrap());
        assert_eq!(
            std::fs::read(merged.join("certs/bundle")).unwrap(),
            b"roots\n"
        );
        // Replaced by a file renamed over it: the held one has no name.
        let replaced = tmp.path().join("replaced");
        std::fs::write(&replaced, b"roots\n").unwrap();
        let held = std::fs::OpenOptions::new()
            .append(true)
            .open(&replaced)
            .unwrap();
        std::fs::remove_file(&replaced).unwrap();
        assert!(!append_if_length(&held, 6, b"CA\n").unwrap());
        assert!(append_if_length(&copied, 6, b"CA\n").unwrap());
        assert_eq!(
            std::fs::read(merged.join("certs/bundle")).unwrap(),
            b"roots\nCA\n"
        );
        assert_eq!(
            std::fs::read(lower.join("certs/bundle")).unwrap(),
            b"roots\n"
        );
        drop(unmount);
    }
}
