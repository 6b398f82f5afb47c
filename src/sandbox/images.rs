//! The manager's side of the image cache: listing it, and pruning it with
//! the knowledge of what running sandboxes and snapshots stack on.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use super::error::SandboxError;
use super::manager::Manager;

impl Manager {
    /// The image cache's images.
    pub fn images(&self) -> Vec<crate::image::ImageInfo> {
        self.images.list()
    }

    /// The images pulled from registries.
    pub fn pulled_images(&self) -> Vec<crate::image::oci::PulledImage> {
        self.registry.list()
    }

    /// Pulls a registry image now (a moved tag is followed), reporting
    /// layer bytes to `progress`.
    pub async fn pull_image(
        &self,
        image: &str,
        progress: Option<crate::image::ProgressSink>,
    ) -> Result<crate::image::oci::PulledImage, SandboxError> {
        Ok(self.registry.pull(image, progress).await?)
    }

    /// Removes what nothing uses: images built from specs, pulled images
    /// and their layers, built trees no recipe names any more and
    /// forced-rebuild leftovers. In use is what a mounted overlay stacks
    /// (every daemon's sandboxes), what a sandbox record or a snapshot
    /// stacks, and the base of a built image that stays. Boot templates are
    /// a cache of the daemon's own: dropped first (a template that a fork
    /// still holds keeps its image), and made again after the next boot.
    pub async fn prune_images(&self) -> Result<crate::image::PruneReport, SandboxError> {
        self.drop_boot_templates();
        let mut in_use = crate::image::mounted_lower_layers();
        // Images by the digest records and snapshots were made from.
        let mut keep = HashSet::new();
        for meta in self.snapshots.lock().values() {
            in_use.insert(meta.base_rootfs.clone());
            in_use.extend(meta.layers.iter().cloned());
            keep.insert(meta.image_digest.clone());
        }
        let records: Vec<(String, String)> = self
            .records()
            .values()
            .map(|r| (r.image.clone(), r.image_digest.clone()))
            .collect();
        for (name, digest) in records {
            if let Some(image) = self.image_by_digest(&name, &digest) {
                in_use.insert(image.rootfs);
                in_use.extend(image.layers);
            }
            keep.insert(digest);
        }
        let mut report = self.prune_built(&in_use).await?;
        // What the built images that stay start from.
        for built in self.builds.store.list() {
            if let Some(base) = self.image_by_digest(&built.base, &built.base_digest) {
                in_use.insert(base.rootfs);
                in_use.extend(base.layers);
            }
            keep.insert(built.base_digest);
        }
        let pulled = self.registry.prune(in_use.clone(), keep).await?;
        report.removed.extend(pulled.removed);
        report.freed_bytes += pulled.freed_bytes;
        // The recipe cache logs its own.
        for entry in &report.removed {
            tracing::info!(%entry, "image pruned");
        }
        let images = Arc::clone(&self.images);
        let built_trees = tokio::task::spawn_blocking(move || images.prune(&in_use))
            .await
            .map_err(SandboxError::internal)?
            .map_err(SandboxError::internal)?;
        report.removed.extend(built_trees.removed);
        report.freed_bytes += built_trees.freed_bytes;
        self.prune_layered_disks(&mut report);
        Ok(report)
    }

    /// Removes microVM disks of layered images that are gone (a microVM
    /// booted from one keeps its open file).
    fn prune_layered_disks(&self, report: &mut crate::image::PruneReport) {
        let mut images: HashSet<String> =
            self.registry.list().into_iter().map(|p| p.digest).collect();
        images.extend(self.builds.store.list().into_iter().map(|b| b.digest));
        let dir = self
            .config
            .images_dir
            .join(crate::image::flatten::LAYERED_DISKS);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(hex) = name
                .strip_suffix(".ext4")
                .or_else(|| name.strip_suffix(".ext4.lock"))
            else {
                continue;
            };
            if images.contains(&format!("sha256:{hex}")) {
                continue;
            }
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(entry = %name, "image disk pruned");
                    report.removed.push(format!("microVM disk {name}"));
                    report.freed_bytes += size;
                }
                Err(e) => tracing::warn!(path = %entry.path().display(), "pruning a disk: {e}"),
            }
        }
    }

    /// Removes built images whose layer nothing in `in_use` stacks and
    /// that no other built image starts from (repeated, so a chain of
    /// unused ones goes at once).
    async fn prune_built(
        &self,
        in_use: &HashSet<PathBuf>,
    ) -> Result<crate::image::PruneReport, SandboxError> {
        let mut report = crate::image::PruneReport::default();
        loop {
            let built = self.builds.store.list();
            let bases: HashSet<&str> = built.iter().map(|b| b.base_digest.as_str()).collect();
            let unused: Vec<_> = built
                .iter()
                .filter(|b| !bases.contains(b.digest.as_str()))
                .filter(|b| !in_use.contains(&self.builds.store.upper(b)))
                .cloned()
                .collect();
            if unused.is_empty() {
                return Ok(report);
            }
            for image in unused {
                let hex = image.digest.trim_start_matches("sha256:").to_string();
                let (disk, dir) = (Arc::clone(&self.disk), self.builds.store.image_dir(&hex));
                tokio::task::spawn_blocking(move || disk.remove_kept(&dir))
                    .await
                    .map_err(SandboxError::internal)?
                    .map_err(SandboxError::internal)?;
                report.removed.push(image.name);
                report.freed_bytes += image.size_bytes;
            }
        }
    }
}
