//! A microVM's copies of its pod containers' host volumes
//! (`RequestBody::WriteVolume`), and their binding into a container root
//! (`RequestBody::MountRoot::volumes`). The guest cannot see the host's
//! files (the VMM has no shared file system), so the host sends a volume's
//! tree and the agent keeps it on the scratch disk under its key, as Kata
//! does where it shares no file system. Roots that name the same key share
//! the one copy (a pod's emptyDir); what is written there stays in the
//! guest.
//!
//! Every step inside a copy, or inside a root, starts at a descriptor and
//! resolves no symlink out of it: a copy is writable by the containers it
//! is bound into, and a root holds its image's own links (`/var/run` to
//! `/run`), which resolve inside the root as for a process chrooted there.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};
use nix::unistd::{fchownat, symlinkat, Gid, Uid, UnlinkatFlags};
use sandbox_proto::{valid_root_name, valid_volume_path, GuestVolume, VolumeEntry};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(
        "{0:?} is not a volume key: use 1 to 128 of A-Z a-z 0-9 _ . - and do not start with a dot"
    )]
    BadKey(String),
    #[error("volume {key}: {path:?} is not a path inside a volume")]
    BadPath { key: String, path: String },
    #[error(
        "volume {0}: its copy is bound writable into a root, so what is there is the \
         guest's own; the host's changes no longer replace it"
    )]
    BoundWritable(String),
    #[error("volume {key}: {path:?}: {step}: {source}")]
    Io {
        key: String,
        path: String,
        step: &'static str,
        source: io::Error,
    },
}

impl VolumeError {
    /// Whether the caller can fix it: a bad destination, or an image with
    /// no place for the volume there.
    pub fn is_callers(&self) -> bool {
        match self {
            VolumeError::BadKey(_) | VolumeError::BoundWritable(_) => false,
            VolumeError::BadPath { .. } => true,
            VolumeError::Io { step, source, .. } => {
                matches!(*step, MOUNT_POINT | FINDING_MOUNT_POINT | ON_THE_WAY)
                    && matches!(
                        source.raw_os_error(),
                        Some(
                            libc::ENOTDIR
                                | libc::EISDIR
                                | libc::ELOOP
                                | libc::ENOENT
                                | libc::EEXIST
                                // Under a read-only volume bound before.
                                | libc::EROFS
                        )
                    )
            }
        }
    }
}

const MOUNT_POINT: &str = "making its mount point";
const FINDING_MOUNT_POINT: &str = "finding its mount point";
const ON_THE_WAY: &str = "opening a directory on the way";

impl From<VolumeError> for sandbox_proto::AgentError {
    fn from(e: VolumeError) -> Self {
        use sandbox_proto::ErrorKind;
        let kind = match &e {
            _ if e.is_callers() => ErrorKind::InvalidInput,
            // For good: the host stops following the volume.
            VolumeError::BoundWritable(_) => ErrorKind::PermissionDenied,
            // A full scratch disk is the sandbox's own limit.
            VolumeError::Io { source, .. }
                if crate::errors::io_kind(source) == ErrorKind::NoSpace =>
            {
                ErrorKind::NoSpace
            }
            _ => ErrorKind::Other,
        };
        sandbox_proto::AgentError::new(kind, e.to_string())
    }
}

/// Where the copy `key` lives.
pub fn volume_dir(key: &str) -> PathBuf {
    Path::new(crate::guest_roots::SCRATCH_AGAIN)
        .join("volumes")
        .join(key)
}

/// Writes `entries` into copy `key`, emptied first when `fresh`.
pub fn write(key: &str, fresh: bool, entries: &[VolumeEntry]) -> Result<(), VolumeError> {
    if !valid_root_name(key) {
        return Err(VolumeError::BadKey(key.to_owned()));
    }
    let _copies = copies_held();
    let volumes = volumes_dir(key)?;
    write_at(&volumes, key, fresh, entries)
}

/// One change of the copies at a time: the host's update of a copy
/// ([`crate::volume_replace`]) must not run beside a write of it, nor
/// beside the bind that makes it writable (which ends its updates).
static COPIES: Mutex<()> = Mutex::new(());

pub(crate) fn copies_held() -> std::sync::MutexGuard<'static, ()> {
    COPIES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The copies' directory on the scratch disk, held from its first use. A
/// microVM task lets go of the scratch disk's second mount once its
/// volumes are bound, as its processes would see it there
/// ([`bind_task_volumes`]); later updates of its copies work through this
/// descriptor, which keeps the detached mount reachable to the agent
/// alone, with no mount again where the task could see it.
static VOLUMES_DIR: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// [`VOLUMES_DIR`], mounting and making it on first use.
pub(crate) fn volumes_dir(key: &str) -> Result<OwnedFd, VolumeError> {
    let failed = |step: &'static str| {
        let key = key.to_owned();
        move |source: io::Error| VolumeError::Io {
            key,
            path: String::new(),
            step,
            source,
        }
    };
    let mut held = VOLUMES_DIR.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(dir) = held.as_ref() {
        return dir
            .try_clone()
            .map_err(failed("holding the volumes' directory"));
    }
    crate::guest_roots::mount_scratch_again()
        .map_err(failed("mounting the scratch disk for volumes"))?;
    let path = Path::new(crate::guest_roots::SCRATCH_AGAIN).join("volumes");
    fs::create_dir_all(&path).map_err(failed("making the volumes' directory"))?;
    let dir = open_dir(None, &path).map_err(failed("opening the volumes' directory"))?;
    let clone = dir
        .try_clone()
        .map_err(failed("holding the volumes' directory"))?;
    *held = Some(dir);
    Ok(clone)
}

/// Copies bound writable somewhere: what the guest writes there is its
/// own, so the host's updates ([`crate::volume_replace`]) are refused.
static BOUND_WRITABLE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Whether copy `key` is bound writable into a root.
pub(crate) fn bound_writable(key: &str) -> bool {
    BOUND_WRITABLE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(key)
}

/// Unmounts the scratch disk's second mount (the copies bound stay).
fn let_go_of_scratch() -> Result<(), VolumeError> {
    match nix::mount::umount2(
        crate::guest_roots::SCRATCH_AGAIN,
        nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
    ) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(VolumeError::Io {
            key: String::new(),
            path: crate::guest_roots::SCRATCH_AGAIN.into(),
            step: "letting go of the scratch disk's second mount",
            source: e.into(),
        }),
    }
}

/// [`write_at`] with the copies in directory `parent`.
#[cfg(test)]
pub(crate) fn write_in(
    parent: &Path,
    key: &str,
    fresh: bool,
    entries: &[VolumeEntry],
) -> Result<(), VolumeError> {
    let volumes = open_dir(None, parent).map_err(|source| VolumeError::Io {
        key: key.to_owned(),
        path: String::new(),
        step: "opening the volumes' directory",
        source,
    })?;
    write_at(&volumes, key, fresh, entries)
}

/// [`write`] with the copies in `volumes`.
pub(crate) fn write_at(
    volumes: &OwnedFd,
    key: &str,
    fresh: bool,
    entries: &[VolumeEntry],
) -> Result<(), VolumeError> {
    if !valid_root_name(key) {
        return Err(VolumeError::BadKey(key.to_owned()));
    }
    let failed = |path: &str, step: &'static str| {
        let (key, path) = (key.to_owned(), path.to_owned());
        move |source: io::Error| VolumeError::Io {
            key,
            path,
            step,
            source,
        }
    };
    if let Some(bad) = entries
        .iter()
        .map(VolumeEntry::path)
        .find(|p| !valid_volume_path(p))
    {
        return Err(VolumeError::BadPath {
            key: key.to_owned(),
            path: bad.to_owned(),
        });
    }
    if fresh {
        remove_at(volumes, key).map_err(failed("", "removing an earlier copy"))?;
    }
    for entry in entries {
        let path = entry.path();
        // The entry's parent, beneath the copy's top and through no link;
        // the top's own parent is the volumes' directory.
        let (dir, name) = match path.rsplit_once('/') {
            _ if path.is_empty() => (None, key),
            Some((dir, name)) => (Some(dir), name),
            None => (Some(""), path),
        };
        let parent = match dir {
            None => None,
            Some(dir) => Some(
                beneath(volumes, &format!("{key}/{dir}"), OFlag::O_DIRECTORY)
                    .map_err(failed(path, "opening its directory"))?,
            ),
        };
        let parent_fd = parent.as_ref().unwrap_or(volumes).as_raw_fd();
        write_entry(parent_fd, name, entry).map_err(failed(path, "writing it"))?;
    }
    Ok(())
}

/// Gives what `fd` holds owner `uid:gid` and `mode`; the owner first, as
/// a chown clears set-id bits the mode may give.
pub(crate) fn set_owner_and_mode(
    fd: &impl AsRawFd,
    mode: u32,
    uid: u32,
    gid: u32,
) -> io::Result<()> {
    nix::unistd::fchown(
        fd.as_raw_fd(),
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
    )?;
    nix::sys::stat::fchmod(fd.as_raw_fd(), mode_of(mode))?;
    Ok(())
}

fn write_entry(parent: i32, name: &str, entry: &VolumeEntry) -> io::Result<()> {
    match entry {
        VolumeEntry::Dir { mode, uid, gid, .. } => {
            match mkdirat(Some(parent), name, Mode::from_bits_truncate(0o700)) {
                Ok(()) => {}
                // Only where a copy gains entries (a fresh one starts
                // empty): what the guest has there is its own, a
                // directory a container made in a shared emptyDir, or a
                // file where the host has a subPath's directory.
                Err(nix::errno::Errno::EEXIST) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let dir = open_at(parent, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            set_owner_and_mode(&dir, *mode, *uid, *gid)?;
        }
        VolumeEntry::File {
            mode,
            uid,
            gid,
            data,
            ..
        } => {
            let mut file = fs::File::from(open_at(
                parent,
                name,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
            )?);
            file.write_all(data)?;
            set_owner_and_mode(&file, *mode, *uid, *gid)?;
        }
        VolumeEntry::Append { data, .. } => {
            let file = open_at(parent, name, OFlag::O_WRONLY | OFlag::O_APPEND)?;
            fs::File::from(file).write_all(data)?;
        }
        VolumeEntry::Symlink {
            target, uid, gid, ..
        } => {
            symlinkat(target.as_str(), Some(parent), name)?;
            fchownat(
                Some(parent),
                name,
                Some(Uid::from_raw(*uid)),
                Some(Gid::from_raw(*gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
        }
    }
    Ok(())
}

/// Removes `name` in `dir`, a directory with all beneath it; nothing
/// there is followed through a link.
pub(crate) fn remove_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    match nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(nix::errno::Errno::EISDIR) => {}
        Err(e) => return Err(e.into()),
    }
    let sub = open_listable(dir, name)?;
    for child in list(&sub)?.keys() {
        remove_at(&sub, child)?;
    }
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir)?;
    Ok(())
}

/// The names in `dir`, each with whether it is a directory (a link to
/// one is not). Names that are not UTF-8 were never the host's, and are
/// left alone.
pub(crate) fn list(dir: &OwnedFd) -> io::Result<BTreeMap<String, bool>> {
    let mut listing = nix::dir::Dir::from_fd(dir.try_clone()?.into_raw_fd())?;
    let mut names = BTreeMap::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let stat = nix::sys::stat::fstatat(
            Some(dir.as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        names.insert(name.to_owned(), is_dir);
    }
    Ok(names)
}

/// Directory `name` in `dir`, open for listing, through no symlink.
pub(crate) fn open_listable(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2_owned(dir.as_raw_fd(), Path::new(name), how)
}

fn mode_of(mode: u32) -> Mode {
    Mode::from_bits_truncate(mode & 0o7777)
}

/// `name` in directory `parent`, never through a link at the name.
fn open_at(parent: i32, name: &str, flags: OFlag) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        Some(parent),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn open_dir(parent: Option<&OwnedFd>, path: &Path) -> io::Result<OwnedFd> {
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC);
    openat2_owned(parent.map_or(libc::AT_FDCWD, |p| p.as_raw_fd()), path, how)
}

/// `path` beneath `dir`, through no symlink.
fn beneath(dir: &OwnedFd, path: &str, flags: OFlag) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2_owned(dir.as_raw_fd(), Path::new(path), how)
}

/// `path` in the tree `root` is the root of, its links resolved inside it.
fn in_root(root: &OwnedFd, path: &str, flags: OFlag) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2_owned(root.as_raw_fd(), Path::new(path), how)
}

pub(crate) fn openat2_owned(dirfd: i32, path: &Path, how: OpenHow) -> io::Result<OwnedFd> {
    let fd = openat2(dirfd, path, how)?;
    // SAFETY: openat2 just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn is_dir(fd: &OwnedFd) -> io::Result<bool> {
    Ok(SFlag::from_bits_truncate(fstat(fd.as_raw_fd())?.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}

/// Binds each copy `volume.key` at `volume.destination` inside `root` (a
/// container root no process runs in yet, or a microVM task's own root
/// before it is ready), `nodev` and `nosuid` always, read-only when asked.
/// Every copy is cloned, flags set, before the first is mounted: a volume
/// over the copies' own directory (`/run`, through the image's
/// `/var/run`) then hides none of the others. Missing directories on the
/// way are made (0755, root's); the last component as a directory or an
/// empty file, as the copy's top is.
pub fn bind_all(root: &Path, volumes: &[GuestVolume]) -> Result<(), VolumeError> {
    let clones = clone_all(volumes)?;
    place_all(root, volumes, clones)
}

/// Each copy, cloned and its flags set, and whether it is a directory.
fn clone_all(volumes: &[GuestVolume]) -> Result<Vec<(OwnedFd, bool)>, VolumeError> {
    let _copies = copies_held();
    volumes.iter().map(clone_copy).collect()
}

/// Mounts each clone at its volume's destination inside `root`.
fn place_all(
    root: &Path,
    volumes: &[GuestVolume],
    clones: Vec<(OwnedFd, bool)>,
) -> Result<(), VolumeError> {
    for (volume, (tree, is_dir)) in volumes.iter().zip(clones) {
        let point = mount_point(root, volume, is_dir)?;
        mountfd::attach_onto(tree.as_fd(), point.as_fd()).map_err(failed(volume, "mounting it"))?;
    }
    Ok(())
}

/// A microVM task's volumes, bound into the VM's own root. Its processes
/// run there, where the scratch disk's second mount would show them the
/// writable copies behind read-only volumes: that mount is let go once
/// they are bound (the binds keep their copies, and [`VOLUMES_DIR`] keeps
/// the copies' directory for the host's later updates). A task's VM has
/// no pod roots, which would need the mount.
pub fn bind_task_volumes(volumes: &[GuestVolume]) -> Result<(), VolumeError> {
    let clones = clone_all(volumes)?;
    // Held before letting go: later updates of the copies work through it.
    volumes_dir("")?;
    // Let go between the clones and their placing: nothing of the
    // caller's covers the path yet.
    let_go_of_scratch()?;
    place_all(Path::new("/"), volumes, clones)
}

fn failed(volume: &GuestVolume, step: &'static str) -> impl FnOnce(io::Error) -> VolumeError {
    let (key, path) = (volume.key.clone(), volume.destination.clone());
    move |source: io::Error| VolumeError::Io {
        key,
        path,
        step,
        source,
    }
}

/// A detached clone of copy `volume.key` with the volume's flags set, and
/// whether it is a directory.
fn clone_copy(volume: &GuestVolume) -> Result<(OwnedFd, bool), VolumeError> {
    if !valid_root_name(&volume.key) {
        return Err(VolumeError::BadKey(volume.key.clone()));
    }
    let tree = if volume.within.is_empty() {
        mountfd::clone_tree(mountfd::Source::Path(&volume_dir(&volume.key)), true)
    } else {
        // A part of the copy, which containers may write to: reached
        // beneath its top and through no link.
        if !valid_volume_path(&volume.within) {
            return Err(VolumeError::BadPath {
                key: volume.key.clone(),
                path: volume.within.clone(),
            });
        }
        open_dir(None, &volume_dir(&volume.key))
            .and_then(|copy| beneath(&copy, &volume.within, OFlag::empty()))
            .and_then(|part| mountfd::clone_tree(mountfd::Source::Held(part.as_fd()), true))
    }
    .map_err(failed(
        volume,
        "cloning the volume's copy (the host writes it first)",
    ))?;
    let mut attrs = libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOSUID;
    if volume.read_only {
        attrs |= libc::MOUNT_ATTR_RDONLY;
    }
    mountfd::set_attrs(tree.as_fd(), attrs, None, true)
        .map_err(failed(volume, "setting its flags"))?;
    if !volume.read_only {
        BOUND_WRITABLE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(volume.key.clone());
    }
    let is_dir = is_dir(&tree).map_err(failed(volume, "reading its copy"))?;
    Ok((tree, is_dir))
}

/// The mount point at `volume.destination` in the tree `root` is the root
/// of (its links resolved inside it), made where missing: a directory, or
/// an empty file when the copy's top is a file.
fn mount_point(
    root: &Path,
    volume: &GuestVolume,
    source_dir: bool,
) -> Result<OwnedFd, VolumeError> {
    let bad_path = || VolumeError::BadPath {
        key: volume.key.clone(),
        path: volume.destination.clone(),
    };
    let components: Vec<&str> = volume
        .destination
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if !volume.destination.starts_with('/') || components.is_empty() || components.contains(&"..") {
        return Err(bad_path());
    }
    let root_fd = open_dir(None, root).map_err(failed(volume, "opening the root"))?;
    let mut point = None;
    for (made, name) in components.iter().enumerate() {
        let last = made + 1 == components.len();
        let want_dir = !last || source_dir;
        let prefix = components[..=made].join("/");
        let found = match in_root(&root_fd, &prefix, OFlag::empty()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let parent = match made {
                    0 => ".".to_owned(),
                    _ => components[..made].join("/"),
                };
                let parent = in_root(&root_fd, &parent, OFlag::O_DIRECTORY)
                    .map_err(failed(volume, ON_THE_WAY))?;
                make(&parent, name, want_dir).map_err(failed(volume, MOUNT_POINT))?;
                in_root(&root_fd, &prefix, OFlag::empty())
            }
            found => found,
        }
        .map_err(failed(volume, FINDING_MOUNT_POINT))?;
        let found_dir = is_dir(&found).map_err(failed(volume, "reading its mount point"))?;
        if found_dir != want_dir {
            return Err(failed(volume, MOUNT_POINT)(io::Error::from_raw_os_error(
                if want_dir {
                    libc::ENOTDIR
                } else {
                    libc::EISDIR
                },
            )));
        }
        point = Some(found);
    }
    point.ok_or_else(bad_path)
}

fn make(parent: &OwnedFd, name: &str, dir: bool) -> io::Result<()> {
    if dir {
        mkdirat(
            Some(parent.as_raw_fd()),
            name,
            Mode::from_bits_truncate(0o755),
        )?;
    } else {
        open_at(
            parent.as_raw_fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn file(path: &str, mode: u32, data: &[u8]) -> VolumeEntry {
        VolumeEntry::File {
            path: path.into(),
            mode,
            uid: 0,
            gid: 0,
            data: data.to_vec(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("guest-volumes-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn a_projected_volume_is_copied_with_its_links_modes_and_large_files() {
        let dir = scratch("projected");
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let entries = vec![
            VolumeEntry::Dir {
                path: String::new(),
                mode: 0o1777,
                uid,
                gid,
            },
            VolumeEntry::Dir {
                path: "..2026_12_06".into(),
                mode: 0o755,
                uid,
                gid,
            },
            file("..2026_12_06/token", 0o640, b"abc"),
            VolumeEntry::Append {
                path: "..2026_12_06/token".into(),
                data: b"def".to_vec(),
            },
            VolumeEntry::Symlink {
                path: "..data".into(),
                target: "..2026_12_06".into(),
                uid,
                gid,
            },
            VolumeEntry::Symlink {
                path: "token".into(),
                target: "..data/token".into(),
                uid,
                gid,
            },
        ];
        write_in(&dir, "vol-1", true, &entries).expect("written");
        let top = dir.join("vol-1");
        assert_eq!(fs::read(top.join("token")).expect("token"), b"abcdef");
        let meta = fs::metadata(top.join("..2026_12_06/token")).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(meta.uid(), uid);
        assert_eq!(
            fs::metadata(&top).expect("top").permissions().mode() & 0o7777,
            0o1777
        );
        assert_eq!(
            fs::read_link(top.join("..data")).expect("link"),
            Path::new("..2026_12_06")
        );
        // Written afresh, nothing of the last copy stays.
        write_in(&dir, "vol-1", true, &[file("", 0o644, b"one file")]).expect("rewritten");
        assert_eq!(fs::read(&top).expect("file"), b"one file");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_never_reaches_through_a_link_in_the_copy() {
        let dir = scratch("links");
        let outside = dir.join("outside");
        fs::create_dir_all(&outside).expect("outside");
        let uid = nix::unistd::getuid().as_raw();
        let entries = vec![
            VolumeEntry::Dir {
                path: String::new(),
                mode: 0o755,
                uid,
                gid: uid,
            },
            // What a container could plant in a writable copy.
            VolumeEntry::Symlink {
                path: "escape".into(),
                target: outside.display().to_string(),
                uid,
                gid: uid,
            },
        ];
        write_in(&dir, "vol-2", true, &entries).expect("written");
        let through = write_in(&dir, "vol-2", false, &[file("escape/planted", 0o644, b"x")]);
        assert!(
            matches!(
                through,
                Err(VolumeError::Io {
                    step: "opening its directory",
                    ..
                })
            ),
            "{through:?}"
        );
        let onto = write_in(&dir, "vol-2", false, &[file("escape", 0o644, b"x")]);
        assert!(
            onto.is_err(),
            "a file was written through the link: {onto:?}"
        );
        assert_eq!(fs::read_dir(&outside).expect("outside").count(), 0);
        // The positive control: a plain name beside it is written.
        write_in(&dir, "vol-2", false, &[file("plain", 0o644, b"x")]).expect("plain");
        assert_eq!(fs::read(dir.join("vol-2/plain")).expect("plain"), b"x");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn entries_added_to_a_copy_leave_what_the_guest_made_there() {
        let dir = scratch("added");
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let folder = |path: &str| VolumeEntry::Dir {
            path: path.into(),
            mode: 0o777,
            uid,
            gid,
        };
        write_in(&dir, "vol-4", true, &[folder(""), folder("data")]).expect("copied");
        // The guest's own since: a private directory, and a file where
        // the host has a subPath's directory.
        let top = dir.join("vol-4");
        fs::set_permissions(top.join("data"), fs::Permissions::from_mode(0o700)).expect("chmod");
        fs::write(top.join("config.yaml"), "mine").expect("file");
        let added = [folder("data"), folder("config.yaml"), folder("new")];
        write_in(&dir, "vol-4", false, &added).expect("added");
        let mode = |name: &str| {
            fs::metadata(top.join(name))
                .expect("meta")
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("data"), 0o700);
        assert_eq!(
            fs::read_to_string(top.join("config.yaml")).expect("file"),
            "mine"
        );
        // The positive control: what was missing is made as the host has it.
        assert!(top.join("new").is_dir());
        assert_eq!(mode("new"), 0o777);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_and_paths_are_checked_before_anything_is_written() {
        let dir = scratch("checks");
        assert!(matches!(
            write_in(&dir, "../x", true, &[]),
            Err(VolumeError::BadKey(_))
        ));
        assert!(matches!(
            write_in(&dir, "vol-3", true, &[file("../x", 0o644, b"")]),
            Err(VolumeError::BadPath { .. })
        ));
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 0);
        let _ = fs::remove_dir_all(&dir);
    }
}
