//! A host volume of a microVM pod's container, read into the entries its
//! agent writes into the guest (`RequestBody::WriteVolume`): the guest
//! cannot see the host's files, so a volume is copied in at attach, as Kata
//! does without a shared file system. Fit for what the kubelet hands a pod
//! (a service account's token, a ConfigMap, a Secret, an empty emptyDir):
//! files, directories and symlinks (copied as links, never followed), up
//! to [`MAX_VOLUME_BYTES`] and [`MAX_VOLUME_ENTRIES`] each. A read can
//! have every directory it reads watched ([`read_batches_watching`]), so
//! that a read-only volume follows the host's later changes (the
//! supervisor's `volume_copies`); what the guest writes never reaches the
//! host.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, Mode, SFlag};

use sandbox_proto::VolumeEntry;

use crate::model::HostVolume;

/// The most file bytes one volume may copy into a guest: a Kubernetes
/// ConfigMap or Secret holds 1 MiB at most.
pub const MAX_VOLUME_BYTES: u64 = 16 << 20;
/// The most files, directories and links one volume may copy.
pub const MAX_VOLUME_ENTRIES: usize = 4096;
/// File bytes per `WriteVolume` request, well within a frame.
const BATCH_BYTES: usize = 512 << 10;
/// What an entry costs in a request beyond its data (path, ids, framing).
const ENTRY_OVERHEAD: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum GuestVolumeError {
    #[error("volume {destination} (from {source_path}): reading {path}: {source}")]
    Read {
        destination: String,
        source_path: String,
        path: String,
        source: io::Error,
    },
    #[error(
        "volume {destination} (from {source_path}): {path} is {what}; a microVM's volume is \
         copied into its guest and may hold only files, directories and symlinks with UTF-8 names"
    )]
    Unsupported {
        destination: String,
        source_path: String,
        path: String,
        what: &'static str,
    },
    #[error(
        "volume {destination} (from {source_path}) is too large to copy into a microVM: it \
         may hold {MAX_VOLUME_BYTES} bytes in {MAX_VOLUME_ENTRIES} files, directories and links"
    )]
    TooLarge {
        destination: String,
        source_path: String,
    },
}

impl GuestVolumeError {
    /// Whether the caller can fix it (the volume), not the host.
    pub fn is_callers(&self) -> bool {
        match self {
            GuestVolumeError::Unsupported { .. } | GuestVolumeError::TooLarge { .. } => true,
            GuestVolumeError::Read { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EACCES)
            ),
        }
    }
}

/// `volume`'s tree as requests' worth of entries, parents first.
pub fn read_batches(volume: &HostVolume) -> Result<Vec<Vec<VolumeEntry>>, GuestVolumeError> {
    read(volume, None)
}

/// [`read_batches`], handing `watch` each directory before its listing
/// (as a `/proc/self/fd` path to the very directory read), so that a
/// change after it was read can be heard. A directory `watch` fails on
/// (the host's `max_user_watches` reached) is counted in
/// [`WatchedRead::unwatched`], not an error: the copy is good, it follows
/// the host less.
pub fn read_batches_watching(
    volume: &HostVolume,
    watch: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<WatchedRead, GuestVolumeError> {
    let mut unwatched = 0;
    let batches = read(
        volume,
        Some(&mut Watching {
            watch,
            unwatched: &mut unwatched,
        }),
    )?;
    Ok(WatchedRead { batches, unwatched })
}

/// A read of [`read_batches_watching`].
pub struct WatchedRead {
    pub batches: Vec<Vec<VolumeEntry>>,
    /// Directories that could not be watched.
    pub unwatched: usize,
}

struct Watching<'w> {
    watch: &'w mut dyn FnMut(&str) -> io::Result<()>,
    unwatched: &'w mut usize,
}

fn read(
    volume: &HostVolume,
    watching: Option<&mut Watching<'_>>,
) -> Result<Vec<Vec<VolumeEntry>>, GuestVolumeError> {
    let mut reader = Reader {
        volume,
        watching,
        batches: Vec::new(),
        batch: Vec::new(),
        batch_bytes: 0,
        entries: 0,
        bytes: 0,
    };
    let top = open_path(libc::AT_FDCWD, &volume.source).map_err(reader.read_error(""))?;
    reader.visit(top, None, String::new(), 0)?;
    if !reader.batch.is_empty() {
        reader.batches.push(std::mem::take(&mut reader.batch));
    }
    Ok(reader.batches)
}

struct Reader<'a, 'w> {
    volume: &'a HostVolume,
    watching: Option<&'a mut Watching<'w>>,
    batches: Vec<Vec<VolumeEntry>>,
    batch: Vec<VolumeEntry>,
    batch_bytes: usize,
    entries: usize,
    bytes: u64,
}

/// How deep a volume's directories may nest: each level holds a
/// descriptor while the walk is beneath it.
pub(crate) const MAX_DEPTH: usize = 64;

/// `name` in directory `dir` (or a path from the working directory),
/// held `O_PATH` and never through a link at the name: what is there is
/// then read through this descriptor, so a name swapped meanwhile (for a
/// link out of the volume, or a device node) is never what gets read.
pub(crate) fn open_path(dir: i32, name: &Path) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        Some(dir),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The very file an `O_PATH` descriptor holds, opened for reading.
pub(crate) fn reopen(held: &OwnedFd, flags: OFlag) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        format!("/proc/self/fd/{}", held.as_raw_fd()).as_str(),
        flags | OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )?;
    // SAFETY: open just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Reader<'_, '_> {
    fn read_error(&self, path: &str) -> impl FnOnce(io::Error) -> GuestVolumeError {
        let (destination, source_path, path) = (
            self.volume.destination.clone(),
            self.volume.source.display().to_string(),
            shown(path),
        );
        move |source| GuestVolumeError::Read {
            destination,
            source_path,
            path,
            source,
        }
    }

    fn unsupported(&self, path: &str, what: &'static str) -> GuestVolumeError {
        GuestVolumeError::Unsupported {
            destination: self.volume.destination.clone(),
            source_path: self.volume.source.display().to_string(),
            path: shown(path),
            what,
        }
    }

    fn too_large(&self) -> GuestVolumeError {
        GuestVolumeError::TooLarge {
            destination: self.volume.destination.clone(),
            source_path: self.volume.source.display().to_string(),
        }
    }

    /// Adds what `held` holds (entry `relative` of the volume, named in
    /// directory `parent` unless it is the top), and what is beneath it.
    fn visit(
        &mut self,
        held: OwnedFd,
        parent: Option<(&OwnedFd, &str)>,
        relative: String,
        depth: usize,
    ) -> Result<(), GuestVolumeError> {
        self.entries += 1;
        if self.entries > MAX_VOLUME_ENTRIES {
            return Err(self.too_large());
        }
        let stat = fstat(held.as_raw_fd()).map_err(|e| self.read_error(&relative)(e.into()))?;
        let mode = stat.st_mode & 0o7777;
        let (uid, gid) = (stat.st_uid, stat.st_gid);
        match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => {
                if depth >= MAX_DEPTH {
                    return Err(self.unsupported(&relative, "nested too deep (64 directories)"));
                }
                let dir_fd =
                    reopen(&held, OFlag::O_DIRECTORY).map_err(self.read_error(&relative))?;
                if let Some(watching) = self.watching.as_deref_mut() {
                    // Before its owner, mode and listing are read: a change
                    // after is heard.
                    let by_fd = format!("/proc/self/fd/{}", dir_fd.as_raw_fd());
                    if (watching.watch)(&by_fd).is_err() {
                        *watching.unwatched += 1;
                    }
                }
                let stat =
                    fstat(dir_fd.as_raw_fd()).map_err(|e| self.read_error(&relative)(e.into()))?;
                self.push(
                    VolumeEntry::Dir {
                        path: relative.clone(),
                        mode: stat.st_mode & 0o7777,
                        uid: stat.st_uid,
                        gid: stat.st_gid,
                    },
                    0,
                );
                let names = sorted_names(&dir_fd).map_err(self.read_error(&relative))?;
                for name in names {
                    let Ok(name) = String::from_utf8(name) else {
                        return Err(self.unsupported(
                            &relative,
                            "a directory with a name that is not UTF-8 in it",
                        ));
                    };
                    let child = if relative.is_empty() {
                        name.clone()
                    } else {
                        format!("{relative}/{name}")
                    };
                    let held = match open_path(dir_fd.as_raw_fd(), Path::new(&name)) {
                        Ok(held) => held,
                        // Gone since the listing: the kubelet swaps a
                        // projected volume's contents and removes the old.
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                        Err(e) => return Err(self.read_error(&child)(e)),
                    };
                    self.visit(held, Some((&dir_fd, &name)), child, depth + 1)?;
                }
            }
            SFlag::S_IFREG => {
                let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
                self.bytes = self.bytes.saturating_add(size);
                if self.bytes > MAX_VOLUME_BYTES {
                    return Err(self.too_large());
                }
                let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
                reopen(&held, OFlag::empty())
                    .and_then(|file| {
                        // A file that grew since its stat is copied as it was.
                        std::fs::File::from(file).take(size).read_to_end(&mut data)
                    })
                    .map_err(self.read_error(&relative))?;
                self.push_file(relative, mode, uid, gid, data);
            }
            SFlag::S_IFLNK => {
                let Some((dir, name)) = parent else {
                    return Err(self.unsupported(
                        &relative,
                        "a symlink (a volume's top must be a file or a directory)",
                    ));
                };
                let target = nix::fcntl::readlinkat(Some(dir.as_raw_fd()), name)
                    .map_err(|e| self.read_error(&relative)(e.into()))?;
                let Some(target) = target.to_str() else {
                    return Err(
                        self.unsupported(&relative, "a symlink to a name that is not UTF-8")
                    );
                };
                self.push(
                    VolumeEntry::Symlink {
                        path: relative,
                        target: target.to_owned(),
                        uid,
                        gid,
                    },
                    target.len(),
                );
            }
            SFlag::S_IFSOCK => return Err(self.unsupported(&relative, "a socket")),
            SFlag::S_IFIFO => return Err(self.unsupported(&relative, "a FIFO")),
            _ => return Err(self.unsupported(&relative, "a device node")),
        }
        Ok(())
    }

    /// A file's data, in as many requests as it takes.
    fn push_file(&mut self, path: String, mode: u32, uid: u32, gid: u32, data: Vec<u8>) {
        let mut chunks = data.chunks(BATCH_BYTES);
        let first = chunks.next().unwrap_or_default();
        self.push(
            VolumeEntry::File {
                path: path.clone(),
                mode,
                uid,
                gid,
                data: first.to_vec(),
            },
            first.len(),
        );
        for chunk in chunks {
            self.push(
                VolumeEntry::Append {
                    path: path.clone(),
                    data: chunk.to_vec(),
                },
                chunk.len(),
            );
        }
    }

    fn push(&mut self, entry: VolumeEntry, data_len: usize) {
        let cost = data_len + ENTRY_OVERHEAD + entry.path().len();
        if self.batch_bytes + cost > BATCH_BYTES + ENTRY_OVERHEAD * 16 && !self.batch.is_empty() {
            self.batches.push(std::mem::take(&mut self.batch));
            self.batch_bytes = 0;
        }
        self.batch_bytes += cost;
        self.batch.push(entry);
    }
}

/// The names in directory `dir` (open for reading), sorted, without `.`
/// and `..`.
pub(crate) fn sorted_names(dir: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let mut listing = nix::dir::Dir::from_fd(dir.try_clone()?.into_raw_fd())?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    names.sort();
    Ok(names)
}

/// A volume's entry as the error names it.
fn shown(relative: &str) -> String {
    if relative.is_empty() {
        "its top".into()
    } else {
        relative.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("host-volumes-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn volume(source: &Path) -> HostVolume {
        HostVolume {
            source: source.to_owned(),
            destination: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            read_only: true,
        }
    }

    fn paths(batches: &[Vec<VolumeEntry>]) -> Vec<String> {
        batches
            .iter()
            .flatten()
            .map(|e| match e {
                VolumeEntry::Dir { path, .. } => format!("{path}/"),
                VolumeEntry::File { path, .. } => path.clone(),
                VolumeEntry::Append { path, .. } => format!("{path}+"),
                VolumeEntry::Symlink { path, target, .. } => format!("{path} -> {target}"),
            })
            .collect()
    }

    #[test]
    fn a_watched_read_hears_later_changes_in_every_directory_it_read() {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let dir = scratch("watched");
        fs::create_dir_all(dir.join("conf/nested")).expect("dirs");
        fs::write(dir.join("conf/nested/a"), b"a").expect("a");
        let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_ONLYDIR;
        let mut watched = 0;
        let read = read_batches_watching(&volume(&dir), &mut |dir| {
            watched += 1;
            watch
                .add_watch(dir, mask)
                .map(drop)
                .map_err(io::Error::from)
        })
        .expect("read");
        assert_eq!((watched, read.unwatched), (3, 0));
        // The read itself is no change.
        assert_eq!(
            watch.read_events().err(),
            Some(nix::errno::Errno::EAGAIN),
            "the read was heard as a change"
        );
        // A write deep down, and (once heard) a name added at the top.
        fs::write(dir.join("conf/nested/a"), b"b").expect("rewrite");
        let deep = watch.read_events().expect("the deep write is heard");
        assert!(deep
            .iter()
            .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("a"))));
        fs::write(dir.join("new"), b"n").expect("new");
        let top = watch.read_events().expect("the new name is heard");
        assert!(top
            .iter()
            .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("new"))));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_projected_volume_is_read_with_its_links_as_links() {
        // As the kubelet lays out a service account's token.
        let dir = scratch("projected");
        let data = dir.join("..2026_12_06_10_00_00.1");
        fs::create_dir_all(&data).expect("data dir");
        fs::write(data.join("token"), b"eyJ").expect("token");
        fs::write(data.join("ca.crt"), b"-----BEGIN").expect("ca");
        std::os::unix::fs::symlink("..2026_12_06_10_00_00.1", dir.join("..data")).expect("link");
        std::os::unix::fs::symlink("..data/token", dir.join("token")).expect("link");
        // A link out of the volume is copied as a link, not followed.
        std::os::unix::fs::symlink("/etc/shadow", dir.join("outside")).expect("link");
        let batches = read_batches(&volume(&dir)).expect("read");
        assert_eq!(
            paths(&batches),
            [
                "/",
                "..2026_12_06_10_00_00.1/",
                "..2026_12_06_10_00_00.1/ca.crt",
                "..2026_12_06_10_00_00.1/token",
                "..data -> ..2026_12_06_10_00_00.1",
                "outside -> /etc/shadow",
                "token -> ..data/token",
            ]
        );
        assert!(batches.iter().flatten().any(|e| matches!(
            e,
            VolumeEntry::File { path, data, .. } if path.ends_with("token") && data == b"eyJ"
        )));
        assert!(batches
            .iter()
            .flatten()
            .all(|e| sandbox_proto::valid_volume_path(e.path())));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_large_file_goes_in_several_requests_each_within_a_frame() {
        let dir = scratch("large");
        let big = vec![7u8; BATCH_BYTES * 2 + 10];
        fs::write(dir.join("big"), &big).expect("big");
        fs::write(dir.join("small"), b"s").expect("small");
        let batches = read_batches(&volume(&dir)).expect("read");
        assert_eq!(paths(&batches), ["/", "big", "big+", "big+", "small"]);
        assert!(batches.len() >= 2, "{} batches", batches.len());
        for batch in &batches {
            let request = sandbox_proto::RequestBody::WriteVolume {
                key: "vol-1".into(),
                fresh: true,
                entries: batch.clone(),
            };
            let encoded = postcard::to_allocvec(&request).expect("encoded");
            assert!(
                encoded.len() < sandbox_proto::MAX_FRAME - 1024,
                "{}",
                encoded.len()
            );
        }
        let copied: Vec<u8> = batches
            .iter()
            .flatten()
            .filter_map(|e| match e {
                VolumeEntry::File { path, data, .. } | VolumeEntry::Append { path, data }
                    if path == "big" =>
                {
                    Some(data.clone())
                }
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(copied, big);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn what_a_guest_copy_cannot_hold_is_refused_by_name() {
        let dir = scratch("refused");
        nix::unistd::mkfifo(
            &dir.join("pipe"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .expect("fifo");
        let refused = read_batches(&volume(&dir)).expect_err("a FIFO");
        assert!(refused.is_callers());
        assert!(refused.to_string().contains("pipe is a FIFO"), "{refused}");
        fs::remove_file(dir.join("pipe")).expect("rm");
        let file = fs::File::create(dir.join("huge")).expect("huge");
        file.set_len(MAX_VOLUME_BYTES + 1).expect("sparse");
        let refused = read_batches(&volume(&dir)).expect_err("too large");
        assert!(
            matches!(refused, GuestVolumeError::TooLarge { .. }),
            "{refused}"
        );
        // The positive control: at the cap it is read.
        file.set_len(MAX_VOLUME_BYTES).expect("sparse");
        let read = read_batches(&volume(&dir)).expect("at the cap");
        assert_eq!(paths(&read).first().map(String::as_str), Some("/"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_top_that_is_a_symlink_is_refused_not_followed() {
        let dir = scratch("linked-top");
        fs::create_dir(dir.join("real")).expect("real");
        fs::write(dir.join("real/secret"), b"s").expect("secret");
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).expect("link");
        let refused = read_batches(&volume(&dir.join("link"))).expect_err("a linked top");
        assert!(
            refused.to_string().contains("its top is a symlink"),
            "{refused}"
        );
        // The positive control: the directory itself is read.
        let read = read_batches(&volume(&dir.join("real"))).expect("the directory");
        assert_eq!(paths(&read), ["/", "secret"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_single_file_volume_is_its_top() {
        let dir = scratch("file");
        fs::write(dir.join("config.yaml"), b"a: 1").expect("file");
        let batches = read_batches(&volume(&dir.join("config.yaml"))).expect("read");
        assert!(matches!(
            batches.as_slice(),
            [b] if matches!(b.as_slice(), [VolumeEntry::File { path, data, .. }] if path.is_empty() && data == b"a: 1")
        ));
        let _ = fs::remove_dir_all(&dir);
    }
}
