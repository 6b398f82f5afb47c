//! Path-based file operations (open, stat, list, mkdir, remove) on the sandbox's
//! own filesystem, with path checking and the mapping of their errors onto the
//! protocol. All calls block; callers run them on the blocking pool.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sandbox_proto::{AgentError, ErrorKind, FileKind, FileStat, MAX_FRAME};

use crate::errors::io_kind;
use crate::fds;

/// Bytes a listing may take in its reply, leaving room for the envelope.
const LISTING_BUDGET: usize = MAX_FRAME - 4096;

/// Per-entry encoded overhead on top of the name and link target (generous).
const ENTRY_OVERHEAD: usize = 48;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path must be absolute: {0:?}")]
    NotAbsolute(String),
    #[error("path contains a NUL byte: {0:?}")]
    Nul(String),
    #[error("path must not contain '..' here: {0:?}")]
    ParentComponent(String),
    #[error("refusing to remove the root directory")]
    RemoveRoot,
    #[error("mode {0:#o} has bits outside 0o7777")]
    BadMode(u32),
    #[error("{0}: not a regular file")]
    NotRegular(String),
    #[error("{0}: directory too large to list in one reply")]
    ListingTooLarge(String),
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("unknown file handle {0}")]
    UnknownHandle(u64),
    #[error("too many open file handles (limit {0})")]
    TooManyHandles(usize),
    #[error("handle {0} is not open for {1}")]
    WrongMode(u64, &'static str),
}

impl From<FileError> for AgentError {
    fn from(err: FileError) -> Self {
        let kind = match &err {
            FileError::Io { source, .. } => io_kind(source),
            FileError::NotRegular(_) => ErrorKind::InvalidInput,
            FileError::ListingTooLarge(_) => ErrorKind::Other,
            FileError::UnknownHandle(_) => ErrorKind::UnknownHandle,
            FileError::TooManyHandles(_) => ErrorKind::Other,
            FileError::NotAbsolute(_)
            | FileError::Nul(_)
            | FileError::ParentComponent(_)
            | FileError::RemoveRoot
            | FileError::BadMode(_)
            | FileError::WrongMode(..) => ErrorKind::InvalidInput,
        };
        AgentError::new(kind, err.to_string())
    }
}

fn io_error(path: &str) -> impl FnOnce(io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Checks a request path and rebuilds it from its components, which drops
/// trailing slashes and `.`: a trailing slash would make the kernel resolve
/// a final symlink that Stat and Remove must not follow.
pub fn checked(path: &str) -> Result<PathBuf, FileError> {
    if path.contains('\0') {
        return Err(FileError::Nul(path.to_owned()));
    }
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(FileError::NotAbsolute(path.to_owned()));
    }
    Ok(p.components().collect())
}

fn check_mode(mode: u32) -> Result<u32, FileError> {
    if mode & !0o7777 != 0 {
        return Err(FileError::BadMode(mode));
    }
    Ok(mode)
}

/// Creates or truncates a regular file and gives it exactly `mode` (umask aside).
pub fn open_write(path: &str, mode: u32) -> Result<File, FileError> {
    let p = checked(path)?;
    let mode = check_mode(mode)?;
    // O_NONBLOCK: a FIFO planted at the path fails (ENXIO) instead of hanging a thread.
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&p)
        .map_err(io_error(path))?;
    regular_only(path, &file)?;
    file.set_permissions(Permissions::from_mode(mode))
        .map_err(io_error(path))?;
    Ok(file)
}

/// Opens a regular file for reading; returns it with its size.
pub fn open_read(path: &str) -> Result<(File, u64), FileError> {
    let p = checked(path)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&p)
        .map_err(io_error(path))?;
    let size = regular_only(path, &file)?;
    Ok((file, size))
}

/// Refuses directories, FIFOs and devices (whose reads and writes can block
/// forever); clears O_NONBLOCK, which only mattered for the open.
fn regular_only(path: &str, file: &File) -> Result<u64, FileError> {
    let meta = file.metadata().map_err(io_error(path))?;
    if meta.is_dir() {
        return Err(FileError::Io {
            path: path.to_owned(),
            source: io::Error::from_raw_os_error(libc::EISDIR),
        });
    }
    if !meta.is_file() {
        return Err(FileError::NotRegular(path.to_owned()));
    }
    fds::set_nonblocking(file.as_raw_fd(), false).map_err(io_error(path))?;
    Ok(meta.len())
}

/// lstat: a final symlink is described, not followed.
pub fn stat(path: &str) -> Result<FileStat, FileError> {
    let p = checked(path)?;
    let meta = fs::symlink_metadata(&p).map_err(io_error(path))?;
    Ok(describe(path.to_owned(), &p, &meta))
}

fn describe(name: String, path: &Path, meta: &Metadata) -> FileStat {
    let file_type = meta.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let link_target = if file_type.is_symlink() {
        fs::read_link(path)
            .ok()
            .map(|target| target.to_string_lossy().into_owned())
    } else {
        None
    };
    FileStat {
        name,
        kind,
        size: meta.size(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_secs: meta.mtime(),
        link_target,
    }
}

/// Lists a directory sorted by name, each entry lstat'ed. Entries that vanish
/// while listing are skipped; a listing that would not fit one frame is refused.
pub fn list_dir(path: &str) -> Result<Vec<FileStat>, FileError> {
    let p = checked(path)?;
    let mut entries = Vec::new();
    let mut budget = LISTING_BUDGET;
    for entry in fs::read_dir(&p).map_err(io_error(path))? {
        let entry = entry.map_err(io_error(path))?;
        // DirEntry::metadata does not follow symlinks.
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(path)(e)),
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        let stat = describe(name, &entry.path(), &meta);
        let cost =
            ENTRY_OVERHEAD + stat.name.len() + stat.link_target.as_ref().map_or(0, String::len);
        budget = budget
            .checked_sub(cost)
            .ok_or_else(|| FileError::ListingTooLarge(path.to_owned()))?;
        entries.push(stat);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Creates a directory with exactly `mode`; with `parents`, missing ancestors
/// are created (default mode) and an existing directory is not an error.
pub fn mkdir(path: &str, parents: bool, mode: u32) -> Result<(), FileError> {
    let p = checked(path)?;
    let mode = check_mode(mode)?;
    if parents {
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).map_err(io_error(path))?;
        }
    }
    match DirBuilder::new().mode(mode).create(&p) {
        // The umask may have cleared bits the caller asked for.
        Ok(()) => fs::set_permissions(&p, Permissions::from_mode(mode)).map_err(io_error(path)),
        Err(e) if parents && e.kind() == io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(io_error(path)(e)),
    }
}

/// Removes a file, symlink (not its target) or directory. Recursive removal
/// never follows symlinks inside the tree (std's remove_dir_all works on
/// directory descriptors with O_NOFOLLOW).
pub fn remove(path: &str, recursive: bool) -> Result<(), FileError> {
    let p = checked(path)?;
    if Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(FileError::ParentComponent(path.to_owned()));
    }
    if p.parent().is_none() {
        return Err(FileError::RemoveRoot);
    }
    let meta = fs::symlink_metadata(&p).map_err(io_error(path))?;
    let result = if meta.is_dir() {
        if recursive {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_dir(&p)
        }
    } else {
        fs::remove_file(&p)
    };
    result.map_err(io_error(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(err: FileError) -> ErrorKind {
        AgentError::from(err).kind
    }

    #[test]
    fn paths_are_checked_and_normalised() {
        assert_eq!(checked("/a/b/").expect("ok"), PathBuf::from("/a/b"));
        assert_eq!(checked("/a/./b/.").expect("ok"), PathBuf::from("/a/b"));
        assert_eq!(
            kind(checked("a/b").expect_err("relative")),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(checked("/a\0b").expect_err("nul")),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn root_and_parent_components_are_not_removable() {
        assert!(matches!(remove("/", true), Err(FileError::RemoveRoot)));
        assert!(matches!(remove("//.", true), Err(FileError::RemoveRoot)));
        assert!(matches!(
            remove("/tmp/..", true),
            Err(FileError::ParentComponent(_))
        ));
    }

    #[test]
    fn remove_does_not_follow_a_symlink_with_trailing_slash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("keep"), b"x").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let with_slash = format!("{}/", link.display());
        remove(&with_slash, true).expect("remove link");
        assert!(fs::symlink_metadata(&link).is_err());
        assert!(target.join("keep").exists());
    }

    #[test]
    fn bad_modes_are_refused() {
        assert_eq!(
            kind(mkdir("/tmp/x", false, 0o10777).expect_err("mode")),
            ErrorKind::InvalidInput
        );
    }
}
