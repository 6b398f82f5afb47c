//! Unpacks one image layer (a tar stream, already decompressed) into an
//! empty directory that becomes an overlay lower layer. The tarball comes
//! from a registry, so it is hostile until proven otherwise:
//!
//! * every path is resolved with `openat2(RESOLVE_BENEATH)` from the layer's
//!   own directory: `..`, absolute names and symlinked parents cannot leave
//!   it, whatever order the entries come in;
//! * hard links must point at a file inside the same layer (opened the same
//!   way, then linked by descriptor);
//! * block and character devices are dropped (a sandbox may not own one);
//! * owners are shifted into the sandbox's host id range; ids past the range
//!   become the overflow id (65534), as the kernel shows unmapped ids;
//! * the bytes written are bounded by the caller (the disk left).
//!
//! OCI whiteouts become overlayfs's own: `.wh.NAME` a 0:0 character device
//! named NAME, `.wh..wh..opq` the `trusted.overlay.opaque` attribute on its
//! directory, so the kernel applies deletions when the layers are stacked.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, futimens, mkdirat, mknodat, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::image::shift::{ID_OFFSET, ID_RANGE};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// The id the kernel shows for ids a user namespace does not map.
const OVERFLOW_ID: u32 = 65_534;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {entry:?} points outside the layer; the image is malformed or hostile")]
    Escape { entry: String },
    #[error(
        "layer entry {entry:?} hard-links to {target:?}, which is not a file of the same layer"
    )]
    LinkOutside { entry: String, target: String },
    #[error("the layer unpacks to more than {limit} bytes, more than the disk has left for images; free space (POST /v1/images/prune) or pull a smaller image")]
    TooLarge { limit: u64 },
    #[error(
        "reading the layer's tar stream: {0}; the blob is not a (gzip-compressed) tar archive"
    )]
    Tar(#[source] io::Error),
    #[error("writing layer entry {entry:?}: {source}")]
    Write {
        entry: String,
        #[source]
        source: io::Error,
    },
}

/// What an unpack wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Device nodes left out.
    pub devices_dropped: u64,
}

/// Unpacks the tar stream `layer` into `dest` (an existing empty directory),
/// writing at most `max_bytes` of file content.
pub fn unpack_layer(
    layer: impl Read,
    dest: &Path,
    max_bytes: u64,
) -> Result<UnpackStats, UnpackError> {
    let root = File::open(dest).map_err(|source| UnpackError::Write {
        entry: dest.display().to_string(),
        source,
    })?;
    let mut unpacker = Unpacker {
        root: OwnedFd::from(root),
        stats: UnpackStats::default(),
        max_bytes,
    };
    let mut archive = tar::Archive::new(layer);
    for entry in archive.entries().map_err(UnpackError::Tar)? {
        let entry = entry.map_err(UnpackError::Tar)?;
        unpacker.entry(entry)?;
    }
    Ok(unpacker.stats)
}

struct Unpacker {
    root: OwnedFd,
    stats: UnpackStats,
    max_bytes: u64,
}

/// An entry's path split into its parent's components and its own name.
struct Place {
    parent: Vec<OsString>,
    name: Option<OsString>,
}

impl Unpacker {
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), UnpackError> {
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let place = split_path(&raw_path).ok_or_else(|| UnpackError::Escape {
            entry: shown.clone(),
        })?;
        let header = entry.header().clone();
        let kind = header.entry_type();
        let write_err = |source: io::Error| UnpackError::Write {
            entry: shown.clone(),
            source,
        };
        let errno = |e: nix::Error| io::Error::from(e);
        self.stats.entries += 1;

        let Some(name) = place.name else {
            // The layer's root itself ("./"): only its metadata applies.
            if kind.is_dir() {
                self.own_and_mode(self.root.as_raw_fd(), &header)
                    .map_err(write_err)?;
            }
            return Ok(());
        };
        let parent = self.open_dir(&place.parent, &shown)?;
        let pfd = parent.as_raw_fd();
        let name_bytes = name.as_bytes();

        if name_bytes == OPAQUE_MARKER {
            return set_opaque(pfd).map_err(write_err);
        }
        if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT_PREFIX) {
            let hidden = OsStr::from_bytes(hidden);
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(UnpackError::Escape { entry: shown });
            }
            remove_existing(pfd, hidden).map_err(write_err)?;
            mknodat(Some(pfd), hidden, SFlag::S_IFCHR, Mode::empty(), 0)
                .map_err(|e| write_err(errno(e)))?;
            return fchownat(
                Some(pfd),
                hidden,
                Some(Uid::from_raw(ID_OFFSET)),
                Some(Gid::from_raw(ID_OFFSET)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| write_err(errno(e)));
        }

        match kind {
            tar::EntryType::Directory => {
                match mkdirat(Some(pfd), name.as_os_str(), Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(nix::Error::EEXIST) => {}
                    Err(e) => return Err(write_err(errno(e))),
                }
                // A symlink already at this name is not followed.
                let dir = open_beneath(pfd, name.as_os_str(), OFlag::O_DIRECTORY, true)
                    .map_err(write_err)?;
                self.own_and_mode(dir.as_raw_fd(), &header)
                    .map_err(write_err)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_existing(pfd, &name).map_err(write_err)?;
                let how = OpenHow::new()
                    .flags(
                        OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_WRONLY
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                    )
                    .mode(Mode::from_bits_truncate(0o600))
                    .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
                let fd = openat2(pfd, name.as_os_str(), how).map_err(|e| write_err(errno(e)))?;
                // SAFETY: openat2 returned a new descriptor that nothing else owns.
                let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                let room = self.max_bytes.saturating_sub(self.stats.bytes);
                let copied = io::copy(&mut (&mut entry).take(room.saturating_add(1)), &mut file)
                    .map_err(write_err)?;
                if copied > room {
                    return Err(UnpackError::TooLarge {
                        limit: self.max_bytes,
                    });
                }
                self.stats.bytes += copied;
                self.own_and_mode(file.as_raw_fd(), &header)
                    .map_err(write_err)?;
                if let Ok(mtime) = header.mtime() {
                    let t = TimeSpec::new(mtime as i64, 0);
                    futimens(file.as_raw_fd(), &t, &t).map_err(|e| write_err(errno(e)))?;
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| write_err(io::Error::other("a symlink without a target")))?
                    .into_owned();
                remove_existing(pfd, &name).map_err(write_err)?;
                // The target is text: it is resolved inside the sandbox's
                // root at run time, never here.
                symlinkat(OsStr::from_bytes(&target), Some(pfd), name.as_os_str())
                    .map_err(|e| write_err(errno(e)))?;
                chown_entry(pfd, &name, &header).map_err(write_err)?;
                if let Ok(mtime) = header.mtime() {
                    let t = TimeSpec::new(mtime as i64, 0);
                    utimensat(
                        Some(pfd),
                        name.as_os_str(),
                        &t,
                        &t,
                        UtimensatFlags::NoFollowSymlink,
                    )
                    .map_err(|e| write_err(errno(e)))?;
                }
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| write_err(io::Error::other("a hard link without a target")))?
                    .into_owned();
                let outside = || UnpackError::LinkOutside {
                    entry: shown.clone(),
                    target: String::from_utf8_lossy(&target).into_owned(),
                };
                let target_place = split_path(&target).ok_or_else(outside)?;
                let mut rel: Vec<&OsStr> = target_place
                    .parent
                    .iter()
                    .map(OsString::as_os_str)
                    .collect();
                let Some(target_name) = target_place.name.as_deref() else {
                    return Err(outside());
                };
                rel.push(target_name);
                let rel = join(&rel);
                // O_PATH + no symlinks at all: the link names this layer's
                // own inode, never something a symlink leads to.
                let how = OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
                    .resolve(
                        ResolveFlag::RESOLVE_BENEATH
                            | ResolveFlag::RESOLVE_NO_SYMLINKS
                            | ResolveFlag::RESOLVE_NO_XDEV,
                    );
                let fd =
                    openat2(self.root.as_raw_fd(), rel.as_os_str(), how).map_err(|_| outside())?;
                // SAFETY: openat2 returned a new descriptor that nothing else owns.
                let source = unsafe { OwnedFd::from_raw_fd(fd) };
                remove_existing(pfd, &name).map_err(write_err)?;
                linkat(
                    Some(source.as_raw_fd()),
                    OsStr::new(""),
                    Some(pfd),
                    name.as_os_str(),
                    AtFlags::AT_EMPTY_PATH,
                )
                .map_err(|e| match e {
                    nix::Error::EPERM | nix::Error::EISDIR => outside(),
                    e => write_err(errno(e)),
                })?;
            }
            tar::EntryType::Fifo => {
                remove_existing(pfd, &name).map_err(write_err)?;
                mknodat(
                    Some(pfd),
                    name.as_os_str(),
                    SFlag::S_IFIFO,
                    Mode::from_bits_truncate(0o600),
                    0,
                )
                .map_err(|e| write_err(errno(e)))?;
                chown_entry(pfd, &name, &header).map_err(write_err)?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                self.stats.devices_dropped += 1;
            }
            // PAX and GNU long-name records are folded into the next entry
            // by the tar reader; anything else carries no file.
            _ => {}
        }
        Ok(())
    }

    /// Opens (making what is missing) the directory `components` below the
    /// layer's root, never leaving it.
    fn open_dir(&self, components: &[OsString], shown: &str) -> Result<OwnedFd, UnpackError> {
        let escape = || UnpackError::Escape {
            entry: shown.to_string(),
        };
        let mut dir = self.root.try_clone().map_err(|source| UnpackError::Write {
            entry: shown.to_string(),
            source,
        })?;
        for component in components {
            match open_beneath(dir.as_raw_fd(), component, OFlag::O_DIRECTORY, false) {
                Ok(next) => dir = next,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // Parents the tarball leaves out are made root-owned 0755,
                    // as other unpackers do.
                    match mkdirat(
                        Some(dir.as_raw_fd()),
                        component.as_os_str(),
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(nix::Error::EEXIST) => {}
                        Err(e) => {
                            return Err(UnpackError::Write {
                                entry: shown.to_string(),
                                source: e.into(),
                            })
                        }
                    }
                    let next = open_beneath(dir.as_raw_fd(), component, OFlag::O_DIRECTORY, true)
                        .map_err(|_| escape())?;
                    fchown(
                        next.as_raw_fd(),
                        Some(Uid::from_raw(ID_OFFSET)),
                        Some(Gid::from_raw(ID_OFFSET)),
                    )
                    .map_err(|e| UnpackError::Write {
                        entry: shown.to_string(),
                        source: e.into(),
                    })?;
                    dir = next;
                }
                // EXDEV: a symlink that resolves above the layer's root.
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Err(escape()),
                Err(source) => {
                    return Err(UnpackError::Write {
                        entry: shown.to_string(),
                        source,
                    })
                }
            }
        }
        // Each step resolved beneath the one before, so the chain never left
        // the root.
        Ok(dir)
    }

    fn own_and_mode(&self, fd: RawFd, header: &tar::Header) -> io::Result<()> {
        let (uid, gid) = shifted_owner(header);
        fchown(fd, Some(uid), Some(gid))?;
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        fchmod(fd, Mode::from_bits_truncate(mode))?;
        Ok(())
    }
}

/// Opens `path` below `dir` for metadata changes; with `no_symlinks`, a
/// symlink anywhere in it is an error rather than followed.
fn open_beneath(dir: RawFd, path: &OsStr, kind: OFlag, no_symlinks: bool) -> io::Result<OwnedFd> {
    let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if no_symlinks {
        resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
    }
    let flags = if kind.contains(OFlag::O_PATH) {
        kind | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
    } else {
        kind | OFlag::O_RDONLY | OFlag::O_CLOEXEC
    };
    let fd = openat2(dir, path, OpenHow::new().flags(flags).resolve(resolve))?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Splits a tar path into components, dropping `.` and empty ones; `None`
/// when any component is `..` (absolute names are taken as relative).
fn split_path(raw: &[u8]) -> Option<Place> {
    let mut parts: Vec<OsString> = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => parts.push(OsStr::from_bytes(p).to_os_string()),
        }
    }
    let name = parts.pop();
    Some(Place {
        parent: parts,
        name,
    })
}

fn join(parts: &[&OsStr]) -> OsString {
    let mut out = OsString::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push("/");
        }
        out.push(p);
    }
    out
}

/// Gives `name` in `dir` the entry's shifted owner, not following a symlink.
fn chown_entry(dir: RawFd, name: &OsStr, header: &tar::Header) -> io::Result<()> {
    let (uid, gid) = shifted_owner(header);
    fchownat(
        Some(dir),
        name,
        Some(uid),
        Some(gid),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(io::Error::from)
}

fn shifted_owner(header: &tar::Header) -> (Uid, Gid) {
    let shift = |id: u64| {
        let id = u32::try_from(id)
            .ok()
            .filter(|id| *id < ID_RANGE)
            .unwrap_or(OVERFLOW_ID);
        id + ID_OFFSET
    };
    (
        Uid::from_raw(shift(header.uid().unwrap_or(0))),
        Gid::from_raw(shift(header.gid().unwrap_or(0))),
    )
}

/// Removes whatever a previous entry of the same layer left at `name` (a
/// later entry replaces an earlier one); directories are kept.
fn remove_existing(dir: RawFd, name: &OsStr) -> io::Result<()> {
    match unlinkat(Some(dir), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(nix::Error::EISDIR) => match unlinkat(Some(dir), name, UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(
                io::Error::from(e).kind(),
                "a directory of the same layer is in the way",
            )),
        },
        Err(e) => Err(e.into()),
    }
}

fn set_opaque(dir: RawFd) -> io::Result<()> {
    const NAME: &[u8] = b"trusted.overlay.opaque\0";
    // SAFETY: the name is NUL-terminated, the value is one valid byte, and
    // `dir` is a descriptor this function borrows for the call.
    let rc = unsafe { libc::fsetxattr(dir, NAME.as_ptr().cast(), b"y".as_ptr().cast(), 1, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
