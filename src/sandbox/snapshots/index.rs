//! What each snapshot is (its meta, kept beside its data in the disk
//! pool's 0700 `snapshots/` directory) and the index of all of them. A filesystem snapshot is the sandbox's writable layer frozen
//! read-only; it becomes an image that later creates stack under a fresh
//! writable layer, so a sandbox made from it copies nothing. Making,
//! referencing and removing snapshots is the manager's job
//! (`sandbox/snapshots/mod.rs`); the data itself is the disk pool's. A memory
//! snapshot adds a CRIU checkpoint of the sandbox's processes, with a
//! SHA-256 of every image file (`integrity.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::disk::DiskPool;

/// The meta file in each snapshot's directory.
const META: &str = "meta.json";
/// Bumped when [`SnapshotMeta`] changes incompatibly.
pub const META_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Processes and memory (CRIU) plus the writable layer.
    Memory,
    /// The writable layer only; usable as an image.
    Filesystem,
}

/// Everything known about one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub version: u32,
    pub id: String,
    pub kind: SnapshotKind,
    /// The sandbox it was taken from.
    pub sandbox: String,
    /// The base image (name and digest) under all the layers.
    pub image: String,
    pub image_digest: String,
    pub base_rootfs: PathBuf,
    /// This snapshot's layer (the sandbox's writes), then those it was built
    /// on, top first: overlay lower layers above `base_rootfs`.
    pub layers: Vec<PathBuf>,
    /// Snapshots whose layers are in `layers` below this one's, nearest
    /// first; each must outlive this one.
    pub parents: Vec<String>,
    pub created_at: String,
    /// Bytes this snapshot's own files take (its layer's writes, memory
    /// images).
    pub size_bytes: u64,
    /// Deleted by the API but still used by a sandbox or a later snapshot;
    /// removed once nothing uses it.
    #[serde(default)]
    pub deleted: bool,
    /// A memory snapshot's checkpoint.
    #[serde(default)]
    pub memory: Option<MemoryImage>,
    /// A microVM's filesystem snapshot: the clone of its scratch disk, which
    /// sandboxes made from it start with (its `layers` are empty).
    #[serde(default)]
    pub vm_scratch: Option<PathBuf>,
    /// A microVM boot template (`sandbox/boot_templates.rs`): the daemon's
    /// own, never shown to the API, dropped when the daemon stops or starts.
    #[serde(default)]
    pub template: bool,
}

/// What a memory snapshot holds beyond its layer, and what its forks get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryImage {
    /// CRIU's image files (`<snapshot dir>/images`).
    pub images_dir: PathBuf,
    pub checkpoint: crate::runtime::sandbox::Checkpoint,
    /// The source supervisor's next process id.
    pub next_proc: u64,
    /// Forks keep the source's limits (its cgroups are restored as were)
    /// and its environment.
    pub limits: crate::model::Limits,
    pub env: BTreeMap<String, String>,
    /// The source's secret bindings (names and placeholders, never a
    /// value): its processes hold the placeholders, so its forks bind the
    /// same ones.
    #[serde(default)]
    pub secrets: Vec<crate::secrets::SecretBinding>,
    /// The source's exposed ports: its servers run on in the forks, which
    /// expose the same ports under URLs (and tokens) of their own.
    #[serde(default)]
    pub ports: Vec<crate::model::ExposedPort>,
    /// SHA-256 of every image file, checked before each restore.
    pub sha256: BTreeMap<String, String>,
    /// The processes running at the checkpoint, which forks inherit.
    #[serde(default)]
    pub processes: Vec<crate::model::Process>,
    /// A microVM's snapshot: `images_dir` holds the VMM's memory and state
    /// files (checked by the VMM itself on restore, so `sha256` is empty),
    /// and the scratch disk's clone sits in the snapshot's pool directory.
    #[serde(default)]
    pub vm: Option<VmImage>,
}

/// What a microVM fork needs beyond [`MemoryImage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmImage {
    /// The clone of the scratch disk taken while the VM was paused.
    pub scratch: PathBuf,
}

/// What the API shows of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotView {
    pub id: String,
    pub kind: SnapshotKind,
    pub sandbox: String,
    pub image: String,
    pub created_at: String,
    pub size_bytes: u64,
}

impl SnapshotMeta {
    pub fn view(&self) -> SnapshotView {
        SnapshotView {
            id: self.id.clone(),
            kind: self.kind,
            sandbox: self.sandbox.clone(),
            image: self.image.clone(),
            created_at: self.created_at.clone(),
            size_bytes: self.size_bytes,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("writing snapshot meta {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskError),
}

/// The index of every snapshot, loaded from the pool at start.
#[derive(Debug, Default)]
pub struct SnapshotIndex {
    by_id: Mutex<BTreeMap<String, SnapshotMeta>>,
}

impl SnapshotIndex {
    /// Reads every snapshot's meta from the pool. A directory without a
    /// readable meta is a snapshot that was never finished: removed.
    pub fn load(pool: &DiskPool) -> SnapshotIndex {
        let mut by_id = BTreeMap::new();
        for id in pool.list_snapshots() {
            let meta = pool
                .snapshot_dir(&id)
                .ok()
                .and_then(|dir| std::fs::read(dir.join(META)).ok())
                .and_then(|bytes| serde_json::from_slice::<SnapshotMeta>(&bytes).ok())
                .filter(|m| m.version == META_VERSION && m.id == id);
            match meta {
                Some(meta) => {
                    by_id.insert(id, meta);
                }
                None => {
                    tracing::warn!(snapshot = %id, "removing an unfinished or unreadable snapshot");
                    if let Err(e) = pool.remove_snapshot(&id) {
                        tracing::warn!(snapshot = %id, "{e}");
                    }
                }
            }
        }
        SnapshotIndex {
            by_id: Mutex::new(by_id),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, SnapshotMeta>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A snapshot not deleted (a boot template too).
    pub fn get(&self, id: &str) -> Option<SnapshotMeta> {
        self.lock().get(id).filter(|m| !m.deleted).cloned()
    }

    /// A snapshot the API may show: not deleted, not a boot template.
    pub fn visible(&self, id: &str) -> Option<SnapshotMeta> {
        self.get(id).filter(|m| !m.template)
    }

    /// A snapshot whose data is still kept, deleted or not: what a sandbox
    /// that holds it (its `base_snapshot`) is made from.
    pub fn held(&self, id: &str) -> Option<SnapshotMeta> {
        self.lock().get(id).cloned()
    }

    /// Writes `meta` into its directory (atomically) and indexes it.
    pub fn save(&self, pool: &DiskPool, meta: &SnapshotMeta) -> Result<(), SnapshotError> {
        let dir = pool.snapshot_dir(&meta.id)?;
        let path = dir.join(META);
        let tmp = dir.join(".meta.json.tmp");
        let write_err = |source| SnapshotError::Write {
            path: path.display().to_string(),
            source,
        };
        let bytes =
            serde_json::to_vec_pretty(meta).map_err(|e| write_err(std::io::Error::other(e)))?;
        std::fs::write(&tmp, bytes).map_err(write_err)?;
        std::fs::rename(&tmp, &path).map_err(write_err)?;
        self.lock().insert(meta.id.clone(), meta.clone());
        Ok(())
    }
}

/// A new snapshot id.
pub fn new_id() -> String {
    format!("snap-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_layer_and_image_names() {
        let id = new_id();
        crate::disk::validate_id(&id).unwrap();
        crate::image::validate_name(&id).unwrap();
    }

    #[test]
    fn kinds_are_lowercase_in_json() {
        assert_eq!(
            serde_json::to_string(&SnapshotKind::Filesystem).unwrap(),
            "\"filesystem\""
        );
        assert_eq!(
            serde_json::from_str::<SnapshotKind>("\"memory\"").unwrap(),
            SnapshotKind::Memory
        );
    }
}
