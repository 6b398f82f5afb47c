//! Pruning the image cache: built trees that no recipe names any more (a
//! recipe changed, so its digest did) and trees a forced rebuild moved to
//! `trash/`, unless something still stacks on them. The caller says what is
//! in use (every overlay's lower layers, every snapshot's base); a digest
//! another process holds the build lock of is left alone.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

use super::cache::ImageCache;
use super::mounts::detach_below;
use super::recipe::digest_dir_name;
use super::ImageError;

/// What a prune removed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Cache entries removed (`sha256-…` or `trash/…`).
    pub removed: Vec<String>,
    /// Bytes those held (as recorded at build time; trash trees uncounted).
    pub freed_bytes: u64,
}

impl ImageCache {
    /// Removes unreferenced built trees; `in_use` holds root directories
    /// (`…/rootfs`, or a trash entry) that something still stacks on.
    pub fn prune(&self, in_use: &HashSet<PathBuf>) -> Result<PruneReport, ImageError> {
        let current: BTreeSet<String> = self
            .list()
            .iter()
            .map(|info| digest_dir_name(&info.digest))
            .collect();
        let mut report = PruneReport::default();
        let entries =
            fs::read_dir(self.dir()).map_err(|e| ImageError::io("list", self.dir(), e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("sha256-") || current.contains(&name) {
                continue;
            }
            let dir = entry.path();
            if in_use.contains(&dir.join("rootfs")) {
                continue;
            }
            let Some(_lock) = try_lock(&dir) else {
                continue;
            };
            let size = recorded_size(&dir);
            remove_tree(&dir)?;
            report.removed.push(name);
            report.freed_bytes += size;
        }
        let trash = self.dir().join("trash");
        for entry in fs::read_dir(&trash).into_iter().flatten().flatten() {
            let path = entry.path();
            if in_use.contains(&path) {
                continue;
            }
            remove_tree(&path)?;
            report
                .removed
                .push(format!("trash/{}", entry.file_name().to_string_lossy()));
        }
        // Names whose tree is gone.
        for entry in fs::read_dir(self.dir().join("by-name"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if !entry.path().exists() {
                let _ = fs::remove_file(entry.path());
            }
        }
        for name in &report.removed {
            tracing::info!(entry = %name, "image pruned");
        }
        Ok(report)
    }
}

/// The digest's build lock, if no one holds it.
fn try_lock(dir: &Path) -> Option<Flock<fs::File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .ok()?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

fn recorded_size(dir: &Path) -> u64 {
    fs::read(dir.join("meta.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["size_bytes"].as_u64())
        .unwrap_or(0)
}

fn remove_tree(path: &Path) -> Result<(), ImageError> {
    detach_below(path);
    fs::remove_dir_all(path).map_err(|e| ImageError::io("remove", path, e))
}

/// Every overlay lower layer mounted on this host now, in any mount
/// namespace (`runtime::mount_ns::mount_tables`): a container's root is
/// mounted only in its own namespace, and a daemon sharing the image
/// cache has sandboxes of its own.
pub fn mounted_lower_layers() -> HashSet<PathBuf> {
    crate::runtime::mount_ns::mount_tables()
        .iter()
        .flat_map(|(_, mountinfo)| lower_layers_in(mountinfo))
        .collect()
}

fn lower_layers_in(mountinfo: &str) -> HashSet<PathBuf> {
    let mut layers = HashSet::new();
    for line in mountinfo.lines() {
        let Some((_, after)) = line.split_once(" - ") else {
            continue;
        };
        let mut fields = after.split(' ');
        if fields.next() != Some("overlay") {
            continue;
        }
        let options = fields.nth(1).unwrap_or("");
        for option in options.split(',') {
            if let Some(dirs) = option.strip_prefix("lowerdir=") {
                layers.extend(dirs.split(':').map(PathBuf::from));
            }
        }
    }
    layers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer stacked only in another mount namespace (as a container's
    /// root is) is in use too. The positive control: this process's own
    /// table does not show it.
    #[test]
    fn layers_stacked_in_other_mount_namespaces_are_in_use() {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        sandboxd_test_support::require_root!("needs root (a mount namespace, an overlay)");
        // Not /tmp: an upper layer cannot be on an overlay itself.
        let tmp = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let [lower, upper, work, merged] =
            ["lower", "upper", "work", "merged"].map(|d| tmp.path().join(d));
        for dir in [&lower, &upper, &work, &merged] {
            fs::create_dir(dir).expect("dir");
        }
        let script = format!(
            "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={} {} && echo mounted && (read _ || true)",
            lower.display(),
            upper.display(),
            work.display(),
            merged.display()
        );
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line, "mounted\n");
        let own = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!lower_layers_in(&own).contains(&lower));
        assert!(mounted_lower_layers().contains(&lower));
        drop(holder.stdin.take());
        assert!(holder.wait().expect("wait").success());
    }

    #[test]
    fn lower_layers_come_from_overlay_mounts_only() {
        let info = "36 25 0:32 / /run/s/rootfs rw - overlay overlay rw,lowerdir=/snap/upper:/img/sha256-a/rootfs,upperdir=/l/upper,workdir=/l/work\n\
                    37 25 8:1 / /data rw - ext4 /dev/vda rw,lowerdir=/not/this\n";
        let layers = lower_layers_in(info);
        assert!(layers.contains(Path::new("/img/sha256-a/rootfs")));
        assert!(layers.contains(Path::new("/snap/upper")));
        assert!(!layers.contains(Path::new("/not/this")));
        assert_eq!(layers.len(), 2);
    }
}
