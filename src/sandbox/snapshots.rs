//! The manager's snapshot work: taking a snapshot of a running sandbox,
//! listing and deleting snapshots, resolving a snapshot used as an image,
//! and removing deleted snapshots once no sandbox or later snapshot stacks
//! on them.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use super::error::SandboxError;
use super::manager::Manager;
use crate::api::types::SandboxState;
use crate::runtime::cgroups::{Layout, SandboxCgroups};
use crate::snapshot::{new_id, SnapshotKind, SnapshotMeta, SnapshotView, META_VERSION};

/// Pool space a filesystem snapshot needs free: it shares the layer's
/// extents, so only btrfs metadata is written.
const FILESYSTEM_SNAPSHOT_RESERVE: u64 = 64 << 20;

impl Manager {
    /// Snapshots sandbox `id`. The sandbox is frozen while its state is
    /// captured and keeps running afterwards.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        kind: SnapshotKind,
    ) -> Result<SnapshotView, SandboxError> {
        let record = self.record(id)?;
        if record.state != SandboxState::Ready {
            return Err(SandboxError::Conflict {
                code: "sandbox_not_running",
                message: format!(
                    "sandbox {id} is {:?}; only a ready sandbox can be snapshotted",
                    record.state
                ),
            });
        }
        match kind {
            SnapshotKind::Filesystem => self.snapshot_filesystem(record).await,
            SnapshotKind::Memory => Err(SandboxError::bad(
                "not_implemented",
                "memory snapshots are not built yet; take {\"kind\": \"filesystem\"} for the files",
            )),
        }
    }

    async fn snapshot_filesystem(
        self: &Arc<Self>,
        record: super::record::SandboxRecord,
    ) -> Result<SnapshotView, SandboxError> {
        let free = self.disk.free_bytes().map_err(SandboxError::internal)?;
        if free < FILESYSTEM_SNAPSHOT_RESERVE {
            return Err(SandboxError::Unavailable {
                resource: "disk",
                message: format!(
                    "the disk pool has {} MiB free; a snapshot needs {} MiB",
                    free >> 20,
                    FILESYSTEM_SNAPSHOT_RESERVE >> 20
                ),
            });
        }
        let (parents, parent_layers) = match record.base_snapshot.as_deref() {
            Some(base) => {
                let index = self.snapshots.lock();
                let base_meta = index.get(base).ok_or_else(|| {
                    SandboxError::internal(format!("the sandbox's base snapshot {base} is missing"))
                })?;
                let mut parents = vec![base.to_string()];
                parents.extend(base_meta.parents.iter().cloned());
                (parents, base_meta.layers.clone())
            }
            None => (Vec::new(), Vec::new()),
        };
        let (image_name, base_rootfs) = match record.base_snapshot.as_deref() {
            Some(base) => {
                let index = self.snapshots.lock();
                let meta = index.get(base).ok_or_else(|| {
                    SandboxError::internal(format!("the sandbox's base snapshot {base} is missing"))
                })?;
                (meta.image.clone(), meta.base_rootfs.clone())
            }
            None => {
                let images = Arc::clone(&self.images);
                let name = record.image.clone();
                let image = tokio::task::spawn_blocking(move || images.resolve(&name))
                    .await
                    .map_err(SandboxError::internal)?
                    .map_err(SandboxError::internal)?;
                (record.image.clone(), image.rootfs)
            }
        };

        let snapshot_id = new_id();
        let disk = Arc::clone(&self.disk);
        let cgroups = SandboxCgroups::new(Layout::detect(), &record.cgroups_path);
        let sandbox = record.id.clone();
        let sid = snapshot_id.clone();
        let layer = tokio::task::spawn_blocking(move || -> Result<_, SandboxError> {
            disk.create_snapshot_dir(&sid)
                .map_err(SandboxError::internal)?;
            cgroups.freeze().map_err(|e| SandboxError::Conflict {
                code: "sandbox_busy",
                message: e.to_string(),
            })?;
            let taken = disk.snapshot_layer(&sandbox, &sid);
            if let Err(e) = cgroups.thaw() {
                tracing::error!(sandbox = %sandbox, "thawing after a snapshot: {e}");
            }
            taken.map_err(SandboxError::internal)
        })
        .await
        .map_err(SandboxError::internal)?;
        let layer = match layer {
            Ok(layer) => layer,
            Err(e) => {
                let _ = self.disk.remove_snapshot(&snapshot_id);
                return Err(e);
            }
        };
        let upper = layer.join("upper");
        let size_bytes = tokio::task::spawn_blocking({
            let upper = upper.clone();
            move || tree_bytes(&upper)
        })
        .await
        .unwrap_or(0);
        let mut layers = vec![upper];
        layers.extend(parent_layers);
        let meta = SnapshotMeta {
            version: META_VERSION,
            id: snapshot_id.clone(),
            kind: SnapshotKind::Filesystem,
            sandbox: record.id.clone(),
            image: image_name,
            image_digest: record.image_digest.clone(),
            base_rootfs,
            layers,
            parents,
            created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            size_bytes,
            deleted: false,
        };
        if let Err(e) = self.snapshots.save(&self.disk, &meta) {
            let _ = self.disk.remove_snapshot(&snapshot_id);
            return Err(SandboxError::internal(e));
        }
        tracing::info!(sandbox = %record.id, snapshot = %snapshot_id, size_bytes, "filesystem snapshot taken");
        Ok(meta.view())
    }

    /// Every snapshot not deleted, oldest first.
    pub fn list_snapshots(&self) -> Vec<SnapshotView> {
        let mut views: Vec<SnapshotView> = self
            .snapshots
            .lock()
            .values()
            .filter(|m| !m.deleted)
            .map(SnapshotMeta::view)
            .collect();
        views.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        views
    }

    pub fn get_snapshot(&self, id: &str) -> Result<SnapshotView, SandboxError> {
        self.snapshots
            .get(id)
            .map(|m| m.view())
            .ok_or_else(|| snapshot_not_found(id))
    }

    /// Deletes snapshot `id` for the API at once; its data goes when no
    /// sandbox or later snapshot stacks on it any more.
    pub fn delete_snapshot(&self, id: &str) -> Result<(), SandboxError> {
        let mut meta = self
            .snapshots
            .get(id)
            .ok_or_else(|| snapshot_not_found(id))?;
        meta.deleted = true;
        self.snapshots
            .save(&self.disk, &meta)
            .map_err(SandboxError::internal)?;
        self.collect_snapshots();
        Ok(())
    }

    /// The filesystem snapshot named by an image name, if it is one.
    pub(super) fn snapshot_image(&self, name: &str) -> Result<Option<SnapshotMeta>, SandboxError> {
        if !name.starts_with("snap-") {
            return Ok(None);
        }
        match self.snapshots.get(name) {
            Some(meta) if meta.kind == SnapshotKind::Filesystem => Ok(Some(meta)),
            Some(_) => Err(SandboxError::bad(
                "invalid_image",
                format!("{name} is a memory snapshot; create from it with \"from_snapshot\""),
            )),
            None => Err(snapshot_not_found(name)),
        }
    }

    /// Snapshots a sandbox or a kept snapshot stacks on.
    fn snapshots_in_use(&self) -> BTreeSet<String> {
        let mut in_use: BTreeSet<String> = self
            .records()
            .values()
            .filter_map(|r| r.base_snapshot.clone())
            .collect();
        // A base's own parents are listed in its meta, which stays while
        // the base is used.
        for meta in self.snapshots.lock().values() {
            in_use.extend(meta.parents.iter().cloned());
        }
        in_use
    }

    /// Removes deleted snapshots that nothing stacks on any more.
    pub(super) fn collect_snapshots(&self) {
        // A removed snapshot may have been the last user of its parents:
        // repeat until nothing more goes.
        loop {
            let in_use = self.snapshots_in_use();
            let removable: Vec<String> = self
                .snapshots
                .lock()
                .values()
                .filter(|m| m.deleted && !in_use.contains(&m.id))
                .map(|m| m.id.clone())
                .collect();
            if removable.is_empty() {
                return;
            }
            for id in removable {
                if let Err(e) = self.disk.remove_snapshot(&id) {
                    tracing::warn!(snapshot = %id, "removing a deleted snapshot: {e}");
                    return;
                }
                tracing::info!(snapshot = %id, "snapshot removed");
                self.snapshots.lock().remove(&id);
            }
        }
    }
}

fn snapshot_not_found(id: &str) -> SandboxError {
    SandboxError::NotFound {
        code: "snapshot_not_found",
        message: format!("no snapshot with id {id:?}"),
    }
}

/// Bytes of the regular files under `dir` (not following links).
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}
