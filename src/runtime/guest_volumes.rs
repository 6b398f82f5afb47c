//! A host volume of a microVM pod's container, read into the entries its
//! agent writes into the guest (`RequestBody::WriteVolume`): the guest
//! cannot see the host's files, so a volume is copied in at attach, as Kata
//! does without a shared file system. Fit for what the kubelet hands a pod
//! (a service account's token, a ConfigMap, a Secret, an empty emptyDir):
//! files, directories and symlinks (copied as links, never followed), up
//! to [`MAX_VOLUME_BYTES`] and [`MAX_VOLUME_ENTRIES`] each. Later changes
//! on either side do not reach the other.

use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

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
    let mut reader = Reader {
        volume,
        batches: Vec::new(),
        batch: Vec::new(),
        batch_bytes: 0,
        entries: 0,
        bytes: 0,
    };
    reader.visit(&volume.source, String::new())?;
    if !reader.batch.is_empty() {
        reader.batches.push(std::mem::take(&mut reader.batch));
    }
    Ok(reader.batches)
}

struct Reader<'a> {
    volume: &'a HostVolume,
    batches: Vec<Vec<VolumeEntry>>,
    batch: Vec<VolumeEntry>,
    batch_bytes: usize,
    entries: usize,
    bytes: u64,
}

impl Reader<'_> {
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

    /// Adds host `path`, entry `relative` of the volume, and what is
    /// beneath it.
    fn visit(&mut self, path: &Path, relative: String) -> Result<(), GuestVolumeError> {
        self.entries += 1;
        if self.entries > MAX_VOLUME_ENTRIES {
            return Err(self.too_large());
        }
        let meta = fs::symlink_metadata(path).map_err(self.read_error(&relative))?;
        let (mode, uid, gid) = (meta.mode() & 0o7777, meta.uid(), meta.gid());
        let kind = meta.file_type();
        if kind.is_dir() {
            self.push(
                VolumeEntry::Dir {
                    path: relative.clone(),
                    mode,
                    uid,
                    gid,
                },
                0,
            );
            let mut names = Vec::new();
            for entry in fs::read_dir(path).map_err(self.read_error(&relative))? {
                names.push(entry.map_err(self.read_error(&relative))?.file_name());
            }
            names.sort();
            for name in names {
                let child = match std::str::from_utf8(name.as_bytes()) {
                    Ok(name) if relative.is_empty() => name.to_owned(),
                    Ok(name) => format!("{relative}/{name}"),
                    Err(_) => {
                        return Err(self.unsupported(
                            &relative,
                            "a directory with a name that is not UTF-8 in it",
                        ))
                    }
                };
                self.visit(&path.join(&name), child)?;
            }
        } else if kind.is_file() {
            self.bytes += meta.len();
            if self.bytes > MAX_VOLUME_BYTES {
                return Err(self.too_large());
            }
            let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .and_then(|file| {
                    // A file that grew since its stat is copied as it was.
                    file.take(meta.len()).read_to_end(&mut data)
                })
                .map_err(self.read_error(&relative))?;
            self.push_file(relative, mode, uid, gid, data);
        } else if kind.is_symlink() {
            if relative.is_empty() {
                return Err(self.unsupported(&relative, "a symlink"));
            }
            let target = fs::read_link(path).map_err(self.read_error(&relative))?;
            let Some(target) = target.to_str() else {
                return Err(self.unsupported(&relative, "a symlink to a name that is not UTF-8"));
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
        } else {
            let what = if kind.is_socket() {
                "a socket"
            } else if kind.is_fifo() {
                "a FIFO"
            } else {
                "a device node"
            };
            return Err(self.unsupported(&relative, what));
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
