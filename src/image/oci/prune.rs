//! Pruning pulled images: an image that no sandbox record, snapshot or
//! built image names by digest, and whose layers are not all stacked in
//! mounted overlays (another daemon's sandboxes), goes with its
//! references; then every layer no remaining image lists and nothing
//! stacks on. A layer shared with an image in use does not keep an unused
//! image. Pulls wait while a prune runs
//! ([`super::Registry::prune`] holds them off), so a layer a pull has just
//! unpacked is never taken for garbage.

use std::collections::HashSet;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::store::{hex_of, Store};
use super::RegistryError;
use crate::image::PruneReport;

impl Store {
    /// Removes what nothing uses; `in_use` holds layer directories
    /// something stacks on, `keep` the manifest digests in use.
    pub fn prune(
        &self,
        in_use: &HashSet<PathBuf>,
        keep: &HashSet<String>,
    ) -> Result<PruneReport, RegistryError> {
        let mut report = PruneReport::default();
        let mut kept_layers = HashSet::new();
        for image in self.list() {
            let dirs: Vec<PathBuf> = image
                .layers
                .iter()
                .filter_map(|l| hex_of(l).map(|h| self.layer_dir(h)))
                .collect();
            if keep.contains(&image.digest) || dirs.iter().all(|d| in_use.contains(d)) {
                kept_layers.extend(dirs);
                continue;
            }
            let Some(hex) = hex_of(&image.digest) else {
                continue;
            };
            for reference in &image.references {
                let file = self.ref_file(reference);
                // A reference moved on to another image keeps its file.
                let points_here =
                    std::fs::read_to_string(&file).is_ok_and(|d| d.trim() == image.digest);
                if points_here {
                    remove_file(&file)?;
                }
            }
            remove_file(&self.image_file(hex))?;
            remove_file(&self.used_file(hex))?;
            report.removed.push(format!(
                "{} ({})",
                image.references.join(", "),
                image.digest
            ));
        }
        let layers = self.dir().join("layers");
        for entry in std::fs::read_dir(&layers).into_iter().flatten().flatten() {
            let path = entry.path();
            if kept_layers.contains(&path) || in_use.contains(&path) {
                continue;
            }
            report.freed_bytes += crate::image::tree_bytes(&path);
            std::fs::remove_dir_all(&path).map_err(|e| RegistryError::io("remove", &path, e))?;
            report.removed.push(format!(
                "layer sha256:{}",
                entry.file_name().to_string_lossy()
            ));
        }
        Ok(report)
    }

    pub(super) fn ref_file(&self, reference: &str) -> PathBuf {
        self.dir()
            .join("refs")
            .join(hex::encode(Sha256::digest(reference.as_bytes())))
    }
}

fn remove_file(path: &std::path::Path) -> Result<(), RegistryError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RegistryError::io("remove", path, e)),
    }
}
