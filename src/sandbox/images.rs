//! The manager's side of the image cache: listing it, and pruning it with
//! the knowledge of what running sandboxes and snapshots stack on.

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

    /// Pulls a registry image now (a moved tag is followed).
    pub async fn pull_image(
        &self,
        image: &str,
    ) -> Result<crate::image::oci::PulledImage, SandboxError> {
        Ok(self.registry.pull(image).await?)
    }

    /// Removes built images no recipe names any more and forced-rebuild
    /// leftovers, except those a mounted sandbox root or a snapshot still
    /// stacks on.
    pub async fn prune_images(&self) -> Result<crate::image::PruneReport, SandboxError> {
        let mut in_use = crate::image::mounted_lower_layers();
        in_use.extend(
            self.snapshots
                .lock()
                .values()
                .map(|m| m.base_rootfs.clone()),
        );
        let images = Arc::clone(&self.images);
        tokio::task::spawn_blocking(move || images.prune(&in_use))
            .await
            .map_err(SandboxError::internal)?
            .map_err(SandboxError::internal)
    }
}
