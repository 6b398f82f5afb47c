//! Where a kubelet `subPath` lies inside a volume whose copy a microVM's
//! guest already holds. The kubelet hands a `subPath` mount over as
//! another host path (a bind mount of the directory under
//! `volume-subpaths/`), so by path it is a volume of its own, and a copy
//! of its own would not see what the pod's other containers write into
//! the shared `emptyDir` in the guest. By identity (device and inode) it
//! is found inside the volume it came from, and the guest binds that part
//! of the copy the pod already shares.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, SFlag};
use sandbox_proto::VolumeEntry;

use super::guest_volumes::{open_path, reopen, sorted_names, MAX_DEPTH, MAX_VOLUME_ENTRIES};

/// What of a host volume a `subPath` is.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    /// Relative to the volume's top, `/`-separated; empty for the top.
    pub path: String,
    /// Each directory from the top's child down to the found one (itself
    /// too, when it is one), as the host has them: what the guest's copy
    /// needs to bind it, made where missing (the kubelet makes a
    /// `subPath` on the host when the container starts, after the copy).
    pub dirs: Vec<VolumeEntry>,
}

/// The file or directory at host path `wanted`, found by its device and
/// inode in the host volume at `top`, through no link and within
/// [`MAX_VOLUME_ENTRIES`] entries; `None` when it is not there.
pub fn find(top: &Path, wanted: &Path) -> io::Result<Option<Found>> {
    let wanted = identity(&open_path(libc::AT_FDCWD, wanted)?)?;
    let top = open_path(libc::AT_FDCWD, top)?;
    let mut search = Search {
        wanted,
        seen: 0,
        dirs: Vec::new(),
    };
    search.visit(top, String::new(), 0)
}

struct Search {
    wanted: (u64, u64),
    seen: usize,
    /// The directories on the way down to the entry being visited.
    dirs: Vec<VolumeEntry>,
}

impl Search {
    fn visit(&mut self, held: OwnedFd, path: String, depth: usize) -> io::Result<Option<Found>> {
        self.seen += 1;
        if self.seen > MAX_VOLUME_ENTRIES {
            return Ok(None);
        }
        let stat = fstat(held.as_raw_fd())?;
        let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if is_dir && !path.is_empty() {
            self.dirs.push(VolumeEntry::Dir {
                path: path.clone(),
                mode: stat.st_mode & 0o7777,
                uid: stat.st_uid,
                gid: stat.st_gid,
            });
        }
        // A file of several names could be found at the wrong one (the
        // guest's copy of each may differ since): never matched.
        let ambiguous = !is_dir && stat.st_nlink > 1;
        if (stat.st_dev, stat.st_ino) == self.wanted && !ambiguous {
            return Ok(Some(Found {
                path,
                dirs: std::mem::take(&mut self.dirs),
            }));
        }
        if is_dir && depth < MAX_DEPTH {
            let dir_fd = reopen(&held, OFlag::O_DIRECTORY)?;
            for name in sorted_names(&dir_fd)? {
                // A copy holds UTF-8 names only.
                let Ok(name) = String::from_utf8(name) else {
                    continue;
                };
                let child = match open_path(dir_fd.as_raw_fd(), Path::new(&name)) {
                    Ok(child) => child,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(e),
                };
                let child_path = if path.is_empty() {
                    name
                } else {
                    format!("{path}/{name}")
                };
                if let Some(found) = self.visit(child, child_path, depth + 1)? {
                    return Ok(Some(found));
                }
            }
        }
        if is_dir && !path.is_empty() {
            self.dirs.pop();
        }
        Ok(None)
    }
}

/// The volume a kubelet `subPath` comes from: the kubelet binds a
/// `subPath` at `<pod>/volume-subpaths/<volume>/<container>/<index>`, and
/// keeps the volume itself at `<pod>/volumes/<plugin>/<volume>`. `None`
/// for any other path, or where not exactly one such volume is there.
pub fn kubelet_volume_of(subpath: &Path) -> Option<PathBuf> {
    let index = subpath.parent()?;
    let container = index.parent()?;
    let volume = container.file_name()?;
    let subpaths = container.parent()?;
    if subpaths.file_name()? != "volume-subpaths" {
        return None;
    }
    let pod = subpaths.parent()?;
    let mut found = std::fs::read_dir(pod.join("volumes"))
        .ok()?
        .filter_map(Result::ok)
        .map(|plugin| plugin.path().join(volume))
        .filter(|candidate| std::fs::symlink_metadata(candidate).is_ok_and(|meta| meta.is_dir()));
    let only = found.next()?;
    found.next().is_none().then_some(only)
}

/// The device and inode of what `held` holds.
fn identity(held: &OwnedFd) -> io::Result<(u64, u64)> {
    let stat = fstat(held.as_raw_fd())?;
    Ok((stat.st_dev, stat.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn dir_paths(found: &Found) -> Vec<&str> {
        found.dirs.iter().map(VolumeEntry::path).collect()
    }

    #[test]
    fn a_kubelet_subpath_names_the_volume_it_comes_from() {
        let pod = tempfile::tempdir().expect("pod dir");
        let volume = pod.path().join("volumes/kubernetes.io~empty-dir/cache");
        fs::create_dir_all(&volume).expect("volume");
        fs::create_dir_all(pod.path().join("volumes/kubernetes.io~configmap/other"))
            .expect("another volume");
        let subpath = pod.path().join("volume-subpaths/cache/app/0");
        assert_eq!(kubelet_volume_of(&subpath), Some(volume));
        // Not the kubelet's layout, or no such volume: none.
        assert_eq!(kubelet_volume_of(&pod.path().join("volumes/x/cache")), None);
        let unknown = pod.path().join("volume-subpaths/missing/app/0");
        assert_eq!(kubelet_volume_of(&unknown), None);
    }

    #[test]
    fn a_subpath_is_found_by_identity_with_the_directories_on_its_way() {
        let top = tempfile::tempdir().expect("volume");
        fs::create_dir_all(top.path().join("a/logs")).expect("dirs");
        fs::create_dir_all(top.path().join("b")).expect("dirs");
        fs::write(top.path().join("a/f"), "x").expect("file");
        // What the kubelet hands over is another path to the same directory.
        let elsewhere = tempfile::tempdir().expect("elsewhere");
        let link = elsewhere.path().join("subpath");
        std::os::unix::fs::symlink(top.path().join("a/logs"), &link).expect("link");

        let found = find(top.path(), &top.path().join("a/logs"))
            .expect("searched")
            .expect("found");
        assert_eq!(found.path, "a/logs");
        assert_eq!(dir_paths(&found), ["a", "a/logs"]);
        let file = find(top.path(), &top.path().join("a/f"))
            .expect("searched")
            .expect("found");
        assert_eq!((file.path.as_str(), dir_paths(&file)), ("a/f", vec!["a"]));
        // A file of two names is found at neither.
        fs::hard_link(top.path().join("a/f"), top.path().join("b/g")).expect("hard link");
        assert_eq!(
            find(top.path(), &top.path().join("a/f")).expect("searched"),
            None
        );
        let itself = find(top.path(), top.path())
            .expect("searched")
            .expect("found");
        assert_eq!((itself.path.as_str(), itself.dirs.len()), ("", 0));
        // A link is never followed, at the wanted path or inside the volume.
        assert_eq!(
            find(top.path(), &link).expect("searched"),
            None,
            "a link to the directory is not the directory"
        );
        std::os::unix::fs::symlink(elsewhere.path(), top.path().join("b/out")).expect("link");
        let outside = elsewhere.path().join("other");
        fs::create_dir(&outside).expect("outside dir");
        assert_eq!(find(top.path(), &outside).expect("searched"), None);
    }
}
